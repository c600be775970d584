# Sourced by fetch_flashmla.sh and fetch_fa3.sh: fill a folder with paths of a project at a pinned
# commit and CUTLASS's paths at the commit that project pins as its csrc/cutlass submodule.
#   fetch_with_cutlass SCRIPT NAME LABEL REV URL MIRROR CUTLASS_REV CUTLASS_URL CUTLASS_MIRROR DIR PATH...
# SCRIPT names the caller in messages, NAME keys the project in DIR/FETCHED, LABEL names it in the
# pin check; a MIRROR (a local bare git dir) replaces a depth-1 fetch from the URL. Reads
# ${cutlass_paths[@]} from the caller.

fetch_with_cutlass() {
    local script=$1 name=$2 label=$3 rev=$4 url=$5 mirror=$6 c_rev=$7 c_url=$8 c_mirror=$9 dir=${10}
    shift 10
    local tmp
    tmp=$(mktemp -d)
    # git_dir NAME MIRROR URL REV: a git dir holding REV (the mirror, or a fresh depth-1 fetch)
    git_dir() {
        local n=$1 m=$2 u=$3 r=$4
        if [[ -n $m ]]; then
            if ! git --git-dir="$m" cat-file -e "$r^{commit}" 2>/dev/null; then
                echo "$script: $n commit $r is not in the mirror $m" >&2
                return 2
            fi
            echo "$m"
        else
            git init -q --bare "$tmp/$n.git"
            git --git-dir="$tmp/$n.git" fetch -q --depth 1 "$u" "$r" >&2
            echo "$tmp/$n.git"
        fi
    }
    local pm cm pinned code=0
    pm=$(git_dir "$name" "$mirror" "$url" "$rev") || code=$?
    if ((code == 0)); then
        pinned=$(git --git-dir="$pm" ls-tree "$rev" csrc/cutlass | awk '$2 == "commit" {print $3}')
        if [[ $pinned != "$c_rev" ]]; then
            echo "$script: $label $rev pins csrc/cutlass at ${pinned:-nothing}, not $c_rev" \
                 "(set CUTLASS_REV=$pinned to follow it)" >&2
            code=2
        fi
    fi
    if ((code == 0)); then
        cm=$(git_dir cutlass "$c_mirror" "$c_url" "$c_rev") || code=$?
    fi
    if ((code == 0)); then
        mkdir -p "$dir" "$dir/csrc/cutlass"
        # (a mirror that lacks large blobs elsewhere in the tree makes git archive print 'error: invalid
        # object' for them while matching the globs; what is archived is complete: the benchmarks check)
        git --git-dir="$pm" archive "$rev" "$@" | tar -x -C "$dir"
        git --git-dir="$cm" archive "$c_rev" "${cutlass_paths[@]}" | tar -x -C "$dir/csrc/cutlass"
        {
            echo "$name $rev ${mirror:-$url}"
            echo "cutlass $c_rev ${c_mirror:-$c_url}"
        } >"$dir/FETCHED"
        du -sh "$dir"
    fi
    rm -rf "$tmp"
    return $code
}

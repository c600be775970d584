#!/usr/bin/env bash
# Fill DIR with the pieces of FlashMLA's source that its SM90 sparse FP8 decode needs, at a pinned
# commit, and CUTLASS's headers at the commit FlashMLA pins as its csrc/cutlass submodule, for
# benchmarks/flashmla_compare.py --flashmla DIR (nothing of FlashMLA or CUTLASS is committed here).
#   bash benchmarks/fetch_flashmla.sh DIR
# Sources: git over the network (a depth-1 fetch of each pinned commit), or local bare mirrors:
#   FLASHMLA_MIRROR=/path/to/FlashMLA.git CUTLASS_MIRROR=/path/to/cutlass.git bash ... DIR
# FLASHMLA_REV / CUTLASS_REV override the pins (to try another commit; the benchmark prints what
# DIR holds). DIR/FETCHED records the commits and where they came from.
set -euo pipefail
dir=${1:?usage: fetch_flashmla.sh DIR   (env: FLASHMLA_MIRROR, CUTLASS_MIRROR, FLASHMLA_REV, CUTLASS_REV)}
# FlashMLA main, 2026-04-29 ("Swap FlashMLA combine grid dimensions (#182)")
flashmla_rev=${FLASHMLA_REV:-9241ae3ef9bac614dd25e45e507e089f888280e0}
# what that commit pins as csrc/cutlass (checked below against the gitlink in its tree)
cutlass_rev=${CUTLASS_REV:-147f5673d0c1c3dcf66f78d677fd647e4a020219}
flashmla_url=https://github.com/deepseek-ai/FlashMLA.git
cutlass_url=https://github.com/NVIDIA/cutlass.git
# FlashMLA paths: the V3.2 h64/h128 instantiations and the kernel they include, the scheduler
# metadata and combine kernels, the headers those include, and the licence.
flashmla_paths=(
    LICENSE
    csrc/params.h
    csrc/defines.h
    csrc/utils.h
    csrc/kerutils/include
    csrc/sm90/decode/sparse_fp8
    csrc/smxx/decode/get_decoding_sched_meta
    csrc/smxx/decode/combine
)
cutlass_paths=(LICENSE.txt include)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# git_dir NAME MIRROR URL REV: a git dir holding REV (the mirror, or a fresh depth-1 fetch)
git_dir() {
    local name=$1 mirror=$2 url=$3 rev=$4
    if [[ -n $mirror ]]; then
        if ! git --git-dir="$mirror" cat-file -e "$rev^{commit}" 2>/dev/null; then
            echo "fetch_flashmla.sh: $name commit $rev is not in the mirror $mirror" >&2
            exit 2
        fi
        echo "$mirror"
    else
        git init -q --bare "$tmp/$name.git"
        git --git-dir="$tmp/$name.git" fetch -q --depth 1 "$url" "$rev" >&2
        echo "$tmp/$name.git"
    fi
}

fm=$(git_dir flashmla "${FLASHMLA_MIRROR:-}" "$flashmla_url" "$flashmla_rev")
pinned=$(git --git-dir="$fm" ls-tree "$flashmla_rev" csrc/cutlass | awk '$2 == "commit" {print $3}')
if [[ $pinned != "$cutlass_rev" ]]; then
    echo "fetch_flashmla.sh: FlashMLA $flashmla_rev pins csrc/cutlass at ${pinned:-nothing}, not $cutlass_rev" \
         "(set CUTLASS_REV=$pinned to follow it)" >&2
    exit 2
fi
cm=$(git_dir cutlass "${CUTLASS_MIRROR:-}" "$cutlass_url" "$cutlass_rev")

mkdir -p "$dir" "$dir/csrc/cutlass"
git --git-dir="$fm" archive "$flashmla_rev" "${flashmla_paths[@]}" | tar -x -C "$dir"
git --git-dir="$cm" archive "$cutlass_rev" "${cutlass_paths[@]}" | tar -x -C "$dir/csrc/cutlass"
{
    echo "flashmla $flashmla_rev ${FLASHMLA_MIRROR:-$flashmla_url}"
    echo "cutlass $cutlass_rev ${CUTLASS_MIRROR:-$cutlass_url}"
} >"$dir/FETCHED"
du -sh "$dir"

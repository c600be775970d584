#!/usr/bin/env bash
# Fill DIR with the pieces of FlashMLA's source that its SM90 sparse FP8 decode needs, at a pinned
# commit, and CUTLASS's headers at the commit FlashMLA pins as its csrc/cutlass submodule, for
# benchmarks/flashmla_compare.py and flashmla_prefill.py --flashmla DIR (nothing of FlashMLA or CUTLASS is committed here).
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
# metadata and combine kernels, the SM90 sparse prefill (benchmarks/flashmla_prefill.py), the
# headers those include, and the licence.
flashmla_paths=(
    LICENSE
    csrc/params.h
    csrc/defines.h
    csrc/utils.h
    csrc/kerutils/include
    csrc/sm90/decode/sparse_fp8
    csrc/smxx/decode/get_decoding_sched_meta
    csrc/smxx/decode/combine
    csrc/sm90/helpers.h
    csrc/sm90/prefill/sparse
)
cutlass_paths=(LICENSE.txt include)

# shellcheck source=benchmarks/fetch_pinned.sh
source "$(dirname "${BASH_SOURCE[0]}")/fetch_pinned.sh"
fetch_with_cutlass fetch_flashmla.sh flashmla FlashMLA "$flashmla_rev" "$flashmla_url" "${FLASHMLA_MIRROR:-}" \
    "$cutlass_rev" "$cutlass_url" "${CUTLASS_MIRROR:-}" "$dir" "${flashmla_paths[@]}"

#!/usr/bin/env bash
# Fill DIR with the pieces of FlashAttention-3's source (Dao-AILab/flash-attention, hopper/) that
# its sparse MLA decode as SGLang calls it needs, at a pinned commit, and CUTLASS's headers at the
# commit FlashAttention pins as its csrc/cutlass submodule, for
# benchmarks/fa3_sparse_decode.py --fa3 DIR (nothing of FlashAttention or CUTLASS is committed here).
#   bash benchmarks/fetch_fa3.sh DIR
# Sources: git over the network (a depth-1 fetch of each pinned commit), or local bare mirrors:
#   FA3_MIRROR=/path/to/flash-attention.git CUTLASS_MIRROR=/path/to/cutlass.git bash ... DIR
# FA3_REV / CUTLASS_REV override the pins (to try another commit; the benchmark prints what DIR
# holds). DIR/FETCHED records the commits and where they came from.
set -euo pipefail
dir=${1:?usage: fetch_fa3.sh DIR   (env: FA3_MIRROR, CUTLASS_MIRROR, FA3_REV, CUTLASS_REV)}
# flash-attention main, 2026-08-15 ("[CuTe] Relax CUTLASS DSL requirement (#2798)"): the commit
# docs/validation.md's acc25e section read hopper/ at
fa3_rev=${FA3_REV:-0251105a2fb19d2957484b7f023cd8c115286ced}
# what that commit pins as csrc/cutlass (checked below against the gitlink in its tree)
cutlass_rev=${CUTLASS_REV:-7127592069c2fe01b041e174ba4345ef9b279671}
fa3_url=https://github.com/Dao-AILab/flash-attention.git
cutlass_url=https://github.com/NVIDIA/cutlass.git
# hopper/: its headers, the host API (flash_api_stable.cpp: argument checks, split and PackGQA
# heuristics, scheduler metadata, combine), the prepare-scheduler and combine units, the one
# instantiation SGLang's call reaches (bf16, hdim 64 / hdim_v 512, paged KV, split) for reference,
# the Python interface (read for its argument mapping) and the licence.
fa3_paths=(
    LICENSE
    'hopper/*.h'
    'hopper/*.hpp'
    hopper/flash_api_stable.cpp
    hopper/flash_prepare_scheduler.cu
    hopper/flash_fwd_combine.cu
    hopper/flash_attn_interface.py
    hopper/instantiations/flash_fwd_hdim64_512_bf16_paged_split_sm90.cu
)
cutlass_paths=(LICENSE.txt include)

# shellcheck source=benchmarks/fetch_pinned.sh
source "$(dirname "${BASH_SOURCE[0]}")/fetch_pinned.sh"
fetch_with_cutlass fetch_fa3.sh flash-attention flash-attention "$fa3_rev" "$fa3_url" "${FA3_MIRROR:-}" \
    "$cutlass_rev" "$cutlass_url" "${CUTLASS_MIRROR:-}" "$dir" "${fa3_paths[@]}"

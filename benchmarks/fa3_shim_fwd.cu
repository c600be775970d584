// FlashAttention-3's forward kernel for the one path SGLang's sparse MLA decode reaches, and nothing
// else: the instantiation unit benchmarks/fa3_sparse_decode.py compiles in place of FA3's generated
// hopper/instantiations/*.cu (FA3 itself is fetched by benchmarks/fetch_fa3.sh; none of it is here).
//
// FA3's host API (hopper/flash_api_stable.cpp, compiled as is with FLASHATTENTION_DISABLE_* switches)
// dispatches run_mha_fwd_<Arch, T, kHeadDim, kHeadDimV, Split, PagedKVNonTMA, Has_softcap, PackGQA>
// over every combination its switches leave on; with the switches the benchmark passes those are 15
// (bf16; hdim 64 with hdim_v 64 / 256 / 512; split x paged x PackGQA, PackGQA forced on when split or
// paged). SGLang's call (q_rope [tokens, heads, 64], qv = q_nope [tokens, heads, 512], a page-size-1
// page table, cu_seqlens_q, cache_seqlens, max_seqlen_q 1, num_splits 0) reaches exactly one:
// hdim 64 / 512, Split (FA3's get_num_splits gives 28 as the varlen upper bound at 2,048 keys),
// PagedKVNonTMA (page size 1 is no multiple of kBlockN 64), no softcap, PackGQA. FA3's own
// instantiation file for it (hdim64_512_bf16_paged_split) compiles run_flash_fwd for every
// causal x varlen x qv branch of run_mha_fwd_'s switches (8 kernels); this unit compiles the one
// branch the call takes: not causal (FA3 drops causal when max_seqlen_q is 1 at hdim <= 64), not
// local, varlen, with qv, no appended KV, V row-major. Any other branch, and the other 14
// combinations, raise an error naming what this build lacks.
#include <stdexcept>
#include <string>

#include "flash_fwd_launch_template.h"

namespace {
[[noreturn]] void not_built(const std::string& what) {
    throw std::runtime_error("hisparse FA3 build (benchmarks/fa3_shim_fwd.cu): " + what +
                             " is not compiled in; this build holds only SGLang's sparse MLA decode path "
                             "(bf16, hdim 64 / hdim_v 512, qv, varlen, paged KV page size 1, split, not causal)");
}
}  // namespace

template <>
void run_mha_fwd_<90, cutlass::bfloat16_t, 64, 512, true, true, false, true>(Flash_fwd_params& params,
                                                                             cudaStream_t stream) {
    bool const varlen = params.cu_seqlens_q || params.cu_seqlens_k || params.seqused_q || params.seqused_k ||
                        params.leftpad_k;
    if (params.is_causal) { not_built("the causal branch"); }
    if (params.is_local) { not_built("the local-window branch"); }
    if (!varlen) { not_built("the non-varlen branch"); }
    if (!params.qv_ptr) { not_built("the branch without qv"); }
    if (params.knew_ptr) { not_built("the append-KV branch"); }
    if (params.v_dim_stride != 1) { not_built("the column-major V branch"); }
    //            Arch kHeadDim kHeadDimV ClusterM Element              ElementOut
    run_flash_fwd<90, 64, 512, 1, cutlass::bfloat16_t, cutlass::bfloat16_t,
                  // Is_causal Is_local Has_softcap Varlen PagedKVNonTMA AppendKV HasQv PackGQA Split V_colmajor
                  false, false, false, true, true, false, true, true, true, false>(params, stream);
}

#define HISPARSE_FA3_NOT_BUILT(DV, SPLIT, PAGED, PACK)                                                       \
    template <>                                                                                              \
    void run_mha_fwd_<90, cutlass::bfloat16_t, 64, DV, SPLIT, PAGED, false, PACK>(Flash_fwd_params&,       \
                                                                                  cudaStream_t) {          \
        not_built("run_mha_fwd_<90, bf16, 64, " #DV ", split " #SPLIT ", paged " #PAGED ", packgqa " #PACK ">"); \
    }

HISPARSE_FA3_NOT_BUILT(512, false, false, false)
HISPARSE_FA3_NOT_BUILT(512, false, false, true)
HISPARSE_FA3_NOT_BUILT(512, false, true, true)
HISPARSE_FA3_NOT_BUILT(512, true, false, true)
HISPARSE_FA3_NOT_BUILT(256, false, false, false)
HISPARSE_FA3_NOT_BUILT(256, false, false, true)
HISPARSE_FA3_NOT_BUILT(256, false, true, true)
HISPARSE_FA3_NOT_BUILT(256, true, false, true)
HISPARSE_FA3_NOT_BUILT(256, true, true, true)
HISPARSE_FA3_NOT_BUILT(64, false, false, false)
HISPARSE_FA3_NOT_BUILT(64, false, false, true)
HISPARSE_FA3_NOT_BUILT(64, false, true, true)
HISPARSE_FA3_NOT_BUILT(64, true, false, true)
HISPARSE_FA3_NOT_BUILT(64, true, true, true)

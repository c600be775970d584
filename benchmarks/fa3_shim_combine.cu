// FlashAttention-3's split-KV combine for the one case SGLang's sparse MLA decode reaches: bf16 output,
// fp32 partials, hdim_v 512 (kBlockK 128). FA3's hopper/flash_fwd_combine.cu instantiates six
// (fp32 / fp16 / bf16 output x kBlockK 64 / 128), all of which its host API references; this unit
// instantiates FA3's template for the one used and makes the other five raise an error naming what
// this build lacks. See benchmarks/fa3_shim_fwd.cu for the forward kernel and why.
#include <stdexcept>
#include <string>

#include "flash_fwd_combine_launch_template.h"

template void run_mha_fwd_combine_<cutlass::bfloat16_t, float, 128>(Flash_fwd_params&, cudaStream_t, bool);

#define HISPARSE_FA3_COMBINE_NOT_BUILT(T, K)                                                               \
    template <>                                                                                            \
    void run_mha_fwd_combine_<T, float, K>(Flash_fwd_params&, cudaStream_t, bool) {                         \
        throw std::runtime_error("hisparse FA3 build (benchmarks/fa3_shim_combine.cu): run_mha_fwd_combine_<" \
                                 #T ", float, " #K "> is not compiled in; only <bfloat16, float, 128>");     \
    }

HISPARSE_FA3_COMBINE_NOT_BUILT(float, 64)
HISPARSE_FA3_COMBINE_NOT_BUILT(float, 128)
HISPARSE_FA3_COMBINE_NOT_BUILT(cutlass::half_t, 64)
HISPARSE_FA3_COMBINE_NOT_BUILT(cutlass::half_t, 128)
HISPARSE_FA3_COMBINE_NOT_BUILT(cutlass::bfloat16_t, 64)

// Our binding to FlashMLA's SM90 sparse prefill (flash_mla_sparse_fwd: BF16 q and kv, 576-wide
// rows, 512-wide values), for benchmarks/flashmla_prefill.py. It is compiled, with FlashMLA's kernel
// sources from a fetched copy (benchmarks/fetch_flashmla.sh), by torch.utils.cpp_extension.load.
//
// Written against FlashMLA 9241ae3 from what its headers declare (csrc/params.h: SparseAttnFwdParams;
// csrc/sm90/prefill/sparse/phase1.h: run_fwd_phase1_kernel) and the calling convention read in
// csrc/api/sparse_fwd.h (sparse_attn_prefill_interface). Raw device pointers and a stream handle:
// the caller owns every buffer and can capture the launch into a CUDA graph; the Python side checks
// shapes and dtypes before calling.
//
// Layouts (one KV head): q [s_q, h, 576] bf16; kv [s_kv, 576] bf16; indices [s_q, topk] int32 (a
// value outside [0, s_kv), e.g. -1, masks the entry); out [s_q, h, 512] bf16; max_logits and lse
// [s_q, h] fp32.

#include <torch/extension.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "params.h"
#include "sm90/prefill/sparse/phase1.h"

namespace {

constexpr int kDimQK = 576;
constexpr int kDimV = 512;
constexpr float kLog2e = 1.44269504f;

template <class T>
T* as_ptr(int64_t p) {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

void require(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("flashmla_prefill_shim: " + what);
}

// One sparse prefill launch: s_q query tokens of h heads, each over its topk rows of kv.
void prefill(int64_t q, int64_t kv, int64_t indices, int64_t out, int64_t max_logits, int64_t lse, int s_q,
             int s_kv, int h, int topk, double sm_scale, int num_sm, int64_t stream) {
    require(h == 64 || h == 128, "prefill: h must be 64 or 128 (the SM90 kernel's head counts)");
    require(s_q > 0 && s_kv > 0 && num_sm > 0, "prefill: s_q, s_kv and num_sm must be positive");
    require(topk > 0 && topk % 64 == 0, "prefill: topk must be a positive multiple of 64");
    SparseAttnFwdParams p{};
    p.s_q = s_q;
    p.s_kv = s_kv;
    p.h_q = h;
    p.h_kv = 1;
    p.d_qk = kDimQK;
    p.d_v = kDimV;
    p.topk = topk;
    p.sm_scale = static_cast<float>(sm_scale);
    p.sm_scale_div_log2 = static_cast<float>(sm_scale) * kLog2e;  // FlashMLA's name; the value is scale x log2(e)
    p.q = as_ptr<cutlass::bfloat16_t>(q);
    p.kv = as_ptr<cutlass::bfloat16_t>(kv);
    p.indices = as_ptr<int>(indices);
    p.attn_sink = nullptr;
    p.topk_length = nullptr;
    p.stride_q_s_q = h * kDimQK;  // elements
    p.stride_q_h_q = kDimQK;
    p.stride_kv_s_kv = kDimQK;
    p.stride_kv_h_kv = kDimQK;
    p.stride_indices_s_q = topk;
    p.stride_indices_h_kv = topk;
    p.out = as_ptr<cutlass::bfloat16_t>(out);
    p.max_logits = as_ptr<float>(max_logits);
    p.lse = as_ptr<float>(lse);
    p.num_sm = num_sm;
    p.stream = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
    sm90::fwd::run_fwd_phase1_kernel<kDimQK, false>(p);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashMLA's SM90 sparse MLA prefill (BF16, d_qk 576) on raw device pointers (hisparse-sim benchmark shim)";
    m.def("prefill", &prefill, "one sparse prefill launch");
}

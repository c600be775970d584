// Our binding to FlashMLA's SM90 sparse FP8 decode (DeepSeek-V3.2 KV layout), for
// benchmarks/flashmla_compare.py. It is compiled, with FlashMLA's kernel sources from a fetched
// copy (benchmarks/fetch_flashmla.sh), by torch.utils.cpp_extension.load.
//
// Written against FlashMLA 9241ae3 from what its headers declare (csrc/params.h: the parameter
// structs; the three run_* entry points) and the calling convention read in csrc/api/
// sparse_decode.h and flash_mla/flash_mla_interface.py: per decode step, one scheduler-metadata
// launch plans how num_sm_parts persistent CTAs (groups) share the requests; per layer, the
// split-KV kernel writes finished requests to out/lse and split ones to o_accum/lse_accum, and the
// combine kernel merges the splits. Arguments are raw device pointers and a stream handle, so the
// caller (CuPy) owns every buffer and can capture the launches into a CUDA graph; the Python side
// checks shapes and dtypes before calling (flashmla_compare.FlashMLADecode).
//
// Layouts (s_q = 1 query token per request, one KV head):
//   q [b, h, 576] bf16; kv [num_blocks * page, 656] uint8 rows (a token index t is row t);
//   indices [b, topk] int32 (-1 masks); out [b, h, 512] bf16; lse [b, h] fp32 (natural log);
//   o_accum [b + parts, h, 512] fp32; lse_accum [b + parts, h] fp32;
//   meta [parts, 8] int32 (DecodingSchedMeta); num_splits [b + 1] int32.

#include <torch/extension.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace {

constexpr int kDimQK = 576;
constexpr int kDimV = 512;
constexpr int kRowBytes = 656;  // 512 e4m3 + 4 fp32 scales + 64 bf16 rope
constexpr float kLog2e = 1.44269504f;

template <class T>
T* as_ptr(int64_t p) {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

cudaStream_t as_stream(int64_t s) {
    return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s));
}

void require(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("flashmla_shim: " + what);
}

// ints per DecodingSchedMeta record (the meta buffer is [parts, this] int32)
int sched_meta_ints() { return static_cast<int>(sizeof(DecodingSchedMeta) / sizeof(int)); }

// One scheduler-metadata launch: which requests / 64-token blocks each of num_sm_parts groups takes.
void sched_meta(int64_t meta, int64_t num_splits, int b, int topk, int num_sm_parts, int block_size_topk,
                int fixed_overhead_blocks, int64_t stream) {
    require(b > 0 && topk > 0 && num_sm_parts > 0, "sched_meta: b, topk and num_sm_parts must be positive");
    GetDecodeSchedMetaParams p{};
    p.b = b;
    p.s_q = 1;
    p.block_size_n = block_size_topk;
    p.fixed_overhead_num_blocks = fixed_overhead_blocks;
    p.topk = topk;
    p.extra_topk = 0;
    p.topk_length = nullptr;
    p.extra_topk_length = nullptr;
    p.seqlens_k_ptr = nullptr;
    p.tile_scheduler_metadata_ptr = as_ptr<DecodingSchedMeta>(meta);
    p.num_splits_ptr = as_ptr<int>(num_splits);
    p.num_sm_parts = num_sm_parts;
    p.stream = as_stream(stream);
    smxx::decode::run_get_decoding_sched_meta_kernel(p);
}

// One layer's decode: the split-KV kernel for h heads, then the combine kernel.
void decode(int64_t q, int64_t kv, int64_t indices, int64_t out, int64_t lse, int64_t o_accum, int64_t lse_accum,
            int64_t meta, int64_t num_splits, int b, int h, int num_blocks, int page_block_size, int topk,
            int num_sm_parts, double sm_scale, int64_t stream) {
    require(h == 64 || h == 128, "decode: h must be 64 or 128 (the SM90 kernel's instantiations)");
    require(b > 0 && num_blocks > 0 && page_block_size > 0 && num_sm_parts > 0, "decode: sizes must be positive");
    require(topk > 0 && topk % 64 == 0, "decode: topk must be a positive multiple of 64");
    SparseAttnDecodeParams p{};
    p.b = b;
    p.s_q = 1;
    p.h_q = h;
    p.h_kv = 1;
    p.d_qk = kDimQK;
    p.d_v = kDimV;
    p.sm_scale = static_cast<float>(sm_scale);
    p.sm_scale_div_log2 = static_cast<float>(sm_scale) * kLog2e;  // FlashMLA's name; the value is scale x log2(e)
    p.num_blocks = num_blocks;
    p.page_block_size = page_block_size;
    p.topk = topk;
    p.model_type = ModelType::V32;
    p.q = as_ptr<cutlass::bfloat16_t>(q);
    p.kv = as_ptr<cutlass::bfloat16_t>(kv);  // read as bytes by the kernel
    p.indices = as_ptr<int>(indices);
    p.topk_length = nullptr;
    p.attn_sink = nullptr;
    p.lse = as_ptr<float>(lse);
    p.out = as_ptr<cutlass::bfloat16_t>(out);
    p.extra_num_blocks = p.extra_page_block_size = p.extra_topk = 0;
    p.extra_kv = nullptr;
    p.extra_indices = nullptr;
    p.extra_topk_length = nullptr;
    p.stride_q_b = p.stride_q_s_q = h * kDimQK;  // elements
    p.stride_q_h_q = kDimQK;
    p.stride_kv_block = page_block_size * kRowBytes;  // bytes (the kernel indexes an fp8 pointer)
    p.stride_kv_row = kRowBytes;
    p.stride_indices_b = p.stride_indices_s_q = topk;
    p.stride_lse_b = p.stride_lse_s_q = h;
    p.stride_o_b = p.stride_o_s_q = h * kDimV;
    p.stride_o_h_q = kDimV;
    p.stride_extra_kv_block = p.stride_extra_kv_row = 0;
    p.stride_extra_indices_b = p.stride_extra_indices_s_q = 0;
    p.stream = as_stream(stream);
    p.lse_accum = as_ptr<float>(lse_accum);
    p.o_accum = as_ptr<float>(o_accum);
    p.stride_lse_accum_split = p.stride_lse_accum_s_q = h;
    p.stride_o_accum_split = p.stride_o_accum_s_q = h * kDimV;
    p.stride_o_accum_h_q = kDimV;
    p.tile_scheduler_metadata_ptr = as_ptr<DecodingSchedMeta>(meta);
    p.num_splits_ptr = as_ptr<int>(num_splits);
    p.num_sm_parts = num_sm_parts;
    if (h == 128) {
        sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(p);
    } else {
        sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(p);
    }

    CombineParams c{};
    c.b = b;
    c.s_q = 1;
    c.h_q = h;
    c.d_v = kDimV;
    c.lse = p.lse;
    c.out = p.out;
    c.stride_lse_b = p.stride_lse_b;
    c.stride_lse_s_q = p.stride_lse_s_q;
    c.stride_o_b = p.stride_o_b;
    c.stride_o_s_q = p.stride_o_s_q;
    c.stride_o_h_q = p.stride_o_h_q;
    c.lse_accum = p.lse_accum;
    c.o_accum = p.o_accum;
    c.stride_lse_accum_split = p.stride_lse_accum_split;
    c.stride_lse_accum_s_q = p.stride_lse_accum_s_q;
    c.stride_o_accum_split = p.stride_o_accum_split;
    c.stride_o_accum_s_q = p.stride_o_accum_s_q;
    c.stride_o_accum_h_q = p.stride_o_accum_h_q;
    c.tile_scheduler_metadata_ptr = p.tile_scheduler_metadata_ptr;
    c.num_splits_ptr = p.num_splits_ptr;
    c.num_sm_parts = num_sm_parts;
    c.attn_sink = nullptr;
    c.stream = p.stream;
    smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashMLA's SM90 sparse FP8 decode (V3.2 layout) on raw device pointers (hisparse-sim benchmark shim)";
    m.def("sched_meta_ints", &sched_meta_ints);
    m.def("sched_meta", &sched_meta, "scheduler metadata for b requests of topk tokens");
    m.def("decode", &decode, "split-KV decode + combine for one layer");
}

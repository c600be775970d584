"""The work of one DSA decode step on one GPU, op by op, from the model's shapes.

Every kernel a decode layer launches (MLA with absorbed up-projections, the lightning indexer,
the MoE with its shared and routed experts as grouped GEMMs, dense MLP layers, norms, rope,
quantisation, the sampler) as an ``Op``: its kind (the cost term that prices it), weight dtype,
GEMM shape, FLOPs and bytes through HBM, for a batch, the requests' contexts and a parallel
layout. Shapes follow DeepSeek-V3.2's ``inference/model.py`` (``MLA``, ``Indexer``, ``MoE``) and
SGLang's ``python/sglang/srt/models/deepseek_v2.py`` (fused q_a + kv_a projection; absorbed
``w_kc``/``w_vc`` as BF16 batched GEMMs, ``ABSORBED_BMM_DTYPE``). Communication is not here (the
serving model's term).

``ModelShape`` is the protocol the serving branch's ``ModelSpec`` satisfies (same attribute names);
tests use a local frozen dataclass with GLM-5.1's and DeepSeek-V3.2's config values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

INDEXER_ROW_BYTES = 132  # 128 fp8 codes + fp32 scale (BRIEF 2; cupy_kernels/indexer.py ROW_BYTES)

# The absorbed ``w_kc`` / ``w_vc`` of an MLA layer run in BF16 on NVIDIA GPUs whatever the checkpoint: SGLang's
# ``post_load_weights`` (``models/deepseek_common/deepseek_weight_loader.py``; ``deepseek_v2.py`` before the
# split) dequantises a block-FP8 ``kv_b_proj`` with 128 x 128 blocks to BF16 on CUDA (``block_quant_dequant``;
# ``bmm_fp8`` on per-tensor FP8 only with ``block_quant_to_tensor_quant`` for other block sizes, DeepGEMM's bmm
# only with ``SGL_USE_DEEPGEMM_BMM``, off by default), and GLM ships ``kv_b_proj`` in BF16 ("GLM ships kv_b_proj
# as bf16, which falls back to torch.bmm"). ``forward_absorb_prepare`` / ``forward_absorb_core`` then run
# ``torch.bmm`` on the BF16 activations: no per-tensor FP8 quantisation of q_nope or of the attention output
# (``per_tensor_quant_mla_fp8`` runs only before ``bmm_fp8``, for an FP8 ``w_kc``). GLM-5.x-FP8 and
# DeepSeek-V3.2-FP8 both use 128 x 128 blocks; the memory model counts the same BF16 copies (serving/memory.py).
ABSORBED_BMM_DTYPE = "bf16"

# bytes of one weight element by storage format, scales apart: FP4 (e2m1, NVFP4 and MXFP4) packs two
# per byte; each format's block scales come with the model's bytes per parameter (Layout.expert_bytes)
WEIGHT_BYTES = {"fp4": 0.5, "fp8": 1.0, "bf16": 2.0}


def dtype_of(bytes_per_param: float) -> str:
    """The storage format a checkpoint's bytes per parameter (scales included) imply: NVFP4 0.5625
    (an FP8 scale per 16), MXFP4 0.53125 (an E8M0 scale per 32), block-FP8 1.0002, BF16 2."""
    return "fp4" if bytes_per_param < 0.75 else "fp8" if bytes_per_param < 1.5 else "bf16"
ACT_BYTES = 2  # bf16 activations between kernels
# grouped_gemm: routed experts whole (EP, E / ep experts per GPU). Under SGLang's fused MoE with
# --tp every expert's intermediate is split over moe_tp GPUs, and the two slices behave unlike whole
# experts and unlike each other (measured: gate_up N = 2 x inter / tp streams its weights near the
# whole experts' rate, down with K = inter / tp at about a third of it): one kind each.
TP_MOE_KINDS = {"routed_gate_up": "grouped_gemm_tp_up", "routed_down": "grouped_gemm_tp_down"}
# The kernel that times (and prices) those slices. SGLang runs its Triton fused MoE there (block-FP8,
# tokens sorted and padded per expert: cupy_kernels/fused_moe.py, calibrate --terms fused-moe-tp);
# the older terms timed torch._scaled_grouped_mm at the same shapes (calibrate --terms moe-tp).
TP_MOE_KERNELS = {"triton_fused_moe": {"routed_gate_up": "fused_moe_tp_up", "routed_down": "fused_moe_tp_down"},
                  "torch_scaled_grouped_mm": TP_MOE_KINDS}
DEFAULT_TP_MOE_KERNEL = "triton_fused_moe"
GROUPED_KINDS = ("grouped_gemm", *TP_MOE_KINDS.values())
KINDS = ("gemm", "batched_gemm", *GROUPED_KINDS, "elementwise", "indexer", "attention")
# The lightning indexer's kernels of one layer (``attention_ops``): under IndexShare (GLM-5.2) only the
# anchor ("full") layers run them; a shared layer attends with its anchor's top-k and owns no indexer
# weights (transformers GlmMoeDsaConfig ``indexer_types``; SGLang/vLLM build no Indexer for skip_topk layers).
INDEXER_OPS = frozenset({"indexer_wq_b", "indexer_wk", "indexer_weights_proj", "indexer_k_norm_rope_quant_store",
                         "indexer_q_rope_quant", "indexer_score_topk"})


def anchor_layer_ids(m: object) -> tuple[int, ...]:
    """The layers that run the indexer: a ModelSpec's ``anchor_layers``, or every layer for a shape
    without IndexShare fields."""
    return tuple(getattr(m, "anchor_layers", range(m.layers)))  # type: ignore[attr-defined]


class ModelShape(Protocol):
    """Architecture fields (HF config names in comments) a step's work is computed from."""

    layers: int  # num_hidden_layers
    dense_layers: int  # first_k_dense_replace
    hidden_size: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    dense_intermediate_size: int  # intermediate_size
    moe_intermediate_size: int
    shared_experts: int  # n_shared_experts
    vocab_size: int
    attention_heads: int  # num_attention_heads
    indexer_heads: int  # index_n_heads
    indexer_head_dim: int  # index_head_dim
    top_k: int  # index_topk
    experts: int  # n_routed_experts
    experts_per_token: int  # num_experts_per_tok


@dataclass(frozen=True)
class Layout:
    """How one GPU's share of a step is cut (SGLang's ``--tp 8 --dp 8 --enable-dp-attention``
    by default). Attention runs data-parallel on each rank's own requests (``attention_tp`` 1);
    the MLP side sees the tokens of all ``attention_dp`` ranks: dense MLPs, the shared expert and
    the lm_head split over ``mlp_tp`` GPUs; routed experts spread over ``expert_parallel`` GPUs
    (DeepEP, 1/8 of the experts each) or each expert's intermediate split over ``moe_tp`` GPUs
    (SGLang's default fused MoE under ``--tp 8``: every GPU holds 1/8 of every expert)."""

    attention_tp: int = 1
    attention_dp: int = 8
    mlp_tp: int = 8
    expert_parallel: int = 8
    moe_tp: int = 1
    weight_dtype: str = "fp8"  # attention, indexer, dense MLP and shared-expert GEMMs
    expert_dtype: str = ""  # routed experts ("": weight_dtype)
    expert_bytes: float = 0.0  # routed experts' bytes per weight, scales included (0: WEIGHT_BYTES[expert_dtype])
    # the shared expert whole on every GPU, run on the rank's own tokens: SGLang's DeepseekV2MoE builds it
    # with ``tp_rank=0, tp_size=1`` under ``--moe-a2a-backend deepep`` (DeepEP combines, nothing all-reduces it)
    shared_replicated: bool = False

    @classmethod
    def of(cls, tp: int, dp: int, moe: str = "ep", weight_dtype: str = "fp8", expert_dtype: str = "",
           expert_bytes: float = 0.0, shared_replicated: bool = False) -> Layout:
        """SGLang's ``--tp tp --dp dp`` (``dp == tp``: ``--enable-dp-attention``, attention whole on
        each of the dp ranks; else attention split over tp / dp GPUs), MoE ``"ep"`` (DeepEP) or
        ``"tp"`` (fused MoE, each expert split over the tp GPUs); ``shared_replicated``: DeepEP's
        whole shared expert per GPU."""
        if moe not in ("ep", "tp"):
            raise ValueError(f"layout: moe must be 'ep' or 'tp', got {moe!r}")
        if tp < 1 or dp < 1 or tp % dp:
            raise ValueError(f"layout: tp ({tp}) must be a positive multiple of dp ({dp})")
        return cls(attention_tp=tp // dp, attention_dp=dp, mlp_tp=tp, expert_parallel=tp if moe == "ep" else 1,
                   moe_tp=1 if moe == "ep" else tp, weight_dtype=weight_dtype, expert_dtype=expert_dtype,
                   expert_bytes=expert_bytes, shared_replicated=shared_replicated)

    def __post_init__(self) -> None:
        for name in ("attention_tp", "attention_dp", "mlp_tp", "expert_parallel", "moe_tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"layout: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("weight_dtype", "routed_dtype"):
            if getattr(self, name) not in WEIGHT_BYTES:
                raise ValueError(f"layout: {name} must be one of {tuple(WEIGHT_BYTES)}, got {getattr(self, name)!r}")
        if self.expert_bytes < 0:
            raise ValueError(f"layout: expert_bytes must be >= 0, got {self.expert_bytes}")

    @property
    def routed_dtype(self) -> str:
        return self.expert_dtype or self.weight_dtype

    @property
    def routed_bytes(self) -> float:
        """Bytes the routed experts' GEMMs read per weight element."""
        return self.expert_bytes or WEIGHT_BYTES[self.routed_dtype]


@dataclass(frozen=True)
class Op:
    """One kernel of the step. ``m, k, n`` the GEMM shape (rows = tokens), ``groups`` the batch of
    a batched/grouped GEMM; ``flops`` and ``bytes`` (HBM) of the whole launch; ``count`` launches."""

    name: str
    kind: str
    dtype: str
    flops: float
    bytes: float
    m: int = 0
    k: int = 0
    n: int = 0
    groups: int = 1
    count: int = 1
    tokens: float = 0.0  # indexer: tokens scored; attention: requests; grouped GEMM: rows
    weight_groups: float = 0.0  # grouped GEMM: groups whose weights are read (experts touched)
    bytes_per_weight: float = 0.0  # 0: WEIGHT_BYTES[dtype] (a format's scales, where they count)

    @property
    def weight_bytes(self) -> float:
        """HBM bytes of the weights a GEMM reads (each touched group once)."""
        per = self.bytes_per_weight or WEIGHT_BYTES[self.dtype]
        return float(self.k * self.n * per * (self.weight_groups or self.groups))


def gemm(name: str, m: int, k: int, n: int, dtype: str, groups: int = 1, weight_groups: float | None = None,
         kind: str = "gemm") -> Op:
    """An [m, k] x [k, n] product (x ``groups``): weights read once per group touched, bf16 in
    and out."""
    wg = groups if weight_groups is None else weight_groups
    flops = 2.0 * m * k * n * groups
    nbytes = k * n * WEIGHT_BYTES[dtype] * wg + ACT_BYTES * m * (k + n) * groups
    return Op(name, kind, dtype, flops, nbytes, m, k, n, groups)


def elementwise(name: str, elems: float, passes: float = 2.0, count: int = 1) -> Op:
    """A memory-bound kernel touching ``elems`` bf16 values ``passes`` times (read + write = 2)."""
    return Op(name, "elementwise", "bf16", 0.0, elems * ACT_BYTES * passes, count=count)


# The prefill indexer's logits (SGLang 0.5.14 ``dsa_indexer.Indexer._get_topk_ragged``; DeepSeek-V4: ``dsv4/indexer.py``,
# the paged kernel): DeepGEMM's ``fp8_mqa_logits`` returns one fp32 score per query-key pair
# (``_MQA_LOGITS_BYTES_PER_ELEM = 4``), which the top-k kernel then reads (``prefill_topk_read_op``).
INDEXER_LOGITS_BYTES = 4
# Passes SGLang's top-k kernel makes over a row's valid scores (sgl-kernel ``topk.cu`` ``fast_topk_cuda_tl``, the
# kernel of sglang-kernel 0.4.4, and DeepSeek-V4's ``jit_kernel/csrc/deepseek_v4/topk_v1.cuh``): an 8-bit
# histogram, then a second pass that keeps the entries above the threshold bin and collects those in it.
INDEXER_TOPK_PASSES = 2


def causal_rows(tokens: float, prior_ctx: float, longer_than: float = 0.0) -> float:
    """Keys over a prompt chunk's causal rows: the sum of each query's row length (prior_ctx + 1 ..
    prior_ctx + tokens keys) over the rows longer than ``longer_than`` keys."""
    lo, hi = max(float(prior_ctx), float(longer_than)), float(prior_ctx) + float(tokens)
    return max(0.0, (hi * (hi + 1.0) - lo * (lo + 1.0)) / 2.0)


def prefill_topk_read_op(tokens: float, prior_ctx: float, top_k: int, tokens_per_key: int = 1) -> Op:
    """One indexer layer's top-k over a prompt chunk's materialised logits: every row longer than
    ``top_k`` keys read ``INDEXER_TOPK_PASSES`` times (a row of at most top_k keys takes every key without
    reading a score: ``naive_topk_transform_ragged``); DeepSeek-V4's C4 rows hold a key per
    ``tokens_per_key`` tokens. A memory-bound kernel, priced by the elementwise term (its ``bf16`` key names
    that term; the scores are fp32, counted at ``INDEXER_LOGITS_BYTES`` each)."""
    keys = causal_rows(tokens, prior_ctx, top_k * tokens_per_key) / tokens_per_key
    return Op("indexer_topk_logits_read", "elementwise", "bf16", 0.0, keys * INDEXER_LOGITS_BYTES * INDEXER_TOPK_PASSES)


def mlp_tokens(batch: int, layout: Layout) -> int:
    """Tokens the MLP side of one GPU sees per step: every DP rank's batch."""
    return batch * layout.attention_dp


def routed_rows(batch: int, m: ModelShape, layout: Layout) -> tuple[float, float]:
    """(rows routed to this GPU's experts, its experts that receive at least one) for uniform
    routing: each token picks ``experts_per_token`` of ``experts`` distinct experts."""
    tokens = mlp_tokens(batch, layout)
    local = m.experts / layout.expert_parallel
    p = m.experts_per_token / m.experts
    return tokens * m.experts_per_token / layout.expert_parallel, local * (1.0 - (1.0 - p) ** tokens)


def attention_ops(m: ModelShape, batch: int, ctx_sum: float, layout: Layout, kv_row_bytes: int,
                  absorbed: str = ABSORBED_BMM_DTYPE, q_concat: bool = True) -> list[Op]:
    """MLA (absorbed) + indexer of one layer for ``batch`` requests on this rank. ``absorbed``: the
    dtype of the ``w_kc`` / ``w_vc`` bmm, SGLang's BF16 ``torch.bmm`` by default; ``"fp8"`` is the
    ``bmm_fp8`` path of a per-tensor FP8 ``w_kc`` (a per-tensor quantisation of its input first), which
    the committed layer-loop measurements ran (``calibration/layer_loop.py``). ``q_concat`` False: without
    the q concatenation before FlashMLA (the layer loops committed before it was an op did not run it)."""
    b, w, tp = batch, layout.weight_dtype, layout.attention_tp
    h = m.attention_heads // tp
    d, qr, kvr = m.hidden_size, m.q_lora_rank, m.kv_lora_rank
    nope, rope, v = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    # the lightning indexer is replicated, not split over attention TP: every GPU computes all its heads
    # for the rank's tokens (nsa_indexer.py Indexer.__init__: wq_b, wk, weights_proj are ReplicatedLinear)
    ih = m.indexer_heads
    idx_dim = m.indexer_head_dim
    k_rows = min(m.top_k, ctx_sum / max(b, 1)) if b else 0
    att_bytes = b * k_rows * kv_row_bytes
    att_flops = 2.0 * b * h * k_rows * ((kvr + rope) + kvr)
    fp8 = absorbed == "fp8"  # per_tensor_quant_mla_fp8 before each bmm_fp8: absmax, then quantise
    quant_q = [elementwise("quant_q_nope", b * h * nope, passes=1.5, count=2)] if fp8 else []
    quant_out = [elementwise("quant_attn_out", b * h * kvr, passes=1.5, count=2)] if fp8 else []
    return [
        elementwise("input_norm", b * d, passes=3),  # fused residual add + RMSNorm
        elementwise("quant_qkv_a", b * d, passes=1.5),  # per-token-group fp8 quantisation
        gemm("qkv_a_proj", b, d, qr + kvr + rope, w),  # SGLang's fused_qkv_a_proj_with_mqa
        elementwise("q_a_norm", b * qr),
        elementwise("kv_a_norm", b * (kvr + rope)),
        gemm("q_b_proj", b, qr, h * (nope + rope), w),
        *quant_q,
        gemm("w_kc_absorbed", b, nope, kvr, absorbed, groups=h, kind="batched_gemm"),  # torch.bmm (BF16)
        elementwise("rope_and_kv_store", b * h * rope + b * (kvr + rope)),
        # FlashMLA takes one q of kv_lora_rank + rope per head: SGLang's NSA backend concatenates the absorbed
        # q_nope and q_rope before its flashmla_sparse / flashmla_kv / trtllm calls, prefill and decode
        # (nsa_backend.py forward_extend / forward_decode: ``_concat_mla_absorb_q_general``): read both, write q_all;
        # its fa3 decode backend (Hopper, BF16 KV) takes them apart (``CostModel.decode_q_concat`` passes False)
        *([elementwise("q_concat", b * h * (kvr + rope), passes=2)] if q_concat else []),
        gemm("indexer_wq_b", b, qr, ih * idx_dim, w),
        gemm("indexer_wk", b, d, idx_dim, w),
        gemm("indexer_weights_proj", b, d, ih, "bf16"),
        elementwise("indexer_k_norm_rope_quant_store", b * idx_dim * 2),
        elementwise("indexer_q_rope_quant", b * ih * idx_dim),
        Op("indexer_score_topk", "indexer", "fp8", 2.0 * ctx_sum * ih * idx_dim,
           ctx_sum * INDEXER_ROW_BYTES + 8.0 * ctx_sum, m=b, k=idx_dim, n=ih, tokens=ctx_sum),
        Op("sparse_attention", "attention", "bf16" if kv_row_bytes >= 1024 else "fp8", att_flops, att_bytes,
           m=b, tokens=b),
        *quant_out,
        gemm("w_vc_absorbed", b, kvr, v, absorbed, groups=h, kind="batched_gemm"),
        elementwise("quant_o", b * h * v, passes=1.5),
        gemm("o_proj", b, h * v, d, w),
        elementwise("post_attention_norm", b * d, passes=3),
    ]


def flashmla_q_pad_ops(m: ModelShape, tokens: int, heads: int, padded_heads: int) -> list[Op]:
    """The two kernels SGLang runs before FlashMLA's sparse prefill when a rank's query heads are not a
    multiple of the kernel's (``nsa_backend._forward_flashmla_sparse``: ``q_padded = q_all.new_zeros((num_tokens,
    required_padding, head_dim))`` then ``q_padded[:, :num_heads, :] = q_all``): a zero fill of every padded
    head's q (written once) and a copy of the real heads into it (read + write), bf16, ``kv_lora_rank + rope``
    per head. None when no padding is needed."""
    if padded_heads <= heads or tokens <= 0:
        return []
    dim = m.kv_lora_rank + m.qk_rope_head_dim
    return [elementwise("q_pad_zero", tokens * padded_heads * dim, passes=1),
            elementwise("q_pad_copy", tokens * heads * dim, passes=2)]


def dense_mlp_ops(m: ModelShape, batch: int, layout: Layout) -> list[Op]:
    t, w, tp = mlp_tokens(batch, layout), layout.weight_dtype, layout.mlp_tp
    inter, d = m.dense_intermediate_size // tp, m.hidden_size
    return [gemm("dense_gate_up", t, d, 2 * inter, w), elementwise("silu_mul_quant", t * inter, passes=3),
            gemm("dense_down", t, inter, d, w)]


# Rows per local expert under DeepEP's normal dispatch (SGLang's extend passes with --moe-a2a-backend deepep):
# ``token_dispatcher/deepep.py`` ``_DeepEPDispatcherImplNormal._dispatch_core`` calls DeepEP's ``buffer.dispatch``
# with ``expert_alignment=128 if deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM else 1`` (JIT DeepGEMM is SGLang's default
# on SM90 / SM100), so every local expert's received count is rounded up to 128, and the DeepGEMM contiguous path
# (``pre_permute_deepep_normal_to_deep_gemm`` / ``forward_deepgemm_contiguous``) allocates and multiplies
# ``all_tokens = sum(num_recv_tokens_per_expert)`` rows: the padding rows are computed (each 128-row M block starts
# with a real row, so DeepGEMM's skip of all-padding blocks never applies).
DEEPEP_NORMAL_EXPERT_ALIGNMENT = 128


@lru_cache(maxsize=4096)
def aligned_rows_per_expert(tokens: int, p: float, align: int) -> float:
    """E[ceil(X / align) * align] for X ~ Binomial(tokens, p): the rows one expert computes when each of
    ``tokens`` tokens picks it with probability ``p`` (uniform routing: top-k / experts) and its count is
    rounded up to ``align`` (an expert that receives none computes none)."""
    if tokens <= 0 or p <= 0.0:
        return 0.0
    if align <= 1:
        return tokens * p
    mean, sd = tokens * p, math.sqrt(tokens * p * (1.0 - p))
    lo, hi = max(0, int(mean - 12 * sd) - align), min(tokens, int(mean + 12 * sd) + align + 1)
    ks = np.arange(lo, hi + 1, dtype=float)
    logpmf = (math.lgamma(tokens + 1) - np.array([math.lgamma(k + 1) + math.lgamma(tokens - k + 1) for k in ks])
              + ks * math.log(p) + (tokens - ks) * math.log1p(-p))
    pmf = np.exp(logpmf - logpmf.max())
    return float((np.ceil(ks / align) * align * pmf).sum() / pmf.sum())


def deepep_contiguous_ops(m: ModelShape, batch: int, layout: Layout) -> list[Op]:
    """The kernels one MoE layer adds around DeepGEMM's contiguous GEMMs in a DeepEP extend pass (normal
    dispatch), for ``batch`` tokens per rank, read in SGLang's source:

    - ``pre_permute_deepep_normal_to_deep_gemm``: ``ep_scatter`` copies every received (token, local expert)
      row, FP8 values and scales, into the expert-sorted contiguous buffer: the real rows, read and written
      once at one byte per value (one bf16 pass);
    - the contiguous runner's ``silu_and_mul`` writes bf16 and a separate ``sglang_per_token_group_quant_fp8``
      reads it back and writes FP8 for the down GEMM, over every aligned row (``moe_ops``' fused
      ``routed_silu_mul_quant`` prices the first; this is the second, 1.5 passes).

    The rank's own FP8 quantisation before the dispatch is ``deepep_dispatch_quant`` (a rank term)."""
    t, d = mlp_tokens(batch, layout), m.hidden_size
    inter = m.moe_intermediate_size // layout.moe_tp
    local = m.experts // layout.expert_parallel
    real_rows, _ = routed_rows(batch, m, layout)
    aligned = local * aligned_rows_per_expert(int(round(t)), m.experts_per_token / m.experts,
                                              DEEPEP_NORMAL_EXPERT_ALIGNMENT)
    return [elementwise("ep_scatter", real_rows * d, passes=1.0),
            elementwise("routed_act_quant", aligned * inter, passes=1.5)]


def deepep_dispatch_quant(m: ModelShape, rows: float) -> Op:
    """A rank's hidden states quantised to FP8 per 128-channel group before DeepEP's normal dispatch
    (SGLang ``_DeepEPDispatcherImplNormal.dispatch_a`` with JIT DeepGEMM: ``sglang_per_token_group_quant_fp8``):
    read bf16, write FP8, 1.5 bf16 passes over the rank's ``rows`` tokens. DeepEP's low-latency dispatch
    (decode) quantises inside its own kernel (``use_fp8``): no separate kernel there."""
    return elementwise("deepep_dispatch_quant", rows * m.hidden_size, passes=1.5)


def moe_ops(m: ModelShape, batch: int, layout: Layout, *, align: int = 0) -> list[Op]:
    """One MoE layer's kernels for ``batch`` tokens per rank. ``align`` > 1: the routed GEMMs compute every
    local expert's rows rounded up to ``align`` (DeepEP's normal dispatch into DeepGEMM's contiguous layout,
    ``DEEPEP_NORMAL_EXPERT_ALIGNMENT``); their weight bytes do not change."""
    t, w, d = mlp_tokens(batch, layout), layout.weight_dtype, m.hidden_size
    inter = m.moe_intermediate_size // layout.moe_tp
    # the shared expert: split over the MLP's GPUs on every rank's tokens, or (DeepEP) whole on the rank's own
    shared = m.moe_intermediate_size * m.shared_experts // (1 if layout.shared_replicated else layout.mlp_tp)
    st = batch if layout.shared_replicated else t
    rows, touched = routed_rows(batch, m, layout)
    local = m.experts // layout.expert_parallel
    if align > 1:  # rows as computed: each local expert's count rounded up to the alignment
        rows = local * aligned_rows_per_expert(int(round(t)), m.experts_per_token / m.experts, align)
    per_expert = rows / local
    ops = [
        gemm("router_gate", t, d, m.experts, "bf16"),
        elementwise("router_topk", t * m.experts, passes=1),
        elementwise("moe_align_sort", t * m.experts_per_token, passes=4),
    ]
    if shared:
        ops += [gemm("shared_gate_up", st, d, 2 * shared, w), elementwise("shared_silu_mul", st * shared, passes=3),
                gemm("shared_down", st, shared, d, w)]
    tp = layout.moe_tp > 1
    rw, wb = layout.routed_dtype, layout.routed_bytes  # the routed experts' own format
    up = gemm("routed_gate_up", math.ceil(per_expert), d, 2 * inter, rw, groups=local, weight_groups=touched,
              kind=TP_MOE_KINDS["routed_gate_up"] if tp else "grouped_gemm")
    down = gemm("routed_down", math.ceil(per_expert), inter, d, rw, groups=local, weight_groups=touched,
                kind=TP_MOE_KINDS["routed_down"] if tp else "grouped_gemm")
    # FLOPs and activations from the expected rows, not the rounded-up rows per expert
    scale = rows / max(math.ceil(per_expert) * local, 1e-9)
    ops += [Op(up.name, up.kind, up.dtype, up.flops * scale, d * 2 * inter * wb * touched
               + ACT_BYTES * rows * (d + 2 * inter), up.m, up.k, up.n, up.groups, tokens=rows, weight_groups=touched,
               bytes_per_weight=wb),
            elementwise("routed_silu_mul_quant", rows * inter, passes=3),
            Op(down.name, down.kind, down.dtype, down.flops * scale, inter * d * wb * touched
               + ACT_BYTES * rows * (inter + d), down.m, down.k, down.n, down.groups, tokens=rows,
               weight_groups=touched, bytes_per_weight=wb),
            elementwise("moe_combine", rows * d + t * d, passes=1.5)]
    return ops


# The MoE kernels a DeepEP layer runs on the rank's own tokens before its dispatch (SGLang
# ``DeepseekV2MoE.forward_deepep``: ``_forward_shared_experts(hidden_states)`` and the router on the local
# ``hidden_states``; the shared expert whole on every GPU, ``Layout.shared_replicated``)
RANK_MOE_OPS = frozenset({"router_gate", "router_topk", "shared_gate_up", "shared_silu_mul", "shared_down"})


def rank_moe_ops(m: ModelShape, rows: int, layout: Layout) -> list[Op]:
    """``RANK_MOE_OPS`` of one MoE layer on a rank's ``rows`` tokens under DeepEP (``shared_replicated``):
    the router and the whole shared expert, as ``moe_ops`` shapes them for one rank's tokens."""
    shared = [o for o in moe_ops(m, rows, layout) if o.name in RANK_MOE_OPS and o.name.startswith("shared")]
    router = [o for o in moe_ops(m, max(rows / layout.attention_dp, 1e-9), layout) if o.name.startswith("router")]
    return router + shared


def layer_ops(m: ModelShape, batch: int, ctx_sum: float, layout: Layout = Layout(), *, dense: bool = False,
              kv_row_bytes: int = 1152, absorbed: str = ABSORBED_BMM_DTYPE, q_concat: bool = True) -> list[Op]:
    """Every kernel of one decoder layer (a dense-MLP layer when ``dense``)."""
    if batch <= 0:
        return []
    mlp = dense_mlp_ops(m, batch, layout) if dense else moe_ops(m, batch, layout)
    return attention_ops(m, batch, ctx_sum, layout, kv_row_bytes, absorbed, q_concat) + mlp


def step_head_ops(m: ModelShape, batch: int, layout: Layout = Layout()) -> list[Op]:
    """Once per step: final norm, lm_head (vocab split over ``mlp_tp``), the sampler."""
    t = mlp_tokens(batch, layout)
    vocab = m.vocab_size // layout.mlp_tp
    return [elementwise("final_norm", batch * m.hidden_size, passes=2),
            gemm("lm_head", t, m.hidden_size, vocab, "bf16"),
            Op("sampler", "elementwise", "bf16", 0.0, batch * m.vocab_size * 4 * 2.0, count=2)]


def step_ops(m: ModelShape, batch: int, ctx_sum: float, layout: Layout = Layout(), *,
             kv_row_bytes: int = 1152) -> list[tuple[int, list[Op]]]:
    """The whole step as (repeat count, ops): dense layers, MoE layers, the head."""
    out = []
    anchors = anchor_layer_ids(m)
    dense_anchors = sum(1 for a in anchors if a < m.dense_layers)
    for count, n_anchor, dense in ((m.dense_layers, dense_anchors, True),
                                   (m.layers - m.dense_layers, len(anchors) - dense_anchors, False)):
        if count <= 0:
            continue
        ops = layer_ops(m, batch, ctx_sum, layout, dense=dense, kv_row_bytes=kv_row_bytes)
        if n_anchor:
            out.append((n_anchor, ops))
        if count > n_anchor:  # IndexShare's shared layers: the same layer without the indexer
            out.append((count - n_anchor, [o for o in ops if o.name not in INDEXER_OPS]))
    out.append((1, step_head_ops(m, batch, layout)))
    return out


def weight_params(ops: list[Op]) -> float:
    """Weight elements the GEMMs of ``ops`` read (each touched group once)."""
    return float(sum(o.k * o.n * (o.weight_groups or o.groups) for o in ops
                     if o.kind in ("gemm", "batched_gemm", *GROUPED_KINDS)))

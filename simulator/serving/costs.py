"""The cost model: time of one decode step and of one prefill chunk on one attention rank.

All GPUs of an instance run each forward pass in lockstep, so a rank's step time is one GPU's time
for its share of every op. Per layer, in the order SGLang's DSA decode runs them (model_shapes.md
section 3), each op is its own roofline (``max(bytes / HBM rate, FLOPs / tensor rate)``, kernels run
one after another):

- attention GEMMs and the indexer projections, on the rank's own tokens, weights split over the
  rank's ``attn_tp`` GPUs (replicated on every GPU under DP attention with attn_tp 1);
- the indexer scoring each request's whole context (132 B keys per token, FP8);
- sparse MLA attention over top-k rows, heads split over attn_tp (a launch + roofline / efficiency,
  the terms ``hisparse calibrate`` fits);
- the MLP: dense layers and MoE (shared + routed experts) over the instance's tokens, weights spread
  over the instance (a 1/tp slice of each expert, or E/tp whole experts under EP); weight reads count
  only the experts the step's tokens touch;
- communication (``comm.py``): DP attention gathers the instance's tokens before the MLP and
  reduce-scatters after it; TP attention all-reduces after attention and after the MLP; EP
  dispatches and combines tokens all-to-all;
- HiSparse: one swap-in launch per layer (a fixed cost, bookkeeping per request, missed rows over
  the host link) and the newest token's backup to host, each less the share that overlaps compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .comm import Collective
from .specs import Attention, CostParams, DeploymentSpec, GpuSpec, ModelSpec, MoeLayout

ACT_BYTES = 2  # bf16 hidden states on the wire (SGLang communicates activations in the model dtype)


def dispatch_row_bytes(hidden: int) -> int:
    """EP dispatch row: FP8 values + an fp32 scale per 128 channels (DeepEP: FP8 dispatch, BF16 combine)."""
    return hidden + 4 * -(-hidden // 128)


def cuda_graph_batch(batch: int, max_bs: int = 512) -> int:
    """The captured CUDA-graph batch a decode batch is padded to (SGLang server_args
    ``_generate_cuda_graph_batch_sizes``: 1, 2, 4, 8, 12, then steps of 8 to 256, 16 to 496, 32 to
    ``cuda_graph_max_bs``, 512 for tp >= 4 on 90-160 GiB GPUs); beyond the largest, no padding."""
    if batch <= 0:
        return 0
    for size in _GRAPH_SIZES:
        if size >= batch:
            return size if size <= max_bs else batch
    return batch


_GRAPH_SIZES = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16), *range(512, 4097, 32))


@dataclass(frozen=True)
class StepTime:
    """Seconds per decode step (arrays over consecutive steps)."""

    compute_s: np.ndarray
    comm_s: np.ndarray
    swap_s: np.ndarray
    backup_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return self.compute_s + self.comm_s + self.swap_s + self.backup_s


class CostModel:
    def __init__(self, model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, params: CostParams) -> None:
        self.m, self.g, self.d, self.p = model, gpu, dep, params
        self._hbm = gpu.hbm_bw * params.hbm_efficiency
        self._fp8 = gpu.fp8_flops * params.matmul_efficiency
        self._bf16 = gpu.bf16_flops

    # -- helpers --------------------------------------------------------------------------------
    def _gemm(self, weight_bytes, flops, rate: float | None = None):
        return np.maximum(np.asarray(weight_bytes, dtype=float) / self._hbm,
                          np.asarray(flops, dtype=float) / (rate or self._fp8))

    def experts_touched(self, instance_tokens: float) -> float:
        """Share of routed experts at least one of the step's tokens uses (uniform routing)."""
        miss = 1.0 - self.m.experts_per_token / self.m.experts
        return 1.0 - miss ** max(float(instance_tokens), 0.0)

    def _rank_tokens(self, batch: float, instance_tokens: float) -> float:
        """Tokens one attention rank computes attention for: its own (DP) or the instance's (TP)."""
        return instance_tokens if self.d.attention == Attention.TP else batch

    # -- per-layer terms ------------------------------------------------------------------------
    def attention_gemms(self, tokens: float) -> float:
        """One layer's MLA and indexer projections for ``tokens`` on one GPU of the rank."""
        m, tp = self.m, self.d.attn_tp
        params = (m.attention_params + m.indexer_params) / tp
        return float(self._gemm(params * m.weight_bytes_per_param, 2 * tokens * params))

    def mlp(self, instance_tokens: float, dense: bool) -> float:
        """One layer's dense MLP or MoE block on one GPU: the instance's tokens, weights spread."""
        m, tp = self.m, self.d.tp
        if dense:
            p = m.dense_mlp_params / tp
            return float(self._gemm(p * m.weight_bytes_per_param, 2 * instance_tokens * p))
        shared = m.shared_experts * m.expert_params / tp
        routed_read = m.experts * m.expert_params / tp * self.experts_touched(instance_tokens)
        read = (shared + routed_read) * m.weight_bytes_per_param + m.router_params * 2  # router gate in bf16
        flops = 2 * instance_tokens * ((m.experts_per_token * m.expert_params / tp) + shared + m.router_params)
        return float(self._gemm(read, flops))

    def indexer(self, ctx_sum):
        """One layer's indexer scores over every context token of the rank's requests (FP8)."""
        m = self.m
        ctx_sum = np.asarray(ctx_sum, dtype=float)
        return self._gemm(ctx_sum * m.indexer_row_bytes, 2 * ctx_sum * m.indexer_heads * m.indexer_head_dim)

    def attention_roofline(self, batch: int, heads: int | None = None, k: int | None = None,
                           row_bytes: int | None = None) -> float:
        """Roofline time of one layer's sparse MLA attention: rows over HBM or FLOPs over the GEMM rate."""
        m = self.m
        heads = heads or max(1, m.attention_heads // self.d.attn_tp)
        k, row_bytes = k or m.top_k, row_bytes or m.kv_row_bytes
        att_bytes = batch * k * row_bytes
        att_flops = 2 * batch * heads * k * (m.kv_lora_rank + m.qk_rope_head_dim + m.kv_lora_rank)
        return max(att_bytes / self.g.hbm_bw, att_flops / self.g.bf16_flops)

    def attention(self, batch: int) -> float:
        """One layer's sparse attention for ``batch`` requests: a launch plus roofline / efficiency."""
        if batch == 0:
            return 0.0
        eff = self._pick_fp8(self.p.attention_efficiency_fp8, self.p.attention_efficiency)
        launch = self._pick_fp8(self.p.attention_launch_fp8_us, self.p.attention_launch_us)
        return launch * 1e-6 + self.attention_roofline(batch) / eff

    def _pick_fp8(self, fp8_value: float, value: float) -> float:
        """A calibrated FP8-row (656 B) figure where the model has such rows and one was fitted."""
        return fp8_value if self.m.kv_row_bytes < 1024 and fp8_value > 0 else value

    def comm_layer(self, batch: float, instance_tokens: float, padded: int | None = None) -> float:
        """One layer's collectives on the instance's GPUs (seconds). Under DP attention every rank
        gathers ``padded`` rows (its batch padded to the CUDA-graph size, the same on every rank:
        SGLang's MAX_LEN mode, ``layers/dp_attention.py``), so the message is dp x padded rows; under
        TP attention the all-reduces run on the padded batch of the one scheduler."""
        ic, d, hidden = self.g.interconnect, self.d, self.m.hidden_size
        msg = instance_tokens * hidden * ACT_BYTES
        if padded is not None:  # every scheduler of the instance contributes its padded batch
            msg = d.ranks_per_instance * padded * hidden * ACT_BYTES
        t = 0.0
        if d.attention == Attention.TP:
            t += ic.time_s(Collective.ALL_REDUCE, d.tp, msg)  # after o_proj (row-parallel)
        elif d.attn_tp > 1:
            t += ic.time_s(Collective.ALL_REDUCE, d.attn_tp, batch * hidden * ACT_BYTES)
        if d.moe == MoeLayout.EP:
            # one rank's send buffer: its tokens, once per destination rank holding one of its experts
            copies = instance_tokens / d.tp * min(self.m.experts_per_token, d.tp)
            t += ic.time_s(Collective.ALL_TO_ALL, d.tp, copies * dispatch_row_bytes(hidden))
            t += ic.time_s(Collective.ALL_TO_ALL, d.tp, copies * hidden * ACT_BYTES)
        elif d.attention == Attention.DP and d.dp > 1:
            t += ic.time_s(Collective.ALL_GATHER, d.tp, msg)  # every rank's tokens into the MLP
            t += ic.time_s(Collective.REDUCE_SCATTER, d.tp, msg)  # MLP partial sums back to their ranks
        else:
            t += ic.time_s(Collective.ALL_REDUCE, d.tp, msg)  # after the row-parallel MLP
        return t

    def lm_head(self, instance_tokens: float) -> float:
        """Final projection once per step, vocab split over the instance (bf16 weights)."""
        m = self.m
        p = m.embedding_params / self.d.tp
        return float(self._gemm(p * m.embedding_bytes_per_param, 2 * instance_tokens * p, self._bf16))

    # -- a decode step ----------------------------------------------------------------------------
    def decode_compute(self, batch: int, instance_tokens: float, ctx_sum):
        """Compute time of decode steps; ``ctx_sum`` (the rank's context tokens) may be an array."""
        m = self.m
        tokens = self._rank_tokens(batch, instance_tokens)
        per_layer = self.attention_gemms(tokens) + self.attention(tokens) + self.p.per_layer_overhead_us * 1e-6
        dense = self.mlp(instance_tokens, dense=True)
        moe = self.mlp(instance_tokens, dense=False)
        fixed = m.layers * per_layer + m.dense_layers * dense + m.moe_layers * moe + self.lm_head(instance_tokens)
        return (fixed + m.layers * self.indexer(ctx_sum)) * (batch > 0)

    def comm(self, batch: int, instance_tokens: float) -> float:
        """A decode step's collectives (CUDA-graph replay: the batch padded to a captured size)."""
        if batch <= 0:
            return 0.0
        return self.m.layers * self.comm_layer(batch, instance_tokens, cuda_graph_batch(batch))

    def swap_in_layer(self, missed_rows, batch: int = 0):
        """One layer's swap-in launch: a fixed cost, bookkeeping per request, and the missed rows
        over the host link."""
        copy = np.asarray(missed_rows, dtype=float) * self.m.kv_row_bytes / self.g.swap_bw(self.m.kv_row_bytes)
        launch = self._pick_fp8(self.p.swap_in_launch_fp8_us, self.p.swap_in_launch_us)
        per_request = self._pick_fp8(self.p.swap_in_per_request_fp8_us, self.p.swap_in_per_request_us)
        return (launch + batch * per_request) * 1e-6 + copy

    def swap_in(self, missed_rows, batch: int = 0):
        """One launch per layer for the rank's batch, plus the missed rows over the host link."""
        per_layer = self.swap_in_layer(np.asarray(missed_rows, dtype=float) / self.m.layers, batch)
        return per_layer * self.m.layers * (1 - self.p.swap_in_overlap)

    def backup(self, batch: int) -> float:
        return batch * self.m.layers * self.m.kv_row_bytes / self.g.link_bw * (1 - self.p.backup_overlap)

    def decode_steps(self, batch: int, instance_tokens: float, ctx_sum, missed_rows=None) -> StepTime:
        """Time of decode steps (arrays in, arrays out); ``missed_rows`` None: baseline, no host tier."""
        compute = np.asarray(self.decode_compute(batch, instance_tokens, ctx_sum), dtype=float)
        zeros = np.zeros_like(compute)
        comm = np.full_like(compute, self.comm(batch, instance_tokens))
        if missed_rows is None or batch == 0:
            return StepTime(compute, comm, zeros, zeros)
        swap = np.broadcast_to(np.asarray(self.swap_in(missed_rows, batch), dtype=float), compute.shape)
        return StepTime(compute, comm, swap, np.full_like(compute, self.backup(batch)))

    # -- a prefill chunk --------------------------------------------------------------------------
    def prefill_chunk(self, tokens: int, prior_ctx: int, hisparse: bool, instance_tokens: float | None = None) -> float:
        """One chunk of a prompt on its rank: projections, sparse attention over up to k earlier
        tokens per query (MHA form), the indexer over the context so far (quadratic), the MLP over
        the instance's prefill tokens (every rank prefills alike), the collectives; HiSparse also
        copies the chunk's KV to host (``backup_overlap`` of it hidden)."""
        m, p = self.m, self.p
        inst = float(tokens if instance_tokens is None else instance_tokens)
        rank_tokens = self._rank_tokens(tokens, inst)
        rate = self._fp8 * p.prefill_efficiency
        heads = m.attention_heads / self.d.attn_tp
        proj_params = (m.attention_params + m.indexer_params) / self.d.attn_tp
        proj = float(self._gemm(proj_params * m.weight_bytes_per_param, 2 * rank_tokens * proj_params, rate))
        k = min(m.top_k, prior_ctx + tokens)
        head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
        att = 2 * rank_tokens * heads * k * head_dim / (self._bf16 * p.prefill_attention_efficiency)
        idx = 2 * rank_tokens * (prior_ctx + tokens / 2) * m.indexer_heads * m.indexer_head_dim / rate
        tp = self.d.tp
        moe_p = (m.experts_per_token + m.shared_experts) * m.expert_params / tp
        moe_read = (m.experts + m.shared_experts) * m.expert_params / tp * m.weight_bytes_per_param
        moe = float(self._gemm(moe_read, 2 * inst * moe_p, rate))
        dense = float(self._gemm(m.dense_mlp_params / tp * m.weight_bytes_per_param,
                                 2 * inst * m.dense_mlp_params / tp, rate))
        t = (m.layers * (proj + att + idx + p.per_layer_overhead_us * 1e-6 + self.comm_layer(tokens, inst))
             + m.dense_layers * dense + m.moe_layers * moe)
        if hisparse:
            t += tokens * m.kv_bytes_per_token() / self.g.link_bw * (1 - p.backup_overlap)
        return t

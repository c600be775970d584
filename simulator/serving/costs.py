"""The cost model: time of one decode step and of one prefill chunk on one GPU (DP rank).

Named parameters come from a calibration file (``CostParams``); the shipped defaults are derived
from the brief's numbers and marked uncalibrated.

Decode step = max(weight reads, MoE matmuls) + indexer over each request's whole context +
sparse attention over k rows + per-layer overheads, and for HiSparse the swap-in (one launch per
layer with a fixed cost, plus missed rows over the host link) and the newest token's backup to
host, each less the share that overlaps compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .presets import CostParams, DeploymentSpec, GpuSpec, ModelSpec

MLA_QK_DIM = 576
MLA_V_DIM = 512


@dataclass(frozen=True)
class StepTime:
    """Seconds per decode step (floats, or arrays over consecutive steps)."""

    compute_s: np.ndarray
    swap_s: np.ndarray
    backup_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return self.compute_s + self.swap_s + self.backup_s


class CostModel:
    def __init__(self, model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, params: CostParams) -> None:
        self.m, self.g, self.d, self.p = model, gpu, dep, params
        self._hbm = gpu.hbm_bw * params.hbm_efficiency
        self._flops = gpu.bf16_flops * params.matmul_efficiency

    def experts_touched(self, node_tokens: float) -> float:
        """Share of routed experts at least one of the step's tokens uses (uniform routing)."""
        miss = 1.0 - self.m.experts_per_token / self.m.experts
        return 1.0 - miss ** max(node_tokens, 0.0)

    def decode_compute(self, batch: int, node_tokens: float, ctx_sum):
        """Compute time of decode steps; ``ctx_sum`` may be an array (one entry per step)."""
        m, p = self.m, self.p
        w = m.weight_bytes / self.d.tp
        weight_bytes = w * (1 - m.expert_share) + w * m.expert_share * self.experts_touched(node_tokens)
        weights = weight_bytes / self._hbm
        matmul = 2 * m.active_params * node_tokens / self.d.tp / self._flops
        ctx_sum = np.asarray(ctx_sum, dtype=float)
        idx_bytes = ctx_sum * m.indexer_row_bytes * m.layers
        idx_flops = 2 * ctx_sum * m.indexer_heads * m.indexer_head_dim * m.layers
        indexer = np.maximum(idx_bytes / self._hbm, idx_flops / (2 * self._flops))  # fp8 scoring
        attention = self.attention(batch) * m.layers
        overhead = m.layers * p.per_layer_overhead_us * 1e-6
        return (max(weights, matmul) + indexer + attention + overhead) * (batch > 0)

    def attention_roofline(self, batch: int, heads: int | None = None, k: int | None = None,
                           row_bytes: int | None = None) -> float:
        """Roofline time of one layer's sparse MLA attention: rows over HBM or FLOPs over the GEMM rate."""
        m = self.m
        heads, k, row_bytes = heads or m.attention_heads, k or m.top_k, row_bytes or m.kv_row_bytes
        att_bytes = batch * k * row_bytes
        att_flops = 2 * batch * heads * k * (MLA_QK_DIM + MLA_V_DIM)
        return max(att_bytes / self.g.hbm_bw, att_flops / self.g.bf16_flops)

    def attention(self, batch: int) -> float:
        """One layer's sparse attention for ``batch`` requests: a launch plus roofline / efficiency."""
        if batch == 0:
            return 0.0
        eff = self._fp8(self.p.attention_efficiency_fp8, self.p.attention_efficiency)
        launch = self._fp8(self.p.attention_launch_fp8_us, self.p.attention_launch_us)
        return launch * 1e-6 + self.attention_roofline(batch) / eff

    def _fp8(self, fp8_value: float, value: float) -> float:
        """A calibrated FP8-row (656 B) figure where the model has such rows and one was fitted."""
        return fp8_value if self.m.kv_row_bytes < 1024 and fp8_value > 0 else value

    def swap_in_layer(self, missed_rows, batch: int = 0):
        """One layer's swap-in launch: a fixed cost, bookkeeping per request, and the missed rows
        over the host link."""
        copy = np.asarray(missed_rows, dtype=float) * self.m.kv_row_bytes / self.g.swap_bw(self.m.kv_row_bytes)
        launch = self._fp8(self.p.swap_in_launch_fp8_us, self.p.swap_in_launch_us)
        per_request = self._fp8(self.p.swap_in_per_request_fp8_us, self.p.swap_in_per_request_us)
        return (launch + batch * per_request) * 1e-6 + copy

    def swap_in(self, missed_rows, batch: int = 0):
        """One launch per layer for the whole batch, plus the missed rows over the host link."""
        per_layer = self.swap_in_layer(np.asarray(missed_rows, dtype=float) / self.m.layers, batch)
        return per_layer * self.m.layers * (1 - self.p.swap_in_overlap)

    def backup(self, batch: int) -> float:
        return batch * self.m.layers * self.m.kv_row_bytes / self.g.link_bw * (1 - self.p.backup_overlap)

    def decode_steps(self, batch: int, node_tokens: float, ctx_sum, missed_rows=None) -> StepTime:
        """Time of decode steps (arrays in, arrays out); ``missed_rows`` None: baseline, no host tier."""
        compute = self.decode_compute(batch, node_tokens, ctx_sum)
        if missed_rows is None or batch == 0:
            return StepTime(compute, compute * 0.0, compute * 0.0)
        return StepTime(compute, self.swap_in(missed_rows, batch), self.backup(batch) + compute * 0.0)

    def prefill_chunk(self, tokens: int, prior_ctx: int, hisparse: bool) -> float:
        """One chunk of a prompt: MoE matmuls (fp8: twice the bf16 rate), the indexer over the
        context so far (quadratic), sparse attention over k; HiSparse also copies the chunk's KV
        to host."""
        m = self.m
        rate = 2 * self.g.bf16_flops * self.p.prefill_efficiency
        moe = 2 * m.active_params * tokens / rate
        idx = 2 * tokens * (prior_ctx + tokens / 2) * m.indexer_heads * m.indexer_head_dim * m.layers / rate
        k = min(m.top_k, prior_ctx + tokens)
        att = 2 * tokens * m.attention_heads * k * (MLA_QK_DIM + MLA_V_DIM) * m.layers / (self.g.bf16_flops * self.p.prefill_efficiency)
        t = moe + idx + att + m.layers * self.p.per_layer_overhead_us * 1e-6
        if hisparse:
            t += tokens * m.kv_bytes_per_token() / self.g.link_bw * (1 - self.p.backup_overlap * 0.5)
        return t

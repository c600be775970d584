"""A prompt chunk's two context-growing kernels, priced from their measurement on the H200: FlashMLA's SM90
sparse prefill (``CostModel.prefill_attention``) and DeepGEMM's ``fp8_mqa_logits``, the indexer's scoring
(``CostModel.prefill_indexer``).

**What SGLang runs** for a chunk of a DSA model's prompt (BF16 KV on Hopper): ``flash_mla_sparse_fwd``
(``--dsa-prefill-backend flashmla_sparse``; with FP8 KV on the prefix dequantised to BF16) over each query's
top-k rows of 576 bf16, and, in every indexer layer, ``deep_gemm.fp8_mqa_logits`` writing the fp32 scores of
each query against its causal keys (``dsa_indexer.py`` ``Indexer._get_topk_ragged``, ``clean_logits=False``).

**The measurement** (BENCHMARKS.md, "SGLang's prompt-chunk kernels at the model's shapes"; CSVs
``benchmarks/results/flashmla_prefill-h200.csv`` and ``deepgemm_mqa_logits-h200.csv``; three device calls
of ``benchmarks/prefill_session.sh`` and its benchmarks, 2026-12-07, one NVIDIA H200, 132 SMs, 1,980 MHz,
driver 580.159): FlashMLA 9241ae3 (``run_fwd_phase1_kernel<576, false>``, our binding) and sgl-deep-gemm
0.1.3 with apache-tvm-ffi 0.1.9 (SGLang 0.5.14's pins). One launch per shape, CUDA-graph replay medians,
the KV rotated over copies so that no call's rows are in L2 for the next; each output checked against a
float32 reference. A chunk of 1,024 or 4,096 query tokens ends at the context ``ctx`` (positions
ctx - chunk .. ctx - 1), top-k 2,048. FlashMLA's top-k is the fitted DSA generator's (``trace``: adjacent
queries share part of their rows, as consecutive decode steps do); the same shapes with top-k drawn
uniformly (no shared rows: L2's worst case) are in the CSV and not used: within 3% up to 32K, 11-23% slower
from 64K (the KV past the 60 MB L2), 23% at 64 heads and 160K.

**How a chunk is priced** (per layer, on the H200):
- FlashMLA: one CTA per (query, 64-head tile), one CTA per SM (``phase1.cuh``: grid (h_q / 64) x s_q,
  ``__launch_bounds__(.., 1, 1)``), so a launch is ceil(tokens x tiles / 132) waves of one CTA's time. The
  CTA time is the measured launch over its waves, per tile count (1: 64 heads; 2: 128, whose two tiles of a
  query share rows in L2; more tiles: the 2-tile table) and chunk size, linear in log2(ctx) between measured
  contexts (the ends held beyond them) and in log2(tokens) between the 1,024- and 4,096-token tables
  (held outside). Exact at every measured point. A query of fewer rows (the dense path's mean position,
  DeepSeek-V4's per-kind rows) costs its share of a full top-k row set (``flop_rate`` for DeepSeek-V4).
- DeepGEMM: FLOPs (2 x heads x 128 per causal pair) over the measured FLOP rate at (heads, tokens, ctx),
  linear in heads between 32 and 64 (held outside), in log2(ctx) and log2(tokens) as above. The rate
  includes the kernel's fp32 logits write and its launch.
**On another GPU** (DERIVED): the H200's time x the H200's datasheet dense BF16 rate over this GPU's (FP8
is twice BF16 on every shipped GPU, so the FP8 kernel scales alike): both kernels run at 50-67% of the
tensor rate at these shapes (FlashMLA 560-660 of 989 TFLOP/s BF16; DeepGEMM 650-1,050 of 1,979 FP8), so the
tensor rate bounds them, not HBM. Cross-check: FlashMLA's README gives its sparse prefill "up to 640 TFlops"
on an H800 and "up to 1450" on a B200, 2.27x, where the datasheet ratio is 2.25 / 0.989 = 2.28x. SM
counts and waves are the H200's (an H20's 78 SMs: not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..serving.specs import GpuSpec
from .pricing import REFERENCE_GPU, flops_ratio, reference_gpu

REF_SMS = 132  # its multiprocessors: FlashMLA's waves are counted on them
HEAD_TILE = 64  # FlashMLA's B_H on SM90: a CTA computes 64 heads of one query
MLA_ROW_FLOPS = 2 * (576 + 512)  # per head per top-k row: QK over 576 dims, PV over 512
INDEXER_HEAD_DIM = 128  # DeepGEMM's fp8_mqa_logits head dim (every shipped DSA model's index_head_dim)

# launch medians, us, FlashMLA trace top-k; key (64-head tiles, chunk) -> ((ctx, us), ...); duplicates of a
# shape across device calls averaged (chunk 1,024 at 8,192: 520.7 / 520.7 at 1 tile, 1,029.3 / 1,019.5 at 2)
FLASHMLA_US: dict[tuple[int, int], tuple[tuple[int, float], ...]] = {
    (1, 1024): ((2048, 488.1), (4096, 515.8), (8192, 520.7)),
    (2, 1024): ((2048, 972.0), (4096, 1025.1), (8192, 1024.4)),
    (1, 4096): ((4096, 1950.9), (8192, 2036.4), (16384, 2065.1), (32768, 2064.1), (65536, 1998.9),
                (131072, 2056.0), (163840, 1915.0)),
    (2, 4096): ((4096, 3810.9), (8192, 3981.9), (16384, 3978.1), (32768, 4017.1), (65536, 4019.6),
                (131072, 3541.1), (163840, 3611.0)),
}
# launch medians, us, DeepGEMM fp8_mqa_logits; key (indexer heads, chunk) -> ((ctx, us), ...) (duplicates
# averaged: chunk 1,024 at 8,192: 69.0 / 69.9 at 32 heads, 122.7 / 122.3 at 64)
MQA_LOGITS_US: dict[tuple[int, int], tuple[tuple[int, float], ...]] = {
    (32, 1024): ((2048, 19.7), (4096, 38.0), (8192, 69.45)),
    (64, 1024): ((2048, 28.3), (4096, 59.4), (8192, 122.5)),
    (32, 4096): ((4096, 80.8), (8192, 235.2), (16384, 551.2), (32768, 1182.7), (65536, 2488.8),
                 (131072, 4993.0), (163840, 6210.7)),
    (64, 4096): ((4096, 137.5), (8192, 434.2), (16384, 995.1), (32768, 2115.4), (65536, 4394.3),
                 (131072, 8921.4), (163840, 11155.0)),
}


def causal_pairs(tokens, prior_ctx):
    """(query, key) pairs a chunk of ``tokens`` queries after ``prior_ctx`` tokens scores: position p sees
    p + 1 keys (``benchmarks/deepgemm_mqa_logits.py``)."""
    t = np.asarray(tokens, dtype=float)
    return t * (np.asarray(prior_ctx, dtype=float) + 1) + t * (t - 1) / 2


def _log_interp(x, points: tuple[tuple[int, float], ...]):
    """Linear in log2(x) between the points, the end values held beyond them."""
    xs = np.log2([p for p, _ in points])
    ys = np.array([v for _, v in points], dtype=float)
    return np.interp(np.log2(np.maximum(np.asarray(x, dtype=float), 1.0)), xs, ys)


def _across_chunks(tokens, ctx, table: dict[int, tuple[tuple[int, float], ...]]):
    """A per-chunk-size table at (tokens, ctx): each chunk size's value at ctx, then linear in log2(tokens)
    between the chunk sizes (held outside)."""
    chunks = sorted(table)
    at = [_log_interp(ctx, table[c]) for c in chunks]
    if len(chunks) == 1:
        return at[0]
    w = np.clip((np.log2(np.maximum(np.asarray(tokens, dtype=float), 1.0)) - math.log2(chunks[0]))
                / (math.log2(chunks[-1]) - math.log2(chunks[0])), 0.0, 1.0)
    return (1 - w) * at[0] + w * at[-1]


def gpu_ratio(gpu: GpuSpec) -> float:
    """Time on ``gpu`` over time on the H200: the H200's datasheet dense BF16 rate over ``gpu``'s (the ratio
    ``pricing`` scales every FLOP-rate term by)."""
    return 1.0 if gpu.name == REFERENCE_GPU else 1.0 / flops_ratio(reference_gpu(), gpu)


@dataclass(frozen=True)
class FlashMLASparsePrefill:
    """FlashMLA's SM90 sparse prefill per layer, from the H200 measurement (module docstring)."""

    topk: int = 2048
    launch_us: dict[tuple[int, int], tuple[tuple[int, float], ...]] = field(default_factory=lambda: FLASHMLA_US)
    source: str = ("FlashMLA 9241ae3 flash_mla_sparse_fwd (SM90, 576-dim bf16 rows, top-k 2,048) timed on one H200 "
                   "(benchmarks/flashmla_prefill.py; benchmarks/results/flashmla_prefill-h200.csv, 2026-12-07): "
                   "chunks of 1,024 / 4,096 tokens ending at 2K-160K, 64 / 128 heads, the fitted DSA top-k")

    @staticmethod
    def waves(tokens, tiles: int):
        """Waves of one CTA per (query, head tile) over the measured GPU's SMs."""
        return np.ceil(np.asarray(tokens, dtype=float) * tiles / REF_SMS - 1e-9)

    @cached_property
    def _cta_tables(self) -> dict[int, dict[int, tuple[tuple[int, float], ...]]]:
        """tiles -> chunk -> ((ctx, one CTA's us), ...): each launch over its waves."""
        out: dict[int, dict[int, tuple[tuple[int, float], ...]]] = {}
        for (t, c), pts in self.launch_us.items():
            out.setdefault(t, {})[c] = tuple((x, us / float(self.waves(c, t))) for x, us in pts)
        return out

    def cta_us(self, tokens, ctx, tiles: int):
        """One CTA's time (a query's 64 heads over a full top-k) at this chunk size and context; more than
        two tiles take the 2-tile table."""
        tables = self._cta_tables
        return _across_chunks(tokens, ctx, tables[min(max(tiles, 1), max(tables))])

    def measured_us(self, tokens, ctx, heads: int, rows=None):
        """Microseconds per layer on the H200: ``tokens`` queries of ``heads`` heads (a multiple of 64, as
        SGLang pads them) ending at ``ctx``, each over ``rows`` rows (default the measured top-k; the kernel's
        time goes with its top-k / 64 blocks, so another row count costs its share)."""
        tiles = max(1, math.ceil(heads / HEAD_TILE))
        share = 1.0 if rows is None else np.asarray(rows, dtype=float) / self.topk
        return self.waves(tokens, tiles) * self.cta_us(tokens, ctx, tiles) * share

    def time(self, gpu: GpuSpec, tokens, ctx, heads: int, rows=None):
        """Seconds per layer on ``gpu``: the H200's time x ``gpu_ratio``."""
        if np.all(np.asarray(tokens) <= 0):
            return 0.0
        out = self.measured_us(tokens, ctx, heads, rows) * 1e-6 * gpu_ratio(gpu)
        return float(out) if np.ndim(out) == 0 else out

    def flop_rate(self, gpu: GpuSpec, tokens, ctx, heads: int) -> float:
        """FLOP/s the kernel reaches at this shape on ``gpu`` (every top-k slot of 576 + 512 dims counted):
        DeepSeek-V4's layers divide their own FLOPs by it."""
        tiles = max(1, math.ceil(heads / HEAD_TILE))
        flops = float(tokens) * tiles * HEAD_TILE * self.topk * MLA_ROW_FLOPS
        return flops / (float(self.measured_us(tokens, ctx, heads)) * 1e-6 * gpu_ratio(gpu))

    def how(self, gpu: GpuSpec) -> tuple[bool, str]:
        """(measured on this GPU, how prompt chunks' attention is priced on it)."""
        base = (f"prompt chunks: {self.source}; ceil(tokens x 64-head tiles / 132) waves of a CTA time per context, "
                "log-linear between measured contexts and chunk sizes")
        if gpu.name == REFERENCE_GPU:
            return True, base
        return False, f"{base}; on {gpu.name}: x {gpu_ratio(gpu):.3f}, the datasheet dense BF16 rate ratio H200 / {gpu.name}"


@dataclass(frozen=True)
class MqaLogits:
    """DeepGEMM's ``fp8_mqa_logits`` per indexer layer, from the H200 measurement (module docstring)."""

    launch_us: dict[tuple[int, int], tuple[tuple[int, float], ...]] = field(default_factory=lambda: MQA_LOGITS_US)
    source: str = ("DeepGEMM fp8_mqa_logits (sgl-deep-gemm 0.1.3, SGLang 0.5.14's pin) timed on one H200 "
                   "(benchmarks/deepgemm_mqa_logits.py; benchmarks/results/deepgemm_mqa_logits-h200.csv, 2026-12-07): "
                   "chunks of 1,024 / 4,096 tokens ending at 2K-160K, 32 / 64 indexer heads")

    @staticmethod
    def flops(tokens, prior_ctx, heads: int, head_dim: int = INDEXER_HEAD_DIM):
        return 2.0 * heads * head_dim * causal_pairs(tokens, prior_ctx)

    @cached_property
    def _rate_tables(self) -> dict[int, dict[int, tuple[tuple[int, float], ...]]]:
        """heads -> chunk -> ((ctx, FLOP/s), ...)."""
        out: dict[int, dict[int, tuple[tuple[int, float], ...]]] = {}
        for (h, c), pts in self.launch_us.items():
            out.setdefault(h, {})[c] = tuple((x, float(self.flops(c, x - c, h)) / (us * 1e-6)) for x, us in pts)
        return out

    def rate(self, tokens, ctx, heads: int):
        """Measured FLOP/s at this chunk size and context, linear in heads between the measured ones."""
        by_heads = self._rate_tables
        hs = sorted(by_heads)
        at = {h: _across_chunks(tokens, ctx, by_heads[h]) for h in hs}
        if heads <= hs[0]:
            return at[hs[0]]
        if heads >= hs[-1]:
            return at[hs[-1]]
        hi = next(h for h in hs if h >= heads)
        lo = max(h for h in hs if h < heads)
        w = (heads - lo) / (hi - lo)
        return (1 - w) * at[lo] + w * at[hi]

    def time(self, gpu: GpuSpec, tokens, prior_ctx, heads: int, head_dim: int = INDEXER_HEAD_DIM):
        """Seconds per indexer layer on ``gpu`` for a chunk of ``tokens`` after ``prior_ctx`` tokens."""
        if np.all(np.asarray(tokens) <= 0):
            return 0.0
        ctx = np.asarray(prior_ctx, dtype=float) + np.asarray(tokens, dtype=float)
        out = self.flops(tokens, prior_ctx, heads, head_dim) / self.rate(tokens, ctx, heads) * gpu_ratio(gpu)
        return float(out) if np.ndim(out) == 0 else out

    def how(self, gpu: GpuSpec) -> tuple[bool, str]:
        base = (f"prompt chunks' scoring: {self.source}; FLOPs over the measured rate, log-linear between measured "
                "contexts and chunk sizes, linear in heads")
        if gpu.name == REFERENCE_GPU:
            return True, base
        return False, f"{base}; on {gpu.name}: x {gpu_ratio(gpu):.3f}, the datasheet dense tensor rate ratio H200 / {gpu.name}"


FLASHMLA_SPARSE_PREFILL = FlashMLASparsePrefill()
MQA_LOGITS = MqaLogits()

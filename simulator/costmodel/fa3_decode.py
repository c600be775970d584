"""FlashAttention-3's sparse MLA decode, the attention of SGLang's decode, verify and draft passes with a
BF16 KV cache on Hopper (``CostModel.fa3_decode``), priced from a measurement of FA3 itself.

**What SGLang runs** (sgl-project/sglang ``nsa_backend._forward_fa3``): ``flash_attn_with_kvcache`` with
q = q_rope [tokens, heads, 64], qv = q_nope [tokens, heads, 512], K / V = the rope and latent parts of the
BF16 pool as a page-size-1 paged cache, page table = each query token's top-k rows, cache_seqlens =
min(top-k, context), one query per varlen "sequence" (a verify's positions are separate sequences),
``num_splits`` 0 (FA3's heuristic). Three kernels per layer: FA3's prepare-scheduler, the forward
kernel (one 64-row M tile of PackGQA rows per token: 8 of 64 rows used at TP8's 8 heads, all 64 under
DP attention), and the split-KV combine.

**The measurement** (``benchmarks/fa3_sparse_decode.py``, BENCHMARKS.md "FlashAttention-3's sparse MLA
decode at SGLang's shapes"; CSV ``benchmarks/results/fa3_sparse_decode-h100.csv``): Dao-AILab/flash-attention
0251105a (hopper/, its own interface and host API, our instantiation units for the one kernel the call
reaches), CUTLASS 7127592, nvcc 13.0, torch 2.11; one NVIDIA H100 80GB HBM3 (SXM, 132 SMs), 2026-12-06.
The figures below are the CUDA-graph replay medians per call (the three kernels, as SGLang's captured
decode runs them), top-k 2,048 rows, each request's rows drawn from its own 8,192-row context, no row of
a call in L2 from the one before. ``ROWS_US``: the random-row case per head count (TP8's 8 heads: the
verify rows of requests of 6 positions, whose random picks share 25% of rows by chance in an 8K context;
64 heads: one row per request, except 32 / 64 / 128 rows as requests of 2). ``VERIFY_US``: the same verify
shapes with adjacent positions sharing 70% of their top-k, the mean adjacent-step overlap of the
``glm51-longbench`` trace (``traces/README.md``, fitted to published DSA statistics): L2 hits between a
request's positions. Not measured: 8 heads at one position per request (a TP8 decode without speculative
decoding, or a draft decode step, whose rows share none): the 8-head table prices it, a few percent fast where
its verify rows re-read rows from L2.

**How a pass is priced** (``Fa3SparseDecode.time``), per layer:
- rows: the pass's query tokens (requests x verify positions) x min(top-k, context) / 2,048 (a row of a
  short context reads fewer KV rows: counted as that fraction of a row; below one row the one-row time,
  the kernels' floor);
- between measured row counts: FA3's own wave arithmetic, fitted per head count and pinned to the
  measured points. FA3's dynamic split (``flash_prepare_scheduler.cu``: blocks per SM = ceil(total K blocks
  x 1.1 / SMs), splits = min(ceil(32 / that), 28), each split ceil(32 / splits) K blocks of 64 rows; the
  persistent forward kernel runs the rows x splits tiles on 132 CTAs) makes the time step-wise in rows:
  ``fa3_block_waves`` gives the K blocks the busiest CTA runs (48 rows: 3 splits, 144 tiles, two waves of
  11 blocks = 22; 64 rows: 2 splits, 128 tiles, one wave of 16). Per head count t = a + b x blocks + c x rows
  (least squares over the measured points: 8 heads 13.4 + 1.81 x blocks + 0.20 x rows us, 64 heads
  20.8 + 2.87 x blocks + 0.18 x rows), plus the fit's residual at the measured points interpolated linearly
  in rows: exact at every measured point, FA3's steps between them (40-44 rows at 64 heads: 3 splits, 120-132
  tiles, one wave of 11 blocks, 61-62 us; linear interpolation between the 32- and 48-row points would give
  74-84). Beyond the largest point, the fit plus its residual there;
- heads between 8 and 64: linear in heads between the two tables (the forward kernel's MMA tile is the
  same 64 rows; what differs is q, output and the split partials the combine reads); above 64 heads,
  ceil(heads / 64) M tiles per token: the 64-head table at that many times the rows; below 8, the
  8-head table;
- a verify pass (positions > 1 per request): the floor plus the measured part above it times
  ``verify_factor`` (sum over the measured verify shapes of (overlap-0.7 time - floor) over (random time -
  floor): 0.93).
**On another GPU** (DERIVED): the measured time at each shape x the SM boost clock ratio, H100 / this GPU
(1.0 for the H200 and GH200: the same 132 SMs at 1,980 MHz), and at least the floor plus the padded MMA
FLOPs over this GPU's dense BF16 rate (2 x 64 ceil(heads / 64) rows per token x k x (64 + 512 + 512)).
Not by the HBM ratio: at no measured shape does the forward kernel read its distinct rows faster than
2.3 TB/s (128 rows x 64 heads; 1.5 TB/s at the low-latency c16 verify, 96 x 8), 69% / 46% of the H100's
3.35 TB/s with every SM busy: the page-size-1 gather (a cp.async of 16 B per thread per row, the page
index looked up per row) bounds it, not HBM, so the H200's 4.8 TB/s is not taken to shorten it (an
assumption, the likelier of two: scaling the part above the floor by 3.35 / 4.8 instead moves the
validation as docs/validation.md's fa3time section gives). SM counts
other than 132 (the H20's 78) change FA3's splits and waves: not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..serving.specs import GpuSpec

H100_SM_BOOST_MHZ = 1980.0  # simulator/presets/gpus/h100.toml sm_boost_mhz (vendor FP32 rate / 2 x cores)
HOPPER_SMS = 132  # H100 / H200 SXM (the measured GPU's multiprocessor count)
K_BLOCKS = 32  # top-k 2,048 rows / FA3's kBlockN 64 (hopper/tile_size.h, hdim 64 / hdim_v 512)
MAX_SPLITS = 28  # FA3's get_num_splits upper bound at 32 K blocks, one M block, 132 SMs (num_splits_heuristic)


def fa3_block_waves(rows, sms: int = HOPPER_SMS, k_blocks: int = K_BLOCKS, max_splits: int = MAX_SPLITS):
    """K blocks the busiest CTA of FA3's persistent forward kernel runs for ``rows`` one-query sequences of
    ``k_blocks`` K blocks each (one M block per sequence): ``prepare_varlen_num_blocks``' dynamic split
    (blocks per SM = ceil(rows x k_blocks x 1.1 / SMs), splits = min(ceil(k_blocks / that), max_splits),
    ceil(k_blocks / splits) blocks per split) over ceil(rows x splits / SMs) waves of tiles."""
    r = np.asarray(rows, dtype=float)
    per_sm = np.maximum(np.ceil(r * k_blocks * 1.1 / sms - 1e-9), 1.0)
    splits = np.clip(np.ceil(k_blocks / per_sm - 1e-9), 1, max_splits)
    blocks = np.ceil(k_blocks / splits - 1e-9)
    return np.ceil(r * splits / sms - 1e-9) * blocks


@dataclass(frozen=True)
class Fa3SparseDecode:
    """FA3's sparse MLA decode per layer, from the H100 measurement (module docstring)."""

    ref_gpu: str = "h100"
    ref_sm_boost_mhz: float = H100_SM_BOOST_MHZ
    topk: int = 2048  # the measured rows per query token
    tile_rows: int = 64  # FA3's kBlockM for hdim 64 / hdim_v 512 (hopper/tile_size.h): heads per M tile
    # (rows, us per call), CUDA-graph medians, random rows (benchmarks/results/fa3_sparse_decode-h100.csv)
    rows_us: dict[int, tuple[tuple[int, float], ...]] = field(default_factory=lambda: {
        8: ((1, 17.78), (6, 20.26), (12, 22.88), (24, 30.27), (48, 62.69), (96, 87.62), (192, 169.80)),
        64: ((1, 19.99), (4, 25.00), (8, 29.17), (12, 33.35), (16, 37.97), (24, 48.46), (32, 54.73), (48, 93.70),
             (64, 85.30), (128, 129.27)),
    })
    # the verify shapes with adjacent positions sharing 70% of their top-k (same CSV, overlap 0.7)
    verify_us: dict[int, tuple[tuple[int, float], ...]] = field(default_factory=lambda: {
        8: ((6, 19.75), (12, 22.75), (24, 29.34), (48, 57.69), (96, 83.18), (192, 156.19)),
        64: ((32, 51.63), (64, 80.70), (128, 125.45)),
    })
    verify_overlap: float = 0.70  # the glm51-longbench trace's mean adjacent-step overlap (traces/README.md)
    source: str = ("FlashAttention-3 (Dao-AILab/flash-attention 0251105a, hopper/) flash_attn_with_kvcache as SGLang's "
                   "_forward_fa3 calls it, timed on one H100 80GB HBM3 (benchmarks/fa3_sparse_decode.py, CUDA-graph "
                   "medians, top-k 2,048; BENCHMARKS.md, 2026-12-06)")

    def floor_us(self, heads: int) -> float:
        """The one-row time at the nearest measured head count (8 or 64) or between them."""
        return float(self._at_heads(heads, 1.0))

    @property
    def verify_factor(self) -> float:
        """sum (verify time - floor) / sum (random time - floor) over the measured verify shapes."""
        num = den = 0.0
        for heads, points in self.verify_us.items():
            base = dict(self.rows_us[heads])
            floor = base[1]
            for rows, us in points:
                num += us - floor
                den += base[rows] - floor
        return num / den

    def _fit(self, heads: int) -> np.ndarray:
        """(a, b, c) of t = a + b x fa3_block_waves(rows) + c x rows, least squares over the head count's points."""
        rows = np.array([r for r, _ in self.rows_us[heads]], dtype=float)
        us = np.array([t for _, t in self.rows_us[heads]], dtype=float)
        a = np.stack([np.ones_like(rows), fa3_block_waves(rows), rows], axis=1)
        return np.linalg.lstsq(a, us, rcond=None)[0]

    def _table(self, heads: int, rows) -> np.ndarray:
        """The head count's fitted wave model plus its residual at the measured points, linear in rows
        between them (exact at each; beyond the ends the end residual); below 1 row the 1-row time."""
        coef = self._fit(heads)
        xs = np.array([r for r, _ in self.rows_us[heads]], dtype=float)
        ys = np.array([t for _, t in self.rows_us[heads]], dtype=float)

        def model(r):
            return coef[0] + coef[1] * fa3_block_waves(r) + coef[2] * r

        r = np.maximum(np.asarray(rows, dtype=float), 1.0)
        return model(r) + np.interp(r, xs, ys - model(xs))

    def _at_heads(self, heads: int, rows) -> np.ndarray:
        lo, hi = min(self.rows_us), max(self.rows_us)
        if heads <= lo:
            return self._table(lo, rows)
        if heads >= hi:
            return self._table(hi, np.asarray(rows, dtype=float) * math.ceil(heads / self.tile_rows))
        w = (heads - lo) / (hi - lo)
        return (1 - w) * self._table(lo, rows) + w * self._table(hi, rows)

    def measured_us(self, rows: int, heads: int, k=None, verify: int = 1):
        """Microseconds per layer on the measured GPU: ``rows`` query tokens (requests x positions) of
        ``heads`` heads, each reading ``k`` rows (default: top-k), ``verify`` positions per request."""
        k = self.topk if k is None else np.minimum(np.asarray(k, dtype=float), self.topk)
        eff_rows = rows * np.asarray(k, dtype=float) / self.topk
        t = self._at_heads(heads, eff_rows)
        if verify > 1:
            floor = self.floor_us(heads)
            t = floor + (t - floor) * self.verify_factor
        return t

    def time(self, gpu: GpuSpec, rows: int, heads: int, k=None, verify: int = 1, bf16_flops: float = 0.0):
        """Seconds per layer on ``gpu`` (datasheet dense BF16 ``bf16_flops``): the measured time x the SM
        clock ratio, and at least the floor plus the padded MMA FLOPs at that rate (module docstring)."""
        if rows <= 0:
            return 0.0
        us = self.measured_us(rows, heads, k, verify)
        if gpu.name != self.ref_gpu:
            clock = self.ref_sm_boost_mhz / gpu.sm_boost_mhz if gpu.sm_boost_mhz > 0 else 1.0
            kk = self.topk if k is None else np.minimum(np.asarray(k, dtype=float), self.topk)
            flops = 2.0 * rows * self.tile_rows * math.ceil(heads / self.tile_rows) * np.asarray(kk, dtype=float) * (
                64 + 512 + 512)
            compute_us = self.floor_us(heads) * clock + (flops / bf16_flops * 1e6 if bf16_flops > 0 else 0.0)
            us = np.maximum(us * clock, compute_us)
        out = us * 1e-6
        return float(out) if np.ndim(out) == 0 else out

    def how(self, gpu: GpuSpec) -> tuple[bool, str]:
        """(measured on this GPU, how the term is priced on it)."""
        base = (f"{self.source}; per-shape table at 8 and 64 heads (1-192 rows), FA3's dynamic-split wave arithmetic "
                f"between the measured points, linear in heads between 8 and 64; verify passes at adjacent-position "
                f"top-k overlap {self.verify_overlap:g} (x {self.verify_factor:.3f} above the floor)")
        if gpu.name == self.ref_gpu:
            return True, base
        if gpu.sm_boost_mhz > 0:
            clock = (f"x {self.ref_sm_boost_mhz / gpu.sm_boost_mhz:.3f}, the SM boost clock ratio "
                     f"{self.ref_sm_boost_mhz:.0f} / {gpu.sm_boost_mhz:.0f} MHz")
        else:
            clock = f"kept (INFERRED: no published SM clock for {gpu.name})"
        return False, (f"{base}; on {gpu.name}: the H100's times {clock}, not the HBM ratio (the page-size-1 gather "
                       "does not approach the H100's HBM bandwidth), at least the floor + padded MMA FLOPs at "
                       f"{gpu.name}'s dense BF16 rate; SM count differences not modelled")


FA3_SPARSE_DECODE = Fa3SparseDecode()

"""Kernel terms taken from published benchmarks, not from kernels timed here.

**Lightning TopK**, the top-512 select of DeepSeek-V4's C4 indexer in SGLang (LMSYS blog "DeepSeek-V4 on
Day 0", 2026-04-25, "Lightning TopK" and Figure 5): a cluster-of-8 radix select -- each CTA builds a
local 10-bit radix histogram of its share of the candidates, the cluster reduces the histograms to the
threshold that admits exactly K = 512, each CTA scatters its entries above it -- "With 4:1 compression,
a 1M-token context still produces 256K candidates per request. At this scale, a naive implementation
can take more than 100 us even at batch size 1 ... reduces small-batch top-k latency to about 15 us".
One published point: 15 us at 262,144 candidates, one query row (GPU not stated; the blog's runs are
H200 and B200). Every pass of the kernel reads each candidate's score once, so its time is priced
linear in the candidates from that point; one cluster (8 CTAs) per query row, rows in waves of the
GPU's SMs / 8. The DSA models' select (GLM-5.x, DeepSeek-V3.2) keeps its fitted term.
**DeepGEMM's FP8 GEMMs at prefill shapes** (``fp8_gemm_nt``, SGLang's block-FP8 linear on SM90:
``fp8_utils._dispatch_auto_backend`` picks DeepGEMM first when ``ENABLE_JIT_DEEPGEMM``, its SM90 default;
``m_grouped_fp8_gemm_nt_contiguous``, the routed experts after DeepEP's normal dispatch). Our ``gemm`` fp8
term is a fit of ``torch._scaled_mm`` at decode shapes (batch <= 128) whose FLOP rate, 1,536 TFLOP/s, never
bound there; at prefill shapes it is an extrapolation, and the grouped term borrows it. DeepGEMM's README
performance table (commit 327ec92, 2025-04-09, the last README with the table; H800 SXM5, NVCC 12.8; the H800
has the H100 SXM's 132 SMs, clock and 1,979 dense FP8 TFLOP/s) publishes the kernels SGLang runs at
DeepSeek-V3's shapes: normal GEMMs at M = 4096 (N x K 2112 x 7168 1,127 TFLOPS; 24576 x 1536 1,212; 32768 x
512 775; 7168 x 16384 1,520; 4096 x 7168 1,410; 7168 x 2048 1,168) and the contiguous grouped GEMM at 4096 and
8192 rows per group (4096 x 7168 1,346; 7168 x 2048 1,214). A kernel's rate does not rise as M falls, so the
M = 4096 figure bounds it at every M; a GEMM of another (N, K) takes the row nearest in log N + log K (GLM-5.x:
q_b 16384 x 2048 -> 24576 x 1536, qkv_a 2624 x 6144 -> 2112 x 7168, o_proj 6144 x 16384 -> 7168 x 16384, the
shared and routed gate_up 4096 x 6144 -> 4096 x 7168, their down 6144 x 2048 -> 7168 x 2048: the same role in
DeepSeek-V3). The term is ``launch + FLOPs / (published rate x the GPU's dense FP8 / 1,979 TFLOP/s)``, a
floor under the fitted term on Hopper GPUs (no FP4 tensor cores here): an H800 figure on an H100 / H200 /
GH200 (same SMs and clock) is a published kernel benchmark of that GPU family; on the H20 it is scaled by its
datasheet FP8 rate (a derivation). Blackwell runs other kernels (DeepGEMM's SM100 path, FlashInfer): not
applied there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LightningTopK:
    """SGLang's cluster radix top-k select for DeepSeek-V4's C4 indexer, from the LMSYS blog's figure
    (module docstring)."""

    ref_s: float = 15e-6  # "about 15 us"
    ref_candidates: int = 262_144  # "256K candidates per request": 1M tokens / 4
    cluster_ctas: int = 8  # "a cluster-of-8 radix-select reduction"
    source: str = ("Lightning TopK (LMSYS blog 'DeepSeek-V4 on Day 0', 2026-04-25): a cluster-of-8 radix select, "
                   "'about 15 us' for the 256K candidates of a 1M context at batch size 1; linear in the candidates, "
                   "one cluster per query row in waves of SMs / 8")

    def time(self, rows: int, candidates_per_row, sms: int):
        """Seconds of the select for ``rows`` query rows of ``candidates_per_row`` candidates each."""
        if rows <= 0:
            return 0.0 * candidates_per_row
        waves = math.ceil(rows * self.cluster_ctas / max(sms, self.cluster_ctas))
        return self.ref_s * waves * candidates_per_row / self.ref_candidates


LIGHTNING_TOPK = LightningTopK()


H800_DENSE_FP8_FLOPS = 1.979e15  # H800 SXM5 = H100 SXM compute: 1,979 dense FP8 TFLOP/s (NVIDIA H100 datasheet)


@dataclass(frozen=True)
class DeepGemmPrefillRates:
    """DeepGEMM's published FP8 GEMM rates at prefill shapes on an H800 (module docstring): ``normal``
    and ``contiguous`` map (N, K) to FLOP/s."""

    normal: tuple[tuple[int, int, float], ...] = (
        (2112, 7168, 1127e12), (24576, 1536, 1212e12), (32768, 512, 775e12),
        (7168, 16384, 1520e12), (4096, 7168, 1410e12), (7168, 2048, 1168e12))
    contiguous: tuple[tuple[int, int, float], ...] = ((4096, 7168, 1346e12), (7168, 2048, 1214e12))
    ref_fp8_flops: float = H800_DENSE_FP8_FLOPS
    source: str = ("DeepGEMM README performance table (deepseek-ai/DeepGEMM commit 327ec92, 2025-04-09, H800 SXM5): "
                   "fp8_gemm_nt at M 4096 (N x K 2112x7168 1,127; 24576x1536 1,212; 32768x512 775; 7168x16384 "
                   "1,520; 4096x7168 1,410; 7168x2048 1,168 TFLOPS), contiguous grouped GEMM at 4096-8192 rows per "
                   "group (4096x7168 1,346; 7168x2048 1,214 TFLOPS); the row nearest in log N + log K")
    short: str = "DeepGEMM's published H800 rates (README 327ec92; published_kernels.DEEPGEMM_PREFILL)"

    def rate(self, n: int, k: int, *, grouped: bool, fp8_flops: float) -> float:
        """FLOP/s of a GEMM of output width ``n`` and depth ``k`` on a GPU of dense ``fp8_flops``: the
        published row nearest in log N + log K, scaled by the GPU's dense FP8 over the H800's."""
        rows = self.contiguous if grouped else self.normal
        _, _, r = min(rows, key=lambda row: abs(math.log(n / row[0])) + abs(math.log(k / row[1])))
        return r * fp8_flops / self.ref_fp8_flops


DEEPGEMM_PREFILL = DeepGemmPrefillRates()

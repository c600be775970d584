"""DeepGEMM's masked grouped FP8 GEMM, the routed experts of a DeepEP decode pass, priced from its measurement.

**What SGLang runs**: under ``--moe-a2a-backend deepep`` SGLang resolves ``--deepep-mode auto`` to the
low-latency kernels when no DP rank extends (``layers/moe/utils.py`` ``DeepEPMode.resolve``; a speculative
verify is a DECODE batch at the scheduler), and the low-latency dispatch's output (``[local experts, max
tokens, hidden]`` plus ``masked_m``) goes to DeepGEMM's masked kernel (``layers/moe/moe_runner/deep_gemm.py``:
``pre_permute_deepep_ll_to_deep_gemm`` sets ``use_masked_gemm``; ``_run_masked_gemm`` calls
``grouped_gemm_nt_f8f8bf16_masked`` for the gate/up and the down projection).

**The measurement** (BENCHMARKS.md, "DeepGEMM's masked grouped GEMM at GLM-5.2's EP8 decode shapes"; CSVs
``benchmarks/results/deepgemm_masked_moe-h100-*.csv``; ``benchmarks/deepgemm_masked_moe.py``, 2026-12-07):
sgl-deep-gemm 0.1.3 with apache-tvm-ffi 0.1.9 (SGLang 0.5.14's pins; entry ``m_grouped_fp8_fp4_gemm_nt_masked``)
on an NVIDIA H100 80GB HBM3 (132 SMs, 1,980 MHz), five runs in three device calls (a: seed 0; b and c: seeds 0
and 1; the device service gave an H100 each time).
GLM-5.2's EP8 shapes: 32 local experts of 256, gate/up N 4,096 x K 6,144 and down N 6,144 x K 2,048, the
masked rows of 1-128 decode tokens per rank routed top-8 uniformly; one launch per CUDA-graph replay (the
0.4-0.8 GB of weights past L2 every launch), every output within 1.7e-3 of a float32 reference. The kernel
reads only the experts that received a token (12 of 32 at one token per rank: 117 us, against 323 us for 32).
In the same process (calls b and c) a 4 GiB device-to-device copy ran at 3,027-3,042 GB/s (read + write; 91% of
the H100's 3.35 TB/s): at 24+ tokens per rank the gate/up kernel streams the weights at 82% of it, the down
kernel at 87%.

**How a launch is priced**: ``fixed + max(bytes / bw, padded FLOPs / the GPU's dense FP8 rate)``, ``bytes``
the touched experts' weights plus the bf16 activations in and out (``ops.moe_ops``), ``fixed`` and ``bw`` a
least-squares line through the 60 launches of that projection in the five runs (``FITS``): gate/up 4.5 us +
bytes / 2,538 GB/s (rms 2.8%, max 11.6%), down 15.0 us + bytes / 2,894 GB/s (rms 5.4%, max 11.9%; call a's down
launches ran 9.3% below the line, calls b and c 2-4% above it: the spread between the machines). A GEMM of another
(N, K) takes the fit nearest in log N + log K (DeepSeek-V3.2's 4,096 x 7,168 and 7,168 x 2,048: the same
roles). Padded FLOPs: the kernel computes whole 64-row M blocks per touched expert; it binds only on
compute-poor GPUs (an H20: 296 TFLOP/s FP8).

**On another GPU** (DERIVED): ``bw`` x that GPU's datasheet HBM over the H100's 3.35 TB/s (the kernel is
weight-bound: 6-170 of 1,979 TFLOP/s on the real rows); ``fixed`` as measured. On the H200 that is x 1.433 (the
measured copy ratio, 4,266 / 3,031 GB/s, is 1.407). Cross-checks: DeepGEMM issue #20's own shape (256 groups x
64 rows, N 7,168, K 4,096, between the two roles) took 2,996-3,024 us here; the down line, its nearest, says
2,740 us (-9%), the gate/up line 3,111 us (+3-4%). The issue's H200 figure, 1,847 us (2025-02-27, DeepGEMM of
that day), is 12% faster than this shape's H100 time scaled by the datasheet HBM ratio (2,101 us), where DeepGEMM
issue #195 reports a later masked-kernel regression on an H200 (20 -> 26.5 us at a small shape). DeepGEMM's
README (commit 327ec92, H800 = H100's HBM) has dense FP8 GEMMs at M = 64 at 2,320-2,668 GB/s, the same range
as the masked kernel here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ops import Op

REF_GPU = "h100"  # the GPU preset the kernel was measured on
REF_DATASHEET_HBM_BW = 3.35e12  # NVIDIA H100 SXM datasheet: gpus/h100.toml datasheet_hbm_bw (a test holds them equal)


@dataclass(frozen=True)
class LaunchFit:
    """One projection's measured line: a launch of ``bytes`` HBM bytes takes ``fixed_s + bytes / bw``."""

    name: str
    n: int
    k: int
    fixed_s: float
    bw: float


# least-squares lines through every measured launch of the five runs (tests/test_masked_gemm.py refits them
# from the CSVs)
FITS: tuple[LaunchFit, ...] = (
    LaunchFit("gate_up", 4096, 6144, 4.46e-6, 2.538e12),
    LaunchFit("down", 6144, 2048, 14.96e-6, 2.894e12),
)


@dataclass(frozen=True)
class MaskedGroupedGemm:
    """DeepGEMM's masked FP8 grouped GEMM, measured on ``ref_gpu`` (module docstring)."""

    fits: tuple[LaunchFit, ...] = FITS
    ref_gpu: str = REF_GPU
    ref_hbm_bw: float = REF_DATASHEET_HBM_BW
    block_m: int = 64  # DeepGEMM's smallest M block (the masked kernel's, pegainfer PR #567 reads BLOCK_M 64)
    source: str = ("DeepGEMM m_grouped_fp8_gemm_nt_masked (sgl-deep-gemm 0.1.3, SGLang 0.5.14's pin) timed on an "
                   "H100 at GLM-5.2's EP8 decode shapes (benchmarks/deepgemm_masked_moe.py): gate/up 4.5 us + "
                   "bytes / 2,538 GB/s, down 15.0 us + bytes / 2,894 GB/s")

    def fit(self, n: int, k: int) -> LaunchFit:
        """The measured projection nearest to an (N, K) GEMM in log N + log K."""
        return min(self.fits, key=lambda f: abs(math.log(max(n, 1) / f.n)) + abs(math.log(max(k, 1) / f.k)))

    def time(self, op: Op, hbm_bw: float, fp8_flops: float) -> float:
        """Seconds of one masked grouped GEMM launch series (``op.count`` launches) on a GPU of datasheet
        ``hbm_bw`` and dense ``fp8_flops``: the weights of the experts touched and the activations at the
        measured bandwidth scaled by the HBM ratio, or 64-row blocks of compute per touched expert."""
        f = self.fit(op.n, op.k)
        bw = f.bw * hbm_bw / self.ref_hbm_bw
        groups = op.weight_groups or op.groups
        rows_per_expert = op.tokens / groups if groups else 0.0
        blocks = max(1, math.ceil(rows_per_expert / self.block_m - 1e-9)) if op.tokens else 0
        padded_flops = 2.0 * blocks * self.block_m * op.k * op.n * groups
        return (f.fixed_s + max(op.bytes / bw, padded_flops / fp8_flops)) * op.count


MASKED_GROUPED_GEMM = MaskedGroupedGemm()

"""What the benchmarks that build another project's kernels from a fetched copy share
(flashmla_compare.py, fa3_sparse_decode.py): their usage error, the fetch scripts' FETCHED record,
the check that the copy holds every file the build needs, PyTorch on a Hopper GPU, and the two
error figures of an output against the float64 reference."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


class UsageError(Exception):
    """Bad arguments or environment: the benchmark's main prints it and exits 2."""


def missing_files(src: Path, needed: Iterable[str]) -> list[str]:
    """The paths of ``needed`` absent under ``src`` (empty when the copy is complete)."""
    return [p for p in needed if not (Path(src) / p).is_file()]


def read_fetched(src: Path) -> dict[str, str]:
    """{project: commit} from DIR/FETCHED (written by the fetch script); {} if absent."""
    path = Path(src) / "FETCHED"
    if not path.is_file():
        return {}
    return {p[0]: p[1] for p in (line.split() for line in path.read_text().splitlines()) if len(p) >= 2}


def hopper_torch(builds: str) -> Any:
    """torch with a CUDA Hopper GPU (its cpp_extension builds ``builds``, sm_90a), else UsageError."""
    try:
        import torch
    except ImportError as exc:
        raise UsageError(f"needs PyTorch (its cpp_extension builds {builds}): {exc}") from None
    if not torch.cuda.is_available():
        raise UsageError(f"needs a CUDA GPU and a CUDA build of PyTorch (torch {torch.__version__} sees none)")
    cc = torch.cuda.get_device_capability()
    if cc != (9, 0):
        raise UsageError(f"needs a Hopper GPU (sm_90a kernels); {torch.cuda.get_device_name()} is sm_{cc[0]}{cc[1]}")
    return torch


def hopper_deep_gemm() -> tuple[Any, Any]:
    """(torch, deep_gemm) on a Hopper GPU, with SGLang's pinned DeepGEMM build installed, else UsageError."""
    torch = hopper_torch("nothing here: deep_gemm, installed, is a torch extension")
    try:
        import deep_gemm
    except Exception as exc:  # ImportError, or the prebuilt module failing to load against this torch
        raise UsageError(f"needs deep_gemm (SGLang pins sgl-deep-gemm 0.1.3): {type(exc).__name__}: {exc}") from None
    return torch, deep_gemm


DEEP_GEMM_BLOCK = 128  # DeepGEMM's SM90 FP8 scale granularity: per token x 128 K for A, 128 x 128 for B


def block_fp8_reference(a: Any, a_sf: Any, b: Any, b_sf: Any) -> Any:
    """float32 [m, n] of what DeepGEMM's block-scaled FP8 GEMM computes: A [m, k] dequantised per row and 128 K
    (a_sf [m, k / 128]) times B [n, k] dequantised per 128 x 128 block (b_sf [ceil(n / 128), k / 128], the last
    block partial when n is not a multiple of 128), transposed."""
    blk = DEEP_GEMM_BLOCK
    a_deq = a.float() * a_sf.repeat_interleave(blk, dim=1)
    b_deq = b.float() * b_sf.repeat_interleave(blk, dim=0)[:b.shape[0]].repeat_interleave(blk, dim=1)
    return a_deq @ b_deq.T


def deep_gemm_sfa_layout(dg: Any, a_sf: Any) -> Any:
    """A's float32 per-token scales in the MN-major TMA-aligned layout DeepGEMM's SM90 kernels read (what SGLang's
    quantisation and DeepEP's dispatch write), so a timed launch does no layout work; as given where the build has
    no such helper (the kernel then transforms them itself, inside the timing)."""
    fn = getattr(dg, "get_mn_major_tma_aligned_tensor", None)
    return fn(a_sf) if callable(fn) else a_sf


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref|| (inf on NaN)."""
    if np.isnan(got).any():
        return math.inf
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def max_abs(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| (inf on NaN)."""
    return math.inf if np.isnan(got).any() else float(np.max(np.abs(got - ref)))

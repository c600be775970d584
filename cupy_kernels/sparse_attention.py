"""Absorbed-MLA sparse decode attention on Hopper tensor cores (CuPy RawKernel).

The attention half of a HiSparse decode step: each request attends to the k rows of the KV
cache named by its slot indices (DeepSeek Sparse Attention top-k).  The kernel source is
`sparse_attention.cu` beside this file; it uses wgmma (sm_90a), so it is compiled with nvcc to a
cubin (cached) rather than through NVRTC's default architecture.

CuPy is imported lazily: this module (and `validate_inputs`, `plan_splits`) works without it.
bf16 tensors are uint16 arrays of bf16 bit patterns (CuPy has no bfloat16 dtype).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ._build import build_cubin
from .mla_reference import BF16_ROW_BYTES, D_LATENT, D_QK, FP8_ROW_BYTES

KV_DTYPES = ("bf16", "fp8")
HEADS_PER_CTA = 64
TILE = 64
THREADS = 256
_SOURCE = Path(__file__).with_name("sparse_attention.cu")
_NVCC_FLAGS = ("-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a")
_SMEM_Q = 9 * HEADS_PER_CTA * 128
_SMEM_TILE = 9 * TILE * 128
_SMEM_FIXED = _SMEM_Q + HEADS_PER_CTA * 128 + 1024 + 512 + 1024  # Q, P, exchange, slots, align
SMEM_BYTES = {
    "bf16": _SMEM_FIXED + 2 * _SMEM_TILE,
    "fp8": _SMEM_FIXED + _SMEM_TILE + TILE * FP8_ROW_BYTES,
}


class MLADims(NamedTuple):
    """Problem sizes read off validated inputs."""

    batch: int
    heads: int
    k: int
    n_rows: int


class MLADecodeResult(NamedTuple):
    """Kernel outputs: out [B, H, 512] uint16 (bf16 bits) and lse [B, H] float32 (natural log)."""

    out: Any
    lse: Any


def validate_inputs(q: Any, kv: Any, slots: Any, kv_dtype: str) -> MLADims:
    """Check shapes, dtypes and contiguity; works on numpy or cupy arrays (no GPU needed)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    _expect(q, "q", np.uint16, 3)
    if q.shape[2] != D_QK:
        raise ValueError(f"q must be [B, H, {D_QK}] (512 latent + 64 rope), got {tuple(q.shape)}")
    batch, heads = int(q.shape[0]), int(q.shape[1])
    if batch < 1 or heads < 1 or heads % HEADS_PER_CTA:
        raise ValueError(f"q: need B >= 1 and H a positive multiple of {HEADS_PER_CTA}, got B={batch}, H={heads}")
    if kv_dtype == "bf16":
        _expect(kv, "kv", np.uint16, 2)
        width, what = D_QK, f"[N, {D_QK}] uint16 (bf16 rows of {BF16_ROW_BYTES} B)"
    else:
        _expect(kv, "kv", np.uint8, 2)
        width, what = FP8_ROW_BYTES, f"[N, {FP8_ROW_BYTES}] uint8 (fp8 rows)"
    if kv.shape[1] != width or kv.shape[0] < 1:
        raise ValueError(f"kv for kv_dtype={kv_dtype!r} must be {what}, got {tuple(kv.shape)}")
    _expect(slots, "slots", np.int32, 2)
    if slots.shape[0] != batch or slots.shape[1] < 1:
        raise ValueError(f"slots must be [B={batch}, k>=1] int32, got {tuple(slots.shape)}")
    return MLADims(batch, heads, int(slots.shape[1]), int(kv.shape[0]))


def _expect(a: Any, name: str, dtype: type, ndim: int) -> None:
    """Raise ValueError unless `a` is a C-contiguous array of `dtype` with `ndim` dims."""
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise ValueError(f"{name} must be an array, got {type(a).__name__}")
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise ValueError(f"{name} must have dtype {np.dtype(dtype).name}, got {np.dtype(a.dtype).name}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(a.shape)}")
    flags = getattr(a, "flags", None)
    if flags is not None and not flags["C_CONTIGUOUS"]:
        raise ValueError(f"{name} must be C-contiguous")


def plan_splits(batch: int, heads: int, k: int, n_sms: int) -> tuple[int, int]:
    """(n_splits, tiles_per_split): split each request's k tokens so the grid fills the GPU.

    Never leaves a split empty; one split when the (request, head group) pairs already fill it.
    """
    tiles = math.ceil(k / TILE)
    pairs = batch * (heads // HEADS_PER_CTA)
    want = max(1, min(tiles, n_sms // pairs if pairs < n_sms else 1))
    per = math.ceil(tiles / want)
    return math.ceil(tiles / per), per


# --------------------------------------------------------------------------------------------
# Build and load
# --------------------------------------------------------------------------------------------
def compiled_cubin() -> Path:
    """Build (once, cached by source hash) and return the cubin of the kernel source."""
    return build_cubin(_SOURCE, _NVCC_FLAGS, "sparse_attention")


@cache
def _kernels(device_id: int) -> dict[str, Any]:
    """Load the cubin on a device and raise the dynamic shared-memory limits."""
    import cupy as cp

    cc = cp.cuda.Device(device_id).compute_capability
    if cc != "90":
        raise RuntimeError(f"sparse_mla_decode needs a Hopper GPU (sm_90, wgmma); device has sm_{cc}")
    mod = cp.RawModule(path=str(compiled_cubin()))
    kerns = {name: mod.get_function(f"mla_decode_{name}") for name in KV_DTYPES}
    for name, kern in kerns.items():
        kern.max_dynamic_shared_size_bytes = SMEM_BYTES[name]
    kerns["combine"] = mod.get_function("mla_combine")
    kerns["n_sms"] = cp.cuda.Device(device_id).attributes["MultiProcessorCount"]
    return kerns


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------
def sparse_mla_decode(
    q: Any,
    kv: Any,
    slots: Any,
    scale: float,
    kv_dtype: str = "bf16",
    *,
    out: Any | None = None,
    lse: Any | None = None,
    n_splits: int | None = None,
    workspace: Any | None = None,
) -> MLADecodeResult:
    """Sparse absorbed-MLA decode attention for one layer.

    q: [B, H, 576] uint16 (bf16), H a multiple of 64.  kv: [N, 576] uint16 bf16 rows, or
    [N, 656] uint8 FP8 rows (kv_dtype="fp8").  slots: [B, k] int32 row indices; any index
    outside [0, N), e.g. -1, is masked.  scale: softmax scale on q.k.
    Returns out [B, H, 512] bf16 bits and lse [B, H] float32 = ln(sum exp(scale * q.k)); a
    request whose slots are all masked gets out = 0 and lse = -inf (no NaN).
    n_splits overrides how many CTAs share one request's k (tests use it to cover both paths).
    workspace: optional float32 cupy array of at least `workspace_elems(B, H, k)` elements for the
    split partials; pass one when capturing the call into a CUDA graph (no allocation inside).
    """
    import cupy as cp

    dims = validate_inputs(q, kv, slots, kv_dtype)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    for name, a in (("q", q), ("kv", kv), ("slots", slots)):
        if not isinstance(a, cp.ndarray):
            raise ValueError(f"{name} must be a cupy array on the GPU")
    out = _output(out, (dims.batch, dims.heads, D_LATENT), cp.uint16, "out")
    lse = _output(lse, (dims.batch, dims.heads), cp.float32, "lse")
    kerns = _kernels(q.device.id)
    splits, per = plan_splits(dims.batch, dims.heads, dims.k, kerns["n_sms"])
    if n_splits is not None:
        tiles = math.ceil(dims.k / TILE)
        per = math.ceil(tiles / max(1, min(int(n_splits), tiles)))
        splits = math.ceil(tiles / per)
    rows = dims.batch * dims.heads
    part_o, part_lse = _partials(workspace, splits, rows) if splits > 1 else (out, lse)
    grid = (dims.heads // HEADS_PER_CTA, splits, dims.batch)
    args = (q, kv, slots, np.int64(dims.n_rows), np.int32(dims.heads), np.int32(dims.k),
            np.float32(scale * math.log2(math.e)), np.int32(per), out, lse, part_o, part_lse)
    kerns[kv_dtype](grid, (THREADS,), args, shared_mem=SMEM_BYTES[kv_dtype])
    if splits > 1:
        kerns["combine"]((rows,), (128,), (part_o, part_lse, np.int32(splits), np.int64(rows), out, lse))
    return MLADecodeResult(out, lse)


def workspace_elems(batch: int, heads: int, k: int) -> int:
    """float32 elements of split partials for the largest possible split count."""
    return math.ceil(k / TILE) * batch * heads * (D_LATENT + 1)


def _partials(workspace: Any | None, splits: int, rows: int) -> tuple[Any, Any]:
    """Views (part_o [splits, rows, 512], part_lse [splits, rows]) in a workspace or new arrays."""
    import cupy as cp

    n_o, n_l = splits * rows * D_LATENT, splits * rows
    if workspace is None:
        workspace = cp.empty(n_o + n_l, cp.float32)
    elif workspace.dtype != cp.float32 or workspace.size < n_o + n_l or not workspace.flags.c_contiguous:
        raise ValueError(f"workspace must be a contiguous float32 cupy array of >= {n_o + n_l} elements")
    flat = workspace.reshape(-1)
    return flat[:n_o].reshape(splits, rows, D_LATENT), flat[n_o : n_o + n_l]


def _output(a: Any | None, shape: tuple[int, ...], dtype: Any, name: str) -> Any:
    """Allocate an output, or check a caller-provided one."""
    import cupy as cp

    if a is None:
        return cp.empty(shape, dtype)
    if not isinstance(a, cp.ndarray) or a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"{name} must be a C-contiguous cupy array of shape {shape} and dtype {np.dtype(dtype).name}")
    return a

"""Absorbed-MLA sparse decode attention on Hopper tensor cores (CuPy RawKernel).

The attention half of a HiSparse decode step: each request attends to the k rows of the KV
cache named by its slot indices (DeepSeek Sparse Attention top-k).  The kernel source is
`sparse_attention.cu` beside this file; it uses wgmma (sm_90a), so it is compiled with nvcc to a
cubin (cached) rather than through NVRTC's default architecture.

Two kernels share one contract: H a multiple of 64 runs the wide kernel (64 heads per CTA, heads
as the MMA's M); any other H (8 or 16 heads per GPU under TP attention) runs the narrow kernel
(16 heads per CTA, the tile's tokens as M), so no tensor-core work goes to padding heads.
The wide kernel has variants (WIDE_VARIANTS: the warp-specialised "ws" with a producer
warpgroup, its FP8 crossover "wsx" where two CTAs share each tile's dequantisation and "wsxe"
that frees each tile's buffer earlier, "wsxo" that also writes O through shared memory, "wsxr"
with a smaller first burst of loads, "wsxb" that also splits the pair's cluster barriers (the FP8
default at H 128), the two-warpgroup "serial"),
chosen per call, by $HISPARSE_MLA_VARIANT, or per KV layout by default
(DEFAULT_WIDE_VARIANT, the fastest that passed the GPU tests), each where it runs.
MTP / speculative decoding: q may carry T query tokens per request ([B, T, H, 576]); tokens that
share one top-k selection (slots [B, k]) are folded into the heads, tokens with their own
selection (slots [B, T, k]) into the batch.

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
HEADS_PER_CTA = 64  # wide kernel (H a multiple of 64)
NARROW_HEADS_PER_CTA = 16  # narrow kernel (any other H)
TILE = 64
THREADS = 256
NARROW_THREADS = 128
_SOURCE = Path(__file__).with_name("sparse_attention.cu")
_NVCC_FLAGS = ("-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a")
_SMEM_Q = 9 * HEADS_PER_CTA * 128
_SMEM_TILE = 9 * TILE * 128
_SMEM_FIXED = _SMEM_Q + HEADS_PER_CTA * 128 + 1024 + 512 + 1024  # Q, P, exchange, slots, align
SMEM_BYTES = {  # both layouts hold two bf16 tiles (FP8 rows are staged in registers)
    "bf16": _SMEM_FIXED + 2 * _SMEM_TILE,
    "fp8": _SMEM_FIXED + 2 * _SMEM_TILE,
}
# narrow: Q (16 heads), P^T, max/sum exchange, slot ring, align; bf16 two tiles, fp8 one tile
# (its raw rows are staged in registers), small enough for two CTAs per SM (mirrors
# mla_narrow_body in sparse_attention.cu)
_SMEM_NARROW_FIXED = 9 * NARROW_HEADS_PER_CTA * 128 + NARROW_HEADS_PER_CTA * 128 + 512 + 1024 + 1024
SMEM_BYTES_NARROW = {
    "bf16": _SMEM_NARROW_FIXED + 2 * _SMEM_TILE,
    "fp8": _SMEM_NARROW_FIXED + _SMEM_TILE,
}
NARROW_CTAS_PER_SM = {"bf16": 1, "fp8": 2}
# warp-specialised wide kernel: Q, two bf16 tiles, P, row scales + slots + mbarriers, align
# (mirrors mla_ws_body in sparse_attention.cu)
WS_THREADS = 384
# Q, two tiles, P, then row scales, slots and 6 mbarrier words (WS_SMEM_SMALL), and 1 KB of alignment slack
_SMEM_WS = _SMEM_Q + 2 * _SMEM_TILE + HEADS_PER_CTA * 128 + (2 * HEADS_PER_CTA * 4 + 2 * TILE * 4 + 6 * 8) + 1024


class WideVariant(NamedTuple):
    """One implementation of the wide kernel (H a multiple of 64): kernel-name prefix, threads,
    smem, and where it applies: the KV layouts it is built for and the multiple of 64-head groups
    its grid needs (2 for a kernel launched in clusters of two CTAs along the head groups)."""

    prefix: str
    threads: int
    smem: int
    doc: str
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8")
    group_multiple: int = 1

    def runs(self, kv_dtype: str, heads: int) -> bool:
        """Whether this variant can run a call with this layout and head count."""
        groups = heads // HEADS_PER_CTA
        return kv_dtype in self.kv_dtypes and heads % HEADS_PER_CTA == 0 and groups % self.group_multiple == 0


# The wide-kernel implementations, selectable so a benchmark can time them side by side.
WIDE_VARIANTS = {
    "ws": WideVariant("mla_decode_ws_", WS_THREADS, _SMEM_WS,
                      "warp-specialised: producer warpgroup + two consumer warpgroups (S N=64, P V split); "
                      "bf16 tiles by two 64-thread producer halves, one per buffer; FP8 rows dequantised "
                      "once the next tile's rows have landed"),
    "ws2": WideVariant("mla_decode_ws2_", WS_THREADS, _SMEM_WS,
                       "ws with a second producer (149 GPU tests passed on the H200): bf16 by all 128 threads, slots in "
                       "registers, the next tile issued before this one is waited on; FP8 rows dequantised "
                       "while the next tile's rows load; shared memory addressed as such (LDS/STS)"),
    "wsx": WideVariant("mla_decode_wsx_", WS_THREADS, _SMEM_WS,
                       "ws with FlashMLA's crossover (FP8, H a multiple of 128): the two head groups of a request "
                       "run as a cluster of two CTAs, each dequantises half of every tile's rows and writes "
                       "them into its own shared memory, and the bulk-copy engine copies that half to the peer CTA's", kv_dtypes=("fp8",), group_multiple=2),
    "wsxe": WideVariant("mla_decode_wsxe_", WS_THREADS, _SMEM_WS,
                        "wsx whose WG0 frees a tile's buffer once its P V of that tile is done, before it waits for "
                        "the next tile (wsx frees it after issuing the next tile's S), so both CTAs' producers may "
                        "start tile t+1 while tile t is still in flight to WG0 (1.6-3% faster than wsx in two H100 "
                        "runs)",
                        kv_dtypes=("fp8",), group_multiple=2),
    "wsxo": WideVariant("mla_decode_wsxo_", WS_THREADS, _SMEM_WS,
                        "wsxe whose consumers write O through shared memory (the tile buffer the last tile left free, "
                        "16-byte stores) instead of 4-byte stores from registers (epilogue 7.2 -> 2.0 us per CTA, "
                        "0.92x -> 0.96x FlashMLA at B 64 H 128 on an H100); split partials as before: BENCHMARKS.md",
                        kv_dtypes=("fp8",), group_multiple=2),
    "wsxr": WideVariant("mla_decode_wsxr_", WS_THREADS, _SMEM_WS,
                        "wsxo with Q loaded by all three warpgroups before the barrier set-up and tile 1's raw rows "
                        "issued only once tile 0 is out, so the first burst is Q and tile 0 (1.1-1.9% faster than "
                        "wsxo in one H100 run; the whole GPU suite passed with it the default: BENCHMARKS.md)",
                        kv_dtypes=("fp8",), group_multiple=2),
    "wsxb": WideVariant("mla_decode_wsxb_", WS_THREADS, _SMEM_WS,
                        "wsxr with the pair's cluster barriers split: a thread waits for the start barrier only "
                        "before its first remote operation, and each warpgroup arrives at the end once its last "
                        "remote operation is out (before the epilogue), waiting only at exit (FlashMLA arrives "
                        "relaxed at the start the same way); 0.3-2.9 us faster than wsxr in all eight readings of "
                        "two H100 runs; the whole GPU suite passed with it the default: BENCHMARKS.md",
                        kv_dtypes=("fp8",), group_multiple=2),
    "serial": WideVariant("mla_decode_", THREADS, SMEM_BYTES["bf16"],
                          "two warpgroups, S -> softmax -> P V in sequence (the previous kernel)"),
}
# the fastest variant per layout that passed the GPU tests, measured side by side (BENCHMARKS.md:
# B 64 H 128 bf16 ws2 114.9 us vs serial 132.6; FP8 wsxb 97.3 / 98.6 vs wsxr 98.2 / 98.9 (two runs), wsxr 97.3 vs wsxo 98.9, wsxo 99.4 vs wsxe 103.8, wsxe 103.2 vs wsx 106.0, and in
# an earlier run wsx 105.9 vs ws 119.9 (H100, each pair in one run; before,
# ws 123.3 vs ws2 142.0 / serial 147.6); it applies where it was measured, one split per (request,
# head group), else "serial"; where wsxb cannot run (H 64: one head group) it is ws
DEFAULT_WIDE_VARIANT = {"bf16": "ws2", "fp8": "wsxb"}
VARIANT_ENV = "HISPARSE_MLA_VARIANT"


# The narrow-kernel implementations (any other H): kernel-name prefix and what differs.
NARROW_VARIANTS = {
    "narrow": "mla_decode_narrow_",
    "narrow2": "mla_decode_narrow2_",  # LDS/STS, slots read once per bf16 gather
}
# per layout, measured side by side (BENCHMARKS.md): bf16 narrow2 3.0-3.5 TB/s of gathered KV at
# B 64/128 H 8/16 against narrow's 2.2-2.5; FP8 narrow2 2-3% slower than narrow
DEFAULT_NARROW_VARIANT = {"bf16": "narrow2", "fp8": "narrow"}
NARROW_VARIANT_ENV = "HISPARSE_MLA_NARROW_VARIANT"


def resolve_narrow_variant(variant: str | None, kv_dtype: str = "bf16") -> str:
    """The narrow-kernel variant: the argument, else $HISPARSE_MLA_NARROW_VARIANT, else the
    layout's default (DEFAULT_NARROW_VARIANT)."""
    import os

    fallback = DEFAULT_NARROW_VARIANT.get(kv_dtype, "narrow")
    name = variant if variant is not None else os.environ.get(NARROW_VARIANT_ENV, fallback)
    if name not in NARROW_VARIANTS:
        src = "narrow_variant" if variant is not None else f"${NARROW_VARIANT_ENV}"
        raise ValueError(f"{src} must be one of {tuple(NARROW_VARIANTS)}, got {name!r}")
    return name


def resolve_variant(variant: str | None, kv_dtype: str = "bf16", one_split: bool = True,
                    heads: int = 2 * HEADS_PER_CTA) -> str:
    """The wide-kernel variant to run: the argument, else $HISPARSE_MLA_VARIANT, else the
    layout's default (DEFAULT_WIDE_VARIANT) where it was measured faster, i.e. when each
    (request, head group) runs as one split (one_split; B 64 and 128 at H 128), else "serial".

    A variant named by the argument that cannot run this layout or head count is an error; one
    from the environment or the default falls back to "ws" (built for every layout and H)."""
    import os

    fallback = DEFAULT_WIDE_VARIANT.get(kv_dtype, "serial") if one_split else "serial"
    name = variant if variant is not None else os.environ.get(VARIANT_ENV, fallback)
    src = "variant" if variant is not None else f"${VARIANT_ENV}"
    if name not in WIDE_VARIANTS:
        raise ValueError(f"{src} must be one of {tuple(WIDE_VARIANTS)}, got {name!r}")
    if not WIDE_VARIANTS[name].runs(kv_dtype, heads):
        if variant is not None:
            spec = WIDE_VARIANTS[name]
            raise ValueError(f"variant {name!r} runs KV layouts {spec.kv_dtypes} with H a multiple of "
                             f"{HEADS_PER_CTA * spec.group_multiple}; got {kv_dtype!r}, H {heads}")
        name = "ws"
    return name


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
    if batch < 1 or heads < 1:
        raise ValueError(f"q: need B >= 1 and H >= 1, got B={batch}, H={heads}")
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


def heads_per_cta(heads: int) -> int:
    """64 (wide kernel) when H is a multiple of 64, else 16 (narrow kernel)."""
    return HEADS_PER_CTA if heads % HEADS_PER_CTA == 0 else NARROW_HEADS_PER_CTA


def plan_splits(batch: int, heads: int, k: int, n_sms: int, ctas_per_sm: int = 1) -> tuple[int, int]:
    """(n_splits, tiles_per_split): split each request's k tokens so the grid fills the GPU
    (n_sms x ctas_per_sm resident CTAs).

    Never leaves a split empty; one split when the (request, head group) pairs already fill it.
    """
    tiles = math.ceil(k / TILE)
    pairs = batch * math.ceil(heads / heads_per_cta(heads))
    slots = n_sms * ctas_per_sm
    want = max(1, min(tiles, slots // pairs if pairs < slots else 1))
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
    kerns: dict[str, Any] = {}
    for name in KV_DTYPES:
        for var, spec in WIDE_VARIANTS.items():
            if name not in spec.kv_dtypes:
                continue
            kerns[f"{var}_{name}"] = mod.get_function(f"{spec.prefix}{name}")
            kerns[f"{var}_{name}"].max_dynamic_shared_size_bytes = spec.smem
        for var, prefix in NARROW_VARIANTS.items():
            kerns[f"{var}_{name}"] = mod.get_function(f"{prefix}{name}")
            kerns[f"{var}_{name}"].max_dynamic_shared_size_bytes = SMEM_BYTES_NARROW[name]
    kerns["combine"] = mod.get_function("mla_combine")
    kerns["fp8_dequant_rows"] = mod.get_function("fp8_dequant_rows")
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
    variant: str | None = None,
    narrow_variant: str | None = None,
) -> MLADecodeResult:
    """Sparse absorbed-MLA decode attention for one layer.

    q: [B, H, 576] uint16 (bf16), any H >= 1, or [B, T, H, 576] for T query tokens per request
    (MTP).  kv: [N, 576] uint16 bf16 rows, or [N, 656] uint8 FP8 rows (kv_dtype="fp8").
    slots: [B, k] int32 row indices (shared by a request's T tokens), or [B, T, k] (one
    selection per token); any index outside [0, N), e.g. -1, is masked.  scale: softmax scale.
    Returns out [B, (T,) H, 512] bf16 bits and lse [B, (T,) H] float32 = ln(sum exp(scale q.k));
    a head whose slots are all masked gets out = 0 and lse = -inf (no NaN).
    n_splits overrides how many CTAs share one request's k (tests use it to cover both paths).
    workspace: optional float32 cupy array of at least `workspace_elems(B, H, k)` elements
    (B x T and T x H as folded) for the split partials; pass one when capturing the call into a
    CUDA graph (no allocation inside).
    variant: wide-kernel implementation (H a multiple of 64), a key of WIDE_VARIANTS; default
    $HISPARSE_MLA_VARIANT, else DEFAULT_WIDE_VARIANT[kv_dtype].  narrow_variant: the same for the
    narrow kernel (NARROW_VARIANTS; $HISPARSE_MLA_NARROW_VARIANT, else DEFAULT_NARROW_VARIANT[kv_dtype]).
    """
    import cupy as cp

    for name, a in (("q", q), ("kv", kv), ("slots", slots)):
        if not isinstance(a, cp.ndarray):
            raise ValueError(f"{name} must be a cupy array on the GPU")
    resolve_variant(variant, kv_dtype)  # a bad name or $HISPARSE_MLA_VARIANT fails before any work
    nvar = resolve_narrow_variant(narrow_variant, kv_dtype)
    q3, slots2, out_shape = fold_query_tokens(q, slots)
    dims = validate_inputs(q3, kv, slots2, kv_dtype)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    out = _output(out, out_shape + (D_LATENT,), cp.uint16, "out").reshape(dims.batch, dims.heads, D_LATENT)
    lse = _output(lse, out_shape, cp.float32, "lse").reshape(dims.batch, dims.heads)
    kerns = _kernels(q.device.id)
    hpc = heads_per_cta(dims.heads)
    per_sm = 1 if hpc == HEADS_PER_CTA else NARROW_CTAS_PER_SM[kv_dtype]
    splits, per = plan_splits(dims.batch, dims.heads, dims.k, kerns["n_sms"], per_sm)
    if n_splits is not None:
        tiles = math.ceil(dims.k / TILE)
        per = math.ceil(tiles / max(1, min(int(n_splits), tiles)))
        splits = math.ceil(tiles / per)
    rows = dims.batch * dims.heads
    part_o, part_lse = _partials(workspace, splits, rows) if splits > 1 else (out, lse)
    grid = (math.ceil(dims.heads / hpc), splits, dims.batch)
    args = (q3, kv, slots2, np.int64(dims.n_rows), np.int32(dims.heads), np.int32(dims.k),
            np.float32(scale * math.log2(math.e)), np.int32(per), out, lse, part_o, part_lse)
    if hpc == HEADS_PER_CTA:
        var = resolve_variant(variant, kv_dtype, one_split=splits == 1, heads=dims.heads)
        spec = WIDE_VARIANTS[var]
        kerns[f"{var}_{kv_dtype}"](grid, (spec.threads,), args, shared_mem=spec.smem)
    else:
        kerns[f"{nvar}_{kv_dtype}"](grid, (NARROW_THREADS,), args, shared_mem=SMEM_BYTES_NARROW[kv_dtype])
    if splits > 1:
        kerns["combine"]((rows,), (128,), (part_o, part_lse, np.int32(splits), np.int64(rows), out, lse))
    return MLADecodeResult(out.reshape(out_shape + (D_LATENT,)), lse.reshape(out_shape))


def dequant_fp8_rows(kv: Any) -> Any:
    """[N, 656] uint8 FP8 rows (CuPy) -> [N, 576] uint16 bf16 bit patterns, dequantised by the
    attention kernels' own conversion: what their tensor cores see (for tests and tools; the
    CPU twin is ``mla_reference.dequant_fp8_rows_bf16``)."""
    import cupy as cp

    _expect(kv, "kv", cp.uint8, 2)
    if kv.shape[1] != FP8_ROW_BYTES:
        raise ValueError(f"kv must be [N, {FP8_ROW_BYTES}] FP8 rows, got {tuple(kv.shape)}")
    n = int(kv.shape[0])
    out = cp.zeros((n, D_QK), dtype=cp.uint16)
    if n:
        blocks = min(4096, -(-n * 41 // 128))
        _kernels(cp.cuda.Device().id)["fp8_dequant_rows"]((blocks,), (128,), (kv, np.int64(n), out))
    return out


def fold_query_tokens(q: Any, slots: Any) -> tuple[Any, Any, tuple[int, ...]]:
    """(q [B', H', 576], slots [B', k], output shape without the 512) for 3-D or MTP 4-D q.

    [B, T, H, 576] with slots [B, k]: the T tokens share the selection, so they become T x H
    heads of one request (one gather serves all).  With slots [B, T, k] each token has its own
    selection and becomes a request of its own.  Pure reshapes (views), numpy or cupy.
    """
    if getattr(q, "ndim", None) != 4:
        return q, slots, tuple(q.shape[:2]) if hasattr(q, "shape") and q.ndim >= 2 else ()
    b, t, h, d = (int(x) for x in q.shape)
    flags = getattr(q, "flags", None)
    if flags is not None and not flags["C_CONTIGUOUS"]:
        raise ValueError("q must be C-contiguous")
    if getattr(slots, "ndim", None) == 3:
        if tuple(slots.shape[:2]) != (b, t):
            raise ValueError(f"slots for q [B={b}, T={t}, H, {d}] must be [B, k] or [B={b}, T={t}, k], "
                             f"got {tuple(slots.shape)}")
        sf = getattr(slots, "flags", None)
        if sf is not None and not sf["C_CONTIGUOUS"]:
            raise ValueError("slots must be C-contiguous")
        return q.reshape(b * t, h, d), slots.reshape(b * t, slots.shape[2]), (b, t, h)
    return q.reshape(b, t * h, d), slots, (b, t, h)


def workspace_elems(batch: int, heads: int, k: int) -> int:
    """float32 elements of split partials for the largest possible split count (for MTP, pass
    the folded B and H: B x T with per-token slots, T x H with shared slots)."""
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

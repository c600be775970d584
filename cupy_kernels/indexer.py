"""Lightning indexer of DeepSeek Sparse Attention for decode (CuPy RawKernel, Hopper).

Per request r with ``ctx[r]`` tokens, one query token (BRIEF 2: 132 B FP8 key rows):

    score[t] = kscale[t] * sum_h w[h] * relu(q[h] . k[t])          (t < ctx[r])

then the top-k positions by score, ties to the lower position, in ascending position order,
padded with -1 when ctx < k. k: FP8 e4m3 codes with a per-token fp32 scale, one 132 B row per
token (128 codes, then the scale, little endian), stored [R, stride, 132]. q: [R, H, 128] bf16
bits (uint16) or e4m3 codes (uint8), H 32 (GLM-5.1) or 64 (DeepSeek-V3.2); w: [R, H] fp32, the
per-head weights (for FP8 queries they carry the query scale, as DeepSeek-V3.2's
``inference/model.py`` Indexer folds ``q_scale`` into its weights).

This module defines the semantics once: ``reference_scores`` (float64), ``reference_topk`` (a
lexicographic sort) and ``radix_topk`` (a numpy twin of the kernel's radix select, checked against
``reference_topk`` on the CPU). The kernel source is ``indexer.cu``; CuPy is imported lazily.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ._build import build_cubin
from .mla_reference import bf16_to_float, e4m3_decode

ROW_BYTES = 132
HEAD_DIM = 128
HEADS = (32, 64)
Q_DTYPES = ("bf16", "fp8")
TOP_K = 2048
STRIDE_ALIGN = 16  # tokens: the kernel stages 16-row tiles with 16 B loads
TOKENS_PER_BLOCK = 1024
TOPK_THREADS = 512
CAND_CAP = 16384  # positions the select keeps in shared memory (indexer.cu)
HIST1_BINS = 2048
_SOURCE = Path(__file__).with_name("indexer.cu")
_NVCC_FLAGS = ("-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a")


class IndexerResult(NamedTuple):
    """indices [R, k] int32 (ascending positions, -1 padding) and scores [R, stride] fp32
    (entries at t >= ctx[r] are not written)."""

    indices: Any
    scores: Any


# --------------------------------------------------------------------------------------------
# Row layout and the reference (numpy, no GPU)
# --------------------------------------------------------------------------------------------
def pack_key_rows(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., 128] e4m3 codes and [...] fp32 scales -> [..., 132] uint8 rows."""
    codes = np.asarray(codes, np.uint8)
    if codes.shape[-1] != HEAD_DIM:
        raise ValueError(f"key codes must be [..., {HEAD_DIM}], got {codes.shape}")
    sc = np.ascontiguousarray(np.asarray(scales, "<f4")).reshape(codes.shape[:-1] + (1,))
    return np.concatenate([codes, sc.view(np.uint8).reshape(codes.shape[:-1] + (4,))], axis=-1)


def unpack_key_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., 132] rows -> (values float64 [..., 128], scales float64 [...])."""
    rows = np.ascontiguousarray(rows, np.uint8)
    if rows.shape[-1] != ROW_BYTES:
        raise ValueError(f"key rows must be [..., {ROW_BYTES}] uint8, got {rows.shape}")
    vals = e4m3_decode(rows[..., :HEAD_DIM])
    scales = np.ascontiguousarray(rows[..., HEAD_DIM:]).view("<f4")[..., 0].astype(np.float64)
    return vals, scales


def query_values(q: np.ndarray, q_dtype: str) -> np.ndarray:
    """q as float64: bf16 bits (uint16) or e4m3 codes (uint8)."""
    return bf16_to_float(q) if q_dtype == "bf16" else e4m3_decode(q)


def reference_scores(keys: np.ndarray, q: np.ndarray, w: np.ndarray, ctx_len: np.ndarray, q_dtype: str) -> np.ndarray:
    """float64 scores [R, stride] (NaN at t >= ctx[r]) by the formula in the module docstring."""
    vals, scales = unpack_key_rows(keys)
    qv = query_values(q, q_dtype)
    out = np.full(keys.shape[:2], np.nan)
    for r, L in enumerate(np.asarray(ctx_len)):
        dots = vals[r, :L] @ qv[r].T  # [L, H]
        out[r, :L] = scales[r, :L] * (np.maximum(dots, 0.0) @ np.asarray(w[r], np.float64))
    return out


def reference_topk(scores: np.ndarray, ctx_len: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """[R, k] int32: per request the k highest scores (ties: lower position first), listed in
    ascending position order, -1 padding."""
    out = np.full((scores.shape[0], k), -1, np.int32)
    for r, L in enumerate(np.asarray(ctx_len)):
        s = np.asarray(scores[r, :L], np.float64) + 0.0  # -0 ranks as +0
        pos = np.arange(L)
        take = np.lexsort((pos, -s))[:k]
        out[r, : len(take)] = np.sort(take)
    return out


def order_keys(scores: np.ndarray) -> np.ndarray:
    """uint32 keys that sort like the fp32 scores (as the kernel's ``order_key``)."""
    f = np.asarray(scores, np.float32) + np.float32(0.0)
    u = f.view(np.uint32)
    return np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)


def _pick_bin(hist: np.ndarray, remaining: int) -> tuple[int, int]:
    """(bin from the top holding the remaining-th key, count of keys in the bins above it)."""
    above_incl = np.cumsum(hist[::-1])
    j = int(np.searchsorted(above_incl, remaining))  # first where the count reaches remaining
    b = len(hist) - 1 - j
    return b, int(above_incl[j] - hist[b])


def level1_candidates(scores: np.ndarray, ctx: int, k: int = TOP_K) -> int:
    """How many keys share the level-1 (top 11 bits) bin of the k-th largest: the kernel keeps
    their positions in shared memory when they fit in ``CAND_CAP``, else re-reads the row."""
    u = order_keys(scores[:ctx])
    b, _ = _pick_bin(np.bincount((u >> np.uint32(21)).astype(np.int64), minlength=2048), k)
    return int(((u >> np.uint32(21)) == b).sum())


def radix_topk(scores: np.ndarray, ctx_len: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """The kernel's select, step for step, in numpy: the level-1 histogram (bits 31..21, built by
    the scoring pass), level 2 (bits 20..10) over the row collecting the level-1 bin's positions
    as candidates, level 3 (bits 9..0) over the candidates (or the row when more than
    ``CAND_CAP``), which fixes the k-th largest key and how many of its equals to take; then an
    ordered pass takes every key above it and the lowest positions equal to it."""
    out = np.full((scores.shape[0], k), -1, np.int32)
    for r, L in enumerate(np.asarray(ctx_len)):
        if L <= k:
            out[r, :L] = np.arange(L)
            continue
        u = order_keys(scores[r, :L])
        b1, above = _pick_bin(np.bincount((u >> np.uint32(21)).astype(np.int64), minlength=2048), k)
        prefix, remaining = b1 << 21, k - above
        live = (u >> np.uint32(21)) == b1
        cand = np.flatnonzero(live)
        b2, above = _pick_bin(np.bincount(((u[cand] >> np.uint32(10)) & np.uint32(2047)).astype(np.int64),
                                          minlength=2048), remaining)
        prefix, remaining = prefix | (b2 << 10), remaining - above
        pool = u[cand] if len(cand) <= CAND_CAP else u
        third = pool[(pool & np.uint32(0xFFFFFC00)) == np.uint32(prefix)]
        b3, above = _pick_bin(np.bincount((third & np.uint32(1023)).astype(np.int64), minlength=1024), remaining)
        thr, need = np.uint32(prefix | b3), remaining - above
        eq = np.flatnonzero(u == thr)[:need]
        out[r] = np.sort(np.r_[np.flatnonzero(u > thr), eq])
    return out


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------
class IndexerDims(NamedTuple):
    batch: int
    heads: int
    stride: int
    q_dtype: str


def validate_inputs(keys: Any, q: Any, w: Any, ctx_len: Any, k: int) -> IndexerDims:
    """Shapes, dtypes and contiguity (numpy or cupy; no GPU needed). Raises ValueError naming the
    argument."""
    def arr(a, name, ndim):
        if not hasattr(a, "shape") or not hasattr(a, "dtype") or a.ndim != ndim:
            raise ValueError(f"{name} must be a {ndim}-d array, got {getattr(a, 'shape', type(a).__name__)}")
        if not a.flags["C_CONTIGUOUS"]:
            raise ValueError(f"{name} must be C-contiguous")

    arr(keys, "keys", 3)
    if np.dtype(keys.dtype) != np.uint8 or keys.shape[2] != ROW_BYTES:
        raise ValueError(f"keys must be [R, stride, {ROW_BYTES}] uint8 rows, got {tuple(keys.shape)} {keys.dtype}")
    batch, stride = int(keys.shape[0]), int(keys.shape[1])
    if batch < 1 or stride < STRIDE_ALIGN or stride % STRIDE_ALIGN:
        raise ValueError(f"keys: need R >= 1 and a stride that is a positive multiple of {STRIDE_ALIGN} tokens, "
                         f"got R={batch}, stride={stride}")
    arr(q, "q", 3)
    q_dtype = {np.dtype(np.uint16): "bf16", np.dtype(np.uint8): "fp8"}.get(np.dtype(q.dtype))
    if q_dtype is None:
        raise ValueError(f"q must be uint16 (bf16 bits) or uint8 (e4m3 codes), got {q.dtype}")
    if q.shape[0] != batch or q.shape[1] not in HEADS or q.shape[2] != HEAD_DIM:
        raise ValueError(f"q must be [R={batch}, H in {HEADS}, {HEAD_DIM}], got {tuple(q.shape)}")
    heads = int(q.shape[1])
    arr(w, "w", 2)
    if np.dtype(w.dtype) != np.float32 or tuple(w.shape) != (batch, heads):
        raise ValueError(f"w must be [R={batch}, H={heads}] float32, got {tuple(w.shape)} {w.dtype}")
    arr(ctx_len, "ctx_len", 1)
    if np.dtype(ctx_len.dtype) != np.int32 or ctx_len.shape[0] != batch:
        raise ValueError(f"ctx_len must be [R={batch}] int32, got {tuple(ctx_len.shape)} {ctx_len.dtype}")
    if not (isinstance(k, (int, np.integer)) and 1 <= k):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return IndexerDims(batch, heads, stride, q_dtype)


def padded_stride(max_ctx: int) -> int:
    """The smallest key-buffer stride (tokens) the kernel accepts for ``max_ctx`` tokens."""
    return max(STRIDE_ALIGN, -(-int(max_ctx) // STRIDE_ALIGN) * STRIDE_ALIGN)


# --------------------------------------------------------------------------------------------
# Build, load, launch
# --------------------------------------------------------------------------------------------
def compiled_cubin() -> Path:
    return build_cubin(_SOURCE, _NVCC_FLAGS, "indexer")


@cache
def _kernels(device_id: int) -> dict[str, Any]:
    import cupy as cp

    cc = cp.cuda.Device(device_id).compute_capability
    if cc != "90":
        raise RuntimeError(f"lightning_indexer needs a Hopper GPU (sm_90a); device has sm_{cc}")
    mod = cp.RawModule(path=str(compiled_cubin()))
    kerns: dict[str, Any] = {(qd, h): mod.get_function(f"indexer_score_{qd}_h{h}") for qd in Q_DTYPES for h in HEADS}
    kerns["topk"] = mod.get_function("indexer_topk")
    kerns["topk"].max_dynamic_shared_size_bytes = CAND_CAP * 4
    return kerns


def lightning_indexer(keys: Any, q: Any, w: Any, ctx_len: Any, k: int = TOP_K, *, max_ctx: int | None = None,
                      out: Any | None = None, scores: Any | None = None, hist: Any | None = None,
                      select: bool = True) -> IndexerResult:
    """Scores and exact top-k for every request (two launches on the current stream).

    keys [R, stride, 132] uint8, q [R, H, 128] uint16/uint8, w [R, H] fp32, ctx_len [R] int32
    (each <= stride), all cupy arrays. ``max_ctx`` (an upper bound of ctx_len, default stride)
    sizes the grid; pass it to skip blocks of empty rows. ``out``/``scores``: preallocated outputs
    (needed to capture the call into a CUDA graph); ``hist``: a [R, 2048] uint32 workspace for the
    scoring pass's histogram of the scores' top 11 bits (zeroed here). ``select=False`` runs the scoring launch
    alone (``indices`` is then None): the benchmark's split of the time.
    """
    import cupy as cp

    dims = validate_inputs(keys, q, w, ctx_len, k)
    for name, a in (("keys", keys), ("q", q), ("w", w), ("ctx_len", ctx_len)):
        if not isinstance(a, cp.ndarray):
            raise ValueError(f"{name} must be a cupy array on the GPU")
    bound = dims.stride if max_ctx is None else min(int(max_ctx), dims.stride)
    if scores is None:
        scores = cp.empty((dims.batch, dims.stride), cp.float32)
    elif scores.shape != (dims.batch, dims.stride) or scores.dtype != cp.float32 or not scores.flags.c_contiguous:
        raise ValueError(f"scores must be a contiguous [R, stride] = {(dims.batch, dims.stride)} float32 cupy array")
    if not select:
        out = None
    elif out is None:
        out = cp.empty((dims.batch, k), cp.int32)
    elif out.shape != (dims.batch, k) or out.dtype != cp.int32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous [R, k] = {(dims.batch, k)} int32 cupy array")
    if hist is None:
        hist = cp.empty((dims.batch, HIST1_BINS), cp.uint32)
    elif hist.shape != (dims.batch, HIST1_BINS) or hist.dtype != cp.uint32 or not hist.flags.c_contiguous:
        raise ValueError(f"hist must be a contiguous [R, {HIST1_BINS}] uint32 cupy array")
    hist.fill(0)
    kerns = _kernels(keys.device.id)
    grid = (max(1, -(-bound // TOKENS_PER_BLOCK)), dims.batch)
    kerns[(dims.q_dtype, dims.heads)](grid, (256,), (keys, q, w, ctx_len, scores, hist, np.int64(dims.stride)))
    if select:
        kerns["topk"]((dims.batch,), (TOPK_THREADS,), (scores, hist, ctx_len, np.int64(dims.stride), np.int32(k), out),
                      shared_mem=CAND_CAP * 4)
    return IndexerResult(out, scores)


def key_bytes(ctx_len: Any) -> int:
    """Bytes of key rows the scoring pass must read (each row once)."""
    return int(np.asarray(ctx_len, np.int64).sum()) * ROW_BYTES


def random_key_rows(cp: Any, rows: int, seed: int = 0, scale: float = 0.05) -> Any:
    """[rows, 132] uint8 random finite e4m3 codes with a constant fp32 scale, made on the GPU
    (benchmarks and calibration: never time zeros)."""
    cp.random.seed(seed)
    flat = cp.random.randint(0, 254, rows * ROW_BYTES, dtype=cp.uint8).reshape(rows, ROW_BYTES)
    flat += flat >= 0x7F  # codes 0x00-0x7E and 0x80-0xFE: no NaN (0x7F, 0xFF)
    flat[:, HEAD_DIM:] = cp.asarray(np.frombuffer(np.float32(scale).tobytes(), np.uint8))
    return flat

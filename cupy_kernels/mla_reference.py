"""CPU side of the sparse MLA decode kernel: row formats and a float64 reference.

Pure numpy, so tests and tools can build inputs and check results without CuPy or a GPU.

Row layouts (one row per KV slot, absorbed MLA: K = the whole row, V = its first 512 values):
- bf16: 576 bf16 values (1152 B), stored as uint16 bit patterns.
- fp8: 656 B = 512 e4m3 values, 4 little-endian fp32 scales (one per 128 values),
  64 bf16 rope values.  A value is e4m3 * scale of its 128-value block.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
FP8_BLOCK = 128
N_SCALES = D_LATENT // FP8_BLOCK
BF16_ROW_BYTES = D_QK * 2
FP8_ROW_BYTES = D_LATENT + 4 * N_SCALES + 2 * D_ROPE
E4M3_MAX = 448.0
_SCALE_OFFSET = D_LATENT
_ROPE_OFFSET = D_LATENT + 4 * N_SCALES


# --------------------------------------------------------------------------------------------
# bf16
# --------------------------------------------------------------------------------------------
def bf16_to_float(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float_to_bf16(x: np.ndarray) -> np.ndarray:
    """float -> bf16 bit patterns, round to nearest even (what the GPU's conversion does)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    out[nan] = 0x7FC0
    return out


# --------------------------------------------------------------------------------------------
# FP8 e4m3 (OCP "fn" variant: no infinities, 0x7F / 0xFF are NaN, max 448)
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def e4m3_table() -> np.ndarray:
    """Value of each of the 256 e4m3 codes as float64 (NaN for 0x7F and 0xFF)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    normal = (1.0 + man / 8.0) * np.exp2(exp - 7.0)
    subnormal = (man / 8.0) * 2.0**-6
    vals = sign * np.where(exp == 0, subnormal, normal)
    vals[(codes & 0x7F) == 0x7F] = np.nan
    vals.setflags(write=False)
    return vals


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    """e4m3 codes (uint8) -> float64 values."""
    return e4m3_table()[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float -> e4m3 codes: round to nearest, ties to even, saturate at +-448, NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float64)
    mag = np.minimum(np.abs(x), E4M3_MAX)
    pos = e4m3_table()[:0x7F]  # codes 0..126, increasing magnitude
    hi = np.clip(np.searchsorted(pos, mag, side="left"), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = mag - pos[lo], pos[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code |= np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    code[np.isnan(x)] = 0x7F
    return code


# --------------------------------------------------------------------------------------------
# Row packing
# --------------------------------------------------------------------------------------------
def pack_bf16_rows(rows: np.ndarray) -> np.ndarray:
    """[N, 576] floats -> [N, 576] uint16 bf16 rows."""
    rows = np.asarray(rows)
    _check_rows(rows)
    return float_to_bf16(rows)


def unpack_bf16_rows(packed: np.ndarray) -> np.ndarray:
    """[N, 576] uint16 bf16 rows -> [N, 576] float64."""
    return bf16_to_float(packed).astype(np.float64)


def pack_fp8_rows(rows: np.ndarray) -> np.ndarray:
    """[N, 576] floats -> [N, 656] uint8 rows; scale = block amax / 448 (1 for an all-zero block)."""
    rows = np.asarray(rows, dtype=np.float64)
    _check_rows(rows)
    n = rows.shape[0]
    latent = rows[:, :D_LATENT].reshape(n, N_SCALES, FP8_BLOCK)
    amax = np.abs(latent).max(axis=2)
    scales = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    codes = e4m3_encode(latent / scales[:, :, None].astype(np.float64)).reshape(n, D_LATENT)
    out = np.empty((n, FP8_ROW_BYTES), dtype=np.uint8)
    out[:, :_SCALE_OFFSET] = codes
    out[:, _SCALE_OFFSET:_ROPE_OFFSET] = scales.astype("<f4").view(np.uint8).reshape(n, -1)
    rope = float_to_bf16(rows[:, D_LATENT:]).astype("<u2")
    out[:, _ROPE_OFFSET:] = rope.view(np.uint8).reshape(n, -1)
    return out


def _fp8_row_parts(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N, 656] uint8 rows -> (e4m3 values [N, 4, 128] float64, block scales [N, 4] float32, rope
    [N, 64] float64), checking the shape."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    if packed.ndim != 2 or packed.shape[1] != FP8_ROW_BYTES:
        raise ValueError(f"fp8 rows must be [N, {FP8_ROW_BYTES}] uint8, got {packed.shape}")
    n = packed.shape[0]
    vals = e4m3_decode(packed[:, :_SCALE_OFFSET]).reshape(n, N_SCALES, FP8_BLOCK)
    scales = packed[:, _SCALE_OFFSET:_ROPE_OFFSET].copy().view("<f4")
    rope = bf16_to_float(packed[:, _ROPE_OFFSET:].copy().view("<u2")).astype(np.float64)
    return vals, scales, rope


def _join(latent: np.ndarray, rope: np.ndarray) -> np.ndarray:
    n = rope.shape[0]
    out = np.empty((n, D_QK), dtype=np.float64)
    out[:, :D_LATENT] = latent.reshape(n, D_LATENT)
    out[:, D_LATENT:] = rope
    return out


def unpack_fp8_rows(packed: np.ndarray) -> np.ndarray:
    """[N, 656] uint8 rows -> [N, 576] float64 dequantised values."""
    vals, scales, rope = _fp8_row_parts(packed)
    return _join(vals * scales.astype(np.float64)[:, :, None], rope)


def dequant_fp8_rows_bf16(packed: np.ndarray) -> np.ndarray:
    """[N, 656] uint8 rows -> [N, 576] float64: the bf16 values the attention kernel's tensor
    cores see, bf16(e4m3 * bf16(scale)) for the latent part and the stored bf16 rope values.

    The kernel rounds each block's fp32 scale to bf16 and the product once, as FlashMLA's SM90
    FP8 decode does (csrc/sm90/decode/sparse_fp8/components/dequant.h): this is that rounding,
    so a test can hold the GPU's dequantisation to it bit for bit.  e4m3 NaN codes stay NaN here
    (the packer never writes them; the kernel decodes them to +-480 * scale).
    """
    vals, scales, rope = _fp8_row_parts(packed)
    scales_bf16 = bf16_to_float(float_to_bf16(scales)).astype(np.float64)
    # e4m3 (4 significant bits) x bf16 (8) is exact in float64 and in float32 (12 bits, lsb >=
    # 2^-142), so float_to_bf16's one rounding of it is the GPU's one rounding of the product.
    return _join(bf16_to_float(float_to_bf16(vals * scales_bf16[:, :, None])).astype(np.float64), rope)


def _check_rows(rows: np.ndarray) -> None:
    if rows.ndim != 2 or rows.shape[1] != D_QK:
        raise ValueError(f"rows must be [N, {D_QK}], got {rows.shape}")


# --------------------------------------------------------------------------------------------
# Reference attention
# --------------------------------------------------------------------------------------------
def mla_decode_reference(
    q: np.ndarray, rows: np.ndarray, slots: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Float64 absorbed-MLA sparse decode: out [B, H, 512] and natural-log lse [B, H].

    q: [B, H, 576] values; rows: [N, 576] values (already dequantised); slots: [B, k] ints.
    A slot outside [0, N) (e.g. -1) is masked.  A request with every slot masked gets
    out = 0 and lse = -inf, the kernel's documented result.
    MTP: q [B, T, H, 576] holds T query tokens per request; slots [B, k] is shared by them, or
    [B, T, k] gives each token its own selection.  Outputs are then [B, T, H, 512] and [B, T, H]:
    token t is the 3-D call on q[:, t] with its slots.
    """
    q = np.asarray(q, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.float64)
    slots = np.asarray(slots)
    if q.ndim == 4:
        if slots.ndim == 3 and slots.shape[:2] != q.shape[:2]:
            raise ValueError(f"slots must be [B, k] or [B, T, k] for q {q.shape}, got {slots.shape}")
        parts = [mla_decode_reference(q[:, t], rows, slots[:, t] if slots.ndim == 3 else slots, scale)
                 for t in range(q.shape[1])]
        return np.stack([o for o, _ in parts], axis=1), np.stack([lse for _, lse in parts], axis=1)
    if q.ndim != 3 or q.shape[2] != D_QK:
        raise ValueError(f"q must be [B, H, {D_QK}], got {q.shape}")
    _check_rows(rows)
    if slots.ndim != 2 or slots.shape[0] != q.shape[0]:
        raise ValueError(f"slots must be [B, k] with B = {q.shape[0]}, got {slots.shape}")
    b_n, h_n = q.shape[:2]
    out = np.zeros((b_n, h_n, D_LATENT))
    lse = np.full((b_n, h_n), -np.inf)
    for b in range(b_n):
        sel = slots[b][(slots[b] >= 0) & (slots[b] < rows.shape[0])]
        if sel.size == 0:
            continue
        kv = rows[sel]
        s = scale * (q[b] @ kv.T)
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        denom = e.sum(axis=1, keepdims=True)
        out[b] = (e / denom) @ kv[:, :D_LATENT]
        lse[b] = (m + np.log(denom))[:, 0]
    return out, lse


def attention_flops(batch: int, heads: int, k: int) -> float:
    """Tensor-core FLOPs of one decode call: S = Q K^T (576) and O = P V (512)."""
    return 2.0 * batch * heads * k * (D_QK + D_LATENT)


def gathered_kv_bytes(batch: int, k: int, kv_dtype: str) -> float:
    """Bytes of the rows one call gathers (each request's k rows once): the bandwidth figure of
    the few-heads shapes, which are bound by this gather rather than by the tensor cores."""
    return float(batch * k * (BF16_ROW_BYTES if kv_dtype == "bf16" else FP8_ROW_BYTES))


def attention_min_bytes(batch: int, heads: int, k: int, kv_dtype: str) -> float:
    """Fewest HBM bytes of one call: q, each gathered row once, slots, out, lse."""
    row = BF16_ROW_BYTES if kv_dtype == "bf16" else FP8_ROW_BYTES
    return float(batch * (heads * D_QK * 2 + k * (row + 4) + heads * (D_LATENT * 2 + 4)))

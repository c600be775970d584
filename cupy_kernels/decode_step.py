"""One HiSparse decode step for one layer: swap-in, then sparse MLA attention on the same buffers.

The swap-in kernel brings each request's missing top-k rows into its hot buffer and returns, per
selected entry, the row of the layer's device buffer to read (``global_rows=True``); attention
then reads exactly those rows. This is the unit the serving model's calibration times.
CuPy is imported lazily (``kv_dtype_for_row_bytes`` works without it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .mla_reference import BF16_ROW_BYTES, D_QK, FP8_ROW_BYTES
from .sparse_attention import sparse_mla_decode
from .swap_in import HotBuffer


class DecodeStepResult(NamedTuple):
    """out [R, H, 512] bf16 bits, lse [R, H] fp32, slots [R, k] device rows read, misses [R]."""

    out: Any
    lse: Any
    slots: Any
    misses: Any


def kv_dtype_for_row_bytes(row_bytes: int) -> str:
    """The attention layout a hot-buffer row size holds: 1152 B bf16 or 656 B fp8 MLA rows."""
    if row_bytes == BF16_ROW_BYTES:
        return "bf16"
    if row_bytes == FP8_ROW_BYTES:
        return "fp8"
    raise ValueError(f"attention needs {BF16_ROW_BYTES} B (bf16) or {FP8_ROW_BYTES} B (fp8) rows, "
                     f"got a hot buffer of {row_bytes} B rows")


def decode_step(buffer: HotBuffer, layer: int, q: Any, indices: Any, ctx_len: Any, scale: float, *,
                check: bool = True, out: Any | None = None, lse: Any | None = None,
                workspace: Any | None = None) -> DecodeStepResult:
    """Swap-in then attention for one layer of every request in ``buffer``.

    q: [R, H, 576] uint16 (bf16) cupy array; indices [R, k] and ctx_len [R] as for
    ``HotBuffer.swap_in``; scale: softmax scale. Padding entries are masked in attention; the
    newest token is read from its reserved slot. Both kernels run on the current stream.
    """
    kv_dtype = kv_dtype_for_row_bytes(buffer.geometry.row_bytes)
    res = buffer.swap_in(layer, indices, ctx_len, global_rows=True, check=check)
    kv = buffer.device_rows(layer)
    if kv_dtype == "bf16":
        kv = kv.view("uint16").reshape(kv.shape[0], D_QK)
    att = sparse_mla_decode(q, kv, res.slots, scale, kv_dtype, out=out, lse=lse, workspace=workspace)
    return DecodeStepResult(att.out, att.lse, res.slots, res.misses)

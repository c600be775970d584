"""CPU checks of the decode-step wrapper: which attention layout a hot buffer's rows hold."""

from __future__ import annotations

import pytest

from cupy_kernels.decode_step import kv_dtype_for_row_bytes


def test_row_bytes_pick_the_attention_layout():
    assert kv_dtype_for_row_bytes(656) == "fp8"
    assert kv_dtype_for_row_bytes(1152) == "bf16"


def test_rejects_rows_attention_cannot_read():
    with pytest.raises(ValueError, match="got a hot buffer of 512 B rows"):
        kv_dtype_for_row_bytes(512)

"""GPU check of one decode step (swap-in, then sparse MLA attention on the same hot buffers).

Over several steps with misses, the attention output must match the float64 reference computed
on the host rows of the selected positions (what the swap-in should have gathered).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from cupy_kernels.decode_step import decode_step
from cupy_kernels.mla_reference import (
    BF16_ROW_BYTES,
    D_QK,
    FP8_ROW_BYTES,
    float_to_bf16,
    mla_decode_reference,
    pack_fp8_rows,
    unpack_bf16_rows,
    unpack_fp8_rows,
)
from cupy_kernels.swap_in import HotBuffer

pytestmark = pytest.mark.gpu
REL_TOL = 1e-2


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_decode_step_matches_reference(kv_dtype):
    import cupy as cp

    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    n_req, heads, k, buffer, max_ctx = 3, 64, 256, 512, 1500
    row_bytes = BF16_ROW_BYTES if kv_dtype == "bf16" else FP8_ROW_BYTES
    hb = HotBuffer(layers=2, requests=n_req, max_ctx=max_ctx, device_buffer_size=buffer, top_k=k,
                   row_bytes=row_bytes)
    values = rng.standard_normal((n_req * max_ctx, D_QK)) * rng.uniform(0.2, 3.0, (n_req * max_ctx, 1))
    if kv_dtype == "bf16":
        packed = float_to_bf16(values)
        rows_seen = unpack_bf16_rows(packed)
        hb.host_rows(1)[:] = packed.view(np.uint8).reshape(n_req, max_ctx, row_bytes)
    else:
        packed = pack_fp8_rows(values)
        rows_seen = unpack_fp8_rows(packed)
        hb.host_rows(1)[:] = packed.reshape(n_req, max_ctx, row_bytes)
    hb.device_rows(1).fill(0xFF)  # poison (NaN bit patterns in both layouts)
    ctx0 = np.array([1000, 1200, 700], np.int64)
    for step in range(4):
        ctx = ctx0 + step
        idx = np.full((n_req, k), -1, np.int32)
        for r in range(n_req):
            n = k if r != 2 else k - 40  # request 2: padded
            sel = rng.choice(ctx[r] - 1, n - 1, replace=False)
            idx[r, :n] = rng.permutation(np.r_[sel, ctx[r] - 1])
        q_bits = float_to_bf16(rng.standard_normal((n_req, heads, D_QK)))
        res = decode_step(hb, 1, cp.asarray(q_bits), idx, ctx, D_QK**-0.5)
        got = (cp.asnumpy(res.out).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        flat = np.where(idx >= 0, idx + np.arange(n_req)[:, None] * max_ctx, -1)
        ref, ref_lse = mla_decode_reference(unpack_bf16_rows(q_bits.reshape(-1, D_QK)).reshape(q_bits.shape),
                                            rows_seen, flat, D_QK**-0.5)
        msg = f"seed={seed} kv={kv_dtype} step={step}"
        assert not np.isnan(got).any(), msg
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert rel <= REL_TOL, f"out rel err {rel:.2e} ({msg})"
        lse_err = np.abs(res.lse.get() - ref_lse).max()
        assert lse_err <= REL_TOL * max(1.0, np.abs(ref_lse).max()), f"lse err {lse_err:.2e} ({msg})"
        assert int(res.misses.get().sum()) > 0 or step > 0, msg
        slots = res.slots.get()
        assert ((slots >= 0) == (idx >= 0)).all(), msg
        assert (slots[idx >= 0] // (buffer + 1) == np.nonzero(idx >= 0)[0]).all(), msg  # own request's rows


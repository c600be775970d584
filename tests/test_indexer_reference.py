"""CPU twin of the lightning-indexer kernel: the row layout, the score formula and the kernel's
radix select (``radix_topk``, a numpy transcription of ``indexer_topk``) against a plain
lexicographic top-k, on inputs full of ties. Always runs; the GPU tests check the kernel
against the same functions."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_kernels.indexer import (
    HEAD_DIM,
    ROW_BYTES,
    order_keys,
    pack_key_rows,
    padded_stride,
    radix_topk,
    reference_scores,
    reference_topk,
    unpack_key_rows,
    validate_inputs,
)
from cupy_kernels.mla_reference import e4m3_encode, float_to_bf16


def test_row_layout_round_trip_and_e4m3_decode_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, (40, HEAD_DIM), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x10  # no NaN codes
    scales = rng.uniform(0.01, 3.0, 40).astype(np.float32)
    rows = pack_key_rows(codes, scales)
    assert rows.shape == (40, ROW_BYTES) and rows.dtype == np.uint8
    vals, sc = unpack_key_rows(rows)
    assert np.array_equal(sc, scales.astype(np.float64))
    ref = torch.from_numpy(codes).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    assert np.array_equal(vals, ref)


def test_reference_scores_by_hand():
    # one request, 2 heads padded to the layout's 128 dims, 3 tokens
    codes = np.zeros((1, 16, HEAD_DIM), np.uint8)
    codes[0, 0, :2] = e4m3_encode(np.array([1.0, 2.0]))
    codes[0, 1, :2] = e4m3_encode(np.array([-1.0, 1.0]))
    codes[0, 2, :2] = e4m3_encode(np.array([0.5, 0.0]))
    keys = pack_key_rows(codes, np.array([[2.0, 1.0, 4.0] + [1.0] * 13], np.float32))
    q = np.zeros((1, 32, HEAD_DIM))
    q[0, 0, :2] = [1.0, 1.0]
    q[0, 1, :2] = [-1.0, 0.0]
    w = np.zeros((1, 32), np.float32)
    w[0, :2] = [3.0, -2.0]
    s = reference_scores(keys, float_to_bf16(q), w, np.array([3]), "bf16")
    # t0: dots (3, -1) -> 3*3 = 9, x2 = 18; t1: (0, 1) -> -2, x1; t2: (0.5, -0.5) -> 1.5, x4 = 6
    assert np.allclose(s[0, :3], [18.0, -2.0, 6.0]) and np.isnan(s[0, 3:]).all()


def _tie_scores(rng, R, stride, levels):
    s = rng.integers(-levels, levels + 1, (R, stride)).astype(np.float32) * np.float32(0.25)
    s[:, ::7] = -0.0  # negative zero must rank as zero
    return s


@pytest.mark.parametrize("seed", range(6))
def test_radix_select_equals_sorted_topk_with_ties(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 7, 64, 2048]))
    R, stride = 5, 6000
    scores = _tie_scores(rng, R, stride, levels=int(rng.choice([1, 3, 50, 10_000])))
    ctx = np.array([k - 1 if k > 1 else 1, k, k + 1, stride, int(rng.integers(1, stride))])
    got, want = radix_topk(scores, ctx, k), reference_topk(scores, ctx, k)
    assert np.array_equal(got, want), f"seed {seed}, k {k}"
    for r, L in enumerate(ctx):
        sel = want[r][want[r] >= 0]
        assert len(sel) == min(k, L) and (np.diff(sel) > 0).all()


def test_ties_go_to_lower_positions():
    scores = np.zeros((1, 10), np.float32)
    scores[0, 8] = 1.0
    got = radix_topk(scores, np.array([10]), 3)
    assert got.tolist() == [[0, 1, 8]]
    assert reference_topk(scores, np.array([10]), 3).tolist() == [[0, 1, 8]]


def test_radix_select_random_floats_match():
    rng = np.random.default_rng(11)
    scores = (rng.standard_normal((3, 40000)) * np.exp(rng.uniform(-20, 20, (3, 40000)))).astype(np.float32)
    ctx = np.array([40000, 33333, 2049])
    assert np.array_equal(radix_topk(scores, ctx), reference_topk(scores, ctx))


def test_order_keys_preserve_float_order():
    f = np.array([-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-38, 2.0, np.inf], np.float32)
    u = order_keys(f)
    assert (np.diff(u.astype(np.int64)) >= 0).all() and u[3] == u[4]


def test_validate_inputs_names_the_argument():
    keys = np.zeros((2, 32, ROW_BYTES), np.uint8)
    q = np.zeros((2, 32, HEAD_DIM), np.uint16)
    w = np.zeros((2, 32), np.float32)
    ctx = np.array([5, 32], np.int32)
    assert validate_inputs(keys, q, w, ctx, 2048).q_dtype == "bf16"
    assert validate_inputs(keys, q.astype(np.uint8), w, ctx, 2048).q_dtype == "fp8"
    with pytest.raises(ValueError, match="stride"):
        validate_inputs(np.zeros((2, 30, ROW_BYTES), np.uint8), q, w, ctx, 2048)
    with pytest.raises(ValueError, match="q must be"):
        validate_inputs(keys, np.zeros((2, 48, HEAD_DIM), np.uint16), w, ctx, 2048)
    with pytest.raises(ValueError, match="w must be"):
        validate_inputs(keys, q, w.astype(np.float64), ctx, 2048)
    with pytest.raises(ValueError, match="ctx_len"):
        validate_inputs(keys, q, w, ctx.astype(np.int64), 2048)
    assert padded_stride(160_000) == 160_000 and padded_stride(17) == 32

"""GPU checks of the lightning-indexer kernel against the numpy reference (tests/
test_indexer_reference.py is the CPU twin of the same semantics).

Integer-valued inputs make every score exact in fp32 whatever the tensor cores' summation order,
so there the kernel must give the reference's scores bit for bit and the same top-k, with
plenty of ties; on general random inputs the scores agree to rounding and the top-k equals the
exact top-k of the kernel's own scores. Fresh seeds every run (printed on failure); outputs are
poisoned before each launch.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from cupy_kernels.indexer import (
    CAND_CAP,
    HEAD_DIM,
    level1_candidates,
    lightning_indexer,
    pack_key_rows,
    padded_stride,
    reference_scores,
    reference_topk,
)
from cupy_kernels.mla_reference import e4m3_encode, float_to_bf16

pytestmark = pytest.mark.gpu


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _case(seed, ctx, heads, q_dtype, integer):
    rng = np.random.default_rng(seed)
    R, stride = len(ctx), padded_stride(max(ctx))
    if integer:
        kv = rng.integers(-4, 5, (R, stride, HEAD_DIM)).astype(np.float64)
        qv = rng.integers(-3, 4, (R, heads, HEAD_DIM)).astype(np.float64)
        w = rng.integers(-2, 4, (R, heads)).astype(np.float32)
        sc = np.exp2(rng.integers(-3, 4, (R, stride))).astype(np.float32)
    else:
        kv = rng.standard_normal((R, stride, HEAD_DIM)) * 2
        qv = rng.standard_normal((R, heads, HEAD_DIM))
        w = rng.uniform(-0.5, 1.0, (R, heads)).astype(np.float32)
        sc = rng.uniform(0.01, 0.2, (R, stride)).astype(np.float32)
    keys = pack_key_rows(e4m3_encode(kv), sc)
    q = float_to_bf16(qv) if q_dtype == "bf16" else e4m3_encode(qv)
    return keys, q, w, np.asarray(ctx, np.int32)


def _run(keys, q, w, ctx, k):
    import cupy as cp

    R, stride = keys.shape[:2]
    scores = cp.full((R, stride), np.nan, cp.float32)
    out = cp.full((R, k), -7, cp.int32)
    res = lightning_indexer(cp.asarray(keys), cp.asarray(q), cp.asarray(w), cp.asarray(ctx), k, out=out, scores=scores)
    return res.scores.get(), res.indices.get()


@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("heads", [32, 64])
def test_exact_on_integer_inputs(q_dtype, heads):
    seed = _seed()
    ctx = [1, 100, 2048, 2049, 5003, 40_000]
    keys, q, w, c = _case(seed, ctx, heads, q_dtype, integer=True)
    got_s, got_i = _run(keys, q, w, c, 2048)
    ref_s = reference_scores(keys, q, w, c, q_dtype)
    for r, L in enumerate(ctx):
        assert np.array_equal(got_s[r, :L].astype(np.float64), ref_s[r, :L]), f"seed {seed}, request {r}"
    assert np.array_equal(got_i, reference_topk(ref_s, c, 2048)), f"seed {seed}"


@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
def test_exact_at_160k_tokens(q_dtype):
    seed = _seed()
    ctx = [160_000, 131_071]
    keys, q, w, c = _case(seed, ctx, 64 if q_dtype == "fp8" else 32, q_dtype, integer=True)
    got_s, got_i = _run(keys, q, w, c, 2048)
    ref_s = reference_scores(keys, q, w, c, q_dtype)
    assert np.array_equal(got_i, reference_topk(ref_s, c, 2048)), f"seed {seed}"


@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
def test_random_inputs_scores_to_rounding_and_exact_select(q_dtype):
    seed = _seed()
    ctx = [3000, 17, 65_536, 9_999]
    keys, q, w, c = _case(seed, ctx, 64, q_dtype, integer=False)
    got_s, got_i = _run(keys, q, w, c, 2048)
    ref_s = reference_scores(keys, q, w, c, q_dtype)
    for r, L in enumerate(ctx):
        err = np.abs(got_s[r, :L] - ref_s[r, :L]).max() / np.abs(ref_s[r, :L]).max()
        assert err < (1e-5 if q_dtype == "bf16" else 1e-3), f"seed {seed}, request {r}: {err}"
    assert np.array_equal(got_i, reference_topk(got_s, c, 2048)), f"seed {seed}: select not exact"
    ref_i = reference_topk(ref_s, c, 2048)
    for r in range(len(ctx)):
        a, b = set(got_i[r][got_i[r] >= 0]), set(ref_i[r][ref_i[r] >= 0])
        assert len(a ^ b) <= 0.01 * len(b) + 2, f"seed {seed}: top-k sets differ by {len(a ^ b)}"


@pytest.mark.parametrize("path", ["candidates", "row"])
def test_exact_select_on_both_candidate_paths(path):
    """Keys of all ones, one head of ones (weight 1) and the rest zero give every token the head
    sum 128, so the scores are 128 x the token's scale, and the scales pick the select's path:
    within 2.4% of each other (one level-1 bin) the level-1 bin holds the whole row, more than
    CAND_CAP (the select re-reads the row); spread over 41 exponents it holds ~1K (the candidates
    stay in shared memory). Scales on coarse grids give many ties at the threshold."""
    seed = _seed()
    rng = np.random.default_rng(seed)
    ctx = [150_000, 100_003]
    R, stride, heads = len(ctx), padded_stride(max(ctx)), 32
    codes = np.full((R, stride, HEAD_DIM), e4m3_encode(np.array([1.0]))[0], np.uint8)
    if path == "row":
        sc = (1.0 + rng.integers(0, 100, (R, stride)) / 4096.0).astype(np.float32)
    else:
        sc = (np.exp2(rng.integers(-20, 21, (R, stride))) * (1 + rng.integers(0, 8, (R, stride)) / 8)).astype(np.float32)
    keys = pack_key_rows(codes, sc)
    qv = np.zeros((R, heads, HEAD_DIM))
    qv[:, 0] = 1.0
    q = float_to_bf16(qv)
    w = np.ones((R, heads), np.float32)
    c = np.asarray(ctx, np.int32)
    got_s, got_i = _run(keys, q, w, c, 2048)
    want_s = sc * np.float32(128.0)
    for r, L in enumerate(ctx):
        assert np.array_equal(got_s[r, :L], want_s[r, :L]), f"seed {seed}, request {r}"
        n = level1_candidates(want_s[r], L)
        assert (n > CAND_CAP) == (path == "row"), f"seed {seed}: {n} candidates do not exercise the {path} path"
    assert np.array_equal(got_i, reference_topk(want_s, c, 2048)), f"seed {seed}"

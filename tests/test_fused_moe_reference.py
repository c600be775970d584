"""CPU checks of the fused-MoE GEMM's reference semantics (``cupy_kernels/fused_moe_reference.py``;
tests/test_fused_moe_gpu.py holds the Triton kernel to the same function): the expert-sorted,
padded row list, per-token-group FP8 quantisation, and the block-scaled product."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cupy_kernels import fused_moe_reference as ref


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


@pytest.mark.parametrize("tokens,experts,top_k,block_m", [(1, 256, 8, 16), (7, 16, 4, 32), (64, 32, 8, 64), (0, 8, 2, 16)])
def test_align_block_size_groups_every_row_once(tokens, experts, top_k, block_m):
    seed = _seed()
    ids, w = ref.uniform_routing(tokens, experts, top_k, seed)
    assert ids.shape == (tokens, top_k) and all(len(set(r)) == top_k for r in ids)
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-6)
    al = ref.align_block_size(ids, experts, block_m)
    valid = tokens * top_k
    assert al.valid == valid and al.padded % block_m == 0 and al.capacity % block_m == 0
    assert al.capacity >= valid + experts * (block_m - 1) >= al.padded
    used = al.sorted_ids[: al.padded]
    real = used[used < valid]
    assert sorted(real.tolist()) == list(range(valid)), f"seed {seed}: a row missing or repeated"
    assert (al.sorted_ids[al.padded:] == valid).all()
    flat = ids.reshape(-1)
    for b in range(al.padded // block_m):
        blk = al.sorted_ids[b * block_m:(b + 1) * block_m]
        blk = blk[blk < valid]
        assert blk.size, f"seed {seed}: block {b} holds only padding"
        assert (flat[blk] == al.expert_ids[b]).all(), f"seed {seed}: block {b} mixes experts"
        assert (np.diff(blk) > 0).all()  # token order inside an expert
    touched = np.unique(flat).size
    assert al.experts_touched == touched
    # the padding is the least that makes every expert's rows a whole number of blocks
    counts = np.bincount(flat, minlength=experts)
    assert al.padded == int((-(-counts // block_m) * block_m).sum())


def test_align_rejects_bad_expert_ids():
    with pytest.raises(ValueError, match="expert ids"):
        ref.align_block_size(np.array([[0, 9]]), 8, 16)
    with pytest.raises(ValueError, match="top_k"):
        ref.uniform_routing(2, 4, 5, 0)


def test_token_group_quantisation_round_trips_within_e4m3():
    rng = np.random.default_rng(_seed())
    x = rng.standard_normal((5, 384)).astype(np.float32) * rng.uniform(0.01, 10, (5, 1)).astype(np.float32)
    codes, scale = ref.quant_token_groups(x)
    assert scale.shape == (5, 3)
    assert np.abs(codes).max() <= ref.FP8_MAX
    # every group uses the top of the e4m3 range (its absmax maps to 448)
    assert np.allclose(np.abs(codes).reshape(5, 3, 128).max(axis=2), ref.FP8_MAX)
    back = codes * np.repeat(scale, 128, axis=1)
    assert np.abs(back - x).max() <= np.abs(x).max() * 2 ** -3  # e4m3: 3 mantissa bits
    assert (ref.fp8_round(codes) == codes).all()  # codes are e4m3 values
    with pytest.raises(ValueError, match="multiple of 128"):
        ref.quant_token_groups(x[:, :100])


def _case(seed, tokens, experts, top_k, n, k, block_m):
    rng = np.random.default_rng(seed)
    ids, rw = ref.uniform_routing(tokens, experts, top_k, seed)
    a_codes, a_scale = ref.quant_token_groups(rng.standard_normal((tokens, k)).astype(np.float32))
    w_codes = ref.fp8_round(rng.standard_normal((experts, n, k)) * 2)
    w_scale = rng.uniform(0.005, 0.02, (experts, n // 128, k // 128)).astype(np.float32)
    return ids, rw, a_codes, a_scale, w_codes, w_scale, ref.align_block_size(ids, experts, block_m)


@pytest.mark.parametrize("block_m", [16, 64])
def test_block_scaled_product_equals_per_row_dequantised_matmul(block_m):
    """The reference's grouped launch = for every (token, slot): dequantised activation row x the
    chosen expert's dequantised weights, block scales applied K block by K block."""
    seed = _seed()
    tokens, experts, top_k, n, k = 6, 8, 3, 256, 384
    ids, rw, a_c, a_s, w_c, w_s, al = _case(seed, tokens, experts, top_k, n, k, block_m)
    out = ref.fused_moe_gemm_ref(a_c, a_s, w_c, w_s, al, top_k)
    assert not np.isnan(out).any(), f"seed {seed}: a valid row was not computed"
    for t in range(tokens):
        for j in range(top_k):
            e = ids[t, j]
            acc = np.zeros(n)
            for kb in range(k // 128):
                sl = slice(kb * 128, (kb + 1) * 128)
                part = w_c[e][:, sl].astype(np.float64) @ a_c[t, sl].astype(np.float64)
                acc += part * a_s[t, kb] * np.repeat(w_s[e][:, kb], 128)[:n]
            assert np.allclose(out[t * top_k + j], acc, rtol=1e-12, atol=1e-9), f"seed {seed}: row {t},{j}"
    # down: rows read by sorted row (top_k 1) and scaled by the routing weight
    a2_c, a2_s = ref.quant_token_groups(np.random.default_rng(seed + 1).standard_normal((tokens * top_k, k)))
    down = ref.fused_moe_gemm_ref(a2_c, a2_s, w_c, w_s, al, 1, routed_weights=rw)
    plain = ref.fused_moe_gemm_ref(a2_c, a2_s, w_c, w_s, al, 1)
    assert np.allclose(down, plain * rw.reshape(-1, 1))
    with pytest.raises(ValueError, match="K"):
        ref.fused_moe_gemm_ref(a_c[:, :128], a_s[:, :1], w_c, w_s, al, top_k)

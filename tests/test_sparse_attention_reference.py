"""CPU checks of the sparse MLA reference, the FP8 row format and input validation."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_kernels.mla_reference import (
    D_LATENT,
    D_QK,
    E4M3_MAX,
    FP8_ROW_BYTES,
    bf16_to_float,
    dequant_fp8_rows_bf16,
    e4m3_decode,
    e4m3_encode,
    e4m3_table,
    float_to_bf16,
    mla_decode_reference,
    pack_fp8_rows,
    unpack_fp8_rows,
)
from cupy_kernels.sparse_attention import (
    DEFAULT_NARROW_VARIANT,
    DEFAULT_WIDE_VARIANT,
    NARROW_VARIANT_ENV,
    NARROW_VARIANTS,
    VARIANT_ENV,
    WIDE_VARIANTS,
    fold_query_tokens,
    heads_per_cta,
    plan_splits,
    resolve_narrow_variant,
    resolve_variant,
    validate_inputs,
)
from tests.helpers import dequant_case_rows


def _naive(q, rows, slots, scale):
    """One head, one token at a time: the definition, no vectorisation."""
    b_n, h_n, _ = q.shape
    out = np.zeros((b_n, h_n, D_LATENT))
    lse = np.full((b_n, h_n), -np.inf)
    for b in range(b_n):
        toks = [int(s) for s in slots[b] if 0 <= s < rows.shape[0]]
        for h in range(h_n):
            if not toks:
                continue
            scores = [scale * float(np.dot(q[b, h], rows[t])) for t in toks]
            m = max(scores)
            w = [np.exp(s - m) for s in scores]
            z = sum(w)
            lse[b, h] = m + np.log(z)
            for wi, t in zip(w, toks, strict=True):
                out[b, h] += wi / z * rows[t, :D_LATENT]
    return out, lse


def test_reference_matches_naive_loop():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, D_QK))
    rows = rng.standard_normal((40, D_QK))
    slots = rng.integers(-1, 40, size=(2, 17)).astype(np.int32)
    slots[1, :] = -1
    slots[1, 5] = 7  # one live token
    out, lse = mla_decode_reference(q, rows, slots, 0.07)
    n_out, n_lse = _naive(q, rows, slots, 0.07)
    np.testing.assert_allclose(out, n_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, n_lse, rtol=1e-12)
    np.testing.assert_allclose(out[1], np.broadcast_to(rows[7, :D_LATENT], (3, D_LATENT)))


def test_masked_entries_equal_removed_tokens():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 4, D_QK))
    rows = rng.standard_normal((30, D_QK))
    live = np.array([[3, 9, 27, 0, 11]], dtype=np.int32)
    masked = np.array([[3, -1, 9, 27, 30, 0, -5, 11]], dtype=np.int32)  # -1, -5, 30 (= N) masked
    a = mla_decode_reference(q, rows, live, 0.05)
    b = mla_decode_reference(q, rows, masked, 0.05)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-13)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-13)


def test_all_masked_row_is_zero_and_minus_inf():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2, D_QK))
    rows = rng.standard_normal((8, D_QK))
    slots = np.array([[-1, -1, -1], [1, 2, -1]], dtype=np.int32)
    out, lse = mla_decode_reference(q, rows, slots, 0.1)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    assert np.all(np.isfinite(out[1])) and np.all(np.isfinite(lse[1]))


def test_e4m3_known_values():
    known = {0x00: 0.0, 0x38: 1.0, 0x40: 2.0, 0x30: 0.5, 0x3C: 1.5, 0x7E: 448.0, 0x08: 2.0**-6,
             0x01: 2.0**-9, 0x07: 7 * 2.0**-9, 0xB8: -1.0, 0xFE: -448.0, 0x80: -0.0}
    for code, val in known.items():
        assert e4m3_decode(np.uint8(code)) == val, hex(code)
    assert np.isnan(e4m3_decode(np.uint8(0x7F))) and np.isnan(e4m3_decode(np.uint8(0xFF)))
    assert np.isnan(e4m3_table()).sum() == 2


def test_e4m3_round_trip_and_rounding():
    codes = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], dtype=np.uint8)
    np.testing.assert_array_equal(e4m3_encode(e4m3_decode(codes)), codes)
    assert e4m3_encode(np.array(1.0625))[()] == 0x38  # tie between 1.0 and 1.125: even code
    assert e4m3_encode(np.array(1.1875))[()] == 0x3A  # tie between 1.125 and 1.25: even code
    assert e4m3_encode(np.array(1.07))[()] == 0x39
    assert e4m3_encode(np.array(1e6))[()] == 0x7E and e4m3_encode(np.array(-1e6))[()] == 0xFE
    assert e4m3_encode(np.array(np.nan))[()] == 0x7F


def test_fp8_row_layout_and_dequantisation():
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((5, D_QK)) * rng.uniform(0.01, 10, size=(5, 1))
    rows[2, 128:256] = 0.0  # an all-zero block gets scale 1, values 0
    packed = pack_fp8_rows(rows)
    assert packed.shape == (5, FP8_ROW_BYTES) and packed.dtype == np.uint8
    scales = packed[:, 512:528].copy().view("<f4")
    amax = np.abs(rows[:, :512].reshape(5, 4, 128)).max(axis=2)
    np.testing.assert_allclose(scales, np.where(amax > 0, amax / E4M3_MAX, 1.0), rtol=1e-6)
    rope = bf16_to_float(packed[:, 528:].copy().view("<u2"))
    np.testing.assert_array_equal(rope, bf16_to_float(float_to_bf16(rows[:, 512:])))
    deq = unpack_fp8_rows(packed)
    # e4m3 keeps 3 mantissa bits: error <= 2^-4 relative, or half the subnormal step
    blk_scale = np.repeat(scales.astype(np.float64), 128, axis=1)
    err = np.abs(deq[:, :512] - rows[:, :512])
    assert np.all(err <= np.maximum(np.abs(rows[:, :512]) * 2.0**-4, blk_scale * 2.0**-10) * 1.0001)
    assert np.all(deq[2, 128:256] == 0)
    # the largest element of each block is represented exactly as 448 * scale
    idx = np.abs(rows[0, :128]).argmax()
    assert abs(deq[0, idx]) == pytest.approx(amax[0, 0], rel=1e-6)


def test_bf16_conversion():
    x = np.array([1.0, -2.5, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.0e38, np.nan], dtype=np.float32)
    bits = float_to_bf16(x)
    assert bits[0] == 0x3F80 and bits[1] == 0xC020
    assert bits[2] == 0x3F80 and bits[3] == 0x3F82  # ties to even
    assert np.isnan(bf16_to_float(bits)[5])


def _inputs(b=2, h=64, k=128, n=256, fmt="bf16"):
    q = np.zeros((b, h, D_QK), np.uint16)
    kv = np.zeros((n, D_QK), np.uint16) if fmt == "bf16" else np.zeros((n, FP8_ROW_BYTES), np.uint8)
    return q, kv, np.zeros((b, k), np.int32)


def test_validate_accepts_good_inputs():
    assert validate_inputs(*_inputs(), "bf16") == (2, 64, 128, 256)
    assert validate_inputs(*_inputs(h=128, fmt="fp8"), "fp8") == (2, 128, 128, 256)
    for h in (1, 8, 16, 24, 100):  # any H: the narrow kernel takes what is not a multiple of 64
        assert validate_inputs(*_inputs(h=h), "bf16").heads == h


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda q, kv, s: (np.ascontiguousarray(q[:, :, :512]), kv, s), r"q must be \[B, H, 576\]"),
        (lambda q, kv, s: (q.astype(np.float32), kv, s), "q must have dtype uint16"),
        (lambda q, kv, s: (np.ascontiguousarray(q[:, :0]), kv, s), "H >= 1"),
        (lambda q, kv, s: (q[0], kv, s), "q must have 3 dimensions"),
        (lambda q, kv, s: (q, np.ascontiguousarray(kv[:, :512]), s), r"kv for kv_dtype='bf16' must be \[N, 576\]"),
        (lambda q, kv, s: (q, kv, s.astype(np.int64)), "slots must have dtype int32"),
        (lambda q, kv, s: (q, kv, s[:1]), r"slots must be \[B=2"),
        (lambda q, kv, s: (q[:, :, ::-1], kv, s), "C-contiguous"),
    ],
)
def test_validate_rejects_bad_inputs(change, match):
    with pytest.raises(ValueError, match=match):
        validate_inputs(*change(*_inputs()), "bf16")


def test_validate_rejects_bad_format():
    q, kv, s = _inputs()
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        validate_inputs(q, kv, s, "fp16")
    with pytest.raises(ValueError, match=r"\[N, 656\] uint8"):
        validate_inputs(q, kv.view(np.uint8), s, "fp8")


def test_plan_splits_fills_gpu_and_covers_k():
    for b in (1, 8, 32, 64, 128):
        for h in (64, 128):
            splits, per = plan_splits(b, h, 2048, 132)
            assert splits * per >= 32 and (splits - 1) * per < 32  # every split non-empty
            assert b * (h // 64) * splits <= max(132, b * (h // 64))
    assert plan_splits(64, 128, 2048, 132) == (1, 32)
    assert plan_splits(1, 64, 2048, 132) == (32, 1)


def test_plan_splits_narrow_heads():
    assert heads_per_cta(128) == 64 and heads_per_cta(64) == 64
    assert heads_per_cta(8) == 16 and heads_per_cta(16) == 16 and heads_per_cta(96) == 16
    assert plan_splits(128, 8, 2048, 132) == (1, 32)  # 128 CTAs already fill the GPU
    assert plan_splits(64, 16, 2048, 132) == (2, 16)
    assert plan_splits(64, 24, 2048, 132) == (1, 32)  # two head groups per request
    assert plan_splits(128, 16, 2048, 132, ctas_per_sm=2) == (2, 16)  # narrow fp8: 2 CTAs per SM
    for b in (1, 8, 32, 64, 128):
        for h in (8, 16, 24):
            splits, per = plan_splits(b, h, 2048, 132)
            assert splits * per >= 32 and (splits - 1) * per < 32


def test_mtp_reference_is_per_token_calls():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 2, 4, D_QK))
    rows = rng.standard_normal((50, D_QK))
    shared = rng.integers(-1, 50, size=(3, 20)).astype(np.int32)
    own = rng.integers(-1, 50, size=(3, 2, 20)).astype(np.int32)
    own[1, 1, :] = -1  # one token with every entry masked
    out, lse = mla_decode_reference(q, rows, shared, 0.06)
    assert out.shape == (3, 2, 4, D_LATENT) and lse.shape == (3, 2, 4)
    for t in range(2):
        o_t, l_t = mla_decode_reference(q[:, t], rows, shared, 0.06)
        np.testing.assert_array_equal(out[:, t], o_t)
        np.testing.assert_array_equal(lse[:, t], l_t)
    out, lse = mla_decode_reference(q, rows, own, 0.06)
    for t in range(2):
        o_t, l_t = mla_decode_reference(q[:, t], rows, own[:, t], 0.06)
        np.testing.assert_array_equal(out[:, t], o_t)
    assert np.all(out[1, 1] == 0) and np.all(np.isneginf(lse[1, 1])) and np.all(np.isfinite(lse[1, 0]))
    with pytest.raises(ValueError, match=r"slots must be \[B, k\] or \[B, T, k\]"):
        mla_decode_reference(q, rows, own[:, :1], 0.06)


def test_fold_query_tokens_matches_reference_semantics():
    """The kernel's folding (views) computes what the MTP reference defines."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 2, 3, D_QK))
    rows = rng.standard_normal((40, D_QK))
    shared = rng.integers(-1, 40, size=(2, 16)).astype(np.int32)
    own = rng.integers(-1, 40, size=(2, 2, 16)).astype(np.int32)
    for slots in (shared, own):
        q3, s2, shape = fold_query_tokens(q, slots)
        assert shape == (2, 2, 3)
        o3, l3 = mla_decode_reference(q3, rows, s2, 0.05)
        o4, l4 = mla_decode_reference(q, rows, slots, 0.05)
        np.testing.assert_allclose(o3.reshape(o4.shape), o4, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(l3.reshape(l4.shape), l4, rtol=1e-12)
    assert fold_query_tokens(q, shared)[0].shape == (2, 6, D_QK)  # shared selection: T x H heads
    assert fold_query_tokens(q, own)[0].shape == (4, 3, D_QK)  # own selection: B x T requests
    q3 = np.zeros((2, 3, D_QK))
    assert fold_query_tokens(q3, shared)[2] == (2, 3)
    with pytest.raises(ValueError, match=r"slots for q \[B=2, T=2"):
        fold_query_tokens(q, own[:1])


def test_wide_variant_selection(monkeypatch):
    # the argument wins over $HISPARSE_MLA_VARIANT, which wins over the default; bad names are refused
    monkeypatch.delenv(VARIANT_ENV, raising=False)
    for kv_dtype in ("bf16", "fp8"):
        assert resolve_variant(None, kv_dtype) == DEFAULT_WIDE_VARIANT[kv_dtype] in WIDE_VARIANTS
        # split k (small batches): the regime where only "serial" was measured
        assert resolve_variant(None, kv_dtype, one_split=False) == "serial"
        assert resolve_variant("ws", kv_dtype, one_split=False) == "ws"
    monkeypatch.setenv(VARIANT_ENV, "serial")
    assert resolve_variant(None) == "serial"
    assert resolve_variant("ws") == "ws"
    monkeypatch.setenv(VARIANT_ENV, "fastest")
    with pytest.raises(ValueError, match=r"\$HISPARSE_MLA_VARIANT must be one of .*'fastest'"):
        resolve_variant(None)
    with pytest.raises(ValueError, match="variant must be one of .*'nope'"):
        resolve_variant("nope")


def test_crossover_variant_runs_fp8_with_head_groups_in_pairs(monkeypatch):
    # wsx launches clusters of two CTAs over the head groups: FP8 only, H a multiple of 128
    spec = WIDE_VARIANTS["wsx"]
    assert spec.runs("fp8", 128) and spec.runs("fp8", 256)
    assert not spec.runs("fp8", 64) and not spec.runs("fp8", 192) and not spec.runs("bf16", 128)
    assert all(WIDE_VARIANTS[v].runs(d, 64) for v in ("ws", "ws2", "serial") for d in ("bf16", "fp8"))
    monkeypatch.delenv(VARIANT_ENV, raising=False)
    assert resolve_variant("wsx", "fp8", heads=128) == "wsx"
    # named by the caller where it cannot run: an error that says why
    with pytest.raises(ValueError, match=r"variant 'wsx' runs KV layouts \('fp8',\) with H a multiple of 128; "
                                         r"got 'fp8', H 64"):
        resolve_variant("wsx", "fp8", heads=64)
    with pytest.raises(ValueError, match="got 'bf16', H 128"):
        resolve_variant("wsx", "bf16", heads=128)
    # from the environment: every call still runs, as ws where wsx cannot
    monkeypatch.setenv(VARIANT_ENV, "wsx")
    assert resolve_variant(None, "fp8", heads=128) == "wsx"
    assert resolve_variant(None, "fp8", heads=64) == "ws"
    assert resolve_variant(None, "bf16", heads=128) == "ws"


def test_early_free_variant_runs_where_wsx_runs(monkeypatch):
    # wsxe (an earlier buffer release), wsxo (wsxe writing O through shared memory), wsxr (wsxo
    # with a smaller first burst) and wsxb (wsxr with split cluster barriers, the FP8 default) run
    # exactly where wsx runs
    monkeypatch.delenv(VARIANT_ENV, raising=False)
    for heads in (64, 128, 192, 256):
        for kv_dtype in ("fp8", "bf16"):
            for v in ("wsxe", "wsxo", "wsxr", "wsxb"):
                assert WIDE_VARIANTS[v].runs(kv_dtype, heads) == WIDE_VARIANTS["wsx"].runs(kv_dtype, heads)
    assert DEFAULT_WIDE_VARIANT["fp8"] == "wsxb" and resolve_variant(None, "fp8", heads=128) == "wsxb"
    assert resolve_variant(None, "fp8", heads=64) == "ws"  # one head group: no cluster to pair
    with pytest.raises(ValueError, match=r"variant 'wsxe' runs KV layouts \('fp8',\) with H a multiple of 128"):
        resolve_variant("wsxe", "fp8", heads=64)
    monkeypatch.setenv(VARIANT_ENV, "wsxe")
    assert resolve_variant(None, "fp8", heads=128) == "wsxe"
    assert resolve_variant(None, "fp8", heads=64) == "ws"


def test_wide_variants_fit_one_block_of_shared_memory():
    # sm_90 gives one block at most 227 KB of dynamic shared memory
    assert set(WIDE_VARIANTS) == {"ws", "ws2", "wsx", "wsxe", "wsxo", "wsxr", "wsxb", "serial"}
    for spec in WIDE_VARIANTS.values():
        assert spec.smem <= 227 * 1024 and spec.threads % 128 == 0


def test_narrow_variant_selection(monkeypatch):
    monkeypatch.delenv(NARROW_VARIANT_ENV, raising=False)
    for kv_dtype in ("bf16", "fp8"):
        assert resolve_narrow_variant(None, kv_dtype) == DEFAULT_NARROW_VARIANT[kv_dtype] in NARROW_VARIANTS
    monkeypatch.setenv(NARROW_VARIANT_ENV, "narrow2")
    assert resolve_narrow_variant(None) == "narrow2"
    assert resolve_narrow_variant("narrow") == "narrow"
    with pytest.raises(ValueError, match="narrow_variant must be one of .*'ws'"):
        resolve_narrow_variant("ws")  # a wide variant is not a narrow one
    monkeypatch.setenv(NARROW_VARIANT_ENV, "bogus")
    with pytest.raises(ValueError, match=r"\$HISPARSE_MLA_NARROW_VARIANT must be one of"):
        resolve_narrow_variant(None)


def _prmt_sign(words: np.ndarray, selector: int) -> np.ndarray:
    """PTX prmt.b32 d, w, 0, selector (default mode): byte i of d is byte (nibble_i & 7) of the
    pair {w, 0}; with nibble bit 3 set, that byte's sign bit replicated over 8 bits."""
    src = np.concatenate([words.astype("<u4").view(np.uint8).reshape(-1, 4),
                          np.zeros((words.size, 4), dtype=np.uint8)], axis=1)
    out = np.zeros((words.size, 4), dtype=np.uint8)
    for i in range(4):
        nib = (selector >> (4 * i)) & 0xF
        byte = src[:, nib & 7]
        out[:, i] = np.where(byte & 0x80, 0xFF, 0).astype(np.uint8) if nib & 8 else byte
    return out.reshape(-1).view("<u4").reshape(words.shape)


def _bf16_mul_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bf16 x bf16 -> bf16 bits, one round to nearest even (the product is exact in float64)."""
    return float_to_bf16(bf16_to_float(a).astype(np.float64) * bf16_to_float(b).astype(np.float64))


def _kernel_dequant_emulated(kv: np.ndarray) -> np.ndarray:
    """The kernel's e4m3x16_to_bf16, step by step on the CPU: prmt, arithmetic shift by 4, mask
    0x87F087F0 (e4m3 * 2^-120 as bf16), then x 2^120 and x bf16(scale) as bf16 multiplies."""
    n = kv.shape[0]
    words = kv[:, :512].copy().view("<u4").reshape(n, 4, 32)  # 128 codes = 32 words per block
    s = np.broadcast_to(float_to_bf16(kv[:, 512:528].copy().view("<f4"))[:, :, None], (n, 4, 32))
    two_pow_120 = np.full((n, 4, 32), 0x7B80, dtype=np.uint16)
    out = np.zeros((n, 4, 128), dtype=np.uint16)
    for k, sel in enumerate((0x1804, 0x3A24)):  # k 0: codes 4j, 4j+1 of word j; k 1: 4j+2, 4j+3
        p = (_prmt_sign(words, sel).view(np.int32) >> 4).view(np.uint32) & 0x87F087F0
        for half in range(2):
            x = ((p >> (16 * half)) & 0xFFFF).astype(np.uint16)
            out[:, :, 2 * k + half::4] = _bf16_mul_bits(_bf16_mul_bits(x, two_pow_120), s)
    return out.reshape(n, 512)


def test_fp8_integer_dequantisation_matches_reference():
    """CPU twin of test_sparse_attention_gpu.py::test_fp8_dequantisation_bit_exact: the kernel's
    e4m3 -> bf16 conversion, emulated instruction by instruction, gives dequant_fp8_rows_bf16's
    bits (bf16(e4m3 x bf16(scale)), FlashMLA's rounding) for every finite code and every kind of
    finite scale (normal, zero, subnormal, >= 2^8, negative)."""
    kv = dequant_case_rows()
    want = float_to_bf16(dequant_fp8_rows_bf16(kv))
    np.testing.assert_array_equal(_kernel_dequant_emulated(kv), want[:, :512])
    rope = kv[:, 528:].copy().view("<u2")
    np.testing.assert_array_equal(want[:, 512:], rope)
    # the case holds scales past bf16(scale) * 2^120's range, zero and subnormal ones
    s_bf = bf16_to_float(float_to_bf16(kv[:, 512:528].copy().view("<f4")))
    assert (np.abs(s_bf) >= 256).any() and (s_bf < 0).any()
    assert (s_bf == 0).any() and ((s_bf != 0) & (np.abs(s_bf) < 2.0**-126)).any()


def test_fp8_kernel_rounding_against_exact_dequantisation():
    """bf16(e4m3 x bf16(scale)) stays within two bf16 roundings of e4m3 x scale."""
    kv = pack_fp8_rows(np.random.default_rng(5).standard_normal((50, D_QK)) * 4.0)
    exact, seen = unpack_fp8_rows(kv), dequant_fp8_rows_bf16(kv)
    np.testing.assert_array_equal(seen[:, 512:], exact[:, 512:])
    err = np.abs(seen[:, :512] - exact[:, :512])
    assert np.all(err <= np.abs(exact[:, :512]) * 2.0**-7 * 1.0001)
    assert (err > 0).any()  # the scale's rounding shows: not the exact rows
    with pytest.raises(ValueError, match="656"):
        dequant_fp8_rows_bf16(np.zeros((2, 655), dtype=np.uint8))


def test_crossover_halves_and_bulk_copies_cover_the_tile_once():
    """The geometry mla_decode_wsx_fp8 relies on (mirrors sparse_attention.cu): CTA `rank`'s 128
    producer threads (row 32 rank + t / 4, q = t % 4) store units 2q, 2q + 1 of chunks 0-7 and the
    rope units 0-7 of chunk 8 of their rows in the 128-byte-swizzled tile; warp w then bulk-copies
    the 1 KB of rows 32 rank + 8 w .. + 7 in each of the 9 chunks to the peer. What a CTA stores
    must be exactly what its copies send, and the two halves must make the whole tile once."""
    tile, chunk = 9 * 64 * 128, 64 * 128

    def swz(r: int, u: int) -> int:
        return r * 128 + ((u ^ (r & 7)) << 4)

    written = {0: set(), 1: set()}
    for rank in (0, 1):
        for t in range(128):
            row, q = 32 * rank + t // 4, t % 4
            for m in range(8):  # fp8 units q + 4 m -> bf16 units 2q, 2q + 1 of chunk m
                written[rank] |= {m * chunk + swz(row, 2 * q), m * chunk + swz(row, 2 * q + 1)}
            for m in range(8, 11):  # units 33..40: rope, chunk 8, unit u - 33
                u = q + 4 * m
                if 33 <= u <= 40:
                    written[rank].add(8 * chunk + swz(row, u - 33))
        copied = set()
        for w in range(4):
            for c in range(9):
                start = c * chunk + (32 * rank + 8 * w) * 128
                copied |= set(range(start, start + 8 * 128, 16))
        assert written[rank] == copied
    assert not written[0] & written[1]
    assert written[0] | written[1] == set(range(0, tile, 16))
    assert 16 * len(written[0]) == 32 * 1152  # the bytes the peer's full barrier expects (32 rows)


def test_staged_epilogue_layout_fits_the_free_buffer_without_bank_conflicts():
    # wsxo / wsxr stage each warpgroup's bf16 half of O (64 heads x 512 B) in the tile buffer the
    # last tile left free, rows STAGE_ROW bytes apart: both halves must fit one tile buffer, and a
    # warp's 4-byte store (8 rows r0 .. r0 + 7, 4 lanes a row at 4-byte steps) must hit 32 banks
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "cupy_kernels" / "sparse_attention.cu").read_text()
    stage_row = int(re.search(r"#define STAGE_ROW (\d+)", src).group(1))
    tile_bytes = 9 * 64 * 128  # TILE_BYTES: 64 rows of 576 bf16
    assert 2 * 64 * stage_row <= tile_bytes and stage_row >= 512 and stage_row % 16 == 0
    for warp in range(4):
        for j in range(32):  # the j-th store of every lane
            banks = {((warp * 16 + (lane >> 2)) * stage_row + (lane & 3) * 4 + j * 16) // 4 % 32 for lane in range(32)}
            assert len(banks) == 32, (warp, j)
    # the 16-byte reads: a warp reads one row's 512 contiguous bytes, within five 128-byte lines
    for row in range(64):
        addrs = [row * stage_row + c * 16 for c in range(32)]
        assert len({a // 128 for a in addrs}) <= 5

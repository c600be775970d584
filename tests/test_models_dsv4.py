"""DeepSeek-V4-Flash / -Pro: layer kinds, parameter counts against the model cards, the per-kind memory
and step terms, each computed by hand from the config values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.dsv4_memory import (
    C4_STATE_BYTES_PER_SWA_TOKEN,
    SWA_FULL_TOKENS_RATIO,
    bytes_per_full_token,
    plan_memory_dsv4,
)
from simulator.serving.layer_kinds import LAYER_KINDS


def test_layer_kinds_from_compress_ratios():
    f, p = P.load("models", "deepseek-v4-flash"), P.load("models", "deepseek-v4-pro")
    assert f.kind_counts == {"swa": 2, "c4": 21, "c128": 20} and f.layer_kinds[:4] == ("swa", "swa", "c4", "c128")
    assert p.kind_counts == {"c128": 31, "c4": 30} and p.layer_kinds[:3] == ("c128", "c128", "c4")
    assert f.hisparse_layers == 21 and f.indexer_layers == 21 and f.shared_layers == 0
    assert P.load("models", "glm-5.1-fp8").hisparse_layers == 78


def test_parameter_counts_match_the_model_cards():
    """Flash: 284 B total, 13 B active; Pro: 1.6 T, 49 B (model cards; MTP layer excluded here).
    By hand for Flash: attention per layer d*qr + qr*h*hd + d*hd + h*hd*olr + g*olr*d + 2*24*4d."""
    f, p = P.load("models", "deepseek-v4-flash"), P.load("models", "deepseek-v4-pro")
    d, qr, h, hd, olr, g = 4096, 1024, 64, 512, 1024, 8
    assert f.attention_params == d * qr + qr * h * hd + d * hd + h * hd * olr + g * olr * d + 2 * 24 * 4 * d
    assert f.indexer_params == qr * 64 * 128 + 2 * d * 256 + d * 64
    assert f.dsv4_attention_extra_params == 21 * 4 * d * hd + 20 * 2 * d * hd
    assert f.total_params / 1e9 == pytest.approx(284.3, abs=0.05)
    assert f.active_params / 1e9 == pytest.approx(13.27, abs=0.01)
    assert p.total_params / 1e12 == pytest.approx(1.573, abs=0.001)  # "1.6T"
    assert p.active_params / 1e9 == pytest.approx(48.85, abs=0.01)  # "49B"
    assert p.absorbed_mla_params == 0


def test_bytes_per_full_token_by_hand():
    """Flash, no HiSparse: 0.1 x 584 x 43 (windows) + 584/4 x 21 + 584/128 x 20 + 132/4 x 21 + 0.1 x 352 x 21;
    HiSparse ratio 8: the C4 term / 8, plus 2 + 1/128 B of slot mapping."""
    f = P.load("models", "deepseek-v4-flash")
    want = 0.1 * 584 * 43 + 146 * 21 + 584 / 128 * 20 + 33 * 21 + 0.1 * 352 * 21
    assert SWA_FULL_TOKENS_RATIO == 0.1 and C4_STATE_BYTES_PER_SWA_TOKEN == 352
    assert bytes_per_full_token(f, None) == pytest.approx(want)
    hs = P.load("hisparse", "deepseek-v4-flash")
    assert bytes_per_full_token(f, hs) == pytest.approx(want - 146 * 21 + 146 * 21 / 8 + 2 + 1 / 128)


def test_dsv4_pools_and_hot_buffers():
    f = P.load("models", "deepseek-v4-flash")
    gpu, dep, hs = P.load("gpus", "h200"), P.load("deployments", "8xh200-colocated-dp8"), P.load("hisparse", "deepseek-v4-flash")
    base = plan_memory_dsv4(f, gpu, dep, None)
    hi = plan_memory_dsv4(f, gpu, dep, hs)
    assert base.pool_tokens == int(base.budget_bytes / bytes_per_full_token(f, None)) // 256 * 256
    assert hi.host_tokens > base.pool_tokens  # HiSparse frees the C4 share of every token's bytes
    assert hi.pool_tokens == hi.host_tokens // 32 * 4  # C4 device rows = full // (4 x 8), in full-token units
    assert hi.buffer_slots == 4 * (4096 + 64)
    # PR #33979's request-capacity pool: one hot buffer per request slot (max_running / dp + 1)
    req = plan_memory_dsv4(f, gpu, dep, dataclasses.replace(hs, c4_pool="request"))
    assert req.pool_tokens == (480 // 8 + 1) * (4096 + 64) * 4
    assert req.host_tokens > hi.host_tokens


def test_attention_rows_per_kind():
    """At 40,000 tokens: C4 attends 128 window + 512 of 10,000 rows; C128 128 + 312; SWA 128."""
    assert float(LAYER_KINDS["c4"].attended_rows(40000, 512, 128)) == 640
    assert float(LAYER_KINDS["c128"].attended_rows(40000, 512, 128)) == 128 + 312
    assert float(LAYER_KINDS["swa"].attended_rows(40000, 512, 128)) == 128
    assert float(LAYER_KINDS["dsa"].attended_rows(40000, 2048, 0)) == 2048
    assert float(LAYER_KINDS["c4"].attended_rows(100, 512, 128)) == 100 + 25


def test_step_terms_follow_the_kinds():
    """The indexer scores a compressed key per 4 tokens on the 21 C4 layers (its select: Lightning
    TopK, tests/test_dsv4_kernels.py); the swap-in launches on the 21 C4 layers only; attention is the
    sum of each kind's."""
    from simulator.serving.scenario import load_scenario

    sc = load_scenario(model="deepseek-v4-flash")
    c = sc.cost_model()
    assert c.indexer_all(8 * 40000.0, 8) == pytest.approx(21 * c.c4_indexer(8 * 40000.0, 8))
    t = c._indexer_term()  # the scoring reads one compressed key per 4 tokens, as the DSA term would
    assert c.c4_indexer(8 * 40000.0, 8) - c.indexer(8 * 10000.0, 8) == pytest.approx(
        15e-6 * 10000 / 262_144 - t.select_s_per_token * 10000)
    want = 2 * c.attention_kind("swa", 8, 8 * 40000.0) + 21 * c.attention_kind("c4", 8, 8 * 40000.0) \
        + 20 * c.attention_kind("c128", 8, 8 * 40000.0)
    assert float(c.attention_all(8, 8 * 40000.0)) == pytest.approx(float(want))
    per_layer = c.swap_in_layer(np.asarray(2100.0) / 21, 8)
    assert float(c.swap_in(2100.0, 8)) == pytest.approx(float(per_layer) * 21 * (1 - sc.params.swap_in_overlap))
    assert sc.hisparse.top_k == 512  # the model's own HiSparse preset replaces the GLM default


def test_dsv4_keys_are_checked():
    with pytest.raises(HisparseError, match="compress_ratios has 3 entries for 43 layers"):
        P.load("models", "deepseek-v4-flash", compress_ratios=[0, 4, 128])
    with pytest.raises(HisparseError, match=r"compress_ratios \[8\]"):
        P.load("models", "deepseek-v4-flash", compress_ratios=[8] * 43)
    with pytest.raises(HisparseError, match="arch = 'gpt': must be mla or dsv4"):
        P.load("models", "deepseek-v4-flash", arch="gpt")
    with pytest.raises(HisparseError, match="compress_ratios is a DeepSeek-V4 key"):
        P.load("models", "glm-5.1-fp8", compress_ratios=[4] * 78)

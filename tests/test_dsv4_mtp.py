"""DeepSeek-V4's MTP draft: one SWA-only decoder layer (LMSYS day-0 blog), priced and sized as such."""

import numpy as np

from simulator.costmodel import Pass, RankWork
from simulator.serving import presets as P
from simulator.serving.memory import nextn_weights_per_gpu, speculative_memory
from simulator.serving.scenario import load_scenario
from simulator.serving.speculative import from_table

SPEC = {"speculative": "eagle:3-1-4", "accept_len": 2.5, "accept_method": "match-expected"}


def test_dsv4_draft_model_is_one_swa_layer_without_indexer():
    m = P.load("models", "deepseek-v4-flash")
    d = m.draft_model(1)
    assert d.layers == 1 and d.compress_ratios == (0,) and d.kind_counts == {"swa": 1}
    assert d.indexer_layers == 0 and d.hisparse_layers == 0
    assert m.draft_model(2).compress_ratios == (0, 0)
    glm = P.load("models", "glm-5.2-fp8")
    assert glm.draft_model(1).layers == 1 and glm.draft_model(1).compress_ratios == ()


def test_dsv4_draft_pass_has_no_indexer_and_one_layer_of_attention():
    spec = from_table(SPEC, "t")
    sc = load_scenario(model="deepseek-v4-flash", deployment="4xh200-tp4-dsv4-flash-low-latency", speculative=spec)
    cm = sc.cost_model(spec=spec)
    work = (RankWork(1, np.asarray(900_000.0), None),)
    draft = cm.draft.pass_time(Pass(work)).parts
    assert float(draft["lightning indexer"][0]) == 0.0
    # one SWA layer's attention: the same kernel as one of the target's two SWA layers
    assert np.isclose(float(draft["sparse attention"][0]), float(cm.attention_kind("swa", 1, 900_000.0)))
    # the draft's context does not grow its price: SWA reads 128 rows at any length
    short = cm.draft.pass_time(Pass((RankWork(1, np.asarray(4096.0), None),))).total_s[0]
    assert np.isclose(cm.draft.pass_time(Pass(work)).total_s[0], short)


def test_dsv4_draft_kv_is_one_row_per_slot():
    spec = from_table(SPEC, "t")
    m = P.load("models", "deepseek-v4-flash")
    dep = P.load("deployments", "4xh200-tp4-dsv4-flash-low-latency")
    pool, running = 100_000, 48
    headroom = running * (3 * 1 + 4) + 100
    # the draft's weights are in the KV budget now (PR #28855: memory.draft_resident_bytes), not the slack
    want = (pool + headroom) * m.kv_row_bytes + headroom * (m.kv_bytes_per_token() + m.indexer_bytes_per_token())
    assert np.isclose(speculative_memory(m, dep, spec, pool, running), want)
    # what the profile budgeted of the draft KV (PR #23862's cell scaling) comes off
    assert np.isclose(speculative_memory(m, dep, spec, pool, running, budgeted_draft_bytes=pool * m.kv_row_bytes),
                      want - pool * m.kv_row_bytes)
    assert nextn_weights_per_gpu(m, dep) > 0

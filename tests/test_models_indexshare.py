"""GLM-5.2's IndexShare layer groups and what they change, computed by hand on the config's rule."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.serving import presets as P
from simulator.serving.memory import plan_memory, weights_per_gpu


def test_glm52_anchor_layers_follow_the_config_rule():
    """index_topk_freq 4, index_skip_topk_offset 3: full iff max(l - 2, 0) % 4 == 0 (transformers'
    rule): layers 0, 1, 2 and every fourth from 6; 21 anchors, 57 shared layers."""
    m = P.load("models", "glm-5.2-fp8")
    want = tuple(sorted({0, 1, 2, *range(6, 78, 4)}))
    assert m.anchor_layers == want and m.indexer_layers == 21 and m.shared_layers == 57
    assert m.anchor_of[3] == 2 and m.anchor_of[5] == 2 and m.anchor_of[6] == 6 and m.anchor_of[77] == 74
    # Megatron's 1-indexed list of the computing layers (1, 2, 3, 7, 11, ..., 75)
    assert [a + 1 for a in m.anchor_layers][:5] == [1, 2, 3, 7, 11] and m.anchor_layers[-1] + 1 == 75


def test_glm52_parameter_count_drops_the_shared_layers_indexers():
    """GLM-5.1's 743.91 B less 57 indexers of 9,371,648 parameters; active 40.83 B less the same."""
    g51, g52 = P.load("models", "glm-5.1-fp8"), P.load("models", "glm-5.2-fp8")
    assert g52.total_params == g51.total_params - 57 * 9_371_648
    assert g52.total_params / 1e9 == pytest.approx(743.376, abs=0.001)
    assert g52.active_params == g51.active_params - 57 * 9_371_648
    # the Hub's rounded totals with the MTP layer: 754 B (GLM-5.1) and 753 B (GLM-5.2)
    assert round((g51.total_params - g52.total_params) / 1e9, 1) == 0.5
    assert g52.context_length == 1_048_576


def test_freq_one_is_every_layer_an_anchor():
    m = P.load("models", "glm-5.1-fp8")
    assert m.indexer_layers == m.layers and m.anchor_of == tuple(range(m.layers))


def test_indexshare_memory_elides_shared_layers_indexer_keys_and_weights():
    """The pool cell holds index-K rows on the 21 anchors only (x ratio under HiSparse); the indexer
    weights (replicated on every GPU) are 57 layers' fewer."""
    g51, g52 = P.load("models", "glm-5.1-fp8"), P.load("models", "glm-5.2-fp8")
    gpu, dep, hs = P.load("gpus", "h200"), P.load("deployments", "8xh200-colocated-dp8"), P.load("hisparse", "blog-8xh200")
    a, b = plan_memory(g51, gpu, dep, hs), plan_memory(g52, gpu, dep, hs)
    ratio = hs.host_to_device_ratio
    assert a.cell_bytes - b.cell_bytes == int(78 * 132 * ratio) - int(21 * 132 * ratio)
    gates = g52.indexer_gate_params
    per_indexer = (g52.indexer_params - gates) * g52.weight_bytes_per_param + gates * 2
    assert weights_per_gpu(g51, dep) - weights_per_gpu(g52, dep) == pytest.approx(57 * per_indexer)
    assert b.pool_tokens >= a.pool_tokens


def test_offset_and_freq_are_checked():
    with pytest.raises(Exception, match="index_topk_freq = 0 must be >= 1"):
        P.load("models", "glm-5.2-fp8", index_topk_freq=0)
    m = dataclasses.replace(P.load("models", "glm-5.2-fp8"), index_topk_freq=2, index_skip_topk_offset=0)
    # offset 0: max(l + 1, 0) % 2 == 0 -> odd layers full; layer 0 has no anchor before it and is its own
    assert m.anchor_layers[:3] == (0, 1, 3) and m.anchor_of[2] == 1


def _costs(model: str):
    from simulator.serving.scenario import load_scenario

    sc = load_scenario(model=model, calibration="uncalibrated")
    return sc, sc.cost_model()


def test_indexer_runs_on_the_anchors_only():
    """The decode indexer term is 21/78 of GLM-5.1's at the same batch and context (same shapes),
    and the indexer projections of the attention side are counted 21 times, the rest 78."""
    from simulator.costmodel.ops import INDEXER_OPS
    from tests.helpers import decode_pass

    _, c51 = _costs("glm-5.1-fp8")
    _, c52 = _costs("glm-5.2-fp8")
    a = decode_pass(c51, 16, 16 * 40000).parts["lightning indexer"][0]
    b = decode_pass(c52, 16, 16 * 40000).parts["lightning indexer"][0]
    assert b == pytest.approx(a * 21 / 78)
    counts = {o.name: n for n, o in c52.attention_side_ops(16)}
    assert all(counts[name] == 21 for name in INDEXER_OPS if name in counts)
    assert counts["q_b_proj"] == 78 and counts["indexer_wk"] == 21
    assert c52.prefill_indexer(4096, 0) == pytest.approx(c51.prefill_indexer(4096, 0) * 21 / 78)


def test_step_ops_split_anchor_and_shared_layers():
    from simulator.costmodel.ops import INDEXER_OPS, Layout, step_ops

    m = P.load("models", "glm-5.2-fp8")
    groups = step_ops(m, 8, 8 * 1000.0, Layout())
    with_idx = sum(n for n, ops in groups if any(o.name in INDEXER_OPS for o in ops))
    without = sum(n for n, ops in groups[:-1] if not any(o.name in INDEXER_OPS for o in ops))
    assert (with_idx, without) == (21, 57)
    assert [n for n, _ in groups] == [3, 18, 57, 1]  # dense anchors 0-2; MoE anchors 6..74; shared; head


# -- the prefetch timeline (costmodel/indexshare.py) ---------------------------------------------
def test_groups_of_glm52():
    from simulator.costmodel.indexshare import groups

    g = groups(P.load("models", "glm-5.2-fp8").anchor_of)
    assert g[0] == (0, ()) and g[1] == (1, ()) and g[2] == (2, (3, 4, 5)) and g[-1] == (74, (75, 76, 77))
    assert sum(len(s) for _, s in g) == 57


def test_prefetch_hides_every_copy_shorter_than_the_compute_in_front_of_it():
    """swap 1, post 3, pre 0.5: the side stream finishes each copy (t = 2, 3, 4) long before its
    layer is ready (4.5, 8, 11.5): all three hidden."""
    from simulator.costmodel.indexshare import LayerTimes, hidden_per_group

    assert float(hidden_per_group(LayerTimes(pre=0.5, post=3.0, swap=1.0), 3)) == pytest.approx(3.0)


def test_prefetch_hides_only_the_compute_available():
    """swap 2, post 0.5, pre 0.25, two shared layers. Side stream: anchor copy to 2, then copies end at
    4 and 6. Main: anchor swap + post to 2.5; layer 1 ready 2.75, waits 1.25, done 4.5; layer 2 ready
    4.75, waits 1.25. Hidden = 4 - 2.5 = 1.5."""
    from simulator.costmodel.indexshare import LayerTimes, hidden_per_group

    assert float(hidden_per_group(LayerTimes(pre=0.25, post=0.5, swap=2.0), 2)) == pytest.approx(1.5)
    # arrays over steps price each step on its own
    # arrays over steps price each step on its own: swap 1 -> side ends 2, 3; main ready 1.75 (wait
    # 0.25), then 2.75 (wait 0.25): hidden 2 - 0.5 = 1.5 as well
    out = hidden_per_group(LayerTimes(pre=0.25, post=0.5, swap=[1.0, 2.0]), 2)
    assert out.tolist() == pytest.approx([1.5, 1.5])


def test_swap_in_term_less_the_prefetch_hidden_share():
    """With misses small against the layers' compute, every shared layer's swap-in hides: the exposed
    swap-in is the 21 anchors' share of the total; off, it is the total."""
    from simulator.costmodel import Pass
    from simulator.costmodel.passes import PassShape

    sc, off = _costs("glm-5.2-fp8")
    on = sc.cost_model(prefetch=True)
    p = Pass.uniform(8, 36864, sc.deployment.ranks_per_instance, hisparse=True, missed_rows=0.13 * 2048 * 78 * 8)
    s_off, s_on = off.pass_time(p).parts["swap-in"][0], on.pass_time(p).parts["swap-in"][0]
    lt = on.layer_times(PassShape.of(on, p), p.ranks[0])
    assert float(lt.swap) < float(lt.post)  # the regime where every copy hides
    assert s_on == pytest.approx(s_off * 21 / 78)
    # a model without shared layers: the flag changes nothing
    sc51, c51 = _costs("glm-5.1-fp8")
    assert not sc51.cost_model(prefetch=True).prefetch


def test_hisparse_prefetch_flag_reaches_the_simulation():
    import dataclasses as dc

    import numpy as np

    from simulator.serving.misses import MissProfiles
    from simulator.serving.model import InstanceSim

    sc, _ = _costs("glm-5.2-fp8")
    prof = MissProfiles((np.full(100, 0.13),), "test")
    on = InstanceSim(sc, "hisparse", concurrency=4, profiles=prof)
    off = InstanceSim(sc.replace(hisparse=dc.replace(sc.hisparse, prefetch=False)), "hisparse", concurrency=4,
                      profiles=prof)
    assert on.cost.prefetch and not off.cost.prefetch
    assert not InstanceSim(sc, "baseline", concurrency=4).cost.prefetch


def test_prefetch_is_off_under_pipeline_parallelism():
    """SGLang disables the shared-index prefetch when pp_size != 1 (the guard PR #36331 describes): a
    deployment that says pp > 1 gets the whole swap-in on the critical path."""
    import dataclasses as dc


    sc, _ = _costs("glm-5.2-fp8")
    dep = dc.replace(sc.deployment)
    object.__setattr__(dep, "pp", 2)  # a deployment key another helper adds; read with getattr
    assert sc.cost_model(prefetch=True).prefetch
    assert not sc.cost_model(deployment=dep, prefetch=True).prefetch


def test_launch_names_the_prefetch_switch():
    import dataclasses as dc

    from simulator.serving.launch import launch_command

    sc, _ = _costs("glm-5.2-fp8")
    off = launch_command(sc.model, sc.deployment, dc.replace(sc.hisparse, prefetch=False))
    assert any("SGLANG_DISABLE_HISPARSE_PREFETCH=1" in n for n in off.notes)
    assert not any("PREFETCH" in n for n in launch_command(sc.model, sc.deployment, sc.hisparse).notes)

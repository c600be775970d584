"""DeepGEMM's masked grouped GEMM for the routed experts of a DeepEP decode pass
(``costmodel/masked_gemm.py``; its measurement: tests/test_masked_gemm.py): the term by hand on a small case, its selection (DeepEP
deployments' decode passes only), and the deployment key's errors."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.costmodel.host_sync import deepep_host_wait_s
from simulator.costmodel.masked_gemm import MASKED_GROUPED_GEMM, LaunchFit, MaskedGroupedGemm
from simulator.costmodel.ops import RANK_MOE_OPS, Op, rank_moe_ops
from simulator.costmodel.pass_terms import Provenance
from simulator.costmodel.passes import MASKED_KIND
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.launch import launch_command
from simulator.serving.scenario import load_scenario
from tests.fuzzing import assert_clean_error, run_cli
from tests.helpers import decode_pass

TERM = "DeepEP routed GEMM"


pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(deployment: str, model: str = "glm-5.2-fp8", **dep) -> CostModel:
    sc = load_scenario(model=model, deployment=deployment)
    d = dataclasses.replace(sc.deployment, **dep) if dep else sc.deployment
    return sc.cost_model(deployment=d)


def _term_parts(c: CostModel, p: Pass) -> dict:
    """What the DeepEP-decode term itself prices in pass ``p``."""
    from simulator.costmodel import pass_terms
    from simulator.costmodel.passes import PassShape

    term = next(t for t in pass_terms.PASS_TERMS if t.name == TERM)
    return term.price(c, PassShape.of(c, p), None)


def test_masked_term_by_hand_on_a_small_case():
    k = MaskedGroupedGemm(fits=(LaunchFit("down", 512, 256, 2e-6, 4.0e12),), ref_hbm_bw=4.0e12, block_m=64)
    # 4 experts of [K 256 x N 512] FP8, 3 touched, 10 rows: weights 3 x 256 x 512 B, activations bf16
    op = Op("routed_down", MASKED_KIND, "fp8", flops=2 * 10 * 256 * 512, bytes=3 * 256 * 512 + 2 * 10 * (256 + 512),
            m=4, k=256, n=512, groups=4, tokens=10, weight_groups=3)
    # bandwidth-bound on a GPU of the figure's HBM and a big FP8 rate
    assert k.time(op, 4.0e12, 1e30) == pytest.approx(2e-6 + (393216 + 15360) / 4.0e12)
    # another GPU: the bandwidth scales with its HBM over the reference's; the fixed part does not
    assert k.time(op, 2.0e12, 1e30) == pytest.approx(2e-6 + (393216 + 15360) / 2.0e12)
    # compute-bound on a slow GPU: one 64-row block per touched expert (10 / 3 rows each round up)
    padded = 2.0 * 64 * 256 * 512 * 3
    assert k.time(op, 4.0e12, 1e9) == pytest.approx(2e-6 + padded / 1e9)
    # 130 rows on 2 touched experts: 65 each, two blocks
    big = dataclasses.replace(op, tokens=130, weight_groups=2)
    assert k.time(big, 4.0e12, 1e9) == pytest.approx(2e-6 + 2.0 * 2 * 64 * 256 * 512 * 2 / 1e9)
    assert k.time(dataclasses.replace(op, count=3), 4.0e12, 1e30) == pytest.approx(3 * k.time(op, 4.0e12, 1e30))


def test_compute_poor_gpu_is_compute_bound():
    # H20: 296 TFLOP/s dense FP8 and 4.0 TB/s; 32 groups x 64 rows, N 4096, K 7168 padded to one block each
    op = Op("routed_gate_up", MASKED_KIND, "fp8", flops=2.0 * 32 * 64 * 4096 * 7168,
            bytes=32 * 4096 * 7168 + 2 * 32 * 64 * (4096 + 7168), k=7168, n=4096, groups=32, tokens=32 * 64)
    t = MASKED_GROUPED_GEMM.time(op, 4.0e12, 2.96e14)
    fixed = MASKED_GROUPED_GEMM.fit(4096, 7168).fixed_s
    assert t == pytest.approx(fixed + 2.0 * 32 * 64 * 4096 * 7168 / 2.96e14)
    # DeepGEMM issue #114 (reproduced on an H20 in PR #116): 485 us; the peak-rate term is within 20%
    assert 0.8 * 485e-6 < t < 485e-6


def test_a_deepep_decode_pass_prices_the_routed_gemms_by_the_masked_term():
    c = _cost("8xh200-dp8-ep8-glm52-balanced")
    batch, ctx = 8, 8 * 8704.0
    step = decode_pass(c, batch, ctx)
    tokens = 8 * batch
    masked = c.routed_masked_ops(tokens)
    assert {o.name for _, o in masked} == {"routed_gate_up", "routed_down"}
    hbm, fp8 = 4.8e12, 2 * 9.89e14  # the H200's datasheet HBM and dense FP8 (2 x BF16; gpus/h200.toml)
    by_hand = sum(n * MASKED_GROUPED_GEMM.time(o, hbm, fp8) for n, o in masked)
    # GLM-5.2: 75 MoE layers x (gate/up 32 experts x 6144 x 4096 + down 32 x 2048 x 6144 FP8) at the H100's
    # measured lines x 4.8 / 3.35 (3.6 / 4.1 TB/s)
    assert c.m.moe_layers == 75
    touched = 1 - (1 - 8 / 256) ** 64
    up, down = (32 * 2 * 6144 * 2048 * c.layout.routed_bytes * touched, 32 * 6144 * 2048 * c.layout.routed_bytes * touched)
    want = sum(f.fixed_s + w / (f.bw * 4.8 / 3.35) for f, w in zip(MASKED_GROUPED_GEMM.fits, (up, down), strict=True))
    assert by_hand == pytest.approx(75 * want, rel=0.02)
    # the pass: the MLP side without the two GEMMs, then the masked term, summing to the old composition
    base = _cost("8xh200-dp8-ep8-glm52-balanced", moe_a2a_backend="none")
    old = decode_pass(base, batch, ctx)
    measured = sum(n * base.op_time(o) for n, o in base.mlp_side_ops(tokens) if o.name in {"routed_gate_up", "routed_down"})
    # and DeepEP's shared expert (whole on every GPU, DeepseekV2MoE tp_size=1) and router, on the rank's own
    # tokens at its padded graph batch (forward_deepep), where the TP-sharded layout runs them on every rank's
    assert not any(o.name in RANK_MOE_OPS for _, o in c.mlp_side_ops(tokens))
    rank = \
        sum(c.m.moe_layers * c.op_time(o) for o in rank_moe_ops(c.m, 8, c.layout))
    sharded = sum(n * base.op_time(o) for n, o in base.mlp_side_ops(tokens) if o.name in RANK_MOE_OPS)
    assert rank > sharded
    # the collectives: DeepEP's low-latency rows at its received-bytes figure in the 75 MoE layers, the 3 dense
    # layers' gather and scatter (MAX_LEN) in both; without DeepEP the NCCL all-to-all (bus factor 7/8)
    ic, h = c.g.interconnect, c.m.hidden_size
    rows = tokens / 8 * 8
    a2a = ic.received_time_s("all_to_all", 8, rows * (h + 4 * h // 128)) + ic.received_time_s("all_to_all", 8, rows * h * 2)
    gather = ic.time_s("all_gather", 8, tokens * h * 2) + ic.time_s("reduce_scatter", 8, tokens * h * 2)
    assert float(step.comm_s[0]) == pytest.approx(75 * a2a + 3 * gather)
    comm = float(step.comm_s[0]) - float(old.comm_s[0])
    assert float(step.total_s[0]) == pytest.approx(float(old.total_s[0]) - measured + by_hand + rank - sharded + comm)
    # DeepGEMM's masked kernel streams faster than torch._scaled_grouped_mm (our measured grouped term): ~8 ms less
    assert float(step.parts["routed experts"][0]) < float(old.parts["routed experts"][0]) - 5e-3


def test_the_masked_term_is_selected_only_for_deepep_decode_passes():
    dep = _cost("8xh200-dp8-ep8-glm52-balanced")
    assert dep.d.a2a_backend == "deepep" and dep.deepep_masked(extend=False)
    # DeepEP's normal mode in an extend pass (contiguous layout): the measured term stays
    assert not dep.deepep_masked(extend=True)
    prefill = Pass((RankWork(chunks=((2048, 0),)),) * 8)
    assert not _term_parts(dep, prefill)
    assert _term_parts(dep, Pass.uniform(8, 8704.0, 8)) == dep.routed_masked(64)
    # every shipped deployment: selected exactly where the a2a backend is DeepEP (moe = "ep")
    for name in P.preset_names("deployments"):
        d = P.load("deployments", name)
        c = _cost(name, model="glm-5.1-fp8")
        assert c.deepep_masked(extend=False) == (d.moe == "ep"), name
        if d.moe != "ep":
            assert not _term_parts(c, Pass.uniform(4, 4096.0, d.ranks_per_instance)), name
    # the EP layout without DeepEP: no masked term, and the launch command drops the flag
    none = _cost("8xh200-dp8-ep8-glm52-balanced", moe_a2a_backend="none")
    assert not none.deepep_masked(extend=False)
    src = next(t for t in none.term_sources() if t["term"] == TERM)["source"]
    assert src.startswith("not used")
    argv = launch_command(none.m, none.d, None).argv
    assert "--ep-size" in argv and "--moe-a2a-backend" not in argv
    argv = launch_command(dep.m, dep.d, None).argv
    assert argv[argv.index("--moe-a2a-backend") + 1] == "deepep"
    # FP4 routed experts keep their measured term (DeepGEMM's masked kernel is FP8)
    fp4 = CostModel(dataclasses.replace(dep.m, routed_expert_bytes_per_param=0.5625), dep.g, dep.d, dep.p, dep.terms)
    assert fp4.layout.routed_dtype == "fp4" and not fp4.deepep_masked(extend=False)


def test_provenance_measured_on_the_h100_derived_elsewhere():
    sc = load_scenario(model="glm-5.2-fp8", deployment="8xh200-dp8-ep8-glm52-balanced", gpu="h100")
    h100 = sc.cost_model()
    t = next(t for t in h100.term_sources() if t["term"] == TERM)
    assert t["priced"] == Provenance.MEASURED and "H100" in t["source"]
    c = _cost("8xh200-dp8-ep8-glm52-balanced")
    t = next(t for t in c.term_sources() if t["term"] == TERM)
    assert t["priced"] == Provenance.DERIVED and "x 1.43" in t["source"]
    op = h100.routed_masked_ops(64)[0][1]
    assert h100.op_time(op) > c.op_time(op)  # 3.35 TB/s against 4.8


def test_deepep_needs_the_ep_layout(capsys):
    with pytest.raises(HisparseError, match="moe_a2a_backend"):
        P.load("deployments", "8xh200-colocated-dp8", moe_a2a_backend="deepep")
    with pytest.raises(HisparseError, match="moe_a2a_backend"):
        P.load("deployments", "8xh200-colocated-dp8-ep8", moe_a2a_backend="pplx")
    code, _, err = run_cli(["plan", "--deployment", "8xh200-colocated-dp8", "--set",
                            "deployment.moe_a2a_backend=deepep"], capsys)
    assert_clean_error(code, err, "moe_a2a_backend")


def test_deepep_all_to_all_rows_per_token_by_kernel_mode():
    c = _cost("8xh200-dp8-ep8-glm52-balanced")  # GLM-5.2: top-8 of 256 experts over 8 ranks
    assert c.a2a_copies_per_token(extend=False) == 8.0  # low-latency: one row per selected expert
    # normal kernels: once per rank holding one of the token's experts (none of the 8 on a rank:
    # C(224, 8) / C(256, 8))
    none_here = math.comb(224, 8) / math.comb(256, 8)
    assert c.a2a_copies_per_token(extend=True) == pytest.approx(8 * (1 - none_here))
    assert 5.2 < c.a2a_copies_per_token(extend=True) < 5.4
    ic, h = c.g.interconnect, c.m.hidden_size
    row = h + 4 * h // 128  # FP8 values + an fp32 scale per 128 channels
    for extend, copies in ((False, 8.0), (True, 8 * (1 - none_here))):
        n = 4096 / 8 * copies  # 4096 instance tokens, one rank's share
        # DeepEP's bandwidths count every row a rank receives, its own included (test_intranode.py:
        # recv_x.numel() * 2 over the time): the rank's rows over the figure, no (n - 1) / n
        busbw, lat = 153e9, ic.collectives["all_to_all"].latency_us * 1e-6
        want = 2 * lat + n * row / busbw + n * h * 2 / busbw
        assert ic.received_time_s("all_to_all", 8, n * row) == pytest.approx(lat + n * row / busbw)
        assert c.comm_layer(512, 4096, None if extend else 512, extend=extend) == pytest.approx(want)
    # without DeepEP the EP layout keeps min(top-k, ranks) rows
    none = _cost("8xh200-dp8-ep8-glm52-balanced", moe_a2a_backend="none")
    assert none.a2a_copies_per_token(extend=True) == none.a2a_copies_per_token(extend=False) == 8.0
    # an extend pass's collectives follow the normal kernels (fewer rows than a decode pass's)
    prefill = Pass((RankWork(chunks=((4096, 0),)),) * 8)
    assert float(c.pass_time(prefill).comm_s[0]) == pytest.approx(
        c.m.moe_layers * c.comm_layer(4096, 8 * 4096, None, extend=True)
        + c.m.dense_layers * c.comm_layer(4096, 8 * 4096, None, extend=True, dense=True)
        + deepep_host_wait_s(c.m.moe_layers))  # and the normal dispatch's host wait (costmodel/host_sync.py)
    assert float(c.pass_time(prefill).comm_s[0]) < float(none.pass_time(prefill).comm_s[0])

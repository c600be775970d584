"""CPU checks of the DeepGEMM masked grouped GEMM timing (benchmarks/deepgemm_masked_moe.py): the routed counts it
feeds the kernel, the shapes it times, the float32 reference of a block-scaled FP8 product, and the command's
errors (exit 2, no traceback). The timing itself needs a Hopper GPU and SGLang's DeepGEMM build."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import check_refuses_non_hopper_torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("deepgemm_masked_moe", ROOT / "benchmarks" / "deepgemm_masked_moe.py")
mm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mm)


def test_routed_counts_are_top_k_distinct_experts_per_token():
    """Every token picks top-k distinct experts: over all experts the counts sum to tokens x top-k, no expert gets
    a token twice, a rank's 32 of 256 experts take about an eighth of the pairs, and the draw is seeded."""
    rng = np.random.default_rng(0)
    all_counts = mm.routed_counts(rng, 12, 8, 256, 8, 256)
    assert all_counts.sum() == 8 * 12 * 8 and all_counts.max() <= 8 * 12
    local = [mm.routed_counts(np.random.default_rng(s), 12, 8, 256, 8, 32).sum() for s in range(50)]
    assert abs(np.mean(local) - 96) < 5  # 8 ranks x 12 tokens x 8 picks x 32 / 256
    assert (mm.routed_counts(np.random.default_rng(3), 4, 8, 256, 8, 32)
            == mm.routed_counts(np.random.default_rng(3), 4, 8, 256, 8, 32)).all()


def test_the_shapes_are_the_models_gate_up_and_down_then_issue_20s():
    args = mm.parse_args(["--tokens", "4", "16"])
    got = [(g, n, k, m, t, len(c)) for g, c, n, k, m, t in mm.shapes(args)]
    assert got == [("gate_up", 4096, 6144, 1024, 4, 32), ("down", 6144, 2048, 1024, 4, 32),
                   ("gate_up", 4096, 6144, 1024, 16, 32), ("down", 6144, 2048, 1024, 16, 32),
                   ("issue20", 7168, 4096, 64, 0, 256)]
    gate, down = mm.shapes(args)[:2]
    assert (gate[1] == down[1]).all()  # both projections of a step see the same routing
    assert len(mm.shapes(mm.parse_args(["--tokens", "4", "--no-issue20"]))) == 2


def test_reference_dequantises_rows_and_weight_blocks():
    torch = pytest.importorskip("torch")
    k, n = 256, 128
    a = torch.ones((1, k))
    a_sf = torch.tensor([[2.0, 0.5]])  # the first 128 K x 2, the second x 0.5
    b = torch.ones((n, k))
    b_sf = torch.tensor([[1.0, 3.0]])  # one 128-row block: K blocks x 1 and x 3
    got = mm.reference(a, a_sf, b, b_sf)
    assert got.shape == (1, n) and torch.allclose(got, torch.full((1, n), 128 * 2.0 * 1.0 + 128 * 0.5 * 3.0))


def test_weight_bandwidth_counts_the_touched_experts_weights():
    r = mm.Row("gate_up", 32, 4096, 6144, 12, 96, 30, 3, 200.0, 1e-3)
    assert r.weight_gbps == pytest.approx(30 * 4096 * 6144 / 200e-6 / 1e9) and r.ok
    assert not r._replace(rel_err=0.1).ok


@pytest.mark.parametrize("args, words", [
    (["--tokens", "0"], "--tokens must each be >= 1"),
    (["--tokens", "200"], "at most --max-m / --ranks (128)"),
    (["--experts", "100"], "--experts 100 must split evenly over --ranks 8"),
    (["--hidden", "6000"], "multiples of 128"),
    (["--reps", "0"], "--reps must be >= 1"),
])
def test_cli_errors_exit_2_without_traceback(args, words):
    run = subprocess.run([sys.executable, "benchmarks/deepgemm_masked_moe.py", *args], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 2, run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr


def test_no_gpu_or_torch_is_a_usage_error(monkeypatch):
    check_refuses_non_hopper_torch(monkeypatch, mm.hopper_deep_gemm, mm.UsageError)


def test_the_entry_point_is_whichever_name_the_build_exports():
    """DeepGEMM renamed the masked GEMM across releases; sgl-deep-gemm 0.1.3 exports only the fp8_fp4 name and an
    alias. The first exported name is used, and a build with none is a usage error (exit 2), not a traceback."""
    from types import SimpleNamespace

    def f(*_a, **_k):
        return None

    assert mm.masked_entry(SimpleNamespace(fp8_m_grouped_gemm_nt_masked=f))[0] == "fp8_m_grouped_gemm_nt_masked"
    both = SimpleNamespace(m_grouped_fp8_fp4_gemm_nt_masked=f, fp8_m_grouped_gemm_nt_masked=f)
    assert mm.masked_entry(both)[0] == "m_grouped_fp8_fp4_gemm_nt_masked"
    with pytest.raises(mm.UsageError, match="exports none of"):
        mm.masked_entry(SimpleNamespace(m_grouped_fp8_gemm_nt_masked=None))
    sf = object()
    assert mm.deep_gemm_sfa_layout(SimpleNamespace(), sf) is sf
    aligned = SimpleNamespace(get_mn_major_tma_aligned_tensor=lambda x: ("aligned", x))
    assert mm.deep_gemm_sfa_layout(aligned, sf) == ("aligned", sf)

"""`hisparse plan --model glm-5.2-fp8` (also with EAGLE 1-1-2) and `--model deepseek-v4-flash` on every shipped GPU and
deployment: each runs (a system that cannot hold one request left out with its reason), or refuses with exit 2 and a one-line reason (never a traceback)."""

from __future__ import annotations

import pytest

from simulator.cli import main
from simulator.serving import presets as P

FAST = [("glm-5.2-fp8", "h200", "8xh200-colocated-dp8"), ("deepseek-v4-flash", "h200", "8xh200-tp8"),
        ("deepseek-v4-flash", "h20", "2xh20-pd-decode")]


def _plan(capsys, model, gpu, dep, *extra):
    rc = main(["plan", "--model", model, "--gpu", gpu, "--deployment", dep, "--concurrency", "2", "--no-search",
               "--quiet", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("model, gpu, dep", FAST)
def test_plan_runs(capsys, model, gpu, dep):
    rc, out, err = _plan(capsys, model, gpu, dep)
    assert rc == 0, err
    assert "recommendation" in out and "Traceback" not in err


def test_dsv4_plan_reports_its_own_pools(capsys):
    rc, out, _ = _plan(capsys, "deepseek-v4-flash", "h200", "8xh200-colocated-dp8", "--set", "hisparse.c4_pool=request")
    assert rc == 0 and "full (logical) tokens" in out and "compressed rows (request)" in out
    assert "--hisparse-config: deepseek-v4-flash's preset (top_k 512)" in out


def test_plan_shows_and_switches_the_prefetch(capsys):
    rc, out, _ = _plan(capsys, "glm-5.2-fp8", "h200", "8xh200-colocated-dp8")
    assert rc == 0 and "IndexShare prefetch on: 21 anchor + 57 shared layers" in out
    rc, off, _ = _plan(capsys, "glm-5.2-fp8", "h200", "8xh200-colocated-dp8", "--set", "hisparse.prefetch=false")
    assert rc == 0 and "IndexShare prefetch OFF" in off and "would hide" in off
    assert "SGLANG_DISABLE_HISPARSE_PREFETCH=1" in off or "baseline" in off.split("launch (")[1][:20]


def test_a_configuration_that_cannot_fit_says_why(capsys):
    """DeepSeek-V4-Pro on 8xH200 DP8: a 32K prompt does not fit HiSparse's device pool while it
    prefills (0.8 GB of KV budget after the weights), so HiSparse is left out with its reason and
    fix, and the baseline is planned."""
    rc, out, err = _plan(capsys, "deepseek-v4-pro", "h200", "8xh200-colocated-dp8")
    assert rc == 0 and "Traceback" not in err
    assert "): cannot run, left out of the plan:" in out and "== hisparse (device_buffer_size" in out
    assert "one request of 32768 + 8192 tokens needs" in out and "fix: a lower host_to_device_ratio" in out
    assert "recommendation (TPOT p99 <= 100 ms, TTFT p99 <= 30 s): baseline" in out


@pytest.mark.slow
@pytest.mark.parametrize("model, extra", [("glm-5.2-fp8", ()),
                                          ("glm-5.2-fp8", ("--speculative", "eagle:1-1-2", "--accept-len", "2")),
                                          ("deepseek-v4-flash", ())], ids=["glm-5.2", "glm-5.2-eagle", "dsv4-flash"])
def test_every_gpu_and_deployment(capsys, model, extra):
    for gpu in P.preset_names("gpus"):
        for dep in P.preset_names("deployments"):
            rc, out, err = _plan(capsys, model, gpu, dep, *extra)
            assert rc in (0, 2), (gpu, dep, err)
            assert "Traceback" not in err
            if rc == 2:
                assert err.strip().startswith("hisparse: error:") and len(err.strip().splitlines()) == 1, (gpu, dep, err)
            else:
                assert "recommendation" in out

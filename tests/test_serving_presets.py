"""Every shipped preset combination runs (or is refused with one clear error naming the files), and
random values for every key of every preset kind give exit 2 naming the file and key, or a run;
never a traceback. The number of random examples follows the hypothesis profile (tests/fuzzing.py)."""

from __future__ import annotations

import dataclasses
import itertools
import tomllib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.misses import MissProfiles
from simulator.serving.model import System, simulate
from simulator.serving.scenario import load_scenario
from tests.fuzzing import examples_for

PROFILES = MissProfiles((np.full(64, 0.1), np.full(64, 0.05)), "test")
# The combinations a deployment is meant for run; others may be refused, but only cleanly.
# the models each of these deployments is meant for (DeepSeek-V4 runs on its own deployments;
# tests/test_models_plan_grid.py holds it to run or refuse with a reason on every one)
MEANT_MODELS = ("glm-5.1-fp8", "glm-5.1-fp8-kvfp8", "glm-5.2-fp8", "deepseek-v3.2-fp8", "deepseek-v3.2-fp8-kvfp8")
MEANT = {(d, m) for d in ("8xh200-colocated-dp8", "8xh200-tp8", "2xh20-pd-decode") for m in MEANT_MODELS} | {
    ("8xrtx-pro-6000-tp8-pd-decode", "glm-5.1-nvfp4")}  # PR #33075's SM120 decode side: the NVFP4 checkpoint


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.slow  # every model on every shipped deployment: 25-150 s per deployment on 2 cores
@pytest.mark.parametrize("deployment", P.preset_names("deployments"))
def test_every_shipped_combination_runs(deployment):
    ran = refused = 0
    for model, gpu, hs, workload in itertools.product(P.preset_names("models"), P.preset_names("gpus"),
                                                      P.preset_names("hisparse"), P.preset_names("workloads")):
        try:
            sc = load_scenario(model=model, gpu=gpu, deployment=deployment, workload=workload, hisparse=hs)
            w = dataclasses.replace(sc.workload, output_tokens=min(sc.workload.output_tokens, 32),
                                    requests_per_client=1)
            sc = sc.replace(workload=w)
            load = dict(rate_per_s=w.rate_per_s) if w.arrival == "open" else dict(concurrency=4)
            for system in System:
                r = simulate(sc, system, profiles=PROFILES if system == System.HISPARSE else None, **load)
                assert r.requests > 0 and r.makespan_tok_s_deployment > 0
            ran += 1
        except HisparseError as exc:
            # a combination meant to run refuses only with a HiSparse config of another model's top_k
            meant = (deployment, model) in MEANT and gpu == P.load("deployments", deployment).gpu
            assert not meant or P.load("hisparse", hs).top_k != P.load("models", model).top_k, str(exc)
            assert ".toml" in str(exc), str(exc)  # names the files
            refused += 1
    assert ran > 0


# -- random values per key --------------------------------------------------------------------------
SMALL_WORKLOAD = 'name = "tiny"\ninput_tokens = 4096\noutput_tokens = 16\nlength_jitter = 0.0\narrival = "closed"\n' \
                 'rate_per_s = 0.0\nrequests_per_client = 1\n'
OPTION = {"models": "--model", "gpus": "--gpu", "deployments": "--deployment", "hisparse": "--hisparse-config",
          "workloads": "--workload", "calibration": "--calibration"}
SHIPPED = {"models": "glm-5.1-fp8", "gpus": "h200", "deployments": "8xh200-colocated-dp8", "hisparse": "blog-8xh200",
           "workloads": "32k-in-8k-out", "calibration": "uncalibrated"}
EXAMPLES = examples_for(40)  # full count 40 (slow profile); tests/fuzzing.py

values = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False, width=64).filter(lambda v: abs(v) < 1e16 or v != v or abs(v) == float("inf")),
    st.sampled_from([0, 0.0, -1, 1e-9, 0.5, 1.0, 1.5, "", "x", "dp", "tp", "pd-decode", True, False, [1, 2], {"a": 1}]),
    st.text(max_size=8),
)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').encode("unicode_escape").decode().replace("\\\\u", "\\u") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"


def _keys(kind: str) -> list[str]:
    data = tomllib.loads((P.PRESET_DIR / kind / f"{SHIPPED[kind]}.toml").read_text())
    return [k for k, v in data.items() if not isinstance(v, dict)]


CASES = [(kind, key) for kind in SHIPPED for key in _keys(kind)]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES), value=values)
def test_random_preset_values_are_refused_cleanly_or_run(tmp_path_factory, case, value):
    kind, key = case
    tmp = tmp_path_factory.mktemp("fuzz")
    text = (P.PRESET_DIR / kind / f"{SHIPPED[kind]}.toml").read_text()
    lines = [ln for ln in text.splitlines() if not ln.split("#")[0].strip().startswith(f"{key} ")
             and not ln.split("#")[0].strip().startswith(f"{key}=")]
    lines.insert(next(i for i, ln in enumerate(lines) if ln.startswith("[")) if any(ln.startswith("[") for ln in lines)
                 else len(lines), f"{key} = {_toml_value(value)}")
    path = tmp / f"{kind}.toml"
    path.write_text("\n".join(lines) + "\n")
    workload = tmp / "tiny.toml"
    workload.write_text(SMALL_WORKLOAD)
    args = ["plan", "--quiet", "--concurrency", "2", "--workload", str(workload), OPTION[kind], str(path)]
    if kind == "workloads":
        args = ["plan", "--quiet", "--concurrency", "2", OPTION[kind], str(path)]
        data = tomllib.loads(path.read_text()) if _parses(path) else {}
        if isinstance(data.get("requests_per_client"), int) and data["requests_per_client"] > 4:
            return  # a valid but long run: not what this property checks
        if isinstance(data.get("output_tokens"), int) and data["output_tokens"] > 10**5:
            return
    before = path.read_bytes()
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    assert code in (0, 2)
    assert path.read_bytes() == before
    if code == 2:
        msg = err.getvalue().strip()
        assert msg.count("\n") == 0 and msg.startswith("hisparse: error: "), msg
        assert str(path) in msg or "no room" in msg or "pool" in msg, msg


def _parses(path) -> bool:
    try:
        tomllib.loads(path.read_text())
        return True
    except tomllib.TOMLDecodeError:
        return False

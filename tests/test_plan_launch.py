"""hisparse plan's launch artefacts: the SGLang command and --hisparse-config of a configuration,
round-tripped back to the deployment and HiSparse presets they came from (issue #29 item 3)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex

import pytest

from simulator.cli import main
from simulator.serving.launch import launch_command
from simulator.serving.presets import load, preset_names
from simulator.serving.specs import Attention, Mode, MoeLayout


def _sglang_parser() -> argparse.ArgumentParser:
    """The launch_server flags the command uses, as SGLang's server_args spells them."""
    p = argparse.ArgumentParser()
    p.add_argument("--model-path")
    p.add_argument("--tp-size", type=int)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--moe-a2a-backend", default="none")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-running-requests", type=int, default=0)
    p.add_argument("--max-total-tokens", type=int, default=0)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bfloat16"])
    p.add_argument("--schedule-conservativeness", type=float, default=1.0)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--disaggregation-mode", default="null")
    p.add_argument("--enable-hisparse", action="store_true")
    p.add_argument("--hisparse-config", default=None)
    p.add_argument("--nnodes", type=int, default=1)  # an instance across nodes (server_args.py)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None)
    return p


def _parse(command: str) -> argparse.Namespace:
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    return _sglang_parser().parse_args(argv[3:])  # an unknown flag fails here


@pytest.mark.parametrize("deployment", preset_names("deployments"))
@pytest.mark.parametrize("hisparse", [None, *preset_names("hisparse")])
def test_launch_flags_round_trip_to_the_presets(deployment, hisparse):
    model = load("models", "glm-5.1-fp8")
    dep = load("deployments", deployment)
    hs = load("hisparse", hisparse) if hisparse else None
    lc = launch_command(model, dep, hs)
    ns = _parse(lc.command)
    assert ns.tp_size == dep.tp and ns.mem_fraction_static == dep.mem_fraction_static
    assert ns.enable_dp_attention == (dep.attention == Attention.DP)
    assert ns.dp_size == (dep.dp if dep.attention == Attention.DP else 1)
    assert (ns.ep_size, ns.moe_a2a_backend) == ((dep.tp, "deepep") if dep.moe == MoeLayout.EP else (1, "none"))
    assert ns.max_running_requests == dep.max_running_requests and ns.max_total_tokens == dep.max_total_tokens
    per_rank = ns.chunked_prefill_size // (ns.dp_size if ns.enable_dp_attention else 1)
    assert per_rank == dep.prefill_chunk_tokens
    assert ns.schedule_conservativeness == dep.schedule_conservativeness and ns.page_size == dep.page_size
    assert ns.disable_radix_cache == (not dep.radix_cache or hs is not None)  # HiSparse requires it off
    assert (ns.disaggregation_mode == "decode") == (dep.mode == Mode.PD_DECODE)
    assert ns.kv_cache_dtype == "bfloat16"  # 1152 B rows
    assert ns.enable_hisparse == (hs is not None)
    if hs is None:
        assert ns.hisparse_config is None and lc.hisparse_config is None
    else:
        cfg = json.loads(ns.hisparse_config)
        assert cfg == lc.hisparse_config
        assert cfg == {"top_k": hs.top_k, "device_buffer_size": hs.device_buffer_size,
                       "host_to_device_ratio": hs.host_to_device_ratio}


def test_fp8_kv_rows_launch_with_an_fp8_kv_cache():
    lc = launch_command(load("models", "deepseek-v3.2-fp8-kvfp8"), load("deployments", "8xh200-colocated-dp8"), None)
    ns = _parse(lc.command)
    assert ns.kv_cache_dtype == "fp8_e4m3" and ns.model_path == "deepseek-ai/DeepSeek-V3.2"


def test_plan_prints_and_writes_the_recommendations_launch(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", "--concurrency", "16,64", "--slo-ttft-s", "none", "--json", "--quiet", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    rec, launch = report["recommendation"], report["launch"]
    assert rec["choice"]["system"] == "hisparse" and launch["choice"]["system"] == "hisparse"
    hs = load("hisparse", "blog-8xh200")
    expect = {"top_k": hs.top_k, "device_buffer_size": hs.device_buffer_size, "host_to_device_ratio": 8}
    assert launch["choice"]["hisparse_config"] == launch["hisparse"]["hisparse_config"] == expect
    assert launch["baseline"]["hisparse_config"] is None
    assert json.loads((out / "hisparse-config.json").read_text()) == expect
    script = (out / "launch.sh").read_text().splitlines()
    assert script[-1] == launch["choice"]["command"]
    ns = _parse(script[-1])
    dep = load("deployments", "8xh200-colocated-dp8")
    assert (ns.tp_size, ns.dp_size, ns.max_running_requests) == (dep.tp, dep.dp, dep.max_running_requests)
    assert json.loads(ns.hisparse_config) == expect
    assert main(["plan", "--concurrency", "1", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "launch (" in text and "python -m sglang.launch_server --model-path zai-org/GLM-5.1-FP8" in text


def test_launch_script_exports_the_environment_and_keeps_the_notes(tmp_path):
    """launch.sh held the command alone: a plan with the IndexShare prefetch off launched a server with it on (the
    SGLANG_DISABLE_HISPARSE_PREFETCH note was printed, not written); the script is executable and valid sh."""
    import os
    import subprocess

    from simulator.serving.launch import launch_script

    lc = launch_command(load("models", "glm-5.2-fp8"), load("deployments", "8xh200-dp8-ep8-glm52-balanced"),
                        dataclasses.replace(load("hisparse", "blog-8xh200"), prefetch=False))
    assert dict(lc.env) == {"SGLANG_DISABLE_HISPARSE_PREFETCH": "1"}
    text = launch_script(lc.as_dict(), "hisparse plan: test")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/sh" and lines[-1] == lc.command
    assert "export SGLANG_DISABLE_HISPARSE_PREFETCH=1" in lines
    assert any(line.startswith("# note: IndexShare prefetch off") for line in lines)
    path = tmp_path / "launch.sh"
    path.write_text(text)
    assert subprocess.run(["sh", "-n", str(path)]).returncode == 0
    # the plan writes it so, executable
    out = tmp_path / "plan"
    assert main(["plan", "--model", "glm-5.2-fp8", "--deployment", "8xh200-dp8-ep8-glm52-balanced", "--concurrency",
                 "8", "--no-search", "--quiet", "--set", "hisparse.prefetch=false", "--slo-ttft-s", "none",
                 "--out", str(out)]) == 0
    written = (out / "launch.sh").read_text()
    assert written.splitlines()[0] == "#!/bin/sh" and os.access(out / "launch.sh", os.X_OK)
    launches = json.loads((out / "plan.json").read_text())["launch"]
    assert launches["hisparse"]["env"] == {"SGLANG_DISABLE_HISPARSE_PREFETCH": "1"} and launches["baseline"]["env"] == {}


def test_the_load_line_names_bench_servings_tokenize_prompt_when_the_workload_sends_ids(capsys):
    # the prediction depends on it: text prompts queue at SGLang's TokenizerManager, token ids do not
    assert main(["plan", "--concurrency", "2", "--no-search", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "bench_serving --max-concurrency" in text and "--tokenize-prompt" not in text
    assert main(["plan", "--concurrency", "2", "--no-search", "--quiet", "--set", "workload.tokenize_prompt=true"]) == 0
    text = capsys.readouterr().out
    assert "--tokenize-prompt)" in text

"""``hisparse plan``: capacity planning, baseline against HiSparse."""

from __future__ import annotations

import argparse
import json
import os

from .common import (
    Output,
    buffer_size,
    comma_list,
    declare_io,
    positive_float,
    positive_int,
    print_json,
    seed_int,
)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="capacity planning: throughput and latency, baseline against HiSparse",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Simulate a deployment serving a workload at each concurrency, once with every token's KV "
                    "in HBM (baseline) and once with HiSparse's hot buffers, host pool and swap-in, and recommend "
                    "the best configuration under a TPOT target.\n\nWith no options it runs the published scenario: "
                    "GLM-5.1-FP8, 32k input + 8k output, 8xH200 colocated with DP attention, HiSparse "
                    "{top_k 2048, device_buffer_size 4096, host_to_device_ratio 8}, concurrency 1..256, misses "
                    "from the bundled DSA-like trace.\n\nEvery preset option takes a preset name or the path of "
                    "your own TOML file (copy one from simulator/presets/ and edit it).")
    p.add_argument("--model", default="glm-5.1-fp8", help="model preset or file (default glm-5.1-fp8)")
    p.add_argument("--gpu", default=None, help="GPU preset or file (default: the deployment's)")
    p.add_argument("--deployment", default="8xh200-colocated-dp8", help="deployment preset or file")
    p.add_argument("--workload", default="32k-in-8k-out", help="workload preset or file")
    p.add_argument("--hisparse-config", dest="hisparse", default="blog-8xh200", help="HiSparse config preset or file")
    p.add_argument("--calibration", default="auto",
                   help="cost-model parameters: a preset, a TOML file, or a calibration JSON from hisparse calibrate "
                        "(default auto: calibration/<gpu>.json when the repository has one, else uncalibrated)")
    p.add_argument("--trace", default=None, help="trace whose replay gives the misses (default: bundled DSA-like)")
    p.add_argument("--concurrency", type=comma_list(positive_int), default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                   help="comma-separated concurrencies (default 1,2,4,...,256)")
    p.add_argument("--rate", type=comma_list(positive_float), default=[],
                   help="open loop: comma-separated arrival rates in requests/s (whole deployment), swept "
                        "instead of --concurrency; an open-loop workload file without --rate uses its rate_per_s")
    p.add_argument("--slo-tpot-ms", type=positive_float, default=100.0, help="TPOT p99 target for the recommendation (default 100)")
    p.add_argument("--sweep-buffer", type=comma_list(buffer_size), default=[], help="also sweep device_buffer_size, e.g. 2048,4096,6144")
    p.add_argument("--sweep-host-ratio", type=comma_list(positive_float), default=[], help="also sweep host_to_device_ratio, e.g. 2,4,8")
    p.add_argument("--seed", type=seed_int, default=0, help="seed for request lengths and arrivals (default 0)")
    p.add_argument("--json", action="store_true", help="print rows and recommendation as JSON")
    p.add_argument("--out", metavar="DIR", help="write plan.csv, plan.json and throughput.png into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run_plan_cmd)
    declare_io(p, inputs=["model", "gpu", "deployment", "workload", "hisparse", "calibration", "trace"],
               outputs=[Output("out", kind="dir")])


COLUMNS = ["concurrency", "rate_per_s", "throughput_tok_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "running", "max_running",
           "hbm_used_gb", "host_used_gb", "miss_share"]


def run_plan_cmd(args: argparse.Namespace) -> int:
    from ..progress import progress
    from ..serving.planner import PlanInputs, recommend, run_plan

    inp = PlanInputs(model=args.model, gpu=args.gpu, deployment=args.deployment, workload=args.workload,
                     hisparse=args.hisparse, calibration=args.calibration, trace=args.trace,
                     concurrency=tuple(args.concurrency), rates=tuple(args.rate), slo_tpot_ms=args.slo_tpot_ms,
                     buffers=tuple(args.sweep_buffer), host_ratios=tuple(args.sweep_host_ratio), seed=args.seed)
    n_points = (len(inp.rates) or len(inp.concurrency)) * (1 + max(1, len(inp.buffers)) * max(1, len(inp.host_ratios)))
    bar = iter(progress(range(n_points), total=n_points, desc="points", quiet=args.quiet, unit="pt"))
    rows = run_plan(inp, on_point=lambda: next(bar, None))
    rec = recommend(rows, args.slo_tpot_ms)
    report = {"inputs": vars(inp) | {"concurrency": list(inp.concurrency), "rates": list(inp.rates)}, "rows": rows,
              "recommendation": rec}
    if args.out:
        _write_outputs(args.out, rows, report)
    if args.json:
        print_json(report)
        return 0
    _print_report(rows, rec)
    return 0


def _print_report(rows: list[dict], rec: dict) -> None:
    import pandas as pd

    df = pd.DataFrame(rows)
    for (system, buf, ratio), grp in df.groupby(["system", "device_buffer_size", "host_to_device_ratio"], dropna=False,
                                                sort=False):
        title = system if system == "baseline" else f"hisparse (device_buffer_size {int(buf)}, host ratio {ratio:g})"
        print(f"== {title}")
        print(grp[COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.1f}" if abs(v) >= 1 else f"{v:.3f}"))
        print()
    if rows[0]["calibrated"]:
        print(f"cost model: swap-in and attention terms calibrated ({rows[0]['calibration']}); weight, MoE, "
              "indexer, overhead and prefill terms stay at their uncalibrated defaults")
    else:
        print("cost model: UNCALIBRATED (defaults from the brief's figures); see simulator/presets/calibration/")
    choice = rec["choice"]
    if choice is None:
        print(f"recommendation: no configuration meets TPOT p99 <= {rec['slo_tpot_ms']:g} ms")
        return
    knobs = "" if choice["system"] == "baseline" else (
        f" with device_buffer_size {choice['device_buffer_size']}, host_to_device_ratio {choice['host_to_device_ratio']:g}")
    load = (f"concurrency {choice['concurrency']}" if choice["concurrency"] else
            f"{choice['rate_per_s']:g} requests/s")
    print(f"recommendation (TPOT p99 <= {rec['slo_tpot_ms']:g} ms): {choice['system']}{knobs} at {load}: "
          f"{choice['throughput_tok_s']:.0f} tok/s, TPOT p99 {choice['tpot_p99_ms']:.1f} ms")
    if rec["hisparse_over_baseline"]:
        print(f"best HiSparse / best baseline throughput under the target: {rec['hisparse_over_baseline']:.2f}x")


def _write_outputs(out: str, rows: list[dict], report: dict) -> None:
    import pandas as pd

    from ..fileio import atomic_output

    os.makedirs(out, exist_ok=True)
    df = pd.DataFrame(rows)
    with atomic_output(os.path.join(out, "plan.csv")) as fh:
        fh.write(df.to_csv(index=False).encode())
    with atomic_output(os.path.join(out, "plan.json")) as fh:
        fh.write(json.dumps(report, indent=2, default=str).encode())
    from ..serving.plots import plot_throughput

    plot_throughput(df, os.path.join(out, "throughput.png"))

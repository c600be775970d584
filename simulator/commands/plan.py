"""``hisparse plan``: capacity planning, baseline against HiSparse; ``--validate`` checks the serving
model against published runs."""

from __future__ import annotations

import argparse
import json
import os

from ..serving.prices import MAX_PRICE
from ..serving.slo import DEFAULT_SLO_TPOT_MS, DEFAULT_SLO_TTFT_S
from .common import (
    Output,
    buffer_size,
    comma_list,
    declare_io,
    fill_defaults,
    given_options,
    json_safe,
    nonneg_float,
    positive_float,
    positive_int,
    print_json,
    seed_int,
)
from .plan_summary import prefetch_report, scenario_summary
from .plan_text import print_bands, print_launch, print_nodes, print_report
from .plan_validate import VALIDATE_FILES, run_validate


def _presets(kind: str) -> str:
    from ..serving.presets import preset_names

    return ", ".join(preset_names(kind))


def _ttft_target(text: str) -> float:
    """--slo-ttft-s: a positive number of seconds, or none (no TTFT target); 0 is -1 here."""
    if str(text).strip().lower() == "none":
        return -1.0
    return positive_float(text)


def price(text: str) -> float:
    """An argparse type: a price in $ from 0 to ``prices.MAX_PRICE`` (1e308 printed $inf per M tokens)."""
    value = nonneg_float(text)
    if value > MAX_PRICE:
        raise argparse.ArgumentTypeError(f"expected a price from 0 to {MAX_PRICE:g} $, got {text!r}")
    return value


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from ..serving.defaults import DEFAULT_TRACE
    from ..serving.presets import published_names
    from ..serving.slo import (
        DEFAULT_SLO_TPOT_MS,
        DEFAULT_SLO_TTFT_S,
        MODEL_ERROR_BAND,
        SEARCH_REL_TOL,
    )

    p = sub.add_parser(
        "plan", help="capacity planning: throughput and latency, baseline against HiSparse",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Simulate a deployment serving a workload at each concurrency, once with every token's KV "
                    "in HBM (baseline) and once with HiSparse's hot buffers, host pool and swap-in, and recommend "
                    "the best configuration that serves the load it is offered under TPOT and TTFT p99 targets "
                    f"(default {DEFAULT_SLO_TPOT_MS:g} ms and {DEFAULT_SLO_TTFT_S:g} s). Between the swept loads it "
                    "bisects for the highest load that meets them; two systems closer than the model's error "
                    f"({MODEL_ERROR_BAND:.0%}, docs/validation.md) are reported as a tie, and a pick at the "
                    "highest load searched is flagged (extend --concurrency / --rate)."
                    "\n\nWith no options it runs the published scenario: GLM-5.1-FP8, 32k input + 8k output, "
                    "8xH200 colocated with DP attention (the blog's launch flags), HiSparse {top_k 2048, "
                    "device_buffer_size 4096, host_to_device_ratio 8}, concurrency 1..256, misses from the "
                    f"model's fitted trace preset ({DEFAULT_TRACE.generator_preset}) drawn at the 32K prompt "
                    "(traces/generated/).\n\nEvery preset option takes a preset name or the path "
                    "of your own TOML file (copy one from simulator/presets/ and edit it).\n\nThroughput columns "
                    "are output tokens/s of the whole deployment unless they say per_gpu; TTFT is in seconds.\n\n"
                    "--validate runs the model on published measurements instead and prints measured against "
                    f"predicted (shipped sets: {', '.join(published_names())}, or all).")
    p.add_argument("--model", default=None, help=f"model preset or file (default glm-5.1-fp8; presets: {_presets('models')})")
    p.add_argument("--gpu", default=None, help=f"GPU preset or file (default: the deployment's; presets: {_presets('gpus')})")
    p.add_argument("--deployment", default=None,
                   help=f"deployment preset or file (default 8xh200-colocated-dp8; presets: {_presets('deployments')})")
    p.add_argument("--workload", default=None,
                   help=f"workload preset or file (default 32k-in-8k-out; presets: {_presets('workloads')})")
    p.add_argument("--hisparse-config", dest="hisparse", default=None,
                   help=f"HiSparse config preset or file (default: the deployment's own, e.g. blog-h20-pd for "
                        f"2xh20-pd-decode, else blog-8xh200, or the model's own where its top_k differs, e.g. "
                        f"deepseek-v4-flash (top_k 512); presets: {_presets('hisparse')})")
    p.add_argument("--calibration", default="auto",
                   help="cost-model terms: auto (the calibration the GPU file names, e.g. the packaged h200 fit; "
                        f"none when it names none), none, a packaged one ({_presets('calibration')}), a TOML file or "
                        "a calibration JSON from hisparse calibrate (default auto)")
    p.add_argument("--set", dest="overrides", metavar="KIND.KEY=VALUE", action="append", default=None,
                   help="what-if: replace one preset value, after the calibration (repeatable), e.g. "
                        "gpu.link_bw=27.5e9, deployment.host_bytes=1e12, hisparse.device_buffer_size=6144, "
                        "hisparse.host_to_device_ratio=4, hisparse.policy=lru; kinds model, gpu, deployment, "
                        "workload, hisparse; keys and types: hisparse presets --schema KIND")
    p.add_argument("--trace", default=None, help="trace whose replay gives the misses (default: the model's fitted trace preset drawn at the "
                        "workload's prompt, generated once and cached; the plan prints which)")
    p.add_argument("--speculative", default=None, metavar="ALGO:STEPS-TOPK-DRAFT",
                   help="speculative decoding as SGLang's --speculative-algorithm/-num-steps/-eagle-topk/-num-draft-tokens, "
                        "e.g. eagle:5-1-6 or eagle:1-1-2 (topk 1), with --accept-len or --accept-probs; or a TOML file "
                        "with a [speculative] table (speculative, accept_len, accept_method, accept_probs; "
                        "docs/speculative-decoding.md)")
    p.add_argument("--accept-len", type=positive_float, default=None, metavar="MEAN",
                   help="--speculative: mean tokens a step keeps, as SGLANG_SIMULATE_ACC_LEN pins it (1..steps+1)")
    p.add_argument("--accept-method", choices=("multinomial", "match-expected"), default=None,
                   help="--speculative: how each step's accept length is drawn around --accept-len, as "
                        "SGLANG_SIMULATE_ACC_METHOD (default multinomial, the default of SGLang's earlier releases; its later "
                        "environ.py defaults to match-expected)")
    p.add_argument("--accept-probs", type=comma_list(nonneg_float, unique=False), default=None, metavar="P1,P2,...",
                   help="--speculative: P(accept length = 1..steps+1) per step instead of --accept-len (seeded draws)")
    p.add_argument("--compare-speculative", action="store_true", default=None,
                   help="what-if: also plan without speculative decoding and say whether it pays off at each load "
                        "(table, plot, recommendation)")
    p.add_argument("--compare-prefetch", action="store_true", default=None,
                   help="what-if: also plan HiSparse with the IndexShare prefetch off (--set hisparse.prefetch=false, "
                        "SGLANG_DISABLE_HISPARSE_PREFETCH=1) and say how much it hides at each load (table, plot, "
                        "report, JSON prefetch_whatif); an IndexShare model (glm-5.2-fp8)")
    p.add_argument("--concurrency", type=comma_list(positive_int), default=None,
                   help="comma-separated concurrencies (default 1,2,4,...,256)")
    p.add_argument("--rate", type=comma_list(positive_float), default=None,
                   help="open loop: comma-separated arrival rates in requests/s (whole deployment), swept "
                        "instead of --concurrency (give one of the two); an open-loop workload file without --rate uses its rate_per_s")
    p.add_argument("--slo-tpot-ms", type=positive_float, default=None,
                   help=f"TPOT p99 target for the recommendation, ms (default {DEFAULT_SLO_TPOT_MS:g}: 10 tokens/s "
                        "per stream, above reading speed)")
    p.add_argument("--slo-ttft-s", type=_ttft_target, default=None,
                   help=f"TTFT p99 target for the recommendation, s, or 'none' (default {DEFAULT_SLO_TTFT_S:g}: about "
                        "nine 32K-prompt prefills of queueing on 8xH200, half of a 60 s proxy read timeout)")
    p.add_argument("--no-search", action="store_true",
                   help="recommend among the swept points only (default: bisect between the highest swept load "
                        f"that meets the targets and the next one, to within {SEARCH_REL_TOL * 100:.1f}%%, per system)")
    p.add_argument("--sweep-buffer", type=comma_list(buffer_size), default=None, help="also sweep device_buffer_size, e.g. 2048,4096,6144 (default: the config's)")
    p.add_argument("--sweep-host-ratio", type=comma_list(positive_float), default=None, help="also sweep host_to_device_ratio, e.g. 2,4,8 (default: the config's)")
    p.add_argument("--residency", type=comma_list(str), default=None, metavar="POLICY[,POLICY]",
                   help="what-if: device-resident or swap at this load: also run HiSparse with each residency policy "
                        "(swap, sglang-dynamic, vllm-spill; docs/residency-and-multi-node.md), e.g. swap,sglang-dynamic "
                        "(default: the config's residency key)")
    p.add_argument("--nodes", type=comma_list(positive_int), default=None, metavar="N[,N]",
                   help="what-if: one node or two: run the plan on each node count of the deployment's cluster "
                        "(--cluster, or the deployment's cluster key), e.g. 1,2; the recommendation names the node "
                        "count with the most output tokens/s per GPU under the targets")
    p.add_argument("--node-layout", choices=["auto", "replicas", "wide"], default=None,
                   help="--nodes: replicas (copies of the instance), wide (one DP-attention wide-EP instance over "
                        "every GPU) or auto (wide when the deployment already is one; default)")
    p.add_argument("--cluster", default=None, help="cluster preset or file for --nodes when the deployment names none "
                                                   "(presets: " + _presets("clusters") + ")")
    p.add_argument("--seed", type=seed_int, default=0, help="seed for request lengths and arrivals (default 0)")
    p.add_argument("--validate", metavar="SET", default=None,
                   help="check the model against a published set (a shipped name, all, or a TOML file) instead of "
                        "planning; --trace and --calibration, when given, replace the sets' own (the scenario, load, "
                        "SLO and sweep options do not apply and are refused)")
    p.add_argument("--json", action="store_true", help="print rows and recommendation (or the validation) as JSON")
    p.add_argument("--out", metavar="DIR", help="write plan.csv, plan.json, throughput.png and the recommendation's "
                                                "launch.sh (+ hisparse-config.json for HiSparse) into DIR "
                                                "(--validate: validation.csv/json/png)")
    p.add_argument("--price-gpu-hour", type=price, default=None, metavar="USD",
                   help=f"cost: $ per GPU-hour (0 to {MAX_PRICE:g}); adds $/M output tokens per point (table, JSON, "
                        "report)")
    p.add_argument("--price-host-gb-month", type=price, default=None, metavar="USD",
                   help=f"cost: $ per GB-month of host memory (0 to {MAX_PRICE:g}), charged for HiSparse's pinned host "
                        "pool (default 0)")
    p.add_argument("--prices", metavar="FILE.toml", default=None,
                   help="cost: a price table (gpu_hour, host_gb_month, source) instead of the two options")
    p.add_argument("--report", metavar="FILE.html", default=None,
                   help="also write one self-contained HTML page (plotly.js inlined, no network): throughput, TPOT "
                        "and TTFT against the load with the targets and the recommendation, the scenario, the "
                        "launch command and every point (--validate: measured against predicted per point, "
                        "the error per set and overall; docs/reports.md)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    from .plan_search import add_arguments as add_search_arguments

    add_search_arguments(p)
    p.set_defaults(run=run_plan_cmd)
    declare_io(p, inputs=["model", "gpu", "deployment", "workload", "hisparse", "calibration", "trace", "validate",
                          "prices"],
               outputs=[Output("out", kind="dir", files=out_files), Output("report", suffixes=(".html", ".htm"))],
               more_inputs=read_files)


PLAN_FILES = ("plan.csv", "plan.json", "throughput.png", "launch.sh", "hisparse-config.json")


def out_files(args: argparse.Namespace | None = None) -> tuple[str, ...]:
    """The files ``--out DIR`` may hold after any ``hisparse plan`` run: a plan, a search or a validation writes its
    own and removes the other modes' (a search into a plan's folder left plan.json beside search.json, both read as
    the folder's answer). The same for every mode, so no input of the run may carry one of these names."""
    from .plan_search import SEARCH_FILES

    return tuple(dict.fromkeys(PLAN_FILES + SEARCH_FILES + VALIDATE_FILES))


# preset options and the kind of preset each names
# the option of each preset key (serving.presets.PRESET_KEYS, which gives its kind)
PRESET_OPTIONS = (("model", "--model"), ("gpu", "--gpu"), ("deployment", "--deployment"), ("workload", "--workload"),
                  ("hisparse", "--hisparse-config"), ("calibration", "--calibration"))


def read_files(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(option, file) of each file behind a preset name or a published set (what the run reads
    beside the paths given): checked against the outputs like any input. A name that does not
    resolve is left to the run, which says what is wrong with it."""
    import contextlib

    from ..errors import HisparseError
    from ..serving.presets import NO_FILE, PRESET_KEYS, resolve_or_none

    found: list[tuple[str, str]] = []
    defaults = {dest: default for dest, _, default in PLAN_ONLY}
    for dest, option in PRESET_OPTIONS:
        spec = getattr(args, dest) if getattr(args, dest) is not None else defaults.get(dest)
        if isinstance(spec, str) and spec not in NO_FILE and (path := resolve_or_none(PRESET_KEYS[dest], spec)):
            found.append((option, str(path)))
    from ..serving.presets import deployment_files

    # the deployment's GPU, hisparse config, cluster (and its GPU), and the GPU's calibration
    for key, path in deployment_files(args.deployment or defaults["deployment"], args.gpu):
        if key != "calibration":
            found.append(("--deployment", str(path)))
        elif (args.calibration or "auto") == "auto":
            found.append(("--calibration", str(path)))
    if args.validate:
        from ..serving.published import load_published, published_names

        for name in published_names() if args.validate == "all" else [args.validate]:
            with contextlib.suppress(HisparseError, OSError, ValueError):
                ps = load_published(name)
                found.append(("--validate", ps.where))
                for key, value in ps.scenario.items():
                    kind = PRESET_KEYS.get(key)
                    if key == "trace":
                        found.append(("--validate", str(value)))
                    elif kind and value not in NO_FILE and (path := resolve_or_none(kind, value)):
                        found.append(("--validate", str(path)))
    return found


# Plan options whose argparse default is None, so that a value the user gave can be told apart from
# the default: (dest, option, the default a plan uses). --validate uses none of them.
PLAN_ONLY = (("model", "--model", "glm-5.1-fp8"), ("gpu", "--gpu", None),
             ("deployment", "--deployment", "8xh200-colocated-dp8"), ("workload", "--workload", "32k-in-8k-out"),
             ("hisparse", "--hisparse-config", None),
             ("concurrency", "--concurrency", [1, 2, 4, 8, 16, 32, 64, 128, 256]), ("rate", "--rate", []),
             ("slo_tpot_ms", "--slo-tpot-ms", DEFAULT_SLO_TPOT_MS), ("slo_ttft_s", "--slo-ttft-s", DEFAULT_SLO_TTFT_S),
             ("sweep_buffer", "--sweep-buffer", []), ("sweep_host_ratio", "--sweep-host-ratio", []),
             ("overrides", "--set", []), ("report", "--report", None), ("price_gpu_hour", "--price-gpu-hour", None),
             ("price_host_gb_month", "--price-host-gb-month", None), ("prices", "--prices", None),
             ("speculative", "--speculative", None), ("accept_len", "--accept-len", None),
             ("accept_method", "--accept-method", None), ("accept_probs", "--accept-probs", None),
             ("compare_speculative", "--compare-speculative", False), ("compare_prefetch", "--compare-prefetch", False),
             ("residency", "--residency", []), ("nodes", "--nodes", []), ("node_layout", "--node-layout", "auto"),
             ("cluster", "--cluster", None))


def run_plan_cmd(args: argparse.Namespace) -> int:
    from ..errors import HisparseError

    given = given_options(args, PLAN_ONLY)
    from .plan_search import check_args, refuse_unused_node_options

    check_args(args, given)
    if args.report:  # its page needs plotly: said before the work, not after it
        from ..report.page import require_plotly

        require_plotly()
    if args.validate:
        given = [opt for opt in given if opt != "--report"]  # the validation has its own page
        given += ["--no-search"] if args.no_search else []  # a store_true: not in PLAN_ONLY
        if given:
            raise HisparseError(f"--validate runs each published set's own scenario and load: "
                                f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply (it takes --trace, --calibration, --seed, "
                                "--json, --out, --report, --quiet)")
        return run_validate(args)
    if not args.search:  # the search's are checked in check_args
        refuse_unused_node_options(args, given)
    if "--concurrency" in given and "--rate" in given:
        raise HisparseError("--concurrency and --rate: give one (closed loop at each concurrency, or open loop "
                            "at each arrival rate), not both")
    fill_defaults(args, PLAN_ONLY)
    if args.slo_ttft_s is not None and args.slo_ttft_s < 0:  # --slo-ttft-s none
        args.slo_ttft_s = None
    prices = _prices(args)
    if args.trace and os.path.isfile(args.trace):  # a missing one: the scenario's own error
        from ..trace import open_trace
        from .common import require_accesses

        require_accesses(open_trace(args.trace), args.trace)
    from ..progress import counter, status
    from ..serving.planner import PlanInputs, prepare, recommend, run_plan_full, search_plan

    spec = _speculative(args)
    inp = PlanInputs(speculative=spec, model=args.model, gpu=args.gpu, deployment=args.deployment, workload=args.workload,
                     hisparse=args.hisparse, calibration=args.calibration, trace=args.trace,
                     concurrency=tuple(args.concurrency), rates=tuple(args.rate), slo_tpot_ms=args.slo_tpot_ms,
                     slo_ttft_s=args.slo_ttft_s, buffers=tuple(args.sweep_buffer),
                     host_ratios=tuple(args.sweep_host_ratio), seed=args.seed, overrides=tuple(args.overrides),
                     residencies=tuple(args.residency))
    if args.search:
        from .plan_search import run_search_cmd

        return run_search_cmd(args, inp.scenario())
    sc = inp.scenario()
    if "--concurrency" in given and not inp.rates and sc.workload.arrival.value == "open":  # --nodes too (it ran
        # the workload's rate, the --concurrency list dropped)
        raise HisparseError(f"--concurrency: workload {sc.workload.where} is open loop (rate_per_s "
                            f"{sc.workload.rate_per_s:g}); give --rate to sweep arrival rates, or a closed-loop "
                            "workload")
    if args.nodes:
        if args.compare_prefetch:
            raise HisparseError("--compare-prefetch and --nodes: give one what-if at a time")
        return _run_nodes(args, inp, prices)
    if args.compare_prefetch and args.compare_speculative:
        raise HisparseError("--compare-prefetch and --compare-speculative: give one what-if at a time")
    if args.compare_prefetch:
        import dataclasses

        from ..serving import prefetch_whatif

        prefetch_whatif.check(sc)
        inp_nopf = dataclasses.replace(inp, overrides=inp.overrides + (prefetch_whatif.OFF_OVERRIDE,))
        prep_nopf = prepare(inp_nopf, inp_nopf.scenario(), search=not args.no_search)
    prep = prepare(inp, sc, search=not args.no_search)  # every check before the first simulated point
    if args.compare_speculative:
        import dataclasses

        inp_off = dataclasses.replace(inp, speculative=None)
        prep_off = prepare(inp_off, inp_off.scenario(), search=not args.no_search)
    whatif = prep_off if args.compare_speculative else prep_nopf if args.compare_prefetch else None
    if whatif is not None:  # each plan was checked alone: together they may run up to twice the budget
        from .. import limits

        limits.check(prep.steps + whatif.steps, "HISPARSE_MAX_SIM_STEPS",
                     f"plan and its {'--compare-speculative' if args.compare_speculative else '--compare-prefetch'} "
                     "what-if together", unit="scheduler steps to simulate",
                     hint="fewer or lower loads, fewer swept buffers, or --no-search")
    tick = counter(prep.swept_points, desc="points", quiet=args.quiet, unit="pt")
    from ..serving import prefetch

    prefetch.prefetch(lambda: run_plan_full(inp, prepared=prep), on_point=tick)  # every core
    plan = run_plan_full(inp, on_point=tick, prepared=prep)
    if not args.no_search:
        with status("search: the highest load under the targets, bisecting between swept loads", quiet=args.quiet):
            prefetch.prefetch_search(lambda: search_plan(plan, inp))  # the systems' bisections side by side
            plan = search_plan(plan, inp, on_point=None)
    prefetch.forget()
    rows = plan.rows()
    if args.compare_speculative:  # the what-if: the same plan without speculative decoding
        plan_off = _plan_with_bars(inp_off, prep_off, "without speculative decoding", args)
        rows = rows + plan_off.rows()
    if args.compare_prefetch:  # the what-if: the same HiSparse plan with the prefetch off (the baseline once)
        plan_nopf = _plan_with_bars(inp_nopf, prep_nopf, "prefetch off", args)
        rows = prefetch_whatif.tag(rows, prefetch_whatif.ON) + [
            r for r in prefetch_whatif.tag(plan_nopf.rows(), prefetch_whatif.OFF) if r["system"] != "baseline"]
    from ..serving.prices import add_costs

    add_costs(rows, sc, prices)
    bands = _add_bands(rows, sc)
    # the recommendation is the plan as given: a prefetch-off row is the what-if's, not a launch to name
    rec = recommend([r for r in rows if r.get("prefetch") != "off"], args.slo_tpot_ms, args.slo_ttft_s,
                    baseline_radix_cache=sc.deployment.radix_cache)
    from ..serving.whatif import residency_summary

    rec["residency"] = residency_summary(rows, args.slo_tpot_ms, args.slo_ttft_s)
    report = {"inputs": vars(inp) | {"concurrency": list(inp.concurrency), "rates": list(inp.rates),
                                     "speculative": spec.describe() if spec is not None else None},
              "scenario": scenario_summary(sc), "rows": rows, "recommendation": rec,
              "search": _search_summary(plan, args.no_search), "launch": _launches(sc, rec),
              "prices": prices.as_dict() if prices else None, **plan_parts(sc, plan, bands)}
    if args.compare_speculative:
        from ..serving.spec_whatif import compare

        report["speculative_whatif"] = compare(rows, args.slo_tpot_ms, args.slo_ttft_s)
    if args.compare_prefetch:
        report["prefetch_whatif"] = prefetch_whatif.compare(rows, args.slo_tpot_ms, args.slo_ttft_s)
    if spec is not None:
        report["speculative"] = spec.describe()
    report = json_safe(report)  # a figure the model cannot give is null (with its reason), never NaN
    if _emit(args, rows, report, rec):
        return 0
    print_report(sc, plan, rows, rec, report["search"])
    if spec is not None:
        print(f"{spec.describe()}; TPOT = step time / tokens kept (bench_serving's definition)")
    if "speculative_whatif" in report:
        from ..serving.spec_whatif import summary_lines

        for line in summary_lines(report["speculative_whatif"]):
            print(line)
    if "prefetch_whatif" in report:
        for line in prefetch_whatif.summary_lines(report["prefetch_whatif"]):
            print(line)
    print_bands(bands)
    if prices:
        print(f"prices ({prices.source}): ${prices.gpu_hour:g}/GPU-hour x {sc.deployment.gpus} GPUs, "
              f"${prices.host_gb_month:g}/GB-month of pinned host pool (HiSparse's; 730 h/month); $/M out = $/h over "
              "steady output tokens")
    print_launch(report["launch"], rec, sc.workload.tokenize_prompt)
    return 0


def _speculative(args: argparse.Namespace):
    """--speculative and its acceptance -> a SpeculativeSpec (None without it); the acceptance
    options and --compare-speculative need it."""
    from ..errors import HisparseError
    from ..serving.speculative import parse_speculative

    if args.speculative is None:
        extra = [o for o, v in (("--accept-len", args.accept_len), ("--accept-method", args.accept_method),
                                ("--accept-probs", args.accept_probs)) if v is not None]
        if args.compare_speculative:
            extra.append("--compare-speculative")
        if extra:
            raise HisparseError(f"{', '.join(extra)} need --speculative ALGO:STEPS-TOPK-DRAFT (e.g. eagle:5-1-6)")
        return None
    if args.accept_probs and (args.accept_len is not None or args.accept_method):
        raise HisparseError("--accept-probs and --accept-len / --accept-method: give the distribution or the mean")
    return parse_speculative(args.speculative, args.accept_len, args.accept_method, tuple(args.accept_probs or ()))


def _add_bands(rows: list[dict], sc) -> dict:
    """Each row's validation error band (``serving.bands``: the nearest published set's median
    |error|): ``band`` for its throughputs and TPOT / ITL, ``band_set`` naming the set; returns the
    band per system with what it matches."""
    from ..serving.bands import band_for_scenario, load_bands

    table = load_bands()
    out = {}
    for system in ("baseline", "hisparse"):
        out[system] = band_for_scenario(sc, system, table)
        out[system + "_ttft"] = band_for_scenario(sc, system, table, group="ttft")
    for r in rows:
        b, t = out.get(r["system"]), out.get(r["system"] + "_ttft")
        r["band"] = b["band"] if b else None
        r["band_set"] = b["set"] if b else None
        r["ttft_band"] = t["band"] if t else None
        r["ttft_band_set"] = t["set"] if t else None
    return out


def _emit(args: argparse.Namespace, rows: list[dict], report: dict, rec: dict) -> bool:
    """A plan's outputs: --out's files, --report's page, and --json (True: printed, the text is not). The folder and
    the page are committed together (``fileio.output_set``): an interrupt leaves both as they were."""
    from ..fileio import output_set

    with output_set():
        if args.out:
            _write_outputs(args.out, rows, report, rec)
        if args.report:
            from ..report.html import write_report

            write_report(report, args.report)
    if args.json:
        print_json(report)
        return True
    return False


def _plan_with_bars(inp, prep, name: str, args: argparse.Namespace):
    """One prepared plan and, unless --no-search, its search, each shown on its own line (a what-if's
    plan, each --nodes count's); the main plan runs its points on every core instead (prefetch)."""
    from ..progress import counter, status
    from ..serving.planner import run_plan_full, search_plan

    plan = run_plan_full(inp, prepared=prep, on_point=counter(prep.swept_points, desc=name, quiet=args.quiet, unit="pt"))
    if args.no_search:
        return plan
    with status(f"{name}: search", quiet=args.quiet):
        return search_plan(plan, inp, on_point=None)


def _run_nodes(args: argparse.Namespace, inp, prices) -> int:
    """--nodes: the plan on each node count (``cluster.node_overrides``), every table, then the answer."""
    import dataclasses

    from ..errors import HisparseError
    from ..serving import presets as P
    from ..serving.cluster import node_overrides
    from ..serving.planner import prepare, recommend
    from ..serving.prices import add_costs
    from ..serving.whatif import nodes_summary, residency_summary

    sc0 = inp.scenario()
    d0 = sc0.deployment
    name = args.cluster or d0.cluster
    if not name:
        raise HisparseError(f"--nodes: deployment {d0.where} names no cluster; give --cluster (presets: "
                            f"{_presets('clusters')}) or a deployment with a cluster key")
    cluster = P.load("clusters", name)
    if max(args.nodes) > cluster.nodes:
        raise HisparseError(f"--nodes {max(args.nodes)}: cluster {cluster.name} has {cluster.nodes} nodes ({cluster.where})")
    per_nodes, gpus, reports = {}, {}, {}
    all_rows: list[dict] = []
    runs = []
    for n in args.nodes:  # every node count checked before the first point is simulated
        extra = node_overrides(d0, cluster, n, layout=args.node_layout)
        if args.cluster and not d0.cluster:
            extra = tuple(o for o in extra if not o.startswith("deployment.cluster=")) + (f"deployment.cluster={name}",)
        mine = {o.split("=")[0] for o in extra}
        inp_n = dataclasses.replace(inp, overrides=tuple(o for o in inp.overrides if o.split("=")[0] not in mine) + extra)
        sc = inp_n.scenario()
        runs.append((n, extra, inp_n, sc, prepare(inp_n, sc, search=not args.no_search)))
    for n, extra, inp_n, sc, prep in runs:
        plan = _plan_with_bars(inp_n, prep, f"{n} node(s)", args)
        rows = plan.rows()
        add_costs(rows, sc, prices)
        for r in rows:
            r["nodes"] = n
        bands = _add_bands(rows, sc)
        rec = recommend(rows, args.slo_tpot_ms, args.slo_ttft_s, baseline_radix_cache=sc.deployment.radix_cache)
        rec["residency"] = residency_summary(rows, args.slo_tpot_ms, args.slo_ttft_s)
        per_nodes[n], gpus[n] = rec["choice"], sc.deployment.gpus
        all_rows += rows
        reports[n] = {"scenario": scenario_summary(sc), "recommendation": rec, "overrides": list(extra),
                      "search": _search_summary(plan, args.no_search), "launch": _launches(sc, rec),
                      **plan_parts(sc, plan, bands)}
        if not args.json:
            print(f"######## {n} node(s) of {cluster.name}: " + (" ".join(f"--set {o}" for o in extra) or "the deployment as given"))
            print_report(sc, plan, rows, rec, reports[n]["search"])
            print_launch(reports[n]["launch"], rec, sc.workload.tokenize_prompt)
            print()
    summary = nodes_summary(per_nodes, gpus)
    # the top level is the chosen node count's plan, as a plain run's (the first count's, with only the choice
    # replaced, mixed two node counts: its ratio and edge flag were the 1-node run's beside a 2-node pick)
    chosen = reports[summary.get("choice") or args.nodes[0]]
    rec_all = dict(chosen["recommendation"])
    rec_all["nodes"] = summary
    report = json_safe({"inputs": vars(inp) | {"concurrency": list(inp.concurrency), "rates": list(inp.rates),
                                               "nodes": list(args.nodes), "cluster": cluster.name},
                        "per_nodes": {str(n): r for n, r in reports.items()}, "rows": all_rows,
                        "recommendation": rec_all,
                        **{k: chosen[k] for k in ("launch", "scenario", "search", "misses", "indexshare_prefetch",
                                                  "bands", "cannot_run")},
                        "prices": prices.as_dict() if prices else None})
    if _emit(args, all_rows, report, rec_all):
        return 0
    print_nodes(summary, cluster.name)
    return 0


def _search_summary(plan, off: bool) -> dict:
    from ..serving.slo import MAX_SEARCH_STEPS, SEARCH_REL_TOL

    return {"enabled": not off, "rel_tol": SEARCH_REL_TOL, "max_points_per_system": MAX_SEARCH_STEPS,
            "systems": plan.brackets}


def _prices(args: argparse.Namespace):
    from ..errors import HisparseError
    from ..serving.prices import Prices, load_prices

    if args.prices:
        if args.price_gpu_hour is not None or args.price_host_gb_month is not None:
            raise HisparseError("--prices and --price-gpu-hour / --price-host-gb-month: give the file or the options")
        return load_prices(args.prices)
    if args.price_host_gb_month is not None and args.price_gpu_hour is None:
        raise HisparseError("--price-host-gb-month needs --price-gpu-hour (the GPUs are most of the cost)")
    if args.price_gpu_hour is None:
        return None
    return Prices(args.price_gpu_hour, args.price_host_gb_month or 0.0,
                  f"--price-gpu-hour {args.price_gpu_hour:g} --price-host-gb-month {args.price_host_gb_month or 0:g}")


def _launches(sc, rec: dict) -> dict:
    """The SGLang launch command of each system's best point and of the choice."""
    from ..serving.launch import launch_for

    out = {}
    for key in ("baseline", "hisparse", "choice"):
        lc = launch_for(sc, rec[key])
        out[key] = lc.as_dict() if lc else None
    return out


def write_launch(folder, launch: dict, header: str) -> None:
    """launch.sh (executable) and, for HiSparse, hisparse-config.json of a launch (``Launch.as_dict``) into a staged
    --out folder: the plan's and the search's."""
    from ..fileio import atomic_output
    from ..serving.launch import launch_script

    with atomic_output(folder / "launch.sh") as fh:
        fh.write(launch_script(launch, header).encode())
    os.chmod(folder / "launch.sh", 0o755)  # a script to run
    if launch["hisparse_config"]:
        with atomic_output(folder / "hisparse-config.json") as fh:
            fh.write((json.dumps(launch["hisparse_config"], indent=2) + "\n").encode())


def plan_parts(sc, plan, bands: dict) -> dict:
    """The report's keys that come from one plan run (the plain run's and each --nodes count's)."""
    return {"misses": [k.__dict__ for k in plan.knobs], "indexshare_prefetch": prefetch_report(sc, plan),
            "bands": bands, "cannot_run": [{"system": who, "reason": why} for who, why in plan.cannot_run]}


def _write_outputs(out: str, rows: list[dict], report: dict, rec: dict) -> None:
    """plan.csv, plan.json and throughput.png, swapped into ``out`` as one set (an interrupted
    run leaves an earlier run's three files as they were)."""
    import pandas as pd

    from ..fileio import atomic_output, folder_output

    df = pd.DataFrame(rows)
    # a column of whole numbers with gaps (device_buffer_size: none for baseline rows) reads back as float:
    # plan.csv wrote 4096.0 where plan.json has 4096
    for col in df.columns:
        values = [r[col] for r in rows if r.get(col) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values) and df[col].dtype.kind == "f":
            df[col] = df[col].astype("Int64")
    with folder_output(out, out_files()) as staged:
        with atomic_output(staged / "plan.csv") as fh:
            fh.write(df.to_csv(index=False).encode())
        with atomic_output(staged / "plan.json") as fh:
            fh.write(json.dumps(report, indent=2, default=str, allow_nan=False).encode())
        launch = report["launch"]["choice"]
        if launch:
            write_launch(staged, launch, f"hisparse plan: the recommended configuration ({launch['system']})")
        from ..serving.plots import plot_throughput

        plot_throughput(df, str(staged / "throughput.png"), recommendation=rec)



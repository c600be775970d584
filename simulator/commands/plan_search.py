"""``hisparse plan --search``: the configuration search's output (table, frontier, the
configurations that cannot run, JSON, CSV, plot, HTML report); the search is ``serving.search``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import limits
from .common import json_safe, print_json

SEARCH_FILES = ("search.csv", "frontier.csv", "search.json", "frontier.png", "launch.sh", "hisparse-config.json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..serving.search import DEFAULT_BUFFERS, DEFAULT_POLICIES, DEFAULT_RATIOS
    from .common import buffer_size, comma_list, positive_float, positive_int

    g = p.add_argument_group("configuration search (--search)")
    g.add_argument("--search", action="store_true",
                   help="search the parallel layout (TP, DP attention, EP over the deployment's GPUs) and HiSparse's "
                        "knobs; print a ranked table (each configuration's highest tok/s/GPU at a load meeting the targets), the Pareto "
                        "frontier of tok/s/GPU against tok/s/user and every configuration that cannot run, with why")
    g.add_argument("--search-top", type=positive_int, default=10, metavar="N", help="rows of the ranked table (default 10)")
    g.add_argument("--search-buffer", type=comma_list(buffer_size), default=None,
                   help=f"device_buffer_size values searched (default {','.join(map(str, DEFAULT_BUFFERS))})")
    g.add_argument("--search-host-ratio", type=comma_list(positive_float), default=None,
                   help=f"host_to_device_ratio values searched (default {','.join(f'{r:g}' for r in DEFAULT_RATIOS)})")
    g.add_argument("--search-policy", default=None, metavar="P[,P...]",
                   help=f"eviction policies searched, names of the replay registry or all (default "
                        f"{','.join(DEFAULT_POLICIES)})")
    g.add_argument("--pd-split", type=positive_int, default=None, metavar="N",
                   help="with a pd-decode deployment: search every prefill/decode split of N nodes of its cluster "
                        "(--cluster, or the deployment's cluster key), ranked by output tok/s over both sides' GPUs")
    g.add_argument("--jobs", type=positive_int, default=None,
                   help="processes for the search's replays and coarse stages (default: 2, or 1 on one core)")


# what the ranked table's order is (``search.Config.best``: the plan's rule, ``planner.recommend``): a higher
# load that still meets the targets at a lower tok/s/GPU serves each user slower for less throughput
RANKED_BY = "ranked by each configuration's highest tok/s/GPU at a load meeting the targets"
SEARCH_ONLY = ("--search-top", "--search-buffer", "--search-host-ratio", "--search-policy", "--pd-split", "--jobs")
# plan options that do not apply to a search (it picks its own loads and knob sets)
NOT_WITH_SEARCH = ("--concurrency", "--rate", "--sweep-buffer", "--sweep-host-ratio", "--no-search",
                   "--residency", "--price-gpu-hour", "--price-host-gb-month", "--prices")  # prices: the search does not price yet


# the plan's what-ifs (a search compares configurations, not one plan with and without a feature)
WHATIFS = ("--compare-prefetch", "--compare-speculative")
# node options and the options (dests) one of which a search needs to read them
NODE_OPTIONS = (("--node-layout", ("nodes",)), ("--cluster", ("nodes", "pd_split")))


def check_args(args: argparse.Namespace, given: list[str]) -> None:
    """The search's options against the plan's, before any preset loads: an option that would be
    ignored is refused."""
    from ..errors import HisparseError

    mine = [o for o, v in (("--search-top", args.search_top != 10), ("--search-buffer", args.search_buffer),
                           ("--search-host-ratio", args.search_host_ratio), ("--search-policy", args.search_policy),
                           ("--pd-split", args.pd_split), ("--jobs", args.jobs)) if v]
    if not args.search:
        if mine:
            raise HisparseError(f"{', '.join(mine)}: only with --search")
        return
    bad = [o for o in given if o in NOT_WITH_SEARCH] + (["--no-search"] if args.no_search else [])
    if bad:
        raise HisparseError(f"--search picks its own loads and HiSparse knob sets: {', '.join(bad)} "
                            "does not apply (use --search-buffer / --search-host-ratio / --search-policy)")
    whatif = [o for o in given if o in WHATIFS]
    if whatif:
        raise HisparseError(f"--search runs no what-if: {', '.join(whatif)} does not apply (run it on a plain plan "
                            "of the configuration the search picks)")
    refuse_unused_node_options(args, given)
    if args.validate:
        raise HisparseError("--search and --validate: give one")
    low = [r for r in args.search_host_ratio or () if not r >= 1]
    if low:  # every point would be "cannot run", as --sweep-host-ratio's check says before any
        raise HisparseError(f"--search-host-ratio {low[0]:g} must be >= 1 (SGLang's host_to_device_ratio)")
    _policies(args.search_policy)  # before the scenario loads


def refuse_unused_node_options(args: argparse.Namespace, given: list[str]) -> None:
    """--node-layout without --nodes, --cluster without --nodes or --pd-split: a plan or a search would ignore it."""
    from ..errors import HisparseError

    unused = [o for o, needs in NODE_OPTIONS if o in given and not any(getattr(args, n) for n in needs)]
    if unused:
        raise HisparseError(f"{', '.join(unused)} would be ignored: --node-layout belongs to --nodes, "
                            "--cluster to --nodes or --search --pd-split")


def _policies(text: str | None) -> tuple[str, ...]:
    """--search-policy: all, or a list checked as every policy list is (known, none empty or twice)."""
    from ..replay.policies import POLICY_IDS
    from ..serving.search import DEFAULT_POLICIES
    from .common import check_policies

    if text is None:
        return DEFAULT_POLICIES
    if text.strip() == "all":
        return tuple(POLICY_IDS)
    return tuple(check_policies(text.split(","), list(POLICY_IDS), option=f"--search-policy {text}"))


def run_search_cmd(args: argparse.Namespace, sc) -> int:
    from ..serving import search as S

    inp = S.SearchInputs(buffers=tuple(args.search_buffer or S.DEFAULT_BUFFERS),
                         host_ratios=tuple(args.search_host_ratio or S.DEFAULT_RATIOS),
                         policies=_policies(args.search_policy), top=args.search_top,
                         slo_tpot_ms=args.slo_tpot_ms, slo_ttft_s=args.slo_ttft_s, seed=args.seed)
    jobs = args.jobs or (2 if (os.cpu_count() or 1) > 1 else 1)
    limits.check_jobs(jobs, f"--jobs {jobs}")
    generators = list(S.DEPLOYMENT_GENERATORS)
    nodes = getattr(args, "nodes", None) or []
    if nodes:  # node counts join the search (cluster.deployment_for_nodes)
        from ..errors import HisparseError
        from ..serving import presets as P

        name = args.cluster or sc.deployment.cluster
        if not name:
            raise HisparseError(f"--search --nodes: deployment {sc.deployment.where} names no cluster; give --cluster "
                                f"(presets: {', '.join(P.preset_names('clusters'))})")
        cluster = P.load("clusters", name)
        layouts = ("wide",) if args.node_layout in (None, "auto") else (args.node_layout,)
        generators.append(S.node_count_layouts(nodes, cluster, layouts))
        args.search_nodes_note = f", and {'/'.join(layouts)} on {','.join(map(str, nodes))} node(s) of {cluster.name}"
    if args.pd_split:  # prefill/decode splits join the search (cluster.deployment_for_nodes, prefill_nodes)
        from ..errors import HisparseError
        from ..serving import presets as P

        name = args.cluster or sc.deployment.cluster
        if not name:
            raise HisparseError(f"--pd-split: deployment {sc.deployment.where} names no cluster; give --cluster "
                                f"(presets: {', '.join(P.preset_names('clusters'))})")
        cluster = P.load("clusters", name)
        if sc.deployment.mode.value != "pd-decode":
            raise HisparseError(f"--pd-split: deployment {sc.deployment.where} is {sc.deployment.mode.value}; "
                                "prefill/decode splits need a pd-decode deployment")
        if not 2 <= args.pd_split <= cluster.nodes:
            raise HisparseError(f"--pd-split {args.pd_split}: needs 2 to {cluster.nodes} nodes of {cluster.name}")
        generators.append(S.pd_split_layouts(args.pd_split, cluster))
        args.search_nodes_note = (getattr(args, "search_nodes_note", "") + f", and every prefill/decode split of "
                                  f"{args.pd_split} nodes of {cluster.name} (tok/s/GPU over both sides)")
    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="search points", unit="pt", file=sys.stderr, leave=False)
    res = S.run_search(sc, inp, trace=sc.trace, tick=bar.update if bar else None, jobs=jobs, generators=generators)
    if bar:
        bar.close()
    report = search_report(res, sc, jobs)
    report["searched"]["nodes"] = getattr(args, "search_nodes_note", "")
    from ..fileio import output_set

    with output_set():  # --out's folder and --report's page together
        if args.out:
            _write(args.out, report)
        if args.report:
            from ..report.search_html import write_search_report

            write_search_report(report, args.report)
    if args.json:
        print_json(report)
        return 0
    _print(report)
    return 0


def search_report(res, sc, jobs: int) -> dict:
    from ..serving.bands import band_for, load_bands
    from ..serving.launch import launch_for
    from .plan_summary import scenario_summary

    ranked = res.ranked()
    frontier = res.frontier()
    table = load_bands()
    by_label = {c.label: c for c in res.configs}
    for row in ranked + frontier:  # each configuration's nearest published set (its layout may differ)
        cfg = by_label[row["config"]]
        d = cfg.deployment
        b = band_for(sc.model.name, sc.gpu.name, d.mode.value, d.attention.value, cfg.system, table)
        row["band"] = b["band"] if b else None
        row["band_set"] = b["set"] if b else None
        row["band_how"] = b["how"] if b else None
        t = band_for(sc.model.name, sc.gpu.name, d.mode.value, d.attention.value, cfg.system, table, group="ttft")
        row["ttft_band"] = t["band"] if t else None
        row["ttft_band_set"] = t["set"] if t else None
    best = ranked[0] if ranked else None
    launch = None
    if best:
        cfg = next(c for c in res.configs if c.label == best["config"])
        from ..serving.search import _scenario

        sc_best = _scenario(sc, cfg.deployment, cfg.hisparse)
        lc = launch_for(sc_best, best)
        launch = lc.as_dict() if lc else None
    inp = res.inputs
    return json_safe({
        "kind": "search",
        "scenario": scenario_summary(sc),
        "targets": {"slo_tpot_ms": inp.slo_tpot_ms, "slo_ttft_s": inp.slo_ttft_s},
        "searched": {"buffers": list(inp.buffers), "host_ratios": list(inp.host_ratios),
                     "policies": list(inp.policies), "ladder_start": inp.ladder[0],
                     "knob_deployments": inp.knob_deployments, "trace": sc.trace_how or sc.trace},
        "ranked": ranked[: inp.top], "ranked_all": len(ranked),
        "frontier": frontier, "infeasible": [i.__dict__ for i in res.infeasible],
        "pruned": [{"config": c, "reason": r} for c, r in res.pruned], "failing": res.failing(),
        "points": res.points(), "best": best, "launch": launch,
        "timing": {"seconds": res.seconds, "simulated_points": res.simulated, "jobs": jobs},
    })


def _print(report: dict) -> None:
    import pandas as pd

    sc = report["scenario"]
    t = report["targets"]
    target = f"TPOT p99 <= {t['slo_tpot_ms']:g} ms" + (f", TTFT p99 <= {t['slo_ttft_s']:g} s" if t["slo_ttft_s"]
                                                        else "")
    s = report["searched"]
    print(f"configuration search: {sc['files']['model']} on {sc['files']['deployment']}'s GPUs, workload "
          f"{sc['files']['workload']}; targets {target}")
    print(f"searched: every TP / DP-attention / EP layout of the GPUs{s.get('nodes') or ''}; HiSparse buffers {s['buffers']}, host ratios "
          f"{s['host_ratios']}, policies {s['policies']} on the {s['knob_deployments']} best layouts")
    print(f"trace choice: {s['trace']}")
    ranked = report["ranked"]
    if ranked:
        df = pd.DataFrame(ranked)
        cols = {"rank": "#", "deployment": "deployment", "system": "system", "device_buffer_size": "buffer",
                "host_to_device_ratio": "ratio", "policy": "policy", "concurrency": "conc",
                "tok_s_per_gpu": "tok/s/GPU", "tok_s_per_user": "tok/s/user", "tpot_p99_ms": "TPOT p99 ms",
                "ttft_p99_s": "TTFT p99 s", "capacity": "holds", "band": "band"}
        table = df[list(cols)].rename(columns=cols)
        table["band"] = table["band"].map(lambda b: "" if b is None or b != b else f"+-{b:.0%}")
        for c in ("buffer", "ratio", "policy"):
            table[c] = table[c].map(lambda v: "" if v is None or v != v else (f"{v:g}" if isinstance(v, float) else v))
        print(f"\n== {RANKED_BY} (top {len(ranked)} of "
              f"{report['ranked_all']})")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    else:
        print("\nno configuration meets the targets at any load searched")
    fr = report["frontier"]
    if fr:
        print("\n== Pareto frontier: tok/s/GPU against tok/s/user (every simulated point within the TTFT target; "
              f"TPOT target = {1e3 / t['slo_tpot_ms']:.1f} tok/s/user)")
        df = pd.DataFrame(fr)[["config", "concurrency", "tok_s_per_user", "tok_s_per_gpu", "tpot_p99_ms", "ttft_p99_s"]]
        print(df.rename(columns={"concurrency": "conc", "tok_s_per_user": "tok/s/user", "tok_s_per_gpu": "tok/s/GPU",
                                 "tpot_p99_ms": "TPOT p99 ms", "ttft_p99_s": "TTFT p99 s"}).to_string(
            index=False, float_format=lambda v: f"{v:.1f}"))
    if report["failing"]:
        print("\n== ran, met the targets at no load")
        for f in report["failing"]:
            print(f"  {f['config']}: {f['reason']}")
    if report["infeasible"]:
        print("\n== cannot run (not simulated)")
        for i in report["infeasible"]:
            print(f"  {i['label']} [{i['stage']}]: {_short(i['reason'])}")
    if report["pruned"]:
        print(f"\n{len(report['pruned'])} HiSparse knob sets dominated (hold no more requests and miss no less than "
              "another on the same layout) and not simulated; --json lists them")
    tm = report["timing"]
    print(f"\nsearch: {tm['simulated_points']} simulated points in {tm['seconds']:.1f} s ({tm['jobs']} process(es))")
    bands = {(r["band_set"], r["band_how"]) for r in report["ranked"] if r.get("band_set")}
    for _, how in sorted(bands, key=str):
        print(f"band from {how} (throughput, TPOT)")
    ttft = {(r["ttft_band_set"], r["ttft_band"]) for r in report["ranked"] if r.get("ttft_band_set")}
    for name, b in sorted(ttft, key=str):
        print(f"TTFT band from {name}: +-{b:.0%}")
    best = report["best"]
    if best:
        band = f" +-{best['band']:.0%}" if best.get("band") is not None else ""
        print(f"best: {best['config']} at concurrency {best['concurrency']}: {best['tok_s_per_gpu']:.1f}{band} tok/s/GPU, "
              f"{best['tok_s_per_user']:.1f} tok/s/user, TPOT p99 {best['tpot_p99_ms']:.1f} ms, TTFT p99 "
              f"{best['ttft_p99_s']:.1f} s")
    lc = report["launch"]
    if lc:
        print(f"launch: {lc['command']}")
        if lc["hisparse_config"]:
            print(f"  --hisparse-config: {json.dumps(lc['hisparse_config'])}")
        for note in lc["notes"]:
            print(f"  note: {note}")


def _short(reason: str) -> str:
    """The error's message without the file path prefix it names (the label names the layout)."""
    head, sep, rest = reason.partition(": ")
    return rest if sep and ("/" in head or head.startswith("<")) else reason


def _write(out: str, report: dict) -> None:
    import pandas as pd

    from ..fileio import atomic_output, folder_output
    from .plan import out_files, write_launch

    with folder_output(out, out_files()) as staged:  # the other modes' files go (plan.out_files)
        with atomic_output(staged / "search.csv") as fh:
            fh.write(pd.DataFrame(report["points"]).to_csv(index=False).encode())
        with atomic_output(staged / "frontier.csv") as fh:
            fh.write(pd.DataFrame(report["frontier"]).to_csv(index=False).encode())
        with atomic_output(staged / "search.json") as fh:
            fh.write(json.dumps(report, indent=2, default=str, allow_nan=False).encode())
        if report["launch"]:
            write_launch(staged, report["launch"], "hisparse plan --search: the best configuration")
        from ..serving.plots import plot_frontier

        plot_frontier(report, str(staged / "frontier.png"))

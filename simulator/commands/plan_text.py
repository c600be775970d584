"""``hisparse plan``'s text report: the scenario lines, one table per system and knob set, the
recommendation, the launch command, and the what-if and band lines."""

from __future__ import annotations

import json
from typing import Any

from ..serving.slo import DEFAULT_SLO_TPOT_MS, DEFAULT_SLO_TTFT_S
from .plan_summary import prefetch_report, scenario_summary

SHORT = {"concurrency": "conc", "rate_per_s": "rate/s", "steady_tok_s_deployment": "steady tok/s",
         "makespan_tok_s_deployment": "makespan tok/s", "steady_tok_s_per_gpu": "tok/s/GPU",
         "tpot_p50_ms": "TPOT p50 ms", "tpot_p99_ms": "TPOT p99 ms", "itl_p99_ms": "ITL p99 ms",
         "ttft_p50_s": "TTFT p50 s", "ttft_p99_s": "TTFT p99 s", "running_deployment": "running",
         "max_running_deployment": "max run", "kv_used_gb_per_gpu": "KV GB/GPU", "host_used_gb_per_gpu": "host GB/GPU",
         "miss_share": "miss", "comm_share": "comm", "overloaded": "over", "usd_per_m_output_tokens": "$/M out",
         "band": "band"}


TABLE_NAMES = SHORT | {"resident_share": "resident", "demotions": "demoted"}



def _rate(x: float) -> str:
    """A throughput: whole tokens/s from 100 up, three significant digits below (a prefill-bound plan's 0.25
    tok/s printed as "0")."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def print_bands(bands: dict) -> None:
    for system in ("baseline", "hisparse"):
        b, t = bands.get(system), bands.get(system + "_ttft")
        if b:
            print(f"band {system}: +-{b['band']:.0%} (largest {b['max']:.0%}, {b['points']} points) on throughput, "
                  f"TPOT and ITL: {b['how']}")
        else:
            print(f"band {system}: none (no published set)")
        if t:
            print(f"band {system} TTFT: +-{t['band']:.0%} (largest {t['max']:.0%}, {t['points']} points): {t['how']}")
        else:
            print(f"band {system} TTFT: none (no published set measured TTFT)")


def print_nodes(summary: dict, cluster: str) -> None:
    print(f"one node or more ({cluster}): the best point of each node count under the targets")
    for n in summary["nodes"]:
        b = summary["best"][n]
        if b is None:
            print(f"  {n} node(s), {summary['gpus'][n]} GPUs: no point meets the targets while serving its load")
            continue
        print(f"  {n} node(s), {summary['gpus'][n]} GPUs: {_where(b)}: {_rate(b['steady_tok_s_deployment'])} tok/s steady, "
              f"{b['steady_tok_s_per_gpu']:.1f} per GPU, TPOT p99 {b['tpot_p99_ms']:.1f} ms, TTFT p99 {b['ttft_p99_s']:.1f} s")
    c = summary.get("choice")
    if c is None:
        print("recommendation (nodes): none of the node counts meets the targets")
        return
    tie = (f" (a tie within the model's error band {summary['tie_band']:.0%}: the fewest nodes named)"
           if summary.get("tie") else "")
    print(f"recommendation (nodes): {c} node(s): the most output tokens/s per GPU under the targets{tie}; "
          f"the most in all: {summary['most_served']} node(s)")


def print_launch(launch: dict, rec: dict, tokenize_prompt: bool = False) -> None:
    """The choice's SGLang launch, and the bench_serving load it was predicted at; with the workload's
    tokenize_prompt the prompts go as token ids (--tokenize-prompt: no TokenizerManager time in TTFT)."""
    lc, choice = launch["choice"], rec["choice"]
    if lc is None:
        return
    ids = " --tokenize-prompt" if tokenize_prompt else ""
    load = (f"at most {choice['concurrency']} concurrent requests from the clients (bench_serving "
            f"--max-concurrency {choice['concurrency']}{ids})" if choice["concurrency"] else
            f"{choice['rate_per_s']:.4g} requests/s offered (bench_serving --request-rate {choice['rate_per_s']:.4g}{ids})")
    print(f"launch ({lc['system']}, {lc['instances']} instance(s); serve {load}):")
    print(f"  {lc['command']}")
    if lc["hisparse_config"]:
        print(f"  --hisparse-config: {json.dumps(lc['hisparse_config'])}")
    for note in lc["notes"]:
        print(f"  note: {note}")


def _print_prefetch(rep: dict | None) -> None:
    if not rep:
        return
    state = "on" if rep["enabled"] else "OFF (hisparse.prefetch = false, or PP): the whole swap-in is on the critical path"
    pts = "; ".join(f"{p['hidden_ms']:.2f} of {p['swap_in_ms']:.2f} ms per step ({p['hidden_share']:.0%}) at "
                    f"{p['requests_per_scheduler']} request(s) per scheduler" for p in rep["points"])
    print(f"IndexShare prefetch {state}: {rep['anchors']} anchor + {rep['shared']} shared layers; at "
          f"{rep['context_tokens']:.0f}-token contexts and the trace's {rep['miss_ratio']:.1%} misses it "
          f"{'hides' if rep['enabled'] else 'would hide'} {pts} (beside {rep['published']})")


def _table_float(v: float) -> str:
    # from 1e9 up in powers of ten: --price-gpu-hour 1e300 printed a 300-digit $/M column
    return f"{v:.3g}" if abs(v) >= 1e9 or abs(v) < 10 else f"{v:.1f}"


def _table_columns(rows: list[dict]) -> list[str]:
    x = "rate_per_s" if all(r["concurrency"] == 0 for r in rows) else "concurrency"
    usd = "usd_per_m_output_tokens"
    cols = [x] + [c for c in SHORT if c not in ("concurrency", "rate_per_s", "comm_share")
                  and not (c == usd and all(r[usd] is None or r[usd] != r[usd] for r in rows))
                  and any(c in r for r in rows)]
    if any((r.get("residency") or "swap") != "swap" for r in rows):  # dynamic residency: its columns
        cols += [c for c in ("resident_share", "demotions") if any(c in r for r in rows)]
    return cols


def _table_title(system: str, buf: Any, ratio: Any, spec: Any, res: Any, pf: Any = "") -> str:
    title = system if system == "baseline" else f"hisparse (device_buffer_size {int(buf)}, host ratio {ratio:g}" + (
        f", residency {res})" if res and res != "swap" else ")")
    title += "" if spec == "off" else f", speculative {spec}"
    return title + (f", IndexShare prefetch {pf}" if pf else "")  # --compare-prefetch


def _band_text(b: Any) -> str:
    return "" if b is None or b != b else f"+-{b:.0%}"


def _cell(col: str, value: Any) -> Any:
    """A point table's cell: flags as words, the validation band as +-N%."""
    if col == "overloaded":
        return {True: "yes", False: ""}.get(value)
    if col == "band":
        return _band_text(value)
    return value


def _point_tables(rows: list[dict]) -> list[tuple[str, str]]:
    """(title, table text) per system and knob set, in first-seen order: the points' rows as
    pandas' ``to_string(index=False)`` lays them out (``text_table``; pandas itself only for
    values of a type that module does not cover)."""
    from .text_table import supported, to_string

    cols = _table_columns(rows)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = tuple(None if v is None or v != v else v
                    for v in (r["system"], r["device_buffer_size"], r["host_to_device_ratio"],
                              r.get("speculative", "off"), r.get("residency", ""), r.get("prefetch", "")))
        groups.setdefault(key, []).append(r)
    if not all(supported([r[c] for r in rows]) for c in [*cols, "searched"]):
        return _point_tables_pandas(rows, cols)
    out = []
    for (system, buf, ratio, spec, res, pf), grp in groups.items():
        title = _table_title(system, buf, ratio, spec, res, pf)
        columns = [(TABLE_NAMES[c], [_cell(c, r.get(c)) for r in grp]) for c in cols]
        columns.append(("found", [{True: "search", False: ""}.get(r["searched"]) for r in grp]))
        out.append((title, to_string(columns, _table_float)))
    return out


def _point_tables_pandas(rows: list[dict], cols: list[str]) -> list[tuple[str, str]]:
    """``_point_tables`` through pandas (the layout ``text_table`` reproduces)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if "speculative" not in df:
        df["speculative"] = "off"
    if "residency" not in df:
        df["residency"] = ""
    if "prefetch" not in df:
        df["prefetch"] = ""
    out = []
    for (system, buf, ratio, spec, res, pf), grp in df.groupby(["system", "device_buffer_size", "host_to_device_ratio",
                                                                "speculative", "residency", "prefetch"],
                                                               dropna=False, sort=False):
        title = _table_title(system, buf, ratio, spec, res, pf)
        table = grp[cols].rename(columns=TABLE_NAMES)
        table["over"] = table["over"].map({True: "yes", False: ""})
        if "band" in table:
            table["band"] = table["band"].map(_band_text)
        table["found"] = grp["searched"].map({True: "search", False: ""}).values
        out.append((title, table.to_string(index=False, float_format=_table_float)))
    return out


def print_report(sc, plan, rows: list[dict], rec: dict, search: dict | None = None) -> None:
    d, w = sc.deployment, sc.workload
    summary = scenario_summary(sc)
    mem = summary["memory_per_rank"]
    b, h = mem["baseline"], mem["hisparse"]
    print(f"scenario: {sc.model.name} on {d.gpus} x {sc.gpu.name} ({d.name}: {d.instances} instance(s) of tp {d.tp}, "
          f"{d.attention.value.upper()} attention, {d.ranks} scheduler(s), {d.mode.value}); workload {w.name} "
          f"({w.input_tokens} in + {w.output_tokens} out, {w.arrival.value} loop)")
    print(f"memory per GPU (SGLang's accounting): weights {b['weights_bytes'] / 1e9:.1f} GB; KV budget "
          f"{b['budget_bytes'] / 1e9:.1f} GB = mem_fraction_static {d.mem_fraction_static:g} x "
          f"{sc.gpu.free_before_load / 1e9:.1f} GB free before the weights load - weights")
    ctx = w.input_tokens + w.output_tokens
    print(f"  baseline: {b['pool_tokens']} token slots ({b['cell_bytes']} B each) -> {b['pool_tokens'] // ctx} "
          f"requests of {ctx} tokens per scheduler; running cap {b['max_running']} per scheduler")
    if sc.model.arch == "dsv4":  # per-kind pools (serving/dsv4_memory.py): full tokens and C4 device rows
        print(f"  hisparse: {h['host_tokens']} full (logical) tokens -> {h['host_tokens'] // ctx} requests; C4 device "
              f"pool {h['pool_tokens'] // 4} compressed rows ({sc.hisparse.c4_pool}) -> "
              f"{h['pool_tokens'] // h['buffer_slots']} hot buffers of {h['buffer_slots'] // 4} rows; host pool "
              f"{h['host_pool_bytes'] / 1e9:.0f} GB pinned per GPU (the C4 rows of every logical token; DeepSeek-V4: "
              f"slots are full tokens, {b['cell_bytes']} B each over {dict(sc.model.kind_counts)} layers)")
    else:
        print(f"  hisparse: {h['pool_tokens']} device slots ({h['cell_bytes']} B each, indexer keys for the x"
              f"{sc.hisparse.host_to_device_ratio:g} logical pool) -> {h['pool_tokens'] // h['buffer_slots']} hot buffers "
              f"of {h['buffer_slots']}; host pool {h['host_tokens']} slots ({h['host_pool_bytes'] / 1e9:.0f} GB pinned per GPU) "
              f"-> {h['host_tokens'] // ctx} requests")
    if d.pool_profile.value == "before-31992":
        print(f"  pool_profile before-31992: the profile budgeted {b['budget_cell_bytes']} / {h['budget_cell_bytes']} B "
              f"per slot; {h['pool_tokens'] * (h['cell_bytes'] - h['budget_cell_bytes']) / 1e9:.1f} GB of the hisparse "
              "pool come out of the 1 - mem_fraction_static slack (SGLang before PR #31992)")
    if d.mode.value == "colocated" and rows:
        from ..serving.admission import RatioSchedule

        ratios = RatioSchedule(d.schedule_conservativeness, d.attention.value == "dp")
        adm = {r["system"]: r["max_running_deployment"] // max(d.ranks, 1) for r in rows}
        est = f"new_token_ratio {ratios.init:.3g} -> {ratios.min:.3g} over {600} steps"
        how = ("the ignore_eos look-ahead (bench_serving's default)" if w.ignore_eos and not d.radix_cache else
               f"baseline: {est} (the radix cache is on: add_one_req takes the look-ahead only with the tree "
               "cache off); HiSparse: the ignore_eos look-ahead" if w.ignore_eos else est)
        print(f"admission (SGLang's PrefillAdder, {how}; schedule_conservativeness {d.schedule_conservativeness:g}"
              f"{' x 0.3 under DP attention' if d.attention.value == 'dp' else ''}): about "
              + ", ".join(f"{s} {n}" for s, n in adm.items()) + " running per scheduler (baseline: a wave from "
              "empty, retried when a request leaves; HiSparse: retried every step against min(logical, device) "
              "free, as its allocator reports, the steady state of staggered outputs)")
    if d.mode.value == "pd-decode":
        from ..serving.model import prefill_tok_s

        how = "given" if d.prefill_tok_s > 0 else "derived: a prefill instance of the same GPUs and layout"
        from ..serving.model import prefill_seconds_per_token

        solo = prefill_seconds_per_token(sc)[0] * w.input_tokens
        print(f"prefill side: {prefill_tok_s(sc):.0f} input tokens/s for the deployment with every rank busy, one "
              f"{w.input_tokens}-token prompt alone in {solo:.1f} s ({how}); TTFT = its queue + prefill + the decode "
              "side's admission wait (the first token reaches the client when the decode server admits the request, "
              "as bench_serving times it); TPOT counts from there")
    if sc.trace_how:
        print(f"trace choice: {sc.trace_how}")
    for k in plan.knobs:
        print(f"trace: {k.trace}: {k.policy} miss ratio at device_buffer_size {k.device_buffer_size} "
              f"({k.device_buffer_size / sc.hisparse.top_k:g} x top_k): {k.miss_ratio:.1%} over all {k.trace_steps} "
              f"steps incl. the cold start; {k.steady_miss_ratio:.1%} from step {k.steady_from} (trace compare's "
              "steady state); the miss column is each point's mean over its simulated steps")
        for note in k.notes:
            print(f"  mapped: {note}")
    print()
    for title, table in _point_tables(rows):
        print(f"== {title}")
        print(table)
        print()
    for who, why in getattr(plan, "cannot_run", ()):
        print(f"== {who}: cannot run, left out of the plan: {why}")
        print()
    print(f"columns: tok/s = output tokens/s of the whole deployment ({d.gpus} GPUs) unless per GPU; steady = while the "
          "running set is steady, makespan = all output / run time; running = mean requests running, whole deployment; "
          "max run = the admission's steady-state estimate (nominal lengths, outputs evenly staggered: the 'over' "
          "rule), not a hard cap: when finishes bunch SGLang's PrefillAdder admits past it within the KV pools (JSON "
          "peak_running_deployment); "
          "GB/GPU = peak per GPU; over = offered load exceeds what it serves; found = a load the bisection added between swept ones")
    if sc.params.calibrated:
        print(f"cost model: calibration {sc.calibration}")
    else:
        print(f"cost model: UNCALIBRATED for this GPU ({sc.calibration}): no kernel of it was timed; "
              "see simulator/presets/calibration/")
    print(f"cost model: step kernels {summary['step_terms']['source']}")
    if summary["step_terms"]["fp4"]:
        print(f"cost model: routed experts {summary['step_terms']['fp4']}")
    if summary["step_terms"]["bf16"]:
        print(f"cost model: BF16 attention weights: {summary['step_terms']['bf16']}")
    rep = dict(summary["decode_step_ms"])
    n, ctx, total = rep.pop("requests_per_scheduler"), rep.pop("context_tokens"), rep.pop("total")
    terms = ", ".join(f"{k} {v:.1f}" for k, v in sorted(rep.items(), key=lambda kv: -kv[1]))
    print(f"decode step, baseline at its full batch ({n} requests per scheduler, {ctx:.0f}-token contexts): "
          f"{total:.1f} ms = {terms}")
    _print_prefetch(prefetch_report(sc, plan))
    print(f"how each term of a pass is priced on {sc.gpu.name}:")
    for row in summary["term_sources"]:
        print(f"  {row['term']:<18} {row['priced']:<9} {row['source']}")
    if sc.params.unsourced:
        print(f"cost model: UNSOURCED terms (no measurement yet): {', '.join(sc.params.unsourced)}")
    for note in sc.notes:
        print(f"note: {note}")
    print_recommendation(rec, search)


def _target(rec: dict) -> str:
    return f"TPOT p99 <= {rec['slo_tpot_ms']:g} ms" + (
        f", TTFT p99 <= {rec['slo_ttft_s']:g} s" if rec["slo_ttft_s"] else ", no TTFT target")


def _where(row: dict) -> str:
    res = row.get("residency") or "swap"
    knobs = "" if row["system"] == "baseline" else (
        f" with device_buffer_size {row['device_buffer_size']}, host_to_device_ratio {row['host_to_device_ratio']:g}"
        + (f", residency {res}" if res != "swap" else ""))
    load = f"concurrency {row['concurrency']}" if row["concurrency"] else f"{row['rate_per_s']:.4g} requests/s"
    how = " (found by the search)" if row.get("searched") else ""
    return f"{row['system']}{knobs} at {load}{how}"


def _cost(row: dict) -> str:
    c = row.get("usd_per_m_output_tokens")
    return "" if c is None else f", ${c:.3f} per M output tokens (${row['usd_per_hour']:.2f}/h)"


def print_recommendation(rec: dict, search: dict | None = None) -> None:
    target = _target(rec)
    how = ("swept points only (--no-search)" if search and not search["enabled"] else
           f"bisection between swept loads to within {rec['search_rel_tol']:.1%}, at most "
           f"{search['max_points_per_system'] if search else 4} points per system")
    print(f"targets: {target} (defaults TPOT {DEFAULT_SLO_TPOT_MS:g} ms, TTFT {DEFAULT_SLO_TTFT_S:g} s; "
          f"--slo-tpot-ms, --slo-ttft-s); search: {how}")
    for system in ("baseline", "hisparse"):
        r = rec[system]
        if r is None:
            print(f"  best {system}: no point meets the targets while serving its load")
            continue
        edge = ("  [EDGE: the highest load searched; a higher one may also meet the targets: extend "
                "--concurrency / --rate]" if rec["edge"].get(system) else "")
        b = (search or {}).get("systems", {}).get(system)
        unit = "" if r["concurrency"] else " requests/s"
        stop = (f" (search stopped after {b['points']} points: {b['passes']:.4g} passes, {b['fails']:.4g}{unit} fails)"
                if b and not b["converged"] else "")
        print(f"  best {system}: {_where(r)}: {_rate(r['steady_tok_s_deployment'])} tok/s steady, TPOT p99 "
              f"{r['tpot_p99_ms']:.1f} ms, TTFT p99 {r['ttft_p99_s']:.1f} s{_cost(r)}{stop}{edge}")
    choice = rec["choice"]
    if choice is None:
        print(f"recommendation: no configuration meets {target} while serving its load")
        return
    band = f" +-{choice['band']:.0%}" if choice.get("band") is not None else ""
    print(f"recommendation ({target}): {_where(choice)}: "
          f"{_rate(choice['steady_tok_s_deployment'])}{band} tok/s steady ({_rate(choice['steady_tok_s_per_gpu'])} per GPU), "
          f"TPOT p99 {choice['tpot_p99_ms']:.1f} ms, TTFT p99 {choice['ttft_p99_s']:.1f} s{_cost(choice)}"
          + (" [at the EDGE of the searched range]" if rec["choice_at_edge"] else ""))
    if rec["hisparse_over_baseline"]:
        print(f"best HiSparse / best baseline steady throughput under the targets: {rec['hisparse_over_baseline']:.2f}x")
    _print_residency(rec.get("residency"))
    if rec["tie"]:
        print(f"TIE: the two systems are within the model's error band ({rec['tie_band']:.0%}: "
              f"{rec['tie_band_source']}); the baseline is named ({rec['tie_reason']})")


def _print_residency(summary: dict | None) -> None:
    """--residency: the best point of each residency policy, and which one at this load."""
    if not summary:
        return
    parts = []
    for p in summary["policies"]:
        b = summary["best"][p]
        parts.append(f"{p} " + ("none meets the targets" if b is None else
                                f"{b['steady_tok_s_deployment']:.0f} tok/s at {_load_text(b)} (resident "
                                f"{b.get('resident_share', 0.0):.0%} of request-steps, {b.get('demotions', 0)} demoted)"))
    print("device-resident or swap (best HiSparse point per residency policy under the targets, swept loads): "
          + "; ".join(parts))
    for at in summary["by_load"]:
        cells = ", ".join(f"{p} {at[p]['steady_tok_s']:.0f} tok/s / TPOT p99 {at[p]['tpot_p99_ms']:.1f} ms / resident "
                          f"{at[p]['resident_share']:.0%}" for p in summary["policies"] if p in at)
        print(f"  at {_load_text(at)}: {cells}")
    if summary["choice"]:
        tie = (f" (the dynamic policy is within the model's error band {summary['tie_band']:.0%}: swap named)"
               if summary["tie"] else "")
        print(f"recommendation (residency): {summary['choice']}{tie}")


def _load_text(row: dict) -> str:
    return f"concurrency {row['concurrency']}" if row["concurrency"] else f"{row['rate_per_s']:.4g} requests/s"

"""``hisparse plan --search``: a configuration search over the parallel layout (TP, DP attention,
EP) and HiSparse's knobs (device_buffer_size, host_to_device_ratio, eviction policy), ranked by
each configuration's highest output tokens/s per GPU at a load that meets the TPOT and TTFT
targets (``Config.best``, the plan's rule: not the highest such load), with the Pareto
frontier of tokens/s per GPU against tokens/s per user (as NVIDIA AIConfigurator draws it) and the
configurations that cannot run listed with their reason.

Coarse to fine, so that a search of the default scenario stays within a minute on two cores:
1. every deployment the generators give (``DEPLOYMENT_GENERATORS``) is checked for memory (a
   layout whose weights do not fit is listed, not simulated); the rest run the baseline and
   HiSparse at the scenario's knobs on a coarse concurrency ladder (``COARSE_LADDER``, stopping at
   the first load that misses a target: a failing load is taken as failing every load above it);
2. on the ``knob_deployments`` deployments that serve most (either system), each knob set
   (buffer x ratio x policy) is sized (memory plan: requests it holds at once) and replayed (miss
   share, cached on disk by ``misses.miss_profiles``); a set that holds no more requests than
   another and misses no less is dominated and not simulated (the step time rises with misses
   and the throughput ceiling with the requests held); the others run the ladder;
3. the ``refine`` best configurations (default: every one that met the targets) are bisected between their last passing and first failing
   loads (``planner.search_plan``'s rule and tolerance).

Other helpers extend the search by appending to ``DEPLOYMENT_GENERATORS`` (a generator takes the
scenario and yields ``DeploymentSpec``s or ``Infeasible``s): node counts and PD splits join that way.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import HisparseError
from .admission import ceil_page
from .memory import plan_memory
from .misses import MissProfiles, miss_profiles
from .model import System, simulate
from .planner import _mid, _ok, _wide
from .scenario import Scenario
from .slo import MAX_SEARCH_STEPS
from .spec_whatif import OFF
from .spec_whatif import label as spec_label
from .specs import Attention, DeploymentSpec, HiSparseSpec, Mode, MoeA2ABackend, MoeLayout

# Concurrencies of the coarse stage (x4 apart; bisection refines the best configurations).
COARSE_LADDER = (2, 8, 32, 128, 512)
DEFAULT_BUFFERS = (2048, 4096, 6144, 8192)  # x1..x4 top_k (SGLang requires >= top_k)
DEFAULT_RATIOS = (2.0, 4.0, 8.0, 10.0)  # SGLang's default 2, the hisparse_guide's 5-10, the blog's 8 and 10
# Policies with an SGLang implementation searched by default: lru (HiSparse's kernel) and
# sglang-clock (PR #32162's multi-step swap). Any name of the replay registry may be given
# (--search-policy): salru (PR #31341, open) is left out of the default because its replay takes
# ~6-11 s per buffer here against lru's 0.65 s, and it misses more than lru at every buffer
# (glm51-longbench, B = 1-4k: 32.7 / 14.1 / 8.9 / 6.7% against 30.0 / 13.5 / 8.7 / 6.5%).
DEFAULT_POLICIES = ("lru", "sglang-clock")


@dataclass(frozen=True)
class Infeasible:
    """A configuration the search could not run, and why (the error it raised)."""

    label: str
    reason: str
    stage: str = "memory"


DeploymentGenerator = Callable[[Scenario], Iterable["DeploymentSpec | Infeasible"]]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _a2a_for(base: DeploymentSpec, moe: MoeLayout) -> MoeA2ABackend:
    """The a2a backend of a searched MoE layout: the deployment's own under ``ep``; under ``tp`` a
    DeepEP backend goes back to ``auto`` (none: DeepEP dispatches to whole experts only, and SGLang's
    MoE-TP layout is launched without ``--moe-a2a-backend``), so an EP preset's TP layouts still run."""
    if moe == MoeLayout.TP and base.moe_a2a_backend == MoeA2ABackend.DEEPEP:
        return MoeA2ABackend.AUTO
    return base.moe_a2a_backend


def same_gpus_layouts(sc: Scenario) -> Iterator[DeploymentSpec | Infeasible]:
    """Every SGLang layout of the scenario's GPUs (same count, mode and memory flags): tp over the
    divisors of the GPU count within one NVLink domain; attention TP, or DP attention with dp over
    tp's divisors above 1 (``--chunked-prefill-size`` divided by dp, as SGLang does); MoE TP or EP
    (``_a2a_for``). A layout the deployment's own checks refuse is an ``Infeasible``, not an abort."""
    base = sc.deployment
    chunk_total = base.prefill_chunk_tokens * (base.dp if base.attention == Attention.DP else 1)
    for tp in sorted(_divisors(base.gpus), reverse=True):
        if tp > sc.gpu.scale_up_gpus:
            yield Infeasible(f"tp{tp}", f"tp {tp} spans more GPUs than one NVLink domain of {sc.gpu.name} "
                             f"({sc.gpu.scale_up_gpus})", "layout")
            continue
        layouts = [(Attention.TP, 1)] + [(Attention.DP, dp) for dp in _divisors(tp) if dp > 1]
        for attention, dp in layouts:
            for moe in (MoeLayout.TP, MoeLayout.EP):
                chunk = max(1, chunk_total // dp) if attention == Attention.DP else chunk_total
                label = layout_label(tp, dp, attention, moe)
                try:
                    yield dataclasses.replace(base, tp=tp, dp=dp, attention=attention, moe=moe,
                                              moe_a2a_backend=_a2a_for(base, moe), prefill_chunk_tokens=chunk,
                                              name=label, where=f"{base.where} as {label}")
                except HisparseError as exc:
                    yield Infeasible(label, str(exc), "layout")


def node_count_layouts(nodes: Sequence[int], cluster, layouts: Sequence[str] = ("wide",)) -> DeploymentGenerator:
    """A generator of the deployment on each of ``nodes`` node counts of ``cluster``
    (``cluster.deployment_for_nodes``: ``wide`` is one DP-attention wide-EP instance of every GPU;
    ``replicas`` repeats the instance, which gives the one-node tok/s/GPU at a multiple of the load,
    so it is searched only when asked for). A layout the cluster refuses is an ``Infeasible``."""

    def gen(sc: Scenario) -> Iterator[DeploymentSpec | Infeasible]:
        from .cluster import deployment_for_nodes

        for n in nodes:
            for layout in layouts:
                try:
                    yield deployment_for_nodes(sc.deployment, cluster, n, layout=layout)
                except HisparseError as exc:
                    yield Infeasible(f"{n} node(s) of {cluster.name}, {layout}", str(exc), "layout")

    return gen


def pd_split_layouts(total_nodes: int, cluster) -> DeploymentGenerator:
    """A generator of every prefill/decode split of ``total_nodes`` nodes of ``cluster`` for a
    pd-decode deployment: p prefill nodes and ``total_nodes - p`` decode nodes, p = 1 .. total - 1
    (``cluster.deployment_for_nodes`` with ``prefill_nodes``; the decode side keeps its layout kind).
    More prefill nodes raise the rate requests reach the decode side (TTFT) at the cost of decode
    GPUs; the search ranks the splits by output tok/s over every GPU of both sides (``_row``)."""

    def gen(sc: Scenario) -> Iterator[DeploymentSpec | Infeasible]:
        from .cluster import deployment_for_nodes

        d = sc.deployment
        if d.mode.value != "pd-decode":
            yield Infeasible(f"PD splits of {total_nodes} nodes", f"deployment {d.where} is {d.mode.value}, not "
                             "pd-decode: no prefill side to split", "layout")
            return
        if total_nodes < 2 or total_nodes > cluster.nodes:
            yield Infeasible(f"PD splits of {total_nodes} nodes", f"--pd-split {total_nodes}: needs 2 to "
                             f"{cluster.nodes} nodes of {cluster.name}", "layout")
            return
        for p in range(1, total_nodes):
            try:
                yield deployment_for_nodes(d, cluster, total_nodes - p, prefill_nodes=p)
            except HisparseError as exc:
                yield Infeasible(f"{p} prefill + {total_nodes - p} decode node(s) of {cluster.name}", str(exc), "layout")

    return gen


# The search's deployment generators, in order (append one to add node counts or PD splits;
# ``hisparse plan --search --nodes 1,2`` appends ``node_count_layouts``, ``--pd-split N`` ``pd_split_layouts``).
DEPLOYMENT_GENERATORS: list[DeploymentGenerator] = [same_gpus_layouts]


def layout_label(tp: int, dp: int, attention: Attention, moe: MoeLayout) -> str:
    att = f"dp{dp}-attn" if attention == Attention.DP else "tp-attn"
    return f"tp{tp}-{att}-moe-{moe.value}"


def dep_label(d: DeploymentSpec) -> str:
    inst = f"{d.instances}x " if d.instances > 1 else ""
    pd = f" + {d.prefill_gpus} prefill" if d.mode.value == "pd-decode" and d.prefill_gpus else ""
    return f"{d.gpus}x{d.gpu} {inst}{layout_label(d.tp, d.dp, d.attention, d.moe)}{pd}"


@dataclass(frozen=True)
class SearchInputs:
    buffers: tuple[int, ...] = DEFAULT_BUFFERS
    host_ratios: tuple[float, ...] = DEFAULT_RATIOS
    policies: tuple[str, ...] = DEFAULT_POLICIES
    ladder: tuple[int, ...] = COARSE_LADDER
    top: int = 10  # rows of the ranked table
    knob_deployments: int = 2  # deployments whose HiSparse knobs are searched
    refine: int | None = None  # the best configurations bisected after the coarse stage (None: all that pass)
    slo_tpot_ms: float = 100.0
    slo_ttft_s: float | None = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.ladder or min(self.ladder) < 1:
            raise HisparseError("--search: the concurrency ladder needs positive integers")
        if self.top < 1 or self.knob_deployments < 1 or (self.refine is not None and self.refine < 0):
            raise HisparseError("--search-top and the search's stage sizes must be >= 1")
        for r in self.host_ratios:
            if not r >= 1:
                raise HisparseError(f"--search-host-ratio {r:g} must be >= 1 (SGLang's host_to_device_ratio)")


@dataclass
class Config:
    """One searched configuration and the points it ran."""

    deployment: DeploymentSpec
    system: str
    hisparse: HiSparseSpec | None
    profiles: MissProfiles | None = None
    points: list[dict] = field(default_factory=list)
    capacity: int = 0  # requests of the workload's lengths the deployment holds at once
    miss: float = math.nan  # steady miss share of the trace replay (HiSparse)
    refined: bool = False

    @property
    def label(self) -> str:
        d = dep_label(self.deployment)
        if self.hisparse is None:
            return f"{d} baseline"
        h = self.hisparse
        return f"{d} hisparse b{h.device_buffer_size} r{h.host_to_device_ratio:g} {h.policy}"

    def best(self, inp: SearchInputs) -> dict | None:
        """The point with the most tok/s/GPU among those meeting the targets (``planner.recommend``'s
        rule), which need not be the highest passing load."""
        ok = [p for p in self.points if _ok(p, inp.slo_tpot_ms, inp.slo_ttft_s)]
        return max(ok, key=lambda p: p["steady_tok_s_per_gpu"]) if ok else None


def _scenario(sc: Scenario, d: DeploymentSpec, hs: HiSparseSpec | None) -> Scenario:
    cluster = sc.cluster
    if d.cluster and (cluster is None or cluster.name != d.cluster):
        from . import presets as P

        cluster = P.load("clusters", d.cluster)
    return sc.replace(deployment=d, hisparse=hs or sc.hisparse, cluster=cluster if d.cluster else sc.cluster)


def _capacity(sc: Scenario, d: DeploymentSpec, hs: HiSparseSpec | None) -> int:
    """Requests of the workload's lengths the deployment's pools hold at once (the memory plan, no
    simulation): the bound the pruning compares."""
    plan = plan_memory(sc.model, sc.gpu, d, hs, where=sc.files)
    w = sc.workload
    ctx = ceil_page(w.input_tokens + w.output_tokens, d.page_size)
    if hs is None:
        per_rank = min(plan.max_running, plan.pool_tokens // ctx)
    else:
        per_rank = min(plan.max_running, plan.pool_tokens // plan.buffer_slots, plan.host_tokens // ctx)
    return int(per_rank) * d.ranks


def _served_limit(sc: Scenario, cfg: Config) -> int:
    """The most clients the configuration serves without any waiting for a running slot (the
    closed-loop ``overloaded`` rule of ``InstanceSim``, read before any simulation)."""
    from .model import InstanceSim

    sim = InstanceSim(_scenario(sc, cfg.deployment, cfg.hisparse), System(cfg.system), concurrency=1,
                      profiles=cfg.profiles)
    d = cfg.deployment
    return int(min(sim.plan.max_running, sim._memory_limit()) * d.ranks)


def _row(cfg: Config, sc: Scenario, c: int, seed: int) -> dict:
    r = simulate(_scenario(sc, cfg.deployment, cfg.hisparse), System(cfg.system), concurrency=c,
                 profiles=cfg.profiles, seed=seed)
    row = dataclasses.asdict(r)
    d = cfg.deployment
    if d.mode.value == "pd-decode" and d.prefill_gpus:  # a PD split: per GPU of both sides
        row["steady_tok_s_per_gpu"] = row["steady_tok_s_deployment"] / (d.gpus + d.prefill_gpus)
        row["prefill_gpus"] = d.prefill_gpus
    row["tok_s_per_user"] = 1e3 / row["tpot_mean_ms"] if row["tpot_mean_ms"] and row["tpot_mean_ms"] > 0 else 0.0
    row["config"] = cfg.label
    row["searched"] = False
    row["speculative"] = spec_label(sc.speculative)  # launch_for's flags, as a plan row's
    return row


# A ladder step is at most x4; when the last point's TTFT or TPOT, scaled linearly with the load,
# reaches its target within that step, the next load is STEP_MARGIN x that projection instead (so
# the first failing load is near the passing one and the bisection has a short bracket).
STEP_MARGIN = 1.5


def _next_load(c: int, row: dict, inp: SearchInputs, limit: int) -> int:
    f = inp.slo_tpot_ms / row["tpot_p99_ms"] if row["tpot_p99_ms"] > 0 else 4.0
    if inp.slo_ttft_s is not None and row["ttft_p99_s"] > 0:
        f = min(f, inp.slo_ttft_s / row["ttft_p99_s"])
    nxt = c * 4 if f * STEP_MARGIN >= 4 else math.ceil(c * f * STEP_MARGIN)
    return min(max(nxt, c + 1), limit)


def _ladder_rows(cfg: Config, sc: Scenario, inp: SearchInputs) -> list[dict]:
    """The coarse stage of one configuration: from the ladder's first load, x4 (or the projected
    target, ``_next_load``) until a load fails a target; loads above what the configuration holds
    at once are not simulated (they are overloaded by definition): its limit is tried instead."""
    limit = _served_limit(sc, cfg)
    rows: list[dict] = []
    c = min(inp.ladder[0], max(limit, 1))
    while True:
        row = _row(cfg, sc, c, inp.seed)
        rows.append(row)
        if not _ok(row, inp.slo_tpot_ms, inp.slo_ttft_s) or c >= limit:
            return rows
        c = _next_load(c, row, inp, limit)


def _ladder_task(args: tuple) -> list[dict]:
    cfg, sc, inp = args
    return _ladder_rows(cfg, sc, inp)


def _replay_task(args: tuple) -> None:
    trace, top_k, buffer, policy, initial = args
    try:
        miss_profiles(trace, top_k=top_k, buffer=buffer, policy=policy, initial=initial)
    except HisparseError:
        pass  # the parent meets the same error and lists it


def _parallel(fn: Callable, tasks: Sequence, jobs: int) -> list:
    """``fn`` over ``tasks`` in ``jobs`` forked processes (in this one when 1 or a single task)."""
    if jobs <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as ex:
        return list(ex.map(fn, tasks))


def _ladders(cfgs: Sequence[Config], sc: Scenario, inp: SearchInputs, jobs: int,
             tick: Callable[[int], None]) -> None:
    """Run the coarse stage of every configuration, ``jobs`` processes at once (1: in this one)."""
    if jobs > 1 and len(cfgs) > 1:
        for cfg, rows in zip(cfgs, _parallel(_ladder_task, [(c, sc, inp) for c in cfgs], jobs), strict=True):
            cfg.points.extend(rows)
            tick(len(rows))
        return
    for cfg in cfgs:
        rows = _ladder_rows(cfg, sc, inp)
        cfg.points.extend(rows)
        tick(len(rows))


def _refine(cfg: Config, sc: Scenario, inp: SearchInputs, tick: Callable[[int], None]) -> None:
    """Bisect between the best passing load and the next failing one (planner.search_plan's rule)."""
    passing = [p for p in cfg.points if _ok(p, inp.slo_tpot_ms, inp.slo_ttft_s)]
    if not passing:
        return
    lo = max(p["concurrency"] for p in passing)
    above = sorted(p["concurrency"] for p in cfg.points if p["concurrency"] > lo)
    if not above:
        return
    hi, steps = above[0], 0
    while _wide(lo, hi, True) and steps < MAX_SEARCH_STEPS:
        steps += 1
        mid = int(_mid(lo, hi, True))
        row = _row(cfg, sc, mid, inp.seed)
        row["searched"] = True
        cfg.points.append(row)
        tick(1)
        if _ok(row, inp.slo_tpot_ms, inp.slo_ttft_s):
            lo = mid
        else:
            hi = mid
    cfg.refined = True


def _refine_task(args: tuple) -> list[dict]:
    """``_refine`` on a copy of the configuration (a worker process): the points it added."""
    cfg, sc, inp = args
    cfg = dataclasses.replace(cfg, points=list(cfg.points))
    n = len(cfg.points)
    _refine(cfg, sc, inp, lambda _: None)
    return cfg.points[n:]


def _knob_sets(base: HiSparseSpec, inp: SearchInputs) -> list[HiSparseSpec | Infeasible]:
    """Every buffer x ratio x policy, each checked by the spec's own rules (a set it refuses is an
    ``Infeasible`` with the spec's message)."""
    out: list[HiSparseSpec | Infeasible] = []
    for b in inp.buffers:
        for r in inp.host_ratios:
            for p in inp.policies:
                try:
                    out.append(dataclasses.replace(base, device_buffer_size=b, host_to_device_ratio=r, policy=p,
                                                   where=f"{base.where} searched as b{b} r{r:g} {p}"))
                except HisparseError as exc:
                    out.append(Infeasible(f"hisparse b{b} r{r:g} {p}", str(exc), "knobs"))
    return out


def _dominated(cands: Sequence[Config]) -> dict[int, Config]:
    """index -> the configuration that dominates it: holds at least as many requests and misses no
    more, one of them strictly (ties broken by order: the first stays)."""
    out: dict[int, Config] = {}
    for i, a in enumerate(cands):
        for j, b in enumerate(cands):
            if i == j or j in out:
                continue
            better_or_equal = b.capacity >= a.capacity and b.miss <= a.miss
            strictly = b.capacity > a.capacity or b.miss < a.miss or j < i
            if better_or_equal and strictly:
                out[i] = b
                break
    return out


@dataclass(frozen=True)
class SearchResult:
    scenario: Scenario
    inputs: SearchInputs
    configs: tuple[Config, ...]
    infeasible: tuple[Infeasible, ...]
    pruned: tuple[tuple[str, str], ...]  # (label, why)
    seconds: float
    simulated: int

    def ranked(self) -> list[dict]:
        """One row per configuration with a point meeting the targets, best tok/s/GPU first."""
        rows = []
        for cfg in self.configs:
            best = cfg.best(self.inputs)
            if best is None:
                continue
            rows.append(_summary(cfg, best))
        rows.sort(key=lambda r: -r["tok_s_per_gpu"])
        for i, r in enumerate(rows, 1):
            r["rank"] = i
        return rows

    def failing(self) -> list[dict]:
        """Configurations that ran but met the targets at no load searched."""
        return [{"config": c.label, "reason": _why_fails(c, self.inputs)} for c in self.configs
                if c.best(self.inputs) is None]

    def points(self) -> list[dict]:
        return [p for c in self.configs for p in c.points]

    def frontier(self) -> list[dict]:
        """The Pareto frontier of tok/s/GPU against tok/s/user over every simulated point that
        serves its load within the TTFT target (the TPOT target is a line on the tok/s/user axis:
        1000 / TPOT ms), best tok/s/user first."""
        inp = self.inputs
        pts = [p for p in self.points() if not p["overloaded"] and p["tok_s_per_user"] > 0
               and (inp.slo_ttft_s is None or p["ttft_p99_s"] <= inp.slo_ttft_s)]
        pts.sort(key=lambda p: (-p["tok_s_per_user"], -p["steady_tok_s_per_gpu"]))
        out, best_gpu = [], -1.0
        for p in pts:
            if p["steady_tok_s_per_gpu"] > best_gpu:
                out.append({"config": p["config"], "concurrency": p["concurrency"],
                            "tok_s_per_user": p["tok_s_per_user"], "tok_s_per_gpu": p["steady_tok_s_per_gpu"],
                            "tpot_p99_ms": p["tpot_p99_ms"], "ttft_p99_s": p["ttft_p99_s"],
                            "meets_tpot": p["tpot_p99_ms"] <= inp.slo_tpot_ms})
                best_gpu = p["steady_tok_s_per_gpu"]
        return out


def _summary(cfg: Config, best: dict) -> dict[str, Any]:
    d, h = cfg.deployment, cfg.hisparse
    return {"config": cfg.label, "deployment": dep_label(d), "gpus": d.gpus,
            "prefill_gpus": d.prefill_gpus if d.mode.value == "pd-decode" else 0, "tp": d.tp, "dp": d.dp,
            "attention": d.attention.value, "moe": d.moe.value, "system": cfg.system,
            "device_buffer_size": h.device_buffer_size if h else None,
            "host_to_device_ratio": h.host_to_device_ratio if h else None, "policy": h.policy if h else None,
            "concurrency": best["concurrency"], "tok_s_per_gpu": best["steady_tok_s_per_gpu"],
            "tok_s_per_user": best["tok_s_per_user"], "tok_s_deployment": best["steady_tok_s_deployment"],
            "tpot_p99_ms": best["tpot_p99_ms"], "ttft_p99_s": best["ttft_p99_s"],
            "capacity": cfg.capacity, "miss_share": None if math.isnan(cfg.miss) else cfg.miss,
            "speculative": best.get("speculative", OFF), "refined": cfg.refined, "points": len(cfg.points)}


def _why_fails(cfg: Config, inp: SearchInputs) -> str:
    if not cfg.points:
        return "not simulated"
    p = min(cfg.points, key=lambda r: r["concurrency"])
    parts = []
    if p["overloaded"]:
        parts.append("cannot serve its load")
    if not p["tpot_p99_ms"] <= inp.slo_tpot_ms:
        parts.append(f"TPOT p99 {p['tpot_p99_ms']:.1f} ms > {inp.slo_tpot_ms:g}")
    if inp.slo_ttft_s is not None and not p["ttft_p99_s"] <= inp.slo_ttft_s:
        parts.append(f"TTFT p99 {p['ttft_p99_s']:.1f} s > {inp.slo_ttft_s:g}")
    return f"at concurrency {p['concurrency']} (the lowest searched): " + "; ".join(parts or ["fails"])


def check_budget(sc: Scenario, inp: SearchInputs, trace: str | None) -> None:
    """The search's work against the budgets (``simulator.limits``), from its lists before any work:
    its knob sets' ladder points on the ``knob_deployments`` layouts (HISPARSE_MAX_POINTS; the
    dominance check also compares every pair of them) and one trace replay per (buffer, policy)
    (HISPARSE_MAX_SIM_STEPS, in ``plan_steps``'s steps). 200 buffers x 50 ratios x every policy ran for
    hours, its progress bar still between stages."""
    from .. import limits
    from .misses import trace_accesses

    sets = len(inp.buffers) * len(inp.host_ratios) * len(inp.policies)
    shape = (f"--search-buffer ({len(inp.buffers)}) x --search-host-ratio ({len(inp.host_ratios)}) x "
             f"--search-policy ({len(inp.policies)})")
    limits.check(sets * inp.knob_deployments * len(inp.ladder), "HISPARSE_MAX_POINTS",
                 f"--search: {shape} = {sets} HiSparse knob sets on {inp.knob_deployments} layouts x "
                 f"{len(inp.ladder)} ladder loads", unit="simulated points", hint="fewer searched values")
    replays = len({(b, p) for b in inp.buffers for p in inp.policies if b >= sc.hisparse.top_k}) + 1
    accesses = trace_accesses(trace)
    limits.check(limits.replay_steps(replays, accesses), "HISPARSE_MAX_SIM_STEPS",
                 f"--search: {replays} trace replays (--search-buffer x --search-policy) of {accesses:,} accesses",
                 unit="scheduler steps", hint="fewer buffers or policies")


def run_search(sc: Scenario, inp: SearchInputs, *, trace: str | None = None,
               generators: Sequence[DeploymentGenerator] | None = None,
               tick: Callable[[int], None] | None = None, jobs: int = 1) -> SearchResult:
    """The three stages of the module docstring; never raises for one configuration that cannot
    run (its error is listed instead). ``jobs`` processes run the coarse stages' ladders."""
    check_budget(sc, inp, trace)
    t0 = time.perf_counter()
    n0 = [0]

    def count(n: int) -> None:
        n0[0] += n
        if tick:
            tick(n)

    initial = "prefix" if sc.deployment.mode == Mode.COLOCATED else "empty"
    infeasible: list[Infeasible] = []
    pruned: list[tuple[str, str]] = []
    deployments: list[DeploymentSpec] = []
    seen: set = set()
    for gen in generators or DEPLOYMENT_GENERATORS:
        for d in gen(sc):
            if isinstance(d, Infeasible):
                infeasible.append(d)
                continue
            key = (d.gpus, d.tp, d.dp, d.attention, d.moe, d.mode, d.gpu, getattr(d, "prefill_gpus", 0))
            if key in seen:
                continue
            seen.add(key)
            try:
                _scenario(sc, d, None)  # the scenario's own checks (NVLink domain, context length)
                plan_memory(sc.model, sc.gpu, d, None, where=d.where)
            except HisparseError as exc:
                infeasible.append(Infeasible(dep_label(d), str(exc)))
                continue
            deployments.append(d)
    profiles_cache: dict[tuple, MissProfiles] = {}
    if jobs > 1:  # replay every (buffer, policy) once, in parallel; each lands in the disk cache
        pairs = sorted({(b, p) for b in inp.buffers for p in inp.policies if b >= sc.hisparse.top_k}
                       | {(sc.hisparse.device_buffer_size, sc.hisparse.policy)}, key=str)
        _parallel(_replay_task, [(trace, sc.hisparse.top_k, b, p, initial) for b, p in pairs], jobs)

    def profiles_for(hs: HiSparseSpec) -> MissProfiles:
        key = (hs.device_buffer_size, hs.policy)
        if key not in profiles_cache:
            profiles_cache[key] = miss_profiles(trace, top_k=hs.top_k, buffer=hs.device_buffer_size,
                                                policy=hs.policy, initial=initial)
        return profiles_cache[key]

    configs: list[Config] = []
    hs_first: dict[int, Config] = {}
    base_cfg: dict[int, Config] = {}
    for i, d in enumerate(deployments):
        base_cfg[i] = Config(d, System.BASELINE.value, None, capacity=_capacity(sc, d, None))
        configs.append(base_cfg[i])
        try:
            cap = _capacity(sc, d, sc.hisparse)
        except HisparseError as exc:
            infeasible.append(Infeasible(f"{dep_label(d)} hisparse (the scenario's knobs)", str(exc)))
            continue
        prof = profiles_for(sc.hisparse)
        h = Config(d, System.HISPARSE.value, sc.hisparse, prof, capacity=cap,
                   miss=prof.mean_share(prof.steady_from()))
        configs.append(h)
        hs_first[i] = h
    _ladders(configs, sc, inp, jobs, count)

    def score(c: Config) -> float:
        b = c.best(inp)
        return b["steady_tok_s_per_gpu"] if b else -1.0

    def refine(cfgs: Sequence[Config]) -> None:
        ranked = sorted(cfgs, key=lambda c: -score(c))
        todo = [c for c in (ranked if inp.refine is None else ranked[: inp.refine]) if score(c) > 0 and not c.refined]
        for c, rows in zip(todo, _parallel(_refine_task, [(c, sc, inp) for c in todo], jobs), strict=True):
            c.points.extend(rows)
            c.refined = True
            count(len(rows))

    refine(configs)  # the layouts are ranked on their refined loads (a coarse ladder lands unevenly)

    # the layouts that serve most under the targets (either system: a layout whose HiSparse cannot run
    # the scenario's knobs, e.g. for host memory, may run others)
    order = sorted(range(len(deployments)),
                   key=lambda i: -max(score(base_cfg[i]), score(hs_first[i]) if i in hs_first else -1.0))
    new: list[Config] = []
    for i in order[: inp.knob_deployments]:
        d = deployments[i]
        cands: list[Config] = []
        for hs in _knob_sets(sc.hisparse, inp):
            if isinstance(hs, Infeasible):
                infeasible.append(dataclasses.replace(hs, label=f"{dep_label(d)} {hs.label}"))
                continue
            label = Config(d, System.HISPARSE.value, hs).label
            try:
                cap = _capacity(sc, d, hs)
                prof = profiles_for(hs)
            except HisparseError as exc:
                infeasible.append(Infeasible(label, str(exc), "knobs"))
                continue
            cands.append(Config(d, System.HISPARSE.value, hs, prof, capacity=cap,
                                miss=prof.mean_share(prof.steady_from())))
        # the scenario's own knob set already ran: it competes in the dominance check, is not re-run
        first = hs_first.get(i)
        pool = ([first] if first else []) + [c for c in cands if first is None or c.label != first.label]
        dom = _dominated(pool)
        for j, c in enumerate(pool):
            if j in dom:
                if c is not first:
                    pruned.append((c.label, f"dominated by {dom[j].label}: holds {c.capacity} requests <= "
                                            f"{dom[j].capacity}, misses {c.miss:.1%} >= {dom[j].miss:.1%}"))
                continue
            if c is first:
                continue
            if c.capacity < 1:
                infeasible.append(Infeasible(c.label, "its pools hold no request of the workload's lengths", "knobs"))
                continue
            new.append(c)
    configs.extend(new)
    _ladders(new, sc, inp, jobs, count)
    refine(configs)
    return SearchResult(sc, inp, tuple(configs), tuple(infeasible), tuple(pruned), time.perf_counter() - t0, n0[0])

"""The SimPy serving model: one representative data-parallel rank of a deployment.

With DP attention, requests are spread evenly over the ``dp`` ranks and each rank schedules its
own; ranks share the MoE, so a decode step's weight reads depend on the tokens of all ranks (the
model assumes every active rank runs the same batch). One rank is simulated with
ceil(concurrency / dp) clients, and node figures are scaled by concurrency / that number.

A rank loops: admit waiting requests while their memory fits (a request reserves its whole
context); run one prefill chunk if a request is prefilling (prefill first, as SGLang schedules);
else one decode step for every running request. Each request's first token comes at the end of
its prefill; it then needs ``output_tokens - 1`` decode steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import simpy

from .costs import CostModel
from .memory import MemoryPlan, plan_memory
from .misses import MissProfiles
from .presets import CostParams, DeploymentSpec, GpuSpec, HiSparseSpec, ModelSpec, WorkloadSpec


@dataclass
class Request:
    rid: int
    input_tokens: int
    output_tokens: int
    profile: int
    arrival: float
    device_bytes: float = 0.0
    host_bytes: float = 0.0
    prefilled: int = 0
    generated: int = 0
    first_token: float = math.nan
    finish: float = math.nan
    done: simpy.Event | None = None


@dataclass
class RunResult:
    system: str
    concurrency: int  # closed loop; 0 for open-loop runs
    rate_per_s: float  # open loop arrival rate, whole deployment; 0 for closed loop
    throughput_tok_s: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    ttft_p50_ms: float
    running: float  # mean running requests, whole deployment
    max_running: int  # memory limit, whole deployment
    hbm_used_gb: float  # per GPU, peak
    host_used_gb: float  # per GPU, peak
    step_ms_mean: float
    swap_share: float  # share of decode time spent in swap-in
    miss_share: float  # mean share of top-k missed per step
    requests: int
    sim_time_s: float
    extra: dict = field(default_factory=dict)


class RankSim:
    def __init__(self, *, system: str, model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, workload: WorkloadSpec,
                 params: CostParams, hisparse: HiSparseSpec | None, profiles: MissProfiles | None,
                 concurrency: int, seed: int = 0) -> None:
        if system == "hisparse" and (hisparse is None or profiles is None):
            raise ValueError("the hisparse system needs a HiSparse config and miss profiles")
        self.system, self.m, self.d, self.w = system, model, dep, workload
        self.hs = hisparse if system == "hisparse" else None
        self.profiles = profiles
        self.cost = CostModel(model, gpu, dep, params)
        self.concurrency = concurrency if workload.arrival == "closed" else 0
        self.clients = max(1, math.ceil(concurrency / dep.dp))
        # open loop: requests spread over every rank at rate_per_s / dp each
        self.active_ranks = min(concurrency, dep.dp) if workload.arrival == "closed" else dep.dp
        self.rng = np.random.default_rng(seed)
        ctx = workload.input_tokens + workload.output_tokens
        self.plan: MemoryPlan = plan_memory(model, gpu, dep, self.hs, ctx, workload.input_tokens)
        self.env = simpy.Environment()
        self.wake = self.env.event()
        self.waiting: list[Request] = []
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.free_device = self.plan.kv_pool_bytes - self.plan.staging_bytes
        self.free_host = self.plan.host_pool_bytes
        self.peak_device = self.peak_host = 0.0
        self.busy_running_time = 0.0
        self.decode_time = self.swap_time = 0.0
        self.miss_rows = self.looked_up = 0.0
        self.steps = 0
        self._rid = 0

    # -- requests ----------------------------------------------------------------------------
    def _lengths(self) -> tuple[int, int]:
        j = self.w.length_jitter
        scale = self.rng.uniform(1 - j, 1 + j, size=2) if j > 0 else np.ones(2)
        return max(1, round(self.w.input_tokens * scale[0])), max(1, round(self.w.output_tokens * scale[1]))

    def _new_request(self) -> Request:
        n_in, n_out = self._lengths()
        r = Request(self._rid, n_in, n_out, profile=self._rid, arrival=self.env.now, done=self.env.event())
        self._rid += 1
        ctx = n_in + n_out
        if self.hs is None:
            r.device_bytes = ctx * (self.m.kv_bytes_per_token() + self.m.indexer_bytes_per_token())
        else:
            r.device_bytes = self.plan.device_bytes_per_request - self.w.input_tokens * 0 + \
                (ctx - (self.w.input_tokens + self.w.output_tokens)) * self.m.indexer_bytes_per_token()
            r.host_bytes = ctx * self.m.kv_bytes_per_token()
        if r.device_bytes > self.free_device + sum(x.device_bytes for x in self._holders()) or \
                (self.hs is not None and r.host_bytes > self.plan.host_pool_bytes):
            raise MemoryError(f"one request of {ctx} tokens does not fit in a GPU's memory")
        return r

    def _holders(self) -> list[Request]:
        return self.prefilling + self.running

    def submit(self, r: Request) -> None:
        self.waiting.append(r)
        if not self.wake.triggered:
            self.wake.succeed()

    def closed_client(self, n: int):
        for _ in range(n):
            r = self._new_request()
            self.submit(r)
            yield r.done

    def open_arrivals(self, rate_per_rank: float, n: int):
        for _ in range(n):
            yield self.env.timeout(self.rng.exponential(1.0 / rate_per_rank))
            self.submit(self._new_request())

    # -- the scheduler ---------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting:
            r = self.waiting[0]
            if r.device_bytes > self.free_device or r.host_bytes > self.free_host:
                break
            self.waiting.pop(0)
            self.free_device -= r.device_bytes
            self.free_host -= r.host_bytes
            self.prefilling.append(r)
        used_dev = self.plan.kv_pool_bytes - self.free_device
        self.peak_device = max(self.peak_device, used_dev)
        self.peak_host = max(self.peak_host, self.plan.host_pool_bytes - self.free_host)

    def scheduler(self):
        env = self.env
        chunk = self.d.prefill_chunk_tokens
        while True:
            self._admit()
            if self.prefilling:
                r = self.prefilling[0]
                n = min(chunk, r.input_tokens - r.prefilled)
                t = self.cost.prefill_chunk(n, r.prefilled, self.hs is not None)
                self.busy_running_time += t * len(self.running)
                yield env.timeout(t)
                r.prefilled += n
                if r.prefilled >= r.input_tokens:
                    self.prefilling.pop(0)
                    r.first_token = env.now
                    r.generated = 1
                    if r.generated >= r.output_tokens:
                        self._finish(r)
                    else:
                        self.running.append(r)
                continue
            if self.running:
                yield from self._decode_block()
                continue
            self.wake = env.event()
            yield self.wake

    def _decode_block(self):
        """Decode steps until the next request finishes (the batch is fixed until then), cut short
        after the step in flight when a new request arrives. Each step is costed on its own."""
        env = self.env
        batch = len(self.running)
        n = min(r.output_tokens - r.generated for r in self.running)
        ctx_sum = sum(r.input_tokens + r.generated for r in self.running) + batch * np.arange(n)
        missed = None
        if self.hs is not None:
            share = np.zeros(n)
            for r in self.running:
                share += self.profiles.shares_from(r.profile, r.generated - 1, n)
            missed = share * self.hs.top_k * self.m.layers
        st = self.cost.decode_steps(batch, batch * self.active_ranks, ctx_sum, missed)
        step_s = np.broadcast_to(st.total_s, (n,))
        cum = np.cumsum(step_s)
        start = env.now
        if self.wake.triggered:
            self.wake = env.event()
        done = env.timeout(float(cum[-1]))
        yield done | self.wake
        steps = n
        if not done.processed:
            # a request arrived: finish the step in flight, then let the scheduler admit it
            elapsed = env.now - start
            steps = min(n, int(np.searchsorted(cum, elapsed, side="right")) + 1)
            yield env.timeout(max(0.0, float(cum[steps - 1]) - elapsed))
        self.busy_running_time += float(cum[steps - 1]) * batch
        self.decode_time += float(cum[steps - 1])
        self.swap_time += float(np.broadcast_to(st.swap_s, (n,))[:steps].sum())
        if missed is not None:
            self.miss_rows += float(share[:steps].sum())
            self.looked_up += batch * steps
        self.steps += steps
        still = []
        for r in self.running:
            r.generated += steps
            if r.generated >= r.output_tokens:
                self._finish(r)
            else:
                still.append(r)
        self.running = still

    def _finish(self, r: Request) -> None:
        r.finish = self.env.now
        self.free_device += r.device_bytes
        self.free_host += r.host_bytes
        self.finished.append(r)
        r.done.succeed()

    # -- a run -----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        env = self.env
        env.process(self.scheduler())
        if self.w.arrival == "closed":
            for _ in range(self.clients):
                env.process(self.closed_client(self.w.requests_per_client))
            total = self.clients * self.w.requests_per_client
        else:
            total = self.w.requests_per_client * 16
            env.process(self.open_arrivals(self.w.rate_per_s / self.d.dp, total))
        while len(self.finished) < total:
            if not env.peek() < float("inf"):
                break
            env.step()
        return self._result(total)

    def _result(self, total: int) -> RunResult:
        done = self.finished
        makespan = max((r.finish for r in done), default=0.0)
        scale = self.concurrency / self.clients if self.w.arrival == "closed" else self.d.dp
        out_tokens = sum(r.output_tokens for r in done)
        tpot = np.array([(r.finish - r.first_token) / (r.output_tokens - 1) for r in done if r.output_tokens > 1])
        ttft = np.array([r.first_token - r.arrival for r in done])
        gb = 1e9
        return RunResult(
            system=self.system, concurrency=self.concurrency,
            rate_per_s=self.w.rate_per_s if self.w.arrival == "open" else 0.0,
            throughput_tok_s=out_tokens / makespan * scale if makespan > 0 else 0.0,
            tpot_p50_ms=float(np.percentile(tpot, 50) * 1e3) if tpot.size else math.nan,
            tpot_p99_ms=float(np.percentile(tpot, 99) * 1e3) if tpot.size else math.nan,
            ttft_p50_ms=float(np.percentile(ttft, 50) * 1e3) if ttft.size else math.nan,
            running=self.busy_running_time / makespan * scale if makespan > 0 else 0.0,
            max_running=self.plan.max_running_per_gpu * self.d.dp,
            hbm_used_gb=(self.plan.weights_bytes + self.plan.staging_bytes + self.peak_device) / gb,
            host_used_gb=self.peak_host / gb,
            step_ms_mean=self.decode_time / self.steps * 1e3 if self.steps else math.nan,
            swap_share=self.swap_time / self.decode_time if self.decode_time else 0.0,
            miss_share=self.miss_rows / self.looked_up if self.looked_up else 0.0,
            requests=len(done), sim_time_s=makespan)


def simulate(system: str, concurrency: int, **kw) -> RunResult:
    return RankSim(system=system, concurrency=concurrency, **kw).run()

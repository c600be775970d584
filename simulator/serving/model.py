"""The SimPy serving model: one instance of a deployment, its schedulers in lockstep.

Under DP attention an instance's ``dp`` schedulers (SGLang's DP ranks) each admit and batch their own
requests, but every forward pass is collective: before each one the ranks exchange their token
counts and forward modes (``managers/scheduler_dp_attn_mixin.py``, ``prepare_mlp_sync_batch_raw``; a
rank with nothing to do runs an idle batch), the MLP runs on every rank's tokens gathered together,
and CUDA graphs replay only when every rank decodes. So a pass lasts as long as its slowest rank's
attention side plus the instance-wide MLP and collectives, and a prompt chunk on one rank stalls the
decode of all the others for that pass (they decode one step inside it; SGLang's
``--enable-prefill-delayer``, off by default and not among the blog's flags, would hold a rank's
prefill for up to 30 passes so that ranks prefill together: not modelled). The model simulates every
scheduler of one instance explicitly (requests dispatched round robin, SGLang's default
``load_balance_method``) and scales the instance's figures to the deployment; TP attention has one
scheduler per instance. Instances are identical and independent.

A scheduler loops, as SGLang's does: in ``colocated`` mode it forms a prefill batch with SGLang's
``PrefillAdder`` arithmetic (``admission.py``: the request mid-prefill's next chunk, then waiting
requests in FIFO order while the chunk budget, the running-request cap and the token budget allow;
a NO_TOKEN answer sets ``batch_is_full``, which stops admission until a running request leaves or
a pass whose chunked request continues; HiSparse's ``get_next_batch_to_run`` clears it every round)
and runs it if it has one
(prefill batches before decode batches; its running requests wait); else one decode step for every
running request, after SGLang's ``check_decode_mem`` (a page for every request whose next token
opens one): when that fails, ``retract_decode`` frees requests, which go back to the end of the
queue and later prefill their prompt and generated tokens again. KV slots are held page by page
(a prompt's pages as its chunks run, a decode page every ``page_size`` tokens); under HiSparse the
prompt's device pages shrink to the hot buffer after its last chunk and decode takes logical ids
only, while admission reads ``min(logical, device)`` free as SGLang's allocator reports it. In ``pd-decode`` mode there is no prefill on the
instance (admission there is SGLang's decode pre-allocation queue, ``admission.decode_preallocs``:
prompts + 512 reserved tokens, outputs not reserved; retracted requests offload their KV to host
and resume first): a request arrives after the prefill side has processed it (a FIFO server of
``prefill_tok_s`` input tokens/s for the whole deployment, or at once when that is 0), its first
token already made, its KV in HBM (baseline) or in the host pool (HiSparse: the buffer starts empty,
so its first step misses every top-k entry of every layer; SGLang
``hisparse_coordinator.admit_request_direct``).

A request whose context is at most ``device_buffer_size`` takes SGLang's fast path: no swap-in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import simpy

from ..costmodel import CostModel, Pass, RankWork
from ..errors import HisparseError
from .admission import (
    NUM_RESERVED_DECODE_TOKENS,
    AddResult,
    PrefillBudget,
    RatioSchedule,
    Seq,
    ceil_page,
    decode_allocatable,
    decode_preallocs,
    ratio_after_retract,
    retract_order,
)
from .memory import MemoryPlan, check_fits, plan_memory
from .misses import MissProfiles
from .scenario import Scenario
from .specs import Attention, Mode


class System(StrEnum):
    BASELINE = "baseline"  # every token's KV in HBM
    HISPARSE = "hisparse"  # hot buffers in HBM, the full KV in the host pool


@dataclass
class Request:
    rid: int
    input_tokens: int
    output_tokens: int
    profile: int
    arrival: float
    slots_device: int = 0  # device KV slots held (page-granular)
    slots_host: int = 0  # HiSparse logical/host slots held (page-granular)
    prefilled: int = 0  # tokens of the current prefill done
    target: int = 0  # tokens the current prefill covers: the prompt, plus the generated ones after a retraction
    generated: int = 0  # output tokens so far (the first comes with the prefill's last chunk)
    retractions: int = 0
    buffer_since: int = 0  # decode steps done when its hot buffer was last set up (the trace restarts there)
    first_token: float = math.nan
    admitted: float = math.nan
    finish: float = math.nan
    done: simpy.Event | None = None


@dataclass(frozen=True)
class RunResult:
    """One simulated load point. Deployment figures cover every GPU; per-GPU ones say so."""

    system: str
    concurrency: int  # closed loop; 0 for open loop
    rate_per_s: float  # open loop arrival rate, requests/s for the deployment; 0 for closed loop
    steady_tok_s_deployment: float  # output tokens/s while the running set is steady
    steady_tok_s_per_gpu: float
    makespan_tok_s_deployment: float  # output tokens / time from first arrival to last finish
    steady_window_s: float  # length of the steady window (0: no steady window, steady = makespan figure)
    tpot_p50_ms: float
    tpot_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    ttft_p50_s: float
    ttft_p99_s: float
    running_deployment: float  # mean running requests
    max_running_deployment: int  # admission limit (memory and cap)
    served_req_s_deployment: float  # completed requests/s
    overloaded: bool  # open loop: arrivals faster than the deployment serves them
    hbm_static_gb_per_gpu: float  # weights + the KV pool SGLang allocates at start-up
    kv_used_gb_per_gpu: float  # peak device KV in use
    host_used_gb_per_gpu: float  # peak pinned host KV in use
    step_ms_mean: float
    swap_share: float  # share of decode time in swap-in
    comm_share: float  # share of decode time in collectives
    miss_share: float  # mean share of top-k missed per request step
    requests: int
    sim_time_s: float
    retractions: int = 0  # requests SGLang's retract_decode sent back to the queue (deployment)
    reprefill_tokens: float = 0.0  # prompt + generated tokens prefilled again after retractions (deployment)
    peak_running_deployment: int = 0  # most requests decoding at once (the fullest moment)


@dataclass
class _Rank:
    """One scheduler's queues and free pool slots."""

    free_device: int
    free_host: int
    ratio: float  # SGLang's new_token_ratio of this scheduler
    waiting: list[Request] = field(default_factory=list)
    prefilling: list[Request] = field(default_factory=list)  # the chunked request (at most one) mid-prefill
    running: list[Request] = field(default_factory=list)
    retracted: list[Request] = field(default_factory=list)  # pd-decode: KV offloaded to host, resumed first
    batch_is_full: bool = False  # SGLang's running_batch.batch_is_full: no admission until a request leaves
    gap_carry: float = 0.0  # time its running requests waited on its own prefill since their last token


class InstanceSim:
    """One instance serving ``system`` at one load point (every scheduler of it simulated)."""

    def __init__(self, scenario: Scenario, system: System | str, *, concurrency: int = 0, rate_per_s: float = 0.0,
                 profiles: MissProfiles | None = None, seed: int = 0) -> None:
        self.sc = scenario
        self.system = System(system)
        m, d, w = scenario.model, scenario.deployment, scenario.workload
        self.m, self.d, self.w = m, d, w
        self.hs = scenario.hisparse if self.system == System.HISPARSE else None
        if self.hs is not None and profiles is None:
            raise ValueError("the hisparse system needs miss profiles")
        self.open_loop = rate_per_s > 0
        if not self.open_loop and concurrency < 1:
            raise HisparseError("a closed-loop point needs concurrency >= 1")
        self.profiles = profiles
        self.cost = CostModel(m, scenario.gpu, d, scenario.params, scenario.terms)
        self.concurrency = 0 if self.open_loop else concurrency
        self.rate = rate_per_s
        self.clients = 1 if self.open_loop else max(1, math.ceil(concurrency / d.instances))
        self.scale = d.instances if self.open_loop else concurrency / self.clients
        self.rng = np.random.default_rng(seed)
        self.plan: MemoryPlan = plan_memory(m, scenario.gpu, d, self.hs, where=scenario.files)
        self.ratios = RatioSchedule(d.schedule_conservativeness, d.attention == Attention.DP)
        self.pd = d.mode == Mode.PD_DECODE
        check_fits(self.plan, _max_len(w.input_tokens, w.length_jitter), _max_len(w.output_tokens, w.length_jitter),
                   d.mode, scenario.files)
        if not self.pd:
            self._check_admissible(_max_len(w.input_tokens, w.length_jitter), _max_len(w.output_tokens, w.length_jitter))
        self.env = simpy.Environment()
        self.wake = self.env.event()
        self.ranks = [_Rank(self.plan.pool_tokens, self.plan.host_tokens, self.ratios.init)
                      for _ in range(d.ranks_per_instance)]
        self.retractions = 0
        self.pending_copy_s = 0.0  # pd-decode: KV copies of retracted requests not yet waited for
        self.reprefill_tokens = 0.0
        self.prefill_tokens = 0  # tokens run through prefill passes (first prefills and re-prefills)
        self.peak_running = 0
        self.finished: list[Request] = []
        self.peak_device = self.peak_host = 0  # the fullest rank's slots in use
        self.busy_running_time = 0.0  # running requests x time, all ranks
        self.decode_time = self.swap_time = self.comm_time = 0.0  # instance time in decode passes
        self.miss_rows = self.looked_up = 0.0
        self.steps = 0
        self.blocks: list[tuple[float, float, float]] = []  # (start, end, tokens) of each decode pass or block
        self.itl: list[np.ndarray] = []  # inter-token gaps (s)
        self.itl_weight: list[np.ndarray] = []  # requests that saw each gap
        self.last_arrival = 0.0
        self.queue_at_last_arrival = 0
        self._rid = 0
        self._next_rank = 0
        # the prefill side: one server per scheduler (a prefill instance's DP ranks prefill in parallel)
        self.prefill_rate = prefill_tok_s(scenario) / d.ranks if self.pd else 0.0
        self.prefill_side = simpy.Resource(self.env, capacity=d.ranks_per_instance) if self.pd else None

    # -- requests ----------------------------------------------------------------------------
    def _lengths(self) -> tuple[int, int]:
        j = self.w.length_jitter
        scale = self.rng.uniform(1 - j, 1 + j, size=2) if j > 0 else np.ones(2)
        return max(1, round(self.w.input_tokens * scale[0])), max(1, round(self.w.output_tokens * scale[1]))

    def _new_request(self) -> Request:
        n_in, n_out = self._lengths()
        r = Request(self._rid, n_in, n_out, profile=self._rid, arrival=self.env.now, done=self.env.event())
        self._rid += 1
        r.target = n_in
        return r

    def _arrive(self, r: Request):
        """Into a scheduler's queue, round robin: at once (colocated), or after the prefill side (pd-decode)."""
        if self.pd:
            if self.prefill_side is not None:
                with self.prefill_side.request() as slot:
                    yield slot
                    yield self.env.timeout(r.input_tokens / self.prefill_rate)
            r.prefilled = r.input_tokens
            r.first_token = self.env.now
            r.generated = 1
        self.last_arrival = self.env.now
        rank = self.ranks[self._next_rank % len(self.ranks)]
        self._next_rank += 1
        rank.waiting.append(r)
        queued = sum(len(k.waiting) for k in self.ranks)
        queued += len(self.prefill_side.queue) if self.prefill_side is not None else 0
        self.queue_at_last_arrival = queued
        if not self.wake.triggered:
            self.wake.succeed()

    def closed_client(self, n: int):
        for _ in range(n):
            r = self._new_request()
            yield from self._arrive(r)
            yield r.done

    def open_arrivals(self, rate: float, n: int):
        for _ in range(n):
            yield self.env.timeout(self.rng.exponential(1.0 / rate))
            self.env.process(self._arrive(self._new_request()))

    # -- memory (page-granular, as SGLang's paged allocators) ---------------------------------------------
    @property
    def _page(self) -> int:
        return self.d.page_size

    def _pages_opened(self, filled: int, tokens: int) -> int:
        """Slots (whole pages) that ``tokens`` more tokens take after ``filled`` ones."""
        return ceil_page(filled + tokens, self._page) - ceil_page(filled, self._page)

    def _available(self, k: _Rank) -> int:
        """SGLang's ``available_size()``: the device pool; under HiSparse min(logical, device) free
        (``HiSparseTokenToKVPoolAllocator.available_size``)."""
        return k.free_device if self.hs is None else min(k.free_device, k.free_host)

    def _seq(self, r: Request) -> Seq:
        return Seq(max_new=r.output_tokens, out=r.generated, prompt=r.input_tokens)

    def _note_peaks(self, k: _Rank) -> None:
        self.peak_device = max(self.peak_device, self.plan.pool_tokens - k.free_device)
        self.peak_host = max(self.peak_host, self.plan.host_tokens - k.free_host)

    def _check_admissible(self, n_in: int, n_out: int) -> None:
        """A request SGLang's PrefillAdder refuses even on an empty scheduler can never run: the
        user's error, named with the files."""
        budget = PrefillBudget(self._empty_available(), [], self.ratios.init, self.d.prefill_chunk_tokens,
                               self._page, self.w.ignore_eos)
        took, _ = budget.add_new(Seq(n_out, 0, n_in), n_in)
        if not took:
            rule = ("prompt + all output tokens (PrefillAdder.add_one_req_ignore_eos)" if self.w.ignore_eos else
                    "prompt + min(output, 4096) + a page (PrefillAdder.add_one_req)")
            raise HisparseError(
                f"{self.sc.files}: SGLang never admits a request of {n_in} + {n_out} tokens: its {rule} exceed "
                f"the {self._empty_available()} free KV slots of an idle scheduler"
                + (" (HiSparse: available_size = min(logical, device) free; allocator/hisparse.py)"
                   if self.hs is not None else ""))

    def _empty_available(self) -> int:
        return self.plan.pool_tokens if self.hs is None else min(self.plan.pool_tokens, self.plan.host_tokens)

    def _alloc_prefill(self, k: _Rank, r: Request, n: int) -> bool:
        """The pages of a prompt chunk (``alloc_extend``: logical and device ids under HiSparse)."""
        pages = self._pages_opened(r.prefilled, n)
        if pages > k.free_device or (self.hs is not None and pages > k.free_host):
            return False
        k.free_device -= pages
        r.slots_device += pages
        if self.hs is not None:
            k.free_host -= pages
            r.slots_host += pages
        self._note_peaks(k)
        return True

    def _release(self, k: _Rank, r: Request) -> None:
        k.free_device += r.slots_device
        k.free_host += r.slots_host
        r.slots_device = r.slots_host = 0

    # -- the schedulers ------------------------------------------------------------------------------
    def _admit_pd(self, k: _Rank) -> None:
        """pd-decode: SGLang's ``DecodePreallocQueue`` (``admission.py``): retracted requests resume
        first (their KV copied back from host memory), and while any waits no new one is taken;
        then transferred requests, FIFO, while ``decode_preallocs`` admits them, each holding its
        prompt's slots (HiSparse: logical/host slots and a hot buffer) and growing page by page."""
        while k.retracted and len(k.running) < self.plan.max_running:
            r = k.retracted[0]
            allocatable = decode_allocatable(self._available_logical(k), [self._seq(q) for q in k.running])
            if r.input_tokens + r.generated + NUM_RESERVED_DECODE_TOKENS > allocatable or not self._pd_fits(k, r):
                break
            k.retracted.pop(0)
            self._pd_take(k, r)
            if self.hs is None:  # load_kv_cache: the offloaded rows back over the host link
                self.pending_copy_s += self.cost.kv_copy_time(r.input_tokens + r.generated - 1)
        if k.retracted:
            return
        room = self.plan.max_running - len(k.running)
        if room <= 0 or not k.waiting:
            return
        device_requests = None if self.hs is None else k.free_device // self.plan.buffer_slots
        n = decode_preallocs([self._seq(r) for r in k.waiting[:room]], [self._seq(q) for q in k.running],
                             self._available_logical(k), device_requests=device_requests)
        for r in k.waiting[:n]:
            if not self._pd_fits(k, r):  # the prompt's pages themselves (page rounding)
                break
            k.waiting.remove(r)
            r.admitted = self.env.now
            self._pd_take(k, r)
        self._note_peaks(k)

    def _available_logical(self, k: _Rank) -> int:
        """What ``_allocatable_tokens`` starts from: the device pool, or HiSparse's logical pool."""
        return k.free_device if self.hs is None else k.free_host

    def _pd_slots(self, r: Request) -> tuple[int, int]:
        """(device, host) slots a transferred request takes: its KV so far (``_pre_alloc``'s fill
        length, prompt plus generated tokens but the last), or under HiSparse the hot buffer and the
        logical/host slots."""
        kv = ceil_page(r.input_tokens + r.generated - 1, self._page)
        if self.hs is None:
            return kv, 0
        return self.plan.buffer_slots, kv

    def _pd_fits(self, k: _Rank, r: Request) -> bool:
        dev, host = self._pd_slots(r)
        return dev <= k.free_device and host <= k.free_host

    def _pd_take(self, k: _Rank, r: Request) -> None:
        dev, host = self._pd_slots(r)
        r.buffer_since = r.generated - 1  # admit_request_direct: an empty buffer (or the whole context)
        k.free_device -= dev
        k.free_host -= host
        r.slots_device, r.slots_host = dev, host
        if r.generated >= r.output_tokens:
            self._finish(k, r)
        else:
            k.running.append(r)

    def _prefill_batch(self, k: _Rank) -> list[tuple[Request, int]]:
        """This round's extend batch of one scheduler (``Scheduler.get_new_batch_prefill``): the
        chunked request's next chunk, then waiting requests while ``PrefillBudget`` admits them."""
        if not (k.running or k.waiting or k.prefilling):
            k.ratio = self.ratios.init  # self_check_during_idle
        if self.hs is not None:
            # get_next_batch_to_run under HiSparse skips the last_batch merge (collect_ready_reqs moves
            # staged requests to the running batch) and resets batch_is_full every round
            k.batch_is_full = False
        budget = PrefillBudget(self._available(k), [self._seq(r) for r in k.running], k.ratio,
                               self.d.prefill_chunk_tokens, self._page, self.w.ignore_eos)
        batch: list[tuple[Request, int]] = []
        for r in k.prefilling:
            batch.append((r, budget.add_chunked(self._seq(r), r.target - r.prefilled)))
        if k.batch_is_full or not k.waiting:
            return batch
        for r in k.waiting:
            if len(k.running) + len(batch) >= self.plan.max_running:
                k.batch_is_full = True
                break
            n, res = budget.add_new(self._seq(r), r.target)
            if n:
                batch.append((r, n))
            if res != AddResult.CONTINUE:
                if res == AddResult.NO_TOKEN:
                    k.batch_is_full = True
                break
        for r, _n in batch[len(k.prefilling):]:
            k.waiting.remove(r)
            if math.isnan(r.admitted):
                r.admitted = self.env.now
            k.prefilling.append(r)
        return batch

    def scheduler(self):
        env = self.env
        while True:
            if self.pd:
                for k in self.ranks:
                    self._admit_pd(k)
                if self.pending_copy_s > 0:  # KV offloads / reloads of retracted requests: the ranks wait
                    for k in self.ranks:
                        if k.running:
                            k.gap_carry += self.pending_copy_s
                    yield env.timeout(self.pending_copy_s)
                    self.pending_copy_s = 0.0
                batches = {}
            else:
                batches = {id(k): self._prefill_batch(k) for k in self.ranks}
                for k in self.ranks:  # a chunk that cannot get its pages waits (SGLang: "Prefill out of memory")
                    kept = [(r, n) for r, n in batches[id(k)] if self._alloc_prefill(k, r, n)]
                    batches[id(k)] = kept
            if any(batches.values()):
                yield from self._mixed_pass(batches)
                continue
            if any(k.running for k in self.ranks):
                yield from self._decode_block()
                continue
            if not self.pd and any(k.prefilling or k.waiting for k in self.ranks):
                raise HisparseError(f"{self.sc.files}: the scheduler is stuck: requests wait but none can be "
                                    "prefilled and none runs (the pool cannot hold the next prompt chunk)")
            self.wake = env.event()
            yield self.wake

    def _decode_check(self, k: _Rank) -> None:
        """``update_running_batch`` before a decode pass: ``check_decode_mem``, and on failure
        ``retract_decode``; else the ratio decays one step (``_decode_block`` decays the rest)."""
        if not k.running:
            return
        if self._pages_needed(k.running) <= self._available(k):
            return
        seqs = [self._seq(r) for r in k.running]
        order = retract_order(seqs)
        kept = list(k.running)
        for i in order:
            if len(kept) == 1:
                break
            r = k.running[i]
            kept.remove(r)
            self._retract(k, r)
            if self._pages_needed(kept) <= self._available(k):
                break
        k.running = kept
        k.ratio = ratio_after_retract([self._seq(r) for r in kept])
        k.batch_is_full = False
        if self._pages_needed(kept) > self._available(k):
            raise HisparseError(f"{self.sc.files}: out of KV memory with one request left (SGLang aborts it: "
                                "'Out of memory even after retracting all other requests')")

    def _pages_needed(self, reqs: list[Request]) -> int:
        """Tokens the next decode step allocates: a page for each request whose next KV position opens one."""
        return self._page * sum(1 for r in reqs if (r.input_tokens + r.generated - 1) % self._page == 0)

    def _retract(self, k: _Rank, r: Request) -> None:
        """``release_req``: free the request's slots (HiSparse: ``retract_req`` frees its buffer and
        host slots); colocated, it waits at the end of the queue to prefill its prompt and output so
        far; pd-decode, its KV is offloaded to host memory and it waits in the retracted queue."""
        self._release(k, r)
        r.retractions += 1
        self.retractions += 1
        if self.pd:
            if self.hs is None:  # offload_kv_cache: the request's rows over the host link
                self.pending_copy_s += self.cost.kv_copy_time(r.input_tokens + r.generated - 1)
            k.retracted.append(r)
            return
        r.prefilled = 0
        r.target = r.input_tokens + r.generated
        self.reprefill_tokens += r.target
        k.waiting.append(r)

    def _mixed_pass(self, batches: dict[int, list[tuple[Request, int]]]):
        """One forward pass in which some ranks run an extend batch (no CUDA graph) and the others a
        decode step of their running requests: each rank's attention side, the slowest one setting
        the pace, then the MLP and collectives over every rank's tokens."""
        works, decoding = [], []
        for k in self.ranks:
            batch = batches.get(id(k), [])
            if batch:
                works.append(RankWork(chunks=tuple((n, r.prefilled) for r, n in batch)))
            elif k.running:
                self._decode_check(k)
                b = len(k.running)
                ctx = float(sum(q.input_tokens + q.generated for q in k.running))
                missed = None
                if self.hs is not None:
                    share = sum(float(self._step_misses(q, 1)[0]) for q in k.running)
                    missed = share * self.hs.top_k * self.m.layers
                    self.miss_rows += share
                    self.looked_up += b
                works.append(RankWork(b, ctx, missed))
                decoding.append(k)
            else:
                works.append(RankWork())
        t = float(self.cost.pass_time(Pass(tuple(works), self.hs is not None)).total_s[0])
        for k in self.ranks:
            self.busy_running_time += t * len(k.running)
            if batches.get(id(k)) and k.running:
                k.gap_carry += t
        yield self.env.timeout(t)
        done_tokens = 0.0
        for k in decoding:
            gaps = np.array([t + k.gap_carry])
            k.gap_carry = 0.0
            self.itl.append(gaps)
            self.itl_weight.append(np.full(1, len(k.running), dtype=float))
            done_tokens += len(k.running)
            self._advance(k, 1)
            k.ratio = self.ratios.after_steps(k.ratio, 1)
        if done_tokens:
            self.blocks.append((self.env.now - t, self.env.now, done_tokens))
        for k in self.ranks:
            for r, n in batches.get(id(k), []):
                r.prefilled += n
                self.prefill_tokens += n
                if r.prefilled < r.target:
                    # get_next_batch_to_run filters the chunked request out of the last extend batch;
                    # the smaller batch clears running_batch.batch_is_full
                    k.batch_is_full = False
                    continue
                k.prefilling.remove(r)
                if math.isnan(r.first_token):
                    r.first_token = self.env.now
                r.generated += 1
                self._after_prefill(k, r)
                if r.generated >= r.output_tokens:
                    self._finish(k, r)
                else:
                    k.running.append(r)
        self._note_running()

    def _after_prefill(self, k: _Rank, r: Request) -> None:
        """Colocated HiSparse: once the prompt is on the host its device pages shrink to the hot
        buffer (``alloc_device_buffer``: min(ceil_page(length), device_buffer_size), plus the
        reserved page when it reaches device_buffer_size)."""
        if self.hs is None:
            return
        r.buffer_since = r.generated - 1  # the buffer holds the prompt's first positions: trace step 0
        dbs = self.hs.device_buffer_size
        keep = min(ceil_page(r.target, self._page), dbs)
        if keep == dbs:
            keep = self.plan.buffer_slots
        keep = min(keep, r.slots_device) if keep != self.plan.buffer_slots else keep
        k.free_device += r.slots_device - keep
        r.slots_device = keep

    def _note_running(self) -> None:
        self.peak_running = max(self.peak_running, sum(len(k.running) for k in self.ranks))

    def _step_misses(self, r: Request, n: int) -> np.ndarray:
        """Top-k share missed by request r over its next n decode steps: its trace from the step its
        hot buffer was set up (first admission, or again after a retraction: SGLang resets a
        retracted request's buffer and LRU)."""
        first = r.generated - 1 - r.buffer_since  # decode steps since the buffer was set up
        shares = self.profiles.shares_from(r.profile, first, n).astype(float)
        if self.pd and first == 0:
            shares[0] = 1.0  # the buffer starts empty: every entry of every layer misses
        ctx = r.input_tokens + r.generated + np.arange(n)
        return np.where(ctx <= self.hs.device_buffer_size, 0.0, shares)  # fast path: the whole context fits

    def _room_steps(self, k: _Rank, n: int) -> int:
        """Decode steps the rank's free slots allow before ``check_decode_mem`` fails (<= n)."""
        counts = np.zeros(n, dtype=np.int64)
        for r in k.running:
            counts[(-(r.input_tokens + r.generated - 1)) % self._page::self._page] += 1
        need = np.cumsum(counts) * self._page
        return int(np.searchsorted(need, self._available(k), side="right"))

    def _steps_to_admit(self, k: _Rank, n: int) -> int | None:
        """Under HiSparse SGLang clears ``batch_is_full`` every round, so the first waiting request
        is tried again after every decode step: the fewest of the next ``n`` steps after which this
        rank's ``PrefillBudget`` would take it (None: not within ``n``). Waiting only makes it easier
        (the running requests' remaining outputs and ``new_token_ratio`` shrink; decode takes no
        device slots, only logical ones), so that step is found by bisection."""
        if not k.waiting or k.prefilling or len(k.running) >= self.plan.max_running:
            return None
        r = k.waiting[0]
        firsts = [q.input_tokens + q.generated - 1 for q in k.running]

        def admits(steps: int) -> bool:
            opened = sum(self._pages_opened(f, steps) for f in firsts)
            available = min(k.free_device, k.free_host - opened)
            running = [Seq(q.output_tokens, q.generated + steps, q.input_tokens) for q in k.running]
            budget = PrefillBudget(available, running, self.ratios.after_steps(k.ratio, steps),
                                   self.d.prefill_chunk_tokens, self._page, self.w.ignore_eos)
            return budget.add_new(self._seq(r), r.target)[0] > 0

        if not admits(n):
            return None
        lo, hi = 0, n  # admits(hi); lo: not known to admit (this round's try failed)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if admits(mid) else (mid, hi)
        return hi

    def _decode_block(self):
        """Decode steps on every rank until the next request finishes (the batches are fixed until
        then), a rank's next step would fail SGLang's decode memory check, or a request arrives
        (cut after the step in flight). Each step is costed on its own: the slowest rank's attention
        side (CUDA graphs: every rank padded to the largest batch's captured size, SGLang's MAX_LEN
        mode), the MLP over every rank's tokens, the collectives."""
        env, c = self.env, self.cost
        for k in self.ranks:
            self._decode_check(k)
        if not self.pd and any(k.waiting and not k.batch_is_full for k in self.ranks):
            n_limit = 1  # a retraction freed room: the next round may admit
        else:
            n_limit = None
        active = [k for k in self.ranks if k.running]
        n = min(r.output_tokens - r.generated for k in active for r in k.running)
        if n_limit:
            n = min(n, n_limit)
        n = max(1, min([n] + [max(1, self._room_steps(k, n)) for k in active]))
        if self.hs is not None and not self.pd:  # batch_is_full is cleared every round: retried each step
            n = min([n] + [s for k in active if (s := self._steps_to_admit(k, n)) is not None])
        works, shares = [], []
        for k in self.ranks:
            b = len(k.running)
            if not b:
                works.append(RankWork())
                continue
            ctx = sum(r.input_tokens + r.generated for r in k.running) + b * np.arange(n)
            missed = None
            if self.hs is not None:
                share = np.zeros(n)
                for r in k.running:
                    share += self._step_misses(r, n)
                shares.append((b, share))
                missed = share * self.hs.top_k * self.m.layers
            works.append(RankWork(b, ctx, missed))
        tokens = float(sum(w.decode for w in works))
        step = c.pass_time(Pass(tuple(works), self.hs is not None, n))
        step_s, swap, comm = step.total_s, step.swap_s, step.comm_s
        cum = np.cumsum(step_s)
        start = env.now
        if self.wake.triggered:
            self.wake = env.event()
        done = env.timeout(float(cum[-1]))
        yield done | self.wake
        steps = n
        if not done.processed:
            # a request arrived: finish the step in flight, then let the schedulers admit it
            elapsed = env.now - start
            steps = min(n, int(np.searchsorted(cum, elapsed, side="right")) + 1)
            yield env.timeout(max(0.0, float(cum[steps - 1]) - elapsed))
        spent = float(cum[steps - 1])
        self.decode_time += spent
        self.swap_time += float(swap[:steps].sum())
        self.comm_time += float(comm[:steps].sum())
        self.steps += steps
        self.blocks.append((start, start + spent, tokens * steps))
        for b, share in shares:
            self.miss_rows += float(share[:steps].sum())
            self.looked_up += b * steps
        for k in self.ranks:
            self.busy_running_time += spent * len(k.running)
        self._note_running()
        for k in active:
            gaps = np.array(step_s[:steps], dtype=float)
            gaps[0] += k.gap_carry
            k.gap_carry = 0.0
            self.itl.append(gaps)
            self.itl_weight.append(np.full(steps, len(k.running), dtype=float))
            self._advance(k, steps)
            k.ratio = self.ratios.after_steps(k.ratio, steps)

    def _advance(self, k: _Rank, steps: int) -> None:
        """``steps`` decode steps of every running request: the KV of each step's input token takes
        a new page whenever it opens one (logical ids only under HiSparse)."""
        still = []
        for r in k.running:
            first = r.input_tokens + r.generated - 1  # KV position the first of these steps writes
            pages = self._pages_opened(first, steps)
            if self.hs is None:
                k.free_device -= pages
                r.slots_device += pages
            else:
                k.free_host -= pages
                r.slots_host += pages
            r.generated += steps
        self._note_peaks(k)  # before the finished requests free their slots
        for r in k.running:
            if r.generated >= r.output_tokens:
                self._finish(k, r)
            else:
                still.append(r)
        k.running = still

    def _finish(self, k: _Rank, r: Request) -> None:
        r.finish = self.env.now
        self._release(k, r)
        k.batch_is_full = False
        self.finished.append(r)
        r.done.succeed()

    # -- a run -----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        env = self.env
        env.process(self.scheduler())
        if not self.open_loop:
            for _ in range(self.clients):
                env.process(self.closed_client(self.w.requests_per_client))
            total = self.clients * self.w.requests_per_client
        else:
            total = self.w.requests_per_client * 16 * len(self.ranks)
            env.process(self.open_arrivals(self.rate / self.d.instances, total))
        while len(self.finished) < total:
            if not env.peek() < float("inf"):
                break
            env.step()
        return self._result()

    def _steady(self, makespan: float, out_tokens: float) -> tuple[float, float]:
        """(output tokens/s of the instance, window length) while the running set is steady: from
        the first finish (the instance has filled) to the last arrival (the drain starts). Without
        such a window (a single wave), the makespan figure."""
        done = self.finished
        if not done:
            return 0.0, 0.0
        t0 = min(r.finish for r in done)
        t1 = self.last_arrival
        if t1 - t0 < 0.05 * makespan:
            return (out_tokens / makespan if makespan > 0 else 0.0), 0.0
        tokens = 0.0
        for s, e, n in self.blocks:
            if e <= t0 or s >= t1 or e <= s:
                continue
            tokens += n * (min(e, t1) - max(s, t0)) / (e - s)
        return tokens / (t1 - t0), t1 - t0

    def _result(self) -> RunResult:
        done = self.finished
        start = min((r.arrival for r in done), default=0.0)
        makespan = max((r.finish for r in done), default=0.0) - start
        out_tokens = float(sum(r.output_tokens for r in done))
        steady, window = self._steady(makespan, out_tokens)
        tpot = np.array([(r.finish - r.first_token) / (r.output_tokens - 1) for r in done if r.output_tokens > 1])
        ttft = np.array([r.first_token - r.arrival for r in done])
        gaps = np.concatenate(self.itl) if self.itl else np.array([])
        weights = np.concatenate(self.itl_weight) if self.itl_weight else np.array([])
        served = len(done) / makespan * self.scale if makespan > 0 else 0.0
        gb = 1e9
        plan = self.plan
        return RunResult(
            system=self.system.value, concurrency=self.concurrency, rate_per_s=self.rate,
            steady_tok_s_deployment=steady * self.scale,
            steady_tok_s_per_gpu=steady * self.scale / self.d.gpus,
            makespan_tok_s_deployment=out_tokens / makespan * self.scale if makespan > 0 else 0.0,
            steady_window_s=window,
            tpot_p50_ms=_pct(tpot, 50) * 1e3, tpot_p99_ms=_pct(tpot, 99) * 1e3,
            itl_p50_ms=_wpct(gaps, weights, 50) * 1e3, itl_p99_ms=_wpct(gaps, weights, 99) * 1e3,
            ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99),
            running_deployment=self.busy_running_time / makespan * self.scale if makespan > 0 else 0.0,
            max_running_deployment=int(min(plan.max_running, self._memory_limit()) * self.d.ranks),
            served_req_s_deployment=served, overloaded=self._overloaded(),
            hbm_static_gb_per_gpu=plan.static_bytes / gb,
            kv_used_gb_per_gpu=plan.device_bytes(self.peak_device) / gb,
            host_used_gb_per_gpu=plan.host_bytes(self.peak_host) / gb,
            step_ms_mean=self.decode_time / self.steps * 1e3 if self.steps else math.nan,
            swap_share=self.swap_time / self.decode_time if self.decode_time else 0.0,
            comm_share=self.comm_time / self.decode_time if self.decode_time else 0.0,
            miss_share=self.miss_rows / self.looked_up if self.looked_up else 0.0,
            requests=len(done), sim_time_s=makespan,
            retractions=int(round(self.retractions * self.scale)), reprefill_tokens=self.reprefill_tokens * self.scale,
            peak_running_deployment=int(round(self.peak_running * self.scale)))

    def _overloaded(self) -> bool:
        """Offered load beyond what the deployment serves: arrivals faster than completions (open
        loop), or more clients than requests it runs at once (closed loop: the rest wait to start)."""
        if self.open_loop:  # a stable queue stays short; an overloaded one grows with every arrival
            return self.queue_at_last_arrival > max(2, 0.1 * len(self.finished))
        return bool(self.concurrency > min(self.plan.max_running, self._memory_limit()) * self.d.ranks)

    def _memory_limit(self) -> int:
        """Requests of the nominal lengths one scheduler runs at once: those it admits in one wave from
        empty (SGLang's admission arithmetic, each admitted request holding its prompt's pages and
        one output token); under HiSparse the steady state's (below), at least as many;
        pd-decode: whole contexts that fit its pools."""
        w, page = self.w, self._page
        if self.pd:
            fp = self.plan.footprint(w.input_tokens, w.output_tokens, prefilling=False, prefill_on_device=False)
            by_device = self.plan.pool_tokens // max(ceil_page(fp.device, page), 1)
            by_host = self.plan.host_tokens // max(ceil_page(fp.host, page), 1) if fp.host else by_device
            return int(min(by_device, by_host))
        dev, log, running = self.plan.pool_tokens, self.plan.host_tokens, []
        prompt = ceil_page(w.input_tokens, page)
        # device slots an admitted request keeps (HiSparse: its hot buffer once the prompt is staged)
        held = prompt if self.hs is None else (
            min(prompt, self.plan.buffer_slots) if prompt < self.hs.device_buffer_size else self.plan.buffer_slots)
        for _ in range(self.plan.max_running):
            avail = dev if self.hs is None else min(dev, log)
            budget = PrefillBudget(avail, running, self.ratios.init, 1 << 62, page, w.ignore_eos)
            took, _ = budget.add_new(Seq(w.output_tokens, 0, w.input_tokens), w.input_tokens)
            if not took:
                break
            running.append(Seq(w.output_tokens, 1, w.input_tokens))
            dev -= held
            if self.hs is not None:
                log -= prompt
        first_wave = len(running)
        if self.hs is None:
            return first_wave
        # HiSparse clears batch_is_full every round, so admission is retried each step and the running
        # set grows as the requests' finishes spread out: in steady state the look-ahead sees outputs
        # evenly staggered, and only the request nearest its end binds (each finish is credited its
        # whole context, though it frees only a hot buffer of device slots)
        m = first_wave
        while m < self.plan.max_running:
            gen = [w.output_tokens * j // m for j in range(m)]  # m running, evenly staggered
            stag = [Seq(w.output_tokens, max(1, g), w.input_tokens) for g in gen]
            avail = min(self.plan.pool_tokens - m * held,
                        self.plan.host_tokens - sum(ceil_page(w.input_tokens + g, page) for g in gen))
            budget = PrefillBudget(avail, stag, self.ratios.min, 1 << 62, page, w.ignore_eos)
            if not budget.add_new(Seq(w.output_tokens, 0, w.input_tokens), w.input_tokens)[0]:
                break
            m += 1
        return m


RankSim = InstanceSim  # the name issue 13 gave it (it simulated one representative rank then)


def prefill_tok_s(scenario: Scenario) -> float:
    """Input tokens/s the prefill side delivers to a pd-decode deployment: the deployment's
    ``prefill_tok_s``, or when that is 0 the cost model's rate for a prefill instance like this one
    (same GPUs and layout, every rank prefilling requests of the workload's input length)."""
    d = scenario.deployment
    if d.prefill_tok_s > 0:
        return d.prefill_tok_s
    cost = CostModel(scenario.model, scenario.gpu, d, scenario.params, scenario.terms)
    n_in, t, done = scenario.workload.input_tokens, 0.0, 0
    while done < n_in:
        n = min(d.prefill_chunk_tokens, n_in - done)
        t += float(cost.pass_time(Pass((RankWork(chunks=((n, done),)),) * d.ranks_per_instance)).total_s[0])
        done += n
    return n_in / t * d.ranks


def _max_len(n: int, jitter: float) -> int:
    return max(1, round(n * (1 + jitter)))


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else math.nan


def _wpct(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Weighted percentile (each step's gap counted once per request that waited for it)."""
    if not values.size:
        return math.nan
    order = np.argsort(values)
    cw = np.cumsum(weights[order])
    return float(values[order][min(int(np.searchsorted(cw, q / 100 * cw[-1])), values.size - 1)])


def simulate(scenario: Scenario, system: System | str, *, concurrency: int = 0, rate_per_s: float = 0.0,
             profiles: MissProfiles | None = None, seed: int = 0) -> RunResult:
    return InstanceSim(scenario, system, concurrency=concurrency, rate_per_s=rate_per_s, profiles=profiles, seed=seed).run()

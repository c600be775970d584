"""The SimPy serving model: one instance of a deployment, its schedulers in lockstep.

Under DP attention an instance's ``dp`` schedulers (SGLang's DP ranks) each admit and batch their own
requests, but every forward pass is collective: before each one the ranks exchange their token
counts and forward modes (``managers/scheduler_dp_attn_mixin.py``, ``prepare_mlp_sync_batch_raw``; a
rank with nothing to do runs an idle batch), the MLP runs on every rank's tokens gathered together,
and CUDA graphs replay only when every rank decodes. So a pass lasts as long as its slowest rank's
attention side plus the instance-wide MLP and collectives, and a prompt chunk on one rank stalls the
decode of all the others for that pass (they decode one step inside it, or, with speculative decoding,
run an idle batch: ``InstanceSim._spec_unmixed``; SGLang's
``--enable-prefill-delayer``, off by default and not among the blog's flags, would hold a rank's
prefill for up to 30 passes so that ranks prefill together: not modelled). The model simulates every
scheduler of one instance explicitly (requests dispatched round robin, SGLang's default
``load_balance_method``, each once the instance's TokenizerManager has tokenized its text, one prompt
at a time: ``frontend.py``; a burst reaches the ranks at that pace) and scales the instance's figures
to the deployment; TP attention has one scheduler per instance. Instances are identical and independent.

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

import numpy as np
import simpy

from ..costmodel import CostModel, Pass, RankWork
from ..errors import HisparseError
from .admission import RatioSchedule, ceil_page
from .cluster import kv_transfer
from .decode_manager import DecodeManager
from .frontend import tokenize_seconds
from .memory import MemoryPlan, check_fits, plan_memory
from .misses import MissProfiles
from .pd_admission import DecodePreallocQueue
from .pool import RankPool
from .prefill_adder import PrefillAdder
from .residency import ResidencyManager, residency_policy
from .results import RunResult, mean, pct, steady_rate, wmean, wpct
from .scenario import Scenario
from .specs import Attention, Mode
from .state import Rank, Request, System
from .swap_designs import swap_in_extra_us

__all__ = ["InstanceSim", "RankSim", "Request", "RunResult", "System", "prefill_tok_s", "simulate"]


class InstanceSim:
    """One instance serving ``system`` at one load point (every scheduler of it simulated). The
    parts: each scheduler's ``Rank`` (queues, ``RankPool``), admission (``PrefillAdder`` colocated,
    ``DecodePreallocQueue`` PD decode), ``DecodeManager`` (memory check, retraction, misses); this
    class runs the loop, prices each pass with ``CostModel.pass_time`` and keeps the figures."""

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
        self.spec = scenario.speculative  # speculative decoding (serving/speculative.py), or None
        self.cost = CostModel(m, scenario.gpu, d, scenario.params, scenario.terms, spec=self.spec,
                              cluster=scenario.cluster,
                              prefetch=self.hs is not None and self.hs.prefetch,
                              swap_in_extra_us=swap_in_extra_us(self.hs))
        self._draws: dict[int, np.ndarray] = {}  # per rank: accept lengths drawn, not yet used
        self.concurrency = 0 if self.open_loop else concurrency
        self.rate = rate_per_s
        self.clients = 1 if self.open_loop else max(1, math.ceil(concurrency / d.instances))
        self.scale = d.instances if self.open_loop else concurrency / self.clients
        self.rng = np.random.default_rng(seed)
        self.plan: MemoryPlan = plan_memory(m, scenario.gpu, d, self.hs, where=scenario.files, spec=self.spec)
        self.ratios = RatioSchedule(d.schedule_conservativeness, d.attention == Attention.DP)
        self.pd = d.mode == Mode.PD_DECODE
        self.env = simpy.Environment()
        self.wake = self.env.event()
        self.ranks = [Rank(self._new_pool(), self.ratios.init) for _ in range(d.ranks_per_instance)]
        clock = lambda: self.env.now  # noqa: E731
        self.adder = PrefillAdder(self.plan, d, w, self.ratios, self.hs, scenario.files, clock)
        self.prealloc = DecodePreallocQueue(self.plan, self.hs, d.page_size, self.cost.kv_copy_time, clock,
                                            self._finish)
        self.decode = DecodeManager(self.hs, profiles, self.pd, self.cost.kv_copy_time, scenario.files)
        if self.spec is not None:
            self.decode.ahead = self.spec.verify_tokens
            if self.hs is not None and self.spec.verify_tokens >= d.page_size:
                raise HisparseError(f"{scenario.files}: speculative decoding {self.spec.label} with HiSparse: the "
                                    f"{self.spec.verify_tokens} verify positions must fit the request's extra page "
                                    f"with its newest token (page_size {d.page_size}; SGLang PR #26445 refuses larger "
                                    "drafts)")
        self.res = self._residency()
        self.decode.res = self.res
        self.prealloc.make_room = self.res.reclaim if self.res else None
        self.prealloc.on_take = self.res.place if self.res else None
        n_in, n_out = _max_len(w.input_tokens, w.length_jitter), _max_len(w.output_tokens, w.length_jitter)
        check_fits(self.plan, n_in, n_out, d.mode, scenario.files)
        if not self.pd:
            self.adder.check_admissible(n_in, n_out, self.ranks[0].pool.empty_available())
        self.prefill_tokens = 0  # tokens run through prefill passes (first prefills and re-prefills)
        self.peak_running = 0
        self.finished: list[Request] = []
        self.busy_running_time = 0.0  # running requests x time, all ranks
        self.decode_time = self.swap_time = self.comm_time = 0.0  # instance time in decode passes
        # passes in which some rank runs a prompt chunk: instance time, count, ranks extending summed
        self.extend_time, self.extend_passes, self.extending_ranks = 0.0, 0, 0
        self.miss_rows = self.looked_up = 0.0
        self.steps = 0
        self.blocks: list[tuple[float, float, float]] = []  # (start, end, tokens) of each decode pass or block
        self.itl: list[np.ndarray] = []  # inter-token gaps (s)
        self.itl_weight: list[np.ndarray] = []  # requests that saw each gap
        self.last_arrival = 0.0
        self.queue_at_last_arrival = 0
        self._rid = 0
        self._next_rank = 0
        # the prefill side: one server per scheduler (a prefill instance's DP ranks prefill in parallel);
        # seconds per input token with 1..ranks of them busy (prefill_seconds_per_token)
        self.prefill_s_per_token = prefill_seconds_per_token(scenario) if self.pd else ()
        self.prefill_side = simpy.Resource(self.env, capacity=d.ranks_per_instance) if self.pd else None
        # colocated: the instance's TokenizerManager, one text prompt at a time (frontend.py)
        self.tokenizer = None if self.pd or w.tokenize_prompt else simpy.Resource(self.env, capacity=1)
        self.transfers: list[tuple[float, float]] = []  # pd-decode: (whole, exposed) KV transfer seconds per request

    def _new_pool(self) -> RankPool:
        return RankPool(self.d.page_size, self.plan.pool_tokens, self.plan.host_tokens, self.hs is not None)

    def _residency(self) -> ResidencyManager | None:
        """The dynamic residency bookkeeping (``serving/residency.py``), or None for ``swap``."""
        if self.hs is None or not residency_policy(self.hs.residency).dynamic:
            return None
        m, g = self.m, self.sc.gpu
        res = ResidencyManager(residency_policy(self.hs.residency), self.d.page_size, self.plan.buffer_slots,
                               d2d_copy_s=lambda nbytes: 2.0 * nbytes / g.hbm_bw,  # read + write (hbm_bw: copy traffic)
                               d2h_copy_s=self.cost.kv_copy_time,
                               hot_bytes=float(self.plan.buffer_slots * m.layers * m.kv_row_bytes), pd=self.pd)
        for k in self.ranks:
            k.pool.reclaimable = (lambda k=k: res.rank_reclaimable(k))
        return res

    def _alloc_chunk(self, k: Rank, r: Request, n: int) -> bool:
        """A prompt chunk's pages; under dynamic residency, resident requests give slots back first."""
        if k.pool.alloc_prefill(r, n):
            return True
        if self.res is None:
            return False
        self.res.reclaim(k, k.pool.pages_opened(r.prefilled, n))
        return k.pool.alloc_prefill(r, n)

    def _residency_stall(self):
        """Demotion copies the ranks wait for (a synchronous reclaim) before the next pass."""
        if self.res is None or self.res.pending_s <= 0:
            return
        stall = self.res.pending_s
        self.res.pending_s = 0.0
        for k in self.ranks:
            if k.running:
                k.gap_carry += stall
        yield self.env.timeout(stall)

    def _swap_requests(self, k: Rank) -> int | None:
        """Requests of the rank's batch that run the swap-in (None: all, no dynamic residency)."""
        if self.res is None:
            return None
        return sum(1 for r in k.running if self.res.miss_scale(r) > 0 and r.context > self.hs.device_buffer_size)

    @property
    def retractions(self) -> int:
        return self.decode.retractions

    @property
    def reprefill_tokens(self) -> float:
        return self.decode.reprefill_tokens

    @property
    def peak_device(self) -> int:
        """The fullest rank's device slots in use."""
        return max(k.pool.peak_device for k in self.ranks)

    @property
    def peak_host(self) -> int:
        return max(k.pool.peak_host for k in self.ranks)

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
        """Into a scheduler's queue, round robin: once the TokenizerManager has tokenized it (colocated,
        text prompts: one request at a time, ``frontend.tokenize_seconds``), or after the prefill side
        (pd-decode; its first token is made there but reaches the client only when the decode side
        admits the request, ``DecodePreallocQueue.admit``)."""
        tokenize_s = tokenize_seconds(r.input_tokens) if self.tokenizer is not None else 0.0
        if tokenize_s > 0:
            with self.tokenizer.request() as slot:
                yield slot
                yield self.env.timeout(tokenize_s)
        if self.pd:
            prefill_s = 0.0
            if self.prefill_side is not None:
                with self.prefill_side.request() as slot:
                    yield slot
                    busy = self.prefill_side.count  # prompts prefilling now, this one included
                    prefill_s = r.input_tokens * self.prefill_s_per_token[busy - 1]
                    yield self.env.timeout(prefill_s)
            yield from self._transfer(r, prefill_s)
            r.prefilled = r.input_tokens
            r.generated = 1
        self.last_arrival = self.env.now
        rank = self.ranks[self._next_rank % len(self.ranks)]
        self._next_rank += 1
        wake = self._arrival_wakes(rank)
        rank.waiting.append(r)
        queued = sum(len(k.waiting) for k in self.ranks)
        queued += len(self.prefill_side.queue) if self.prefill_side is not None else 0
        self.queue_at_last_arrival = queued
        if wake and not self.wake.triggered:
            self.wake.succeed()

    def _arrival_wakes(self, rank: Rank) -> bool:
        """Whether an arrival at ``rank`` cuts the decode block in flight. Colocated, behind a waiting
        request it cannot change the next round's batches (the PrefillAdder stops at the first waiting
        request it cannot take, and a decode block runs only when no rank could take one), so the block
        runs on: the same schedule with fewer cuts, which paced arrivals into deep queues would make."""
        return self.pd or not rank.waiting

    def _transfer(self, r: Request, prefill_s: float):
        """pd-decode across nodes: the request's KV over RDMA to the decode host, what of it the prefill
        did not hide (``cluster.kv_transfer``; none without a cluster or with kv_transfer = "none")."""
        cl = self.sc.cluster
        if cl is None or self.d.kv_transfer.value == "none":
            return
        host = self.sc.gpu.link_bw if self.hs is not None else None  # HiSparse: straight into pinned host memory
        t = kv_transfer(self.m, r.input_tokens, prefill_s, self.d.kv_transfer, cl, host)
        self.transfers.append((t.total_s, t.exposed_s))
        if t.exposed_s > 0:
            yield self.env.timeout(t.exposed_s)

    def closed_client(self, n: int):
        for _ in range(n):
            r = self._new_request()
            yield from self._arrive(r)
            yield r.done

    def open_arrivals(self, rate: float, n: int):
        for _ in range(n):
            yield self.env.timeout(self.rng.exponential(1.0 / rate))
            self.env.process(self._arrive(self._new_request()))

    # -- the loop --------------------------------------------------------------------------------------
    def scheduler(self):
        env = self.env
        while True:
            if self.pd:
                for k in self.ranks:
                    self.decode.pending_copy_s += self.prealloc.admit(k)
                copy_s = self.decode.pending_copy_s
                if copy_s > 0:  # KV offloads / reloads of retracted requests: the ranks wait
                    for k in self.ranks:
                        if k.running:
                            k.gap_carry += copy_s
                    yield env.timeout(copy_s)
                    self.decode.pending_copy_s = 0.0
                yield from self._residency_stall()
                batches = {}
            else:
                batches = {id(k): self.adder.batch(k) for k in self.ranks}
                for k in self.ranks:  # a chunk that cannot get its pages waits (SGLang: "Prefill out of memory")
                    kept = [(r, n) for r, n in batches[id(k)] if self._alloc_chunk(k, r, n)]
                    batches[id(k)] = kept
            yield from self._residency_stall()
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

    @property
    def _spec_unmixed(self) -> bool:
        """Speculative decoding under DP attention: SGLang does not mix prefill and decode batches across the
        ranks (``Scheduler.get_next_batch_to_run``: "This branch makes sure prefill and decode batches will
        not be mixed when spec and dp-attn is enabled": when any rank has a prefill batch, the others get an
        idle batch from ``prepare_mlp_sync_batch``), so their running requests wait out the extend pass (PR #14201,
        the prefill delayer's origin: with MTP "its refill runs with every other rank idle")."""
        return self.spec is not None and self.d.attention == Attention.DP and len(self.ranks) > 1

    def _mixed_pass(self, batches: dict[int, list[tuple[Request, int]]]):
        """One forward pass in which some ranks run an extend batch (no CUDA graph) and the others a
        decode step of their running requests (idle under ``_spec_unmixed``): each rank's attention side,
        the slowest one setting the pace, then the MLP and collectives over every rank's tokens."""
        works, decoding = [], []
        unmixed = self._spec_unmixed
        for k in self.ranks:
            batch = batches.get(id(k), [])
            if batch:
                works.append(RankWork(chunks=tuple((n, r.prefilled) for r, n in batch)))
            elif k.running and not unmixed:
                self.decode.check(k)
                b = len(k.running)
                ctx = float(sum(q.input_tokens + q.generated for q in k.running))
                missed = None
                accept = int(self._accepts(k, 1)[0])
                if self.hs is not None:
                    share = sum(float(self.decode.step_misses(q, accept).sum()) for q in k.running)
                    missed = share * self.hs.top_k * self.m.hisparse_layers
                    self.miss_rows += share
                    self.looked_up += b
                works.append(RankWork(b, ctx, missed, swap_requests=self._swap_requests(k)))
                decoding.append(k)
            else:
                works.append(RankWork())
        t = float(self.cost.pass_time(Pass(tuple(works), self.hs is not None, drafts=self.spec is not None)).total_s[0])
        self.extend_time += t
        self.extend_passes += 1
        self.extending_ranks += sum(1 for k in self.ranks if batches.get(id(k)))
        for k in self.ranks:
            self.busy_running_time += t * len(k.running)
            if (batches.get(id(k)) or unmixed) and k.running:
                k.gap_carry += t
        yield self.env.timeout(t)
        done_tokens = 0.0
        for k in decoding:
            gaps = np.array([t + k.gap_carry])
            k.gap_carry = 0.0
            self.itl.append(gaps)
            self.itl_weight.append(np.full(1, len(k.running), dtype=float))
            accept = self._take(k, 1)
            done_tokens += sum(min(int(accept.sum()), q.output_tokens - q.generated) for q in k.running)
            self._advance(k, 1, accept)
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

    def _after_prefill(self, k: Rank, r: Request) -> None:
        """Colocated HiSparse: once the prompt is on the host its device pages shrink to the hot
        buffer (``alloc_device_buffer``: min(ceil_page(length), device_buffer_size), plus the
        reserved page when it reaches device_buffer_size)."""
        if self.hs is None:
            return
        r.buffer_since = r.generated - 1  # the buffer holds the prompt's first positions: trace step 0
        if self.res is not None:
            self.res.place(k, r)  # dynamic residency: the prompt's pages stay while the device pool allows
            if not r.hot:
                return
        dbs = self.hs.device_buffer_size
        keep = min(ceil_page(r.target, self.d.page_size), dbs)
        if keep == dbs:
            keep = self.plan.buffer_slots
        keep = min(keep, r.slots_device) if keep != self.plan.buffer_slots else keep
        k.pool.shrink_device(r, keep)

    def _note_running(self) -> None:
        self.peak_running = max(self.peak_running, sum(len(k.running) for k in self.ranks))

    def _decode_block(self):
        """Decode steps on every rank until the next request finishes (the batches are fixed until
        then), a rank's next step would fail SGLang's decode memory check, or a request arrives
        (cut after the step in flight). Each step is costed on its own: the slowest rank's attention
        side (CUDA graphs: every rank padded to the largest batch's captured size, SGLang's MAX_LEN
        mode), the MLP over every rank's tokens, the collectives."""
        env, c = self.env, self.cost
        for k in self.ranks:
            self.decode.check(k)
        if self.res is not None and self.res.pending_s > 0:
            yield from self._residency_stall()
        if not self.pd and any(k.waiting and not k.batch_is_full for k in self.ranks):
            n_limit = 1  # a retraction freed room: the next round may admit
        else:
            n_limit = None
        active = [k for k in self.ranks if k.running]
        left = min(r.output_tokens - r.generated for k in active for r in k.running)  # tokens to the first finish
        n = left
        if self.spec is not None:  # steps until the first request finishes, at each rank's accept lengths
            n = min(int(np.searchsorted(np.cumsum(self._accepts(k, left)), min(r.output_tokens - r.generated
                                                                                for r in k.running))) + 1
                    for k in active)
        if n_limit:
            n = min(n, n_limit)
        n = max(1, min([n] + [max(1, self._room(k, n)) for k in active]))
        if self.res is not None:  # resident requests' growth: the next block reclaims when the device fills
            n = max(1, min([n] + [max(1, self.res.room_steps(k, n)) for k in active]))
        if self.hs is not None and not self.pd:  # batch_is_full is cleared every round: retried each step
            n = min([n] + [s for k in active if (s := self.adder.steps_to_admit(k, n)) is not None])
        works, shares, accepted = [], [], []
        for k in self.ranks:
            b = len(k.running)
            if not b:
                works.append(RankWork())
                continue
            acc = self._accepts(k, n)  # tokens each of the n steps keeps (1 without speculative decoding)
            before = np.concatenate(([0], np.cumsum(acc)[:-1]))
            accepted.append(acc)
            ctx = sum(r.input_tokens + r.generated for r in k.running) + b * before
            missed = None
            if self.hs is not None:
                share = np.zeros(n)
                for r in k.running:
                    share += self._step_union(r, acc, before)
                shares.append((b, share))
                missed = share * self.hs.top_k * self.m.hisparse_layers
            works.append(RankWork(b, ctx, missed, swap_requests=self._swap_requests(k)))
        tokens = float(sum(w.decode for w in works))
        if self.spec is not None:
            q = self.spec.verify_tokens
            step = c.pass_time(Pass(tuple(works), self.hs is not None, n, verify=q,
                                    accepted=np.mean(accepted, axis=0), drafts=True))
        else:
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
        if self.spec is not None:  # tokens the steps kept: each rank's accept lengths, capped at each output
            tokens_done = 0.0
            for k in active:
                kept = int(self._draws[id(k)][:steps].sum())
                tokens_done += sum(min(kept, r.output_tokens - r.generated) for r in k.running)
        else:
            tokens_done = tokens * steps
        self.blocks.append((start, start + spent, tokens_done))
        for b, share in shares:
            self.miss_rows += float(share[:steps].sum())
            self.looked_up += b * steps
        for k in self.ranks:
            self.busy_running_time += spent * len(k.running)
        if self.res is not None:
            self.res.note_steps(start, self.ranks, steps)
        self._note_running()
        for k in active:
            gaps = np.array(step_s[:steps], dtype=float)
            gaps[0] += k.gap_carry
            k.gap_carry = 0.0
            self.itl.append(gaps)
            self.itl_weight.append(np.full(steps, len(k.running), dtype=float))
            self._advance(k, steps, self._take(k, steps) if self.spec is not None else None)
            k.ratio = self.ratios.after_steps(k.ratio, steps)

    # -- speculative decoding ------------------------------------------------------------------------
    def _accepts(self, k: Rank, n: int) -> np.ndarray:
        """Accept lengths of rank ``k``'s next ``n`` steps (drawn once, seeded, kept until used: one
        draw per verify call for the whole batch, as SGLANG_SIMULATE_ACC_LEN does); ones without
        speculative decoding."""
        if self.spec is None:
            return np.ones(n, dtype=np.int64)
        have = self._draws.get(id(k), np.zeros(0, dtype=np.int64))
        if len(have) < n:
            have = np.concatenate((have, self.spec.draw(self.rng, max(n - len(have), 64))))
            self._draws[id(k)] = have
        return have[:n]

    def _take(self, k: Rank, steps: int) -> np.ndarray:
        """The accept lengths of the ``steps`` steps just run, removed from the rank's draws."""
        acc = self._accepts(k, steps)
        if self.spec is not None:
            self._draws[id(k)] = self._draws[id(k)][steps:]
        return acc

    def _room(self, k: Rank, n: int) -> int:
        """Steps the free slots allow before ``check_decode_mem`` fails: tokens the pool holds,
        counted in the steps' accept lengths under speculative decoding."""
        if self.spec is None:
            return k.pool.room_steps(k.running, n)
        acc = self._accepts(k, n)
        tokens = k.pool.room_steps(k.running, int(acc.sum()))
        return int(np.searchsorted(np.cumsum(acc), tokens, side="right"))

    def _step_union(self, r: Request, acc: np.ndarray, before: np.ndarray) -> np.ndarray:
        """Top-k share request ``r`` misses at each step. Without speculative decoding, its trace's
        step by step. With it, a step verifies ``q`` positions at once and the replay committed q
        consecutive trace steps as one swap call (their union, deduped, into SGLang's CLOCK:
        ``misses.miss_profiles(mtp_steps=q)``), each unique miss counted at its first trace step; a
        step that keeps ``a`` tokens is charged the trace steps it moves over, so a request's charged
        misses are the commits' unique misses."""
        total = int(acc.sum())
        per = self.decode.step_misses(r, total)
        if self.spec is None:
            return per
        return np.add.reduceat(per, before.astype(np.int64))

    def _advance(self, k: Rank, steps: int, accepted: np.ndarray | None = None) -> None:
        """``steps`` decode steps of every running request (each takes its decode pages); under
        speculative decoding each step keeps its accept length of tokens (at most the output left)."""
        for r in k.running:
            n = steps if accepted is None else min(int(accepted.sum()), r.output_tokens - r.generated)
            k.pool.grow(r, n)
            if self.res is not None:
                self.res.grow(k, r, n)
            r.generated += n
        k.pool.note_peaks()  # before the finished requests free their slots
        still = []
        for r in k.running:
            if r.generated >= r.output_tokens:
                self._finish(k, r)
            else:
                still.append(r)
        k.running = still

    def _finish(self, k: Rank, r: Request) -> None:
        r.finish = self.env.now
        k.pool.release(r)
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
        return steady_rate(self.blocks, t0, t1), t1 - t0

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
        itl50, itl99 = wpct(gaps, weights, 50, 99)
        served = len(done) / makespan * self.scale if makespan > 0 else 0.0
        gb = 1e9
        plan = self.plan
        return RunResult(
            system=self.system.value, concurrency=self.concurrency, rate_per_s=self.rate,
            steady_tok_s_deployment=steady * self.scale,
            steady_tok_s_per_gpu=steady * self.scale / self.d.gpus,
            makespan_tok_s_deployment=out_tokens / makespan * self.scale if makespan > 0 else 0.0,
            steady_window_s=window,
            tpot_p50_ms=pct(tpot, 50) * 1e3, tpot_p99_ms=pct(tpot, 99) * 1e3,
            itl_p50_ms=itl50 * 1e3, itl_p99_ms=itl99 * 1e3,
            ttft_p50_s=pct(ttft, 50), ttft_p99_s=pct(ttft, 99),
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
            peak_running_deployment=int(round(self.peak_running * self.scale)),
            tpot_mean_ms=mean(tpot) * 1e3, itl_mean_ms=wmean(gaps, weights) * 1e3, ttft_mean_s=mean(ttft),
            total_tok_s_per_gpu=(out_tokens + sum(r.input_tokens for r in done)) / makespan * self.scale / self.d.gpus
            if makespan > 0 else 0.0, gpus=self.d.gpus,
            extend_pass_share=min(1.0, self.extend_time / makespan) if makespan > 0 else 0.0,
            extending_ranks_mean=self.extending_ranks / self.extend_passes if self.extend_passes else 0.0,
            **self._residency_figures(), **self._transfer_figures())

    def _residency_figures(self) -> dict:
        if self.hs is None:
            return {}
        res = self.res
        if res is None:
            return {"residency": self.hs.residency}
        return {"residency": self.hs.residency, "resident_share": res.resident_share,
                "demotions": int(round(res.demotions * self.scale)),
                "demoted_tokens": res.spilled_tokens * self.scale,
                "demotion_copy_ms": res.copy_s * 1e3}

    def _transfer_figures(self) -> dict:
        if not self.transfers:
            return {}
        raw = np.array([t[0] for t in self.transfers])
        exposed = np.array([t[1] for t in self.transfers])
        return {"kv_transfer_ms": float(raw.mean()) * 1e3, "kv_transfer_exposed_ms": float(exposed.mean()) * 1e3}

    def _overloaded(self) -> bool:
        """Offered load beyond what the deployment serves: arrivals faster than completions (open
        loop), or more clients than requests it runs at once (closed loop: the rest wait to start)."""
        if self.open_loop:  # a stable queue stays short; an overloaded one grows with every arrival
            return self.queue_at_last_arrival > max(2, 0.1 * len(self.finished))
        return bool(self.concurrency > min(self.plan.max_running, self._memory_limit()) * self.d.ranks)

    def _memory_limit(self) -> int:
        """Requests of the nominal lengths one scheduler runs at once (its admission's estimate)."""
        if self.pd:
            return self.prealloc.running_limit(self.w.input_tokens, self.w.output_tokens)
        return self.adder.running_limit()


RankSim = InstanceSim  # the name issue 13 gave it (it simulated one representative rank then)


def prefill_seconds_per_token(scenario: Scenario) -> tuple[float, ...]:
    """Seconds per input token of one prompt on the prefill side while ``m`` prompts prefill at once
    (index ``m - 1``, m = 1..ranks per instance): a given ``prefill_tok_s`` is the deployment's rate
    shared by its ranks; a derived one prices the workload's prompt, chunk by chunk, on a prefill
    instance of this layout with ``m`` ranks prefilling and the others idle (DP attention: a prompt
    runs on one rank; the MoE and collectives cover the tokens of every busy rank). The count is
    taken when a prompt starts (a prompt started alone keeps its solo pace)."""
    d = scenario.deployment
    ranks = d.ranks_per_instance
    if d.prefill_tok_s > 0:
        return tuple(d.ranks / d.prefill_tok_s for _ in range(ranks))
    side = d.prefill_gpus / d.gpus if d.prefill_gpus else 1.0  # a prefill side of another size (prefill_tok_s's rule)
    cost = scenario.cost_model(deployment=d)
    n_in = scenario.workload.input_tokens
    out = []
    for m in range(1, ranks + 1):
        t, done = 0.0, 0
        while done < n_in:
            n = min(d.prefill_chunk_tokens, n_in - done)
            works = tuple(RankWork(chunks=((n, done),)) if i < m else RankWork() for i in range(ranks))
            t += float(cost.pass_time(Pass(works)).total_s[0])
            done += n
        out.append(t / n_in / side)
    return tuple(out)


def prefill_tok_s(scenario: Scenario) -> float:
    """Input tokens/s the prefill side delivers to a pd-decode deployment: the deployment's
    ``prefill_tok_s``, or when that is 0 the cost model's rate for a prefill instance like this one
    (same GPUs and layout, every rank prefilling requests of the workload's input length)."""
    d = scenario.deployment
    if d.prefill_tok_s > 0:
        return d.prefill_tok_s
    side = d.prefill_gpus / d.gpus if d.prefill_gpus else 1.0  # a prefill side of another size: as many more ranks
    cost = scenario.cost_model(deployment=d)
    n_in, t, done = scenario.workload.input_tokens, 0.0, 0
    while done < n_in:
        n = min(d.prefill_chunk_tokens, n_in - done)
        t += float(cost.pass_time(Pass((RankWork(chunks=((n, done),)),) * d.ranks_per_instance)).total_s[0])
        done += n
    return n_in / t * d.ranks * side


def _max_len(n: int, jitter: float) -> int:
    return max(1, round(n * (1 + jitter)))


def simulate(scenario: Scenario, system: System | str, *, concurrency: int = 0, rate_per_s: float = 0.0,
             profiles: MissProfiles | None = None, seed: int = 0) -> RunResult:
    return InstanceSim(scenario, system, concurrency=concurrency, rate_per_s=rate_per_s, profiles=profiles, seed=seed).run()

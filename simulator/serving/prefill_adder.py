"""Colocated admission: which waiting requests a scheduler prefills this round.

SGLang's ``Scheduler.get_new_batch_prefill`` with its ``PrefillAdder`` arithmetic (``admission.py``):
the request mid-prefill's next chunk first, then waiting requests in FIFO order while the chunk
budget, the running-request cap and the token budget allow. A NO_TOKEN answer sets
``batch_is_full``, which stops admission until a running request leaves or the chunked request
continues; under HiSparse ``get_next_batch_to_run`` clears it every round, so admission is retried
after every decode step (``steps_to_admit``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..errors import HisparseError
from .admission import AddResult, PrefillBudget, RatioSchedule, Seq, ceil_page
from .memory import MemoryPlan
from .specs import DeploymentSpec, HiSparseSpec, WorkloadSpec
from .state import Rank, Request


class PrefillAdder:
    def __init__(self, plan: MemoryPlan, dep: DeploymentSpec, workload: WorkloadSpec, ratios: RatioSchedule,
                 hisparse: HiSparseSpec | None, files: str, clock: Callable[[], float]) -> None:
        self.plan, self.d, self.w, self.ratios, self.hs = plan, dep, workload, ratios, hisparse
        self.files, self.clock = files, clock
        self.page = dep.page_size

    def _budget(self, available: int, running: list[Seq], ratio: float, chunk: int | None = None) -> PrefillBudget:
        return PrefillBudget(available, running, ratio, self.d.prefill_chunk_tokens if chunk is None else chunk,
                             self.page, self.exact)

    @property
    def exact(self) -> bool:
        """SGLang's ``add_one_req`` takes the exact ignore_eos look-ahead only when the tree cache is off
        (``getattr(self.tree_cache, "disable", True)``: ChunkCache under ``--disable-radix-cache``, which
        HiSparse requires); with the radix cache on, ignore_eos requests go through the estimate."""
        return self.w.ignore_eos and (not self.d.radix_cache or self.hs is not None)

    def check_admissible(self, n_in: int, n_out: int, empty_available: int) -> None:
        """A request SGLang's PrefillAdder refuses even on an empty scheduler can never run: the
        user's error, named with the files."""
        took, _ = self._budget(empty_available, [], self.ratios.init).add_new(Seq(n_out, 0, n_in), n_in)
        if not took:
            rule = ("prompt + all output tokens (PrefillAdder.add_one_req_ignore_eos)" if self.exact else
                    "prompt + min(output, 4096) + a page (PrefillAdder.add_one_req)")
            raise HisparseError(
                f"{self.files}: SGLang never admits a request of {n_in} + {n_out} tokens: its {rule} exceed "
                f"the {empty_available} free KV slots of an idle scheduler"
                + (" (HiSparse: available_size = min(logical, device) free; allocator/hisparse.py)"
                   if self.hs is not None else ""))

    def batch(self, k: Rank) -> list[tuple[Request, int]]:
        """This round's extend batch of one scheduler: the chunked request's next chunk, then waiting
        requests while ``PrefillBudget`` admits them (those move to ``k.prefilling``)."""
        if not (k.running or k.waiting or k.prefilling):
            k.ratio = self.ratios.init  # self_check_during_idle
        if self.hs is not None:
            # get_next_batch_to_run under HiSparse skips the last_batch merge (collect_ready_reqs moves
            # staged requests to the running batch) and resets batch_is_full every round
            k.batch_is_full = False
        if not k.prefilling and (k.batch_is_full or not k.waiting):
            return []  # nothing to place this round (the budget below would go unread)
        budget = self._budget(k.pool.available(), [r.seq for r in k.running], k.ratio)
        batch: list[tuple[Request, int]] = []
        for r in k.prefilling:
            batch.append((r, budget.add_chunked(r.seq, r.target - r.prefilled)))
        if k.batch_is_full or not k.waiting:
            return batch
        for r in k.waiting:
            if len(k.running) + len(batch) >= self.plan.max_running:
                k.batch_is_full = True
                break
            n, res = budget.add_new(r.seq, r.target)
            if n:
                batch.append((r, n))
            if res != AddResult.CONTINUE:
                if res == AddResult.NO_TOKEN:
                    k.batch_is_full = True
                break
        for r, _n in batch[len(k.prefilling):]:
            k.waiting.remove(r)
            if math.isnan(r.admitted):
                r.admitted = self.clock()
            k.prefilling.append(r)
        return batch

    def steps_to_admit(self, k: Rank, n: int) -> int | None:
        """Under HiSparse SGLang clears ``batch_is_full`` every round, so the first waiting request
        is tried again after every decode step: the fewest of the next ``n`` steps after which this
        rank's ``PrefillBudget`` would take it (None: not within ``n``). Waiting only makes it easier
        (the running requests' remaining outputs and ``new_token_ratio`` shrink; decode takes no
        device slots, only logical ones), so that step is found by bisection."""
        if not k.waiting or k.prefilling or len(k.running) >= self.plan.max_running:
            return None
        r = k.waiting[0]
        page = self.page
        firsts = [(q.input_tokens + q.generated - 1, ceil_page(q.input_tokens + q.generated - 1, page))
                  for q in k.running]  # (filled, its pages): pages_opened without recomputing the second
        grown = [(q.output_tokens, q.generated, q.input_tokens) for q in k.running]

        def admits(steps: int) -> bool:
            opened = sum(-(-(f + steps) // page) * page - held for f, held in firsts)
            extra = k.pool.reclaimable() if k.pool.reclaimable is not None else 0  # dynamic residency
            available = min(k.pool.free_device + extra, k.pool.free_host - opened)
            running = [Seq(m, g + steps, p) for m, g, p in grown]
            budget = self._budget(available, running, self.ratios.after_steps(k.ratio, steps))
            return budget.add_new(r.seq, r.target)[0] > 0

        if not admits(n):
            return None
        lo, hi = 0, n  # admits(hi); lo: not known to admit (this round's try failed)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if admits(mid) else (mid, hi)
        return hi

    def running_limit(self) -> int:
        """Requests of the nominal lengths one scheduler runs at once: those it admits in one wave from
        empty (each admitted request holding its prompt's pages and one output token); under
        HiSparse the steady state's (below), at least as many."""
        w, page, plan = self.w, self.page, self.plan
        dev, log, running = plan.pool_tokens, plan.host_tokens, []
        prompt = ceil_page(w.input_tokens, page)
        # device slots an admitted request keeps (HiSparse: its hot buffer once the prompt is staged)
        held = prompt if self.hs is None else (
            min(prompt, plan.buffer_slots) if prompt < self.hs.device_buffer_size else plan.buffer_slots)
        for _ in range(plan.max_running):
            avail = dev if self.hs is None else min(dev, log)
            took, _ = self._budget(avail, running, self.ratios.init, 1 << 62).add_new(
                Seq(w.output_tokens, 0, w.input_tokens), w.input_tokens)
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
        while m < plan.max_running:
            gen = [w.output_tokens * j // m for j in range(m)]  # m running, evenly staggered
            stag = [Seq(w.output_tokens, max(1, g), w.input_tokens) for g in gen]
            avail = min(plan.pool_tokens - m * held,
                        plan.host_tokens - sum(ceil_page(w.input_tokens + g, page) for g in gen))
            if not self._budget(avail, stag, self.ratios.min, 1 << 62).add_new(
                    Seq(w.output_tokens, 0, w.input_tokens), w.input_tokens)[0]:
                break
            m += 1
        return m

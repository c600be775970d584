"""PD-disaggregated decode admission: SGLang's ``DecodePreallocQueue`` (``admission.decode_preallocs``).

A request reaches a decode instance after the prefill side, its first token made and its KV
transferred. Retracted requests resume first (their KV copied back from host memory), and while any
waits no new one is taken; then transferred requests, FIFO, while ``decode_preallocs`` admits them
(prompt + 512 reserved tokens against the free pool, outputs not reserved), each holding its KV's
slots (HiSparse: logical/host slots and a hot buffer; the buffer starts empty,
``hisparse_coordinator.admit_request_direct``) and growing page by page.
"""

from __future__ import annotations

from collections.abc import Callable

from .admission import NUM_RESERVED_DECODE_TOKENS, ceil_page, decode_allocatable, decode_preallocs
from .memory import MemoryPlan
from .specs import HiSparseSpec
from .state import Rank, Request


class DecodePreallocQueue:
    def __init__(self, plan: MemoryPlan, hisparse: HiSparseSpec | None, page: int,
                 kv_copy_time: Callable[[int], float], clock: Callable[[], float],
                 finish: Callable[[Rank, Request], None]) -> None:
        self.plan, self.hs, self.page = plan, hisparse, page
        self.kv_copy_time, self.clock, self.finish = kv_copy_time, clock, finish
        # dynamic residency (serving/residency.py): give device slots back before a request's buffer is
        # taken, and keep a taken request's whole KV on the device while it fits
        self.make_room: Callable[[Rank, int], None] | None = None
        self.on_take: Callable[[Rank, Request], None] | None = None

    def slots(self, r: Request) -> tuple[int, int]:
        """(device, host) slots a transferred request takes: its KV so far (``_pre_alloc``'s fill
        length, prompt plus generated tokens but the last), or under HiSparse the hot buffer and the
        logical/host slots."""
        kv = ceil_page(r.input_tokens + r.generated - 1, self.page)
        if self.hs is None:
            return kv, 0
        return self.plan.buffer_slots, kv

    def take(self, k: Rank, r: Request) -> None:
        r.buffer_since = r.generated - 1  # admit_request_direct: an empty buffer (or the whole context)
        k.pool.take(r, *self.slots(r))
        if self.on_take is not None:
            self.on_take(k, r)
        if r.generated >= r.output_tokens:
            self.finish(k, r)
        else:
            k.running.append(r)

    def admit(self, k: Rank) -> float:
        """Admit what the queue takes this round; returns the seconds of KV copies the ranks wait for
        (the baseline's resumed requests reloading their offloaded rows over the host link)."""
        copy_s = 0.0
        while k.retracted and len(k.running) < self.plan.max_running:
            r = k.retracted[0]
            allocatable = decode_allocatable(k.pool.available_logical(), [q.seq for q in k.running])
            self._room(k, r)
            if r.input_tokens + r.generated + NUM_RESERVED_DECODE_TOKENS > allocatable or not k.pool.fits(*self.slots(r)):
                break
            k.retracted.pop(0)
            self.take(k, r)
            if self.hs is None:  # load_kv_cache: the offloaded rows back over the host link
                copy_s += self.kv_copy_time(r.input_tokens + r.generated - 1)
        if k.retracted:
            return copy_s
        room = self.plan.max_running - len(k.running)
        if room <= 0 or not k.waiting:
            return copy_s
        free_device = k.pool.free_device + (k.pool.reclaimable() if k.pool.reclaimable is not None else 0)
        device_requests = None if self.hs is None else free_device // self.plan.buffer_slots
        n = decode_preallocs([r.seq for r in k.waiting[:room]], [q.seq for q in k.running],
                             k.pool.available_logical(), device_requests=device_requests)
        for r in k.waiting[:n]:
            self._room(k, r)
            if not k.pool.fits(*self.slots(r)):  # the prompt's pages themselves (page rounding)
                break
            k.waiting.remove(r)
            # the first token (made by the prefill side) reaches the client now: SGLang's decode server
            # streams it once the request is pre-allocated and its KV received (bench_serving's TTFT);
            # the wait before this is TTFT, never decode time (TPOT counts from here)
            r.admitted = r.first_token = self.clock()
            self.take(k, r)
        k.pool.note_peaks()
        return copy_s

    def _room(self, k: Rank, r: Request) -> None:
        if self.make_room is not None and self.hs is not None:
            device, _ = self.slots(r)
            if device > k.pool.free_device:
                self.make_room(k, device)

    def running_limit(self, input_tokens: int, output_tokens: int) -> int:
        """Requests of the nominal lengths one scheduler holds at once: whole contexts that fit its pools."""
        fp = self.plan.footprint(input_tokens, output_tokens, prefilling=False, prefill_on_device=False)
        by_device = self.plan.pool_tokens // max(ceil_page(fp.device, self.page), 1)
        by_host = self.plan.host_tokens // max(ceil_page(fp.host, self.page), 1) if fp.host else by_device
        return int(min(by_device, by_host))

"""Dynamic residency: where a HiSparse request's full KV lives while it decodes, one registry of policies.

``swap`` is HiSparse as released (``hisparse_coordinator.py``): after prefill a request's device KV
shrinks to its hot buffer (``device_buffer_size`` + the reserved page), the full KV lives in the pinned
host pool, and every decode step swaps the missed top-k rows in.

The two dynamic policies keep a request's full KV on the device while the device pool has room, so a
resident request reads every top-k row from HBM and pays no swap-in; under pressure (a prompt chunk,
a resident request's next page or an admission that the free device slots cannot hold) they give device
slots back:

- ``sglang-dynamic`` (sgl-project/sglang PRs #23935 and #30266, "dynamic HiSparse residency"): a request
  "still gets host backup after entering HiSparse, but its full device KV is preserved by default. Only
  when the device KV allocator is under pressure do we demote resident requests to the traditional
  HiSparse swap mode and shrink their device cache to device_buffer_size". Request-granular: a demoted
  request is a swap-mode request from then on (its LRU starts again, as after an admission). The host
  copy exists already (the per-step backup runs for every request), so a demotion moves no KV over the
  host link; it is priced as one device-to-device copy of a hot buffer's rows (every layer) into the
  slots kept (an upper bound: keeping the slots in place costs only the page-table rewrite). Decode
  runs one of two CUDA graphs (the PRs' dual-path capture): with the swap-in when any request of the
  batch is in swap mode, without it when every request is resident.
- ``vllm-spill`` (vllm-project/vllm PRs #49629, #51323, #53781: "keeps as much KV as possible in the
  normal device cache and spills pages to pinned host memory only when GPU capacity must be
  reclaimed"; the resolver maps each selected position to 1. a resident GPU page, 2. a row of the
  request's hot buffer (a GPU-side LRU, 2 x top-k rows by default), 3. the pinned host pool).
  Page-granular: a spilled request keeps its other pages resident and gains a hot buffer; the resident
  tier is write-back (#56109 on top of #53781: "the resident tier is a write-back cache"), so each
  spilled page is copied device-to-host over the host link, synchronously (#56109 removes "the
  synchronous reclaim"). A partially spilled request's top-k share that lands on host pages is the
  trace's miss share times its spilled share of the context (INFERRED: selections spread uniformly
  over positions; DSA favours recent tokens and the oldest pages spill first, so the real share is
  lower).

Which request gives way: neither PR description names an order. Both dynamic policies take the
scheduler's own victim order under decode-memory pressure (``admission.retract_order``: SGLang's
``retract_decode`` order, fewest output tokens first, then the longest prompt), INFERRED: the one
order each engine already uses to pick who gives way; for vLLM the oldest pages of that request first.

Admission counts the slots a demotion could free as available (vLLM PR #51323's review, fixed in
7374d07: "admission should use the non-reclaimable steady-state requirement or initiate reclamation
before rejecting"), so a dynamic policy never admits fewer requests than ``swap``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .admission import ceil_page, retract_order
from .state import Rank, Request


class Granularity(StrEnum):
    REQUEST = "request"  # a request is resident or in swap mode (SGLang)
    PAGE = "page"  # each page is resident or spilled (vLLM)


@dataclass(frozen=True)
class ResidencyPolicy:
    """One residency policy: whether it keeps KV resident at all, what it gives back under pressure,
    what that costs, and the hot buffer a swap-mode request holds."""

    name: str
    dynamic: bool
    granularity: Granularity
    write_back: bool  # a demotion copies the given-back KV to host (no per-step host copy of resident pages)
    hot_rows_per_top_k: float  # the swap-mode hot buffer in top-k rows (0: the config's device_buffer_size)
    source: str

    def hot_rows(self, top_k: int, device_buffer_size: int) -> int:
        """Hot-buffer slots per request per layer in swap mode."""
        return int(self.hot_rows_per_top_k * top_k) if self.hot_rows_per_top_k else device_buffer_size


RESIDENCY_POLICIES: dict[str, ResidencyPolicy] = {
    "swap": ResidencyPolicy("swap", False, Granularity.REQUEST, False, 0.0,
                            "SGLang HiSparse as released (hisparse_coordinator.py): full KV on the host, a hot buffer "
                            "on the device, a swap-in every step"),
    "sglang-dynamic": ResidencyPolicy("sglang-dynamic", True, Granularity.REQUEST, False, 0.0,
                                      "sgl-project/sglang PRs #23935, #30266: full device KV kept while the allocator "
                                      "allows, resident requests demoted to swap mode under pressure; dual-path CUDA graphs"),
    "vllm-spill": ResidencyPolicy("vllm-spill", True, Granularity.PAGE, True, 2.0,
                                  "vllm-project/vllm PRs #49629, #51323, #53781: pages spilled to pinned host under "
                                  "pressure; resolver: resident page, hot-buffer LRU (2 x top-k rows), pinned host"),
}


def residency_policy(name: str) -> ResidencyPolicy:
    return RESIDENCY_POLICIES[name]


class ResidencyManager:
    """The dynamic policies' bookkeeping for one instance: which requests (or pages) are resident, the
    demotions under pressure and their copy time, the resident share per step."""

    def __init__(self, policy: ResidencyPolicy, page: int, buffer_slots: int, *,
                 d2d_copy_s: Callable[[float], float], d2h_copy_s: Callable[[int], float],
                 hot_bytes: float, pd: bool) -> None:
        self.policy, self.page, self.buffer_slots, self.pd = policy, page, buffer_slots, pd
        self.d2d_copy_s, self.d2h_copy_s, self.hot_bytes = d2d_copy_s, d2h_copy_s, hot_bytes
        self.demotions = 0  # requests demoted (SGLang) or spilled from for the first time (vLLM)
        self.spill_events = 0  # give-backs of any size
        self.spilled_tokens = 0  # KV positions given back to the host
        self.copy_s = 0.0  # all demotion copies
        self.pending_s = 0.0  # copies the ranks have not waited for yet
        self.resident_steps = 0.0  # request-steps whose KV was wholly resident
        self.request_steps = 0.0
        self.per_step: list[tuple[float, int, int]] = []  # (time, resident requests, running requests) per block

    # -- state of one request ---------------------------------------------------------------------------
    @staticmethod
    def fully_resident(r: Request) -> bool:
        return r.resident_tokens > 0 and not r.hot

    def miss_scale(self, r: Request) -> float:
        """Share of the swap-mode misses this request still takes: 0 wholly resident, 1 in swap mode,
        its spilled share of the context when partly spilled (vLLM)."""
        if r.resident_tokens <= 0:
            return 1.0
        if not r.hot:
            return 0.0
        return max(0.0, 1.0 - r.resident_tokens / max(r.context, 1))

    def reclaimable(self, r: Request) -> int:
        """Device slots giving ``r`` back would free."""
        if r.resident_tokens <= 0:
            return 0
        if self.policy.granularity == Granularity.REQUEST:
            return max(r.slots_device - self.buffer_slots, 0)
        return max(r.resident_tokens - (0 if r.hot else self.buffer_slots), 0)

    def rank_reclaimable(self, k: Rank) -> int:
        return sum(self.reclaimable(r) for r in k.running)

    # -- entering decode ------------------------------------------------------------------------------------
    def place(self, k: Rank, r: Request) -> None:
        """A request that starts decoding keeps its whole KV on the device when the free slots hold it
        (colocated: the prompt's pages are there already; pd-decode: the transfer writes them to HBM
        instead of the buffer); else it stays in swap mode."""
        want = ceil_page(r.input_tokens + r.generated - 1, self.page)
        extra = want - r.slots_device
        if want <= self.buffer_slots or extra > k.pool.free_device:
            return
        k.pool.free_device -= extra
        r.slots_device = want
        r.resident_tokens, r.hot = want, False
        k.pool.note_peaks()

    # -- pressure -------------------------------------------------------------------------------------------
    def device_need(self, reqs: list[Request], steps: int = 1) -> int:
        """Device slots the wholly resident requests' next ``steps`` tokens open."""
        return sum(ceil_page(r.context - 1 + steps, self.page) - ceil_page(r.context - 1, self.page)
                   for r in reqs if self.fully_resident(r))

    def room_steps(self, k: Rank, n: int) -> int:
        """Decode steps (<= n) the free device slots allow the resident requests' growth."""
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.device_need(k.running, mid) <= k.pool.free_device:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def reclaim(self, k: Rank, need: int, keep: tuple[Request, ...] = ()) -> None:
        """Give back device slots, victim by victim, until ``need`` more are free beyond what the
        resident requests' next token takes (or nothing is left to give back)."""
        while k.pool.free_device < need + self.device_need(k.running):
            victims = [r for r in k.running if r not in keep and self.reclaimable(r) > 0]
            if not victims:
                return
            order = retract_order([r.seq for r in victims])
            self._give_back(k, victims[order[0]], need + self.device_need(k.running) - k.pool.free_device)

    def _give_back(self, k: Rank, r: Request, short: int) -> None:
        self.spill_events += 1
        if self.policy.granularity == Granularity.REQUEST:
            freed = r.slots_device - self.buffer_slots
            k.pool.free_device += freed
            self.spilled_tokens += r.resident_tokens
            r.slots_device = self.buffer_slots
            r.resident_tokens, r.hot = 0, True
            r.buffer_since = r.generated - 1  # its hot buffer and LRU start again
            r.demotions += 1
            self.demotions += 1
            cost = self.d2d_copy_s(self.hot_bytes)
        else:
            first = not r.hot
            hot = self.buffer_slots if first else 0
            spill = min(r.resident_tokens, ceil_page(short + hot, self.page))
            r.resident_tokens -= spill
            r.slots_device += hot - spill
            k.pool.free_device += spill - hot
            r.hot = True
            if first:
                r.buffer_since = r.generated - 1
                r.demotions += 1
                self.demotions += 1
            self.spilled_tokens += spill
            cost = self.d2h_copy_s(spill)
        self.copy_s += cost
        self.pending_s += cost

    # -- decode ---------------------------------------------------------------------------------------------
    def grow(self, k: Rank, r: Request, steps: int) -> None:
        """A wholly resident request's new tokens take device pages (HiSparse's logical pages as well)."""
        if not self.fully_resident(r):
            return
        pages = ceil_page(r.context - 1 + steps, self.page) - ceil_page(r.context - 1, self.page)
        k.pool.free_device -= pages
        r.slots_device += pages
        r.resident_tokens += pages

    def note_steps(self, now: float, ranks: list[Rank], steps: int) -> None:
        running = sum(len(k.running) for k in ranks)
        resident = sum(1 for k in ranks for r in k.running if self.fully_resident(r))
        self.resident_steps += resident * steps
        self.request_steps += running * steps
        self.per_step.append((now, resident, running))

    @property
    def resident_share(self) -> float:
        return self.resident_steps / self.request_steps if self.request_steps else 0.0

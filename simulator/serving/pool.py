"""One scheduler's KV memory pool, page-granular as SGLang's paged allocators.

The baseline holds every token's KV in device slots. HiSparse holds each request's full KV in
logical slots (backed by the host pool) and, on the device, its prompt while it prefills and then
only its hot buffer; SGLang's ``available_size()`` is then ``min(logical, device)`` free
(``HiSparseTokenToKVPoolAllocator.available_size``). A slot count is always whole pages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .admission import ceil_page

if TYPE_CHECKING:
    from .state import Request


@dataclass
class RankPool:
    """Free device and logical/host slots of one scheduler, and the most it ever used."""

    page: int
    device_slots: int
    host_slots: int
    hisparse: bool
    free_device: int = field(init=False)
    free_host: int = field(init=False)
    peak_device: int = 0  # device slots in use at the fullest moment
    peak_host: int = 0
    # dynamic residency (serving/residency.py): device slots a demotion would free, counted as available
    reclaimable: Callable[[], int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.free_device, self.free_host = self.device_slots, self.host_slots

    def pages_opened(self, filled: int, tokens: int) -> int:
        """Slots (whole pages) that ``tokens`` more tokens take after ``filled`` ones."""
        return ceil_page(filled + tokens, self.page) - ceil_page(filled, self.page)

    def available(self) -> int:
        """SGLang's ``available_size()``: the device pool; under HiSparse min(logical, device) free."""
        if not self.hisparse:
            return self.free_device
        extra = self.reclaimable() if self.reclaimable is not None else 0
        return min(self.free_device + extra, self.free_host)

    def available_logical(self) -> int:
        """What PD decode's ``_allocatable_tokens`` starts from: the device pool, or HiSparse's logical pool."""
        return self.free_device if not self.hisparse else self.free_host

    def empty_available(self) -> int:
        """``available()`` of an idle scheduler."""
        return self.device_slots if not self.hisparse else min(self.device_slots, self.host_slots)

    def note_peaks(self) -> None:
        self.peak_device = max(self.peak_device, self.device_slots - self.free_device)
        self.peak_host = max(self.peak_host, self.host_slots - self.free_host)

    def alloc_prefill(self, r: Request, n: int) -> bool:
        """The pages of a prompt chunk (``alloc_extend``: logical and device ids under HiSparse);
        False, taking nothing, when they do not fit."""
        pages = self.pages_opened(r.prefilled, n)
        if pages > self.free_device or (self.hisparse and pages > self.free_host):
            return False
        self.free_device -= pages
        r.slots_device += pages
        if self.hisparse:
            self.free_host -= pages
            r.slots_host += pages
        self.note_peaks()
        return True

    def fits(self, device: int, host: int) -> bool:
        return device <= self.free_device and host <= self.free_host

    def take(self, r: Request, device: int, host: int) -> None:
        """A request arriving with its KV (PD decode): ``device`` and ``host`` slots at once."""
        self.free_device -= device
        self.free_host -= host
        r.slots_device, r.slots_host = device, host

    def grow(self, r: Request, steps: int) -> None:
        """``steps`` decode steps of ``r``: each step's input token takes a new page whenever it opens
        one (logical ids only under HiSparse)."""
        pages = self.pages_opened(r.input_tokens + r.generated - 1, steps)
        if not self.hisparse:
            self.free_device -= pages
            r.slots_device += pages
        else:
            self.free_host -= pages
            r.slots_host += pages

    def shrink_device(self, r: Request, keep: int) -> None:
        """Give back a request's device slots beyond ``keep`` (HiSparse: the prompt staged to host)."""
        self.free_device += r.slots_device - keep
        r.slots_device = keep

    def release(self, r: Request) -> None:
        self.free_device += r.slots_device
        self.free_host += r.slots_host
        r.slots_device = r.slots_host = 0

    def pages_needed(self, reqs: Iterable[Request]) -> int:
        """Tokens the next decode step allocates: a page for each request whose next KV position opens one."""
        return self.page * sum(1 for r in reqs if (r.input_tokens + r.generated - 1) % self.page == 0)

    def room_steps(self, reqs: Iterable[Request], n: int) -> int:
        """Decode steps the free slots allow before ``check_decode_mem`` fails (<= n)."""
        counts = np.zeros(n, dtype=np.int64)
        for r in reqs:
            counts[(-(r.input_tokens + r.generated - 1)) % self.page::self.page] += 1
        need = np.cumsum(counts) * self.page
        return int(np.searchsorted(need, self.available(), side="right"))

"""Before and during decode: SGLang's decode memory check and retraction, and the misses each
running request's hot buffer takes.

``update_running_batch`` runs ``check_decode_mem`` before every decode pass (a page for every
request whose next token opens one); when it fails, ``retract_decode`` frees requests in
``retract_order`` until the rest fit, and re-estimates ``new_token_ratio``. A retracted request
frees its slots; colocated, it waits at the end of the queue to prefill its prompt and its output so
far again; PD decode, its KV is offloaded to host memory and it resumes first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import HisparseError
from .admission import ratio_after_retract, retract_order
from .misses import MissProfiles
from .specs import HiSparseSpec
from .state import Rank, Request


class DecodeManager:
    def __init__(self, hisparse: HiSparseSpec | None, profiles: MissProfiles | None, pd: bool,
                 kv_copy_time: Callable[[int], float], files: str) -> None:
        self.hs, self.profiles, self.pd = hisparse, profiles, pd
        self.kv_copy_time, self.files = kv_copy_time, files
        self.retractions = 0
        self.reprefill_tokens = 0.0  # prompt + generated tokens to prefill again (colocated)
        self.pending_copy_s = 0.0  # pd-decode: KV offloads of retracted requests not yet waited for
        self.ahead = 1  # KV positions a decode step writes per request (speculative: the verify's)
        self.res = None  # dynamic residency (serving/residency.py): demotes before it retracts

    def check(self, k: Rank) -> None:
        """``check_decode_mem``, and on failure ``retract_decode`` (the last request is never
        retracted: SGLang aborts the run when even it does not fit). Under dynamic residency resident
        requests are demoted first, as far as their next pages and the check need."""
        if self.res is not None:  # the resident requests' next device pages
            self.res.reclaim(k, 0)
        if not k.running or k.pool.pages_needed(k.running, self.ahead) <= k.pool.available():
            return
        order = retract_order([r.seq for r in k.running])
        kept = list(k.running)
        for i in order:
            if len(kept) == 1:
                break
            r = k.running[i]
            kept.remove(r)
            self.retract(k, r)
            if k.pool.pages_needed(kept, self.ahead) <= k.pool.available():
                break
        k.running = kept
        k.ratio = ratio_after_retract([r.seq for r in kept])
        k.batch_is_full = False
        if k.pool.pages_needed(kept, self.ahead) > k.pool.available():
            raise HisparseError(f"{self.files}: out of KV memory with one request left (SGLang aborts it: "
                                "'Out of memory even after retracting all other requests')")

    def retract(self, k: Rank, r: Request) -> None:
        """``release_req``: free the request's slots (HiSparse: ``retract_req`` frees its buffer and
        host slots), then back to the queue (colocated) or to the retracted queue (pd-decode)."""
        k.pool.release(r)
        r.retractions += 1
        self.retractions += 1
        if self.pd:
            if self.hs is None:  # offload_kv_cache: the request's rows over the host link
                self.pending_copy_s += self.kv_copy_time(r.input_tokens + r.generated - 1)
            k.retracted.append(r)
            return
        r.prefilled = 0
        r.target = r.input_tokens + r.generated
        self.reprefill_tokens += r.target
        k.waiting.append(r)

    def step_misses(self, r: Request, n: int) -> np.ndarray:
        """Top-k share missed by request r over its next n decode steps: its trace from the step its
        hot buffer was set up (first admission, or again after a retraction: SGLang resets a
        retracted request's buffer and LRU). A context that fits the buffer takes SGLang's fast path."""
        first = r.generated - 1 - r.buffer_since  # decode steps since the buffer was set up
        ctx0, dbs = r.input_tokens + r.generated, self.hs.device_buffer_size
        if ctx0 + n - 1 <= dbs:  # every step on the fast path
            return np.zeros(n)
        shares = self.profiles.shares_from(r.profile, first, n).astype(float)
        if self.pd and first == 0 and r.demotions == 0:
            shares[0] = 1.0  # the buffer starts empty: every entry of every layer misses
        if self.res is not None:
            shares = shares * self.res.miss_scale(r)  # resident pages are read in place
        if ctx0 > dbs:  # no step on the fast path
            return shares
        ctx = ctx0 + np.arange(n)
        return np.where(ctx <= dbs, 0.0, shares)

"""SGLang's prefill admission and decode retraction for one scheduler, as plain arithmetic.

Read from sgl-project/sglang (upstream, mid/late 2026; our own code, the names are SGLang's):

* ``managers/schedule_policy.py`` ``PrefillAdder`` (one object per scheduling round):
  ``rem_total_tokens = available_size - rem_total_token_offset`` where the offset starts as every
  running request's ``min(max_new_tokens - len(output_ids), CLIP_MAX_NEW_TOKENS) x new_token_ratio``
  (``_get_running_request_total_token_offset``) and each admitted request adds
  ``ceil_page(extend) + max_new_reserve + page_size`` (``_update_prefill_budget``; the reserve is
  ``min(max_new_tokens, CLIP_MAX_NEW_TOKENS)`` for a request whose prompt ends in this round, 0 for
  a chunk that does not); ``cur_rem_tokens = available_size - cur_rem_token_offset`` counts only the
  extends (+ a page each). ``budget_state``: NO_TOKEN when either is <= 0, OTHER when the chunk
  budget (``--chunked-prefill-size``, per DP rank) is spent.
* ``add_one_req``: NO_TOKEN when ``extend + min(max_new - out, CLIP) + page >= rem_total_tokens``;
  a prompt longer than the chunk budget left becomes the chunked request (page-floored chunk).
* ``add_one_req_ignore_eos`` (taken when the request has ``ignore_eos`` and the tree cache is off:
  ``--disable-radix-cache`` gives ``ChunkCache`` whose ``disable`` is True; ``bench_serving`` sends
  ``"ignore_eos": not args.disable_ignore_eos``, so True by default): NO_TOKEN when
  ``ceil_page(extend) > min(cur_rem_tokens, rem_total_tokens)``; then an exact look-ahead: every
  request (running, admitted this round, the new one) as ``(tokens_left = max_new - out,
  tokens_occupied = input + out)`` sorted by ``tokens_left``; with ``cur = cur_rem_tokens -
  ceil_page(extend)``, for each i (bs = n - i requests still decoding when the i-th finishes)
  ``cur + freed - tokens_left_i x bs <= IGNORE_EOS_RESERVE_TOKENS x bs`` is NO_TOKEN, ``freed``
  adding each finished request's ``tokens_occupied``. So for fixed-length requests the pool never
  runs out: no retraction but the page rounding slack.
* ``add_chunked_req``: the chunk is ``min(rem_chunk_tokens, rem_total_tokens)`` (the whole chunk
  budget when that is <= 0, to make progress).
* ``managers/scheduler.py``: ``init_new_token_ratio = min(SGLANG_INIT_NEW_TOKEN_RATIO (0.7) x
  schedule_conservativeness, 1)``, ``min_new_token_ratio = min(init x
  SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR (0.14), 1)``, ``new_token_ratio_decay = (init - min) /
  SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600)`` (defaults in ``environ.py``); ``update_running_batch``
  decays the ratio by one step on every decode pass whose memory check passes, and sets it to
  ``retract_decode``'s estimate after a retraction; an idle scheduler resets it to ``init``
  (``self_check_during_idle``). ``server_args._handle_data_parallelism`` multiplies
  ``--schedule-conservativeness`` (default 1.0) by 0.3 under ``--enable-dp-attention``.
* ``managers/schedule_batch.py``: ``check_decode_mem`` needs ``page_size`` tokens for every request
  whose ``kv_committed_len % page_size == 0`` (its next token opens a page) and compares them with
  ``available_size``; ``retract_decode`` sorts by ``(len(output_ids), -len(origin_input_ids))``
  descending and pops from the end (fewest generated tokens, then longest prompt, first) until the
  rest pass the check (at least one retracted, at least one kept), frees them
  (``release_req``) and returns the ratio ``min(1, (sum(out) + SGLANG_RETRACT_DECODE_STEPS (20) x n)
  / (sum(max_new_tokens) + 1))`` over the requests kept. The scheduler re-queues the retracted
  requests (``_add_request_to_queue(req, is_retracted=True)``: the end of the FCFS queue); they
  prefill ``origin_input_ids + output_ids`` again.

* ``Scheduler.get_new_batch_prefill``: a NO_TOKEN answer sets ``running_batch.batch_is_full`` and no
  waiting request is tried until it clears: when the running batch shrinks (a finish, a retraction)
  or when ``get_next_batch_to_run`` filters a continuing chunked request out of the last extend
  batch; with HiSparse it skips that merge (``collect_ready_reqs`` moves staged requests to the
  running batch) and clears the flag every round. The model applies these in ``model.py``.

HiSparse (``mem_cache/allocator/hisparse.py``, ``HiSparseTokenToKVPoolAllocator.available_size``)
reports ``min(logical free, device free)``: every reservation above is charged against the smaller
of the two although decode steps take logical ids only.

A PD decode instance has no PrefillAdder: ``disaggregation/decode.py`` ``DecodePreallocQueue``
(read at sgl-project/sglang 712b01d8, 2026-04-20, in a fork's full history; PR #22453 added the
HiSparse parts on 2026-04-11) pre-allocates a transferred request's prompt when
``_allocatable_tokens`` allows: the free pool (HiSparse: the **logical** pool, "pre-alloc only
allocates logical indices") minus ``max(num_reserved_decode_tokens (512) x (running + transfer +
waiting), need_space_for_single_req)`` (the largest ``min(max_new, CLIP) + input -
retractable_tokens`` over the running requests, ``retractable_tokens`` their ``input + out`` summed)
minus each retracted request's ``input + out + 512``; each request needs ``input + 512`` and also
``input + min(max_new, CLIP) - retractable_tokens``; under HiSparse at most ``device free //
padded_buffer_size - len(transfer_queue)`` requests (their hot buffers). Outputs are not reserved,
so a decode node can over-admit and retract: ``retract_decode`` offloads the request's KV to host
memory and ``resume_retracted_reqs`` brings it back (FIFO) when ``input + out + 512`` fits; no new
request is pre-allocated while any is retracted.
"""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass
from enum import Enum, auto
from functools import cached_property
from typing import NamedTuple

from ..errors import HisparseError

# defaults with their SGLang names (python/sglang/srt/environ.py, schedule_policy.py)
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
IGNORE_EOS_RESERVE_TOKENS = 1  # schedule_policy.py
NUM_RESERVED_DECODE_TOKENS = 512  # server_args --num-reserved-decode-tokens (PD decode pre-allocation)
DP_ATTENTION_CONSERVATIVENESS = 0.3  # server_args._handle_data_parallelism


class AddResult(Enum):
    CONTINUE = auto()
    NO_TOKEN = auto()
    OTHER = auto()


@dataclass(frozen=True)
class RatioSchedule:
    """``new_token_ratio``'s start, floor and per-step decay for one scheduler."""

    conservativeness: float  # --schedule-conservativeness as given
    dp_attention: bool

    def __post_init__(self) -> None:
        if not (math.isfinite(self.conservativeness) and self.conservativeness >= 0):
            raise HisparseError(f"schedule_conservativeness = {self.conservativeness}: must be a number >= 0 "
                                "(SGLang asserts 'Invalid schedule_conservativeness')")

    @cached_property  # read at every decode step: computed once
    def effective_conservativeness(self) -> float:
        return self.conservativeness * (DP_ATTENTION_CONSERVATIVENESS if self.dp_attention else 1.0)

    @cached_property  # read at every decode step: computed once
    def init(self) -> float:
        return min(INIT_NEW_TOKEN_RATIO * self.effective_conservativeness, 1.0)

    @cached_property  # read at every decode step: computed once
    def min(self) -> float:
        return min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)

    @cached_property  # read at every decode step: computed once
    def decay(self) -> float:
        return (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS

    def after_steps(self, ratio: float, steps: int) -> float:
        """The ratio after ``steps`` decode passes without a retraction."""
        return max(ratio - steps * self.decay, self.min)


class Seq(NamedTuple):
    """What the admission arithmetic reads of one request: ``max_new`` (max_new_tokens), ``out``
    (len(output_ids)) and ``prompt`` (the origin input length). A named tuple: the serving model
    builds one per running request at every admission try."""

    max_new: int
    out: int
    prompt: int


def ceil_page(tokens: int, page: int) -> int:
    return -(-tokens // page) * page


class PrefillBudget:
    """One scheduling round's ``PrefillAdder`` for one scheduler (token counts only)."""

    def __init__(self, available: int, running: list[Seq], ratio: float, chunk_tokens: int, page: int,
                 ignore_eos: bool) -> None:
        self.available = available
        self.page = page
        self.ratio = ratio
        self.ignore_eos = ignore_eos
        self.running = running
        self.rem_chunk = chunk_tokens
        self.total_offset = float(sum(min(m - o, CLIP_MAX_NEW_TOKENS) * ratio for m, o, _ in running))  # Seq fields
        self.cur_offset = 0
        self.admitted: list[Seq] = []
        self._states: list[tuple[float, int]] | None = None

    @property
    def rem_total(self) -> float:
        return self.available - self.total_offset

    @property
    def cur_rem(self) -> float:
        return self.available - self.cur_offset

    def _update(self, extend: int, max_new_reserve: int) -> None:
        paged = ceil_page(extend, self.page)
        self.total_offset += paged + max_new_reserve + self.page
        self.cur_offset += paged + self.page
        self.rem_chunk -= paged

    def state(self) -> AddResult:
        if self.rem_total <= 0 or self.cur_rem <= 0:
            return AddResult.NO_TOKEN
        if self.rem_chunk <= 0:
            return AddResult.OTHER
        return AddResult.CONTINUE

    def add_chunked(self, seq: Seq, remaining: int) -> int:
        """The next chunk of the request mid-prefill (``add_chunked_req``): tokens it prefills now."""
        rem = min(self.rem_chunk, int(self.rem_total))
        if rem <= 0:
            rem = self.rem_chunk
        n = min(remaining, rem)
        self._update(n, 0 if remaining > n else min(seq.max_new, CLIP_MAX_NEW_TOKENS))
        self.admitted.append(seq)
        return n

    def add_new(self, seq: Seq, extend: int) -> tuple[int, AddResult]:
        """Try a waiting request whose prefill is ``extend`` tokens: (tokens it prefills this round,
        0 if not admitted; the round's state)."""
        if self.ignore_eos:
            return self._add_ignore_eos(seq, extend)
        max_new = min(max(seq.max_new - seq.out, 0), CLIP_MAX_NEW_TOKENS)
        if extend + max_new + self.page >= self.rem_total:
            return 0, AddResult.NO_TOKEN
        return self._place(seq, extend, floor_chunk=True)

    def _add_ignore_eos(self, seq: Seq, extend: int) -> tuple[int, AddResult]:
        paged = ceil_page(extend, self.page)
        if paged > min(self.cur_rem, self.rem_total):
            return 0, AddResult.NO_TOKEN
        entry = (float(seq.max_new - seq.out), seq.prompt + seq.out)
        if self._states is None:
            self._states = sorted((float(m - o), p + o)  # Seq fields: max_new, out, prompt
                                  for m, o, p in [seq, *self.running, *self.admitted] if m - o > 0)
        elif entry[0] > 0:
            insort(self._states, entry)
        cur, freed, n = self.cur_rem - paged, 0, len(self._states)
        for i, (left, occupied) in enumerate(self._states):
            bs = n - i
            if cur + freed - left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return 0, AddResult.NO_TOKEN
            freed += occupied
        return self._place(seq, extend, floor_chunk=False)

    def _place(self, seq: Seq, extend: int, *, floor_chunk: bool) -> tuple[int, AddResult]:
        if extend <= self.rem_chunk:
            self._update(extend, min(seq.max_new, CLIP_MAX_NEW_TOKENS))
            self.admitted.append(seq)
            return extend, self.state()
        trunc = self.rem_chunk // self.page * self.page if floor_chunk else self.rem_chunk
        if trunc <= 0:
            return 0, AddResult.OTHER
        self._update(trunc, 0)
        self.admitted.append(seq)
        return trunc, self.state()


def retract_order(seqs: list[Seq]) -> list[int]:
    """Indices in ``retract_decode``'s order: the first retracted first."""
    keep_first = sorted(range(len(seqs)), key=lambda i: (seqs[i].out, -seqs[i].prompt), reverse=True)
    return keep_first[::-1]


def ratio_after_retract(kept: list[Seq]) -> float:
    decoded = sum(s.out for s in kept)
    max_new = sum(s.max_new for s in kept)
    return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (max_new + 1))


def decode_allocatable(available: int, running: list[Seq], *, queued: int = 0, retracted: list[Seq] = (),
                       reserve: int = NUM_RESERVED_DECODE_TOKENS) -> int:
    """``DecodePreallocQueue._allocatable_tokens`` with ``retractable_tokens`` (``queued``: requests
    transferred or in transfer, not yet running; ``retracted``: counted as pop_preallocated counts
    them, [] for resume_retracted_reqs)."""
    retractable = sum(s.prompt + s.out for s in running)
    single = max((min(s.max_new, CLIP_MAX_NEW_TOKENS) + s.prompt - retractable for s in running), default=0)
    allocatable = available - max(reserve * (len(running) + queued), single)
    return allocatable - sum(s.prompt + s.out + reserve for s in retracted)


def decode_preallocs(queue: list[Seq], running: list[Seq], available: int, *, device_requests: int | None = None,
                     queued: int = 0, retracted: list[Seq] = (), reserve: int = NUM_RESERVED_DECODE_TOKENS) -> int:
    """How many of ``queue``'s first requests ``pop_preallocated`` takes this round (FIFO, it stops at
    the first that does not fit); ``device_requests``: HiSparse's hot-buffer budget."""
    retractable = sum(s.prompt + s.out for s in running)
    allocatable = decode_allocatable(available, running, queued=queued, retracted=retracted, reserve=reserve)
    budget = math.inf if device_requests is None else max(0, device_requests)
    taken = 0
    for s in queue:
        required = s.prompt + reserve
        if budget <= 0 or max(required, s.prompt + min(s.max_new, CLIP_MAX_NEW_TOKENS) - retractable) > allocatable:
            break
        allocatable -= required
        budget -= 1
        taken += 1
    return taken

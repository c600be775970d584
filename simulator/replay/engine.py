"""The replay engine: exact per-step misses of one stream for one stateful policy and buffer size.

The semantics are the step loop of ``step.py`` (its docstring lists the step rules), compiled
once per policy through the generated ``entries.py``; the policies are ``policies/``. The C
fast path (``simulator.native``) and the swap-in GPU kernel are checked bit for bit against
``replay_policy``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .compiled_cache import drop_stale_compiled_copies

drop_stale_compiled_copies()  # before the first compiled call loads a cached copy

from . import entries, step  # noqa: E402 - after the stale copies are gone
from .policies import POLICY_IDS, REGISTRY, dispatch  # noqa: E402

INF = step.INF
next_uses = step.next_uses


class PolicyRun(NamedTuple):
    """One stateful replay: misses per step, and the state a GPU kernel is checked against."""

    misses: np.ndarray  # int64 [steps]
    slot_pos: np.ndarray  # int64 [B]: position held by each slot at the end (-1: free)
    order: np.ndarray  # int64: the policy's recency (queue) order of occupied slots, oldest first
    #                    (empty for a policy without one: the policy's ``order`` hook)
    slots: np.ndarray | None  # int32 [steps, width]: slot of every entry after its step (B: reserved
    #                           newest slot, -1: padding); only with record=True


def replay_policy(policy: str, indices: np.ndarray, ctx_len: np.ndarray, buffer: int, *, reserve: bool,
                  prefix: bool, batched: bool, seed: int, record: bool = False, group: int = 1,
                  param: int = 0) -> PolicyRun:
    """Replay one stateful policy over one stream. A placed policy (salru, sglang-clock) takes
    ``group`` trace steps per commit and its ``param`` (salru: ways per shard); see
    ``step.run_placed``."""
    pid = POLICY_IDS[policy]
    state = dispatch.MODULES[pid].STATE
    idx = np.ascontiguousarray(indices, dtype=np.int32)
    ctx = np.ascontiguousarray(ctx_len, dtype=np.int64)
    if idx.ndim != 2 or ctx.shape != idx.shape[:1]:
        raise ValueError(f"indices must be [steps, width] and ctx_len [steps], got shapes {idx.shape} and {ctx.shape}")
    if batched and not REGISTRY[pid].placed and idx.size:
        # the compiled step loop gives a step's entries a slot each without a bound check: a step
        # that selects more than the buffer holds wrote past the slot arrays (a segfault for fifo
        # and arc, a hang for random). The newest token, when reserved, has its own slot.
        counted = idx >= 0
        if reserve:
            counted &= idx != (ctx - 1)[:, None]
        per_step = counted.sum(axis=1)
        if int(per_step.max()) > buffer:
            t = int(per_step.argmax())
            raise ValueError(f"step {t} selects {int(per_step[t])} entries, more than the buffer's {buffer} slots "
                             "(a batched step needs room for all its entries: buffer >= top_k)")
    cmax = int(ctx.max()) if ctx.size else 1
    nu = next_uses(idx, cmax) if state.next_use else np.zeros((1, 1), dtype=np.int64)
    misses = np.zeros(idx.shape[0], dtype=np.int64)
    slots = np.full(idx.shape if record else (1, 1), -1, dtype=np.int32)
    args = (idx, ctx, int(buffer), reserve, prefix, batched, int(seed), nu, state.next_use, misses, record, slots,
            state.slot_rows, state.position_rows, state.scalars)
    if REGISTRY[pid].placed:
        # a commit never spans more than the stream's steps, and the step loop sizes its buffers by
        # group x width: --mtp-steps 999999999 asked for gigabytes to replay 20 steps
        args += (int(min(group, max(idx.shape[0], 1))), int(param))
    slot_pos, order = entries.ENTRIES[pid](*args)
    return PolicyRun(misses, slot_pos, order, slots if record else None)

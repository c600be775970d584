"""The swap-in kernel's specification for a batch of requests: the engine's batched ``lru``.

``cupy_kernels/swap_in.py`` (HiSparse's swap-in on the GPU) must reproduce, bit for bit, every
entry's slot, every step's misses, the final slot contents and the final LRU order that this
returns (tests/test_swap_in_gpu.py; the CPU properties in tests/test_swap_in_reference.py). It
lives beside the engine because it is the engine's answer: the kernel package imports nothing
from the simulator.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .config import Initial
from .engine import replay_policy
from .policies import Policy


class ReferenceRun(NamedTuple):
    """The engine's answer for a batch of steps: what the kernel must reproduce bit for bit."""

    slots: np.ndarray  # int32 [steps, R, k]
    misses: np.ndarray  # int64 [steps, R]
    slot_pos: np.ndarray  # int64 [R, B]: final slot -> position (-1 free)
    orders: list[np.ndarray]  # final LRU order per request, oldest first


def reference_swap_in(indices: np.ndarray, ctx_len: np.ndarray, buffer: int, *,
                      initial: str = Initial.PREFIX, policy: str = Policy.LRU, ways: int = 0) -> ReferenceRun:
    """Replay each request's steps through the engine's batched ``lru`` (newest reserved), or
    ``salru`` with ``ways`` ways per shard (the sharded kernels, cupy_kernels/sharded_lru.py).

    indices: [steps, R, k]; ctx_len: [steps, R]. A step with ctx_len 0 is idle for that request
    (the kernel leaves its state alone), so it is left out of that request's stream.
    """
    try:
        initial = Initial(initial)
    except ValueError:
        raise ValueError(f"initial must be one of {[m.value for m in Initial]}, got {initial!r}") from None
    indices = np.asarray(indices)
    ctx_len = np.asarray(ctx_len)
    steps, n_req, width = indices.shape
    slots = np.full((steps, n_req, width), -1, np.int32)
    misses = np.zeros((steps, n_req), np.int64)
    slot_pos = np.full((n_req, buffer), -1, np.int64)
    orders = []
    for r in range(n_req):
        active = ctx_len[:, r] > 0
        run = replay_policy(policy, indices[active, r], ctx_len[active, r], buffer, reserve=True,
                            prefix=initial is Initial.PREFIX, batched=True, seed=0, record=True,
                            param=ways if policy == Policy.SALRU else 0)
        slots[active, r] = run.slots
        misses[active, r] = run.misses
        slot_pos[r] = run.slot_pos
        orders.append(run.order)
    return ReferenceRun(slots, misses, slot_pos, orders)

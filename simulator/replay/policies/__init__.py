"""Eviction policies: one module each behind one small compiled interface.

Every policy module defines, compiled with numba:

- ``init(sw, pw, g, B, cmax)``: empty state. ``sw`` holds per-slot words (rows of int64, a
  little longer than B, for list heads and heaps), ``pw`` per-position words (ghost lists),
  ``g`` a few scalars.
- ``victim(..., mark, stamp, slot_pos, pos) -> slot``: the slot to evict so that position
  ``pos`` can load; never a slot with ``mark[slot] == stamp`` (hit or loaded this step).
- ``insert(..., slot, pos, nu, stamp)``: ``pos`` now lives in ``slot``; ``nu`` is its next use
  (access number; only OPT reads it).
- ``hits(..., mark, stamp, hit_slots, hit_nu, nh)``: the step's hits, in stored order, after
  its misses were loaded.

The engine (``simulator.replay.engine``) owns the step structure shared by all of them: hit
detection, free slots first, the reserved newest-token slot, the short-context fast path and
the initial buffer. ``none`` and ``static-prefix`` hold no state and are counted directly.
"""

from __future__ import annotations

# The engine dispatches on these ids; the names are what users type.
POLICY_IDS: dict[str, int] = {
    "lru": 0, "fifo": 1, "clock": 2, "lfu": 3, "arc": 4, "s3fifo": 5, "sieve": 6, "random": 7,
    "opt": 8,
}
STATELESS = ("none", "static-prefix")
POLICIES: tuple[str, ...] = tuple(POLICY_IDS) + STATELESS

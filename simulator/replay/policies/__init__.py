"""Eviction policies: the registry, and one module each behind one small compiled interface.

Adding a policy is one module here plus one line in ``REGISTRY``, then
``python -m simulator.replay.policies.generate`` (tests/test_replay_registry.py checks that the
generated dispatch is current, and adds a dummy policy that way).

Every policy module declares its state sizes (``STATE``) and defines, compiled with numba:

- ``init(sw, pw, g, B, cmax)``: empty state. ``sw`` holds ``STATE.slot_rows`` rows of per-slot
  words (int64, a little longer than B, for list heads and heaps), ``pw`` ``STATE.position_rows``
  rows of per-position words (ghost lists), ``g`` ``STATE.scalars`` scalars.
- ``victim(..., mark, stamp, slot_pos, pos) -> slot``: the slot to evict so that position
  ``pos`` can load; never a slot with ``mark[slot] == stamp`` (hit or loaded this step).
- ``insert(..., slot, pos, nu, stamp)``: ``pos`` now lives in ``slot``; ``nu`` is its next use
  (access number; computed only for a policy with ``STATE.next_use``).
- ``hits(..., mark, stamp, hit_slots, hit_nu, nh)``: the step's hits, in stored order, after
  its misses were loaded.
- ``order(sw, pw, g, B, cmax, out) -> n``: the policy's recency (or queue) order of occupied
  slots, oldest first, in out[:n]; 0 for a policy without one.

A policy registered with ``placed=True`` (SGLang's sharded LRU and multi-step CLOCK) decides
where every load goes itself, so it runs in the step loop's placing variant
(``step.run_placed``), whose hook protocol differs: see that function's docstring.

The engine (``simulator.replay.engine``) owns the step structure shared by all of them: hit
detection, free slots first, the reserved newest-token slot, the short-context fast path and
the initial buffer. ``none`` and ``static-prefix`` hold no state and are counted directly.

This module imports neither numpy nor numba (the CLI reads the names and help from it).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class PolicyState(NamedTuple):
    """The state a policy's hooks use: the engine allocates exactly this much."""

    slot_rows: int  # rows of sw (per-slot words)
    position_rows: int  # rows of pw (per-position words)
    scalars: int  # entries of g
    next_use: bool = False  # whether insert/hits read the entries' next uses (OPT)


class PolicyEntry(NamedTuple):
    name: str  # what users type
    module: str  # the module of this package that implements it
    help: str  # one line for --help
    placed: bool = False  # replayed by step.run_placed: the policy places every load (and may drop one)


# The registry: one line per stateful policy. A policy's place is its compiled id.
REGISTRY: tuple[PolicyEntry, ...] = (
    PolicyEntry("lru", "lru", "least recently used (HiSparse's policy)"),
    PolicyEntry("fifo", "fifo", "first in, first out"),
    PolicyEntry("clock", "clock", "second chance with a sweeping hand"),
    PolicyEntry("lfu", "lfu", "least frequently used, LRU among equals"),
    PolicyEntry("arc", "arc", "adaptive replacement cache (recency and frequency lists, ghosts)"),
    PolicyEntry("s3fifo", "s3fifo", "S3-FIFO: small, main and ghost FIFO queues"),
    PolicyEntry("sieve", "sieve", "SIEVE: a FIFO with visited bits and a resting hand"),
    PolicyEntry("random", "random_", "a uniformly random unprotected slot (seeded)"),
    PolicyEntry("opt", "opt", "Belady's optimum: evict the entry used farthest in the future"),
    PolicyEntry("salru", "salru", "SGLang PR #31341's sharded set-associative LRU (hashed shards of --ways "
                "ways, batched LRU in each, overflow misses not cached)", placed=True),
    PolicyEntry("sglang-clock", "sglang_clock", "SGLang PR #32162's multi-step (MTP) CLOCK commit, "
                "--mtp-steps trace steps per commit", placed=True),
)

# Placed policies whose parameter (the step loop's g[4]) is the shard width: ReplayConfig.ways.
SHARDED: frozenset[str] = frozenset({"salru"})

# The replay options only some policies read (ReplayConfig field -> those policies): a value given
# where none of them replays changes nothing (hisparse replay notes it, a sweep axis is refused).
OPTION_USERS: dict[str, frozenset[str]] = {"ways": SHARDED, "seed": frozenset({"random"})}

# Policies that hold no state, counted directly (simulator.replay.api).
STATELESS: dict[str, str] = {
    "none": "no buffer: every selected entry loads",
    "static-prefix": "the first B positions stay resident (from --initial empty: each loads at its first "
                     "read), every other entry loads and is not kept",
}

POLICY_IDS: dict[str, int] = {e.name: i for i, e in enumerate(REGISTRY)}
POLICIES: tuple[str, ...] = tuple(POLICY_IDS) + tuple(STATELESS)
POLICY_HELP: dict[str, str] = {**{e.name: e.help for e in REGISTRY}, **STATELESS}

Policy = StrEnum("Policy", {name.replace("-", "_").upper(): name for name in POLICIES})
Policy.__doc__ = "A replay policy's name (the members follow REGISTRY and STATELESS)."


def help_text() -> str:
    """``--policy`` help: every policy with its one line."""
    return "; ".join(f"{name}: {text}" for name, text in POLICY_HELP.items())

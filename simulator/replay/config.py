"""What one replay is: a policy, a buffer size and the step rules, checked once when made.

This module imports neither numpy nor numba (the CLI builds configs before any replay).
"""

from __future__ import annotations

import operator
import typing
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from ..errors import HisparseError
from .policies import POLICY_IDS, REGISTRY, SHARDED, Policy

# The random policy draws from numba's Mersenne Twister, whose seed is 32 bits: a larger seed was
# cut to its low 32 bits (--seed 4294967297 replayed exactly as --seed 1), so two seeds named the
# same draws. Seeds are refused past what the generator can tell apart.
MAX_SEED = 2**32 - 1
# The slot arrays are int32 (the C fast path refuses more): the CLI's --buffer bound (commands.common.MAX_BUFFER).
MAX_BUFFER = 2**31 - 2


class Semantics(StrEnum):
    """How a step's entries meet the buffer."""

    BATCHED = "batched"  # HiSparse: looked up at once, hits protected, miss i takes the i-th victim
    SEQUENTIAL = "sequential"  # one access at a time, in stored order (classic, as libCacheSim)


class Initial(StrEnum):
    """What the buffer holds when the context first outgrows it."""

    PREFIX = "prefix"  # colocated prefill: the first positions of the prompt
    EMPTY = "empty"  # disaggregated decode: nothing


def is_bool(value: Any) -> bool:
    """True and False, and numpy's (``np.True_``; its type is ``numpy.bool``, ``numpy.bool_`` before 2.0)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _whole(name: str, value: Any, what: str = "a whole number") -> int:
    """An int field's value as a plain int: numpy integers too, never a bool (``buffer=True`` was
    a 1-slot buffer), a float or a string."""
    if is_bool(value):
        raise HisparseError(f"{name} must be {what}, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise HisparseError(f"{name} must be {what}, got {value!r}") from None


def _flag(name: str, value: Any) -> bool:
    """A bool field's value: True or False (numpy's too). A string was taken as true whatever it
    said: ``reserve_newest="no"`` replayed with the newest token reserved."""
    if is_bool(value):
        return bool(value)
    raise HisparseError(f"{name} must be True or False, got {value!r}")


def _member(enum: type[StrEnum], value: Any, what: str) -> StrEnum:
    try:
        return enum(value)
    except ValueError:
        raise HisparseError(f"unknown {what} {value!r} (one of: {', '.join(enum)})") from None


@dataclass(frozen=True)
class ReplayConfig:
    """One replay: a policy, a buffer size (slots per request and layer) and the step rules.

    Strings are accepted for the enum fields and become members; a bad value raises here."""

    policy: Policy = Policy.LRU
    buffer: int = 4096
    semantics: Semantics = Semantics.BATCHED
    initial: Initial = Initial.PREFIX
    reserve_newest: bool = True
    seed: int = 0
    ways: int = 32  # salru: ways per shard (shards = buffer / ways)
    mtp_steps: int = 1  # placed policies (salru, sglang-clock): consecutive trace steps per swap commit

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", _member(Policy, self.policy, "policy"))
        object.__setattr__(self, "semantics", _member(Semantics, self.semantics, "semantics"))
        object.__setattr__(self, "initial", _member(Initial, self.initial, "initial buffer"))
        buffer = _whole("buffer", self.buffer, "a whole number of slots")
        if buffer < 1:
            raise HisparseError(f"buffer must be >= 1 slot, got {buffer}")
        if buffer > MAX_BUFFER:
            raise HisparseError(f"buffer must be at most {MAX_BUFFER} slots (2**31 - 2: the slot arrays are 32-bit), "
                                f"got {buffer}")
        object.__setattr__(self, "buffer", buffer)
        object.__setattr__(self, "reserve_newest", _flag("reserve_newest", self.reserve_newest))
        seed = _whole("seed", self.seed)
        if not 0 <= seed <= MAX_SEED:
            raise HisparseError(f"seed must be from 0 to 2**32 - 1 = {MAX_SEED} (the random policy's generator "
                                f"takes a 32-bit seed), got {seed}")
        object.__setattr__(self, "seed", seed)
        for name in ("ways", "mtp_steps"):
            value = _whole(name, getattr(self, name))
            if value < 1:
                raise HisparseError(f"{name} must be >= 1, got {value}")
            object.__setattr__(self, name, value)
        if self.mtp_steps > 1 and not self.batched:
            raise HisparseError(f"mtp_steps {self.mtp_steps} groups batched steps; sequential replays one access "
                                "at a time")
        if self.mtp_steps > 1 and not self.placed:
            raise HisparseError(f"mtp_steps {self.mtp_steps}: only "
                                f"{', '.join(e.name for e in REGISTRY if e.placed)} group steps into commits")
        if self.policy in SHARDED and buffer % self.ways:
            raise HisparseError(f"buffer {buffer} is not a whole number of shards of {self.ways} ways "
                                f"(policy {self.policy}: buffer = shards x ways)")

    @property
    def stateful(self) -> bool:
        """Whether the engine replays it (else it is counted directly: none, static-prefix)."""
        return self.policy in POLICY_IDS

    @property
    def placed(self) -> bool:
        """Whether the policy places its loads itself (``step.run_placed``: salru, sglang-clock)."""
        return self.stateful and REGISTRY[POLICY_IDS[self.policy]].placed

    @property
    def param(self) -> int:
        """The placed policy's parameter (the step loop's g[4]): ways per shard for salru."""
        return self.ways if self.policy in SHARDED else 0

    @property
    def batched(self) -> bool:
        return self.semantics is Semantics.BATCHED

    @property
    def prefix(self) -> bool:
        return self.initial is Initial.PREFIX

    def check_k(self, k: int) -> None:
        """A batched step needs room for all its entries: HiSparse requires buffer >= top_k."""
        if self.batched and self.stateful and self.buffer < k:
            raise HisparseError(f"buffer {self.buffer} is smaller than k = {k}: a batched step needs "
                                f"room for all its entries (HiSparse requires device_buffer_size >= top_k)")


def option_types() -> dict[str, type]:
    """Each field's plain type (an enum field as ``str``), for options read from files (sweeps)."""
    hints = typing.get_type_hints(ReplayConfig)
    return {f.name: (str if isinstance(hints[f.name], type) and issubclass(hints[f.name], StrEnum)
                     else hints[f.name]) for f in fields(ReplayConfig)}


def expand_configs(policies: typing.Iterable[str], buffers: typing.Iterable[int], **common: Any) -> list[ReplayConfig]:
    """Every policy x buffer, with the other fields in common. Each buffer is checked as
    ``ReplayConfig`` checks it (a fractional one is refused, not truncated)."""
    for name, value in (("policies", policies), ("buffers", buffers)):
        if isinstance(value, str | bytes) or not isinstance(value, typing.Iterable):
            raise HisparseError(f"{name} must be a list, got {value!r} (e.g. expand_configs(['lru'], [4096]))")
    buffers = list(buffers)
    return [ReplayConfig(policy=p, buffer=b, **common) for p in policies for b in buffers]

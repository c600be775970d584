"""In-memory trace model: one stream is the top-k history of one (request, layer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np

FORMAT_VERSION = 3  # 2: checksums over the header and each chunk header; 3: coding 3 (1 and 2 are still read)
PAD = -1


class StreamKey(NamedTuple):
    request: int
    layer: int


@dataclass
class Stream:
    """Decode steps of one (request, layer).

    ``indices`` is int32 [steps, width]: row t holds the positions selected at step t, in their
    stored order, padded with -1 at the end. ``ctx_len`` is int64 [steps]: tokens in context at
    step t, the newest (position ctx_len - 1) included. Row t is step ``first_step + t``.
    """

    request: int
    layer: int
    ctx_len: np.ndarray
    indices: np.ndarray
    first_step: int = 0  # the step number of row 0 (a hook may start writing a request mid-decode)

    @property
    def key(self) -> StreamKey:
        return StreamKey(self.request, self.layer)

    @property
    def steps(self) -> int:
        return int(self.indices.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """Selected entries per step (the non-padding prefix of each row)."""
        return (self.indices >= 0).sum(axis=1)

    @property
    def accesses(self) -> int:
        import numpy as np
        return int(np.count_nonzero(self.indices >= 0))

    def step(self, t: int) -> np.ndarray:
        """The selected positions of step t (no padding)."""
        row = self.indices[t]
        return row[row >= 0]


@dataclass
class TraceMeta:
    """What a trace file says about itself.

    ``source`` says where the trace came from: for recorded traces ``{"kind": "recorded",
    "model": ..., "text": ...}``; for synthetic ones ``{"kind": "synthetic", "generator": ...,
    "knobs": {...}, "seed": ...}``.
    """

    k: int
    source: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format_version": self.format_version, "k": self.k, "source": self.source, "extra": self.extra}

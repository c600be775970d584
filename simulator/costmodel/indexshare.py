"""IndexShare prefetch: how much of the shared layers' swap-in hides behind the compute before them.

Read from SGLang (PR #28523 "Support IndexCache shared layer IO overlap", PR #29637 "enable hisparse
prefetch utilizing IndexShare for GLM-5.2", ``managers/hisparse_coordinator.py``):

- every layer has its own MLA KV rows, hot buffer and LRU (``req_device_buffer_tokens``,
  ``lru_slots`` are ``[layer_num, ...]``); a shared layer attends with its anchor's top-k, so it swaps
  the same token set into its own buffer. Its access sequence is the anchor's, its buffer starts as
  the anchor's, so its hits and misses equal the anchor's (``replay`` counts them per group);
- an anchor's swap-in is on the critical path (its top-k is known only after its own indexer);
- once the anchor's top-k is known, a side CUDA stream runs the swap-in of each following shared
  layer, one after another; a shared layer waits on its copy's event before its attention. The
  copies overlap the anchor's attention and MLP and the shared layers' own compute before them.
  ``SGLANG_DISABLE_HISPARSE_PREFETCH`` turns it off; it is off under pipeline parallelism (the
  ``pp_size != 1`` guard that PR #36331 describes).

The timeline of one group (anchor ``a``, shared layers ``1..s``), from the anchor's top-k (t = 0):
main stream: the anchor's swap-in ``X``, its attention and the rest of its layer ``A``, then each
shared layer's work before attention ``pre``, its wait, its attention and the rest ``P``. Side stream:
the shared layers' swap-in kernels ``K_j`` back to back, after the anchor's (one host link: its copy
goes first, INFERRED: the side stream could start with it and share the link, which only reorders
the same bytes). Shared layer j waits ``max(0, done_j - ready_j)``; hidden = sum K_j - sum waits, i.e.
each copy hides min(its time, the compute still in front of it). Nothing here is a chosen fraction.
Left out: the side-stream kernel's SMs slowing the main stream's kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def groups(anchor_of: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
    """(anchor, its shared layers in order) for every anchor layer."""
    out: dict[int, list[int]] = {}
    for layer, anchor in enumerate(anchor_of):
        out.setdefault(anchor, [])
        if anchor != layer:
            out[anchor].append(layer)
    return [(a, tuple(s)) for a, s in out.items()]


@dataclass(frozen=True)
class LayerTimes:
    """One layer's main-stream seconds around its attention (numbers or arrays over steps):
    ``pre`` the work of a shared layer before its attention (norms, projections; no indexer),
    ``post`` its attention and everything after it (o_proj, MLP, collectives), ``swap`` one layer's
    swap-in kernel (launch, bookkeeping, missed rows over the host link)."""

    pre: Any
    post: Any
    swap: Any


def hidden_per_group(t: LayerTimes, shared: int) -> Any:
    """Seconds of ``shared`` layers' swap-in the side stream hides in one group (every layer alike)."""
    swap = np.asarray(t.swap, dtype=float)
    side_done = swap.copy()  # the anchor's copy first on the link
    main = swap + np.asarray(t.post, dtype=float)  # the anchor's swap-in and the rest of its layer
    waits = np.zeros_like(main)
    for _ in range(shared):
        side_done = side_done + swap
        ready = main + np.asarray(t.pre, dtype=float)
        wait = np.maximum(side_done - ready, 0.0)
        waits = waits + wait
        main = ready + wait + np.asarray(t.post, dtype=float)
    return shared * swap - waits


def hidden_swap(anchor_of: Sequence[int], t: LayerTimes) -> Any:
    """Seconds of a step's swap-in hidden by the prefetch: the sum over the groups."""
    total: Any = 0.0
    for _, shared in groups(anchor_of):
        if shared:
            total = total + hidden_per_group(t, len(shared))
    return total

"""Small builders shared by the tests."""

from __future__ import annotations

import numpy as np

from simulator.trace import Stream


def random_stream(rng: np.random.Generator, *, steps: int = 50, k: int = 64, ctx0: int = 300,
                  overlap: float = 0.9, request: int = 0, layer: int = 0, ragged: bool = False) -> Stream:
    """A valid stream whose adjacent steps share about ``overlap`` of their entries."""
    ctx = ctx0 + np.arange(steps, dtype=np.int64)
    rows = np.full((steps, k), -1, dtype=np.int32)
    cur = rng.choice(ctx0, size=k, replace=False)
    for t in range(steps):
        n_new = int(round((1 - overlap) * k))
        keep = rng.choice(cur, size=k - n_new, replace=False)
        pool = np.setdiff1d(np.arange(ctx[t]), keep)
        cur = np.r_[keep, rng.choice(pool, size=n_new, replace=False)]
        rng.shuffle(cur)
        n = int(rng.integers(k // 2, k + 1)) if ragged else k
        rows[t, :n] = cur[:n]
    return Stream(request, layer, ctx, rows)

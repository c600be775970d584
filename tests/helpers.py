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


def decode_pass(cost, batch: int, ctx_sum, *, active: int | None = None, missed_rows=None):
    """``cost.pass_time`` of a decode pass: ``batch`` requests whose contexts sum to ``ctx_sum`` (an
    array: one step each) on ``active`` of the instance's schedulers (default all), the rest idle;
    ``missed_rows`` per rank turns HiSparse on."""
    from simulator.costmodel import Pass, RankWork

    ranks = cost.d.ranks_per_instance
    active = ranks if active is None else active
    steps = int(np.size(ctx_sum))
    work = (RankWork(batch, ctx_sum, missed_rows),) * active + (RankWork(),) * (ranks - active)
    return cost.pass_time(Pass(work, hisparse=missed_rows is not None, steps=steps))


def prefill_pass(cost, tokens: int, prior_ctx: int, *, hisparse: bool = False) -> float:
    """Seconds of a pass in which every scheduler of the instance prefills a chunk alike."""
    from simulator.costmodel import Pass, RankWork

    work = (RankWork(chunks=((tokens, prior_ctx),)),) * cost.d.ranks_per_instance
    return float(cost.pass_time(Pass(work, hisparse=hisparse)).total_s[0])


def prefill_rank_side(cost, tokens: int, prior_ctx: int) -> float:
    """One rank's own part of a prompt chunk, composed by hand: its attention-side ops at the
    chunk's tokens, the indexer and sparse attention over the chunk's context."""
    return (sum(cost.attention_fixed(tokens).values()) + cost.prefill_indexer(tokens, prior_ctx)
            + cost.prefill_attention(tokens, prior_ctx))

"""The attention kernel's shape sequence in one process, plain calls then CUDA-graph replays.

Issue #27 item 5: once, a B 128 graph replay right after a B 64 run in the same process ended in
``cudaErrorIllegalInstruction``. ``run_sequence`` repeats what that process did, for every
shape in order (B 64 then 128, H 8 / 16 / 128, FP8 and bf16 rows): fresh inputs, one plain call,
a graph captured over ``calls`` calls on rotating input sets and replayed ``replays`` times;
every replay's output must equal the plain call's bit for bit (the kernels are deterministic:
fixed split plan, fixed combine order) and be finite. It is the body of the GPU test
(tests/test_attention_sequence_gpu.py) and of the sanitizer runs (benchmarks/kernel_session.sh
step ``sanitize-seq``: memcheck, racecheck, initcheck, synccheck over the same process).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .mla_reference import D_LATENT, D_QK, FP8_ROW_BYTES
from .sparse_attention import sparse_mla_decode, workspace_elems

DEFAULT_SHAPES = tuple((kv, b, h) for kv in ("fp8", "bf16") for b in (64, 128) for h in (8, 16, 128))


class SequenceResult(NamedTuple):
    kv_dtype: str
    batch: int
    heads: int
    replays: int
    max_diff: int  # largest |replay - plain| over the output's bf16 bit patterns (0: identical)
    finite: bool


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _pool(rng: np.random.Generator, n_rows: int, kv_dtype: str) -> np.ndarray:
    if kv_dtype == "bf16":
        return _bf16(rng.standard_normal((n_rows, D_QK), dtype=np.float32))
    pool = np.empty((n_rows, FP8_ROW_BYTES), np.uint8)
    mag = rng.integers(0, 0x7F, (n_rows, D_LATENT), dtype=np.uint8)  # no NaN code
    pool[:, :D_LATENT] = mag | (rng.integers(0, 2, mag.shape, dtype=np.uint8) << 7)
    pool[:, D_LATENT:D_LATENT + 16] = rng.uniform(0.001, 0.01, (n_rows, 4)).astype(np.float32).view(np.uint8)
    pool[:, D_LATENT + 16:] = _bf16(rng.standard_normal((n_rows, 64), dtype=np.float32)).view(np.uint8)
    return pool


def run_shape(kv_dtype: str, batch: int, heads: int, *, k: int = 2048, calls: int = 2, replays: int = 3,
              seed: int = 0, variant: str | None = None) -> SequenceResult:
    """Inputs are drawn on the host (numpy) so that under a sanitizer almost only the attention
    kernels run on the GPU; one pool of 4k rows serves every request (k distinct rows each).
    variant: the wide kernel's (sparse_mla_decode's argument; None: the default), used where it
    runs (WIDE_VARIANTS[v].runs), else the default."""
    from .sparse_attention import WIDE_VARIANTS

    if variant is not None and not WIDE_VARIANTS[variant].runs(kv_dtype, heads):
        variant = None
    import cupy as cp

    rng = np.random.default_rng(seed)
    pool = cp.asarray(_pool(rng, 4 * k, kv_dtype))
    scale = 1.0 / D_QK ** 0.5
    sets = []
    for _ in range(calls):
        q = cp.asarray(_bf16(rng.standard_normal((batch, heads, D_QK), dtype=np.float32)))
        slots = np.argsort(rng.random((batch, 4 * k)), axis=1)[:, :k].astype(np.int32)
        slots[:, -3:] = -1  # masked entries, as padding
        sets.append((q, cp.asarray(slots), cp.empty((batch, heads, D_LATENT), cp.uint16),
                     cp.empty((batch, heads), cp.float32), cp.empty(workspace_elems(batch, heads, k), cp.float32)))
    stream = cp.cuda.Stream(non_blocking=True)
    max_diff, finite = 0, True
    with stream:  # plain calls on the capture stream first (its memory-pool blocks exist before capture)
        want = []
        for q, slots, out, lse, ws in sets:
            sparse_mla_decode(q, pool, slots, scale, kv_dtype, out=out, lse=lse, workspace=ws, variant=variant)
            want.append((out.copy(), lse.copy()))
        for s in sets:
            s[2].fill(0xFFFF)  # poison: a replay that writes nothing cannot pass
        stream.synchronize()
        stream.begin_capture()
        for q, slots, out, lse, ws in sets:
            sparse_mla_decode(q, pool, slots, scale, kv_dtype, out=out, lse=lse, workspace=ws, variant=variant)
        graph = stream.end_capture()
        for _ in range(replays):
            graph.launch(stream)
            stream.synchronize()
            for (_q, _s, out, lse, _w), (w_out, w_lse) in zip(sets, want, strict=True):
                d = cp.abs(out.astype(cp.int32) - w_out.astype(cp.int32)).max()
                max_diff = max(max_diff, int(d))
                finite &= bool(cp.isfinite(lse).all()) and bool(cp.array_equal(lse, w_lse))
            for s in sets:
                s[2].fill(0xFFFF)
    return SequenceResult(kv_dtype, batch, heads, replays, max_diff, finite)


def run_sequence(shapes: tuple = DEFAULT_SHAPES, **kw: Any) -> list[SequenceResult]:
    """Every shape in order, in this process (the order is the point: B 64 before B 128)."""
    import cupy as cp

    out = []
    for kv, b, h in shapes:
        out.append(run_shape(kv, b, h, **kw))
        cp.cuda.Device().synchronize()  # a fault surfaces here, naming the shape just run
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="attention shapes in one process: plain calls, graph replays")
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2, help="calls (input sets) per graph")
    ap.add_argument("--repeat", type=int, default=1, help="the whole sequence this many times")
    ap.add_argument("--shapes", default=None, help="comma list of kv:B:H (default: the whole sequence)")
    ap.add_argument("--variant", default=None, help="wide-kernel variant where it runs (default: the default)")
    args = ap.parse_args()
    shapes = DEFAULT_SHAPES if args.shapes is None else tuple(
        (kv, int(b), int(h)) for kv, b, h in (x.split(":") for x in args.shapes.split(",")))
    for rep in range(args.repeat):
        for r in run_sequence(shapes, replays=args.replays, calls=args.calls, seed=rep, variant=args.variant):
            print(f"rep {rep} {r.kv_dtype:4s} B {r.batch:3d} H {r.heads:3d}: {r.replays} replays, "
                  f"max diff {r.max_diff}, finite {r.finite}", flush=True)

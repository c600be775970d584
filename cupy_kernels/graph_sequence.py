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


def _bf16(cp: Any, x: Any) -> Any:
    u = x.view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


def _pool(cp: Any, n_rows: int, kv_dtype: str) -> Any:
    if kv_dtype == "bf16":
        return _bf16(cp, cp.random.standard_normal((n_rows, D_QK), dtype=cp.float32))
    pool = cp.empty((n_rows, FP8_ROW_BYTES), cp.uint8)
    mag = cp.random.randint(0, 0x7F, (n_rows, D_LATENT), dtype=cp.uint8)  # no NaN code
    pool[:, :D_LATENT] = mag | (cp.random.randint(0, 2, mag.shape, dtype=cp.uint8) << 7)
    pool[:, D_LATENT:D_LATENT + 16] = cp.random.uniform(0.001, 0.01, (n_rows, 4)).astype(cp.float32).view(cp.uint8)
    pool[:, D_LATENT + 16:] = _bf16(cp, cp.random.standard_normal((n_rows, 64), dtype=cp.float32)).view(cp.uint8)
    return pool


def run_shape(kv_dtype: str, batch: int, heads: int, *, k: int = 2048, calls: int = 2, replays: int = 3,
              seed: int = 0) -> SequenceResult:
    import cupy as cp

    cp.random.seed(seed)
    region = 2 * k
    pool = _pool(cp, calls * batch * region, kv_dtype)
    scale = 1.0 / D_QK ** 0.5
    sets = []
    for c in range(calls):
        q = _bf16(cp, cp.random.standard_normal((batch, heads, D_QK), dtype=cp.float32))
        pick = cp.argsort(cp.random.random((batch, region)), axis=1)[:, :k]
        slots = cp.ascontiguousarray(((c * batch + cp.arange(batch)[:, None]) * region + pick).astype(cp.int32))
        slots[:, -3:] = -1  # masked entries, as padding
        sets.append((q, slots, cp.empty((batch, heads, D_LATENT), cp.uint16), cp.empty((batch, heads), cp.float32),
                     cp.empty(workspace_elems(batch, heads, k), cp.float32)))
    want = []
    for q, slots, out, lse, ws in sets:
        sparse_mla_decode(q, pool, slots, scale, kv_dtype, out=out, lse=lse, workspace=ws)
        want.append((out.copy(), lse.copy()))
    stream = cp.cuda.Stream(non_blocking=True)
    max_diff, finite = 0, True
    with stream:
        for s in sets:
            s[2].fill(0xFFFF)  # poison: a replay that writes nothing cannot pass
        stream.begin_capture()
        for q, slots, out, lse, ws in sets:
            sparse_mla_decode(q, pool, slots, scale, kv_dtype, out=out, lse=lse, workspace=ws)
        graph = stream.end_capture()
        for _ in range(replays):
            graph.launch(stream)
            stream.synchronize()
            for (_q, _s, out, lse, _w), (w_out, w_lse) in zip(sets, want, strict=True):
                d = cp.abs(out.astype(cp.int32) - w_out.astype(cp.int32)).max()
                max_diff = max(max_diff, int(d))
                finite &= bool(cp.isfinite(lse).all()) and bool(cp.array_equal(lse, w_lse))
            for _q, _s, out, _l, _w in sets:
                out.fill(0xFFFF)
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
    ap.add_argument("--repeat", type=int, default=1, help="the whole sequence this many times")
    args = ap.parse_args()
    for rep in range(args.repeat):
        for r in run_sequence(replays=args.replays, seed=rep):
            print(f"rep {rep} {r.kv_dtype:4s} B {r.batch:3d} H {r.heads:3d}: {r.replays} replays, "
                  f"max diff {r.max_diff}, finite {r.finite}", flush=True)

"""Timings behind the step terms (``hisparse calibrate``, on a GPU): every GEMM of a GLM-5.1 and a
DeepSeek-V3.2 layer at the per-GPU shapes over batch sizes, elementwise kernels over sizes, the
lightning indexer over batch x context, and the per-kernel cost inside a CUDA graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..costmodel.ops import GROUPED_KINDS, Layout, layer_ops, moe_ops, step_head_ops
from . import grids
from .measure import time_queued
from .model_shapes import SHAPES
from .op_kernels import OpKernels, copy_kernel

GEMM_KINDS = ("gemm", "batched_gemm", "grouped_gemm", "grouped_gemm_tp")


def _progress(msg: str) -> None:
    print(msg, flush=True)


def gemm_table(cp: Any, torch: Any, batches=grids.STEP_BATCHES, models=grids.STEP_MODELS, reps: int = 10,
               layout: Layout | None = None) -> pd.DataFrame:
    """Median us of each distinct GEMM of a decode layer (dense and MoE) and the lm_head."""
    layout = layout or Layout()
    rows, seen = [], set()
    kernels = OpKernels(cp, torch, seed=3)
    for model in models:
        m = SHAPES[model]
        for b in batches:
            ops = layer_ops(m, b, b * 32768.0, layout) + layer_ops(m, b, b * 32768.0, layout, dense=True)[-3:]
            ops += step_head_ops(m, b, layout)
            for op in ops:
                if op.kind not in GEMM_KINDS:
                    continue
                key = (op.kind, op.dtype, op.m, op.k, op.n, op.groups, round(op.weight_groups, 3))
                if key in seen:
                    continue
                seen.add(key)
                fn = kernels.build(op)
                us = time_queued(cp, fn, reps)
                rows.append(dict(model=model, batch=b, name=op.name, kind=op.kind, dtype=op.dtype, m=op.m, k=op.k,
                                 n=op.n, groups=op.groups, weight_groups=op.weight_groups, tokens=op.tokens,
                                 flops=op.flops, bytes=op.bytes, us=us, impl=kernels.impl[op.name]))
                _progress(f"{model:13s} B {b:3d} {op.name:22s} {op.kind:12s} {op.dtype}: {us:8.1f} us "
                          f"({op.bytes / us / 1e3:6.0f} GB/s, {op.flops / us / 1e6:6.1f} TFLOP/s)")
                del fn
    return pd.DataFrame(rows)


def grouped_tp_table(cp: Any, torch: Any, tokens=grids.TP_MOE_TOKENS, ep_tokens=grids.TP_MOE_EP_CONTROL_TOKENS,
                     models=grids.STEP_MODELS, reps: int = 20, tp: int = grids.TP_MOE_TP) -> pd.DataFrame:
    """Median us of the routed experts' grouped FP8 GEMMs (gate_up, down) in SGLang's TP fused-MoE
    layout (``Layout.of(tp, tp, "tp")``: all experts on every GPU, each expert's intermediate split
    ``tp`` ways) over the node tokens of a decode step (the DP-attention gather: ``tp`` ranks x
    batch), uniform top-k routing; plus EP-layout (whole experts, E / tp per GPU) controls at
    ``ep_tokens``, timed the same way in the same run (``layout`` column)."""
    rows = []
    kernels = OpKernels(cp, torch, seed=11)
    for model in models:
        m = SHAPES[model]
        for layout_name, grid, layout in (("tp", tokens, Layout.of(tp, tp, "tp")), ("ep", ep_tokens, Layout.of(tp, tp, "ep"))):
            for t in grid:
                if t % layout.attention_dp:
                    raise ValueError(f"grouped_tp_table: node tokens {t} is not a multiple of {layout.attention_dp} ranks")
                for op in moe_ops(m, t // layout.attention_dp, layout):
                    if op.kind not in GROUPED_KINDS:
                        continue
                    fn = kernels.build(op)
                    us = time_queued(cp, fn, reps)
                    rows.append(dict(model=model, layout=layout_name, node_tokens=t, name=op.name, kind=op.kind,
                                     dtype=op.dtype, m=op.m, k=op.k, n=op.n, groups=op.groups,
                                     weight_groups=op.weight_groups, tokens=op.tokens, flops=op.flops, bytes=op.bytes,
                                     us=us, reps=reps, impl=kernels.impl[op.name]))
                    _progress(f"{model:13s} {layout_name} T {t:5d} {op.name:15s} K {op.k:5d} N {op.n:5d} "
                              f"experts {op.weight_groups:6.1f}: {us:8.1f} us ({op.bytes / us / 1e3:6.0f} GB/s, "
                              f"{op.flops / us / 1e6:6.1f} TFLOP/s) [{kernels.impl[op.name]}]")
                    del fn
                    torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def elementwise_table(cp: Any, sizes=grids.ELEMENTWISE_BYTES, per_graph: int = 20, reps: int = 10) -> pd.DataFrame:
    """us per copy kernel of ``size`` bytes read (and written) inside a CUDA graph of
    ``per_graph`` of them (the serving engine replays graphs)."""
    rows = []
    kern = copy_kernel(cp)
    src = cp.random.randint(0, 2**62, max(sizes) // 4, dtype=cp.int64).view(cp.uint64)
    dst = cp.empty_like(src)
    for size in sizes:
        w = size // 8
        views = [(src[(i % 2) * w:(i % 2 + 1) * w], dst[(i % 2) * w:(i % 2 + 1) * w]) for i in range(per_graph)]
        us = _graph_us(cp, lambda v=views: [kern(s, d) for s, d in v], reps) / per_graph
        rows.append(dict(bytes=2 * size, us=us, kernels_per_graph=per_graph))
        _progress(f"elementwise copy {size:>9d} B: {us:6.2f} us per kernel in a graph")
    return pd.DataFrame(rows)


def graph_launch_table(cp: Any, counts=grids.GRAPH_KERNELS, reps: int = 10) -> pd.DataFrame:
    """Replay time of a graph of N tiny kernels (a 256 B copy each), over N."""
    kern = copy_kernel(cp)
    src = cp.random.randint(0, 2**62, 32, dtype=cp.int64).view(cp.uint64)
    dst = cp.empty_like(src)
    rows = []
    for n in counts:
        us = _graph_us(cp, lambda n=n: [kern(src, dst) for _ in range(n)], reps)
        rows.append(dict(kernels=n, us=us))
        _progress(f"graph of {n:4d} tiny kernels: {us:8.1f} us ({us / n:.2f} us each)")
    return pd.DataFrame(rows)


def _graph_us(cp: Any, body, reps: int) -> float:
    """Median replay time (us) of a CUDA graph captured from ``body`` on a side stream."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        body()  # warm: module loads outside the capture
        stream.synchronize()
        stream.begin_capture()
        body()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            graph.launch(stream)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    return float(np.median(times))


def indexer_table(cp: Any, grid: dict = grids.INDEXER_GRID, reps: int = 10, seed: int = 5) -> pd.DataFrame:
    """Median us of one indexer call (score + exact top-2048) over batch x context x heads."""
    from cupy_kernels.indexer import HEAD_DIM, ROW_BYTES, lightning_indexer, random_key_rows

    per_set_max = max(grid["batch"]) * max(grid["ctx"])
    pool = random_key_rows(cp, per_set_max + 4 * max(grid["ctx"]) * 8, seed=seed)
    rng = np.random.default_rng(seed)
    rows = []
    for qd in grid["q_dtype"]:
        for h in grid["heads"]:
            for b in grid["batch"]:
                for ctx in grid["ctx"]:
                    per = b * ctx
                    sets = max(1, min(8, pool.shape[0] // per, -(-(256 << 20) // (per * ROW_BYTES))))
                    keys = [pool[i * per:(i + 1) * per].reshape(b, ctx, ROW_BYTES) for i in range(sets)]
                    q = cp.asarray(rng.integers(0x20, 0x50, (b, h, HEAD_DIM), dtype=np.uint8)) if qd == "fp8" else \
                        cp.asarray(rng.integers(0x3C00, 0x3F00, (b, h, HEAD_DIM), dtype=np.uint16))
                    w = cp.asarray(rng.uniform(-0.5, 1.0, (b, h)).astype(np.float32))
                    c = cp.full(b, ctx, cp.int32)
                    sc, out = cp.empty((b, ctx), cp.float32), cp.empty((b, 2048), cp.int32)
                    us = time_queued(cp, rotating(lightning_indexer, keys, q, w, c, out=out, scores=sc), reps)
                    rows.append(dict(batch=b, ctx=ctx, heads=h, q_dtype=qd, us=us, key_bytes=per * ROW_BYTES))
                    _progress(f"indexer {qd} H {h} B {b:3d} ctx {ctx:6d}: {us:8.1f} us "
                              f"({per * ROW_BYTES / us / 1e3:6.0f} GB/s of keys)")
    return pd.DataFrame(rows)


def rotating(fn, keys: list, *args, **kw):
    """fn(keys[i % len(keys)], *args, **kw) for i = 0, 1, 2, ...: each call reads other rows."""
    state = [0]

    def call():
        state[0] += 1
        return fn(keys[state[0] % len(keys)], *args, **kw)
    return call

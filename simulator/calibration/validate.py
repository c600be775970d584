"""``hisparse validate``: trace streams through the real kernels in a full per-layer decode loop
(swap-in, then attention, real rows in pinned host memory), against the fitted cost model's
prediction for the same steps, on configurations the fit did not use."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

K = 2048


def predicted_step_s(cost, misses_per_layer: np.ndarray, batch: int) -> float:
    """The serving model's kernel terms for one decode step: per layer, one swap-in launch with
    that layer's missed rows, then one attention launch for the batch."""
    return float(sum(cost.swap_in_layer(m, batch) + cost.attention(batch) for m in misses_per_layer))



def topk_by_step(streams, layers: int) -> np.ndarray:
    """Generated streams as one [steps, layers, requests, k] array: each step's rows contiguous, as
    the decode loops hand them to the kernels."""
    idx = np.stack([np.stack([s.indices for s in streams if s.layer == lyr]) for lyr in range(layers)])  # [L,R,T,K]
    return np.ascontiguousarray(idx.transpose(2, 0, 1, 3))


def fill_host_rows(hb: Any, layers: int, rng: np.random.Generator) -> None:
    """Fill every layer's host rows with finite bf16/fp8 bytes (never zeros: zeros hide unwritten
    rows), one random block repeated, drawn from ``rng`` (the loops draw their queries after it)."""
    block = rng.integers(0, 0x3F, 1 << 24, dtype=np.uint8)
    for lyr in range(layers):
        flat = hb.host_rows(lyr).reshape(-1)
        for start in range(0, flat.size, block.size):
            n = min(block.size, flat.size - start)
            flat[start:start + n] = block[:n]


def engine_misses(streams, shape: tuple[int, int, int], hot: int) -> np.ndarray:
    """The replay engine's misses [step, layer, request] for the loops' streams under HiSparse's
    batched LRU (reserved newest slot, prefix start): what the swap-in kernel must count."""
    from ..replay.engine import replay_policy

    engine = np.zeros(shape, np.int64)
    for s in streams:
        engine[:, s.layer, s.request] = replay_policy("lru", s.indices, s.ctx_len, hot, reserve=True, prefix=True,
                                                      batched=True, seed=0).misses
    return engine

def run_config(cp: Any, pool: Any, cost, *, requests: int, layers: int, steps: int, hot: int, heads: int,
               row_bytes: int, seed: int) -> dict:
    """One configuration: measured and predicted time of every step, and the miss check."""
    from cupy_kernels.decode_step import decode_step
    from cupy_kernels.mla_reference import D_QK
    from cupy_kernels.swap_in import HotBuffer

    from ..trace.generator import PRESETS, generate
    from .measure import hold_stream

    ctx0 = 32768
    streams = list(generate(PRESETS["high-overlap"], steps=steps, layers=layers, requests=requests, k=K, ctx0=ctx0,
                            seed=seed))
    idx = topk_by_step(streams, layers)
    ctx = streams[0].ctx_len
    hb = HotBuffer(
        layers=layers, requests=requests, max_ctx=int(ctx[-1]) + 64, device_buffer_size=hot, top_k=K,
        row_bytes=row_bytes, pool=pool)
    rng = np.random.default_rng(seed)
    fill_host_rows(hb, layers, rng)
    hb.prefill()
    q = cp.asarray(rng.integers(0x3C00, 0x3F00, (requests, heads, D_QK), dtype=np.uint16))
    idx_gpu = cp.asarray(idx.astype(np.int32))
    measured, kernel_misses = [], np.zeros((steps, layers, requests), np.int64)
    for t in range(steps):
        ctx_t = cp.full(requests, int(ctx[t]), cp.int64)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        hold_stream(cp, 4000)  # the step's launches queue up behind it: e0..e1 is GPU time
        e0.record()
        results = [decode_step(hb, lyr, q, idx_gpu[t, lyr], ctx_t, 0.07, check=False) for lyr in range(layers)]
        e1.record()
        e1.synchronize()
        measured.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
        for lyr, res in enumerate(results):
            kernel_misses[t, lyr] = res.misses.get()
    engine = engine_misses(streams, kernel_misses.shape, hot)
    warm = 2  # the first steps include module loads and allocations
    result = {"requests": requests, "layers": layers, "steps": steps, "hot": hot, "heads": heads,
              "row_bytes": row_bytes, "misses_exact": bool((kernel_misses == engine).all()),
              "miss_share": float(engine.sum() / (steps * layers * requests * K)),
              "misses_per_layer": engine.sum(axis=2)[warm:].tolist(), "measured_s": measured[warm:]}
    return repredict(cost, result)


def repredict(cost, result: dict) -> dict:
    """(Re)compute a configuration's predicted step times from its stored misses (no GPU)."""
    model = dataclasses.replace(cost.m, layers=result["layers"], attention_heads=result["heads"],
                                kv_row_bytes=result["row_bytes"])
    # the terms of the calibration being checked (cost.terms), never the packaged default's
    cfg_cost = type(cost)(model, cost.g, cost.d, cost.p, cost.terms)
    predicted = [predicted_step_s(cfg_cost, np.asarray(m, float), result["requests"]) for m in result["misses_per_layer"]]
    return result | {"predicted_s": predicted}

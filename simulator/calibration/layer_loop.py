"""``hisparse validate --loop layer``: full DSA decode layers at GLM-5.1's per-GPU shapes through
real kernels, against the step terms' prediction from ``costmodel.ops``.

One GPU of an 8-GPU DP-attention deployment, no communication: per layer, every op of
``ops.layer_ops`` runs as a kernel of its shape (``op_kernels``), with the lightning
indexer (our kernel, over every request's whole context of FP8 keys), then the swap-in kernel
and sparse attention (``decode_step``) at the attention op's place. The swap-in takes the
top-k of generated high-overlap trace streams (the indexer's top-k of random keys would be no
realistic access pattern), so its misses can be checked against the replay engine and priced
exactly. Steps are queued behind a spin kernel, so the measured time is GPU time, as a serving
engine's replayed CUDA graph runs it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..costmodel.ops import ABSORBED_BMM_DTYPE, Layout, layer_ops
from ..costmodel.terms import StepTerms
from .grids import LayerLoopConfig
from .model_shapes import GLM_5_1

K = 2048
WARM = 2  # the first steps include module loads and allocations


def absorbed_dtype(result: dict) -> str:
    """The absorbed bmm's dtype a stored run measured: its own record, else ``"fp8"`` (the runs
    committed before it was recorded timed ``bmm_fp8`` through ``torch._scaled_grouped_mm``, with the
    per-tensor quantisations before it)."""
    return str(result.get("absorbed_dtype", "fp8"))


def ran_q_concat(result: dict) -> bool:
    """Whether a stored run timed the q concatenation before FlashMLA (``ops.attention_ops``' ``q_concat``):
    its own record, else False (the runs committed before it was an op)."""
    return bool(result.get("q_concat", False))


def predicted_step_s(terms: StepTerms, cfg: dict, ctx: float, misses_per_layer) -> float:
    """costmodel.ops's ops at this step's contexts, priced by the fitted terms, plus each layer's
    swap-in with its missed rows."""
    m, layout, r = GLM_5_1, Layout(), cfg["requests"]
    total = 0.0
    for lyr, missed in enumerate(misses_per_layer):
        ops = layer_ops(m, r, r * float(ctx), layout, dense=lyr < cfg["dense"], kv_row_bytes=cfg["row_bytes"],
                        absorbed=absorbed_dtype(cfg), q_concat=ran_q_concat(cfg))
        total += terms.ops_time(ops, indexer_heads=m.indexer_heads, indexer_q="fp8")
        total += terms.swap_in_time(float(missed), r, cfg["row_bytes"])
    return total


def repredict_layers(terms: StepTerms, result: dict) -> dict:
    """(Re)compute a configuration's predictions from its stored contexts and misses (no GPU)."""
    pred = [predicted_step_s(terms, result, c, m) for c, m in zip(result["ctx"], result["misses_per_layer"], strict=True)]
    m, r = GLM_5_1, result["requests"]
    ops = layer_ops(m, r, r * float(result["ctx"][0]), Layout(), kv_row_bytes=result["row_bytes"],
                    absorbed=absorbed_dtype(result), q_concat=ran_q_concat(result))
    return result | {"predicted_s": pred,
                     "predicted_moe_layer_breakdown_us": {k: v * 1e6 for k, v in terms.breakdown(
                         ops, indexer_heads=m.indexer_heads, indexer_q="fp8").items()}}


def run_layer_config(cp: Any, torch: Any, pool: Any, terms: StepTerms, cfg: LayerLoopConfig, *, steps: int,
                     seed: int) -> dict:
    from cupy_kernels.decode_step import decode_step
    from cupy_kernels.indexer import (
        HEAD_DIM,
        ROW_BYTES,
        lightning_indexer,
        padded_stride,
        random_key_rows,
    )
    from cupy_kernels.mla_reference import D_QK
    from cupy_kernels.swap_in import HotBuffer

    from ..trace.generator import PRESETS, generate
    from .measure import hold_stream
    from .op_kernels import OpKernels
    from .validate import engine_misses, fill_host_rows, topk_by_step

    m, layout, R, L = GLM_5_1, Layout(), cfg.requests, cfg.layers
    print(f"layer loop: R {R}, ctx0 {cfg.ctx0}, L {L} ({cfg.dense} dense), hot {cfg.hot}, {cfg.row_bytes} B rows",
          flush=True)
    streams = list(generate(PRESETS["high-overlap"], steps=steps, layers=L, requests=R, k=K, ctx0=cfg.ctx0, seed=seed))
    idx_gpu = cp.asarray(topk_by_step(streams, L).astype(np.int32))  # [T, L, R, K]
    ctx = np.asarray(streams[0].ctx_len, np.int64)
    hb = HotBuffer(layers=L, requests=R, max_ctx=int(ctx[-1]) + 64, device_buffer_size=cfg.hot, top_k=K,
                   row_bytes=cfg.row_bytes, pool=pool)
    rng = np.random.default_rng(seed)
    fill_host_rows(hb, L, rng)
    hb.prefill()
    q_att = cp.asarray(rng.integers(0x3C00, 0x3F00, (R, m.attention_heads, D_QK), dtype=np.uint16))
    stride = padded_stride(int(ctx[-1]))
    keys = [random_key_rows(cp, R * stride, seed=seed * 31 + lyr).reshape(R, stride, ROW_BYTES) for lyr in range(L)]
    q_idx = cp.asarray(rng.integers(0x20, 0x50, (R, m.indexer_heads, HEAD_DIM), dtype=np.uint8))
    w_idx = cp.asarray(rng.uniform(-0.5, 1.0, (R, m.indexer_heads)).astype(np.float32))
    scores = cp.empty((R, stride), cp.float32)
    top = cp.empty((R, K), cp.int32)
    ctx32 = [cp.full(R, int(c), cp.int32) for c in ctx]
    ctx64 = [cp.full(R, int(c), cp.int64) for c in ctx]
    kernels = OpKernels(cp, torch, seed=seed)
    plan = []  # per layer: (op, launcher or None)
    for lyr in range(L):
        ops = layer_ops(m, R, R * float(ctx[0]), layout, dense=lyr < cfg.dense, kv_row_bytes=cfg.row_bytes)
        plan.append([(op, None if op.kind in ("indexer", "attention") else kernels.build(op, rotate=False))
                     for op in ops])
    cp.cuda.Device().synchronize()
    measured, host_s, kernel_misses = [], [], np.zeros((steps, L, R), np.int64)
    hold_us = 4000.0 + 2500.0 * L
    for t in range(steps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        hold_stream(cp, hold_us)
        e0.record()
        h0 = time.perf_counter()
        results = []
        for lyr in range(L):
            for op, fn in plan[lyr]:
                if op.kind == "indexer":
                    lightning_indexer(keys[lyr], q_idx, w_idx, ctx32[t], K, max_ctx=int(ctx[t]), out=top, scores=scores)
                elif op.kind == "attention":
                    results.append(decode_step(hb, lyr, q_att, idx_gpu[t, lyr], ctx64[t], 0.07, check=False))
                else:
                    fn()
        e1.record()
        host_s.append(time.perf_counter() - h0)
        e1.synchronize()
        measured.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
        for lyr, res in enumerate(results):
            kernel_misses[t, lyr] = res.misses.get()
    engine = engine_misses(streams, kernel_misses.shape, cfg.hot)
    del hb
    result = {"requests": R, "ctx0": cfg.ctx0, "layers": L, "dense": cfg.dense, "hot": cfg.hot,
              "row_bytes": cfg.row_bytes, "steps": steps, "misses_exact": bool((kernel_misses == engine).all()),
              "miss_share": float(engine.sum() / (steps * L * R * K)),
              "misses_per_layer": engine.sum(axis=2)[WARM:].tolist(), "ctx": ctx[WARM:].tolist(),
              "measured_s": measured[WARM:], "host_enqueue_s": host_s[WARM:], "hold_s": hold_us * 1e-6,
              "impl": kernels.impl, "absorbed_dtype": ABSORBED_BMM_DTYPE, "q_concat": True}
    out = repredict_layers(terms, result)
    err = np.abs(np.array(out["predicted_s"]) - np.array(out["measured_s"])) / np.array(out["measured_s"])
    print(f"  measured {np.median(out['measured_s']) * 1e3:.3f} ms/step, predicted "
          f"{np.median(out['predicted_s']) * 1e3:.3f}, median error {np.median(err):.1%}, host enqueue "
          f"{np.median(host_s) * 1e3:.2f} ms (hold {hold_us / 1e3:.1f} ms)", flush=True)
    return out

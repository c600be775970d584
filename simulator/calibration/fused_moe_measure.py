"""Timings of the TP fused-MoE routed experts with the mechanism SGLang runs (``hisparse calibrate
--terms fused-moe-tp``, on a GPU with PyTorch and Triton).

Under ``--tp 8 --dp 8 --enable-dp-attention`` with no EP flags, SGLang runs the routed experts
through its Triton fused MoE on Hopper (``Fp8MoEMethod.create_moe_runner`` in
``python/sglang/srt/layers/quantization/fp8.py``: ``auto`` -> ``TRITON`` without a DeepEP /
Mooncake all-to-all backend; DeepGEMM only with one; FlashInfer TRT-LLM is chosen automatically on
SM100 only). Each expert's intermediate is split over the 8 GPUs (GLM-5.1: 2048 -> 256 per GPU),
so a GPU runs gate_up K 6144 x N 512 and down K 256 x N 6144 over all 256 experts. This module
times our Triton kernel of that structure (``cupy_kernels.fused_moe``) at those shapes over the
node's tokens per step, for several tile configurations (a tuned deployment runs the best one per
token count; SGLang ships such a table per E, N, GPU and dtype), and ``torch._scaled_grouped_mm``
(the earlier timing tool, row-wise scales) on the same routing and weights in the same run.

Routing is uniform top-k with a seed per draw; each timed call uses the next of ``draws``
routing draws, so consecutive calls read mostly other experts (the weights, 0.4-0.8 GB per
GPU and layer, never sit in the 60 MB L2 between layers of a real step either). All data random.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cupy_kernels import fused_moe_reference as ref
from cupy_kernels.fused_moe import GROUP, BlockConfig

from .measure import time_queued
from .model_shapes import SHAPES

# node tokens of a decode step (the instance's; --max-running-requests 480) and a few prefill sizes
FUSED_MOE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 480, 1024, 2048, 4096)
FUSED_MOE_CONFIGS = (*(BlockConfig(m, n) for m in (16, 32, 64) for n in (64, 128)),
                     BlockConfig(16, 128, num_stages=4), BlockConfig(64, 128, num_stages=4))
FUSED_MOE_MODELS = ("glm-5.1",)
TP = 8
TRITON_IMPL = "triton_fused_moe"
SGMM_IMPL = "torch._scaled_grouped_mm"


def _progress(msg: str) -> None:
    print(msg, flush=True)


def slice_shapes(model: str, tp: int = TP) -> dict[str, tuple[int, int]]:
    """(K, N) of one GPU's gate_up and down slices of every routed expert."""
    m = SHAPES[model]
    inter = m.moe_intermediate_size // tp
    return {"routed_gate_up": (m.hidden_size, 2 * inter), "routed_down": (inter, m.hidden_size)}


class _Data:
    """One op's weights (all experts, one copy) and ``draws`` routings with their activations."""

    def __init__(self, torch: Any, gen: Any, experts: int, n: int, k: int) -> None:
        self.torch = torch
        self.w = (torch.randn(experts, n, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn)
        self.w_scale = torch.rand(experts, n // GROUP, k // GROUP, device="cuda", generator=gen) * 0.01 + 0.005
        self.w_rowscale = torch.rand(experts, n, device="cuda", generator=gen) * 0.01 + 0.005  # torch's row-wise
        self.experts, self.n, self.k = experts, n, k


def fused_moe_tp_table(torch: Any, tokens=FUSED_MOE_TOKENS, configs=FUSED_MOE_CONFIGS, models=FUSED_MOE_MODELS,
                       reps: int = 20, draws: int = 8, seed: int = 0, tp: int = TP, cp: Any = None) -> pd.DataFrame:
    """Median us of each routed-expert GEMM launch (gate_up, down) per node-token count, per Triton
    tile config and for ``torch._scaled_grouped_mm`` on the same data; one row each."""
    if cp is None:
        import cupy as cp
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    for model in models:
        m = SHAPES[model]
        e, top_k = m.experts, m.experts_per_token
        for name, (k, n) in slice_shapes(model, tp).items():
            data = _Data(torch, gen, e, n, k)
            for t in tokens:
                routes = [ref.uniform_routing(t, e, top_k, seed=seed * 100003 + t * 101 + d) for d in range(draws)]
                touched = float(np.mean([np.unique(ids).size for ids, _ in routes]))
                m_rows = t if name == "routed_gate_up" else t * top_k  # gate_up reads tokens, down the sorted rows
                acts = [(torch.randn(m_rows, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn)
                        for _ in range(draws)]
                a_scales = [torch.rand(m_rows, k // GROUP, device="cuda", generator=gen) * 0.01 + 0.005
                            for _ in range(draws)]
                rws = [torch.from_numpy(w.reshape(-1)).cuda() for _, w in routes]
                a_top_k = top_k if name == "routed_gate_up" else 1
                base = dict(model=model, layout="tp", node_tokens=t, name=name, dtype="fp8", k=k, n=n, groups=e,
                            top_k=top_k, experts_touched=touched, rows=t * top_k, draws=draws,
                            weight_bytes=touched * n * k, flops=2.0 * t * top_k * n * k, reps=reps)
                for cfg in configs:
                    us, padded = _time_triton(torch, cp, data, routes, acts, a_scales, rws, a_top_k, cfg, reps,
                                              down=name == "routed_down")
                    nbytes = _bytes(touched, n, k, t, top_k, name)
                    rows.append(base | dict(impl=TRITON_IMPL, config=cfg.label, block_m=cfg.block_m,
                                            block_n=cfg.block_n, block_k=cfg.block_k, num_warps=cfg.num_warps,
                                            num_stages=cfg.num_stages, swap_ab=cfg.swap_ab, padded_rows=padded,
                                            bytes=nbytes, us=us))
                    _progress(f"{model} T {t:5d} {name:15s} {cfg.label:26s} experts {touched:6.1f}: {us:8.1f} us "
                              f"({touched * n * k / us / 1e3:6.0f} GB/s of weights)")
                us, padded = _time_sgmm(torch, cp, data, routes, acts, reps, top_k, down=name == "routed_down")
                rows.append(base | dict(impl=SGMM_IMPL, config="", block_m=16, block_n=0, block_k=0, num_warps=0,
                                        num_stages=0, swap_ab=False, padded_rows=padded,
                                        bytes=_bytes(touched, n, k, t, top_k, name), us=us))
                _progress(f"{model} T {t:5d} {name:15s} {SGMM_IMPL:26s} experts {touched:6.1f}: {us:8.1f} us")
                del acts, a_scales
            del data
            torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    return mark_best(df)


def _bytes(touched: float, n: int, k: int, t: int, top_k: int, name: str) -> float:
    """HBM bytes of one launch: the touched experts' FP8 weights and block scales, the FP8
    activations and their scales (each source row once), the bf16 output rows."""
    src_rows = t if name == "routed_gate_up" else t * top_k
    return (touched * n * k + touched * (n // GROUP) * (k // GROUP) * 4 + src_rows * (k + k // GROUP * 4)
            + t * top_k * n * 2)


def mark_best(df: pd.DataFrame) -> pd.DataFrame:
    """``best`` = the fastest Triton config of each (model, op, node tokens)."""
    df = df.copy()
    df["best"] = False
    tri = df[df["impl"] == TRITON_IMPL]
    if len(tri):
        idx = tri.groupby(["model", "name", "node_tokens"])["us"].idxmin()
        df.loc[idx, "best"] = True
    return df


def _time_triton(torch, cp, data: _Data, routes, acts, a_scales, rws, a_top_k: int, cfg: BlockConfig, reps: int,
                 down: bool) -> tuple[float, int]:
    from cupy_kernels.fused_moe import fused_moe_gemm

    calls = []
    padded = []
    for (ids, _), a, s, rw in zip(routes, acts, a_scales, rws, strict=True):
        al = ref.align_block_size(ids, data.experts, cfg.block_m)
        padded.append(al.padded)
        dev = (torch.from_numpy(al.sorted_ids).cuda(), torch.from_numpy(al.expert_ids).cuda(),
               torch.tensor([al.padded], dtype=torch.int32, device="cuda"))
        out = torch.empty(al.valid, data.n, device="cuda", dtype=torch.bfloat16)
        calls.append((a, s, dev, out, rw if down else None))
    state = [0]

    def run():
        a, s, (sid, eid, pad), out, rw = calls[state[0] % len(calls)]
        state[0] += 1
        fused_moe_gemm(a, s, data.w, data.w_scale, sid, eid, pad, a_top_k, out, cfg, routed_weights=rw)
    us = time_queued(cp, run, reps, hold_us=10000.0, warmup=3)
    return us, int(np.mean(padded))


def _time_sgmm(torch, cp, data: _Data, routes, acts, reps: int, top_k: int, down: bool) -> tuple[float, int]:
    """``torch._scaled_grouped_mm`` on the same routing and weights: the touched experts' weights
    (copied once per draw into one tensor, untimed: its groups cannot be empty), each expert's
    rows gathered and padded to 16 (its offsets' alignment), row-wise scales."""
    calls = []
    padded = []
    for (ids, _), a in zip(routes, acts, strict=True):
        al = ref.align_block_size(ids, data.experts, 16)
        counts = np.bincount(ids.reshape(-1), minlength=data.experts)
        used = np.flatnonzero(counts)
        ends = np.cumsum(-(-counts[used] // 16) * 16).astype(np.int32)
        rows_sorted = al.sorted_ids[: al.padded]
        src = np.where(rows_sorted < al.valid, rows_sorted // (1 if down else top_k), 0)
        a_g = a[torch.from_numpy(src.astype(np.int64)).cuda()].contiguous()
        sa = torch.rand(a_g.shape[0], device="cuda") * 0.01 + 0.005
        sel = torch.from_numpy(used).cuda()
        w_t = data.w[sel].transpose(-2, -1)  # [touched, K, N], column-major
        padded.append(int(ends[-1]))
        calls.append((a_g, sa, w_t, data.w_rowscale[sel].contiguous(), torch.from_numpy(ends).cuda()))
    state = [0]

    def run():
        a_g, sa, w_t, sb, offs = calls[state[0] % len(calls)]
        state[0] += 1
        return torch._scaled_grouped_mm(a_g, w_t, sa, sb, offs=offs, out_dtype=torch.bfloat16)
    try:
        run()
        torch.cuda.synchronize()
    except RuntimeError as exc:  # an unsupported layout: recorded as NaN, not fatal
        _progress(f"torch._scaled_grouped_mm failed ({type(exc).__name__}: {str(exc)[:200]})")
        return math.nan, int(np.mean(padded))
    return time_queued(cp, run, reps, hold_us=10000.0, warmup=3), int(np.mean(padded))

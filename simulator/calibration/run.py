"""The measurement runs of ``hisparse calibrate`` (GPU), one per term group, each returning raw
tables; the command writes them as CSVs and fits them (``fitting``), so ``--refit`` redoes the
fit from the CSVs alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from . import grids

# raw tables, by the CSV name they are saved under (``<name>-<gpu>.csv``)
KERNEL_TABLES = ("swap_in", "attention")
STEP_TABLES = ("gemm", "elementwise", "indexer", "graph")
TP_MOE_TABLE = "grouped_tp"  # routed experts in the TP fused-MoE layout (optional: older runs lack it)
FUSED_MOE_TABLE = "fused_moe_tp"  # the same slices through the Triton fused MoE SGLang runs (optional)
OPTIONAL_STEP_TABLES = (TP_MOE_TABLE, FUSED_MOE_TABLE)


@dataclass(frozen=True)
class MeasureOptions:
    """What every measurement run takes: timed launches per point, the seed of its random inputs,
    and the pinned host pool the swap-in reads (GiB)."""

    iters: int = 10  # as hisparse calibrate's --iters, --seed and --pool-gib defaults
    seed: int = 0
    pool_gib: float = 8.0

    def __post_init__(self) -> None:
        if self.iters < 1 or self.pool_gib <= 0:
            raise ValueError(f"MeasureOptions: iters ({self.iters}) and pool_gib ({self.pool_gib}) must be positive")


def gpu_name(cp: Any) -> str:
    return cp.cuda.runtime.getDeviceProperties(0)["name"].decode()


def measure_kernels(opts: MeasureOptions) -> tuple[dict[str, pd.DataFrame], float, float]:
    """Swap-in (batch x misses x row size x hot-buffer size) and sparse attention (batch x heads
    x layout), and the host link / HBM copy bandwidth: (tables, link B/s, HBM B/s)."""
    import cupy as cp

    from cupy_kernels.swap_in import PinnedPool

    from ..costmodel.terms import ATTENTION_ROOFLINE
    from . import measure

    rng = np.random.default_rng(opts.seed)
    pool = PinnedPool(int(opts.pool_gib * (1 << 30)))
    link = measure.memcpy_gbps(cp, pool) * 1e9
    hbm = measure.hbm_gbps(cp) * 1e9
    print(f"pinned memcpy H2D {link / 1e9:.1f} GB/s, HBM copy {hbm / 1e9:.0f} GB/s", flush=True)
    g = grids.SWAP_GRID
    swap = []
    for b in g["batch"]:
        for hot in g["hot"]:
            for m in g["miss"]:
                for row in g["row_bytes"]:
                    us = measure.time_swap_in(cp, pool, batch=b, hot=hot, miss=m, row_bytes=row, ctx=grids.SWAP_CTX,
                                              iters=opts.iters, rng=rng)
                    swap.append(dict(batch=b, hot=hot, miss=m, row_bytes=row, rows=b * m, us=us))
                    print(f"swap-in bs {b:3d} hot {hot} misses {m:4d} row {row:4d}: {us:8.1f} us", flush=True)
    att = []
    for b in grids.ATT_GRID["batch"]:
        for h in grids.ATT_GRID["heads"]:
            for dt in grids.ATT_GRID["kv_dtype"]:
                us = measure.time_attention(cp, batch=b, heads=h, kv_dtype=dt, iters=opts.iters, rng=rng)
                row = 1152 if dt == "bf16" else 656
                att_bytes, att_flops = b * 2048 * row, 2 * b * h * 2048 * (576 + 512)
                roof = max(att_bytes / ATTENTION_ROOFLINE["hbm_bw"], att_flops / ATTENTION_ROOFLINE["bf16_flops"]) * 1e6
                att.append(dict(batch=b, heads=h, kv_dtype=dt, us=us, roofline_us=roof))
                print(f"attention B {b:3d} H {h:3d} {dt}: {us:8.1f} us (roofline {roof:.1f})", flush=True)
    return {"swap_in": pd.DataFrame(swap), "attention": pd.DataFrame(att)}, link, hbm


def measure_step(opts: MeasureOptions) -> dict[str, pd.DataFrame]:
    """Every GEMM of the layer at the models' per-GPU shapes, elementwise kernels, the indexer,
    and the per-kernel cost under CUDA graphs."""
    import cupy as cp
    import torch

    from . import step_measure as sm

    return {"graph": sm.graph_launch_table(cp, reps=opts.iters),
            "elementwise": sm.elementwise_table(cp, reps=opts.iters),
            "indexer": sm.indexer_table(cp, reps=opts.iters),
            "gemm": sm.gemm_table(cp, torch, reps=opts.iters),
            **measure_tp_moe(opts), **measure_fused_moe_tp(opts)}


def measure_tp_moe(opts: MeasureOptions) -> dict[str, pd.DataFrame]:
    """The routed experts' grouped FP8 GEMMs at the TP fused-MoE slice shapes over node tokens
    (with EP-layout controls), at least 10 timed launches each."""
    import cupy as cp
    import torch

    from . import step_measure as sm

    return {TP_MOE_TABLE: sm.grouped_tp_table(cp, torch, reps=max(opts.iters, 10))}


def measure_fused_moe_tp(opts: MeasureOptions) -> dict[str, pd.DataFrame]:
    """The TP slices through our Triton fused-MoE kernel (several tile configs) and
    ``torch._scaled_grouped_mm`` on the same data, over node tokens (at least 10 timed launches)."""
    import cupy as cp
    import torch

    from ..errors import HisparseError
    from .fused_moe_measure import fused_moe_tp_table

    try:
        import triton  # noqa: F401  (the kernel's compiler; PyTorch's CUDA wheels ship it)
    except ImportError:
        raise HisparseError("calibrate: the fused-MoE table needs Triton (pip install triton, or a CUDA build "
                            "of PyTorch, which ships it)") from None

    return {FUSED_MOE_TABLE: fused_moe_tp_table(torch, reps=max(opts.iters, 10), seed=opts.seed, cp=cp)}

"""Least-squares fits of the cost model's kernel parameters (CPU only: runs on saved CSVs).

- swap-in, one launch per layer: t = launch + rows x row_bytes / bandwidth, per row size; the
  launch cost and the gather efficiency (bandwidth / measured pinned memcpy) feed the model.
- attention, one launch per layer: t = launch + roofline / efficiency (roofline from the same
  formula the serving model uses).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def need_points(x: np.ndarray, n: int, what: str) -> None:
    """A least-squares line or plane needs ``n`` points that differ in its variable ``x`` (two
    for a line): fewer fit anything (one point: a zero launch cost with R^2 = 1)."""
    distinct = len(np.unique(np.asarray(x, float)))
    if distinct < n:
        raise ValueError(f"{what}: {distinct} distinct value(s), the fit needs at least {n}")


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """y = a + b x by least squares: (a, b, R^2)."""
    need_points(x, 2, "x")
    A = np.c_[np.ones_like(x), x]
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    pred = a + b * x
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return float(a), float(b), r2


def fit_swap_in(df: pd.DataFrame, link_bw: float) -> dict:
    """Per row size, t = launch + batch x per_request + bytes / bandwidth (one block per request
    does the bookkeeping, so it grows with the batch); launch and per-request costs are averaged
    over row sizes, the bandwidth gives the gather efficiency against pinned memcpy."""
    per_row = {}
    for row, g in df.groupby("row_bytes"):
        need_points(g["batch"], 2, f"swap_in row_bytes {row:g}, column 'batch'")
        need_points(g["rows"] * row, 2, f"swap_in row_bytes {row:g}, column 'rows'")
        y = g["us"].to_numpy(float) * 1e-6
        A = np.c_[np.ones(len(g)), g["batch"].to_numpy(float), (g["rows"] * row).to_numpy(float)]
        (a, c, b), *_ = np.linalg.lstsq(A, y, rcond=None)
        pred = A @ np.array([a, c, b])
        ss = float(((y - y.mean()) ** 2).sum())
        r2 = 1 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0
        bw = 1.0 / b if b > 0 else float("inf")
        per_row[int(row)] = {"launch_us": a * 1e6, "per_request_us": c * 1e6, "gbps": bw / 1e9,
                             "efficiency": bw / link_bw, "r2": r2, "points": len(g)}
    launch = float(np.mean([v["launch_us"] for v in per_row.values()]))
    per_request = float(np.mean([v["per_request_us"] for v in per_row.values()]))
    small = [v["efficiency"] for r, v in per_row.items() if r < 1024]
    large = [v["efficiency"] for r, v in per_row.items() if r >= 1024]
    return {"per_row": per_row, "swap_in_launch_us": launch, "swap_in_per_request_us": per_request,
            "gather_efficiency": float(np.mean(small)) if small else None,
            "gather_efficiency_large_rows": float(np.mean(large)) if large else None}


def fit_attention(df: pd.DataFrame) -> dict:
    """t = launch + roofline / efficiency over the (B, H, layout) grid."""
    need_points(df["roofline_us"], 2, "attention, column 'roofline_us'")
    a, b, r2 = linear_fit(df["roofline_us"].to_numpy(float) * 1e-6, df["us"].to_numpy(float) * 1e-6)
    return {"attention_launch_us": a * 1e6, "attention_efficiency": 1.0 / b if b > 0 else None, "r2": r2,
            "points": len(df)}


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(predicted, float) - np.asarray(measured, float)) / np.asarray(measured, float)


def fitted_params(swap: pd.DataFrame, attention: pd.DataFrame, link_bw: float) -> tuple[dict, dict, dict]:
    """(cost parameters, GPU figures, fit details) from the raw calibration tables."""
    sw = fit_swap_in(swap, link_bw)
    att = {dt: fit_attention(attention[attention.kv_dtype == dt]) for dt in sorted(set(attention.kv_dtype))}
    large = sw["per_row"].get(1152) or next(iter(sw["per_row"].values()))
    small = sw["per_row"].get(656)
    params = {"calibrated": True, "swap_in_launch_us": large["launch_us"], "swap_in_per_request_us": large["per_request_us"]}
    if small:
        params |= {"swap_in_launch_fp8_us": small["launch_us"], "swap_in_per_request_fp8_us": small["per_request_us"]}
    if "bf16" in att:
        params |= {"attention_launch_us": att["bf16"]["attention_launch_us"],
                   "attention_efficiency": att["bf16"]["attention_efficiency"]}
    if "fp8" in att:
        params |= {"attention_launch_fp8_us": att["fp8"]["attention_launch_us"],
                   "attention_efficiency_fp8": att["fp8"]["attention_efficiency"]}
    gpu = {"gather_efficiency": sw["gather_efficiency"], "gather_efficiency_large_rows": sw["gather_efficiency_large_rows"]}
    return params, {k: v for k, v in gpu.items() if v is not None}, {"swap_in": sw, "attention": att}


def fit_roofline(nbytes: np.ndarray, flops: np.ndarray, us: np.ndarray, iters: int = 50) -> dict:
    """t = launch + max(bytes / bw, flops / rate) by least squares on relative error.

    Each point is assigned the regime its current prediction says binds, the three parameters
    are refitted linearly (launch, 1/bw, 1/rate), until the assignment stops changing. A kind
    with no compute-bound point gets rate None (never the limit)."""
    b, f, t = (np.asarray(a, float) for a in (nbytes, flops, us))
    need_points(b, 2, "column 'bytes'")
    t = t * 1e-6

    def solve(cols):
        sol, *_ = np.linalg.lstsq(np.c_[np.ones(len(t)), *cols] / t[:, None], np.ones(len(t)), rcond=None)
        return [float(x) for x in sol]

    # start from the sum of both terms, then assign each point to the regime that binds
    a, ib, iflop = solve([b, f]) if f.any() else solve([b]) + [0.0]
    mem = b * max(ib, 1e-18) >= f * max(iflop, 0.0)
    for _ in range(iters):
        if iflop <= 0 or mem.all():
            (a, ib), iflop = solve([b]), 0.0
        else:
            a, ib, iflop = solve([b * mem, f * ~mem])
        ib = max(ib, 1e-18)
        new = b * ib >= f * max(iflop, 0.0)
        if (new == mem).all():
            break
        mem = new
    params = (a, ib, max(iflop, 0.0))
    a, ib, iflop = params
    pred = a + np.maximum(b * ib, f * iflop)
    rel = np.abs(pred - t) / t
    ss = float(((t - t.mean()) ** 2).sum())
    r2 = 1 - float(((t - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return {"launch_us": a * 1e6, "gbps": 1 / ib / 1e9, "tflops": (1 / iflop / 1e12) if iflop > 0 else None,
            "r2": r2, "median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max()), "points": len(t)}


def fit_indexer(df: pd.DataFrame, sms: int = 132) -> dict:
    """t = launch + key bytes / bw + select x waves x tokens per request (see
    ``step_terms.IndexerTerm``), least squares on relative error."""
    need_points(df["batch"] * df["ctx"], 3, "indexer, columns 'batch' x 'ctx'")
    t = df["us"].to_numpy(float) * 1e-6
    key = (df["batch"] * df["ctx"]).to_numpy(float) * 132
    sel = (np.ceil(df["batch"].to_numpy(float) / sms) * df["ctx"].to_numpy(float))
    A = np.c_[np.ones(len(t)), key, sel] / t[:, None]
    (a, ib, c), *_ = np.linalg.lstsq(A, np.ones(len(t)), rcond=None)
    pred = a + key * ib + sel * c
    rel = np.abs(pred - t) / t
    return {"launch_us": float(a) * 1e6, "gbps": 1 / float(ib) / 1e9, "select_ns_per_token": float(c) * 1e9,
            "median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max()), "points": len(t)}


def fit_step_terms(gemm: pd.DataFrame, elementwise: pd.DataFrame, indexer: pd.DataFrame, graph: pd.DataFrame,
                   grouped_tp: pd.DataFrame | None = None, fused_moe_tp: pd.DataFrame | None = None) -> dict:
    """The ``step_terms`` group of the calibration JSON from the raw tables (CPU only); with
    ``grouped_tp`` (``step_measure.grouped_tp_table``) also the TP fused-MoE routed experts'
    term ``grouped_gemm_tp`` and how the EP controls timed beside it compare with the
    ``grouped_gemm`` fit; with ``fused_moe_tp`` (``fused_moe_measure.fused_moe_tp_table``) the
    same slices' terms from the Triton fused MoE SGLang runs (``fused_moe_tp_*``, which then
    price them: ``tp_moe_kernel``)."""
    rates: dict[str, dict] = {}
    for (kind, dtype), g in gemm.groupby(["kind", "dtype"]):
        rates.setdefault(kind, {})[dtype] = fit_roofline(g["bytes"], g["flops"], g["us"])
    extra: dict = {}
    if grouped_tp is not None:
        from ..costmodel.ops import TP_MOE_KINDS, WEIGHT_BYTES

        tp = grouped_tp[grouped_tp["layout"] == "tp"]
        for (name, dtype), g in tp.groupby(["name", "dtype"]):
            if name not in TP_MOE_KINDS:
                raise ValueError(f"grouped_tp table: unknown routed-expert op {name!r} (known: {', '.join(TP_MOE_KINDS)})")
            # the slices' time follows the experts touched (weight bytes), not the rows: fitted on those
            wbytes = g["k"] * g["n"] * g["weight_groups"] * WEIGHT_BYTES[dtype]
            fit = fit_roofline(wbytes, g["flops"], g["us"]) | {"bytes": "weights"}
            rates.setdefault(TP_MOE_KINDS[name], {})[dtype] = fit
        extra["tp_moe_ep_controls"] = ep_controls(grouped_tp[grouped_tp["layout"] == "ep"], rates)
    if fused_moe_tp is not None:
        fused, summary = fit_fused_moe_tp(fused_moe_tp)
        for kind, per in fused.items():
            rates.setdefault(kind, {}).update(per)
        extra["fused_moe_tp"] = summary
        extra["tp_moe_kernel"] = "triton_fused_moe"
    ew = fit_roofline(elementwise["bytes"], np.zeros(len(elementwise)), elementwise["us"])
    rates["elementwise"] = {"bf16": ew}
    idx = {f"{qd}_h{h}": fit_indexer(g) for (qd, h), g in indexer.groupby(["q_dtype", "heads"])}
    # per-kernel cost inside a CUDA graph: slope of replay time over the number of kernels
    need_points(graph["kernels"], 2, "graph, column 'kernels'")
    _, slope, r2 = linear_fit(graph["kernels"].to_numpy(float), graph["us"].to_numpy(float))
    return {"rates": rates, "indexer": idx, "graph_launch_us": slope, "graph_launch_r2": r2, **extra}


def ep_controls(ep: pd.DataFrame, rates: dict) -> dict:
    """EP-layout grouped GEMMs re-timed beside the TP ones against the ``grouped_gemm`` fit (from
    the step run's table): signed relative error, so a drift between the two runs shows."""
    out = {}
    for dtype, g in ep.groupby("dtype"):
        r = rates.get("grouped_gemm", {}).get(dtype)
        if r is None:
            continue
        pred = r["launch_us"] * 1e-6 + g["bytes"].to_numpy(float) / (r["gbps"] * 1e9)
        if r.get("tflops"):
            pred = np.maximum(pred, r["launch_us"] * 1e-6 + g["flops"].to_numpy(float) / (r["tflops"] * 1e12))
        rel = (pred - g["us"].to_numpy(float) * 1e-6) / (g["us"].to_numpy(float) * 1e-6)
        out[dtype] = {"points": len(g), "median_rel_err": float(np.median(rel)),
                      "max_abs_rel_err": float(np.abs(rel).max())}
    return out


def fit_fused_moe_tp(df: pd.DataFrame) -> tuple[dict, dict]:
    """Per slice op, launch + weight bytes / bandwidth (``fit_roofline`` on the touched experts'
    weight bytes, as the ``grouped_gemm_tp`` terms) over the fastest Triton tile config at each
    node-token count (what a tuned deployment runs). Returns (rates by kind and dtype, a summary
    per op: the best config and its time per token count beside ``torch._scaled_grouped_mm``)."""
    from ..costmodel.ops import TP_MOE_KERNELS

    kinds = TP_MOE_KERNELS["triton_fused_moe"]
    missing = {"impl", "best", "name", "dtype", "node_tokens", "weight_bytes", "flops", "us"} - set(df.columns)
    if missing:
        raise ValueError(f"fused_moe_tp table: missing columns {', '.join(sorted(missing))}")
    rates: dict[str, dict] = {}
    summary: dict[str, dict] = {}
    best = df[(df["impl"] == "triton_fused_moe") & df["best"].astype(bool)]
    for (name, dtype), g in best.groupby(["name", "dtype"]):
        if name not in kinds:
            raise ValueError(f"fused_moe_tp table: unknown routed-expert op {name!r} (known: {', '.join(kinds)})")
        g = g.sort_values("node_tokens")
        fit = fit_roofline(g["weight_bytes"], g["flops"], g["us"]) | {
            "bytes": "weights", "kernel": "triton fused MoE (cupy_kernels/fused_moe.py), best tile config per node-token count"}
        rates.setdefault(kinds[name], {})[dtype] = fit
        sg = df[(df["impl"] == "torch._scaled_grouped_mm") & (df["name"] == name) & (df["dtype"] == dtype)]
        sg_us = dict(zip(sg["node_tokens"], sg["us"], strict=True))
        summary[name] = {"points": [{"node_tokens": int(r.node_tokens), "experts_touched": float(r.experts_touched),
                                     "config": r.config, "us": float(r.us),
                                     "scaled_grouped_mm_us": _finite(sg_us.get(r.node_tokens))}
                                    for r in g.itertuples()]}
    return rates, summary


def _finite(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None

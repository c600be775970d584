"""Least-squares fits of the cost model's kernel parameters (CPU only: runs on saved CSVs).

- swap-in, one launch per layer: t = launch + rows x row_bytes / bandwidth, per row size; the
  launch cost and the gather efficiency (bandwidth / measured pinned memcpy) feed the model.
- attention, one launch per layer: t = launch + roofline / efficiency (roofline from the same
  formula the serving model uses).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """y = a + b x by least squares: (a, b, R^2)."""
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

"""``hisparse calibrate`` and ``hisparse validate`` (on a GPU machine)."""

from __future__ import annotations

import argparse
import json
import os


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="time the real kernels on this GPU and fit the cost model (GPU)",
                       description="Time the swap-in kernel (batch x misses x row size), the sparse attention "
                                   "kernel (batch x heads x layout) and the host link on this GPU; fit the cost "
                                   "model's launch costs, gather efficiency and attention efficiency; write "
                                   "OUT/<gpu>.json (the fit and its quality) beside the raw CSVs. `hisparse plan` "
                                   "then uses OUT/<gpu>.json for that GPU by default.")
    c.add_argument("--gpu", default="h200", help="GPU preset the fit refines (default h200)")
    c.add_argument("--out", default="calibration", metavar="DIR", help="output folder (default calibration)")
    c.add_argument("--pool-gib", type=float, default=8.0, help="pinned host pool for the swap-in runs (GiB)")
    c.add_argument("--iters", type=int, default=10, help="timed launches per configuration")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--refit", action="store_true",
                   help="no GPU: refit OUT/<gpu>.json from the CSVs a previous run saved there")
    c.add_argument("--comm", action="store_true",
                   help="several GPUs: time NCCL collectives at decode-step sizes on 2, 4 and 8 of this machine's "
                        "GPUs (benchmarks/comm.py), save OUT/comm-<gpu>.csv and write the 'comm' section of "
                        "OUT/<gpu>.json (latency and busbw per collective and GPU count)")
    c.add_argument("--comm-refit", metavar="CSV",
                   help="no GPU: fit the 'comm' section of OUT/<gpu>.json from a CSV benchmarks/comm.py wrote")
    c.set_defaults(run=run_calibrate)

    v = sub.add_parser("validate", help="real kernels in a full decode loop against the model's prediction (GPU)",
                       description="Replay generated DSA-like trace streams through the real kernels in a per-layer "
                                   "decode loop (swap-in, then attention, rows in pinned host memory) for batches "
                                   "and buffer sizes the fit did not use; check the kernel's misses against the "
                                   "replay engine and the measured step times against the fitted cost model. "
                                   "Writes OUT/validation-<gpu>.json and a predicted-against-measured plot.")
    v.add_argument("--gpu", default="h200")
    v.add_argument("--out", default="calibration", metavar="DIR")
    v.add_argument("--steps", type=int, default=60, help="decode steps per configuration (default 60)")
    v.add_argument("--pool-gib", type=float, default=8.0)
    v.add_argument("--seed", type=int, default=1)
    v.add_argument("--repredict", action="store_true",
                   help="no GPU: recompute the predictions in OUT/validation-<gpu>.json with the current fit")
    v.set_defaults(run=run_validate)


SWAP_GRID = dict(batch=(1, 8, 32, 64), miss=(8, 128, 512, 1536), row_bytes=(656, 1152), hot=(4096,))
ATT_GRID = dict(batch=(1, 8, 32, 64, 128), heads=(64, 128), kv_dtype=("bf16", "fp8"))
# Validation configurations: batches and buffers the fit did not see.
VALIDATE = (dict(requests=16, layers=4, hot=6144, heads=64, row_bytes=1152),
            dict(requests=48, layers=4, hot=4096, heads=128, row_bytes=656),
            dict(requests=4, layers=6, hot=5120, heads=64, row_bytes=656))


def _cost_model(gpu_name: str, calibration: str):
    from ..serving import presets as P
    from ..serving.costs import CostModel

    gpu = P.load_gpu(gpu_name, calibration)
    return CostModel(P.load("models", "glm-5.1-fp8"), gpu, P.load("deployments", "8xh200-colocated-dp8"),
                     P.load("calibration", calibration))


def run_calibrate(args: argparse.Namespace) -> int:
    if args.comm or args.comm_refit:
        from ..calibration.comm_cli import run_comm

        return run_comm(args)
    import pandas as pd

    from ..trace.fileio import atomic_output

    os.makedirs(args.out, exist_ok=True)
    swap_csv = os.path.join(args.out, f"swap_in-{args.gpu}.csv")
    att_csv = os.path.join(args.out, f"attention-{args.gpu}.csv")
    out_json = os.path.join(args.out, f"{args.gpu}.json")
    if args.refit:
        from ..errors import HisparseError

        for path in (swap_csv, att_csv, out_json):
            if not os.path.exists(path):
                raise HisparseError(f"{path}: missing; --refit needs a previous hisparse calibrate run")
        old = json.loads(open(out_json).read())
        swap_df, att_df = pd.read_csv(swap_csv), pd.read_csv(att_csv)
        link, hbm, source = old["gpu"]["link_bw"], old["gpu"]["hbm_bw"], old["source"]
    else:
        swap_df, att_df, link, hbm, source = _measure(args)
        with atomic_output(swap_csv) as fh:
            fh.write(swap_df.to_csv(index=False).encode())
        with atomic_output(att_csv) as fh:
            fh.write(att_df.to_csv(index=False).encode())
    from ..calibration.fitting import fitted_params

    params, gpu, fits = fitted_params(swap_df, att_df, link)
    report = {"source": source, "params": params, "gpu": {"link_bw": link, "hbm_bw": hbm} | gpu, "fit": fits,
              "grid": {"swap_in": SWAP_GRID, "attention": ATT_GRID}}
    with atomic_output(out_json) as fh:
        fh.write(json.dumps(report, indent=2).encode())
    print(json.dumps({"params": params, "gpu": report["gpu"],
                      "r2": {"swap_in": {r: v["r2"] for r, v in fits["swap_in"]["per_row"].items()},
                             "attention": {d: f["r2"] for d, f in fits["attention"].items()}}}, indent=2))
    return 0


def _measure(args: argparse.Namespace):
    """Time the kernels and the link on this GPU: (swap-in table, attention table, link B/s,
    HBM B/s, source line)."""
    import cupy as cp
    import numpy as np
    import pandas as pd

    from cupy_kernels.swap_in import PinnedPool

    from ..calibration import measure

    rng = np.random.default_rng(args.seed)
    pool = PinnedPool(int(args.pool_gib * (1 << 30)))
    link = measure.memcpy_gbps(cp, pool) * 1e9
    hbm = measure.hbm_gbps(cp) * 1e9
    print(f"pinned memcpy H2D {link / 1e9:.1f} GB/s, HBM copy {hbm / 1e9:.0f} GB/s", flush=True)
    swap = []
    for b in SWAP_GRID["batch"]:
        for m in SWAP_GRID["miss"]:
            for row in SWAP_GRID["row_bytes"]:
                us = measure.time_swap_in(cp, pool, batch=b, hot=4096, miss=m, row_bytes=row, ctx=32768,
                                          iters=args.iters, rng=rng)
                swap.append(dict(batch=b, hot=4096, miss=m, row_bytes=row, rows=b * m, us=us))
                print(f"swap-in bs {b:3d} misses {m:4d} row {row:4d}: {us:8.1f} us", flush=True)
    cost = _cost_model(args.gpu, "uncalibrated")
    att = []
    for b in ATT_GRID["batch"]:
        for h in ATT_GRID["heads"]:
            for dt in ATT_GRID["kv_dtype"]:
                us = measure.time_attention(cp, batch=b, heads=h, kv_dtype=dt, iters=args.iters, rng=rng)
                row = 1152 if dt == "bf16" else 656
                roof = cost.attention_roofline(b, heads=h, k=2048, row_bytes=row) * 1e6
                att.append(dict(batch=b, heads=h, kv_dtype=dt, us=us, roofline_us=roof))
                print(f"attention B {b:3d} H {h:3d} {dt}: {us:8.1f} us (roofline {roof:.1f})", flush=True)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    source = (f"hisparse calibrate on {name}: swap-in and attention launch costs, per-request swap-in cost, "
              "gather and attention efficiency fitted (per row layout); weight/MoE, indexer, per-layer "
              "overhead and prefill terms stay at their uncalibrated defaults")
    return pd.DataFrame(swap), pd.DataFrame(att), link, hbm, source


def run_validate(args: argparse.Namespace) -> int:
    import numpy as np

    from ..calibration.fitting import relative_errors
    from ..calibration.validate import repredict, run_config
    from ..trace.fileio import atomic_output

    calibration = os.path.join(args.out, f"{args.gpu}.json")
    if not os.path.exists(calibration):
        from ..errors import HisparseError

        raise HisparseError(f"{calibration}: run hisparse calibrate first")
    cost = _cost_model(args.gpu, calibration)
    if args.repredict:  # the stored misses and timings, the current fit
        with open(os.path.join(args.out, f"validation-{args.gpu}.json")) as fh:
            configs = [repredict(cost, c) for c in json.load(fh)["configs"]]
    else:
        import cupy as cp

        from cupy_kernels.swap_in import PinnedPool

        pool = PinnedPool(int(args.pool_gib * (1 << 30)))
        configs = [run_config(cp, pool, cost, steps=args.steps, seed=args.seed + i, **cfg)
                   for i, cfg in enumerate(VALIDATE)]
    for r in configs:
        err = relative_errors(r["predicted_s"], r["measured_s"])
        cfg = {k: r[k] for k in ("requests", "layers", "hot", "heads", "row_bytes")}
        print(f"{cfg}: misses exact {r['misses_exact']}, miss share {r['miss_share']:.3f}, median error "
              f"{np.median(err):.1%}, p90 {np.percentile(err, 90):.1%}", flush=True)
    err = np.concatenate([relative_errors(c["predicted_s"], c["measured_s"]) for c in configs])
    report = {"gpu": args.gpu, "calibration": calibration, "misses_exact": all(c["misses_exact"] for c in configs),
              "step_time_median_abs_err": float(np.median(err)), "step_time_p90_abs_err": float(np.percentile(err, 90)),
              "targets": {"misses_exact": True, "step_time_median_abs_err": 0.10, "step_time_p90_abs_err": 0.20},
              "configs": configs}
    with atomic_output(os.path.join(args.out, f"validation-{args.gpu}.json")) as fh:
        fh.write(json.dumps(report, indent=1).encode())
    from ..calibration.report import plot_validation

    plot_validation(report, os.path.join(args.out, f"validation-{args.gpu}.png"))
    print(json.dumps({k: report[k] for k in ("misses_exact", "step_time_median_abs_err", "step_time_p90_abs_err")}))
    return 0

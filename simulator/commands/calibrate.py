"""``hisparse calibrate`` and ``hisparse validate`` (on a GPU machine; ``--refit`` and
``--repredict`` on any machine)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from ..inputs import dumps_json
from .common import (
    OptionDefaults,
    Output,
    declare_io,
    file_name,
    fill_defaults,
    given_options,
    positive_float,
    positive_int,
    seed_int,
)

TERMS = ("all", "kernels", "step", "moe-tp", "fused-moe-tp")
LOOPS = ("both", "layer", "kernels")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="time the real kernels on this GPU and fit the cost model (GPU)",
                       description="Time the real kernels on this GPU and fit the cost model's terms; write "
                                   "OUT/<gpu>.json (the fit and its quality) beside the raw CSVs. Term groups: "
                                   "'kernels' = the swap-in kernel (batch x misses x row size x buffer), sparse "
                                   "attention (batch x heads x layout) and the host link; 'step' = every GEMM of a "
                                   "GLM-5.1 and a DeepSeek-V3.2 decode layer at per-GPU shapes over batch sizes, "
                                   "elementwise kernels, the lightning indexer (batch x context) and the per-kernel "
                                   "cost inside a CUDA graph, each fitted as launch + max(bytes/bandwidth, "
                                   "FLOPs/rate) per dtype (the JSON's step_terms), and the routed experts' grouped GEMMs at the TP "
                                   "fused-MoE slice shapes (every expert's intermediate split over 8 GPUs) over "
                                   "node tokens, both through torch._scaled_grouped_mm and through our Triton "
                                   "fused-MoE kernel (the mechanism SGLang runs there; several tile configs, the "
                                   "fastest per token count is fitted and prices the slices); 'moe-tp' / "
                                   "'fused-moe-tp' = only the first / the second of those tables, refitting the "
                                   "step terms with the saved step CSVs. `hisparse plan` uses "
                                   "OUT/<gpu>.json for that GPU by default.")
    c.add_argument("--gpu", type=file_name, default="h200",
                   help="GPU preset the fit refines, a name: it names OUT/<gpu>.json (default h200)")
    c.add_argument("--out", default="calibration", metavar="DIR", help="output folder (default calibration)")
    c.add_argument("--terms", choices=TERMS, default=None,
                   help="term groups to measure (default all); the others are kept from OUT/<gpu>.json")
    c.add_argument("--pool-gib", type=positive_float, default=None, help="pinned host pool for the swap-in runs (GiB, default 8)")
    c.add_argument("--iters", type=positive_int, default=None, help="timed launches per configuration (default 10)")
    c.add_argument("--seed", type=seed_int, default=None, help="random seed (default 0)")
    c.add_argument("--refit", action="store_true",
                   help="no GPU: refit OUT/<gpu>.json from the CSVs a previous run saved there")
    c.add_argument("--comm", action="store_true",
                   help="several GPUs: time NCCL collectives at decode-step sizes on 2, 4 and 8 of this machine's "
                        "GPUs (benchmarks/comm.py), save OUT/comm-<gpu>.csv and write the 'comm' section of "
                        "OUT/<gpu>.json (latency and busbw per collective and GPU count)")
    c.add_argument("--comm-refit", metavar="CSV",
                   help="no GPU: fit the 'comm' section of OUT/<gpu>.json from a CSV benchmarks/comm.py wrote")
    c.set_defaults(run=run_calibrate)
    declare_io(c, inputs=["comm_refit"], outputs=[Output("out", kind="dir", files=calibrate_files)])

    v = sub.add_parser("validate", help="real kernels in a full decode loop against the model's prediction (GPU)",
                       description="Run decode steps through real kernels and compare the measured step time "
                                   "with the fitted terms' prediction, on configurations the fit did not use. "
                                   "'layer': a full DSA layer at GLM-5.1's per-GPU shapes (DP attention, 1/8 of "
                                   "the experts, no communication): every op of the layer's work (norms, "
                                   "projections, indexer, swap-in, attention, MoE grouped GEMMs), predicted from "
                                   "costmodel.ops + costmodel.terms; 'kernels': issue 8's swap-in + attention loop, "
                                   "predicted by the serving cost model. Both check the swap-in kernel's misses "
                                   "against the replay engine. Writes OUT/validation[-layer]-<gpu>.json and plots.")
    v.add_argument("--gpu", type=file_name, default="h200",
                   help="GPU preset, a name: it names the files in OUT (default h200)")
    v.add_argument("--out", default="calibration", metavar="DIR", help="folder of the fit and the results (default calibration)")
    v.add_argument("--loop", choices=LOOPS, default="both", help="which validation loop (default both)")
    v.add_argument("--steps", type=positive_int, default=None, help="decode steps per configuration (default 60)")
    v.add_argument("--pool-gib", type=positive_float, default=None, help="pinned host pool (GiB, default 8)")
    v.add_argument("--seed", type=seed_int, default=None, help="random seed (default 1)")
    v.add_argument("--repredict", action="store_true",
                   help="no GPU: recompute the predictions in the stored validation files with the current fit")
    v.set_defaults(run=run_validate)
    declare_io(v, outputs=[Output("out", kind="dir", files=validate_files)])


def calibrate_files(args: argparse.Namespace) -> tuple[str, ...]:
    """Every file ``calibrate --out DIR`` may write there: the fit, the comm plot, the raw CSVs."""
    from ..calibration.run import KERNEL_TABLES, OPTIONAL_STEP_TABLES, STEP_TABLES

    gpu = args.gpu
    tables = (*KERNEL_TABLES, *STEP_TABLES, *OPTIONAL_STEP_TABLES, "comm")
    return (f"{gpu}.json", f"comm-{gpu}.png", *(f"{t}-{gpu}.csv" for t in tables))


def validate_files(args: argparse.Namespace) -> tuple[str, ...]:
    """Every file ``validate --out DIR`` may write there."""
    return tuple(f"validation{loop}-{args.gpu}.{ext}" for loop in ("", "-layer") for ext in ("json", "png"))


def _require_cupy(command: str, offline: str) -> None:
    """Refuse to start without CuPy and a GPU, saying what to install (before any work)."""
    from ..errors import HisparseError

    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, or CuPy present but no driver / device
        raise HisparseError(f"{command} times the real kernels and needs CuPy and an NVIDIA GPU "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no GPU'}); "
                            f"install CuPy with pip install 'hisparse-sim[gpu]' (cupy-cuda13x; in a checkout: pip install -e "
                            f"'.[gpu]'), or run {offline} "
                            "without a GPU") from None
    if count < 1:
        raise HisparseError(f"{command} needs an NVIDIA GPU: CuPy sees none")


def _read_json(path: str, keys: tuple[str, ...], hint: str) -> dict:
    """A JSON object from a previous run, with ``keys``: errors name the file and the key."""
    from ..errors import HisparseError
    from ..fileio import InputError
    from ..inputs import read_json

    if not os.path.exists(path):
        raise HisparseError(f"{path}: missing; {hint}")
    try:
        data = read_json(path)
    except InputError as exc:
        if exc.problem == "no such file":
            raise HisparseError(f"{path}: missing; {hint}") from None
        raise HisparseError(f"{path}: not a readable JSON file ({exc.problem})") from None
    except HisparseError as exc:
        raise HisparseError(f"{path}: not a readable JSON file ({str(exc).removeprefix(f'{path}: ')})") from None
    if not isinstance(data, dict):
        raise HisparseError(f"{path}: expected a JSON object, got {type(data).__name__}")
    for dotted in keys:
        node = data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise HisparseError(f"{path}: missing key {dotted!r}; {hint}")
            node = node[part]
    return data


def _read_calibration(path: str):
    """The calibration ``hisparse validate`` checks: a file from ``hisparse calibrate`` with its fits."""
    from ..costmodel.calibration_file import read_calibration
    from ..errors import HisparseError

    if not os.path.exists(path):
        raise HisparseError(f"{path}: missing; run hisparse calibrate first")
    cal = read_calibration(path)
    if not cal.params:
        raise HisparseError(f"{path}: missing key 'params'; run hisparse calibrate first")
    return cal


def _repredicted(path: str, configs: list, repredict) -> list[dict]:
    """Stored configurations through ``repredict``; a malformed one names the file and its index."""
    import math

    from ..errors import HisparseError

    if not isinstance(configs, list) or not configs:
        raise HisparseError(f"{path}: 'configs' holds no configuration; run hisparse validate on a GPU first")
    out = []
    for i, c in enumerate(configs):
        try:
            r = repredict(c)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise HisparseError(f"{path}: configs[{i}]: malformed ({type(exc).__name__}: {exc})") from None
        # the measured step times the predictions are scored against: one positive number per predicted step
        measured, n = r.get("measured_s"), len(r["predicted_s"])
        if not isinstance(measured, list) or len(measured) != n:
            got = f"{len(measured)} values" if isinstance(measured, list) else type(measured).__name__
            raise HisparseError(f"{path}: configs[{i}].measured_s: {got}, expected a list of {n} step times "
                                "(one per predicted step)")
        for j, v in enumerate(measured):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise HisparseError(f"{path}: configs[{i}].measured_s[{j}]: {v!r} is not a positive number of "
                                    "seconds")
        out.append(r)
    return out


def _csv(out: str, name: str, gpu: str) -> str:
    return os.path.join(out, f"{name}-{gpu}.csv")


def _read_tables(out: str, gpu: str, names) -> dict:
    import pandas as pd

    from ..calibration.tables import check_table
    from ..errors import HisparseError
    from ..fileio import check_input

    tables = {}
    for name in names:
        path = _csv(out, name, gpu)
        if not os.path.exists(path):
            raise HisparseError(f"{path}: missing; --refit needs a previous hisparse calibrate run")
        check_input(path)  # a FIFO would block pandas' open()
        try:
            df = pd.read_csv(path)
        except (ValueError, OSError) as exc:
            raise HisparseError(f"{path}: not a readable CSV ({exc})") from None
        tables[name] = check_table(df, name, path)  # the columns its fit reads, a row at least, numbers
    return tables


_FUSED_SOURCE = ("TP fused-MoE slices through our Triton fused-MoE kernel (block-FP8, rows sorted and padded per "
                 "expert; best tile config per node-token count; the kernel SGLang runs there), timed beside "
                 "torch._scaled_grouped_mm on the same data: calibrate --terms fused-moe-tp")


def _source_with(source: str | None, prefix: str, part: str) -> str:
    """``source``'s '; '-separated parts with the one starting with ``prefix`` replaced by ``part``."""
    parts = [p for p in (source or "").split("; ") if p and not p.startswith(prefix)]
    return "; ".join([*parts, part])


def _read_optional(out: str, gpu: str, names) -> dict:
    """The tables among ``names`` that a previous run saved (older runs lack some)."""
    return _read_tables(out, gpu, [n for n in names if os.path.exists(_csv(out, n, gpu))])


def _write_tables(out: str, gpu: str, tables: dict) -> None:
    from ..fileio import atomic_output

    for name, df in tables.items():
        with atomic_output(_csv(out, name, gpu)) as fh:
            fh.write(df.to_csv(index=False).encode())


# the measuring options and their defaults (None in the parser, so an option given where nothing is measured
# is told apart from its default)
CALIBRATE_MEASURE = (("terms", "--terms", "all"), ("pool_gib", "--pool-gib", 8.0), ("iters", "--iters", 10),
                     ("seed", "--seed", 0))
VALIDATE_MEASURE = (("steps", "--steps", 60), ("pool_gib", "--pool-gib", 8.0), ("seed", "--seed", 1))


def _measure_options(args: argparse.Namespace, options: OptionDefaults, offline: str | None) -> None:
    """Fill in the measuring options' defaults; under ``offline`` (--refit, --repredict, --comm...), which
    measures none of them, one given is refused: they were ignored silently (rc 0, the same output)."""
    from ..errors import HisparseError

    given = given_options(args, options)
    if offline and given:
        raise HisparseError(f"{', '.join(given)}: {'does' if len(given) == 1 else 'do'} not apply with {offline} "
                            "(they set the kernel measurements, which it does not run)")
    fill_defaults(args, options)


def run_calibrate(args: argparse.Namespace) -> int:
    comm = "--comm" if args.comm else "--comm-refit" if args.comm_refit else None
    offline = comm or ("--refit" if args.refit else None)
    if not (args.comm and args.refit):  # --comm with --refit: run_comm's own error
        _measure_options(args, CALIBRATE_MEASURE, offline)
    if comm:
        from ..calibration.comm_cli import run_comm

        return run_comm(args)
    if not args.refit:
        _require_cupy("hisparse calibrate", "hisparse calibrate --refit")
    import numpy as np

    from ..calibration import grids
    from ..calibration.fitting import fit_step_terms, fitted_params
    from ..calibration.run import (
        FUSED_MOE_TABLE,
        KERNEL_TABLES,
        OPTIONAL_STEP_TABLES,
        STEP_TABLES,
        TP_MOE_TABLE,
    )
    from ..costmodel.calibration_file import CalibrationFile, read_calibration, write_calibration
    from ..costmodel.ops import Layout
    from ..errors import HisparseError
    from ..serving.presets import calibration_base

    if not args.refit:  # a refit reads its tables from --out: a missing folder is its error, not made empty
        os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, f"{args.gpu}.json")
    hint = f"--refit and --terms {args.terms} need a previous hisparse calibrate run"
    needs_old = args.refit or args.terms != "all"
    base = calibration_base(out_json)  # the previous run a refit or a partial run builds on, or the packaged one
    old = read_calibration(base) if base is not None else None
    if needs_old:
        if old is None:
            raise HisparseError(f"{out_json}: missing; {hint}")
        for key in ("link_bw", "hbm_bw"):
            if key not in old.gpu:
                raise HisparseError(f"{out_json}: missing key 'gpu.{key}'; {hint}")
    want_kernels = args.terms in ("all", "kernels")
    want_step = args.terms in ("all", "step")
    if args.refit:
        kernel_tables = _read_tables(args.out, args.gpu, KERNEL_TABLES)
        has_step = all(os.path.exists(_csv(args.out, n, args.gpu)) for n in STEP_TABLES)
        step_tables = _read_tables(args.out, args.gpu, STEP_TABLES) if has_step else None
        if step_tables is not None:
            step_tables |= _read_optional(args.out, args.gpu, OPTIONAL_STEP_TABLES)
        link, hbm, source = old.gpu["link_bw"], old.gpu["hbm_bw"], old.source
        step_source = (old.step_terms or {}).get("source")
    else:
        import cupy as cp

        from ..calibration.run import (
            MeasureOptions,
            gpu_name,
            measure_fused_moe_tp,
            measure_kernels,
            measure_step,
            measure_tp_moe,
        )

        opts = MeasureOptions(iters=args.iters, seed=args.seed, pool_gib=args.pool_gib)

        name = gpu_name(cp)
        if want_kernels:
            kernel_tables, link, hbm = measure_kernels(opts)
            _write_tables(args.out, args.gpu, kernel_tables)
            source = (f"hisparse calibrate on {name}: swap-in and attention launch costs, per-request swap-in cost, "
                      "gather and attention efficiency fitted (per row layout)")
        else:
            kernel_tables = _read_tables(args.out, args.gpu, KERNEL_TABLES)
            link, hbm, source = old.gpu["link_bw"], old.gpu["hbm_bw"], old.source
        step_tables, step_source = None, (old.step_terms or {}).get("source") if old else None
        if want_step:
            step_tables = measure_step(opts)
            _write_tables(args.out, args.gpu, step_tables)
            step_source = (f"hisparse calibrate on {name}: every GEMM of GLM-5.1/DeepSeek-V3.2 decode layers at "
                           "per-GPU shapes (FP8 torch._scaled_mm / _scaled_grouped_mm, bf16 as fp16 cuBLAS via CuPy), "
                           "elementwise kernels and tiny kernels in CUDA graphs, the lightning indexer kernel; "
                           "routed experts in the TP fused-MoE layout: torch._scaled_grouped_mm at the slice shapes "
                           f"over node tokens; {_FUSED_SOURCE}")
        elif old and os.path.exists(_csv(args.out, "gemm", args.gpu)):
            step_tables = _read_tables(args.out, args.gpu, STEP_TABLES)
            if args.terms == "moe-tp":
                step_tables |= measure_tp_moe(opts)
                _write_tables(args.out, args.gpu, {TP_MOE_TABLE: step_tables[TP_MOE_TABLE]})
                step_source = _source_with(step_source, "routed experts in the TP",
                                           f"routed experts in the TP fused-MoE layout on {name}: "
                                           "torch._scaled_grouped_mm at the slice shapes over node tokens "
                                           "(calibrate --terms moe-tp)")
            elif args.terms == "fused-moe-tp":
                step_tables |= measure_fused_moe_tp(opts)
                _write_tables(args.out, args.gpu, {FUSED_MOE_TABLE: step_tables[FUSED_MOE_TABLE]})
                step_source = _source_with(step_source, _FUSED_SOURCE.split(":")[0], f"{_FUSED_SOURCE} on {name}")
            step_tables |= _read_optional(args.out, args.gpu, [t for t in OPTIONAL_STEP_TABLES if t not in step_tables])
        elif args.terms in ("moe-tp", "fused-moe-tp"):
            raise HisparseError(f"{_csv(args.out, 'gemm', args.gpu)}: missing; --terms {args.terms} adds to a "
                                "previous hisparse calibrate --terms step run")
    try:
        params, gpu, fits = fitted_params(kernel_tables["swap_in"], kernel_tables["attention"], link)
    except (KeyError, ValueError, np.linalg.LinAlgError) as exc:
        raise HisparseError(f"{args.out}: the kernel CSVs ({', '.join(f'{n}-{args.gpu}.csv' for n in KERNEL_TABLES)}) "
                            f"do not fit: {exc}") from None
    # groups other runs write (e.g. `comm`, calibrate --comm) are kept as they are
    report = (old or CalibrationFile(source, where=out_json)).replace(
        source=source, params=params, gpu={"link_bw": link, "hbm_bw": hbm} | gpu, fit=fits,
        grid={"swap_in": grids.SWAP_GRID, "attention": grids.ATT_GRID})
    if step_tables is not None:
        import dataclasses

        try:
            step_fit = fit_step_terms(step_tables["gemm"], step_tables["elementwise"], step_tables["indexer"],
                                      step_tables["graph"], step_tables.get(TP_MOE_TABLE),
                                      step_tables.get(FUSED_MOE_TABLE))
        except (KeyError, ValueError, np.linalg.LinAlgError) as exc:
            raise HisparseError(f"{args.out}: the step CSVs ({', '.join(f'{n}-{args.gpu}.csv' for n in step_tables)}) "
                                f"do not fit: {exc}") from None
        if args.refit:
            _check_step_coverage(step_fit, old, step_tables, args.out, args.gpu)
        st = {
            "source": step_source, "model": "t = launch + max(bytes / bandwidth, FLOPs / rate) per kind and dtype; "
            "indexer: launch + key bytes / bandwidth + select x waves x tokens per request",
            "layout": dataclasses.asdict(Layout()), "models": list(grids.STEP_MODELS),
            "grid": {"batches": list(grids.STEP_BATCHES), "indexer": grids.INDEXER_GRID,
                     "elementwise_bytes": list(grids.ELEMENTWISE_BYTES), "graph_kernels": list(grids.GRAPH_KERNELS)},
            **step_fit}
        if TP_MOE_TABLE in step_tables:
            st["grid"]["tp_moe_tokens"] = list(grids.TP_MOE_TOKENS)
            st["grid"]["tp_moe_ep_control_tokens"] = list(grids.TP_MOE_EP_CONTROL_TOKENS)
        if FUSED_MOE_TABLE in step_tables:
            fused = step_tables[FUSED_MOE_TABLE]
            st["grid"]["fused_moe_tp_tokens"] = sorted(int(t) for t in set(fused["node_tokens"]))
            st["grid"]["fused_moe_tp_configs"] = sorted(set(fused["config"].dropna()) - {""})
        report = report.replace(step_terms=st)
    write_calibration(report, out_json)
    summary = {"params": params, "gpu": dict(report.gpu),
               "r2": {"swap_in": {r: v["r2"] for r, v in fits["swap_in"]["per_row"].items()},
                      "attention": {d: f["r2"] for d, f in fits["attention"].items()}}}
    if report.step_terms is not None:
        st = report.step_terms
        summary["step_terms"] = {"graph_launch_us": st["graph_launch_us"],
                                 "rates": {k: {d: {x: v[x] for x in ("launch_us", "gbps", "tflops", "median_rel_err")}
                                               for d, v in per.items()} for k, per in st["rates"].items()},
                                 "indexer": st["indexer"]}
    print(dumps_json(summary, indent=2))
    return 0


def _check_step_coverage(step_fit: dict, old, tables: dict, out: str, gpu: str) -> None:
    """A refit's step terms cover every term the calibration it builds on had: a table cut short (a
    gemm CSV of its first two rows) refitted to a file without the BF16 GEMM, grouped and batched
    terms, and a 2-point FP8 fit at 1e9 GB/s, with status 0; `plan` then failed on it with a traceback.
    The error names the table that holds the missing rows."""
    from ..errors import HisparseError

    before = (old.step_terms or {}) if old is not None else {}
    lost = [f"{kind} {dtype}" for kind, per in (before.get("rates") or {}).items() for dtype in per
            if dtype not in step_fit["rates"].get(kind, {})]
    lost_idx = [name for name in (before.get("indexer") or {}) if name not in step_fit["indexer"]]
    if not lost and not lost_idx:
        return
    where = old.where if old is not None else f"{out}/{gpu}.json"
    csvs = ", ".join(f"{n}-{gpu}.csv" for n in tables)
    what = "; ".join(filter(None, (f"rates {', '.join(lost)}" if lost else "",
                                   f"indexer {', '.join(lost_idx)}" if lost_idx else "")))
    raise HisparseError(f"{out}: the step CSVs ({csvs}) hold no rows for {what}, which {where} fits: a table cut "
                        "short? (nothing written; rerun hisparse calibrate --terms step for complete tables)")


def _validated_calibration(out: str, gpu: str) -> str:
    """The fit ``validate`` checks: OUT/<gpu>.json, else the GPU's packaged one (as ``calibrate`` builds on
    it). The checkout's calibration/ holds the stored runs but not the fit (the package holds its one
    copy), so the README's ``validate --repredict --out calibration`` failed with "run hisparse calibrate
    first" on a machine that cannot."""
    from ..serving.presets import calibration_base

    path = os.path.join(out, f"{gpu}.json")
    return str(calibration_base(path) or path)


def run_validate(args: argparse.Namespace) -> int:

    calibration = _validated_calibration(args.out, args.gpu)
    _measure_options(args, VALIDATE_MEASURE, "--repredict" if args.repredict else None)
    if not args.repredict:
        _require_cupy("hisparse validate", "hisparse validate --repredict")
    _read_calibration(calibration)
    pool = None
    if not args.repredict:
        from cupy_kernels.swap_in import PinnedPool

        pool = PinnedPool(int(args.pool_gib * (1 << 30)))
    loops = [f for name, f in (("kernels", _validate_kernels), ("layer", _validate_layers))
             if args.loop in ("both", name)]
    # a GPU run keeps each loop's report as soon as it is measured; --repredict checks every stored
    # file before it rewrites any, so a bad layer file leaves the kernels report as it was too
    saves = []
    for loop in loops:
        save = loop(args, calibration, pool)
        if args.repredict:
            saves.append(save)
        else:
            save()
    for save in saves:
        save()
    return 0


def _summary(configs: list[dict], keys) -> tuple[float, float]:
    import numpy as np

    from ..calibration.fitting import relative_errors

    for r in configs:
        err = relative_errors(r["predicted_s"], r["measured_s"])
        cfg = {k: r[k] for k in keys}
        print(f"{cfg}: misses exact {r['misses_exact']}, miss share {r['miss_share']:.3f}, median error "
              f"{np.median(err):.1%}, p90 {np.percentile(err, 90):.1%}", flush=True)
    err = np.concatenate([relative_errors(c["predicted_s"], c["measured_s"]) for c in configs])
    return float(np.median(err)), float(np.percentile(err, 90))


def _validate_kernels(args: argparse.Namespace, calibration: str, pool) -> Callable[[], None]:
    """Issue 8's loop: swap-in + attention per layer against the serving cost model's terms. Returns
    the call that saves its report."""
    from ..calibration import grids
    from ..calibration.validate import repredict, run_config
    from ..costmodel.passes import CostModel
    from ..costmodel.pricing import terms_for
    from ..serving import presets as P

    gpu = P.load_gpu(args.gpu, calibration)
    cal = P.load_calibration(calibration)
    # the attention fit of the calibration being checked (its `fit` group), not the packaged one
    cost = CostModel(P.load("models", "glm-5.1-fp8"), gpu, P.load("deployments", "8xh200-colocated-dp8"),
                     cal.params, terms_for(gpu, cal.terms, cal.label))
    path = os.path.join(args.out, f"validation-{args.gpu}.json")
    if args.repredict:
        stored = _read_json(path, ("configs",), "--repredict needs a previous hisparse validate run")
        configs = _repredicted(path, stored["configs"], lambda c: repredict(cost, c))
    else:
        import cupy as cp

        configs = [run_config(cp, pool, cost, steps=args.steps, seed=args.seed + i, **cfg)
                   for i, cfg in enumerate(grids.VALIDATE_KERNELS)]
    from ..calibration.report import plot_validation

    return lambda: _save_validation(args, calibration, path, configs, ("requests", "layers", "hot", "heads", "row_bytes"),
                                    plot_validation, f"validation-{args.gpu}.png")


def _validate_layers(args: argparse.Namespace, calibration: str, pool) -> Callable[[], None]:
    """The full DSA layer loop at GLM-5.1's per-GPU shapes against costmodel.ops + costmodel.terms. Returns the
    call that saves its report."""
    from ..calibration import grids
    from ..calibration.layer_loop import repredict_layers, run_layer_config
    from ..costmodel.terms import StepTerms
    from ..errors import HisparseError

    cal = _read_calibration(calibration)
    try:
        # the BF16 twin of the absorbed bmm where the calibration did not time it (a run measured with it)
        terms = StepTerms.from_calibration(cal.groups()).with_bf16()
    except KeyError as exc:
        raise HisparseError(f"{calibration}: {exc.args[0]}") from None
    path = os.path.join(args.out, f"validation-layer-{args.gpu}.json")
    if args.repredict:
        if not os.path.exists(path):
            raise HisparseError(f"{path}: missing; run hisparse validate --loop layer on a GPU first")
        stored = _read_json(path, ("configs",), "--repredict needs a previous hisparse validate run")
        configs = _repredicted(path, stored["configs"], lambda c: repredict_layers(terms, c))
    else:
        import cupy as cp
        import torch

        configs = [run_layer_config(cp, torch, pool, terms, cfg, steps=args.steps, seed=args.seed + i)
                   for i, cfg in enumerate(grids.VALIDATE_LAYERS)]
    from ..calibration.report import plot_layer_validation

    return lambda: _save_validation(args, calibration, path, configs,
                                    ("requests", "ctx0", "layers", "dense", "hot", "row_bytes"),
                                    plot_layer_validation, f"validation-layer-{args.gpu}.png",
                                    {"model": "glm-5.1", "loop": "full DSA layer"})


def _save_validation(args: argparse.Namespace, calibration: str, path: str, configs: list, keys: tuple,
                     plot, png: str, extra: dict | None = None) -> None:
    """Either loop's report (summary, targets, configurations) and its plot, swapped into OUT as
    one pair (an interrupted run leaves the earlier pair), and its headline printed."""
    from ..fileio import atomic_output, folder_output

    med, p90 = _summary(configs, keys)
    report = {"gpu": args.gpu, "calibration": calibration, **(extra or {}),
              "misses_exact": all(c["misses_exact"] for c in configs),
              "step_time_median_abs_err": med, "step_time_p90_abs_err": p90,
              "targets": {"misses_exact": True, "step_time_median_abs_err": 0.10, "step_time_p90_abs_err": 0.20},
              "configs": configs}
    name = os.path.basename(path)
    with folder_output(args.out, (name, png)) as staged:
        with atomic_output(staged / name) as fh:
            fh.write(dumps_json(report, indent=1).encode())
        plot(report, str(staged / png))
    print(dumps_json({k: report[k] for k in ("misses_exact", "step_time_median_abs_err", "step_time_p90_abs_err")}))

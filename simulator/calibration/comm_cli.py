"""``hisparse calibrate --comm`` / ``--comm-refit CSV``: measure or refit the communication terms."""

from __future__ import annotations

import argparse
import os

from ..errors import HisparseError


def run_comm(args: argparse.Namespace) -> int:
    """Measure (several GPUs) or take a saved CSV (no GPU), fit, write OUT/<gpu>.json's comm."""
    from .comm import calibrate_comm, format_fits

    if args.comm and args.comm_refit:
        raise HisparseError("--comm and --comm-refit: give one (measure here, or fit a saved CSV)")
    if args.refit:
        raise HisparseError("--refit refits the kernel terms; --comm/--comm-refit the communication terms: give one")
    if args.comm:  # the harness writes its CSV there; a refit's files are swapped in by calibrate_comm
        os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, f"{args.gpu}.json")
    what = "--comm" if args.comm else f"--comm-refit {args.comm_refit}"
    command = f"hisparse calibrate {what} --gpu {args.gpu} --out {args.out}"
    if args.comm:
        from .comm_harness import HarnessConfig, run

        csv_path = run(HarnessConfig(out=args.out, csv_name=f"comm-{args.gpu}.csv", command=command))
    else:
        csv_path = args.comm_refit
    plot = os.path.join(args.out, f"comm-{args.gpu}.png")
    fits = calibrate_comm(csv_path, out_json, command, plot)
    print(format_fits(fits))
    print(f"wrote the 'comm' section of {out_json} and {plot} (raw timings {csv_path})")
    return 0

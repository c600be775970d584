"""Time DeepGEMM's masked grouped FP8 GEMM, the routed experts of a DeepEP low-latency decode pass, at the serving
model's shapes.

Usage (on one H100 / H200, with SGLang's pinned DeepGEMM installed: sgl-deep-gemm 0.1.3 + apache-tvm-ffi 0.1.9,
the wheels `benchmarks/prefill_session.sh prepare` fetches):
  python benchmarks/deepgemm_masked_moe.py [--tokens 4 8 12 16 32 64 128] [--out CSV]

Why: under `--moe-a2a-backend deepep` SGLang's decode passes send each rank's tokens to the experts' ranks with
DeepEP's low-latency dispatch and run the gate/up and down projections of the rank's local experts with
`deep_gemm.m_grouped_fp8_gemm_nt_masked` (`layers/moe/moe_runner/deep_gemm.py` `_run_masked_gemm`). The serving
model prices that kernel from published figures (`simulator/costmodel/published_kernels.py`: 4,233 GB/s from
DeepGEMM issue #20's H200 run at 256 groups x 64 rows, N 7168, K 4096, plus a 2 us launch). This times it where
the model uses it: GLM-5.2's 32 local experts of 256 (EP8), hidden 6,144, moe_intermediate 2,048, top-8, at the
tokens per rank of a decode batch; and issue #20's own shape, as a check on the figure.

What runs: per tokens-per-rank T, ranks x T tokens each route to top-k distinct experts drawn uniformly (seeded);
masked_m = the tokens of each of the first `--experts` experts (this rank's), expected_m = ceil(their mean), A
[experts, max_m, K] e4m3 with a float32 scale per 128 K, B [experts, N, K] e4m3 with a float32 scale per 128 x 128
block, A's scales put in the kernel's MN-major TMA-aligned layout first (`get_mn_major_tma_aligned_tensor`, as
DeepEP's low-latency dispatch hands them over; B's 128 x 128 blocks need none on SM90), D [experts, max_m, N] bf16.
The entry point is whichever name the installed build exports (`masked_entry`: DeepGEMM renamed it across releases;
sgl-deep-gemm 0.1.3 has `m_grouped_fp8_fp4_gemm_nt_masked` and the alias `fp8_m_grouped_gemm_nt_masked`). One
launch per CUDA-graph replay (the weights, 0.4-0.8 GB, are past L2 at every launch), median of --reps. Check: two
groups' rows against a float32 reference of the same dequantised product, relative error <= REL_TOL.

Also the GPU's streaming ceiling in the same process, a 4 GiB device-to-device copy counted read + write (the
method of the BRIEF's H200 figure, 4,266 GB/s, section 3): a `copy` row whose `weight_gbps` is that
figure. The kernel's bandwidth over it is the fraction of the GPU's HBM the kernel streams, which carries to a GPU
with its own measured copy figure.

Exit status: 0, every check passed; 1, a check or a launch failed (the CSV holds what was timed); 2, bad arguments,
or no PyTorch / Hopper GPU / deep_gemm.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fetched_build import (  # noqa: E402
    DEEP_GEMM_BLOCK as BLOCK,
)
from benchmarks.fetched_build import (
    UsageError,
    deep_gemm_sfa_layout,
    hopper_deep_gemm,
)
from benchmarks.fetched_build import block_fp8_reference as reference  # noqa: E402
from cupy_kernels.timing import time_calls_torch, torch_graph  # noqa: E402

REL_TOL = 2e-2
ISSUE20 = (256, 64, 7168, 4096)  # DeepGEMM issue #20: groups, rows per group, N, K (1,847 us on an H200)


def routed_counts(rng: np.random.Generator, tokens: int, ranks: int, experts: int, topk: int, local: int) -> np.ndarray:
    """Tokens each of the first ``local`` experts receives when ``ranks`` x ``tokens`` tokens each pick ``topk``
    distinct experts of ``experts`` uniformly."""
    picks = np.argsort(rng.random((ranks * tokens, experts)), axis=1)[:, :topk]
    return np.bincount(picks.ravel(), minlength=experts)[:local].astype(np.int32)


MASKED_ENTRIES = ("m_grouped_fp8_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked")


def masked_entry(dg: Any) -> tuple[str, Any]:
    """(name, function) of the masked grouped FP8 GEMM the installed DeepGEMM exports, else UsageError."""
    for name in MASKED_ENTRIES:
        fn = getattr(dg, name, None)
        if callable(fn):
            return name, fn
    raise UsageError(f"deep_gemm exports none of {', '.join(MASKED_ENTRIES)}")


class Row(NamedTuple):
    gemm: str
    groups: int
    n: int
    k: int
    tokens_per_rank: int
    pairs: int
    touched: int
    expected_m: int
    us: float
    rel_err: float

    @property
    def weight_gbps(self) -> float:
        """Weights of the experts that received a token, over the time (the model's bandwidth term)."""
        return self.touched * self.n * self.k / (self.us * 1e-6) / 1e9

    @property
    def ok(self) -> bool:
        return self.rel_err <= REL_TOL


def run_shape(torch: Any, dg: Any, gemm: str, counts: np.ndarray, n: int, k: int, max_m: int, tokens: int,
              args: argparse.Namespace) -> Row:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    groups = len(counts)
    fp8 = torch.float8_e4m3fn
    a = (torch.randn((groups, max_m, k), generator=gen, device=dev) * 0.5).to(fp8)
    a_sf = torch.rand((groups, max_m, k // BLOCK), generator=gen, device=dev) * 0.01 + 0.001
    b = (torch.randn((groups, n, k), generator=gen, device=dev) * 0.5).to(fp8)
    b_sf = torch.rand((groups, n // BLOCK, k // BLOCK), generator=gen, device=dev) * 0.01 + 0.001
    d = torch.empty((groups, max_m, n), dtype=torch.bfloat16, device=dev)
    masked_m = torch.tensor(counts, dtype=torch.int32, device=dev)
    expected_m = max(1, math.ceil(float(counts.sum()) / groups))
    _, gemm_fn = masked_entry(dg)
    a_sf_k = deep_gemm_sfa_layout(dg, a_sf)

    def launch(_: int = 0) -> None:
        gemm_fn((a, a_sf_k), (b, b_sf), d, masked_m, expected_m, disable_ue8m0_cast=True)

    launch()
    torch.cuda.synchronize()
    rel = 0.0
    for g in [int(i) for i in np.flatnonzero(counts)[:2]]:
        m = int(counts[g])
        ref = reference(a[g, :m], a_sf[g, :m], b[g], b_sf[g])
        got = d[g, :m].float()
        rel = max(rel, float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)) if torch.isfinite(got).all()
                  else math.inf)
    graph, _ = torch_graph(torch, launch, 1)
    times = time_calls_torch(torch, graph.replay, args.reps, warmup=2)
    del graph
    return Row(gemm, groups, n, k, tokens, int(counts.sum()), int((counts > 0).sum()), expected_m,
               float(np.median(times)) * 1e6, rel)


COPY_BYTES = 4 << 30  # the BRIEF's D2D copy size: far past L2


def copy_gbps(torch: Any, reps: int) -> float:
    """GB/s of a COPY_BYTES device-to-device copy counted read + write (median of ``reps``)."""
    src = torch.full((COPY_BYTES,), 3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = time_calls_torch(torch, lambda: dst.copy_(src), reps, warmup=3)
    return 2 * COPY_BYTES / float(np.median(times)) / 1e9


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4, 8, 12, 16, 32, 64, 128],
                    help="decode tokens per rank (requests x verify positions)")
    ap.add_argument("--ranks", type=int, default=8, help="EP ranks (default 8)")
    ap.add_argument("--experts", type=int, default=256, help="routed experts of the model (GLM-5.2: 256)")
    ap.add_argument("--topk", type=int, default=8, help="experts per token (GLM-5.2: 8)")
    ap.add_argument("--hidden", type=int, default=6144, help="hidden size (GLM-5.2: 6,144)")
    ap.add_argument("--inter", type=int, default=2048, help="moe_intermediate_size (GLM-5.2: 2,048)")
    ap.add_argument("--max-m", type=int, default=1024,
                    help="rows per group of the buffers (SGLang: DeepEP's 128 dispatch tokens per rank x ranks)")
    ap.add_argument("--no-issue20", dest="issue20", action="store_false", help="skip DeepGEMM issue #20's shape")
    ap.add_argument("--reps", type=int, default=20, help="graph replays timed per shape")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/deepgemm_masked_moe.csv"))
    args = ap.parse_args(argv)
    for name in ("ranks", "experts", "topk", "hidden", "inter", "max_m", "reps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.experts % args.ranks or args.topk > args.experts:
        raise UsageError(f"--experts {args.experts} must split evenly over --ranks {args.ranks} and be >= --topk")
    if args.hidden % BLOCK or args.inter % BLOCK:
        raise UsageError(f"--hidden and --inter must be multiples of {BLOCK} (the FP8 scale blocks)")
    if any(t < 1 or t * args.ranks > args.max_m for t in args.tokens):
        raise UsageError(f"--tokens must each be >= 1 and at most --max-m / --ranks ({args.max_m // args.ranks})")
    return args


def shapes(args: argparse.Namespace) -> list[tuple[str, np.ndarray, int, int, int, int]]:
    """(gemm, masked counts, N, K, max_m, tokens per rank) of every launch to time, in order."""
    rng = np.random.default_rng(args.seed)
    local = args.experts // args.ranks
    out = []
    for t in args.tokens:
        counts = routed_counts(rng, t, args.ranks, args.experts, args.topk, local)
        out.append(("gate_up", counts, 2 * args.inter, args.hidden, args.max_m, t))
        out.append(("down", counts, args.hidden, args.inter, args.max_m, t))
    if args.issue20:
        g, m, n, k = ISSUE20
        out.append(("issue20", np.full(g, m, dtype=np.int32), n, k, m, 0))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        torch, dg = hopper_deep_gemm()
        entry, _ = masked_entry(dg)
    except UsageError as exc:
        print(f"deepgemm_masked_moe: {exc}", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name} ({props.multi_processor_count} SMs); deep_gemm {getattr(dg, '__version__', '?')}.{entry}",
          flush=True)
    copy = copy_gbps(torch, args.reps)
    print(f"device-to-device copy (read + write): {copy:.0f} GB/s", flush=True)
    rows: list[Row] = []
    failed = ""
    for gemm, counts, n, k, max_m, t in shapes(args):
        try:
            r = run_shape(torch, dg, gemm, counts, n, k, max_m, t, args)
        except Exception as exc:  # a launch or CUDA error: keep what was measured, say where it stopped
            failed = f"{gemm} tokens={t}: {type(exc).__name__}: {str(exc)[:400]}"
            print(f"deepgemm_masked_moe: stopped at {failed}", file=sys.stderr, flush=True)
            break
        rows.append(r)
        print(f"{gemm} T {t}: {r.us:.1f} us, {r.touched}/{r.groups} experts, {r.pairs} rows, expected_m "
              f"{r.expected_m}, {r.weight_gbps:.0f} GB/s of weights, rel err {r.rel_err:.1e}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "gemm", "groups", "n", "k", "tokens_per_rank", "pairs", "touched", "expected_m", "us",
                    "weight_gbps", "rel_err"])
        w.writerow([props.name, "copy", 0, 0, 0, 0, 0, 0, 0, f"{2 * COPY_BYTES / copy / 1e3:.1f}", f"{copy:.0f}", "0"])
        for r in rows:
            w.writerow([props.name, r.gemm, r.groups, r.n, r.k, r.tokens_per_rank, r.pairs, r.touched, r.expected_m,
                        f"{r.us:.1f}", f"{r.weight_gbps:.0f}", f"{r.rel_err:.2e}"])
    print(f"wrote {args.out}")
    bad = [r for r in rows if not r.ok]
    for r in bad:
        print(f"deepgemm_masked_moe: {r.gemm} T {r.tokens_per_rank}: rel err {r.rel_err:.2e} > {REL_TOL}", file=sys.stderr)
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Time NCCL collectives at the message sizes of a DSA decode step (``benchmarks/comm.py``).

One process per GPU (torchrun, or spawned here with torch.multiprocessing). For each GPU count
n (2, 4, 8 by default) ranks 0..n-1 form a group and time all_reduce (TP), all_gather and
reduce_scatter (DP-attention gather and scatter) at hidden x tokens-per-rank x bf16, and
all_to_all at the MoE dispatch (fp8 rows with their scales) and combine (bf16) sizes of top-8
routing: tokens x 8 rows per rank, spread evenly over the ranks (uniform routing). On GPUs each
timed repeat is one CUDA-graph replay of ``--ops`` back-to-back collectives between CUDA events
(a serving engine replays its decode step as a graph, so launch overhead is not the
collective's), started with the GPUs aligned (see ``time_op``); ``--timing eager`` queues the
launches instead. A repeat takes the slowest rank's
time; the CSV holds the median, p10 and p90 over repeats.

NVLink multicast (NVLS) stays off: a program that uses it can put a shared host's GPUs out of
service. The variables are set before the process group starts and checked in every rank.
``--backend gloo --device cpu`` runs the same code on CPU processes (tests, dry runs).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass

from ..errors import HisparseError
from .comm import COLLECTIVES, busbw_factor

# NVLink multicast off in NCCL, PyTorch symmetric memory and NVSHMEM (the machines' rule).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# hidden_size: GLM-5.1 6144 (zai-org/GLM-5 config.json, same architecture), DeepSeek-V3.2 7168
# (deepseek-ai DeepSeek-V3.2-Exp inference/config_671B_v3.2.json, "dim").
DEFAULT_HIDDEN = (6144, 7168)
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_GPUS = (2, 4, 8)
TOP_K = 8  # routed experts per token (both models' num_experts_per_tok)


def bf16_row(hidden: int) -> int:
    return 2 * hidden


def fp8_dispatch_row(hidden: int) -> int:
    """DeepEP's FP8 dispatch row: e4m3 values plus an fp32 scale per 128 channels
    (deepseek-ai/DeepEP: FP8 dispatch, BF16 combine)."""
    return hidden + 4 * -(-hidden // 128)


# What each timed message stands for in a decode step: (collective, purpose, bytes of one token's
# row, rows a token sends). MoE rows count top-8 copies: an upper bound, as DeepEP sends a token
# once per destination rank (at most min(8, n) of them); the serving model evaluates the fitted
# line at its own byte counts, which the 1..256-token range covers.
PURPOSES = (("all_reduce", "tp_all_reduce", bf16_row, 1),
            ("all_gather", "dp_gather", bf16_row, 1),
            ("reduce_scatter", "dp_scatter", bf16_row, 1),
            ("all_to_all", "moe_dispatch", fp8_dispatch_row, TOP_K),
            ("all_to_all", "moe_combine", bf16_row, TOP_K))


def disable_multicast(environ: MutableMapping[str, str] | None = None) -> None:
    """Set the NVLS-off variables; refuse a value that turns multicast on."""
    env = os.environ if environ is None else environ
    for key, value in MULTICAST_OFF.items():
        if env.get(key, value) != value:
            raise HisparseError(f"{key}={env[key]} in the environment: NVLink multicast must stay off "
                                f"({key}={value}); unset it")
        env[key] = value


def assert_multicast_off(environ: Mapping[str, str] | None = None) -> None:
    """Every rank checks this before it starts NCCL."""
    env = os.environ if environ is None else environ
    wrong = [f"{k}={env.get(k, '<unset>')}" for k, v in MULTICAST_OFF.items() if env.get(k) != v]
    if wrong:
        raise HisparseError(f"NVLink multicast is not off: {', '.join(wrong)} (need "
                            f"{', '.join(f'{k}={v}' for k, v in MULTICAST_OFF.items())})")


@dataclass(frozen=True)
class Message:
    """One timed collective: its per-rank payload and the size nccl-tests would print for it."""

    collective: str
    purpose: str
    hidden: int
    tokens_per_rank: int
    row_bytes: int
    copies: int

    @property
    def dtype_bytes(self) -> int:
        """Reductions run on bf16; all_to_all moves bytes (uint8), whatever the row holds."""
        return 1 if self.collective == "all_to_all" else 2

    def elements(self, n: int) -> int:
        """Elements of one rank's own chunk (all_to_all: its whole send buffer, a multiple of n)."""
        e = self.tokens_per_rank * self.copies * self.row_bytes // self.dtype_bytes
        return (e // n) * n if self.collective == "all_to_all" else e

    def nccl_bytes(self, n: int) -> int:
        """nccl-tests' size: all_gather's output and reduce_scatter's input are n chunks."""
        chunks = n if self.collective in ("all_gather", "reduce_scatter") else 1
        return chunks * self.elements(n) * self.dtype_bytes


def messages(hidden: Sequence[int], tokens: Sequence[int], collectives: Sequence[str]) -> list[Message]:
    return [Message(coll, purpose, h, t, row(h), copies)
            for coll, purpose, row, copies in PURPOSES if coll in collectives
            for h in hidden for t in tokens]


@dataclass(frozen=True)
class HarnessConfig:
    out: str
    csv_name: str = "comm.csv"
    backend: str = "nccl"
    device: str | None = None  # None: cuda for nccl, cpu for gloo
    nproc: int | None = None  # processes to spawn; None: one per GPU (gloo: the largest GPU count)
    gpus: tuple[int, ...] = DEFAULT_GPUS
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    tokens: tuple[int, ...] = DEFAULT_TOKENS
    collectives: tuple[str, ...] = COLLECTIVES
    warmup: int = 5
    repeats: int = 50
    ops: int = 20
    timing: str = "graph"
    command: str = ""

    @property
    def device_kind(self) -> str:
        return self.device or ("cuda" if self.backend == "nccl" else "cpu")

    @property
    def csv_path(self) -> str:
        return os.path.join(self.out, self.csv_name)


def check_config(cfg: HarnessConfig, world: int) -> tuple[int, ...]:
    """The GPU counts to run with ``world`` processes; a bad option is a one-line error."""
    if (cfg.backend, cfg.device_kind) not in (("nccl", "cuda"), ("gloo", "cpu")):
        raise HisparseError(f"--backend {cfg.backend} --device {cfg.device_kind}: use nccl with cuda or gloo with cpu")
    bad = [c for c in cfg.collectives if c not in COLLECTIVES]
    if bad:
        raise HisparseError(f"--collectives: {', '.join(bad)} unknown (known: {', '.join(COLLECTIVES)})")
    if cfg.timing not in ("graph", "eager"):
        raise HisparseError(f"--timing {cfg.timing}: use graph or eager")
    for name in ("warmup", "repeats", "ops"):
        if getattr(cfg, name) < (0 if name == "warmup" else 1):
            raise HisparseError(f"--{name} {getattr(cfg, name)}: too small")
    if any(v < 1 for v in cfg.hidden + cfg.tokens):
        raise HisparseError("--hidden and --tokens take positive integers")
    if world < 2:
        raise HisparseError(f"{world} process(es): collectives need at least 2 (GPUs seen: {world})")
    counts = tuple(n for n in cfg.gpus if 2 <= n <= world)
    if not counts:
        raise HisparseError(f"--gpus {','.join(map(str, cfg.gpus))}: none between 2 and {world} processes")
    return counts


# ---- one rank ------------------------------------------------------------------------------


def _all_gather(out, inp, group) -> None:
    import torch.distributed as dist

    # all_gather_into_tensor, renamed all_gather_single in newer PyTorch (same collective).
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp, group=group)


def _reduce_scatter(out, inp, group) -> None:
    import torch.distributed as dist

    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp, group=group)


def _make_op(msg: Message, n: int, group, device) -> Callable[[], None]:
    """The collective on preallocated zero buffers (zeros keep repeated sums finite)."""
    import torch
    import torch.distributed as dist

    dtype = torch.bfloat16 if msg.dtype_bytes == 2 else torch.uint8
    e = msg.elements(n)
    if msg.collective == "all_reduce":
        x = torch.zeros(e, dtype=dtype, device=device)
        return lambda: dist.all_reduce(x, group=group)
    if msg.collective == "all_gather":
        x, y = torch.zeros(e, dtype=dtype, device=device), torch.zeros(n * e, dtype=dtype, device=device)
        return lambda: _all_gather(y, x, group)
    if msg.collective == "reduce_scatter":
        x, y = torch.zeros(n * e, dtype=dtype, device=device), torch.zeros(e, dtype=dtype, device=device)
        return lambda: _reduce_scatter(y, x, group)
    x, y = torch.zeros(e, dtype=dtype, device=device), torch.zeros(e, dtype=dtype, device=device)
    return lambda: dist.all_to_all_single(y, x, group=group)


def check_collectives(group, n: int, device) -> None:
    """Each collective gives the right answer on this group before any is timed."""
    import torch
    import torch.distributed as dist

    r = dist.get_rank(group)
    bf = dict(dtype=torch.bfloat16, device=device)
    x = torch.full((4,), float(r + 1), **bf)
    dist.all_reduce(x, group=group)
    expect = {"all_reduce": (x, torch.full((4,), n * (n + 1) / 2, **bf))}
    g = torch.empty(4 * n, **bf)
    _all_gather(g, torch.full((4,), float(r), **bf), group)
    expect["all_gather"] = (g, torch.arange(n, **bf).repeat_interleave(4))
    s = torch.empty(4, **bf)
    _reduce_scatter(s, torch.arange(n, **bf).repeat_interleave(4), group)
    expect["reduce_scatter"] = (s, torch.full((4,), float(n * r), **bf))
    a = torch.empty(2 * n, **bf)
    dist.all_to_all_single(a, (r * n + torch.arange(n, **bf)).repeat_interleave(2), group=group)
    expect["all_to_all"] = (a, (torch.arange(n, **bf) * n + r).repeat_interleave(2))
    for name, (got, want) in expect.items():
        if not torch.equal(got, want):
            raise RuntimeError(f"{name} on {n} ranks gave {got.tolist()} on rank {r}, expected {want.tolist()}")


def _barrier(cpu_group, cuda: bool) -> None:
    """Align the ranks: drain this GPU, then a host barrier (so no GPU spins in a barrier kernel)."""
    import torch
    import torch.distributed as dist

    if cuda:
        torch.cuda.synchronize()
    dist.barrier(group=cpu_group)


# Spin-kernel length that holds a GPU stream while the host queues one repeat (~0.5 ms at 2 GHz),
# plus per eagerly launched collective.
HOLD_CYCLES, HOLD_CYCLES_PER_LAUNCH = 1_000_000, 80_000


def time_op(op: Callable[[], None], cfg: HarnessConfig, cpu_group, cuda: bool,
            align: Callable[[], None] | None = None) -> tuple[list[float], str]:
    """Seconds per collective for each repeat on this rank, and the timing used.

    GPU: after a host barrier, a spin kernel holds the stream while the host queues ``align``
    (a 1-element all_reduce: it ends at nearly the same moment on every GPU), the start event,
    the ``ops`` collectives and the end event; so the timed region starts with the GPUs aligned
    and holds no host launch gaps, as in a replayed decode step."""
    import torch

    for _ in range(cfg.warmup):
        op()
    _barrier(cpu_group, cuda)
    out: list[float] = []
    if not cuda:
        for _ in range(cfg.repeats):
            _barrier(cpu_group, cuda)
            t0 = time.perf_counter()
            for _ in range(cfg.ops):
                op()
            out.append((time.perf_counter() - t0) / cfg.ops)
        return out, "wall"
    graph = _capture(op, cfg.ops, cpu_group) if cfg.timing == "graph" else None
    run = graph.replay if graph is not None else (lambda: [op() for _ in range(cfg.ops)])
    run()
    hold = getattr(torch.cuda, "_sleep", None)  # PyTorch's spin kernel (private, long-standing)
    cycles = HOLD_CYCLES + (0 if graph is not None else cfg.ops * HOLD_CYCLES_PER_LAUNCH)
    for _ in range(cfg.repeats):
        _barrier(cpu_group, cuda)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hold is not None:
            hold(cycles)
        if align is not None:
            align()
        start.record()
        run()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e-3 / cfg.ops)
    return out, "graph" if graph is not None else "eager"


def _capture(op: Callable[[], None], ops: int, cpu_group):
    """``ops`` collectives captured in one CUDA graph, or None (then every rank times eagerly:
    the ranks agree, so all of them issue the same collectives)."""
    import torch
    import torch.distributed as dist

    graph = torch.cuda.CUDAGraph()
    try:  # thread_local: ProcessGroupNCCL's watchdog thread keeps querying its events meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(ops):
                op()
        ok = 1
    except Exception as exc:  # capture support differs between PyTorch/NCCL builds
        print(f"rank {dist.get_rank()}: CUDA-graph capture failed ({exc}); timing eagerly", flush=True)
        ok = 0
    flag = torch.tensor([ok], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=cpu_group)
    return graph if int(flag) == 1 else None


def _slowest_rank(times: list[float], cpu_group, n: int) -> list[float]:
    """Per repeat, the slowest rank's time (a collective ends when its last rank does)."""
    import torch

    mine = torch.tensor(times, dtype=torch.float64)
    allr = torch.empty(n * len(times), dtype=torch.float64)
    _all_gather(allr, mine, cpu_group)
    return allr.view(n, len(times)).max(dim=0).values.tolist()


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    i = q * (len(s) - 1)
    lo = int(i)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (i - lo)


def run_rank(rank: int, world: int, cfg: HarnessConfig, local_rank: int, init_method: str) -> None:
    """One process: join the group, time every message for every GPU count, rank 0 writes the CSV."""
    import torch
    import torch.distributed as dist

    disable_multicast()
    assert_multicast_off()
    cuda = cfg.device_kind == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(cfg.backend, init_method=init_method, rank=rank, world_size=world)
    try:
        rows = _run_counts(rank, world, cfg, device, cuda)
        if rank == 0:
            write_csv(cfg, rows, _metadata(cfg, cuda, timing=",".join(sorted({r["timing"] for r in rows}))))
    finally:
        dist.destroy_process_group()


def _run_counts(rank: int, world: int, cfg: HarnessConfig, device, cuda: bool) -> list[dict]:
    import torch.distributed as dist

    rows: list[dict] = []
    msgs = messages(cfg.hidden, cfg.tokens, cfg.collectives)
    world_cpu = dist.new_group(backend="gloo") if cuda else None  # host barriers between GPU counts
    for n in check_config(cfg, world):
        ranks = list(range(n))
        group = dist.new_group(ranks)  # every rank creates every group, in the same order
        cpu_group = dist.new_group(ranks, backend="gloo") if cuda else group
        if rank < n:
            check_collectives(group, n, device)
            align = _make_op(Message("all_reduce", "align", 1, 1, 2, 1), n, group, device) if cuda else None
            for i, msg in enumerate(msgs):
                times, timing = time_op(_make_op(msg, n, group, device), cfg, cpu_group, cuda, align)
                rows.append(_row(msg, n, _slowest_rank(times, cpu_group, n), cfg, timing))
                if rank == 0 and ((i + 1) % 10 == 0 or i + 1 == len(msgs)):
                    print(f"{n} ranks: {i + 1}/{len(msgs)} messages timed ({timing})", flush=True)
        _barrier(world_cpu, cuda)
    return rows


def _row(msg: Message, n: int, times: list[float], cfg: HarnessConfig, timing: str) -> dict:
    med = statistics.median(times)
    size = msg.nccl_bytes(n)
    algbw = size / med
    return dict(collective=msg.collective, purpose=msg.purpose, n_gpus=n, hidden=msg.hidden,
                tokens_per_rank=msg.tokens_per_rank, row_bytes=msg.row_bytes, copies=msg.copies, bytes=size,
                time_us=med * 1e6, time_us_p10=_percentile(times, 0.1) * 1e6,
                time_us_p90=_percentile(times, 0.9) * 1e6, algbw_gbps=algbw / 1e9,
                busbw_gbps=algbw * busbw_factor(msg.collective, n) / 1e9,
                repeats=cfg.repeats, ops_per_repeat=cfg.ops, timing=timing, backend=cfg.backend)


def _metadata(cfg: HarnessConfig, cuda: bool, timing: str) -> dict[str, str]:
    import torch

    meta = {"command": cfg.command,
            "device": f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if cuda else "cpu",
            "torch": torch.__version__,
            "nccl": _nccl_version() if cuda else "",
            "backend": cfg.backend, "timing": timing,
            "env": " ".join(f"{k}={os.environ.get(k, '<unset>')}" for k in MULTICAST_OFF),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return {k: v for k, v in meta.items() if v}


def _nccl_version() -> str:
    import torch

    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def write_csv(cfg: HarnessConfig, rows: list[dict], meta: dict[str, str]) -> None:
    """The raw table, with ``# key: value`` lines on top saying how it was measured."""
    import pandas as pd

    from ..fileio import atomic_output

    head = "".join(f"# {k}: {v}\n" for k, v in meta.items())
    with atomic_output(cfg.csv_path) as fh:
        fh.write((head + pd.DataFrame(rows).to_csv(index=False)).encode())


# ---- launching -----------------------------------------------------------------------------


def _spawned(rank: int, world: int, cfg: HarnessConfig, port: int) -> None:
    run_rank(rank, world, cfg, rank, f"tcp://127.0.0.1:{port}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cfg: HarnessConfig) -> str:
    """Measure with this process as launcher (under torchrun: as one of the ranks); the CSV path."""
    disable_multicast()  # before any child starts, so every rank inherits it
    os.makedirs(cfg.out, exist_ok=True)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        check_config(cfg, world)
        run_rank(rank, world, cfg, int(os.environ.get("LOCAL_RANK", rank)), "env://")
        return cfg.csv_path
    import torch
    import torch.multiprocessing as mp

    if cfg.nproc is not None:
        world = cfg.nproc
    elif cfg.device_kind == "cuda":
        world = torch.cuda.device_count()
    else:
        world = max(cfg.gpus)
    if cfg.device_kind == "cuda" and world > torch.cuda.device_count():
        raise HisparseError(f"--nproc {world}: this machine has {torch.cuda.device_count()} GPU(s)")
    check_config(cfg, world)
    mp.spawn(_spawned, args=(world, cfg, _free_port()), nprocs=world, join=True)
    return cfg.csv_path


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def build_parser() -> argparse.ArgumentParser:
    d = HarnessConfig(out="")
    p = argparse.ArgumentParser(prog="benchmarks/comm.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder; the CSV is DIR/--csv-name")
    p.add_argument("--csv-name", default=d.csv_name, help=f"CSV file name (default {d.csv_name})")
    p.add_argument("--backend", default=d.backend, choices=("nccl", "gloo"), help="default nccl")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"), help="default cuda for nccl, cpu for gloo")
    p.add_argument("--nproc", type=int, default=None,
                   help="processes to spawn (default: one per GPU; gloo: the largest --gpus); ignored under torchrun")
    p.add_argument("--gpus", type=_ints, default=d.gpus, help="GPU counts to time (default 2,4,8; those <= processes)")
    p.add_argument("--hidden", type=_ints, default=d.hidden,
                   help="hidden sizes (default 6144,7168: GLM-5.1, DeepSeek-V3.2)")
    p.add_argument("--tokens", type=_ints, default=d.tokens, help="tokens per rank (default 1,2,4,...,256)")
    p.add_argument("--collectives", type=lambda s: tuple(s.split(",")), default=d.collectives,
                   help=f"subset to time (default {','.join(d.collectives)})")
    p.add_argument("--warmup", type=int, default=d.warmup, help=f"untimed collectives per message (default {d.warmup})")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"timed repeats per message (default {d.repeats})")
    p.add_argument("--ops", type=int, default=d.ops,
                   help=f"collectives per repeat, back to back in one graph (default {d.ops})")
    p.add_argument("--timing", default=d.timing, choices=("graph", "eager"),
                   help="GPU: CUDA-graph replay (default) or eager launches; CPU always wall clock")
    return p


def config_from_args(args: argparse.Namespace, command: str) -> HarnessConfig:
    fields = {k: getattr(args, k) for k in asdict(HarnessConfig(out="")) if hasattr(args, k)}
    return HarnessConfig(**(fields | {"command": command}))


def launch_command(argv: Sequence[str]) -> str:
    """The command line as a person would retype it (torchrun's when it started this process)."""
    script = ["benchmarks/comm.py", *argv]
    if "TORCHELASTIC_RUN_ID" in os.environ:
        script = ["torchrun", f"--nproc-per-node {os.environ.get('LOCAL_WORLD_SIZE', '?')}", *script]
    else:
        script = ["python", *script]
    return " ".join(script)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = launch_command(argv)
    try:
        path = run(config_from_args(args, command))
    except HisparseError as exc:
        print(f"comm: error: {exc}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"wrote {path}", flush=True)
    return 0

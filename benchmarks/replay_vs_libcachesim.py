"""Replay speed against libCacheSim, same stream, same run.

Two streams of 20,000 steps x k = 2048 (41 M accesses each):
- ``high-overlap``: the high-overlap generator preset (formerly "dsa-like"): ~95% of a step's
  set kept at the next, few changes per step;
- ``glm51-longbench``: realistic churn, layer 1 of a two-layer stack drawn with the knobs of
  `glm51-longbench`'s layer 30 of 78 (its middle band; ctx0 100,384): ~56% kept per step, LRU
  misses 13-17% at B = 2k (the preset's layer average is 13.4%).

For each: whole-process wall time of `hisparse replay --policy lru --buffer 4096` on the .hst
file, written with ``--compression stored`` unless told otherwise (compiled fast path; once with HISPARSE_NATIVE=0, the numba engine, whose misses must be
the same) against a process running libCacheSim's LRU `process_trace` on the same stream as
oracleGeneral records. Runs are interleaved (hisparse, libCacheSim, hisparse, ...) on this
noisy shared machine; the table gives medians and the ratio of the medians, then hisparse's CPU
time by phase (start-up, reading, inflating, decoding into step changes, LRU). Then accesses/s per policy,
in-process, both semantics (``--policy-steps 0`` skips it).

    python benchmarks/replay_vs_libcachesim.py [--steps 20000] [--repeats 5] [--compression stored|zlib]
        [--policy-steps 0]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = """import sys, time
from array import array
from simulator import native
from simulator.trace.format import TraceReader
clock = time.process_time
t = clock(); r = TraceReader(sys.argv[1]); chunks = r.coded_chunks(r.keys[0]); read = clock() - t
steps = sum(c.steps for c in chunks); ctx = array("q", bytes(8 * steps)); misses = array("q", bytes(8 * steps))
lru = native.BatchedLru(4096, reserve=True, prefix=True); spaces = [native._native.changes_new() for _ in range(2)]
inflate = decode = replay = 0.0; row = 0; into = (bytearray(), bytearray())
for i, c in enumerate(chunks):  # the two halves one after the other, in this thread
    t0 = clock(); raw = c.coded(into[i % 2]); t1 = clock()
    end = row + c.steps; view = memoryview(ctx)[row:end]
    native._native.decode_changes(spaces[i % 2], raw, c.steps, c.width, r.meta.k, ctx[row - 1] if row else 0, (4096,), view)
    t2 = clock()
    native._native.lru_apply_changes((lru.state,), (memoryview(misses)[row:end],), spaces[i % 2], c.steps, view)
    t3 = clock(); inflate += t1 - t0; decode += t2 - t1; replay += t3 - t2; row = end
print(read, inflate, decode, replay)
"""
LCS = """import sys, libcachesim as lcs
r = lcs.TraceReader(trace=sys.argv[1], trace_type=lcs.TraceType.ORACLE_GENERAL_TRACE)
print(lcs.LRU(cache_size=int(sys.argv[2])).process_trace(r)[0])
"""
GLM_LAYER = 30  # of 78: glm51-longbench's middle band


def run(cmd: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and stdout of a process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout.strip()


def misses_of(replay_output: str) -> int:
    """The misses column of `hisparse replay`'s one-row table."""
    header, row = replay_output.splitlines()[-2:]
    return int(row.split()[header.split().index("misses")])


def make_stream(name: str, steps: int, data: Path, compression: str):
    """The benchmark stream ``name`` as .hst (written with ``compression``) and oracleGeneral
    files (cached under ``data``)."""
    from simulator.trace import TraceMeta, open_trace, write_trace
    from simulator.trace.generator import PRESETS, generate, knobs_dict, load_knobs
    from simulator.trace.oracle import write_oracle_general

    hst = data / f"{name}-{steps}-{compression}.hst"
    if not hst.exists():
        if name == "high-overlap":
            knobs, layers, ctx0 = PRESETS["high-overlap"], 1, 32768
        else:
            knobs, layers, ctx0 = load_knobs("glm51-longbench").at_layer(GLM_LAYER, 78), 2, 100384
        *_, stream = generate(knobs, steps=steps, layers=layers, requests=1, k=2048, ctx0=ctx0, seed=0)
        source = {"kind": "synthetic", "generator": "hisparse-sim", "preset": name, "knobs": knobs_dict(knobs),
                  "seed": 0, "note": f"benchmark stream: layer {layers - 1} of {layers}"}
        write_trace(hst, TraceMeta(k=2048, source=source), [stream], compression=compression)
    stream = open_trace(hst).read(open_trace(hst).keys[0])
    oracle = data / f"{name}-{steps}.oracleGeneral.bin"  # the same records whatever the compression
    if not oracle.exists():
        write_oracle_general(stream, oracle)
    return hst, oracle, stream


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20000, help="steps per stream (default 20000)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved whole-process runs of each (default 5)")
    parser.add_argument("--streams", default="high-overlap,glm51-longbench", help="streams to time (default both)")
    parser.add_argument("--compression", choices=["stored", "zlib"], default="stored",
                        help="how the .hst streams are written (default stored: deflate's uncompressed blocks, "
                             "~1.5x the zlib file, read ~10x faster; `hisparse trace gen --compression`)")
    parser.add_argument("--policy-steps", type=int, default=4000,
                        help="stream length for the per-policy table (default 4000; 0 skips the table)")
    args = parser.parse_args()
    from simulator import native
    from simulator.serving.misses import cache_dir

    data = cache_dir() / "bench"
    data.mkdir(parents=True, exist_ok=True)
    if not native.available():
        print("the compiled fast path is not built (pip install -e . with a C compiler); timing the numba engine")
    hisparse = [sys.executable, "-m", "simulator.cli", "replay", "--policy", "lru", "--buffer", "4096", "--quiet"]
    # Byte-compiled as an installed package is (pip compiles; libCacheSim's Python side is too):
    # with PYTHONDONTWRITEBYTECODE set, an editable checkout would recompile ~30 modules per run.
    import compileall

    compileall.compile_dir(Path(native.__file__).parent.parent, quiet=1)
    rows, streams = [], {}
    for name in args.streams.split(","):
        hst, oracle, stream = make_stream(name, args.steps, data, args.compression)
        streams[name] = stream
        *_, ref = run(hisparse + [str(hst)], env={**os.environ, "HISPARSE_NATIVE": "0"})
        t_ours, t_lcs, c_ours, c_lcs = [], [], [], []
        for _ in range(args.repeats):
            t, c, out = run(hisparse + [str(hst)])
            assert misses_of(out) == misses_of(ref), f"{name}: fast path and numba engine disagree"
            t_ours.append(t)
            c_ours.append(c)
            t, c, lcs_ratio = run([sys.executable, "-c", LCS, str(oracle), "4096"])
            t_lcs.append(t)
            c_lcs.append(c)
        med = statistics.median
        # Where hisparse's CPU time goes: interpreter and imports (a process that only imports the
        # CLI), then in one process reading the chunks (with their crc32), inflating them, and
        # decoding + replaying the inflated bytes (the inflate-ahead thread is not used here).
        startup = med([run([sys.executable, "-c", "import simulator.cli"])[1] for _ in range(args.repeats)])
        phases = [[float(v) for v in run([sys.executable, "-c", PHASES, str(hst)])[2].split()]
                  for _ in range(args.repeats)]
        parts = (startup, *(med(p[i] for p in phases) for i in range(4)))
        rows.append((name, stream, misses_of(ref), float(lcs_ratio), med(t_ours), med(t_lcs), med(c_ours), med(c_lcs),
                     t_ours, t_lcs, parts))

    print(f"buffer 4096, k 2048, .hst written with --compression {args.compression}; medians of {args.repeats} "
          "interleaved whole-process runs (wall; CPU = user + system)\n")
    print("| stream | accesses | .hst MB | hisparse batched LRU misses (= numba engine) | libCacheSim LRU miss ratio "
          "(sequential) | hisparse wall / CPU s | libCacheSim wall / CPU s | libCacheSim / hisparse, wall | CPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, stream, misses, lcs_ratio, w_ours, w_lcs, c_ours, c_lcs, *_ in rows:
        mb = (data / f"{name}-{args.steps}-{args.compression}.hst").stat().st_size / 1e6
        print(f"| {name} | {stream.accesses:,} | {mb:.1f} | {misses:,} ({misses / stream.accesses:.4f}) | {lcs_ratio:.4f} | "
              f"{w_ours:.2f} / {c_ours:.2f} | {w_lcs:.2f} / {c_lcs:.2f} | **{w_lcs / w_ours:.1f}x** | "
              f"{c_lcs / c_ours:.1f}x |")
    for name, *_, t_ours, t_lcs, _ in rows:
        print(f"\n{name}: hisparse runs {', '.join(f'{t:.2f}' for t in t_ours)} s; "
              f"libCacheSim runs {', '.join(f'{t:.2f}' for t in t_lcs)} s")
    print("\nhisparse CPU s by phase (medians; the process runs decode and LRU on two threads, here one after the "
          "other): start-up and imports | read + crc32 | inflate | decode into step changes | LRU\n")
    for name, *_, parts in rows:
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in parts) + " |")
    if not args.policy_steps:
        return 0

    from simulator.replay import POLICIES, ReplayConfig, replay_stream
    from simulator.trace import Stream

    stream = next(iter(streams.values()))
    short = Stream(0, 0, stream.ctx_len[: args.policy_steps], stream.indices[: args.policy_steps])
    print(f"\naccesses/s per policy, buffer 4096, {short.accesses:,} accesses of {next(iter(streams))}, "
          "in-process after a warm-up:\n")
    print("| policy | batched M accesses/s | sequential M accesses/s |")
    print("|---|---|---|")

    def rate(cfg: ReplayConfig) -> float:
        replay_stream(Stream(0, 0, short.ctx_len[:50], short.indices[:50]), cfg)  # compile / warm up
        t0 = time.perf_counter()
        replay_stream(short, cfg)
        return short.accesses / (time.perf_counter() - t0) / 1e6

    for policy in POLICIES:
        rates = [rate(ReplayConfig(policy=policy, buffer=4096, semantics=s)) for s in ("batched", "sequential")]
        print(f"| {policy} | {rates[0]:.1f} | {rates[1]:.1f} |")
        if policy == "lru" and native.available():  # the row above used the compiled fast path
            os.environ["HISPARSE_NATIVE"] = "0"
            print(f"| lru, numba engine (HISPARSE_NATIVE=0) | {rate(ReplayConfig(buffer=4096)):.1f} | - |")
            del os.environ["HISPARSE_NATIVE"]
    print(f"\nmachine: {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay speed against libCacheSim, same stream, same run.

One stream of 20,000 steps x k = 2048 (41 M accesses, the dsa-like generator): whole-process
wall time of `hisparse replay --policy lru --buffer 4096` (.hst and .npy input; with the compiled
fast path of simulator/native and, for comparison, with HISPARSE_NATIVE=0, the numba engine)
against a process running libCacheSim's LRU `process_trace` on the same stream as
oracleGeneral records. Then accesses/s per policy, in-process, both semantics.

    python benchmarks/replay_vs_libcachesim.py [--steps 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

LCS = """import sys, libcachesim as lcs
r = lcs.TraceReader(trace=sys.argv[1], trace_type=lcs.TraceType.ORACLE_GENERAL_TRACE)
print(lcs.LRU(cache_size=int(sys.argv[2])).process_trace(r)[0])
"""


def wall(cmd: list[str], repeats: int, env: dict | None = None) -> tuple[float, str]:
    best, out = float("inf"), ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        best = min(best, time.perf_counter() - t0)
        out = proc.stdout.strip()
    return best, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy-steps", type=int, default=4000, help="stream length for the per-policy table")
    args = parser.parse_args()
    from simulator.serving.misses import cache_dir
    from simulator.trace import open_trace
    from simulator.trace.oracle import write_oracle_general

    data = cache_dir() / "bench"
    data.mkdir(parents=True, exist_ok=True)
    hst = data / f"dsa-like-{args.steps}.hst"
    if not hst.exists():
        subprocess.run([sys.executable, "-m", "simulator.cli", "trace", "gen", "--preset", "dsa-like", "--steps",
                        str(args.steps), "--layers", "1", "--requests", "1", "--topk", "2048", "--ctx0", "32768",
                        "--seed", "0", "--quiet", "--out", str(hst)], check=True)
    stream = open_trace(hst).read((0, 0))
    npy, oracle = data / f"dsa-like-{args.steps}.npy", data / f"dsa-like-{args.steps}.oracleGeneral.bin"
    if not npy.exists():
        np.save(npy, stream.indices)
    if not oracle.exists():
        write_oracle_general(stream, oracle)
    from simulator import native

    if not native.available():
        print("the compiled fast path is not built (pip install -e . with a C compiler); timing the numba engine")
    hisparse = [sys.executable, "-m", "simulator.cli", "replay", "--policy", "lru", "--buffer", "4096", "--quiet"]
    t_hst, out_fast = wall(hisparse + [str(hst)], args.repeats)
    t_ref, out_ref = wall(hisparse + [str(hst)], args.repeats, env={**os.environ, "HISPARSE_NATIVE": "0"})
    assert out_fast == out_ref, "fast path and numba engine disagree"
    t_npy, _ = wall(hisparse + [str(npy), "--ctx0", str(int(stream.ctx_len[0]))], args.repeats)
    t_seq, _ = wall(hisparse + ["--semantics", "sequential", "--initial", "empty", "--no-reserve-newest", str(npy),
                                "--ctx0", str(int(stream.ctx_len[0]))], args.repeats)
    t_lcs, ratio = wall([sys.executable, "-c", LCS, str(oracle), "4096"], args.repeats)
    print(f"stream: {stream.steps} steps, {stream.accesses:,} accesses; best of {args.repeats} whole-process runs\n")
    print("| command | wall s | libCacheSim time / this |")
    print("|---|---|---|")
    print(f"| libCacheSim LRU process_trace (oracleGeneral, sequential; miss ratio {float(ratio):.4f}) | {t_lcs:.2f} | 1.00 |")
    print(f"| hisparse replay, .hst, batched LRU | {t_hst:.2f} | {t_lcs / t_hst:.2f} |")
    print(f"| hisparse replay, .hst, batched LRU, HISPARSE_NATIVE=0 (numba engine) | {t_ref:.2f} | {t_lcs / t_ref:.2f} |")
    print(f"| hisparse replay, .npy, batched LRU | {t_npy:.2f} | {t_lcs / t_npy:.2f} |")
    print(f"| hisparse replay, .npy, sequential LRU from empty (libCacheSim's semantics) | {t_seq:.2f} | {t_lcs / t_seq:.2f} |")

    from simulator.replay import POLICIES, ReplayConfig, replay_stream
    from simulator.trace import Stream

    short = Stream(0, 0, stream.ctx_len[: args.policy_steps], stream.indices[: args.policy_steps])
    print(f"\naccesses/s per policy, buffer 4096, {short.accesses:,} accesses, in-process after a warm-up:\n")
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

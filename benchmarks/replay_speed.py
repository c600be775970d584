"""`hisparse replay` against libCacheSim's LRU where users wait: whole processes, same run.

Each row is one workload, timed as whole processes on both sides, interleaved (hisparse,
libCacheSim, hisparse, ...), ``--repeats`` times; the table gives the medians and the ratio of
the medians (libCacheSim / hisparse: above 1, hisparse is faster). libCacheSim is fed fairly: the
same access stream as oracleGeneral records, one cache per stream in one process (LRU; Belady
and LFU for the OPT and LFU rows), its hash
table sized to the cache (``hashpower`` = log2 of the buffer + 1, not its default 2**24 buckets).

Rows (buffer 4096 unless told; the .hst files are the bundled ones or made from them, cached):

- ``glm51-longbench`` batched LRU on ``traces/glm51-longbench.hst`` (78 layers x 128 steps,
  k = 2048, as bundled: format version 3, ``--compression auto``), and the same trace rewritten
  ``--compression zlib`` and ``--compression stored`` (``trace convert``, cached per format version);
- ``8x longer``: 10 layers of the glm51-longbench preset at 1,024 steps (``trace gen``);
- ``high-overlap``: ``traces/synthetic-dsa-like.hst``;
- ``sequential``: ``--semantics sequential --initial empty --no-reserve-newest`` on
  glm51-longbench (libCacheSim's LRU, miss for miss: the benchmark asserts the counts agree);
- ``opt-sequential`` / ``lfu-sequential``: sequential OPT / LFU on the high-overlap trace
  against libCacheSim's Belady / LFU (same flags as ``sequential``; misses asserted equal);
- ``.npy``: four real SmolLM2 top-k streams (layers 0, 10, 20, 29 of
  ``traces/smollm2-gpl3-k512.hst`` as ``[steps, k]`` int32 arrays), buffer 1024, one process per
  file on each side.

After the table, the floor: a replay of a 2-step trace (start-up alone) beside ``import libcachesim``.

    python benchmarks/replay_speed.py [--repeats 5] [--rows glm51,glm51-stored,...] [--no-floor]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package, as the timed processes (cwd ROOT) import it
LCS = """import sys, math, libcachesim as lcs
policy = getattr(lcs, sys.argv[1]); b = int(sys.argv[2]); hp = max(4, math.ceil(math.log2(b)) + 1); misses = 0
for path in sys.argv[3:]:
    r = lcs.TraceReader(trace=path, trace_type=lcs.TraceType.ORACLE_GENERAL_TRACE)
    ratio, byte_ratio = policy(cache_size=b, hashpower=hp).process_trace(r)
    misses += round(ratio * r.get_num_of_req())
print(misses)
"""


def run(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and stdout of a process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout.strip()


def misses_of(out: str) -> int:
    header, row = out.splitlines()[-2:]
    return int(row.split()[header.split().index("misses")])


def oracle_files(trace: str, data: Path, name: str, ctx0: int | None = None) -> list[str]:
    """One oracleGeneral file per stream of ``trace`` (cached)."""
    from simulator.trace import open_trace
    from simulator.trace.oracle import write_oracle_general

    src = open_trace(trace, ctx0=ctx0)
    out = []
    for i, key in enumerate(src.keys):
        path = data / f"{name}-{i}.oracleGeneral.bin"
        if not path.exists():
            write_oracle_general(src.read(key), path)
        out.append(str(path))
    return out


def make_inputs(data: Path) -> dict[str, tuple[list[list[str]], list[str], int]]:
    """Per row: the hisparse command lines (one process each), the oracle files, the buffer."""
    import numpy as np

    from simulator.trace import open_trace
    from simulator.trace.stream import FORMAT_VERSION

    glm = str(ROOT / "traces" / "glm51-longbench.hst")
    v = f"v{FORMAT_VERSION}"  # cached files are remade when the writer's format changes
    converted = {}
    for how in ("stored", "zlib"):
        converted[how] = data / f"glm51-longbench-{how}-{v}.hst"
        if not converted[how].exists():
            subprocess.run([sys.executable, "-m", "simulator.cli", "trace", "convert", glm, "--out",
                            str(converted[how]), "--compression", how], check=True, cwd=ROOT)
    longer = data / f"glm51-longbench-1024x10-{v}.hst"
    if not longer.exists():
        subprocess.run([sys.executable, "-m", "simulator.cli", "trace", "gen", "--preset", "glm51-longbench",
                        "--steps", "1024", "--layers", "10", "--out", str(longer), "--quiet"], check=True, cwd=ROOT)
    npys = []
    smol = open_trace(ROOT / "traces" / "smollm2-gpl3-k512.hst")
    for layer in (0, 10, 20, 29):
        path = data / f"smollm2-gpl3-k512-layer{layer}.npy"
        if not path.exists():
            s = smol.read((0, layer))
            assert (np.diff(s.ctx_len) == 1).all()  # .npy streams grow by one token a step
            np.save(path, s.indices.astype(np.int32))
        npys.append((str(path), int(smol.read((0, layer)).ctx_len[0])))
    replay = [sys.executable, "-m", "simulator.cli", "replay", "--policy", "lru", "--quiet"]
    glm_or = oracle_files(glm, data, "glm51-longbench")
    seq = ["--semantics", "sequential", "--initial", "empty", "--no-reserve-newest"]
    npy_or = [oracle_files(p, data, Path(p).stem, ctx0=c)[0] for p, c in npys]
    return {
        "glm51": ([replay + ["--buffer", "4096", glm]], glm_or, 4096),
        "glm51-zlib": ([replay + ["--buffer", "4096", str(converted["zlib"])]], glm_or, 4096),
        "glm51-stored": ([replay + ["--buffer", "4096", str(converted["stored"])]], glm_or, 4096),
        "8x-longer": ([replay + ["--buffer", "4096", str(longer)]], oracle_files(str(longer), data, "glm51-1024x10"), 4096),
        "high-overlap": ([replay + ["--buffer", "4096", str(ROOT / "traces" / "synthetic-dsa-like.hst")]],
                         oracle_files(str(ROOT / "traces" / "synthetic-dsa-like.hst"), data, "dsa-like"), 4096),
        "sequential": ([replay + ["--buffer", "4096", *seq, glm]], glm_or, 4096),
        "npy": ([replay + ["--buffer", "1024", "--ctx0", str(c), p] for p, c in npys], npy_or, 1024),
        "opt-sequential": ([replay[:-3] + ["--policy", "opt", "--quiet", "--buffer", "4096", *seq,
                                            str(ROOT / "traces" / "synthetic-dsa-like.hst")]],
                           oracle_files(str(ROOT / "traces" / "synthetic-dsa-like.hst"), data, "dsa-like"), 4096),
        "lfu-sequential": ([replay[:-3] + ["--policy", "lfu", "--quiet", "--buffer", "4096", *seq,
                                            str(ROOT / "traces" / "synthetic-dsa-like.hst")]],
                           oracle_files(str(ROOT / "traces" / "synthetic-dsa-like.hst"), data, "dsa-like"), 4096),
    }


def floor(data: Path, repeats: int) -> None:
    """What no replay can go below: ``hisparse replay`` of a 2-step trace (the interpreter, its
    site packages, the CLI's imports and set-up) beside ``import libcachesim`` alone, and the
    glm51 row's hisparse time that 10x libCacheSim would need."""
    import numpy as np

    from simulator.trace import Stream, TraceMeta, write_trace

    tiny = data / "tiny.hst"
    write_trace(tiny, TraceMeta(k=2048, source={"kind": "floor"}),
                [Stream(0, 0, np.array([5000, 5001]), np.array([[1, 2], [2, 3]], dtype=np.int32))])
    ours = [run([sys.executable, "-m", "simulator.cli", "replay", "--policy", "lru", "--buffer", "4096", "--quiet",
                 str(tiny)])[:2] for _ in range(repeats)]
    theirs = [run([sys.executable, "-c", "import libcachesim"])[:2] for _ in range(repeats)]
    bare = [run([sys.executable, "-c", "pass"])[:2] for _ in range(repeats)]
    med = statistics.median
    print(f"\nfloor (medians of {repeats}, wall / CPU s): `hisparse replay` of a 2-step trace "
          f"{med(x[0] for x in ours):.3f} / {med(x[1] for x in ours):.3f}; `python -c pass` "
          f"{med(x[0] for x in bare):.3f} / {med(x[1] for x in bare):.3f}; `import libcachesim` "
          f"{med(x[0] for x in theirs):.3f} / {med(x[1] for x in theirs):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default="glm51,glm51-zlib,glm51-stored,8x-longer,high-overlap,sequential,npy,"
                                          "opt-sequential,lfu-sequential")
    parser.add_argument("--no-floor", action="store_true", help="skip the start-up floor line")
    args = parser.parse_args()
    from simulator.serving.misses import cache_dir

    data = cache_dir() / "bench-speed"
    data.mkdir(parents=True, exist_ok=True)
    import compileall

    compileall.compile_dir(ROOT / "simulator", quiet=1)  # byte-compiled, as an install leaves it
    inputs = make_inputs(data)
    print(f"medians of {args.repeats} interleaved whole-process runs (wall; CPU = user + system); {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start\n")
    print("| row | hisparse misses | libCacheSim misses | hisparse wall / CPU s | libCacheSim wall / CPU s "
          "| libCacheSim / hisparse, wall | CPU |")
    print("|---|---|---|---|---|---|---|")
    for name in args.rows.split(","):
        cmds, oracles, buffer = inputs[name]
        ours, theirs = [], []
        for _ in range(args.repeats):
            t, c, misses = 0.0, 0.0, 0
            for cmd in cmds:
                dt, dc, out = run(cmd)
                t, c = t + dt, c + dc
                misses += misses_of(out)
            ours.append((t, c))
            t, c, lcs_misses = 0.0, 0.0, 0
            for files in ([oracles] if len(cmds) == 1 else [[f] for f in oracles]):
                policy = {"opt-sequential": "Belady", "lfu-sequential": "LFU"}.get(name, "LRU")
                dt, dc, out = run([sys.executable, "-c", LCS, policy, str(buffer), *files])
                t, c = t + dt, c + dc
                lcs_misses += int(out)
            theirs.append((t, c))
        if name in ("sequential", "opt-sequential", "lfu-sequential"):
            assert misses == lcs_misses, f"{name}: hisparse {misses} != libCacheSim {lcs_misses}"
        med = statistics.median
        a, ac = med(x[0] for x in ours), med(x[1] for x in ours)
        b, bc = med(x[0] for x in theirs), med(x[1] for x in theirs)
        print(f"| {name} | {misses:,} | {lcs_misses:,} | {a:.2f} / {ac:.2f} | {b:.2f} / {bc:.2f} | **{b / a:.1f}x** "
              f"| {bc / ac:.1f}x |", flush=True)
    if not args.no_floor:
        floor(data, args.repeats)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

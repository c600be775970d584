"""The swap-in decision table's end-to-end half (issue #27 item 3): ``hisparse plan`` once per
design in the default scenario and in the PD preset, misses from each design's policy replayed
on the scenario's trace, the kernel's fixed cost from ``hisparse.swap_in_copy``.

Designs: exact LRU (``policy=lru``, fused kernel), set-associative LRU (``salru``, 128 shards of
32 ways), CLOCK (``sglang-clock``, one step per commit), plan-then-copy (``lru`` with
``swap_in_copy=plan``). Prints a Markdown table (kernel times are in BENCHMARKS.md's same-run
table; this one gives misses and throughput).

    python benchmarks/swap_design_table.py
"""

from __future__ import annotations

import json
import subprocess
import sys

DESIGNS = (("exact LRU", "lru", "fused"), ("set-associative LRU 128x32", "salru", "fused"),
           ("CLOCK (one step per commit)", "sglang-clock", "fused"), ("plan-then-copy (exact LRU)", "lru", "plan"))
SCENARIOS = (("default (8xH200 colocated, GLM-5.1 32k/8k)", []),
             ("PD preset (2xH20 decode, h20-141g)", ["--deployment", "2xh20-pd-decode", "--gpu", "h20-141g"]))


def plan(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "plan", "--json", *args], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    print("| scenario | design | steady misses / selections | best HiSparse under the targets: tok/s (concurrency) "
          "| peak HiSparse tok/s (concurrency) | swap-in share of the step at the peak |")
    print("|---|---|---|---|---|---|")
    for sname, sargs in SCENARIOS:
        for dname, policy, copy in DESIGNS:
            d = plan([*sargs, "--set", f"hisparse.policy={policy}", "--set", f"hisparse.swap_in_copy={copy}"])
            miss = d["misses"][0]["steady_miss_ratio"]
            best = d["recommendation"]["hisparse"]
            hs = [r for r in d["rows"] if r["system"] == "hisparse"]
            peak = max(hs, key=lambda r: r["steady_tok_s_deployment"])
            best_s = f"{best['steady_tok_s_deployment']:.0f} ({best['concurrency']})" if best else "none"
            print(f"| {sname} | {dname} | {miss:.4f} | {best_s} | {peak['steady_tok_s_deployment']:.0f} "
                  f"({peak['concurrency']}) | {peak['swap_share']:.3f} |", flush=True)


if __name__ == "__main__":
    main()

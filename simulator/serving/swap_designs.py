"""How the swap-in copies its rows: the plan's ``hisparse.swap_in_copy`` (issue #27 item 3).

The calibration's swap-in terms (launch, per request, rows over the link) were fitted on the fused
kernel: one launch per layer that plans and copies. SGLang's coordinator also has a plan-then-copy
path (a planning launch, then a copy launch over a full grid; PR #33686, and the miss-plan replay
of ``copy_cache_planned_kernel``). What it adds was measured, not chosen: our plan-then-copy
against our fused exact-LRU kernel in one run (``benchmarks/swap_in_designs.py``, NVIDIA H100,
2026-12-06, hot 4096, k 2048, 656 B rows, batch 100, 0.1% misses: ``lru1-plan`` 25.7 us against
``exact-lru`` 20.0 us, BENCHMARKS.md "Swap-in designs, same run with SGLang's kernels"). At 20% and
100% misses the two copy at the same rate (within 3-8% at batch 100), so only the fixed cost
differs; the eviction policy (``hisparse.policy``: lru, salru, sglang-clock) is a separate knob
(its misses come from the replay; its kernels' fixed costs measured within 1 us of exact LRU's).
"""

from __future__ import annotations

from typing import Any

# name -> extra microseconds per swap-in launch (per HiSparse layer) over the calibrated launch
SWAP_IN_COPY = {
    "fused": 0.0,
    "plan": 25.7 - 20.0,
}


def swap_in_extra_us(hs: Any) -> float:
    """The design's extra fixed cost per launch; 0 without HiSparse."""
    return SWAP_IN_COPY[hs.swap_in_copy] if hs is not None else 0.0

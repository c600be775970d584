"""Issue #27 item 5: the attention kernel's shapes in one process (B 64 then 128, H 8 / 16 /
128, FP8 and bf16), each captured into a CUDA graph and replayed; every replay equals the plain
call bit for bit (skipped without a GPU; the sanitizer runs the same sequence)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_graph_replays_across_shapes_in_one_process():
    from cupy_kernels.graph_sequence import run_sequence

    results = run_sequence(replays=2)
    assert len(results) == 12
    for r in results:
        assert r.max_diff == 0 and r.finite, r


@pytest.mark.parametrize("variant", ["wsx", "wsxe", "wsxo", "wsxr", "wsxb"])
def test_crossover_graph_replays_across_shapes_in_one_process(variant):
    # the same sequence with the FP8 wide shapes on the crossover kernels (clusters of two CTAs)
    from cupy_kernels.graph_sequence import DEFAULT_SHAPES, run_sequence

    results = run_sequence(tuple(s for s in DEFAULT_SHAPES if s[0] == "fp8"), replays=2, variant=variant)
    assert len(results) == 6
    for r in results:
        assert r.max_diff == 0 and r.finite, r

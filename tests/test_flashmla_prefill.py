"""CPU checks of the FlashMLA sparse-prefill timing (benchmarks/flashmla_prefill.py).

What needs no GPU: the two index patterns (causal, distinct, padded where a query has fewer
positions than top-k, deterministic by seed), the KV rotation that keeps one call's rows out of L2
for the next, the FLOP count, the float32 reference's semantics on a hand-sized case, and the
command's errors (exit 2, no traceback). The fetch script's file list is checked against this
benchmark's in tests/test_flashmla_compare.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import check_refuses_non_hopper_torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("flashmla_prefill", ROOT / "benchmarks" / "flashmla_prefill.py")
fp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fp)


def _check_causal_distinct(idx: np.ndarray, positions: np.ndarray, topk: int) -> None:
    assert idx.shape == (len(positions), topk) and idx.dtype == np.int32
    for p, row in zip(positions.tolist(), idx, strict=True):
        got = row[row >= 0]
        assert len(got) == min(p + 1, topk), p  # every slot filled once the query has topk positions
        assert np.unique(got).size == got.size and got.max() <= p  # distinct, causal
        assert (row[got.size:] == -1).all()  # padding only at the end


def test_uniform_indices_are_causal_distinct_and_padded():
    positions = np.array([0, 1, 63, 127, 128, 300, 511, 2000, 100_000])
    idx = fp.uniform_indices(np.random.default_rng(3), positions, 128)
    _check_causal_distinct(idx, positions, 128)
    # below topk + 1 positions a query takes every earlier position
    assert idx[1, :2].tolist() == [0, 1] and idx[3, :128].tolist() == list(range(128))
    again = fp.uniform_indices(np.random.default_rng(3), positions, 128)
    assert (again == idx).all()
    assert not (fp.uniform_indices(np.random.default_rng(4), positions, 128) == idx).all()


def test_uniform_indices_spread_over_the_whole_prefix():
    """A long prefix is sampled uniformly: its quarters each get about a quarter of the picks."""
    idx = fp.uniform_indices(np.random.default_rng(0), np.array([40_000] * 8), 2048)
    quarters = np.bincount(idx.ravel() * 4 // 40_001, minlength=4) / idx.size
    assert np.allclose(quarters, 0.25, atol=0.02)


def test_trace_indices_are_the_generators_causal_top_k():
    positions = np.arange(40_000, 40_064)
    idx = fp.trace_indices("dsv32", 0.5, positions, 2048, seed=0)
    _check_causal_distinct(idx, positions, 2048)
    assert (fp.trace_indices("dsv32", 0.5, positions, 2048, seed=0) == idx).all()
    # consecutive queries share rows (the fitted locality), unlike uniform draws over 40K positions (2,048 / 40K = 5%)
    share = np.mean([np.intersect1d(idx[i], idx[i + 1]).size / 2048 for i in range(63)])
    uni = fp.uniform_indices(np.random.default_rng(0), positions, 2048)
    share_uniform = np.mean([np.intersect1d(uni[i], uni[i + 1]).size / 2048 for i in range(63)])
    assert share_uniform < 0.08 and share > share_uniform + 0.2


def test_kv_sets_keep_a_call_out_of_l2():
    from cupy_kernels.timing import l2_cold_sets

    l2 = 50 * 2**20
    assert l2_cold_sets(4096 * 1152, l2) == 16  # 4.7 MB: capped
    assert l2_cold_sets(32768 * 1152, l2) == 3  # 37.7 MB: three copies make 113 MB > 2 x L2
    assert l2_cold_sets(163840 * 1152, l2) == 1  # 189 MB: one copy already is
    for ctx in (4096, 16384, 32768, 65536, 163840):
        n = l2_cold_sets(ctx * 1152, l2)
        assert n == 16 or n * ctx * 1152 >= 2 * l2


def test_flops_count_every_slot_of_both_products():
    assert fp.attention_flops(4096, 128, 2048) == 2 * 4096 * 128 * 2048 * (576 + 512)
    row = fp.Row(128, 4096, 32768, 2048, "uniform", 3, us=4000.0, valid=1.0, rel_err=1e-3)
    assert row.tflops == pytest.approx(fp.attention_flops(4096, 128, 2048) / 4e-3 / 1e12)
    assert row.ok and not row._replace(rel_err=0.05).ok


def test_reference_is_softmax_attention_over_the_gathered_rows():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn((2, 3, fp.D_QK), generator=gen)
    kv = torch.randn((10, fp.D_QK), generator=gen)
    idx = torch.tensor([[4, 7, -1, -1], [0, 1, 2, 9]], dtype=torch.int32)
    got = fp.reference(torch, q, kv, idx, 0.1)
    for r in range(2):
        rows = kv[[i for i in idx[r].tolist() if i >= 0]]
        for h in range(3):
            p = torch.softmax(rows @ q[r, h] * 0.1, dim=0)
            assert torch.allclose(got[r, h], p @ rows[:, : fp.D_V], atol=1e-5)


@pytest.mark.parametrize("args, words", [
    (["--flashmla", "/no/such/dir"], "no such folder"),
    (["--flashmla", ".", "--heads", "96"], "--heads must each be one of (64, 128)"),
    (["--flashmla", ".", "--topk", "100"], "--topk must be a positive multiple of 128, got 100"),
    (["--flashmla", ".", "--chunk", "8"], "--chunk must be >= 16"),
    (["--flashmla", ".", "--contexts", "2048", "--chunk", "4096"], "--contexts must each be >= --chunk 4096, got [2048]"),
    (["--flashmla", ".", "--patterns", "zipf"], "--patterns must each be one of ('uniform', 'trace'), got ['zipf']"),
    (["--flashmla", ".", "--trace-preset", "nope"], "--trace-preset must be one of"),
    (["--flashmla", ".", "--trace-depth", "1.5"], "--trace-depth must be in [0, 1]"),
    (["--flashmla", ".", "--reps", "0"], "--reps must be >= 1"),
    (["--flashmla", "."], "lacks"),
])
def test_cli_errors_exit_2_without_traceback(args, words):
    run = subprocess.run([sys.executable, "benchmarks/flashmla_prefill.py", *args], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 2, run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr


def test_no_gpu_or_torch_is_a_usage_error(monkeypatch):
    check_refuses_non_hopper_torch(monkeypatch, lambda: fp.hopper_torch("FlashMLA"), fp.UsageError)

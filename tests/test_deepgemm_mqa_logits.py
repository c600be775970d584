"""CPU checks of the DeepGEMM MQA-logits timing (benchmarks/deepgemm_mqa_logits.py): the causal pair
count and FLOPs it reports, the key rotation that keeps one call's keys out of L2, the float32
reference's formula on a hand-sized case, and the command's errors (exit 2, no traceback)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import check_refuses_non_hopper_torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("deepgemm_mqa_logits", ROOT / "benchmarks" / "deepgemm_mqa_logits.py")
dm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dm)


def test_causal_pairs_count_each_querys_keys():
    # a whole 4-token prompt: 1 + 2 + 3 + 4 keys; its last 2 queries at the end of a 10-token prompt: 9 + 10
    assert dm.causal_pairs(4, 4) == 10 and dm.causal_pairs(2, 10) == 19
    assert dm.causal_pairs(4096, 4096) == 4096 * 4097 // 2
    assert dm.logits_flops(2, 10, 64) == 2 * 64 * 128 * 19


def test_key_sets_keep_a_call_out_of_l2():
    from cupy_kernels.timing import l2_cold_sets

    l2 = 50 * 2**20
    assert l2_cold_sets(4096 * 132, l2) == 16
    assert l2_cold_sets(163840 * 132, l2) == 5 and 5 * 163840 * 132 >= 2 * l2


def test_reference_is_the_weighted_relu_sum_over_heads():
    torch = pytest.importorskip("torch")
    q = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # 1 query, 2 heads, dim 2
    k = torch.tensor([[1.0, 1.0], [-1.0, 0.5]])
    scale = torch.tensor([2.0, 1.0])
    w = torch.tensor([[0.5, -1.0]])
    got = dm.reference(torch, q, k, scale, w)
    # key 0: head 0 relu(1 x 2) x 0.5 + head 1 relu(2 x 2) x -1 = 1 - 4; key 1: relu(-1) x 0.5 + relu(1) x -1
    assert got.tolist() == [[-3.0, -1.0]]


@pytest.mark.parametrize("args, words", [
    (["--heads", "16"], "--heads must each be one of (32, 64), got [16]"),
    (["--chunk", "2"], "--chunk must be >= 4"),
    (["--contexts", "1024"], "--contexts must each be >= --chunk 4096, got [1024]"),
    (["--reps", "0"], "--reps must be >= 1"),
])
def test_cli_errors_exit_2_without_traceback(args, words):
    run = subprocess.run([sys.executable, "benchmarks/deepgemm_mqa_logits.py", *args], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 2, run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr


def test_no_gpu_or_torch_is_a_usage_error(monkeypatch):
    check_refuses_non_hopper_torch(monkeypatch, dm.hopper_deep_gemm, dm.UsageError)

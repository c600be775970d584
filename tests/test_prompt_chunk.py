"""The prompt-chunk kernels' tables (costmodel/prompt_chunk.py): what the H200 measured, how a chunk between
the measured shapes is priced, and how another GPU's time follows from the datasheet."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.costmodel.prompt_chunk import (
    FLASHMLA_SPARSE_PREFILL as F,
)
from simulator.costmodel.prompt_chunk import (
    FLASHMLA_US,
    MQA_LOGITS_US,
    REF_SMS,
    causal_pairs,
    gpu_ratio,
)
from simulator.costmodel.prompt_chunk import (
    MQA_LOGITS as M,
)
from simulator.serving import presets as P

ROOT = Path(__file__).resolve().parents[1]
H200 = P.load("gpus", "h200")


def _csv(name: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "benchmarks" / "results" / name)


def test_the_tables_are_the_committed_measurements():
    """Each table entry is its shape's CUDA-graph median in the committed CSVs (duplicates across device
    calls averaged), FlashMLA's from the fitted-trace top-k; every row passed its reference check."""
    fm = _csv("flashmla_prefill-h200.csv")
    assert (fm.device == "NVIDIA H200").all() and (fm.rel_err < 1e-2).all() and (fm.topk == F.topk).all()
    trace = fm[fm.pattern == "trace"].groupby(["heads", "chunk", "ctx"]).us.mean()
    want = {(h // 64, c): tuple((int(x), round(float(us), 2)) for x, us in trace.loc[h, c].items())
            for h, c in {(h, c) for h, c, _ in trace.index}}
    assert {k: tuple((x, round(us, 2)) for x, us in v) for k, v in FLASHMLA_US.items()} == want
    dg = _csv("deepgemm_mqa_logits-h200.csv")
    assert (dg.device == "NVIDIA H200").all() and (dg.rel_err < 1e-3).all()
    mean = dg.groupby(["heads", "chunk", "ctx"]).us.mean()
    want = {(h, c): tuple((int(x), round(float(us), 2)) for x, us in mean.loc[h, c].items())
            for h, c in {(h, c) for h, c, _ in mean.index}}
    assert {k: tuple((x, round(us, 2)) for x, us in v) for k, v in MQA_LOGITS_US.items()} == want
    assert (dg.pairs == [causal_pairs(c, x - c) for c, x in zip(dg.chunk, dg.ctx, strict=True)]).all()


def test_every_measured_shape_is_priced_at_its_measurement():
    for (tiles, chunk), points in FLASHMLA_US.items():
        for ctx, us in points:
            assert F.time(H200, chunk, ctx, 64 * tiles) == pytest.approx(us * 1e-6, rel=1e-9)
    for (heads, chunk), points in MQA_LOGITS_US.items():
        for ctx, us in points:
            assert M.time(H200, chunk, ctx - chunk, heads) == pytest.approx(us * 1e-6, rel=1e-9)


def test_flashmla_runs_in_waves_of_one_cta_per_query_tile():
    """One CTA per (query, 64-head tile), one per SM: up to 132 queries of 64 heads are one wave, 133 two;
    128 heads are two tiles a query; more tiles than two take the 2-tile table per CTA."""
    one = F.time(H200, REF_SMS, 8192, 64)
    assert F.time(H200, 1, 8192, 64) == pytest.approx(one)
    assert F.time(H200, REF_SMS + 1, 8192, 64) == pytest.approx(2 * one)
    assert F.time(H200, REF_SMS // 2, 8192, 128) == pytest.approx(F.cta_us(66, 8192, 2) * 1e-6)
    assert F.time(H200, 4096, 32768, 256) == pytest.approx(
        math.ceil(4096 * 4 / REF_SMS) * F.cta_us(4096, 32768, 2) * 1e-6)
    # fewer rows per query: their share of the full top-k
    assert F.time(H200, 4096, 32768, 64, rows=512) == pytest.approx(F.time(H200, 4096, 32768, 64) / 4)


def test_between_measured_shapes_the_price_lies_between_its_neighbours():
    """Linear in log2(ctx) between measured contexts, held beyond them; linear in log2(tokens) between the
    1,024- and 4,096-token tables; DeepGEMM's rate linear in heads between 32 and 64."""
    lo, hi = F.cta_us(4096, 16384, 1), F.cta_us(4096, 32768, 1)
    mid = F.cta_us(4096, 2 ** 14.5, 1)
    assert mid == pytest.approx((lo + hi) / 2)
    assert F.cta_us(4096, 10 ** 6, 1) == pytest.approx(F.cta_us(4096, 163840, 1))
    assert F.cta_us(4096, 100, 1) == pytest.approx(F.cta_us(4096, 4096, 1))
    a, b = F.cta_us(1024, 8192, 1), F.cta_us(4096, 8192, 1)
    assert F.cta_us(2048, 8192, 1) == pytest.approx((a + b) / 2)
    assert F.cta_us(64, 8192, 1) == pytest.approx(a) and F.cta_us(16384, 8192, 1) == pytest.approx(b)
    r32, r64 = M.rate(4096, 32768, 32), M.rate(4096, 32768, 64)
    assert M.rate(4096, 32768, 48) == pytest.approx((r32 + r64) / 2)
    assert M.rate(4096, 32768, 16) == pytest.approx(r32) and M.rate(4096, 32768, 128) == pytest.approx(r64)
    assert M.time(H200, 0, 5000, 64) == 0.0 and F.time(H200, 0, 5000, 64) == 0.0
    arr = M.time(H200, np.array([1024, 4096]), np.array([7168, 28672]), 64)
    assert arr == pytest.approx([M.time(H200, 1024, 7168, 64), M.time(H200, 4096, 28672, 64)])


def test_another_gpu_takes_the_datasheet_tensor_rate_ratio():
    """DERIVED: the H200's time x its datasheet dense BF16 rate over the GPU's (the H100's is the same 989
    TFLOP/s; the H20's 148; the B200's 2,250). FlashMLA's README puts its sparse prefill at 640 TFLOP/s on an
    H800 and 1,450 on a B200: 2.27x, the ratio the datasheets give to within 1%."""
    h100, h20, b200 = (P.load("gpus", g) for g in ("h100", "h20", "b200"))
    assert gpu_ratio(H200) == 1.0 and gpu_ratio(h100) == pytest.approx(1.0)
    assert gpu_ratio(h20) == pytest.approx(989 / 148, rel=1e-3)
    assert F.time(h20, 4096, 32768, 64) == pytest.approx(F.time(H200, 4096, 32768, 64) * 989 / 148, rel=1e-3)
    assert M.time(b200, 4096, 28672, 64) == pytest.approx(M.time(H200, 4096, 28672, 64) * 0.989 / 2.25, rel=1e-3)
    speedup = F.flop_rate(b200, 4096, 32768, 128) / F.flop_rate(H200, 4096, 32768, 128)
    assert speedup == pytest.approx(1450 / 640, rel=0.01)
    assert F.how(H200)[0] and M.how(H200)[0]
    assert not F.how(b200)[0] and "x 0.440" in F.how(b200)[1] and "x 0.440" in M.how(b200)[1]


def test_the_measured_rates_are_below_the_tensor_roof():
    """Sanity of the tables against the datasheet: FlashMLA under 989 TFLOP/s BF16, DeepGEMM's FP8 logits under
    1,979 (both compute kernels at these shapes, hence the tensor-rate scaling)."""
    for (tiles, chunk), points in FLASHMLA_US.items():
        for ctx, _ in points:
            assert 0.45 < F.flop_rate(H200, chunk, ctx, 64 * tiles) / 989e12 < 0.7
    for (heads, chunk), points in MQA_LOGITS_US.items():
        for ctx, _ in points:
            assert 0.3 < M.rate(chunk, ctx, heads) / 1979e12 < 0.6

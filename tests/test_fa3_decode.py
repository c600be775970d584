"""FA3's sparse MLA decode term (``costmodel/fa3_decode.py``): the H100 table, FA3's wave arithmetic between
its points, verify passes, other GPUs, and where the cost model uses it (``CostModel.decode_attention``)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.costmodel.fa3_decode import FA3_SPARSE_DECODE as F
from simulator.costmodel.fa3_decode import fa3_block_waves
from simulator.serving import presets as P
from simulator.serving.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks" / "results" / "fa3_sparse_decode-h100.csv"


pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(deployment: str = "8xh200-tp8-glm52-low-latency", gpu: str | None = None,
          overrides: tuple[str, ...] = ()) -> CostModel:
    sc = load_scenario(model="glm-5.2-fp8", deployment=deployment, gpu=gpu, overrides=overrides)
    return sc.cost_model()


@pytest.mark.parametrize("rows, blocks", [
    (1, 2),  # 1 x 32 x 1.1 / 132 -> 1 block per SM: 28 splits (the cap) of ceil(32 / 28) = 2 blocks, 28 tiles
    (24, 7),  # 6.4 -> 7: ceil(32 / 7) = 5 splits of 7 blocks, 120 tiles: one wave
    (44, 11),  # 11.7 -> 12: 3 splits of 11 blocks, 132 tiles: one wave
    (48, 22),  # 12.8 -> 13: 3 splits of 11, 144 tiles: two waves
    (64, 16),  # 17.1 -> 18: 2 splits of 16, 128 tiles: one wave
    (96, 32),  # 25.6 -> 26: 2 splits of 16, 192 tiles: two waves
    (192, 64),  # 51.2 -> 52: 1 split of 32, 192 tiles: two waves
])
def test_fa3_block_waves_by_hand(rows, blocks):
    assert float(fa3_block_waves(rows)) == blocks


def test_the_table_is_the_benchmark_csv():
    """Every table point is the CSV's CUDA-graph median of that shape (random rows; the verify table at overlap 0.7)."""
    got = {}
    with CSV.open() as f:
        for r in csv.DictReader(f):
            if r["timing"] == "graph" and r["agree"] == "True":
                got[(int(r["heads"]), int(r["rows"]), float(r["overlap"]))] = float(r["us"])
    assert "H100 80GB HBM3" in CSV.read_text().splitlines()[1]
    for heads, points in F.rows_us.items():
        for rows, us in points:
            assert got[(heads, rows, 0.0)] == us
    for heads, points in F.verify_us.items():
        for rows, us in points:
            assert got[(heads, rows, F.verify_overlap)] == us


def test_exact_at_the_measured_points_and_the_floor_below_one_row():
    for heads, points in F.rows_us.items():
        for rows, us in points:
            assert float(F.measured_us(rows, heads)) == pytest.approx(us, abs=1e-9)
    assert float(F.measured_us(0.25, 8)) == pytest.approx(17.78)  # below one row: the floor
    assert F.floor_us(8) == 17.78 and F.floor_us(64) == 19.99


def test_between_points_it_follows_fa3s_waves():
    """44 rows at 64 heads run one wave of 11-block tiles, the measured 48 rows two waves of 11: the term
    stays low there, where a line between the 32- and 48-row points would not."""
    at = {r: float(F.measured_us(r, 64)) for r in (32, 44, 48)}
    assert at[32] < at[44] < at[48]
    line = at[32] + (at[48] - at[32]) * (44 - 32) / (48 - 32)
    assert at[44] < line - 15.0
    # 40 rows: the same 11-block wave (3 splits, 120 tiles): within a microsecond of 44
    assert float(fa3_block_waves(40)) == 11 and float(F.measured_us(40, 64)) == pytest.approx(at[44], abs=1.0)


def test_short_contexts_count_as_a_fraction_of_a_row():
    # 12 query rows reading 1,024 rows each: the bytes of 6 full rows
    assert float(F.measured_us(12, 8, k=1024)) == pytest.approx(20.26)
    assert float(F.measured_us(12, 8, k=4096)) == pytest.approx(22.88)  # more than top-k: top-k


def test_heads_between_and_above_the_tables():
    assert float(F.measured_us(12, 36)) == pytest.approx((22.88 + 33.35) / 2)  # halfway from 8 to 64 heads
    assert float(F.measured_us(12, 128)) == pytest.approx(48.46)  # two M tiles per token: 24 rows of 64 heads
    assert float(F.measured_us(12, 4)) == pytest.approx(22.88)


def test_the_verify_factor_by_hand():
    """sum (overlap-0.7 time - floor) / sum (random time - floor) over the nine measured verify shapes."""
    num = sum(t - 17.78 for t in (19.75, 22.75, 29.34, 57.69, 83.18, 156.19)) + \
        sum(t - 19.99 for t in (51.63, 80.70, 125.45))
    den = sum(t - 17.78 for t in (20.26, 22.88, 30.27, 62.69, 87.62, 169.80)) + \
        sum(t - 19.99 for t in (54.73, 85.30, 129.27))
    assert F.verify_factor == pytest.approx(num / den)
    assert F.verify_factor == pytest.approx(0.9272, abs=1e-4)
    assert float(F.measured_us(96, 8, verify=6)) == pytest.approx(17.78 + (87.62 - 17.78) * num / den)


def test_other_gpus():
    h100, h200, h20 = (P.load("gpus", g) for g in ("h100", "h200", "h20"))
    assert F.time(h100, 96, 8, bf16_flops=9.89e14) == pytest.approx(87.62e-6)
    # the H200: the same SMs and clock, not the HBM ratio; its padded MMA work (27.4 GFLOP) is no bound
    assert F.time(h200, 96, 8, bf16_flops=9.89e14) == pytest.approx(87.62e-6)
    # the H20 (148 dense BF16 TFLOP/s, no published clock: kept): the floor + 2 x 96 x 64 x 2048 x 1088 FLOPs
    flops = 2 * 96 * 64 * 2048 * (64 + 512 + 512)
    assert flops == 27_380_416_512
    assert F.time(h20, 96, 8, bf16_flops=1.48e14) == pytest.approx((17.78 + flops / 1.48e14 * 1e6) * 1e-6)
    assert F.time(h200, 0, 8) == 0.0
    assert F.how(h100)[0] and not F.how(h200)[0]


def test_the_cost_model_prices_fa3_decode_passes_with_it():
    tp8 = _cost()
    ctx = 8704.0
    per_layer = tp8.decode_attention(96, 96 * ctx, 6)
    assert per_layer == pytest.approx(F.time(tp8.g, 96, 8, verify=6))
    assert per_layer == pytest.approx((17.78 + (87.62 - 17.78) * F.verify_factor) * 1e-6)
    assert tp8.attention_all(96, 96 * ctx, 6) == pytest.approx(78 * per_layer)
    verify = Pass((RankWork(16, 16 * ctx),), verify=6)
    assert float(tp8.pass_time(verify).parts["sparse attention"][0]) == pytest.approx(78 * per_layer)
    dp = _cost("8xh200-dp8-ep8-glm52-high-throughput")
    decode = Pass.uniform(12, 12 * ctx, 8)
    assert float(dp.pass_time(decode).parts["sparse attention"][0]) == pytest.approx(78 * 33.35e-6)


def test_off_fa3_the_fitted_kernel_term_stays():
    for c in (_cost(overrides=("model.kv_row_bytes=656",)), _cost(gpu="b200")):
        assert not c.fa3_decode
        assert c.decode_attention(96, 96 * 8704.0, 6) == pytest.approx(c.attention(96, 96 * 8704.0))
    assert np.isclose(_cost().attention(96), 121.58e-6, rtol=1e-3)  # the calibrated kernel term itself is unchanged

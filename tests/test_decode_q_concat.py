"""The q concatenation before the attention kernel runs only where SGLang's NSA backend runs it: every prompt
chunk (``flashmla_sparse``), but a decode, verify or draft pass only off the Hopper + BF16-KV default, whose decode
backend ``fa3`` takes q_nope and q_rope apart (``CostModel.decode_q_concat``); and a prompt chunk's q padded to
FlashMLA's head multiple under attention TP (``CostModel.prefill_q_pad``)."""

from __future__ import annotations

import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.costmodel.ops import attention_ops, flashmla_q_pad_ops
from simulator.costmodel.pass_terms import _attention_side
from simulator.costmodel.passes import PassShape
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(deployment: str = "8xh200-dp8-ep8-glm52-high-throughput", model: str = "glm-5.2-fp8",
          gpu: str | None = None, overrides: tuple[str, ...] = ()) -> CostModel:
    sc = load_scenario(model=model, deployment=deployment, gpu=gpu, overrides=overrides)
    return sc.cost_model()


def _names(c: CostModel, rows: int, q_concat: bool) -> set[str]:
    return {o.name for _, o in c.attention_side_ops(rows, q_concat=q_concat)}


def test_the_decode_backend_decides():
    h200 = _cost()
    assert h200.m.kv_row_bytes >= 1024  # --kv-cache-dtype auto: BF16 on Hopper
    assert not h200.decode_q_concat  # fa3
    assert _cost(overrides=("model.kv_row_bytes=656",)).decode_q_concat  # FP8 KV: flashmla_kv
    assert _cost(gpu="b200").decode_q_concat  # Blackwell: trtllm / flashmla_sparse


def test_a_decode_pass_drops_it_and_a_prompt_chunk_keeps_it():
    c = _cost()
    op = {o.name: o for o in attention_ops(c.m, 12, 0.0, c.layout, c.m.kv_row_bytes)}["q_concat"]
    assert "q_concat" not in _names(c, 12, q_concat=False) and "q_concat" in _names(c, 12, q_concat=True)
    # a decode pass at 12 requests per rank (the graph batch 12): exactly 78 concatenations fewer than with it
    decode = Pass.uniform(12, 12 * 8704.0, 8)
    with_it = sum(c.attention_fixed(12, q_concat=True).values())
    without = sum(c.attention_fixed(12, q_concat=False).values())
    assert with_it - without == pytest.approx(c.m.layers * c.op_time(op))
    group = "norms, rope, quantisation"
    assert float(c.pass_time(decode).parts[group][0]) == pytest.approx(c.attention_fixed(12, q_concat=False)[group])
    # a prompt chunk (flashmla_sparse) concatenates: the extend pass's rank group has it
    extend = Pass((RankWork(chunks=((1024, 0),)),) * 8)
    assert float(c.pass_time(extend).parts[group][0]) == pytest.approx(
        c.attention_fixed(1024, q_concat=True)[group])
    # a rank decoding inside an extend pass (no graph: its 12 real rows) runs the decode backend
    decoding = RankWork(decode=12, ctx_sum=12 * 8704.0)
    mixed = Pass((RankWork(chunks=((1024, 0),)), decoding) + (RankWork(),) * 6)
    shape = PassShape.of(c, mixed)
    assert shape.extend
    assert _attention_side(c, shape, decoding)[group] == pytest.approx(c.attention_fixed(12, q_concat=False)[group])


def test_off_hopper_bf16_the_decode_pass_keeps_it():
    c = _cost(gpu="b200")
    decode = Pass.uniform(12, 12 * 8704.0, 8)
    group = "norms, rope, quantisation"
    assert float(c.pass_time(decode).parts[group][0]) == pytest.approx(c.attention_fixed(12, q_concat=True)[group])


def test_flashmla_q_padding_of_a_tp8_prompt_chunk_by_hand():
    tp8 = _cost("8xh200-tp8-glm52-low-latency")
    assert tp8.layout.attention_tp == 8 and tp8.flashmla_heads(8) == 64
    ops = {o.name: o for o in flashmla_q_pad_ops(tp8.m, 8192, 8, 64)}
    # a zero fill of 64 heads x 576 bf16 values per token, then the 8 real heads copied in (read + write)
    assert ops["q_pad_zero"].bytes == pytest.approx(8192 * 64 * 576 * 2)
    assert ops["q_pad_copy"].bytes == pytest.approx(8192 * 8 * 576 * 2 * 2)
    assert tp8.prefill_q_pad(8192) == pytest.approx(78 * sum(tp8.op_time(o) for o in ops.values()))
    group = "norms, rope, quantisation"
    extend = Pass((RankWork(chunks=((8192, 0),)),))
    assert float(tp8.pass_time(extend).parts[group][0]) == pytest.approx(
        tp8.attention_fixed(8192, q_concat=True)[group] + tp8.prefill_q_pad(8192))
    # 64 heads per rank under DP attention need none; nor does a decode pass (fa3), nor FP8 KV (flashmla_kv)
    assert _cost().prefill_q_pad(1024) == 0.0
    decode = Pass.uniform(4, 4 * 8704.0, 1)
    assert float(tp8.pass_time(decode).parts[group][0]) == pytest.approx(
        tp8.attention_fixed(4, q_concat=False)[group])
    assert _cost("8xh200-tp8-glm52-low-latency", overrides=("model.kv_row_bytes=656",)).prefill_q_pad(8192) == 0.0
    # Blackwell pads 64 heads to 128 (the DP-attention layout)
    assert _cost(gpu="b200").prefill_q_pad(1024) > 0.0


def _attention_row(c: CostModel) -> dict[str, str]:
    return next(t for t in c.term_sources() if t["term"] == "sparse attention")


def test_the_plan_says_how_fa3_decode_is_priced():
    """Where SGLang decodes with FA3 (BF16 KV on Hopper) the sparse attention row says the decode passes are
    priced by FA3's own times, measured on an H100 (benchmarks/fa3_sparse_decode.py): measured there, derived
    on the H200 (by the SM clock ratio, not the HBM ratio); FP8 KV (flashmla_kv) and Blackwell keep the fitted
    kernel terms' provenance (measured on the H200, derived elsewhere)."""
    h200 = _cost()
    assert h200.fa3_decode and not h200.decode_q_concat
    row = _attention_row(h200)
    assert row["priced"] == "derived"
    assert "nsa_decode_backend 'fa3'" in row["source"] and "H100 80GB HBM3" in row["source"]
    assert "SM boost clock ratio 1980 / 1980 MHz" in row["source"] and "not the HBM ratio" in row["source"]
    assert "prompt chunks: FlashMLA 9241ae3 flash_mla_sparse_fwd" in row["source"]
    assert "flashmla_prefill-h200.csv" in row["source"] and "on h200: x" not in row["source"]
    fp8 = _cost(overrides=("model.kv_row_bytes=656",))
    assert not fp8.fa3_decode and _attention_row(fp8)["priced"] == "measured"
    b200 = _cost(gpu="b200")
    assert not b200.fa3_decode and _attention_row(b200)["priced"] == "derived"
    assert "on b200: x 0.440, the datasheet dense BF16 rate ratio" in _attention_row(b200)["source"]
    h100 = _cost(gpu="h100")
    assert h100.fa3_decode and _attention_row(h100)["priced"] == "measured"
    src = _attention_row(h100)["source"]
    assert "the H100's times" not in src  # FA3's own measurement, unscaled
    assert "on h100: x 1.000, the datasheet dense BF16 rate ratio H200 / h100" in src  # prompt chunks: the H200's

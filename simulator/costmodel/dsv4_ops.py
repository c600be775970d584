"""The kernels of one DeepSeek-V4 decode layer, by layer kind (serving/layer_kinds.py), as ``ops.Op``s.

Shapes from transformers' ``DeepseekV4Attention`` / ``DeepseekV4CSACompressor`` /
``DeepseekV4HCACompressor`` / ``DeepseekV4Indexer`` / ``DeepseekV4HyperConnection``: q_a (hidden ->
q_lora), q_b (q_lora -> heads x head_dim), kv_proj (hidden -> one head_dim K=V head), the grouped
o_a (o_groups batched GEMMs of heads x head_dim / o_groups -> o_lora_rank) and o_b (o_groups x
o_lora_rank -> hidden); C4 layers add the compressor's kv/gate projections (2 x head_dim wide) and the
indexer's q_b, compressor (2 x index_head_dim) and weights_proj; C128 layers a head_dim compressor;
every layer two hyper-connection maps (hc_mult x hidden -> (2 + hc_mult) x hc_mult, fp32: priced as
bf16 GEMMs) and their stream mixing. The sparse attention and the indexer's scoring are priced by the
cost model's fitted terms over the rows each kind attends (``CostModel.attention_all``); the MLP side
(all layers MoE) is ``ops.moe_ops``. Norms and rope are elementwise ops like MLA's.
"""

from __future__ import annotations

from .ops import Layout, Op, elementwise, gemm

REPORT_GROUPS = {
    **{n: "attention-side GEMMs" for n in ("dsv4_q_a", "dsv4_q_b", "dsv4_kv_proj", "dsv4_o_b", "dsv4_compressor",
                                           "dsv4_indexer_q_b", "dsv4_indexer_compressor", "dsv4_indexer_weights_proj")},
    "dsv4_o_a": "absorbed bmm",
    **{n: "hyper-connections" for n in ("dsv4_hc_fn", "dsv4_hc_mix")},
}
INDEXER_OPS = frozenset({"dsv4_indexer_q_b", "dsv4_indexer_compressor", "dsv4_indexer_weights_proj"})


def layer_ops(m, batch: int, layout: Layout, kind: str) -> list[Op]:
    """One layer's attention-side kernels for ``batch`` requests (no attention, no scoring, no MLP)."""
    if batch <= 0:
        return []
    b, w, tp = batch, layout.weight_dtype, layout.attention_tp
    d, qr, hd = m.hidden_size, m.q_lora_rank, m.head_dim
    h = max(1, m.attention_heads // tp)
    groups = max(1, m.o_groups // tp)
    streams = m.hc_mult * d
    hc_out = (2 + m.hc_mult) * m.hc_mult
    ops = [
        gemm("dsv4_hc_fn", b, streams, hc_out, "bf16"),  # attn_hc: weights from the streams
        elementwise("dsv4_hc_mix", b * streams, passes=4),  # collapse (pre) of the streams
        elementwise("input_norm", b * d, passes=3),
        gemm("dsv4_q_a", b, d, qr, w),
        elementwise("q_a_norm", b * qr),
        gemm("dsv4_q_b", b, qr, h * hd, w),
        elementwise("q_norm_rope", b * h * hd, passes=3),
        gemm("dsv4_kv_proj", b, d, hd, w),
        elementwise("kv_norm_rope_store", b * hd, passes=3),
    ]
    if kind == "c4":
        ops += [gemm("dsv4_compressor", b, d, 4 * hd, w),  # kv and gate, 2 x head_dim each
                gemm("dsv4_indexer_q_b", b, qr, m.indexer_heads * m.indexer_head_dim, w),
                gemm("dsv4_indexer_compressor", b, d, 4 * m.indexer_head_dim, w),
                gemm("dsv4_indexer_weights_proj", b, d, m.indexer_heads, "bf16"),
                elementwise("indexer_q_rope_quant", b * m.indexer_heads * m.indexer_head_dim)]
    elif kind == "c128":
        ops += [gemm("dsv4_compressor", b, d, 2 * hd, w)]
    ops += [
        elementwise("attn_out_derope", b * h * hd, passes=2),
        gemm("dsv4_o_a", b, h * hd // groups, m.o_lora_rank, w, groups=groups, kind="batched_gemm"),
        gemm("dsv4_o_b", b, groups * m.o_lora_rank, d, w),
        elementwise("dsv4_hc_mix", b * streams, passes=4),  # expand (post) and comb
        gemm("dsv4_hc_fn", b, streams, hc_out, "bf16"),  # ffn_hc
        elementwise("post_attention_norm", b * d, passes=3),
    ]
    return ops

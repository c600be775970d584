"""GLM-5.1's and DeepSeek-V3.2's architecture shapes, for calibration and validation.

Values from the models' public configs: GLM-5.1 ``config.json`` of zai-org/GLM-5.1 (GLM-5's
``config.json`` holds the same fields: num_hidden_layers 78, first_k_dense_replace 3,
hidden_size 6144, q_lora_rank 2048, kv_lora_rank 512, qk_nope_head_dim 192, qk_rope_head_dim 64,
v_head_dim 256, intermediate_size 12288, moe_intermediate_size 2048, n_shared_experts 1,
vocab_size 154880, num_attention_heads 64, index_n_heads 32, index_head_dim 128, index_topk 2048,
n_routed_experts 256, num_experts_per_tok 8); DeepSeek-V3.2 from deepseek-ai/DeepSeek-V3.2-Exp
``inference/config_671B_v3.2.json`` (n_layers 61, n_dense_layers 3, dim 7168, q_lora_rank 1536,
kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, inter_dim 18432,
moe_inter_dim 2048, n_shared_experts 1, vocab_size 129280, n_heads 128, index_n_heads 64,
index_head_dim 128, index_topk 2048, n_routed_experts 256, n_activated_experts 8).
The serving branch adds the same fields, under these names, to its model presets' ModelSpec;
anything with them satisfies ``layer_work.ModelShape``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shapes:
    name: str
    layers: int
    dense_layers: int
    hidden_size: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    dense_intermediate_size: int
    moe_intermediate_size: int
    shared_experts: int
    vocab_size: int
    attention_heads: int
    indexer_heads: int
    indexer_head_dim: int
    top_k: int
    experts: int
    experts_per_token: int


GLM_5_1 = Shapes("glm-5.1", layers=78, dense_layers=3, hidden_size=6144, q_lora_rank=2048, kv_lora_rank=512,
                 qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, dense_intermediate_size=12288,
                 moe_intermediate_size=2048, shared_experts=1, vocab_size=154880, attention_heads=64,
                 indexer_heads=32, indexer_head_dim=128, top_k=2048, experts=256, experts_per_token=8)
DEEPSEEK_V3_2 = Shapes("deepseek-v3.2", layers=61, dense_layers=3, hidden_size=7168, q_lora_rank=1536,
                       kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                       dense_intermediate_size=18432, moe_intermediate_size=2048, shared_experts=1,
                       vocab_size=129280, attention_heads=128, indexer_heads=64, indexer_head_dim=128, top_k=2048,
                       experts=256, experts_per_token=8)
SHAPES = {s.name: s for s in (GLM_5_1, DEEPSEEK_V3_2)}

"""GLM-5.1's and DeepSeek-V3.2's architecture shapes, for calibration and validation.

The values live in one table, the model presets (``simulator/presets/models/glm-5.1-fp8.toml`` and
``deepseek-v3.2-fp8.toml``, each key citing its config.json field: zai-org/GLM-5.1 ``config.json``;
deepseek-ai/DeepSeek-V3.2-Exp ``inference/config_671B_v3.2.json``). They are read here as TOML data,
not through the serving package, so calibration (which runs on the GPU machine) does not depend on
the serving model; ``tests/test_ops.py`` holds the configs' values independently and checks
the parameter counts. Anything with these fields satisfies ``ops.ModelShape``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib.resources import files


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


def _from_preset(name: str, preset: str) -> Shapes:
    """The shape fields of a packaged model preset (``name`` keys the calibration CSVs' rows)."""
    data = tomllib.loads(files("simulator").joinpath("presets", "models", f"{preset}.toml").read_text())
    return Shapes(name, **{f.name: int(data[f.name]) for f in fields(Shapes) if f.name != "name"})


GLM_5_1 = _from_preset("glm-5.1", "glm-5.1-fp8")
DEEPSEEK_V3_2 = _from_preset("deepseek-v3.2", "deepseek-v3.2-fp8")
SHAPES = {s.name: s for s in (GLM_5_1, DEEPSEEK_V3_2)}

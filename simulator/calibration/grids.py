"""What ``hisparse calibrate`` and ``hisparse validate`` measure (one table, used by both)."""

from __future__ import annotations

from dataclasses import dataclass

# issue 8's kernel terms: swap-in (batch x misses x row size x hot-buffer size) and attention
SWAP_GRID = dict(batch=(1, 8, 32, 64), miss=(8, 128, 512, 1536), row_bytes=(656, 1152), hot=(4096,))
ATT_GRID = dict(batch=(1, 8, 32, 64, 128), heads=(64, 128), kv_dtype=("bf16", "fp8"))
SWAP_CTX = 32768

# step terms: every op of a GLM-5.1 and a DeepSeek-V3.2 layer at these per-GPU batches
STEP_MODELS = ("glm-5.1", "deepseek-v3.2")
STEP_BATCHES = (1, 2, 8, 32, 64, 128)
INDEXER_GRID = dict(batch=(1, 8, 32, 128), ctx=(8192, 32768, 163840), heads=(32, 64), q_dtype=("fp8",))
ELEMENTWISE_BYTES = (4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20)
GRAPH_KERNELS = (8, 32, 128, 512)
# TP-sharded routed experts (SGLang's fused MoE under --tp 8: every expert on every GPU, its
# intermediate split 8 ways) over the node tokens a decode step gathers (8 ranks x batch);
# EP-layout controls at the node tokens STEP_BATCHES give (re-timed in the same run)
TP_MOE_TOKENS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TP_MOE_EP_CONTROL_TOKENS = (8, 64, 256, 1024)
TP_MOE_TP = 8

# issue 8's validation: swap-in + attention, batches and buffers the fit did not see
VALIDATE_KERNELS = (dict(requests=16, layers=4, hot=6144, heads=64, row_bytes=1152),
                    dict(requests=48, layers=4, hot=4096, heads=128, row_bytes=656),
                    dict(requests=4, layers=6, hot=5120, heads=64, row_bytes=656))


@dataclass(frozen=True)
class LayerLoopConfig:
    """One full-layer validation run at GLM-5.1's per-GPU shapes: ``requests`` on this rank,
    contexts from ``ctx0``, ``layers`` layers of which the first ``dense`` have a dense MLP."""

    requests: int
    ctx0: int
    layers: int
    dense: int
    hot: int
    row_bytes: int


# batches none of STEP_BATCHES / INDEXER_GRID hold, contexts between the indexer grid's
VALIDATE_LAYERS = (LayerLoopConfig(requests=3, ctx0=12_000, layers=3, dense=1, hot=4096, row_bytes=1152),
                   LayerLoopConfig(requests=24, ctx0=40_000, layers=2, dense=0, hot=6144, row_bytes=1152),
                   LayerLoopConfig(requests=48, ctx0=20_000, layers=2, dense=0, hot=4096, row_bytes=656),
                   LayerLoopConfig(requests=12, ctx0=100_000, layers=2, dense=1, hot=4096, row_bytes=1152))

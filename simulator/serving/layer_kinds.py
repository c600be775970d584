"""The attention layer kinds a model is built of: one registry, read by the model spec (parameters,
which layers HiSparse serves), the memory model (bytes per token and per request) and the cost model
(rows each decode step attends, indexer keys scored).

- ``dsa``: DeepSeek-V3.2 / GLM-5.x MLA with DeepSeek Sparse Attention: one KV row per token per layer,
  a lightning indexer picks ``top_k`` of them; HiSparse keeps the rows on the host.
- DeepSeek-V4 (config.json ``compress_ratios``: 0, 4, 128 per layer; transformers ``DeepseekV4Attention``,
  SGLang ``deepseek_v4_memory_pool.py``): every layer keeps a sliding window of ``sliding_window`` raw
  rows (shared-KV MQA, one 512-dim head); ``c4`` (CSA) also stores one compressed row per 4 tokens and
  an indexer picks ``index_topk`` of them (its keys: one 128-dim FP8 row per compressed row); ``c128``
  (HCA) stores one compressed row per 128 tokens and attends to all of them; ``swa`` (ratio 0) keeps the
  window only. SGLang's HiSparse serves the C4 rows only ("C4-only HiSparse", sgl-project/sglang
  #26849, ``DeepSeekV4HiSparseTokenToKVPoolAllocator``, pool ``dsv4_hisparse_c4``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerKind:
    name: str
    compress: int  # tokens per stored row (1: every token; 0: no rows beyond the window)
    window: bool  # keeps the model's sliding window of raw rows
    indexer: bool  # a lightning indexer selects top_k of the stored rows (else all are attended)
    hisparse: bool  # HiSparse keeps the stored rows on the host, a hot buffer on the device
    about: str

    def stored_rows(self, ctx) -> float:
        """Rows one request stores beyond the window at context ``ctx`` (a number or an array)."""
        return 0.0 * ctx if self.compress == 0 else ctx // self.compress if self.compress > 1 else ctx

    def attended_rows(self, ctx, top_k: int, window: int):
        """Rows one decode step of a request at context ``ctx`` attends: the window's, and the
        indexer's top_k of the stored rows or all of them."""
        import numpy as np

        ctx = np.asarray(ctx, dtype=float)
        stored = np.floor(ctx / self.compress) if self.compress > 1 else (ctx if self.compress == 1 else 0.0 * ctx)
        picked = np.minimum(top_k, stored) if self.indexer else stored
        return picked + (np.minimum(window, ctx) if self.window else 0.0)


LAYER_KINDS: dict[str, LayerKind] = {
    "dsa": LayerKind("dsa", 1, False, True, True, "MLA + DSA (DeepSeek-V3.2, GLM-5.x): a row per token, indexer top-k"),
    "swa": LayerKind("swa", 0, True, False, False, "DeepSeek-V4 compress_ratio 0: the sliding window only"),
    "c4": LayerKind("c4", 4, True, True, True, "DeepSeek-V4 CSA (compress_ratio 4): a row per 4 tokens, indexer top-k"),
    "c128": LayerKind("c128", 128, True, False, False, "DeepSeek-V4 HCA (compress_ratio 128): a row per 128 tokens, all attended"),
}
RATIO_KIND = {0: "swa", 4: "c4", 128: "c128"}  # config.json compress_ratios entry -> kind

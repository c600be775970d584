"""IndexShare layer groups: which layer's indexer top-k each layer attends with.

GLM-5.2's config.json (``index_topk_freq``, ``index_skip_topk_offset``) makes layer l a "full" layer
(an anchor: it runs the lightning indexer) iff ``max(l - offset + 1, 0) % freq == 0``; any other layer
is "shared" and reuses the top-k of the last anchor before it (transformers ``GlmMoeDsaConfig``
``indexer_types``; vLLM ``deepseek_v32`` ``skip_topk``; SGLang's skip_topk layers). ``freq`` 1: every
layer is its own anchor (DeepSeek-V3.2, GLM-5.1). One rule, used by the model presets
(``ModelSpec.anchor_of``), the trace generator and the replay's per-group counts.
"""

from __future__ import annotations


def anchor_map(layers: int, freq: int = 1, offset: int = 0) -> tuple[int, ...]:
    """For each of ``layers`` layers, its anchor (itself for an anchor; a leading shared layer with no
    anchor before it is its own)."""
    if freq < 1 or offset < 0:
        raise ValueError(f"IndexShare needs freq >= 1 and offset >= 0, got {freq}, {offset}")
    out: list[int] = []
    for layer in range(layers):
        full = freq == 1 or max(layer - offset + 1, 0) % freq == 0
        out.append(layer if full or not out else out[-1])
    return tuple(out)


def group_of(anchor_of: tuple[int, ...], layer: int) -> str:
    """``"anchor"`` or ``"shared"``."""
    return "anchor" if anchor_of[layer] == layer else "shared"


def infer_rule(anchor_of: tuple[int, ...], max_freq: int = 16) -> tuple[int, int] | None:
    """The (freq, offset) whose ``anchor_map`` is ``anchor_of``, the smallest such; None when no rule
    of freq <= ``max_freq`` gives it (a hand-written pattern, SGLang's ``index_topk_pattern``)."""
    layers = len(anchor_of)
    if anchor_of == anchor_map(layers):
        return 1, 0
    for freq in range(2, max_freq + 1):
        for offset in range(0, layers + 1):
            if anchor_map(layers, freq, offset) == anchor_of:
                return freq, offset
    return None


def detect_shared(streams: list) -> tuple[int, ...]:
    """The anchor map of one request's streams (ordered by layer): a layer whose every step selects
    what the layer before it selects is taken as shared (IndexShare copies its anchor's top-k)."""
    import numpy as np

    out: list[int] = []
    for i, s in enumerate(streams):
        same = i > 0 and s.indices.shape == streams[i - 1].indices.shape and np.array_equal(s.indices, streams[i - 1].indices)
        out.append(out[-1] if same else i)
    return tuple(out)

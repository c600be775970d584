"""The semantics of SGLang's fused-MoE GEMM for block-FP8 weights, in numpy (CPU, float64).

SGLang runs the routed experts of ``--tp 8 --dp 8 --enable-dp-attention`` (no EP flags) on Hopper
through its Triton fused MoE (``python/sglang/srt/layers/quantization/fp8.py``,
``Fp8MoEMethod.create_moe_runner``: backend ``auto`` -> ``TRITON`` unless a DeepEP / Mooncake
all-to-all backend is set; ``python/sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_kernels.py``,
``fused_moe_kernel`` / ``invoke_fused_moe_kernel``). Facts taken from there (no code):

- the (token, expert) pairs are sorted by expert and each expert's rows padded to a multiple of
  ``BLOCK_M`` (``moe_align_block_size``); padding rows hold the sentinel ``T * top_k``;
- one program per (``BLOCK_M`` rows of one expert, ``BLOCK_N`` output columns) over the padded
  length's upper bound (``T * top_k + E * (BLOCK_M - 1)``); programs past the padded length return;
- weights ``[E, N, K]`` FP8 e4m3 with one fp32 scale per 128 x 128 block (``[E, N/128, K/128]``),
  activations FP8 with one fp32 scale per token and 128 columns (``per_token_group_quant_fp8``);
  each K step's product is scaled by ``a_scale[row, kb] * b_scale[n // 128, kb]`` and accumulated
  in fp32;
- gate_up reads the token's row (``row // top_k``), down reads the sorted row itself (``top_k`` 1)
  and multiplies by the routing weight (``MUL_ROUTED_WEIGHT``).

``cupy_kernels/fused_moe.py`` is our Triton kernel of that structure; this module is what it is
checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 128  # quantisation block: 128 x 128 for weights, 1 x 128 for activations
FP8_MAX = 448.0  # largest finite e4m3 value


@dataclass(frozen=True)
class Alignment:
    """Rows of a fused-MoE launch grouped by expert: ``sorted_ids[i]`` is a row ``token * top_k +
    slot`` or the sentinel ``valid`` (padding); ``expert_ids[b]`` the expert of block ``b`` of
    ``block_m`` rows; ``padded`` rows are used, ``capacity`` is the launch's upper bound."""

    sorted_ids: np.ndarray  # int32 [capacity]
    expert_ids: np.ndarray  # int32 [capacity // block_m]
    padded: int
    valid: int
    block_m: int

    @property
    def capacity(self) -> int:
        return int(self.sorted_ids.size)

    @property
    def experts_touched(self) -> int:
        return int(np.unique(self.expert_ids[: self.padded // self.block_m]).size)


def uniform_routing(tokens: int, experts: int, top_k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(topk_ids [T, top_k] int32, topk_weights [T, top_k] float32): each token picks ``top_k``
    distinct experts uniformly (the serving model's routing assumption), weights summing to 1."""
    if not 0 < top_k <= experts:
        raise ValueError(f"routing: top_k must be in 1..{experts}, got {top_k}")
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k].astype(np.int32)
    w = rng.random((tokens, top_k)).astype(np.float32) + 0.1
    return ids, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def align_block_size(topk_ids: np.ndarray, experts: int, block_m: int) -> Alignment:
    """Sort the flattened (token, slot) rows by expert (stable: token order inside an expert) and
    pad each expert's rows to a multiple of ``block_m`` with the sentinel ``T * top_k``."""
    flat = np.asarray(topk_ids, np.int64).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= experts):
        raise ValueError(f"routing: expert ids must be in 0..{experts - 1}")
    valid = int(flat.size)
    capacity = valid + experts * (block_m - 1)
    capacity = -(-capacity // block_m) * block_m
    sorted_ids = np.full(capacity, valid, np.int32)
    expert_ids = np.zeros(capacity // block_m, np.int32)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=experts)
    pos = 0
    start = 0
    for e in range(experts):
        c = int(counts[e])
        if not c:
            continue
        sorted_ids[pos:pos + c] = order[start:start + c]
        blocks = -(-c // block_m)
        expert_ids[pos // block_m: pos // block_m + blocks] = e
        pos += blocks * block_m
        start += c
    return Alignment(sorted_ids, expert_ids, pos, valid, block_m)


def fp8_round(x: np.ndarray) -> np.ndarray:
    """Round to the nearest e4m3 value (saturating at 448), as float32 (torch's CPU cast)."""
    import torch

    t = torch.from_numpy(np.clip(np.asarray(x, np.float32), -FP8_MAX, FP8_MAX))
    return t.to(torch.float8_e4m3fn).to(torch.float32).numpy()


def quant_token_groups(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token and 128 columns: scale = absmax / 448, codes = fp8(x / scale). (codes as float32
    e4m3 values [M, K], scales float32 [M, K/128])."""
    m, k = x.shape
    if k % GROUP:
        raise ValueError(f"quantisation: K ({k}) must be a multiple of {GROUP}")
    g = np.asarray(x, np.float32).reshape(m, k // GROUP, GROUP)
    scale = np.maximum(np.abs(g).max(axis=2), 1e-10) / FP8_MAX
    return fp8_round(g / scale[:, :, None]).reshape(m, k), scale.astype(np.float32)


def dequant_blocks(w_codes: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """[E, N, K] e4m3 values x their 128 x 128 block scales [E, N/128, K/128] -> float64."""
    s = np.repeat(np.repeat(np.asarray(w_scale, np.float64), GROUP, axis=1), GROUP, axis=2)
    return np.asarray(w_codes, np.float64) * s[:, : w_codes.shape[1], : w_codes.shape[2]]


def fused_moe_gemm_ref(a_codes: np.ndarray, a_scale: np.ndarray, w_codes: np.ndarray, w_scale: np.ndarray,
                       align: Alignment, top_k: int, routed_weights: np.ndarray | None = None) -> np.ndarray:
    """Float64 output [valid rows, N] of one fused-MoE GEMM launch: row ``r`` (a (token, slot)
    pair) = A[r // top_k] x W[expert of r]^T, scaled block by block, times the routing weight of
    ``r`` when ``routed_weights`` ([T * top_k] or [T, top_k]) is given. Rows nobody wrote stay
    NaN (the kernel must write every valid row)."""
    e_count, n, k = w_codes.shape
    if a_codes.shape[1] != k:
        raise ValueError(f"fused MoE: A has K {a_codes.shape[1]}, weights K {k}")
    a = np.asarray(a_codes, np.float64) * np.repeat(np.asarray(a_scale, np.float64), GROUP, axis=1)[:, :k]
    out = np.full((align.valid, n), np.nan)
    rw = None if routed_weights is None else np.asarray(routed_weights, np.float64).reshape(-1)
    for b in range(align.padded // align.block_m):
        rows = align.sorted_ids[b * align.block_m:(b + 1) * align.block_m]
        rows = rows[rows < align.valid]
        if not rows.size:
            continue
        w = dequant_blocks(w_codes[align.expert_ids[b]][None], w_scale[align.expert_ids[b]][None])[0]
        res = a[rows // top_k] @ w.T
        out[rows] = res * rw[rows, None] if rw is not None else res
    return out

"""A Triton fused-MoE GEMM for block-FP8 weights: the mechanism SGLang runs for TP-sharded routed
experts on Hopper (semantics and sources: ``cupy_kernels/fused_moe_reference.py``).

One launch multiplies every (token, expert) row by its expert's weights: programs walk
``BLOCK_M`` rows of one expert (the sorted, padded row list of ``align_block_size``) by
``BLOCK_N`` output columns, stream the expert's FP8 weights in ``BLOCK_K`` = 128 steps, scale
each step's fp32 product by the activation's per-token-group scale and the weight's 128 x 128
block scale, and write bf16. With ``BLOCK_M`` < 64 and ``BLOCK_N`` >= 64 the product is computed
transposed (W x A^T), so that the wgmma's 64-row side is the weight tile rather than the few token
rows (SGLang enables the same swap on SM90 for those block shapes: ``should_enable_swap_ab``).
Our own code; needs PyTorch with CUDA and Triton (PyTorch's CUDA wheels ship it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP = 128


@dataclass(frozen=True)
class BlockConfig:
    """One tile configuration of the kernel (SGLang's tuned configs vary these per token count)."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 128
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        if self.block_k != GROUP:
            raise ValueError(f"fused MoE: block_k must be {GROUP} (one scale per K step), got {self.block_k}")
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"fused MoE: {name} must be a power of two >= 16, got {v}")

    @property
    def swap_ab(self) -> bool:
        return self.block_m < 64 and self.block_n >= 64

    @property
    def label(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}g{self.group_m}w{self.num_warps}s{self.num_stages}"
                + ("_swap" if self.swap_ab else ""))


_KERNEL = None


def _kernel():
    """Compile-on-first-use (Triton is imported only here)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise RuntimeError(f"the fused-MoE kernel needs Triton with a CUDA PyTorch ({exc}); PyTorch's CUDA "
                           "wheels ship it") from None

    @triton.jit
    def fused_moe_fp8(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, rw_ptr, sorted_ptr, expert_ptr, padded_ptr,
                      N, K: tl.constexpr, EM, num_valid,
                      stride_am, stride_asm, stride_be, stride_bn, stride_bse, stride_bsn, stride_cm,
                      TOP_K: tl.constexpr, MUL_RW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr):
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(EM, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * num_pid_n
        first_m = (pid // per_group) * GROUP_M
        size_m = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((pid % per_group) % size_m)
        pid_n = (pid % per_group) // size_m
        if pid_m * BLOCK_M >= tl.load(padded_ptr):
            return
        rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_ok = rows < num_valid
        src = rows // TOP_K
        expert = tl.load(expert_ptr + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + src[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
        as_ptrs = a_scale_ptr + src * stride_asm
        bs_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // BLOCK_K) * stride_bsn
        if SWAP_AB:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kb = k0 // BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
            sa = tl.load(as_ptrs + kb, mask=row_ok, other=0.0)
            sb = tl.load(bs_ptrs + kb, mask=n_ok, other=0.0)
            if SWAP_AB:
                acc += tl.dot(tl.trans(b), tl.trans(a)) * sb[:, None] * sa[None, :]
            else:
                acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        if SWAP_AB:
            acc = tl.trans(acc)
        if MUL_RW:
            acc = acc * tl.load(rw_ptr + rows, mask=row_ok, other=0.0)[:, None]
        c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(tl.bfloat16), mask=row_ok[:, None] & n_ok[None, :])

    _KERNEL = (triton, fused_moe_fp8)
    return _KERNEL


def fused_moe_gemm(a: Any, a_scale: Any, w: Any, w_scale: Any, sorted_ids: Any, expert_ids: Any, padded: Any,
                   top_k: int, out: Any, config: BlockConfig = BlockConfig(), routed_weights: Any = None) -> Any:
    """One fused-MoE GEMM launch on the current stream (torch tensors on the GPU).

    ``a`` [M, K] float8_e4m3fn (M tokens for gate_up with ``top_k`` the router's, or the sorted
    rows for down with ``top_k`` 1), ``a_scale`` [M, K/128] fp32; ``w`` [E, N, K] float8_e4m3fn
    (K contiguous), ``w_scale`` [E, N/128, K/128] fp32; ``sorted_ids`` / ``expert_ids`` int32 and
    ``padded`` (int32, one element) from ``align_block_size`` with ``config.block_m``; ``out``
    [valid rows, N] bf16, row ``r`` written for every valid row; ``routed_weights`` (fp32 [valid
    rows]) multiplies the rows (down)."""
    triton, kern = _kernel()
    e, n, k = w.shape
    if k % GROUP or a.shape[1] != k:
        raise ValueError(f"fused MoE: K must match ({a.shape[1]} vs {k}) and be a multiple of {GROUP}")
    if w.stride(2) != 1 or a.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("fused MoE: a, w and out must have unit stride along their last axis")
    if sorted_ids.numel() % config.block_m:
        raise ValueError(f"fused MoE: {sorted_ids.numel()} sorted rows is not a multiple of block_m {config.block_m}")
    em = sorted_ids.numel()
    valid = out.shape[0]
    grid = (triton.cdiv(em, config.block_m) * triton.cdiv(n, config.block_n),)
    rw = routed_weights if routed_weights is not None else a_scale
    kern[grid](a, a_scale, w, w_scale, out, rw, sorted_ids, expert_ids, padded,
               n, k, em, valid,
               a.stride(0), a_scale.stride(0), w.stride(0), w.stride(1), w_scale.stride(0), w_scale.stride(1),
               out.stride(0),
               TOP_K=top_k, MUL_RW=routed_weights is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
               BLOCK_K=config.block_k, GROUP_M=config.group_m, SWAP_AB=config.swap_ab,
               num_warps=config.num_warps, num_stages=config.num_stages)
    return out

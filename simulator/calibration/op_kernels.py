"""A real GPU kernel for each ``ops.Op`` (``hisparse calibrate`` times them one by one,
``hisparse validate`` runs them back to back as a layer).

- FP8 GEMMs: ``torch._scaled_mm`` (cuBLASLt, tensor-wise scales; rows padded to 16 as it needs),
  grouped routed experts ``torch._scaled_grouped_mm`` (one launch over the touched experts), a
  loop of ``_scaled_mm`` where that call is missing;
- bf16 GEMMs (lm_head, router gate, indexer weights_proj) and the absorbed per-head batched
  GEMMs: cuBLAS through CuPy in fp16 (CuPy has no bfloat16; Hopper's fp16 and bf16 tensor-core
  rates are the same, BRIEF 3);
- elementwise ops (norms, rope, quantisation, SiLU, routing): a device copy moving the op's
  bytes, which has the same launch and HBM traffic;
- the indexer and attention ops are run by the caller (they need the request state).
Every input is random (never zeros); weights rotate over copies so L2 holds no previous call's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..costmodel.ops import Op

L2_BYTES = 60 << 20  # H200 L2 (KINDS: 60 MB); rotate weights over more than this


_COPY = None


def copy_kernel(cp: Any):
    """An elementwise kernel (not a memcpy node): y = x over uint64 words."""
    global _COPY
    if _COPY is None:
        _COPY = cp.ElementwiseKernel("uint64 x", "uint64 y", "y = x", "hisparse_ew_copy")
    return _COPY


def _pad16(x: float) -> int:
    return max(16, int(math.ceil(x / 16)) * 16)


def _copies(weight_bytes: float, rotate: bool) -> int:
    return max(1, min(256, math.ceil(2 * L2_BYTES / max(weight_bytes, 1)))) if rotate else 1


class OpKernels:
    """Builds a no-argument launcher for an op; tensors are allocated when built."""

    def __init__(self, cp: Any, torch: Any | None, seed: int = 0) -> None:
        self.cp, self.torch = cp, torch
        self.gen = torch.Generator(device="cuda").manual_seed(seed) if torch is not None else None
        cp.random.seed(seed)
        self.impl: dict[str, str] = {}
        self._scratch = None

    # -- helpers -------------------------------------------------------------------------------
    def _fp8(self, *shape):
        t = self.torch
        return (t.randn(*shape, device="cuda", generator=self.gen) * 0.5).to(t.float8_e4m3fn)

    def _fp16(self, *shape):
        return (self.cp.random.standard_normal(shape, dtype=self.cp.float32) * 0.1).astype(self.cp.float16)

    def build(self, op: Op, rotate: bool = True) -> Callable[[], Any]:
        if op.kind == "elementwise":
            return self._elementwise(op)
        if op.kind == "gemm" and op.dtype == "fp8":
            return self._fp8_gemm(op, rotate)
        if op.kind in ("gemm", "batched_gemm") and op.dtype == "bf16":
            return self._fp16_gemm(op, rotate)
        if op.kind in ("grouped_gemm", "grouped_gemm_tp") and op.dtype == "fp8":
            return self._fp8_grouped(op, rotate)
        if op.kind == "batched_gemm" and op.dtype == "fp8":  # one group per head, every head's weights
            return self._fp8_grouped(op, rotate, touched=op.groups, rows_total=op.m * op.groups)
        raise ValueError(f"op {op.name}: no kernel for kind {op.kind!r} dtype {op.dtype!r}")

    def _elementwise(self, op: Op):
        cp = self.cp
        words = max(32, int(op.bytes / 2 / op.count) // 8)
        if self._scratch is None or self._scratch[0].size < words:
            size = max(words, 8 << 20)
            self._scratch = (cp.random.randint(0, 2**62, size, dtype=cp.int64).view(cp.uint64), cp.empty(size, cp.uint64))
        src, dst = self._scratch[0][:words], self._scratch[1][:words]
        kern = copy_kernel(cp)

        def run():
            for _ in range(op.count):
                kern(src, dst)
        self.impl[op.name] = "cupy elementwise copy"
        return run

    def _fp8_gemm(self, op: Op, rotate: bool):
        t = self.torch
        mp = _pad16(op.m)
        a = self._fp8(mp, op.k)
        ws = [self._fp8(op.n, op.k) for _ in range(_copies(op.k * op.n, rotate))]
        one = t.ones((), device="cuda", dtype=t.float32)
        out = t.empty(mp, op.n, device="cuda", dtype=t.bfloat16)
        i = [0]

        def run():
            w = ws[i[0] % len(ws)]
            i[0] += 1
            return t._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=t.bfloat16, out=out)
        self.impl[op.name] = "torch._scaled_mm"
        return run

    def _fp16_gemm(self, op: Op, rotate: bool):
        cp = self.cp
        g = op.groups
        shape_a, shape_w, shape_o = ((g, op.m, op.k), (g, op.k, op.n), (g, op.m, op.n)) if g > 1 else \
            ((op.m, op.k), (op.k, op.n), (op.m, op.n))
        a = self._fp16(*shape_a)
        ws = [self._fp16(*shape_w) for _ in range(_copies(2 * g * op.k * op.n, rotate))]
        out = cp.empty(shape_o, cp.float16)
        i = [0]

        def run():
            w = ws[i[0] % len(ws)]
            i[0] += 1
            return cp.matmul(a, w, out=out)
        self.impl[op.name] = "cupy matmul fp16" + (" batched" if g > 1 else "")
        return run

    def _fp8_grouped(self, op: Op, rotate: bool, touched: int | None = None, rows_total: float | None = None):
        """The touched experts (``op.weight_groups`` of ``op.groups``), ``op.tokens`` rows spread
        evenly, each group's rows padded to 16 (also the absorbed per-head bmm_fp8: every head a
        group of ``m`` rows)."""
        t = self.torch
        touched = touched or max(1, min(op.groups, round(op.weight_groups or op.groups)))
        rows = _pad16(max(rows_total or op.tokens, 1) / touched)
        a = self._fp8(touched * rows, op.k)
        sets = _copies(op.groups * op.n * op.k, rotate) if touched == op.groups else 1
        experts = self._fp8(op.groups * sets, op.n, op.k)  # local experts (x copies when all are read)
        sa = t.ones(touched * rows, device="cuda", dtype=t.float32)
        sb = t.ones(touched, op.n, device="cuda", dtype=t.float32)
        offs = (t.arange(1, touched + 1, device="cuda", dtype=t.int32) * rows)
        one = t.ones((), device="cuda", dtype=t.float32)
        span = op.groups * sets
        starts = list(range(0, span - touched + 1, max(1, touched))) if rotate else [0]
        i = [0]

        def grouped():
            s = starts[i[0] % len(starts)]
            i[0] += 1
            w = experts[s:s + touched]
            return t._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sb, offs=offs, out_dtype=t.bfloat16)

        def loop():
            s = starts[i[0] % len(starts)]
            i[0] += 1
            for e in range(touched):
                t._scaled_mm(a[e * rows:(e + 1) * rows], experts[s + e].t(), scale_a=one, scale_b=one,
                             out_dtype=t.bfloat16)
        try:
            grouped()
            t.cuda.synchronize()
            self.impl[op.name] = "torch._scaled_grouped_mm"
            return grouped
        except Exception as exc:  # older torch or an unsupported layout: one launch per expert
            self.impl[op.name] = f"loop of torch._scaled_mm ({type(exc).__name__})"
            return loop

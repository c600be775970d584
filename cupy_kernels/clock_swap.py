"""CLOCK multi-step (MTP) swap-in on the GPU: SGLang PR #32162's commit, bit-exact with the
replay engine's ``sglang-clock`` policy.

``clock_swap.cu`` beside this file holds the kernel and its algorithm, ``clock_model.py`` the same
algorithm in numpy. ``ClockHotBuffer.swap_in`` runs one commit ([steps, w] top-k positions per
request: the draft positions of one verify pass, deduped) for one layer of a batch, the missing
rows copied from a pinned mapped host pool by each request's block (``copy="inline"``) or planned
and copied by a full-grid kernel (``copy="plan"``).

CuPy is imported lazily.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ._build import SM90_FLAGS, build_cubin, load_sm90_module
from .clock_model import epoch_mask
from .sharded_lru import COPY_MODES, check_buffer_options  # noqa: F401  (COPY_MODES: one table, re-exported)

THREADS = 512
WARPS = THREADS // 32
SMEM_LIMIT = 227 * 1024
COPY_THREADS = 256
_SOURCE = Path(__file__).with_name("clock_swap.cu")


def smem_bytes(buffer: int, n_occ: int, steps: int) -> int:
    """Dynamic shared memory of a block (mirrors ``clock_carve``)."""
    return 4 * (2 * buffer + 4 * n_occ + steps + 8 + WARPS) + n_occ


def check_config(buffer: int, steps: int, top_k: int) -> None:
    if buffer < 1 or steps < 1 or top_k < 1:
        raise ValueError(f"buffer {buffer}, steps {steps} and top_k {top_k} must be positive")
    if steps * top_k > 64 * THREADS:
        raise ValueError(f"steps x top_k = {steps * top_k} occurrences exceed the kernel's {64 * THREADS}")
    if smem_bytes(buffer, steps * top_k, steps) > SMEM_LIMIT:
        raise ValueError(f"buffer {buffer} with {steps} x {top_k} occurrences needs "
                         f"{smem_bytes(buffer, steps * top_k, steps)} B of shared memory (limit {SMEM_LIMIT})")


def compiled_cubin(unroll: int = 4) -> Path:
    return build_cubin(_SOURCE, (*SM90_FLAGS, f"-DUNROLL={int(unroll)}"), "clock_swap")


@cache
def _module(device_id: int, unroll: int = 4) -> Any:
    return load_sm90_module(device_id, compiled_cubin(unroll), "the CLOCK swap-in kernel is", ("swap_in_clock",))


class ClockHotBuffer:
    """One layer's hot buffers for a batch of requests under SGLang's multi-step CLOCK commit,
    rows loaded from a pinned mapped host pool [R, max_ctx, row_bytes].

    Device rows per request: B + 1 + steps * k (slot B: the newest token; B + 1 + i: scratch for
    the miss of ordinal i when it is served but not cached)."""

    def __init__(self, *, requests: int, max_ctx: int, buffer: int, steps: int, top_k: int, row_bytes: int,
                 host_ptr: int, initial: str = "prefix", reserve: bool = True, copy: str = "inline",
                 copy_blocks: int = 0, unroll: int = 4) -> None:
        import cupy as cp

        check_config(buffer, steps, top_k)
        check_buffer_options(copy, initial, row_bytes)
        self.R, self.C, self.B, self.S, self.k, self.row_bytes = requests, max_ctx, buffer, steps, top_k, row_bytes
        self.N = steps * top_k
        self.rows = buffer + 1 + self.N
        self.prefix, self.reserve, self.copy = initial == "prefix", bool(reserve), copy
        self.host_ptr = int(host_ptr)
        self.mask = epoch_mask(buffer)
        mod = _module(cp.cuda.Device().id, unroll)
        self._step, self._copy = mod.get_function("swap_in_clock"), mod.get_function("copy_plan")
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.copy_blocks = copy_blocks or 4 * sms
        self.dev = cp.empty((requests * self.rows, row_bytes), cp.uint8)
        self._slot_pos = cp.empty((requests, buffer), cp.int32)
        self._ref = cp.empty((requests, buffer), cp.int32)
        self._pos_slot = cp.empty((requests, max_ctx), cp.int32)
        self._meta = cp.empty((requests, 4), cp.int32)
        self._plan = cp.empty((requests, self.N, 2), cp.int32)
        self._plan_n = cp.zeros(requests, cp.int32)
        self.reset()

    def reset(self) -> None:
        self._slot_pos[:] = -1
        self._ref[:] = 0
        self._pos_slot[:] = -1
        self._meta[:] = 0

    def state(self) -> np.ndarray:
        """slot_pos [R, B] (-1 for a request that has not left the fast path yet)."""
        sp, meta = self._slot_pos.get(), self._meta.get()
        return np.where(meta[:, :1] > 0, sp, -1)

    def swap_in(self, indices: Any, ctx_len: Any, *, slots_out: Any = None, misses_out: Any = None) -> tuple[Any, Any]:
        """One commit: indices int32 [R, steps, w] (w <= k; distinct in a row, -1 padding at the
        end), ctx_len int64 [R, steps] (a row of 0: idle). Returns (slots int32 [R, steps, w]:
        the slot of each entry after the commit, B the reserved newest, B + 1 + i a scratch row;
        misses int32 [R, steps]: each unique miss counted at its first step)."""
        import cupy as cp

        idx = cp.ascontiguousarray(cp.asarray(indices, dtype=cp.int32))
        ctx = cp.ascontiguousarray(cp.asarray(ctx_len, dtype=cp.int64))
        if idx.ndim != 3 or idx.shape[:2] != (self.R, self.S) or not 1 <= idx.shape[2] <= self.k \
                or ctx.shape != (self.R, self.S):
            raise ValueError(f"indices must be [{self.R}, {self.S}, w <= {self.k}] and ctx_len [{self.R}, {self.S}]")
        w = int(idx.shape[2])
        slots = cp.empty((self.R, self.S, w), cp.int32) if slots_out is None else slots_out
        misses = cp.empty((self.R, self.S), cp.int32) if misses_out is None else misses_out
        plan = self.copy == "plan"
        args = (idx, ctx, np.int32(self.S), np.int32(w), np.int32(self.B), np.int64(self.C), np.int32(self.N),
                np.int32(self.prefix), np.int32(self.reserve), np.uint32(self.mask), self._slot_pos, self._ref,
                self._pos_slot, self._meta, slots, misses, self._plan, self._plan_n, np.int32(plan),
                np.uint64(self.host_ptr), self.dev, np.int32(self.row_bytes))
        self._step((self.R,), (THREADS,), args, shared_mem=smem_bytes(self.B, self.N, self.S))
        if plan:
            self._copy((self.copy_blocks,), (COPY_THREADS,),
                       (self._plan, self._plan_n, np.int32(self.R), np.int32(self.N), np.int64(self.C),
                        np.int32(self.rows), np.uint64(self.host_ptr), self.dev, np.int32(self.row_bytes)),
                       shared_mem=4 * (self.R + 1))
        return slots, misses

"""Sharded (set-associative) batched LRU on the GPU: whole-trace replay and a one-step swap-in.

``sharded_lru.cu`` beside this file holds the kernels and their algorithm; one shard of B ways
is the replay engine's exact batched ``lru``, B / W shards its ``salru`` (SGLang PR #31341).

- ``replay(streams, configs)``: every (stream, config) pair in one launch, one block each, the
  whole trace in the block's loop (the GPU replay backend, ``simulator.replay.gpu``).
- ``ShardedHotBuffer``: one decode step of one layer for a batch of requests, the rows copied
  from pinned host memory either by each request's block (``copy="inline"``, one launch) or
  planned by it and copied by a full-grid kernel (``copy="plan"``, two launches: our
  plan-then-copy for small batches, where one block per request leaves most SMs idle).

CuPy is imported lazily (validation and sizes work without it).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ._build import SM90_FLAGS, build_cubin, load_sm90_module

THREADS = 512
WARPS = THREADS // 32
SMEM_LIMIT = 227 * 1024
COPY_MODES = ("inline", "plan")


def check_buffer_options(copy: str, initial: str, row_bytes: int) -> None:
    """The options every hot-buffer kernel wrapper shares (this one and ``clock_swap``'s)."""
    if copy not in COPY_MODES:
        raise ValueError(f"copy must be one of {COPY_MODES}, got {copy!r}")
    if initial not in ("prefix", "empty"):
        raise ValueError(f"initial must be prefix or empty, got {initial!r}")
    if row_bytes % 16:
        raise ValueError(f"row_bytes must be a multiple of 16, got {row_bytes}")
_SOURCE = Path(__file__).with_name("sharded_lru.cu")
COPY_THREADS = 256


class ShardConfig(NamedTuple):
    """One replay config of the kernel: B slots in B / ways shards (ways == B: exact LRU)."""

    buffer: int
    ways: int
    prefix: bool = True
    reserve: bool = True


class GpuReplay(NamedTuple):
    """misses[c][s]: int64 [steps of stream s] under config c; slot_pos / order likewise."""

    misses: list[list[np.ndarray]]
    slot_pos: list[list[np.ndarray]]
    order: list[list[np.ndarray]]
    seconds: float  # the launch alone, timed with device events


def smem_bytes(buffer: int, ways: int, k: int) -> int:
    """Dynamic shared memory of a block (mirrors ``carve`` in sharded_lru.cu)."""
    S = buffer // ways
    return 4 * (5 * buffer + (S + 1) + S + WARPS * S + 4 * k + 8 + WARPS)


def check_config(buffer: int, ways: int, k: int) -> None:
    """The sizes the kernels take: ways divide the buffer, k <= buffer, shared memory fits."""
    if buffer < 1 or ways < 1 or buffer % ways:
        raise ValueError(f"buffer {buffer} must be a positive whole number of shards of {ways} ways")
    if k > buffer:
        raise ValueError(f"k = {k} entries do not fit a buffer of {buffer} slots (a batched step needs k <= B)")
    if smem_bytes(buffer, ways, k) > SMEM_LIMIT:
        raise ValueError(f"buffer {buffer} with {buffer // ways} shards and k {k} needs "
                         f"{smem_bytes(buffer, ways, k)} B of shared memory (limit {SMEM_LIMIT})")


def compiled_cubin(unroll: int = 4) -> Path:
    return build_cubin(_SOURCE, (*SM90_FLAGS, f"-DUNROLL={int(unroll)}"), "sharded_lru")


@cache
def _module(device_id: int, unroll: int = 4) -> Any:
    return load_sm90_module(device_id, compiled_cubin(unroll), "the sharded LRU kernels are", ("replay_sharded_lru", "swap_in_sharded"))


def _check_stream(indices: np.ndarray, ctx_len: np.ndarray, i: int) -> None:
    if indices.ndim != 2 or ctx_len.shape != (indices.shape[0],):
        raise ValueError(f"stream {i}: indices must be [steps, width] and ctx_len [steps], got "
                         f"{indices.shape} and {ctx_len.shape}")
    live = indices >= 0
    if (live[:, 1:] & ~live[:, :-1]).any():
        raise ValueError(f"stream {i}: a real entry follows padding (pad at the end of a row)")
    if (indices >= ctx_len[:, None]).any():
        raise ValueError(f"stream {i}: an entry lies at or past its step's ctx_len")
    srt = np.sort(np.where(live, indices, -1 - np.arange(indices.shape[1])), axis=1)
    if (srt[:, 1:] == srt[:, :-1]).any():
        raise ValueError(f"stream {i}: a step selects the same position twice")


def replay(streams: Sequence[tuple[np.ndarray, np.ndarray]], configs: Sequence[ShardConfig], *,
           check: bool = True) -> GpuReplay:
    """Replay every stream (indices int32 [steps, width], ctx_len int64 [steps]) under every
    config in one launch; bit for bit the engine's batched lru / salru."""
    import cupy as cp

    if not streams or not configs:
        raise ValueError("replay needs at least one stream and one config")
    idx_h = [np.ascontiguousarray(i, np.int32) for i, _ in streams]
    ctx_h = [np.ascontiguousarray(c, np.int64) for _, c in streams]
    if check:
        for i, (a, c) in enumerate(zip(idx_h, ctx_h, strict=True)):
            _check_stream(a, c, i)
    kmax = max(a.shape[1] for a in idx_h)
    for c in configs:
        check_config(c.buffer, c.ways, kmax)
    n_s, n_c = len(streams), len(configs)
    steps = np.array([a.shape[0] for a in idx_h], np.int32)
    width = np.array([a.shape[1] for a in idx_h], np.int32)
    idx_off = np.concatenate([[0], np.cumsum([a.size for a in idx_h])[:-1]]).astype(np.int64)
    step_off = np.concatenate([[0], np.cumsum(steps)[:-1]]).astype(np.int64)
    total_steps = int(steps.sum())
    cmax = np.array([max(1, int(c.max()) if c.size else 1) for c in ctx_h], np.int64)
    pos_sizes = np.tile(cmax, n_c)  # block b = c * n_s + s
    pos_off = np.concatenate([[0], np.cumsum(pos_sizes)[:-1]]).astype(np.int64)
    Bmax = max(c.buffer for c in configs)
    Smax = max(c.buffer // c.ways for c in configs)
    mod = _module(cp.cuda.Device().id)
    kern = mod.get_function("replay_sharded_lru")
    d = {name: cp.asarray(v) for name, v in (
        ("idx", np.concatenate([a.ravel() for a in idx_h])), ("ctx", np.concatenate(ctx_h)),
        ("idx_off", idx_off), ("step_off", step_off), ("steps", steps), ("width", width),
        ("B", np.array([c.buffer for c in configs], np.int32)), ("W", np.array([c.ways for c in configs], np.int32)),
        ("flags", np.array([int(c.prefix) | 2 * int(c.reserve) for c in configs], np.int32)),
        ("pos_off", pos_off))}
    pos_slot = cp.full(int(pos_sizes.sum()), -1, cp.int32)
    misses = cp.zeros(n_c * total_steps, cp.int32)
    slot_pos = cp.empty((n_s * n_c, Bmax), cp.int32)
    order = cp.empty((n_s * n_c, Bmax), cp.int32)
    n_order = cp.empty(n_s * n_c, cp.int32)
    args = (d["idx"], d["ctx"], d["idx_off"], d["step_off"], d["steps"], d["width"], np.int32(n_s), d["B"], d["W"],
            d["flags"], pos_slot, d["pos_off"], misses, np.int64(total_steps), slot_pos, order, n_order,
            np.int32(Bmax), np.int32(Smax), np.int32(kmax))
    shared = max(smem_bytes(c.buffer, c.ways, kmax) for c in configs)
    # a block carves its arrays for its own B; the launch reserves the largest
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    kern((n_s * n_c,), (THREADS,), args, shared_mem=shared)
    end.record()
    end.synchronize()
    seconds = cp.cuda.get_elapsed_time(start, end) / 1e3
    m, sp, od, no = misses.get(), slot_pos.get(), order.get(), n_order.get()
    out_m, out_s, out_o = [], [], []
    for c, cfg in enumerate(configs):
        base = c * total_steps
        out_m.append([m[base + step_off[s]: base + step_off[s] + steps[s]].astype(np.int64) for s in range(n_s)])
        out_s.append([sp[c * n_s + s, :cfg.buffer].astype(np.int64) for s in range(n_s)])
        out_o.append([od[c * n_s + s, :no[c * n_s + s]].astype(np.int64) for s in range(n_s)])
    return GpuReplay(out_m, out_s, out_o, seconds)


class ShardedHotBuffer:
    """One layer's hot buffers for a batch of requests under sharded LRU (``ways == buffer``:
    exact LRU), rows loaded from a pinned mapped host pool [R, max_ctx, row_bytes].

    Device rows per request: B + 1 + k (slot B: the newest token; B + 1 + i: scratch for the
    i-th miss that was served but not cached). ``copy``: "inline" (each request's block copies
    its rows) or "plan" (the blocks write copy plans, a full-grid kernel copies)."""

    def __init__(self, *, requests: int, max_ctx: int, buffer: int, ways: int, top_k: int, row_bytes: int,
                 host_ptr: int, initial: str = "prefix", reserve: bool = True, copy: str = "inline",
                 copy_blocks: int = 0, unroll: int = 4) -> None:
        import cupy as cp

        check_config(buffer, ways, top_k)
        check_buffer_options(copy, initial, row_bytes)
        self.R, self.C, self.B, self.W, self.k, self.row_bytes = requests, max_ctx, buffer, ways, top_k, row_bytes
        self.rows = buffer + 1 + top_k
        self.prefix, self.reserve, self.copy = initial == "prefix", bool(reserve), copy
        self.host_ptr = int(host_ptr)
        mod = _module(cp.cuda.Device().id, unroll)
        self._step, self._copy = mod.get_function("swap_in_sharded"), mod.get_function("copy_plan")
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.copy_blocks = copy_blocks or 4 * sms
        self.dev = cp.empty((requests * self.rows, row_bytes), cp.uint8)
        self._slot_pos = cp.empty((requests, buffer), cp.int32)
        self._order = cp.empty((requests, buffer), cp.int32)
        self._pos_slot = cp.empty((requests, max_ctx), cp.int32)
        self._meta = cp.empty((requests, 4), cp.int32)
        self._plan = cp.empty((requests, top_k, 2), cp.int32)
        self._plan_n = cp.zeros(requests, cp.int32)
        self.reset()

    def reset(self) -> None:
        self._slot_pos[:] = -1
        self._pos_slot[:] = -1
        self._meta[:] = 0

    def state(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(slot_pos [R, B], per request its filled slots shard by shard, least recent first)."""
        sp, od, meta = self._slot_pos.get(), self._order.get(), self._meta.get()
        orders = [od[r][sp[r][od[r]] >= 0] if meta[r, 0] else np.zeros(0, np.int32) for r in range(self.R)]
        return np.where(meta[:, :1] > 0, sp, -1), orders

    def swap_in(self, indices: Any, ctx_len: Any, *, slots_out: Any = None, misses_out: Any = None) -> tuple[Any, Any]:
        """One step: indices int32 [R, w] (w <= k, distinct, -1 padding at the end), ctx_len
        int64 [R] (0: idle). Returns (slots int32 [R, w], misses int32 [R])."""
        import cupy as cp

        idx = cp.ascontiguousarray(cp.asarray(indices, dtype=cp.int32))
        ctx = cp.ascontiguousarray(cp.asarray(ctx_len, dtype=cp.int64))
        if idx.ndim != 2 or idx.shape[0] != self.R or not 1 <= idx.shape[1] <= self.k or ctx.shape != (self.R,):
            raise ValueError(f"indices must be [{self.R}, w <= {self.k}] and ctx_len [{self.R}]")
        w = int(idx.shape[1])
        slots = cp.empty((self.R, w), cp.int32) if slots_out is None else slots_out
        misses = cp.empty(self.R, cp.int32) if misses_out is None else misses_out
        plan = self.copy == "plan"
        args = (idx, ctx, np.int32(w), np.int32(self.B), np.int32(self.W), np.int64(self.C), np.int32(self.k),
                np.int32(self.prefix), np.int32(self.reserve), self._slot_pos, self._order, self._pos_slot,
                self._meta, slots, misses, self._plan, self._plan_n, np.int32(plan), np.uint64(self.host_ptr),
                self.dev, np.int32(self.row_bytes))
        self._step((self.R,), (THREADS,), args, shared_mem=smem_bytes(self.B, self.W, self.k))
        if plan:
            self._copy((self.copy_blocks,), (COPY_THREADS,),
                       (self._plan, self._plan_n, np.int32(self.R), np.int32(self.k), np.int64(self.C),
                        np.int32(self.rows), np.uint64(self.host_ptr), self.dev, np.int32(self.row_bytes)),
                       shared_mem=4 * (self.R + 1))
        return slots, misses

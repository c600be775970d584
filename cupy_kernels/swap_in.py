"""HiSparse swap-in: hot-buffer bookkeeping (batched LRU) and zero-copy row loads (CuPy RawKernel).

The data path HiSparse adds to a decode step: for one layer and a batch of requests, find which
selected positions are missing from each request's hot buffer, choose victims by the replay
engine's ``lru`` policy (batched: hits protected, miss i takes the i-th least recently used
non-hit slot; the newest token lives in a reserved slot, index B), update the tables, copy the
missing rows from pinned mapped host memory, and return the slot of every entry.

The replay engine's batched ``lru`` is the specification: its batch wrapper
``simulator.replay.swap_in_reference.reference_swap_in`` lives beside the engine (this package
imports nothing from the simulator), and the GPU tests compare the kernel against it bit for bit.
The kernel source is ``swap_in.cu`` beside this file, built with nvcc to a cubin (cached, like
``sparse_attention``) and launched cooperatively so that all blocks are resident: each request's
owner block publishes its copy list, and the blocks that help copy it wait for that request alone
(no grid barrier).

CuPy is imported lazily: geometry, validation and error decoding work without it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ._build import SM90_FLAGS, build_cubin

THREADS = 512
WARPS = THREADS // 32
DEFAULT_UNROLL = 4
DEFAULT_BLOCKS_PER_SM = 1  # measured: 1 block of 512 threads per SM (no register spills) beats 2
COPY_ORDERS = ("flat", "request", "hybrid", "early")
_COPY_ORDER_ARG = {"request": 0, "flat": 1, "hybrid": 2, "early": 3}
DUP_CHECKS = ("bitmap", "hash")  # duplicate check: a max_ctx-bit bitmap in shared memory, or a hash table
INITIAL_MODES = ("prefix", "empty")
SMEM_LIMIT = 227 * 1024
_INT32_MAX = 2**31 - 1
_SOURCE = Path(__file__).with_name("swap_in.cu")
_NVCC_FLAGS = SM90_FLAGS
_HOST_ALLOC_PORTABLE, _HOST_ALLOC_MAPPED = 1, 2
_MEMCPY_H2D = 1
ERR_CTX, ERR_POS, ERR_PAD, ERR_DUP = 1, 2, 3, 4


class SwapInError(ValueError):
    """Bad step inputs found by the kernel; the requests named kept their state unchanged."""


class SwapInGeometry(NamedTuple):
    """Sizes of one HotBuffer: the host pool is [layers, requests, max_ctx, row_bytes]."""

    layers: int
    requests: int
    max_ctx: int  # positions per (layer, request) in the host pool; ctx_len may not exceed it
    buffer: int  # device_buffer_size B: LRU slots per (layer, request), plus one reserved slot
    top_k: int  # most entries a step may hold
    row_bytes: int

    @property
    def host_bytes(self) -> int:
        return self.layers * self.requests * self.max_ctx * self.row_bytes

    @property
    def layer_host_bytes(self) -> int:
        return self.requests * self.max_ctx * self.row_bytes

    @property
    def device_row_bytes(self) -> int:
        """Bytes of hot-buffer rows (B + 1 slots per request) over all layers."""
        return self.layers * self.requests * (self.buffer + 1) * self.row_bytes

    @property
    def copy_segment(self) -> int:
        """Copy-list entries per request: a fresh prefix (B) + misses (k) + the newest."""
        return self.buffer + self.top_k + 1

    @property
    def copy_capacity(self) -> int:
        """Most copies one launch can queue (one segment per request)."""
        return self.requests * self.copy_segment

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.buffer, self.top_k)

    @property
    def dup_bitmap_words(self) -> int:
        """Words of the duplicate-check bitmap (one bit per position), 0 if it does not fit."""
        words = -(-self.max_ctx // 32)
        return words if smem_bytes(self.buffer, self.top_k, words) <= SMEM_LIMIT else 0


class SwapInResult(NamedTuple):
    """slots: int32 [R, k] where attention reads each entry (B: reserved newest slot, -1: padding;
    row indices into ``device_rows(layer)`` with ``global_rows=True``); misses: int32 [R]."""

    slots: Any
    misses: Any


class HotBufferState(NamedTuple):
    """One layer's bookkeeping, copied to the host (what the tests compare with the engine)."""

    slot_pos: np.ndarray  # int32 [R, B]: position held by each slot, -1 free
    orders: list[np.ndarray]  # per request: occupied slots, least recently used first
    n_used: np.ndarray  # int32 [R]
    started: np.ndarray  # int32 [R]
    fast: np.ndarray  # int32 [R]: the previous step took the short-sequence fast path
    filled: np.ndarray  # int32 [R]: slots [0, filled) hold rows [0, filled)


def smem_bytes(buffer: int, top_k: int, dup_words: int = 0) -> int:
    """Dynamic shared memory of the kernel (mirrors ``carve`` in swap_in.cu); dup_words: the
    duplicate-check bitmap's 32-bit words (0: hash table in the bookkeeping's arrays)."""
    ballots = (max(buffer, top_k) + 31) // 32 + WARPS
    return 4 * (4 * top_k + 2 * buffer + ballots + dup_words) + buffer


def make_geometry(*, layers: int, requests: int, max_ctx: int, device_buffer_size: int, top_k: int,
                  row_bytes: int) -> SwapInGeometry:
    """Validated sizes; every limit the kernel's 32-bit indexing and shared memory impose."""
    vals = {"layers": layers, "requests": requests, "max_ctx": max_ctx,
            "device_buffer_size": device_buffer_size, "top_k": top_k, "row_bytes": row_bytes}
    for name, v in vals.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if device_buffer_size < top_k:
        raise ValueError(f"device_buffer_size ({device_buffer_size}) must be >= top_k ({top_k}): "
                         "every entry of a step must fit in the buffer at once")
    if row_bytes % 16:
        raise ValueError(f"row_bytes must be a multiple of 16 (16-byte loads), got {row_bytes}")
    g = SwapInGeometry(int(layers), int(requests), int(max_ctx), int(device_buffer_size), int(top_k),
                       int(row_bytes))
    if g.requests * g.max_ctx > _INT32_MAX or g.requests * (g.buffer + 1) > _INT32_MAX:
        raise ValueError("requests x max_ctx and requests x (device_buffer_size + 1) must fit in int32")
    if g.copy_capacity * (g.row_bytes // 16) > _INT32_MAX:
        raise ValueError("requests x (2 x device_buffer_size + 1) x row_bytes / 16 must fit in int32")
    if g.smem_bytes > SMEM_LIMIT:
        raise ValueError(f"device_buffer_size {g.buffer} with top_k {g.top_k} needs {g.smem_bytes} B of "
                         f"shared memory per block (limit {SMEM_LIMIT})")
    return g


# --------------------------------------------------------------------------------------------
# Step validation (host) and kernel error decoding
# --------------------------------------------------------------------------------------------
def validate_step(geom: SwapInGeometry, indices: Any, ctx_len: Any) -> None:
    """Shapes and dtypes of any array; values too for numpy arrays (cupy values: in the kernel).

    indices: [R, w] int (w <= top_k), distinct positions, -1 (any negative) padding at the end
    of a row only.
    ctx_len: [R] int; 0 marks a request idle this step (its row must be all padding).
    """
    on_host = isinstance(indices, np.ndarray) and isinstance(ctx_len, np.ndarray)
    _check_array(indices, "indices", 2, np.int32, on_host)
    _check_array(ctx_len, "ctx_len", 1, np.int64, on_host)
    rq, width = int(indices.shape[0]), int(indices.shape[1])
    if rq != geom.requests or not 1 <= width <= geom.top_k:
        raise ValueError(f"indices must be [requests={geom.requests}, w] with 1 <= w <= top_k={geom.top_k}, "
                         f"got {tuple(indices.shape)}")
    if tuple(ctx_len.shape) != (geom.requests,):
        raise ValueError(f"ctx_len must be [requests={geom.requests}], got {tuple(ctx_len.shape)}")
    if on_host:
        messages = host_errors(geom, np.asarray(indices, np.int64), np.asarray(ctx_len, np.int64))
        if messages:
            raise SwapInError("; ".join(messages))


def _check_array(a: Any, name: str, ndim: int, dtype: Any, on_host: bool) -> None:
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise ValueError(f"{name} must be an array, got {type(a).__name__}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(a.shape)}")
    if on_host:
        if not np.issubdtype(np.dtype(a.dtype), np.integer):
            raise ValueError(f"{name} must hold integers, got {np.dtype(a.dtype).name}")
    elif np.dtype(a.dtype) != np.dtype(dtype) or not a.flags.c_contiguous:
        raise ValueError(f"{name} on the GPU must be a C-contiguous {np.dtype(dtype).name} array")


def host_errors(geom: SwapInGeometry, indices: np.ndarray, ctx_len: np.ndarray) -> list[str]:
    """One message per bad request (the same checks the kernel makes, in the same order)."""
    out = []
    for r in range(indices.shape[0]):
        row, ctx = indices[r], int(ctx_len[r])
        pad = np.flatnonzero(row < 0)
        first_pad = int(pad[0]) if pad.size else row.size
        bad = np.flatnonzero(row >= ctx)
        if not 0 <= ctx <= geom.max_ctx:
            out.append(_message(r, ERR_CTX, -1, ctx, geom.max_ctx, 0))
        elif bad.size:
            out.append(_message(r, ERR_POS, int(bad[0]), ctx, geom.max_ctx, int(row[bad[0]])))
        elif (row[first_pad:] >= 0).any():
            out.append(_message(r, ERR_PAD, first_pad, ctx, geom.max_ctx, 0))
        else:
            live = np.sort(row[:first_pad])
            rep = live[1:][live[1:] == live[:-1]]
            if rep.size:
                out.append(_message(r, ERR_DUP, int(rep[0]), ctx, geom.max_ctx, 0))
    return out


def _message(r: int, code: int, j: int, ctx: int, max_ctx: int, pos: int) -> str:
    if code == ERR_CTX:
        return f"request {r}: ctx_len {ctx} outside [0, max_ctx={max_ctx}]"
    if code == ERR_POS:
        return f"request {r}: entry {j} holds position {pos}, outside [0, ctx_len={ctx})"
    if code == ERR_PAD:
        return f"request {r}: a real entry follows the padding that starts at entry {j} (pad at the end)"
    if code == ERR_DUP:
        return f"request {r}: position {j} appears more than once (a step's positions must be distinct)"
    return f"request {r}: unknown error code {code}"


def decode_errors(geom: SwapInGeometry, errors: np.ndarray, indices: np.ndarray, ctx_len: np.ndarray) -> list[str]:
    """Messages for the kernel's per-request (code, entry) error words."""
    out = []
    for r in np.flatnonzero(errors[:, 0]):
        code, j = int(errors[r, 0]), int(errors[r, 1])
        pos = int(indices[r, j]) if code == ERR_POS else 0
        out.append(_message(int(r), code, j, int(ctx_len[r]), geom.max_ctx, pos))
    return out


# --------------------------------------------------------------------------------------------
# Build and load
# --------------------------------------------------------------------------------------------
def compiled_cubin(unroll: int = DEFAULT_UNROLL, blocks_per_sm: int = DEFAULT_BLOCKS_PER_SM,
                   stop_after: int | None = None, max_regs: int = 0) -> Path:
    """Build (once, cached by source hash and flags) and return the kernel's cubin.
    stop_after 0..6 builds a timing-breakdown variant whose bookkeeping ends after that phase
    (0: before its first load);
    max_regs > 0 caps the registers per thread (benchmarks: room for a preceding kernel's block
    on the same SM, which programmatic dependent launch needs to overlap it)."""
    flags = (*_NVCC_FLAGS, f"-DUNROLL={int(unroll)}", f"-DMIN_BLOCKS={int(blocks_per_sm)}")
    if stop_after is not None:
        flags = (*flags, f"-DSTOP_AFTER={int(stop_after)}")
    if max_regs:
        flags = (*flags, f"-DMAX_REGS={int(max_regs)}")
    return build_cubin(_SOURCE, flags, "swap_in")


@cache
def _kernel(device_id: int, unroll: int, blocks_per_sm: int = DEFAULT_BLOCKS_PER_SM,
            stop_after: int | None = None, max_regs: int = 0) -> tuple[Any, int, int]:
    """(kernel, SM count, opt-in shared memory limit) on a device; needs sm_90."""
    import cupy as cp

    dev = cp.cuda.Device(device_id)
    if int(dev.compute_capability) < 90:
        raise RuntimeError(f"the swap-in kernel is built for sm_90; device has sm_{dev.compute_capability}")
    mod = cp.RawModule(path=str(compiled_cubin(unroll, blocks_per_sm, stop_after, max_regs)),
                       enable_cooperative_groups=True)
    kern = mod.get_function("swap_in_lru")
    optin = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    kern.max_dynamic_shared_size_bytes = optin - kern.shared_size_bytes
    return kern, dev.attributes["MultiProcessorCount"], optin


def _grid_size(kern: Any, n_sms: int, smem: int) -> int:
    """Blocks that can all be resident at once (a cooperative launch requires it)."""
    import cupy as cp

    try:
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, THREADS, smem)
    except AttributeError:  # older CuPy: count from the kernel's registers and shared memory
        dev = cp.cuda.Device().attributes
        regs = max(1, kern.num_regs) * THREADS
        per_sm = min(dev["MaxThreadsPerMultiProcessor"] // THREADS, dev["MaxRegistersPerMultiprocessor"] // regs,
                     dev["MaxSharedMemoryPerMultiprocessor"] // (smem + kern.shared_size_bytes + 1024))
    if per_sm < 1:
        raise RuntimeError(f"swap-in kernel cannot be resident with {smem} B of shared memory")
    return per_sm * n_sms


# --------------------------------------------------------------------------------------------
# Host pool and hot buffer
# --------------------------------------------------------------------------------------------
POOL_BACKINGS = ("alloc", "register", "register-thp")
"""How a PinnedPool gets its pages: ``alloc`` (cudaHostAlloc, the driver's own pinned pages),
``register`` (an anonymous mmap of 4 KB pages (MADV_NOHUGEPAGE) pinned with cudaHostRegister, as
SGLang pins its host KV tensors) or ``register-thp`` (the same mapping advised MADV_HUGEPAGE first, so the kernel
backs it with 2 MB transparent huge pages where it can: the test of whether scattered row reads
are bound by page translation; ``huge_fraction`` says how much of it got huge pages)."""
_HOST_REGISTER_PORTABLE, _HOST_REGISTER_MAPPED = 1, 2
_HUGE = 2 << 20


class PinnedPool:
    """Page-locked host memory mapped into the GPU's address space (see ``POOL_BACKINGS``).

    ``array`` is a numpy uint8 view; ``device_ptr`` is what kernels read through (zero-copy).
    One pool can back several HotBuffers in turn (benchmarks reuse a 16 GB pool).
    """

    def __init__(self, nbytes: int, backing: str = "alloc") -> None:
        if nbytes < 1:
            raise ValueError(f"pool size must be positive, got {nbytes}")
        if backing not in POOL_BACKINGS:
            raise ValueError(f"pool backing must be one of {', '.join(POOL_BACKINGS)}, got {backing!r}")
        import cupy as cp

        self.nbytes, self.backing = int(nbytes), backing
        self._registered = 0
        if backing == "alloc":
            self._mem = cp.cuda.PinnedMemory(self.nbytes, _HOST_ALLOC_PORTABLE | _HOST_ALLOC_MAPPED)
            self.array = np.frombuffer(cp.cuda.PinnedMemoryPointer(self._mem, 0), np.uint8, self.nbytes)
            # Unified addressing (every 64-bit CUDA platform): the host pointer is the device pointer.
            self.device_ptr = int(self._mem.ptr)
            return
        import ctypes
        import mmap

        # one spare huge page so the view can start on a 2 MB boundary (huge pages need it)
        self._map = mmap.mmap(-1, self.nbytes + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        offset = (-base) % _HUGE
        # before the first touch, so that the faults take 2 MB pages, or surely 4 KB ones (a kernel
        # set to THP "always" would otherwise give huge pages to "register" too)
        self._map.madvise(mmap.MADV_HUGEPAGE if backing == "register-thp" else mmap.MADV_NOHUGEPAGE)
        self.array = np.frombuffer(self._map, np.uint8, self.nbytes, offset)
        self.array[::4096] = 0  # fault every page in before pinning
        self._registered = base + offset
        cp.cuda.runtime.hostRegister(self._registered, self.nbytes, _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED)
        # the device address of the registered range (equal to the host one where the GPU can use
        # host pointers for registered memory, as every Hopper can)
        self.device_ptr = int(cp.cuda.runtime.pointerGetAttributes(self._registered).devicePointer)

    def huge_fraction(self) -> float:
        """Share of this process's anonymous memory in transparent huge pages, over the pool's
        size (Linux ``/proc/self/smaps_rollup``; an upper bound on the pool's own share; 0 for
        ``alloc``, whose pages the driver owns)."""
        if self.backing == "alloc":
            return 0.0
        try:
            text = Path("/proc/self/smaps_rollup").read_text()
        except OSError:
            return float("nan")
        kb = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("AnonHugePages:")), 0)
        return min(1.0, kb * 1024 / self.nbytes)

    def __del__(self) -> None:
        if getattr(self, "_registered", 0):
            try:
                import cupy as cp

                cp.cuda.runtime.hostUnregister(self._registered)
            except Exception:  # interpreter shutdown: the process exit unpins anyway
                pass
            self._registered = 0


class HotBuffer:
    """Device hot buffers, host pool and per-(layer, request) LRU state for one batch.

    Device rows: [layers, requests, B + 1, row_bytes] (slot B: the newest token). Host rows:
    [layers, requests, max_ctx, row_bytes] in a PinnedPool. ``initial``: "prefix" (colocated:
    the buffer starts with positions [0, B)) or "empty" (disaggregated decode). ``load_newest``:
    the kernel also copies the newest token's row into slot B each step (no miss counted).
    ``copy_order``: "flat" (the grid copies all requests' rows as one list once every request's
    bookkeeping is published), "request" (each request's rows as soon as its own bookkeeping
    is), "hybrid" (flat, but requests of a few rows copied by their owner at once) or "early"
    (the default, fastest on the H200: the copy starts before the bookkeeping ends, sources
    published once the misses are ranked, small requests loaded by their owner meanwhile); see
    swap_in.cu. flat, hybrid and early need requests + 1 <= device_buffer_size, else the
    request order is used. ``dup_check``: "bitmap"
    (one bit per position in shared memory; falls back to the hash table when max_ctx bits do
    not fit) or "hash". ``pdl``: launch with programmatic dependent launch, so that the kernel's
    set-up (shared-memory clears, this layer's table loads) overlaps the kernel before it in the
    stream; that kernel must not write this layer's tables (in a decode step it is the indexer;
    two launches on the same layer back to back are launched plainly; measured gain about 1 us,
    BENCHMARKS.md). ``unroll``, ``blocks_per_sm`` and ``max_regs`` select kernel builds
    (benchmarks).
    """

    def __init__(self, *, layers: int, requests: int, max_ctx: int, device_buffer_size: int,
                 top_k: int = 2048, row_bytes: int, initial: str = "prefix", load_newest: bool = True,
                 pool: PinnedPool | None = None, unroll: int = DEFAULT_UNROLL,
                 blocks_per_sm: int = DEFAULT_BLOCKS_PER_SM, copy_order: str = "early",
                 dup_check: str = "bitmap", pdl: bool = False, max_regs: int = 0) -> None:
        import cupy as cp

        self.geometry = g = make_geometry(layers=layers, requests=requests, max_ctx=max_ctx,
                                          device_buffer_size=device_buffer_size, top_k=top_k,
                                          row_bytes=row_bytes)
        if initial not in INITIAL_MODES:
            raise ValueError(f"initial must be one of {INITIAL_MODES}, got {initial!r}")
        if copy_order not in COPY_ORDERS:
            raise ValueError(f"copy_order must be one of {COPY_ORDERS}, got {copy_order!r}")
        if dup_check not in DUP_CHECKS:
            raise ValueError(f"dup_check must be one of {DUP_CHECKS}, got {dup_check!r}")
        self.dup_words = g.dup_bitmap_words if dup_check == "bitmap" else 0
        self.dup_check = "bitmap" if self.dup_words else "hash"
        self.pdl = bool(pdl)
        self.launch_mode = "plain"  # how the last launch went: plain, pdl+cooperative or pdl
        # PDL launches are not cooperative: measured on the H200 (BENCHMARKS.md), the pair ran
        # slower than either (bs 100: 52 us against 17; 20% misses 737 against 609 us)
        self._pdl_cooperative = False
        self._last_layer = -1
        self.initial, self.load_newest = initial, bool(load_newest)
        # flat / hybrid / early keep the request counts in the bookkeeping's B-slot arrays: R + 1 <= B
        self.copy_order = copy_order if g.requests + 1 <= g.buffer else "request"
        self.pool = pool if pool is not None else PinnedPool(g.host_bytes)
        if self.pool.nbytes < g.host_bytes:
            raise ValueError(f"pool of {self.pool.nbytes} B is smaller than the {g.host_bytes} B needed")
        L, R, C, B = g.layers, g.requests, g.max_ctx, g.buffer
        self._host = self.pool.array[: g.host_bytes].reshape(L, R, C, g.row_bytes)
        self._dev = cp.empty((L, R * (B + 1), g.row_bytes), cp.uint8)
        self._slot_pos = cp.empty((L, R, B), cp.int32)
        self._order = cp.zeros((L, R, B), cp.int32)
        self._pos_slot = cp.empty((L, R, C), cp.int32)
        self._meta = cp.empty((L, R, 4), cp.int32)
        self._errors = cp.zeros((R, 2), cp.int32)
        self._copy_list = cp.zeros((g.copy_capacity, 2), cp.int32)
        # per request: (launch epoch << 32) | copies queued; then the early order's source words
        self._ready = cp.zeros(2 * R, cp.uint64)
        self._epoch = 0
        self.unroll, self.blocks_per_sm = int(unroll), int(blocks_per_sm)
        self._kern, n_sms, _ = _kernel(cp.cuda.Device().id, self.unroll, self.blocks_per_sm, None, int(max_regs))
        self.max_grid = _grid_size(self._kern, n_sms, smem_bytes(g.buffer, g.top_k, self.dup_words))
        self.reset()

    # ---- views -----------------------------------------------------------------------------
    def host_rows(self, layer: int) -> np.ndarray:
        """[R, max_ctx, row_bytes] uint8 numpy view of the pinned pool: write KV rows here."""
        return self._host[self._layer(layer)]

    def device_rows(self, layer: int) -> Any:
        """[R * (B + 1), row_bytes] uint8 cupy view: row r * (B + 1) + slot (attention's kv)."""
        return self._dev[self._layer(layer)]

    def state(self, layer: int) -> HotBufferState:
        """Copy one layer's bookkeeping to the host."""
        lyr = self._layer(layer)
        meta = self._meta[lyr].get()
        order = self._order[lyr].get()
        orders = [order[r, : meta[r, 0]].copy() for r in range(self.geometry.requests)]
        return HotBufferState(self._slot_pos[lyr].get(), orders, meta[:, 0], meta[:, 1], meta[:, 2], meta[:, 3])

    # ---- state changes ----------------------------------------------------------------------
    def reset(self, layers: Any = None) -> None:
        """Fresh requests: nothing loaded; the first long step starts from ``initial``."""
        sel = self._layers(layers)
        self._last_layer = -2  # the tables were just written by other kernels: next launch plain
        self._slot_pos[sel] = -1
        self._pos_slot[sel] = -1
        self._meta[sel] = 0

    def prefill(self, layers: Any = None) -> None:
        """Colocated prefill: slots [0, B) hold positions [0, B), copied in bulk (cudaMemcpy2D)."""
        import cupy as cp

        g = self.geometry
        if g.max_ctx < g.buffer:
            raise ValueError(f"prefill needs max_ctx >= device_buffer_size ({g.max_ctx} < {g.buffer})")
        B = g.buffer
        self._last_layer = -2  # the tables were just written by other kernels: next launch plain
        for lyr in range(g.layers) if layers is None else [self._layer(layers)]:
            ramp = cp.arange(B, dtype=cp.int32)
            self._slot_pos[lyr] = ramp
            self._order[lyr] = ramp
            self._pos_slot[lyr] = -1
            self._pos_slot[lyr, :, :B] = ramp
            self._meta[lyr] = cp.asarray([B, 1, 0, B], cp.int32)
            cp.cuda.runtime.memcpy2DAsync(
                self._dev[lyr].data.ptr, (B + 1) * g.row_bytes, self.pool.device_ptr + lyr * g.layer_host_bytes,
                g.max_ctx * g.row_bytes, B * g.row_bytes, g.requests, _MEMCPY_H2D,
                cp.cuda.get_current_stream().ptr)

    def grid(self, width: int) -> int:
        """Blocks per launch: one per request at least, and enough to copy k misses per request
        with UNROLL chunks per thread, up to what can be resident at once (a cooperative launch).
        Small batches get small grids (a cheaper launch); blocks past R help copy request b % R."""
        g = self.geometry
        want = -(-g.requests * width * (g.row_bytes // 16) // (THREADS * self.unroll))
        return max(1, min(self.max_grid, max(g.requests, want)))

    def swap_in(self, layer: int, indices: Any, ctx_len: Any, *, global_rows: bool = False,
                check: bool = True, slots_out: Any = None, misses_out: Any = None,
                copy: bool = True) -> SwapInResult:
        """One decode step of one layer for every request (one cooperative launch).

        indices [R, w] (int32 on the GPU, or any int numpy array), ctx_len [R] (int64 on the GPU).
        check=True synchronises and raises SwapInError naming each bad request (those keep their
        state; the others are processed). check=False leaves that to ``raise_errors()``.
        copy=False does the bookkeeping only and loads no rows (for timing breakdowns); the
        buffer then disagrees with its tables until ``prefill()`` or ``reset()``.
        """
        import cupy as cp

        g = self.geometry
        lyr = self._layer(layer)
        validate_step(g, indices, ctx_len)
        idx = cp.ascontiguousarray(cp.asarray(indices, dtype=cp.int32))
        ctx = cp.ascontiguousarray(cp.asarray(ctx_len, dtype=cp.int64))
        width = int(idx.shape[1])
        slots = _output(slots_out, (g.requests, width), cp.int32, "slots_out")
        misses = _output(misses_out, (g.requests,), cp.int32, "misses_out")
        host_ptr = self.pool.device_ptr + lyr * g.layer_host_bytes
        self._epoch = self._epoch % 0xFFFFFFFF + 1  # never 0, the words' initial epoch
        args = (idx, ctx, self._slot_pos[lyr], self._order[lyr], self._pos_slot[lyr], self._meta[lyr],
                slots, misses, self._errors, self._copy_list, self._ready, np.uint64(host_ptr),
                self._dev[lyr], np.int32(g.requests), np.int32(width), np.int32(g.buffer),
                np.int64(g.max_ctx), np.int32(g.row_bytes), np.int32(self.initial == "prefix"),
                np.int32(self.load_newest), np.int32(bool(global_rows)), np.int32(g.copy_segment),
                np.uint32(self._epoch), np.int32(bool(copy)), np.int32(_COPY_ORDER_ARG[self.copy_order]),
                np.int32(self.dup_words))
        shared = smem_bytes(g.buffer, width, self.dup_words)
        if self.pdl and self._last_layer not in (lyr, -2):
            self._launch_pdl(args, shared)
        else:
            self.launch_mode = "plain"
            self._kern((self.grid(width),), (THREADS,), args, shared_mem=shared)
        self._last_layer = lyr
        if check:
            self.raise_errors(idx, ctx)
        return SwapInResult(slots, misses)

    def _launch_pdl(self, args: tuple, shared: int) -> None:
        """Programmatic dependent launch, not cooperative (``_pdl_cooperative`` asks for both,
        benchmarks only). The grid never exceeds what can be resident at once, so every block
        becomes resident once the kernels before it leave the SMs; a block waiting on another
        cannot keep that one out."""
        import cupy as cp

        from ._launch import launch_ex

        stream = cp.cuda.get_current_stream().ptr
        grid = self.grid(int(args[0].shape[1]))
        if self._pdl_cooperative:
            try:
                launch_ex(self._kern.kernel.ptr, grid, THREADS, shared, stream, args, cooperative=True,
                          programmatic=True)
                self.launch_mode = "pdl+cooperative"
                return
            except RuntimeError:
                self._pdl_cooperative = False
        launch_ex(self._kern.kernel.ptr, grid, THREADS, shared, stream, args, cooperative=False, programmatic=True)
        self.launch_mode = "pdl"

    def raise_errors(self, indices: Any, ctx_len: Any) -> None:
        """Raise SwapInError if the last launch (on these inputs) found bad requests."""
        errors = self._errors.get()
        if errors[:, 0].any():
            msgs = decode_errors(self.geometry, errors, _to_host(indices), _to_host(ctx_len))
            raise SwapInError("; ".join(msgs))

    # ---- helpers ----------------------------------------------------------------------------
    def _layer(self, layer: int) -> int:
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.geometry.layers:
            raise ValueError(f"layer must be in [0, {self.geometry.layers}), got {layer!r}")
        return int(layer)

    def _layers(self, layers: Any) -> slice | int:
        return slice(None) if layers is None else self._layer(layers)


def _to_host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _output(a: Any, shape: tuple[int, ...], dtype: Any, name: str) -> Any:
    """Allocate an output, or check a caller-provided one (e.g. a slice of a [steps, ...] array)."""
    import cupy as cp

    if a is None:
        return cp.empty(shape, dtype)
    if not isinstance(a, cp.ndarray) or a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"{name} must be a C-contiguous cupy array of shape {shape} and dtype {np.dtype(dtype).name}")
    return a

"""The GPU replay backend (``hisparse replay --backend gpu``): whole traces in one kernel launch.

Batched ``lru`` and ``salru`` (one commit per step) run in ``cupy_kernels.sharded_lru.replay``:
one thread block per (stream, config), every config of a batch of streams in one launch, the
step loop inside the block. It is the engine's answer bit for bit (tests/test_sharded_lru_gpu.py
compares misses per step, final slots and order with ``engine.replay_policy``; the kernel's
algorithm is checked on the CPU in tests/test_sharded_lru_reference.py). Other policies and
semantics stay on the CPU: asking the GPU for them is an error, not a silent fallback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import HisparseError
from .config import ReplayConfig
from .policies import Policy

BACKENDS = ("cpu", "gpu")
STREAMS_PER_LAUNCH = 512  # bounds the position tables (streams x configs x largest context x 4 B)


def supports(cfg: ReplayConfig) -> bool:
    """Batched LRU or sharded LRU with one step per commit."""
    return cfg.batched and cfg.mtp_steps == 1 and cfg.policy in (Policy.LRU, Policy.SALRU)


def check(configs: Sequence[ReplayConfig]) -> None:
    """A clear error when the GPU cannot replay what was asked (exit status 2 in the CLI)."""
    bad = [c for c in configs if not supports(c)]
    if bad:
        c = bad[0]
        raise HisparseError(f"--backend gpu replays batched lru and salru (--mtp-steps 1) only; got policy "
                            f"{c.policy}, {c.semantics} semantics, --mtp-steps {c.mtp_steps}")
    try:
        import cupy

        import cupy_kernels.sharded_lru  # noqa: F401 - the kernels ship beside the package (repository checkout)

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as exc:  # ImportError, CUDA errors: no usable GPU here
        raise HisparseError(f"--backend gpu needs CuPy, the cupy_kernels package and an NVIDIA GPU (sm_90): "
                            f"{type(exc).__name__}: {exc}") from None


def shard_config(cfg: ReplayConfig) -> Any:
    from cupy_kernels.sharded_lru import ShardConfig

    ways = cfg.buffer if cfg.policy is Policy.LRU else cfg.ways
    return ShardConfig(cfg.buffer, ways, cfg.prefix, cfg.reserve_newest)


def replay_streams(streams: Iterable[Any], configs: Sequence[ReplayConfig], add: Any,
                   per_launch: int = STREAMS_PER_LAUNCH) -> float:
    """Replay every stream under every config, ``per_launch`` streams a launch; ``add(stream,
    cfg, misses)`` receives each result. Returns the kernels' total time in seconds."""
    from cupy_kernels.sharded_lru import replay

    shard = [shard_config(c) for c in configs]
    seconds = 0.0
    batch: list = []

    def flush() -> None:
        nonlocal seconds
        try:
            run = replay([(s.indices, s.ctx_len) for s in batch], shard)
        except ValueError as exc:
            raise HisparseError(f"--backend gpu: {exc}") from None
        seconds += run.seconds
        for c, cfg in enumerate(configs):
            for i, s in enumerate(batch):
                add(s, cfg, run.misses[c][i])
        batch.clear()

    for s in streams:
        batch.append(s)
        if len(batch) >= per_launch:
            flush()
    if batch:
        flush()
    return seconds

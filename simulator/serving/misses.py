"""Per-step misses for the serving model, from replaying traces with the replay engine.

How traces map onto simulated requests:
- Each trace request gives one *miss profile*: at every decode step, the misses of its layers
  (mean over the layers the trace recorded) as a share of the trace's k. Simulated request i
  uses profile i mod (number of trace requests); every model layer takes that mean.
- A trace with another k (e.g. a small real model's k = 256) is replayed with the buffer scaled
  by the same ratio (buffer_trace = device_buffer_size x k_trace / top_k): what matters is the
  buffer-to-k ratio, and the share of k that misses is applied to the model's top_k.
- Outputs longer than the trace reuse its second half cyclically (the first half holds the
  warm-up after prefill, which happens once per request).
Replays are cached on disk (key: the trace's bytes, policy, buffer and step rules), so a sweep
replays each configuration once.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import HisparseError

DEFAULT_TRACE = "traces/synthetic-dsa-like.hst"
# The bundled default trace is exactly this generator output; used when the file is absent.
DEFAULT_TRACE_ARGS = dict(steps=512, layers=4, requests=2, k=2048, ctx0=32768, seed=0)


@dataclass(frozen=True)
class MissProfiles:
    """Miss share of k at every step, one array per trace request."""

    shares: tuple[np.ndarray, ...]
    source: str

    def share(self, profile: int, step: int) -> float:
        f = self.shares[profile % len(self.shares)]
        n = len(f)
        if step < n:
            return float(f[step])
        half = n // 2
        return float(f[half + (step - half) % (n - half)])

    def shares_from(self, profile: int, first: int, n: int) -> np.ndarray:
        """share(profile, first + i) for i in range(n), vectorised."""
        f = self.shares[profile % len(self.shares)]
        size = len(f)
        idx = np.arange(first, first + n)
        half = size // 2
        idx = np.where(idx < size, idx, half + (idx - half) % (size - half))
        return f[idx]

    def mean_share(self) -> float:
        return float(np.mean([f.mean() for f in self.shares]))


def cache_dir() -> Path:
    return Path(os.environ.get("HISPARSE_CACHE", Path.home() / ".cache" / "hisparse-sim"))


def _default_trace_path() -> Path | None:
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (base / DEFAULT_TRACE).exists():
            return base / DEFAULT_TRACE
    return None


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:20]


def _trace_source(trace: str | None):
    """(a callable giving the trace source or a fresh stream iterator, k, label, content digest) for a trace path, or
    for the bundled default (generated when its file is absent)."""
    from ..trace import open_trace

    path = Path(trace) if trace is not None else _default_trace_path()
    if path is None:
        from ..trace.generator import PRESETS, generate

        args = DEFAULT_TRACE_ARGS
        digest = "generated-dsa-like-" + hashlib.sha256(repr(sorted(args.items())).encode()).hexdigest()[:12]
        return (lambda: generate(PRESETS["dsa-like"], **args)), args["k"], "generated dsa-like", digest
    src = open_trace(path)
    return (lambda: src), src.meta.k, str(path), _file_digest(path)


def miss_profiles(trace: str | None, *, top_k: int, buffer: int, policy: str = "lru", initial: str = "prefix",
                  use_cache: bool = True) -> MissProfiles:
    """Replay ``trace`` (default: the bundled DSA-like trace) and return per-request miss shares."""
    from ..replay import ReplayConfig, replay
    from ..replay.compiled_cache import engine_digest

    streams, k_trace, label, digest = _trace_source(trace)
    scaled = max(1, round(buffer * k_trace / top_k))
    if scaled < k_trace:
        raise HisparseError(f"buffer {buffer} scaled to the trace's k ({k_trace}) is {scaled} < k")
    key = f"{digest}-{policy}-{scaled}-{initial}-engine{engine_digest()[:12]}"
    cached = cache_dir() / f"misses-{key}.npz"
    if use_cache and cached.exists():
        data = np.load(cached)
        return MissProfiles(tuple(data[name] for name in sorted(data.files, key=lambda n: int(n[1:]))), label)
    cfg = ReplayConfig(policy=policy, buffer=scaled, initial=initial)
    by_request: dict[int, list[np.ndarray]] = {}
    for m in replay(streams(), cfg, k=k_trace, per_step=True).streams:
        by_request.setdefault(m.request, []).append(m.misses / k_trace)
    if not by_request:
        raise HisparseError(f"{label}: the trace holds no streams")
    shares = tuple(np.mean([a[: min(map(len, v))] for a in v], axis=0) for _, v in sorted(by_request.items()))
    if use_cache:
        from ..trace.fileio import atomic_output

        with atomic_output(cached) as fh:
            np.savez(fh, **{f"r{i}": a for i, a in enumerate(shares)})
    return MissProfiles(shares, label)

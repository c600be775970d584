"""Per-step misses for the serving model, from replaying traces with the replay engine.

How traces map onto simulated requests (each mapping the plan output states, ``MissProfiles.notes``):
- Each trace request gives one *miss profile*: at every decode step, the misses of its layers
  (mean over the layers the trace recorded) as a share of the trace's k. Simulated request i
  uses profile i mod (number of trace requests); every model layer takes that mean.
- A trace with another k (e.g. a small real model's k = 256) is replayed with the buffer scaled
  by the same ratio (buffer_trace = device_buffer_size x k_trace / top_k): what matters is the
  buffer-to-k ratio, and the share of k that misses is applied to the model's top_k.
- Outputs longer than the trace reuse its second half cyclically (the first half holds the
  warm-up after prefill, which happens once per request).
- The trace's context length is kept as recorded: a shorter context than the workload's changes the
  miss profile only through the positions the trace selects.
Replays are cached on disk (key: the trace's bytes, policy, buffer and step rules), so a sweep
replays each configuration once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bundled import data_path
from ..errors import HisparseError
from .defaults import DEFAULT_TRACE


@dataclass(frozen=True)
class MissProfiles:
    """Miss share of k at every step, one array per trace request, and how the trace was mapped."""

    shares: tuple[np.ndarray, ...]
    source: str
    notes: tuple[str, ...] = ()
    trace_k: int = 0
    trace_buffer: int = 0
    context_tokens: int = 0  # the trace's context at its first step (mean over requests)
    # per profile, its shares unrolled over the cyclic mapping (``_unrolled``): the serving model
    # reads a slice of it every decode block instead of recomputing the index map
    _unrolled_cache: dict = field(default_factory=dict, compare=False, repr=False)

    def share(self, profile: int, step: int) -> float:
        f = self.shares[profile % len(self.shares)]
        size = len(f)
        if 0 <= step < size:
            return float(f[step])
        return float(self.shares_from(profile, step, 1)[0])

    @staticmethod
    def _cyclic(f: np.ndarray, first: int, n: int) -> np.ndarray:
        size = len(f)
        idx = np.arange(first, first + n)
        half = size // 2
        idx = np.where(idx < size, idx, half + (idx - half) % max(size - half, 1))
        return f[idx]

    def _unrolled(self, profile: int, length: int) -> np.ndarray:
        """The profile's shares at steps 0 .. >= length - 1 (grown by doubling, cached)."""
        key = profile % len(self.shares)
        u = self._unrolled_cache.get(key)
        if u is None or len(u) < length:
            u = self._cyclic(self.shares[key], 0, max(length, 2 * (len(u) if u is not None else 0), 1024))
            self._unrolled_cache[key] = u
        return u

    def shares_from(self, profile: int, first: int, n: int) -> np.ndarray:
        """share(profile, first + i) for i in range(n), vectorised (a fresh array)."""
        if first < 0:
            return self._cyclic(self.shares[profile % len(self.shares)], first, n)
        return self._unrolled(profile, first + n)[first:first + n].copy()

    @property
    def steps(self) -> int:
        return min(len(f) for f in self.shares)

    def mean_share(self, first: int = 0) -> float:
        """Mean miss share over the trace's steps from ``first`` on (0: all, the cold start included)."""
        return float(np.mean([f[first:].mean() for f in self.shares]))

    def steady_from(self) -> int:
        """The first steady-state step: the warm-up ``hisparse trace compare`` leaves out (``Shape.warmup``),
        kept to at least two steps of a short trace."""
        from ..analysis import STEADY_WARMUP_STEPS  # targets.Shape.warmup, without numba's import

        return max(0, min(STEADY_WARMUP_STEPS, self.steps - 2))

    def mapping_notes(self, *, top_k: int, buffer: int, output_tokens: int, input_tokens: int) -> list[str]:
        """How this trace stands in for the workload (the plan prints these)."""
        notes = list(self.notes)
        if self.trace_k and self.trace_k != top_k:
            notes.append(f"trace k {self.trace_k} differs from the model's top_k {top_k}: replayed with buffer "
                         f"{self.trace_buffer} (the same buffer/k ratio {buffer / top_k:g}); misses applied as a share of k")
        if self.steps < output_tokens - 1:
            notes.append(f"trace has {self.steps} decode steps for {output_tokens - 1} per request: steps beyond it "
                         "reuse the trace's second half cyclically")
        if self.context_tokens and self.context_tokens < 0.5 * input_tokens:
            notes.append(f"trace context starts at {self.context_tokens} tokens, the workload's at {input_tokens}: "
                         "its selections are kept as recorded")
        return notes


def cache_dir() -> Path:
    """``HISPARSE_CACHE`` (unset or empty: ~/.cache/hisparse-sim): a folder, or one to create. A
    file there (``HISPARSE_CACHE=/dev/null``) failed at the first write naming a cache file, not
    the variable."""
    raw = os.environ.get("HISPARSE_CACHE", "")
    path = Path(raw) if raw else Path.home() / ".cache" / "hisparse-sim"
    if raw and (path.exists() or path.is_symlink()) and not path.is_dir():
        raise HisparseError(f"HISPARSE_CACHE={raw}: is a file, not a folder (the cache of replayed misses and "
                            "generated traces); give a folder, or unset it for ~/.cache/hisparse-sim")
    if raw and not path.is_dir():  # one that cannot be made failed at the first write, naming a cache file
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from ..fileio import why_os

            raise HisparseError(f"HISPARSE_CACHE={raw}: cannot make the folder ({why_os(exc)}); give a writable "
                                "folder, or unset it for ~/.cache/hisparse-sim") from None
    return path


def _default_trace_path() -> Path | None:
    """The bundled default trace in this checkout (never the current directory)."""
    path = data_path(DEFAULT_TRACE.file)
    return path if path.is_file() else None


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

        d = DEFAULT_TRACE
        args = dict(steps=d.steps, layers=d.layers, requests=d.requests, k=d.k, ctx0=d.ctx0, seed=d.seed)
        digest = f"generated-{d.generator_preset}-" + hashlib.sha256(repr(sorted(args.items())).encode()).hexdigest()[:12]
        return (lambda: generate(PRESETS[d.generator_preset], **args)), d.k, f"generated {d.generator_preset}", digest
    if not path.is_file():
        raise HisparseError(f"{path}: no such trace file")
    src = open_trace(path)
    return (lambda: src), src.meta.k, str(path), _file_digest(path)


def trace_accesses(trace: str | None) -> int:
    """Accesses one replay of ``trace`` reads (its index; the bundled default's shape where its file is
    absent), for the plan's work budget; 0 where the file is missing (the replay reports that)."""
    from ..trace import open_trace

    path = Path(trace) if trace is not None else _default_trace_path()
    if path is None:
        d = DEFAULT_TRACE
        return d.requests * d.layers * d.steps * d.k
    try:
        st = path.stat()
    except OSError:
        return 0
    if not stat.S_ISREG(st.st_mode):  # what is_file() would stat again
        return 0
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)  # a sweep asks once per point: ~0.75 ms each
    if key not in _ACCESSES:
        try:
            _ACCESSES[key] = int(open_trace(path).accesses)
        except (HisparseError, OSError):  # a trace that does not open is the replay's error, reported there
            return 0
    return _ACCESSES[key]


_ACCESSES: dict[tuple[str, int, int], int] = {}  # trace_accesses by (file, size, mtime)


def _first_context(streams) -> int:
    """Context tokens at the first step of the trace's first stream (reads that stream only)."""
    for s in streams():
        return int(s.ctx_len[0]) if s.steps else 0
    return 0


# the commit policy of SGLang's multi-step (speculative) swap kernel, PR #32162
MTP_POLICY = "sglang-clock"


def speculative_policy(policy: str) -> tuple[str, str]:
    """(the policy a speculative replay runs, a note): a policy that commits several steps at once
    (a placed one: sglang-clock, salru) as given, else SGLang's multi-step CLOCK (the single-step
    LRU has no multi-step path in SGLang: PR #32162 added the CLOCK commit for MTP)."""
    from ..replay.config import ReplayConfig

    try:
        placed = ReplayConfig(policy=policy, buffer=4096).placed
    except HisparseError:
        placed = False
    if placed:
        return policy, ""
    return MTP_POLICY, (f"speculative decoding: the hot buffer runs SGLang's multi-step swap commit ({MTP_POLICY}, "
                        f"PR #32162) instead of policy {policy!r}, which has no multi-step commit")


def miss_profiles(trace: str | None, *, top_k: int, buffer: int, policy: str = "lru", initial: str = "prefix",
                  use_cache: bool = True, mtp_steps: int = 1,
                  anchor_of: tuple[int, ...] | None = None) -> MissProfiles:
    """Replay ``trace`` (default: ``DEFAULT_TRACE``) and return per-request miss shares.

    ``mtp_steps`` > 1 (speculative decoding: the verify positions of one step): that many
    consecutive trace steps are one swap commit (their union, deduped; a placed policy), each
    unique miss counted at its first step.
    ``anchor_of`` (an IndexShare model's ``ModelSpec.anchor_of``): a shared layer swaps its anchor's
    top-k into its own buffer and misses what the anchor misses, so with a trace of as many layers
    each layer's share is its anchor's stream's (the trace's own shared-layer streams are not used)."""
    from ..replay import ReplayConfig, replay
    from ..replay.compiled_cache import engine_digest

    streams, k_trace, label, digest = _trace_source(trace)
    scaled = max(1, round(buffer * k_trace / top_k))
    if scaled < k_trace:
        raise HisparseError(f"buffer {buffer} scaled to the trace's k ({k_trace}) is {scaled} < k")
    share_map = tuple(anchor_of) if anchor_of and any(a != i for i, a in enumerate(anchor_of)) else None
    tag = "" if share_map is None else "-share" + hashlib.sha256(repr(share_map).encode()).hexdigest()[:10]
    key = f"{digest}-{policy}-{scaled}-{initial}{tag}-engine{engine_digest()[:12]}"
    if mtp_steps > 1:
        key += f"-mtp{mtp_steps}"
    cached = cache_dir() / f"misses-{key}.npz"
    if use_cache and cached.exists():
        found = _read_cached(cached, label, k_trace, scaled)
        if found is not None:
            return found
    cfg = ReplayConfig(policy=policy, buffer=scaled, initial=initial, mtp_steps=mtp_steps)
    by_request: dict[int, dict[int, np.ndarray]] = {}
    for m in replay(streams(), cfg, k=k_trace, per_step=True).streams:
        by_request.setdefault(m.request, {})[m.layer] = m.misses / k_trace
    if not by_request:
        raise HisparseError(f"{label}: the trace holds no streams")
    notes: tuple[str, ...] = ()
    if share_map is not None:
        layers = {len(v) for v in by_request.values()}
        if layers == {len(share_map)} and all(set(v) == set(range(len(share_map))) for v in by_request.values()):
            by_request = {r: {i: v[share_map[i]] for i in v} for r, v in by_request.items()}
            notes = (f"IndexShare: each of the {sum(a != i for i, a in enumerate(share_map))} shared layers takes its "
                     "anchor's misses (its own buffer, the anchor's top-k); the trace's streams of those layers are unused",)
        else:
            notes = (f"IndexShare: the trace's {sorted(layers)} layers are not the model's {len(share_map)}: "
                     "every trace layer kept as its own stream",)
    shares = tuple(np.mean([a[: min(len(x) for x in v.values())] for a in v.values()], axis=0)
                   for _, v in sorted(by_request.items()))
    if any(len(a) == 0 for a in shares):
        raise HisparseError(f"{label}: a trace request has no decode steps")
    ctx = _first_context(streams)
    if use_cache:
        _keep(cached, ctx, notes, shares)
    return MissProfiles(shares, label, notes, k_trace, scaled, ctx)


def _keep(cached: Path, ctx: int, notes: tuple[str, ...], shares: tuple[np.ndarray, ...]) -> None:
    """Write a replay into the cache; a cache that cannot take it (read-only, full) costs only the
    replay next time, so it is a note, not the plan's failure (it was: after the replay's work, naming
    the cache file but not HISPARSE_CACHE)."""
    from ..fileio import atomic_output

    try:
        with atomic_output(cached) as fh:
            np.savez(fh, ctx0=np.int64(ctx), notes=np.array(notes, dtype=str),
                     **{f"r{i}": a for i, a in enumerate(shares)})
    except (HisparseError, OSError) as exc:
        print(f"note: the replay is not cached ({exc}); give HISPARSE_CACHE a writable folder to keep replays",
              file=sys.stderr)


def _read_cached(cached: Path, label: str, k_trace: int, scaled: int) -> MissProfiles | None:
    """A cached replay, or None when the file cannot be read as one (truncated by a full disk, written
    by something else, damaged): the caller replays again and replaces it. A damaged cache file gave
    a zipfile / pickle traceback on every later plan until removed by hand."""
    import sys
    import zipfile

    try:
        with np.load(cached, allow_pickle=False) as data:
            names = sorted((n for n in data.files if n.startswith("r")), key=lambda n: int(n[1:]))
            shares = tuple(np.asarray(data[n], dtype=np.float64) for n in names)
            ctx = int(data["ctx0"]) if "ctx0" in data.files else 0
            notes = tuple(str(n) for n in data["notes"]) if "notes" in data.files else ()
        if not shares or any(a.ndim != 1 or not a.size or not np.all((a >= 0) & (a <= 1)) for a in shares):
            raise ValueError("miss shares missing or outside [0, 1]")
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        print(f"note: cached replay {cached} unreadable ({type(exc).__name__}: {exc}); replaying again",
              file=sys.stderr)
        return None
    return MissProfiles(shares, label, notes, k_trace, scaled, ctx)


def scenario_profiles(sc, hs, initial: str) -> MissProfiles:
    """The miss profiles a scenario's HiSparse system runs on: single-step replay of its policy, or
    under speculative decoding the multi-step commit over the verify positions."""
    spec = getattr(sc, "speculative", None)
    if spec is None:
        return miss_profiles(sc.trace, top_k=hs.top_k, buffer=hs.device_buffer_size, policy=hs.policy, initial=initial,
                             anchor_of=sc.model.anchor_of)
    policy, note = speculative_policy(hs.policy)
    p = miss_profiles(sc.trace, top_k=hs.top_k, buffer=hs.device_buffer_size, policy=policy, initial=initial,
                      mtp_steps=spec.verify_tokens, anchor_of=sc.model.anchor_of)
    how = (f"speculative decoding ({spec.label}): {spec.verify_tokens} consecutive trace steps replayed as one swap "
           f"commit ({policy}: the union of the verify positions' top-k, deduped), each unique miss charged at its "
           "first step; a step keeping a tokens is charged the a trace steps it moves over (SGLang's HiSparse + "
           "speculative serving path: PR #37771, open when read; the kernel, PR #32162, is merged)")
    return dataclasses.replace(p, notes=p.notes + tuple(n for n in (note, how) if n))

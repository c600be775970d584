"""Which trace ``hisparse plan`` replays for the question asked: the model's fitted generator preset
at the workload's context, not one bundled trace for every model and prompt length.

The rule, printed by the plan (``TraceChoice.how``):
- ``--trace FILE`` is replayed as given (the plan notes where its context or steps differ).
- Otherwise the model file's ``trace_preset`` (``glm51-longbench`` for GLM-5.x, ``dsv32`` for
  DeepSeek-V3.2; a model with none takes ``DEFAULT_TRACE``'s preset, and the plan says so) is
  generated with the model's layer count and top_k, one request whose prompt is the workload's
  ``input_tokens`` (the context at its first decode step), ``min(output_tokens - 1, TRACE_STEPS)``
  decode steps, seed 0. Steps past them take the trace's steady second half cyclically
  (``MissProfiles.shares_from``): 128 steps hold the warm-up (16 steps, ``trace compare``'s) and a
  steady state, and generating all 8,191 steps of an 8K output would take about an hour here. The
  context grows by the output over a request (32K -> 40K); that growth is not followed (measured
  on glm51-longbench, LRU steady misses at B = 4096 are 12.9% at a 32K prompt and 13.5% at 100K).
- The generated trace is written once to ``traces/generated/`` in the checkout when it is bundled
  there (the default scenario's is), else to the cache (``misses.cache_dir()/traces``), named by
  its arguments and the preset's knobs digest, so a changed preset makes a new file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..bundled import data_path
from ..errors import HisparseError
from .defaults import DEFAULT_TRACE
from .misses import cache_dir

TRACE_STEPS = 128  # decode steps generated per request (the bundled default trace's length)
GENERATED_DIR = "traces/generated"  # bundled generated traces (repository-relative)


@dataclass(frozen=True)
class TraceChoice:
    trace: str | None  # the file the replay reads (None: misses' bundled default)
    how: str  # what was done, one line for the plan
    preset: str = ""
    generated: bool = False  # written by this call (not found bundled or cached)
    args: tuple = ()  # (layers, k, ctx0, steps, requests, seed) of a generated trace


def trace_name(preset: str, *, layers: int, k: int, ctx0: int, steps: int, requests: int = 1, seed: int = 0) -> str:
    """The file name of a generated trace: its arguments and the knobs' digest."""
    from ..trace.generator import PRESETS, knobs_dict

    knobs, _ = PRESETS[preset].for_k(k)
    digest = hashlib.sha256(json.dumps(knobs_dict(knobs), sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{preset}-L{layers}-k{k}-ctx{ctx0}-s{steps}-r{requests}-seed{seed}-{digest}.hst"


def generate_trace(path: Path, preset: str, *, layers: int, k: int, ctx0: int, steps: int, requests: int = 1,
                   seed: int = 0) -> None:
    """``hisparse trace gen --preset PRESET --layers .. --topk .. --ctx0 .. --steps .. --requests ..
    --seed ..``'s file, written atomically."""
    from ..trace import TraceWriter
    from ..trace.generator import PRESETS, generate, knobs_dict

    knobs, _ = PRESETS[preset].for_k(k)
    source = {"kind": "synthetic", "generator": "hisparse-sim", "preset": preset, "knobs": knobs_dict(knobs),
              "seed": seed}
    _writable_cache_folder(path.parent)
    from ..progress import counter

    tick = counter(layers * requests * steps, desc=f"drawing the {preset} trace", unit="step")
    streams = generate(knobs, steps=steps, layers=layers, requests=requests, k=k, ctx0=ctx0, seed=seed, on_steps=tick)
    with TraceWriter(str(path), k=k, source=source) as writer:
        for s in streams:
            writer.write_stream(s)


def _writable_cache_folder(folder: Path) -> None:
    """The folder a generated trace goes to, made and writable, checked before the draw: a read-only
    cache failed only after drawing the whole trace, naming a temp file rather than the cache."""
    import os

    from ..fileio import why_os

    try:
        folder.mkdir(parents=True, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
        why = "not writable"
    except OSError as exc:
        writable, why = False, why_os(exc)
    if not writable:
        raise HisparseError(f"{folder}: cannot keep the generated trace there ({why}): the cache of generated "
                            "traces (HISPARSE_CACHE, default ~/.cache/hisparse-sim); give HISPARSE_CACHE a writable "
                            "folder, or --trace FILE")


def _opens(path: Path) -> bool:
    """Whether a cached trace opens (header, metadata and chunk index whole); a damaged one (a full disk,
    a copy cut short) stopped every later plan of that scenario with the reader's error until removed by
    hand: it is drawn again in its place, with a note."""
    import sys

    from ..trace.format import TraceReader

    try:
        with TraceReader(path):
            return True
    except (HisparseError, OSError, ValueError) as exc:
        print(f"note: cached trace {path} unreadable ({exc}); drawing it again", file=sys.stderr)
        return False


def choose_trace(model, workload, given: str | None) -> TraceChoice:
    """The trace for ``model`` serving ``workload`` (module docstring), generated if need be."""
    if given is not None:
        return TraceChoice(given, f"trace {given} (given with --trace), replayed as recorded")
    from ..trace.generator import PRESETS

    preset = model.trace_preset or DEFAULT_TRACE.generator_preset
    why = (f"{model.name}'s fitted preset {preset}" if model.trace_preset else
           f"{preset} ({model.where} names no trace_preset: the default trace's preset)")
    if preset not in PRESETS:
        raise HisparseError(f"{model.where}: trace_preset = {preset!r}: no such generator preset "
                            f"(hisparse trace gen --help lists them)")
    steps = max(2, min(workload.output_tokens - 1, TRACE_STEPS))
    ctx0 = max(workload.input_tokens, model.top_k)
    args = dict(layers=model.layers, k=model.top_k, ctx0=ctx0, steps=steps, requests=1, seed=0)
    shape = (f"{args['layers']} layers, k {args['k']}, a {ctx0}-token prompt, {steps} decode steps, 1 request, "
             "seed 0")
    d = DEFAULT_TRACE
    if (preset, args["layers"], args["k"], ctx0, steps, 1, 0) == (d.generator_preset, d.layers, d.k, d.ctx0, d.steps,
                                                                  d.requests, d.seed):
        return TraceChoice(None, f"{why}: the bundled {d.file} ({shape})", preset, False, tuple(args.values()))
    name = trace_name(preset, **args)
    bundled = data_path(f"{GENERATED_DIR}/{name}")
    if bundled.is_file():
        return TraceChoice(str(bundled), f"{why} at the workload's context: {shape}; bundled "
                                         f"{GENERATED_DIR}/{name}", preset, False, tuple(args.values()))
    cached = cache_dir() / "traces" / name
    generated = not cached.is_file() or not _opens(cached)
    if generated:
        from .. import limits

        # the same budget as `hisparse trace gen`: a model of absurd depth is refused, not drawn
        limits.check(args["requests"] * args["layers"] * steps * args["k"], "HISPARSE_MAX_TRACE_ENTRIES",
                     f"{model.where}: the trace this plan would generate ({shape})", unit="top-k entries",
                     hint="check layers and top_k, or pass --trace FILE")
        generate_trace(cached, preset, **args)
    return TraceChoice(str(cached), f"{why} at the workload's context: {shape}; "
                                    f"{'generated into' if generated else 'cached in'} {cached}",
                       preset, generated, tuple(args.values()))

"""Record top-k traces from a real model: prefill a real text, decode greedily, write .hst files.

Step t feeds one token (step 0: the prompt's last token; then each greedy choice) and records,
for every recorded layer, the top-k positions of that newest query's head-averaged attention
probabilities over the ctx_len = prompt_tokens + t tokens in context (itself included).

Several k come from one run (the top-k sets are prefixes of one sorted order). Output files:
``out`` itself for one k; for several, ``out`` with ``-k{K}`` before its suffix (or ``{k}`` in
``out`` replaced by K).

Interruption: streams are written as they go (chunks of ``checkpoint_every`` steps) to
``<file>.partial``, and after each complete chunk the model state (KV cache, next token) goes
to ``<first file>.ckpt``. ``resume=True`` reloads the last checkpoint, keeps the steps the
partial files hold up to it, and carries on; the finished files are byte-identical to an
uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import HisparseError
from ..fileio import read_bytes

RECORDER_VERSION = 1


@dataclass(frozen=True)
class RecordSpec:
    model: str  # a name from weights.MODELS or a .gguf path
    texts: tuple[str, ...]
    prompt_tokens: int
    steps: int
    ks: tuple[int, ...]
    out: str
    prefill_chunk: int = 512
    checkpoint_every: int = 64


@dataclass
class RecordResult:
    paths: list[Path]
    prompt_tokens: int
    steps: int
    layers: tuple[int, ...]
    prefill_s: float = 0.0  # this run's share (a resumed run may skip the prefill)
    decode_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    generated: list[int] = field(default_factory=list)

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0


def output_paths(out: str, ks: tuple[int, ...]) -> list[Path]:
    """One file per k: ``out`` for a single k, else ``{k}`` filled in or ``-k{K}`` inserted."""
    if "{k}" in out:
        return [Path(out.replace("{k}", str(k))) for k in ks]
    if len(ks) == 1:
        return [Path(out)]
    p = Path(out)
    return [p.with_name(f"{p.stem}-k{k}{p.suffix or '.hst'}") for k in ks]


def _check(spec: RecordSpec) -> None:
    if not spec.texts:
        raise HisparseError("--text: give at least one text file")
    if not spec.ks or min(spec.ks) < 1 or len(set(spec.ks)) != len(spec.ks):
        raise HisparseError(f"--topk: distinct positive integers, got {','.join(map(str, spec.ks))}")
    for name, v in (("prompt-tokens", spec.prompt_tokens), ("steps", spec.steps),
                    ("prefill-chunk", spec.prefill_chunk), ("checkpoint-every", spec.checkpoint_every)):
        if v < 1:
            raise HisparseError(f"--{name} must be >= 1, got {v}")
    if spec.prompt_tokens < 2:
        raise HisparseError("--prompt-tokens must be >= 2")


def _read_texts(texts: tuple[str, ...]) -> tuple[str, list[dict]]:
    parts, info = [], []
    for t in texts:
        data = read_bytes(t, option="--text", special_ok=True)  # checked first; /dev/stdin by design
        parts.append(data.decode("utf-8", errors="replace"))
        info.append({"file": Path(t).name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return "\n\n".join(parts), info


def _prompt(tokenizer, text: str, cfg, n: int, texts: tuple[str, ...]) -> list[int]:
    from .tokenizer import encode

    ids = encode(tokenizer, text, bos=cfg.bos)
    if len(ids) < n:
        raise HisparseError(f"{','.join(texts)}: {len(ids)} tokens, fewer than --prompt-tokens {n}; "
                            "add more text files")
    return ids[:n]


def record(spec: RecordSpec, *, resume: bool = False, quiet: bool = False,
           on_step: Callable[[int], None] | None = None) -> RecordResult:
    """Run the recording ``spec`` describes; see the module docstring. ``on_step(t)`` runs
    after step t is written (tests use it to interrupt a run). The process-wide torch settings
    the recording needs (flush-to-zero, one thread) are put back when it ends: flush-to-zero left
    on would change every later float computation of the caller's process."""
    import torch

    threads = torch.get_num_threads()
    try:
        return _record(spec, resume=resume, quiet=quiet, on_step=on_step)
    finally:
        torch.set_flush_denormal(False)  # torch's default (it has no getter for the current state)
        torch.set_num_threads(threads)


def _record(spec: RecordSpec, *, resume: bool, quiet: bool, on_step: Callable[[int], None] | None) -> RecordResult:
    import torch

    from ..progress import progress
    from ..trace import TraceWriter, open_trace
    from .model import Model, topk_rows
    from .tokenizer import build_tokenizer
    from .weights import load_gguf, resolve_model

    _check(spec)
    paths = output_paths(spec.out, spec.ks)
    partials = [p.with_name(p.name + ".partial") for p in paths]
    ckpt = paths[0].with_name(paths[0].name + ".ckpt")
    if not resume and (ckpt.exists() or any(p.exists() for p in partials)):
        left = [str(p) for p in (ckpt, *partials) if p.exists()]
        raise HisparseError(f"{paths[0]}: an interrupted recording of it is there ({', '.join(left)}); "
                            "pass --resume to finish it, or delete those files")
    torch.set_flush_denormal(True)  # denormals slow the CPU 5x; set always, for equal results
    # One thread: the same bytes on any machine, and no collapse of OpenMP's spinning threads
    # when another process shares the cores (2 threads ran 10x slower than 1 here).
    torch.set_num_threads(1)
    g = load_gguf(resolve_model(spec.model))
    model = Model(g, spec.prompt_tokens + spec.steps)  # first: it names an unsupported or incomplete file
    try:
        tokenizer = build_tokenizer(g.meta)
    except HisparseError as exc:
        raise HisparseError(f"{g.path}: {exc}") from None
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # token lists of unequal length, an id past them
        raise HisparseError(f"{g.path}: its vocabulary metadata does not build a tokenizer ({exc})") from None
    text, text_info = _read_texts(spec.texts)
    cfg = model.cfg
    prompt = _prompt(tokenizer, text, cfg, spec.prompt_tokens, spec.texts)
    layers = cfg.global_layers
    source = {"kind": "recorded", "model": spec.model if not spec.model.endswith(".gguf") else Path(spec.model).name,
              "model_file": g.path.name, "model_sha256": g.sha256, "architecture": cfg.arch,
              "text": [t["file"] for t in text_info], "text_files": text_info,
              "prompt_tokens": spec.prompt_tokens, "steps": spec.steps, "layers": list(layers),
              "selection": "top-k of the newest query's head-averaged attention probabilities",
              "decode": "greedy"}
    extra = {"recorder_version": RECORDER_VERSION, "topks": list(spec.ks),
             "prefill_chunk": spec.prefill_chunk, "checkpoint_every": spec.checkpoint_every,
             "torch": torch.__version__.split("+")[0], "dtype": "float32", "flush_denormal": True,
             "threads": 1}
    fingerprint = hashlib.sha256(repr((asdict(spec) | {"out": None}, source, extra)).encode()).hexdigest()
    result = RecordResult(paths, spec.prompt_tokens, spec.steps, layers)

    start = 0
    state = None
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        if state["fingerprint"] != fingerprint:
            raise HisparseError(f"{ckpt}: checkpoint of a different recording (model, texts or options "
                                "differ); delete it to start again")
        start = int(state["step"])
    writers = []
    try:
        for k, partial in zip(spec.ks, partials, strict=True):
            kept = None
            if start and partial.exists():
                with warnings.catch_warnings():  # "recovered N chunks": expected here
                    warnings.simplefilter("ignore")
                    kept = open_trace(partial, recover=True)
            fresh = partial.with_name(partial.name + ".new")
            w = TraceWriter(fresh, k=k, source={**source, "topk": k}, extra=extra, atomic=False,
                            chunk_steps=spec.checkpoint_every)
            if start:
                _copy_prefix(w, kept, partial, layers, start, spec.checkpoint_every)
            os.replace(fresh, partial)  # the open writer goes on writing the renamed file
            writers.append(w)

        if state is None:
            t0 = time.perf_counter()
            body = prompt[:-1]
            chunks = range(0, len(body), spec.prefill_chunk)
            for s in progress(chunks, total=len(chunks), desc="prefill", unit="chunk", quiet=quiet):
                model.forward(body[s: s + spec.prefill_chunk])
            result.prefill_s = time.perf_counter() - t0
            result.prefill_tokens = len(body)
            next_token, generated = prompt[-1], []
            _save(ckpt, model, 0, next_token, generated, fingerprint)
        else:
            model.load_cache_state(state["cache"])
            next_token, generated = int(state["next_token"]), list(state["generated"])

        t0 = time.perf_counter()
        for t in progress(range(start, spec.steps), total=spec.steps - start, desc="decode",
                          unit="step", quiet=quiet):
            ctx_len = model.length + 1
            logits, probs = model.forward([next_token], record=layers, logits=True)
            for layer in layers:
                rows = topk_rows(probs[layer], spec.ks)
                for k, w in zip(spec.ks, writers, strict=True):
                    w.write(0, layer, t, ctx_len, rows[k])
            next_token = int(torch.argmax(logits))
            generated.append(next_token)
            if (t + 1) % spec.checkpoint_every == 0 and t + 1 < spec.steps:
                _save(ckpt, model, t + 1, next_token, generated, fingerprint)
            if on_step is not None:
                on_step(t)
        result.decode_s = time.perf_counter() - t0
        result.decode_tokens = spec.steps - start
    except BaseException:
        for w in writers:
            w.abort()  # non-atomic: complete chunks stay on disk for --resume
        raise
    for w, partial, path in zip(writers, partials, paths, strict=True):
        w.close()
        os.replace(partial, path)
    ckpt.unlink(missing_ok=True)
    result.generated = generated
    return result


def _save(ckpt: Path, model, step: int, next_token: int, generated: list[int], fingerprint: str) -> None:
    """Model state after ``step`` steps, written atomically."""
    import torch

    tmp = ckpt.with_name(ckpt.name + ".tmp")
    torch.save({"step": step, "next_token": next_token, "generated": list(generated),
                "cache": model.cache_state(), "fingerprint": fingerprint}, tmp)
    os.replace(tmp, ckpt)


def _copy_prefix(writer, kept, partial: Path, layers: tuple[int, ...], steps: int, chunk: int) -> None:
    """Re-write steps [0, steps) of an interrupted file in the order a straight run writes them
    (chunk by chunk, layer by layer), so the finished file is the same bytes."""
    from ..trace import Stream

    if kept is None:
        raise HisparseError(f"{partial}: missing, but the checkpoint is at step {steps}; "
                            "delete the .ckpt file to start again")
    streams = {}
    for layer in layers:
        try:
            s = kept.read((0, layer))
        except HisparseError:
            s = None
        if s is None or s.steps < steps:
            raise HisparseError(f"{partial}: layer {layer} holds fewer steps than the checkpoint "
                                f"({steps}); delete the .partial and .ckpt files to start again")
        streams[layer] = s
    for c in range(0, steps, chunk):
        e = min(steps, c + chunk)
        for layer in layers:
            s = streams[layer]
            rows = s.indices[c:e]
            width = max(1, int((rows >= 0).sum(axis=1).max()))
            writer.write_stream(Stream(0, layer, s.ctx_len[c:e], np.ascontiguousarray(rows[:, :width])))

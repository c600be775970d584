"""Small builders shared by the tests."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import numpy as np
import pytest

from simulator.trace import Stream


class Reached(Exception):
    """A command got past its checks to the work: raised by the stand-in a test puts in the work's place,
    so a refusal can be told from an input let through without doing the work."""


def reached(*args, **kwargs):
    """The stand-in for the work: raise ``Reached``."""
    raise Reached


def random_stream(rng: np.random.Generator, *, steps: int = 50, k: int = 64, ctx0: int = 300,
                  overlap: float = 0.9, request: int = 0, layer: int = 0, ragged: bool = False) -> Stream:
    """A valid stream whose adjacent steps share about ``overlap`` of their entries."""
    ctx = ctx0 + np.arange(steps, dtype=np.int64)
    rows = np.full((steps, k), -1, dtype=np.int32)
    cur = rng.choice(ctx0, size=k, replace=False)
    for t in range(steps):
        n_new = int(round((1 - overlap) * k))
        keep = rng.choice(cur, size=k - n_new, replace=False)
        pool = np.setdiff1d(np.arange(ctx[t]), keep)
        cur = np.r_[keep, rng.choice(pool, size=n_new, replace=False)]
        rng.shuffle(cur)
        n = int(rng.integers(k // 2, k + 1)) if ragged else k
        rows[t, :n] = cur[:n]
    return Stream(request, layer, ctx, rows)


def decode_pass(cost, batch: int, ctx_sum, *, active: int | None = None, missed_rows=None):
    """``cost.pass_time`` of a decode pass: ``batch`` requests whose contexts sum to ``ctx_sum`` (an
    array: one step each) on ``active`` of the instance's schedulers (default all), the rest idle;
    ``missed_rows`` per rank turns HiSparse on."""
    from simulator.costmodel import Pass, RankWork

    ranks = cost.d.ranks_per_instance
    active = ranks if active is None else active
    steps = int(np.size(ctx_sum))
    work = (RankWork(batch, ctx_sum, missed_rows),) * active + (RankWork(),) * (ranks - active)
    return cost.pass_time(Pass(work, hisparse=missed_rows is not None, steps=steps))


def prefill_pass(cost, tokens: int, prior_ctx: int, *, hisparse: bool = False) -> float:
    """Seconds of a pass in which every scheduler of the instance prefills a chunk alike."""
    from simulator.costmodel import Pass, RankWork

    work = (RankWork(chunks=((tokens, prior_ctx),)),) * cost.d.ranks_per_instance
    return float(cost.pass_time(Pass(work, hisparse=hisparse)).total_s[0])


def prefill_rank_side(cost, tokens: int, prior_ctx: int) -> float:
    """One rank's own part of a prompt chunk, composed by hand: its attention-side ops at the
    chunk's tokens, the indexer and sparse attention over the chunk's context."""
    return (sum(cost.attention_fixed(tokens).values()) + cost.prefill_indexer(tokens, prior_ctx)
            + cost.prefill_attention(tokens, prior_ctx))


def dequant_case_rows() -> np.ndarray:
    """FP8 rows (656 B) holding every finite e4m3 code under every kind of finite block scale the
    attention kernels' dequantisation tells apart: below and at/above 2^8 in bf16, normal, zero,
    subnormal, negative."""
    from cupy_kernels.mla_reference import pack_fp8_rows

    codes = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], dtype=np.uint8)  # 254 codes
    scales = [1.0, 0.0123, 2.0**-126, 3.0e-3, 255.0, 255.9, 256.0, 300.0, 1.0e6, 0.0, 1.0e-40,
              -0.75, -1.0e-3, 1.0e-38, 7.7e-5, 2.0**7 * 1.99]
    rng = np.random.default_rng(11)
    n = len(scales) * 2
    kv = pack_fp8_rows(rng.standard_normal((n, 576)))
    for i in range(n):
        kv[i, :512] = np.roll(np.resize(codes, 512), 7 * i)
        blk = np.array([scales[i % len(scales)], scales[(i + 3) % len(scales)],
                        scales[(i + 5) % len(scales)], scales[(i // 2) % len(scales)]], dtype="<f4")
        kv[i, 512:528] = blk.view(np.uint8)
    return kv


def git(cwd, *args: str) -> str:
    """Run git in ``cwd`` with a fixed identity; its stdout, stripped."""
    import os
    import subprocess

    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def fake_git_repo(path, files: list[str], gitlink: str | None = None) -> str:
    """A git repository holding ``files`` (and csrc/cutlass as a submodule link to ``gitlink``), for
    the fetch scripts' tests in place of a mirror; its commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    for f in files:
        (path / f).parent.mkdir(parents=True, exist_ok=True)
        (path / f).write_text(f"// {f}\n")
    git(path, "add", "-A")
    if gitlink:
        git(path, "update-index", "--add", "--cacheinfo", f"160000,{gitlink},csrc/cutlass")
    git(path, "commit", "-q", "-m", "fake")
    return git(path, "rev-parse", "HEAD")


def check_refuses_non_hopper_torch(monkeypatch, load: Callable[[], object], error: type[Exception]) -> None:
    """A fetched-kernel benchmark's ``load`` (through ``benchmarks.fetched_build.hopper_torch``) raises
    ``error`` naming what is missing: a CUDA GPU, a Hopper one (an A100 stands in), PyTorch itself."""
    fake = types.SimpleNamespace(__version__="0+fake", cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(error, match="needs a CUDA GPU"):
        load()
    ampere = types.SimpleNamespace(is_available=lambda: True, get_device_capability=lambda: (8, 0),
                                   get_device_name=lambda: "A100")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="0+fake", cuda=ampere))
    with pytest.raises(error, match="needs a Hopper GPU.*sm_80"):
        load()
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(error, match="needs PyTorch"):
        load()


# A small closed-loop workload file (8192 in / 1024 out, 2 requests per client), for tests that need
# a user's workload TOML rather than a preset name.
WORKLOAD_8K1K = """name = "8k1k"
input_tokens = 8192
output_tokens = 1024
length_jitter = 0.0
arrival = "closed"
rate_per_s = 0.0
requests_per_client = 2
"""

"""CPU checks of the FlashMLA same-run comparison (benchmarks/flashmla_compare.py, fetch_flashmla.sh).

What needs no GPU: our FP8 row packing against FlashMLA's V3.2 layout as transcribed, the fetch
script's pins and file list against the benchmark's (and the script itself, run on small local git
repositories standing in for the mirrors), the FLOP formula, FlashMLA's scheduler sizing, the input
construction, and the command's errors (exit 2, no traceback).
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_kernels.mla_reference import (
    D_QK,
    FP8_ROW_BYTES,
    attention_flops,
    e4m3_decode,
    pack_fp8_rows,
    unpack_fp8_rows,
)
from tests.helpers import check_refuses_non_hopper_torch, fake_git_repo, git

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("flashmla_compare", ROOT / "benchmarks" / "flashmla_compare.py")
fc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fc)
_spec = importlib.util.spec_from_file_location("flashmla_prefill", ROOT / "benchmarks" / "flashmla_prefill.py")
fp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fp)
SCRIPT = ROOT / "benchmarks" / "fetch_flashmla.sh"


def test_fp8_rows_are_flashmla_v32_layout():
    """pack_fp8_rows writes e4m3 codes, 4 fp32 scales (one per 128 values) and 64 bf16 rope values
    at FlashMLA's V3.2 offsets: value i of the latent part = e4m3 code i x scale i // 128."""
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((5, D_QK)) * np.array([0.01, 1.0, 30.0, 1e-3, 5.0])[:, None]
    rows[4, :128] = 0.0  # an all-zero block
    packed = pack_fp8_rows(rows)
    lay = fc.V32_ROW
    assert FP8_ROW_BYTES == lay["bytes"] == packed.shape[1] == lay["rope"][1]
    assert lay["nope"] == (0, 512) and lay["scales"][0] == 512 and lay["rope"][0] == lay["scales"][1]
    for r in range(len(rows)):
        row = packed[r].tobytes()
        scales = struct.unpack("<4f", row[lay["scales"][0]:lay["scales"][1]])
        codes = np.frombuffer(row[:512], dtype=np.uint8)
        latent = e4m3_decode(codes) * np.repeat(np.array(scales, dtype=np.float64), lay["scale_block"])
        rope = np.frombuffer(row[lay["rope"][0]:], dtype="<u2").astype(np.uint32) << 16
        np.testing.assert_array_equal(latent, unpack_fp8_rows(packed[r:r + 1])[0, :512])
        np.testing.assert_array_equal(rope.view(np.float32), unpack_fp8_rows(packed[r:r + 1])[0, 512:])
        # FlashMLA's quantiser (tests/quant.py): scale = block amax / 448; we keep it in fp32 too
        amax = np.abs(rows[r, :512].reshape(4, 128)).max(axis=1)
        want = np.where(amax > 0, amax / 448.0, 1.0).astype(np.float32)
        np.testing.assert_array_equal(np.array(scales, dtype=np.float32), want)
        assert np.max(np.abs(latent - rows[r, :512])) <= np.max(amax) * 2**-3  # e4m3: 3 mantissa bits


def _script_value(name: str) -> str:
    m = re.search(rf"^{name}=\$\{{\w+:-([0-9a-f]+)\}}", SCRIPT.read_text(), re.M)
    assert m, f"{name} not found in {SCRIPT}"
    return m.group(1)


def _script_paths(name: str) -> list[str]:
    text = SCRIPT.read_text()
    m = re.search(rf"^{name}=\(([^)]*)\)", text, re.M)
    assert m, f"{name} not found in {SCRIPT}"
    return m.group(1).split()


def test_fetch_script_pins_and_paths_match_the_benchmark():
    assert _script_value("flashmla_rev") == fc.FLASHMLA_COMMIT
    assert _script_value("cutlass_rev") == fc.CUTLASS_COMMIT
    assert re.fullmatch(r"[0-9a-f]{40}", fc.FLASHMLA_COMMIT) and re.fullmatch(r"[0-9a-f]{40}", fc.CUTLASS_COMMIT)
    flashmla = _script_paths("flashmla_paths")
    cutlass = ["csrc/cutlass/" + p for p in _script_paths("cutlass_paths")]
    needed = [*fc.KERNEL_SOURCES, *fc.HEADERS, *fp.KERNEL_SOURCES, *fp.HEADERS]
    for path in needed:  # every file the build needs lies under a path the script archives
        assert any(path == p or path.startswith(p + "/") for p in flashmla + cutlass), path
    for d in fc.INCLUDE_DIRS:
        assert any(d == p or d.startswith(p + "/") or p.startswith(d + "/") for p in flashmla + cutlass), d
    # only the SM90 sparse FP8 decode and the SM90 sparse prefill: no sm100, dense or api sources
    assert not [p for p in flashmla if re.search(r"sm100|dense|api", p)]
    assert [p for p in flashmla if "prefill" in p] == ["csrc/sm90/prefill/sparse"]


@pytest.fixture()
def mirrors(tmp_path):
    cutlass_files = ["LICENSE.txt", "media/big.png"] + [p.removeprefix("csrc/cutlass/") for p in fc.HEADERS
                                                        if p.startswith("csrc/cutlass/")]
    cutlass = fake_git_repo(tmp_path / "cutlass", cutlass_files)
    flash_files = ["LICENSE", "setup.py", "csrc/api/api.cpp", "csrc/sm100/x.cu"] + \
        [p for p in (*fc.KERNEL_SOURCES, *fc.HEADERS, *fp.KERNEL_SOURCES, *fp.HEADERS, "csrc/sm100/prefill/y.cu")
         if not p.startswith("csrc/cutlass/")]
    flash = fake_git_repo(tmp_path / "flashmla", flash_files, gitlink=cutlass)
    return tmp_path, flash, cutlass


def _fetch(tmp: Path, dest: Path, flash: str, cutlass: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLASHMLA_MIRROR": str(tmp / "flashmla" / ".git"), "CUTLASS_MIRROR": str(tmp / "cutlass" / ".git"),
           "FLASHMLA_REV": flash, "CUTLASS_REV": cutlass}
    return subprocess.run(["bash", str(SCRIPT), str(dest)], env=env, capture_output=True, text=True)


def test_fetch_script_from_mirrors_takes_only_the_pieces_the_benchmarks_build(mirrors):
    tmp, flash, cutlass = mirrors
    dest = tmp / "src"
    run = _fetch(tmp, dest, flash, cutlass)
    assert run.returncode == 0, run.stderr
    assert fc.missing_pieces(dest) == []
    assert fp.missing_files(dest, (*fp.KERNEL_SOURCES, *fp.HEADERS)) == []
    assert fc.read_fetched(dest) == {"flashmla": flash, "cutlass": cutlass}
    assert not (dest / "setup.py").exists() and not (dest / "csrc/api").exists() and not (dest / "csrc/sm100").exists()
    assert not (dest / "csrc/cutlass/media").exists() and (dest / "csrc/cutlass/LICENSE.txt").is_file()


def test_fetch_script_refuses_a_cutlass_commit_flashmla_does_not_pin(mirrors):
    tmp, flash, cutlass = mirrors
    git(tmp / "cutlass", "commit", "-q", "--allow-empty", "-m", "later")
    other = git(tmp / "cutlass", "rev-parse", "HEAD")
    run = _fetch(tmp, tmp / "src", flash, other)
    assert run.returncode == 2 and f"pins csrc/cutlass at {cutlass}" in run.stderr
    run = _fetch(tmp, tmp / "src2", "0" * 40, cutlass)
    assert run.returncode == 2 and "is not in the mirror" in run.stderr


def test_missing_pieces_names_what_is_absent(mirrors):
    tmp, flash, cutlass = mirrors
    dest = tmp / "src"
    assert _fetch(tmp, dest, flash, cutlass).returncode == 0
    (dest / fc.KERNEL_SOURCES[1]).unlink()
    assert fc.missing_pieces(dest) == [fc.KERNEL_SOURCES[1]]
    run = subprocess.run([sys.executable, "benchmarks/flashmla_compare.py", "--flashmla", str(dest)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2 and fc.KERNEL_SOURCES[1] in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("args, words", [
    (["--flashmla", "/no/such/dir"], "no such folder"),
    (["--flashmla", ".", "--heads", "96"], "--heads must each be one of (64, 128)"),
    (["--flashmla", ".", "--batches", "0"], "--batches must all be >= 1"),
    (["--flashmla", ".", "--reps", "0"], "--reps must be >= 1"),
    (["--flashmla", ".", "--flashmla-sms", "-1"], "--flashmla-sms must be >= 0"),
    (["--flashmla", ".", "--clock-probe", "-1"], "--clock-probe must be 0 (off) to 600 seconds, got -1.0"),
    (["--flashmla", ".", "--topk", "100"], "--topk must each be a multiple of 64 in [64, 4096], got [100]"),
    (["--flashmla", ".", "--topk", "2048", "8192"], "--topk must each be a multiple of 64 in [64, 4096], got [8192]"),
    (["--flashmla", ".", "--variants", "ws", "ws9"], "--variants must each be one of"),
    (["--flashmla", ".", "--variants", "narrow"], "['ws', 'ws2', 'wsx', 'wsxe', 'wsxo', 'wsxr', 'wsxb', 'serial'] (our FP8 wide kernels), got ['narrow']"),
    (["--flashmla", "."], "lacks"),
])
def test_cli_errors_exit_2_without_traceback(args, words):
    run = subprocess.run([sys.executable, "benchmarks/flashmla_compare.py", *args], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 2, run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr


def test_no_gpu_or_torch_is_a_usage_error(monkeypatch):
    check_refuses_non_hopper_torch(monkeypatch, fc.load_gpu_stack, fc.UsageError)


def test_flops_are_one_formula_for_both_kernels():
    assert attention_flops(64, 128, 2048) == 2 * 64 * 128 * 2048 * (576 + 512)
    r = fc.ShapeResult(64, 128, "graph", "wsx", 100.0, 80.0, 5.0, 0, 0, 0, 0, True, True)
    assert r.tflops(r.ours_us) == pytest.approx(attention_flops(64, 128, 2048) / 100e-6 / 1e12)
    assert r.ratio == pytest.approx(0.8)  # FlashMLA's time / ours: ours at 80% of FlashMLA's speed


def test_tile_fits_separate_the_per_tile_time_from_the_fixed_cost():
    # ours 12 + 2.75 x tiles, FlashMLA 10.4 + 2.69 x tiles at k 512 / 2048 / 4096, one graph row each
    rows = [fc.ShapeResult(64, 128, "graph", "wsxr", 12 + 2.75 * k / 64, 10.4 + 2.69 * k / 64, 5.0, 0, 0, 0, 0,
                           True, True, k) for k in (512, 2048, 4096)]
    rows.append(fc.ShapeResult(64, 128, "plain", "wsxr", 50.0, 40.0, 5.0, 0, 0, 0, 0, True, True, 2048))  # one k: no fit
    fits = {(f.timing, f.kernel): f for f in fc.tile_fits(rows)}
    assert set(fits) == {("graph", "wsxr"), ("graph", "flashmla")}
    assert fits[("graph", "wsxr")].per_tile_us == pytest.approx(2.75)
    assert fits[("graph", "wsxr")].fixed_us == pytest.approx(12.0)
    assert fits[("graph", "flashmla")].per_tile_us == pytest.approx(2.69)
    assert fits[("graph", "flashmla")].fixed_us == pytest.approx(10.4) and fits[("graph", "flashmla")].points == 3


def test_sched_config_is_flashmla_get_meta():
    # Decode_Sm90_Impl::get_meta: max(num_sms / s_q / (h_q / 64), 1), 5 fixed-overhead blocks, 64-token blocks
    assert fc.sched_config(128, 132) == (66, 5, 64)
    assert fc.sched_config(64, 132) == (132, 5, 64)
    assert fc.sched_config(128, 1) == (1, 5, 64)


def test_inputs_are_the_reference_packing_and_flashmla_addresses_the_same_rows():
    inp = fc.make_inputs(batch=3, heads=64, k=128, n_sets=2, unique_rows=50, seed=5, region=256)
    again = fc.make_inputs(batch=3, heads=64, k=128, n_sets=2, unique_rows=50, seed=5, region=256)
    assert all(np.array_equal(a, b) for a, b in zip(inp.slots + inp.q_bits, again.slots + again.q_bits, strict=True))
    np.testing.assert_array_equal(inp.packed, pack_fp8_rows(inp.values))
    assert inp.n_rows == 2 * 3 * 256 and inp.n_rows % fc.PAGE_BLOCK == 0
    pool = fc.pool_rows(inp, np.arange(inp.n_rows))
    for s, slots in enumerate(inp.slots):
        assert slots.dtype == np.int32 and slots.shape == (3, 128) and slots.flags.c_contiguous
        assert inp.q_bits[s].dtype == np.uint16 and inp.q_bits[s].shape == (3, 64, D_QK)
        for b in range(3):
            lo = (s * 3 + b) * 256
            assert len(set(slots[b])) == 128 and slots[b].min() >= lo and slots[b].max() < lo + 256
        # the rows both kernels gather are the reference's packing of the reference's values
        np.testing.assert_array_equal(pool[slots], pack_fp8_rows(inp.values[slots % 50].reshape(-1, D_QK))
                                      .reshape(3, 128, FP8_ROW_BYTES))
        # FlashMLA's [N / 64, 64, 1, 656] view: token index t = block * 64 + offset is pool row t
        paged = pool.reshape(-1, fc.PAGE_BLOCK, 1, FP8_ROW_BYTES)
        np.testing.assert_array_equal(paged[slots // fc.PAGE_BLOCK, slots % fc.PAGE_BLOCK, 0], pool[slots])
    with pytest.raises(ValueError, match="region"):
        fc.make_inputs(batch=1, heads=64, k=128, n_sets=1, unique_rows=4, seed=0, region=100)


def test_rel_err_fails_on_nan():
    assert fc.rel_err(np.array([1.0, np.nan]), np.array([1.0, 1.0])) == np.inf
    assert fc.max_abs(np.array([np.nan]), np.array([0.0])) == np.inf
    assert fc.rel_err(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.0


def test_time_calls_runs_warmup_then_times_each_call():
    """cupy_kernels.timing.time_calls (the attention benchmarks' CuPy timer) with a stand-in for
    CuPy's events: warm-up calls untimed, one event pair around each timed call, seconds out."""
    from types import SimpleNamespace

    from cupy_kernels.timing import time_calls

    calls, clock = [], [0.0]

    class Event:
        def record(self, stream):
            self.t = clock[0]

        def synchronize(self):
            pass

    def fn():
        calls.append(clock[0])
        clock[0] += 2.5  # ms per call

    cp = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: b.t - a.t))
    times = time_calls(cp, None, fn, reps=4, warmup=3)
    assert len(calls) == 7 and times == [0.0025] * 4


def test_time_calls_torch_syncs_after_warmup_then_times_each_call():
    """cupy_kernels.timing.time_calls_torch (the FA3 benchmark, the PyTorch reference and the GEMM
    rate) with a stand-in for torch's events: the same timing, the warm-up synchronised first."""
    from types import SimpleNamespace

    from cupy_kernels.timing import time_calls_torch

    calls, clock, syncs = [], [0.0], []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    def fn():
        calls.append(clock[0])
        clock[0] += 1.5  # ms per call

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: syncs.append(len(calls))))
    times = time_calls_torch(torch, fn, reps=3, warmup=2)
    assert len(calls) == 5 and syncs == [2] and times == [0.0015] * 3


def test_torch_graph_warms_each_launch_on_a_side_stream_then_captures_them():
    """cupy_kernels.timing.torch_graph (the prefill and MQA-logits benchmarks) with a stand-in for torch:
    every launch runs once on the side stream, then once inside the capture, in order; the captured
    launches' outputs come back."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from cupy_kernels.timing import torch_graph

    log = []

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            log.append(f"{self.name} waits {other.name}")

    main = Stream("main")
    state = {"stream": main, "capturing": False}

    @contextmanager
    def stream(s):
        prev, state["stream"] = state["stream"], s
        yield
        state["stream"] = prev

    class CUDAGraph:
        pass

    @contextmanager
    def graph(g):
        state["capturing"] = True
        yield
        state["capturing"] = False

    torch = SimpleNamespace(cuda=SimpleNamespace(Stream=Stream, current_stream=lambda: state["stream"], stream=stream,
                                                 CUDAGraph=CUDAGraph, graph=graph))

    def launch(i):
        log.append((i, state["stream"].name, state["capturing"]))
        return i * 10

    g, outs = torch_graph(torch, launch, 3)
    assert isinstance(g, CUDAGraph) and outs == [0, 10, 20]
    assert log == ["side waits main", (0, "side", False), (1, "side", False), (2, "side", False), "main waits side",
                   (0, "main", True), (1, "main", True), (2, "main", True)]


def test_clock_rows_go_beside_the_timing_csv(tmp_path):
    from cupy_kernels.clock_probe import Sustained

    out = tmp_path / "cmp.csv"
    assert fc.clocks_path(out) == tmp_path / "cmp-clocks.csv"
    row = fc.ClockRow(64, 128, 2048, "flashmla", Sustained(800, 95.0, 1755.0, 640.0, 66.0, 0x4, 40))
    fc.write_clocks_csv(fc.clocks_path(out), "H", [row])
    lines = fc.clocks_path(out).read_text().splitlines()
    assert lines[1] == "H,64,128,2048,flashmla,800,95.00,1755,166.72,640.0,66,0x4,40"

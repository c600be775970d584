"""CPU checks of the FA3 sparse-decode benchmark (benchmarks/fa3_sparse_decode.py, fetch_fa3.sh, the two
instantiation units).

What needs no GPU: the fetch script's pins and file list against the benchmark's (and the script itself,
run on small local git repositories standing in for the mirrors), the instantiation units against the
combinations FA3's dispatcher names, the shapes, the page tables (distinct rows, own regions, the adjacent
overlap asked for), the reference's layout against a hand computation, and the command's errors (exit 2,
no traceback).
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import check_refuses_non_hopper_torch, fake_git_repo, git

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fa3_sparse_decode", ROOT / "benchmarks" / "fa3_sparse_decode.py")
fb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fb)
SCRIPT = ROOT / "benchmarks" / "fetch_fa3.sh"


def _script_value(name: str) -> str:
    m = re.search(rf"^{name}=\$\{{[A-Z0-9_]+:-([0-9a-f]+)\}}", SCRIPT.read_text(), re.M)
    assert m, name
    return m.group(1)


def _script_paths(name: str) -> list[str]:
    text = SCRIPT.read_text()
    m = re.search(rf"^{name}=\((.*?)\)", text, re.M | re.S)
    assert m, name
    return [p.strip("'\"") for p in m.group(1).split()]


def _covered(path: str, patterns: list[str]) -> bool:
    from fnmatch import fnmatch

    return any(path == p or path.startswith(p + "/") or (("*" in p) and fnmatch(path, p) and "/" not in
                                                          path[len(p.split("*")[0]):]) for p in patterns)


def test_fetch_script_pins_and_paths_match_the_benchmark():
    assert _script_value("fa3_rev") == fb.FA3_COMMIT
    assert _script_value("cutlass_rev") == fb.CUTLASS_COMMIT
    assert re.fullmatch(r"[0-9a-f]{40}", fb.FA3_COMMIT) and re.fullmatch(r"[0-9a-f]{40}", fb.CUTLASS_COMMIT)
    fa3 = _script_paths("fa3_paths")
    cutlass = ["csrc/cutlass/" + p for p in _script_paths("cutlass_paths")]
    for path in (*fb.FA3_SOURCES, *fb.HEADERS):  # every file the build needs lies under a path the script archives
        assert _covered(path, fa3 + cutlass), path
    # no backward, sm80, other instantiations, or the package's own setup
    assert not [p for p in fa3 if re.search(r"bwd|sm80|setup|flash_api\.cpp", p)]


@pytest.fixture()
def mirrors(tmp_path):
    cutlass_files = ["LICENSE.txt", "media/big.png"] + [p.removeprefix("csrc/cutlass/") for p in fb.HEADERS
                                                        if p.startswith("csrc/cutlass/")]
    cutlass = fake_git_repo(tmp_path / "cutlass", cutlass_files)
    fa3_files = ["LICENSE", "setup.py", "hopper/setup.py", "hopper/flash_api.cpp", "hopper/flash_bwd_kernel_sm90.cu",
                 "hopper/instantiations/flash_fwd_hdim128_bf16_sm90.cu",
                 "hopper/instantiations/flash_fwd_hdim64_512_bf16_paged_split_sm90.cu", "hopper/flash_fwd_combine.cu",
                 "hopper/test_flash_attn.py"] + [p for p in (*fb.FA3_SOURCES, *fb.HEADERS)
                                                 if not p.startswith("csrc/cutlass/")]
    fa3 = fake_git_repo(tmp_path / "fa3", fa3_files, gitlink=cutlass)
    return tmp_path, fa3, cutlass


def _fetch(tmp: Path, dest: Path, fa3: str, cutlass: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FA3_MIRROR": str(tmp / "fa3" / ".git"), "CUTLASS_MIRROR": str(tmp / "cutlass" / ".git"),
           "FA3_REV": fa3, "CUTLASS_REV": cutlass}
    return subprocess.run(["bash", str(SCRIPT), str(dest)], env=env, capture_output=True, text=True)


def test_fetch_script_from_mirrors_takes_only_the_decode_pieces(mirrors):
    tmp, fa3, cutlass = mirrors
    dest = tmp / "src"
    run = _fetch(tmp, dest, fa3, cutlass)
    assert run.returncode == 0, run.stderr
    assert fb.missing_pieces(dest) == []
    assert fb.read_fetched(dest) == {"flash-attention": fa3, "cutlass": cutlass}
    for absent in ("setup.py", "hopper/setup.py", "hopper/flash_api.cpp", "hopper/test_flash_attn.py",
                   "hopper/instantiations/flash_fwd_hdim128_bf16_sm90.cu", "csrc/cutlass/media"):
        assert not (dest / absent).exists(), absent
    assert (dest / "hopper/instantiations/flash_fwd_hdim64_512_bf16_paged_split_sm90.cu").is_file()
    assert (dest / "csrc/cutlass/LICENSE.txt").is_file()


def test_fetch_script_refuses_a_cutlass_commit_fa3_does_not_pin(mirrors):
    tmp, fa3, cutlass = mirrors
    git(tmp / "cutlass", "commit", "-q", "--allow-empty", "-m", "later")
    other = git(tmp / "cutlass", "rev-parse", "HEAD")
    run = _fetch(tmp, tmp / "src", fa3, other)
    assert run.returncode == 2 and f"pins csrc/cutlass at {cutlass}" in run.stderr
    run = _fetch(tmp, tmp / "src2", "0" * 40, cutlass)
    assert run.returncode == 2 and "is not in the mirror" in run.stderr


def test_missing_pieces_names_what_is_absent(mirrors):
    tmp, fa3, cutlass = mirrors
    dest = tmp / "src"
    assert _fetch(tmp, dest, fa3, cutlass).returncode == 0
    (dest / fb.FA3_SOURCES[1]).unlink()
    assert fb.missing_pieces(dest) == [fb.FA3_SOURCES[1]]
    run = subprocess.run([sys.executable, "benchmarks/fa3_sparse_decode.py", "--fa3", str(dest)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2 and fb.FA3_SOURCES[1] in run.stderr and "Traceback" not in run.stderr


def test_the_instantiation_units_cover_what_fa3s_dispatcher_names():
    """flash_api_stable.cpp's run_mha_fwd, with the benchmark's DISABLE switches (bf16 only, hdim 64 with
    hdim_v 64 / 256 / 512, no softcap, Arch 90), names run_mha_fwd_<90, bf16, 64, dv, Split, PagedKVNonTMA,
    false, PackGQA_ || PagedKVNonTMA || Split>: 5 combinations per dv. The forward unit defines exactly those
    15, one of them the real kernel (split, paged, PackGQA at dv 512); the combine unit the 6 combines."""
    assert {"FP16", "FP8", "SOFTCAP", "SM8x", "BACKWARD", "HDIM96", "HDIM128", "HDIM192", "HDIM256"} <= set(fb.DISABLED)
    assert "HDIM64" not in fb.DISABLED and "HDIMDIFF64" not in fb.DISABLED and "SPLIT" not in fb.DISABLED
    named = {(dv, split, paged, pack or paged or split)
             for dv, split, paged, pack in itertools.product((64, 256, 512), (False, True), (False, True), (False, True))}
    assert len(named) == 15
    fwd = (ROOT / "benchmarks" / "fa3_shim_fwd.cu").read_text()
    stubs = {(int(dv), s == "true", p == "true", k == "true") for dv, s, p, k in
             re.findall(r"^HISPARSE_FA3_NOT_BUILT\((\d+), (\w+), (\w+), (\w+)\)", fwd, re.M)}
    real = re.findall(r"^void run_mha_fwd_<90, cutlass::bfloat16_t, 64, (\d+), (\w+), (\w+), false, (\w+)>", fwd, re.M)
    assert real == [("512", "true", "true", "true")]
    assert (512, True, True, True) not in stubs and stubs | {(512, True, True, True)} == named
    combine = (ROOT / "benchmarks" / "fa3_shim_combine.cu").read_text()
    kinds = set(re.findall(r"^HISPARSE_FA3_COMBINE_NOT_BUILT\(([\w:]+), (\d+)\)", combine, re.M))
    kinds |= {(t, k) for t, k in re.findall(r"^template void run_mha_fwd_combine_<([\w:]+), float, (\d+)>", combine, re.M)}
    assert kinds == {(t, k) for t in ("float", "cutlass::half_t", "cutlass::bfloat16_t") for k in ("64", "128")}


@pytest.mark.parametrize("text, shape", [("96x8p6", (96, 8, 6)), ("12x64", (12, 64, 1)), ("1x8", (1, 8, 1))])
def test_shapes(text, shape):
    s = fb.parse_shape(text)
    assert tuple(s) == shape and s.name == text and s.requests == shape[0] // shape[2]


@pytest.mark.parametrize("text", ["96x8p5", "0x8", "96", "96x8p", "8x-1"])
def test_bad_shapes(text):
    with pytest.raises(ValueError):
        fb.parse_shape(text)


@pytest.mark.parametrize("overlap", [0.0, 0.7, 0.9])
def test_page_tables(overlap):
    """Distinct rows per position, each request inside its own region (no two requests share a row),
    position j + 1 keeping exactly round(F k) of position j's rows."""
    shape, k, region = fb.parse_shape("12x8p6"), 64, 256
    t = fb.page_table(np.random.default_rng(3), shape, k, region, overlap, first_region=5)
    assert t.shape == (12, k) and t.dtype == np.int32
    for r in range(12):
        assert len(set(t[r])) == k
        req = r // 6
        assert t[r].min() >= (5 + req) * region and t[r].max() < (6 + req) * region
    if overlap:
        for r in range(12):
            if r % 6:
                assert len(np.intersect1d(t[r - 1], t[r])) == round(overlap * k)
        assert fb.adjacent_overlap(t, 6) == pytest.approx(round(overlap * k) / k)
    assert np.array_equal(t, fb.page_table(np.random.default_rng(3), shape, k, region, overlap, first_region=5))
    assert math.isnan(fb.adjacent_overlap(t, 1))


def test_sets_use_disjoint_regions():
    shape = fb.parse_shape("12x64p2")
    sets = fb.make_sets(shape, 32, 128, 0.7, 3, seed=1)
    regions = [set(np.unique(h.table // 128)) for h in sets]
    assert regions == [set(range(s * 6, s * 6 + 6)) for s in range(3)]
    assert fb.pool_rows_needed(shape, 3, 128) == 3 * 6 * 128
    with pytest.raises(ValueError, match="cannot hold"):
        fb.page_table(np.random.default_rng(0), shape, 100, 150, 0.0)


def test_bf16_round():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 1e-30], dtype=np.float32)
    # 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0); 1 + 3 x 2^-8 -> 1 + 2^-6
    assert fb.bf16_round(x).tolist() == [1.0, 1.0, 1.0 + 2**-6, -2.5, pytest.approx(1e-30, rel=1e-2)]
    assert (fb.bf16_round(x).view(np.uint32) & 0xFFFF).tolist() == [0] * 5


def test_reference_is_fa3s_split_of_q_and_the_pool_row():
    """FA3's call: score = q_rope . k_rope + q_nope . c_kv (K = the pool row's last 64, qv against its first
    512), out = softmax(scale x score) @ c_kv. One head, two rows, by hand."""
    rng = np.random.default_rng(0)
    q_rope, q_nope = rng.standard_normal((1, 1, 64)), rng.standard_normal((1, 1, 512))
    pool = rng.standard_normal((1, 2, 576))
    host = fb.HostSet(q_rope, q_nope, np.array([[0, 1]], dtype=np.int32))
    out, lse = fb.reference(host, pool, 0.1)
    s = [0.1 * (q_rope[0, 0] @ pool[0, j, 512:] + q_nope[0, 0] @ pool[0, j, :512]) for j in range(2)]
    p = np.exp(s) / np.exp(s).sum()
    np.testing.assert_allclose(out[0, 0], p[0] * pool[0, 0, :512] + p[1] * pool[0, 1, :512], rtol=1e-12)
    assert lse[0, 0] == pytest.approx(np.log(np.exp(s).sum()))


def test_rel_err_fails_on_nan():
    assert fb.rel_err(np.array([np.nan, 1.0]), np.ones(2)) == math.inf
    assert fb.max_abs(np.array([np.nan]), np.ones(1)) == math.inf


@pytest.mark.parametrize("args, words", [
    (["--fa3", "/no/such/dir"], "no such folder"),
    (["--fa3", ".", "--shapes", "96x8p5"], "rows a multiple of P"),
    (["--fa3", ".", "--overlaps", "1.0"], "--overlaps must each be in (0, 1)"),
    (["--fa3", ".", "--reps", "0"], "--reps must be >= 1"),
    (["--fa3", ".", "--region", "2200"], "--region 2200 must hold"),
    (["--fa3", "."], "lacks"),
])
def test_cli_errors_exit_2_without_traceback(args, words):
    run = subprocess.run([sys.executable, "benchmarks/fa3_sparse_decode.py", *args], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 2, run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr


def test_no_gpu_or_torch_is_a_usage_error(monkeypatch):
    check_refuses_non_hopper_torch(monkeypatch, fb.load_torch, fb.UsageError)

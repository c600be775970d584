"""The nvcc build cache the kernels share: compiles once, rebuilds on change, clear errors.
Runs wherever nvcc is (this machine kind has it); the kernels' sources must at least compile."""

from __future__ import annotations

import pytest

from cupy_kernels import _build


def _have_nvcc() -> bool:
    try:
        _build.find_nvcc()
        return True
    except RuntimeError:
        return False


pytestmark = pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")

FLAGS = ("-cubin", "-gencode", "arch=compute_90,code=sm_90")


def test_build_is_cached_and_keyed_by_source(tmp_path, monkeypatch):
    monkeypatch.setenv("HISPARSE_KERNEL_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(int *x) { x[threadIdx.x] = 1; }\n')
    a = _build.build_cubin(src, FLAGS, "k")
    mtime = a.stat().st_mtime_ns
    assert _build.build_cubin(src, FLAGS, "k") == a and a.stat().st_mtime_ns == mtime
    src.write_text('extern "C" __global__ void k(int *x) { x[threadIdx.x] = 2; }\n')
    b = _build.build_cubin(src, FLAGS, "k")
    assert b != a and b.exists()
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".cubin", ".cubin"]


def test_build_error_names_the_command_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HISPARSE_KERNEL_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "bad.cu"
    src.write_text("this is not CUDA\n")
    with pytest.raises(RuntimeError, match="nvcc failed"):
        _build.build_cubin(src, FLAGS, "bad")
    assert list((tmp_path / "cache").iterdir()) == []


@pytest.mark.parametrize("module", ["sparse_attention", "swap_in"])
def test_project_kernels_compile(module):
    """Through the shared build cache (``HISPARSE_KERNEL_CACHE``, keyed by the source's bytes and
    the flags): compiled once per source change, as the GPU tests and users compile them
    (sparse_attention takes ~50 s of nvcc on 2 cores); the slow tier compiles from scratch."""
    mod = __import__(f"cupy_kernels.{module}", fromlist=["compiled_cubin"])
    assert mod.compiled_cubin().stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize("module", ["sparse_attention", "swap_in"])
def test_project_kernels_compile_from_scratch(tmp_path, monkeypatch, module):
    monkeypatch.setenv("HISPARSE_KERNEL_CACHE", str(tmp_path))
    mod = __import__(f"cupy_kernels.{module}", fromlist=["compiled_cubin"])
    assert mod.compiled_cubin().stat().st_size > 1000

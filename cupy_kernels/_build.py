"""Build CUDA sources into cubins with nvcc, cached by source and flags (shared by the kernels).

The kernels need sm_90/sm_90a code (wgmma, cooperative launch), which CuPy's runtime compiler
does not produce for every option, so they are compiled ahead with nvcc and loaded as cubins.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def find_nvcc() -> str:
    """nvcc from PATH, $CUDA_PATH or /usr/local/cuda."""
    for cand in (
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_PATH", ""), "bin", "nvcc"),
        "/usr/local/cuda/bin/nvcc",
    ):
        if cand and os.path.isfile(cand):
            return cand
    raise RuntimeError("nvcc not found (needed to build the sm_90 kernels); set CUDA_PATH")


def kernel_cache_dir() -> Path:
    return Path(os.environ.get("HISPARSE_KERNEL_CACHE", Path.home() / ".cache" / "hisparse-sim"))


def build_cubin(source: Path, flags: Sequence[str], name: str) -> Path:
    """Compile ``source`` once per (source bytes, the ``.cuh`` headers beside it, flags); return
    the cached cubin's path. The cubin is written to a temp file and renamed, so a failed or
    concurrent build leaves no half-written file."""
    h = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.cuh")):  # local includes (rows.cuh)
        h.update(header.name.encode() + header.read_bytes())
    key = hashlib.sha256(h.digest() + " ".join(flags).encode()).hexdigest()[:16]
    cache = kernel_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    cubin = cache / f"{name}-{key}.cubin"
    if not cubin.exists():
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".cubin")
        os.close(fd)
        cmd = [find_nvcc(), *flags, "-o", tmp, str(source)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"nvcc failed:\n{' '.join(cmd)}\n{res.stderr}")
        os.replace(tmp, cubin)
    return cubin


SM90_FLAGS = ("-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90")
"""nvcc flags of the swap-in kernels (plain sm_90: no wgmma)."""


def load_sm90_module(device_id: int, cubin: Path, what: str, kernels: Sequence[str]) -> Any:
    """Load a built cubin on a device for kernels that need sm_90, each of ``kernels`` allowed the
    device's opt-in shared memory (less its static share). ``what`` names the kernels in the
    error a pre-Hopper device gets."""
    import cupy as cp

    dev = cp.cuda.Device(device_id)
    if int(dev.compute_capability) < 90:
        raise RuntimeError(f"{what} built for sm_90; device has sm_{dev.compute_capability}")
    mod = cp.RawModule(path=str(cubin))
    optin = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    for name in kernels:
        f = mod.get_function(name)
        f.max_dynamic_shared_size_bytes = optin - f.shared_size_bytes
    return mod

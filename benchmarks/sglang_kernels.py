"""Build SGLang's own HiSparse swap-in kernels from a copy of its source, for same-run timing.

Nothing of SGLang is kept in this repository: ``benchmarks/fetch_sglang_kernels.sh DIR`` downloads
the released ``sglang`` and ``apache-tvm-ffi`` wheels with pip and unpacks only the kernel
sources and headers into DIR (``DIR/sglang/kernels/jit/{csrc,include}``, ``DIR/tvm_ffi/include``);
the benchmark is given DIR on its command line. This module writes a small translation unit that
includes SGLang's ``kvcacheio/hisparse.cuh`` unchanged and takes the address of the kernel
specialisations we time (which instantiates them), compiles it with the flags SGLang's JIT uses
on Hopper (``sglang/kernels/jit/utils/arch.py``: ``-DSGL_CUDA_ARCH=900 -std=c++20 -O3
--expt-relaxed-constexpr``, target sm_90a) and finds the kernels' mangled names in the cubin's
symbol table.

Read against SGLang 0.5.23 (``load_cache_to_device_buffer_kernel`` with 11 template parameters:
BLOCK_SIZE, NUM_TOP_K, HOT_BUFFER_SIZE, IsMLA, IsDsv4Layout, SPARSE_BLOCK_SIZE, TopKIsBlocks,
RecordMissPlan, SkipIO, SeqLensT, ReqPoolIndicesT; ``copy_cache_planned_kernel<BLOCK_SIZE, IsMLA,
IsDsv4Layout, SkipIO>``). Another release may change them: the build then fails with nvcc's
message.
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

FLAGS = ("-cubin", "-O3", "-std=c++20", "--expt-relaxed-constexpr", "-DSGL_CUDA_ARCH=900",
         "-gencode", "arch=compute_90a,code=sm_90a")
HEADER = "sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh"


class SglangBuild(NamedTuple):
    cubin: Path
    fused: str  # load_cache_to_device_buffer_kernel, rows copied by the request's block
    bookkeeping: str  # the same with SkipIO: the whole plan, no bytes moved (SGLang's timing probe)
    plan: str  # RecordMissPlan + SkipIO: the plan only, for copy_cache_planned_kernel
    copy: str  # copy_cache_planned_kernel: every warp of the grid copies planned rows
    version: str


def smem_bytes(top_k: int, hot: int) -> int:
    """SGLang's ``SmemLayout<NUM_TOP_K, HOT_BUFFER_SIZE>::BYTES`` (the dynamic shared memory it
    launches with): int32 top-k + 2 x (chunks + 1) offsets + 2k hash keys + 2, int16 B + 2k."""
    chunks = (hot + 31) // 32
    return 4 * (top_k + 2 * (chunks + 1) + 2 * top_k + 2) + 2 * (hot + 2 * top_k)


def elf_functions(path: Path) -> list[str]:
    """Names of the function symbols of an ELF64 file (a cubin)."""
    data = path.read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for sec in secs:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = secs[sec[6]][4]
        for j in range(sec[5] // sec[9]):
            st_name, st_info = struct.unpack_from("<IB", data, sec[4] + j * sec[9])
            if st_info & 0xF == 2:  # STT_FUNC
                s = strtab + st_name
                out.append(data[s:data.index(b"\0", s)].decode())
    return out


def build(src: Path, out_dir: Path, *, block: int = 960, top_k: int = 2048, hot: int = 4096,
          nvcc: str = "nvcc") -> SglangBuild:
    """Compile SGLang's swap-in kernels from ``src`` (the folder fetch_sglang_kernels.sh fills)."""
    src = Path(src)
    header = src / HEADER
    if not header.is_file():
        raise FileNotFoundError(f"{header} not found: run benchmarks/fetch_sglang_kernels.sh {src} first")
    meta = sorted(src.glob("sglang-*.dist-info/METADATA"))
    version = next((ln.split(":", 1)[1].strip() for ln in meta[0].read_text().splitlines()
                    if ln.startswith("Version:")), "?") if meta else "?"
    spec = {}
    for name, rec, skip in (("fused", 0, 0), ("bookkeeping", 0, 1), ("plan", 1, 1)):
        spec[name] = (f"sglang::load_cache_to_device_buffer_kernel<{block}, {top_k}, {hot}, true, false, 1, false, "
                      f"{'true' if rec else 'false'}, {'true' if skip else 'false'}, int64_t, int64_t>",
                      f"ILi{block}ELi{top_k}ELi{hot}ELb1ELb0ELi1ELb0ELb{rec}ELb{skip}EllE")
    spec["copy"] = (f"sglang::copy_cache_planned_kernel<{block}, true, false, false>", f"ILi{block}ELb1ELb0ELb0EE")
    tu = f'#include <{HEADER}>\nnamespace hs_bench {{\n' + "".join(
        f"void* k_{n} = (void*)&{expr};\n" for n, (expr, _) in spec.items()) + "}\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "sglang_hisparse_tu.cu"
        cu.write_text(tu)
        cubin = out_dir / f"sglang_hisparse_b{block}_k{top_k}_h{hot}.cubin"
        cmd = [nvcc, *FLAGS, "-I", str(src), "-I", str(src / "sglang/kernels/jit/include"),
               "-I", str(src / "tvm_ffi/include"), "-o", str(cubin), str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"nvcc failed on SGLang's hisparse.cuh:\n{' '.join(cmd)}\n{res.stderr[-4000:]}")
    names = elf_functions(cubin)
    found = {}
    for n, (_, tag) in spec.items():
        base = "copy_cache_planned_kernel" if n == "copy" else "load_cache_to_device_buffer_kernel"
        hits = [s for s in names if re.search(base + tag, s)]
        if len(hits) != 1:
            raise RuntimeError(f"{n}: expected one {base}{tag} in the cubin, found {hits}")
        found[n] = hits[0]
    return SglangBuild(cubin, found["fused"], found["bookkeeping"], found["plan"], found["copy"], version)

#!/usr/bin/env bash
# Unpack SGLang's HiSparse kernel sources and the headers they include into DIR, for
# benchmarks/swap_in_designs.py --sglang DIR (nothing of it is committed here). Uses pip's download of the
# released wheels (run where pip reaches the package index; carry DIR to the GPU machine).
#   bash benchmarks/fetch_sglang_kernels.sh DIR [SGLANG_VERSION] [TVM_FFI_VERSION]
set -eu
dir=${1:?usage: fetch_sglang_kernels.sh DIR [sglang version] [apache-tvm-ffi version]}
sgl=${2:-0.5.23}
ffi=${3:-0.1.15.post2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "sglang==$sgl" "apache-tvm-ffi==$ffi"
mkdir -p "$dir"
unzip -q -o "$tmp"/sglang-*.whl 'sglang/kernels/jit/include/*' 'sglang/kernels/jit/csrc/kvcacheio/*' \
    'sglang-*.dist-info/METADATA' -d "$dir"
unzip -q -o "$tmp"/apache_tvm_ffi-*.whl 'tvm_ffi/include/*' -d "$dir"
du -sh "$dir"

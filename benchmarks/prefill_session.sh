#!/usr/bin/env bash
# SGLang's prompt-chunk kernels at the serving model's shapes in one device call (BENCHMARKS.md, "SGLang's
# prompt-chunk kernels at the model's shapes"): DeepGEMM's fp8_mqa_logits, then FlashMLA's SM90 sparse prefill.
#
#   bash benchmarks/prefill_session.sh prepare DIR   # here, with the network or the mirrors: fills DIR (~9 MB)
#   bash benchmarks/prefill_session.sh run DIR [quick]   # on the H100 / H200, DIR carried; CSVs and logs to $OUT
#
# prepare: FlashMLA's source and CUTLASS's headers (benchmarks/fetch_flashmla.sh, packed as one tar.gz so the
# carried tree stays small; FLASHMLA_MIRROR / CUTLASS_MIRROR as there) and the two wheels SGLang 0.5.14 pins for
# DeepGEMM (sgl-deep-gemm 0.1.3, apache-tvm-ffi 0.1.9, Python 3.12 x86-64: the device image's). Nothing of them
# is committed. run: installs the wheels into /tmp/site, unpacks the source into /tmp, and times the chunk
# shapes the model prices (4,096-token chunks at 4K-160K prompts; 1,024-token chunks at 8K, the cookbook's DP8
# cells); `quick` keeps the 4K and 160K prompts only. Every step has its own time limit (under 10 minutes in
# all), so one hang cannot eat the call.
set -u
cmd=${1:?usage: prefill_session.sh prepare|run DIR [quick]}
dir=${2:?usage: prefill_session.sh prepare|run DIR [quick]}
here=$(cd "$(dirname "$0")/.." && pwd)

prepare() {
    set -e
    mkdir -p "$dir"
    local tmp
    tmp=$(mktemp -d)
    bash "$here/benchmarks/fetch_flashmla.sh" "$tmp/.flashmla-src"
    tar czf "$dir/flashmla-src.tar.gz" -C "$tmp" .flashmla-src
    rm -rf "$tmp"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
        -d "$dir" sgl_deep_gemm==0.1.3 apache_tvm_ffi==0.1.9
    ls -la "$dir"
}

run() {
    export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
    local out=${OUT:-session-out} py=${PY:-python3} contexts="4096 32768 163840" t_dg=150 t_fm=300
    if [ "${1:-}" = quick ]; then contexts="4096 163840"; t_dg=110; t_fm=230; fi
    local piece
    for piece in flashmla-src.tar.gz sgl_deep_gemm-0.1.3-*.whl apache_tvm_ffi-0.1.9-*.whl; do
        if ! compgen -G "$dir/$piece" > /dev/null; then
            echo "prefill_session.sh: $dir has no $piece (run 'prefill_session.sh prepare $dir' first)" >&2
            return 2
        fi
    done
    mkdir -p "$out" || return 2
    dir=$(cd "$dir" && pwd) out=$(cd "$out" && pwd)  # absolute: the benchmarks run from the repository root
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$out/gpu.txt"
    if [ -z "${CUDA_HOME:-}" ] && command -v nvcc > /dev/null; then
        CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); export CUDA_HOME
    fi
    $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$dir"/*.whl || return 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    tar xzf "$dir/flashmla-src.tar.gz" -C /tmp || return 2
    cd "$here" || return 2
    # shellcheck disable=SC2086  # the context lists split on purpose
    timeout $t_dg $py benchmarks/deepgemm_mqa_logits.py --heads 64 32 --contexts $contexts \
        --out "$out/deepgemm_mqa_logits.csv" 2>&1 | tee "$out/deepgemm.log"
    # shellcheck disable=SC2086
    timeout $t_fm $py benchmarks/flashmla_prefill.py --flashmla /tmp/.flashmla-src --chunk 4096 --contexts $contexts \
        --heads 128 64 --out "$out/flashmla_prefill.csv" 2>&1 | tee "$out/flashmla_prefill.log"
    timeout 50 $py benchmarks/deepgemm_mqa_logits.py --heads 32 64 --chunk 1024 --contexts 8192 \
        --out "$out/deepgemm_mqa_logits_c1024.csv" 2>&1 | tee -a "$out/deepgemm.log"
    timeout 50 $py benchmarks/flashmla_prefill.py --flashmla /tmp/.flashmla-src --chunk 1024 --contexts 8192 \
        --heads 64 128 --out "$out/flashmla_prefill_c1024.csv" 2>&1 | tee -a "$out/flashmla_prefill.log"
}

case $cmd in
    prepare) prepare ;;
    run) run "${3:-}" ;;
    *) echo "prefill_session.sh: unknown step '$cmd' (prepare or run)" >&2; exit 2 ;;
esac

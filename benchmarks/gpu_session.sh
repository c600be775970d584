#!/usr/bin/env bash
# One GPU session for issue #27 items 2 / 5 and #30 item 2 (run on the H200 from the repo root):
#   bash benchmarks/gpu_session.sh STEP...
# Steps: build (C extension + cubins + resource report), test (GPU tests of the sharded kernels
# and the attention sequence, CPU reference tests), replay (benchmarks/gpu_replay.py),
# designs (benchmarks/swap_in_designs.py), seq (the attention sequence 3 times, plain),
# sanitize (compute-sanitizer memcheck / racecheck / initcheck / synccheck over the sequence);
# issue #27's remaining items: test27, designs27, accuracy, test_att, sanitize_clock, sass_epi;
# the swap-in's fixed cost (kern27): build_swap, test_swap, sanitize_swap, designs_fixed, phases;
# attention against FlashMLA in the same run (issue #27 item 4): flashmla; its per-CTA timeline: timeline.
# Everything goes to $OUT/session.log; CSVs to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export HISPARSE_KERNEL_CACHE=${HISPARSE_KERNEL_CACHE:-/tmp/hcache} NUMBA_CACHE_DIR=/tmp/numba
OUT=${OUT:-session-out}
mkdir -p "$OUT"
LOG="$OUT/session.log"
PY=python3
say() { echo "=== $* ($(date +%T))" | tee -a "$LOG"; }

step_build() {
    timeout 120 $PY setup.py build_ext --inplace -q >>"$LOG" 2>&1; rm -rf build
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
    timeout 200 $PY -c "from cupy_kernels import sharded_lru as s, sparse_attention as a; print(s.compiled_cubin()); print(a.compiled_cubin())" 2>&1 | tee -a "$LOG"
}
step_test() {
    timeout 300 $PY -m pytest -q -p no:cacheprovider -rf -x tests/test_sharded_lru_gpu.py \
        tests/test_attention_sequence_gpu.py tests/test_sharded_lru_reference.py 2>&1 | tee -a "$LOG"
}
step_replay() { timeout 240 $PY benchmarks/gpu_replay.py --batch 1 10 100 400 --out "$OUT/gpu_replay.csv" 2>&1 | tee -a "$LOG"; }
step_designs() { timeout 300 $PY benchmarks/swap_in_designs.py --out "$OUT/swap_in_designs.csv" 2>&1 | tee -a "$LOG"; }
step_seq() { timeout 120 $PY -m cupy_kernels.graph_sequence --repeat 3 >"$OUT/seq.txt" 2>&1; echo "seq rc=$?" | tee -a "$LOG"; tail -60 "$OUT/seq.txt" >>"$LOG"; rm -f "$OUT/seq.txt"; }
step_sanitize() {
    for tool in ${SAN_TOOLS:-memcheck synccheck initcheck racecheck}; do
        timeout "${SAN_TIMEOUT:-150}" compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 \
            $PY -m cupy_kernels.graph_sequence --replays 1 --calls 1 >"$OUT/san_$tool.txt" 2>&1
        echo "$tool rc=$?" | tee -a "$LOG"
        tail -40 "$OUT/san_$tool.txt" >>"$LOG"
        rm -f "$OUT/san_$tool.txt"
    done
}
# Issue #27, remaining items (CLOCK kernel, SGLang's kernels in the same run, the epilogue
# barrier, the narrow FP8 case). SGLANG_SRC: the folder benchmarks/fetch_sglang_kernels.sh filled.
step_test27() {
    timeout 420 $PY -m pytest -q -p no:cacheprovider -rf tests/test_clock_swap_gpu.py tests/test_sharded_lru_gpu.py \
        tests/test_swap_in_gpu.py tests/test_clock_swap_reference.py 2>&1 | tail -30 | tee -a "$LOG"
}
step_designs27() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv 2>&1 | tee -a "$LOG"
    timeout "${DESIGNS_TIMEOUT:-420}" $PY benchmarks/swap_in_designs.py --sglang "${SGLANG_SRC:-.sglang-src}" \
        ${DESIGNS_ARGS:---clock-steps 4} --out "$OUT/swap_in_designs.csv" 2>&1 | tee -a "$LOG"
}
step_accuracy() {
    timeout 200 $PY benchmarks/attention_accuracy.py --seeds "${ACC_SEEDS:-100}" --repeat 3 \
        --out "$OUT/attention_accuracy.csv" 2>&1 | tee -a "$LOG"
}
step_test_att() {
    timeout 300 $PY -m pytest -q -p no:cacheprovider -rf tests/test_sparse_attention_gpu.py \
        tests/test_attention_sequence_gpu.py 2>&1 | tail -15 | tee -a "$LOG"
}
step_sanitize_clock() {  # the CLOCK kernel: one small random case per copy mode, both paths
    for tool in memcheck racecheck synccheck; do
        timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 10 $PY -m pytest -q \
            -p no:cacheprovider tests/test_clock_swap_gpu.py -k "random and 192 and prefix and 4" >"/tmp/sc_$tool.txt" 2>&1
        echo "clock $tool rc=$?" | tee -a "$LOG"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|Barrier|Hazard" "/tmp/sc_$tool.txt" | head -8 | tee -a "$LOG"
    done
}
step_sass_epi() {  # the FP8 warp-specialised kernel's barriers in SASS
    f=$($PY -c "from cupy_kernels import sparse_attention as a; print(a.compiled_cubin())")
    cuobjdump -sass -fun mla_decode_ws_fp8 "$f" | grep -nE "BAR|WARPSYNC|BSSY|BSYNC|EXIT" | tail -40 | tee -a "$LOG"
}
# The swap-in's fixed cost (issue #27): BASELINE_CU = another commit's swap_in.cu (with host_load.cuh
# beside it), timed in the same run as the exact-lru-base* designs.
step_build_swap() {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
    timeout 200 $PY -c "from cupy_kernels import swap_in as s, sharded_lru as l, clock_swap as c
print(s.compiled_cubin(), l.compiled_cubin(), c.compiled_cubin())" 2>&1 | tee -a "$LOG"
}
step_test_swap() {
    timeout 300 $PY -m pytest -q -p no:cacheprovider -rf tests/test_swap_in_gpu.py tests/test_clock_swap_gpu.py \
        tests/test_sharded_lru_gpu.py tests/test_swap_in_reference.py 2>&1 | tail -15 | tee -a "$LOG"
}
step_sanitize_swap() {
    for tool in memcheck racecheck; do
        timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 10 $PY -m pytest -q \
            -p no:cacheprovider tests/test_swap_in_gpu.py -k "small_for_sanitizer" >"/tmp/ss_$tool.txt" 2>&1
        echo "swap-in $tool rc=$?" | tee -a "$LOG"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|Hazard" "/tmp/ss_$tool.txt" | head -8 | tee -a "$LOG"
    done
}
step_designs_fixed() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv 2>&1 | tee -a "$LOG"
    timeout "${DESIGNS_TIMEOUT:-300}" $PY benchmarks/swap_in_designs.py --sglang "${SGLANG_SRC:-.sglang-src}" \
        --baseline-cu "${BASELINE_CU:-baseline/swap_in.cu}" --designs sglang-fused sglang-nocopy exact-lru \
        exact-lru-no-newest exact-lru-nocopy exact-lru-base exact-lru-base-no-newest \
        exact-lru-base-nocopy --batches ${FIXED_BATCHES:-1 100} --rows 656 --miss-rates 0.001 0.2 \
        --iters "${FIXED_ITERS:-11}" --seed "${FIXED_SEED:-0}" --out "$OUT/swap_in_designs-fixed${FIXED_SEED:-}.csv" \
        2>&1 | tee -a "$LOG"
}
step_phases() {
    timeout 200 $PY benchmarks/swap_in.py --batches 100 --hots 4096 --rows 656 --miss-rates 0.001 --phases \
        --pool-gib 4 --iters 11 --out "$OUT/swap_in-phases-main.csv" 2>&1 | grep -E "phases|case|bs" | tee -a "$LOG"
}
step_designs_fixed2() { FIXED_SEED=1 step_designs_fixed; }  # the same, drawn again: the spread
# Issue #27 item 4: our attention kernel against FlashMLA's SM90 sparse FP8 decode, same inputs, same
# process (benchmarks/flashmla_compare.py). FLASHMLA_SRC: the folder benchmarks/fetch_flashmla.sh filled,
# or that folder as FLASHMLA_SRC.tar.gz (smaller to carry: unpacked here first); FLASHMLA_ARGS: more options.
step_flashmla() {
    local src=${FLASHMLA_SRC:-.flashmla-src}
    if [ ! -d "$src" ] && [ -f "$src.tar.gz" ]; then mkdir -p "$src" && tar -xzf "$src.tar.gz" -C "$src" --strip-components=1; fi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv 2>&1 | tee -a "$LOG"
    MAX_JOBS=${MAX_JOBS:-8} timeout "${FLASHMLA_TIMEOUT:-480}" $PY benchmarks/flashmla_compare.py --flashmla "$src" \
        --verbose-build ${FLASHMLA_ARGS:-} --out "$OUT/flashmla_compare.csv" 2>&1 | tee -a "$LOG"
    echo "flashmla rc=${PIPESTATUS[0]}" | tee -a "$LOG"
}
# Where the wide FP8 kernel's time goes per CTA (a -DTIMELINE build; TIMELINE_ARGS: more options)
step_timeline() {
    timeout 200 $PY benchmarks/attention_timeline.py ${TIMELINE_ARGS:-} \
        --out "$OUT/attention_timeline.csv" 2>&1 | tee -a "$LOG"
}
for s in "$@"; do say "$s"; "step_$s"; done
say done

#!/usr/bin/env bash
# One GPU session for the kernels: build report, GPU tests, sanitizer, benchmarks.
# Usage (on the H200, from the repository root):  bash benchmarks/kernel_session.sh STEP...
# Steps: build, test-att, test-swap, sanitize, bench-att, bench-att-full, profile-att, bench-swap,
#        bench-swap-full, bench-swap-variants, test-swap-gpu, bench-swap-fixed, test-swap-new,
#        bench-swap-new, sanitize-new.  Logs and CSVs go to $OUT (default ./session-out); a short summary
#        is printed last.  Every step has its own time limit, so one hang cannot eat the session.
set -u
export PYTHONUNBUFFERED=1
# cubins built ahead on a machine with the same nvcc can be carried in .cache/kernels (keyed by
# source and flags, so a stale one is never used)
export HISPARSE_CACHE=${HISPARSE_CACHE:-/tmp/hcache} HISPARSE_KERNEL_CACHE=${HISPARSE_KERNEL_CACHE:-$PWD/.cache/kernels}
OUT=${OUT:-session-out}
mkdir -p "$OUT"
PY=${PY:-python3}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

step_build() {  # after a test step: report on the cubins the package built and cached
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
    $PY -c "from cupy_kernels import sparse_attention as a, swap_in as s; print(a.compiled_cubin()); print(s.compiled_cubin())"
    for f in "$HISPARSE_KERNEL_CACHE"/*.cubin; do
        echo "$f"
        cuobjdump -res-usage "$f" 2>&1 | grep -E "Function|REG|STACK" | paste - - | sed 's/  */ /g'
        cuobjdump -sass "$f" | awk '/Function :/{f=$3} /HGMMA|QGMMA/{c[f]++} END{for(k in c) print k": "c[k]" (H|Q)GMMA"}'
    done
}

step_test_att() { timeout 300 $PY -m pytest -q -p no:cacheprovider -rf tests/test_sparse_attention_gpu.py tests/test_sparse_attention_reference.py; }
step_test_swap_gpu() { timeout 120 $PY -m pytest -q -p no:cacheprovider -rf tests/test_swap_in_gpu.py; }
step_bench_swap_fixed() {
    timeout 60 $PY benchmarks/swap_in.py --batches 1 100 --hots 4096 --rows 656 --miss-rates 0.001 0.2 \
        --pool-gib 3 --iters 11 --out "$OUT/swap_in_fixed.csv"
}
step_test_swap() { timeout 300 $PY -m pytest -q -p no:cacheprovider -rf tests/test_swap_in_gpu.py tests/test_swap_in_reference.py; }
step_sanitize() {
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m pytest -q -p no:cacheprovider \
        tests/test_swap_in_gpu.py -k small_for_sanitizer
    echo "memcheck rc=$?"
    timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m pytest -q -p no:cacheprovider \
        tests/test_swap_in_gpu.py -k small_for_sanitizer
    echo "racecheck rc=$?"
}
step_bench_att() {
    timeout 300 $PY benchmarks/sparse_attention.py --batches 64 128 --heads 8 16 128 --no-ref --reps 20 \
        --out "$OUT/sparse_attention.csv"
}
step_profile_att() {  # counters of each variant: wide at B 64 H 128, narrow at B 128 H 8 (one launch each)
    timeout 120 ncu --clock-control none -k regex:mla_decode --metrics \
gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum \
        $PY benchmarks/profile_attention.py
    timeout 60 ncu --clock-control none -k regex:mla_decode --metrics gpu__time_duration.sum,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum \
        $PY benchmarks/profile_attention.py --batch 128 --heads 8
}
step_bench_att_full() { timeout 420 $PY benchmarks/sparse_attention.py --ref-reps 5 --out "$OUT/sparse_attention.csv"; }
step_bench_swap() {
    timeout 300 $PY benchmarks/swap_in.py --batches 1 100 --hots 4096 --rows 656 --miss-rates 0.001 0.2 1.0 \
        --breakdown --blocks-per-sm 2 1 --phases --pool-gib 4 --iters 11 --out "$OUT/swap_in.csv"
}
step_bench_swap_full() { timeout 300 $PY benchmarks/swap_in.py --hots 4096 --pool-gib 8 --iters 9 --out "$OUT/swap_in.csv"; }
step_bench_swap_variants() {
    timeout 200 $PY benchmarks/swap_in.py --batches 1 100 --hots 4096 --rows 656 --miss-rates 0.001 0.2 1.0 \
        --copy-orders flat request hybrid --breakdown --pool-gib 4 --iters 11 --out "$OUT/swap_in_variants.csv"
}

# Issue 18 swap-in session: GPU tests (every copy order, both duplicate checks, PDL), the
# benchmark of the new kernel beside the committed one (BASELINE_CU: that commit's swap_in.cu),
# behind a busy kernel with and without PDL, the alignment gather study and the phase cuts;
# then memcheck and racecheck of the flat and early orders, PDL launches included.
step_test_swap_new() { timeout 60 $PY -m pytest -q -p no:cacheprovider -rf tests/test_swap_in_gpu.py; }
step_bench_swap_new() {
    local base=()
    [ -n "${BASELINE_CU:-}" ] && base=(--baseline-cu "$BASELINE_CU")
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv
    timeout 95 $PY benchmarks/swap_in.py --batches 1 100 --hots 4096 --rows 656 --miss-rates 0.001 0.2 1.0 \
        --copy-orders early flat --dup-checks bitmap hash "${base[@]}" --after-kernel --after-max-regs 120 --rowcopy --phases \
        --pool-gib 4 --iters 11 --out "$OUT/swap_in_fixed.csv" --variants-out "$OUT/swap_in_variants.csv" \
        --after-out "$OUT/swap_in_after.csv" --rowcopy-out "$OUT/rowcopy.csv"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw --format=csv
}
step_sanitize_new() {
    local sel="small_for_sanitizer and (early or flat)"
    timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m pytest -q -p no:cacheprovider \
        tests/test_swap_in_gpu.py -k "$sel"
    echo "memcheck rc=$?"
    timeout 45 compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m pytest -q -p no:cacheprovider \
        tests/test_swap_in_gpu.py -k "$sel"
    echo "racecheck rc=$?"
}

# Logs of the steps named in $NOLOG stay out of $OUT (at most 8 files come back); their key lines
# still reach the summary.
for s in "$@"; do
    fn="step_${s//-/_}"
    log="$OUT/$s.log"
    case " ${NOLOG:-} " in *" $s "*) log="/tmp/$s.log" ;; esac
    t0=$(date +%s)
    set -o pipefail
    $fn 2>&1 | tee "$log"
    rc=$?
    set +o pipefail
    note "== $s: rc=$rc, $(($(date +%s) - t0)) s"
    grep -E "passed|failed|error|FAILED|rc=|GMMA|registers|spill" "$log" | tail -40 >>"$SUMMARY"
done
echo "================ summary"
cat "$SUMMARY"

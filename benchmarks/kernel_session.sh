#!/usr/bin/env bash
# One GPU session for the kernels: build report, GPU tests, sanitizer, benchmarks.
# Usage (on the H200, from the repository root):  bash benchmarks/kernel_session.sh STEP...
# Steps: build, test-att, test-swap, sanitize, bench-att, bench-att-full, profile-att, bench-swap,
#        bench-swap-full, bench-swap-variants, test-swap-gpu, bench-swap-fixed, test-swap-new,
#        bench-swap-new, sanitize-new, profile-swap, bench-swap-pools.  Logs and CSVs go to $OUT (default ./session-out); a short summary
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

# Issue 18, what limits the swap-in: ncu counters at bs 100, 656 B rows, 0.1 / 20 / 100% misses
# (full section set, one launch each, reports and their details pages), and the host pool made
# three ways (cudaHostAlloc; cudaHostRegister of 4 KB pages, as SGLang pins; of 2 MB transparent
# huge pages: the page-translation test), each with the gather study; the phase cuts once.
step_profile_swap() {
    ncu --query-metrics --chip gh100 2>&1 | grep -iE "pcie|sysmem|tlb|aperture" >"$OUT/profile-swap-metrics.txt"
    for rate in 0.001 0.2 1.0; do
        timeout 200 ncu --clock-control none --set full -k regex:swap_in_lru --launch-skip 3 --launch-count 1 \
            -f -o "$OUT/swap_in_ncu_$rate" $PY benchmarks/swap_in.py --batches 100 --hots 4096 --rows 656 \
            --miss-rates $rate --pool-gib 3 --iters 4 --out /tmp/ncu_swap.csv >/tmp/ncu_swap_$rate.log 2>&1
        echo "ncu $rate rc=$?"; tail -3 /tmp/ncu_swap_$rate.log
        ncu -i "$OUT/swap_in_ncu_$rate.ncu-rep" --page details >"$OUT/swap_in_ncu_$rate.txt" 2>&1
        grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|L2 Hit|Stall|One or More" \
            "$OUT/swap_in_ncu_$rate.txt" | head -20
    done
    timeout 120 ncu --clock-control none -k regex:swap_in_lru --launch-skip 3 --launch-count 1 --metrics \
gpu__time_duration.sum,pcie__read_bytes.sum,pcie__write_bytes.sum,lts__t_sectors_aperture_sysmem_op_read.sum,\
lts__t_sectors_aperture_sysmem_op_read_lookup_miss.sum,lts__d_sectors_fill_sysmem.sum,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warps_active.avg.pct_of_peak_sustained_active \
        $PY benchmarks/swap_in.py --batches 100 --hots 4096 --rows 656 --miss-rates 0.2 --pool-gib 3 --iters 4 \
        --out /tmp/ncu_swap.csv 2>&1 | grep -vE "^bs |^pool|^pinned|^launch" | tail -30
}
step_bench_swap_pools() {
    for b in ${POOL_BACKINGS:-alloc register register-thp}; do
        local extra=()
        [ "$b" = alloc ] && [ -z "${NO_PHASES:-}" ] && extra=(--phases)
        timeout 150 $PY benchmarks/swap_in.py --batches 1 100 --hots 4096 --rows 656 --miss-rates 0.001 0.2 1.0 \
            --rowcopy "${extra[@]}" --pool-gib 4 --iters 11 --pool-backing $b --out "/tmp/swap_in_pool_$b.csv" \
            --rowcopy-out "/tmp/rowcopy_$b.csv"
        echo "pool $b rc=$?"
    done
    python3 - "$OUT/swap_in_pools.csv" "$OUT/rowcopy_pools.csv" <<'PY'
import sys, pandas as pd
for out, stem in zip(sys.argv[1:], ("swap_in_pool", "rowcopy")):
    parts = [pd.read_csv(f"/tmp/{stem}_{b}.csv") for b in ("alloc", "register", "register-thp")
             if __import__("os").path.exists(f"/tmp/{stem}_{b}.csv")]
    if parts:
        pd.concat(parts).to_csv(out, index=False)
PY
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

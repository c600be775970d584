#!/usr/bin/env bash
# One GPU session for issue #27 items 2 / 5 and #30 item 2 (run on the H200 from the repo root):
#   bash benchmarks/gpu_session.sh STEP...
# Steps: build (C extension + cubins + resource report), test (GPU tests of the sharded kernels
# and the attention sequence, CPU reference tests), replay (benchmarks/gpu_replay.py),
# designs (benchmarks/swap_in_designs.py), seq (the attention sequence 3 times, plain),
# sanitize (compute-sanitizer memcheck / racecheck / initcheck / synccheck over the sequence).
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
for s in "$@"; do say "$s"; "step_$s"; done
say done

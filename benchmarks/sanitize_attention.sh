#!/usr/bin/env bash
# compute-sanitizer over the attention sequence, the first reports of each tool kept
# (bash benchmarks/sanitize_attention.sh; OUT, SAN_SHAPES, SAN_TOOLS, SAN_TIMEOUT, SAN_VARIANT optional:
# SAN_VARIANT=wsx runs the wide FP8 shapes on the crossover kernel).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-session-out}; mkdir -p "$OUT"
for tool in ${SAN_TOOLS:-synccheck memcheck initcheck racecheck}; do
    shapes=${SAN_SHAPES:-}
    timeout "${SAN_TIMEOUT:-120}" compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 12 \
        python3 -m cupy_kernels.graph_sequence --replays 1 --calls 1 ${shapes:+--shapes $shapes} \
        ${SAN_VARIANT:+--variant $SAN_VARIANT} >"$OUT/san_$tool.log" 2>&1
    echo "$tool rc=$?"
    grep -v -E "cupy_backends|Traceback|File \"|Exception ignored|excepthook|Original exception" "$OUT/san_$tool.log" | head -120
done

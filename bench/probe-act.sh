#!/usr/bin/env bash
# probe-act.sh — developer's probe on the lent GPU (after scripts/gpu-check.sh built build-gpu):
# every cuBLASLt algorithm for the products of linear + activation at the issue's shapes,
# then bench/probe_act.py (kernel-by-kernel time of fastgrad / eager / compile). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-probe}
mkdir -p "$OUT"
nvcc -O2 -arch=sm_90a bench/lt_algo_probe.cu -lcublasLt -lcublas -o /tmp/lt_probe || exit 1
for p in "TN 16384 8192 4096" "NN 4096 8192 16384" "NT 4096 16384 8192" \
         "TN 256 172032 128" "NN 128 172032 256" "NT 128 256 172032"; do
  /tmp/lt_probe $p > "$OUT/lt.log.tmp" 2>&1
  cat "$OUT/lt.log.tmp" >> "$OUT/lt_probe.log"
  head -2 "$OUT/lt.log.tmp"
  grep heuristic "$OUT/lt.log.tmp" | awk '{print $(NF-3), $0}' | sort -n | head -3 | cut -d' ' -f2-
  grep GemmEx "$OUT/lt.log.tmp"
done
rm -f "$OUT/lt.log.tmp"
PYTHONPATH="$PWD/python:${PYTHONPATH:-}" FASTGRAD_LIBRARY="$PWD/build-gpu/libfastgrad.so" \
  python3 bench/probe_act.py ${PROBE_ARGS:-} > "$OUT/probe_act.log" 2>&1
cat "$OUT/probe_act.log" | cut -c1-150

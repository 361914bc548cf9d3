#!/usr/bin/env bash
# probe-sk.sh — developer's probe on the lent GPU for the sm_90a GEMM's last-wave split: builds
# this tree (build-gpu) and, when _old holds an older tree (git archive REV | tar -x -C _old),
# its library too, side by side; runs test_linear_act (SKIP_TEST=1: not); then bench/probe_sk.py
# (split on / off / eager / compile, kernels each way) and, with _old, the old and the new build
# process by process against eager. ACTS, REPEATS, ROUNDS tune it. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-probe}
mkdir -p "$OUT"
build() { # dir, log name, targets...
  local d=$1 log="$OUT/build-$2.log"; shift 2
  cmake -S "$d" -B "$d/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTGRAD_CUDA=ON -DFASTGRAD_CUDA_ARCHS=90a \
    > "$log" 2>&1 && ninja -C "$d/build-gpu" "$@" >> "$log" 2>&1
}
build . new & new=$!
[ -d _old ] && { build _old old fastgrad & old=$!; }
wait $new || { tail -30 "$OUT/build-new.log"; echo "probe-sk: the build failed"; exit 1; }
[ -d _old ] && { wait $old || { tail -30 "$OUT/build-old.log"; echo "probe-sk: the old build failed"; exit 1; }; }
echo "builds done at ${SECONDS}s"
if [ -z "${SKIP_TEST:-}" ]; then
  build-gpu/tests/test_linear_act > "$OUT/test_linear_act.log" 2>&1
  echo "test_linear_act rc=$? $(grep -E 'checks,' "$OUT/test_linear_act.log" | tail -1) at ${SECONDS}s"
  grep -m 20 FAIL "$OUT/test_linear_act.log"
fi
run() { # library, args...
  local lib=$1; shift
  PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python:$PWD/bench" FASTGRAD_LIBRARY="$lib" python3 bench/probe_sk.py "$@"
}
run "$PWD/build-gpu/libfastgrad.so" "${ACTS:-gelu_tanh,silu,relu}" "${REPEATS:-3}" 2>&1 | grep -v Warning | tee "$OUT/probe_sk.log"
if [ -d _old ]; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    run "$PWD/_old/build-gpu/libfastgrad.so" "${ACTS:-gelu_tanh,silu,relu}" 1 OLD 2>&1 | grep round
    run "$PWD/build-gpu/libfastgrad.so" "${ACTS:-gelu_tanh,silu,relu}" 1 NEW 2>&1 | grep round
  done | tee "$OUT/probe_builds.log"
fi
echo "probe-sk: done at ${SECONDS}s"

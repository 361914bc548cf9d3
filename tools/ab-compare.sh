#!/usr/bin/env bash
# ab-compare.sh — same-run A/B of this tree (NEW) against an older one in _old/ (OLD) on the GPU
# machine, for any bench/compare.py family: builds both libraries side by side, runs test drivers
# and sanitize_ops groups on NEW, then bench/compare.py --only ONLY --no-compile for NEW and OLD in
# alternating processes, and optionally each side's kernel times under ncu. Put the older tree in
# _old first (git archive REV | tar -x -C _old; untracked, so the device run carries it; delete it
# before committing). Settings (environment):
#   TESTS="test_attention test_encoder"  drivers to build and run on NEW with FG_REQUIRE_CUDA=1
#   SANITIZE="attention"                 sanitize_ops groups under memcheck and racecheck (NEW)
#   ONLY=attn ROUNDS=2                   compare.py family and NEW/OLD rounds (ONLY= skips it)
#   NCU_K=qrow NCU_TARGET=tools/ncu_attn_short.py  kernel regex and target for each side's times
# Logs in $OUT (default /tmp/fastgrad-ab); the summary lines are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-ab}
TESTS=${TESTS-test_attention test_encoder}
SANITIZE=${SANITIZE-attention}
ONLY=${ONLY-attn}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
t0=$SECONDS
el() { echo "t=$((SECONDS - t0))s $*"; }
[ -d _old ] || { echo "ab-compare: no _old tree"; exit 1; }
cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTGRAD_CUDA=ON -DFASTGRAD_CUDA_ARCHS=90a)
# the torch extension too where CMake made its target (torch importable): without it the Python
# modules take their autograd.Function path, whose host cost differs
ext() { ninja -C build-gpu -t targets all 2>/dev/null | grep -q '^fastgrad_torchext:' && echo fastgrad_torchext; }
(cmake -S . -B build-gpu "${cfg[@]}" > "$OUT/cmake.log" 2>&1 && ninja -C build-gpu fastgrad $(ext) $TESTS > "$OUT/build.log" 2>&1) & n=$!
(cd _old && cmake -S . -B build-gpu "${cfg[@]}" > "$OUT/cmake-old.log" 2>&1 && ninja -C build-gpu fastgrad $(ext) > "$OUT/build-old.log" 2>&1) & o=$!
wait $n || { grep -B2 -A12 error "$OUT/build.log" | head -60; echo "ab-compare: the build failed"; exit 1; }
wait $o || { tail -20 "$OUT/build-old.log"; echo "ab-compare: the old build failed"; exit 1; }
el built
for t in $TESTS; do
  FG_REQUIRE_CUDA=1 timeout 300 "build-gpu/tests/$t" > "$OUT/$t.log" 2>&1
  echo "$t rc=$? $(tail -1 "$OUT/$t.log")"
  grep -m 8 FAIL "$OUT/$t.log" | cut -c1-300
done
if [ -n "$SANITIZE" ]; then
  cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  cc -std=gnu11 -O2 -DFG_TEST_HAVE_CUDA=1 -DFG_TEST_HAVE_SM90A=1 -Iinclude -Itests -I"$cuda_home/include" \
     tools/sanitize_ops.c tests/harness.c -Lbuild-gpu -lfastgrad -Wl,-rpath,"$PWD/build-gpu" -L"$cuda_home/lib64" \
     -lcudart -lm -o build-gpu/sanitize_ops > "$OUT/sanitize_build.log" 2>&1 || { tail -5 "$OUT/sanitize_build.log"; exit 1; }
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/sanitize_ops $SANITIZE > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'SUMMARY' "$OUT/$tool.log" | tail -1) $(grep -c '^sanitize_ops: ok' "$OUT/$tool.log") ok"
    grep -m 5 -E "^FAIL|Invalid|hazard" "$OUT/$tool.log" | cut -c1-200
  done
  el sanitized
fi
if [ -n "$ONLY" ]; then
  for r in $(seq 1 "$ROUNDS"); do
    for side in new old; do
      d=$PWD; [ $side = old ] && d=$PWD/_old
      (cd "$d" && PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so timeout 300 \
        python3 bench/compare.py --only "$ONLY" --no-compile --out "/tmp/ab-compare-$side" > "$OUT/compare-$side-$r.log" 2>&1)
      echo "== $side round $r"; grep -E "^SUMMARY" "$OUT/compare-$side-$r.log" | cut -c1-150
    done
  done
  el compared
fi
if [ -n "${NCU_K:-}" ]; then
  for side in new old; do
    d=$PWD; [ $side = old ] && d=$PWD/_old
    PYTHONPATH="$d/python" FASTGRAD_LIBRARY="$d/build-gpu/libfastgrad.so" timeout 200 ncu --clock-control none \
      -k "regex:$NCU_K" --csv --metrics gpu__time_duration.sum python3 "${NCU_TARGET:-tools/ncu_attn_short.py}" \
      > "$OUT/ncu-$side.csv" 2> "$OUT/ncu-$side.err"
    echo "== ncu $side (ns)"
    python3 - "$OUT/ncu-$side.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("ncu: no rows"); sys.exit()
h = rows[0]; k, v = h.index("Kernel Name"), h.index("Metric Value")
for r in rows[1:]:
    print(" ", r[k].rsplit("(", 1)[0].split("::")[-1][:70], r[v])
PY
  done
  el ncu
fi

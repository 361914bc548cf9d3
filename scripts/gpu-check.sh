#!/usr/bin/env bash
# gpu-check.sh — everything the lent GPU machine is for, in one call: build for sm_90a,
# run every test driver on the GPU (and the > 2^31-element cases), run the CUDA tests
# under compute-sanitizer memcheck, run the Python suite against torch when present,
# run the benchmark, and print a short summary last. Full logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-gpu-check}
mkdir -p "$OUT"
summary=()
note() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/gpu.txt" 2>&1
note "gpu: $(head -1 "$OUT/gpu.txt")"

build=build-gpu
if ! { cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTGRAD_CUDA=ON \
         -DFASTGRAD_CUDA_ARCHS="${FASTGRAD_CUDA_ARCHS:-90a}" && ninja -C $build; } > "$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"
  echo "SUMMARY: build FAILED (log in $OUT/build.log)"
  exit 1
fi
note "build: ok ($(grep -c 'Building' "$OUT/build.log") steps)"

status=0
for t in core linear matmul outer header_cxx; do
  bin=$build/tests/test_$t
  if [ "$t" = linear ]; then env FG_TEST_LARGE=1 $bin > "$OUT/test_$t.log" 2>&1; else $bin > "$OUT/test_$t.log" 2>&1; fi
  rc=$?
  [ $rc -eq 0 ] || status=1
  line=$(grep -E "checks,|header OK" "$OUT/test_$t.log" | tail -1)
  note "test $t: rc=$rc ${line}"
  [ $rc -eq 0 ] || grep -m 15 FAIL "$OUT/test_$t.log"
done

if command -v compute-sanitizer >/dev/null 2>&1; then
  for t in linear matmul outer; do
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 $build/tests/test_$t \
      > "$OUT/memcheck_$t.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    note "memcheck $t: rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_$t.log" | tail -1) $(grep -E 'checks,' "$OUT/memcheck_$t.log" | tail -1)"
  done
else
  note "memcheck: compute-sanitizer not found"
fi

if [ -d python/tests ]; then
  PYTHONPATH="$PWD/python" FASTGRAD_LIBRARY="$PWD/$build/libfastgrad.so" python3 -m pytest -q python/tests \
    > "$OUT/pytest.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "pytest: rc=$rc $(tail -1 "$OUT/pytest.log")"
fi

$build/bench/fastgrad-bench ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
rc=$?
[ $rc -eq 0 ] || status=1
cat "$OUT/bench.log"
if [ -f bench/compare.py ] && [ -z "${SKIP_COMPARE:-}" ]; then
  PYTHONPATH="$PWD/python" FASTGRAD_LIBRARY="$PWD/$build/libfastgrad.so" python3 bench/compare.py --out "$OUT" \
    > "$OUT/compare.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "compare.py: rc=$rc (table in $OUT/benchmarks.md)"
fi

echo
echo "==================== SUMMARY ===================="
for s in "${summary[@]}"; do echo "$s"; done
grep -E "^CHECK|^CEILING" "$OUT/bench.log"
echo "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status

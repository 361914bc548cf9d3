#!/usr/bin/env bash
# gpu-check.sh — everything the lent GPU machine is for, in one call: build for sm_90a,
# run every test driver on the GPU (with the > 2^31-element cases, FG_TEST_LARGE=1) where a
# skipped CUDA case is a failure (FG_REQUIRE_CUDA=1), run every driver under
# compute-sanitizer memcheck and every own CUDA kernel under synccheck and racecheck
# (tools/sanitize_ops.c: each once, at a small shape; it fails when a case stops launching
# the kernel it is for), run the Python suite against torch when present, run the
# benchmark, and print a short summary last. compute-sanitizer missing is a failure.
# Full logs go to $OUT.
# Knobs for partial runs: TESTS / MEMCHECK (driver names; default: every tests/test_*.c),
# SKIP_SANITIZE=1 (no synccheck / racecheck), SKIP_PYTEST=1, SKIP_BENCH=1, SKIP_COMPARE=1,
# BENCH_ARGS (e.g. --only-logp), COMPARE_ARGS (passed to bench/compare.py). Everything at once
# does not fit the device's 600 s a command on a fresh machine: run it as two calls,
# SKIP_BENCH=1 SKIP_COMPARE=1 then TESTS= MEMCHECK= SKIP_SANITIZE=1 SKIP_PYTEST=1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-gpu-check}
LOG="$OUT/logs"   # packed into $OUT/logs.tar.gz at the end (the device returns few files)
mkdir -p "$LOG"
summary=()
note() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader > "$LOG/gpu.txt" 2>&1
note "gpu: $(head -1 "$LOG/gpu.txt")"

build=build-gpu
if ! { cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTGRAD_CUDA=ON \
         -DFASTGRAD_CUDA_ARCHS="${FASTGRAD_CUDA_ARCHS:-90a}" && ninja -C $build; } > "$LOG/build.log" 2>&1; then
  tail -30 "$LOG/build.log"
  echo "SUMMARY: build FAILED (log in $LOG/build.log)"
  exit 1
fi
note "build: ok ($(grep -c 'Building' "$LOG/build.log") steps)"

status=0
drivers=$(cd tests && ls test_*.c | sed 's/^test_//; s/\.c$//')   # every driver, as ctest has them
for t in ${TESTS-$drivers header_cxx}; do
  bin=$build/tests/test_$t
  [ "$t" = header_cxx ] && bin=$build/tests/test_header_cxx
  env FG_TEST_LARGE=1 FG_REQUIRE_CUDA=1 $bin > "$LOG/test_$t.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  line=$(grep -E "checks,|header OK" "$LOG/test_$t.log" | tail -1)
  note "test $t: rc=$rc ${line}"
  [ $rc -eq 0 ] || grep -m 15 FAIL "$LOG/test_$t.log"
done

if command -v compute-sanitizer >/dev/null 2>&1; then
  for t in ${MEMCHECK-$drivers}; do
    FG_REQUIRE_CUDA=1 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 $build/tests/test_$t \
      > "$LOG/memcheck_$t.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    note "memcheck $t: rc=$rc $(grep -E 'ERROR SUMMARY' "$LOG/memcheck_$t.log" | tail -1) $(grep -E 'checks,' "$LOG/memcheck_$t.log" | tail -1)"
  done
else
  status=1
  note "memcheck: FAILED, compute-sanitizer not found"
fi

if [ -z "${SKIP_SANITIZE:-}" ]; then
  # every own kernel once (tools/sanitize_ops.c), built against this build's library
  cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  sm90=""
  case ",${FASTGRAD_CUDA_ARCHS:-90a}," in *90a*) sm90=-DFG_TEST_HAVE_SM90A=1 ;; esac
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    status=1
    note "synccheck / racecheck: FAILED, compute-sanitizer not found"
  elif ! cc -std=gnu11 -O2 -DFG_TEST_HAVE_CUDA=1 $sm90 -Iinclude -Itests -I"$cuda_home/include" tools/sanitize_ops.c \
         tests/harness.c -L$build -lfastgrad -L"$cuda_home/lib64" -lcudart -lm -Wl,-rpath,"$PWD/$build" \
         -o $build/sanitize_ops > "$LOG/sanitize_build.log" 2>&1; then
    status=1
    note "sanitize_ops: build FAILED ($(tail -3 "$LOG/sanitize_build.log"))"
  else
    for tool in synccheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 9 $build/sanitize_ops > "$LOG/$tool.log" 2>&1
      rc=$?
      # racecheck also reports a hazard inside cuBLAS's own sm_90 kernels (nvjet_*: TMA /
      # mbarrier ordering it does not model): only reports naming our kernels count
      own=$(grep -E "Race reported|Barrier error|Error:" "$LOG/$tool.log" | grep -vc "nvjet_")
      ok=$(grep -c "^sanitize_ops: ok" "$LOG/$tool.log")
      { [ "$own" -eq 0 ] && [ "$ok" -eq 1 ]; } || status=1
      note "$tool (every own kernel): rc=$rc, reports naming our kernels: $own, program ok: $ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool.log" | tail -1)"
      [ "$ok" -eq 1 ] || grep -E "^FAIL" "$LOG/$tool.log" | head -10
    done
  fi
fi

if [ -d python/tests ] && [ -z "${SKIP_PYTEST:-}" ]; then
  PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python:${PYTHONPATH:-}" FASTGRAD_LIBRARY="$PWD/$build/libfastgrad.so" python3 -m pytest -q -rs python/tests \
    > "$LOG/pytest.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "pytest: rc=$rc $(tail -1 "$LOG/pytest.log")"
  [ $rc -eq 0 ] || grep -E "^(FAILED|ERROR)|^E  " "$LOG/pytest.log" | head -30
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  $build/bench/fastgrad-bench ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  cat "$OUT/bench.log"
fi
if [ -f bench/compare.py ] && [ -z "${SKIP_COMPARE:-}" ]; then
  PYTHONPATH="$PWD/python:${PYTHONPATH:-}" FASTGRAD_LIBRARY="$PWD/$build/libfastgrad.so" python3 bench/compare.py --out "$OUT" ${COMPARE_ARGS:-} \
    > "$LOG/compare.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "compare.py: rc=$rc (table in $OUT/benchmarks.md)"
  grep -E "ms  " "$LOG/compare.log"
  while read -r l; do note "$l"; done < <(grep -E "^SUMMARY " "$LOG/compare.log" | sed 's/^SUMMARY //')
  [ $rc -eq 0 ] || tail -20 "$LOG/compare.log"
fi

echo
echo "==================== SUMMARY ===================="
for s in "${summary[@]}"; do echo "$s"; done
[ -f "$OUT/bench.log" ] && grep -E "^CHECK|^CEILING" "$OUT/bench.log"
echo "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
exit $status

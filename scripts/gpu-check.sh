#!/usr/bin/env bash
# gpu-check.sh — everything the lent GPU machine is for, in one call: build for sm_90a,
# run every test driver on the GPU (with the > 2^31-element cases, FG_TEST_LARGE=1) where a
# skipped CUDA case is a failure (FG_REQUIRE_CUDA=1), run every driver under
# compute-sanitizer memcheck and every own CUDA kernel under synccheck and racecheck
# (tools/sanitize_ops.c: each once, at a small shape; it fails when a case stops launching
# the kernel it is for), run the Python suite against torch when present, run the
# benchmark, and print a short summary last. compute-sanitizer missing is a failure.
# Full logs go to $OUT.
# Knobs for partial runs: TESTS / MEMCHECK (driver names; default: every tests/test_*.c; MEMCHECK_JOBS
# drivers under memcheck at once, default 4),
# SKIP_SANITIZE=1 (no synccheck / racecheck), SKIP_PYTEST=1, SKIP_BENCH=1, SKIP_COMPARE=1,
# BENCH_ARGS (e.g. --only-logp), COMPARE_ARGS (passed to bench/compare.py). Everything at once
# does not fit the device's 600 s a command on a fresh machine: run it as two calls,
# SKIP_BENCH=1 SKIP_COMPARE=1 then TESTS= MEMCHECK= SKIP_SANITIZE=1 SKIP_PYTEST=1.
# memcheck of linear_act and linear runs longest (neither finished within 470 s beside four other
# drivers): give them a call of their own, TESTS= MEMCHECK="linear_act linear" SKIP_SANITIZE=1 SKIP_PYTEST=1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-gpu-check}
LOG="$OUT/logs"   # packed into $OUT/logs.tar.gz at the end (the device returns few files)
mkdir -p "$LOG"
summary=()
note() { summary+=("$1"); echo "... $1"; }   # echoed too: a run cut off at its limit still shows how far it got

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
  # MEMCHECK_JOBS drivers at a time (the tool's instrumentation is bound by the host's cores, not
  # the GPU; serially every driver no longer fits one call), each reported as it ends
  memcheck_one() {
    FG_REQUIRE_CUDA=1 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 $build/tests/test_$1 \
      > "$LOG/memcheck_$1.log" 2>&1
    local line="memcheck $1: rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/memcheck_$1.log" | tail -1) $(grep -E 'checks,' "$LOG/memcheck_$1.log" | tail -1)"
    echo "$line" > "$LOG/memcheck_$1.note"
    echo "... $line"
  }
  running=0
  for t in ${MEMCHECK-$drivers}; do
    memcheck_one "$t" &
    running=$((running + 1))
    if [ $running -ge "${MEMCHECK_JOBS:-4}" ]; then wait -n; running=$((running - 1)); fi
  done
  wait
  for t in ${MEMCHECK-$drivers}; do
    line=$(cat "$LOG/memcheck_$t.note" 2>/dev/null)
    summary+=("${line:-memcheck $t: no result}")
    case "$line" in "memcheck $t: rc=0 "*) ;; *) status=1 ;; esac
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
    # Does this racecheck model bar.arrive? tools/racecheck_probe.cu hands shared memory over the
    # way act_bwd_tile_kernel does (bar.arrive -> bar.sync, ordered by PTX) and, as a control,
    # with bar.sync on both sides. Reports on the first and none on the second: the tool does
    # not see that ordering, and its reports on act_bwd_tile_kernel (the one kernel handing over
    # through bar.arrive) are listed but cannot be judged by it.
    arrive_blind=0
    if nvcc -arch=native -O2 -o $build/racecheck_probe tools/racecheck_probe.cu > "$LOG/racecheck_probe.log" 2>&1; then
      compute-sanitizer --tool racecheck $build/racecheck_probe >> "$LOG/racecheck_probe.log" 2>&1
      p_arrive=$(grep -E "Race reported" "$LOG/racecheck_probe.log" | grep -c "probe_arrive_kernel")
      p_sync=$(grep -E "Race reported" "$LOG/racecheck_probe.log" | grep -c "probe_sync_kernel")
      p_ok=$(grep -c "^racecheck_probe: ok" "$LOG/racecheck_probe.log")
      [ "$p_arrive" -gt 0 ] && [ "$p_sync" -eq 0 ] && [ "$p_ok" -eq 1 ] && arrive_blind=1
      note "racecheck probe: reports on a correct bar.arrive hand-over $p_arrive, on bar.sync $p_sync, result ok $p_ok: racecheck $([ $arrive_blind -eq 1 ] && echo 'does NOT model bar.arrive' || echo 'models bar.arrive')"
    else
      note "racecheck probe: build failed ($(tail -2 "$LOG/racecheck_probe.log")); bar.arrive reports count as errors"
    fi
    for tool in synccheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 9 $build/sanitize_ops > "$LOG/$tool.log" 2>&1
      rc=$?
      # racecheck also reports a hazard inside cuBLAS's own sm_90 kernels (nvjet_*: TMA /
      # mbarrier ordering it does not model): only reports naming our kernels count
      reports=$(grep -E "Race reported|Barrier error|Error:" "$LOG/$tool.log" | grep -v "nvjet_")
      blind=0
      if [ "$tool" = racecheck ] && [ $arrive_blind -eq 1 ]; then
        blind=$(printf '%s\n' "$reports" | grep -c "act_bwd_tile_kernel")
        reports=$(printf '%s\n' "$reports" | grep -v "act_bwd_tile_kernel")
      fi
      own=$(printf '%s\n' "$reports" | grep -c .)
      ok=$(grep -c "^sanitize_ops: ok" "$LOG/$tool.log")
      { [ "$own" -eq 0 ] && [ "$ok" -eq 1 ]; } || status=1
      note "$tool (every own kernel): rc=$rc, reports naming our kernels: $own, program ok: $ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool.log" | tail -1)"
      [ "$blind" -eq 0 ] || note "$tool: $blind report(s) on act_bwd_tile_kernel's bar.arrive hand-over NOT judged (the probe shows racecheck cannot see that ordering)"
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

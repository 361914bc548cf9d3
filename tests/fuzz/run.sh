#!/usr/bin/env bash
# run.sh — builds the libFuzzer target over the public API (tests/fuzz/fuzz_api.c) with
# clang on the CPU backend under AddressSanitizer + UndefinedBehaviorSanitizer, in its own
# build dir, and runs it for FUZZ_SECONDS (default 120) from the seed corpus. Any finding
# (a sanitizer report, a broken error contract, a hang, a print) fails the run and leaves
# the reproducer in $FUZZ_BUILD/crashes/. Installs clang when it is missing (Debian).
#   FUZZ_SECONDS=1800 tests/fuzz/run.sh          a longer campaign
#   FUZZ_JOBS=2                                  parallel fuzzing processes
#   FUZZ_COVERAGE=1                              also report llvm-cov line coverage of src/
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${FUZZ_BUILD:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-120}
jobs=${FUZZ_JOBS:-1}

if ! command -v clang >/dev/null 2>&1 ||
   ! find "$(dirname "$(readlink -f "$(command -v clang)")")/../lib" -name 'libclang_rt.fuzzer-*.a' 2>/dev/null | grep -q .; then
  echo "fuzz: installing clang"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends clang libomp-dev llvm >/dev/null
fi

blas_inc=$(dirname "$(ls /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/*/*/cblas.h 2>/dev/null | head -1)")
mkdir -p "$build" "$build/corpus" "$build/crashes"
srcs=$(ls src/core/*.c src/ops/*.c src/cpu/*.c)
common=(-std=gnu11 -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc/core -I"$blas_inc" -fopenmp)
# -fsanitize=fuzzer instruments the library and links libFuzzer's main
clang "${common[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  $srcs tests/fuzz/fuzz_api.c -o "$build/fuzz_api" -lopenblas -lm
cp -n tests/fuzz/corpus/* "$build/corpus/" 2>/dev/null || true

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:abort_on_error=1:handle_abort=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1
echo "fuzz: running $seconds s ($jobs job(s)) from $(ls tests/fuzz/corpus | wc -l) seeds"
set +e
if [ "$jobs" -gt 1 ]; then
  (cd "$build" && ./fuzz_api -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=512 \
     -jobs="$jobs" -workers="$jobs" -artifact_prefix="$build/crashes/" -print_final_stats=1 corpus)
  rc=$?
else
  "$build/fuzz_api" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=512 \
    -artifact_prefix="$build/crashes/" -print_final_stats=1 "$build/corpus" 2>&1 | tee "$build/fuzz.log" |
    grep -E "^#[0-9]+ +(INITED|DONE|pulse)|FINDING|ERROR|SUMMARY|stat::|runtime error" | tail -40
  rc=${PIPESTATUS[0]}
fi
set -e
if [ "$rc" -ne 0 ] || ls "$build"/crashes/* >/dev/null 2>&1; then
  echo "fuzz: FAILED (exit $rc); reproducers:" "$build"/crashes/* >&2
  [ -f "$build/fuzz.log" ] && grep -E -A30 "FINDING|ERROR: |runtime error" "$build/fuzz.log" | head -60 >&2
  exit 1
fi

if [ "${FUZZ_COVERAGE:-0}" = 1 ]; then
  clang "${common[@]}" -fprofile-instr-generate -fcoverage-mapping -fsanitize=fuzzer \
    $srcs tests/fuzz/fuzz_api.c -o "$build/fuzz_cov" -lopenblas -lm
  rm -f "$build"/cov-*.profraw
  LLVM_PROFILE_FILE="$build/cov-%p.profraw" "$build/fuzz_cov" -runs=0 "$build/corpus" >/dev/null 2>&1
  llvm-profdata merge -sparse "$build"/cov-*.profraw -o "$build/cov.profdata"
  llvm-cov report "$build/fuzz_cov" -instr-profile="$build/cov.profdata" $srcs | tail -n 40
fi
echo "fuzz: no finding in $seconds s"

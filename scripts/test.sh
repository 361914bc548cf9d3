#!/usr/bin/env bash
# test.sh — the README's test command: installs what is missing, builds (with the CUDA
# backend when nvcc is present; its cases report SKIP without a GPU), runs every test,
# then builds the CPU backend under AddressSanitizer + UndefinedBehaviorSanitizer and
# runs the tests again there, then runs the fuzz target over the public API for a bounded
# time under the same sanitizers (tests/fuzz/run.sh; FUZZ_SECONDS, default 120): any finding
# fails the run. Says whether the CUDA backend was compiled, first and last.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)

cuda=$(cmake -S . -B build -DCMAKE_BUILD_TYPE=Release | sed -n 's/.*fastgrad: CUDA backend //p')
cuda_line="CUDA backend compiled: ${cuda:-unknown}"
[ "$cuda" != ON ] || cuda_line+=" (its cases SKIP without a GPU)"
echo "test.sh: $cuda_line"
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFASTGRAD_CUDA=OFF -DFASTGRAD_SANITIZE=ON \
      -DFASTGRAD_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure

FUZZ_SECONDS=${FUZZ_SECONDS:-120} tests/fuzz/run.sh

if [ -d python/tests ]; then
  PYTHONPATH="$PWD/python" FASTGRAD_LIBRARY="$PWD/build/libfastgrad.so" python3 -m pytest -q python/tests
fi
echo "test.sh: all tests passed; $cuda_line"

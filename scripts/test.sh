#!/usr/bin/env bash
# test.sh — the README's test command: installs what is missing, builds (with the CUDA
# backend when nvcc is present; its cases report SKIP without a GPU), runs every test,
# then builds the CPU backend under AddressSanitizer + UndefinedBehaviorSanitizer and
# runs the tests again there.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFASTGRAD_CUDA=OFF -DFASTGRAD_SANITIZE=ON \
      -DFASTGRAD_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure

if [ -d python/tests ]; then
  PYTHONPATH="$PWD/python" FASTGRAD_LIBRARY="$PWD/build/libfastgrad.so" python3 -m pytest -q python/tests
fi
echo "test.sh: all tests passed"

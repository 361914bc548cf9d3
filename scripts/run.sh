#!/usr/bin/env bash
# run.sh — the README's main command. For now: build, then run the benchmark in its
# quick CPU mode and print its table (on a machine with a GPU, run
# build/bench/fastgrad-bench without --quick, or scripts/gpu-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)"
build/bench/fastgrad-bench --quick

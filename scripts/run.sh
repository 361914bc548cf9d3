#!/usr/bin/env bash
# run.sh — the README's main command: builds fastgrad and fastgrad-train, then trains PatchTST
# on ETTh1 (data/ETTh1.csv, committed) on the CPU — CUDA when a GPU is present — and prints the
# test MSE / MAE beside the published figures. The default is a short run (the reference model,
# 4 epochs: a few minutes on 2 CPU cores); --full is the reference run (PatchTST/42, 100 epochs,
# the published configuration). Other arguments go to fastgrad-train (--help lists them). The
# outputs go to build/run/: the checkpoint, the JSON log, the test forecasts and, with
# matplotlib, forecast.png and loss.png. (The benchmark: build/bench/fastgrad-bench, or
# scripts/gpu-check.sh on a GPU machine.)
#
#   scripts/run.sh                          # the short run
#   scripts/run.sh --full                   # the reference run (a GPU makes it seconds)
#   scripts/run.sh --full --horizon 336     # another row of the published table
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
args=()
for a in "$@"; do
  if [ "$a" = --full ]; then full=1; else args+=("$a"); fi
done
scripts/deps.sh
# OpenMP threads that finish a region sleep instead of spinning: on a machine whose cores other
# work shares, a spinning thread holds a core the descheduled one needs (docs/decisions.md 139)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target fastgrad-train
out=build/run
mkdir -p "$out"
short=(--epochs 4)
[ "$full" = 1 ] && short=()
build/train/fastgrad-train --data data/ETTh1.csv --checkpoint "$out/etth1.ckpt" --log "$out/etth1.jsonl" \
  --predict "$out/etth1_forecast.csv" "${short[@]}" "${args[@]}"
if python3 -c "import matplotlib" >/dev/null 2>&1; then
  python3 scripts/plot.py --predict "$out/etth1_forecast.csv" --log "$out/etth1.jsonl" --out "$out" >/dev/null &&
    echo "run.sh: plots in $out/forecast.png and $out/loss.png"
fi

#!/usr/bin/env bash
# cuda_vs_cpu.sh — fastgrad-train on the GPU against the CPU (for a machine with one; elsewhere it
# reports a skip, exit 77): the same short PatchTST run (same seed, same initial weights, same
# data order and dropout masks) on both backends must end within f32 rounding of each other —
# every op's CUDA kernels against its CPU reference, through a whole training run; then the
# backward against central differences on the GPU (f32, --gradcheck). Usage: cuda_vs_cpu.sh BIN DATA
set -u
BIN=${1:?usage: $0 path/to/fastgrad-train data.csv}
DATA=${2:?usage: $0 path/to/fastgrad-train data.csv}
WORK=$(mktemp -d /tmp/fgt-cuda.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if ! "$BIN" --device cuda --data "$DATA" --epochs 0 --quiet --checkpoint "$WORK/probe.ckpt" >/dev/null 2>"$WORK/probe.err"; then
  grep -q "no CUDA device\|without CUDA" "$WORK/probe.err" && { echo "SKIP: no CUDA device here"; exit 77; }
  echo "FAIL: the probe run: $(cat "$WORK/probe.err")"; exit 1
fi
RUN=(--data "$DATA" --lookback 96 --horizon 24 --d-model 16 --heads 4 --layers 2 --d-ff 32 --batch 64 --epochs 1
     --seed 3 --quiet)
fails=0
for dev in cpu cuda; do
  "$BIN" "${RUN[@]}" --device $dev --checkpoint "$WORK/$dev.ckpt" > "$WORK/$dev.out" 2> "$WORK/$dev.err" ||
    { echo "FAIL: the $dev run: $(cat "$WORK/$dev.err")"; fails=$((fails + 1)); }
done
val() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }
for k in test_mse test_mae; do
  a=$(val $k "$WORK/cpu.out"); b=$(val $k "$WORK/cuda.out")
  awk -v a="$a" -v b="$b" -v k=$k 'BEGIN { d = (a - b) / a; if (d < 0) d = -d;
    printf "%s: cpu %s cuda %s (relative difference %.2e)\n", k, a, b, d; exit !(a != "" && d <= 2e-3) }' ||
    { echo "FAIL: $k differs beyond f32 drift"; fails=$((fails + 1)); }
done
"$BIN" --gradcheck --device cuda --data "$DATA" --lookback 64 --horizon 16 --d-model 8 --heads 2 --layers 2 --d-ff 16 \
  --patch-len 8 --stride 4 --batch 8 > "$WORK/gc.out" 2>&1 || { cat "$WORK/gc.out"; fails=$((fails + 1)); }
tail -1 "$WORK/gc.out"
[ "$fails" = 0 ] && { echo "cuda_vs_cpu.sh: passed"; exit 0; }
echo "cuda_vs_cpu.sh: $fails failed"; exit 1

#!/usr/bin/env bash
# train-table.sh — fastgrad-train's acceptance run, for the machine with the GPU: the reference
# PatchTST/42 configuration on ETTh1 at horizons 96, 192, 336 and 720 (test MSE / MAE over every
# test window and over the drop-last batches, beside the published figures, and the training
# time), the PyTorch reference of the same model (bench/patchtst_torch.py) at horizon 96 in the
# same call for the side-by-side time, and fastgrad-train's forecasts checked against PyTorch
# with the same weights (bench/patchtst_check.py). Writes $OUT/train-table.md (a markdown table
# for docs/), $OUT/plots-h<H>/{forecast,loss}.png (scripts/plot.py, with matplotlib) and the
# runs' logs; prints the table last.
# Knobs: HORIZONS (default "96 192 336 720"), DEVICE (cuda), DTYPE (f32), EPOCHS (default: the
# reference's 100), TRAIN_ARGS (more flags for both programs, e.g. a smaller model for a dry run),
# SKIP_TORCH=1, TORCH_ARGS (e.g. --compile), BUILD (build-gpu, as gpu-check.sh), DATA (data/ETTh1.csv).
# One horizon takes ≈ 15–60 s of training plus start-up; the PyTorch run ≈ 100 s on an H100: split
# the call (HORIZONS="96 192", then HORIZONS="336 720" SKIP_TORCH=1) when the 600 s limit is near.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-train-table}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-f32}
HORIZONS=${HORIZONS:-96 192 336 720}
DATA=${DATA:-data/ETTh1.csv}
epochs=()
[ -n "${EPOCHS:-}" ] && epochs=(--epochs "$EPOCHS")
read -r -a extra <<<"${TRAIN_ARGS:-}"

if [ ! -x "$BUILD/train/fastgrad-train" ]; then
  gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFASTGRAD_CUDA=ON \
    -DFASTGRAD_CUDA_ARCHS="${FASTGRAD_CUDA_ARCHS:-90a}" >"$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" -j "$(nproc)" --target fastgrad-train >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; echo "train-table: build FAILED"; exit 1; }
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
published() { case $1 in 96) echo "0.375 / 0.399" ;; 192) echo "0.414 / 0.421" ;; 336) echo "0.431 / 0.436" ;;
  720) echo "0.449 / 0.466" ;; *) echo "–" ;; esac; }
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }

table="$OUT/train-table.md"
{
  echo "fastgrad-train on $(basename "$DATA"), PatchTST/42 reference configuration (look-back 336, 3 layers, d_model 16,"
  echo "4 heads, d_ff 128, dropout 0.3, batch 128, Adam 1e-4 type3, ${EPOCHS:-100} epochs${TRAIN_ARGS:+; $TRAIN_ARGS}), $DEVICE $DTYPE,"
  echo "${gpu:-no GPU}, $(date -u +%F)."
  echo
  echo "| horizon | test MSE | test MAE | drop-last MSE | drop-last MAE | published MSE / MAE | best epoch | training (s) | s / epoch |"
  echo "|---|---|---|---|---|---|---|---|---|"
} >"$table"
status=0
for H in $HORIZONS; do
  log="$OUT/h$H"
  "$BUILD/train/fastgrad-train" --data "$DATA" --horizon "$H" --device "$DEVICE" --dtype "$DTYPE" "${epochs[@]}" \
    "${extra[@]}" --checkpoint "$log.ckpt" --log "$log.jsonl" --predict "$log.csv" >"$log.out" 2>"$log.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    status=1
    echo "| $H | run failed (exit $rc): $(tail -1 "$log.err") |||||||" >>"$table"
    continue
  fi
  # "training: 100 epochs in 12.3 s (0.123 s/epoch, ...); best validation MSE 0.7 at epoch 12"
  train_line=$(grep '^training:' "$log.out" "$log.err" -h | tail -1)
  secs=$(echo "$train_line" | sed -n 's/.* in \([0-9.]*\) s (\([0-9.]*\) s\/epoch.*/\1/p')
  per=$(echo "$train_line" | sed -n 's/.* in \([0-9.]*\) s (\([0-9.]*\) s\/epoch.*/\2/p')
  best=$(echo "$train_line" | sed -n 's/.*at epoch \([0-9]*\).*/\1/p')
  printf '| %s | %.4f | %.4f | %.4f | %.4f | %s | %s | %s | %s |\n' "$H" "$(field test_mse "$log.out")" \
    "$(field test_mae "$log.out")" "$(field droplast_mse "$log.out")" "$(field droplast_mae "$log.out")" \
    "$(published "$H")" "$best" "$secs" "$per" >>"$table"
  if python3 -c "import matplotlib" >/dev/null 2>&1; then # the README's pictures
    mkdir -p "$OUT/plots-h$H"
    python3 scripts/plot.py --predict "$log.csv" --log "$log.jsonl" --out "$OUT/plots-h$H" >/dev/null 2>&1
  fi
  if python3 -c "import torch" >/dev/null 2>&1; then
    python3 bench/patchtst_check.py --data "$DATA" --checkpoint "$log.ckpt" --predict "$log.csv" \
      >"$log.check" 2>&1 || status=1
  fi
done
th=96 # the PyTorch run: horizon 96, or the first one asked for
case " $HORIZONS " in *" 96 "*) ;; *) th=${HORIZONS%% *} ;; esac
if [ -z "${SKIP_TORCH:-}" ] && python3 -c "import torch" >/dev/null 2>&1; then
  python3 bench/patchtst_torch.py --data "$DATA" --horizon "$th" --device "$DEVICE" "${epochs[@]}" \
    "${extra[@]}" ${TORCH_ARGS:-} >"$OUT/torch.out" 2>&1 || status=1
  tl=$(grep '^training time' "$OUT/torch.out" | tail -1)
  {
    echo
    echo "PyTorch $(python3 -c 'import torch; print(torch.__version__)') eager${TORCH_ARGS:+ ($TORCH_ARGS)}, the same model and run at horizon $th, same machine:"
    echo "test MSE $(field test_mse "$OUT/torch.out"), MAE $(field test_mae "$OUT/torch.out"); $tl."
  } >>"$table"
fi
for f in "$OUT"/h*.check; do
  [ -e "$f" ] && echo "forecasts vs PyTorch, $(basename "$f" .check): $(cat "$f")" >>"$table"
done
cat "$table"
exit $status

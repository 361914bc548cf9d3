#!/usr/bin/env bash
# resume.sh — an interrupted fastgrad-train run, resumed, ends bitwise where an uninterrupted
# one ends (CPU, the same thread count): the same final line (test MSE / MAE, both variants, and
# the FNV-1a hash of the best weights) and the same final checkpoint, byte for byte. The
# interruptions are real signals raised by the program itself at a chosen step
# (FGT_TEST_RAISE=SIGNAL@STEP, the test hook): SIGINT (the handler saves mid-epoch and exits
# 130), SIGKILL (nothing saved: the run resumes from the last periodic checkpoint), three in a
# row, and at the first step; then a small PatchTST in bf16. The --log of the interrupted-and-
# resumed runs holds the same per-epoch metrics as the uninterrupted run's (times aside), each
# epoch once.
source "$(dirname "$0")/lib.sh"

make_csv "$WORK/data.csv" 900
RUN=(--data "$WORK/data.csv" "${SHORT[@]}" --epochs 4 --save-every 7)

"$BIN" "${RUN[@]}" --checkpoint "$WORK/ref.ckpt" --log "$WORK/ref.jsonl" >"$WORK/ref.out" 2>"$WORK/ref.err" ||
  fail "the uninterrupted run failed: $(head -c 300 "$WORK/ref.err")"
REF=$(final_line "$WORK/ref.out")
[ -n "$REF" ] || fail "the uninterrupted run printed no final line"
echo "reference: $REF"
# the log's records without their wall times: one per epoch, then the final one
metrics() { sed -E 's/"time_s": *[-+0-9.eE]+,? *//' "$1"; }
[ "$(grep -c '"epoch"' "$WORK/ref.jsonl")" = 4 ] || fail "--log: want 4 epoch lines, got $(grep -c '"epoch"' "$WORK/ref.jsonl")"
[ "$(grep -c '"test_mse"' "$WORK/ref.jsonl")" = 1 ] || fail "--log: want one final line with test_mse"

# interrupted NAME CKPT RAISE...: runs with each FGT_TEST_RAISE in turn (each interrupted run
# must stop with 130 for INT, 137 for KILL), then resumes to the end and compares
interrupted() {
  local name=$1 ck=$2
  shift 2
  local first=1 r rc want
  for r in "$@"; do
    local resume=()
    [ $first = 1 ] || resume=(--resume)
    # (in braces with stderr to /dev/null: bash's own "Killed" notice stays out of the output)
    { FGT_TEST_RAISE=$r "$BIN" "${RUN[@]}" --checkpoint "$ck" --log "$WORK/$name.jsonl" "${resume[@]}" \
      >"$WORK/$name.out" 2>"$WORK/$name.err"; } 2>/dev/null
    rc=$?
    first=0
    case $r in INT@*) want=130 ;; KILL@*) want=137 ;; esac
    [ "$rc" = "$want" ] || fail "$name ($r): exit status $rc, want $want: $(head -c 300 "$WORK/$name.err")"
    if [ "$want" = 130 ]; then
      grep -q "interrupted at epoch" "$WORK/$name.err" || fail "$name ($r): no 'interrupted at epoch' line"
      grep -qF "$ck" "$WORK/$name.err" || fail "$name ($r): the message does not name the checkpoint"
    fi
    grep -q '^final:' "$WORK/$name.out" && fail "$name ($r): an interrupted run printed a result"
    [ -s "$ck" ] || fail "$name ($r): no checkpoint to resume from"
  done
  "$BIN" "${RUN[@]}" --checkpoint "$ck" --log "$WORK/$name.jsonl" --resume >"$WORK/$name.out" 2>"$WORK/$name.err" ||
    fail "$name: the resumed run failed: $(head -c 300 "$WORK/$name.err")"
  local got
  got=$(final_line "$WORK/$name.out")
  [ "$got" = "$REF" ] || fail "$name: resumed '$got' but uninterrupted '$REF'"
  cmp -s "$ck" "$WORK/ref.ckpt" || fail "$name: the final checkpoint differs from the uninterrupted run's"
  metrics "$WORK/$name.jsonl" >"$WORK/$name.metrics"
  metrics "$WORK/ref.jsonl" >"$WORK/ref.metrics"
  cmp -s "$WORK/$name.metrics" "$WORK/ref.metrics" ||
    fail "$name: the log's metrics differ from the uninterrupted run's: $(diff "$WORK/ref.metrics" "$WORK/$name.metrics" | head -5)"
  ls "$WORK" | grep -q '\.tmp\.' && fail "$name: a temporary checkpoint was left behind"
  return 0
}

interrupted sigint-mid-epoch "$WORK/a.ckpt" INT@50
interrupted sigkill "$WORK/b.ckpt" KILL@50
interrupted twice "$WORK/c.ckpt" INT@20 KILL@66 INT@100
interrupted first-step "$WORK/d.ckpt" INT@1

# the same for a small PatchTST in bf16 (f32 master weights): dropout masks, BatchNorm's running
# statistics, the attention scores between layers and the master copy all resume exactly
RUN=(--data "$WORK/data.csv" "${SHORT[@]}" --model patchtst --d-model 8 --heads 2 --layers 2 --d-ff 16 --patch-len 8
     --stride 4 --dtype bf16 --epochs 3 --save-every 7)
"$BIN" "${RUN[@]}" --checkpoint "$WORK/ref.ckpt" --log "$WORK/ref.jsonl" >"$WORK/ref.out" 2>"$WORK/ref.err" ||
  fail "the uninterrupted PatchTST bf16 run failed: $(head -c 300 "$WORK/ref.err")"
REF=$(final_line "$WORK/ref.out")
[ -n "$REF" ] || fail "the uninterrupted PatchTST bf16 run printed no final line"
echo "reference (PatchTST, bf16): $REF"
interrupted patchtst-bf16 "$WORK/e.ckpt" INT@40 KILL@60
finish

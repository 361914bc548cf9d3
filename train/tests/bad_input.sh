#!/usr/bin/env bash
# bad_input.sh — every class of bad input to fastgrad-train gets exit status 2 and one line on
# stderr naming the file, row and column (or the flag), and leaves an existing checkpoint
# byte for byte as it was: a missing file, a wrong header, a non-numeric, empty or non-finite
# cell, a short row, too few rows for look-back + horizon, bad flags, --resume without a
# checkpoint.
source "$(dirname "$0")/lib.sh"

make_csv "$WORK/good.csv" 900
CK="$WORK/run.ckpt"
"$BIN" --data "$WORK/good.csv" "${SHORT[@]}" --epochs 1 --checkpoint "$CK" >"$WORK/out" 2>"$WORK/err" ||
  fail "the good run failed ($?): $(head -c 300 "$WORK/err")"
[ -s "$CK" ] || fail "the good run wrote no checkpoint"
cp "$CK" "$WORK/before.ckpt" 2>/dev/null

# bad CSVs, each from the good one
sed '1s/^date/time/' "$WORK/good.csv" >"$WORK/header.csv"
sed '1s/HULL/HUFL/' "$WORK/good.csv" >"$WORK/twice.csv"
awk -F, -v OFS=, 'NR == 5 { $3 = "abc" } { print }' "$WORK/good.csv" >"$WORK/nonnum.csv"
awk -F, -v OFS=, 'NR == 8 { $8 = "inf" } { print }' "$WORK/good.csv" >"$WORK/inf.csv"
awk -F, -v OFS=, 'NR == 9 { $2 = "nan" } { print }' "$WORK/good.csv" >"$WORK/nan.csv"
awk -F, -v OFS=, 'NR == 11 { $4 = "1e999" } { print }' "$WORK/good.csv" >"$WORK/huge.csv"
awk -F, -v OFS=, 'NR == 12 { $5 = "" } { print }' "$WORK/good.csv" >"$WORK/empty.csv"
awk -F, -v OFS=, 'NR == 10 { NF = 7 } { print }' "$WORK/good.csv" >"$WORK/short.csv"
head -n 41 "$WORK/good.csv" >"$WORK/few.csv"
: >"$WORK/void.csv"

run_bad() { # NAME WANT CSV [extra flags]
  local name=$1 want=$2 csv=$3
  shift 3
  expect_refusal "$name" "$want" -- --data "$csv" "${SHORT[@]}" --epochs 1 --checkpoint "$CK" "$@"
  cmp -s "$CK" "$WORK/before.ckpt" || fail "$name: the checkpoint was changed"
}

run_bad "missing file" "$WORK/nope.csv" "$WORK/nope.csv"
run_bad "wrong header" "header.csv:1:1" "$WORK/header.csv"
grep -q "expected 'date'" "$WORK/err" || fail "wrong header: the message does not say what is expected"
run_bad "a name twice" "twice.csv:1:3" "$WORK/twice.csv"
run_bad "non-numeric cell" "nonnum.csv:5:3 (HULL): 'abc' is not a number" "$WORK/nonnum.csv"
run_bad "inf cell" "inf.csv:8:8 (OT): 'inf' is not a finite number" "$WORK/inf.csv"
run_bad "nan cell" "nan.csv:9:2 (HUFL): 'nan' is not a finite number" "$WORK/nan.csv"
run_bad "overflowing cell" "huge.csv:11:4 (MUFL): '1e999' is not a finite number" "$WORK/huge.csv"
run_bad "empty cell" "empty.csv:12:5 (MULL): the cell is empty" "$WORK/empty.csv"
run_bad "short row" "short.csv:10: 7 fields, but the header has 8" "$WORK/short.csv"
run_bad "too few rows" "too few rows" "$WORK/few.csv"
run_bad "empty file" "void.csv" "$WORK/void.csv"
run_bad "ETT split of a short file" "good.csv" "$WORK/good.csv" --split ett

# bad flags (the message names the flag)
run_bad "unknown flag" "--bogus" "$WORK/good.csv" --bogus 3
run_bad "non-numeric flag" "--epochs" "$WORK/good.csv" --epochs abc
run_bad "flag out of range" "--lookback" "$WORK/good.csv" --lookback 0
run_bad "dropout out of range" "--dropout" "$WORK/good.csv" --dropout 1.5
run_bad "unknown device" "--device" "$WORK/good.csv" --device tpu
run_bad "unknown dtype" "--dtype" "$WORK/good.csv" --dtype f8
run_bad "flag without a value" "--batch" "$WORK/good.csv" --batch

# --resume without a checkpoint
expect_refusal "resume without a checkpoint" "$WORK/none.ckpt" -- --data "$WORK/good.csv" "${SHORT[@]}" --epochs 1 \
  --checkpoint "$WORK/none.ckpt" --resume
[ -e "$WORK/none.ckpt" ] && fail "resume without a checkpoint: one was created"
ls "$WORK" | grep -q '\.tmp\.' && fail "a temporary checkpoint was left behind"
finish

#!/usr/bin/env bash
# refuse.sh — --resume refuses, with exit status 2 and one line naming the file and what is
# wrong, a checkpoint of another configuration (look-back, seed, data file), of another format
# version, a truncated or bit-flipped one and a file that is no checkpoint — and leaves each
# file byte for byte as it was.
source "$(dirname "$0")/lib.sh"

make_csv "$WORK/data.csv" 900
make_csv "$WORK/other.csv" 900 99
CK="$WORK/run.ckpt"
RUN=(--data "$WORK/data.csv" "${SHORT[@]}" --epochs 1)
"$BIN" "${RUN[@]}" --checkpoint "$CK" >"$WORK/out" 2>"$WORK/err" || fail "the first run failed: $(head -c 300 "$WORK/err")"
cp "$CK" "$WORK/keep.ckpt"

refused() { # NAME WANT FILE -- extra flags
  local name=$1 want=$2 file=$3
  shift 4
  cp "$file" "$WORK/before"
  expect_refusal "$name" "$want" -- "${RUN[@]}" --checkpoint "$file" --resume "$@"
  cmp -s "$file" "$WORK/before" || fail "$name: the checkpoint was changed"
}

refused "another look-back" "another configuration" "$CK" -- --lookback 24
grep -q "lookback" "$WORK/err" || fail "another look-back: the key is not named: $(cat "$WORK/err")"
refused "another seed" "another configuration" "$CK" -- --seed 8
refused "another horizon" "another configuration" "$CK" -- --horizon 24
expect_refusal "another data file" "another configuration" -- --data "$WORK/other.csv" "${SHORT[@]}" --epochs 1 \
  --checkpoint "$CK" --resume
cmp -s "$CK" "$WORK/keep.ckpt" || fail "another data file: the checkpoint was changed"

size=$(stat -c %s "$CK")
cp "$CK" "$WORK/flip.ckpt"
byte=$(od -An -tu1 -j $((size / 2)) -N1 "$CK" | tr -d ' ')
printf "\\$(printf %o $((255 - byte)))" | dd of="$WORK/flip.ckpt" bs=1 seek=$((size / 2)) conv=notrunc status=none
cmp -s "$CK" "$WORK/flip.ckpt" && fail "the test did not flip a byte"
refused "a flipped byte" "corrupted checkpoint" "$WORK/flip.ckpt" --
cp "$CK" "$WORK/version.ckpt"
printf '\x07' | dd of="$WORK/version.ckpt" bs=1 seek=8 conv=notrunc status=none
refused "another format version" "format version 7" "$WORK/version.ckpt" --
head -c $((size - 50)) "$CK" >"$WORK/short.ckpt"
refused "a truncated checkpoint" "truncated" "$WORK/short.ckpt" --
refused "not a checkpoint" "not a fastgrad-train checkpoint" "$WORK/data.csv" --
cmp -s "$CK" "$WORK/keep.ckpt" || fail "the original checkpoint was changed"
finish

# lib.sh — what the fastgrad-train tests share: a scratch directory removed on exit, a small
# synthetic CSV of the ETT shape (date + 7 series, seasonal curves plus deterministic noise),
# the short configuration the tests train, and checks that print one line per failure.
# Sourced by train/tests/*.sh with the program's path as $1.
set -u
BIN=${1:?usage: $0 path/to/fastgrad-train}
[ -x "$BIN" ] || { echo "not executable: $BIN"; exit 1; }
WORK=$(mktemp -d /tmp/fgt-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILS=0

fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

# make_csv FILE ROWS [SEED]: "date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT" and ROWS hourly rows
make_csv() {
  awk -v rows="$2" -v seed="${3:-1}" 'BEGIN {
    print "date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT"
    s = seed; pi = 3.141592653589793
    for (t = 0; t < rows; t++) {
      d = int(t / 24); h = t % 24
      line = sprintf("2020-%02d-%02d %02d:00:00", int(d / 28) % 12 + 1, d % 28 + 1, h)
      for (k = 0; k < 7; k++) {
        s = (s * 1103515245 + 12345) % 2147483648
        v = 3 * sin(2 * pi * t / 24 + k) + 1.5 * sin(2 * pi * t / 168 * (k + 1)) + 0.02 * t / (k + 1) + (s / 2147483648 - 0.5)
        line = line sprintf(",%.6f", v)
      }
      print line
    }
  }' > "$1"
}

# The short run every test trains: the linear model on 900 rows, look-back 48, horizon 12.
SHORT=(--split 0.7,0.1,0.2 --lookback 48 --horizon 12 --model linear --batch 16 --threads 2 --seed 7 --quiet --device cpu)

# expect_refusal NAME WANT_TEXT -- ARGS...: exit status 2, one line on stderr containing
# WANT_TEXT, nothing on stdout's last line claiming a result
expect_refusal() {
  local name=$1 want=$2
  shift 3
  "$BIN" "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  local lines
  lines=$(grep -c . "$WORK/err")
  [ "$rc" = 2 ] || fail "$name: exit status $rc, want 2 (stderr: $(head -c 300 "$WORK/err"))"
  [ "$lines" = 1 ] || fail "$name: $lines lines on stderr, want one: $(head -c 600 "$WORK/err")"
  grep -qF -- "$want" "$WORK/err" || fail "$name: stderr does not say '$want': $(head -c 300 "$WORK/err")"
  grep -q '^final:' "$WORK/out" && fail "$name: refused but printed a result"
  return 0
}

# final_line FILE: the "final: ..." line of a run's stdout
final_line() { grep '^final:' "$1" | tail -1; }

finish() {
  if [ "$FAILS" = 0 ]; then echo "$(basename "$0"): passed"; exit 0; fi
  echo "$(basename "$0"): $FAILS failed"; exit 1
}

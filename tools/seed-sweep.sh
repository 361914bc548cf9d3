#!/usr/bin/env bash
# seed-sweep.sh — runs ctest drivers over many FG_TEST_SEED values, as CI's fresh seed each run
# would, and reports every failing seed (its first FAIL line, to replay) and, per check name, the
# largest error against its tolerance that th_verify printed (FG_TEST_VERBOSE): a check whose
# margin is near 1 fails on some seed; one far below 1 has room a kernel bug could hide in.
#
#   tools/seed-sweep.sh [-b BUILD_DIR] [-n SEEDS] [-s FIRST_SEED] DRIVER...
#   e.g. tools/seed-sweep.sh -n 500 encoder norm      (drivers by their tests/test_NAME.c name)
set -euo pipefail
build=build n=100 first=1000
while getopts "b:n:s:" o; do
  case $o in
    b) build=$OPTARG ;; n) n=$OPTARG ;; s) first=$OPTARG ;;
    *) sed -n '7,8p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { sed -n '7,8p' "$0"; exit 2; }
status=0
for t in "$@"; do
  exe=$build/tests/test_$t
  [ -x "$exe" ] || { echo "$t: no $exe (build first)"; status=2; continue; }
  log=$(mktemp)
  fails=0
  for s in $(seq "$first" $((first + n - 1))); do
    if ! FG_TEST_SEED=$s FG_TEST_VERBOSE=1 "$exe" >"$log.out" 2>&1; then
      fails=$((fails + 1))
      echo "$t seed $s: $(grep -m1 -E '^FAIL|Sanitizer|Abort' "$log.out" || tail -n1 "$log.out")"
    fi
    grep -E '^  .*: relerr [^ ]+ \(tol [^ ]+\)$' "$log.out" >>"$log" || true
  done
  echo "$t: $n seeds from $first, $fails failed; largest error / tol by check:"
  awk '{ key = $1; r = $(NF - 2); t = $NF; sub(/\)$/, "", t);
         if (t + 0 > 0 && r / t > m[key]) m[key] = r / t }
       END { for (k in m) printf "  %-24s %.3f\n", k, m[k] }' "$log" | sort -k2 -g -r | head -n 15
  rm -f "$log" "$log.out"
  [ "$fails" -eq 0 ] || status=1
done
exit $status

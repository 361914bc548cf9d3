#!/usr/bin/env bash
# ab-builds.sh — same-run A/B of two builds of the library on the GPU machine: this tree (NEW)
# against an older one (OLD), so a refactor or a kernel change is judged against its baseline in
# one run, not against figures from another run (the GPU's clock drifts by a few percent between
# runs). Put the older tree in _old first (git archive REV | tar -x -C _old; left untracked so the
# device run carries it; delete it before committing). Builds both libraries side by side, runs
# test_linear_act on NEW unless SKIP_TEST=1, and optionally:
#   RACECHECK=1  tools/sanitize_act.py under compute-sanitizer racecheck, NEW build;
#   NCU=n        n rounds of ncu on the three sm_90a products of tools/ncu_act_gemm.py (NCU_ACT,
#                slope form; ncu locks the clocks: time, tensor pipe, instructions, L2 bytes,
#                shared-memory wavefronts), OLD and NEW alternating.
# Then tools/ab_step.py for OLD and NEW in alternating processes (ROUNDS times, ACTS as its acts;
# kernel tables in the first round). Each side runs with its own tree's Python package. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastgrad-ab}
mkdir -p "$OUT"
build() { # dir, log name, ninja targets...
  local d=$1 log="$OUT/build-$2.log"; shift 2
  cmake -S "$d" -B "$d/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTGRAD_CUDA=ON -DFASTGRAD_CUDA_ARCHS=90a \
    > "$log" 2>&1 && ninja -C "$d/build-gpu" "$@" >> "$log" 2>&1
}
[ -d _old ] || { echo "ab-builds: no _old tree"; exit 1; }
build . new & new=$!
build _old old fastgrad & old=$!
wait $new || { tail -30 "$OUT/build-new.log"; echo "ab-builds: the build failed"; exit 1; }
wait $old || { tail -30 "$OUT/build-old.log"; echo "ab-builds: the old build failed"; exit 1; }
echo "builds done at ${SECONDS}s"
if [ -z "${SKIP_TEST:-}" ]; then
  build-gpu/tests/test_linear_act > "$OUT/test_linear_act.log" 2>&1
  echo "test_linear_act rc=$? $(grep -E 'checks,' "$OUT/test_linear_act.log" | tail -1) at ${SECONDS}s"
  grep -m 20 FAIL "$OUT/test_linear_act.log"
fi
if [ -n "${RACECHECK:-}" ]; then # the sm_90a act kernels under racecheck, this build
  PYTHONPATH="$PWD/python" FASTGRAD_LIBRARY="$PWD/build-gpu/libfastgrad.so" \
    compute-sanitizer --tool racecheck python3 tools/sanitize_act.py > "$OUT/racecheck.log" 2>&1
  echo "racecheck: $(grep -E 'Race reported' "$OUT/racecheck.log" | grep -vc nvjet_) reports naming our kernels;" \
    "$(grep -c '^sanitize_act: ok' "$OUT/racecheck.log") ok; $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.log") at ${SECONDS}s"
fi
if [ -n "${NCU:-}" ]; then # the three products at ncu's locked clocks, OLD and NEW alternating, NCU rounds
  M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,lts__t_bytes.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
  for r in $(seq 1 "$NCU"); do
    for side in OLD NEW; do
      tree=$PWD; [ $side = OLD ] && tree=$PWD/_old
      PYTHONPATH="$tree/python" FASTGRAD_LIBRARY="$tree/build-gpu/libfastgrad.so" timeout 200 ncu -k regex:act_gemm_kernel --csv --metrics $M \
        python3 tools/ncu_act_gemm.py ${NCU_ACT:-gelu_tanh} slope > "$OUT/ncu-$side-$r.csv" 2> "$OUT/ncu-$side-$r.err"
      python3 - "$OUT/ncu-$side-$r.csv" $side <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print(sys.argv[2], "ncu: no rows"); sys.exit()
h = rows[0]; ki, mi, vi, ii = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
by = {}
for r in rows[1:]: by.setdefault((r[ii], r[ki]), {})[r[mi].split("__")[1][:12]] = r[vi]
for (i, k), m in by.items():
    name = k[k.find("<") + 1:k.find(">")].replace("__nv_bfloat16, ", "")
    print(sys.argv[2], i, name, " ".join(f"{a}={b}" for a, b in sorted(m.items())))
PY
    done
  done | tee "$OUT/ncu.log"
  echo "ncu done at ${SECONDS}s"
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  k=$([ "$r" = 1 ] && echo 1 || echo 0)
  for side in OLD NEW; do
    tree=$PWD; [ $side = OLD ] && tree=$PWD/_old
    PYTHONUNBUFFERED=1 PYTHONPATH="$tree/python:$PWD/bench" FASTGRAD_LIBRARY="$tree/build-gpu/libfastgrad.so" \
      python3 tools/ab_step.py $side "${ACTS:-gelu_tanh,silu}" 2 $k 2>&1 | grep -vE "Warning|_warn_once"
  done
done | tee "$OUT/ab_builds.log"
echo "ab-builds: done at ${SECONDS}s"

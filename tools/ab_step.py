"""One side of tools/ab-builds.sh's A/B of two builds: the linear + activation step at the large
shape as the library runs it (bench/compare.py's case with its defaults: the slope form, relu
keeping y) against eager torch in the same process, one line a round, and with `kernels` one
step's kernel times (torch profiler). ab-builds.sh alternates OLD and NEW processes; comparing
each side's ratio to eager, not its raw time, cancels most of the GPU's clock drift.

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so \
        python3 tools/ab_step.py LABEL [acts, comma-separated] [rounds] [kernels: 0 / 1]
"""
import sys

import compare
import act_kernels
from compare import timed_together


def main(label, act, rounds, kernels, n=8192, k=4096, m=16384):
    case = compare.linact_case(n, k, m, act)
    sets = [case["make"]() for _ in range(2)]
    eager = case["theirs"]
    for r in range(rounds):
        ours_ms, eager_ms = timed_together([case["ours"], eager], sets)
        print(f"{label} {act} round {r}: ours {ours_ms:.4f}, eager {eager_ms:.4f} ms: {eager_ms / ours_ms:.3f}x eager",
              flush=True)
    if kernels:
        act_kernels.kernels(lambda: case["ours"](*sets[0]), f"{label} {act}")


if __name__ == "__main__":
    label = sys.argv[1]
    acts = sys.argv[2].split(",") if len(sys.argv) > 2 else ("gelu_tanh", "silu")
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    kernels = len(sys.argv) > 4 and sys.argv[4] == "1"
    for a in acts:
        main(label, a, rounds, kernels)

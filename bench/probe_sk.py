"""Developer's probe for the sm_90a GEMM's last-wave split (stream-K) at the large linear +
activation shape: the whole step with the split on and off (FASTGRAD_GEMM90_SK, which the
library reads at each launch) interleaved in one timed_together with eager and torch.compile,
repeated; the peak memory each way; then one step's kernels each way (torch profiler).

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so \
        python3 bench/probe_sk.py [acts, comma-separated] [repeats] [label]

With a label (e.g. another build's library, for builds A/B'd process by process): only the
step as the library runs it against eager, one line a round.
"""
import os
import sys

import compare
import probe_act
from compare import timed_together


def with_split(fn, on):
    def call(*args):
        os.environ["FASTGRAD_GEMM90_SK"] = "1" if on else "0"
        return fn(*args)
    return call


def main(act, repeats, label=None, n=8192, k=4096, m=16384):
    case = compare.linact_case(n, k, m, act)  # the defaults: the slope form (relu keeps y)
    sets = [case["make"]() for _ in range(2)]
    eager = case["theirs"]
    if label:
        for r in range(repeats):
            ours_ms, eager_ms = timed_together([case["ours"], eager], sets)
            print(f"{label} {act} round {r}: ours {ours_ms:.4f}, eager {eager_ms:.4f} ms: {eager_ms / ours_ms:.3f}x eager",
                  flush=True)
        return
    labels = ("split", "whole", "eager", "compile")
    fns = (with_split(case["ours"], True), with_split(case["ours"], False), eager, eager.compiled())
    for r in range(repeats):
        t = dict(zip(labels, timed_together(list(fns), sets)))
        print(f"{act} round {r}: " + ", ".join(f"{lab} {v:.4f}" for lab, v in t.items()) + " ms; "
              + "; ".join(f"{lab}: {t['eager'] / t[lab]:.3f}x eager, {t['compile'] / t[lab]:.3f}x compile"
                          for lab in labels[:2]), flush=True)
    print(f"{act} peak MiB: " + ", ".join(f"{lab} {compare.peak_extra(f, sets[0]) / 2**20:.1f}"
                                          for lab, f in zip(labels, fns)))
    for lab, f in zip(labels[:2], fns[:2]):
        probe_act.kernels(lambda: f(*sets[0]), f"{act} {lab}")


if __name__ == "__main__":
    acts = sys.argv[1].split(",") if len(sys.argv) > 1 else ("gelu_tanh", "silu", "relu")
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    label = sys.argv[3] if len(sys.argv) > 3 else None
    for a in acts:
        main(a, repeats, label)
    os.environ.pop("FASTGRAD_GEMM90_SK", None)

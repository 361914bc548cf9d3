"""Developer's probe: fastgrad's ways of saving for the backward (pre kept, the slope form)
against eager and torch.compile at the large linear + activation shape, all interleaved in
one timed_together (compare.py's method) and repeated, so a drift of the GPU's clock — which
moves every reading by ±5% over a run — falls on all of them alike.

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so \
        python3 bench/probe_ab.py [acts, comma-separated] [repeats]
"""
import sys

import compare
from compare import timed_together


def main(act, repeats, n=8192, k=4096, m=16384):
    pre_case = compare.linact_case(n, k, m, act, save="pre")
    slope_case = compare.linact_case(n, k, m, act, save="slope")
    sets = [pre_case["make"]() for _ in range(2)]
    eager = pre_case["theirs"]  # torch's side as compare.py times it
    compiled = eager.compiled()

    labels = ("pre kept", "slope form", "eager", "compile")
    fns = (pre_case["ours"], slope_case["ours"], eager, compiled)
    for r in range(repeats):
        ms = timed_together(list(fns), sets)
        t = dict(zip(labels, ms))
        print(f"{act} round {r}: " + ", ".join(f"{lab} {v:.4f}" for lab, v in t.items()) + " ms; "
              + "; ".join(f"{lab}: {t['eager'] / t[lab]:.3f}x eager, {t['compile'] / t[lab]:.3f}x compile"
                          for lab in labels[:2]), flush=True)


if __name__ == "__main__":
    acts = sys.argv[1].split(",") if len(sys.argv) > 1 else ("gelu_tanh", "silu")
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    for a in acts:
        main(a, repeats)

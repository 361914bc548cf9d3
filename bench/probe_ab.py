"""Developer's probe: fastgrad's variants at the large linear + activation shape against eager
and torch.compile, all interleaved in one timed_together (compare.py's method) and repeated,
so a drift of the GPU's clock — which moves every reading by ±5% over a run — falls on all of
them alike. Variants: the ways of saving for the backward (pre kept, the slope form), or with
`pairs` as the third argument the slope form with the sm_90a GEMM's 2-block clusters against
single blocks (FASTGRAD_GEMM90_CLUSTER=1 around its calls).

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so \
        python3 bench/probe_ab.py [acts, comma-separated] [repeats] [save|pairs]
"""
import os
import sys

import compare
from compare import timed_together


def single_blocks(fn):
    """fn with the sm_90a GEMM kept to single blocks (the library reads the switch per call)"""
    def run(*args):
        os.environ["FASTGRAD_GEMM90_CLUSTER"] = "1"
        try:
            return fn(*args)
        finally:
            del os.environ["FASTGRAD_GEMM90_CLUSTER"]
    return run


def main(act, repeats, what="save", n=8192, k=4096, m=16384):
    pre_case = compare.linact_case(n, k, m, act, save="pre")
    slope_case = compare.linact_case(n, k, m, act, save="slope")
    sets = [pre_case["make"]() for _ in range(2)]
    eager = pre_case["theirs"]  # torch's side as compare.py times it
    compiled = eager.compiled()

    if what == "pairs":
        labels = ("pairs", "single", "eager", "compile")
        fns = (slope_case["ours"], single_blocks(slope_case["ours"]), eager, compiled)
    else:
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
    what = sys.argv[3] if len(sys.argv) > 3 else "save"
    for a in acts:
        main(a, repeats, what)

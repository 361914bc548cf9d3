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


def with_env(fn, **env):
    """fn with environment switches set around each call (the library reads them per call)"""
    def run(*args):
        os.environ.update(env)
        try:
            return fn(*args)
        finally:
            for key in env:
                del os.environ[key]
    return run


def single_blocks(fn):
    """fn with the sm_90a GEMM kept to single blocks"""
    return with_env(fn, FASTGRAD_GEMM90_CLUSTER="1")


def main(act, repeats, what="save", n=8192, k=4096, m=16384):
    pre_case = compare.linact_case(n, k, m, act, save="pre")
    slope_case = compare.linact_case(n, k, m, act, save="slope")
    sets = [pre_case["make"]() for _ in range(2)]
    eager = pre_case["theirs"]  # torch's side as compare.py times it
    compiled = eager.compiled()

    if what == "variants":  # FASTGRAD_GEMM90_PROBE: bit 0 plain launch (single), bit 1 A loaded first
        ours = slope_case["ours"]
        labels = ("pairs", "pairs A first", "single", "single plain", "single plain A first", "eager")
        fns = (ours, with_env(ours, FASTGRAD_GEMM90_PROBE="2"), single_blocks(ours),
               with_env(ours, FASTGRAD_GEMM90_CLUSTER="1", FASTGRAD_GEMM90_PROBE="1"),
               with_env(ours, FASTGRAD_GEMM90_CLUSTER="1", FASTGRAD_GEMM90_PROBE="3"), eager)
        for r in range(repeats):
            t = dict(zip(labels, timed_together(list(fns), sets)))
            print(f"{act} round {r}: " + ", ".join(f"{lab} {v:.4f} ({t['eager'] / v:.3f}x)" for lab, v in t.items()),
                  flush=True)
        return
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

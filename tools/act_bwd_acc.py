"""The linear + activation backward at PatchTST's FFN-up shape (x [T, 128], w [256, 128], the
hidden's gradient and its saved masked slope [T, 256]; T = 172032, bf16, the encoder's slope form)
with accumulate off and on: the encoder's post-norm layers accumulate dx into the residual part
of dh, and the one-kernel sm_90a backward reads the old dx on its per-tile path. Prints each
setting's kernels a call (torch.profiler) for one or more builds, alternating, so an A/B of a
change to that kernel reads in one process.

    PYTHONPATH=python:bench python3 tools/act_bwd_acc.py build-a/libfastgrad.so [build-b/libfastgrad.so ...]

Each build runs in its own subprocess (the library is loaded once a process).
"""
import os
import subprocess
import sys

T, K, M = 172032, 128, 256


def one_build():
    import torch
    from fastgrad import ops
    sys.path.insert(0, os.path.dirname(__file__))
    from profile_encoder import kernel_table

    torch.manual_seed(0)
    dt = torch.bfloat16

    def rnd(*shape):
        return (torch.rand(shape, device="cuda") * 2 - 1).to(dt)

    x, w, b = rnd(T, K), rnd(M, K), rnd(M)
    sets = [(rnd(T, M), rnd(T, M)) for _ in range(2)]
    dx, dw, db = torch.empty(T, K, device="cuda", dtype=dt), torch.empty(M, K, device="cuda", dtype=dt), \
        torch.empty(M, device="cuda", dtype=dt)
    for acc in (False, True, False, True):
        def step(dy, slope):
            ops.linear_act_backward(dy, x, w, b, pre=slope, act="gelu", accumulate=acc, out=(dx, dw, db), slope=True)
        if acc:
            dx.zero_(), dw.zero_(), db.zero_()
        rows = kernel_table(step, sets, steps=6)
        total = sum(t for t, _, _ in rows)
        print(f"  accumulate={int(acc)}: {total * 1e3:7.1f} us of kernels a call; " +
              "; ".join(f"{k.split('(')[0][-40:]} {t * 1e3:.1f}" for t, _, k in rows[:3]))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one_build()
        sys.exit(0)
    for lib in sys.argv[1:] * 2:
        print(f"## {lib}", flush=True)
        env = dict(os.environ, FASTGRAD_LIBRARY=os.path.abspath(lib))
        subprocess.run([sys.executable, __file__, "--one"], env=env, check=False)

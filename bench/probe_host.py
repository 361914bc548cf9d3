"""Developer's probe: where the host time of one linear + activation fwd+bwd goes (Python
and the C call), on a shape small enough that the GPU waits for the host.

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 bench/probe_host.py
"""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

from fastgrad import ops


def main(n=256, k=128, m=256, act="silu"):
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    x, w, b, dy = mk(n, k), mk(m, k), mk(m), mk(n, m)

    def ours():
        y, pre = ops.linear_act_forward(x, w, b, act)
        return ops.linear_act_backward(dy, x, w, b, pre, act, consume_pre=True)

    xe, we, be = (t.clone().requires_grad_(True) for t in (x, w, b))

    def eager():
        out = F.silu(F.linear(xe, we, be))
        return torch.autograd.grad(out, (xe, we, be), dy)

    for fn, label in ((ours, "fastgrad"), (eager, "eager")):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"{label}: host {1e6 * (t1 - t0) / 500:.1f} us per fwd+bwd")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        ours()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()

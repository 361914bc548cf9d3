"""Where the time of one linear + activation forward + backward goes, kernel by kernel
(torch.profiler), for fastgrad, eager and torch.compile at bench/compare.py's shapes, plus the
bare products (fastgrad's against torch's) timed alone: the breakdown that says which kernel a
change has to shorten before a whole-step figure can move.

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 tools/act_kernels.py \
        [all | ours | small | large] [kernel tables] [large: acts, comma-separated, "act:pre" keeps pre]
"""
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import compare
from compare import timed_together
from fastgrad import ops

KERNELS = 3  # how many of fastgrad / eager / compile get a kernel table
ONLY_OURS = False  # argv[1] == "ours" / "small": fastgrad alone (no compile: quick); "large": the large shape
# (argv[3]: a comma list of acts, "act:pre" to keep pre instead of the slope)
ACTS = compare._ACTS


def rand(shape, dtype=torch.bfloat16, grad=False):
    return (torch.rand(shape, device="cuda") * 2 - 1).to(dtype).requires_grad_(grad)


def timed(fn):
    return compare.timed(fn, [()])


def host_us(fn, reps=50):
    """Host time per call (µs) with the GPU left to run behind: the launch overhead."""
    import time
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def peak(fn):
    """MiB allocated above the start during one call, outputs included (as compare.py)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def kernels(fn, label, reps=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        if t > 0:
            rows.append((t / reps / 1000.0, e.count // reps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"  {label}: kernels sum {total:.4f} ms")
    for ms, cnt, key in rows[:10]:
        print(f"    {ms:8.4f} ms x{cnt:<2d} {key[:110]}")


def case(n, k, m, act, recompute=False, slope=True):
    x, w, b, dy = rand((n, k), grad=True), rand((m, k), grad=True), rand((m,), grad=True), rand((n, m))
    fn = ACTS[act]

    save = "recompute" if recompute else "slope" if slope else "pre"
    ours_of = compare.linact_case(n, k, m, act, save=save)["ours"]  # as compare.py runs it

    def ours():
        return ours_of(x, w, b, dy)

    def eager():
        out = fn(F.linear(x, w, b))
        return (out,) + torch.autograd.grad(out, (x, w, b), dy)

    cfn = torch.compile(lambda x, w, b: fn(F.linear(x, w, b)))

    def compiled():
        out = cfn(x, w, b)
        return (out,) + torch.autograd.grad(out, (x, w, b), dy)

    impls = ((ours, "ours"), (eager, "eager"), (compiled, "compile"))[:1 if ONLY_OURS else 3]
    ms = timed_together([f for f, _ in impls], [()])
    t = {lab: v for (_, lab), v in zip(impls, ms)}
    mem = {lab: peak(f) for f, lab in impls}
    host = {lab: host_us(f) for f, lab in impls}
    print(f"== N={n} K={k} M={m} {act} ({save}): " + ", ".join(f"{lab} {t[lab]:.4f} ms {mem[lab]:.1f} MiB" for lab in t)
          + ("" if ONLY_OURS else f"; {t['eager'] / t['ours']:.2f}x eager, {t['compile'] / t['ours']:.2f}x compile"))
    print("  host µs per call: " + ", ".join(f"{lab} {v:.0f}" for lab, v in host.items()))
    for f, lab in ((ours, "fastgrad"), (eager, "eager"), (compiled, "compile"))[:KERNELS]:
        kernels(f, lab)


def products(n, k, m):
    x, w, b, g = rand((n, k)), rand((m, k)), rand((m,)), rand((n, m))
    print(f"== products N={n} K={k} M={m} (ms, ours / torch)")
    print(f"  fwd  x·wᵀ+b : {timed(lambda: ops.linear_forward(x, w, b)):.4f} / {timed(lambda: F.linear(x, w, b)):.4f}")
    print(f"  dx   g·w    : {timed(lambda: ops.linear_backward_input(g, w)):.4f} / {timed(lambda: g @ w):.4f}")
    print(f"  dw   gᵀ·x   : {timed(lambda: ops.linear_backward_weight(g, x)):.4f} / {timed(lambda: g.t() @ x):.4f}")
    print(f"  db   Σ g    : {timed(lambda: ops.linear_backward_bias(g)):.4f} / {timed(lambda: g.sum(0)):.4f}")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    KERNELS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ONLY_OURS = which in ("ours", "small")  # small: the small shape, ours kept and recomputed
    if which == "small":
        for act in ("relu", "gelu_tanh", "silu"):
            for recompute in (False, True):
                case(172032, 128, 256, act, recompute)
    if which == "all":
        for shape in ((8192, 4096, 16384), (172032, 128, 256)):
            products(*shape)
    if which == "large":  # the large shape alone: where the step's time goes, kernel by kernel
        for tok in sys.argv[3].split(",") if len(sys.argv) > 3 else ("gelu_tanh", "silu"):
            act, _, mode = tok.partition(":")  # "gelu_tanh:pre": pre kept (default: the slope form)
            case(8192, 4096, 16384, act, slope=mode != "pre")
    if which in ("all", "ours"):
        for shape in ((8192, 4096, 16384), (172032, 128, 256)):
            for act in ("relu", "gelu_tanh", "silu"):
                case(*shape, act)

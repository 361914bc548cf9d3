"""Developer's probe for linear + activation on the GPU: where the time of one fwd+bwd goes,
kernel by kernel (torch.profiler), for fastgrad, eager and torch.compile at the issue's
shapes, and the bare products (ours vs torch) timed alone.

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 bench/probe_act.py
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import compare
from compare import timed_together
from fastgrad import ops

KERNELS = 3  # how many of fastgrad / eager / compile get a kernel table
ONLY_OURS = False  # argv[1] == "ours" / "small": fastgrad alone (no compile: quick); "large": the large shape
ACTS = {"relu": F.relu, "gelu_tanh": lambda p: F.gelu(p, approximate="tanh"), "silu": F.silu}


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


def case(n, k, m, act, recompute=False):
    x, w, b, dy = rand((n, k), grad=True), rand((m, k), grad=True), rand((m,), grad=True), rand((n, m))
    fn = ACTS[act]

    ours_of = compare.linact_case(n, k, m, act, recompute=recompute)["ours"]  # as compare.py runs it

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
    print(f"== N={n} K={k} M={m} {act}{' recompute' if recompute else ''}: " + ", ".join(f"{lab} {t[lab]:.4f} ms {mem[lab]:.1f} MiB" for lab in t)
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


def with_env(fn, **env):
    """fn run with environment variables set (None: unset) for its host call — the library's
    probe knobs are read when a call runs"""
    def run():
        old = {k: os.environ.get(k) for k in env}
        for k, v in env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        try:
            return fn()
        finally:
            for k, v in old.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return run


def form_case(n, k, m, act):
    """dx's product forming g itself (GEMM_INPUT_FORM, walk bands of 16 or 8 row tiles) against
    the gradient pass + plain product, eager and compile, interleaved; kernel tables."""
    x, w, b, dy = rand((n, k), grad=True), rand((m, k), grad=True), rand((m,), grad=True), rand((n, m))
    fn = ACTS[act]
    ours_of = compare.linact_case(n, k, m, act)["ours"]
    ours = lambda: ours_of(x, w, b, dy)
    impls = [(with_env(ours, FG_PROBE_NO_FORM=None, FG_PROBE_FORM_GROUP="16"), "form16"),
             (with_env(ours, FG_PROBE_NO_FORM=None, FG_PROBE_FORM_GROUP="8"), "form8"),
             (with_env(ours, FG_PROBE_NO_FORM="1"), "pass")]

    def eager():
        out = fn(F.linear(x, w, b))
        return (out,) + torch.autograd.grad(out, (x, w, b), dy)

    cfn = torch.compile(lambda x, w, b: fn(F.linear(x, w, b)))

    def compiled():
        out = cfn(x, w, b)
        return (out,) + torch.autograd.grad(out, (x, w, b), dy)

    impls += [(eager, "eager"), (compiled, "compile")]
    # the results agree (form against pass), to the dtype's rounding
    a, c = impls[0][0](), impls[2][0]()
    diffs = [((u.float() - v.float()).norm() / v.float().norm()).item() for u, v in zip(a[1:], c[1:]) if u is not None]
    ms = timed_together([f for f, _ in impls], [()])
    t = {lab: v for (_, lab), v in zip(impls, ms)}
    mem = {lab: peak(f) for f, lab in impls}
    print(f"== FORM N={n} K={k} M={m} {act}: " + ", ".join(f"{lab} {t[lab]:.4f} ms {mem[lab]:.0f} MiB" for lab in t)
          + f"; form16 {t['eager'] / t['form16']:.3f}x eager {t['compile'] / t['form16']:.3f}x compile; form8 "
          f"{t['eager'] / t['form8']:.3f}x eager; pass {t['eager'] / t['pass']:.3f}x eager; rel diff form/pass {diffs}")
    for f, lab in impls[:3]:
        kernels(f, lab)


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
    if which == "form":  # dx's product forming g (session 11)
        for act in ("gelu_tanh", "relu", "silu"):
            form_case(8192, 4096, 16384, act)
    if which == "large":  # the large shape alone: where the step's time goes, kernel by kernel
        for act in ("gelu_tanh", "silu"):
            case(8192, 4096, 16384, act)
    if which in ("all", "ours"):
        for shape in ((8192, 4096, 16384), (172032, 128, 256)):
            for act in ("relu", "gelu_tanh", "silu"):
                case(*shape, act)

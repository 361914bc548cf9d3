#!/usr/bin/env python3
"""adamw_host.py — where an optimizer step's time goes on GPT-2-small's parameter set (148 bf16
tensors, moments in the parameters' dtype): torch.optim.AdamW(fused=True) beside fg.AdamW, each
step's host time (perf_counter around the call, the GPU idle), its GPU time alone (the queue filled
first by a sleep kernel, so the enqueue is hidden), the two back to back, and fg's share of host time
in its C call (ctypes, validation, launch); then the kernels under torch.profiler. A step whose host
time exceeds its GPU time is bound by the host.

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 tools/adamw_host.py
"""
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import fastgrad as fg
import gpt2_step
from fastgrad import ops


def host_us(fn, n=200):
    """The median host time of a call, the GPU idle at its start."""
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def gpu_ms(fn, n=50):
    """The median GPU time of a call alone: the queue is filled first, so the enqueue is hidden."""
    evs = []
    for _ in range(n):
        torch.cuda._sleep(20_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        evs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in evs)


def back_to_back_ms(fn, n=50):
    """The mean time a call of n enqueued one after another."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n


def main():
    device, dtype = torch.device("cuda"), torch.bfloat16
    shapes = [p.shape for p in gpt2_step.GPT2(gpt2_step.Config(), "torch").parameters()]
    pt, pf = gpt2_step.adamw_param_sets(shapes, device, dtype)
    ot = torch.optim.AdamW(pt, lr=6e-4, weight_decay=0.1, fused=True)
    of = fg.AdamW(pf, lr=6e-4, weight_decay=0.1, moment_dtype="param")
    for _ in range(5):
        ot.step()
        of.step()
    torch.cuda.synchronize()
    for name, fn in (("torch fused", ot.step), ("fg", of.step)):
        print(f"{name:12s} host {host_us(fn):8.1f} us   gpu alone {gpu_ms(fn):.3f} ms   "
              f"back-to-back {back_to_back_ms(fn):.3f} ms")
    # fg's share in its C call: adamw_step_arrays timed inside the step
    real, inner = ops.adamw_step_arrays, []

    def timed(*a, **k):
        t0 = time.perf_counter()
        real(*a, **k)
        inner.append(time.perf_counter() - t0)

    ops.adamw_step_arrays = timed
    try:
        h = host_us(of.step)
    finally:
        ops.adamw_step_arrays = real
    print(f"fg host {h:.1f} us, of which adamw_step_arrays (ctypes + C validation + launch) "
          f"{statistics.median(inner) * 1e6:.1f} us")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            ot.step()
            of.step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""profile_encoder.py — where a training step of the encoder layer spends its GPU time: runs
compare_encoder.py's cases (fastgrad, and torch eager for reference) under torch.profiler and
prints each implementation's CUDA kernels, summed over one step, slowest first, with the share
of the step and the number of launches, and the host's side: the time to enqueue one step from an
idle GPU and a step's time back to back (a step whose enqueue time passes its kernels' is bound by
the host, not the kernels). For deciding what to fuse next.

    PYTHONPATH=python python3 tools/profile_encoder.py [--case patchtst|gpt2|all] [--top 25]
        [--save all,min]   (fastgrad's saved-activation policies, one table each)
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))

import compare_encoder as ce  # noqa: E402


def kernel_table(fn, sets, steps=3):
    for i in range(2):
        fn(*sets[i % 2])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            fn(*sets[i % 2])
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name if len(ev.name) < 90 else ev.name[:87] + "..."
        t, n = rows.get(name, (0.0, 0))
        rows[name] = (t + ev.device_time / 1000.0 / steps, n + 1)
    return sorted(((t, n / steps, k) for k, (t, n) in rows.items()), reverse=True)


def host_times(fn, sets, n=30):
    """(median ms to enqueue one step from an idle GPU, ms a step back to back)."""
    for i in range(3):
        fn(*sets[i % 2])
    enq = []
    for i in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*sets[i % 2])
        enq.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        fn(*sets[i % 2])
    torch.cuda.synchronize()
    return 1e3 * statistics.median(enq), 1e3 * (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["patchtst", "gpt2", "all"], default="all")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--save", default="all",
                    help="comma-separated fastgrad saved-activation policies (all, less, min); torch eager once")
    args = ap.parse_args()
    saves = args.save.split(",")
    cases = []
    for save in saves:
        if args.case in ("patchtst", "all"):
            cases += [ce.patchtst_case(4096, torch.float32, 0.2, save),
                      ce.patchtst_case(4096, torch.bfloat16, 0.2, save)]
        if args.case in ("gpt2", "all"):
            cases.append(ce.gpt2_case(8, 1024, torch.bfloat16, 0.1, save))
    for ci, case in enumerate(cases):
        save = saves[ci * len(saves) // len(cases)]
        sets = [case["make"](), case["make"]()]
        for label, build in case["impls"]:
            if label == "torch.compile" or (label != "fastgrad" and save != saves[0]):
                continue
            if label == "fastgrad":
                label = f"fastgrad save {save}"
            fn = build()
            rows = kernel_table(fn, sets)
            total = sum(t for t, _, _ in rows)
            launches = sum(n for _, n, _ in rows)
            enqueue, b2b = host_times(fn, sets)
            print(f"\n## {case['name']} {case['dtype']} {case['shape']} — {label}: {total:.2f} ms of kernels, "
                  f"{launches:.0f} launches a step; enqueue from idle {enqueue:.2f} ms, back to back {b2b:.2f} ms")
            for t, n, k in rows[:args.top]:
                print(f"{t:8.3f} ms {100 * t / total:5.1f}%  x{n:4.0f}  {k}")
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""profile_encoder.py — where a training step of the encoder layer spends its GPU time: runs
compare_encoder.py's cases (fastgrad, and torch eager for reference) under torch.profiler and
prints each implementation's CUDA kernels, summed over one step, slowest first, with the share
of the step and the number of launches. For deciding what to fuse next.

    PYTHONPATH=python python3 tools/profile_encoder.py [--case patchtst|gpt2|all] [--top 25]
        [--save all,min]   (fastgrad's saved-activation policies, one table each)
"""
import argparse
import os
import sys

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["patchtst", "gpt2", "all"], default="all")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--save", default="all",
                    help="comma-separated fastgrad saved-activation policies (all, less, min); torch eager once")
    args = ap.parse_args()
    saves = args.save.split(",")
    cases = []
    for i, save in enumerate(saves):
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
            rows = kernel_table(build(), sets)
            total = sum(t for t, _, _ in rows)
            launches = sum(n for _, n, _ in rows)
            print(f"\n## {case['name']} {case['dtype']} {case['shape']} — {label}: {total:.2f} ms of kernels, "
                  f"{launches:.0f} launches a step")
            for t, n, k in rows[:args.top]:
                print(f"{t:8.3f} ms {100 * t / total:5.1f}%  x{n:4.0f}  {k}")
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""profile_gpt2.py — where bench/gpt2_step.py's GPT-2 training step spends its GPU time, fastgrad's
modules beside plain torch, eager or compiled: each build's CUDA kernels summed over a step
(slowest first, share of the step, launches), the kernels' total against the step's wall time
(the difference is the GPU waiting on the host) and the host's time to enqueue one step from an
idle GPU, for deciding what to fix first.

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 tools/profile_gpt2.py \
        [--top 25] [--rows torch:sdpa,fastgrad:fg,fastgrad:sdpa:compile]
"""
import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, HERE)

import fastgrad as fg  # noqa: E402
import gpt2_step as g2  # noqa: E402
from profile_encoder import kernel_table  # noqa: E402  (one step's CUDA kernels, summed by name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rows", default="torch:sdpa,fastgrad:fg",
                    help="build:attention[:compile], comma separated (build torch or fastgrad, attention sdpa or fg)")
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    c = g2.Config()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(2):
        idx = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=gen)
        batches.append((idx[:, :-1].contiguous().to(dev), idx[:, 1:].contiguous().to(dev)))
    for spec in args.rows.split(","):
        build, attn, *rest = spec.split(":")
        compiled = rest == ["compile"]
        torch._dynamo.reset()
        torch.manual_seed(1)
        model = g2.GPT2(c, build=build, attn=attn).gpt2_init().to(dev, dtype)
        if build == "fastgrad":
            opt = fg.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, moment_dtype="param")
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
        fwd = torch.compile(model) if compiled else model

        def step(i):
            opt.zero_grad(set_to_none=True)
            fwd(*batches[i % 2]).backward()
            opt.step()

        for i in range(3):
            step(i)
        torch.cuda.synchronize()
        host = []
        for i in range(5):  # the host's time to enqueue a step, from an idle GPU
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(i)
            host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(args.steps):
            step(i)
        e1.record()
        torch.cuda.synchronize()
        wall = e0.elapsed_time(e1) / args.steps
        from fastgrad import _torchext
        ext = _torchext.MODULE
        before = ext.stats() if ext is not None else {}
        table = kernel_table(step, [(0,), (1,)], args.steps)
        after = ext.stats() if ext is not None else {}
        calls = {k: after[k] - before[k] for k in ("kernel", "kernel_python", "autograd_cpp", "autograd_python")
                 if k in after}
        total = sum(t for t, _, _ in table)
        launches = sum(n for _, n, _ in table)
        print(f"\n## {build} (attention {attn}{', compiled' if compiled else ''}): step {wall:.2f} ms (CUDA events), "
              f"kernels {total:.2f} ms, {launches:.0f} launches a step, host {sorted(host)[2]:.2f} ms to enqueue a step")
        if calls:  # the custom ops' C++ kernels (decision 183); kernel_table runs 2 warm-up steps too
            n = args.steps + 2
            print("torch extension calls a step: " + ", ".join(f"{k} {v / n:.0f}" for k, v in calls.items()))
        print("| ms a step | share | launches | kernel |\n|---:|---:|---:|---|")
        for t, n, k in table[:args.top]:
            print(f"| {t:.3f} | {100 * t / total:.1f}% | {n:.0f} | `{k}` |")
        del model, opt, fwd
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""ncu_attn_short.py — PatchTST's attention core (B 4096, H 16, L 42, hd 8, residual scores in
and out, no dropout) forward + backward twice in f32, then twice in bf16, through fastgrad's ops:
an Nsight Compute target for the short-sequence kernels (`ncu -k regex:qrow ...`), so each
kernel's time or counters read per dtype without the benchmark's other launches.

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so ncu --clock-control none \
        -k regex:qrow --metrics gpu__time_duration.sum python3 tools/ncu_attn_short.py [B,H,L,hd]
"""
import sys

import torch
from fastgrad import ops


def main():
    b, h, l, d = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "4096,16,42,8").split(","))
    for dt in (torch.float32, torch.bfloat16):
        def heads():  # [B, H, L, hd] views of a [B, L, H, hd] projection, as the encoder passes them
            return (torch.rand(b, l, h, d, device="cuda") * 2 - 1).to(dt).transpose(1, 2)
        q, k, v, do = heads(), heads(), heads(), heads()
        prev = (torch.rand(b, h, l, l, device="cuda") * 2 - 1).to(dt)
        ds = (torch.rand(b, h, l, l, device="cuda") * 2 - 1).to(dt)
        for _ in range(2):
            o, lse, _s = ops.attention_forward(q, k, v, scores_in=prev, return_scores=True)
            ops.attention_backward(do, q, k, v, o, lse, scores_in=prev, dscores=ds)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()

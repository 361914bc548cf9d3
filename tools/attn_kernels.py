#!/usr/bin/env python3
"""attn_kernels.py — one attention forward + backward (fg.attention against
scaled_dot_product_attention, the same inputs) kernel by kernel under torch.profiler: each
kernel's time per call, for judging a flash-kernel change against cuDNN's / FlashAttention's
kernels in the same process (GPT shape by default).

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 tools/attn_kernels.py \
        [--shape 8,16,1024,64] [--dtype bf16] [--no-causal] [--dropout 0.1] [--top 8]

The gradients are taken with torch.autograd.grad (no .grad accumulation kernels in the table).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastgrad as fg  # noqa: E402
from profile_encoder import kernel_table  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="8,16,1024,64", help="B,H,L,hd")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    b, h, l, d = (int(v) for v in args.shape.split(","))
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    causal = not args.no_causal

    def make():
        q, k, v = (torch.randn(b, h, l, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
        return q, k, v, torch.randn(b, h, l, d, device="cuda", dtype=dt)

    sets = [make(), make()]

    def ours(q, k, v, do):
        o = fg.attention(q, k, v, causal=causal, dropout_p=args.dropout)
        torch.autograd.grad(o, (q, k, v), do)

    def sdpa(q, k, v, do):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=args.dropout)
        torch.autograd.grad(o, (q, k, v), do)

    print(f"attention fwd+bwd B={b} H={h} L={l} hd={d} {args.dtype} causal={causal} dropout={args.dropout}")
    for name, fn in (("fastgrad", ours), ("SDPA", sdpa)):
        rows = kernel_table(fn, sets, steps=5)
        print(f"== {name}: kernels {sum(t for t, _, _ in rows) * 1000:.1f} us a call")
        for t, n, k in rows[:args.top]:
            print(f"  {t * 1000:8.1f} us  x{n:.0f}  {k}")


if __name__ == "__main__":
    main()

"""Developer's probe: one forward (pre kept, and not) and one recomputing backward of the small
linear + activation shape, for a profiler run (ncu -k regex:act_tile) of the short-K tiles (and the one-kernel backward: -k regex:act_bwd_tile).

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so ncu ... python3 bench/ncu_tile.py gelu_tanh
"""
import sys

import torch

from fastgrad import ops

act = sys.argv[1] if len(sys.argv) > 1 else "gelu_tanh"
n, k, m = 172032, 128, 256
x, w, b = (torch.rand(s, device="cuda").to(torch.bfloat16) for s in ((n, k), (m, k), (m,)))
dy = torch.rand((n, m), device="cuda").to(torch.bfloat16)
y, pre = ops.linear_act_forward(x, w, b, act, keep_pre=True)
y, _ = ops.linear_act_forward(x, w, b, act, keep_pre=False)
ops.linear_act_backward(dy, x, w, b, None, act)
torch.cuda.synchronize()
ops.linear_act_backward(dy, x, w, b, pre, act)  # the one-kernel backward, pre kept
torch.cuda.synchronize()

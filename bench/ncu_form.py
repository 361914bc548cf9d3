"""Developer's probe: one backward of the large linear + activation shape (pre kept), for a
profiler run of dx's product that forms g itself (ncu -k regex:act_gemm_kernel --launch-skip 1).

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so ncu ... python3 bench/ncu_form.py gelu_tanh
"""
import sys

import torch

from fastgrad import ops

act = sys.argv[1] if len(sys.argv) > 1 else "gelu_tanh"
n, k, m = 8192, 4096, 16384
x, w, b = ((torch.rand(s, device="cuda") * 2 - 1).to(torch.bfloat16) for s in ((n, k), (m, k), (m,)))
dy = (torch.rand((n, m), device="cuda") * 2 - 1).to(torch.bfloat16)
y, pre = ops.linear_act_forward(x, w, b, act, keep_pre=True)
ops.linear_act_backward(dy, x, w, b, pre, act)
torch.cuda.synchronize()

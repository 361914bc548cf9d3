"""One forward + backward of the large linear + activation shape (pre kept, or argv[2] "slope":
the slope form), as a target for Nsight Compute on the three sm_90a GEMM products (the forward,
dx's product forming g, dw's): ncu -k regex:act_gemm_kernel. tools/ab-builds.sh runs it with NCU=n.

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so ncu ... python3 tools/ncu_act_gemm.py gelu_tanh [slope]
"""
import sys

import torch

from fastgrad import ops

act = sys.argv[1] if len(sys.argv) > 1 else "gelu_tanh"
n, k, m = 8192, 4096, 16384
x, w, b = ((torch.rand(s, device="cuda") * 2 - 1).to(torch.bfloat16) for s in ((n, k), (m, k), (m,)))
dy = (torch.rand((n, m), device="cuda") * 2 - 1).to(torch.bfloat16)
slope = len(sys.argv) > 2 and sys.argv[2] == "slope"
y, pre = ops.linear_act_forward(x, w, b, act, keep_pre=True, slope=slope)
ops.linear_act_backward(dy, x, w, b, pre, act, consume_pre=True, slope=slope)
torch.cuda.synchronize()

"""Linear + activation's forward (pre kept) across layer shapes, fastgrad against the same run's
eager forward (cuBLAS product with bias, then the activation pass) and the bare product
(F.linear): shows where the sm_90a GEMM with the activation in its epilogue beats product +
pass and where it does not, which is what the size rule for taking that GEMM rests on.

    PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 tools/act_fwd_shapes.py
"""
import torch
import torch.nn.functional as F

from compare import timed_together
from fastgrad import ops

ACTS = {"silu": F.silu, "gelu_tanh": lambda p: F.gelu(p, approximate="tanh")}
SHAPES = [(8192, 4096, 16384), (8192, 16384, 4096), (2048, 4096, 4096), (1024, 4096, 8192),
          (4096, 1024, 4096), (16384, 512, 2048), (4096, 256, 4096), (32768, 256, 1024)]

print(f"{'N':>6} {'K':>6} {'M':>6} {'act':>9}  {'ours':>8} {'eager':>8} {'linear':>8}  ours/eager  ours/linear")
for n, k, m in SHAPES:
    x = (torch.rand(n, k, device="cuda") * 2 - 1).bfloat16()
    w = ((torch.rand(m, k, device="cuda") * 2 - 1) / k ** 0.5).bfloat16()
    b = (torch.rand(m, device="cuda") * 2 - 1).bfloat16()
    for name, act in ACTS.items():
        ours = lambda: ops.linear_act_forward(x, w, b, act=name, keep_pre=True)
        eager = lambda: (lambda p: (act(p), p))(F.linear(x, w, b))
        lin = lambda: F.linear(x, w, b)
        y, pre = ours()
        ref = F.linear(x.float(), w.float(), b.float())
        err = ((pre.float() - ref).norm() / ref.norm()).item()
        t = timed_together([ours, eager, lin], [()])
        print(f"{n:>6} {k:>6} {m:>6} {name:>9}  {t[0]:8.4f} {t[1]:8.4f} {t[2]:8.4f}  {t[1] / t[0]:9.3f}x  {t[2] / t[0]:9.3f}x"
              f"   (pre relerr {err:.1e})")

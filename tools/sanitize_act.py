"""One call of each own sm_90a kernel of linear + activation, at the smallest shapes that still
take them (the GEMM for all three products, dx's product also forming g, the slope form, the
one-kernel short-K backward), each result checked loosely against torch. compute-sanitizer's
racecheck and synccheck are too slow for the whole test driver; this short program gives them
every barrier and asynchronous copy of those kernels (scripts/gpu-check.sh runs it with SYNCCHECK=1).

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so \
        compute-sanitizer --tool synccheck python3 tools/sanitize_act.py
"""
import torch
import torch.nn.functional as F

from fastgrad import ops


def rand(*shape):
    return (torch.rand(shape, device="cuda") * 2 - 1).to(torch.bfloat16)


def close(name, got, want):
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    print(f"{name}: relerr {err:.2e}")
    assert err < 2e-2, name


ACTS = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


def case(n, k, m, act="gelu_tanh"):
    x, w, b, dy = rand(n, k), rand(m, k), rand(m), rand(n, m)
    y, pre = ops.linear_act_forward(x, w, b, act, keep_pre=True)
    dx, dw, db = ops.linear_act_backward(dy, x, w, b, pre, act)
    p = F.linear(x.float(), w.float(), b.float())
    g = dy.float() * torch.func.grad(lambda t: ACTS[act](t).sum())(p)
    close(f"y {n}x{k}x{m}", y, ACTS[act](p))
    close(f"dx {n}x{k}x{m}", dx, g @ w.float())
    close(f"dw {n}x{k}x{m}", dw, g.t() @ x.float())
    close(f"db {n}x{k}x{m}", db, g.sum(0))


def slope_form(n, k, m, act):
    """the slope form: the GEMM's epilogue writes y and s = act′(pre), dx's product forms g = dy ⊙ s
    (in s's memory: consumed)"""
    x, w, b, dy = rand(n, k), rand(m, k), rand(m), rand(n, m)
    y, s = ops.linear_act_forward(x, w, b, act, slope=True)
    p = F.linear(x.float(), w.float(), b.float())
    g = dy.float() * torch.func.grad(lambda t: ACTS[act](t).sum())(p)
    close(f"{act} s {n}x{k}x{m}", s, torch.func.grad(lambda t: ACTS[act](t).sum())(p))
    dx, dw, db = ops.linear_act_backward(dy, x, w, b, s, act, consume_pre=True, slope=True)
    close(f"{act} y {n}x{k}x{m}", y, ACTS[act](p))
    close(f"{act} dx {n}x{k}x{m}", dx, g @ w.float())
    close(f"{act} dw {n}x{k}x{m}", dw, g.t() @ x.float())
    close(f"{act} db {n}x{k}x{m}", db, g.sum(0))


if __name__ == "__main__":
    case(4224, 1536, 1024)  # 33 × 4 tiles of 128 × 256 (one wave on 132 SMs), 6.6e9 multiply-adds
    case(4224, 1536, 1024, "silu")  # the same with dx's product forming g itself
    slope_form(4224, 1536, 1024, "gelu_tanh")  # the slope form: the epilogue writes y and s, dx forms g = dy ⊙ s
    case(20000, 128, 256)   # the short-K backward, 625 tiles of 32 rows
    torch.cuda.synchronize()
    print("sanitize_act: ok")

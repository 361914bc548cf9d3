"""The functional API: fastgrad ops on numpy arrays (CPU) and torch tensors (CPU or
CUDA, enqueued on the current CUDA stream), with any strides the C op accepts.

Each call describes its arrays to the C library without copying, picks a cached plan
for those shapes, strides and dtypes, allocates the plan's workspace from the caller's
own allocator (numpy, or torch's caching allocator so torch sees the memory), and
runs. Outputs are allocated when `out` is None. Errors raise FastgradError with the C
status and message.
"""
import numpy as np

from . import _lib
from ._lib import FastgradError

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - CI has no torch
    torch = None

_allow_tf32 = False


def set_allow_tf32(allow):
    """Lets f32 products round their inputs to tf32 on tensor cores (off by default)."""
    global _allow_tf32
    _allow_tf32 = bool(allow)


_NP_DTYPES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16, np.dtype(np.float64): _lib.F64}
if torch is not None:
    _TORCH_DTYPES = {torch.float32: _lib.F32, torch.float16: _lib.F16, torch.bfloat16: _lib.BF16,
                     torch.float64: _lib.F64}


def _is_torch(a):
    return torch is not None and isinstance(a, torch.Tensor)


def _dtype_code(a, name):
    if _is_torch(a):
        code = _TORCH_DTYPES.get(a.dtype)
    elif isinstance(a, np.ndarray):
        code = _NP_DTYPES.get(a.dtype)
        if code is None and a.dtype.name == "bfloat16":  # ml_dtypes.bfloat16
            code = _lib.BF16
    else:
        raise TypeError(f"fastgrad: {name} must be a numpy array or a torch tensor, not {type(a).__name__}")
    if code is None:
        raise TypeError(f"fastgrad: {name} has dtype {a.dtype}; fastgrad takes float32, float16, bfloat16, float64")
    return code


def _describe(a, name):
    """An fg_tensor viewing `a` in place."""
    if a is None:
        return _lib.Tensor()
    code = _dtype_code(a, name)
    if _is_torch(a):
        shape, strides, ptr = tuple(a.shape), tuple(a.stride()), a.data_ptr()
    else:
        item = a.itemsize
        if any(s % item for s in a.strides):
            raise ValueError(f"fastgrad: {name} has strides {a.strides} that are not whole elements")
        shape, strides, ptr = a.shape, tuple(s // item for s in a.strides), a.ctypes.data
    if len(shape) > _lib.MAX_RANK:
        raise ValueError(f"fastgrad: {name} has {len(shape)} dims; at most {_lib.MAX_RANK}")
    if any(n > 1 and s == 0 for n, s in zip(shape, strides)):
        raise ValueError(f"fastgrad: {name} has a zero stride (a broadcast view); make it contiguous first")
    t = _lib.Tensor()
    t.data = ptr or None
    t.dtype = code
    t.rank = len(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        t.shape[i] = n
        t.stride[i] = s
    if len(shape) and all(s == 0 for s in strides):  # only when every dim has size <= 1
        for i in range(len(shape)):
            t.stride[i] = 1
    return t


def _placement(first):
    """(backend, device, torch device or None) of an array."""
    if _is_torch(first):
        if first.is_cuda:
            return _lib.BACKEND_CUDA, first.device.index or 0, first.device
        return _lib.BACKEND_CPU, 0, first.device
    return _lib.BACKEND_CPU, 0, None


def _empty_like_family(ref, shape, dtype=None):
    if _is_torch(ref):
        return torch.empty(shape, dtype=dtype or ref.dtype, device=ref.device)
    return np.empty(shape, dtype=dtype or ref.dtype)


def _signature(a):
    if a is None:
        return None
    if _is_torch(a):
        return (a.dtype, a.shape, a.stride())
    return (a.dtype, a.shape, a.strides)


def _pointer(a):
    if a is None:
        return None
    return a.data_ptr() if _is_torch(a) else a.ctypes.data


class _Entry:
    """A cached plan with its descriptor array; a call only writes the data pointers."""

    def __init__(self, ctx, op, operands, names, accumulate, flags):
        descs = [_describe(a, n) for a, n in zip(operands, names)]
        desc = _lib.PlanDesc(op=_lib.OP[op], accumulate=int(bool(accumulate)), flags=flags)
        for i, t in enumerate(descs):
            desc.operands[i] = t
        self.plan = _lib.Plan(ctx, desc)
        self.array = (_lib.Tensor * _lib.MAX_OPERANDS)(*descs)


def run(op, operands, names, accumulate=False):
    """Runs op (a name of _lib.OP) on operands in the C order (None = absent)."""
    ref = operands[0]
    backend, device, tdev = _placement(ref)
    ctx = _lib.context(backend, device)
    if tdev is not None and backend == _lib.BACKEND_CUDA:
        ctx.set_stream(torch.cuda.current_stream(tdev).cuda_stream)
    flags = _lib.PLAN_ALLOW_TF32 if _allow_tf32 else 0
    key = (op, bool(accumulate), flags, tuple(_signature(a) for a in operands))
    entry = ctx.plans.get(key)
    if entry is None:
        entry = ctx.plans[key] = _Entry(ctx, op, operands, names, accumulate, flags)
    for i, a in enumerate(operands):
        entry.array[i].data = _pointer(a)
    plan = entry.plan
    ws, ws_ptr = None, 0
    if plan.workspace_bytes:
        if _is_torch(ref):
            ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=ref.device)
            ws_ptr = ws.data_ptr()
        else:
            ws = np.empty(plan.workspace_bytes + 256, dtype=np.uint8)
            ws_ptr = (ws.ctypes.data + 255) & ~255
    plan.run(entry.array, ws_ptr, plan.workspace_bytes)
    return plan


def plan_info(op, operands, names, accumulate=False):
    """What runs for these operands: kernel name, arch, precision (a dict)."""
    p = run(op, operands, names, accumulate)
    i = p.info
    return {"op": i.op_name.decode(), "kernel": i.kernel.decode(), "arch": i.arch,
            "backend": "cuda" if i.backend == _lib.BACKEND_CUDA else "cpu",
            "math": i.precision.math, "accumulator": i.precision.accumulator, "tf32": bool(i.precision.tf32),
            "deterministic": bool(i.precision.deterministic), "workspace_bytes": i.workspace_bytes}


# ------------------------------------------------------------------ Linear

def linear_forward(x, w, b=None, out=None):
    """y = x·wᵀ (+ b); x [..., K], w [M, K], b [M]."""
    if out is None:
        out = _empty_like_family(x, tuple(x.shape[:-1]) + (w.shape[0],))
    run("linear_forward", [x, w, b, out], ["x", "w", "b", "y"])
    return out


def linear_backward_input(dy, w, out=None, accumulate=False):
    """dx = dy·w."""
    if out is None:
        out = _empty_like_family(dy, tuple(dy.shape[:-1]) + (w.shape[1],))
    run("linear_backward_input", [dy, w, out], ["dy", "w", "dx"], accumulate)
    return out


def linear_backward_weight(dy, x, out=None, accumulate=False):
    """dw = dyᵀ·x over all leading dims."""
    if out is None:
        out = _empty_like_family(dy, (dy.shape[-1], x.shape[-1]))
    run("linear_backward_weight", [dy, x, out], ["dy", "x", "dw"], accumulate)
    return out


def linear_backward_bias(dy, out=None, accumulate=False):
    """db = Σ dy over all leading dims."""
    if out is None:
        out = _empty_like_family(dy, (dy.shape[-1],))
    run("linear_backward_bias", [dy, out], ["dy", "db"], accumulate)
    return out


# ------------------------------------------------------------------ Matmul

def matmul_forward(a, b, out=None):
    """c = a·b; a [(B,)M,K], b [(B,)K,N]; a 2-D operand is broadcast."""
    if out is None:
        batch = (a.shape[0],) if a.ndim == 3 else (b.shape[0],) if b.ndim == 3 else ()
        out = _empty_like_family(a, batch + (a.shape[-2], b.shape[-1]))
    run("matmul_forward", [a, b, out], ["a", "b", "c"])
    return out


def matmul_backward_input(dc, b, batched=None, out=None, accumulate=False):
    """da = dc·bᵀ; 2-D (summed over the batch) unless `batched` (default: dc is 3-D)."""
    if out is None:
        batched = dc.ndim == 3 if batched is None else batched
        out = _empty_like_family(dc, ((dc.shape[0],) if batched else ()) + (dc.shape[-2], b.shape[-2]))
    run("matmul_backward_input", [dc, b, out], ["dc", "b", "da"], accumulate)
    return out


def matmul_backward_other(a, dc, batched=None, out=None, accumulate=False):
    """db = aᵀ·dc; 2-D (summed over the batch) unless `batched` (default: dc is 3-D)."""
    if out is None:
        batched = dc.ndim == 3 if batched is None else batched
        out = _empty_like_family(dc, ((dc.shape[0],) if batched else ()) + (a.shape[-1], dc.shape[-1]))
    run("matmul_backward_other", [a, dc, out], ["a", "dc", "db"], accumulate)
    return out


# ------------------------------------------------------------------ Outer

def outer_forward(x, y, out=None):
    """z = x ⊗ y."""
    if out is None:
        out = _empty_like_family(x, (x.shape[0], y.shape[0]))
    run("outer_forward", [x, y, out], ["x", "y", "z"])
    return out


def outer_backward_input(dz, y, out=None, accumulate=False):
    """dx = dz·y."""
    if out is None:
        out = _empty_like_family(dz, (dz.shape[0],))
    run("outer_backward_input", [dz, y, out], ["dz", "y", "dx"], accumulate)
    return out


def outer_backward_other(dz, x, out=None, accumulate=False):
    """dy = dzᵀ·x."""
    if out is None:
        out = _empty_like_family(dz, (dz.shape[1],))
    run("outer_backward_other", [dz, x, out], ["dz", "x", "dy"], accumulate)
    return out


__all__ = ["FastgradError", "set_allow_tf32", "plan_info", "linear_forward", "linear_backward_input",
           "linear_backward_weight", "linear_backward_bias", "matmul_forward", "matmul_backward_input",
           "matmul_backward_other", "outer_forward", "outer_backward_input", "outer_backward_other"]

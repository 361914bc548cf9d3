"""PyTorch integration: an autograd Function and an nn.Module per op family.

Each backward calls only the kernels for the gradients autograd asks for
(ctx.needs_input_grad). Gradients are ordinary tensors, so the modules work under
torch.no_grad, with non-contiguous inputs (a layout the C op refuses is made
contiguous first), and inside DistributedDataParallel.
"""
import math

import torch

from . import ops
from ._lib import ERR_UNSUPPORTED, FastgradError


def _dense(a):
    """A broadcast view (a zero stride, as autograd hands out for sum()) made dense."""
    if isinstance(a, torch.Tensor) and any(s == 0 and n > 1 for s, n in zip(a.stride(), a.shape)):
        return a.contiguous()
    return a


def _call(fn, *args, **kwargs):
    """Runs fn; when the C op refuses a layout (no unit stride, leading dims that do not
    collapse), retries once on contiguous copies."""
    args = [_dense(a) for a in args]
    try:
        return fn(*args, **kwargs)
    except (FastgradError, ValueError) as e:
        if isinstance(e, FastgradError) and e.status != ERR_UNSUPPORTED:
            raise
        fixed = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
        return fn(*fixed, **kwargs)


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _call(ops.linear_forward, x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _call(ops.linear_backward_input, dy, weight)
        if ctx.needs_input_grad[1]:
            dw = _call(ops.linear_backward_weight, dy, x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = _call(ops.linear_backward_bias, dy)
        return dx, dw, db


class MatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _call(ops.matmul_forward, a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        da = db = None
        if ctx.needs_input_grad[0]:
            da = _call(ops.matmul_backward_input, dc, b, batched=a.dim() == 3)
        if ctx.needs_input_grad[1]:
            db = _call(ops.matmul_backward_other, a, dc, batched=b.dim() == 3)
        return da, db


class OuterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return _call(ops.outer_forward, x, y)

    @staticmethod
    def backward(ctx, dz):
        x, y = ctx.saved_tensors
        dx = dy = None
        if ctx.needs_input_grad[0]:
            dx = _call(ops.outer_backward_input, dz, y)
        if ctx.needs_input_grad[1]:
            dy = _call(ops.outer_backward_other, dz, x)
        return dx, dy


def linear(x, weight, bias=None):
    """torch.nn.functional.linear on fastgrad kernels."""
    return LinearFunction.apply(x, weight, bias)


def matmul(a, b):
    """a @ b for 2-D / 3-D operands (a 2-D one broadcast) on fastgrad kernels."""
    return MatmulFunction.apply(a, b)


def outer(x, y):
    """torch.outer on fastgrad kernels."""
    return OuterFunction.apply(x, y)


class Linear(torch.nn.Module):
    """Drop-in for torch.nn.Linear (same parameters, same initialization)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.bias = torch.nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Matmul(torch.nn.Module):
    """a @ b as a module (no parameters)."""

    def forward(self, a, b):
        return matmul(a, b)


class Outer(torch.nn.Module):
    """x ⊗ y as a module (no parameters)."""

    def forward(self, x, y):
        return outer(x, y)

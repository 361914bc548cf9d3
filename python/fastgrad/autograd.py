"""PyTorch integration: an autograd Function and an nn.Module per op family.

Each backward calls only the kernels for the gradients autograd asks for
(ctx.needs_input_grad). Gradients are ordinary tensors, so the modules work under
torch.no_grad, with non-contiguous inputs (a layout the C op refuses is made
contiguous first), and inside DistributedDataParallel.

The public functions run these autograd.Functions in eager mode and the custom ops of
torch_ops.py (the same kernels, registered with torch.library) while torch.compile traces,
so compiled models have no graph breaks at fastgrad calls (docs/decisions.md: why eager
stays direct). Eager fg.linear / fg.Linear and fg.linear_act / fg.LinearAct run through the torch
C++ extension when it is built (_torchext.cpp: the same kernels and plans, their autograd in C++)
and LinearFunction / LinearActFunction otherwise.
"""
import ctypes
import math

import numpy as np
import torch

from . import _lib, _torchext, ops
from .torch_ops import _call, _dense, _fresh, draw_seed, dtype_name, routed  # noqa: F401 - _dense, _fresh for norm / encoder


FG = torch.ops.fastgrad  # the custom ops (torch_ops): what torch.compile traces


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _call(ops.linear_forward, x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = _dense(dy)  # once for the three gradients (a broadcast dy, as sum() gives, is copied)
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


# the C++ extension's linear and linear_act (their autograd in C++, _torchext.cpp), or None when
# it is not built
_ext_linear = _torchext.MODULE.linear if _torchext.MODULE is not None else None
# (getattr: a module built before linear_act, which configure takes, leaves it to Python)
_ext_linear_act = getattr(_torchext.MODULE, "linear_act", None)


def use_torchext(on=True):
    """Whether eager fg.linear / fg.Linear and fg.linear_act / fg.LinearAct run through the C++
    extension when it is built (the default); off, they run LinearFunction / LinearActFunction
    (the same kernels, the same results)."""
    global _ext_linear, _ext_linear_act
    m = _torchext.MODULE if on else None
    _ext_linear = m.linear if m is not None else None
    _ext_linear_act = getattr(m, "linear_act", None)


def linear(x, weight, bias=None):
    """torch.nn.functional.linear on fastgrad kernels."""
    if routed():
        return FG.linear(x, weight, bias)
    if _ext_linear is not None:  # None back: operands it does not take; Python runs the call
        y = _ext_linear(x, weight, bias, _lib.PLAN_ALLOW_TF32 if ops._allow_tf32 else 0)
        if y is not None:
            return y
    return LinearFunction.apply(x, weight, bias)


def matmul(a, b):
    """a @ b for 2-D / 3-D operands (a 2-D one broadcast) on fastgrad kernels."""
    if routed():
        return FG.matmul(a, b)
    return MatmulFunction.apply(a, b)


def outer(x, y):
    """torch.outer on fastgrad kernels."""
    if routed():
        return FG.outer(x, y)
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


# ------------------------------------------------------------------ elementwise family

class UnaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kind, scalars):
        ctx.save_for_backward(x)
        ctx.kind, ctx.scalars = kind, scalars
        return _call(ops.unary_forward, kind, x, scalars)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = _call(ops.unary_backward, ctx.kind, dy, x, ctx.scalars) if ctx.needs_input_grad[0] else None
        return dx, None, None


def _unary(x, kind, scalars):
    if routed():
        return FG.unary(x, kind, list(scalars))
    return UnaryFunction.apply(x, kind, scalars)


def scale(x, s):
    return _unary(x, "scale", (float(s),))


def pow(x, p):  # noqa: A001 - mirrors torch.pow
    return _unary(x, "pow", (float(p),))


def leaky_relu(x, negative_slope=0.01):
    return _unary(x, "leaky_relu", (float(negative_slope),))


def elu(x, alpha=1.0):
    return _unary(x, "elu", (float(alpha),))


def clamp(x, lo, hi):
    return _unary(x, "clamp", (float(lo), float(hi)))


def softcap(x, cap):
    """cap·tanh(x / cap)."""
    return _unary(x, "softcap", (float(cap),))


class LerpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, weight):
        tensor_w = isinstance(weight, torch.Tensor)
        ctx.tensor_w = tensor_w
        ctx.weight = None if tensor_w else float(weight)
        ctx.save_for_backward(a, b, weight if tensor_w else None)
        return _call(ops.lerp_forward, a, b, weight)

    @staticmethod
    def backward(ctx, dy):
        a, b, w = ctx.saved_tensors
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.tensor_w and ctx.needs_input_grad[2])
        if not any(need):
            return None, None, None
        da, db, dw = _call(ops.lerp_backward, dy, a, b, w if ctx.tensor_w else ctx.weight, need)
        return da, db, dw


def lerp(a, b, weight):
    """torch.lerp on fastgrad kernels: weight a float or a tensor (then it gets a gradient)."""
    if routed():
        tensor_w = isinstance(weight, torch.Tensor)
        return FG.lerp(a, b, weight if tensor_w else None, 0.0 if tensor_w else float(weight))
    return LerpFunction.apply(a, b, weight)


class AxpbyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, alpha, beta):
        ctx.shapes, ctx.alpha, ctx.beta = (a.shape, b.shape), alpha, beta
        return _call(ops.axpby_forward, a, b, alpha, beta)

    @staticmethod
    def backward(ctx, dy):
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        if not any(need):
            return None, None, None, None
        da, db = _call(ops.axpby_backward, dy, ctx.shapes[0], ctx.shapes[1], ctx.alpha, ctx.beta, need)
        return da, db, None, None


def axpby(a, b, alpha, beta):
    """alpha·a + beta·b."""
    if routed():
        return FG.axpby(a, b, float(alpha), float(beta))
    return AxpbyFunction.apply(a, b, float(alpha), float(beta))


# ------------------------------------------------------------------ AdamW

def _data_column(arr):
    """The data pointers of a ctypes fg_tensor array as a writable numpy column over its memory."""
    width = ctypes.sizeof(_lib.Tensor)
    assert width % 8 == 0 and _lib.Tensor.data.offset % 8 == 0
    return np.frombuffer(arr, dtype=np.uint64).reshape(len(arr), width // 8)[:, _lib.Tensor.data.offset // 8]


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW on one fused fastgrad launch per (device, dtype) group.

    State per parameter: "step" (an int), "exp_avg" and "exp_avg_sq" (the moments, the
    parameter's shape; f32 by default, or with moment_dtype="param" the parameter's own dtype,
    as torch.optim.AdamW(fused=True) keeps them for bf16 parameters: half the state and the
    traffic), and with master_weights=True for bf16/f16 parameters "master", an f32 copy that
    the step updates and rounds into the parameter. Gradients may be in the parameters' dtype
    or f32. Deterministic.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, master_weights=False,
                 moment_dtype="float32"):
        if not 0.0 <= lr:
            raise ValueError(f"invalid lr {lr}")
        if moment_dtype not in ("float32", "param"):
            raise ValueError(f"moment_dtype must be 'float32' or 'param', not {moment_dtype!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, master_weights=master_weights,
                        moment_dtype=moment_dtype)
        super().__init__(params, defaults)
        # Per parameter group whose parameters all went into one launch last step: the described
        # lists, reused while the parameters keep their storage (the host cost of a step is then a
        # pass over the gradients' addresses, not a description of every tensor).
        self._plans = {}

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._plans.clear()  # the state tensors were replaced

    @torch.no_grad()
    def step(self, closure=None, grad_scale=1.0):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if not self._step_planned(group, grad_scale):
                self._step_group(group, grad_scale)
        return loss

    def _step_group(self, group, grad_scale):
        """The general step: bucket the parameters by (device, dtypes, step, master), one launch
        each; remember the described lists when one bucket held the whole group."""
        buckets = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("fastgrad AdamW does not take sparse gradients")
            st = self.state[p]
            if not st:
                st["step"] = 0
                mdt = p.dtype if group.get("moment_dtype", "float32") == "param" else torch.float32
                st["exp_avg"] = torch.zeros_like(p, dtype=mdt, memory_format=torch.contiguous_format)
                st["exp_avg_sq"] = torch.zeros_like(p, dtype=mdt, memory_format=torch.contiguous_format)
                if group["master_weights"] and p.dtype != torch.float32:
                    st["master"] = p.detach().float().contiguous()
            st["step"] += 1
            key = (p.device, p.dtype, p.grad.dtype, st["exp_avg"].dtype, st["step"], "master" in st)
            buckets.setdefault(key, []).append(p)
        self._plans.pop(id(group), None)
        beta1, beta2 = group["betas"]
        for (_, _, gdt, _, step, has_master), ps in buckets.items():
            grads = [p.grad if p.grad.is_contiguous() else p.grad.contiguous() for p in ps]
            arrays = [ops.adamw_describe("params", ps), ops.adamw_describe("grads", grads),
                      ops.adamw_describe("exp_avg", [self.state[p]["exp_avg"] for p in ps]),
                      ops.adamw_describe("exp_avg_sq", [self.state[p]["exp_avg_sq"] for p in ps]),
                      ops.adamw_describe("master", [self.state[p]["master"] for p in ps]) if has_master else None]
            ops.adamw_step_arrays(ps[0], len(ps), *arrays, lr=group["lr"], beta1=beta1, beta2=beta2,
                                  eps=group["eps"], weight_decay=group["weight_decay"], step=step,
                                  grad_scale=grad_scale)
            if len(buckets) == 1 and len(ps) == len(group["params"]):
                self._plans[id(group)] = dict(group=group, params=list(ps), ptrs=tuple(p.data_ptr() for p in ps),
                                              gdt=gdt, step=step, arrays=arrays, gdata=_data_column(arrays[1]),
                                              states=[self.state[p] for p in ps])

    def _step_planned(self, group, grad_scale):
        """The step of a group planned by its last one, when nothing it described has changed:
        the same parameters, with their storage, every gradient present in the same dtype (only
        the gradients' addresses are written into the kept list). False: take the general path."""
        plan = self._plans.get(id(group))
        ps = group["params"]
        if plan is None or plan["group"] is not group or len(plan["params"]) != len(ps):
            return False
        if any(a is not b for a, b in zip(plan["params"], ps)):
            return False
        if plan["ptrs"] != tuple(p.data_ptr() for p in ps):
            return False
        gdt, keep, gptrs = plan["gdt"], [], []
        for p in ps:
            g = p.grad
            if g is None or g.dtype != gdt or g.is_sparse:
                return False
            if not g.is_contiguous():
                g = g.contiguous()
                keep.append(g)
            gptrs.append(g.data_ptr())
        plan["gdata"][:] = gptrs  # the kept grads list's data pointers, in one write
        step = plan["step"] + 1
        for st in plan["states"]:
            st["step"] = step
        plan["step"] = step
        beta1, beta2 = group["betas"]
        ops.adamw_step_arrays(ps[0], len(ps), *plan["arrays"], lr=group["lr"], beta1=beta1, beta2=beta2,
                              eps=group["eps"], weight_decay=group["weight_decay"], step=step, grad_scale=grad_scale)
        return True


# ------------------------------------------------------------------ elementwise modules

class LeakyReLU(torch.nn.Module):
    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return leaky_relu(x, self.negative_slope)


class ELU(torch.nn.Module):
    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return elu(x, self.alpha)


class Clamp(torch.nn.Module):
    def __init__(self, lo, hi):
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x):
        return clamp(x, self.lo, self.hi)


class Softcap(torch.nn.Module):
    """cap·tanh(x / cap), as used to cap attention or output logits."""

    def __init__(self, cap):
        super().__init__()
        self.cap = cap

    def forward(self, x):
        return softcap(x, self.cap)


class Lerp(torch.nn.Module):
    """lerp(a, b, weight) with a fixed float weight."""

    def __init__(self, weight):
        super().__init__()
        self.weight = float(weight)

    def forward(self, a, b):
        return lerp(a, b, self.weight)


# ------------------------------------------------------------------ Linear log-prob / cross-entropy

def _signed64(v):
    """A 64-bit seed as the int64 that has its bits."""
    v = int(v) & (2**64 - 1)
    return v - 2**64 if v >= 2**63 else v


def _flat(h, target):
    """[..., D] hidden states and [...] targets as [N, D] and [N] (contiguous)."""
    return h.reshape(-1, h.shape[-1]).contiguous(), target.reshape(-1).contiguous()


class LinearLogpFunction(torch.autograd.Function):
    """(logp, entropy) of log_softmax(cap(h·wᵀ + b)/T) at target; the backward recomputes the
    logits tile by tile (the [N, V] logits never exist)."""

    @staticmethod
    def forward(ctx, h, weight, bias, target, options, want_entropy):
        shape = h.shape[:-1]
        h2, t2 = _flat(h, target)
        logp, lse, ent = ops.linear_logp_forward(h2, weight.contiguous(), t2, bias, entropy=want_entropy,
                                                 options=options)
        ctx.save_for_backward(h2, weight, bias, t2, lse, ent)
        ctx.options, ctx.shape = options, shape
        ctx.mark_non_differentiable(t2)
        if ent is None:
            return logp.reshape(shape), None
        return logp.reshape(shape), ent.reshape(shape)

    @staticmethod
    def backward(ctx, dlogp, dent):
        h2, weight, bias, t2, lse, ent = ctx.saved_tensors
        need = ctx.needs_input_grad
        if not (need[0] or need[1] or (bias is not None and need[2])):
            return None, None, None, None, None, None
        rd = lse.dtype
        dl = dlogp.reshape(-1).to(rd).contiguous() if dlogp is not None else None
        de = dent.reshape(-1).to(rd).contiguous() if (dent is not None and ent is not None) else None
        if dl is None and de is None:
            dl = torch.zeros_like(lse)
        dh, dw, db = ops.linear_logp_backward(h2, weight.contiguous(), t2, lse, bias, dlogp=dl, dentropy=de,
                                              entropy=ent if de is not None else None,
                                              need=(need[0], need[1], need[2]), options=ctx.options)
        if dh is not None:
            dh = dh.reshape(ctx.shape + (h2.shape[-1],))
        return dh, dw, db, None, None, None


def linear_logp(h, weight, target, bias=None, temperature=1.0, softcap=0.0, ignore_index=None,
                return_entropy=False, max_tile_elements=0):
    """log_softmax(cap(h·wᵀ + b)/T)[target] per row (and the softmax entropy per row when
    return_entropy), differentiable in h, weight and bias; rows whose target is
    ignore_index give 0 and no gradient."""
    if routed():
        shape = h.shape[:-1]
        h2, t2 = _flat(h, target)
        logp, _, ent = FG.linear_logp(h2, weight, t2, bias, bool(return_entropy), float(temperature), float(softcap),
                                      None if ignore_index is None else int(ignore_index), int(max_tile_elements))
        logp = logp.reshape(shape)
        return (logp, ent.reshape(shape)) if return_entropy else logp
    opt = ops.logp_options(temperature=temperature, softcap=softcap, ignore_index=ignore_index,
                           max_tile_elements=max_tile_elements)
    logp, ent = LinearLogpFunction.apply(h, weight, bias, target, opt, bool(return_entropy))
    return (logp, ent) if return_entropy else logp


class LinearCrossEntropyFunction(torch.autograd.Function):
    """One pass: the loss and its gradients are computed together in the forward; the
    backward scales them by the incoming gradient (a scalar)."""

    @staticmethod
    def forward(ctx, h, weight, bias, target, row_weight, options):
        h2, t2 = _flat(h, target)
        need = (h.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
        loss, _, dh, dw, db = ops.linear_cross_entropy_onepass(h2, weight.contiguous(), t2, bias, row_weight, need=need,
                                                       options=options)
        ctx.shape = h.shape
        ctx.save_for_backward(dh, dw, db)
        return loss.reshape(())

    @staticmethod
    def backward(ctx, g):
        dh, dw, db = ctx.saved_tensors
        # no host sync on g: the gradients are scaled on the device (one pass each)
        scale = lambda t: None if t is None else t.mul_(g.to(t.dtype))  # noqa: E731
        dh = scale(dh)
        return (dh.reshape(ctx.shape) if dh is not None else None), scale(dw), scale(db), None, None, None


def linear_cross_entropy(h, weight, target, bias=None, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                         ignore_index=-100, row_weight=None, temperature=1.0, softcap=0.0, max_tile_elements=0):
    """Cross-entropy of the logits h·wᵀ + b against target without forming them.
    reduction mean / sum: one pass (three products); none: the split log-prob path
    (no label smoothing or z-loss there)."""
    if reduction == "none":
        if label_smoothing or z_loss:
            raise ValueError("fastgrad: reduction='none' takes no label_smoothing or z_loss")
        logp = linear_logp(h, weight, target, bias, temperature, softcap, ignore_index,
                           max_tile_elements=max_tile_elements)
        loss = -logp
        return loss if row_weight is None else loss * row_weight.reshape(loss.shape)
    rw = None
    if row_weight is not None:
        rw = row_weight.reshape(-1).to(torch.float64 if h.dtype == torch.float64 else torch.float32).contiguous()
    if routed():
        if reduction not in ("mean", "sum"):
            raise ValueError(f"fastgrad: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
        h2, t2 = _flat(h, target)
        need = (h.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
        loss = FG.linear_cross_entropy(h2, weight, t2, bias, rw, *need, reduction, float(label_smoothing),
                                       float(z_loss), None if ignore_index is None else int(ignore_index),
                                       float(temperature), float(softcap), int(max_tile_elements))[0]
        return loss.reshape(())
    opt = ops.logp_options(temperature=temperature, softcap=softcap, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing, z_loss=z_loss, max_tile_elements=max_tile_elements)
    return LinearCrossEntropyFunction.apply(h, weight, bias, target, rw, opt)


class LinearCrossEntropy(torch.nn.Module):
    """Drop-in for `F.cross_entropy(F.linear(h, weight, bias), target)` (e.g. a language
    model head plus its loss) that never holds the logits."""

    def __init__(self, reduction="mean", label_smoothing=0.0, z_loss=0.0, ignore_index=-100, temperature=1.0,
                 softcap=0.0):
        super().__init__()
        self.reduction, self.label_smoothing, self.z_loss = reduction, label_smoothing, z_loss
        self.ignore_index, self.temperature, self.softcap = ignore_index, temperature, softcap

    def forward(self, h, weight, target, bias=None, row_weight=None):
        return linear_cross_entropy(h, weight, target, bias, self.reduction, self.label_smoothing, self.z_loss,
                                    self.ignore_index, row_weight, self.temperature, self.softcap)


# ------------------------------------------------------------------ Linear + activation

class LinearActFunction(torch.autograd.Function):
    """y = act(x·wᵀ + b); the backward forms g = dy ⊙ act′(pre) once and computes only the
    gradients autograd asks for. What is saved for the backward (save_pre):
      "slope": act′(pre), rounded to the dtype — the memory of pre, and a backward whose g is
        one multiply (on sm_90a formed inside dx's product)
      True: the pre-activation itself
      "auto" (the default): the slope when the reduction is longer than 128, else pre. With
        a long reduction the products dominate and the slope form's cheaper backward wins;
        with a short one the forward is one short tile kernel that would have to compute both
        act and act′, and keeping pre wins
      False: nothing; the backward recomputes pre (one more product, no N·M buffer)
    relu keeps nothing but y (its backward reads the mask off y), none keeps nothing (g = dy).
    The backward forms g in the saved tensor's memory (it is dead after the backward); a
    second backward through the same graph (retain_graph) recomputes pre instead."""

    @staticmethod
    def forward(ctx, x, weight, bias, act, save_pre):
        relu = act == "relu"
        if save_pre == "auto":
            save_pre = "slope" if x.shape[-1] > 128 else True
        keep = bool(save_pre) and act not in ("relu", "none")
        slope = keep and save_pre == "slope"
        y, pre = _call(ops.linear_act_forward, x, weight, bias, act, keep, slope=slope)
        ctx.act, ctx.has_bias, ctx.relu, ctx.consumed = act, bias is not None, relu and bool(save_pre), False
        ctx.slope = slope
        ctx.save_for_backward(x, weight, bias, y if ctx.relu else pre)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, pre = ctx.saved_tensors
        need = ctx.needs_input_grad
        consume = pre is not None and not ctx.relu  # relu's pre is y, the caller's tensor
        if ctx.consumed:  # pre holds the first backward's g: recompute it
            pre, consume = None, False
        dx, dw, db = _call(ops.linear_act_backward, dy.contiguous(), x.contiguous(), weight.contiguous(), bias,
                           pre, ctx.act, need=(need[0], need[1], ctx.has_bias and need[2]), consume_pre=consume,
                           slope=ctx.slope and pre is not None)
        ctx.consumed = ctx.consumed or consume
        return dx, dw, db, None, None


def linear_act(x, weight, bias=None, act="gelu_tanh", save_pre="auto"):
    """act(x·wᵀ + b) with its fused backward; act in none, relu, gelu, gelu_tanh, silu,
    sigmoid, tanh. save_pre: "auto" (the faster of the next two for the shape), "slope" keeps
    act′(pre), True the pre-activation, False nothing (the backward recomputes it);
    LinearActFunction says more."""
    if save_pre not in (True, False, "slope", "auto"):
        raise ValueError(f"fastgrad: save_pre must be True, False, 'slope' or 'auto', not {save_pre!r}")
    if routed():
        sp = ("slope" if x.shape[-1] > 128 else True) if save_pre == "auto" else save_pre
        return FG.linear_act(x, weight, bias, act, bool(sp), sp == "slope")[0]
    save_pre = save_pre if save_pre in ("slope", "auto") else bool(save_pre)
    if _ext_linear_act is not None:  # None back: operands it does not take; Python runs the call
        y = _ext_linear_act(x, weight, bias, act, save_pre, _lib.PLAN_ALLOW_TF32 if ops._allow_tf32 else 0)
        if y is not None:
            return y
    return LinearActFunction.apply(x, weight, bias, act, save_pre)


class LinearAct(Linear):
    """nn.Linear followed by an activation, as one op in each direction."""

    def __init__(self, in_features, out_features, act="gelu_tanh", bias=True, save_pre="auto", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.act, self.save_pre = act, save_pre

    def forward(self, x):
        return linear_act(x, self.weight, self.bias, self.act, self.save_pre)

    def extra_repr(self):
        return super().extra_repr() + f", act={self.act}, save_pre={self.save_pre}"


class AttentionFunction(torch.autograd.Function):
    """Multi-head attention on [B, H, L, hd] tensors: o (and the pre-softmax scores when asked).
    Saves q, k, v, o and the f32 row log-sum-exp; the backward recomputes the probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, scores_in, lengths, causal, scale, dropout_p, seed, return_scores, scores_dtype):
        opt = ops.attention_options(causal, scale, dropout_p, seed, 0)
        o, lse, scores = _call(ops.attention_forward, q, k, v, lengths, scores_in, return_scores, scores_dtype,
                               options=opt)
        ctx.save_for_backward(q, k, v, o, lse, scores_in, lengths)
        ctx.opt = opt
        ctx.return_scores = return_scores
        ctx.mark_non_differentiable(lse)
        return (o, scores) if return_scores else o

    @staticmethod
    def backward(ctx, do, dscores=None):
        q, k, v, o, lse, scores_in, lengths = ctx.saved_tensors
        need = ctx.needs_input_grad
        if not any(need[:4]):
            return (None,) * 11
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv, ds = _call(ops.attention_backward, do, q, k, v, o, lse, lengths, scores_in, dscores,
                               need=(need[0], need[1], need[2], scores_in is not None and need[3]), options=ctx.opt)
        return dq, dk, dv, ds, None, None, None, None, None, None, None


def attention(q, k, v, causal=False, scale=None, scores_in=None, return_scores=False, dropout_p=0.0, lengths=None,
              seed=None, scores_dtype=None):
    """Multi-head scaled dot-product attention on [B, H, L, hd] tensors (any strides: e.g. a
    [B, L, 3, H, hd] projection viewed per head), with its fused backward and no [L, L] buffer:
    o = softmax(q·kᵀ·scale + scores_in, masked) · v, the softmax's probabilities dropped with
    dropout_p (a mask from the counter-based generator under `seed`, drawn from torch's default
    generator when None). lengths [B]: key-padding lengths. return_scores: also the pre-softmax
    scores (-inf where masked; scores_in's dtype, else scores_dtype or q's) — PatchTST's residual
    attention feeds them to the next layer as its scores_in. Returns o, or (o, scores)."""
    if routed():
        seed_t = None
        if dropout_p > 0:
            seed_t = draw_seed() if seed is None else torch.tensor([_signed64(seed)], dtype=torch.int64)
        o, _, scores = FG.attention(q, k, v, scores_in, lengths, seed_t, 0, bool(causal),
                                    None if scale is None else float(scale), float(dropout_p), bool(return_scores),
                                    dtype_name(scores_dtype))
        return (o, scores) if return_scores else o
    if dropout_p > 0 and seed is None:
        seed = int(draw_seed().item())
    return AttentionFunction.apply(q, k, v, scores_in, lengths, causal, scale, float(dropout_p), seed or 0,
                                   bool(return_scores), scores_dtype)


class Attention(torch.nn.Module):
    """The attention core as a module (no projections): causal / dropout fixed at construction,
    dropout only in training mode; forward(q, k, v, scores_in=None, lengths=None) as
    fastgrad.attention."""

    def __init__(self, causal=False, dropout=0.0, scale=None, return_scores=False):
        super().__init__()
        self.causal, self.dropout, self.scale, self.return_scores = causal, float(dropout), scale, return_scores

    def forward(self, q, k, v, scores_in=None, lengths=None):
        return attention(q, k, v, self.causal, self.scale, scores_in, self.return_scores,
                         self.dropout if self.training else 0.0, lengths)

    def extra_repr(self):
        return f"causal={self.causal}, dropout={self.dropout}, scale={self.scale}, return_scores={self.return_scores}"

"""The normalization family from Python: LayerNorm / RMSNorm (with the residual add and its dropout
fused), BatchNorm over every leading dim (channels last) with its split form for synchronized
BatchNorm, dropout, and RevIN — functional forms on numpy arrays (CPU) and torch tensors (CPU or
CUDA), and, with torch, autograd Functions and drop-in modules (fg.LayerNorm, fg.RMSNorm,
fg.BatchNorm1d, fg.Dropout, fg.RevIN).

Every function here is one library op (python/fastgrad/ops.py's `run`, operands by the names the
op table gives them); the options structs come from _lib. Dropout masks are counter-based
(seed, offset): the backward regenerates the forward's mask, nothing is stored; the torch modules
draw each call's seed from torch's default CPU generator, so torch.manual_seed makes them
reproducible.

With the torch C++ extension built (_torchext.cpp), the torch-tensor path of norm_forward /
norm_backward / batch_norm_forward / batch_norm_backward and the row norm's autograd run in C++
(the same plans, the same bits); what it does not take it hands back, and the Python here runs.
"""
import numpy as np

from . import _lib, _torchext
from .ops import _empty_like_family, _is_torch, run

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - CI has no torch
    torch = None

# the C++ extension (_torchext.cpp) when built and on (use_torchext), else None
_ext = None


def use_torchext(on=True):
    """Whether the torch path of the row norms and BatchNorm (functional and autograd) runs through
    the C++ extension when it is built (the default); off, the Python here runs them (the same
    kernels, the same results)."""
    global _ext
    m = _torchext.MODULE
    _ext = m if on and m is not None and hasattr(m, "norm_forward") else None


use_torchext(True)


def _no_out(out):
    """The gradients' out= is all None (the default): the extension may run the call."""
    return type(out) in (tuple, list) and len(out) == 4 and all(o is None for o in out)


def _need4(need):
    return type(need) in (tuple, list) and len(need) == 4


def _kind(kind):
    if kind not in _lib.NORM:
        raise ValueError(f"fastgrad: kind must be one of {sorted(_lib.NORM)}, not {kind!r}")
    return _lib.NORM[kind]


def _u64(v):
    return int(v) & (2**64 - 1)


def dropout_options(p=0.0, seed=0, offset=0):
    """The fg_dropout_options: drop probability p in [0, 1], the generator's (seed, offset)."""
    return _lib.DropoutOptions(p=float(p), seed=_u64(seed), offset=_u64(offset))


def norm_options(kind="layer", eps=1e-5, p=0.0, seed=0, offset=0):
    """The fg_norm_options of the row norms: kind 'layer' or 'rms', eps > 0, the residual branch's
    dropout."""
    return _lib.NormOptions(kind=_kind(kind), eps=float(eps), dropout=dropout_options(p, seed, offset))


def batch_norm_options(training=True, eps=1e-5, momentum=0.1, p=0.0, seed=0, offset=0):
    """The fg_batch_norm_options: training (batch statistics) or evaluation (running ones)."""
    return _lib.BatchNormOptions(eval=int(not training), eps=float(eps), momentum=float(momentum),
                                 dropout=dropout_options(p, seed, offset))


def revin_options(eps=1e-5, denorm=False, subtract_last=False):
    return _lib.RevinOptions(eps=float(eps), denorm=int(bool(denorm)), subtract_last=int(bool(subtract_last)))


def _acc_dtype(x):
    if _is_torch(x):
        return torch.float64 if x.dtype == torch.float64 else torch.float32
    return np.float64 if x.dtype == np.float64 else np.float32


def _rows(x):
    """Per-row statistics' shape: x's leading dims ([1] for a single row: rank 0 reads as absent)."""
    return tuple(x.shape[:-1]) or (1,)


# ------------------------------------------------------------------ row norms

def norm_forward(x, weight=None, bias=None, r=None, kind="layer", eps=1e-5, p=0.0, seed=0, offset=0, keep_sum=True,
                 save_stats=True, out=None):
    """(y, s, mean, rstd) of LayerNorm / RMSNorm over the last dim of s = x + dropout(r) (s = x when r
    is None). s is returned (and written) only when r is given and keep_sum; mean only for
    LayerNorm and save_stats; rstd when save_stats."""
    if _ext is not None and out is None and _is_torch(x):
        res = _ext.norm_forward(x, r, weight, bias, kind, eps, p, seed, offset, keep_sum, save_stats)
        if res is not None:
            return res
    y = out if out is not None else _empty_like_family(x, tuple(x.shape))
    s = _empty_like_family(x, tuple(x.shape)) if r is not None and keep_sum else None
    acc = _acc_dtype(x)
    mean = _empty_like_family(x, _rows(x), acc) if save_stats and kind == "layer" else None
    rstd = _empty_like_family(x, _rows(x), acc) if save_stats else None
    run("norm_forward", dict(x=x, r=r, w=weight, b=bias, y=y, s=s, mean=mean, rstd=rstd),
        options=norm_options(kind, eps, p if r is not None else 0.0, seed, offset))
    return y, s, mean, rstd


def norm_backward(dy, x, weight=None, mean=None, rstd=None, ds=None, kind="layer", eps=1e-5, p=0.0, seed=0, offset=0,
                  need=(True, False, True, True), has_bias=True, param_dtype=None, out=(None, None, None, None),
                  accumulate=False):
    """(dx, dr, dw, db): dx = the gradient of the normalized input (x, or s of a fused forward) plus
    ds (the gradient s gets from the residual path), dr = dx·mask/(1 − p) for the residual branch,
    dw = Σ dy·x̂, db = Σ dy. None where not needed (dw only with a weight, db only with has_bias).
    mean / rstd None: recomputed from x. param_dtype: dw / db's dtype (the weight's, or f32)."""
    if _ext is not None and _is_torch(dy) and _no_out(out) and _need4(need):
        res = _ext.norm_backward(dy, ds, x, weight, mean, rstd, kind, eps, p, seed, offset, *need, has_bias,
                                 param_dtype, accumulate)
        if res is not None:
            return res
    want = [need[0], need[1], need[2] and weight is not None, need[3] and has_bias]
    d = x.shape[-1]
    pdt = param_dtype if param_dtype is not None else (weight.dtype if weight is not None else x.dtype)
    shapes = [(tuple(x.shape), None), (tuple(x.shape), None), ((d,), pdt), ((d,), pdt)]
    grads = [(o if o is not None else _empty_like_family(dy, s, dt)) if w else None
             for w, o, (s, dt) in zip(want, out, shapes)]
    dx, dr, dw, db = grads
    run("norm_backward", dict(dy=dy, ds=ds, x=x, w=weight, mean=mean, rstd=rstd, dx=dx, dr=dr, dw=dw, db=db),
        accumulate, options=norm_options(kind, eps, p, seed, offset))
    return dx, dr, dw, db


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, out=None):
    """(y, mean, rstd) of F.layer_norm over the last dim."""
    y, _, mean, rstd = norm_forward(x, weight, bias, eps=eps, out=out)
    return y, mean, rstd


def rms_norm_forward(x, weight=None, eps=1e-5, out=None):
    """(y, rstd) of F.rms_norm over the last dim."""
    y, _, _, rstd = norm_forward(x, weight, None, kind="rms", eps=eps, out=out)
    return y, rstd


# ------------------------------------------------------------------ BatchNorm (channels last)

def batch_norm_forward(x, weight=None, bias=None, running_mean=None, running_var=None, r=None, training=True,
                       momentum=0.1, eps=1e-5, p=0.0, seed=0, offset=0, keep_sum=True):
    """(y, s, mean, rstd) of BatchNorm per channel over every leading dim of x [..., C] (of s = x +
    dropout(r) when r is given; s returned when keep_sum). Training updates running_mean /
    running_var in place (unbiased variance, momentum); evaluation normalizes with them."""
    if _ext is not None and _is_torch(x):
        res = _ext.batch_norm_forward(x, r, weight, bias, running_mean, running_var, training, momentum, eps, p,
                                      seed, offset, keep_sum)
        if res is not None:
            return res
    c = x.shape[-1]
    acc = _acc_dtype(x)
    y = _empty_like_family(x, tuple(x.shape))
    s = _empty_like_family(x, tuple(x.shape)) if r is not None and keep_sum else None
    mean, rstd = _empty_like_family(x, (c,), acc), _empty_like_family(x, (c,), acc)
    run("batch_norm_forward", dict(x=x, r=r, w=weight, b=bias, running_mean=running_mean, running_var=running_var,
                                   y=y, s=s, mean=mean, rstd=rstd),
        options=batch_norm_options(training, eps, momentum, p if r is not None else 0.0, seed, offset))
    return y, s, mean, rstd


def batch_norm_backward(dy, x, weight, mean, rstd, training=True, p=0.0, seed=0, offset=0,
                        need=(True, False, True, True), has_bias=True, param_dtype=None, accumulate=False,
                        out=(None, None, None, None)):
    """(dx, dr, dw, db) of batch_norm_forward; x is the normalized input (s of a fused forward)."""
    if _ext is not None and _is_torch(dy) and _no_out(out) and _need4(need):
        res = _ext.batch_norm_backward(dy, x, weight, mean, rstd, training, p, seed, offset, *need, has_bias,
                                       param_dtype, accumulate)
        if res is not None:
            return res
    c = x.shape[-1]
    want = [need[0], need[1], need[2] and weight is not None, need[3] and has_bias]
    pdt = param_dtype if param_dtype is not None else (weight.dtype if weight is not None else x.dtype)
    shapes = [(tuple(x.shape), None), (tuple(x.shape), None), ((c,), pdt), ((c,), pdt)]
    dx, dr, dw, db = [(o if o is not None else _empty_like_family(dy, s, dt)) if w else None
                      for w, o, (s, dt) in zip(want, out, shapes)]
    run("batch_norm_backward", dict(dy=dy, x=x, w=weight, mean=mean, rstd=rstd, dx=dx, dr=dr, dw=dw, db=db),
        accumulate, options=batch_norm_options(training, p=p, seed=seed, offset=offset))
    return dx, dr, dw, db


def batch_norm_stats(x, r=None, p=0.0, seed=0, offset=0, keep_sum=True):
    """(sums, s): this device's f64 sums {Σ s [C], Σ s² [C], N} of s = x + dropout(r) — all-reduce
    them (a plain sum) across devices, then batch_norm_apply."""
    c = x.shape[-1]
    s = _empty_like_family(x, tuple(x.shape)) if r is not None and keep_sum else None
    sums = _empty_like_family(x, (2 * c + 1,), torch.float64 if _is_torch(x) else np.float64)
    run("batch_norm_stats", dict(x=x, r=r, s=s, sums=sums),
        options=batch_norm_options(p=p if r is not None else 0.0, seed=seed, offset=offset))
    return sums, s


def batch_norm_apply(x, sums, weight=None, bias=None, running_mean=None, running_var=None, training=True,
                     momentum=0.1, eps=1e-5):
    """(y, mean, rstd) from the all-reduced sums (None in evaluation)."""
    c = x.shape[-1]
    acc = _acc_dtype(x)
    y = _empty_like_family(x, tuple(x.shape))
    mean, rstd = _empty_like_family(x, (c,), acc), _empty_like_family(x, (c,), acc)
    run("batch_norm_apply", dict(x=x, sums=sums if training else None, w=weight, b=bias, running_mean=running_mean,
                                 running_var=running_var, y=y, mean=mean, rstd=rstd),
        options=batch_norm_options(training, eps, momentum))
    return y, mean, rstd


def batch_norm_backward_stats(dy, x, mean, rstd):
    """This device's f64 sums {Σ dy [C], Σ dy·x̂ [C], N}: all-reduce them, then batch_norm_backward_apply."""
    c = x.shape[-1]
    sums = _empty_like_family(x, (2 * c + 1,), torch.float64 if _is_torch(x) else np.float64)
    run("batch_norm_backward_stats", dict(dy=dy, x=x, mean=mean, rstd=rstd, sums=sums),
        options=batch_norm_options())
    return sums


def batch_norm_backward_apply(dy, x, weight, mean, rstd, sums, training=True, p=0.0, seed=0, offset=0,
                              need=(True, False, True, True), has_bias=True, param_dtype=None):
    """(dx, dr, dw, db) from the all-reduced sums; dw, db are the whole batch's."""
    c = x.shape[-1]
    want = [need[0], need[1], need[2] and weight is not None, need[3] and has_bias]
    pdt = param_dtype if param_dtype is not None else (weight.dtype if weight is not None else x.dtype)
    shapes = [(tuple(x.shape), None), (tuple(x.shape), None), ((c,), pdt), ((c,), pdt)]
    dx, dr, dw, db = [_empty_like_family(dy, s, dt) if w else None for w, (s, dt) in zip(want, shapes)]
    run("batch_norm_backward_apply", dict(dy=dy, x=x, w=weight, mean=mean, rstd=rstd, sums=sums, dx=dx, dr=dr,
                                          dw=dw, db=db),
        options=batch_norm_options(training, p=p, seed=seed, offset=offset))
    return dx, dr, dw, db


# ------------------------------------------------------------------ dropout, RevIN

def dropout_forward(x, p, seed, offset=0, out=None):
    """x·mask/(1 − p) with the counter-based mask of (seed, offset)."""
    y = out if out is not None else _empty_like_family(x, tuple(x.shape))
    run("dropout_forward", dict(x=x, y=y), options=dropout_options(p, seed, offset))
    return y


def dropout_backward(dy, p, seed, offset=0, out=None, accumulate=False):
    """dy·mask/(1 − p): the forward's mask, regenerated."""
    dx = out if out is not None else _empty_like_family(dy, tuple(dy.shape))
    run("dropout_backward", dict(dy=dy, dx=dx), accumulate, options=dropout_options(p, seed, offset))
    return dx


def revin_stats(x, eps=1e-5, subtract_last=False):
    """(mean, stdev) of x [..., L, C] over L, per instance and channel (stdev = sqrt(var + eps))."""
    shape = tuple(x.shape[:-2]) + (x.shape[-1],)
    acc = _acc_dtype(x)
    mean, stdev = _empty_like_family(x, shape, acc), _empty_like_family(x, shape, acc)
    run("revin_stats", dict(x=x, mean=mean, stdev=stdev), options=revin_options(eps, subtract_last=subtract_last))
    return mean, stdev


def revin_forward(x, mean, stdev, weight=None, bias=None, denorm=False, eps=1e-5):
    """(x − mean)/stdev·w + b, or (denorm) (x − b)/(w + eps²)·stdev + mean."""
    y = _empty_like_family(x, tuple(x.shape))
    run("revin_forward", dict(x=x, w=weight, b=bias, mean=mean, stdev=stdev, y=y), options=revin_options(eps, denorm))
    return y


def revin_backward(dy, x, mean, stdev, weight=None, bias=None, denorm=False, eps=1e-5, need=(True, True, True),
                   param_dtype=None):
    """(dx, dw, db) of revin_forward with mean and stdev held constant (as PatchTST detaches them)."""
    c = x.shape[-1]
    want = [need[0], need[1] and weight is not None, need[2] and bias is not None]
    pdt = param_dtype if param_dtype is not None else (weight.dtype if weight is not None else x.dtype)
    shapes = [(tuple(x.shape), None), ((c,), pdt), ((c,), pdt)]
    dx, dw, db = [_empty_like_family(dy, s, dt) if w else None for w, (s, dt) in zip(want, shapes)]
    run("revin_backward", dict(dy=dy, x=x, w=weight, b=bias, mean=mean, stdev=stdev, dx=dx, dw=dw, db=db),
        options=revin_options(eps, denorm))
    return dx, dw, db


__all__ = ["dropout_options", "norm_options", "batch_norm_options", "revin_options", "norm_forward", "norm_backward",
           "layer_norm_forward", "rms_norm_forward", "batch_norm_forward", "batch_norm_backward", "batch_norm_stats",
           "batch_norm_apply", "batch_norm_backward_stats", "batch_norm_backward_apply", "dropout_forward",
           "dropout_backward", "revin_stats", "revin_forward", "revin_backward"]

# ------------------------------------------------------------------ torch autograd and modules

if torch is not None:
    from .autograd import _call, _dense  # noqa: F401
    from .torch_ops import draw_seed, routed

    FG = torch.ops.fastgrad  # the custom ops (torch_ops): what torch.compile traces

    def _seed():
        """A fresh 62-bit seed from torch's default CPU generator (torch.manual_seed replays it)."""
        return int(draw_seed().item())

    def _norm(x, r, weight, bias, kind, eps, p, seed):
        """(y, s) of NormFunction, or of the custom op while torch.compile traces (seed: None when
        p is 0, else a draw_seed() tensor)."""
        if routed():
            y, s, _, _ = FG.norm(x, r, weight, bias, kind, float(eps), float(p), seed, 0)
            return y, (s if r is not None else None)
        seed = int(seed.item()) if seed is not None else 0
        if _ext is not None:  # NormFunction in C++; None back: operands it does not take
            res = _ext.norm(x, r, weight, bias, kind, eps, p, seed, 0)
            if res is not None:
                return res
        return NormFunction.apply(x, r, weight, bias, kind, eps, p, seed, 0)

    def _as(t, dtype):
        return t if t is None or t.dtype == dtype else t.to(dtype)

    def _contig(x):
        return x if x.is_contiguous() else x.contiguous()

    class NormFunction(torch.autograd.Function):
        """(y, s) = (norm(s)·w + b, s) with s = x + dropout(r) (r None: s = x, returned as None)."""

        @staticmethod
        def forward(ctx, x, r, weight, bias, kind, eps, p, seed, offset):
            x = _contig(x)
            r = _contig(r) if r is not None else None
            w = _as(weight, x.dtype)
            b = _as(bias, x.dtype)
            y, s, mean, rstd = _call(norm_forward, x, w, b, r, kind, eps, p, seed, offset, True, True)
            ctx.save_for_backward(s if s is not None else x, w, mean, rstd)
            ctx.cfg = (kind, eps, p, seed, offset, r is not None, bias is not None,
                       weight.dtype if weight is not None else None)
            return y, s

        @staticmethod
        def backward(ctx, dy, ds):
            xs, w, mean, rstd = ctx.saved_tensors
            kind, eps, p, seed, offset, has_r, has_b, wdt = ctx.cfg
            need_x, need_r = ctx.needs_input_grad[0], has_r and ctx.needs_input_grad[1]
            need_w = w is not None and ctx.needs_input_grad[2]
            need_b = has_b and ctx.needs_input_grad[3]
            if dy is None:
                dy = torch.zeros_like(xs)
            pdt = torch.float32 if wdt is not None and wdt != xs.dtype else None
            dx, dr, dw, db = _call(norm_backward, _contig(dy), xs, w, mean, rstd,
                                   _contig(ds) if ds is not None else None, kind, eps, p, seed, offset,
                                   (need_x, need_r, need_w, need_b), has_b, pdt)
            if dw is not None and wdt is not None:
                dw = dw.to(wdt)
            if db is not None and wdt is not None:
                db = db.to(wdt)
            return dx, dr, dw, db, None, None, None, None, None

    def add_norm(x, r, weight=None, bias=None, kind="layer", eps=1e-5, p=0.0, training=True):
        """(y, s): s = x + dropout(r) (the next residual) and y = norm(s)·w + b, one pass each way —
        the pre-norm transformer block's residual add. p applies only when training."""
        p = p if training else 0.0
        return _norm(x, r, weight, bias, kind, eps, p, draw_seed() if p > 0 else None)

    def layer_norm(x, weight=None, bias=None, eps=1e-5):
        """F.layer_norm over the last dim."""
        return _norm(x, None, weight, bias, "layer", eps, 0.0, None)[0]

    def rms_norm(x, weight=None, eps=None):
        """F.rms_norm over the last dim (eps None: torch.finfo(x.dtype).eps, as PyTorch)."""
        eps = torch.finfo(x.dtype).eps if eps is None else eps
        return _norm(x, None, weight, None, "rms", eps, 0.0, None)[0]

    class BatchNormFunction(torch.autograd.Function):
        """BatchNorm per channel of x [..., C] (of s = x + dropout(r)); returns (y, s)."""

        @staticmethod
        def forward(ctx, x, r, weight, bias, running_mean, running_var, training, momentum, eps, p, seed):
            x = _contig(x)
            r = _contig(r) if r is not None else None
            y, s, mean, rstd = _call(batch_norm_forward, x, weight, bias, running_mean, running_var, r, training,
                                     momentum, eps, p, seed, 0, True)
            ctx.save_for_backward(s if s is not None else x, weight, mean, rstd)
            ctx.cfg = (training, p, seed, r is not None, bias is not None)
            return y, s

        @staticmethod
        def backward(ctx, dy, ds):
            xs, w, mean, rstd = ctx.saved_tensors
            training, p, seed, has_r, has_b = ctx.cfg
            need_x, need_r = ctx.needs_input_grad[0], has_r and ctx.needs_input_grad[1]
            need_w = w is not None and ctx.needs_input_grad[2]
            need_b = has_b and ctx.needs_input_grad[3]
            if dy is None:
                dy = torch.zeros_like(xs)
            dx, dr, dw, db = _call(batch_norm_backward, _contig(dy), xs, w, mean, rstd, training, p, seed, 0,
                                   (need_x, need_r, need_w, need_b), has_b)
            if ds is not None:  # s's own gradient (its other uses) adds to x's and r's
                ds = _contig(ds)
                if dx is not None:
                    dx = dx + ds
                if need_r:
                    dr = dr + _call(dropout_backward, ds, p, seed, 0)
            return dx, dr, dw, db, None, None, None, None, None, None, None

    def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=True, momentum=0.1,
                   eps=1e-5, r=None, p=0.0):
        """F.batch_norm for channels-last x [..., C] (every leading dim is the batch); with r, of
        x + dropout(r) (PatchTST's post-norm residual). Returns y (and s when r is given)."""
        p = p if (training and r is not None) else 0.0
        if routed():
            seed = draw_seed() if p > 0 else None
            y, s, _, _, rm, rv = FG.batch_norm(x, r, weight, bias, running_mean, running_var, bool(training),
                                               float(momentum), float(eps), float(p), seed)
            if training and running_mean is not None:  # the op updated copies (it is functional)
                with torch.no_grad():
                    running_mean.copy_(rm)
                    running_var.copy_(rv)
            return (y, s) if r is not None else y
        seed = _seed() if p > 0 else 0
        y, s = BatchNormFunction.apply(x, r, weight, bias, running_mean, running_var, training, momentum, eps, p, seed)
        return (y, s) if r is not None else y

    class DropoutFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p, seed):
            ctx.cfg = (p, seed)
            return _call(dropout_forward, _contig(x), p, seed, 0)

        @staticmethod
        def backward(ctx, dy):
            p, seed = ctx.cfg
            return _call(dropout_backward, _contig(dy), p, seed, 0), None, None

    def dropout(x, p=0.5, training=True):
        """F.dropout with the counter-based generator (the mask is regenerated in the backward)."""
        if not training or p == 0:
            return x
        if routed():
            return FG.dropout(x, float(p), draw_seed(), 0)
        return DropoutFunction.apply(x, float(p), _seed())

    class LayerNorm(torch.nn.Module):
        """Drop-in for torch.nn.LayerNorm (same parameters and state_dict)."""

        def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
            super().__init__()
            if isinstance(normalized_shape, int):
                normalized_shape = (normalized_shape,)
            self.normalized_shape = tuple(normalized_shape)
            self.eps = eps
            self.elementwise_affine = elementwise_affine
            kw = {"device": device, "dtype": dtype}
            if elementwise_affine:
                self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, **kw))
                self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, **kw)) if bias else None
            else:
                self.register_parameter("weight", None)
                self.register_parameter("bias", None)

        def forward(self, x, residual=None, p=0.0):
            """norm(x), or with residual: (norm(s), s) of s = x + dropout(residual)."""
            k = len(self.normalized_shape)
            lead = x.shape[:-k] if k else x.shape
            flat = x.reshape(*lead, -1) if k != 1 else x
            w = self.weight.reshape(-1) if self.weight is not None else None
            b = self.bias.reshape(-1) if self.bias is not None else None
            if residual is None:
                return _norm(flat, None, w, b, "layer", self.eps, 0.0, None)[0].reshape(x.shape)
            y, s = add_norm(flat, residual.reshape(flat.shape), w, b, "layer", self.eps, p, self.training)
            return y.reshape(x.shape), s.reshape(x.shape)

        def extra_repr(self):
            return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    class RMSNorm(torch.nn.Module):
        """Drop-in for torch.nn.RMSNorm (eps None: torch.finfo(x.dtype).eps)."""

        def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
            super().__init__()
            if isinstance(normalized_shape, int):
                normalized_shape = (normalized_shape,)
            self.normalized_shape = tuple(normalized_shape)
            self.eps = eps
            self.elementwise_affine = elementwise_affine
            if elementwise_affine:
                self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("weight", None)

        def forward(self, x, residual=None, p=0.0):
            k = len(self.normalized_shape)
            flat = x.reshape(*x.shape[:-k], -1) if k != 1 else x
            w = self.weight.reshape(-1) if self.weight is not None else None
            eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
            if residual is None:
                return _norm(flat, None, w, None, "rms", eps, 0.0, None)[0].reshape(x.shape)
            y, s = add_norm(flat, residual.reshape(flat.shape), w, None, "rms", eps, p, self.training)
            return y.reshape(x.shape), s.reshape(x.shape)

    class BatchNorm1d(torch.nn.Module):
        """Drop-in for torch.nn.BatchNorm1d on [N, C] or [N, C, L] (same parameters, buffers and
        state_dict). A [N, C, L] input that is a transposed view of channels-last [N, L, C] memory
        (PatchTST's Transpose → BatchNorm1d → Transpose) is read in place; the output is then the
        same kind of view. forward(x, residual=None, p=0.0): with a residual, BatchNorm of
        x + dropout(residual), returning (y, s)."""

        def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                     dtype=None):
            super().__init__()
            if momentum is None:
                raise ValueError("fastgrad: BatchNorm1d(momentum=None) (a cumulative average) is not supported")
            self.num_features, self.eps, self.momentum = num_features, eps, momentum
            self.affine, self.track_running_stats = affine, track_running_stats
            kw = {"device": device, "dtype": dtype}
            if affine:
                self.weight = torch.nn.Parameter(torch.ones(num_features, **kw))
                self.bias = torch.nn.Parameter(torch.zeros(num_features, **kw))
            else:
                self.register_parameter("weight", None)
                self.register_parameter("bias", None)
            if track_running_stats:
                self.register_buffer("running_mean", torch.zeros(num_features, **kw))
                self.register_buffer("running_var", torch.ones(num_features, **kw))
                self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))
            else:
                self.register_buffer("running_mean", None)
                self.register_buffer("running_var", None)
                self.register_buffer("num_batches_tracked", None)

        def forward(self, x, residual=None, p=0.0):
            if x.dim() not in (2, 3) or x.shape[1] != self.num_features:
                raise ValueError(f"fastgrad: BatchNorm1d({self.num_features}) takes [N, C] or [N, C, L], got "
                                 f"{tuple(x.shape)}")
            last = x if x.dim() == 2 else x.transpose(1, 2)  # channels last: contiguous when x is PatchTST's view
            res = None if residual is None else (residual if residual.dim() == 2 else residual.transpose(1, 2))
            use_batch = self.training or self.running_mean is None
            rm, rv = self.running_mean, self.running_var
            if self.training and rm is not None:
                self.num_batches_tracked.add_(1)
            stat_dt = torch.float32
            rm_c = rm if rm is None or rm.dtype in (stat_dt, last.dtype) else rm.to(stat_dt)
            rv_c = rv if rv is None or rv.dtype in (stat_dt, last.dtype) else rv.to(stat_dt)
            out = batch_norm(last, rm_c, rv_c, self.weight, self.bias, use_batch, self.momentum, self.eps, res, p)
            if rm_c is not rm and rm is not None and use_batch:
                rm.copy_(rm_c), rv.copy_(rv_c)
            if residual is None:
                return out if x.dim() == 2 else out.transpose(1, 2)
            y, s = out
            return (y, s) if x.dim() == 2 else (y.transpose(1, 2), s.transpose(1, 2))

    class Dropout(torch.nn.Module):
        """Drop-in for torch.nn.Dropout on the counter-based generator."""

        def __init__(self, p=0.5):
            super().__init__()
            self.p = p

        def forward(self, x):
            return dropout(x, self.p, self.training)

    class RevINFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, mean, stdev, denorm, eps):
            x = _contig(x)
            y = _call(revin_forward, x, mean, stdev, weight, bias, denorm, eps)
            ctx.save_for_backward(x, weight, bias, mean, stdev)
            ctx.cfg = (denorm, eps)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, w, b, mean, stdev = ctx.saved_tensors
            denorm, eps = ctx.cfg
            need = (ctx.needs_input_grad[0], w is not None and ctx.needs_input_grad[1],
                    b is not None and ctx.needs_input_grad[2])
            dx, dw, db = _call(revin_backward, _contig(dy), x, mean, stdev, w, b, denorm, eps, need)
            return dx, dw, db, None, None, None, None

    def _revin(x, w, b, mean, stdev, denorm, eps):
        """RevINFunction, or the custom op while torch.compile traces."""
        if routed():
            return FG.revin(x, w, b, mean, stdev, bool(denorm), float(eps))
        return RevINFunction.apply(x, w, b, mean, stdev, denorm, eps)

    class RevIN(torch.nn.Module):
        """PatchTST's RevIN: forward(x, "norm") on x [B, L, C] saves the per-(instance, channel)
        mean and stdev (over L) and normalizes, with a learnable per-channel affine; forward(y,
        "denorm") undoes it on the model's output [B, T, C]. The statistics are constants to the
        backward, as in PatchTST (which detaches them). Same parameter names as PatchTST's."""

        def __init__(self, num_features, eps=1e-5, affine=True, subtract_last=False):
            super().__init__()
            self.num_features, self.eps, self.affine, self.subtract_last = num_features, eps, affine, subtract_last
            if affine:
                self.affine_weight = torch.nn.Parameter(torch.ones(num_features))
                self.affine_bias = torch.nn.Parameter(torch.zeros(num_features))
            self.mean = self.stdev = None

        def forward(self, x, mode):
            w = self.affine_weight if self.affine else None
            b = self.affine_bias if self.affine else None
            w = _as(w, x.dtype)
            b = _as(b, x.dtype)
            if mode == "norm":
                if routed():
                    self.mean, self.stdev = FG.revin_stats(x.detach(), float(self.eps), bool(self.subtract_last))
                else:
                    self.mean, self.stdev = _call(revin_stats, _contig(x.detach()), self.eps, self.subtract_last)
                return _revin(x, w, b, self.mean, self.stdev, False, self.eps)
            if mode == "denorm":
                if self.mean is None:
                    raise RuntimeError("fastgrad: RevIN.forward(x, 'denorm') before 'norm'")
                return _revin(x, w, b, self.mean, self.stdev, True, self.eps)
            raise ValueError(f"fastgrad: RevIN mode must be 'norm' or 'denorm', not {mode!r}")

    __all__ += ["NormFunction", "BatchNormFunction", "DropoutFunction", "RevINFunction", "add_norm", "layer_norm",
                "rms_norm", "batch_norm", "dropout", "LayerNorm", "RMSNorm", "BatchNorm1d", "Dropout", "RevIN"]

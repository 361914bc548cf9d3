"""fastgrad's torch-facing ops as PyTorch custom ops (torch.library, namespace "fastgrad").

Each family has a forward op and a backward op, both opaque to the compiler, with a fake
implementation (the outputs' shapes, dtypes and strides, the saved statistics included: lse,
mean, rstd, pre) and the forward's autograd registered so that its backward is the backward op.
torch.compile therefore traces models built from fastgrad modules without graph breaks, and
AOTAutograd puts the backward ops in the backward graph.

The ops are pure given their inputs: a dropout seed is an input (a one-element int64 CPU tensor,
drawn by the caller from torch's default generator), options travel as plain scalars and the C
option structs are built inside the op; a gradient that is not wanted comes back as an empty
tensor (custom ops return no None), which the autograd glue turns into None; BatchNorm's
forward and the encoder layer's return updated copies of the running statistics, which the
caller copies into its buffers. Workspace comes from torch's caching allocator (ops.run) and
nothing inside reads a device value on the host, except PatchTST's attention-scale parameter,
which the encoder layer op reads (one scalar; eager reads it once per change).

The encoder layer (fg.TransformerEncoderLayer, fg.PatchTSTEncoder) is one op each way: the
forward returns the cache of saved activations as a uint8 tensor (its size from
fg_encoder_layer_sizes, which the fake implementation calls too), the backward takes it. RevIN is
three ops (its statistics, which have no gradient, the forward and its backward).

Linear, linear + activation, the row norms and attention (forward and backward ops) also have C++ kernels
for CPU and CUDA tensors from the torch extension when it is built (_register_kernels): what the
compiled graph calls then runs without this module's Python, with the same plans and bits.

The public functions of autograd.py / norm.py call these ops while torch.compile traces, and
their direct autograd.Function path in eager mode, where a custom op's dispatch would add host
time to every call (docs/decisions.md gives the figures); `use_custom_ops(True)` routes eager
calls through the custom ops too.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import ops
from ._lib import ERR_MISALIGNED, ERR_UNSUPPORTED, FastgradError

# ------------------------------------------------------------------ shared helpers


def _dense(a):
    """A broadcast view (a zero stride, as autograd hands out for sum()) made dense."""
    if isinstance(a, torch.Tensor) and not a.is_contiguous() and any(s == 0 and n > 1
                                                                      for s, n in zip(a.stride(), a.shape)):
        return a.contiguous()
    return a


def _fresh(a):
    """a as a contiguous tensor at the start of an allocation (a copy unless it is one)."""
    if not isinstance(a, torch.Tensor) or (a.is_contiguous() and a.data_ptr() % 256 == 0):
        return a
    return a.clone(memory_format=torch.contiguous_format)


def _call(fn, *args, **kwargs):
    """Runs fn; when the C op refuses a layout (no unit stride, leading dims that do not
    collapse, data aligned less than any of its kernels takes), retries once on contiguous
    copies."""
    args = [_dense(a) for a in args]
    try:
        return fn(*args, **kwargs)
    except (FastgradError, ValueError) as e:
        if isinstance(e, FastgradError) and e.status not in (ERR_UNSUPPORTED, ERR_MISALIGNED):
            raise
        fixed = [_fresh(a) for a in args]
        return fn(*fixed, **kwargs)


def _contig(x):
    return x if x.is_contiguous() else x.contiguous()


def _as(t, dtype):
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _acc(t):
    """The dtype of per-row statistics and sums: f64 for f64 data, else f32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _nothing(ref):
    """An empty tensor standing for a gradient autograd did not ask for: a custom op's outputs
    are tensors, never None (the autograd wrappers turn it back into None)."""
    return ref.new_empty((0,))


def _or_nothing(t, ref):
    return t if t is not None else _nothing(ref)


def _seed_value(seed):
    """The seed tensor's value (a CPU tensor: no device synchronization)."""
    return int(seed) if seed is not None else 0


_eager_custom_ops = False


def use_custom_ops(on=True):
    """Routes eager calls of the public functions through the custom ops too (they always are
    while torch.compile traces)."""
    global _eager_custom_ops
    _eager_custom_ops = bool(on)


def routed():
    """Whether the public functions call the custom ops now: under torch.compile, or when asked."""
    return _eager_custom_ops or torch.compiler.is_compiling()


def draw_seed():
    """A 62-bit dropout seed from torch's default CPU generator, as a one-element int64 CPU tensor
    (the same draw as the eager path's, so torch.manual_seed gives the same masks either way)."""
    return torch.randint(0, 2**62, (1,))


def _set_materialize(ctx):
    """Gradients of unused outputs arrive as None instead of zeros."""
    if hasattr(ctx, "set_materialize_grads"):
        ctx.set_materialize_grads(False)


_OPS = []  # every op, for tests (opcheck)
_PY_FN = {}  # each op's Python function by name (the C++ kernels hand it what they do not take)


def _op(name, mutates_args=()):
    def wrap(fn):
        op = torch.library.custom_op(f"fastgrad::{name}", mutates_args=mutates_args)(fn)
        _OPS.append(op)
        _PY_FN[name] = fn
        return op
    return wrap


# ------------------------------------------------------------------ Linear, Matmul, Outer

@_op("linear")
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return _call(ops.linear_forward, x, weight, bias)


@linear.register_fake
def _(x, weight, bias):
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


@_op("linear_backward")
def linear_backward(dy: Tensor, x: Tensor, weight: Tensor, need_x: bool, need_w: bool,
                    need_b: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dx = _call(ops.linear_backward_input, dy, weight) if need_x else None
    dw = _call(ops.linear_backward_weight, dy, x) if need_w else None
    db = _call(ops.linear_backward_bias, dy) if need_b else None
    return _or_nothing(dx, dy), _or_nothing(dw, dy), _or_nothing(db, dy)


@linear_backward.register_fake
def _(dy, x, weight, need_x, need_w, need_b):
    return (dy.new_empty(x.shape) if need_x else _nothing(dy), dy.new_empty(weight.shape) if need_w else _nothing(dy),
            dy.new_empty((dy.shape[-1],)) if need_b else _nothing(dy))


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_bwd(ctx, dy):
    x, weight = ctx.saved_tensors
    n = ctx.needs_input_grad
    nb = ctx.has_bias and n[2]
    dx, dw, db = torch.ops.fastgrad.linear_backward(dy, x, weight, n[0], n[1], nb)
    return dx if n[0] else None, dw if n[1] else None, db if nb else None


linear.register_autograd(_linear_bwd, setup_context=_linear_setup)


@_op("matmul")
def matmul(a: Tensor, b: Tensor) -> Tensor:
    return _call(ops.matmul_forward, a, b)


@matmul.register_fake
def _(a, b):
    batch = (a.shape[0],) if a.dim() == 3 else (b.shape[0],) if b.dim() == 3 else ()
    return a.new_empty(tuple(batch) + (a.shape[-2], b.shape[-1]))


@_op("matmul_backward")
def matmul_backward(dc: Tensor, a: Tensor, b: Tensor, need_a: bool, need_b: bool) -> Tuple[Tensor, Tensor]:
    da = _call(ops.matmul_backward_input, dc, b, batched=a.dim() == 3) if need_a else None
    db = _call(ops.matmul_backward_other, a, dc, batched=b.dim() == 3) if need_b else None
    return _or_nothing(da, dc), _or_nothing(db, dc)


@matmul_backward.register_fake
def _(dc, a, b, need_a, need_b):
    return dc.new_empty(a.shape) if need_a else _nothing(dc), dc.new_empty(b.shape) if need_b else _nothing(dc)


def _two_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _two_bwd(backward_op):
    """The autograd backward of a two-input op whose backward op takes (grad, a, b, need_a, need_b)."""
    def bwd(ctx, g):
        a, b = ctx.saved_tensors
        n = ctx.needs_input_grad
        da, db = backward_op(g, a, b, n[0], n[1])
        return da if n[0] else None, db if n[1] else None
    return bwd


matmul.register_autograd(_two_bwd(matmul_backward), setup_context=_two_setup)


@_op("outer")
def outer(x: Tensor, y: Tensor) -> Tensor:
    return _call(ops.outer_forward, x, y)


@outer.register_fake
def _(x, y):
    return x.new_empty((x.shape[0], y.shape[0]))


@_op("outer_backward")
def outer_backward(dz: Tensor, x: Tensor, y: Tensor, need_x: bool, need_y: bool) -> Tuple[Tensor, Tensor]:
    dx = _call(ops.outer_backward_input, dz, y) if need_x else None
    dy = _call(ops.outer_backward_other, dz, x) if need_y else None
    return _or_nothing(dx, dz), _or_nothing(dy, dz)


@outer_backward.register_fake
def _(dz, x, y, need_x, need_y):
    return (dz.new_empty((dz.shape[0],)) if need_x else _nothing(dz),
            dz.new_empty((dz.shape[1],)) if need_y else _nothing(dz))


outer.register_autograd(_two_bwd(outer_backward), setup_context=_two_setup)


# ------------------------------------------------------------------ elementwise family

@_op("unary")
def unary(x: Tensor, kind: str, scalars: List[float]) -> Tensor:
    return _call(ops.unary_forward, kind, x, tuple(scalars))


@unary.register_fake
def _(x, kind, scalars):
    return x.new_empty(x.shape)


@_op("unary_backward")
def unary_backward(dy: Tensor, x: Tensor, kind: str, scalars: List[float]) -> Tensor:
    return _call(ops.unary_backward, kind, dy, x, tuple(scalars))


@unary_backward.register_fake
def _(dy, x, kind, scalars):
    return dy.new_empty(x.shape)


def _unary_setup(ctx, inputs, output):
    x, kind, scalars = inputs
    ctx.save_for_backward(x)
    ctx.kind, ctx.scalars = kind, scalars


def _unary_bwd(ctx, dy):
    (x,) = ctx.saved_tensors
    dx = torch.ops.fastgrad.unary_backward(dy, x, ctx.kind, ctx.scalars) if ctx.needs_input_grad[0] else None
    return dx, None, None


unary.register_autograd(_unary_bwd, setup_context=_unary_setup)


@_op("lerp")
def lerp(a: Tensor, b: Tensor, weight: Optional[Tensor], weight_value: float) -> Tensor:
    return _call(ops.lerp_forward, a, b, weight if weight is not None else float(weight_value))


@lerp.register_fake
def _(a, b, weight, weight_value):
    shapes = [a.shape, b.shape] + ([weight.shape] if weight is not None else [])
    return a.new_empty(torch.broadcast_shapes(*shapes))


@_op("lerp_backward")
def lerp_backward(dy: Tensor, a: Tensor, b: Tensor, weight: Optional[Tensor], weight_value: float, need_a: bool,
                  need_b: bool, need_w: bool) -> Tuple[Tensor, Tensor, Tensor]:
    w = weight if weight is not None else float(weight_value)
    da, db, dw = _call(ops.lerp_backward, dy, a, b, w, (need_a, need_b, need_w and weight is not None))
    return _or_nothing(da, dy), _or_nothing(db, dy), _or_nothing(dw, dy)


@lerp_backward.register_fake
def _(dy, a, b, weight, weight_value, need_a, need_b, need_w):
    return (dy.new_empty(a.shape) if need_a else _nothing(dy), dy.new_empty(b.shape) if need_b else _nothing(dy),
            dy.new_empty(weight.shape) if need_w and weight is not None else _nothing(dy))


def _lerp_setup(ctx, inputs, output):
    a, b, weight, weight_value = inputs
    ctx.save_for_backward(a, b, weight)
    ctx.weight_value = weight_value


def _lerp_bwd(ctx, dy):
    a, b, w = ctx.saved_tensors
    n = ctx.needs_input_grad
    need = (n[0], n[1], w is not None and n[2])
    if not any(need):
        return None, None, None, None
    da, db, dw = torch.ops.fastgrad.lerp_backward(dy, a, b, w, ctx.weight_value, *need)
    return da if need[0] else None, db if need[1] else None, dw if need[2] else None, None


lerp.register_autograd(_lerp_bwd, setup_context=_lerp_setup)


@_op("axpby")
def axpby(a: Tensor, b: Tensor, alpha: float, beta: float) -> Tensor:
    return _call(ops.axpby_forward, a, b, alpha, beta)


@axpby.register_fake
def _(a, b, alpha, beta):
    return a.new_empty(torch.broadcast_shapes(a.shape, b.shape))


@_op("axpby_backward")
def axpby_backward(dy: Tensor, a_shape: List[int], b_shape: List[int], alpha: float, beta: float, need_a: bool,
                   need_b: bool) -> Tuple[Tensor, Tensor]:
    da, db = _call(ops.axpby_backward, dy, tuple(a_shape), tuple(b_shape), alpha, beta, (need_a, need_b))
    return _or_nothing(da, dy), _or_nothing(db, dy)


@axpby_backward.register_fake
def _(dy, a_shape, b_shape, alpha, beta, need_a, need_b):
    return (dy.new_empty(a_shape) if need_a else _nothing(dy), dy.new_empty(b_shape) if need_b else _nothing(dy))


def _axpby_setup(ctx, inputs, output):
    a, b, alpha, beta = inputs
    ctx.shapes, ctx.alpha, ctx.beta = (list(a.shape), list(b.shape)), alpha, beta


def _axpby_bwd(ctx, dy):
    n = ctx.needs_input_grad
    if not (n[0] or n[1]):
        return None, None, None, None
    da, db = torch.ops.fastgrad.axpby_backward(dy, ctx.shapes[0], ctx.shapes[1], ctx.alpha, ctx.beta, n[0], n[1])
    return da if n[0] else None, db if n[1] else None, None, None


axpby.register_autograd(_axpby_bwd, setup_context=_axpby_setup)


# ------------------------------------------------------------------ Linear + activation

@_op("linear_act")
def linear_act(x: Tensor, weight: Tensor, bias: Optional[Tensor], act: str, save: bool,
               slope: bool) -> Tuple[Tensor, Tensor]:
    """(y, pre): pre is the saved pre-activation (or its slope act'(pre) when slope), empty when
    save is False or the activation needs none (relu's backward reads y, none's nothing)."""
    keep = save and act not in ("relu", "none")
    y, pre = _call(ops.linear_act_forward, x, weight, bias, act, keep, slope=slope and keep)
    return y, _or_nothing(pre, y)


@linear_act.register_fake
def _(x, weight, bias, act, save, slope):
    shape = tuple(x.shape[:-1]) + (weight.shape[-2],)
    keep = save and act not in ("relu", "none")
    return x.new_empty(shape), x.new_empty(shape) if keep else _nothing(x)


@_op("linear_act_backward")
def linear_act_backward(dy: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], pre: Optional[Tensor], act: str,
                        slope: bool, need_x: bool, need_w: bool, need_b: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dw, db); pre None: recomputed (relu: y stands in for pre). pre is only read (the
    eager path's consume_pre, forming g in pre's memory, would mutate an input)."""
    dx, dw, db = _call(ops.linear_act_backward, _contig(dy), _contig(x), _contig(weight), bias, pre, act,
                       need=(need_x, need_w, need_b), slope=slope)
    return _or_nothing(dx, dy), _or_nothing(dw, dy), _or_nothing(db, dy)


@linear_act_backward.register_fake
def _(dy, x, weight, bias, pre, act, slope, need_x, need_w, need_b):
    return (dy.new_empty(x.shape) if need_x else _nothing(dy), dy.new_empty(weight.shape) if need_w else _nothing(dy),
            dy.new_empty(bias.shape) if need_b and bias is not None else _nothing(dy))


def _linear_act_setup(ctx, inputs, output):
    x, weight, bias, act, save, slope = inputs
    y, pre = output
    keep = save and act not in ("relu", "none")
    ctx.act, ctx.slope, ctx.has_bias = act, slope and keep, bias is not None
    kept = y if (act == "relu" and save) else (pre if keep else None)
    ctx.save_for_backward(x, weight, bias, kept)
    ctx.mark_non_differentiable(pre)
    _set_materialize(ctx)


def _linear_act_bwd(ctx, dy, dpre):
    x, weight, bias, pre = ctx.saved_tensors
    n = ctx.needs_input_grad
    nb = ctx.has_bias and n[2]
    dx, dw, db = torch.ops.fastgrad.linear_act_backward(dy, x, weight, bias, pre, ctx.act,
                                                        ctx.slope and pre is not None, n[0], n[1], nb)
    return dx if n[0] else None, dw if n[1] else None, db if nb else None, None, None, None


linear_act.register_autograd(_linear_act_bwd, setup_context=_linear_act_setup)


# ------------------------------------------------------------------ Linear log-prob / cross-entropy

def _logp_opts(temperature, softcap, ignore_index, reduction="mean", label_smoothing=0.0, z_loss=0.0,
               max_tile_elements=0):
    return ops.logp_options(temperature=temperature, softcap=softcap, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, z_loss=z_loss, max_tile_elements=max_tile_elements)


@_op("linear_logp")
def linear_logp(h: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], entropy: bool, temperature: float,
                softcap: float, ignore_index: Optional[int], max_tile_elements: int) -> Tuple[Tensor, Tensor, Tensor]:
    opt = _logp_opts(temperature, softcap, ignore_index, max_tile_elements=max_tile_elements)
    logp, lse, ent = ops.linear_logp_forward(_contig(h), _contig(weight), _contig(target), bias, entropy=entropy,
                                             options=opt)
    return logp, lse, _or_nothing(ent, logp)


@linear_logp.register_fake
def _(h, weight, target, bias, entropy, temperature, softcap, ignore_index, max_tile_elements):
    n = h.shape[0]
    rd = _acc(h)
    return h.new_empty((n,), dtype=rd), h.new_empty((n,), dtype=rd), h.new_empty((n,) if entropy else (0,), dtype=rd)


@_op("linear_logp_backward")
def linear_logp_backward(h: Tensor, weight: Tensor, target: Tensor, lse: Tensor, bias: Optional[Tensor],
                         dlogp: Optional[Tensor], dentropy: Optional[Tensor], entropy: Optional[Tensor],
                         temperature: float, softcap: float, ignore_index: Optional[int], max_tile_elements: int,
                         need_h: bool, need_w: bool, need_b: bool) -> Tuple[Tensor, Tensor, Tensor]:
    opt = _logp_opts(temperature, softcap, ignore_index, max_tile_elements=max_tile_elements)
    rd = lse.dtype
    dl = _contig(dlogp.reshape(-1).to(rd)) if dlogp is not None else None
    de = _contig(dentropy.reshape(-1).to(rd)) if dentropy is not None and entropy is not None else None
    if dl is None and de is None:
        dl = torch.zeros_like(lse)
    dh, dw, db = ops.linear_logp_backward(_contig(h), _contig(weight), _contig(target), lse, bias, dlogp=dl,
                                          dentropy=de, entropy=entropy if de is not None else None,
                                          need=(need_h, need_w, need_b), options=opt)
    return _or_nothing(dh, h), _or_nothing(dw, h), _or_nothing(db, h)


@linear_logp_backward.register_fake
def _(h, weight, target, lse, bias, dlogp, dentropy, entropy, temperature, softcap, ignore_index, max_tile_elements,
      need_h, need_w, need_b):
    return (h.new_empty(h.shape) if need_h else _nothing(h), h.new_empty(weight.shape) if need_w else _nothing(h),
            h.new_empty(bias.shape) if need_b and bias is not None else _nothing(h))


def _logp_setup(ctx, inputs, output):
    h, weight, target, bias, entropy, temperature, softcap, ignore_index, max_tile = inputs
    _, lse, ent = output
    ctx.save_for_backward(h, weight, bias, target, lse, ent if entropy else None)
    ctx.opt = (temperature, softcap, ignore_index, max_tile)
    ctx.mark_non_differentiable(lse)
    _set_materialize(ctx)


def _logp_bwd(ctx, dlogp, dlse, dent):
    h, weight, bias, target, lse, ent = ctx.saved_tensors
    n = ctx.needs_input_grad
    nb = bias is not None and n[3]
    if not (n[0] or n[1] or nb):
        return (None,) * 9
    dh, dw, db = torch.ops.fastgrad.linear_logp_backward(h, weight, target, lse, bias, dlogp,
                                                         dent if ent is not None else None, ent, *ctx.opt,
                                                         n[0], n[1], nb)
    return dh if n[0] else None, dw if n[1] else None, None, db if nb else None, None, None, None, None, None


linear_logp.register_autograd(_logp_bwd, setup_context=_logp_setup)


@_op("linear_cross_entropy")
def linear_cross_entropy(h: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor],
                         row_weight: Optional[Tensor], need_h: bool, need_w: bool, need_b: bool, reduction: str,
                         label_smoothing: float, z_loss: float, ignore_index: Optional[int], temperature: float,
                         softcap: float, max_tile_elements: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The one-pass cross-entropy (reduction mean or sum): the loss [1] and its gradients,
    which the backward scales by the loss's incoming gradient."""
    opt = _logp_opts(temperature, softcap, ignore_index, reduction, label_smoothing, z_loss, max_tile_elements)
    loss, _, dh, dw, db = ops.linear_cross_entropy_onepass(_contig(h), _contig(weight), _contig(target), bias,
                                                           row_weight, need=(need_h, need_w, need_b), options=opt)
    return loss, _or_nothing(dh, h), _or_nothing(dw, h), _or_nothing(db, h)


@linear_cross_entropy.register_fake
def _(h, weight, target, bias, row_weight, need_h, need_w, need_b, reduction, label_smoothing, z_loss, ignore_index,
      temperature, softcap, max_tile_elements):
    return (h.new_empty((1,), dtype=_acc(h)), h.new_empty(h.shape) if need_h else _nothing(h),
            h.new_empty(weight.shape) if need_w else _nothing(h),
            h.new_empty(bias.shape) if need_b and bias is not None else _nothing(h))


def _ce_setup(ctx, inputs, output):
    _, dh, dw, db = output
    bias, need = inputs[3], inputs[5:8]
    ctx.save_for_backward(dh, dw, db)
    ctx.computed = (need[0], need[1], need[2] and bias is not None)  # the gradients the forward formed
    ctx.mark_non_differentiable(dh, dw, db)


def _ce_bwd(ctx, g, *_):
    n = ctx.needs_input_grad
    want = [c and k for c, k in zip(ctx.computed, (n[0], n[1], n[3]))]

    def scale(t):  # on the device: no host synchronization on g
        return t * g.to(t.dtype)

    dh, dw, db = (scale(t) if k else None for t, k in zip(ctx.saved_tensors, want))
    return (dh, dw, None, db) + (None,) * 11


linear_cross_entropy.register_autograd(_ce_bwd, setup_context=_ce_setup)


# ------------------------------------------------------------------ attention

def _heads_like(ref, shape, dtype=None):
    b, h, l, d = shape
    return ref.new_empty((b, l, h, d), dtype=dtype).transpose(1, 2)


_DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}


def dtype_name(dtype):
    return "" if dtype is None else str(dtype).replace("torch.", "")


@_op("attention")
def attention(q: Tensor, k: Tensor, v: Tensor, scores_in: Optional[Tensor], lengths: Optional[Tensor],
              seed: Optional[Tensor], offset: int, causal: bool, scale: Optional[float], dropout_p: float,
              return_scores: bool, scores_dtype: str) -> Tuple[Tensor, Tensor, Tensor]:
    opt = ops.attention_options(causal, scale, dropout_p, _seed_value(seed), offset)
    o, lse, scores = _call(ops.attention_forward, q, k, v, lengths, scores_in, return_scores,
                           _DTYPE_NAMES.get(scores_dtype), options=opt)
    return o, lse, _or_nothing(scores, o)


@attention.register_fake
def _(q, k, v, scores_in, lengths, seed, offset, causal, scale, dropout_p, return_scores, scores_dtype):
    b, h, l, d = q.shape
    o = _heads_like(q, (b, h, l, d))
    lse = q.new_empty((b, h, l), dtype=_acc(q))
    sdt = scores_in.dtype if scores_in is not None else (_DTYPE_NAMES.get(scores_dtype) or q.dtype)
    scores = q.new_empty((b, h, l, l), dtype=sdt) if return_scores else _nothing(q)
    return o, lse, scores


@_op("attention_backward")
def attention_backward(do: Tensor, dscores: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                       lengths: Optional[Tensor], scores_in: Optional[Tensor], seed: Optional[Tensor], offset: int,
                       causal: bool, scale: Optional[float], dropout_p: float, need_q: bool, need_k: bool,
                       need_v: bool, need_s: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    opt = ops.attention_options(causal, scale, dropout_p, _seed_value(seed), offset)
    dq, dk, dv, ds = _call(ops.attention_backward, do, q, k, v, o, lse, lengths, scores_in, dscores,
                           need=(need_q, need_k, need_v, need_s and scores_in is not None), options=opt)
    return _or_nothing(dq, do), _or_nothing(dk, do), _or_nothing(dv, do), _or_nothing(ds, do)


@attention_backward.register_fake
def _(do, dscores, q, k, v, o, lse, lengths, scores_in, seed, offset, causal, scale, dropout_p, need_q, need_k, need_v,
      need_s):
    return (_heads_like(do, tuple(q.shape)) if need_q else _nothing(do),
            _heads_like(do, tuple(q.shape)) if need_k else _nothing(do),
            _heads_like(do, tuple(q.shape)) if need_v else _nothing(do),
            do.new_empty(scores_in.shape, dtype=scores_in.dtype) if need_s and scores_in is not None
            else _nothing(do))


def _attention_setup(ctx, inputs, output):
    q, k, v, scores_in, lengths, seed, offset, causal, scale, dropout_p, return_scores, _ = inputs
    o, lse, _ = output
    ctx.save_for_backward(q, k, v, o, lse, scores_in, lengths, seed)
    ctx.cfg = (offset, causal, scale, dropout_p)
    ctx.return_scores = return_scores
    ctx.mark_non_differentiable(lse)
    _set_materialize(ctx)


def _attention_bwd(ctx, do, dlse, dscores):
    q, k, v, o, lse, scores_in, lengths, seed = ctx.saved_tensors
    n = ctx.needs_input_grad
    ns = scores_in is not None and n[3]
    if not (n[0] or n[1] or n[2] or ns):
        return (None,) * 12
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv, ds = torch.ops.fastgrad.attention_backward(do, dscores if ctx.return_scores else None, q, k, v, o,
                                                           lse, lengths, scores_in, seed, *ctx.cfg, n[0], n[1], n[2],
                                                           ns)
    return (dq if n[0] else None, dk if n[1] else None, dv if n[2] else None, ds if ns else None) + (None,) * 8


attention.register_autograd(_attention_bwd, setup_context=_attention_setup)


# ------------------------------------------------------------------ row norms (LayerNorm / RMSNorm)

def _rows(x):
    return tuple(x.shape[:-1]) or (1,)


@_op("norm")
def norm(x: Tensor, r: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor], kind: str, eps: float,
         p: float, seed: Optional[Tensor], offset: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, s, mean, rstd) of norm(s)·w + b with s = x + dropout(r); s empty without r, mean
    empty for RMSNorm."""
    from .norm import norm_forward
    x = _contig(x)
    r = _contig(r) if r is not None else None
    y, s, mean, rstd = _call(norm_forward, x, _as(weight, x.dtype), _as(bias, x.dtype), r, kind, eps, p,
                             _seed_value(seed), offset, True, True)
    return y, _or_nothing(s, y), _or_nothing(mean, rstd), rstd


@norm.register_fake
def _(x, r, weight, bias, kind, eps, p, seed, offset):
    acc = _acc(x)
    return (x.new_empty(x.shape), x.new_empty(x.shape) if r is not None else _nothing(x),
            x.new_empty(_rows(x), dtype=acc) if kind == "layer" else x.new_empty((0,), dtype=acc),
            x.new_empty(_rows(x), dtype=acc))


@_op("norm_backward")
def norm_backward(dy: Tensor, ds: Optional[Tensor], xs: Tensor, weight: Optional[Tensor], mean: Optional[Tensor],
                  rstd: Tensor, kind: str, eps: float, p: float, seed: Optional[Tensor], offset: int, need_x: bool,
                  need_r: bool, need_w: bool, need_b: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dr, dw, db); dw, db in the weight's dtype."""
    from .norm import norm_backward as nb
    w = _as(weight, xs.dtype)
    wdt = weight.dtype if weight is not None else None
    pdt = torch.float32 if wdt is not None and wdt != xs.dtype else None
    dx, dr, dw, db = _call(nb, _contig(dy), xs, w, mean, rstd, _contig(ds) if ds is not None else None, kind, eps, p,
                           _seed_value(seed), offset, (need_x, need_r, need_w, need_b), need_b, pdt)
    if dw is not None and wdt is not None:
        dw = dw.to(wdt)
    if db is not None and wdt is not None:
        db = db.to(wdt)
    return _or_nothing(dx, dy), _or_nothing(dr, dy), _or_nothing(dw, dy), _or_nothing(db, dy)


@norm_backward.register_fake
def _(dy, ds, xs, weight, mean, rstd, kind, eps, p, seed, offset, need_x, need_r, need_w, need_b):
    d = xs.shape[-1]
    pdt = weight.dtype if weight is not None else xs.dtype
    return (dy.new_empty(xs.shape) if need_x else _nothing(dy), dy.new_empty(xs.shape) if need_r else _nothing(dy),
            dy.new_empty((d,), dtype=pdt) if need_w and weight is not None else _nothing(dy),
            dy.new_empty((d,), dtype=pdt) if need_b else _nothing(dy))


def _norm_setup(ctx, inputs, output):
    x, r, weight, bias, kind, eps, p, seed, offset = inputs
    y, s, mean, rstd = output
    ctx.save_for_backward(s if r is not None else x, weight, mean if kind == "layer" else None, rstd, seed)
    ctx.cfg = (kind, eps, p, offset)
    ctx.has_r, ctx.has_b = r is not None, bias is not None
    ctx.mark_non_differentiable(mean, rstd)
    _set_materialize(ctx)


def _norm_bwd(ctx, dy, ds, dmean, drstd):
    xs, weight, mean, rstd, seed = ctx.saved_tensors
    kind, eps, p, offset = ctx.cfg
    n = ctx.needs_input_grad
    need = (n[0], ctx.has_r and n[1], weight is not None and n[2], ctx.has_b and n[3])
    if not ctx.has_r:
        ds = None
    if dy is None:
        dy = torch.zeros_like(xs)
    dx, dr, dw, db = torch.ops.fastgrad.norm_backward(dy, ds, xs, weight, mean, rstd, kind, eps, p, seed, offset, *need)
    return tuple(g if k else None for g, k in zip((dx, dr, dw, db), need)) + (None,) * 5


norm.register_autograd(_norm_bwd, setup_context=_norm_setup)


# ------------------------------------------------------------------ BatchNorm (channels last), dropout

@_op("batch_norm")
def batch_norm(x: Tensor, r: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor],
               running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool, momentum: float,
               eps: float, p: float, seed: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, s, mean, rstd, new running_mean, new running_var) of BatchNorm per channel over every
    leading dim of x (of s = x + dropout(r)). The op is functional (PyTorch registers autograd
    only for those): training updates copies of the running statistics, which the caller copies
    back (empty when not training or without running statistics)."""
    from .norm import batch_norm_forward
    x = _contig(x)
    r = _contig(r) if r is not None else None
    update = training and running_mean is not None
    rm = running_mean.clone() if update else running_mean
    rv = running_var.clone() if update else running_var
    y, s, mean, rstd = _call(batch_norm_forward, x, weight, bias, rm, rv, r, training, momentum,
                             eps, p, _seed_value(seed), 0, True)
    return y, _or_nothing(s, y), mean, rstd, rm if update else _nothing(y), rv if update else _nothing(y)


@batch_norm.register_fake
def _(x, r, weight, bias, running_mean, running_var, training, momentum, eps, p, seed):
    c = x.shape[-1]
    acc = _acc(x)
    update = training and running_mean is not None
    return (x.new_empty(x.shape), x.new_empty(x.shape) if r is not None else _nothing(x),
            x.new_empty((c,), dtype=acc), x.new_empty((c,), dtype=acc),
            torch.empty_like(running_mean) if update else _nothing(x),
            torch.empty_like(running_var) if update else _nothing(x))


@_op("batch_norm_backward")
def batch_norm_backward(dy: Tensor, ds: Optional[Tensor], xs: Tensor, weight: Optional[Tensor], mean: Tensor,
                        rstd: Tensor, training: bool, p: float, seed: Optional[Tensor], need_x: bool, need_r: bool,
                        need_w: bool, need_b: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dr, dw, db); ds (s's gradient from its other uses) adds to dx and, through the
    dropout, to dr."""
    from .norm import batch_norm_backward as bnb, dropout_backward
    sv = _seed_value(seed)
    dx, dr, dw, db = _call(bnb, _contig(dy), xs, weight, mean, rstd, training, p, sv, 0,
                           (need_x, need_r, need_w, need_b), need_b)
    if ds is not None:
        ds = _contig(ds)
        if dx is not None:
            dx = dx + ds
        if need_r:
            dr = dr + _call(dropout_backward, ds, p, sv, 0)
    return _or_nothing(dx, dy), _or_nothing(dr, dy), _or_nothing(dw, dy), _or_nothing(db, dy)


@batch_norm_backward.register_fake
def _(dy, ds, xs, weight, mean, rstd, training, p, seed, need_x, need_r, need_w, need_b):
    c = xs.shape[-1]
    pdt = weight.dtype if weight is not None else xs.dtype
    return (dy.new_empty(xs.shape) if need_x else _nothing(dy), dy.new_empty(xs.shape) if need_r else _nothing(dy),
            dy.new_empty((c,), dtype=pdt) if need_w and weight is not None else _nothing(dy),
            dy.new_empty((c,), dtype=pdt) if need_b else _nothing(dy))


def _bn_setup(ctx, inputs, output):
    x, r, weight, bias, running_mean, running_var, training, momentum, eps, p, seed = inputs
    y, s, mean, rstd, _, _ = output
    ctx.save_for_backward(s if r is not None else x, weight, mean, rstd, seed)
    ctx.cfg = (training, p)
    ctx.has_r, ctx.has_b = r is not None, bias is not None
    ctx.mark_non_differentiable(*output[2:])
    _set_materialize(ctx)


def _bn_bwd(ctx, dy, ds, *_):
    xs, weight, mean, rstd, seed = ctx.saved_tensors
    training, p = ctx.cfg
    n = ctx.needs_input_grad
    need = (n[0], ctx.has_r and n[1], weight is not None and n[2], ctx.has_b and n[3])
    if not ctx.has_r:
        ds = None
    if dy is None:
        dy = torch.zeros_like(xs)
    dx, dr, dw, db = torch.ops.fastgrad.batch_norm_backward(dy, ds, xs, weight, mean, rstd, training, p, seed, *need)
    return tuple(g if k else None for g, k in zip((dx, dr, dw, db), need)) + (None,) * 7


batch_norm.register_autograd(_bn_bwd, setup_context=_bn_setup)


@_op("dropout")
def dropout(x: Tensor, p: float, seed: Tensor, offset: int) -> Tensor:
    from .norm import dropout_forward
    return _call(dropout_forward, _contig(x), p, _seed_value(seed), offset)


@dropout.register_fake
def _(x, p, seed, offset):
    return x.new_empty(x.shape)


@_op("dropout_backward")
def dropout_backward(dy: Tensor, p: float, seed: Tensor, offset: int) -> Tensor:
    from .norm import dropout_backward as db
    return _call(db, _contig(dy), p, _seed_value(seed), offset)


@dropout_backward.register_fake
def _(dy, p, seed, offset):
    return dy.new_empty(dy.shape)


def _dropout_setup(ctx, inputs, output):
    x, p, seed, offset = inputs
    ctx.save_for_backward(seed)
    ctx.cfg = (p, offset)


def _dropout_bwd(ctx, dy):
    (seed,) = ctx.saved_tensors
    p, offset = ctx.cfg
    dx = torch.ops.fastgrad.dropout_backward(dy, p, seed, offset) if ctx.needs_input_grad[0] else None
    return dx, None, None, None


dropout.register_autograd(_dropout_bwd, setup_context=_dropout_setup)


# ------------------------------------------------------------------ RevIN

@_op("revin_stats")
def revin_stats(x: Tensor, eps: float, subtract_last: bool) -> Tuple[Tensor, Tensor]:
    """(mean, stdev) over L of x [..., L, C]; no autograd (constants to the backward, as PatchTST
    detaches them)."""
    from .norm import revin_stats as rs
    return _call(rs, _contig(x), eps, subtract_last)


@revin_stats.register_fake
def _(x, eps, subtract_last):
    shape = tuple(x.shape[:-2]) + (x.shape[-1],)
    return x.new_empty(shape, dtype=_acc(x)), x.new_empty(shape, dtype=_acc(x))


@_op("revin")
def revin(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, stdev: Tensor, denorm: bool,
          eps: float) -> Tensor:
    from .norm import revin_forward
    return _call(revin_forward, _contig(x), mean, stdev, weight, bias, denorm, eps)


@revin.register_fake
def _(x, weight, bias, mean, stdev, denorm, eps):
    return x.new_empty(x.shape)


@_op("revin_backward")
def revin_backward(dy: Tensor, x: Tensor, mean: Tensor, stdev: Tensor, weight: Optional[Tensor],
                   bias: Optional[Tensor], denorm: bool, eps: float, need_x: bool, need_w: bool,
                   need_b: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dw, db) with mean and stdev held constant."""
    from .norm import revin_backward as rb
    dx, dw, db = _call(rb, _contig(dy), _contig(x), mean, stdev, weight, bias, denorm, eps, (need_x, need_w, need_b))
    return _or_nothing(dx, dy), _or_nothing(dw, dy), _or_nothing(db, dy)


@revin_backward.register_fake
def _(dy, x, mean, stdev, weight, bias, denorm, eps, need_x, need_w, need_b):
    c = x.shape[-1]
    pdt = weight.dtype if weight is not None else x.dtype
    return (dy.new_empty(x.shape) if need_x else _nothing(dy),
            dy.new_empty((c,), dtype=pdt) if need_w and weight is not None else _nothing(dy),
            dy.new_empty((c,), dtype=pdt) if need_b and bias is not None else _nothing(dy))


def _revin_setup(ctx, inputs, output):
    x, weight, bias, mean, stdev, denorm, eps = inputs
    ctx.save_for_backward(x, weight, bias, mean, stdev)
    ctx.cfg = (denorm, eps)


def _revin_bwd(ctx, dy):
    x, w, b, mean, stdev = ctx.saved_tensors
    n = ctx.needs_input_grad
    need = (n[0], w is not None and n[1], b is not None and n[2])
    if not any(need):
        return (None,) * 7
    dx, dw, db = torch.ops.fastgrad.revin_backward(dy, x, mean, stdev, w, b, *ctx.cfg, *need)
    return (dx if need[0] else None, dw if need[1] else None, db if need[2] else None) + (None,) * 4


revin.register_autograd(_revin_bwd, setup_context=_revin_setup)


# ------------------------------------------------------------------ the transformer encoder layer
#
# One op each way over fg_encoder_layer_forward / _backward. The layer's descriptor travels as its
# fields (ENCODER_CFG, encoder_desc's arguments in order) and is built inside the op; the weights
# as a list with their fg_encoder_layer_params names (one comma-separated string: custom ops take
# no list of strings); the cache (what the forward saves for the
# backward) is a uint8 output of the forward and an input of the backward, its size from
# fg_encoder_layer_sizes (host-only), which the fake implementation calls too. BatchNorm's
# running statistics are updated in copies that the forward returns (empty when not updated);
# the caller copies them into its buffers. seed: (seed, offset), a two-element int64 CPU tensor
# (torch.randint(0, 2**62, (2,)), the eager path's draw); scale: a tensor whose value replaces
# attn_scale (PatchTST's scale parameter; read on the host inside the op).

ENCODER_CFG = ("d_model", "heads", "d_ff", "activation", "norm", "norm_eps", "bn_momentum", "attn_scale", "causal",
               "residual_scores", "dropout", "dropout_ffn", "dropout_attn", "save", "dropout_proj")

_NO_BACKWARD = ("fastgrad: no backward through an evaluation-mode BatchNorm encoder layer (the library's backward "
                "is of a training forward); call .train() or run under torch.no_grad()")


def _enc_desc(cfg, scale=None):
    from .encoder import encoder_desc
    kw = dict(zip(ENCODER_CFG, cfg))
    if scale is not None:
        kw["attn_scale"] = float(scale)
    return encoder_desc(**kw)


def _enc_seed(seed):
    return (int(seed[0]), int(seed[1])) if seed is not None else (0, 0)


def _enc_params(names, weights, running):
    params = dict(zip(names.split(","), weights))
    for k, t in zip(("running_mean1", "running_var1", "running_mean2", "running_var2"), running):
        if t is not None:
            params[k] = t
    return params


@_op("encoder_layer")
def encoder_layer(x: Tensor, scores_in: Optional[Tensor], lengths: Optional[Tensor], weights: List[Tensor],
                  names: str, running_mean1: Optional[Tensor], running_var1: Optional[Tensor],
                  running_mean2: Optional[Tensor], running_var2: Optional[Tensor], scale: Optional[Tensor],
                  seed: Optional[Tensor], train: bool, return_scores: bool, d_model: int, heads: int, d_ff: int,
                  activation: str, norm: str, norm_eps: float, bn_momentum: float, attn_scale: Optional[float],
                  causal: bool, residual_scores: bool, dropout: float, dropout_ffn: float, dropout_attn: float,
                  save: str, dropout_proj: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, scores_out, cache, running_mean1, running_var1, running_mean2, running_var2): scores
    empty unless return_scores, cache empty unless train, the running statistics updated copies
    when train with BatchNorm (else empty)."""
    from .encoder import encoder_layer_forward
    cfg = (d_model, heads, d_ff, activation, norm, norm_eps, bn_momentum, attn_scale, causal, residual_scores,
           dropout, dropout_ffn, dropout_attn, save, dropout_proj)
    desc = _enc_desc(cfg, scale)
    running = (running_mean1, running_var1, running_mean2, running_var2)
    update = train and running_mean1 is not None
    running = tuple(t.clone() if update and t is not None else t for t in running)
    s, off = _enc_seed(seed)
    y, scores, cache = encoder_layer_forward(desc, _contig(x), _enc_params(names, weights, running), lengths,
                                             _contig(scores_in) if scores_in is not None else None, train, s, off,
                                             return_scores)
    cache = cache if cache is not None else x.new_empty((0,), dtype=torch.uint8)
    return (y, _or_nothing(scores, y), cache) + tuple(t if update else _nothing(y) for t in running)


def encoder_cache_bytes(cfg, dtype, b, l):
    """The cache's size in bytes (fg_encoder_layer_sizes, at least 16 as encoder.py allocates)."""
    from .encoder import encoder_layer_sizes
    return max(int(encoder_layer_sizes(_enc_desc(cfg), ops._TORCH_DTYPES[dtype], int(b), int(l))[0]), 16)


@encoder_layer.register_fake
def _(x, scores_in, lengths, weights, names, running_mean1, running_var1, running_mean2, running_var2, scale, seed,
      train, return_scores, *cfg):
    b, l = x.shape[0], x.shape[1]
    sdt = scores_in.dtype if scores_in is not None else x.dtype
    scores = x.new_empty((b, cfg[1], l, l), dtype=sdt) if return_scores else _nothing(x)
    cache = x.new_empty((encoder_cache_bytes(cfg, x.dtype, b, l) if train else 0,), dtype=torch.uint8)
    update = train and running_mean1 is not None
    running = tuple(torch.empty_like(t) if update and t is not None else _nothing(x)
                    for t in (running_mean1, running_var1, running_mean2, running_var2))
    return (x.new_empty(x.shape), scores, cache) + running


@_op("encoder_layer_backward")
def encoder_layer_backward(dy: Tensor, dscores: Optional[Tensor], x: Tensor, scores_in: Optional[Tensor],
                           lengths: Optional[Tensor], weights: List[Tensor], names: str,
                           running_mean1: Optional[Tensor], running_var1: Optional[Tensor],
                           running_mean2: Optional[Tensor], running_var2: Optional[Tensor], cache: Tensor,
                           scale: Optional[Tensor], seed: Optional[Tensor], need_x: bool, need_s: bool,
                           need_w: List[bool], d_model: int, heads: int, d_ff: int, activation: str, norm: str,
                           norm_eps: float, bn_momentum: float, attn_scale: Optional[float], causal: bool,
                           residual_scores: bool, dropout: float, dropout_ffn: float, dropout_attn: float, save: str,
                           dropout_proj: float) -> Tuple[Tensor, Tensor, List[Tensor]]:
    """(dx, dscores_in, [gradient of each weight]) of a training forward with the same inputs and
    cache; the ones not asked for are empty."""
    from .encoder import encoder_layer_backward as elb
    if cache.numel() == 0:
        raise RuntimeError(_NO_BACKWARD)
    cfg = (d_model, heads, d_ff, activation, norm, norm_eps, bn_momentum, attn_scale, causal, residual_scores,
           dropout, dropout_ffn, dropout_attn, save, dropout_proj)
    running = (running_mean1, running_var1, running_mean2, running_var2)
    names = names.split(",")
    want = [n for n, w in zip(names, need_w) if w]
    s, off = _enc_seed(seed)
    params = _enc_params(",".join(names), weights, running)
    dx, ds, grads = elb(_enc_desc(cfg, scale), _contig(dy), x, params, cache, lengths, scores_in, _contig(dscores) if dscores is not None else None, s, off, need=want,
                        need_dx=need_x, need_dscores_in=need_s and scores_in is not None)
    return _or_nothing(dx, dy), _or_nothing(ds, dy), [grads[n] if n in grads else _nothing(dy) for n in names]


@encoder_layer_backward.register_fake
def _(dy, dscores, x, scores_in, lengths, weights, names, running_mean1, running_var1, running_mean2, running_var2,
      cache, scale, seed, need_x, need_s, need_w, *cfg):
    return (dy.new_empty(x.shape) if need_x else _nothing(dy),
            dy.new_empty(scores_in.shape, dtype=scores_in.dtype) if need_s and scores_in is not None
            else _nothing(dy),
            [dy.new_empty(w.shape, dtype=w.dtype) if k else _nothing(dy) for w, k in zip(weights, need_w)])


def _encoder_setup(ctx, inputs, output):
    x, scores_in, lengths, weights, names = inputs[:5]
    running, scale, seed = inputs[5:9], inputs[9], inputs[10]
    ctx.names, ctx.return_scores, ctx.cfg = names, inputs[12], inputs[13:]
    ctx.n_weights = len(weights)
    if inputs[11] and running[0] is not None:  # the updated copies (the caller writes the buffers in place)
        running = output[3:7]
    ctx.save_for_backward(x, scores_in, lengths, output[2], scale, seed, *running, *weights)
    ctx.mark_non_differentiable(*output[2:])
    _set_materialize(ctx)


def _encoder_bwd(ctx, dy, dscores, *_):
    x, scores_in, lengths, cache, scale, seed, *rest = ctx.saved_tensors
    running, weights = rest[:4], rest[4:]
    n = ctx.needs_input_grad  # n[3]: one flag per weight
    need_w = [bool(k) for k in n[3]]
    need_x, need_s = bool(n[0]), scores_in is not None and bool(n[1])
    none_tail = (None,) * (len(ENCODER_CFG) + 9)
    if not (need_x or need_s or any(need_w)):
        return (None, None, None, [None] * ctx.n_weights) + none_tail
    if dy is None:
        dy = torch.zeros_like(x)
    dx, ds, grads = torch.ops.fastgrad.encoder_layer_backward(
        dy, dscores if ctx.return_scores else None, x, scores_in, lengths, list(weights), ctx.names, *running, cache,
        scale, seed, need_x, need_s, need_w, *ctx.cfg)
    return ((dx if need_x else None, ds if need_s else None, None, [g if k else None for g, k in zip(grads, need_w)])
            + none_tail)


encoder_layer.register_autograd(_encoder_bwd, setup_context=_encoder_setup)


def all_ops():
    """Every fastgrad custom op (for opcheck)."""
    return list(_OPS)


# ------------------------------------------------------------------ inductor

def _inductor_fallbacks(lowering):
    """Registers every op with inductor as a fallback (a call of its kernel) under the layout
    constraint inductor would pick itself. Inductor does the same on first meeting a custom op
    without a lowering (its "implicit fallback"), but torch 2.11 first formats the op's arguments
    for an info log line whatever the log level: the IR behind them printed as a tree, which
    grows with the depth of the graph and did not finish on the 12-layer GPT-2 of fastgrad ops
    (bench/gpt2_step.py; docs/perf-notes.md 19). Later torch formats it lazily. Registered here,
    the layout constraint is the one configured when inductor is imported, and these ops compile
    even with inductor's implicit_fallbacks off (decision 180). Never raises: an op not
    registered here takes the implicit path."""
    try:
        from torch._library.utils import get_layout_constraint_tag
    except Exception:  # noqa: BLE001 (a torch without it: inductor's own path)
        return
    for op in _OPS:
        try:
            target = op._opoverload
            if target in lowering.lowerings:
                continue
            tag = get_layout_constraint_tag(target, with_default=True)
            lowering.make_fallback(target, layout_constraint=lowering.tag_to_layout_constraint(tag), warn=False)
        except Exception:  # noqa: BLE001
            continue


class _AfterImport:
    """A loader that runs the module as `inner` does, then fn(module) (once)."""

    def __init__(self, inner, fn):
        self._inner, self._fn = inner, fn

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        fn, self._fn = self._fn, None
        if fn is not None:
            fn(module)

    def __getattr__(self, name):  # get_source, get_filename, ... as the inner loader has them
        return getattr(self._inner, name)


def _when_imported(name, fn):
    """fn(module) once the module `name` is imported: now if it is, else right after its import
    (a finder at the head of sys.meta_path that asks the finders after it and wraps the loader
    they give; it then stays, inert: removing it from a list another import may be walking
    could make that import skip a finder). Nothing is imported here."""
    import importlib.abc
    import sys
    if name in sys.modules:
        fn(sys.modules[name])
        return

    class _Finder(importlib.abc.MetaPathFinder):
        done = False

        def find_spec(self, fullname, path, target=None):
            if self.done or fullname != name:
                return None
            self.done = True
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is None:
                    continue
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterImport(spec.loader, fn)
                return spec
            return None

    sys.meta_path.insert(0, _Finder())


_when_imported("torch._inductor.lowering", _inductor_fallbacks)


# ------------------------------------------------------------------ C++ kernels for the hottest ops

_KERNEL_OPS = ("linear", "linear_backward", "linear_act", "linear_act_backward", "norm", "norm_backward", "attention",
               "attention_backward")


def _register_kernels():
    """Makes the torch extension's C++ functions (_torchext.cpp) the CPU / CUDA kernels of the ops
    a transformer calls most, and a C++ autograd kernel theirs, so that a compiled graph's call of
    one (grad mode off) never enters Python; each hands what it does not take to the Python
    function above, and a call that records a graph goes to custom_op's autograd kernel.
    Off without the extension or with FASTGRAD_NO_OP_KERNELS=1. Returns whether they are on."""
    import os

    from . import _torchext
    m = _torchext.MODULE
    if m is None or not hasattr(m, "register_kernels") or os.environ.get("FASTGRAD_NO_OP_KERNELS", "") not in ("", "0"):
        return False
    m.register_kernels({n: _PY_FN[n] for n in _KERNEL_OPS}, _autograd_kernels())
    ops.on_tf32_change(m.set_tf32)
    return True


def _autograd_kernels():
    """custom_op's own autograd kernel of each op (what it registered for the Autograd key), for the
    C++ autograd kernel to hand the calls that record a graph; None where this torch does not make
    them the way it is called here (then the C++ autograd kernels stay off)."""
    try:
        from torch._library.autograd import make_autograd_impl
        defs = {op._name.split("::")[-1]: op for op in _OPS}
        return {n: make_autograd_impl(getattr(torch.ops.fastgrad, n).default, defs[n]) for n in _KERNEL_OPS}
    except (ImportError, AttributeError, KeyError, TypeError):
        return None


KERNELS = _register_kernels()


__all__ = ["use_custom_ops", "routed", "draw_seed", "all_ops", "KERNELS"]

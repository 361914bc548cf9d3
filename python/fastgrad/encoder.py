"""The transformer encoder layer from Python: one library call runs a whole layer forward
(fg_encoder_layer_forward), one its whole backward (fg_encoder_layer_backward), from a cache of
saved activations the caller holds.

Functional forms on numpy arrays (CPU) and torch tensors (CPU or CUDA, on torch's current stream):
encoder_desc builds the layer's descriptor, encoder_layer_forward / encoder_layer_backward run it
with the weights passed by the names of fg_encoder_layer_params (w_qkv or w_q / w_k / w_v, b_*, w_o,
w_1, w_2, norm1_w, ..., running_mean1, ...). With torch:

  fg.TransformerEncoderLayer  a drop-in for torch.nn.TransformerEncoderLayer (same parameter names,
                              shapes and initialization; both norm_first settings; causal and
                              suffix key-padding masks)
  fg.PatchTSTEncoder          the reference PatchTST backbone's TSTEncoder (yuqinie98/PatchTST):
                              BatchNorm post-norm, residual attention carried from layer to layer,
                              separate W_Q / W_K / W_V, GELU FFN; the same state_dict keys

Each layer is one autograd Function: its forward keeps the cache (a uint8 tensor from torch's
caching allocator) for the backward, which takes its workspace from the same allocator. With the
torch C++ extension built (_torchext.cpp) that Function runs in C++ (the same library calls and
bits, without the Python's per-call cost; use_torchext(False) turns it off). Dropout
masks are counter-based: each call draws (seed, offset) from torch's default CPU generator, so
torch.manual_seed replays a run, and the backward regenerates the forward's masks. While
torch.compile traces (or with torch_ops.use_custom_ops(True)) the layers call the custom ops
fastgrad::encoder_layer / encoder_layer_backward instead (torch_ops.py), with the same draws.
"""
import ctypes
import inspect

import numpy as np

from . import _lib, _torchext
from .ops import _describe, _empty_like_family, _is_torch, _placement

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - CI has no torch
    torch = None

_U64 = 2**64 - 1
_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
# A zero in these descriptor fields means the documented default (1e-5, 0.1); a caller's own zero
# is passed as the smallest positive double instead, which rounds to the same arithmetic.
_TINY = 1e-300


def encoder_desc(d_model, heads, d_ff, activation="gelu", norm="post_batch", norm_eps=1e-5, bn_momentum=0.1,
                 attn_scale=None, causal=False, residual_scores=False, dropout=0.0, dropout_ffn=0.0,
                 dropout_attn=0.0, save="all", dropout_proj=0.0):
    """The fg_encoder_layer_desc. activation: gelu, gelu_tanh, relu or silu; norm: pre_layer,
    pre_rms, post_layer or post_batch; attn_scale None: 1/sqrt(d_model/heads); save: 'all',
    'less' (the FFN's pre-activation recomputed in the backward) or 'min' (the norms' outputs and
    the FFN hidden too; the training forward's temporaries in a workspace); dropout_proj: after the
    attention's output projection, composed with the branch's dropout (PatchTST's to_out)."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"fastgrad: the encoder layer's activation must be one of {_ACTIVATIONS}, not {activation!r}")
    if norm not in _lib.ENCODER_NORM:
        raise ValueError(f"fastgrad: norm must be one of {sorted(_lib.ENCODER_NORM)}, not {norm!r}")
    if save not in _lib.ENCODER_SAVE:
        raise ValueError(f"fastgrad: save must be one of {sorted(_lib.ENCODER_SAVE)}, not {save!r}")
    return _lib.EncoderLayerDesc(
        d_model=int(d_model), heads=int(heads), d_ff=int(d_ff), activation=_lib.ACT[activation],
        norm=_lib.ENCODER_NORM[norm], norm_eps=float(norm_eps) or _TINY, bn_momentum=float(bn_momentum) or _TINY,
        attn_scale=0.0 if attn_scale is None else float(attn_scale), causal=int(bool(causal)),
        residual_scores=int(bool(residual_scores)), dropout=float(dropout), dropout_ffn=float(dropout_ffn),
        dropout_attn=float(dropout_attn), save=_lib.ENCODER_SAVE[save], dropout_proj=float(dropout_proj))


# encoder_desc's defaults (the custom op takes every field)
encoder_desc_defaults = {k: v.default for k, v in inspect.signature(encoder_desc).parameters.items()
                         if v.default is not inspect.Parameter.empty}


def _dtype_of(x):
    return _describe(x, "x").dtype


def encoder_layer_sizes(desc, dtype, B, L):
    """(cache_bytes, workspace_bytes) for B sequences of L tokens; dtype an array or tensor of the
    layer's dtype, or an fg dtype code."""
    code = dtype if isinstance(dtype, int) else _dtype_of(dtype)
    cache, ws = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(_lib.lib.fg_encoder_layer_sizes(ctypes.byref(desc), code, int(B), int(L), ctypes.byref(cache),
                                               ctypes.byref(ws)))
    return cache.value, ws.value


def _bytes(ref, n):
    """n bytes (at least 16) of the caller's allocator beside ref, 256-byte aligned: a torch uint8
    tensor on ref's device (the caching allocator), or an aligned view of a numpy buffer."""
    n = max(int(n), 16)
    if _is_torch(ref):
        return torch.empty(n, dtype=torch.uint8, device=ref.device)
    raw = np.empty(n + 256, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 256
    return raw[skip: skip + n]


def _ptr(buf):
    if buf is None:
        return None
    return buf.data_ptr() if _is_torch(buf) else buf.ctypes.data


def _nbytes(buf):
    return 0 if buf is None else (buf.numel() if _is_torch(buf) else buf.nbytes)


def _tensor_ptr(a, name):
    return None if a is None else ctypes.byref(_describe(a, name))


def _params(params, name="params"):
    """An fg_encoder_layer_params of a dict {field name: array or None}."""
    unknown = [k for k in params if k not in _lib.ENCODER_PARAMS]
    if unknown:
        raise ValueError(f"fastgrad: the encoder layer has no parameter {unknown[0]!r}; its parameters are "
                         f"{', '.join(_lib.ENCODER_PARAMS)}")
    p = _lib.EncoderLayerParams()
    for k, a in params.items():
        if a is not None:
            setattr(p, k, _describe(a, f"{name}.{k}"))
    return p


def _context(x):
    backend, device, tdev = _placement(x)
    ctx = _lib.context(backend, device)
    if tdev is not None and backend == _lib.BACKEND_CUDA:
        ctx.set_stream(torch.cuda.current_stream(tdev).cuda_stream)
    return ctx


def _run(train, seed, offset):
    return _lib.EncoderLayerRun(train=int(bool(train)), seed=int(seed) & _U64, offset=int(offset) & _U64)


def encoder_layer_forward(desc, x, params, lengths=None, scores_in=None, train=True, seed=0, offset=0,
                          return_scores=False, scores_dtype=None, cache=None, out=None, workspace=None):
    """(y, scores_out or None, cache or None) of one encoder layer on x [B, L, d] (contiguous).
    params: {name: array} by fg_encoder_layer_params' names (absent: None or left out); BatchNorm's
    running statistics are updated in place when train. lengths [B] int32/int64: keys at positions
    >= lengths[b] are masked. scores_in / return_scores: PatchTST's residual attention (the
    descriptor's residual_scores); the scores take scores_in's dtype, else scores_dtype (default
    x's). cache: a buffer of at least encoder_layer_sizes' cache_bytes, allocated when None and
    train (an evaluation forward keeps none). workspace: save "min"'s training forward places its
    temporaries there (encoder_layer_sizes' workspace_bytes; allocated for the call when None)."""
    b, l = x.shape[0], x.shape[1]
    y = out if out is not None else _empty_like_family(x, tuple(x.shape))
    scores = None
    if return_scores:
        sdt = scores_in.dtype if scores_in is not None else (scores_dtype or x.dtype)
        scores = _empty_like_family(x, (b, int(desc.heads), l, l), sdt)
    if cache is None and train:
        cache = _bytes(x, encoder_layer_sizes(desc, x, b, l)[0])
    ctx = _context(x)
    run = _run(train, seed, offset)
    p = _params(params)
    if train and desc.save == _lib.ENCODER_SAVE["min"] and workspace is None:
        ws_bytes = encoder_layer_sizes(desc, x, b, l)[1]
        workspace = _bytes(x, ws_bytes) if ws_bytes else None
    _lib.check(_lib.lib.fg_encoder_layer_forward_ws(
        ctx.handle, ctypes.byref(desc), ctypes.byref(run), ctypes.byref(_describe(x, "x")),
        _tensor_ptr(lengths, "lengths"), _tensor_ptr(scores_in, "scores_in"), ctypes.byref(p),
        ctypes.byref(_describe(y, "y")), _tensor_ptr(scores, "scores_out"), _ptr(cache), _nbytes(cache),
        _ptr(workspace), _nbytes(workspace)))
    return y, scores, cache


def encoder_layer_backward(desc, dy, x, params, cache, lengths=None, scores_in=None, dscores_out=None, seed=0,
                           offset=0, need=None, need_dx=True, need_dscores_in=True, out=None, accumulate=False,
                           workspace=None):
    """(dx, dscores_in, grads) of a training encoder_layer_forward with the same desc, (seed,
    offset), x, lengths, scores_in, params and cache: grads {name: gradient} for the parameters
    named in need (default: every learnable parameter present in params), dx when need_dx,
    dscores_in when need_dscores_in and scores_in is given. out: {name: buffer} (the keys 'dx'
    and 'dscores_in' too) to write (accumulate: add) into instead of new arrays."""
    out = dict(out or {})
    learnable = [k for k, a in params.items() if a is not None and not k.startswith("running_")]
    need = learnable if need is None else list(need)
    for k in need:
        if params.get(k) is None:
            raise ValueError(f"fastgrad: a gradient of {k!r}, a parameter the layer does not have")
    grads = {k: out[k] if out.get(k) is not None else _empty_like_family(dy, tuple(params[k].shape), params[k].dtype)
             for k in need}
    dx = (out.get("dx") if out.get("dx") is not None else _empty_like_family(dy, tuple(x.shape))) if need_dx else None
    ds = None
    if need_dscores_in and scores_in is not None:
        ds = out.get("dscores_in")
        if ds is None:
            ds = _empty_like_family(dy, tuple(scores_in.shape), scores_in.dtype)
    if workspace is None:
        ws_bytes = encoder_layer_sizes(desc, x, x.shape[0], x.shape[1])[1]
        workspace = _bytes(dy, ws_bytes) if ws_bytes else None
    ctx = _context(dy)
    run = _run(True, seed, offset)
    p = _params(params)
    g = _params(grads, "grads")
    _lib.check(_lib.lib.fg_encoder_layer_backward(
        ctx.handle, ctypes.byref(desc), ctypes.byref(run), ctypes.byref(_describe(dy, "dy")),
        _tensor_ptr(dscores_out, "dscores_out"), ctypes.byref(_describe(x, "x")), _tensor_ptr(lengths, "lengths"),
        _tensor_ptr(scores_in, "scores_in"), ctypes.byref(p), _ptr(cache), _nbytes(cache), _tensor_ptr(dx, "dx"),
        _tensor_ptr(ds, "dscores_in"), ctypes.byref(g), int(bool(accumulate)), _ptr(workspace), _nbytes(workspace)))
    return dx, ds, grads


def encoder_sizes(desc, layers, dtype, B, L):
    """(cache_bytes, workspace_bytes) of a stack of `layers` layers (encoder_forward)."""
    code = dtype if isinstance(dtype, int) else _dtype_of(dtype)
    cache, ws = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(_lib.lib.fg_encoder_sizes(ctypes.byref(desc), int(layers), code, int(B), int(L), ctypes.byref(cache),
                                         ctypes.byref(ws)))
    return cache.value, ws.value


def _params_array(params, name):
    """fg_encoder_layer_params[len(params)] of a list of {field name: array or None}."""
    arr = (_lib.EncoderLayerParams * len(params))()
    for i, p in enumerate(params):
        arr[i] = _params(p, f"{name}[{i}]")
    return arr


def encoder_forward(desc, x, params, lengths=None, train=True, seed=0, offset=0, cache=None, out=None,
                    workspace=None):
    """(y, cache) of a stack of len(params) encoder layers on x [B, L, d] (fg_encoder_forward):
    layer i draws from (seed, offset + i); with residual_scores the scores are carried as the
    layers' q and k (no [B, H, L, L] buffer). params: a list of encoder_layer_forward's dicts."""
    n, b, l = len(params), x.shape[0], x.shape[1]
    y = out if out is not None else _empty_like_family(x, tuple(x.shape))
    cb, wb = encoder_sizes(desc, n, x, b, l)
    if cache is None:
        cache = _bytes(x, cb)
    if workspace is None and desc.save == _lib.ENCODER_SAVE["min"]:
        workspace = _bytes(x, wb) if wb else None
    ctx = _context(x)
    run = _run(train, seed, offset)
    p = _params_array(params, "params")
    _lib.check(_lib.lib.fg_encoder_forward(
        ctx.handle, ctypes.byref(desc), n, ctypes.byref(run), ctypes.byref(_describe(x, "x")),
        _tensor_ptr(lengths, "lengths"), p, ctypes.byref(_describe(y, "y")), _ptr(cache), _nbytes(cache),
        _ptr(workspace), _nbytes(workspace)))
    return y, cache


def encoder_backward(desc, dy, x, params, cache, lengths=None, seed=0, offset=0, need=None, need_dx=True,
                     accumulate=False, workspace=None):
    """(dx, grads) of a training encoder_forward: grads a list (a layer each) of {name: gradient}
    for the names in need (a list of name lists, a layer each; default: every learnable parameter
    present)."""
    n = len(params)
    grads = []
    for i, pl in enumerate(params):
        learnable = [k for k, a in pl.items() if a is not None and not k.startswith("running_")]
        names = learnable if need is None else [k for k in need[i] if pl.get(k) is not None]
        grads.append({k: _empty_like_family(dy, tuple(pl[k].shape), pl[k].dtype) for k in names})
    dx = _empty_like_family(dy, tuple(x.shape)) if need_dx else None
    if workspace is None:
        wb = encoder_sizes(desc, n, x, x.shape[0], x.shape[1])[1]
        workspace = _bytes(dy, wb) if wb else None
    ctx = _context(dy)
    run = _run(True, seed, offset)
    p = _params_array(params, "params")
    g = _params_array(grads, "grads")
    _lib.check(_lib.lib.fg_encoder_backward(
        ctx.handle, ctypes.byref(desc), n, ctypes.byref(run), ctypes.byref(_describe(dy, "dy")),
        ctypes.byref(_describe(x, "x")), _tensor_ptr(lengths, "lengths"), p, _ptr(cache), _nbytes(cache),
        _tensor_ptr(dx, "dx"), g, int(bool(accumulate)), _ptr(workspace), _nbytes(workspace)))
    return dx, grads


__all__ = ["encoder_desc", "encoder_layer_sizes", "encoder_layer_forward", "encoder_layer_backward", "encoder_sizes",
           "encoder_forward", "encoder_backward"]

if torch is not None:
    import torch.nn.functional as F
    from torch import nn

    from .torch_ops import _NO_BACKWARD, ENCODER_CFG, routed

    FG = torch.ops.fastgrad  # the custom ops (torch_ops): what torch.compile traces

    # the C++ extension's encoder_layer (EncoderLayerFunction with its host work and autograd in C++,
    # _torchext.cpp), or None when it is not built (or is older than it)
    _ext_encoder = getattr(_torchext.MODULE, "encoder_layer", None)
    _SLOT = {name: i for i, name in enumerate(_lib.ENCODER_PARAMS)}

    def use_torchext(on=True):
        """Whether eager layers run through the C++ extension when it is built (the default); off,
        they run EncoderLayerFunction (the same library calls, the same results)."""
        global _ext_encoder
        _ext_encoder = getattr(_torchext.MODULE, "encoder_layer", None) if on else None

    _use_stack = False

    def use_stack(on=True):
        """Whether fg.PatchTSTEncoder runs its layers as one stack call where it can: the residual
        scores carried as the layers' q and k instead of [B, H, L, L] buffers (the same masks,
        values within rounding). Less memory for more time (docs/decisions.md: the attention's
        products over every earlier layer's pieces cost more than the scores' traffic saves on
        an H200), so off by default."""
        global _use_stack
        _use_stack = bool(on)

    def draw_encoder_seed():
        """(seed, offset) as a two-element int64 CPU tensor from torch's default CPU generator."""
        return torch.randint(0, 2**62, (2,))

    def _draw():
        """(seed, offset) from torch's default CPU generator: torch.manual_seed replays them."""
        s = draw_encoder_seed()
        return int(s[0]), int(s[1])

    class _Call:
        """What one layer call needs besides its differentiable inputs (autograd passes it through)."""

        def __init__(self, desc, train, seed, offset, names, buffers, lengths, want_scores, no_backward=None):
            self.desc, self.train, self.seed, self.offset = desc, train, seed, offset
            self.names, self.buffers, self.lengths, self.want_scores = names, buffers, lengths, want_scores
            self.no_backward = no_backward

    class _StackCall:
        """What a stack call needs besides its differentiable inputs: the layers' common descriptor,
        (seed, offset) (layer i draws from offset + i), the weight names of a layer, each layer's
        buffers, lengths."""

        def __init__(self, desc, train, seed, offset, names, buffers, lengths):
            self.desc, self.train, self.seed, self.offset = desc, train, seed, offset
            self.names, self.buffers, self.lengths = names, buffers, lengths

        def params(self, weights):
            k = len(self.names)
            return [dict(zip(self.names, weights[i * k:(i + 1) * k]), **self.buffers[i])
                    for i in range(len(self.buffers))]

    class EncoderStackFunction(torch.autograd.Function):
        """A stack of encoder layers as one library call each way (encoder_forward: residual scores
        carried as the layers' q and k, no [B, H, L, L] buffer): forward(x, call, *weights) → y,
        weights by call.names for layer 0, then layer 1, …"""

        @staticmethod
        def forward(ctx, x, call, *weights):
            y, cache = encoder_forward(call.desc, x, call.params(weights), call.lengths, call.train, call.seed,
                                       call.offset)
            ctx.call = call
            ctx.save_for_backward(x, cache, *weights)
            ctx.set_materialize_grads(False)
            return y

        @staticmethod
        def backward(ctx, dy):
            call = ctx.call
            x, cache, *weights = ctx.saved_tensors
            need = ctx.needs_input_grad
            k = len(call.names)
            names = [[n for j, n in enumerate(call.names) if need[2 + i * k + j]] for i in range(len(call.buffers))]
            if not (need[0] or any(names)):
                return (None, None) + (None,) * len(weights)
            dy = torch.zeros_like(x) if dy is None else (dy if dy.is_contiguous() else dy.contiguous())
            dx, grads = encoder_backward(call.desc, dy, x, call.params(weights), cache, call.lengths, call.seed,
                                         call.offset, need=names, need_dx=need[0])
            out = tuple(grads[i].get(n) for i in range(len(call.buffers)) for n in call.names)
            return (dx, None) + out

    class EncoderLayerFunction(torch.autograd.Function):
        """One encoder layer: forward(x, scores_in, call, *weights) → y, or (y, scores_out) when
        call.want_scores; weights by call.names (fg_encoder_layer_params' names)."""

        @staticmethod
        def forward(ctx, x, scores_in, call, *weights):
            params = dict(zip(call.names, weights))
            params.update(call.buffers)
            y, scores, cache = encoder_layer_forward(call.desc, x, params, call.lengths, scores_in, call.train,
                                                     call.seed, call.offset, call.want_scores)
            ctx.call = call
            ctx.has_scores_in = scores_in is not None
            ctx.save_for_backward(x, scores_in, cache, *weights)
            ctx.set_materialize_grads(False)
            return (y, scores) if call.want_scores else y

        @staticmethod
        def backward(ctx, dy, dscores=None):
            call = ctx.call
            if call.no_backward:
                raise RuntimeError(call.no_backward)
            x, scores_in, cache, *weights = ctx.saved_tensors
            need = ctx.needs_input_grad
            names = [n for n, w in zip(call.names, need[3:]) if w]
            if not (need[0] or (ctx.has_scores_in and need[1]) or names):
                return (None,) * (3 + len(weights))
            dy = torch.zeros_like(x) if dy is None else (dy if dy.is_contiguous() else dy.contiguous())
            if dscores is not None and not dscores.is_contiguous():
                dscores = dscores.contiguous()
            params = dict(zip(call.names, weights))
            params.update(call.buffers)
            dx, ds, grads = encoder_layer_backward(call.desc, dy, x, params, cache, call.lengths, scores_in, dscores,
                                                   call.seed, call.offset, need=names, need_dx=need[0],
                                                   need_dscores_in=ctx.has_scores_in and need[1])
            return (dx, ds, None) + tuple(grads.get(n) for n in call.names)

    # ------------------------------------------------------------------ masks

    def _lengths(pad, b, l):
        """A key-padding mask [B, L] (True or -inf = padding) as lengths [B] int64, when it pads
        the end of each sequence (True from some position on); other masks are refused."""
        if pad is None:
            return None
        if tuple(pad.shape) != (b, l):
            raise ValueError(f"fastgrad: the key padding mask must be [B, L] = [{b}, {l}], not {tuple(pad.shape)}")
        if pad.dtype != torch.bool:
            if not pad.is_floating_point():
                raise ValueError(f"fastgrad: the key padding mask must be bool or float (-inf = padding), "
                                 f"not {pad.dtype}")
            finite = torch.isfinite(pad)
            if bool((finite & (pad != 0)).any()) or bool((~finite & (pad != float("-inf"))).any()):
                raise ValueError("fastgrad: a float key padding mask must hold only 0 and -inf (additive "
                                 "masks are not supported)")
            pad = ~finite
        lengths = (~pad).sum(dim=1)
        j = torch.arange(l, device=pad.device)
        if not torch.equal(pad, j[None, :] >= lengths[:, None]):
            raise ValueError("fastgrad: the key padding mask must pad the end of each sequence (True from a "
                             "position on, as lengths would); other masks are not supported")
        return lengths.to(torch.int64).contiguous()

    def _causal(mask, l, is_causal):
        """Whether an attention mask [L, L] (True or -inf = masked) is the causal one; refuses others.
        is_causal with a mask trusts the hint, as torch does."""
        if mask is None:
            return bool(is_causal)
        if is_causal:
            return True
        if tuple(mask.shape) != (l, l):
            raise ValueError(f"fastgrad: the attention mask must be [L, L] = [{l}, {l}] (per-batch or per-head "
                             f"masks are not supported), not {tuple(mask.shape)}")
        above = torch.ones(l, l, dtype=torch.bool, device=mask.device).triu(1)
        if mask.dtype == torch.bool:
            m = mask
        elif mask.is_floating_point():
            m = mask == float("-inf")
            if bool((~m & (mask != 0)).any()):
                raise ValueError("fastgrad: a float attention mask must hold only 0 and -inf (additive masks "
                                 "are not supported)")
        else:
            raise ValueError(f"fastgrad: the attention mask must be bool or float, not {mask.dtype}")
        if torch.equal(m, above):
            return True
        if not bool(m.any()):
            return False
        raise ValueError("fastgrad: only the causal attention mask (or none) is supported")

    def _act_name(activation):
        if isinstance(activation, str):
            a = activation.lower()
            if a in _ACTIVATIONS:
                return a
        elif activation is F.relu or isinstance(activation, nn.ReLU):
            return "relu"
        elif activation is F.gelu:
            return "gelu"
        elif isinstance(activation, nn.GELU):
            return "gelu_tanh" if activation.approximate == "tanh" else "gelu"
        elif activation is F.silu or isinstance(activation, nn.SiLU):
            return "silu"
        raise ValueError(f"fastgrad: activation must be 'relu', 'gelu', 'gelu_tanh', 'silu', F.relu, F.gelu, "
                         f"F.silu or nn.ReLU / nn.GELU / nn.SiLU, not {activation!r}")

    def _as(t, dtype):
        return t if t is None or t.dtype == dtype else t.to(dtype)

    _RUNNING = ("running_mean1", "running_var1", "running_mean2", "running_var2")

    def _apply_layer(x, scores_in, cfg, weights, buffers, lengths, want_scores, training, seeds=None, scale=None):
        """Runs one layer through EncoderLayerFunction, or through the encoder_layer custom op
        (torch_ops) while torch.compile traces: cfg {encoder_desc's arguments}, weights {name:
        tensor} (learnable, cast to x's dtype; autograd carries the cast), buffers {name: tensor}
        (BatchNorm's running statistics), scale a tensor that replaces cfg's attn_scale (read on
        the host inside the op). Training draws (seed, offset) when any rate is nonzero (seeds: a
        two-element int64 CPU tensor of them given instead, as draw_encoder_seed returns);
        evaluation runs the library's evaluation forward, or, when gradients are wanted through a
        layer without BatchNorm, a training forward with every rate 0 (the same function)."""
        names = tuple(k for k, v in weights.items() if v is not None)
        ws = tuple(_as(weights[k], x.dtype) for k in names)
        batch = cfg["norm"] == "post_batch"
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in ws)
                                                  or (scores_in is not None and scores_in.requires_grad))
        any_p = any(cfg.get(k, 0) > 0 for k in ("dropout", "dropout_ffn", "dropout_attn", "dropout_proj"))
        if not training:
            cfg = dict(cfg, dropout=0.0, dropout_ffn=0.0, dropout_attn=0.0, dropout_proj=0.0)
        train = training or (wants_grad and not batch)
        x = x if x.is_contiguous() else x.contiguous()
        if scores_in is not None and not scores_in.is_contiguous():
            scores_in = scores_in.contiguous()
        if routed():
            return _apply_layer_op(x, scores_in, cfg, names, ws, buffers, lengths, want_scores, train,
                                   (seeds if seeds is not None else draw_encoder_seed()) if training and any_p
                                   else None, scale)
        no_backward = None
        if training:
            seed, offset = ((int(seeds[0]), int(seeds[1])) if seeds is not None else _draw()) if any_p else (0, 0)
        else:
            seed = offset = 0
            if wants_grad and batch:
                no_backward = _NO_BACKWARD
        if scale is not None:
            cfg = dict(cfg, attn_scale=float(scale))
        desc = encoder_desc(**cfg)
        bufs = {k: v for k, v in buffers.items() if v is not None}
        if _ext_encoder is not None:
            r = _ext_encoder(x, scores_in, ws, tuple(_SLOT[k] for k in names), tuple(bufs.values()),
                             tuple(_SLOT[k] for k in bufs), lengths, bytes(desc), seed, offset, bool(train),
                             bool(want_scores), no_backward)
            if r is not None:
                return r
        call = _Call(desc, train, seed, offset, names, bufs, lengths, want_scores, no_backward)
        return EncoderLayerFunction.apply(x, scores_in, call, *ws)

    def _apply_layer_op(x, scores_in, cfg, names, ws, buffers, lengths, want_scores, train, seed, scale):
        """_apply_layer through torch.ops.fastgrad.encoder_layer: the op returns the updated
        running statistics (it is functional); they are copied into the buffers here."""
        running = [buffers.get(k) for k in _RUNNING]
        full = dict(encoder_desc_defaults, **cfg)
        y, scores, _, *new = FG.encoder_layer(x, scores_in, lengths, list(ws), ",".join(names), *running, scale, seed,
                                              bool(train), bool(want_scores), *(full[k] for k in ENCODER_CFG))
        if train and running[0] is not None:
            with torch.no_grad():
                for old, upd in zip(running, new):
                    if old is not None:
                        old.copy_(upd)
        return (y, scores) if want_scores else y

    # ------------------------------------------------------------------ torch.nn.TransformerEncoderLayer

    class _SelfAttention(nn.Module):
        """The parameters of torch.nn.MultiheadAttention(d, nhead, batch_first) as TransformerEncoderLayer
        holds them (in_proj_weight / in_proj_bias packed q, k, v; out_proj), with its initialization. It
        is not called on its own: the encoder layer runs it."""

        def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=True, device=None, dtype=None):
            super().__init__()
            kw = {"device": device, "dtype": dtype}
            if embed_dim % num_heads:
                raise ValueError(f"fastgrad: d_model {embed_dim} is not a multiple of nhead {num_heads}")
            self.embed_dim, self.kdim, self.vdim, self._qkv_same_embed_dim = embed_dim, embed_dim, embed_dim, True
            self.num_heads, self.dropout, self.batch_first = num_heads, dropout, batch_first
            self.head_dim = embed_dim // num_heads
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **kw))
            if bias:
                self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **kw))
            else:
                self.register_parameter("in_proj_bias", None)
            self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
            self._reset_parameters()

        def _reset_parameters(self):
            nn.init.xavier_uniform_(self.in_proj_weight)
            if self.in_proj_bias is not None:
                nn.init.constant_(self.in_proj_bias, 0.0)
                nn.init.constant_(self.out_proj.bias, 0.0)

        def forward(self, *args, **kwargs):
            raise RuntimeError("fastgrad: the encoder layer's self_attn holds its parameters; call the layer")

        def extra_repr(self):
            return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"

    class TransformerEncoderLayer(nn.Module):
        """Drop-in for torch.nn.TransformerEncoderLayer: the same parameters (self_attn.in_proj_weight,
        self_attn.in_proj_bias, self_attn.out_proj, linear1, linear2, norm1, norm2), shapes,
        initialization and state_dict; forward(src, src_mask=None, src_key_padding_mask=None,
        is_causal=False) runs the whole layer as one library call each way. Dropout p applies where
        torch's does: the attention probabilities, both residual branches, the FFN's hidden layer.

        Masks: a causal src_mask (bool True / float -inf above the diagonal) or is_causal; a key
        padding mask that pads the end of each sequence (it becomes lengths; checking it reads it on
        the host: pass lengths= [B] instead to skip that). Other masks are refused with a ValueError.
        save: 'all' keeps everything the backward reads, 'less' recomputes the FFN's
        pre-activation, 'min' the norms' outputs and the FFN hidden too (the least memory: a
        training step then holds the cache and one workspace; one more FFN-up product)."""

        def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                     layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True, device=None, dtype=None,
                     save="all"):
            super().__init__()
            kw = {"device": device, "dtype": dtype}
            self.self_attn = _SelfAttention(d_model, nhead, dropout, bias, batch_first, **kw)
            self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **kw)
            self.dropout = nn.Dropout(dropout)
            self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **kw)
            self.norm_first = norm_first
            self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
            self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
            self.dropout1 = nn.Dropout(dropout)
            self.dropout2 = nn.Dropout(dropout)
            self.activation = activation
            self.activation_name = _act_name(activation)
            self.batch_first = batch_first
            if save not in _lib.ENCODER_SAVE:
                raise ValueError(f"fastgrad: save must be one of {sorted(_lib.ENCODER_SAVE)}, not {save!r}")
            self.save = save

        def _cfg(self, causal):
            """encoder_desc's arguments."""
            a = self.self_attn
            if self.norm1.eps != self.norm2.eps:
                raise ValueError("fastgrad: norm1 and norm2 must have the same eps")
            return dict(d_model=a.embed_dim, heads=a.num_heads, d_ff=self.linear1.out_features,
                        activation=self.activation_name, norm="pre_layer" if self.norm_first else "post_layer",
                        norm_eps=self.norm1.eps, causal=causal, dropout=self.dropout1.p,
                        dropout_ffn=self.dropout.p, dropout_attn=a.dropout, save=self.save)

        def _desc(self, causal):
            return encoder_desc(**self._cfg(causal))

        def _weights(self):
            a = self.self_attn
            return {"w_qkv": a.in_proj_weight, "b_qkv": a.in_proj_bias, "w_o": a.out_proj.weight,
                    "b_o": a.out_proj.bias, "w_1": self.linear1.weight, "b_1": self.linear1.bias,
                    "w_2": self.linear2.weight, "b_2": self.linear2.bias, "norm1_w": self.norm1.weight,
                    "norm1_b": self.norm1.bias, "norm2_w": self.norm2.weight, "norm2_b": self.norm2.bias}

        def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False, lengths=None):
            if self.dropout1.p != self.dropout2.p:
                raise ValueError("fastgrad: dropout1 and dropout2 must have the same p (one rate for both "
                                 "residual branches)")
            unbatched = src.dim() == 2
            x = src.unsqueeze(0) if unbatched else (src if self.batch_first else src.transpose(0, 1))
            if x.dim() != 3 or x.shape[-1] != self.self_attn.embed_dim:
                raise ValueError(f"fastgrad: TransformerEncoderLayer({self.self_attn.embed_dim}) takes [B, L, "
                                 f"{self.self_attn.embed_dim}] (batch_first) or [L, B, d], got {tuple(src.shape)}")
            b, l = x.shape[0], x.shape[1]
            causal = _causal(src_mask, l, is_causal)
            if lengths is None:
                pad = src_key_padding_mask
                if pad is not None and unbatched:
                    pad = pad.unsqueeze(0)
                lengths = _lengths(pad, b, l)
            y = _apply_layer(x, None, self._cfg(causal), self._weights(), {}, lengths, False, self.training)
            return y[0] if unbatched else (y if self.batch_first else y.transpose(0, 1))

        def extra_repr(self):
            return (f"activation={self.activation_name}, norm_first={self.norm_first}, "
                    f"batch_first={self.batch_first}, save={self.save!r}")

    # ------------------------------------------------------------------ PatchTST's TSTEncoder

    class _Transpose(nn.Module):
        def __init__(self, *dims):
            super().__init__()
            self.dims = dims

        def forward(self, x):
            return x.transpose(*self.dims)

    class _ScaledDotProductAttention(nn.Module):
        """The reference's _ScaledDotProductAttention's state: the scale (a parameter that does not
        learn), the attention dropout."""

        def __init__(self, d_model, n_heads, attn_dropout=0.0, res_attention=False, device=None, dtype=None):
            super().__init__()
            self.attn_dropout = nn.Dropout(attn_dropout)
            self.res_attention = res_attention
            self.scale = nn.Parameter(torch.tensor((d_model // n_heads) ** -0.5, device=device, dtype=dtype),
                                      requires_grad=False)
            self.lsa = False

    class _MultiheadAttention(nn.Module):
        """The reference's _MultiheadAttention's parameters: W_Q, W_K, W_V, to_out = (Linear, Dropout)."""

        def __init__(self, d_model, n_heads, attn_dropout=0.0, proj_dropout=0.0, res_attention=False, device=None,
                     dtype=None):
            super().__init__()
            kw = {"device": device, "dtype": dtype}
            self.n_heads, self.d_k, self.d_v = n_heads, d_model // n_heads, d_model // n_heads
            self.W_Q = nn.Linear(d_model, d_model, bias=True, **kw)
            self.W_K = nn.Linear(d_model, d_model, bias=True, **kw)
            self.W_V = nn.Linear(d_model, d_model, bias=True, **kw)
            self.res_attention = res_attention
            self.sdp_attn = _ScaledDotProductAttention(d_model, n_heads, attn_dropout, res_attention, **kw)
            self.to_out = nn.Sequential(nn.Linear(d_model, d_model, **kw), nn.Dropout(proj_dropout))

    def _norm_block(norm, d_model, kw):
        if "batch" in norm.lower():
            return nn.Sequential(_Transpose(1, 2), nn.BatchNorm1d(d_model, **kw), _Transpose(1, 2))
        return nn.LayerNorm(d_model, **kw)

    class PatchTSTEncoderLayer(nn.Module):
        """The reference PatchTST backbone's TSTEncoderLayer (post-norm; BatchNorm over every token or
        LayerNorm; residual attention) with its parameter names, as one library call each way.
        forward(src, prev=None, key_padding_mask=None, attn_mask=None) → (out, scores) with
        res_attention, else out.

        Dropout: the attention probabilities drop with attn_dropout, the FFN's hidden layer and its
        residual branch with dropout; the attention branch, as the reference's, passes to_out's
        dropout and dropout_attn in a row (the descriptor's dropout_proj and dropout: one mask of
        rate 1 − (1 − p)²)."""

        def __init__(self, d_model, n_heads, d_ff=256, norm="BatchNorm", attn_dropout=0.0, dropout=0.0, bias=True,
                     activation="gelu", res_attention=False, pre_norm=False, store_attn=False, save="all",
                     device=None, dtype=None):
            super().__init__()
            if d_model % n_heads:
                raise ValueError(f"fastgrad: d_model ({d_model}) must be divisible by n_heads ({n_heads})")
            if pre_norm:
                raise ValueError("fastgrad: PatchTSTEncoderLayer(pre_norm=True) is not supported (the reference's "
                                 "pre-norm adds the residual to the normalized input; the library's pre-norm is "
                                 "the standard one)")
            if store_attn:
                raise ValueError("fastgrad: store_attn is not supported (the attention weights are never formed)")
            kw = {"device": device, "dtype": dtype}
            self.res_attention = res_attention
            self.self_attn = _MultiheadAttention(d_model, n_heads, attn_dropout, dropout, res_attention, **kw)
            self.dropout_attn = nn.Dropout(dropout)
            self.norm_attn = _norm_block(norm, d_model, kw)
            self.ff = nn.Sequential(nn.Linear(d_model, d_ff, bias=bias, **kw),
                                    _activation_module(activation),
                                    nn.Dropout(dropout), nn.Linear(d_ff, d_model, bias=bias, **kw))
            self.dropout_ffn = nn.Dropout(dropout)
            self.norm_ffn = _norm_block(norm, d_model, kw)
            self.batch = "batch" in norm.lower()
            self.pre_norm, self.store_attn, self.save = False, False, save
            self._scale_key, self._scale = None, None

        def _bns(self):
            return (self.norm_attn[1], self.norm_ffn[1]) if self.batch else None

        def _scale_value(self):
            """The scale parameter's value, read on the host only when it changed (load_state_dict)."""
            t = self.self_attn.sdp_attn.scale
            key = (t.data_ptr(), t._version)
            if key != self._scale_key:
                self._scale, self._scale_key = float(t), key
            return self._scale

        def _cfg(self, causal, read_scale=True):
            """encoder_desc's arguments (read_scale False: attn_scale None, the scale parameter
            passed to the op instead)."""
            a = self.self_attn
            act = _act_name(self.ff[1])
            if self.batch:
                bn1, bn2 = self._bns()
                if bn1.momentum is None or bn2.momentum is None:
                    raise ValueError("fastgrad: BatchNorm1d(momentum=None) (a cumulative average) is not supported")
                if not (bn1.track_running_stats and bn2.track_running_stats):
                    raise ValueError("fastgrad: the BatchNorm layers must track running statistics")
                if (bn1.eps, bn1.momentum) != (bn2.eps, bn2.momentum):
                    raise ValueError("fastgrad: norm_attn and norm_ffn must have the same eps and momentum")
                norm, eps, momentum = "post_batch", bn1.eps, bn1.momentum
            else:
                if self.norm_attn.eps != self.norm_ffn.eps:
                    raise ValueError("fastgrad: norm_attn and norm_ffn must have the same eps")
                norm, eps, momentum = "post_layer", self.norm_attn.eps, 0.1
            if self.dropout_attn.p != self.dropout_ffn.p:
                raise ValueError("fastgrad: dropout_attn and dropout_ffn must have the same p (one rate for both "
                                 "residual branches)")
            return dict(d_model=a.W_Q.in_features, heads=a.n_heads, d_ff=self.ff[0].out_features, activation=act,
                        norm=norm, norm_eps=eps, bn_momentum=momentum,
                        attn_scale=self._scale_value() if read_scale else None, causal=causal,
                        residual_scores=self.res_attention, dropout=self.dropout_attn.p, dropout_ffn=self.ff[2].p,
                        dropout_attn=a.sdp_attn.attn_dropout.p, save=self.save, dropout_proj=a.to_out[1].p)

        def _desc(self, causal):
            return encoder_desc(**self._cfg(causal))

        def _weights(self):
            a = self.self_attn
            n1 = self.norm_attn[1] if self.batch else self.norm_attn
            n2 = self.norm_ffn[1] if self.batch else self.norm_ffn
            return {"w_q": a.W_Q.weight, "b_q": a.W_Q.bias, "w_k": a.W_K.weight, "b_k": a.W_K.bias,
                    "w_v": a.W_V.weight, "b_v": a.W_V.bias, "w_o": a.to_out[0].weight, "b_o": a.to_out[0].bias,
                    "w_1": self.ff[0].weight, "b_1": self.ff[0].bias, "w_2": self.ff[3].weight,
                    "b_2": self.ff[3].bias, "norm1_w": n1.weight, "norm1_b": n1.bias, "norm2_w": n2.weight,
                    "norm2_b": n2.bias}

        def _bn_buffers(self):
            if not self.batch:
                return {}
            bn1, bn2 = self._bns()
            return {"running_mean1": bn1.running_mean, "running_var1": bn1.running_var,
                    "running_mean2": bn2.running_mean, "running_var2": bn2.running_var}

        def _run(self, src, prev, lengths, causal, want_scores, seeds=None):
            if src.dim() != 3:
                raise ValueError(f"fastgrad: the PatchTST encoder takes [bs·nvars, q_len, d_model], got "
                                 f"{tuple(src.shape)}")
            if prev is not None and not self.res_attention:
                raise ValueError("fastgrad: prev scores given to a layer without res_attention")
            if routed():  # the scale parameter's value is read inside the op (no host read while tracing)
                cfg, scale = self._cfg(causal, read_scale=False), self.self_attn.sdp_attn.scale.detach()
            else:
                cfg, scale = self._cfg(causal), None
            out = _apply_layer(src, prev, cfg, self._weights(), self._bn_buffers(), lengths,
                               want_scores and self.res_attention, self.training, seeds=seeds, scale=scale)
            if self.training and self.batch:
                for bn in self._bns():
                    bn.num_batches_tracked.add_(1)
            return out

        def forward(self, src, prev=None, key_padding_mask=None, attn_mask=None):
            lengths = _lengths(key_padding_mask, src.shape[0], src.shape[1])
            causal = _causal(attn_mask, src.shape[1], False)
            return self._run(src, prev, lengths, causal, True)

    def _activation_module(activation):
        """The reference's get_activation_fn: 'relu' / 'gelu' (any case) or a module class."""
        if callable(activation) and not isinstance(activation, str):
            return activation()
        a = activation.lower()
        if a == "relu":
            return nn.ReLU()
        if a == "gelu":
            return nn.GELU()
        raise ValueError(f'{activation} is not available. You can use "relu", "gelu", or a callable')

    class PatchTSTEncoder(nn.Module):
        """The reference PatchTST backbone's TSTEncoder (yuqinie98/PatchTST, PatchTST_backbone.py): n_layers
        PatchTSTEncoderLayers, the pre-softmax scores of each carried to the next when res_attention.
        Same state_dict keys (layers.{i}.self_attn.W_Q / W_K / W_V / to_out.0, .sdp_attn.scale,
        norm_attn.1 / norm_ffn.1 BatchNorm1d with their running statistics, ff.0 / ff.3). forward(src,
        key_padding_mask=None, attn_mask=None) on src [bs·nvars, q_len, d_model]. BatchNorm's running
        statistics are updated by the library in training; num_batches_tracked here. q_len is unused
        (any length runs); d_k / d_v must be d_model / n_heads."""

        def __init__(self, n_layers=3, d_model=128, n_heads=16, d_ff=256, dropout=0.2, attn_dropout=0.0,
                     activation="gelu", res_attention=True, norm="BatchNorm", q_len=None, d_k=None, d_v=None,
                     pre_norm=False, store_attn=False, save="all", device=None, dtype=None):
            super().__init__()
            hd = d_model // n_heads if n_heads else 0
            if (d_k is not None and d_k != hd) or (d_v is not None and d_v != hd):
                raise ValueError(f"fastgrad: d_k and d_v must be d_model / n_heads = {hd}")
            self.layers = nn.ModuleList([
                PatchTSTEncoderLayer(d_model, n_heads, d_ff, norm, attn_dropout, dropout, True, activation,
                                     res_attention, pre_norm, store_attn, save, device, dtype)
                for _ in range(n_layers)])
            self.res_attention = res_attention

        def _seeds(self, causal):
            """One draw for the whole encoder when training with dropout: layer i drops with (seed,
            offset + i) on every path (the stack, the layers one by one, the custom ops)."""
            if not self.training:
                return None
            cfg = self.layers[0]._cfg(causal, read_scale=False)
            if not any(cfg.get(k, 0) > 0 for k in ("dropout", "dropout_ffn", "dropout_attn", "dropout_proj")):
                return None
            return draw_encoder_seed()

        def _stack(self, src, lengths, causal, seeds):
            """The layers as one library call each way (EncoderStackFunction), or None where the
            layer-by-layer path runs: torch.compile's tracing (the custom ops), no residual scores
            or one layer (nothing to carry), layers whose descriptors differ (a scale of their own),
            CUDA sizes beyond the short attention (L > 64 or d_model / n_heads > 8), and an
            evaluation that wants gradients (the layers' own refusal or rate-0 training forward)."""
            if not _use_stack or routed() or not self.res_attention or len(self.layers) < 2 or src.dim() != 3:
                return None
            cfgs = [layer._cfg(causal) for layer in self.layers]
            cfg = cfgs[0]
            if any(c != cfg for c in cfgs[1:]):
                return None
            if src.is_cuda and (src.shape[1] > 64 or cfg["d_model"] // cfg["heads"] > 8):
                return None
            weights = [layer._weights() for layer in self.layers]
            names = tuple(k for k, v in weights[0].items() if v is not None)
            if any(tuple(k for k, v in w.items() if v is not None) != names for w in weights[1:]):
                return None
            ws = tuple(_as(w[k], src.dtype) for w in weights for k in names)
            wants_grad = torch.is_grad_enabled() and (src.requires_grad or any(w.requires_grad for w in ws))
            training = self.training
            if wants_grad and not training:
                return None
            any_p = any(cfg.get(k, 0) > 0 for k in ("dropout", "dropout_ffn", "dropout_attn", "dropout_proj"))
            if not training:
                cfg = dict(cfg, dropout=0.0, dropout_ffn=0.0, dropout_attn=0.0, dropout_proj=0.0)
            seed, offset = (int(seeds[0]), int(seeds[1])) if training and any_p else (0, 0)
            bufs = [{k: v for k, v in layer._bn_buffers().items() if v is not None} for layer in self.layers]
            call = _StackCall(encoder_desc(**cfg), training, seed, offset, names, bufs, lengths)
            x = src if src.is_contiguous() else src.contiguous()
            if wants_grad:
                y = EncoderStackFunction.apply(x, call, *ws)
            else:
                y, _ = encoder_forward(call.desc, x, call.params(ws), lengths, training, seed, offset)
            if training:
                for layer in self.layers:
                    for bn in layer._bns() or ():
                        bn.num_batches_tracked.add_(1)
            return y

        def forward(self, src, key_padding_mask=None, attn_mask=None, lengths=None):
            if lengths is None:
                lengths = _lengths(key_padding_mask, src.shape[0], src.shape[1])
            causal = _causal(attn_mask, src.shape[1], False)
            seeds = self._seeds(causal)
            y = self._stack(src, lengths, causal, seeds)
            if y is not None:
                return y
            out, scores = src, None
            last = len(self.layers) - 1
            for i, layer in enumerate(self.layers):
                s = None if seeds is None else seeds + torch.tensor([0, i], dtype=seeds.dtype)
                r = layer._run(out, scores, lengths, causal, i < last, s)
                out, scores = r if isinstance(r, tuple) else (r, None)
            return out

    __all__ += ["use_stack", "EncoderLayerFunction", "EncoderStackFunction", "TransformerEncoderLayer", "PatchTSTEncoderLayer",
                "PatchTSTEncoder"]

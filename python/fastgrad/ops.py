"""The functional API: fastgrad ops on numpy arrays (CPU) and torch tensors (CPU or
CUDA, enqueued on the current CUDA stream), with any strides the C op accepts.

Each call describes its arrays to the C library without copying, picks a cached plan
for those shapes, strides and dtypes and for the alignment its pointers have (a view
that starts mid-allocation declares less and gets a plan whose kernels take it),
allocates the plan's workspace from the caller's own allocator (numpy, or torch's
caching allocator so torch sees the memory), and runs. Outputs are allocated when `out`
is None. Errors raise FastgradError with the C status and message. Operands are passed
by the names the library's op table gives them (_lib.OPERANDS), which also fixes their
order.
"""
import ctypes

import numpy as np

from . import _lib
from ._lib import FastgradError

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - CI has no torch
    torch = None

_allow_tf32 = False


_tf32_hooks = []  # called with the plan flags on every change (the torch extension's kernels)


def set_allow_tf32(allow):
    """Lets f32 products round their inputs to tf32 on tensor cores (off by default)."""
    global _allow_tf32
    _allow_tf32 = bool(allow)
    if FAST is not None:
        FAST.set_tf32(_lib.PLAN_ALLOW_TF32 if _allow_tf32 else 0)
    for hook in _tf32_hooks:
        hook(_lib.PLAN_ALLOW_TF32 if _allow_tf32 else 0)


def on_tf32_change(hook):
    """hook(flags) now and after every set_allow_tf32."""
    _tf32_hooks.append(hook)
    hook(_lib.PLAN_ALLOW_TF32 if _allow_tf32 else 0)


_NP_DTYPES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16, np.dtype(np.float64): _lib.F64,
              np.dtype(np.int32): _lib.I32, np.dtype(np.int64): _lib.I64}
if torch is not None:
    _TORCH_DTYPES = {torch.float32: _lib.F32, torch.float16: _lib.F16, torch.bfloat16: _lib.BF16,
                     torch.float64: _lib.F64, torch.int32: _lib.I32, torch.int64: _lib.I64}


class _NoTensor:  # stands in for torch.Tensor without torch: no array is an instance of it
    pass


_Tensor = torch.Tensor if torch is not None else _NoTensor


def _is_torch(a):
    return isinstance(a, _Tensor)


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
        raise TypeError(f"fastgrad: {name} has dtype {a.dtype}; fastgrad takes float32, float16, bfloat16, float64 "
                        "(and int32 / int64 class targets)")
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


_MAX_PLANS = 512  # per context; a cache that outgrows this starts again


def _alignment(pointers):
    """The alignment class of a call's pointers: the largest power of two, at most 256,
    dividing every non-NULL one (what fg_plan_desc.alignment promises the plan)."""
    bits = 256
    for p in pointers:
        if p:
            bits |= p
    return bits & -bits


def _op(op):
    info = _lib.OPS.get(op)
    if info is None:
        raise ValueError(f"fastgrad: {op!r} is not an op of this library; ops: {', '.join(_lib.OPS)}")
    return info


class _Entry:
    """A cached plan with its descriptor array; a call only writes the data pointers. It
    owns a copy of the options struct its descriptor points at, for as long as the plan."""

    def __init__(self, ctx, info, operands, accumulate, flags, options, alignment):
        names = _lib.OPERANDS[info.name]
        descs = [_describe(a, n) for a, n in zip(operands, names)]
        desc = _lib.PlanDesc(op=info.id, accumulate=int(bool(accumulate)), flags=flags, alignment=alignment)
        self.options = options.copy() if options is not None else None
        if self.options is not None:
            desc.options = ctypes.addressof(self.options)
            desc.options_size = ctypes.sizeof(self.options)
        for i, t in enumerate(descs):
            desc.operands[i] = t
        self.plan = _lib.Plan(ctx, desc, self.options)
        self.array = (_lib.Tensor * _lib.MAX_OPERANDS)(*descs)


def _ordered(info, operands):
    """operands (a dict by the library's operand names, absent ones None or left out, or a
    sequence in the library's order) as a list in the library's order."""
    names = _lib.OPERANDS[info.name]
    if isinstance(operands, dict):
        unknown = [n for n in operands if n not in names]
        if unknown:
            raise ValueError(f"fastgrad: {info.name} has no operand {unknown[0]!r}; its operands are "
                             f"{', '.join(names)}")
        return [operands.get(n) for n in names]
    operands = list(operands)
    if len(operands) != len(names):
        raise ValueError(f"fastgrad: {info.name} takes {len(names)} operands ({', '.join(names)}), "
                         f"got {len(operands)}")
    return operands


def _cuda_stream(device):
    """The current CUDA stream of device (an index) as an int: what the context is set to."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) if torch is not None else None


def _workspace(ref, nbytes):
    """(owner, pointer) of nbytes of scratch from ref's allocator: torch's caching allocator on
    ref's device, or a numpy buffer aligned to 256 bytes."""
    if _is_torch(ref):
        ws = torch.empty(nbytes, dtype=torch.uint8, device=ref.device)
        return ws, ws.data_ptr()
    ws = np.empty(nbytes + 256, dtype=np.uint8)
    return ws, (ws.ctypes.data + 255) & ~255


def _run_py(op, operands, accumulate=False, options=None, flags=0, fast_key=None):
    """Runs op (a name of _lib.OPS) on operands: a dict by the operand names fg_op_describe
    gives (_lib.OPERANDS[op]), or a list in that order; None or left out = absent. options
    is the op's options struct (_lib.ElementwiseOptions, LinearActOptions or LogpOptions, as
    fg_op_describe names it) or None for the defaults; flags adds _lib.PLAN_* flags (tf32
    follows set_allow_tf32). Returns the plan.

    This is run() in Python; the compiled run (_fastcall.c) calls it for what it leaves to
    Python, and with fast_key (its key for these operands) when the plan is not in its cache
    yet: the plan is then entered there."""
    info = _op(op)
    operands = _ordered(info, operands)
    if options is not None:
        want = _lib.OPTIONS.get(info.options_type)
        if want is None or not isinstance(options, want):
            raise TypeError(f"fastgrad: {op} takes {info.options_type or 'no options'}, "
                            f"not {type(options).__name__}")
    ref = next(a for a in operands if a is not None)
    backend, device, tdev = _placement(ref)
    ctx = _lib.context(backend, device)
    if tdev is not None and backend == _lib.BACKEND_CUDA:
        ctx.set_stream(_cuda_stream(device))
    flags = flags | (_lib.PLAN_ALLOW_TF32 if _allow_tf32 else 0)
    # the plan's key and the data pointers in one walk (the per-call host cost: docs/perf-notes.md 19):
    # each operand adds (dtype, shape, strides), an absent one None — unambiguous, as neither is None
    key = [op, bool(accumulate), flags, options.key() if options is not None else None]
    pointers = []
    for a in operands:
        if a is None:
            pointers.append(None)
            key.append(None)
        elif isinstance(a, _Tensor):
            pointers.append(a.data_ptr())
            key += (a.dtype, a.shape, a.stride())
        else:
            pointers.append(a.ctypes.data)
            key += (a.dtype, a.shape, a.strides)
    align = _alignment(pointers)
    key.append(align)
    key = tuple(key)
    entry = ctx.plans.get(key)
    if entry is None:
        if len(ctx.plans) >= _MAX_PLANS:
            ctx.clear_plans()
        entry = ctx.plans[key] = _Entry(ctx, info, operands, accumulate, flags, options, align)
    for i, p in enumerate(pointers):
        entry.array[i].data = p
    plan = entry.plan
    if fast_key is not None:
        ctx.fast[fast_key] = (plan.handle.value, plan.workspace_bytes, plan)
    ws, ws_ptr = None, 0
    if plan.workspace_bytes:
        ws, ws_ptr = _workspace(ref, plan.workspace_bytes)
    plan.run(entry.array, ws_ptr, plan.workspace_bytes)
    return plan


def _context_pair(backend, device):
    """(context, its fast cache) of the calling thread: what _fastcall keeps per thread."""
    ctx = _lib.context(backend, device)
    return ctx, ctx.fast


def _configure_fastcall(module):
    """Hands _fastcall what it reads; (run, None), or (None, why) when it refuses this library."""
    ops = {name: (info.id, _lib.OPERANDS[name], _lib.OPTIONS.get(info.options_type)) for name, info in _lib.OPS.items()}
    address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    try:
        module.configure(address(_lib.lib.fg_plan_run), address(_lib.lib.fg_last_error), ops, np.ndarray,
                         torch.Tensor if torch is not None else None,
                         dict(_TORCH_DTYPES) if torch is not None else {}, _context_pair, _cuda_stream, _workspace,
                         _run_py, FastgradError,
                         (_lib.abi_layout("fg_tensor"), _lib.MAX_RANK, _lib.MAX_OPERANDS))
    except (TypeError, ValueError) as e:
        return None, str(e)
    return module.run, None


# run(op, operands, accumulate=False, options=None, flags=0): the compiled path when
# fastgrad._fastcall is built and loads (FAST is the module then; FAST_WHY_NOT says why not),
# else _run_py. Both give the same results and raise the same errors.
FAST, FAST_WHY_NOT = _lib.fastcall_module(), _lib.FASTCALL_WHY_NOT
run = _run_py
if FAST is not None:
    _fast_run, FAST_WHY_NOT = _configure_fastcall(FAST)
    if _fast_run is None:
        FAST = None
    else:
        run = _fast_run


def plan_info(op, operands, names=None, accumulate=False, options=None):
    """What runs for these operands (it runs them): kernel name, arch, precision, the
    declared alignment, as a dict. names, if given, must be the library's operand names."""
    if names is not None and tuple(names) != _lib.OPERANDS[_op(op).name]:
        raise ValueError(f"fastgrad: {op}'s operands are {', '.join(_lib.OPERANDS[op])}, not {', '.join(names)}")
    p = run(op, operands, accumulate, options)
    i = p.info
    return {"op": i.op_name.decode(), "kernel": i.kernel.decode(), "arch": i.arch,
            "backend": "cuda" if i.backend == _lib.BACKEND_CUDA else "cpu",
            "math": i.precision.math, "accumulator": i.precision.accumulator, "tf32": bool(i.precision.tf32),
            "deterministic": bool(i.precision.deterministic), "workspace_bytes": i.workspace_bytes,
            "alignment": p.alignment}


def _device_context(device, stream=False):
    """This thread's context for `device`: None or a CPU device the CPU context, else the CUDA
    device's (a torch.device or an index); stream: set to torch's current stream there."""
    if device is None or (torch is not None and isinstance(device, torch.device) and device.type == "cpu"):
        return _lib.context(_lib.BACKEND_CPU, 0)
    index = (device.index if isinstance(device, torch.device) else int(device)) or 0
    ctx = _lib.context(_lib.BACKEND_CUDA, index)
    if stream:
        ctx.set_stream(_cuda_stream(index))
    return ctx


def last_kernels(device=None):
    """The kernels the last op on this thread's context for `device` (None or a CPU device:
    the CPU context) launched, in order, as fg_context_last_kernels names them."""
    return _device_context(device).last_kernels()


def workspace_bytes(device=None):
    """The bytes of workspace this thread's context for `device` (None or a CPU device: the CPU
    context) holds now: its own, grown by the composed ops (the encoder layer's parts) and kept
    between calls. On CUDA it is allocated outside torch's caching allocator, so a peak taken
    from torch.cuda.max_memory_allocated() leaves it out: add it."""
    return _device_context(device).workspace_bytes()


def release_workspace(device=None):
    """Frees the workspace this thread's context for `device` holds (stream-ordered on torch's
    current stream; it grows again on demand)."""
    _device_context(device, stream=True).release_workspace()


# ------------------------------------------------------------------ Linear

def linear_forward(x, w, b=None, out=None):
    """y = x·wᵀ (+ b); x [..., K], w [M, K], b [M]."""
    if out is None:
        out = _empty_like_family(x, tuple(x.shape[:-1]) + (w.shape[0],))
    run("linear_forward", dict(x=x, w=w, b=b, y=out))
    return out


def linear_backward_input(dy, w, out=None, accumulate=False):
    """dx = dy·w."""
    if out is None:
        out = _empty_like_family(dy, tuple(dy.shape[:-1]) + (w.shape[1],))
    run("linear_backward_input", dict(dy=dy, w=w, dx=out), accumulate)
    return out


def linear_backward_weight(dy, x, out=None, accumulate=False):
    """dw = dyᵀ·x over all leading dims."""
    if out is None:
        out = _empty_like_family(dy, (dy.shape[-1], x.shape[-1]))
    run("linear_backward_weight", dict(dy=dy, x=x, dw=out), accumulate)
    return out


def linear_backward_bias(dy, out=None, accumulate=False):
    """db = Σ dy over all leading dims."""
    if out is None:
        out = _empty_like_family(dy, (dy.shape[-1],))
    run("linear_backward_bias", dict(dy=dy, db=out), accumulate)
    return out


# ------------------------------------------------------------------ Matmul

def matmul_forward(a, b, out=None):
    """c = a·b; a [(B,)M,K], b [(B,)K,N]; a 2-D operand is broadcast."""
    if out is None:
        batch = (a.shape[0],) if a.ndim == 3 else (b.shape[0],) if b.ndim == 3 else ()
        out = _empty_like_family(a, batch + (a.shape[-2], b.shape[-1]))
    run("matmul_forward", dict(a=a, b=b, c=out))
    return out


def matmul_backward_input(dc, b, batched=None, out=None, accumulate=False):
    """da = dc·bᵀ; 2-D (summed over the batch) unless `batched` (default: dc is 3-D)."""
    if out is None:
        batched = dc.ndim == 3 if batched is None else batched
        out = _empty_like_family(dc, ((dc.shape[0],) if batched else ()) + (dc.shape[-2], b.shape[-2]))
    run("matmul_backward_input", dict(dc=dc, b=b, da=out), accumulate)
    return out


def matmul_backward_other(a, dc, batched=None, out=None, accumulate=False):
    """db = aᵀ·dc; 2-D (summed over the batch) unless `batched` (default: dc is 3-D)."""
    if out is None:
        batched = dc.ndim == 3 if batched is None else batched
        out = _empty_like_family(dc, ((dc.shape[0],) if batched else ()) + (a.shape[-1], dc.shape[-1]))
    run("matmul_backward_other", dict(a=a, dc=dc, db=out), accumulate)
    return out


# ------------------------------------------------------------------ Outer

def outer_forward(x, y, out=None):
    """z = x ⊗ y."""
    if out is None:
        out = _empty_like_family(x, (x.shape[0], y.shape[0]))
    run("outer_forward", dict(x=x, y=y, z=out))
    return out


def outer_backward_input(dz, y, out=None, accumulate=False):
    """dx = dz·y."""
    if out is None:
        out = _empty_like_family(dz, (dz.shape[0],))
    run("outer_backward_input", dict(dz=dz, y=y, dx=out), accumulate)
    return out


def outer_backward_other(dz, x, out=None, accumulate=False):
    """dy = dzᵀ·x."""
    if out is None:
        out = _empty_like_family(dz, (dz.shape[1],))
    run("outer_backward_other", dict(dz=dz, x=x, dy=out), accumulate)
    return out


# ------------------------------------------------------------------ Elementwise family

def _elementwise(table, kind, scalars):
    """The fg_elementwise_options of `kind` (a name of table: _lib.UNARY or _lib.BINARY)."""
    if kind not in table:
        raise ValueError(f"fastgrad: kind must be one of {sorted(table)}, not {kind!r}")
    scalars = tuple(float(v) for v in scalars)
    if len(scalars) > 4:
        raise ValueError(f"fastgrad: {kind} takes at most 4 scalars, got {len(scalars)}")
    return _lib.ElementwiseOptions(kind=table[kind], scalars=scalars + (0.0,) * (4 - len(scalars)))


def _broadcast_shape(*arrays):
    shapes = [tuple(a.shape) for a in arrays if a is not None]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise FastgradError(_lib.ERR_SHAPE, "shapes " + ", ".join(map(str, shapes)) + " do not broadcast") from None


def unary_forward(kind, x, scalars, out=None):
    """y = op(x; scalars) for kind in scale, pow, leaky_relu, elu, clamp, softcap."""
    opt = _elementwise(_lib.UNARY, kind, scalars)
    if out is None:
        out = _empty_like_family(x, tuple(x.shape))
    run("unary_forward", dict(x=x, y=out), options=opt)
    return out


def unary_backward(kind, dy, x, scalars, out=None, accumulate=False):
    """dx = dy · op'(x), summed over dims where x was broadcast."""
    opt = _elementwise(_lib.UNARY, kind, scalars)
    if out is None:
        out = _empty_like_family(dy, tuple(x.shape))
    run("unary_backward", dict(dy=dy, x=x, dx=out), accumulate, options=opt)
    return out


def lerp_forward(a, b, weight, out=None):
    """a + w·(b − a); weight a float or an array broadcastable with a and b."""
    tensor_w = not isinstance(weight, (int, float))
    opt = _elementwise(_lib.BINARY, "lerp", (0.0 if tensor_w else float(weight),))
    if out is None:
        out = _empty_like_family(a, _broadcast_shape(a, b, weight if tensor_w else None))
    run("binary_forward", dict(a=a, b=b, w=weight if tensor_w else None, y=out), options=opt)
    return out


def lerp_backward(dy, a, b, weight, need=(True, True, True), accumulate=False):
    """(da, db, dw) in one pass over dy; None where not needed (dw only for a tensor w).
    a and b are read only for dw."""
    tensor_w = not isinstance(weight, (int, float))
    opt = _elementwise(_lib.BINARY, "lerp", (0.0 if tensor_w else float(weight),))
    want = [need[0], need[1], need[2] and tensor_w]
    shapes = [a.shape, b.shape, weight.shape if tensor_w else None]
    da, db, dw = [_empty_like_family(dy, tuple(s)) if w else None for w, s in zip(want, shapes)]
    run("binary_backward", dict(dy=dy, a=a if want[2] else None, b=b if want[2] else None,
                                w=weight if tensor_w else None, da=da, db=db, dw=dw), accumulate, options=opt)
    return da, db, dw


def axpby_forward(a, b, alpha, beta, out=None):
    """α·a + β·b."""
    opt = _elementwise(_lib.BINARY, "axpby", (alpha, beta))
    if out is None:
        out = _empty_like_family(a, _broadcast_shape(a, b))
    run("binary_forward", dict(a=a, b=b, y=out), options=opt)
    return out


def axpby_backward(dy, a_shape, b_shape, alpha, beta, need=(True, True), accumulate=False):
    """(α·dy, β·dy), each summed to its input's shape."""
    opt = _elementwise(_lib.BINARY, "axpby", (alpha, beta))
    da, db = [_empty_like_family(dy, tuple(s)) if w else None for w, s in zip(need, (a_shape, b_shape))]
    run("binary_backward", dict(dy=dy, da=da, db=db), accumulate, options=opt)
    return da, db


# ------------------------------------------------------------------ Linear + activation

def _act_options(act, slope=False, consume=False):
    """The fg_linear_act_options: the activation, what the forward saves (pre or its slope),
    and whether the backward may form g in the saved operand's memory."""
    if act not in _lib.ACT:
        raise ValueError(f"fastgrad: act must be one of {sorted(_lib.ACT)}, not {act!r}")
    return _lib.LinearActOptions(act=_lib.ACT[act], saved=_lib.ACT_SAVED["slope" if slope else "pre"],
                                 consume=int(bool(consume)))


def linear_act_forward(x, w, b=None, act="gelu_tanh", keep_pre=True, out=None, slope=False):
    """(y, pre or None): y = act(x·wᵀ + b); x [..., K], w [M, K] (or batched weights: x [B, ..., K],
    w [B, M, K], b [M] or [B, M]); pre is the saved
    pre-activation (keep_pre=False: the backward recomputes it; relu needs none, its
    backward takes y as pre). slope=True (the slope form): the saved tensor is act′(pre)
    instead, for linear_act_backward(..., slope=True)."""
    opt = _act_options(act, slope=slope)
    shape = tuple(x.shape[:-1]) + (w.shape[-2],)
    y = out if out is not None else _empty_like_family(x, shape)
    pre = _empty_like_family(x, shape) if keep_pre or slope else None
    run("linear_act_forward", dict(x=x, w=w, b=b, y=y, pre=pre), options=opt)
    return y, pre


def linear_act_backward(dy, x, w, b=None, pre=None, act="gelu_tanh", need=(True, True, True), accumulate=False,
                        out=(None, None, None), consume_pre=False, slope=False):
    """(dx, dw, db) through the activation, g = dy ⊙ act′(pre) formed once; None where not
    needed (db only with a bias unless out supplies one). pre None: recomputed; for relu, y
    may stand in for pre. consume_pre: pre's memory may be overwritten (g is formed there
    instead of in a new N·M buffer). slope=True: pre is the saved slope act′(pre) of the
    slope form (g = dy ⊙ pre)."""
    if slope and pre is None:
        raise ValueError("fastgrad: the slope form's backward needs the saved slope (pre)")
    opt = _act_options(act, slope=slope, consume=consume_pre and pre is not None)
    shapes = [tuple(x.shape), tuple(w.shape), tuple(b.shape) if b is not None else (w.shape[-2],)]
    want = [need[0], need[1], need[2] and (b is not None or out[2] is not None)]
    dx, dw, db = [(o if o is not None else _empty_like_family(dy, s)) if k else None
                  for o, k, s in zip(out, want, shapes)]
    run("linear_act_backward", dict(dy=dy, pre=pre, x=x, w=w, b=b, dx=dx, dw=dw, db=db), accumulate, options=opt)
    return dx, dw, db


# ------------------------------------------------------------------ Linear log-prob / cross-entropy

def logp_options(temperature=1.0, softcap=0.0, ignore_index=None, reduction="mean", label_smoothing=0.0,
                 z_loss=0.0, grad_scale=1.0, max_tile_elements=0, vocab_start=0, vocab_total=0):
    """The fg_logp_options of the log-prob family (see include/fastgrad.h); vocab_start /
    vocab_total place w's rows in a vocabulary split across ranks (0, 0: unsharded)."""
    if reduction not in _lib.REDUCTION:
        raise ValueError(f"fastgrad: reduction must be one of {sorted(_lib.REDUCTION)}, not {reduction!r}")
    return _lib.LogpOptions(temperature=float(temperature), softcap=float(softcap),
                            use_ignore_index=int(ignore_index is not None),
                            ignore_index=int(ignore_index) if ignore_index is not None else 0,
                            reduction=_lib.REDUCTION[reduction], label_smoothing=float(label_smoothing),
                            z_loss=float(z_loss), grad_scale=float(grad_scale),
                            max_tile_elements=int(max_tile_elements), vocab_start=int(vocab_start),
                            vocab_total=int(vocab_total))


def _row_dtype(h):
    if _is_torch(h):
        return torch.float64 if h.dtype == torch.float64 else torch.float32
    return np.float64 if h.dtype == np.float64 else np.float32


def linear_logp_forward(h, w, target, b=None, entropy=False, options=None):
    """(logp, lse, entropy or None) of log_softmax(cap(h·wᵀ + b)/T)[target], never forming
    the [N, V] logits. h [N, D], w [V, D], target [N] int32/int64."""
    rd = _row_dtype(h)
    n = h.shape[0]
    logp, lse = _empty_like_family(h, (n,), rd), _empty_like_family(h, (n,), rd)
    ent = _empty_like_family(h, (n,), rd) if entropy else None
    run("linear_logp_forward", dict(h=h, w=w, b=b, target=target, logp=logp, lse=lse, entropy=ent),
        options=options or logp_options())
    return logp, lse, ent


def linear_logp_shard_forward(h, w, target, b=None, entropy=False, options=None):
    """One rank's parts of a vocabulary-parallel log-prob: (lse_part, tlogit_part, entropy_part
    or None) over w's rows [vocab_start, vocab_start + V_r) of the options (include/fastgrad.h,
    fg_linear_logp_shard_forward)."""
    rd = _row_dtype(h)
    n = h.shape[0]
    lse, tl = _empty_like_family(h, (n,), rd), _empty_like_family(h, (n,), rd)
    ent = _empty_like_family(h, (n,), rd) if entropy else None
    run("linear_logp_shard_forward", dict(h=h, w=w, b=b, target=target, lse_part=lse, tlogit_part=tl,
                                          entropy_part=ent), options=options or logp_options())
    return lse, tl, ent


def linear_logp_shard_combine(target, lse_parts, tlogit_parts, entropy_parts=None, options=None):
    """(logp, lse, entropy or None) from the gathered parts: lse_parts [R, N], tlogit_parts [N]
    (summed) or [R, N], entropy_parts [R, N] or None; shards added in rank order."""
    n = lse_parts.shape[1]
    logp, lse = _empty_like_family(lse_parts, (n,)), _empty_like_family(lse_parts, (n,))
    ent = _empty_like_family(lse_parts, (n,)) if entropy_parts is not None else None
    run("linear_logp_shard_combine", dict(target=target, lse_parts=lse_parts, tlogit_parts=tlogit_parts,
                                          entropy_parts=entropy_parts, logp=logp, lse=lse, entropy=ent),
        options=options or logp_options())
    return logp, lse, ent


def linear_logp_backward(h, w, target, lse, b=None, dlogp=None, dentropy=None, entropy=None, dlse=None,
                         need=(True, True, True), options=None, out=(None, None, None), accumulate=False):
    """(dh, dw, db) of Σ dlogp·logp + dentropy·entropy + dlse·lse; None where not needed
    (db only with a bias). `out` may supply the gradient buffers (f32 allowed)."""
    want = [need[0], need[1], need[2] and b is not None]
    shapes = [h.shape, w.shape, b.shape if b is not None else None]
    outs = [o if o is not None else (_empty_like_family(h, tuple(s)) if k else None)
            for o, k, s in zip(out, want, shapes)]
    outs = [o if k else None for o, k in zip(outs, want)]
    dh, dw, db = outs
    run("linear_logp_backward", dict(dlogp=dlogp, dentropy=dentropy, dlse=dlse, h=h, w=w, b=b, target=target, lse=lse,
                                     entropy=entropy, dh=dh, dw=dw, db=db), accumulate, options=options or logp_options())
    return dh, dw, db


def linear_cross_entropy_onepass(h, w, target, b=None, row_weight=None, need=(True, True, True), options=None,
                         out=(None, None, None), want_lse=False, accumulate=False):
    """One pass: (loss, lse or None, dh, dw, db) — the cross-entropy of the options'
    reduction (label smoothing, z-loss, row weights) and its gradients together."""
    options = options or logp_options()
    rd = _row_dtype(h)
    n = h.shape[0]
    loss = _empty_like_family(h, (n,) if options.reduction == _lib.REDUCTION["none"] else (1,), rd)
    lse = _empty_like_family(h, (n,), rd) if want_lse else None
    want = [need[0], need[1], need[2] and b is not None]
    shapes = [h.shape, w.shape, b.shape if b is not None else None]
    outs = [o if o is not None else (_empty_like_family(h, tuple(s)) if k else None)
            for o, k, s in zip(out, want, shapes)]
    outs = [o if k else None for o, k in zip(outs, want)]
    dh, dw, db = outs
    run("linear_cross_entropy", dict(h=h, w=w, b=b, target=target, row_weight=row_weight, loss=loss, lse=lse, dh=dh,
                                     dw=dw, db=db), accumulate, options=options)
    return loss, lse, dh, dw, db


def context_check(device=None):
    """Waits for the context's stream and raises FastgradError(FG_ERR_DEVICE_VALUE) when a
    kernel found a bad value since the last check (e.g. a target outside [0, V))."""
    _device_context(device, stream=True).check()


# ------------------------------------------------------------------ Attention

def attention_options(causal=False, scale=None, dropout_p=0.0, seed=0, offset=0):
    """The fg_attention_options: scale None means 1/sqrt(hd); dropout on the probabilities with
    the counter-based generator's (seed, offset)."""
    return _lib.AttentionOptions(scale=0.0 if scale is None else float(scale), causal=int(bool(causal)),
                                 dropout_p=float(dropout_p), seed=int(seed) & (2**64 - 1),
                                 offset=int(offset) & (2**64 - 1))


def _heads_like(ref, shape, dtype=None):
    """A [B, H, L, hd] output stored as [B, L, H, hd] (what the projection after attention reads
    without a copy)."""
    b, h, l, d = shape
    out = _empty_like_family(ref, (b, l, h, d), dtype)
    return out.transpose(1, 2) if _is_torch(out) else out.transpose(0, 2, 1, 3)


def attention_forward(q, k, v, lengths=None, scores_in=None, return_scores=False, scores_dtype=None, options=None):
    """(o, lse, scores or None) of multi-head attention (see fg_attention_forward): q, k, v
    [B, H, L, hd] with any strides, lengths [B] int32/int64 key-padding lengths, scores_in
    [B, H, L, L] added to the scaled scores. The scores returned (the pre-softmax s, -inf where
    masked) take scores_in's dtype, else scores_dtype (default q's). o is stored [B, L, H, hd]."""
    b, h, l, d = q.shape
    acc = _row_dtype(q)
    o = _heads_like(q, (b, h, l, d))
    lse = _empty_like_family(q, (b, h, l), acc)
    sdt = scores_in.dtype if scores_in is not None else (scores_dtype or q.dtype)
    scores = _empty_like_family(q, (b, h, l, l), sdt) if return_scores else None
    run("attention_forward", dict(q=q, k=k, v=v, lengths=lengths, scores_in=scores_in, o=o, lse=lse,
                                  scores_out=scores), options=options or attention_options())
    return o, lse, scores


def attention_backward(do, q, k, v, o, lse, lengths=None, scores_in=None, dscores=None, need=(True, True, True, True),
                       options=None, out=(None, None, None, None), accumulate=False):
    """(dq, dk, dv, dscores_in): the gradients of attention_forward's inputs from do (and dscores,
    the gradient its scores received); None where not needed (dscores_in only with scores_in).
    `out` may supply the buffers (then accumulate may add into them)."""
    want = [need[0], need[1], need[2], need[3] and scores_in is not None]
    grads = []
    for i, (w, given) in enumerate(zip(want, out)):
        if not w:
            grads.append(None)
        elif given is not None:
            grads.append(given)
        elif i < 3:
            grads.append(_heads_like(do, tuple(q.shape)))
        else:
            grads.append(_empty_like_family(do, tuple(scores_in.shape), scores_in.dtype))
    dq, dk, dv, ds = grads
    run("attention_backward", dict(do=do, dscores=dscores, q=q, k=k, v=v, lengths=lengths, scores_in=scores_in, o=o,
                                   lse=lse, dq=dq, dk=dk, dv=dv, dscores_in=ds), accumulate,
        options=options or attention_options())
    return dq, dk, dv, ds


# ------------------------------------------------------------------ AdamW

def adamw_describe(name, tensors):
    """The fg_tensor array of one list of adamw_step (for adamw_step_arrays)."""
    return (_lib.Tensor * len(tensors))(*[_describe(t, f"{name}[{i}]") for i, t in enumerate(tensors)])


def adamw_step_arrays(first, n, params, grads, exp_avg, exp_avg_sq, master, *, lr, beta1, beta2, eps, weight_decay,
                      step, grad_scale=1.0):
    """adamw_step on lists already described (adamw_describe; master None or an array): what an
    optimizer that keeps its lists between steps calls, so a step over a model's hundreds of
    tensors does not describe each again. first: a tensor of the lists (its device)."""
    backend, device, tdev = _placement(first)
    ctx = _lib.context(backend, device)
    if tdev is not None and backend == _lib.BACKEND_CUDA:
        ctx.set_stream(_cuda_stream(device))
    hp = _lib.AdamWHparams(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, step=int(step),
                           grad_scale=grad_scale)
    _lib.check(_lib.lib.fg_adamw_step(ctx.handle, hp, n, params, grads, exp_avg, exp_avg_sq, master))


def adamw_step(params, grads, exp_avg, exp_avg_sq, *, lr, beta1, beta2, eps, weight_decay, step, grad_scale=1.0,
               master=None):
    """One fused AdamW step over lists of tensors (all on one device; see fg_adamw_step). The
    moments are f32 or the params' dtype."""
    n = len(params)
    if not (len(grads) == len(exp_avg) == len(exp_avg_sq) == n) or (master is not None and len(master) != n):
        raise ValueError("fastgrad: adamw_step lists must have the same length")
    if n == 0:
        return
    arrays = [None if lst is None else adamw_describe(name, lst)
              for name, lst in (("params", params), ("grads", grads), ("exp_avg", exp_avg),
                                ("exp_avg_sq", exp_avg_sq), ("master", master))]
    adamw_step_arrays(params[0], n, *arrays, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                      step=step, grad_scale=grad_scale)


__all__ = ["FastgradError", "set_allow_tf32", "plan_info", "linear_forward", "linear_backward_input",
           "linear_backward_weight", "linear_backward_bias", "matmul_forward", "matmul_backward_input",
           "matmul_backward_other", "outer_forward", "outer_backward_input", "outer_backward_other",
           "unary_forward", "unary_backward", "lerp_forward", "lerp_backward", "axpby_forward", "axpby_backward",
           "adamw_step", "adamw_describe", "adamw_step_arrays", "logp_options", "linear_logp_forward", "linear_logp_backward",
           "linear_logp_shard_forward", "linear_logp_shard_combine", "linear_cross_entropy_onepass",
           "context_check", "last_kernels", "linear_act_forward", "linear_act_backward", "attention_options",
           "attention_forward", "attention_backward"]

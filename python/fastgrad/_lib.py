"""ctypes bindings to libfastgrad: the library search, the ABI read from the library, the
C structs, and errors.

Nothing here knows about numpy or torch; ops.py turns arrays into fg_tensor
descriptors. The library is found, in order, at $FASTGRAD_LIBRARY, in the repository's
build folders next to this package, beside this file, or by the system loader (ldconfig).

The ABI is not copied from include/fastgrad.h by hand. The values of its constants
(dtypes, activations, status codes, plan flags, ...) come from fg_abi_constant, asked for
by the names listed here; the ops (ids, names, families, operands with their roles and
options structs) come from the library's op table through fg_op_describe. The ctypes
Structures are declared here, and at import every size and field offset is checked
against fg_abi_layout: a struct edited on one side only fails the import with a message
naming the struct and the field.

The compiled per-call module fastgrad._fastcall (python/fastgrad/_fastcall.c, built by
CMake beside the library when Python's headers are found) is looked for beside the library
that was loaded, then beside this file; fastcall_module() gives it, or None and why
(FASTGRAD_NO_EXT=1 turns it off). ops.py decides whether to use it.
"""
import collections
import ctypes
import ctypes.util
import importlib.machinery
import importlib.util
import os
import threading

# ------------------------------------------------------------------ loading


class AbiError(ImportError):
    """The loaded libfastgrad does not match this Python layer (a struct's layout, a missing
    constant or entry point): rebuild the library, or update python/fastgrad with it."""


def _candidates():
    env = os.environ.get("FASTGRAD_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for build in ("build", "build-py", "build-cuda", "build-gpu", "build-cpu", "build-release"):
        yield os.path.join(root, build, "libfastgrad.so")
    yield os.path.join(here, "libfastgrad.so")
    found = ctypes.util.find_library("fastgrad")
    if found:
        yield found


def _load():
    """The first candidate that loads and exports the ABI entries this layer reads (a stale
    build of an older ABI is passed over, unless FASTGRAD_LIBRARY names it)."""
    tried = []
    explicit = bool(os.environ.get("FASTGRAD_LIBRARY"))
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        missing = [f for f in ("fg_abi_constant", "fg_abi_layout", "fg_op_describe", "fg_op_count")
                   if not hasattr(handle, f)]
        if missing:
            if explicit:
                raise AbiError(f"fastgrad: {path} has no {', '.join(missing)}: it predates this Python layer's "
                               "ABI (0.2); rebuild it")
            tried.append(f"{path} (an older ABI without {missing[0]})")
            continue
        return handle
    raise ImportError("fastgrad: libfastgrad.so not found; build it (scripts/test.sh or cmake) or set "
                      "FASTGRAD_LIBRARY. Tried: " + ", ".join(tried))


lib = _load()

_c = ctypes.c_int
lib.fg_status_string.restype = ctypes.c_char_p
lib.fg_status_string.argtypes = [_c]
lib.fg_last_error.restype = ctypes.c_char_p
lib.fg_last_error.argtypes = []
lib.fg_abi_constant.restype = _c
lib.fg_abi_constant.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]
lib.fg_abi_layout.restype = _c
lib.fg_abi_layout.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]


def abi_constant(name):
    """The value of a constant of fastgrad.h ("FG_BF16") in the loaded library; AbiError
    when the library does not know the name."""
    value = ctypes.c_int64()
    if lib.fg_abi_constant(name.encode(), ctypes.byref(value)) != 0:
        raise AbiError(f"fastgrad: the library has no constant {name}: {lib.fg_last_error().decode()}")
    return value.value


def abi_layout(ctype, field=None):
    """sizeof(ctype) (field None) or offsetof(ctype, field) in the loaded library."""
    value = ctypes.c_size_t()
    status = lib.fg_abi_layout(ctype.encode(), field.encode() if field else None, ctypes.byref(value))
    if status != 0:
        raise AbiError(f"fastgrad: the library does not describe {ctype}{'.' + field if field else ''}: "
                       f"{lib.fg_last_error().decode()}")
    return value.value


def _enum(prefix, names):
    """{name: value} for the constants prefix + NAME.upper() of fastgrad.h."""
    return {n: abi_constant(prefix + n.upper()) for n in names}


# ------------------------------------------------------------------ constants (values from the library)

VERSION = abi_constant("FG_VERSION")
MAX_RANK = abi_constant("FG_MAX_RANK")
MAX_OPERANDS = abi_constant("FG_MAX_OPERANDS")

DTYPE = _enum("FG_", ["f32", "f16", "bf16", "f64", "i32", "i64"])
F32, F16, BF16, F64, I32, I64 = (DTYPE[n] for n in ("f32", "f16", "bf16", "f64", "i32", "i64"))
BACKEND = _enum("FG_BACKEND_", ["cpu", "cuda"])
BACKEND_CPU, BACKEND_CUDA = BACKEND["cpu"], BACKEND["cuda"]
PLAN_ALLOW_TF32 = abi_constant("FG_PLAN_ALLOW_TF32")
PLAN_CONSUME_PRE = abi_constant("FG_PLAN_CONSUME_PRE")
PLAN_ACT_SLOPE = abi_constant("FG_PLAN_ACT_SLOPE")
ROLE = _enum("FG_ROLE_", ["input", "output"])

ACT = _enum("FG_ACT_", ["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
ACT_SAVED = _enum("FG_ACT_SAVED_", ["pre", "slope"])
REDUCTION = _enum("FG_REDUCTION_", ["mean", "sum", "none"])
UNARY = _enum("FG_UNARY_", ["scale", "pow", "leaky_relu", "elu", "clamp", "softcap"])
BINARY = _enum("FG_BINARY_", ["lerp", "axpby"])
NORM = _enum("FG_NORM_", ["layer", "rms"])
ENCODER_NORM = _enum("FG_ENCODER_", ["pre_layer", "pre_rms", "post_layer", "post_batch"])
ENCODER_SAVE = _enum("FG_ENCODER_SAVE_", ["all", "less", "min"])

_STATUS_NAMES = ["FG_OK", "FG_ERR_NULL_POINTER", "FG_ERR_INVALID_VALUE", "FG_ERR_SHAPE", "FG_ERR_DTYPE",
                 "FG_ERR_WRONG_DEVICE", "FG_ERR_MISALIGNED", "FG_ERR_WORKSPACE", "FG_ERR_OVERFLOW", "FG_ERR_ALIAS",
                 "FG_ERR_UNSUPPORTED", "FG_ERR_NO_DEVICE", "FG_ERR_OUT_OF_MEMORY", "FG_ERR_BACKEND",
                 "FG_ERR_DEVICE_VALUE", "FG_ERR_INTERNAL"]
STATUS_CODE = {n: abi_constant(n) for n in _STATUS_NAMES}   # "FG_ERR_SHAPE" -> its code
STATUS = {v: n for n, v in STATUS_CODE.items()}             # code -> "FG_ERR_SHAPE"
OK = STATUS_CODE["FG_OK"]
ERR_NULL_POINTER = STATUS_CODE["FG_ERR_NULL_POINTER"]
ERR_INVALID_VALUE = STATUS_CODE["FG_ERR_INVALID_VALUE"]
ERR_SHAPE = STATUS_CODE["FG_ERR_SHAPE"]
ERR_DTYPE = STATUS_CODE["FG_ERR_DTYPE"]
ERR_MISALIGNED = STATUS_CODE["FG_ERR_MISALIGNED"]
ERR_UNSUPPORTED = STATUS_CODE["FG_ERR_UNSUPPORTED"]
ERR_DEVICE_VALUE = STATUS_CODE["FG_ERR_DEVICE_VALUE"]


class FastgradError(RuntimeError):
    """A fastgrad call failed: `status` is the C status code, `name` its name, and the
    message is the library's own (it names the argument)."""

    def __init__(self, status, message):
        self.status = status
        self.name = STATUS.get(status, "FG_ERR_UNKNOWN")
        super().__init__(f"{self.name}: {message}")


def check(status):
    if status != 0:
        raise FastgradError(status, lib.fg_last_error().decode())


# ------------------------------------------------------------------ structs (checked against the library below)

_enum_t = ctypes.c_int  # a C enum: int-sized on every ABI fastgrad supports (the layout check holds it to that)


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", _enum_t),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("stride", ctypes.c_int64 * MAX_RANK),
    ]


class ContextDesc(ctypes.Structure):
    _fields_ = [
        ("backend", _enum_t),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("allow_tf32", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
    ]


class PlanDesc(ctypes.Structure):
    _fields_ = [
        ("op", _enum_t),
        ("operands", Tensor * MAX_OPERANDS),
        ("accumulate", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("options", ctypes.c_void_p),
        ("options_size", ctypes.c_size_t),
        ("alignment", ctypes.c_uint32),
    ]


class Precision(ctypes.Structure):
    _fields_ = [
        ("storage", _enum_t),
        ("math", _enum_t),
        ("accumulator", _enum_t),
        ("tf32", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("bit_stable", ctypes.c_int32),
    ]


class PlanInfo(ctypes.Structure):
    _fields_ = [
        ("op", _enum_t),
        ("op_name", ctypes.c_char_p),
        ("dtype", _enum_t),
        ("backend", _enum_t),
        ("arch", ctypes.c_int32),
        ("kernel", ctypes.c_char * 256),
        ("precision", Precision),
        ("workspace_bytes", ctypes.c_size_t),
    ]


class OperandInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("role", _enum_t),
        ("optional", ctypes.c_int32),
    ]


class OpInfo(ctypes.Structure):
    _fields_ = [
        ("op", _enum_t),
        ("name", ctypes.c_char_p),
        ("family", ctypes.c_char_p),
        ("n_operands", ctypes.c_int32),
        ("operands", OperandInfo * MAX_OPERANDS),
        ("flags", ctypes.c_uint32),
        ("options_type", ctypes.c_char_p),
        ("options_size", ctypes.c_size_t),
    ]


class _Options(ctypes.Structure):
    """A family's options struct: passed to a plan by pointer with its size."""

    def key(self):
        """The values, hashable (a plan cache key): the struct's bytes (ctypes zero-fills a
        struct when it is made, so its padding reads the same every time)."""
        return type(self).__name__, bytes(self)

    def copy(self):
        return type(self).from_buffer_copy(self)


class ElementwiseOptions(_Options):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("scalars", ctypes.c_double * 4),
    ]


class DropoutOptions(_Options):
    _fields_ = [
        ("p", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
    ]


class LinearActOptions(_Options):
    _fields_ = [
        ("act", _enum_t),
        ("saved", _enum_t),
        ("consume", ctypes.c_int32),
        ("dropout", DropoutOptions),  # y = dropout(act(pre)); zero: none
    ]


class LogpOptions(_Options):
    _fields_ = [
        ("temperature", ctypes.c_double),
        ("softcap", ctypes.c_double),
        ("use_ignore_index", ctypes.c_int32),
        ("ignore_index", ctypes.c_int64),
        ("reduction", _enum_t),
        ("label_smoothing", ctypes.c_double),
        ("z_loss", ctypes.c_double),
        ("grad_scale", ctypes.c_double),
        ("max_tile_elements", ctypes.c_int64),
        ("vocab_start", ctypes.c_int64),
        ("vocab_total", ctypes.c_int64),
    ]


class AdamWHparams(ctypes.Structure):
    _fields_ = [
        ("lr", ctypes.c_double),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("step", ctypes.c_int64),
        ("grad_scale", ctypes.c_double),
    ]


class PatchOptions(_Options):
    _fields_ = [
        ("patch_len", ctypes.c_int64),
        ("stride", ctypes.c_int64),
        ("pad_end", ctypes.c_int64),
    ]


class RegressionLossOptions(_Options):
    _fields_ = [
        ("kind", _enum_t),
        ("reduction", _enum_t),
        ("delta", ctypes.c_double),
        ("grad_scale", ctypes.c_double),
    ]


class NormOptions(_Options):
    _fields_ = [
        ("kind", _enum_t),
        ("eps", ctypes.c_double),
        ("dropout", DropoutOptions),
    ]


class BatchNormOptions(_Options):
    _fields_ = [
        ("eval", ctypes.c_int32),
        ("eps", ctypes.c_double),
        ("momentum", ctypes.c_double),
        ("dropout", DropoutOptions),
    ]


class RevinOptions(_Options):
    _fields_ = [
        ("eps", ctypes.c_double),
        ("denorm", ctypes.c_int32),
        ("subtract_last", ctypes.c_int32),
    ]


class AttentionOptions(_Options):
    _fields_ = [
        ("scale", ctypes.c_double),
        ("causal", ctypes.c_int32),
        ("dropout_p", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
    ]


class EncoderLayerDesc(_Options):
    _fields_ = [
        ("d_model", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("d_ff", ctypes.c_int64),
        ("activation", _enum_t),
        ("norm", _enum_t),
        ("norm_eps", ctypes.c_double),
        ("bn_momentum", ctypes.c_double),
        ("attn_scale", ctypes.c_double),
        ("causal", ctypes.c_int32),
        ("residual_scores", ctypes.c_int32),
        ("dropout", ctypes.c_double),
        ("dropout_ffn", ctypes.c_double),
        ("dropout_attn", ctypes.c_double),
        ("save", _enum_t),
        ("dropout_proj", ctypes.c_double),
    ]


# fg_encoder_layer_params' tensors, in the struct's order (the Python side names them the same).
ENCODER_PARAMS = ("w_qkv", "b_qkv", "w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o", "w_1", "b_1", "w_2",
                  "b_2", "norm1_w", "norm1_b", "norm2_w", "norm2_b", "running_mean1", "running_var1",
                  "running_mean2", "running_var2")


class EncoderLayerParams(ctypes.Structure):
    _fields_ = [(name, Tensor) for name in ENCODER_PARAMS]


class EncoderLayerRun(ctypes.Structure):
    _fields_ = [
        ("train", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
    ]


def struct_key(s):
    """A ctypes struct's field values as a tuple (arrays as tuples), led by its type."""
    def value(v):
        if isinstance(v, ctypes.Array):
            return tuple(value(x) for x in v)
        if isinstance(v, ctypes.Structure):
            return struct_key(v)
        return v
    return (type(s).__name__,) + tuple(value(getattr(s, f)) for f, *_ in s._fields_)


# The Python struct of each C struct fg_abi_layout describes.
STRUCTS = {
    "fg_tensor": Tensor,
    "fg_context_desc": ContextDesc,
    "fg_plan_desc": PlanDesc,
    "fg_precision": Precision,
    "fg_plan_info": PlanInfo,
    "fg_operand_info": OperandInfo,
    "fg_op_info": OpInfo,
    "fg_elementwise_options": ElementwiseOptions,
    "fg_linear_act_options": LinearActOptions,
    "fg_logp_options": LogpOptions,
    "fg_adamw_hparams": AdamWHparams,
    "fg_dropout_options": DropoutOptions,
    "fg_norm_options": NormOptions,
    "fg_batch_norm_options": BatchNormOptions,
    "fg_revin_options": RevinOptions,
    "fg_patch_options": PatchOptions,
    "fg_regression_loss_options": RegressionLossOptions,
    "fg_attention_options": AttentionOptions,
    "fg_encoder_layer_desc": EncoderLayerDesc,
    "fg_encoder_layer_params": EncoderLayerParams,
    "fg_encoder_layer_run": EncoderLayerRun,
}
# The options struct an op's fg_op_info.options_type names.
OPTIONS = {"fg_dropout_options": DropoutOptions, "fg_norm_options": NormOptions,
           "fg_batch_norm_options": BatchNormOptions, "fg_revin_options": RevinOptions,
           "fg_elementwise_options": ElementwiseOptions, "fg_linear_act_options": LinearActOptions,
           "fg_logp_options": LogpOptions, "fg_patch_options": PatchOptions,
           "fg_regression_loss_options": RegressionLossOptions, "fg_attention_options": AttentionOptions}


def layout_mismatches():
    """Every difference between the ctypes structs and the library's layouts, as
    (struct, field or None, python value, library value); empty when they agree."""
    out = []
    for cname, cls in STRUCTS.items():
        try:
            size = abi_layout(cname)
        except AbiError:
            out.append((cname, None, ctypes.sizeof(cls), None))
            continue
        if size != ctypes.sizeof(cls):
            out.append((cname, None, ctypes.sizeof(cls), size))
        for field, *_ in cls._fields_:
            try:
                off = abi_layout(cname, field)
            except AbiError:
                off = None
            if off != getattr(cls, field).offset:
                out.append((cname, field, getattr(cls, field).offset, off))
    return out


def _check_layouts():
    bad = layout_mismatches()
    if bad:
        lines = [f"{s}{'.' + f if f else ''}: {'offset' if f else 'sizeof'} {py} in python/fastgrad/_lib.py, "
                 f"{'unknown' if lib_v is None else lib_v} in {lib._name}" for s, f, py, lib_v in bad]
        raise AbiError("fastgrad: the ctypes structs do not match the library's layout (rebuild the library or "
                       "update _lib.py with include/fastgrad.h):\n  " + "\n  ".join(lines))


_check_layouts()

# ------------------------------------------------------------------ the op table (from the library)

lib.fg_op_count.restype = ctypes.c_int32
lib.fg_op_count.argtypes = []
lib.fg_op_describe.restype = _c
lib.fg_op_describe.argtypes = [_enum_t, ctypes.POINTER(OpInfo)]

Operand = collections.namedtuple("Operand", "name role optional")
Op = collections.namedtuple("Op", "id name family operands flags options_type options_size")


def describe(op_id):
    """fg_op_describe(op_id) as an Op; FastgradError for an id that is not an op."""
    info = OpInfo()
    check(lib.fg_op_describe(op_id, ctypes.byref(info)))
    operands = tuple(Operand(info.operands[i].name.decode(),
                             "output" if info.operands[i].role == ROLE["output"] else "input",
                             bool(info.operands[i].optional)) for i in range(info.n_operands))
    return Op(info.op, info.name.decode(), info.family.decode(), operands, info.flags,
              info.options_type.decode() if info.options_type else None, info.options_size)



OPS = {op.name: op for op in (describe(i) for i in range(1, lib.fg_op_count() + 1))}  # name -> Op, in id order
OP = {name: op.id for name, op in OPS.items()}  # "linear_forward" -> its id
OPERANDS = {name: tuple(o.name for o in op.operands) for name, op in OPS.items()}  # names, in C order

# ------------------------------------------------------------------ entry points

lib.fg_version.restype = ctypes.c_uint32
lib.fg_backend_available.restype = _c
lib.fg_backend_available.argtypes = [_c]
lib.fg_context_create.restype = _c
lib.fg_context_create.argtypes = [ctypes.POINTER(ContextDesc), ctypes.POINTER(ctypes.c_void_p)]
lib.fg_context_destroy.restype = None
lib.fg_context_destroy.argtypes = [ctypes.c_void_p]
lib.fg_context_set_stream.restype = _c
lib.fg_context_set_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.fg_context_check.restype = _c
lib.fg_context_check.argtypes = [ctypes.c_void_p]
lib.fg_context_last_kernels.restype = ctypes.c_char_p
lib.fg_context_last_kernels.argtypes = [ctypes.c_void_p]
lib.fg_context_set_workspace.restype = _c
lib.fg_context_set_workspace.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
lib.fg_context_workspace_size.restype = _c
lib.fg_context_workspace_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
lib.fg_plan_create.restype = _c
lib.fg_plan_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(PlanDesc), ctypes.POINTER(ctypes.c_void_p)]
lib.fg_plan_destroy.restype = None
lib.fg_plan_destroy.argtypes = [ctypes.c_void_p]
lib.fg_plan_info_get.restype = _c
lib.fg_plan_info_get.argtypes = [ctypes.c_void_p, ctypes.POINTER(PlanInfo)]
lib.fg_plan_can_implement.restype = _c
lib.fg_plan_can_implement.argtypes = [ctypes.c_void_p, ctypes.POINTER(Tensor)]
lib.fg_plan_run.restype = _c
lib.fg_plan_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.c_size_t]
lib.fg_adamw_step.restype = _c
lib.fg_adamw_step.argtypes = [ctypes.c_void_p, ctypes.POINTER(AdamWHparams), ctypes.c_int] + [ctypes.POINTER(Tensor)] * 5


_P = ctypes.POINTER
lib.fg_encoder_layer_sizes.restype = _c
lib.fg_encoder_layer_sizes.argtypes = [_P(EncoderLayerDesc), _enum_t, ctypes.c_int64, ctypes.c_int64,
                                       _P(ctypes.c_size_t), _P(ctypes.c_size_t)]
lib.fg_encoder_layer_forward.restype = _c
lib.fg_encoder_layer_forward.argtypes = [ctypes.c_void_p, _P(EncoderLayerDesc), _P(EncoderLayerRun), _P(Tensor),
                                         _P(Tensor), _P(Tensor), _P(EncoderLayerParams), _P(Tensor), _P(Tensor),
                                         ctypes.c_void_p, ctypes.c_size_t]
lib.fg_encoder_layer_forward_ws.restype = _c
lib.fg_encoder_layer_forward_ws.argtypes = [ctypes.c_void_p, _P(EncoderLayerDesc), _P(EncoderLayerRun), _P(Tensor),
                                            _P(Tensor), _P(Tensor), _P(EncoderLayerParams), _P(Tensor), _P(Tensor),
                                            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
lib.fg_encoder_layer_backward.restype = _c
lib.fg_encoder_layer_backward.argtypes = [ctypes.c_void_p, _P(EncoderLayerDesc), _P(EncoderLayerRun), _P(Tensor),
                                          _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor), _P(EncoderLayerParams),
                                          ctypes.c_void_p, ctypes.c_size_t, _P(Tensor), _P(Tensor),
                                          _P(EncoderLayerParams), _c, ctypes.c_void_p, ctypes.c_size_t]

lib.fg_encoder_sizes.restype = _c
lib.fg_encoder_sizes.argtypes = [_P(EncoderLayerDesc), ctypes.c_int64, _enum_t, ctypes.c_int64, ctypes.c_int64,
                                 _P(ctypes.c_size_t), _P(ctypes.c_size_t)]
lib.fg_encoder_forward.restype = _c
lib.fg_encoder_forward.argtypes = [ctypes.c_void_p, _P(EncoderLayerDesc), ctypes.c_int64, _P(EncoderLayerRun),
                                   _P(Tensor), _P(Tensor), _P(EncoderLayerParams), _P(Tensor), ctypes.c_void_p,
                                   ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
lib.fg_encoder_backward.restype = _c
lib.fg_encoder_backward.argtypes = [ctypes.c_void_p, _P(EncoderLayerDesc), ctypes.c_int64, _P(EncoderLayerRun),
                                    _P(Tensor), _P(Tensor), _P(Tensor), _P(EncoderLayerParams), ctypes.c_void_p,
                                    ctypes.c_size_t, _P(Tensor), _P(EncoderLayerParams), _c, ctypes.c_void_p,
                                    ctypes.c_size_t]


def version():
    v = lib.fg_version()
    return f"{v >> 16}.{(v >> 8) & 255}.{v & 255}"


class Context:
    """One fg_context: the CPU, or a CUDA device (the stream is set per call)."""

    def __init__(self, backend, device=0):
        desc = ContextDesc(backend=backend, device=device)
        handle = ctypes.c_void_p()
        check(lib.fg_context_create(ctypes.byref(desc), ctypes.byref(handle)))
        self.handle = handle
        self.backend = backend
        self.stream = None
        self.plans = {}
        # the compiled path's cache (ops.py, _fastcall.c): its key bytes -> (plan handle, workspace
        # bytes, Plan), each plan one of self.plans'; emptied in place with them, as _fastcall
        # keeps a reference to this dict
        self.fast = {}

    def clear_plans(self):
        self.fast.clear()
        for entry in self.plans.values():
            lib.fg_plan_destroy(entry.plan.handle)
        self.plans = {}

    def set_stream(self, stream):
        if stream != self.stream:
            check(lib.fg_context_set_stream(self.handle, ctypes.c_void_p(stream)))
            self.stream = stream

    def check(self):
        check(lib.fg_context_check(self.handle))

    def last_kernels(self):
        """The kernels the last op on this context launched, in order ("gemm ; act_grad")."""
        return (lib.fg_context_last_kernels(self.handle) or b"").decode()

    def workspace_bytes(self):
        """The bytes of workspace the context holds now (its own, kept between calls: on CUDA
        outside torch's allocator, so torch.cuda's memory statistics do not count it)."""
        n = ctypes.c_size_t()
        check(lib.fg_context_workspace_size(self.handle, ctypes.byref(n)))
        return n.value

    def release_workspace(self):
        """Frees the context's own workspace (fg_context_set_workspace(NULL, 0))."""
        check(lib.fg_context_set_workspace(self.handle, None, 0))

    def __del__(self):
        try:
            self.clear_plans()
            lib.fg_context_destroy(self.handle)
        except Exception:  # interpreter shutdown
            pass


class Plan:
    """An fg_plan made from a PlanDesc. `options` is the options struct desc.options points
    at: the plan holds it for as long as it lives."""

    def __init__(self, ctx, desc, options=None):
        self.options = options
        self.desc = desc
        handle = ctypes.c_void_p()
        check(lib.fg_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(handle)))
        self.handle = handle
        info = PlanInfo()
        check(lib.fg_plan_info_get(handle, ctypes.byref(info)))
        self.info = info
        self.workspace_bytes = info.workspace_bytes
        self.alignment = desc.alignment

    def run(self, array, workspace_ptr, workspace_bytes):
        """array: a (Tensor * MAX_OPERANDS) with this call's data pointers."""
        check(lib.fg_plan_run(self.handle, array, workspace_ptr or None, workspace_bytes))


_local = threading.local()


def context(backend, device=0):
    """The calling thread's context for (backend, device): a context is used by one
    thread at a time."""
    cache = getattr(_local, "contexts", None)
    if cache is None:
        cache = _local.contexts = {}
    key = (backend, device)
    if key not in cache:
        cache[key] = Context(backend, device)
    return cache[key]


# ------------------------------------------------------------------ the compiled per-call module


def _load_fastcall():
    """(module, None), or (None, why not): fastgrad._fastcall from the loaded library's folder,
    then from this package's."""
    if os.environ.get("FASTGRAD_NO_EXT", "") not in ("", "0"):
        return None, "FASTGRAD_NO_EXT is set"
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.dirname(os.path.abspath(lib._name))] if os.path.sep in lib._name else []
    folders += [here] if here not in folders else []
    for folder in folders:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_fastcall" + suffix)
            if not os.path.exists(path):
                continue
            try:
                spec = importlib.util.spec_from_file_location(__package__ + "._fastcall", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            except ImportError as e:
                return None, f"{path} does not load: {e}"
            if module.VERSION != VERSION:
                return None, f"{path} was built for version {module.VERSION:#x}, the library is {VERSION:#x}"
            return module, None
    return None, "not built (no _fastcall module in " + ", ".join(folders) + ")"


_fastcall, FASTCALL_WHY_NOT = _load_fastcall()


def fastcall_module():
    """fastgrad._fastcall when it was found and loads, else None (FASTCALL_WHY_NOT says why)."""
    return _fastcall

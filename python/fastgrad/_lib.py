"""ctypes bindings to libfastgrad: the C structs, the library search, and errors.

Nothing here knows about numpy or torch; ops.py turns arrays into fg_tensor
descriptors. The library is found, in order, at $FASTGRAD_LIBRARY, in the repository's
build folders next to this package, or by the system loader (ldconfig).
"""
import ctypes
import ctypes.util
import os
import threading

MAX_RANK = 8
MAX_OPERANDS = 16

# enums of include/fastgrad.h
F32, F16, BF16, F64, I32, I64 = 0, 1, 2, 3, 4, 5
BACKEND_CPU, BACKEND_CUDA = 0, 1
PLAN_ALLOW_TF32 = 1
PLAN_CONSUME_PRE = 2
PLAN_ACT_SLOPE = 4

OP = {
    "linear_forward": 1,
    "linear_backward_input": 2,
    "linear_backward_weight": 3,
    "linear_backward_bias": 4,
    "matmul_forward": 5,
    "matmul_backward_input": 6,
    "matmul_backward_other": 7,
    "outer_forward": 8,
    "outer_backward_input": 9,
    "outer_backward_other": 10,
    "unary_forward": 11,
    "unary_backward": 12,
    "binary_forward": 13,
    "binary_backward": 14,
    "linear_logp_forward": 15,
    "linear_logp_backward": 16,
    "linear_cross_entropy": 17,
    "linear_act_forward": 18,
    "linear_act_backward": 19,
}
ACT = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5, "tanh": 6}
REDUCTION = {"mean": 0, "sum": 1, "none": 2}
UNARY = {"scale": 0, "pow": 1, "leaky_relu": 2, "elu": 3, "clamp": 4, "softcap": 5}
BINARY = {"lerp": 0, "axpby": 1}

STATUS = {
    0: "FG_OK", 1: "FG_ERR_NULL_POINTER", 2: "FG_ERR_INVALID_VALUE", 3: "FG_ERR_SHAPE", 4: "FG_ERR_DTYPE",
    5: "FG_ERR_WRONG_DEVICE", 6: "FG_ERR_MISALIGNED", 7: "FG_ERR_WORKSPACE", 8: "FG_ERR_OVERFLOW",
    9: "FG_ERR_ALIAS", 10: "FG_ERR_UNSUPPORTED", 11: "FG_ERR_NO_DEVICE", 12: "FG_ERR_OUT_OF_MEMORY",
    13: "FG_ERR_BACKEND", 14: "FG_ERR_DEVICE_VALUE", 15: "FG_ERR_INTERNAL",
}
ERR_UNSUPPORTED = 10


class FastgradError(RuntimeError):
    """A fastgrad call failed: `status` is the C status code, `name` its name, and the
    message is the library's own (it names the argument)."""

    def __init__(self, status, message):
        self.status = status
        self.name = STATUS.get(status, "FG_ERR_UNKNOWN")
        super().__init__(f"{self.name}: {message}")


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("stride", ctypes.c_int64 * MAX_RANK),
    ]


class ContextDesc(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("allow_tf32", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
    ]


class LogpOptions(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_double),
        ("softcap", ctypes.c_double),
        ("use_ignore_index", ctypes.c_int32),
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),
        ("label_smoothing", ctypes.c_double),
        ("z_loss", ctypes.c_double),
        ("grad_scale", ctypes.c_double),
        ("max_tile_elements", ctypes.c_int64),
    ]

    def key(self):
        return tuple(getattr(self, f) for f, _ in self._fields_)


class PlanDesc(ctypes.Structure):
    _fields_ = [
        ("op", ctypes.c_int),
        ("operands", Tensor * MAX_OPERANDS),
        ("accumulate", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("kind", ctypes.c_int32),
        ("scalars", ctypes.c_double * 4),
        ("logp", LogpOptions),
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


class Precision(ctypes.Structure):
    _fields_ = [
        ("storage", ctypes.c_int),
        ("math", ctypes.c_int),
        ("accumulator", ctypes.c_int),
        ("tf32", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("bit_stable", ctypes.c_int32),
    ]


class PlanInfo(ctypes.Structure):
    _fields_ = [
        ("op", ctypes.c_int),
        ("op_name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("backend", ctypes.c_int),
        ("arch", ctypes.c_int32),
        ("kernel", ctypes.c_char * 128),
        ("precision", Precision),
        ("workspace_bytes", ctypes.c_size_t),
    ]


def _candidates():
    env = os.environ.get("FASTGRAD_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for build in ("build", "build-gpu", "build-cuda", "build-release"):
        yield os.path.join(root, build, "libfastgrad.so")
    yield os.path.join(here, "libfastgrad.so")
    found = ctypes.util.find_library("fastgrad")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("fastgrad: libfastgrad.so not found; build it (scripts/test.sh or cmake) or set "
                      "FASTGRAD_LIBRARY. Tried: " + ", ".join(tried))


lib = _load()

_c = ctypes.c_int
lib.fg_status_string.restype = ctypes.c_char_p
lib.fg_status_string.argtypes = [_c]
lib.fg_last_error.restype = ctypes.c_char_p
lib.fg_last_error.argtypes = []
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
lib.fg_plan_create.restype = _c
lib.fg_plan_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(PlanDesc), ctypes.POINTER(ctypes.c_void_p)]
lib.fg_plan_destroy.restype = None
lib.fg_plan_destroy.argtypes = [ctypes.c_void_p]
lib.fg_plan_info_get.restype = _c
lib.fg_plan_info_get.argtypes = [ctypes.c_void_p, ctypes.POINTER(PlanInfo)]
lib.fg_plan_run.restype = _c
lib.fg_plan_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.c_size_t]
lib.fg_adamw_step.restype = _c
lib.fg_adamw_step.argtypes = [ctypes.c_void_p, ctypes.POINTER(AdamWHparams), ctypes.c_int] + [ctypes.POINTER(Tensor)] * 5


def check(status):
    if status != 0:
        raise FastgradError(status, lib.fg_last_error().decode())


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

    def clear_plans(self):
        for entry in self.plans.values():
            lib.fg_plan_destroy(entry.plan.handle)
        self.plans = {}

    def set_stream(self, stream):
        if stream != self.stream:
            check(lib.fg_context_set_stream(self.handle, ctypes.c_void_p(stream)))
            self.stream = stream

    def check(self):
        check(lib.fg_context_check(self.handle))

    def __del__(self):
        try:
            self.clear_plans()
            lib.fg_context_destroy(self.handle)
        except Exception:  # interpreter shutdown
            pass


class Plan:
    def __init__(self, ctx, desc):
        handle = ctypes.c_void_p()
        check(lib.fg_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(handle)))
        self.handle = handle
        info = PlanInfo()
        check(lib.fg_plan_info_get(handle, ctypes.byref(info)))
        self.info = info
        self.workspace_bytes = info.workspace_bytes

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

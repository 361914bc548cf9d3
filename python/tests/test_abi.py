"""The Python layer against the ABI the library reports: every ctypes struct's size and
field offsets against fg_abi_layout (a struct edited on one side only fails here), the op
table against fg_op_describe, constants against fg_abi_constant and the library's own
name functions, plans declared for the alignment of their pointers (a misaligned view
gets its own plan), and fg_context_last_kernels against the plan's kernel name."""
import ctypes
import os
import re

import numpy as np
import pytest
from conftest import data, relerr

import fastgrad as fg
from fastgrad import _lib, ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------------ (a) struct layouts

@pytest.mark.parametrize("cname", sorted(_lib.STRUCTS))
def test_struct_layout(cname):
    cls = _lib.STRUCTS[cname]
    assert ctypes.sizeof(cls) == _lib.abi_layout(cname), f"sizeof({cname})"
    for field, *_ in cls._fields_:
        assert getattr(cls, field).offset == _lib.abi_layout(cname, field), f"offsetof({cname}, {field})"
    assert _lib.layout_mismatches() == []


def test_every_struct_the_library_describes_is_declared():
    """abi.c's layout table names the public structs; each has a checked ctypes twin."""
    with open(os.path.join(ROOT, "src", "core", "abi.c")) as f:
        described = set(re.findall(r"\bS\((fg_\w+)\)", f.read()))
    assert described, "no S(type) entries found in src/core/abi.c"
    assert described <= set(_lib.STRUCTS), f"not mirrored in _lib.py: {sorted(described - set(_lib.STRUCTS))}"


def test_layout_check_catches_drift(monkeypatch):
    """The import-time check is not vacuous: the old fg_plan_desc (kind, scalars, logp inline)
    and a struct with two fields swapped are both reported, naming struct and field."""

    class OldPlanDesc(ctypes.Structure):
        _fields_ = [("op", ctypes.c_int), ("operands", _lib.Tensor * _lib.MAX_OPERANDS),
                    ("accumulate", ctypes.c_int32), ("flags", ctypes.c_uint32), ("kind", ctypes.c_int32),
                    ("scalars", ctypes.c_double * 4), ("logp", _lib.LogpOptions)]

    class SwappedOptions(ctypes.Structure):
        _fields_ = [("saved", ctypes.c_int), ("act", ctypes.c_int), ("consume", ctypes.c_int32)]

    monkeypatch.setitem(_lib.STRUCTS, "fg_plan_desc", OldPlanDesc)
    monkeypatch.setitem(_lib.STRUCTS, "fg_linear_act_options", SwappedOptions)
    bad = {(s, f) for s, f, *_ in _lib.layout_mismatches()}
    assert ("fg_plan_desc", None) in bad and ("fg_plan_desc", "kind") in bad
    assert ("fg_linear_act_options", "act") in bad and ("fg_linear_act_options", "saved") in bad
    assert ("fg_linear_act_options", "consume") not in bad
    with pytest.raises(ImportError, match=r"fg_linear_act_options\.act: offset 4 in python/fastgrad/_lib.py, 0"):
        _lib._check_layouts()


# ------------------------------------------------------------------ (b) the op table

def test_op_table_matches_library():
    count = _lib.lib.fg_op_count()
    assert count >= 19
    seen = {}
    for op_id in range(1, count + 1):
        info = _lib.OpInfo()
        assert _lib.lib.fg_op_describe(op_id, ctypes.byref(info)) == _lib.OK
        assert info.op == op_id
        name, family = info.name.decode(), info.family.decode()
        assert os.path.exists(os.path.join(ROOT, "tests", f"test_{family}.c")), f"{name}: no tests/test_{family}.c"
        assert os.path.exists(os.path.join(ROOT, "src", "ops", f"{family}.c")), f"{name}: no src/ops/{family}.c"
        operands = tuple(info.operands[i].name.decode() for i in range(info.n_operands))
        assert 0 < info.n_operands <= _lib.MAX_OPERANDS and len(set(operands)) == len(operands)
        roles = {info.operands[i].role for i in range(info.n_operands)}
        assert roles <= {_lib.ROLE["input"], _lib.ROLE["output"]} and _lib.ROLE["output"] in roles
        if info.options_type:
            cls = _lib.OPTIONS[info.options_type.decode()]
            assert info.options_size == ctypes.sizeof(cls)
        else:
            assert info.options_size == 0
        seen[name] = (op_id, operands)
    assert _lib.OP == {n: v[0] for n, v in seen.items()}
    assert _lib.OPERANDS == {n: v[1] for n, v in seen.items()}
    for bad in (0, count + 1):
        with pytest.raises(fg.FastgradError) as e:
            _lib.describe(bad)
        assert e.value.status == _lib.ERR_INVALID_VALUE


def test_operand_names_come_from_the_library():
    x, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match="linear_forward has no operand 'bias'"):
        ops.run("linear_forward", dict(x=x, w=w, bias=None, y=np.empty((2, 4), np.float32)))
    with pytest.raises(ValueError, match=r"takes 4 operands \(x, w, b, y\)"):
        ops.run("linear_forward", [x, w, np.empty((2, 4), np.float32)])
    with pytest.raises(ValueError, match="operands are x, w, b, y"):
        ops.plan_info("linear_forward", [x, w, None, np.empty((2, 4), np.float32)], ["x", "w", "bias", "y"])
    with pytest.raises(TypeError, match="takes fg_elementwise_options"):
        ops.run("unary_forward", dict(x=x, y=np.empty_like(x)), options=fg.logp_options())


# ------------------------------------------------------------------ (c) constants

def test_abi_constant_refuses_unknown_names():
    value = ctypes.c_int64(-7)
    status = _lib.lib.fg_abi_constant(b"FG_NOT_A_CONSTANT", ctypes.byref(value))
    assert status == _lib.ERR_INVALID_VALUE
    assert _lib.lib.fg_status_string(status) == b"FG_ERR_INVALID_VALUE"
    assert "FG_NOT_A_CONSTANT" in _lib.lib.fg_last_error().decode() and value.value == -7
    size = ctypes.c_size_t(7)
    assert _lib.lib.fg_abi_layout(b"fg_plan_desc", b"kind", ctypes.byref(size)) == _lib.ERR_INVALID_VALUE
    assert _lib.lib.fg_abi_layout(b"fg_no_such_struct", None, ctypes.byref(size)) == _lib.ERR_INVALID_VALUE
    assert size.value == 7
    with pytest.raises(fg.AbiError, match="FG_NOT_A_CONSTANT"):
        _lib.abi_constant("FG_NOT_A_CONSTANT")


def test_constants_agree_with_the_library_names():
    """The codes abi_constant reports against the library's other view of them (its name
    functions), so a wrong entry in either table shows."""
    for name, code in _lib.STATUS_CODE.items():
        assert _lib.lib.fg_status_string(code) == name.encode()
    _lib.lib.fg_dtype_name.restype = ctypes.c_char_p
    _lib.lib.fg_dtype_name.argtypes = [ctypes.c_int]
    for name, code in _lib.DTYPE.items():
        assert _lib.lib.fg_dtype_name(code) == name.encode()
    assert len(set(_lib.ACT.values())) == len(_lib.ACT) and len(set(_lib.UNARY.values())) == len(_lib.UNARY)
    assert _lib.VERSION == _lib.lib.fg_version()
    assert _lib.abi_layout("fg_tensor", "shape") + 8 * _lib.MAX_RANK == _lib.abi_layout("fg_tensor", "stride")


# ------------------------------------------------------------------ (d) alignment

def aligned_f32(n, align=256):
    """n float32 whose first element sits on an `align`-byte boundary."""
    raw = np.empty(n + align // 4, np.float32)
    off = (-raw.ctypes.data % align) // 4
    return raw[off:off + n]


def test_alignment_class():
    assert ops._alignment([0x1000, None, 0x2040]) == 64
    assert ops._alignment([0x1004]) == 4
    assert ops._alignment([0x10000]) == 256
    assert ops._alignment([None, 0]) == 256


@pytest.mark.parametrize("shift", [1, 2, 3])
def test_misaligned_lerp(rng, shift):
    """The same shapes, first 256-aligned and then shifted by `shift` f32 elements: the
    shifted call declares its own alignment and gets its own plan, with the right values."""
    n = 1003
    abuf, bbuf, ybuf = (aligned_f32(n + 4) for _ in range(3))
    abuf[:], bbuf[:] = data(rng, n + 4), data(rng, n + 4)
    for s in (0, shift):
        a, b, y = abuf[s:s + n], bbuf[s:s + n], ybuf[s:s + n]
        y[:] = np.nan
        info = ops.plan_info("binary_forward", dict(a=a, b=b, y=y),
                             options=ops._elementwise(_lib.BINARY, "lerp", (0.3,)))
        assert info["alignment"] == (256 if s == 0 else {1: 4, 2: 8, 3: 4}[shift])
        ref = a.astype(np.float64) + 0.3 * (b.astype(np.float64) - a)
        assert relerr(y, ref) <= 1e-6 and np.max(np.abs(y - ref)) <= 1e-6
        assert relerr(fg.lerp_forward(a, b, 0.3), ref) <= 1e-6


def test_misaligned_linear(rng):
    """x, w, b and y each one f32 off a 256-byte boundary, after the aligned case made (and
    cached) a plan for the same shapes."""
    n, k, m = 37, 65, 29
    bufs = [aligned_f32(size + 1) for size in (n * k, m * k, m, n * m)]
    for buf in bufs:
        buf[:] = data(rng, buf.shape)
    for s in (0, 1):
        x, w, b = bufs[0][s:s + n * k].reshape(n, k), bufs[1][s:s + m * k].reshape(m, k), bufs[2][s:s + m]
        y = bufs[3][s:s + n * m].reshape(n, m)
        y[:] = np.nan
        fg.linear_forward(x, w, b, out=y)
        ref = x.astype(np.float64) @ w.astype(np.float64).T + b
        assert relerr(y, ref) <= 1e-5
        assert np.max(np.abs(y - ref)) <= 1e-5 * np.max(np.abs(ref))
        info = fg.plan_info("linear_forward", dict(x=x, w=w, b=b, y=y))
        assert info["alignment"] == (256 if s == 0 else 4)


def test_plan_for_16_refuses_misaligned_data():
    """What the alignment class in the cache key is for: a plan declared for 16 bytes
    refuses data aligned to 4 with FG_ERR_MISALIGNED (the library's check, reached through
    the ctypes structs)."""
    n = 64
    buf = aligned_f32(n + 1)
    buf[:] = 1.0
    ctx = _lib.context(_lib.BACKEND_CPU)
    opts = ops._elementwise(_lib.BINARY, "lerp", (0.5,))
    tensors = [ops._describe(buf[:n], "a"), ops._describe(buf[:n], "b"), _lib.Tensor(), ops._describe(buf[:n], "y")]
    desc = _lib.PlanDesc(op=_lib.OP["binary_forward"], alignment=16, options=ctypes.addressof(opts),
                         options_size=ctypes.sizeof(opts))
    for i, t in enumerate(tensors):
        desc.operands[i] = t
    plan = _lib.Plan(ctx, desc, opts)
    try:
        array = (_lib.Tensor * _lib.MAX_OPERANDS)(*tensors)
        assert _lib.lib.fg_plan_can_implement(plan.handle, array) == _lib.OK
        for i in (0, 1, 3):
            array[i].data = buf[1:].ctypes.data
        assert _lib.lib.fg_plan_can_implement(plan.handle, array) == _lib.ERR_MISALIGNED
        with pytest.raises(fg.FastgradError) as e:
            plan.run(array, 0, 0)
        assert e.value.status == _lib.ERR_MISALIGNED and "aligned" in str(e.value)
    finally:
        _lib.lib.fg_plan_destroy(plan.handle)


# ------------------------------------------------------------------ (e) last kernels

def _cases(rng):
    f = lambda *shape: data(rng, shape).astype(np.float32)  # noqa: E731
    x, w, b = f(9, 16), f(12, 16), f(12)
    lerp = ops._elementwise(_lib.BINARY, "lerp", (0.25,))
    gelu = ops._act_options("gelu")
    pre = x @ w.T + b
    yield "linear_forward", dict(x=x, w=w, b=b, y=np.empty((9, 12), np.float32)), None
    yield "linear_forward", dict(x=x[:1], w=w, y=np.empty((1, 12), np.float32)), None  # GEMV
    yield "linear_backward_bias", dict(dy=pre, db=np.empty(12, np.float32)), None
    yield "binary_forward", dict(a=x, b=x, y=np.empty_like(x)), lerp
    yield "linear_act_forward", dict(x=x, w=w, b=b, y=np.empty_like(pre), pre=np.empty_like(pre)), gelu
    yield "linear_act_backward", dict(dy=pre, pre=pre.copy(), x=x, w=w, b=b, dx=np.empty_like(x),
                                      dw=np.empty_like(w), db=np.empty_like(b)), gelu
    yield "linear_logp_forward", dict(h=x, w=w, target=np.arange(9, dtype=np.int32), logp=np.empty(9, np.float32),
                                      lse=np.empty(9, np.float32)), None


def test_last_kernels_name_the_plans_kernels(rng):
    for op, operands, options in _cases(rng):
        info = fg.plan_info(op, operands, options=options)
        launched = fg.last_kernels()
        assert launched, f"{op}: fg_context_last_kernels is empty after the op"
        for name in launched.split(" ; "):
            assert name and name in info["kernel"], f"{op}: launched {name!r}, plan says {info['kernel']!r}"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_misaligned_torch_views(rng, device):
    """Torch views one f32 past their allocation (4-byte aligned) through lerp and linear +
    activation, forward and backward, on each device: the calls declare alignment 4, the
    backend plans a path that takes it, and the values hold against float64."""
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    n, k, m = 33, 64, 48
    sizes = [n * k, m * k, m, n * m]
    base = torch.from_numpy(data(rng, (sum(sizes) + 1,))).float().to(device)
    views, at = [], 1
    for size in sizes:
        views.append(base[at:at + size])
        at += size
    x, w, b, dy = views[0].view(n, k), views[1].view(m, k), views[2], views[3].view(n, m)
    assert x.data_ptr() % 16 == 4
    d = lambda t: t.double()  # noqa: E731
    y = ops.lerp_forward(x, x.flip(0).contiguous(), 0.3)
    assert relerr(y.cpu().numpy(), (d(x) + 0.3 * (d(x.flip(0)) - d(x))).cpu().numpy()) <= 1e-6
    y, pre = ops.linear_act_forward(x, w, b, "gelu_tanh", keep_pre=True)
    pre_ref = d(x) @ d(w).T + d(b)
    y_ref = torch.nn.functional.gelu(pre_ref, approximate="tanh")
    assert relerr(y.cpu().numpy(), y_ref.cpu().numpy()) <= 1e-5
    dx, dw, db = ops.linear_act_backward(dy, x, w, b, pre, "gelu_tanh")
    pr = pre_ref.clone().requires_grad_(True)
    torch.nn.functional.gelu(pr, approximate="tanh").backward(d(dy))
    g = pr.grad
    assert relerr(dx.cpu().numpy(), (g @ d(w)).cpu().numpy()) <= 1e-5
    assert relerr(dw.cpu().numpy(), (g.T @ d(x)).cpu().numpy()) <= 1e-5
    assert relerr(db.cpu().numpy(), g.sum(0).cpu().numpy()) <= 1e-5
    info = ops.plan_info("linear_forward", dict(x=x, w=w, b=b, y=torch.empty(n, m, device=device)))
    assert info["alignment"] == 4 and info["backend"] == ("cuda" if device == "cuda" else "cpu")
    launched = ops.last_kernels(x.device)
    assert launched and all(name in info["kernel"] for name in launched.split(" ; "))
    # through autograd: leaves that are views one element into their storage
    xl, wl, bl = (t.detach().requires_grad_(True) for t in (x, w, b))
    assert xl.data_ptr() % 16 == 4
    yl = fg.linear_act(xl, wl, bl, "silu", save_pre=True)
    yl.backward(dy)
    xr, wr, br = (d(t).detach().requires_grad_(True) for t in (x, w, b))
    torch.nn.functional.silu(xr @ wr.T + br).backward(d(dy))
    for got, ref in ((yl, torch.nn.functional.silu(d(x) @ d(w).T + d(b))), (xl.grad, xr.grad), (wl.grad, wr.grad),
                     (bl.grad, br.grad)):
        assert relerr(got.detach().cpu().numpy(), ref.detach().cpu().numpy()) <= 1e-5

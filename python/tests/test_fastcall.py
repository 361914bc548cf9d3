"""The compiled per-call path (fastgrad._fastcall, python/fastgrad/_fastcall.c) against the
Python one (ops._run_py): the same outputs, bit for bit, for several ops and dtypes on numpy
arrays and torch CPU tensors; the same refusals (exception type and the library's message)
whether the plan is made or found in the cache; a cache that stays right across many shapes
and when it is emptied; the CUDA stream logic, driven on the CPU through a tensor that says
it is on a GPU; and a check that fails when the module is built beside the library but not
in use. The rest of python/tests runs on whichever path is in use (FASTGRAD_NO_EXT=1: the
ctypes path)."""
import glob
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fastgrad as fg
from fastgrad import _lib, norm, ops

try:
    import torch
except ImportError:  # pragma: no cover - CI without torch
    torch = None

FAST = ops.FAST
needs_fast = pytest.mark.skipif(FAST is None, reason=f"fastgrad._fastcall not in use: {ops.FAST_WHY_NOT}")
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def _built_beside_library():
    folder = os.path.dirname(os.path.abspath(_lib.lib._name))
    return sorted(glob.glob(os.path.join(folder, "_fastcall*.so")))


def test_module_in_use_when_built():
    """Built beside the library that was loaded (and not turned off): it must be what ops.run is,
    and a call must go through it."""
    built = _built_beside_library()
    if os.environ.get("FASTGRAD_NO_EXT", "") not in ("", "0"):
        assert FAST is None and ops.run is ops._run_py
        pytest.skip("FASTGRAD_NO_EXT is set")
    if not built:
        pytest.skip(f"fastgrad._fastcall not built: {ops.FAST_WHY_NOT}")
    assert FAST is not None, f"{built[0]} is built but not used: {ops.FAST_WHY_NOT}"
    assert ops.run is FAST.run and norm.run is FAST.run
    x, w = np.ones((3, 5), np.float32), np.ones((2, 5), np.float32)
    fg.linear_forward(x, w)
    before = FAST.stats()
    y = fg.linear_forward(x, w)
    after = FAST.stats()
    assert after["hits"] == before["hits"] + 1, (before, after)
    assert np.array_equal(y, np.full((3, 2), 5, np.float32))


def test_switch_turns_it_off():
    """FASTGRAD_NO_EXT=1: the ctypes path, and the package still works."""
    code = ("import numpy as np, fastgrad as fg; from fastgrad import ops; "
            "assert ops.FAST is None and ops.run is ops._run_py, ops.FAST_WHY_NOT; "
            "assert 'FASTGRAD_NO_EXT' in ops.FAST_WHY_NOT; "
            "y = fg.linear_forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)); "
            "assert (y == 3).all()")
    env = dict(os.environ, FASTGRAD_NO_EXT="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def path(monkeypatch):
    """use(kind): ops.run (and norm's) set to the compiled ("fast") or the Python ("py") path."""
    def use(kind):
        fn = FAST.run if kind == "fast" else ops._run_py
        monkeypatch.setattr(ops, "run", fn)
        monkeypatch.setattr(norm, "run", fn)
    yield use


def _arrays(rng, kind, dtype):
    def make(*shape):
        a = rng.uniform(-0.5, 1.0, size=shape)
        if kind == "numpy":
            return a.astype(dtype)
        return torch.from_numpy(a).to(getattr(torch, dtype))
    return make


def _np(a):
    if a is None:
        return None
    if torch is not None and isinstance(a, torch.Tensor):
        return a.detach().to(torch.float64).numpy()
    return np.asarray(a, np.float64)


CASES = {
    "linear_forward": lambda m: fg.linear_forward(m(5, 7), m(3, 7), m(3)),
    "linear_forward_transposed_w": lambda m: fg.linear_forward(m(4, 6), m(6, 9).T),
    "linear_backward_weight_accumulate": lambda m: (lambda acc: fg.linear_backward_weight(
        m(2, 5, 3), m(2, 5, 4), out=acc, accumulate=True))(m(3, 4)),
    "matmul_forward_batched": lambda m: fg.matmul_forward(m(2, 3, 4), m(4, 5)),
    "unary_softcap": lambda m: fg.unary_forward("softcap", m(17, 3), (2.0,)),
    "lerp_broadcast": lambda m: fg.lerp_forward(m(4, 5), m(1, 5), 0.25),
    "axpby_backward": lambda m: fg.axpby_backward(m(3, 4), (3, 4), (1, 4), 0.5, 2.0),
    "linear_act_gelu": lambda m: fg.linear_act_forward(m(6, 5), m(4, 5), m(4), act="gelu"),
    "layer_norm": lambda m: fg.norm_forward(m(5, 8), m(8), m(8)),
}


@needs_fast
@pytest.mark.parametrize("kind,dtype", [("numpy", "float32"), ("numpy", "float64"), ("numpy", "float16"),
                                        ("torch", "float32"), ("torch", "float64"), ("torch", "bfloat16")])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_outputs(path, rng, case, kind, dtype):
    if kind == "torch" and torch is None:
        pytest.skip("torch not installed")
    seed = int(rng.integers(2**31))
    outs = {}
    for p in ("py", "fast", "fast"):  # the second fast run finds the plan in the fast cache
        path(p)
        before = FAST.stats()
        try:
            got = CASES[case](_arrays(np.random.default_rng(seed), kind, dtype))
        except fg.FastgradError as e:  # a dtype the op does not take: refused alike
            got = ("refused", e.status, str(e))
        after = FAST.stats()
        if p == "py":
            assert after == before, "the Python path went through the module"
        else:
            assert after["fallbacks"] == before["fallbacks"], "the compiled path handed the call back"
        got = got if isinstance(got, tuple) else (got,)
        outs.setdefault(p, []).append(got)
    ref = outs["py"][0]
    for got in outs["fast"]:
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            if isinstance(b, str) or isinstance(b, int) or b is None:
                assert a == b
            else:
                assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
                assert np.array_equal(_np(a), _np(b), equal_nan=True), case


@needs_fast
@pytest.mark.parametrize("kind", ["numpy", pytest.param("torch", marks=needs_torch)])
def test_workspace_ops_same_outputs(path, rng, kind):
    """Ops whose plans ask for a workspace (the fused cross-entropy): the compiled path takes it
    from the same allocator (ops._workspace) and gives the same bits."""
    seed = int(rng.integers(2**31))
    res = {}
    for p in ("py", "fast", "fast"):
        path(p)
        g = np.random.default_rng(seed)
        h, w = g.standard_normal((9, 16)), g.standard_normal((33, 16))
        t = g.integers(0, 33, size=9)
        if kind == "torch":
            h, w, t = torch.from_numpy(h).float(), torch.from_numpy(w).float(), torch.from_numpy(t)
        else:
            h, w = h.astype(np.float32), w.astype(np.float32)
        plan = ops.plan_info("linear_cross_entropy", dict(h=h, w=w, target=t, loss=h[0, :1] * 0, dh=h * 0, dw=w * 0),
                             options=fg.logp_options())
        assert plan["workspace_bytes"] > 0
        outs = fg.linear_cross_entropy_onepass(h, w, t)
        res.setdefault(p, []).append((plan, [_np(o) for o in outs]))
    (plan_py, ref), = res["py"]
    plan_py.pop("alignment")  # of fresh outputs: it varies from call to call on either path
    for plan, outs in res["fast"]:
        plan.pop("alignment")
        assert plan == plan_py
        for a, b in zip(outs, ref):
            assert (a is None) == (b is None)
            if a is not None:
                assert np.array_equal(a, b)


def _refusal(fn):
    with pytest.raises(Exception) as e:
        fn()
    return type(e.value), str(e.value), getattr(e.value, "status", None)


@needs_fast
def test_same_refusals(path):
    """Each bad call raises the same exception type and message on both paths, the first time
    (the plan is made) and again (the compiled path finds it, or hands the call back)."""
    f32 = np.float32
    x, w, w6 = np.ones((4, 6), f32), np.ones((3, 6), f32), np.ones((6, 6), f32)
    bad = {
        "shape": lambda: fg.linear_forward(x, np.ones((3, 5), f32)),
        "out shape": lambda: fg.linear_forward(x, w, out=np.empty((4, 4), f32)),
        "dtype mix": lambda: fg.linear_forward(x, w.astype(np.float64)),
        "dtype int8": lambda: fg.linear_forward(x.astype(np.int8), w.astype(np.int8)),
        "big-endian": lambda: fg.linear_forward(x.astype(">f4"), w.astype(">f4")),
        "broadcast view": lambda: fg.linear_forward(np.broadcast_to(np.ones(6, f32), (4, 6)), w),
        "not an array": lambda: ops.run("linear_forward", dict(x=[[1.0] * 6] * 4, w=w, y=np.empty((4, 3), f32))),
        "operand name": lambda: ops.run("linear_forward", dict(x=x, w=w, bias=None, y=np.empty((4, 3), f32))),
        "operand count": lambda: ops.run("linear_forward", [x, w, np.empty((4, 3), f32)]),
        "unknown op": lambda: ops.run("linear_sideways", dict(x=x)),
        "options type": lambda: ops.run("unary_forward", dict(x=x, y=np.empty_like(x)), options=fg.logp_options()),
        "options missing": lambda: ops.run("linear_forward", dict(x=x, w=w, y=np.empty((4, 3), f32)),
                                           options=fg.logp_options()),
        "alias": lambda: fg.linear_forward(x, w6, out=x),
        "no operands": lambda: ops.run("linear_forward", dict()),
    }
    if torch is not None:
        tx, tw, tw6 = torch.ones(4, 6), torch.ones(3, 6), torch.ones(6, 6)
        bad["torch shape"] = lambda: fg.linear_forward(tx, torch.ones(3, 5))
        bad["torch uint8"] = lambda: fg.linear_forward(tx.to(torch.uint8), tw.to(torch.uint8))
        bad["torch alias"] = lambda: fg.linear_forward(tx, tw6, out=tx)
        bad["torch expanded"] = lambda: fg.linear_forward(torch.ones(6).expand(4, 6), tw)
    for name, fn in bad.items():
        path("py")
        want = _refusal(fn)
        path("fast")
        assert _refusal(fn) == want, name
        before = FAST.stats()
        assert _refusal(fn) == want, name + " (again)"
        if "alias" in name:  # a plan made, refused by fg_plan_run: raised by the module itself
            assert want[2] == _lib.STATUS_CODE["FG_ERR_ALIAS"]
            assert FAST.stats()["hits"] == before["hits"] + 1


@needs_fast
def test_cache_many_shapes(path, monkeypatch):
    """Many shapes, each run twice, with a plan cache small enough to be emptied several times:
    every result right, a plan made once per shape between emptyings, and the fast cache never
    holding a plan the Python cache no longer owns."""
    path("fast")
    monkeypatch.setattr(ops, "_MAX_PLANS", 7)
    ctx = _lib.context(_lib.BACKEND_CPU)
    ctx.clear_plans()
    assert ctx.fast == {}
    rng = np.random.default_rng(0)
    for rep in range(2):
        for n in range(1, 30):
            k, m = 1 + n % 5, 2 + n % 3
            x, w = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((m, k)).astype(np.float32)
            y, y2 = np.empty((n, m), np.float32), np.empty((n, m), np.float32)
            before = FAST.stats()
            fg.linear_forward(x, w, out=y)
            fg.linear_forward(x, w, out=y)  # the same pointers: found in the fast cache
            after = FAST.stats()
            fg.linear_forward(x, w, out=y2)
            assert after["misses"] - before["misses"] <= 1 and after["hits"] - before["hits"] >= 1
            assert np.allclose(y, x @ w.T, rtol=1e-5, atol=1e-5) and np.array_equal(y, y2)
            live = {id(e.plan) for e in ctx.plans.values()}
            assert len(ctx.fast) <= len(ctx.plans) <= 7
            assert all(id(v[2]) in live and v[0] == v[2].handle.value for v in ctx.fast.values())
    ctx.clear_plans()
    assert ctx.fast == {}


@needs_fast
def test_views_and_alignment(path):
    """Strided and offset views: the key holds the alignment class and element strides, so a view
    aligned less than an earlier call's gets its own plan, and the answers match the Python path
    (the outputs are the same buffers on both paths: their alignment picks kernels too)."""
    buf = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    w = np.ones((3, 8), np.float32)
    y1, y2 = np.empty((4, 3), np.float32), np.empty((8, 3), np.float32)
    res = {}
    for p in ("py", "fast", "fast"):
        path(p)
        outs = []
        for off in (0, 1, 2, 4, 8, 64):
            x = buf[off:off + 64].reshape(8, 8)[:, ::2]  # column stride 2
            x2 = buf[off:off + 96].reshape(12, 8)[::3]  # row stride 24
            outs.append(fg.linear_forward(x2, w, out=y1).copy())
            outs.append(ops.plan_info("linear_forward", dict(x=x2, w=w, y=y1))["alignment"])
            try:
                outs.append(fg.linear_forward(x, w[:, :4], out=y2).copy())
            except fg.FastgradError as e:  # no unit stride: refused alike
                outs.append((e.status, str(e)))
        res.setdefault(p, []).append(outs)
    assert len({res["py"][0][1 + 3 * i] for i in range(6)}) >= 3  # several alignment classes
    for outs in res["fast"]:
        for a, b in zip(outs, res["py"][0]):
            assert np.array_equal(a, b)


@needs_fast
def test_tf32_flag_reaches_the_plan(path):
    x, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    path("fast")
    try:
        fg.set_allow_tf32(True)
        p = ops.run("linear_forward", dict(x=x, w=w, y=np.empty((2, 4), np.float32)))
        assert p.desc.flags & _lib.PLAN_ALLOW_TF32
    finally:
        fg.set_allow_tf32(False)
    p = ops.run("linear_forward", dict(x=x, w=w, y=np.empty((2, 4), np.float32)))
    assert not p.desc.flags & _lib.PLAN_ALLOW_TF32


@needs_fast
def test_threads_have_their_own_contexts(path):
    """A context is used by one thread at a time: a call from another thread finds that thread's."""
    path("fast")
    x, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    fg.linear_forward(x, w)
    seen = {}

    def work():
        seen["y"] = fg.linear_forward(x, w)
        seen["ctx"] = _lib.context(_lib.BACKEND_CPU)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["ctx"] is not _lib.context(_lib.BACKEND_CPU)
    assert len(seen["ctx"].fast) == 1 and np.array_equal(seen["y"], np.full((2, 4), 3, np.float32))


@needs_fast
@needs_torch
def test_cuda_stream_logic_on_the_cpu(path, monkeypatch):
    """The CUDA branch (placement, the device's context, setting its stream when it changed) run
    on the CPU: tensors that say they are on cuda:1, a stand-in for that device's context (a CPU
    context whose set_stream records what it is given) and a stand-in current stream. Both paths
    must set the same streams on the same context and give the same outputs."""

    class OnGpu(torch.Tensor):
        @property
        def is_cuda(self):
            return True

        def get_device(self):
            return 1

        @property
        def device(self):
            return torch.device("cuda", 1)

    class Recording(_lib.Context):
        def set_stream(self, stream):
            if stream != self.stream:
                self.set_calls.append(stream)
                self.stream = stream

    real_context = _lib.context
    asked = []

    def context(backend, device=0):
        if backend == _lib.BACKEND_CUDA:
            asked.append(device)
            return fake
        return real_context(backend, device)

    current = {"stream": 0x1000}
    monkeypatch.setattr(_lib, "context", context)
    monkeypatch.setattr(ops, "_raw_stream", lambda device: current["stream"] + device)
    def empty_256(ref, shape, dtype=None):
        """A CPU output at a 256-byte boundary: the plan key holds the pointers' alignment class, so
        outputs wherever the allocator puts them would make a second plan now and then."""
        dt = dtype or ref.dtype
        n = int(np.prod(shape)) * torch.tensor([], dtype=dt).element_size()
        buf = torch.empty(n + 256, dtype=torch.uint8)
        off = -buf.data_ptr() % 256
        return buf[off:off + n].view(dt).view(shape)

    monkeypatch.setattr(ops, "_empty_like_family", empty_256)
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((5, 4)).astype(np.float32)).as_subclass(OnGpu)
    w = torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32)).as_subclass(OnGpu)
    results = {}
    try:
        for p in ("py", "fast"):
            FAST.forget_contexts()  # the compiled path asks for the stand-in afresh
            fake = Recording(_lib.BACKEND_CPU)
            fake.set_calls = []
            asked.clear()
            path(p)
            current["stream"] = 0x1000
            ys = [fg.linear_forward(x, w), fg.linear_forward(x, w)]
            current["stream"] = 0x2000
            ys.append(fg.linear_forward(x, w))
            results[p] = (fake.set_calls, set(asked), [y.numpy() for y in ys], len(fake.plans))
    finally:
        FAST.forget_contexts()
    assert results["fast"][0] == results["py"][0] == [0x1001, 0x2001]
    assert results["fast"][1] == results["py"][1] == {1}
    for a, b in zip(results["fast"][2], results["py"][2]):
        assert np.array_equal(a, b)
    assert results["fast"][3] == results["py"][3] == 1

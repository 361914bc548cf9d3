"""The torch C++ extension (fastgrad._torchext_ops, python/fastgrad/_torchext.cpp: fg.Linear and
the row norm with their autograd in C++, the normalization family's functional entries) against
the Python it replaces. For Linear, against the Python autograd.Function: the same output and
gradients, bit for bit, for every dtype, awkward shapes, no bias, non-contiguous and
non-collapsing inputs (the retry on contiguous copies), a broadcast gradient, only some
gradients asked for, no_grad, several threads; against torch autograd on float64 copies at the
dtype's tolerance; the cases it hands back to Python (the same errors as before); the
dispatcher ops fastgrad_ext::linear / linear_backward; and a check that fails when the
extension is built beside the library but fg.Linear does not use it. For the norms: norm.py's
norm_forward / norm_backward / batch_norm_forward / batch_norm_backward and the autograd of
LayerNorm / RMSNorm (fused residual, dropout, weights of another dtype) give the same bits
through the extension as through the Python path, the stats counters show which ran, the options
and accumulate key the plans, and what the extension declines runs in Python. For linear +
activation: fg.linear_act through the extension against LinearActFunction, bit for bit, for f32 /
f64 / bf16, every activation, with and without a bias, each saved form (pre, slope, nothing,
"auto" on both sides of its threshold), only some gradients asked for, two backwards through a
retained graph, awkward layouts and batched weights; the backward node's name, the toggle, and
the cases handed back to Python. For the encoder layer: fg.TransformerEncoderLayer (pre- and
post-norm, causal, key padding) and fg.PatchTSTEncoder (BatchNorm, residual attention) through the
extension against EncoderLayerFunction, bit for bit (outputs, gradients, running statistics) with
dropout, both saving policies, some gradients frozen, a retained graph, evaluation, the node's name,
the toggle and a refusal handed back to Python. Skipped, with the reason, where torch is missing or
the extension is not built."""
import contextlib
import copy
import os
import threading

import pytest
from conftest import data

torch = pytest.importorskip("torch")
import fastgrad as fg  # noqa: E402
from fastgrad import _lib, _torchext, autograd  # noqa: E402
from fastgrad import encoder as fgenc  # noqa: E402
from fastgrad import norm as fgnorm  # noqa: E402

from torch_helpers import DEVICES, DTYPES, err, tol  # noqa: E402

EXT = _torchext.MODULE
needs_ext = pytest.mark.skipif(EXT is None, reason=f"fastgrad._torchext_ops not in use: {_torchext.WHY_NOT}")


def _disabled():
    return any(os.environ.get(v, "") not in ("", "0") for v in ("FASTGRAD_NO_EXT", "FASTGRAD_NO_TORCHEXT"))


def test_built_extension_is_used():
    """Fails when _torchext_ops.so lies beside the library (or in the package) but fg.Linear runs
    the Python Function: a forward and a backward through fg.Linear must both go through C++."""
    lib_dir = os.path.dirname(os.path.abspath(_lib.lib._name))
    built = [p for p in (os.path.join(lib_dir, _torchext.NAME + ".so"),
                         os.path.join(os.path.dirname(_torchext.__file__), _torchext.NAME + ".so")) if os.path.exists(p)]
    if not built or _disabled():
        pytest.skip("the extension is not built here, or FASTGRAD_NO_EXT / FASTGRAD_NO_TORCHEXT is set")
    assert EXT is not None, f"{built[0]} is built but not in use: {_torchext.WHY_NOT}"
    assert autograd._ext_linear is not None, "the extension loaded but fg.linear does not route through it"
    assert autograd._ext_linear_act is not None, "the extension loaded but fg.linear_act does not route through it"
    assert fgnorm._ext is not None, "the extension loaded but the norms do not route through it"
    assert fgenc._ext_encoder is not None, "the extension loaded but the encoder layers do not route through it"
    lin = fg.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    before = EXT.stats()
    y = lin(x)
    assert type(y.grad_fn).__module__ == "fastgrad._torchext_ops", f"fg.Linear's grad_fn is {type(y.grad_fn)}"
    y.sum().backward()
    after = EXT.stats()
    assert after["forward"] == before["forward"] + 1 and after["backward"] == before["backward"] + 1
    assert after["fallback"] == before["fallback"]


def _run(path, x, w, b, dy, need=(True, True, True)):
    """y and the gradients asked for through fg.linear on fresh leaves, on the given path."""
    autograd.use_torchext(path == "ext")
    try:
        leaves = [t.detach().clone().requires_grad_(n) if t is not None else None for t, n in zip((x, w, b), need)]
        before = EXT.stats()
        y = fg.linear(*leaves)
        y.backward(dy)
        used = EXT.stats()["forward"] - before["forward"]
        assert used == (1 if path == "ext" else 0), f"{path} path: {used} extension forwards"
        return y.detach(), [t.grad if t is not None else None for t in leaves]
    finally:
        autograd.use_torchext(True)


def _same(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert torch.equal(a, b), f"max difference {(a.double() - b.double()).abs().max().item()}"


def _leaf(rng, shape, dtype, device):
    return torch.from_numpy(data(rng, shape)).to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,k,m,bias", [((1,), 1, 1, True), ((3,), 17, 5, True), ((2, 9), 127, 33, False),
                                           ((1,), 1000, 300, True), ((4, 1, 5), 64, 48, True), ((257,), 33, 1, True)])
@needs_ext
def test_linear_matches_python_path_and_f64(rng, device, dtype, lead, k, m, bias):
    if device == "cuda" and not EXT.HAS_CUDA:  # on the GPU machine (FG_REQUIRE_CUDA=1) a failure
        assert os.environ.get("FG_REQUIRE_CUDA", "") in ("", "0"), "the extension was built without CUDA"
        pytest.skip("the extension was built without CUDA (torch without CUDA, or no CUDA headers)")
    x, w = _leaf(rng, lead + (k,), dtype, device), _leaf(rng, (m, k), dtype, device)
    b = _leaf(rng, (m,), dtype, device) if bias else None
    dy = _leaf(rng, lead + (m,), dtype, device)
    y, g = _run("ext", x, w, b, dy)
    y_py, g_py = _run("py", x, w, b, dy)
    _same(y, y_py)
    for a, r in zip(g, g_py):
        _same(a, r)
    # torch autograd on float64 copies, the dtype's tolerance, and every element bounded
    ref_in = [t.double().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    ref = torch.nn.functional.linear(*ref_in)
    ref.backward(dy.double())
    t = tol(dtype)
    for out, r in zip([y] + g, [ref] + [t_.grad if t_ is not None else None for t_ in ref_in]):
        if r is None:
            assert out is None
            continue
        assert err(out, r) <= t, f"relative error {err(out, r):.3g} > {t}"
        scale = r.abs().max().item() + 1e-30
        assert ((out.double().cpu() - r.cpu()).abs().max().item() / scale) <= 50 * t


@pytest.mark.parametrize("need", [(True, False, False), (False, True, False), (False, False, True),
                                  (False, True, True), (True, True, False)])
@needs_ext
def test_only_requested_gradients(rng, need):
    x, w, b = _leaf(rng, (5, 12), torch.float32, "cpu"), _leaf(rng, (7, 12), torch.float32, "cpu"), \
        _leaf(rng, (7,), torch.float32, "cpu")
    dy = _leaf(rng, (5, 7), torch.float32, "cpu")
    before = EXT.stats()
    y, g = _run("ext", x, w, b, dy, need)
    after = EXT.stats()
    assert after["backward"] == before["backward"] + 1
    assert [after[k] - before[k] for k in ("dx", "dw", "db")] == [int(n) for n in need]
    y_py, g_py = _run("py", x, w, b, dy, need)
    _same(y, y_py)
    for a, r, n in zip(g, g_py, need):
        assert (a is not None) == n
        _same(a, r)


@needs_ext
def test_non_contiguous_and_non_collapsing_inputs(rng):
    """A transposed weight and an x whose leading dims do not collapse into one stride (the
    library refuses the layout: both paths retry on contiguous copies)."""
    big = _leaf(rng, (5, 4, 24), torch.float32, "cpu")
    x = big.transpose(0, 1)  # [4, 5, 24], strides (24, 96, 1): the leading dims do not collapse
    w = _leaf(rng, (24, 10), torch.float32, "cpu").t()  # [10, 24], column-major
    b = _leaf(rng, (20,), torch.float32, "cpu")[::2]  # [10], stride 2
    dy = _leaf(rng, (4, 5, 10), torch.float32, "cpu")
    y, g = _run("ext", x, w, b, dy)
    y_py, g_py = _run("py", x, w, b, dy)
    _same(y, y_py)
    for a, r in zip(g, g_py):
        _same(a, r)
    ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
    assert err(y, ref) <= tol(torch.float32)


@needs_ext
def test_broadcast_gradient_and_mid_allocation_views(rng):
    """y.sum() hands the backward a broadcast (zero-stride) gradient; x starting one element into
    its allocation declares a smaller alignment: both paths plan and copy alike."""
    x0 = _leaf(rng, (6, 9), torch.float32, "cpu")
    w, b = _leaf(rng, (3, 9), torch.float32, "cpu"), _leaf(rng, (3,), torch.float32, "cpu")
    outs = []
    for path in ("ext", "py"):
        autograd.use_torchext(path == "ext")
        try:
            base = torch.empty(55).requires_grad_(False)
            x = base[1:].view(6, 9).copy_(x0).requires_grad_(True)
            assert x.data_ptr() % 8 == 4
            ww, bb = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            y = fg.linear(x, ww, bb)
            y.sum().backward()
            outs.append([y.detach(), x.grad, ww.grad, bb.grad])
        finally:
            autograd.use_torchext(True)
    for a, r in zip(*outs):
        _same(a, r)


@needs_ext
def test_no_grad_and_inference(rng):
    x, w, b = _leaf(rng, (3, 8), torch.float64, "cpu"), _leaf(rng, (4, 8), torch.float64, "cpu"), \
        _leaf(rng, (4,), torch.float64, "cpu")
    ref = torch.nn.functional.linear(x, w, b)
    lin = fg.Linear(8, 4, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
        y = lin(x)
    assert y.grad_fn is None and not y.requires_grad
    assert err(y, ref) <= tol(torch.float64)
    with torch.inference_mode():
        y2 = lin(x)
    assert torch.equal(y, y2)


@needs_ext
def test_handed_back_cases_raise_as_before(rng):
    """What the extension does not take goes to the Python Function: the same exceptions."""
    w = torch.randn(4, 8)
    cases = [(torch.randn(3, 7), w, None),  # K disagrees
             (torch.randn(3, 8, dtype=torch.float64), w, None),  # dtypes disagree
             (torch.ones(3, 8, dtype=torch.int32), w.int(), None),  # a dtype fastgrad does not take
             (torch.randn(3, 8), w, torch.randn(5))]  # bias length
    for x, ww, b in cases:
        errs = []
        for path in ("ext", "py"):
            autograd.use_torchext(path == "ext")
            try:
                with pytest.raises(Exception) as e:
                    fg.linear(x, ww, b)
                errs.append((type(e.value), str(e.value)))
            finally:
                autograd.use_torchext(True)
        assert errs[0] == errs[1]


@needs_ext
def test_tensor_subclass_goes_to_python(rng):
    class Sub(torch.Tensor):
        pass

    x = torch.randn(2, 8).as_subclass(Sub)
    w = torch.randn(3, 8)
    before = EXT.stats()
    y = fg.linear(x, w)
    assert EXT.stats()["fallback"] == before["fallback"] + 1
    assert torch.equal(y.as_subclass(torch.Tensor), fg.linear(x.as_subclass(torch.Tensor), w))


@needs_ext
def test_threads(rng):
    """Each thread has its own contexts and plans: concurrent forwards and backwards agree with
    one thread's."""
    x, w, b = _leaf(rng, (16, 32), torch.float32, "cpu"), _leaf(rng, (24, 32), torch.float32, "cpu"), \
        _leaf(rng, (24,), torch.float32, "cpu")
    dy = _leaf(rng, (16, 24), torch.float32, "cpu")
    want = _run("ext", x, w, b, dy)
    bad = []

    def work():
        for _ in range(50):
            leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
            y = fg.linear(*leaves)
            y.backward(dy)
            if not (torch.equal(y.detach(), want[0]) and all(torch.equal(t.grad, g) for t, g in zip(leaves, want[1]))):
                bad.append(1)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@needs_ext
def test_dispatcher_ops(rng):
    """torch.ops.fastgrad_ext.linear (autograd in C++) and linear_backward: the same bits."""
    x, w, b = _leaf(rng, (5, 12), torch.float32, "cpu"), _leaf(rng, (7, 12), torch.float32, "cpu"), \
        _leaf(rng, (7,), torch.float32, "cpu")
    dy = _leaf(rng, (5, 7), torch.float32, "cpu")
    y_py, g_py = _run("py", x, w, b, dy)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y = torch.ops.fastgrad_ext.linear(*leaves)
    y.backward(dy)
    _same(y.detach(), y_py)
    for t, r in zip(leaves, g_py):
        _same(t.grad, r)
    dx, dw, db = torch.ops.fastgrad_ext.linear_backward(dy, x, w, True, False, True)
    _same(dx, g_py[0])
    _same(db, g_py[2])
    assert dw.numel() == 0


# ------------------------------------------------------------------ the normalization family

@contextlib.contextmanager
def _path(path):
    """The extension on ("ext") or off ("py") for Linear and the norms."""
    autograd.use_torchext(path == "ext")
    fgnorm.use_torchext(path == "ext")
    try:
        yield
    finally:
        autograd.use_torchext(True)
        fgnorm.use_torchext(True)


def _outcome(fn):
    """fn()'s result, or its exception's (type, message)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - compared between the paths
        return "raised", (type(e), str(e))


def _same_outcome(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "raised":
        assert a[1] == b[1]
        return
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1]):
        _same(x, y)


def _both(fn, counter=None):
    """fn() through the extension and through Python: the same outcome, bit for bit; with counter,
    the extension path moved that stats counter by one (when it did not raise) and Python's not."""
    before = EXT.stats()
    with _path("ext"):
        ext = _outcome(fn)
    mid = EXT.stats()
    with _path("py"):
        py = _outcome(fn)
    after = EXT.stats()
    if counter is not None:
        if ext[0] == "ok":
            assert mid[counter] == before[counter] + 1, f"{counter}: the extension did not run the call"
        assert after[counter] == mid[counter], f"{counter}: the Python path ran the extension"
    _same_outcome(ext, py)
    return ext


AFFINE = ["wb", "w", "none"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("residual,p", [(False, 0.0), (True, 0.0), (True, 0.3)])
@pytest.mark.parametrize("affine", AFFINE)
@needs_ext
def test_norm_functional_matches_python(rng, dtype, kind, residual, p, affine):
    x = _leaf(rng, (3, 5, 40), dtype, "cpu")
    r = _leaf(rng, (3, 5, 40), dtype, "cpu") if residual else None
    w = _leaf(rng, (40,), dtype, "cpu") if affine != "none" else None
    b = _leaf(rng, (40,), dtype, "cpu") if affine == "wb" else None
    fwd = _both(lambda: fgnorm.norm_forward(x, w, b, r, kind, 1e-5, p, 77, 5), "norm_forward")
    assert fwd[0] == "ok"
    y, s, mean, rstd = fwd[1]
    assert (s is not None) == residual and (mean is not None) == (kind == "layer") and rstd is not None
    assert rstd.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    _both(lambda: fgnorm.norm_forward(x, w, b, r, kind, 1e-5, p, 77, 5, keep_sum=False, save_stats=False),
          "norm_forward")
    xs = s if s is not None else x
    dy = _leaf(rng, (3, 5, 40), dtype, "cpu")
    ds = _leaf(rng, (3, 5, 40), dtype, "cpu") if residual else None
    for need in [(True, residual, True, True), (False, False, True, False), (True, False, False, False)]:
        bwd = _both(lambda: fgnorm.norm_backward(dy, xs, w, mean, rstd, ds, kind, 1e-5, p, 77, 5, need,
                                                 has_bias=b is not None), "norm_backward")
        assert bwd[0] == "ok"
        assert [g is not None for g in bwd[1]] == [need[0], need[1], need[2] and w is not None,
                                                  need[3] and b is not None]
    # statistics recomputed from x (mean / rstd absent), and dw / db in f32 for low-precision data
    _both(lambda: fgnorm.norm_backward(dy, xs, w, None, None, ds, kind, 1e-5, p, 77, 5, (True, True, True, True),
                                       has_bias=True, param_dtype=torch.float32), "norm_backward")


@needs_ext
def test_norm_single_row_and_f32_weights_with_bf16(rng):
    """A single row ([D]: statistics of shape [1]) and f32 weights with bf16 x: the same outcome
    (values, or the same error) either way."""
    x = _leaf(rng, (64,), torch.float32, "cpu")
    out = _both(lambda: fgnorm.norm_forward(x, None, None), "norm_forward")
    assert out[1][2].shape == (1,) and out[1][3].shape == (1,)
    xb = _leaf(rng, (4, 64), torch.bfloat16, "cpu")
    w32, b32 = _leaf(rng, (64,), torch.float32, "cpu"), _leaf(rng, (64,), torch.float32, "cpu")
    _both(lambda: fgnorm.norm_forward(xb, w32, b32))
    y, _, mean, rstd = fgnorm.norm_forward(xb, w32.bfloat16(), b32.bfloat16())
    dy = _leaf(rng, (4, 64), torch.bfloat16, "cpu")
    _both(lambda: fgnorm.norm_backward(dy, xb, w32.bfloat16(), mean, rstd, need=(True, False, True, True),
                                       param_dtype=torch.float32), "norm_backward")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("residual,p", [(False, 0.0), (True, 0.0), (True, 0.25)])
@pytest.mark.parametrize("affine,running", [(True, True), (False, True), (True, False)])
@needs_ext
def test_batch_norm_functional_matches_python(rng, dtype, training, residual, p, affine, running):
    if not training and not running:
        pytest.skip("evaluation needs running statistics")
    x = _leaf(rng, (6, 7, 12), dtype, "cpu")
    r = _leaf(rng, (6, 7, 12), dtype, "cpu") if residual else None
    w = _leaf(rng, (12,), dtype, "cpu") if affine else None
    b = _leaf(rng, (12,), dtype, "cpu") if affine else None
    sdt = torch.float64 if dtype == torch.float64 else torch.float32
    rm0, rv0 = _leaf(rng, (12,), sdt, "cpu"), _leaf(rng, (12,), sdt, "cpu").abs() + 0.5
    stats = []

    def fwd():
        rm, rv = (rm0.clone(), rv0.clone()) if running else (None, None)
        out = fgnorm.batch_norm_forward(x, w, b, rm, rv, r, training, 0.1, 1e-5, p, 99, 3)
        stats.append((rm, rv))
        return out

    res = _both(fwd, "batch_norm_forward")
    assert res[0] == "ok", res
    y, s, mean, rstd = res[1]
    for a, c in zip(*stats):  # the running statistics, updated in place alike
        _same(a, c)
    xs = s if s is not None else x
    dy = _leaf(rng, (6, 7, 12), dtype, "cpu")
    for need in [(True, residual, True, True), (False, False, True, True), (True, False, False, False)]:
        _both(lambda: fgnorm.batch_norm_backward(dy, xs, w, mean, rstd, training, p, 99, 3, need,
                                                 has_bias=b is not None), "batch_norm_backward")
    if dtype == torch.bfloat16 and affine:
        _both(lambda: fgnorm.batch_norm_backward(dy, xs, w, mean, rstd, training, p, 99, 3,
                                                 param_dtype=torch.float32), "batch_norm_backward")


def _norm_autograd(path, x, r, w, b, kind, p, dy, ds, need):
    """(y, s, grads of x, r, w, b) through norm._norm on fresh leaves, on the given path; ds None:
    s's gradient is only what autograd materializes."""
    leaves = [t.detach().clone().requires_grad_(n) if t is not None else None for t, n in zip((x, r, w, b), need)]
    with _path(path):
        before = EXT.stats()
        y, s = fgnorm._norm(*leaves, kind, 1e-5, p, torch.tensor(4242) if p > 0 else None)
        ran = EXT.stats()["norm_autograd"] - before["norm_autograd"]
        assert ran == (1 if path == "ext" else 0), f"{path} path: {ran} extension norms"
        if path == "ext" and y.requires_grad:
            assert type(y.grad_fn).__module__ == "fastgrad._torchext_ops"
            assert type(y.grad_fn).__name__ == "NormFunctionBackward"
        loss = (y.float() * dy.float()).sum()
        if ds is not None:
            loss = loss + (s.float() * ds.float()).sum()
        if loss.requires_grad:
            mid = EXT.stats()["norm_backward"]
            loss.backward()
            ran = EXT.stats()["norm_backward"] - mid
            assert ran == (1 if path == "ext" else 0), f"{path} path: {ran} extension norm backwards"
    return [y.detach(), s.detach() if s is not None else None] + [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, None), (torch.float64, None), (torch.bfloat16, None),
                                          (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("residual,p,s_grad", [(False, 0.0, False), (True, 0.0, True), (True, 0.3, True),
                                               (True, 0.3, False)])
@pytest.mark.parametrize("affine", AFFINE)
@needs_ext
def test_norm_autograd_matches_norm_function(rng, dtype, wdtype, kind, residual, p, s_grad, affine):
    wdtype = wdtype or dtype
    x = _leaf(rng, (4, 3, 48), dtype, "cpu")
    r = _leaf(rng, (4, 3, 48), dtype, "cpu") if residual else None
    w = _leaf(rng, (48,), wdtype, "cpu") if affine != "none" else None
    b = _leaf(rng, (48,), wdtype, "cpu") if affine == "wb" and kind == "layer" else None
    dy = _leaf(rng, (4, 3, 48), dtype, "cpu")
    ds = _leaf(rng, (4, 3, 48), dtype, "cpu") if s_grad else None
    for need in [(True, True, True, True), (False, True, True, False), (True, False, False, True)]:
        got = _norm_autograd("ext", x, r, w, b, kind, p, dy, ds, need)
        want = _norm_autograd("py", x, r, w, b, kind, p, dy, ds, need)
        for a, c in zip(got, want):
            _same(a, c)


@needs_ext
def test_norm_modules_use_the_extension(rng):
    """fg.LayerNorm / fg.RMSNorm (and add_norm) go through C++ both ways; no_grad makes no graph."""
    x = torch.randn(2, 16, requires_grad=True)
    for mod in (fg.LayerNorm(16), fg.RMSNorm(16)):
        before = EXT.stats()
        y = mod(x)
        y.sum().backward()
        after = EXT.stats()
        assert after["norm_autograd"] == before["norm_autograd"] + 1
        assert after["norm_backward"] == before["norm_backward"] + 1
        assert after["norm_fallback"] == before["norm_fallback"]
    with torch.no_grad():
        y = fg.LayerNorm(16)(x)
    assert y.grad_fn is None and not y.requires_grad


@needs_ext
def test_norm_options_and_accumulate_key_the_plans(rng):
    """The same shapes with another eps, kind or dropout, or with accumulate, make another plan:
    each call agrees with Python's."""
    x, w, b = _leaf(rng, (5, 32), torch.float32, "cpu"), _leaf(rng, (32,), torch.float32, "cpu"), \
        _leaf(rng, (32,), torch.float32, "cpu")
    r = _leaf(rng, (5, 32), torch.float32, "cpu")
    for kind, eps, p, seed in [("layer", 1e-5, 0.0, 0), ("layer", 0.5, 0.0, 0), ("rms", 0.5, 0.0, 0),
                               ("layer", 1e-5, 0.5, 1), ("layer", 1e-5, 0.5, 2)]:
        _both(lambda: fgnorm.norm_forward(x, w, b, r, kind, eps, p, seed), "norm_forward")
    y, s, mean, rstd = fgnorm.norm_forward(x, w, b)
    dy = _leaf(rng, (5, 32), torch.float32, "cpu")
    with _path("ext"):
        for _ in range(3):  # an accumulating plan first; the plain one after must not reuse it
            fgnorm.norm_backward(dy, x, w, mean, rstd, accumulate=True)
            got = fgnorm.norm_backward(dy, x, w, mean, rstd)
    with _path("py"):
        want = fgnorm.norm_backward(dy, x, w, mean, rstd)
    for a, c in zip(got, want):
        _same(a, c)


@needs_ext
def test_norm_declined_cases_run_python(rng):
    """out= given, numpy operands, a tensor subclass, operands or options the extension does not
    take: Python runs (the extension's counters do not move, or norm_fallback does), with the same
    results and errors as before."""
    x, w = _leaf(rng, (3, 8), torch.float32, "cpu"), _leaf(rng, (8,), torch.float32, "cpu")
    before = EXT.stats()
    out = torch.empty(3, 8)
    y = fgnorm.norm_forward(x, w, out=out)[0]
    assert y is out
    _, _, mean, rstd = fgnorm.norm_forward(x.numpy(), w.numpy())
    dx = torch.empty(3, 8)
    got = fgnorm.norm_backward(x, x, w, out=(dx, None, None, None))
    assert got[0] is dx
    after = EXT.stats()
    assert [after[k] - before[k] for k in ("norm_forward", "norm_backward")] == [0, 0]
    with _path("py"):
        _same(y, fgnorm.norm_forward(x, w)[0])

    class Sub(torch.Tensor):
        pass

    before = EXT.stats()
    y = fg.layer_norm(x.as_subclass(Sub), w)
    after = EXT.stats()
    assert after["norm_autograd"] == before["norm_autograd"] and after["norm_forward"] == before["norm_forward"]
    assert after["norm_fallback"] >= before["norm_fallback"] + 1  # norm(), then NormFunction's norm_forward
    _same(y.as_subclass(torch.Tensor), fg.layer_norm(x, w))
    # what the extension hands back raises Python's own errors
    bad = [lambda: fgnorm.norm_forward(x, w, kind="batch"),  # a kind it does not know
           lambda: fgnorm.norm_forward(x, torch.randn(7)),  # the library refuses the weight
           lambda: fgnorm.norm_forward(x.expand(2, 3, 8)),  # a broadcast view (ops.run raises)
           lambda: fgnorm.norm_forward(x.int()),  # a dtype fastgrad does not take
           lambda: fgnorm.norm_backward(x, x, w, need=(True, True)),  # need too short
           lambda: fgnorm.batch_norm_forward(x, torch.randn(5))]
    for fn in bad:
        res = _both(fn)
        assert res[0] == "raised"
    before = EXT.stats()
    for path in ("ext", "py"):
        with _path(path), pytest.raises(Exception) as e:
            fg.layer_norm(x, torch.randn(7))
        if path == "ext":
            first = (type(e.value), str(e.value))
    assert (type(e.value), str(e.value)) == first
    assert EXT.stats()["norm_fallback"] > before["norm_fallback"]


# ------------------------------------------------------------------ linear + activation

ACTS = {"none": lambda p: p, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda p: torch.nn.functional.gelu(p, approximate="tanh"), "silu": torch.nn.functional.silu,
        "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def _act_run(path, x, w, b, act, save_pre, dy, need=(True, True, True), backwards=1):
    """(y, grads of x, w, b) through fg.linear_act on fresh leaves, on the given path, after
    `backwards` backwards of dy through one graph (retained between them). Checks that the
    extension ran the forward and every backward on "ext", and nothing on "py"."""
    leaves = [t.detach().clone().requires_grad_(n) if t is not None else None for t, n in zip((x, w, b), need)]
    with _path(path):
        before = EXT.stats()
        y = fg.linear_act(*leaves, act=act, save_pre=save_pre)
        mid = EXT.stats()
        ran = mid["linear_act_forward"] - before["linear_act_forward"]
        assert ran == (1 if path == "ext" else 0), f"{path} path: {ran} extension forwards"
        if y.requires_grad:
            assert type(y.grad_fn).__name__ == "LinearActFunctionBackward"
            assert (type(y.grad_fn).__module__ == "fastgrad._torchext_ops") == (path == "ext"), type(y.grad_fn)
            for i in range(backwards):
                y.backward(dy, retain_graph=i + 1 < backwards)
            ran = EXT.stats()["linear_act_backward"] - mid["linear_act_backward"]
            assert ran == (backwards if path == "ext" else 0), f"{path} path: {ran} extension backwards"
        assert EXT.stats()["linear_act_fallback"] == before["linear_act_fallback"]
    return [y.detach()] + [t.grad if t is not None else None for t in leaves]


def _act_same(x, w, b, act, save_pre, dy, **kw):
    """The extension and LinearActFunction: the same output and gradients, bit for bit."""
    got = _act_run("ext", x, w, b, act, save_pre, dy, **kw)
    want = _act_run("py", x, w, b, act, save_pre, dy, **kw)
    for a, c in zip(got, want):
        _same(a, c)
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("save_pre,k", [(True, 37), (False, 37), ("slope", 37), ("auto", 37), ("auto", 130)])
@pytest.mark.parametrize("bias", [True, False])
@needs_ext
def test_linear_act_matches_python_function(rng, dtype, act, save_pre, k, bias):
    """Every activation and saved form ("auto": pre up to a reduction of 128, the slope past it),
    with and without a bias: the same bits as LinearActFunction, and torch's f64 result at the
    dtype's tolerance (the pre-activation rounded to the dtype, as the op keeps it)."""
    x, w = _leaf(rng, (2, 3, k), dtype, "cpu") - 0.25, _leaf(rng, (19, k), dtype, "cpu") * (4 / k**0.5)
    b = _leaf(rng, (19,), dtype, "cpu") - 0.25 if bias else None
    dy = _leaf(rng, (2, 3, 19), dtype, "cpu")
    y = _act_same(x, w, b, act, save_pre, dy)[0]
    pre = torch.nn.functional.linear(x.double(), w.double(), b.double() if bias else None).to(dtype).double()
    ref = ACTS[act](pre)
    assert y.dtype == dtype and y.shape == ref.shape
    assert err(y, ref) <= tol(dtype)
    assert ((y.double() - ref).abs().max().item() / ref.abs().max().item()) <= 50 * tol(dtype)


@pytest.mark.parametrize("need", [(True, False, False), (False, True, False), (False, False, True),
                                  (False, True, True), (True, True, False), (True, False, True)])
@pytest.mark.parametrize("save_pre", [True, "slope", False])
@needs_ext
def test_linear_act_only_requested_gradients(rng, need, save_pre):
    x, w, b = _leaf(rng, (5, 12), torch.float32, "cpu"), _leaf(rng, (7, 12), torch.float32, "cpu"), \
        _leaf(rng, (7,), torch.float32, "cpu")
    dy = _leaf(rng, (5, 7), torch.float32, "cpu")
    got = _act_same(x, w, b, "gelu_tanh", save_pre, dy, need=need)
    assert [g is not None for g in got[1:]] == list(need)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu", "none"])
@pytest.mark.parametrize("save_pre", [True, "slope", False])
@needs_ext
def test_linear_act_retained_graph(rng, act, save_pre):
    """Two backwards through one graph: the first forms g in the saved tensor's memory, the second
    recomputes pre (relu keeps y, which is never overwritten). Gradients accumulate alike, and
    the second backward adds what the first did."""
    x, w, b = _leaf(rng, (9, 24), torch.float32, "cpu"), _leaf(rng, (10, 24), torch.float32, "cpu"), \
        _leaf(rng, (10,), torch.float32, "cpu")
    dy = _leaf(rng, (9, 10), torch.float32, "cpu")
    once = _act_run("ext", x, w, b, act, save_pre, dy)
    twice = _act_same(x, w, b, act, save_pre, dy, backwards=2)
    for g1, g2 in zip(once[1:], twice[1:]):
        assert err(g2, 2 * g1) <= 1e-6


@needs_ext
def test_linear_act_layouts_batched_weights_and_broadcast_gradient(rng):
    """Non-contiguous, non-collapsing x and a transposed weight (both paths retry on contiguous
    copies), y.sum()'s broadcast gradient, batched weights [B, M, K] with a bias per batch."""
    big = _leaf(rng, (5, 4, 24), torch.float32, "cpu")
    x = big.transpose(0, 1)
    w = _leaf(rng, (24, 10), torch.float32, "cpu").t()
    b = _leaf(rng, (20,), torch.float32, "cpu")[::2]
    dy = _leaf(rng, (4, 5, 10), torch.float32, "cpu")
    for sp in (True, "slope"):
        _act_same(x, w, b, "gelu", sp, dy)
    outs = []
    for path in ("ext", "py"):
        with _path(path):
            leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
            y = fg.linear_act(*leaves, act="silu")
            y.sum().backward()
            outs.append([y.detach()] + [t.grad for t in leaves])
    for a, c in zip(*outs):
        _same(a, c)
    xb, wb, bb = _leaf(rng, (2, 9, 16), torch.float32, "cpu"), _leaf(rng, (2, 24, 16), torch.float32, "cpu"), \
        _leaf(rng, (2, 24), torch.float32, "cpu")
    _act_same(xb, wb, bb, "gelu_tanh", "auto", _leaf(rng, (2, 9, 24), torch.float32, "cpu"))


@needs_ext
def test_linear_act_module_no_grad_and_toggle(rng):
    """fg.LinearAct runs through C++ both ways; under no_grad there is no graph; use_torchext(False)
    sends fg.linear_act to the Python Function."""
    layer = fg.LinearAct(16, 8, act="gelu")
    x = torch.randn(4, 16, requires_grad=True)
    before = EXT.stats()
    layer(x).sum().backward()
    after = EXT.stats()
    assert after["linear_act_forward"] == before["linear_act_forward"] + 1
    assert after["linear_act_backward"] == before["linear_act_backward"] + 1
    with torch.no_grad():
        y = layer(x)
    assert y.grad_fn is None and not y.requires_grad
    autograd.use_torchext(False)
    try:
        before = EXT.stats()
        y = layer(x)
        assert type(y.grad_fn).__module__ != "fastgrad._torchext_ops"
        assert EXT.stats() == before
    finally:
        autograd.use_torchext(True)
    assert autograd._ext_linear_act is not None


@needs_ext
def test_linear_act_declined_cases_run_python(rng):
    """A tensor subclass goes to the Function (linear_act_fallback counts it), with the same
    result; what the extension hands back raises the Function's own errors."""
    class Sub(torch.Tensor):
        pass

    x, w = _leaf(rng, (3, 8), torch.float32, "cpu"), _leaf(rng, (4, 8), torch.float32, "cpu")
    before = EXT.stats()
    y = fg.linear_act(x.as_subclass(Sub), w, act="tanh")
    after = EXT.stats()
    assert after["linear_act_fallback"] == before["linear_act_fallback"] + 1
    assert after["linear_act_forward"] == before["linear_act_forward"]
    _same(y.as_subclass(torch.Tensor), fg.linear_act(x, w, act="tanh"))
    bad = [lambda: fg.linear_act(x, w, act="gelu_erf"),  # an activation it does not know
           lambda: fg.linear_act(x, _leaf(rng, (4, 7), torch.float32, "cpu")),  # K disagrees (the library refuses)
           lambda: fg.linear_act(x, w.double()),  # dtypes disagree
           lambda: fg.linear_act(x, w, torch.randn(5)),  # bias length
           lambda: fg.linear_act(x.int(), w.int()),  # a dtype fastgrad does not take
           lambda: fg.linear_act(x[0, 0], w)]  # a 0-d x
    for fn in bad:
        before = EXT.stats()
        res = _both(fn)
        assert res[0] == "raised", res
        assert EXT.stats()["linear_act_fallback"] >= before["linear_act_fallback"] + 1
        assert EXT.stats()["linear_act_forward"] == before["linear_act_forward"]


# ------------------------------------------------------------------ what every entry shares


@needs_ext
def test_copy_on_write_running_statistics_are_not_shared(rng):
    """Running statistics that are a lazy (copy-on-write) clone: the op writes them, so their
    storage is materialized first, as Python's data_ptr() does; the tensor they were cloned from
    keeps its values, and both paths give the same bits."""
    if not hasattr(torch, "_lazy_clone"):
        pytest.skip("this torch has no torch._lazy_clone")
    x = _leaf(rng, (6, 12), torch.float32, "cpu")
    rm0, rv0 = _leaf(rng, (12,), torch.float32, "cpu"), _leaf(rng, (12,), torch.float32, "cpu").abs() + 0.5

    def fwd():
        rm, rv = rm0.clone(), rv0.clone()
        rm_cow, rv_cow = torch._lazy_clone(rm), torch._lazy_clone(rv)
        y, _, mean, rstd = fgnorm.batch_norm_forward(x, None, None, rm_cow, rv_cow, training=True)
        return y, mean, rstd, rm_cow, rv_cow, rm, rv

    res = _both(fwd, "batch_norm_forward")
    assert res[0] == "ok"
    _same(res[1][5], rm0)
    _same(res[1][6], rv0)
    assert not torch.equal(res[1][3], rm0)


@needs_ext
def test_functorch_transforms_run_python():
    """Under torch.func transforms the autograd entries hand the call back: torch.autograd.Function
    raises its own error there (the same either way), also for operands that are not wrapped."""
    x, w, lw = torch.randn(3, 8), torch.randn(8), torch.randn(4, 8)
    t = torch.tensor(1.0)
    calls = [lambda: torch.func.grad(lambda x: fg.layer_norm(x, w).sum())(x),
             lambda: torch.func.grad(lambda t: (fg.layer_norm(x, w) * t).sum())(t),
             lambda: torch.func.grad(lambda t: (fg.linear_act(x, lw) * t).sum())(t),
             lambda: torch.func.grad(lambda t: (fg.linear(x, lw) * t).sum())(t),
             lambda: torch.func.vmap(lambda x: fg.linear(x, lw))(x.view(3, 1, 8))]
    for fn in calls:
        res = _both(fn)
        assert res[0] == "raised", res


@needs_ext
def test_extension_without_linear_act_is_not_used_for_it(monkeypatch):
    """An extension module built before linear_act (configure takes it: the same library version):
    use_torchext routes fg.linear through it and leaves fg.linear_act to Python, as norm.py does for
    a module without the norms."""
    import types
    stale = types.SimpleNamespace(linear=EXT.linear)
    monkeypatch.setattr(_torchext, "MODULE", stale)
    try:
        autograd.use_torchext(True)
        assert autograd._ext_linear is EXT.linear and autograd._ext_linear_act is None
        fgnorm.use_torchext(True)
        assert fgnorm._ext is None
    finally:
        monkeypatch.undo()
        autograd.use_torchext(True)
        fgnorm.use_torchext(True)
    assert autograd._ext_linear_act is not None and fgnorm._ext is not None


@needs_ext
def test_forward_mode_ad_runs_python():
    """An operand with a forward-mode AD tangent: the autograd entries hand the call back, and the
    Function raises its own error (it has no jvp), the same either way."""
    import torch.autograd.forward_ad as fwAD
    x, w, lw = torch.randn(3, 8), torch.randn(8), torch.randn(4, 8)

    def dual(f, which=0):
        def run():
            with fwAD.dual_level():
                args = [x, w, lw]
                args[which] = fwAD.make_dual(args[which], torch.randn_like(args[which]))
                return f(*args)
        return run

    calls = [dual(lambda x, w, lw: fg.layer_norm(x, w)), dual(lambda x, w, lw: fg.layer_norm(x, w), 1),
             dual(lambda x, w, lw: fg.add_norm(x, x, w)), dual(lambda x, w, lw: fg.linear_act(x, lw)),
             dual(lambda x, w, lw: fg.linear_act(x, lw), 2), dual(lambda x, w, lw: fg.linear(x, lw), 2)]
    for fn in calls:
        res = _both(fn)
        assert res[0] == "raised", res


# ------------------------------------------------------------------ the custom ops' C++ kernels

from fastgrad import torch_ops  # noqa: E402

needs_kernels = pytest.mark.skipif(not torch_ops.KERNELS,
                                   reason="the custom ops' C++ kernels are not registered (no extension, or "
                                          "FASTGRAD_NO_OP_KERNELS)")


def _same_layout(a, b):
    """_same, and the same strides (the fake kernels promise inductor the Python functions')."""
    _same(a, b)
    assert a.stride() == b.stride(), f"strides {a.stride()} against {b.stride()}"


def _kernel_cases(rng, device, dtype):
    """(op name, args) for each op the extension has kernels for, at awkward shapes; f64 on CUDA
    only Linear's (the CUDA backend runs no other f64 family: those refuse before any kernel)."""
    t = lambda *s: _leaf(rng, s, dtype, device)  # noqa: E731
    x, w, b, dy = t(3, 5, 33), t(17, 33), t(17), t(3, 5, 17)
    if device == "cuda" and dtype == torch.float64:
        return [("linear", (x, w, b)), ("linear", (x.transpose(0, 1), w, None)),
                ("linear_backward", (dy, x, w, True, True, True)), ("linear_backward", (dy, x, w, False, True, False))]
    pre = t(3, 5, 17)
    xn, wn, bn = t(4, 2, 48), t(48), t(48)
    dyn, r = t(4, 2, 48), t(4, 2, 48)
    seed = torch.tensor([1234], dtype=torch.int64)
    y, s, mean, rstd = torch_ops._PY_FN["norm"](xn, r, wn, bn, "layer", 1e-5, 0.25, seed, 7)
    _, _, _, rstd_rms = torch_ops._PY_FN["norm"](xn, None, wn, None, "rms", 1e-6, 0.0, None, 0)
    wn32 = wn.float() if dtype in (torch.bfloat16, torch.float16) else wn  # weights of another dtype
    qkv = t(2, 9, 3, 2, 8)  # a packed [B, L, 3, H, hd] projection, read in place
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    sin = t(2, 2, 9, 9)
    o, lse, s_out = torch_ops._PY_FN["attention"](q, k, v, sin, None, seed, 3, True, None, 0.1, True, "")
    do = t(2, 2, 9, 8)
    return [
        ("linear", (x, w, b)),
        ("linear", (x.transpose(0, 1), w, None)),  # non-collapsing: the retry on a contiguous copy
        ("linear_backward", (dy, x, w, True, True, True)),
        ("linear_backward", (dy, x, w, False, True, False)),
        ("linear_act", (x, w, b, "gelu_tanh", True, False)),
        ("linear_act", (x, w, b, "silu", True, True)),
        ("linear_act", (x, w, None, "relu", True, False)),
        ("linear_act", (x, w, b, "none", False, False)),
        ("linear_act_backward", (dy, x, w, b, pre, "gelu_tanh", False, True, True, True)),
        ("linear_act_backward", (dy, x, w, b, pre, "silu", True, True, False, True)),
        ("linear_act_backward", (dy, x, w, None, None, "tanh", False, False, True, False)),
        ("norm", (xn, r, wn, bn, "layer", 1e-5, 0.25, seed, 7)),
        ("norm", (xn, None, wn32, None, "rms", 1e-6, 0.0, None, 0)),
        ("norm", (xn, None, None, None, "layer", 1e-5, 0.0, None, 0)),
        ("norm_backward", (dyn, dyn, s, wn, mean, rstd, "layer", 1e-5, 0.25, seed, 7, True, True, True, True)),
        ("norm_backward", (dyn, None, xn, wn32, None, rstd_rms, "rms", 1e-6, 0.0, None, 0, True, False, True, False)),
        ("attention", (q, k, v, None, None, None, 0, True, None, 0.0, False, "")),
        ("attention", (q, k, v, sin, None, seed, 3, True, 0.3, 0.1, True, "")),
        ("attention", (q, k, v, None, None, None, 0, False, None, 0.0, True,
                       "float32" if dtype != torch.float64 else "")),  # scores in the accumulator type
        ("attention_backward", (do, s_out, q, k, v, o, lse, None, sin, seed, 3, True, None, 0.1,
                                True, True, True, True)),
        ("attention_backward", (do[:1].expand(2, -1, -1, -1), None, q, k, v, o, lse, None, None, None, 0, True, None,
                                0.0, True, True, True, False)),  # a broadcast gradient: made dense, as _call does
        ("linear_act_backward", (dy[:1].expand(3, -1, -1), x, w, b, pre, "gelu", False, True, True, True)),
        ("attention_backward", (do, None, q, k, v, o, lse, None, None, None, 0, True, None, 0.0,
                                True, False, True, False)),
    ]


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_op_kernels_match_the_python_functions(rng, device, dtype):
    """torch.ops.fastgrad.<op> on CPU / CUDA tensors runs the extension's kernel (counted, none
    handed back) and gives the bits of the op's Python function, empty gradients included."""
    for name, args in _kernel_cases(rng, device, dtype):
        before = EXT.stats()
        got = getattr(torch.ops.fastgrad, name)(*args)
        after = EXT.stats()
        assert after["kernel"] == before["kernel"] + 1 and after["kernel_python"] == before["kernel_python"], \
            f"{name}: the kernel did not run it ({before} -> {after})"
        with _path("py"):  # the reference through ops.py, not the extension's helpers
            want = torch_ops._PY_FN[name](*args)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert len(got) == len(want)
        for g, w_ in zip(got, want):
            _same_layout(g, w_)


@needs_kernels
def test_op_kernels_hand_back_what_they_do_not_take(rng):
    """An unknown activation, a dtype mismatch, the slope form without its slope: the op's Python
    function runs (counted) and raises what it raises."""
    x, w, b = _leaf(rng, (4, 8), torch.float32, "cpu"), _leaf(rng, (3, 8), torch.float32, "cpu"), \
        _leaf(rng, (3,), torch.float32, "cpu")
    dy = _leaf(rng, (4, 3), torch.float32, "cpu")
    q = _leaf(rng, (1, 2, 5, 4), torch.float32, "cpu")
    cases = [("linear", (x.double(), w, b)), ("linear_act", (x, w, b, "swish", True, False)),
             ("linear_act_backward", (dy, x, w, b, None, "silu", True, True, True, True)),
             ("norm", (x, None, None, None, "batch", 1e-5, 0.0, None, 0)),
             ("norm_backward", (x, None, x, None, None, x[:, 0].contiguous(), "batch", 1e-5, 0.0, None, 0,
                                True, False, False, False)),
             ("attention", (q, q, q.double(), None, None, None, 0, False, None, 0.0, False, ""))]
    for name, args in cases:
        before = EXT.stats()["kernel_python"]
        got = _outcome(lambda: getattr(torch.ops.fastgrad, name)(*args))
        want = _outcome(lambda: torch_ops._PY_FN[name](*args))
        assert EXT.stats()["kernel_python"] == before + 1, f"{name}: not handed to Python"
        assert got[0] == want[0] == "raised", f"{name}: {got} / {want}"
        assert issubclass(got[1][0], want[1][0]) or got[1][0] is want[1][0], f"{name}: {got[1]} vs {want[1]}"
        assert want[1][1] in got[1][1], f"{name}: {got[1][1]!r} lacks {want[1][1]!r}"


@needs_kernels
def test_op_kernels_follow_tf32_and_autograd(rng):
    """set_allow_tf32 reaches the kernels' plans (the hook is registered), and the ops' autograd
    (custom_op's, in Python) still runs around the C++ kernels: gradients as through the
    Python functions."""
    assert EXT.set_tf32 in fg.ops._tf32_hooks and EXT.tf32() == 0
    fg.ops.set_allow_tf32(True)
    try:
        assert EXT.tf32() == _lib.PLAN_ALLOW_TF32
    finally:
        fg.ops.set_allow_tf32(False)
    assert EXT.tf32() == 0
    x, w, b = (_leaf(rng, s, torch.float32, "cpu") for s in ((6, 20), (9, 20), (9,)))
    dy = _leaf(rng, (6, 9), torch.float32, "cpu")
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    before = EXT.stats()["kernel"]
    torch.ops.fastgrad.linear_act(*leaves, "gelu", True, False)[0].backward(dy)
    assert EXT.stats()["kernel"] == before + 2  # forward and backward
    y, pre = torch_ops._PY_FN["linear_act"](x, w, b, "gelu", True, False)
    dx, dw, db = torch_ops._PY_FN["linear_act_backward"](dy, x, w, b, pre, "gelu", False, True, True, True)
    for t, r in zip(leaves, (dx, dw, db)):
        _same(t.grad, r)


def _compiled_step_in_cpp(loss, params, calls):
    """loss() backward, eager and under torch.compile (aot_eager): after the tracing step, `calls`
    op calls go through the C++ backend and autograd kernels (counted), none through Python, and
    the gradients of params equal eager's bit for bit."""
    if torch_ops._autograd_kernels() is None:
        pytest.skip("this torch makes no custom_op autograd kernel the way torch_ops calls it")

    def step(f):
        for p in params:
            p.grad = None
        f().backward()
        return [p.grad.clone() for p in params]

    want = step(loss)
    compiled = torch.compile(loss, backend="aot_eager")
    step(compiled)  # traces
    before = EXT.stats()
    got = step(compiled)
    after = EXT.stats()
    assert after["kernel"] - before["kernel"] == calls, f"{calls} op calls through the C++ kernels"
    assert after["autograd_cpp"] - before["autograd_cpp"] == calls
    assert after["autograd_python"] == before["autograd_python"] and after["kernel_python"] == before["kernel_python"]
    for g, w_ in zip(got, want):
        _same(g, w_)


@needs_kernels
def test_compiled_graph_calls_stay_in_cpp(rng):
    """A compiled training step over fg.LayerNorm, fg.LinearAct and fg.Linear (a .sum() loss: a
    broadcast gradient of ones reaches the last op): its three forward and three backward calls
    run in C++ after tracing, with eager's gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(fg.LayerNorm(24), fg.LinearAct(24, 40, act="gelu_tanh"), fg.Linear(40, 24))
    x = _leaf(rng, (6, 24), torch.float32, "cpu")
    _compiled_step_in_cpp(lambda: model(x).sum(), list(model.parameters()), 6)


@needs_kernels
def test_compiled_attention_stays_in_cpp(rng):
    """A compiled causal self-attention over a packed projection (fg.Linear, fg.attention; the
    attention's do a broadcast of ones): the Linear and attention forward and backward run in C++
    after tracing, with eager's gradients."""
    torch.manual_seed(0)
    lin = fg.Linear(16, 48)
    x = _leaf(rng, (2, 11, 16), torch.float32, "cpu")

    def loss():
        b, l, _ = x.shape
        qkv = lin(x).view(b, l, 3, 2, 8)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        return fg.attention(q, k, v, causal=True).sum()

    _compiled_step_in_cpp(loss, list(lin.parameters()), 4)


@needs_kernels
def test_attention_kernel_leaves_bad_lengths_to_python(rng):
    """A call with key-padding lengths runs the op's Python function, so a bad length is flagged on
    the context fg.context_check reads (the extension's own contexts are not checked)."""
    q = _leaf(rng, (2, 2, 9, 8), torch.float32, "cpu")
    lengths = torch.tensor([9, 12], dtype=torch.int32)
    before = EXT.stats()["kernel_python"]
    o, _, _ = torch.ops.fastgrad.attention(q, q, q, None, lengths, None, 0, False, None, 0.0, False, "")
    assert EXT.stats()["kernel_python"] == before + 1
    assert torch.isnan(o[1]).all() and not torch.isnan(o[0]).any()
    with pytest.raises(fg.FastgradError, match="lengths"):
        fg.ops.context_check()


@needs_kernels
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference", "no_requires_grad"])
def test_autograd_kernel_takes_the_path_custom_op_would(rng, mode):
    """The C++ autograd kernel records a graph through custom_op's Python kernel exactly when that
    kernel would (grad mode on and a tensor argument requiring grad), and redispatches in C++
    otherwise — under no_grad, inference_mode, or with no input requiring grad — with the same
    results either way."""
    x = _leaf(rng, (4, 12), torch.float32, "cpu")
    w, b = _leaf(rng, (5, 12), torch.float32, "cpu"), _leaf(rng, (5,), torch.float32, "cpu")
    if mode != "no_requires_grad":
        w.requires_grad_(True)
    ctx = {"grad": contextlib.nullcontext(), "no_grad": torch.no_grad(), "inference": torch.inference_mode(),
           "no_requires_grad": contextlib.nullcontext()}[mode]
    before = EXT.stats()
    with ctx:
        y = torch.ops.fastgrad.linear(x, w, b)
    after = EXT.stats()
    records = mode == "grad"
    assert (after["autograd_python"] - before["autograd_python"]) == (1 if records else 0)
    assert (after["autograd_cpp"] - before["autograd_cpp"]) == (0 if records or mode == "inference" else 1)
    assert y.requires_grad == records and (y.grad_fn is not None) == records
    with _path("py"):
        _same(y.detach(), torch_ops._PY_FN["linear"](x, w.detach(), b))


@needs_kernels
def test_compiled_dynamic_shapes_stay_in_cpp(rng):
    """torch.compile(dynamic=True) over fg.Linear and fg.LayerNorm at two batch sizes: the symbolic
    sizes reach the C++ kernels as plain ints, every call runs there after tracing, and the
    gradients equal eager's."""
    if torch_ops._autograd_kernels() is None:
        pytest.skip("this torch makes no custom_op autograd kernel the way torch_ops calls it")
    torch.manual_seed(0)
    model = torch.nn.Sequential(fg.LayerNorm(16), fg.Linear(16, 8))
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    for n in (5, 9, 9):
        x = _leaf(rng, (n, 16), torch.float32, "cpu")
        grads = []
        for m in (model, compiled):
            for p in model.parameters():
                p.grad = None
            before = EXT.stats()
            m(x).sum().backward()
            after = EXT.stats()
            grads.append([p.grad.clone() for p in model.parameters()])
        for g, w_ in zip(grads[1], grads[0]):
            _same(g, w_)
    assert after["kernel"] - before["kernel"] == 4 and after["autograd_python"] == before["autograd_python"]


# ------------------------------------------------------------------ the encoder layer

ENC_CASES = [(d, t) for d in DEVICES for t in (torch.float64, torch.float32, torch.bfloat16)
             if not (d == "cuda" and t == torch.float64) and not (d == "cpu" and t == torch.bfloat16)]


def _enc_model(kind, device, dtype, save):
    """A GPT-style pre-norm layer (causal), a post-norm one (relu, key padding) or PatchTST's
    three-layer encoder (BatchNorm post-norm, residual attention), every dropout on."""
    torch.manual_seed(0)
    if kind == "patchtst":
        m = fg.PatchTSTEncoder(3, 32, 4, 64, 0.2, 0.1, "gelu", True, "BatchNorm", save=save)
    else:
        m = fg.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True, save=save,
                                       activation="gelu" if kind == "pre" else "relu", norm_first=kind == "pre")
    return m.to(device=device, dtype=dtype).train()


def _enc_kwargs(kind, b, l, device):
    if kind == "pre":
        return dict(is_causal=True)
    pad = torch.arange(l, device=device)[None, :] >= torch.tensor([l, l - 3, 1][:b], device=device)[:, None]
    return dict(src_key_padding_mask=pad) if kind == "post" else dict(key_padding_mask=pad)


def _enc_run(path, m, x, dy, kwargs, need_x=True, frozen=(), twice=False):
    """(y, x's gradient, the parameters' gradients, the buffers) of one training step of a copy of
    m on the given path, and the extension's encoder forwards / backwards it ran."""
    fgenc.use_torchext(path == "ext")
    try:
        mm = copy.deepcopy(m)
        for name, p in mm.named_parameters():
            p.requires_grad_(name not in frozen)
        xx = x.detach().clone().requires_grad_(need_x)
        before = EXT.stats()
        torch.manual_seed(11)
        y = mm(xx, **kwargs)
        y.backward(dy, retain_graph=twice)
        if twice:
            y.backward(dy)
        after = EXT.stats()
        used = (after["encoder_forward"] - before["encoder_forward"],
                after["encoder_backward"] - before["encoder_backward"])
        grads = {n: p.grad for n, p in mm.named_parameters()}
        bufs = {n: b.clone() for n, b in mm.named_buffers()}
        return y.detach(), xx.grad, grads, bufs, used
    finally:
        fgenc.use_torchext(True)


def _enc_same(a, b):
    ya, xa, ga, ba, _ = a
    yb, xb, gb, bb, _ = b
    assert torch.equal(ya, yb), "y differs between the extension and the Python Function"
    assert (xa is None) == (xb is None) and (xa is None or torch.equal(xa, xb)), "dx differs"
    for n in ga:
        assert (ga[n] is None) == (gb[n] is None), f"{n}: a gradient on one path only"
        assert ga[n] is None or torch.equal(ga[n], gb[n]), f"{n}'s gradient differs"
    for n in ba:
        assert torch.equal(ba[n], bb[n]), f"buffer {n} differs"


@needs_ext
@pytest.mark.parametrize("device,dtype", ENC_CASES)
@pytest.mark.parametrize("kind", ["pre", "post", "patchtst"])
@pytest.mark.parametrize("save", ["all", "min"])
def test_encoder_layer_matches_python_function(rng, device, dtype, kind, save):
    """fg.TransformerEncoderLayer / fg.PatchTSTEncoder through the extension against
    EncoderLayerFunction: the same output, gradients and running statistics, bit for bit (the
    same library calls with the same seeds), with masks, residual scores and dropout."""
    m = _enc_model(kind, device, dtype, save)
    b, l = 3, 9
    x = torch.tensor(data(rng, (b, l, 32)), dtype=dtype, device=device)
    dy = torch.tensor(data(rng, (b, l, 32)), dtype=dtype, device=device)
    kw = _enc_kwargs(kind, b, l, device)
    ext, py = _enc_run("ext", m, x, dy, kw), _enc_run("python", m, x, dy, kw)
    layers = 3 if kind == "patchtst" else 1
    assert ext[4] == (layers, layers), f"extension path ran {ext[4]} encoder forwards / backwards"
    assert py[4] == (0, 0), f"Python path ran {py[4]} through the extension"
    _enc_same(ext, py)


@needs_ext
@pytest.mark.parametrize("kind", ["pre", "patchtst"])
def test_encoder_layer_some_gradients_and_retained_graph(rng, kind):
    """Only the gradients autograd asks for (x not a leaf that wants one, frozen weights), and two
    backwards through a retained graph (the cache is read, not consumed), as the Python Function."""
    m = _enc_model(kind, "cpu", torch.float32, "min")
    b, l = 3, 7
    x = torch.tensor(data(rng, (b, l, 32)), dtype=torch.float32)
    dy = torch.tensor(data(rng, (b, l, 32)), dtype=torch.float32)
    kw = _enc_kwargs(kind, b, l, "cpu")
    frozen = {"linear1.weight", "self_attn.in_proj_bias", "layers.1.self_attn.W_Q.weight", "layers.0.ff.0.bias"}
    for need_x, twice in ((False, False), (True, True)):
        ext = _enc_run("ext", m, x, dy, kw, need_x=need_x, frozen=frozen, twice=twice)
        py = _enc_run("python", m, x, dy, kw, need_x=need_x, frozen=frozen, twice=twice)
        assert ext[4][0] > 0 and py[4] == (0, 0)
        _enc_same(ext, py)
    assert any(n in frozen for n in ext[2]) and all(ext[2][n] is None for n in frozen if n in ext[2])


@needs_ext
def test_encoder_layer_node_toggle_and_eval(rng):
    """The backward node is the extension's (named as the Python Function's); the toggle sends
    layers to EncoderLayerFunction; evaluation runs through the extension too, and a backward
    through an evaluation-mode BatchNorm layer raises the Python Function's error."""
    m = _enc_model("pre", "cpu", torch.float32, "all")
    x = torch.tensor(data(rng, (2, 5, 32)), dtype=torch.float32, requires_grad=True)
    y = m(x)
    assert type(y.grad_fn).__module__ == "fastgrad._torchext_ops"
    assert type(y.grad_fn).__name__ == "EncoderLayerFunctionBackward"
    fgenc.use_torchext(False)
    try:
        assert type(m(x).grad_fn).__name__ == "EncoderLayerFunctionBackward"
        assert type(m(x).grad_fn).__module__ != "fastgrad._torchext_ops"
    finally:
        fgenc.use_torchext(True)
    p = _enc_model("patchtst", "cpu", torch.float32, "all").eval()
    outs = []
    for path in ("ext", "python"):
        fgenc.use_torchext(path == "ext")
        try:
            with torch.no_grad():
                outs.append(p(x.detach()))
            y = p(x)
            with pytest.raises(RuntimeError, match="evaluation-mode BatchNorm"):
                y.sum().backward()
        finally:
            fgenc.use_torchext(True)
    assert torch.equal(outs[0], outs[1])


@needs_ext
def test_encoder_layer_refusals_run_python(rng):
    """What the library refuses (lengths of another batch size) the extension hands back: Python runs the
    call and raises its usual error; the fallback is counted."""
    m = _enc_model("post", "cpu", torch.float32, "all")
    x = torch.tensor(data(rng, (2, 5, 32)), dtype=torch.float32, requires_grad=True)
    before = EXT.stats()["encoder_fallback"]
    with pytest.raises(Exception) as ext_err:
        m(x, lengths=torch.tensor([5, 2, 1]))
    assert EXT.stats()["encoder_fallback"] == before + 1
    fgenc.use_torchext(False)
    try:
        with pytest.raises(Exception) as py_err:
            m(x, lengths=torch.tensor([5, 2, 1]))
    finally:
        fgenc.use_torchext(True)
    assert type(ext_err.value) is type(py_err.value) and str(ext_err.value) == str(py_err.value)

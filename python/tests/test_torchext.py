"""The torch C++ extension (fastgrad._torchext_ops, python/fastgrad/_torchext.cpp: fg.Linear with
its autograd in C++) against the Python autograd.Function it replaces: the same output and
gradients, bit for bit, for every dtype, awkward shapes, no bias, non-contiguous and
non-collapsing inputs (the retry on contiguous copies), a broadcast gradient, only some
gradients asked for, no_grad, several threads; against torch autograd on float64 copies at the
dtype's tolerance; the cases it hands back to Python (the same errors as before); the
dispatcher ops fastgrad_ext::linear / linear_backward; and a check that fails when the
extension is built beside the library but fg.Linear does not use it. Skipped, with the reason,
where torch is missing or the extension is not built."""
import os
import threading

import pytest
from conftest import data

torch = pytest.importorskip("torch")
import fastgrad as fg  # noqa: E402
from fastgrad import _lib, _torchext, autograd  # noqa: E402

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

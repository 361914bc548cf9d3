"""Linear + activation through torch against torch autograd on float64 copies of the
same inputs (the pre-activation rounded to the dtype, as the op stores it): every
activation and dtype, CPU and CUDA, kept (and consumed by the backward) or recomputed
pre-activation or the kept slope act′(pre) (the default), a second backward through a retained graph, 3-D inputs, only the
requested gradients, and the module."""
import numpy as np
import pytest
from conftest import data

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fastgrad as fg  # noqa: E402
from torch_helpers import DEVICES, DTYPES, err, tol  # noqa: E402

ACTS = {"none": lambda p: p, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda p: F.gelu(p, approximate="tanh"),
        "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("lead,k,m,bias,save", [((5, 7), 64, 96, True, True), ((129,), 33, 200, False, False),
                                                ((3, 50), 128, 72, True, False),  # CUDA: K <= 128 tiles
                                                ((5, 7), 64, 96, True, "slope"), ((129,), 33, 200, False, "slope"),
                                                ((3, 50), 128, 72, True, "slope")])
def test_linear_act(rng, device, dtype, act, lead, k, m, bias, save):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("f64 runs on the CPU backend only")
    mk = lambda shape, s=1.0: torch.from_numpy((data(rng, shape) - 0.25) * s).to(device=device, dtype=dtype)  # noqa: E731
    x = mk(lead + (k,), 4 / np.sqrt(k)).requires_grad_(True)
    w = mk((m, k)).requires_grad_(True)
    b = mk((m,)).requires_grad_(True) if bias else None
    y = fg.linear_act(x, w, b, act, save_pre=save)
    dy = mk(y.shape)
    y.backward(dy)
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    br = b.detach().double().requires_grad_(True) if bias else None
    pre = F.linear(xr, wr, br).to(dtype).double()
    if act == "relu":
        # At the kink the derivative depends on pre's sign, which the f32 accumulation and the
        # f64 reference may disagree on when |pre| is within the accumulation's rounding
        # (seen: 1.1e-8 in f64, 6e-8 in f32, one flipped element moving x.grad's error past the
        # tolerance). There either derivative is right: take the library's (y > 0); elsewhere
        # the reference's own sign decides.
        with torch.no_grad():
            mag = F.linear(xr.abs(), wr.abs(), br.abs() if bias else None)
            sub = torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # the dtype's smallest subnormal
            kink = F.linear(xr, wr, br).abs() <= 4 * (k + 1) * 2.0**-24 * mag + sub
            mask = torch.where(kink, (y.double() > 0).double(), (pre > 0).double())
        ref = pre * mask
    else:
        ref = ACTS[act](pre)
    ref.backward(dy.double())
    assert y.dtype == dtype and y.shape == ref.shape
    assert err(y, ref) <= tol(dtype)
    assert err(x.grad, xr.grad) <= tol(dtype) and err(w.grad, wr.grad) <= tol(dtype)
    if bias:
        assert err(b.grad, br.grad) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_module_and_needs(rng, device):
    layer = fg.LinearAct(32, 48, act="silu", device=device)
    ref = torch.nn.Linear(32, 48, device=device)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(6, 32, device=device)
    y = layer(x)  # x needs no gradient: only dw and db are formed
    y.sum().backward()
    F.silu(ref(x)).sum().backward()
    assert err(y, F.silu(ref(x))) <= 1e-5
    assert err(layer.weight.grad, ref.weight.grad) <= 1e-5 and err(layer.bias.grad, ref.bias.grad) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "silu"])
def test_retained_graph(rng, device, act):
    """The first backward forms g in the saved pre's memory; a second one recomputes pre."""
    mk = lambda shape: torch.from_numpy(data(rng, shape) - 0.5).float().to(device)  # noqa: E731
    x, w, b = mk((37, 24)).requires_grad_(True), mk((40, 24)).requires_grad_(True), mk((40,)).requires_grad_(True)
    y = fg.linear_act(x, w, b, act)
    dy = mk((37, 40))
    y.backward(dy, retain_graph=True)
    first = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    y.backward(dy)
    for g1, t in zip(first, (x, w, b)):
        assert err(t.grad, g1) <= 1e-6
    ref = ACTS[act](F.linear(x.detach(), w.detach(), b.detach()))
    assert err(y, ref) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_batched_weights(rng, device):
    """w [B, M, K] through autograd against baddbmm in float64."""
    mk = lambda shape: torch.from_numpy(data(rng, shape) - 0.5).float().to(device)  # noqa: E731
    x, w, b = mk((2, 9, 16)).requires_grad_(True), mk((2, 24, 16)).requires_grad_(True), mk((2, 24)).requires_grad_(True)
    y = fg.linear_act(x, w, b, "gelu_tanh")
    dy = mk(y.shape)
    y.backward(dy)
    xr, wr, br = (t.detach().double().requires_grad_(True) for t in (x, w, b))
    pre = torch.baddbmm(br[:, None, :], xr, wr.transpose(1, 2)).float().double()
    ref = F.gelu(pre, approximate="tanh")
    ref.backward(dy.double())
    assert err(y, ref) <= tol(torch.float32)
    for t, r in ((x, xr), (w, wr), (b, br)):
        assert err(t.grad, r.grad) <= tol(torch.float32)

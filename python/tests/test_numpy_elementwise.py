"""The elementwise family and AdamW through numpy on the CPU backend, against float64
numpy references: every op, broadcasting with summed gradients, bad parameters."""
import numpy as np
import pytest
from conftest import TOL, data, relerr

import fastgrad as fg

DTYPES = [np.float32, np.float16, np.float64]
UNARY = {
    "scale": ((-1.5,), lambda x, s: s[0] * x, lambda x, s: np.full_like(x, s[0])),
    "pow": ((2.5,), lambda x, s: x ** s[0], lambda x, s: s[0] * x ** (s[0] - 1)),
    "leaky_relu": ((0.1,), lambda x, s: np.where(x > 0, x, s[0] * x), lambda x, s: np.where(x > 0, 1.0, s[0])),
    "elu": ((1.3,), lambda x, s: np.where(x > 0, x, s[0] * np.expm1(x)), lambda x, s: np.where(x > 0, 1.0, s[0] * np.exp(x))),
    "clamp": ((-0.2, 0.6), lambda x, s: np.clip(x, *s), lambda x, s: ((x >= s[0]) & (x <= s[1])).astype(float)),
    "softcap": ((0.7,), lambda x, s: s[0] * np.tanh(x / s[0]), lambda x, s: 1 - np.tanh(x / s[0]) ** 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", list(UNARY))
@pytest.mark.parametrize("shape", [(1,), (17, 127), (1031,), (3, 1, 5)])
def test_unary(rng, dtype, kind, shape):
    s, f, df = UNARY[kind]
    x = data(rng, shape)
    if kind == "pow":
        x = 0.1 + np.abs(x)
    x = x.astype(dtype)
    dy = data(rng, shape).astype(dtype)
    xd = x.astype(np.float64)
    assert relerr(fg.unary_forward(kind, x, s), f(xd, s)) <= TOL[np.dtype(dtype).name]
    assert relerr(fg.unary_backward(kind, dy, x, s), dy.astype(np.float64) * df(xd, s)) <= TOL[np.dtype(dtype).name]


@pytest.mark.parametrize("dtype", DTYPES)
def test_lerp_broadcast(rng, dtype):
    a, b, w = (data(rng, s).astype(dtype) for s in [(5, 1, 7), (1, 4, 7), (7,)])
    b = (b + 1).astype(dtype)  # b − a must not cancel in dw's sums
    ad, bd, wd = (t.astype(np.float64) for t in (a, b, w))
    tol = TOL[np.dtype(dtype).name]
    assert relerr(fg.lerp_forward(a, b, w), ad + wd * (bd - ad)) <= tol
    assert relerr(fg.lerp_forward(a, b, 0.3), ad + 0.3 * (bd - ad)) <= tol
    dy = data(rng, (5, 4, 7)).astype(dtype)
    da, db, dw = fg.lerp_backward(dy, a, b, w)
    dyd = dy.astype(np.float64)
    assert relerr(da, ((1 - wd) * dyd).sum(1, keepdims=True)) <= tol
    assert relerr(db, (wd * dyd).sum(0, keepdims=True)) <= tol
    assert relerr(dw, ((bd - ad) * dyd).sum((0, 1))) <= tol
    da, db, dw = fg.lerp_backward(dy, a, b, 0.3, need=(True, False, True))
    assert db is None and dw is None and relerr(da, (0.7 * dyd).sum(1, keepdims=True)) <= tol


def test_axpby_and_in_place(rng):
    a, b = data(rng, (64, 33)), data(rng, (33,))
    assert relerr(fg.axpby_forward(a, b, 0.5, -2.0), 0.5 * a - 2.0 * b) <= 1e-12
    da, db = fg.axpby_backward(np.ones((64, 33)), a.shape, b.shape, 0.5, -2.0)
    assert relerr(da, np.full(a.shape, 0.5)) <= 1e-12 and relerr(db, np.full(b.shape, -128.0)) <= 1e-12
    x = data(rng, (1000,))
    ref = np.clip(x, -0.1, 0.2)
    fg.unary_forward("clamp", x, (-0.1, 0.2), out=x)  # in place
    assert relerr(x, ref) == 0


def test_bad_parameters(rng):
    x = data(rng, (8,))
    out = np.full(8, 3.0)
    with pytest.raises(fg.FastgradError, match="lo=1 is greater than hi=0"):
        fg.unary_forward("clamp", x, (1.0, 0.0), out=out)
    with pytest.raises(fg.FastgradError, match="softcap c=-1"):
        fg.unary_forward("softcap", x, (-1.0,), out=out)
    with pytest.raises(fg.FastgradError, match="must be finite"):
        fg.lerp_forward(x, x, float("nan"), out=out)
    with pytest.raises(fg.FastgradError, match="do not broadcast"):
        fg.lerp_forward(x, data(rng, (3,)), 0.5)
    assert np.all(out == 3.0)


def test_adamw_numpy(rng):
    sizes = [1, 17, 1000, 70000]
    p = [data(rng, (n,)).astype(np.float32) for n in sizes]
    g = [data(rng, (n,)).astype(np.float32) for n in sizes]
    m = [np.zeros(n, np.float32) for n in sizes]
    v = [np.zeros(n, np.float32) for n in sizes]
    ref = [x.astype(np.float64) for x in p]
    fg.adamw_step(p, g, m, v, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, step=1)
    for r, pp, gg in zip(ref, p, g):
        gd = gg.astype(np.float64)
        r = r * (1 - 1e-3)
        mm, vv = 0.1 * gd, 0.001 * gd * gd
        r -= 1e-2 / 0.1 * mm / (np.sqrt(vv) / np.sqrt(0.001) + 1e-8)
        assert relerr(pp, r) <= 1e-5
    with pytest.raises(fg.FastgradError, match="beta1=1"):
        fg.adamw_step(p, g, m, v, lr=1e-2, beta1=1.0, beta2=0.999, eps=1e-8, weight_decay=0.1, step=2)

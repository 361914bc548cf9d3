"""Linear + activation on numpy arrays (the CPU backend) against a numpy reference:
every activation, forward with and without the saved pre-activation, the backward
(kept / recomputed pre), and errors."""
import math

import numpy as np
import pytest
from conftest import relerr

import fastgrad as fg

ERF = np.vectorize(math.erf)
ERFC = np.vectorize(math.erfc)
C = math.sqrt(2 / math.pi)


def sigm(z):
    """σ(z) without cancellation or overflow (exp of −|z| only)."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


def act_ref(act, p):
    """f64 activations and slopes in forms without cancellation, so each is good to a few ulp
    relative (the tests hold the library to 1e-12): 1 + erf(p/√2) as erfc(−p/√2), 1 + tanh u as
    2σ(2u), 1 − tanh² u as 4σ(2u)σ(−2u), 1 − σ(p) as σ(−p). The plain forms cancel on a tail:
    0.5·p·(1 + tanh u) is 2.7e-12 off at p = −4.3."""
    sig, sneg = sigm(p), sigm(-p)
    u = C * (p + 0.044715 * p ** 3)
    s2, s2neg = sigm(2 * u), sigm(-2 * u)
    half_cdf = 0.5 * ERFC(-p / math.sqrt(2))
    return {
        "none": (p, np.ones_like(p)),
        "relu": (np.maximum(p, 0), (p > 0).astype(p.dtype)),
        "gelu": (p * half_cdf, half_cdf + p * np.exp(-0.5 * p * p) / math.sqrt(2 * math.pi)),
        "gelu_tanh": (p * s2, s2 + 2 * p * s2 * s2neg * C * (1 + 3 * 0.044715 * p * p)),
        "silu": (p * sig, sig * (1 + p * sneg)),
        "sigmoid": (sig, sig * sneg),
        "tanh": (np.tanh(p), 4 * sigm(2 * p) * sigm(-2 * p)),
    }[act]


def slope_terms(act, p):
    """The magnitude of the two terms whose sum is the slope (gelu, gelu_tanh, silu: it crosses zero
    where they cancel, near p = -0.75 and -1.28), else the slope's own magnitude."""
    sig = 1 / (1 + np.exp(-p))
    t = np.tanh(C * (p + 0.044715 * p ** 3))
    if act == "gelu":
        return 0.5 * (1 + ERF(p / math.sqrt(2))) + np.abs(p) * np.exp(-0.5 * p * p) / math.sqrt(2 * math.pi)
    if act == "gelu_tanh":
        return 0.5 * (1 + t) + 0.5 * np.abs(p) * (1 - t * t) * C * (1 + 3 * 0.044715 * p * p)
    if act == "silu":
        return sig * (1 + np.abs(p) * (1 - sig))
    return np.abs(act_ref(act, p)[1])


def calm_roots(act, p, dy):
    """Where a slope cancels to within its own f64 rounding of the 1e-12 bound (64 ulp of its terms
    against 1e-12 of itself: |slope| below ~0.7% of the terms), dy is zeroed, as the C test does:
    there the slope's value is its rounding, and a pre the op recomputes an ulp away moves it by
    act'' times that ulp. Returns dy and the allowance for the slope form's values there."""
    terms = slope_terms(act, p)
    rs = act_ref(act, p)[1]
    near = 64 * np.finfo(np.float64).eps * terms > 1e-12 * np.abs(rs)
    return np.where(near, 0.0, dy), np.where(near, 64 * np.finfo(np.float64).eps * terms, 0.0)


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
@pytest.mark.parametrize("lead,k,m,bias", [((1,), 1, 1, True), ((3, 4), 17, 9, True), ((33,), 8, 40, False)])
def test_linear_act(rng, act, lead, k, m, bias):
    x = rng.normal(size=lead + (k,))
    w = rng.normal(size=(m, k)) / math.sqrt(k)
    b = rng.normal(size=m) if bias else None
    y, pre = fg.linear_act_forward(x, w, b, act)
    p = x @ w.T + (b if bias else 0)
    ry, rs = act_ref(act, p)
    assert relerr(pre, p) < 1e-12 and relerr(y, ry) < 1e-12
    y2, none = fg.linear_act_forward(x, w, b, act, keep_pre=False)
    assert none is None and relerr(y2, ry) < 1e-12
    dy, allow = calm_roots(act, p, rng.normal(size=y.shape))
    g = dy * rs
    # kept, recomputed, consumed (a copy: g may be formed in its memory), and relu from y
    for kept, consume in [(pre, False), (None, False), (pre.copy(), True)] + ([(y, False)] if act == "relu" else []):
        dx, dw, db = fg.linear_act_backward(dy, x, w, b, kept, act, consume_pre=consume)
        assert relerr(dx, g @ w) < 1e-12
        assert relerr(dw, g.reshape(-1, m).T @ x.reshape(-1, k)) < 1e-12
        if bias:
            assert relerr(db, g.reshape(-1, m).sum(0)) < 1e-12
    # the slope form: act′(pre) saved instead of pre, g = dy ⊙ it
    y3, s = fg.linear_act_forward(x, w, b, act, slope=True)
    assert relerr(y3, ry) < 1e-12
    settled = allow == 0  # the slope near a root: within its terms' rounding; elsewhere 1e-12 of itself
    assert relerr(s[settled], rs[settled]) < 1e-12 and np.all(np.abs(s - rs)[~settled] <= 2 * allow[~settled])
    dx, dw, db = fg.linear_act_backward(dy, x, w, b, s, act, slope=True)
    assert relerr(dx, g @ w) < 1e-12
    assert relerr(dw, g.reshape(-1, m).T @ x.reshape(-1, k)) < 1e-12
    if bias:
        assert relerr(db, g.reshape(-1, m).sum(0)) < 1e-12


def test_errors(rng):
    x, w = rng.normal(size=(4, 3)), rng.normal(size=(5, 3))
    with pytest.raises(ValueError, match="act must be one of"):
        fg.linear_act_forward(x, w, act="swish")
    with pytest.raises(fg.FastgradError, match="w.shape"):
        fg.linear_act_forward(x, rng.normal(size=(5, 2)), act="relu")


@pytest.mark.parametrize("bias", [None, "shared", "batched"])
def test_batched_weights(rng, bias):
    """w [B, M, K]: each batch its own weights; db summed over the batches when b is [M]."""
    B, L, K, M = 3, 7, 6, 5
    x, w = rng.normal(size=(B, L, K)), rng.normal(size=(B, M, K))
    b = {None: None, "shared": rng.normal(size=M), "batched": rng.normal(size=(B, M))}[bias]
    y, pre = fg.linear_act_forward(x, w, b, "silu")
    p = np.einsum("blk,bmk->blm", x, w) + (0 if b is None else (b if b.ndim == 1 else b[:, None, :]))
    ry, rs = act_ref("silu", p)
    assert relerr(y, ry) < 1e-12 and relerr(pre, p) < 1e-12
    dy = rng.normal(size=y.shape)
    g = dy * rs
    dx, dw, db = fg.linear_act_backward(dy, x, w, b, pre, "silu")
    assert relerr(dx, np.einsum("blm,bmk->blk", g, w)) < 1e-12
    assert relerr(dw, np.einsum("blm,blk->bmk", g, x)) < 1e-12
    if b is not None:
        assert relerr(db, g.sum(axis=(0, 1)) if b.ndim == 1 else g.sum(axis=1)) < 1e-12

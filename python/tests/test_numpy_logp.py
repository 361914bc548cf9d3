"""The linear log-prob family on numpy arrays (the CPU backend) against a numpy
reference that forms the logits: forward, split backward, one pass, options, bad
targets through context_check, and errors."""
import numpy as np
import pytest
from conftest import relerr

import fastgrad as fg


def reference(h, w, b, t, T=1.0, cap=0.0, ignore=None):
    z = h @ w.T + (b if b is not None else 0)
    L = cap * np.tanh(z / cap) / T if cap else z / T
    m = L.max(1, keepdims=True)
    lse = (m + np.log(np.exp(L - m).sum(1, keepdims=True)))[:, 0]
    p = np.exp(L - lse[:, None])
    logp = L[np.arange(len(t)), t] - lse
    ent = lse - (p * L).sum(1)
    keep = np.ones(len(t), bool) if ignore is None else t != ignore
    return np.where(keep, logp, 0), np.where(keep, lse, 0), np.where(keep, ent, 0), p, keep


@pytest.mark.parametrize("n,d,v,bias", [(1, 1, 1, False), (7, 5, 13, True), (33, 17, 300, True)])
@pytest.mark.parametrize("T,cap", [(1.0, 0.0), (0.7, 3.0)])
def test_forward_backward(rng, n, d, v, bias, T, cap):
    h, w = rng.normal(size=(n, d)), rng.normal(size=(v, d))
    b = rng.normal(size=v) if bias else None
    t = rng.integers(0, v, n).astype(np.int32)
    opt = fg.logp_options(temperature=T, softcap=cap, max_tile_elements=37)
    logp, lse, ent = fg.linear_logp_forward(h, w, t, b, entropy=True, options=opt)
    rl, rs, re, p, _ = reference(h, w, b, t, T, cap)
    for got, ref in ((logp, rl), (lse, rs), (ent, re)):
        assert relerr(got, ref) < 1e-12
    dl = rng.normal(size=n)
    dh, dw, db = fg.linear_logp_backward(h, w, t, lse, b, dlogp=dl, options=opt)
    z = h @ w.T + (b if b is not None else 0)
    slope = (1 - np.tanh(z / cap) ** 2) / T if cap else np.full_like(z, 1 / T)
    onehot = np.zeros_like(p)
    onehot[np.arange(n), t] = 1
    dz = dl[:, None] * (onehot - p) * slope
    assert relerr(dh, dz @ w) < 1e-12
    assert relerr(dw, dz.T @ h) < 1e-12
    if bias:
        assert relerr(db, dz.sum(0)) < 1e-12


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_onepass(rng, reduction):
    n, d, v = 20, 6, 50
    h, w = rng.normal(size=(n, d)), rng.normal(size=(v, d))
    t = rng.integers(0, v, n).astype(np.int64)
    t[3] = -100
    eps, lam = 0.1, 1e-3
    opt = fg.logp_options(ignore_index=-100, reduction=reduction, label_smoothing=eps, z_loss=lam,
                          max_tile_elements=200)
    loss, lse, dh, dw, _ = fg.linear_cross_entropy_onepass(h, w, t, options=opt, want_lse=True)
    t0 = np.where(t < 0, 0, t)
    logp, rlse, _, p, keep = reference(h, w, None, t0)
    z = h @ w.T
    rows = -(1 - eps) * logp - eps * (z.mean(1) - rlse) + lam * rlse ** 2
    rows = np.where(keep & (t >= 0), rows, 0)
    k = keep & (t >= 0)
    scale = 1 / k.sum() if reduction == "mean" else 1.0
    ref_loss = rows if reduction == "none" else np.array([rows.sum() * scale])
    assert relerr(loss, ref_loss) < 1e-12
    onehot = np.zeros_like(p)
    onehot[np.arange(n), t0] = 1
    dz = (p * (1 + 2 * lam * rlse[:, None]) - (1 - eps) * onehot - eps / v) * scale * k[:, None]
    assert relerr(dh, dz @ w) < 1e-12
    assert relerr(dw, dz.T @ h) < 1e-12
    assert relerr(lse, np.where(k, rlse, 0)) < 1e-12


def test_f32_and_bad_target(rng):
    n, d, v = 9, 4, 10
    h, w = rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(v, d)).astype(np.float32)
    t = rng.integers(0, v, n).astype(np.int64)
    t[4] = v
    fg.context_check()
    logp, lse, _ = fg.linear_logp_forward(h, w, t)
    assert logp.dtype == np.float32 and np.isnan(logp[4]) and np.isfinite(np.delete(logp, 4)).all()
    with pytest.raises(fg.FastgradError, match="row 4") as e:
        fg.context_check()
    assert e.value.name == "FG_ERR_DEVICE_VALUE"
    fg.context_check()  # cleared


def test_errors(rng):
    h, w = rng.normal(size=(4, 3)), rng.normal(size=(5, 3))
    with pytest.raises(fg.FastgradError, match="target") as e:
        fg.linear_logp_forward(h, w, np.zeros(4, dtype=np.float64))
    assert e.value.name == "FG_ERR_DTYPE"
    with pytest.raises(fg.FastgradError, match="w.shape"):
        fg.linear_logp_forward(h, rng.normal(size=(5, 2)), np.zeros(4, dtype=np.int32))
    with pytest.raises(fg.FastgradError, match="temperature"):
        fg.linear_logp_forward(h, w, np.zeros(4, dtype=np.int32), options=fg.logp_options(temperature=-1))
    with pytest.raises(ValueError, match="reduction"):
        fg.logp_options(reduction="avg")

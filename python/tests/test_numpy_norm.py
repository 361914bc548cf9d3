"""The normalization family on numpy arrays (the CPU backend) against float64 references written
here: LayerNorm / RMSNorm with the fused residual + dropout, BatchNorm (training, running
statistics, evaluation, the split form), dropout, RevIN; gradients against central differences
of the numpy forward; the dropout mask against a numpy Philox4x32-10 of src/core/rng.h's
definition (not the library's own); bad options refused."""
import math

import numpy as np
import pytest
from conftest import TOL, data, relerr

import fastgrad as fg
from fastgrad import _lib

from philox_ref import philox4x32_10 as philox

M32 = np.uint64(0xFFFFFFFF)


def mask(p, seed, offset, n, f64=False):
    """The multiplier (keep ? 1/(1 − p) : 0) of elements 0 … n − 1 under (seed, offset): the scale
    rounded to f32 (f32 / f16 / bf16 data), or in f64 (f64 data)."""
    i = np.arange(n, dtype=np.uint64)
    q = i >> np.uint64(2)
    words = philox(q & M32, q >> np.uint64(32), np.full(n, offset & 0xFFFFFFFF, np.uint64),
                   np.full(n, offset >> 32, np.uint64), seed & 0xFFFFFFFF, seed >> 32)
    r = np.choose((i & np.uint64(3)).astype(np.int64), words)
    keep = (r >> np.uint64(8)) >= np.uint64(math.ceil(p * 2**24))
    scale = (1 / (1 - p) if f64 else float(np.float32(1 / (1 - p)))) if p < 1 else 0.0
    return np.where(keep, scale, 0.0)


def test_philox_known_answer():
    """The Random123 known-answer vector for Philox4x32-10 (counter and key zero, all ones, pi digits):
    the numpy generator the tests trust is the published one."""
    out = philox(0, 0, 0, 0, 0, 0)
    assert [int(v) for v in out] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    out = philox(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    assert [int(v) for v in out] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    out = philox(0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)
    assert [int(v) for v in out] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


DTYPES = [np.float64, np.float32, np.float16]


def tol(dt):
    return TOL[np.dtype(dt).name]


def cast(a, dt):
    return np.asarray(a).astype(dt)


def err_terms(out, ref, terms):
    """‖out − ref‖ relative to the larger of ‖ref‖ and ‖terms‖: a gradient that is the difference of
    terms of that size (a norm's dx over one element, BatchNorm's over two rows) is only ever
    accurate relative to them."""
    if not np.all(np.isfinite(out)):
        return np.inf
    num, den = np.linalg.norm(np.asarray(out, np.float64) - ref), max(np.linalg.norm(ref), np.linalg.norm(terms))
    return num / den if den > 0 else num


# ------------------------------------------------------------------ row norms


def norm_ref(s, w, b, kind, eps):
    if kind == "layer":
        mean = s.mean(-1, keepdims=True)
        var = ((s - mean) ** 2).mean(-1, keepdims=True)
    else:
        mean = np.zeros(s.shape[:-1] + (1,))
        var = (s * s).mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(var + eps)
    y = (s - mean) * rstd
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, mean[..., 0], rstd[..., 0]


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 3, 127), (4, 1000)])
@pytest.mark.parametrize("fused", [False, True])
def test_norm_forward_backward(rng, kind, dt, shape, fused):
    d = shape[-1]
    x, w, b = cast(data(rng, shape), dt), cast(data(rng, d), dt), cast(data(rng, d), dt)
    r = cast(data(rng, shape), dt) if fused else None
    p, seed, offset = (0.25, 1234567, 99) if fused else (0.0, 0, 0)
    y, s, mean, rstd = fg.norm_forward(x, w, b, r, kind, 1e-5, p, seed, offset)
    sv = x.astype(np.float64)
    if fused:
        m = mask(p, seed, offset, x.size, dt == np.float64).reshape(shape)
        sv = sv + (r * m if dt == np.float64 else (r.astype(np.float32) * m.astype(np.float32)).astype(np.float64))
        sv = sv.astype(dt).astype(np.float64)  # s is rounded to the storage type
        assert s.dtype == x.dtype and relerr(s, sv) <= tol(dt)
    else:
        assert s is None
    yr, mr, rr = norm_ref(sv, w.astype(np.float64), b.astype(np.float64), kind, 1e-5)
    assert relerr(y, yr) <= tol(dt)
    assert np.max(np.abs(y.astype(np.float64) - yr)) <= 50 * tol(dt) * (1 + np.max(np.abs(yr)))
    assert rstd.dtype == (np.float64 if dt == np.float64 else np.float32) and relerr(rstd, rr) <= tol(dt)
    if kind == "layer":
        assert relerr(mean, mr) <= tol(dt) or np.max(np.abs(mean - mr)) < 1e-6
    else:
        assert mean is None
    # backward, against the f64 formula of the gradient of Σ y·dy (the finite-difference test
    # below checks that formula itself)
    dy, ds = cast(data(rng, shape), dt), cast(data(rng, shape), dt)
    xs = s if fused else x
    dx, dr, dw, db = fg.norm_backward(dy, xs, w, mean, rstd, ds if fused else None, kind, 1e-5, p, seed, offset,
                                      need=(True, fused, True, True))
    xsv, dyv = xs.astype(np.float64), dy.astype(np.float64)
    _, mr, rr = norm_ref(xsv, None, None, kind, 1e-5)
    xh = (xsv - mr[..., None]) * rr[..., None]
    g = dyv * w.astype(np.float64)
    dref = rr[..., None] * (g - (g.mean(-1, keepdims=True) if kind == "layer" else 0) -
                            xh * (g * xh).mean(-1, keepdims=True))
    if fused:
        dref = dref + ds.astype(np.float64)
    # relative to the size of the terms the gradient is a difference of (rstd·g): with D = 1 RMSNorm's
    # dx = rstd·g·(1 − x̂²) cancels to ~eps/x² of them, and no f32 computation does better than that
    terms = np.abs(rr[..., None] * g) + (np.abs(ds.astype(np.float64)) if fused else 0)

    def err(out, ref):
        return err_terms(out, ref, terms)

    assert err(dx, dref) <= tol(dt)
    if fused:
        assert err(dr, dref * mask(p, seed, offset, x.size, dt == np.float64).reshape(shape)) <= tol(dt)
    # dw and db are sums over the rows: relative to their terms' magnitudes (a few rows can cancel)
    dw_ref, dw_terms = (dyv * xh).reshape(-1, d).sum(0), np.abs(dyv * xh).reshape(-1, d).sum(0)
    assert err_terms(dw, dw_ref, dw_terms) <= tol(dt)
    assert err_terms(db, dyv.reshape(-1, d).sum(0), np.abs(dyv).reshape(-1, d).sum(0)) <= tol(dt)
    # recomputed statistics give the same gradients
    dx2, _, dw2, _ = fg.norm_backward(dy, xs, w, None, None, ds if fused else None, kind, 1e-5, p, seed, offset)
    assert err(dx2, dref) <= tol(dt) and err_terms(dw2, dw_ref, dw_terms) <= tol(dt)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_gradients_finite_differences(rng, kind):
    """The backward against central differences of a numpy f64 forward (x, w, b, and r through the
    dropout), L = Σ y·R."""
    shape, d = (3, 7), 7
    x, w, b, r = data(rng, shape), data(rng, d), data(rng, d), data(rng, shape)
    R = data(rng, shape)
    p, seed = 0.3, 42
    m = mask(p, seed, 0, x.size, True).reshape(shape)

    def loss(x_, w_, b_, r_):
        return float((norm_ref(x_ + r_ * m, w_, b_, kind, 1e-5)[0] * R).sum())

    y, s, mean, rstd = fg.norm_forward(x, w, b, r, kind, 1e-5, p, seed)
    dx, dr, dw, db = fg.norm_backward(R, s, w, mean, rstd, None, kind, 1e-5, p, seed, 0, need=(True, True, True, True))
    h = 1e-6
    for arr, grad in ((x, dx), (w, dw), (b, db), (r, dr)):
        fd = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            save = arr[idx]
            arr[idx] = save + h
            up = loss(x, w, b, r)
            arr[idx] = save - h
            down = loss(x, w, b, r)
            arr[idx] = save
            fd[idx] = (up - down) / (2 * h)
        assert np.max(np.abs(grad - fd)) <= 1e-6 * (1 + np.max(np.abs(fd)))


def test_norm_accumulate_and_layouts(rng):
    """accumulate adds into every output; padded rows (a row stride past D) are read in place."""
    base = data(rng, (6, 40))
    x = base[:, :33]  # rows of 33 with a stride of 40
    w, dy = data(rng, 33), data(rng, (6, 33))
    y, _, mean, rstd = fg.norm_forward(x, w)
    assert relerr(y, norm_ref(x, w, None, "layer", 1e-5)[0]) <= 1e-12
    dx0, dw0 = data(rng, (6, 33)), data(rng, 33)
    dx, _, dw, _ = fg.norm_backward(dy, x, w, mean, rstd, need=(True, False, True, False), out=(dx0.copy(), None,
                                                                                              dw0.copy(), None),
                                    accumulate=True)
    dxr, _, dwr, _ = fg.norm_backward(dy, x, w, mean, rstd, need=(True, False, True, False))
    assert relerr(dx, dx0 + dxr) <= 1e-12 and relerr(dw, dw0 + dwr) <= 1e-12


# ------------------------------------------------------------------ BatchNorm


def bn_ref(s, w, b, eps):
    s2 = s.reshape(-1, s.shape[-1])
    mean, var = s2.mean(0), s2.var(0)
    y = (s - mean) / np.sqrt(var + eps)
    return y * (w if w is not None else 1) + (b if b is not None else 0), mean, var


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(2, 1), (17, 3), (4, 9, 16), (1000, 7)])
def test_batch_norm_training_and_eval(rng, dt, shape):
    c = shape[-1]
    x, w, b = cast(data(rng, shape), dt), cast(data(rng, c), dt), cast(data(rng, c), dt)
    acc = np.float64 if dt == np.float64 else np.float32
    rm0, rv0 = data(rng, c).astype(acc), (1 + data(rng, c) ** 2).astype(acc)
    rm, rv = rm0.copy(), rv0.copy()
    y, s, mean, rstd = fg.batch_norm_forward(x, w, b, rm, rv, momentum=0.2)
    assert s is None
    xv = x.astype(np.float64)
    yr, mr, vr = bn_ref(xv, w.astype(np.float64), b.astype(np.float64), 1e-5)
    # The library's statistics are the all-reducible sums {Σ s, Σ s², N} in f64 (the split form's), so
    # var = Σ s²/N − mean² carries an absolute error of a few f64 units of mean² + var: relative to
    # var + eps that is eps64·(mean² + var)/(var + eps), large when a channel's values nearly agree
    # (seen: two rows with var 7e-6 around 0.95, rstd off by 1.3e-12). The reference is two-pass;
    # the statistics' tolerance adds that bound (f32's tolerance is far above it).
    cond = float(np.max((mr**2 + vr) / (vr + 1e-5)))
    tol_s = tol(dt) + 8 * np.finfo(np.float64).eps * cond
    # x̂ = (x − mean)·rstd is formed with the saved mean, which is f32 for every dtype but f64: where
    # a channel's values nearly agree (seen: two rows 0.9369 and 0.9388, var 9e-7 against eps 1e-5,
    # rstd 302) that rounding, and x − mean's own, move x̂ by up to eps_acc·|mean|·rstd, far above
    # f32's tolerance relative to x̂. dxh: that bound a channel; y, dx and dw take it into theirs.
    dxh = 2 * np.finfo(acc).eps * np.abs(mr) / np.sqrt(vr + 1e-5)
    tol_y = tol_s + float(np.linalg.norm(np.broadcast_to(dxh * np.abs(w.astype(np.float64)), shape)) /
                          max(np.linalg.norm(yr), 1e-300))
    assert relerr(y, yr) <= tol_y and relerr(mean, mr) <= tol(dt) and relerr(rstd, 1 / np.sqrt(vr + 1e-5)) <= tol_s
    n = xv.size // c
    # the running statistics: (1 − m)·old + m·batch, the variance unbiased; compared at a tolerance
    # far below the update's size (0.2·|batch − old|)
    want_m, want_v = 0.8 * rm0 + 0.2 * mr, 0.8 * rv0 + 0.2 * vr * n / (n - 1)
    assert np.max(np.abs(rm - want_m)) <= 1e-4 * (1 + np.max(np.abs(want_m))) if dt != np.float64 else \
        np.max(np.abs(rm - want_m)) <= 1e-12
    assert relerr(rv, want_v) <= (1e-12 if dt == np.float64 else 1e-6)
    assert np.max(np.abs(rm - rm0)) > 1e-3 or n < 3  # the update happened
    # evaluation: the running statistics normalize, nothing is updated
    rm2, rv2 = rm.copy(), rv.copy()
    ye, _, me, re = fg.batch_norm_forward(x, w, b, rm2, rv2, training=False)
    assert np.array_equal(rm2, rm) and np.array_equal(rv2, rv)
    yer = (xv - rm) / np.sqrt(rv.astype(np.float64) + 1e-5) * w.astype(np.float64) + b.astype(np.float64)
    assert relerr(ye, yer) <= tol(dt)
    # backward (training and evaluation)
    dy = cast(data(rng, shape), dt)
    dyv = dy.astype(np.float64).reshape(-1, c)
    xh = ((xv - mr) / np.sqrt(vr + 1e-5)).reshape(-1, c)
    dx, _, dw, db = fg.batch_norm_backward(dy, x, w, mean, rstd)
    g = dyv * w.astype(np.float64)
    dref = (g - g.mean(0) - xh * (g * xh).mean(0)) / np.sqrt(vr + 1e-5)
    # dx's terms are g·rstd times O(1) factors of x̂: x̂'s error enters them three times
    assert err_terms(dx, dref.reshape(shape), (g / np.sqrt(vr + 1e-5)).reshape(shape)) <= tol_s + 3 * float(dxh.max())
    # dw and db are sums over the rows: relative to their terms' magnitudes (two rows can cancel)
    tol_w = tol_s + float(np.linalg.norm(np.abs(dyv).sum(0) * dxh) / max(np.linalg.norm(np.abs(dyv * xh).sum(0)), 1e-300))
    assert err_terms(dw, (dyv * xh).sum(0), np.abs(dyv * xh).sum(0)) <= tol_w
    assert err_terms(db, dyv.sum(0), np.abs(dyv).sum(0)) <= tol(dt)
    dxe, _, _, _ = fg.batch_norm_backward(dy, x, w, me, re, training=False, need=(True, False, False, False))
    assert relerr(dxe, (dyv * w.astype(np.float64) / np.sqrt(rv.astype(np.float64) + 1e-5)).reshape(shape)) <= tol(dt)


def test_batch_norm_residual_dropout_and_split(rng):
    """s = x + dropout(r) normalized (PatchTST's post-norm residual); the split form over two halves
    with the sums added (an all-reduce) gives the one-device result."""
    x, r, w, b = data(rng, (40, 6)), data(rng, (40, 6)), data(rng, 6), data(rng, 6)
    p, seed, offset = 0.3, 777, 5
    y, s, mean, rstd = fg.batch_norm_forward(x, w, b, r=r, p=p, seed=seed, offset=offset)
    sr = x + r * mask(p, seed, offset, x.size, True).reshape(x.shape)
    assert relerr(s, sr) <= 1e-12 and relerr(y, bn_ref(sr, w, b, 1e-5)[0]) <= 1e-12
    # the split form: each half's sums (the dropout index of a half's rows is its own), summed
    s1, _ = fg.batch_norm_stats(sr[:25])
    s2, _ = fg.batch_norm_stats(sr[25:])
    sums = s1 + s2
    assert sums[-1] == 40 and relerr(sums[:6], sr.sum(0)) <= 1e-12 and relerr(sums[6:12], (sr * sr).sum(0)) <= 1e-12
    rm, rv = np.zeros(6), np.ones(6)
    y1, m1, q1 = fg.batch_norm_apply(sr[:25], sums, w, b, rm, rv)
    assert relerr(y1, y[:25]) <= 1e-12 and relerr(m1, mean) <= 1e-12 and relerr(q1, rstd) <= 1e-12
    assert relerr(rv, 0.9 + 0.1 * sr.var(0) * 40 / 39) <= 1e-12
    dy = data(rng, (40, 6))
    b1 = fg.batch_norm_backward_stats(dy[:25], sr[:25], mean, rstd)
    b2 = fg.batch_norm_backward_stats(dy[25:], sr[25:], mean, rstd)
    dx_all, _, dw_all, db_all = fg.batch_norm_backward(dy, sr, w, mean, rstd)
    dx1, _, dw1, db1 = fg.batch_norm_backward_apply(dy[:25], sr[:25], w, mean, rstd, b1 + b2)
    assert relerr(dx1, dx_all[:25]) <= 1e-12 and relerr(dw1, dw_all) <= 1e-12 and relerr(db1, db_all) <= 1e-12


# ------------------------------------------------------------------ dropout


@pytest.mark.parametrize("dt", DTYPES)
def test_dropout_mask_and_backward(rng, dt):
    shape = (37, 129)
    x = cast(data(rng, shape), dt)
    p, seed, offset = 0.3, 0xDEADBEEFCAFE, 1 << 40
    y = fg.dropout_forward(x, p, seed, offset)
    m = mask(p, seed, offset, x.size, dt == np.float64).reshape(shape)
    want = (x.astype(np.float32) * m.astype(np.float32)).astype(dt) if dt != np.float64 else x * m
    assert np.array_equal(y, want)  # every element: the mask of rng.h, x·scale rounded once
    assert abs((m == 0).mean() - p) < 5 * math.sqrt(p * (1 - p) / m.size)
    dx = fg.dropout_backward(x, p, seed, offset)
    assert np.array_equal(dx, y)  # the backward regenerates the forward's mask
    assert not np.array_equal(fg.dropout_forward(x, p, seed, offset + 1), y)  # another offset, another mask
    assert np.array_equal(fg.dropout_forward(x, 0.0, seed, offset), x)
    assert not np.any(fg.dropout_forward(x, 1.0, seed, offset))


# ------------------------------------------------------------------ RevIN


def test_revin(rng):
    B, L, T, C = 3, 50, 12, 5
    x, w, b = data(rng, (B, L, C)), data(rng, C) + 1.5, data(rng, C)
    mean, stdev = fg.revin_stats(x)
    assert relerr(mean, x.mean(1)) <= 1e-12 and relerr(stdev, np.sqrt(x.var(1) + 1e-5)) <= 1e-12
    last, stdev2 = fg.revin_stats(x, subtract_last=True)
    assert np.array_equal(last, x[:, -1]) and relerr(stdev2, stdev) <= 1e-12
    y = fg.revin_forward(x, mean, stdev, w, b)
    yr = (x - mean[:, None]) / stdev[:, None] * w + b
    assert relerr(y, yr) <= 1e-12
    pred = data(rng, (B, T, C))
    out = fg.revin_forward(pred, mean, stdev, w, b, denorm=True)
    outr = (pred - b) / (w + 1e-10) * stdev[:, None] + mean[:, None]
    assert relerr(out, outr) <= 1e-12
    # round trip: denorm(norm(x)) = x but for the eps² the denorm adds to w
    assert relerr(fg.revin_forward(y, mean, stdev, w, b, denorm=True), x) <= 1e-9
    dy = data(rng, (B, L, C))
    dx, dw, db = fg.revin_backward(dy, x, mean, stdev, w, b)
    assert relerr(dx, dy * w / stdev[:, None]) <= 1e-12
    assert relerr(dw, (dy * (x - mean[:, None]) / stdev[:, None]).sum((0, 1))) <= 1e-12
    assert relerr(db, dy.sum((0, 1))) <= 1e-12
    dout = data(rng, (B, T, C))
    dx, dw, db = fg.revin_backward(dout, pred, mean, stdev, w, b, denorm=True)
    den = w + 1e-10
    assert relerr(dx, dout * stdev[:, None] / den) <= 1e-12
    assert relerr(dw, (-dout * stdev[:, None] * (pred - b) / den ** 2).sum((0, 1))) <= 1e-12
    assert relerr(db, (-dout * stdev[:, None] / den).sum((0, 1))) <= 1e-12


# ------------------------------------------------------------------ errors


def test_bad_options_are_refused(rng):
    x = data(rng, (4, 8))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(fg.FastgradError) as e:
            fg.norm_forward(x, eps=bad)
        assert e.value.status == _lib.ERR_INVALID_VALUE and "eps" in str(e.value)
    with pytest.raises(fg.FastgradError) as e:
        fg.dropout_forward(x, 1.5, 1)
    assert e.value.status == _lib.ERR_INVALID_VALUE
    with pytest.raises(fg.FastgradError) as e:
        fg.batch_norm_forward(x, running_mean=np.zeros(8), running_var=np.ones(8), momentum=1.5)
    assert e.value.status == _lib.ERR_INVALID_VALUE and "momentum" in str(e.value)
    with pytest.raises(fg.FastgradError) as e:  # evaluation without running statistics
        fg.batch_norm_forward(x, training=False)
    assert e.value.status == _lib.ERR_NULL_POINTER
    with pytest.raises(fg.FastgradError) as e:  # C mismatch
        fg.batch_norm_forward(x, np.ones(7))
    assert e.value.status == _lib.ERR_SHAPE
    with pytest.raises(ValueError):
        fg.norm_forward(x, kind="batch")

"""The numpy path on the CPU backend against float64 numpy references: every op,
float32/float16/float64, awkward shapes, strided views, accumulate, bad input."""
import numpy as np
import pytest
from conftest import TOL, data, relerr

import fastgrad as fg
from fastgrad import _lib

DTYPES = [np.float32, np.float16, np.float64]


def rand(rng, shape, dtype):
    return data(rng, shape).astype(dtype)


def f64(a):
    return np.asarray(a, dtype=np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,k,m", [((1,), 1, 1), ((3,), 17, 5), ((2, 7), 127, 33), ((1,), 1000, 3), ((129,), 64, 1)])
def test_linear(rng, dtype, lead, k, m):
    tol = TOL[np.dtype(dtype).name]
    x, w, b = rand(rng, lead + (k,), dtype), rand(rng, (m, k), dtype), rand(rng, (m,), dtype)
    dy = rand(rng, lead + (m,), dtype)
    assert relerr(fg.linear_forward(x, w, b), f64(x) @ f64(w).T + f64(b)) <= tol
    assert relerr(fg.linear_forward(x, w), f64(x) @ f64(w).T) <= tol
    assert relerr(fg.linear_backward_input(dy, w), f64(dy) @ f64(w)) <= tol
    dy2, x2 = f64(dy).reshape(-1, m), f64(x).reshape(-1, k)
    assert relerr(fg.linear_backward_weight(dy, x), dy2.T @ x2) <= tol
    assert relerr(fg.linear_backward_bias(dy), dy2.sum(0)) <= tol
    # accumulate adds into what is there
    db = rand(rng, (m,), dtype)
    ref = f64(db) + dy2.sum(0)
    fg.linear_backward_bias(dy, out=db, accumulate=True)
    assert relerr(db, ref) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_strided(rng, dtype):
    tol = TOL[np.dtype(dtype).name]
    big = rand(rng, (40, 70), dtype)
    x = big[::2, 3:60]                    # row stride 140 elements, not contiguous
    wt = rand(rng, (57, 23), dtype)
    w = wt.T                              # [23, 57] column-major view
    y = fg.linear_forward(x, w)
    assert relerr(y, f64(x) @ f64(w).T) <= tol
    out = np.full((20, 30), np.nan, dtype=dtype)[:, 4:27]  # padded rows
    fg.linear_forward(x, w, out=out)
    assert relerr(out, f64(x) @ f64(w).T) <= tol
    with pytest.raises(fg.FastgradError, match="y needs a unit stride"):
        fg.linear_forward(x, w, out=np.empty((20, 46), dtype=dtype)[:, ::2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ash,bsh", [((5, 7), (7, 3)), ((4, 5, 7), (4, 7, 3)), ((4, 5, 7), (7, 3)), ((5, 7), (4, 7, 3)),
                                     ((3, 1, 129), (129, 17))])
def test_matmul(rng, dtype, ash, bsh):
    tol = TOL[np.dtype(dtype).name]
    a, b = rand(rng, ash, dtype), rand(rng, bsh, dtype)
    c = f64(a) @ f64(b)
    assert relerr(fg.matmul_forward(a, b), c) <= tol
    dc = rand(rng, c.shape, dtype)
    da_ref = f64(dc) @ np.swapaxes(f64(b), -1, -2)
    db_ref = np.swapaxes(f64(a), -1, -2) @ f64(dc)
    if a.ndim == 2 and da_ref.ndim == 3:
        da_ref = da_ref.sum(0)
    if b.ndim == 2 and db_ref.ndim == 3:
        db_ref = db_ref.sum(0)
    assert relerr(fg.matmul_backward_input(dc, b, batched=a.ndim == 3), da_ref) <= tol
    assert relerr(fg.matmul_backward_other(a, dc, batched=b.ndim == 3), db_ref) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,m", [(1, 1), (3, 17), (1000, 7), (64, 129)])
def test_outer(rng, dtype, n, m):
    tol = TOL[np.dtype(dtype).name]
    x, y, dz = rand(rng, (n,), dtype), rand(rng, (m,), dtype), rand(rng, (n, m), dtype)
    assert relerr(fg.outer_forward(x, y), np.outer(f64(x), f64(y))) <= tol
    assert relerr(fg.outer_backward_input(dz, y), f64(dz) @ f64(y)) <= tol
    assert relerr(fg.outer_backward_other(dz, x), f64(dz).T @ f64(x)) <= tol
    assert relerr(fg.outer_forward(x[::-1].copy()[::1], y), np.outer(f64(x[::-1]), f64(y))) <= tol


def test_errors(rng):
    x, w = rand(rng, (6, 8), np.float32), rand(rng, (4, 7), np.float32)
    out = np.full((6, 4), 7.0, dtype=np.float32)
    with pytest.raises(fg.FastgradError) as e:
        fg.linear_forward(x, w, out=out)
    assert e.value.name == "FG_ERR_SHAPE" and e.value.status == _lib.ERR_SHAPE
    assert "w.shape[1]=7" in str(e.value)
    assert np.all(out == 7.0), "output written on bad input"
    with pytest.raises(fg.FastgradError) as e:
        fg.linear_forward(x, rand(rng, (4, 8), np.float64))
    assert e.value.name == "FG_ERR_DTYPE" and "w.dtype=f64" in str(e.value)
    with pytest.raises(fg.FastgradError) as e:
        fg.linear_forward(x[:, ::-1], rand(rng, (4, 8), np.float32))
    assert e.value.name == "FG_ERR_UNSUPPORTED" and "negative" in str(e.value)
    with pytest.raises(TypeError, match="uint8"):
        fg.linear_forward(x.astype(np.uint8), w)
    with pytest.raises(fg.FastgradError, match="x.dtype is i32 but it must be a float dtype"):
        fg.linear_forward(x.astype(np.int32), w)
    with pytest.raises(ValueError, match="zero stride"):
        fg.linear_forward(np.broadcast_to(x[:1], (6, 8)), rand(rng, (4, 8), np.float32))
    with pytest.raises(fg.FastgradError) as e:
        fg.linear_forward(x, rand(rng, (4, 8), np.float32), out=x[:, :4])
    assert e.value.name == "FG_ERR_ALIAS"


def test_plan_info(rng):
    x, w = rand(rng, (3, 8), np.float64), rand(rng, (4, 8), np.float64)
    info = fg.plan_info("linear_forward", dict(x=x, w=w, y=np.empty((3, 4))))
    assert info["backend"] == "cpu" and info["op"] == "linear_forward" and info["deterministic"]
    assert info["math"] == _lib.F64 and info["accumulator"] == _lib.F64  # the f64 path says so
    assert fg.__version__.count(".") == 2

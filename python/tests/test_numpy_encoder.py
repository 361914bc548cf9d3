"""fg_encoder_layer_* through the ctypes binding on numpy arrays (the CPU backend, no torch): a
float64 numpy model of the layer (pre-norm LayerNorm; post-norm BatchNorm with PatchTST's residual
scores and running statistics; separate and packed q/k/v) for the forward, central finite
differences for the backward, the cache sizes of the two save policies, and refusals that name
their argument and leave the output untouched."""
import math

import numpy as np
import pytest
from conftest import data, relerr

import fastgrad as fg
from fastgrad import _lib

import attention_ref

_erf = np.vectorize(math.erf)


def gelu(u):
    return 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))


def params_of(rng, d, dff, norm, separate):
    p = {}
    if separate:
        for k in "qkv":
            p[f"w_{k}"], p[f"b_{k}"] = data(rng, (d, d)) / math.sqrt(d), data(rng, (d,))
    else:
        p["w_qkv"], p["b_qkv"] = data(rng, (3 * d, d)) / math.sqrt(d), data(rng, (3 * d,))
    p["w_o"], p["b_o"] = data(rng, (d, d)) / math.sqrt(d), data(rng, (d,))
    p["w_1"], p["b_1"] = data(rng, (dff, d)) / math.sqrt(d), data(rng, (dff,))
    p["w_2"], p["b_2"] = data(rng, (d, dff)) / math.sqrt(dff), data(rng, (d,))
    for i in (1, 2):
        p[f"norm{i}_w"], p[f"norm{i}_b"] = 1 + 0.3 * data(rng, (d,)), 0.3 * data(rng, (d,))
    if norm == "post_batch":
        for i in (1, 2):
            p[f"running_mean{i}"], p[f"running_var{i}"] = data(rng, (d,)), 0.5 + rng.uniform(size=d)
    return p


def qkv_weights(p, d):
    if "w_qkv" in p:
        return [p["w_qkv"][i * d:(i + 1) * d] for i in range(3)], [p["b_qkv"][i * d:(i + 1) * d] for i in range(3)]
    return [p[f"w_{k}"] for k in "qkv"], [p[f"b_{k}"] for k in "qkv"]


def reference(p, x, heads, norm, act, eps=1e-5, momentum=0.1, causal=False, lengths=None, scores_in=None,
              train=True):
    """(y, scores, running statistics after the call) in float64."""
    b, l, d = x.shape
    hd = d // heads
    stats = {k: v.copy() for k, v in p.items() if k.startswith("running_")}

    def attn(u):
        (wq, wk, wv), (bq, bk, bv) = qkv_weights(p, d)
        q, k, v = ((u @ w.T + bb).reshape(b, l, heads, hd).transpose(0, 2, 1, 3) for w, bb in
                   ((wq, bq), (wk, bk), (wv, bv)))
        o, _, s = attention_ref.forward(q, k, v, causal, None, lengths, scores_in)
        return o.transpose(0, 2, 1, 3).reshape(b, l, d) @ p["w_o"].T + p["b_o"], s

    def ffn(u):
        pre = u @ p["w_1"].T + p["b_1"]
        return (gelu(pre) if act == "gelu" else np.maximum(pre, 0)) @ p["w_2"].T + p["b_2"]

    def layer_norm(u, i):
        mu, var = u.mean(-1, keepdims=True), u.var(-1, keepdims=True)
        return (u - mu) / np.sqrt(var + eps) * p[f"norm{i}_w"] + p[f"norm{i}_b"]

    def batch_norm(u, i):
        t = u.reshape(-1, d)
        if train:
            mu, var = t.mean(0), t.var(0)
            n = t.shape[0]
            stats[f"running_mean{i}"] = (1 - momentum) * stats[f"running_mean{i}"] + momentum * mu
            stats[f"running_var{i}"] = (1 - momentum) * stats[f"running_var{i}"] + momentum * var * n / (n - 1)
        else:
            mu, var = stats[f"running_mean{i}"], stats[f"running_var{i}"]
        return (u - mu) / np.sqrt(var + eps) * p[f"norm{i}_w"] + p[f"norm{i}_b"]

    if norm == "pre_layer":
        a, s = attn(layer_norm(x, 1))
        h = x + a
        return h + ffn(layer_norm(h, 2)), s, stats
    nf = batch_norm if norm == "post_batch" else layer_norm
    a, s = attn(x)
    h = nf(x + a, 1)
    return nf(h + ffn(h), 2), s, stats


def layer_call(p, x, heads, dff, norm, act, train=True, causal=False, lengths=None, scores_in=None,
               return_scores=False, save="all"):
    desc = fg.encoder_desc(x.shape[-1], heads, dff, act, norm, causal=causal, residual_scores=return_scores or
                           scores_in is not None, save=save)
    y, s, cache = fg.encoder_layer_forward(desc, x, p, lengths, scores_in, train, return_scores=return_scores)
    return desc, y, s, cache


@pytest.mark.parametrize("norm,act,separate", [("pre_layer", "gelu", False), ("post_layer", "relu", True),
                                               ("post_batch", "gelu", True)])
def test_forward_against_numpy(rng, norm, act, separate):
    b, l, d, h, dff = 3, 13, 24, 4, 40
    p = params_of(rng, d, dff, norm, separate)
    x = data(rng, (b, l, d))
    lengths = np.array([13, 5, 9], dtype=np.int64)
    scores_in = rng.normal(size=(b, h, l, l)) if norm == "post_batch" else None
    stats_before = {k: v.copy() for k, v in p.items() if k.startswith("running_")}
    _, y, s, _ = layer_call(p, x, h, dff, norm, act, lengths=lengths, scores_in=scores_in,
                            return_scores=norm == "post_batch")
    ref_p = dict(p, **stats_before)
    y_ref, s_ref, stats = reference(ref_p, x, h, norm, act, lengths=lengths, scores_in=scores_in)
    assert relerr(y, y_ref) <= 1e-12 and np.max(np.abs(y - y_ref)) <= 1e-11 * np.max(np.abs(y_ref))
    if norm == "post_batch":
        finite = np.isfinite(s_ref)
        assert np.array_equal(np.isfinite(s), finite), "the scores are -inf exactly where masked"
        assert relerr(s[finite], s_ref[finite]) <= 1e-12
        for k, v in stats.items():  # updated in place, unbiased variance, momentum 0.1
            assert relerr(p[k], v) <= 1e-12, k
            assert relerr(p[k], stats_before[k]) > 1e-3, f"{k} was not updated"
        # evaluation: the running statistics normalize, and stay as they are
        kept = {k: p[k].copy() for k in stats}
        _, y_eval, _, cache = layer_call(p, x, h, dff, norm, act, train=False, lengths=lengths, scores_in=scores_in)
        assert cache is None
        y_eval_ref, _, _ = reference(p, x, h, norm, act, lengths=lengths, scores_in=scores_in, train=False)
        assert relerr(y_eval, y_eval_ref) <= 1e-12
        for k in stats:
            assert np.array_equal(p[k], kept[k]), f"{k} changed in evaluation"


def loss_grads(p, x, w, heads, dff, norm, act, scores_in, ws):
    desc, y, s, cache = layer_call(p, x, heads, dff, norm, act, scores_in=scores_in, return_scores=True)
    dx, ds, grads = fg.encoder_layer_backward(desc, w, x, p, cache, None, scores_in, ws)
    return float((y * w).sum() + (np.where(np.isfinite(s), s, 0) * ws).sum()), dx, ds, grads


@pytest.mark.parametrize("norm", ["pre_layer", "post_batch"])
def test_backward_finite_differences(rng, norm):
    b, l, d, h, dff = 2, 7, 12, 3, 20
    p = params_of(rng, d, dff, norm, separate=norm == "post_batch")
    x = data(rng, (b, l, d))
    scores_in = rng.normal(size=(b, h, l, l))
    w, ws = rng.normal(size=x.shape), rng.normal(size=scores_in.shape)
    _, dx, ds, grads = loss_grads(p, x, w, h, dff, norm, "gelu", scores_in, ws)
    assert set(grads) == {k for k in p if not k.startswith("running_")}
    eps = 1e-6

    def value():
        desc = fg.encoder_desc(d, h, dff, "gelu", norm, residual_scores=True)
        y, s, _ = fg.encoder_layer_forward(desc, x, p, None, scores_in, True, return_scores=True)
        return float((y * w).sum() + (s * ws).sum())

    def directional(t, g):
        v = rng.uniform(-1, 1, size=t.shape)
        t += eps * v
        up = value()
        t -= 2 * eps * v
        down = value()
        t += eps * v
        fd = (up - down) / (2 * eps)
        an = float((g * v).sum())
        assert abs(fd - an) <= 1e-7 * max(1.0, abs(an)), f"{an} vs finite difference {fd}"

    directional(x, dx)
    directional(scores_in, ds)
    for k, g in grads.items():  # b_k too: the carried scores' gradient reaches it (q·b_k)
        directional(p[k], g)


def test_accumulate_and_partial_gradients(rng):
    b, l, d, h, dff = 2, 5, 8, 2, 16
    p = params_of(rng, d, dff, "pre_layer", False)
    x, dy = data(rng, (b, l, d)), data(rng, (b, l, d))
    desc, _, _, cache = layer_call(p, x, h, dff, "pre_layer", "gelu")
    dx, _, full = fg.encoder_layer_backward(desc, dy, x, p, cache)
    start = {k: data(rng, v.shape) for k, v in full.items()}
    out = {k: v.copy() for k, v in start.items()}
    out["dx"] = np.full_like(x, 0.25)
    dx2, _, acc = fg.encoder_layer_backward(desc, dy, x, p, cache, out=out, accumulate=True)
    assert relerr(dx2, dx + 0.25) <= 1e-13
    for k in full:
        assert relerr(acc[k], full[k] + start[k]) <= 1e-13, k
    _, _, only = fg.encoder_layer_backward(desc, dy, x, p, cache, need=["w_1"], need_dx=False)
    assert set(only) == {"w_1"} and np.array_equal(only["w_1"], full["w_1"]), "deterministic, and alone the same"


def test_cache_sizes():
    desc_all = fg.encoder_desc(64, 4, 256, norm="pre_layer")
    desc_less = fg.encoder_desc(64, 4, 256, norm="pre_layer", save="less")
    b, l = 8, 33
    c_all, ws_all = fg.encoder_layer_sizes(desc_all, _lib.F32, b, l)
    c_less, _ = fg.encoder_layer_sizes(desc_less, _lib.F32, b, l)
    assert c_all > 0 and ws_all >= 0
    assert c_all - c_less >= b * l * 256 * 4, "SAVE_LESS keeps no [B·L, d_ff] pre-activation"
    c_min, ws_min = fg.encoder_layer_sizes(fg.encoder_desc(64, 4, 256, norm="pre_layer", save="min"), _lib.F32, b, l)
    assert c_less - c_min >= b * l * (256 + 2 * 64) * 4, "SAVE_MIN keeps neither the FFN hidden nor u1, u2"
    assert ws_min - ws_all >= b * l * 256 * 4, "SAVE_MIN's workspace holds the recomputed pre-activation too"
    assert fg.encoder_layer_sizes(desc_all, _lib.F32, 2 * b, l)[0] > c_all


@pytest.mark.parametrize("save,norm", [("less", "post_layer"), ("min", "post_layer"), ("min", "pre_layer"),
                                       ("min", "post_batch")])
def test_saving_less_same_gradients(rng, save, norm):
    """'less' and 'min' recompute what they do not keep with the forward's own calls: the same bits."""
    b, l, d, h, dff = 2, 6, 8, 2, 24
    p = params_of(rng, d, dff, norm, False)
    x, dy = data(rng, (b, l, d)), data(rng, (b, l, d))
    res = []
    for mode in ("all", save):
        desc, y, _, cache = layer_call(p, x, h, dff, norm, "gelu", save=mode)
        res.append((y,) + fg.encoder_layer_backward(desc, dy, x, p, cache))
    (y1, dx1, _, g1), (y2, dx2, _, g2) = res
    assert np.array_equal(y1, y2)
    assert relerr(dx2, dx1) <= 1e-13
    for k in g1:
        assert relerr(g2[k], g1[k]) <= 1e-13, k


def test_context_workspace_is_reported(rng):
    """An evaluation forward without a cache keeps the layer's temporaries in the context's own
    workspace, which a framework's memory statistics do not see: fg.workspace_bytes() reports it,
    at least the [B·L, d_ff] FFN hidden it held."""
    b, l, d, h, dff = 3, 7, 16, 4, 48
    p = params_of(rng, d, dff, "pre_layer", False)
    x = data(rng, (b, l, d))
    fg.release_workspace()  # what earlier tests grew it to
    assert fg.workspace_bytes() == 0, "released"
    layer_call(p, x, h, dff, "pre_layer", "gelu", train=False)
    held = fg.workspace_bytes()
    assert held >= b * l * dff * x.itemsize, held
    big = data(rng, (40 * b, l, d))
    layer_call(p, big, h, dff, "pre_layer", "gelu", train=False)
    assert fg.workspace_bytes() >= 40 * b * l * dff * x.itemsize > held, "grown for the larger batch"
    fg.release_workspace()
    assert fg.workspace_bytes() == 0, "released"
    layer_call(p, x, h, dff, "pre_layer", "gelu", train=False)
    assert b * l * dff * x.itemsize <= fg.workspace_bytes() < 40 * b * l * dff * x.itemsize, \
        "grown again, to this call's need"


def test_refusals_name_the_argument_and_write_nothing(rng):
    d, h, dff = 8, 2, 16
    p = params_of(rng, d, dff, "pre_layer", False)
    x = data(rng, (2, 5, d))
    y = np.full_like(x, np.nan)
    with pytest.raises(fg.FastgradError, match="heads") as e:
        fg.encoder_layer_forward(fg.encoder_desc(d, 3, dff, norm="pre_layer"), x, p, out=y)
    assert e.value.status == _lib.ERR_INVALID_VALUE and np.isnan(y).all()
    with pytest.raises(fg.FastgradError, match="d_model") as e:
        fg.encoder_layer_forward(fg.encoder_desc(d + 2, h, dff, norm="pre_layer"), x, p, out=y)
    assert e.value.status == _lib.ERR_SHAPE and np.isnan(y).all()
    bad = dict(p, w_q=p["w_qkv"][:d])  # packed and separate at once
    with pytest.raises(fg.FastgradError) as e:
        fg.encoder_layer_forward(fg.encoder_desc(d, h, dff, norm="pre_layer"), x, bad, out=y)
    assert e.value.status == _lib.ERR_INVALID_VALUE and np.isnan(y).all()
    with pytest.raises(fg.FastgradError, match="dropout") as e:
        fg.encoder_layer_forward(fg.encoder_desc(d, h, dff, norm="pre_layer", dropout=1.0), x, p, out=y)
    assert e.value.status == _lib.ERR_INVALID_VALUE and np.isnan(y).all()
    with pytest.raises(ValueError, match="activation"):
        fg.encoder_desc(d, h, dff, activation="tanh")
    with pytest.raises(ValueError, match="parameter"):
        fg.encoder_layer_forward(fg.encoder_desc(d, h, dff, norm="pre_layer"), x, dict(p, w_3=p["w_o"]))


@pytest.mark.parametrize("norm,separate,save", [("post_batch", True, "all"), ("post_layer", False, "min")])
def test_stack_matches_layer_by_layer(rng, norm, separate, save):
    """encoder_forward / encoder_backward (three layers, residual scores carried as the layers' q
    and k) against the same layers one call each with [B, H, L, L] scores carried, layer i with
    (seed, offset + i): y, dx, every gradient and the running statistics."""
    b, l, d, h, dff, n = 2, 7, 8, 2, 12, 3
    ps = [params_of(rng, d, dff, norm, separate) for _ in range(n)]
    ps2 = [{k: v.copy() for k, v in p.items()} for p in ps]
    x, dy = data(rng, (b, l, d)), data(rng, (b, l, d))
    desc = fg.encoder_desc(d, h, dff, "gelu", norm, residual_scores=True, dropout=0.1, dropout_ffn=0.1,
                           dropout_attn=0.1, save=save)
    seed, offset = 12345, 77
    y, cache = fg.encoder_forward(desc, x, ps, train=True, seed=seed, offset=offset)
    dx, grads = fg.encoder_backward(desc, dy, x, ps, cache, seed=seed, offset=offset)
    xs, scores, caches = [x], [None], []
    for i in range(n):
        yi, si, ci = fg.encoder_layer_forward(desc, xs[-1], ps2[i], scores_in=scores[-1], seed=seed,
                                              offset=offset + i, return_scores=i < n - 1,
                                              scores_dtype=np.float64)
        xs.append(yi), scores.append(si), caches.append(ci)
    assert relerr(y, xs[-1]) <= 1e-12
    g, ds, ref_grads = dy, None, [None] * n
    for i in reversed(range(n)):
        g, ds, ref_grads[i] = fg.encoder_layer_backward(desc, g, xs[i], ps2[i], caches[i], scores_in=scores[i],
                                                        dscores_out=ds, seed=seed, offset=offset + i)
    assert relerr(dx, g) <= 1e-12
    for i in range(n):
        scale = max(np.linalg.norm(ref_grads[i][k]) for k in ref_grads[i])
        for k in ref_grads[i]:
            assert np.linalg.norm(grads[i][k] - ref_grads[i][k]) <= 1e-12 * scale, (i, k)
        for k in ps[i]:
            if k.startswith("running_"):
                assert relerr(ps[i][k], ps2[i][k]) <= 1e-12, (i, k)

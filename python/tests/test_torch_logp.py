"""The linear log-prob family through torch, against torch autograd on float64 copies
of the same (rounded) inputs: linear_logp with entropy, temperature, softcap and
ignore_index; the one-pass cross-entropy against F.cross_entropy (label smoothing,
ignore_index, z-loss); the module; bad targets; and, on CUDA, the memory bound."""
import numpy as np
import pytest
from conftest import data

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fastgrad as fg  # noqa: E402

from torch_helpers import DEVICES, DTYPES, err, tol  # noqa: E402


def inputs(rng, n, d, v, dtype, device, bias):
    h = torch.from_numpy(data(rng, (n, d)) * 2 / np.sqrt(d)).to(device=device, dtype=dtype).requires_grad_(True)
    w = torch.from_numpy(data(rng, (v, d))).to(device=device, dtype=dtype).requires_grad_(True)
    b = torch.from_numpy(data(rng, (v,))).to(device=device, dtype=dtype).requires_grad_(True) if bias else None
    t = torch.from_numpy(rng.integers(0, v, n)).to(device)
    return h, w, b, t


def ref_logits(h, w, b, T, cap):
    z = F.linear(h, w, b)
    if cap:
        z = cap * torch.tanh(z / cap)
    return z / T


def skip(device, dtype):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("f64 runs on the CPU backend only")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d,v,bias,T,cap,ignore", [(1, 1, 1, False, 1.0, 0.0, None), (17, 33, 300, True, 1.0, 0.0, None),
                                                     (64, 64, 5000, False, 0.7, 5.0, -100), (5, 16, 31, True, 2.0, 0.0, 3)])
def test_linear_logp(rng, device, dtype, n, d, v, bias, T, cap, ignore):
    skip(device, dtype)
    h, w, b, t = inputs(rng, n, d, v, dtype, device, bias)
    if ignore == -100:
        t[::3] = -100
    logp, ent = fg.linear_logp(h, w, t, b, temperature=T, softcap=cap, ignore_index=ignore, return_entropy=True,
                               max_tile_elements=4096)
    dl = torch.from_numpy(data(rng, (n,))).to(device)
    de = torch.from_numpy(data(rng, (n,))).to(device)
    (logp * dl.to(logp.dtype)).sum().add((ent * de.to(ent.dtype)).sum()).backward()
    hr, wr = h.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    br = b.detach().double().requires_grad_(True) if b is not None else None
    lp = torch.log_softmax(ref_logits(hr, wr, br, T, cap), -1)
    keep = (t != ignore) if ignore is not None else torch.ones_like(t, dtype=torch.bool)
    tt = torch.where(keep, t, 0)
    rl = torch.where(keep, lp.gather(1, tt[:, None])[:, 0], 0)
    re = torch.where(keep, -(lp.exp() * lp).sum(-1), 0)
    (rl * dl.double()).sum().add((re * de.double()).sum()).backward()
    assert logp.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert err(logp, rl) <= tol(dtype) and err(ent, re) <= tol(dtype)
    assert err(h.grad, hr.grad) <= tol(dtype) and err(w.grad, wr.grad) <= tol(dtype)
    if b is not None:
        assert err(b.grad, br.grad) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction,eps,zl", [("mean", 0.0, 0.0), ("sum", 0.1, 0.0), ("mean", 0.05, 1e-3)])
def test_cross_entropy(rng, device, dtype, reduction, eps, zl):
    skip(device, dtype)
    n, d, v = 40, 32, 777
    h, w, b, t = inputs(rng, n, d, v, dtype, device, True)
    t[5] = -100
    loss = fg.linear_cross_entropy(h, w, t, b, reduction=reduction, label_smoothing=eps, z_loss=zl,
                                   max_tile_elements=8 * 777)
    (loss * 1.5).backward()
    hr, wr, br = (x.detach().double().requires_grad_(True) for x in (h, w, b))
    z = F.linear(hr, wr, br)
    ref = F.cross_entropy(z, t, reduction=reduction, label_smoothing=eps, ignore_index=-100)
    if zl:
        keep = t != -100
        zterm = (torch.logsumexp(z, -1) ** 2 * keep).sum()
        ref = ref + zl * (zterm / keep.sum() if reduction == "mean" else zterm)
    (ref * 1.5).backward()
    assert err(loss, ref) <= tol(dtype)
    for got, want in ((h.grad, hr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        assert err(got, want) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_module_and_none(rng, device):
    h, w, _, t = inputs(rng, 3 * 7, 16, 100, torch.float32, device, False)
    h3 = h.detach().reshape(3, 7, 16).requires_grad_(True)
    t3 = t.reshape(3, 7)
    loss = fg.LinearCrossEntropy()(h3, w, t3)
    ref = F.cross_entropy(F.linear(h3.reshape(-1, 16), w), t3.reshape(-1))
    assert err(loss, ref) <= 1e-5
    loss.backward()
    none = fg.linear_cross_entropy(h3, w, t3, reduction="none")
    assert none.shape == (3, 7)
    assert err(none.mean(), ref) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_bad_target(rng, device):
    h, w, _, t = inputs(rng, 8, 4, 10, torch.float32, device, False)
    t[6] = 10
    fg.context_check(h.device)
    logp = fg.linear_logp(h, w, t)
    with pytest.raises(fg.FastgradError, match="row 6"):
        fg.context_check(h.device)
    assert torch.isnan(logp[6]) and torch.isfinite(torch.cat([logp[:6], logp[7:]])).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA memory bound")
def test_cuda_memory_bound(rng):
    n, d, v = 4096, 256, 65536  # 1 GiB of f32 logits
    h, w, _, t = inputs(rng, n, d, v, torch.bfloat16, "cuda", False)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fg.linear_cross_entropy(h, w, t)
    loss.backward()
    logp = fg.linear_logp(h, w, t)
    logp.sum().backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - 2 * (h.numel() + w.numel()) * 2  # minus the gradients
    assert extra < n * v * 4 / 4, f"peak extra {extra / 2**20:.0f} MiB"

"""fastgrad under torch.distributed on CPU (gloo): fg.SyncBatchNorm across 2 and 3 ranks against
BatchNorm over the concatenated batch (fastgrad's and torch's), the split API with simulated ranks
in one process, and a small fastgrad model in DistributedDataParallel against one process on the
same global batch.

The rank processes are spawned by torch.multiprocessing (file:// rendezvous, a 60 s collective
timeout so a mismatched collective fails instead of hanging) and write their results to files
that this process compares. Skipped without torch, torch.distributed or gloo.
"""
import datetime
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
import torch.multiprocessing as mp  # noqa: E402
from torch_helpers import err, tol as dtype_tol  # noqa: E402

import fastgrad as fg  # noqa: E402


def _seed(rng):
    return int(rng.integers(2**31))


def _spawn(fn, world, tmp_path, *args):
    mp.spawn(_entry, args=(fn, world, str(tmp_path), args), nprocs=world, join=True)
    return [torch.load(os.path.join(tmp_path, f"rank{r}.pt")) for r in range(world)]


def _entry(rank, fn, world, tmp, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        out = fn(rank, world, *args)
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ SyncBatchNorm

# rows per rank and shape kind, per world size (one spawn runs them all: starting the ranks is most
# of the time); 3 ranks hold unequal shards
CASES = {2: [([6, 6], "nc"), ([3, 3], "ncl"), ([2, 2], "view")], 3: [([5, 7, 4], "nc"), ([2, 3, 1], "ncl")]}
BN_DTYPES = [torch.float64, torch.float32]
C, L = 5, 7


def _bn_data(seed, rows, kind, dtype):
    """Global x, dy (and residual) of the case, [N, C] or [N, C, L] (view: a transposed [N, L, C])."""
    g = torch.Generator().manual_seed(seed)
    n = sum(rows)
    shape = (n, C) if kind == "nc" else (n, L, C) if kind == "view" else (n, C, L)
    mk = lambda: (torch.rand(shape, generator=g, dtype=torch.float64) * 3 - 1).to(dtype)  # noqa: E731
    x, dy, r = mk(), mk(), mk()
    if kind == "view":
        x, dy, r = x.transpose(1, 2), dy.transpose(1, 2), r.transpose(1, 2)
    w = torch.rand(C, generator=g, dtype=torch.float64).to(dtype) + 0.5
    b = torch.rand(C, generator=g, dtype=torch.float64).to(dtype) - 0.5
    return x, dy, r, w, b


def _bn_steps(module, x, dy, r=None):
    """Two training steps (the second with a residual when r is given), then evaluation; the
    outputs, the input (and residual) grads, the parameter grads and the running stats."""
    out = {}
    for step in range(2):
        xi = x.detach().clone().requires_grad_()
        ri = r.detach().clone().requires_grad_() if (r is not None and step == 1) else None
        if ri is None:
            y = module(xi)
        else:
            y, s = module(xi, residual=ri)
            y = y + 0.25 * s  # s's own use: its gradient flows into x and r too
        y.backward(dy)
        out[f"y{step}"], out[f"dx{step}"] = y.detach(), xi.grad
        if ri is not None:
            out["dr"] = ri.grad
        out[f"dw{step}"], out[f"db{step}"] = module.weight.grad.clone(), module.bias.grad.clone()
        module.weight.grad = module.bias.grad = None
    out["running_mean"], out["running_var"] = module.running_mean.clone(), module.running_var.clone()
    module.eval()
    out["eval"] = module(x.detach())
    module.train()
    return out


def _bn_worker(rank, world, seed):
    res = {}
    for i, (rows, kind) in enumerate(CASES[world]):
        for dtype in BN_DTYPES:
            x, dy, r, w, b = _bn_data(seed + i, rows, kind, dtype)
            lo = sum(rows[:rank])
            sl = slice(lo, lo + rows[rank])
            m = fg.SyncBatchNorm(C, momentum=0.3, dtype=dtype)
            with torch.no_grad():
                m.weight.copy_(w), m.bias.copy_(b)
            res[(i, dtype)] = _bn_steps(m, x[sl], dy[sl], r[sl] if kind != "nc" else None)
    return res


def _reference(seed, rows, kind, dtype, torch_ref):
    """fg.BatchNorm1d (dtype) or torch.nn.BatchNorm1d (f64) over the concatenated batch."""
    x, dy, r, w, b = _bn_data(seed, rows, kind, dtype)
    if torch_ref:
        x, dy, r, w, b = (t.double() for t in (x, dy, r, w, b))
        m = torch.nn.BatchNorm1d(C, momentum=0.3, dtype=torch.float64)
        with torch.no_grad():
            m.weight.copy_(w), m.bias.copy_(b)
        if kind != "nc":  # torch's BatchNorm1d has no residual: s = x + r, y = bn(s)
            class Res(torch.nn.Module):
                def __init__(self, bn):
                    super().__init__()
                    self.bn, self.weight, self.bias = bn, bn.weight, bn.bias
                    self.running_mean, self.running_var = bn.running_mean, bn.running_var

                def forward(self, x, residual=None):
                    if residual is None:
                        return self.bn(x)
                    s = x + residual
                    return self.bn(s), s
            m = Res(m)
    else:
        m = fg.BatchNorm1d(C, momentum=0.3, dtype=dtype)
        with torch.no_grad():
            m.weight.copy_(w), m.bias.copy_(b)
    return _bn_steps(m, x, dy, r if kind != "nc" else None)


def _gather(outs, key, param):
    """The global tensor from the ranks' pieces: concatenated rows, or for parameter grads the sum
    of each rank's share (DDP would average them: the gradient of the global-batch loss)."""
    if param:
        return sum(o[key] for o in outs)
    if key in ("running_mean", "running_var"):
        for o in outs[1:]:
            assert torch.equal(o[key], outs[0][key]), key  # every rank holds the same running stats
        return outs[0][key]
    return torch.cat([o[key] for o in outs])


@pytest.mark.parametrize("world", [2, 3])
def test_sync_batch_norm_matches_concatenated_batch(tmp_path, rng, world):
    """Every output, gradient and running stat equals BatchNorm over the concatenated batch, for
    [N, C], [N, C, L] and a transposed channels-last [N, C, L] view, in f64 and f32.
    Tolerances (relative 2-norm): f64 1e-12; f32 2e-6 against fastgrad's f32 BatchNorm and 1e-5
    (the suite's f32 tolerance) against torch's in f64. The split form reduces in f64, so it
    differs from the one-process kernel only in the order of its f64 sums and the final f32
    roundings; the eval output (running stats after two momentum updates) is likewise one
    rounding apart."""
    seed = _seed(rng)
    outs = _spawn(_bn_worker, world, tmp_path, seed)
    for i, (rows, kind) in enumerate(CASES[world]):
        for dtype in BN_DTYPES:
            ranks = [o[(i, dtype)] for o in outs]
            refs = [(_reference(seed + i, rows, kind, dtype, False), 1e-12 if dtype == torch.float64 else 2e-6),
                    (_reference(seed + i, rows, kind, dtype, True), 1e-12 if dtype == torch.float64 else 1e-5)]
            keys = list(ranks[0])
            assert ("dr" in keys) == (kind != "nc")
            for j, (ref, tol) in enumerate(refs):
                for k in keys:
                    got = _gather(ranks, k, k.startswith(("dw", "db")))
                    assert got.dtype == dtype, k
                    e = err(got, ref[k])
                    assert e <= tol, (rows, kind, dtype, ["fastgrad", "torch"][j], k, e, tol)


def test_sync_batch_norm_split_api_simulated_ranks(rng):
    """One process, four simulated ranks: the split API per shard with the f64 sums added by hand
    (what all_reduce does) gives BatchNorm over the concatenated batch: y, mean, rstd, running
    stats, dx, and the parameter grads (from the summed backward sums)."""
    x = torch.tensor(rng.uniform(-1, 2, (22, 3, 6)))  # channels last: rows are 22·3
    dy = torch.tensor(rng.normal(size=x.shape))
    w = torch.tensor(rng.uniform(0.5, 1.5, 6))
    b = torch.tensor(rng.normal(size=6))
    shards = [slice(0, 5), slice(5, 6), slice(6, 15), slice(15, 22)]
    rm0, rv0 = torch.tensor(rng.normal(size=6)), torch.tensor(rng.uniform(0.5, 2, 6))

    rm, rv = rm0.clone(), rv0.clone()
    y_ref, _, mean_ref, rstd_ref = fg.batch_norm_forward(x, w, b, rm, rv, momentum=0.2)
    dx_ref, _, dw_ref, db_ref = fg.batch_norm_backward(dy, x, w, mean_ref, rstd_ref)

    total = sum(fg.batch_norm_stats(x[s].contiguous())[0] for s in shards)
    assert total[-1] == x.shape[0] * x.shape[1]
    ys, dxs, rms = [], [], []
    for s in shards:  # every rank applies the same sums to its own rows and running stats
        rmi, rvi = rm0.clone(), rv0.clone()
        y, mean, rstd = fg.batch_norm_apply(x[s].contiguous(), total, w, b, rmi, rvi, momentum=0.2)
        assert err(mean, mean_ref) <= 1e-13 and err(rstd, rstd_ref) <= 1e-13
        ys.append(y), rms.append((rmi, rvi))
    bsum = sum(fg.batch_norm_backward_stats(dy[s].contiguous(), x[s].contiguous(), mean_ref, rstd_ref)
               for s in shards)
    for s in shards:
        dx, _, dw, db = fg.batch_norm_backward_apply(dy[s].contiguous(), x[s].contiguous(), w, mean_ref, rstd_ref,
                                                     bsum)
        dxs.append(dx)
        assert err(dw, dw_ref) <= 1e-12 and err(db, db_ref) <= 1e-12  # the whole batch's, from the sums
    assert err(torch.cat(ys), y_ref) <= 1e-12
    assert err(torch.cat(dxs), dx_ref) <= 1e-12
    for rmi, rvi in rms:
        assert err(rmi, rm) <= 1e-13 and err(rvi, rv) <= 1e-13


def test_sync_batch_norm_single_process_is_batch_norm(rng):
    """No process group: fg.SyncBatchNorm is fg.BatchNorm1d (same outputs, grads, running stats),
    and convert_sync_batchnorm swaps fg.BatchNorm1d layers, sharing their parameters and buffers."""
    assert not dist.is_initialized()
    net = torch.nn.Sequential(fg.Linear(4, 6, dtype=torch.float64), fg.BatchNorm1d(6, dtype=torch.float64),
                              torch.nn.Sequential(fg.BatchNorm1d(6, momentum=0.5, affine=False,
                                                                 dtype=torch.float64)))
    bn = net[1]
    conv = fg.convert_sync_batchnorm(net)
    assert isinstance(conv[1], fg.SyncBatchNorm) and isinstance(conv[2][0], fg.SyncBatchNorm)
    assert conv[1].weight is bn.weight and conv[1].running_mean is bn.running_mean
    assert conv[2][0].momentum == 0.5 and conv[2][0].weight is None
    x = torch.tensor(rng.normal(size=(9, 6, 4)))
    a, b = fg.SyncBatchNorm(6, dtype=torch.float64), fg.BatchNorm1d(6, dtype=torch.float64)
    ya, yb = a(x.requires_grad_()), b(x)
    assert torch.equal(ya, yb) and torch.equal(a.running_var, b.running_var)


# ------------------------------------------------------------------ DDP

D, H, V, B, STEPS = 8, 16, 11, 12, 3


class TinyNet(torch.nn.Module):
    """Linear → SyncBatchNorm → LinearAct(gelu) → residual add + LayerNorm → the vocab head's
    fused linear cross-entropy: every fastgrad module family in one step."""

    def __init__(self, dtype):
        super().__init__()
        kw = {"dtype": dtype}
        self.inp = fg.Linear(D, H, bias=False, **kw)  # a bias before BatchNorm has a zero gradient
        self.bn = fg.SyncBatchNorm(H, **kw)
        self.mlp = fg.LinearAct(H, H, act="gelu_tanh", **kw)
        self.ln = fg.LayerNorm(H, **kw)
        self.head = torch.nn.Parameter(torch.randn(V, H, **kw) * 0.3)

    def forward(self, x, target):
        h = self.bn(self.inp(x))
        y, _ = self.ln(self.mlp(h), residual=h)
        return fg.linear_cross_entropy(y, self.head, target)


def _ddp_data(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(B, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(STEPS)]
    ts = [torch.randint(V, (B,), generator=g) for _ in range(STEPS)]
    return xs, ts


def _train(model, seed, dtype, opt_name, shard):
    torch.manual_seed(seed)
    xs, ts = _ddp_data(seed + 1, dtype)
    params = list(model.parameters())
    opt = (fg.AdamW(params, lr=1e-2, weight_decay=0.01) if opt_name == "adamw"
           else torch.optim.SGD(params, lr=0.1, momentum=0.9))
    losses = []
    for x, t in zip(xs, ts):
        opt.zero_grad()
        loss = model(x[shard], t[shard])
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses


DDP_CONFIGS = [(torch.float64, "sgd"), (torch.float32, "sgd"), (torch.float32, "adamw")]  # fg.AdamW: no f64


def _ddp_worker(rank, world, seed):
    res = {}
    for dtype, opt_name in DDP_CONFIGS:
        torch.manual_seed(seed)
        model = TinyNet(dtype)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        per = B // world
        losses = _train(ddp, seed, dtype, opt_name, slice(rank * per, (rank + 1) * per))
        glob = torch.stack(losses)
        dist.all_reduce(glob)  # the global-batch loss: the mean of the equal shards' means
        res[(dtype, opt_name)] = {"loss": glob / world,
                                  "params": {n: p.detach().clone() for n, p in model.state_dict().items()}}
    return res


def test_ddp_matches_one_process(tmp_path, rng):
    """DDP over 2 gloo ranks (6 rows each) equals one process on the 12-row global batch, over 3
    optimizer steps (SGD with momentum in f64 and f32, fg.AdamW in f32: it takes no f64): the
    losses and every parameter and buffer (running stats included). f64: relative 1e-11. f32: relative 1e-5 (losses) and 2e-5 (parameters). The difference is
    only summation order: DDP sums each rank's 6-row gradient and divides by 2, one process
    reduces the 12 rows at once, and the SyncBatchNorm sums are all-reduced — a few f32
    roundings per gradient, which AdamW's m/√v step normalization passes on about unchanged at
    this size (no gradient near the eps floor)."""
    seed = _seed(rng)
    res = _spawn(_ddp_worker, 2, tmp_path, seed)
    for dtype, opt_name in DDP_CONFIGS:
        _check_ddp([r[(dtype, opt_name)] for r in res], seed, dtype, opt_name)


def _check_ddp(outs, seed, dtype, opt_name):
    torch.manual_seed(seed)
    ref = TinyNet(dtype)
    ref_losses = torch.stack(_train(ref, seed, dtype, opt_name, slice(None)))
    tl, tp = (1e-11, 1e-11) if dtype == torch.float64 else (1e-5, 2e-5)
    for o in outs:
        assert err(o["loss"], ref_losses) <= tl, (dtype, opt_name, o["loss"], ref_losses)
        for n, p in ref.state_dict().items():
            if p.is_floating_point():
                assert err(o["params"][n], p) <= tp, (dtype, opt_name, n, err(o["params"][n], p))
            else:
                assert torch.equal(o["params"][n], p), n
    for n in outs[0]["params"]:  # DDP keeps the replicas identical
        assert torch.equal(outs[0]["params"][n], outs[1]["params"][n]), n
    assert not np.allclose(ref_losses[0].item(), ref_losses[-1].item())  # it trained


# ------------------------------------------------------------------ vocabulary-parallel cross-entropy

# vocabulary and slice bounds per world size: unequal slices, and (3 ranks) a slice of one class
VP_BOUNDS = {2: (37, [0, 15, 37]), 3: (41, [0, 20, 21, 41])}
VP_N, VP_D = 13, 9
# (name, dtype, bias, kwargs of vocab_parallel_cross_entropy); "logp" runs vocab_parallel_logp
VP_CONFIGS = [
    ("mean+ignore", torch.float64, True, dict(reduction="mean", ignore_index=-100)),
    ("sum+zloss+weights+T+cap", torch.float64, True,
     dict(reduction="sum", z_loss=1e-3, temperature=0.7, softcap=4.0, ignore_index=3)),
    ("none+weights", torch.float64, False, dict(reduction="none", ignore_index=-100)),
    ("mean f32", torch.float32, True, dict(reduction="mean", ignore_index=-100, z_loss=1e-2)),
    ("sum bf16", torch.bfloat16, True, dict(reduction="sum", ignore_index=-100, z_loss=1e-3)),
    ("logp+entropy", torch.float64, True, dict(temperature=1.3, ignore_index=-100)),
]


def _vp_data(seed, world, dtype, bias, ignore_index=-100):
    """The global problem (same on every rank): h [N, D], w [V, D], b [V], targets with ignored rows,
    positive row weights, the upstream gradients."""
    V, _ = VP_BOUNDS[world]
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(VP_N, VP_D, generator=g, dtype=torch.float64) * 0.8).to(dtype)
    w = torch.randn(V, VP_D, generator=g, dtype=torch.float64).to(dtype)
    b = (torch.randn(V, generator=g, dtype=torch.float64) * 0.5).to(dtype) if bias else None
    t = torch.randint(V, (VP_N,), generator=g)
    t[2], t[7] = ignore_index, ignore_index
    rw = (torch.rand(VP_N, generator=g, dtype=torch.float64) + 0.5)
    gl = torch.randn(VP_N, generator=g, dtype=torch.float64)  # d loss (none) / d logp
    ge = torch.randn(VP_N, generator=g, dtype=torch.float64)  # d / d entropy
    return h, w, b, t, rw, gl, ge


def _vp_loss(fn_ce, fn_logp, name, kw, h, w, b, t, rw, gl, ge):
    """The case's scalar objective through fn_ce / fn_logp (sharded or not), so that one backward
    gives every gradient."""
    if name.startswith("logp"):
        logp, ent = fn_logp(h, w, b, t, kw)
        return (logp, ent), (logp * gl.to(logp.dtype)).sum() + (ent * ge.to(ent.dtype)).sum()
    weights = rw.to(h.dtype) if ("weights" in name) else None
    loss = fn_ce(h, w, b, t, weights, kw)
    if kw["reduction"] == "none":
        return loss, (loss * gl.to(loss.dtype)).sum()
    return loss, loss


def _vp_run(h, w, b, t, rw, gl, ge, name, kw, fn_ce, fn_logp):
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    b = b.detach().clone().requires_grad_() if b is not None else None
    out, obj = _vp_loss(fn_ce, fn_logp, name, kw, h, w, b, t, rw, gl, ge)
    obj.backward()
    res = {"out": tuple(o.detach() for o in out) if isinstance(out, tuple) else out.detach(), "dh": h.grad,
           "dw": w.grad}
    if b is not None:
        res["db"] = b.grad
    return res


def _vp_worker(rank, world, seed):
    V, bounds = VP_BOUNDS[world]
    lo, hi = bounds[rank], bounds[rank + 1]
    res = {}
    for i, (name, dtype, bias, kw) in enumerate(VP_CONFIGS):
        h, w, b, t, rw, gl, ge = _vp_data(seed + i, world, dtype, bias, kw["ignore_index"])

        def ce(h_, w_, b_, t_, rw_, kw_):
            return fg.vocab_parallel_cross_entropy(h_, w_, b_, t_, lo, V, row_weight=rw_, **kw_)

        def logp(h_, w_, b_, t_, kw_):
            return fg.vocab_parallel_logp(h_, w_, b_, t_, lo, V, return_entropy=True, **kw_)

        res[name] = _vp_run(h, w[lo:hi], b[lo:hi] if b is not None else None, t, rw, gl, ge, name, kw, ce, logp)
    # label smoothing needs Σ_j L_j over the whole vocabulary: refused, naming it
    h, w, b, t, *_ = _vp_data(seed, world, torch.float64, True)
    try:
        fg.vocab_parallel_cross_entropy(h, w[lo:hi], b[lo:hi], t, lo, V, label_smoothing=0.1)
        res["smoothing"] = "accepted"
    except fg.FastgradError as e:
        res["smoothing"] = (e.status, str(e))
    return res


def _vp_fg(h, w, b, t, rw, gl, ge, name, kw):
    """Single process, whole vocabulary: fg.linear_cross_entropy / fg.linear_logp."""
    return _vp_run(h, w, b, t, rw, gl, ge, name, kw,
                   lambda h_, w_, b_, t_, rw_, kw_: fg.linear_cross_entropy(h_, w_, t_, b_, row_weight=rw_, **kw_),
                   lambda h_, w_, b_, t_, kw_: fg.linear_logp(h_, w_, t_, b_, return_entropy=True, **kw_))


def _vp_torch(h, w, b, t, rw, gl, ge, name, kw):
    """torch on f64 copies: F.linear, the cap and temperature, F.cross_entropy / log_softmax."""
    F = torch.nn.functional
    T, cap, ign = kw.get("temperature", 1.0), kw.get("softcap", 0.0), kw.get("ignore_index", None)

    def logits(h_, w_, b_):
        z = F.linear(h_, w_, b_)
        return (cap * torch.tanh(z / cap) if cap else z) / T

    def ce(h_, w_, b_, t_, rw_, kw_):
        L = logits(h_, w_, b_)
        rows = F.cross_entropy(L, t_, reduction="none", ignore_index=ign if ign is not None else -100)
        kept = t_ != ign if ign is not None else torch.ones_like(t_, dtype=torch.bool)
        lse = torch.where(kept, torch.logsumexp(L, dim=-1), torch.zeros((), dtype=L.dtype))
        rows = rows + kw_.get("z_loss", 0.0) * lse * lse
        if rw_ is not None:
            rows = rows * rw_
        if kw_["reduction"] == "none":
            return rows
        return rows.sum() if kw_["reduction"] == "sum" else rows.sum() / kept.sum().clamp(min=1)

    def logp(h_, w_, b_, t_, kw_):
        L = logits(h_, w_, b_)
        lp = torch.log_softmax(L, dim=-1)
        kept = t_ != ign if ign is not None else torch.ones_like(t_, dtype=torch.bool)
        tgt = lp.gather(1, torch.where(kept, t_, 0)[:, None])[:, 0]
        ent = -(lp.exp() * lp).sum(-1)
        zero = torch.zeros((), dtype=L.dtype)
        return torch.where(kept, tgt, zero), torch.where(kept, ent, zero)

    d = lambda x: None if x is None else x.double()  # noqa: E731
    return _vp_run(d(h), d(w), d(b), t, rw, gl, ge, name, kw, ce, logp)


def _vp_compare(got, ref, eps, what):
    for g_, r_ in zip(got, ref) if isinstance(ref, tuple) else ((got, ref),):
        assert err(g_, r_) <= eps, (what, err(g_, r_), eps)


@pytest.mark.parametrize("world", [2, 3])
def test_vocab_parallel_cross_entropy_matches_whole_vocabulary(tmp_path, rng, world):
    """Every rank's loss (mean / sum / none, ignore_index, z-loss, row weights, temperature and
    softcap, with and without a bias) and the log-prob + entropy variant, the gradient of h on
    every rank, and the slices' gradients of w and b concatenated, against one process over the
    whole vocabulary: fg.linear_cross_entropy / fg.linear_logp (the same dtype) and torch on f64
    copies, at the suite's tolerance of the dtype (f64 1e-12, f32 1e-5, bf16 1e-2). Every rank
    returns the same loss bits (the combine runs the same sums in rank order). Label smoothing is
    refused with FG_ERR_UNSUPPORTED naming it."""
    seed = _seed(rng)
    outs = _spawn(_vp_worker, world, tmp_path, seed)
    for i, (name, dtype, bias, kw) in enumerate(VP_CONFIGS):
        data = _vp_data(seed + i, world, dtype, bias, kw["ignore_index"])
        eps = dtype_tol(dtype)
        ranks = [o[name] for o in outs]
        for o in ranks[1:]:
            _vp_compare(o["out"], ranks[0]["out"], 0.0, (name, "the same loss on every rank"))
        for j, ref in enumerate((_vp_fg(*data, name, kw), _vp_torch(*data, name, kw))):
            who = (name, world, ["fastgrad", "torch"][j])
            for r, o in enumerate(ranks):
                _vp_compare(o["out"], ref["out"], eps, who + ("loss", r))
                assert o["dh"].dtype == dtype
                _vp_compare(o["dh"], ref["dh"], eps, who + ("dh", r))
            _vp_compare(torch.cat([o["dw"] for o in ranks]), ref["dw"], eps, who + ("dw",))
            if bias:
                _vp_compare(torch.cat([o["db"] for o in ranks]), ref["db"], eps, who + ("db",))
    for o in outs:
        status, msg = o["smoothing"]
        assert status == fg._lib.ERR_UNSUPPORTED and "label_smoothing" in msg, o["smoothing"]


def test_vocab_parallel_without_group_is_linear_cross_entropy(rng):
    """No process group: vocab_parallel_cross_entropy is fg.linear_cross_entropy over the whole
    vocabulary (label smoothing included), and a real slice is refused."""
    assert not dist.is_initialized()
    h = torch.tensor(rng.normal(size=(7, 5)), requires_grad=True)
    w = torch.tensor(rng.normal(size=(11, 5)), requires_grad=True)
    t = torch.tensor(rng.integers(0, 11, 7))
    a = fg.vocab_parallel_cross_entropy(h, w, None, t, 0, 11, label_smoothing=0.1, z_loss=1e-3)
    b = fg.linear_cross_entropy(h, w, t, label_smoothing=0.1, z_loss=1e-3)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="other ranks"):
        fg.vocab_parallel_cross_entropy(h, w[:6], None, t, 0, 11)


def test_vocab_parallel_split_api_simulated_ranks(rng):
    """One process, three simulated ranks (numpy, f64): the split API's parts combined by hand as the
    collectives would (tlogit summed; lse / entropy gathered) equal fg.linear_logp_forward over the
    whole vocabulary, and Σ_r dh_r and the concatenated dw / db equal its backward."""
    N, D, V = 9, 6, 23
    h = rng.normal(size=(N, D))
    w = rng.normal(size=(V, D))
    b = rng.normal(size=V)
    t = rng.integers(0, V, N).astype(np.int64)
    bounds = [0, 8, 9, 23]
    logp_ref, lse_ref, ent_ref = fg.linear_logp_forward(h, w, t, b, entropy=True)
    parts = []
    for r in range(3):
        lo, hi = bounds[r], bounds[r + 1]
        opt = fg.logp_options(vocab_start=lo, vocab_total=V)
        parts.append(fg.linear_logp_shard_forward(h, w[lo:hi].copy(), t, b[lo:hi].copy(), entropy=True, options=opt))
    lse_p = np.stack([p[0] for p in parts])
    tl = sum(p[1] for p in parts)
    ent_p = np.stack([p[2] for p in parts])
    logp, lse, ent = fg.linear_logp_shard_combine(t, lse_p, tl, ent_p)
    for got, ref in ((logp, logp_ref), (lse, lse_ref), (ent, ent_ref)):
        assert np.abs(got - ref).max() <= 1e-12 * max(1.0, np.abs(ref).max())
    dl = rng.normal(size=N)
    dh_ref, dw_ref, db_ref = fg.linear_logp_backward(h, w, t, lse_ref, b, dlogp=dl)
    dh = np.zeros_like(h)
    dws, dbs = [], []
    for r in range(3):
        lo, hi = bounds[r], bounds[r + 1]
        opt = fg.logp_options(vocab_start=lo, vocab_total=V)
        dh_r, dw_r, db_r = fg.linear_logp_backward(h, w[lo:hi].copy(), t, lse, b[lo:hi].copy(), dlogp=dl, options=opt)
        dh += dh_r
        dws.append(dw_r), dbs.append(db_r)
    assert np.abs(dh - dh_ref).max() <= 1e-12 * np.abs(dh_ref).max()
    assert np.abs(np.concatenate(dws) - dw_ref).max() <= 1e-12 * np.abs(dw_ref).max()
    assert np.abs(np.concatenate(dbs) - db_ref).max() <= 1e-12 * np.abs(db_ref).max()

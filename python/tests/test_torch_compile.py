"""torch.compile and CUDA graphs over fastgrad modules.

- Dynamo traces a model built from fastgrad modules (Linear, LinearAct, Attention with dropout,
  LayerNorm, RMSNorm's fused residual add + dropout, Dropout, BatchNorm1d, linear_cross_entropy)
  and a function over the other ops into one graph, with no graph break, the fastgrad custom ops
  in it.
- torch.compile (aot_eager, and inductor) gives the eager model's loss, every gradient and the
  BatchNorm running statistics, with dropout on (the seeds are drawn from torch's generator in the
  traced code, so the same torch.manual_seed gives the same masks).
- Eager calls routed through the custom ops (torch_ops.use_custom_ops) give the direct path's
  results bit for bit: the custom ops' autograd is the tested autograd.Functions' one.
- torch.library.opcheck on every custom op (schema, fake tensors, autograd registration, AOT
  dispatch with dynamic shapes); a deliberately wrong fake implementation fails it.
- The same for the encoder layers and RevIN: a model of fg.RevIN, fg.TransformerEncoderLayer
  (pre- and post-norm) and fg.PatchTSTEncoder (BatchNorm, residual attention) traces into one
  graph; compiled training steps (dropout on) give the eager loss, gradients and BatchNorm
  running statistics; evaluation, and gradients through an evaluation-mode layer, too.
- On CUDA only: fwd + bwd + fg.AdamW captured with torch.cuda.graph and replayed gives the eager
  steps' losses, gradients and parameters.
"""
import copy

import pytest

torch = pytest.importorskip("torch")

import fastgrad as fg  # noqa: E402
from fastgrad import torch_ops  # noqa: E402
from torch_helpers import DEVICES  # noqa: E402

FG = torch.ops.fastgrad


class Block(torch.nn.Module):
    """A pre-norm transformer block with BatchNorm and a cross-entropy head, all fastgrad."""

    def __init__(self, d=16, heads=2, vocab=11, p=0.1, dtype=torch.float64):
        super().__init__()
        self.h, self.p = heads, p
        self.norm = fg.LayerNorm(d, dtype=dtype)
        self.qkv = fg.Linear(d, 3 * d, dtype=dtype)
        self.attn = fg.Attention(causal=True, dropout=p)
        self.proj = fg.Linear(d, d, bias=False, dtype=dtype)
        self.norm2 = fg.RMSNorm(d, eps=1e-6, dtype=dtype)
        self.ffn = fg.LinearAct(d, 4 * d, act="gelu", dtype=dtype)
        self.drop = fg.Dropout(p)
        self.ffn2 = fg.Linear(4 * d, d, dtype=dtype)
        self.bn = fg.BatchNorm1d(d, dtype=dtype)
        self.head = torch.nn.Parameter(torch.randn(vocab, d, dtype=dtype) * 0.3)

    def forward(self, x, target):
        b, l, d = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, l, 3, self.h, d // self.h)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        o = self.attn(q, k, v).transpose(1, 2).reshape(b, l, d)
        y, s = self.norm2(x, residual=self.proj(o), p=self.p)
        f = self.ffn2(self.drop(self.ffn(y)))
        z = self.bn((s + f).transpose(1, 2)).transpose(1, 2)  # [N, C, L] view of channels-last memory
        return fg.linear_cross_entropy(z, self.head, target, label_smoothing=0.05)


BLOCK_OPS = {"linear", "attention", "norm", "linear_act", "dropout", "batch_norm", "linear_cross_entropy"}


def misc(a, b, w, x, wt, q, k, v, scores, lengths, c, r):
    """Every other routed family, differentiable in all its float inputs."""
    m = fg.matmul(a, b)                                       # [2, 3, 5]
    o = fg.outer(x, m[0, 0])                                  # [4, 5]
    e = fg.axpby(fg.lerp(m, m.flip(-1), wt), fg.lerp(m, m * 2, 0.25), 0.5, -1.5)
    e = fg.softcap(fg.clamp(fg.elu(e), -0.7, 2.0), 3.0)
    h = fg.linear_act(o, w, None, act="silu", save_pre="slope") + fg.linear_act(o, w, None, act="relu")
    logp, ent = fg.linear_logp(h, w.t(), torch.tensor([0, 4, 2, 1], device=h.device), return_entropy=True,
                               softcap=4.0)
    att, sc = fg.attention(q, k, v, scores_in=scores, return_scores=True, lengths=lengths, dropout_p=0.2)
    y, s = fg.batch_norm(c, r=r, training=True, p=0.3)
    z = fg.rms_norm(fg.dropout(c, 0.25), eps=1e-6)
    return (e.sum() + (o * o).sum() + logp.sum() + 0.5 * ent.sum() + (att * att).sum() + torch.where(sc.isfinite(), sc, 0.0).sum()
            + (y * y).sum() + s.sum() + (z * z.flip(0)).sum() + fg.scale(fg.pow(c.abs() + 1, 1.5), 0.3).sum()
            + fg.leaky_relu(c, 0.2).sum())


def dtype_for(device):
    """f64 on the CPU (tight comparisons); f32 on CUDA (its norms have no f64 kernels)."""
    return torch.float64 if device == "cpu" else torch.float32


def misc_inputs(device, dtype=None, seed=0):
    dtype = dtype or dtype_for(device)
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype).to(device).requires_grad_()

    lengths = torch.tensor([5, 3], device=device)
    return (r(2, 3, 4), r(4, 5), r(6, 5), r(4), r(2, 3, 5), r(2, 2, 5, 4), r(2, 2, 5, 4), r(2, 2, 5, 4),
            r(2, 2, 5, 5), lengths, r(6, 3), r(6, 3))


def block_and_inputs(device, seed=0, p=0.1, dtype=None):
    dtype = dtype or dtype_for(device)
    torch.manual_seed(seed)
    model = Block(p=p, dtype=dtype).to(device)
    x = torch.randn(3, 5, 16, dtype=dtype, device=device)
    t = torch.randint(0, 11, (3, 5), device=device)
    return model, x, t


def fastgrad_ops_in(graphs):
    return {str(n.target).split(".")[1] for g in graphs for n in g.graph.nodes if str(n.target).startswith("fastgrad.")}


def test_explain_block_has_no_graph_break():
    model, x, t = block_and_inputs("cpu")
    ex = torch._dynamo.explain(model)(x, t)
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == 1
    assert fastgrad_ops_in(ex.graphs) >= BLOCK_OPS


class Encoders(torch.nn.Module):
    """RevIN → TransformerEncoderLayer (pre-norm) → TransformerEncoderLayer (post-norm) →
    PatchTSTEncoder (2 layers: BatchNorm, residual attention) → RevIN denorm, dropout on."""

    def __init__(self, d=16, heads=2, p=0.1, dtype=torch.float64):
        super().__init__()
        self.revin = fg.RevIN(d).to(dtype)
        self.pre = fg.TransformerEncoderLayer(d, heads, 32, dropout=p, activation="gelu", norm_first=True,
                                              dtype=dtype)
        self.post = fg.TransformerEncoderLayer(d, heads, 24, dropout=p, norm_first=False, dtype=dtype)
        self.tst = fg.PatchTSTEncoder(2, d, heads, 32, dropout=p, attn_dropout=p, res_attention=True,
                                      norm="BatchNorm", dtype=dtype)
        with torch.no_grad():  # norms and RevIN's affine away from 1 / 0
            for n, q in self.named_parameters():
                if "norm" in n or "affine" in n:
                    q.add_(torch.rand_like(q) * 0.4 - 0.2)

    def forward(self, x):
        z = self.tst(self.post(self.pre(self.revin(x, "norm"))))
        return self.revin(z, "denorm")


ENCODER_OPS = {"encoder_layer", "revin", "revin_stats"}


def encoders_and_input(device, seed=0, p=0.1, dtype=None):
    dtype = dtype or dtype_for(device)
    torch.manual_seed(seed)
    model = Encoders(p=p, dtype=dtype).to(device)
    x = (torch.randn(3, 6, 16, dtype=dtype) * 2 + 1).to(device)
    return model, x


def test_explain_encoders_have_no_graph_break():
    model, x = encoders_and_input("cpu")
    ex = torch._dynamo.explain(lambda a: (model(a) ** 2).mean())(x)
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == 1
    ops_in = [str(n.target).split(".")[1] for g in ex.graphs for n in g.graph.nodes
              if str(n.target).startswith("fastgrad.")]
    assert set(ops_in) >= ENCODER_OPS
    assert ops_in.count("encoder_layer") == 4  # pre, post, PatchTST's two layers


def test_explain_misc_has_no_graph_break():
    ex = torch._dynamo.explain(misc)(*misc_inputs("cpu"))
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == 1
    assert fastgrad_ops_in(ex.graphs) >= {"matmul", "outer", "lerp", "axpby", "unary", "linear_act", "linear_logp",
                                          "attention", "batch_norm", "norm", "dropout"}


def close(a, b, name, rtol=None, atol=None):
    """Elementwise: |a − b| ≤ atol + rtol·|b| (defaults from the dtype: 1e-12 in f64, 1e-5 / 1e-6 in f32)."""
    f64 = b.dtype == torch.float64
    rtol = rtol if rtol is not None else (1e-12 if f64 else 1e-5)
    atol = atol if atol is not None else (1e-12 if f64 else 1e-6)
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def run_block(model, x, t, seed):
    torch.manual_seed(seed)
    loss = model(x, t)
    loss.backward()
    grads = {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def compiled(fn, backend):
    torch._dynamo.reset()
    if backend == "inductor":
        import torch._inductor.config as inductor_config
        inductor_config.fallback_random = True  # torch.randint from torch's generator, as in eager
    return torch.compile(fn, backend=backend, fullgraph=True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_block_matches_eager(backend, device):
    model, x, t = block_and_inputs(device)
    twin = copy.deepcopy(model)
    fast = compiled(twin, backend)
    for step in range(2):
        loss, grads = run_block(model, x, t, 100 + step)
        closs, cgrads = run_block(fast, x, t, 100 + step)
        close(closs, loss, f"step {step} loss")
        for n in grads:
            close(cgrads[n], grads[n], f"step {step} grad {n}")
        close(twin.bn.running_mean, model.bn.running_mean, "running_mean")
        close(twin.bn.running_var, model.bn.running_var, "running_var")
    assert int(twin.bn.num_batches_tracked) == int(model.bn.num_batches_tracked) == 2
    assert not torch.equal(model.bn.running_var, torch.ones_like(model.bn.running_var))  # they were updated
    other, _ = run_block(copy.deepcopy(model), x, t, 999)  # dropout is on: another seed, another loss
    assert abs(float(other) - float(loss)) > 1e-6
    model.eval(), twin.eval()
    torch._dynamo.reset()
    with torch.no_grad():
        close(compiled(twin, backend)(x, t), model(x, t), "eval loss")


def run_encoders(model, x, seed):
    torch.manual_seed(seed)
    y = model(x)
    loss = (y * torch.linspace(-1, 1, y.shape[-1], dtype=y.dtype, device=y.device)).square().mean()
    loss.backward()
    grads = {n.removeprefix("_orig_mod."): q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_encoders_match_eager(backend, device):
    model, x = encoders_and_input(device)
    twin = copy.deepcopy(model)
    fast = compiled(twin, backend)
    bns = ("tst.layers.0.norm_attn.1", "tst.layers.0.norm_ffn.1", "tst.layers.1.norm_attn.1", "tst.layers.1.norm_ffn.1")
    for step in range(2):
        loss, grads = run_encoders(model, x, 200 + step)
        closs, cgrads = run_encoders(fast, x, 200 + step)
        close(closs, loss, f"step {step} loss")
        trainable = {n for n, q in model.named_parameters() if q.requires_grad}
        assert set(grads) == set(cgrads) == trainable
        for n in grads:
            close(cgrads[n], grads[n], f"step {step} grad {n}")
        buffers, cbuffers = dict(model.named_buffers()), dict(twin.named_buffers())
        for bn in bns:
            for k in ("running_mean", "running_var", "num_batches_tracked"):
                close(cbuffers[f"{bn}.{k}"], buffers[f"{bn}.{k}"], f"step {step} {bn}.{k}")
    for bn in bns:
        assert int(buffers[f"{bn}.num_batches_tracked"]) == 2
        assert not torch.equal(buffers[f"{bn}.running_var"], torch.ones_like(buffers[f"{bn}.running_var"]))
    other, _ = run_encoders(copy.deepcopy(model), x, 999)  # dropout is on: another seed, another loss
    assert abs(float(other) - float(loss)) > 1e-6
    model.eval(), twin.eval()
    torch._dynamo.reset()
    with torch.no_grad():
        close(compiled(twin, backend)(x), model(x), "eval output")
    # gradients through evaluation-mode layers without BatchNorm (a training forward, rates 0)
    sub, csub = model.pre, compiled(twin.pre, backend)
    xg, cxg = x.clone().requires_grad_(), x.clone().requires_grad_()
    sub(xg).square().sum().backward()
    csub(cxg).square().sum().backward()
    close(cxg.grad, xg.grad, "eval-mode dx")
    close(twin.pre.linear1.weight.grad, model.pre.linear1.weight.grad, "eval-mode dw_1")


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_misc_matches_eager(device):
    inputs = misc_inputs(device)
    twin = [a.detach().clone().requires_grad_(a.requires_grad) for a in inputs]
    torch.manual_seed(5)
    out = misc(*inputs)
    out.backward()
    fast = compiled(misc, "aot_eager")
    torch.manual_seed(5)
    cout = fast(*twin)
    cout.backward()
    close(cout, out, "value")
    for i, (a, b) in enumerate(zip(inputs, twin)):
        if a.requires_grad:
            close(b.grad, a.grad, f"grad of input {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_custom_op_path_equals_direct_path(device):
    """Eager through the custom ops (their registered autograd) equals the direct
    autograd.Functions bit for bit: both models and the misc function."""
    results = []
    for routed in (False, True):
        torch_ops.use_custom_ops(routed)
        try:
            model, x, t = block_and_inputs(device)
            loss, grads = run_block(model, x, t, 7)
            inputs = misc_inputs(device)
            torch.manual_seed(8)
            val = misc(*inputs)
            val.backward()
            results.append((loss, grads, model.bn.running_var.clone(), val.detach(),
                            [a.grad for a in inputs if a.requires_grad]))
        finally:
            torch_ops.use_custom_ops(False)
    (l0, g0, rv0, v0, mg0), (l1, g1, rv1, v1, mg1) = results
    assert torch.equal(l0, l1) and torch.equal(rv0, rv1) and torch.equal(v0, v1)
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    for i, (a, b) in enumerate(zip(mg0, mg1)):
        assert torch.equal(a, b), i


@pytest.mark.parametrize("device", DEVICES)
def test_encoder_custom_op_path_equals_direct_path(device):
    """The encoder layers and RevIN through their custom ops equal EncoderLayerFunction /
    RevINFunction bit for bit: loss, gradients, running statistics."""
    results = []
    for routed in (False, True):
        torch_ops.use_custom_ops(routed)
        try:
            model, x = encoders_and_input(device)
            loss, grads = run_encoders(model, x, 17)
            results.append((loss, grads, {n: b.clone() for n, b in model.named_buffers()}))
        finally:
            torch_ops.use_custom_ops(False)
    (l0, g0, b0), (l1, g1, b1) = results
    assert torch.equal(l0, l1)
    assert set(g0) == set(g1)
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    for n in b0:
        assert torch.equal(b0[n], b1[n]), n


def test_encoder_eval_batchnorm_backward_refused_on_op_path():
    """As the direct path: no backward through an evaluation-mode BatchNorm layer."""
    torch_ops.use_custom_ops(True)
    try:
        enc = fg.PatchTSTEncoder(1, 8, 2, 16, dropout=0.0, dtype=torch.float64).eval()
        x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
        y = enc(x)
        with pytest.raises(RuntimeError, match="evaluation-mode BatchNorm"):
            y.sum().backward()
    finally:
        torch_ops.use_custom_ops(False)


def test_inductor_has_every_op_as_a_fallback():
    """Importing inductor's lowerings registers every fastgrad op as a fallback there, so inductor
    never takes its implicit-fallback path for them (torch 2.11 formats the graph behind the
    arguments there, which did not finish on a 12-layer GPT-2)."""
    lowering = pytest.importorskip("torch._inductor.lowering")
    missing = [op for op in torch_ops.all_ops() if op._opoverload not in lowering.lowerings]
    assert not missing, f"not registered with inductor: {missing}"


def test_when_imported_runs_after_a_later_import(tmp_path, monkeypatch):
    """The post-import hook behind it: fn gets the module once it is imported, not before, once."""
    import importlib
    import sys
    (tmp_path / "fg_hook_probe_mod.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fg_hook_probe_mod", raising=False)
    seen = []
    torch_ops._when_imported("fg_hook_probe_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    importlib.import_module("fg_hook_probe_mod")
    assert seen == [7]
    importlib.reload(sys.modules["fg_hook_probe_mod"])
    assert seen == [7]
    torch_ops._when_imported("fg_hook_probe_mod", lambda m: seen.append(-m.VALUE))  # already imported: now
    assert seen == [7, -7]
    sys.modules.pop("fg_hook_probe_mod", None)


def test_eager_path_is_direct_unless_asked():
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    assert type(fg.linear(x, w).grad_fn).__name__ == "LinearFunctionBackward"
    torch_ops.use_custom_ops(True)
    try:
        assert "fastgrad_linear" in type(fg.linear(x, w).grad_fn).__name__
    finally:
        torch_ops.use_custom_ops(False)


# ------------------------------------------------------------------ opcheck

def _r(*s, grad=True, dtype=torch.float64):
    return torch.randn(*s, dtype=dtype).requires_grad_(grad)


def _c(*s):
    return _r(*s, grad=False)


SEED = torch.tensor([1234567])


def _cases():
    """(op name, args) at small shapes, float64 (the backward ops' inputs from their forwards)."""
    cases = [
        ("linear", (_r(3, 4), _r(5, 4), _r(5))), ("linear", (_r(2, 3, 4), _r(5, 4), None)),
        ("linear_backward", (_c(3, 5), _c(3, 4), _c(5, 4), True, True, True)),
        ("linear_backward", (_c(3, 5), _c(3, 4), _c(5, 4), False, True, False)),
        ("matmul", (_r(3, 4), _r(4, 5))), ("matmul", (_r(2, 3, 4), _r(4, 5))), ("matmul", (_r(3, 4), _r(2, 4, 5))),
        ("matmul_backward", (_c(2, 3, 5), _c(2, 3, 4), _c(4, 5), True, True)),
        ("outer", (_r(3), _r(4))), ("outer_backward", (_c(3, 4), _c(3), _c(4), True, True)),
        ("unary", (_r(3, 4), "softcap", [2.0])), ("unary", (_r(3, 4), "clamp", [-0.5, 0.5])),
        ("unary_backward", (_c(3, 4), _c(3, 4), "elu", [1.0])),
        ("lerp", (_r(3, 4), _r(3, 4), _r(3, 4), 0.0)), ("lerp", (_r(3, 4), _r(3, 4), None, 0.3)),
        ("lerp", (_r(3, 4), _r(4), _r(3, 1), 0.0)),
        ("lerp_backward", (_c(3, 4), _c(3, 4), _c(3, 4), _c(3, 4), 0.0, True, True, True)),
        ("axpby", (_r(3, 4), _r(3, 4), 2.0, -1.0)), ("axpby", (_r(3, 4), _r(4), 0.5, 1.5)),
        ("axpby_backward", (_c(3, 4), [3, 4], [4], 2.0, 3.0, True, True)),
        ("linear_act", (_r(3, 4), _r(5, 4), _r(5), "gelu", True, False)),
        ("linear_act", (_r(3, 4), _r(5, 4), _r(5), "silu", True, True)),
        ("linear_act", (_r(3, 4), _r(5, 4), None, "tanh", False, False)),
        ("linear_act", (_r(3, 4), _r(5, 4), _r(5), "relu", True, False)),
        ("linear_act_backward", (_c(3, 5), _c(3, 4), _c(5, 4), _c(5), None, "gelu", False, True, True, True)),
        ("linear_logp", (_r(6, 4), _r(7, 4), torch.randint(0, 7, (6,)), _r(7), True, 1.0, 0.0, None, 0)),
        ("linear_logp", (_r(6, 4), _r(7, 4), torch.tensor([0, 1, -100, 3, 4, 5]), None, False, 0.7, 5.0, -100, 0)),
        ("linear_cross_entropy", (_r(6, 4), _r(7, 4), torch.randint(0, 7, (6,)), _r(7), None, True, True, True,
                                  "mean", 0.1, 1e-3, -100, 1.0, 0.0, 0)),
        ("linear_cross_entropy", (_r(6, 4), _r(7, 4), torch.randint(0, 7, (6,)), None, _c(6).abs(), True, False,
                                  False, "sum", 0.0, 0.0, None, 1.5, 3.0, 0)),
        ("attention", (_r(2, 2, 5, 4), _r(2, 2, 5, 4), _r(2, 2, 5, 4), _r(2, 2, 5, 5), torch.tensor([5, 3]), SEED, 0,
                       True, None, 0.2, True, "")),
        ("attention", (_r(2, 2, 5, 4), _r(2, 2, 5, 4), _r(2, 2, 5, 4), None, None, None, 0, False, 0.5, 0.0, True,
                       "float64")),
        ("norm", (_r(3, 8), _r(3, 8), _r(8), _r(8), "layer", 1e-5, 0.2, SEED, 0)),
        ("norm", (_r(3, 8), None, _r(8), None, "rms", 1e-6, 0.0, None, 0)),
        ("batch_norm", (_r(6, 4), _r(6, 4), _r(4), _r(4), torch.zeros(4, dtype=torch.float64),
                        torch.ones(4, dtype=torch.float64), True, 0.1, 1e-5, 0.2, SEED)),
        ("batch_norm", (_r(6, 4), None, _r(4), _r(4), torch.zeros(4, dtype=torch.float64),
                        torch.ones(4, dtype=torch.float64) * 2, False, 0.1, 1e-5, 0.0, None)),
        ("dropout", (_r(3, 8), 0.3, SEED, 0)), ("dropout_backward", (_c(3, 8), 0.3, SEED, 0)),
    ]
    # backward ops whose inputs are a forward's saved tensors
    h, w, t = _c(6, 4), _c(7, 4), torch.randint(0, 7, (6,))
    _, lse, ent = FG.linear_logp(h, w, t, None, True, 1.0, 0.0, None, 0)
    cases.append(("linear_logp_backward", (h, w, t, lse, None, _c(6), _c(6), ent, 1.0, 0.0, None, 0, True, True,
                                           False)))
    q, k, v, s_in = _c(2, 2, 5, 4), _c(2, 2, 5, 4), _c(2, 2, 5, 4), _c(2, 2, 5, 5)
    o, lse, _ = FG.attention(q, k, v, s_in, None, SEED, 0, False, None, 0.1, False, "")
    cases.append(("attention_backward", (_c(2, 2, 5, 4), None, q, k, v, o, lse, None, s_in, SEED, 0, False, None, 0.1,
                                         True, True, True, True)))
    x, r, wn = _c(3, 8), _c(3, 8), _c(8)
    _, s, mean, rstd = FG.norm(x, r, wn, None, "layer", 1e-5, 0.2, SEED, 0)
    cases.append(("norm_backward", (_c(3, 8), _c(3, 8), s, wn, mean, rstd, "layer", 1e-5, 0.2, SEED, 0, True, True,
                                    True, False)))
    x, wb = _c(6, 4), _c(4)
    _, s, mean, rstd, _, _ = FG.batch_norm(x, _c(6, 4), wb, None, None, None, True, 0.1, 1e-5, 0.3, SEED)
    cases.append(("batch_norm_backward", (_c(6, 4), _c(6, 4), s, wb, mean, rstd, True, 0.3, SEED, True, True, True,
                                          False)))
    cases += _revin_cases() + _encoder_cases()
    return cases


def _revin_cases():
    x = _c(2, 6, 3)
    mean, stdev = FG.revin_stats(x, 1e-5, False)
    return [("revin_stats", (_c(2, 6, 3), 1e-5, False)), ("revin_stats", (_c(6, 3), 1e-5, True)),
            ("revin", (_r(2, 6, 3), _r(3), _r(3), mean, stdev, False, 1e-5)),
            ("revin", (_r(2, 6, 3), None, None, mean, stdev, True, 1e-5)),
            ("revin_backward", (_c(2, 6, 3), x, mean, stdev, _c(3), _c(3), True, 1e-5, True, True, True)),
            ("revin_backward", (_c(2, 6, 3), x, mean, stdev, None, None, False, 1e-5, True, False, False))]


def _cfg(d, heads, d_ff, norm, p, residual=False, activation="gelu"):
    """encoder_layer's descriptor arguments (torch_ops.ENCODER_CFG's order)."""
    return (d, heads, d_ff, activation, norm, 1e-5, 0.1, None, False, residual, p, p, p, "all", p)


def _encoder_weights(d, d_ff, separate, grad=True):
    mk = _r if grad else _c
    qkv = ({"w_q": mk(d, d), "b_q": mk(d), "w_k": mk(d, d), "b_k": mk(d), "w_v": mk(d, d), "b_v": mk(d)} if separate
           else {"w_qkv": mk(3 * d, d), "b_qkv": mk(3 * d)})
    w = dict(qkv, w_o=mk(d, d), b_o=mk(d), w_1=mk(d_ff, d), b_1=mk(d_ff), w_2=mk(d, d_ff), b_2=mk(d),
             norm1_w=mk(d), norm1_b=mk(d), norm2_w=mk(d), norm2_b=mk(d))
    with torch.no_grad():
        for t in w.values():
            t.mul_(0.3)
    return list(w.values()), ",".join(w)


def _running(d):
    return (torch.zeros(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64),
            torch.zeros(d, dtype=torch.float64) + 0.1, torch.ones(d, dtype=torch.float64) * 2)


ENC_SEED = torch.tensor([1234567, 89])


def _encoder_cases():
    d, h, f = 8, 2, 16
    ws, names = _encoder_weights(d, f, False)
    wp, names_p = _encoder_weights(d, f, True)
    scale = torch.tensor(0.4, dtype=torch.float64)
    no_bn = (None,) * 4
    cases = [
        ("encoder_layer", (_r(2, 5, d), None, None, ws, names, *no_bn, None, ENC_SEED, True, False,
                           *_cfg(d, h, f, "pre_layer", 0.1))),
        ("encoder_layer", (_r(2, 5, d), None, torch.tensor([5, 3]), ws, names, *no_bn, None, None, True, False,
                           *_cfg(d, h, f, "post_layer", 0.0, activation="relu"))),
        ("encoder_layer", (_r(2, 5, d), _r(2, h, 5, 5), None, wp, names_p, *_running(d), scale, ENC_SEED, True,
                           True, *_cfg(d, h, f, "post_batch", 0.2, residual=True))),
        ("encoder_layer", (_c(2, 5, d), _c(2, h, 5, 5), None, [w.detach() for w in wp], names_p, *_running(d),
                           scale, None, False, True, *_cfg(d, h, f, "post_batch", 0.0, residual=True))),
    ]
    # backward cases from their forwards' caches
    ws, _ = _encoder_weights(d, f, False, grad=False)
    x, cfg = _c(2, 5, d), _cfg(d, h, f, "pre_layer", 0.1)
    _, _, cache, *_ = FG.encoder_layer(x, None, None, ws, names, *no_bn, None, ENC_SEED, True, False, *cfg)
    cases.append(("encoder_layer_backward", (_c(2, 5, d), None, x, None, None, ws, names, *no_bn, cache, None,
                                             ENC_SEED, True, False, [True] * len(ws), *cfg)))
    wp, _ = _encoder_weights(d, f, True, grad=False)
    x, s_in, cfg = _c(2, 5, d), _c(2, h, 5, 5), _cfg(d, h, f, "post_batch", 0.2, residual=True)
    _, _, cache, *running = FG.encoder_layer(x, s_in, None, wp, names_p, *_running(d), scale, ENC_SEED, True, True,
                                             *cfg)
    need = [i % 3 != 1 for i in range(len(wp))]
    cases.append(("encoder_layer_backward", (_c(2, 5, d), _c(2, h, 5, 5), x, s_in, None, wp, names_p, *running, cache,
                                             scale, ENC_SEED, False, True, need, *cfg)))
    return cases


CASES = _cases()


def test_every_custom_op_has_an_opcheck_case():
    assert {op._name for op in torch_ops.all_ops()} == {name for name, _ in CASES}


def _clone(a):
    if isinstance(a, list):
        return [_clone(t) for t in a]
    if isinstance(a, torch.Tensor):
        return a.detach().clone().requires_grad_(a.requires_grad)
    return a


def _aot_dynamic_without_cache(args):
    """opcheck's AOT-dispatch check (compiled with dynamic shapes vs eager: outputs and input
    gradients) on every output of a training encoder_layer but the cache."""
    def fn(*a):
        y, scores, _, *running = FG.encoder_layer(*a)
        return y, scores, running

    torch._dynamo.reset()
    outs = []
    for f in (fn, torch.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True)):
        a = _clone(args)
        y, scores, running = f(*a)
        (y.square().sum() + (scores.sin().sum() if scores.numel() else 0)).backward()
        leaves = [t for t in [a[0], a[1]] + a[3] if isinstance(t, torch.Tensor) and t.requires_grad]
        outs.append([y, scores, *running] + [t.grad for t in leaves])
    for i, (c, e) in enumerate(zip(*outs)):
        close(c, e, f"output / gradient {i}")


# opcheck's own AOT-dispatch check compares every byte of every output; a training
# encoder_layer's cache has bytes between its regions that nothing writes (torch.empty)
WITHOUT_AOT = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_opcheck(case):
    name, args = CASES[case]
    if name == "encoder_layer" and args[11]:  # train: a cache
        torch.library.opcheck(getattr(FG, name).default, args, test_utils=WITHOUT_AOT)
        _aot_dynamic_without_cache(args)
    else:
        torch.library.opcheck(getattr(FG, name).default, args)


def test_opcheck_catches_a_wrong_fake():
    """The check above can fail: an op whose fake implementation gets the shape wrong."""
    lib_name = "fastgrad_selftest::bad_linear"
    if not hasattr(torch.ops.fastgrad_selftest, "bad_linear"):
        @torch.library.custom_op(lib_name, mutates_args=())
        def bad(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return fg.linear_forward(x, w)

        @bad.register_fake
        def _(x, w):
            return x.new_empty(x.shape)  # should be [..., w.shape[0]]
    with pytest.raises(Exception):
        torch.library.opcheck(torch.ops.fastgrad_selftest.bad_linear.default, (_c(3, 4), _c(5, 4)))


# ------------------------------------------------------------------ CUDA graphs

@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_training_step():
    """fwd + bwd (+ fg.AdamW) of a fastgrad model captured with torch.cuda.graph: replays on new
    data give the eager steps' losses and gradients; the step with the optimizer gives the eager
    step's parameters and moments. Dropout off: a seed drawn at capture would be replayed."""
    dev = "cuda"
    model, x, t = block_and_inputs(dev, p=0.0, dtype=torch.float32)
    ref = copy.deepcopy(model)
    batches = [(torch.randn_like(x), torch.randint(0, 11, t.shape, device=dev)) for _ in range(8)]
    opt = fg.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    opt_ref = fg.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    static_x, static_t = x.clone(), t.clone()

    def step(m, o, xb, tb):
        loss = m(xb, tb)
        loss.backward()
        o.step()
        o.zero_grad(set_to_none=False)
        return loss

    # Warm-up (plans, the context, the optimizer's state made outside the capture) on the stream
    # the capture then uses: fg_context_set_stream orders a new stream after the old one with an
    # event, which a capture refuses (cudaErrorStreamCaptureIsolation) when the stream changes at
    # the capture's start.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # everything on one stream (see above)
        _cuda_graph_steps(model, ref, opt, opt_ref, batches, static_x, static_t, step, side)


def _cuda_graph_steps(model, ref, opt, opt_ref, batches, static_x, static_t, step, side):
    for xb, tb in batches[:3]:
        step(model, opt, xb, tb)
        step(ref, opt_ref, xb, tb)

    # 1. forward + backward, replayed on new data
    g = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=True)
    bn_state = (model.bn.running_mean.clone(), model.bn.running_var.clone(), model.bn.num_batches_tracked.clone())
    with torch.cuda.graph(g, stream=side):
        static_loss = model(static_x, static_t)
        static_loss.backward()
    for xb, tb in batches[3:6]:
        static_x.copy_(xb), static_t.copy_(tb)
        g.replay()
        loss = ref(xb, tb)
        loss.backward()
        close(static_loss, loss, "replayed loss", 1e-6, 1e-6)
        for (n, p), (_, pr) in zip(model.named_parameters(), ref.named_parameters()):
            close(p.grad, pr.grad, f"replayed grad {n}", 1e-6, 1e-6)
            assert not torch.equal(pr.grad, torch.zeros_like(pr.grad)), n
        ref.zero_grad(set_to_none=True)
    close(model.bn.running_mean, ref.bn.running_mean, "running_mean", 1e-6, 1e-6)
    assert int(model.bn.num_batches_tracked) == int(bn_state[2]) + 3

    # 2. the whole training step: fwd + bwd + fg.AdamW, replayed once (the step number and lr
    # are host values of fg_adamw_step, fixed at capture)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, stream=side):
        static_loss2 = step(model, opt, static_x, static_t)
    xb, tb = batches[6]
    static_x.copy_(xb), static_t.copy_(tb)
    before = [p.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=False)  # the captured backward adds into the gradients' memory
    g2.replay()
    loss = step(ref, opt_ref, xb, tb)
    close(static_loss2, loss, "captured step's loss", 1e-6, 1e-6)
    for (n, p), (_, pr), b in zip(model.named_parameters(), ref.named_parameters(), before):
        assert not torch.equal(p, b), n  # the replay updated it
        close(p, pr, f"parameter {n} after the captured step", 1e-6, 1e-7)
        close(opt.state[p]["exp_avg_sq"], opt_ref.state[pr]["exp_avg_sq"], f"exp_avg_sq {n}", 1e-6, 1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_torch_default_capture_stream():
    """PyTorch's documented pattern: warm up on a side stream, then capture with torch.cuda.graph
    on its own capture stream (no stream= given), which the contexts then move to inside the
    capture: fg_context_set_stream must not order a capturing stream after the old one (the
    capture would refuse the event). Replays give the eager step's loss and gradients."""
    dev = "cuda"
    model, x, t = block_and_inputs(dev, p=0.0, dtype=torch.float32)
    ref = copy.deepcopy(model)
    batches = [(torch.randn_like(x), torch.randint(0, 11, t.shape, device=dev)) for _ in range(5)]
    static_x, static_t = x.clone(), t.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for xb, tb in batches[:2]:
            model(xb, tb).backward()
            ref(xb, tb).backward()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = model(static_x, static_t)
        static_loss.backward()
    for xb, tb in batches[2:]:
        static_x.copy_(xb), static_t.copy_(tb)
        g.replay()
        ref.zero_grad(set_to_none=True)
        loss = ref(xb, tb)
        loss.backward()
        close(static_loss, loss, "replayed loss", 1e-6, 1e-6)
        for (n, p), (_, pr) in zip(model.named_parameters(), ref.named_parameters()):
            close(p.grad, pr.grad, f"replayed grad {n}", 1e-6, 1e-6)

"""fg.TransformerEncoderLayer and fg.PatchTSTEncoder through torch autograd.

References: torch.nn.TransformerEncoderLayer itself (both norm_first settings, relu / gelu, causal
and suffix key-padding masks, train with dropout 0 and eval) and patchtst_ref.TSTEncoder (the
reference PatchTST encoder: BatchNorm post-norm, residual attention through three layers), each in
float64 on copies of the same (rounded) weights and inputs, loaded through load_state_dict. Values,
the input's gradient and every parameter's gradient are compared, in f64 on the CPU (the library's
f64 path) and in f32 / bf16 where the device has them. Dropout: the same torch.manual_seed gives the
same output and gradients; the backward agrees with the forward's masks (central finite differences
in f64 with the seed fixed), and the masks are the header's (site k of (seed, 4·offset + k), the
attention family's Philox mask) by an explicit-mask float64 model of the layer."""
import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fastgrad as fg  # noqa: E402

import patchtst_ref  # noqa: E402
from philox_ref import attn_dropout_uniform, dropout_uniform  # noqa: E402
from torch_helpers import DEVICES, err, tol  # noqa: E402

CASES = [(d, t) for d in DEVICES for t in (torch.float64, torch.float32, torch.bfloat16)
         if not (d == "cuda" and t == torch.float64) and not (d == "cpu" and t == torch.bfloat16)]


def tolerance(dtype):
    """DESIGN.md's per-dtype bound; bf16 doubled: a whole layer stores a dozen bf16 intermediates."""
    return 2 * tol(dtype) if dtype == torch.bfloat16 else tol(dtype)


def check(out, ref, dtype, what, torch_own=None):
    """The relative error in norm within the dtype's tolerance, and every element within 30× that of
    the reference's largest magnitude (one wrong element among 10⁴ fails). torch_own: PyTorch's own
    result in the same low precision; where its error against the f64 reference is larger (a relu
    whose bf16 pre-activation rounds across 0, a gradient summed over every token), fastgrad's may
    be up to three times PyTorch's, no more (a wrong layer is off by O(1))."""
    t = tolerance(dtype)
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    worst = float((o - r).abs().max())
    scale = float(r.abs().max())
    bound_e, bound_w = t, 30 * t * scale
    if torch_own is not None:
        tw = torch_own.detach().double().cpu()
        bound_e = max(bound_e, 3 * err(tw, r))
        bound_w = max(bound_w, 3 * float((tw - r).abs().max()))
    e = err(out, ref)
    assert e <= bound_e, f"{what}: relative error {e:.3g} > {bound_e:.3g}"
    assert worst <= bound_w, f"{what}: max error {worst:.3g} > {bound_w:.3g}"


def seeded(rng):
    torch.manual_seed(int(rng.integers(2**31)))


def torch_layer(d, h, dff, act, norm_first, dropout=0.0, bias=True):
    return torch.nn.TransformerEncoderLayer(d, h, dff, dropout, act, 1e-5, batch_first=True, norm_first=norm_first,
                                            bias=bias)


def pair(rng, d, h, dff, act, norm_first, device, dtype, dropout=0.0, bias=True, save="all"):
    """(fastgrad layer in dtype, torch layer in f64) with the same weights: the torch layer's initial
    weights perturbed (norms and biases away from 1 / 0), rounded to dtype, loaded into both."""
    seeded(rng)
    ref = torch_layer(d, h, dff, act, norm_first, dropout, bias)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.from_numpy(rng.uniform(-0.2, 0.2, size=tuple(p.shape))).float())
    ours = fg.TransformerEncoderLayer(d, h, dff, dropout, act, 1e-5, True, norm_first, bias, save=save)
    ours.load_state_dict(ref.state_dict())
    ours.to(device=device, dtype=dtype)
    ref.load_state_dict({k: v.to(dtype).double() for k, v in ours.state_dict().items()})
    return ours, ref.double().to(device)


def grads_of(module, x, dy, **kw):
    y = module(x, **kw)
    params = [p for p in module.parameters() if p.requires_grad]
    g = torch.autograd.grad(y, [x] + params, dy)
    names = ["x"] + [n for n, p in module.named_parameters() if p.requires_grad]
    return y, dict(zip(names, g))


def inputs(rng, b, l, d, device, dtype):
    x = torch.from_numpy(rng.uniform(-1, 1, size=(b, l, d))).to(device=device, dtype=dtype).requires_grad_(True)
    dy = torch.from_numpy(rng.uniform(-1, 1, size=(b, l, d))).to(device=device, dtype=dtype)
    return x, dy


def compare(ours, ref, x, dy, dtype, **kw):
    own_y, own_g = None, {}
    if dtype in (torch.float16, torch.bfloat16):  # PyTorch's own error in this dtype, for check()
        low = copy.deepcopy(ref).to(dtype)
        xl = x.detach().clone().requires_grad_(True)
        own_y, own_g = grads_of(low, xl, dy, **{k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point()
                                                    else v) for k, v in kw.items()})
    y, g = grads_of(ours, x, dy, **kw)
    x64 = x.detach().double().requires_grad_(True)
    y64, g64 = grads_of(ref, x64, dy.double(), **kw)
    check(y, y64, dtype, "y", own_y)
    assert set(g) == set(g64)
    top = max(float(v.abs().max()) for v in g64.values())
    for k in g:
        if float(g64[k].abs().max()) <= 1e-9 * top:
            # a gradient that is zero in exact arithmetic (W_K's bias: softmax ignores a per-row
            # constant): rounding noise only, far below the other gradients
            worst = float(g[k].detach().double().abs().max())
            assert worst <= 30 * tolerance(dtype) * top, f"d{k}: {worst:.3g} where 0 is exact"
        else:
            check(g[k], g64[k], dtype, f"d{k}", own_g.get(k))


# ------------------------------------------------------------------ TransformerEncoderLayer

@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("act", ["relu", "gelu", F.gelu])
def test_layer_against_torch(rng, device, dtype, norm_first, act):
    ours, ref = pair(rng, 48, 4, 80, act, norm_first, device, dtype)
    x, dy = inputs(rng, 3, 17, 48, device, dtype)
    if act == "relu":
        away_from_kink(ours, ref, x, dtype)
    compare(ours, ref, x, dy, dtype)


def away_from_kink(ours, ref, x, dtype):
    """Moves each FFN unit's bias so that relu's kink falls in the widest gap between the unit's
    pre-activations (f64, over every token; a quarter of the tokens or more on each side). A
    pre-activation within the layer's rounding of 0 (in bf16 about 2^-8 of its inputs' scale) is
    on one side in one implementation and on the other in another, and each such token moves the
    unit's gradients by its whole share: PyTorch's own bf16 layer and fastgrad's then differ from
    the f64 reference by 2-8 % in dlinear1.bias, by which tokens happen to cross. The new biases
    are rounded to dtype and loaded into both layers."""
    got = {}
    hook = ref.linear1.register_forward_hook(lambda m, i, o: got.__setitem__("pre", o.detach()))
    with torch.no_grad():
        ref(x.detach().double())
    hook.remove()
    pre = got["pre"].reshape(-1, got["pre"].shape[-1]).cpu()
    bias = ref.linear1.bias.detach().cpu().clone()
    n = pre.shape[0]
    lo, hi = n // 4, n - n // 4
    for j in range(pre.shape[1]):
        v = torch.sort(pre[:, j]).values
        k = lo + int(torch.argmax(v[lo + 1:hi + 1] - v[lo:hi]))
        bias[j] -= 0.5 * (v[k] + v[k + 1])
    state = ours.state_dict()
    state["linear1.bias"] = bias.to(dtype)
    ours.load_state_dict(state)
    with torch.no_grad():
        ref.linear1.bias.copy_(bias.to(dtype).double())


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("save", ["less", "min"])
def test_layer_saving_less(rng, device, dtype, norm_first, save):
    """save 'less' / 'min' (the forward's temporaries in a workspace, the backward recomputing them):
    the same values and gradients as PyTorch's layer."""
    ours, ref = pair(rng, 48, 4, 80, "gelu", norm_first, device, dtype, save=save)
    x, dy = inputs(rng, 3, 17, 48, device, dtype)
    compare(ours, ref, x, dy, dtype)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_causal_and_padding(rng, device, dtype, norm_first):
    b, l, d = 4, 23, 32
    ours, ref = pair(rng, d, 2, 64, "gelu", norm_first, device, dtype)
    x, dy = inputs(rng, b, l, d, device, dtype)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(l, device=device, dtype=torch.float64)
    compare(ours, ref, x, dy, dtype, src_mask=causal, is_causal=True)
    bool_causal = torch.ones(l, l, dtype=torch.bool, device=device).triu(1)
    compare(ours, ref, x, dy, dtype, src_mask=bool_causal)
    lengths = torch.tensor([l, 1, 9, l - 1], device=device)
    pad = torch.arange(l, device=device)[None, :] >= lengths[:, None]
    compare(ours, ref, x, dy, dtype, src_key_padding_mask=pad)
    compare(ours, ref, x, dy, dtype, src_key_padding_mask=pad, src_mask=bool_causal)
    # the mask must matter: without it the output differs
    assert err(ours(x, src_key_padding_mask=pad), ours(x)) > 0.05


def test_layer_no_bias_batch_second_unbatched(rng):
    ours, ref = pair(rng, 32, 4, 48, "relu", True, "cpu", torch.float64, bias=False)
    assert "self_attn.in_proj_bias" not in ours.state_dict() and "linear1.bias" not in ours.state_dict()
    x, dy = inputs(rng, 2, 9, 32, "cpu", torch.float64)
    compare(ours, ref, x, dy, torch.float64)
    ours.batch_first = False
    y = ours(x.transpose(0, 1))
    check(y.transpose(0, 1), ref(x), torch.float64, "[L, B, d]")
    check(ours(x[1]), ref(x[1:2])[0], torch.float64, "unbatched")


@pytest.mark.parametrize("device,dtype", CASES)
def test_layer_eval(rng, device, dtype):
    ours, ref = pair(rng, 32, 4, 64, "gelu", False, device, dtype, dropout=0.4)
    ours.eval(), ref.eval()
    x, dy = inputs(rng, 2, 13, 32, device, dtype)
    compare(ours, ref, x, dy, dtype)  # eval gradients: dropout off
    with torch.no_grad():  # the library's evaluation forward (no cache)
        y = ours(x)
    check(y, ref(x.detach().double().requires_grad_(True)), dtype, "eval, no_grad")


def test_layer_state_dict_round_trip(rng):
    seeded(rng)
    t = torch_layer(40, 5, 72, "gelu", True)
    ours = fg.TransformerEncoderLayer(40, 5, 72, activation="gelu", norm_first=True)
    ours.load_state_dict(t.state_dict())
    back = torch_layer(40, 5, 72, "gelu", True)
    back.load_state_dict(ours.state_dict())
    for k, v in t.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in t.state_dict().items()}
    # the same initialization, drawn in the same order
    torch.manual_seed(7)
    a = fg.TransformerEncoderLayer(40, 5, 72)
    torch.manual_seed(7)
    b = torch.nn.TransformerEncoderLayer(40, 5, 72, batch_first=True)
    for k, v in b.state_dict().items():
        assert torch.equal(a.state_dict()[k], v), k


def test_layer_refuses_masks_it_cannot_run(rng):
    ours = fg.TransformerEncoderLayer(16, 2, 32)
    x = torch.randn(2, 6, 16)
    holes = torch.zeros(2, 6, dtype=torch.bool)
    holes[0, 2] = True  # a hole, not a suffix
    with pytest.raises(ValueError, match="pad the end"):
        ours(x, src_key_padding_mask=holes)
    band = torch.ones(6, 6, dtype=torch.bool).triu(2)  # not the causal mask
    with pytest.raises(ValueError, match="causal"):
        ours(x, src_mask=band)
    with pytest.raises(ValueError, match="activation"):
        fg.TransformerEncoderLayer(16, 2, 32, activation=torch.tanh)


# ------------------------------------------------------------------ dropout

def run_seeded(module, x, dy, seed, **kw):
    torch.manual_seed(seed)
    return grads_of(module, x, dy, **kw)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_determinism(rng, device):
    dtype = torch.float64 if device == "cpu" else torch.float32
    ours, _ = pair(rng, 32, 4, 64, "gelu", True, device, dtype, dropout=0.3)
    x, dy = inputs(rng, 3, 11, 32, device, dtype)
    y1, g1 = run_seeded(ours, x, dy, 123)
    y2, g2 = run_seeded(ours, x, dy, 123)
    assert torch.equal(y1, y2)
    for k in g1:
        assert torch.equal(g1[k], g2[k]), k
    y3, _ = run_seeded(ours, x, dy, 124)
    assert err(y3, y1) > 1e-2, "another seed, other masks"
    ours.eval()
    assert torch.equal(ours(x), ours(x)), "evaluation drops nothing"
    ours.train()
    ours.dropout.p = ours.dropout1.p = ours.dropout2.p = ours.self_attn.dropout = 0.0
    ref = ours(x)
    ours.dropout1.p = ours.dropout2.p = 0.3
    assert err(ours(x), ref) > 1e-2, "dropout changes the output in training"


def fd_check(module, x, seed, params=(), eps=1e-6, **kw):
    """The gradient of Σ y·w with the seed fixed against central differences along random directions
    of x and of each named parameter: the backward's masks are the forward's."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(x.shape, generator=g, dtype=torch.float64) - 0.5
    named = dict(module.named_parameters())

    def loss():
        torch.manual_seed(seed)
        return float((module(x, **kw) * w).sum())

    torch.manual_seed(seed)
    y = module(x, **kw)
    targets = [x] + [named[p] for p in params]
    grads = torch.autograd.grad((y * w).sum(), targets)
    for t, gr in zip(targets, grads):
        v = torch.rand(t.shape, generator=g, dtype=torch.float64) - 0.5
        with torch.no_grad():
            t.add_(eps * v)
            up = loss()
            t.sub_(2 * eps * v)
            down = loss()
            t.add_(eps * v)
        fd = (up - down) / (2 * eps)
        an = float((gr * v).sum())
        assert abs(fd - an) <= 1e-7 * max(1.0, abs(an)), f"directional derivative {an} vs finite difference {fd}"


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_backward_finite_differences(rng, norm_first):
    ours, _ = pair(rng, 24, 3, 40, "gelu", norm_first, "cpu", torch.float64, dropout=0.25)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(2, 9, 24))).requires_grad_(True)
    fd_check(ours, x, int(rng.integers(2**31)), ("self_attn.in_proj_weight", "linear1.weight", "norm2.weight"))
    # and a mask: keys past each length do not count
    pad = torch.arange(9)[None, :] >= torch.tensor([9, 4])[:, None]
    fd_check(ours, x, int(rng.integers(2**31)), ("linear2.weight",), src_key_padding_mask=pad)


def keep(shape, p, seed, stream, attention=False):
    """The multiplier of the counter-based mask of (seed, stream) over a tensor of shape (flat index);
    attention: the attention probabilities' 16-bit form."""
    n = int(np.prod(shape))
    u = (attn_dropout_uniform if attention else dropout_uniform)(seed, stream, np.arange(n, dtype=np.uint64))
    u = u.reshape(shape)
    return torch.from_numpy(np.where(u >= p, 1.0 / (1.0 - p), 0.0))


def explicit_layer(sd, x, heads, norm_first, p, seed, offset, eps=1e-5):
    """torch.nn.TransformerEncoderLayer's forward in float64 with the header's masks: site k of
    (seed, 4·offset + k): 0 the attention probabilities [B, H, L, L], 1 the attention branch
    [B, L, d], 2 the FFN hidden [B, L, d_ff], 3 the FFN branch [B, L, d]."""
    b, l, d = x.shape
    hd = d // heads
    ks = [4 * offset + k for k in range(4)]

    def attn(u):
        qkv = F.linear(u, sd["self_attn.in_proj_weight"], sd["self_attn.in_proj_bias"])
        q, k, v = (t.view(b, l, heads, hd).transpose(1, 2) for t in qkv.split(d, -1))
        pr = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1)
        pr = pr * keep((b, heads, l, l), p, seed, ks[0], attention=True)
        o = (pr @ v).transpose(1, 2).reshape(b, l, d)
        return F.linear(o, sd["self_attn.out_proj.weight"], sd["self_attn.out_proj.bias"]) * keep(x.shape, p, seed,
                                                                                                  ks[1])

    def ffn(u):
        hdn = F.gelu(F.linear(u, sd["linear1.weight"], sd["linear1.bias"]))
        hdn = hdn * keep(tuple(hdn.shape), p, seed, ks[2])
        return F.linear(hdn, sd["linear2.weight"], sd["linear2.bias"]) * keep(x.shape, p, seed, ks[3])

    def n(u, i):
        return F.layer_norm(u, (d,), sd[f"norm{i}.weight"], sd[f"norm{i}.bias"], eps)

    if norm_first:
        h = x + attn(n(x, 1))
        return h + ffn(n(h, 2))
    h = n(x + attn(x), 1)
    return n(h + ffn(h), 2)


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_masks_are_the_headers(rng, norm_first):
    p = 0.3
    ours, _ = pair(rng, 24, 3, 40, "gelu", norm_first, "cpu", torch.float64, dropout=p)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(2, 7, 24)))
    s = int(rng.integers(2**31))
    torch.manual_seed(s)
    seed, offset = (int(v) for v in torch.randint(0, 2**62, (2,)))  # what the module draws
    torch.manual_seed(s)
    y = ours(x)
    ref = explicit_layer({k: v.double() for k, v in ours.state_dict().items()}, x, 3, norm_first, p, seed, offset)
    check(y, ref, torch.float64, "y with the header's masks")


# ------------------------------------------------------------------ PatchTSTEncoder

def patchtst_pair(rng, device, dtype, n_layers=3, d=32, h=4, dff=48, dropout=0.0, norm="BatchNorm",
                  res_attention=True):
    seeded(rng)
    ref = patchtst_ref.TSTEncoder(n_layers, d, h, dff, dropout, 0.0, "gelu", res_attention, norm)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.requires_grad:
                p.add_(torch.from_numpy(rng.uniform(-0.2, 0.2, size=tuple(p.shape))).float())
        for name, buf in ref.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, size=tuple(buf.shape))))
            elif name.endswith("running_var"):
                buf.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, size=tuple(buf.shape))))
    ours = fg.PatchTSTEncoder(n_layers, d, h, dff, dropout, 0.0, "gelu", res_attention, norm)
    ours.load_state_dict(ref.state_dict())
    ours.to(device=device, dtype=dtype)
    ref.load_state_dict({k: (v.to(dtype).double() if v.is_floating_point() else v)
                         for k, v in ours.state_dict().items()})
    return ours, ref.double().to(device)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("norm,res_attention", [("BatchNorm", True), ("BatchNorm", False), ("LayerNorm", True)])
def test_patchtst_train(rng, device, dtype, norm, res_attention):
    ours, ref = patchtst_pair(rng, device, dtype, norm=norm, res_attention=res_attention)
    x, dy = inputs(rng, 6, 42, 32, device, dtype)
    compare(ours, ref, x, dy, dtype)
    # the running statistics were updated alike (both layers ran one training forward each)
    sd, sd_ref = ours.state_dict(), ref.state_dict()
    for k in sd_ref:
        if "running" in k:
            check(sd[k], sd_ref[k], dtype, k)
        elif k.endswith("num_batches_tracked"):
            assert int(sd[k]) == int(sd_ref[k]) == 1, k


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("norm,dropout", [("BatchNorm", 0.0), ("LayerNorm", 0.0), ("BatchNorm", 0.2)])
def test_patchtst_stack(rng, device, dtype, norm, dropout):
    """fg.encoder.use_stack(True): the layers as one library call each way, the residual scores
    carried as the layers' q and k: the reference's values (f64) and running statistics without
    dropout; with it, the layer-by-layer path's values under the same seed (the same masks)."""
    import fastgrad.encoder as fgenc
    if dropout and dtype == torch.bfloat16:
        pytest.skip("bf16: the layer-by-layer path rounds its carried scores to bf16, the stack does not; "
                    "both are bounded against the f64 reference in the cases without dropout")
    ours, ref = patchtst_pair(rng, device, dtype, norm=norm, dropout=dropout)
    x, dy = inputs(rng, 6, 42, 32, device, dtype)
    fgenc.use_stack(True)
    try:
        y = ours(x.detach().requires_grad_(True))
        assert type(y.grad_fn).__name__ == "EncoderStackFunctionBackward"
        if dropout == 0.0:
            ours, ref = patchtst_pair(rng, device, dtype, norm=norm)
            compare(ours, ref, x, dy, dtype)
            sd, sd_ref = ours.state_dict(), ref.state_dict()
            for k in sd_ref:
                if "running" in k:
                    check(sd[k], sd_ref[k], dtype, k)
            return
        runs = []
        for on in (True, False):
            fgenc.use_stack(on)
            m = copy.deepcopy(ours)
            xx = x.detach().clone().requires_grad_(True)
            torch.manual_seed(21)
            out = m(xx)
            out.backward(dy)
            runs.append((out.detach(), xx.grad, {k: p.grad for k, p in m.named_parameters() if p.requires_grad}))
        (ys, dxs, gs), (yl, dxl, gl) = runs
        check(ys, yl.double(), dtype, "y (stack vs layers)")
        check(dxs, dxl.double(), dtype, "dx (stack vs layers)")
        top = max(float(v.abs().max()) for v in gl.values())
        for k in gl:
            if "W_K.bias" in k:  # zero in exact arithmetic (softmax ignores a row's constant): noise on both paths
                assert float((gs[k] - gl[k]).abs().max()) <= 30 * tolerance(dtype) * top, k
            else:
                check(gs[k], gl[k].double(), dtype, f"d{k} (stack vs layers)")
    finally:
        fgenc.use_stack(False)


@pytest.mark.parametrize("device,dtype", CASES)
def test_patchtst_eval(rng, device, dtype):
    ours, ref = patchtst_pair(rng, device, dtype, dropout=0.3)
    ours.eval(), ref.eval()
    x, _ = inputs(rng, 5, 42, 32, device, dtype)
    with torch.no_grad():
        y, y_ref = ours(x), ref(x.double())
    check(y, y_ref, dtype, "eval")
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with torch.no_grad():
        ours(x)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed in evaluation"
    # with gradients wanted: the backward refuses clearly rather than returning wrong values
    y = ours(x.detach().requires_grad_(True))
    with pytest.raises(RuntimeError, match="evaluation-mode BatchNorm"):
        y.sum().backward()


@pytest.mark.parametrize("device,dtype", CASES)
def test_patchtst_padding_and_causal(rng, device, dtype):
    ours, ref = patchtst_pair(rng, device, dtype, n_layers=2)
    x, dy = inputs(rng, 4, 20, 32, device, dtype)
    pad = torch.arange(20, device=device)[None, :] >= torch.tensor([20, 3, 11, 19], device=device)[:, None]
    compare(ours, ref, x, dy, dtype, key_padding_mask=pad)
    causal = torch.ones(20, 20, dtype=torch.bool, device=device).triu(1)
    compare(ours, ref, x, dy, dtype, attn_mask=causal)


def test_patchtst_state_dict_round_trip(rng):
    seeded(rng)
    ref = patchtst_ref.TSTEncoder()
    ours = fg.PatchTSTEncoder()
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    back = patchtst_ref.TSTEncoder()
    back.load_state_dict(ours.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    torch.manual_seed(3)
    a = fg.PatchTSTEncoder(2, 64, 8, 96)
    torch.manual_seed(3)
    b = patchtst_ref.TSTEncoder(2, 64, 8, 96)
    for k, v in b.state_dict().items():
        assert torch.equal(a.state_dict()[k], v), k
    # the scale is read from the state_dict (a changed value changes the result)
    x = torch.randn(3, 10, 128)
    ours.eval()
    with torch.no_grad():
        y1 = ours(x)
        ours.layers[0].self_attn.sdp_attn.scale.fill_(0.5)
        y2 = ours(x)
        ref.layers[0].self_attn.sdp_attn.scale.fill_(0.5)
        ref.eval()
        check(y2, ref(x), torch.float32, "changed scale")
    assert err(y1, y2) > 1e-3


def test_patchtst_dropout_backward_finite_differences(rng):
    ours, _ = patchtst_pair(rng, "cpu", torch.float64, n_layers=2, dropout=0.2)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(3, 10, 32))).requires_grad_(True)
    fd_check(ours, x, int(rng.integers(2**31)), ("layers.0.self_attn.W_Q.weight", "layers.1.ff.0.weight",
                                                 "layers.0.norm_attn.1.weight"))


def test_patchtst_attention_branch_dropouts():
    """The reference's attention branch drops twice (to_out's dropout, then dropout_attn): the
    descriptor carries both, and the library composes them into one mask of rate 1 − (1 − p)²."""
    enc = fg.PatchTSTEncoder(1, 16, 4, 32, dropout=0.2, attn_dropout=0.05)
    desc = enc.layers[0]._desc(False)
    assert desc.dropout == pytest.approx(0.2) and desc.dropout_proj == pytest.approx(0.2)
    assert desc.dropout_ffn == pytest.approx(0.2) and desc.dropout_attn == pytest.approx(0.05)


def test_patchtst_eval_with_gradients_drops_nothing():
    """An evaluation-mode LayerNorm PatchTST layer run for gradients (a training forward with
    every rate 0) gives the evaluation forward's output: the projection's dropout is off too."""
    torch.manual_seed(0)
    enc = fg.PatchTSTEncoder(1, 8, 2, 16, dropout=0.3, norm="LayerNorm", dtype=torch.float64).eval()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        y = enc(x)
    torch.testing.assert_close(enc(x.clone().requires_grad_()).detach(), y, rtol=1e-12, atol=1e-12)

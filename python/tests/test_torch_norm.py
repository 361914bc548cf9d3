"""The normalization family's torch modules against PyTorch's own (run on float64 copies as the
reference): fg.LayerNorm / fg.RMSNorm / fg.BatchNorm1d / fg.Dropout / fg.RevIN and the fused
add_norm / batch_norm with a residual — values, every gradient, running statistics, evaluation
mode, state_dict compatibility, dropout determinism; on every device present."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch_helpers import DEVICES, err, tol  # noqa: E402

import fastgrad as fg  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def params(module):
    return {n: p for n, p in module.named_parameters()}


def check_grads(ours, ref, dtype, names):
    for n in names:
        a, b = params(ours)[n].grad, params(ref)[n].grad
        assert a is not None and b is not None, n
        assert err(a, b) <= tol(dtype), (n, err(a, b))


def run_pair(ours, ref, x, dtype):
    """Forward and backward of ours (dtype) and ref (f64 copy of the same weights) on x."""
    x1 = x.detach().to(dtype).clone().requires_grad_()
    x2 = x.detach().to(dtype).double().requires_grad_()
    y1, y2 = ours(x1), ref(x2)
    dy = torch.randn_like(y2)
    y1.backward(dy.to(dtype))
    y2.backward(dy)
    return x1, x2, y1, y2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (3, 17), (2, 5, 768), (7, 1000), (4, 4096)])
def test_layer_norm_module(device, dtype, shape):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("f64 runs on the CPU backend")
    d = shape[-1]
    ours = fg.LayerNorm(d).to(device).to(dtype)
    ref = torch.nn.LayerNorm(d).to(device).double()
    with torch.no_grad():
        ours.weight.copy_(torch.rand(d) + 0.5), ours.bias.copy_(torch.randn(d))
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(shape, device=device)
    x1, x2, y1, y2 = run_pair(ours, ref, x, dtype)
    assert y1.dtype == dtype and err(y1, y2) <= tol(dtype)
    assert err(x1.grad, x2.grad) <= tol(dtype)
    check_grads(ours, ref, dtype, ["weight", "bias"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_module(device, dtype):
    if not hasattr(torch.nn, "RMSNorm"):
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    d = 768
    ours = fg.RMSNorm(d, eps=1e-6).to(device).to(dtype)
    ref = torch.nn.RMSNorm(d, eps=1e-6).to(device).double()
    with torch.no_grad():
        ours.weight.copy_(torch.rand(d) + 0.5)
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x1, x2, y1, y2 = run_pair(ours, ref, torch.randn(6, 9, d, device=device), dtype)
    assert err(y1, y2) <= tol(dtype) and err(x1.grad, x2.grad) <= tol(dtype)
    check_grads(ours, ref, dtype, ["weight"])


def _mask_of(seed, shape, p, device, dtype):
    """The mask (keep·1/(1 − p)) the library uses for (seed, offset 0) over `shape`."""
    ones = torch.ones(shape, device=device, dtype=dtype)
    return fg.dropout_forward(ones, p, seed, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_norm_pre_norm_residual(device, dtype):
    """y, s = add_norm(x, r): s = x + dropout(r) (the next residual), y = LayerNorm(s); the gradients
    of both outputs reach x, r, w, b."""
    d, p = 1024, 0.1
    x = torch.randn(8, 33, d, device=device, dtype=dtype, requires_grad=True)
    r = torch.randn(8, 33, d, device=device, dtype=dtype, requires_grad=True)
    w = (torch.rand(d, device=device) + 0.5).to(dtype).requires_grad_()
    b = torch.randn(d, device=device, dtype=dtype, requires_grad=True)
    torch.manual_seed(1234)
    y, s = fg.add_norm(x, r, w, b, p=p)
    torch.manual_seed(1234)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    m = _mask_of(seed, x.shape, p, device, torch.float32).double()
    x2, r2, w2, b2 = (t.detach().double().requires_grad_() for t in (x, r, w, b))
    s2 = x2 + r2 * m
    y2 = F.layer_norm(s2, (d,), w2, b2, 1e-5)
    assert err(s, s2) <= tol(dtype) and err(y, y2) <= tol(dtype)
    dy, ds = torch.randn_like(y2), torch.randn_like(s2)
    torch.autograd.backward([y, s], [dy.to(dtype), ds.to(dtype)])
    torch.autograd.backward([y2, s2], [dy, ds])
    for a, c in ((x, x2), (r, r2), (w, w2), (b, b2)):
        assert err(a.grad, c.grad) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["2d", "ncl", "patchtst"])
def test_batch_norm1d_module(device, dtype, layout):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("f64 runs on the CPU backend")
    c = 128
    ours = fg.BatchNorm1d(c, momentum=0.2).to(device).to(dtype)
    ref = torch.nn.BatchNorm1d(c, momentum=0.2).to(device).double()
    with torch.no_grad():
        ours.weight.copy_(torch.rand(c) + 0.5), ours.bias.copy_(torch.randn(c))
        ours.running_mean.copy_(torch.randn(c)), ours.running_var.copy_(torch.rand(c) + 0.5)
    ref.load_state_dict({k: (v.double() if v.is_floating_point() else v) for k, v in ours.state_dict().items()})
    if layout == "2d":
        x = torch.randn(300, c, device=device)
    elif layout == "ncl":
        x = torch.randn(16, c, 42, device=device)
    else:  # PatchTST: [B·vars, L, d] transposed to [B·vars, d, L] for BatchNorm1d
        x = torch.randn(16, 42, c, device=device).transpose(1, 2)
    x1, x2, y1, y2 = run_pair(ours, ref, x, dtype)
    assert y1.shape == y2.shape and err(y1, y2) <= tol(dtype)
    assert err(x1.grad, x2.grad) <= tol(dtype)
    check_grads(ours, ref, dtype, ["weight", "bias"])
    # running statistics (unbiased variance, momentum) and the step count
    assert err(ours.running_mean, ref.running_mean) <= max(tol(dtype), 1e-5)
    assert err(ours.running_var, ref.running_var) <= max(tol(dtype), 1e-5)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 1
    # evaluation: the running statistics normalize
    ours.eval(), ref.eval()
    x1, x2, y1, y2 = run_pair(ours, ref, x, dtype)
    assert err(y1, y2) <= tol(dtype) and err(x1.grad, x2.grad) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_norm_post_norm_residual(device):
    """PatchTST's post-norm: BatchNorm of x + dropout(r), channels last."""
    c, p = 128, 0.3
    x = torch.randn(64, 42, c, device=device, requires_grad=True)
    r = torch.randn(64, 42, c, device=device, requires_grad=True)
    w = (torch.rand(c, device=device) + 0.5).requires_grad_()
    b = torch.randn(c, device=device, requires_grad=True)
    rm, rv = torch.zeros(c, device=device), torch.ones(c, device=device)
    torch.manual_seed(7)
    y, s = fg.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5, r=r, p=p)
    torch.manual_seed(7)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    m = _mask_of(seed, x.shape, p, device, torch.float32).double()
    x2, r2, w2, b2 = (t.detach().double().requires_grad_() for t in (x, r, w, b))
    s2 = x2 + r2 * m
    rm2, rv2 = torch.zeros(c, device=device, dtype=torch.float64), torch.ones(c, device=device, dtype=torch.float64)
    y2 = F.batch_norm(s2.reshape(-1, c), rm2, rv2, w2, b2, True, 0.1, 1e-5).reshape(s2.shape)
    assert err(y, y2) <= 1e-5 and err(rm, rm2) <= 1e-5 and err(rv, rv2) <= 1e-5
    dy = torch.randn_like(y2)
    y.backward(dy.float())
    y2.backward(dy)
    for a, c2 in ((x, x2), (r, r2), (w, w2), (b, b2)):
        assert err(a.grad, c2.grad) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_module(device):
    x = torch.randn(64, 1000, device=device, requires_grad=True)
    drop = fg.Dropout(0.3)
    torch.manual_seed(3)
    y = drop(x)
    torch.manual_seed(3)
    y_again = drop(x)
    assert torch.equal(y, y_again)  # torch.manual_seed replays the seed
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    assert torch.allclose(y[kept], x[kept] / 0.7, rtol=1e-6)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad != 0, kept)  # the backward regenerated the same mask
    drop.eval()
    assert drop(x) is x


class PatchTSTRevIN(torch.nn.Module):
    """PatchTST's RevIN (layers/RevIN.py of its reference implementation), written out."""

    def __init__(self, num_features, eps=1e-5, affine=True):
        super().__init__()
        self.eps = eps
        self.affine_weight = torch.nn.Parameter(torch.ones(num_features))
        self.affine_bias = torch.nn.Parameter(torch.zeros(num_features))

    def forward(self, x, mode):
        if mode == "norm":
            self.mean = torch.mean(x, dim=1, keepdim=True).detach()
            self.stdev = torch.sqrt(torch.var(x, dim=1, keepdim=True, unbiased=False) + self.eps).detach()
            x = (x - self.mean) / self.stdev
            return x * self.affine_weight + self.affine_bias
        x = (x - self.affine_bias) / (self.affine_weight + self.eps * self.eps)
        return x * self.stdev + self.mean


@pytest.mark.parametrize("device", DEVICES)
def test_revin_module(device):
    B, L, T, C = 32, 336, 96, 7
    ours, ref = fg.RevIN(C).to(device), PatchTSTRevIN(C).to(device).double()
    with torch.no_grad():
        ours.affine_weight.copy_(torch.rand(C) + 0.5), ours.affine_bias.copy_(torch.randn(C))
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(B, L, C, device=device) * 3 + 1
    x1, x2 = x.clone().requires_grad_(), x.double().requires_grad_()
    z1, z2 = ours(x1, "norm"), ref(x2, "norm")
    assert err(z1, z2) <= 1e-5
    head = torch.randn(L * C, T * C, device=device, dtype=torch.float64) / L  # a stand-in model
    p1 = (z1.reshape(B, -1) @ head.float()).reshape(B, T, C)
    p2 = (z2.reshape(B, -1) @ head).reshape(B, T, C)
    o1, o2 = ours(p1, "denorm"), ref(p2, "denorm")
    assert err(o1, o2) <= 1e-5
    g = torch.randn_like(o2)
    o1.backward(g.float())
    o2.backward(g)
    assert err(x1.grad, x2.grad) <= 1e-5
    check_grads(ours, ref, torch.float32, ["affine_weight", "affine_bias"])

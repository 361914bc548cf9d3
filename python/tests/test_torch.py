"""The PyTorch layer against torch autograd as the external reference: forward and
every gradient on float64-upcast inputs, every dtype, CPU and CUDA, awkward shapes,
non-contiguous inputs, only the requested gradients computed, no_grad, DDP."""
import os

import pytest
from conftest import data

torch = pytest.importorskip("torch")
import fastgrad as fg  # noqa: E402
from fastgrad import autograd, ops  # noqa: E402

from torch_helpers import DEVICES, DTYPES, err, tol  # noqa: E402


def leaf(rng, shape, dtype, device):
    t = torch.from_numpy(data(rng, shape)).to(device=device, dtype=dtype)
    return t.requires_grad_(True)


def reference(fn, inputs, dy):
    """torch autograd on float64 copies of the (already rounded) inputs."""
    ref_in = [t.detach().double().requires_grad_(True) if t is not None else None for t in inputs]
    out = fn(*ref_in)
    out.backward(dy.double())
    return out, [t.grad if t is not None else None for t in ref_in]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,k,m,bias", [((1,), 1, 1, True), ((3,), 17, 5, True), ((2, 9), 127, 33, False),
                                           ((1,), 1000, 300, True), ((4, 1, 5), 64, 48, True), ((257,), 33, 1, True)])
def test_linear(rng, device, dtype, lead, k, m, bias):
    x, w = leaf(rng, lead + (k,), dtype, device), leaf(rng, (m, k), dtype, device)
    b = leaf(rng, (m,), dtype, device) if bias else None
    y = fg.linear(x, w, b)
    dy = torch.from_numpy(data(rng, y.shape)).to(device=device, dtype=dtype)
    y.backward(dy)
    ref, grads = reference(torch.nn.functional.linear, [x, w, b], dy)
    assert y.dtype == dtype and y.device.type == device
    assert err(y, ref) <= tol(dtype)
    assert err(x.grad, grads[0]) <= tol(dtype)
    assert err(w.grad, grads[1]) <= tol(dtype)
    if bias:
        assert err(b.grad, grads[2]) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ash,bsh", [((5, 7), (7, 3)), ((4, 17, 31), (4, 31, 9)), ((3, 20, 7), (7, 13)),
                                     ((6, 19), (5, 19, 11)), ((1, 1, 129), (129, 1))])
def test_matmul(rng, device, dtype, ash, bsh):
    a, b = leaf(rng, ash, dtype, device), leaf(rng, bsh, dtype, device)
    c = fg.matmul(a, b)
    dc = torch.from_numpy(data(rng, c.shape)).to(device=device, dtype=dtype)
    c.backward(dc)
    ref, grads = reference(torch.matmul, [a, b], dc)
    assert err(c, ref) <= tol(dtype)
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert err(a.grad, grads[0]) <= tol(dtype)
    assert err(b.grad, grads[1]) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,m", [(1, 1), (3, 17), (1000, 7), (129, 1031)])
def test_outer(rng, device, dtype, n, m):
    x, y = leaf(rng, (n,), dtype, device), leaf(rng, (m,), dtype, device)
    z = fg.outer(x, y)
    dz = torch.from_numpy(data(rng, z.shape)).to(device=device, dtype=dtype)
    z.backward(dz)
    ref, grads = reference(torch.outer, [x, y], dz)
    assert err(z, ref) <= tol(dtype)
    assert err(x.grad, grads[0]) <= tol(dtype)
    assert err(y.grad, grads[1]) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_broadcast_grads(rng, device):
    base = leaf(rng, (8, 12, 40), torch.float32, device)
    wt = leaf(rng, (32, 24), torch.float32, device)

    def view(b):  # [12, 4, 32] whose leading dims do not collapse into one stride
        return b.transpose(0, 1)[:, ::2, 3:35]

    y = fg.linear(view(base), wt.t())               # column-major weight
    y.sum().backward()                              # dy is a zero-stride broadcast
    ref, grads = reference(lambda b, w: torch.nn.functional.linear(view(b), w.t()), [base, wt], torch.ones_like(y))
    assert err(y, ref) <= 1e-5
    assert err(base.grad, grads[0]) <= 1e-5
    assert err(wt.grad, grads[1]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_only_requested_gradients(rng, device, monkeypatch):
    # the Python Function's path (the C++ extension's is test_torchext.py's): its backward calls
    # only the requested ops.linear_backward_* functions
    monkeypatch.setattr(autograd, "_ext_linear", None)
    calls = []
    for name in ("linear_backward_input", "linear_backward_weight", "linear_backward_bias"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _real=real, _n=name, **k: (calls.append(_n), _real(*a, **k))[1])
    x = torch.from_numpy(data(rng, (5, 8))).to(device=device, dtype=torch.float32)  # no grad
    layer = fg.Linear(8, 4, device=device)
    layer.bias.requires_grad_(False)
    layer(x).sum().backward()
    assert calls == ["linear_backward_weight"]
    assert layer.weight.grad is not None and layer.bias.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_module_matches_nn_linear_and_no_grad(rng, device):
    torch.manual_seed(0)
    ours = fg.Linear(16, 8, device=device, dtype=torch.float64)
    ref = torch.nn.Linear(16, 8, device=device, dtype=torch.float64)
    ref.load_state_dict(ours.state_dict())
    x = torch.from_numpy(data(rng, (3, 16))).to(device)
    with torch.no_grad():
        y = ours(x)
    assert not y.requires_grad
    assert err(y, ref(x)) <= 1e-12
    assert "in_features=16" in repr(ours)


def test_errors_carry_status():
    x = torch.zeros(4, 8)
    with pytest.raises(fg.FastgradError) as e:
        ops.linear_forward(x, torch.zeros(3, 7))
    assert e.value.name == "FG_ERR_SHAPE" and "w.shape[1]=7" in str(e.value)
    with pytest.raises(TypeError, match="uint8"):
        ops.linear_forward(x.to(torch.uint8), torch.zeros(3, 8).to(torch.uint8))
    with pytest.raises(fg.FastgradError, match="x.dtype is i64 but it must be a float dtype"):
        ops.linear_forward(x.long(), torch.zeros(3, 8).long())
    if torch.cuda.is_available():
        with pytest.raises(fg.FastgradError) as e:
            ops.linear_forward(x.cuda(), torch.zeros(3, 8))
        assert e.value.name == "FG_ERR_WRONG_DEVICE" and "w.data" in str(e.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_current_stream_and_tf32(rng):
    s = torch.cuda.Stream()
    a = torch.from_numpy(data(rng, (256, 512))).cuda().float()
    b = torch.from_numpy(data(rng, (512, 128))).cuda().float()
    with torch.cuda.stream(s):
        c = ops.matmul_forward(a, b)
    s.synchronize()
    assert err(c, a.double() @ b.double()) <= 1e-5
    fg.set_allow_tf32(True)
    try:
        info = ops.plan_info("matmul_forward", dict(a=a, b=b, c=c))
        assert info["tf32"] and info["backend"] == "cuda" and info["arch"] >= 80
        assert err(ops.matmul_forward(a, b), a.double() @ b.double()) <= 1e-3
    finally:
        fg.set_allow_tf32(False)
    assert not ops.plan_info("matmul_forward", dict(a=a, b=b, c=c))["tf32"]


def test_ddp_single_process(rng, tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(1)
        model = torch.nn.Sequential(fg.Linear(12, 16, dtype=torch.float64), torch.nn.Tanh(),
                                    fg.Linear(16, 3, dtype=torch.float64))
        ref = torch.nn.Sequential(torch.nn.Linear(12, 16, dtype=torch.float64), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 3, dtype=torch.float64))
        ref.load_state_dict(model.state_dict())
        ddp = DDP(model)
        x = torch.from_numpy(data(rng, (10, 12)))
        ddp(x).square().mean().backward()
        ref(x).square().mean().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert err(p.grad, q.grad) <= 1e-12
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ elementwise family and AdamW

UNARY_TORCH = [
    ("scale", lambda x: fg.scale(x, -1.5), lambda x: -1.5 * x),
    ("pow", lambda x: fg.pow(x, 2.5), lambda x: torch.pow(x, 2.5)),
    ("leaky_relu", lambda x: fg.leaky_relu(x, 0.1), lambda x: torch.nn.functional.leaky_relu(x, 0.1)),
    ("elu", lambda x: fg.elu(x, 1.3), lambda x: torch.nn.functional.elu(x, 1.3)),
    ("clamp", lambda x: fg.clamp(x, -0.2, 0.6), lambda x: torch.clamp(x, -0.2, 0.6)),
    ("softcap", lambda x: fg.softcap(x, 0.7), lambda x: 0.7 * torch.tanh(x / 0.7)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,ours,theirs", UNARY_TORCH)
def test_unary_ops(rng, device, dtype, name, ours, theirs):
    x = leaf(rng, (33, 130), dtype, device)
    if name == "pow":
        x = (x.detach().abs() + 0.1).requires_grad_(True)
    y = ours(x)
    dy = torch.from_numpy(data(rng, y.shape)).to(device=device, dtype=dtype)
    y.backward(dy)
    ref, grads = reference(theirs, [x], dy)
    assert err(y, ref) <= tol(dtype)
    assert err(x.grad, grads[0]) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((4099,), (4099,), None), ((5, 1, 7), (1, 4, 7), (7,)), ((64, 33), (64, 33), (64, 33))])
def test_lerp_vs_torch(rng, device, dtype, shapes):
    a, b = leaf(rng, shapes[0], dtype, device), leaf(rng, shapes[1], dtype, device)
    b = (b.detach() + 1).requires_grad_(True)  # b − a must not cancel in dw's sums
    w = leaf(rng, shapes[2], dtype, device) if shapes[2] else 0.3
    y = fg.lerp(a, b, w)
    dy = torch.from_numpy(data(rng, y.shape)).to(device=device, dtype=dtype)
    y.backward(dy)
    ref, grads = reference(torch.lerp, [a, b] + ([w] if shapes[2] else []), dy) if shapes[2] else \
        reference(lambda p, q: torch.lerp(p, q, 0.3), [a, b], dy)
    assert err(y, ref) <= tol(dtype)
    assert err(a.grad, grads[0]) <= tol(dtype) and err(b.grad, grads[1]) <= tol(dtype)
    if shapes[2]:
        assert err(w.grad, grads[2]) <= tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_axpby_vs_torch(rng, device):
    a, b = leaf(rng, (7, 9), torch.float32, device), leaf(rng, (9,), torch.float32, device)
    y = fg.axpby(a, b, 0.5, -2.0)
    y.sum().backward()
    assert err(y, 0.5 * a.double() - 2.0 * b.double()) <= 1e-5
    assert err(a.grad, torch.full((7, 9), 0.5)) <= 1e-6 and err(b.grad, torch.full((9,), -14.0)) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adamw_vs_torch(rng, device, dtype):
    torch.manual_seed(3)
    shapes = [(1,), (17, 33), (1000,), (300, 257)]
    ours = [torch.nn.Parameter(torch.from_numpy(data(rng, s)).to(device=device, dtype=dtype)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().float().clone()) for p in ours]  # the reference runs in f32
    opt = fg.AdamW(ours, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, master_weights=dtype != torch.float32)
    ropt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    for _ in range(4):
        for p, q in zip(ours, ref):
            g = torch.from_numpy(data(rng, p.shape)).to(device=device, dtype=torch.float32)
            p.grad = g.to(dtype)
            q.grad = g.to(dtype).float()
        opt.step()
        ropt.step()
    for p, q in zip(ours, ref):
        st = opt.state[p]
        if dtype == torch.float32:
            assert err(p, q) <= 1e-5
        else:
            assert err(st["master"], q) <= 1e-5  # the f32 master follows torch exactly
            assert err(p, q) <= tol(dtype)
        assert err(st["exp_avg"], ropt.state[q]["exp_avg"]) <= 1e-5
        assert err(st["exp_avg_sq"], ropt.state[q]["exp_avg_sq"]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_adamw_param_dtype_moments(rng, device):
    """moment_dtype="param" on bf16 parameters against torch's fused AdamW, which keeps bf16
    moments too: both compute in f32 and round what they store. A parameter replaced between
    steps (new storage) must be seen by the described-tensor cache."""
    dtype = torch.bfloat16
    shapes = [(1,), (17, 33), (1000,), (300, 257)]
    ours = [torch.nn.Parameter(torch.from_numpy(data(rng, s)).to(device=device, dtype=dtype)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    opt = fg.AdamW(ours, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, moment_dtype="param")
    ropt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, fused=True)
    for step in range(4):
        if step == 2:  # new storage for one parameter, same values
            with torch.no_grad():
                ours[1].data = ours[1].data.clone()
        for p, q in zip(ours, ref):
            g = torch.from_numpy(data(rng, p.shape)).to(device=device, dtype=dtype)
            p.grad = g.clone()
            q.grad = g.clone()
        opt.step()
        ropt.step()
    moved = 0.0
    for p, q, p0 in zip(ours, ref, start):
        st, rst = opt.state[p], ropt.state[q]
        moved = max(moved, (p.double() - p0.double()).abs().max().item())
        assert st["exp_avg"].dtype == dtype and st["exp_avg_sq"].dtype == dtype
        assert err(p, q) <= tol(dtype)
        assert err(st["exp_avg"], rst["exp_avg"]) <= tol(dtype)
        assert err(st["exp_avg_sq"], rst["exp_avg_sq"]) <= tol(dtype)
    assert moved >= 0.02  # four steps of lr 1e-2: the steps were taken (a no-op would pass the rest)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("master", [False, True])
def test_adamw_kept_lists(rng, device, master):
    """The step that reuses last step's described lists against torch's AdamW over steps where the
    lists must be rebuilt: a parameter without a gradient (skipped, its step count held back), a
    non-contiguous gradient, a parameter given new storage."""
    dtype = torch.bfloat16 if master else torch.float32
    shapes = [(5,), (17, 33), (64,), (40, 9)]
    ours = [torch.nn.Parameter(torch.from_numpy(data(rng, s)).to(device=device, dtype=dtype)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().float().clone()) for p in ours]
    opt = fg.AdamW(ours, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, master_weights=master)
    ropt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    for step in range(7):
        for i, (p, q) in enumerate(zip(ours, ref)):
            if step == 3 and i == 2:  # no gradient this step
                p.grad, q.grad = None, None
                continue
            g = torch.from_numpy(data(rng, p.shape)).to(device=device, dtype=torch.float32)
            if step == 4 and i == 1:  # a transposed (non-contiguous) gradient
                gp = g.to(dtype).t().contiguous().t()
                assert not gp.is_contiguous()
            else:
                gp = g.to(dtype)
            p.grad = gp
            q.grad = gp.float()
        if step == 6:
            with torch.no_grad():
                ours[3].data = ours[3].data.clone()
        opt.step()
        ropt.step()
    for p, q in zip(ours, ref):
        st = opt.state[p]
        assert st["step"] == ropt.state[q]["step"]
        if master:
            assert err(st["master"], q) <= 1e-5
        else:
            assert err(p, q) <= 1e-5
        assert err(st["exp_avg"], ropt.state[q]["exp_avg"]) <= 1e-5
        assert err(st["exp_avg_sq"], ropt.state[q]["exp_avg_sq"]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_modules(rng, device):
    x = leaf(rng, (6, 40), torch.float32, device)
    pairs = [(fg.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)), (fg.ELU(0.7), torch.nn.ELU(0.7)),
             (fg.Clamp(-0.1, 0.3), lambda t: torch.clamp(t, -0.1, 0.3)), (fg.Softcap(2.0), lambda t: 2.0 * torch.tanh(t / 2.0))]
    for ours, theirs in pairs:
        assert err(ours(x), theirs(x.double())) <= 1e-5
    b = leaf(rng, (6, 40), torch.float32, device)
    assert err(fg.Lerp(0.25)(x, b), torch.lerp(x.double(), b.double(), 0.25)) <= 1e-5

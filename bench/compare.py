"""Side-by-side benchmark on the GPU: fastgrad against PyTorch eager and torch.compile
(and the peer libraries for the families they cover, once those families land), the
same shapes in one run.

Time: CUDA events around blocks of calls after warm-up, the median over rounds, inputs
rotated between two sets, the implementations of a case interleaved block by block
(timed_together says why). Memory: torch.cuda.max_memory_allocated() during one call,
above what was allocated before it (inputs excluded). fastgrad takes its workspace
from torch's caching allocator, so both sides are counted the same way.

Writes <out>/benchmarks.md (table, GPU, date, versions) and <out>/bench_time.png,
<out>/bench_memory.png.

    PYTHONPATH=python python3 bench/compare.py --out /tmp/out
"""
import argparse
import datetime
import math
import os
import statistics

import torch
import torch.nn.functional as F

import fastgrad as fg
from fastgrad import ops

REPS = 30


def timed(fn, sets):
    for i in range(3):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*sets[i % len(sets)])
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def timed_together(fns, sets, rounds=REPS // 3, block=3):
    """Medians for several implementations of one case, interleaved in blocks: each round
    runs every implementation (the order rotating) as one untimed call and then `block`
    back-to-back calls timed together. Interleaving spreads a drift of the GPU's clock over
    all of them; the untimed call lets the GPU's queue reach the implementation's own steady
    state first, so a host-bound neighbour (torch.compile's ~0.6 ms of Python at small
    shapes) does not leave the GPU idle inside the next one's timed window — measured: call
    by call, fastgrad read 0.40 ms after compile against 0.28 alone or after eager."""
    for fn in fns:
        for i in range(3):
            fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for i in range(rounds):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            fns[k](*sets[0])
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for r in range(block):
                fns[k](*sets[(r + 1) % len(sets)])
            end.record()
            times[k].append((start, end))
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) / block for s, e in t) for t in times]


def peak_extra(fn, args):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn(*args)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def rand(shape, dtype, requires_grad=False):
    return (torch.rand(shape, device="cuda", dtype=torch.float32) * 2 - 1).to(dtype).requires_grad_(requires_grad)


# ------------------------------------------------------------------ cases
# Each case: name, inputs maker, fastgrad fn, torch side, work. The torch side is a
# forward function wrapped by forward_of / backward_of; for torch.compile the forward
# is compiled and autograd runs the backward AOTAutograd compiled for it, the way a
# training step uses it.

class forward_of:
    """Calls fn on the first n inputs."""

    def __init__(self, fn, n):
        self.fn, self.n = fn, n

    def compiled(self):
        return forward_of(torch.compile(self.fn), self.n)

    def __call__(self, *args):
        return self.fn(*args[:self.n])


class backward_of(forward_of):
    """fn on the first n inputs, then the gradients of all n with the last input as dy."""

    def compiled(self):
        return backward_of(torch.compile(self.fn), self.n)

    def __call__(self, *args):
        out = self.fn(*args[:self.n])
        return (out,) + torch.autograd.grad(out, args[:self.n], args[-1])


def linear_case(n, k, m, dtype, backward):
    def make():
        return (rand((n, k), dtype, backward), rand((m, k), dtype, backward), rand((m,), dtype, backward),
                rand((n, m), dtype))

    if backward:
        def ours(x, w, b, dy):
            y = ops.linear_forward(x.detach(), w.detach(), b.detach())
            return (y, ops.linear_backward_input(dy, w.detach()), ops.linear_backward_weight(dy, x.detach()),
                    ops.linear_backward_bias(dy))

        theirs = backward_of(F.linear, 3)
        flops = 6.0 * n * k * m
    else:
        def ours(x, w, b, dy):
            return ops.linear_forward(x, w, b)

        theirs = forward_of(F.linear, 3)
        flops = 2.0 * n * k * m
    what = "fwd+bwd" if backward else "fwd"
    return dict(family="Linear", name=f"linear {what}", shape=f"N={n} K={k} M={m}", dtype=dtype, make=make,
                ours=ours, theirs=theirs, flops=flops, bytes=0)


def gemv_case(k, m, dtype):
    def make():
        return rand((1, k), dtype), rand((m, k), dtype)

    return dict(family="Linear", name="linear fwd, one row (GEMV)", shape=f"1x{k} . {m}x{k}^T", dtype=dtype,
                make=make, ours=lambda x, w: ops.linear_forward(x, w), theirs=forward_of(F.linear, 2), flops=0,
                bytes=(m * k + k + m) * torch.tensor([], dtype=dtype).element_size())


def matmul_case(batch, m, k, n, dtype, broadcast_b):
    def make():
        return (rand((batch, m, k), dtype, True), rand((k, n) if broadcast_b else (batch, k, n), dtype, True),
                rand((batch, m, n), dtype))

    def ours(a, b, dc):
        c = ops.matmul_forward(a.detach(), b.detach())
        return (c, ops.matmul_backward_input(dc, b.detach(), batched=True),
                ops.matmul_backward_other(a.detach(), dc, batched=not broadcast_b))

    theirs = backward_of(torch.matmul, 2)
    shape = f"B={batch} {m}x{k}x{n}" + (" (b 2-D)" if broadcast_b else "")
    return dict(family="Matmul", name="matmul fwd+bwd", shape=shape, dtype=dtype, make=make, ours=ours,
                theirs=theirs, flops=6.0 * batch * m * k * n, bytes=0)


def outer_case(n, m, dtype):
    def make():
        return rand((n,), dtype, True), rand((m,), dtype, True), rand((n, m), dtype)

    def ours(x, y, dz):
        z = ops.outer_forward(x.detach(), y.detach())
        return z, ops.outer_backward_input(dz, y.detach()), ops.outer_backward_other(dz, x.detach())

    theirs = backward_of(torch.outer, 2)
    es = torch.tensor([], dtype=dtype).element_size()
    return dict(family="Outer", name="outer fwd+bwd", shape=f"{n} x {m}", dtype=dtype, make=make, ours=ours,
                theirs=theirs, flops=0, bytes=3 * n * m * es)


def lerp_case(n, dtype, backward):
    def make():
        return rand((n,), dtype, backward), rand((n,), dtype, backward), rand((n,), dtype)

    es = torch.tensor([], dtype=dtype).element_size()
    if backward:
        def ours(a, b, dy):
            y = ops.lerp_forward(a.detach(), b.detach(), 0.3)
            return (y,) + ops.lerp_backward(dy, a.detach(), b.detach(), 0.3, need=(True, True, False))[:2]
        theirs = backward_of(lambda a, b: torch.lerp(a, b, 0.3), 2)
    else:
        def ours(a, b, dy):
            return ops.lerp_forward(a, b, 0.3)
        theirs = forward_of(lambda a, b: torch.lerp(a, b, 0.3), 2)
    return dict(family="Elementwise", name="lerp fwd+bwd" if backward else "lerp fwd", shape=f"n=2^{n.bit_length() - 1}",
                dtype=dtype, make=make, ours=ours, theirs=theirs, flops=0, bytes=(6 if backward else 3) * n * es)


def adamw_sizes(total, count):
    import numpy as np
    r = np.random.default_rng(0)
    w = np.exp(r.uniform(np.log(1e3), np.log(5e7), count))
    sizes = (w / w.sum() * total).astype(np.int64)
    sizes[-1] += total - sizes.sum()
    return [int(s) for s in sizes]


def adamw_case(total, count):
    """One optimizer step; each side gets its own parameters, gradients and state."""
    sizes = adamw_sizes(total, count)

    def build(kind):
        params = [torch.nn.Parameter(rand((n,), torch.float32)) for n in sizes]
        for p in params:
            p.grad = torch.randn_like(p)
        if kind == "fastgrad":
            opt = fg.AdamW(params, lr=1e-4, weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
        opt.step()  # creates the state, so the timed steps allocate nothing
        return opt

    return dict(family="AdamW", name="AdamW step", shape=f"{total / 1e9:.0f}B params, {count} tensors",
                dtype=torch.float32, build=build, flops=0, bytes=28 * total)


def gpt2_small_shapes():
    """The parameter tensors of GPT-2 small (124M, 148 tensors)."""
    d, ff, vocab, ctx, layers = 768, 3072, 50257, 1024, 12
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (ff, d), (ff,), (d, ff), (d,)]
    return shapes + [(d,), (d,)]


def adamw_gpt2_case(moments):
    """One step over GPT-2 small's bf16 parameters and gradients: moments "param" (bf16, what
    torch.optim.AdamW(fused=True) keeps for bf16 parameters) or "float32"; the torch side is the
    fused AdamW (bf16 moments either way: it has no f32-moment mode for bf16 parameters). The
    time includes the Python call (what a training loop waits for when it is host-bound)."""
    shapes = gpt2_small_shapes()
    total = sum(math.prod(s) for s in shapes)

    def build(kind):
        params = [torch.nn.Parameter(rand(s, torch.bfloat16)) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        if kind == "fastgrad":
            opt = fg.AdamW(params, lr=1e-4, weight_decay=0.01, moment_dtype=moments)
        else:
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
        opt.step()
        return opt

    return dict(family="AdamW", name=f"AdamW step, {'bf16' if moments == 'param' else 'f32'} moments",
                shape=f"GPT-2 small {total / 1e6:.0f}M, {len(shapes)} tensors", dtype=torch.bfloat16, build=build,
                flops=0, bytes=(14 if moments == "param" else 22) * total)


ADAMW_CASES = [lambda: adamw_gpt2_case("param"), lambda: adamw_gpt2_case("float32")]


_ACTS = {"relu": F.relu, "gelu_tanh": lambda p: F.gelu(p, approximate="tanh"), "silu": F.silu,
         "gelu": F.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def linact_case(n, k, m, act, dtype=torch.bfloat16, save="auto"):
    """y = act(x·wᵀ + b), forward and every gradient, saving for the backward as the library's
    autograd does (save: "slope" keeps act′(pre); "pre" keeps pre; "auto", its default, the
    slope for k > 128 and else pre; "recompute" nothing): the backward consumes what was kept
    (g formed in its memory); relu keeps only y."""
    if save == "auto":
        save = "slope" if k > 128 else "pre"
    relu, recompute, slope = act == "relu", save == "recompute", save == "slope"

    def make():
        return (rand((n, k), dtype, True), rand((m, k), dtype, True), rand((m,), dtype, True), rand((n, m), dtype))

    def ours(x, w, b, dy):
        y, kept = ops.linear_act_forward(x.detach(), w.detach(), b.detach(), act, keep_pre=not (relu or recompute),
                                         slope=slope and not relu)
        saved = None if recompute else y if relu else kept
        return (y,) + ops.linear_act_backward(dy, x.detach(), w.detach(), b.detach(), saved, act,
                                              consume_pre=not (relu or recompute), slope=slope and not relu)

    fn = _ACTS[act]
    theirs = backward_of(lambda x, w, b: fn(F.linear(x, w, b)), 3)
    how = "" if relu and not recompute else f" ({'slope kept' if slope else 'pre kept' if save == 'pre' else 'recompute'})"
    return dict(family="LinearAct", name=f"linear+{act} fwd+bwd{how}", shape=f"N={n} K={k} M={m}", dtype=dtype,
                make=make, ours=ours, theirs=theirs, flops=6.0 * n * k * m, bytes=0)


ACT_CASES = [
    lambda: linact_case(8192, 4096, 16384, "gelu_tanh"),
    lambda: linact_case(8192, 4096, 16384, "relu"),
    lambda: linact_case(8192, 4096, 16384, "silu"),
    lambda: linact_case(8192, 4096, 16384, "gelu_tanh", save="pre"),
    lambda: linact_case(8192, 4096, 16384, "silu", save="pre"),
    lambda: linact_case(172032, 128, 256, "gelu_tanh"),
    lambda: linact_case(172032, 128, 256, "relu"),
    lambda: linact_case(172032, 128, 256, "silu"),
    lambda: linact_case(172032, 128, 256, "gelu_tanh", save="slope"),
    lambda: linact_case(172032, 128, 256, "silu", save="slope"),
    lambda: linact_case(172032, 128, 256, "gelu_tanh", save="recompute"),
    lambda: linact_case(172032, 128, 256, "relu", save="recompute"),
    lambda: linact_case(172032, 128, 256, "silu", save="recompute"),
]

CASES = [
    lambda: linear_case(8192, 4096, 4096, torch.bfloat16, False),
    lambda: linear_case(8192, 4096, 4096, torch.bfloat16, True),
    lambda: linear_case(4096, 1024, 1024, torch.bfloat16, True),
    lambda: gemv_case(8192, 8192, torch.float32),
    lambda: matmul_case(16, 1024, 1024, 1024, torch.bfloat16, False),
    lambda: matmul_case(16, 1024, 1024, 1024, torch.bfloat16, True),
    lambda: outer_case(16384, 8192, torch.bfloat16),
    lambda: lerp_case(1 << 28, torch.float32, False),
    lambda: lerp_case(1 << 28, torch.float32, True),
    lambda: adamw_case(1_000_000_000, 200),
] + ADAMW_CASES


def norm_case(kind, n, d, dtype, backward=True, p=0.0):
    """The normalization family: kind "layer" (F.layer_norm), "rms" (F.rms_norm), "batch" (F.batch_norm
    over the N rows, training, running statistics updated) or "add" (LayerNorm of x + dropout(r), the
    pre-norm residual; the sum s is kept for the next block as the library's fused op writes it).
    fwd+bwd: the forward saving what the backward needs, then dx (dr), dw, db. bytes: what the
    minimal algorithm reads and writes (x, r in; y, s out; dy, x in, dx, dr out)."""
    from fastgrad import norm as fgn

    es = torch.tensor([], dtype=dtype).element_size()
    add, rms = kind == "add", kind == "rms"

    def make():
        t = (rand((n, d), dtype, True),) + ((rand((n, d), dtype, True),) if add else ())
        return t + (rand((d,), dtype, True),) + (() if rms else (rand((d,), dtype, True),)) + (rand((n, d), dtype),)

    if kind == "batch":
        rm, rv = torch.zeros(d, device="cuda", dtype=torch.float32), torch.ones(d, device="cuda", dtype=torch.float32)

        def fwd_t(x, w, b):
            return F.batch_norm(x, rm.to(dtype), rv.to(dtype), w, b, True, 0.1, 1e-5)

        def ours(x, w, b, dy):
            y, _, mean, rstd = fgn.batch_norm_forward(x.detach(), w.detach(), b.detach(), rm, rv)
            if not backward:
                return y
            return (y,) + fgn.batch_norm_backward(dy, x.detach(), w.detach(), mean, rstd)
    elif add:
        def fwd_t(x, r, w, b):
            return F.layer_norm(x + F.dropout(r, p), (d,), w, b, 1e-5)

        def ours(x, r, w, b, dy):
            y, s, mean, rstd = fgn.norm_forward(x.detach(), w.detach(), b.detach(), r.detach(), "layer", 1e-5, p, 1234)
            if not backward:
                return y, s
            return (y, s) + fgn.norm_backward(dy, s, w.detach(), mean, rstd, None, "layer", 1e-5, p, 1234, 0,
                                              need=(True, True, True, True))
    elif rms:
        def fwd_t(x, w):
            return F.rms_norm(x, (d,), w, 1e-5)

        def ours(x, w, dy):
            y, _, _, rstd = fgn.norm_forward(x.detach(), w.detach(), kind="rms", save_stats=backward)
            if not backward:
                return y
            return (y,) + fgn.norm_backward(dy, x.detach(), w.detach(), None, rstd, None, "rms", has_bias=False)
    else:
        def fwd_t(x, w, b):
            return F.layer_norm(x, (d,), w, b, 1e-5)

        def ours(x, w, b, dy):
            y, _, mean, rstd = fgn.norm_forward(x.detach(), w.detach(), b.detach(), save_stats=backward)
            if not backward:
                return y
            return (y,) + fgn.norm_backward(dy, x.detach(), w.detach(), mean, rstd)

    nin = 4 if add else 2 if rms else 3
    theirs = backward_of(fwd_t, nin) if backward else forward_of(fwd_t, nin)
    streams = (2 + (2 if add else 0)) + ((3 + (1 if add else 0)) if backward else 0)
    label = {"layer": "layer_norm", "rms": "rms_norm", "batch": "batch_norm", "add": f"add+dropout({p})+layer_norm"}
    return dict(family="Norm", name=f"{label[kind]} {'fwd+bwd' if backward else 'fwd'}", shape=f"N={n} D={d}",
                dtype=dtype, make=make, ours=ours, theirs=theirs, flops=0, bytes=streams * n * d * es)


NORM_CASES = [
    lambda: norm_case("layer", 32768, 4096, torch.bfloat16, backward=False),
    lambda: norm_case("layer", 32768, 4096, torch.bfloat16),
    lambda: norm_case("layer", 8192, 768, torch.float32),
    lambda: norm_case("layer", 8192, 768, torch.bfloat16),
    lambda: norm_case("layer", 172032, 128, torch.float32),
    lambda: norm_case("layer", 172032, 128, torch.bfloat16),
    lambda: norm_case("batch", 172032, 128, torch.float32),
    lambda: norm_case("batch", 172032, 128, torch.bfloat16),
    lambda: norm_case("rms", 8192, 4096, torch.bfloat16),
    lambda: norm_case("layer", 8192, 16384, torch.bfloat16),
    lambda: norm_case("add", 8192, 1024, torch.bfloat16, p=0.1),
    lambda: norm_case("add", 8192, 768, torch.bfloat16, p=0.1),
]


class attention_of(forward_of):
    """fn(q, k, v[, scores_in]) -> o or (o, scores) on the first n inputs, then the gradients of those n
    inputs from the trailing upstream gradients (do, and dscores when fn returns the scores)."""

    def __init__(self, fn, n, outputs):
        super().__init__(fn, n)
        self.outputs = outputs

    def compiled(self):
        return attention_of(torch.compile(self.fn), self.n, self.outputs)

    def __call__(self, *args):
        out = self.fn(*args[:self.n])
        out = out if isinstance(out, tuple) else (out,)
        return out + torch.autograd.grad(out, args[:self.n], args[len(args) - self.outputs:])


def attn_case(b, h, l, hd, dtype, residual, causal, sdpa=False):
    """Multi-head attention fwd+bwd on [B, H, L, hd] views of [B, L, H, hd] projections (the layout a
    fused QKV projection leaves). residual: PatchTST's residual attention — scores_in added to the
    scaled q·kᵀ, the pre-softmax scores returned for the next layer, whose gradient comes back with
    do. The torch side: matmul → softmax → matmul as PatchTST's _ScaledDotProductAttention writes
    it (eager, and torch.compile of it), or scaled_dot_product_attention (sdpa; its torch.compile
    column is the same call compiled)."""
    scale = hd ** -0.5

    def heads(requires_grad):
        return rand((b, l, h, hd), dtype, requires_grad).transpose(1, 2)

    def make():
        t = (heads(True), heads(True), heads(True))
        if residual:
            t += (rand((b, h, l, l), dtype, True),)
        t += (heads(False),)
        if residual:
            t += (rand((b, h, l, l), dtype),)
        return t

    n = 4 if residual else 3
    if residual:
        def fwd_t(q, k, v, prev):
            s = torch.matmul(q, k.transpose(-2, -1)) * scale + prev
            return torch.matmul(torch.softmax(s, dim=-1), v), s

        def ours(q, k, v, prev, do, ds):
            q, k, v, prev = q.detach(), k.detach(), v.detach(), prev.detach()
            o, lse, s = ops.attention_forward(q, k, v, scores_in=prev, return_scores=True)
            return (o, s) + ops.attention_backward(do, q, k, v, o, lse, scores_in=prev, dscores=ds)
    else:
        if sdpa:
            def fwd_t(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            mask = torch.ones(l, l, dtype=torch.bool, device="cuda").triu(1) if causal else None

            def fwd_t(q, k, v):
                s = torch.matmul(q, k.transpose(-2, -1)) * scale
                if mask is not None:
                    s = s.masked_fill(mask, float("-inf"))
                return torch.matmul(torch.softmax(s, dim=-1), v)

        opt = ops.attention_options(causal=causal)

        def ours(q, k, v, do):
            q, k, v = q.detach(), k.detach(), v.detach()
            o, lse, _ = ops.attention_forward(q, k, v, options=opt)
            return (o,) + ops.attention_backward(do, q, k, v, o, lse, options=opt)[:3]

    es = torch.tensor([], dtype=dtype).element_size()
    rows, scores = b * h * l * hd, b * h * l * l
    flops = 4.0 * b * h * l * l * hd * (0.5 if causal else 1.0) * 3.5  # fwd, and the backward's 2.5 x fwd
    name = "attention fwd+bwd" + (" (residual scores)" if residual else "") + (" causal" if causal else "") \
        + (" vs SDPA" if sdpa else "")
    return dict(family="Attention", name=name, shape=f"B={b} H={h} L={l} hd={hd}", dtype=dtype, make=make, ours=ours,
                theirs=attention_of(fwd_t, n, 2 if residual else 1), flops=0 if residual else flops,
                bytes=(12 * rows + 5 * scores) * es if residual else 0, sdpa=sdpa)


ATTN_CASES = [
    lambda: attn_case(4096, 16, 42, 8, torch.float32, residual=True, causal=False),   # PatchTST, d_model 128
    lambda: attn_case(4096, 16, 42, 8, torch.bfloat16, residual=True, causal=False),
    lambda: attn_case(4096, 4, 42, 4, torch.float32, residual=True, causal=False),    # d_model 16
    lambda: attn_case(4096, 4, 42, 4, torch.bfloat16, residual=True, causal=False),
    lambda: attn_case(8, 16, 1024, 64, torch.bfloat16, residual=False, causal=True),  # GPT-2 small layer
    lambda: attn_case(8, 16, 1024, 64, torch.bfloat16, residual=False, causal=True, sdpa=True),
]


def copy_gbps():
    """The device's copy bandwidth in this run (bytes read + written / time), the ceiling of the
    bandwidth-bound rows."""
    src = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), [()])
    return 2 * src.numel() / ms / 1e6


def rate(case, ms):
    if case["flops"]:
        return f"{case['flops'] / ms / 1e9:.0f} TFLOP/s"
    return f"{case['bytes'] / ms / 1e6:.0f} GB/s"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--only", choices=["all", "logp", "act", "base", "norm", "attn", "adamw"], default="all",
                    help="logp: only the linear log-prob rows; act: only linear + activation; base: neither")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    logp_md = []
    if args.only in ("all", "logp"):
        import compare_logp
        logp_md, logp_summary = compare_logp.run()
        for line in logp_summary:
            print("SUMMARY " + line, flush=True)
        torch.cuda.empty_cache()
    cases = {"all": CASES + ACT_CASES + NORM_CASES + ATTN_CASES, "logp": [], "act": ACT_CASES, "base": CASES,
             "norm": NORM_CASES, "attn": ATTN_CASES, "adamw": ADAMW_CASES}[args.only]
    copy_ceiling = copy_gbps() if args.only in ("all", "norm") else float("nan")
    if args.only in ("all", "norm"):
        print(f"SUMMARY copy bandwidth (read + write): {copy_ceiling:.0f} GB/s", flush=True)
    for make_case in cases:
        case = make_case()
        if "build" in case:  # optimizers: each side owns its state
            result = {"case": case}
            for label in ["fastgrad", "torch eager"] + ([] if args.no_compile else ["torch.compile"]):
                if label == "torch.compile":
                    result[label] = (float("nan"), float("nan"))  # not measured: see the notes in the report
                    continue
                opt = case["build"]("fastgrad" if label == "fastgrad" else "torch")
                ms = timed(lambda: opt.step(), [()])
                mem = peak_extra(lambda: opt.step(), ())
                result[label] = (ms, mem)
                print(f"{case['name']:<28} {case['shape']:<26} {label:<14} {ms:8.4f} ms  {rate(case, ms):>14}  "
                      f"peak +{mem / 2**20:8.1f} MiB", flush=True)
                del opt
                torch.cuda.empty_cache()
            rows.append(result)
            o, e = result["fastgrad"][0], result["torch eager"][0]
            print(f"SUMMARY {case['name']} {case['shape']}: {e / o:.2f}x torch fused AdamW; "
                  f"{case['bytes'] / o / 1e6:.0f} GB/s", flush=True)
            continue
        sets = [case["make"](), case["make"]()]
        impls = [("fastgrad", case["ours"]), ("torch eager", case["theirs"])]
        if not args.no_compile:
            impls.append(("torch.compile", case["theirs"].compiled()))
        result = {"case": case}
        all_ms = timed_together([fn for _, fn in impls], sets)
        for (label, fn), ms in zip(impls, all_ms):
            mem = peak_extra(fn, sets[0])
            result[label] = (ms, mem)
            print(f"{case['name']:<28} {case['shape']:<26} {label:<14} {ms:8.4f} ms  {rate(case, ms):>14}  "
                  f"peak +{mem / 2**20:8.1f} MiB", flush=True)
        rows.append(result)
        if case["family"] == "Norm":
            e, c, o = result["torch eager"][0], result.get("torch.compile", (float("nan"),))[0], result["fastgrad"][0]
            print(f"SUMMARY {case['name']} {case['dtype']} {case['shape']}: {e / o:.2f}x eager, {c / o:.2f}x compile; "
                  f"{case['bytes'] / o / 1e6:.0f} GB/s = {case['bytes'] / o / 1e6 / copy_ceiling:.0%} of copy", flush=True)
        if case["family"] == "Attention":
            e, c, o = result["torch eager"][0], result.get("torch.compile", (float("nan"),))[0], result["fastgrad"][0]
            vs = "SDPA" if case["sdpa"] else "eager"
            print(f"SUMMARY {case['name']} {case['dtype']} {case['shape']}: {e / o:.2f}x {vs}, {c / o:.2f}x compile"
                  + (f"; time {o / e:.2f}x SDPA's" if case["sdpa"] else "")
                  + f"; peak {result['fastgrad'][1] / 2**20:.0f} MiB vs {vs} {result['torch eager'][1] / 2**20:.0f}",
                  flush=True)
        if case["family"] == "LinearAct":
            e, c, o = result["torch eager"][0], result.get("torch.compile", (float("nan"),))[0], result["fastgrad"][0]
            print(f"SUMMARY {case['name']} {case['shape']}: {e / o:.2f}x eager, {c / o:.2f}x compile; peak "
                  f"{result['fastgrad'][1] / 2**20:.0f} MiB vs compile {result.get('torch.compile', (0, 0))[1] / 2**20:.0f}",
                  flush=True)
        del sets
        torch.cuda.empty_cache()
    write_report(rows, args.out, ["fastgrad", "torch eager"] + ([] if args.no_compile else ["torch.compile"]), logp_md)


def write_report(rows, out, labels, extra=()):
    dev = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    lines = [
        "# fastgrad benchmarks", "",
        f"GPU: {dev}; date: {date}; fastgrad {fg.__version__}; torch {torch.__version__}; "
        f"CUDA {torch.version.cuda}. TF32 off everywhere. Written by `bench/compare.py` "
        "(median of CUDA-event timings over blocks of calls, inputs rotated, implementations interleaved block by block; peak = max_memory_allocated above the inputs). "
        "For the AdamW row the 'torch eager' column is torch.optim.AdamW(fused=True), and torch.compile is not "
        "measured (nan).", "",
        "| op | shape | dtype | " + " | ".join(f"{l} ms" for l in labels) + " | fastgrad rate | "
        + " | ".join(f"{l} peak MiB" for l in labels) + " | " + " | ".join(f"speed-up vs {l}" for l in labels[1:]) + " |",
        "|" + "---|" * (4 + 2 * len(labels) + len(labels) - 1),
    ]
    for r in rows:
        c = r["case"]
        ours = r["fastgrad"][0]
        lines.append(f"| {c['name']} | {c['shape']} | {str(c['dtype']).replace('torch.', '')} | "
                     + " | ".join(f"{r[l][0]:.4f}" for l in labels) + f" | {rate(c, ours)} | "
                     + " | ".join(f"{r[l][1] / 2**20:.1f}" for l in labels) + " | "
                     + " | ".join(f"{r[l][0] / ours:.2f}x" for l in labels[1:]) + " |")
    lines += ["", "![time](bench_time.png)", "", "![memory](bench_memory.png)", ""]
    lines += list(extra)
    with open(os.path.join(out, "benchmarks.md"), "w") as f:
        f.write("\n".join(lines))
    if not rows:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [f"{r['case']['name']}\n{r['case']['shape']}" for r in rows]
    for key, idx, ylabel, fname in [("time", 0, "time / torch eager time", "bench_time.png"),
                                    ("memory", 1, "peak extra memory (MiB)", "bench_memory.png")]:
        fig, ax = plt.subplots(figsize=(12, 5))
        width = 0.8 / len(labels)
        for j, l in enumerate(labels):
            vals = [(r[l][0] / r["torch eager"][0]) if idx == 0 else r[l][1] / 2**20 for r in rows]
            ax.bar([i + j * width for i in range(len(rows))], vals, width, label=l)
        ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(rows))])
        ax.set_xticklabels(names, fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(f"fastgrad vs PyTorch on {dev} ({date})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()

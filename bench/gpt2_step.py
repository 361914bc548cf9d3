"""Issue 26's benchmark: one GPT-2-small training step, plain PyTorch beside fastgrad's modules.

The model (one config, two builds loading the same weights):
  GPT-2 small: 12 layers, d 768, 12 heads, d_ff 3072, vocab 50257, context 1024, learned
  position embeddings, pre-norm LayerNorm (eps 1e-5), GELU-tanh, no dropout, biases on every
  linear, the LM head TIED to the token embedding (as GPT-2; --untied gives it its own weight,
  no bias). Init as GPT-2: N(0, 0.02), the residual projections N(0, 0.02/sqrt(2·layers)), zero
  biases, LayerNorm 1/0. Weight decay applies to every parameter in both optimizers.
  (a) "torch": nn.Embedding, nn.LayerNorm, nn.Linear, F.scaled_dot_product_attention(causal),
      F.gelu(approximate="tanh"), F.linear + F.cross_entropy for the head, on the bf16 logits
      (the cheapest for torch; its loss is then rounded to bf16, an ulp of 0.0625 near ln 50257,
      which bounds how closely the loss columns can agree; --torch-ce-f32 upcasts the logits
      first, as autocast does).
  (b) "fastgrad": nn.Embedding; fg.LayerNorm with its fused residual add (ln(x, residual=r)
      returns (norm(x + r), x + r), so each residual add rides in the next LayerNorm); fg.Linear
      for qkv / attention proj / FFN down-projection; fg.LinearAct(gelu_tanh) for the FFN
      up-projection + GELU; fg.linear_cross_entropy for the LM head + loss (no logits held);
      attention either fg.attention (causal) or SDPA -- both are measured, rows say which.

What one run measures (--device cuda: bf16, CUDA events, warm-up then the median;
--device cpu: f32 by default and time.perf_counter, no peak memory -- the output says so):
  1. one training step (zero_grad, forward, backward, optimizer step) for
       torch eager + torch.optim.AdamW(fused=True)
       torch.compile(model) + torch.optim.AdamW(fused=True)
       fastgrad model eager + fg.AdamW(moment_dtype="param")       (x2: fg.attention, SDPA)
       torch.compile(fastgrad model) + fg.AdamW(moment_dtype="param") (x2)
     each with its peak memory (torch.cuda.max_memory_allocated after a reset, the model,
     its gradients, optimizer state and activations: each row builds its own model and frees
     it after) and the losses of its first steps (same init, same batches) side by side;
  2. host cost per call: N calls of forward + backward through autograd of a Linear 64->64 on
     x [8, 64] (nn.Linear vs fg.Linear), time.perf_counter around the loop with a synchronize
     at the end; on the device's tensors and on CPU tensors; fg.Linear through the torch C++
     extension when it is built, and also through its Python autograd.Function (same run);
  3. fg.AdamW(moment_dtype="param") vs torch.optim.AdamW(fused=True) on the model's parameter
     set (bf16 on CUDA: both keep bf16 moments);
  4. torch._dynamo.explain(fastgrad model)(inputs): graphs and graph breaks;
and prints a markdown table of the ratios against the issue's acceptance figures. A row that
fails (compile error, OOM, ...) is reported as failed and the others still run.

    PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so python3 bench/gpt2_step.py --out /tmp/gpt2.md
    PYTHONPATH=python FASTGRAD_LIBRARY=build/libfastgrad.so python3 bench/gpt2_step.py --device cpu --small --quick
"""
import argparse
import datetime
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, replace

import torch
import torch._inductor.config  # (the header reports its size_asserts)
import torch.nn as nn
import torch.nn.functional as F

import fastgrad as fg


# ------------------------------------------------------------------ config and the two builds

@dataclass
class Config:
    n_layer: int = 12
    d: int = 768
    n_head: int = 12
    d_ff: int = 3072
    vocab: int = 50257
    context: int = 1024
    batch: int = 8
    seq: int = 1024
    tied: bool = True
    ce_f32: bool = False  # torch build: cross-entropy of f32 logits (as under autocast) instead of bf16 ones


SMALL = Config(n_layer=2, d=128, n_head=4, d_ff=512, vocab=1000, context=128, batch=2, seq=128)


class TorchBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c.n_head
        self.ln1 = nn.LayerNorm(c.d)
        self.qkv = nn.Linear(c.d, 3 * c.d)
        self.proj = nn.Linear(c.d, c.d)
        self.ln2 = nn.LayerNorm(c.d)
        self.fc = nn.Linear(c.d, c.d_ff)
        self.fc_proj = nn.Linear(c.d_ff, c.d)

    def forward(self, x):
        B, T, D = x.shape
        H = self.n_head
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, H, D // H)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class FgBlock(nn.Module):
    """The same block on fastgrad's modules; the residual adds are fused into the LayerNorms:
    forward(x, r) takes the stream before its pending add r (the previous block's FFN output)
    and returns (stream, pending FFN output)."""

    def __init__(self, c, attn):
        super().__init__()
        self.n_head, self.attn = c.n_head, attn
        self.ln1 = fg.LayerNorm(c.d)
        self.qkv = fg.Linear(c.d, 3 * c.d)
        self.proj = fg.Linear(c.d, c.d)
        self.ln2 = fg.LayerNorm(c.d)
        self.fc = fg.LinearAct(c.d, c.d_ff, act="gelu_tanh")
        self.fc_proj = fg.Linear(c.d_ff, c.d)

    def forward(self, x, r):
        B, T, D = x.shape
        H = self.n_head
        if r is None:
            h = self.ln1(x)
        else:
            h, x = self.ln1(x, residual=r)
        qkv = self.qkv(h).view(B, T, 3, H, D // H)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        if self.attn == "fg":
            a = fg.attention(q, k, v, causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h, x = self.ln2(x, residual=self.proj(a.transpose(1, 2).reshape(B, T, D)))
        return x, self.fc_proj(self.fc(h))


class GPT2(nn.Module):
    """build "torch" or "fastgrad" (attn "fg" or "sdpa"); forward(idx, targets) -> mean loss."""

    def __init__(self, c, build="torch", attn="sdpa"):
        super().__init__()
        self.c, self.build = c, build
        self.wte = nn.Embedding(c.vocab, c.d)
        self.wpe = nn.Embedding(c.context, c.d)
        if build == "torch":
            self.blocks = nn.ModuleList(TorchBlock(c) for _ in range(c.n_layer))
            self.ln_f = nn.LayerNorm(c.d)
        else:
            self.blocks = nn.ModuleList(FgBlock(c, attn) for _ in range(c.n_layer))
            self.ln_f = fg.LayerNorm(c.d)
        self.lm_head = None if c.tied else nn.Parameter(torch.empty(c.vocab, c.d))

    def gpt2_init(self):
        std_res = 0.02 / math.sqrt(2 * self.c.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_"):
                nn.init.ones_(p)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, std_res)
            else:
                nn.init.normal_(p, 0.0, 0.02)
        return self

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        head = self.wte.weight if self.lm_head is None else self.lm_head
        if self.build == "torch":
            for blk in self.blocks:
                x = blk(x)
            logits = F.linear(self.ln_f(x), head)
            if self.c.ce_f32:
                logits = logits.float()
            return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        r = None
        for blk in self.blocks:
            x, r = blk(x, r)
        h = self.ln_f(x) if r is None else self.ln_f(x, residual=r)[0]
        return fg.linear_cross_entropy(h.reshape(B * T, -1), head, targets.reshape(B * T))


# ------------------------------------------------------------------ timing helpers

class Clock:
    """CUDA events on a CUDA device, else time.perf_counter (with no device to wait for)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def median_ms(self, fn, reps, warmup=2, host=None):
        """The median time of fn (device time between CUDA events, or wall time on the CPU); with
        host a list, also appends the median host time of the call (CUDA: enqueueing it)."""
        for _ in range(warmup):
            fn()
        self.sync()
        if self.cuda:
            evs, hs = [], []
            for _ in range(reps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                t0 = time.perf_counter()
                fn()
                hs.append((time.perf_counter() - t0) * 1e3)
                e.record()
                evs.append((s, e))
            torch.cuda.synchronize()
            if host is not None:
                host.append(statistics.median(hs))
            return statistics.median(s.elapsed_time(e) for s, e in evs)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        if host is not None:
            host.append(statistics.median(ts))
        return statistics.median(ts)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device):
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def free(device):
    import gc
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def short_error(e):
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    return (msg[0] if msg else type(e).__name__)[:160]


def torch_adamw(params, lr, wd):
    """torch.optim.AdamW(fused=True), or foreach where this torch / device has no fused one."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd, fused=True), "fused"
    except (RuntimeError, ValueError) as e:
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd, foreach=True), f"foreach (fused refused: {e})"


# ------------------------------------------------------------------ 1. the training step

ROWS = [  # (key, label, build, attn, compiled, optimizer)
    ("torch_eager", "torch eager + AdamW(fused)", "torch", "sdpa", False, "torch"),
    ("torch_compile", "torch.compile + AdamW(fused)", "torch", "sdpa", True, "torch"),
    ("fg_eager", "fastgrad eager (fg.attention) + fg.AdamW", "fastgrad", "fg", False, "fg"),
    ("fg_eager_sdpa", "fastgrad eager (SDPA) + fg.AdamW", "fastgrad", "sdpa", False, "fg"),
    ("fg_compile", "torch.compile(fastgrad, fg.attention) + fg.AdamW", "fastgrad", "fg", True, "fg"),
    ("fg_compile_sdpa", "torch.compile(fastgrad, SDPA) + fg.AdamW", "fastgrad", "sdpa", True, "fg"),
]


def make_batches(c, n, device, seed=1234):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tok = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g)
        out.append((tok[:, :-1].contiguous().to(device), tok[:, 1:].contiguous().to(device)))
    return out


def build_model(c, state, build, attn, device, dtype):
    m = GPT2(c, build, attn)
    m.load_state_dict(state, strict=True)
    return m.to(device=device, dtype=dtype).train()


def run_step_row(row, c, state, batches, args, device, dtype, clock):
    key, label, build, attn, compiled, optname = row
    lr, wd = 6e-4, 0.1
    model = build_model(c, state, build, attn, device, dtype)
    note = ""
    if optname == "torch":
        opt, kind = torch_adamw(model.parameters(), lr, wd)
        if kind != "fused":
            note = "torch AdamW " + kind.split(" (")[0]
    else:
        opt = fg.AdamW(model.parameters(), lr=lr, weight_decay=wd, moment_dtype="param")
    fwd = torch.compile(model) if compiled else model
    i = [0]

    def step():
        x, y = batches[i[0] % len(batches)]
        i[0] += 1
        opt.zero_grad(set_to_none=True)
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    losses = [step().detach() for _ in range(args.loss_steps)]  # same batches, same order in every row
    clock.sync()
    first_s = time.perf_counter() - t0
    losses = [float(v) for v in torch.stack(losses).float().cpu()]
    i[0] = 0
    reset_peak(device)
    host = []
    ms = clock.median_ms(step, args.reps, warmup=args.warmup, host=host)
    res = dict(key=key, label=label, ms=ms, host_ms=host[0], peak=peak_mib(device), losses=losses, first_s=first_s,
               note=note)
    del fwd, opt, model
    return res


def section_steps(c, args, device, dtype, clock, out):
    torch.manual_seed(0)
    ref = GPT2(c, "torch").gpt2_init()
    state = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    fgm = GPT2(c, "fastgrad")
    fgm.load_state_dict(state, strict=True)  # the two builds have the same parameters and names
    del ref, fgm
    nparams = sum(v.numel() for k, v in state.items())
    batches = make_batches(c, args.loss_steps, device)
    results = {}
    for row in ROWS:
        if row[0] not in args.rows:
            continue
        if row[4]:
            torch._dynamo.reset()
        t0 = time.perf_counter()
        try:
            results[row[0]] = run_step_row(row, c, state, batches, args, device, dtype, clock)
        except Exception as e:  # noqa: BLE001 - a failing row is reported, the rest still run
            results[row[0]] = dict(key=row[0], label=row[1], error=short_error(e))
            if args.verbose:
                traceback.print_exc()
        if row[4]:
            torch._dynamo.reset()  # drop the compiled graphs (and what they hold) before the next row
        free(device)
        r = results[row[0]]
        status = f"{r['ms']:.2f} ms" if "ms" in r else f"FAILED {r['error']}"
        print(f"  [{time.perf_counter() - t0:6.1f} s] {row[1]}: {status}", file=sys.stderr, flush=True)
    base = results.get("torch_eager", {}).get("ms")
    out.append(f"### Training step ({nparams / 1e6:.1f}M parameters, {c.batch} x {c.seq} tokens, "
               f"{str(dtype).replace('torch.', '')})\n")
    out.append("| build | step ms (median) | speed vs torch eager | host ms per step | peak MiB | first steps s | note |")
    out.append("|---|---:|---:|---:|---:|---:|---|")
    for key, r in results.items():
        if "error" in r:
            out.append(f"| {r['label']} | failed | | | | | {r['error']} |")
            continue
        sp = f"{base / r['ms']:.2f}x" if base else ""
        pk = f"{r['peak']:.0f}" if r["peak"] is not None else "n/a"
        out.append(f"| {r['label']} | {r['ms']:.2f} | {sp} | {r['host_ms']:.2f} | {pk} | {r['first_s']:.1f} | "
                   f"{r['note']} |")
    ok = [r for r in results.values() if "losses" in r]
    if ok:
        out.append("\nLosses of the first steps (same init, same batches; the first row of each is before "
                   "any update):\n")
        out.append("| step | " + " | ".join(r["key"] for r in ok) + " |")
        out.append("|---:|" + "---:|" * len(ok))
        for s in range(args.loss_steps):
            out.append(f"| {s + 1} | " + " | ".join(f"{r['losses'][s]:.4f}" for r in ok) + " |")
        if "torch_eager" in results and "losses" in results["torch_eager"]:
            ref_l = results["torch_eager"]["losses"]
            diffs = ", ".join(f"{r['key']} {max(abs(a - b) for a, b in zip(r['losses'], ref_l)):.2e}"
                              for r in ok if r["key"] != "torch_eager")
            out.append(f"\nmax |loss - torch eager's| over those steps: {diffs}")
            if dtype != torch.float32 and not c.ce_f32:
                out.append(f"(torch's losses are rounded to {str(dtype).replace('torch.', '')}, fastgrad's are f32: "
                           "agreement to within that rounding is expected; --torch-ce-f32 for f32 losses)")
    return results


# ------------------------------------------------------------------ 2. host cost per call

def host_cost_us(lin, x, gy, calls, sync):
    for _ in range(min(200, calls)):
        torch.autograd.backward(lin(x), gy)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        torch.autograd.backward(lin(x), gy)
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def section_host(args, device, out):
    from fastgrad import _torchext, autograd as fg_autograd
    devices = [device] if device.type == "cpu" else [device, torch.device("cpu")]
    res = {}
    ext = fg_autograd._ext_linear is not None
    out.append(f"\n### Host cost per call (Linear 64->64 on x [8, 64] f32, forward + backward through autograd, "
               f"{args.calls} calls, perf_counter around the loop, synchronize at the end)\n")
    out.append("fg.Linear: " + ("through the torch C++ extension (_torchext_ops); the last column runs its Python "
                                "autograd.Function instead (fg.autograd.use_torchext(False)), in the same rounds.\n"
                                if ext else f"its Python autograd.Function (the C++ extension: {_torchext.WHY_NOT}).\n"))
    out.append("| tensors | nn.Linear us/call | fg.Linear us/call | fg / nn | Python Function us/call | its / nn |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for dev in devices:
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        threads = torch.get_num_threads()
        if dev.type == "cpu":  # the dispatch cost, not the wake-up of torch's intra-op thread pool
            torch.set_num_threads(1)
        try:
            torch.manual_seed(0)
            a = nn.Linear(64, 64).to(dev)
            b = fg.Linear(64, 64).to(dev)
            b.load_state_dict(a.state_dict())
            x = torch.randn(8, 64, device=dev, requires_grad=True)
            gy = torch.randn(8, 64, device=dev)
            t_nn, t_fg, t_py = [], [], []
            for _ in range(3):  # interleaved rounds, the median of each
                t_nn.append(host_cost_us(a, x, gy, args.calls, sync))
                t_fg.append(host_cost_us(b, x, gy, args.calls, sync))
                if ext:
                    fg_autograd.use_torchext(False)
                    try:
                        t_py.append(host_cost_us(b, x, gy, args.calls, sync))
                    finally:
                        fg_autograd.use_torchext(True)
            t_nn, t_fg = statistics.median(t_nn), statistics.median(t_fg)
            res[dev.type] = (t_nn, t_fg)
            py = (f"{statistics.median(t_py):.1f} | {statistics.median(t_py) / t_nn:.2f}x" if t_py else "| ")
            out.append(f"| {dev.type} | {t_nn:.1f} | {t_fg:.1f} | {t_fg / t_nn:.2f}x | {py} |")
        except Exception as e:  # noqa: BLE001
            res[dev.type] = None
            out.append(f"| {dev.type} | failed | | {short_error(e)} | | |")
        finally:
            torch.set_num_threads(threads)
    out.append("\nCPU tensors with one intra-op thread (torch.set_num_threads(1)): on a busy host, waking torch's "
               "thread pool for an [8, 64] GEMM costs more than the dispatch being measured.")
    return res


# ------------------------------------------------------------------ 3. AdamW on the parameter set

def adamw_param_sets(shapes, device, dtype, sets=2, seed=1):
    """`sets` lists of parameters of these shapes, each with a gradient (random, small): what an
    optimizer step over the model's parameter set reads and writes, without the model."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def params():
        ps = [nn.Parameter(torch.randn(s, generator=g).mul_(0.02).to(device, dtype)) for s in shapes]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).mul_(0.01).to(device, dtype)
        return ps

    return [params() for _ in range(sets)]


def section_adamw(c, args, device, dtype, clock, out):
    torch.manual_seed(0)
    shapes = [p.shape for p in GPT2(c, "torch").parameters()]
    n = sum(math.prod(s) for s in shapes)
    out.append(f"\n### AdamW step on the model's parameter set ({n / 1e6:.1f}M, {len(shapes)} tensors, "
               f"{str(dtype).replace('torch.', '')}, moments in the parameters' dtype)\n")
    out.append("| optimizer | ms (median) | fg speed vs torch |")
    out.append("|---|---:|---:|")
    res = {}
    try:
        pt, pf = adamw_param_sets(shapes, device, dtype)
        ot, kind = torch_adamw(pt, 6e-4, 0.1)
        of = fg.AdamW(pf, lr=6e-4, weight_decay=0.1, moment_dtype="param")
        tt, tf = [], []
        for _ in range(3):  # interleaved rounds
            tt.append(clock.median_ms(ot.step, args.adam_reps, warmup=3))
            tf.append(clock.median_ms(of.step, args.adam_reps, warmup=3))
        tt, tf = statistics.median(tt), statistics.median(tf)
        res = dict(torch=tt, fg=tf, kind=kind)
        out.append(f"| torch.optim.AdamW({'fused=True' if kind == 'fused' else kind}) | {tt:.3f} | |")
        out.append(f"| fg.AdamW(moment_dtype=\"param\") | {tf:.3f} | {tt / tf:.2f}x |")
        del pt, pf, ot, of
    except Exception as e:  # noqa: BLE001
        out.append(f"| failed | | {short_error(e)} |")
    free(device)
    return res


# ------------------------------------------------------------------ 4. dynamo explain

def section_explain(c, args, device, dtype, out):
    out.append("\n### torch._dynamo.explain on the fastgrad model\n")
    out.append("| model | graphs | graph breaks | first break reasons |")
    out.append("|---|---:|---:|---|")
    res = {}
    cx = replace(c, batch=min(c.batch, 2))
    x, y = make_batches(cx, 1, device)[0]
    for attn in ("fg", "sdpa"):
        label = f"fastgrad ({'fg.attention' if attn == 'fg' else 'SDPA'})"
        try:
            torch._dynamo.reset()
            torch.manual_seed(0)
            m = GPT2(cx, "fastgrad", attn).gpt2_init().to(device, dtype)
            ex = torch._dynamo.explain(m)(x, y)
            reasons = "; ".join(str(getattr(b, "reason", b)).splitlines()[0][:100] for b in ex.break_reasons[:3])
            res[attn] = (ex.graph_count, ex.graph_break_count)
            out.append(f"| {label} | {ex.graph_count} | {ex.graph_break_count} | {reasons} |")
            del m, ex
        except Exception as e:  # noqa: BLE001
            res[attn] = None
            out.append(f"| {label} | failed | | {short_error(e)} |")
        free(device)
    torch._dynamo.reset()
    return res


# ------------------------------------------------------------------ the acceptance table

def targets_table(steps, host, adam, explain, device, out):
    out.append("\n### Against issue 26's acceptance figures\n")
    out.append("| criterion | measured | ratio | target | met |")
    out.append("|---|---|---:|---|---|")

    def ms(k):
        return steps.get(k, {}).get("ms")

    def row(name, measured, ratio, target, met):
        out.append(f"| {name} | {measured} | {ratio} | {target} | {met} |")

    def na(name, target, why):
        row(name, why, "", target, "n/a")

    yes = lambda b: "yes" if b else "NO"  # noqa: E731
    for suffix, what in (("", "fg.attention"), ("_sdpa", "SDPA")):
        for base, mine, name, need in (
                ("torch_eager", "fg_eager", f"fastgrad ({what}) eager speed vs torch eager", 1.15),
                ("torch_compile", "fg_compile", f"torch.compile(fastgrad, {what}) speed vs torch.compile", 1.05)):
            tb, tf = ms(base), ms(mine + suffix)
            if tb and tf:
                row(name, f"{tf:.2f} vs {tb:.2f} ms", f"{tb / tf:.2f}x", f">= {need:.2f}x", yes(tb / tf >= need))
            else:
                na(name, f">= {need:.2f}x", "a row failed or was skipped")
        pc = steps.get("torch_compile", {}).get("peak")
        for k, lab in (("fg_eager" + suffix, "eager"), ("fg_compile" + suffix, "compiled")):
            pf = steps.get(k, {}).get("peak")
            name = f"peak memory, fastgrad ({what}) {lab} vs torch.compile"
            if pc and pf:
                row(name, f"{pf:.0f} vs {pc:.0f} MiB", f"{pf / pc:.2f}x", "<= 1.00x", yes(pf <= pc))
            else:
                na(name, "<= torch.compile's", "no CUDA peak (CPU)" if device.type == "cpu" else "a row failed")
    for dev in ("cuda", "cpu"):
        h = host.get(dev)
        name = f"host cost per call, fg.Linear vs nn.Linear ({dev} tensors)"
        if h:
            row(name, f"{h[1]:.1f} vs {h[0]:.1f} us", f"{h[1] / h[0]:.2f}x", "<= 1.2x" + ("" if dev == "cuda"
                                                                                        else " (issue: CUDA)"),
                yes(h[1] / h[0] <= 1.2))
        elif dev in host:
            na(name, "<= 1.2x", "failed")
    if adam:
        row("fg.AdamW speed vs torch AdamW(" + ("fused" if adam["kind"] == "fused" else "foreach") + ")",
            f"{adam['fg']:.3f} vs {adam['torch']:.3f} ms", f"{adam['torch'] / adam['fg']:.2f}x", ">= 1.2x",
            yes(adam["torch"] / adam["fg"] >= 1.2))
    else:
        na("fg.AdamW speed vs torch AdamW(fused)", ">= 1.2x", "failed")
    for attn, what in (("fg", "fg.attention"), ("sdpa", "SDPA")):
        e = explain.get(attn)
        name = f"graph breaks, fastgrad model ({what})"
        if e:
            row(name, f"{e[0]} graph(s), {e[1]} break(s)", "", "0 breaks", yes(e[1] == 0))
        else:
            na(name, "0 breaks", "explain failed")
    out.append("\nThe CUDA-graph replay criterion is a test (python/tests), not part of this benchmark.")


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and calls")
    ap.add_argument("--small", action="store_true", help="a tiny config (2 layers, d 128, vocab 1000, ctx 128, "
                                                         "batch 2) for smoke runs")
    ap.add_argument("--out", help="also write the markdown to this file")
    ap.add_argument("--dtype", choices=["bf16", "f32"], help="default: bf16 on CUDA, f32 elsewhere")
    ap.add_argument("--untied", action="store_true", help="an LM head with its own weight (default: tied to wte)")
    ap.add_argument("--torch-ce-f32", action="store_true",
                    help="torch build: F.cross_entropy of logits.float() (default: of the bf16 logits)")
    ap.add_argument("--rows", default=",".join(r[0] for r in ROWS),
                    help="training-step rows to run (comma separated): " + ", ".join(r[0] for r in ROWS))
    ap.add_argument("--skip", default="", help="sections to skip, comma separated: steps,host,adamw,explain")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (CPU timings on a busy host: try 1)")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of failing rows")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: pass --device cpu (with --small for a smoke run)")
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype or ("bf16" if device.type == "cuda" else "f32")]
    c = replace(SMALL if args.small else Config(), tied=not args.untied, ce_f32=args.torch_ce_f32)
    args.rows = set(args.rows.split(","))
    skip = set(filter(None, args.skip.split(",")))
    args.reps, args.warmup, args.loss_steps = (5, 1, 4) if args.quick else (20, 3, 6)
    args.calls = 1000 if args.quick else 10_000
    args.adam_reps = 5 if args.quick else 20
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    out = ["## GPT-2-small training step: PyTorch vs fastgrad (issue 26)\n"]
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    out.append(f"{datetime.date.today()} · {dev_name} · torch {torch.__version__} · fastgrad {fg.__version__} · "
               f"config: {c.n_layer} layers, d {c.d}, {c.n_head} heads, d_ff {c.d_ff}, vocab {c.vocab}, "
               f"context {c.context}, batch {c.batch} x {c.seq}, LM head {'tied' if c.tied else 'untied'}, "
               f"torch's cross-entropy on {'f32' if c.ce_f32 else str(dtype).replace('torch.', '')} logits"
               f"{' (--small)' if args.small else ''}{' (--quick)' if args.quick else ''}, "
               f"{torch.get_num_threads()} CPU thread(s)"
               # (inductor checks each fallback op's outputs unless TORCHINDUCTOR_SIZE_ASSERTS=0: the compiled
               # fastgrad graph makes hundreds of these checks a step, torch's own graph few)
               f"{'' if torch._inductor.config.size_asserts else ', inductor size asserts off (every compiled row)'}\n")
    if device.type == "cuda":
        out.append(f"Timing: CUDA events, median of {args.reps} steps after {args.warmup} warm-up steps "
                   f"(besides the {args.loss_steps} loss steps, which include compilation); TF32 on for f32. "
                   "Host ms per step: perf_counter around the step's call (the time to enqueue it, when the "
                   "GPU's queue does not fill); first steps s: the loss steps, compilation included.\n")
    else:
        out.append(f"On the CPU: {str(dtype).replace('torch.', '')} (not bf16 unless --dtype bf16), "
                   f"time.perf_counter per step (no CUDA events), median of {args.reps} after {args.warmup} "
                   "warm-up steps; no peak memory (torch.cuda only); torch's AdamW is fused=True where this "
                   "torch has a CPU fused AdamW, else foreach (the row's note says). Figures here are a smoke "
                   "run, not issue 26's.\n")
    steps = host = adam = explain = {}
    if "steps" not in skip:
        steps = section_steps(c, args, device, dtype, Clock(device), out)
    if "host" not in skip:
        host = section_host(args, device, out)
    if "adamw" not in skip:
        adam = section_adamw(c, args, device, dtype, Clock(device), out)
    if "explain" not in skip:
        explain = section_explain(c, args, device, dtype, out)
    targets_table(steps, host, adam, explain, device, out)
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

"""Issue 27's multi-GPU checks: fastgrad's modules inside PyTorch DDP over NCCL, one process a GPU.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so \
        torchrun --nproc_per_node 2 bench/ddp_check.py --out /tmp/ddp.md

Every section runs on every rank; rank 0 also runs the single-GPU references (in a process group
of its own, so nothing it calls all-reduces) and writes the markdown table. Sections:
  syncbn   fg.sync_batch_norm on CUDA, unequal shards per rank (with the fused residual add)
           against fg.batch_norm and torch's batch_norm on the concatenated batch (f32 and bf16):
           y, the running statistics, dx, dr, dweight, dbias.
  vocab    fg.vocab_parallel_cross_entropy (each rank a slice of the vocabulary's weight) against
           fg.linear_cross_entropy with the whole weight: loss, dh, dw, db (bf16 and f32).
  gpt      the GPT-2-style model of bench/gpt2_step.py on fastgrad's modules (f32, a small config),
           DDP on 2 GPUs × batch B/2 against 1 GPU × batch B from the same weights and batches,
           fg.AdamW: the loss of every step.
  patchtst PatchTST on ETTh1 (RevIN, patching, the encoder with residual attention and BatchNorm
           post-norm, the flatten head, MSE) composed of fastgrad modules, its BatchNorms
           synchronized (fg.sync_batch_norm), dropout 0 (per-rank dropout streams cannot match one
           process's), DDP 2 × B/2 against 1 × B: the loss of every step.
  scaling  GPT-2 small (bf16, batch 8 × 1024 tokens a GPU): the training step on 1 GPU and under
           DDP on 2 GPUs at the same per-GPU batch, fastgrad's modules and plain torch;
           efficiency = t(1 GPU) / t(2 GPUs) (weak scaling: twice the tokens in the same time = 100%).
The loss comparisons are not bitwise: DDP averages two half-batch gradients where one GPU sums
the whole batch in one product, so f32 rounding differs from the first step; the table gives the
largest relative difference over the steps and the tolerance it is held to.
"""
import argparse
import datetime
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import fastgrad as fg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2_step  # noqa: E402  (the GPT-2 model of issue 26's benchmark)
import patchtst_torch  # noqa: E402  (ETTh1's loader and split)

rank = world = 0
dev = None
SOLO = None       # a process group holding rank 0 alone: the single-GPU references run in it
rows = []         # (section, what, measured, bound, ok)


def log(msg):
    if rank == 0:
        print(msg, flush=True)


def record(section, what, measured, bound, ok):
    rows.append((section, what, measured, bound, ok))
    log(f"  [{section}] {what}: {measured} (bound {bound}) {'ok' if ok else 'FAILED'}")


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def shards(n_total, parts):
    """Unequal split of n_total rows: rank r gets a share growing with r."""
    w = np.arange(1, parts + 1, dtype=np.float64)
    cuts = np.round(np.cumsum(w) / w.sum() * n_total).astype(int)
    return [0] + list(cuts)


# ------------------------------------------------------------------ syncbn

def section_syncbn():
    for dtype, tol in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2)):
        C, N = 96, 4000
        g = torch.Generator().manual_seed(7)
        x = (torch.randn(N, 7, C, generator=g) * 3 + 1).to(dtype)
        r = torch.randn(N, 7, C, generator=g).to(dtype)
        dy = torch.randn(N, 7, C, generator=g).to(dtype)
        w = (torch.rand(C, generator=g) + 0.5)
        b = torch.randn(C, generator=g)
        cut = shards(N, world)
        lo, hi = cut[rank], cut[rank + 1]

        def run(xs, rs, dys, group):
            xs = xs.to(dev).requires_grad_()
            rs = rs.to(dev).requires_grad_()
            ww = w.to(dev).requires_grad_()
            bb = b.to(dev).requires_grad_()
            rm, rv = torch.zeros(C, device=dev), torch.ones(C, device=dev)
            y, s = fg.sync_batch_norm(xs, rm, rv, ww, bb, True, 0.1, 1e-5, r=rs, p=0.0, process_group=group)
            (y.float() * dys.to(dev).float()).sum().backward()
            return y, rm, rv, xs.grad, rs.grad, ww.grad, bb.grad

        y, rm, rv, dx, dr, dw, db = run(x[lo:hi], r[lo:hi], dy[lo:hi], None)
        # the rank's y / dx / dr rows, the running stats, and the weight gradients summed over ranks
        parts = [torch.cat([t.float().reshape(-1) for t in (y, dx, dr)])]
        gathered = [None] * world
        dist.all_gather_object(gathered, [t.cpu() for t in parts])
        dist.all_reduce(dw)
        dist.all_reduce(db)
        if rank == 0:
            yr, rmr, rvr, dxr, drr, dwr, dbr = run(x, r, dy, SOLO)
            ref = [yr, dxr, drr]
            got = [[], [], []]
            for k in range(world):
                n = (cut[k + 1] - cut[k]) * 7 * C
                flat = gathered[k][0]
                for i in range(3):
                    got[i].append(flat[i * n:(i + 1) * n])
            name = str(dtype).split(".")[-1]
            for i, what in enumerate(("y", "dx", "dr")):
                e = rel_err(torch.cat(got[i]), ref[i].float().reshape(-1).cpu())
                record("syncbn", f"{name} {what} vs fg.batch_norm on the whole batch", f"{e:.2e}", tol, e <= tol)
            for what, a, bref in (("running_mean", rm, rmr), ("running_var", rv, rvr), ("dweight", dw, dwr),
                                  ("dbias", db, dbr)):
                e = rel_err(a, bref)
                record("syncbn", f"{name} {what}", f"{e:.2e}", tol, e <= tol)
            # torch's own batch norm on the whole batch, f64 (the library's reference elsewhere)
            xt = (x.double() + r.double()).to(dev)
            yt = F.batch_norm(xt.reshape(-1, C), None, None, w.double().to(dev), b.double().to(dev), True, 0.1, 1e-5)
            e = rel_err(torch.cat(got[0]), yt.reshape(-1).float().cpu())
            record("syncbn", f"{name} y vs torch batch_norm (f64) on the whole batch", f"{e:.2e}", tol, e <= tol)
        dist.barrier()


# ------------------------------------------------------------------ vocab-parallel cross-entropy

def section_vocab():
    if not hasattr(fg, "vocab_parallel_cross_entropy"):
        record("vocab", "fg.vocab_parallel_cross_entropy", "not built", "-", False)
        return
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        N, D, V = 2048, 768, 50257
        g = torch.Generator().manual_seed(11)
        h = (torch.randn(N, D, generator=g) * 0.5).to(dtype)
        w = (torch.randn(V, D, generator=g) * 0.05).to(dtype)
        b = (torch.randn(V, generator=g) * 0.1).to(dtype)
        t = torch.randint(0, V, (N,), generator=g)
        t[::97] = -100
        cut = shards(V, world)
        lo, hi = cut[rank], cut[rank + 1]

        hs = h.to(dev).requires_grad_()
        ws = w[lo:hi].to(dev).requires_grad_()
        bs = b[lo:hi].to(dev).requires_grad_()
        loss = fg.vocab_parallel_cross_entropy(hs, ws, bs, t.to(dev), lo, V, ignore_index=-100, z_loss=1e-4)
        loss.backward()
        dist.all_reduce(hs.grad)   # the data-parallel reduction of the replicated h's gradient is the caller's:
        hs.grad /= world           # every rank computed the same loss over the same rows
        got_w = [None] * world
        dist.all_gather_object(got_w, (ws.grad.float().cpu(), bs.grad.float().cpu()))
        if rank == 0:
            hr = h.to(dev).requires_grad_()
            wr = w.to(dev).requires_grad_()
            br = b.to(dev).requires_grad_()
            lr_ = fg.linear_cross_entropy(hr, wr, t.to(dev), br, ignore_index=-100, z_loss=1e-4)
            lr_.backward()
            name = str(dtype).split(".")[-1]
            e = abs(float(loss) - float(lr_)) / abs(float(lr_))
            record("vocab", f"{name} loss vs fg.linear_cross_entropy (V {V}, {world} slices)", f"{e:.2e}", tol, e <= tol)
            e = rel_err(hs.grad.float(), hr.grad.float())
            record("vocab", f"{name} dh", f"{e:.2e}", tol, e <= tol)
            e = rel_err(torch.cat([a for a, _ in got_w]), wr.grad.float().cpu())
            record("vocab", f"{name} dw (slices concatenated)", f"{e:.2e}", tol, e <= tol)
            e = rel_err(torch.cat([c for _, c in got_w]), br.grad.float().cpu())
            record("vocab", f"{name} db", f"{e:.2e}", tol, e <= tol)
        dist.barrier()


# ------------------------------------------------------------------ loss curves: DDP vs one GPU

def curve(model, opt, batches, loss_fn):
    out = []
    for xb, yb in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, xb, yb)
        loss.backward()
        opt.step()
        lv = loss.detach().clone()
        out.append(lv)
    return torch.stack(out).float()


def ddp_vs_one(section, make_model, batches, loss_fn, lr, tol, steps_note):
    """batches: global (x, y) pairs on the CPU; each rank trains on its share under DDP.
    make_model(group): the model whose collectives (if any) use group; the DDP one gets None
    (the default group), the single-GPU reference SOLO."""
    torch.manual_seed(1)
    model = make_model(None).to(dev)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    dmodel = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, broadcast_buffers=False)
    opt = fg.AdamW(dmodel.parameters(), lr=lr, weight_decay=0.01)
    B = batches[0][0].shape[0]
    cut = [B * k // world for k in range(world + 1)]
    mine = [(x[cut[rank]:cut[rank + 1]].to(dev), y[cut[rank]:cut[rank + 1]].to(dev)) for x, y in batches]
    losses = curve(dmodel, opt, mine, loss_fn)
    dist.all_reduce(losses)
    losses /= world
    if rank == 0:
        ref = make_model(SOLO).to(dev)
        ref.load_state_dict(state)
        opt1 = fg.AdamW(ref.parameters(), lr=lr, weight_decay=0.01)
        one = curve(ref, opt1, [(x.to(dev), y.to(dev)) for x, y in batches], loss_fn)
        e = float(((losses - one).abs() / one.abs()).max())
        first = float(one[0]), float(one[-1])
        record(section, f"DDP 2×{B // world} vs 1×{B}: {len(batches)} steps ({steps_note}), loss {first[0]:.4f} → "
               f"{first[1]:.4f}, largest relative difference", f"{e:.2e}", tol, e <= tol)
    dist.barrier()


def section_gpt():
    c = gpt2_step.Config(n_layer=4, d=256, n_head=4, d_ff=1024, vocab=4096, context=256, batch=8, seq=256)
    g = torch.Generator().manual_seed(5)
    batches = []
    for _ in range(12):
        idx = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g)
        batches.append((idx[:, :-1].contiguous(), idx[:, 1:].contiguous()))

    def make(group):
        return gpt2_step.GPT2(c, build="fastgrad", attn="fg").gpt2_init()

    ddp_vs_one("gpt", make, batches, lambda m, x, y: m(x, y), 1e-3, 1e-4, "f32, fg.attention, fg.AdamW")


class FgPatchTST(nn.Module):
    """PatchTST (the reference configuration's structure) on fastgrad's modules, BatchNorm synchronized."""

    def __init__(self, c, L, H, d=16, heads=4, layers=3, d_ff=128, patch=16, stride=8, group=None):
        super().__init__()
        self.c, self.patch, self.stride, self.heads, self.group = c, patch, stride, heads, group
        self.P = (L + stride - patch) // stride + 1
        self.revin = fg.RevIN(c)
        self.embed = fg.Linear(patch, d)
        self.pos = nn.Parameter(torch.empty(self.P, d).uniform_(-0.02, 0.02))
        self.qkv = nn.ModuleList(fg.Linear(d, 3 * d) for _ in range(layers))
        self.out = nn.ModuleList(fg.Linear(d, d) for _ in range(layers))
        self.bn1 = nn.ModuleList(fg.SyncBatchNorm(d) for _ in range(layers))
        self.ff1 = nn.ModuleList(fg.LinearAct(d, d_ff, act="gelu") for _ in range(layers))
        self.ff2 = nn.ModuleList(fg.Linear(d_ff, d) for _ in range(layers))
        self.bn2 = nn.ModuleList(fg.SyncBatchNorm(d) for _ in range(layers))
        self.head = fg.Linear(d * self.P, H)

    def _bn(self, bn, x, r):
        y, _ = fg.sync_batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, self.training, bn.momentum,
                                  bn.eps, r=r, p=0.0, process_group=self.group)
        return y

    def forward(self, x):  # [B, L, C] → [B, H, C]
        B = x.shape[0]
        z = self.revin(x, "norm").permute(0, 2, 1)
        z = F.pad(z, (0, self.stride), mode="replicate").unfold(-1, self.patch, self.stride)  # [B, C, P, S]
        u = self.embed(z.reshape(B * self.c, self.P, self.patch)) + self.pos      # [B·C, P, d]
        n, P, d = u.shape
        hd = d // self.heads
        scores = None
        for i in range(len(self.qkv)):
            qkv = self.qkv[i](u).view(n, P, 3, self.heads, hd)
            q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
            a, scores = fg.attention(q, k, v, scores_in=scores, return_scores=True, scores_dtype=torch.float32)
            u = self._bn(self.bn1[i], u, self.out[i](a.transpose(1, 2).reshape(n, P, d)))
            u = self._bn(self.bn2[i], u, self.ff2[i](self.ff1[i](u)))
        u = u.reshape(B, self.c, P, d).permute(0, 1, 3, 2).reshape(B, self.c, d * P)
        return self.revin(self.head(u).permute(0, 2, 1).contiguous(), "denorm")


def section_patchtst():
    names, data = patchtst_torch.load_csv(os.path.join(HERE, "..", "data", "ETTh1.csv"))
    L, H, B = 336, 96, 128
    (tr0, tr1), _, _ = patchtst_torch.borders(len(data), L, "ett")
    mu, sd = data[tr0:tr1].mean(0), data[tr0:tr1].std(0)
    z = ((data - mu) / sd).astype(np.float32)
    win = patchtst_torch.Windows(z, tr0, tr1, L, H)
    rng = np.random.default_rng(3)
    batches = [win.batch(rng.choice(win.n, B, replace=False)) for _ in range(10)]

    def make(group):
        return FgPatchTST(z.shape[1], L, H, group=group)

    def loss_fn(m, x, y):
        return F.mse_loss(m(x), y)

    ddp_vs_one("patchtst", make, batches, loss_fn, 1e-4, 1e-4, "f32, ETTh1 L 336 → 96, SyncBatchNorm, fg.AdamW")


# ------------------------------------------------------------------ scaling

def step_ms(model, opt, batches, reps, warm=3):
    def one(b):
        opt.zero_grad(set_to_none=True)
        model(*b).backward()
        opt.step()

    for i in range(warm):
        one(batches[i % len(batches)])
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        one(batches[i % len(batches)])
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return float(np.median(ts))


def section_scaling(reps):
    c = gpt2_step.Config()
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(9)
    batches = []
    for _ in range(4):
        idx = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g)
        batches.append((idx[:, :-1].contiguous().to(dev), idx[:, 1:].contiguous().to(dev)))
    for build, attn in (("fastgrad", "fg"), ("torch", "sdpa")):
        torch.manual_seed(1)

        def make():
            return gpt2_step.GPT2(c, build=build, attn=attn).gpt2_init().to(dev, dtype)

        def optim(params):
            if build == "fastgrad":
                return fg.AdamW(params, lr=1e-4, weight_decay=0.01, moment_dtype="param")
            return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)

        t1 = None
        if rank == 0:
            m = make()
            t1 = step_ms(m, optim(m.parameters()), batches, reps)
            del m
            torch.cuda.empty_cache()
        dist.barrier()
        m = DDP(make(), device_ids=[dev.index], broadcast_buffers=False, gradient_as_bucket_view=True)
        t2 = torch.tensor([step_ms(m, optim(m.parameters()), batches, reps)], device=dev)
        dist.all_reduce(t2, op=dist.ReduceOp.MAX)
        del m
        torch.cuda.empty_cache()
        if rank == 0:
            eff = t1 / float(t2)
            record("scaling", f"GPT-2 small bf16 {build} step: 1 GPU {t1:.2f} ms, DDP {world} GPUs {float(t2):.2f} ms "
                   f"(batch {c.batch}×{c.seq} a GPU), efficiency", f"{100 * eff:.1f}%", "≥ 90%", eff >= 0.90)
        dist.barrier()


def main():
    global rank, world, dev, SOLO
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--sections", default="syncbn,vocab,gpt,patchtst,scaling")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()  # without a GPU (a smoke test of the script): gloo on the CPU
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=240))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    SOLO = dist.new_group([0])
    log(f"{world} ranks, {torch.cuda.get_device_name(dev) if cuda else 'CPU (gloo)'}, torch {torch.__version__}, "
        f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if cuda else '-'}, NCCL_ALGO={os.environ.get('NCCL_ALGO', '-')} "
        f"NCCL_PROTO={os.environ.get('NCCL_PROTO', '-')} NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', '-')}")
    sections = {"syncbn": section_syncbn, "vocab": section_vocab, "gpt": section_gpt, "patchtst": section_patchtst,
                "scaling": lambda: section_scaling(args.reps)}
    for name in args.sections.split(","):
        t0 = time.time()
        try:
            sections[name]()
        except Exception as e:  # report and go on: the other sections still run
            record(name, "section", f"raised {type(e).__name__}: {str(e)[:200]}", "-", False)
        log(f"  [{name}] {time.time() - t0:.1f} s")
    if rank == 0:
        lines = ["| section | check | measured | bound | |", "|---|---|---:|---|---|"]
        lines += [f"| {s} | {w} | {m} | {b} | {'ok' if ok else '**FAILED**'} |" for s, w, m, b, ok in rows]
        text = "\n".join(lines)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
    failed = any(not ok for *_, ok in rows)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed and rank == 0 else 0)


if __name__ == "__main__":
    main()

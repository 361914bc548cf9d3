#!/usr/bin/env python3
"""patchtst_torch.py — the PyTorch reference of what fastgrad-train trains: PatchTST/42 on an
ETT-shaped CSV with the same split, standardization, windows, model, loss, optimizer and
schedule, so the two can be compared side by side (test MSE / MAE and seconds per epoch, in
one run on one machine). The model follows the official PatchTST supervised code
(yuqinie98/PatchTST, PatchTST_backbone.py) layer for layer:

  RevIN (affine; mean and biased std over time, eps 1e-5; undone on the output with
  (y − b)/(w + eps²)·std + mean) → per series: ReplicationPad1d((0, stride)) + unfold(16, 8)
  → 42 patches → Linear(16, d_model) + a learned position table U(−0.02, 0.02) → dropout →
  layers of [multi-head attention with separate Q/K/V projections (bias), scale hd^-0.5,
  residual scores (scores_l = q·kᵀ·scale + scores_(l−1)), output projection + dropout, then the
  layer's dropout, residual add, BatchNorm1d over every token (post-norm); FFN Linear(d, d_ff)
  → GELU → dropout → Linear(d_ff, d) → dropout, residual add, BatchNorm1d] → flatten the
  [d_model, 42] of each series → Linear(d_model·42, horizon) → RevIN undone.
  MSE loss, Adam (lr 1e-4, no weight decay), 'type3' schedule as the official
  adjust_learning_rate(epoch + 1) applies it after each epoch: lr(e + 1) = lr for e < 3, else
  lr·0.9^(e − 3) — the base rate for epochs 1..4, then ×0.9 per epoch. Best-validation
  weights kept (early stopping with --patience); the test metrics over every test window and
  over the drop-last batches the official test loader keeps.

    python3 bench/patchtst_torch.py --data data/ETTh1.csv --horizon 96 --device cuda
    python3 bench/patchtst_torch.py --epochs 2 --threads 2          # CPU: seconds per epoch

Differences from the official script, on purpose: validation MSE over every validation window
in order (the official loader shuffles and drops the last batch, so its validation loss is over
a random subset); no time features (PatchTST ignores them).
"""
import argparse
import csv
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PUBLISHED = {96: (0.375, 0.399), 192: (0.414, 0.421), 336: (0.431, 0.436), 720: (0.449, 0.466)}


# ------------------------------------------------------------------ data

def load_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], [r for r in rows[1:] if r]
    if header[0].strip().lower() != "date":
        sys.exit(f"{path}:1:1: the header's first column is '{header[0]}'; expected 'date'")
    return header[1:], np.array([[float(v) for v in r[1:]] for r in body], dtype=np.float64)


def borders(n, L, split):
    if split == "ett":  # 12 / 4 / 4 months of hourly rows
        tr, va, te = 12 * 30 * 24, 4 * 30 * 24, 4 * 30 * 24
        if n < tr + va + te:
            sys.exit(f"{n} rows, but the ETT split needs {tr + va + te}")
        return [(0, tr), (tr - L, tr + va), (tr + va - L, tr + va + te)]
    f = [float(x) for x in split.split(",")]
    tr, te = int(n * f[0]), int(n * f[2])
    return [(0, tr), (tr - L, n - te), (n - te - L, n)]


class Windows:
    """The windows of one split: x [L, C], y [H, C] (standardized, f32)."""

    def __init__(self, z, lo, hi, L, H):
        self.z, self.lo, self.L, self.H = z, lo, L, H
        self.n = hi - lo - L - H + 1

    def batch(self, idx):
        s = self.lo + np.asarray(idx)[:, None]
        x = self.z[s + np.arange(self.L)[None, :]]
        y = self.z[s + self.L + np.arange(self.H)[None, :]]
        return torch.from_numpy(x), torch.from_numpy(y)


# ------------------------------------------------------------------ model

class RevIN(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(c))
        self.b = nn.Parameter(torch.zeros(c))

    def norm(self, x):  # x [B, L, C]
        self.mean = x.mean(dim=1, keepdim=True).detach()
        self.std = torch.sqrt(x.var(dim=1, keepdim=True, unbiased=False) + self.eps).detach()
        return (x - self.mean) / self.std * self.w + self.b

    def denorm(self, y):
        return (y - self.b) / (self.w + self.eps * self.eps) * self.std + self.mean


class Attention(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)  # the official to_out's Dropout(proj_dropout = dropout)
        self.scale = self.hd ** -0.5

    def forward(self, x, prev):
        n, L, d = x.shape
        q = self.q(x).view(n, L, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(n, L, self.h, self.hd).permute(0, 2, 3, 1)
        v = self.v(x).view(n, L, self.h, self.hd).transpose(1, 2)
        scores = torch.matmul(q, k) * self.scale
        if prev is not None:
            scores = scores + prev
        o = torch.matmul(F.softmax(scores, dim=-1), v)  # attention dropout 0 (the reference's)
        o = o.transpose(1, 2).reshape(n, L, d)
        return self.drop(self.out(o)), scores


class BatchNormTokens(nn.Module):
    """BatchNorm1d over every token: [n, L, d] → transposed to [n, d, L] and back."""

    def __init__(self, d):
        super().__init__()
        self.bn = nn.BatchNorm1d(d)

    def forward(self, x):
        return self.bn(x.transpose(1, 2)).transpose(1, 2)


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, d_ff, dropout):
        super().__init__()
        self.attn = Attention(d, heads, dropout)
        self.drop_attn = nn.Dropout(dropout)
        self.norm_attn = BatchNormTokens(d)
        self.ff = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d))
        self.drop_ffn = nn.Dropout(dropout)
        self.norm_ffn = BatchNormTokens(d)

    def forward(self, x, prev):
        a, scores = self.attn(x, prev)
        x = self.norm_attn(x + self.drop_attn(a))
        x = self.norm_ffn(x + self.drop_ffn(self.ff(x)))
        return x, scores


class PatchTST(nn.Module):
    def __init__(self, c, L, H, d, heads, layers, d_ff, dropout, patch_len=16, stride=8):
        super().__init__()
        self.c, self.patch_len, self.stride = c, patch_len, stride
        self.P = (L + stride - patch_len) // stride + 1
        self.revin = RevIN(c)
        self.embed = nn.Linear(patch_len, d)
        self.pos = nn.Parameter(torch.empty(self.P, d).uniform_(-0.02, 0.02))
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList([EncoderLayer(d, heads, d_ff, dropout) for _ in range(layers)])
        self.head = nn.Linear(d * self.P, H)

    def forward(self, x):  # [B, L, C] → [B, H, C]
        B = x.shape[0]
        z = self.revin.norm(x).permute(0, 2, 1)  # [B, C, L]
        z = F.pad(z, (0, self.stride), mode="replicate").unfold(-1, self.patch_len, self.stride)  # [B, C, P, S]
        u = self.drop(self.embed(z).reshape(B * self.c, self.P, -1) + self.pos)
        scores = None
        for layer in self.layers:
            u, scores = layer(u, scores)
        u = u.reshape(B, self.c, self.P, -1).permute(0, 1, 3, 2).reshape(B, self.c, -1)  # [d, P] flattened
        return self.revin.denorm(self.head(u).permute(0, 2, 1))


# ------------------------------------------------------------------ training

def evaluate(model, win, batch, device, drop_last=False):
    model.eval()
    se = ae = 0.0
    count = 0
    n = (win.n // batch) * batch if drop_last else win.n
    with torch.no_grad():
        for s in range(0, n, batch):
            x, y = win.batch(range(s, min(s + batch, n)))
            p = model(x.to(device))
            d = (p - y.to(device)).double()
            se += float((d * d).sum())
            ae += float(d.abs().sum())
            count += d.numel()
    return se / count, ae / count


def main():
    ap = argparse.ArgumentParser(description="PyTorch reference of fastgrad-train's PatchTST")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "data", "ETTh1.csv"))
    ap.add_argument("--split", default="ett")
    ap.add_argument("--lookback", type=int, default=336)
    ap.add_argument("--horizon", type=int, default=96)
    ap.add_argument("--d-model", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--d-ff", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--patience", type=int, default=100)
    ap.add_argument("--seed", type=int, default=2021)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--log", help="one JSON object per epoch (fastgrad-train's format)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    random.seed(a.seed), np.random.seed(a.seed), torch.manual_seed(a.seed)
    names, raw = load_csv(a.data)
    L, H = a.lookback, a.horizon
    b = borders(len(raw), L, a.split)
    mean, std = raw[: b[0][1]].mean(0), raw[: b[0][1]].std(0)  # train rows only (StandardScaler: biased)
    z = ((raw - mean) / std).astype(np.float32)
    train, val, test = (Windows(z, lo, hi, L, H) for lo, hi in b)
    dev = torch.device(a.device)
    model = PatchTST(len(names), L, H, a.d_model, a.heads, a.layers, a.d_ff, a.dropout).to(dev)
    step_model = torch.compile(model) if a.compile else model
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    print(f"PatchTST torch: {sum(p.numel() for p in model.parameters())} params, {train.n} / {val.n} / {test.n} "
          f"windows, device {dev}, threads {torch.get_num_threads()}", flush=True)
    log = open(a.log, "w") if a.log else None
    best, best_state, bad, total = math.inf, None, 0, 0.0
    for epoch in range(1, a.epochs + 1):
        model.train()
        t0 = time.perf_counter()
        order = np.random.permutation(train.n)
        losses = []
        for s in range(0, train.n - a.batch + 1, a.batch):  # drop_last, as the official loader
            x, y = train.batch(order[s: s + a.batch])
            loss = F.mse_loss(step_model(x.to(dev)), y.to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t_train = time.perf_counter() - t0
        total += t_train
        val_mse, val_mae = evaluate(model, val, a.batch, dev)
        lr = opt.param_groups[0]["lr"]
        is_best = val_mse < best
        if is_best:
            best, bad = val_mse, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
        print(f"epoch {epoch:3d}  train {np.mean(losses):.6f}  val_mse {val_mse:.6f}  lr {lr:.3g}  "
              f"{t_train:.2f} s{'  *' if is_best else ''}", flush=True)
        if log:
            log.write(json.dumps({"epoch": epoch, "train_loss": float(np.mean(losses)), "val_mse": val_mse,
                                  "val_mae": val_mae, "lr": lr, "time_s": t_train, "best": is_best}) + "\n")
            log.flush()
        for g in opt.param_groups:  # the official type3, adjust_learning_rate(epoch + 1)
            g["lr"] = a.lr if epoch < 3 else a.lr * 0.9 ** (epoch - 3)
        if bad >= a.patience:
            print(f"early stop after epoch {epoch}")
            break
    model.load_state_dict(best_state)
    mse, mae = evaluate(model, test, a.batch, dev)
    dmse, dmae = evaluate(model, test, a.batch, dev, drop_last=True)
    pub = PUBLISHED.get(H)
    print(f"test  every window ({test.n}): mse {mse:.4f} mae {mae:.4f}   drop-last: mse {dmse:.4f} mae {dmae:.4f}"
          + (f"   published: mse {pub[0]:.3f} mae {pub[1]:.3f}" if pub and L == 336 else ""))
    print(f"training time {total:.1f} s ({total / epoch:.2f} s/epoch)")
    print(f"final: test_mse={mse:.9g} test_mae={mae:.9g} droplast_mse={dmse:.9g} droplast_mae={dmae:.9g}")


if __name__ == "__main__":
    main()

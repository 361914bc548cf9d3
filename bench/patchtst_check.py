#!/usr/bin/env python3
"""patchtst_check.py — fastgrad-train's forecasts against the PyTorch reference model
(bench/patchtst_torch.py) with the same weights: the checkpoint's best weights and BatchNorm
running statistics are loaded into the PyTorch model, which forecasts the test windows that
fastgrad-train's --predict wrote; the two must agree to f32 rounding. This checks the whole
evaluation forward of the C program — RevIN and its inverse, patching with end padding, the
embedding and positions, every encoder layer (projections, residual attention scores, output
projection, BatchNorm with running statistics, the GELU FFN), the flatten head's order — against
an independent implementation of the published model.

    fastgrad-train --data D --checkpoint run.ckpt --predict run.csv [...]
    python3 bench/patchtst_check.py --data D --checkpoint run.ckpt --predict run.csv

The checkpoint's parameters are one flat arena; this reads it in the order and alignment
train/model.c lays it out (each tensor starts at a multiple of 16 floats; W_QKV packs W_Q, W_K,
W_V; the head's columns are patch-major, [P, d], where PyTorch's are [d, P]). Exit status 1
when the forecasts differ by more than --tol (relative to the forecasts' RMS).
"""
import argparse
import csv
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from patchtst_torch import PatchTST, RevIN, borders, load_csv  # noqa: E402


def read_checkpoint(path):
    b = open(path, "rb").read()
    if b[:8] != b"FGTRAIN\0":
        sys.exit(f"{path}: not a fastgrad-train checkpoint")
    at, out = 28, {}
    (n,) = struct.unpack_from("<I", b, 24)
    for _ in range(n):
        _sec, typ, kl = struct.unpack_from("<BBH", b, at)
        at += 4
        key = b[at: at + kl].decode()
        at += kl
        (vb,) = struct.unpack_from("<Q", b, at)
        at += 8
        val = b[at: at + vb]
        at += vb
        if typ == 1:
            out[key] = val.decode()
        elif typ in (2, 3, 4):
            out[key] = struct.unpack("<" + {2: "q", 3: "Q", 4: "d"}[typ], val)[0]
        elif typ == 6:
            out[key] = np.frombuffer(val, dtype="<f4").copy()
        else:
            out[key] = val
    return out


class Arena:
    """Reads tensors in train/model.c's order: each starts at a multiple of 16 floats."""

    def __init__(self, flat):
        self.flat, self.at = flat, 0

    def take(self, *shape):
        n = int(np.prod(shape))
        t = self.flat[self.at: self.at + n].reshape(shape)
        self.at += (n + 15) // 16 * 16
        return torch.from_numpy(np.ascontiguousarray(t))


class Linear(torch.nn.Module):
    def __init__(self, L, H, c):
        super().__init__()
        self.revin = RevIN(c)
        self.lin = torch.nn.Linear(L, H)

    def forward(self, x):
        return self.revin.denorm(self.lin(self.revin.norm(x).permute(0, 2, 1)).permute(0, 2, 1))


def load_model(ck, c):
    L, H, d, S = ck["lookback"], ck["horizon"], ck.get("d_model", 0), ck.get("patch_len", 16)
    flat = ck["best"]
    n_params = ck["n_params"]
    p, buf = Arena(flat[:n_params]), Arena(flat[n_params:])
    if ck["model"] == "linear":
        m = Linear(L, H, c)
        with torch.no_grad():
            m.revin.w.copy_(p.take(c)), m.revin.b.copy_(p.take(c))
            m.lin.weight.copy_(p.take(H, L)), m.lin.bias.copy_(p.take(H))
        return m
    m = PatchTST(c, L, H, d, ck["heads"], ck["layers"], ck["d_ff"], 0.0, S, ck["stride"])
    P, dff = m.P, ck["d_ff"]
    with torch.no_grad():
        m.revin.w.copy_(p.take(c)), m.revin.b.copy_(p.take(c))
        m.embed.weight.copy_(p.take(d, S)), m.embed.bias.copy_(p.take(d))
        m.pos.copy_(p.take(P, d))
        for layer in m.layers:
            w, bias = p.take(3 * d, d), p.take(3 * d)
            for j, lin in enumerate((layer.attn.q, layer.attn.k, layer.attn.v)):
                lin.weight.copy_(w[j * d: (j + 1) * d]), lin.bias.copy_(bias[j * d: (j + 1) * d])
            layer.attn.out.weight.copy_(p.take(d, d)), layer.attn.out.bias.copy_(p.take(d))
            layer.norm_attn.bn.weight.copy_(p.take(d)), layer.norm_attn.bn.bias.copy_(p.take(d))
            layer.ff[0].weight.copy_(p.take(dff, d)), layer.ff[0].bias.copy_(p.take(dff))
            layer.ff[3].weight.copy_(p.take(d, dff)), layer.ff[3].bias.copy_(p.take(d))
            layer.norm_ffn.bn.weight.copy_(p.take(d)), layer.norm_ffn.bn.bias.copy_(p.take(d))
            layer.norm_attn.bn.running_mean.copy_(buf.take(d)), layer.norm_attn.bn.running_var.copy_(buf.take(d))
            layer.norm_ffn.bn.running_mean.copy_(buf.take(d)), layer.norm_ffn.bn.running_var.copy_(buf.take(d))
        wh = p.take(H, P, d)  # patch-major columns → PyTorch's [d, P] flatten order
        m.head.weight.copy_(wh.permute(0, 2, 1).reshape(H, d * P)), m.head.bias.copy_(p.take(H))
    if p.at < n_params - 15:
        sys.exit(f"the checkpoint has {n_params} parameters; this layout read {p.at}")
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--predict", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    ck = read_checkpoint(a.checkpoint)
    names, raw = load_csv(a.data)
    L, H = ck["lookback"], ck["horizon"]
    b = borders(len(raw), L, ck.get("split", "ett"))
    mean, std = raw[: b[0][1]].mean(0), raw[: b[0][1]].std(0)
    z = ((raw - mean) / std).astype(np.float32)
    model = load_model(ck, len(names)).eval()
    with open(a.predict, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(header)}
    by_window = {}
    for r in body:
        by_window.setdefault(int(r[col["window"]]), []).append(r)
    lo = b[2][0]
    windows = sorted(by_window)
    x = torch.from_numpy(np.stack([z[lo + w: lo + w + L] for w in windows]))
    with torch.no_grad():
        y = model(x).double().numpy() * std + mean  # [W, H, C] in the data's units
    theirs = np.array([[[float(r[col[n + "_pred"]]) for n in names] for r in sorted(by_window[w], key=lambda r: int(r[col["step"]]))]
                       for w in windows])
    truth = np.array([[[float(r[col[n]]) for n in names] for r in sorted(by_window[w], key=lambda r: int(r[col["step"]]))]
                      for w in windows])
    want_truth = np.stack([raw[lo + w + L: lo + w + L + H] for w in windows])
    scale = np.sqrt(np.mean(y * y))
    err = np.abs(theirs - y).max() / scale
    terr = np.abs(truth - want_truth).max() / scale
    print(f"{len(windows)} windows × {H} steps × {len(names)} series: max |fastgrad − torch| / rms = {err:.3g}; "
          f"truth columns off by {terr:.3g}")
    sys.exit(0 if err <= a.tol and terr <= a.tol else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""plot.py — pictures of a fastgrad-train run: the forecasts against the truth and the loss
curves, as PNG files (matplotlib, no display needed).

    scripts/plot.py --predict forecasts.csv --log run.jsonl --out docs/
    scripts/plot.py --predict forecasts.csv --series HUFL --windows 10,11,12

Inputs are what fastgrad-train writes:
  --predict FILE  CSV "date,window,step,<S1>,...,<Sn>,<S1>_pred,...,<Sn>_pred" in the data's
                  units: one row per target step of every horizon-th test window, so the rows
                  tile the test period once
  --log FILE      one JSON object per epoch (epoch, train_loss, val_mse, lr, ...), then one
                  with the test results (test_mse, test_mae, ...)
Outputs: <out>/forecast.png (one series over the whole test period, truth and forecast, and a
zoom on a few consecutive windows) and <out>/loss.png (train loss and validation MSE per
epoch, the best epoch marked, the learning rate on a second axis, the test result in the
title). Either input may be left out.
"""
import argparse
import csv
import json
import os
import sys


def fail(msg):
    print(f"plot.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read_forecasts(path):
    """(dates, windows, {series: (truth, forecast)}) in file order."""
    try:
        f = open(path, newline="")
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    with f:
        rows = csv.reader(f)
        header = [h.strip() for h in next(rows, [])]
        if header[:3] != ["date", "window", "step"]:
            fail(f"{path}:1: the header starts {header[:3]}, want date,window,step")
        names = [h for h in header[3:] if not h.endswith("_pred") and h + "_pred" in header]
        if not names:
            fail(f"{path}:1: no series with a <name>_pred column")
        col = {h: i for i, h in enumerate(header)}
        dates, windows = [], []
        series = {n: ([], []) for n in names}
        for line, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) != len(header):
                fail(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
            try:
                windows.append(int(row[1]))
                for n in names:
                    series[n][0].append(float(row[col[n]]))
                    series[n][1].append(float(row[col[n + "_pred"]]))
            except ValueError:
                fail(f"{path}:{line}: not a number in {row[:4]}...")
            dates.append(row[0])
    if not dates:
        fail(f"{path}: no forecasts")
    return dates, windows, series


def read_log(path):
    """(epoch records, the last record with test results or None)"""
    epochs, final = [], None
    try:
        f = open(path)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    with f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                fail(f"{path}:{line}: not JSON ({e.msg})")
            if "epoch" not in rec:
                if "test_mse" in rec:
                    final = rec
                continue
            for key in ("train_loss", "val_mse"):
                if key not in rec:
                    fail(f"{path}:{line}: no '{key}' in {text.strip()[:120]}")
            epochs.append(rec)
    if not epochs:
        fail(f"{path}: no epochs")
    last = {}  # an epoch logged twice (a run started over into the same log): the last counts
    for rec in epochs:
        last[rec["epoch"]] = rec
    return [last[e] for e in sorted(last)], final


def plot_forecasts(plt, data, name, zoom, out, dpi):
    dates, windows, series = data
    if name is None:
        name = list(series)[-1]  # the last column: OT (the target) in ETT
    if name not in series:
        fail(f"no series '{name}' in the forecasts (have {', '.join(series)})")
    truth, fc = series[name]
    have = sorted(set(windows))
    if zoom is None:  # three consecutive windows from the middle of the test period
        mid = have[len(have) // 2]
        zoom = [w for w in have if w >= mid][:3]
    for w in zoom:
        if w not in have:
            fail(f"no window {w} in the forecasts (they have {have[0]}, ..., {have[-1]})")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5))
    x = range(len(dates))
    top.plot(x, truth, color="black", linewidth=0.6, label="truth")
    top.plot(x, fc, color="tab:red", linewidth=0.6, alpha=0.85, label="forecast")
    ticks = list(range(0, len(dates), max(1, len(dates) // 6)))
    top.set_xticks(ticks, [dates[i][:10] for i in ticks], fontsize=8)
    top.set_title(f"{name} over the test period: each forecast from the {len(x) // max(1, len(have))} steps "
                  f"after its window's look-back", fontsize=9)
    top.legend(fontsize=8, loc="upper right")
    top.grid(alpha=0.3)
    idx = [i for i, w in enumerate(windows) if w in zoom]
    bottom.plot(range(len(idx)), [truth[i] for i in idx], color="black", linewidth=1.2, label="truth")
    bottom.plot(range(len(idx)), [fc[i] for i in idx], color="tab:red", linewidth=1.2, label="forecast")
    for k in range(1, len(idx)):
        if windows[idx[k]] != windows[idx[k - 1]]:
            bottom.axvline(k - 0.5, color="gray", linestyle=":", linewidth=1)
    bticks = list(range(0, len(idx), max(1, len(idx) // 6)))
    bottom.set_xticks(bticks, [dates[idx[i]][5:16] for i in bticks], fontsize=8)
    bottom.set_title(f"windows {', '.join(map(str, zoom))} (a new forecast starts at each dotted line)", fontsize=9)
    bottom.grid(alpha=0.3)
    for ax in (top, bottom):
        ax.set_ylabel(name)
    fig.tight_layout()
    path = os.path.join(out, "forecast.png")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_losses(plt, log, out, dpi):
    epochs, final = log
    e = [r["epoch"] for r in epochs]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(e, [r["train_loss"] for r in epochs], label="train loss (MSE)", color="tab:blue")
    ax.plot(e, [r["val_mse"] for r in epochs], label="validation MSE", color="tab:orange")
    best = min(epochs, key=lambda r: r["val_mse"])
    ax.axvline(best["epoch"], color="gray", linestyle=":", linewidth=1)
    right = best["epoch"] > (e[0] + e[-1]) / 2  # the label on the side with room
    ax.annotate(f"best {best['val_mse']:.4f} (epoch {best['epoch']})", (best["epoch"], best["val_mse"]),
                textcoords="offset points", xytext=(-6 if right else 6, 8), ha="right" if right else "left",
                fontsize=8)
    ax.set_xlabel("epoch")
    ax.set_ylabel("MSE (standardized)")
    ax.grid(alpha=0.3)
    lines, labels = ax.get_legend_handles_labels()
    if all("lr" in r for r in epochs):
        ax2 = ax.twinx()
        ax2.plot(e, [r["lr"] for r in epochs], color="tab:green", linewidth=0.8, alpha=0.7, label="learning rate")
        ax2.set_ylabel("learning rate")
        l2, n2 = ax2.get_legend_handles_labels()
        lines, labels = lines + l2, labels + n2
    ax.legend(lines, labels, fontsize=8)
    if final:
        ax.set_title(f"test MSE {final['test_mse']:.4f}, MAE {final.get('test_mae', float('nan')):.4f} "
                     f"(best validation weights)", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out, "loss.png")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--predict", help="forecasts CSV written by fastgrad-train --predict")
    ap.add_argument("--log", help="JSON-lines log written by fastgrad-train --log")
    ap.add_argument("--out", default=".", help="directory for the PNG files (default: .)")
    ap.add_argument("--series", help="series to draw (default: the last column, OT for ETT)")
    ap.add_argument("--windows", help="comma-separated test windows to zoom on (default: 3 from the middle)")
    ap.add_argument("--dpi", type=int, default=120, help="resolution of the PNG files (default 120)")
    a = ap.parse_args()
    if not a.predict and not a.log:
        ap.error("give --predict, --log or both")
    windows = None
    if a.windows:
        try:
            windows = [int(w) for w in a.windows.split(",")]
        except ValueError:
            fail(f"--windows {a.windows}: want comma-separated integers")
    try:
        import matplotlib
    except ImportError:
        fail("needs matplotlib (python3 -m pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(a.out, exist_ok=True)
    if a.predict:
        print(plot_forecasts(plt, read_forecasts(a.predict), a.series, windows, a.out, a.dpi))
    if a.log:
        print(plot_losses(plt, read_log(a.log), a.out, a.dpi))


if __name__ == "__main__":
    main()

"""One fastgrad-train training step on the GPU, kernel by kernel: runs the program under Nsight
Compute (ncu, gpu__time_duration only, clocks left alone) over a window of launches well inside
the first epoch's training steps, finds the step's period in the kernel-name sequence, and prints
each kernel's time in one step, sorted, with the step's kernel total. Beside the program's own
training time per step it says how much of a step the GPU spends in kernels: the rest is launch
gaps and host time, which only fewer launches (or a graph) recover.

    python3 tools/train_step_kernels.py --train build-gpu/train/fastgrad-train [--dtype bf16]
        [--out DIR] [-- more fastgrad-train flags]
"""
import argparse
import collections
import csv
import io
import os
import subprocess
import sys


def ncu_kernels(cmd, skip, count):
    ncu = ["ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv",
           "--launch-skip", str(skip), "--launch-count", str(count)]
    out = subprocess.run(ncu + cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"ncu failed ({out.returncode}):\n{out.stderr[-2000:]}")
    text = out.stdout[out.stdout.find('"ID"'):]
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        v = float(r["Metric Value"].replace(",", ""))
        v *= {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
        rows.append((r["Kernel Name"], v))  # microseconds
    return rows


def period(names):
    """The smallest p for which the sequence repeats with period p over its second half."""
    n = len(names)
    for p in range(8, n // 2):
        tail = range(n // 2, n - p)
        if tail and all(names[i] == names[i + p] for i in tail):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default="build-gpu/train/fastgrad-train")
    ap.add_argument("--data", default="data/ETTh1.csv")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--skip", type=int, default=3000, help="launches skipped (start-up and the first steps)")
    ap.add_argument("--count", type=int, default=1200)
    ap.add_argument("--out", default=None)
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    cmd = [a.train, "--data", a.data, "--device", "cuda", "--dtype", a.dtype, "--epochs", "1", "--quiet"] + a.rest
    rows = ncu_kernels(cmd, a.skip, a.count)
    names = [n for n, _ in rows]
    p = period(names)
    if p is None:
        sys.exit(f"no period found in {len(rows)} launches")
    # one whole period, aligned to the window's middle
    start = len(rows) // 2
    step = rows[start:start + p]
    total = sum(t for _, t in step)
    by = collections.OrderedDict()
    for n, t in step:
        k = n.split("(")[0][:90]
        c, s = by.get(k, (0, 0.0))
        by[k] = (c + 1, s + t)
    lines = [f"launches per step: {p}; kernel time per step: {total:.1f} us ({a.dtype})",
             "| kernel | launches | us / step | share |", "|---|---:|---:|---:|"]
    for k, (c, s) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {k} | {c} | {s:.1f} | {100 * s / total:.1f}% |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"train-step-kernels-{a.dtype}.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(a.out, f"train-step-launches-{a.dtype}.txt"), "w") as f:
            for n, t in step:
                f.write(f"{t:9.2f}  {n[:160]}\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""ncu_stalls.py — where one kernel's warps wait, instruction by instruction: runs Nsight Compute's
full set with source counters on one launch of a kernel (or reads a report made so), then prints
the SASS lines that hold the most warp-stall samples with their main stall reasons, every line of
the kinds asked for (global loads, barriers, ...) with its share, and the report's headline
figures (duration, DRAM and L1 throughput, warps issued a scheduler, occupancy). For reading why a
kernel runs slower than its bytes or instructions say it should before changing it.

    tools/ncu_stalls.py --run REGEX [--skip N] [--out FILE] -- python3 target.py [args]
    tools/ncu_stalls.py REPORT.ncu-rep [--top 30] [--grep LDG,BAR,SYNCS]

--skip N profiles the (N+1)-th launch whose name matches REGEX (leave the first for warm-up);
the report is kept (--out, default /tmp/ncu_stalls.ncu-rep) so it can be read again or copied
back from the GPU machine.
"""
import argparse
import csv
import io
import subprocess
import sys

HEADLINE = ["Duration", "DRAM Throughput", "L1/TEX Cache Throughput", "L2 Cache Throughput",
            "Issued Warp Per Scheduler", "Warp Cycles Per Issued Instruction", "Achieved Occupancy",
            "Registers Per Thread", "L2 Hit Rate"]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def ncu_csv(report, *args):
    out = subprocess.run(["ncu", "-i", report, "--csv", *args], check=True, capture_output=True, text=True).stdout
    return list(csv.reader(io.StringIO(out)))


def headline(report):
    rows = ncu_csv(report, "--page", "details")
    h = rows[0]
    n, u, v = h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
    seen = {}
    for r in rows[1:]:
        if len(r) == len(h) and r[n] in HEADLINE and r[n] not in seen:
            seen[r[n]] = f"{r[v]} {r[u]}".strip()
    print("  ".join(f"{k}: {seen[k]}" for k in HEADLINE if k in seen))


def stalls(report, top, kinds):
    rows = ncu_csv(report, "--page", "source", "--print-source", "sass")
    hi = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if hi is None:
        sys.exit("ncu_stalls: the report has no source page (profile with --import-source yes and the full set)")
    h = rows[hi]
    body = [r for r in rows[hi + 1:] if len(r) == len(h)]
    si = h.index("Source")
    ai = next(i for i, c in enumerate(h) if c.startswith("Warp Stall Sampling (All"))
    reasons = [i for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(num(r[ai]) for r in body) or 1.0
    print(f"{int(total)} stall samples over {len(body)} SASS lines")

    def line(i):
        r = body[i]
        why = sorted(((num(r[j]), h[j][6:]) for j in reasons), reverse=True)[:3]
        why = " ".join(f"{n}={v:.0f}" for v, n in why if v > 0)
        return f"{i:6d} {100 * num(r[ai]) / total:5.1f}%  {r[si].strip()[:70]:70s} {why}"

    print(f"-- the {top} lines with the most samples, in program order")
    for i in sorted(sorted(range(len(body)), key=lambda i: -num(body[i][ai]))[:top]):
        print(line(i))
    if kinds:
        print(f"-- every {', '.join(kinds)} line")
        for i, r in enumerate(body):
            if any(k in r[si] for k in kinds):
                print(line(i))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", nargs="?")
    ap.add_argument("--run", metavar="REGEX", help="profile a launch of the kernels matching REGEX")
    ap.add_argument("--skip", type=int, default=1)
    ap.add_argument("--out", default="/tmp/ncu_stalls.ncu-rep")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--grep", default="LDG,STG,BAR,SYNCS.PHASECHK", help="comma-separated SASS to list whole")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a, target = ap.parse_args(argv[:cut]), argv[cut + 1:]
    report = a.report
    if a.run:
        if not target:
            sys.exit("ncu_stalls: --run needs a target after --")
        subprocess.run(["ncu", "--set", "full", "--import-source", "yes", "-k", f"regex:{a.run}", "-s", str(a.skip),
                        "-c", "1", "-f", "-o", a.out.removesuffix(".ncu-rep"), *target], check=True)
        report = a.out
    if not report:
        sys.exit("ncu_stalls: give a report or --run REGEX -- target")
    headline(report)
    stalls(report, a.top, [k for k in a.grep.split(",") if k])


if __name__ == "__main__":
    main()

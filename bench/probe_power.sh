#!/usr/bin/env bash
# Developer probe (session 12): probe_ab.py under an nvidia-smi clock / power log, then ncu on the three sm_90a products of the slope form.
export OUT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTGRAD_CUDA=ON -DFASTGRAD_CUDA_ARCHS=90a && ninja -C build-gpu fastgrad) > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 > $OUT/smi.csv 2>&1 &
SMI=$!
PYTHONPATH=python:bench FASTGRAD_LIBRARY=build-gpu/libfastgrad.so timeout 200 python3 bench/probe_ab.py gelu_tanh 3 2>&1 | grep -v -i warn | tee $OUT/probe_ab.log
kill $SMI
python3 - <<'PY'
import csv, os, statistics
rows = list(csv.reader(open(os.environ["OUT"] + "/smi.csv")))[1:]
clk = [float(r[1].split()[0]) for r in rows if len(r) > 3 and r[1].strip()[0].isdigit()]
pw = [float(r[2].split()[0]) for r in rows if len(r) > 3 and r[2].strip()[0].isdigit()]
busy = [(c, p) for c, p in zip(clk, pw) if p > 300]
print("samples", len(rows), "busy", len(busy), "clock MHz median/min", statistics.median(c for c, _ in busy), min(c for c, _ in busy),
      "power W median/max", statistics.median(p for _, p in busy), max(p for _, p in busy))
print("throttle reasons seen:", sorted(set(r[4].strip() for r in rows if len(r) > 4)))
PY
PYTHONPATH=python FASTGRAD_LIBRARY=build-gpu/libfastgrad.so timeout 300 ncu -k regex:act_gemm_kernel --launch-count 3 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis python3 bench/ncu_form.py gelu_tanh slope > $OUT/ncu.log 2>&1
grep -E "act_gemm_kernel|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth" $OUT/ncu.log | cut -c1-150

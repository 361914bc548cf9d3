"""The CPU side-by-side benchmark: every CPU op of fastgrad (through the Python package,
ctypes on numpy arrays) beside numpy's equivalent (and PyTorch CPU where it is
installed), in one run on the same machine, against the machine's own ceilings
measured in the same run:

  copy bandwidth   numpy's copy of an array of each operand size the stream rows use,
                   bytes read + written per second, the best of one thread and one
                   thread per core (numpy's copy releases the GIL)
  sgemm rate       numpy's matmul at 2048^3 f32, and the sgemm of the OpenBLAS that
                   libfastgrad links (called directly, the "same OpenBLAS" ceiling)

Rows (the acceptance rows of the CPU-speed issue):
  GEMM-backed ops  linear forward / backward input / backward weight, matmul, at
                   256 ... 2048 square, f32: time, GFLOP/s, numpy-time / fastgrad-time
  streams          lerp, axpby, unary (scale, clamp, softcap) forward, lerp backward,
                   AdamW, f32 and bf16, 2^20 ... 2^26 elements: GB/s (bytes the op must
                   read + write) and % of the copy bandwidth, beside numpy's expression
  linear + act     gelu_tanh f32 8192 x 256 -> 1024, forward + backward, against its
                   three products alone (fastgrad's own linear GEMMs)
  linear log-prob  f32 N 1024, D 256, V 32768, forward + backward, against its four
                   products alone (z twice, dh, dw)

Times are medians of repeated runs after a warm-up. --quick runs fewer repeats and
smaller maxima (under two minutes); --write writes the table to docs/benchmarks-cpu.md;
--json PATH saves the rows (for a before / after comparison with --compare PATH).
bf16 arrays come from ml_dtypes (numpy's bf16 arithmetic through it is slow: that row
is what a numpy user gets). Set FASTGRAD_LIBRARY to time another build.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fastgrad as fg  # noqa: E402
from fastgrad import _lib, ops  # noqa: E402

try:
    import ml_dtypes
    BF16 = ml_dtypes.bfloat16
except ImportError:  # bf16 rows need ml_dtypes
    BF16 = None
try:
    import torch
    torch.set_grad_enabled(False)
except ImportError:
    torch = None

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


# ------------------------------------------------------------------ timing

STAT = statistics.median  # --stat min: the fastest sample (a shared machine's other work only adds)


def timed(fn, reps, min_sample=0.004, settle=0.15, warm=0.2):
    """Median (or, with --stat min, fastest) seconds per call: a warm-up of at least 3 calls and `warm` seconds (first
    touches of fresh outputs, thread pools starting), then `reps` samples of enough calls
    each to last min_sample seconds. It first sleeps `settle` seconds: the thread pools of
    the previous block (numpy's OpenBLAS, libfastgrad's OpenBLAS, OpenMP) keep their idle
    threads spinning for a while, which on a 2-core machine would be charged to this one."""
    time.sleep(settle)
    calls, t0 = 0, time.perf_counter()
    while calls < 3 or (time.perf_counter() - t0 < warm and calls < 1000):
        fn()
        calls += 1
    once = (time.perf_counter() - t0) / calls
    inner = max(1, int(min_sample / max(once, 1e-7)))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return STAT(samples)


# ------------------------------------------------------------------ the OpenBLAS libfastgrad links

def fastgrad_openblas():
    """ctypes handle on the OpenBLAS libfastgrad is linked against (found in this process's
    mappings once libfastgrad is loaded; numpy's own scipy-openblas is skipped), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libopenblas" in line}
    except OSError:
        paths = set()
    for p in sorted(paths):
        try:
            b = ctypes.CDLL(p)
            b.cblas_sgemm  # noqa: B018
            return b
        except (OSError, AttributeError):
            continue
    name = ctypes.util.find_library("openblas")
    return ctypes.CDLL(name) if name else None


def blas_sgemm(blas, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    """c = op(a)·op(b), row-major, through cblas_sgemm."""
    fp = ctypes.c_void_p
    blas.cblas_sgemm(101, 112 if ta else 111, 112 if tb else 111, m, n, k, ctypes.c_float(1.0),
                     fp(a.ctypes.data), lda, fp(b.ctypes.data), ldb, ctypes.c_float(0.0), fp(c.ctypes.data), ldc)


# ------------------------------------------------------------------ ceilings

def copy_gbs(nbytes, reps, threads):
    """Copy bandwidth (bytes read + written per second) of an nbytes array, numpy's copy
    on `threads` Python threads, each a contiguous share (numpy's copy releases the GIL)."""
    src = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    if threads == 1:
        t = timed(lambda: np.copyto(dst, src), reps)
    else:
        step = -(-src.size // threads)
        parts = [(dst[i:i + step], src[i:i + step]) for i in range(0, src.size, step)]
        with ThreadPoolExecutor(threads) as pool:
            t = timed(lambda: list(pool.map(lambda p: np.copyto(*p), parts)), reps)
    return 2 * src.nbytes / t / 1e9


def ceilings(reps, quick, operand_bytes):
    """The copy bandwidth for each operand size the stream rows use (the best of one thread
    and one per core: L2 / L3 / DRAM as the size falls), and the sgemm rates."""
    out = {"copy": {}}
    for nb in sorted(set(operand_bytes)):
        one = copy_gbs(nb, reps, 1)
        many = copy_gbs(nb, reps, CORES) if CORES > 1 else 0.0
        out["copy"][str(nb)] = max(one, many)
        print(f"  copy {nb / 2**20:.0f} MiB: 1 thread {one:.1f} GB/s, {CORES} threads {many:.1f} GB/s",
              flush=True)
    s = 2048
    a = np.random.default_rng(1).standard_normal((s, s), dtype=np.float32)
    b = np.random.default_rng(2).standard_normal((s, s), dtype=np.float32)
    c = np.empty((s, s), np.float32)
    t_np = timed(lambda: np.matmul(a, b, out=c), reps)
    out["np_sgemm_gflops"] = 2 * s ** 3 / t_np / 1e9
    blas = fastgrad_openblas()
    if blas is not None:
        t_b = timed(lambda: blas_sgemm(blas, False, False, s, s, s, a, s, b, s, c, s), reps)
        out["fg_blas_sgemm_gflops"] = 2 * s ** 3 / t_b / 1e9
    return out


# ------------------------------------------------------------------ GEMM rows

def gemm_rows(sizes, reps):
    rows = []
    blas = fastgrad_openblas()
    rng = np.random.default_rng(3)
    for s in sizes:
        x = rng.standard_normal((s, s), dtype=np.float32)
        w = rng.standard_normal((s, s), dtype=np.float32)
        b = rng.standard_normal(s, dtype=np.float32)
        dy = rng.standard_normal((s, s), dtype=np.float32)
        out = np.empty((s, s), np.float32)
        flops = 2.0 * s ** 3
        cases = [
            ("linear_forward", lambda: fg.linear_forward(x, w, out=out), lambda: np.matmul(x, w.T, out=out),
             (False, True)),
            ("linear_forward +bias", lambda: fg.linear_forward(x, w, b, out=out),
             lambda: np.add(np.matmul(x, w.T, out=out), b, out=out), (False, True)),
            ("linear_backward_input", lambda: fg.linear_backward_input(dy, w, out=out),
             lambda: np.matmul(dy, w, out=out), (False, False)),
            ("linear_backward_weight", lambda: fg.linear_backward_weight(dy, x, out=out),
             lambda: np.matmul(dy.T, x, out=out), (True, False)),
            ("matmul_forward", lambda: fg.matmul_forward(x, w, out=out), lambda: np.matmul(x, w, out=out),
             (False, False)),
        ]
        for name, f_fg, f_np, (ta, tb) in cases:
            t_fg = timed(f_fg, reps)
            t_np = timed(f_np, reps)
            row = {"op": name, "size": s, "fg_ms": t_fg * 1e3, "np_ms": t_np * 1e3,
                   "fg_gflops": flops / t_fg / 1e9, "np_gflops": flops / t_np / 1e9}
            if blas is not None and "bias" not in name:
                row["blas_ms"] = timed(lambda: blas_sgemm(blas, ta, tb, s, s, s, x, s, w, s, out, s), reps) * 1e3
            if torch is not None:
                tx, tw, tdy, tout = (torch.from_numpy(v) for v in (x, w, dy, out))
                tf = {"linear_forward": lambda: torch.matmul(tx, tw.T, out=tout),
                      "linear_backward_input": lambda: torch.matmul(tdy, tw, out=tout),
                      "linear_backward_weight": lambda: torch.matmul(tdy.T, tx, out=tout),
                      "matmul_forward": lambda: torch.matmul(tx, tw, out=tout)}.get(name)
                if tf:
                    row["torch_ms"] = timed(tf, reps) * 1e3
            rows.append(row)
            print(f"  {name} {s}: fastgrad {t_fg * 1e3:.3f} ms, numpy {t_np * 1e3:.3f} ms", flush=True)
    return rows


# ------------------------------------------------------------------ stream rows

def np_lerp(a, b, w, out, tmp):
    np.subtract(b, a, out=tmp)
    np.multiply(tmp, w, out=tmp)
    np.add(a, tmp, out=out)


def np_axpby(a, b, al, be, out, tmp):
    np.multiply(a, al, out=out)
    np.multiply(b, be, out=tmp)
    np.add(out, tmp, out=out)


def np_softcap(x, c, out):
    np.divide(x, c, out=out)
    np.tanh(out, out=out)
    np.multiply(out, c, out=out)


class Adam:
    lr, b1, b2, eps, wd, step = 1e-3, 0.9, 0.999, 1e-8, 0.01, 3


def np_adamw(p, g, m, v, tmp, tmp2):
    """torch's foreach AdamW as numpy expressions (in place, out= everywhere)."""
    A = Adam
    np.multiply(p, 1 - A.lr * A.wd, out=p)
    np.subtract(g, m, out=tmp)                       # m = m + (1-b1)(g - m)
    np.multiply(tmp, 1 - A.b1, out=tmp)
    np.add(m, tmp, out=m)
    np.multiply(v, A.b2, out=v)                      # v = b2 v + (1-b2) g g
    np.multiply(g, g, out=tmp)
    np.multiply(tmp, 1 - A.b2, out=tmp)
    np.add(v, tmp, out=v)
    bc1, bc2 = 1 - A.b1 ** A.step, 1 - A.b2 ** A.step
    np.sqrt(v, out=tmp2)                              # p -= lr/bc1 · m / (sqrt(v)/sqrt(bc2) + eps)
    np.multiply(tmp2, 1 / np.sqrt(bc2), out=tmp2)
    np.add(tmp2, A.eps, out=tmp2)
    np.divide(m, tmp2, out=tmp2)
    np.multiply(tmp2, A.lr / bc1, out=tmp2)
    np.subtract(p, tmp2.astype(p.dtype, copy=False), out=p)


def fg_adamw(p, g, m, v):
    A = Adam
    fg.adamw_step([p], [g], [m], [v], lr=A.lr, beta1=A.b1, beta2=A.b2, eps=A.eps, weight_decay=A.wd, step=A.step)


def stream_rows(exps, dtypes, reps, np_bf16_max):
    rows = []
    rng = np.random.default_rng(4)
    for dname in dtypes:
        dt = np.float32 if dname == "f32" else BF16
        es = np.dtype(dt).itemsize
        for e in exps:
            n = 1 << e
            a = rng.standard_normal(n, dtype=np.float32).astype(dt)
            b = rng.standard_normal(n, dtype=np.float32).astype(dt)
            out, tmp = np.empty(n, dt), np.empty(n, dt)
            out2 = np.empty(n, dt)
            np_ok = dname == "f32" or e <= np_bf16_max
            cases = [
                ("lerp", 3, lambda: fg.lerp_forward(a, b, 0.3, out=out), lambda: np_lerp(a, b, 0.3, out, tmp)),
                ("axpby", 3, lambda: fg.axpby_forward(a, b, 0.7, -1.3, out=out),
                 lambda: np_axpby(a, b, 0.7, -1.3, out, tmp)),
                ("scale", 2, lambda: fg.unary_forward("scale", a, (1.7,), out=out),
                 lambda: np.multiply(a, dt(1.7), out=out)),
                ("clamp", 2, lambda: fg.unary_forward("clamp", a, (-0.5, 0.5), out=out),
                 lambda: np.clip(a, dt(-0.5), dt(0.5), out=out)),
                ("softcap", 2, lambda: fg.unary_forward("softcap", a, (3.0,), out=out),
                 lambda: np_softcap(a, dt(3.0), out)),
                ("softcap_bwd", 3, lambda: fg.unary_backward("softcap", b, a, (3.0,), out=out),
                 lambda: (np_softcap(a, dt(3.0), tmp), np.divide(tmp, dt(3.0), out=tmp),
                          np.multiply(tmp, tmp, out=tmp), np.subtract(dt(1.0), tmp, out=tmp),
                          np.multiply(b, tmp, out=out))),
                ("lerp_bwd", 3, None, lambda: (np.multiply(a, dt(0.7), out=out), np.multiply(a, dt(0.3), out=out2))),
            ]
            for name, passes, f_fg, f_np in cases:
                if name == "lerp_bwd":
                    def f_fg():  # dy = a; da, db into preallocated arrays as numpy's (the plan API)
                        ops.run("binary_backward", dict(dy=a, da=out, db=out2),
                                options=ops._elementwise(_lib.BINARY, "lerp", (0.3,)))
                nbytes = passes * n * es
                t_fg = timed(f_fg, reps)
                t_np = timed(f_np, max(3, reps // 3) if dname == "bf16" else reps) if np_ok else None
                rows.append({"op": name, "dtype": dname, "log2n": e, "opbytes": n * es, "bytes": nbytes,
                             "fg_ms": t_fg * 1e3,
                             "np_ms": t_np * 1e3 if t_np else None, "fg_gbs": nbytes / t_fg / 1e9})
                print(f"  {name} {dname} 2^{e}: fastgrad {t_fg * 1e3:.3f} ms"
                      + (f", numpy {t_np * 1e3:.3f} ms" if t_np else ""), flush=True)
            # AdamW: p and g of the dtype, m and v f32, updated in place
            p = rng.standard_normal(n, dtype=np.float32).astype(dt)
            g = (rng.standard_normal(n, dtype=np.float32) * 0.1).astype(dt)
            m = np.zeros(n, np.float32)
            v = np.full(n, 1e-4, np.float32)
            t1, t2 = np.empty(n, np.float32), np.empty(n, np.float32)
            nbytes = n * (2 * es + es + 4 * 4)  # read p g m v, write p m v
            t_fg = timed(lambda: fg_adamw(p, g, m, v), reps)
            t_np = None
            if np_ok:
                if dname == "f32":
                    t_np = timed(lambda: np_adamw(p, g, m, v, t1, t2), reps)
                else:
                    def np_bf16():
                        g32 = g.astype(np.float32)
                        p32 = p.astype(np.float32)
                        np_adamw(p32, g32, m, v, t1, t2)
                        p[...] = p32.astype(dt)
                    t_np = timed(np_bf16, max(3, reps // 3))
            rows.append({"op": "adamw", "dtype": dname, "log2n": e, "opbytes": n * es, "bytes": nbytes,
                         "fg_ms": t_fg * 1e3,
                         "np_ms": t_np * 1e3 if t_np else None, "fg_gbs": nbytes / t_fg / 1e9})
            print(f"  adamw {dname} 2^{e}: fastgrad {t_fg * 1e3:.3f} ms"
                  + (f", numpy {t_np * 1e3:.3f} ms" if t_np else ""), flush=True)
            del a, b, out, tmp, out2, p, g, m, v, t1, t2
    return rows


# ------------------------------------------------------------------ fused families

def gelu_tanh_np(pre):
    k = np.float32(np.sqrt(2 / np.pi))
    u = k * (pre + np.float32(0.044715) * pre ** 3)
    t = np.tanh(u)
    y = 0.5 * pre * (1 + t)
    slope = 0.5 * (1 + t) + 0.5 * pre * (1 - t * t) * k * (1 + 3 * np.float32(0.044715) * pre * pre)
    return y, slope


def act_rows(reps, N=8192, K=256, M=1024):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, K), dtype=np.float32)
    w = (rng.standard_normal((M, K), dtype=np.float32) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(M, dtype=np.float32) * 0.1
    dy = rng.standard_normal((N, M), dtype=np.float32)
    y = np.empty((N, M), np.float32)
    dx, dw, db = np.empty((N, K), np.float32), np.empty((M, K), np.float32), np.empty(M, np.float32)
    pre = np.empty((N, M), np.float32)

    # preallocated y and pre, and the backward forming g in pre's memory (consume_pre: pre is
    # dead after the backward in training), so that neither side pays for fresh pages per call
    def fwd():
        ops.run("linear_act_forward", dict(x=x, w=w, b=b, y=y, pre=pre), options=ops._act_options("gelu_tanh"))

    def bwd():
        fg.linear_act_backward(dy, x, w, b, pre=pre, act="gelu_tanh", out=(dx, dw, db), consume_pre=True)

    def both():
        fwd()
        bwd()

    z = np.empty((N, M), np.float32)

    def gemms():
        fg.linear_forward(x, w, out=z)
        fg.linear_backward_input(dy, w, out=dx)
        fg.linear_backward_weight(dy, x, out=dw)

    def np_both():
        pre = x @ w.T + b
        yy, slope = gelu_tanh_np(pre)
        g = dy * slope
        return yy, g @ w, g.T @ x, g.sum(0)

    def np_gemms():
        np.matmul(x, w.T, out=z)
        np.matmul(dy, w, out=dx)
        np.matmul(dy.T, x, out=dw)

    fwd()
    t_f, t_b, t_both, t_g = timed(fwd, reps), timed(bwd, reps), timed(both, reps), timed(gemms, reps)
    t_np, t_npg = timed(np_both, max(3, reps // 2)), timed(np_gemms, reps)
    flops = 3 * 2.0 * N * K * M
    print(f"  linear_act: fwd {t_f * 1e3:.2f} bwd {t_b * 1e3:.2f} both {t_both * 1e3:.2f} gemms {t_g * 1e3:.2f} ms",
          flush=True)
    return {"shape": f"{N}x{K}->{M}", "fwd_ms": t_f * 1e3, "bwd_ms": t_b * 1e3, "both_ms": t_both * 1e3,
            "gemms_ms": t_g * 1e3, "np_ms": t_np * 1e3, "np_gemms_ms": t_npg * 1e3, "gflop": flops / 1e9}


def logp_rows(reps, N=1024, D=256, V=32768):
    rng = np.random.default_rng(6)
    h = rng.standard_normal((N, D), dtype=np.float32)
    w = (rng.standard_normal((V, D), dtype=np.float32) / np.sqrt(D)).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    dlogp = np.full(N, -1.0 / N, np.float32)
    dh, dw = np.empty((N, D), np.float32), np.empty((V, D), np.float32)
    state = {}

    def fwd():
        state["logp"], state["lse"], _ = fg.linear_logp_forward(h, w, t)

    def bwd():
        fg.linear_logp_backward(h, w, t, state["lse"], dlogp=dlogp, need=(True, True, False), out=(dh, dw, None))

    def both():
        fwd()
        bwd()

    z = np.empty((N, V), np.float32)

    def gemms():  # the fused op's four products: z (forward), z again, dh, dw (backward)
        fg.linear_forward(h, w, out=z)
        fg.linear_forward(h, w, out=z)
        fg.linear_backward_input(z, w, out=dh)
        fg.linear_backward_weight(z, h, out=dw)

    def np_both():
        zz = h @ w.T
        m = zz.max(1, keepdims=True)
        e = np.exp(zz - m)
        s = e.sum(1, keepdims=True)
        logp = (zz[np.arange(N), t] - m[:, 0] - np.log(s[:, 0]))
        p = e / s
        p[np.arange(N), t] -= 1.0
        p *= -dlogp[:, None]
        return logp, p @ w, p.T @ h

    def np_gemms():
        np.matmul(h, w.T, out=z)
        np.matmul(z, w, out=dh)
        np.matmul(z.T, h, out=dw)

    fwd()
    t_f, t_b, t_both, t_g = timed(fwd, reps), timed(bwd, reps), timed(both, reps), timed(gemms, reps)
    t_np, t_npg = timed(np_both, max(3, reps // 2)), timed(np_gemms, reps)
    print(f"  linear_logp: fwd {t_f * 1e3:.2f} bwd {t_b * 1e3:.2f} both {t_both * 1e3:.2f} gemms {t_g * 1e3:.2f} ms",
          flush=True)
    return {"shape": f"{N}x{D}x{V}", "fwd_ms": t_f * 1e3, "bwd_ms": t_b * 1e3, "both_ms": t_both * 1e3,
            "gemms_ms": t_g * 1e3, "np_ms": t_np * 1e3, "np_gemms_ms": t_npg * 1e3}


# ------------------------------------------------------------------ the table

def fmt(v, f="{:.2f}"):
    return "—" if v is None else f.format(v)


def table(res, base=None):
    """Markdown of a run; with base (an earlier run's rows), 'before' columns beside."""
    c = res["ceilings"]
    L = []
    L.append(f"Machine: {res['machine']}; threads: {res['threads']}; each time the "
             f"{'fastest' if res.get('stat') == 'min' else 'median'} of its samples.")
    L.append("")
    copies = ", ".join(f"{int(k) / 2**20:g} MiB {v:.1f}" for k, v in sorted(c["copy"].items(), key=lambda kv: int(kv[0])))
    L.append(f"Ceilings (same run): copy bandwidth, read + written, by array size (the best of numpy's copy on one "
             f"thread and on one thread per core): {copies} GB/s; sgemm 2048³ numpy {c['np_sgemm_gflops']:.0f} GFLOP/s"
             + (f", libfastgrad's OpenBLAS {c['fg_blas_sgemm_gflops']:.0f} GFLOP/s" if "fg_blas_sgemm_gflops" in c
                else "") + ".")
    L.append("")

    def bkey(kind, r):
        if not base:
            return None
        for br in base.get(kind, []):
            if all(br.get(k) == r.get(k) for k in ("op", "size", "dtype", "log2n", "shape") if k in r):
                return br
        return None

    L.append("### GEMM-backed ops, f32 (square n³)")
    L.append("")
    hdr = "| op | n | fastgrad ms | GFLOP/s | numpy ms | numpy / fastgrad | OpenBLAS direct ms |"
    sep = "|---|---:|---:|---:|---:|---:|---:|"
    if base:
        hdr += " before ms | before numpy / fastgrad |"
        sep += "---:|---:|"
    L += [hdr, sep]
    for r in res["gemm"]:
        line = (f"| {r['op']} | {r['size']} | {r['fg_ms']:.3f} | {r['fg_gflops']:.0f} | {r['np_ms']:.3f} | "
                f"{r['np_ms'] / r['fg_ms']:.2f}× | {fmt(r.get('blas_ms'), '{:.3f}')} |")
        b = bkey("gemm", r)
        if base:
            line += (f" {b['fg_ms']:.3f} | {b['np_ms'] / b['fg_ms']:.2f}× |" if b else " — | — |")
        L.append(line)
    L.append("")
    L.append("### Streams (elementwise, AdamW): GB/s of the bytes the op must read + write")
    L.append("")
    hdr = "| op | dtype | n | fastgrad ms | GB/s | % of copy | numpy ms | numpy / fastgrad |"
    sep = "|---|---|---:|---:|---:|---:|---:|---:|"
    if base:
        hdr += " before GB/s | before % copy | before numpy / fastgrad |"
        sep += "---:|---:|---:|"
    L += [hdr, sep]
    for r in res["stream"]:
        pct = 100 * r["fg_gbs"] / c["copy"][str(r["opbytes"])]
        ratio = r["np_ms"] / r["fg_ms"] if r["np_ms"] else None
        line = (f"| {r['op']} | {r['dtype']} | 2^{r['log2n']} | {r['fg_ms']:.3f} | {r['fg_gbs']:.1f} | {pct:.0f}% | "
                f"{fmt(r['np_ms'], '{:.3f}')} | {fmt(ratio, '{:.2f}×')} |")
        if base:
            b = bkey("stream", r)
            if b:
                bc = base["ceilings"]["copy"].get(str(b.get("opbytes", r["opbytes"])), c["copy"][str(r["opbytes"])])
                br = b["np_ms"] / b["fg_ms"] if b["np_ms"] else None
                line += f" {b['fg_gbs']:.1f} | {100 * b['fg_gbs'] / bc:.0f}% | {fmt(br, '{:.2f}×')} |"
            else:
                line += " — | — | — |"
        L.append(line)
    L.append("")
    L.append("### Fused families, f32, forward + backward against their products alone")
    L.append("")
    hdr = "| op | shape | fwd ms | bwd ms | fwd+bwd ms | its GEMMs ms | ratio | numpy fwd+bwd ms | numpy GEMMs ms |"
    sep = "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    if base:
        hdr += " before fwd+bwd ms | before ratio |"
        sep += "---:|---:|"
    L += [hdr, sep]
    for key, name in (("act", "linear_act gelu_tanh"), ("logp", "linear_logp")):
        r = res.get(key)
        if not r:
            continue
        line = (f"| {name} | {r['shape']} | {r['fwd_ms']:.2f} | {r['bwd_ms']:.2f} | {r['both_ms']:.2f} | "
                f"{r['gemms_ms']:.2f} | {r['both_ms'] / r['gemms_ms']:.2f}× | {r['np_ms']:.2f} | {r['np_gemms_ms']:.2f} |")
        if base and base.get(key):
            b = base[key]
            line += f" {b['both_ms']:.2f} | {b['both_ms'] / b['gemms_ms']:.2f}× |"
        elif base:
            line += " — | — |"
        L.append(line)
    L.append("")
    return "\n".join(L)


def measure(args, res, only):
    """Runs the row groups in `only`; returns res with them."""
    reps = 5 if args.quick else 7
    print(f"fastgrad {fg.__version__} from {_lib.lib._name}", flush=True)
    dtypes = ["f32"] + (["bf16"] if BF16 is not None else [])
    exps = [20, 24] if args.quick else [20, 22, 24, 26]
    sizes = [(1 << e) * (4 if d == "f32" else 2) for e in exps for d in dtypes]
    res["ceilings"] = ceilings(reps, args.quick, sizes)
    res["gemm"] = gemm_rows([256, 1024] if args.quick else [256, 512, 1024, 2048], reps) if "gemm" in only else []
    res["stream"] = stream_rows(exps, dtypes, reps, 22) if "stream" in only else []
    if "act" in only:
        res["act"] = act_rows(reps) if not args.quick else act_rows(reps, N=4096)
    if "logp" in only:
        res["logp"] = logp_rows(reps) if not args.quick else logp_rows(reps, V=16384)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller maxima (< 2 minutes)")
    ap.add_argument("--write", action="store_true", help="write docs/benchmarks-cpu.md")
    ap.add_argument("--write-to", help="write the page here instead")
    ap.add_argument("--json", help="save the rows to this file")
    ap.add_argument("--compare", help="an earlier --json run: print 'before' columns beside")
    ap.add_argument("--only", default="gemm,stream,act,logp", help="comma list of row groups")
    ap.add_argument("--from-json", help="render an earlier --json run instead of measuring")
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="per row: the median of the samples, or the fastest (for a machine shared with other work)")
    args = ap.parse_args()
    global STAT
    STAT = min if args.stat == "min" else statistics.median
    only = set(args.only.split(","))
    res = {"machine": f"{platform.processor() or platform.machine()}, {CORES} cores, numpy {np.__version__}"
           + (f", torch {torch.__version__}" if torch else ", no torch"),
           "threads": ", ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                                 "OMP_WAIT_POLICY") if k in os.environ) or "defaults",
           "library": _lib.lib._name, "stat": args.stat}
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
    else:
        res = measure(args, res, only)
    base = None
    if args.compare:
        with open(args.compare) as f:
            base = json.load(f)
    md = table(res, base)
    print()
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.write or args.write_to:
        path = args.write_to or os.path.join(ROOT, "docs", "benchmarks-cpu.md")
        head = ("# fastgrad CPU benchmarks\n\nWritten by `python3 bench/compare_cpu.py --write` (`--compare "
                "BEFORE.json` adds the before columns): every CPU op through the Python package beside numpy's "
                "equivalent, in one run on this machine, against the copy bandwidth and sgemm rate measured in "
                "the same run. Ratios are the point; absolute times depend on the machine. Medians of repeats; "
                "on a 2-core machine shared with other work, a 2-thread pass waits a scheduler slice (~6 ms) "
                "whenever another process holds one core, so run it on an idle machine (under `nice -n -15` "
                "where allowed).\n\n")
        with open(path, "w") as f:
            f.write(head + md + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

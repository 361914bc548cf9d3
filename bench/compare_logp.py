"""The linear log-prob / cross-entropy rows of bench/compare.py: fastgrad (split
forward + backward, and the one-pass cross-entropy) against PyTorch eager (bf16
matmul, f32 log_softmax, gather), torch.compile of the same function, Liger Kernel's
fused linear cross-entropy and Cut Cross-Entropy, in one run on the same inputs.

Time: median of CUDA-event timings after warm-up. Memory: max_memory_allocated above
the inputs during one call, minus the gradient tensors every side returns (h.grad,
w.grad), i.e. what the method itself holds. The loss every side computes is printed
next to its time so the rows can be seen to agree.
"""
import statistics

import torch

import fastgrad as fg
from fastgrad import ops

REPS = 10
SHAPES = [(4096, 2048, 151936), (8192, 4096, 128256), (4096, 2048, 32768)]


def eager_logp(h, w, t):
    logits = h @ w.t()
    return torch.log_softmax(logits.float(), -1).gather(1, t[:, None])[:, 0]


def peers():
    """Implementations of mean cross-entropy, fwd+bwd: name -> fn(h, w, t) -> loss."""
    impls = {}
    compiled = torch.compile(eager_logp)
    impls["torch eager"] = lambda h, w, t: -eager_logp(h, w, t).mean()
    impls["torch.compile"] = lambda h, w, t: -compiled(h, w, t).mean()
    impls["fastgrad split"] = lambda h, w, t: -fg.linear_logp(h, w, t).mean()
    impls["fastgrad one-pass"] = lambda h, w, t: fg.linear_cross_entropy(h, w, t)
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss()
        impls["Liger"] = lambda h, w, t: liger(w, h, t)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"logp: Liger Kernel not available: {e}")
    try:
        from cut_cross_entropy import linear_cross_entropy as cce
        impls["Cut CE"] = lambda h, w, t: cce(h, w, t)
    except Exception as e:  # noqa: BLE001
        print(f"logp: Cut Cross-Entropy not available: {e}")
    return impls, compiled


def timed(fn, reps=REPS):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ev = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        ev.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def peak(fn, minus=0, before=None):
    if before:
        before()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    p = torch.cuda.max_memory_allocated() - base - minus
    del out
    return p


def run(shapes=SHAPES):
    """Returns (markdown lines, summary lines)."""
    impls, compiled = peers()
    md = ["", "## Linear log-prob / cross-entropy (bf16, no bias, mean over rows)", "",
          "Peers: liger-kernel 0.8.5 (`LigerFusedLinearCrossEntropyLoss`), cut-cross-entropy 25.1.1 "
          "(`linear_cross_entropy`, default options), installed from wheels on the GPU machine. "
          "Forward: log-prob per row (fastgrad: `linear_logp_forward`; eager and compile: bf16 matmul, f32 "
          "log_softmax, gather; Liger and Cut CE: their fused loss under no_grad). Forward + backward: the mean "
          "cross-entropy and the gradients of h and w. Peak extra = max_memory_allocated above the inputs, minus "
          "the h and w gradients every method returns.", "",
          "| shape N, D, V | method | fwd ms | fwd+bwd ms | peak extra MiB (fwd+bwd) | loss | fwd+bwd vs eager |",
          "|---|---|---|---|---|---|---|"]
    summary = []
    for n, d, v in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        h = (torch.randn(n, d, device="cuda", generator=g) * 0.5).bfloat16().requires_grad_(True)
        w = (torch.randn(v, d, device="cuda", generator=g) * d ** -0.5).bfloat16().requires_grad_(True)
        t = torch.randint(0, v, (n,), device="cuda", generator=g)
        grads = (h.numel() + w.numel()) * 2
        res = {}
        for name, fn in impls.items():
            hd, wd = h.detach(), w.detach()
            if name == "fastgrad split":
                fwd = lambda: ops.linear_logp_forward(hd, wd, t)  # noqa: E731
            elif name == "fastgrad one-pass":
                fwd = None  # it computes the gradients in its forward: see fwd+bwd
            elif name == "torch eager":
                fwd = lambda: eager_logp(hd, wd, t)  # noqa: E731
            elif name == "torch.compile":
                fwd = lambda: compiled(hd, wd, t)  # noqa: E731
            else:
                fwd = lambda: fn(hd, wd, t)  # noqa: E731

            def clear():
                h.grad = w.grad = None

            def step():
                h.grad = w.grad = None
                loss = fn(h, w, t)
                loss.backward()
                return loss

            try:
                with torch.no_grad():
                    f_ms = timed(fwd) if fwd else float("nan")
                b_ms = timed(step)
                mem = peak(step, grads, before=clear)
                loss = float(fn(h, w, t).detach())
                torch.cuda.synchronize()
                fg.context_check(h.device)
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                print(f"logp {name} {n}x{d}x{v}: failed: {type(e).__name__}: {str(e)[:200]}")
                res[name] = None
                continue
            finally:
                h.grad = w.grad = None
                torch.cuda.empty_cache()
            res[name] = (f_ms, b_ms, mem, loss)
            print(f"logp {n}x{d}x{v} {name:<18} fwd {f_ms:8.3f} ms  fwd+bwd {b_ms:8.3f} ms  "
                  f"peak extra {mem / 2**20:9.1f} MiB  loss {loss:.5f}", flush=True)
        # the split C API called directly (functional ops, outputs allocated once), no autograd
        try:
            hd, wd = h.detach(), w.detach()
            dl = torch.full((n,), -1.0 / n, device="cuda")
            dh, dw = torch.empty_like(hd), torch.empty_like(wd)

            def split_ops():
                _, lse, _ = ops.linear_logp_forward(hd, wd, t)
                ops.linear_logp_backward(hd, wd, t, lse, dlogp=dl, need=(True, True, False), out=(dh, dw, None))

            f_ms = res["fastgrad split"][0] if res.get("fastgrad split") else float("nan")
            a_ms = timed(lambda: fg.linear_logp(h, w, t))  # autograd forward: graph built, no backward
            print(f"logp {n}x{d}x{v} fastgrad split, autograd fwd only {a_ms:8.3f} ms (functional {f_ms:.3f})")
            b_ms = timed(split_ops)
            mem = peak(split_ops)
            res["fastgrad split (C API)"] = (f_ms, b_ms, mem, res["fastgrad split"][3] if res.get("fastgrad split") else 0)
            print(f"logp {n}x{d}x{v} fastgrad split, C API fwd+bwd {b_ms:8.3f} ms  peak extra {mem / 2**20:9.1f} MiB",
                  flush=True)
            del dh, dw
        except Exception as e:  # noqa: BLE001
            print(f"logp split C API {n}x{d}x{v}: failed: {e}")
        eager = res.get("torch eager")
        for name, r in res.items():
            if r is None:
                md.append(f"| {n}, {d}, {v} | {name} | failed | | | | |")
                continue
            ratio = f"{r[1] / eager[1]:.2f}x" if eager else ""
            md.append(f"| {n}, {d}, {v} | {name} | {r[0]:.3f} | {r[1]:.3f} | {r[2] / 2**20:.1f} | {r[3]:.5f} | {ratio} |")
        if eager and res.get("fastgrad split"):
            s, e = res["fastgrad split"], eager
            sc = res.get("fastgrad split (C API)")
            line = (f"logp {n}x{d}x{v}: fwd {s[0] / e[0]:.2f}x eager time (target <= 0.8), split fwd+bwd "
                    f"{s[1] / e[1]:.2f}x (autograd) {sc[1] / e[1] if sc else float('nan'):.2f}x (C API) (<= 1.0), "
                    f"peak {100 * s[2] / max(e[2], 1):.1f}% of eager (<= 5%)")
            c, o = res.get("torch.compile"), res.get("fastgrad one-pass")
            if c and o:
                line += f", one-pass {o[1] / c[1]:.2f}x compile (<= 1.0)"
            for peer in ("Liger", "Cut CE"):
                p = res.get(peer)
                if p:
                    line += f", {peer} {p[1]:.2f} ms vs split {s[1]:.2f} / one-pass {o[1] if o else float('nan'):.2f}"
            summary.append(line)
        del h, w, t
        torch.cuda.empty_cache()
    return md, summary

#!/usr/bin/env python3
"""compare_encoder.py — the fused transformer encoder layer side by side with PyTorch, in one run on
the GPU: a training step's forward + backward (the gradients of the input and of every parameter) of

  (a) the reference PatchTST encoder (3 layers, d_model 128, 16 heads, d_ff 256, 42 patches,
      BatchNorm post-norm, residual attention, GELU, dropout 0.2, training mode) on B·vars = 4096
      and 10272 sequences, f32 and bf16: python/tests/patchtst_ref.TSTEncoder eager, torch.compile
      of it, fg.PatchTSTEncoder with the same state_dict;
  (b) one GPT-2-small layer (d 768, 12 heads, d_ff 3072, pre-norm LayerNorm, GELU, causal,
      B 8 × L 1024, dropout 0.1, bf16): torch.nn.TransformerEncoderLayer(norm_first=True,
      batch_first=True) eager, torch.compile of it, fg.TransformerEncoderLayer.

Time: compare.py's timed_together (CUDA events around blocks of calls after warm-up, the median
over rounds, inputs rotated between two sets, the implementations interleaved). Memory:
torch.cuda.max_memory_allocated() during one step above what was allocated before it (weights
and inputs excluded; fastgrad's cache and the backward's workspace come from torch's caching
allocator; the library context's own workspace, where the layer's parts run, does not, so it is
released before fastgrad's step and what it holds after the step is added: fg.workspace_bytes).
An implementation that fails (a torch.compile that does not build, an out-of-memory) is reported
as such and the others still run. Prints a markdown table.

    PYTHONPATH=python python3 bench/compare_encoder.py [--quick] [--out docs/benchmarks-encoder.md]
"""
import argparse
import copy
import os
import sys
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))

import fastgrad as fg  # noqa: E402
import patchtst_ref  # noqa: E402
from compare import peak_extra, timed_together  # noqa: E402

TARGETS = {  # the targets: fastgrad's time ≤ ratio × compile's (PatchTST), speed-ups (GPT-2)
    ("patchtst", torch.float32): "time ≤ 0.5× compile, peak ≤ 0.5× compile",
    ("patchtst", torch.bfloat16): "time ≤ 0.4× compile, peak ≤ 0.5× compile",
    ("gpt2", torch.bfloat16): "≥ 1.2× eager, ≥ 1.05× compile, peak ≤ compile",
}


class Step:
    """One training step of a module: y = module(x, **kw), then the gradients of x and of every
    parameter that learns (torch.autograd.grad, so nothing accumulates between calls)."""

    def __init__(self, module, **kw):
        self.module, self.kw = module, kw
        self.params = [p for p in module.parameters() if p.requires_grad]

    def __call__(self, x, dy):
        y = self.module(x, **self.kw)
        return (y,) + torch.autograd.grad(y, [x] + self.params, dy)


def patchtst_case(n, dtype, dropout, save="all"):
    torch.manual_seed(0)
    ref = patchtst_ref.TSTEncoder(3, 128, 16, 256, dropout, 0.0, "gelu", True, "BatchNorm").cuda().to(dtype)
    ours = fg.PatchTSTEncoder(3, 128, 16, 256, dropout, 0.0, "gelu", True, "BatchNorm", save=save).cuda().to(dtype)
    ours.load_state_dict(ref.state_dict())
    ref_c = copy.deepcopy(ref)  # compile's own copy: its BatchNorm statistics move on their own
    ref.train(), ref_c.train(), ours.train()

    def make():
        x = torch.randn(n, 42, 128, device="cuda", dtype=dtype).requires_grad_(True)
        return x, torch.randn_like(x)

    impls = [("torch eager", lambda: Step(ref)), ("torch.compile", lambda: Step(torch.compile(ref_c))),
             ("fastgrad", lambda: Step(ours))]
    return dict(kind="patchtst", name="PatchTST encoder fwd+bwd", shape=f"B·vars={n} L=42 d=128 H=16 ff=256 ×3",
                dtype=dtype, make=make, impls=impls)


def gpt2_case(b, l, dtype, dropout, save="all"):
    torch.manual_seed(0)
    kw = dict(dim_feedforward=3072, dropout=dropout, activation="gelu", batch_first=True, norm_first=True)
    ref = torch.nn.TransformerEncoderLayer(768, 12, **kw).cuda().to(dtype)
    ours = fg.TransformerEncoderLayer(768, 12, **kw, save=save).cuda().to(dtype)
    ours.load_state_dict(ref.state_dict())
    ref_c = copy.deepcopy(ref)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(l, device="cuda", dtype=dtype)

    def make():
        x = torch.randn(b, l, 768, device="cuda", dtype=dtype).requires_grad_(True)
        return x, torch.randn_like(x)

    impls = [("torch eager", lambda: Step(ref, src_mask=mask, is_causal=True)),
             ("torch.compile", lambda: Step(torch.compile(ref_c), src_mask=mask, is_causal=True)),
             ("fastgrad", lambda: Step(ours, is_causal=True))]
    return dict(kind="gpt2", name="GPT-2-small layer fwd+bwd", shape=f"B={b} L={l} d=768 H=12 ff=3072 causal",
                dtype=dtype, make=make, impls=impls)


def rel_err(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run_case(case, rounds, block):
    """{label: (ms, peak bytes) or an error string}, and fastgrad's output error against eager's."""
    sets = [case["make"](), case["make"]()]
    ready, result = [], {}
    for label, build in case["impls"]:
        try:
            fn = build()
            fn(*sets[0])  # builds (torch.compile) and warms
            fn(*sets[1])
            torch.cuda.synchronize()
            ready.append((label, fn))
        except Exception as e:  # noqa: BLE001 - one failing side must not end the run
            result[label] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            print(f"  {label}: {result[label]}", flush=True)
            traceback.print_exc(limit=3)
            torch.cuda.empty_cache()
    check = None
    names = [label for label, _ in ready]
    if "fastgrad" in names and "torch eager" in names:
        # the same step, dropout aside: compare the outputs with dropout off (eval would change
        # BatchNorm), by a step with the rates zeroed
        check = agreement(case, sets[0])
    if ready:
        try:
            times = timed_together([fn for _, fn in ready], sets, rounds=rounds, block=block)
        except Exception as e:  # noqa: BLE001
            times = [float("nan")] * len(ready)
            print(f"  timing failed: {e}", flush=True)
        for (label, fn), ms in zip(ready, times):
            try:
                if label == "fastgrad":
                    # the layer's parts run on the context's own workspace, which torch's
                    # statistics do not see: release it, so that it grows to this step's need
                    # alone, and count what it then holds
                    fg.release_workspace(torch.device("cuda"))
                mem = peak_extra(fn, sets[0])
                if label == "fastgrad":
                    mem += fg.workspace_bytes(torch.device("cuda"))
            except Exception:  # noqa: BLE001
                mem = float("nan")
            result[label] = (ms, mem)
    del sets
    torch.cuda.empty_cache()
    return result, check


def agreement(case, xs):
    """fastgrad's output against eager's on the same input, dropout set to 0 on both (training mode)."""
    try:
        mods = {}
        for label, build in case["impls"]:
            if label in ("fastgrad", "torch eager"):
                mods[label] = build().module
        saved = {}
        for label, m in mods.items():
            for name, sub in m.named_modules():
                if isinstance(sub, torch.nn.Dropout):
                    saved[(label, name)] = sub.p
                    sub.p = 0.0
            if hasattr(m, "self_attn") and hasattr(m.self_attn, "dropout"):
                saved[(label, "self_attn")] = m.self_attn.dropout
                m.self_attn.dropout = 0.0
        kw = {"is_causal": True} if case["kind"] == "gpt2" else {}
        with torch.no_grad():
            bn = [(b, b.running_mean.clone(), b.running_var.clone(), b.num_batches_tracked.clone())
                  for m in mods.values() for b in m.modules() if isinstance(b, torch.nn.BatchNorm1d)]
            x = xs[0].detach()
            if case["kind"] == "gpt2":
                mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device="cuda", dtype=x.dtype)
                e = mods["torch eager"](x, src_mask=mask, is_causal=True)
            else:
                e = mods["torch eager"](x)
            o = mods["fastgrad"](x, **kw)
            for b, rm, rv, nb in bn:  # a check leaves the statistics as they were
                b.running_mean.copy_(rm), b.running_var.copy_(rv), b.num_batches_tracked.copy_(nb)
        for (label, name), p in saved.items():
            m = mods[label]
            if name == "self_attn":
                m.self_attn.dropout = p
            else:
                m.get_submodule(name).p = p
        return rel_err(o, e)
    except Exception as e:  # noqa: BLE001
        print(f"  agreement check failed: {e}", flush=True)
        return float("nan")


def fmt_ms(r):
    return f"{r[0]:.2f}" if isinstance(r, tuple) else "fail"


def fmt_gb(r):
    return f"{r[1] / 1e9:.2f}" if isinstance(r, tuple) else "—"


def ratio(a, b, key):
    if not (isinstance(a, tuple) and isinstance(b, tuple)):
        return "—"
    return f"{a[key] / b[key]:.2f}×"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds; B·vars 4096 only")
    ap.add_argument("--only", choices=["all", "patchtst", "gpt2"], default="all")
    ap.add_argument("--patchtst-dropout", type=float, default=0.2)
    ap.add_argument("--gpt2-dropout", type=float, default=0.1)
    ap.add_argument("--save", choices=["all", "less", "min"], default="all",
                    help="fastgrad's saved-activation policy (the layers' save=): memory for time")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rounds, block = (4, 2) if args.quick else (10, 3)
    cases = []
    if args.only in ("all", "patchtst"):
        for n in ([4096] if args.quick else [4096, 10272]):
            for dtype in (torch.float32, torch.bfloat16):
                cases.append(lambda n=n, dtype=dtype: patchtst_case(n, dtype, args.patchtst_dropout, args.save))
    if args.only in ("all", "gpt2"):
        cases.append(lambda: gpt2_case(8, 1024, torch.bfloat16, args.gpt2_dropout, args.save))
    rows = []
    for make in cases:
        try:
            case = make()
        except Exception as e:  # noqa: BLE001
            print(f"case setup failed: {e}", flush=True)
            traceback.print_exc(limit=3)
            continue
        print(f"{case['name']} {case['shape']} {str(case['dtype']).replace('torch.', '')}", flush=True)
        result, check = run_case(case, rounds, block)
        for label, r in result.items():
            print(f"  {label:<14} {fmt_ms(r):>8} ms  peak +{fmt_gb(r)} GB", flush=True)
        rows.append((case, result, check))
        del case
        torch.cuda.empty_cache()
    labels = ["torch eager", "torch.compile", "fastgrad"]
    lines = [f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; fastgrad {fg.__version__}; "
             f"TF32 off; training mode, forward + backward (input and parameter gradients); median of "
             f"{rounds} rounds × {block} calls.", "",
             "| case | shape | dtype | eager ms | compile ms | fastgrad ms | fastgrad / eager time | "
             "fastgrad / compile time | eager GB | compile GB | fastgrad GB | fastgrad / compile peak | "
             "rel. err vs eager | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, r, check in rows:
        e, c, o = (r.get(label, "not run") for label in labels)
        lines.append(f"| {case['name']} | {case['shape']} | {str(case['dtype']).replace('torch.', '')} | "
                     f"{fmt_ms(e)} | {fmt_ms(c)} | {fmt_ms(o)} | {ratio(o, e, 0)} | {ratio(o, c, 0)} | "
                     f"{fmt_gb(e)} | {fmt_gb(c)} | {fmt_gb(o)} | {ratio(o, c, 1)} | "
                     f"{'—' if check is None else f'{check:.1e}'} | {TARGETS.get((case['kind'], case['dtype']), '')} |")
    failures = [f"- {case['name']} {str(case['dtype']).replace('torch.', '')} {label}: {v}"
                for case, r, _ in rows for label, v in r.items() if isinstance(v, str)]
    if failures:
        lines += ["", "Failed:"] + failures
    table = "\n".join(lines)
    print("\n" + table, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()

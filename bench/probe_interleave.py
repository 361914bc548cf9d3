"""Developer's probe: does timing fastgrad interleaved with eager / compile (compare.py) change
fastgrad's time at the small linear + activation shape, and does the allocator do device
allocations meanwhile? Prints medians and cudaMalloc counts per arrangement."""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "bench")
from compare import timed_together  # noqa: E402
from fastgrad import ops  # noqa: E402


def main(n=172032, k=128, m=256, act="relu"):
    mk = lambda *s, g=False: (torch.rand(*s, device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_(g)  # noqa
    sets = [(mk(n, k, g=True), mk(m, k, g=True), mk(m, g=True), mk(n, m)) for _ in range(2)]
    fn = {"relu": F.relu, "silu": F.silu}[act]

    def ours(x, w, b, dy):
        relu = act == "relu"
        y, pre = ops.linear_act_forward(x.detach(), w.detach(), b.detach(), act, keep_pre=not relu)
        return (y,) + ops.linear_act_backward(dy, x.detach(), w.detach(), b.detach(), y if relu else pre, act,
                                              consume_pre=not relu)

    def eager(x, w, b, dy):
        out = fn(F.linear(x, w, b))
        return (out,) + torch.autograd.grad(out, (x, w, b), dy)

    comp = torch.compile(lambda x, w, b: fn(F.linear(x, w, b)))

    def compiled(x, w, b, dy):
        out = comp(x, w, b)
        return (out,) + torch.autograd.grad(out, (x, w, b), dy)

    for label, fns in (("ours alone", [ours]), ("eager alone", [eager]), ("ours+eager", [ours, eager]),
                       ("ours+eager+compile", [ours, eager, compiled]), ("ours alone again", [ours])):
        before = torch.cuda.memory_stats().get("num_device_alloc", 0)
        ms = timed_together(fns, sets)
        after = torch.cuda.memory_stats().get("num_device_alloc", 0)
        print(f"{act} {label:<22}: " + " ".join(f"{v:.4f}" for v in ms) + f" ms; cudaMalloc calls {after - before}")


if __name__ == "__main__":
    for a in ("relu", "silu"):
        main(act=a)

"""Data-parallel training with fastgrad: synchronized BatchNorm over torch.distributed.

fg.SyncBatchNorm is a drop-in for torch.nn.SyncBatchNorm on x [N, C, *] (the channel is dim 1,
as torch's BatchNorm1d / SyncBatchNorm take it; [N, C] and [N, C, L] are the usual shapes).
The library's BatchNorm is channels last ([..., C], every leading dim a batch row), so the
module hands the kernels x moved to channels last — a free view when x already is a transposed
view of channels-last memory (PatchTST's Transpose → BatchNorm1d → Transpose), a copy
otherwise — and sync_batch_norm takes channels-last x [..., C] directly.

It is the library's split form (include/fastgrad.h, fg_batch_norm_stats / _apply):
  forward:  local f64 sums {Σ s [C], Σ s² [C], N} → dist.all_reduce (a plain sum) → apply
            (mean, biased variance normalize; running_var takes the unbiased variance of
            the whole batch, as torch)
  backward: local f64 sums {Σ dy [C], Σ dy·x̂ [C], N} → dist.all_reduce → dx
Weight and bias gradients are this rank's share (Σ over its rows, read off the local sums
before the all-reduce), as torch.nn.SyncBatchNorm returns them: DDP's gradient averaging then
gives the gradient of the global-batch loss. Ranks may hold different numbers of rows.
Without an initialized process group, or with world size 1, it is plain fg.BatchNorm1d; in
evaluation it normalizes with the running statistics and communicates nothing.

The all-reduces are torch.distributed calls in eager mode (no torch.compile route yet: a
compiled model breaks the graph here).
"""
import torch
import torch.distributed as dist

from .norm import (BatchNorm1d, _seed, batch_norm, batch_norm_apply, batch_norm_backward_apply,
                   batch_norm_backward_stats, batch_norm_stats, dropout_backward)
from .torch_ops import _call


def _contig(x):
    return x if x.is_contiguous() else x.contiguous()


def _synced(group):
    """Whether statistics must be all-reduced in this group (an initialized group of > 1 ranks)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


class SyncBatchNormFunction(torch.autograd.Function):
    """Training BatchNorm per channel of channels-last x [..., C] (of s = x + dropout(r)) with
    the statistics all-reduced over group; returns (y, s)."""

    @staticmethod
    def forward(ctx, x, r, weight, bias, running_mean, running_var, momentum, eps, p, seed, offset, group):
        x = _contig(x)
        r = _contig(r) if r is not None else None
        sums, s = _call(batch_norm_stats, x, r, p, seed, offset, True)
        dist.all_reduce(sums, group=group)
        xs = s if s is not None else x
        y, mean, rstd = _call(batch_norm_apply, xs, sums, weight, bias, running_mean, running_var, True, momentum,
                              eps)
        ctx.save_for_backward(xs, weight, mean, rstd)
        ctx.cfg = (p, seed, offset, r is not None, bias is not None, group,
                   weight.dtype if weight is not None else None, bias.dtype if bias is not None else None)
        return y, s

    @staticmethod
    def backward(ctx, dy, ds):
        xs, w, mean, rstd = ctx.saved_tensors
        p, seed, offset, has_r, has_b, group, wdt, bdt = ctx.cfg
        need_x, need_r = ctx.needs_input_grad[0], has_r and ctx.needs_input_grad[1]
        need_w = w is not None and ctx.needs_input_grad[2]
        need_b = has_b and ctx.needs_input_grad[3]
        dy = torch.zeros_like(xs) if dy is None else _contig(dy)
        local = _call(batch_norm_backward_stats, dy, xs, mean, rstd)
        c = xs.shape[-1]
        # this rank's share of the parameter gradients (DDP averages them across ranks)
        # (copies: the all-reduce below is in place, and .to(f64) of f64 sums would be a view)
        dw = local[c:2 * c].to(wdt, copy=True) if need_w else None
        db = local[:c].to(bdt, copy=True) if need_b else None
        dx = dr = None
        if need_x or need_r:  # the same on every rank (one model): the collectives pair up
            dist.all_reduce(local, group=group)
            dx, dr, _, _ = _call(batch_norm_backward_apply, dy, xs, w, mean, rstd, local, True, p, seed, offset,
                                 (need_x, need_r, False, False), has_b)
        if ds is not None:  # s's own gradient (its other uses) adds to x's and r's
            ds = _contig(ds)
            if dx is not None:
                dx = dx + ds
            if need_r:
                dr = dr + _call(dropout_backward, ds, p, seed, offset)
        return dx, dr, dw, db, None, None, None, None, None, None, None, None


def sync_batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=True, momentum=0.1,
                    eps=1e-5, r=None, p=0.0, process_group=None):
    """batch_norm (fastgrad.norm) for channels-last x [..., C] with the batch statistics of every
    rank in process_group (None: the default group). Evaluation, no initialized group or one
    rank: plain batch_norm. With r, of x + dropout(r), returning (y, s); each rank draws its
    dropout mask from its own stream (offset = rank), so masks differ from a single process's."""
    if not training or not _synced(process_group):
        return batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps, r, p)
    p = p if r is not None else 0.0
    seed = _seed() if p > 0 else 0
    offset = dist.get_rank(process_group) if p > 0 else 0
    y, s = SyncBatchNormFunction.apply(x, r, weight, bias, running_mean, running_var, momentum, eps, p, seed, offset,
                                       process_group)
    return (y, s) if r is not None else y


class SyncBatchNorm(BatchNorm1d):
    """Drop-in for torch.nn.SyncBatchNorm on x [N, C, *] (same parameters, buffers and state_dict
    as fg.BatchNorm1d / torch's BatchNorm). forward(x, residual=None, p=0.0) as fg.BatchNorm1d's.
    Training with an initialized process group of > 1 ranks: statistics over the whole global
    batch (momentum=None, the cumulative average, is not supported)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_group = process_group

    def forward(self, x, residual=None, p=0.0):
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"fastgrad: SyncBatchNorm({self.num_features}) takes [N, C, *], got {tuple(x.shape)}")
        if not (self.training and _synced(self.process_group)):
            if x.dim() <= 3:
                return super().forward(x, residual, p)
        shape = x.shape

        def last(t):  # [N, C, *] → channels last [N, L, C] (a view; the kernels copy if they must)
            return t if t.dim() == 2 else t.reshape(t.shape[0], t.shape[1], -1).transpose(1, 2)

        def back(t):
            return t if len(shape) == 2 else t.transpose(1, 2).reshape(shape)

        use_batch = self.training or self.running_mean is None
        rm, rv = self.running_mean, self.running_var
        if self.training and rm is not None:
            self.num_batches_tracked.add_(1)
        xl = last(x)
        rm_c = rm if rm is None or rm.dtype in (torch.float32, xl.dtype) else rm.to(torch.float32)
        rv_c = rv if rv is None or rv.dtype in (torch.float32, xl.dtype) else rv.to(torch.float32)
        out = sync_batch_norm(xl, rm_c, rv_c, self.weight, self.bias, use_batch, self.momentum, self.eps,
                              None if residual is None else last(residual), p,
                              self.process_group)
        if rm_c is not rm and rm is not None and use_batch:
            rm.copy_(rm_c), rv.copy_(rv_c)
        if residual is None:
            return back(out)
        y, s = out
        return back(y), back(s)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """module with every fg.BatchNorm1d replaced by an fg.SyncBatchNorm sharing its parameters
        and buffers (as torch.nn.SyncBatchNorm.convert_sync_batchnorm does for torch's BatchNorm;
        torch's own BatchNorm layers are left to that function)."""
        out = module
        if isinstance(module, BatchNorm1d) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        del module
        return out


convert_sync_batchnorm = SyncBatchNorm.convert_sync_batchnorm

__all__ = ["SyncBatchNorm", "SyncBatchNormFunction", "sync_batch_norm", "convert_sync_batchnorm"]

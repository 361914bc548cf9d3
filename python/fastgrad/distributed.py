"""Multi-GPU training with fastgrad over torch.distributed: synchronized BatchNorm (data
parallel) and a vocabulary-parallel linear log-prob / cross-entropy (a language-model head whose
weight rows are split across ranks).

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

Vocabulary parallelism (vocab_parallel_cross_entropy, vocab_parallel_logp): each rank holds the
rows [vocab_start, vocab_start + V_r) of the head's weight (and bias) and the same h and target
(global class ids). The library's split API (include/fastgrad.h, fg_linear_logp_shard_*):
  forward:  this slice's parts {lse_r, L[target] or 0, H_r} → one dist.all_gather of the
            stacked parts → combine, the ranks in order (the same bits on every rank) → logp,
            lse, entropy; the loss (row weights, z-loss, reductions) is torch on those [N] vectors
  backward: the log-prob backward with the global lse → this slice's dw, db and a partial dh
            (f32 for low-precision h) → dist.all_reduce SUM → dh
Label smoothing needs Σ_j L_j over the whole vocabulary and is refused (FastgradError,
FG_ERR_UNSUPPORTED). Without an initialized group or with one rank it is fg.linear_cross_entropy /
fg.linear_logp.

The all-reduces are torch.distributed calls in eager mode (no torch.compile route yet: a
compiled model breaks the graph here).
"""
import torch
import torch.distributed as dist

from . import ops
from .autograd import linear_cross_entropy, linear_logp
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


# ------------------------------------------------------------------ vocabulary parallelism

def _gather_rows(x, group):
    """[k, N] on every rank → [R, k, N], block r from rank r of the group."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.stack(parts)


class VocabParallelLogpFunction(torch.autograd.Function):
    """(logp, lse, entropy) over a vocabulary whose weight rows are split across the group's
    ranks; h [N, D] and target [N] are the same on every rank, w / b this rank's slice."""

    @staticmethod
    def forward(ctx, h, weight, bias, target, options, want_entropy, group):
        w = weight.contiguous()
        lse_r, tl_r, ent_r = ops.linear_logp_shard_forward(h, w, target, bias, entropy=want_entropy, options=options)
        # one collective: every rank gathers every rank's parts and combines them in rank order,
        # so all ranks hold the same bits (an all-reduce's order is the backend's)
        g = _gather_rows(torch.stack([lse_r, tl_r] + ([ent_r] if want_entropy else [])), group)
        ent_parts = g[:, 2].contiguous() if want_entropy else None
        logp, lse, ent = ops.linear_logp_shard_combine(target, g[:, 0].contiguous(), g[:, 1].contiguous(), ent_parts,
                                                       options=options)
        ctx.save_for_backward(h, w, bias, target, lse, ent)
        ctx.options, ctx.group = options, group
        if ent is None:
            return logp, lse, None
        return logp, lse, ent

    @staticmethod
    def backward(ctx, dlogp, dlse, dent):
        h, w, bias, target, lse, ent = ctx.saved_tensors
        need = ctx.needs_input_grad
        rd = lse.dtype

        def row(g):
            return None if g is None else g.to(rd).contiguous()

        dl, ds, de = row(dlogp), row(dlse), row(dent) if ent is not None else None
        if dl is None and ds is None and de is None:
            dl = torch.zeros_like(lse)
        # dh is a partial sum over this slice's classes: f32 (f64 for f64) before the all-reduce,
        # then h's dtype; the same need on every rank (one model), so the collectives pair up
        dh_acc = torch.empty(h.shape, dtype=rd, device=h.device) if need[0] else None
        dh, dw, db = ops.linear_logp_backward(h, w, target, lse, bias, dlogp=dl, dentropy=de,
                                              entropy=ent if de is not None else None, dlse=ds,
                                              need=(need[0], need[1], need[2]), options=ctx.options,
                                              out=(dh_acc, None, None))
        if dh is not None:
            dist.all_reduce(dh, group=ctx.group)
            dh = dh.to(h.dtype)
        return dh, dw, db, None, None, None, None


def _shard_options(vocab_start, vocab_total, **kw):
    if vocab_total is None:
        raise ValueError("fastgrad: vocab_total (the whole vocabulary's size) is required")
    return ops.logp_options(vocab_start=int(vocab_start), vocab_total=int(vocab_total), **kw)


def _whole(weight, vocab_start, vocab_total):
    """Without a group (or with one rank) the slice must be the whole vocabulary."""
    if int(vocab_start) != 0 or (vocab_total is not None and int(vocab_total) != weight.shape[0]):
        raise ValueError(f"fastgrad: rows [{vocab_start}, {int(vocab_start) + weight.shape[0]}) of a vocabulary of "
                         f"{vocab_total} need the other ranks' slices, but there is no process group of > 1 ranks")


def vocab_parallel_logp(h, w_shard, b_shard, target, vocab_start, vocab_total, group=None, temperature=1.0,
                        softcap=0.0, ignore_index=None, return_entropy=False, max_tile_elements=0):
    """log_softmax(cap(h·wᵀ + b)/T)[target] per row over the whole vocabulary, this rank holding
    w's rows [vocab_start, vocab_start + V_r) (w_shard [V_r, D], b_shard [V_r] or None); h [..., D]
    and target [...] (global ids in [0, vocab_total)) the same on every rank of group (None: the
    default group) — group is the vocabulary's (tensor-parallel) group, not DDP's data-parallel
    one, and every rank holds at least one class (V_r >= 1). Differentiable in h, w_shard and b_shard; the softmax entropy too with
    return_entropy. Without a group of > 1 ranks it is fg.linear_logp."""
    if not _synced(group):
        _whole(w_shard, vocab_start, vocab_total)
        return linear_logp(h, w_shard, target, b_shard, temperature, softcap, ignore_index, return_entropy,
                           max_tile_elements)
    opt = _shard_options(vocab_start, vocab_total, temperature=temperature, softcap=softcap,
                         ignore_index=ignore_index, max_tile_elements=max_tile_elements)
    shape = h.shape[:-1]
    h2, t2 = h.reshape(-1, h.shape[-1]).contiguous(), target.reshape(-1).contiguous()
    logp, _, ent = VocabParallelLogpFunction.apply(h2, w_shard, b_shard, t2, opt, bool(return_entropy), group)
    logp = logp.reshape(shape)
    return (logp, ent.reshape(shape)) if return_entropy else logp


def vocab_parallel_cross_entropy(h, w_shard, b_shard, target, vocab_start, vocab_total, group=None, reduction="mean",
                                 label_smoothing=0.0, z_loss=0.0, ignore_index=-100, row_weight=None, temperature=1.0,
                                 softcap=0.0, max_tile_elements=0):
    """fg.linear_cross_entropy of h against the whole vocabulary, this rank holding w's rows
    [vocab_start, vocab_start + V_r) (w_shard [V_r, D], b_shard [V_r] or None) and every rank of
    group (None: the default group) the same h [..., D], target [...] and row_weight — group is
    the vocabulary's (tensor-parallel) group, not DDP's data-parallel one, and every rank holds at
    least one class (V_r >= 1; a rank with none is refused while the others wait). Row loss
    row_weight·(−logp + z_loss·lse²); mean divides by the rows not ignored, as
    fg.linear_cross_entropy. Every rank returns the same loss; the gradients of h are complete on
    every rank, those of w_shard / b_shard are this slice's. label_smoothing is refused
    (FG_ERR_UNSUPPORTED) with a group of > 1 ranks. Without one it is fg.linear_cross_entropy."""
    if not _synced(group):
        _whole(w_shard, vocab_start, vocab_total)
        return linear_cross_entropy(h, w_shard, target, b_shard, reduction, label_smoothing, z_loss, ignore_index,
                                    row_weight, temperature, softcap, max_tile_elements)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"fastgrad: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
    if reduction == "none" and (label_smoothing or z_loss):  # as fg.linear_cross_entropy, on any number of ranks
        raise ValueError("fastgrad: reduction='none' takes no label_smoothing or z_loss")
    opt = _shard_options(vocab_start, vocab_total, temperature=temperature, softcap=softcap,
                         ignore_index=ignore_index, label_smoothing=label_smoothing,
                         max_tile_elements=max_tile_elements)
    shape = h.shape[:-1]
    h2, t2 = h.reshape(-1, h.shape[-1]).contiguous(), target.reshape(-1).contiguous()
    logp, lse, _ = VocabParallelLogpFunction.apply(h2, w_shard, b_shard, t2, opt, False, group)
    rows = -logp
    if z_loss:
        rows = rows + float(z_loss) * lse * lse  # ignored rows: lse = 0
    if row_weight is not None:
        rows = rows * row_weight.reshape(-1).to(rows.dtype)
    if reduction == "none":
        return rows.reshape(shape)
    total = rows.sum()
    if reduction == "sum":
        return total
    kept = t2.numel() if ignore_index is None else (t2 != ignore_index).sum()
    return total / torch.clamp(torch.as_tensor(kept, device=total.device), min=1).to(total.dtype)


__all__ = ["SyncBatchNorm", "SyncBatchNormFunction", "sync_batch_norm", "convert_sync_batchnorm",
           "VocabParallelLogpFunction", "vocab_parallel_logp", "vocab_parallel_cross_entropy"]

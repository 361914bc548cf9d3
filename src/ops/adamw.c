/*
 * adamw.c — front door of the fused multi-tensor AdamW step: validates the
 * hyper-parameters and every tensor of every list (dtypes, sizes, contiguity, device — one
 * driver query an allocation, not a tensor: a model's step hands over hundreds —,
 * no tensor overlapping another; the moments f32 or, as torch's fused AdamW keeps them for
 * bf16 / f16 parameters, the parameters' dtype), folds the bias corrections into two scalars, and
 * hands one flat list to the backend (src/cpu/adamw.c, src/cuda/adamw.cu).
 */
#include "../core/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct extent {
    uintptr_t lo, hi;
    int list, index;
} extent;

static int by_address(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static const char *const list_names[5] = {"params", "grads", "exp_avg", "exp_avg_sq", "master"};

static fg_status check_tensor(fg_context *ctx, const fg_tensor *t, int list, int i, int64_t n, fg_dtype want,
                              fg_seen_ranges *seen) {
    char what[48];
    snprintf(what, sizeof what, "%s[%d]", list_names[list], i);
    FG_TRY(fg_check_desc("adamw_step", what, t, 0, FG_MAX_RANK));
    if (t->dtype != want) {
        const char *rule = list == 0   ? "every params tensor must have params[0]'s dtype"
                           : list == 1 ? "grads must have their params' dtype or f32, all one dtype"
                           : list == 4 ? "master weights must be f32"
                                       : "the moments must be f32 or the params' dtype, all one dtype (exp_avg[0]'s)";
        return fg_fail(FG_ERR_DTYPE, "adamw_step: %s.dtype=%s but %s", what, fg_dtype_name(t->dtype), rule);
    }
    if (n >= 0 && fg_numel(t) != n)
        return fg_fail(FG_ERR_SHAPE, "adamw_step: %s has %lld elements but params[%d] has %lld", what,
                       (long long)fg_numel(t), i, (long long)n);
    if (!fg_is_contiguous(t)) return fg_fail(FG_ERR_UNSUPPORTED, "adamw_step: %s is not contiguous", what);
    return fg_check_data_seen(ctx, "adamw_step", what, t, seen);
}

fg_status fg_adamw_step(fg_context *ctx, const fg_adamw_hparams *hp, int count, const fg_tensor *params,
                        const fg_tensor *grads, const fg_tensor *exp_avg, const fg_tensor *exp_avg_sq,
                        const fg_tensor *master) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "adamw_step: ctx is NULL");
    if (!hp) return fg_fail(FG_ERR_NULL_POINTER, "adamw_step: hp is NULL");
    if (count < 0) return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: count=%d is negative", count);
    if (!isfinite(hp->lr) || hp->lr < 0) return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: lr=%g must be finite and >= 0", hp->lr);
    if (!(hp->beta1 >= 0 && hp->beta1 < 1)) return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: beta1=%g must be in [0, 1)", hp->beta1);
    if (!(hp->beta2 >= 0 && hp->beta2 < 1)) return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: beta2=%g must be in [0, 1)", hp->beta2);
    if (!(hp->eps >= 0) || !isfinite(hp->eps)) return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: eps=%g must be finite and >= 0", hp->eps);
    if (!(hp->weight_decay >= 0) || !isfinite(hp->weight_decay))
        return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: weight_decay=%g must be finite and >= 0", hp->weight_decay);
    if (hp->step < 1) return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: step=%lld must be >= 1", (long long)hp->step);
    if (!isfinite(hp->grad_scale)) return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: grad_scale=%g must be finite", hp->grad_scale);
    if (count == 0) {
        fg_clear_error();
        return FG_OK;
    }
    const fg_tensor *lists[5] = {params, grads, exp_avg, exp_avg_sq, master};
    for (int l = 0; l < 4; l++)
        if (!lists[l]) return fg_fail(FG_ERR_NULL_POINTER, "adamw_step: %s is NULL", list_names[l]);
    const bool has_master = master && master[0].rank != 0;
    for (int i = 1; master && !has_master && i < count; i++)
        if (master[i].rank != 0)
            return fg_fail(FG_ERR_INVALID_VALUE,
                           "adamw_step: master[0] is absent (rank 0) but master[%d] is not; give all or none", i);
    const fg_dtype pt = params[0].dtype, gt = grads[0].dtype;
    if (pt != FG_F32 && pt != FG_F16 && pt != FG_BF16)
        return fg_fail(FG_ERR_DTYPE, "adamw_step: params[0].dtype=%s but params must be f32, f16 or bf16", fg_dtype_name(pt));
    if (gt != pt && gt != FG_F32)
        return fg_fail(FG_ERR_DTYPE, "adamw_step: grads[0].dtype=%s but grads must have their params' dtype or f32",
                       fg_dtype_name(gt));
    const fg_dtype mt = exp_avg[0].dtype;
    if (mt != FG_F32 && mt != pt)
        return fg_fail(FG_ERR_DTYPE, "adamw_step: exp_avg[0].dtype=%s but the moments must be f32 or the params' dtype (%s)",
                       fg_dtype_name(mt), fg_dtype_name(pt));
    if (has_master && pt == FG_F32)
        return fg_fail(FG_ERR_INVALID_VALUE, "adamw_step: master weights are for f16/bf16 params; params are f32");
    fg_adamw_item *items = calloc((size_t)count, sizeof *items);
    extent *ext = calloc((size_t)count * 5, sizeof *ext);
    if (!items || !ext) {
        free(items);
        free(ext);
        return fg_fail(FG_ERR_OUT_OF_MEMORY, "adamw_step: out of host memory");
    }
    fg_status s = FG_OK;
    int n_ext = 0;
    fg_seen_ranges seen; /* the device allocations checked so far: one driver query each */
    seen.n = seen.next = 0;
    for (int i = 0; i < count && s == FG_OK; i++) {
        /* params[i]'s descriptor is checked before its element count is read */
        s = check_tensor(ctx, &params[i], 0, i, -1, pt, &seen);
        if (s != FG_OK) break;
        const int64_t n = fg_numel(&params[i]);
        if (s == FG_OK) s = check_tensor(ctx, &grads[i], 1, i, n, gt, &seen);
        if (s == FG_OK) s = check_tensor(ctx, &exp_avg[i], 2, i, n, mt, &seen);
        if (s == FG_OK) s = check_tensor(ctx, &exp_avg_sq[i], 3, i, n, mt, &seen);
        if (s == FG_OK && has_master) s = check_tensor(ctx, &master[i], 4, i, n, FG_F32, &seen);
        if (s != FG_OK) break;
        items[i] = (fg_adamw_item){params[i].data, grads[i].data, exp_avg[i].data, exp_avg_sq[i].data,
                                   has_master ? master[i].data : NULL, n};
        for (int l = 0; l < (has_master ? 5 : 4) && n > 0; l++) {
            int64_t bytes = fg_extent_bytes(&lists[l][i]);
            ext[n_ext++] = (extent){(uintptr_t)lists[l][i].data, (uintptr_t)lists[l][i].data + (uintptr_t)bytes, l, i};
        }
    }
    if (s == FG_OK) { /* every tensor is read and written in place: none may overlap another */
        qsort(ext, (size_t)n_ext, sizeof *ext, by_address);
        for (int k = 1; k < n_ext && s == FG_OK; k++)
            if (ext[k].lo < ext[k - 1].hi)
                s = fg_fail(FG_ERR_ALIAS, "adamw_step: %s[%d] overlaps %s[%d]", list_names[ext[k].list], ext[k].index,
                            list_names[ext[k - 1].list], ext[k - 1].index);
    }
    if (s == FG_OK) {
        fg_adamw_run r;
        r.p_dtype = pt;
        r.g_dtype = gt;
        r.m_dtype = mt;
        r.beta2 = (float)hp->beta2;
        r.one_minus_beta1 = (float)(1.0 - hp->beta1);
        r.one_minus_beta2 = (float)(1.0 - hp->beta2);
        r.eps = (float)hp->eps;
        r.decay = (float)(1.0 - hp->lr * hp->weight_decay);
        r.grad_scale = hp->grad_scale == 0 ? 1.0f : (float)hp->grad_scale;
        r.step_size = (float)(hp->lr / (1.0 - pow(hp->beta1, (double)hp->step)));
        r.bc2_sqrt = (float)sqrt(1.0 - pow(hp->beta2, (double)hp->step));
        r.count = count;
        r.items = items;
        fg_record_reset(ctx);
        s = ctx->be->adamw(ctx, &r);
    }
    free(items);
    free(ext);
    if (s == FG_OK) fg_clear_error();
    return s;
}

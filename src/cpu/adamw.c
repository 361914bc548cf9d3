/*
 * adamw.c — the CPU backend of the fused AdamW step: the same per-element math as the
 * CUDA kernel (f32, in the order torch's fused AdamW uses), one pass over each tensor.
 * Each tensor is split into contiguous shares, one per thread (small tensors stay on the
 * calling thread); the loop is specialized per params / grads / moments dtype so the f16 /
 * bf16 conversions sit inside it (moments in the params' dtype are read, updated in f32 and
 * stored rounded, as torch's fused AdamW does for bf16 parameters) and it vectorizes (FG_CPU_CLONES: AVX-512, AVX2, baseline).
 * The square root is vec.h's fg_v_sqrt: the bits of sqrtf in a form the compiler
 * vectorizes (libm's errno branch keeps it from vectorizing sqrtf). The step's bits do not
 * depend on the thread count.
 */
#include "cpu.h"
#include "vec.h"

/* Elements [lo, hi) of one tensor; pt, gt, mt the storage types (constants at the call). */
FG_INLINE void step_typed(const fg_adamw_run *r, const fg_adamw_item *it, fg_dtype pt, fg_dtype gt, fg_dtype mt,
                          int64_t lo, int64_t hi) {
    const float beta2 = r->beta2, omb1 = r->one_minus_beta1, omb2 = r->one_minus_beta2, eps = r->eps;
    const float decay = r->decay, gscale = r->grad_scale, step = r->step_size, bc2 = r->bc2_sqrt;
    void *m = it->m, *v = it->v;
    float *master = it->master;
    if (master) {
#pragma GCC ivdep
        for (int64_t i = lo; i < hi; i++) {
            const float g = fg_v_ld(it->g, gt, i) * gscale;
            float p = master[i] * decay;
            const float m0 = fg_v_ld(m, mt, i);
            const float mi = m0 + omb1 * (g - m0); /* lerp(m, g, 1 − β1) */
            const float vi = beta2 * fg_v_ld(v, mt, i) + omb2 * g * g;
            p -= step * mi / (fg_v_sqrt(vi) / bc2 + eps);
            fg_v_st(m, mt, i, mi);
            fg_v_st(v, mt, i, vi);
            master[i] = p;
            fg_v_st(it->p, pt, i, p);
        }
    } else {
#pragma GCC ivdep
        for (int64_t i = lo; i < hi; i++) {
            const float g = fg_v_ld(it->g, gt, i) * gscale;
            float p = fg_v_ld(it->p, pt, i) * decay;
            const float m0 = fg_v_ld(m, mt, i);
            const float mi = m0 + omb1 * (g - m0);
            const float vi = beta2 * fg_v_ld(v, mt, i) + omb2 * g * g;
            p -= step * mi / (fg_v_sqrt(vi) / bc2 + eps);
            fg_v_st(m, mt, i, mi);
            fg_v_st(v, mt, i, vi);
            fg_v_st(it->p, pt, i, p);
        }
    }
}

FG_CPU_CLONES
static void step_range(const fg_adamw_run *r, const fg_adamw_item *it, int64_t lo, int64_t hi) {
    const fg_dtype pt = r->p_dtype, gt = r->g_dtype;
    const bool low_m = r->m_dtype != FG_F32; /* the moments in the params' dtype */
    if (pt == FG_F32) step_typed(r, it, FG_F32, FG_F32, FG_F32, lo, hi);
    else if (pt == FG_BF16 && gt == FG_BF16) {
        if (low_m) step_typed(r, it, FG_BF16, FG_BF16, FG_BF16, lo, hi);
        else step_typed(r, it, FG_BF16, FG_BF16, FG_F32, lo, hi);
    } else if (pt == FG_BF16) {
        if (low_m) step_typed(r, it, FG_BF16, FG_F32, FG_BF16, lo, hi);
        else step_typed(r, it, FG_BF16, FG_F32, FG_F32, lo, hi);
    } else if (gt == FG_F16) {
        if (low_m) step_typed(r, it, FG_F16, FG_F16, FG_F16, lo, hi);
        else step_typed(r, it, FG_F16, FG_F16, FG_F32, lo, hi);
    } else {
        if (low_m) step_typed(r, it, FG_F16, FG_F32, FG_F16, lo, hi);
        else step_typed(r, it, FG_F16, FG_F32, FG_F32, lo, hi);
    }
}

fg_status fg_cpu_adamw(fg_context *ctx, const fg_adamw_run *r) {
    for (int t = 0; t < r->count; t++) {
        const fg_adamw_item *it = &r->items[t];
        const int team = fg_cpu_team(ctx, it->n, 1 << 14);
        if (team == 1) {
            step_range(r, it, 0, it->n);
            continue;
        }
#pragma omp parallel num_threads(team)
        {
            int64_t lo, hi;
            fg_cpu_share(it->n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
            step_range(r, it, lo, hi);
        }
    }
    return FG_OK;
}

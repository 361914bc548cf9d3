/*
 * adamw.c — the CPU backend of the fused AdamW step: the same per-element math as the
 * CUDA kernel (f32, in the order torch's fused AdamW uses), one pass over each tensor.
 * Each tensor is split into contiguous shares, one per thread (small tensors stay on the
 * calling thread); the loop is specialized per params / grads / moments dtype so the f16 /
 * bf16 conversions sit inside it (moments in the params' dtype are read, updated in f32 and
 * stored rounded, as torch's fused AdamW does for bf16 parameters) and it vectorizes (FG_CPU_CLONES: AVX-512, AVX2, baseline).
 * The square root is vec.h's fg_v_sqrt: the bits of sqrtf in a form the compiler
 * vectorizes (libm's errno branch keeps it from vectorizing sqrtf). The step's bits do not
 * depend on the thread count. On a CPU with AVX-512 (and its bf16 conversions), f32 / bf16
 * steps run a 16-lane loop instead, with √v and the division from refined estimates (see
 * z_step_vec): the exact square root and divisions cost several times the rest of the step.
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

#ifdef FG_Z
/* ------------------------------------------------------------------ AVX-512 */

/* The same step on AVX-512 for f32 / bf16 params, grads and moments (vec.h's FG_Z helpers),
   16 elements a vector, the tail by lane masks. The exact square root and the two divisions
   (√v / √bc2, then m / that) cost about 32 cycles a vector on the divider, several times the
   rest of the step; here √v is v·rsqrt14(v) refined by one Newton step, 1/√bc2 a constant,
   and m / d m·rcp14(d) refined by one Newton step: the update is within a few ulp of the
   exact one, and since it is about lr of |p|, p's rounding almost never sees the difference.
   v = 0 gives √v = 0; a vector where v is NaN, ±inf, subnormal or negative, or where the
   denominator is 0, subnormal, inf or NaN, takes the exact forms (the loops above' bits). */
FG_Z_INLINE void z_step_vec(const fg_adamw_run *r, void *pp, const void *gp, void *mp, void *vp, float *master,
                            fg_dtype pt, fg_dtype gt, fg_dtype mt, bool has_master, int64_t i, __mmask16 k) {
    const __m512 g = _mm512_mul_ps(fg_z_ld(gp, gt, i, k), _mm512_set1_ps(r->grad_scale));
    const __m512 p0 = has_master ? _mm512_maskz_loadu_ps(k, master + i) : fg_z_ld(pp, pt, i, k);
    const __m512 p = _mm512_mul_ps(p0, _mm512_set1_ps(r->decay));
    const __m512 m0 = fg_z_ld(mp, mt, i, k), v0 = fg_z_ld(vp, mt, i, k);
    const __m512 m = _mm512_fmadd_ps(_mm512_set1_ps(r->one_minus_beta1), _mm512_sub_ps(g, m0), m0);
    const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(r->one_minus_beta2), g), g,
                                     _mm512_mul_ps(_mm512_set1_ps(r->beta2), v0));
    const __m512 y = _mm512_rsqrt14_ps(v);
    const __m512 s0 = _mm512_mul_ps(v, y);
    const __m512 s = _mm512_maskz_fmadd_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ), s0,
                                           _mm512_fnmadd_ps(s0, _mm512_mul_ps(y, _mm512_set1_ps(0.5f)),
                                                            _mm512_set1_ps(0.5f)),
                                           s0);
    const __m512 d = _mm512_fmadd_ps(s, _mm512_set1_ps(1.0f / r->bc2_sqrt), _mm512_set1_ps(r->eps));
    const __m512 sm = _mm512_mul_ps(_mm512_set1_ps(r->step_size), m);
    __m512 pn;
    if (__builtin_expect((_mm512_fpclass_ps_mask(v, 0xf9) | _mm512_fpclass_ps_mask(d, 0xbf)) == 0, 1)) {
        pn = _mm512_fnmadd_ps(sm, fg_z_rcp(d), p);
    } else {
        const __m512 de = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), _mm512_set1_ps(r->bc2_sqrt)),
                                        _mm512_set1_ps(r->eps));
        pn = _mm512_sub_ps(p, _mm512_div_ps(sm, de));
    }
    fg_z_st(mp, mt, i, k, m);
    fg_z_st(vp, mt, i, k, v);
    if (has_master) _mm512_mask_storeu_ps(master + i, k, pn);
    fg_z_st(pp, pt, i, k, pn);
}

FG_Z_INLINE void z_step_typed(const fg_adamw_run *r, const fg_adamw_item *it, fg_dtype pt, fg_dtype gt, fg_dtype mt,
                              bool has_master, int64_t lo, int64_t hi) {
    const fg_adamw_run rr = *r; /* scalars and pointers as locals: the stores may alias anything */
    void *pp = it->p, *mp = it->m, *vp = it->v;
    const void *gp = it->g;
    float *master = it->master;
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16) z_step_vec(&rr, pp, gp, mp, vp, master, pt, gt, mt, has_master, i, (__mmask16)0xffff);
    if (i < hi) z_step_vec(&rr, pp, gp, mp, vp, master, pt, gt, mt, has_master, i, fg_z_lanes(hi - i));
}

FG_Z_INLINE void z_step_master(const fg_adamw_run *r, const fg_adamw_item *it, fg_dtype pt, fg_dtype gt, fg_dtype mt,
                               int64_t lo, int64_t hi) {
    if (it->master) z_step_typed(r, it, pt, gt, mt, true, lo, hi);
    else z_step_typed(r, it, pt, gt, mt, false, lo, hi);
}

FG_Z_KERNEL
static void z_step_range(const fg_adamw_run *r, const fg_adamw_item *it, int64_t lo, int64_t hi) {
    const bool low_m = r->m_dtype != FG_F32;
    if (r->p_dtype == FG_F32) z_step_master(r, it, FG_F32, FG_F32, FG_F32, lo, hi);
    else if (r->g_dtype == FG_BF16) {
        if (low_m) z_step_master(r, it, FG_BF16, FG_BF16, FG_BF16, lo, hi);
        else z_step_master(r, it, FG_BF16, FG_BF16, FG_F32, lo, hi);
    } else {
        if (low_m) z_step_master(r, it, FG_BF16, FG_F32, FG_BF16, lo, hi);
        else z_step_master(r, it, FG_BF16, FG_F32, FG_F32, lo, hi);
    }
}
#endif

/* Elements [lo, hi) of one tensor on the AVX-512 step where it serves (f32 / bf16), else on
   the loops above. */
static void step_any(const fg_adamw_run *r, const fg_adamw_item *it, int64_t lo, int64_t hi) {
#ifdef FG_Z
    if ((r->p_dtype == FG_F32 || r->p_dtype == FG_BF16) && fg_z_usable()) {
        z_step_range(r, it, lo, hi);
        return;
    }
#endif
    step_range(r, it, lo, hi);
}

fg_status fg_cpu_adamw(fg_context *ctx, const fg_adamw_run *r) {
    for (int t = 0; t < r->count; t++) {
        const fg_adamw_item *it = &r->items[t];
        const int team = fg_cpu_team(ctx, it->n, 1 << 14);
        if (team == 1) {
            step_any(r, it, 0, it->n);
            continue;
        }
#pragma omp parallel num_threads(team)
        {
            int64_t lo, hi;
            fg_cpu_share(it->n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
            step_any(r, it, lo, hi);
        }
    }
    return FG_OK;
}

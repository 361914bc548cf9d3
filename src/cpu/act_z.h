/*
 * act_z.h — gelu (erf) and gelu (tanh) with their slopes on 16 f32 lanes, for the CPU
 * backend's AVX-512 paths (vec.h's FG_Z, chosen at run time where the CPU has it): the linear +
 * activation passes (linear_act.c) and the short-k product's store (gemm.c) share them. The
 * cloned loops' form of the same math (vec.h's fg_v_act) spends most of those passes in its exp
 * and division; these take vec.h's exp and reciprocal estimates instead, and gelu's erf from the
 * same exp as its slope.
 */
#ifndef FG_CPU_ACT_Z_H
#define FG_CPU_ACT_Z_H

#include "vec.h"

#ifdef FG_Z
/* gelu(x) = x·Φ(x) and its slope Φ(x) + x·φ(x) from one exp, e = e^(−x²/2):
     ½erfc(z) = ½·e·erfcx(z), z = |x|/√2, erfcx(z) = t·Q(t), t = 1/(1 + 0.4z)
   (Q a degree-9 polynomial, fitted for relative error on 0 <= z <= 10.5 — 3e-8 with its f32
   coefficients; past that e is 0 in f32), Φ = ½erfc(z) below 0 and 1 − ½erfc(z) above, and
   φ(x) = e/√(2π). x² is split exactly (x² = h + l by an FMA), so e carries no error from
   rounding x² or x/√2 (which the erfc of the cloned form does, growing with x²). Within 1e-6 of
   gelu relative (a few ulp where it is a normal f32), its slope within 2e-6 of |Φ| + |x·φ| (it
   cancels at its root, x ≈ −0.75); NaN stays NaN; ±0 give ±0 and ½. |x| is clamped to 14.5 for
   e and t (e^(−105) rounds to 0 in f32): far out Φ is exactly 0 or 1 and φ is 0. */
FG_Z_MATH_INLINE __m512 fg_z_gelu(__m512 x, __m512 *slope) {
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-14.5f)), _mm512_set1_ps(14.5f)); /* NaN: −14.5 */
    const __m512 h = _mm512_mul_ps(xc, xc), l = _mm512_fmsub_ps(xc, xc, h);
    const __m512 e0 = fg_z_exp_neg(_mm512_mul_ps(h, _mm512_set1_ps(-0.5f)));
    const __m512 e = _mm512_fnmadd_ps(_mm512_mul_ps(e0, _mm512_set1_ps(0.5f)), l, e0); /* e^(−h/2)·(1 − l/2) */
    const __m512 t = fg_z_rcp(_mm512_fmadd_ps(_mm512_abs_ps(xc), _mm512_set1_ps(0.282842712f), _mm512_set1_ps(1.0f)));
    const __m512 s = _mm512_fmadd_ps(t, _mm512_set1_ps(2.47619048f), _mm512_set1_ps(-1.47619048f)); /* [tmin, 1] → [−1, 1] */
    __m512 q = _mm512_set1_ps(-8.025504940e-06f);
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(2.773427150e-05f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(1.163111374e-04f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(-3.920481831e-04f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(-1.832390670e-03f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(3.027546452e-03f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(3.989903629e-02f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(1.456902772e-01f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(3.227461278e-01f));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(4.907254279e-01f));
    const __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(t, _mm512_set1_ps(0.5f)), q), e); /* ½erfc(z) */
    const __m512 phi = _mm512_mask_sub_ps(r, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), r);
    if (slope) *slope = _mm512_fmadd_ps(x, _mm512_mul_ps(e, _mm512_set1_ps(0.398942280f)), phi);
    return _mm512_mul_ps(x, phi);
}

/* gelu_tanh: fg_v_act's form — x·σ(2u) from one exp, its slope σ(2u) + x·σ′(2u)·2u′ and the
   limits past |x| > 10 — with the exp by fg_z_exp_neg and the reciprocal by fg_z_rcp instead of
   the cloned loops' exp and division (a few ulp of f32; NaN stays NaN). */
FG_Z_MATH_INLINE __m512 fg_z_gelu_tanh(__m512 x, __m512 *slope) {
    const __m512 k = _mm512_set1_ps(1.5957691216057308f), x2 = _mm512_mul_ps(x, x);
    const __m512 u2 = _mm512_mul_ps(k, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x2), x, x));
    const __m512 e = fg_z_exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(u2))); /* e^(−|2u|) */
    const __m512 inv = fg_z_rcp(_mm512_add_ps(_mm512_set1_ps(1.0f), e));
    const __m512 ei = _mm512_mul_ps(e, inv);
    const __m512 sg = _mm512_mask_mov_ps(ei, _mm512_cmp_ps_mask(u2, _mm512_setzero_ps(), _CMP_GE_OQ), inv);
    if (slope) {
        const __m512 sd = _mm512_mul_ps(ei, inv);
        const __m512 full = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(x, sd), k),
                                            _mm512_fmadd_ps(_mm512_set1_ps(0.134145f), x2, _mm512_set1_ps(1.0f)), sg);
        const __mmask16 far = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(10.0f), _CMP_GT_OQ);
        const __m512 lim = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f));
        *slope = _mm512_mask_mov_ps(full, far, lim);
    }
    return _mm512_mul_ps(x, sg);
}

/* act(x) (and its slope when slope is not NULL) for the acts above; act a constant at the call */
FG_Z_MATH_INLINE __m512 fg_z_act(int act, __m512 x, __m512 *slope) {
    return act == FG_ACT_GELU ? fg_z_gelu(x, slope) : fg_z_gelu_tanh(x, slope);
}

/* Whether fg_z_act has act */
static inline bool fg_z_has_act(int act) { return act == FG_ACT_GELU || act == FG_ACT_GELU_TANH; }
#endif /* FG_Z */

#endif /* FG_CPU_ACT_Z_H */

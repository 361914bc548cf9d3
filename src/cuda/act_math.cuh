/*
 * act_math.cuh — the activations and their slopes in f32 for the CUDA linear + activation
 * kernels (the elementwise passes in linear_act.cu, the fused tile and sm_90a kernels):
 * sigmoid forms through ex2.approx and rcp.approx (the accurate expf and the correctly
 * rounded reciprocal make the passes compute-bound), erfcf / tanhf accurate, with the same
 * cancellation-free forms and guards as the CPU's f64 math in src/cpu/linear_act.c.
 * gelu_tanh goes through σ(2u), not tanh.approx: ½(1 + tanh u) cancels in the negative tail,
 * where the tests hold the slope to its true relative value.
 */
#ifndef FG_CUDA_ACT_MATH_CUH
#define FG_CUDA_ACT_MATH_CUH

#include "../core/internal.h"

#include <type_traits>

/* f(std::integral_constant<int, ACT>{}) for the activation `act`: one kernel per activation
 * (a runtime switch inside the kernels keeps every activation's registers live, which costs
 * occupancy and so bandwidth). */
template <typename F> static auto with_act(int act, F &&f) {
    switch (act) {
    case FG_ACT_RELU: return f(std::integral_constant<int, FG_ACT_RELU>{});
    case FG_ACT_GELU: return f(std::integral_constant<int, FG_ACT_GELU>{});
    case FG_ACT_GELU_TANH: return f(std::integral_constant<int, FG_ACT_GELU_TANH>{});
    case FG_ACT_SILU: return f(std::integral_constant<int, FG_ACT_SILU>{});
    case FG_ACT_SIGMOID: return f(std::integral_constant<int, FG_ACT_SIGMOID>{});
    case FG_ACT_TANH: return f(std::integral_constant<int, FG_ACT_TANH>{});
    default: return f(std::integral_constant<int, FG_ACT_NONE>{});
    }
}

/* ... and for the kernels that form g, also the slope form's GIVEN_SLOPE (g = dy · s) */
template <typename F> static auto with_grad_act(int act, F &&f) {
    if (act == FG_ACT_GIVEN_SLOPE) return f(std::integral_constant<int, FG_ACT_GIVEN_SLOPE>{});
    return with_act(act, f);
}

/* exp of a non-positive argument through ex2.approx (relative error ~2⁻²²; the rounding of
 * x·log2 e adds |x|·2⁻²⁴, far under the f32 tolerance where the term still matters) */
__device__ __forceinline__ float exp_neg(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

/* 1/x for x in [1, 2] through rcp.approx (≤ 1 ulp; the correctly rounded __frcp_rn is a
 * multi-instruction sequence that makes these passes compute-bound) */
__device__ __forceinline__ float rcp_1_2(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* σ(z) and σ′(z) = σ(1 − σ) from one ex2 and one reciprocal, without the cancellation of
 * 1 − σ: with e = exp(−|z|), σ = 1/(1+e) or e/(1+e), σ′ = e/(1+e)². Takes t = z·log2 e: callers
 * fold log2 e into their own constants (nvcc does not fold constants across operations without
 * fast-math, and these passes are instruction-bound in the tile kernels). */
__device__ __forceinline__ void sigmoid_pair_l2(float t, float *s, float *ds) {
    float e;
    asm("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(-fabsf(t)));
    const float inv = rcp_1_2(1.f + e);
    *s = t >= 0.f ? inv : e * inv;
    if (ds) *ds = e * inv * inv;
    if (t != t) *s = t;
}

__device__ __forceinline__ void sigmoid_pair(float x, float *s, float *ds) {
    sigmoid_pair_l2(x * 1.4426950408889634f, s, ds);
}

/* gelu_tanh: ½(1 + tanh u) = σ(2u), 2u = x·(c1 + c2·x²) with c1 = 2√(2/π), c2 = 0.044715·c1;
 * the argument σ needs, 2u·log2 e, in one multiply-add and one multiply */
__device__ __forceinline__ float gelu_t_l2(float x, float x2) {
    return x * fmaf(0.1029432395800235f, x2, 2.302208198144325f);
}

/* gelu_tanh's slope from σ = s and σ′ = ds of 2u at xc (x clamped or not; x2 = xc²):
 * s + xc·ds·d(2u)/dx with d(2u)/dx = c1 + 3·c2·x²; past |x| = 10 it is 1 or 0, picked by selects
 * (no branch, so a thread's elements interleave: a branch per element serializes them and
 * leaves the g-forming warps far below their issue rate; the formula's value there is not
 * used); NaN in, NaN out */
__device__ __forceinline__ float gelu_t_slope(float x, float xc, float x2, float s, float ds) {
    const float r = fmaf(xc * ds, fmaf(0.21406444881780073f, x2, 1.5957691216057308f), s);
    return x != x ? x : fabsf(x) > 10.f ? (x > 0.f ? 1.f : 0.f) : r;
}

__device__ __forceinline__ float act_value(int act, float x) {
    float s;
    switch (act) {
    case FG_ACT_RELU: return x > 0.f ? x : (x == x ? 0.f : x);
    case FG_ACT_GELU: return 0.5f * x * erfcf(-x * 0.70710678f);
    case FG_ACT_GELU_TANH: sigmoid_pair_l2(gelu_t_l2(x, x * x), &s, nullptr); return x * s;
    case FG_ACT_SILU: sigmoid_pair(x, &s, nullptr); return x * s;
    case FG_ACT_SIGMOID: sigmoid_pair(x, &s, nullptr); return s;
    case FG_ACT_TANH: return tanhf(x);
    default: return x;
    }
}

__device__ __forceinline__ float act_slope(int act, float x) {
    float s, ds, x2;
    switch (act) {
    case FG_ACT_RELU: return x > 0.f ? 1.f : (x == x ? 0.f : x);
    case FG_ACT_GELU: return 0.5f * erfcf(-x * 0.70710678f) + x * 0.39894228f * exp_neg(-0.5f * x * x);
    case FG_ACT_GELU_TANH: { /* (on x clamped to ±10: x² would overflow into 0·∞ past that) */
        const float xc = fminf(fmaxf(x, -10.f), 10.f);
        x2 = xc * xc;
        sigmoid_pair_l2(gelu_t_l2(xc, x2), &s, &ds);
        return gelu_t_slope(x, xc, x2, s, ds);
    }
    case FG_ACT_SILU: sigmoid_pair(x, &s, &ds); return s + x * ds;
    case FG_ACT_SIGMOID: sigmoid_pair(x, &s, &ds); return x == x ? ds : x;
    case FG_ACT_TANH: /* 1 − tanh² = 4σ′(2x) */
        sigmoid_pair_l2(x * 2.8853900817779268f, &s, &ds);
        return x == x ? 4.f * ds : x;
    case FG_ACT_GIVEN_SLOPE: return x; /* the saved slope itself */
    default: return x == x ? 1.f : x;
    }
}

/* y = act(x) and s = act′(x) together (the slope forms' forwards), the same bits as act_value
 * and act_slope: gelu_tanh's two share one σ — apart they take it twice, at x and at x clamped
 * to ±10, which agree for |x| ≤ 10, and past that the slope is picked, not computed (its
 * formula may then be NaN: it is not selected); silu's and sigmoid's share theirs. */
__device__ __forceinline__ void act_value_slope(int act, float x, float *y, float *s) {
    float sg, ds;
    switch (act) {
    case FG_ACT_GELU_TANH: {
        const float x2 = x * x;
        sigmoid_pair_l2(gelu_t_l2(x, x2), &sg, &ds);
        *y = x * sg, *s = gelu_t_slope(x, x, x2, sg, ds);
        return;
    }
    case FG_ACT_SILU: sigmoid_pair(x, &sg, &ds); *y = x * sg, *s = sg + x * ds; return;
    case FG_ACT_SIGMOID: sigmoid_pair(x, &sg, &ds); *y = sg, *s = x == x ? ds : x; return;
    default: *y = act_value(act, x), *s = act_slope(act, x); return;
    }
}

#endif

/*
 * act_math.cuh — the activations and their slopes in f32 for the CUDA linear + activation
 * kernels (the elementwise passes in linear_act.cu, the fused tiles in linear_act_tile.cu):
 * sigmoid forms through ex2.approx and rcp.approx (the accurate expf and the correctly
 * rounded reciprocal made the passes compute-bound), erfcf / tanhf accurate, with the same
 * cancellation-free forms and guards as the CPU's f64 math in src/cpu/linear_act.c.
 */
#ifndef FG_CUDA_ACT_MATH_CUH
#define FG_CUDA_ACT_MATH_CUH

#include "../core/internal.h"

/* exp of a non-positive argument through ex2.approx (relative error ~2⁻²²; the rounding of
 * x·log2 e adds |x|·2⁻²⁴, far under the f32 tolerance where the term still matters) */
__device__ __forceinline__ float exp_neg(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

/* 1/x for x in [1, 2] through rcp.approx (≤ 1 ulp; the correctly rounded __frcp_rn is a
 * multi-instruction sequence that made these passes compute-bound) */
__device__ __forceinline__ float rcp_1_2(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* σ(x) and σ′(x) = σ(1 − σ) from one ex2 and one reciprocal, without the cancellation of
 * 1 − σ: with e = exp(−|x|), σ = 1/(1+e) or e/(1+e), σ′ = e/(1+e)² */
__device__ __forceinline__ void sigmoid_pair(float x, float *s, float *ds) {
    const float e = exp_neg(-fabsf(x)), inv = rcp_1_2(1.f + e);
    *s = x >= 0.f ? inv : e * inv;
    if (ds) *ds = e * inv * inv;
    if (x != x) *s = x;
}

__device__ __forceinline__ float gelu_u(float x) { return 0.7978845608f * (x + 0.044715f * x * x * x); }

__device__ __forceinline__ float act_value(int act, float x) {
    float s;
    switch (act) {
    case FG_ACT_RELU: return x > 0.f ? x : (x == x ? 0.f : x);
    case FG_ACT_GELU: return 0.5f * x * erfcf(-x * 0.70710678f);
    case FG_ACT_GELU_TANH: sigmoid_pair(2.f * gelu_u(x), &s, nullptr); return x * s;
    case FG_ACT_SILU: sigmoid_pair(x, &s, nullptr); return x * s;
    case FG_ACT_SIGMOID: sigmoid_pair(x, &s, nullptr); return s;
    case FG_ACT_TANH: return tanhf(x);
    default: return x;
    }
}

__device__ __forceinline__ float act_slope(int act, float x) {
    float s, ds;
    switch (act) {
    case FG_ACT_RELU: return x > 0.f ? 1.f : (x == x ? 0.f : x);
    case FG_ACT_GELU: return 0.5f * erfcf(-x * 0.70710678f) + x * 0.39894228f * exp_neg(-0.5f * x * x);
    case FG_ACT_GELU_TANH:
        if (fabsf(x) > 10.f) return x > 0.f ? 1.f : 0.f;
        sigmoid_pair(2.f * gelu_u(x), &s, &ds);
        return s + x * ds * 1.5957691216f * (1.f + 0.134145f * x * x);
    case FG_ACT_SILU: sigmoid_pair(x, &s, &ds); return s + x * ds;
    case FG_ACT_SIGMOID: sigmoid_pair(x, &s, &ds); return x == x ? ds : x;
    case FG_ACT_TANH: sigmoid_pair(2.f * x, &s, &ds); return x == x ? 4.f * ds : x; /* 1 − tanh² = 4σ′(2x) */
    default: return x == x ? 1.f : x;
    }
}

#endif

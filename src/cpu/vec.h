/*
 * vec.h — what the CPU backend's streaming loops share: element loads and stores of
 * f32 / f16 / bf16 / f64 data as f32 (or f64) values, with the f16 and bf16 conversions
 * written branch-free so the compiler vectorizes them inside the loops that use them (the
 * same bits as fg_f32_to_f16 / fg_f32_to_bf16 / fg_f16_to_f32 of src/core/dtype.c: round
 * to nearest even, NaN stays NaN, overflow to inf); exp, tanh and sigmoid in f32, branch-
 * free for the same reason (exp within 2 ulp; tanh without the cancellation of
 * (1 − e)/(1 + e) near 0); the activations and their slopes on them (fg_v_act); and FG_CPU_CLONES, which compiles a hot function once per x86
 * level (AVX-512, AVX2 + FMA, baseline) and picks one at load time, since the library
 * itself is built for the baseline.
 *
 * Everything here is static inline: the loops are specialized by the compiler for the
 * dtype they are called with (a constant), so one loop body serves every storage type.
 */
#ifndef FG_CPU_VEC_H
#define FG_CPU_VEC_H

#include "../core/internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define FG_INLINE static inline __attribute__((always_inline))

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(FG_CPU_NO_CLONES)
#define FG_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FG_CPU_CLONES
#endif

/* ------------------------------------------------------------------ bits */

FG_INLINE uint32_t fg_v_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

FG_INLINE float fg_v_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------------ conversions */

FG_INLINE float fg_v_bf16_to_f32(uint16_t h) { return fg_v_float((uint32_t)h << 16); }

FG_INLINE uint16_t fg_v_f32_to_bf16(float f) {
    const uint32_t u = fg_v_bits(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

FG_INLINE float fg_v_f16_to_f32(uint16_t h) {
    const uint32_t em = (uint32_t)(h & 0x7fffu) << 13; /* exponent and mantissa in f32 position */
    const uint32_t exp = em & 0x0f800000u;
    const uint32_t normal = em + (112u << 23);                       /* rebias 15 → 127 */
    const uint32_t special = em + (224u << 23);                      /* inf / NaN: exponent 255 */
    const float sub = fg_v_float(em + (113u << 23)) - fg_v_float(113u << 23); /* mant · 2^-24, exact */
    const uint32_t mag = exp == 0x0f800000u ? special : exp == 0 ? fg_v_bits(sub) : normal;
    return fg_v_float(mag | (uint32_t)(h & 0x8000u) << 16);
}

FG_INLINE uint16_t fg_v_f32_to_f16(float f) {
    const uint32_t u = fg_v_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    /* normal: drop 13 bits, round to nearest even (a carry into the exponent is right,
       up to inf past 65520) */
    const uint32_t normal = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* below 2^-14: adding 0.5 aligns the 10 kept bits at the bottom, the FPU rounds */
    const uint32_t sub = fg_v_bits(fg_v_float(a) + 0.5f) - 0x3f000000u;
    const uint32_t mag = a > 0x7f800000u ? 0x7e00u : a >= 0x477ff000u ? 0x7c00u : a < 0x38800000u ? sub : normal;
    return (uint16_t)(sign | mag);
}

/* Element i of p (storage type t) as f32, and v stored there; t a constant at the call. */
FG_INLINE float fg_v_ld(const void *p, fg_dtype t, int64_t i) {
    switch (t) {
    case FG_F16: return fg_v_f16_to_f32(((const uint16_t *)p)[i]);
    case FG_BF16: return fg_v_bf16_to_f32(((const uint16_t *)p)[i]);
    case FG_F64: return (float)((const double *)p)[i];
    default: return ((const float *)p)[i];
    }
}

FG_INLINE void fg_v_st(void *p, fg_dtype t, int64_t i, float v) {
    switch (t) {
    case FG_F16: ((uint16_t *)p)[i] = fg_v_f32_to_f16(v); break;
    case FG_BF16: ((uint16_t *)p)[i] = fg_v_f32_to_bf16(v); break;
    case FG_F64: ((double *)p)[i] = v; break;
    default: ((float *)p)[i] = v; break;
    }
}

/* The same in f64 (f64 problems keep f64 math). */
FG_INLINE double fg_v_ldd(const void *p, fg_dtype t, int64_t i) {
    return t == FG_F64 ? ((const double *)p)[i] : (double)fg_v_ld(p, t, i);
}

FG_INLINE void fg_v_std(void *p, fg_dtype t, int64_t i, double v) {
    if (t == FG_F64) ((double *)p)[i] = v;
    else fg_v_st(p, t, i, (float)v);
}

/* ------------------------------------------------------------------ f32 math */

/* e^x: x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial for e^r (Cephes' expf), and 2^n
   applied in two halves so that the results past FLT_MAX become inf and those below the
   smallest normal come out subnormal, as expf's do. NaN stays NaN. */
FG_INLINE float fg_v_exp(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    const float magic = 12582912.0f; /* 1.5·2^23: adding it rounds to an integer */
    const float t = xc * 1.44269504088896341f + magic;
    const float n = t - magic;
    const int32_t ni = (int32_t)(fg_v_bits(t) - fg_v_bits(magic));
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * z + r + 1.0f;
    const int32_t n1 = ni >> 1, n2 = ni - n1;
    const float s1 = fg_v_float((uint32_t)(n1 + 127) << 23), s2 = fg_v_float((uint32_t)(n2 + 127) << 23);
    return y * s1 * s2;
}

/* e^x − 1 without the cancellation near 0 (a Taylor series below |x| 0.5). */
FG_INLINE float fg_v_expm1(float x) {
    float p = 1.0f / 362880.0f;
    p = p * x + 1.0f / 40320.0f;
    p = p * x + 1.0f / 5040.0f;
    p = p * x + 1.0f / 720.0f;
    p = p * x + 1.0f / 120.0f;
    p = p * x + 1.0f / 24.0f;
    p = p * x + 1.0f / 6.0f;
    p = p * x + 0.5f;
    const float small = x + x * x * p;
    const float big = fg_v_exp(x) - 1.0f;
    return fabsf(x) < 0.5f ? small : big;
}

/* tanh(u) and its slope 1 − tanh²(u) from one exp: with e = e^(−2|u|),
   tanh = ±(1 − e)/(1 + e), slope = 4e/(1 + e)²; below |u| 0.625 tanh's odd Taylor series
   (10 terms), where (1 − e) would cancel. */
FG_INLINE float fg_v_tanh_slope(float u, float *slope) {
    const float a = fabsf(u);
    const float e = fg_v_exp(-2.0f * a);
    const float inv = 1.0f / (1.0f + e);
    const float big = (1.0f - e) * inv;
    const float z = u * u;
    /* tanh u = u − u³/3 + 2u⁵/15 − 17u⁷/315 + 62u⁹/2835 − 1382u¹¹/155925 + 21844u¹³/6081075
              − 929569u¹⁵/638512875 + 6404582u¹⁷/10854718875 − 443861162u¹⁹/1856156927625 */
    float q = -443861162.0f / 1856156927625.0f;
    q = q * z + 6404582.0f / 10854718875.0f;
    q = q * z + -929569.0f / 638512875.0f;
    q = q * z + 21844.0f / 6081075.0f;
    q = q * z + -1382.0f / 155925.0f;
    q = q * z + 62.0f / 2835.0f;
    q = q * z + -17.0f / 315.0f;
    q = q * z + 2.0f / 15.0f;
    q = q * z + -1.0f / 3.0f;
    const float small = u + u * z * q;
    const bool near0 = a < 0.625f;
    const float t = near0 ? small : (u < 0 ? -big : big);
    if (slope) *slope = near0 ? 1.0f - small * small : 4.0f * e * inv * inv;
    return u != u ? u : t;
}

/* √x for f32 x ≥ 0 (or NaN), the bits sqrtf gives (correctly rounded; 0, −0, inf and NaN
   kept), without libm's errno branch, which keeps the compiler from vectorizing sqrtf:
   1/√x by Newton's steps in f64 from a bit-level first guess, √x = x·(1/√x) corrected
   once, rounded to f32 (the f64 result is within an ulp of f64, far closer than the f32
   rounding needs; checked against sqrtf on every non-negative f32). inf goes in as FLT_MAX
   and comes out times inf; the special cases are arithmetic, not selects, which the compiler
   would turn into branches here. */
FG_INLINE float fg_v_sqrt(float xf) {
    const uint32_t b = fg_v_bits(xf);
    const uint32_t inf = b == 0x7f800000u;
    const double x = fg_v_float(b - inf);
    const float k = fg_v_float(0x3f800000u + inf * (0x7f800000u - 0x3f800000u)); /* 1 or inf */
    uint64_t u;
    memcpy(&u, &x, 8);
    u = 0x5fe6eb50c7b537a9ull - (u >> 1);
    double r;
    memcpy(&r, &u, 8);
    r = r * (1.5 - 0.5 * x * r * r);
    r = r * (1.5 - 0.5 * x * r * r);
    r = r * (1.5 - 0.5 * x * r * r);
    r = r * (1.5 - 0.5 * x * r * r);
    double s = x * r;
    s = s + 0.5 * r * (x - s * s);
    return (float)s * k;
}

/* σ(x) and σ′(x) = σ(1 − σ) from one exp, e = e^(−|x|): σ = 1/(1 + e) for x ≥ 0, e/(1 + e)
   below; σ′ = e/(1 + e)² (no cancellation where σ → 1). */
FG_INLINE float fg_v_sigmoid(float x, float *slope) {
    const float e = fg_v_exp(-fabsf(x));
    const float d = 1.0f + e;
    const float inv = 1.0f / d;
    if (slope) *slope = e * inv * inv;
    return x >= 0 ? inv : (x != x ? x : e * inv);
}

/* ------------------------------------------------------------------ activations (f32) */

/* The activations' f32 math for f32 / f16 / bf16 data (the linear + activation passes and the
   GEMM's fused epilogue share it), branch-free on the exp above so the loops vectorize; erf's
   f32 form is the Chebyshev fit of Numerical Recipes' erfcc (relative error below 1.2e-7). */
/* erfc(x) in f32 (Numerical Recipes' erfcc: t·exp(−z² + P(t)), t = 1/(1 + z/2), z = |x|) */
FG_INLINE float fg_v_erfc(float x) {
    const float z = fabsf(x), t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t + -0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t + -1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t + -0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t + -1.26551223f;
    const float r = t * fg_v_exp(-z * z + p);
    return x >= 0 ? r : (x != x ? x : 2.0f - r);
}

/* act(x) and act′(x) in f32 (slope NULL: the value only); act a constant at the call */
FG_INLINE float fg_v_act(int act, float x, float *slope) {
    float v = x, s = x == x ? 1.0f : x;
    switch (act) {
    case FG_ACT_RELU:
        v = x > 0 ? x : (x == x ? 0.0f : x);
        s = x > 0 ? 1.0f : (x == x ? 0.0f : x);
        break;
    case FG_ACT_GELU: {
        const float phi = 0.5f * fg_v_erfc(-x * 0.70710678118654752f);
        v = x * phi;
        s = phi + x * 0.39894228040143268f * fg_v_exp(-0.5f * x * x);
        break;
    }
    case FG_ACT_GELU_TANH: { /* x·σ(2u), u = √(2/π)(x + 0.044715x³) */
        const float x2 = x * x;
        const float u2 = 1.5957691216057308f * (x + 0.044715f * x2 * x);
        float sd;
        const float sg = fg_v_sigmoid(u2, &sd);
        v = x * sg;
        const float full = sg + x * sd * 1.5957691216057308f * (1.0f + 0.134145f * x2);
        s = fabsf(x) > 10.0f ? (x > 0 ? 1.0f : 0.0f) : full; /* the limits, instead of 0·∞ far out */
        break;
    }
    case FG_ACT_SILU: {
        float sd;
        const float sg = fg_v_sigmoid(x, &sd);
        v = x * sg;
        s = sg + x * sd;
        break;
    }
    case FG_ACT_SIGMOID: v = fg_v_sigmoid(x, &s); break;
    case FG_ACT_TANH: v = fg_v_tanh_slope(x, &s); break;
    case FG_ACT_GIVEN_SLOPE: s = x; break;
    default: break;
    }
    if (slope) *slope = s;
    return v;
}

#endif /* FG_CPU_VEC_H */

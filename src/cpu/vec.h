/*
 * vec.h — what the CPU backend's streaming loops share: element loads and stores of
 * f32 / f16 / bf16 / f64 data as f32 (or f64) values, with the f16 and bf16 conversions
 * written branch-free so the compiler vectorizes them inside the loops that use them (the
 * same bits as fg_f32_to_f16 / fg_f32_to_bf16 / fg_f16_to_f32 of src/core/dtype.c: round
 * to nearest even, NaN stays NaN, overflow to inf); exp, tanh and sigmoid in f32, branch-
 * free for the same reason (exp within 2 ulp; tanh without the cancellation of
 * (1 − e)/(1 + e) near 0); the activations and their slopes on them (fg_v_act); and FG_CPU_CLONES, which compiles a hot function once per x86
 * level (AVX-512, AVX2 + FMA, baseline) and picks one at load time, since the library
 * itself is built for the baseline; and FG_Z, the AVX-512 helpers (loads and stores of f32 /
 * bf16 vectors, softcap — f32-accurate, and cheaper forms for bf16 data — exp, refined
 * estimates) of the stream loops chosen at run time.
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

/* ------------------------------------------------------------------ softcap's bf16 constants */

/* The constants of softcap's bf16 form (fg_z_softcap_bf16 below) for one c, with 1/c folded in:
   false when c is outside [2^-28, 2^28], where they would leave f32's normal range (the rows
   then keep the f32 forms). c a double as the op's scalar; the clamp is its f32 rounding. */
typedef struct fg_softcap_bf16_k {
    float x_max;      /* 5.2743·c: |x| clamped here */
    float q1, q2;     /* Q = 1 + q1·x² + q2·x⁴ */
    float a, b, k;    /* R = k + (b + a·x²)/Q */
    float c;
} fg_softcap_bf16_k;

static inline bool fg_softcap_bf16_consts(double c, fg_softcap_bf16_k *k) {
    if (!(c >= 0x1p-28 && c <= 0x1p28)) return false;
    const double p1 = 1.021432876586914e-1, p2 = 6.591936107724905e-4, q1 = 4.3521007895469666e-1,
                 q2 = 1.2719698250293732e-2, kk = p2 / q2, c2 = c * c;
    k->x_max = (float)(5.27427387 * c);
    k->q1 = (float)(q1 / c2);
    k->q2 = (float)(q2 / (c2 * c2));
    k->a = (float)((p1 - kk * q1) / c2);
    k->b = (float)(1.0 - kk);
    k->k = (float)kk;
    k->c = (float)c;
    return true;
}

/* ------------------------------------------------------------------ AVX-512 streams */

/* The unit-stride f32 / bf16 streams of the elementwise family and AdamW, written for
   AVX-512 and chosen at run time (fg_z_usable) where the CPU has it; elsewhere the clones of
   the loops above run. 16 f32 lanes a vector, the tail by lane masks (no scalar remainder).
   bf16 is widened by a shift and narrowed by vcvtne2ps2bf16 / vcvtneps2bf16, which round to
   nearest even and keep NaN NaN with the same bits as fg_v_f32_to_bf16 — except that they
   flush f32 subnormals to zero, so a vector holding one takes fg_v_f32_to_bf16's integer
   rounding instead (the same bits in every case). The math helpers here are accurate to a few
   ulp of f32, cheaper than their exact forms above: the rational tanh, exp with a scalef, and
   reciprocal / square-root estimates refined by one Newton step — except softcap's bf16 forms,
   accurate to about 2^-13 (what bf16 data can show). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(FG_CPU_NO_CLONES)
#include <immintrin.h>
#define FG_Z 1
#define FG_Z_ISA "avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,fma"
#define FG_Z_INLINE static inline __attribute__((always_inline, target(FG_Z_ISA)))
#define FG_Z_KERNEL __attribute__((target(FG_Z_ISA)))
/* the math helpers need no bf16 instruction: on the plain AVX-512 set they inline into FG_Z code
   and into code built for that set alone (src/cpu/attention.c's rows) */
#define FG_Z_MATH_ISA "avx512f,avx512dq,avx512vl,avx512bw,fma"
#define FG_Z_MATH_INLINE static inline __attribute__((always_inline, target(FG_Z_MATH_ISA)))

/* Whether this CPU runs the FG_Z_ISA code (asked once). */
static inline bool fg_z_usable(void) {
    static int known = -1;
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k < 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma");
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k;
}

/* the first n lanes (all 16 from 16 up) */
FG_Z_INLINE __mmask16 fg_z_lanes(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* f32 → bf16 of 16 lanes, fg_v_f32_to_bf16's bits */
FG_Z_INLINE __m256i fg_z_bf16(__m512 v) {
    if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) == 0, 1)) { /* no subnormal lane */
        const __m256bh h = _mm512_cvtneps_pbh(v);
        __m256i r;
        memcpy(&r, &h, sizeof r);
        return r;
    }
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 isnan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                    _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, isnan, nan));
}

/* 16 elements of p (f32 or bf16, a constant at the call) from element i, lanes k (the others 0) */
FG_Z_INLINE __m512 fg_z_ld(const void *p, fg_dtype t, int64_t i, __mmask16 k) {
    if (t == FG_BF16) {
        const __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)p + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(k, (const float *)p + i);
}

FG_Z_INLINE void fg_z_st(void *p, fg_dtype t, int64_t i, __mmask16 k, __m512 v) {
    if (t == FG_BF16) _mm256_mask_storeu_epi16((uint16_t *)p + i, k, fg_z_bf16(v));
    else _mm512_mask_storeu_ps((float *)p + i, k, v);
}

/* 16 elements stored from element i (a 64-byte aligned f32 address, a 32-byte aligned bf16 one)
   past the caches (non-temporal: no read of the line before it is written) */
FG_Z_INLINE void fg_z_stream(void *p, fg_dtype t, int64_t i, __m512 v) {
    if (t == FG_BF16) _mm256_stream_si256((__m256i *)((uint16_t *)p + i), fg_z_bf16(v));
    else _mm512_stream_ps((float *)p + i, v);
}

/* e^x for x ≤ 0 or NaN: fg_v_exp's reduction and polynomial, 2^n by scalef (subnormal
   results as expf's, 0 below −104) */
FG_Z_MATH_INLINE __m512 fg_z_exp_neg(__m512 x) {
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), x); /* NaN stays (the second operand) */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    const __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* 1/d for d finite, normal and nonzero: the 14-bit estimate and one Newton step (within about
   an ulp) */
FG_Z_MATH_INLINE __m512 fg_z_rcp(__m512 d) {
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}

/* c·tanh(x/c) (inv_c = 1/c rounded): for |x/c| < 9.0125 the rational minimax form of tanh of
   degree 13/6 that Eigen and XLA use, t·P(t²)/Q(t²), its argument clamped to ±7.99881172 (where
   it reaches its top) and c·t taken as x itself; past 9.0125 ±c, as tanh rounds to ±1 in f32
   there. Within about 5 ulp of c·tanh(x/c) (2 ulp at x → 0); NaN stays NaN. */
FG_Z_INLINE __m512 fg_z_softcap(__m512 x, float c, float inv_c) {
    const float lim = 7.99881172180175781f;
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(lim * c), _mm512_max_ps(_mm512_set1_ps(-lim * c), x)); /* NaN stays */
    const __m512 t = _mm512_mul_ps(xc, _mm512_set1_ps(inv_c));
    const __m512 t2 = _mm512_mul_ps(t, t);
    __m512 p = _mm512_set1_ps(-2.76076847742355e-16f);
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(2.00018790482477e-13f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(-8.60467152213735e-11f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(5.12229709037114e-08f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.48572235717979e-05f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(6.37261928875436e-04f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(4.89352455891786e-03f));
    __m512 q = _mm512_set1_ps(1.19825839466702e-06f);
    q = _mm512_fmadd_ps(q, t2, _mm512_set1_ps(1.18534705686654e-04f));
    q = _mm512_fmadd_ps(q, t2, _mm512_set1_ps(2.26843463243900e-03f));
    q = _mm512_fmadd_ps(q, t2, _mm512_set1_ps(4.89352518554385e-03f));
    const __m512 y = _mm512_mul_ps(xc, _mm512_mul_ps(p, fg_z_rcp(q))); /* P/Q ≈ 1 first: no underflow at subnormal x */
    const __m512 cs = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(x), _mm512_set1_epi32(0x80000000), _mm512_castps_si512(_mm512_set1_ps(c)), 0xea)); /* ±c */
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(9.0125f * c), _CMP_GE_OQ), cs);
}

/* d/dx c·tanh(x/c) = 1 − tanh²(x/c) = e/((1 + e)/2)², e = e^(−2|x/c|): no cancellation where
   tanh → ±1; 0 far out, NaN for NaN */
FG_Z_INLINE __m512 fg_z_softcap_slope(__m512 x, float inv_c) {
    const __m512 e = fg_z_exp_neg(_mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(-2.0f * inv_c)));
    const __m512 inv = fg_z_rcp(_mm512_fmadd_ps(e, _mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f)));
    return _mm512_mul_ps(_mm512_mul_ps(e, inv), inv);
}

/* The same two for bf16 data, whose 8 significant bits leave room for cheaper math: relative
   errors near 2^-13 instead of a few f32 ulp (the result is then rounded to bf16, whose relative
   half-ulp is at least 2^-9); c within fg_softcap_bf16_consts's range. */

/* c·tanh(x/c) = x·R(t²), t = x/c, with R(s) = (1 + p1·s + p2·s²) / (1 + q1·s + q2·s²) ≈ tanh(t)/t a
   minimax fit of relative error 2^-13.8 over |t| ≤ 5.2743, evaluated as K + (b + a·s)/Q(s)
   (K = p2/q2: one multiply fewer) with 1/c folded into the coefficients (s in units of x²) and
   1/Q by rcp14 alone (2^-14.2); x is clamped to ±5.2743·c, where t·R(t²) has risen to
   1 + 6.5e-5 (past the rcp14 error), and the result to ±c, so that |x/c| ≥ 5.2743 (and ±inf)
   give exactly ±c; below that bound the clamp to c takes over where x·R passes c (1 − tanh there
   is below 2^-14). At small x (zero, subnormal) R is exactly 1: y = x. NaN stays NaN. Relative
   error of the f32 result ≤ 1.2e-4 (2^-13.0) over every bf16 x for c = 0.7, 1, 3, 30, 1e-3, 1e4
   (tools/softcap_bf16_probe.c); rounded to bf16, within 0.53 bf16 ulp. */
FG_Z_MATH_INLINE __m512 fg_z_softcap_bf16(__m512 x, const fg_softcap_bf16_k *k) {
    const __m512 xc = _mm512_range_ps(x, _mm512_set1_ps(k->x_max), 0x02); /* |x| ≤ x_max, x's sign (NaN: a number) */
    const __m512 s = _mm512_mul_ps(xc, xc);
    const __m512 q = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(k->q2), s, _mm512_set1_ps(k->q1)), s, _mm512_set1_ps(1.0f));
    const __m512 num = _mm512_fmadd_ps(_mm512_set1_ps(k->a), s, _mm512_set1_ps(k->b));
    const __m512 y = _mm512_mul_ps(x, _mm512_fmadd_ps(num, _mm512_rcp14_ps(q), _mm512_set1_ps(k->k))); /* x: NaN stays */
    return _mm512_max_ps(_mm512_set1_ps(-k->c), _mm512_min_ps(_mm512_set1_ps(k->c), y)); /* NaN stays (the second operand) */
}

/* 1 − tanh²(x/c) = e/((1 + e)/2)², e = e^(−2|x/c|) = 2^u: 2^frac(u) by a degree-3 polynomial
   (minimax with p(0) = 1, relative error 2^-13.5), 2^floor(u) by scalef, the reciprocal by rcp14
   alone. Exactly 1 at x = 0, 0 for ±inf (and far out), NaN for NaN. Relative error ≤ 1.6e-4
   (2^-12.6) over every bf16 x whose slope is at least 2^-126, for the c above; rounded to bf16,
   within 0.53 bf16 ulp. */
FG_Z_MATH_INLINE __m512 fg_z_softcap_slope_bf16(__m512 x, float inv_c) {
    const __m512 u = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(-2.88539008f * inv_c)); /* −2|x/c|·log2 e */
    const __m512 f = _mm512_reduce_ps(u, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); /* u − floor(u): 0 for ±inf */
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(7.70665109e-2f), f, _mm512_set1_ps(2.27645576e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.95116639e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    const __m512 e = _mm512_scalef_ps(p, u); /* p·2^floor(u) */
    const __m512 inv = _mm512_rcp14_ps(_mm512_fmadd_ps(e, _mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f)));
    return _mm512_mul_ps(_mm512_mul_ps(e, inv), inv);
}

/* 32 bf16 elements of p from element i (lanes k, the others 0) in one load: the raw words, and as
   f32 the even-numbered elements in *ev and the odd-numbered in *od (a shift and a mask) */
FG_Z_INLINE __m512i fg_z_ld_bf16_eo(const void *p, int64_t i, __mmask32 k, __m512 *ev, __m512 *od) {
    const __m512i w = _mm512_maskz_loadu_epi16(k, (const uint16_t *)p + i);
    *ev = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *od = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
    return w;
}

/* the inverse: 32 bf16 in memory order from the even and odd elements' f32 lanes, by one
   vcvtne2ps2bf16 and a word permutation; fg_v_f32_to_bf16's bits except that subnormal lanes
   come out ±0 (fg_z_bf16_eo puts them right; a caller that knows them can put them back) */
FG_Z_INLINE __m512i fg_z_bf16_eo_ftz(__m512 ev, __m512 od) {
    const __m512bh h = _mm512_cvtne2ps_pbh(od, ev); /* the even elements in the low half */
    __m512i r;
    memcpy(&r, &h, sizeof r);
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                         20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, r);
}

/* the same with fg_v_f32_to_bf16's bits in every case (fg_z_bf16's integer rounding where a lane
   is subnormal) */
FG_Z_INLINE __m512i fg_z_bf16_eo(__m512 ev, __m512 od) {
    if (__builtin_expect((_mm512_fpclass_ps_mask(ev, 0x20) | _mm512_fpclass_ps_mask(od, 0x20)) == 0, 1))
        return fg_z_bf16_eo_ftz(ev, od);
    const __m512i e = _mm512_cvtepu16_epi32(fg_z_bf16(ev)), o = _mm512_cvtepu16_epi32(fg_z_bf16(od));
    return _mm512_or_si512(e, _mm512_slli_epi32(o, 16));
}
#endif /* FG_Z */

#endif /* FG_CPU_VEC_H */

/*
 * rng.h — the counter-based generator behind every dropout in fastgrad (Philox4x32-10,
 * Salmon et al., SC'11), as inline functions that compile in C and in CUDA. A dropout mask
 * is a pure function of (seed, offset, element index), so a backward regenerates it instead
 * of storing it, and the CPU and CUDA backends give the same bits for the same triple.
 *
 * The mask of element i (its flat row-major index in the op's logical tensor) under
 * (seed, offset): counter = {i/4 low word, i/4 high word, offset low, offset high},
 * key = {seed low, seed high}, r = word (i mod 4) of Philox4x32-10(counter, key);
 * u = (r >> 8) · 2^-24 in [0, 1); the element is kept when u >= p, and scaled by 1 / (1 − p).
 */
#ifndef FG_RNG_H
#define FG_RNG_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FG_RNG_FN static __host__ __device__ __forceinline__
#else
#define FG_RNG_FN static inline
#endif

typedef struct fg_philox4 {
    uint32_t v[4];
} fg_philox4;

FG_RNG_FN fg_philox4 fg_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                      uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        if (round) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    }
    fg_philox4 r;
    r.v[0] = c0, r.v[1] = c1, r.v[2] = c2, r.v[3] = c3;
    return r;
}

/* The four uniforms in [0, 1) of elements 4q … 4q + 3 (one Philox call). */
FG_RNG_FN void fg_dropout_uniform4(uint64_t seed, uint64_t offset, uint64_t q, float u[4]) {
    const fg_philox4 r = fg_philox4x32_10((uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset,
                                          (uint32_t)(offset >> 32), (uint32_t)seed, (uint32_t)(seed >> 32));
    for (int j = 0; j < 4; j++) u[j] = (float)(r.v[j] >> 8) * (1.0f / 16777216.0f);
}

/* The uniform of element i: u < p means dropped. */
FG_RNG_FN float fg_dropout_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
    const uint64_t q = i >> 2;
    const fg_philox4 r = fg_philox4x32_10((uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset,
                                          (uint32_t)(offset >> 32), (uint32_t)seed, (uint32_t)(seed >> 32));
    return (float)(r.v[i & 3] >> 8) * (1.0f / 16777216.0f);
}


/* Sixteen Philox4x32-10 calls side by side on AVX-512 (host x86 only): the counters
 * {q0 + l low, high, offset low, high} of lanes l = 0 … 15, the same bits as sixteen
 * fg_philox4x32_10 calls; word w of lane l into r[w] lane l. The 32 × 32 → 64-bit products as
 * even- and odd-lane vpmuludq, their high words blended. */
#if !defined(__CUDACC__) && defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define FG_HAVE_PHILOX_X16 1
static inline __attribute__((always_inline, target("avx512f"))) void
fg_philox4x32_10_x16(uint64_t q0, uint64_t offset, uint64_t seed, __m512i r[4]) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lo = _mm512_set1_epi32((int)(uint32_t)q0);
    __m512i c0 = _mm512_add_epi32(lo, lane);
    /* the high word carries where the low one wrapped */
    __m512i c1 = _mm512_mask_add_epi32(_mm512_set1_epi32((int)(uint32_t)(q0 >> 32)), _mm512_cmplt_epu32_mask(c0, lo),
                                       _mm512_set1_epi32((int)(uint32_t)(q0 >> 32)), _mm512_set1_epi32(1));
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)offset), c3 = _mm512_set1_epi32((int)(uint32_t)(offset >> 32));
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
    for (int round = 0; round < 10; round++) {
        if (round) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        const __m512i e0 = _mm512_mul_epu32(c0, m0), o0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
        const __m512i e1 = _mm512_mul_epu32(c2, m1), o1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
        const __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e0, 32), o0);
        const __m512i lo0 = _mm512_mask_blend_epi32(0xAAAA, e0, _mm512_slli_epi64(o0, 32));
        const __m512i hi1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e1, 32), o1);
        const __m512i lo1 = _mm512_mask_blend_epi32(0xAAAA, e1, _mm512_slli_epi64(o1, 32));
        const __m512i n0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32((int)k0), 0x96);
        const __m512i n2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32((int)k1), 0x96);
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    }
    r[0] = c0, r[1] = c1, r[2] = c2, r[3] = c3;
}
#endif

#undef FG_RNG_FN
#endif

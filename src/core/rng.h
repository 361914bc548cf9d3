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

/* x86 host code with GNU vector extensions can run sixteen Philox calls side by side on
   AVX-512 (src/cpu/norm.c's generator, the same bits as fg_philox4x32_10) */
#if !defined(__CUDACC__) && defined(__GNUC__) && defined(__x86_64__)
#define FG_HAVE_PHILOX_X16 1
#endif

#undef FG_RNG_FN
#endif

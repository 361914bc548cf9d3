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

/* Block q of the stream (seed, offset): counter {q low, q high, offset low, offset high}, key seed. */
FG_RNG_FN fg_philox4 fg_dropout_block(uint64_t seed, uint64_t offset, uint64_t q) {
    return fg_philox4x32_10((uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset, (uint32_t)(offset >> 32),
                            (uint32_t)seed, (uint32_t)(seed >> 32));
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

/* The attention family's dropout on the probabilities draws 16-bit uniforms, eight elements a
 * Philox call (half the calls of the form above; in a flash kernel the draw is most of the
 * dropout's cost). Element i (the flat index of (b, h, i, j) in [B, H, L, L]) under (seed,
 * offset): counter = {i/8 low word, i/8 high word, offset low, offset high}, key = {seed low,
 * seed high}, w = word (i/2) mod 4 of Philox4x32-10, bits = (w >> 16·(i mod 2)) & 0xFFFF,
 * u = bits·2^-16; the element is kept when u >= p (bits >= ceil(p·2^16)) and scaled by 1/(1 − p).
 * fg_attn_dropout_half: element i's bits from its block r = fg_dropout_block(seed, offset, i / 8). */
FG_RNG_FN uint32_t fg_attn_dropout_half(const fg_philox4 *r, uint64_t i) {
    return (r->v[(i >> 1) & 3] >> (16u * (unsigned)(i & 1))) & 0xFFFFu;
}

/* The attention dropout's threshold on the bits: kept when bits >= fg_attn_keep_min(p), p in [0, 1). */
FG_RNG_FN uint32_t fg_attn_keep_min(double p) {
    const double t = p * 65536.0;
    uint32_t m = (uint32_t)t;
    return (double)m < t ? m + 1 : m;
}

/* x86 host code with GNU vector extensions can run sixteen Philox calls side by side on
   AVX-512 (src/cpu/norm.c's generator, the same bits as fg_philox4x32_10) */
#if !defined(__CUDACC__) && defined(__GNUC__) && defined(__x86_64__)
#define FG_HAVE_PHILOX_X16 1
#endif

#undef FG_RNG_FN
#endif

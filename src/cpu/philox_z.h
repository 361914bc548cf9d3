/*
 * philox_z.h — src/core/rng.h's dropout generator as AVX-512 code for the CPU backend: the keep
 * bits of 64 consecutive elements from sixteen Philox4x32-10 calls side by side, shared by the
 * normalization family's dropout (norm.c) and the short-k product's fused dropout (gemm.c), so
 * both give the mask of fg_dropout_uniform bit for bit.
 */
#ifndef FG_CPU_PHILOX_Z_H
#define FG_CPU_PHILOX_Z_H

#include "../core/rng.h"

#include <stdint.h>

#ifdef FG_HAVE_PHILOX_X16
#include <immintrin.h>

/* Sixteen Philox4x32-10 calls side by side on AVX-512, each counter word in a 64-bit lane (eight
   calls a register, two registers): vpmuludq multiplies the lanes' low words into whole 64-bit
   products, so a round is four multiplies, four shifts and four three-way XORs and needs no
   blends (rng.h's x16 form, 32-bit lanes, spends a third more on splitting even and odd lanes);
   the high halves carry bits no low word ever reads. The round keys come made once (z_keys). The
   result is the keep bits of elements 4·q0 … 4·q0 + 63 — bit 4k + w for word w of call k, kept
   when its r >> 8 >= threshold, compared as r >= threshold·2^8 (threshold < 2^24) — the bits of
   fg_philox4x32_10 (rng.h). */
typedef struct z_keys {
    uint64_t k0[10], k1[10];
} z_keys;

static inline z_keys z_keys_make(uint64_t seed) {
    z_keys k;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        k.k0[r] = k0, k.k1[r] = k1;
    }
    return k;
}

#define Z_DROP_ISA "avx512f,bmi2"
static inline __attribute__((always_inline, target(Z_DROP_ISA))) uint64_t z_keep_bits(uint64_t q0, uint64_t offset,
                                                                                     const z_keys *keys, __m512i thr8) {
    const __m512i qa = _mm512_add_epi64(_mm512_set1_epi64((long long)q0), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
    const __m512i qb = _mm512_add_epi64(qa, _mm512_set1_epi64(8));
    __m512i a0 = qa, a1 = _mm512_srli_epi64(qa, 32), b0 = qb, b1 = _mm512_srli_epi64(qb, 32);
    __m512i a2 = _mm512_set1_epi64((long long)(uint32_t)offset), a3 = _mm512_set1_epi64((long long)(offset >> 32));
    __m512i b2 = a2, b3 = a3;
    const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
    for (int r = 0; r < 10; r++) {
        const __m512i k0 = _mm512_set1_epi64((long long)keys->k0[r]), k1 = _mm512_set1_epi64((long long)keys->k1[r]);
        const __m512i pa0 = _mm512_mul_epu32(a0, m0), pa1 = _mm512_mul_epu32(a2, m1);
        const __m512i pb0 = _mm512_mul_epu32(b0, m0), pb1 = _mm512_mul_epu32(b2, m1);
        a0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pa1, 32), a1, k0, 0x96);
        a2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pa0, 32), a3, k1, 0x96);
        b0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pb1, 32), b1, k0, 0x96);
        b2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pb0, 32), b3, k1, 0x96);
        a1 = pa1, a3 = pa0, b1 = pb1, b3 = pb0;
    }
    /* word w's keep bits of calls l = 0 … 15 at bits 2l (the low halves' compares) */
    const uint64_t w0 = _mm512_mask_cmpge_epu32_mask(0x5555, a0, thr8) | (uint64_t)_mm512_mask_cmpge_epu32_mask(0x5555, b0, thr8) << 16;
    const uint64_t w1 = _mm512_mask_cmpge_epu32_mask(0x5555, a1, thr8) | (uint64_t)_mm512_mask_cmpge_epu32_mask(0x5555, b1, thr8) << 16;
    const uint64_t w2 = _mm512_mask_cmpge_epu32_mask(0x5555, a2, thr8) | (uint64_t)_mm512_mask_cmpge_epu32_mask(0x5555, b2, thr8) << 16;
    const uint64_t w3 = _mm512_mask_cmpge_epu32_mask(0x5555, a3, thr8) | (uint64_t)_mm512_mask_cmpge_epu32_mask(0x5555, b3, thr8) << 16;
    /* bit 2l → 4l + w: words 0 and 2 into the even bits, 1 and 3 into the odd ones */
    return _pdep_u64(w0 | w2 << 1, 0x5555555555555555ull) | _pdep_u64(w1 | w3 << 1, 0xAAAAAAAAAAAAAAAAull);
}

/* Whether this CPU runs z_keep_bits (asked once). */
static inline int fg_philox_z_usable(void) {
    static int have = -1;
    int k = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (k < 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("bmi2");
        __atomic_store_n(&have, k, __ATOMIC_RELAXED);
    }
    return k;
}
#endif
#endif

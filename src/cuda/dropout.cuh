/*
 * dropout.cuh — the normalization family's dropout (src/core/rng.h's mask: a 24-bit uniform per
 * element, four elements a Philox call) as the CUDA kernels apply it: the normalization steps,
 * and the linear + activation passes and short-K tiles that fuse it (y = m ⊙ act(pre),
 * g = (m ⊙ dy) ⊙ act′(pre)).
 * One definition, so every fused kernel draws the bits the plain dropout step draws.
 */
#ifndef FG_CUDA_DROPOUT_CUH
#define FG_CUDA_DROPOUT_CUH

#include "../core/internal.h"
#include "../core/rng.h"

/* A dropout as the kernels apply it: keep when u >= thr (thr = threshold·2^-24, exact in f32). */
struct drop_t {
    bool on;
    float thr, scale;
    uint64_t seed, offset;
};

static inline drop_t drop_of(const fg_dropout_gen &g) {
    drop_t d;
    d.on = g.on;
    d.thr = (float)g.threshold * (1.0f / 16777216.0f);
    d.scale = g.scale;
    d.seed = g.seed;
    d.offset = g.offset;
    return d;
}

/* m[e] for the N elements at flat indices i0 … i0 + N − 1 where i0 and N are multiples of four
 * (whole Philox groups, each call's words by fixed position): for kernels whose indices are so
 * by construction, with no run-time path for the other case. */
template <int N>
__device__ __forceinline__ void drop_mask_groups(const drop_t &d, int64_t i0, float (&m)[N]) {
    static_assert(N % 4 == 0, "whole Philox groups");
    float u[4];
#pragma unroll
    for (int g = 0; g < N / 4; g++) {
        fg_dropout_uniform4(d.seed, d.offset, ((uint64_t)i0 >> 2) + g, u);
#pragma unroll
        for (int e = 0; e < 4; e++) m[4 * g + e] = u[e] >= d.thr ? d.scale : 0.f;
    }
}

/* m[e] for the N elements at flat indices i0 … i0 + N − 1: one Philox call per group of four.
 * Whole groups (N a multiple of four from a multiple of four, as 16-byte vectors of f32, f16 and
 * bf16 in aligned rows start) take each call's words by fixed positions; elsewhere the position
 * in the group is followed at run time. */
template <int N>
__device__ __forceinline__ void drop_mask(const drop_t &d, int64_t i0, float (&m)[N]) {
    if (!d.on) {
#pragma unroll
        for (int e = 0; e < N; e++) m[e] = 1.f;
        return;
    }
    uint64_t q = (uint64_t)i0 >> 2;
    int o = (int)(i0 & 3);
    float u[4];
    if constexpr (N % 4 == 0) {
        if (o == 0) {
            drop_mask_groups<N>(d, i0, m);
            return;
        }
    }
    fg_dropout_uniform4(d.seed, d.offset, q, u);
#pragma unroll
    for (int e = 0; e < N; e++) {
        if (o == 4) {
            fg_dropout_uniform4(d.seed, d.offset, ++q, u);
            o = 0;
        }
        m[e] = u[o] >= d.thr ? d.scale : 0.f;
        o++;
    }
}

#endif

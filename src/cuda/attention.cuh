/*
 * attention.cuh — what the CUDA attention kernels share (attention.cu: the whole-sequence and
 * tiled SIMT kernels; attention_keys.cu: the key-lane kernels; attention_flash.cu: the
 * tensor-core kernels): the run's parameters as a
 * kernel argument, element access through [B, H, L, X] views with element strides, the
 * key-padding length of a sequence and the flag a bad one raises, the dropout factor of an
 * element (src/core/rng.h, index ((b·H + h)·L + i)·L + j) and its walk along a row, and warp
 * reductions that keep a NaN.
 * Why one place: every path must mask, drop and flag exactly as the CPU reference does
 * (src/cpu/attention_rows.h), so the rules are written once.
 */
#ifndef FG_CUDA_ATTENTION_CUH
#define FG_CUDA_ATTENTION_CUH

#include "cuda_internal.h"
#include "elem.cuh"

#include "../core/rng.h"

#include <math.h>
#include <stdint.h>

/* A [B, H, L, X] operand: base pointer and element strides; p NULL: absent. */
struct attn_view {
    void *p;
    int64_t sb, sh, sl, sx;
};

template <typename X>
__device__ __forceinline__ X *at(const attn_view &v, int64_t b, int64_t h, int64_t i, int64_t x) {
    return (X *)v.p + (b * v.sb + h * v.sh + i * v.sl + x * v.sx);
}

struct attn_params {
    int B, H, L, hd;
    float scale;
    bool causal, dropout, accumulate, len64;
    float keep_threshold, keep_scale;
    unsigned long long seed, offset;
    const void *lengths;     /* [B] i32 / i64, NULL: none */
    attn_view q, k, v, o, sin, sout;         /* forward (and o, q, k, v, sin for the backward) */
    attn_view dout, dso, dq, dk, dv, dsin;   /* backward */
    float *lse;              /* [B, H, L] */
    float *D;                /* backward: the workspace's D = Σ do·o per row, [B, H, L] */
    unsigned long long *flag;
};

/* The sequence's key count; a length outside [0, L] sets *bad (the caller NaNs what it owns). */
__device__ __forceinline__ int seq_len(const attn_params &a, int64_t b, bool *bad) {
    *bad = false;
    if (!a.lengths) return a.L;
    const int64_t n = a.len64 ? ((const long long *)a.lengths)[b] : (int64_t)((const int *)a.lengths)[b];
    if (n < 0 || n > a.L) {
        *bad = true;
        return 0;
    }
    return (int)n;
}

/* The first bad length's sequence for fg_context_check (the smallest index wins). */
__device__ __forceinline__ void raise_bad_length(const attn_params &a, int64_t b) {
    atomicCAS(a.flag, 0ull, (unsigned long long)FG_FLAG_BAD_LENGTH);
    atomicMax(a.flag + 1, ~(unsigned long long)b);
}

/* The keys query i sees: [0, jend). */
__device__ __forceinline__ int key_end(const attn_params &a, int i, int len) {
    return a.causal ? min(i + 1, len) : len;
}

/* fg_dropout_uniform's value, the word picked by selects (its r.v[i & 3] indexes the words
   dynamically, which puts them in local memory on the device) */
__device__ __forceinline__ fg_philox4 dropout_block(uint64_t seed, uint64_t offset, uint64_t q) {
    return fg_philox4x32_10((uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset, (uint32_t)(offset >> 32),
                            (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* the uniform of word k (0 … 3) of a block */
__device__ __forceinline__ float dropout_word_u(const fg_philox4 &r, unsigned k) {
    const uint32_t w = k == 0 ? r.v[0] : k == 1 ? r.v[1] : k == 2 ? r.v[2] : r.v[3];
    return (float)(w >> 8) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ float dropout_u(uint64_t seed, uint64_t offset, uint64_t idx) {
    return dropout_word_u(dropout_block(seed, offset, idx >> 2), (unsigned)(idx & 3));
}

/* The dropout factor of (b, h, i, j): keep_scale when kept, 0 when dropped, 1 without dropout. */
__device__ __forceinline__ float keep_factor(const attn_params &a, int64_t n, int i, int j) {
    if (!a.dropout) return 1.f;
    const uint64_t idx = ((uint64_t)n * (uint64_t)a.L + (uint64_t)i) * (uint64_t)a.L + (uint64_t)j;
    return dropout_u(a.seed, a.offset, idx) >= a.keep_threshold ? a.keep_scale : 0.f;
}

/* keep_factor along one query row (b, h, i), keys in increasing order: the Philox block of four
   keys is computed once and reused for the next three (same bits as keep_factor). */
struct keep_row {
    uint64_t base, q;
    fg_philox4 r;
    __device__ __forceinline__ keep_row(const attn_params &a, int64_t n, int i)
        : base(((uint64_t)n * (uint64_t)a.L + (uint64_t)i) * (uint64_t)a.L), q(~0ull) {}
    __device__ __forceinline__ float at(const attn_params &a, int j) {
        if (!a.dropout) return 1.f;
        const uint64_t idx = base + (uint64_t)j;
        if (idx >> 2 != q) q = idx >> 2, r = dropout_block(a.seed, a.offset, q);
        return dropout_word_u(r, (unsigned)(idx & 3)) >= a.keep_threshold ? a.keep_scale : 0.f;
    }
};

/* keep_factor of one word of a Philox block (dropout_word_u's uniform against the threshold) */
__device__ __forceinline__ float keep_of_word(const attn_params &a, uint32_t w) {
    return (float)(w >> 8) * (1.0f / 16777216.0f) >= a.keep_threshold ? a.keep_scale : 0.f;
}

/* The flash kernels' dropout factors with one Philox block a lane instead of one an element, for
   L % 4 == 0 (a block's four keys then lie in one row of one (query, key-group)); the same values
   as keep_factor. Called by the whole warp. Rows form (forward, dq: queries i_lo and i_lo + 8 as the
   accumulator's rows, keys jb + 2·t4 and + 1 as its columns, jb a multiple of 8): lanes t4 and
   t4 ^ 1 share their blocks; the even one draws row i_lo's, the odd one row i_hi's, and each hands
   the other the two words it needs. kf: (i_lo, j), (i_lo, j + 1), (i_hi, j), (i_hi, j + 1). */
__device__ __forceinline__ void keep_rows2(const attn_params &a, int64_t n, int i_lo, int jb, int t4, float kf[4]) {
    const int odd = t4 & 1;
    const uint64_t q = (((uint64_t)n * (uint64_t)a.L + (uint64_t)(i_lo + 8 * odd)) * (uint64_t)a.L +
                        (uint64_t)(jb + 4 * (t4 >> 1))) >> 2;
    const fg_philox4 r = dropout_block(a.seed, a.offset, q);
    const uint32_t s0 = __shfl_xor_sync(0xffffffffu, odd ? r.v[0] : r.v[2], 1);
    const uint32_t s1 = __shfl_xor_sync(0xffffffffu, odd ? r.v[1] : r.v[3], 1);
    kf[0] = keep_of_word(a, odd ? s0 : r.v[0]), kf[1] = keep_of_word(a, odd ? s1 : r.v[1]);
    kf[2] = keep_of_word(a, odd ? r.v[2] : s0), kf[3] = keep_of_word(a, odd ? r.v[3] : s1);
}

/* Keys form (dk / dv: keys j_lo = jg + u and j_lo + 8 as the rows, jg a multiple of 4 and u =
   (lane / 4) % 4; queries ib + 2·t4 and + 1 as the columns): the four lanes u = 0 … 3 of a t4 share
   four blocks, element e = 2·(key row) + (query parity) of each; lane u draws block u and, in
   rounds k = 1 … 3, lane u reads word u of block u ^ k from lane u ^ k. kf: (i, j_lo),
   (i + 1, j_lo), (i, j_hi), (i + 1, j_hi). */
__device__ __forceinline__ void keep_keys4(const attn_params &a, int64_t n, int jg, int ib, int lane, float kf[4]) {
    const int t4 = lane & 3, u = (lane >> 2) & 3;
    const uint64_t q = (((uint64_t)n * (uint64_t)a.L + (uint64_t)(ib + 2 * t4 + (u & 1))) * (uint64_t)a.L +
                        (uint64_t)(jg + 8 * (u >> 1))) >> 2;
    const fg_philox4 r = dropout_block(a.seed, a.offset, q);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int wsel = u ^ k; /* the word the reader u ^ k wants of this lane's block, and the element this lane fills */
        const uint32_t mine = wsel == 0 ? r.v[0] : wsel == 1 ? r.v[1] : wsel == 2 ? r.v[2] : r.v[3];
        const float f = keep_of_word(a, k ? __shfl_xor_sync(0xffffffffu, mine, 4 * k) : mine);
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (e == wsel) kf[e] = f;
    }
}

/* max that keeps a NaN (fmaxf drops it: a NaN score must make its row NaN, as on the CPU) */
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = nan_max(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* The tensor-core path (attention_flash.cu): whether it takes a problem, whether it runs its
   sm_90a (warpgroup MMA) form on the device, and its run (the backward starts with D = Σ do·o
   into a.D). */
bool fg_cuda_attn_flash_fits(const fg_attn_problem *p);
bool fg_cuda_attn_flash_w9(const fg_attn_problem *p, int device);
cudaError_t fg_cuda_attn_flash(const attn_params &a, bool forward, fg_dtype dtype, bool w9, cudaStream_t st);

/* The key-lane kernels for short sequences (attention_keys.cu; L <= 64, hd <= 8): whether they
   take a problem (then its key slots a lane and padded head dim), and their run. */
bool fg_cuda_attn_keys_fits(const fg_attn_problem *p, int *ns, int *hdp);
cudaError_t fg_cuda_attn_keys(const attn_params &a, bool forward, fg_dtype dtype, bool s32, int ns, int hdp,
                              cudaStream_t st);

/* Host: the kernel arguments of a call (f32 lse; f64 never reaches the CUDA kernels). */
static inline attn_view attn_view_of(const fg_attn_view &v) {
    attn_view r = {v.data, v.sb, v.sh, v.sl, v.sx};
    return r;
}

#endif

/*
 * attention.cuh — what the CUDA attention kernels share (attention.cu: the whole-sequence and
 * tiled SIMT kernels; attention_qrow.cu: the short-sequence kernels for hd <= 8;
 * attention_flash.cu: the tensor-core kernels): the run's parameters as a kernel argument,
 * element access through [B, H, L, X] views with element strides, the key-padding length of a
 * sequence and the flag a bad one raises, the dropout factor of an element (src/core/rng.h,
 * index ((b·H + h)·L + i)·L + j) and its walk along a row, warp reductions that keep a NaN, and
 * the thread-a-row kernels' shared-memory row helpers.
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

/* A [B, H, L, X] operand: base pointer and element strides; p NULL: absent. q, k, dq, dk may
   come in pieces ([B, H, L, P, hd]): sp is the piece stride, p piece 0's base. */
struct attn_view {
    void *p;
    int64_t sb, sh, sl, sx, sp;
};

/* piece pc of a q, k, dq or dk view (absent stays absent) */
template <typename X> __device__ __forceinline__ attn_view piece_of(const attn_view &v, int pc) {
    attn_view r = v;
    if (r.p) r.p = (X *)v.p + (int64_t)pc * v.sp;
    return r;
}

template <typename X>
__device__ __forceinline__ X *at(const attn_view &v, int64_t b, int64_t h, int64_t i, int64_t x) {
    return (X *)v.p + (b * v.sb + h * v.sh + i * v.sl + x * v.sx);
}

struct attn_params {
    int B, H, L, hd;
    int P;                   /* q and k pieces (the short-sequence kernels; 1 elsewhere) */
    float scale;
    bool causal, dropout, accumulate, len64;
    unsigned keep_min;       /* the dropout keeps an element whose 16 bits are >= keep_min (rng.h) */
    float keep_scale;
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

/* the 16 bits of position k (0 … 7) of a block, the word picked by selects (fg_attn_dropout_half
   indexes the words dynamically, which puts them in local memory on the device) */
__device__ __forceinline__ uint32_t dropout_bits(const fg_philox4 &r, unsigned k) {
    const uint32_t lo = k & 2 ? r.v[1] : r.v[0], hi = k & 2 ? r.v[3] : r.v[2];
    return __byte_perm(k & 4 ? hi : lo, 0u, k & 1 ? 0x4432u : 0x4410u);
}

/* The dropout factor of (b, h, i, j): keep_scale when kept, 0 when dropped, 1 without dropout. */
__device__ __forceinline__ float keep_factor(const attn_params &a, int64_t n, int i, int j) {
    if (!a.dropout) return 1.f;
    const uint64_t idx = ((uint64_t)n * (uint64_t)a.L + (uint64_t)i) * (uint64_t)a.L + (uint64_t)j;
    return dropout_bits(fg_dropout_block(a.seed, a.offset, idx >> 3), (unsigned)(idx & 7)) >= a.keep_min ? a.keep_scale
                                                                                                       : 0.f;
}

/* keep_factor along one query row (b, h, i), keys in increasing order: the Philox block of eight
   keys is computed once and reused for the next seven (same bits as keep_factor). */
struct keep_row {
    uint64_t base, q;
    fg_philox4 r;
    __device__ __forceinline__ keep_row(const attn_params &a, int64_t n, int i)
        : base(((uint64_t)n * (uint64_t)a.L + (uint64_t)i) * (uint64_t)a.L), q(~0ull) {}
    __device__ __forceinline__ float at(const attn_params &a, int j) {
        if (!a.dropout) return 1.f;
        const uint64_t idx = base + (uint64_t)j;
        if (idx >> 3 != q) q = idx >> 3, r = fg_dropout_block(a.seed, a.offset, q);
        return dropout_bits(r, (unsigned)(idx & 7)) >= a.keep_min ? a.keep_scale : 0.f;
    }
};

/* the keep decisions of a block's eight elements: bit k for position k */
__device__ __forceinline__ uint32_t keep_byte(const attn_params &a, const fg_philox4 &r) {
    uint32_t m = 0;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        m |= ((r.v[w] & 0xFFFFu) >= a.keep_min ? 1u : 0u) << (2 * w);
        m |= ((r.v[w] >> 16) >= a.keep_min ? 1u : 0u) << (2 * w + 1);
    }
    return m;
}

/* The flash kernels' dropout factors with one Philox block a lane for eight elements, for
   L % 8 == 0 (a block's eight keys then lie in one row); the same values as keep_factor. Each
   lane turns its block into a byte of keep bits, the lanes that share the blocks gather the bytes
   by xor shuffles, and each reads its own bits. Called by the whole warp, for two accumulator
   column groups at once.

   Rows form (forward, dq): queries i_lo and i_lo + 8 are the accumulator's rows; keys jb + 8·g +
   2·t4 (+ 1), g = 0, 1, its columns (jb a multiple of 16). The quad's lane t4 draws the block of
   row i_lo + 8·(t4 & 1), keys jb + 8·(t4 >> 1) … + 7. kf[4·g + 2·r + c]: row i_lo + 8·r, key
   jb + 8·g + 2·t4 + c. */
__device__ __forceinline__ void keep_rows8(const attn_params &a, int64_t n, int i_lo, int jb, int t4, float kf[8]) {
    const uint64_t q = (((uint64_t)n * (uint64_t)a.L + (uint64_t)(i_lo + 8 * (t4 & 1))) * (uint64_t)a.L +
                        (uint64_t)(jb + 8 * (t4 >> 1))) >> 3;
    uint32_t m = keep_byte(a, fg_dropout_block(a.seed, a.offset, q)) << (8 * t4);
    m |= __shfl_xor_sync(0xffffffffu, m, 1);
    m |= __shfl_xor_sync(0xffffffffu, m, 2);
    m >>= 2 * t4; /* block b's bits for keys 2·t4 and 2·t4 + 1 at 8·b and 8·b + 1 */
#pragma unroll
    for (int e = 0; e < 8; e++) kf[e] = (m >> (8 * (e >> 1) + (e & 1))) & 1u ? a.keep_scale : 0.f;
}

/* Keys form (dk / dv: keys jg + u and jg + 8 + u, u = lane / 4, the accumulator's rows, jg a
   multiple of 16; queries ib + 8·g + 2·t4 (+ 1), g = 0, 1, its columns, ib a multiple of 16): the
   eight lanes of a t4 share eight blocks (queries ib + 2·t4 + {0, 1, 8, 9} × the key runs jg and
   jg + 8); lane u draws block u (query ib + 2·t4 + {0, 1, 8, 9}[u & 3], keys jg + 8·(u >> 2) …
   + 7) and reads bit u of each. kf[4·g + 2·k + c]: query ib + 8·g + 2·t4 + c, key jg + 8·k + u. */
__device__ __forceinline__ void keep_keys8(const attn_params &a, int64_t n, int jg, int ib, int lane, float kf[8]) {
    const int t4 = lane & 3, u = lane >> 2;
    const int qi = ib + 2 * t4 + (u & 1) + 8 * ((u >> 1) & 1);
    const uint64_t q = (((uint64_t)n * (uint64_t)a.L + (uint64_t)qi) * (uint64_t)a.L + (uint64_t)(jg + 8 * (u >> 2))) >> 3;
    const uint32_t byte = keep_byte(a, fg_dropout_block(a.seed, a.offset, q)) << (8 * (u & 3));
    uint32_t lo = u < 4 ? byte : 0u, hi = u < 4 ? 0u : byte; /* the key runs jg and jg + 8 */
#pragma unroll
    for (int s = 4; s <= 16; s *= 2) {
        lo |= __shfl_xor_sync(0xffffffffu, lo, s);
        hi |= __shfl_xor_sync(0xffffffffu, hi, s);
    }
    lo >>= u, hi >>= u; /* block (query c', run k)'s bit for key u at 8·c' */
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int c4 = 2 * (e >> 2) + (e & 1); /* the query's place in {0, 1, 8, 9} */
        kf[e] = ((e & 2) ? hi : lo) >> (8 * c4) & 1u ? a.keep_scale : 0.f;
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

/* HDP-float rows between shared memory (16-byte aligned) and registers, and their dot product
   (d in order from 0): the thread-a-row kernels' k, v, q and do rows (attention.cu's SHORT
   ROWS, attention_qrow.cu). A warp reading one row at once is a broadcast. */
template <int HDP> __device__ __forceinline__ void rows_put(float *dst, const float x[HDP]) {
#pragma unroll
    for (int c = 0; c < HDP / 4; c++)
        reinterpret_cast<float4 *>(dst)[c] = make_float4(x[4 * c], x[4 * c + 1], x[4 * c + 2], x[4 * c + 3]);
}

template <int HDP> __device__ __forceinline__ void rows_get(const float *row, float x[HDP]) {
#pragma unroll
    for (int c = 0; c < HDP / 4; c++) {
        const float4 k = reinterpret_cast<const float4 *>(row)[c];
        x[4 * c] = k.x, x[4 * c + 1] = k.y, x[4 * c + 2] = k.z, x[4 * c + 3] = k.w;
    }
}

template <int HDP> __device__ __forceinline__ float rows_dot_r(const float x[HDP], const float y[HDP]) {
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < HDP; d++) s += x[d] * y[d];
    return s;
}

/* The tensor-core path (attention_flash.cu): whether it takes a problem, whether it runs its
   sm_90a (warpgroup MMA) form on the device, and its run (the backward starts with D = Σ do·o
   into a.D). */
bool fg_cuda_attn_flash_fits(const fg_attn_problem *p);
bool fg_cuda_attn_flash_w9(const fg_attn_problem *p, int device);
cudaError_t fg_cuda_attn_flash(const attn_params &a, bool forward, fg_dtype dtype, bool w9, cudaStream_t st);

/* The short-sequence kernels (attention_qrow.cu; L <= 64, hd <= 8: a thread a query row, then
   in the backward a thread a key): whether they take a problem (then its padded head dim), and
   their run. */
bool fg_cuda_attn_qrow_fits(const fg_attn_problem *p, int *hdp);
cudaError_t fg_cuda_attn_qrow(const attn_params &a, bool forward, fg_dtype dtype, bool s32, int hdp, cudaStream_t st);
/* the same kernels' instances for q and k in pieces (a.P > 1; attention_qrow_pieces.cu) */
cudaError_t fg_cuda_attn_qrow_pieces(const attn_params &a, bool forward, fg_dtype dtype, bool s32, int hdp,
                                     cudaStream_t st);

/* Host: the kernel arguments of a call (f32 lse; f64 never reaches the CUDA kernels). */
static inline attn_view attn_view_of(const fg_attn_view &v) {
    attn_view r = {v.data, v.sb, v.sh, v.sl, v.sx, v.sp};
    return r;
}

#endif

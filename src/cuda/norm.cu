/*
 * norm.cu — the CUDA steps of the normalization family (their list and meaning: fg_norm_call in
 * src/core/internal.h; the front door and its walk: src/ops/norm.c). Each step is planned and run
 * by the same function (plan_*), so what a plan names is what runs.
 *
 *  ROWS_FORWARD / ROWS_BACKWARD  a group of G threads per row (G a power of two: a few lanes of
 *      a warp for short rows, up to a block for long ones), the row held in registers as 16-byte
 *      vectors (NV per thread): x (and r) read once, s and y written once. Sums are f32 trees
 *      over the group (shuffles, then the group's warps in order in shared memory). Both
 *      directions run persistent grids sized by the occupancy the kernel gets, each thread
 *      streaming its vectors of the rows ahead into a ring in shared memory (cp.async) so that
 *      loads stay in flight while a row's sums go round. The backward's groups keep their
 *      columns' dw / db over the rows they take in shared memory; a block adds its groups in
 *      order and writes one partial row, and a finish kernel adds the blocks' partials in
 *      block order. Rows of at least 128 threads without the rarer options (the forward without
 *      the residual, the backward without ds, dr or accumulate) take the LEAN kernels instead:
 *      the same split and sums, a row a block without the ring. Rows that do not fit (D > 16384,
 *      or D not a multiple of the vector, or pointers / row strides not 16-byte aligned) take
 *      the loop kernels: a block a row, the statistics in one pass around the row's first
 *      element (a shift that keeps E[d²] − E[d]² from cancelling), a second pass that writes;
 *      their dw / db come from the column kernel below.
 *  BN_* and the loop path's dw / db  a 2-D grid of column tiles × row slabs: threads own four
 *      columns (one when unaligned) and walk the slab's rows keeping f64 sums,
 *      the block's rows are added in order, one partial row per slab; a finish kernel adds the
 *      slabs in order. The apply kernels form each channel's coefficients from the f64 sums in
 *      every block; the blocks of the first slab write mean / rstd, the running statistics and
 *      dw / db.
 *  DROPOUT  one pass, 16-byte vectors with a scalar tail. REVIN_*  a warp per (instance, channel) for the statistics, a thread per element to apply.
 * Dropout masks are src/core/rng.h's, the same bits as the CPU backend's, regenerated in the
 * backward; s = x + r·m is an f32 multiply then an f32 add (no FMA), rounded to the dtype, and
 * the norm is taken of that rounded s — what the unfused x + dropout(r), norm(·) computes.
 * No floating-point atomics anywhere: every sum has a fixed order, the same bits every run.
 */
#include "cuda_internal.h"
#include "elem.cuh"
#include "dropout.cuh"

#include <cooperative_groups.h>

#include "../core/rng.h"


#include <math.h>
#include <stdio.h>
#include <string.h>

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
__device__ __forceinline__ int64_t cdiv_d(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int pow2_at_least(int64_t n) {
    int p = 1;
    while (p < n && p < (1 << 30)) p <<= 1;
    return p;
}

/* ------------------------------------------------------------------ device helpers */

/* The row kernels' rings: 16 bytes global → shared bypassing L1 (cp.async.cg), a group's end,
 * and the wait for all but the N newest groups. The clobbers keep the compiler from moving
 * shared-memory reads across them. */
__device__ __forceinline__ void ring_copy16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void ring_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ring_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <typename T> __device__ __forceinline__ float round_to(float v) { return to_acc(from_acc<T>(v)); }

/* x + r·m without a fused multiply-add (the CPU's bits), rounded to T */
template <typename T> __device__ __forceinline__ float residual(float x, float r, float m) {
    return round_to<T>(__fadd_rn(x, __fmul_rn(r, m)));
}

/* Element i of a tensor of fg_dtype dt (f32 / f16 / bf16), as f32; and a store (+ the old value). */
__device__ __forceinline__ float load_as(const void *p, int dt, int64_t i) {
    switch (dt) {
    case FG_F16: return __half2float(((const __half *)p)[i]);
    case FG_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void store_as(void *p, int dt, int64_t i, float v, bool accumulate) {
    if (accumulate) v += load_as(p, dt, i);
    switch (dt) {
    case FG_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case FG_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* A row's statistics with their roundings written out, so that every kernel (and a backward
 * recomputing them) makes the same ones whatever the compiler would contract in that kernel: the
 * sum of x (RMS: of x², each square rounded before its add), the sum of (x − mean)² by fused steps,
 * the mean a rounded product, rstd from a fused sum·(1/D) + eps (RMS: the product rounded, then
 * the add): the forms the forward kernels compiled to before they were written out. */
__device__ __forceinline__ float stat_add(float acc, float v, bool rms) { return __fadd_rn(acc, rms ? __fmul_rn(v, v) : v); }
__device__ __forceinline__ float stat_sq(float acc, float v, float mean) {
    const float d = __fsub_rn(v, mean);
    return __fmaf_rn(d, d, acc);
}
__device__ __forceinline__ float stat_rstd(float sum, float inv_d, float eps, bool rms) {
    return 1.f / sqrtf(rms ? __fadd_rn(__fmul_rn(sum, inv_d), eps) : __fmaf_rn(sum, inv_d, eps));
}

/* Sums of K values over a group of G threads (G a power of two; the block's threads are groups
 * of G in order). G <= 32: xor shuffles inside the group; else also the group's warps, in order,
 * through smem (>= blockDim/32·K floats). Every thread of the block must call it. With par, the
 * calls alternate between two regions of smem (2·RED_REGION floats, K <= 2): a call's writes
 * cannot reach the region the previous call's readers may still read, so one barrier a call. */
constexpr int RED_REGION = 512 / 32 * 2;
template <int K>
__device__ __forceinline__ void group_sum(float (&v)[K], int G, float *smem, int *par = nullptr) {
    const int lanes = G < 32 ? G : 32;
    for (int off = lanes >> 1; off > 0; off >>= 1)
#pragma unroll
        for (int k = 0; k < K; k++) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    if (G <= 32) return;
    const int warp = threadIdx.x >> 5, W = G >> 5, first = warp / W * W;
    if (par) {
        static_assert(K <= 2, "a region holds 16 warps' two sums");
        smem += *par * RED_REGION;
        *par ^= 1;
    } else {
        __syncthreads(); /* the previous call's readers are done */
    }
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int k = 0; k < K; k++) smem[warp * K + k] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++) {
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < W; i++) t += smem[(first + i) * K + k];
        v[k] = t;
    }
}

/* ------------------------------------------------------------------ row norms */

struct rows_args {
    int64_t rows, cols;
    const void *x, *r, *w, *b, *dy, *ds;
    void *y, *s, *dx, *dr;
    int64_t ld_x, ld_r, ld_y, ld_s, ld_dy, ld_ds, ld_dx, ld_dr;
    float *mean, *rstd;         /* saved statistics (NULL: not written / recomputed) */
    float *mean_out, *rstd_out; /* the loop backward's recomputed statistics, for its dw / db */
    float eps;
    bool rms, accumulate;
    drop_t drop;
    float *part;                /* register backward: [gridDim.x][2][cols] (dw, db) */
    bool want_dw, want_db;
    int G;                      /* threads per row */
};

/* The forward, a row per group of G threads (at most 512), NV vectors of VEC elements per thread.
 * The grid is persistent. With STAGES > 0 each thread streams its own vectors of the rows ahead
 * into a ring of STAGES slots in shared memory (16-byte cp.async): while a row's sums go round
 * the group, the loads of the group's next rows are in flight, and holding them costs shared
 * memory, not registers (registers bound how many blocks an SM keeps). A thread reads back only
 * what it copied itself, so the ring needs no barrier. STAGES = 0 (rows whose ring would not
 * fit): plain loads. */
template <typename T, int VEC, int NV, bool RES, int STAGES>
__global__ void __launch_bounds__(512) rows_fwd_reg(const rows_args a) {
    __shared__ float red[512 / 32 * 2];
    extern __shared__ uint4 ring[]; /* [STAGES][RES ? 2 : 1][NV][blockDim.x], then w and b */
    static_assert(sizeof(vec_t<T, VEC>) == 16, "the ring holds 16-byte vectors");
    const int G = a.G, R = blockDim.x / G, grp = threadIdx.x / G, t = threadIdx.x % G;
    const int64_t nvec = a.cols / VEC, step = (int64_t)gridDim.x * R;
    const float inv_d = 1.f / (float)a.cols;
    const int slot = (RES ? 2 : 1) * NV * blockDim.x; /* uint4s a stage */
    auto fetch = [&](int64_t row, int stage) { /* row's vectors of this thread into the stage; one group */
        if (STAGES == 0) return;
        uint4 *st = ring + stage * slot + threadIdx.x;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            if (row < a.rows && vi < nvec) {
                ring_copy16(st + k * blockDim.x, (const T *)a.x + row * a.ld_x + vi * VEC);
                if (RES)
                    ring_copy16(st + (NV + k) * blockDim.x, (const T *)a.r + row * a.ld_r + vi * VEC);
            }
        }
        ring_commit();
    };
    const int64_t first = (int64_t)blockIdx.x * R + grp;
#pragma unroll
    for (int q = 0; q + 1 < STAGES; q++) fetch(first + q * step, q);
    /* with the ring, this thread's columns of w and b wait in shared memory past it ([2][NV][blockDim.x]):
       read once, not again for every row through L1 beside the streams */
    uint4 *wb = ring + STAGES * slot + threadIdx.x;
    if (STAGES > 0)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            if (vi >= nvec) continue;
            if (a.w) wb[k * blockDim.x] = *reinterpret_cast<const uint4 *>((const T *)a.w + vi * VEC);
            if (a.b) wb[(NV + k) * blockDim.x] = *reinterpret_cast<const uint4 *>((const T *)a.b + vi * VEC);
        }
    int stage = 0;
    for (int64_t base = (int64_t)blockIdx.x * R; base < a.rows; base += step) {
        const int64_t row = base + grp;
        const bool active = row < a.rows;
        vec_t<T, VEC> cx[NV], cr[NV];
        if constexpr (STAGES > 0) {
            /* the slot the previous row used is free (this thread read it): the row STAGES − 1 ahead */
            fetch(row + (STAGES - 1) * step, (stage + STAGES - 1) % STAGES);
            ring_wait<STAGES - 1>(); /* this row's group is in */
            const uint4 *st = ring + stage * slot + threadIdx.x;
            stage = (stage + 1) % STAGES;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                *reinterpret_cast<uint4 *>(&cx[k]) = st[k * blockDim.x];
                if (RES) *reinterpret_cast<uint4 *>(&cr[k]) = st[(NV + k) * blockDim.x];
            }
        } else {
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int64_t vi = (int64_t)k * G + t;
                if (!active || vi >= nvec) continue;
                cx[k] = load_vec<T, VEC>((const T *)a.x + row * a.ld_x + vi * VEC);
                if (RES) cr[k] = load_vec<T, VEC>((const T *)a.r + row * a.ld_r + vi * VEC);
            }
        }
        float v[NV][VEC];
        float sum[1] = {0.f};
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            const bool ok = active && vi < nvec;
#pragma unroll
            for (int e = 0; e < VEC; e++) v[k][e] = 0.f;
            if (!ok) continue;
            if (RES) {
                float m[VEC];
                drop_mask<VEC>(a.drop, row * a.cols + vi * VEC, m);
                vec_t<T, VEC> sv;
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    v[k][e] = residual<T>(to_acc(cx[k].v[e]), to_acc(cr[k].v[e]), m[e]);
                    sv.v[e] = from_acc<T>(v[k][e]);
                }
                if (a.s) store_vec<T, VEC>((T *)a.s + row * a.ld_s + vi * VEC, sv);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) v[k][e] = to_acc(cx[k].v[e]);
                if (a.s) store_vec<T, VEC>((T *)a.s + row * a.ld_s + vi * VEC, cx[k]);
            }
#pragma unroll
            for (int e = 0; e < VEC; e++) sum[0] = stat_add(sum[0], v[k][e], a.rms);
        }
        group_sum<1>(sum, G, red);
        float mean = 0.f, rstd;
        if (a.rms) {
            rstd = stat_rstd(sum[0], inv_d, a.eps, true);
        } else {
            mean = __fmul_rn(sum[0], inv_d);
            float sq[1] = {0.f};
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int64_t vi = (int64_t)k * G + t;
                if (!active || vi >= nvec) continue;
#pragma unroll
                for (int e = 0; e < VEC; e++) sq[0] = stat_sq(sq[0], v[k][e], mean);
            }
            group_sum<1>(sq, G, red + blockDim.x / 32);
            rstd = stat_rstd(sq[0], inv_d, a.eps, false);
        }
        if (!active) continue;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            if (vi >= nvec) continue;
            vec_t<T, VEC> wv, bv, yv;
            if (STAGES > 0) {
                if (a.w) *reinterpret_cast<uint4 *>(&wv) = wb[k * blockDim.x];
                if (a.b) *reinterpret_cast<uint4 *>(&bv) = wb[(NV + k) * blockDim.x];
            } else {
                if (a.w) wv = load_vec<T, VEC>((const T *)a.w + vi * VEC);
                if (a.b) bv = load_vec<T, VEC>((const T *)a.b + vi * VEC);
            }
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float o = (v[k][e] - mean) * rstd;
                if (a.w) o *= to_acc(wv.v[e]);
                if (a.b) o += to_acc(bv.v[e]);
                yv.v[e] = from_acc<T>(o);
            }
            store_vec<T, VEC>((T *)a.y + row * a.ld_y + vi * VEC, yv);
        }
        if (t == 0) {
            if (a.mean) a.mean[row] = mean;
            if (a.rstd) a.rstd[row] = rstd;
        }
    }
}

/* The backward, as the forward's geometry. dw / db: each group's running sums over its rows in
 * shared memory ([R][2][cols], column j of vector vi at e·nvec + vi, so a warp's updates fall in
 * distinct banks), the groups added in order at the end: one partial row per block. With
 * STAGES > 0, x and dy of the rows ahead stream into a ring after those sums, as in the forward,
 * w waits past it, and a row's values are read from the ring at each use instead of held in
 * registers. DR = false: instances for calls without the residual's gradient dr. */
template <typename T, int VEC, int NV, int STAGES, bool DR>
__global__ void __launch_bounds__(512) rows_bwd_reg(const rows_args a) {
    __shared__ float red[512 / 32 * 2];
    extern __shared__ __align__(16) float pacc[];
    const int G = a.G, R = blockDim.x / G, grp = threadIdx.x / G, t = threadIdx.x % G;
    const int64_t nvec = a.cols / VEC, step = (int64_t)gridDim.x * R;
    const float inv_d = 1.f / (float)a.cols;
    float *mine = a.part ? pacc + (int64_t)grp * 2 * a.cols : NULL;
    /* the ring: [STAGES][2][NV][blockDim.x] 16-byte vectors past the sums (cols is a multiple of VEC), then w */
    uint4 *ring = reinterpret_cast<uint4 *>(pacc + (a.part ? (int64_t)R * 2 * a.cols : 0));
    const int slot = 2 * NV * blockDim.x;
    auto fetch = [&](int64_t row, int stage) {
        if (STAGES == 0) return;
        uint4 *st = ring + stage * slot + threadIdx.x;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            if (row < a.rows && vi < nvec) {
                ring_copy16(st + k * blockDim.x, (const T *)a.x + row * a.ld_x + vi * VEC);
                ring_copy16(st + (NV + k) * blockDim.x, (const T *)a.dy + row * a.ld_dy + vi * VEC);
            }
        }
        ring_commit();
    };
#pragma unroll
    for (int q = 0; q + 1 < STAGES; q++) fetch((int64_t)blockIdx.x * R + grp + q * step, q);
    uint4 *wcols = ring + STAGES * slot + threadIdx.x; /* with the ring: this thread's columns of w ([NV][blockDim.x]) */
    if (STAGES > 0 && a.w)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            if (vi < nvec) wcols[k * blockDim.x] = *reinterpret_cast<const uint4 *>((const T *)a.w + vi * VEC);
        }
    int stage = 0;
    if (mine) {
        for (int64_t i = t; i < 2 * a.cols; i += G) mine[i] = 0.f;
        __syncthreads(); /* (zeroed by other threads of the group than the ones that add into them) */
    }
    for (int64_t base = (int64_t)blockIdx.x * R; base < a.rows; base += step) {
        const int64_t row = base + grp;
        const bool active = row < a.rows;
        /* the row's x and dy as f32: held in registers over the row without the ring; with it
           read again from shared memory at each use, so registers hold only the sums */
        constexpr int HOLD = STAGES > 0 ? 1 : NV;
        float xv[HOLD][VEC], g[HOLD][VEC];
        const uint4 *st = NULL;
        if constexpr (STAGES > 0) {
            fetch(row + (STAGES - 1) * step, (stage + STAGES - 1) % STAGES);
            ring_wait<STAGES - 1>();
            st = ring + stage * slot + threadIdx.x;
            stage = (stage + 1) % STAGES;
        } else {
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int64_t vi = (int64_t)k * G + t;
#pragma unroll
                for (int e = 0; e < VEC; e++) xv[k][e] = g[k][e] = 0.f;
                if (!active || vi >= nvec) continue;
                const vec_t<T, VEC> x = load_vec<T, VEC>((const T *)a.x + row * a.ld_x + vi * VEC);
                const vec_t<T, VEC> dy = load_vec<T, VEC>((const T *)a.dy + row * a.ld_dy + vi * VEC);
#pragma unroll
                for (int e = 0; e < VEC; e++) xv[k][e] = to_acc(x.v[e]), g[k][e] = to_acc(dy.v[e]);
            }
        }
        auto row_vec = [&](int k, float (&xx)[VEC], float (&gg)[VEC]) { /* vector k of x and dy (a live one) */
            if constexpr (STAGES > 0) {
                vec_t<T, VEC> x, dy;
                *reinterpret_cast<uint4 *>(&x) = st[k * blockDim.x];
                *reinterpret_cast<uint4 *>(&dy) = st[(NV + k) * blockDim.x];
#pragma unroll
                for (int e = 0; e < VEC; e++) xx[e] = to_acc(x.v[e]), gg[e] = to_acc(dy.v[e]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) xx[e] = xv[k][e], gg[e] = g[k][e];
            }
        };
        float mean = 0.f, rstd = 0.f;
        if (a.rstd) {
            if (active) {
                rstd = a.rstd[row];
                if (!a.rms) mean = a.mean[row];
            }
        } else { /* recomputed as the forward computes them (a vector past the row adds nothing) */
            float sum[1] = {0.f};
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int64_t vi = (int64_t)k * G + t;
                if (!active || vi >= nvec) continue;
                float xx[VEC], gg[VEC];
                row_vec(k, xx, gg);
#pragma unroll
                for (int e = 0; e < VEC; e++) sum[0] = stat_add(sum[0], xx[e], a.rms);
            }
            group_sum<1>(sum, G, red);
            if (a.rms) {
                rstd = stat_rstd(sum[0], inv_d, a.eps, true);
            } else {
                mean = __fmul_rn(sum[0], inv_d);
                float sq[1] = {0.f};
#pragma unroll
                for (int k = 0; k < NV; k++) {
                    const int64_t vi = (int64_t)k * G + t;
                    if (!active || vi >= nvec) continue;
                    float xx[VEC], gg[VEC];
                    row_vec(k, xx, gg);
#pragma unroll
                    for (int e = 0; e < VEC; e++) sq[0] = stat_sq(sq[0], xx[e], mean);
                }
                group_sum<1>(sq, G, red + blockDim.x / 32);
                rstd = stat_rstd(sq[0], inv_d, a.eps, false);
            }
        }
        /* x̂ and g = dy·w of vector k (the same operations wherever they are made: the same bits) */
        auto xhat_g = [&](int k, int64_t vi, float (&xh)[VEC], float (&gw)[VEC], float (&dyv)[VEC]) {
            float xx[VEC];
            row_vec(k, xx, dyv);
            vec_t<T, VEC> wv;
            if (a.w && STAGES > 0) *reinterpret_cast<uint4 *>(&wv) = wcols[k * blockDim.x];
            else if (a.w) wv = load_vec<T, VEC>((const T *)a.w + vi * VEC);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                xh[e] = (xx[e] - mean) * rstd;
                gw[e] = a.w ? dyv[e] * to_acc(wv.v[e]) : dyv[e];
            }
        };
        /* dy·x̂ and dy go to the group's dw / db */
        float sums[2] = {0.f, 0.f}; /* Σ g·x̂, Σ g */
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            if (!active || vi >= nvec) continue;
            float xh[VEC], gw[VEC], dyv[VEC];
            xhat_g(k, vi, xh, gw, dyv);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                if (mine) {
                    float *pw = mine + e * nvec + vi, *pb = pw + a.cols;
                    *pw += dyv[e] * xh[e];
                    *pb += dyv[e];
                }
                sums[0] += gw[e] * xh[e];
                sums[1] += gw[e];
            }
        }
        group_sum<2>(sums, G, red);
        if (!active) continue;
        const float ca = sums[0] * inv_d, cb = a.rms ? 0.f : sums[1] * inv_d;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t vi = (int64_t)k * G + t;
            if (vi >= nvec) continue;
            float xh[VEC], gw[VEC], dyv[VEC], d[VEC];
            xhat_g(k, vi, xh, gw, dyv);
#pragma unroll
            for (int e = 0; e < VEC; e++) d[e] = rstd * (gw[e] - cb - xh[e] * ca);
            if (a.ds) {
                const vec_t<T, VEC> dsv = load_vec<T, VEC>((const T *)a.ds + row * a.ld_ds + vi * VEC);
#pragma unroll
                for (int e = 0; e < VEC; e++) d[e] += to_acc(dsv.v[e]);
            }
            if (a.dx) {
                T *p = (T *)a.dx + row * a.ld_dx + vi * VEC;
                vec_t<T, VEC> o;
                if (a.accumulate) o = load_vec<T, VEC>(p);
#pragma unroll
                for (int e = 0; e < VEC; e++) o.v[e] = from_acc<T>(a.accumulate ? to_acc(o.v[e]) + d[e] : d[e]);
                store_vec<T, VEC>(p, o);
            }
            if (DR && a.dr) {
                float m[VEC];
                drop_mask<VEC>(a.drop, row * a.cols + vi * VEC, m);
                T *p = (T *)a.dr + row * a.ld_dr + vi * VEC;
                vec_t<T, VEC> o;
                if (a.accumulate) o = load_vec<T, VEC>(p);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float v = d[e] * m[e];
                    o.v[e] = from_acc<T>(a.accumulate ? to_acc(o.v[e]) + v : v);
                }
                store_vec<T, VEC>(p, o);
            }
        }
    }
    if (!a.part) return;
    __syncthreads();
    float *out = a.part + (int64_t)blockIdx.x * 2 * a.cols;
    for (int64_t j = threadIdx.x; j < 2 * a.cols; j += blockDim.x) { /* out[q·cols + j'] in group order */
        const int64_t q = j / a.cols, jj = j - q * a.cols, slot = q * a.cols + (jj % VEC) * nvec + jj / VEC;
        float t2 = 0.f;
        for (int gi = 0; gi < R; gi++) t2 += pacc[(int64_t)gi * 2 * a.cols + slot];
        out[j] = t2;
    }
}

/* The LEAN row kernels: the common case of rows of at least 128 threads (G >= 128, a block a row
 * group) — a forward without the residual (no r, no s), a backward without ds, dr or accumulate,
 * writing dx. The register kernels' split and every sum in their order (the statistics, Σ g·x̂,
 * Σ g, dw / db per column over a block's rows in order, the blocks in order by the finish), so
 * a backward recomputing mean / rstd gets the forward's bits; none of the generic kernels' options
 * in the body: loads that do not allocate in L1 and evict-first stores for the streams (each byte
 * is touched once), one barrier a sum. The forward takes a row a block on a grid of every row; the
 * backward a persistent grid, each block loading its next row while this one's sums go round,
 * its dw / db in registers and written as one partial row. tools/ln_rows_probe.cu measures the
 * same structure against copy. */
template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> ld_once(const T *p) {
    static_assert(sizeof(vec_t<T, VEC>) == 16, "16-byte vectors");
    vec_t<T, VEC> r;
    uint4 &u = *reinterpret_cast<uint4 *>(&r);
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p));
    return r;
}
template <typename T, int VEC>
__device__ __forceinline__ void st_once(T *p, const vec_t<T, VEC> &v) {
    const uint4 &u = *reinterpret_cast<const uint4 *>(&v);
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
                 : "memory");
}

/* A row's mean and rstd from the thread's NV vectors (nvec of the row's vectors in all; RMS:
   mean 0, the root mean square): the register kernels' sums in their order, so the forward and a
   backward recomputing them get the same bits. */
template <typename T, int VEC, int NV, int G>
__device__ __forceinline__ void lean_stats(const vec_t<T, VEC> (&cx)[NV], int nvec, bool rms, float inv_d, float eps,
                                           float *red, int *par, float &mean, float &rstd) {
    const int t = threadIdx.x;
    float sum[1] = {0.f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if (k * G + t >= nvec) continue;
#pragma unroll
        for (int e = 0; e < VEC; e++) sum[0] = stat_add(sum[0], to_acc(cx[k].v[e]), rms);
    }
    group_sum<1>(sum, G, red, par);
    if (rms) {
        mean = 0.f;
        rstd = stat_rstd(sum[0], inv_d, eps, true);
        return;
    }
    mean = __fmul_rn(sum[0], inv_d);
    float sq[1] = {0.f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if (k * G + t >= nvec) continue;
#pragma unroll
        for (int e = 0; e < VEC; e++) sq[0] = stat_sq(sq[0], to_acc(cx[k].v[e]), mean);
    }
    group_sum<1>(sq, G, red, par);
    rstd = stat_rstd(sq[0], inv_d, eps, false);
}

/* The lean forward's body; AFF: LayerNorm with both w and b (the common case, its options known
   at compile time), else every option read at run time. */
template <typename T, int VEC, int NV, int GB, bool AFF>
__device__ __forceinline__ void fwd_lean_body(const rows_args &a, float *red) {
    int par = 0;
    constexpr int G = GB; /* the block, known at compile time: group_sum's loops unroll */
    const int t = threadIdx.x;
    const int64_t row = blockIdx.x;
    const int nvec = (int)(a.cols / VEC); /* <= NV·G: 32-bit vector indices */
    const float inv_d = 1.f / (float)a.cols;
    const T *xr = (const T *)a.x + row * a.ld_x;
    T *yr = (T *)a.y + row * a.ld_y;
    vec_t<T, VEC> cx[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int vi = k * G + t;
        if (vi < nvec) cx[k] = ld_once<T, VEC>(xr + vi * VEC);
    }
    float mean, rstd;
    lean_stats<T, VEC, NV, G>(cx, nvec, !AFF && a.rms, inv_d, a.eps, red, &par, mean, rstd);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int vi = k * G + t;
        if (vi >= nvec) continue;
        vec_t<T, VEC> wv, bv, yv;
        if (AFF || a.w) wv = load_vec<T, VEC>((const T *)a.w + vi * VEC);
        if (AFF || a.b) bv = load_vec<T, VEC>((const T *)a.b + vi * VEC);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float o = (to_acc(cx[k].v[e]) - mean) * rstd;
            if (AFF || a.w) o *= to_acc(wv.v[e]);
            if (AFF || a.b) o += to_acc(bv.v[e]);
            yv.v[e] = from_acc<T>(o);
        }
        st_once<T, VEC>(yr + vi * VEC, yv);
    }
    if (t == 0) {
        if (a.mean) a.mean[row] = mean;
        if (a.rstd) a.rstd[row] = rstd;
    }
}

/* The forward keeps a row's loads in flight and little else, so its speed is the bytes in flight
   an SM: the short splits (NV·VEC <= 16) have their registers capped for FWD_LEAN_THREADS resident
   threads (decision 187). AFF (LayerNorm with w and b) is an instance of its own, so the run-time
   options of the other body do not raise its registers. */
constexpr int FWD_LEAN_THREADS = 1536;
template <typename T, int VEC, int NV, int GB, bool AFF>
__global__ void __launch_bounds__(GB, NV * VEC <= 16 ? FWD_LEAN_THREADS / GB : 1) rows_fwd_lean(const rows_args a) {
    __shared__ float red[2 * RED_REGION];
    fwd_lean_body<T, VEC, NV, GB, AFF>(a, red);
}

/* The lean backward's body; AFF: LayerNorm with w and its saved mean and rstd (the common case,
   its options known at compile time: w loaded once a block, the columns being the same every
   row), else every option read at run time. x̂ and g = dy·w are formed again for dx by the same
   operations (the same bits): kept in registers they took the bf16 backward past 128 registers. */
template <typename T, int VEC, int NV, int GB, bool AFF>
__device__ __forceinline__ void bwd_lean_body(const rows_args &a, float *red) {
    int par = 0;
    constexpr int G = GB;
    const int t = threadIdx.x;
    const int nvec = (int)(a.cols / VEC); /* <= NV·G: 32-bit vector indices */
    const int64_t step = gridDim.x;
    const bool rms = !AFF && a.rms, has_w = AFF || a.w, given = AFF || a.rstd;
    const float inv_d = 1.f / (float)a.cols;
    float accw[NV][VEC], accb[NV][VEC];
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int e = 0; e < VEC; e++) accw[k][e] = accb[k][e] = 0.f;
    vec_t<T, VEC> wa[AFF ? NV : 1]; /* AFF: this thread's columns of w */
    if (AFF)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int vi = k * G + t;
            if (vi < nvec) wa[k] = load_vec<T, VEC>((const T *)a.w + vi * VEC);
        }
    vec_t<T, VEC> cx[NV], cd[NV];
    float cm = 0.f, cr = 0.f;
    auto fetch = [&](int64_t row, vec_t<T, VEC> (&x)[NV], vec_t<T, VEC> (&dy)[NV], float &m, float &r) {
        if (row >= a.rows) return;
        const T *xr = (const T *)a.x + row * a.ld_x, *dr = (const T *)a.dy + row * a.ld_dy;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int vi = k * G + t;
            if (vi >= nvec) continue;
            x[k] = ld_once<T, VEC>(xr + vi * VEC);
            dy[k] = ld_once<T, VEC>(dr + vi * VEC);
        }
        if (given) {
            r = a.rstd[row];
            if (!rms) m = a.mean[row];
        }
    };
    fetch(blockIdx.x, cx, cd, cm, cr);
    for (int64_t row = blockIdx.x; row < a.rows; row += step) {
        vec_t<T, VEC> nx[NV], nd[NV];
        float nm = 0.f, nr = 0.f;
        fetch(row + step, nx, nd, nm, nr);
        float mean = cm, rstd = cr;
        if (!given) /* recomputed as the forward computes them */
            lean_stats<T, VEC, NV, G>(cx, nvec, rms, inv_d, a.eps, red, &par, mean, rstd);
        /* x̂ and g = dy·w of vector k: the same operations at each use (the same bits) */
        auto xhat_g = [&](int k, int vi, float (&xh)[VEC], float (&gw)[VEC], float (&dyv)[VEC]) {
            vec_t<T, VEC> wv;
            if (AFF) wv = wa[k];
            else if (has_w) wv = load_vec<T, VEC>((const T *)a.w + vi * VEC);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                dyv[e] = to_acc(cd[k].v[e]);
                xh[e] = (to_acc(cx[k].v[e]) - mean) * rstd;
                gw[e] = has_w ? dyv[e] * to_acc(wv.v[e]) : dyv[e];
            }
        };
        float sums[2] = {0.f, 0.f}; /* Σ g·x̂, Σ g */
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int vi = k * G + t;
            if (vi >= nvec) continue;
            float xh[VEC], gw[VEC], dyv[VEC];
            xhat_g(k, vi, xh, gw, dyv);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                accw[k][e] += dyv[e] * xh[e];
                accb[k][e] += dyv[e];
                sums[0] += gw[e] * xh[e];
                sums[1] += gw[e];
            }
        }
        group_sum<2>(sums, G, red, &par);
        const float ca = sums[0] * inv_d, cb = rms ? 0.f : sums[1] * inv_d;
        T *dxr = (T *)a.dx + row * a.ld_dx;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int vi = k * G + t;
            if (vi >= nvec) continue;
            float xh[VEC], gw[VEC], dyv[VEC];
            xhat_g(k, vi, xh, gw, dyv);
            vec_t<T, VEC> o;
#pragma unroll
            for (int e = 0; e < VEC; e++) o.v[e] = from_acc<T>(rstd * (gw[e] - cb - xh[e] * ca));
            st_once<T, VEC>(dxr + vi * VEC, o);
        }
#pragma unroll
        for (int k = 0; k < NV; k++) cx[k] = nx[k], cd[k] = nd[k];
        cm = nm, cr = nr;
    }
    if (!a.part) return;
    float *out = a.part + (int64_t)blockIdx.x * 2 * a.cols;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int vi = k * G + t;
        if (vi >= nvec) continue;
#pragma unroll
        for (int e = 0; e < VEC; e++) out[vi * VEC + e] = accw[k][e], out[a.cols + vi * VEC + e] = accb[k][e];
    }
}

/* The AFF body for the short split of 2-byte types (NV·VEC = 16: rows up to 8192 elements); f32
   and the long splits spill with it. Short splits are held to 128 registers (512 threads an SM):
   w in registers took the bf16 256 × 2 backward from 127 to 142, one block an SM, and 32-bit
   indices the f32 256 × 4 one from 128 to 147; capped, neither spills. */
template <typename T, int VEC, int NV, int GB> constexpr bool lean_aff() { return sizeof(T) == 2 && NV * VEC <= 16; }
template <typename T, int VEC, int NV, int GB>
__global__ void __launch_bounds__(GB, NV * VEC <= 16 && GB < 512 ? 512 / GB : 1) rows_bwd_lean(const rows_args a) {
    __shared__ float red[2 * RED_REGION];
    if constexpr (lean_aff<T, VEC, NV, GB>())
        if (!a.rms && a.w && a.rstd && a.mean) {
            bwd_lean_body<T, VEC, NV, GB, true>(a, red);
            return;
        }
    bwd_lean_body<T, VEC, NV, GB, false>(a, red);
}

/* The loop kernels: a block a row, VEC-element vectors (1: any alignment), any D. */
template <typename T, int VEC>
__device__ __forceinline__ void load_s(const rows_args &a, int64_t row, int64_t vi, float (&v)[VEC]) {
    const vec_t<T, VEC> xv = load_vec<T, VEC>((const T *)a.x + row * a.ld_x + vi * VEC);
    if (!a.r) {
#pragma unroll
        for (int e = 0; e < VEC; e++) v[e] = to_acc(xv.v[e]);
        return;
    }
    const vec_t<T, VEC> rv = load_vec<T, VEC>((const T *)a.r + row * a.ld_r + vi * VEC);
    float m[VEC];
    drop_mask<VEC>(a.drop, row * a.cols + vi * VEC, m);
#pragma unroll
    for (int e = 0; e < VEC; e++) v[e] = residual<T>(to_acc(xv.v[e]), to_acc(rv.v[e]), m[e]);
}

/* mean and rstd of a row (the values load(vi) gives), in one pass around the row's first value */
template <typename T, int VEC, typename F>
__device__ __forceinline__ void loop_stats(const rows_args &a, int64_t nvec, float first, F load, float *red,
                                           float *mean, float *rstd) {
    const float shift = a.rms ? 0.f : first;
    float acc[2] = {0.f, 0.f};
    for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) {
        float v[VEC];
        load(vi, v);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const float d = v[e] - shift;
            acc[0] += d;
            acc[1] += d * d;
        }
    }
    group_sum<2>(acc, blockDim.x, red);
    const float inv_d = 1.f / (float)a.cols;
    if (a.rms) {
        *mean = 0.f;
        *rstd = 1.f / sqrtf(acc[1] * inv_d + a.eps);
    } else {
        const float m1 = acc[0] * inv_d, var = fmaxf(acc[1] * inv_d - m1 * m1, 0.f);
        *mean = shift + m1;
        *rstd = 1.f / sqrtf(var + a.eps);
    }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(512) rows_fwd_loop(const rows_args a) {
    __shared__ float red[512 / 32 * 2];
    const int64_t nvec = a.cols / VEC;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        float first[1];
        {
            const float x0 = to_acc(((const T *)a.x)[row * a.ld_x]);
            if (a.r) {
                float m[1];
                drop_mask<1>(a.drop, row * a.cols, m);
                first[0] = residual<T>(x0, to_acc(((const T *)a.r)[row * a.ld_r]), m[0]);
            } else {
                first[0] = x0;
            }
        }
        float mean, rstd;
        loop_stats<T, VEC>(a, nvec, first[0],
                           [&](int64_t vi, float (&v)[VEC]) {
                               load_s<T, VEC>(a, row, vi, v);
                               if (a.s) {
                                   vec_t<T, VEC> sv;
#pragma unroll
                                   for (int e = 0; e < VEC; e++) sv.v[e] = from_acc<T>(v[e]);
                                   store_vec<T, VEC>((T *)a.s + row * a.ld_s + vi * VEC, sv);
                               }
                           },
                           red, &mean, &rstd);
        for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) {
            float v[VEC];
            if (a.s) { /* this thread's own s: the rounded values */
                const vec_t<T, VEC> sv = load_vec<T, VEC>((const T *)a.s + row * a.ld_s + vi * VEC);
#pragma unroll
                for (int e = 0; e < VEC; e++) v[e] = to_acc(sv.v[e]);
            } else {
                load_s<T, VEC>(a, row, vi, v);
            }
            vec_t<T, VEC> wv, bv, yv;
            if (a.w) wv = load_vec<T, VEC>((const T *)a.w + vi * VEC);
            if (a.b) bv = load_vec<T, VEC>((const T *)a.b + vi * VEC);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float o = (v[e] - mean) * rstd;
                if (a.w) o *= to_acc(wv.v[e]);
                if (a.b) o += to_acc(bv.v[e]);
                yv.v[e] = from_acc<T>(o);
            }
            store_vec<T, VEC>((T *)a.y + row * a.ld_y + vi * VEC, yv);
        }
        if (threadIdx.x == 0) {
            if (a.mean) a.mean[row] = mean;
            if (a.rstd) a.rstd[row] = rstd;
        }
    }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(512) rows_bwd_loop(const rows_args a) {
    __shared__ float red[512 / 32 * 2];
    const int64_t nvec = a.cols / VEC;
    const float inv_d = 1.f / (float)a.cols;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const T *xr = (const T *)a.x + row * a.ld_x, *dyr = (const T *)a.dy + row * a.ld_dy;
        float mean = 0.f, rstd;
        if (a.rstd) {
            rstd = a.rstd[row];
            if (!a.rms) mean = a.mean[row];
        } else {
            loop_stats<T, VEC>(a, nvec, to_acc(xr[0]),
                               [&](int64_t vi, float (&v)[VEC]) {
                                   const vec_t<T, VEC> xv = load_vec<T, VEC>(xr + vi * VEC);
#pragma unroll
                                   for (int e = 0; e < VEC; e++) v[e] = to_acc(xv.v[e]);
                               },
                               red, &mean, &rstd);
        }
        float acc[2] = {0.f, 0.f};
        for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) {
            const vec_t<T, VEC> xv = load_vec<T, VEC>(xr + vi * VEC), dv = load_vec<T, VEC>(dyr + vi * VEC);
            vec_t<T, VEC> wv;
            if (a.w) wv = load_vec<T, VEC>((const T *)a.w + vi * VEC);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float xh = (to_acc(xv.v[e]) - mean) * rstd;
                const float gw = a.w ? to_acc(dv.v[e]) * to_acc(wv.v[e]) : to_acc(dv.v[e]);
                acc[0] += gw * xh;
                acc[1] += gw;
            }
        }
        group_sum<2>(acc, blockDim.x, red);
        const float ca = acc[0] * inv_d, cb = a.rms ? 0.f : acc[1] * inv_d;
        for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) {
            const vec_t<T, VEC> xv = load_vec<T, VEC>(xr + vi * VEC), dv = load_vec<T, VEC>(dyr + vi * VEC);
            vec_t<T, VEC> wv;
            if (a.w) wv = load_vec<T, VEC>((const T *)a.w + vi * VEC);
            float d[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float xh = (to_acc(xv.v[e]) - mean) * rstd;
                const float gw = a.w ? to_acc(dv.v[e]) * to_acc(wv.v[e]) : to_acc(dv.v[e]);
                d[e] = rstd * (gw - cb - xh * ca);
            }
            if (a.ds) {
                const vec_t<T, VEC> dsv = load_vec<T, VEC>((const T *)a.ds + row * a.ld_ds + vi * VEC);
#pragma unroll
                for (int e = 0; e < VEC; e++) d[e] += to_acc(dsv.v[e]);
            }
            if (a.dx) {
                T *p = (T *)a.dx + row * a.ld_dx + vi * VEC;
                vec_t<T, VEC> o;
                if (a.accumulate) o = load_vec<T, VEC>(p);
#pragma unroll
                for (int e = 0; e < VEC; e++) o.v[e] = from_acc<T>(a.accumulate ? to_acc(o.v[e]) + d[e] : d[e]);
                store_vec<T, VEC>(p, o);
            }
            if (a.dr) {
                float m[VEC];
                drop_mask<VEC>(a.drop, row * a.cols + vi * VEC, m);
                T *p = (T *)a.dr + row * a.ld_dr + vi * VEC;
                vec_t<T, VEC> o;
                if (a.accumulate) o = load_vec<T, VEC>(p);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float v = d[e] * m[e];
                    o.v[e] = from_acc<T>(a.accumulate ? to_acc(o.v[e]) + v : v);
                }
                store_vec<T, VEC>(p, o);
            }
        }
        if (threadIdx.x == 0 && a.rstd_out) { /* for the column kernel's x̂ */
            a.mean_out[row] = mean;
            a.rstd_out[row] = rstd;
        }
    }
}

/* ------------------------------------------------------------------ column sums (BatchNorm, dw / db) */

/* The column kernels' vectors: four elements (16 bytes of f32, 8 of f16 / bf16) or one. Eight
 * 2-byte columns a thread with two f64 sums each held 150–160 registers: one block an SM
 * (decision 169). */
constexpr int BN_VEC = 4;
template <typename T, int VEC> __device__ __forceinline__ vec_t<T, VEC> col_load(const T *p) {
    if constexpr (sizeof(vec_t<T, VEC>) == 8) {
        vec_t<T, VEC> r;
        *reinterpret_cast<uint2 *>(&r) = __ldg(reinterpret_cast<const uint2 *>(p));
        return r;
    } else {
        return load_vec<T, VEC>(p);
    }
}
template <typename T, int VEC> __device__ __forceinline__ void col_store(T *p, const vec_t<T, VEC> &v) {
    if constexpr (sizeof(vec_t<T, VEC>) == 8) *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(&v);
    else store_vec<T, VEC>(p, v);
}
/* blocks an SM the column kernels' registers are held to: 2-byte types fit three (a few dozen
   bytes of spills in their dropout paths); f32 as the compiler chooses */
template <typename T> constexpr int col_min_blocks() { return sizeof(T) == 2 ? 3 : 1; }

/* BatchNorm's per-row pieces over a thread's VEC columns, one text for the statistics pass, the
 * apply pass and the one-launch kernel (A: col_args or bn_args). The forward's row: v = s =
 * x + dropout(r) (r absent: x), s written when asked; xv becomes s rounded to T, as stored. */
template <typename T, int VEC, bool MAYBE_R = true, typename A>
__device__ __forceinline__ void bn_form_row(const A &a, int64_t row, int64_t j0, vec_t<T, VEC> &xv,
                                            const vec_t<T, VEC> &rv, float (&v)[VEC]) {
    if (MAYBE_R && a.r) { /* (MAYBE_R false: an instance without the residual's code) */
        float m[VEC];
        drop_mask<VEC>(a.drop, row * a.cols + j0, m);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            v[e] = residual<T>(to_acc(xv.v[e]), to_acc(rv.v[e]), m[e]);
            xv.v[e] = from_acc<T>(v[e]);
        }
        if (a.s) col_store<T, VEC>((T *)a.s + row * a.ld_s + j0, xv);
    } else {
#pragma unroll
        for (int e = 0; e < VEC; e++) v[e] = to_acc(xv.v[e]);
    }
}

/* The forward statistics' row: Σ v, Σ v² added. */
template <int VEC>
__device__ __forceinline__ void bn_stats_row(const float (&v)[VEC], double (&s0)[VEC], double (&s1)[VEC]) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const double d = v[e];
        s0[e] += d;
        s1[e] = fma(d, d, s1[e]);
    }
}

/* The backward statistics' row: Σ dy, Σ dy·x̂ added (x̂ = (x − mean)·rstd, mean and rstd per column). */
template <typename T, int VEC>
__device__ __forceinline__ void bn_bwd_stats_row(const vec_t<T, VEC> &xv, const vec_t<T, VEC> &dv,
                                                 const float (&mean)[VEC], const float (&rstd)[VEC],
                                                 double (&s0)[VEC], double (&s1)[VEC]) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float xh = (to_acc(xv.v[e]) - mean[e]) * rstd[e];
        const double dy = to_acc(dv.v[e]);
        s0[e] += dy;
        s1[e] = fma(dy, (double)xh, s1[e]);
    }
}


/* What a column kernel sums (two quantities per column, f64 per thread) and writes. */
enum col_kind {
    COL_BN_STATS,     /* s = x + dropout(r) (written to s): Σ s, Σ s²                             */
    COL_BN_BWD,       /* x̂ = (x − mean[c])·rstd[c]: Σ dy, Σ dy·x̂                                  */
    COL_ROW_PARAMS,   /* x̂ = (x − mean[row])·rstd[row]: Σ dy·x̂, Σ dy (the row norms' dw, db)       */
    COL_REVIN_BWD     /* RevIN's dx written; Σ dy·∂y/∂w, Σ dy·∂y/∂b                                */
};

struct col_args {
    int64_t rows, cols, rows_per_slab;
    const void *x, *r, *dy, *w, *b;
    void *s, *dx;
    int64_t ld_x, ld_r, ld_s, ld_dy, ld_dx;
    const float *mean, *rstd; /* per column (BN), per row (row params), per (instance, column) (RevIN) */
    int64_t steps;            /* RevIN: rows per instance */
    bool denorm, accumulate;
    float eps2;               /* RevIN: eps² */
    drop_t drop;
    double *part;             /* [slabs][2][cols] */
};

constexpr int COL_THREADS = 256;
constexpr int COL_U = 4; /* rows a thread loads before it uses any (BatchNorm's column kernels) */

/* Block (TX, TY): tx owns VEC columns of the tile, ty walks the slab's rows; KIND is a col_kind. */
template <typename T, int VEC, int KIND>
__global__ void __launch_bounds__(COL_THREADS, col_min_blocks<T>()) col_sums(const col_args a) {
    __shared__ double sm[2][COL_THREADS * VEC];
    const int TX = blockDim.x, TY = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
    const int64_t vi = (int64_t)blockIdx.x * TX + tx, nvec = cdiv_d(a.cols, VEC);
    const int64_t j0 = vi * VEC;
    const bool col_ok = vi < nvec;
    const int64_t r0 = (int64_t)blockIdx.y * a.rows_per_slab;
    const int64_t r1 = r0 + a.rows_per_slab < a.rows ? r0 + a.rows_per_slab : a.rows;
    double s0[VEC], s1[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) s0[e] = s1[e] = 0.0;
    float c0[VEC], c1[VEC]; /* per column: BN_BWD mean, rstd; REVIN_BWD w, b */
#pragma unroll
    for (int e = 0; e < VEC; e++) c0[e] = c1[e] = 0.f;
    if (col_ok && KIND == COL_BN_BWD)
#pragma unroll
        for (int e = 0; e < VEC; e++) c0[e] = a.mean[j0 + e], c1[e] = a.rstd[j0 + e];
    if (col_ok && KIND == COL_REVIN_BWD)
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            c0[e] = a.w ? to_acc(((const T *)a.w)[j0 + e]) : 1.f;
            c1[e] = a.b ? to_acc(((const T *)a.b)[j0 + e]) : 0.f;
        }
    if constexpr (KIND == COL_BN_STATS || KIND == COL_BN_BWD) {
        /* COL_U rows a step, every load issued before any use: enough bytes in flight per thread */
        for (int64_t row0 = r0 + ty; col_ok && row0 < r1; row0 += (int64_t)COL_U * TY) {
            vec_t<T, VEC> xv[COL_U], ov[COL_U];
#pragma unroll
            for (int u = 0; u < COL_U; u++) {
                const int64_t row = row0 + (int64_t)u * TY;
                if (row >= r1) continue;
                xv[u] = col_load<T, VEC>((const T *)a.x + row * a.ld_x + j0);
                if (KIND == COL_BN_BWD) ov[u] = col_load<T, VEC>((const T *)a.dy + row * a.ld_dy + j0);
                else if (a.r) ov[u] = col_load<T, VEC>((const T *)a.r + row * a.ld_r + j0);
            }
#pragma unroll
            for (int u = 0; u < COL_U; u++) {
                const int64_t row = row0 + (int64_t)u * TY;
                if (row >= r1) continue;
                if constexpr (KIND == COL_BN_STATS) {
                    float v[VEC];
                    bn_form_row<T, VEC>(a, row, j0, xv[u], ov[u], v);
                    bn_stats_row<VEC>(v, s0, s1);
                } else {
                    bn_bwd_stats_row<T, VEC>(xv[u], ov[u], c0, c1, s0, s1);
                }
            }
        }
    }
    if constexpr (KIND == COL_ROW_PARAMS || KIND == COL_REVIN_BWD)
    for (int64_t row = r0 + ty; col_ok && row < r1; row += TY) {
        const vec_t<T, VEC> xv = col_load<T, VEC>((const T *)a.x + row * a.ld_x + j0);
        if constexpr (KIND == COL_ROW_PARAMS) {
            const vec_t<T, VEC> dv = col_load<T, VEC>((const T *)a.dy + row * a.ld_dy + j0);
            const float rm = a.mean ? a.mean[row] : 0.f, rr = a.rstd[row];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float xh = (to_acc(xv.v[e]) - rm) * rr;
                const double dy = to_acc(dv.v[e]);
                s0[e] = fma(dy, (double)xh, s0[e]);
                s1[e] += dy;
            }
        } else { /* COL_REVIN_BWD */
            const int64_t inst = row / a.steps;
            const vec_t<T, VEC> dv = col_load<T, VEC>((const T *)a.dy + row * a.ld_dy + j0);
            vec_t<T, VEC> o;
            if (a.dx && a.accumulate) o = col_load<T, VEC>((T *)a.dx + row * a.ld_dx + j0);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float mu = a.mean[inst * a.cols + j0 + e], sd = a.rstd[inst * a.cols + j0 + e];
                const float x = to_acc(xv.v[e]), dy = to_acc(dv.v[e]);
                float d, gw, gb;
                if (!a.denorm) { /* y = (x − μ)/σ·w + b */
                    d = dy * c0[e] / sd;
                    gw = dy * ((x - mu) / sd);
                    gb = dy;
                } else { /* y = (x − b)/(w + ε²)·σ + μ */
                    const float den = c0[e] + a.eps2;
                    d = dy * sd / den;
                    gw = -d * ((x - c1[e]) / den);
                    gb = -d;
                }
                o.v[e] = from_acc<T>(a.accumulate ? to_acc(o.v[e]) + d : d);
                s0[e] += (double)gw;
                s1[e] += (double)gb;
            }
            if (a.dx) col_store<T, VEC>((T *)a.dx + row * a.ld_dx + j0, o);
        }
    }
    if (!a.part) return; /* (uniform: the block returns together) */
    /* the block's rows in order (ty), then one partial row per slab */
#pragma unroll
    for (int e = 0; e < VEC; e++) sm[0][ty * TX * VEC + tx * VEC + e] = s0[e], sm[1][ty * TX * VEC + tx * VEC + e] = s1[e];
    __syncthreads();
    if (ty != 0 || !col_ok) return;
    double *out = a.part + (int64_t)blockIdx.y * 2 * a.cols;
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        if (j0 + e >= a.cols) break;
        double t0 = 0.0, t1 = 0.0;
        for (int y = 0; y < TY; y++) t0 += sm[0][y * TX * VEC + tx * VEC + e], t1 += sm[1][y * TX * VEC + tx * VEC + e];
        out[j0 + e] = t0;
        out[a.cols + j0 + e] = t1;
    }
}

/* The finish: tot[i] = Σ_p part[p·n2 + i] over p in order (n2 = 2·cols), 32 lanes a column each
 * adding a run of partials, the runs added in lane order. Then: sums (f64, and sums[n2] = N), or
 * dw (i < cols) / db (i >= cols) cast to their dtypes (+ their old values with accumulate). */
struct finish_args {
    const void *part;
    bool part_f64;
    int64_t parts, n2, cols;
    double *sums;
    double count;
    void *dw, *db;
    int dw_dtype, db_dtype;
    bool accumulate;
};

constexpr int FIN_COLS = 8, FIN_LANES = 32;

__global__ void __launch_bounds__(FIN_COLS *FIN_LANES) finish_kernel(const finish_args a) {
    __shared__ double runs[FIN_COLS][FIN_LANES + 1];
    const int lane = threadIdx.x % FIN_LANES, col = threadIdx.x / FIN_LANES;
    const int64_t i = (int64_t)blockIdx.x * FIN_COLS + col;
    const int64_t per = (a.parts + FIN_LANES - 1) / FIN_LANES;
    const int64_t p0 = lane * per, p1 = p0 + per < a.parts ? p0 + per : a.parts;
    double t = 0.0;
    if (i < a.n2)
        for (int64_t p = p0; p < p1; p++)
            t += a.part_f64 ? ((const double *)a.part)[p * a.n2 + i] : (double)((const float *)a.part)[p * a.n2 + i];
    runs[col][lane] = t;
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0 && a.sums) a.sums[a.n2] = a.count;
    if (lane != 0 || i >= a.n2) return;
    double tot = 0.0;
    for (int l = 0; l < FIN_LANES; l++) tot += runs[col][l];
    if (a.sums) {
        a.sums[i] = tot;
    } else if (i < a.cols) {
        if (a.dw) store_as(a.dw, a.dw_dtype, i, (float)tot, a.accumulate);
    } else if (a.db) {
        store_as(a.db, a.db_dtype, i - a.cols, (float)tot, a.accumulate);
    }
}

/* ------------------------------------------------------------------ BatchNorm apply */

struct bn_args {
    int64_t rows, cols, rows_per_slab;
    bool eval, accumulate, backward;
    const void *x, *r, *dy, *w, *b;
    void *y, *s, *dx, *dr;
    int64_t ld_x, ld_r, ld_y, ld_s, ld_dy, ld_dx, ld_dr;
    int w_dtype, stat_dtype, dw_dtype, db_dtype;
    const double *sums;          /* forward: Σs, Σs², N; backward: Σdy, Σdy·x̂, N */
    void *running_mean, *running_var;
    float *mean, *rstd;          /* forward: written (first slab); backward: read */
    void *dw, *db;
    double eps, momentum;
    drop_t drop;
};

/* Per column of the tile: forward {mean, w·rstd, b}; backward {mean, rstd, w·rstd, Σdy/N, Σdy·x̂/N}.
 * `first` (the first slab's blocks) also writes mean / rstd and the running statistics (forward) or
 * dw / db. */
__device__ void bn_coefficients(const bn_args &a, int64_t j, float *k, bool first) {
    if (!a.backward) {
        double mean, var;
        if (a.eval) {
            mean = load_as(a.running_mean, a.stat_dtype, j);
            var = load_as(a.running_var, a.stat_dtype, j);
        } else {
            const double n = a.sums[2 * a.cols];
            mean = a.sums[j] / n;
            var = a.sums[a.cols + j] / n - mean * mean;
            if (var < 0.0) var = 0.0;
        }
        const float rstd = (float)(1.0 / sqrt(var + a.eps));
        const float w = a.w ? load_as(a.w, a.w_dtype, j) : 1.f, b = a.b ? load_as(a.b, a.w_dtype, j) : 0.f;
        k[0] = (float)mean, k[1] = w * rstd, k[2] = b;
        if (!first) return;
        if (a.mean) a.mean[j] = (float)mean;
        if (a.rstd) a.rstd[j] = rstd;
        if (!a.eval && a.running_mean) {
            const double n = a.sums[2 * a.cols], mom = a.momentum;
            const double unbiased = n > 1.0 ? var * n / (n - 1.0) : var;
            const double rm = load_as(a.running_mean, a.stat_dtype, j), rv = load_as(a.running_var, a.stat_dtype, j);
            store_as(a.running_mean, a.stat_dtype, j, (float)((1.0 - mom) * rm + mom * mean), false);
            store_as(a.running_var, a.stat_dtype, j, (float)((1.0 - mom) * rv + mom * unbiased), false);
        }
        return;
    }
    const float mean = a.mean[j], rstd = a.rstd[j];
    const float w = a.w ? load_as(a.w, a.w_dtype, j) : 1.f;
    k[0] = mean, k[1] = rstd, k[2] = w * rstd, k[3] = 0.f, k[4] = 0.f;
    if (a.sums) {
        const double n = a.sums[2 * a.cols];
        if (!a.eval && n > 0.0) k[3] = (float)(a.sums[j] / n), k[4] = (float)(a.sums[a.cols + j] / n);
        if (first) {
            if (a.dw) store_as(a.dw, a.dw_dtype, j, (float)a.sums[a.cols + j], a.accumulate);
            if (a.db) store_as(a.db, a.db_dtype, j, (float)a.sums[j], a.accumulate);
        }
    }
}

/* The apply pass's forward row: y = (v − mean)·w·rstd + b from bn_coefficients' forward three. */
template <typename T, int VEC>
__device__ __forceinline__ void bn_y_row(const bn_args &a, int64_t row, int64_t j0, const float (&v)[VEC],
                                         const float (&k)[3][VEC]) {
    vec_t<T, VEC> yv;
#pragma unroll
    for (int e = 0; e < VEC; e++) yv.v[e] = from_acc<T>((v[e] - k[0][e]) * k[1][e] + k[2][e]);
    col_store<T, VEC>((T *)a.y + row * a.ld_y + j0, yv);
}

/* The backward's row from bn_coefficients' backward five: d = w·rstd·(dy − Σdy/N − x̂·Σdy·x̂/N)
 * (eval: w·rstd·dy); dx = d, dr = d·m, each added to its old value with accumulate. */
template <typename T, int VEC>
__device__ __forceinline__ void bn_grad_row(const bn_args &a, int64_t row, int64_t j0, const vec_t<T, VEC> &xv,
                                            const vec_t<T, VEC> &dv, const float (&k)[5][VEC]) {
    float d[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float xh = (to_acc(xv.v[e]) - k[0][e]) * k[1][e], dy = to_acc(dv.v[e]);
        d[e] = a.eval ? k[2][e] * dy : k[2][e] * (dy - k[3][e] - xh * k[4][e]);
    }
    if (a.dx) {
        T *p = (T *)a.dx + row * a.ld_dx + j0;
        vec_t<T, VEC> o;
        if (a.accumulate) o = col_load<T, VEC>(p);
#pragma unroll
        for (int e = 0; e < VEC; e++) o.v[e] = from_acc<T>(a.accumulate ? to_acc(o.v[e]) + d[e] : d[e]);
        col_store<T, VEC>(p, o);
    }
    if (a.dr) {
        float m[VEC];
        drop_mask<VEC>(a.drop, row * a.cols + j0, m);
        T *p = (T *)a.dr + row * a.ld_dr + j0;
        vec_t<T, VEC> o;
        if (a.accumulate) o = col_load<T, VEC>(p);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const float v = d[e] * m[e];
            o.v[e] = from_acc<T>(a.accumulate ? to_acc(o.v[e]) + v : v);
        }
        col_store<T, VEC>(p, o);
    }
}

template <typename T, int VEC, bool BWD>
__global__ void __launch_bounds__(COL_THREADS, col_min_blocks<T>()) bn_apply(const bn_args a) {
    constexpr int NK = BWD ? 5 : 3;
    __shared__ float kc[NK][COL_THREADS * VEC / 8 + 8];
    const int TX = blockDim.x, TY = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
    const int64_t vi = (int64_t)blockIdx.x * TX + tx, nvec = cdiv_d(a.cols, VEC), j0 = vi * VEC;
    const bool col_ok = vi < nvec;
    if (ty == 0 && col_ok)
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float k[5];
            bn_coefficients(a, j0 + e, k, blockIdx.y == 0);
            for (int q = 0; q < NK; q++) kc[q][tx * VEC + e] = k[q];
        }
    __syncthreads();
    if (!col_ok) return;
    float k[NK][VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++)
#pragma unroll
        for (int q = 0; q < NK; q++) k[q][e] = kc[q][tx * VEC + e];
    /* the slabs last to first: the statistics pass before this one read them first to last, so
       the first blocks here find its most recent rows still in L2 (an f32 tensor of PatchTST's
       172032 × 128 is 88 MB; the L2 holds about half of it, a bf16 one nearly whole) */
    const int64_t r0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * a.rows_per_slab;
    const int64_t r1 = r0 + a.rows_per_slab < a.rows ? r0 + a.rows_per_slab : a.rows;
    for (int64_t row0 = r0 + ty; row0 < r1; row0 += (int64_t)COL_U * TY) {
        vec_t<T, VEC> xv[COL_U], ov[COL_U];
#pragma unroll
        for (int u = 0; u < COL_U; u++) { /* every load of the step before any store */
            const int64_t row = row0 + (int64_t)u * TY;
            if (row >= r1) continue;
            xv[u] = col_load<T, VEC>((const T *)a.x + row * a.ld_x + j0);
            if (BWD) ov[u] = col_load<T, VEC>((const T *)a.dy + row * a.ld_dy + j0);
            else if (a.r) ov[u] = col_load<T, VEC>((const T *)a.r + row * a.ld_r + j0);
        }
#pragma unroll
        for (int u = 0; u < COL_U; u++) {
            const int64_t row = row0 + (int64_t)u * TY;
            if (row >= r1) continue;
            if constexpr (!BWD) {
                float v[VEC];
                bn_form_row<T, VEC>(a, row, j0, xv[u], ov[u], v);
                bn_y_row<T, VEC>(a, row, j0, v, k);
            } else {
                bn_grad_row<T, VEC>(a, row, j0, xv[u], ov[u], k);
            }
        }
    }
}

/* ------------------------------------------------------------------ BatchNorm in one launch */

/* BN_FORWARD / BN_BACKWARD as one cooperative grid of one RES_THREADS block an SM. Block b takes
 * rows [b·per, (b + 1)·per); thread (tx, ty) four columns of every ty-th row of them. Phase 1
 * reads each row once (the forward forms s = x + dropout(r), writes s when asked, and sums Σ s,
 * Σ s²; the backward sums Σ dy, Σ dy·x̂) and keeps what it read: its first NREG rows in
 * registers, the next `srows` in shared memory (their loads all issued at once, cp.async), the
 * rest not (streamed through a ring of RING rows in shared memory, in both phases). Shared
 * memory is the thread's own: no barrier guards it. The block adds its rows' f64 sums in ty
 * order into one partial row; grid barrier; warp w of block b adds partial column b + w·grid
 * over the blocks (lanes in order, then a fixed shuffle tree); barrier; every block forms the
 * columns' coefficients (bn_coefficients, as the two-kernel path does) and writes y (dx, dr): the
 * rows not kept first, last read first, so that most of them still come from L2. Against the
 * stats kernel + finish + apply kernel this reads x (and dy) from DRAM once where the rows fit on
 * chip, and launches once. MODE: RES_FWD (x), RES_FWD_R (x and r: s formed), RES_BWD (x and
 * dy). Needs a 16-byte aligned four-column vector (bn_vec) and cols ≤ 4·RES_THREADS / 2. */
constexpr int RES_THREADS = 512;
enum { RES_FWD, RES_FWD_R, RES_BWD };
/* rows a thread keeps in registers (32 registers of kept data) and the ring's depth (≈ 48 KB) */
template <typename T, int MODE> constexpr int res_nreg() { return (MODE == RES_BWD ? 4 : 8) * (sizeof(T) == 4 ? 1 : 2); }
template <typename T, int MODE> constexpr int res_ops() { return MODE == RES_FWD ? 1 : 2; }
template <typename T, int MODE> constexpr int res_ring() {
    return 48 * 1024 / (int)(4 * sizeof(T) * res_ops<T, MODE>() * RES_THREADS);
}

struct bnr_args {
    bn_args a;      /* a.sums: tot */
    int64_t per;    /* rows a block */
    int tx, ty;     /* four-column vectors of a row (cols / 4); rows a step (RES_THREADS / tx) */
    int64_t srows;  /* rows a thread keeps in shared memory */
    double *part;   /* [grid][2][cols]: the blocks' partial sums */
    double *tot;    /* [2·cols + 1]: the sums, then N */
};

/* 8 or 16 bytes global → shared without registers (16: L2 only; 8: .ca, the only form it has) */
template <int BYTES> __device__ __forceinline__ void res_copy(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    if constexpr (BYTES == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
}

template <typename T, int MODE>
__global__ void __launch_bounds__(RES_THREADS, 1) bn_resident(const bnr_args p) {
    constexpr int VEC = BN_VEC, NREG = res_nreg<T, MODE>(), U = sizeof(T) == 4 ? 4 : 8;
    constexpr int NOPS = res_ops<T, MODE>(), RING = res_ring<T, MODE>();
    constexpr bool BWD = MODE == RES_BWD, RES = MODE == RES_FWD_R;
    constexpr int NK = BWD ? 5 : 3;
    typedef vec_t<T, VEC> V;
    extern __shared__ __align__(16) unsigned char res_smem[];
    __shared__ double red[RES_THREADS * VEC];
    const bn_args &a = p.a;
    const int tid = threadIdx.x, tx = tid % p.tx, ty = tid / p.tx;
    const bool act = ty < p.ty;
    const int64_t j0 = (int64_t)tx * VEC;
    const int64_t r0 = (int64_t)blockIdx.x * p.per;
    const int64_t r1 = r0 + p.per < a.rows ? r0 + p.per : a.rows;
    const int64_t n = act && r0 + ty < r1 ? cdiv_d(r1 - r0 - ty, p.ty) : 0; /* rows of this thread */
    const int64_t kg = NREG + p.srows;                                       /* the first row not kept */
    const int64_t ks = kg < n ? kg : n;
    V *const kept = reinterpret_cast<V *>(res_smem);              /* [srows][NOPS][RES_THREADS] */
    V *const ring = kept + p.srows * NOPS * RES_THREADS;          /* [RING][NOPS][RES_THREADS] */
    auto slot = [&](V *base, int64_t k, int o) { return base + (k * NOPS + o) * RES_THREADS + tid; };
    auto row_of = [&](int64_t k) { return r0 + ty + k * p.ty; };
    /* operand o of a row: x, then r (forward) or dy (backward) */
    auto src = [&](int64_t row, int o) -> const T * {
        if (o == 0) return (const T *)a.x + row * a.ld_x + j0;
        return BWD ? (const T *)a.dy + row * a.ld_dy + j0 : (const T *)a.r + row * a.ld_r + j0;
    };
    auto copy_row = [&](V *base, int64_t k, int64_t row) {
#pragma unroll
        for (int o = 0; o < NOPS; o++) res_copy<sizeof(V)>(slot(base, k, o), src(row, o));
    };

    double s0[VEC], s1[VEC];
    float c0[VEC], c1[VEC]; /* backward: the columns' mean, rstd */
#pragma unroll
    for (int e = 0; e < VEC; e++) s0[e] = s1[e] = 0.0, c0[e] = c1[e] = 0.f;
    if (BWD && act)
#pragma unroll
        for (int e = 0; e < VEC; e++) c0[e] = a.mean[j0 + e], c1[e] = a.rstd[j0 + e];
    /* a row read in phase 1: the forward forms s (written when asked; xv becomes it) and sums it,
       the backward sums dy and dy·x̂ */
    auto take = [&](int64_t row, V &xv, const V &ov) {
        if constexpr (!BWD) {
            float v[VEC];
            bn_form_row<T, VEC, RES>(a, row, j0, xv, ov, v);
            bn_stats_row<VEC>(v, s0, s1);
        } else {
            bn_bwd_stats_row<T, VEC>(xv, ov, c0, c1, s0, s1);
        }
    };

    /* phase 1. The kept rows' loads, one group; the ring's first rows, a group each; the register
       rows (U rows' loads before any use); the kept rows; the rest through the ring. */
    for (int64_t k = NREG; k < ks; k++) copy_row(kept, k - NREG, row_of(k));
    ring_commit();
#pragma unroll
    for (int q = 0; q < RING; q++) {
        if (kg + q < n) copy_row(ring, q, row_of(kg + q));
        ring_commit();
    }
    V kx[NREG], kd[BWD ? NREG : 1];
#pragma unroll
    for (int k0 = 0; k0 < NREG; k0 += U) {
        V xv[U], ov[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k0 + u < NREG && k0 + u < n) {
                xv[u] = col_load<T, VEC>(src(row_of(k0 + u), 0));
                ov[u] = NOPS > 1 ? col_load<T, VEC>(src(row_of(k0 + u), 1)) : xv[u];
            }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k0 + u < NREG && k0 + u < n) {
                take(row_of(k0 + u), xv[u], ov[u]);
                kx[k0 + u] = xv[u];
                if constexpr (BWD) kd[k0 + u] = ov[u];
            }
    }
    ring_wait<RING>(); /* the kept rows are in */
    for (int64_t k = NREG; k < ks; k++) {
        V xv = *slot(kept, k - NREG, 0);
        const V ov = NOPS > 1 ? *slot(kept, k - NREG, 1) : xv;
        take(row_of(k), xv, ov);
        if constexpr (RES) *slot(kept, k - NREG, 0) = xv; /* s from now on */
    }
    for (int64_t k = kg; k < n; k++) {
        ring_wait<RING - 1>(); /* row k's group is in */
        const int q = (int)((k - kg) % RING);
        V xv = *slot(ring, q, 0);
        const V ov = NOPS > 1 ? *slot(ring, q, 1) : xv;
        take(row_of(k), xv, ov);
        if (k + RING < n) copy_row(ring, q, row_of(k + RING));
        ring_commit();
    }
    ring_wait<0>();

    /* the block's partial row: its rows' sums in ty order */
#pragma unroll
    for (int q = 0; q < 2; q++) {
        __syncthreads();
        if (act)
#pragma unroll
            for (int e = 0; e < VEC; e++) red[tid * VEC + e] = q ? s1[e] : s0[e];
        __syncthreads();
        if (act && ty == 0)
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                double t = 0.0;
                for (int y = 0; y < p.ty; y++) t += red[(y * p.tx + tx) * VEC + e];
                p.part[((int64_t)blockIdx.x * 2 + q) * a.cols + j0 + e] = t;
            }
    }
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    grid.sync();
    /* the finish: column i of the partials over the blocks in a fixed order */
    {
        const int warp = tid / 32, lane = tid % 32;
        const int64_t n2 = 2 * a.cols, G = gridDim.x;
        for (int64_t i = blockIdx.x + (int64_t)warp * G; i < n2; i += (int64_t)(RES_THREADS / 32) * G) {
            double t = 0.0;
            for (int64_t b = lane; b < G; b += 32) t += p.part[b * n2 + i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0) p.tot[i] = t;
        }
        if (blockIdx.x == 0 && tid == 0) p.tot[n2] = (double)a.rows;
    }
    grid.sync();

    /* phase 2: the coefficients (block 0's first row of threads writes the per-channel outputs);
       the ring's first rows (from the last row down); the kept rows; the rest through the ring */
    if (BWD && !a.dx && !a.dr) { /* dw / db only */
        if (act && blockIdx.x == 0 && ty == 0)
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float kk[5];
                bn_coefficients(a, j0 + e, kk, true);
            }
        return;
    }
    /* the rows not kept, read again: the forward's s where it was written, else x (and r, s formed
       again); the backward's x and dy */
    const bool one = RES && a.s; /* only s comes back: the ring as 2·RING one-operand slots */
    const int depth = one ? 2 * RING : RING, width = one ? 1 : NOPS;
    auto rslot = [&](int q, int o) { return ring + ((int64_t)q * width + o) * RES_THREADS + tid; };
    auto copy_again = [&](int q, int64_t row) {
        if (one) {
            res_copy<sizeof(V)>(rslot(q, 0), (const T *)a.s + row * a.ld_s + j0);
        } else {
#pragma unroll
            for (int o = 0; o < NOPS; o++) res_copy<sizeof(V)>(rslot(q, o), src(row, o));
        }
    };
    for (int q = 0; q < depth; q++) {
        if (n - 1 - q >= kg) copy_again(q, row_of(n - 1 - q));
        ring_commit();
    }
    float k[NK][VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        float kk[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
        if (act) bn_coefficients(a, j0 + e, kk, blockIdx.x == 0 && ty == 0);
#pragma unroll
        for (int q = 0; q < NK; q++) k[q][e] = kk[q];
    }
    auto put = [&](int64_t row, const V &xv, const V &ov) {
        if constexpr (!BWD) {
            float v[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) v[e] = to_acc(xv.v[e]);
            bn_y_row<T, VEC>(a, row, j0, v, k);
        } else {
            bn_grad_row<T, VEC>(a, row, j0, xv, ov, k);
        }
    };
#pragma unroll
    for (int kk = 0; kk < NREG; kk++)
        if (kk < n) put(row_of(kk), kx[kk], BWD ? kd[BWD ? kk : 0] : kx[kk]);
    for (int64_t kk = NREG; kk < ks; kk++) {
        const V xv = *slot(kept, kk - NREG, 0);
        put(row_of(kk), xv, BWD ? *slot(kept, kk - NREG, 1) : xv);
    }
    for (int64_t i = 0; n - 1 - i >= kg; i++) {
        if (one) ring_wait<2 * RING - 1>();
        else ring_wait<RING - 1>();
        const int q = (int)(i % depth);
        const int64_t row = row_of(n - 1 - i);
        V xv = *rslot(q, 0);
        const V ov = NOPS > 1 && !one ? *rslot(q, 1) : xv;
        if (RES && !one) { /* s formed again from x and r (not written: there is no s) */
            float v[VEC];
            bn_form_row<T, VEC>(a, row, j0, xv, ov, v);
        }
        put(row, xv, ov);
        if (n - 1 - i - depth >= kg) copy_again(q, row_of(n - 1 - i - depth));
        ring_commit();
    }
    ring_wait<0>();
}

/* ------------------------------------------------------------------ dropout, RevIN */

struct ew_args {
    int64_t rows, cols;
    const void *x;
    void *y;
    int64_t ld_x, ld_y;
    bool accumulate;
    drop_t drop;
};

/* y = x·m over rows × cols; 16-byte vectors over each row's first cols − cols % VEC elements,
 * element by element after them. */
template <typename T, int VEC>
__global__ void __launch_bounds__(256) dropout_kernel(const ew_args a) {
    const int64_t nvec = a.cols / VEC, tail = a.cols - nvec * VEC, per_row = nvec + tail;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
        const T *xr = (const T *)a.x + row * a.ld_x;
        T *yr = (T *)a.y + row * a.ld_y;
        for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < per_row; u += stride) {
            if (u < nvec) {
                const vec_t<T, VEC> xv = load_vec<T, VEC>(xr + u * VEC);
                float m[VEC];
                drop_mask<VEC>(a.drop, row * a.cols + u * VEC, m);
                vec_t<T, VEC> o;
                if (a.accumulate) o = load_vec<T, VEC>(yr + u * VEC);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float v = __fmul_rn(to_acc(xv.v[e]), m[e]);
                    o.v[e] = from_acc<T>(a.accumulate ? __fadd_rn(to_acc(o.v[e]), v) : v);
                }
                store_vec<T, VEC>(yr + u * VEC, o);
            } else {
                const int64_t j = nvec * VEC + (u - nvec);
                float m[1];
                drop_mask<1>(a.drop, row * a.cols + j, m);
                const float v = __fmul_rn(to_acc(xr[j]), m[0]);
                yr[j] = from_acc<T>(a.accumulate ? __fadd_rn(to_acc(yr[j]), v) : v);
            }
        }
    }
}

struct revin_args {
    int64_t inst, steps, cols;
    const void *x, *w, *b;
    void *y;
    int64_t ld_x, ld_y;
    float *mean, *stdev;
    float eps, eps2;
    bool denorm, subtract_last;
};

/* A warp per (instance, channel): mean and the biased variance over the steps, in f64, two
 * passes, each lane summing the steps lane, lane + 32, ... and the lanes added by the xor tree
 * (lane 0's sums); stdev = √(var + eps); subtract_last: mean holds the last step (stdev is still
 * the deviation around the mean, as PatchTST's RevIN computes it). */
template <typename T>
__global__ void __launch_bounds__(256) revin_stats_kernel(const revin_args a) {
    const int64_t n = a.inst * a.cols;
    const int lane = threadIdx.x & 31;
    for (int64_t q = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; q < n;
         q += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        const int64_t i = q / a.cols, c = q % a.cols;
        const T *xp = (const T *)a.x + i * a.steps * a.ld_x + c;
        double sum = 0.0;
        for (int64_t t = lane; t < a.steps; t += 32) sum += (double)to_acc(xp[t * a.ld_x]);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const double mean = __shfl_sync(0xffffffffu, sum, 0) / (double)a.steps;
        double sq = 0.0;
        for (int64_t t = lane; t < a.steps; t += 32) {
            const double d = (double)to_acc(xp[t * a.ld_x]) - mean;
            sq += d * d;
        }
        for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (lane == 0) {
            a.mean[q] = a.subtract_last ? to_acc(xp[(a.steps - 1) * a.ld_x]) : (float)mean;
            a.stdev[q] = (float)sqrt(sq / (double)a.steps + (double)a.eps);
        }
    }
}

/* y = (x − μ)/σ·w + b, or (denorm) y = (x − b)/(w + ε²)·σ + μ, in PatchTST's order of operations:
 * a thread per element of the [inst·steps, cols] rows (short rows of a few channels fill the
 * block). */
template <typename T>
__global__ void __launch_bounds__(256) revin_apply_kernel(const revin_args a) {
    const int64_t n = a.inst * a.steps * a.cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = e / a.cols, c = e % a.cols, i = row / a.steps;
        const float mu = a.mean[i * a.cols + c], sd = a.stdev[i * a.cols + c];
        const float w = a.w ? to_acc(((const T *)a.w)[c]) : 1.f, b = a.b ? to_acc(((const T *)a.b)[c]) : 0.f;
        float v = to_acc(((const T *)a.x)[row * a.ld_x + c]);
        if (!a.denorm) {
            v = (v - mu) / sd;
            if (a.w) v = v * w;
            if (a.b) v = v + b;
        } else {
            if (a.b) v = v - b;
            if (a.w) v = v / (w + a.eps2);
            v = v * sd + mu;
        }
        ((T *)a.y)[row * a.ld_y + c] = from_acc<T>(v);
    }
}

/* ------------------------------------------------------------------ planning */

static const char *dt_name(fg_dtype t) { return fg_dtype_name(t); }

static void add_name(fg_norm_call *c, const char *piece) { fg_name_append(c->name, sizeof c->name, piece); }


/* 16-byte vectors of VEC elements over `cols` columns: every pointer declared 16-byte aligned,
 * every present operand's row stride a multiple of the vector. */
static bool vec_ok(const fg_norm_call *c, int VEC, const int64_t *lds, int n) {
    if (c->align < 16 || c->cols % VEC != 0) return false;
    for (int i = 0; i < n; i++)
        if (lds[i] % VEC != 0) return false;
    return true;
}

static int vec_of(fg_dtype t) { return t == FG_F32 ? 4 : 8; }

/* The row norms' path. */
struct rows_path {
    bool reg, vec;    /* registers (else the loop kernels); 16-byte vectors */
    bool params;      /* dw or db wanted */
    int nv;           /* register path: vectors a thread */
    size_t smem;      /* the register backward's dw / db sums, [R][2][cols] floats; the forward's ring */
    bool ring;        /* register forward: rows streamed ahead through shared memory */
    bool lean;        /* the lean kernels (rows_fwd_lean / rows_bwd_lean) take the call */
    int G, block, R;  /* threads a row, a block; rows a block */
    int64_t grid;
    size_t stat_off;  /* loop backward: the recomputed statistics in scratch */
    size_t need;
};

struct col_geom {
    int vec, tx, ty;
    int64_t tiles, slabs, per;
};

/* A column kernel's geometry: TX threads across column vectors (up to 32), TY across rows; slabs
 * of rows so that the grid fills the device about four blocks deep. */
static col_geom col_geometry(const fg_context *ctx, int64_t rows, int64_t cols, int vec) {
    col_geom g;
    g.vec = vec;
    const int64_t nvec = cdiv(cols > 0 ? cols : 1, vec);
    g.tx = (int)(nvec >= 32 ? 32 : pow2_at_least(nvec));
    g.ty = COL_THREADS / g.tx;
    g.tiles = cdiv(nvec, g.tx);
    const int64_t target = (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 1) * 8;
    int64_t slabs = target / g.tiles;
    if (slabs < 1) slabs = 1;
    const int64_t most = cdiv(rows > 0 ? rows : 1, (int64_t)g.ty * 4); /* at least 4 rows a thread */
    if (slabs > most) slabs = most;
    if (slabs > 65535) slabs = 65535;
    g.per = cdiv(rows > 0 ? rows : 1, slabs);
    g.slabs = rows > 0 ? cdiv(rows, g.per) : 0;
    return g;
}

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* Elements a thread and operand (NV = elements / VEC vectors) and at most 512 threads a row: rows up
 * to 16384 elements stay in registers. 16 a thread up to 8192-element rows, 32 past that: the
 * backward holds x̂ and g (about 120 registers at 16; at 32 a few hundred bytes of spills to L1,
 * against a second read of the rows from memory on the loop path). The forward splits its rows
 * the same way, so a backward that recomputes mean / rstd gets the forward's bits. */
constexpr int ROW_ELEMS = 32, ROW_ELEMS_SHORT = 16, ROW_MAXG = 512;

/* The rings: STAGES slots of a thread's 16-byte vectors (the forward's x, and r with a residual;
 * the backward's x and dy), where they fit (the forward's ring in FWD_RING_MAX bytes a block:
 * rows of the short split up to 8192 bf16 / 4096 f32 elements, with the residual half that; the
 * backward's with its dw / db sums in BWD_SMEM_MAX); longer rows load plainly. The forward's
 * residual instances are apart: its dropout's generator would raise the plain norm's registers. */
constexpr int FWD_STAGES = 4, BWD_STAGES = 4;
constexpr size_t FWD_RING_MAX = 96 * 1024, BWD_SMEM_MAX = 112 * 1024;

/* (with the slots of w and b) */
static size_t fwd_ring_bytes(int nv, bool res, int block) { return (size_t)(FWD_STAGES * (res ? 2 : 1) + 2) * nv * block * 16; }
static size_t bwd_ring_bytes(int nv, int block) { return (size_t)(BWD_STAGES * 2 + 1) * nv * block * 16; }

template <typename T> static void (*fwd_reg_kernel(int nv, bool res, bool ring))(rows_args) {
    constexpr int V = 16 / sizeof(T), S = ROW_ELEMS_SHORT / V, L = ROW_ELEMS / V;
    if (nv == S) {
        if (ring) return res ? rows_fwd_reg<T, V, S, true, FWD_STAGES> : rows_fwd_reg<T, V, S, false, FWD_STAGES>;
        return res ? rows_fwd_reg<T, V, S, true, 0> : rows_fwd_reg<T, V, S, false, 0>;
    }
    return res ? rows_fwd_reg<T, V, L, true, 0> : rows_fwd_reg<T, V, L, false, 0>;
}

static void (*fwd_reg_any(fg_dtype dt, int nv, bool res, bool ring))(rows_args) {
    return dt == FG_F32 ? fwd_reg_kernel<float>(nv, res, ring)
           : dt == FG_F16 ? fwd_reg_kernel<__half>(nv, res, ring)
                          : fwd_reg_kernel<__nv_bfloat16>(nv, res, ring);
}

/* Blocks of a kernel resident on one SM at a block size and dynamic shared memory (registers
 * and shared memory decide, not only the thread count), with the kernel's shared-memory limit
 * raised to what it asks. The answers are the architecture's: kept in a small table (a benign
 * race: every writer of an entry stores the same answer; a full table just asks again). */
static int occupancy(const void *kernel, int block, size_t smem) {
    struct entry {
        const void *k;
        int block, n;
        size_t smem;
    };
    static entry table[32];
    for (const entry &e : table)
        if (e.k == kernel && e.block == block && e.smem == smem && e.n > 0) return e.n;
    int n = 0;
    cudaError_t e = cudaSuccess;
    if (smem > 46 * 1024) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 2048 / block;
    }
    if (n < 1) n = 1;
    for (entry &t : table)
        if (!t.k) {
            t.smem = smem, t.block = block, t.n = n, t.k = kernel;
            break;
        }
    return n;
}

template <typename T, int NV, int G> static const void *lean_at(bool backward, bool aff) {
    constexpr int V = 16 / sizeof(T);
    if (backward) return (const void *)rows_bwd_lean<T, V, NV, G>;
    return aff ? (const void *)rows_fwd_lean<T, V, NV, G, true> : (const void *)rows_fwd_lean<T, V, NV, G, false>;
}

template <typename T, int NV> static const void *lean_of(int G, bool backward, bool aff) {
    return G == 128   ? lean_at<T, NV, 128>(backward, aff)
           : G == 256 ? lean_at<T, NV, 256>(backward, aff)
                      : lean_at<T, NV, 512>(backward, aff);
}

/* The lean kernel of a split: nv vectors a thread, G threads a row (128, 256 or 512); aff: the
   forward's LayerNorm-with-w-and-b instance (the backward picks its body itself). */
template <typename T> static const void *lean_kernel(int nv, int G, bool backward, bool aff) {
    constexpr int V = 16 / sizeof(T), S = ROW_ELEMS_SHORT / V, L = ROW_ELEMS / V;
    return nv == S ? lean_of<T, S>(G, backward, aff) : lean_of<T, L>(G, backward, aff);
}

/* The lean backward of a split, for its occupancy (the plan's persistent grid). */
static const void *lean_bwd_any(fg_dtype dt, int nv, int G) {
    return dt == FG_F32 ? lean_kernel<float>(nv, G, true, false)
           : dt == FG_F16 ? lean_kernel<__half>(nv, G, true, false)
                          : lean_kernel<__nv_bfloat16>(nv, G, true, false);
}

/* (the ring's instances without the residual's gradient dr apart: its dropout's generator would
   raise their registers) */
template <typename T> static const void *bwd_reg_kernel(int nv, bool ring, bool dr) {
    constexpr int V = 16 / sizeof(T), S = ROW_ELEMS_SHORT / V, L = ROW_ELEMS / V;
    if (nv != S) return (const void *)rows_bwd_reg<T, V, L, 0, true>;
    if (!ring) return (const void *)rows_bwd_reg<T, V, S, 0, true>;
    return dr ? (const void *)rows_bwd_reg<T, V, S, BWD_STAGES, true> : (const void *)rows_bwd_reg<T, V, S, BWD_STAGES, false>;
}

static const void *bwd_reg_any(fg_dtype dt, int nv, bool ring, bool dr) {
    return dt == FG_F32 ? bwd_reg_kernel<float>(nv, ring, dr)
           : dt == FG_F16 ? bwd_reg_kernel<__half>(nv, ring, dr)
                          : bwd_reg_kernel<__nv_bfloat16>(nv, ring, dr);
}

static rows_path plan_rows(const fg_context *ctx, const fg_norm_call *c, bool backward) {
    rows_path p;
    memset(&p, 0, sizeof p);
    const int V = vec_of(c->dtype);
    const int64_t lds[] = {c->x ? c->ld_x : 0, c->r ? c->ld_r : 0, c->y ? c->ld_y : 0, c->s ? c->ld_s : 0,
                           c->dy ? c->ld_dy : 0, c->ds ? c->ld_ds : 0, c->dx ? c->ld_dx : 0, c->dr ? c->ld_dr : 0};
    p.vec = vec_ok(c, V, lds, 8);
    const int64_t nvec = p.vec ? c->cols / V : c->cols;
    /* one split for both directions: a backward recomputing the statistics sums in the forward's
     * order (the forward's bits), and its row sums in the order of a backward given them */
    p.nv = ROW_ELEMS_SHORT / V;
    int64_t G = pow2_at_least(cdiv(nvec, p.nv));
    if (G > ROW_MAXG) p.nv = ROW_ELEMS / V, G = pow2_at_least(cdiv(nvec, p.nv));
    p.reg = p.vec && G <= ROW_MAXG;
    p.params = backward && (c->dw || c->db);
    const int64_t sms = ctx->sm_count > 0 ? ctx->sm_count : 1;
    if (p.reg) {
        p.G = (int)G;
        p.block = p.G > 128 ? p.G : 128;
        p.R = p.block / p.G;
        const int64_t blocks = cdiv(c->rows, p.R);
        /* (the backward: 128-thread blocks of short rows keep their groups' dw / db in up to 32 KB) */
        /* persistent grids, as many blocks as fit (each streams its rows ahead where its ring fits) */
        const bool shortsplit = p.nv == ROW_ELEMS_SHORT / V;
        int64_t resident;
        /* the lean kernels: rows of a whole block, without the options they leave out */
        p.lean = p.G >= 128 && (backward ? c->dx && !c->ds && !c->dr && !c->accumulate
                                         : !c->r && !c->s && c->rows <= 0x7fffffff);
        if (p.lean) {
            p.ring = false;
            p.smem = 0;
            resident = backward ? sms * occupancy(lean_bwd_any(c->dtype, p.nv, p.G), p.block, 0) : blocks;
        } else if (!backward) {
            p.ring = shortsplit && fwd_ring_bytes(p.nv, c->r != NULL, p.block) <= FWD_RING_MAX;
            p.smem = p.ring ? fwd_ring_bytes(p.nv, c->r != NULL, p.block) : 0;
            resident = sms * occupancy((const void *)fwd_reg_any(c->dtype, p.nv, c->r != NULL, p.ring), p.block, p.smem);
        } else {
            const size_t sums = p.params ? (size_t)p.R * 2 * (size_t)c->cols * sizeof(float) : 0;
            p.ring = shortsplit && sums + bwd_ring_bytes(p.nv, p.block) <= BWD_SMEM_MAX;
            p.smem = sums + (p.ring ? bwd_ring_bytes(p.nv, p.block) : 0);
            resident = sms * occupancy(bwd_reg_any(c->dtype, p.nv, p.ring, c->dr != NULL), p.block, p.smem);
        }
        p.grid = blocks < resident ? blocks : resident;
        if (p.params) p.need = up256((size_t)p.grid * 2 * (size_t)c->cols * sizeof(float));
    } else {
        p.G = p.block = (int)(nvec >= 2048 ? 512 : nvec >= 256 ? 256 : 128);
        p.R = 1;
        p.grid = c->rows < sms * 8 ? c->rows : sms * 8;
        if (p.params) {
            const col_geom g = col_geometry(ctx, c->rows, c->cols, 1);
            size_t at = up256((size_t)(g.slabs > 0 ? g.slabs : 1) * 2 * (size_t)c->cols * sizeof(double));
            if (!c->rstd) { /* the recomputed statistics, for the column kernel */
                p.stat_off = at;
                at += up256((size_t)c->rows * 2 * sizeof(float));
            }
            p.need = at;
        }
    }
    return p;
}

static void rows_names(const fg_norm_call *c, const rows_path &p, bool backward, char *out, size_t len) {
    const char *k = c->kind == FG_NORM_RMS ? "rms" : "ln";
    const int V = p.vec ? vec_of(c->dtype) : 1;
    if (p.reg)
        snprintf(out, len, "%s_%s%s<%s,v%d,g%dx%d>", k, backward ? "bwd" : "fwd", p.lean ? "_lean" : "",
                 dt_name(c->dtype), V, p.G, p.nv);
    else
        snprintf(out, len, "%s_%s_loop<%s,v%d>", k, backward ? "bwd" : "fwd", dt_name(c->dtype), V);
}

/* ------------------------------------------------------------------ launches */

static fg_status done(fg_context *ctx, const char *label, bool run) {
    if (!run) return FG_OK;
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fg_cuda_fail(e, label);
    fg_record_kernel(ctx, label);
    return FG_OK;
}

/* One launch of a row kernel: the lean pair, the register kernels (their shared memory raised past
 * 48 KB less the static: again here, for a plan made on another device), or the loop kernels. */
template <typename T> static cudaError_t launch_rows(const rows_path &p, const rows_args &a, cudaStream_t s, bool backward) {
    constexpr int V = 16 / sizeof(T);
    if (p.lean || p.reg) {
        auto kernel = (void (*)(rows_args))(p.lean ? lean_kernel<T>(p.nv, p.G, backward, !a.rms && a.w && a.b)
                                            : backward ? bwd_reg_kernel<T>(p.nv, p.ring, a.dr != NULL)
                                                       : (const void *)fwd_reg_kernel<T>(p.nv, a.r != NULL, p.ring));
        if (p.smem > 46 * 1024) {
            cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.smem);
            if (e != cudaSuccess) return e;
        }
        kernel<<<(unsigned)p.grid, p.block, p.smem, s>>>(a);
    } else if (backward) {
        if (p.vec) rows_bwd_loop<T, V><<<(unsigned)p.grid, p.block, 0, s>>>(a);
        else rows_bwd_loop<T, 1><<<(unsigned)p.grid, p.block, 0, s>>>(a);
    } else {
        if (p.vec) rows_fwd_loop<T, V><<<(unsigned)p.grid, p.block, 0, s>>>(a);
        else rows_fwd_loop<T, 1><<<(unsigned)p.grid, p.block, 0, s>>>(a);
    }
    return cudaSuccess;
}

template <typename T, int KIND> static void launch_cols(const col_geom &g, const col_args &a, cudaStream_t s) {
    constexpr int V = BN_VEC;
    const dim3 grid((unsigned)g.tiles, (unsigned)g.slabs), block((unsigned)g.tx, (unsigned)g.ty);
    if constexpr (KIND == COL_BN_STATS || KIND == COL_BN_BWD) /* (the others run element by element) */
        if (g.vec > 1) {
            col_sums<T, V, KIND><<<grid, block, 0, s>>>(a);
            return;
        }
    col_sums<T, 1, KIND><<<grid, block, 0, s>>>(a);
}

template <typename T> static void launch_cols_kind(int kind, const col_geom &g, const col_args &a, cudaStream_t s) {
    switch (kind) {
    case COL_BN_STATS: launch_cols<T, COL_BN_STATS>(g, a, s); break;
    case COL_BN_BWD: launch_cols<T, COL_BN_BWD>(g, a, s); break;
    case COL_ROW_PARAMS: { col_geom g1 = g; g1.vec = 1; launch_cols<T, COL_ROW_PARAMS>(g1, a, s); break; }
    default: { col_geom g1 = g; g1.vec = 1; launch_cols<T, COL_REVIN_BWD>(g1, a, s); break; }
    }
}

template <typename T> static void launch_bn(const col_geom &g, const bn_args &a, cudaStream_t s) {
    constexpr int V = BN_VEC;
    const dim3 grid((unsigned)g.tiles, (unsigned)(g.slabs > 0 ? g.slabs : 1)), block((unsigned)g.tx, (unsigned)g.ty);
    if (g.vec > 1 && a.backward) bn_apply<T, V, true><<<grid, block, 0, s>>>(a);
    else if (g.vec > 1) bn_apply<T, V, false><<<grid, block, 0, s>>>(a);
    else if (a.backward) bn_apply<T, 1, true><<<grid, block, 0, s>>>(a);
    else bn_apply<T, 1, false><<<grid, block, 0, s>>>(a);
}

#define BY_DTYPE(dt, F, ...)                                                                                        \
    do {                                                                                                            \
        switch (dt) {                                                                                               \
        case FG_F32: F<float>(__VA_ARGS__); break;                                                                  \
        case FG_F16: F<__half>(__VA_ARGS__); break;                                                                 \
        default: F<__nv_bfloat16>(__VA_ARGS__); break;                                                              \
        }                                                                                                           \
    } while (0)

static void launch_finish(const finish_args &f, cudaStream_t s) {
    const int64_t blocks = cdiv(f.n2 > 0 ? f.n2 : 1, FIN_COLS);
    finish_kernel<<<(unsigned)blocks, FIN_COLS * FIN_LANES, 0, s>>>(f);
}

static finish_args finish_params(const void *part, bool f64, int64_t parts, const fg_norm_call *c) {
    finish_args f;
    memset(&f, 0, sizeof f);
    f.part = part, f.part_f64 = f64, f.parts = parts, f.n2 = 2 * c->cols, f.cols = c->cols;
    f.dw = c->dw, f.db = c->db, f.dw_dtype = c->dw_dtype, f.db_dtype = c->db_dtype;
    f.accumulate = c->accumulate;
    return f;
}

/* ------------------------------------------------------------------ the steps */

static fg_status rows_step(fg_context *ctx, fg_norm_call *c, bool run, bool backward) {
    const rows_path p = plan_rows(ctx, c, backward);
    char label[64];
    rows_names(c, p, backward, label, sizeof label);
    const bool main_kernel = c->rows > 0 && c->cols > 0;
    const bool cols_kernel = backward && p.params && !p.reg && main_kernel;
    if (!run) {
        c->need = p.need;
        if (main_kernel) add_name(c, label);
        if (cols_kernel) add_name(c, "norm_params_cols");
        if (p.params) add_name(c, "norm_params_sum");
        return FG_OK;
    }
    cudaStream_t s = ctx->cuda->stream;
    rows_args a;
    memset(&a, 0, sizeof a);
    a.rows = c->rows, a.cols = c->cols;
    a.x = c->x, a.r = c->r, a.w = c->w, a.b = c->b, a.dy = c->dy, a.ds = c->ds;
    a.y = c->y, a.s = c->s, a.dx = c->dx, a.dr = c->dr;
    a.ld_x = c->ld_x, a.ld_r = c->ld_r, a.ld_y = c->ld_y, a.ld_s = c->ld_s;
    a.ld_dy = c->ld_dy, a.ld_ds = c->ld_ds, a.ld_dx = c->ld_dx, a.ld_dr = c->ld_dr;
    a.mean = (float *)c->mean, a.rstd = (float *)c->rstd;
    a.eps = (float)c->eps;
    a.rms = c->kind == FG_NORM_RMS;
    a.accumulate = c->accumulate;
    a.drop = drop_of(c->drop);
    a.G = p.G;
    if (backward && p.params && p.reg) a.part = (float *)c->scratch;
    if (backward && p.params && !p.reg && !c->rstd) {
        a.mean_out = (float *)((char *)c->scratch + p.stat_off);
        a.rstd_out = a.mean_out + c->rows;
    }
    if (main_kernel) {
        cudaError_t e = cudaSuccess;
        switch (c->dtype) {
        case FG_F32: e = launch_rows<float>(p, a, s, backward); break;
        case FG_F16: e = launch_rows<__half>(p, a, s, backward); break;
        default: e = launch_rows<__nv_bfloat16>(p, a, s, backward); break;
        }
        if (e != cudaSuccess) return fg_cuda_fail(e, label);
        FG_TRY(done(ctx, label, true));
    }
    if (!p.params) return FG_OK;
    if (p.reg) {
        launch_finish(finish_params(c->scratch, false, main_kernel ? p.grid : 0, c), s);
        return done(ctx, "norm_params_sum", true);
    }
    const col_geom g = col_geometry(ctx, c->rows, c->cols, 1);
    if (cols_kernel) {
        col_args ca;
        memset(&ca, 0, sizeof ca);
        ca.rows = c->rows, ca.cols = c->cols, ca.rows_per_slab = g.per;
        ca.x = c->x, ca.dy = c->dy, ca.ld_x = c->ld_x, ca.ld_dy = c->ld_dy;
        ca.mean = c->rstd ? (const float *)c->mean : a.mean_out;
        ca.rstd = c->rstd ? (const float *)c->rstd : a.rstd_out;
        if (a.rms) ca.mean = NULL;
        ca.part = (double *)c->scratch;
        BY_DTYPE(c->dtype, launch_cols_kind, COL_ROW_PARAMS, g, ca, s);
        FG_TRY(done(ctx, "norm_params_cols", true));
    }
    launch_finish(finish_params(c->scratch, true, cols_kernel ? g.slabs : 0, c), s);
    return done(ctx, "norm_params_sum", true);
}

/* The BatchNorm and column steps' vector width: BN_VEC elements when every operand allows. */
static int bn_vec(const fg_norm_call *c) {
    const int V = BN_VEC;
    const int64_t lds[] = {c->x ? c->ld_x : 0, c->r ? c->ld_r : 0, c->y ? c->ld_y : 0, c->s ? c->ld_s : 0,
                           c->dy ? c->ld_dy : 0, c->dx ? c->ld_dx : 0, c->dr ? c->ld_dr : 0};
    return vec_ok(c, V, lds, 7) ? V : 1;
}

static fg_status bn_sums_step(fg_context *ctx, fg_norm_call *c, bool run, bool backward) {
    const col_geom g = col_geometry(ctx, c->rows, c->cols, bn_vec(c));
    char label[64];
    snprintf(label, sizeof label, "%s<%s,v%d>", backward ? "bn_bwd_stats" : "bn_stats", dt_name(c->dtype), g.vec);
    const bool main_kernel = c->rows > 0 && c->cols > 0;
    if (!run) {
        c->need = up256((size_t)(g.slabs > 0 ? g.slabs : 1) * 2 * (size_t)c->cols * sizeof(double));
        if (main_kernel) add_name(c, label);
        add_name(c, "bn_sum");
        return FG_OK;
    }
    cudaStream_t s = ctx->cuda->stream;
    if (main_kernel) {
        col_args a;
        memset(&a, 0, sizeof a);
        a.rows = c->rows, a.cols = c->cols, a.rows_per_slab = g.per;
        a.x = c->x, a.r = c->r, a.dy = c->dy, a.s = c->s;
        a.ld_x = c->ld_x, a.ld_r = c->ld_r, a.ld_s = c->ld_s, a.ld_dy = c->ld_dy;
        a.mean = (const float *)c->mean, a.rstd = (const float *)c->rstd;
        a.drop = drop_of(c->drop);
        a.part = (double *)c->scratch;
        BY_DTYPE(c->dtype, launch_cols_kind, backward ? COL_BN_BWD : COL_BN_STATS, g, a, s);
        FG_TRY(done(ctx, label, true));
    }
    finish_args f;
    memset(&f, 0, sizeof f);
    f.part = c->scratch, f.part_f64 = true, f.parts = main_kernel ? g.slabs : 0, f.n2 = 2 * c->cols, f.cols = c->cols;
    f.sums = c->sums, f.count = (double)c->rows;
    launch_finish(f, s);
    return done(ctx, "bn_sum", true);
}

/* An apply step's (or the one-launch kernel's) arguments from its call; sums: the call's. */
static bn_args bn_args_of(const fg_norm_call *c, bool backward) {
    bn_args a;
    memset(&a, 0, sizeof a);
    a.rows = c->rows, a.cols = c->cols;
    a.eval = c->eval, a.accumulate = c->accumulate, a.backward = backward;
    a.x = c->x, a.r = c->r, a.dy = c->dy, a.w = c->w, a.b = c->b;
    a.y = c->y, a.s = c->s, a.dx = c->dx, a.dr = c->dr;
    a.ld_x = c->ld_x, a.ld_r = c->ld_r, a.ld_y = c->ld_y, a.ld_s = c->ld_s;
    a.ld_dy = c->ld_dy, a.ld_dx = c->ld_dx, a.ld_dr = c->ld_dr;
    a.w_dtype = c->w_dtype, a.stat_dtype = c->stat_dtype, a.dw_dtype = c->dw_dtype, a.db_dtype = c->db_dtype;
    a.sums = c->sums;
    a.running_mean = c->running_mean, a.running_var = c->running_var;
    a.mean = (float *)c->mean, a.rstd = (float *)c->rstd;
    a.dw = c->dw, a.db = c->db;
    a.eps = c->eps, a.momentum = c->momentum;
    a.drop = drop_of(c->drop);
    return a;
}

static fg_status bn_apply_step(fg_context *ctx, fg_norm_call *c, bool run, bool backward) {
    col_geom g = col_geometry(ctx, c->rows, c->cols, bn_vec(c));
    if (g.slabs == 0) g.slabs = 1, g.per = 0; /* no rows: the first slab still writes the per-channel outputs */
    char label[64];
    snprintf(label, sizeof label, "%s<%s,v%d>", backward ? "bn_bwd_apply" : "bn_apply", dt_name(c->dtype), g.vec);
    const bool any = c->cols > 0;
    if (!run) {
        c->need = 0;
        if (any) add_name(c, label);
        return FG_OK;
    }
    if (!any) return FG_OK;
    bn_args a = bn_args_of(c, backward);
    a.rows_per_slab = g.per;
    BY_DTYPE(c->dtype, launch_bn, g, a, ctx->cuda->stream);
    return done(ctx, label, true);
}

/* BN_FORWARD / BN_BACKWARD: the one-launch kernel where it applies (bn_resident's rules, a device
 * with cooperative launches, one block an SM fitting), else the stats and apply steps. */
struct res_path {
    bool ok;
    int tx, ty;
    int64_t per, grid, srows;
    size_t smem, need;
};

/* What the plan needs of one instance: the kernel, its register rows and ring depth, and the bytes a
   kept row takes (all threads, every operand). */
struct res_kind {
    const void *kernel;
    int nreg, ring;
    size_t row_bytes;
};
template <typename T, int MODE> static res_kind res_kind_of() {
    return res_kind{(const void *)bn_resident<T, MODE>, res_nreg<T, MODE>(), res_ring<T, MODE>(),
                    4 * sizeof(T) * res_ops<T, MODE>() * RES_THREADS};
}
template <typename T> static res_kind res_kind_t(int mode) {
    return mode == RES_BWD ? res_kind_of<T, RES_BWD>() : mode == RES_FWD_R ? res_kind_of<T, RES_FWD_R>()
                                                                            : res_kind_of<T, RES_FWD>();
}
static res_kind res_kind_for(fg_dtype dt, int mode) {
    switch (dt) {
    case FG_F32: return res_kind_t<float>(mode);
    case FG_F16: return res_kind_t<__half>(mode);
    default: return res_kind_t<__nv_bfloat16>(mode);
    }
}
static int res_mode(const fg_norm_call *c, bool bwd) { return bwd ? RES_BWD : c->r ? RES_FWD_R : RES_FWD; }

static res_path plan_resident(const fg_context *ctx, const fg_norm_call *c, bool bwd) {
    res_path r;
    memset(&r, 0, sizeof r);
    if (c->rows < 1 || c->cols < 1 || bn_vec(c) != BN_VEC || c->cols / BN_VEC > RES_THREADS / 2) return r;
    /* f32 with the residual keeps the fewest rows (x and r, 16 bytes each, until s is formed) and
       has the Philox draws on its 16 warps an SM: the stats and apply kernels run it faster
       (decision 212) */
    if (!bwd && c->r && c->dtype == FG_F32) return r;
    int coop = 0, optin = 0;
    if (cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, ctx->device) != cudaSuccess || !coop) return r;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device) != cudaSuccess) return r;
    if (ctx->sm_count < 1) return r;
    const res_kind kind = res_kind_for(c->dtype, res_mode(c, bwd));
    r.tx = (int)(c->cols / BN_VEC);
    r.ty = RES_THREADS / r.tx;
    r.per = cdiv(c->rows, ctx->sm_count);
    r.grid = cdiv(c->rows, r.per);
    /* rows a thread at most; kept in shared memory: all past the registers if they fit, else what
       fits beside the ring */
    const int64_t most = cdiv(r.per, r.ty);
    const size_t statics = (size_t)RES_THREADS * BN_VEC * sizeof(double) + 1024;
    const size_t room = (size_t)optin > statics ? (size_t)optin - statics : 0;
    const int64_t want = most > kind.nreg ? most - kind.nreg : 0, fit = (int64_t)(room / kind.row_bytes);
    if (want <= fit) {
        r.srows = want;
    } else {
        r.srows = fit - kind.ring;
        if (r.srows < 0) return r;
    }
    /* one block an SM fits by construction: its shared memory (this plus the static reduction
       rows) stays under the opt-in limit, and __launch_bounds__(RES_THREADS, 1) holds its registers
       to a block's worth; the run raises the kernel's dynamic limit before it launches */
    r.smem = (size_t)(r.srows + (want > r.srows ? kind.ring : 0)) * kind.row_bytes;
    r.need = up256((size_t)r.grid * 2 * (size_t)c->cols * sizeof(double)) + up256((size_t)(2 * c->cols + 1) * sizeof(double));
    r.ok = true;
    return r;
}

static fg_status bn_whole_step(fg_context *ctx, fg_norm_call *c, bool run, bool backward) {
    const res_path r = plan_resident(ctx, c, backward);
    if (!r.ok) return fg_norm_bn_parts(ctx, c, run, fg_cuda_norm);
    char label[64];
    snprintf(label, sizeof label, "bn_resident<%s,%s>", dt_name(c->dtype), backward ? "bwd" : "fwd");
    if (!run) {
        c->need = r.need;
        add_name(c, label);
        return FG_OK;
    }
    bnr_args p;
    memset(&p, 0, sizeof p);
    p.a = bn_args_of(c, backward);
    p.per = r.per, p.tx = r.tx, p.ty = r.ty, p.srows = r.srows;
    p.part = (double *)c->scratch;
    p.tot = (double *)((char *)c->scratch + up256((size_t)r.grid * 2 * (size_t)c->cols * sizeof(double)));
    p.a.sums = p.tot;
    const res_kind kind = res_kind_for(c->dtype, res_mode(c, backward));
    cudaError_t e = cudaFuncSetAttribute(kind.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)r.smem);
    if (e != cudaSuccess) return fg_cuda_fail(e, label);
    void *args[] = {(void *)&p};
    e = cudaLaunchCooperativeKernel(kind.kernel, dim3((unsigned)r.grid), dim3(RES_THREADS), args, r.smem,
                                    ctx->cuda->stream);
    if (e != cudaSuccess) return fg_cuda_fail(e, label);
    return done(ctx, label, true);
}

template <typename T> static void launch_dropout(const ew_args &a, int vec, cudaStream_t s) {
    constexpr int V = 16 / sizeof(T);
    const int64_t per_row = vec > 1 ? a.cols / V + a.cols % V : a.cols;
    const int64_t bx = cdiv(per_row, 256);
    const dim3 grid((unsigned)(bx < 65535 ? bx : 65535), (unsigned)(a.rows < 65535 ? a.rows : 65535));
    if (vec > 1) dropout_kernel<T, V><<<grid, 256, 0, s>>>(a);
    else dropout_kernel<T, 1><<<grid, 256, 0, s>>>(a);
}

static fg_status dropout_step(fg_context *ctx, fg_norm_call *c, bool run) {
    ew_args a;
    memset(&a, 0, sizeof a);
    a.rows = c->rows, a.cols = c->cols, a.x = c->x, a.y = c->y, a.ld_x = c->ld_x, a.ld_y = c->ld_y;
    if (a.rows > 1 && a.ld_x == a.cols && a.ld_y == a.cols) a.cols *= a.rows, a.rows = 1; /* one flat row */
    a.accumulate = c->accumulate;
    a.drop = drop_of(c->drop);
    const int V = vec_of(c->dtype);
    const int vec = c->align >= 16 && (a.rows == 1 || (a.ld_x % V == 0 && a.ld_y % V == 0)) ? V : 1;
    char label[64];
    snprintf(label, sizeof label, "dropout<%s,v%d>", dt_name(c->dtype), vec);
    const bool any = a.rows > 0 && a.cols > 0;
    if (!run) {
        c->need = 0;
        if (any) add_name(c, label);
        return FG_OK;
    }
    if (!any) return FG_OK;
    BY_DTYPE(c->dtype, launch_dropout, a, vec, ctx->cuda->stream);
    return done(ctx, label, true);
}

template <typename T> static void launch_revin(int which, const revin_args &a, cudaStream_t s) {
    if (which == 0) {
        const int64_t warps = a.inst * a.cols, blocks = cdiv(warps * 32, 256);
        revin_stats_kernel<T><<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(a);
    } else {
        const int64_t blocks = cdiv(a.inst * a.steps * a.cols, 256);
        revin_apply_kernel<T><<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(a);
    }
}

static fg_status revin_step(fg_context *ctx, fg_norm_call *c, bool run) {
    const bool stats = c->step == FG_NORM_STEP_REVIN_STATS;
    char label[64];
    snprintf(label, sizeof label, "%s<%s>", stats ? "revin_stats" : c->denorm ? "revin_denorm" : "revin_norm",
             dt_name(c->dtype));
    const bool any = c->inst > 0 && c->cols > 0 && (stats || c->steps > 0);
    if (!run) {
        c->need = 0;
        if (any) add_name(c, label);
        return FG_OK;
    }
    if (!any) return FG_OK;
    revin_args a;
    memset(&a, 0, sizeof a);
    a.inst = c->inst, a.steps = c->steps, a.cols = c->cols;
    a.x = c->x, a.w = c->w, a.b = c->b, a.y = c->y, a.ld_x = c->ld_x, a.ld_y = c->ld_y;
    a.mean = (float *)c->mean, a.stdev = (float *)c->rstd;
    a.eps = (float)c->eps, a.eps2 = (float)(c->eps * c->eps);
    a.denorm = c->denorm, a.subtract_last = c->subtract_last;
    BY_DTYPE(c->dtype, launch_revin, stats ? 0 : 1, a, ctx->cuda->stream);
    return done(ctx, label, true);
}

static fg_status revin_backward_step(fg_context *ctx, fg_norm_call *c, bool run) {
    const col_geom g = col_geometry(ctx, c->rows, c->cols, 1);
    char label[64];
    snprintf(label, sizeof label, "revin_%s_bwd<%s>", c->denorm ? "denorm" : "norm", dt_name(c->dtype));
    const bool params = c->dw || c->db, main_kernel = c->rows > 0 && c->cols > 0 && (c->dx || params);
    if (!run) {
        c->need = params ? up256((size_t)(g.slabs > 0 ? g.slabs : 1) * 2 * (size_t)c->cols * sizeof(double)) : 0;
        if (main_kernel) add_name(c, label);
        if (params) add_name(c, "norm_params_sum");
        return FG_OK;
    }
    cudaStream_t s = ctx->cuda->stream;
    if (main_kernel) {
        col_args a;
        memset(&a, 0, sizeof a);
        a.rows = c->rows, a.cols = c->cols, a.rows_per_slab = g.per;
        a.x = c->x, a.dy = c->dy, a.w = c->w, a.b = c->b, a.dx = c->dx;
        a.ld_x = c->ld_x, a.ld_dy = c->ld_dy, a.ld_dx = c->ld_dx;
        a.mean = (const float *)c->mean, a.rstd = (const float *)c->rstd;
        a.steps = c->steps, a.denorm = c->denorm, a.accumulate = c->accumulate;
        a.eps2 = (float)(c->eps * c->eps);
        a.part = params ? (double *)c->scratch : NULL; /* without dw / db: dx only */
        BY_DTYPE(c->dtype, launch_cols_kind, COL_REVIN_BWD, g, a, s);
        FG_TRY(done(ctx, label, true));
    }
    if (!params) return FG_OK;
    launch_finish(finish_params(c->scratch, true, main_kernel ? g.slabs : 0, c), s);
    return done(ctx, "norm_params_sum", true);
}

extern "C" fg_status fg_cuda_norm(fg_context *ctx, fg_norm_call *c, bool run) {
    if (c->dtype != FG_F32 && c->dtype != FG_F16 && c->dtype != FG_BF16)
        return fg_fail(FG_ERR_UNSUPPORTED, "cuda norm: %s runs on the CPU backend", fg_dtype_name(c->dtype));
    if (!run) {
        c->need = 0;
        c->name[0] = 0;
    }
    fg_device_guard guard(ctx->device);
    switch (c->step) {
    case FG_NORM_STEP_ROWS_FORWARD: return rows_step(ctx, c, run, false);
    case FG_NORM_STEP_ROWS_BACKWARD: return rows_step(ctx, c, run, true);
    case FG_NORM_STEP_BN_STATS: return bn_sums_step(ctx, c, run, false);
    case FG_NORM_STEP_BN_BACKWARD_STATS: return bn_sums_step(ctx, c, run, true);
    case FG_NORM_STEP_BN_APPLY: return bn_apply_step(ctx, c, run, false);
    case FG_NORM_STEP_BN_BACKWARD_APPLY: return bn_apply_step(ctx, c, run, true);
    case FG_NORM_STEP_BN_FORWARD: return bn_whole_step(ctx, c, run, false);
    case FG_NORM_STEP_BN_BACKWARD: return bn_whole_step(ctx, c, run, true);
    case FG_NORM_STEP_DROPOUT: return dropout_step(ctx, c, run);
    case FG_NORM_STEP_REVIN_STATS:
    case FG_NORM_STEP_REVIN_APPLY: return revin_step(ctx, c, run);
    case FG_NORM_STEP_REVIN_BACKWARD: return revin_backward_step(ctx, c, run);
    }
    return fg_fail(FG_ERR_INTERNAL, "cuda norm: unknown step %d", (int)c->step);
}

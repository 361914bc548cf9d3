/*
 * gemm.cu — the CUDA GEMM primitive: the one file that calls cuBLAS(Lt). Every CUDA op
 * that multiplies matrices comes here through fg_gemm_execute (src/core/gemm.c), which
 * has already made c row-major and every dim fit int32.
 *
 *  - General products: cuBLASLt, computing cᵀ = bᵀ·aᵀ in its column-major terms, with
 *    the bias fused as an epilogue, f32 accumulation (f64 for f64), TF32 only when
 *    asked, split-K reductions restricted to deterministic schemes, algorithm choices
 *    cached per context.
 *  - Vector products (one row or one column, batch 1): own bandwidth-bound kernels.
 *    gemv_dot: each output is a dot product of a contiguous run (a warp per output
 *    pair, 16-byte loads). gemv_cols: outputs are columns of row-contiguous data
 *    (dx of a single row, bias gradients as a product with a vector of ones): blocks
 *    of row lanes × column vectors sum fixed row slices into a partial buffer, and a
 *    second kernel adds the slices (a warp a column, a fixed tree), so the result is
 *    deterministic.
 *  - Skinny products (m, n ≤ 128, k ≥ 4096: weight gradients of narrow layers over many
 *    tokens): an own kernel, 4 × 4 register tiles over k-slabs and a finish in slab order.
 *  - Rank-1 products (k == 1, outer products) of 2-byte types: an own write-stream
 *    kernel (it streams the writes faster than cuBLASLt does for 2-byte types; for f32
 *    cuBLASLt is faster, so f32 / f64 stay there).
 *  - Batch sums (c.bs == 0) in f16/bf16 accumulate in an f32 buffer and round once.
 *  - f32 products of a narrow layer over many tokens on sm_90a (a [m, k] row-major, b small;
 *    and the layer's weight gradient, a long reduction into a small c): three TF32 tensor-core
 *    passes of split operands at f32 accuracy (gemm_split.cu).
 */
#include "cuda_internal.h"
#include "elem.cuh"

#include <stdio.h>
#include <string.h>

#define LT_WORKSPACE ((size_t)32 << 20) /* the most a plan offers cuBLASLt */

/* ------------------------------------------------------------------ element helpers */

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* out = alpha·acc + beta·out + bias; out is never read when beta == 0. */
template <typename T, typename A>
__device__ __forceinline__ void epilogue(T *out, A acc, A alpha, A beta, const T *bias) {
    A v = alpha * acc;
    if (beta != A(0)) v += beta * to_acc(*out);
    if (bias) v += to_acc(*bias);
    *out = from_acc<T>(v);
}

/* out[j·os] = alpha·Σ_p M(p, j)·v[p·vs] + beta·out + bias[j·bias_inc],
 * M(p, j) at m[p·mp + j·mj], v NULL = ones. */
template <typename T> struct vec_args {
    const T *m, *v, *bias;
    T *out;
    int64_t mp, mj, vs, os, bias_inc, len, depth;
    typename acc_type<T>::type alpha, beta;
};

/* ------------------------------------------------------------------ gemv_dot */

constexpr int DOT_ROWS = 2;     /* outputs per warp: each x load feeds two rows */
constexpr int DOT_THREADS = 256;

template <typename T, int VEC>
__global__ void __launch_bounds__(DOT_THREADS) gemv_dot_kernel(vec_args<T> a) {
    typedef typename acc_type<T>::type A;
    const int lane = threadIdx.x & 31;
    const int64_t warp = ((int64_t)blockIdx.x * DOT_THREADS + threadIdx.x) >> 5;
    const int64_t j0 = warp * DOT_ROWS;
    if (j0 >= a.len) return;
    const bool two = j0 + 1 < a.len;
    const T *r0 = a.m + j0 * a.mj, *r1 = a.m + (two ? j0 + 1 : j0) * a.mj;
    A acc0 = 0, acc1 = 0;
    int64_t p_tail = 0;
    if (VEC > 1) { /* mp == 1, v contiguous (or ones), all 16-byte aligned */
        const int64_t nvec = a.depth / VEC;
        int64_t q = lane;
        for (; q + 32 < nvec; q += 64) { /* two vectors per row in flight */
            vec_t<T, VEC> m00 = load_vec<T, VEC>(r0 + q * VEC), m01 = load_vec<T, VEC>(r0 + (q + 32) * VEC);
            vec_t<T, VEC> m10 = load_vec<T, VEC>(r1 + q * VEC), m11 = load_vec<T, VEC>(r1 + (q + 32) * VEC);
            vec_t<T, VEC> x0, x1;
            if (a.v) {
                x0 = load_vec<T, VEC>(a.v + q * VEC);
                x1 = load_vec<T, VEC>(a.v + (q + 32) * VEC);
            }
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                A xe0 = a.v ? to_acc(x0.v[e]) : A(1), xe1 = a.v ? to_acc(x1.v[e]) : A(1);
                acc0 += to_acc(m00.v[e]) * xe0 + to_acc(m01.v[e]) * xe1;
                acc1 += to_acc(m10.v[e]) * xe0 + to_acc(m11.v[e]) * xe1;
            }
        }
        for (; q < nvec; q += 32) {
            vec_t<T, VEC> m0 = load_vec<T, VEC>(r0 + q * VEC), m1 = load_vec<T, VEC>(r1 + q * VEC);
            vec_t<T, VEC> x;
            if (a.v) x = load_vec<T, VEC>(a.v + q * VEC);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                A xe = a.v ? to_acc(x.v[e]) : A(1);
                acc0 += to_acc(m0.v[e]) * xe;
                acc1 += to_acc(m1.v[e]) * xe;
            }
        }
        p_tail = nvec * VEC;
    }
    for (int64_t p = p_tail + lane; p < a.depth; p += 32) {
        A xe = a.v ? to_acc(a.v[p * a.vs]) : A(1);
        acc0 += to_acc(r0[p * a.mp]) * xe;
        acc1 += to_acc(r1[p * a.mp]) * xe;
    }
    acc0 = warp_sum(acc0);
    acc1 = warp_sum(acc1);
    if (lane == 0) {
        epilogue(a.out + j0 * a.os, acc0, a.alpha, a.beta, a.bias ? a.bias + j0 * a.bias_inc : nullptr);
        if (two)
            epilogue(a.out + (j0 + 1) * a.os, acc1, a.alpha, a.beta,
                     a.bias ? a.bias + (j0 + 1) * a.bias_inc : nullptr);
    }
}

/* ------------------------------------------------------------------ gemv_cols */

constexpr int COLS_THREADS = 256;

/* Block (x, s) of a column sum: CV threads side by side take VEC columns each (16-byte loads
 * when `vec`, else element loads of the same columns), and the block's COLS_THREADS / CV row
 * lanes walk slice s's rows (lane l: rows p0 + l, p0 + l + lanes, ...), so a few columns still
 * fill the block. The lanes' sums are added by a fixed tree in shared memory; with one slice the
 * block finishes the outputs, else it writes its slice of `part` [S, len]. The geometry depends
 * on the shape alone and both load forms add the same terms in the same order: the same bits
 * whatever the alignment or the GPU. */
template <typename T, int VEC>
__global__ void __launch_bounds__(COLS_THREADS)
    gemv_cols_kernel(vec_args<T> a, typename acc_type<T>::type *part, int64_t rows_per, int slices, int cv, bool vec) {
    typedef typename acc_type<T>::type A;
    __shared__ A red[COLS_THREADS * VEC];
    const int c = threadIdx.x % cv, lane = threadIdx.x / cv, lanes = COLS_THREADS / cv;
    const int64_t j = ((int64_t)blockIdx.x * cv + c) * VEC;
    const int64_t p0 = (int64_t)blockIdx.y * rows_per;
    const int64_t p1 = p0 + rows_per < a.depth ? p0 + rows_per : a.depth;
    A acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) acc[e] = 0;
    if (j < a.len && vec && j + VEC <= a.len) {
        int64_t p = p0 + lane;
        for (; p + 7 * lanes < p1; p += 8 * lanes) { /* eight rows in flight */
            vec_t<T, VEC> r[8];
#pragma unroll
            for (int u = 0; u < 8; u++) r[u] = load_vec<T, VEC>(a.m + (p + u * lanes) * a.mp + j);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                A x = a.v ? to_acc(a.v[(p + u * lanes) * a.vs]) : A(1);
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[e] += x * to_acc(r[u].v[e]);
            }
        }
        for (; p < p1; p += lanes) {
            vec_t<T, VEC> r = load_vec<T, VEC>(a.m + p * a.mp + j);
            A x = a.v ? to_acc(a.v[p * a.vs]) : A(1);
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[e] += x * to_acc(r.v[e]);
        }
    } else if (j < a.len) {
        for (int64_t p = p0 + lane; p < p1; p += lanes) {
            A x = a.v ? to_acc(a.v[p * a.vs]) : A(1);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (j + e < a.len) acc[e] += x * to_acc(a.m[p * a.mp + (j + e) * a.mj]);
        }
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) red[threadIdx.x * VEC + e] = acc[e];
    __syncthreads();
    for (int h = lanes >> 1; h > 0; h >>= 1) { /* lane l += lane l + h, halving */
        if (lane < h)
#pragma unroll
            for (int e = 0; e < VEC; e++) red[threadIdx.x * VEC + e] += red[(threadIdx.x + h * cv) * VEC + e];
        __syncthreads();
    }
    if (lane != 0 || j >= a.len) return;
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        if (j + e >= a.len) break;
        const A sum = red[c * VEC + e];
        if (slices == 1)
            epilogue(a.out + (j + e) * a.os, sum, a.alpha, a.beta, a.bias ? a.bias + (j + e) * a.bias_inc : nullptr);
        else
            part[(int64_t)blockIdx.y * a.len + j + e] = sum;
    }
}

/* Adds the slices of column j in a fixed order (a warp a column: strided lane sums, then the
 * xor tree, lane 0's result): the same bits every run. */
template <typename T>
__global__ void __launch_bounds__(256) gemv_cols_finish(vec_args<T> a, const typename acc_type<T>::type *part, int slices) {
    typedef typename acc_type<T>::type A;
    const int lane = threadIdx.x & 31;
    const int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (j >= a.len) return;
    A acc = 0;
    for (int s = lane; s < slices; s += 32) acc += part[(int64_t)s * a.len + j];
    acc = warp_sum(acc);
    if (lane == 0) epilogue(a.out + j * a.os, acc, a.alpha, a.beta, a.bias ? a.bias + j * a.bias_inc : nullptr);
}

/* ------------------------------------------------------------------ 2-D axpby */

/* dst[i, j] = beta·src[i, j] + bias[i·bias_rs + j·bias_cs] (src NULL: 0). Prepares c for a
 * product (k == 0, a bias that cuBLASLt cannot fuse) and widens / narrows the f32
 * buffer of a low-precision batch sum. */
template <typename S, typename D>
__global__ void axpby_2d_kernel(const S *src, int64_t lds, D *dst, int64_t ldd, int64_t rows, int64_t cols,
                                float beta, const D *bias, int64_t bias_rs, int64_t bias_cs) {
    const int64_t total = rows * cols;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / cols, j = t - i * cols;
        double v = (src && beta != 0.0f) ? (double)beta * (double)to_acc(src[i * lds + j]) : 0.0;
        if (bias) v += (double)to_acc(bias[i * bias_rs + j * bias_cs]);
        dst[i * ldd + j] = from_acc<D>((typename acc_type<D>::type)v);
    }
}

template <typename S, typename D>
static cudaError_t axpby_2d(cudaStream_t st, const void *src, int64_t lds, void *dst, int64_t ldd, int64_t rows,
                            int64_t cols, double beta, const void *bias, int64_t bias_rs, int64_t bias_cs) {
    int64_t total = rows * cols;
    if (total == 0) return cudaSuccess;
    int64_t blocks = (total + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    axpby_2d_kernel<S, D><<<(unsigned)blocks, 256, 0, st>>>((const S *)src, lds, (D *)dst, ldd, rows, cols,
                                                           (float)beta, (const D *)bias, bias_rs, bias_cs);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ rank 1 (k == 1) */

/* c[i, j] = alpha·a[i]·b[j] + beta·c[i, j] + bias: a write stream. Each thread keeps VEC
 * consecutive b values in registers and walks rows (blockIdx.y, grid-stride). */
template <typename T, int VEC>
__global__ void __launch_bounds__(256) rank1_kernel(const T *a, int64_t as, const T *b, int64_t bs, T *c, int64_t ldc,
                                                    int64_t m, int64_t n, typename acc_type<T>::type alpha,
                                                    typename acc_type<T>::type beta, const T *bias, int64_t bias_rs,
                                                    int64_t bias_cs) {
    typedef typename acc_type<T>::type A;
    const int64_t j = ((int64_t)blockIdx.x * 256 + threadIdx.x) * VEC;
    if (j >= n) return;
    const bool full = j + VEC <= n;
    A bj[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) bj[e] = (full || j + e < n) ? alpha * to_acc(b[(j + e) * bs]) : A(0);
    for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
        const A ai = to_acc(a[i * as]);
        T *row = c + i * ldc + j;
        if (VEC > 1 && full && beta == A(0) && !bias) {
            vec_t<T, VEC> out;
#pragma unroll
            for (int e = 0; e < VEC; e++) out.v[e] = from_acc<T>(ai * bj[e]);
            store_vec<T, VEC>(row, out);
            continue;
        }
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            if (j + e >= n) break;
            A v = ai * bj[e];
            if (beta != A(0)) v += beta * to_acc(row[e]);
            if (bias) v += to_acc(bias[i * bias_rs + (j + e) * bias_cs]);
            row[e] = from_acc<T>(v);
        }
    }
}

/* ------------------------------------------------------------------ dtype dispatch */

template <template <typename> class F, typename... Args>
static fg_status by_dtype(fg_dtype t, Args &&...args) {
    switch (t) {
    case FG_F32: return F<float>::run(args...);
    case FG_F64: return F<double>::run(args...);
    case FG_F16: return F<__half>::run(args...);
    case FG_BF16: return F<__nv_bfloat16>::run(args...);
    }
    return fg_fail(FG_ERR_DTYPE, "cuda gemm: unknown dtype %d", (int)t);
}

static bool aligned16(const void *p, int64_t stride_elems, size_t es) {
    return ((uintptr_t)p % 16 == 0) && ((stride_elems * (int64_t)es) % 16 == 0);
}

/* Planning: whether the operands are declared 16-byte aligned (0: the default, 256) and the
 * stride keeps rows so. Running, the pointers themselves are checked (a sub-matrix may have
 * less than its operand). */
static bool declared16(const fg_gemm *g, int64_t stride_elems, size_t es) {
    return (g->align == 0 || g->align >= 16) && (stride_elems * (int64_t)es) % 16 == 0;
}

/* ------------------------------------------------------------------ vector products */

typedef struct vec_plan {
    bool dot, vec;
    int slices;
    int64_t rows_per;
    size_t ws;
} vec_plan;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T> struct vector_product {
    static fg_status run(const fg_gemm *g, fg_context *ctx, fg_kernel_info *info, void *ws, size_t ws_bytes,
                         bool do_run) {
        typedef typename acc_type<T>::type A;
        constexpr int VEC = 16 / sizeof(T);
        vec_args<T> a;
        /* same mapping as the CPU backend: output index j, reduction index p */
        if (g->m == 1) {
            a.m = (const T *)g->b.data; a.v = (const T *)g->a.data;
            a.mp = g->b.rs; a.mj = g->b.cs; a.vs = g->a.cs;
            a.out = (T *)g->c.data; a.os = g->c.cs; a.len = g->n; a.bias_inc = g->bias_cs;
        } else {
            a.m = (const T *)g->a.data; a.v = (const T *)g->b.data;
            a.mp = g->a.cs; a.mj = g->a.rs; a.vs = g->b.rs;
            a.out = (T *)g->c.data; a.os = g->c.rs; a.len = g->m; a.bias_inc = g->bias_rs;
        }
        a.depth = g->k;
        a.bias = (const T *)g->bias;
        a.alpha = (A)g->alpha;
        a.beta = (A)g->beta;
        const bool dot = a.mp == 1 || a.len == 1 || a.mj != 1;
        /* a vector of ones in place of the vector operand (a column sum), known when planning too */
        const bool ones = (g->m == 1 ? g->a.operand : g->b.operand) == FG_OPERAND_ONES;
        const char *tn = fg_dtype_name(g->dtype);
        if (dot) {
            bool vec = a.mp == 1 && (ones || a.vs == 1);
            if (do_run) vec = vec && aligned16(a.m, a.mj, sizeof(T)) && (!a.v || aligned16(a.v, 0, sizeof(T)));
            else vec = vec && declared16(g, a.mj, sizeof(T));
            snprintf(info->name, sizeof info->name, "gemv_dot<%s,v%d>%s", tn, vec ? VEC : 1, ones ? "_ones" : "");
            if (!do_run) return FG_OK;
            int64_t warps = cdiv(a.len, DOT_ROWS);
            int64_t blocks = cdiv(warps * 32, DOT_THREADS);
            if (vec) gemv_dot_kernel<T, VEC><<<(unsigned)blocks, DOT_THREADS, 0, ctx->cuda->stream>>>(a);
            else gemv_dot_kernel<T, 1><<<(unsigned)blocks, DOT_THREADS, 0, ctx->cuda->stream>>>(a);
            cudaError_t e = cudaGetLastError();
            return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "gemv_dot");
        }
        /* columns: the geometry from the shape alone (VEC columns a thread, CV threads side by
           side, the rest of the block row lanes), so results never depend on the GPU or on the
           pointers' alignment; about 512 blocks, each lane taking at least 8 rows */
        const int64_t col_vecs = cdiv(a.len, VEC);
        int cv = 1;
        while (cv < col_vecs && cv < COLS_THREADS) cv <<= 1;
        const int64_t lanes = COLS_THREADS / cv, col_blocks = cdiv(col_vecs, cv);
        int64_t slices = cdiv(512, col_blocks);
        const int64_t max_slices = cdiv(a.depth, lanes * 8); /* (one round of eight rows a lane) */
        if (slices > max_slices) slices = max_slices;
        if (slices > 65535) slices = 65535;
        if (slices < 1) slices = 1;
        const int64_t rows_per = cdiv(a.depth, slices);
        slices = cdiv(a.depth, rows_per);
        info->workspace_bytes = slices > 1 ? (size_t)(slices * a.len) * sizeof(A) : 0;
        const bool vec = do_run ? aligned16(a.m, a.mp, sizeof(T)) : declared16(g, a.mp, sizeof(T));
        snprintf(info->name, sizeof info->name, "gemv_cols<%s,v%d>x%lld%s", tn, vec ? VEC : 1, (long long)slices,
                 ones ? "_ones" : "");
        if (!do_run) return FG_OK;
        if (ws_bytes < info->workspace_bytes) return fg_fail(FG_ERR_INTERNAL, "gemv_cols: workspace too small");
        dim3 grid((unsigned)col_blocks, (unsigned)slices);
        A *part = (A *)ws;
        gemv_cols_kernel<T, VEC><<<grid, COLS_THREADS, 0, ctx->cuda->stream>>>(a, part, rows_per, (int)slices, cv,
                                                                               vec && a.mj == 1);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess && slices > 1)
            gemv_cols_finish<T><<<(unsigned)cdiv(a.len * 32, 256), 256, 0, ctx->cuda->stream>>>(a, part, (int)slices);
        if (e == cudaSuccess) e = cudaGetLastError();
        return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "gemv_cols");
    }
};

/* ------------------------------------------------------------------ skinny products */

/* c [m, n] = alpha·Σ_p a(:, p) ⊗ b(p, :) + beta·c for few outputs (m, n ≤ 128) and a long
 * reduction (k ≥ 4096), for each batch (own outputs: c.bs ≠ 0; the batch is the grid's z):
 * weight gradients dyᵀ·x of narrow layers over many tokens, where cuBLASLt
 * runs a few tiles for the whole of k, or a split-K with a reduction kernel costing as much as
 * the product. Here a column of a (a.rs == 1) and a row of b (b.cs == 1) are contiguous: each
 * thread keeps a 4 × 4 tile of c in registers; the block's threads cover the outputs and, when
 * they are few, several k-lanes of the block's slab of rows each (lane l: rows p0 + l,
 * p0 + l + lanes, ...), added by a fixed tree in shared memory; every slab writes one partial
 * [m, n] in f32, and a finish kernel adds the slabs in order. The geometry depends on the shape
 * alone and both load forms add the same terms in the same order: the same bits every run. */
constexpr int SK_THREADS = 256, SK_T = 4;

struct skinny_geom {
    int64_t tiles_n, outs;  /* 4 × 4 tiles along n, and in all */
    int ot, klanes;         /* output threads a block (a power of two), k-lanes a block */
    int64_t out_blocks, slices, rows_per;
};

static skinny_geom skinny_geometry(const fg_gemm *g) {
    skinny_geom s;
    s.tiles_n = cdiv(g->n, SK_T);
    s.outs = cdiv(g->m, SK_T) * s.tiles_n;
    s.ot = 1;
    while (s.ot < s.outs && s.ot < SK_THREADS) s.ot <<= 1;
    s.klanes = SK_THREADS / s.ot;
    s.out_blocks = cdiv(s.outs, s.ot);
    /* 32 rows a lane (four rounds of eight loads in flight: the product is latency-bound, not
       bandwidth- or FMA-bound, at these sizes), the partials at most 8 MB */
    int64_t slices = cdiv(g->k, (int64_t)s.klanes * 32);
    const int64_t most = ((int64_t)1 << 21) / (g->m * g->n * g->batch);
    if (slices > most) slices = most;
    if (slices > 65535) slices = 65535;
    if (slices < 1) slices = 1;
    s.rows_per = cdiv(g->k, slices);
    s.slices = cdiv(g->k, s.rows_per);
    return s;
}

/* Whether the skinny kernel takes the product (the same answer planning and running). */
static bool skinny_takes(const fg_gemm *g) {
    if (g->dtype != FG_F32 && g->dtype != FG_F16 && g->dtype != FG_BF16) return false;
    if ((g->batch != 1 && g->c.bs == 0) || g->batch > 65535) return false; /* (a batch sum: cuBLASLt) */
    if (g->c_f32 || g->act || g->bias || g->bias_operand >= 0) return false;
    if (g->epi.has_aux || g->epi.form || g->epi.col_sums) return false;
    if (g->k < 4096 || g->m < 2 || g->n < 2 || g->m > 128 || g->n > 128) return false;
    /* a few thousand outputs at most (fastgrad-train's [128, 16]): at [128, 128] over 172032 rows
       cuBLASLt's tensor-core products are an order faster (bf16 2.3 ms a call here) */
    if (g->m * g->n > FG_SKINNY_MAX_OUTS) return false;
    if (g->a.operand == FG_OPERAND_ONES || g->b.operand == FG_OPERAND_ONES) return false;
    return g->a.rs == 1 && g->b.cs == 1;
}

struct skinny_args {
    int64_t m, n, k, lda, ldb, c_rs, c_cs, rows_per, tiles_n, outs;
    int64_t a_bs, b_bs, c_bs; /* batch strides (the batch: blockIdx.z, the finish's blockIdx.y) */
    int ot, klanes, slices;
    bool vec;
    float alpha, beta;
};

template <typename T>
__device__ __forceinline__ void skinny_load4(const T *p, int64_t left, bool vec, float (&v)[SK_T]) {
    if (vec && left >= SK_T) {
        const vec_t<T, SK_T> x = *(const vec_t<T, SK_T> *)p;
#pragma unroll
        for (int e = 0; e < SK_T; e++) v[e] = to_acc(x.v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < SK_T; e++) v[e] = e < left ? to_acc(p[e]) : 0.f;
    }
}

template <typename T>
__global__ void __launch_bounds__(SK_THREADS) skinny_kernel(const T *a, const T *b, T *c, float *part, skinny_args s) {
    __shared__ float red[SK_THREADS * SK_T * SK_T];
    a += blockIdx.z * s.a_bs, b += blockIdx.z * s.b_bs, c += blockIdx.z * s.c_bs;
    part += (int64_t)blockIdx.z * s.slices * s.m * s.n;
    const int t = threadIdx.x % s.ot, lane = threadIdx.x / s.ot;
    const int64_t o = (int64_t)blockIdx.x * s.ot + t;
    const int64_t i0 = o / s.tiles_n * SK_T, j0 = o % s.tiles_n * SK_T;
    const int64_t p0 = (int64_t)blockIdx.y * s.rows_per;
    const int64_t p1 = p0 + s.rows_per < s.k ? p0 + s.rows_per : s.k;
    float acc[SK_T][SK_T];
#pragma unroll
    for (int x = 0; x < SK_T; x++)
#pragma unroll
        for (int y = 0; y < SK_T; y++) acc[x][y] = 0.f;
    if (o < s.outs) {
        const int64_t mi = s.m - i0, nj = s.n - j0;
        int64_t p = p0 + lane;
        for (; p + 7 * s.klanes < p1; p += 8 * s.klanes) { /* eight rows in flight */
            float va[8][SK_T], vb[8][SK_T];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                skinny_load4(a + (p + u * s.klanes) * s.lda + i0, mi, s.vec, va[u]);
                skinny_load4(b + (p + u * s.klanes) * s.ldb + j0, nj, s.vec, vb[u]);
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
#pragma unroll
                for (int x = 0; x < SK_T; x++)
#pragma unroll
                    for (int y = 0; y < SK_T; y++) acc[x][y] += va[u][x] * vb[u][y];
        }
        for (; p < p1; p += s.klanes) {
            float va[SK_T], vb[SK_T];
            skinny_load4(a + p * s.lda + i0, mi, s.vec, va);
            skinny_load4(b + p * s.ldb + j0, nj, s.vec, vb);
#pragma unroll
            for (int x = 0; x < SK_T; x++)
#pragma unroll
                for (int y = 0; y < SK_T; y++) acc[x][y] += va[x] * vb[y];
        }
    }
    /* the k-lanes' tiles, added by halving: lane l += lane l + h */
    float *mine = red + threadIdx.x * SK_T * SK_T;
#pragma unroll
    for (int x = 0; x < SK_T; x++)
#pragma unroll
        for (int y = 0; y < SK_T; y++) mine[x * SK_T + y] = acc[x][y];
    __syncthreads();
    for (int h = s.klanes >> 1; h > 0; h >>= 1) {
        if (lane < h) {
            const float *other = red + (threadIdx.x + h * s.ot) * SK_T * SK_T;
#pragma unroll
            for (int e = 0; e < SK_T * SK_T; e++) mine[e] += other[e];
        }
        __syncthreads();
    }
    if (lane != 0 || o >= s.outs) return;
    for (int x = 0; x < SK_T && i0 + x < s.m; x++)
        for (int y = 0; y < SK_T && j0 + y < s.n; y++) {
            const int64_t i = i0 + x, j = j0 + y;
            if (s.slices == 1)
                epilogue<T, float>(c + i * s.c_rs + j * s.c_cs, mine[x * SK_T + y], s.alpha, s.beta, nullptr);
            else
                part[((int64_t)blockIdx.y * s.m + i) * s.n + j] = mine[x * SK_T + y];
        }
}

/* Adds the slabs' partials in order: a block takes 32 outputs × 32 slab lanes (lane l: slabs l,
 * l + 32, ..., two sums alternating), the lanes added by a fixed tree. */
constexpr int SK_FIN_LANES = 32;
template <typename T>
__global__ void __launch_bounds__(32 * SK_FIN_LANES) skinny_finish(const float *part, T *c, skinny_args s) {
    __shared__ float red[32 * SK_FIN_LANES];
    part += (int64_t)blockIdx.y * s.slices * s.m * s.n, c += blockIdx.y * s.c_bs;
    const int t = threadIdx.x & 31, lane = threadIdx.x >> 5;
    const int64_t mn = s.m * s.n, o = (int64_t)blockIdx.x * 32 + t;
    float acc0 = 0.f, acc1 = 0.f;
    if (o < mn) {
        int q = lane;
        for (; q + SK_FIN_LANES < s.slices; q += 2 * SK_FIN_LANES) {
            acc0 += part[(int64_t)q * mn + o];
            acc1 += part[(int64_t)(q + SK_FIN_LANES) * mn + o];
        }
        if (q < s.slices) acc0 += part[(int64_t)q * mn + o];
    }
    red[threadIdx.x] = acc0 + acc1;
    __syncthreads();
    for (int h = SK_FIN_LANES / 2; h > 0; h >>= 1) {
        if (lane < h) red[threadIdx.x] += red[threadIdx.x + h * 32];
        __syncthreads();
    }
    if (lane == 0 && o < mn)
        epilogue<T, float>(c + o / s.n * s.c_rs + o % s.n * s.c_cs, red[t], s.alpha, s.beta, nullptr);
}

template <typename T> struct skinny_product {
    static fg_status run(const fg_gemm *g, fg_context *ctx, fg_kernel_info *info, void *ws, size_t ws_bytes,
                         bool do_run) {
        const skinny_geom q = skinny_geometry(g);
        skinny_args s;
        s.m = g->m, s.n = g->n, s.k = g->k, s.lda = g->a.cs, s.ldb = g->b.rs, s.c_rs = g->c.rs, s.c_cs = g->c.cs;
        s.a_bs = g->a.bs, s.b_bs = g->b.bs, s.c_bs = g->c.bs;
        s.rows_per = q.rows_per, s.tiles_n = q.tiles_n, s.outs = q.outs;
        s.ot = q.ot, s.klanes = q.klanes, s.slices = (int)q.slices;
        s.alpha = (float)g->alpha, s.beta = (float)g->beta;
        /* vector loads of four elements: the rows' starts and strides aligned to them */
        const size_t v = SK_T * sizeof(T);
        const bool strides = (s.lda * (int64_t)sizeof(T)) % (int64_t)v == 0 && (s.ldb * (int64_t)sizeof(T)) % (int64_t)v == 0 &&
                             (s.a_bs * (int64_t)sizeof(T)) % (int64_t)v == 0 && (s.b_bs * (int64_t)sizeof(T)) % (int64_t)v == 0;
        s.vec = strides && (do_run ? (uintptr_t)g->a.data % v == 0 && (uintptr_t)g->b.data % v == 0
                                   : (g->align == 0 || g->align >= v));
        info->workspace_bytes = q.slices > 1 ? (size_t)(q.slices * g->m * g->n * g->batch) * sizeof(float) : 0;
        snprintf(info->name, sizeof info->name, "skinny<%s,v%d>x%lld%s", fg_dtype_name(g->dtype), s.vec ? SK_T : 1,
                 (long long)q.slices, g->batch > 1 ? " batched" : "");
        if (!do_run) return FG_OK;
        if (ws_bytes < info->workspace_bytes) return fg_fail(FG_ERR_INTERNAL, "skinny: workspace too small");
        cudaStream_t st = ctx->cuda->stream;
        dim3 grid((unsigned)q.out_blocks, (unsigned)q.slices, (unsigned)g->batch);
        skinny_kernel<T><<<grid, SK_THREADS, 0, st>>>((const T *)g->a.data, (const T *)g->b.data, (T *)g->c.data,
                                                      (float *)ws, s);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess && q.slices > 1)
            skinny_finish<T><<<dim3((unsigned)cdiv(g->m * g->n, 32), (unsigned)g->batch), 32 * SK_FIN_LANES, 0, st>>>(
                (const float *)ws, (T *)g->c.data, s);
        if (e == cudaSuccess) e = cudaGetLastError();
        return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "skinny");
    }
};
/* (f64 products never take it: skinny_takes) */
template <> struct skinny_product<double> {
    static fg_status run(const fg_gemm *, fg_context *, fg_kernel_info *, void *, size_t, bool) {
        return fg_fail(FG_ERR_INTERNAL, "skinny: no f64 kernel");
    }
};

/* ------------------------------------------------------------------ cuBLASLt */

static cudaDataType_t cuda_type(fg_dtype t) {
    switch (t) {
    case FG_F32: return CUDA_R_32F;
    case FG_F64: return CUDA_R_64F;
    case FG_F16: return CUDA_R_16F;
    case FG_BF16: return CUDA_R_16BF;
    }
    return CUDA_R_32F;
}

/* What cuBLASLt is told of a matrix's alignment: the lowest of its leading dim's, its batch
 * stride's and the alignment the plan declared (0: 256) — running, also the pointer's own (a
 * sub-matrix's pointer may have less), so a run asks for what its plan named whenever the
 * caller kept the promise. */
static uint32_t alignment(const void *p, int64_t ld, int64_t bs, size_t es, bool known, uint32_t declared) {
    uintptr_t bits = (uintptr_t)(ld * (int64_t)es) | (uintptr_t)(bs * (int64_t)es) | (declared ? declared : 256u);
    if (known) bits |= (uintptr_t)p;
    return (uint32_t)(bits & (~bits + 1)); /* lowest set bit */
}

/* The epilogues used: bias along D's rows (our c's columns), optionally followed by relu.
 * cuBLASLt's RELU_BIAS keeps NaN and costs the product nothing; its GELU (tanh form) is not
 * used: it gives inf for 3e38 and 0 for gelu(−5) = −2.3e−7 in bf16, outside this library's
 * accuracy contract. */
static bool epi_has_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
}
static const char *epi_name(cublasLtEpilogue_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return "+bias";
    case CUBLASLT_EPILOGUE_RELU: return "+relu";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "+bias+relu";
    default: return "";
    }
}

/* The epilogue for c = act(a·b + bias), or DEFAULT when cuBLASLt has none for act. */
static cublasLtEpilogue_t act_epilogue(const fg_gemm *g, bool bias) {
    if (g->act == FG_ACT_RELU && g->dtype != FG_F64) return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    return CUBLASLT_EPILOGUE_DEFAULT;
}

/* One cuBLASLt product in column-major terms: D = alpha·op(A)·op(B) + beta·C, C = D. */
typedef struct lt_call {
    fg_lt_key key;
    const void *a, *b, *bias;
    void *c;
    double alpha, beta;
} lt_call;

#define LT_CHECK(expr)                                                                                       \
    do {                                                                                                     \
        cublasStatus_t st_ = (expr);                                                                         \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                  \
            status = fg_fail(FG_ERR_BACKEND, "cuBLASLt: %s failed (status %d)", #expr, (int)st_);            \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

/* Drops what a cache entry owns (its cuBLASLt descriptors) and empties it. */
extern "C" void fg_lt_entry_clear(fg_lt_entry *e) {
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc) cublasLtMatrixLayoutDestroy(e->lc);
    memset(e, 0, sizeof *e);
}

/* Plans (run = false) or runs with at most `limit` bytes of workspace at ws; *found says
 * whether cuBLASLt has an algorithm, *need what it uses. */
static fg_status lt_matmul(fg_context *ctx, const lt_call *c, bool run, bool *found, size_t *need, char *name,
                           size_t name_len, void *ws, size_t limit) {
    struct fg_cuda_state *st = ctx->cuda;
    const fg_lt_key *k = &c->key;
    fg_status status = FG_OK;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const bool f64 = k->dtype == FG_F64;
    cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
    cudaDataType_t ab = cuda_type((fg_dtype)k->dtype), cd = cuda_type((fg_dtype)k->ctype);
    cublasOperation_t opa = (cublasOperation_t)k->op_a, opb = (cublasOperation_t)k->op_b;
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epilogue;
    /* the key's slots: FNV-1a of its bytes (the key has no padding) picks the first */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ ((const unsigned char *)k)[i]) * 1099511628211ull;
    const int home = (int)(h % FG_LT_CACHE);
    fg_lt_entry *hit = NULL, *slot = NULL;
    for (int i = 0; i < FG_LT_PROBE && !hit; i++) {
        fg_lt_entry *e = &st->cache[(home + i) % FG_LT_CACHE];
        if (!e->used) {
            if (!slot) slot = e;
        } else if (memcmp(&e->key, k, sizeof *k) == 0) {
            hit = e;
        }
    }
    fg_lt_entry *stale = NULL;
    if (hit && hit->found && hit->workspace > limit) stale = hit, hit = NULL; /* chosen under a larger workspace */

    if (!hit) { /* descriptors and the heuristic's choice, kept with the entry */
        LT_CHECK(cublasLtMatmulDescCreate(&op, compute, scale));
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (epi_has_bias(epi)) {
            const void *bias = (const void *)(uintptr_t)256; /* any aligned value until a run sets it */
            LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        }
        LT_CHECK(cublasLtMatrixLayoutCreate(&la, ab, (uint64_t)k->rows_a, (uint64_t)k->cols_a, k->ld_a));
        LT_CHECK(cublasLtMatrixLayoutCreate(&lb, ab, (uint64_t)k->rows_b, (uint64_t)k->cols_b, k->ld_b));
        LT_CHECK(cublasLtMatrixLayoutCreate(&lc, cd, (uint64_t)k->rows_c, (uint64_t)k->cols_c, k->ld_c));
        if (k->batch > 1) {
            int32_t count = (int32_t)k->batch;
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &k->bs_a, sizeof k->bs_a));
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &k->bs_b, sizeof k->bs_b));
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &k->bs_c, sizeof k->bs_c));
        }
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t wsb = limit;
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align_a, sizeof k->align_a));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align_b, sizeof k->align_b));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align_c, sizeof k->align_c));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align_c, sizeof k->align_c));
        cublasLtMatmulHeuristicResult_t res;
        int n = 0;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->lt, op, la, lb, lc, lc, pref, 1, &res, &n);
        hit = stale ? stale : slot ? slot : &st->cache[home]; /* the key's own slot, a free one, or the home one */
        fg_lt_entry_clear(hit);
        hit->used = true;
        hit->key = *k;
        hit->found = hs == CUBLAS_STATUS_SUCCESS && n > 0;
        hit->limit = limit;
        hit->op = op, hit->la = la, hit->lb = lb, hit->lc = lc; /* the entry owns them now */
        op = NULL, la = lb = lc = NULL;
        if (hit->found) {
            hit->algo = res.algo;
            hit->workspace = res.workspaceSize;
        }
    }
    *found = hit->found;
    if (need) *need = hit->found ? hit->workspace : 0;
    if (hit->found && name) {
        int id = 0, tile = 0, splitk = 0;
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&hit->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&hit->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&hit->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
        snprintf(name, name_len, "cublasLt(algo=%d,tile=%d,splitk=%d)%s", id, tile, splitk, epi_name(epi));
    }
    if (run && hit->found) {
        float af = (float)c->alpha, bf = (float)c->beta;
        const void *alpha = f64 ? (const void *)&c->alpha : (const void *)&af;
        const void *beta = f64 ? (const void *)&c->beta : (const void *)&bf;
        if (epi_has_bias(epi))
            LT_CHECK(cublasLtMatmulDescSetAttribute(hit->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c->bias, sizeof c->bias));
        LT_CHECK(cublasLtMatmul(st->lt, hit->op, alpha, c->a, hit->la, c->b, hit->lb, beta, c->c, hit->lc, c->c,
                                hit->lc, &hit->algo, hit->workspace ? ws : NULL, hit->workspace, st->stream));
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    return status;
}

/* Column-major description of row-major c = a·b: cᵀ = bᵀ·aᵀ. */
static lt_call lt_describe(const fg_gemm *g, fg_dtype ctype, void *c_ptr, int64_t ldc, int64_t bsc, bool run) {
    lt_call c;
    memset(&c, 0, sizeof c);
    fg_lt_key *k = &c.key;
    const size_t es = fg_dtype_size(g->dtype), ces = fg_dtype_size(ctype);
    k->dtype = g->dtype;
    k->ctype = ctype;
    k->tf32 = g->allow_tf32;
    k->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    /* Lt's A is bᵀ (n×k) */
    if (g->b.cs == 1 || g->n == 1) {
        k->op_a = CUBLAS_OP_N; k->rows_a = g->n; k->cols_a = g->k; k->ld_a = g->b.rs;
    } else {
        k->op_a = CUBLAS_OP_T; k->rows_a = g->k; k->cols_a = g->n; k->ld_a = g->b.cs;
    }
    /* Lt's B is aᵀ (k×m) */
    if (g->a.cs == 1 || g->k == 1) {
        k->op_b = CUBLAS_OP_N; k->rows_b = g->k; k->cols_b = g->m; k->ld_b = g->a.rs;
    } else {
        k->op_b = CUBLAS_OP_T; k->rows_b = g->m; k->cols_b = g->k; k->ld_b = g->a.cs;
    }
    if (k->ld_a < k->rows_a) k->ld_a = k->rows_a;
    if (k->ld_b < k->rows_b) k->ld_b = k->rows_b;
    k->rows_c = g->n;
    k->cols_c = g->m;
    k->ld_c = ldc < g->n ? g->n : ldc;
    k->batch = g->batch;
    if (g->batch > 1) {
        k->bs_a = g->b.bs;
        k->bs_b = g->a.bs;
        k->bs_c = bsc;
    }
    /* alignment of the data when known (running, or a driver's query with real pointers) */
    k->align_a = alignment(g->b.data, k->ld_a, k->bs_a, es, run || g->b.data, g->align);
    k->align_b = alignment(g->a.data, k->ld_b, k->bs_b, es, run || g->a.data, g->align);
    k->align_c = alignment(c_ptr, k->ld_c, k->bs_c, ces, run || c_ptr, g->align);
    c.a = g->b.data;
    c.b = g->a.data;
    c.c = c_ptr;
    c.alpha = g->alpha;
    c.beta = g->beta;
    return c;
}

template <typename T> struct general_product {
    static fg_status run(const fg_gemm *g, fg_context *ctx, fg_kernel_info *info, void *ws, size_t ws_bytes,
                         bool do_run) {
        cudaStream_t s = ctx->cuda->stream;
        const fg_dtype t = g->dtype;
        const bool reduce = g->batch > 1 && g->c.bs == 0;
        const bool low = t == FG_F16 || t == FG_BF16;
        const size_t es = fg_dtype_size(t);
        cudaError_t e;
        if (g->k == 0) { /* c = beta·c + bias */
            snprintf(info->name, sizeof info->name, "axpby_2d<%s>", fg_dtype_name(t));
            if (!do_run) return FG_OK;
            int64_t batches = reduce ? 1 : g->batch;
            for (int64_t b = 0; b < batches; b++) {
                char *c = (char *)g->c.data + b * g->c.bs * (int64_t)es;
                e = axpby_2d<T, T>(s, c, g->c.rs, c, g->c.rs, g->m, g->n, g->beta, g->bias, g->bias_rs, g->bias_cs);
                if (e != cudaSuccess) return fg_cuda_fail(e, "axpby_2d");
            }
            return FG_OK;
        }
        if (g->k == 1 && g->batch == 1 && es == 2 && !g->c_f32) {
            /* an outer product of 2-byte values: no reduction, a write stream this kernel
               keeps closer to the copy bandwidth than cuBLASLt does (for f32 cuBLASLt is
               faster, so f32 / f64 stay there; docs/decisions.md) */
            typedef typename acc_type<T>::type A;
            constexpr int VEC = 16 / sizeof(T);
            bool vec = g->b.cs == 1 && (do_run ? aligned16(g->c.data, g->c.rs, es) && aligned16(g->b.data, 0, es)
                                               : declared16(g, g->c.rs, es));
            snprintf(info->name, sizeof info->name, "rank1<%s,v%d>", fg_dtype_name(t), vec ? VEC : 1);
            if (!do_run) return FG_OK;
            const int64_t per = vec ? 256 * VEC : 256;
            dim3 grid((unsigned)((g->n + per - 1) / per), (unsigned)(g->m < 2048 ? g->m : 2048));
            if (vec)
                rank1_kernel<T, VEC><<<grid, 256, 0, s>>>((const T *)g->a.data, g->a.rs, (const T *)g->b.data, g->b.cs,
                                                         (T *)g->c.data, g->c.rs, g->m, g->n, (A)g->alpha, (A)g->beta,
                                                         (const T *)g->bias, g->bias_rs, g->bias_cs);
            else
                rank1_kernel<T, 1><<<grid, 256, 0, s>>>((const T *)g->a.data, g->a.rs, (const T *)g->b.data, g->b.cs,
                                                       (T *)g->c.data, g->c.rs, g->m, g->n, (A)g->alpha, (A)g->beta,
                                                       (const T *)g->bias, g->bias_rs, g->bias_cs);
            e = cudaGetLastError();
            return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "rank1");
        }
        bool found = false;
        size_t need = 0;
        if (reduce) {
            if (g->bias) return fg_fail(FG_ERR_INTERNAL, "cuda gemm: a bias on a batch sum");
            /* Σ_b a_b·b_b: one product per batch element, in order, into c (f32/f64) or an
               f32 buffer at the end of the workspace, rounded once at the end (f16/bf16) */
            fg_gemm one = *g;
            one.batch = 1;
            one.a.bs = one.b.bs = one.c.bs = 0;
            const fg_dtype ct = low ? FG_F32 : t;
            const int64_t ldc = low ? g->n : g->c.rs;
            const size_t buf = low ? (((size_t)(g->m * g->n) * sizeof(float) + 255) & ~(size_t)255) : 0;
            size_t limit = do_run ? ws_bytes - buf : LT_WORKSPACE;
            void *cbuf = low ? (void *)((char *)ws + limit) : g->c.data;
            if (do_run && (ws_bytes < buf || ((uintptr_t)cbuf % 256) != 0))
                return fg_fail(FG_ERR_INTERNAL, "cuda gemm: workspace too small or misaligned for a batch sum");
            lt_call c = lt_describe(&one, ct, cbuf, ldc, 0, do_run);
            FG_TRY(lt_matmul(ctx, &c, false, &found, &need, info->name, sizeof info->name, ws, limit));
            if (!found) return fg_fail(FG_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for this %s batch sum", fg_dtype_name(t));
            info->workspace_bytes = ((need + 255) & ~(size_t)255) + buf;
            strncat(info->name, low ? " x batch, f32 sum" : " x batch", sizeof info->name - strlen(info->name) - 1);
            if (!do_run) return FG_OK;
            if (low) {
                e = axpby_2d<T, float>(s, g->c.data, g->c.rs, cbuf, ldc, g->m, g->n, g->beta, NULL, 0, 0);
                if (e != cudaSuccess) return fg_cuda_fail(e, "axpby_2d");
            }
            for (int64_t b = 0; b < g->batch; b++) {
                one.a.data = (char *)g->a.data + b * g->a.bs * (int64_t)es;
                one.b.data = (char *)g->b.data + b * g->b.bs * (int64_t)es;
                one.beta = (b == 0 && !low) ? g->beta : 1.0;
                c = lt_describe(&one, ct, cbuf, ldc, 0, true);
                FG_TRY(lt_matmul(ctx, &c, true, &found, NULL, NULL, 0, ws, limit));
                if (!found) return fg_fail(FG_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for this batch sum");
            }
            if (low) {
                e = axpby_2d<float, T>(s, cbuf, ldc, g->c.data, g->c.rs, g->m, g->n, 1.0, NULL, 0, 0);
                if (e != cudaSuccess) return fg_cuda_fail(e, "axpby_2d");
            }
            return FG_OK;
        }
        const size_t limit = do_run ? ws_bytes : LT_WORKSPACE;
        /* a bias is there when planning too (bias_operand), its pointer only when running */
        const bool has_bias = g->bias || g->bias_operand >= 0;
        const uint32_t bias_align = alignment(g->bias, 0, 0, es, do_run, g->align);
        if (g->c_f32 && (has_bias || reduce))
            return fg_fail(FG_ERR_INTERNAL, "cuda gemm: an f32 result with a bias or a batch sum");
        lt_call c = lt_describe(g, g->c_f32 ? FG_F32 : t, g->c.data, g->c.rs, g->c.bs, do_run);
        /* (cuBLASLt's heuristic is not told the bias's alignment, and an algorithm chosen for
           an aligned one can refuse a bias 2 bytes off (NOT_SUPPORTED), so a bias off 16 bytes
           is added outside the epilogue) */
        const bool column_bias = has_bias && g->bias_rs == 0 && g->bias_cs == 1 && bias_align >= 16;
        if (g->act && !g->epi.has_aux && !g->c_f32 && (!has_bias || column_bias) && g->batch == 1) {
            /* the activation in the epilogue, when cuBLASLt has it for this problem */
            lt_call ca = c;
            ca.key.epilogue = act_epilogue(g, has_bias);
            if (ca.key.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
                if (has_bias) ca.key.align_bias = bias_align;
                ca.bias = g->bias;
                FG_TRY(lt_matmul(ctx, &ca, do_run, &found, &need, info->name, sizeof info->name, ws, limit));
                if (found) { /* planned, or ran */
                    info->workspace_bytes = need;
                    info->act_fused = true;
                    return FG_OK;
                }
            }
        }
        bool fused_bias = false;
        if (column_bias) { /* try the bias epilogue first */
            lt_call cb = c;
            cb.key.epilogue = CUBLASLT_EPILOGUE_BIAS;
            cb.key.align_bias = bias_align;
            cb.bias = g->bias;
            FG_TRY(lt_matmul(ctx, &cb, false, &found, &need, info->name, sizeof info->name, ws, limit));
            if (found) {
                c = cb;
                fused_bias = true;
            }
        }
        if (!fused_bias) {
            FG_TRY(lt_matmul(ctx, &c, false, &found, &need, info->name, sizeof info->name, ws, limit));
            if (!found)
                return fg_fail(FG_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for this %s product (m=%lld n=%lld k=%lld)",
                               fg_dtype_name(t), (long long)g->m, (long long)g->n, (long long)g->k);
            if (has_bias) strncat(info->name, " after axpby_2d bias", sizeof info->name - strlen(info->name) - 1);
        }
        info->workspace_bytes = need;
        if (!do_run) return FG_OK;
        if (g->bias && !fused_bias) { /* c = beta·c + bias, then the product adds into it */
            for (int64_t b = 0; b < g->batch; b++) {
                char *cp = (char *)g->c.data + b * g->c.bs * (int64_t)es;
                e = axpby_2d<T, T>(s, cp, g->c.rs, cp, g->c.rs, g->m, g->n, g->beta, g->bias, g->bias_rs, g->bias_cs);
                if (e != cudaSuccess) return fg_cuda_fail(e, "axpby_2d");
            }
            c.beta = 1.0;
        }
        return lt_matmul(ctx, &c, true, &found, NULL, NULL, 0, ws, limit);
    }
};

/* ------------------------------------------------------------------ the own sm_90a GEMM */

/* Which of the own GEMM's operand layouts a normalized problem has (all row-major, c [m, n]):
 * a [m, k] and b = wᵀ of w [n, k] (FORWARD: the layer's product, bias and activation in the
 * epilogue); a [m, k], b [k, n] (INPUT); a = gᵀ of g [k, m], b [k, n] (WEIGHT). CAST: none. */
static fg_act_step own_layout(const fg_gemm *g) {
    const bool a_rows = g->a.cs == 1 && g->a.rs == g->k, a_cols = g->a.rs == 1 && g->a.cs == g->m;
    const bool b_rows = g->b.cs == 1 && g->b.rs == g->n, b_cols = g->b.rs == 1 && g->b.cs == g->k;
    if (a_rows && b_cols) return FG_ACT_STEP_GEMM_FORWARD;
    if (a_rows && b_rows) return FG_ACT_STEP_GEMM_INPUT;
    if (a_cols && b_rows) return FG_ACT_STEP_GEMM_WEIGHT;
    return FG_ACT_STEP_CAST;
}

static bool ptr16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* Whether the own sm_90a GEMM (src/cuda/linear_act_gemm.cu) takes the problem, and as which step.
 * It is the one kernel with the epilogues cuBLASLt lacks (an activation other than relu, pre or
 * its slope kept, a formed operand with its column sums): those take it where it fits (a full
 * wave of 128 × 256 tiles, 6e9 multiply-adds, 16-byte aligned). A plain written f16 / bf16
 * product of its INPUT or WEIGHT layout takes it only for a long reduction (k ≥ 16384): its
 * fixed cost per tile is paid back there, while at k = 4096 / 8192 cuBLASLt is 3% / 1.5% faster
 * (docs/decisions.md). */
static bool own_takes(fg_context *ctx, const fg_gemm *g, bool run, fg_act_step *step) {
    if (g->dtype != FG_F16 && g->dtype != FG_BF16) return false;
    if (g->batch != 1 || g->alpha != 1.0 || g->beta != 0.0 || g->c_f32) return false;
    if (g->c.cs != 1 || g->c.rs != g->n || (g->align && g->align < 16)) return false;
    fg_act_step s = own_layout(g);
    if (s == FG_ACT_STEP_CAST) return false;
    const bool bias = g->bias || g->bias_operand >= 0;
    if (bias && (s != FG_ACT_STEP_GEMM_FORWARD || g->bias_rs != 0 || g->bias_cs != 1)) return false;
    /* a plain layer product, and relu without pre (its epilogue costs cuBLASLt nothing): cuBLASLt */
    if (s == FG_ACT_STEP_GEMM_FORWARD && (!g->act || (g->act == FG_ACT_RELU && !g->epi.has_aux))) return false;
    if ((g->act || g->epi.has_aux) && s != FG_ACT_STEP_GEMM_FORWARD) return false;
    if (g->epi.slope && !g->act) return false; /* (none's slope is 1: nothing to keep) */
    if (g->epi.col_sums && !g->epi.form) return false;
    if (g->epi.form) {
        if (s != FG_ACT_STEP_GEMM_INPUT || !fg_cuda_act_form_takes(g->epi.form)) return false;
        s = FG_ACT_STEP_GEMM_INPUT_FORM;
    } else if (s != FG_ACT_STEP_GEMM_FORWARD && g->k < 16384) {
        return false; /* a plain product with a short reduction: cuBLASLt */
    }
    if (run && !(ptr16(g->a.data) && ptr16(g->b.data) && ptr16(g->c.data) && (!g->epi.has_aux || ptr16(g->epi.aux)) &&
                 (!g->epi.form || (ptr16(g->epi.dy) && ptr16(g->epi.pre)))))
        return false;
    if (!fg_cuda_act_gemm_fits(ctx->device, g->dtype, s, g->m, g->k, g->n)) return false;
    *step = s;
    return true;
}

static fg_status own_gemm(fg_context *ctx, const fg_gemm *g, fg_act_step step, fg_kernel_info *info, void *ws,
                          size_t ws_bytes, bool run) {
    const bool form = step == FG_ACT_STEP_GEMM_INPUT_FORM, fwd = step == FG_ACT_STEP_GEMM_FORWARD;
    fg_act_step_label(info->name, sizeof info->name, step, fwd ? g->act : form ? g->epi.form : FG_ACT_NONE, g->dtype);
    info->act_fused = fwd;
    info->formed = form;
    info->workspace_bytes = form ? fg_cuda_act_form_scratch(g->m, g->k, g->epi.col_sums) : 0;
    if (!run) return FG_OK;
    if (ws_bytes < info->workspace_bytes) return fg_fail(FG_ERR_INTERNAL, "cuda gemm: the own GEMM's workspace is short");
    fg_act_call c;
    memset(&c, 0, sizeof c);
    c.step = step;
    c.act = fwd ? g->act : form ? g->epi.form : FG_ACT_NONE;
    c.dtype = g->dtype;
    c.acc = FG_F32;
    c.rows = g->m, c.k = g->k, c.cols = g->n;
    if (fwd) {
        c.x = g->a.data, c.w = g->b.data, c.b = g->bias, c.y = g->c.data;
        c.pre = g->epi.has_aux ? g->epi.aux : NULL;
        c.slope_out = g->epi.slope;
    } else if (step == FG_ACT_STEP_GEMM_WEIGHT) {
        c.g = g->a.data, c.x = g->b.data, c.dw = g->c.data;
    } else {
        c.g = g->a.data, c.w = g->b.data, c.dx = g->c.data;
        if (form) {
            c.dy = g->epi.dy, c.pre = g->epi.pre;
            c.db_acc = g->epi.col_sums ? g->epi.sums : NULL;
            c.first = g->epi.sums_first;
            c.scratch = ws, c.scratch_bytes = ws_bytes;
        }
    }
    return fg_cuda_act_gemm(ctx, &c);
}

extern "C" fg_status fg_cuda_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                                  size_t ws_bytes, bool run) {
    fg_device_guard guard(ctx->device);
    fg_act_step own;
    if (own_takes(ctx, g, run, &own)) return own_gemm(ctx, g, own, info, ws, ws_bytes, run);
    if (g->epi.form) { /* no kernel here forms the operand: planning says so; running it is a bug */
        if (run) return fg_fail(FG_ERR_INTERNAL, "cuda gemm: asked to form an operand no kernel here forms");
        snprintf(info->name, sizeof info->name, "(no operand forming)");
        return FG_OK;
    }
    const bool ones = g->a.operand == FG_OPERAND_ONES || g->b.operand == FG_OPERAND_ONES;
    const bool vector = g->batch == 1 && (g->m == 1 || g->n == 1) && g->k > 0;
    if ((vector && !g->c_f32) || (ones && g->k > 0)) {
        if (!vector) return fg_fail(FG_ERR_INTERNAL, "cuda gemm: a ones operand outside a vector product");
        return by_dtype<vector_product>(g->dtype, g, ctx, info, ws, ws_bytes, run);
    }
    if (skinny_takes(g)) return by_dtype<skinny_product>(g->dtype, g, ctx, info, ws, ws_bytes, run);
    if (fg_cuda_split_takes(ctx->device, g, run)) return fg_cuda_split_gemm(ctx, g, info, ws, ws_bytes, run);
    if (fg_cuda_split_wgrad_takes(ctx->device, g, run)) return fg_cuda_split_wgrad(ctx, g, info, ws, ws_bytes, run);
    return by_dtype<general_product>(g->dtype, g, ctx, info, ws, ws_bytes, run);
}

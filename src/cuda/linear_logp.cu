/*
 * linear_logp.cu — the CUDA row steps of the linear log-prob family (the step list is
 * in core/internal.h; the driver and its cuBLASLt GEMMs are in ops/linear_logp.c).
 *  STATS  one block per tile row: each thread walks 16-byte vectors keeping an online
 *         (max, Σe, Σe·L, ΣL), then a fixed-shape tree merges the threads and thread 0
 *         merges the row into its running state — one read of the tile.
 *  GRAD   a 2-D grid: each thread owns 16 bytes of columns and walks a slab of 64 rows,
 *         rewriting the tile as dz in place and keeping its columns' sums in registers;
 *         the slabs' partial sums are added in slab order (db) — one read and one write.
 *  row steps (FORWARD, CE, COEF) one thread per row; a bad target raises the context
 *         flag with an atomic max on the inverted row (the smallest row wins).
 *  COMBINE one thread per row over the vocabulary shards' parts, the shards in order.
 *  Vocabulary shards: STATS and GRAD take the tile's first global class (vstart + v0) where
 *         they compared the target with v0, so a target held by another shard matches no
 *         column; FORWARD writes the shard's parts.
 * exp runs as ex2.approx on pre-scaled logits (relative error ~2⁻²²). No floating-point
 * atomics anywhere: the same bits on every run.
 * Why row kernels over a cuBLASLt tile of logits rather than one fused GEMM + softmax: the
 * tile costs a few bytes of traffic a logit, a small part of the products' time, while the
 * products keep cuBLASLt's speed; the [N, V] logits never exist at once.
 */
#include "cuda_internal.h"
#include "elem.cuh"
#include "sums.cuh"

#include <math.h>

constexpr int THREADS = 256;
constexpr int SLAB = 64; /* GRAD rows per block */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

struct logit_fn {
    float inv_temp, softcap, inv_cap;
    __device__ __forceinline__ float operator()(float z) const {
        return softcap > 0.f ? softcap * tanhf(z * inv_cap) * inv_temp : z * inv_temp;
    }
    __device__ __forceinline__ float slope(float z) const { /* dL/dz */
        if (softcap > 0.f) {
            float t = tanhf(z * inv_cap);
            return (1.f - t * t) * inv_temp;
        }
        return inv_temp;
    }
};

__device__ __forceinline__ int64_t target_at(const void *t, bool i32, int64_t r) {
    return i32 ? (int64_t)((const int32_t *)t)[r] : ((const int64_t *)t)[r];
}

/* ------------------------------------------------------------------ STATS */

/* (m, s, a, u): max logit, Σ e^(L−m), Σ e^(L−m)·L, Σ L, with m in log2 units (m2). */
struct online {
    float m2, s, a, u;
    __device__ __forceinline__ void merge(const online &o) {
        float mn = fmaxf(m2, o.m2);
        float f0 = m2 == -INFINITY ? 0.f : ex2(m2 - mn), f1 = o.m2 == -INFINITY ? 0.f : ex2(o.m2 - mn);
        s = s * f0 + o.s * f1;
        a = a * f0 + o.a * f1;
        u += o.u;
        m2 = mn;
    }
};

template <typename T, int VEC>
__global__ void __launch_bounds__(THREADS) stats_kernel(const T *__restrict__ z, int64_t ld, int64_t r0, int64_t v0,
                                                        int64_t cols, const void *target, bool t32, logit_fn fn,
                                                        float *__restrict__ state, bool first) {
    const int64_t i = blockIdx.x;
    const T *row = z + i * ld;
    online o = {-INFINITY, 0.f, 0.f, 0.f};
    auto add = [&](const float *L, int n) {
        float lm = -INFINITY;
        for (int k = 0; k < n; k++) lm = fmaxf(lm, L[k] * LOG2E);
        if (lm > o.m2) {
            float f = o.m2 == -INFINITY ? 0.f : ex2(o.m2 - lm);
            o.s *= f;
            o.a *= f;
            o.m2 = lm;
        }
        for (int k = 0; k < n; k++) {
            float e = o.m2 == -INFINITY ? 0.f : ex2(fmaf(L[k], LOG2E, -o.m2));
            o.s += e;
            o.a = fmaf(e, L[k], o.a);
            o.u += L[k];
            if (L[k] != L[k]) o.s = L[k]; /* NaN in, NaN out */
        }
    };
    const int64_t nvec = cols / VEC;
    for (int64_t j = threadIdx.x; j < nvec; j += THREADS) {
        vec_t<T, VEC> v = load_vec<T, VEC>(row + j * VEC);
        float L[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) L[k] = fn(to_acc(v.v[k]));
        add(L, VEC);
    }
    for (int64_t j = nvec * VEC + threadIdx.x; j < cols; j += THREADS) {
        float L = fn(to_acc(row[j]));
        add(&L, 1);
    }
    /* fixed-shape merge: warp tree, then the warps in order */
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        online p = {__shfl_xor_sync(~0u, o.m2, off), __shfl_xor_sync(~0u, o.s, off), __shfl_xor_sync(~0u, o.a, off),
                    __shfl_xor_sync(~0u, o.u, off)};
        if ((threadIdx.x & off) == 0) o.merge(p);
        else {
            p.merge(o);
            o = p;
        }
    }
    __shared__ online warp_part[THREADS / 32];
    if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x / 32] = o;
    __syncthreads();
    if (threadIdx.x != 0) return;
    o = warp_part[0];
    for (int w = 1; w < THREADS / 32; w++) o.merge(warp_part[w]);
    const int64_t r = r0 + i;
    float *st = state + 5 * r;
    float zt = NAN;
    const int64_t t = target_at(target, t32, r);
    if (t >= v0 && t < v0 + cols) zt = fn(to_acc(row[t - v0]));
    float m = o.m2 * LN2;
    if (!first) {
        online prev = {st[0] * LOG2E, st[1], st[3], st[4]};
        prev.merge(o);
        o = prev;
        m = o.m2 * LN2;
        if (zt != zt) zt = st[2];
    }
    st[0] = m;
    st[1] = o.s;
    st[2] = zt;
    st[3] = o.a;
    st[4] = o.u;
}

/* ------------------------------------------------------------------ row steps */

struct row_args {
    int step;
    int64_t r0, rows, V;
    const void *target;
    bool t32, use_ignore;
    int64_t ignore;
    const float *state, *scale, *lse_in, *ent_in, *dlogp, *dent, *dlse, *row_weight;
    float *logp, *lse, *ent, *loss_rows, *rc;
    float eps, zloss;
    unsigned long long *flag;
    bool shard;
    int64_t vstart, vslice;
};

__global__ void rows_kernel(row_args a) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= a.rows) return;
    const int64_t r = a.r0 + i;
    const int64_t t = target_at(a.target, a.t32, r);
    const int kind = (a.use_ignore && t == a.ignore) ? 1 : (t < 0 || t >= a.V) ? 2 : 0;
    if (kind == 2) {
        atomicCAS(a.flag, 0ull, FG_FLAG_BAD_TARGET);
        atomicMax(a.flag + 1, ~(unsigned long long)r);
    }
    float *rc = a.rc ? a.rc + 6 * r : nullptr;
    if (a.step == FG_LOGP_COEF) {
        float A = 0, B = 0, C = 0, lse = 0, H = 0;
        if (kind == 2) {
            A = B = C = lse = H = NAN;
        } else if (kind == 0) {
            float dl = a.dlogp ? a.dlogp[r] : 0.f;
            A = dl;
            B = (a.dlse ? a.dlse[r] : 0.f) - dl;
            C = a.dent ? -a.dent[r] : 0.f;
            lse = a.lse_in[r];
            H = a.ent_in ? a.ent_in[r] : 0.f;
        }
        rc[0] = A, rc[1] = B, rc[2] = C, rc[3] = 0.f, rc[4] = lse, rc[5] = H;
        return;
    }
    const float *st = a.state + 5 * r;
    float lse = st[0] + logf(st[1]);
    float logp = st[2] - lse, ent = lse - st[3] / st[1];
    if (kind == 1) lse = logp = ent = 0.f;
    if (kind == 2) lse = logp = ent = NAN;
    if (a.step == FG_LOGP_FORWARD) {
        if (a.shard && kind == 0) logp = t >= a.vstart && t - a.vstart < a.vslice ? st[2] : 0.f; /* the parts */
        if (a.logp) a.logp[r] = logp;
        if (a.lse) a.lse[r] = lse;
        if (a.ent) a.ent[r] = ent;
        return;
    }
    const float w = a.row_weight ? a.row_weight[r] : 1.f, scale = a.scale[0];
    float loss = 0.f, A = 0, B = 0, E = 0, L = 0;
    if (kind != 1) {
        float mean_logp = st[4] / (float)a.V - lse;
        loss = w * (-(1.f - a.eps) * logp - a.eps * mean_logp + a.zloss * lse * lse);
        float ws = w * scale;
        A = -(1.f - a.eps) * ws;
        B = ws * (1.f + 2.f * a.zloss * lse);
        E = -a.eps * ws / (float)a.V;
        L = lse;
        if (kind == 2) A = B = E = L = NAN;
    }
    if (a.loss_rows) a.loss_rows[r] = loss;
    if (a.lse) a.lse[r] = lse;
    rc[0] = A, rc[1] = B, rc[2] = 0.f, rc[3] = E, rc[4] = L, rc[5] = 0.f;
}

/* one block: counts the rows not ignored (COUNT) or sums the row losses (REDUCE) */
__global__ void __launch_bounds__(1024) single_block_kernel(int step, int64_t N, int64_t V, const void *target, bool t32,
                                                            bool use_ignore, int64_t ignore, bool mean, float grad_scale,
                                                            float *scale, const float *loss_rows, float *loss_out) {
    __shared__ double part[1024];
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
        if (step == FG_LOGP_COUNT) {
            int64_t t = target_at(target, t32, r);
            acc += (use_ignore && t == ignore) ? 0.0 : 1.0;
        } else {
            acc += loss_rows[r];
        }
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    if (step == FG_LOGP_COUNT) {
        double inv = mean ? 1.0 / (part[0] > 0 ? part[0] : 1.0) : 1.0;
        scale[0] = (float)(grad_scale * inv);
        scale[1] = (float)inv;
    } else {
        loss_out[0] = (float)(part[0] * scale[1]);
    }
}

/* ------------------------------------------------------------------ GRAD */

template <typename T, int VEC>
__global__ void __launch_bounds__(THREADS) grad_kernel(T *__restrict__ z, int64_t ld, int64_t r0, int64_t rows,
                                                       int64_t v0, int64_t cols, const void *target, bool t32,
                                                       logit_fn fn, const float *__restrict__ rcs,
                                                       float *__restrict__ part) {
    const int64_t c0 = ((int64_t)blockIdx.x * THREADS + threadIdx.x) * VEC;
    const int64_t i0 = (int64_t)blockIdx.y * SLAB, i1 = i0 + SLAB < rows ? i0 + SLAB : rows;
    float sum[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) sum[k] = 0.f;
    if (c0 < cols) {
        const bool full = c0 + VEC <= cols;
        for (int64_t i = i0; i < i1; i++) {
            const int64_t r = r0 + i;
            const float *rc = rcs + 6 * r;
            const float A = rc[0], B = rc[1], C = rc[2], E = rc[3], lse = rc[4], H = rc[5];
            const bool zero = A == 0.f && B == 0.f && C == 0.f && E == 0.f;
            const int64_t t = target_at(target, t32, r) - v0 - c0;
            T *p = z + i * ld + c0;
            vec_t<T, VEC> v;
            if (full) v = load_vec<T, VEC>(p);
            else
                for (int k = 0; k < VEC; k++) v.v[k] = c0 + k < cols ? p[k] : T(0.f);
            const float lse2 = lse * LOG2E;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                float dz = 0.f;
                if (!zero) {
                    float zz = to_acc(v.v[k]);
                    float L = fn(zz);
                    float pr = ex2(fmaf(L, LOG2E, -lse2));
                    float dL = (k == t ? A : 0.f) + B * pr + C * pr * (L - lse + H) + E;
                    dz = dL * fn.slope(zz);
                }
                sum[k] += dz;
                v.v[k] = from_acc<T>(dz);
            }
            if (full) store_vec<T, VEC>(p, v);
            else
                for (int k = 0; k < VEC; k++)
                    if (c0 + k < cols) p[k] = v.v[k];
        }
    }
    if (!part || c0 >= cols) return;
    float *out = part + blockIdx.y * cols + c0;
    for (int k = 0; k < VEC; k++)
        if (c0 + k < cols) out[k] = sum[k];
}



/* ------------------------------------------------------------------ COMBINE */

template <typename A>
__global__ void combine_kernel(int64_t N, int64_t R, int64_t RT, const void *target, bool t32, bool use_ignore,
                               int64_t ignore, const A *__restrict__ lse_parts, const A *__restrict__ tl_parts,
                               const A *__restrict__ ent_parts, A *logp_out, A *lse_out, A *ent_out) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= N) return;
    A lse = 0, logp = 0, ent = 0;
    if (!(use_ignore && target_at(target, t32, r) == ignore)) {
        A m = -INFINITY, s = 0, tl = 0, el = 0;
        for (int64_t k = 0; k < R; k++) {
            const A l = lse_parts[k * N + r];
            if (l > m || l != l) m = l;
        }
        const A mm = m == -INFINITY ? A(0) : m;
        for (int64_t k = 0; k < R; k++) s += exp(lse_parts[k * N + r] - mm);
        lse = m != m ? m : mm + log(s);
        for (int64_t k = 0; k < RT; k++) tl += tl_parts[k * N + r];
        logp = tl - lse;
        if (ent_parts) {
            for (int64_t k = 0; k < R; k++) {
                const A l = lse_parts[k * N + r], q = exp(l - lse);
                if (q != A(0)) el += q * (l - ent_parts[k * N + r]);
            }
            ent = lse - el;
        }
    }
    if (logp_out) logp_out[r] = logp;
    if (lse_out) lse_out[r] = lse;
    if (ent_out) ent_out[r] = ent;
}

/* ------------------------------------------------------------------ dispatch */

extern "C" size_t fg_cuda_logp_scratch(int64_t rows, int64_t cols) {
    return (size_t)cdiv(rows > 0 ? rows : 1, SLAB) * (size_t)cols * sizeof(float);
}

template <typename T> static bool vec_ok(const fg_logp_call *c) {
    return (uintptr_t)c->z % 16 == 0 && (c->ld * (int64_t)sizeof(T)) % 16 == 0;
}

template <typename T> static cudaError_t tile_step(const fg_logp_call *c, cudaStream_t s, logit_fn fn) {
    constexpr int VEC = 16 / sizeof(T);
    const bool t32 = c->target_dtype == FG_I32;
    const bool vec = vec_ok<T>(c);
    const int64_t t0 = c->vstart + c->v0; /* the tile's first global class: only targets compare with it */
    if (c->step == FG_LOGP_STATS) {
        if (vec)
            stats_kernel<T, VEC><<<(unsigned)c->rows, THREADS, 0, s>>>((const T *)c->z, c->ld, c->r0, t0, c->cols,
                                                                       c->target, t32, fn, (float *)c->state, c->first);
        else
            stats_kernel<T, 1><<<(unsigned)c->rows, THREADS, 0, s>>>((const T *)c->z, c->ld, c->r0, t0, c->cols,
                                                                     c->target, t32, fn, (float *)c->state, c->first);
        return cudaGetLastError();
    }
    const int slabs = (int)cdiv(c->rows, SLAB);
    float *part = c->db_acc ? (float *)c->scratch : nullptr;
    if (vec) {
        dim3 grid((unsigned)cdiv(c->cols, (int64_t)THREADS * VEC), (unsigned)slabs);
        grad_kernel<T, VEC><<<grid, THREADS, 0, s>>>((T *)c->z, c->ld, c->r0, c->rows, t0, c->cols, c->target, t32,
                                                     fn, (const float *)c->rc, part);
    } else {
        dim3 grid((unsigned)cdiv(c->cols, (int64_t)THREADS), (unsigned)slabs);
        grad_kernel<T, 1><<<grid, THREADS, 0, s>>>((T *)c->z, c->ld, c->r0, c->rows, t0, c->cols, c->target, t32,
                                                   fn, (const float *)c->rc, part);
    }
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && part) e = slab_colsum(part, slabs, c->cols, (float *)c->db_acc + c->v0, c->first, s);
    return e;
}

template <typename T> static cudaError_t cast(const fg_logp_call *c, cudaStream_t s) {
    unsigned blocks = (unsigned)(cdiv(c->n, 256) < 65536 ? cdiv(c->n, 256) : 65536);
    cast_sum_kernel<T><<<blocks, 256, 0, s>>>((const float *)c->src, (T *)c->dst, c->n, 1, c->accumulate);
    return cudaGetLastError();
}

extern "C" fg_status fg_cuda_logp(fg_context *ctx, const fg_logp_call *c) {
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    if (c->step == FG_LOGP_COMBINE) { /* f32 parts (f64 problems run on the CPU) */
        fg_record_kernel(ctx, "logp_combine");
        if (c->rows == 0) return FG_OK;
        if (c->acc != FG_F32) return fg_fail(FG_ERR_UNSUPPORTED, "cuda linear_logp: f64 runs on the CPU backend");
        combine_kernel<float><<<(unsigned)cdiv(c->rows, 256), 256, 0, s>>>(
            c->N, c->nparts, c->t_parts, c->target, c->target_dtype == FG_I32, c->use_ignore, c->ignore_index,
            (const float *)c->lse_parts, (const float *)c->tlogit_parts, (const float *)c->entropy_parts,
            (float *)c->logp, (float *)c->lse, (float *)c->entropy);
        cudaError_t ce = cudaGetLastError();
        return ce == cudaSuccess ? FG_OK : fg_cuda_fail(ce, "linear_logp_shard_combine");
    }
    if (c->acc != FG_F32) return fg_fail(FG_ERR_UNSUPPORTED, "cuda linear_logp: f64 runs on the CPU backend");
    logit_fn fn = {(float)c->inv_temp, (float)c->softcap, c->softcap > 0 ? (float)(1.0 / c->softcap) : 0.f};
    const bool t32 = c->target_dtype == FG_I32;
    cudaError_t e = cudaSuccess;
    switch (c->step) {
    case FG_LOGP_STATS:
    case FG_LOGP_GRAD:
        if (c->rows == 0 || c->cols == 0) return FG_OK;
        if (c->rows > INT32_MAX) return fg_fail(FG_ERR_UNSUPPORTED, "cuda linear_logp: a tile of more than 2^31 rows");
        switch (c->dtype) {
        case FG_F32: e = tile_step<float>(c, s, fn); break;
        case FG_F16: e = tile_step<__half>(c, s, fn); break;
        case FG_BF16: e = tile_step<__nv_bfloat16>(c, s, fn); break;
        default: return fg_fail(FG_ERR_UNSUPPORTED, "cuda linear_logp: dtype %s", fg_dtype_name(c->dtype));
        }
        break;
    case FG_LOGP_FORWARD:
    case FG_LOGP_CE:
    case FG_LOGP_COEF: {
        if (c->rows == 0) return FG_OK;
        row_args a = {(int)c->step, c->r0, c->rows, c->V, c->target, t32, c->use_ignore, c->ignore_index,
                      (const float *)c->state, (const float *)c->scale, (const float *)c->lse_in,
                      (const float *)c->entropy_in, (const float *)c->dlogp, (const float *)c->dentropy,
                      (const float *)c->dlse, (const float *)c->row_weight, (float *)c->logp, (float *)c->lse,
                      (float *)c->entropy, (float *)c->loss_rows, (float *)c->rc, (float)c->label_smoothing,
                      (float)c->z_loss, ctx->cuda->flag, c->shard, c->vstart, c->vslice};
        rows_kernel<<<(unsigned)cdiv(c->rows, 256), 256, 0, s>>>(a);
        e = cudaGetLastError();
        break;
    }
    case FG_LOGP_COUNT:
    case FG_LOGP_REDUCE:
        single_block_kernel<<<1, 1024, 0, s>>>((int)c->step, c->N, c->V, c->target, t32, c->use_ignore,
                                               c->ignore_index, c->reduction == FG_REDUCTION_MEAN,
                                               (float)c->grad_scale, (float *)c->scale, (const float *)c->loss_rows,
                                               (float *)c->loss_out);
        e = cudaGetLastError();
        break;
    case FG_LOGP_COMBINE: break; /* above */
    case FG_LOGP_CAST:
        if (c->n == 0) return FG_OK;
        switch (c->dst_dtype) {
        case FG_F32: e = cast<float>(c, s); break;
        case FG_F16: e = cast<__half>(c, s); break;
        case FG_BF16: e = cast<__nv_bfloat16>(c, s); break;
        default: return fg_fail(FG_ERR_UNSUPPORTED, "cuda linear_logp: cast to %s", fg_dtype_name(c->dst_dtype));
        }
        break;
    }
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_logp");
}

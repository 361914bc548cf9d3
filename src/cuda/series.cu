/*
 * series.cu — the CUDA backend of the series family (src/ops/series.c): patching, the
 * overlap-add backward, and the regression losses, for f32, f16 and bf16 (f64 runs on the CPU).
 *   patch    one thread an output element: a copy of the bits of x[r, min(p·stride + j, L − 1)]
 *   unpatch  one thread a step of a row: the contributors summed in the CPU backend's order
 *            (the patches in order of p, then the padded positions for the last step), so the
 *            two backends give the same bits for f32
 *   windows  one thread an output element: a copy, or NaN and the context's flag for a bad start
 *   loss     one block a chunk of FG_SERIES_CHUNK elements: ℓ and the gradient per element,
 *            the chunk's sum by a fixed tree in shared memory into partials[chunk]; the finish
 *            adds the partials in order in f64 on one thread (a few thousand at most for any
 *            loss a forecaster computes)
 * Why so plain: these are memory-bound passes of a few hundred thousand elements per step of
 * PatchTST, next to its products; no atomics anywhere, so every run gives the same bits.
 */
#include "cuda_internal.h"
#include "elem.cuh"

#include <math.h>
#include <stdio.h>
#include <string.h>

namespace {

constexpr int THREADS = 256;

struct series_view {
    int lead_rank;
    int64_t lead_shape[FG_MAX_RANK], lead_stride[FG_MAX_RANK];
    int64_t t_stride, rows, L, P, S, stride;
};

__device__ __forceinline__ int64_t row_offset(const series_view &v, int64_t r) {
    int64_t off = 0;
    for (int d = v.lead_rank - 1; d >= 0; d--) {
        const int64_t n = v.lead_shape[d];
        off += (r % n) * v.lead_stride[d];
        r /= n;
    }
    return off;
}

template <typename T>
__global__ void __launch_bounds__(THREADS) patch_kernel(const __grid_constant__ series_view v, const T *x, T *y) {
    const int64_t per_row = v.P * v.S, total = v.rows * per_row;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS) {
        const int64_t r = i / per_row, e = i - r * per_row, p = e / v.S, j = e - p * v.S;
        int64_t q = p * v.stride + j;
        if (q > v.L - 1) q = v.L - 1;
        y[i] = x[row_offset(v, r) + q * v.t_stride];
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) unpatch_kernel(const __grid_constant__ series_view v, const T *dy, T *dx,
                                                          bool accumulate) {
    const int64_t total = v.rows * v.L, L = v.L, P = v.P, S = v.S, st = v.stride;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS) {
        const int64_t r = i / L, t = i - r * L;
        const T *row = dy + r * P * S;
        float s = 0;
        int64_t p_lo = t >= S ? (t - S) / st + 1 : 0, p_hi = t / st;
        if (p_hi > P - 1) p_hi = P - 1;
        for (int64_t p = p_lo; p <= p_hi; p++) s += to_acc(row[p * S + (t - p * st)]);
        if (t == L - 1)
            for (int64_t p = 0; p < P; p++)
                for (int64_t j = L - p * st > 0 ? L - p * st : 0; j < S; j++) s += to_acc(row[p * S + j]);
        T *o = dx + row_offset(v, r) + t * v.t_stride;
        if (accumulate) s += to_acc(*o);
        *o = from_acc<T>(s);
    }
}

struct loss_args {
    int kind, reduction;
    float delta, grad_scale;
    int64_t n;
    bool want_dpred, accumulate;
};

/* ℓ and ∂ℓ/∂pred of one element, in f32 (the CPU backend's math, rounded the same way). */
__device__ __forceinline__ float point_loss(int kind, float delta, float d, float *g) {
    const float a = fabsf(d), sg = d > 0.f ? 1.f : d < 0.f ? -1.f : (d == d ? 0.f : d);
    if (kind == FG_LOSS_MAE) {
        *g = sg;
        return a;
    }
    if (kind == FG_LOSS_HUBER) {
        if (a <= delta) {
            *g = d;
            return (float)(0.5 * (double)d * (double)d);
        }
        *g = a == a ? delta * sg : d;
        return (float)((double)delta * ((double)a - 0.5 * (double)delta));
    }
    *g = 2.f * d;
    return (float)((double)d * (double)d);
}

template <typename T, typename G>
__global__ void __launch_bounds__(THREADS) loss_kernel(const __grid_constant__ loss_args a, const T *pred,
                                                       const T *target, float *loss, G *dpred, float *partials) {
    __shared__ float sums[THREADS];
    const int64_t lo = (int64_t)blockIdx.x * FG_SERIES_CHUNK;
    const int64_t hi = lo + FG_SERIES_CHUNK < a.n ? lo + FG_SERIES_CHUNK : a.n;
    float s = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += THREADS) {
        const float d = to_acc(pred[i]) - to_acc(target[i]);
        float g;
        const float l = point_loss(a.kind, a.delta, d, &g);
        if (a.reduction == FG_REDUCTION_NONE) loss[i] = l;
        else s += l;
        if (a.want_dpred) {
            float v = g * a.grad_scale;
            if (a.accumulate) v += to_acc(dpred[i]);
            dpred[i] = from_acc<G>(v);
        }
    }
    if (a.reduction == FG_REDUCTION_NONE) return;
    sums[threadIdx.x] = s;
    __syncthreads();
    for (int w = THREADS / 2; w > 0; w /= 2) { /* a fixed tree: the same bits every run */
        if (threadIdx.x < w) sums[threadIdx.x] += sums[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

__global__ void loss_finish_kernel(const float *partials, int64_t chunks, double scale, bool nan, float *loss) {
    double s = 0;
    for (int64_t k = 0; k < chunks; k++) s += (double)partials[k];
    *loss = nan ? __int_as_float(0x7fc00000) : (float)(s * scale);
}

struct windows_args {
    int64_t B, W, C, T, rs, cs;
    bool s32;
};

/* One thread an output element: a copy of the series' bits, or NaN for a bad start (and the flag). */
template <typename T>
__global__ void __launch_bounds__(THREADS) windows_kernel(const __grid_constant__ windows_args a, const T *x,
                                                          const void *starts, T *y, unsigned long long *flag) {
    const int64_t per = a.W * a.C, total = a.B * per;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS) {
        const int64_t b = i / per, e = i - b * per, t = e / a.C, c = e - t * a.C;
        const int64_t s = a.s32 ? ((const int32_t *)starts)[b] : ((const int64_t *)starts)[b];
        if (s < 0 || s > a.T - a.W) {
            y[i] = from_acc<T>(__int_as_float(0x7fc00000));
            if (e == 0) {
                atomicCAS(flag, 0ull, FG_FLAG_BAD_START);
                atomicMax(flag + 1, ~(unsigned long long)b);
            }
            continue;
        }
        y[i] = x[(s + t) * a.rs + c * a.cs];
    }
}

int grid_for(int64_t work) {
    const int64_t blocks = (work + THREADS - 1) / THREADS;
    return (int)(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

template <typename T> fg_status run_typed(fg_series_call *c, cudaStream_t st, unsigned long long *flag) {
    series_view v;
    memset(&v, 0, sizeof v);
    v.lead_rank = c->lead_rank;
    for (int d = 0; d < c->lead_rank; d++) v.lead_shape[d] = c->lead_shape[d], v.lead_stride[d] = c->lead_stride[d];
    v.t_stride = c->t_stride, v.rows = c->rows, v.L = c->L, v.P = c->P, v.S = c->S, v.stride = c->stride;
    switch (c->step) {
    case FG_SERIES_PATCH:
        patch_kernel<T><<<grid_for(c->rows * c->P * c->S), THREADS, 0, st>>>(v, (const T *)c->src, (T *)c->dst);
        break;
    case FG_SERIES_UNPATCH:
        unpatch_kernel<T><<<grid_for(c->rows * c->L), THREADS, 0, st>>>(v, (const T *)c->src, (T *)c->dst,
                                                                      c->accumulate);
        break;
    case FG_SERIES_LOSS: {
        if (c->chunks == 0) break;
        if (c->chunks > INT32_MAX) return fg_fail(FG_ERR_UNSUPPORTED, "regression_loss: more than 2^31 chunks");
        loss_args a;
        a.kind = c->kind, a.reduction = c->reduction;
        a.delta = (float)c->delta, a.grad_scale = (float)c->grad_scale;
        a.n = c->n, a.want_dpred = c->want_dpred, a.accumulate = c->accumulate;
        if (c->want_dpred && c->dpred_dtype == FG_F32)
            loss_kernel<T, float><<<(unsigned)c->chunks, THREADS, 0, st>>>(
                a, (const T *)c->pred, (const T *)c->target, (float *)c->loss, (float *)c->dpred, (float *)c->partials);
        else
            loss_kernel<T, T><<<(unsigned)c->chunks, THREADS, 0, st>>>(
                a, (const T *)c->pred, (const T *)c->target, (float *)c->loss, (T *)c->dpred, (float *)c->partials);
        break;
    }
    case FG_SERIES_WINDOWS: {
        windows_args a;
        a.B = c->rows, a.W = c->W, a.C = c->C, a.T = c->T, a.rs = c->src_rs, a.cs = c->src_cs;
        a.s32 = c->starts_dtype == FG_I32;
        windows_kernel<T><<<grid_for(c->rows * c->W * c->C), THREADS, 0, st>>>(a, (const T *)c->src, c->starts,
                                                                              (T *)c->dst, flag);
        break;
    }
    case FG_SERIES_LOSS_FINISH:
        loss_finish_kernel<<<1, 1, 0, st>>>((const float *)c->partials, c->chunks, c->out_scale,
                                            c->reduction == FG_REDUCTION_MEAN && c->n == 0, (float *)c->loss);
        break;
    }
    return FG_OK;
}

} // namespace

extern "C" fg_status fg_cuda_series(fg_context *ctx, fg_series_call *c, bool run) {
    snprintf(c->name, sizeof c->name, "series_%s<%s>", fg_series_step_name(c), fg_dtype_name(c->dtype));
    if (c->dtype == FG_F64)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: the cuda backend has no f64 kernels for it (f64 runs on the CPU)",
                       fg_series_step_name(c));
    if (!run) return FG_OK;
    fg_device_guard guard(ctx->device);
    cudaStream_t st = ctx->cuda->stream;
    unsigned long long *flag = ctx->cuda->flag;
    fg_status s = c->dtype == FG_F32    ? run_typed<float>(c, st, flag)
                  : c->dtype == FG_BF16 ? run_typed<__nv_bfloat16>(c, st, flag)
                                        : run_typed<__half>(c, st, flag);
    if (s != FG_OK) return s;
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fg_cuda_fail(e, "series");
    return FG_OK;
}

/*
 * linear_act.cu — the CUDA elementwise steps of linear + activation (the step list is in
 * core/internal.h; the driver and its cuBLASLt GEMMs are in ops/linear_act.c).
 *  FORWARD  y = act(pre): 16-byte vectors, grid-stride, in place allowed
 *  GRAD     g = dy ⊙ act′(pre) on a 2-D grid: each thread owns 16 bytes of columns and
 *           walks a slab of rows (64, more past 65536 rows: at most 1024 slabs), keeping its
 *           columns' sums of g in registers for db;
 *           the slabs' partials are added in slab order (no atomics: deterministic)
 * The activation math is f32: sigmoid forms through ex2.approx (what bounds the bandwidth of
 * these passes is otherwise the SFU-free expf), erfcf / tanhf accurate, with the same
 * cancellation-free forms and guards as the CPU's f64 math in src/cpu/linear_act.c.
 */
#include "cuda_internal.h"
#include "elem.cuh"
#include "sums.cuh"

constexpr int THREADS = 256;
constexpr int64_t MAX_SLABS = 1024; /* rows per slab grow past 64 so the partials stay small */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* exp of a non-positive argument through ex2.approx (relative error ~2⁻²²; the rounding of
 * x·log2 e adds |x|·2⁻²⁴, far under the f32 tolerance where the term still matters) */
__device__ __forceinline__ float exp_neg(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

/* σ(x) and σ′(x) = σ(1 − σ) from one ex2 and one reciprocal, without the cancellation of
 * 1 − σ: with e = exp(−|x|), σ = 1/(1+e) or e/(1+e), σ′ = e/(1+e)² */
__device__ __forceinline__ void sigmoid_pair(float x, float *s, float *ds) {
    const float e = exp_neg(-fabsf(x)), inv = __frcp_rn(1.f + e);
    *s = x >= 0.f ? inv : e * inv;
    if (ds) *ds = e * inv * inv;
    if (x != x) *s = x;
}

__device__ __forceinline__ float gelu_u(float x) { return 0.7978845608f * (x + 0.044715f * x * x * x); }

__device__ __forceinline__ float act_value(int act, float x) {
    float s;
    switch (act) {
    case FG_ACT_RELU: return x > 0.f ? x : (x == x ? 0.f : x);
    case FG_ACT_GELU: return 0.5f * x * erfcf(-x * 0.70710678f);
    case FG_ACT_GELU_TANH: sigmoid_pair(2.f * gelu_u(x), &s, nullptr); return x * s;
    case FG_ACT_SILU: sigmoid_pair(x, &s, nullptr); return x * s;
    case FG_ACT_SIGMOID: sigmoid_pair(x, &s, nullptr); return s;
    case FG_ACT_TANH: return tanhf(x);
    default: return x;
    }
}

__device__ __forceinline__ float act_slope(int act, float x) {
    float s, ds;
    switch (act) {
    case FG_ACT_RELU: return x > 0.f ? 1.f : (x == x ? 0.f : x);
    case FG_ACT_GELU: return 0.5f * erfcf(-x * 0.70710678f) + x * 0.39894228f * exp_neg(-0.5f * x * x);
    case FG_ACT_GELU_TANH:
        if (fabsf(x) > 10.f) return x > 0.f ? 1.f : 0.f;
        sigmoid_pair(2.f * gelu_u(x), &s, &ds);
        return s + x * ds * 1.5957691216f * (1.f + 0.134145f * x * x);
    case FG_ACT_SILU: sigmoid_pair(x, &s, &ds); return s + x * ds;
    case FG_ACT_SIGMOID: sigmoid_pair(x, &s, &ds); return x == x ? ds : x;
    case FG_ACT_TANH: sigmoid_pair(2.f * x, &s, &ds); return x == x ? 4.f * ds : x; /* 1 − tanh² = 4σ′(2x) */
    default: return x == x ? 1.f : x;
    }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(THREADS) act_forward_kernel(const T *pre, T *y, int64_t n, int act) {
    const int64_t nvec = n / VEC, stride = (int64_t)gridDim.x * THREADS;
    for (int64_t v = blockIdx.x * (int64_t)THREADS + threadIdx.x; v < nvec; v += stride) {
        vec_t<T, VEC> a = load_vec<T, VEC>(pre + v * VEC);
#pragma unroll
        for (int k = 0; k < VEC; k++) a.v[k] = from_acc<T>(act_value(act, to_acc(a.v[k])));
        store_vec<T, VEC>(y + v * VEC, a);
    }
    for (int64_t i = nvec * VEC + blockIdx.x * (int64_t)THREADS + threadIdx.x; i < n; i += stride)
        y[i] = from_acc<T>(act_value(act, to_acc(pre[i])));
}

/* Each thread owns VEC columns of group `cg` lanes wide; THREADS / cg rows run side by side
 * (narrow outputs keep the block full), and the lanes of one column are summed in lane
 * order through shared memory before the slab's partial is written. */
template <typename T, int VEC>
__global__ void __launch_bounds__(THREADS) act_grad_kernel(const T *__restrict__ dy, const T *__restrict__ pre,
                                                           T *__restrict__ g, int64_t rows, int64_t cols, int act,
                                                           int64_t slab, int cg, float *__restrict__ part) {
    const int lane = threadIdx.x % cg, rpar = THREADS / cg, r = threadIdx.x / cg;
    const int64_t c0 = ((int64_t)blockIdx.x * cg + lane) * VEC;
    const int64_t i0 = (int64_t)blockIdx.y * slab, i1 = i0 + slab < rows ? i0 + slab : rows;
    float sum[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) sum[k] = 0.f;
    if (c0 < cols && r < rpar) {
        const bool full = c0 + VEC <= cols;
        for (int64_t i = i0 + r; i < i1; i += rpar) {
            const int64_t at = i * cols + c0;
            vec_t<T, VEC> a, p;
            if (full) {
                a = load_vec<T, VEC>(dy + at);
                p = load_vec<T, VEC>(pre + at);
            } else {
                for (int k = 0; k < VEC; k++) {
                    a.v[k] = c0 + k < cols ? dy[at + k] : T(0.f);
                    p.v[k] = c0 + k < cols ? pre[at + k] : T(0.f);
                }
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                float v = to_acc(a.v[k]) * act_slope(act, to_acc(p.v[k]));
                if (c0 + k < cols) sum[k] += v;
                a.v[k] = from_acc<T>(v);
            }
            if (g) {
                if (full) store_vec<T, VEC>(g + at, a);
                else
                    for (int k = 0; k < VEC; k++)
                        if (c0 + k < cols) g[at + k] = a.v[k];
            }
        }
    }
    if (!part) return;
    __shared__ float lanes[THREADS * VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) lanes[threadIdx.x * VEC + k] = sum[k];
    __syncthreads();
    if (r != 0 || c0 >= cols) return;
    for (int q = 1; q < rpar; q++)
#pragma unroll
        for (int k = 0; k < VEC; k++) sum[k] += lanes[(q * cg + lane) * VEC + k];
    float *out = part + (int64_t)blockIdx.y * cols + c0;
    for (int k = 0; k < VEC; k++)
        if (c0 + k < cols) out[k] = sum[k];
}



static int64_t slab_rows(int64_t rows) {
    int64_t per = cdiv(rows, MAX_SLABS);
    return per > 64 ? per : 64;
}

extern "C" size_t fg_cuda_act_scratch(int64_t rows, int64_t cols) {
    return (size_t)cdiv(rows > 0 ? rows : 1, slab_rows(rows)) * (size_t)cols * sizeof(float);
}

static bool aligned(const void *p) { return p == nullptr || (uintptr_t)p % 16 == 0; }

template <typename T> static cudaError_t run_step(const fg_act_call *c, cudaStream_t s) {
    constexpr int VEC = 16 / sizeof(T);
    const int64_t n = c->rows * c->cols;
    if (c->step == FG_ACT_STEP_FORWARD) {
        if (n == 0) return cudaSuccess;
        const unsigned blocks = (unsigned)(cdiv(n, (int64_t)THREADS * VEC) < 65536 ? cdiv(n, (int64_t)THREADS * VEC) : 65536);
        if (aligned(c->pre) && aligned(c->y))
            act_forward_kernel<T, VEC><<<blocks, THREADS, 0, s>>>((const T *)c->pre, (T *)c->y, n, c->act);
        else
            act_forward_kernel<T, 1><<<blocks, THREADS, 0, s>>>((const T *)c->pre, (T *)c->y, n, c->act);
        return cudaGetLastError();
    }
    if (c->step == FG_ACT_STEP_CAST) {
        if (c->cols == 0) return cudaSuccess;
        const unsigned blocks = (unsigned)(cdiv(c->cols, 256) < 65536 ? cdiv(c->cols, 256) : 65536);
        cast_sum_kernel<T><<<blocks, 256, 0, s>>>((const float *)c->src, (T *)c->dst, c->cols,
                                                  c->parts > 1 ? c->parts : 1, c->accumulate);
        return cudaGetLastError();
    }
    /* GRAD */
    if (c->db_acc && n == 0) /* no rows: db's sums are zero */
        return cudaMemsetAsync(c->db_acc, 0, (size_t)c->cols * sizeof(float), s);
    if (n == 0) return cudaSuccess;
    const int64_t slab = slab_rows(c->rows);
    const int slabs = (int)cdiv(c->rows, slab);
    float *part = c->db_acc ? (float *)c->scratch : nullptr;
    const bool vec = aligned(c->dy) && aligned(c->pre) && aligned(c->g) && (c->cols * (int64_t)sizeof(T)) % 16 == 0;
    const int v = vec ? VEC : 1;
    const int64_t groups = cdiv(c->cols, v);
    const int cg = (int)(groups < THREADS ? groups : THREADS); /* lanes across a row */
    dim3 grid((unsigned)cdiv(groups, cg), (unsigned)slabs);
    if (vec)
        act_grad_kernel<T, VEC><<<grid, THREADS, 0, s>>>((const T *)c->dy, (const T *)c->pre, (T *)c->g, c->rows,
                                                         c->cols, c->act, slab, cg, part);
    else
        act_grad_kernel<T, 1><<<grid, THREADS, 0, s>>>((const T *)c->dy, (const T *)c->pre, (T *)c->g, c->rows, c->cols,
                                                       c->act, slab, cg, part);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && part)
        slab_colsum_kernel<<<(unsigned)cdiv(c->cols, 256), 256, 0, s>>>(part, slabs, c->cols, (float *)c->db_acc,
                                                                       c->first);
    return e == cudaSuccess ? cudaGetLastError() : e;
}

extern "C" fg_status fg_cuda_act(fg_context *ctx, const fg_act_call *c) {
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    if (c->ld_pre != c->cols && c->step != FG_ACT_STEP_CAST)
        return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: a strided block");
    cudaError_t e;
    switch (c->dtype) {
    case FG_F32: e = run_step<float>(c, s); break;
    case FG_F16: e = run_step<__half>(c, s); break;
    case FG_BF16: e = run_step<__nv_bfloat16>(c, s); break;
    default: return fg_fail(FG_ERR_UNSUPPORTED, "cuda linear_act: %s runs on the CPU backend only", fg_dtype_name(c->dtype));
    }
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act");
}

/*
 * adamw.cu — the fused multi-tensor AdamW step on CUDA. One launch covers up to
 * MAX_TENSORS tensors: the tensor list travels in the kernel's parameter space, each
 * block takes one CHUNK (4096 elements) of one tensor, found by binary search over the
 * chunk counts, and each thread loads all four of its groups of four elements (16-byte
 * loads of the f32 state) before it stores any. Per element: read p (or the f32 master), g,
 * m, v; write p, m, v (and master). The moments are f32 or the params' dtype (read, updated
 * in f32, stored rounded: 14 bytes a bf16 element instead of 22).
 * Why: the step is bound by memory (28 bytes an f32 element); one launch for many tensors
 * keeps small tensors from paying a launch each, and all loads issued before any store keep
 * enough bytes in flight to run at copy bandwidth. Elementwise only: the same bits every run.
 */
#include "cuda_internal.h"
#include "elem.cuh"

#include <string.h>

constexpr int MAX_TENSORS = 320;  /* ~17 KB of kernel parameters (the limit is 32 KB) */
constexpr int GROUPS = 4;                       /* float4 groups per thread */
constexpr int64_t CHUNK = 256 * 4 * GROUPS;      /* elements per block */
constexpr int THREADS = 256;

struct adamw_list {
    void *p[MAX_TENSORS];
    const void *g[MAX_TENSORS];
    void *m[MAX_TENSORS], *v[MAX_TENSORS];
    float *master[MAX_TENSORS];
    int64_t n[MAX_TENSORS];
    int chunk_start[MAX_TENSORS + 1];
    int count;
    float decay, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, bc2_sqrt, grad_scale;
};

template <typename PT, typename GT, typename MT, bool MASTER>
__device__ __forceinline__ void update(const adamw_list &L, int t, int64_t i, float g) {
    float p = MASTER ? L.master[t][i] : to_acc(((const PT *)L.p[t])[i]);
    float m = to_acc(((const MT *)L.m[t])[i]), v = to_acc(((const MT *)L.v[t])[i]);
    p *= L.decay;
    m = fmaf(L.one_minus_beta1, g - m, m); /* lerp(m, g, 1 − β1) */
    v = fmaf(L.beta2, v, L.one_minus_beta2 * g * g);
    p -= L.step_size * m / (sqrtf(v) / L.bc2_sqrt + L.eps);
    ((MT *)L.m[t])[i] = from_acc<MT>(m);
    ((MT *)L.v[t])[i] = from_acc<MT>(v);
    if (MASTER) L.master[t][i] = p;
    ((PT *)L.p[t])[i] = from_acc<PT>(p);
}

template <typename T> struct alignas(4 * sizeof(T)) four { T v[4]; };

template <typename PT, typename GT, typename MT, bool MASTER>
__global__ void __launch_bounds__(THREADS) adamw_kernel(const __grid_constant__ adamw_list L) {
    int lo = 0, hi = L.count - 1;
    while (lo < hi) { /* the tensor whose chunks include this block */
        int mid = (lo + hi + 1) / 2;
        if (L.chunk_start[mid] <= (int)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const int t = lo;
    const int64_t begin = (int64_t)(blockIdx.x - L.chunk_start[t]) * CHUNK;
    const int64_t end = begin + CHUNK < L.n[t] ? begin + CHUNK : L.n[t];
    bool vec = ((uintptr_t)L.m[t] | (uintptr_t)L.v[t]) % (4 * sizeof(MT)) == 0 &&
               (MASTER ? (uintptr_t)L.master[t] : 0) % 16 == 0 &&
               (uintptr_t)L.p[t] % (4 * sizeof(PT)) == 0 && (uintptr_t)L.g[t] % (4 * sizeof(GT)) == 0;
    int64_t i = begin + (int64_t)threadIdx.x * 4;
    if (vec) {
        constexpr int U = GROUPS; /* all of a thread's groups loaded before any store */
        constexpr int64_t STRIDE = THREADS * 4;
        for (; i + (U - 1) * STRIDE + 4 <= end; i += U * STRIDE) {
            float4 q[U];
            four<MT> m[U], v[U];
            four<GT> g[U];
            four<PT> pp[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t k = i + u * STRIDE;
                m[u] = *(const four<MT> *)((const MT *)L.m[t] + k);
                v[u] = *(const four<MT> *)((const MT *)L.v[t] + k);
                g[u] = *(const four<GT> *)((const GT *)L.g[t] + k);
                if (MASTER) q[u] = *(const float4 *)(L.master[t] + k);
                else pp[u] = *(const four<PT> *)((const PT *)L.p[t] + k);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t k = i + u * STRIDE;
                float pf[4], mf[4], vf[4];
#pragma unroll
                for (int c = 0; c < 4; c++) mf[c] = to_acc(m[u].v[c]), vf[c] = to_acc(v[u].v[c]);
                if (MASTER) {
                    pf[0] = q[u].x, pf[1] = q[u].y, pf[2] = q[u].z, pf[3] = q[u].w;
                } else {
#pragma unroll
                    for (int c = 0; c < 4; c++) pf[c] = to_acc(pp[u].v[c]);
                }
                four<PT> out;
                four<MT> mo, vo;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    float gc = to_acc(g[u].v[c]) * L.grad_scale;
                    pf[c] *= L.decay;
                    mf[c] = fmaf(L.one_minus_beta1, gc - mf[c], mf[c]);
                    vf[c] = fmaf(L.beta2, vf[c], L.one_minus_beta2 * gc * gc);
                    pf[c] -= L.step_size * mf[c] / (sqrtf(vf[c]) / L.bc2_sqrt + L.eps);
                    out.v[c] = from_acc<PT>(pf[c]);
                    mo.v[c] = from_acc<MT>(mf[c]);
                    vo.v[c] = from_acc<MT>(vf[c]);
                }
                *(four<MT> *)((MT *)L.m[t] + k) = mo;
                *(four<MT> *)((MT *)L.v[t] + k) = vo;
                if (MASTER) *(float4 *)(L.master[t] + k) = make_float4(pf[0], pf[1], pf[2], pf[3]);
                *(four<PT> *)((PT *)L.p[t] + k) = out;
            }
        }
        /* what is left: groups of four, then single elements */
        for (; i + 4 <= end; i += STRIDE)
            for (int64_t j = i; j < i + 4; j++)
                update<PT, GT, MT, MASTER>(L, t, j, to_acc(((const GT *)L.g[t])[j]) * L.grad_scale);
        for (int64_t j = i; j < end && j < i + 4; j++)
            update<PT, GT, MT, MASTER>(L, t, j, to_acc(((const GT *)L.g[t])[j]) * L.grad_scale);
    } else {
        for (int64_t j = begin + threadIdx.x; j < end; j += THREADS)
            update<PT, GT, MT, MASTER>(L, t, j, to_acc(((const GT *)L.g[t])[j]) * L.grad_scale);
    }
}

template <typename PT, typename GT>
static cudaError_t launch(const adamw_list &L, int blocks, bool master, bool low_m, cudaStream_t s) {
    if (low_m && master) adamw_kernel<PT, GT, PT, true><<<blocks, THREADS, 0, s>>>(L);
    else if (low_m) adamw_kernel<PT, GT, PT, false><<<blocks, THREADS, 0, s>>>(L);
    else if (master) adamw_kernel<PT, GT, float, true><<<blocks, THREADS, 0, s>>>(L);
    else adamw_kernel<PT, GT, float, false><<<blocks, THREADS, 0, s>>>(L);
    return cudaGetLastError();
}

extern "C" fg_status fg_cuda_adamw(fg_context *ctx, const fg_adamw_run *r) {
    fg_device_guard guard(ctx->device);
    static_assert(sizeof(adamw_list) < 32000, "kernel parameters over the 32 KB limit");
    adamw_list *L = (adamw_list *)calloc(1, sizeof(adamw_list));
    if (!L) return fg_fail(FG_ERR_OUT_OF_MEMORY, "adamw_step: out of host memory");
    L->decay = r->decay;
    L->beta2 = r->beta2;
    L->one_minus_beta1 = r->one_minus_beta1;
    L->one_minus_beta2 = r->one_minus_beta2;
    L->eps = r->eps;
    L->step_size = r->step_size;
    L->bc2_sqrt = r->bc2_sqrt;
    L->grad_scale = r->grad_scale;
    const bool master = r->count > 0 && r->items[0].master != NULL;
    fg_status status = FG_OK;
    int t = 0;
    while (t < r->count && status == FG_OK) {
        /* one launch per MAX_TENSORS tensors (and per 2^31 chunks) */
        int c = 0, chunks = 0;
        for (; t < r->count && c < MAX_TENSORS; t++) {
            const fg_adamw_item *it = &r->items[t];
            int64_t nc = (it->n + CHUNK - 1) / CHUNK;
            if (nc == 0) continue;
            if ((int64_t)chunks + nc > INT32_MAX) break;
            L->p[c] = it->p;
            L->g[c] = it->g;
            L->m[c] = it->m;
            L->v[c] = it->v;
            L->master[c] = it->master;
            L->n[c] = it->n;
            L->chunk_start[c] = chunks;
            chunks += (int)nc;
            c++;
        }
        if (c == 0) continue;
        L->chunk_start[c] = chunks;
        L->count = c;
        cudaStream_t s = ctx->cuda->stream;
        cudaError_t e = cudaSuccess;
        const fg_dtype pt = r->p_dtype, gt = r->g_dtype;
        const bool low_m = r->m_dtype != FG_F32;
        if (pt == FG_F32) e = launch<float, float>(*L, chunks, false, false, s);
        else if (pt == FG_BF16 && gt == FG_BF16) e = launch<__nv_bfloat16, __nv_bfloat16>(*L, chunks, master, low_m, s);
        else if (pt == FG_BF16) e = launch<__nv_bfloat16, float>(*L, chunks, master, low_m, s);
        else if (gt == FG_F16) e = launch<__half, __half>(*L, chunks, master, low_m, s);
        else e = launch<__half, float>(*L, chunks, master, low_m, s);
        if (e != cudaSuccess) status = fg_cuda_fail(e, "adamw_step");
    }
    free(L);
    return status;
}

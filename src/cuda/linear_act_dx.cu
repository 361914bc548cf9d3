/*
 * linear_act_dx.cu — the backward of linear + activation from a kept pre-activation with a
 * short K (≤ 128, f16 / bf16): g = dy ⊙ act′(pre) and dx = g·w in one kernel (TILE_GRAD_DX).
 * g is still written when dw wants it (in pre's memory when the caller gives pre up), and
 * db's column sums per row tile go to slab_colsum as in the other paths.
 * Why: the pass-then-GEMM path writes g and reads it back for dx (2 × N·M elements); here g
 * goes from registers to shared memory into the tensor cores, and dx (N·K) is written once.
 * A block walks row tiles of 64 and, in each, the M columns in chunks of 64: dy's, pre's and
 * w's chunk arrive by cp.async one chunk ahead; the block forms g in shared memory and adds
 * g_chunk · w_chunk into dx's accumulators (mma.sync m16n8k16, f32), writing dx at the tile's
 * end. Sums are in a fixed order whatever the grid: deterministic.
 */
#include "act_math.cuh"
#include "cuda_internal.h"
#include "elem.cuh"
#include "mma.cuh"
#include "sums.cuh"

constexpr int DX_ROWS = 64, DX_CHUNK = 64, DX_THREADS = 256, DX_BLOCKS = 2, DX_K = 128;
constexpr int CSTR = DX_CHUNK + 8; /* dy / pre / g rows in shared memory (padding: no bank conflicts) */

struct dx_args {
    const void *dy, *pre, *w;
    void *g, *dx;
    float *part, *db; /* per-row-tile column sums [tiles, cols], or db itself (one tile) */
    int64_t rows, tiles;
    int k, cols;
    bool first, accumulate;
};

/* w's chunk rows: K rounded up to 32 (whole warp columns, zero-filled) plus 8 of padding */
static int dx_wstride(int k) { return ((k + 31) & ~31) + 8; }
static int dx_stage_elems(int k) { return 2 * DX_ROWS * CSTR + DX_CHUNK * dx_wstride(k); }
static size_t dx_smem(int k) {
    return (size_t)(2 * dx_stage_elems(k) + DX_ROWS * CSTR) * 2 + (size_t)32 * DX_CHUNK * sizeof(float);
}

/* Warps for the product: 2 (rows) × 4 (dx columns), 32 × 32 each. For the elementwise part a
 * thread takes 8 columns (v) of rows r and r + 32. */
template <typename T, int ACT>
__global__ void __launch_bounds__(DX_THREADS, DX_BLOCKS) act_dx_kernel(dx_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int kw = (a.k + 31) & ~31, wstr = kw + 8, stage = 2 * DX_ROWS * CSTR + DX_CHUNK * wstr;
    T *stages = reinterpret_cast<T *>(smem), *gs = stages + 2 * stage;
    float *red = reinterpret_cast<float *>(gs + DX_ROWS * CSTR); /* [32 row groups][DX_CHUNK] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int grp = lane >> 2, quad = lane & 3, er = tid >> 3, ev = tid & 7;
    const T *dy = static_cast<const T *>(a.dy), *pre = static_cast<const T *>(a.pre), *w = static_cast<const T *>(a.w);
    const int chunks = (a.cols + DX_CHUNK - 1) / DX_CHUNK;
    const bool sums = a.part || a.db;

    auto load = [&](int64_t tile, int chunk, int st) {
        T *dys = stages + st * stage, *pres = dys + DX_ROWS * CSTR, *ws = pres + DX_ROWS * CSTR;
        const int64_t r0 = tile * DX_ROWS;
        const int m0 = chunk * DX_CHUNK;
        for (int i = tid; i < DX_ROWS * (DX_CHUNK / 8); i += DX_THREADS) {
            const int r = i / (DX_CHUNK / 8), v = i % (DX_CHUNK / 8), col = m0 + 8 * v;
            const bool ok = r0 + r < a.rows && col < a.cols;
            const int64_t at = (r0 + r) * a.cols + col;
            copy16(smem_at(dys + r * CSTR + 8 * v), ok ? dy + at : dy, ok);
            copy16(smem_at(pres + r * CSTR + 8 * v), ok ? pre + at : pre, ok);
        }
        const int kv = kw / 8, kc = a.k / 8;
        for (int i = tid; i < DX_CHUNK * kv; i += DX_THREADS) {
            const int m = i / kv, c = i % kv;
            const bool ok = m0 + m < a.cols && c < kc;
            copy16(smem_at(ws + m * wstr + 8 * c), ok ? w + (int64_t)(m0 + m) * a.k + 8 * c : w, ok);
        }
    };

    const int64_t mine = blockIdx.x < a.tiles ? (a.tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int64_t steps = mine * chunks;
    if (steps > 0) load(blockIdx.x, 0, 0);
    copy_commit();
    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][j][e] = 0.f;

    for (int64_t s = 0; s < steps; s++) {
        const int64_t tile = blockIdx.x + (s / chunks) * (int64_t)gridDim.x;
        const int chunk = (int)(s % chunks), st = (int)(s & 1), m0 = chunk * DX_CHUNK;
        if (s + 1 < steps) load(blockIdx.x + ((s + 1) / chunks) * (int64_t)gridDim.x, (int)((s + 1) % chunks), st ^ 1);
        copy_commit();
        copy_wait<1>();
        __syncthreads();
        const T *dys = stages + st * stage, *pres = dys + DX_ROWS * CSTR, *ws = pres + DX_ROWS * CSTR;

        /* g = dy ⊙ act′(pre) into shared memory (and out, when wanted); past the last row or
           column dy and pre are zeros, so g is 0 there */
        float sum[8];
#pragma unroll
        for (int c = 0; c < 8; c++) sum[c] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = er + 32 * h, col = m0 + 8 * ev;
            const int64_t row = tile * DX_ROWS + r;
            const vec_t<T, 8> d = *reinterpret_cast<const vec_t<T, 8> *>(dys + r * CSTR + 8 * ev);
            const vec_t<T, 8> p = *reinterpret_cast<const vec_t<T, 8> *>(pres + r * CSTR + 8 * ev);
            vec_t<T, 8> o;
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const float v = to_acc(d.v[c]) * act_slope(ACT, to_acc(p.v[c]));
                sum[c] += v;
                o.v[c] = from_acc<T>(v);
            }
            *reinterpret_cast<vec_t<T, 8> *>(gs + r * CSTR + 8 * ev) = o;
            if (a.g && row < a.rows && col < a.cols) store_vec<T, 8>(static_cast<T *>(a.g) + row * a.cols + col, o);
        }
        if (sums)
#pragma unroll
            for (int c = 0; c < 8; c++) red[er * DX_CHUNK + 8 * ev + c] = sum[c];
        __syncthreads();
        if (sums && tid < DX_CHUNK && m0 + tid < a.cols) { /* the chunk's column sums, row groups in order */
            float v = 0.f;
            for (int q = 0; q < 32; q++) v += red[q * DX_CHUNK + tid];
            if (a.part) a.part[tile * a.cols + m0 + tid] = v;
            else a.db[m0 + tid] = a.first ? v : a.db[m0 + tid] + v;
        }

        if (wn * 32 < kw) { /* dx += g_chunk · w_chunk */
#pragma unroll
            for (int k0 = 0; k0 < DX_CHUNK; k0 += 16) {
                uint32_t bf[4][2];
#pragma unroll
                for (int jj = 0; jj < 2; jj++)
                    ldsm4_t(smem_at(ws + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * wstr + wn * 32 + jj * 16 +
                                    (lane >> 4) * 8),
                            bf[2 * jj][0], bf[2 * jj][1], bf[2 * jj + 1][0], bf[2 * jj + 1][1]);
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    uint32_t af[4];
                    ldsm4(smem_at(gs + (wm * 32 + mi * 16 + (lane & 15)) * CSTR + k0 + (lane >> 4) * 8), af[0], af[1],
                          af[2], af[3]);
#pragma unroll
                    for (int j = 0; j < 4; j++) mma16816<T>(acc[mi][j], af, bf[j]);
                }
            }
        }
        __syncthreads(); /* this stage, g's and the sums' shared memory are free again */

        if (chunk == chunks - 1) { /* the tile's dx, column pairs */
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int64_t row = tile * DX_ROWS + wm * 32 + mi * 16 + grp + 8 * hh;
                        const int col = wn * 32 + j * 8 + 2 * quad;
                        float v0 = acc[mi][j][2 * hh], v1 = acc[mi][j][2 * hh + 1];
                        acc[mi][j][2 * hh] = acc[mi][j][2 * hh + 1] = 0.f;
                        if (row >= a.rows || col >= a.k) continue;
                        vec_t<T, 2> *at = reinterpret_cast<vec_t<T, 2> *>(static_cast<T *>(a.dx) + row * a.k + col);
                        if (a.accumulate) {
                            const vec_t<T, 2> old = *at;
                            v0 += to_acc(old.v[0]), v1 += to_acc(old.v[1]);
                        }
                        vec_t<T, 2> o;
                        o.v[0] = from_acc<T>(v0), o.v[1] = from_acc<T>(v1);
                        *at = o;
                    }
        }
    }
    copy_wait<0>();
}

template <typename T, int ACT> static cudaError_t launch(const dx_args &a, cudaStream_t s, int device) {
    auto kernel = act_dx_kernel<T, ACT>;
    const size_t smem = dx_smem(a.k);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int sms = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    int64_t blocks = DX_BLOCKS * (int64_t)sms; /* (the sums' order does not depend on it) */
    if (blocks > a.tiles) blocks = a.tiles;
    kernel<<<(unsigned)blocks, DX_THREADS, smem, s>>>(a);
    return cudaGetLastError();
}

template <typename T> static cudaError_t launch_act(int act, const dx_args &a, cudaStream_t s, int dev) {
    switch (act) {
    case FG_ACT_RELU: return launch<T, FG_ACT_RELU>(a, s, dev);
    case FG_ACT_GELU: return launch<T, FG_ACT_GELU>(a, s, dev);
    case FG_ACT_GELU_TANH: return launch<T, FG_ACT_GELU_TANH>(a, s, dev);
    case FG_ACT_SILU: return launch<T, FG_ACT_SILU>(a, s, dev);
    case FG_ACT_SIGMOID: return launch<T, FG_ACT_SIGMOID>(a, s, dev);
    case FG_ACT_TANH: return launch<T, FG_ACT_TANH>(a, s, dev);
    default: return cudaErrorInvalidValue; /* (none: g is dy, a plain GEMM) */
    }
}

extern "C" fg_status fg_cuda_act_dx(fg_context *ctx, const fg_act_call *c) {
    if (!fg_cuda_act_tile_fits(c->dtype, c->k, c->cols) || c->k > DX_K || !c->dx)
        return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: the dx tile path does not take K=%lld, M=%lld",
                       (long long)c->k, (long long)c->cols);
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    dx_args a;
    a.dy = c->dy, a.pre = c->pre, a.w = c->w, a.g = c->g, a.dx = c->dx;
    a.rows = c->rows, a.k = (int)c->k, a.cols = (int)c->cols, a.first = c->first, a.accumulate = c->accumulate;
    a.tiles = (c->rows + DX_ROWS - 1) / DX_ROWS;
    a.part = nullptr, a.db = nullptr;
    if (c->db_acc) {
        if (a.tiles == 0) { /* no rows: db's sums are zero */
            const cudaError_t e = c->first ? cudaMemsetAsync(c->db_acc, 0, (size_t)c->cols * sizeof(float), s) : cudaSuccess;
            return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act dx tile");
        }
        if (a.tiles == 1) a.db = (float *)c->db_acc;
        else if (c->scratch_bytes < (size_t)a.tiles * (size_t)c->cols * sizeof(float))
            return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: dx tile scratch too small");
        else a.part = (float *)c->scratch;
    }
    if (a.tiles == 0) return FG_OK;
    cudaError_t e = c->dtype == FG_F16 ? launch_act<__half>(c->act, a, s, ctx->device)
                                       : launch_act<__nv_bfloat16>(c->act, a, s, ctx->device);
    if (e == cudaSuccess && a.part) e = slab_colsum(a.part, a.tiles, c->cols, (float *)c->db_acc, c->first, s);
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act dx tile");
}

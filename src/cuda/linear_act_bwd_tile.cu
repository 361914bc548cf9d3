/*
 * linear_act_bwd_tile.cu — the whole backward of linear + activation in one kernel for a
 * short reduction and a narrow layer (K ≤ 128, M ≤ 256, f16 / bf16; relu, silu, sigmoid, tanh:
 * bt_act says why not the gelus). Per tile of 32 rows:
 *   pre   recomputed as x·wᵀ + b rounded to the dtype (the forward tile's bits), or the kept
 *         pre read (relu: its y, the mask is y > 0)
 *   g     = dy ⊙ act′(pre), rounded to the dtype, in shared memory only; db's column sums in f32
 *   dx    = g·w, written (added to dx when accumulating)
 *   dW   += gᵀ·x, in registers for the block's whole slab of rows
 * Each block walks one slab of consecutive row tiles and leaves its dW and db partial sums in
 * f32; slab_colsum adds db's over the slabs in order, the driver's CAST step dW's. The slab count is the SM
 * count (capped by the tiles): the same bits run to run on one GPU model.
 * Why: the unfused backward writes g ([N, M]) and reads it twice (dx, dW) and reads or
 * recomputes pre in a separate pass; here x and dy (and a kept pre) are read once and dx is
 * the only [N, ·] write. w (≤ 64 KiB) stays in shared memory; loads run three tiles deep by
 * cp.async (plain loads, a tile at a time, when a pointer is not 16-byte aligned).
 * Two roles (warp specialization): eight math warps load the tiles and form pre and g, eight
 * tensor warps run dx and dW from g, handed over through two g slots (named barriers), so a
 * tile's activation math runs beside the previous tile's products.
 */
#include "act_math.cuh"
#include "cuda_internal.h"
#include "elem.cuh"
#include "mma.cuh"
#include "sums.cuh"

constexpr int BT_ROWS = 32, BT_THREADS = 512, BT_MAX_K = 128, BT_MAX_M = 256, BT_STAGES = 3, BT_GBUF = 2;
/* named barriers (0 is __syncthreads): the math warps among themselves; g slot s full (math →
   tensor warps) and empty (tensor → math warps) */
constexpr int BAR_MATH = 1, BAR_FULL = 2, BAR_EMPTY = 4;
constexpr int MATH_THREADS = 256;

struct bt_args {
    const void *x, *w, *b, *dy, *pre;
    void *dx;
    float *part_w, *part_b; /* per slab: dW [M, K] and db [M] partial sums */
    int64_t rows, tiles, per; /* per: tiles a slab */
    int k, cols;
    bool accumulate, vec;
};

/* shared memory, in elements: rows of K padded to 16 (+8), of M padded to 32 (+8); the +8
 * keeps ldmatrix's eight row addresses in distinct banks. w, two g slots, three stages of
 * x, dy (and the kept pre). */
static __host__ __device__ int bt_kp(int k) { return (k + 15) & ~15; }
static __host__ __device__ int bt_mc(int m) { return (m + 31) & ~31; }
static __host__ __device__ int bt_stage(int k, int m, bool kept) {
    return BT_ROWS * (bt_kp(k) + 8) + BT_ROWS * (bt_mc(m) + 8) * (kept ? 2 : 1);
}
static size_t bt_smem(int k, int m, bool kept) {
    return 2 * ((size_t)bt_mc(m) * (bt_kp(k) + 8) + (size_t)BT_GBUF * BT_ROWS * (bt_mc(m) + 8) +
                BT_STAGES * (size_t)bt_stage(k, m, kept));
}

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* rows [row0, row0 + n) of a row-major [nrows, cols] tensor into shared rows of `stride`,
 * cols_pad (a multiple of 8) columns each, zeros past nrows and cols; by threads tid of nt */
template <typename T>
__device__ __forceinline__ void stage_rows(T *dst, int stride, const T *src, int64_t row0, int64_t nrows, int n, int cols,
                                           int cols_pad, bool vec, int tid, int nt) {
    const int cpr = cols_pad / 8;
    for (int i = tid; i < n * cpr; i += nt) {
        const int r = i / cpr, c = (i - r * cpr) * 8;
        const bool ok = row0 + r < nrows && c < cols;
        const T *s = src + (row0 + r) * cols + c;
        T *d = dst + r * stride + c;
        if (vec) {
            copy16(smem_at(d), ok ? s : src, ok);
        } else {
            vec_t<T, 8> v;
#pragma unroll
            for (int e = 0; e < 8; e++) v.v[e] = ok ? s[e] : T(0.f);
            *reinterpret_cast<uint4 *>(d) = *reinterpret_cast<const uint4 *>(&v);
        }
    }
}

/* two adjacent elements of shared memory (4-byte aligned) in f32, one load */
template <typename T> __device__ __forceinline__ float2 pair_at(const T *p) {
    const vec_t<T, 2> q = *reinterpret_cast<const vec_t<T, 2> *>(p);
    return make_float2(to_acc(q.v[0]), to_acc(q.v[1]));
}

/* Warps 0–7 (math): load the tiles, recompute pre (32 rows × 32 columns a warp), form g into
 * a g slot and db's sums. Warps 8–15 (tensor): dx (16 rows × 32 columns a warp) and dW (32
 * rows × all K a warp: 128 accumulators a thread) from the slot. Registers move from the
 * math warps to the tensor warps (setmaxnreg, sm_90a). */
template <typename T, int ACT, bool KEPT>
__global__ void __launch_bounds__(BT_THREADS, 1) act_bwd_tile_kernel(bt_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float bias[BT_MAX_M];
    const int kp = bt_kp(a.k), mc = bt_mc(a.cols), sk = kp + 8, sm = mc + 8;
    T *ws = reinterpret_cast<T *>(smem), *gbuf = ws + mc * sk, *st = gbuf + BT_GBUF * BT_ROWS * sm;
    const int stage = bt_stage(a.k, a.cols, KEPT);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, grp = lane >> 2, quad = lane & 3;
    const int64_t t0 = blockIdx.x * a.per, t1 = t0 + a.per < a.tiles ? t0 + a.per : a.tiles;
    const int n = (int)(t1 - t0);

    stage_rows(ws, sk, static_cast<const T *>(a.w), 0, a.cols, mc, a.k, kp, a.vec, tid, BT_THREADS); /* zero rows past M */
    for (int i = tid; i < mc; i += BT_THREADS)
        bias[i] = !KEPT && a.b && i < a.cols ? to_acc(static_cast<const T *>(a.b)[i]) : 0.f;
    copy_commit();
    copy_wait<0>();
    __syncthreads();

    if (warp < 8) { /* ---------------------------------------------------------------- math */
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        asm volatile("setmaxnreg.dec.sync.aligned.u32 80;\n" ::);
#endif
        const T *x = static_cast<const T *>(a.x), *dy = static_cast<const T *>(a.dy), *pre = static_cast<const T *>(a.pre);
        auto load = [&](int64_t t, int s) {
            T *xs = st + s * stage, *dys = xs + BT_ROWS * sk;
            stage_rows(xs, sk, x, t * BT_ROWS, a.rows, BT_ROWS, a.k, kp, a.vec, tid, MATH_THREADS);
            stage_rows(dys, sm, dy, t * BT_ROWS, a.rows, BT_ROWS, a.cols, mc, a.vec, tid, MATH_THREADS);
            if (KEPT) stage_rows(dys + BT_ROWS * sm, sm, pre, t * BT_ROWS, a.rows, BT_ROWS, a.cols, mc, a.vec, tid, MATH_THREADS);
        };
        const bool on = warp * 32 < mc; /* this warp's 32 columns */
        float dbs[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++) dbs[j][0] = dbs[j][1] = 0.f;
        if (n > 0) load(t0, 0);
        copy_commit();
        for (int j = 0; j < n; j++) {
            const int64_t t = t0 + j;
            if (j >= BT_GBUF) bar_sync(BAR_EMPTY + (j & 1), BT_THREADS); /* tile j-2 done: its slot and stage */
            if (j + 1 < n) load(t + 1, (j + 1) % BT_STAGES);
            copy_commit();
            copy_wait<1>();
            bar_sync(BAR_MATH, MATH_THREADS); /* tile j's copies, everyone's */
            const T *xs = st + (j % BT_STAGES) * stage, *dys = xs + BT_ROWS * sk, *pres = dys + BT_ROWS * sm;
            T *gs = gbuf + (j & 1) * BT_ROWS * sm;
            if (on) { /* 16 rows at a time (registers) */
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    float acc[4][4];
                    if constexpr (!KEPT) {
#pragma unroll
                        for (int jj = 0; jj < 4; jj++) acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
                        for (int k0 = 0; k0 < kp; k0 += 16) {
                            uint32_t bf[4][2], af[4];
#pragma unroll
                            for (int jj = 0; jj < 2; jj++) {
                                const int c = warp * 32 + jj * 16 + (lane & 7) + ((lane >> 4) << 3);
                                ldsm4(smem_at(ws + c * sk + k0 + ((lane >> 3) & 1) * 8), bf[2 * jj][0], bf[2 * jj][1],
                                      bf[2 * jj + 1][0], bf[2 * jj + 1][1]);
                            }
                            ldsm4(smem_at(xs + (mi * 16 + (lane & 15)) * sk + k0 + (lane >> 4) * 8), af[0], af[1], af[2], af[3]);
#pragma unroll
                            for (int jj = 0; jj < 4; jj++) mma16816<T>(acc[jj], af, bf[jj]);
                        }
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = mi * 16 + grp + 8 * h;
                        const bool row_ok = t * BT_ROWS + r < a.rows;
#pragma unroll
                        for (int jj = 0; jj < 4; jj++) {
                            const int c = warp * 32 + 8 * jj + 2 * quad;
                            float2 p;
                            if constexpr (KEPT) {
                                p = pair_at(pres + r * sm + c);
                            } else {
                                T q[2];
                                from_acc2<T>(acc[jj][2 * h] + bias[c], acc[jj][2 * h + 1] + bias[c + 1], q);
                                p = make_float2(to_acc(q[0]), to_acc(q[1]));
                            }
                            const float2 d = pair_at(dys + r * sm + c);
                            const float v0 = row_ok ? d.x * act_slope(ACT, p.x) : 0.f;
                            const float v1 = row_ok ? d.y * act_slope(ACT, p.y) : 0.f;
                            dbs[jj][0] += v0, dbs[jj][1] += v1;
                            from_acc2<T>(v0, v1, gs + r * sm + c);
                        }
                    }
                }
            }
            bar_arrive(BAR_FULL + (j & 1), BT_THREADS);
        }
        for (int j = n > BT_GBUF ? n : BT_GBUF; j < n + BT_GBUF; j++) bar_sync(BAR_EMPTY + (j & 1), BT_THREADS); /* the last two */
        copy_wait<0>();
        if (a.part_b && on) { /* this slab's db: over the quads' rows (the warp holds all 32 rows) */
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    dbs[jj][e] += __shfl_xor_sync(0xffffffffu, dbs[jj][e], 4);
                    dbs[jj][e] += __shfl_xor_sync(0xffffffffu, dbs[jj][e], 8);
                    dbs[jj][e] += __shfl_xor_sync(0xffffffffu, dbs[jj][e], 16);
                }
            if (grp == 0)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    const int c = warp * 32 + 8 * jj + 2 * quad;
                    if (c < a.cols) {
                        a.part_b[(int64_t)blockIdx.x * a.cols + c] = dbs[jj][0];
                        a.part_b[(int64_t)blockIdx.x * a.cols + c + 1] = dbs[jj][1];
                    }
                }
        }
    } else { /* -------------------------------------------------------------- tensor */
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        asm volatile("setmaxnreg.inc.sync.aligned.u32 176;\n" ::);
#endif
        const int q = warp - 8, cr = q & 1, cc = q >> 1, mp = (a.cols + 15) & ~15;
        const bool c_on = cc * 32 < kp, d_on = q * 32 < mc;
        float dw[2][16][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 16; j++) dw[i][j][0] = dw[i][j][1] = dw[i][j][2] = dw[i][j][3] = 0.f;
        for (int j = 0; j < n; j++) {
            const int64_t t = t0 + j;
            bar_sync(BAR_FULL + (j & 1), BT_THREADS);
            const T *xs = st + (j % BT_STAGES) * stage, *gs = gbuf + (j & 1) * BT_ROWS * sm;
            if (c_on) { /* dx = g·w: rows 16·cr, columns 32·cc, 16 at a time (registers) */
                T *dx = static_cast<T *>(a.dx);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    const int c0 = cc * 32 + np * 16;
                    if (c0 >= kp) continue;
                    float acc[2][4];
#pragma unroll
                    for (int jj = 0; jj < 2; jj++) acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
                    for (int k0 = 0; k0 < mp; k0 += 16) {
                        uint32_t af[4], bf[2][2];
                        ldsm4(smem_at(gs + (cr * 16 + (lane & 15)) * sm + k0 + (lane >> 4) * 8), af[0], af[1], af[2], af[3]);
                        ldsm4t(smem_at(ws + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * sk + c0 + (lane >> 4) * 8), bf[0][0],
                               bf[0][1], bf[1][0], bf[1][1]);
                        mma16816<T>(acc[0], af, bf[0]);
                        mma16816<T>(acc[1], af, bf[1]);
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int64_t row = t * BT_ROWS + cr * 16 + grp + 8 * h;
                        if (row >= a.rows) continue;
#pragma unroll
                        for (int jj = 0; jj < 2; jj++) {
                            const int col = c0 + 8 * jj + 2 * quad;
                            if (col >= a.k) continue;
                            T *o = dx + row * a.k + col;
                            float v0 = acc[jj][2 * h], v1 = acc[jj][2 * h + 1];
                            if (a.accumulate) v0 += to_acc(o[0]), v1 += to_acc(o[1]);
                            if (a.vec) from_acc2<T>(v0, v1, o);
                            else o[0] = from_acc<T>(v0), o[1] = from_acc<T>(v1);
                        }
                    }
                }
            }
            if (d_on) { /* dW += gᵀ·x: rows 32·q, all columns */
#pragma unroll
                for (int r0 = 0; r0 < BT_ROWS; r0 += 16) {
                    uint32_t af[2][4];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
                        ldsm4t(smem_at(gs + (r0 + (lane >> 4) * 8 + (lane & 7)) * sm + q * 32 + mt * 16 + ((lane >> 3) & 1) * 8),
                               af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
#pragma unroll
                    for (int np = 0; np < 8; np++)
                        if (np * 16 < kp) {
                            uint32_t bf[2][2];
                            ldsm4t(smem_at(xs + (r0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * sk + np * 16 + (lane >> 4) * 8),
                                   bf[0][0], bf[0][1], bf[1][0], bf[1][1]);
#pragma unroll
                            for (int mt = 0; mt < 2; mt++) {
                                mma16816<T>(dw[mt][2 * np], af[mt], bf[0]);
                                mma16816<T>(dw[mt][2 * np + 1], af[mt], bf[1]);
                            }
                        }
                }
            }
            bar_arrive(BAR_EMPTY + (j & 1), BT_THREADS);
        }
        if (d_on) { /* this slab's dW */
            float *pw = a.part_w + (int64_t)blockIdx.x * a.cols * a.k;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int m = q * 32 + mt * 16 + grp + 8 * h;
                    if (m >= a.cols) continue;
#pragma unroll
                    for (int nt = 0; nt < 16; nt++) {
                        const int kk = nt * 8 + 2 * quad;
                        if (kk < a.k)
                            *reinterpret_cast<float2 *>(pw + (int64_t)m * a.k + kk) =
                                make_float2(dw[mt][nt][2 * h], dw[mt][nt][2 * h + 1]);
                    }
                }
        }
    }
}

/* The activations whose slope is cheap (relu; one ex2 and one reciprocal for silu, sigmoid,
 * tanh). gelu and gelu_tanh keep the unfused backward: their slope math makes the eight math
 * warps this kernel's bottleneck, and the gradient pass with two cuBLASLt products is then
 * faster. (With a kept pre on sm_90a, linear_act_bwd90.cu runs instead, the gelus included.) */
static bool bt_act(int act) {
    return act == FG_ACT_RELU || act == FG_ACT_SILU || act == FG_ACT_SIGMOID || act == FG_ACT_TANH ||
           act == FG_ACT_GIVEN_SLOPE; /* (the slope form: s is always kept) */
}

extern "C" bool fg_cuda_act_bwd_tile_fits(fg_dtype dtype, int act, int64_t k, int64_t cols) {
    return (dtype == FG_F16 || dtype == FG_BF16) && bt_act(act) && k >= 8 && k <= BT_MAX_K && k % 8 == 0 &&
           cols >= 8 && cols <= BT_MAX_M && cols % 8 == 0;
}

extern "C" void fg_cuda_act_slabs(int device, int64_t rows, int64_t *slabs, int64_t *per) {
    const int64_t tiles = (rows + BT_ROWS - 1) / BT_ROWS;
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) sms = 1;
    *per = tiles > 0 ? (tiles + sms - 1) / sms : 1;
    *slabs = tiles > 0 ? (tiles + *per - 1) / *per : 0;
}

/* per slab (at least one: with no rows, one of zeros), dW's [cols, k] then db's [cols] sums */
extern "C" size_t fg_cuda_act_bwd_tile_scratch(int device, int64_t rows, int64_t k, int64_t cols, int64_t *parts) {
    int64_t slabs, per;
    fg_cuda_act_slabs(device, rows, &slabs, &per);
    *parts = slabs > 0 ? slabs : 1;
    return (size_t)*parts * (size_t)(cols * k + cols) * sizeof(float);
}

template <typename T, int ACT, bool KEPT> static cudaError_t bt_launch(const bt_args &a, int64_t slabs, cudaStream_t s) {
    auto kernel = act_bwd_tile_kernel<T, ACT, KEPT>;
    const size_t smem = bt_smem(a.k, a.cols, KEPT);
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kernel<<<(unsigned)slabs, BT_THREADS, smem, s>>>(a);
    return cudaGetLastError();
}

template <typename T> static cudaError_t bt_dispatch(int act, bool kept, const bt_args &a, int64_t slabs, cudaStream_t s) {
    return with_grad_act(act, [&](auto f) {
        constexpr int ACT = decltype(f)::value;
        if constexpr (ACT == FG_ACT_NONE) return cudaErrorInvalidValue; /* (none: the driver runs plain GEMMs) */
        else if constexpr (ACT == FG_ACT_GIVEN_SLOPE) return kept ? bt_launch<T, ACT, true>(a, slabs, s) : cudaErrorInvalidValue;
        else return kept ? bt_launch<T, ACT, true>(a, slabs, s) : bt_launch<T, ACT, false>(a, slabs, s);
    });
}

static bool al16(const void *p) { return p == nullptr || (uintptr_t)p % 16 == 0; }

extern "C" fg_status fg_cuda_act_bwd_tile(fg_context *ctx, const fg_act_call *c) {
    if (!fg_cuda_act_bwd_tile_fits(c->dtype, c->act, c->k, c->cols) || !c->dx)
        return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: the backward tile does not take K=%lld, M=%lld",
                       (long long)c->k, (long long)c->cols);
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    int64_t slabs, per;
    fg_cuda_act_slabs(ctx->device, c->rows, &slabs, &per);
    if (slabs == 0) { /* no rows: dW's one partial and db's sums are zero */
        cudaError_t e = cudaMemsetAsync(c->scratch, 0, (size_t)(c->cols * c->k) * sizeof(float), s);
        if (e == cudaSuccess && c->db_acc && c->first) e = cudaMemsetAsync(c->db_acc, 0, (size_t)c->cols * sizeof(float), s);
        return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act backward tile");
    }
    bt_args a;
    a.x = c->x, a.w = c->w, a.b = c->b, a.dy = c->dy, a.pre = c->pre, a.dx = c->dx;
    a.part_w = (float *)c->scratch;
    a.part_b = c->db_acc ? a.part_w + slabs * c->cols * c->k : nullptr;
    a.rows = c->rows, a.tiles = (c->rows + BT_ROWS - 1) / BT_ROWS, a.per = per;
    a.k = (int)c->k, a.cols = (int)c->cols;
    a.accumulate = c->accumulate;
    a.vec = al16(c->x) && al16(c->w) && al16(c->dy) && al16(c->pre) && al16(c->dx);
    cudaError_t e = c->dtype == FG_F16 ? bt_dispatch<__half>(c->act, c->pre != nullptr, a, slabs, s)
                                       : bt_dispatch<__nv_bfloat16>(c->act, c->pre != nullptr, a, slabs, s);
    if (e == cudaSuccess && a.part_b) e = slab_colsum(a.part_b, slabs, c->cols, (float *)c->db_acc, c->first, s);
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act backward tile");
}

/*
 * linear_act_tile.cu — linear + activation with a short reduction (K ≤ 128, f16 / bf16):
 * the product and the activation in one kernel per direction, on tensor cores (mma.sync
 * m16n8k16, f32 accumulators).
 *  TILE_FORWARD  pre = round(x·wᵀ + b) (stored when kept; the slope form stores act′(pre)
 *                there instead), y = act(pre)
 *  TILE_GRAD     pre recomputed the same way — the same bits as the forward's —, then
 *                g = dy ⊙ act′(pre) (stored when wanted) and db's column sums per row tile,
 *                added over the tiles in order by slab_colsum (deterministic whatever the grid)
 * Both apply a dropout when the call carries one (dropout.cuh's mask on the flat index; y =
 * m ⊙ act(pre), the slope form's s = m ⊙ act′(pre) too, g = (m ⊙ dy) ⊙ act′(pre), each product
 * rounded as the dropout step rounds it: the unfused pair's bits), so the FFN hidden's dropout
 * costs no pass of its own.
 * Why: with K ≤ 128 the product is cheap next to a pass over [N, M], and the GEMM-then-pass
 * path moves pre through memory twice more. Recomputing pre from x (K values a row) also
 * reads less than a kept pre (M a row) whenever K < M.
 * A block keeps a 128-column tile of w in shared memory for its whole life and walks row
 * tiles of 64 (x's next tile loading by cp.async, and the gradient's dy into registers, under
 * the current tile's products). w's rows are stored permuted so that each thread's
 * accumulators hold 8 adjacent output columns of a row: the epilogue reads dy and writes
 * y / pre / g as 16-byte vectors, full sectors per warp.
 * Faster than GEMM + pass, but not at memory speed: a block's products, math and memory run
 * one after the other. Tiles of 128 columns, not 64: a narrower tile reads x from L2 once more
 * per column tile, and the extra resident warps alone do not overlap the phases.
 */
#include "act_math.cuh"
#include "cuda_internal.h"
#include "dropout.cuh"
#include "elem.cuh"
#include "mma.cuh"
#include "sums.cuh"

constexpr int TILE_ROWS = 64, TILE_COLS = 128, TILE_K = 128, TILE_THREADS = 256;
/* blocks an SM: the gradient holds dy's 16 registers across the products (at three blocks'
   80 registers it would spill) */
template <bool GRAD> constexpr int tile_blocks() { return GRAD ? 2 : 3; }

struct tile_args {
    const void *x, *w, *b, *dy;
    void *y, *pre, *g;
    float *part, *db; /* GRAD: per-row-tile column sums [tiles, cols], or db itself (one tile) */
    int64_t rows, tiles;
    int k, cols;
    bool first;
    bool slope; /* TILE_FORWARD: pre receives act′(pre) (the slope form) */
    drop_t drop; /* DROP instances: y = m ⊙ act(pre), g = (m ⊙ dy) ⊙ act′(pre) (dropout.cuh's mask) */
};

/* Shared memory: w's tile (TILE_COLS rows) then two x tiles (TILE_ROWS rows each), rows of
 * kp = K rounded up to 16 plus 8 elements of padding (which keeps ldmatrix's eight row
 * addresses in distinct banks for every kp). */
static int tile_stride(int k) { return ((k + 15) & ~15) + 8; }
static size_t tile_smem(int k) { return (size_t)(TILE_COLS + 2 * TILE_ROWS) * tile_stride(k) * 2; }

/* Warps: 2 (rows) × 4 (columns), each 32 rows × 32 columns = 2 × 4 mma tiles. In mma column
 * 8j + 2t + e (j, t < 4, e < 2) of a warp's 32 lies output column 8t + 2j + e: thread t of a
 * quad then holds columns 8t … 8t + 7 of its rows. */
template <typename T, int ACT, bool GRAD, bool DROP>
__global__ void __launch_bounds__(TILE_THREADS, tile_blocks<GRAD>()) act_tile_kernel(tile_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float upper[TILE_COLS]; /* db: the upper row-warps' sums */
    __shared__ float bias[TILE_COLS];  /* b's tile in f32, in output-column order */
    const int kp = (a.k + 15) & ~15, str = kp + 8, kc = a.k / 8, kpc = kp / 8;
    T *ws = reinterpret_cast<T *>(smem), *xs = ws + TILE_COLS * str;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int grp = lane >> 2, quad = lane & 3;
    const int col0 = blockIdx.x * TILE_COLS;
    const T *x = static_cast<const T *>(a.x), *w = static_cast<const T *>(a.w);

    for (int i = tid; i < TILE_COLS * kpc; i += TILE_THREADS) { /* w's tile, rows permuted */
        const int s = i / kpc, c = i % kpc, m = s & 31;
        const int col = col0 + (s & ~31) + 8 * ((m >> 1) & 3) + 2 * (m >> 3) + (m & 1);
        const bool ok = col < a.cols && c < kc;
        copy16(smem_at(ws + s * str + c * 8), ok ? w + (int64_t)col * a.k + c * 8 : w, ok);
    }
    auto load_x = [&](int64_t tile, int buf) {
        T *dst = xs + buf * TILE_ROWS * str;
        const int64_t r0 = tile * TILE_ROWS;
        for (int i = tid; i < TILE_ROWS * kpc; i += TILE_THREADS) {
            const int r = i / kpc, c = i % kpc;
            const bool ok = r0 + r < a.rows && c < kc;
            copy16(smem_at(dst + r * str + c * 8), ok ? x + (r0 + r) * a.k + c * 8 : x, ok);
        }
    };

    const int cbase = col0 + wn * 32 + 8 * quad; /* this thread's 8 output columns */
    const bool col_ok = cbase < a.cols;          /* (cols % 8 == 0: all 8 or none) */
    for (int i = tid; i < TILE_COLS; i += TILE_THREADS)
        bias[i] = a.b && col0 + i < a.cols ? to_acc(static_cast<const T *>(a.b)[col0 + i]) : 0.f;
    const float *my_bias = bias + wn * 32 + 8 * quad;
    float sum[8];
#pragma unroll
    for (int c = 0; c < 8; c++) sum[c] = 0.f;

    int64_t t = blockIdx.y;
    if (t < a.tiles) load_x(t, 0);
    copy_commit();
    for (int it = 0; t < a.tiles; t += gridDim.y, it++) {
        const int buf = it & 1;
        if (t + gridDim.y < a.tiles) load_x(t + gridDim.y, buf ^ 1);
        copy_commit();
        vec_t<T, 8> d[2][2]; /* GRAD: this thread's dy, loading under the products */
        if constexpr (GRAD) {
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t row = t * TILE_ROWS + wm * 32 + mi * 16 + grp + 8 * h;
                    if (row < a.rows && col_ok) d[mi][h] = load_vec<T, 8>(static_cast<const T *>(a.dy) + row * a.cols + cbase);
                    else *reinterpret_cast<uint4 *>(&d[mi][h]) = make_uint4(0, 0, 0, 0);
                }
        }
        copy_wait<1>();
        __syncthreads();
        float acc[2][4][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mi][j][e] = 0.f;
        const T *xb = xs + buf * TILE_ROWS * str;
        for (int k0 = 0; k0 < kp; k0 += 16) {
            uint32_t bf[4][2];
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const int n = wn * 32 + jj * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldsm4(smem_at(ws + n * str + k0 + ((lane >> 3) & 1) * 8), bf[2 * jj][0], bf[2 * jj][1],
                      bf[2 * jj + 1][0], bf[2 * jj + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                uint32_t af[4];
                ldsm4(smem_at(xb + (wm * 32 + mi * 16 + (lane & 15)) * str + k0 + (lane >> 4) * 8), af[0], af[1],
                      af[2], af[3]);
#pragma unroll
                for (int j = 0; j < 4; j++) mma16816<T>(acc[mi][j], af, bf[j]);
            }
        }
        __syncthreads(); /* this x buffer is free for the load after next */

#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t row = t * TILE_ROWS + wm * 32 + mi * 16 + grp + 8 * h;
                if (row >= a.rows || !col_ok) continue;
                const int64_t at = row * a.cols + cbase;
                vec_t<T, 8> p, o;
#pragma unroll
                for (int c = 0; c < 8; c += 2)
                    from_acc2<T>(acc[mi][c >> 1][2 * h] + my_bias[c], acc[mi][c >> 1][2 * h + 1] + my_bias[c + 1],
                                 &p.v[c]);
                if constexpr (GRAD) {
                    if constexpr (DROP) { /* m ⊙ dy rounded to T, as the dropout step writes it */
                        float m[8];
                        drop_mask_groups<8>(a.drop, at, m); /* (at: a multiple of 8) */
#pragma unroll
                        for (int c = 0; c < 8; c++) d[mi][h].v[c] = from_acc<T>(__fmul_rn(to_acc(d[mi][h].v[c]), m[c]));
                    }
#pragma unroll
                    for (int c = 0; c < 8; c += 2) {
                        const float v0 = to_acc(d[mi][h].v[c]) * act_slope(ACT, to_acc(p.v[c]));
                        const float v1 = to_acc(d[mi][h].v[c + 1]) * act_slope(ACT, to_acc(p.v[c + 1]));
                        sum[c] += v0, sum[c + 1] += v1;
                        from_acc2<T>(v0, v1, &o.v[c]);
                    }
                    if (a.g) store_vec<T, 8>(static_cast<T *>(a.g) + at, o);
                } else {
                    float m[8]; /* DROP: the mask of y (and of the saved slope) */
                    if constexpr (DROP) drop_mask_groups<8>(a.drop, at, m); /* (at: a multiple of 8) */
                    if (a.pre && a.slope) { /* y and s from one evaluation */
                        vec_t<T, 8> sv;
#pragma unroll
                        for (int c = 0; c < 8; c += 2) {
                            float y0, y1, s0, s1;
                            act_value_slope(ACT, to_acc(p.v[c]), &y0, &s0);
                            act_value_slope(ACT, to_acc(p.v[c + 1]), &y1, &s1);
                            from_acc2<T>(y0, y1, &o.v[c]);
                            from_acc2<T>(s0, s1, &sv.v[c]);
                        }
                        if constexpr (DROP) { /* m ⊙ s rounded, as the dropout step over s writes it */
#pragma unroll
                            for (int c = 0; c < 8; c++) sv.v[c] = from_acc<T>(__fmul_rn(to_acc(sv.v[c]), m[c]));
                        }
                        store_vec<T, 8>(static_cast<T *>(a.pre) + at, sv);
                    } else {
                        if (a.pre) store_vec<T, 8>(static_cast<T *>(a.pre) + at, p);
#pragma unroll
                        for (int c = 0; c < 8; c += 2)
                            from_acc2<T>(act_value(ACT, to_acc(p.v[c])), act_value(ACT, to_acc(p.v[c + 1])), &o.v[c]);
                    }
                    if constexpr (DROP) { /* act(pre) rounded to T, then the multiply (the dropout step's bits) */
#pragma unroll
                        for (int c = 0; c < 8; c++) o.v[c] = from_acc<T>(__fmul_rn(to_acc(o.v[c]), m[c]));
                    }
                    store_vec<T, 8>(static_cast<T *>(a.y) + at, o);
                }
            }

        if (GRAD && (a.part || a.db)) { /* the tile's column sums: over the quads' rows, then the two row-warps */
#pragma unroll
            for (int c = 0; c < 8; c++) {
                sum[c] += __shfl_xor_sync(0xffffffffu, sum[c], 4);
                sum[c] += __shfl_xor_sync(0xffffffffu, sum[c], 8);
                sum[c] += __shfl_xor_sync(0xffffffffu, sum[c], 16);
            }
            if (wm == 1 && grp == 0)
#pragma unroll
                for (int c = 0; c < 8; c++) upper[wn * 32 + 8 * quad + c] = sum[c];
            __syncthreads();
            if (wm == 0 && grp == 0 && col_ok)
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    const float v = sum[c] + upper[wn * 32 + 8 * quad + c];
                    if (a.part) a.part[t * a.cols + cbase + c] = v;
                    else a.db[cbase + c] = a.first ? v : a.db[cbase + c] + v;
                }
#pragma unroll
            for (int c = 0; c < 8; c++) sum[c] = 0.f;
        }
    }
    copy_wait<0>();
}

extern "C" bool fg_cuda_act_tile_fits(fg_dtype dtype, int64_t k, int64_t cols) {
    return (dtype == FG_F16 || dtype == FG_BF16) && k >= 8 && k <= TILE_K && k % 8 == 0 && cols > 0 && cols % 8 == 0 &&
           cols <= INT32_MAX - TILE_COLS;
}

template <typename T, int ACT, bool GRAD, bool DROP>
static cudaError_t launch(const tile_args &a, cudaStream_t s, int device) {
    auto kernel = act_tile_kernel<T, ACT, GRAD, DROP>;
    const size_t smem = tile_smem(a.k);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int sms = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    const unsigned gx = (unsigned)((a.cols + TILE_COLS - 1) / TILE_COLS);
    int64_t gy = tile_blocks<GRAD>() * (int64_t)sms / gx; /* (the sums' order does not depend on it) */
    if (gy < 1) gy = 1;
    if (gy > a.tiles) gy = a.tiles;
    if (gy > 65535) gy = 65535;
    kernel<<<dim3(gx, (unsigned)gy), TILE_THREADS, smem, s>>>(a);
    return cudaGetLastError();
}

template <typename T, bool GRAD> static cudaError_t launch_act(int act, const tile_args &a, cudaStream_t s, int dev) {
    return with_act(act, [&](auto f) {
        constexpr int ACT = decltype(f)::value;
        if constexpr (ACT == FG_ACT_NONE) return cudaErrorInvalidValue; /* (none: the driver runs a plain GEMM) */
        else if (a.drop.on) return launch<T, ACT, GRAD, true>(a, s, dev);
        else return launch<T, ACT, GRAD, false>(a, s, dev);
    });
}

extern "C" size_t fg_cuda_act_tile_scratch(int64_t rows, int64_t cols) {
    const int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    return tiles > 1 ? (size_t)tiles * (size_t)cols * sizeof(float) : 0;
}

extern "C" fg_status fg_cuda_act_tile(fg_context *ctx, const fg_act_call *c) {
    const bool grad = c->step == FG_ACT_STEP_TILE_GRAD;
    if (!fg_cuda_act_tile_fits(c->dtype, c->k, c->cols))
        return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: the tile path does not take K=%lld, M=%lld",
                       (long long)c->k, (long long)c->cols);
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    tile_args a;
    a.x = c->x, a.w = c->w, a.b = c->b, a.dy = c->dy;
    a.y = c->y, a.pre = grad ? nullptr : (void *)c->pre, a.g = c->g;
    a.rows = c->rows, a.k = (int)c->k, a.cols = (int)c->cols, a.first = c->first;
    a.slope = !grad && c->slope_out;
    a.drop = drop_of(c->drop);
    a.tiles = (c->rows + TILE_ROWS - 1) / TILE_ROWS;
    a.part = nullptr, a.db = nullptr;
    if (grad && c->db_acc) {
        if (a.tiles == 0) { /* no rows: db's sums are zero */
            const cudaError_t e = c->first ? cudaMemsetAsync(c->db_acc, 0, (size_t)c->cols * sizeof(float), s) : cudaSuccess;
            return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act tile");
        }
        if (a.tiles == 1) a.db = (float *)c->db_acc;
        else if (c->scratch_bytes < fg_cuda_act_tile_scratch(c->rows, c->cols))
            return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: tile scratch too small");
        else a.part = (float *)c->scratch;
    }
    if (a.tiles == 0) return FG_OK;
    cudaError_t e;
    if (c->dtype == FG_F16)
        e = grad ? launch_act<__half, true>(c->act, a, s, ctx->device) : launch_act<__half, false>(c->act, a, s, ctx->device);
    else
        e = grad ? launch_act<__nv_bfloat16, true>(c->act, a, s, ctx->device)
                 : launch_act<__nv_bfloat16, false>(c->act, a, s, ctx->device);
    if (e == cudaSuccess && a.part) e = slab_colsum(a.part, a.tiles, c->cols, (float *)c->db_acc, c->first, s);
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act tile");
}

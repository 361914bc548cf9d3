/*
 * linear_act_bwd90.cu — the whole backward of linear + activation in one sm_90a kernel for a
 * short reduction and a narrow layer (K ≤ 128, M ≤ 256, f16 / bf16, every activation), from a
 * kept pre (relu: its y). Per tile of 32 rows:
 *   g   = dy ⊙ act′(pre), rounded to the dtype, written over dy's tile in shared memory; db's
 *         column sums in f32 (of the unrounded g, as the gradient pass sums them)
 *   dx  = g·w, written (added to dx when accumulating: the old dx tile loaded by TMA, below)
 *   dW += gᵀ·x, in registers for the block's whole slab of rows
 * Each block walks one slab of consecutive row tiles (the slabs of linear_act_bwd_tile.cu: the
 * same scratch, per-slab dW and db partials in f32, summed over the slabs in order by CAST and
 * slab_colsum: deterministic on one GPU model).
 * Why: linear_act_bwd_tile.cu's warps run mma.sync and the activation math in turn, and its
 * gelu slopes make the math warps the bottleneck (slower than the unfused backward). Here the
 * products are wgmma, asynchronous: the consumer warps issue tile t's products and form tile
 * t + 1's g while the tensor cores run them (relu and silu then run near memory speed; gelu's
 * slope math stays the longest part, hence g's math on eleven warps, below).
 * Machinery (sm90.cuh): w (≤ 64 KiB) loaded once by TMA; one producer thread loads dy, pre and
 * x four tiles deep (TMA boxes of 32 rows × 64 columns, 128-byte swizzled; rows and columns past
 * the tensors read as zeros, so their g is 0); g's math on eleven warps (the consumers' eight and
 * the producer warpgroup's three spare ones, a named barrier a tile); two consumer warpgroups:
 * warpgroup c runs dx's columns 64c … 64c + 63 (wgmma m64n64: A = g K-major, B = w MN-major; A's rows 32–63 are the
 * next box's bytes and their results are dropped) and dW's rows 128c … 128c + 127 (two m64n128:
 * A = gᵀ, MN-major from the same g tile; B = x MN-major). g's elementwise math reads and writes
 * each 16 bytes in place, so the swizzle needs no unscrambling.
 * Accumulating, the old dx tile (32 rows × K) comes by TMA into two of the stage's pre boxes, free once
 * every g warp has formed the tile's g: a consumer thread asks for it when the tile's products
 * start, and the store reads it from shared memory (read by plain loads before each store, the
 * old dx put a global round trip per 4-byte pair on the walk's path: the compiler cannot move a
 * load above a store that may alias it).
 */
#include "act_math.cuh"
#include "cuda_internal.h"
#include "elem.cuh"
#include "sm90.cuh"
#include "sums.cuh"

constexpr int B9_ROWS = 32 /* (fg_cuda_act_slabs' tiles) */, B9_STAGES = 4, B9_THREADS = 384, B9_MAX_K = 128, B9_MAX_M = 256;
constexpr int B9_BOX = B9_ROWS * 128;                        /* one 32-row × 64-column box: 4 KiB */
/* offsets in a stage (an enum: the host pass uses none); accumulating, the old dx tile's ≤ 2
   boxes go over pre's boxes 1 and 2 once g is formed (box 0 is also rows 32–63 of dx's last m64
   product: dropped, but read while the copy would land) */
enum { B9_DY = 0, B9_PRE = 4 * B9_BOX, B9_X = 8 * B9_BOX, B9_DXO = B9_PRE + B9_BOX };
constexpr int B9_STAGE = 10 * B9_BOX;                        /* dy (→ g) 4 boxes, pre 4, x 2 */
constexpr int B9_W = 8 * 8192;                               /* w: 4 × 2 boxes of 64 × 64 */
constexpr size_t B9_SMEM = (size_t)B9_W + (size_t)B9_STAGES * B9_STAGE + 1024;

struct b9_args {
    void *dx;
    float *part_w, *part_b; /* per slab: dW [M, K] and db [M] partial sums */
    int64_t rows, tiles, per; /* per: tiles a slab */
    int k, cols, nkb, nmb;    /* nkb / nmb: 64-wide boxes of K / M */
    bool accumulate; /* (then the kernel's fifth map is dx's) */
};

/* g's math runs on the consumers' eight warps and the producer warpgroup's three spare warps:
   B9_GW warps, warp w forming rows w, w + 11, w + 22 of each tile */
constexpr int B9_GW = 11, B9_G_THREADS = 32 * B9_GW;
/* named barriers (0 is __syncthreads): g of a tile formed (the g warps); end of the walk. The
   helpers and the consumers reach them from different branches (different static instructions),
   so the unaligned form: bar.sync is barrier.sync.aligned, which promises one instruction per
   barrier generation (compute-sanitizer synccheck reports divergent barriers with it). */
__device__ __forceinline__ void g_sync() { asm volatile("barrier.sync 1, %0;\n" ::"n"(B9_G_THREADS) : "memory"); }
__device__ __forceinline__ void end_sync() { asm volatile("barrier.sync 2, %0;\n" ::"n"(B9_G_THREADS) : "memory"); }

/* g = dy ⊙ act′(pre) in place over dy, for the thread's 16-byte column group (box q = lane / 8,
   columns 64q + 8·(lane % 8) …) in g warp gw's rows of the tile; db's sums of those 8 columns
   in dbs */
template <typename T, int ACT>
__device__ __forceinline__ void form_g(unsigned char *stage, int nmb, int lane, int gw, float *dbs) {
    const int q = lane >> 3;
    if (q >= nmb) return;
    unsigned char *dyb = stage + B9_DY + q * B9_BOX;
    const unsigned char *preb = stage + B9_PRE + q * B9_BOX;
#pragma unroll
    for (int i = 0; i < 3; i++) {
        const int row = gw + B9_GW * i;
        if (row >= B9_ROWS) break;
        const int off = row * 128 + (((lane & 7) ^ (row & 7)) << 4);
        uint4 d = *reinterpret_cast<const uint4 *>(dyb + off);
        const uint4 p = *reinterpret_cast<const uint4 *>(preb + off);
        uint32_t *du = reinterpret_cast<uint32_t *>(&d);
        const uint32_t *pu = reinterpret_cast<const uint32_t *>(&p);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const T *de = reinterpret_cast<const T *>(&du[e]), *pe = reinterpret_cast<const T *>(&pu[e]);
            const float v0 = to_acc(de[0]) * act_slope(ACT, to_acc(pe[0]));
            const float v1 = to_acc(de[1]) * act_slope(ACT, to_acc(pe[1]));
            dbs[2 * e] += v0, dbs[2 * e + 1] += v1;
            T o[2];
            from_acc2<T>(v0, v1, o);
            du[e] = *reinterpret_cast<uint32_t *>(o);
        }
        *reinterpret_cast<uint4 *>(dyb + off) = d;
    }
}

/* tile j's g (stage j % 4) once TMA has landed it, fenced for the products */
template <typename T, int ACT>
__device__ __forceinline__ void tile_g(unsigned char *stages, uint64_t *full, int j, int nmb, int lane, int gw, float *dbs) {
    const int s = j % B9_STAGES;
    mbar_wait(&full[s], (j / B9_STAGES) & 1);
    form_g<T, ACT>(stages + s * B9_STAGE, nmb, lane, gw, dbs);
    tma_store_fence(); /* g (generic proxy writes) visible to wgmma (the async proxy) */
}

/* a g warp's db sums into red [11 g warps][256 columns] (then summed over the warps in order) */
__device__ __forceinline__ void stash_db(float *red, int nmb, int lane, int gw, const float *dbs) {
    const int q = lane >> 3;
    if (q < nmb)
#pragma unroll
        for (int e = 0; e < 8; e++) red[gw * 256 + 64 * q + 8 * (lane & 7) + e] = dbs[e];
}

template <typename T, int ACT>
__global__ void __launch_bounds__(B9_THREADS, 1)
    act_bwd90_kernel(const __grid_constant__ CUtensorMap mdy, const __grid_constant__ CUtensorMap mpre,
                     const __grid_constant__ CUtensorMap mx, const __grid_constant__ CUtensorMap mw,
                     const __grid_constant__ CUtensorMap mdx, b9_args a) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    extern __shared__ unsigned char raw[];
    __shared__ __align__(8) uint64_t full[B9_STAGES], empty[B9_STAGES], dxfull[B9_STAGES], wfull;
    unsigned char *smem = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    unsigned char *ws = smem, *stages = smem + B9_W;
    const int wg = threadIdx.x / 128;
    const int64_t t0 = blockIdx.x * a.per, t1 = t0 + a.per < a.tiles ? t0 + a.per : a.tiles;
    const int n = (int)(t1 - t0);
    if (threadIdx.x == 0) {
        for (int s = 0; s < B9_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 256), mbar_init(&dxfull[s], 1);
        mbar_init(&wfull, 1);
        mbar_init_fence();
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    float dbs[8];
#pragma unroll
    for (int i = 0; i < 8; i++) dbs[i] = 0.f;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::);
        if (threadIdx.x == 0) { /* ---------------------------------------- producer */
            /* every box, also those past M or K (zeros: the products run the full 256 × 128 shape
               with no branch a warpgroup could diverge on) */
            mbar_expect_tx(&wfull, B9_W);
            for (int mb = 0; mb < 4; mb++)
                for (int kb = 0; kb < 2; kb++) tma_load_2d(ws + (mb * 2 + kb) * 8192, &mw, &wfull, 64 * kb, 64 * mb);
            for (int j = 0; j < n; j++) {
                const int s = j % B9_STAGES, row = (int)((t0 + j) * B9_ROWS);
                mbar_wait(&empty[s], ((j / B9_STAGES) & 1) ^ 1);
                mbar_expect_tx(&full[s], B9_STAGE);
                unsigned char *st = stages + s * B9_STAGE;
                for (int q = 0; q < 4; q++) {
                    tma_load_2d(st + B9_DY + q * B9_BOX, &mdy, &full[s], 64 * q, row);
                    tma_load_2d(st + B9_PRE + q * B9_BOX, &mpre, &full[s], 64 * q, row);
                }
                for (int kb = 0; kb < 2; kb++) tma_load_2d(st + B9_X + kb * B9_BOX, &mx, &full[s], 64 * kb, row);
            }
            return;
        }
        if (threadIdx.x < 32) return;
        /* ------------------------------------------- g helpers: warps 1–3 as g warps 8–10 */
        const int gw = 7 + threadIdx.x / 32;
        if (n > 0) tile_g<T, ACT>(stages, full, 0, a.nmb, lane, gw, dbs);
        for (int j = 0; j < n; j++) { /* in step with the consumers' loop */
            g_sync();
            if (j + 1 < n) tile_g<T, ACT>(stages, full, j + 1, a.nmb, lane, gw, dbs);
        }
        end_sync(); /* db's sums: see the end of the consumers' walk */
        if (a.part_b) stash_db(reinterpret_cast<float *>(stages), a.nmb, lane, gw, dbs);
        end_sync();
        return;
    }
    /* -------------------------------------------------------- consumers: warpgroups 1, 2 */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::);
    const int c = wg - 1, ct = threadIdx.x - 128, gw = ct >> 5, wq = gw & 3;
    const bool dx_on = c < a.nkb; /* (its columns exist) */
    float dxa[32], dwa[128];
#pragma unroll
    for (int i = 0; i < 128; i++) dwa[i] = 0.f;
    mbar_wait(&wfull, 0);
    if (n > 0) tile_g<T, ACT>(stages, full, 0, a.nmb, lane, gw, dbs);
    for (int j = 0; j < n; j++) {
        const int s = j % B9_STAGES;
        const unsigned char *st = stages + s * B9_STAGE;
        g_sync(); /* every g warp's rows of tile j: the stage's pre boxes are free */
        if (a.accumulate && ct == 0) { /* the old dx tile into them */
            unsigned char *od = stages + s * B9_STAGE + B9_DXO;
            mbar_expect_tx(&dxfull[s], a.nkb * B9_BOX);
            for (int kb = 0; kb < a.nkb; kb++) tma_load_2d(od + kb * B9_BOX, &mdx, &dxfull[s], 64 * kb, (int)((t0 + j) * B9_ROWS));
        }
        acc_fence(dxa, 32);
        acc_fence(dwa, 128);
        wgmma_fence();
        /* dx[32 (64) × 64] = g[·, M] · w[M, 64c …]: K-major A steps 32 bytes, MN-major B 16 rows */
#pragma unroll
        for (int r = 0; r < 4 * (B9_MAX_M / 64); r++)
            wgmma_run<64, T, 0, 1>(dxa, wgmma_desc_sw128(st + B9_DY + (r >> 2) * B9_BOX) + (r & 3) * 2,
                                       wgmma_desc_mn_sw128(ws + ((r >> 2) * 2 + c) * 8192 + (r & 3) * 2048, 8192), r > 0);
#pragma unroll
        for (int h = 0; h < 2; h++) /* dW[128c + 64h …, 0 … 127] += gᵀ · x over the tile's 32 rows */
#pragma unroll
            for (int kk = 0; kk < B9_ROWS / 16; kk++)
                wgmma_run<128, T, 1, 1>(dwa + 64 * h, wgmma_desc_mn_sw128(st + B9_DY + (2 * c + h) * B9_BOX + kk * 2048, 8192),
                                            wgmma_desc_mn_sw128(st + B9_X + kk * 2048, B9_BOX), 1);
        wgmma_commit();
        if (j + 1 < n) tile_g<T, ACT>(stages, full, j + 1, a.nmb, lane, gw, dbs); /* while the tensor cores run */
        wgmma_wait<0>();
        acc_fence(dxa, 32);
        acc_fence(dwa, 128);
        if (dx_on && wq < 2) { /* rows 0–31 of the m64 product */
            const unsigned char *od = st + B9_DXO + c * B9_BOX; /* the old dx, 128-byte swizzled */
            if (a.accumulate) mbar_wait(&dxfull[s], (j / B9_STAGES) & 1);
            const int64_t row = (t0 + j) * B9_ROWS + wq * 16 + (lane >> 2);
            T *dx = static_cast<T *>(a.dx);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (row + 8 * h >= a.rows) continue;
                const int rr = wq * 16 + (lane >> 2) + 8 * h;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const int col = 64 * c + 8 * i + 2 * (lane & 3);
                    if (col >= a.k) continue;
                    T *o = dx + (row + 8 * h) * a.k + col;
                    float v0 = dxa[4 * i + 2 * h], v1 = dxa[4 * i + 2 * h + 1];
                    if (a.accumulate) {
                        const vec_t<T, 2> old =
                            *reinterpret_cast<const vec_t<T, 2> *>(od + rr * 128 + ((i ^ (rr & 7)) << 4) + 4 * (lane & 3));
                        v0 += to_acc(old.v[0]), v1 += to_acc(old.v[1]);
                    }
                    from_acc2<T>(v0, v1, o);
                }
            }
        }
        mbar_arrive(&empty[s]); /* (after the old dx is read: the producer refills the stage) */
    }
    /* this slab's dW: warpgroup c's rows 128c + 64h + 16·wq + lane / 4 (+ 8) */
    float *pw = a.part_w + (int64_t)blockIdx.x * a.cols * a.k;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int m = 128 * c + 64 * h + 16 * wq + (lane >> 2) + 8 * hh;
            if (m >= a.cols) continue;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int kk = 8 * i + 2 * (lane & 3);
                if (kk < a.k)
                    *reinterpret_cast<float2 *>(pw + (int64_t)m * a.k + kk) =
                        make_float2(dwa[64 * h + 4 * i + 2 * hh], dwa[64 * h + 4 * i + 2 * hh + 1]);
            }
        }
    /* db's slab sums: over the 11 g warps in order, through stage 0's memory */
    end_sync(); /* every product that read the stages is done (and every g) */
    float *red = reinterpret_cast<float *>(stages);
    if (a.part_b) stash_db(red, a.nmb, lane, gw, dbs);
    end_sync();
    if (a.part_b) {
        if (ct < a.cols) {
            float t = 0.f;
            for (int g = 0; g < B9_GW; g++) t += red[g * 256 + ct];
            a.part_b[(int64_t)blockIdx.x * a.cols + ct] = t;
        }
    }
#endif
}

/* ------------------------------------------------------------------ host */

/* The kernel exists only in an sm_90a build and runs on a 9.0 device; f16 / bf16; K ≤ 128 and
 * M ≤ 256, both multiples of 8 (TMA's 16-byte row strides). Running, every pointer must also be
 * 16-byte aligned and pre kept (the driver checks both). */
extern "C" bool fg_cuda_act_bwd90_fits(int device, fg_dtype dtype, int64_t k, int64_t cols) {
#ifdef FG_CUDA_HAVE_SM90A
    return (dtype == FG_F16 || dtype == FG_BF16) && k >= 8 && k <= B9_MAX_K && k % 8 == 0 && cols >= 8 &&
           cols <= B9_MAX_M && cols % 8 == 0 && fg_cuda_is_sm90(device);
#else
    (void)device, (void)dtype, (void)k, (void)cols;
    return false;
#endif
}

template <typename T, int ACT>
static cudaError_t b9_launch(const CUtensorMap *maps, const b9_args &a, int64_t slabs, cudaStream_t s) {
    auto kernel = act_bwd90_kernel<T, ACT>;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)B9_SMEM);
    if (e != cudaSuccess) return e;
    kernel<<<(unsigned)slabs, B9_THREADS, B9_SMEM, s>>>(maps[0], maps[1], maps[2], maps[3], maps[4], a);
    return cudaGetLastError();
}

/* TILE_BACKWARD's contract with pre kept: scratch from fg_cuda_act_bwd_tile_scratch (the same
   32-row tiles and slabs) */
extern "C" fg_status fg_cuda_act_bwd90(fg_context *ctx, const fg_act_call *c) {
    if (!fg_cuda_act_bwd90_fits(ctx->device, c->dtype, c->k, c->cols) || !c->dx || !c->pre || c->rows < 1 ||
        c->rows > INT32_MAX - B9_ROWS)
        return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: the sm_90a backward does not take rows=%lld K=%lld M=%lld",
                       (long long)c->rows, (long long)c->k, (long long)c->cols);
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    int64_t parts = 0, per = 0; /* (the scratch's layout: fg_cuda_act_bwd_tile_scratch) */
    fg_cuda_act_slabs(ctx->device, c->rows, &parts, &per);
    b9_args a;
    a.dx = c->dx;
    a.part_w = (float *)c->scratch;
    a.part_b = c->db_acc ? a.part_w + parts * c->cols * c->k : nullptr;
    a.rows = c->rows, a.tiles = (c->rows + B9_ROWS - 1) / B9_ROWS;
    a.per = per;
    a.k = (int)c->k, a.cols = (int)c->cols, a.nkb = (a.k + 63) / 64, a.nmb = (a.cols + 63) / 64;
    a.accumulate = c->accumulate;
    const bool bf = c->dtype == FG_BF16;
    CUtensorMap maps[5];
    if (!tma_map_2d(&maps[0], c->dy, c->rows, c->cols, B9_ROWS, bf) || !tma_map_2d(&maps[1], c->pre, c->rows, c->cols, B9_ROWS, bf) ||
        !tma_map_2d(&maps[2], c->x, c->rows, c->k, B9_ROWS, bf) || !tma_map_2d(&maps[3], c->w, c->cols, c->k, 64, bf) ||
        !tma_map_2d(&maps[4], c->accumulate ? c->dx : c->x, c->rows, c->k, B9_ROWS, bf))
        return fg_fail(FG_ERR_BACKEND, "cuda linear_act: cuTensorMapEncodeTiled refused an operand (rows=%lld K=%lld M=%lld)",
                       (long long)c->rows, (long long)c->k, (long long)c->cols);
    cudaError_t e = with_grad_act(c->act, [&](auto f) {
        constexpr int ACT = decltype(f)::value;
        if constexpr (ACT == FG_ACT_NONE) return cudaErrorInvalidValue; /* (none: the driver runs plain GEMMs) */
        else return bf ? b9_launch<__nv_bfloat16, ACT>(maps, a, parts, s) : b9_launch<__half, ACT>(maps, a, parts, s);
    });
    if (e == cudaSuccess && a.part_b) e = slab_colsum(a.part_b, parts, c->cols, (float *)c->db_acc, c->first, s);
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act sm_90a backward");
}

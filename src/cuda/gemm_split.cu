/*
 * gemm_split.cu — f32 products on Hopper's tensor cores at f32 accuracy (sm_90a), for the
 * products of narrow layers over many tokens: c [m, n] = alpha·a·b + beta·c + bias with a
 * [m, k] row-major (the activations, large) and b [k, n] small (the layer's weight, either
 * orientation).
 * How: each operand is split into two TF32 pieces, x = hi + lo (hi = x rounded to TF32, lo = the
 * rest rounded to TF32), and c = a_hi·b_hi + a_hi·b_lo + a_lo·b_hi (the lo·lo term lies below
 * f32's rounding) as three tensor-core passes. A pre-pass writes b's two pieces, n-major and
 * K-contiguous ([2][n_pad][k_pad], zero-padded), into the plan's workspace. The kernel:
 * persistent blocks of three warpgroups over 128 × 128 output tiles; one producer thread loads
 * 32-deep K slices of a and of both b pieces by TMA (128-byte swizzle) into three stages; each
 * consumer warpgroup (64 rows) reads its a fragments from shared memory, splits them in
 * registers and runs three wgmma m64n128k8 with a in registers per 8-deep step, the small terms
 * first. The tensor cores' own f32 sums do not round to nearest, so one long sum's error grows
 * with k; a slice's three passes go to a fresh accumulator that is then added to the tile's
 * in f32 (round to nearest), which keeps the error at the f32 products' level for any k.
 * The epilogue (alpha, beta, bias) stages each warpgroup's rows in shared memory and leaves them
 * to TMA stores, so the consumers start the next tile while the copy engine writes (at these
 * shapes the output has as many bytes as a, or more); with beta ≠ 0 the old c comes into the same
 * boxes by TMA at the tile's start. Where TMA cannot address c, each thread reads and stores its
 * elements. Each element is one block's sum in a fixed order: deterministic.
 * Non-finite inputs: an infinite element, or a finite one of size ≥ (2 − 2^-11)·2^127 (its TF32
 * rounding overflows), gives NaN where an f32 product gives ±Inf (the pieces' products meet Inf·0).
 * The weight gradient (dW = dyᵀ·x over the tokens: both operands MN-major, which TF32 wgmma does
 * not read) has its own kernel below: the consumers transpose and split x's slices in shared
 * memory, blocks take ranges of the tokens and a finish sums the ranges in order.
 * Why: at narrow layers' reduction lengths (k 128–384, PatchTST) cuBLAS's f32 products run on
 * the CUDA cores at 35–50 TFLOP/s; three TF32 passes have ≈ 165 TFLOP/s of tensor-core ceiling,
 * so the products become bound by their bytes (docs/decisions.md, perf-notes 24). gemm.cu
 * chooses this kernel (fg_cuda_split_takes) and falls back to cuBLASLt elsewhere.
 */
#include "cuda_internal.h"
#include "sm90.cuh"

#include <string.h>

constexpr int SP_BM = 128, SP_BN = 128, SP_BK = 32, SP_STAGES = 3, SP_THREADS = 384;
constexpr int SP_TILE = SP_BM * SP_BK * 4; /* a's slice, or one b piece's: 128 rows of 128 bytes */
constexpr int SP_STAGE = 3 * SP_TILE;
constexpr int SP_OUT = 64 * SP_BN * 4; /* a consumer warpgroup's 64 output rows, as four 64 × 32 boxes */
/* the stages, then each consumer warpgroup's staged output rows; + alignment */
constexpr size_t SP_SMEM = (size_t)SP_STAGES * SP_STAGE + 2 * SP_OUT + 1024;
static_assert(SP_BM == SP_BN, "a's and b's boxes share one shape");

struct sp_args {
    float *c;
    const float *bias;
    int64_t ldc, bias_cs; /* (a bias along the columns) */
    int m, n, k, n_pad, tiles_c, tiles;
    float alpha, beta;
};

__device__ __forceinline__ uint32_t sp_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

/* b's pieces: out[0][j][i] = hi, out[1][j][i] = lo of b(i, j) = b[i·rs + j·cs], zero past k, n */
__global__ void split_b_kernel(const float *b, int64_t rs, int64_t cs, int k, int n, int k_pad, int n_pad, float *out) {
    const int64_t total = (int64_t)n_pad * k_pad;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(e / k_pad), i = (int)(e % k_pad);
        const float x = j < n && i < k ? b[i * rs + j * cs] : 0.f;
        const float hi = __uint_as_float(sp_tf32(x));
        out[e] = hi;
        out[total + e] = __uint_as_float(sp_tf32(x - hi));
    }
}

__device__ __forceinline__ void sp_wg_sync(int c) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory"); }

/* TSTORE: the tile leaves through shared memory by TMA stores (c's map mc), so the consumers go
   on to the next tile while the copy engine writes; BETA (with TSTORE): the old c comes in by
   TMA into the same boxes at the tile's start. Otherwise each thread reads and stores its
   elements (a c that TMA cannot address). */
template <bool TSTORE, bool BETA>
__global__ void __launch_bounds__(SP_THREADS, 1)
    split_gemm_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                      const __grid_constant__ CUtensorMap mc, sp_args p) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    extern __shared__ unsigned char raw[];
    __shared__ __align__(8) uint64_t full[SP_STAGES], empty[SP_STAGES], cold[2];
    unsigned char *smem = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    const int wg = threadIdx.x / 128, ktiles = (p.k + SP_BK - 1) / SP_BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < SP_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 256);
        mbar_init(&cold[0], 1), mbar_init(&cold[1], 1);
        mbar_init_fence();
        tma_prefetch_map(&ma);
        tma_prefetch_map(&mb);
        if (TSTORE) tma_prefetch_map(&mc);
    }
    __syncthreads();
    if (wg == 0) { /* ------------------------------------------------------- producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int s = 0;
            uint32_t ph = 0;
            for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
                const int tr = t / p.tiles_c, tc = t % p.tiles_c;
                for (int kt = 0; kt < ktiles; kt++) {
                    mbar_wait(&empty[s], ph ^ 1);
                    mbar_expect_tx(&full[s], SP_STAGE);
                    unsigned char *st = smem + s * SP_STAGE;
                    tma_load_2d(st, &ma, &full[s], kt * SP_BK, tr * SP_BM);
                    tma_load_2d(st + SP_TILE, &mb, &full[s], kt * SP_BK, tc * SP_BN);
                    tma_load_2d(st + 2 * SP_TILE, &mb, &full[s], kt * SP_BK, p.n_pad + tc * SP_BN);
                    if (++s == SP_STAGES) s = 0, ph ^= 1;
                }
            }
        }
        return;
    }
    /* ------------------------------------------------- consumers: warpgroup c, rows 64c … 64c + 63 */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x & 127) >> 5, t4 = lane & 3;
    const int r0 = c * 64 + warp * 16 + (lane >> 2); /* this thread's rows r0, r0 + 8 of the tile (r0 % 8 = lane / 4) */
    const int sw = lane >> 2;                        /* the rows' 128-byte swizzle phase */
    const int tid = threadIdx.x & 127;
    unsigned char *out = smem + SP_STAGES * SP_STAGE + c * SP_OUT; /* TSTORE: this warpgroup's boxes */
    float acc[64], part[64];
    int s = 0;
    uint32_t ph = 0, cph = 0;
    for (int t = blockIdx.x; t < p.tiles; t += gridDim.x, cph ^= 1) {
        const int tr = t / p.tiles_c, tc = t % p.tiles_c;
        if (BETA && tid == 0) { /* the old c, once the last tile's stores have read the boxes */
            tma_store_wait_read<0>();
            mbar_expect_tx(&cold[c], SP_OUT);
            for (int q = 0; q < 4; q++) tma_load_2d(out + q * 8192, &mc, &cold[c], tc * SP_BN + 32 * q, tr * SP_BM + 64 * c);
        }
        for (int kt = 0; kt < ktiles; kt++) {
            mbar_wait(&full[s], ph);
            const unsigned char *st = smem + s * SP_STAGE;
            /* a's fragments of the slice's four 8-deep steps, split: element (row, k) sits in
               16-byte chunk (k / 4) ^ (row % 8) of the row's 128 bytes */
            uint32_t hi[4][4], lo[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + (e & 1) * 8, chunk = 2 * j + (e >> 1);
                    const float x = *reinterpret_cast<const float *>(st + row * 128 + ((chunk ^ sw) << 4) + t4 * 4);
                    hi[j][e] = sp_tf32(x);
                    lo[j][e] = sp_tf32(x - __uint_as_float(hi[j][e]));
                }
            const uint64_t dh = wgmma_desc_sw128(st + SP_TILE), dl = wgmma_desc_sw128(st + 2 * SP_TILE);
            acc_fence(part, 64);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 4; j++) { /* (a k-step of 8 is 32 bytes: 2 in the descriptor) */
                wgmma_tf32_rs128(part, hi[j], dl + 2 * j, j > 0);
                wgmma_tf32_rs128(part, lo[j], dh + 2 * j, 1);
                wgmma_tf32_rs128(part, hi[j], dh + 2 * j, 1);
            }
            wgmma_commit();
            wgmma_wait<0>();
            acc_fence(part, 64);
            mbar_arrive(&empty[s]); /* the stage's a was read into registers, b by the finished wgmmas */
            if (++s == SP_STAGES) s = 0, ph ^= 1;
            if (kt == 0) {
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] = part[i];
            } else {
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] += part[i];
            }
        }
        /* c = alpha·acc + beta·c + bias: acc[4i + 2h + e] is row r0 + 8h, column 8i + 2·t4 + e */
        float bias[16][2];
#pragma unroll
        for (int i = 0; i < 16; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = tc * SP_BN + 8 * i + 2 * t4 + e;
                bias[i][e] = p.bias && col < p.n ? p.bias[col * p.bias_cs] : 0.f;
            }
        if constexpr (TSTORE) {
            /* into this warpgroup's four 64 × 32 boxes, 128-byte swizzled like TMA's: row r's
               16-byte chunk q sits at chunk q ^ (r % 8); then one thread stores them */
            if (BETA) {
                mbar_wait(&cold[c], cph); /* (each thread then rewrites only the elements it read) */
            } else {
                if (tid == 0) tma_store_wait_read<0>(); /* the last tile's stores have read the boxes */
                sp_wg_sync(c);
            }
#pragma unroll
            for (int i = 0; i < 16; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = warp * 16 + (lane >> 2) + 8 * h, chunk = 2 * (i & 3) + (t4 >> 1);
                    float2 *at = reinterpret_cast<float2 *>(out + (i >> 2) * 8192 + row * 128 + ((chunk ^ sw) << 4) + (t4 & 1) * 8);
                    float2 v = make_float2(p.alpha * acc[4 * i + 2 * h] + bias[i][0], p.alpha * acc[4 * i + 2 * h + 1] + bias[i][1]);
                    if (BETA) {
                        const float2 o = *at;
                        v.x += p.beta * o.x, v.y += p.beta * o.y;
                    }
                    *at = v;
                }
            tma_store_fence();
            sp_wg_sync(c);
            if (tid == 0) {
                for (int q = 0; q < 4; q++) tma_store_2d(&mc, out + q * 8192, tc * SP_BN + 32 * q, tr * SP_BM + 64 * c);
                tma_store_commit();
            }
        } else {
            const bool pairs = (p.ldc & 1) == 0 && ((uintptr_t)p.c & 7) == 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t row = (int64_t)tr * SP_BM + r0 + 8 * h;
                if (row >= p.m) continue;
                float *crow = p.c + row * p.ldc;
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const int col = tc * SP_BN + 8 * i + 2 * t4;
                    float v[2] = {p.alpha * acc[4 * i + 2 * h] + bias[i][0], p.alpha * acc[4 * i + 2 * h + 1] + bias[i][1]};
                    if (pairs && col + 1 < p.n) {
                        if (p.beta != 0.f) {
                            const float2 o = *reinterpret_cast<const float2 *>(crow + col);
                            v[0] += p.beta * o.x, v[1] += p.beta * o.y;
                        }
                        *reinterpret_cast<float2 *>(crow + col) = make_float2(v[0], v[1]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            if (col + e < p.n) {
                                if (p.beta != 0.f) v[e] += p.beta * crow[col + e];
                                crow[col + e] = v[e];
                            }
                    }
                }
            }
        }
    }
    if (TSTORE && (threadIdx.x & 127) == 0) tma_store_wait_all();
#endif
}

/* ------------------------------------------------------------------ weight gradients */

/* c [m, n] = alpha·Σ_t g(t, i)·x(t, j) + beta·c over a long t (a layer's dW = dyᵀ·x: g [k, m] and
   x [k, n] row-major): each block takes one 128 × 128 output tile and one of `parts` consecutive
   t ranges (whole 32-deep slices), its partial sums go to the workspace and a finish adds them in
   range order (deterministic). TF32 wgmma reads B K-major only, so the consumers transpose and
   split each x slice in shared memory themselves (hi and lo tiles, two buffers alternating); g's
   fragments come from its slice into registers, split there (A in registers). The producer loads
   each slice as four 32 × 32 boxes of g and of x (128-byte swizzle). */
constexpr int SW_BOX = 32 * 32 * 4;      /* one 32 × 32 box of a slice */
constexpr int SW_STAGE = 8 * SW_BOX;     /* g's four boxes, then x's */
constexpr int SW_B = SP_BN * SP_BK * 4;  /* one transposed x piece: 128 rows (j) of 32 t */
constexpr size_t SW_SMEM = (size_t)SP_STAGES * SW_STAGE + 4 * SW_B + 1024;

struct sw_args {
    float *part;            /* [parts][tiles_m·128][tiles_n·128] */
    int k, chunk, parts, tiles_m, tiles_n;
};

__device__ __forceinline__ void sw_sync() { asm volatile("bar.sync 3, 256;\n" ::: "memory"); }

__global__ void __launch_bounds__(SP_THREADS, 1)
    split_wgrad_kernel(const __grid_constant__ CUtensorMap mg, const __grid_constant__ CUtensorMap mx, sw_args p) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    extern __shared__ unsigned char raw[];
    __shared__ __align__(8) uint64_t full[SP_STAGES], empty[SP_STAGES];
    unsigned char *smem = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    unsigned char *bt = smem + SP_STAGES * SW_STAGE; /* [2 buffers][hi, lo] transposed x pieces */
    const int wg = threadIdx.x / 128;
    const int tile = blockIdx.x / p.parts, range = blockIdx.x % p.parts;
    const int tr = tile / p.tiles_n, tc = tile % p.tiles_n;
    const int t0 = range * p.chunk, t1 = p.k - t0 < p.chunk ? p.k : t0 + p.chunk; /* (no int overflow near INT32_MAX) */
    const int slices = t1 > t0 ? (t1 - t0 + SP_BK - 1) / SP_BK : 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < SP_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 256);
        mbar_init_fence();
        tma_prefetch_map(&mg);
        tma_prefetch_map(&mx);
    }
    __syncthreads();
    if (wg == 0) { /* ------------------------------------------------------- producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int s = 0;
            uint32_t ph = 0;
            for (int kt = 0; kt < slices; kt++) {
                mbar_wait(&empty[s], ph ^ 1);
                mbar_expect_tx(&full[s], SW_STAGE);
                unsigned char *st = smem + s * SW_STAGE;
                for (int q = 0; q < 4; q++) {
                    tma_load_2d(st + q * SW_BOX, &mg, &full[s], tr * SP_BM + 32 * q, t0 + kt * SP_BK);
                    tma_load_2d(st + (4 + q) * SW_BOX, &mx, &full[s], tc * SP_BN + 32 * q, t0 + kt * SP_BK);
                }
                if (++s == SP_STAGES) s = 0, ph ^= 1;
            }
        }
        return;
    }
    /* ---------------------------------- consumers: warpgroup c, output rows (g's columns) 64c … 64c + 63 */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x & 127) >> 5, t4 = lane & 3;
    const int u = threadIdx.x - 128;        /* 0 … 255: the transposing thread's x column and t half */
    const int xj = u & 127, xh = u >> 7;
    const int gi = c * 64 + warp * 16 + (lane >> 2); /* this thread's A rows gi, gi + 8 (g's columns) */
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    int s = 0;
    uint32_t ph = 0;
    for (int kt = 0; kt < slices; kt++) {
        mbar_wait(&full[s], ph);
        const unsigned char *st = smem + s * SW_STAGE;
        unsigned char *bh = bt + (kt & 1) * 2 * SW_B, *bl = bh + SW_B;
        {   /* x(t, xj) for t = 16·xh … 16·xh + 15 → rows xj of the hi and lo pieces, 4 t a 16-byte chunk;
               element (t, j) of a box at t·128 + ((j / 4) ^ (t % 8))·16 + (j % 4)·4 */
            const unsigned char *xb = st + (4 + (xj >> 5)) * SW_BOX;
            const int col = xj & 31;
#pragma unroll
            for (int q4 = 0; q4 < 4; q4++) {
                float4 h, l;
                float *hp = &h.x, *lp = &l.x;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = 16 * xh + 4 * q4 + e;
                    const float x = *reinterpret_cast<const float *>(xb + t * 128 + (((col >> 2) ^ (t & 7)) << 4) + (col & 3) * 4);
                    hp[e] = __uint_as_float(sp_tf32(x));
                    lp[e] = __uint_as_float(sp_tf32(x - hp[e]));
                }
                const int chunk = 4 * xh + q4, off = xj * 128 + ((chunk ^ (xj & 7)) << 4);
                *reinterpret_cast<float4 *>(bh + off) = h;
                *reinterpret_cast<float4 *>(bl + off) = l;
            }
        }
        tma_store_fence(); /* the pieces (generic writes) visible to wgmma (the async proxy) */
        sw_sync();         /* every x column transposed (and both warpgroups past the last slice's wgmmas) */
        /* g's fragments: A(row gi (+8), t) = g(t, gi) in box gi / 32 */
        uint32_t hi[4][4], lo[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = gi + (e & 1) * 8, t = 8 * j + t4 + (e >> 1) * 4, col = row & 31;
                const float x = *reinterpret_cast<const float *>(st + (row >> 5) * SW_BOX + t * 128 +
                                                                  (((col >> 2) ^ (t & 7)) << 4) + (col & 3) * 4);
                hi[j][e] = sp_tf32(x);
                lo[j][e] = sp_tf32(x - __uint_as_float(hi[j][e]));
            }
        const uint64_t dh = wgmma_desc_sw128(bh), dl = wgmma_desc_sw128(bl);
        acc_fence(part, 64);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; j++) {
            wgmma_tf32_rs128(part, hi[j], dl + 2 * j, j > 0);
            wgmma_tf32_rs128(part, lo[j], dh + 2 * j, 1);
            wgmma_tf32_rs128(part, hi[j], dh + 2 * j, 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        acc_fence(part, 64);
        mbar_arrive(&empty[s]);
        if (++s == SP_STAGES) s = 0, ph ^= 1;
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] += part[i];
    }
    /* the range's partial tile: acc[4i + 2h + e] is row gi + 8h, column 8i + 2·t4 + e */
    const int64_t ld = (int64_t)p.tiles_n * SP_BN;
    float *out = p.part + (int64_t)range * p.tiles_m * SP_BM * ld;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float *row = out + ((int64_t)tr * SP_BM + gi + 8 * h) * ld + (int64_t)tc * SP_BN;
#pragma unroll
        for (int i = 0; i < 16; i++)
            *reinterpret_cast<float2 *>(row + 8 * i + 2 * t4) = make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
    }
#endif
}

/* c = alpha·Σ_range part[range] + beta·c, the ranges in order */
__global__ void split_wgrad_finish(const float *part, int parts, int64_t part_stride, int64_t ld, float *c, int64_t ldc,
                                   int m, int n, float alpha, float beta) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < (int64_t)m * n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / n, j = e % n;
        float s = 0.f;
        for (int r = 0; r < parts; r++) s += part[r * part_stride + i * ld + j];
        float v = alpha * s;
        if (beta != 0.f) v += beta * c[i * ldc + j];
        c[i * ldc + j] = v;
    }
}

/* ------------------------------------------------------------------ host */

static int64_t sp_pad(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

/* the workspace b's pieces take: [2][n_pad][k_pad] f32 */
static size_t sp_workspace(const fg_gemm *g) {
    return (size_t)2 * (size_t)sp_pad(g->n, SP_BN) * (size_t)sp_pad(g->k, 4) * sizeof(float);
}

/* Whether the split kernel takes the problem: an sm_90a build on a 9.0 device; f32 without the
   caller's TF32 consent (with it, cuBLASLt's one TF32 pass is faster), one matrix, no
   activation or other epilogue, a bias (if any) along the columns; a row-major with a row stride
   of whole 16 bytes (TMA), c row-major; at least a full wave of 128 × 128 tiles, k ≥ 64 and
   n ≥ 64 (a narrower c would leave most of each tile's products on zero columns); b
   small beside a (m ≥ 8·n_pad: its pre-pass then writes at most a quarter of a's bytes).
   Running, a must be 16-byte aligned too. */
extern "C" bool fg_cuda_split_takes(int device, const fg_gemm *g, bool run) {
#ifdef FG_CUDA_HAVE_SM90A
    if (g->dtype != FG_F32 || g->allow_tf32 || g->batch != 1 || g->c_f32 || g->act) return false;
    if (g->epi.has_aux || g->epi.slope || g->epi.form || g->epi.col_sums || g->epi.drop) return false;
    if (g->a.operand == FG_OPERAND_ONES || g->b.operand == FG_OPERAND_ONES) return false;
    if ((g->bias_operand >= 0 || g->bias) && g->bias_rs != 0) return false; /* (a bias along the columns only) */
    if (g->a.cs != 1 || g->a.rs < g->k || g->a.rs % 4 != 0 || g->c.cs != 1 || g->c.rs < g->n) return false;
    if (g->align && g->align < 16) return false;
    if (g->k < 64 || g->k > (1 << 24) || g->n < 64 || g->n > (1 << 16) || g->m > INT32_MAX - SP_BM) return false;
    const int64_t n_pad = sp_pad(g->n, SP_BN);
    if (g->m < 8 * n_pad) return false;
    if (!fg_cuda_is_sm90(device)) return false;
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) return false;
    const int64_t tiles = sp_pad(g->m, SP_BM) / SP_BM * (n_pad / SP_BN);
    if (tiles < sms || tiles > INT32_MAX) return false;
    if (run && (uintptr_t)g->a.data % 16 != 0) return false;
    return true;
#else
    (void)device, (void)g, (void)run;
    return false;
#endif
}

extern "C" fg_status fg_cuda_split_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                                        size_t ws_bytes, bool run) {
    snprintf(info->name, sizeof info->name, "split_tf32_gemm90(128x128,3 passes)");
    info->workspace_bytes = sp_workspace(g) + 16; /* (+16: a workspace given at any address is aligned up) */
    info->deterministic = true;
    info->accumulator = FG_F32;
    info->act_fused = false;
    if (!run) return FG_OK;
    if (!ws || ws_bytes < info->workspace_bytes)
        return fg_fail(FG_ERR_INTERNAL, "cuda gemm: the split f32 product's workspace is short");
    cudaStream_t stream = ctx->cuda->stream;
    sp_args p;
    memset(&p, 0, sizeof p);
    p.m = (int)g->m, p.n = (int)g->n, p.k = (int)g->k;
    const int k_pad = (int)sp_pad(g->k, 4);
    p.n_pad = (int)sp_pad(g->n, SP_BN);
    p.tiles_c = p.n_pad / SP_BN;
    p.tiles = (int)(sp_pad(g->m, SP_BM) / SP_BM) * p.tiles_c;
    p.c = static_cast<float *>(g->c.data);
    p.ldc = g->c.rs;
    p.bias = static_cast<const float *>(g->bias);
    p.bias_cs = g->bias_cs;
    p.alpha = (float)g->alpha, p.beta = (float)g->beta;
    float *pieces = reinterpret_cast<float *>(((uintptr_t)ws + 15) & ~(uintptr_t)15);
    /* c by TMA (stores, and loads of the old c when beta ≠ 0) where it can: rows of whole 16
       bytes, 16-byte aligned */
    const bool tstore = g->c.rs % 4 == 0 && (uintptr_t)g->c.data % 16 == 0, beta = p.beta != 0.f;
    CUtensorMap maps[3];
    if (!tma_map_2d_f32(&maps[0], g->a.data, g->m, g->k, g->a.rs, SP_BM) ||
        !tma_map_2d_f32(&maps[1], pieces, 2 * (int64_t)p.n_pad, k_pad, k_pad, SP_BN) ||
        (tstore && !tma_map_2d_f32(&maps[2], g->c.data, g->m, g->n, g->c.rs, 64)))
        return fg_fail(FG_ERR_BACKEND, "cuda gemm: cuTensorMapEncodeTiled refused an operand of the split f32 product (m=%lld k=%lld n=%lld)",
                       (long long)g->m, (long long)g->k, (long long)g->n);
    if (!tstore) maps[2] = maps[0]; /* (not read) */
    const int64_t total = (int64_t)p.n_pad * k_pad;
    const int pre_blocks = (int)((total + 255) / 256 < 1024 ? (total + 255) / 256 : 1024);
    split_b_kernel<<<pre_blocks, 256, 0, stream>>>(static_cast<const float *>(g->b.data), g->b.rs, g->b.cs, p.k, p.n,
                                                   k_pad, p.n_pad, pieces);
    cudaError_t e = cudaGetLastError();
    int sms = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device);
    auto kernel = !tstore ? split_gemm_kernel<false, false> : beta ? split_gemm_kernel<true, true> : split_gemm_kernel<true, false>;
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SP_SMEM);
    if (e == cudaSuccess) {
        kernel<<<p.tiles < sms ? p.tiles : sms, SP_THREADS, SP_SMEM, stream>>>(maps[0], maps[1], maps[2], p);
        e = cudaGetLastError();
    }
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "split f32 GEMM");
}

/* The weight-gradient form: f32 on an sm_90a build and a 9.0 device, no TF32 consent, one matrix,
   no bias or epilogue; a = gᵀ of g [k, m] and b = x [k, n], both row-major with rows of whole 16
   bytes; m, n from 64 to 1024 (a few tiles of output: the ranges fill the GPU) and a long
   reduction (k ≥ 16384); c row-major. Running, g and x 16-byte aligned. */
static int sw_parts(int device, int64_t tiles, int64_t k) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) sms = 1;
    int64_t parts = sms / tiles; /* (one block an SM: rounding up would start a second, nearly empty wave) */
    if (parts < 1) parts = 1;
    const int64_t slices = (k + SP_BK - 1) / SP_BK;
    if (parts > slices) parts = slices;
    return (int)(parts < 1 ? 1 : parts);
}

extern "C" bool fg_cuda_split_wgrad_takes(int device, const fg_gemm *g, bool run) {
#ifdef FG_CUDA_HAVE_SM90A
    if (g->dtype != FG_F32 || g->allow_tf32 || g->batch != 1 || g->c_f32 || g->act) return false;
    if (g->epi.has_aux || g->epi.slope || g->epi.form || g->epi.col_sums || g->epi.drop) return false;
    if (g->bias || g->bias_operand >= 0) return false;
    if (g->a.operand == FG_OPERAND_ONES || g->b.operand == FG_OPERAND_ONES) return false;
    if (g->a.rs != 1 || g->a.cs < g->m || g->a.cs % 4 != 0 || g->b.cs != 1 || g->b.rs < g->n || g->b.rs % 4 != 0) return false;
    if (g->c.cs != 1 || g->c.rs < g->n) return false;
    if (g->align && g->align < 16) return false;
    if (g->m < 64 || g->n < 64 || g->m > 1024 || g->n > 1024 || g->k < 16384 || g->k > INT32_MAX - 2 * SP_BK) return false;
    if (!fg_cuda_is_sm90(device)) return false;
    if (run && ((uintptr_t)g->a.data % 16 != 0 || (uintptr_t)g->b.data % 16 != 0)) return false;
    return true;
#else
    (void)device, (void)g, (void)run;
    return false;
#endif
}

extern "C" fg_status fg_cuda_split_wgrad(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                                         size_t ws_bytes, bool run) {
    const int tiles_m = (int)(sp_pad(g->m, SP_BM) / SP_BM), tiles_n = (int)(sp_pad(g->n, SP_BN) / SP_BN);
    int parts = sw_parts(ctx->device, (int64_t)tiles_m * tiles_n, g->k);
    const int chunk = (int)(sp_pad((g->k + parts - 1) / parts, SP_BK));
    parts = (int)((g->k + chunk - 1) / chunk); /* (no empty range) */
    const int64_t part_stride = (int64_t)tiles_m * SP_BM * tiles_n * SP_BN;
    snprintf(info->name, sizeof info->name, "split_tf32_wgrad90(128x128,%d ranges)", parts);
    info->workspace_bytes = (size_t)parts * (size_t)part_stride * sizeof(float) + 16; /* (+16: aligned up) */
    info->deterministic = true;
    info->accumulator = FG_F32;
    info->act_fused = false;
    if (!run) return FG_OK;
    if (!ws || ws_bytes < info->workspace_bytes)
        return fg_fail(FG_ERR_INTERNAL, "cuda gemm: the split f32 weight gradient's workspace is short");
    cudaStream_t stream = ctx->cuda->stream;
    CUtensorMap maps[2];
    if (!tma_map_2d_f32(&maps[0], g->a.data, g->k, g->m, g->a.cs, 32) || !tma_map_2d_f32(&maps[1], g->b.data, g->k, g->n, g->b.rs, 32))
        return fg_fail(FG_ERR_BACKEND, "cuda gemm: cuTensorMapEncodeTiled refused an operand of the split f32 weight gradient (m=%lld k=%lld n=%lld)",
                       (long long)g->m, (long long)g->k, (long long)g->n);
    sw_args p;
    memset(&p, 0, sizeof p);
    p.part = reinterpret_cast<float *>(((uintptr_t)ws + 15) & ~(uintptr_t)15);
    p.k = (int)g->k, p.chunk = chunk, p.parts = parts, p.tiles_m = tiles_m, p.tiles_n = tiles_n;
    cudaError_t e = cudaFuncSetAttribute(split_wgrad_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SW_SMEM);
    if (e == cudaSuccess) {
        split_wgrad_kernel<<<tiles_m * tiles_n * parts, SP_THREADS, SW_SMEM, stream>>>(maps[0], maps[1], p);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        const int64_t outs = g->m * g->n;
        const int blocks = (int)((outs + 255) / 256 < 1024 ? (outs + 255) / 256 : 1024);
        split_wgrad_finish<<<blocks, 256, 0, stream>>>(p.part, parts, part_stride, (int64_t)tiles_n * SP_BN,
                                                       static_cast<float *>(g->c.data), g->c.rs, (int)g->m, (int)g->n,
                                                       (float)g->alpha, (float)g->beta);
        e = cudaGetLastError();
    }
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "split f32 weight gradient");
}


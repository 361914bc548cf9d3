/*
 * attention_flash.cu — the attention family's tensor-core path (f16 / bf16, head dims 32, 64 and
 * 128, rows with a unit head-dim stride and 16-byte aligned, no score operands): the tiled online
 * softmax of FlashAttention-2 on mma.sync m16n8k16 or, on sm_90 at hd 64, wgmma m64n64k16 (f32
 * accumulators), for GPT-style sequences of any length.
 *
 *  forward  a block takes 64 query rows of one head (a warp 16); key tiles of 64 stream through
 *           shared memory by cp.async, two stages; S = q·kᵀ stays in registers, the running max
 *           and sum are kept per row (in log2 units), P̃ (dropped out) is rounded to the dtype
 *           and fed to P̃·v straight from S's accumulator layout. Blocks of a causal head are
 *           issued longest first.
 *  backward D = Σ do·o per row (a 16-byte vector a thread), then two kernels that each own what
 *           they write, so no float atomics and the same bits every run:
 *           dk, dv  a block owns 64 keys (a warp 16) and walks the query tiles that see them:
 *                   Sᵀ = k·qᵀ and dPᵀ = v·doᵀ, Pᵀ from lse, dSᵀ = Pᵀ ⊙ (dPᵀ − D),
 *                   dv += P̃ᵀ·do, dk += dSᵀ·q
 *           dq      a block owns 64 query rows and walks the key tiles they see: S, dP, dS as
 *                   above, dq += dS·k
 *           P recomputed in each from lse; P̃ and dS rounded to the dtype for the products, as
 *           FlashAttention does.
 * Fragment layouts (PTX ISA, mma.m16n8k16): A a0 (row g, k 2t..2t+1), a1 (g + 8, 2t), a2 (g,
 * 2t + 8), a3 (g + 8, 2t + 8); B b0 (k 2t..2t+1, col g), b1 (k 2t + 8, g); C c0 c1 (g, 2t..2t+1),
 * c2 c3 (g + 8, 2t..2t+1), with g = lane / 4 and t = lane % 4. So a C tile pair is an A operand
 * as it stands, and ldmatrix gives B from row-major k (keys × d: plain) or v / q / do / k used as
 * the k-dimension rows (trans). Shared rows are padded by 16 bytes: ldmatrix without bank
 * conflicts.
 * On sm_90 at hd 64 the same kernels run their products as warpgroup MMA (the W9 form, see
 * below): a block is one warpgroup, its accumulators in the layout above, the tiles swizzled for
 * wgmma's descriptors. Tiles whose every (query, key) pair is visible take a path without the
 * per-element mask work; dropout has kernel instances of its own, drawing one Philox block a
 * lane for eight elements (attention.cuh).
 */
#include "attention.cuh"
#include "mma.cuh"
#include "sm90.cuh"

#include <type_traits>

namespace {

constexpr int FW = 4;            /* warps a block */
constexpr int FBQ = 64;          /* query rows a block (forward, dq) */
constexpr int FBK = 64;          /* keys a tile (forward, dq) and a block (dk, dv) */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr float NEG_INF = -INFINITY;

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fc00000); }

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* `rows` rows of HD elements of view v (rows r0 …, head (b, h)) into shared memory [rows][HD + 8]
   by 16-byte cp.async; rows at or past L are zeros (k and v pass the sequence's length: its
   padded keys are zeros, so an Inf or NaN there cannot reach a product through a zero weight). */
template <typename T, int HD>
__device__ __forceinline__ void load_rows(const attn_view &v, int64_t b, int64_t h, int r0, int L, int rows, T *dst) {
    constexpr int CH = HD / 8, LDS = HD + 8;
    for (int e = threadIdx.x; e < rows * CH; e += FW * 32) {
        const int r = e / CH, c = e - r * CH;
        const bool valid = r0 + r < L;
        const T *src = at<T>(v, b, h, valid ? r0 + r : 0, 0) + c * 8;
        copy16(smem_at(dst + r * LDS + c * 8), src, valid);
    }
}

/* A operand (16 × 16 at row r0, col c0) of a row-major [..][LDS] tile */
template <typename T>
__device__ __forceinline__ void ld_a(const T *s, int lds, int r0, int c0, uint32_t a[4]) {
    const int l = threadIdx.x % 32;
    const T *p = s + (r0 + (l % 8) + 8 * ((l / 8) % 2)) * lds + c0 + 8 * (l / 16);
    ldsm4(smem_at(p), a[0], a[1], a[2], a[3]);
}

/* B operands of two n8 tiles (n0, n0 + 8) × k16 at k0 from a tile stored [n][k] (keys × d) */
template <typename T>
__device__ __forceinline__ void ld_b(const T *s, int lds, int n0, int k0, uint32_t b0[2], uint32_t b1[2]) {
    const int l = threadIdx.x % 32;
    const T *p = s + (n0 + (l % 8) + 8 * (l / 16)) * lds + k0 + 8 * ((l / 8) % 2);
    ldsm4(smem_at(p), b0[0], b0[1], b1[0], b1[1]);
}

/* B operands of two n8 tiles (n0, n0 + 8) × k16 at k0 from a tile stored [k][n] (transposed) */
template <typename T>
__device__ __forceinline__ void ld_bt(const T *s, int lds, int k0, int n0, uint32_t b0[2], uint32_t b1[2]) {
    const int l = threadIdx.x % 32;
    const T *p = s + (k0 + (l % 8) + 8 * ((l / 8) % 2)) * lds + n0 + 8 * (l / 16);
    ldsm4t(smem_at(p), b0[0], b0[1], b1[0], b1[1]);
}

/* ---- the sm_90a form (W9, hd 64): the same blocks with warpgroup MMA. A block is one warpgroup;
   every tile is 64 rows × 64 elements, rows of 128 bytes whose 16-byte chunks are swizzled (chunk c
   of row r at c ^ (r % 8), the tile 1024-byte aligned), as wgmma's 128-byte-swizzled descriptors
   read them: a tile is a K-major operand (q, k, v, do rows as a product's A or B over hd) or,
   through the MN-major descriptor, the B of the P·v-type products (keys or queries as K). */
constexpr int W9_TILE = 64 * 64; /* elements of a tile */

/* a thread copies chunk c = tid % 8 of rows tid / 8 + 16k (k < 4): one row address, then a
   fixed step (rows r + 16k share r's swizzle) */
template <typename T>
__device__ __forceinline__ void load_sw(const attn_view &v, int64_t b, int64_t h, int r0, int L, T *dst) {
    const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
    const uint32_t sdst = smem_at(dst) + r * 128 + ((c ^ (r & 7)) << 4);
    const T *base = at<T>(v, b, h, 0, 0) + 8 * c, *p = base + (int64_t)(r0 + r) * v.sl;
    const int64_t step = 16 * v.sl;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const bool valid = r0 + r + 16 * k < L;
        copy16(sdst + 2048 * k, valid ? p + k * step : base, valid);
    }
}

template <typename T, int HD, bool W9>
__device__ __forceinline__ void load_tile(const attn_view &v, int64_t b, int64_t h, int r0, int L, int rows, T *dst) {
    if constexpr (W9) load_sw<T>(v, b, h, r0, L, dst);
    else load_rows<T, HD>(v, b, h, r0, L, rows, dst);
}

/* the block's tiles: W9's 1024-byte aligned, the others at the start of dynamic shared memory */
template <bool W9> __device__ __forceinline__ unsigned char *tiles_base(unsigned char *raw) {
    if constexpr (W9) return (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    else return raw;
}

/* s (the m64n64 accumulator) = A · Bᵀ over hd 64, A and B K-major tiles (s's values before are
   not read); issued, not waited */
template <typename T> __device__ __forceinline__ void w9_abt(float (*s)[4], const T *A, const T *B) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    const uint64_t da = wgmma_desc_sw128(A), db = wgmma_desc_sw128(B);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_run<64, T, 0, 0>(&s[0][0], da + 2 * kk, db + 2 * kk, kk > 0);
#endif
}

/* acc += A · B over 64 rows of K: A in registers (af[kk] packs the source accumulator's columns
   16kk … 16kk + 15), B a tile [K rows][64] read MN-major; issued, not waited */
template <typename T> __device__ __forceinline__ void w9_ab(float (*acc)[4], const uint32_t (*af)[4], const T *B) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        wgmma_rs64<T, 1>(&acc[0][0], af[kk], wgmma_desc_mn_sw128(B + kk * 16 * 64, 64 * 128), 1);
#endif
}

/* before a batch of products: the registers they read are written */
__device__ __forceinline__ void w9_begin() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    wgmma_fence();
#endif
}
/* each thread after its cp.async copies landed, before the barrier: the tiles it wrote are
   visible to the MMA's (async) proxy (fence.proxy.async.shared::cta, sm90.cuh's name for it
   coming from the TMA stores) */
__device__ __forceinline__ void w9_tiles_visible() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    tma_store_fence();
#endif
}
/* the batch done: its accumulators are read only after this */
__device__ __forceinline__ void w9_end(float (*x)[4], float (*y)[4]) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    wgmma_commit();
    wgmma_wait<0>();
    acc_fence(&x[0][0], 32);
    if (y) acc_fence(&y[0][0], 32);
#endif
}

/* s = A1 · B1ᵀ and dp = A2 · B2ᵀ over hd, the backward's two score-shaped products (dk / dv:
   k·qᵀ and v·doᵀ; dq: q·kᵀ and do·vᵀ): A1 and A2 the block's row tiles (this warp's 16 rows of
   them for mma.sync, the warpgroup's 64 for W9), B1 and B2 tiles of NT·8 rows */
template <typename T, int HD, int NT, bool W9>
__device__ __forceinline__ void score_pair(float (*s)[4], float (*dp)[4], const T *A1, const T *B1, const T *A2,
                                           const T *B2) {
    if constexpr (W9) {
        w9_begin();
        w9_abt<T>(s, A1, B1);
        w9_abt<T>(dp, A2, B2);
        w9_end(s, dp);
    } else {
        constexpr int LDS = HD + 8;
        const int w = threadIdx.x / 32;
#pragma unroll
        for (int x = 0; x < NT; x++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[x][e] = dp[x][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a1[4], a2[4];
            ld_a(A1, LDS, 16 * w, 16 * kk, a1);
            ld_a(A2, LDS, 16 * w, 16 * kk, a2);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b0[2], b1[2];
                ld_b(B1, LDS, 16 * np, 16 * kk, b0, b1);
                mma16816<T>(s[2 * np], a1, b0);
                mma16816<T>(s[2 * np + 1], a1, b1);
                ld_b(B2, LDS, 16 * np, 16 * kk, b0, b1);
                mma16816<T>(dp[2 * np], a2, b0);
                mma16816<T>(dp[2 * np + 1], a2, b1);
            }
        }
    }
}

/* ---- dropout factors of two of a tile's column groups, 1 without dropout (DROP: the kernel
   instance for a.dropout, so the others carry none of its registers): attention.cuh's lane-shared
   draws where L % 8 == 0, keep_factor an element otherwise (the same values). Called by the whole
   warp. Rows form (forward, dq): queries i_lo, i_lo + 8; keys jb + 8·g + 2·t4 (+ 1), g = 0, 1;
   kf[4·g + 2·(row) + (key parity)]. */
template <bool DROP>
__device__ __forceinline__ void drop_rows(const attn_params &a, int64_t n, int i_lo, int jb, int t4, float kf[8]) {
    if (!DROP) {
#pragma unroll
        for (int e = 0; e < 8; e++) kf[e] = 1.f;
    } else if (a.L % 8 == 0) {
        keep_rows8(a, n, i_lo, jb, t4, kf);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) kf[e] = keep_factor(a, n, i_lo + 8 * ((e >> 1) & 1), jb + 8 * (e >> 2) + 2 * t4 + (e & 1));
    }
}
/* keys form (dk, dv): keys j_lo, j_lo + 8 (j_lo = a multiple of 16 + lane / 4), queries ib + 8·g +
   2·(lane % 4) (+ 1), g = 0, 1; kf[4·g + 2·(key) + (query parity)] */
template <bool DROP>
__device__ __forceinline__ void drop_keys(const attn_params &a, int64_t n, int j_lo, int ib, int lane, float kf[8]) {
    if (!DROP) {
#pragma unroll
        for (int e = 0; e < 8; e++) kf[e] = 1.f;
    } else if (a.L % 8 == 0) {
        keep_keys8(a, n, j_lo - (lane >> 2), ib, lane, kf);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            kf[e] = keep_factor(a, n, ib + 8 * (e >> 2) + 2 * (lane & 3) + (e & 1), j_lo + 8 * ((e >> 1) & 1));
    }
}

/* ================================================================== forward */

template <typename T, int HD, bool W9, bool DROP>
__global__ void __launch_bounds__(FW * 32) flash_fwd_kernel(attn_params a) {
    static_assert(!W9 || HD == 64, "the sm_90a form takes hd 64");
    constexpr int LDS = HD + 8, NT = FBK / 8, DT = HD / 8, QT = W9 ? W9_TILE : FBQ * LDS, KT = W9 ? W9_TILE : FBK * LDS;
    extern __shared__ __align__(16) unsigned char smraw[];
    T *Qs = reinterpret_cast<T *>(tiles_base<W9>(smraw)), *Ks = Qs + QT, *Vs = Ks + 2 * KT;
    const int L = a.L, nqb = (L + FBQ - 1) / FBQ;
    const int64_t n = blockIdx.x / nqb, b = n / a.H, h = n % a.H;
    const int qb = nqb - 1 - (int)(blockIdx.x % nqb); /* the longest causal blocks first */
    const int q0 = qb * FBQ;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    bool bad;
    const int len = seq_len(a, b, &bad);
    if (bad) {
        for (int e = threadIdx.x; e < FBQ * HD; e += FW * 32) {
            const int r = e / HD, d = e - r * HD;
            if (q0 + r < L) *at<T>(a.o, b, h, q0 + r, d) = from_acc<T>(nan_f());
        }
        for (int r = threadIdx.x; r < FBQ; r += FW * 32)
            if (q0 + r < L) a.lse[n * L + q0 + r] = nan_f();
        if (threadIdx.x == 0 && q0 == 0) raise_bad_length(a, b);
        return;
    }
    const int last = min(q0 + FBQ, L) - 1;
    const int jmax = a.causal ? min(last + 1, len) : len;
    const int ntiles = (jmax + FBK - 1) / FBK;
    load_tile<T, HD, W9>(a.q, b, h, q0, L, FBQ, Qs);
    if (ntiles > 0) {
        load_tile<T, HD, W9>(a.k, b, h, 0, len, FBK, Ks);
        load_tile<T, HD, W9>(a.v, b, h, 0, len, FBK, Vs);
    }
    copy_commit();
    if (ntiles == 0) copy_wait<0>();
    const float c = a.scale * LOG2E;
    const int i_lo = q0 + 16 * w + g, i_hi = i_lo + 8; /* this thread's two rows */
    float m2[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    float oacc[DT][4];
#pragma unroll
    for (int x = 0; x < DT; x++) oacc[x][0] = oacc[x][1] = oacc[x][2] = oacc[x][3] = 0.f;
    for (int tile = 0; tile < ntiles; tile++) {
        const int j0 = tile * FBK, buf = tile & 1;
        if (tile + 1 < ntiles) {
            load_tile<T, HD, W9>(a.k, b, h, j0 + FBK, len, FBK, Ks + (buf ^ 1) * KT);
            load_tile<T, HD, W9>(a.v, b, h, j0 + FBK, len, FBK, Vs + (buf ^ 1) * KT);
            copy_commit();
            copy_wait<1>();
        } else {
            copy_wait<0>();
        }
        if constexpr (W9) w9_tiles_visible();
        __syncthreads();
        const T *K = Ks + buf * KT, *V = Vs + buf * KT;
        float s[NT][4];
        if constexpr (!W9)
#pragma unroll
            for (int x = 0; x < NT; x++) s[x][0] = s[x][1] = s[x][2] = s[x][3] = 0.f;
        if constexpr (W9) {
            w9_begin();
            w9_abt<T>(s, Qs, K);
            w9_end(s, nullptr);
        } else {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t af[4];
                ld_a(Qs, LDS, 16 * w, 16 * kk, af);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t b0[2], b1[2];
                    ld_b(K, LDS, 16 * np, 16 * kk, b0, b1);
                    mma16816<T>(s[2 * np], af, b0);
                    mma16816<T>(s[2 * np + 1], af, b1);
                }
            }
        }
        /* scale to log2 units and mask: causal, padding, keys past L */
        const bool edge = j0 + FBK > jmax || (a.causal && j0 + FBK - 1 > q0 + 16 * w);
        float alpha[2];
        uint32_t pf[NT / 2][4];
        /* P̃ of the tile, the running max and sum; GENERAL: with the mask (a tile on a causal or
           length edge) and any scale, else without the mask's per-element work and, the scale
           positive, the max taken before scaling (the same by monotonic rounding) and the scaling
           fused into the exponent's argument; dropout in both forms where DROP */
        auto softmax_tile = [&](auto general) {
            constexpr bool GENERAL = decltype(general)::value;
            float mt[2] = {NEG_INF, NEG_INF}, mref[2];
            [[maybe_unused]] float kf[8]; /* the dropout factors of a pair of column groups */
#pragma unroll
            for (int x = 0; x < NT; x++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if constexpr (GENERAL) {
                        float v = s[x][e] * c;
                        const int i = e < 2 ? i_lo : i_hi, j = j0 + 8 * x + 2 * t4 + (e & 1);
                        if (edge && j >= (a.causal ? min(i + 1, len) : len)) v = NEG_INF;
                        s[x][e] = v;
                    }
                    mt[e / 2] = fmaxf(mt[e / 2], s[x][e]);
                }
            if constexpr (!GENERAL) mt[0] *= c, mt[1] *= c;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
                mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
                const float mn = fmaxf(m2[r], mt[r]);
                mref[r] = mn == NEG_INF ? 0.f : mn; /* no key yet: every p is 0 */
                alpha[r] = m2[r] == NEG_INF ? 0.f : ex2(m2[r] - mref[r]);
                m2[r] = mn;
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int x = 0; x < NT; x++) {
                float p[4];
                if constexpr (DROP)
                    if (x % 2 == 0) drop_rows<DROP>(a, n, i_lo, j0 + 8 * x, t4, kf);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if constexpr (GENERAL) p[e] = ex2(s[x][e] - mref[e / 2]);
                    else p[e] = ex2(fmaf(s[x][e], c, -mref[e / 2]));
                    l[e / 2] += p[e];
                    if constexpr (DROP) p[e] *= kf[4 * (x % 2) + e];
                }
                pf[x / 2][(x & 1) * 2 + 0] = pack2<T>(p[0], p[1]);
                pf[x / 2][(x & 1) * 2 + 1] = pack2<T>(p[2], p[3]);
            }
        };
        if (edge || !(c > 0.f)) softmax_tile(std::true_type{});
        else softmax_tile(std::false_type{});
#pragma unroll
        for (int x = 0; x < DT; x++) {
            oacc[x][0] *= alpha[0], oacc[x][1] *= alpha[0];
            oacc[x][2] *= alpha[1], oacc[x][3] *= alpha[1];
        }
        if constexpr (W9) {
            w9_begin();
            w9_ab<T>(oacc, pf, V);
            w9_end(oacc, nullptr);
        } else {
#pragma unroll
            for (int kk = 0; kk < NT / 2; kk++) {
                /* A of keys 16kk … 16kk + 15: tiles 2kk (a0 a1) and 2kk + 1 (a2 a3) */
                const uint32_t af[4] = {pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]};
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t b0[2], b1[2];
                    ld_bt(V, LDS, 16 * kk, 16 * dp, b0, b1);
                    mma16816<T>(oacc[2 * dp], af, b0);
                    mma16816<T>(oacc[2 * dp + 1], af, b1);
                }
            }
        }
        __syncthreads(); /* the buffer is refilled two tiles on */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = r ? i_hi : i_lo;
        if (i >= L) continue;
        const bool none = l[r] == 0.f;
        const float inv = none ? 0.f : 1.f / l[r];
        T *orow = at<T>(a.o, b, h, i, 0);
#pragma unroll
        for (int x = 0; x < DT; x++) {
            const int d = 8 * x + 2 * t4;
            from_acc2<T>(oacc[x][2 * r] * inv, oacc[x][2 * r + 1] * inv, orow + d);
        }
        if (t4 == 0) a.lse[n * L + i] = none ? NEG_INF : (m2[r] + __log2f(l[r])) * LN2;
    }
}

/* ================================================================== backward: dk, dv */

template <int HD> struct bwd_shape {
    static constexpr int BQ = HD == 128 ? 32 : 64; /* query rows a tile (dk, dv) */
};

template <typename T, int HD, bool W9, bool DROP>
__global__ void __launch_bounds__(FW * 32, W9 ? 3 : 1) flash_dkdv_kernel(attn_params a) { /* W9: 3 blocks an SM */
    static_assert(!W9 || (HD == 64 && bwd_shape<HD>::BQ == 64), "the sm_90a form takes hd 64");
    constexpr int LDS = HD + 8, BQ = bwd_shape<HD>::BQ, NT = BQ / 8, DT = HD / 8;
    constexpr int KT = W9 ? W9_TILE : FBK * LDS, QT = W9 ? W9_TILE : BQ * LDS;
    extern __shared__ __align__(16) unsigned char smraw[];
    T *Ks = reinterpret_cast<T *>(tiles_base<W9>(smraw)), *Vs = Ks + KT, *Qs = Vs + KT, *dOs = Qs + 2 * QT;
    float *lses = reinterpret_cast<float *>(dOs + 2 * QT), *Ds = lses + 2 * BQ;
    const int L = a.L, nkb = (L + FBK - 1) / FBK;
    const int64_t n = blockIdx.x / nkb, b = n / a.H, h = n % a.H;
    const int j0 = (int)(blockIdx.x % nkb) * FBK;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    bool bad;
    const int len = seq_len(a, b, &bad);
    if (bad) {
        for (int e = threadIdx.x; e < FBK * HD; e += FW * 32) {
            const int r = e / HD, d = e - r * HD;
            if (j0 + r >= L) continue;
            if (a.dk.p) *at<T>(a.dk, b, h, j0 + r, d) = from_acc<T>(nan_f());
            if (a.dv.p) *at<T>(a.dv, b, h, j0 + r, d) = from_acc<T>(nan_f());
        }
        return; /* the dq kernel raises the flag */
    }
    const int qstart = j0 >= len ? L : (a.causal ? j0 / BQ * BQ : 0);
    const int ntiles = (L - qstart + BQ - 1) / BQ;
    load_tile<T, HD, W9>(a.k, b, h, j0, len, FBK, Ks);
    load_tile<T, HD, W9>(a.v, b, h, j0, len, FBK, Vs);
    auto load_q = [&](int i0, int buf) {
        load_tile<T, HD, W9>(a.q, b, h, i0, L, BQ, Qs + buf * QT);
        load_tile<T, HD, W9>(a.dout, b, h, i0, L, BQ, dOs + buf * QT);
        for (int r = threadIdx.x; r < BQ; r += FW * 32) {
            const int i = i0 + r;
            lses[buf * BQ + r] = i < L ? a.lse[n * L + i] * LOG2E : NEG_INF;
            Ds[buf * BQ + r] = i < L ? a.D[n * L + i] : 0.f;
        }
    };
    if (ntiles > 0) load_q(qstart, 0);
    copy_commit();
    if (ntiles == 0) copy_wait<0>();
    const float c = a.scale * LOG2E;
    const int j_lo = j0 + 16 * w + g, j_hi = j_lo + 8; /* this thread's two keys */
    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int x = 0; x < DT; x++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[x][e] = dv[x][e] = 0.f;
    for (int tile = 0; tile < ntiles; tile++) {
        const int i0 = qstart + tile * BQ, buf = tile & 1;
        __syncthreads(); /* lse / D of the other buffer are no longer read */
        if (tile + 1 < ntiles) {
            load_q(i0 + BQ, buf ^ 1);
            copy_commit();
            copy_wait<1>();
        } else {
            copy_wait<0>();
        }
        if constexpr (W9) w9_tiles_visible();
        __syncthreads();
        const T *Q = Qs + buf * QT, *dO = dOs + buf * QT;
        const float *lse = lses + buf * BQ, *D = Ds + buf * BQ;
        float s[NT][4], dp[NT][4];
        score_pair<T, HD, NT, W9>(s, dp, Ks, Q, Vs, dO);
        /* element (key j: row, query i: column); GENERAL: with the mask, else a tile every pair of
           which is visible; dropout in both forms where DROP */
        uint32_t pf[NT / 2][4], df[NT / 2][4];
        auto grad_tile = [&](auto general) {
            constexpr bool GENERAL = decltype(general)::value;
            [[maybe_unused]] float kf[8]; /* the dropout factors of a pair of column groups */
#pragma unroll
            for (int x = 0; x < NT; x++) {
                float pt[4], ds[4];
                if constexpr (DROP)
                    if (x % 2 == 0) drop_keys<DROP>(a, n, j_lo, i0 + 8 * x, lane, kf);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 8 * x + 2 * t4 + (e & 1);
                    float p, kd = DROP ? kf[4 * (x % 2) + e] : 1.f;
                    if constexpr (GENERAL) {
                        const int j = e < 2 ? j_lo : j_hi, i = i0 + r;
                        const float lr = lse[r];
                        const bool vis = i < L && lr != NEG_INF && j < (a.causal ? min(i + 1, len) : len);
                        p = vis ? ex2(fmaf(s[x][e], c, -lr)) : 0.f;
                        /* without DROP keep_factor is 1 (a.dropout false): kept as a call, because a
                           literal 1 here made ptxas spill 20 bytes of the sm_90a instance at its cap */
                        kd = vis ? (DROP ? kd : keep_factor(a, n, i, j)) : 0.f;
                    } else {
                        p = ex2(fmaf(s[x][e], c, -lse[r]));
                    }
                    if constexpr (DROP || GENERAL) {
                        pt[e] = p * kd;
                        ds[e] = p * (dp[x][e] * kd - D[r]);
                    } else {
                        pt[e] = p;
                        ds[e] = p * (dp[x][e] - D[r]);
                    }
                }
                pf[x / 2][(x & 1) * 2 + 0] = pack2<T>(pt[0], pt[1]);
                pf[x / 2][(x & 1) * 2 + 1] = pack2<T>(pt[2], pt[3]);
                df[x / 2][(x & 1) * 2 + 0] = pack2<T>(ds[0], ds[1]);
                df[x / 2][(x & 1) * 2 + 1] = pack2<T>(ds[2], ds[3]);
            }
        };
        const bool inside = i0 + BQ <= L && j0 + FBK <= len && (!a.causal || j0 + FBK - 1 <= i0);
        if (inside) grad_tile(std::false_type{});
        else grad_tile(std::true_type{});
        if constexpr (W9) {
            w9_begin();
            w9_ab<T>(dv, pf, dO);
            w9_ab<T>(dk, df, Q);
            w9_end(dv, dk);
        } else {
#pragma unroll
            for (int kk = 0; kk < NT / 2; kk++) {
                const uint32_t ap[4] = {pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]};
                const uint32_t ad[4] = {df[kk][0], df[kk][1], df[kk][2], df[kk][3]};
#pragma unroll
                for (int dq2 = 0; dq2 < DT / 2; dq2++) {
                    uint32_t b0[2], b1[2];
                    ld_bt(dO, LDS, 16 * kk, 16 * dq2, b0, b1);
                    mma16816<T>(dv[2 * dq2], ap, b0);
                    mma16816<T>(dv[2 * dq2 + 1], ap, b1);
                    ld_bt(Q, LDS, 16 * kk, 16 * dq2, b0, b1);
                    mma16816<T>(dk[2 * dq2], ad, b0);
                    mma16816<T>(dk[2 * dq2 + 1], ad, b1);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int j = r ? j_hi : j_lo;
        if (j >= L) continue;
#pragma unroll
        for (int x = 0; x < DT; x++) {
            const int d = 8 * x + 2 * t4;
            if (a.dk.p) {
                T *o = at<T>(a.dk, b, h, j, d);
                float v0 = dk[x][2 * r] * a.scale, v1 = dk[x][2 * r + 1] * a.scale;
                if (a.accumulate) v0 += to_acc(o[0]), v1 += to_acc(o[1]);
                from_acc2<T>(v0, v1, o);
            }
            if (a.dv.p) {
                T *o = at<T>(a.dv, b, h, j, d);
                float v0 = dv[x][2 * r], v1 = dv[x][2 * r + 1];
                if (a.accumulate) v0 += to_acc(o[0]), v1 += to_acc(o[1]);
                from_acc2<T>(v0, v1, o);
            }
        }
    }
}

/* ================================================================== backward: dq */

template <typename T, int HD, bool W9, bool DROP>
__global__ void __launch_bounds__(FW * 32) flash_dq_kernel(attn_params a) {
    static_assert(!W9 || HD == 64, "the sm_90a form takes hd 64");
    constexpr int LDS = HD + 8, NT = FBK / 8, DT = HD / 8, QT = W9 ? W9_TILE : FBQ * LDS, KT = W9 ? W9_TILE : FBK * LDS;
    extern __shared__ __align__(16) unsigned char smraw[];
    T *Qs = reinterpret_cast<T *>(tiles_base<W9>(smraw)), *dOs = Qs + QT, *Ks = dOs + QT, *Vs = Ks + 2 * KT;
    const int L = a.L, nqb = (L + FBQ - 1) / FBQ;
    const int64_t n = blockIdx.x / nqb, b = n / a.H, h = n % a.H;
    const int q0 = (nqb - 1 - (int)(blockIdx.x % nqb)) * FBQ;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    bool bad;
    const int len = seq_len(a, b, &bad);
    if (bad) {
        for (int e = threadIdx.x; a.dq.p && e < FBQ * HD; e += FW * 32) {
            const int r = e / HD, d = e - r * HD;
            if (q0 + r < L) *at<T>(a.dq, b, h, q0 + r, d) = from_acc<T>(nan_f());
        }
        if (threadIdx.x == 0 && q0 == 0) raise_bad_length(a, b);
        return;
    }
    if (!a.dq.p) return; /* launched for the flag alone */
    const int last = min(q0 + FBQ, L) - 1;
    const int jmax = a.causal ? min(last + 1, len) : len;
    const int ntiles = (jmax + FBK - 1) / FBK;
    load_tile<T, HD, W9>(a.q, b, h, q0, L, FBQ, Qs);
    load_tile<T, HD, W9>(a.dout, b, h, q0, L, FBQ, dOs);
    if (ntiles > 0) {
        load_tile<T, HD, W9>(a.k, b, h, 0, len, FBK, Ks);
        load_tile<T, HD, W9>(a.v, b, h, 0, len, FBK, Vs);
    }
    copy_commit();
    if (ntiles == 0) copy_wait<0>();
    const float c = a.scale * LOG2E;
    const int i_lo = q0 + 16 * w + g, i_hi = i_lo + 8;
    const float lse2[2] = {i_lo < L ? a.lse[n * L + i_lo] * LOG2E : NEG_INF,
                           i_hi < L ? a.lse[n * L + i_hi] * LOG2E : NEG_INF};
    const float Dr[2] = {i_lo < L ? a.D[n * L + i_lo] : 0.f, i_hi < L ? a.D[n * L + i_hi] : 0.f};
    const int jend[2] = {a.causal ? min(i_lo + 1, len) : len, a.causal ? min(i_hi + 1, len) : len};
    float dq[DT][4];
#pragma unroll
    for (int x = 0; x < DT; x++) dq[x][0] = dq[x][1] = dq[x][2] = dq[x][3] = 0.f;
    for (int tile = 0; tile < ntiles; tile++) {
        const int j0 = tile * FBK, buf = tile & 1;
        if (tile + 1 < ntiles) {
            load_tile<T, HD, W9>(a.k, b, h, j0 + FBK, len, FBK, Ks + (buf ^ 1) * KT);
            load_tile<T, HD, W9>(a.v, b, h, j0 + FBK, len, FBK, Vs + (buf ^ 1) * KT);
            copy_commit();
            copy_wait<1>();
        } else {
            copy_wait<0>();
        }
        if constexpr (W9) w9_tiles_visible();
        __syncthreads();
        const T *K = Ks + buf * KT, *V = Vs + buf * KT;
        float s[NT][4], dp[NT][4];
        score_pair<T, HD, NT, W9>(s, dp, Qs, K, dOs, V);
        /* GENERAL: with the mask, else a tile every pair of which is visible; dropout in both forms
           where DROP */
        uint32_t df[NT / 2][4];
        auto grad_tile = [&](auto general) {
            constexpr bool GENERAL = decltype(general)::value;
            [[maybe_unused]] float kf[8]; /* the dropout factors of a pair of column groups */
#pragma unroll
            for (int x = 0; x < NT; x++) {
                float ds[4];
                if constexpr (DROP)
                    if (x % 2 == 0) drop_rows<DROP>(a, n, i_lo, j0 + 8 * x, t4, kf);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e / 2;
                    const float kd = DROP ? kf[4 * (x % 2) + e] : 1.f;
                    if constexpr (GENERAL) {
                        const int i = r ? i_hi : i_lo, j = j0 + 8 * x + 2 * t4 + (e & 1);
                        const bool vis = i < L && lse2[r] != NEG_INF && j < jend[r];
                        const float p = vis ? ex2(fmaf(s[x][e], c, -lse2[r])) : 0.f;
                        ds[e] = p * (dp[x][e] * (vis ? kd : 0.f) - Dr[r]);
                    } else if constexpr (DROP) {
                        ds[e] = ex2(fmaf(s[x][e], c, -lse2[r])) * (dp[x][e] * kd - Dr[r]);
                    } else {
                        ds[e] = ex2(fmaf(s[x][e], c, -lse2[r])) * (dp[x][e] - Dr[r]);
                    }
                }
                df[x / 2][(x & 1) * 2 + 0] = pack2<T>(ds[0], ds[1]);
                df[x / 2][(x & 1) * 2 + 1] = pack2<T>(ds[2], ds[3]);
            }
        };
        const bool inside = q0 + FBQ <= L && j0 + FBK <= len && (!a.causal || j0 + FBK - 1 <= q0);
        if (inside) grad_tile(std::false_type{});
        else grad_tile(std::true_type{});
        if constexpr (W9) {
            w9_begin();
            w9_ab<T>(dq, df, K);
            w9_end(dq, nullptr);
        } else {
#pragma unroll
            for (int kk = 0; kk < NT / 2; kk++) {
                const uint32_t ad[4] = {df[kk][0], df[kk][1], df[kk][2], df[kk][3]};
#pragma unroll
                for (int dp2 = 0; dp2 < DT / 2; dp2++) {
                    uint32_t b0[2], b1[2];
                    ld_bt(K, LDS, 16 * kk, 16 * dp2, b0, b1);
                    mma16816<T>(dq[2 * dp2], ad, b0);
                    mma16816<T>(dq[2 * dp2 + 1], ad, b1);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = r ? i_hi : i_lo;
        if (i >= L) continue;
        T *orow = at<T>(a.dq, b, h, i, 0);
#pragma unroll
        for (int x = 0; x < DT; x++) {
            const int d = 8 * x + 2 * t4;
            float v0 = dq[x][2 * r] * a.scale, v1 = dq[x][2 * r + 1] * a.scale;
            if (a.accumulate) v0 += to_acc(orow[d]), v1 += to_acc(orow[d + 1]);
            from_acc2<T>(v0, v1, orow + d);
        }
    }
}

/* ================================================================== backward: D */

/* D[n·L + i] = Σ_d do·o for the flash path's rows (unit stride, 16-byte aligned): a thread 8
   elements (one 16-byte load of each), HD / 8 threads a row, their sums joined by shuffles */
template <typename T, int HD>
__global__ void __launch_bounds__(256) flash_rowdot_kernel(attn_params a) {
    constexpr int TPR = HD / 8;
    const int64_t rows = (int64_t)a.B * a.H * a.L;
    const int64_t row = ((int64_t)blockIdx.x * 256 + threadIdx.x) / TPR;
    const int c = (int)(threadIdx.x % TPR);
    float x = 0.f;
    if (row < rows) {
        const int64_t n = row / a.L, b = n / a.H, h = n - b * a.H;
        const int i = (int)(row - n * a.L);
        const uint4 u = __ldg(reinterpret_cast<const uint4 *>(at<T>(a.dout, b, h, i, 8 * c)));
        const uint4 w = __ldg(reinterpret_cast<const uint4 *>(at<T>(a.o, b, h, i, 8 * c)));
        const T *pu = reinterpret_cast<const T *>(&u), *pw = reinterpret_cast<const T *>(&w);
#pragma unroll
        for (int e = 0; e < 8; e++) x += to_acc(pu[e]) * to_acc(pw[e]);
    }
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (row < rows && c == 0) a.D[row] = x;
}

/* ================================================================== launch */

/* dynamic shared memory: the tiles (W9: 64 × 64 each, plus the alignment to 1024 bytes) and the
   dk / dv block's lse and D rows */
template <typename T, int HD, bool W9> constexpr size_t tile_bytes(int rows) {
    return W9 ? sizeof(T) * (size_t)W9_TILE : sizeof(T) * (size_t)rows * (HD + 8);
}
template <typename T, int HD, bool W9> constexpr size_t fwd_smem() {
    return tile_bytes<T, HD, W9>(FBQ) + 4 * tile_bytes<T, HD, W9>(FBK) + (W9 ? 1024 : 0);
}
template <typename T, int HD, bool W9> constexpr size_t dkdv_smem() {
    return 2 * tile_bytes<T, HD, W9>(FBK) + 4 * tile_bytes<T, HD, W9>(bwd_shape<HD>::BQ) +
           sizeof(float) * 4 * bwd_shape<HD>::BQ + (W9 ? 1024 : 0);
}
template <typename T, int HD, bool W9> constexpr size_t dq_smem() {
    return 2 * tile_bytes<T, HD, W9>(FBQ) + 4 * tile_bytes<T, HD, W9>(FBK) + (W9 ? 1024 : 0);
}

template <typename K> static cudaError_t allow(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <typename T, int HD, bool W9, bool DROP> static cudaError_t run_drop(const attn_params &a, bool forward, cudaStream_t st) {
    const int64_t heads = (int64_t)a.B * a.H;
    const unsigned qblocks = (unsigned)(heads * ((a.L + FBQ - 1) / FBQ));
    cudaError_t e;
    if (forward) {
        if ((e = allow(flash_fwd_kernel<T, HD, W9, DROP>, fwd_smem<T, HD, W9>())) != cudaSuccess) return e;
        flash_fwd_kernel<T, HD, W9, DROP><<<qblocks, FW * 32, fwd_smem<T, HD, W9>(), st>>>(a);
        return cudaGetLastError();
    }
    if (a.dk.p || a.dv.p) {
        if ((e = allow(flash_dkdv_kernel<T, HD, W9, DROP>, dkdv_smem<T, HD, W9>())) != cudaSuccess) return e;
        const unsigned kblocks = (unsigned)(heads * ((a.L + FBK - 1) / FBK));
        flash_dkdv_kernel<T, HD, W9, DROP><<<kblocks, FW * 32, dkdv_smem<T, HD, W9>(), st>>>(a);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if ((e = allow(flash_dq_kernel<T, HD, W9, DROP>, dq_smem<T, HD, W9>())) != cudaSuccess) return e;
    flash_dq_kernel<T, HD, W9, DROP><<<qblocks, FW * 32, dq_smem<T, HD, W9>(), st>>>(a);
    return cudaGetLastError();
}

template <typename T, int HD, bool W9> static cudaError_t run(const attn_params &a, bool forward, cudaStream_t st) {
    return a.dropout ? run_drop<T, HD, W9, true>(a, forward, st) : run_drop<T, HD, W9, false>(a, forward, st);
}

template <typename T> static cudaError_t run_hd(const attn_params &a, bool forward, bool w9, cudaStream_t st) {
    switch (a.hd) {
    case 32: return run<T, 32, false>(a, forward, st);
#ifdef FG_CUDA_HAVE_SM90A
    case 64: return w9 ? run<T, 64, true>(a, forward, st) : run<T, 64, false>(a, forward, st);
#else
    case 64: return w9 ? cudaErrorInvalidValue : run<T, 64, false>(a, forward, st);
#endif
    case 128: return run<T, 128, false>(a, forward, st);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T> static cudaError_t rowdot_hd(const attn_params &a, cudaStream_t st) {
    const int64_t threads = (int64_t)a.B * a.H * a.L * (a.hd / 8);
    const unsigned blocks = (unsigned)((threads + 255) / 256);
    switch (a.hd) {
    case 32: flash_rowdot_kernel<T, 32><<<blocks, 256, 0, st>>>(a); break;
    case 64: flash_rowdot_kernel<T, 64><<<blocks, 256, 0, st>>>(a); break;
    case 128: flash_rowdot_kernel<T, 128><<<blocks, 256, 0, st>>>(a); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

} // namespace

bool fg_cuda_attn_flash_fits(const fg_attn_problem *p) {
    if (p->dtype != FG_F16 && p->dtype != FG_BF16) return false;
    if (p->hd != 32 && p->hd != 64 && p->hd != 128) return false;
    if (!p->unit_rows || p->align < 16 || p->L < 1) return false;
    if (p->has_scores_in || p->has_scores_out || p->has_dscores || p->want_dscores_in) return false;
    return true;
}

bool fg_cuda_attn_flash_w9(const fg_attn_problem *p, int device) {
#ifdef FG_CUDA_HAVE_SM90A
    return p->hd == 64 && fg_cuda_is_sm90(device);
#else
    (void)p, (void)device;
    return false;
#endif
}

cudaError_t fg_cuda_attn_flash(const attn_params &a, bool forward, fg_dtype dtype, bool w9, cudaStream_t st) {
    if (!forward) { /* D = Σ do·o */
        cudaError_t e = dtype == FG_BF16 ? rowdot_hd<__nv_bfloat16>(a, st) : rowdot_hd<__half>(a, st);
        if (e != cudaSuccess) return e;
    }
    return dtype == FG_BF16 ? run_hd<__nv_bfloat16>(a, forward, w9, st) : run_hd<__half>(a, forward, w9, st);
}

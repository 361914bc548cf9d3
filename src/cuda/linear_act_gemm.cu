/*
 * linear_act_gemm.cu — linear + activation's three products as one own sm_90a GEMM (f16 /
 * bf16, any reduction length, layers wide enough to fill the GPU):
 *  GEMM_FORWARD  pre = round(x·wᵀ + b) (stored when kept), y = act(pre); the slope form
 *                stores s = act′(pre) where pre would go (free: the epilogue warps have the
 *                issue slots)
 *  GEMM_INPUT    dx = g·w   (w read N-major: the transposed B operand)
 *  GEMM_WEIGHT   dw = gᵀ·x  (g read M-major, x N-major)
 *  GEMM_INPUT_FORM  dx = g·w with g = dy ⊙ act′(pre) made by the blocks' spare warps while the
 *                consumers multiply (gm_form): the gradient pass's traffic moves under the
 *                product instead of before it; units of one row tile × one 64-wide K slice go
 *                to whichever block asks next, a released flag per unit tells the producers it
 *                is in memory (so no block waits on one that is not running); db's sums per row
 *                tile, finished in order by slab_colsum (deterministic)
 * Why: the forward has the activation in the product's epilogue, so y (and pre) leave the chip
 * once and no pass reads them back. cuBLASLt has epilogues for relu and gelu only, and its gelu
 * misses this library's accuracy contract. The backward's products run at cuBLASLt's speed
 * here, and with them the whole step is one kernel design.
 * Machinery (sm90.cuh): persistent blocks of three warpgroups over 128 × 256 output tiles; one
 * producer thread loads 64-wide K slices by TMA into three 128-byte-swizzled stages (mbarriers
 * full / empty); two consumer warpgroups run wgmma m64n256k16 on 64 rows each (128 f32
 * accumulators a thread), then add the bias and leave the tile rounded in shared memory; the
 * producer warpgroup's other three warps store it (TMA) and apply the activation from there
 * while the consumers already run the next tile (mbarriers epi_full / epi_empty), so the
 * activation's math overlaps the products. Out-of-bounds rows and columns are clipped by the
 * copy engine. Each output element is one block's sum in a fixed K order: deterministic.
 * Each block runs alone (no clusters) and takes whole tiles (no split of the last wave): the
 * spare warps of the forward and the forming dx are at their register limits, and a walk that
 * hands out partial tiles makes the forming dx wait for g units that come slice by slice.
 * What is left of the forward's cost over a plain product follows its tile count (each tile's
 * change-over: drain the wgmmas, stage the tile, refill), not its activation math or stores.
 * docs/decisions.md has the alternatives tried and their figures.
 */
#include "act_math.cuh"
#include "cuda_internal.h"
#include "elem.cuh"
#include "sm90.cuh"
#include "sums.cuh"

#include <stdlib.h>
#include <string.h>

constexpr int GM_BM = 128, GM_BN = 256, GM_BK = 64, GM_STAGES = 3, GM_THREADS = 384, GM_GROUP = 16;
constexpr int GM_GROUP_FORM = 8; /* (forming g: a wave's blocks need 8 row tiles' g, not 16, so g is ready sooner) */
constexpr int GM_FORM_ROWS = 32;                  /* a g unit's dy / pre boxes: 32 rows × 64 columns */
constexpr int GM_FORM_BOX = GM_FORM_ROWS * GM_BK * 2;
static_assert(2 * 2 * GM_FORM_BOX == 2 * 64 * 64 * 2, "the g ring (two stages of a dy and a pre box) fills the two y chunks");
constexpr int GM_A = GM_BM * GM_BK * 2, GM_B = GM_BN * GM_BK * 2, GM_STAGE = GM_A + GM_B;
constexpr int GM_CHUNK = 64 * 64 * 2; /* one epilogue chunk: 64 rows × 64 columns */
constexpr int GM_EPI_THREADS = 96;    /* the producer warpgroup's warps 1–3 */
/* stages, then the tile's rounded product (pre) as 2 × 4 chunks (one set per consumer
   warpgroup), two chunks for y (a chunk's store reads one while the next fills the other),
   the tile's bias per consumer warpgroup; + alignment */
constexpr size_t GM_SMEM = (size_t)GM_STAGES * GM_STAGE + 8 * GM_CHUNK + 2 * GM_CHUNK + 2 * GM_BN * 2 + 1024;

struct gm_args {
    const void *bias;
    int64_t n, m;
    int k, tiles_r, tiles_c, group;
    bool write_pre;
    /* GEMM_INPUT_FORM: g = dy ⊙ act′(pre) written here (row stride k) by the blocks' spare
       warps, unit by unit; a unit's flag (row tile × 64-wide K slice) says it is in memory;
       `next` hands out units; part: db's per-row-tile column sums (or null) */
    void *g;
    int *flags, *next;
    float *part;
};

/* tile t of the persistent walk → (row tile, column tile): column-major inside bands of
   GM_GROUP row tiles, so the blocks running at once share x's and w's rows in L2 */
__device__ __forceinline__ void gm_tile(int t, const gm_args &a, int &tr, int &tc) {
    const int per = a.group * a.tiles_c, g = t / per, r0 = g * a.group;
    const int gs = min(a.group, a.tiles_r - r0), in = t - g * per;
    tr = r0 + in % gs;
    tc = in / gs;
}

__device__ __forceinline__ void wg_sync(int c) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory"); }
__device__ __forceinline__ void epi_sync() { asm volatile("bar.sync 3, %0;\n" ::"n"(GM_EPI_THREADS) : "memory"); }

/* y = act(pre) for 8 values (16 bytes); SLOPE: also v = act′(pre) in place (in registers) */
template <typename T, int ACT, bool SLOPE> __device__ __forceinline__ uint4 act8(uint4 &v) {
    uint4 y = v;
    uint32_t *u = reinterpret_cast<uint32_t *>(&y), *us = reinterpret_cast<uint32_t *>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        T *e = reinterpret_cast<T *>(&u[i]), o[2];
        const float p0 = to_acc(e[0]), p1 = to_acc(e[1]);
        if constexpr (SLOPE) {
            float y0, y1, s0, s1;
            act_value_slope(ACT, p0, &y0, &s0), act_value_slope(ACT, p1, &y1, &s1);
            from_acc2<T>(y0, y1, o);
            u[i] = *reinterpret_cast<uint32_t *>(o);
            from_acc2<T>(s0, s1, o);
            us[i] = *reinterpret_cast<uint32_t *>(o);
        } else {
            from_acc2<T>(act_value(ACT, p0), act_value(ACT, p1), o);
            u[i] = *reinterpret_cast<uint32_t *>(o);
        }
    }
    return y;
}

/* g unit u in the order the tile walk first needs them: per band of a.group row tiles, K slice
   by K slice, every row tile of the band at one slice before the next slice */
__device__ __forceinline__ void gm_unit(int u, int ktiles, const gm_args &a, int &tr, int &ks) {
    const int per = a.group * ktiles, g = u / per, r0 = g * a.group;
    const int gs = min(a.group, a.tiles_r - r0), in = u - g * per;
    tr = r0 + in % gs;
    ks = in / gs;
}

/* GEMM_INPUT_FORM's spare warps (the producer warpgroup's warps 1–3, 96 threads) make the
   product's A operand, g = dy ⊙ act′(pre), while the consumers multiply: units of one row tile
   × one 64-wide K slice, taken from a.next in the walk's order (any block may take any unit,
   so no block ever waits for one that is not running); dy's and pre's 32-row boxes come by
   TMA through a two-stage ring (16 KB, where the forward's y chunks live); g goes to global
   memory from registers, db's column sums of the unit to a.part (shuffles, then the three
   warps in order: deterministic), and the unit's flag is released for the producers that wait
   on it. Nothing here waits on another block. */
template <typename T, int GACT>
__device__ __forceinline__ void gm_form(const CUtensorMap *mdy, const CUtensorMap *mps, const gm_args &a, int ktiles,
                                        unsigned char *ring, uint64_t *hfull, int *hunit, float (*red)[64]) {
    const int et = threadIdx.x - 32, lane = threadIdx.x & 31, w = et >> 5, ch = et & 7;
    const int units = a.tiles_r * ktiles;
    /* (thread 0: the unit being loaded, and the next one, asked for a unit ahead so that the
       counter's round trip is off the ring's path) */
    int iu = 0, nu = 0;
    if (et == 0) nu = atomicAdd(a.next, 1);
    auto issue = [&](int b) { /* box b of this block's sequence (sub-box b % 4 of a unit) into stage b % 2 */
        const int st = b & 1, sub = b & 3;
        if (sub == 0) {
            iu = nu;
            if (iu < units) nu = atomicAdd(a.next, 1);
        }
        if (iu >= units) {
            hunit[st] = -1;
            mbar_arrive(&hfull[st]);
            return;
        }
        int tr, ks;
        gm_unit(iu, ktiles, a, tr, ks);
        hunit[st] = iu * 4 + sub;
        unsigned char *dst = ring + st * 2 * GM_FORM_BOX;
        mbar_expect_tx(&hfull[st], 2 * GM_FORM_BOX);
        tma_load_2d(dst, mdy, &hfull[st], ks * GM_BK, tr * GM_BM + sub * GM_FORM_ROWS);
        tma_load_2d(dst + GM_FORM_BOX, mps, &hfull[st], ks * GM_BK, tr * GM_BM + sub * GM_FORM_ROWS);
    };
    if (et == 0) issue(0), issue(1);
    float cs[8];
#pragma unroll
    for (int e = 0; e < 8; e++) cs[e] = 0.f;
    for (int b = 0;; b++) {
        const int st = b & 1;
        mbar_wait(&hfull[st], (b >> 1) & 1);
        const int code = hunit[st];
        if (code < 0) break;
        const int sub = code & 3;
        int tr, ks;
        gm_unit(code >> 2, ktiles, a, tr, ks);
        const unsigned char *sd = ring + st * 2 * GM_FORM_BOX, *sp = sd + GM_FORM_BOX;
        const int64_t col = (int64_t)ks * GM_BK + ch * 8;
        /* the box's 32 rows × 8 16-byte pieces: thread et takes pieces et, et + 96, et + 192, all
           in its column piece ch (rows and columns past the tensors are TMA's zeros: they add
           nothing to the sums and are not stored) */
#pragma unroll
        for (int j = 0; j < 3; j++) {
            const int idx = et + 96 * j;
            if (idx < GM_FORM_ROWS * 8) {
                const int r = idx >> 3, off = r * 128 + ((ch ^ (r & 7)) << 4);
                const int64_t row = (int64_t)tr * GM_BM + sub * GM_FORM_ROWS + r;
                const uint4 vd = lds128(sd + off), vp = lds128(sp + off);
                const T *d = reinterpret_cast<const T *>(&vd), *p = reinterpret_cast<const T *>(&vp);
                vec_t<T, 8> o;
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const float g0 = to_acc(d[e]) * act_slope(GACT, to_acc(p[e]));
                    const float g1 = to_acc(d[e + 1]) * act_slope(GACT, to_acc(p[e + 1]));
                    cs[e] += g0, cs[e + 1] += g1;
                    from_acc2<T>(g0, g1, &o.v[e]);
                }
                if (row < a.n && col < a.k) store_vec<T, 8>(static_cast<T *>(a.g) + row * a.k + col, o);
            }
        }
        if (sub == 3) { /* the unit's last box: its column sums to red */
#pragma unroll
            for (int e = 0; e < 8; e++) {
                cs[e] += __shfl_xor_sync(0xffffffffu, cs[e], 8);
                cs[e] += __shfl_xor_sync(0xffffffffu, cs[e], 16);
            }
            if (lane < 8)
#pragma unroll
                for (int e = 0; e < 8; e++) red[w][lane * 8 + e] = cs[e];
#pragma unroll
            for (int e = 0; e < 8; e++) cs[e] = 0.f;
        }
        epi_sync(); /* the stage read by all (and red written) */
        if (et == 0) issue(b + 2);
        if (sub == 3) {
            /* every helper's g stores precede the barrier; thread 0's fence and release make
               them visible to whoever acquires the flag (cumulativity through the barrier) */
            if (et == 0) {
                __threadfence();
                fence_proxy_global();
                flag_release(a.flags + (int64_t)tr * ktiles + ks, 1);
            }
            const int64_t c = (int64_t)ks * GM_BK + et;
            if (a.part && et < 64 && c < a.k) a.part[(int64_t)tr * a.k + c] = (red[0][et] + red[1][et]) + red[2][et];
        }
    }
}

/* out[rows, cols] = A·B over a.k, A's tile 128 rows and B's 256 columns. TA / TB 0: the operand
   is stored K-major (A as [rows, k], B as [cols, k]), loaded in one box of 64 K × 128 / 256 rows;
   1: stored MN-major (A as [k, rows], B as [k, cols]), loaded in boxes of 64 MN × 64 K, one per
   64 rows / columns, side by side (8 KB apart).
   Roles: warp 0's first thread loads the stages; warpgroups 1 and 2 run the products of rows
   0–63 / 64–127 and leave the tile rounded (+ bias) in shared memory; warps 1–3 store it (pre,
   or the output itself for ACT none) and compute and store y = act(pre) from there, while the
   consumers already run the next tile's products.
   GACT ≥ 0 (GEMM_INPUT_FORM, ACT none, A = g K-major): warps 1–3 form g instead (gm_form), the
   producer waits for each A slice's unit flag, and the consumers store their own tiles.
   SLOPE (the slope form's forward): warps 1–3 store y and s = act′(pre), not pre. */
template <typename T, int ACT, int TA, int TB, int GACT, bool SLOPE>
__global__ void __launch_bounds__(GM_THREADS, 1)
    act_gemm_kernel(const __grid_constant__ CUtensorMap mx, const __grid_constant__ CUtensorMap mw,
                    const __grid_constant__ CUtensorMap mpre, const __grid_constant__ CUtensorMap my,
                    const __grid_constant__ CUtensorMap mdy, const __grid_constant__ CUtensorMap mps, gm_args a) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    constexpr bool FORM = GACT >= 0;
    static_assert(!FORM || (ACT == FG_ACT_NONE && TA == 0), "g is formed only for dx's K-major A");
    extern __shared__ unsigned char raw[];
    __shared__ __align__(8) uint64_t full[GM_STAGES], empty[GM_STAGES], epi_full[2], epi_empty[2], hfull[2];
    __shared__ int hunit[2];
    __shared__ float red[FORM ? 3 : 1][64];
    unsigned char *smem = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    unsigned char *staged = smem + GM_STAGES * GM_STAGE, *ybuf = staged + 8 * GM_CHUNK;
    const int wg = threadIdx.x / 128, ktiles = (a.k + GM_BK - 1) / GM_BK, tiles = a.tiles_r * a.tiles_c;
    if (threadIdx.x == 0) {
        for (int s = 0; s < GM_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 256);
        for (int c = 0; c < 2; c++) mbar_init(&epi_full[c], 128), mbar_init(&epi_empty[c], 1), mbar_init(&hfull[c], 1);
        mbar_init_fence();
        tma_prefetch_map(&mx);
        tma_prefetch_map(&mw);
        if (FORM) tma_prefetch_map(&mdy), tma_prefetch_map(&mps);
    }
    __syncthreads();
    /* registers a thread: the producer warpgroup's and the consumers' (65536 in all); forming g
       wants more in the helpers (its slope chains in flight side by side) */
    constexpr int REG_LOW = FORM ? 104 : 56, REG_HIGH = FORM ? 200 : 224;
    static_assert(128 * REG_LOW + 256 * REG_HIGH <= 65536, "the register file");
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REG_LOW));
        if (threadIdx.x == 0) { /* ------------------------------------------ producer */
            int s = 0;
            uint32_t ph = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                int tr, tc;
                gm_tile(t, a, tr, tc);
                for (int kt = 0; kt < ktiles; kt++) {
                    if constexpr (FORM) { /* g's slice made and visible */
                        const int *f = a.flags + (int64_t)tr * ktiles + kt;
                        while (flag_acquire(f) == 0) __nanosleep(64);
                        fence_proxy_global();
                    }
                    mbar_wait(&empty[s], ph ^ 1);
                    mbar_expect_tx(&full[s], GM_STAGE);
                    unsigned char *sa = smem + s * GM_STAGE, *sb = sa + GM_A;
                    if (TA == 0) tma_load_2d(sa, &mx, &full[s], kt * GM_BK, tr * GM_BM);
                    else
                        for (int j = 0; j < GM_BM / 64; j++)
                            tma_load_2d(sa + j * 8192, &mx, &full[s], tr * GM_BM + 64 * j, kt * GM_BK);
                    if (TB == 0) tma_load_2d(sb, &mw, &full[s], kt * GM_BK, tc * GM_BN);
                    else
                        for (int j = 0; j < GM_BN / 64; j++)
                            tma_load_2d(sb + j * 8192, &mw, &full[s], tc * GM_BN + 64 * j, kt * GM_BK);
                    if (++s == GM_STAGES) s = 0, ph ^= 1;
                }
            }
            return;
        }
        if (threadIdx.x < 32) return;
        if constexpr (FORM) {
            gm_form<T, GACT>(&mdy, &mps, a, ktiles, ybuf, hfull, hunit, red);
            return;
        }
        /* ------------------------------------------------------- epilogue: warps 1–3 */
        const int et = threadIdx.x - 32;
        uint32_t fph = 0;
        int slot = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, fph ^= 1) {
            int tr, tc;
            gm_tile(t, a, tr, tc);
            for (int c = 0; c < 2; c++) {
                mbar_wait(&epi_full[c], fph);
                unsigned char *pc = staged + c * 4 * GM_CHUNK;
                const int c1 = tr * GM_BM + c * 64;
                if (ACT == FG_ACT_NONE || (a.write_pre && !SLOPE)) {
                    if (et == 0) { /* the rounded product as it is: pre, or the output of ACT none */
                        for (int q = 0; q < 4; q++) tma_store_2d(ACT == FG_ACT_NONE ? &my : &mpre, pc + q * GM_CHUNK, tc * GM_BN + q * 64, c1);
                        tma_store_commit();
                    }
                }
                if (ACT != FG_ACT_NONE)
                    for (int q = 0; q < 4; q++, slot ^= 1) {
                        /* PLAIN: y's chunk alternates between the two buffers; SLOPE: y in the
                           first, s in the second, both stored before the next chunk's fill */
                        unsigned char *yc = ybuf + (SLOPE ? 0 : slot) * GM_CHUNK, *sc = ybuf + GM_CHUNK;
                        if (et == 0) { /* the store that last read yc (and sc) is done */
                            if (SLOPE) tma_store_wait_read<0>();
                            else tma_store_wait_read<1>();
                        }
                        epi_sync();
                        /* y, s and pre share the swizzled layout: each 16 bytes map to the same place */
                        for (int i = et; i < GM_CHUNK / 16; i += GM_EPI_THREADS) {
                            uint4 v = reinterpret_cast<const uint4 *>(pc + q * GM_CHUNK)[i];
                            reinterpret_cast<uint4 *>(yc)[i] = act8<T, ACT, SLOPE>(v);
                            if (SLOPE) reinterpret_cast<uint4 *>(sc)[i] = v;
                        }
                        tma_store_fence();
                        epi_sync();
                        if (et == 0) {
                            tma_store_2d(&my, yc, tc * GM_BN + q * 64, c1);
                            if (SLOPE) tma_store_2d(&mpre, sc, tc * GM_BN + q * 64, c1);
                            tma_store_commit();
                        }
                    }
                /* pc free once every warp has read it and the stores of it have */
                epi_sync();
                if (et == 0) {
                    if (ACT == FG_ACT_NONE) tma_store_wait_read<0>();
                    else if (!SLOPE) tma_store_wait_read<2>(); /* (older than y's last two chunks: pc's pre) */
                    mbar_arrive(&epi_empty[c]);
                }
            }
        }
        if (et == 0) tma_store_wait_all();
        return;
    }
    /* ---------------------------------------------- consumers: warpgroup c, rows 64c … 64c + 63 */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG_HIGH));
    const int c = wg - 1, tid = threadIdx.x & 127, lane = threadIdx.x & 31, warp = tid >> 5;
    T *bsm = reinterpret_cast<T *>(ybuf + 2 * GM_CHUNK) + c * GM_BN;
    unsigned char *pc = staged + c * 4 * GM_CHUNK;
    const T *bias = static_cast<const T *>(a.bias);
    float acc[128];
    int s = 0;
    uint32_t ph = 0, eph = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x, eph ^= 1) {
        int tr, tc;
        gm_tile(t, a, tr, tc);
        /* this tile's bias (the last epilogue's reads of bsm ended before its last barrier) */
        for (int i = tid; i < GM_BN; i += 128) {
            const int64_t col = (int64_t)tc * GM_BN + i;
            bsm[i] = bias && col < a.m ? bias[col] : T(0.f);
        }
        int prev = 0;
        for (int kt = 0; kt < ktiles; kt++) {
            mbar_wait(&full[s], ph);
            /* (a K-major step of 16 is 32 bytes along the row, an MN-major one 16 rows of 128) */
            const unsigned char *sa = smem + s * GM_STAGE + c * 8192, *sb = smem + s * GM_STAGE + GM_A;
            const uint64_t da = TA ? wgmma_desc_mn_sw128(sa, 8192) : wgmma_desc_sw128(sa);
            const uint64_t db = TB ? wgmma_desc_mn_sw128(sb, 8192) : wgmma_desc_sw128(sb);
            constexpr int sta = TA ? 2048 >> 4 : 32 >> 4, stb = TB ? 2048 >> 4 : 32 >> 4;
            acc_fence(acc, 128);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < GM_BK / 16; j++)
                wgmma_run<GM_BN, T, TA, TB>(acc, da + sta * j, db + stb * j, kt > 0 || j > 0);
            wgmma_commit();
            acc_fence(acc, 128);
            wgmma_wait<1>(); /* the previous slice's products are done: free its stage */
            if (kt > 0) mbar_arrive(&empty[prev]);
            prev = s;
            if (++s == GM_STAGES) s = 0, ph ^= 1;
        }
        wgmma_wait<0>();
        acc_fence(acc, 128);
        mbar_arrive(&empty[prev]);
        /* the rounded product (+ bias) into the 4 swizzled chunks: the thread holds rows lr, lr + 8
           of the warpgroup's 64 and column pairs 8i + 2·(lane % 4); then the epilogue warps take
           them (once they have let go of the last tile's); FORM: this warpgroup's thread 0 stores
           them itself, and its last tile's stores have read pc before anyone writes it */
        const int lr = warp * 16 + (lane >> 2);
        if (FORM && tid == 0) tma_store_wait_read<0>();
        wg_sync(c); /* bias visible */
        if (!FORM) mbar_wait(&epi_empty[c], eph ^ 1);
#pragma unroll
        for (int q = 0; q < GM_BN / 64; q++)
#pragma unroll
            for (int ii = 0; ii < 8; ii++) {
                const int i = q * 8 + ii;
                const vec_t<T, 2> bq = *reinterpret_cast<const vec_t<T, 2> *>(bsm + q * 64 + 8 * ii + 2 * (lane & 3));
                const float b0 = to_acc(bq.v[0]), b1 = to_acc(bq.v[1]);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    T v[2];
                    from_acc2<T>(acc[4 * i + 2 * h] + b0, acc[4 * i + 2 * h + 1] + b1, v);
                    const int row = lr + 8 * h, off = row * 128 + ((ii ^ (row & 7)) << 4) + (lane & 3) * 4;
                    *reinterpret_cast<uint32_t *>(pc + q * GM_CHUNK + off) = *reinterpret_cast<uint32_t *>(v);
                }
            }
        tma_store_fence();
        if (!FORM) mbar_arrive(&epi_full[c]);
        wg_sync(c); /* every thread's bias reads done before the next tile's bias lands; FORM: pc written */
        if (FORM && tid == 0) {
            for (int q = 0; q < 4; q++) tma_store_2d(&my, pc + q * GM_CHUNK, tc * GM_BN + q * 64, tr * GM_BM + c * 64);
            tma_store_commit();
        }
    }
    if (FORM && tid == 0) tma_store_wait_all();
#endif
}

/* ------------------------------------------------------------------ host */

/* a row-major [rows, cols] operand or output in boxes of box_rows × 64 (a K-major operand:
   box_rows of its tile; an MN-major one or an output: 64) */
static bool gm_map(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int box_rows, fg_dtype dtype) {
    return tma_map_2d(m, base, rows, cols, box_rows, dtype == FG_BF16);
}

static int gm_sms(int device) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 0;
    return sms;
}

/* The kernel exists only in an sm_90a build (FASTGRAD_CUDA_ARCHS has 90a) and runs on a 9.0
 * device; f16 / bf16; every row stride a multiple of 8 elements (TMA's 16-byte strides: the
 * forward's k and cols, GEMM_INPUT's k (g's rows) and cols, GEMM_WEIGHT's rows (g's) and cols);
 * at least one full wave of tiles (fewer: cuBLASLt's smaller tiles fill the GPU better), tiles
 * filling at least 85 % of their waves' slots, and a reduction of 4096 or more (the forward's
 * K, the forming dx's M). Running, every pointer must also be
 * 16-byte aligned. */
extern "C" bool fg_cuda_act_gemm_fits(int device, fg_dtype dtype, fg_act_step step, int64_t rows, int64_t k,
                                      int64_t cols) {
#ifdef FG_CUDA_HAVE_SM90A
    if (dtype != FG_F16 && dtype != FG_BF16) return false;
    /* GEMM_INPUT_FORM numbers its g units (row tiles × K slices, ×4 sub-boxes) in an int */
    if (step == FG_ACT_STEP_GEMM_INPUT_FORM &&
        ((rows + GM_BM - 1) / GM_BM) * ((k + GM_BK - 1) / GM_BK) > INT32_MAX / 8)
        return false;
    const int64_t strided = step == FG_ACT_STEP_GEMM_WEIGHT ? rows : k;
    if (k < 1 || strided % 8 != 0 || cols % 8 != 0 || rows < 1 || rows > INT32_MAX - GM_BM ||
        cols > INT32_MAX - GM_BN || k > INT32_MAX - GM_BK) /* (TMA coordinates are 32-bit, tiles included) */
        return false;
    if (!fg_cuda_is_sm90(device)) return false;
    /* (below ≈ 6e9 multiply-adds the product + pass it replaces is as fast or faster:
       tools/act_fwd_shapes.py measures the rule) */
    if ((double)rows * (double)k * (double)cols < 6e9) return false;
    const int64_t tiles = ((rows + GM_BM - 1) / GM_BM) * ((cols + GM_BN - 1) / GM_BN);
    const int64_t sms = gm_sms(device);
    if (tiles < sms || tiles >= INT32_MAX) return false;
    /* whole tiles a block: a last wave that leaves SMs idle costs them (GPT-2's dx at 8192 × 768
       has 192 tiles for 2 × 132 slots: 73 %), where cuBLASLt's smaller tiles even out */
    const int64_t waves = (tiles + sms - 1) / sms;
    if ((double)tiles < 0.85 * (double)(waves * sms)) return false;
    /* a short reduction leaves each tile's change-over (drain the wgmmas, stage, refill)
       against few K slices: at K 512–2048 product + pass on cuBLASLt won (decision 182) */
    return k >= 4096;
#else
    (void)device, (void)dtype, (void)step, (void)rows, (void)k, (void)cols;
    return false;
#endif
}

/* GEMM_INPUT_FORM's scratch: the units' flags and the unit counter (zeroed before each run),
   then db's per-row-tile column sums when db is wanted */
static size_t form_flags_bytes(int64_t rows, int64_t k) {
    const size_t n = (size_t)((rows + GM_BM - 1) / GM_BM) * (size_t)((k + GM_BK - 1) / GM_BK) + 4;
    return (n * sizeof(int) + 15) & ~(size_t)15;
}

extern "C" size_t fg_cuda_act_form_scratch(int64_t rows, int64_t k, bool want_db) {
    return form_flags_bytes(rows, k) + (want_db ? (size_t)((rows + GM_BM - 1) / GM_BM) * (size_t)k * sizeof(float) : 0);
}

/* The activations whose g dx's product forms itself: relu, silu, sigmoid and tanh, whose slopes
   the three spare warps keep up with, so the step beats the gradient pass + plain product.
   gelu and gelu_tanh keep the pass: their slopes are too long for three warps, which would then
   hold the product back. GIVEN_SLOPE (the slope form, g = dy ⊙ s: one multiply) runs at relu's
   cost, which is why the slope form pays for the gelus. */
extern "C" bool fg_cuda_act_form_takes(int act) {
    return act == FG_ACT_RELU || act == FG_ACT_SILU || act == FG_ACT_SIGMOID || act == FG_ACT_TANH ||
           act == FG_ACT_GIVEN_SLOPE;
}

template <typename T, int ACT, int TA, int TB, int GACT = -1, bool SLOPE = false>
static cudaError_t gm_launch(const CUtensorMap *maps, const gm_args &a, int blocks, cudaStream_t s) {
    auto kernel = act_gemm_kernel<T, ACT, TA, TB, GACT, SLOPE>;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GM_SMEM);
    if (e != cudaSuccess) return e;
    kernel<<<blocks, GM_THREADS, GM_SMEM, s>>>(maps[0], maps[1], maps[2], maps[3], maps[4], maps[5], a);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t gm_dispatch(const fg_act_call *c, const CUtensorMap *maps, const gm_args &a, int blocks,
                               cudaStream_t s) {
    if (c->step == FG_ACT_STEP_GEMM_INPUT) return gm_launch<T, FG_ACT_NONE, 0, 1>(maps, a, blocks, s);
    if (c->step == FG_ACT_STEP_GEMM_WEIGHT) return gm_launch<T, FG_ACT_NONE, 1, 1>(maps, a, blocks, s);
    if (c->step == FG_ACT_STEP_GEMM_INPUT_FORM)
        return with_grad_act(c->act, [&](auto f) {
            constexpr int G = decltype(f)::value;
            if constexpr (G == FG_ACT_RELU || G == FG_ACT_SILU || G == FG_ACT_SIGMOID || G == FG_ACT_TANH ||
                          G == FG_ACT_GIVEN_SLOPE)
                return gm_launch<T, FG_ACT_NONE, 0, 1, G>(maps, a, blocks, s);
            else return cudaErrorInvalidValue; /* (fg_cuda_act_form_takes says no) */
        });
    return with_act(c->act, [&](auto f) {
        constexpr int ACT = decltype(f)::value;
        if constexpr (ACT != FG_ACT_NONE) /* (none has no slope form: its slope is 1) */
            if (c->slope_out) return gm_launch<T, ACT, 0, 0, -1, true>(maps, a, blocks, s);
        return gm_launch<T, ACT, 0, 0>(maps, a, blocks, s);
    });
}

/* GEMM_FORWARD: rows N, k K, cols M; GEMM_INPUT: rows N, k M, cols K (g [N, M], w [M, K]);
   GEMM_WEIGHT: rows M, k N, cols K (g [N, M], x [N, K]); GEMM_INPUT_FORM: GEMM_INPUT's, with g
   formed from dy and pre [N, M] inside (g may be pre itself) and db's sums into db_acc */
extern "C" fg_status fg_cuda_act_gemm(fg_context *ctx, const fg_act_call *c) {
    if (!fg_cuda_act_gemm_fits(ctx->device, c->dtype, c->step, c->rows, c->k, c->cols))
        return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: the sm_90a GEMM does not take rows=%lld k=%lld cols=%lld",
                       (long long)c->rows, (long long)c->k, (long long)c->cols);
    fg_device_guard guard(ctx->device);
    cudaStream_t stream = ctx->cuda->stream;
    gm_args a;
    memset(&a, 0, sizeof a);
    a.n = c->rows, a.m = c->cols, a.k = (int)c->k;
    a.tiles_r = (int)((c->rows + GM_BM - 1) / GM_BM), a.tiles_c = (int)((c->cols + GM_BN - 1) / GM_BN);
    a.group = c->step == FG_ACT_STEP_GEMM_INPUT_FORM ? GM_GROUP_FORM : GM_GROUP;
    const bool fwd = c->step == FG_ACT_STEP_GEMM_FORWARD, form = c->step == FG_ACT_STEP_GEMM_INPUT_FORM;
    const bool input = c->step == FG_ACT_STEP_GEMM_INPUT || form;
    if (fwd && c->slope_out && !c->pre) return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: the slope form needs pre");
    a.bias = fwd ? c->b : nullptr;
    a.write_pre = fwd && c->pre != nullptr;
    void *out = fwd ? c->y : input ? c->dx : c->dw;
    CUtensorMap maps[6];
    bool ok;
    if (fwd)
        ok = gm_map(&maps[0], c->x, c->rows, c->k, GM_BM, c->dtype) && gm_map(&maps[1], c->w, c->cols, c->k, GM_BN, c->dtype);
    else if (input)
        ok = gm_map(&maps[0], c->g, c->rows, c->k, GM_BM, c->dtype) && gm_map(&maps[1], c->w, c->k, c->cols, 64, c->dtype);
    else
        ok = gm_map(&maps[0], c->g, c->k, c->rows, 64, c->dtype) && gm_map(&maps[1], c->x, c->k, c->cols, 64, c->dtype);
    ok = ok && gm_map(&maps[3], out, c->rows, c->cols, 64, c->dtype) &&
         gm_map(&maps[2], a.write_pre ? c->pre : out, c->rows, c->cols, 64, c->dtype);
    if (form) /* dy's and pre's boxes of GM_FORM_ROWS rows */
        ok = ok && gm_map(&maps[4], c->dy, c->rows, c->k, GM_FORM_ROWS, c->dtype) &&
             gm_map(&maps[5], c->pre, c->rows, c->k, GM_FORM_ROWS, c->dtype);
    else
        maps[4] = maps[3], maps[5] = maps[3];
    if (!ok)
        return fg_fail(FG_ERR_BACKEND, "cuda linear_act: cuTensorMapEncodeTiled refused an operand (rows=%lld k=%lld cols=%lld)",
                       (long long)c->rows, (long long)c->k, (long long)c->cols);
    cudaError_t e = cudaSuccess;
    if (form) {
        const size_t flags = form_flags_bytes(c->rows, c->k);
        if (!c->scratch || c->scratch_bytes < fg_cuda_act_form_scratch(c->rows, c->k, c->db_acc != nullptr))
            return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: GEMM_INPUT_FORM's scratch is short");
        a.g = c->g;
        a.flags = static_cast<int *>(c->scratch);
        a.next = a.flags + (size_t)a.tiles_r * (size_t)((c->k + GM_BK - 1) / GM_BK);
        a.part = c->db_acc ? reinterpret_cast<float *>(static_cast<char *>(c->scratch) + flags) : nullptr;
        e = cudaMemsetAsync(c->scratch, 0, flags, stream);
    }
    const int tiles = a.tiles_r * a.tiles_c, sms = gm_sms(ctx->device);
    const int blocks = tiles < sms ? tiles : sms;
    if (e == cudaSuccess)
        e = c->dtype == FG_F16 ? gm_dispatch<__half>(c, maps, a, blocks, stream) : gm_dispatch<__nv_bfloat16>(c, maps, a, blocks, stream);
    if (e == cudaSuccess && form && a.part) e = slab_colsum(a.part, a.tiles_r, c->k, (float *)c->db_acc, c->first, stream);
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act sm_90a GEMM");
}

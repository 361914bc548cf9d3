/*
 * wgmma_probe.cu — a developer's probe, not part of the library (yet): an own sm_90a GEMM
 * (TMA loads into 128-byte-swizzled shared memory, wgmma m64n256k16, one producer warpgroup
 * and two consumer warpgroups, persistent over 128 × 256 output tiles) with linear +
 * activation's forward epilogue (pre = round(x·wᵀ + b), y = act(pre), both written from the
 * accumulators), timed against cuBLAS at the same shape in the same run and checked against
 * an f64 host reference (small shapes, every tail) or cuBLAS (the large shape).
 * Why: issue #4's large shape needs the activation inside the product (and g inside the
 * backward products' operand loads); that needs an own GEMM at cuBLAS's speed first.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude bench/wgmma_probe.cu \
 *        -lcublas -o /tmp/wgmma_probe && /tmp/wgmma_probe
 */
#include "../src/cuda/act_math.cuh"
#include "../src/cuda/elem.cuh"
#include "../src/cuda/sm90.cuh"

#include <cublas_v2.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                                                         \
    do {                                                                                                              \
        auto e_ = (x);                                                                                                \
        if ((int)e_ != 0) {                                                                                           \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)e_);                                     \
            exit(1);                                                                                                  \
        }                                                                                                             \
    } while (0)

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 384;
constexpr int A_TILE = BM * BK * 2, B_TILE = BN * BK * 2, STAGE_BYTES = A_TILE + B_TILE;
constexpr int EP_COLS = 64, EP_STRIDE = EP_COLS + 8; /* the staged epilogue's chunk: 64 rows × 64 columns a warpgroup */
constexpr size_t SMEM = (size_t)STAGES * STAGE_BYTES + 1024, SMEM_STAGED = SMEM + 2 * 64 * EP_STRIDE * 2;
/* the TMA-store epilogue: per consumer warpgroup two 64 × 64 chunks (pre's, y's), 128-byte
   swizzled for the store, and the tile's bias */
constexpr int EP_CHUNK = 64 * 64 * 2;
constexpr size_t SMEM_TMA = SMEM + 2 * 2 * EP_CHUNK + 2 * BN * 2;

struct fwd_args {
    const void *bias;
    void *pre, *y;
    int64_t n, m;
    int k, tiles_r, tiles_c, group;
};

/* tile t of the persistent walk → (row tile, column tile): column-major inside bands of
   `group` row tiles, so the blocks running at once share their x rows and w rows in L2 */
__device__ __forceinline__ void tile_rc(int t, const fwd_args &a, int &tr, int &tc) {
    const int per = a.group * a.tiles_c, g = t / per, r0 = g * a.group;
    const int gs = min(a.group, a.tiles_r - r0), in = t - g * per;
    tr = r0 + in % gs;
    tc = in / gs;
}

template <typename T, int ACT, bool WRITE_PRE, int EPI>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_act_fwd(const __grid_constant__ CUtensorMap mx, const __grid_constant__ CUtensorMap mw,
                 const __grid_constant__ CUtensorMap mpre, const __grid_constant__ CUtensorMap my, fwd_args a) {
    constexpr bool STAGED = EPI == 1;
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    extern __shared__ unsigned char raw[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    unsigned char *smem = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    auto xs = [&](int s) { return smem + s * STAGE_BYTES; };
    auto ws = [&](int s) { return smem + s * STAGE_BYTES + A_TILE; };
    const int wg = threadIdx.x / 128, ktiles = (a.k + BK - 1) / BK, tiles = a.tiles_r * a.tiles_c;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 256);
        mbar_init_fence();
        tma_prefetch_map(&mx);
        tma_prefetch_map(&mw);
    }
    __syncthreads();
    if (wg == 0) { /* producer: one thread issues the loads */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::);
        if (threadIdx.x == 0) {
            int s = 0;
            uint32_t ph = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                int tr, tc;
                tile_rc(t, a, tr, tc);
                for (int kt = 0; kt < ktiles; kt++) {
                    mbar_wait(&empty[s], ph ^ 1);
                    mbar_expect_tx(&full[s], STAGE_BYTES);
                    tma_load_2d(xs(s), &mx, &full[s], kt * BK, tr * BM);
                    tma_load_2d(ws(s), &mw, &full[s], kt * BK, tc * BN);
                    if (++s == STAGES) s = 0, ph ^= 1;
                }
            }
        }
    } else { /* consumers: warpgroup c owns rows 64c … 64c + 63 of the tile */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::);
        const int c = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
        float acc[128];
        int s = 0;
        uint32_t ph = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int tr, tc;
            tile_rc(t, a, tr, tc);
            int prev = 0;
            T *bsm = reinterpret_cast<T *>(smem + STAGES * STAGE_BYTES + 4 * EP_CHUNK) + c * BN;
            if (EPI == 2) { /* this tile's bias (the last epilogue's reads ended at its barriers) */
                const T *bias = static_cast<const T *>(a.bias);
                for (int i = threadIdx.x & 127; i < BN; i += 128) {
                    const int64_t col = (int64_t)tc * BN + i;
                    bsm[i] = bias && col < a.m ? bias[col] : T(0.f);
                }
            }
            for (int kt = 0; kt < ktiles; kt++) {
                mbar_wait(&full[s], ph);
                const uint64_t da = wgmma_desc_sw128(xs(s) + c * 64 * 128), db = wgmma_desc_sw128(ws(s));
                acc_fence(acc, 128);
                wgmma_fence();
#pragma unroll
                for (int j = 0; j < BK / 16; j++) wgmma_n256<T>::template run<0, 0>(acc, da + 2 * j, db + 2 * j, kt > 0 || j > 0);
                wgmma_commit();
                acc_fence(acc, 128);
                wgmma_wait<1>();
                if (kt > 0) mbar_arrive(&empty[prev]);
                prev = s;
                if (++s == STAGES) s = 0, ph ^= 1;
            }
            wgmma_wait<0>();
            acc_fence(acc, 128);
            mbar_arrive(&empty[prev]);
            /* epilogue: thread holds rows r, r + 8 and column pairs 8i + 2·(lane % 4) */
            const T *bias = static_cast<const T *>(a.bias);
            T *pre = static_cast<T *>(a.pre), *y = static_cast<T *>(a.y);
            if (!y) continue; /* (timing the main loop alone) */
            const int64_t r = (int64_t)tr * BM + c * 64 + warp * 16 + (lane >> 2);
            if (EPI == 2) { /* chunks of 64 columns: values in registers, then (the last chunk's stores
                               done reading) into the swizzled chunk buffers, then TMA stores */
                unsigned char *cp = smem + STAGES * STAGE_BYTES + c * 2 * EP_CHUNK, *cy = cp + EP_CHUNK;
                const int lr = warp * 16 + (lane >> 2), tid = threadIdx.x & 127;
                asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory"); /* bias visible */
#pragma unroll
                for (int q = 0; q < BN / 64; q++) {
                    uint32_t pv[16], yv[16];
#pragma unroll
                    for (int ii = 0; ii < 8; ii++) {
                        const int i = q * 8 + ii, lc = 8 * ii + 2 * (lane & 3);
                        const vec_t<T, 2> bq = *reinterpret_cast<const vec_t<T, 2> *>(bsm + q * 64 + lc);
                        const float2 bb = make_float2(to_acc(bq.v[0]), to_acc(bq.v[1]));
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            T qv[2];
                            from_acc2<T>(acc[4 * i + 2 * h] + bb.x, acc[4 * i + 2 * h + 1] + bb.y, qv);
                            pv[2 * ii + h] = *reinterpret_cast<uint32_t *>(qv);
                            from_acc2<T>(act_value(ACT, to_acc(qv[0])), act_value(ACT, to_acc(qv[1])), qv);
                            yv[2 * ii + h] = *reinterpret_cast<uint32_t *>(qv);
                        }
                    }
                    if (tid == 0) tma_store_wait_read<0>();
                    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
#pragma unroll
                    for (int ii = 0; ii < 8; ii++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int row = lr + 8 * h, off = row * 128 + ((ii ^ (row & 7)) << 4) + (lane & 3) * 4;
                            if (WRITE_PRE) *reinterpret_cast<uint32_t *>(cp + off) = pv[2 * ii + h];
                            *reinterpret_cast<uint32_t *>(cy + off) = yv[2 * ii + h];
                        }
                    tma_store_fence();
                    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
                    if (tid == 0) {
                        const int c0 = tc * BN + q * 64, c1 = tr * BM + c * 64;
                        if (WRITE_PRE) tma_store_2d(&mpre, cp, c0, c1);
                        tma_store_2d(&my, cy, c0, c1);
                        tma_store_commit();
                    }
                }
                continue;
            }
            if (STAGED) { /* through shared memory, 64 columns at a time: 16-byte coalesced stores */
                T *ep = reinterpret_cast<T *>(smem + STAGES * STAGE_BYTES) + c * 64 * EP_STRIDE;
                const int lr = warp * 16 + (lane >> 2), tid = threadIdx.x & 127;
#pragma unroll
                for (int q = 0; q < BN / EP_COLS; q++) {
#pragma unroll
                    for (int out = WRITE_PRE ? 0 : 1; out < 2; out++) {
#pragma unroll
                        for (int ii = 0; ii < EP_COLS / 8; ii++) {
                            const int i = q * (EP_COLS / 8) + ii, lc = 8 * ii + 2 * (lane & 3);
                            const int64_t col = (int64_t)tc * BN + 8 * i + 2 * (lane & 3);
                            const float b0 = bias && col < a.m ? to_acc(bias[col]) : 0.f;
                            const float b1 = bias && col + 1 < a.m ? to_acc(bias[col + 1]) : 0.f;
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                T qv[2];
                                from_acc2<T>(acc[4 * i + 2 * h] + b0, acc[4 * i + 2 * h + 1] + b1, qv);
                                if (out == 1) from_acc2<T>(act_value(ACT, to_acc(qv[0])), act_value(ACT, to_acc(qv[1])), qv);
                                *reinterpret_cast<vec_t<T, 2> *>(ep + (lr + 8 * h) * EP_STRIDE + lc) =
                                    *reinterpret_cast<vec_t<T, 2> *>(qv);
                            }
                        }
                        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
                        T *dst = out == 0 ? pre : y;
#pragma unroll
                        for (int e = 0; e < 64 * EP_COLS / 8 / 128; e++) {
                            const int idx = e * 128 + tid, rr = idx / (EP_COLS / 8), seg = idx % (EP_COLS / 8);
                            const int64_t row = (int64_t)tr * BM + c * 64 + rr, col = (int64_t)tc * BN + q * EP_COLS + seg * 8;
                            if (row < a.n && col < a.m)
                                *reinterpret_cast<uint4 *>(dst + row * a.m + col) =
                                    *reinterpret_cast<const uint4 *>(ep + rr * EP_STRIDE + seg * 8);
                        }
                        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
                    }
                }
                continue;
            }
            const bool pairs = (a.m & 1) == 0;
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int64_t col = (int64_t)tc * BN + 8 * i + 2 * (lane & 3);
                if (col >= a.m) continue;
                const bool two = col + 1 < a.m;
                const float b0 = bias ? to_acc(bias[col]) : 0.f, b1 = bias && two ? to_acc(bias[col + 1]) : 0.f;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t row = r + 8 * h;
                    if (row >= a.n) continue;
                    T q[2], v[2];
                    from_acc2<T>(acc[4 * i + 2 * h] + b0, acc[4 * i + 2 * h + 1] + b1, q);
                    from_acc2<T>(act_value(ACT, to_acc(q[0])), act_value(ACT, to_acc(q[1])), v);
                    const int64_t o = row * a.m + col;
                    if (pairs) {
                        if (WRITE_PRE) *reinterpret_cast<vec_t<T, 2> *>(pre + o) = *reinterpret_cast<vec_t<T, 2> *>(q);
                        *reinterpret_cast<vec_t<T, 2> *>(y + o) = *reinterpret_cast<vec_t<T, 2> *>(v);
                    } else {
                        if (WRITE_PRE) pre[o] = q[0];
                        y[o] = v[0];
                        if (two) {
                            if (WRITE_PRE) pre[o + 1] = q[1];
                            y[o + 1] = v[1];
                        }
                    }
                }
            }
        }
        if (EPI == 2 && (threadIdx.x & 127) == 0) tma_store_wait_all();
    }
#endif
}

/* ---------------------------------------------------------------- host */
static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&fn, 12000, cudaEnableDefault, &q));
        CK(q != cudaDriverEntryPointSuccess);
    }
    return fn;
}

/* a row-major [rows, cols] bf16 / f16 tensor, boxes of [box_rows, 64 columns], 128-byte swizzle */
static CUtensorMap tile_map(const void *base, int64_t rows, int64_t cols, int box_rows, bool bf16) {
    CUtensorMap m;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, es[2] = {1, 1};
    CK(encode_fn()(&m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)base, dims,
                   strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    return m;
}

template <int ACT, bool WRITE_PRE, int EPI = 0>
static void launch(const __nv_bfloat16 *x, const __nv_bfloat16 *w, const __nv_bfloat16 *b, __nv_bfloat16 *pre,
                   __nv_bfloat16 *y, int64_t n, int64_t m, int k, int sms, int group, cudaStream_t s) {
    fwd_args a;
    a.bias = b, a.pre = pre, a.y = y, a.n = n, a.m = m, a.k = k;
    a.tiles_r = (int)((n + BM - 1) / BM), a.tiles_c = (int)((m + BN - 1) / BN), a.group = group;
    const CUtensorMap mx = tile_map(x, n, k, BM, true), mw = tile_map(w, m, k, BN, true);
    CUtensorMap mp = mx, my = mx;
    if (EPI == 2) mp = tile_map(pre, n, m, 64, true), my = tile_map(y, n, m, 64, true);
    auto kern = gemm_act_fwd<__nv_bfloat16, ACT, WRITE_PRE, EPI>;
    const size_t smem = EPI == 2 ? SMEM_TMA : EPI == 1 ? SMEM_STAGED : SMEM;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int tiles = a.tiles_r * a.tiles_c;
    kern<<<std::min(tiles, sms), THREADS, smem, s>>>(mx, mw, mp, my, a);
    CK(cudaGetLastError());
}

__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed * 0x9e3779b9u;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xffff) / 32768.f - 1.f) * scale);
    }
}

static std::vector<float> get(const __nv_bfloat16 *d, size_t n) {
    std::vector<__nv_bfloat16> h(n);
    CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}

static double silu_d(double v) { return v / (1 + exp(-v)); }

static double relerr(const std::vector<float> &got, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = (double)got[i] - ref[i];
        if (got[i] != got[i]) return INFINITY;
        num += d * d, den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

template <typename F> static float time_ms(F f, cudaStream_t s, int reps = 15) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    f();
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(a, s);
        f();
        cudaEventRecord(b, s);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* one shape: our pre and y against f64 (check_f64) or against cuBLAS's product + bias */
static bool check(int64_t n, int64_t m, int k, bool check_f64, bool staged, int sms, cudaStream_t s, cublasHandle_t h) {
    __nv_bfloat16 *x, *w, *b, *pre, *y, *ref;
    CK(cudaMalloc(&x, n * k * 2));
    CK(cudaMalloc(&w, m * k * 2));
    CK(cudaMalloc(&b, m * 2));
    CK(cudaMalloc(&pre, n * m * 2));
    CK(cudaMalloc(&y, n * m * 2));
    CK(cudaMalloc(&ref, n * m * 2));
    fill<<<1024, 256>>>(x, n * k, 1, 1.f);
    fill<<<1024, 256>>>(w, m * k, 2, 1.f / sqrtf((float)k));
    fill<<<1024, 256>>>(b, m, 3, 1.f);
    CK(cudaMemset(pre, 0xff, n * m * 2)); /* NaN poison: every element must be written */
    CK(cudaMemset(y, 0xff, n * m * 2));
    if (staged) launch<FG_ACT_SILU, true, 2>(x, w, b, pre, y, n, m, k, sms, 16, s);
    else launch<FG_ACT_SILU, true>(x, w, b, pre, y, n, m, k, sms, 16, s);
    CK(cudaStreamSynchronize(s));
    std::vector<float> gp = get(pre, n * m), gy = get(y, n * m), hb = get(b, m);
    std::vector<double> rp(n * m), ry(n * m);
    if (check_f64) {
        std::vector<float> hx = get(x, n * k), hw = get(w, m * k);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double acc = hb[j];
                for (int p = 0; p < k; p++) acc += (double)hx[i * k + p] * hw[j * k + p];
                rp[i * m + j] = acc;
            }
    } else {
        const float one = 1.f, zero = 0.f;
        CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero, ref,
                        CUDA_R_16BF, (int)m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CK(cudaStreamSynchronize(s));
        std::vector<float> hr = get(ref, n * m);
        for (int64_t i = 0; i < n * m; i++) rp[i] = (double)hr[i] + hb[i % m];
    }
    /* y against silu of our own (rounded) pre: the epilogue's contract */
    for (int64_t i = 0; i < n * m; i++) ry[i] = silu_d(gp[i]);
    const double ep = relerr(gp, rp), ey = relerr(gy, ry);
    const double tol = check_f64 ? 4e-3 : 8e-3; /* bf16 output rounding; against cuBLAS two roundings */
    const bool ok = ep <= tol && ey <= 4e-3;
    printf("CHECK %s %s n=%lld m=%lld k=%d: pre relerr %.3g (vs %s), y relerr %.3g\n", ok ? "PASS" : "FAIL", staged ? "tma-store" : "direct", (long long)n,
           (long long)m, k, ep, check_f64 ? "f64" : "cuBLAS", ey);
    cudaFree(x), cudaFree(w), cudaFree(b), cudaFree(pre), cudaFree(y), cudaFree(ref);
    return ok;
}

int main(int argc, char **argv) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cublasHandle_t h;
    CK(cublasCreate(&h));
    CK(cublasSetStream(h, s));
    bool ok = true;
    const int64_t shapes[][3] = {{130, 264, 64}, {1000, 1000, 200}, {257, 520, 72}, {64, 8, 8}, {300, 256, 4096}};
    for (auto &sh : shapes) {
        ok &= check(sh[0], sh[1], (int)sh[2], true, false, sms, s, h);
        if (sh[1] % 8 == 0) ok &= check(sh[0], sh[1], (int)sh[2], true, true, sms, s, h);
    }
    const int64_t n = argc > 3 ? atoll(argv[1]) : 8192, m = argc > 3 ? atoll(argv[2]) : 16384;
    const int k = argc > 3 ? atoi(argv[3]) : 4096;
    ok &= check(n, m, k, false, false, sms, s, h);
    ok &= check(n, m, k, false, true, sms, s, h);

    __nv_bfloat16 *x, *w, *b, *pre, *y;
    CK(cudaMalloc(&x, n * k * 2));
    CK(cudaMalloc(&w, m * k * 2));
    CK(cudaMalloc(&b, m * 2));
    CK(cudaMalloc(&pre, n * m * 2));
    CK(cudaMalloc(&y, n * m * 2));
    fill<<<1024, 256>>>(x, n * k, 1, 1.f);
    fill<<<1024, 256>>>(w, m * k, 2, 1.f / sqrtf((float)k));
    fill<<<1024, 256>>>(b, m, 3, 1.f);
    const float one = 1.f, zero = 0.f;
    const double flops = 2.0 * n * m * k;
    auto cublas = [&] {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero, pre,
                     CUDA_R_16BF, (int)m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    struct variant { const char *name; std::function<void()> f; std::vector<float> t; };
    std::vector<variant> vs;
    vs.push_back({"cuBLAS GemmEx (no bias)", cublas, {}});
    vs.push_back({"own, main loop only", [&] { launch<FG_ACT_NONE, false>(x, w, b, nullptr, nullptr, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, bias, direct stores", [&] { launch<FG_ACT_NONE, false>(x, w, b, pre, y, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, bias, TMA stores", [&] { launch<FG_ACT_NONE, false, 2>(x, w, b, pre, y, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, bias, staged stores", [&] { launch<FG_ACT_NONE, false, 1>(x, w, b, pre, y, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, silu pre+y, direct", [&] { launch<FG_ACT_SILU, true>(x, w, b, pre, y, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, silu pre+y, TMA", [&] { launch<FG_ACT_SILU, true, 2>(x, w, b, pre, y, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, gelu_tanh pre+y, TMA", [&] { launch<FG_ACT_GELU_TANH, true, 2>(x, w, b, pre, y, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, silu pre+y, staged", [&] { launch<FG_ACT_SILU, true, 1>(x, w, b, pre, y, n, m, k, sms, 16, s); }, {}});
    vs.push_back({"own, main loop only (again)", [&] { launch<FG_ACT_NONE, false>(x, w, b, nullptr, nullptr, n, m, k, sms, 16, s); }, {}});
    for (int round = 0; round < 3; round++) /* interleaved, so clock drift spreads over all */
        for (auto &v : vs) v.t.push_back(time_ms(v.f, s));
    auto med = [](std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    printf("shape n=%lld m=%lld k=%d (%.3f TFLOP)\n", (long long)n, (long long)m, k, flops / 1e12);
    const float base = med(vs[0].t);
    for (auto &v : vs)
        printf("  %-32s %.4f ms %6.1f TFLOP/s  %.3fx cuBLAS\n", v.name, med(v.t), flops / med(v.t) / 1e9, base / med(v.t));
    printf("overall: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

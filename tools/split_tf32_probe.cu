// split_tf32_probe.cu — how fast PatchTST's f32 products could run on tensor cores at f32 accuracy:
// each of a linear layer's three products (forward y = x·wᵀ, input gradient dx = dy·w, weight
// gradient dW = dyᵀ·x over the 172032 tokens) as three TF32 products of split operands (x = hi + lo,
// each exact in TF32: hi·hi + hi·lo + lo·hi in f32 accumulators) by a plain mma.sync kernel
// (m16n8k8, 128 × 128 block tiles, 32-deep k tiles in a three-stage cp.async ring, either operand
// K-major or MN-major in shared memory, the split done in registers as fragments load; the weight
// gradient split over the tokens and its partials summed in order), against the same run's cuBLAS
// f32 on the CUDA cores (what the library and PyTorch run now), cuBLAS with TF32 inputs (one pass:
// the tensor cores' ceiling, not f32-accurate), cuBLAS's bf16x9 emulation where this GPU and cuBLAS
// take it, and the probe's kernel with one pass (its own ceiling). Each result's error is measured
// on sampled rows against an f64 product on the host: DESIGN.md's f32 tolerance is 1e-5
// norm-wise. Not the library: a probe to decide whether an own split-TF32 GEMM is worth its place
// (perf-notes 24).
//   nvcc -O3 -arch=sm_90a -std=c++17 tools/split_tf32_probe.cu -lcublas -o /tmp/split_tf32_probe
//   /tmp/split_tf32_probe                 # PatchTST's four linear layers, all three products
//   /tmp/split_tf32_probe LAYOUT M N K    # one product: LAYOUT 0 forward, 1 dx, 2 dW
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "../src/cuda/mma.cuh" /* the tile kernels' cp.async pieces */

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define CB(x) ((x) == CUBLAS_STATUS_SUCCESS)

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 3, THREADS = 256;
/* shared-memory row strides (floats), padded so that every fragment load is conflict-free: a
   K-major tile is [128][BK + 4], an MN-major one [BK][128 + 8] */
constexpr int LDK = BK + 4, LDN = 128 + 8, TILE = 128 * LDK > BK * LDN ? 128 * LDK : BK * LDN;
constexpr size_t SMEM = (size_t)STAGES * 2 * TILE * sizeof(float);

__device__ __forceinline__ uint32_t tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void mma_tf32(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* One operand's 128 × 32 tile (128 of M or N, 32 of K) into shared memory by 16-byte cp.async:
   K-major (element (r, k) at X[r·ld + k], so rows of K) or MN-major (at X[k·ld + r]). */
template <bool KMAJOR>
__device__ __forceinline__ void load_tile(float *dst, const float *X, int ld, int r0, int rows, int k0, int tid) {
#pragma unroll
    for (int i = 0; i < 4; i++) { /* 1024 chunks of 16 bytes */
        const int c = tid + THREADS * i;
        if (KMAJOR) {
            const int r = c >> 3, q = c & 7;
            const bool ok = r0 + r < rows;
            copy16(smem_at(dst + r * LDK + q * 4), X + (size_t)(ok ? r0 + r : 0) * ld + k0 + q * 4, ok);
        } else {
            const int k = c >> 5, q = c & 31;
            const bool ok = r0 + q * 4 < rows; /* (rows a multiple of 4) */
            copy16(smem_at(dst + k * LDN + q * 4), X + (size_t)(k0 + k) * ld + (ok ? r0 + q * 4 : 0), ok);
        }
    }
}
/* element (r, k) of a tile in shared memory */
template <bool KMAJOR> __device__ __forceinline__ float at(const float *tile, int r, int k) {
    return KMAJOR ? tile[r * LDK + k] : tile[k * LDN + r];
}

/* C[M, N] (+ blockIdx.z's partial: P[z][M][N], the K range z·kc …) = Σ_k A(m, k)·B(n, k), A and B
   each K-major or MN-major. PASSES 3: hi·hi + hi·lo + lo·hi (f32-accurate); 1: hi·hi only (TF32,
   the kernel's ceiling). */
template <int PASSES, bool AK, bool BKM>
__global__ void __launch_bounds__(THREADS, 2)
    split_gemm(const float *A, int lda, const float *B, int ldb, float *C, int M, int N, int kc) {
    extern __shared__ float sm[];
    float *As = sm, *Bs = sm + STAGES * TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, kbase = blockIdx.z * kc, kt_n = kc / BK;
    C += (size_t)blockIdx.z * M * N;
    auto load = [&](int kt, int s) {
        load_tile<AK>(As + s * TILE, A, lda, m0, M, kbase + kt * BK, tid);
        load_tile<BKM>(Bs + s * TILE, B, ldb, n0, N, kbase + kt * BK, tid);
    };
    float acc[4][4][4] = {};
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < kt_n) load(s, s);
        copy_commit();
    }
    for (int kt = 0; kt < kt_n; kt++) {
        copy_wait<STAGES - 2>();
        __syncthreads(); /* tile kt landed; the stage the next load refills is no longer read */
        if (kt + STAGES - 1 < kt_n) load(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        copy_commit();
        const float *as = As + (kt % STAGES) * TILE, *bs = Bs + (kt % STAGES) * TILE;
        const int ma = wm * 64 + g, nb = wn * 32 + g;
#pragma unroll 2
        for (int k8 = 0; k8 < BK; k8 += 8) {
            uint32_t bh[4][2], bl[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float y[2] = {at<BKM>(bs, nb + j * 8, k8 + t), at<BKM>(bs, nb + j * 8, k8 + t + 4)};
#pragma unroll
                for (int e = 0; e < 2; e++) bh[j][e] = tf32(y[e]), bl[j][e] = tf32(y[e] - __uint_as_float(bh[j][e]));
            }
#pragma unroll
            for (int i = 0; i < 4; i++) { /* A's fragments a row tile at a time (fewer live registers) */
                uint32_t ah[4], al[4];
                const int r = ma + i * 16;
                const float x[4] = {at<AK>(as, r, k8 + t), at<AK>(as, r + 8, k8 + t), at<AK>(as, r, k8 + t + 4),
                                    at<AK>(as, r + 8, k8 + t + 4)};
#pragma unroll
                for (int e = 0; e < 4; e++) ah[e] = tf32(x[e]), al[e] = tf32(x[e] - __uint_as_float(ah[e]));
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (PASSES == 3) { /* the small terms first */
                        mma_tf32(acc[i][j], al, bh[j]);
                        mma_tf32(acc[i][j], ah, bl[j]);
                    }
                    mma_tf32(acc[i][j], ah, bh[j]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = m0 + wm * 64 + i * 16 + g + 8 * h;
            if (m >= M) continue;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int n = n0 + wn * 32 + j * 8 + 2 * t;
                if (n < N) *reinterpret_cast<float2 *>(C + (size_t)m * N + n) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
        }
}

/* the split-K partials summed in order (deterministic) */
__global__ void sum_parts(const float *P, float *C, size_t mn, int parts) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < mn; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int z = 0; z < parts; z++) s += P[z * mn + i];
        C[i] = s;
    }
}

enum layout { FWD, DX, DW }; /* y = x·wᵀ; dx = dy·w; dW = dyᵀ·x */
static const char *layout_name[3] = {"forward y = x·wT", "input gradient dx = dy·w", "weight gradient dW = dyT·x"};

/* norm-wise and largest element-wise (relative to Σ|a·b|) error of rows `rows` of C against an
   f64 product; a(m, k) and b(n, k) read the host operands in the layout's order */
template <typename FA, typename FB>
static void check(FA a, FB b, const float *dc, const std::vector<int> &rows, int M, int N, int K, double *norm,
                  double *mx) {
    std::vector<float> c((size_t)M * N);
    CK(cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0, den = 0, worst = 0;
    for (int r : rows)
        for (int n = 0; n < N; n++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                const double p = (double)a(r, k) * b(n, k);
                s += p, sa += fabs(p);
            }
            const double d = c[(size_t)r * N + n] - s;
            num += d * d, den += s * s;
            if (sa > 0 && fabs(d) / sa > worst) worst = fabs(d) / sa;
        }
    *norm = sqrt(num / den), *mx = worst;
}

template <typename F> static double time_ms(F f, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++) f();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; i++) f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms / reps;
}

/* C [M, N] = Σ_k A(m, k)·B(n, k) for one layout: FWD A [M][K], B [N][K]; DX A [M][K], B [K][N];
   DW A [K][M], B [K][N] (K the tokens: split over blocks.z, partials summed in order) */
static void run_shape(cublasHandle_t h, layout L, int M, int N, int K) {
    if (K % BK || N % 8 || M % 8) {
        printf("skip M=%d N=%d K=%d: K must be a multiple of %d, M and N of 8\n", M, N, K, BK);
        return;
    }
    std::vector<float> a((size_t)M * K), b((size_t)N * K);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    auto rnd = [&]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (float)((s >> 40) * (2.0 / 16777216.0) - 1.0); };
    for (auto &v : a) v = rnd();
    for (auto &v : b) v = rnd() / sqrtf((float)K);
    const bool ak = L != DW, bk = L == FWD;
    const int lda = ak ? K : M, ldb = bk ? K : N;
    auto ha = [&](int m, int k) { return ak ? a[(size_t)m * K + k] : a[(size_t)k * M + m]; };
    auto hb = [&](int n, int k) { return bk ? b[(size_t)n * K + k] : b[(size_t)k * N + n]; };
    /* split-K for the weight gradient: about two waves of two blocks an SM */
    int parts = 1;
    if (L == DW) {
        const int tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN), kt = K / BK;
        parts = (4 * 132 + tiles - 1) / tiles;
        while (parts > 1 && kt % parts) parts--;
    }
    const int kc = K / parts;
    float *da, *db, *dc, *dp = nullptr;
    CK(cudaMalloc(&da, a.size() * 4));
    CK(cudaMalloc(&db, b.size() * 4));
    CK(cudaMalloc(&dc, (size_t)M * N * 4));
    if (parts > 1) CK(cudaMalloc(&dp, (size_t)parts * M * N * 4));
    CK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    const float one = 1.f, zero = 0.f;
    std::vector<int> rows;
    for (int r = 0; r < M && (int)rows.size() < (L == DW ? 16 : 2048); r += (L == DW ? M / 16 : 1)) rows.push_back(r);
    const int reps = 20;
    const double gflop = 2.0 * M * N * K * 1e-9, mb = ((double)M * K + (double)N * K + (double)M * N) * 4e-6;
    printf("%s, M=%d N=%d K=%d: %.1f GFLOP, %.0f MB moved at least%s\n", layout_name[L], M, N, K, gflop, mb,
           parts > 1 ? " (the probe: split-K in parts, summed in order)" : "");
    auto report = [&](const char *name, bool ok, double ms) {
        if (!ok) {
            printf("  %-34s not run (cuBLAS refused)\n", name);
            return;
        }
        double en, em;
        check(ha, hb, dc, rows, M, N, K, &en, &em);
        printf("  %-34s %8.4f ms %7.1f TFLOP/s %6.0f GB/s   error norm %.2e, largest %.2e%s\n", name, ms, gflop / ms,
               mb / ms, en, em, en <= 1e-5 ? "" : "  (above f32's 1e-5)");
    };
    /* cuBLAS, column-major, computing Cᵀ [N, M] */
    auto cublas = [&](cublasComputeType_t ct) {
        if (L == FWD) /* B as K × N, transposed; A as K × M */
            return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, db, CUDA_R_32F, K, da, CUDA_R_32F, K, &zero,
                                dc, CUDA_R_32F, N, ct, CUBLAS_GEMM_DEFAULT);
        if (L == DX) /* B as N × K; A as K × M */
            return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, db, CUDA_R_32F, N, da, CUDA_R_32F, K, &zero,
                                dc, CUDA_R_32F, N, ct, CUBLAS_GEMM_DEFAULT);
        /* DW: B as N × K; A as M × K, transposed */
        return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, N, M, K, &one, db, CUDA_R_32F, N, da, CUDA_R_32F, M, &zero, dc,
                            CUDA_R_32F, N, ct, CUBLAS_GEMM_DEFAULT);
    };
    bool ok = CB(cublas(CUBLAS_COMPUTE_32F));
    report("cuBLAS f32 (CUDA cores)", ok, ok ? time_ms([&] { cublas(CUBLAS_COMPUTE_32F); }, reps) : 0);
    ok = CB(cublas(CUBLAS_COMPUTE_32F_FAST_TF32));
    report("cuBLAS TF32 inputs (one pass)", ok, ok ? time_ms([&] { cublas(CUBLAS_COMPUTE_32F_FAST_TF32); }, reps) : 0);
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 9)
    ok = CB(cublasSetEmulationStrategy(h, CUBLAS_EMULATION_STRATEGY_EAGER)) && CB(cublas(CUBLAS_COMPUTE_32F_EMULATED_16BFX9));
    report("cuBLAS bf16x9 emulation (eager)", ok, ok ? time_ms([&] { cublas(CUBLAS_COMPUTE_32F_EMULATED_16BFX9); }, reps) : 0);
    cublasSetEmulationStrategy(h, CUBLAS_EMULATION_STRATEGY_DEFAULT);
#endif
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM, parts);
    auto probe = [&](auto kernel) {
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
        kernel<<<grid, THREADS, SMEM>>>(da, lda, db, ldb, parts > 1 ? dp : dc, M, N, kc);
        if (parts > 1) sum_parts<<<264, 256>>>(dp, dc, (size_t)M * N, parts);
        CK(cudaGetLastError());
    };
    auto both = [&](auto k3, auto k1) {
        report("probe: split TF32, three passes", true, time_ms([&] { probe(k3); }, reps));
        report("probe: TF32, one pass", true, time_ms([&] { probe(k1); }, reps));
    };
    if (L == FWD) both(split_gemm<3, true, true>, split_gemm<1, true, true>);
    else if (L == DX) both(split_gemm<3, true, false>, split_gemm<1, true, false>);
    else both(split_gemm<3, false, false>, split_gemm<1, false, false>);
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    if (dp) CK(cudaFree(dp));
}

int main(int argc, char **argv) {
    cublasHandle_t h;
    if (!CB(cublasCreate(&h))) {
        printf("cublasCreate failed\n");
        return 1;
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    if (argc == 5) {
        const int L = atoi(argv[1]);
        run_shape(h, L == 1 ? DX : L == 2 ? DW : FWD, atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    } else { /* PatchTST ×3 at B·vars 4096 (T 172032, d 128, d_ff 256): q, k, v; FFN up; FFN down;
                the output projection, each product of its forward and backward */
        const int T = 172032, lin[4][2] = {{128, 384}, {128, 256}, {256, 128}, {128, 128}}; /* (in, out) */
        for (auto &l : lin) {
            run_shape(h, FWD, T, l[1], l[0]);
            run_shape(h, DX, T, l[0], l[1]);
            run_shape(h, DW, l[1], l[0], T);
        }
    }
    cublasDestroy(h);
    return 0;
}

// split_tf32_probe.cu — how fast PatchTST's f32 products could run on tensor cores at f32 accuracy:
// C[M, N] = A[M, K] · B[N, K]ᵀ (row-major; the forward of a linear layer, x · wᵀ) as three TF32
// products of split operands (x = hi + lo, each exact in TF32: hi·hi + hi·lo + lo·hi in f32
// accumulators) by a plain mma.sync kernel (m16n8k8, 128 × 128 block tiles, 32-deep k tiles in a
// three-stage cp.async ring, the split done in registers as fragments load), against the same run's
// cuBLAS f32 on the CUDA cores (what the library and PyTorch run now), cuBLAS with TF32 inputs (one
// pass: the tensor cores' ceiling, not f32-accurate), cuBLAS's bf16x9 emulation where this GPU and
// cuBLAS take it, and the probe's own kernel with one pass (its ceiling). Each result's error is
// measured on a sample of rows against an f64 product on the host: DESIGN.md's f32 tolerance is
// 1e-5 norm-wise. Not the library: a probe to decide whether an own split-TF32 GEMM is worth its
// place (perf-notes 24).
//   nvcc -O3 -arch=sm_90a -std=c++17 tools/split_tf32_probe.cu -lcublas -o /tmp/split_tf32_probe
//   /tmp/split_tf32_probe            # PatchTST's forward shapes (M 172032; N, K 384 / 128 …)
//   /tmp/split_tf32_probe M N K      # one shape (K a multiple of 32, N of 8)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define CB(x) ((x) == CUBLAS_STATUS_SUCCESS)

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 3, LDS = BK + 4 /* padded rows: conflict-free fragments */;
constexpr int THREADS = 256;
constexpr size_t SMEM = (size_t)STAGES * (BM + BN) * LDS * sizeof(float);

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
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

// PASSES 3: hi·hi + hi·lo + lo·hi (f32-accurate); 1: hi·hi only (TF32, the kernel's ceiling)
template <int PASSES>
__global__ void __launch_bounds__(THREADS, 2) split_gemm(const float *A, const float *B, float *C, int M, int N, int K) {
    extern __shared__ float sm[];
    float *As = sm, *Bs = sm + STAGES * BM * LDS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, kt_n = K / BK;
    auto load = [&](int kt, int s) {
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < 4; i++) { /* 128 rows × 8 chunks of 16 bytes, for each operand */
            const int c = tid + THREADS * i, r = c >> 3, q = c & 7;
            const bool oka = m0 + r < M, okb = n0 + r < N;
            cp16(smem_u32(As + (s * BM + r) * LDS + q * 4), A + (size_t)(oka ? m0 + r : 0) * K + k0 + q * 4, oka);
            cp16(smem_u32(Bs + (s * BN + r) * LDS + q * 4), B + (size_t)(okb ? n0 + r : 0) * K + k0 + q * 4, okb);
        }
    };
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < kt_n) load(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < kt_n; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads(); /* tile kt landed; the stage the next load refills is no longer read */
        if (kt + STAGES - 1 < kt_n) load(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        asm volatile("cp.async.commit_group;\n" ::);
        const float *as = As + (kt % STAGES) * BM * LDS + (wm * 64 + g) * LDS + t;
        const float *bs = Bs + (kt % STAGES) * BN * LDS + (wn * 32 + g) * LDS + t;
#pragma unroll 2
        for (int k8 = 0; k8 < BK; k8 += 8) {
            uint32_t bh[4][2], bl[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float y[2] = {bs[j * 8 * LDS + k8], bs[j * 8 * LDS + k8 + 4]};
#pragma unroll
                for (int e = 0; e < 2; e++) bh[j][e] = tf32(y[e]), bl[j][e] = tf32(y[e] - __uint_as_float(bh[j][e]));
            }
#pragma unroll
            for (int i = 0; i < 4; i++) { /* A's fragments a row tile at a time (fewer live registers) */
                uint32_t ah[4], al[4];
                const float x[4] = {as[i * 16 * LDS + k8], as[(i * 16 + 8) * LDS + k8], as[i * 16 * LDS + k8 + 4],
                                    as[(i * 16 + 8) * LDS + k8 + 4]};
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

struct result {
    double ms, err_norm, err_max;
    bool ran;
};

// norm-wise and largest element-wise (relative to Σ|a||b| of its row and column) error of the
// first R rows of C against an f64 product
static void check(const std::vector<float> &a, const std::vector<float> &b, const float *dc, int R, int N, int K,
                  double *norm, double *mx) {
    std::vector<float> c((size_t)R * N);
    CK(cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0, den = 0, worst = 0;
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                const double p = (double)a[(size_t)r * K + k] * b[(size_t)n * K + k];
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

static void run_shape(cublasHandle_t h, int M, int N, int K) {
    if (K % BK || N % 8) {
        printf("skip M=%d N=%d K=%d: K must be a multiple of %d and N of 8\n", M, N, K, BK);
        return;
    }
    std::vector<float> a((size_t)M * K), b((size_t)N * K);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    auto rnd = [&]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (float)((s >> 40) * (2.0 / 16777216.0) - 1.0); };
    for (auto &v : a) v = rnd();
    for (auto &v : b) v = rnd() / sqrtf((float)K);
    float *da, *db, *dc;
    CK(cudaMalloc(&da, a.size() * 4));
    CK(cudaMalloc(&db, b.size() * 4));
    CK(cudaMalloc(&dc, (size_t)M * N * 4));
    CK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    const float one = 1.f, zero = 0.f;
    const int R = M < 2048 ? M : 2048, reps = 20;
    const double gflop = 2.0 * M * N * K * 1e-9, mb = ((double)M * K + (double)N * K + (double)M * N) * 4e-6;
    printf("M=%d N=%d K=%d: %.1f GFLOP, %.0f MB moved at least\n", M, N, K, gflop, mb);
    auto report = [&](const char *name, bool ok, double ms) {
        if (!ok) {
            printf("  %-34s not run (cuBLAS refused)\n", name);
            return;
        }
        double en, em;
        check(a, b, dc, R, N, K, &en, &em);
        printf("  %-34s %8.4f ms %7.1f TFLOP/s %6.0f GB/s   error norm %.2e, largest %.2e%s\n", name, ms, gflop / ms,
               mb / ms, en, em, en <= 1e-5 ? "" : "  (above f32's 1e-5)");
    };
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    CK(cudaFuncSetAttribute(split_gemm<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
    CK(cudaFuncSetAttribute(split_gemm<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
    /* cuBLAS, column-major: Cᵀ [N, M] = op_T(B as K × N) · A as K × M */
    auto cublas = [&](cublasComputeType_t ct) {
        return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, db, CUDA_R_32F, K, da, CUDA_R_32F, K, &zero, dc,
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
    split_gemm<3><<<grid, THREADS, SMEM>>>(da, db, dc, M, N, K);
    CK(cudaGetLastError());
    report("probe: split TF32, three passes", true, time_ms([&] { split_gemm<3><<<grid, THREADS, SMEM>>>(da, db, dc, M, N, K); }, reps));
    split_gemm<1><<<grid, THREADS, SMEM>>>(da, db, dc, M, N, K);
    report("probe: TF32, one pass", true, time_ms([&] { split_gemm<1><<<grid, THREADS, SMEM>>>(da, db, dc, M, N, K); }, reps));
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
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
    if (argc == 4) {
        run_shape(h, atoi(argv[1]), atoi(argv[2]), atoi(argv[3]));
    } else { /* PatchTST ×3 at B·vars 4096: q, k, v; FFN up; FFN down; the output projection */
        const int shapes[4][3] = {{172032, 384, 128}, {172032, 256, 128}, {172032, 128, 256}, {172032, 128, 128}};
        for (auto &s : shapes) run_shape(h, s[0], s[1], s[2]);
    }
    cublasDestroy(h);
    return 0;
}

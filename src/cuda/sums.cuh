/*
 * sums.cuh — two small kernels the fused families share: the ordered finish of per-slab
 * column sums (a bias gradient) and the f32 → storage cast of an accumulator, summed over
 * `parts` side-by-side partials in order and optionally added into the output. Why: no
 * floating-point atomics; partial sums added in a fixed order give the same bits every run.
 */
#ifndef FG_CUDA_SUMS_CUH
#define FG_CUDA_SUMS_CUH

#include "elem.cuh"

/* db[j] = (first ? 0 : db[j]) + Σ_k part[k·cols + j], k in a fixed order: a block holds 32
 * columns × 32 lanes, lane l adds slabs [l·per, (l+1)·per) in order, then lane 0 adds the
 * 32 runs in order (the order depends on the slab count only: deterministic). */
constexpr int COLSUM_COLS = 32, COLSUM_LANES = 32;

static __global__ void __launch_bounds__(COLSUM_COLS *COLSUM_LANES)
    slab_colsum_kernel(const float *__restrict__ part, int64_t slabs, int64_t cols, float *__restrict__ db,
                       bool first) {
    __shared__ float runs[COLSUM_LANES][COLSUM_COLS];
    const int col = threadIdx.x % COLSUM_COLS, lane = threadIdx.x / COLSUM_COLS;
    const int64_t j = blockIdx.x * (int64_t)COLSUM_COLS + col;
    const int64_t per = (slabs + COLSUM_LANES - 1) / COLSUM_LANES;
    const int64_t k0 = lane * per, k1 = k0 + per < slabs ? k0 + per : slabs;
    float s = 0.f;
    if (j < cols) {
        int64_t k = k0;
        for (; k + 4 <= k1; k += 4) { /* four loads in flight, added in order */
            const float a = part[k * cols + j], b = part[(k + 1) * cols + j], c = part[(k + 2) * cols + j],
                        d = part[(k + 3) * cols + j];
            s = (((s + a) + b) + c) + d;
        }
        for (; k < k1; k++) s += part[k * cols + j];
    }
    runs[lane][col] = s;
    __syncthreads();
    if (lane != 0 || j >= cols) return;
    float t = first ? 0.f : db[j];
    for (int l = 0; l < COLSUM_LANES; l++) t += runs[l][col];
    db[j] = t;
}

static inline cudaError_t slab_colsum(const float *part, int64_t slabs, int64_t cols, float *db, bool first,
                                      cudaStream_t s) {
    if (cols <= 0) return cudaSuccess;
    slab_colsum_kernel<<<(unsigned)((cols + COLSUM_COLS - 1) / COLSUM_COLS), COLSUM_COLS * COLSUM_LANES, 0, s>>>(
        part, slabs, cols, db, first);
    return cudaGetLastError();
}

/* dst[i] = Σ_p src[p·n + i] (p in order) (+ dst[i]) */
template <typename T>
static __global__ void cast_sum_kernel(const float *__restrict__ src, T *__restrict__ dst, int64_t n, int64_t parts,
                                       bool accumulate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = 0.f;
        for (int64_t p = 0; p < parts; p++) v += src[p * n + i];
        if (accumulate) v += to_acc(dst[i]);
        dst[i] = from_acc<T>(v);
    }
}

#endif

/*
 * sums.cuh — two small kernels the fused families share: the ordered finish of per-slab
 * column sums (a bias gradient) and the f32 → storage cast of an accumulator, summed over
 * `parts` side-by-side partials in order and optionally added into the output.
 */
#ifndef FG_CUDA_SUMS_CUH
#define FG_CUDA_SUMS_CUH

#include "elem.cuh"

/* db[j] = (first ? 0 : db[j]) + Σ_k part[k·cols + j], k in order */
static __global__ void slab_colsum_kernel(const float *__restrict__ part, int64_t slabs, int64_t cols,
                                          float *__restrict__ db, bool first) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = first ? 0.f : db[j];
    for (int64_t k = 0; k < slabs; k++) s += part[k * cols + j];
    db[j] = s;
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

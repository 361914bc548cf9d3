/*
 * elem.cuh — element helpers every CUDA kernel file shares: the accumulator type of a
 * storage type (f32 for f32/f16/bf16, f64 for f64), conversions to and from it, and
 * 16-byte vector loads. Why: one definition of each conversion, so every kernel rounds
 * the same way and the fused kernels reproduce the unfused ones' bits.
 */
#ifndef FG_CUDA_ELEM_CUH
#define FG_CUDA_ELEM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

template <typename T> struct acc_type { typedef float type; };
template <> struct acc_type<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_acc(float x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <typename T> __device__ __forceinline__ T from_acc(double x) { return (T)x; }

/* two f32 values → two adjacent T (f16 / bf16: one paired conversion, the same rounding) */
template <typename T> __device__ __forceinline__ void from_acc2(float a, float b, T *out) {
    out[0] = from_acc<T>(a), out[1] = from_acc<T>(b);
}
template <> __device__ __forceinline__ void from_acc2<__half>(float a, float b, __half *out) {
    *reinterpret_cast<__half2 *>(out) = __floats2half2_rn(a, b);
}
template <> __device__ __forceinline__ void from_acc2<__nv_bfloat16>(float a, float b, __nv_bfloat16 *out) {
    *reinterpret_cast<__nv_bfloat162 *>(out) = __floats2bfloat162_rn(a, b);
}

/* VEC elements of T: one 16-byte access when VEC·sizeof(T) == 16, else element by
 * element (VEC = 1 is the path for data that is not 16-byte aligned). */
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) vec_t { T v[VEC]; };

template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec(const T *p) {
    vec_t<T, VEC> r;
    if constexpr (sizeof(r) == 16) {
        *reinterpret_cast<uint4 *>(&r) = __ldg(reinterpret_cast<const uint4 *>(p));
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) r.v[k] = p[k];
    }
    return r;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T *p, const vec_t<T, VEC> &v) {
    if constexpr (sizeof(v) == 16) {
        *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(&v);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) p[k] = v.v[k];
    }
}

#endif

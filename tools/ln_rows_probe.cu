// ln_rows_probe.cu — LayerNorm bf16 row kernels at N x 4096 (default N 32768) against the same run's
// copy (a vector copy kernel and cudaMemcpy): which thread layout of a row streams closest to copy.
// Forward: a warp a row (the row as packed bf16 in registers) and blocks of G threads a row (G 64 to
// 512, sums through shared memory), each with streaming loads (L1::no_allocate) and stores (.cs),
// one row a block on a grid of every row. Backward (mean / rstd given): persistent blocks of G
// threads a row, the next row loaded into registers during this one's sums, one barrier a row
// (two alternating reduction buffers), dw / db in registers, one partial row a block and an
// ordered finish. Each result is checked against an f64 reference. The library's own kernels are
// timed by bench/compare.py --only norm. Build: nvcc -O3 -arch=sm_90a -std=c++17 --extended-lambda.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>
#include <math.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ void unpack(const uint4 &u, float (&f)[8]) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) { float2 t = __bfloat1622float2(h[i]); f[2 * i] = t.x; f[2 * i + 1] = t.y; }
}
__device__ __forceinline__ uint4 pack(const float (&f)[8]) {
    uint4 u; __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}
__device__ __forceinline__ uint4 ld_stream_nc(const uint4 *p) { uint4 r; asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p)); return r; }
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) { uint4 r; asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p)); return r; }
__device__ __forceinline__ void st_stream(uint4 *p, uint4 v) { asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory"); }
__device__ __forceinline__ void st_plain(uint4 *p, uint4 v) { *p = v; }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void copy_k(const uint4 *a, uint4 *b, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    for (; i + 3 * st < n; i += 4 * st) {
        uint4 v0 = a[i], v1 = a[i + st], v2 = a[i + 2 * st], v3 = a[i + 3 * st];
        b[i] = v0; b[i + st] = v1; b[i + 2 * st] = v2; b[i + 3 * st] = v3;
    }
    for (; i < n; i += st) b[i] = a[i];
}

// reference: one thread block per row, f32, naive
__global__ void ref_fwd(const bf16 *x, const bf16 *w, const bf16 *b, float *y, int D) {
    const bf16 *xr = x + (size_t)blockIdx.x * D;
    __shared__ float red[2];
    if (threadIdx.x == 0) {
        double s = 0; for (int i = 0; i < D; i++) s += __bfloat162float(xr[i]);
        double m = s / D, q = 0; for (int i = 0; i < D; i++) { double d = __bfloat162float(xr[i]) - m; q += d * d; }
        red[0] = (float)m; red[1] = (float)(1.0 / sqrt(q / D + 1e-5));
    }
    __syncthreads();
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        y[(size_t)blockIdx.x * D + i] = (__bfloat162float(xr[i]) - red[0]) * red[1] * __bfloat162float(w[i]) + __bfloat162float(b[i]);
}

// warp a row: NL uint4 per lane (D = 256 NL)
template <int NL, bool STREAM, int MINB>
__global__ void __launch_bounds__(256, MINB) fwd_warp(const bf16 *x, const bf16 *w, const bf16 *b, bf16 *y, float *mean, float *rstd, int rows, float eps) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int D = NL * 256;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)row * D);
    uint4 v[NL];
#pragma unroll
    for (int k = 0; k < NL; k++) v[k] = STREAM ? ld_stream(xr + k * 32 + lane) : xr[k * 32 + lane];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NL; k++) { float f[8]; unpack(v[k], f);
#pragma unroll
        for (int e = 0; e < 8; e++) s += f[e]; }
    const float m = warp_sum(s) * (1.f / D);
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < NL; k++) { float f[8]; unpack(v[k], f);
#pragma unroll
        for (int e = 0; e < 8; e++) { float d = f[e] - m; q += d * d; } }
    const float r = rsqrtf(warp_sum(q) * (1.f / D) + eps);
    uint4 *yr = reinterpret_cast<uint4 *>(y + (size_t)row * D);
#pragma unroll
    for (int k = 0; k < NL; k++) {
        float f[8], wf[8], bfv[8]; unpack(v[k], f);
        unpack(__ldg(reinterpret_cast<const uint4 *>(w) + k * 32 + lane), wf);
        unpack(__ldg(reinterpret_cast<const uint4 *>(b) + k * 32 + lane), bfv);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = (f[e] - m) * r * wf[e] + bfv[e];
        if (STREAM) st_stream(yr + k * 32 + lane, pack(f)); else st_plain(yr + k * 32 + lane, pack(f));
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// block of G threads a row (NV uint4 a thread, D = 8 NV G); sums through smem. The flags are the
// library's rows_fwd_lean differences, to time one at a time: NC the loads' .nc, RT the warps'
// partials summed over the block size known at run time, IEEE 1 / sqrtf for rsqrtf.
template <int G, int NV, bool NC = false, bool RT = false, bool IEEE = false>
__global__ void __launch_bounds__(G) fwd_blk(const bf16 *x, const bf16 *w, const bf16 *b, bf16 *y, float *mean, float *rstd, int rows, float eps) {
    constexpr int D = 8 * NV * G;
    const int W = RT ? (int)blockDim.x / 32 : G / 32;
    __shared__ float red[2][G / 32];
    const int row = blockIdx.x, t = threadIdx.x, lane = t & 31, wp = t >> 5;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)row * D);
    uint4 v[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) v[k] = NC ? ld_stream_nc(xr + k * G + t) : ld_stream(xr + k * G + t);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) { float f[8]; unpack(v[k], f);
#pragma unroll
        for (int e = 0; e < 8; e++) s += f[e]; }
    s = warp_sum(s);
    if (lane == 0) red[0][wp] = s;
    __syncthreads();
    s = 0.f;
#pragma unroll
    for (int i = 0; i < W; i++) s += red[0][i];
    const float m = s * (1.f / D);
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) { float f[8]; unpack(v[k], f);
#pragma unroll
        for (int e = 0; e < 8; e++) { float d = f[e] - m; q += d * d; } }
    q = warp_sum(q);
    if (lane == 0) red[1][wp] = q;
    __syncthreads();
    q = 0.f;
#pragma unroll
    for (int i = 0; i < W; i++) q += red[1][i];
    const float r = IEEE ? 1.f / sqrtf(q * (1.f / D) + eps) : rsqrtf(q * (1.f / D) + eps);
    uint4 *yr = reinterpret_cast<uint4 *>(y + (size_t)row * D);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        float f[8], wf[8], bfv[8]; unpack(v[k], f);
        unpack(__ldg(reinterpret_cast<const uint4 *>(w) + k * G + t), wf);
        unpack(__ldg(reinterpret_cast<const uint4 *>(b) + k * G + t), bfv);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = (f[e] - m) * r * wf[e] + bfv[e];
        st_stream(yr + k * G + t, pack(f));
    }
    if (t == 0) { mean[row] = m; rstd[row] = r; }
}

// backward: persistent blocks of G threads a row, NV uint4 of x and dy a thread; the next row in
// registers while this one's sums go round; dw / db in registers, one partial row a block
template <int G, int NV>
__global__ void __launch_bounds__(G) bwd_blk(const bf16 *x, const bf16 *dy, const bf16 *w, const float *mean, const float *rstd, bf16 *dx, float *part, int rows) {
    constexpr int W = G / 32, D = 8 * NV * G;
    __shared__ float red[2][W][2];
    const int t = threadIdx.x, lane = t & 31, wp = t >> 5;
    float dw[NV][8], db[NV][8];
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int e = 0; e < 8; e++) dw[k][e] = db[k][e] = 0.f;
    int row = blockIdx.x;
    uint4 cx[NV], cd[NV];
    float cm = 0.f, cr = 0.f;
    if (row < rows) {
#pragma unroll
        for (int k = 0; k < NV; k++) {
            cx[k] = ld_stream(reinterpret_cast<const uint4 *>(x + (size_t)row * D) + k * G + t);
            cd[k] = ld_stream(reinterpret_cast<const uint4 *>(dy + (size_t)row * D) + k * G + t);
        }
        cm = mean[row]; cr = rstd[row];
    }
    int par = 0;
    for (; row < rows; row += gridDim.x, par ^= 1) {
        const int nrow = row + gridDim.x;
        uint4 nx[NV], nd[NV];
        float nm = 0.f, nr = 0.f;
        if (nrow < rows) {
#pragma unroll
            for (int k = 0; k < NV; k++) {
                nx[k] = ld_stream(reinterpret_cast<const uint4 *>(x + (size_t)nrow * D) + k * G + t);
                nd[k] = ld_stream(reinterpret_cast<const uint4 *>(dy + (size_t)nrow * D) + k * G + t);
            }
            nm = mean[nrow]; nr = rstd[nrow];
        }
        float g[NV][8], xh[NV][8];
        float sg = 0.f, sgx = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            float xf[8], df[8], wf[8];
            unpack(cx[k], xf); unpack(cd[k], df);
            unpack(__ldg(reinterpret_cast<const uint4 *>(w) + k * G + t), wf);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                xh[k][e] = (xf[e] - cm) * cr;
                g[k][e] = df[e] * wf[e];
                sg += g[k][e];
                sgx += g[k][e] * xh[k][e];
                dw[k][e] += df[e] * xh[k][e];
                db[k][e] += df[e];
            }
        }
        sg = warp_sum(sg); sgx = warp_sum(sgx);
        if (lane == 0) { red[par][wp][0] = sg; red[par][wp][1] = sgx; }
        __syncthreads();
        sg = 0.f; sgx = 0.f;
#pragma unroll
        for (int i = 0; i < W; i++) { sg += red[par][i][0]; sgx += red[par][i][1]; }
        sg *= 1.f / D; sgx *= 1.f / D;
        uint4 *dr = reinterpret_cast<uint4 *>(dx + (size_t)row * D);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            float o[8];
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = cr * (g[k][e] - sg - xh[k][e] * sgx);
            st_stream(dr + k * G + t, pack(o));
        }
#pragma unroll
        for (int k = 0; k < NV; k++) { cx[k] = nx[k]; cd[k] = nd[k]; }
        cm = nm; cr = nr;
    }
    float *pw = part + (size_t)blockIdx.x * 2 * D;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c0 = (k * G + t) * 8;
#pragma unroll
        for (int e = 0; e < 8; e++) { pw[c0 + e] = dw[k][e]; pw[D + c0 + e] = db[k][e]; }
    }
}

// finish: column c of 2D: sum over blocks in order; 32 lanes a column stripe? simple: a thread a column
__global__ void finish_k(const float *part, int nparts, int D2, bf16 *out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D2) return;
    float s = 0.f;
    for (int p = 0; p < nparts; p++) s += part[(size_t)p * D2 + c];
    out[c] = __float2bfloat16_rn(s);
}

template <typename F> static float time_it(F f, int reps = 30) {
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    std::vector<float> v;
    for (int i = 0; i < 5; i++) f();
    for (int i = 0; i < reps; i++) { CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); v.push_back(ms); }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static float max_err_bf16_vs_f32(const bf16 *d_y, const float *d_ref, size_t n) {
    std::vector<bf16> y(n); std::vector<float> r(n);
    CK(cudaMemcpy(y.data(), d_y, n * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(r.data(), d_ref, n * 4, cudaMemcpyDeviceToHost));
    double m = 0; for (size_t i = 0; i < n; i += 7) { double e = fabs((double)__bfloat162float(y[i]) - r[i]) / (1 + fabs(r[i])); if (e > m) m = e; }
    return (float)m;
}

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 32768;
    const int D = 4096;
    const size_t n = (size_t)N * D;
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bf16 *x, *y, *w, *b, *dy, *dx, *dwdb; float *ref, *mean, *rstd, *part;
    CK(cudaMalloc(&x, n * 2)); CK(cudaMalloc(&y, n * 2)); CK(cudaMalloc(&dy, n * 2)); CK(cudaMalloc(&dx, n * 2));
    CK(cudaMalloc(&w, D * 2)); CK(cudaMalloc(&b, D * 2)); CK(cudaMalloc(&dwdb, 2 * D * 2));
    CK(cudaMalloc(&ref, (size_t)N * D * 4)); CK(cudaMalloc(&mean, N * 4)); CK(cudaMalloc(&rstd, N * 4));
    CK(cudaMalloc(&part, (size_t)sms * 32 * 2 * D * 4));
    { std::vector<bf16> h(n); unsigned s = 1; for (size_t i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; h[i] = __float2bfloat16((float)((s >> 8) & 0xffff) / 65536.f * 4.f - 1.5f); }
      CK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
      for (size_t i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; h[i] = __float2bfloat16((float)((s >> 8) & 0xffff) / 65536.f - 0.5f); }
      CK(cudaMemcpy(dy, h.data(), n * 2, cudaMemcpyHostToDevice));
      std::vector<bf16> hw(D), hb(D); for (int i = 0; i < D; i++) { hw[i] = __float2bfloat16(0.5f + (i % 7) * 0.1f); hb[i] = __float2bfloat16((i % 5) * 0.05f); }
      CK(cudaMemcpy(w, hw.data(), D * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(b, hb.data(), D * 2, cudaMemcpyHostToDevice)); }
    ref_fwd<<<N, 256>>>(x, w, b, ref, D); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    const double bytes_f = 2.0 * n * 2, bytes_b = 3.0 * n * 2;
    float t_copy = time_it([&] { copy_k<<<sms * 8, 256>>>((const uint4 *)x, (uint4 *)y, n / 8); });
    float t_mc = time_it([&] { CK(cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice)); });
    printf("N=%d D=%d  copy kernel %.4f ms (%.0f GB/s)  cudaMemcpy %.4f ms (%.0f GB/s)\n", N, D, t_copy, bytes_f / t_copy / 1e6, t_mc, bytes_f / t_mc / 1e6);
    const float cp = (float)(bytes_f / std::min(t_copy, t_mc) / 1e6);
    auto rep_f = [&](const char *name, float t) {
        printf("fwd %-22s %.4f ms  %.0f GB/s  %.1f%% of copy  err %.2e\n", name, t, bytes_f / t / 1e6, 100.0 * bytes_f / t / 1e6 / cp, max_err_bf16_vs_f32(y, ref, n));
        CK(cudaMemset(y, 0, n * 2));
    };
    rep_f("warp NL16 stream", time_it([&] { fwd_warp<16, true, 1><<<N / 8, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("warp NL16 stream min2", time_it([&] { fwd_warp<16, true, 2><<<N / 8, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("warp NL16 stream min3", time_it([&] { fwd_warp<16, true, 3><<<N / 8, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("warp NL16 plain min2", time_it([&] { fwd_warp<16, false, 2><<<N / 8, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G128 NV4", time_it([&] { fwd_blk<128, 4><<<N, 128>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G256 NV2", time_it([&] { fwd_blk<256, 2><<<N, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G512 NV1", time_it([&] { fwd_blk<512, 1><<<N, 512>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G64 NV8", time_it([&] { fwd_blk<64, 8><<<N, 64>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G256 NV2 .nc", time_it([&] { fwd_blk<256, 2, true><<<N, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G256 NV2 rt", time_it([&] { fwd_blk<256, 2, false, true><<<N, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G256 NV2 ieee", time_it([&] { fwd_blk<256, 2, false, false, true><<<N, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    rep_f("blk G256 NV2 all 3", time_it([&] { fwd_blk<256, 2, true, true, true><<<N, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f); }));
    fwd_blk<256, 2><<<N, 256>>>(x, w, b, y, mean, rstd, N, 1e-5f);
    CK(cudaDeviceSynchronize());
    // backward reference on the host for a few rows/cols
    std::vector<bf16> hx(n), hdy(n), hw(D); std::vector<float> hm(N), hr(N);
    CK(cudaMemcpy(hx.data(), x, n * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hdy.data(), dy, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hw.data(), w, D * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hm.data(), mean, N * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hr.data(), rstd, N * 4, cudaMemcpyDeviceToHost));
    auto check_b = [&](const char *name, float t) {
        std::vector<bf16> hdx(n), hdwdb(2 * D);
        CK(cudaMemcpy(hdx.data(), dx, n * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hdwdb.data(), dwdb, 4 * D, cudaMemcpyDeviceToHost));
        double e1 = 0, e2 = 0;
        for (int rr = 0; rr < N; rr += 997) {
            double sg = 0, sgx = 0;
            for (int c = 0; c < D; c++) { size_t i = (size_t)rr * D + c; double xh = ((double)__bfloat162float(hx[i]) - hm[rr]) * hr[rr], g = (double)__bfloat162float(hdy[i]) * __bfloat162float(hw[c]); sg += g; sgx += g * xh; }
            sg /= D; sgx /= D;
            for (int c = 0; c < D; c += 3) { size_t i = (size_t)rr * D + c; double xh = ((double)__bfloat162float(hx[i]) - hm[rr]) * hr[rr], g = (double)__bfloat162float(hdy[i]) * __bfloat162float(hw[c]);
                double want = hr[rr] * (g - sg - xh * sgx); double e = fabs(want - __bfloat162float(hdx[i])) / (1 + fabs(want)); if (e > e1) e1 = e; }
        }
        for (int c = 0; c < D; c += 61) { double sw = 0, sb = 0; for (int rr = 0; rr < N; rr++) { size_t i = (size_t)rr * D + c; double xh = ((double)__bfloat162float(hx[i]) - hm[rr]) * hr[rr]; sw += (double)__bfloat162float(hdy[i]) * xh; sb += __bfloat162float(hdy[i]); }
            double e = fabs(sw - __bfloat162float(hdwdb[c])) / (1 + fabs(sw)); if (e > e2) e2 = e; e = fabs(sb - __bfloat162float(hdwdb[D + c])) / (1 + fabs(sb)); if (e > e2) e2 = e; }
        printf("bwd %-22s %.4f ms  %.0f GB/s  %.1f%% of copy  err dx %.2e dwdb %.2e\n", name, t, bytes_b / t / 1e6, 100.0 * bytes_b / t / 1e6 / cp, e1, e2);
        CK(cudaMemset(dx, 0, n * 2)); CK(cudaMemset(dwdb, 0, 4 * D));
    };
#define BWD(G, NV, PER)                                                                                          \
    {                                                                                                            \
        int occ; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, bwd_blk<G, NV>, G, 0));                  \
        int blocks = std::min(occ, PER) * sms;                                                                   \
        char nm[64]; snprintf(nm, sizeof nm, "blk G%d NV%d x%d/SM", G, NV, std::min(occ, PER));                  \
        check_b(nm, time_it([&] { bwd_blk<G, NV><<<blocks, G>>>(x, dy, w, mean, rstd, dx, part, N);             \
                                  finish_k<<<(2 * D + 255) / 256, 256>>>(part, blocks, 2 * D, dwdb); }));      \
    }
    BWD(256, 2, 99) BWD(256, 2, 2) BWD(256, 2, 3) BWD(512, 1, 99) BWD(512, 1, 2) BWD(128, 4, 99) BWD(128, 4, 6)
    // the finish alone at the largest grid
    { float t = time_it([&] { finish_k<<<(2 * D + 255) / 256, 256>>>(part, sms * 4, 2 * D, dwdb); }); printf("finish alone (%d parts) %.4f ms\n", sms * 4, t); }
    return 0;
}

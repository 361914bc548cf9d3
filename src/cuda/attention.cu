/*
 * attention.cu — the CUDA backend of the attention family: its plan hook (which path takes a
 * problem), the whole-sequence kernels for short sequences, the tiled SIMT kernels for every
 * other shape and dtype, and the dispatch (the short-sequence kernels for hd <= 8 are in
 * attention_qrow.cu, the tensor-core kernels in attention_flash.cu).
 *
 *  SHORT QROW (attention_qrow.cu; L <= 64, hd <= 8, any dtype and strides, every option): a
 *        thread a query row (the backward then a thread a key), whole heads a block with their
 *        scores in a shared-memory tile, register-lean loops. PatchTST's heads (L 42, hd 4 / 8)
 *        take it.
 *  SHORT ROWS (L <= 64, hd <= 32, any dtype and strides, every option): a thread a query row,
 *        `group` whole heads a block; k, v (and q, do) in shared memory as f32 float4 rows, the
 *        [L, L] score operands staged through shared memory by coalesced block-wide row loads and
 *        stores. The backward: a thread a query row (P from lse, dP, dS, dscores_in, dq), then a
 *        thread a key row (dk, dv over the query rows in order). PatchTST's shapes (L 42, hd 4 …
 *        16) are bound by the score rows' bytes; this layout keeps many rows' loads in flight and
 *        needs no shuffles.
 *  SHORT (L <= 128, hd <= 64, any dtype and strides, every option): a block holds `group`
 *        whole heads in shared memory as f32 — PatchTST runs tens of thousands of 42-token
 *        sequences whose heads are a few kilobytes, where a tiled kernel would pad them to 64 or
 *        128 and waste most of its work. A warp takes one query row at a time: lane j holds the
 *        scores of keys j, j + 32, …, the softmax is two warp reductions, and the lanes split
 *        (head dim × key groups) for P·v. The backward keeps q, k, v and do resident, walks the
 *        rows in chunks (a warp per row: P recomputed from lse, dP, dS, dscores_in and dq), keeps
 *        the chunk's dS and P̃ in shared memory, and then each thread adds the chunk into the
 *        dk, dv elements it owns, rows in order: deterministic, no atomics.
 *  TILED (any L, hd <= 256, f32 / f16 / bf16, any strides, every option): the forward is an
 *        online softmax over key tiles, 16 query rows a block (4 rows a warp), f32 math. The
 *        backward is three kernels: D = Σ do·o per row; dk, dv by the key block that owns them,
 *        walking the query tiles; dq and dscores_in by the query block that owns them, walking
 *        the key tiles. Each recomputes P from lse: no [L, L] buffer and no float atomics.
 *  FLASH (attention_flash.cu): f16 / bf16, hd 32 / 64 / 128, unit-stride rows, no score
 *        operands: the same walk on tensor cores.
 * A key-padding length outside [0, L] makes every output of its sequence NaN (each block NaNs
 * what it owns) and raises FG_FLAG_BAD_LENGTH with the sequence; the CPU backend does the same.
 * exp and log are the f32 library ones (expf, logf): the SIMT paths are the f32 reference on
 * the device.
 */
#include "attention.cuh"

#include <cuda_pipeline.h>

#include <stdio.h>
#include <string.h>

namespace {

constexpr float NEG_INF = -INFINITY;

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fc00000); }

/* ================================================================== SHORT */

constexpr int SHORT_WARPS = 8;
constexpr int SHORT_L = 128;  /* the most keys a row holds: 4 per lane */
constexpr int SHORT_HD = 64;

/* The lanes' split for Σ_j x_j·M[j][d] over a row of x (shared memory) and M [L][ld]: head dims
   within a power of two hp <= 32 and key groups; or, past 32 head dims, lanes d and d + 32. */
struct lane_split {
    int hp, ngrp, d, grp;
    __device__ __forceinline__ lane_split(int hd, int lane) {
        hp = 1;
        while (hp < hd && hp < 32) hp <<= 1;
        ngrp = hd > 32 ? 1 : 32 / hp;
        d = hd > 32 ? lane : lane % hp;
        grp = hd > 32 ? 0 : lane / hp;
    }
};

/* acc[0] (d) and acc[1] (d + 32) of Σ_{j < n} x[j]·M[j·ld + d], every lane of the warp taking
   part; the sum ends in the lanes of group 0. Keys in order within a group, groups added by a
   fixed xor tree. */
__device__ __forceinline__ void row_times(const float *x, const float *M, int ld, int n, int hd, const lane_split &s,
                                          float acc[2]) {
    acc[0] = acc[1] = 0.f;
    if (hd > 32) {
        const bool two = s.d + 32 < hd;
        for (int j = 0; j < n; j++) {
            const float xj = x[j];
            acc[0] += xj * M[j * ld + s.d];
            if (two) acc[1] += xj * M[j * ld + s.d + 32];
        }
        return;
    }
    if (s.d < hd)
        for (int j = s.grp; j < n; j += s.ngrp) acc[0] += x[j] * M[j * ld + s.d];
    for (int o = s.hp; o < 32; o <<= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
}

/* Shared-memory floats of the forward for `group` heads: K, V [L][hd + 1], Q [L][hd], and a row of
   probabilities a warp. */
static size_t short_fwd_smem(int L, int hd, int group) {
    const size_t ld = (size_t)hd + 1;
    return sizeof(float) * ((size_t)group * L * (2 * ld + hd) + SHORT_WARPS * SHORT_L);
}

/* Row i of head n's [L, L] operand v (NULL: absent) at keys lane + 32·t, as f32 (0 past L): the
   values a lane needs of a row, loaded one row ahead of their use (the rows' global loads are the
   whole-sequence kernels' latency). */
template <typename S>
__device__ __forceinline__ void fetch_row(const attn_view &v, int64_t b, int64_t h, int i, int L, int lane,
                                          float x[SHORT_L / 32]) {
    const S *row = v.p ? at<S>(v, b, h, i, 0) : nullptr;
#pragma unroll
    for (int t = 0; t < SHORT_L / 32; t++) {
        const int j = lane + 32 * t;
        x[t] = row && j < L ? to_acc(row[j * v.sx]) : 0.f;
    }
}

template <typename T, typename S>
__global__ void __launch_bounds__(SHORT_WARPS * 32, 3) short_fwd_kernel(attn_params a, int group) {
    extern __shared__ float sm[];
    const int L = a.L, hd = a.hd, ld = hd + 1;
    const int64_t heads = (int64_t)a.B * a.H, n0 = (int64_t)blockIdx.x * group;
    const int gcount = (int)min((int64_t)group, heads - n0);
    float *Ks = sm, *Vs = Ks + (size_t)group * L * ld, *Qs = Vs + (size_t)group * L * ld;
    float *Pr = Qs + (size_t)group * L * hd;
    for (int e = threadIdx.x; e < gcount * L * hd; e += blockDim.x) {
        const int g = e / (L * hd), r = e - g * (L * hd), j = r / hd, d = r - j * hd;
        const int64_t n = n0 + g, b = n / a.H, h = n % a.H;
        Ks[(g * L + j) * ld + d] = to_acc(*at<T>(a.k, b, h, j, d));
        Vs[(g * L + j) * ld + d] = to_acc(*at<T>(a.v, b, h, j, d));
        Qs[e] = to_acc(*at<T>(a.q, b, h, j, d));
    }
    __syncthreads();
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const lane_split split(hd, lane);
    float *pr = Pr + w * SHORT_L;
    const int tasks = gcount * L;
    float next[SHORT_L / 32];
    if (w < tasks) {
        const int64_t n = n0 + w / L;
        fetch_row<S>(a.sin, n / a.H, n % a.H, w % L, L, lane, next);
    }
    for (int task = w; task < tasks; task += SHORT_WARPS) {
        const int g = task / L, i = task - g * L;
        const int64_t n = n0 + g, b = n / a.H, h = n % a.H;
        float sin[SHORT_L / 32];
#pragma unroll
        for (int t = 0; t < SHORT_L / 32; t++) sin[t] = next[t];
        if (task + SHORT_WARPS < tasks) {
            const int64_t n2 = n0 + (task + SHORT_WARPS) / L;
            fetch_row<S>(a.sin, n2 / a.H, n2 % a.H, (task + SHORT_WARPS) % L, L, lane, next);
        }
        bool bad;
        const int len = seq_len(a, b, &bad);
        if (bad) { /* NaN what this row owns */
            for (int d = lane; d < hd; d += 32) *at<T>(a.o, b, h, i, d) = from_acc<T>(nan_f());
            for (int j = lane; a.sout.p && j < L; j += 32) *at<S>(a.sout, b, h, i, j) = from_acc<S>(nan_f());
            if (lane == 0) {
                a.lse[n * L + i] = nan_f();
                if (i == 0) raise_bad_length(a, b);
            }
            continue;
        }
        const int jend = key_end(a, i, len);
        const float *K = Ks + (size_t)g * L * ld, *V = Vs + (size_t)g * L * ld, *q = Qs + ((size_t)g * L + i) * hd;
        S *sout = a.sout.p ? at<S>(a.sout, b, h, i, 0) : nullptr;
        const int64_t sout_x = a.sout.sx;
        float s[SHORT_L / 32];
        float m = NEG_INF;
#pragma unroll
        for (int t = 0; t < SHORT_L / 32; t++) {
            const int j = lane + 32 * t;
            float x = NEG_INF;
            if (j < jend) {
                float dot = 0.f;
                for (int d = 0; d < hd; d++) dot += q[d] * K[j * ld + d];
                x = dot * a.scale + sin[t];
            }
            s[t] = x;
            if (sout && j < L) sout[j * sout_x] = from_acc<S>(x);
            m = nan_max(m, x);
        }
        m = warp_max(m);
        T *orow = at<T>(a.o, b, h, i, 0);
        const int64_t o_x = a.o.sx;
        if (m == NEG_INF) { /* no key: o = 0, lse = −∞ */
            for (int d = lane; d < hd; d += 32) orow[d * o_x] = from_acc<T>(0.f);
            if (lane == 0) a.lse[n * L + i] = NEG_INF;
            continue;
        }
        float sum = 0.f;
#pragma unroll
        for (int t = 0; t < SHORT_L / 32; t++) {
            const int j = lane + 32 * t;
            if (j < jend) {
                const float e = expf(s[t] - m);
                sum += e;
                pr[j] = e * keep_factor(a, n, i, j);
            }
        }
        sum = warp_sum(sum);
        __syncwarp();
        float acc[2];
        row_times(pr, V, ld, jend, hd, split, acc);
        const float inv = 1.f / sum;
        if (split.grp == 0) {
            if (split.d < hd) orow[split.d * o_x] = from_acc<T>(acc[0] * inv);
            if (hd > 32 && split.d + 32 < hd) orow[(split.d + 32) * o_x] = from_acc<T>(acc[1] * inv);
        }
        if (lane == 0) a.lse[n * L + i] = m + logf(sum);
        __syncwarp(); /* pr is rewritten by the next row */
    }
}

/* The backward's shared memory for `group` heads and chunks of `rows` query rows:
   K, V [L][hd + 1]; Q, dO, dK, dV [L][hd]; dS, P̃ [rows][L + 1]; D, lse [L]. */
static size_t short_bwd_smem(int L, int hd, int group, int rows) {
    const size_t per = 2 * (size_t)L * (hd + 1) + 4 * (size_t)L * hd + 2 * (size_t)rows * (L + 1) + 2 * (size_t)L;
    return sizeof(float) * per * (size_t)group;
}

template <typename T, typename S>
__global__ void __launch_bounds__(SHORT_WARPS * 32, 3) short_bwd_kernel(attn_params a, int group, int rows) {
    extern __shared__ float sm[];
    const int L = a.L, hd = a.hd, ld = hd + 1, lds = L + 1;
    const int64_t heads = (int64_t)a.B * a.H, n0 = (int64_t)blockIdx.x * group;
    const int gcount = (int)min((int64_t)group, heads - n0);
    float *Ks = sm, *Vs = Ks + (size_t)group * L * ld, *Qs = Vs + (size_t)group * L * ld;
    float *dOs = Qs + (size_t)group * L * hd, *dKs = dOs + (size_t)group * L * hd, *dVs = dKs + (size_t)group * L * hd;
    float *dSs = dVs + (size_t)group * L * hd, *Pts = dSs + (size_t)group * rows * lds;
    float *Ds = Pts + (size_t)group * rows * lds, *lses = Ds + (size_t)group * L;
    for (int e = threadIdx.x; e < gcount * L * hd; e += blockDim.x) {
        const int g = e / (L * hd), r = e - g * (L * hd), j = r / hd, d = r - j * hd;
        const int64_t n = n0 + g, b = n / a.H, h = n % a.H;
        Ks[(g * L + j) * ld + d] = to_acc(*at<T>(a.k, b, h, j, d));
        Vs[(g * L + j) * ld + d] = to_acc(*at<T>(a.v, b, h, j, d));
        Qs[e] = to_acc(*at<T>(a.q, b, h, j, d));
        dOs[e] = to_acc(*at<T>(a.dout, b, h, j, d));
        dKs[e] = dVs[e] = 0.f;
    }
    for (int e = threadIdx.x; e < gcount * L; e += blockDim.x) lses[e] = a.lse[n0 * L + e];
    __syncthreads();
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const lane_split split(hd, lane);
    /* D = Σ do·o per row, a thread a row (its loads independent: many rows in flight) */
    for (int e = threadIdx.x; e < gcount * L; e += blockDim.x) {
        const int g = e / L, i = e - g * L;
        const int64_t n = n0 + g, b = n / a.H, h = n % a.H;
        const T *orow = at<T>(a.o, b, h, i, 0);
        float x = 0.f;
        for (int d = 0; d < hd; d++) x += dOs[(size_t)e * hd + d] * to_acc(orow[d * a.o.sx]);
        Ds[e] = x;
    }
    __syncthreads();
    for (int i0 = 0; i0 < L; i0 += rows) {
        const int nr = min(rows, L - i0);
        const int tasks = gcount * nr;
        float nsin[SHORT_L / 32], ndso[SHORT_L / 32];
        if (w < tasks) {
            const int64_t n = n0 + w / nr;
            fetch_row<S>(a.sin, n / a.H, n % a.H, i0 + w % nr, L, lane, nsin);
            fetch_row<S>(a.dso, n / a.H, n % a.H, i0 + w % nr, L, lane, ndso);
        }
        for (int task = w; task < tasks; task += SHORT_WARPS) {
            const int g = task / nr, r = task - g * nr, i = i0 + r;
            const int64_t n = n0 + g, b = n / a.H, h = n % a.H;
            float *dsr = dSs + ((size_t)g * rows + r) * lds, *ptr = Pts + ((size_t)g * rows + r) * lds;
            float sin[SHORT_L / 32], dso[SHORT_L / 32];
#pragma unroll
            for (int t = 0; t < SHORT_L / 32; t++) sin[t] = nsin[t], dso[t] = ndso[t];
            if (task + SHORT_WARPS < tasks) {
                const int nt = task + SHORT_WARPS;
                const int64_t n2 = n0 + nt / nr;
                fetch_row<S>(a.sin, n2 / a.H, n2 % a.H, i0 + nt % nr, L, lane, nsin);
                fetch_row<S>(a.dso, n2 / a.H, n2 % a.H, i0 + nt % nr, L, lane, ndso);
            }
            bool bad;
            const int len = seq_len(a, b, &bad);
            if (bad) {
                for (int d = lane; a.dq.p && d < hd; d += 32) *at<T>(a.dq, b, h, i, d) = from_acc<T>(nan_f());
                for (int j = lane; a.dsin.p && j < L; j += 32) *at<S>(a.dsin, b, h, i, j) = from_acc<S>(nan_f());
                for (int j = lane; j < L; j += 32) dsr[j] = ptr[j] = 0.f;
                if (lane == 0 && i == 0) raise_bad_length(a, b);
                continue;
            }
            const float lse = lses[g * L + i], Di = Ds[g * L + i];
            const bool empty = lse == NEG_INF;
            const int jend = empty ? 0 : key_end(a, i, len);
            const float *q = Qs + ((size_t)g * L + i) * hd, *dO = dOs + ((size_t)g * L + i) * hd;
            const float *K = Ks + (size_t)g * L * ld, *V = Vs + (size_t)g * L * ld;
            S *dsin = a.dsin.p ? at<S>(a.dsin, b, h, i, 0) : nullptr;
            const int64_t dsin_x = a.dsin.sx;
#pragma unroll
            for (int t = 0; t < SHORT_L / 32; t++) {
                const int j = lane + 32 * t;
                if (j >= L) continue;
                float ds = 0.f, pt = 0.f;
                if (j < jend) {
                    float dot = 0.f, dpd = 0.f;
                    for (int d = 0; d < hd; d++) {
                        dot += q[d] * K[j * ld + d];
                        dpd += dO[d] * V[j * ld + d];
                    }
                    const float x = dot * a.scale + sin[t];
                    const float p = expf(x - lse), kd = keep_factor(a, n, i, j);
                    pt = p * kd;
                    ds = p * (dpd * kd - Di) + dso[t];
                }
                if (dsin) {
                    S *o = dsin + j * dsin_x;
                    *o = from_acc<S>(a.accumulate ? to_acc(*o) + ds : ds);
                }
                dsr[j] = ds;
                ptr[j] = pt;
            }
            __syncwarp();
            if (a.dq.p) {
                float acc[2];
                row_times(dsr, K, ld, jend, hd, split, acc);
                if (split.grp == 0)
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int d = split.d + 32 * u;
                        if (d >= hd || (u == 1 && hd <= 32)) continue;
                        T *o = at<T>(a.dq, b, h, i, d);
                        const float v = acc[u] * a.scale;
                        *o = from_acc<T>(a.accumulate ? to_acc(*o) + v : v);
                    }
            }
            __syncwarp();
        }
        __syncthreads();
        /* the chunk into dK, dV: each thread its elements, the chunk's rows in order */
        for (int e = threadIdx.x; e < gcount * L * hd; e += blockDim.x) {
            const int g = e / (L * hd), r = e - g * (L * hd), j = r / hd, d = r - j * hd;
            const float *dS = dSs + (size_t)g * rows * lds, *Pt = Pts + (size_t)g * rows * lds;
            const float *q = Qs + ((size_t)g * L + i0) * hd, *dO = dOs + ((size_t)g * L + i0) * hd;
            float ak = dKs[e], av = dVs[e];
            for (int rr = 0; rr < nr; rr++) {
                ak += dS[rr * lds + j] * q[rr * hd + d];
                av += Pt[rr * lds + j] * dO[rr * hd + d];
            }
            dKs[e] = ak, dVs[e] = av;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < gcount * L * hd; e += blockDim.x) {
        const int g = e / (L * hd), r = e - g * (L * hd), j = r / hd, d = r - j * hd;
        const int64_t n = n0 + g, b = n / a.H, h = n % a.H;
        bool bad;
        (void)seq_len(a, b, &bad);
        if (a.dk.p) {
            T *o = at<T>(a.dk, b, h, j, d);
            const float v = bad ? nan_f() : dKs[e] * a.scale;
            *o = from_acc<T>(a.accumulate && !bad ? to_acc(*o) + v : v);
        }
        if (a.dv.p) {
            T *o = at<T>(a.dv, b, h, j, d);
            const float v = bad ? nan_f() : dVs[e];
            *o = from_acc<T>(a.accumulate && !bad ? to_acc(*o) + v : v);
        }
    }
}

/* ================================================================== SHORT ROWS */

/* A thread a query row, for L <= 64 and hd <= 32 (PatchTST's heads: L 42, hd 4 … 16), where a
   warp a row spends its time in shuffles and one row's loads in flight. A block holds `group`
   whole heads: k, v (and q, do) in shared memory as f32 rows padded with zeros to HDP floats and
   read as float4 broadcasts, head stride hs with hs / 4 odd (the heads a warp spans read distinct
   bank groups); q (and do) of the thread's row in registers; a thread's [L, hd] rows move as
   16-byte vectors where they are contiguous and aligned. The [L, L] score operands go through
   shared memory: block-wide coalesced row loads (f32: asynchronous copies, the block's every row
   in flight; f16 / bf16: a warp a run of ROWS_U rows, every load of the run issued before the
   first store; lane j the keys j and j + 32), row stride lds = L | 1 (odd: a thread reading its
   own row is conflict-free), and coalesced stores back. The backward is two phases in one
   block: a thread a query row (P from lse, dP, dS, dscores_in through shared memory, dq), then a
   thread a key row (dk, dv over the query rows in order). Every sum runs in a fixed order; no
   atomics but the bad-length flag. */

constexpr int ROWS_L = 64;
constexpr int ROWS_HD = 32;
constexpr int ROWS_THREADS = 256; /* the most threads a block */
constexpr int ROWS_U = 8;         /* rows a warp stages at once */

__host__ __device__ __forceinline__ int rows_lds(int L) { return L | 1; }
__host__ __device__ __forceinline__ int rows_hs(int L, int hdp) { return L * hdp + 4; }

/* The floats before the int64 row offsets (even: the offsets are 8-byte aligned): K, V (and Q,
   dO) [group][hs]; the score rows [group·L][lds], one array forward, two backward. */
__host__ __device__ __forceinline__ size_t rows_floats(int L, int hdp, int group, bool fwd) {
    const size_t f = (size_t)(fwd ? 2 : 4) * group * rows_hs(L, hdp) + (size_t)(fwd ? 1 : 2) * group * L * rows_lds(L);
    return (f + 1) & ~(size_t)1;
}

/* Bytes of shared memory: the floats, then a row's element offset in each staged [L, L] operand
   (forward: scores_in, scores_out; backward: scores_in, dscores, dscores_in). */
static size_t rows_smem(int L, int hdp, int group, bool fwd) {
    return sizeof(float) * rows_floats(L, hdp, group, fwd) + sizeof(int64_t) * (size_t)(fwd ? 2 : 3) * group * L;
}

/* 16 bytes of T as f32 and back (16 / sizeof(T) elements; the conversions of to_acc and
   from_acc, pairwise) */
__device__ __forceinline__ void rows_unpack(const uint4 &u, const float *, float *x) {
    x[0] = __uint_as_float(u.x), x[1] = __uint_as_float(u.y), x[2] = __uint_as_float(u.z), x[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void rows_unpack(const uint4 &u, const __half *, float *x) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __half22float2(h[k]);
        x[2 * k] = f.x, x[2 * k + 1] = f.y;
    }
}
__device__ __forceinline__ void rows_unpack(const uint4 &u, const __nv_bfloat16 *, float *x) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(h[k]);
        x[2 * k] = f.x, x[2 * k + 1] = f.y;
    }
}
template <typename T> __device__ __forceinline__ uint4 rows_pack(const float *x) {
    uint4 u;
    T *o = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int k = 0; k < 16 / (int)sizeof(T); k += 2) from_acc2<T>(x[k], x[k + 1], o + k);
    return u;
}

/* Whether row (b, h, i) of v is hd contiguous elements in whole 16-byte pieces. */
template <typename T>
__device__ __forceinline__ bool rows_vec(const attn_view &v, const T *p, int hd) {
    return v.sx == 1 && hd % (16 / (int)sizeof(T)) == 0 && ((uintptr_t)p & 15) == 0;
}

/* Row i of a [B, H, L, hd] operand as HDP f32 (zeros past hd). */
template <typename T, int HDP>
__device__ __forceinline__ void rows_load(const attn_view &v, int64_t b, int64_t h, int i, int hd, float x[HDP]) {
    const T *p = at<T>(v, b, h, i, 0);
    constexpr int VE = 16 / (int)sizeof(T);
    if (rows_vec<T>(v, p, hd)) {
#pragma unroll
        for (int c = 0; c < HDP; c += VE) {
            if (c < hd) rows_unpack(*reinterpret_cast<const uint4 *>(p + c), p, x + c);
            else
#pragma unroll
                for (int k = 0; k < VE; k++) x[c + k] = 0.f;
        }
        return;
    }
#pragma unroll
    for (int d = 0; d < HDP; d++) x[d] = d < hd ? to_acc(p[d * v.sx]) : 0.f;
}

/* Row i of a [B, H, L, hd] operand from HDP f32 (the first hd), added to what is there when
   asked. */
template <typename T, int HDP>
__device__ __forceinline__ void rows_store(const attn_view &v, int64_t b, int64_t h, int i, int hd,
                                           const float x[HDP], bool add) {
    T *p = at<T>(v, b, h, i, 0);
    constexpr int VE = 16 / (int)sizeof(T);
    if (rows_vec<T>(v, p, hd)) {
#pragma unroll
        for (int c = 0; c < HDP; c += VE)
            if (c < hd) {
                float y[VE];
                if (add) rows_unpack(*reinterpret_cast<const uint4 *>(p + c), p, y);
#pragma unroll
                for (int k = 0; k < VE; k++) y[k] = add ? y[k] + x[c + k] : x[c + k];
                *reinterpret_cast<uint4 *>(p + c) = rows_pack<T>(y);
            }
        return;
    }
#pragma unroll
    for (int d = 0; d < HDP; d++)
        if (d < hd) {
            T *o = p + d * v.sx;
            *o = from_acc<T>(add ? to_acc(*o) + x[d] : x[d]);
        }
}

/* HDP copies of c */
template <int HDP> __device__ __forceinline__ void rows_fill(float x[HDP], float c) {
#pragma unroll
    for (int d = 0; d < HDP; d++) x[d] = c;
}

/* Σ_d x[d]·row[d], d in order from 0 (the zero padding adds nothing) */
template <int HDP> __device__ __forceinline__ float rows_dot(const float x[HDP], const float *row) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < HDP / 4; c++) {
        const float4 k = reinterpret_cast<const float4 *>(row)[c];
        s += x[4 * c] * k.x;
        s += x[4 * c + 1] * k.y;
        s += x[4 * c + 2] * k.z;
        s += x[4 * c + 3] * k.w;
    }
    return s;
}

/* acc[d] += w·row[d] */
template <int HDP> __device__ __forceinline__ void rows_axpy(float acc[HDP], float w, const float *row) {
#pragma unroll
    for (int c = 0; c < HDP / 4; c++) {
        const float4 k = reinterpret_cast<const float4 *>(row)[c];
        acc[4 * c] += w * k.x;
        acc[4 * c + 1] += w * k.y;
        acc[4 * c + 2] += w * k.z;
        acc[4 * c + 3] += w * k.w;
    }
}

/* Rows [0, R) of up to two [L, L] operands (p NULL: absent) into shared memory as f32, row r at
   d[r·lds]; o: each row's element offset. The whole block takes part; the caller's barrier makes
   the rows visible. f32: asynchronous 4-byte copies, every row of the block in flight at once;
   f16 / bf16: through registers (converted), ROWS_U rows a warp in flight. */
template <typename S>
__device__ __forceinline__ void rows_stage(const attn_view &v0, const int64_t *o0, float *d0, const attn_view &v1,
                                           const int64_t *o1, float *d1, int R, int L, int lds) {
    const S *p0 = (const S *)v0.p, *p1 = (const S *)v1.p;
    if (!p0 && !p1) return;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if constexpr (sizeof(S) == sizeof(float)) {
        for (int r = w; r < R; r += nw)
            for (int j = lane; j < L; j += 32) {
                if (p0) __pipeline_memcpy_async(d0 + r * lds + j, p0 + o0[r] + j * v0.sx, sizeof(float));
                if (p1) __pipeline_memcpy_async(d1 + r * lds + j, p1 + o1[r] + j * v1.sx, sizeof(float));
            }
        __pipeline_commit();
        __pipeline_wait_prior(0);
    } else {
        for (int r0 = w * ROWS_U; r0 < R; r0 += nw * ROWS_U) {
            float x0[ROWS_U][2], x1[ROWS_U][2];
#pragma unroll
            for (int u = 0; u < ROWS_U; u++)
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    const int r = r0 + u, j = lane + 32 * t;
                    const bool in = r < R && j < L;
                    x0[u][t] = p0 && in ? to_acc(p0[o0[r] + j * v0.sx]) : 0.f;
                    x1[u][t] = p1 && in ? to_acc(p1[o1[r] + j * v1.sx]) : 0.f;
                }
#pragma unroll
            for (int u = 0; u < ROWS_U; u++)
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    const int r = r0 + u, j = lane + 32 * t;
                    if (r < R && j < L) {
                        if (p0) d0[r * lds + j] = x0[u][t];
                        if (p1) d1[r * lds + j] = x1[u][t];
                    }
                }
        }
    }
}

/* Rows [0, R) of shared memory (row r at src[r·lds]) out to an [L, L] operand, added to what is
   there when asked. The whole block takes part. */
template <typename S>
__device__ __forceinline__ void rows_unstage(const attn_view &v, const int64_t *o, const float *src, int R, int L,
                                             int lds, bool add) {
    S *p = (S *)v.p;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int r0 = w * ROWS_U; r0 < R; r0 += nw * ROWS_U) {
        float x[ROWS_U][2];
#pragma unroll
        for (int u = 0; u < ROWS_U; u++)
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int r = r0 + u, j = lane + 32 * t;
                const bool in = r < R && j < L;
                x[u][t] = in ? src[r * lds + j] : 0.f;
                if (add && in) x[u][t] += to_acc(p[o[r] + j * v.sx]);
            }
#pragma unroll
        for (int u = 0; u < ROWS_U; u++)
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int r = r0 + u, j = lane + 32 * t;
                if (r < R && j < L) p[o[r] + j * v.sx] = from_acc<S>(x[u][t]);
            }
    }
}

template <typename T, typename S, int HDP>
__global__ void __launch_bounds__(ROWS_THREADS) short_rows_fwd_kernel(attn_params a, int group) {
    extern __shared__ float4 sm4[];
    float *sm = reinterpret_cast<float *>(sm4);
    const int L = a.L, hd = a.hd, lds = rows_lds(L), hs = rows_hs(L, HDP);
    const int64_t n0 = (int64_t)blockIdx.x * group;
    const int gcount = (int)min((int64_t)group, (int64_t)a.B * a.H - n0), R = gcount * L;
    float *Ks = sm, *Vs = Ks + (size_t)group * hs, *Sc = Vs + (size_t)group * hs;
    int64_t *offi = reinterpret_cast<int64_t *>(sm + rows_floats(L, HDP, group, true)), *offo = offi + group * L;
    const int r = threadIdx.x;
    const bool active = r < R;
    const int g = active ? r / L : 0, i = active ? r - g * L : 0;
    const int64_t n = n0 + g, b = n / a.H, h = n - b * a.H;
    bool bad = false;
    int len = 0;
    float q[HDP];
    if (active) {
        len = seq_len(a, b, &bad);
        if (a.sin.p) offi[r] = b * a.sin.sb + h * a.sin.sh + i * a.sin.sl;
        if (a.sout.p) offo[r] = b * a.sout.sb + h * a.sout.sh + i * a.sout.sl;
        float x[HDP];
        rows_load<T, HDP>(a.k, b, h, i, hd, x);
        rows_put<HDP>(Ks + (size_t)g * hs + i * HDP, x);
        rows_load<T, HDP>(a.v, b, h, i, hd, x);
        rows_put<HDP>(Vs + (size_t)g * hs + i * HDP, x);
        rows_load<T, HDP>(a.q, b, h, i, hd, q);
    }
    __syncthreads();
    const attn_view none = {nullptr, 0, 0, 0, 0};
    rows_stage<S>(a.sin, offi, Sc, none, nullptr, nullptr, R, L, lds);
    __syncthreads();
    if (active) {
        float *srow = Sc + (size_t)r * lds; /* scores_in, then the scores (scores_out's row) */
        float *lse = a.lse + (n * L + i);
        float out[HDP];
        if (bad) { /* NaN what this row owns */
            for (int j = 0; j < L; j++) srow[j] = nan_f();
            rows_fill<HDP>(out, nan_f());
            rows_store<T, HDP>(a.o, b, h, i, hd, out, false);
            *lse = nan_f();
            if (i == 0) raise_bad_length(a, b);
        } else {
            const int jend = key_end(a, i, len);
            const float *K = Ks + (size_t)g * hs, *V = Vs + (size_t)g * hs;
            const bool has_sin = a.sin.p != nullptr;
            float m = NEG_INF;
            for (int j = 0; j < jend; j++) {
                const float x = rows_dot<HDP>(q, K + j * HDP) * a.scale + (has_sin ? srow[j] : 0.f);
                srow[j] = x;
                m = nan_max(m, x);
            }
            for (int j = jend; j < L; j++) srow[j] = NEG_INF;
            if (m == NEG_INF) { /* no key: o = 0, lse = −∞ */
                rows_fill<HDP>(out, 0.f);
                rows_store<T, HDP>(a.o, b, h, i, hd, out, false);
                *lse = NEG_INF;
            } else {
                float acc[HDP];
#pragma unroll
                for (int d = 0; d < HDP; d++) acc[d] = 0.f;
                float sum = 0.f;
                keep_row keep(a, n, i);
                for (int j = 0; j < jend; j++) {
                    const float e = expf(srow[j] - m);
                    sum += e;
                    rows_axpy<HDP>(acc, e * keep.at(a, j), V + j * HDP);
                }
                const float inv = 1.f / sum;
#pragma unroll
                for (int d = 0; d < HDP; d++) out[d] = acc[d] * inv;
                rows_store<T, HDP>(a.o, b, h, i, hd, out, false);
                *lse = m + logf(sum);
            }
        }
    }
    if (!a.sout.p) return;
    __syncthreads();
    rows_unstage<S>(a.sout, offo, Sc, R, L, lds, false);
}

template <typename T, typename S, int HDP>
__global__ void __launch_bounds__(ROWS_THREADS) short_rows_bwd_kernel(attn_params a, int group) {
    extern __shared__ float4 sm4[];
    float *sm = reinterpret_cast<float *>(sm4);
    const int L = a.L, hd = a.hd, lds = rows_lds(L), hs = rows_hs(L, HDP);
    const int64_t n0 = (int64_t)blockIdx.x * group;
    const int gcount = (int)min((int64_t)group, (int64_t)a.B * a.H - n0), R = gcount * L;
    float *Ks = sm, *Vs = Ks + (size_t)group * hs, *Qs = Vs + (size_t)group * hs, *dOs = Qs + (size_t)group * hs;
    float *Sa = dOs + (size_t)group * hs, *Sb = Sa + (size_t)group * L * lds;
    int64_t *offi = reinterpret_cast<int64_t *>(sm + rows_floats(L, HDP, group, false));
    int64_t *offg = offi + group * L, *offd = offg + group * L;
    const int r = threadIdx.x;
    const bool active = r < R;
    const int g = active ? r / L : 0, i = active ? r - g * L : 0;
    const int64_t n = n0 + g, b = n / a.H, h = n - b * a.H;
    bool bad = false;
    int len = 0;
    float q[HDP], dO[HDP];
    if (active) {
        len = seq_len(a, b, &bad);
        if (a.sin.p) offi[r] = b * a.sin.sb + h * a.sin.sh + i * a.sin.sl;
        if (a.dso.p) offg[r] = b * a.dso.sb + h * a.dso.sh + i * a.dso.sl;
        if (a.dsin.p) offd[r] = b * a.dsin.sb + h * a.dsin.sh + i * a.dsin.sl;
        float x[HDP];
        rows_load<T, HDP>(a.k, b, h, i, hd, x);
        rows_put<HDP>(Ks + (size_t)g * hs + i * HDP, x);
        rows_load<T, HDP>(a.v, b, h, i, hd, x);
        rows_put<HDP>(Vs + (size_t)g * hs + i * HDP, x);
        rows_load<T, HDP>(a.q, b, h, i, hd, q);
        rows_put<HDP>(Qs + (size_t)g * hs + i * HDP, q);
        rows_load<T, HDP>(a.dout, b, h, i, hd, dO);
        rows_put<HDP>(dOs + (size_t)g * hs + i * HDP, dO);
    }
    __syncthreads();
    rows_stage<S>(a.sin, offi, Sa, a.dso, offg, Sb, R, L, lds);
    __syncthreads();
    /* query row i: Sa's row becomes dS (dscores_in's row), Sb's P̃ */
    if (active) {
        float *arow = Sa + (size_t)r * lds, *brow = Sb + (size_t)r * lds;
        float out[HDP];
        if (bad) {
            for (int j = 0; j < L; j++) arow[j] = nan_f(); /* read by dscores_in alone */
            rows_fill<HDP>(out, nan_f());
            if (a.dq.p) rows_store<T, HDP>(a.dq, b, h, i, hd, out, false);
            if (i == 0) raise_bad_length(a, b);
        } else {
            const float lse = a.lse[n * L + i];
            const int jend = lse == NEG_INF ? 0 : key_end(a, i, len);
            rows_load<T, HDP>(a.o, b, h, i, hd, out);
            float Di = 0.f;
#pragma unroll
            for (int d = 0; d < HDP; d++)
                if (d < hd) Di += dO[d] * out[d];
            const float *K = Ks + (size_t)g * hs, *V = Vs + (size_t)g * hs;
            const bool has_sin = a.sin.p != nullptr, has_dso = a.dso.p != nullptr;
            float dq[HDP];
#pragma unroll
            for (int d = 0; d < HDP; d++) dq[d] = 0.f;
            keep_row keep(a, n, i);
            for (int j = 0; j < jend; j++) {
                float kj[HDP], vj[HDP];
                rows_get<HDP>(K + j * HDP, kj);
                rows_get<HDP>(V + j * HDP, vj);
                const float x = rows_dot_r<HDP>(q, kj) * a.scale + (has_sin ? arow[j] : 0.f);
                const float dpd = rows_dot_r<HDP>(dO, vj);
                const float p = expf(x - lse), kd = keep.at(a, j);
                const float ds = p * (dpd * kd - Di) + (has_dso ? brow[j] : 0.f);
                arow[j] = ds;
                brow[j] = p * kd;
#pragma unroll
                for (int d = 0; d < HDP; d++) dq[d] += ds * kj[d];
            }
            for (int j = jend; j < L; j++) arow[j] = brow[j] = 0.f;
            if (a.dq.p) {
#pragma unroll
                for (int d = 0; d < HDP; d++) out[d] = dq[d] * a.scale;
                rows_store<T, HDP>(a.dq, b, h, i, hd, out, a.accumulate);
            }
        }
    }
    __syncthreads();
    if (a.dsin.p) rows_unstage<S>(a.dsin, offd, Sa, R, L, lds, a.accumulate);
    /* key row j = i: dk, dv over the query rows that see it, in order */
    if (!active || (!a.dk.p && !a.dv.p)) return;
    const int j = i;
    float dk[HDP], dv[HDP];
#pragma unroll
    for (int d = 0; d < HDP; d++) dk[d] = dv[d] = 0.f;
    if (!bad && j < len) {
        const float *Q = Qs + (size_t)g * hs, *dOh = dOs + (size_t)g * hs;
        const float *ac = Sa + (size_t)g * L * lds + j, *bc = Sb + (size_t)g * L * lds + j;
        const int ifrom = a.causal ? j : 0; /* the rows before it are masked: skipped, the warp in step */
        for (int ii = 0; ii < L; ii++) {
            if (ii < ifrom) continue;
            rows_axpy<HDP>(dk, ac[ii * lds], Q + ii * HDP);
            rows_axpy<HDP>(dv, bc[ii * lds], dOh + ii * HDP);
        }
    }
    if (a.dk.p) {
#pragma unroll
        for (int d = 0; d < HDP; d++) dk[d] = bad ? nan_f() : dk[d] * a.scale;
        rows_store<T, HDP>(a.dk, b, h, j, hd, dk, a.accumulate && !bad);
    }
    if (a.dv.p) {
#pragma unroll
        for (int d = 0; d < HDP; d++) dv[d] = bad ? nan_f() : dv[d];
        rows_store<T, HDP>(a.dv, b, h, j, hd, dv, a.accumulate && !bad);
    }
}

/* ================================================================== TILED */

constexpr int TW = 4;          /* warps a block */
constexpr int TRPW = 4;        /* forward: query rows a warp */
constexpr int TBQ = TW * TRPW; /* forward: query rows a block */
constexpr int TBK = 32;        /* backward: keys a block (dk, dv) and a key tile (dq) */
constexpr int TBQB = 32;       /* backward: query rows a tile (dk, dv) and a block (dq) */
constexpr int TILED_HD = 256;

static int tiled_fwd_kt(int hd) { return hd <= 64 ? 64 : 32; }

static size_t tiled_fwd_smem(int hd) {
    const size_t kt = (size_t)tiled_fwd_kt(hd);
    return sizeof(float) * (kt * (hd + 1) + kt * hd + (size_t)TBQ * hd + (size_t)TBQ * kt);
}

/* NU = ceil(hd / 32): the head dims a lane accumulates (lane + 32·u). */
template <typename T, typename S, int NU>
__global__ void __launch_bounds__(TW * 32, 4) tiled_fwd_kernel(attn_params a, int kt_max) {
    extern __shared__ float sm[];
    const int L = a.L, hd = a.hd, ld = hd + 1;
    const int nqb = (L + TBQ - 1) / TBQ;
    const int64_t n = blockIdx.x / nqb, b = n / a.H, h = n % a.H;
    const int q0 = (int)(blockIdx.x % nqb) * TBQ;
    float *Ks = sm, *Vs = Ks + (size_t)kt_max * ld, *Qs = Vs + (size_t)kt_max * hd, *Ps = Qs + (size_t)TBQ * hd;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nq = min(TBQ, L - q0);
    bool bad;
    const int len = seq_len(a, b, &bad);
    if (bad) {
        for (int r = w; r < nq; r += TW) {
            const int i = q0 + r;
            for (int d = lane; d < hd; d += 32) *at<T>(a.o, b, h, i, d) = from_acc<T>(nan_f());
            for (int j = lane; a.sout.p && j < L; j += 32) *at<S>(a.sout, b, h, i, j) = from_acc<S>(nan_f());
            if (lane == 0) a.lse[n * L + i] = nan_f();
        }
        if (threadIdx.x == 0 && q0 == 0) raise_bad_length(a, b);
        return;
    }
    for (int e = threadIdx.x; e < nq * hd; e += blockDim.x) {
        const int r = e / hd, d = e - r * hd;
        Qs[e] = to_acc(*at<T>(a.q, b, h, q0 + r, d));
    }
    float m[TRPW], l[TRPW], oacc[TRPW][NU];
#pragma unroll
    for (int rr = 0; rr < TRPW; rr++) {
        m[rr] = NEG_INF, l[rr] = 0.f;
#pragma unroll
        for (int u = 0; u < NU; u++) oacc[rr][u] = 0.f;
    }
    const int jmax = key_end(a, q0 + nq - 1, len);
    for (int j0 = 0; j0 < jmax; j0 += kt_max) {
        const int kt = min(kt_max, jmax - j0);
        __syncthreads(); /* the previous tile is no longer read */
        for (int e = threadIdx.x; e < kt * hd; e += blockDim.x) {
            const int j = e / hd, d = e - j * hd;
            Ks[j * ld + d] = to_acc(*at<T>(a.k, b, h, j0 + j, d));
            Vs[e] = to_acc(*at<T>(a.v, b, h, j0 + j, d));
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < TRPW; rr++) {
            const int r = w * TRPW + rr, i = q0 + r;
            if (r >= nq) continue;
            const int jend = key_end(a, i, len);
            const float *q = Qs + (size_t)r * hd;
            float *pr = Ps + (size_t)r * kt_max;
            float s[2];
            float mt = NEG_INF;
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int jj = lane + 32 * t, j = j0 + jj;
                float x = NEG_INF;
                if (jj < kt && j < jend) {
                    float dot = 0.f;
                    for (int d = 0; d < hd; d++) dot += q[d] * Ks[jj * ld + d];
                    x = dot * a.scale;
                    if (a.sin.p) x += to_acc(*at<S>(a.sin, b, h, i, j));
                }
                if (a.sout.p && jj < kt) *at<S>(a.sout, b, h, i, j) = from_acc<S>(x);
                s[t] = x;
                mt = nan_max(mt, x);
            }
            mt = warp_max(mt);
            const float mn = nan_max(m[rr], mt);
            if (mn == NEG_INF) { /* nothing visible yet: P = 0 */
#pragma unroll
                for (int t = 0; t < 2; t++)
                    if (lane + 32 * t < kt) pr[lane + 32 * t] = 0.f;
            } else {
                const float alpha = m[rr] == NEG_INF ? 0.f : expf(m[rr] - mn);
                float sum = 0.f;
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    const int jj = lane + 32 * t;
                    if (jj >= kt) continue;
                    const float e = s[t] == NEG_INF ? 0.f : expf(s[t] - mn);
                    sum += e;
                    pr[jj] = e * keep_factor(a, n, i, j0 + jj);
                }
                l[rr] = l[rr] * alpha + warp_sum(sum);
                m[rr] = mn;
#pragma unroll
                for (int u = 0; u < NU; u++) oacc[rr][u] *= alpha;
            }
        }
        __syncwarp();
        for (int jj = 0; jj < kt; jj++) {
#pragma unroll
            for (int u = 0; u < NU; u++) {
                const int d = lane + 32 * u;
                const float vv = d < hd ? Vs[jj * hd + d] : 0.f;
#pragma unroll
                for (int rr = 0; rr < TRPW; rr++) oacc[rr][u] += Ps[(size_t)(w * TRPW + rr) * kt_max + jj] * vv;
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < TRPW; rr++) {
        const int r = w * TRPW + rr, i = q0 + r;
        if (r >= nq) continue;
        const bool none = !(l[rr] > 0.f) && l[rr] == l[rr]; /* l = 0: no key (NaN stays NaN) */
        const float inv = none ? 0.f : 1.f / l[rr];
#pragma unroll
        for (int u = 0; u < NU; u++) {
            const int d = lane + 32 * u;
            if (d < hd) *at<T>(a.o, b, h, i, d) = from_acc<T>(none ? 0.f : oacc[rr][u] * inv);
        }
        if (lane == 0) a.lse[n * L + i] = none ? NEG_INF : m[rr] + logf(l[rr]);
        for (int j = jmax + lane; a.sout.p && j < L; j += 32) *at<S>(a.sout, b, h, i, j) = from_acc<S>(NEG_INF);
    }
}

/* D[n·L + i] = Σ_d do·o, a warp a row (the tiled backward's first kernel). */
template <typename T>
__global__ void rowdot_kernel(attn_params a) {
    const int64_t rows = (int64_t)a.B * a.H * a.L;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int64_t n = row / a.L, b = n / a.H, h = n % a.H;
    const int i = (int)(row % a.L);
    float x = 0.f;
    for (int d = lane; d < a.hd; d += 32) x += to_acc(*at<T>(a.dout, b, h, i, d)) * to_acc(*at<T>(a.o, b, h, i, d));
    x = warp_sum(x);
    if (lane == 0) a.D[row] = x;
}

/* The backward's tile: queries [i0, i0 + TBQB) × keys [j0, j0 + TBK), each of the 128 threads a
   4 × 2 block of (row, key): dS and P̃ into shared memory, 0 where masked or out of range. The
   same code in both kernels, so dS is the same there. Qs, dOs [TBQB][ld]; Ks, Vs [TBK][ld]. */
template <typename S>
__device__ __forceinline__ void tile_ds(const attn_params &a, int64_t n, int64_t b, int64_t h, int i0, int j0, int len,
                                        const float *Qs, const float *dOs, const float *Ks, const float *Vs,
                                        const float *lse, const float *Dr, float *dSs, float *Pts, int lds,
                                        bool write_dsin) {
    const int hd = a.hd, ld = hd + 1, L = a.L;
    const int ti = threadIdx.x / 16, tj = threadIdx.x % 16;
    float s[4][2], dp[4][2];
#pragma unroll
    for (int x = 0; x < 4; x++) s[x][0] = s[x][1] = dp[x][0] = dp[x][1] = 0.f;
    for (int d = 0; d < hd; d++) {
        float qv[4], ov[4], kv[2], vv[2];
#pragma unroll
        for (int x = 0; x < 4; x++) qv[x] = Qs[(ti * 4 + x) * ld + d], ov[x] = dOs[(ti * 4 + x) * ld + d];
#pragma unroll
        for (int y = 0; y < 2; y++) kv[y] = Ks[(tj * 2 + y) * ld + d], vv[y] = Vs[(tj * 2 + y) * ld + d];
#pragma unroll
        for (int x = 0; x < 4; x++)
#pragma unroll
            for (int y = 0; y < 2; y++) s[x][y] += qv[x] * kv[y], dp[x][y] += ov[x] * vv[y];
    }
#pragma unroll
    for (int x = 0; x < 4; x++) {
        const int r = ti * 4 + x, i = i0 + r;
        const float lr = i < L ? lse[r] : NEG_INF;
        const int jend = (i < L && lr != NEG_INF) ? key_end(a, i, len) : 0;
#pragma unroll
        for (int y = 0; y < 2; y++) {
            const int c = tj * 2 + y, j = j0 + c;
            float ds = 0.f, pt = 0.f;
            if (j < jend) {
                float xv = s[x][y] * a.scale;
                if (a.sin.p) xv += to_acc(*at<S>(a.sin, b, h, i, j));
                const float p = expf(xv - lr), kd = keep_factor(a, n, i, j);
                pt = p * kd;
                ds = p * (dp[x][y] * kd - Dr[r]);
                if (a.dso.p) ds += to_acc(*at<S>(a.dso, b, h, i, j));
            }
            if (write_dsin && a.dsin.p && i < L && j < L) {
                S *o = at<S>(a.dsin, b, h, i, j);
                *o = from_acc<S>(a.accumulate ? to_acc(*o) + ds : ds);
            }
            dSs[r * lds + c] = ds;
            Pts[r * lds + c] = pt;
        }
    }
}

/* rows [r0, r0 + n) of a [L, hd] operand into shared memory [TB][ld], zeros past L (k and v pass
   the sequence's length: dS·k adds a padded key's row with weight 0, and 0·Inf is NaN) */
template <typename T>
__device__ __forceinline__ void load_tile(const attn_view &v, int64_t b, int64_t h, int r0, int L, int hd, int rows,
                                          float *dst) {
    const int ld = hd + 1;
    for (int e = threadIdx.x; e < rows * hd; e += blockDim.x) {
        const int r = e / hd, d = e - r * hd;
        dst[r * ld + d] = r0 + r < L ? to_acc(*at<T>(v, b, h, r0 + r, d)) : 0.f;
    }
}

static size_t tiled_bwd_smem(int hd) {
    const size_t ld = (size_t)hd + 1;
    /* Q, dO [TBQB][ld]; K, V [TBK][ld]; the owner's sums [TB][hd] ×2; dS, P̃ [TBQB][TBK + 1]; lse, D */
    return sizeof(float) * (2 * TBQB * ld + 2 * TBK * ld + 2 * (size_t)32 * hd + 2 * TBQB * (TBK + 1) + 2 * TBQB);
}

/* dk, dv of keys [j0, j0 + TBK) of head n, over the query tiles that see them. */
template <typename T, typename S>
__global__ void __launch_bounds__(TW * 32, 4) tiled_dkdv_kernel(attn_params a) {
    extern __shared__ float sm[];
    const int L = a.L, hd = a.hd, ld = hd + 1, lds = TBK + 1;
    const int nkb = (L + TBK - 1) / TBK;
    const int64_t n = blockIdx.x / nkb, b = n / a.H, h = n % a.H;
    const int j0 = (int)(blockIdx.x % nkb) * TBK, nk = min(TBK, L - j0);
    float *Qs = sm, *dOs = Qs + TBQB * ld, *Ks = dOs + TBQB * ld, *Vs = Ks + TBK * ld;
    float *dKs = Vs + TBK * ld, *dVs = dKs + TBK * hd, *dSs = dVs + TBK * hd, *Pts = dSs + TBQB * lds;
    float *lses = Pts + TBQB * lds, *Dr = lses + TBQB;
    bool bad;
    const int len = seq_len(a, b, &bad);
    if (bad) {
        for (int e = threadIdx.x; e < nk * hd; e += blockDim.x) {
            const int j = e / hd, d = e - j * hd;
            if (a.dk.p) *at<T>(a.dk, b, h, j0 + j, d) = from_acc<T>(nan_f());
            if (a.dv.p) *at<T>(a.dv, b, h, j0 + j, d) = from_acc<T>(nan_f());
        }
        return; /* the dq kernel raises the flag */
    }
    load_tile<T>(a.k, b, h, j0, len, hd, TBK, Ks);
    load_tile<T>(a.v, b, h, j0, len, hd, TBK, Vs);
    for (int e = threadIdx.x; e < TBK * hd; e += blockDim.x) dKs[e] = dVs[e] = 0.f;
    /* query tiles that see a key of the block: causal: rows >= j0; none when the block is past len */
    const int qstart = j0 >= len ? L : (a.causal ? j0 / TBQB * TBQB : 0);
    for (int i0 = qstart; i0 < L; i0 += TBQB) {
        __syncthreads();
        load_tile<T>(a.q, b, h, i0, L, hd, TBQB, Qs);
        load_tile<T>(a.dout, b, h, i0, L, hd, TBQB, dOs);
        for (int r = threadIdx.x; r < TBQB; r += blockDim.x) {
            lses[r] = i0 + r < L ? a.lse[n * L + i0 + r] : NEG_INF;
            Dr[r] = i0 + r < L ? a.D[n * L + i0 + r] : 0.f;
        }
        __syncthreads();
        tile_ds<S>(a, n, b, h, i0, j0, len, Qs, dOs, Ks, Vs, lses, Dr, dSs, Pts, lds, false);
        __syncthreads();
        for (int e = threadIdx.x; e < TBK * hd; e += blockDim.x) {
            const int j = e / hd, d = e - j * hd;
            float ak = dKs[e], av = dVs[e];
            for (int r = 0; r < TBQB; r++) {
                ak += dSs[r * lds + j] * Qs[r * ld + d];
                av += Pts[r * lds + j] * dOs[r * ld + d];
            }
            dKs[e] = ak, dVs[e] = av;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nk * hd; e += blockDim.x) {
        const int j = e / hd, d = e - j * hd;
        if (a.dk.p) {
            T *o = at<T>(a.dk, b, h, j0 + j, d);
            const float v = dKs[e] * a.scale;
            *o = from_acc<T>(a.accumulate ? to_acc(*o) + v : v);
        }
        if (a.dv.p) {
            T *o = at<T>(a.dv, b, h, j0 + j, d);
            const float v = dVs[e];
            *o = from_acc<T>(a.accumulate ? to_acc(*o) + v : v);
        }
    }
}

/* dq and dscores_in of query rows [i0, i0 + TBQB) of head n, over the key tiles they see. */
template <typename T, typename S>
__global__ void __launch_bounds__(TW * 32, 4) tiled_dq_kernel(attn_params a) {
    extern __shared__ float sm[];
    const int L = a.L, hd = a.hd, ld = hd + 1, lds = TBK + 1;
    const int nqb = (L + TBQB - 1) / TBQB;
    const int64_t n = blockIdx.x / nqb, b = n / a.H, h = n % a.H;
    const int i0 = (int)(blockIdx.x % nqb) * TBQB, nq = min(TBQB, L - i0);
    float *Qs = sm, *dOs = Qs + TBQB * ld, *Ks = dOs + TBQB * ld, *Vs = Ks + TBK * ld;
    float *dQs = Vs + TBK * ld, *dSs = dQs + 2 * 32 * hd, *Pts = dSs + TBQB * lds;
    float *lses = Pts + TBQB * lds, *Dr = lses + TBQB;
    bool bad;
    const int len = seq_len(a, b, &bad);
    if (bad) {
        for (int e = threadIdx.x; a.dq.p && e < nq * hd; e += blockDim.x) {
            const int r = e / hd, d = e - r * hd;
            *at<T>(a.dq, b, h, i0 + r, d) = from_acc<T>(nan_f());
        }
        for (int e = threadIdx.x; a.dsin.p && e < nq * L; e += blockDim.x) {
            const int r = e / L, j = e - r * L;
            *at<S>(a.dsin, b, h, i0 + r, j) = from_acc<S>(nan_f());
        }
        if (threadIdx.x == 0 && i0 == 0) raise_bad_length(a, b);
        return;
    }
    if (!a.dq.p && !a.dsin.p) return; /* launched for the flag alone */
    load_tile<T>(a.q, b, h, i0, L, hd, TBQB, Qs);
    load_tile<T>(a.dout, b, h, i0, L, hd, TBQB, dOs);
    for (int r = threadIdx.x; r < TBQB; r += blockDim.x) {
        lses[r] = i0 + r < L ? a.lse[n * L + i0 + r] : NEG_INF;
        Dr[r] = i0 + r < L ? a.D[n * L + i0 + r] : 0.f;
    }
    for (int e = threadIdx.x; e < TBQB * hd; e += blockDim.x) dQs[e] = 0.f;
    const int jmax = key_end(a, i0 + nq - 1, len);
    for (int j0 = 0; j0 < jmax; j0 += TBK) {
        __syncthreads();
        load_tile<T>(a.k, b, h, j0, len, hd, TBK, Ks);
        load_tile<T>(a.v, b, h, j0, len, hd, TBK, Vs);
        __syncthreads();
        tile_ds<S>(a, n, b, h, i0, j0, len, Qs, dOs, Ks, Vs, lses, Dr, dSs, Pts, lds, true);
        __syncthreads();
        for (int e = threadIdx.x; e < TBQB * hd; e += blockDim.x) {
            const int r = e / hd, d = e - r * hd;
            float acc = dQs[e];
            for (int c = 0; c < TBK; c++) acc += dSs[r * lds + c] * Ks[c * ld + d];
            dQs[e] = acc;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; a.dq.p && e < nq * hd; e += blockDim.x) {
        const int r = e / hd, d = e - r * hd;
        T *o = at<T>(a.dq, b, h, i0 + r, d);
        const float v = dQs[e] * a.scale;
        *o = from_acc<T>(a.accumulate ? to_acc(*o) + v : v);
    }
    /* scores past the last key tile: masked, dS = 0 */
    const int jfrom = (jmax + TBK - 1) / TBK * TBK;
    for (int e = threadIdx.x; a.dsin.p && !a.accumulate && e < nq * (L - jfrom); e += blockDim.x) {
        const int r = e / (L - jfrom), j = jfrom + e % (L - jfrom);
        *at<S>(a.dsin, b, h, i0 + r, j) = from_acc<S>(0.f);
    }
}

/* ================================================================== launch */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename K>
static cudaError_t allow_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <typename T, typename S>
static cudaError_t run_short(const attn_params &a, bool forward, int group, int rows, cudaStream_t st) {
    const int64_t blocks = cdiv((int64_t)a.B * a.H, group);
    if (forward) {
        const size_t smem = short_fwd_smem(a.L, a.hd, group);
        cudaError_t e = allow_smem(short_fwd_kernel<T, S>, smem);
        if (e != cudaSuccess) return e;
        short_fwd_kernel<T, S><<<(unsigned)blocks, SHORT_WARPS * 32, smem, st>>>(a, group);
        return cudaGetLastError();
    }
    const size_t smem = short_bwd_smem(a.L, a.hd, group, rows);
    cudaError_t e = allow_smem(short_bwd_kernel<T, S>, smem);
    if (e != cudaSuccess) return e;
    short_bwd_kernel<T, S><<<(unsigned)blocks, SHORT_WARPS * 32, smem, st>>>(a, group, rows);
    return cudaGetLastError();
}

template <typename T, typename S, int HDP>
static cudaError_t launch_rows(const attn_params &a, bool forward, int group, cudaStream_t st) {
    const int64_t blocks = cdiv((int64_t)a.B * a.H, group);
    const unsigned threads = (unsigned)((group * a.L + 31) / 32 * 32);
    const size_t smem = rows_smem(a.L, HDP, group, forward);
    if (forward) {
        cudaError_t e = allow_smem(short_rows_fwd_kernel<T, S, HDP>, smem);
        if (e != cudaSuccess) return e;
        short_rows_fwd_kernel<T, S, HDP><<<(unsigned)blocks, threads, smem, st>>>(a, group);
        return cudaGetLastError();
    }
    cudaError_t e = allow_smem(short_rows_bwd_kernel<T, S, HDP>, smem);
    if (e != cudaSuccess) return e;
    short_rows_bwd_kernel<T, S, HDP><<<(unsigned)blocks, threads, smem, st>>>(a, group);
    return cudaGetLastError();
}

template <typename T, typename S>
static cudaError_t run_rows(const attn_params &a, bool forward, int group, int hdp, cudaStream_t st) {
    if (hdp == 8) return launch_rows<T, S, 8>(a, forward, group, st);
    if (hdp == 16) return launch_rows<T, S, 16>(a, forward, group, st);
    return launch_rows<T, S, 32>(a, forward, group, st);
}

template <typename T, typename S, int NU>
static cudaError_t launch_tiled_fwd(const attn_params &a, cudaStream_t st) {
    const int kt = tiled_fwd_kt(a.hd);
    const size_t smem = tiled_fwd_smem(a.hd);
    cudaError_t e = allow_smem(tiled_fwd_kernel<T, S, NU>, smem);
    if (e != cudaSuccess) return e;
    const int64_t blocks = (int64_t)a.B * a.H * cdiv(a.L, TBQ);
    tiled_fwd_kernel<T, S, NU><<<(unsigned)blocks, TW * 32, smem, st>>>(a, kt);
    return cudaGetLastError();
}

template <typename T, typename S>
static cudaError_t run_tiled(const attn_params &a, bool forward, cudaStream_t st) {
    if (forward) {
        const int nu = (a.hd + 31) / 32;
        if (nu <= 1) return launch_tiled_fwd<T, S, 1>(a, st);
        if (nu <= 2) return launch_tiled_fwd<T, S, 2>(a, st);
        if (nu <= 4) return launch_tiled_fwd<T, S, 4>(a, st);
        return launch_tiled_fwd<T, S, 8>(a, st);
    }
    const int64_t rows = (int64_t)a.B * a.H * a.L;
    rowdot_kernel<T><<<(unsigned)cdiv(rows, 8), 256, 0, st>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const size_t smem = tiled_bwd_smem(a.hd);
    if (a.dk.p || a.dv.p) {
        e = allow_smem(tiled_dkdv_kernel<T, S>, smem);
        if (e != cudaSuccess) return e;
        tiled_dkdv_kernel<T, S><<<(unsigned)((int64_t)a.B * a.H * cdiv(a.L, TBK)), TW * 32, smem, st>>>(a);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    e = allow_smem(tiled_dq_kernel<T, S>, smem);
    if (e != cudaSuccess) return e;
    tiled_dq_kernel<T, S><<<(unsigned)((int64_t)a.B * a.H * cdiv(a.L, TBQB)), TW * 32, smem, st>>>(a);
    return cudaGetLastError();
}

/* ================================================================== plan */

static int max_smem(int device) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        v = 48 * 1024;
    }
    return v;
}

/* Heads a short-sequence block holds: about 256 query rows of work a block (32 a warp), within
   a shared-memory budget that leaves room for a few blocks an SM. 0: the shape does not fit. */
static int short_group(const fg_attn_problem *p, int smem_limit, int *rows) {
    if (p->L > SHORT_L || p->hd > SHORT_HD || p->L < 1) return 0;
    const int L = (int)p->L, hd = (int)p->hd;
    *rows = L <= 64 ? L : 32;
    int g = 256 / L;
    if (g < 1) g = 1;
    if (g > 16) g = 16;
    const size_t budget = 64 * 1024;
    for (; g > 1; g--) {
        const size_t need = p->forward ? short_fwd_smem(L, hd, g) : short_bwd_smem(L, hd, g, *rows);
        if (need <= budget) break;
    }
    if (!p->forward)
        while (short_bwd_smem(L, hd, 1, *rows) > (size_t)smem_limit && *rows > 8) *rows /= 2;
    const size_t need = p->forward ? short_fwd_smem(L, hd, g) : short_bwd_smem(L, hd, g, *rows);
    return need <= (size_t)smem_limit ? g : 0;
}

static int sm_smem(int device) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
        cudaGetLastError();
        v = 48 * 1024;
    }
    return v;
}

/* The thread-a-row kernels' padded head dim (two float4 at least), 0: not their shape. */
static int rows_hdp(const fg_attn_problem *p) {
    if (p->L < 1 || p->L > ROWS_L || p->hd > ROWS_HD) return 0;
    return p->hd <= 8 ? 8 : p->hd <= 16 ? 16 : 32;
}

template <typename T, typename S>
static const void *rows_kernel_of(bool forward, int hdp) {
    if (forward)
        return hdp == 8    ? (const void *)short_rows_fwd_kernel<T, S, 8>
               : hdp == 16 ? (const void *)short_rows_fwd_kernel<T, S, 16>
                           : (const void *)short_rows_fwd_kernel<T, S, 32>;
    return hdp == 8    ? (const void *)short_rows_bwd_kernel<T, S, 8>
           : hdp == 16 ? (const void *)short_rows_bwd_kernel<T, S, 16>
                       : (const void *)short_rows_bwd_kernel<T, S, 32>;
}

/* The warps an SM holds of the thread-a-row kernel a problem runs, by its registers. */
static int rows_warps_per_sm(const fg_attn_problem *p, int hdp) {
    const bool s32 = p->sdtype == FG_F32;
    const void *f = p->dtype == FG_F32   ? rows_kernel_of<float, float>(p->forward, hdp)
                    : p->dtype == FG_F16 ? (s32 ? rows_kernel_of<__half, float>(p->forward, hdp)
                                                : rows_kernel_of<__half, __half>(p->forward, hdp))
                    : s32 ? rows_kernel_of<__nv_bfloat16, float>(p->forward, hdp)
                          : rows_kernel_of<__nv_bfloat16, __nv_bfloat16>(p->forward, hdp);
    cudaFuncAttributes at;
    if (cudaFuncGetAttributes(&at, f) != cudaSuccess) {
        cudaGetLastError();
        return 32;
    }
    const int per_warp = (at.numRegs * 32 + 255) / 256 * 256; /* allocated a warp at a time, 256 at once */
    const int warps = per_warp > 0 ? 65536 / per_warp : 64;
    return warps < 64 ? warps : 64;
}

/* Heads a thread-a-row block holds: the count that keeps the most query rows resident on an SM
   (its shared memory and registers, shared memory a block), weighed by the block's busy lanes
   (rows / threads), among the counts that leave at least 4 blocks an SM when one does (blocks
   overlap their loads with the others' arithmetic); ties to the smaller block. 0: not even one
   head fits. */
static int rows_group(const fg_attn_problem *p, int hdp, int smem_block, int smem_sm) {
    const int L = (int)p->L;
    const int warps_sm = rows_warps_per_sm(p, hdp);
    int best = 0, best_many = 0;
    int64_t best_score = 0, best_many_score = 0;
    for (int g = 1; g * L <= ROWS_THREADS; g++) {
        const size_t need = rows_smem(L, hdp, g, p->forward);
        if (need > (size_t)smem_block) break;
        const int warps = (g * L + 31) / 32;
        int per_sm = (int)((size_t)smem_sm / (need + 1024));
        per_sm = per_sm < warps_sm / warps ? per_sm : warps_sm / warps;
        per_sm = per_sm < 32 ? per_sm : 32;
        const int64_t score = (int64_t)per_sm * g * L * g * L * 1024 / (warps * 32);
        if (score > best_score) best = g, best_score = score;
        if (per_sm >= 4 && score > best_many_score) best_many = g, best_many_score = score;
    }
    return best_many ? best_many : best;
}

static const char *dname(fg_dtype t) { return fg_dtype_name(t); }

} // namespace

extern "C" fg_status fg_cuda_attn_plan(fg_context *ctx, const fg_attn_problem *p, fg_attn_path *path) {
    memset(path, 0, sizeof *path);
    const char *op = p->forward ? "attention_forward" : "attention_backward";
    if (p->dtype == FG_F64)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: the cuda backend has no f64 kernels for it (f64 runs on the CPU)", op);
    if (p->hd > TILED_HD)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: hd=%lld is beyond the CUDA kernels' 256 (the CPU backend takes it)", op,
                       (long long)p->hd);
    if (p->L > INT32_MAX / 2 || p->B * p->H * ((p->L + 15) / 16) > INT32_MAX || p->pieces > INT32_MAX)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: B·H=%lld, L=%lld: more blocks than the CUDA kernels' grid takes", op,
                       (long long)(p->B * p->H), (long long)p->L);
    int khdp = 0;
    const bool qrow = fg_cuda_attn_qrow_fits(p, &khdp);
    if (p->pieces > 1 && !qrow)
        return fg_fail(FG_ERR_UNSUPPORTED,
                       "%s: q and k in %lld pieces run on the CUDA backend's short-sequence kernels only (L <= 64, "
                       "hd <= 8; here L=%lld, hd=%lld); the CPU backend takes any size",
                       op, (long long)p->pieces, (long long)p->L, (long long)p->hd);
    if (qrow) {
        path->kernel = FG_ATTN_SHORT_QROW;
        path->group = khdp << 16;
        snprintf(path->name, sizeof path->name, "attn_short_qrow_%s<%s,%d>", p->forward ? "fwd" : "bwd",
                 dname(p->dtype), khdp);
        return FG_OK;
    }
    const int limit = max_smem(ctx->device);
    const int hdp = rows_hdp(p);
    int rgroup = 0;
    if (hdp) {
        fg_device_guard guard(ctx->device); /* the kernel's attributes on the context's device */
        rgroup = rows_group(p, hdp, limit, sm_smem(ctx->device));
    }
    if (rgroup > 0) {
        path->kernel = FG_ATTN_SHORT_ROWS;
        path->group = rgroup | hdp << 16;
        snprintf(path->name, sizeof path->name, "attn_short_rows_%s<%s,%d>", p->forward ? "fwd" : "bwd",
                 dname(p->dtype), hdp);
        return FG_OK;
    }
    int rows = 0;
    const int group = short_group(p, limit, &rows);
    const bool flash = fg_cuda_attn_flash_fits(p);
    const char *dt = dname(p->dtype);
    if (group > 0 && !(flash && p->L > 64)) {
        path->kernel = FG_ATTN_SHORT;
        path->group = group | rows << 16;
        snprintf(path->name, sizeof path->name, "attn_short_%s<%s>", p->forward ? "fwd" : "bwd", dt);
        return FG_OK;
    }
    if (!p->forward) path->workspace = (size_t)(p->B * p->H * p->L) * sizeof(float) + 256;
    if (flash) {
        const bool w9 = fg_cuda_attn_flash_w9(p, ctx->device);
        const char *f = w9 ? "flash90" : "flash";
        path->kernel = FG_ATTN_FLASH;
        path->group = (int)p->hd | (w9 ? 1 << 16 : 0);
        if (p->forward) snprintf(path->name, sizeof path->name, "attn_%s_fwd<%s,%d>", f, dt, (int)p->hd);
        else if (p->want_dk || p->want_dv)
            snprintf(path->name, sizeof path->name, "attn_flash_rowdot<%s,%d> ; attn_%s_dkdv<%s,%d> ; attn_%s_dq<%s,%d>",
                     dt, (int)p->hd, f, dt, (int)p->hd, f, dt, (int)p->hd);
        else
            snprintf(path->name, sizeof path->name, "attn_flash_rowdot<%s,%d> ; attn_%s_dq<%s,%d>", dt, (int)p->hd, f, dt,
                     (int)p->hd);
        return FG_OK;
    }
    if ((size_t)limit < tiled_fwd_smem((int)p->hd) || (size_t)limit < tiled_bwd_smem((int)p->hd))
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: hd=%lld needs more shared memory than this device has", op,
                       (long long)p->hd);
    path->kernel = FG_ATTN_TILED;
    if (p->forward) snprintf(path->name, sizeof path->name, "attn_tiled_fwd<%s>", dt);
    else if (p->want_dk || p->want_dv)
        snprintf(path->name, sizeof path->name, "attn_rowdot<%s> ; attn_tiled_dkdv<%s> ; attn_tiled_dq<%s>", dt, dt, dt);
    else
        snprintf(path->name, sizeof path->name, "attn_rowdot<%s> ; attn_tiled_dq<%s>", dt, dt);
    return FG_OK;
}

template <typename T, typename S>
static cudaError_t dispatch(const fg_attn_call *c, const attn_params &a, cudaStream_t st) {
    switch (c->path.kernel) {
    case FG_ATTN_SHORT_ROWS: return run_rows<T, S>(a, c->p.forward, c->path.group & 0xffff, c->path.group >> 16, st);
    case FG_ATTN_SHORT: return run_short<T, S>(a, c->p.forward, c->path.group & 0xffff, c->path.group >> 16, st);
    case FG_ATTN_TILED: return run_tiled<T, S>(a, c->p.forward, st);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" fg_status fg_cuda_attn(fg_context *ctx, const fg_attn_call *c) {
    const fg_attn_problem *p = &c->p;
    fg_device_guard guard(ctx->device);
    cudaStream_t st = ctx->cuda->stream;
    attn_params a;
    memset(&a, 0, sizeof a);
    a.B = (int)p->B, a.H = (int)p->H, a.L = (int)p->L, a.hd = (int)p->hd, a.P = (int)p->pieces;
    a.scale = (float)c->scale;
    a.causal = p->causal, a.dropout = p->dropout, a.accumulate = p->accumulate;
    a.len64 = p->ldtype == FG_I64;
    a.keep_min = c->keep_min, a.keep_scale = (float)c->keep_scale;
    a.seed = c->seed, a.offset = c->offset;
    a.lengths = c->lengths;
    a.q = attn_view_of(c->q), a.k = attn_view_of(c->k), a.v = attn_view_of(c->v), a.o = attn_view_of(c->o);
    a.sin = attn_view_of(c->scores_in), a.sout = attn_view_of(c->scores_out);
    a.dout = attn_view_of(c->d_o), a.dso = attn_view_of(c->dscores), a.dq = attn_view_of(c->dq);
    a.dk = attn_view_of(c->dk), a.dv = attn_view_of(c->dv), a.dsin = attn_view_of(c->dscores_in);
    a.lse = (float *)c->lse;
    a.flag = ctx->cuda->flag;
    if (!p->forward) {
        const size_t need = (size_t)(p->B * p->H * p->L) * sizeof(float);
        if (c->path.kernel != FG_ATTN_SHORT && c->path.kernel != FG_ATTN_SHORT_ROWS &&
            c->path.kernel != FG_ATTN_SHORT_QROW) {
            if (!c->ws || c->ws_bytes < need)
                return fg_fail(FG_ERR_WORKSPACE, "attention_backward: workspace of %zu bytes given, %zu needed",
                               c->ws_bytes, need);
            a.D = (float *)c->ws;
        }
    }
    if ((int64_t)p->B * p->H * p->L == 0) return FG_OK;
    const bool s32 = p->sdtype == FG_F32;
    cudaError_t e = cudaErrorInvalidValue;
    if (c->path.kernel == FG_ATTN_FLASH) {
        e = fg_cuda_attn_flash(a, p->forward, p->dtype, (c->path.group >> 16) & 1, st);
    } else if (c->path.kernel == FG_ATTN_SHORT_QROW) {
        e = fg_cuda_attn_qrow(a, p->forward, p->dtype, s32, c->path.group >> 16, st);
    } else if (p->dtype == FG_F32) {
        e = dispatch<float, float>(c, a, st);
    } else if (p->dtype == FG_F16) {
        e = s32 ? dispatch<__half, float>(c, a, st) : dispatch<__half, __half>(c, a, st);
    } else if (p->dtype == FG_BF16) {
        e = s32 ? dispatch<__nv_bfloat16, float>(c, a, st) : dispatch<__nv_bfloat16, __nv_bfloat16>(c, a, st);
    }
    if (e != cudaSuccess) return fg_cuda_fail(e, p->forward ? "attention_forward" : "attention_backward");
    /* the labels the plan named, one a launched kernel */
    char names[sizeof c->path.name];
    snprintf(names, sizeof names, "%s", c->path.name);
    for (char *s = names; s && *s;) {
        char *end = strstr(s, " ; ");
        if (end) *end = 0;
        fg_record_kernel(ctx, s);
        s = end ? end + 3 : NULL;
    }
    return FG_OK;
}

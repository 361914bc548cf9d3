/*
 * attention_keys.cu — the key-lane kernels for short sequences (L <= 64, hd <= 8: PatchTST's
 * heads, L 42 with hd 4 or 8; any dtype and strides, every option).
 *
 * Sixteen lanes a head, two heads a warp: lane l holds keys l, l + 16, … (NS of them) with their
 * k, v rows — and in the backward their dk, dv sums — in registers. A query row is one step of
 * the warp: its q (backward: do, lse and D = Σ do·o too) broadcast from shared memory, one score
 * a key a lane. So the [L, L] score operands (scores in and out, their gradients) move as
 * coalesced rows straight between registers and memory, the next row's loads in flight while
 * this one computes; the softmax is two 16-lane reductions, and P·v (the backward's dS·k) a
 * reduce-scatter that leaves each lane one head dim of the row. No [L, L] buffer, no block
 * barrier, no atomics but the bad-length flag, every sum in a fixed order. Each kernel is built
 * with and without dropout: without, it carries none of the Philox draw's registers (the hd-8
 * backward then fits its 168 without spilling).
 * Why: the thread-a-row kernels (attention.cu, SHORT ROWS) stage the score rows through shared
 * memory (a head's rows take ≈ 21 KB there, so few heads fit an SM) and spend most of their
 * instructions addressing it; here the scores never leave registers and a head needs
 * ≈ 3 KB. The masking, dropout, NaN and bad-length rules are attention.cuh's, as on every path.
 */
#include "attention.cuh"

namespace {

constexpr float KNEG_INF = -INFINITY;
constexpr int KL = 16;                     /* lanes a head */
constexpr int KWARPS = 4;                  /* warps a block */
constexpr int KHEADS = KWARPS * 32 / KL;   /* heads a block */
constexpr unsigned KFULL = 0xffffffffu;

__device__ __forceinline__ float knan() { return __int_as_float(0x7fc00000); }

/* Row i of a [B, H, L, hd] operand as HDP f32 (zeros past hd): whole chunks of up to 16 bytes
   where the row is contiguous and aligned, element by element otherwise. */
template <typename T, int HDP>
__device__ __forceinline__ void key_load(const attn_view &v, int64_t b, int64_t h, int i, int hd, float x[HDP]) {
    const T *p = at<T>(v, b, h, i, 0);
    constexpr int CB = HDP * (int)sizeof(T) < 16 ? HDP * (int)sizeof(T) : 16, E = CB / (int)sizeof(T);
    if (v.sx == 1 && hd % E == 0 && ((uintptr_t)p & (CB - 1)) == 0) {
#pragma unroll
        for (int c = 0; c < HDP; c += E) {
            if (c < hd) {
                const vec_t<T, E> u = *reinterpret_cast<const vec_t<T, E> *>(p + c);
#pragma unroll
                for (int e = 0; e < E; e++) x[c + e] = to_acc(u.v[e]);
            } else {
#pragma unroll
                for (int e = 0; e < E; e++) x[c + e] = 0.f;
            }
        }
        return;
    }
#pragma unroll
    for (int d = 0; d < HDP; d++) x[d] = d < hd ? to_acc(p[d * v.sx]) : 0.f;
}

/* Key j's k or v row, zeros at or past the sequence's length: a padded key's Inf or NaN never
   meets the zero weight of its masked score (0·Inf is NaN); the CPU never reads those rows. */
template <typename T, int HDP>
__device__ __forceinline__ void key_load_live(const attn_view &v, int64_t b, int64_t h, int j, int len, int hd,
                                              float x[HDP]) {
    if (j < len) {
        key_load<T, HDP>(v, b, h, j, hd, x);
        return;
    }
#pragma unroll
    for (int d = 0; d < HDP; d++) x[d] = 0.f;
}

/* Row i of a [B, H, L, hd] operand from the first hd of x, added to what is there when asked. */
template <typename T, int HDP>
__device__ __forceinline__ void key_store(const attn_view &v, int64_t b, int64_t h, int i, int hd, const float x[HDP],
                                          bool add) {
    T *p = at<T>(v, b, h, i, 0);
    constexpr int CB = HDP * (int)sizeof(T) < 16 ? HDP * (int)sizeof(T) : 16, E = CB / (int)sizeof(T);
    if (v.sx == 1 && hd % E == 0 && ((uintptr_t)p & (CB - 1)) == 0) {
#pragma unroll
        for (int c = 0; c < HDP; c += E)
            if (c < hd) {
                vec_t<T, E> u;
                if (add) u = *reinterpret_cast<const vec_t<T, E> *>(p + c);
#pragma unroll
                for (int e = 0; e < E; e++) u.v[e] = from_acc<T>(add ? to_acc(u.v[e]) + x[c + e] : x[c + e]);
                *reinterpret_cast<vec_t<T, E> *>(p + c) = u;
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

/* HDP floats of shared memory (16-byte aligned) into registers; every lane of a head reads the
   same row, so each access is a broadcast */
template <int HDP> __device__ __forceinline__ void key_get(const float *row, float x[HDP]) {
#pragma unroll
    for (int c = 0; c < HDP / 4; c++) {
        const float4 k = reinterpret_cast<const float4 *>(row)[c];
        x[4 * c] = k.x, x[4 * c + 1] = k.y, x[4 * c + 2] = k.z, x[4 * c + 3] = k.w;
    }
}

template <int HDP> __device__ __forceinline__ void key_put(float *row, const float x[HDP]) {
#pragma unroll
    for (int c = 0; c < HDP / 4; c++)
        reinterpret_cast<float4 *>(row)[c] = make_float4(x[4 * c], x[4 * c + 1], x[4 * c + 2], x[4 * c + 3]);
}

/* Σ_d x[d]·y[d], d in order from 0 */
template <int HDP> __device__ __forceinline__ float key_dot(const float x[HDP], const float y[HDP]) {
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < HDP; d++) s += x[d] * y[d];
    return s;
}

/* reductions over a head's 16 lanes (every lane of the warp takes part) */
__device__ __forceinline__ float head_max(float x) {
#pragma unroll
    for (int o = KL / 2; o > 0; o >>= 1) x = nan_max(x, __shfl_xor_sync(KFULL, x, o));
    return x;
}

__device__ __forceinline__ float head_sum(float x) {
#pragma unroll
    for (int o = KL / 2; o > 0; o >>= 1) x += __shfl_xor_sync(KFULL, x, o);
    return x;
}

/* The head's sum of acc[0 … N) (N <= 16, a power of two) over its 16 lanes, scattered: each
   halving step sends half of what a lane still holds to its partner and keeps the other half,
   so the lane ends with one dim's total; *dim is that dim, and the lanes whose low bits
   (below KL / N) are zero are the ones to write it. log2(16) steps, N - 1 + log2(16 / N)
   shuffles in all. */
template <int N> __device__ __forceinline__ float head_scatter(float (&acc)[N], int kl, int *dim) {
    int d = 0;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const int o = KL >> (t + 1), half = N >> (t + 1);
        if (half >= 1) {
            const bool up = (kl & o) != 0;
#pragma unroll
            for (int k = 0; k < half; k++) {
                const float send = up ? acc[k] : acc[k + half];
                const float keep = up ? acc[k + half] : acc[k];
                acc[k] = keep + __shfl_xor_sync(KFULL, send, o);
            }
            if (up) d += half;
        } else {
            acc[0] += __shfl_xor_sync(KFULL, acc[0], o);
        }
    }
    *dim = d;
    return acc[0];
}

/* Where a block's heads live: head slot hg (0 … KHEADS) of the block, its lanes kl = lane % 16.
   A slot past B·H works on the last head and writes nothing. */
struct khead {
    int64_t n, b, h;
    bool live;
    __device__ __forceinline__ khead(const attn_params &a, int hg) {
        const int64_t BH = (int64_t)a.B * a.H, raw = (int64_t)blockIdx.x * KHEADS + hg;
        live = raw < BH;
        n = live ? raw : BH - 1;
        b = n / a.H, h = n - b * a.H;
    }
};

/* A lane's pointer into an [L, L] score operand of its head: element (0, kl); element (i, key
   kl + 16·s) is at i·sl + s·16·sx from it (the strides stay in the kernel's parameters). NULL:
   absent. */
template <typename S> __device__ __forceinline__ S *krow_base(const attn_view &v, const khead &w, int kl) {
    return v.p ? (S *)v.p + w.b * v.sb + w.h * v.sh + (int64_t)kl * v.sx : nullptr;
}

template <typename S>
__device__ __forceinline__ S *krow_at(const attn_view &v, S *p, int i, int s) {
    return p + (int64_t)i * v.sl + (int64_t)(KL * s) * v.sx;
}

/* A query row's scores of the lane's keys (0 where the operand is absent or the key past L). */
template <typename S, int NS>
__device__ __forceinline__ void krow_load(const attn_view &v, const S *p, int i, int kl, int L, float x[NS]) {
#pragma unroll
    for (int s = 0; s < NS; s++) x[s] = p && kl + KL * s < L ? to_acc(*krow_at(v, p, i, s)) : 0.f;
}

/* The backward's shared floats a head: q and do rows, lse and D, rounded to whole float4 so that
   every head's rows stay 16-byte aligned. */
__host__ __device__ __forceinline__ int keys_head_floats(int L, int hdp) { return (L * (2 * hdp + 2) + 3) & ~3; }

template <typename T, typename S, int NS, int HDP, bool DROP>
__global__ void __launch_bounds__(KWARPS * 32, NS * HDP > 24 ? 4 : 5) keys_fwd_kernel(attn_params a) {
    extern __shared__ float4 ksm4[];
    const int L = a.L, hd = a.hd, kl = threadIdx.x & (KL - 1), hg = threadIdx.x / KL;
    float *Qs = reinterpret_cast<float *>(ksm4) + (size_t)hg * L * HDP;
    const khead H_(a, hg);
    bool bad = false;
    const int len = seq_len(a, H_.b, &bad);
    float k[NS][HDP], v[NS][HDP];
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const int j = kl + KL * s;
        if (j < L) {
            key_load_live<T, HDP>(a.k, H_.b, H_.h, j, len, hd, k[s]);
            key_load_live<T, HDP>(a.v, H_.b, H_.h, j, len, hd, v[s]);
            float x[HDP];
            key_load<T, HDP>(a.q, H_.b, H_.h, j, hd, x);
            key_put<HDP>(Qs + j * HDP, x);
        } else {
#pragma unroll
            for (int d = 0; d < HDP; d++) k[s][d] = v[s][d] = 0.f;
        }
    }
    __syncwarp();
    const S *rin = krow_base<const S>(a.sin, H_, kl);
    S *rout = krow_base<S>(a.sout, H_, kl);
    float next[NS];
    krow_load<S, NS>(a.sin, rin, 0, kl, L, next);
    for (int i = 0; i < L; i++) {
        float cur[NS];
#pragma unroll
        for (int s = 0; s < NS; s++) cur[s] = next[s];
        if (i + 1 < L) krow_load<S, NS>(a.sin, rin, i + 1, kl, L, next);
        const int jend = bad ? 0 : key_end(a, i, len);
        float q[HDP];
        key_get<HDP>(Qs + i * HDP, q);
        float x[NS], m = KNEG_INF;
#pragma unroll
        for (int s = 0; s < NS; s++) {
            x[s] = kl + KL * s < jend ? key_dot<HDP>(q, k[s]) * a.scale + cur[s] : KNEG_INF;
            m = nan_max(m, x[s]);
        }
        m = head_max(m);
        if (rout && H_.live)
#pragma unroll
            for (int s = 0; s < NS; s++)
                if (kl + KL * s < L) *krow_at(a.sout, rout, i, s) = from_acc<S>(bad ? knan() : x[s]);
        float acc[HDP], sum = 0.f;
#pragma unroll
        for (int d = 0; d < HDP; d++) acc[d] = 0.f;
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const float e = x[s] == KNEG_INF ? 0.f : expf(x[s] - m);
            sum += e;
            const float w = DROP ? e * keep_factor(a, H_.n, i, kl + KL * s) : e;
#pragma unroll
            for (int d = 0; d < HDP; d++) acc[d] += w * v[s][d];
        }
        sum = head_sum(sum);
        int dim;
        const float o = head_scatter<HDP>(acc, kl, &dim);
        if (!H_.live) continue;
        const bool none = m == KNEG_INF; /* no key: o = 0, lse = −∞ */
        if ((kl & (KL / HDP - 1)) == 0 && dim < hd) {
            const float val = bad ? knan() : none ? 0.f : o * __frcp_rn(sum);
            *at<T>(a.o, H_.b, H_.h, i, dim) = from_acc<T>(val);
        }
        if (kl == 0) {
            a.lse[H_.n * L + i] = bad ? knan() : none ? KNEG_INF : m + logf(sum);
            if (bad && i == 0) raise_bad_length(a, H_.b);
        }
    }
}

template <typename T, typename S, int NS, int HDP, bool DROP>
__global__ void __launch_bounds__(KWARPS * 32, NS * HDP > 24 ? 2 : NS * HDP > 12 ? 3 : 4) keys_bwd_kernel(attn_params a) {
    extern __shared__ float4 ksm4[];
    const int L = a.L, hd = a.hd, kl = threadIdx.x & (KL - 1), hg = threadIdx.x / KL;
    float *Qs = reinterpret_cast<float *>(ksm4) + (size_t)hg * keys_head_floats(L, HDP);
    float *dOs = Qs + L * HDP, *Ls = dOs + L * HDP, *Ds = Ls + L;
    const khead H_(a, hg);
    bool bad = false;
    const int len = seq_len(a, H_.b, &bad);
    float k[NS][HDP], v[NS][HDP], dk[NS][HDP], dv[NS][HDP];
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const int j = kl + KL * s;
#pragma unroll
        for (int d = 0; d < HDP; d++) dk[s][d] = dv[s][d] = 0.f;
        if (j < L) {
            key_load_live<T, HDP>(a.k, H_.b, H_.h, j, len, hd, k[s]);
            key_load_live<T, HDP>(a.v, H_.b, H_.h, j, len, hd, v[s]);
            float x[HDP], y[HDP];
            key_load<T, HDP>(a.q, H_.b, H_.h, j, hd, x);
            key_put<HDP>(Qs + j * HDP, x);
            key_load<T, HDP>(a.dout, H_.b, H_.h, j, hd, x);
            key_put<HDP>(dOs + j * HDP, x);
            key_load<T, HDP>(a.o, H_.b, H_.h, j, hd, y);
            float D = 0.f;
#pragma unroll
            for (int d = 0; d < HDP; d++)
                if (d < hd) D += x[d] * y[d];
            Ds[j] = D;
            Ls[j] = a.lse[H_.n * L + j];
        } else {
#pragma unroll
            for (int d = 0; d < HDP; d++) k[s][d] = v[s][d] = 0.f;
        }
    }
    __syncwarp();
    const S *rin = krow_base<const S>(a.sin, H_, kl), *rg = krow_base<const S>(a.dso, H_, kl);
    S *rd = krow_base<S>(a.dsin, H_, kl);
    float nin[NS], ng[NS];
    krow_load<S, NS>(a.sin, rin, 0, kl, L, nin);
    krow_load<S, NS>(a.dso, rg, 0, kl, L, ng);
    for (int i = 0; i < L; i++) {
        float cin[NS], cg[NS];
#pragma unroll
        for (int s = 0; s < NS; s++) cin[s] = nin[s], cg[s] = ng[s];
        if (i + 1 < L) {
            krow_load<S, NS>(a.sin, rin, i + 1, kl, L, nin);
            krow_load<S, NS>(a.dso, rg, i + 1, kl, L, ng);
        }
        const float lse = Ls[i], D = Ds[i];
        const int jend = bad || lse == KNEG_INF ? 0 : key_end(a, i, len);
        float q[HDP], dO[HDP], dq[HDP];
        key_get<HDP>(Qs + i * HDP, q);
        key_get<HDP>(dOs + i * HDP, dO);
#pragma unroll
        for (int d = 0; d < HDP; d++) dq[d] = 0.f;
        float ds[NS];
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const int j = kl + KL * s;
            float pk = 0.f;
            ds[s] = 0.f;
            if (j < jend) {
                const float x = key_dot<HDP>(q, k[s]) * a.scale + cin[s];
                const float p = expf(x - lse), kd = DROP ? keep_factor(a, H_.n, i, j) : 1.f;
                ds[s] = p * (key_dot<HDP>(dO, v[s]) * kd - D) + cg[s];
                pk = p * kd;
            }
#pragma unroll
            for (int d = 0; d < HDP; d++) {
                dk[s][d] += ds[s] * q[d];
                dv[s][d] += pk * dO[d];
                dq[d] += ds[s] * k[s][d];
            }
        }
        int dim;
        const float g = head_scatter<HDP>(dq, kl, &dim);
        if (!H_.live) continue;
        if (rd)
#pragma unroll
            for (int s = 0; s < NS; s++)
                if (kl + KL * s < L) {
                    S *p = krow_at(a.dsin, rd, i, s);
                    const float val = bad ? knan() : ds[s];
                    *p = from_acc<S>(a.accumulate ? val + to_acc(*p) : val);
                }
        if (a.dq.p && (kl & (KL / HDP - 1)) == 0 && dim < hd) {
            T *p = at<T>(a.dq, H_.b, H_.h, i, dim);
            const float val = bad ? knan() : g * a.scale;
            *p = from_acc<T>(a.accumulate && !bad ? val + to_acc(*p) : val);
        }
        if (bad && i == 0 && kl == 0) raise_bad_length(a, H_.b);
    }
    if (!H_.live) return;
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const int j = kl + KL * s;
        if (j >= L) continue;
#pragma unroll
        for (int d = 0; d < HDP; d++) {
            dk[s][d] = bad ? knan() : dk[s][d] * a.scale;
            dv[s][d] = bad ? knan() : dv[s][d];
        }
        if (a.dk.p) key_store<T, HDP>(a.dk, H_.b, H_.h, j, hd, dk[s], a.accumulate && !bad);
        if (a.dv.p) key_store<T, HDP>(a.dv, H_.b, H_.h, j, hd, dv[s], a.accumulate && !bad);
    }
}

/* Shared-memory bytes of a block: each head's q rows (backward: keys_head_floats). */
size_t keys_smem(int L, int hdp, bool forward) {
    return sizeof(float) * (size_t)KHEADS * (forward ? (size_t)L * hdp : (size_t)keys_head_floats(L, hdp));
}

template <typename T, typename S, int NS, int HDP, bool DROP>
cudaError_t keys_launch_drop(const attn_params &a, bool forward, cudaStream_t st) {
    const int64_t heads = (int64_t)a.B * a.H;
    const unsigned blocks = (unsigned)((heads + KHEADS - 1) / KHEADS);
    const size_t smem = keys_smem(a.L, HDP, forward);
    if (forward) keys_fwd_kernel<T, S, NS, HDP, DROP><<<blocks, KWARPS * 32, smem, st>>>(a);
    else keys_bwd_kernel<T, S, NS, HDP, DROP><<<blocks, KWARPS * 32, smem, st>>>(a);
    return cudaGetLastError();
}

/* each kernel with and without dropout: the instance without carries none of its registers */
template <typename T, typename S, int NS, int HDP>
cudaError_t keys_launch(const attn_params &a, bool forward, cudaStream_t st) {
    return a.dropout ? keys_launch_drop<T, S, NS, HDP, true>(a, forward, st)
                     : keys_launch_drop<T, S, NS, HDP, false>(a, forward, st);
}

/* The instantiated (slots, padded head dim) pairs: every key slot's k, v (backward: and dk, dv)
   rows stay in registers (hd 16 at L 42 would hold 192 floats a lane: the thread-a-row kernels
   take hd > 8). */
template <typename T, typename S>
cudaError_t keys_run(const attn_params &a, bool forward, int ns, int hdp, cudaStream_t st) {
    switch (hdp * 8 + ns) {
    case 4 * 8 + 1: return keys_launch<T, S, 1, 4>(a, forward, st);
    case 4 * 8 + 2: return keys_launch<T, S, 2, 4>(a, forward, st);
    case 4 * 8 + 3: return keys_launch<T, S, 3, 4>(a, forward, st);
    case 4 * 8 + 4: return keys_launch<T, S, 4, 4>(a, forward, st);
    case 8 * 8 + 1: return keys_launch<T, S, 1, 8>(a, forward, st);
    case 8 * 8 + 2: return keys_launch<T, S, 2, 8>(a, forward, st);
    case 8 * 8 + 3: return keys_launch<T, S, 3, 8>(a, forward, st);
    case 8 * 8 + 4: return keys_launch<T, S, 4, 8>(a, forward, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

bool fg_cuda_attn_keys_fits(const fg_attn_problem *p, int *ns, int *hdp) {
    if (p->L < 1 || p->L > 4 * KL || p->hd < 1 || p->hd > 8) return false;
    *ns = (int)((p->L + KL - 1) / KL), *hdp = p->hd <= 4 ? 4 : 8;
    return true;
}

cudaError_t fg_cuda_attn_keys(const attn_params &a, bool forward, fg_dtype dtype, bool s32, int ns, int hdp,
                              cudaStream_t st) {
    if (dtype == FG_F32) return keys_run<float, float>(a, forward, ns, hdp, st);
    if (dtype == FG_F16)
        return s32 ? keys_run<__half, float>(a, forward, ns, hdp, st) : keys_run<__half, __half>(a, forward, ns, hdp, st);
    if (dtype == FG_BF16)
        return s32 ? keys_run<__nv_bfloat16, float>(a, forward, ns, hdp, st)
                   : keys_run<__nv_bfloat16, __nv_bfloat16>(a, forward, ns, hdp, st);
    return cudaErrorInvalidValue;
}

/*
 * attention_qrow.cu — the short-sequence kernels for PatchTST's heads (L <= 64, hd <= 8: L 42
 * with hd 4 or 8; any dtype and strides, every option).
 *
 * A block of 128 threads holds G = 128 / L whole heads: their k, v (backward: q, do) rows and
 * their [L, L] score operands in shared-memory tiles (row stride L + 1: a warp's rows hit
 * distinct banks), the scores moved in and out as coalesced runs of the block's heads.
 * The forward runs a thread a query row and sweeps it twice with no cross-lane step: q·k plus
 * the scores in, into the tile, and the max; then e^(x − m), its sum and Σ e·v.
 * The backward runs a thread a query row (p recomputed from lse, dS = p (keep · do·v − D) + G,
 * dS·k into dq, dS and p · keep left in the tiles), then a thread a key (dk, dv summed down the
 * tiles' columns, rows in order): each gradient element has one owner, no atomics.
 * Each thread issues all of its global loads (its rows; the score runs in batches) before it
 * stores any into shared memory, so a block waits about one memory latency, not one a load;
 * the blocks an SM are set by the scores' type and head dim (L1- or latency-bound).
 * exp, max and log take their SFU forms (the loops are bound by issued instructions). Each
 * kernel is built with and without dropout: without, it carries none of the Philox draw's
 * registers.
 * q and k in P pieces (PatchTST's residual attention as the sum of the layers' products): the
 * pieces before the last are added into the score tiles first (as scores in would be), the
 * kernels then run on the last piece as on a plain q, k; the backward ends with dq and dk of
 * the earlier pieces, one sweep each way over the dS tile a piece.
 * Why: a lane a key (sixteen lanes a head, each key's k, v, dk, dv in registers) needs a 16-lane
 * max, sum and reduce-scatter every row, ≈ 250 instructions a row step of two heads on three keys,
 * and held the backward at 168 registers; here a score costs a thread ≈ 40 instructions in the
 * forward and ≈ 80 in the backward. The thread-a-row kernels of attention.cu (SHORT ROWS, hd up
 * to 32) are the same design at run-time head dims. The masking, dropout, NaN and bad-length
 * rules are attention.cuh's, as on every path.
 */
#include "attention.cuh"

#include <type_traits>

/* 1: this unit builds the kernels' instances for q and k in pieces (attention_qrow_pieces.cu
   includes this file so); 0: the plain ones and the entry points. Two units, so the pieces'
   code adds no registers to the plain instances and the two build in parallel. */
#ifndef FG_QROW_PIECES
#define FG_QROW_PIECES 0
#endif

namespace {

constexpr float KNEG_INF = -INFINITY;

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

/* The SFU forms of the softmax's functions (the loops are bound by issued instructions): e^t as 2^(t·log2 e), flushed to 0 below 2^-126 (e^-87: nothing a softmax sum
   sees; −∞ gives 0); max that keeps a NaN in one instruction (attention.cuh's nan_max takes
   three); ln by lg2 (__logf). Each is within two ulp of the correctly rounded value. */
__device__ __forceinline__ float kexp(float t) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(t * 1.4426950408889634f));
    return y;
}

__device__ __forceinline__ float kmax(float a, float b) {
    float y;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
    return y;
}

/* threads a block: G = QT / L heads (the last block's may run past B·H: those threads idle) */
constexpr int QT = 128;

__host__ __device__ __forceinline__ int qrow_heads(int L) { return QT / L; }

/* Blocks an SM each kernel runs (its register cap; the forward's shared-memory carveout). With
   f32 scores at head dim 8 the kernels are bound by L1 throughput, and more blocks shrink the L1
   that the strided k, v, q rows of neighbouring heads share (measured: six forward blocks beat
   seven); with 16-bit scores, or at head dim 4, by load latency, which more warps hide. */
template <typename S, int HDP> constexpr bool qrow_l1_bound() { return sizeof(S) == 4 && HDP == 8; }
template <typename S, int HDP> constexpr int qrow_fwd_blocks() { return qrow_l1_bound<S, HDP>() ? 6 : 7; }
template <typename S, int HDP> constexpr int qrow_bwd_blocks() { return qrow_l1_bound<S, HDP>() ? 3 : 4; }
/* The backward's two score tiles hold f32, or the scores' own 16-bit type (dS and p̃ rounded to it
   before the key sweep's sums, as flash attention rounds them for its dK, dV products): half the
   shared memory, the rest of the SM's L1 / shared split left to L1 (its registers still hold the
   kernel to four blocks; a fifth spills). With q, k in pieces the tile first holds the earlier
   pieces' products, which the forward summed in f32: f32 there. */
template <typename S, bool PIECES> using qrow_bwd_tile = std::conditional_t<sizeof(S) == 2 && !PIECES, S, float>;

/* The shared-memory share of the SM's unified L1 / shared memory (percent of the most a block
   may take) for `blocks` blocks of `smem` bytes, each with the 1 KB the runtime reserves. */
inline int qrow_carveout(size_t smem, int blocks) {
    const size_t most = 228 * 1024, want = (size_t)blocks * (smem + 1024);
    return want >= most ? 100 : (int)((want * 100 + most - 1) / most);
}

size_t qrow_smem(int L, int hdp) {
    const size_t G = (size_t)qrow_heads(L);
    return sizeof(float) * (G * 2 * (size_t)L * hdp + G * (size_t)L * (L + 1));
}

/* a score operand's element as a tile holds it (f32, or the operand's own 16-bit type) */
template <typename TT, typename S> __device__ __forceinline__ TT tile_of(S x) {
    if constexpr (std::is_same<TT, S>::value) return x;
    else return from_acc<TT>(to_acc(x));
}

/* the block's heads n0 … n0 + nh − 1 of a score operand as one run of nh·L·L elements that
   4-element vectors cover (rows and heads contiguous, L even, the base aligned) */
template <typename S> __device__ __forceinline__ bool qrow_flat(const attn_view &v, int L, int H) {
    return v.sx == 1 && v.sl == L && v.sh == (int64_t)L * L && v.sb == (int64_t)H * L * L && (L & 1) == 0 &&
           ((uintptr_t)v.p & (4 * sizeof(S) - 1)) == 0;
}

/* tile row of element g of the block's run: floor(g / L) by a float reciprocal (exact: g < 2^13
   and (g + 0.5) / L is at least 1 / (2L) from an integer) */
__device__ __forceinline__ int qrow_of(int g, float invL) { return (int)(((float)g + 0.5f) * invL); }

/* Vectors (4 elements) or elements a thread has in flight when it moves a score operand between
   global memory and a tile: each batch's loads issue before any of its stores, so their latencies
   overlap (the compiler cannot tell a tile from the source and keeps a store between two loads in
   order, one memory latency each). */
constexpr int QU = 8;

/* element g = r·L + j of the block's run (tile row r = hg·L + i, key j) of a score operand */
template <typename S>
__device__ __forceinline__ S *qrow_elem(const attn_params &a, const attn_view &v, int64_t n0, int g, int &r, float invL) {
    const int L = a.L;
    r = qrow_of(g, invL);
    const int j = g - r * L, hg = qrow_of(r, invL), i = r - hg * L;
    const int64_t n = n0 + hg, b = n / a.H, h = n - b * a.H;
    return (S *)v.p + b * v.sb + h * v.sh + (int64_t)i * v.sl + (int64_t)j * v.sx;
}

/* Up to two score operands (vb.p may be null) of the block's heads into their tiles: 4-element
   vectors of both in one batch when they are flat runs, element by element otherwise. */
template <typename S, typename TT>
__device__ __forceinline__ void qrow_scores_in(const attn_params &a, const attn_view &va, TT *ta,
                                               const attn_view &vb, TT *tb, int64_t n0, int nh) {
    const int L = a.L, E = nh * L * L, t = (int)threadIdx.x;
    const float invL = 1.f / (float)L;
    const bool two = vb.p != nullptr;
    if (qrow_flat<S>(va, L, a.H) && (!two || qrow_flat<S>(vb, L, a.H))) {
        const S *sa = (const S *)va.p + n0 * L * L, *sb = two ? (const S *)vb.p + n0 * L * L : nullptr;
        for (int f0 = 4 * t; f0 < E; f0 += 4 * QT * QU) {
            vec_t<S, 4> ua[QU], ub[QU];
#pragma unroll
            for (int k = 0; k < QU; k++) {
                const int f = f0 + 4 * QT * k;
                if (f < E) {
                    ua[k] = *reinterpret_cast<const vec_t<S, 4> *>(sa + f);
                    if (two) ub[k] = *reinterpret_cast<const vec_t<S, 4> *>(sb + f);
                }
            }
#pragma unroll
            for (int k = 0; k < QU; k++) {
                const int f = f0 + 4 * QT * k;
                if (f < E)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int x = f + e + qrow_of(f + e, invL);
                        ta[x] = tile_of<TT>(ua[k].v[e]);
                        if (two) tb[x] = tile_of<TT>(ub[k].v[e]);
                    }
            }
        }
        return;
    }
    for (int w = 0; w < (two ? 2 : 1); w++) {
        const attn_view &v = w ? vb : va;
        TT *tile = w ? tb : ta;
        for (int g0 = t; g0 < E; g0 += QT * QU) {
            TT x[QU];
            int r[QU];
#pragma unroll
            for (int k = 0; k < QU; k++) {
                const int g = g0 + QT * k;
                if (g < E) x[k] = tile_of<TT>(*qrow_elem<S>(a, v, n0, g, r[k], invL));
            }
#pragma unroll
            for (int k = 0; k < QU; k++) {
                const int g = g0 + QT * k;
                if (g < E) tile[g + r[k]] = x[k];
            }
        }
    }
}

/* the tile's rows out to a score operand, added to what is there when asked (the adds' loads
   in batches, as above) */
template <typename S, typename TT>
__device__ __forceinline__ void qrow_scores_out(const attn_params &a, const attn_view &v, const TT *tile, int64_t n0,
                                                int nh, bool add) {
    const int L = a.L, E = nh * L * L, t = (int)threadIdx.x;
    const float invL = 1.f / (float)L;
    if (qrow_flat<S>(v, L, a.H)) {
        S *dst = (S *)v.p + n0 * L * L;
        for (int f0 = 4 * t; f0 < E; f0 += 4 * QT * QU) {
            vec_t<S, 4> u[QU];
            if (add)
#pragma unroll
                for (int k = 0; k < QU; k++) {
                    const int f = f0 + 4 * QT * k;
                    if (f < E) u[k] = *reinterpret_cast<const vec_t<S, 4> *>(dst + f);
                }
#pragma unroll
            for (int k = 0; k < QU; k++) {
                const int f = f0 + 4 * QT * k;
                if (f < E) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float x = to_acc(tile[f + e + qrow_of(f + e, invL)]);
                        u[k].v[e] = from_acc<S>(add ? x + to_acc(u[k].v[e]) : x);
                    }
                    *reinterpret_cast<vec_t<S, 4> *>(dst + f) = u[k];
                }
            }
        }
        return;
    }
    for (int g0 = t; g0 < E; g0 += QT * QU) {
        S *p[QU];
        float x[QU];
        int r[QU];
#pragma unroll
        for (int k = 0; k < QU; k++) {
            const int g = g0 + QT * k;
            if (g < E) {
                p[k] = qrow_elem<S>(a, v, n0, g, r[k], invL);
                x[k] = add ? to_acc(*p[k]) : 0.f;
            }
        }
#pragma unroll
        for (int k = 0; k < QU; k++) {
            const int g = g0 + QT * k;
            if (g < E) *p[k] = from_acc<S>(add ? x[k] + to_acc(tile[g + r[k]]) : to_acc(tile[g + r[k]]));
        }
    }
}

/* q and k in pieces: the tile's rows (thread t's row t: query i of head hg) become the scores in
   (or 0) plus scale · q·k of every piece but the last, over the keys the row sees; Ks (G·L·HDP
   floats) is scratch. The whole block calls it; it ends past a barrier. */
template <typename T, typename S, int HDP>
__device__ __forceinline__ void qrow_piece_scores(const attn_params &a, float *tile, float *Ks, int64_t n0, int nh,
                                                  bool on, int t, int hg, int i, int64_t b, int64_t h, int len,
                                                  bool bad) {
    const int L = a.L, LP = L + 1;
    float *row = tile + t * LP;
    if (a.sin.p) qrow_scores_in<S, float>(a, a.sin, tile, attn_view{}, nullptr, n0, nh);
    else if (on)
        for (int j = 0; j < L; j++) row[j] = 0.f;
    const int jend = on && !bad ? key_end(a, i, len) : 0;
    for (int pc = 0; pc + 1 < a.P; pc++) {
        float q[HDP];
        if (on) {
            float k[HDP];
            key_load_live<T, HDP>(piece_of<T>(a.k, pc), b, h, i, len, a.hd, k);
            key_load<T, HDP>(piece_of<T>(a.q, pc), b, h, i, a.hd, q);
            rows_put<HDP>(Ks + t * HDP, k);
        }
        __syncthreads(); /* the piece's k rows (and, the first time, the scores in) are in */
        const float *K = Ks + hg * L * HDP;
#pragma unroll 2
        for (int j = 0; j < jend; j++) {
            float k[HDP];
            rows_get<HDP>(K + j * HDP, k);
            row[j] += rows_dot_r<HDP>(q, k) * a.scale;
        }
        __syncthreads(); /* Ks is free again */
    }
}

template <typename T, typename S, int HDP, bool DROP, bool PIECES>
__global__ void __launch_bounds__(QT, qrow_fwd_blocks<S, HDP>()) qrow_fwd_kernel(attn_params a) {
    extern __shared__ float4 ksm4[];
    const int L = a.L, hd = a.hd, LP = L + 1, G = QT / L;
    const int64_t BH = (int64_t)a.B * a.H, n0 = (int64_t)blockIdx.x * G;
    const int nh = (int)min((int64_t)G, BH - n0);
    float *Ks = reinterpret_cast<float *>(ksm4), *Vs = Ks + G * L * HDP, *tile = Vs + G * L * HDP;
    /* thread t < nh·L is row t of the block's heads: it loads that row's k and v (zeros past a
       sequence's length) and its q, all before the first store; then the heads' scores in */
    const int t = (int)threadIdx.x;
    const bool on = t < nh * L;
    const int hg = on ? t / L : 0, i = t - hg * L;
    const int64_t n = n0 + hg, b = n / a.H, h = n - b * a.H;
    bool bad = false;
    const int len = seq_len(a, b, &bad);
    constexpr bool pieces = PIECES;
    const int last = PIECES ? a.P - 1 : 0; /* the kernels' own piece */
    if (pieces) qrow_piece_scores<T, S, HDP>(a, tile, Ks, n0, nh, on, t, hg, i, b, h, len, bad);
    float q[HDP];
    if (on) {
        float k[HDP], v[HDP];
        key_load_live<T, HDP>(piece_of<T>(a.k, last), b, h, i, len, hd, k);
        key_load_live<T, HDP>(a.v, b, h, i, len, hd, v);
        key_load<T, HDP>(piece_of<T>(a.q, last), b, h, i, hd, q);
        rows_put<HDP>(Ks + t * HDP, k);
        rows_put<HDP>(Vs + t * HDP, v);
    }
    if (a.sin.p && !pieces) qrow_scores_in<S, float>(a, a.sin, tile, attn_view{}, nullptr, n0, nh);
    __syncthreads();
    if (on) {
        const int jend = bad ? 0 : key_end(a, i, len);
        const float *K = Ks + hg * L * HDP, *V = Vs + hg * L * HDP;
        float *row = tile + t * LP;
        const bool sin = a.sin.p != nullptr || pieces;
        float m = KNEG_INF;
#pragma unroll 2
        for (int j = 0; j < jend; j++) {
            float k[HDP];
            rows_get<HDP>(K + j * HDP, k);
            const float x = rows_dot_r<HDP>(q, k) * a.scale + (sin ? row[j] : 0.f);
            row[j] = x;
            m = kmax(m, x);
        }
        for (int j = jend; j < L; j++) row[j] = KNEG_INF;
        const bool none = m == KNEG_INF; /* no key: o = 0, lse = −∞ */
        const float mz = none ? 0.f : m;
        float acc[HDP], sum = 0.f;
#pragma unroll
        for (int d = 0; d < HDP; d++) acc[d] = 0.f;
        keep_row kr(a, n, i);
#pragma unroll 2
        for (int j = 0; j < jend; j++) {
            const float e = kexp(row[j] - mz);
            sum += e;
            const float w = DROP ? e * kr.at(a, j) : e;
            float v[HDP];
            rows_get<HDP>(V + j * HDP, v);
#pragma unroll
            for (int d = 0; d < HDP; d++) acc[d] += w * v[d];
        }
#pragma unroll
        for (int d = 0; d < HDP; d++) acc[d] = bad ? knan() : none ? 0.f : __fdividef(acc[d], sum);
        key_store<T, HDP>(a.o, b, h, i, hd, acc, false);
        a.lse[n * L + i] = bad ? knan() : none ? KNEG_INF : m + __logf(sum);
        if (bad) {
            for (int j = 0; j < L; j++) row[j] = knan();
            if (i == 0) raise_bad_length(a, b);
        }
    }
    if (a.sout.p) {
        __syncthreads();
        qrow_scores_out<S>(a, a.sout, tile, n0, nh, false);
    }
}

template <typename T, typename S, int HDP, bool DROP>
cudaError_t qrow_launch(const attn_params &a, cudaStream_t st) {
    constexpr bool PIECES = FG_QROW_PIECES;
    const int G = qrow_heads(a.L);
    const int64_t heads = (int64_t)a.B * a.H;
    const unsigned blocks = (unsigned)((heads + G - 1) / G);
    const size_t smem = qrow_smem(a.L, HDP);
    if (qrow_l1_bound<S, HDP>()) { /* no more blocks than qrow_fwd_blocks: the rest stays L1 */
        const cudaError_t e = cudaFuncSetAttribute((const void *)qrow_fwd_kernel<T, S, HDP, DROP, PIECES>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   qrow_carveout(smem, qrow_fwd_blocks<S, HDP>()));
        if (e != cudaSuccess) return e;
    }
    qrow_fwd_kernel<T, S, HDP, DROP, PIECES><<<blocks, QT, smem, st>>>(a);
    return cudaGetLastError();
}

/* The backward a thread a row, then a thread a key. Shared memory a head: k and v rows (q and do
   in their place for the key sweep: each thread holds its own q and do rows in registers) and
   two [L, L + 1] tiles (A: the scores in, then dS; B: the scores' gradient G, then p̃ = p ·
   keep). The row sweep (thread i) recomputes p = e^(q·k · scale + scores in − lse) key by key,
   forms dS = p (keep · do·v − D) + G, adds dS·k into dq and leaves dS and p̃ in the tiles; dS
   goes out as the scores in's gradient (coalesced runs, as the forward's scores); the key sweep
   (thread j) then sums dk_j = Σ_i dS_ij q_i and dv_j = Σ_i p̃_ij do_i down the tiles' columns, rows
   in order — each key's sums with one owner, no atomics. Masked entries are 0 in both tiles.
   At L 42 hd 8 a block takes 51.5 KB with f32 tiles, 29.7 KB with 16-bit ones (qrow_bwd_tile):
   four blocks an SM where the registers allow (qrow_bwd_blocks). */
size_t qrow_bwd_smem(int L, int hdp, size_t tile_bytes) {
    const size_t G = (size_t)qrow_heads(L);
    return sizeof(float) * G * 2 * (size_t)L * hdp + tile_bytes * G * 2 * (size_t)L * (L + 1);
}

/* The key sweep (thread j: dk_j = scale Σ_i dS_ij q_i and dv_j = Σ_i p̃_ij do_i down the tiles'
   columns, rows in order) of the last piece; q and do are the thread's own rows. The whole block
   calls it. */
template <typename T, int HDP, typename TT>
__device__ __forceinline__ void qrow_key_sweep(const attn_params &a, const TT *TA, const TT *TB, float *Qs,
                                               float *DOs, const float q[HDP], const float dO[HDP], bool on, int t,
                                               int hg, int ij, int64_t b, int64_t h, bool bad, int last) {
    const int L = a.L, hd = a.hd, LP = L + 1;
    if (on) rows_put<HDP>(Qs + t * HDP, q), rows_put<HDP>(DOs + t * HDP, dO);
    __syncthreads();
    if (on) {
        const int j = ij;
        const TT *ca = TA + hg * L * LP + j, *cb = TB + hg * L * LP + j;
        const float *Q = Qs + hg * L * HDP, *DO = DOs + hg * L * HDP;
        float dk[HDP], dv[HDP];
#pragma unroll
        for (int d = 0; d < HDP; d++) dk[d] = dv[d] = 0.f;
#pragma unroll 2
        for (int i = 0; i < L; i++) {
            const float ds = to_acc(ca[i * LP]), pk = to_acc(cb[i * LP]);
            float qi[HDP], di[HDP];
            rows_get<HDP>(Q + i * HDP, qi);
            rows_get<HDP>(DO + i * HDP, di);
#pragma unroll
            for (int d = 0; d < HDP; d++) {
                dk[d] += ds * qi[d];
                dv[d] += pk * di[d];
            }
        }
#pragma unroll
        for (int d = 0; d < HDP; d++) {
            dk[d] = bad ? knan() : dk[d] * a.scale;
            dv[d] = bad ? knan() : dv[d];
        }
        if (a.dk.p) key_store<T, HDP>(piece_of<T>(a.dk, last), b, h, j, hd, dk, a.accumulate && !bad);
        if (a.dv.p) key_store<T, HDP>(a.dv, b, h, j, hd, dv, a.accumulate && !bad);
    }
}

/* q and k in pieces, the backward's end: dq and dk of every piece but the last from the dS tile
   TA (row ij: dq_i = scale Σ_j dS_ij k_j over the row's jrow keys; column ij: dk_j = scale Σ_i
   dS_ij q_i), each piece's k and q rows in Ks and Vs. The whole block calls it. */
template <typename T, int HDP, typename TT>
__device__ __forceinline__ void qrow_piece_grads(const attn_params &a, const TT *TA, float *Ks, float *Vs, bool on,
                                                 int t, int hg, int ij, int64_t b, int64_t h, int len, bool bad,
                                                 int jrow) {
    const int L = a.L, hd = a.hd, LP = L + 1;
    for (int pc = 0; pc + 1 < a.P; pc++) {
        __syncthreads(); /* the last sweep is done with Ks and Vs */
        if (on) {
            float k[HDP], qp[HDP];
            key_load_live<T, HDP>(piece_of<T>(a.k, pc), b, h, ij, len, hd, k);
            key_load<T, HDP>(piece_of<T>(a.q, pc), b, h, ij, hd, qp);
            rows_put<HDP>(Ks + t * HDP, k);
            rows_put<HDP>(Vs + t * HDP, qp);
        }
        __syncthreads();
        if (!on) continue;
        float acc[HDP];
        if (a.dq.p) {
            const float *K = Ks + hg * L * HDP;
            const TT *ra = TA + t * LP;
#pragma unroll
            for (int d = 0; d < HDP; d++) acc[d] = 0.f;
#pragma unroll 2
            for (int j = 0; j < jrow; j++) {
                const float ds = to_acc(ra[j]);
                float k[HDP];
                rows_get<HDP>(K + j * HDP, k);
#pragma unroll
                for (int d = 0; d < HDP; d++) acc[d] += ds * k[d];
            }
#pragma unroll
            for (int d = 0; d < HDP; d++) acc[d] = bad ? knan() : acc[d] * a.scale;
            key_store<T, HDP>(piece_of<T>(a.dq, pc), b, h, ij, hd, acc, a.accumulate && !bad);
        }
        if (a.dk.p) {
            const float *Q = Vs + hg * L * HDP;
            const TT *ca = TA + hg * L * LP + ij;
#pragma unroll
            for (int d = 0; d < HDP; d++) acc[d] = 0.f;
#pragma unroll 2
            for (int i = 0; i < L; i++) {
                const float ds = to_acc(ca[i * LP]);
                float qi[HDP];
                rows_get<HDP>(Q + i * HDP, qi);
#pragma unroll
                for (int d = 0; d < HDP; d++) acc[d] += ds * qi[d];
            }
#pragma unroll
            for (int d = 0; d < HDP; d++) acc[d] = bad ? knan() : acc[d] * a.scale;
            key_store<T, HDP>(piece_of<T>(a.dk, pc), b, h, ij, hd, acc, a.accumulate && !bad);
        }
    }
}

template <typename T, typename S, int HDP, bool DROP, bool PIECES>
__global__ void __launch_bounds__(QT, qrow_bwd_blocks<S, HDP>()) qrow_bwd_kernel(attn_params a) {
    using TT = qrow_bwd_tile<S, PIECES>;
    extern __shared__ float4 ksm4[];
    const int L = a.L, hd = a.hd, LP = L + 1, G = QT / L;
    const int64_t BH = (int64_t)a.B * a.H, n0 = (int64_t)blockIdx.x * G;
    const int nh = (int)min((int64_t)G, BH - n0);
    float *Ks = reinterpret_cast<float *>(ksm4), *Vs = Ks + G * L * HDP;
    TT *TA = reinterpret_cast<TT *>(Vs + G * L * HDP), *TB = TA + G * L * LP;
    float *Qs = Ks, *DOs = Vs; /* the key sweep's q and do rows, once the row sweep is done with k and v */
    /* thread t < nh·L is row t of the block's heads (its query row in the first sweep, its key in
       the second): it loads that row's k, v (zeros past a sequence's length), q, do, o and lse,
       all before the first store; then the heads' scores in and their gradient, in one batch */
    const int t = (int)threadIdx.x;
    const bool on = t < nh * L;
    const int hg = on ? t / L : 0, ij = t - hg * L;
    const int64_t n = n0 + hg, b = n / a.H, h = n - b * a.H;
    bool bad = false;
    const int len = seq_len(a, b, &bad);
    constexpr bool pieces = PIECES;
    const int last = PIECES ? a.P - 1 : 0; /* the kernels' own piece */
    if constexpr (PIECES) qrow_piece_scores<T, S, HDP>(a, TA, Ks, n0, nh, on, t, hg, ij, b, h, len, bad);
    float q[HDP], dO[HDP], o[HDP], lse = 0.f;
    if (on) {
        float k[HDP], v[HDP];
        key_load_live<T, HDP>(piece_of<T>(a.k, last), b, h, ij, len, hd, k);
        key_load_live<T, HDP>(a.v, b, h, ij, len, hd, v);
        key_load<T, HDP>(piece_of<T>(a.q, last), b, h, ij, hd, q);
        key_load<T, HDP>(a.dout, b, h, ij, hd, dO);
        key_load<T, HDP>(a.o, b, h, ij, hd, o);
        lse = a.lse[n * L + ij];
        rows_put<HDP>(Ks + t * HDP, k);
        rows_put<HDP>(Vs + t * HDP, v);
    }
    if (a.sin.p && !pieces) qrow_scores_in<S>(a, a.sin, TA, a.dso, TB, n0, nh);
    else if (a.dso.p) qrow_scores_in<S, TT>(a, a.dso, TB, attn_view{}, nullptr, n0, nh);
    __syncthreads();
    const int jrow = !on || bad || lse == KNEG_INF ? 0 : key_end(a, ij, len); /* the keys row ij has gradients for */
    if (on) {
        const int i = ij;
        const int jend = jrow;
        float dq[HDP];
        float D = 0.f;
#pragma unroll
        for (int d = 0; d < HDP; d++) {
            if (d < hd) D += dO[d] * o[d];
            dq[d] = 0.f;
        }
        const float *K = Ks + hg * L * HDP, *V = Vs + hg * L * HDP;
        TT *ra = TA + t * LP, *rb = TB + t * LP;
        const bool sin = a.sin.p != nullptr || pieces, gin = a.dso.p != nullptr;
        keep_row kr(a, n, i);
#pragma unroll 2
        for (int j = 0; j < jend; j++) {
            float k[HDP], v[HDP];
            rows_get<HDP>(K + j * HDP, k);
            rows_get<HDP>(V + j * HDP, v);
            const float x = rows_dot_r<HDP>(q, k) * a.scale + (sin ? to_acc(ra[j]) : 0.f);
            const float p = kexp(x - lse), kd = DROP ? kr.at(a, j) : 1.f;
            const float ds = p * (rows_dot_r<HDP>(dO, v) * kd - D) + (gin ? to_acc(rb[j]) : 0.f);
            ra[j] = from_acc<TT>(ds);
            rb[j] = from_acc<TT>(p * kd);
#pragma unroll
            for (int d = 0; d < HDP; d++) dq[d] += ds * k[d];
        }
        for (int j = jend; j < L; j++) ra[j] = from_acc<TT>(0.f), rb[j] = from_acc<TT>(0.f);
        if (bad)
            for (int j = 0; j < L; j++) ra[j] = from_acc<TT>(knan());
        if (a.dq.p) {
#pragma unroll
            for (int d = 0; d < HDP; d++) dq[d] = bad ? knan() : dq[d] * a.scale;
            key_store<T, HDP>(piece_of<T>(a.dq, last), b, h, i, hd, dq, a.accumulate && !bad);
        }
        if (bad && i == 0) raise_bad_length(a, b);
    }
    __syncthreads();
    if (a.dsin.p) qrow_scores_out<S>(a, a.dsin, TA, n0, nh, a.accumulate);
    if (a.dk.p || a.dv.p) qrow_key_sweep<T, HDP, TT>(a, TA, TB, Qs, DOs, q, dO, on, t, hg, ij, b, h, bad, last);
    if (pieces && (a.dq.p || a.dk.p)) qrow_piece_grads<T, HDP, TT>(a, TA, Ks, Vs, on, t, hg, ij, b, h, len, bad, jrow);
}

template <typename T, typename S, int HDP, bool DROP>
cudaError_t qrow_bwd_launch(const attn_params &a, cudaStream_t st) {
    constexpr bool PIECES = FG_QROW_PIECES;
    const int G = qrow_heads(a.L);
    const int64_t heads = (int64_t)a.B * a.H;
    const unsigned blocks = (unsigned)((heads + G - 1) / G);
    const size_t smem = qrow_bwd_smem(a.L, HDP, sizeof(qrow_bwd_tile<S, PIECES>));
    if (smem > 48 * 1024) { /* past the default limit the kernel must opt in */
        const cudaError_t e = cudaFuncSetAttribute((const void *)qrow_bwd_kernel<T, S, HDP, DROP, PIECES>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    if (sizeof(qrow_bwd_tile<S, PIECES>) == 2) { /* shared memory for all of qrow_bwd_blocks, the rest L1 */
        const cudaError_t e = cudaFuncSetAttribute((const void *)qrow_bwd_kernel<T, S, HDP, DROP, PIECES>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   qrow_carveout(smem, qrow_bwd_blocks<S, HDP>()));
        if (e != cudaSuccess) return e;
    }
    qrow_bwd_kernel<T, S, HDP, DROP, PIECES><<<blocks, QT, smem, st>>>(a);
    return cudaGetLastError();
}

/* each kernel with and without dropout: the instance without carries none of its registers */
template <typename T, typename S, int HDP>
cudaError_t qrow_run_hd(const attn_params &a, bool forward, cudaStream_t st) {
    if (forward) return a.dropout ? qrow_launch<T, S, HDP, true>(a, st) : qrow_launch<T, S, HDP, false>(a, st);
    return a.dropout ? qrow_bwd_launch<T, S, HDP, true>(a, st) : qrow_bwd_launch<T, S, HDP, false>(a, st);
}

/* the padded head dims: 4 (hd 1 … 4) and 8 (hd 5 … 8) */
template <typename T, typename S>
cudaError_t qrow_run(const attn_params &a, bool forward, int hdp, cudaStream_t st) {
    if (hdp == 4) return qrow_run_hd<T, S, 4>(a, forward, st);
    if (hdp == 8) return qrow_run_hd<T, S, 8>(a, forward, st);
    return cudaErrorInvalidValue;
}

} // namespace

#if FG_QROW_PIECES
cudaError_t fg_cuda_attn_qrow_pieces(const attn_params &a, bool forward, fg_dtype dtype, bool s32, int hdp,
                                     cudaStream_t st) {
#else
bool fg_cuda_attn_qrow_fits(const fg_attn_problem *p, int *hdp) {
    if (p->L < 1 || p->L > 64 || p->hd < 1 || p->hd > 8) return false;
    *hdp = p->hd <= 4 ? 4 : 8;
    return true;
}

cudaError_t fg_cuda_attn_qrow(const attn_params &a, bool forward, fg_dtype dtype, bool s32, int hdp, cudaStream_t st) {
    if (a.P > 1) return fg_cuda_attn_qrow_pieces(a, forward, dtype, s32, hdp, st);
#endif
    if (dtype == FG_F32) return qrow_run<float, float>(a, forward, hdp, st);
    if (dtype == FG_F16)
        return s32 ? qrow_run<__half, float>(a, forward, hdp, st) : qrow_run<__half, __half>(a, forward, hdp, st);
    if (dtype == FG_BF16)
        return s32 ? qrow_run<__nv_bfloat16, float>(a, forward, hdp, st)
                   : qrow_run<__nv_bfloat16, __nv_bfloat16>(a, forward, hdp, st);
    return cudaErrorInvalidValue;
}

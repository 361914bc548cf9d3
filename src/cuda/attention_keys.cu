/*
 * attention_keys.cu — the short-sequence kernels for PatchTST's heads (L <= 64, hd <= 8: L 42
 * with hd 4 or 8; any dtype and strides, every option).
 *
 * The forward runs a thread a query row (qrow_fwd_kernel): a block holds whole heads, their k and
 * v rows and [L, L] scores in shared memory, the scores moved in and out as coalesced runs; each
 * thread sweeps its row twice (q·k plus scores in and the max; then e^(x − m), its sum and Σ e·v)
 * with no cross-lane step.
 * The backward runs sixteen lanes a head, two heads a warp (keys_bwd_kernel): lane l holds keys
 * l, l + 16, … (NS of them) with their k, v rows and their dk, dv sums in registers, so that each
 * key's gradient has one owner. A query row is one step of the warp: q, do, lse and D broadcast
 * from shared memory, one score a key a lane. The score operands it reads stream through a ring
 * of row slots in shared memory (cp.async, seven rows ahead: the loop is otherwise bound by their
 * latency); the one it writes goes straight from registers to memory as coalesced rows. dq is a
 * reduce-scatter over the head's lanes that leaves each lane one head dim of the row.
 * Both: exp, max and log take their SFU forms (the loops are bound by issued instructions); no
 * [L, L] buffer in global memory, no atomics but the bad-length flag, every sum in a fixed order.
 * Each kernel is built with and without dropout: without, it carries none of the Philox draw's
 * registers (the hd-8 backward then fits its 168 without spilling).
 * Why: the thread-a-row kernels of attention.cu (SHORT ROWS, hd up to 32) stage two score
 * matrices a head and spend most of their instructions addressing them; the forward here stages
 * one and walks it with row pointers, and the key-lane backward keeps a head in ≈ 6 KB. The
 * masking, dropout, NaN and bad-length rules are attention.cuh's, as on every path.
 */
#include "attention.cuh"

namespace {

constexpr float KNEG_INF = -INFINITY;
constexpr int KL = 16;                     /* lanes a head */
constexpr int KWARPS = 4;                  /* warps a block */
constexpr int KHEADS = KWARPS * 32 / KL;   /* heads a block */
constexpr unsigned KFULL = 0xffffffffu;
constexpr int KR = 8;                      /* ring slots a loaded score operand: rows read KR - 1 ahead */

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

/* The SFU forms of the softmax's functions (both kernels' loops are bound by issued
   instructions): e^t as 2^(t·log2 e), flushed to 0 below 2^-126 (e^-87: nothing a softmax sum
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

/* The head's sum of acc[0 … N) (N <= 16, a power of two) over its 16 lanes (every lane of the
   warp takes part), scattered: each halving step sends half of what a lane still holds to its
   partner and keeps the other half, so the lane ends with one dim's total, dim
   scatter_dim<N>(kl); the lanes whose low bits (below KL / N) are zero are the ones to write it.
   log2(16) steps, N - 1 + log2(16 / N) shuffles in all. */
template <int N> __device__ __forceinline__ float head_scatter(float (&acc)[N], int kl) {
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
        } else {
            acc[0] += __shfl_xor_sync(KFULL, acc[0], o);
        }
    }
    return acc[0];
}

template <int N> __device__ __forceinline__ int scatter_dim(int kl) {
    int d = 0;
#pragma unroll
    for (int t = 0; t < 4; t++)
        if ((N >> (t + 1)) >= 1 && (kl & (KL >> (t + 1))) != 0) d += N >> (t + 1);
    return d;
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

/* A lane's walk down an [L, L] score operand of its head: the row's pointer at key kl, advanced
   a row at a time (no per-row index products), and key kl + 16·s at s·step from it. ok: the
   operand is present (and, for what is written, the head live). */
template <typename S> struct krow {
    S *p;
    int64_t sl, step;
    bool ok;
    __device__ __forceinline__ krow(const attn_view &v, const khead &w, int kl, bool use)
        : p(use && v.p ? (S *)v.p + w.b * v.sb + w.h * v.sh + (int64_t)kl * v.sx : nullptr), sl(v.sl),
          step((int64_t)KL * v.sx), ok(p != nullptr) {}
    __device__ __forceinline__ S *at(int s) const { return p + s * step; }
    __device__ __forceinline__ void next() { p += sl; }
};

/* 4 bytes global → shared by cp.async (L1-allocating: the only form that copies fewer than 16);
   a group's end and the wait for all but the newest N. */
__device__ __forceinline__ void kcopy4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void kcommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void kwait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* A score operand the backward's loop reads ([L, L] a head: the scores in and their gradient),
   streamed through a ring of KR row slots in shared memory so that KR - 1 rows are
   in flight while a row computes (with one row ahead in registers the loop waited on
   its loads' latency most of the time, 16-bit scores the most). Where the head's rows are
   contiguous, 4-byte aligned and a whole number of 4-byte chunks long, the 16 lanes copy a row
   chunk by chunk with cp.async (a chunk of 16-bit scores holds two lanes' keys, so a row is read
   only after __syncwarp); otherwise each lane loads its own keys and stores them in the slot (no
   prefetch: the slow path). A slot holds a row in its own layout, key j at j · sizeof(S). */
template <typename S, int NS> struct kring {
    static constexpr int SLOTB = KL * NS * (int)sizeof(S); /* bytes a slot: 16-byte multiple */
    static constexpr int CT = (SLOTB / 4 + KL - 1) / KL;    /* 4-byte chunks a lane a row */
    const char *g;   /* the next row to fill at key 0; NULL: the operand is absent */
    int64_t slb, sx; /* row stride in bytes, key stride in elements */
    char *sm;        /* the head's KR slots */
    int rowb;        /* L · sizeof(S) */
    bool async;
    __device__ __forceinline__ kring(const attn_view &v, const khead &w, int L, char *ring)
        : g(v.p ? (const char *)((const S *)v.p + w.b * v.sb + w.h * v.sh) : nullptr), slb(v.sl * (int64_t)sizeof(S)),
          sx(v.sx), sm(ring), rowb(L * (int)sizeof(S)),
          async(v.sx == 1 && ((uintptr_t)g & 3) == 0 && (slb & 3) == 0 && (rowb & 3) == 0) {}
    /* copy row r (< L) into its slot, and end the group (an empty one past L, so that every lane
       counts the same groups) */
    __device__ __forceinline__ void fill(int kl, int L, int r) {
        if (g && r < L) {
            char *dst = sm + (r & (KR - 1)) * SLOTB;
            if (async) {
#pragma unroll
                for (int t = 0; t < CT; t++) {
                    const int c = 4 * (kl + KL * t);
                    if (c < rowb) kcopy4(dst + c, g + c);
                }
            } else {
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    const int j = kl + KL * s;
                    if (j < L) reinterpret_cast<S *>(dst)[j] = reinterpret_cast<const S *>(g)[j * sx];
                }
            }
            g += slb;
        }
        kcommit();
    }
    /* zeros in every slot, each lane its own keys' places (before the first fill, in program
       order for the lane's own): what is never filled — the keys past L, an absent operand's
       rows — reads as 0 */
    __device__ __forceinline__ void clear(int kl) const {
#pragma unroll
        for (int r = 0; r < KR; r++)
#pragma unroll
            for (int s = 0; s < NS; s++) reinterpret_cast<S *>(sm + r * SLOTB)[kl + KL * s] = from_acc<S>(0.f);
    }
    /* row i's scores of the lane's keys; row i has landed */
    __device__ __forceinline__ void read(int kl, int i, float x[NS]) const {
        const S *row = reinterpret_cast<const S *>(sm + (i & (KR - 1)) * SLOTB);
#pragma unroll
        for (int s = 0; s < NS; s++) x[s] = to_acc(row[kl + KL * s]);
    }
};

/* the ring bytes a head: KR slots for each operand the backward's loop reads */
__host__ __device__ __forceinline__ int keys_ring_bytes(int ns, int ssize, int streams) {
    return KR * KL * ns * ssize * streams;
}

/* The backward's shared floats a head: q and do rows, lse and D, rounded to whole float4 so that
   every head's rows stay 16-byte aligned. */
__host__ __device__ __forceinline__ int keys_head_floats(int L, int hdp) { return (L * (2 * hdp + 2) + 3) & ~3; }

template <typename T, typename S, int NS, int HDP, bool DROP>
__global__ void __launch_bounds__(KWARPS * 32, NS * HDP > 24 ? 2 : NS * HDP > 12 ? 3 : 4) keys_bwd_kernel(attn_params a) {
    extern __shared__ float4 ksm4[];
    const int L = a.L, hd = a.hd, kl = threadIdx.x & (KL - 1), hg = threadIdx.x / KL;
    float *Qs = reinterpret_cast<float *>(ksm4) + (size_t)hg * keys_head_floats(L, HDP);
    float *dOs = Qs + L * HDP, *LDs = dOs + L * HDP; /* (lse, D) pairs */
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
            reinterpret_cast<float2 *>(LDs)[j] = make_float2(a.lse[H_.n * L + j], D);
        } else {
#pragma unroll
            for (int d = 0; d < HDP; d++) k[s][d] = v[s][d] = 0.f;
        }
    }
    char *ring = reinterpret_cast<char *>(ksm4) + (size_t)KHEADS * keys_head_floats(L, HDP) * sizeof(float) +
                 (size_t)hg * keys_ring_bytes(NS, sizeof(S), 2);
    kring<S, NS> rin(a.sin, H_, L, ring), rg(a.dso, H_, L, ring + keys_ring_bytes(NS, sizeof(S), 1));
    rin.clear(kl), rg.clear(kl);
    __syncwarp(); /* the zeros are in place before any lane's chunks land */
#pragma unroll
    for (int r = 0; r < KR - 1; r++) rin.fill(kl, L, r), rg.fill(kl, L, r);
    krow<S> rd(a.dsin, H_, kl, H_.live);
    const int dim = scatter_dim<HDP>(kl);
    T *dqp = a.dq.p && H_.live && (kl & (KL / HDP - 1)) == 0 && dim < hd ? at<T>(a.dq, H_.b, H_.h, 0, dim) : nullptr;
    for (int i = 0; i < L; i++) {
        kwait<2 * (KR - 2)>(); /* row i of both has landed (two groups a row) */
        __syncwarp();
        rin.fill(kl, L, i + KR - 1), rg.fill(kl, L, i + KR - 1);
        float cin[NS], cg[NS];
        rin.read(kl, i, cin);
        rg.read(kl, i, cg);
        const float2 ld = reinterpret_cast<const float2 *>(LDs)[i];
        const float lse = ld.x, D = ld.y;
        const int jend = bad || lse == KNEG_INF ? 0 : key_end(a, i, len);
        float q[HDP], dO[HDP], dq[HDP];
        key_get<HDP>(Qs + i * HDP, q);
        key_get<HDP>(dOs + i * HDP, dO);
#pragma unroll
        for (int d = 0; d < HDP; d++) dq[d] = 0.f;
        float ds[NS];
#pragma unroll
        for (int s = 0; s < NS; s++) {
            /* every slot computes; a masked key's p and ds are selected to 0 (no branch) */
            const int j = kl + KL * s;
            const bool live = j < jend;
            const float x = key_dot<HDP>(q, k[s]) * a.scale + cin[s];
            const float p = kexp(x - lse), kd = DROP ? keep_factor(a, H_.n, i, j) : 1.f;
            const float g = p * (key_dot<HDP>(dO, v[s]) * kd - D) + cg[s];
            ds[s] = live ? g : 0.f;
            const float pk = live ? p * kd : 0.f;
#pragma unroll
            for (int d = 0; d < HDP; d++) {
                dk[s][d] += ds[s] * q[d];
                dv[s][d] += pk * dO[d];
                dq[d] += ds[s] * k[s][d];
            }
        }
        const float g = head_scatter<HDP>(dq, kl);
        if (rd.ok) {
            if (a.accumulate) {
#pragma unroll
                for (int s = 0; s < NS; s++)
                    if (kl + KL * s < L) *rd.at(s) = from_acc<S>((bad ? knan() : ds[s]) + to_acc(*rd.at(s)));
            } else {
#pragma unroll
                for (int s = 0; s < NS; s++)
                    if (kl + KL * s < L) *rd.at(s) = from_acc<S>(bad ? knan() : ds[s]);
            }
            rd.next();
        }
        if (dqp) {
            const float val = bad ? knan() : g * a.scale;
            *dqp = from_acc<T>(a.accumulate && !bad ? val + to_acc(*dqp) : val);
            dqp += a.dq.sl;
        }
    }
    if (!H_.live) return;
    if (bad && kl == 0) raise_bad_length(a, H_.b);
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

/* ------------------------------------------------------------------ the forward: a thread a row */

/* The forward runs a thread a query row (the backward keeps the key lanes: its dk, dv sums are
   per key). A block of QT threads takes G = QT / L whole heads: their k and v rows and their
   [L, L] scores in a padded tile of shared memory (row stride L + 1: a warp's rows hit distinct
   banks). The scores in come into the tile and the scores out leave it as coalesced runs of the
   block's heads (4-element vectors where the heads are one contiguous, aligned run; row by row
   otherwise); between, each thread sweeps its row twice with no cross-lane step: q·k + scores in
   into the tile and the max, then e^(x − m), its sum and Σ e·v. A score costs a thread ≈ 40
   instructions, where a lane-a-key forward spends ≈ 250 a row step of two heads on three keys,
   most of it the reductions and the reduce-scatter every row needs. */
constexpr int QT = 128;

__host__ __device__ __forceinline__ int qrow_heads(int L) { return QT / L; }

size_t qrow_smem(int L, int hdp) {
    const size_t G = (size_t)qrow_heads(L);
    return sizeof(float) * (G * 2 * (size_t)L * hdp + G * (size_t)L * (L + 1));
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

template <typename S>
__device__ __forceinline__ void qrow_scores_in(const attn_params &a, const attn_view &v, float *tile, int64_t n0, int nh) {
    const int L = a.L, LP = L + 1;
    if (qrow_flat<S>(v, L, a.H)) {
        const S *src = (const S *)v.p + n0 * L * L;
        const int E = nh * L * L;
        const float invL = 1.f / (float)L;
        for (int f = 4 * (int)threadIdx.x; f < E; f += 4 * QT) {
            const vec_t<S, 4> u = *reinterpret_cast<const vec_t<S, 4> *>(src + f);
#pragma unroll
            for (int e = 0; e < 4; e++) tile[f + e + qrow_of(f + e, invL)] = to_acc(u.v[e]);
        }
        return;
    }
    for (int r = (int)threadIdx.x / 32; r < nh * L; r += QT / 32) {
        const int hg = r / L, i = r - hg * L;
        const int64_t n = n0 + hg, b = n / a.H, h = n - b * a.H;
        const S *row = (const S *)v.p + b * v.sb + h * v.sh + (int64_t)i * v.sl;
        for (int j = (int)threadIdx.x % 32; j < L; j += 32) tile[r * LP + j] = to_acc(row[(int64_t)j * v.sx]);
    }
}

template <typename S>
__device__ __forceinline__ void qrow_scores_out(const attn_params &a, const attn_view &v, const float *tile, int64_t n0,
                                                int nh) {
    const int L = a.L, LP = L + 1;
    if (qrow_flat<S>(v, L, a.H)) {
        S *dst = (S *)v.p + n0 * L * L;
        const int E = nh * L * L;
        const float invL = 1.f / (float)L;
        for (int f = 4 * (int)threadIdx.x; f < E; f += 4 * QT) {
            vec_t<S, 4> u;
#pragma unroll
            for (int e = 0; e < 4; e++) u.v[e] = from_acc<S>(tile[f + e + qrow_of(f + e, invL)]);
            *reinterpret_cast<vec_t<S, 4> *>(dst + f) = u;
        }
        return;
    }
    for (int r = (int)threadIdx.x / 32; r < nh * L; r += QT / 32) {
        const int hg = r / L, i = r - hg * L;
        const int64_t n = n0 + hg, b = n / a.H, h = n - b * a.H;
        S *row = (S *)v.p + b * v.sb + h * v.sh + (int64_t)i * v.sl;
        for (int j = (int)threadIdx.x % 32; j < L; j += 32) row[(int64_t)j * v.sx] = from_acc<S>(tile[r * LP + j]);
    }
}

template <typename T, typename S, int HDP, bool DROP>
__global__ void __launch_bounds__(QT) qrow_fwd_kernel(attn_params a) {
    extern __shared__ float4 ksm4[];
    const int L = a.L, hd = a.hd, LP = L + 1, G = QT / L;
    const int64_t BH = (int64_t)a.B * a.H, n0 = (int64_t)blockIdx.x * G;
    const int nh = (int)min((int64_t)G, BH - n0);
    float *Ks = reinterpret_cast<float *>(ksm4), *Vs = Ks + G * L * HDP, *tile = Vs + G * L * HDP;
    /* the heads' k and v rows (zeros past a sequence's length) and their scores in */
    for (int r = (int)threadIdx.x; r < nh * L; r += QT) {
        const int hg = r / L, j = r - hg * L;
        const int64_t n = n0 + hg, b = n / a.H, h = n - b * a.H;
        bool bad = false;
        const int len = seq_len(a, b, &bad);
        float x[HDP];
        key_load_live<T, HDP>(a.k, b, h, j, len, hd, x);
        key_put<HDP>(Ks + r * HDP, x);
        key_load_live<T, HDP>(a.v, b, h, j, len, hd, x);
        key_put<HDP>(Vs + r * HDP, x);
    }
    if (a.sin.p) qrow_scores_in<S>(a, a.sin, tile, n0, nh);
    __syncthreads();
    const int t = (int)threadIdx.x;
    if (t < nh * L) {
        const int hg = t / L, i = t - hg * L;
        const int64_t n = n0 + hg, b = n / a.H, h = n - b * a.H;
        bool bad = false;
        const int len = seq_len(a, b, &bad);
        const int jend = bad ? 0 : key_end(a, i, len);
        float q[HDP];
        key_load<T, HDP>(a.q, b, h, i, hd, q);
        const float *K = Ks + hg * L * HDP, *V = Vs + hg * L * HDP;
        float *row = tile + t * LP;
        const bool sin = a.sin.p != nullptr;
        float m = KNEG_INF;
#pragma unroll 2
        for (int j = 0; j < jend; j++) {
            float k[HDP];
            key_get<HDP>(K + j * HDP, k);
            const float x = key_dot<HDP>(q, k) * a.scale + (sin ? row[j] : 0.f);
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
            key_get<HDP>(V + j * HDP, v);
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
        qrow_scores_out<S>(a, a.sout, tile, n0, nh);
    }
}

template <typename T, typename S, int HDP, bool DROP>
cudaError_t qrow_launch(const attn_params &a, cudaStream_t st) {
    const int G = qrow_heads(a.L);
    const int64_t heads = (int64_t)a.B * a.H;
    const unsigned blocks = (unsigned)((heads + G - 1) / G);
    qrow_fwd_kernel<T, S, HDP, DROP><<<blocks, QT, qrow_smem(a.L, HDP), st>>>(a);
    return cudaGetLastError();
}

/* Shared-memory bytes of a backward block: each head's q, do, lse and D (keys_head_floats) and
   its two rings. */
size_t keys_smem(int L, int hdp, int ns, int ssize) {
    return (size_t)KHEADS * (sizeof(float) * (size_t)keys_head_floats(L, hdp) + (size_t)keys_ring_bytes(ns, ssize, 2));
}

template <typename T, typename S, int NS, int HDP, bool DROP>
cudaError_t keys_launch_drop(const attn_params &a, bool forward, cudaStream_t st) {
    if (forward) return qrow_launch<T, S, HDP, DROP>(a, st);
    const int64_t heads = (int64_t)a.B * a.H;
    const unsigned blocks = (unsigned)((heads + KHEADS - 1) / KHEADS);
    const size_t smem = keys_smem(a.L, HDP, NS, sizeof(S));
    if (smem > 48 * 1024) { /* past the default limit the kernel must opt in */
        const cudaError_t e = cudaFuncSetAttribute((const void *)keys_bwd_kernel<T, S, NS, HDP, DROP>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    keys_bwd_kernel<T, S, NS, HDP, DROP><<<blocks, KWARPS * 32, smem, st>>>(a);
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

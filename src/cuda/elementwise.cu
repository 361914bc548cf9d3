/*
 * elementwise.cu — CUDA kernels of the parameterized elementwise family (unary: scale,
 * pow, leaky_relu, elu, clamp, softcap; binary: lerp, axpby; forward and backward).
 *
 *  - Fast path: every operand contiguous over the full shape (or a single broadcast
 *    value) and 16-byte aligned; a backward writes every requested gradient in the same
 *    pass over dy. The common operand combinations have compile-time masks: each block
 *    owns a contiguous span and each thread loads 64 bytes per operand (4 vectors, 2 for
 *    2-byte types) before it stores, enough bytes in flight for copy bandwidth; masks
 *    known at compile time keep registers for the real operands only. Other combinations
 *    take one kernel with the masks read at run time (one vector per thread per
 *    grid-stride step).
 *  - General path: any strides, numpy broadcasting; one thread per element.
 *  - A gradient whose input was broadcast is a sum over the broadcast dims: blocks sum
 *    fixed slices with a fixed-order tree, and a second kernel adds the slices in order,
 *    so the result is the same bits every run.
 * Math in f32 for f32/f16/bf16 and in f64 for f64; the CPU backend (f64 everywhere) is
 * the reference the tests hold these kernels to.
 */
#include "cuda_internal.h"
#include "elem.cuh"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { UB_DY, UB_X, UB_DX };
enum { BB_DY, BB_A, BB_B, BB_W, BB_DA, BB_DB, BB_DW };

struct ew_dev {
    int op, kind, rank, n;
    bool accumulate;
    unsigned present, outputs, reduced;
    double s[4];
    int64_t numel;
    int64_t shape[FG_MAX_RANK];
    int64_t stride[FG_EW_MAX_OPERANDS][FG_MAX_RANK];
    void *data[FG_EW_MAX_OPERANDS];
};

/* ------------------------------------------------------------------ the math */

template <typename A> __device__ __forceinline__ A unary_f(int kind, const A *s, A x) {
    switch (kind) {
    case FG_UNARY_SCALE: return s[0] * x;
    case FG_UNARY_POW: return pow(x, s[0]);
    case FG_UNARY_LEAKY_RELU: return x > A(0) ? x : s[0] * x;
    case FG_UNARY_ELU: return x > A(0) ? x : s[0] * expm1(x);
    case FG_UNARY_CLAMP: return isnan(x) ? x : fmin(fmax(x, s[0]), s[1]);
    case FG_UNARY_SOFTCAP: return s[0] * tanh(x / s[0]);
    }
    return A(NAN);
}

template <typename A> __device__ __forceinline__ A unary_df(int kind, const A *s, A x) {
    switch (kind) {
    case FG_UNARY_SCALE: return s[0];
    case FG_UNARY_POW: return s[0] == A(0) ? A(0) : s[0] * pow(x, s[0] - A(1));
    case FG_UNARY_LEAKY_RELU: return isnan(x) ? x : x > A(0) ? A(1) : s[0];
    case FG_UNARY_ELU: return isnan(x) ? x : x > A(0) ? A(1) : s[0] * exp(x);
    case FG_UNARY_CLAMP: return (x >= s[0] && x <= s[1]) ? A(1) : A(0);
    case FG_UNARY_SOFTCAP: {
        A t = tanh(x / s[0]);
        return A(1) - t * t;
    }
    }
    return A(NAN);
}

template <typename A> __device__ __forceinline__ A lerp(A a, A b, A w) {
    return w < A(0.5) ? a + w * (b - a) : b - (b - a) * (A(1) - w);
}

/* The value output `which` takes at one element, from the inputs v[]. */
template <int OP, typename A>
__device__ __forceinline__ A value(const ew_dev &e, const A *s, int which, const A *v) {
    if (OP == FG_OP_UNARY_FORWARD) return unary_f(e.kind, s, v[0]);
    if (OP == FG_OP_UNARY_BACKWARD) return v[UB_DY] * unary_df(e.kind, s, v[UB_X]);
    if (OP == FG_OP_BINARY_FORWARD) {
        if (e.kind == FG_BINARY_AXPBY) return s[0] * v[0] + s[1] * v[1];
        return lerp(v[0], v[1], (e.present >> 2 & 1u) ? v[2] : s[0]);
    }
    A w = (e.present >> BB_W & 1u) ? v[BB_W] : s[0];
    if (e.kind == FG_BINARY_AXPBY) return (which == BB_DA ? s[0] : s[1]) * v[BB_DY];
    if (which == BB_DA) return (A(1) - w) * v[BB_DY];
    if (which == BB_DB) return w * v[BB_DY];
    return (v[BB_B] - v[BB_A]) * v[BB_DY];
}

template <typename T, typename A>
__device__ __forceinline__ void put(const ew_dev &e, int i, int64_t off, A v) {
    T *p = (T *)e.data[i] + off;
    if (e.accumulate) v += to_acc(*p);
    *p = from_acc<T>(v);
}

/* ------------------------------------------------------------------ fast path */

/* Contiguous operands (stride 1; inputs may be one broadcast value, stride 0).
 * IN / OUT: the vector inputs and written outputs as compile-time masks for the common
 * combinations (two vectors in flight per thread, registers only for real operands), or
 * RUNTIME for any other (masks read at run time, one vector in flight). */
constexpr unsigned RUNTIME = 0xFFu;
/* vectors per thread in the compile-time-mask kernels: 64 bytes of each operand in
 * flight; 2-byte types get 2 (each of their vectors widens to 8 floats in registers) */
template <typename T> struct fast_u { static constexpr int value = sizeof(T) >= 4 ? 4 : 2; };

template <typename T, int OP, int VEC, unsigned IN, unsigned OUT>
__global__ void __launch_bounds__(256) ew_fast(ew_dev e, unsigned direct_rt, unsigned scalar_in) {
    typedef typename acc_type<T>::type A;
    const unsigned direct = OUT == RUNTIME ? direct_rt : OUT;
    const unsigned vin = IN == RUNTIME ? (e.present & ~e.outputs & ~scalar_in) : IN;
    A s[4] = {A(e.s[0]), A(e.s[1]), A(e.s[2]), A(e.s[3])};
    A one[FG_EW_MAX_OPERANDS]; /* broadcast inputs, read once (constant indices: registers) */
#pragma unroll
    for (int i = 0; i < FG_EW_MAX_OPERANDS; i++) one[i] = (scalar_in >> i & 1u) ? to_acc(*(const T *)e.data[i]) : A(0);
    const int64_t nvec = e.numel / VEC;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if constexpr (IN != RUNTIME) {
        /* each block owns FAST_U·256 consecutive vectors; every thread issues the loads
           of its FAST_U vectors before its first store */
        constexpr int FAST_U = fast_u<T>::value;
        const int64_t base = (int64_t)blockIdx.x * 256 * FAST_U + threadIdx.x;
        vec_t<T, VEC> in[FAST_U][FG_EW_MAX_OPERANDS], acc_in[FAST_U][FG_EW_MAX_OPERANDS];
#pragma unroll
        for (int u = 0; u < FAST_U; u++) {
            const int64_t qu = base + u * 256;
            if (qu >= nvec) continue;
#pragma unroll
            for (int i = 0; i < FG_EW_MAX_OPERANDS; i++) {
                if (i < e.n && (vin >> i & 1u)) in[u][i] = load_vec<T, VEC>((const T *)e.data[i] + qu * VEC);
                if (e.accumulate && i < e.n && (direct >> i & 1u))
                    acc_in[u][i] = load_vec<T, VEC>((const T *)e.data[i] + qu * VEC);
            }
        }
#pragma unroll
        for (int u = 0; u < FAST_U; u++) {
            const int64_t qu = base + u * 256;
            if (qu >= nvec) continue;
#pragma unroll
            for (int i = 0; i < FG_EW_MAX_OPERANDS; i++) {
                if (i >= e.n || !(direct >> i & 1u)) continue;
                vec_t<T, VEC> out;
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    A v[FG_EW_MAX_OPERANDS];
#pragma unroll
                    for (int j = 0; j < FG_EW_MAX_OPERANDS; j++)
                        v[j] = (scalar_in >> j & 1u) ? one[j] : to_acc(in[u][j].v[k]);
                    A r = value<OP, A>(e, s, i, v);
                    out.v[k] = from_acc<T>(e.accumulate ? r + to_acc(acc_in[u][i].v[k]) : r);
                }
                store_vec<T, VEC>((T *)e.data[i] + qu * VEC, out);
            }
        }
        q = nvec; /* the vectors are done; the tail below covers numel % VEC */
    }
    for (; q < nvec; q += step) { /* what is left of the vectors, one per thread */
        vec_t<T, VEC> in[FG_EW_MAX_OPERANDS];
#pragma unroll
        for (int i = 0; i < FG_EW_MAX_OPERANDS; i++)
            if (i < e.n && (vin >> i & 1u))
                in[i] = load_vec<T, VEC>((const T *)e.data[i] + q * VEC);
#pragma unroll
        for (int i = 0; i < FG_EW_MAX_OPERANDS; i++) {
            if (i >= e.n || !(direct >> i & 1u)) continue;
            vec_t<T, VEC> out;
            if (e.accumulate) out = load_vec<T, VEC>((const T *)e.data[i] + q * VEC);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                A v[FG_EW_MAX_OPERANDS];
#pragma unroll
                for (int j = 0; j < FG_EW_MAX_OPERANDS; j++)
                    v[j] = (scalar_in >> j & 1u) ? one[j] : to_acc(in[j].v[k]);
                A r = value<OP, A>(e, s, i, v);
                out.v[k] = from_acc<T>(e.accumulate ? r + to_acc(out.v[k]) : r);
            }
            store_vec<T, VEC>((T *)e.data[i] + q * VEC, out);
        }
    }
    /* the tail (numel % VEC elements): one element per thread */
    int64_t tail0 = (IN != RUNTIME) ? (blockIdx.x == gridDim.x - 1 ? threadIdx.x : e.numel) :
                                      (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t idx = nvec * VEC + tail0; idx < e.numel; idx += step) {
        A v[FG_EW_MAX_OPERANDS];
#pragma unroll
        for (int j = 0; j < FG_EW_MAX_OPERANDS; j++) /* constant indices keep v in registers */
            v[j] = (j < e.n && (e.present >> j & 1u) && !(e.outputs >> j & 1u))
                       ? ((scalar_in >> j & 1u) ? one[j] : to_acc(((const T *)e.data[j])[idx]))
                       : A(0);
#pragma unroll
        for (int i = 0; i < FG_EW_MAX_OPERANDS; i++)
            if (i < e.n && (direct >> i & 1u)) put<T, A>(e, i, idx, value<OP, A>(e, s, i, v));
    }
}

/* ------------------------------------------------------------------ general path */

template <typename T, typename A>
__device__ __forceinline__ void load_inputs(const ew_dev &e, const int64_t *coord, A *v) {
#pragma unroll
    for (int j = 0; j < FG_EW_MAX_OPERANDS; j++) {
        v[j] = A(0);
        if (j >= e.n || !(e.present >> j & 1u) || (e.outputs >> j & 1u)) continue;
        int64_t off = 0;
        for (int d = 0; d < e.rank; d++) off += coord[d] * e.stride[j][d];
        v[j] = to_acc(((const T *)e.data[j])[off]);
    }
}

template <typename T, int OP>
__global__ void __launch_bounds__(256) ew_general(ew_dev e, unsigned direct) {
    typedef typename acc_type<T>::type A;
    A s[4] = {A(e.s[0]), A(e.s[1]), A(e.s[2]), A(e.s[3])};
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < e.numel; idx += step) {
        int64_t coord[FG_MAX_RANK], q = idx;
        for (int d = e.rank - 1; d >= 0; d--) {
            coord[d] = q % e.shape[d];
            q /= e.shape[d];
        }
        A v[FG_EW_MAX_OPERANDS];
        load_inputs<T, A>(e, coord, v);
        for (int i = 0; i < e.n; i++) {
            if (!(direct >> i & 1u)) continue;
            int64_t off = 0;
            for (int d = 0; d < e.rank; d++) off += coord[d] * e.stride[i][d];
            put<T, A>(e, i, off, value<OP, A>(e, s, i, v));
        }
    }
}

/* ------------------------------------------------------------------ sums over broadcast dims */

constexpr int RED_THREADS = 256;

struct red_dims {
    int nk, nr;
    int kept[FG_MAX_RANK], red[FG_MAX_RANK];
    int64_t n_out, n_red, per_slice;
    int slices;
};

/* Block (o, s): output element o of operand `which`, reduction slice s. */
template <typename T, int OP>
__global__ void __launch_bounds__(RED_THREADS) ew_reduce(ew_dev e, int which, red_dims r,
                                                         typename acc_type<T>::type *part) {
    typedef typename acc_type<T>::type A;
    __shared__ A buf[RED_THREADS];
    A s[4] = {A(e.s[0]), A(e.s[1]), A(e.s[2]), A(e.s[3])};
    const int64_t o = blockIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * r.per_slice;
    const int64_t r1 = r0 + r.per_slice < r.n_red ? r0 + r.per_slice : r.n_red;
    int64_t coord[FG_MAX_RANK], q = o;
    for (int k = r.nk - 1; k >= 0; k--) {
        coord[r.kept[k]] = q % e.shape[r.kept[k]];
        q /= e.shape[r.kept[k]];
    }
    A acc = 0;
    for (int64_t t = r0 + threadIdx.x; t < r1; t += RED_THREADS) {
        int64_t u = t;
        for (int k = r.nr - 1; k >= 0; k--) {
            coord[r.red[k]] = u % e.shape[r.red[k]];
            u /= e.shape[r.red[k]];
        }
        A v[FG_EW_MAX_OPERANDS];
        load_inputs<T, A>(e, coord, v);
        acc += value<OP, A>(e, s, which, v);
    }
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int w = RED_THREADS / 2; w > 0; w >>= 1) { /* a fixed tree: the same order every run */
        if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    if (r.slices > 1) {
        part[(int64_t)blockIdx.y * r.n_out + o] = buf[0];
        return;
    }
    for (int k = 0; k < r.nr; k++) coord[r.red[k]] = 0;
    int64_t off = 0;
    for (int d = 0; d < e.rank; d++) off += coord[d] * e.stride[which][d];
    put<T, A>(e, which, off, buf[0]);
}

template <typename T>
__global__ void ew_reduce_finish(ew_dev e, int which, red_dims r, const typename acc_type<T>::type *part) {
    typedef typename acc_type<T>::type A;
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= r.n_out) return;
    A acc = 0;
    for (int s = 0; s < r.slices; s++) acc += part[(int64_t)s * r.n_out + o];
    int64_t coord[FG_MAX_RANK], q = o, off = 0;
    for (int d = 0; d < e.rank; d++) coord[d] = 0;
    for (int k = r.nk - 1; k >= 0; k--) {
        coord[r.kept[k]] = q % e.shape[r.kept[k]];
        q /= e.shape[r.kept[k]];
    }
    for (int d = 0; d < e.rank; d++) off += coord[d] * e.stride[which][d];
    put<T, A>(e, which, off, acc);
}

/* ------------------------------------------------------------------ host side */

static red_dims reduction_of(const fg_ew *e, int which) {
    red_dims r;
    memset(&r, 0, sizeof r);
    r.n_out = r.n_red = 1;
    for (int d = 0; d < e->rank; d++) {
        if (e->stride[which][d] != 0) {
            r.kept[r.nk++] = d;
            r.n_out *= e->shape[d];
        } else {
            r.red[r.nr++] = d;
            r.n_red *= e->shape[d];
        }
    }
    /* slices from the shape alone: enough blocks to fill a GPU, ~16 elements per thread */
    int64_t want = (r.n_out >= 1024) ? 1 : (2048 + r.n_out - 1) / r.n_out;
    int64_t most = (r.n_red + RED_THREADS * 16 - 1) / (RED_THREADS * 16);
    if (want > most) want = most;
    if (want > 65535) want = 65535;
    if (want < 1) want = 1;
    r.per_slice = (r.n_red + want - 1) / want;
    r.slices = (int)((r.n_red + r.per_slice - 1) / r.per_slice);
    return r;
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* The combinations with compile-time operand masks: (vector inputs, outputs) per op. */
template <typename T, int OP, int VEC, unsigned IN, unsigned OUT>
static bool try_fast(unsigned vin, unsigned out, const ew_dev &d, unsigned blocks, cudaStream_t st) {
    (void)blocks;
    if (vin != IN || out != OUT) return false;
    constexpr int FAST_U = fast_u<T>::value;
    int64_t nvec = d.numel / VEC, grid = (nvec + 256 * FAST_U - 1) / (256 * FAST_U);
    ew_fast<T, OP, VEC, IN, OUT><<<(unsigned)(grid > 0 ? grid : 1), 256, 0, st>>>(d, OUT, 0);
    return true;
}

template <typename T, int OP, int VEC>
static bool fast_special(unsigned vin, unsigned out, const ew_dev &d, unsigned blocks, cudaStream_t st) {
    if constexpr (OP == FG_OP_UNARY_FORWARD) { /* x → y */
        return try_fast<T, OP, VEC, 0x1u, 0x2u>(vin, out, d, blocks, st);
    } else if constexpr (OP == FG_OP_UNARY_BACKWARD) { /* dy, x → dx; dy → dx (scale) */
        return try_fast<T, OP, VEC, 0x3u, 0x4u>(vin, out, d, blocks, st) ||
               try_fast<T, OP, VEC, 0x1u, 0x4u>(vin, out, d, blocks, st);
    } else if constexpr (OP == FG_OP_BINARY_FORWARD) { /* a, b (, w) → y */
        return try_fast<T, OP, VEC, 0x3u, 0x8u>(vin, out, d, blocks, st) ||
               try_fast<T, OP, VEC, 0x7u, 0x8u>(vin, out, d, blocks, st);
    } else { /* dy (, w) → da, db; dy, a, b, w → da, db, dw */
        return try_fast<T, OP, VEC, 0x1u, 0x30u>(vin, out, d, blocks, st) ||
               try_fast<T, OP, VEC, 0x1u, 0x10u>(vin, out, d, blocks, st) ||
               try_fast<T, OP, VEC, 0x1u, 0x20u>(vin, out, d, blocks, st) ||
               try_fast<T, OP, VEC, 0x9u, 0x30u>(vin, out, d, blocks, st) ||
               try_fast<T, OP, VEC, 0xFu, 0x70u>(vin, out, d, blocks, st);
    }
    return false;
}

template <typename T> struct launcher {
    template <int OP>
    static fg_status go(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws, size_t ws_bytes, bool run) {
        typedef typename acc_type<T>::type A;
        cudaStream_t st = ctx->cuda->stream;
        ew_dev d;
        memset(&d, 0, sizeof d);
        d.op = e->op;
        d.kind = e->kind;
        d.rank = e->rank;
        d.n = e->n_operands;
        d.accumulate = e->accumulate;
        d.present = e->present;
        d.outputs = e->outputs;
        d.reduced = e->reduced;
        d.numel = e->numel;
        for (int k = 0; k < 4; k++) d.s[k] = e->s[k];
        for (int k = 0; k < e->rank; k++) d.shape[k] = e->shape[k];
        for (int i = 0; i < e->n_operands; i++) {
            for (int k = 0; k < e->rank; k++) d.stride[i][k] = e->stride[i][k];
            d.data[i] = e->data[i];
        }
        const unsigned direct = e->outputs & e->present & ~e->reduced;
        const unsigned summed = e->outputs & e->present & e->reduced;
        /* fast when every present operand walks the (coalesced, rank <= 1) shape with
           stride 1, or is an input of one broadcast value */
        bool fast = e->rank <= 1;
        unsigned scalar_in = 0;
        for (int i = 0; fast && i < e->n_operands; i++) {
            if (!(e->present >> i & 1u)) continue;
            int64_t s = e->rank ? e->stride[i][0] : 1;
            if (s == 0 && !(e->outputs >> i & 1u)) scalar_in |= 1u << i;
            else if (s != 1 || (summed >> i & 1u)) fast = false;
        }
        if (summed) fast = false;
        /* 16-byte vectors where the plan's declared alignment allows them (and, running, the
           pointers have it) */
        bool vec = fast && (e->align == 0 || e->align >= 16);
        for (int i = 0; vec && run && i < e->n_operands; i++)
            if ((e->present >> i & 1u) && !(scalar_in >> i & 1u)) vec = aligned16(e->data[i]);
        constexpr int VEC = 16 / sizeof(T);
        size_t ws_need = 0;
        for (int i = 0; i < e->n_operands; i++) {
            if (!(summed >> i & 1u)) continue;
            red_dims r = reduction_of(e, i);
            size_t b = r.slices > 1 ? (size_t)(r.slices * r.n_out) * sizeof(A) : 0;
            if (b > ws_need) ws_need = b;
        }
        info->workspace_bytes = ws_need;
        snprintf(info->name, sizeof info->name, "%s<%s%s>%s", fast ? "ew_fast" : "ew_general", fg_dtype_name(e->dtype),
                 fast ? (vec ? ",v16B" : ",v1") : "", summed ? "+ew_reduce(ordered slices)" : "");
        if (!run || e->numel == 0) return FG_OK;
        if (ws_bytes < ws_need) return fg_fail(FG_ERR_INTERNAL, "elementwise: workspace too small");
        int blocks_cap = ctx->sm_count * 16;
        if (direct) {
            int64_t work = fast ? (vec ? e->numel / VEC + 1 : e->numel) : e->numel;
            int64_t blocks = (work + 255) / 256;
            if (blocks > blocks_cap) blocks = blocks_cap;
            if (blocks < 1) blocks = 1;
            const unsigned vin = e->present & ~e->outputs & ~scalar_in;
            if (fast && vec && !scalar_in && fast_special<T, OP, VEC>(vin, direct, d, (unsigned)blocks, st)) {
            } else if (fast && vec) {
                ew_fast<T, OP, VEC, RUNTIME, RUNTIME><<<(unsigned)blocks, 256, 0, st>>>(d, direct, scalar_in);
            } else if (fast) {
                ew_fast<T, OP, 1, RUNTIME, RUNTIME><<<(unsigned)blocks, 256, 0, st>>>(d, direct, scalar_in);
            } else {
                ew_general<T, OP><<<(unsigned)blocks, 256, 0, st>>>(d, direct);
            }
            cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess) return fg_cuda_fail(err, "elementwise");
        }
        for (int i = 0; i < e->n_operands; i++) {
            if (!(summed >> i & 1u)) continue;
            red_dims r = reduction_of(e, i);
            if (r.n_out > INT32_MAX) return fg_fail(FG_ERR_UNSUPPORTED, "elementwise: a summed gradient has more than 2^31 elements");
            A *part = (A *)ws;
            ew_reduce<T, OP><<<dim3((unsigned)r.n_out, (unsigned)r.slices), RED_THREADS, 0, st>>>(d, i, r, part);
            if (r.slices > 1)
                ew_reduce_finish<T><<<(unsigned)((r.n_out + 255) / 256), 256, 0, st>>>(d, i, r, part);
            cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess) return fg_cuda_fail(err, "elementwise reduction");
        }
        return FG_OK;
    }

    static fg_status run(const fg_ew *e, fg_context *ctx, fg_kernel_info *info, void *ws, size_t ws_bytes, bool do_run) {
        switch (e->op) {
        case FG_OP_UNARY_FORWARD: return go<FG_OP_UNARY_FORWARD>(ctx, e, info, ws, ws_bytes, do_run);
        case FG_OP_UNARY_BACKWARD: return go<FG_OP_UNARY_BACKWARD>(ctx, e, info, ws, ws_bytes, do_run);
        case FG_OP_BINARY_FORWARD: return go<FG_OP_BINARY_FORWARD>(ctx, e, info, ws, ws_bytes, do_run);
        case FG_OP_BINARY_BACKWARD: return go<FG_OP_BINARY_BACKWARD>(ctx, e, info, ws, ws_bytes, do_run);
        default: return fg_fail(FG_ERR_INTERNAL, "elementwise: op %d", (int)e->op);
        }
    }
};

extern "C" fg_status fg_cuda_elementwise(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws,
                                         size_t ws_bytes, bool run) {
    fg_device_guard guard(ctx->device);
    switch (e->dtype) {
    case FG_F32: return launcher<float>::run(e, ctx, info, ws, ws_bytes, run);
    case FG_F64: return launcher<double>::run(e, ctx, info, ws, ws_bytes, run);
    case FG_F16: return launcher<__half>::run(e, ctx, info, ws, ws_bytes, run);
    case FG_BF16: return launcher<__nv_bfloat16>::run(e, ctx, info, ws, ws_bytes, run);
    }
    return fg_fail(FG_ERR_DTYPE, "elementwise: dtype %d", (int)e->dtype);
}

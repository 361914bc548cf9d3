/*
 * linear_act.cu — the CUDA elementwise steps of linear + activation (the step list is in
 * core/internal.h; the driver and its cuBLASLt GEMMs are in ops/linear_act.c).
 *  FORWARD  y = act(pre): 16-byte vectors, grid-stride, in place allowed (only for the
 *           activations cuBLASLt's epilogue does not do)
 *  GRAD     g = dy ⊙ act′(pre), g may be pre itself: strips of 128 bytes of columns × slabs of
 *           rows (the geometry from the shape alone), four rows in flight per thread, db's
 *           column sums in registers, added over the block's rows in order, then over the
 *           slabs in order by slab_colsum (no atomics: deterministic)
 *  Both passes apply a dropout when the call carries one (dropout.cuh's mask: y = m ⊙ act(pre),
 *  the slope form's saved s = m ⊙ act′(pre) too, g = (m ⊙ dy) ⊙ act′(pre), each product rounded
 *  as the separate dropout step rounds it), which
 *  saves that step's own pass over the tensor: its Philox draws then overlap the pass's loads.
 * The activation math (f32) is act_math.cuh's. For K ≤ 128 in f16/bf16 the driver runs the
 * fused product + activation tiles of linear_act_tile.cu instead of GEMM + pass; for wide
 * layers on sm_90a the three products are linear_act_gemm.cu's GEMM (the forward's with the
 * activation in its epilogue).
 */
#include "cuda_internal.h"
#include "act_math.cuh"
#include "dropout.cuh"
#include "elem.cuh"
#include "sums.cuh"

constexpr int THREADS = 256;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Each thread takes FWD_UNROLL vectors a block-width apart per round, loads first. Plain
 * loads: y may be pre itself. SLOPE (the slope form): pre = act′(pre) in place as well. */
constexpr int FWD_UNROLL = 4;

/* DROP: o = m ⊙ o for the VEC elements from flat index i0 (o already rounded to T, as the
 * dropout step reads y; the product rounded to T again). */
template <typename T, int VEC, bool DROP>
__device__ __forceinline__ void drop_vec(const drop_t &d, int64_t i0, vec_t<T, VEC> &o) {
    if constexpr (DROP) {
        float m[VEC];
        drop_mask<VEC>(d, i0, m);
#pragma unroll
        for (int k = 0; k < VEC; k++) o.v[k] = from_acc<T>(__fmul_rn(to_acc(o.v[k]), m[k]));
    }
}

/* SLOPE: pre's VEC elements at `at` become act′(pre) rounded to T (DROP: then masked as y is,
 * the bits of the dropout step over the saved slope) */
template <typename T, int VEC, int ACT, bool SLOPE, bool DROP>
__device__ __forceinline__ void slope_vec(T *pre, int64_t at, const vec_t<T, VEC> &a, const drop_t &d) {
    if constexpr (SLOPE) {
        vec_t<T, VEC> o;
#pragma unroll
        for (int k = 0; k < VEC; k++) o.v[k] = from_acc<T>(act_slope(ACT, to_acc(a.v[k])));
        drop_vec<T, VEC, DROP>(d, at, o);
        store_vec<T, VEC>(pre + at, o);
    }
}

template <typename T, int VEC, int ACT, bool SLOPE, bool DROP>
__global__ void __launch_bounds__(THREADS) act_forward_kernel(T *pre, T *y, int64_t n, const drop_t drop) {
    constexpr int act = ACT;
    const int64_t nvec = n / VEC, stride = (int64_t)gridDim.x * THREADS * FWD_UNROLL;
    int64_t v = blockIdx.x * (int64_t)THREADS * FWD_UNROLL + threadIdx.x;
    for (; v + (FWD_UNROLL - 1) * THREADS < nvec; v += stride) {
        vec_t<T, VEC> a[FWD_UNROLL];
#pragma unroll
        for (int u = 0; u < FWD_UNROLL; u++) a[u] = *reinterpret_cast<const vec_t<T, VEC> *>(pre + (v + u * THREADS) * VEC);
#pragma unroll
        for (int u = 0; u < FWD_UNROLL; u++) {
            vec_t<T, VEC> o;
            if constexpr (VEC % 2 == 0) {
#pragma unroll
                for (int k = 0; k < VEC; k += 2)
                    from_acc2<T>(act_value(act, to_acc(a[u].v[k])), act_value(act, to_acc(a[u].v[k + 1])), &o.v[k]);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++) o.v[k] = from_acc<T>(act_value(act, to_acc(a[u].v[k])));
            }
            drop_vec<T, VEC, DROP>(drop, (v + u * THREADS) * VEC, o);
            store_vec<T, VEC>(y + (v + u * THREADS) * VEC, o);
            slope_vec<T, VEC, ACT, SLOPE, DROP>(pre, (v + u * THREADS) * VEC, a[u], drop);
        }
    }
    for (; v < nvec; v += THREADS) { /* the last round: what is left, a block-width at a time */
        vec_t<T, VEC> a = *reinterpret_cast<const vec_t<T, VEC> *>(pre + v * VEC), o;
#pragma unroll
        for (int k = 0; k < VEC; k++) o.v[k] = from_acc<T>(act_value(act, to_acc(a.v[k])));
        drop_vec<T, VEC, DROP>(drop, v * VEC, o);
        store_vec<T, VEC>(y + v * VEC, o);
        slope_vec<T, VEC, ACT, SLOPE, DROP>(pre, v * VEC, a, drop);
    }
    for (int64_t i = nvec * VEC + blockIdx.x * (int64_t)THREADS + threadIdx.x; i < n; i += stride) {
        const float p = to_acc(pre[i]);
        vec_t<T, 1> o;
        o.v[0] = from_acc<T>(act_value(act, p));
        drop_vec<T, 1, DROP>(drop, i, o);
        y[i] = o.v[0];
        if constexpr (SLOPE) {
            vec_t<T, 1> sl;
            sl.v[0] = from_acc<T>(act_slope(act, p));
            drop_vec<T, 1, DROP>(drop, i, sl);
            pre[i] = sl.v[0];
        }
    }
}

/* GRAD geometry, from the shape alone (so the order of db's sums never depends on the data's
 * alignment or the GPU): a block covers a strip of cg ≤ 256 16-byte lanes (up to 4 KiB of a
 * row) and THREADS / cg rows side by side; the rows split into slabs until about
 * GRAD_BLOCKS blocks run. One slab: the block finishes db's sums itself; more: one partial
 * per slab, added in slab order by slab_colsum. Wide strips: many blocks walking narrow
 * columns of the same rows lose DRAM locality (128-byte strips take about twice as long). */
constexpr int GRAD_LANES = 256;
constexpr int64_t GRAD_BLOCKS = 1024;
constexpr int UNROLL = 4; /* rows in flight per thread */

struct grad_geom {
    int cg;
    int64_t strips, slabs, slab;
};

static grad_geom grad_geometry(int64_t rows_in, int64_t cols, int vec) {
    grad_geom q;
    const int64_t rows = rows_in > 0 ? rows_in : 1; /* (no rows: one empty slab) */
    const int64_t groups = cdiv(cols > 0 ? cols : 1, vec);
    q.cg = (int)(groups < GRAD_LANES ? groups : GRAD_LANES);
    q.strips = cdiv(groups, q.cg);
    const int64_t rpar = THREADS / q.cg;
    int64_t slabs = cdiv(GRAD_BLOCKS, q.strips);
    const int64_t most = cdiv(rows, rpar * UNROLL * 4); /* ≥ 4 unrolled steps a thread */
    if (slabs > most) slabs = most;
    if (slabs < 1) slabs = 1;
    q.slab = cdiv(rows, slabs);
    q.slabs = cdiv(rows, q.slab);
    return q;
}

/* VEC columns from c0 of one row: one 16-byte load (FULL: the row holds them all and is
 * aligned), else element by element with zeros past the last column. Plain loads (no
 * read-only path): g may overwrite pre in place. */
template <typename T, int VEC, bool FULL>
__device__ __forceinline__ vec_t<T, VEC> load_cols(const T *row, int64_t c0, int64_t cols) {
    vec_t<T, VEC> r;
    if (FULL) {
        *reinterpret_cast<uint4 *>(&r) = *reinterpret_cast<const uint4 *>(row + c0);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) r.v[k] = c0 + k < cols ? row[c0 + k] : T(0.f);
    }
    return r;
}

/* g's VEC elements of one row at flat index `at` (columns c0 …): dy ⊙ act′(pre), with DROP
 * (m ⊙ dy) rounded to T first, as the dropout step's output would be. */
template <typename T, int VEC, bool FULL, int ACT, bool DROP>
__device__ __forceinline__ void grad_row(T *g, int64_t at, int64_t c0, int64_t cols, float *sum,
                                         vec_t<T, VEC> a0, const vec_t<T, VEC> &p0, const drop_t &drop) {
    drop_vec<T, VEC, DROP>(drop, at, a0);
    vec_t<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; k += 2) { /* (VEC is 16 / sizeof(T): even) */
        const float v0 = to_acc(a0.v[k]) * act_slope(ACT, to_acc(p0.v[k]));
        const float v1 = to_acc(a0.v[k + 1]) * act_slope(ACT, to_acc(p0.v[k + 1]));
        if (FULL || c0 + k < cols) sum[k] += v0;
        if (FULL || c0 + k + 1 < cols) sum[k + 1] += v1;
        from_acc2<T>(v0, v1, &o.v[k]);
    }
    if (!g) return;
    if (FULL) store_vec<T, VEC>(g + at, o);
    else
        for (int k = 0; k < VEC; k++)
            if (c0 + k < cols) g[at + k] = o.v[k];
}

/* g = dy ⊙ act′(pre) (g may be pre itself, or NULL when only db is wanted), with the columns'
 * sums of g: per thread over its rows, then over the block's rows in row order through
 * shared memory, then one partial per slab (or, with one slab, db itself). FULL: every
 * row is 16-byte aligned and holds whole vectors (four rows in flight); else element by
 * element, a row at a time. */
template <typename T, int ACT, bool FULL, bool DROP>
__global__ void __launch_bounds__(THREADS) act_grad_kernel(const T *dy, const T *pre, T *g, int64_t rows,
                                                           int64_t cols, int64_t slab, int cg, float *part,
                                                           float *db, bool first, const drop_t drop) {
    constexpr int VEC = 16 / sizeof(T), U = FULL ? UNROLL : 1;
    const int lane = threadIdx.x % cg, rpar = THREADS / cg, r = threadIdx.x / cg;
    const int64_t c0 = ((int64_t)blockIdx.x * cg + lane) * VEC;
    const int64_t i0 = (int64_t)blockIdx.y * slab, i1 = i0 + slab < rows ? i0 + slab : rows;
    float sum[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) sum[k] = 0.f;
    if (c0 < cols && r < rpar) {
        int64_t i = i0 + r;
        for (; i + (U - 1) * (int64_t)rpar < i1; i += U * (int64_t)rpar) {
            vec_t<T, VEC> a[U], p[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t row = (i + u * (int64_t)rpar) * cols;
                a[u] = load_cols<T, VEC, FULL>(dy + row, c0, cols);
                p[u] = load_cols<T, VEC, FULL>(pre + row, c0, cols);
            }
#pragma unroll
            for (int u = 0; u < U; u++)
                grad_row<T, VEC, FULL, ACT, DROP>(g, (i + u * (int64_t)rpar) * cols + c0, c0, cols, sum, a[u], p[u],
                                                  drop);
        }
        for (; i < i1; i += rpar) {
            vec_t<T, VEC> a = load_cols<T, VEC, FULL>(dy + i * cols, c0, cols),
                          p = load_cols<T, VEC, FULL>(pre + i * cols, c0, cols);
            grad_row<T, VEC, FULL, ACT, DROP>(g, i * cols + c0, c0, cols, sum, a, p, drop);
        }
    }
    if (!part && !db) return;
    __shared__ float lanes[THREADS * VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) lanes[threadIdx.x * VEC + k] = sum[k];
    __syncthreads();
    if (r != 0 || c0 >= cols) return;
    for (int q = 1; q < rpar; q++)
#pragma unroll
        for (int k = 0; k < VEC; k++) sum[k] += lanes[(q * cg + lane) * VEC + k];
    for (int k = 0; k < VEC; k++) {
        if (c0 + k >= cols) break;
        if (part) part[(int64_t)blockIdx.y * cols + c0 + k] = sum[k];
        else db[c0 + k] = first ? sum[k] : db[c0 + k] + sum[k];
    }
}

extern "C" size_t fg_cuda_act_scratch(fg_dtype dtype, int64_t rows, int64_t cols) {
    const grad_geom q = grad_geometry(rows, cols, (int)(16 / fg_dtype_size(dtype)));
    const size_t pass = q.slabs > 1 ? (size_t)q.slabs * (size_t)cols * sizeof(float) : 0;
    const size_t tile = fg_cuda_act_tile_scratch(rows, cols); /* (the tile path or the pass: either) */
    return pass > tile ? pass : tile;
}

static bool aligned(const void *p) { return p == nullptr || (uintptr_t)p % 16 == 0; }

/* The passes, one kernel per activation (with_act, act_math.cuh, says why). */
template <typename T, int ACT> static cudaError_t forward_pass(const fg_act_call *c, cudaStream_t s) {
    constexpr int VEC = 16 / sizeof(T);
    const int64_t n = c->rows * c->cols;
    if (n == 0) return cudaSuccess;
    const int64_t per = (int64_t)THREADS * VEC * FWD_UNROLL;
    const unsigned blocks = (unsigned)(cdiv(n, per) < 65536 ? cdiv(n, per) : 65536);
    T *pre = (T *)c->pre, *y = (T *)c->y;
    const bool vec = aligned(c->pre) && aligned(c->y);
    const drop_t d = drop_of(c->drop);
    if (c->slope_out && d.on) {
        if (vec) act_forward_kernel<T, VEC, ACT, true, true><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
        else act_forward_kernel<T, 1, ACT, true, true><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
    } else if (c->slope_out) {
        if (vec) act_forward_kernel<T, VEC, ACT, true, false><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
        else act_forward_kernel<T, 1, ACT, true, false><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
    } else if (d.on) {
        if (vec) act_forward_kernel<T, VEC, ACT, false, true><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
        else act_forward_kernel<T, 1, ACT, false, true><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
    } else {
        if (vec) act_forward_kernel<T, VEC, ACT, false, false><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
        else act_forward_kernel<T, 1, ACT, false, false><<<blocks, THREADS, 0, s>>>(pre, y, n, d);
    }
    return cudaGetLastError();
}

template <typename T, int ACT> static cudaError_t grad_pass(const fg_act_call *c, cudaStream_t s) {
    constexpr int VEC = 16 / sizeof(T);
    const int64_t n = c->rows * c->cols;
    if (c->db_acc && n == 0) /* no rows: db's sums are zero */
        return c->first ? cudaMemsetAsync(c->db_acc, 0, (size_t)c->cols * sizeof(float), s) : cudaSuccess;
    if (n == 0) return cudaSuccess;
    const grad_geom q = grad_geometry(c->rows, c->cols, VEC);
    float *part = c->db_acc && q.slabs > 1 ? (float *)c->scratch : nullptr;
    if (part && c->scratch_bytes < (size_t)q.slabs * (size_t)c->cols * sizeof(float))
        return cudaErrorInvalidValue;
    const bool vec = aligned(c->dy) && aligned(c->pre) && aligned(c->g) && (c->cols * (int64_t)sizeof(T)) % 16 == 0;
    dim3 grid((unsigned)q.strips, (unsigned)q.slabs);
    float *db = part ? nullptr : (float *)c->db_acc;
    const drop_t d = drop_of(c->drop);
    const T *dy = (const T *)c->dy, *pre = (const T *)c->pre;
    T *g = (T *)c->g;
    if (vec && d.on)
        act_grad_kernel<T, ACT, true, true><<<grid, THREADS, 0, s>>>(dy, pre, g, c->rows, c->cols, q.slab, q.cg, part,
                                                                     db, c->first, d);
    else if (vec)
        act_grad_kernel<T, ACT, true, false><<<grid, THREADS, 0, s>>>(dy, pre, g, c->rows, c->cols, q.slab, q.cg, part,
                                                                      db, c->first, d);
    else if (d.on)
        act_grad_kernel<T, ACT, false, true><<<grid, THREADS, 0, s>>>(dy, pre, g, c->rows, c->cols, q.slab, q.cg,
                                                                      part, db, c->first, d);
    else
        act_grad_kernel<T, ACT, false, false><<<grid, THREADS, 0, s>>>(dy, pre, g, c->rows, c->cols, q.slab, q.cg,
                                                                       part, db, c->first, d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && part) e = slab_colsum(part, q.slabs, c->cols, (float *)c->db_acc, c->first, s);
    return e;
}

template <typename T> static cudaError_t run_step(const fg_act_call *c, cudaStream_t s) {
    if (c->step == FG_ACT_STEP_FORWARD)
        return with_act(c->act, [&](auto act) { return forward_pass<T, decltype(act)::value>(c, s); });
    if (c->step == FG_ACT_STEP_GRAD)
        return with_grad_act(c->act, [&](auto act) { return grad_pass<T, decltype(act)::value>(c, s); });
    /* CAST */
    if (c->cols == 0) return cudaSuccess;
    const unsigned blocks = (unsigned)(cdiv(c->cols, 256) < 65536 ? cdiv(c->cols, 256) : 65536);
    cast_sum_kernel<T><<<blocks, 256, 0, s>>>((const float *)c->src, (T *)c->dst, c->cols,
                                              c->parts > 1 ? c->parts : 1, c->accumulate);
    return cudaGetLastError();
}

extern "C" fg_status fg_cuda_act(fg_context *ctx, const fg_act_call *c) {
    if (c->step == FG_ACT_STEP_TILE_FORWARD || c->step == FG_ACT_STEP_TILE_GRAD) return fg_cuda_act_tile(ctx, c);
    if (c->step == FG_ACT_STEP_TILE_BACKWARD) return fg_cuda_act_bwd_tile(ctx, c);
    if (c->step == FG_ACT_STEP_TILE_BACKWARD90) return fg_cuda_act_bwd90(ctx, c);
    if (c->step == FG_ACT_STEP_GEMM_FORWARD || c->step == FG_ACT_STEP_GEMM_INPUT || c->step == FG_ACT_STEP_GEMM_WEIGHT ||
        c->step == FG_ACT_STEP_GEMM_INPUT_FORM)
        return fg_cuda_act_gemm(ctx, c);
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    if (c->ld_pre != c->cols && c->step != FG_ACT_STEP_CAST)
        return fg_fail(FG_ERR_INTERNAL, "cuda linear_act: a strided block");
    cudaError_t e;
    switch (c->dtype) {
    case FG_F32: e = run_step<float>(c, s); break;
    case FG_F16: e = run_step<__half>(c, s); break;
    case FG_BF16: e = run_step<__nv_bfloat16>(c, s); break;
    default: return fg_fail(FG_ERR_UNSUPPORTED, "cuda linear_act: %s runs on the CPU backend only", fg_dtype_name(c->dtype));
    }
    return e == cudaSuccess ? FG_OK : fg_cuda_fail(e, "linear_act");
}

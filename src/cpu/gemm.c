/*
 * gemm.c — the CPU backend's GEMM primitive, the reference every other backend is
 * tested against. f32/f64 products go to OpenBLAS (sgemm/dgemm, sgemv/dgemv) with the
 * caller's beta (OpenBLAS writes c without reading it when beta is 0), a bias written into
 * c before the product (beta·c + bias, then the product added: no pass after it);
 * f16/bf16 operands are widened to f32 in the workspace in the orientation they are
 * stored in (a transposed operand stays transposed for sgemm), multiplied by sgemm and
 * rounded once. Vector products with a vector of ones (bias gradients) and low-precision
 * GEMVs are loops with f64 accumulation in a fixed order (eight interleaved partial sums
 * where a dot product runs along contiguous memory): results are deterministic whatever
 * the thread count. Short (k <= 32) and narrow (n <= 16) f32 products of many rows, and long
 * (k >= 4096) products of few outputs, run own kernels instead (smallk, narrow, longk below); the short
 * product applies linear + activation's gelu / gelu_tanh in its store on AVX-512 where the CPU has it
 * (act_z.h), and then the epilogue's dropout (the keep bits of philox_z.h: fg_dropout_forward's mask
 * and multiply, so y has the bits of the product followed by the dropout op). Threads follow src/cpu/cpu.h: OpenBLAS's for the products (the
 * context's count when it sets one), OpenMP teams for the loops, never both at once.
 */
#include "cpu.h"
#include "act_z.h"
#include "philox_z.h"
#include "vec.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

_Thread_local int fg_cpu_pool_live;
_Thread_local int fg_cpu_blas_live;

/* fastgrad threads inside an OpenBLAS call; −1 while one of them releases OpenBLAS's workers
   (src/cpu/cpu.h says why): the release waits for no one and is skipped when busy. */
static int blas_users;

int blas_thread_shutdown_(void) __attribute__((weak)); /* OpenBLAS's (pthreads builds) */

void fg_cpu_blas_quiet(void) {
    fg_cpu_blas_live = 0;
    if (!blas_thread_shutdown_ || openblas_get_parallel() != 1) return;
    int idle = 0;
    if (!__atomic_compare_exchange_n(&blas_users, &idle, -1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
    blas_thread_shutdown_();
    __atomic_store_n(&blas_users, 0, __ATOMIC_RELEASE);
}

void fg_cpu_blas_enter(void) {
    int v = __atomic_load_n(&blas_users, __ATOMIC_RELAXED);
    for (;;) {
        if (v < 0) { /* a release in progress: it is short */
            sched_yield();
            v = __atomic_load_n(&blas_users, __ATOMIC_RELAXED);
            continue;
        }
        if (__atomic_compare_exchange_n(&blas_users, &v, v + 1, true, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
    }
}

void fg_cpu_blas_leave(void) { __atomic_sub_fetch(&blas_users, 1, __ATOMIC_RELEASE); }

/* c = alpha·acc + beta·c + bias[j·bias_inc], never reading c when beta == 0 (it may
 * hold NaN). */
static inline double epilogue(const fg_gemm *g, double acc, const void *c, int64_t ci, int64_t j,
                              int64_t bias_inc) {
    double v = g->alpha * acc;
    if (g->beta != 0.0) v += g->beta * fg_load_f64(c, g->c_f32 ? FG_F32 : g->dtype, ci);
    if (g->bias) v += fg_load_f64(g->bias, g->dtype, j * bias_inc);
    return v;
}

/* Vector results: out[j] = Σ_p v[p]·M(p, j), for j < len, p < depth, where M(p, j) sits
 * at m[p·mp + j·mj] and v[p] at v[p·vs] (v NULL: ones). */
typedef struct vecprod {
    const void *m, *v;
    int64_t mp, mj, vs, len, depth;
    void *out;
    int64_t os, bias_inc;
} vecprod;

enum { VP_BLOCK = 256, VP_LANES = 8 };

/* Outputs [j0, j0 + jn) of a product whose rows of M are contiguous-ish: acc[j] += v[q]·M(q, j),
   q in order. t a constant at the call. */
FG_INLINE void vp_rows_typed(const vecprod *p, fg_dtype t, int64_t j0, int64_t jn, double *acc) {
    for (int64_t j = 0; j < jn; j++) acc[j] = 0.0;
    for (int64_t q = 0; q < p->depth; q++) {
        const double vq = p->v ? fg_v_ldd(p->v, t, q * p->vs) : 1.0;
        const int64_t base = q * p->mp + j0 * p->mj;
        if (p->mj == 1) {
            for (int64_t j = 0; j < jn; j++) acc[j] += vq * fg_v_ldd(p->m, t, base + j);
        } else {
            for (int64_t j = 0; j < jn; j++) acc[j] += vq * fg_v_ldd(p->m, t, base + j * p->mj);
        }
    }
}

/* One dot product along q (M(q, j) at stride mp): VP_LANES partial sums, lane q % VP_LANES,
   added in lane order at the end. */
FG_INLINE double vp_dot_typed(const vecprod *p, fg_dtype t, int64_t j) {
    double lane[VP_LANES] = {0};
    const int64_t base = j * p->mj, d = p->depth;
    int64_t q = 0;
    if (p->mp == 1 && (!p->v || p->vs == 1)) {
        for (; q + VP_LANES <= d; q += VP_LANES)
            for (int l = 0; l < VP_LANES; l++)
                lane[l] += (p->v ? fg_v_ldd(p->v, t, q + l) : 1.0) * fg_v_ldd(p->m, t, base + q + l);
    }
    for (; q < d; q++)
        lane[q % VP_LANES] += (p->v ? fg_v_ldd(p->v, t, q * p->vs) : 1.0) * fg_v_ldd(p->m, t, base + q * p->mp);
    double s = 0.0;
    for (int l = 0; l < VP_LANES; l++) s += lane[l];
    return s;
}

FG_CPU_CLONES
static void vp_rows(const vecprod *p, fg_dtype t, int64_t j0, int64_t jn, double *acc) {
    switch (t) {
    case FG_F16: vp_rows_typed(p, FG_F16, j0, jn, acc); break;
    case FG_BF16: vp_rows_typed(p, FG_BF16, j0, jn, acc); break;
    case FG_F64: vp_rows_typed(p, FG_F64, j0, jn, acc); break;
    default: vp_rows_typed(p, FG_F32, j0, jn, acc); break;
    }
}

FG_CPU_CLONES
static double vp_dot(const vecprod *p, fg_dtype t, int64_t j) {
    switch (t) {
    case FG_F16: return vp_dot_typed(p, FG_F16, j);
    case FG_BF16: return vp_dot_typed(p, FG_BF16, j);
    case FG_F64: return vp_dot_typed(p, FG_F64, j);
    default: return vp_dot_typed(p, FG_F32, j);
    }
}

#ifdef FG_Z
/* Column sums of a narrow M (v ones, len <= 64 contiguous outputs: the bias gradients of narrow
   layers, Σ over many rows of dy) on AVX-512: vp_rows' sums — f64, row by row in order, each the
   same add — with the len sums in registers instead of an array the loop stores and reloads every
   row, on the calling thread (vp_rows gave one block of outputs to one thread anyway). f32 / bf16. */
static bool z_colsum_takes(const fg_gemm *g, const vecprod *p) {
    return !p->v && p->mj == 1 && p->mp != 1 && p->len <= 64 && (g->dtype == FG_F32 || g->dtype == FG_BF16) &&
           fg_z_usable();
}

FG_Z_INLINE void z_colsum_t(const vecprod *p, fg_dtype t, const int nv, double *acc) {
    __m512d lo[4], hi[4];
    for (int v = 0; v < nv; v++) lo[v] = hi[v] = _mm512_setzero_pd();
    for (int64_t q = 0; q < p->depth; q++)
        for (int v = 0; v < nv; v++) {
            const __m512 x = fg_z_ld(p->m, t, q * p->mp + 16 * v, fg_z_lanes(p->len - 16 * v));
            lo[v] = _mm512_add_pd(lo[v], _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
            hi[v] = _mm512_add_pd(hi[v], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
        }
    for (int v = 0; v < nv; v++) {
        const __mmask16 k = fg_z_lanes(p->len - 16 * v);
        _mm512_mask_storeu_pd(acc + 16 * v, (__mmask8)k, lo[v]);
        _mm512_mask_storeu_pd(acc + 16 * v + 8, (__mmask8)(k >> 8), hi[v]);
    }
}

FG_Z_KERNEL static void z_colsum(const vecprod *p, fg_dtype t, double *acc) {
    const int nv = (int)((p->len + 15) / 16);
#define CALL(tt)                                                                                                      \
    do {                                                                                                              \
        if (nv == 1) z_colsum_t(p, tt, 1, acc);                                                                        \
        else if (nv == 2) z_colsum_t(p, tt, 2, acc);                                                                   \
        else if (nv == 3) z_colsum_t(p, tt, 3, acc);                                                                   \
        else z_colsum_t(p, tt, 4, acc);                                                                                \
    } while (0)
    if (t == FG_BF16) CALL(FG_BF16);
    else CALL(FG_F32);
#undef CALL
}
#endif

static void vec_product(const fg_context *ctx, const fg_gemm *g, const vecprod *p) {
    const fg_dtype t = g->dtype, ct = g->c_f32 ? FG_F32 : t;
    if (p->mp == 1 || p->len == 1) {
        /* each output reads a contiguous run of M: a dot product per output */
        const int team = fg_cpu_team(ctx, p->len * p->depth, 1 << 16);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
        for (int64_t j = 0; j < p->len; j++)
            fg_store_f64(p->out, ct, j * p->os, epilogue(g, vp_dot(p, t, j), p->out, j * p->os, j, p->bias_inc));
        return;
    }
#ifdef FG_Z
    if (z_colsum_takes(g, p)) {
        double acc[64];
        z_colsum(p, t, acc);
        for (int64_t j = 0; j < p->len; j++)
            fg_store_f64(p->out, ct, j * p->os, epilogue(g, acc[j], p->out, j * p->os, j, p->bias_inc));
        return;
    }
#endif
    /* rows of M are contiguous: walk them in order, a block of outputs per thread */
    const int64_t nblocks = (p->len + VP_BLOCK - 1) / VP_BLOCK;
    const int team = fg_cpu_team(ctx, p->len * p->depth, 1 << 16);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        double acc[VP_BLOCK];
        const int64_t j0 = blk * VP_BLOCK, jn = p->len - j0 < VP_BLOCK ? p->len - j0 : VP_BLOCK;
        vp_rows(p, t, j0, jn, acc);
        for (int64_t j = 0; j < jn; j++) {
            int64_t jj = j0 + j;
            fg_store_f64(p->out, ct, jj * p->os, epilogue(g, acc[j], p->out, jj * p->os, jj, p->bias_inc));
        }
    }
}

/* Single products with a vector operand (batch 1, m == 1 or n == 1). */
static void gemv(const fg_context *ctx, const fg_gemm *g) {
    vecprod p;
    if (g->m == 1) { /* c[1×n] = a[1×k] · b[k×n] */
        p = (vecprod){g->b.data, g->a.data, g->b.rs, g->b.cs, g->a.cs, g->n, g->k, g->c.data, g->c.cs, g->bias_cs};
    } else {         /* c[m×1] = a[m×k] · b[k×1] */
        p = (vecprod){g->a.data, g->b.data, g->a.cs, g->a.rs, g->b.rs, g->m, g->k, g->c.data, g->c.rs, g->bias_rs};
    }
    vec_product(ctx, g, &p);
}

static bool blas_gemv(const fg_context *ctx, const fg_gemm *g) {
    if (g->dtype != FG_F32 && g->dtype != FG_F64) return false;
    if (g->a.operand == FG_OPERAND_ONES || g->b.operand == FG_OPERAND_ONES || g->bias) return false;
    /* c[m×1] = a·b with a row- or column-major; m == 1 is the transposed problem */
    const fg_mat *mat = g->m == 1 ? &g->b : &g->a;
    const fg_mat *vec = g->m == 1 ? &g->a : &g->b;
    int64_t rows = g->m == 1 ? g->n : g->m; /* of the matrix as used: rows × k */
    int64_t vinc = g->m == 1 ? vec->cs : vec->rs, oinc = g->m == 1 ? g->c.cs : g->c.rs;
    /* element (i, p) of the used matrix lives at i·si + p·sp */
    int64_t si = g->m == 1 ? mat->cs : mat->rs, sp = g->m == 1 ? mat->rs : mat->cs;
    enum CBLAS_TRANSPOSE tr;
    int64_t ld, r, c;
    if (sp == 1 || g->k == 1) { tr = CblasNoTrans; ld = si; r = rows; c = g->k; }
    else { tr = CblasTrans; ld = sp; r = g->k; c = rows; }
    if (ld < (c > 1 ? c : 1) || ld > INT32_MAX || vinc > INT32_MAX || oinc > INT32_MAX) return false;
    double beta = g->beta;
    if (beta == 0.0) { /* BLAS may scale y by 0, which keeps a NaN: clear y instead */
        for (int64_t i = 0; i < rows; i++) fg_store_f64(g->c.data, g->dtype, i * oinc, 0.0);
        beta = 1.0;
    }
    const fg_blas_scope scope = fg_cpu_blas_begin(ctx, (double)rows * (double)g->k);
    if (g->dtype == FG_F32)
        cblas_sgemv(CblasRowMajor, tr, (blasint)r, (blasint)c, (float)g->alpha, mat->data, (blasint)ld,
                    vec->data, (blasint)vinc, (float)beta, g->c.data, (blasint)oinc);
    else
        cblas_dgemv(CblasRowMajor, tr, (blasint)r, (blasint)c, g->alpha, mat->data, (blasint)ld,
                    vec->data, (blasint)vinc, beta, g->c.data, (blasint)oinc);
    fg_cpu_blas_end(scope);
    return true;
}

/* A row-major-or-transposed operand as BLAS sees it. */
static void blas_op(const fg_mat *x, int64_t rows, int64_t cols, enum CBLAS_TRANSPOSE *tr, int64_t *ld) {
    if (x->cs == 1 || cols == 1) { *tr = CblasNoTrans; *ld = x->rs > cols ? x->rs : cols; }
    else { *tr = CblasTrans; *ld = x->cs > rows ? x->cs : rows; }
    if (rows == 1 && *tr == CblasNoTrans) *ld = cols > 0 ? cols : 1;
}

/* dst[i·ld + j] = src[i·rs + j·cs] as f32, rows [r0, r1) of a rows × cols block; t a constant. */
FG_INLINE void widen_typed(const void *src, fg_dtype t, int64_t rs, int64_t cs, int64_t r0, int64_t r1, int64_t cols,
                           float *dst) {
    for (int64_t i = r0; i < r1; i++) {
        float *d = dst + i * cols;
        if (cs == 1) {
            for (int64_t j = 0; j < cols; j++) d[j] = fg_v_ld(src, t, i * rs + j);
        } else {
            for (int64_t j = 0; j < cols; j++) d[j] = fg_v_ld(src, t, i * rs + j * cs);
        }
    }
}

FG_CPU_CLONES
static void widen_rows(const void *src, fg_dtype t, int64_t rs, int64_t cs, int64_t r0, int64_t r1, int64_t cols,
                       float *dst) {
    if (t == FG_BF16) widen_typed(src, FG_BF16, rs, cs, r0, r1, cols, dst);
    else widen_typed(src, FG_F16, rs, cs, r0, r1, cols, dst);
}

/* Packs batch element b of f16/bf16 operand x (rows × cols) into contiguous f32 in the
   orientation it is stored in: row-major unless its columns are the contiguous dim, then
   transposed (*tr). */
static void widen(const fg_context *ctx, const fg_mat *x, fg_dtype t, int64_t b, int64_t rows, int64_t cols,
                  float *dst, enum CBLAS_TRANSPOSE *tr, int64_t *ld) {
    const char *src = (const char *)x->data + b * x->bs * (int64_t)fg_dtype_size(t);
    int64_t rs = x->rs, cs = x->cs, pr = rows, pc = cols;
    *tr = CblasNoTrans;
    if (!(cs == 1 || cols == 1) && (rs == 1 || rows == 1)) { /* column-major: pack xᵀ */
        *tr = CblasTrans;
        rs = x->cs, cs = x->rs, pr = cols, pc = rows;
    }
    *ld = pc > 0 ? pc : 1;
    const int team = fg_cpu_team(ctx, pr * pc, 1 << 20); /* see over_rows */
    if (team == 1) {
        widen_rows(src, t, rs, cs, 0, pr, pc, dst);
        return;
    }
#pragma omp parallel num_threads(team)
    {
        int64_t lo, hi;
        fg_cpu_share(pr, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
        widen_rows(src, t, rs, cs, lo, hi, pc, dst);
    }
}

/* Rows [r0, r1) of c (ct) = beta·c + bias, or of the f32 buffer cf (ldf) from c's values when
   cf is not NULL; beta 0 never reads c. t the inputs' dtype (the bias's). */
FG_INLINE void prefill_typed(const fg_gemm *g, fg_dtype t, fg_dtype ct, void *c, float *cf, int64_t r0, int64_t r1) {
    const int64_t n = g->n;
    const double beta = g->beta;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t ci = i * g->c.rs;
        for (int64_t j = 0; j < n; j++) {
            double v = beta != 0.0 ? beta * fg_v_ldd(c, ct, ci + j) : 0.0;
            if (g->bias) v += fg_v_ldd(g->bias, t, i * g->bias_rs + j * g->bias_cs);
            if (cf) cf[i * n + j] = (float)v;
            else fg_v_std(c, ct, ci + j, v);
        }
    }
}

FG_CPU_CLONES
static void prefill_rows(const fg_gemm *g, void *c, float *cf, int64_t r0, int64_t r1) {
    const fg_dtype t = g->dtype, ct = g->c_f32 ? FG_F32 : t;
    switch (t) {
    case FG_F32: prefill_typed(g, FG_F32, FG_F32, c, cf, r0, r1); break;
    case FG_F64: prefill_typed(g, FG_F64, FG_F64, c, cf, r0, r1); break;
    case FG_BF16:
        if (ct == FG_F32) prefill_typed(g, FG_BF16, FG_F32, c, cf, r0, r1);
        else prefill_typed(g, FG_BF16, FG_BF16, c, cf, r0, r1);
        break;
    default:
        if (ct == FG_F32) prefill_typed(g, FG_F16, FG_F32, c, cf, r0, r1);
        else prefill_typed(g, FG_F16, FG_F16, c, cf, r0, r1);
        break;
    }
}

/* Rows [r0, r1) of c (ct) from the f32 buffer cf. */
FG_INLINE void narrow_typed(const fg_gemm *g, fg_dtype ct, void *c, const float *cf, int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = 0; j < g->n; j++) fg_v_st(c, ct, i * g->c.rs + j, cf[i * g->n + j]);
}

FG_CPU_CLONES
static void narrow_rows(const fg_gemm *g, void *c, const float *cf, int64_t r0, int64_t r1) {
    const fg_dtype ct = g->c_f32 ? FG_F32 : g->dtype;
    if (ct == FG_BF16) narrow_typed(g, FG_BF16, c, cf, r0, r1);
    else if (ct == FG_F16) narrow_typed(g, FG_F16, c, cf, r0, r1);
    else narrow_typed(g, FG_F32, c, cf, r0, r1);
}

/* Runs rows(g, c, cf, r0, r1) over the m rows, on a team when there are many elements. */
static void over_rows(const fg_context *ctx, const fg_gemm *g, void *c, float *cf,
                      void (*rows)(const fg_gemm *, void *, float *, int64_t, int64_t)) {
    /* a light pass (a write, or one conversion per element) beside a product: threads only
       when it is large enough to pay for a change of pool (cpu.h) */
    const int team = fg_cpu_team(ctx, g->m * g->n, 1 << 21);
    if (team == 1) {
        rows(g, c, cf, 0, g->m);
        return;
    }
#pragma omp parallel num_threads(team)
    {
        int64_t lo, hi;
        fg_cpu_share(g->m, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
        rows(g, c, cf, lo, hi);
    }
}

static void narrow_rows_any(const fg_gemm *g, void *c, float *cf, int64_t r0, int64_t r1) {
    narrow_rows(g, c, cf, r0, r1);
}

/* Short products (f32, k <= SMALLK_K, many rows): OpenBLAS runs a 37632 × 16 · 16 × 128 product at
   ≈ 15 GFLOP/s (its packing is sized for long k); here b is packed once as [k][n] f32 (L1-sized),
   and each row of c is its k row-times-b steps in order, 64 columns at a time in registers, so the
   pass is bound by writing c. The sums run over p in order in f32, one thread a row: the result does
   not depend on the thread count. c = alpha·a·b + (beta·c + bias) in f32. */
enum { SMALLK_K = 32, SMALLK_J = 64 };

bool fg_cpu_smallk_fits(fg_dtype t, int64_t m, int64_t n, int64_t k) {
    return t == FG_F32 && k > 0 && k <= SMALLK_K && n >= 8 && m >= 256 && n * k <= 16384 && m * n >= (1 << 16);
}

static bool smallk_takes(const fg_gemm *g) {
    return fg_cpu_smallk_fits(g->dtype, g->m, g->n, g->k) && !g->c_f32 && g->c.cs == 1 &&
           !(g->batch > 1 && g->c.bs == 0);
}

/* smallk applies fg_gemm.act (and writes epi.aux) in its store: an activation or a kept pre, no
   formed operand, one product (not a batch sum) */
bool fg_cpu_smallk_fuses(const fg_gemm *g) {
    return (g->act != FG_ACT_NONE || g->epi.has_aux) && g->act != FG_ACT_GIVEN_SLOPE && !g->epi.form &&
           !g->epi.col_sums;
}

typedef float smallk_v __attribute__((vector_size(64))); /* 16 floats: one AVX-512 register, two AVX2 */

/* c's row i, columns [j0, j0 + w): pre = beta·c + bias (f32), then alpha·acc added; with an
   activation fused (act >= 0: fg_gemm.act, a constant at the call) c = act(pre) and, where x (the
   epilogue's aux row) is given, pre or its slope (slope) there. */
FG_INLINE void smallk_store(const fg_gemm *g, float *ci, float *xi, int act, bool slope, int64_t i, int64_t j0,
                            int64_t w, const float *acc) {
    const float alpha = (float)g->alpha, beta = (float)g->beta;
    const float *bias = g->bias;
    const bool bias_row = bias && g->bias_cs == 1;
    const float *br = bias_row ? bias + i * g->bias_rs + j0 : NULL;
    float *out = act < 0 ? ci + j0 : NULL, v[SMALLK_J];
    for (int64_t j = 0; j < w; j++) {
        float pre = beta != 0.0f ? beta * ci[j0 + j] : 0.0f;
        if (bias) pre += bias_row ? br[j] : bias[i * g->bias_rs + (j0 + j) * g->bias_cs];
        (out ? out : v)[j] = alpha * acc[j] + pre;
    }
    if (act < 0) return;
    float *y = ci + j0, *x = xi ? xi + j0 : NULL;
    if (x && slope) {
#pragma GCC ivdep
        for (int64_t j = 0; j < w; j++) y[j] = fg_v_act(act, v[j], &x[j]);
    } else if (x) {
#pragma GCC ivdep
        for (int64_t j = 0; j < w; j++) y[j] = fg_v_act(act, v[j], NULL), x[j] = v[j];
    } else {
#pragma GCC ivdep
        for (int64_t j = 0; j < w; j++) y[j] = fg_v_act(act, v[j], NULL);
    }
}

FG_INLINE void smallk_rows_t(const fg_gemm *g, const float *a, const float *bp, float *c, int64_t r0, int64_t r1,
                             int act) {
    const int64_t n = g->n, k = g->k, full = n / SMALLK_J * SMALLK_J;
    float *aux = act >= 0 && g->epi.has_aux ? g->epi.aux : NULL;
    const bool slope = g->epi.slope;
    for (int64_t i = r0; i < r1; i++) {
        float ai[SMALLK_K];
        for (int64_t p = 0; p < k; p++) ai[p] = a[i * g->a.rs + p * g->a.cs];
        float *ci = c + i * g->c.rs, *xi = aux ? aux + i * g->c.rs : NULL;
        for (int64_t j0 = 0; j0 < full; j0 += SMALLK_J) { /* 64 columns in four vector registers */
            smallk_v s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
            for (int64_t p = 0; p < k; p++) {
                const float *row = bp + p * n + j0;
                smallk_v b0, b1, b2, b3;
                memcpy(&b0, row, 64), memcpy(&b1, row + 16, 64), memcpy(&b2, row + 32, 64), memcpy(&b3, row + 48, 64);
                const float x = ai[p];
                s0 += x * b0, s1 += x * b1, s2 += x * b2, s3 += x * b3;
            }
            float acc[SMALLK_J];
            memcpy(acc, &s0, 64), memcpy(acc + 16, &s1, 64), memcpy(acc + 32, &s2, 64), memcpy(acc + 48, &s3, 64);
            smallk_store(g, ci, xi, act, slope, i, j0, SMALLK_J, acc);
        }
        int64_t j0 = full;
        for (; j0 + 16 <= n; j0 += 16) { /* then 16 columns a register */
            smallk_v s0 = {0};
            for (int64_t p = 0; p < k; p++) {
                smallk_v b0;
                memcpy(&b0, bp + p * n + j0, 64);
                s0 += ai[p] * b0;
            }
            float acc[16];
            memcpy(acc, &s0, 64);
            smallk_store(g, ci, xi, act, slope, i, j0, 16, acc);
        }
        if (j0 < n) { /* the last n mod 16 columns */
            float acc[16] = {0};
            const int64_t w = n - j0;
            for (int64_t p = 0; p < k; p++) {
                const float x = ai[p], *row = bp + p * n + j0;
                for (int64_t j = 0; j < w; j++) acc[j] += x * row[j];
            }
            smallk_store(g, ci, xi, act, slope, i, j0, w, acc);
        }
    }
}

#ifdef FG_Z
/* smallk_rows_t with gelu or gelu_tanh fused, on AVX-512 where the CPU has it (act_z.h: the cloned
   store's exp and division cost more than the product), for the common Linear: alpha 1, beta 0,
   the bias a row vector (or none). pre = acc + bias as smallk_store makes it (the same sums, in
   the same order); the last n mod 16 columns by lane masks. */
static bool z_smallk_takes(const fg_gemm *g) {
    return fg_cpu_smallk_fuses(g) && fg_z_has_act(g->act) && g->alpha == 1.0 && g->beta == 0.0 &&
           (!g->bias || g->bias_cs == 1) && fg_z_usable();
}

/* c's row ci (and aux row xi) at columns [j, j + 16) masked by km, from the row's sums acc */
FG_Z_INLINE void z_smallk_store(float *ci, float *xi, const float *br, int act, bool slope, int64_t j, __mmask16 km,
                                __m512 acc) {
    const __m512 pre = _mm512_add_ps(acc, br ? _mm512_maskz_loadu_ps(km, br + j) : _mm512_setzero_ps()); /* (−0 + 0 = 0) */
    __m512 s;
    _mm512_mask_storeu_ps(ci + j, km, fg_z_act(act, pre, xi && slope ? &s : NULL));
    if (xi) _mm512_mask_storeu_ps(xi + j, km, slope ? s : pre);
}

/* A row's sums ai · bp over columns [j0, j0 + 64) in four registers, and over [j0, j0 + 16)
   masked by km in one: the short-k product's inner loops, for the plain and the dropout stores */
FG_Z_INLINE void z_smallk_dot64(const float *bp, const float *ai, int64_t k, int64_t n, int64_t j0, __m512 *s0,
                                __m512 *s1, __m512 *s2, __m512 *s3) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t p = 0; p < k; p++) {
        const float *row = bp + p * n + j0;
        const __m512 x = _mm512_set1_ps(ai[p]);
        a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(row), a0), a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(row + 16), a1);
        a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(row + 32), a2), a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(row + 48), a3);
    }
    *s0 = a0, *s1 = a1, *s2 = a2, *s3 = a3;
}

FG_Z_INLINE __m512 z_smallk_dot16(const float *bp, const float *ai, int64_t k, int64_t n, int64_t j0, __mmask16 km) {
    __m512 s0 = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++) s0 = _mm512_fmadd_ps(_mm512_set1_ps(ai[p]), _mm512_maskz_loadu_ps(km, bp + p * n + j0), s0);
    return s0;
}

FG_Z_INLINE void z_smallk_rows_t(const fg_gemm *g, const float *a, const float *bp, float *c, int64_t r0, int64_t r1,
                                 int act) {
    const int64_t n = g->n, k = g->k, full = n / SMALLK_J * SMALLK_J;
    float *aux = g->epi.has_aux ? g->epi.aux : NULL;
    const bool slope = g->epi.slope;
    for (int64_t i = r0; i < r1; i++) {
        float ai[SMALLK_K];
        for (int64_t p = 0; p < k; p++) ai[p] = a[i * g->a.rs + p * g->a.cs];
        float *ci = c + i * g->c.rs, *xi = aux ? aux + i * g->c.rs : NULL;
        const float *br = g->bias ? (const float *)g->bias + i * g->bias_rs : NULL;
        for (int64_t j0 = 0; j0 < full; j0 += SMALLK_J) { /* 64 columns in four registers */
            __m512 s0, s1, s2, s3;
            z_smallk_dot64(bp, ai, k, n, j0, &s0, &s1, &s2, &s3);
            z_smallk_store(ci, xi, br, act, slope, j0, 0xffff, s0);
            z_smallk_store(ci, xi, br, act, slope, j0 + 16, 0xffff, s1);
            z_smallk_store(ci, xi, br, act, slope, j0 + 32, 0xffff, s2);
            z_smallk_store(ci, xi, br, act, slope, j0 + 48, 0xffff, s3);
        }
        for (int64_t j0 = full; j0 < n; j0 += 16) { /* then 16 columns a register, the last masked */
            const __mmask16 km = fg_z_lanes(n - j0);
            const __m512 s0 = z_smallk_dot16(bp, ai, k, n, j0, km);
            z_smallk_store(ci, xi, br, act, slope, j0, km, s0);
        }
    }
}

FG_Z_KERNEL static void z_smallk_rows(const fg_gemm *g, const float *a, const float *bp, float *c, int64_t r0,
                                      int64_t r1) {
    if (g->act == FG_ACT_GELU) z_smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_GELU);
    else z_smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_GELU_TANH);
}

#ifdef FG_HAVE_PHILOX_X16
/* The epilogue's dropout fused as well (0 < p < 1; p = 1 is left to the caller's dropout step):
   each row's keep bits made first (z_keep_bits over the row's flat indices, from the quad of its
   first element), then y = act(pre)·m and a kept slope s·m, m = keep ? scale : 0 — the dropout
   op's multiply (y·m in f32), so y and the slope have the bits of the unfused pair. */
#define Z_SMALLK_DROP_ISA FG_Z_ISA ",bmi2"
enum { SMALLK_KEEP_WORDS = 16384 / 64 + 2 }; /* a row's keep bits (n <= 16384) */

static bool z_smallk_drops(const fg_gemm *g) {
    const fg_dropout_gen *d = g->epi.drop;
    return d && d->on && d->threshold < (1u << 24) && g->n <= 16384 && z_smallk_takes(g) &&
           fg_philox_z_usable();
}

/* 16 keep bits from bit b of the row's words */
static inline __mmask16 keep16(const uint64_t *w, int64_t b) {
    const int64_t q = b >> 6, r = b & 63;
    uint64_t v = w[q] >> r;
    if (r > 48) v |= w[q + 1] << (64 - r);
    return (__mmask16)v;
}

static inline __attribute__((always_inline, target(Z_SMALLK_DROP_ISA))) void
z_smallk_drop_store(float *ci, float *xi, const float *br, int act, bool slope, int64_t j, __mmask16 km, __m512 acc,
                    __m512 m) {
    const __m512 pre = _mm512_add_ps(acc, br ? _mm512_maskz_loadu_ps(km, br + j) : _mm512_setzero_ps());
    __m512 s;
    _mm512_mask_storeu_ps(ci + j, km, _mm512_mul_ps(fg_z_act(act, pre, xi && slope ? &s : NULL), m));
    if (xi) _mm512_mask_storeu_ps(xi + j, km, slope ? _mm512_mul_ps(s, m) : pre);
}

static inline __attribute__((always_inline, target(Z_SMALLK_DROP_ISA))) void
z_smallk_drop_rows_t(const fg_gemm *g, const float *a, const float *bp, float *c, int64_t r0, int64_t r1, int act) {
    const int64_t n = g->n, k = g->k, full = n / SMALLK_J * SMALLK_J;
    float *aux = g->epi.has_aux ? g->epi.aux : NULL;
    const bool slope = g->epi.slope;
    const fg_dropout_gen *d = g->epi.drop;
    const z_keys keys = z_keys_make(d->seed);
    const __m512i thr8 = _mm512_set1_epi32((int)(d->threshold << 8));
    const __m512 scale = _mm512_set1_ps(d->scale);
    const float *origin = g->epi.drop_origin;
    uint64_t words[SMALLK_KEEP_WORDS];
    for (int64_t i = r0; i < r1; i++) {
        float ai[SMALLK_K];
        for (int64_t p = 0; p < k; p++) ai[p] = a[i * g->a.rs + p * g->a.cs];
        float *ci = c + i * g->c.rs, *xi = aux ? aux + i * g->c.rs : NULL;
        const float *br = g->bias ? (const float *)g->bias + i * g->bias_rs : NULL;
        const uint64_t e0 = (uint64_t)(ci - origin), q0 = e0 >> 2; /* the row's first flat index, its quad */
        const int64_t b0 = (int64_t)(e0 & 3), nw = (b0 + n + 63) / 64;
        for (int64_t w = 0; w < nw; w++) words[w] = z_keep_bits(q0 + 16 * (uint64_t)w, d->offset, &keys, thr8);
        words[nw] = 0;
        for (int64_t j0 = 0; j0 < full; j0 += SMALLK_J) { /* 64 columns in four registers */
            __m512 s0, s1, s2, s3;
            z_smallk_dot64(bp, ai, k, n, j0, &s0, &s1, &s2, &s3);
            z_smallk_drop_store(ci, xi, br, act, slope, j0, 0xffff, s0, _mm512_maskz_mov_ps(keep16(words, b0 + j0), scale));
            z_smallk_drop_store(ci, xi, br, act, slope, j0 + 16, 0xffff, s1,
                                _mm512_maskz_mov_ps(keep16(words, b0 + j0 + 16), scale));
            z_smallk_drop_store(ci, xi, br, act, slope, j0 + 32, 0xffff, s2,
                                _mm512_maskz_mov_ps(keep16(words, b0 + j0 + 32), scale));
            z_smallk_drop_store(ci, xi, br, act, slope, j0 + 48, 0xffff, s3,
                                _mm512_maskz_mov_ps(keep16(words, b0 + j0 + 48), scale));
        }
        for (int64_t j0 = full; j0 < n; j0 += 16) { /* then 16 columns a register, the last masked */
            const __mmask16 km = fg_z_lanes(n - j0);
            const __m512 s0 = z_smallk_dot16(bp, ai, k, n, j0, km);
            z_smallk_drop_store(ci, xi, br, act, slope, j0, km, s0, _mm512_maskz_mov_ps(keep16(words, b0 + j0), scale));
        }
    }
}

__attribute__((target(Z_SMALLK_DROP_ISA))) static void z_smallk_drop_rows(const fg_gemm *g, const float *a,
                                                                          const float *bp, float *c, int64_t r0,
                                                                          int64_t r1) {
    if (g->act == FG_ACT_GELU) z_smallk_drop_rows_t(g, a, bp, c, r0, r1, FG_ACT_GELU);
    else z_smallk_drop_rows_t(g, a, bp, c, r0, r1, FG_ACT_GELU_TANH);
}
#endif
#endif

/* Whether smallk applies the epilogue's dropout (with its activation). */
static bool smallk_drops(const fg_gemm *g) {
#if defined(FG_Z) && defined(FG_HAVE_PHILOX_X16)
    return z_smallk_drops(g);
#else
    (void)g;
    return false;
#endif
}

/* The epilogue's activation as a constant of each instantiation (−1: none fused). */
FG_CPU_CLONES
static void smallk_rows(const fg_gemm *g, const float *a, const float *bp, float *c, int64_t r0, int64_t r1) {
#if defined(FG_Z) && defined(FG_HAVE_PHILOX_X16)
    if (z_smallk_drops(g)) {
        z_smallk_drop_rows(g, a, bp, c, r0, r1);
        return;
    }
#endif
#ifdef FG_Z
    if (z_smallk_takes(g)) {
        z_smallk_rows(g, a, bp, c, r0, r1);
        return;
    }
#endif
    if (!fg_cpu_smallk_fuses(g)) {
        smallk_rows_t(g, a, bp, c, r0, r1, -1);
        return;
    }
    switch (g->act) {
    case FG_ACT_RELU: smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_RELU); break;
    case FG_ACT_GELU: smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_GELU); break;
    case FG_ACT_GELU_TANH: smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_GELU_TANH); break;
    case FG_ACT_SILU: smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_SILU); break;
    case FG_ACT_SIGMOID: smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_SIGMOID); break;
    case FG_ACT_TANH: smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_TANH); break;
    default: smallk_rows_t(g, a, bp, c, r0, r1, FG_ACT_NONE); break;
    }
}

static fg_status smallk(const fg_context *ctx, const fg_gemm *g, void *ws, size_t ws_bytes) {
    const int64_t n = g->n, k = g->k;
    if (ws_bytes < (size_t)(k * n) * sizeof(float)) return fg_fail(FG_ERR_INTERNAL, "cpu gemm: workspace too small");
    float *bp = ws;
    for (int64_t b = 0; b < g->batch; b++) {
        const float *a = (const float *)g->a.data + b * g->a.bs, *bb = (const float *)g->b.data + b * g->b.bs;
        float *c = (float *)g->c.data + b * g->c.bs;
        for (int64_t p = 0; p < k; p++)
            for (int64_t j = 0; j < n; j++) bp[p * n + j] = bb[p * g->b.rs + j * g->b.cs];
        const int team = fg_cpu_team(ctx, g->m * n * k, 1 << 18);
        if (team == 1) {
            smallk_rows(g, a, bp, c, 0, g->m);
            continue;
        }
#pragma omp parallel num_threads(team)
        {
            int64_t lo, hi;
            fg_cpu_share(g->m, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
            smallk_rows(g, a, bp, c, lo, hi);
        }
    }
    return FG_OK;
}

/* Narrow products (8 <= n <= 16: c's row is one vector; k past smallk's, up to NARROW_K): a tall a
   times a few columns, as PatchTST's FFN has them (T × 128 times 128 × 16). OpenBLAS packs all of a
   for these, a copy that costs as much as the product. Here NARROW_R rows run at once, each row's
   16 sums in its own register over p in order (b packed as k rows of 16, zero past n), so the
   multiply-adds' latency hides behind the other rows' and a is read once, in place. One thread a
   row block: the result does not depend on the thread count. A batch summed into one c runs as
   one product whose k is the batches' k in order (PatchTST's dh = Σ_j dqkv_j·W_j). */
enum { NARROW_R = 8, NARROW_K = 4096 };

/* a batch summed into one c (c.bs == 0) runs as one product over the batches' k concatenated */
static int64_t narrow_depth(const fg_gemm *g) { return (g->batch > 1 && g->c.bs == 0 ? g->batch : 1) * g->k; }

static bool narrow_takes(const fg_gemm *g) {
    const int64_t kk = narrow_depth(g);
    return g->dtype == FG_F32 && !g->c_f32 && kk > SMALLK_K && kk <= NARROW_K && g->k > 0 && g->n >= 8 && g->n <= 16 &&
           g->m >= 256 && g->c.cs == 1 && g->m * g->n >= (1 << 16);
}

/* Rows [r0, r1) of c = Σ over nb batches (a's batch stride bs) of a·b, bp their b's packed. */
FG_CPU_CLONES
static void tall_rows(const fg_gemm *g, const float *a, const float *bp, float *c, int64_t r0, int64_t r1,
                      int64_t nb) {
    const int64_t n = g->n, k = g->k, rs = g->a.rs, cs = g->a.cs, bs = g->a.bs;
    int64_t i = r0;
    for (; i + NARROW_R <= r1; i += NARROW_R) {
        smallk_v s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
        for (int64_t q = 0; q < nb; q++) {
            const float *ai = a + q * bs + i * rs, *bq = bp + q * k * 16;
            for (int64_t p = 0; p < k; p++) {
                smallk_v b;
                memcpy(&b, bq + p * 16, 64);
                const float *ap = ai + p * cs;
                s0 += ap[0] * b, s1 += ap[rs] * b, s2 += ap[2 * rs] * b, s3 += ap[3 * rs] * b;
                s4 += ap[4 * rs] * b, s5 += ap[5 * rs] * b, s6 += ap[6 * rs] * b, s7 += ap[7 * rs] * b;
            }
        }
        float acc[NARROW_R][16];
        memcpy(acc[0], &s0, 64), memcpy(acc[1], &s1, 64), memcpy(acc[2], &s2, 64), memcpy(acc[3], &s3, 64);
        memcpy(acc[4], &s4, 64), memcpy(acc[5], &s5, 64), memcpy(acc[6], &s6, 64), memcpy(acc[7], &s7, 64);
        for (int r = 0; r < NARROW_R; r++) smallk_store(g, c + (i + r) * g->c.rs, NULL, -1, false, i + r, 0, n, acc[r]);
    }
    for (; i < r1; i++) {
        smallk_v s0 = {0};
        for (int64_t q = 0; q < nb; q++)
            for (int64_t p = 0; p < k; p++) {
                smallk_v b;
                memcpy(&b, bp + (q * k + p) * 16, 64);
                s0 += a[q * bs + i * rs + p * cs] * b;
            }
        float acc[16];
        memcpy(acc, &s0, 64);
        smallk_store(g, c + i * g->c.rs, NULL, -1, false, i, 0, n, acc);
    }
}

/* The narrow product's dot form, where a's rows are contiguous and k a multiple of 16: row i's 16
   outputs as 16 dot products of a's row with bt's rows (b transposed, [16, nb·k], zero past n), each
   in its own register over p in 16-lane steps, then the 16 registers folded together by a fixed
   transposing tree into one vector of the 16 sums. No broadcasts: the row is read in whole vectors;
   the tree pays from 64 terms a row on. */
static bool narrow_dot(const fg_gemm *g) { return g->a.cs == 1 && g->k % 16 == 0 && narrow_depth(g) >= 64; }

/* lanes of a and b (16 = b's first) picked by idx */
#if defined(__clang__)
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (smallk_i){__VA_ARGS__})
typedef int32_t smallk_i __attribute__((vector_size(64)));
#endif

/* *out = the pair folded at this level; vectors by address, not by value: a 64-byte vector
   passed or returned by value crosses an ABI GCC warns about in files built without AVX-512 */
FG_INLINE void fold_pair(smallk_v *out, const smallk_v *px, const smallk_v *py, int level) {
    const smallk_v x = *px, y = *py;
    switch (level) {
    case 0: *out = SHUF(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                   SHUF(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
        return;
    case 1: *out = SHUF(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                   SHUF(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        return;
    case 2: *out = SHUF(x, y, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
                   SHUF(x, y, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
        return;
    default: *out = SHUF(x, y, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
                    SHUF(x, y, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        return;
    }
}
#undef SHUF

/* The 16 lanes' sums of s[0..15] folded into one vector (lane j: the sum of s[j]) and stored as
   c's row i: dot_rows' ending, shared by the formed product so both give the same bits */
FG_INLINE void fold16_store(const fg_gemm *g, smallk_v *s, float *ci, int64_t i) {
    for (int j = 0; j < 8; j++) fold_pair(&s[j], &s[2 * j], &s[2 * j + 1], 0);
    for (int j = 0; j < 4; j++) fold_pair(&s[j], &s[2 * j], &s[2 * j + 1], 1);
    for (int j = 0; j < 2; j++) fold_pair(&s[j], &s[2 * j], &s[2 * j + 1], 2);
    fold_pair(&s[0], &s[0], &s[1], 3);
    float acc[16];
    memcpy(acc, &s[0], 64);
    smallk_store(g, ci, NULL, -1, false, i, 0, g->n, acc);
}

FG_CPU_CLONES
static void dot_rows(const fg_gemm *g, const float *a, const float *bt, float *c, int64_t r0, int64_t r1, int64_t nb) {
    const int64_t k = g->k, kk = nb * k, rs = g->a.rs, bs = g->a.bs;
    for (int64_t i = r0; i < r1; i++) {
        smallk_v s[16];
        for (int j = 0; j < 16; j++) s[j] = (smallk_v){0};
        for (int64_t q = 0; q < nb; q++) {
            const float *ai = a + q * bs + i * rs, *bq = bt + q * k;
            for (int64_t p = 0; p < k; p += 16) {
                smallk_v x;
                memcpy(&x, ai + p, 64);
                for (int j = 0; j < 16; j++) {
                    smallk_v w;
                    memcpy(&w, bq + j * kk + p, 64);
                    s[j] += x * w;
                }
            }
        }
        fold16_store(g, s, c + i * g->c.rs, i);
    }
}

#ifdef FG_Z
/* The dot form with its a operand formed (linear + activation's backward: dx = g·w with
   g = dy ⊙ act′(pre), act′ the given slope or gelu's / gelu_tanh's, fg_gemm_epilogue.form) on
   AVX-512: each row's g made from dy and pre in 16-lane steps, written to a's memory (for the weight
   gradient, which reads it next) and multiplied in the same step, instead of a pass writing g and
   this product reading it again. The product is dot_rows' (the same sums, fold and store: the same
   bits). g's column sums (db) per fixed block of rows (form_rows: 512, more past 256 blocks) in f64,
   row by row, into part
   ([blocks][k]); the blocks are added in order afterwards, so the sums do not depend on the thread
   count (the threads take whole blocks). dy and pre are [m, k] row-major. */
enum { FORM_ROWS = 512, FORM_BLOCKS = 256 };

/* the rows of one block of column sums: a function of m alone */
static int64_t form_rows(const fg_gemm *g) {
    const int64_t r = (g->m + FORM_BLOCKS - 1) / FORM_BLOCKS;
    return r > FORM_ROWS ? r : FORM_ROWS;
}

static bool narrow_forms(const fg_gemm *g) {
    return g->epi.form && (g->epi.form == FG_ACT_GIVEN_SLOPE || fg_z_has_act(g->epi.form)) && g->batch == 1 &&
           narrow_dot(g) && fg_z_usable();
}

static size_t form_part_bytes(const fg_gemm *g) {
    const int64_t rb = form_rows(g);
    return g->epi.col_sums ? (size_t)((g->m + rb - 1) / rb * g->k) * sizeof(double) : 0;
}

FG_Z_INLINE void z_form_rows_t(const fg_gemm *g, const float *bt, float *c, int64_t r0, int64_t r1, double *part,
                               int act) {
    const int64_t k = g->k, rb = form_rows(g);
    const float *dy = g->epi.dy, *pre = g->epi.pre;
    float *a = g->a.data;
    for (int64_t i = r0; i < r1; i++) {
        double *ps = part ? part + i / rb * k : NULL;
        if (ps && i % rb == 0)
            for (int64_t p = 0; p < k; p++) ps[p] = 0.0;
        smallk_v sv[16];
        for (int j = 0; j < 16; j++) sv[j] = (smallk_v){0};
        for (int64_t p = 0; p < k; p += 16) {
            __m512 sl = _mm512_loadu_ps(pre + i * k + p);
            if (act != FG_ACT_GIVEN_SLOPE) fg_z_act(act, sl, &sl);
            const __m512 gv = _mm512_mul_ps(_mm512_loadu_ps(dy + i * k + p), sl);
            _mm512_storeu_ps(a + i * g->a.rs + p, gv);
            if (ps) {
                _mm512_storeu_pd(ps + p, _mm512_add_pd(_mm512_loadu_pd(ps + p), _mm512_cvtps_pd(_mm512_castps512_ps256(gv))));
                _mm512_storeu_pd(ps + p + 8, _mm512_add_pd(_mm512_loadu_pd(ps + p + 8),
                                                           _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(gv), 1)))));
            }
            smallk_v x;
            memcpy(&x, &gv, 64);
            for (int j = 0; j < 16; j++) {
                smallk_v w;
                memcpy(&w, bt + j * k + p, 64);
                sv[j] += x * w;
            }
        }
        fold16_store(g, sv, c + i * g->c.rs, i);
    }
}

FG_Z_KERNEL static void z_form_rows(const fg_gemm *g, const float *bt, float *c, int64_t r0, int64_t r1, double *part) {
    switch (g->epi.form) {
    case FG_ACT_GELU: z_form_rows_t(g, bt, c, r0, r1, part, FG_ACT_GELU); break;
    case FG_ACT_GELU_TANH: z_form_rows_t(g, bt, c, r0, r1, part, FG_ACT_GELU_TANH); break;
    default: z_form_rows_t(g, bt, c, r0, r1, part, FG_ACT_GIVEN_SLOPE); break;
    }
}
#endif

/* b packed (kk rows of 16), and the formed operand's block sums */
static size_t narrow_bytes(const fg_gemm *g) {
    size_t bytes = (size_t)(narrow_depth(g) * 16) * sizeof(float);
#ifdef FG_Z
    if (narrow_forms(g)) bytes += form_part_bytes(g);
#endif
    return bytes;
}

static fg_status narrow(const fg_context *ctx, const fg_gemm *g, void *ws, size_t ws_bytes) {
    const int64_t n = g->n, k = g->k, kk = narrow_depth(g), nb = kk / k;
    if (ws_bytes < narrow_bytes(g)) return fg_fail(FG_ERR_INTERNAL, "cpu gemm: workspace too small");
    float *bp = ws;
    for (int64_t b = 0; b < g->batch; b += nb) {
        const float *a = (const float *)g->a.data + b * g->a.bs;
        float *c = (float *)g->c.data + b * g->c.bs;
        const bool dot = narrow_dot(g);
        for (int64_t q = 0; q < nb; q++) { /* b's k × 16 (zero past n), or its transpose for the dot form */
            const float *bb = (const float *)g->b.data + (b + q) * g->b.bs;
            for (int64_t p = 0; p < k; p++)
                for (int64_t j = 0; j < 16; j++)
                    bp[dot ? j * kk + q * k + p : (q * k + p) * 16 + j] = j < n ? bb[p * g->b.rs + j * g->b.cs] : 0.0f;
        }
        const int team = fg_cpu_team(ctx, g->m * n * kk, 1 << 18);
#ifdef FG_Z
        if (narrow_forms(g)) {
            double *part = g->epi.col_sums ? (double *)(bp + kk * 16) : NULL;
#pragma omp parallel num_threads(team) if (team > 1)
            {
                int64_t lo, hi;
                fg_cpu_share(g->m, omp_get_num_threads(), omp_get_thread_num(), form_rows(g), &lo, &hi);
                z_form_rows(g, bp, c, lo, hi, part);
            }
            if (part) /* the blocks' sums in order */
                for (int64_t p = 0; p < k; p++) {
                    double sum = 0.0;
                    for (int64_t q = 0; q < (g->m + form_rows(g) - 1) / form_rows(g); q++) sum += part[q * k + p];
                    g->epi.sums[p] = (float)(g->epi.sums_first ? sum : (double)g->epi.sums[p] + sum);
                }
            continue;
        }
#endif
#pragma omp parallel num_threads(team) if (team > 1)
        {
            int64_t lo, hi;
            fg_cpu_share(g->m, omp_get_num_threads(), omp_get_thread_num(), NARROW_R, &lo, &hi);
            if (dot) dot_rows(g, a, bp, c, lo, hi, nb);
            else tall_rows(g, a, bp, c, lo, hi, nb);
        }
    }
    return FG_OK;
}

/* Long products of few outputs (k >= LONGK_MIN, m and n <= 256, a contiguous along m and b along
   n, one of m, n a multiple of 16): the weight gradients dW = dyᵀ·x over many tokens. OpenBLAS packs
   both long operands for these and runs them on its own threads, a change of pool around every
   call (src/cpu/cpu.h) that made them slower on two threads than on one. Here c is a sum of outer
   products a(·, p) ⊗ b(p, ·): the tokens in fixed chunks of LONGK_CHUNK, each chunk's product summed
   in f32 over p in order into its own partial (register tiles: the contiguous dimension in vectors,
   the other broadcast), the chunks split among the OpenMP threads, and the partials then added in
   chunk order: the result does not depend on the thread count. */
enum { LONGK_MIN = 4096, LONGK_CHUNK = 512, LONGK_MAX = 256 };

static bool longk_takes(const fg_gemm *g) {
    return g->dtype == FG_F32 && !g->c_f32 && (g->batch == 1 || g->c.bs != 0) && g->k >= LONGK_MIN &&
           g->bias_operand < 0 &&
           !g->bias && g->a.rs == 1 && g->b.cs == 1 && g->m <= LONGK_MAX && g->n <= LONGK_MAX &&
           (g->m % 16 == 0 || g->n % 16 == 0) && !g->epi.form && !g->epi.has_aux && !g->epi.col_sums;
}

static size_t longk_bytes(const fg_gemm *g) {
    return (size_t)((g->k + LONGK_CHUNK - 1) / LONGK_CHUNK) * (size_t)(g->m * g->n) * sizeof(float);
}

/* Rows [t0, t1) of x (vectors along V, v0 … v0 + 16·VV) times y's scalars s0 … s0 + ns − 1 (ns <= SS):
   out[s][v] (row length V) = Σ_t y(t, s)·x(t, v). VV and SS constants at the call. */
FG_INLINE void longk_tile(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t t0, int64_t t1, int64_t v0,
                          int64_t s0, int ns, float *out, int64_t V, const int VV, const int SS) {
    smallk_v acc[16][4];
    for (int s = 0; s < SS; s++)
        for (int v = 0; v < VV; v++) acc[s][v] = (smallk_v){0};
    for (int64_t t = t0; t < t1; t++) {
        const float *xr = x + t * ldx + v0, *yr = y + t * ldy + s0;
        smallk_v xv[4];
        for (int v = 0; v < VV; v++) memcpy(&xv[v], xr + 16 * v, 64);
        for (int s = 0; s < SS; s++)
            if (s < ns) {
                const float ys = yr[s];
                for (int v = 0; v < VV; v++) acc[s][v] += ys * xv[v];
            }
    }
    for (int s = 0; s < SS; s++)
        if (s < ns)
            for (int v = 0; v < VV; v++) memcpy(out + (s0 + s) * V + v0 + 16 * v, &acc[s][v], 64);
}

FG_INLINE void longk_chunk_t(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t t0, int64_t t1, int64_t V,
                             int64_t S, float *out, const int VV, const int SS) {
    for (int64_t v0 = 0; v0 < V; v0 += 16 * VV)
        for (int64_t s0 = 0; s0 < S; s0 += SS)
            longk_tile(x, ldx, y, ldy, t0, t1, v0, s0, S - s0 < SS ? (int)(S - s0) : SS, out, V, VV, SS);
}

FG_CPU_CLONES
static void longk_chunk(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t t0, int64_t t1, int64_t V,
                        int64_t S, float *out) {
    if (V % 64 == 0) longk_chunk_t(x, ldx, y, ldy, t0, t1, V, S, out, 4, 4);
    else if (V % 32 == 0) longk_chunk_t(x, ldx, y, ldy, t0, t1, V, S, out, 2, 8);
    else longk_chunk_t(x, ldx, y, ldy, t0, t1, V, S, out, 1, 16);
}

/* One product of the batch (a, b, c its operands' data), the workspace reused by each. */
static void longk_one(const fg_context *ctx, const fg_gemm *g, const float *a, const float *b, float *c, float *part) {
    const int64_t m = g->m, n = g->n, k = g->k, mn = m * n, chunks = (k + LONGK_CHUNK - 1) / LONGK_CHUNK;
    /* vectors along n (b's rows) where n is a multiple of 16 and not the shorter, else along m */
    const bool along_n = n % 16 == 0 && (n >= m || m % 16 != 0);
    const float *x = along_n ? b : a, *y = along_n ? a : b;
    const int64_t ldx = along_n ? g->b.rs : g->a.cs, ldy = along_n ? g->a.cs : g->b.rs;
    const int64_t V = along_n ? n : m, S = along_n ? m : n;
    const int team = fg_cpu_team(ctx, mn * k, 1 << 18);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t ch = 0; ch < chunks; ch++) {
        const int64_t t0 = ch * LONGK_CHUNK, t1 = t0 + LONGK_CHUNK < k ? t0 + LONGK_CHUNK : k;
        longk_chunk(x, ldx, y, ldy, t0, t1, V, S, part + ch * mn);
    }
    /* the partials added in chunk order into the first (partial [s][v] is c(s, v) along n, c(v, s)
       along m) */
    for (int64_t ch = 1; ch < chunks; ch++)
        for (int64_t e = 0; e < mn; e++) part[e] += part[ch * mn + e];
    const float alpha = (float)g->alpha, beta = (float)g->beta;
    for (int64_t s = 0; s < S; s++)
        for (int64_t v = 0; v < V; v++) {
            const float sum = part[s * V + v];
            float *ci = c + (along_n ? s * g->c.rs + v * g->c.cs : v * g->c.rs + s * g->c.cs);
            *ci = beta != 0.0f ? alpha * sum + beta * *ci : alpha * sum;
        }
}

/* each batch its own output (c.bs != 0), one after another */
static fg_status longk(const fg_context *ctx, const fg_gemm *g, void *ws, size_t ws_bytes) {
    if (ws_bytes < longk_bytes(g)) return fg_fail(FG_ERR_INTERNAL, "cpu gemm: workspace too small");
    for (int64_t q = 0; q < g->batch; q++)
        longk_one(ctx, g, (const float *)g->a.data + q * g->a.bs, (const float *)g->b.data + q * g->b.bs,
                  (float *)g->c.data + q * g->c.bs, ws);
    return FG_OK;
}

static fg_status general(const fg_context *ctx, const fg_gemm *g, void *ws, size_t ws_bytes) {
    const fg_dtype t = g->dtype, ct = g->c_f32 ? FG_F32 : t;
    const int64_t m = g->m, n = g->n, k = g->k;
    const bool reduce = g->batch > 1 && g->c.bs == 0;
    const bool low = t == FG_F16 || t == FG_BF16;
    float *af = NULL, *bf = NULL, *cf = NULL;
    if (low) {
        size_t need = (size_t)(m * k + k * n + m * n) * sizeof(float);
        if (ws_bytes < need) return fg_fail(FG_ERR_INTERNAL, "cpu gemm: workspace too small");
        af = ws;
        bf = af + m * k;
        cf = bf + k * n;
    }
    for (int64_t b = 0; b < g->batch; b++) {
        char *c = (char *)g->c.data + b * g->c.bs * (int64_t)fg_dtype_size(ct);
        const bool first = !reduce || b == 0;
        /* the product adds into c (or its f32 copy) with blas_beta: the caller's beta when
           nothing was written there first, else 1 after c = beta·c + bias */
        double blas_beta = 1.0;
        if (first) {
            if (low || g->bias || k == 0) over_rows(ctx, g, c, low ? cf : NULL, prefill_rows);
            else blas_beta = g->beta;
        }
        if (k > 0) {
            const double macs = (double)m * (double)n * (double)k;
            if (low) {
                enum CBLAS_TRANSPOSE ta, tb;
                int64_t lda, ldb;
                widen(ctx, &g->a, t, b, m, k, af, &ta, &lda);
                widen(ctx, &g->b, t, b, k, n, bf, &tb, &ldb);
                const fg_blas_scope scope = fg_cpu_blas_begin(ctx, macs);
                cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)g->alpha, af,
                            (blasint)lda, bf, (blasint)ldb, 1.0f, cf, (blasint)n);
                fg_cpu_blas_end(scope);
            } else {
                enum CBLAS_TRANSPOSE ta, tb;
                int64_t lda, ldb;
                blas_op(&g->a, m, k, &ta, &lda);
                blas_op(&g->b, k, n, &tb, &ldb);
                if (lda > INT32_MAX || ldb > INT32_MAX || g->c.rs > INT32_MAX)
                    return fg_fail(FG_ERR_UNSUPPORTED, "cpu gemm: a leading dimension is past 2^31");
                size_t es = fg_dtype_size(t);
                const char *a = (const char *)g->a.data + b * g->a.bs * (int64_t)es;
                const char *bb = (const char *)g->b.data + b * g->b.bs * (int64_t)es;
                int64_t ldc = g->c.rs > n ? g->c.rs : n;
                if (m == 1) ldc = n;
                const fg_blas_scope scope = fg_cpu_blas_begin(ctx, macs);
                if (t == FG_F32)
                    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)g->alpha,
                                (const float *)a, (blasint)lda, (const float *)bb, (blasint)ldb, (float)blas_beta,
                                (float *)c, (blasint)ldc);
                else
                    cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, g->alpha,
                                (const double *)a, (blasint)lda, (const double *)bb, (blasint)ldb, blas_beta,
                                (double *)c, (blasint)ldc);
                fg_cpu_blas_end(scope);
            }
        }
        if (low && (!reduce || b == g->batch - 1)) over_rows(ctx, g, c, cf, narrow_rows_any);
    }
    return FG_OK;
}

fg_status fg_cpu_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                      size_t ws_bytes, bool run) {
    const bool ones = g->a.operand == FG_OPERAND_ONES || g->b.operand == FG_OPERAND_ONES;
    const bool vector = g->batch == 1 && (g->m == 1 || g->n == 1) && g->k > 0;
    const bool bias = g->bias || g->bias_operand >= 0;
    const char *tn = fg_dtype_name(g->dtype);
    if (g->k > 0 && (vector || ones)) {
        if (ones && !vector)
            return fg_fail(FG_ERR_INTERNAL, "cpu gemm: a ones operand outside a vector product");
        bool blas = !ones && !bias && (g->dtype == FG_F32 || g->dtype == FG_F64);
        snprintf(info->name, sizeof info->name, blas ? "openblas:%sgemv" : "cpu:%s_vecprod%s",
                 blas ? (g->dtype == FG_F32 ? "s" : "d") : tn, ones ? "_ones" : "");
        if (!blas) info->accumulator = FG_F64;
        if (!run) return FG_OK;
        if (!(blas && blas_gemv(ctx, g))) gemv(ctx, g);
        return FG_OK;
    }
    if (smallk_takes(g)) {
        info->act_fused = fg_cpu_smallk_fuses(g);
        info->drop_fused = info->act_fused && smallk_drops(g);
        snprintf(info->name, sizeof info->name, "%s",
                 info->drop_fused ? "cpu:f32_smallk+act+dropout" : info->act_fused ? "cpu:f32_smallk+act" : "cpu:f32_smallk");
        info->workspace_bytes = (size_t)(g->k * g->n) * sizeof(float);
        if (!run) return FG_OK;
        return smallk(ctx, g, ws, ws_bytes);
    }
    if (longk_takes(g)) {
        snprintf(info->name, sizeof info->name, "cpu:f32_longk");
        info->workspace_bytes = longk_bytes(g);
        if (!run) return FG_OK;
        return longk(ctx, g, ws, ws_bytes);
    }
    if (narrow_takes(g)) {
#ifdef FG_Z
        info->formed = narrow_forms(g);
#endif
        snprintf(info->name, sizeof info->name, info->formed ? "cpu:f32_narrow_formed_g" : "cpu:f32_narrow");
        info->workspace_bytes = narrow_bytes(g);
        if (!run) return FG_OK;
        return narrow(ctx, g, ws, ws_bytes);
    }
    const bool low = g->dtype == FG_F16 || g->dtype == FG_BF16;
    snprintf(info->name, sizeof info->name, low ? "cpu:%s->f32+openblas:sgemm" : "openblas:%sgemm",
             low ? tn : (g->dtype == FG_F32 ? "s" : "d"));
    if (low) info->workspace_bytes = (size_t)(g->m * g->k + g->k * g->n + g->m * g->n) * sizeof(float);
    if (!run) return FG_OK;
    return general(ctx, g, ws, ws_bytes);
}

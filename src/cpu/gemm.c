/*
 * gemm.c — the CPU backend's GEMM primitive, the reference every other backend is
 * tested against. f32/f64 products go to OpenBLAS (sgemm/dgemm, sgemv/dgemv);
 * f16/bf16 are widened to f32 in the workspace, multiplied by sgemm and rounded once.
 * Vector products with a vector of ones (bias gradients) and low-precision GEMVs are
 * plain OpenMP loops with f64 accumulation. Every loop has a fixed order: results are
 * deterministic for a given thread count.
 */
#include "../core/internal.h"

#include <cblas.h>
#include <stdio.h>
#include <string.h>

static int threads(const fg_context *ctx) {
    return ctx->num_threads > 0 ? ctx->num_threads : 0;
}

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

static void vec_product(const fg_context *ctx, const fg_gemm *g, const vecprod *p) {
    const fg_dtype t = g->dtype, ct = g->c_f32 ? FG_F32 : t;
    const int nt = threads(ctx);
    if (p->mp == 1 || p->len == 1) {
        /* each output reads a contiguous run of M: a dot product per output */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && p->len * p->depth > 65536)
        for (int64_t j = 0; j < p->len; j++) {
            double acc = 0.0;
            for (int64_t q = 0; q < p->depth; q++)
                acc += (p->v ? fg_load_f64(p->v, t, q * p->vs) : 1.0) * fg_load_f64(p->m, t, q * p->mp + j * p->mj);
            fg_store_f64(p->out, ct, j * p->os, epilogue(g, acc, p->out, j * p->os, j, p->bias_inc));
        }
        return;
    }
    /* rows of M are contiguous: walk them in order, a block of outputs per thread */
    enum { BLOCK = 256 };
    const int64_t nblocks = (p->len + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && p->len * p->depth > 65536)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        double acc[BLOCK];
        const int64_t j0 = blk * BLOCK, jn = p->len - j0 < BLOCK ? p->len - j0 : BLOCK;
        for (int64_t j = 0; j < jn; j++) acc[j] = 0.0;
        for (int64_t q = 0; q < p->depth; q++) {
            const double vq = p->v ? fg_load_f64(p->v, t, q * p->vs) : 1.0;
            for (int64_t j = 0; j < jn; j++) acc[j] += vq * fg_load_f64(p->m, t, q * p->mp + (j0 + j) * p->mj);
        }
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

static bool blas_gemv(const fg_gemm *g) {
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
    if (g->dtype == FG_F32)
        cblas_sgemv(CblasRowMajor, tr, (blasint)r, (blasint)c, (float)g->alpha, mat->data, (blasint)ld,
                    vec->data, (blasint)vinc, (float)beta, g->c.data, (blasint)oinc);
    else
        cblas_dgemv(CblasRowMajor, tr, (blasint)r, (blasint)c, g->alpha, mat->data, (blasint)ld,
                    vec->data, (blasint)vinc, beta, g->c.data, (blasint)oinc);
    return true;
}

/* A row-major-or-transposed operand as BLAS sees it. */
static void blas_op(const fg_mat *x, int64_t rows, int64_t cols, enum CBLAS_TRANSPOSE *tr, int64_t *ld) {
    if (x->cs == 1 || cols == 1) { *tr = CblasNoTrans; *ld = x->rs > cols ? x->rs : cols; }
    else { *tr = CblasTrans; *ld = x->cs > rows ? x->cs : rows; }
    if (rows == 1 && *tr == CblasNoTrans) *ld = cols > 0 ? cols : 1;
}

/* Packs batch element b of operand x (rows × cols) into a contiguous f32 buffer. */
static void widen(const fg_context *ctx, const fg_mat *x, fg_dtype t, int64_t b, int64_t rows,
                  int64_t cols, float *dst) {
    const int nt = threads(ctx);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && rows * cols > 65536)
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[i * cols + j] = (float)fg_load_f64(x->data, t, b * x->bs + i * x->rs + j * x->cs);
}

static fg_status general(const fg_context *ctx, const fg_gemm *g, void *ws, size_t ws_bytes) {
    const fg_dtype t = g->dtype, ct = g->c_f32 ? FG_F32 : t;
    const int64_t m = g->m, n = g->n, k = g->k;
    const bool reduce = g->batch > 1 && g->c.bs == 0;
    const bool low = t == FG_F16 || t == FG_BF16;
    const int nt = threads(ctx);
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
        double beta = g->beta;
        /* c (or its f32 copy) = beta·c + bias before the first product that lands there */
        if (!reduce || b == 0) {
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && m * n > 65536)
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    int64_t ci = i * g->c.rs + j;
                    double v = beta != 0.0 ? beta * fg_load_f64(c, ct, ci) : 0.0;
                    if (g->bias) v += fg_load_f64(g->bias, t, i * g->bias_rs + j * g->bias_cs);
                    if (low) cf[i * n + j] = (float)v;
                    else if (beta != 1.0 || g->bias) fg_store_f64(c, ct, ci, v);
                }
        }
        if (k > 0) {
            if (low) {
                widen(ctx, &g->a, t, b, m, k, af);
                widen(ctx, &g->b, t, b, k, n, bf);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
                            (float)g->alpha, af, (blasint)k, bf, (blasint)n, 1.0f, cf, (blasint)n);
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
                if (t == FG_F32)
                    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)g->alpha,
                                (const float *)a, (blasint)lda, (const float *)bb, (blasint)ldb, 1.0f,
                                (float *)c, (blasint)ldc);
                else
                    cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, g->alpha,
                                (const double *)a, (blasint)lda, (const double *)bb, (blasint)ldb, 1.0,
                                (double *)c, (blasint)ldc);
            }
        }
        if (low && (!reduce || b == g->batch - 1)) {
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && m * n > 65536)
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) fg_store_f64(c, ct, i * g->c.rs + j, cf[i * n + j]);
        }
    }
    return FG_OK;
}

fg_status fg_cpu_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                      size_t ws_bytes, bool run) {
    const bool ones = g->a.operand == FG_OPERAND_ONES || g->b.operand == FG_OPERAND_ONES;
    const bool vector = g->batch == 1 && (g->m == 1 || g->n == 1) && g->k > 0;
    const char *tn = fg_dtype_name(g->dtype);
    if (g->k > 0 && (vector || ones)) {
        if (ones && !vector)
            return fg_fail(FG_ERR_INTERNAL, "cpu gemm: a ones operand outside a vector product");
        bool blas = !ones && !g->bias && (g->dtype == FG_F32 || g->dtype == FG_F64);
        snprintf(info->name, sizeof info->name, blas ? "openblas:%sgemv" : "cpu:%s_vecprod%s",
                 blas ? (g->dtype == FG_F32 ? "s" : "d") : tn, ones ? "_ones" : "");
        if (!blas) info->accumulator = FG_F64;
        if (!run) return FG_OK;
        if (!(blas && blas_gemv(g))) gemv(ctx, g);
        return FG_OK;
    }
    const bool low = g->dtype == FG_F16 || g->dtype == FG_BF16;
    snprintf(info->name, sizeof info->name, low ? "cpu:%s->f32+openblas:sgemm" : "openblas:%sgemm",
             low ? tn : (g->dtype == FG_F32 ? "s" : "d"));
    if (low) info->workspace_bytes = (size_t)(g->m * g->k + g->k * g->n + g->m * g->n) * sizeof(float);
    if (!run) return FG_OK;
    return general(ctx, g, ws, ws_bytes);
}

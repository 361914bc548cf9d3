/*
 * gemm.c — the backend-neutral half of the GEMM primitive. Every op lowers to fg_gemm
 * problems; this file puts one into the form both backends expect (c row-major,
 * degenerate strides made valid, a batch sum collapsed into one product where the
 * memory layout allows, every dim within int32) and hands it to the context's backend.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define DIM_LIMIT ((int64_t)INT32_MAX)

/* Gives a size-1 dim a stride that BLAS accepts. */
static void fix_degenerate(fg_mat *x, int64_t rows, int64_t cols) {
    if (rows <= 1) x->rs = x->cs == 1 ? (cols > 1 ? cols : 1) : 1;
    if (cols <= 1) x->cs = x->rs == 1 ? (rows > 1 ? rows : 1) : 1;
}

static void shift(fg_mat *x, int64_t elems, size_t esize) {
    x->offset += elems;
    if (x->data) x->data = (char *)x->data + elems * (int64_t)esize;
}

static bool valid_layout(const fg_mat *x, int64_t rows, int64_t cols) {
    if (rows <= 1 || cols <= 1) return true;
    return (x->cs == 1 && x->rs >= cols) || (x->rs == 1 && x->cs >= rows);
}

/* The kernel's label: its name, cut where plan infos cut it. */
static void label(char *out, size_t len, const fg_kernel_info *info) { snprintf(out, len, "%.60s", info->name); }

void fg_name_append(char *name, size_t len, const char *piece) {
    const size_t n = strlen(piece);
    for (const char *at = name; (at = strstr(at, piece)) != NULL; at++) { /* each kernel named once */
        const bool starts = at == name || (at >= name + 3 && strncmp(at - 3, " ; ", 3) == 0);
        if (starts && (at[n] == 0 || strncmp(at + n, " ; ", 3) == 0)) return;
    }
    size_t used = strlen(name);
    if (used + 1 < len) snprintf(name + used, len - used, "%s%s", used ? " ; " : "", piece);
}

void fg_names_append(char *name, size_t len, const char *list) {
    char buf[FG_NAME_LIST_MAX];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *p = buf; p && *p;) { /* each piece once, in order */
        char *end = strstr(p, " ; ");
        if (end) *end = 0;
        fg_name_append(name, len, p);
        p = end ? end + 3 : NULL;
    }
}

void fg_gemm_name_append(char *name, size_t len, const fg_kernel_info *info) {
    char one[96];
    label(one, sizeof one, info);
    fg_name_append(name, len, one);
}

/* The backend runs (or plans) the normalized problem; running, it records what it launched. */
static fg_status dispatch(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                          size_t ws_bytes, bool run) {
    FG_TRY(ctx->be->gemm(ctx, g, info, ws, ws_bytes, run));
    if (run) {
        char one[96];
        label(one, sizeof one, info);
        fg_record_kernel(ctx, one);
    }
    return FG_OK;
}

/* Splits dims past int32 into chunks; plans from the first (largest) chunk. */
static fg_status split(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                       size_t ws_bytes, bool run) {
    const size_t es = fg_dtype_size(g->dtype), ces = g->c_f32 ? sizeof(float) : es;
    if (g->batch > DIM_LIMIT && g->c.bs != 0) {
        for (int64_t b0 = 0; b0 < g->batch; b0 += DIM_LIMIT) {
            fg_gemm s = *g;
            s.batch = g->batch - b0 < DIM_LIMIT ? g->batch - b0 : DIM_LIMIT;
            shift(&s.a, b0 * g->a.bs, es);
            shift(&s.b, b0 * g->b.bs, es);
            shift(&s.c, b0 * g->c.bs, ces);
            FG_TRY(split(ctx, &s, info, ws, ws_bytes, run));
            if (!run) return FG_OK;
        }
        return FG_OK;
    }
    if (g->m > DIM_LIMIT) {
        for (int64_t i0 = 0; i0 < g->m; i0 += DIM_LIMIT) {
            fg_gemm s = *g;
            s.m = g->m - i0 < DIM_LIMIT ? g->m - i0 : DIM_LIMIT;
            shift(&s.a, i0 * g->a.rs, es);
            shift(&s.c, i0 * g->c.rs, ces);
            if (s.bias) s.bias = (char *)s.bias + i0 * g->bias_rs * (int64_t)es;
            FG_TRY(split(ctx, &s, info, ws, ws_bytes, run));
            if (!run) return FG_OK;
        }
        return FG_OK;
    }
    if (g->n > DIM_LIMIT) {
        for (int64_t j0 = 0; j0 < g->n; j0 += DIM_LIMIT) {
            fg_gemm s = *g;
            s.n = g->n - j0 < DIM_LIMIT ? g->n - j0 : DIM_LIMIT;
            shift(&s.b, j0 * g->b.cs, es);
            shift(&s.c, j0 * g->c.cs, ces);
            if (s.bias) s.bias = (char *)s.bias + j0 * g->bias_cs * (int64_t)es;
            FG_TRY(split(ctx, &s, info, ws, ws_bytes, run));
            if (!run) return FG_OK;
        }
        return FG_OK;
    }
    if (g->k > DIM_LIMIT || (g->batch > DIM_LIMIT && g->c.bs == 0)) {
        /* A long reduction runs in chunks that add into c (beta = 1 after the first). */
        bool along_k = g->k > DIM_LIMIT;
        int64_t total = along_k ? g->k : g->batch;
        for (int64_t p0 = 0; p0 < total; p0 += DIM_LIMIT) {
            fg_gemm s = *g;
            int64_t len = total - p0 < DIM_LIMIT ? total - p0 : DIM_LIMIT;
            if (along_k) {
                s.k = len;
                shift(&s.a, p0 * g->a.cs, es);
                shift(&s.b, p0 * g->b.rs, es);
            } else {
                s.batch = len;
                shift(&s.a, p0 * g->a.bs, es);
                shift(&s.b, p0 * g->b.bs, es);
            }
            if (p0 > 0) {
                s.beta = 1.0;
                s.bias = NULL; /* added once */
                s.bias_operand = -1;
            }
            FG_TRY(split(ctx, &s, info, ws, ws_bytes, run));
            if (!run) return FG_OK;
        }
        return FG_OK;
    }
    return dispatch(ctx, g, info, ws, ws_bytes, run);
}

fg_status fg_gemm_execute(fg_context *ctx, const fg_gemm *in, fg_kernel_info *info, void *ws,
                          size_t ws_bytes, bool run) {
    fg_gemm g = *in;
    memset(info, 0, sizeof *info);
    info->deterministic = true;
    info->accumulator = g.dtype == FG_F64 ? FG_F64 : FG_F32;
    if (g.batch == 0 || g.m == 0 || g.n == 0) {
        snprintf(info->name, sizeof info->name, "empty");
        if (run) fg_record_kernel(ctx, "empty");
        return FG_OK;
    }
    if (g.batch == 1) {
        g.a.bs = g.b.bs = g.c.bs = 0;
    }
    /* an epilogue (activation, aux, a formed operand) only on one product that needs no transposing
       or splitting: elsewhere the backend is not asked for it, and says it did not do it */
    if ((g.act || g.epi.has_aux || g.epi.form) &&
        (g.batch != 1 || g.c.cs != 1 || g.m > DIM_LIMIT || g.n > DIM_LIMIT || g.k > DIM_LIMIT)) {
        if (g.epi.form && run) return fg_fail(FG_ERR_INTERNAL, "gemm: an operand to form on a split product");
        g.act = 0;
        memset(&g.epi, 0, sizeof g.epi);
    }
    fix_degenerate(&g.a, g.m, g.k);
    fix_degenerate(&g.b, g.k, g.n);
    fix_degenerate(&g.c, g.m, g.n);

    if (g.c.cs != 1) {
        /* c column-major: compute cᵀ = bᵀ·aᵀ, which is row-major (a bias along the
           columns of c runs along the rows of cᵀ) */
        fg_mat a = g.a;
        g.a = fg_mat_t(g.b);
        g.b = fg_mat_t(a);
        g.c = fg_mat_t(g.c);
        int64_t t = g.m;
        g.m = g.n;
        g.n = t;
        int64_t t2 = g.bias_rs;
        g.bias_rs = g.bias_cs;
        g.bias_cs = t2;
    }

    /* A batch sum whose operands lie side by side along k is one longer product. */
    if (g.batch > 1 && g.c.bs == 0 && g.a.bs != 0 && g.b.bs != 0 && g.a.bs == g.k * g.a.cs &&
        g.b.bs == g.k * g.b.rs) {
        fg_gemm c = g;
        c.k = g.k * g.batch;
        c.batch = 1;
        c.a.bs = c.b.bs = 0;
        if (valid_layout(&c.a, c.m, c.k) && valid_layout(&c.b, c.k, c.n)) g = c;
    }
    return split(ctx, &g, info, ws, ws_bytes, run);
}

fg_gemm fg_gemm_plain(fg_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k, fg_mat a, fg_mat b, fg_mat c,
                      double beta, bool has_bias, const void *bias, bool allow_tf32, bool c_f32, uint32_t align) {
    fg_gemm g;
    memset(&g, 0, sizeof g);
    g.dtype = dtype;
    g.batch = batch;
    g.m = m, g.n = n, g.k = k;
    g.a = a, g.b = b, g.c = c;
    g.alpha = 1.0;
    g.beta = beta;
    g.bias_operand = has_bias ? 0 : -1;
    g.bias = (void *)bias;
    g.bias_cs = 1;
    g.allow_tf32 = allow_tf32 && dtype == FG_F32;
    g.c_f32 = c_f32 && dtype != FG_F64;
    g.align = align;
    return g;
}

fg_status fg_gemm_walk(fg_context *ctx, const fg_gemm *g, bool run, void *ws, size_t ws_bytes, size_t *need,
                       char *name, size_t len) {
    fg_kernel_info info;
    if (run) return fg_gemm_execute(ctx, g, &info, ws, ws_bytes, true);
    FG_TRY(fg_gemm_execute(ctx, g, &info, NULL, 0, false));
    if (info.workspace_bytes > *need) *need = info.workspace_bytes;
    fg_gemm_name_append(name, len, &info);
    return FG_OK;
}

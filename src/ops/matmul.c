/*
 * matmul.c — front door of the Matmul family: c = a·b for 2-D and batched 3-D
 * operands, a 2-D operand broadcast across the other's batch, and its two backward
 * kernels: da = dc·bᵀ and db = aᵀ·dc, each summed over the batch when that operand
 * was broadcast (deterministically: the GEMM primitive adds in batch order, or does
 * one longer product when the memory layout allows). Lowers to one GEMM primitive.
 */
#include "../core/internal.h"

#include <stdio.h>
#include <string.h>

enum { MF_A, MF_B, MF_C };
enum { MBI_DC, MBI_B, MBI_DA };
enum { MBO_A, MBO_DC, MBO_DB };

typedef struct mat3 {
    int64_t batch, rows, cols;
    fg_mat m;
} mat3;

static fg_status view(const char *op, const char *what, const fg_tensor *t, int operand,
                      mat3 *v) {
    FG_TRY(fg_check_desc(op, what, t, 2, 3));
    int64_t stride[FG_MAX_RANK];
    fg_tensor_strides(t, stride);
    int r = t->rank;
    v->batch = r == 3 ? t->shape[0] : 1;
    v->rows = t->shape[r - 2];
    v->cols = t->shape[r - 1];
    v->m = fg_mat_of(operand, stride, r - 2, r - 1);
    v->m.bs = r == 3 ? stride[0] : 0;
    return fg_check_unit_stride(op, what, &v->m, v->rows, v->cols);
}

static fg_status same_dtypes(const char *op, const fg_tensor *ops, const char *const *names) {
    for (int i = 1; i < 3; i++)
        if (ops[i].dtype != ops[0].dtype)
            return fg_fail(FG_ERR_DTYPE, "%s: %s.dtype=%s but %s.dtype=%s", op, names[i],
                           fg_dtype_name(ops[i].dtype), names[0], fg_dtype_name(ops[0].dtype));
    return FG_OK;
}

static fg_status dim_eq(const char *op, const char *a, int64_t x, const char *b, int64_t y) {
    if (x != y)
        return fg_fail(FG_ERR_SHAPE, "%s: %s=%lld but %s=%lld", op, a, (long long)x, b, (long long)y);
    return FG_OK;
}

/* Two operands' batches agree: equal, or one of them 2-D (broadcast). */
static fg_status batch_of(const char *op, const fg_tensor *p, const char *pn, const fg_tensor *q,
                          const char *qn, int64_t *batch) {
    *batch = 1;
    if (p->rank == 3 && q->rank == 3 && p->shape[0] != q->shape[0])
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape[0]=%lld but %s.shape[0]=%lld", op, pn,
                       (long long)p->shape[0], qn, (long long)q->shape[0]);
    *batch = p->rank == 3 ? p->shape[0] : q->rank == 3 ? q->shape[0] : 1;
    return FG_OK;
}

static fg_gemm gemm_init(const fg_tensor *t, int64_t batch, int64_t m, int64_t n, int64_t k,
                         int accumulate) {
    fg_gemm g;
    memset(&g, 0, sizeof g);
    g.dtype = t->dtype;
    g.batch = batch;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = 1.0;
    g.beta = accumulate ? 1.0 : 0.0;
    g.bias_operand = -1;
    return g;
}

static fg_status lower_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "matmul_forward";
    static const char *const names[] = {"a", "b", "c"};
    const fg_tensor *t = d->operands;
    mat3 a, b, c;
    FG_TRY(view(op, "a", &t[MF_A], MF_A, &a));
    FG_TRY(view(op, "b", &t[MF_B], MF_B, &b));
    FG_TRY(view(op, "c", &t[MF_C], MF_C, &c));
    FG_TRY(same_dtypes(op, t, names));
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0", op);
    int64_t batch;
    FG_TRY(batch_of(op, &t[MF_A], "a", &t[MF_B], "b", &batch));
    FG_TRY(dim_eq(op, "b.shape[-2]", b.rows, "a.shape[-1]", a.cols));
    int want_rank = (t[MF_A].rank == 3 || t[MF_B].rank == 3) ? 3 : 2;
    if (t[MF_C].rank != want_rank)
        return fg_fail(FG_ERR_SHAPE, "%s: c.rank=%d but a and b give a rank-%d result", op,
                       t[MF_C].rank, want_rank);
    if (want_rank == 3) FG_TRY(dim_eq(op, "c.shape[0]", c.batch, "the batch", batch));
    FG_TRY(dim_eq(op, "c.shape[-2]", c.rows, "a.shape[-2]", a.rows));
    FG_TRY(dim_eq(op, "c.shape[-1]", c.cols, "b.shape[-1]", b.cols));
    fg_gemm g = gemm_init(&t[MF_A], batch, a.rows, b.cols, a.cols, 0);
    g.a = a.m;
    g.b = b.m;
    g.c = c.m;
    out->count = 1;
    out->gemm[0] = g;
    return FG_OK;
}

/* Shared by both backward kernels: grad = p·q with p, q given as views (already
 * transposed where needed); grad 2-D under a 3-D product means a sum over the batch. */
static fg_status lower_grad(const char *op, const fg_plan_desc *d, const char *gname, mat3 p,
                            mat3 q, mat3 grad, int64_t batch, int grad_rank, int product_rank,
                            fg_lowered *out) {
    if (product_rank == 2 && grad_rank == 3)
        return fg_fail(FG_ERR_SHAPE, "%s: %s is 3-D but the product it belongs to is 2-D", op, gname);
    if (grad_rank == 3) FG_TRY(dim_eq(op, "the gradient's batch", grad.batch, "the batch", batch));
    char rn[48], cn[48];
    snprintf(rn, sizeof rn, "%s.shape[-2]", gname);
    snprintf(cn, sizeof cn, "%s.shape[-1]", gname);
    FG_TRY(dim_eq(op, rn, grad.rows, "the product's rows", p.rows));
    FG_TRY(dim_eq(op, cn, grad.cols, "the product's columns", q.cols));
    fg_gemm g = gemm_init(&d->operands[0], batch, p.rows, q.cols, p.cols, d->accumulate);
    g.a = p.m;
    g.b = q.m;
    g.c = grad.m;
    if (grad_rank == 2) g.c.bs = 0; /* summed over the batch */
    out->count = 1;
    out->gemm[0] = g;
    return FG_OK;
}

static mat3 transposed(mat3 v) {
    int64_t r = v.rows;
    v.rows = v.cols;
    v.cols = r;
    v.m = fg_mat_t(v.m);
    return v;
}

static fg_status lower_backward_input(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "matmul_backward_input";
    static const char *const names[] = {"dc", "b", "da"};
    const fg_tensor *t = d->operands;
    mat3 dc, b, da;
    FG_TRY(view(op, "dc", &t[MBI_DC], MBI_DC, &dc));
    FG_TRY(view(op, "b", &t[MBI_B], MBI_B, &b));
    FG_TRY(view(op, "da", &t[MBI_DA], MBI_DA, &da));
    FG_TRY(same_dtypes(op, t, names));
    int64_t batch;
    FG_TRY(batch_of(op, &t[MBI_DC], "dc", &t[MBI_B], "b", &batch));
    if (t[MBI_DC].rank == 2 && t[MBI_B].rank == 3)
        return fg_fail(FG_ERR_SHAPE, "%s: b is 3-D but dc is 2-D", op);
    FG_TRY(dim_eq(op, "b.shape[-1]", b.cols, "dc.shape[-1]", dc.cols));
    return lower_grad(op, d, "da", dc, transposed(b), da, batch, t[MBI_DA].rank, t[MBI_DC].rank, out);
}

static fg_status lower_backward_other(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "matmul_backward_other";
    static const char *const names[] = {"a", "dc", "db"};
    const fg_tensor *t = d->operands;
    mat3 a, dc, db;
    FG_TRY(view(op, "a", &t[MBO_A], MBO_A, &a));
    FG_TRY(view(op, "dc", &t[MBO_DC], MBO_DC, &dc));
    FG_TRY(view(op, "db", &t[MBO_DB], MBO_DB, &db));
    FG_TRY(same_dtypes(op, t, names));
    int64_t batch;
    FG_TRY(batch_of(op, &t[MBO_A], "a", &t[MBO_DC], "dc", &batch));
    if (t[MBO_DC].rank == 2 && t[MBO_A].rank == 3)
        return fg_fail(FG_ERR_SHAPE, "%s: a is 3-D but dc is 2-D", op);
    FG_TRY(dim_eq(op, "a.shape[-2]", a.rows, "dc.shape[-2]", dc.rows));
    return lower_grad(op, d, "db", transposed(a), dc, db, batch, t[MBO_DB].rank, t[MBO_DC].rank, out);
}

static const fg_op_decl ops[] = {
    {FG_OP_MATMUL_FORWARD, "matmul_forward", 3,
     {[MF_A] = {"a", false, false}, [MF_B] = {"b", false, false}, [MF_C] = {"c", true, false}},
     0, NULL, 0, false, lower_forward},
    {FG_OP_MATMUL_BACKWARD_INPUT, "matmul_backward_input", 3,
     {[MBI_DC] = {"dc", false, false}, [MBI_B] = {"b", false, false}, [MBI_DA] = {"da", true, false}},
     0, NULL, 0, false, lower_backward_input},
    {FG_OP_MATMUL_BACKWARD_OTHER, "matmul_backward_other", 3,
     {[MBO_A] = {"a", false, false}, [MBO_DC] = {"dc", false, false}, [MBO_DB] = {"db", true, false}},
     0, NULL, 0, false, lower_backward_other},
};

const fg_family fg_family_matmul = {"matmul", sizeof ops / sizeof ops[0], ops};

fg_status fg_matmul_forward(fg_context *ctx, const fg_tensor *a, const fg_tensor *b,
                            const fg_tensor *c) {
    const fg_tensor *args[] = {a, b, c};
    return fg_run_op(ctx, FG_OP_MATMUL_FORWARD, NULL, args, 3, 0, 0);
}

fg_status fg_matmul_backward_input(fg_context *ctx, const fg_tensor *dc, const fg_tensor *b,
                                   const fg_tensor *da, int accumulate) {
    const fg_tensor *args[] = {dc, b, da};
    return fg_run_op(ctx, FG_OP_MATMUL_BACKWARD_INPUT, NULL, args, 3, accumulate, 0);
}

fg_status fg_matmul_backward_other(fg_context *ctx, const fg_tensor *a, const fg_tensor *dc,
                                   const fg_tensor *db, int accumulate) {
    const fg_tensor *args[] = {a, dc, db};
    return fg_run_op(ctx, FG_OP_MATMUL_BACKWARD_OTHER, NULL, args, 3, accumulate, 0);
}

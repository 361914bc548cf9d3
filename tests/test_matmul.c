/*
 * test_matmul.c — the Matmul family on every backend present and every dtype:
 * 2-D and batched 3-D products, a 2-D operand broadcast across the batch, both
 * backward kernels (summing over the batch for a broadcast operand), with and without
 * accumulate, column-major and padded layouts, finite differences in f64, bad input.
 */
#include "harness.h"

#include <math.h>

typedef struct mcase {
    int64_t batch; /* 0: both operands 2-D */
    int a3, b3;    /* which operands are 3-D */
    int64_t m, k, n;
    int layout;
} mcase;

static const mcase cases[] = {
    {0, 0, 0, 1, 1, 1, 0},    {0, 0, 0, 3, 17, 5, 0},   {0, 0, 0, 127, 33, 65, 1},
    {4, 1, 1, 17, 31, 9, 0},  {3, 1, 0, 20, 7, 13, 0},  {5, 0, 1, 6, 19, 11, 0},
    {2, 1, 1, 33, 64, 40, 2}, {3, 1, 0, 9, 12, 8, 2},   {4, 0, 1, 1, 16, 24, 0},
    {3, 1, 0, 1, 1000, 3, 0}, {2, 1, 1, 1, 129, 1, 3}, {6, 0, 1, 7, 5, 3, 1},
    {0, 0, 0, 1, 1031, 257, 0}, {2, 1, 0, 0, 3, 4, 0},
    /* a 2-D a against a batch: backward_input sums the batch into da, many rows of <= 16 (the CPU's
       narrow product over the batches' k) */
    {3, 0, 1, 4103, 16, 16, 0}, {2, 0, 1, 5101, 13, 20, 1},
    /* batched, few outputs over a long reduction: CUDA's skinny product per batch (misaligned) */
    {2, 1, 1, 4500, 12, 20, 3},
};

static void shape3(int is3, int64_t batch, int64_t r, int64_t c, int64_t *s, int *rank) {
    if (is3) { s[0] = batch; s[1] = r; s[2] = c; *rank = 3; }
    else { s[0] = r; s[1] = c; *rank = 2; }
}

/* value of a [(B,)r,c] operand at batch b (broadcast when 2-D) */
static double at(const th_operand *o, int is3, int64_t b, int64_t i, int64_t j, int64_t r, int64_t c) {
    (void)r;
    return o->v[(is3 ? b * r * c : 0) + i * c + j];
}

static void run_case(fg_context *ctx, fg_backend be, fg_dtype dt, const mcase *c) {
    const int64_t B = c->batch ? c->batch : 1, m = c->m, k = c->k, n = c->n;
    const int c3 = c->a3 || c->b3;
    int64_t as[3], bs[3], cs[3];
    int ar, br, cr;
    shape3(c->a3, B, m, k, as, &ar);
    shape3(c->b3, B, k, n, bs, &br);
    shape3(c3, B, m, n, cs, &cr);
    char label[160];
    snprintf(label, sizeof label, "[%s %s B=%lld a%dD b%dD m=%lld k=%lld n=%lld layout=%d]", th_backend_name(be),
             fg_dtype_name(dt), (long long)B, ar, br, (long long)m, (long long)k, (long long)n, c->layout);
    const double tol = th_tol(dt, false);
    th_operand a = th_make(be, dt, ar, as, c->layout), b = th_make(be, dt, br, bs, c->layout);
    th_operand cc = th_make(be, dt, cr, cs, c->layout == 2 ? 0 : c->layout);
    th_operand dc = th_make(be, dt, cr, cs, c->layout);
    th_operand da = th_make(be, dt, ar, as, c->layout), db = th_make(be, dt, br, bs, c->layout);
    th_randomize(&a);
    th_randomize(&b);
    th_randomize(&dc);
    double *ref = calloc((size_t)(B * (m * n + m * k + k * n) + 1), sizeof(double));

    for (int64_t q = 0; q < B; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) s += at(&a, c->a3, q, i, p, m, k) * at(&b, c->b3, q, p, j, k, n);
                ref[(c3 ? q * m * n : 0) + i * n + j] = s;
            }
    th_poison(&cc.buf);
    TH_OK(fg_matmul_forward(ctx, &a.t, &b.t, &cc.t));
    th_verify("matmul_forward", &cc, ref, tol, label);

    for (int acc = 0; acc < 2; acc++) {
        memset(ref, 0, sizeof(double) * (size_t)(B * m * k + 1));
        for (int64_t q = 0; q < B; q++) /* da = dc·bᵀ, summed over the batch when a is 2-D */
            for (int64_t i = 0; i < m; i++)
                for (int64_t p = 0; p < k; p++) {
                    double s = 0;
                    for (int64_t j = 0; j < n; j++) s += at(&dc, c3, q, i, j, m, n) * at(&b, c->b3, q, p, j, k, n);
                    ref[(c->a3 ? q * m * k : 0) + i * k + p] += s;
                }
        th_prepare_out(&da, ref, acc);
        TH_OK(fg_matmul_backward_input(ctx, &dc.t, &b.t, &da.t, acc));
        th_verify(acc ? "backward_input+acc" : "backward_input", &da, ref, tol, label);

        memset(ref, 0, sizeof(double) * (size_t)(B * k * n + 1));
        for (int64_t q = 0; q < B; q++) /* db = aᵀ·dc, summed over the batch when b is 2-D */
            for (int64_t p = 0; p < k; p++)
                for (int64_t j = 0; j < n; j++) {
                    double s = 0;
                    for (int64_t i = 0; i < m; i++) s += at(&a, c->a3, q, i, p, m, k) * at(&dc, c3, q, i, j, m, n);
                    ref[(c->b3 ? q * k * n : 0) + p * n + j] += s;
                }
        th_prepare_out(&db, ref, acc);
        TH_OK(fg_matmul_backward_other(ctx, &a.t, &dc.t, &db.t, acc));
        th_verify(acc ? "backward_other+acc" : "backward_other", &db, ref, tol, label);
    }
    free(ref);
    th_operand *all[] = {&a, &b, &cc, &dc, &da, &db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

static fg_status fd_matmul_forward(fg_context *ctx, void *arg) {
    th_operand **o = arg;
    return fg_matmul_forward(ctx, &o[0]->t, &o[1]->t, &o[2]->t);
}

static void finite_differences(fg_context *ctx, fg_backend be) {
    const int64_t as[3] = {3, 4, 5}, bs[2] = {5, 2}, cs[3] = {3, 4, 2}; /* b broadcast */
    th_operand a = th_make(be, FG_F64, 3, as, 0), b = th_make(be, FG_F64, 2, bs, 0);
    th_operand c = th_make(be, FG_F64, 3, cs, 0), r = th_make(be, FG_F64, 3, cs, 0);
    th_operand da = th_make(be, FG_F64, 3, as, 0), db = th_make(be, FG_F64, 2, bs, 0);
    th_randomize(&a);
    th_randomize(&b);
    th_randomize(&r);
    TH_OK(fg_matmul_backward_input(ctx, &r.t, &b.t, &da.t, 0));
    TH_OK(fg_matmul_backward_other(ctx, &a.t, &r.t, &db.t, 0));
    th_operand *params[2] = {&a, &b}, *grads[2] = {&da, &db};
    static const char *const names[2] = {"da", "db"};
    th_operand *fa[3] = {&a, &b, &c};
    th_fd_check(ctx, th_backend_name(be), fd_matmul_forward, fa, &c, &r, params, grads, names, 2, 4, true);
    th_operand *all[] = {&a, &b, &c, &r, &da, &db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

static void bad_input(fg_context *ctx, fg_backend be) {
    const int64_t as[3] = {2, 4, 5}, bs[3] = {3, 5, 6}, b2[2] = {5, 6}, cs[3] = {2, 4, 6}, c2[2] = {4, 6};
    th_operand a = th_make(be, FG_F32, 3, as, 0), b = th_make(be, FG_F32, 3, bs, 0), bb = th_make(be, FG_F32, 2, b2, 0);
    th_operand c = th_make(be, FG_F32, 3, cs, 0), cc = th_make(be, FG_F32, 2, c2, 0);
    th_randomize(&a);
    th_randomize(&b);
    th_randomize(&bb);
    th_poison(&c.buf);
    th_poison(&cc.buf);
    fg_tensor t;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "b.shape[0]=3", &c, fg_matmul_forward(ctx, &a.t, &b.t, &c.t));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "c.rank=2", &cc, fg_matmul_forward(ctx, &a.t, &bb.t, &cc.t));
    t = bb.t; t.shape[0] = 4;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "b.shape[-2]=4", &c, fg_matmul_forward(ctx, &a.t, &t, &c.t));
    t = a.t; t.rank = 1;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "a.rank=1", &c, fg_matmul_forward(ctx, &t, &bb.t, &c.t));
    t = bb.t; t.dtype = FG_BF16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "b.dtype=bf16", &c, fg_matmul_forward(ctx, &a.t, &t, &c.t));
    t = a.t; t.data = NULL;
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "a.data", &c, fg_matmul_forward(ctx, &t, &bb.t, &c.t));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "dc", &cc, fg_matmul_backward_input(ctx, NULL, &bb.t, &cc.t, 0));
    t = c.t; t.shape[0] = (int64_t)1 << 62; t.shape[1] = 4; t.shape[2] = 6;
    TH_EXPECT_BAD(FG_ERR_OVERFLOW, "c", &cc, fg_matmul_forward(ctx, &a.t, &bb.t, &t));
    /* a 3-D gradient for a 2-D product */
    TH_EXPECT_BAD(FG_ERR_SHAPE, "3-D", &c, fg_matmul_backward_other(ctx, &cc.t, &cc.t, &c.t, 0));
    /* an output overlapping an input: c of the right shape, starting inside a (and one
       element into it), and a 1-row c over b's first row */
    t = c.t; t.data = a.t.data;
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps a", &a, fg_matmul_forward(ctx, &a.t, &bb.t, &t));
    t.data = (char *)a.t.data + fg_dtype_size(a.t.dtype);
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps a", &a, fg_matmul_forward(ctx, &a.t, &bb.t, &t));
    {
        int64_t one_row[2] = {1, bb.t.shape[1]}, a_row[2] = {1, bb.t.shape[0]};
        fg_tensor row = fg_tensor_make(bb.t.data, FG_F32, 2, one_row), arow = fg_tensor_make(a.t.data, FG_F32, 2, a_row);
        TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps b", &bb, fg_matmul_forward(ctx, &arow, &bb.t, &row));
    }
    /* an output that overlaps itself: batch stride 0 (it was summed over the batch) */
    t = c.t;
    t.stride[2] = 1, t.stride[1] = t.shape[2], t.stride[0] = 0;
    TH_EXPECT_BAD(FG_ERR_ALIAS, "zero stride", &c, fg_matmul_forward(ctx, &a.t, &b.t, &t));
    th_operand *all[] = {&a, &b, &bb, &c, &cc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

int main(void) {
    th_init("test_matmul");
    fg_backend bes[2];
    int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        for (int di = 0; di < 4; di++)
            for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
                run_case(ctx, bes[bi], th_dtypes[di], &cases[ci]);
        finite_differences(ctx, bes[bi]);
        bad_input(ctx, bes[bi]);
        TH_OK(fg_context_check(ctx));
        fg_context_destroy(ctx);
    }
    return th_finish("test_matmul");
}

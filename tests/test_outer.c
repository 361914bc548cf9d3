/*
 * test_outer.c — the Outer family on every backend present and every dtype: z = x ⊗ y
 * and both GEMV backward kernels (with and without accumulate), strided vectors,
 * column-major and padded z, misaligned data, finite differences in f64, bad input.
 */
#include "harness.h"

#include <math.h>

typedef struct ocase { int64_t n, m; int layout; int64_t vstride; } ocase;

static const ocase cases[] = {
    {1, 1, 0, 1},     {3, 17, 0, 1},    {127, 1, 0, 1},   {1, 1000, 0, 1},  {1037, 129, 0, 1},
    {33, 64, 1, 1},   {65, 40, 2, 1},   {1024, 257, 3, 1}, {19, 23, 0, 3},   {4096, 8, 0, 1},
    {8, 4099, 2, 2},  {0, 5, 0, 1},
};

static th_operand vec(fg_backend be, fg_dtype dt, int64_t n, int64_t stride, int layout) {
    if (stride == 1) return th_make(be, dt, 1, &n, layout == 3 ? 3 : 0);
    th_operand o;
    int64_t st[1] = {stride};
    o.n = n;
    o.buf = th_alloc(be, dt, n * stride + 1);
    o.t = th_tensor(&o.buf, 0, 1, &n, st);
    o.v = calloc((size_t)(n ? n : 1), sizeof(double));
    return o;
}

static void run_case(fg_context *ctx, fg_backend be, fg_dtype dt, const ocase *c) {
    const int64_t n = c->n, m = c->m, zs[2] = {n, m};
    char label[128];
    snprintf(label, sizeof label, "[%s %s n=%lld m=%lld layout=%d stride=%lld]", th_backend_name(be), fg_dtype_name(dt),
             (long long)n, (long long)m, c->layout, (long long)c->vstride);
    const double tol = th_tol(dt, false);
    th_operand x = vec(be, dt, n, c->vstride, c->layout), y = vec(be, dt, m, c->vstride, c->layout);
    th_operand dx = vec(be, dt, n, c->vstride, c->layout), dy = vec(be, dt, m, c->vstride, c->layout);
    th_operand z = th_make(be, dt, 2, zs, c->layout), dz = th_make(be, dt, 2, zs, c->layout);
    th_randomize(&x);
    th_randomize(&y);
    th_randomize(&dz);
    double *ref = calloc((size_t)(n * m + n + m + 1), sizeof(double));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) ref[i * m + j] = x.v[i] * y.v[j];
    th_poison(&z.buf);
    TH_OK(fg_outer_forward(ctx, &x.t, &y.t, &z.t));
    th_verify("outer_forward", &z, ref, tol, label);
    for (int acc = 0; acc < 2; acc++) {
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t j = 0; j < m; j++) s += dz.v[i * m + j] * y.v[j];
            ref[i] = s;
        }
        th_prepare_out(&dx, ref, acc);
        TH_OK(fg_outer_backward_input(ctx, &dz.t, &y.t, &dx.t, acc));
        th_verify(acc ? "backward_input+acc" : "backward_input", &dx, ref, tol, label);
        for (int64_t j = 0; j < m; j++) {
            double s = 0;
            for (int64_t i = 0; i < n; i++) s += dz.v[i * m + j] * x.v[i];
            ref[j] = s;
        }
        th_prepare_out(&dy, ref, acc);
        TH_OK(fg_outer_backward_other(ctx, &dz.t, &x.t, &dy.t, acc));
        th_verify(acc ? "backward_other+acc" : "backward_other", &dy, ref, tol, label);
    }
    free(ref);
    th_operand *all[] = {&x, &y, &dx, &dy, &z, &dz};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

static fg_status fd_outer_forward(fg_context *ctx, void *arg) {
    th_operand **o = arg;
    return fg_outer_forward(ctx, &o[0]->t, &o[1]->t, &o[2]->t);
}

static void finite_differences(fg_context *ctx, fg_backend be) {
    const int64_t n = 5, m = 4, zs[2] = {n, m};
    th_operand x = th_make(be, FG_F64, 1, &n, 0), y = th_make(be, FG_F64, 1, &m, 0);
    th_operand z = th_make(be, FG_F64, 2, zs, 0), r = th_make(be, FG_F64, 2, zs, 0);
    th_operand dx = th_make(be, FG_F64, 1, &n, 0), dy = th_make(be, FG_F64, 1, &m, 0);
    th_randomize(&x);
    th_randomize(&y);
    th_randomize(&r);
    TH_OK(fg_outer_backward_input(ctx, &r.t, &y.t, &dx.t, 0));
    TH_OK(fg_outer_backward_other(ctx, &r.t, &x.t, &dy.t, 0));
    th_operand *params[2] = {&x, &y}, *grads[2] = {&dx, &dy};
    static const char *const names[2] = {"dx", "dy"};
    th_operand *fa[3] = {&x, &y, &z};
    th_fd_check(ctx, th_backend_name(be), fd_outer_forward, fa, &z, &r, params, grads, names, 2, 0, true);
    th_operand *all[] = {&x, &y, &z, &r, &dx, &dy};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

static void bad_input(fg_context *ctx, fg_backend be) {
    const int64_t n = 6, m = 4, zs[2] = {n, m};
    th_operand x = th_make(be, FG_F32, 1, &n, 0), y = th_make(be, FG_F32, 1, &m, 0), z = th_make(be, FG_F32, 2, zs, 0);
    th_operand dx = th_make(be, FG_F32, 1, &n, 0);
    th_randomize(&x);
    th_randomize(&y);
    th_randomize(&z);
    th_poison(&dx.buf);
    fg_tensor t;
    t = z.t; t.shape[1] = 5;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "z.shape=[6, 5]", &z, fg_outer_forward(ctx, &x.t, &y.t, &t));
    t = y.t; t.dtype = FG_F64;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "y.dtype=f64", &z, fg_outer_forward(ctx, &x.t, &t, &z.t));
    t = x.t; t.rank = 2; t.shape[1] = 1;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "x.rank=2", &z, fg_outer_forward(ctx, &t, &y.t, &z.t));
    t = y.t; t.shape[0] = 3;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y.shape[0]=3", &dx, fg_outer_backward_input(ctx, &z.t, &t, &dx.t, 0));
    t = dx.t; t.data = (char *)dx.t.data + 2;
    TH_EXPECT_BAD(FG_ERR_MISALIGNED, "dx.data", &dx, fg_outer_backward_input(ctx, &z.t, &y.t, &t, 0));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "dy", &dx, fg_outer_backward_other(ctx, &z.t, &x.t, NULL, 0));
    t = dx.t; t.data = z.t.data; /* dx inside dz */
    TH_EXPECT_BAD(FG_ERR_ALIAS, "dx overlaps dz", &z, fg_outer_backward_input(ctx, &z.t, &y.t, &t, 0));
    th_operand *all[] = {&x, &y, &z, &dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

int main(void) {
    th_init("test_outer");
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
    return th_finish("test_outer");
}

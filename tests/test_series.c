/*
 * test_series.c — the series family on every backend present and every dtype it takes:
 * patching with end padding (a gather: every element compared exactly with the f64 reference
 * of the rounded inputs; series given contiguous, with padded rows, and column-major), its
 * overlap-add backward against a scatter-form reference (with and without accumulate; patches
 * that overlap, leave gaps, skip the series' tail or read mostly padding; f32 bits equal on the
 * CUDA and CPU backends, as the backends document), the regression losses (MSE, MAE, Huber;
 * mean, sum, none; with and without the gradient, accumulate, grad_scale, an f32 gradient of
 * low-precision predictions; sizes around the 4096-element chunks; ties where MAE's gradient is
 * 0; the mean of nothing is NaN), the windows gathered from a series (an exact copy from series
 * given contiguous, with padded rows and column-major; i32 and i64 starts; no windows; starts out
 * of range: their windows NaN, the others intact, and fg_context_check naming the first one),
 * run-to-run bits, finite differences in f64, and bad input that writes nothing.
 */
#include "harness.h"

#include <math.h>

/* ------------------------------------------------------------------ helpers */

/* Every element within 4·tol·(|ref| + mean |ref|): a norm alone hides one wrong element. */
static void check_each(const char *what, th_operand *o, const double *ref, double tol, const char *label) {
    double *got = malloc((size_t)(o->n ? o->n : 1) * sizeof(double));
    th_get(&o->buf, &o->t, got);
    double mean = 0;
    for (int64_t i = 0; i < o->n; i++) mean += fabs(ref[i]);
    mean = o->n ? mean / (double)o->n : 0;
    int64_t bad = -1, count = 0;
    for (int64_t i = 0; i < o->n; i++)
        if (!(fabs(got[i] - ref[i]) <= 4 * tol * (fabs(ref[i]) + mean))) {
            if (bad < 0) bad = i;
            count++;
        }
    TH_CHECK(bad < 0, "%s %s: %lld elements off, first %lld: got %.9g ref %.9g", what, label, (long long)count,
             (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
    free(got);
}

static void check_exact(const char *what, th_operand *o, const double *ref, const char *label) {
    double *got = malloc((size_t)(o->n ? o->n : 1) * sizeof(double));
    th_get(&o->buf, &o->t, got);
    int64_t bad = -1;
    for (int64_t i = 0; i < o->n && bad < 0; i++)
        if (!(got[i] == ref[i])) bad = i;
    TH_CHECK(bad < 0, "%s %s: element %lld is %.9g, want exactly %.9g", what, label, (long long)bad,
             bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
    free(got);
}

static bool dtype_runs(fg_backend be, fg_dtype dt) { return !(be == FG_BACKEND_CUDA && dt == FG_F64); }

/* ------------------------------------------------------------------ patching */

typedef struct pcase {
    int64_t lead[2]; /* leading dims (0: absent) */
    int64_t L, S, stride, pad;
    int layout;      /* of the series x / dx: 0 contiguous, 1 padded rows, 2 column-major */
} pcase;

static const pcase pcases[] = {
    {{3, 0}, 336, 16, 8, 8, 0},  /* PatchTST: 42 patches */
    {{1, 0}, 1, 1, 1, 0, 0},     /* one step, one patch */
    {{2, 0}, 5, 3, 2, 0, 1},     /* overlapping, covers the series */
    {{5, 0}, 10, 4, 4, 0, 0},    /* the tail (steps 8, 9) is read by no patch */
    {{4, 0}, 11, 2, 3, 1, 2},    /* gaps between patches, one padded copy read */
    {{2, 3}, 3, 4, 1, 5, 1},     /* mostly padding: every patch reads the last step */
    {{17, 0}, 100, 16, 8, 8, 2}, /* awkward, column-major */
    {{0, 0}, 12, 4, 2, 2, 0},    /* no series at all */
    {{127, 7}, 96, 12, 5, 5, 0}, /* many rows (threads) */
    {{9, 0}, 336, 16, 8, 8, 1},  /* PatchTST, padded rows */
};

static void geometry(const pcase *c, int64_t *rows, int64_t *P) {
    *rows = c->lead[0] * (c->lead[1] ? c->lead[1] : 1);
    *P = (c->L + c->pad - c->S) / c->stride + 1;
}

static void patch_reference(const pcase *c, const double *x, double *y) {
    int64_t rows, P;
    geometry(c, &rows, &P);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < P; p++)
            for (int64_t j = 0; j < c->S; j++) {
                int64_t t = p * c->stride + j;
                if (t > c->L - 1) t = c->L - 1;
                y[(r * P + p) * c->S + j] = x[r * c->L + t];
            }
}

/* The scatter form (an order unlike the kernels' gather), in f64. */
static void unpatch_reference(const pcase *c, const double *dy, double *dx) {
    int64_t rows, P;
    geometry(c, &rows, &P);
    memset(dx, 0, sizeof(double) * (size_t)(rows * c->L + 1));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < P; p++)
            for (int64_t j = 0; j < c->S; j++) {
                int64_t t = p * c->stride + j;
                if (t > c->L - 1) t = c->L - 1;
                dx[r * c->L + t] += dy[(r * P + p) * c->S + j];
            }
}

static void shapes(const pcase *c, int *xr, int64_t *xs, int *pr, int64_t *ps) {
    int64_t rows, P;
    geometry(c, &rows, &P);
    int k = 0;
    xs[k] = ps[k] = c->lead[0], k++;
    if (c->lead[1]) xs[k] = ps[k] = c->lead[1], k++;
    xs[k] = c->L;
    ps[k] = P, ps[k + 1] = c->S;
    *xr = k + 1, *pr = k + 2;
}

static void run_patch(fg_context *ctx, fg_backend be, fg_dtype dt, const pcase *c) {
    int xr, pr;
    int64_t xs[4], ps[4], rows, P;
    shapes(c, &xr, xs, &pr, ps);
    geometry(c, &rows, &P);
    char label[160];
    snprintf(label, sizeof label, "[%s %s rows=%lld L=%lld patch=%lld stride=%lld pad=%lld layout=%d]",
             th_backend_name(be), fg_dtype_name(dt), (long long)rows, (long long)c->L, (long long)c->S,
             (long long)c->stride, (long long)c->pad, c->layout);
    fg_patch_options o = {c->S, c->stride, c->pad};
    th_operand x = th_make(be, dt, xr, xs, c->layout), y = th_make(be, dt, pr, ps, 0);
    th_operand dy = th_make(be, dt, pr, ps, 0), dx = th_make(be, dt, xr, xs, c->layout);
    th_randomize(&x);
    th_randomize(&dy);
    double *ref = calloc((size_t)(y.n + x.n + 1), sizeof(double));
    th_poison(&y.buf);
    TH_OK(fg_patch_forward(ctx, &o, &x.t, &y.t));
    patch_reference(c, x.v, ref);
    check_exact("patch_forward", &y, ref, label);
    for (int acc = 0; acc < 2; acc++) {
        unpatch_reference(c, dy.v, ref);
        th_prepare_out(&dx, ref, acc);
        TH_OK(fg_patch_backward(ctx, &o, &dy.t, &dx.t, acc));
        th_verify(acc ? "patch_backward+acc" : "patch_backward", &dx, ref, th_tol(dt, false), label);
        check_each(acc ? "patch_backward+acc" : "patch_backward", &dx, ref, th_tol(dt, false), label);
    }
    /* run to run the same bits; f32 on CUDA: the CPU backend's bits */
    TH_OK(fg_patch_backward(ctx, &o, &dy.t, &dx.t, 0));
    void *first = th_snapshot(&dx.buf);
    TH_OK(fg_patch_backward(ctx, &o, &dy.t, &dx.t, 0));
    TH_CHECK(th_unchanged(&dx.buf, first), "patch_backward %s: not the same bits run to run", label);
    if (be == FG_BACKEND_CUDA && dt == FG_F32 && dx.n > 0) {
        fg_context *cpu = th_context(FG_BACKEND_CPU, false);
        th_operand hdy = th_make(FG_BACKEND_CPU, dt, pr, ps, 0), hdx = th_make(FG_BACKEND_CPU, dt, xr, xs, 0);
        th_put(&hdy.buf, &hdy.t, dy.v);
        TH_OK(fg_patch_backward(cpu, &o, &hdy.t, &hdx.t, 0));
        double *a = malloc(sizeof(double) * (size_t)dx.n), *b = malloc(sizeof(double) * (size_t)dx.n);
        th_get(&hdx.buf, &hdx.t, a);
        th_get(&dx.buf, &dx.t, b);
        TH_CHECK(memcmp(a, b, sizeof(double) * (size_t)dx.n) == 0, "patch_backward %s: CUDA and CPU bits differ", label);
        free(a), free(b);
        th_drop(&hdy), th_drop(&hdx);
        fg_context_destroy(cpu);
    }
    free(first), free(ref);
    th_drop(&x), th_drop(&y), th_drop(&dy), th_drop(&dx);
}

/* ------------------------------------------------------------------ regression loss */

typedef struct lcase {
    int64_t n; /* elements, as [n] or [n/7, 7] */
    fg_loss_kind kind;
    fg_reduction red;
    double delta, grad_scale;
} lcase;

static double point(fg_loss_kind kind, double delta, double e, double *g) {
    const double a = fabs(e), sg = e > 0 ? 1.0 : e < 0 ? -1.0 : 0.0;
    if (kind == FG_LOSS_MAE) return *g = sg, a;
    if (kind == FG_LOSS_HUBER) {
        if (a <= delta) return *g = e, 0.5 * e * e;
        return *g = delta * sg, delta * (a - 0.5 * delta);
    }
    return *g = 2 * e, e * e;
}

static void run_loss(fg_context *ctx, fg_backend be, fg_dtype dt, const lcase *c, bool want_grad, int acc,
                     fg_dtype gdt) {
    const int64_t n = c->n;
    const bool two = n % 7 == 0 && n > 0;
    const int rank = two ? 2 : 1;
    const int64_t shape[2] = {two ? n / 7 : n, 7}, one[1] = {1};
    const fg_dtype at = dt == FG_F64 ? FG_F64 : FG_F32;
    static const char *const kinds[] = {"mse", "mae", "huber"};
    char label[192];
    snprintf(label, sizeof label, "[%s %s n=%lld %s %s delta=%g scale=%g grad=%s acc=%d]", th_backend_name(be),
             fg_dtype_name(dt), (long long)n, kinds[c->kind],
             c->red == FG_REDUCTION_MEAN ? "mean" : c->red == FG_REDUCTION_SUM ? "sum" : "none", c->delta,
             c->grad_scale, want_grad ? fg_dtype_name(gdt) : "none", acc);
    th_operand pred = th_make(be, dt, rank, shape, 0), target = th_make(be, dt, rank, shape, 0);
    th_operand dpred = th_make(be, gdt, rank, shape, 0);
    th_operand loss = c->red == FG_REDUCTION_NONE ? th_make(be, at, rank, shape, 0) : th_make(be, at, 1, one, 0);
    th_randomize(&pred);
    th_randomize(&target);
    for (int64_t i = 0; i < n; i += 5) target.v[i] = pred.v[i]; /* ties: MAE's gradient is 0 there */
    th_put(&target.buf, &target.t, target.v);
    const double gs = c->grad_scale != 0 ? c->grad_scale : 1.0, delta = c->delta > 0 ? c->delta : 1.0;
    double *lref = calloc((size_t)(n + 1), sizeof(double)), *gref = calloc((size_t)(n + 1), sizeof(double));
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        double g;
        lref[i] = point(c->kind, delta, pred.v[i] - target.v[i], &g);
        total += lref[i];
        gref[i] = gs * g / (c->red == FG_REDUCTION_MEAN ? (double)n : 1.0);
    }
    if (c->red == FG_REDUCTION_SUM) lref[0] = total;
    if (c->red == FG_REDUCTION_MEAN) lref[0] = n ? total / (double)n : NAN;
    fg_regression_loss_options o = {c->kind, c->red, c->delta, c->grad_scale};
    th_poison(&loss.buf);
    if (want_grad) th_prepare_out(&dpred, gref, acc);
    TH_OK(fg_regression_loss(ctx, &o, &pred.t, &target.t, &loss.t, want_grad ? &dpred.t : NULL, acc));
    if (c->red == FG_REDUCTION_MEAN && n == 0) {
        double got = 0;
        th_get(&loss.buf, &loss.t, &got);
        TH_CHECK(isnan(got), "loss %s: the mean of nothing is %g, not NaN", label, got);
    } else {
        /* per-element losses in the accumulator type, chunk sums in it, the chunks in f64 */
        th_verify("loss", &loss, lref, th_tol(at, false), label);
        check_each("loss", &loss, lref, th_tol(at, false), label);
    }
    if (want_grad) {
        th_verify("dpred", &dpred, gref, th_tol(gdt == FG_F32 ? dt : gdt, false), label);
        check_each("dpred", &dpred, gref, th_tol(gdt == FG_F32 ? dt : gdt, false), label);
    }
    if (!acc) { /* run to run: the same bits */
        void *l1 = th_snapshot(&loss.buf), *g1 = th_snapshot(&dpred.buf);
        TH_OK(fg_regression_loss(ctx, &o, &pred.t, &target.t, &loss.t, want_grad ? &dpred.t : NULL, 0));
        TH_CHECK(th_unchanged(&loss.buf, l1) && th_unchanged(&dpred.buf, g1), "regression_loss %s: bits differ run to run",
                 label);
        free(l1), free(g1);
    }
    free(lref), free(gref);
    th_drop(&pred), th_drop(&target), th_drop(&dpred), th_drop(&loss);
}

static const lcase lcases[] = {
    {1, FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0},      {3, FG_LOSS_MAE, FG_REDUCTION_MEAN, 0, 0},
    {17, FG_LOSS_MSE, FG_REDUCTION_SUM, 0, 0.5},    {4095, FG_LOSS_MAE, FG_REDUCTION_SUM, 0, 0},
    {4096, FG_LOSS_MSE, FG_REDUCTION_NONE, 0, 2},   {4097, FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, -3},
    {8603, FG_LOSS_MAE, FG_REDUCTION_NONE, 0, 0},   {86016, FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0}, /* 128·7·96 */
    {1001, FG_LOSS_HUBER, FG_REDUCTION_MEAN, 0, 0}, {12289, FG_LOSS_HUBER, FG_REDUCTION_SUM, 0.3, 1.5},
    {999, FG_LOSS_HUBER, FG_REDUCTION_NONE, 0.05, 0},
    {0, FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0},      {0, FG_LOSS_MAE, FG_REDUCTION_SUM, 0, 0},
    {2000003, FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0}, /* hundreds of chunks */
};

/* ------------------------------------------------------------------ windows of a series */

/* starts [B] as i32 or i64 on the backend, from host values. */
static th_buf starts_buf(fg_backend be, fg_dtype it, const int64_t *v, int64_t B, fg_tensor *t) {
    th_buf b = th_alloc(be, it, B + 1);
    if (it == FG_I32) {
        int32_t *h = calloc((size_t)B + 1, sizeof *h);
        for (int64_t i = 0; i < B; i++) h[i] = (int32_t)v[i];
        th_put_raw(&b, h, sizeof *h * (size_t)B);
        free(h);
    } else {
        th_put_raw(&b, v, sizeof *v * (size_t)B);
    }
    *t = th_tensor(&b, 0, 1, &B, NULL);
    return b;
}

typedef struct wcase {
    int64_t T, C, B, W;
    int layout; /* the series: 0 contiguous, 1 padded rows, 2 column-major */
} wcase;

static const wcase wcases[] = {
    {100, 7, 16, 48, 0}, {100, 7, 16, 48, 2}, {57, 3, 5, 57, 1}, {20, 1, 9, 1, 0}, {431, 7, 128, 96, 2},
    {30, 4, 0, 10, 0}, /* no windows */
};

static void run_windows(fg_context *ctx, fg_backend be, fg_dtype dt, const wcase *c, fg_dtype it, bool bad_starts) {
    char label[160];
    snprintf(label, sizeof label, "[%s %s T=%lld C=%lld B=%lld W=%lld layout=%d starts %s%s]", th_backend_name(be),
             fg_dtype_name(dt), (long long)c->T, (long long)c->C, (long long)c->B, (long long)c->W, c->layout,
             fg_dtype_name(it), bad_starts ? ", two out of range" : "");
    const int64_t xs[2] = {c->T, c->C}, ys[3] = {c->B, c->W, c->C};
    th_operand x = th_make(be, dt, 2, xs, c->layout), y = th_make(be, dt, 3, ys, 0);
    th_randomize(&x);
    int64_t *st = calloc((size_t)c->B + 1, sizeof *st);
    for (int64_t b = 0; b < c->B; b++) st[b] = (int64_t)(th_rand_u64() % (uint64_t)(c->T - c->W + 1));
    if (c->B > 0) st[c->B - 1] = c->T - c->W; /* the last start there is */
    const int64_t bad_a = c->B > 3 ? 3 : -1, bad_b = c->B > 5 ? 5 : -1;
    if (bad_starts && bad_a >= 0) st[bad_a] = -1;
    if (bad_starts && bad_b >= 0) st[bad_b] = c->T - c->W + 1;
    fg_tensor tst;
    th_buf sb = starts_buf(be, it, st, c->B, &tst);
    th_poison(&y.buf);
    TH_OK(fg_series_windows(ctx, &x.t, &tst, &y.t));
    const fg_status chk = fg_context_check(ctx);
    double *got = malloc(sizeof(double) * (size_t)(y.n + 1));
    th_get(&y.buf, &y.t, got);
    int64_t wrong = -1;
    for (int64_t b = 0; b < c->B && wrong < 0; b++) {
        const bool nan_window = bad_starts && (b == bad_a || b == bad_b);
        for (int64_t k = 0; k < c->W * c->C && wrong < 0; k++) {
            const double g = got[b * c->W * c->C + k];
            if (nan_window ? !isnan(g) : !(g == x.v[(st[b] + k / c->C) * c->C + k % c->C])) wrong = b * c->W * c->C + k;
        }
    }
    TH_CHECK(wrong < 0, "series_windows %s: element %lld is %.9g", label, (long long)wrong, wrong >= 0 ? got[wrong] : 0.0);
    if (bad_starts && bad_a >= 0) {
        TH_CHECK(chk == FG_ERR_DEVICE_VALUE && strstr(fg_last_error(), "starts[3]") != NULL,
                 "series_windows %s: context_check gave %s '%s', want FG_ERR_DEVICE_VALUE naming starts[3]", label,
                 fg_status_string(chk), fg_last_error());
        TH_OK(fg_context_check(ctx)); /* the flag is cleared */
    } else {
        TH_CHECK(chk == FG_OK, "series_windows %s: context_check gave %s '%s'", label, fg_status_string(chk),
                 fg_last_error());
    }
    free(got), free(st);
    th_free(&sb);
    th_drop(&x), th_drop(&y);
}

static void windows_bad_input(fg_context *ctx, fg_backend be) {
    const int64_t xs[2] = {50, 4}, ys[3] = {6, 10, 4}, st[6] = {0, 1, 2, 3, 4, 40};
    th_operand x = th_make(be, FG_F32, 2, xs, 0), y = th_make(be, FG_F32, 3, ys, 0);
    th_randomize(&x), th_poison(&y.buf);
    fg_tensor ts, t, u;
    th_buf sb = starts_buf(be, FG_I64, st, 6, &ts);
    u = ts, u.dtype = FG_F32;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "starts.dtype=f32", &y, fg_series_windows(ctx, &x.t, &u, &y.t));
    t = y.t, t.shape[0] = 5;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y.shape=[5, 10, 4]", &y, fg_series_windows(ctx, &x.t, &ts, &t));
    t = y.t, t.shape[2] = 3;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y.shape=[6, 10, 3]", &y, fg_series_windows(ctx, &x.t, &ts, &t));
    t = x.t, t.shape[0] = 9; /* windows of W = 10 from T = 9 */
    TH_EXPECT_BAD(FG_ERR_SHAPE, "W=10", &y, fg_series_windows(ctx, &t, &ts, &y.t));
    t = y.t, t.dtype = FG_BF16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "y.dtype=bf16", &y, fg_series_windows(ctx, &x.t, &ts, &t));
    t = y.t, t.stride[0] = 40, t.stride[1] = 1, t.stride[2] = 10; /* y must be contiguous */
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "y", &y, fg_series_windows(ctx, &x.t, &ts, &t));
    u = ts, u.shape[0] = 3, u.stride[0] = 2; /* strided starts */
    t = y.t, t.shape[0] = 3;
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "starts", &y, fg_series_windows(ctx, &x.t, &u, &t));
    t = x.t, t.rank = 3, t.shape[2] = 1;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "series", &y, fg_series_windows(ctx, &t, &ts, &y.t));
    t = y.t, t.data = x.t.data; /* y over the series */
    TH_EXPECT_BAD(FG_ERR_ALIAS, "y", &x, fg_series_windows(ctx, &x.t, &ts, &t));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "starts", &y, fg_series_windows(ctx, &x.t, NULL, &y.t));
    {
        fg_plan_desc d;
        memset(&d, 0, sizeof d);
        d.op = FG_OP_SERIES_WINDOWS;
        d.accumulate = 1;
        d.operands[0] = x.t, d.operands[1] = ts, d.operands[2] = y.t;
        d.operands[0].data = d.operands[1].data = d.operands[2].data = NULL;
        fg_plan *plan = NULL;
        TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "accumulate must be 0", &y, fg_plan_create(ctx, &d, &plan));
    }
    TH_OK(fg_context_check(ctx)); /* no refusal raised the device flag */
    th_free(&sb);
    th_drop(&x), th_drop(&y);
}

/* ------------------------------------------------------------------ finite differences (f64) */

typedef struct fd_arg {
    fg_patch_options *po;
    fg_regression_loss_options *lo;
    th_operand *in, *out, *target;
} fd_arg;

static fg_status fd_patch(fg_context *ctx, void *arg) {
    fd_arg *a = arg;
    return fg_patch_forward(ctx, a->po, &a->in->t, &a->out->t);
}

static fg_status fd_loss(fg_context *ctx, void *arg) {
    fd_arg *a = arg;
    return fg_regression_loss(ctx, a->lo, &a->in->t, &a->target->t, &a->out->t, NULL, 0);
}

static void finite_differences(fg_context *ctx, fg_backend be) {
    if (!dtype_runs(be, FG_F64)) return;
    const pcase c = {{2, 0}, 11, 4, 3, 3, 0};
    int xr, pr;
    int64_t xs[4], ps[4];
    shapes(&c, &xr, xs, &pr, ps);
    fg_patch_options po = {c.S, c.stride, c.pad};
    th_operand x = th_make(be, FG_F64, xr, xs, 0), y = th_make(be, FG_F64, pr, ps, 0);
    th_operand r = th_make(be, FG_F64, pr, ps, 0), dx = th_make(be, FG_F64, xr, xs, 0);
    th_randomize(&x), th_randomize(&r);
    TH_OK(fg_patch_backward(ctx, &po, &r.t, &dx.t, 0));
    fd_arg a = {&po, NULL, &x, &y, NULL};
    th_operand *params[1] = {&x}, *grads[1] = {&dx};
    static const char *const names[1] = {"dx"};
    th_fd_check(ctx, "patch", fd_patch, &a, &y, &r, params, grads, names, 1, 0, true);

    const int64_t n = 23, one[1] = {1};
    th_operand pred = th_make(be, FG_F64, 1, &n, 0), target = th_make(be, FG_F64, 1, &n, 0);
    th_operand loss = th_make(be, FG_F64, 1, one, 0), rl = th_make(be, FG_F64, 1, one, 0);
    th_operand dpred = th_make(be, FG_F64, 1, &n, 0);
    th_randomize(&pred), th_randomize(&target), th_randomize(&rl);
    for (int k = 0; k < 6; k++) {
        /* dpred is the gradient of grad_scale·loss: with grad_scale = r it is what the check wants
           (Huber's δ = 0.2 puts elements on both sides of it) */
        fg_regression_loss_options lo = {(fg_loss_kind)(k % 3), k < 3 ? FG_REDUCTION_MEAN : FG_REDUCTION_SUM, 0.2,
                                         rl.v[0]};
        TH_OK(fg_regression_loss(ctx, &lo, &pred.t, &target.t, &loss.t, &dpred.t, 0));
        fd_arg b = {NULL, &lo, &pred, &loss, &target};
        th_operand *lp[1] = {&pred}, *lg[1] = {&dpred};
        static const char *const ln[1] = {"dpred"};
        static const char *const kn[3] = {"mse", "mae", "huber"};
        th_fd_check(ctx, kn[k % 3], fd_loss, &b, &loss, &rl, lp, lg, ln, 1, 0, false);
    }
    th_operand *all[] = {&x, &y, &r, &dx, &pred, &target, &loss, &rl, &dpred};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

/* ------------------------------------------------------------------ bad input */

static void bad_input(fg_context *ctx, fg_backend be) {
    const int64_t xs[2] = {3, 20}, ps[3] = {3, 3, 8}, one[1] = {1}, two[1] = {2};
    fg_patch_options o = {8, 6, 2}; /* (22 - 8) / 6 + 1 = 3 */
    th_operand x = th_make(be, FG_F32, 2, xs, 0), y = th_make(be, FG_F32, 3, ps, 0), dx = th_make(be, FG_F32, 2, xs, 0);
    th_operand loss = th_make(be, FG_F32, 1, one, 0), t2 = th_make(be, FG_F32, 2, xs, 0);
    th_randomize(&x), th_randomize(&y), th_randomize(&t2);
    th_poison(&dx.buf), th_poison(&loss.buf);
    fg_tensor t;
    fg_patch_options bo = o;
    t = y.t, t.shape[1] = 4;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y.shape=[3, 4, 8]", &y, fg_patch_forward(ctx, &o, &x.t, &t));
    t = y.t, t.shape[2] = 7;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "[..., 3, 8]", &y, fg_patch_forward(ctx, &o, &x.t, &t));
    t = y.t, t.shape[0] = 2;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "differ in dim 0", &y, fg_patch_forward(ctx, &o, &x.t, &t));
    t = y.t, t.dtype = FG_BF16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "y.dtype=bf16", &y, fg_patch_forward(ctx, &o, &x.t, &t));
    bo.patch_len = 23;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "shorter than one patch", &y, fg_patch_forward(ctx, &bo, &x.t, &y.t));
    bo = o, bo.stride = -1;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "stride=-1", &y, fg_patch_forward(ctx, &bo, &x.t, &y.t));
    bo = o, bo.pad_end = INT64_MAX;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "pad_end", &y, fg_patch_forward(ctx, &bo, &x.t, &y.t));
    t = x.t, t.shape[1] = 0;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "L = 0", &y, fg_patch_forward(ctx, &o, &t, &y.t));
    t = y.t, t.stride[0] = 25, t.stride[1] = 8, t.stride[2] = 1; /* patches must be contiguous */
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "y", &y, fg_patch_forward(ctx, &o, &x.t, &t));
    {
        fg_plan_desc d;
        memset(&d, 0, sizeof d);
        d.op = FG_OP_PATCH_FORWARD;
        d.accumulate = 1;
        d.operands[0] = x.t, d.operands[1] = y.t;
        d.operands[0].data = d.operands[1].data = NULL;
        d.options = &o, d.options_size = sizeof o;
        fg_plan *plan = NULL;
        TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "accumulate must be 0", &y, fg_plan_create(ctx, &d, &plan));
    }
    t = dx.t, t.data = y.t.data; /* dx inside dy */
    TH_EXPECT_BAD(FG_ERR_ALIAS, "dx", &y, fg_patch_backward(ctx, &o, &y.t, &t, 0));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "dx", &y, fg_patch_backward(ctx, &o, &y.t, NULL, 0));
    if (be == FG_BACKEND_CUDA) {
        const int64_t s1[1] = {20};
        th_operand x64 = th_make(be, FG_F64, 1, s1, 0), l64 = th_make(be, FG_F64, 1, one, 0);
        th_randomize(&x64), th_poison(&l64.buf);
        TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "no f64 kernels", &l64,
                      fg_regression_loss(ctx, NULL, &x64.t, &x64.t, &l64.t, NULL, 0));
        th_drop(&x64), th_drop(&l64);
    }

    fg_regression_loss_options lo = {FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0};
    t = t2.t, t.shape[1] = 19;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "target.shape=[3, 19]", &loss, fg_regression_loss(ctx, &lo, &x.t, &t, &loss.t, NULL, 0));
    t = t2.t, t.dtype = FG_F16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "target.dtype=f16", &loss, fg_regression_loss(ctx, &lo, &x.t, &t, &loss.t, NULL, 0));
    th_operand loss2 = th_make(be, FG_F32, 1, two, 0);
    th_poison(&loss2.buf);
    TH_EXPECT_BAD(FG_ERR_SHAPE, "loss.shape=[2]", &loss2, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss2.t, NULL, 0));
    t = loss.t, t.dtype = FG_BF16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "loss.dtype=bf16", &loss, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &t, NULL, 0));
    lo.reduction = FG_REDUCTION_NONE;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "loss.shape=[1]", &loss, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, NULL, 0));
    lo.reduction = (fg_reduction)7;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "reduction=7", &loss, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, NULL, 0));
    lo.reduction = FG_REDUCTION_MEAN, lo.kind = (fg_loss_kind)3;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "kind=3", &loss, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, NULL, 0));
    lo.kind = FG_LOSS_HUBER, lo.delta = -1;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "delta=-1", &loss, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, NULL, 0));
    lo.delta = 0, lo.grad_scale = INFINITY;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "grad_scale=inf", &loss,
                  fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, &dx.t, 0));
    lo.grad_scale = 0;
    t = dx.t, t.dtype = FG_BF16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "dpred.dtype=bf16", &loss, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, &t, 0));
    t = dx.t, t.data = x.t.data; /* dpred is pred */
    TH_EXPECT_BAD(FG_ERR_ALIAS, "dpred", &loss, fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, &t, 0));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dpred, which is absent", &loss,
                  fg_regression_loss(ctx, &lo, &x.t, &t2.t, &loss.t, NULL, 1));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "target", &loss, fg_regression_loss(ctx, &lo, &x.t, NULL, &loss.t, NULL, 0));
    th_operand *all[] = {&x, &y, &dx, &loss, &t2, &loss2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

int main(void) {
    th_init("test_series");
    fg_backend bes[2];
    int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        if (!ctx) continue;
        for (int di = 0; di < 4; di++) {
            const fg_dtype dt = th_dtypes[di];
            if (!dtype_runs(bes[bi], dt)) continue;
            for (size_t ci = 0; ci < sizeof pcases / sizeof pcases[0]; ci++) run_patch(ctx, bes[bi], dt, &pcases[ci]);
            for (size_t ci = 0; ci < sizeof lcases / sizeof lcases[0]; ci++) {
                const lcase *lc = &lcases[ci];
                if (lc->n > 1000000 && dt != FG_F32) continue; /* one large case is enough */
                run_loss(ctx, bes[bi], dt, lc, false, 0, dt);
                run_loss(ctx, bes[bi], dt, lc, true, 0, dt);
                if (lc->n < 100000) run_loss(ctx, bes[bi], dt, lc, true, 1, dt);
                if ((dt == FG_BF16 || dt == FG_F16) && lc->n < 100000) run_loss(ctx, bes[bi], dt, lc, true, 1, FG_F32);
            }
        }
        for (int di = 0; di < 4; di++) {
            const fg_dtype dt = th_dtypes[di];
            if (!dtype_runs(bes[bi], dt)) continue;
            for (size_t ci = 0; ci < sizeof wcases / sizeof wcases[0]; ci++)
                for (int k = 0; k < 3; k++)
                    run_windows(ctx, bes[bi], dt, &wcases[ci], k == 1 ? FG_I32 : FG_I64, k == 2);
        }
        finite_differences(ctx, bes[bi]);
        bad_input(ctx, bes[bi]);
        windows_bad_input(ctx, bes[bi]);
        TH_OK(fg_context_check(ctx));
        fg_context_destroy(ctx);
    }
    return th_finish("test_series");
}

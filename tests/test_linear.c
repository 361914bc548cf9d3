/*
 * test_linear.c — the Linear family on every backend present, every dtype, awkward
 * shapes and layouts, against a float64 reference: forward (with and without bias,
 * the single-row GEMV path, misaligned data), the three backward kernels with and
 * without accumulate, finite differences in f64, the plan API, bad input (status,
 * message, untouched output), TF32 opt-in on CUDA, f32 products at the shapes that take
 * the split TF32 tensor-core kernel on sm_90a, and with FG_TEST_LARGE=1 on a GPU tensors
 * past 2^31 elements.
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef FG_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct lcase {
    int lead_rank;
    int64_t lead[3];
    int64_t k, m;
    int layout; /* 0 contiguous, 1 padded rows, 2 w stored transposed, 3 misaligned by one element */
} lcase;

static const lcase cases[] = {
    {1, {1}, 1, 1, 0},        {1, {3}, 17, 5, 0},        {2, {2, 3}, 127, 33, 0},
    {1, {1037}, 129, 65, 0},  {3, {2, 1, 5}, 64, 48, 0},  {1, {1}, 1000, 300, 0},
    {1, {1}, 1003, 257, 0},   {1, {17}, 31, 1, 0},        {1, {45}, 70, 37, 1},
    {2, {4, 9}, 33, 19, 2},   {1, {1}, 1024, 129, 3},    {1, {33}, 64, 40, 3},
    {1, {1}, 515, 1031, 2},  {1, {45}, 70, 37, 2},   {1, {0}, 8, 4, 0},         {1, {6}, 0, 4, 0},
    /* many rows, a short k (the CPU's own f32 short-k product: forward at k <= 32, backward_input at m <= 32) */
    {1, {1037}, 16, 128, 0}, {1, {700}, 20, 129, 1}, {2, {3, 700}, 8, 40, 3}, {1, {1037}, 129, 20, 2},
    /* many rows, few outputs, a longer k (the CPU's own f32 narrow product: forward at m <= 16,
       backward_input at k <= 16; rows not a multiple of its 8-row block) */
    {1, {4103}, 128, 16, 0}, {2, {3, 2731}, 67, 13, 2}, {1, {4103}, 16, 128, 1},
    /* CUDA's skinny weight gradient (m, n <= 128, m·n <= 2048, k >= 4096; 128 x 128 goes to cuBLASLt) misaligned, odd sizes */
    {1, {5001}, 33, 21, 3}, {1, {4500}, 128, 128, 0},
    /* ... at few outputs (16 × 16 misaligned; 20 × 12 over 40000 rows: edge tiles, many slabs) */
    {1, {5001}, 16, 16, 3}, {1, {40000}, 20, 12, 0},
};

/* w [m, k]; layout 2 stores it column-major (as [k, m]). */
static th_operand make_w(fg_backend be, fg_dtype dt, int64_t m, int64_t k, int layout) {
    int64_t shape[2] = {m, k};
    return th_make(be, dt, 2, shape, layout);
}

static void run_case(fg_context *ctx, fg_backend be, fg_dtype dt, const lcase *c, bool tf32) {
    const int xr = c->lead_rank + 1;
    int64_t xs[4], ys[4], n = 1;
    for (int d = 0; d < c->lead_rank; d++) {
        xs[d] = ys[d] = c->lead[d];
        n *= c->lead[d];
    }
    xs[c->lead_rank] = c->k;
    ys[c->lead_rank] = c->m;
    const int64_t k = c->k, m = c->m, bshape[1] = {m};
    char label[200];
    snprintf(label, sizeof label, "[%s %s%s n=%lld k=%lld m=%lld layout=%d]", th_backend_name(be), fg_dtype_name(dt),
             tf32 ? "+tf32" : "", (long long)n, (long long)k, (long long)m, c->layout);
    const double tol = th_tol(dt, tf32);
    /* layout 2 (column-major matrices) applies to w and to 2-D activations; the
       leading dims of a 3-D activation stored that way do not collapse */
    const int al = c->layout == 2 && c->lead_rank > 1 ? 0 : c->layout;
    th_operand x = th_make(be, dt, xr, xs, al), y = th_make(be, dt, xr, ys, al);
    th_operand w = make_w(be, dt, m, k, c->layout), b = th_make(be, dt, 1, bshape, 0);
    th_operand dy = th_make(be, dt, xr, ys, al), dx = th_make(be, dt, xr, xs, al);
    th_operand dw = make_w(be, dt, m, k, c->layout), db = th_make(be, dt, 1, bshape, 0);
    th_randomize(&x);
    th_randomize(&w);
    th_randomize(&b);
    th_randomize(&dy);
    double *ref = calloc((size_t)(n * (m > k ? m : k) + m * k + 1), sizeof(double));

    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double s = with_bias ? b.v[j] : 0.0;
                for (int64_t p = 0; p < k; p++) s += x.v[i * k + p] * w.v[j * k + p];
                ref[i * m + j] = s;
            }
        th_poison(&y.buf);
        TH_OK(fg_linear_forward(ctx, &x.t, &w.t, with_bias ? &b.t : NULL, &y.t));
        th_verify(with_bias ? "linear_forward+bias" : "linear_forward", &y, ref, tol, label);
    }
    for (int acc = 0; acc < 2; acc++) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < k; p++) {
                double s = 0;
                for (int64_t j = 0; j < m; j++) s += dy.v[i * m + j] * w.v[j * k + p];
                ref[i * k + p] = s;
            }
        th_prepare_out(&dx, ref, acc);
        TH_OK(fg_linear_backward_input(ctx, &dy.t, &w.t, &dx.t, acc));
        th_verify(acc ? "backward_input+acc" : "backward_input", &dx, ref, tol, label);

        for (int64_t j = 0; j < m; j++)
            for (int64_t p = 0; p < k; p++) {
                double s = 0;
                for (int64_t i = 0; i < n; i++) s += dy.v[i * m + j] * x.v[i * k + p];
                ref[j * k + p] = s;
            }
        th_prepare_out(&dw, ref, acc);
        TH_OK(fg_linear_backward_weight(ctx, &dy.t, &x.t, &dw.t, acc));
        th_verify(acc ? "backward_weight+acc" : "backward_weight", &dw, ref, tol, label);

        for (int64_t j = 0; j < m; j++) {
            double s = 0;
            for (int64_t i = 0; i < n; i++) s += dy.v[i * m + j];
            ref[j] = s;
        }
        th_prepare_out(&db, ref, acc);
        TH_OK(fg_linear_backward_bias(ctx, &dy.t, &db.t, acc));
        th_verify(acc ? "backward_bias+acc" : "backward_bias", &db, ref, tol, label);
    }
    free(ref);
    th_operand *all[] = {&x, &y, &w, &b, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

typedef struct fd_linear { th_operand *x, *w, *b, *y; } fd_linear;

static fg_status fd_linear_forward(fg_context *ctx, void *arg) {
    fd_linear *a = arg;
    return fg_linear_forward(ctx, &a->x->t, &a->w->t, &a->b->t, &a->y->t);
}

/* L = Σ y·r; the backward kernels with dy = r must match central differences. */
static void finite_differences(fg_context *ctx, fg_backend be) {
    const int64_t xs[3] = {2, 3, 5}, ys[3] = {2, 3, 4}, ms = 4, k = 5;
    const int64_t bshape[1] = {ms};
    th_operand x = th_make(be, FG_F64, 3, xs, 0), w = make_w(be, FG_F64, ms, k, 0), b = th_make(be, FG_F64, 1, bshape, 0);
    th_operand y = th_make(be, FG_F64, 3, ys, 0), r = th_make(be, FG_F64, 3, ys, 0);
    th_operand dx = th_make(be, FG_F64, 3, xs, 0), dw = make_w(be, FG_F64, ms, k, 0), db = th_make(be, FG_F64, 1, bshape, 0);
    th_randomize(&x);
    th_randomize(&w);
    th_randomize(&b);
    th_randomize(&r);
    TH_OK(fg_linear_backward_input(ctx, &r.t, &w.t, &dx.t, 0));
    TH_OK(fg_linear_backward_weight(ctx, &r.t, &x.t, &dw.t, 0));
    TH_OK(fg_linear_backward_bias(ctx, &r.t, &db.t, 0));
    th_operand *params[3] = {&x, &w, &b}, *grads[3] = {&dx, &dw, &db};
    static const char *const names[3] = {"dx", "dw", "db"};
    fd_linear fa = {&x, &w, &b, &y};
    th_fd_check(ctx, th_backend_name(be), fd_linear_forward, &fa, &y, &r, params, grads, names, 3, 4, true);
    th_operand *all[] = {&x, &w, &b, &y, &r, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

static void bad_input(fg_context *ctx, fg_backend be) {
    const int64_t xs[2] = {6, 8}, ys[2] = {6, 4}, ws[2] = {4, 8}, bs[1] = {4};
    th_operand x = th_make(be, FG_F32, 2, xs, 0), y = th_make(be, FG_F32, 2, ys, 0), w = th_make(be, FG_F32, 2, ws, 0);
    th_operand b = th_make(be, FG_F32, 1, bs, 0), db = th_make(be, FG_F32, 1, bs, 0), dx = th_make(be, FG_F32, 2, xs, 0);
    th_randomize(&x);
    th_randomize(&w);
    th_randomize(&b);
    th_poison(&y.buf);
    th_poison(&db.buf);
    th_poison(&dx.buf);
    fg_tensor t;

    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "x", &y, fg_linear_forward(ctx, NULL, &w.t, NULL, &y.t));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "ctx", &y, fg_linear_forward(NULL, &x.t, &w.t, NULL, &y.t));
    t = x.t; t.data = NULL;
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "x.data", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = w.t; t.shape[1] = 7;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "w.shape[1]=7", &y, fg_linear_forward(ctx, &x.t, &t, NULL, &y.t));
    t = b.t; t.shape[0] = 5;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "b.shape[0]=5", &y, fg_linear_forward(ctx, &x.t, &w.t, &t, &y.t));
    t = y.t; t.shape[0] = 5;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y.shape", &y, fg_linear_forward(ctx, &x.t, &w.t, NULL, &t));
    t = w.t; t.dtype = FG_F16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "w.dtype=f16", &y, fg_linear_forward(ctx, &x.t, &t, NULL, &y.t));
    t = x.t; t.dtype = (fg_dtype)99;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "x.dtype=99", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = w.t; t.rank = 3;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "w.rank=3", &y, fg_linear_forward(ctx, &x.t, &t, NULL, &y.t));
    t = x.t; t.rank = 9;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "x.rank=9", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = x.t; t.shape[0] = -6;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "x.shape[0]=-6", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = x.t; t.rank = 3; t.shape[0] = (int64_t)1 << 40; t.shape[1] = (int64_t)1 << 40; t.shape[2] = 8;
    TH_EXPECT_BAD(FG_ERR_OVERFLOW, "x", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = x.t; t.stride[0] = (int64_t)1 << 62; t.stride[1] = 1;
    TH_EXPECT_BAD(FG_ERR_OVERFLOW, "x spans", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = x.t; t.stride[0] = 8; t.stride[1] = 2; /* no unit stride */
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "x needs a unit stride", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = x.t; t.data = (char *)x.t.data + 1;
    TH_EXPECT_BAD(FG_ERR_MISALIGNED, "x.data", &y, fg_linear_forward(ctx, &t, &w.t, NULL, &y.t));
    t = y.t; t.data = x.t.data; t.dtype = FG_F32; /* output overlapping x */
    {
        void *snap = th_snapshot(&x.buf);
        fg_status s = fg_linear_forward(ctx, &x.t, &w.t, NULL, &t);
        TH_CHECK(s == FG_ERR_ALIAS && strstr(fg_last_error(), "y overlaps x"), "alias: %s %s", fg_status_string(s),
                 fg_last_error());
        TH_CHECK(th_unchanged(&x.buf, snap), "alias: x was written");
        free(snap);
    }
    t = db.t; t.shape[0] = 3;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "db.shape[0]=3", &db, fg_linear_backward_bias(ctx, &y.t, &t, 0));
    t = w.t; t.shape[0] = 5;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "w.shape[0]=5", &dx, fg_linear_backward_input(ctx, &y.t, &t, &dx.t, 0));

    /* memory of the other kind */
    fg_backend other = be == FG_BACKEND_CPU ? FG_BACKEND_CUDA : FG_BACKEND_CPU;
    if (fg_backend_available(other)) {
        th_operand xo = th_make(other, FG_F32, 2, xs, 0);
        th_randomize(&xo);
        TH_EXPECT_BAD(FG_ERR_WRONG_DEVICE, "x.data is", &y, fg_linear_forward(ctx, &xo.t, &w.t, NULL, &y.t));
        th_drop(&xo);
    }

    /* plans: accumulate out of range, wrong workspace, shapes other than planned */
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.op = FG_OP_LINEAR_BACKWARD_BIAS;
    d.operands[0] = y.t;
    d.operands[1] = db.t;
    d.accumulate = 2;
    fg_plan *plan = NULL;
    fg_status s = fg_plan_create(ctx, &d, &plan);
    TH_CHECK(s == FG_ERR_INVALID_VALUE && strstr(fg_last_error(), "accumulate=2"), "plan accumulate=2: %s %s",
             fg_status_string(s), fg_last_error());
    d.accumulate = 0;
    d.op = (fg_op)77;
    s = fg_plan_create(ctx, &d, &plan);
    TH_CHECK(s == FG_ERR_INVALID_VALUE && strstr(fg_last_error(), "desc.op=77"), "plan op=77: %s %s",
             fg_status_string(s), fg_last_error());
    d.op = FG_OP_LINEAR_FORWARD;
    d.operands[0] = x.t;
    d.operands[1] = w.t;
    memset(&d.operands[2], 0, sizeof d.operands[2]);
    d.operands[3] = y.t;
    TH_OK(fg_plan_create(ctx, &d, &plan));
    if (plan) {
        fg_tensor ops[4] = {x.t, w.t, {0}, y.t};
        TH_OK(fg_plan_can_implement(plan, ops));
        fg_tensor explicit_x = x.t; /* the same layout with its strides written out */
        explicit_x.stride[0] = 8;
        explicit_x.stride[1] = 1;
        fg_tensor ops2[4] = {explicit_x, w.t, {0}, y.t};
        TH_OK(fg_plan_can_implement(plan, ops2));
        ops[0].stride[0] = 9; /* another layout */
        ops[0].stride[1] = 1;
        TH_CHECK(fg_plan_can_implement(plan, ops) == FG_ERR_SHAPE, "a plan accepted other strides");
        ops[0].stride[0] = ops[0].stride[1] = 0;
        ops[0].shape[0] = 5;
        void *snap = th_snapshot(&y.buf);
        s = fg_plan_run(plan, ops, NULL, 0);
        TH_CHECK(s == FG_ERR_SHAPE && strstr(fg_last_error(), "plan was made for"), "plan shape: %s %s",
                 fg_status_string(s), fg_last_error());
        TH_CHECK(th_unchanged(&y.buf, snap), "plan shape: y was written");
        free(snap);
        size_t need = 0;
        TH_OK(fg_plan_workspace_size(plan, &need));
        if (need > 0) {
            ops[0].shape[0] = 6;
            snap = th_snapshot(&y.buf);
            s = fg_plan_run(plan, ops, NULL, 0);
            TH_CHECK(s == FG_ERR_WORKSPACE, "plan without workspace: %s", fg_status_string(s));
            TH_CHECK(th_unchanged(&y.buf, snap), "plan workspace: y was written");
            free(snap);
        }
        fg_plan_destroy(plan);
    }
    th_operand *all[] = {&x, &y, &w, &b, &db, &dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

/* The plan API end to end, and what a plan says about itself. */
static void plans(fg_context *ctx, fg_backend be) {
    for (int di = 0; di < 4; di++) {
        fg_dtype dt = th_dtypes[di];
        const int64_t xs[2] = {37, 70}, ys[2] = {37, 23}, wsh[2] = {23, 70}, bs[1] = {23};
        th_operand x = th_make(be, dt, 2, xs, 0), y = th_make(be, dt, 2, ys, 0), w = th_make(be, dt, 2, wsh, 0);
        th_operand b = th_make(be, dt, 1, bs, 0);
        th_randomize(&x);
        th_randomize(&w);
        th_randomize(&b);
        fg_plan_desc d;
        memset(&d, 0, sizeof d);
        d.op = FG_OP_LINEAR_FORWARD;
        d.operands[0] = x.t;
        d.operands[1] = w.t;
        d.operands[2] = b.t;
        d.operands[3] = y.t;
        fg_plan *plan = NULL;
        TH_OK(fg_plan_create(ctx, &d, &plan));
        if (!plan) continue;
        fg_plan_info info;
        TH_OK(fg_plan_info_get(plan, &info));
        TH_CHECK(strcmp(info.op_name, "linear_forward") == 0 && info.backend == be && info.dtype == dt,
                 "plan info: %s backend %d dtype %d", info.op_name, info.backend, info.dtype);
        TH_CHECK(info.kernel[0] != '\0', "plan info: empty kernel name");
        TH_CHECK(info.precision.storage == dt && info.precision.deterministic == 1 && info.precision.tf32 == 0,
                 "plan precision: storage %d det %d tf32 %d", info.precision.storage, info.precision.deterministic,
                 info.precision.tf32);
        TH_CHECK(dt == FG_F64 ? (info.precision.math == FG_F64 && info.precision.accumulator == FG_F64)
                              : info.precision.math == FG_F32,
                 "plan precision of %s: math %d accumulator %d", fg_dtype_name(dt), info.precision.math,
                 info.precision.accumulator);
        TH_CHECK((be == FG_BACKEND_CPU) == (info.arch == 0), "plan arch %d on %s", info.arch, th_backend_name(be));
        size_t need = 0;
        TH_OK(fg_plan_workspace_size(plan, &need));
        th_buf ws = th_alloc(be, FG_F32, (int64_t)(need / 4 + 1));
        fg_tensor ops[4] = {x.t, w.t, b.t, y.t};
        double *ref = malloc(sizeof(double) * 37 * 23);
        for (int rep = 0; rep < 2; rep++) { /* a plan runs many times */
            for (int64_t i = 0; i < 37; i++)
                for (int64_t j = 0; j < 23; j++) {
                    double s = b.v[j];
                    for (int64_t p = 0; p < 70; p++) s += x.v[i * 70 + p] * w.v[j * 70 + p];
                    ref[i * 23 + j] = s;
                }
            th_poison(&y.buf);
            TH_OK(fg_plan_run(plan, ops, need ? ws.ptr : NULL, need));
            th_verify("plan linear_forward", &y, ref, th_tol(dt, false), fg_dtype_name(dt));
            th_randomize(&x);
        }
        free(ref);
        th_free(&ws);
        fg_plan_destroy(plan);
        th_drop(&x); th_drop(&y); th_drop(&w); th_drop(&b);
    }
}

#ifdef FG_TEST_HAVE_CUDA
/* f32 products of narrow layers over many tokens: on sm_90a they run as three TF32 tensor-core
 * passes of split operands (gemm_split.cu), which must hold f32's tolerance at any reduction
 * length. Shapes with a full wave of 128 × 128 tiles, a partial last row tile, n and k off the
 * tiles' multiples, a long k (3072), a bias, dx accumulated (its old values read by TMA, and
 * by each thread where c's rows are not whole 16 bytes: n = 130); the reference is f64 on every
 * 7th row (and the last). Then the weight gradient's form. On a 9.0 device the split kernels must
 * be the ones that ran. */
typedef struct split_case {
    int input;        /* 0: y = x·wᵀ + b; 1: dx (+)= dy·w */
    int64_t m, k, n;  /* rows, reduction, outputs */
    int accumulate;
} split_case;

static void split_products(fg_context *ctx) {
    static const split_case cases[] = {
        {0, 17000, 384, 128, 0}, {0, 17000, 100, 130, 0}, {0, 17000, 3072, 136, 0},
        {1, 17000, 384, 128, 1}, {1, 16900, 2048, 256, 0}, {1, 17000, 256, 130, 1},
    };
    int arch = 0;
    {
        const int64_t xs[2] = {256, 64}, ws[2] = {64, 64}, ys[2] = {256, 64};
        th_operand x = th_make(FG_BACKEND_CUDA, FG_F32, 2, xs, 0), w = th_make(FG_BACKEND_CUDA, FG_F32, 2, ws, 0);
        th_operand y = th_make(FG_BACKEND_CUDA, FG_F32, 2, ys, 0);
        fg_plan_desc d;
        memset(&d, 0, sizeof d);
        d.op = FG_OP_LINEAR_FORWARD;
        d.operands[0] = x.t, d.operands[1] = w.t, d.operands[3] = y.t;
        fg_plan *plan = NULL;
        fg_plan_info info;
        TH_OK(fg_plan_create(ctx, &d, &plan));
        if (plan && fg_plan_info_get(plan, &info) == FG_OK) arch = info.arch;
        fg_plan_destroy(plan);
        th_drop(&x), th_drop(&w), th_drop(&y);
    }
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const split_case *c = &cases[ci];
        const int64_t m = c->m, k = c->k, n = c->n;
        /* forward: a = x [m, k], w [n, k]; input: a = dy [m, k], w [k, n] (the layer's [out, in]) */
        const int64_t as[2] = {m, k}, wsh[2] = {c->input ? k : n, c->input ? n : k}, bs[1] = {n}, os[2] = {m, n};
        th_operand a = th_make(FG_BACKEND_CUDA, FG_F32, 2, as, 0), w = th_make(FG_BACKEND_CUDA, FG_F32, 2, wsh, 0);
        th_operand b = th_make(FG_BACKEND_CUDA, FG_F32, 1, bs, 0), o = th_make(FG_BACKEND_CUDA, FG_F32, 2, os, 0);
        th_randomize(&a), th_randomize(&w), th_randomize(&b);
        double *ref = calloc((size_t)(m * n), sizeof(double)), *got = malloc(sizeof(double) * (size_t)(m * n));
        th_prepare_out(&o, ref, c->accumulate); /* ref: the old values when accumulating */
        char label[128];
        snprintf(label, sizeof label, "[split f32 %s m=%lld k=%lld n=%lld acc=%d]", c->input ? "dx" : "forward",
                 (long long)m, (long long)k, (long long)n, c->accumulate);
        if (c->input) TH_OK(fg_linear_backward_input(ctx, &a.t, &w.t, &o.t, c->accumulate));
        else TH_OK(fg_linear_forward(ctx, &a.t, &w.t, &b.t, &o.t));
        const char *ran = fg_context_last_kernels(ctx);
        if (arch == 90)
            TH_CHECK(ran && strstr(ran, "split_tf32") != NULL, "%s: ran %s, not the split kernel", label, ran ? ran : "(none)");
        th_get(&o.buf, &o.t, got);
        double num = 0, den = 0;
        for (int64_t r = 0; r <= (m - 1) / 7 + 1; r++) { /* rows 0, 7, 14, … and the last */
            const int64_t i = r <= (m - 1) / 7 ? 7 * r : m - 1;
            for (int64_t j = 0; j < n; j++) {
                double s = c->input ? 0 : b.v[j];
                for (int64_t p = 0; p < k; p++) s += a.v[i * k + p] * (c->input ? w.v[p * n + j] : w.v[j * k + p]);
                if (c->accumulate) s += ref[i * n + j];
                num += (got[i * n + j] - s) * (got[i * n + j] - s), den += s * s;
            }
        }
        const double err = den > 0 ? sqrt(num / den) : sqrt(num);
        TH_CHECK(err <= th_tol(FG_F32, false), "%s: relerr %.3g over sampled rows", label, err);
        printf("%s relerr %.3g (%s)\n", label, err, ran ? ran : "");
        free(ref), free(got);
        th_drop(&a), th_drop(&w), th_drop(&b), th_drop(&o);
    }
    /* the weight gradient's form: dw [n, k] (+)= dyᵀ·x over t tokens, ranges of t summed in order;
       t off the 32-deep slices, n and k off the tiles, accumulated; f64 on every 5th row of dw */
    static const struct { int64_t t, n, k; int accumulate; } wcases[] = {
        {40000, 384, 128, 0}, {33001, 132, 100, 1}, {20000, 136, 260, 0}, /* (three column tiles) */
    };
    for (size_t ci = 0; ci < sizeof wcases / sizeof wcases[0]; ci++) {
        const int64_t t = wcases[ci].t, n = wcases[ci].n, k = wcases[ci].k;
        const int64_t dys[2] = {t, n}, xs[2] = {t, k}, dws[2] = {n, k};
        th_operand dy = th_make(FG_BACKEND_CUDA, FG_F32, 2, dys, 0), x = th_make(FG_BACKEND_CUDA, FG_F32, 2, xs, 0);
        th_operand dw = th_make(FG_BACKEND_CUDA, FG_F32, 2, dws, 0);
        th_randomize(&dy), th_randomize(&x);
        double *ref = calloc((size_t)(n * k), sizeof(double)), *got = malloc(sizeof(double) * (size_t)(n * k));
        th_prepare_out(&dw, ref, wcases[ci].accumulate); /* ref: the old values when accumulating */
        char label[128];
        snprintf(label, sizeof label, "[split f32 dw t=%lld n=%lld k=%lld acc=%d]", (long long)t, (long long)n,
                 (long long)k, wcases[ci].accumulate);
        TH_OK(fg_linear_backward_weight(ctx, &dy.t, &x.t, &dw.t, wcases[ci].accumulate));
        const char *ran = fg_context_last_kernels(ctx);
        if (arch == 90)
            TH_CHECK(ran && strstr(ran, "split_tf32_wgrad") != NULL, "%s: ran %s, not the split kernel", label,
                     ran ? ran : "(none)");
        th_get(&dw.buf, &dw.t, got);
        double num = 0, den = 0;
        for (int64_t r = 0; r <= (n - 1) / 5 + 1; r++) { /* rows 0, 5, 10, … and the last */
            const int64_t i = r <= (n - 1) / 5 ? 5 * r : n - 1;
            for (int64_t j = 0; j < k; j++) {
                double sum = 0;
                for (int64_t p = 0; p < t; p++) sum += dy.v[p * n + i] * x.v[p * k + j];
                if (wcases[ci].accumulate) sum += ref[i * k + j];
                num += (got[i * k + j] - sum) * (got[i * k + j] - sum), den += sum * sum;
            }
        }
        const double err = den > 0 ? sqrt(num / den) : sqrt(num);
        TH_CHECK(err <= th_tol(FG_F32, false), "%s: relerr %.3g over sampled rows", label, err);
        printf("%s relerr %.3g (%s)\n", label, err, ran ? ran : "");
        free(ref), free(got);
        th_drop(&dy), th_drop(&x), th_drop(&dw);
    }
}

/* bf16 tensors of more than 2^31 elements: index math must be 64-bit everywhere. */
static void large(fg_context *ctx) {
    const int64_t n = 65600, m = 32768, k = 64;
    printf("large: N=%lld M=%lld (N*M = %.3g elements > 2^31)\n", (long long)n, (long long)m, (double)n * m);
    const int64_t dys[2] = {n, m}, xs[2] = {n, k}, wsh[2] = {m, k}, us[1] = {n}, vs[1] = {m};
    th_operand dy; /* 4.3 GB on the device: no host copy of its values */
    dy.n = n * m;
    dy.buf = th_alloc(FG_BACKEND_CUDA, FG_BF16, n * m);
    dy.t = th_tensor(&dy.buf, 0, 2, dys, NULL);
    dy.v = NULL;
    th_operand x = th_make(FG_BACKEND_CUDA, FG_BF16, 2, xs, 0), w = th_make(FG_BACKEND_CUDA, FG_BF16, 2, wsh, 0);
    th_operand u = th_make(FG_BACKEND_CUDA, FG_BF16, 1, us, 0), v = th_make(FG_BACKEND_CUDA, FG_BF16, 1, vs, 0);
    th_operand db = th_make(FG_BACKEND_CUDA, FG_BF16, 1, vs, 0), dx = th_make(FG_BACKEND_CUDA, FG_BF16, 2, xs, 0);
    th_operand dw = th_make(FG_BACKEND_CUDA, FG_BF16, 2, wsh, 0);
    /* exact values: products and sums stay exact in bf16 / f32 */
    static const double pu[4] = {1.0, -0.5, 2.0, -1.0};
    for (int64_t i = 0; i < n; i++) u.v[i] = pu[th_rand_u64() % 4];
    for (int64_t j = 0; j < m; j++) v.v[j] = (double)((int)(th_rand_u64() % 9) - 4) / 4.0;
    th_put(&u.buf, &u.t, u.v);
    th_put(&v.buf, &v.t, v.v);
    th_randomize(&x);
    th_randomize(&w);
    TH_OK(fg_outer_forward(ctx, &u.t, &v.t, &dy.t));
    /* spot-check the outer product, including the very last element */
    int64_t rows[3] = {0, n / 2 + 7, n - 1};
    uint16_t *row = malloc((size_t)m * 2);
    double err = 0;
    for (int r = 0; r < 3; r++) {
        cudaMemcpy(row, (uint16_t *)dy.buf.ptr + rows[r] * m, (size_t)m * 2, cudaMemcpyDeviceToHost);
        for (int64_t j = 0; j < m; j++) err += fabs(fg_bf16_to_f32(row[j]) - u.v[rows[r]] * v.v[j]);
    }
    TH_CHECK(err == 0, "large outer_forward: error %g", err);
    double su = 0;
    for (int64_t i = 0; i < n; i++) su += u.v[i];
    double *ref = malloc(sizeof(double) * (size_t)(m * k > n * k ? m * k : n * k));
    for (int64_t j = 0; j < m; j++) ref[j] = v.v[j] * su;
    th_poison(&db.buf);
    TH_OK(fg_linear_backward_bias(ctx, &dy.t, &db.t, 0));
    th_verify("large backward_bias", &db, ref, 1e-2, "bf16");
    double *vw = calloc((size_t)k, sizeof(double)), *ux = calloc((size_t)k, sizeof(double));
    for (int64_t j = 0; j < m; j++)
        for (int64_t p = 0; p < k; p++) vw[p] += v.v[j] * w.v[j * k + p];
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < k; p++) ux[p] += u.v[i] * x.v[i * k + p];
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < k; p++) ref[i * k + p] = u.v[i] * vw[p];
    th_poison(&dx.buf);
    TH_OK(fg_linear_backward_input(ctx, &dy.t, &w.t, &dx.t, 0));
    th_verify("large backward_input", &dx, ref, 1e-2, "bf16");
    for (int64_t j = 0; j < m; j++)
        for (int64_t p = 0; p < k; p++) ref[j * k + p] = v.v[j] * ux[p];
    th_poison(&dw.buf);
    TH_OK(fg_linear_backward_weight(ctx, &dy.t, &x.t, &dw.t, 0));
    th_verify("large backward_weight", &dw, ref, 1e-2, "bf16");
    /* forward into the big buffer; check the first, a middle and the last row */
    TH_OK(fg_linear_forward(ctx, &x.t, &w.t, NULL, &dy.t));
    double num = 0, den = 0;
    for (int r = 0; r < 3; r++) {
        cudaMemcpy(row, (uint16_t *)dy.buf.ptr + rows[r] * m, (size_t)m * 2, cudaMemcpyDeviceToHost);
        for (int64_t j = 0; j < m; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) s += x.v[rows[r] * k + p] * w.v[j * k + p];
            double g = fg_bf16_to_f32(row[j]);
            num += (g - s) * (g - s);
            den += s * s;
            if (isnan(g)) num = INFINITY;
        }
    }
    TH_CHECK(sqrt(num / den) <= 1e-2, "large linear_forward: relerr %g", sqrt(num / den));
    TH_OK(fg_context_check(ctx));
    free(row); free(ref); free(vw); free(ux);
    th_operand *all[] = {&dy, &x, &w, &u, &v, &db, &dx, &dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}
#endif

int main(void) {
    th_init("test_linear");
    fg_backend bes[2];
    int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        for (int di = 0; di < 4; di++)
            for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
                run_case(ctx, bes[bi], th_dtypes[di], &cases[ci], false);
        finite_differences(ctx, bes[bi]);
        bad_input(ctx, bes[bi]);
        plans(ctx, bes[bi]);
        TH_OK(fg_context_check(ctx));
        fg_context_destroy(ctx);
        if (bes[bi] == FG_BACKEND_CUDA) {
            fg_context *tf = th_context(FG_BACKEND_CUDA, true);
            for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
                run_case(tf, FG_BACKEND_CUDA, FG_F32, &cases[ci], true);
            fg_context_destroy(tf);
#ifdef FG_TEST_HAVE_CUDA
            {
                fg_context *sp = th_context(FG_BACKEND_CUDA, false);
                split_products(sp);
                fg_context_destroy(sp);
            }
            if (th_large("the > 2^31-element cases (a GPU with 8 GB free)")) {
                fg_context *big = th_context(FG_BACKEND_CUDA, false);
                large(big);
                fg_context_destroy(big);
            }
#endif
        }
    }
    return th_finish("test_linear");
}

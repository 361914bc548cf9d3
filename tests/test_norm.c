/*
 * test_norm.c — the normalization family on every backend present, against float64
 * references written here: LayerNorm / RMSNorm forward and backward (with the fused residual
 * add and its dropout, saved or recomputed statistics, ds, accumulate, padded and misaligned
 * rows, odd row lengths 1 … 16384+), BatchNorm (training with the running-stat update, eval,
 * residual + dropout, the split form summed across two "devices"), dropout, RevIN; finite
 * differences in f64 for every backward; the dropout mask (drop rate, the same bits on every
 * backend, the backward regenerating the forward's); NaN propagation; bitwise reruns; in-place
 * outputs; empty problems; bad inputs that leave the outputs untouched. On a GPU with
 * FG_TEST_LARGE=1, a problem past 2³¹ elements.
 */
#include "harness.h"

#include "../src/core/rng.h"

#include <math.h>

#ifdef FG_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

/* The dropout multiplier of flat element i: rng.h's definition. */
static double mult(double p, uint64_t seed, uint64_t offset, int64_t i) {
    if (p <= 0.0) return 1.0;
    const float u = fg_dropout_uniform(seed, offset, (uint64_t)i);
    return u >= p ? 1.0 / (1.0 - p) : 0.0;
}

static th_operand make(fg_backend be, fg_dtype dt, int rank, const int64_t *shape, int layout, bool random) {
    th_operand o = th_make(be, dt, rank, shape, layout);
    if (random) th_randomize(&o);
    else th_poison(&o.buf);
    return o;
}

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* ------------------------------------------------------------------ row norms: references */

typedef struct rn_ref {
    double *s, *y, *mean, *rstd;
} rn_ref;

/* An output of sums against the reference, each element relative to its sum's scale: a sum
 * formed in floating point carries rounding of about u·Σ|term| whatever the sum, so where the
 * terms cancel (|sum| ≪ Σ|term|: seen, BatchNorm's dw over 3 rows, 4.4e-4 from terms near 1, off
 * by 5e-8) the error is measured against the terms' magnitude mag[g], not the sum itself;
 * elsewhere against |sum| as th_verify does. Low-precision outputs are also held per element,
 * as th_verify holds them (4·tol of the element's scale). */
static void verify_sums(const char *what, th_operand *o, const double *ref, const double *mag, double tol,
                        const char *label) {
    const int64_t n = o->n;
    double *got = dalloc(n), num = 0, den = 0;
    th_get(&o->buf, &o->t, got);
    int64_t bad = -1;
    for (int64_t g = 0; g < n; g++) {
        const double scale = fabs(ref[g]) > mag[g] ? fabs(ref[g]) : mag[g], d = got[g] - ref[g];
        num += d * d, den += scale * scale;
        if ((o->buf.dtype == FG_F16 || o->buf.dtype == FG_BF16) && bad < 0 && !(fabs(d) <= 4 * tol * scale)) bad = g;
    }
    const double err = den > 0 ? sqrt(num / den) : sqrt(num);
    th_margin(what, label, err, tol);
    TH_CHECK(err <= tol, "%s %s: error %.3g of the terms' scale > tol %.3g", what, label, err, tol);
    TH_CHECK(bad < 0, "%s %s: element %lld got %.6g ref %.6g, off by more than 4·tol of its scale", what, label,
             (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
    free(got);
}

/* th_verify's checks of what is left of each element's error past slack[i] (norm-wise; f16 / bf16
 * also per element): for an error a documented algorithm carries beside the dtype's rounding
 * (BatchNorm's variance, below). */
static void verify_past(const char *what, th_operand *o, const double *ref, const double *slack, double tol,
                        const char *label) {
    double *got = dalloc(o->n), num = 0, den = 0;
    th_get(&o->buf, &o->t, got);
    for (int64_t i = 0; i < o->n; i++) {
        const double d = fabs(got[i] - ref[i]) - slack[i];
        if (!(d <= 0)) num += d * d; /* NaN counts */
        den += ref[i] * ref[i];
    }
    const double err = den > 0 ? sqrt(num / den) : sqrt(num);
    th_margin(what, label, err, tol);
    TH_CHECK(err <= tol, "%s %s: relerr %.3g past the algorithm's slack > tol %.3g", what, label, err, tol);
    th_check_elements(what, o, got, ref, slack, tol, label);
    free(got);
}

/* The saved means: a mean of n values is a sum scaled by 1/n, so its scale is the values' mean
 * magnitude (seen: a row of 16 with mean 1.1e-4 off by 1e-8). Group g holds s[g·gs + e·es] for
 * e < n. */
static void verify_means(const char *what, th_operand *mean, const double *ref, const double *s, int64_t groups,
                         int64_t n, int64_t gs, int64_t es, double tol, const char *label) {
    double *mag = dalloc(groups);
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t e = 0; e < n; e++) mag[g] += fabs(s[g * gs + e * es]);
        mag[g] = n > 0 ? mag[g] / (double)n : 0;
    }
    verify_sums(what, mean, ref, mag, tol, label);
    free(mag);
}

/* s = round(x + m·r) (r NULL: x), per row mean / rstd, y */
static void rn_forward_ref(int kind, double eps, fg_dtype dt, int64_t rows, int64_t D, const double *x,
                           const double *r, double p, uint64_t seed, uint64_t off, const double *w, const double *b,
                           rn_ref *o) {
    for (int64_t i = 0; i < rows; i++) {
        double *s = o->s + i * D;
        for (int64_t j = 0; j < D; j++) s[j] = x[i * D + j] + (r ? mult(p, seed, off, i * D + j) * r[i * D + j] : 0.0);
        th_round(dt, s, D);
        double mean = 0, q = 0;
        if (kind == FG_NORM_LAYER) {
            for (int64_t j = 0; j < D; j++) mean += s[j];
            mean /= (double)D;
        }
        for (int64_t j = 0; j < D; j++) q += (s[j] - mean) * (s[j] - mean);
        const double rstd = 1.0 / sqrt(q / (double)D + eps);
        o->mean[i] = mean, o->rstd[i] = rstd;
        for (int64_t j = 0; j < D; j++) o->y[i * D + j] = (s[j] - mean) * rstd * (w ? w[j] : 1) + (b ? b[j] : 0);
    }
}

/* dx (= dsum), dr, dw, db from dy, ds, the normalized x; mw, mb: the sums of |term| of dw, db */
static void rn_backward_ref(int kind, double eps, int64_t rows, int64_t D, const double *dy, const double *ds,
                            const double *x, const double *w, double p, uint64_t seed, uint64_t off, double *dx,
                            double *dr, double *dw, double *db, double *mw, double *mb) {
    for (int64_t j = 0; j < D; j++) dw[j] = db[j] = mw[j] = mb[j] = 0;
    double *xh = dalloc(D), *g = dalloc(D);
    for (int64_t i = 0; i < rows; i++) {
        double mean = 0, q = 0;
        if (kind == FG_NORM_LAYER) {
            for (int64_t j = 0; j < D; j++) mean += x[i * D + j];
            mean /= (double)D;
        }
        for (int64_t j = 0; j < D; j++) q += (x[i * D + j] - mean) * (x[i * D + j] - mean);
        const double rstd = 1.0 / sqrt(q / (double)D + eps);
        double c1 = 0, c2 = 0;
        for (int64_t j = 0; j < D; j++) {
            xh[j] = (x[i * D + j] - mean) * rstd;
            g[j] = dy[i * D + j] * (w ? w[j] : 1);
            c1 += g[j] * xh[j], c2 += g[j];
            dw[j] += dy[i * D + j] * xh[j];
            db[j] += dy[i * D + j];
            mw[j] += fabs(dy[i * D + j] * xh[j]);
            mb[j] += fabs(dy[i * D + j]);
        }
        c1 /= (double)D, c2 /= (double)D;
        if (kind == FG_NORM_RMS) c2 = 0;
        for (int64_t j = 0; j < D; j++) {
            const double v = rstd * (g[j] - c2 - xh[j] * c1) + (ds ? ds[i * D + j] : 0);
            dx[i * D + j] = v;
            dr[i * D + j] = v * mult(p, seed, off, i * D + j);
        }
    }
    free(xh), free(g);
}

/* ------------------------------------------------------------------ row norms: cases */

typedef struct rn_case {
    int kind;
    int rank;
    int64_t shape[3]; /* last: D */
    bool w, b, resid;
    double p;
    int layout;       /* of x, y, s, dy, dx (th_make) */
} rn_case;

static int64_t rows_of_case(const rn_case *k) {
    int64_t r = 1;
    for (int d = 0; d < k->rank - 1; d++) r *= k->shape[d];
    return r;
}

static void rn_case_run(fg_context *ctx, fg_backend be, fg_dtype dt, const rn_case *k, int round) {
    const int64_t D = k->shape[k->rank - 1], rows = rows_of_case(k), n = rows * D;
    char label[160];
    snprintf(label, sizeof label, "[%s %s %s %lldx%lld%s%s%s p=%.2f layout %d]", th_backend_name(be),
             fg_dtype_name(dt), k->kind == FG_NORM_RMS ? "rms" : "layer", (long long)rows, (long long)D,
             k->w ? " w" : "", k->b ? " b" : "", k->resid ? " +r" : "", k->p, k->layout);
    const fg_dtype acc = acc_of(dt);
    /* the statistics are sums in the accumulation type of s rounded to the dtype: held to that
       type's tolerance, measured from the backend's own s (see ref_from_s) */
    const double tol = th_tol(dt, false), stol = th_tol(acc, false);
    const int64_t d1[1] = {D}, r1[1] = {rows};
    th_operand x = make(be, dt, k->rank, k->shape, k->layout, true);
    th_operand r = make(be, dt, k->rank, k->shape, 0, true);
    th_operand w = make(be, dt, 1, d1, 0, true), b = make(be, dt, 1, d1, 0, true);
    th_operand y = make(be, dt, k->rank, k->shape, k->layout, false);
    th_operand s = make(be, dt, k->rank, k->shape, k->layout, false);
    th_operand mean = make(be, acc, 1, r1, 0, false), rstd = make(be, acc, 1, r1, 0, false);
    fg_norm_options opt;
    memset(&opt, 0, sizeof opt);
    opt.kind = (fg_norm_kind)k->kind;
    opt.eps = round % 2 ? 1e-3 : 0; /* 0: the default 1e-5 */
    const double eps = opt.eps > 0 ? opt.eps : 1e-5;
    if (k->resid) opt.dropout.p = k->p, opt.dropout.seed = 1234 + (uint64_t)round, opt.dropout.offset = 77;
    const bool lay = k->kind == FG_NORM_LAYER;
    rn_ref ref = {dalloc(n), dalloc(n), dalloc(rows), dalloc(rows)};
    rn_forward_ref(k->kind, eps, dt, rows, D, x.v, k->resid ? r.v : NULL, opt.dropout.p, opt.dropout.seed,
                   opt.dropout.offset, k->w ? w.v : NULL, k->b ? b.v : NULL, &ref);
    TH_OK(fg_norm_forward(ctx, &opt, &x.t, k->resid ? &r.t : NULL, k->w ? &w.t : NULL, k->b ? &b.t : NULL, &y.t,
                          k->resid ? &s.t : NULL, lay ? &mean.t : NULL, &rstd.t));
    char what[200];
    snprintf(what, sizeof what, "%s forward", label);
    /* ref_from_s: with a residual, s is held to the reference's s, and the reference's statistics
       and y are then formed from the backend's own s: one ulp of an element of s (x + m·r formed
       with or without an FMA) moves the statistics of a row whose values cluster by far more than
       an ulp, which is s's rounding, not the reduction's */
    if (k->resid) {
        th_verify("s", &s, ref.s, tol, what);
        th_get(&s.buf, &s.t, s.v);
        rn_forward_ref(k->kind, eps, dt, rows, D, s.v, NULL, 0, 0, 0, k->w ? w.v : NULL, k->b ? b.v : NULL, &ref);
    }
    th_verify("y", &y, ref.y, tol, what);
    if (lay) verify_means("mean", &mean, ref.mean, ref.s, rows, D, D, 1, stol, what);
    th_verify("rstd", &rstd, ref.rstd, stol, what);

    /* the backward from the normalized input (s, as stored) */
    th_operand *xin = k->resid ? &s : &x;
    th_operand dy = make(be, dt, k->rank, k->shape, k->layout, true), ds = make(be, dt, k->rank, k->shape, 0, true);
    th_operand dx = make(be, dt, k->rank, k->shape, k->layout, false), dr = make(be, dt, k->rank, k->shape, 0, false);
    th_operand dw = make(be, round % 2 ? acc : dt, 1, d1, 0, false), db = make(be, round % 2 ? acc : dt, 1, d1, 0, false);
    double *rdx = dalloc(n), *rdr = dalloc(n), *rdw = dalloc(D), *rdb = dalloc(D), *mw = dalloc(D), *mb = dalloc(D);
    for (int variant = 0; variant < 2; variant++) {
        const bool saved = variant == 0, accumulate = variant == 1, with_ds = variant == 0;
        rn_backward_ref(k->kind, eps, rows, D, dy.v, with_ds ? ds.v : NULL, xin->v, k->w ? w.v : NULL,
                        opt.dropout.p, opt.dropout.seed, opt.dropout.offset, rdx, rdr, rdw, rdb, mw, mb);
        th_prepare_out(&dx, rdx, accumulate);
        if (k->resid) th_prepare_out(&dr, rdr, accumulate);
        th_prepare_out(&dw, rdw, accumulate);
        th_prepare_out(&db, rdb, accumulate);
        TH_OK(fg_norm_backward(ctx, &opt, &dy.t, with_ds ? &ds.t : NULL, &xin->t, k->w ? &w.t : NULL,
                               saved && lay ? &mean.t : NULL, saved ? &rstd.t : NULL, &dx.t, k->resid ? &dr.t : NULL,
                               &dw.t, &db.t, accumulate));
        snprintf(what, sizeof what, "%s backward (%s%s%s)", label, saved ? "saved stats" : "recomputed",
                 with_ds ? ", ds" : "", accumulate ? ", accumulate" : "");
        th_verify("dx", &dx, rdx, tol, what);
        if (k->resid) th_verify("dr", &dr, rdr, tol, what);
        /* dw and db of an f32 sum over the rows: the dtype's tolerance, or f32's when summed there */
        verify_sums("dw", &dw, rdw, mw, th_tol(dw.buf.dtype, false) * (dw.buf.dtype == FG_F32 ? 4 : 1), what);
        verify_sums("db", &db, rdb, mb, th_tol(db.buf.dtype, false) * (db.buf.dtype == FG_F32 ? 4 : 1), what);
    }
    free(rdx), free(rdr), free(rdw), free(rdb), free(mw), free(mb);
    free(ref.s), free(ref.y), free(ref.mean), free(ref.rstd);
    th_drop(&x), th_drop(&r), th_drop(&w), th_drop(&b), th_drop(&y), th_drop(&s), th_drop(&mean), th_drop(&rstd);
    th_drop(&dy), th_drop(&ds), th_drop(&dx), th_drop(&dr), th_drop(&dw), th_drop(&db);
}

static void row_norms(fg_context *ctx, fg_backend be) {
    const rn_case cases[] = {
        {FG_NORM_LAYER, 2, {1, 1}, true, true, false, 0, 0},
        {FG_NORM_LAYER, 2, {1, 16}, true, true, true, 0.5, 0},
        {FG_NORM_RMS, 2, {3, 17}, true, false, true, 0.3, 0},
        {FG_NORM_LAYER, 3, {2, 9, 127}, false, true, true, 0.1, 1},
        {FG_NORM_RMS, 2, {17, 128}, true, false, false, 0, 3},
        {FG_NORM_LAYER, 2, {33, 768}, true, true, true, 0.3, 0},
        {FG_NORM_LAYER, 2, {5, 1000}, true, true, false, 0, 1},
        {FG_NORM_RMS, 2, {4, 4099}, false, false, true, 0.2, 3},
        {FG_NORM_LAYER, 2, {300, 64}, true, true, true, 0.3, 0},
        {FG_NORM_LAYER, 2, {3, 16384}, true, true, true, 0.1, 0},
        {FG_NORM_RMS, 2, {2, 20000}, true, true, false, 0, 0},
        /* rows of a whole block without the residual (CUDA's lean kernels; 12288: eight vectors a thread) */
        {FG_NORM_LAYER, 2, {7, 4096}, true, true, false, 0, 0},
        {FG_NORM_RMS, 2, {5, 2048}, true, false, false, 0, 0},
        {FG_NORM_LAYER, 2, {3, 12288}, false, true, false, 0, 0},
    };
    for (int di = 0; di < 4; di++) {
        const fg_dtype dt = th_dtypes[di];
        if (be == FG_BACKEND_CUDA && dt == FG_F64) continue;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) rn_case_run(ctx, be, dt, &cases[i], (int)i);
    }
}

/* ------------------------------------------------------------------ finite differences (f64, CPU) */

typedef struct rn_fd {
    fg_norm_options opt;
    th_operand *x, *r, *w, *b, *y;
} rn_fd;

static fg_status rn_fd_forward(fg_context *ctx, void *arg) {
    rn_fd *a = arg;
    return fg_norm_forward(ctx, &a->opt, &a->x->t, a->r ? &a->r->t : NULL, &a->w->t, &a->b->t, &a->y->t, NULL, NULL,
                           NULL);
}

static void rn_finite_differences(fg_context *ctx) {
    for (int kind = 0; kind < 2; kind++) {
        const int64_t shape[2] = {3, 17}, d1[1] = {17};
        th_operand x = make(FG_BACKEND_CPU, FG_F64, 2, shape, 0, true), r = make(FG_BACKEND_CPU, FG_F64, 2, shape, 0, true);
        th_operand w = make(FG_BACKEND_CPU, FG_F64, 1, d1, 0, true), b = make(FG_BACKEND_CPU, FG_F64, 1, d1, 0, true);
        th_operand y = make(FG_BACKEND_CPU, FG_F64, 2, shape, 0, false), s = make(FG_BACKEND_CPU, FG_F64, 2, shape, 0, false);
        th_operand R = make(FG_BACKEND_CPU, FG_F64, 2, shape, 0, true);
        th_operand dx = make(FG_BACKEND_CPU, FG_F64, 2, shape, 0, false), dr = make(FG_BACKEND_CPU, FG_F64, 2, shape, 0, false);
        th_operand dw = make(FG_BACKEND_CPU, FG_F64, 1, d1, 0, false), db = make(FG_BACKEND_CPU, FG_F64, 1, d1, 0, false);
        rn_fd a;
        memset(&a, 0, sizeof a);
        a.opt.kind = (fg_norm_kind)kind;
        a.opt.dropout.p = 0.4, a.opt.dropout.seed = 99, a.opt.dropout.offset = 5;
        a.x = &x, a.r = &r, a.w = &w, a.b = &b, a.y = &y;
        TH_OK(fg_norm_forward(ctx, &a.opt, &x.t, &r.t, &w.t, &b.t, &y.t, &s.t, NULL, NULL));
        TH_OK(fg_norm_backward(ctx, &a.opt, &R.t, NULL, &s.t, &w.t, NULL, NULL, &dx.t, &dr.t, &dw.t, &db.t, 0));
        th_operand *params[4] = {&x, &r, &w, &b}, *grads[4] = {&dx, &dr, &dw, &db};
        const char *const names[4] = {"x", "r", "w", "b"};
        th_fd_check(ctx, kind ? "rms_norm fused" : "layer_norm fused", rn_fd_forward, &a, &y, &R, params, grads, names, 4,
                    0, false);
        th_drop(&x), th_drop(&r), th_drop(&w), th_drop(&b), th_drop(&y), th_drop(&s), th_drop(&R);
        th_drop(&dx), th_drop(&dr), th_drop(&dw), th_drop(&db);
    }
}

/* ------------------------------------------------------------------ BatchNorm */

typedef struct bn_ref {
    double *s, *y, *mean, *var, *rstd, *rm, *rv;
} bn_ref;

static void bn_forward_ref(fg_dtype dt, int64_t N, int64_t C, const double *x, const double *r, double p,
                           uint64_t seed, uint64_t off, const double *w, const double *b, bool eval, double eps,
                           double mom, const double *rm0, const double *rv0, bn_ref *o) {
    for (int64_t i = 0; i < N * C; i++) o->s[i] = x[i] + (r ? mult(p, seed, off, i) * r[i] : 0.0);
    th_round(dt, o->s, N * C);
    for (int64_t j = 0; j < C; j++) {
        double mean = 0, q = 0;
        if (eval) {
            mean = rm0[j], q = rv0[j];
        } else {
            for (int64_t i = 0; i < N; i++) mean += o->s[i * C + j];
            mean /= (double)N;
            for (int64_t i = 0; i < N; i++) q += (o->s[i * C + j] - mean) * (o->s[i * C + j] - mean);
            q /= (double)N;
        }
        o->mean[j] = mean, o->var[j] = q, o->rstd[j] = 1.0 / sqrt(q + eps);
        if (rm0) {
            o->rm[j] = eval ? rm0[j] : (1 - mom) * rm0[j] + mom * mean;
            o->rv[j] = eval ? rv0[j] : (1 - mom) * rv0[j] + mom * q * (double)N / (double)(N - 1);
        }
        for (int64_t i = 0; i < N; i++)
            o->y[i * C + j] = (o->s[i * C + j] - mean) * o->rstd[j] * (w ? w[j] : 1) + (b ? b[j] : 0);
    }
}

static void bn_backward_ref(int64_t N, int64_t C, const double *dy, const double *x, const double *w, const double *mean,
                            const double *rstd, bool eval, double p, uint64_t seed, uint64_t off, double *dx, double *dr,
                            double *dw, double *db, double *mw, double *mb) {
    for (int64_t j = 0; j < C; j++) {
        double sdy = 0, sdyx = 0, ady = 0, adyx = 0;
        for (int64_t i = 0; i < N; i++) {
            sdy += dy[i * C + j];
            sdyx += dy[i * C + j] * (x[i * C + j] - mean[j]) * rstd[j];
            ady += fabs(dy[i * C + j]);
            adyx += fabs(dy[i * C + j] * (x[i * C + j] - mean[j]) * rstd[j]);
        }
        dw[j] = sdyx, db[j] = sdy, mw[j] = adyx, mb[j] = ady;
        const double a = (w ? w[j] : 1) * rstd[j];
        for (int64_t i = 0; i < N; i++) {
            const double xh = (x[i * C + j] - mean[j]) * rstd[j];
            const double v = eval ? a * dy[i * C + j] : a * (dy[i * C + j] - sdy / (double)N - xh * sdyx / (double)N);
            dx[i * C + j] = v;
            dr[i * C + j] = v * mult(p, seed, off, i * C + j);
        }
    }
}

typedef struct bn_case {
    int rank;
    int64_t shape[3];
    bool affine, resid, running, eval;
    double p;
    bool f32_params; /* w, b, running stats in f32 for low-precision x */
    int layout;
} bn_case;

static void bn_case_run(fg_context *ctx, fg_backend be, fg_dtype dt, const bn_case *k, int round) {
    const int64_t C = k->shape[k->rank - 1];
    int64_t N = 1;
    for (int d = 0; d < k->rank - 1; d++) N *= k->shape[d];
    const int64_t n = N * C, c1[1] = {C};
    const fg_dtype acc = acc_of(dt), pt = k->f32_params ? acc : dt;
    char label[160];
    snprintf(label, sizeof label, "[%s %s bn %lldx%lld%s%s%s%s p=%.2f%s]", th_backend_name(be), fg_dtype_name(dt),
             (long long)N, (long long)C, k->affine ? " affine" : "", k->resid ? " +r" : "", k->running ? " running" : "",
             k->eval ? " eval" : "", k->p, k->f32_params ? " f32 params" : "");
    const double tol = th_tol(dt, false), stol = th_tol(acc, false); /* (as in rn_case_run) */
    th_operand x = make(be, dt, k->rank, k->shape, k->layout, true), r = make(be, dt, k->rank, k->shape, 0, true);
    th_operand w = make(be, pt, 1, c1, 0, true), b = make(be, pt, 1, c1, 0, true);
    th_operand rm = make(be, pt, 1, c1, 0, true), rv = make(be, pt, 1, c1, 0, true);
    for (int64_t j = 0; j < C; j++) rv.v[j] = 0.5 + fabs(rv.v[j]);
    th_round(pt, rv.v, C);
    th_put(&rv.buf, &rv.t, rv.v);
    th_operand y = make(be, dt, k->rank, k->shape, k->layout, false), s = make(be, dt, k->rank, k->shape, 0, false);
    th_operand mean = make(be, acc, 1, c1, 0, false), rstd = make(be, acc, 1, c1, 0, false);
    fg_batch_norm_options opt;
    memset(&opt, 0, sizeof opt);
    opt.eval = k->eval;
    opt.eps = round % 2 ? 1e-3 : 0;
    opt.momentum = round % 3 == 0 ? 0 : 0.25; /* 0: the default 0.1 */
    const double eps = opt.eps > 0 ? opt.eps : 1e-5, mom = opt.momentum > 0 ? opt.momentum : 0.1;
    if (k->resid) opt.dropout.p = k->p, opt.dropout.seed = 4321, opt.dropout.offset = (uint64_t)round;
    bn_ref ref = {dalloc(n), dalloc(n), dalloc(C), dalloc(C), dalloc(C), dalloc(C), dalloc(C)};
    bn_forward_ref(dt, N, C, x.v, k->resid ? r.v : NULL, opt.dropout.p, opt.dropout.seed, opt.dropout.offset,
                   k->affine ? w.v : NULL, k->affine ? b.v : NULL, k->eval, eps, mom, k->running ? rm.v : NULL,
                   k->running ? rv.v : NULL, &ref);
    TH_OK(fg_batch_norm_forward(ctx, &opt, &x.t, k->resid ? &r.t : NULL, k->affine ? &w.t : NULL,
                                k->affine ? &b.t : NULL, k->running ? &rm.t : NULL, k->running ? &rv.t : NULL, &y.t,
                                k->resid ? &s.t : NULL, &mean.t, &rstd.t));
    char what[220];
    snprintf(what, sizeof what, "%s forward", label);
    if (k->resid) { /* ref_from_s (rn_case_run) */
        th_verify("s", &s, ref.s, tol, what);
        th_get(&s.buf, &s.t, s.v);
        bn_forward_ref(dt, N, C, s.v, NULL, 0, 0, 0, k->affine ? w.v : NULL, k->affine ? b.v : NULL, k->eval, eps, mom,
                       k->running ? rm.v : NULL, k->running ? rv.v : NULL, &ref);
    }
    /* The variance is Σs²/N − mean² from the f64 sums (the split form's all-reducible ones), so
       beside the dtype's rounding it carries ≈ 2^-53·(2·mean² + var) (seen: f64 over 3 rows whose
       mean² / var ≈ 10^4, rstd off by 1.3e-12 against tol 1e-12); rstd and y get that as slack */
    double *rslack = dalloc(C), *yslack = dalloc(n);
    if (!k->eval)
        for (int64_t j = 0; j < C; j++) {
            const double var = ref.var[j], m2 = ref.mean[j] * ref.mean[j];
            rslack[j] = 8 * 0x1p-53 * (2 * m2 + var) / (var + eps) * ref.rstd[j];
            for (int64_t i = 0; i < N; i++)
                yslack[i * C + j] = fabs((ref.s[i * C + j] - ref.mean[j]) * (k->affine ? w.v[j] : 1)) * rslack[j];
        }
    verify_past("y", &y, ref.y, yslack, tol, what);
    verify_means("mean", &mean, ref.mean, ref.s, C, N, 1, C, stol, what);
    verify_past("rstd", &rstd, ref.rstd, rslack, stol, what);
    free(rslack), free(yslack);
    if (k->running) {
        /* the update is momentum·(batch − running): checked to a small part of it (f32 stats), or to the
           stats' own dtype; and it must have moved them */
        double *got = dalloc(C);
        const th_operand *st[2] = {&rm, &rv};
        const double *want[2] = {ref.rm, ref.rv}, *old[2] = {rm.v, rv.v};
        for (int q = 0; q < 2; q++) {
            th_get(&st[q]->buf, &st[q]->t, got);
            for (int64_t j = 0; j < C; j++) {
                const double update = fabs(want[q][j] - old[q][j]);
                const double bound = pt == FG_F64 ? 1e-9 * update + 1e-15
                                     : pt == FG_F32 ? 1e-3 * update + 1e-6 * fabs(want[q][j])
                                                    : 8e-3 * fabs(want[q][j]);
                TH_CHECK(fabs(got[j] - want[q][j]) <= bound, "%s running_%s[%lld]: %.9g want %.9g (from %.9g)", what,
                         q ? "var" : "mean", (long long)j, got[j], want[q][j], old[q][j]);
                if (!k->eval && pt != FG_BF16 && pt != FG_F16 && update > 1e-6)
                    TH_CHECK(got[j] != old[q][j], "%s running_%s[%lld] did not move", what, q ? "var" : "mean",
                             (long long)j);
                if (k->eval) TH_CHECK(got[j] == old[q][j], "%s: eval moved running_%s", what, q ? "var" : "mean");
            }
        }
        free(got);
    }
    /* the backward from the normalized input and the saved statistics */
    th_operand *xin = k->resid ? &s : &x;
    double *sm = dalloc(C), *sq = dalloc(C);
    th_get(&mean.buf, &mean.t, sm);
    th_get(&rstd.buf, &rstd.t, sq);
    th_operand dy = make(be, dt, k->rank, k->shape, k->layout, true);
    th_operand dx = make(be, dt, k->rank, k->shape, 0, false), dr = make(be, dt, k->rank, k->shape, 0, false);
    th_operand dw = make(be, round % 2 ? acc : dt, 1, c1, 0, false), db = make(be, round % 2 ? acc : dt, 1, c1, 0, false);
    double *rdx = dalloc(n), *rdr = dalloc(n), *rdw = dalloc(C), *rdb = dalloc(C), *mw = dalloc(C), *mb = dalloc(C);
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        bn_backward_ref(N, C, dy.v, xin->v, k->affine ? w.v : NULL, sm, sq, k->eval, opt.dropout.p, opt.dropout.seed,
                        opt.dropout.offset, rdx, rdr, rdw, rdb, mw, mb);
        th_prepare_out(&dx, rdx, accumulate);
        if (k->resid) th_prepare_out(&dr, rdr, accumulate);
        th_prepare_out(&dw, rdw, accumulate);
        th_prepare_out(&db, rdb, accumulate);
        TH_OK(fg_batch_norm_backward(ctx, &opt, &dy.t, &xin->t, k->affine ? &w.t : NULL, &mean.t, &rstd.t, &dx.t,
                                     k->resid ? &dr.t : NULL, &dw.t, &db.t, accumulate));
        snprintf(what, sizeof what, "%s backward%s", label, accumulate ? " accumulate" : "");
        /* dx of training BatchNorm subtracts two sums from dy: a few roundings of f32 more */
        th_verify("dx", &dx, rdx, tol * (dt == FG_F32 ? 4 : 1), what);
        if (k->resid) th_verify("dr", &dr, rdr, tol * (dt == FG_F32 ? 4 : 1), what);
        verify_sums("dw", &dw, rdw, mw, th_tol(dw.buf.dtype, false) * (dw.buf.dtype == FG_F32 ? 4 : 1), what);
        verify_sums("db", &db, rdb, mb, th_tol(db.buf.dtype, false) * (db.buf.dtype == FG_F32 ? 4 : 1), what);
    }
    free(rdx), free(rdr), free(rdw), free(rdb), free(mw), free(mb), free(sm), free(sq);
    free(ref.s), free(ref.y), free(ref.mean), free(ref.var), free(ref.rstd), free(ref.rm), free(ref.rv);
    th_drop(&x), th_drop(&r), th_drop(&w), th_drop(&b), th_drop(&rm), th_drop(&rv), th_drop(&y), th_drop(&s);
    th_drop(&mean), th_drop(&rstd), th_drop(&dy), th_drop(&dx), th_drop(&dr), th_drop(&dw), th_drop(&db);
}

static void batch_norms(fg_context *ctx, fg_backend be) {
    const bn_case cases[] = {
        {2, {2, 5}, true, false, true, true, 0, false, 0}, /* eval: training's dx of 2 rows is 0 up to eps */
        {2, {3, 1}, true, false, true, false, 0, false, 0},
        {2, {3, 17}, true, true, true, false, 0.3, false, 0},
        {2, {127, 3}, false, false, true, false, 0, true, 1},
        {3, {6, 42, 16}, true, true, true, false, 0.3, true, 0}, /* PatchTST: [B·vars, patches, d] */
        {2, {1000, 7}, true, false, true, true, 0, false, 3},
        {2, {257, 128}, true, true, false, false, 0.1, false, 0},
        {2, {64, 1000}, true, false, true, true, 0, true, 0},
        {2, {4100, 33}, true, false, true, false, 0, false, 1},
        {2, {300, 50}, true, true, true, false, 0.3, false, 0}, /* the CPU's AVX-512 rows at 4 vectors, a masked tail */
    };
    for (int di = 0; di < 4; di++) {
        const fg_dtype dt = th_dtypes[di];
        if (be == FG_BACKEND_CUDA && dt == FG_F64) continue;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bn_case_run(ctx, be, dt, &cases[i], (int)i);
    }
    /* CUDA's one-launch BatchNorm keeps a thread's first rows in registers, the next in shared
       memory and re-reads the rest: at 64 channels a thread of a 132-SM device takes ≈ 95 rows,
       past what it keeps in every dtype and direction (17 … 68 rows), so all three kinds run */
    if (be == FG_BACKEND_CUDA) { /* (f32 with the residual runs the two kernels: not this case) */
        const bn_case big = {2, {400000, 64}, true, false, true, false, 0, false, 0};
        const bn_case big_r = {2, {400000, 64}, true, true, true, false, 0.1, true, 0};
        bn_case_run(ctx, be, FG_F32, &big, 1);
        bn_case_run(ctx, be, FG_BF16, &big_r, 2);
    }
}

/* The split form on two "devices": stats of each half, the sums added on the host (the
 * all-reduce), apply on each half with its own copy of the running stats; the same as the
 * one-device forward. The backward likewise. */
static void bn_split(fg_context *ctx, fg_backend be, fg_dtype dt) {
    const int64_t N = 301, C = 19, N1 = 120, c1[1] = {C}, sn[1] = {2 * C + 1};
    const int64_t full[2] = {N, C}, h1[2] = {N1, C}, h2[2] = {N - N1, C};
    const fg_dtype acc = acc_of(dt);
    char label[64];
    snprintf(label, sizeof label, "[%s %s bn split]", th_backend_name(be), fg_dtype_name(dt));
    th_operand x = make(be, dt, 2, full, 0, true), r = make(be, dt, 2, full, 0, true);
    th_operand w = make(be, dt, 1, c1, 0, true), b = make(be, dt, 1, c1, 0, true);
    th_operand rm = make(be, FG_F32, 1, c1, 0, true), rv = make(be, FG_F32, 1, c1, 0, true);
    th_operand y = make(be, dt, 2, full, 0, false), s = make(be, dt, 2, full, 0, false);
    th_operand mean = make(be, acc, 1, c1, 0, false), rstd = make(be, acc, 1, c1, 0, false);
    void *rm0 = th_snapshot(&rm.buf), *rv0 = th_snapshot(&rv.buf);
    fg_batch_norm_options opt;
    memset(&opt, 0, sizeof opt);
    opt.dropout.p = 0.2, opt.dropout.seed = 7, opt.dropout.offset = 3;
    TH_OK(fg_batch_norm_forward(ctx, &opt, &x.t, &r.t, &w.t, &b.t, &rm.t, &rv.t, &y.t, &s.t, &mean.t, &rstd.t));
    double *y_full = dalloc(N * C), *rm_full = dalloc(C), *rv_full = dalloc(C);
    th_get(&y.buf, &y.t, y_full);
    th_get(&rm.buf, &rm.t, rm_full);
    th_get(&rv.buf, &rv.t, rv_full);
    /* halves: views into x, r, s, y at their first rows (the dropout's flat index is per op: the
       second half's mask must come from its own offset to match — so the split runs without
       dropout and takes the fused forward's s as its x) */
    th_get(&s.buf, &s.t, s.v);
    const int64_t rows[2] = {N1, N - N1}, first[2] = {0, N1};
    th_operand sums[2], half_y[2], half_rm[2], half_rv[2];
    fg_batch_norm_options plain = opt;
    plain.dropout.p = 0;
    double *total = dalloc(2 * C + 1);
    for (int h = 0; h < 2; h++) {
        const int64_t *shape = h ? h2 : h1;
        sums[h] = make(be, FG_F64, 1, sn, 0, false);
        fg_tensor xs = th_tensor(&s.buf, first[h] * C, 2, shape, NULL);
        TH_OK(fg_batch_norm_stats(ctx, &plain, &xs, NULL, NULL, &sums[h].t));
        double *v = dalloc(2 * C + 1);
        th_get(&sums[h].buf, &sums[h].t, v);
        for (int64_t j = 0; j < 2 * C + 1; j++) total[j] += v[j];
        TH_CHECK(v[2 * C] == (double)rows[h], "%s: sums[2C]=%g, the rows %lld", label, v[2 * C], (long long)rows[h]);
        free(v);
    }
    for (int h = 0; h < 2; h++) {
        th_put(&sums[h].buf, &sums[h].t, total); /* the all-reduce */
        half_y[h] = make(be, dt, 2, h ? h2 : h1, 0, false);
        half_rm[h] = make(be, FG_F32, 1, c1, 0, false), half_rv[h] = make(be, FG_F32, 1, c1, 0, false);
        th_restore(&half_rm[h].buf, rm0), th_restore(&half_rv[h].buf, rv0);
        fg_tensor xs = th_tensor(&s.buf, first[h] * C, 2, h ? h2 : h1, NULL);
        TH_OK(fg_batch_norm_apply(ctx, &plain, &xs, &sums[h].t, &w.t, &b.t, &half_rm[h].t, &half_rv[h].t, &half_y[h].t,
                                  NULL, NULL));
        th_verify("y (split)", &half_y[h], y_full + first[h] * C, th_tol(dt, false), label);
        th_verify("running_mean (split)", &half_rm[h], rm_full, 1e-6, label);
        th_verify("running_var (split)", &half_rv[h], rv_full, 1e-6, label);
    }
    /* the backward: full vs split */
    th_operand dy = make(be, dt, 2, full, 0, true), dx = make(be, dt, 2, full, 0, false);
    th_operand dw = make(be, FG_F32, 1, c1, 0, false), db = make(be, FG_F32, 1, c1, 0, false);
    TH_OK(fg_batch_norm_backward(ctx, &plain, &dy.t, &s.t, &w.t, &mean.t, &rstd.t, &dx.t, NULL, &dw.t, &db.t, 0));
    double *dx_full = dalloc(N * C), *dw_full = dalloc(C), *db_full = dalloc(C);
    th_get(&dx.buf, &dx.t, dx_full), th_get(&dw.buf, &dw.t, dw_full), th_get(&db.buf, &db.t, db_full);
    for (int64_t j = 0; j < 2 * C + 1; j++) total[j] = 0;
    for (int h = 0; h < 2; h++) {
        fg_tensor dys = th_tensor(&dy.buf, first[h] * C, 2, h ? h2 : h1, NULL);
        fg_tensor xs = th_tensor(&s.buf, first[h] * C, 2, h ? h2 : h1, NULL);
        TH_OK(fg_batch_norm_backward_stats(ctx, &plain, &dys, &xs, &mean.t, &rstd.t, &sums[h].t));
        double *v = dalloc(2 * C + 1);
        th_get(&sums[h].buf, &sums[h].t, v);
        for (int64_t j = 0; j < 2 * C + 1; j++) total[j] += v[j];
        free(v);
    }
    for (int h = 0; h < 2; h++) {
        th_put(&sums[h].buf, &sums[h].t, total);
        fg_tensor dys = th_tensor(&dy.buf, first[h] * C, 2, h ? h2 : h1, NULL);
        fg_tensor xs = th_tensor(&s.buf, first[h] * C, 2, h ? h2 : h1, NULL);
        th_operand hdx = make(be, dt, 2, h ? h2 : h1, 0, false);
        th_operand hdw = make(be, FG_F32, 1, c1, 0, false), hdb = make(be, FG_F32, 1, c1, 0, false);
        TH_OK(fg_batch_norm_backward_apply(ctx, &plain, &dys, &xs, &w.t, &mean.t, &rstd.t, &sums[h].t, &hdx.t, NULL,
                                           &hdw.t, &hdb.t, 0));
        th_verify("dx (split)", &hdx, dx_full + first[h] * C, 4 * th_tol(dt, false), label);
        th_verify("dw (split)", &hdw, dw_full, 1e-6, label);
        th_verify("db (split)", &hdb, db_full, 1e-6, label);
        th_drop(&hdx), th_drop(&hdw), th_drop(&hdb);
    }
    for (int h = 0; h < 2; h++) th_drop(&sums[h]), th_drop(&half_y[h]), th_drop(&half_rm[h]), th_drop(&half_rv[h]);
    free(total), free(y_full), free(rm_full), free(rv_full), free(dx_full), free(dw_full), free(db_full);
    free(rm0), free(rv0);
    th_drop(&x), th_drop(&r), th_drop(&w), th_drop(&b), th_drop(&rm), th_drop(&rv), th_drop(&y), th_drop(&s);
    th_drop(&mean), th_drop(&rstd), th_drop(&dy), th_drop(&dx), th_drop(&dw), th_drop(&db);
}

typedef struct bn_fd {
    fg_batch_norm_options opt;
    th_operand *x, *r, *w, *b, *y;
} bn_fd;

static fg_status bn_fd_forward(fg_context *ctx, void *arg) {
    bn_fd *a = arg;
    return fg_batch_norm_forward(ctx, &a->opt, &a->x->t, &a->r->t, &a->w->t, &a->b->t, NULL, NULL, &a->y->t, NULL,
                                 NULL, NULL);
}

static void bn_finite_differences(fg_context *ctx) {
    const int64_t shape[3] = {2, 5, 7}, c1[1] = {7};
    const fg_backend be = FG_BACKEND_CPU;
    th_operand x = make(be, FG_F64, 3, shape, 0, true), r = make(be, FG_F64, 3, shape, 0, true);
    th_operand w = make(be, FG_F64, 1, c1, 0, true), b = make(be, FG_F64, 1, c1, 0, true);
    th_operand y = make(be, FG_F64, 3, shape, 0, false), s = make(be, FG_F64, 3, shape, 0, false);
    th_operand mean = make(be, FG_F64, 1, c1, 0, false), rstd = make(be, FG_F64, 1, c1, 0, false);
    th_operand R = make(be, FG_F64, 3, shape, 0, true), dx = make(be, FG_F64, 3, shape, 0, false);
    th_operand dr = make(be, FG_F64, 3, shape, 0, false);
    th_operand dw = make(be, FG_F64, 1, c1, 0, false), db = make(be, FG_F64, 1, c1, 0, false);
    bn_fd a;
    memset(&a, 0, sizeof a);
    a.opt.dropout.p = 0.3, a.opt.dropout.seed = 11, a.opt.dropout.offset = 12;
    a.x = &x, a.r = &r, a.w = &w, a.b = &b, a.y = &y;
    TH_OK(fg_batch_norm_forward(ctx, &a.opt, &x.t, &r.t, &w.t, &b.t, NULL, NULL, &y.t, &s.t, &mean.t, &rstd.t));
    TH_OK(fg_batch_norm_backward(ctx, &a.opt, &R.t, &s.t, &w.t, &mean.t, &rstd.t, &dx.t, &dr.t, &dw.t, &db.t, 0));
    th_operand *params[4] = {&x, &r, &w, &b}, *grads[4] = {&dx, &dr, &dw, &db};
    const char *const names[4] = {"x", "r", "w", "b"};
    th_fd_check(ctx, "batch_norm fused", bn_fd_forward, &a, &y, &R, params, grads, names, 4, 0, false);
    th_drop(&x), th_drop(&r), th_drop(&w), th_drop(&b), th_drop(&y), th_drop(&s), th_drop(&mean), th_drop(&rstd);
    th_drop(&R), th_drop(&dx), th_drop(&dr), th_drop(&dw), th_drop(&db);
}

/* ------------------------------------------------------------------ dropout */

static void dropout_checks(fg_context *ctx, fg_backend be, void **cpu_bits, size_t *cpu_bytes) {
    const int64_t shape[2] = {37, 2711}, n = 37 * 2711;
    for (int di = 0; di < 4; di++) {
        const fg_dtype dt = th_dtypes[di];
        if (be == FG_BACKEND_CUDA && dt == FG_F64) continue;
        char label[64];
        snprintf(label, sizeof label, "[%s %s dropout]", th_backend_name(be), fg_dtype_name(dt));
        th_operand x = make(be, dt, 2, shape, 0, true), y = make(be, dt, 2, shape, 0, false);
        th_operand y2 = make(be, dt, 2, shape, 0, false);
        fg_dropout_options opt = {0.3, 0xfeedbeefcafeull, 1ull << 40};
        double *ref = dalloc(n);
        int64_t dropped = 0;
        for (int64_t i = 0; i < n; i++) {
            const double m = mult(opt.p, opt.seed, opt.offset, i);
            ref[i] = x.v[i] * m;
            dropped += m == 0.0;
        }
        /* the generator's drop rate: within 5 standard deviations of p */
        const double sd = sqrt((double)n * opt.p * (1 - opt.p));
        TH_CHECK(fabs((double)dropped - opt.p * (double)n) < 5 * sd, "%s: %lld of %lld dropped at p=%.2f", label,
                 (long long)dropped, (long long)n, opt.p);
        TH_OK(fg_dropout_forward(ctx, &opt, &x.t, &y.t));
        th_verify("y", &y, ref, th_tol(dt, false), label);
        /* each element exactly: kept ones are x·scale rounded once, dropped ones 0 */
        double *got = dalloc(n);
        th_get(&y.buf, &y.t, got);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double want = ref[i];
            if (dt != FG_F64) want = (double)((float)x.v[i] * (float)(ref[i] != 0 ? 1.0 / (1.0 - opt.p) : 0.0));
            th_round(dt, &want, 1);
            bad += got[i] != want;
        }
        TH_CHECK(bad == 0, "%s: %lld elements differ from x·m rounded once", label, (long long)bad);
        /* the backward regenerates the same mask: dropout_backward(dy = x) has the forward's bits */
        TH_OK(fg_dropout_backward(ctx, &opt, &x.t, &y2.t, 0));
        void *a = th_snapshot(&y.buf), *b2 = th_snapshot(&y2.buf);
        TH_CHECK(memcmp(a, b2, (size_t)n * fg_dtype_size(dt)) == 0, "%s: the backward's mask differs from the forward's",
                 label);
        /* bitwise rerun */
        TH_OK(fg_dropout_forward(ctx, &opt, &x.t, &y2.t));
        th_get_raw(&y2.buf, b2, (size_t)n * fg_dtype_size(dt));
        TH_CHECK(memcmp(a, b2, (size_t)n * fg_dtype_size(dt)) == 0, "%s: a rerun differs", label);
        /* the same bits on every backend (x is drawn per backend: compare the mask through a fixed x) */
        if (di < 3) {
            double *ones = dalloc(n);
            for (int64_t i = 0; i < n; i++) ones[i] = 1.0 + (double)(i % 7) / 8.0;
            th_put(&x.buf, &x.t, ones);
            TH_OK(fg_dropout_forward(ctx, &opt, &x.t, &y2.t));
            th_get_raw(&y2.buf, b2, (size_t)n * fg_dtype_size(dt));
            if (be == FG_BACKEND_CPU) {
                free(cpu_bits[di]);
                cpu_bits[di] = malloc((size_t)n * fg_dtype_size(dt));
                memcpy(cpu_bits[di], b2, (size_t)n * fg_dtype_size(dt));
                cpu_bytes[di] = (size_t)n * fg_dtype_size(dt);
            } else if (cpu_bits[di]) {
                TH_CHECK(memcmp(cpu_bits[di], b2, cpu_bytes[di]) == 0, "%s: CUDA's bits differ from the CPU's", label);
            }
            free(ones);
        }
        /* accumulate: dx += dy·m */
        th_randomize(&x);
        for (int64_t i = 0; i < n; i++) ref[i] = x.v[i] * mult(opt.p, opt.seed, opt.offset, i);
        th_prepare_out(&y, ref, 1);
        TH_OK(fg_dropout_backward(ctx, &opt, &x.t, &y.t, 1));
        th_verify("dx (accumulate)", &y, ref, th_tol(dt, false), label);
        /* p = 0 copies, p = 1 zeroes (NaN stays NaN) */
        fg_dropout_options none = {0.0, 1, 2}, all = {1.0, 1, 2};
        TH_OK(fg_dropout_forward(ctx, &none, &x.t, &y.t));
        th_verify("y (p=0)", &y, x.v, 0, label);
        for (int64_t i = 0; i < n; i++) ref[i] = 0.0;
        TH_OK(fg_dropout_forward(ctx, &all, &x.t, &y.t));
        th_verify("y (p=1)", &y, ref, 0, label);
        free(a), free(b2), free(got), free(ref);
        th_drop(&x), th_drop(&y), th_drop(&y2);
    }
}

/* The residual sum s = x + m·r (an f32 multiply, an f32 add, rounded once to the dtype) has the
 * same bits on every backend, from the fused row norm and from BatchNorm's stats step. Inputs from
 * a formula, so each backend gets the same ones. */
static void residual_bits(fg_context *ctx, fg_backend be, void **cpu_bits) {
    const int64_t shape[2] = {23, 1000}, n = 23 * 1000, sn[1] = {2 * 1000 + 1};
    for (int di = 0; di < 3; di++) {
        const fg_dtype dt = th_dtypes[di];
        const size_t bytes = (size_t)n * fg_dtype_size(dt);
        char label[64];
        snprintf(label, sizeof label, "[%s %s residual bits]", th_backend_name(be), fg_dtype_name(dt));
        th_operand x = make(be, dt, 2, shape, 0, false), r = make(be, dt, 2, shape, 0, false);
        th_operand y = make(be, dt, 2, shape, 0, false), s = make(be, dt, 2, shape, 0, false);
        th_operand s2 = make(be, dt, 2, shape, 0, false), sums = make(be, FG_F64, 1, sn, 0, false);
        for (int64_t i = 0; i < n; i++) x.v[i] = sin(0.37 * (double)i), r.v[i] = cos(0.11 * (double)i) * 3.3;
        th_round(dt, x.v, n), th_round(dt, r.v, n);
        th_put(&x.buf, &x.t, x.v), th_put(&r.buf, &r.t, r.v);
        fg_norm_options opt;
        memset(&opt, 0, sizeof opt);
        opt.dropout.p = 0.3, opt.dropout.seed = 2024, opt.dropout.offset = 6;
        TH_OK(fg_norm_forward(ctx, &opt, &x.t, &r.t, NULL, NULL, &y.t, &s.t, NULL, NULL));
        fg_batch_norm_options bo;
        memset(&bo, 0, sizeof bo);
        bo.dropout = opt.dropout;
        TH_OK(fg_batch_norm_stats(ctx, &bo, &x.t, &r.t, &s2.t, &sums.t));
        void *a = malloc(bytes), *b = malloc(bytes);
        th_get_raw(&s.buf, a, bytes), th_get_raw(&s2.buf, b, bytes);
        TH_CHECK(memcmp(a, b, bytes) == 0, "%s: the row norm's s and batch_norm_stats' s differ", label);
        /* and each element is x + m·r as documented */
        double *got = dalloc(n);
        th_get(&s.buf, &s.t, got);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double want = (double)((float)x.v[i] + (float)mult(0.3, 2024, 6, i) * (float)r.v[i]);
            th_round(dt, &want, 1);
            bad += got[i] != want;
        }
        TH_CHECK(bad == 0, "%s: %lld elements of s are not x + m·r rounded once", label, (long long)bad);
        if (be == FG_BACKEND_CPU) {
            free(cpu_bits[di]);
            cpu_bits[di] = a, a = NULL;
        } else if (cpu_bits[di]) {
            TH_CHECK(memcmp(cpu_bits[di], a, bytes) == 0, "%s: CUDA's s differs from the CPU's", label);
        }
        free(a), free(b), free(got);
        th_drop(&x), th_drop(&r), th_drop(&y), th_drop(&s), th_drop(&s2), th_drop(&sums);
    }
}

/* A scalar (rank 0) is one element at flat index 0. */
static void dropout_scalar(fg_context *ctx, fg_backend be) {
    th_operand x = make(be, FG_F32, 0, NULL, 0, false), y = make(be, FG_F32, 0, NULL, 0, false);
    double v = 1.5, want[1];
    th_put(&x.buf, &x.t, &v);
    for (uint64_t seed = 0; seed < 8; seed++) { /* kept for some seeds, dropped for others */
        fg_dropout_options opt = {0.5, seed, 0};
        want[0] = v * mult(0.5, seed, 0, 0);
        th_poison(&y.buf);
        TH_OK(fg_dropout_forward(ctx, &opt, &x.t, &y.t));
        th_verify("y (scalar)", &y, want, 0, th_backend_name(be));
    }
    th_drop(&x), th_drop(&y);
}

/* The fused residual's mask is the dropout op's, and the norm backward's dr regenerates it:
 * with x = 0 and r = 1, s = m exactly; dr must be m·dx element by element. */
static void residual_mask(fg_context *ctx, fg_backend be) {
    const int64_t shape[2] = {9, 300}, n = 9 * 300;
    char label[64];
    snprintf(label, sizeof label, "[%s residual mask]", th_backend_name(be));
    th_operand x = make(be, FG_F32, 2, shape, 0, false), r = make(be, FG_F32, 2, shape, 0, false);
    th_operand y = make(be, FG_F32, 2, shape, 0, false), s = make(be, FG_F32, 2, shape, 0, false);
    th_operand dy = make(be, FG_F32, 2, shape, 0, true), dx = make(be, FG_F32, 2, shape, 0, false);
    th_operand dr = make(be, FG_F32, 2, shape, 0, false), d = make(be, FG_F32, 2, shape, 0, false);
    double *v = dalloc(n), *sv = dalloc(n), *dxv = dalloc(n), *drv = dalloc(n), *dv = dalloc(n);
    for (int64_t i = 0; i < n; i++) v[i] = 0.0;
    th_put(&x.buf, &x.t, v);
    for (int64_t i = 0; i < n; i++) v[i] = 1.0;
    th_put(&r.buf, &r.t, v);
    fg_norm_options opt;
    memset(&opt, 0, sizeof opt);
    opt.dropout.p = 0.25, opt.dropout.seed = 31337, opt.dropout.offset = 9;
    TH_OK(fg_norm_forward(ctx, &opt, &x.t, &r.t, NULL, NULL, &y.t, &s.t, NULL, NULL));
    TH_OK(fg_norm_backward(ctx, &opt, &dy.t, NULL, &s.t, NULL, NULL, NULL, &dx.t, &dr.t, NULL, NULL, 0));
    fg_dropout_options dop = {opt.dropout.p, opt.dropout.seed, opt.dropout.offset};
    TH_OK(fg_dropout_forward(ctx, &dop, &r.t, &d.t));
    th_get(&s.buf, &s.t, sv), th_get(&dx.buf, &dx.t, dxv), th_get(&dr.buf, &dr.t, drv), th_get(&d.buf, &d.t, dv);
    int64_t bad = 0, bad_op = 0;
    for (int64_t i = 0; i < n; i++) {
        bad += drv[i] != (double)((float)sv[i] * (float)dxv[i]);
        bad_op += dv[i] != sv[i];
    }
    TH_CHECK(bad == 0, "%s: %lld elements of dr are not m·dx with the forward's m", label, (long long)bad);
    TH_CHECK(bad_op == 0, "%s: %lld elements of the fused mask differ from dropout_forward's", label, (long long)bad_op);
    free(v), free(sv), free(dxv), free(drv), free(dv);
    th_drop(&x), th_drop(&r), th_drop(&y), th_drop(&s), th_drop(&dy), th_drop(&dx), th_drop(&dr), th_drop(&d);
}

/* ------------------------------------------------------------------ RevIN */

static void revin_checks(fg_context *ctx, fg_backend be) {
    const int64_t shape[3] = {3, 37, 7}, c1[1] = {7}, st[2] = {3, 7};
    const int64_t B = 3, L = 37, C = 7, n = B * L * C;
    for (int di = 0; di < 4; di++) {
        const fg_dtype dt = th_dtypes[di];
        if (be == FG_BACKEND_CUDA && dt == FG_F64) continue;
        const fg_dtype acc = acc_of(dt);
        for (int variant = 0; variant < 2; variant++) {
            const bool last = variant == 1;
            char label[80];
            snprintf(label, sizeof label, "[%s %s revin%s]", th_backend_name(be), fg_dtype_name(dt),
                     last ? " subtract_last" : "");
            th_operand x = make(be, dt, 3, shape, variant, true);
            th_operand w = make(be, dt, 1, c1, 0, true), b = make(be, dt, 1, c1, 0, true);
            for (int64_t j = 0; j < C; j++) w.v[j] = 0.5 + fabs(w.v[j]); /* denorm divides by it */
            th_round(dt, w.v, C);
            th_put(&w.buf, &w.t, w.v);
            th_operand mean = make(be, acc, 2, st, 0, false), sd = make(be, acc, 2, st, 0, false);
            th_operand y = make(be, dt, 3, shape, variant, false), z = make(be, dt, 3, shape, 0, false);
            fg_revin_options opt = {variant ? 1e-3 : 0, 0, last};
            const double eps = variant ? 1e-3 : 1e-5;
            double *rm = dalloc(B * C), *rs = dalloc(B * C), *ry = dalloc(n), *rz = dalloc(n);
            for (int64_t i = 0; i < B; i++)
                for (int64_t j = 0; j < C; j++) {
                    double m = 0, q = 0;
                    for (int64_t l = 0; l < L; l++) m += x.v[(i * L + l) * C + j];
                    m /= (double)L;
                    for (int64_t l = 0; l < L; l++) q += pow(x.v[(i * L + l) * C + j] - m, 2);
                    rm[i * C + j] = last ? x.v[(i * L + L - 1) * C + j] : m;
                    rs[i * C + j] = sqrt(q / (double)L + eps);
                }
            TH_OK(fg_revin_stats(ctx, &opt, &x.t, &mean.t, &sd.t));
            th_verify("mean", &mean, rm, th_tol(acc, false), label);
            th_verify("stdev", &sd, rs, th_tol(acc, false), label);
            th_get(&mean.buf, &mean.t, mean.v), th_get(&sd.buf, &sd.t, sd.v);
            for (int64_t i = 0; i < n; i++) {
                const int64_t k = (i / (L * C)) * C + i % C, j = i % C;
                ry[i] = (x.v[i] - mean.v[k]) / sd.v[k] * w.v[j] + b.v[j];
            }
            TH_OK(fg_revin_forward(ctx, &opt, &x.t, &w.t, &b.t, &mean.t, &sd.t, &y.t));
            th_verify("y (norm)", &y, ry, th_tol(dt, false), label);
            fg_revin_options den = opt;
            den.denorm = 1;
            for (int64_t i = 0; i < n; i++) {
                const int64_t k = (i / (L * C)) * C + i % C, j = i % C;
                rz[i] = (x.v[i] - b.v[j]) / (w.v[j] + eps * eps) * sd.v[k] + mean.v[k];
            }
            TH_OK(fg_revin_forward(ctx, &den, &x.t, &w.t, &b.t, &mean.t, &sd.t, &z.t));
            th_verify("y (denorm)", &z, rz, th_tol(dt, false), label);
            /* the backward, stats constant */
            th_operand dy = make(be, dt, 3, shape, 0, true), dx = make(be, dt, 3, shape, 0, false);
            th_operand dw = make(be, acc, 1, c1, 0, false), db = make(be, dt, 1, c1, 0, false);
            for (int dn = 0; dn < 2; dn++) {
                double *rdx = dalloc(n), *rdw = dalloc(C), *rdb = dalloc(C);
                for (int64_t i = 0; i < n; i++) {
                    const int64_t k = (i / (L * C)) * C + i % C, j = i % C;
                    if (dn) {
                        const double inv = 1.0 / (w.v[j] + eps * eps);
                        rdx[i] = dy.v[i] * sd.v[k] * inv;
                        rdw[j] += -dy.v[i] * (x.v[i] - b.v[j]) * sd.v[k] * inv * inv;
                        rdb[j] += -dy.v[i] * sd.v[k] * inv;
                    } else {
                        rdx[i] = dy.v[i] * w.v[j] / sd.v[k];
                        rdw[j] += dy.v[i] * (x.v[i] - mean.v[k]) / sd.v[k];
                        rdb[j] += dy.v[i];
                    }
                }
                th_prepare_out(&dx, rdx, dn), th_prepare_out(&dw, rdw, dn), th_prepare_out(&db, rdb, dn);
                TH_OK(fg_revin_backward(ctx, dn ? &den : &opt, &dy.t, &x.t, &w.t, &b.t, &mean.t, &sd.t, &dx.t, &dw.t,
                                        &db.t, dn));
                char what[120];
                snprintf(what, sizeof what, "%s backward %s", label, dn ? "denorm (accumulate)" : "norm");
                th_verify("dx", &dx, rdx, th_tol(dt, false), what);
                th_verify("dw", &dw, rdw, 4 * th_tol(acc, false), what);
                th_verify("db", &db, rdb, th_tol(dt, false) * (dt == FG_F32 ? 4 : 1), what);
                free(rdx), free(rdw), free(rdb);
            }
            free(rm), free(rs), free(ry), free(rz);
            th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&mean), th_drop(&sd), th_drop(&y), th_drop(&z);
            th_drop(&dy), th_drop(&dx), th_drop(&dw), th_drop(&db);
        }
    }
}

typedef struct revin_fd {
    fg_revin_options opt;
    th_operand *x, *w, *b, *mean, *sd, *y;
} revin_fd;

static fg_status revin_fd_forward(fg_context *ctx, void *arg) {
    revin_fd *a = arg;
    return fg_revin_forward(ctx, &a->opt, &a->x->t, &a->w->t, &a->b->t, &a->mean->t, &a->sd->t, &a->y->t);
}

static void revin_finite_differences(fg_context *ctx) {
    const int64_t shape[3] = {2, 5, 3}, c1[1] = {3}, st[2] = {2, 3};
    const fg_backend be = FG_BACKEND_CPU;
    for (int dn = 0; dn < 2; dn++) {
        th_operand x = make(be, FG_F64, 3, shape, 0, true), w = make(be, FG_F64, 1, c1, 0, true);
        th_operand b = make(be, FG_F64, 1, c1, 0, true), mean = make(be, FG_F64, 2, st, 0, false);
        th_operand sd = make(be, FG_F64, 2, st, 0, false), y = make(be, FG_F64, 3, shape, 0, false);
        th_operand R = make(be, FG_F64, 3, shape, 0, true), dx = make(be, FG_F64, 3, shape, 0, false);
        th_operand dw = make(be, FG_F64, 1, c1, 0, false), db = make(be, FG_F64, 1, c1, 0, false);
        for (int64_t j = 0; j < 3; j++) w.v[j] = 0.5 + fabs(w.v[j]); /* 1/(w + eps²): away from its pole */
        th_put(&w.buf, &w.t, w.v);
        revin_fd a = {{0.1, dn, 0}, &x, &w, &b, &mean, &sd, &y};
        TH_OK(fg_revin_stats(ctx, &a.opt, &x.t, &mean.t, &sd.t));
        TH_OK(fg_revin_backward(ctx, &a.opt, &R.t, &x.t, &w.t, &b.t, &mean.t, &sd.t, &dx.t, &dw.t, &db.t, 0));
        th_operand *params[3] = {&x, &w, &b}, *grads[3] = {&dx, &dw, &db};
        const char *const names[3] = {"x", "w", "b"};
        th_fd_check(ctx, dn ? "revin denorm" : "revin norm", revin_fd_forward, &a, &y, &R, params, grads, names, 3, 0,
                    false);
        th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&mean), th_drop(&sd), th_drop(&y), th_drop(&R);
        th_drop(&dx), th_drop(&dw), th_drop(&db);
    }
}

/* ------------------------------------------------------------------ NaN, reruns, in place, empty */

static void nan_propagation(fg_context *ctx, fg_backend be) {
    const int64_t shape[2] = {4, 33}, c1[1] = {33}, n = 4 * 33;
    char label[64];
    snprintf(label, sizeof label, "[%s NaN]", th_backend_name(be));
    th_operand x = make(be, FG_F32, 2, shape, 0, true), y = make(be, FG_F32, 2, shape, 0, false);
    th_operand w = make(be, FG_F32, 1, c1, 0, true);
    x.v[1 * 33 + 5] = NAN;
    th_put(&x.buf, &x.t, x.v);
    fg_norm_options opt;
    memset(&opt, 0, sizeof opt);
    TH_OK(fg_norm_forward(ctx, &opt, &x.t, NULL, &w.t, NULL, &y.t, NULL, NULL, NULL));
    double *got = dalloc(n);
    th_get(&y.buf, &y.t, got);
    int64_t nan_row = 0, nan_other = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i / 33 == 1) nan_row += isnan(got[i]) != 0;
        else nan_other += !isfinite(got[i]);
    }
    TH_CHECK(nan_row == 33 && nan_other == 0, "%s layer_norm: the NaN's row is NaN (%lld of 33), no other (%lld)", label,
             (long long)nan_row, (long long)nan_other);
    /* BatchNorm: the NaN's channel is NaN in every row, the others finite */
    fg_batch_norm_options bo;
    memset(&bo, 0, sizeof bo);
    TH_OK(fg_batch_norm_forward(ctx, &bo, &x.t, NULL, NULL, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    th_get(&y.buf, &y.t, got);
    int64_t nan_col = 0;
    nan_other = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 33 == 5) nan_col += isnan(got[i]) != 0;
        else nan_other += !isfinite(got[i]);
    }
    TH_CHECK(nan_col == 4 && nan_other == 0, "%s batch_norm: the NaN's channel is NaN (%lld of 4), no other (%lld)",
             label, (long long)nan_col, (long long)nan_other);
    /* dropout keeps a NaN NaN whether it drops it or not */
    fg_dropout_options dop = {0.5, 3, 4};
    TH_OK(fg_dropout_forward(ctx, &dop, &x.t, &y.t));
    th_get(&y.buf, &y.t, got);
    TH_CHECK(isnan(got[1 * 33 + 5]), "%s dropout: a NaN stays NaN", label);
    free(got);
    th_drop(&x), th_drop(&y), th_drop(&w);
}

/* The same bits on a rerun, and in place (s over x, dx over dy) the same as out of place. */
static void reruns_and_in_place(fg_context *ctx, fg_backend be) {
    /* rows of a few lanes, and rows of a whole block (CUDA's lean backward), at a power of two and
       not (1/D inexact: a backward whose rstd rounds sq·(1/D) + eps otherwise than the forward's
       shows here) */
    for (int q = 0; q < 9; q++) {
        const int64_t R = q < 3 ? 700 : 40, D = q < 3 ? 96 : q < 6 ? 4096 : 3000;
        const int64_t shape[2] = {R, D}, d1[1] = {D}, n = R * D;
        const fg_dtype dt = th_dtypes[q % 3];
        char label[64];
        snprintf(label, sizeof label, "[%s %s D=%lld reruns]", th_backend_name(be), fg_dtype_name(dt), (long long)D);
        th_operand x = make(be, dt, 2, shape, 0, true), r = make(be, dt, 2, shape, 0, true);
        th_operand w = make(be, dt, 1, d1, 0, true), b = make(be, dt, 1, d1, 0, true);
        th_operand y = make(be, dt, 2, shape, 0, false), s = make(be, dt, 2, shape, 0, false);
        th_operand rstd = make(be, FG_F32, 1, &shape[0], 0, false), mean = make(be, FG_F32, 1, &shape[0], 0, false);
        th_operand dy = make(be, dt, 2, shape, 0, true), dx = make(be, dt, 2, shape, 0, false);
        th_operand dw = make(be, FG_F32, 1, d1, 0, false), db = make(be, FG_F32, 1, d1, 0, false);
        fg_norm_options opt;
        memset(&opt, 0, sizeof opt);
        opt.dropout.p = 0.1, opt.dropout.seed = 5;
        TH_OK(fg_norm_forward(ctx, &opt, &x.t, &r.t, &w.t, &b.t, &y.t, &s.t, &mean.t, &rstd.t));
        void *y0 = th_snapshot(&y.buf);
        double *s0 = dalloc(n), *got = dalloc(n), *dx0v = dalloc(n);
        th_get(&s.buf, &s.t, s0);
        TH_OK(fg_norm_backward(ctx, &opt, &dy.t, NULL, &s.t, &w.t, &mean.t, &rstd.t, &dx.t, NULL, &dw.t, &db.t, 0));
        void *dx0 = th_snapshot(&dx.buf), *dw0 = th_snapshot(&dw.buf), *db0 = th_snapshot(&db.buf);
        th_get(&dx.buf, &dx.t, dx0v);
        TH_OK(fg_norm_backward(ctx, &opt, &dy.t, NULL, &s.t, &w.t, &mean.t, &rstd.t, &dx.t, NULL, &dw.t, &db.t, 0));
        TH_CHECK(th_unchanged(&dx.buf, dx0) && th_unchanged(&dw.buf, dw0) && th_unchanged(&db.buf, db0),
                 "%s: the backward's rerun differs", label);
        /* the backward recomputing its statistics: the saved ones' bits */
        TH_OK(fg_norm_backward(ctx, &opt, &dy.t, NULL, &s.t, &w.t, NULL, NULL, &dx.t, NULL, &dw.t, &db.t, 0));
        TH_CHECK(th_unchanged(&dx.buf, dx0) && th_unchanged(&dw.buf, dw0) && th_unchanged(&db.buf, db0),
                 "%s: recomputed statistics change the backward's bits", label);
        /* in place: s over x, then dx over dy */
        TH_OK(fg_norm_forward(ctx, &opt, &x.t, &r.t, &w.t, &b.t, &y.t, &x.t, NULL, NULL));
        th_get(&x.buf, &x.t, got);
        TH_CHECK(th_unchanged(&y.buf, y0) && memcmp(got, s0, (size_t)n * sizeof(double)) == 0,
                 "%s: s written over x differs", label);
        TH_OK(fg_norm_backward(ctx, &opt, &dy.t, NULL, &s.t, &w.t, &mean.t, &rstd.t, &dy.t, NULL, NULL, NULL, 0));
        th_get(&dy.buf, &dy.t, got);
        TH_CHECK(memcmp(got, dx0v, (size_t)n * sizeof(double)) == 0, "%s: dx written over dy differs", label);
        /* BatchNorm backward reruns */
        fg_batch_norm_options bo;
        memset(&bo, 0, sizeof bo);
        th_operand cm = make(be, FG_F32, 1, d1, 0, false), cr = make(be, FG_F32, 1, d1, 0, false);
        th_randomize(&dy);
        TH_OK(fg_batch_norm_forward(ctx, &bo, &x.t, NULL, &w.t, &b.t, NULL, NULL, &y.t, NULL, &cm.t, &cr.t));
        TH_OK(fg_batch_norm_backward(ctx, &bo, &dy.t, &x.t, &w.t, &cm.t, &cr.t, &dx.t, NULL, &dw.t, &db.t, 0));
        void *bdx = th_snapshot(&dx.buf), *bdw = th_snapshot(&dw.buf);
        TH_OK(fg_batch_norm_backward(ctx, &bo, &dy.t, &x.t, &w.t, &cm.t, &cr.t, &dx.t, NULL, &dw.t, &db.t, 0));
        TH_CHECK(th_unchanged(&dx.buf, bdx) && th_unchanged(&dw.buf, bdw), "%s: batch_norm's backward rerun differs",
                 label);
        free(y0), free(s0), free(got), free(dx0v), free(dx0), free(dw0), free(db0), free(bdx), free(bdw);
        th_drop(&x), th_drop(&r), th_drop(&w), th_drop(&b), th_drop(&y), th_drop(&s), th_drop(&rstd), th_drop(&mean);
        th_drop(&dy), th_drop(&dx), th_drop(&dw), th_drop(&db), th_drop(&cm), th_drop(&cr);
    }
}

/* No rows: the sums over them are zeros (or left as they are with accumulate). */
static void empty(fg_context *ctx, fg_backend be) {
    const int64_t shape[2] = {0, 12}, d1[1] = {12};
    th_operand x = make(be, FG_F32, 2, shape, 0, false), dy = make(be, FG_F32, 2, shape, 0, false);
    th_operand dw = make(be, FG_F32, 1, d1, 0, false), db = make(be, FG_F32, 1, d1, 0, false);
    double zero[12] = {0};
    fg_norm_options opt;
    memset(&opt, 0, sizeof opt);
    TH_OK(fg_norm_backward(ctx, &opt, &dy.t, NULL, &x.t, NULL, NULL, NULL, NULL, NULL, &dw.t, &db.t, 0));
    th_verify("dw (no rows)", &dw, zero, 0, th_backend_name(be));
    th_verify("db (no rows)", &db, zero, 0, th_backend_name(be));
    th_randomize(&dw);
    void *snap = th_snapshot(&dw.buf);
    TH_OK(fg_norm_backward(ctx, &opt, &dy.t, NULL, &x.t, NULL, NULL, NULL, NULL, NULL, &dw.t, NULL, 1));
    TH_CHECK(th_unchanged(&dw.buf, snap), "%s: accumulating no rows changed dw", th_backend_name(be));
    free(snap);
    th_drop(&x), th_drop(&dy), th_drop(&dw), th_drop(&db);
}

/* ------------------------------------------------------------------ bad input */

static void bad_inputs(fg_context *ctx, fg_backend be) {
    const int64_t shape[2] = {5, 8}, d1[1] = {8}, d7[1] = {7}, r5[1] = {5}, one[2] = {1, 8}, sn[1] = {16};
    th_operand x = make(be, FG_F32, 2, shape, 0, true), y = make(be, FG_F32, 2, shape, 0, true);
    th_operand w = make(be, FG_F32, 1, d1, 0, true), w7 = make(be, FG_F32, 1, d7, 0, true);
    th_operand mean = make(be, FG_F32, 1, r5, 0, true), mean16 = make(be, FG_BF16, 1, r5, 0, true);
    th_operand xt = make(be, FG_F32, 2, shape, 2, true), x1 = make(be, FG_F32, 2, one, 0, true);
    th_operand y1 = make(be, FG_F32, 2, one, 0, true), sums = make(be, FG_F64, 1, sn, 0, true);
    th_operand rm = make(be, FG_F32, 1, d1, 0, true), rv = make(be, FG_F32, 1, d1, 0, true);
    th_operand xb = make(be, FG_BF16, 2, shape, 0, true);
    fg_norm_options no;
    memset(&no, 0, sizeof no);
    fg_norm_options neg = no, nan_eps = no, bad_kind = no, bad_p = no, rms = no;
    neg.eps = -1e-5, nan_eps.eps = NAN, bad_kind.kind = (fg_norm_kind)7, bad_p.dropout.p = 1.5, rms.kind = FG_NORM_RMS;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "eps", &y, fg_norm_forward(ctx, &neg, &x.t, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "eps", &y,
                  fg_norm_forward(ctx, &nan_eps, &x.t, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "kind", &y,
                  fg_norm_forward(ctx, &bad_kind, &x.t, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &y,
                  fg_norm_forward(ctx, &bad_p, &x.t, &x.t, NULL, NULL, &y.t, NULL, NULL, NULL));
    bad_p.dropout.p = 0.5;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "r is absent", &y,
                  fg_norm_forward(ctx, &bad_p, &x.t, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "w.shape[0]", &y, fg_norm_forward(ctx, &no, &x.t, NULL, &w7.t, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y", &y1, fg_norm_forward(ctx, &no, &x.t, NULL, NULL, NULL, &y1.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "RMSNorm has no mean", &y,
                  fg_norm_forward(ctx, &rms, &x.t, NULL, NULL, NULL, &y.t, NULL, &mean.t, NULL));
    TH_EXPECT_BAD(FG_ERR_DTYPE, "mean", &y, fg_norm_forward(ctx, &no, &x.t, NULL, NULL, NULL, &y.t, NULL, &mean16.t, NULL));
    TH_EXPECT_BAD(FG_ERR_DTYPE, "r", &y, fg_norm_forward(ctx, &no, &x.t, &xb.t, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "x.stride", &y,
                  fg_norm_forward(ctx, &no, &xt.t, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "x is NULL", &y,
                  fg_norm_forward(ctx, &no, NULL, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "rstd is absent", &y,
                  fg_norm_backward(ctx, &no, &x.t, NULL, &x.t, NULL, &mean.t, NULL, &y.t, NULL, NULL, NULL, 0));
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlap", &y,
                  fg_norm_backward(ctx, &no, &x.t, NULL, &y.t, NULL, NULL, NULL, &y.t, &y.t, NULL, NULL, 0));
    /* BatchNorm */
    fg_batch_norm_options bo;
    memset(&bo, 0, sizeof bo);
    fg_batch_norm_options ev = bo, mom = bo, beps = bo;
    ev.eval = 1, mom.momentum = 1.5, beps.eps = -1;
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "running_mean", &y,
                  fg_batch_norm_forward(ctx, &ev, &x.t, NULL, NULL, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "momentum", &y,
                  fg_batch_norm_forward(ctx, &mom, &x.t, NULL, NULL, NULL, &rm.t, &rv.t, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "eps", &y,
                  fg_batch_norm_forward(ctx, &beps, &x.t, NULL, NULL, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "w.shape[0]", &y,
                  fg_batch_norm_forward(ctx, &bo, &x.t, NULL, &w7.t, NULL, NULL, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "more than one value", &y1,
                  fg_batch_norm_forward(ctx, &bo, &x1.t, NULL, NULL, NULL, NULL, NULL, &y1.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "running_var", &rm,
                  fg_batch_norm_forward(ctx, &bo, &x.t, NULL, NULL, NULL, &rm.t, NULL, &y.t, NULL, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "sums", &sums, fg_batch_norm_stats(ctx, &bo, &xb.t, NULL, NULL, &sums.t));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "sums", &y,
                  fg_batch_norm_apply(ctx, &bo, &x.t, NULL, NULL, NULL, NULL, NULL, &y.t, NULL, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "mean", &y,
                  fg_batch_norm_backward(ctx, &bo, &x.t, &x.t, NULL, &mean.t, &w.t, &y.t, NULL, NULL, NULL, 0));
    /* dropout and RevIN */
    fg_dropout_options dp = {-0.1, 0, 0};
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &y, fg_dropout_forward(ctx, &dp, &x.t, &y.t));
    dp.p = NAN;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &y, fg_dropout_forward(ctx, &dp, &x.t, &y.t));
    fg_revin_options ro = {-1, 0, 0};
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "eps", &mean, fg_revin_stats(ctx, &ro, &x.t, &w.t, &w.t));
    ro.eps = 0;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "without its L dim", &w, fg_revin_stats(ctx, &ro, &x.t, &mean.t, &w.t));
    th_drop(&x), th_drop(&y), th_drop(&w), th_drop(&w7), th_drop(&mean), th_drop(&mean16), th_drop(&xt);
    th_drop(&x1), th_drop(&y1), th_drop(&sums), th_drop(&rm), th_drop(&rv), th_drop(&xb);
}

/* ------------------------------------------------------------------ past 2^31 elements (GPU) */

#ifdef FG_TEST_HAVE_CUDA
/* x and r [R, 4096] bf16 filled with one random block of 64 rows repeated, R·4096 > 2³¹: the
 * fused LayerNorm's last rows (past the int32 range, dropout index included) against the
 * reference of their block; then BatchNorm over the same memory as [R·32, 128], whose sums are
 * the block's times the repeats. */
static void big(fg_context *ctx) {
    if (!th_large("norm: layer_norm and batch_norm past 2^31 elements")) return;
    const int64_t D = 4096, P = 64, R = P * 8193; /* 2^31 + 2^18 elements */
    const size_t bytes = (size_t)(R * D) * 2;
    void *x = NULL, *r = NULL, *y = NULL;
    if (cudaMalloc(&x, bytes) != cudaSuccess || cudaMalloc(&r, bytes) != cudaSuccess ||
        cudaMalloc(&y, bytes) != cudaSuccess) {
        cudaFree(x), cudaFree(r), cudaFree(y);
        printf("SKIP: past 2^31 elements: not enough device memory\n");
        th_skips++;
        return;
    }
    const int64_t pn = P * D;
    uint16_t *hx = malloc((size_t)pn * 2), *hr = malloc((size_t)pn * 2);
    double *vx = dalloc(pn), *vr = dalloc(pn);
    th_fill(vx, pn), th_fill(vr, pn);
    for (int64_t i = 0; i < pn; i++) {
        hx[i] = fg_f32_to_bf16((float)vx[i]), hr[i] = fg_f32_to_bf16((float)vr[i]);
        vx[i] = fg_bf16_to_f32(hx[i]), vr[i] = fg_bf16_to_f32(hr[i]);
    }
    for (int64_t k = 0; k < R / P; k++) {
        cudaMemcpy((char *)x + (size_t)(k * pn) * 2, hx, (size_t)pn * 2, cudaMemcpyHostToDevice);
        cudaMemcpy((char *)r + (size_t)(k * pn) * 2, hr, (size_t)pn * 2, cudaMemcpyHostToDevice);
    }
    const int64_t shape[2] = {R, D};
    fg_tensor tx = fg_tensor_make(x, FG_BF16, 2, shape), tr = fg_tensor_make(r, FG_BF16, 2, shape);
    fg_tensor ty = fg_tensor_make(y, FG_BF16, 2, shape);
    fg_norm_options opt;
    memset(&opt, 0, sizeof opt);
    opt.dropout.p = 0.3, opt.dropout.seed = 77, opt.dropout.offset = 1;
    TH_OK(fg_norm_forward(ctx, &opt, &tx, &tr, NULL, NULL, &ty, NULL, NULL, NULL));
    TH_OK(fg_context_check(ctx));
    /* the last 3 rows (flat indices past 2^31) */
    const int64_t last = 3;
    uint16_t *hy = malloc((size_t)(last * D) * 2);
    cudaMemcpy(hy, (char *)y + (size_t)((R - last) * D) * 2, (size_t)(last * D) * 2, cudaMemcpyDeviceToHost);
    double *s = dalloc(D), *got = dalloc(last * D), *want = dalloc(last * D);
    for (int64_t q = 0; q < last; q++) {
        const int64_t i = R - last + q, pi = i % P;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < D; j++) s[j] = vx[pi * D + j] + mult(opt.dropout.p, 77, 1, i * D + j) * vr[pi * D + j];
        th_round(FG_BF16, s, D);
        for (int64_t j = 0; j < D; j++) mean += s[j];
        mean /= (double)D;
        for (int64_t j = 0; j < D; j++) var += (s[j] - mean) * (s[j] - mean);
        const double rstd = 1 / sqrt(var / (double)D + 1e-5);
        for (int64_t j = 0; j < D; j++) {
            want[q * D + j] = (s[j] - mean) * rstd;
            got[q * D + j] = fg_bf16_to_f32(hy[q * D + j]);
        }
    }
    double err = th_relerr(got, want, last * D);
    TH_CHECK(err <= 1e-2, "past 2^31: layer_norm's last rows relerr %.3g", err);
    /* BatchNorm over [R·32, 128]: channel j's sums are the block's times R/P */
    const int64_t C = 128, bshape[2] = {R * D / C, C}, c1[1] = {C};
    fg_tensor bx = fg_tensor_make(x, FG_BF16, 2, bshape), by = fg_tensor_make(y, FG_BF16, 2, bshape);
    th_operand mean = th_make(FG_BACKEND_CUDA, FG_F32, 1, c1, 0), rstd = th_make(FG_BACKEND_CUDA, FG_F32, 1, c1, 0);
    fg_batch_norm_options bo;
    memset(&bo, 0, sizeof bo);
    TH_OK(fg_batch_norm_forward(ctx, &bo, &bx, NULL, NULL, NULL, NULL, NULL, &by, NULL, &mean.t, &rstd.t));
    double *rm = dalloc(C), *rs = dalloc(C), *gm = dalloc(C), *gs = dalloc(C);
    for (int64_t j = 0; j < C; j++) {
        double m = 0, q = 0;
        const int64_t per = pn / C;
        for (int64_t i = 0; i < per; i++) m += vx[i * C + j];
        m /= (double)per;
        for (int64_t i = 0; i < per; i++) q += (vx[i * C + j] - m) * (vx[i * C + j] - m);
        rm[j] = m, rs[j] = 1 / sqrt(q / (double)per + 1e-5);
    }
    th_get(&mean.buf, &mean.t, gm), th_get(&rstd.buf, &rstd.t, gs);
    TH_CHECK(th_relerr(gm, rm, C) <= 1e-5 && th_relerr(gs, rs, C) <= 1e-5,
             "past 2^31: batch_norm's mean (%.3g) and rstd (%.3g)", th_relerr(gm, rm, C), th_relerr(gs, rs, C));
    free(hx), free(hr), free(hy), free(vx), free(vr), free(s), free(got), free(want), free(rm), free(rs), free(gm),
        free(gs);
    th_drop(&mean), th_drop(&rstd);
    cudaFree(x), cudaFree(r), cudaFree(y);
}
#endif

int main(void) {
    th_init("norm");
    fg_backend bes[2];
    const int nb = th_backends(bes);
    void *cpu_bits[4] = {NULL}, *s_bits[3] = {NULL};
    size_t cpu_bytes[4] = {0};
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        row_norms(ctx, bes[bi]);
        batch_norms(ctx, bes[bi]);
        bn_split(ctx, bes[bi], FG_F32);
        bn_split(ctx, bes[bi], FG_BF16);
        dropout_checks(ctx, bes[bi], cpu_bits, cpu_bytes);
        residual_mask(ctx, bes[bi]);
        dropout_scalar(ctx, bes[bi]);
        residual_bits(ctx, bes[bi], s_bits);
        revin_checks(ctx, bes[bi]);
        nan_propagation(ctx, bes[bi]);
        reruns_and_in_place(ctx, bes[bi]);
        empty(ctx, bes[bi]);
        bad_inputs(ctx, bes[bi]);
        if (bes[bi] == FG_BACKEND_CPU) {
            rn_finite_differences(ctx);
            bn_finite_differences(ctx);
            revin_finite_differences(ctx);
        }
#ifdef FG_TEST_HAVE_CUDA
        if (bes[bi] == FG_BACKEND_CUDA) big(ctx);
#endif
        fg_context_destroy(ctx);
    }
    for (int i = 0; i < 4; i++) free(cpu_bits[i]);
    for (int i = 0; i < 3; i++) free(s_bits[i]);
    return th_finish("norm");
}

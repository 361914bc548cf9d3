/*
 * test_linear_act.c — linear + bias + activation on every backend present and every
 * dtype, each activation: the forward (with and without the saved pre-activation), the
 * combined backward with the pre-activation kept or recomputed, the consuming backward,
 * relu's backward from y, the three split backward functions, batched weights, accumulate, 1-D to 4-D inputs and awkward sizes; finite
 * differences of the f64 CPU path; special values (0, large |x|, NaN) through both
 * directions; bit-identical reruns; the dropout option (fused forward, both saved forms'
 * backward, its edges and refusals); bad input. The reference is long double, written
 * here independently of the library's math: every gradient is the one of the pre-activation
 * the test computes itself (rounded to the dtype, as the op stores it), and a backward that
 * takes a saved pre or slope is given the test's own values, never the op's outputs.
 */
#include "harness.h"

#include "../src/core/rng.h" /* fg_dropout_uniform: the dropout mask's definition */

#include <math.h>

static const char *act_names[] = {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"};

/* ------------------------------------------------------------------ long double oracle */

static long double ref_act(int act, long double x) {
    const long double c = sqrtl(2.0L / acosl(-1.0L));
    switch (act) {
    case FG_ACT_RELU: return x > 0 ? x : (x == x ? 0.0L : x);
    case FG_ACT_GELU: return 0.5L * x * erfcl(-x / sqrtl(2.0L));
    case FG_ACT_GELU_TANH: /* ½(1 + tanh u) = 1 / (1 + e^(−2u)): no 1 + (−1) far out */
        return x / (1.0L + expl(-2.0L * c * (x + 0.044715L * x * x * x)));
    case FG_ACT_SILU: return x / (1.0L + expl(-x));
    case FG_ACT_SIGMOID: return 1.0L / (1.0L + expl(-x));
    case FG_ACT_TANH: return tanhl(x);
    default: return x;
    }
}

static long double ref_slope(int act, long double x) {
    const long double c = sqrtl(2.0L / acosl(-1.0L));
    switch (act) {
    case FG_ACT_RELU: return x > 0 ? 1.0L : (x == x ? 0.0L : x);
    case FG_ACT_GELU: return 0.5L * erfcl(-x / sqrtl(2.0L)) + x * expl(-0.5L * x * x) / sqrtl(2.0L * acosl(-1.0L));
    case FG_ACT_GELU_TANH: {
        if (fabsl(x) > 10) return x > 0 ? 1.0L : 0.0L;
        long double u = c * (x + 0.044715L * x * x * x);
        long double s = 1.0L / (1.0L + expl(-2 * u)), sc = 1.0L / (1.0L + expl(2 * u)); /* σ(2u), 1 − σ(2u) */
        return s + 2 * x * s * sc * c * (1 + 3 * 0.044715L * x * x);
    }
    case FG_ACT_SILU: {
        long double s = 1.0L / (1.0L + expl(-x)), sc = 1.0L / (1.0L + expl(x));
        return s * (1 + x * sc);
    }
    case FG_ACT_SIGMOID: {
        long double s = 1.0L / (1.0L + expl(-x)), sc = 1.0L / (1.0L + expl(x));
        return s * sc;
    }
    case FG_ACT_TANH: {
        long double t = 1.0L / coshl(x);
        return t * t;
    }
    default: return 1.0L;
    }
}

/* pre = x·wᵀ + b, y = act(pre); grads of Σ dy·y. pre is rounded to the dtype before the
 * activation, as the op stores it (in pre, or in y before the in-place activation): the
 * activation's own conditioning would otherwise multiply that rounding (tanh′ at 2.5 by 5). */
typedef struct ref {
    double *pre, *y, *dx, *dw, *db;
} ref;

static ref reference(fg_dtype dt, int act, const double *x, const double *w, const double *b, const double *dy,
                     int64_t N, int64_t K, int64_t M) {
    ref r;
    r.pre = malloc(sizeof(double) * (size_t)(N * M + 1));
    r.y = malloc(sizeof(double) * (size_t)(N * M + 1));
    r.dx = calloc((size_t)(N * K + 1), sizeof(double));
    r.dw = calloc((size_t)(M * K + 1), sizeof(double));
    r.db = calloc((size_t)(M + 1), sizeof(double));
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            long double p = b ? b[m] : 0;
            for (int64_t k = 0; k < K; k++) p += (long double)x[n * K + k] * w[m * K + k];
            double stored = (double)p;
            th_round(dt, &stored, 1);
            r.pre[n * M + m] = (double)p;
            p = stored;
            r.y[n * M + m] = (double)ref_act(act, p);
            if (!dy) continue;
            long double g = dy[n * M + m] * ref_slope(act, p);
            r.db[m] += (double)g;
            for (int64_t k = 0; k < K; k++) {
                r.dx[n * K + k] += (double)(g * w[m * K + k]);
                r.dw[m * K + k] += (double)(g * x[n * K + k]);
            }
        }
    return r;
}

static void free_ref(ref *r) { free(r->pre), free(r->y), free(r->dx), free(r->dw), free(r->db); }

/* |A| + |B| where a slope is the sum A + B of two terms of opposite sign that cancel at a root
 * in the tested range: gelu's Φ(x) + x·φ(x) and gelu_tanh's σ(2u) + 2x·σ(2u)(1 − σ(2u))·u′ (both
 * cross 0 at x ≈ −0.752, the terms ≈ 0.226 each), silu's σ(x) + x·σ(x)(1 − σ(x)) (x ≈ −1.278).
 * 0 for the others: relu's kink is calm_kink's; sigmoid's σ(1 − σ) and tanh's sech² are
 * products, positive everywhere. */
static long double ref_slope_terms(int act, long double x) {
    const long double c = sqrtl(2.0L / acosl(-1.0L));
    switch (act) {
    case FG_ACT_GELU: return fabsl(0.5L * erfcl(-x / sqrtl(2.0L))) + fabsl(x * expl(-0.5L * x * x) / sqrtl(2.0L * acosl(-1.0L)));
    case FG_ACT_GELU_TANH: {
        if (fabsl(x) > 10) return 0;
        long double u = c * (x + 0.044715L * x * x * x);
        long double s = 1.0L / (1.0L + expl(-2 * u)), sc = 1.0L / (1.0L + expl(2 * u));
        return s + fabsl(2 * x * s * sc * c * (1 + 3 * 0.044715L * x * x));
    }
    case FG_ACT_SILU: {
        long double s = 1.0L / (1.0L + expl(-x)), sc = 1.0L / (1.0L + expl(x));
        return s + fabsl(x * s * sc);
    }
    default: return 0;
    }
}

/* Where the op's own rounding decides the slope, dy is set to 0, so the gradients do not depend
 * on it and every check keeps its tolerance; returns, per element, how far the op's slope may be
 * from the reference's there (0 elsewhere; NULL for the activations without a kink or a root;
 * the caller frees).
 *
 * relu's kink: where the f64 pre-activation is within the op's own rounding of 0 (its f32
 * sums; cuBLASLt's bf16 bias epilogue rounds x·wᵀ before it adds b: up to 2^-9 of each), the
 * mask of the pre the op recomputes may go either way. The bound, the dtype's tolerance of
 * Σ|x·w| + |b|, is above that rounding for every dtype (f32: K·2^-24 ≤ 1e-5 for K ≤ 128) and
 * zeroes about 1% of the elements at bf16. The slope may be 0 or 1 there (slope_either).
 *
 * A root of a smooth slope (ref_slope_terms): there the slope is the small difference of terms
 * of ≈ 0.23, so an op that evaluates them in its compute precision (unit roundoff u: 2^-24 for
 * f32 / f16 / bf16 data, whose math is f32, 2^-53 for f64) is off by a few u of their size,
 * however right it is, and one element's relative error there exceeds the tolerance (a 1 × 1 × 1
 * layer's check is that one element). The slope of the op's pre p̂ against the reference's at the
 * test's p is off by at most
 *     e = 8u·(|A| + |B|) + |act″(p)|·δp,    δp = u·(Σ|x·w| + |b|) + 2u·|p|:
 * each term reaches the slope through at most about 16 roundings of ≤ u/2 (gelu_tanh's f32 form:
 * five in its argument u, whose conditioning in σ is |u|(1 − σ) < 1 there; exp or erfc within 2u;
 * the 1 + e, quotient and products), measured at most 4.6u·(|A| + |B|) over every f32 pre in
 * [−0.8, −0.7] and [−1.35, −1.2]; δp is the op's own rounding of a recomputed pre, one u of each
 * product and of the sum (two roundings at K = 1, where it is a bound; a longer sum's errors of
 * random sign are of that size, and feed outputs of many elements whose norm a lone element near
 * a root does not decide), plus an f32 / f64 rounding of p̂ on the other side of the test's (f16 /
 * bf16 round the op's f32 sum to the test's value but where p is within u·Σ|x·w| of a tie). Where
 * e > tol·|act′(p)| / 2 (the other half of the tolerance for the products with dy, w and x), dy is
 * zeroed: |act′| below about 0.05 at f32 (5% of these three's elements at K = 1, 10% at K = 128,
 * whose Σ|x·w| is larger), 1e-3 at f64, 6e-5 at f16 / bf16. There the op's slope may be
 * anything within 2e of the reference's (e plus the dtype's rounding of the slope, below
 * tol·|act′| < e). */
static double *calm_kink(fg_dtype dt, int act, const double *x, const double *w, const double *b, double *dy,
                         int64_t N, int64_t K, int64_t M) {
    const bool kink = act == FG_ACT_RELU, root = act == FG_ACT_GELU || act == FG_ACT_GELU_TANH || act == FG_ACT_SILU;
    if (!kink && !root) return NULL;
    double *near = calloc((size_t)(N * M + 1), sizeof(double));
    const double tol = th_tol(dt, false), u = dt == FG_F64 ? 0x1p-53 : 0x1p-24;
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            long double p = b ? b[m] : 0, scale = b ? fabs(b[m]) : 0;
            for (int64_t k = 0; k < K; k++)
                p += (long double)x[n * K + k] * w[m * K + k], scale += fabsl((long double)x[n * K + k] * w[m * K + k]);
            if (kink) {
                if (fabsl(p) <= tol * scale) dy[n * M + m] = 0, near[n * M + m] = 1;
                continue;
            }
            double q = (double)p; /* the test's pre, as reference() rounds it */
            th_round(dt, &q, 1);
            const long double h = 0x1p-20L, s = ref_slope(act, q);
            const long double curve = fabsl(ref_slope(act, q + h) - ref_slope(act, q - h)) / (2 * h);
            const long double dp = u * scale + 2 * u * fabsl(p);
            const long double e = 8 * u * ref_slope_terms(act, q) + curve * dp;
            if (e > tol * fabsl(s) / 2) dy[n * M + m] = 0, near[n * M + m] = (double)(2 * e);
        }
    return near;
}

/* The slope the op wrote where the pre is that near a kink or root: either of relu's mask values
 * (0 or 1), or a smooth slope within its allowance of the reference's, is the op's correct answer
 * for the pre it computed; there the reference takes the value the op wrote (anything else still
 * fails). */
static void slope_either(int act, const double *near, const th_operand *out, double *ref) {
    if (!near) return;
    double *got = malloc(sizeof(double) * (size_t)(out->n + 1));
    th_get(&out->buf, &out->t, got);
    for (int64_t i = 0; i < out->n; i++) {
        if (!(near[i] > 0)) continue;
        const bool ok = act == FG_ACT_RELU ? got[i] == 0 || got[i] == 1 : fabs(got[i] - ref[i]) <= near[i];
        if (ok) ref[i] = got[i];
    }
    free(got);
}

/* The gradients of Σ dy·act(pre) for a pre (or, the slope form, a slope) the test holds: the
 * reference of a backward given the test's own saved values. */
static void grads_from_pre(ref *r, int act, const double *pre, const double *x, const double *w, const double *dy,
                           int64_t N, int64_t K, int64_t M, bool given_slope) {
    memset(r->dx, 0, sizeof(double) * (size_t)(N * K));
    memset(r->dw, 0, sizeof(double) * (size_t)(M * K));
    memset(r->db, 0, sizeof(double) * (size_t)M);
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            /* (the slope form: what pre holds is the slope itself) */
            long double g = dy[n * M + m] * (given_slope ? (long double)pre[n * M + m] : ref_slope(act, pre[n * M + m]));
            r->db[m] += (double)g;
            for (int64_t k = 0; k < K; k++) {
                r->dx[n * K + k] += (double)(g * w[m * K + k]);
                r->dw[m * K + k] += (double)(g * x[n * K + k]);
            }
        }
}

/* The combined backward into dx, dw, db (accumulate or not) against the expected gradients
 * wdx, wdw, wdb (to which a random prior is added when accumulating). */
static void check_backward(fg_context *ctx, int act, const th_operand *dy, const fg_tensor *pre, const th_operand *x,
                           const th_operand *w, const fg_tensor *bt, th_operand *dx, th_operand *dw, th_operand *db,
                           const double *wdx, const double *wdw, const double *wdb, int acc, double tol,
                           const char *label, bool slope) {
    double *rdx = malloc(sizeof(double) * (size_t)(dx->n + 1)), *rdw = malloc(sizeof(double) * (size_t)(dw->n + 1)),
           *rdb = malloc(sizeof(double) * (size_t)(db->n + 1));
    memcpy(rdx, wdx, sizeof(double) * (size_t)dx->n);
    memcpy(rdw, wdw, sizeof(double) * (size_t)dw->n);
    memcpy(rdb, wdb, sizeof(double) * (size_t)db->n);
    th_prepare_out(dx, rdx, acc), th_prepare_out(dw, rdw, acc), th_prepare_out(db, rdb, acc);
    if (slope)
        TH_OK(fg_linear_act_backward_slope(ctx, (fg_activation)act, &dy->t, pre, &x->t, &w->t, bt, &dx->t, &dw->t, &db->t, acc));
    else
        TH_OK(fg_linear_act_backward(ctx, (fg_activation)act, &dy->t, pre, &x->t, &w->t, bt, &dx->t, &dw->t, &db->t, acc));
    char l2[300];
    snprintf(l2, sizeof l2, "%s keep=%d acc=%d%s", label, pre != NULL, acc, slope ? " slope form" : "");
    th_verify("dx", dx, rdx, tol, l2);
    th_verify("dw", dw, rdw, tol, l2);
    th_verify("db", db, rdb, tol, l2);
    free(rdx), free(rdw), free(rdb);
}

#ifdef FG_TEST_HAVE_SM90A
/* the plan of a combined backward (pre NULL: not kept): its info, for the kernels it names */
static void backward_plan(fg_context *ctx, int act, const th_operand *dy, const fg_tensor *pre, const th_operand *x,
                          const th_operand *w, const th_operand *b, const th_operand *dx, const th_operand *dw,
                          const th_operand *db, fg_plan_info *info, bool slope) {
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    memset(info, 0, sizeof *info);
    fg_linear_act_options o = {(fg_activation)act, slope ? FG_ACT_SAVED_SLOPE : FG_ACT_SAVED_PRE, 0};
    d.op = FG_OP_LINEAR_ACT_BACKWARD, d.options = &o, d.options_size = sizeof o;
    d.operands[0] = dy->t, d.operands[2] = x->t, d.operands[3] = w->t, d.operands[4] = b->t;
    if (pre) d.operands[1] = *pre;
    d.operands[5] = dx->t, d.operands[6] = dw->t, d.operands[7] = db->t;
    fg_plan *plan = NULL;
    TH_OK(fg_plan_create(ctx, &d, &plan));
    if (plan) TH_OK(fg_plan_info_get(plan, info));
    fg_plan_destroy(plan);
}
#endif

#ifdef FG_TEST_HAVE_SM90A
/* An f32 backward whose weight gradient has few output tiles over many tokens (PatchTST's
 * FFN-up: [256, 128] over 20000 tokens): on a 9.0 device the split TF32 weight-gradient kernel
 * takes the whole product (it splits the tokens itself), not a sum of per-range cuBLAS
 * products. dw against f64 on every 5th row (g from the given pre), accumulated and not. */
static void split_weight_gradient(fg_context *ctx) {
    const int64_t N = 20000, K = 128, M = 256, xs[2] = {N, K}, ws[2] = {M, K}, ys[2] = {N, M}, bs[1] = {M};
    th_operand x = th_make(FG_BACKEND_CUDA, FG_F32, 2, xs, 0), w = th_make(FG_BACKEND_CUDA, FG_F32, 2, ws, 0);
    th_operand b = th_make(FG_BACKEND_CUDA, FG_F32, 1, bs, 0), pre = th_make(FG_BACKEND_CUDA, FG_F32, 2, ys, 0);
    th_operand dy = th_make(FG_BACKEND_CUDA, FG_F32, 2, ys, 0), dx = th_make(FG_BACKEND_CUDA, FG_F32, 2, xs, 0);
    th_operand dw = th_make(FG_BACKEND_CUDA, FG_F32, 2, ws, 0), db = th_make(FG_BACKEND_CUDA, FG_F32, 1, bs, 0);
    th_randomize(&x), th_randomize(&w), th_randomize(&b), th_randomize(&pre), th_randomize(&dy);
    fg_plan_info info;
    backward_plan(ctx, FG_ACT_GELU, &dy, &pre.t, &x, &w, &b, &dx, &dw, &db, &info, false);
    for (int acc = 0; acc <= 1; acc++) {
        double *ref = calloc((size_t)(M * K), sizeof(double)), *got = malloc(sizeof(double) * (size_t)(M * K));
        th_prepare_out(&dw, ref, acc); /* ref: the old values when accumulating */
        th_poison(&dx.buf), th_poison(&db.buf);
        TH_OK(fg_linear_act_backward(ctx, FG_ACT_GELU, &dy.t, &pre.t, &x.t, &w.t, &b.t, &dx.t, &dw.t, &db.t, acc));
        const char *ran = fg_context_last_kernels(ctx);
        char label[160];
        snprintf(label, sizeof label, "[split f32 dw through linear_act gelu N=%lld K=%lld M=%lld acc=%d]", (long long)N,
                 (long long)K, (long long)M, acc);
        if (info.arch == 90)
            TH_CHECK(ran && strstr(ran, "split_tf32_wgrad") != NULL, "%s: ran %s, not the split kernel", label,
                     ran ? ran : "(none)");
        th_get(&dw.buf, &dw.t, got);
        double num = 0, den = 0;
        for (int64_t r = 0; r <= (M - 1) / 5 + 1; r++) { /* rows 0, 5, 10, … and the last */
            const int64_t m = r <= (M - 1) / 5 ? 5 * r : M - 1;
            for (int64_t k = 0; k < K; k++) {
                double sum = 0;
                for (int64_t n = 0; n < N; n++)
                    sum += dy.v[n * M + m] * (double)ref_slope(FG_ACT_GELU, pre.v[n * M + m]) * x.v[n * K + k];
                if (acc) sum += ref[m * K + k];
                num += (got[m * K + k] - sum) * (got[m * K + k] - sum), den += sum * sum;
            }
        }
        const double err = den > 0 ? sqrt(num / den) : sqrt(num);
        TH_CHECK(err <= th_tol(FG_F32, false), "%s: relerr %.3g over sampled rows", label, err);
        printf("%s relerr %.3g (%s)\n", label, err, ran ? ran : "");
        free(ref), free(got);
    }
    th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&pre), th_drop(&dy), th_drop(&dx), th_drop(&dw), th_drop(&db);
}
#endif

/* ------------------------------------------------------------------ cases */

typedef struct shape_case {
    int rank;
    int64_t lead[3];
    int64_t K, M;
    bool bias;
    int layout; /* 0 contiguous, 3 every operand misaligned by one element */
} shape_case;

static const shape_case shapes[] = {
    {1, {0}, 1, 1, true},          {2, {3}, 17, 5, true},      {3, {2, 9}, 127, 33, false},
    {4, {4, 1, 5}, 64, 48, true},  {2, {257}, 33, 130, true},
    {2, {20000}, 8, 16, true}, /* long and narrow: CUDA splits dw's rows into batched parts */
    /* the CPU's short-k product with the activation in its store (k <= 32, m·n >= 2^16): two
       64-column blocks and a masked tail of 7 */
    {2, {520}, 20, 135, true},
    /* and its narrow product forming g for dx (n = K <= 16, k = M >= 64, m·n >= 2^16): 8 blocks
       of 512 rows for db's sums and a short ninth */
    {2, {4100}, 16, 64, true},
    /* CUDA's tile path (K ≤ 128, f16/bf16): the largest K with a row-tile tail and a column
       tile of 8; K padded to 16 with three column tiles */
    {2, {300}, 128, 136, true},    {3, {3, 43}, 120, 264, false},
    /* CUDA's one-kernel backward (K ≤ 128, M ≤ 256): M at its limit with a row tail; and
       every pointer misaligned (its plain-load path; the forward falls back to GEMM + pass) */
    {3, {2, 77}, 24, 256, true},   {2, {70}, 24, 40, true, 3},
    /* its sm_90a version (pre kept, aligned, every activation): K and M at their limits with a
       row tail (8.25 tiles of 32); partial 64-wide boxes in K and M (short_backward: many tiles) */
    {2, {264}, 128, 256, true},    {3, {3, 29}, 72, 200, true},
};

static void run_case(fg_context *ctx, fg_backend be, fg_dtype dt, int act, const shape_case *sc) {
    int64_t xs[FG_MAX_RANK], ys[FG_MAX_RANK], N = 1;
    for (int d = 0; d < sc->rank - 1; d++) xs[d] = ys[d] = sc->lead[d], N *= sc->lead[d];
    xs[sc->rank - 1] = sc->K, ys[sc->rank - 1] = sc->M;
    int64_t wsh[2] = {sc->M, sc->K}, bsh[1] = {sc->M};
    th_operand x = th_make(be, dt, sc->rank, xs, sc->layout), w = th_make(be, dt, 2, wsh, sc->layout);
    th_operand b = sc->bias ? th_make(be, dt, 1, bsh, sc->layout) : (th_operand){0};
    th_randomize(&x), th_randomize(&w);
    /* pre-activations of a few units whatever K: centred so every activation's bend is hit */
    for (int64_t i = 0; i < x.n; i++) x.v[i] = (x.v[i] - 0.25) * 4.0 / sqrt((double)sc->K);
    th_round(dt, x.v, x.n);
    th_put(&x.buf, &x.t, x.v);
    if (sc->bias) th_randomize(&b);
    th_operand y = th_make(be, dt, sc->rank, ys, sc->layout), pre = th_make(be, dt, sc->rank, ys, sc->layout);
    th_operand dy = th_make(be, dt, sc->rank, ys, sc->layout);
    th_randomize(&dy);
    double *near = calm_kink(dt, act, x.v, w.v, sc->bias ? b.v : NULL, dy.v, N, sc->K, sc->M);
    th_put(&dy.buf, &dy.t, dy.v);
    const double tol = th_tol(dt, false);
    char lab[200];
    snprintf(lab, sizeof lab, "%s %s %s N=%lld K=%lld M=%lld%s%s", act_names[act], th_backend_name(be),
             fg_dtype_name(dt), (long long)N, (long long)sc->K, (long long)sc->M, sc->bias ? " +b" : "",
             sc->layout ? " misaligned" : "");
    ref r = reference(dt, act, x.v, w.v, sc->bias ? b.v : NULL, dy.v, N, sc->K, sc->M);
    const fg_tensor *bt = sc->bias ? &b.t : NULL;

    /* forward, keeping pre; then without */
    th_poison(&y.buf), th_poison(&pre.buf);
    TH_OK(fg_linear_act_forward(ctx, (fg_activation)act, &x.t, &w.t, bt, &y.t, &pre.t));
    th_verify("y", &y, r.y, tol, lab);
    th_verify("pre", &pre, r.pre, tol, lab);
    th_operand y2 = th_make(be, dt, sc->rank, ys, sc->layout);
    th_poison(&y2.buf);
    TH_OK(fg_linear_act_forward(ctx, (fg_activation)act, &x.t, &w.t, bt, &y2.t, NULL));
    th_verify("y (no pre)", &y2, r.y, tol, lab);
    /* the backward's saved pre is the test's own (its f64 pre rounded to the dtype, what r's
       gradients come from), not the one the forward above wrote */
    double *own = malloc(sizeof(double) * (size_t)(pre.n + 1));
    memcpy(own, r.pre, sizeof(double) * (size_t)pre.n);
    th_round(dt, own, pre.n);
    th_operand pin = th_make(be, dt, sc->rank, ys, sc->layout);
    th_put(&pin.buf, &pin.t, own);

    /* combined backward: pre kept / recomputed, accumulate 0 / 1 */
    int64_t xshape[FG_MAX_RANK];
    memcpy(xshape, xs, sizeof xs);
    for (int keep = 0; keep < 2; keep++)
        for (int acc = 0; acc < 2; acc++) {
            th_operand dx = th_make(be, dt, sc->rank, xshape, sc->layout), dw = th_make(be, dt, 2, wsh, sc->layout);
            th_operand db = th_make(be, dt, 1, bsh, sc->layout);
            check_backward(ctx, act, &dy, keep ? &pin.t : NULL, &x, &w, bt, &dx, &dw, &db, r.dx, r.dw, r.db, acc, tol,
                           lab, false);
            /* the split functions, one gradient each */
            if (keep && !acc) {
                char l2[260];
                snprintf(l2, sizeof l2, "%s split", lab);
                th_poison(&dx.buf), th_poison(&dw.buf), th_poison(&db.buf);
                TH_OK(fg_linear_act_backward_input(ctx, (fg_activation)act, &dy.t, &pin.t, &x.t, &w.t, bt, &dx.t, 0));
                TH_OK(fg_linear_act_backward_weight(ctx, (fg_activation)act, &dy.t, &pin.t, &x.t, &w.t, bt, &dw.t, 0));
                TH_OK(fg_linear_act_backward_bias(ctx, (fg_activation)act, &dy.t, &pin.t, &x.t, &w.t, bt, &db.t, 0));
                th_verify("dx (split)", &dx, r.dx, tol, l2);
                th_verify("dw (split)", &dw, r.dw, tol, l2);
                th_verify("db (split)", &db, r.db, tol, l2);
            }
            th_drop(&dx), th_drop(&dw), th_drop(&db);
        }
    {
        /* the consuming backward (g formed in pre's memory) on a copy of the test's pre; relu
           from the test's y in pre's place; dw and db without dx (db's sums then borrow dw's
           memory) */
        th_operand dx = th_make(be, dt, sc->rank, xshape, sc->layout), dw = th_make(be, dt, 2, wsh, sc->layout);
        th_operand db = th_make(be, dt, 1, bsh, sc->layout), pc = th_make(be, dt, sc->rank, ys, sc->layout);
        char l2[260];
        snprintf(l2, sizeof l2, "%s consume", lab);
        th_put(&pc.buf, &pc.t, own);
        th_poison(&dx.buf), th_poison(&dw.buf), th_poison(&db.buf);
        TH_OK(fg_linear_act_backward_consume(ctx, (fg_activation)act, &dy.t, &pc.t, &x.t, &w.t, bt, &dx.t, &dw.t, &db.t, 0));
        th_verify("dx", &dx, r.dx, tol, l2);
        th_verify("dw", &dw, r.dw, tol, l2);
        th_verify("db", &db, r.db, tol, l2);
        if (act == FG_ACT_RELU) {
            snprintf(l2, sizeof l2, "%s y as pre", lab);
            double *yv = malloc(sizeof(double) * (size_t)(pre.n + 1));
            memcpy(yv, r.y, sizeof(double) * (size_t)pre.n);
            th_round(dt, yv, pre.n);
            th_put(&pc.buf, &pc.t, yv);
            free(yv);
            th_poison(&dx.buf), th_poison(&dw.buf), th_poison(&db.buf);
            TH_OK(fg_linear_act_backward(ctx, (fg_activation)act, &dy.t, &pc.t, &x.t, &w.t, bt, &dx.t, &dw.t, &db.t, 0));
            th_verify("dx", &dx, r.dx, tol, l2);
            th_verify("dw", &dw, r.dw, tol, l2);
            th_verify("db", &db, r.db, tol, l2);
        }
        snprintf(l2, sizeof l2, "%s dw+db", lab);
        th_poison(&dw.buf), th_poison(&db.buf);
        TH_OK(fg_linear_act_backward(ctx, (fg_activation)act, &dy.t, &pin.t, &x.t, &w.t, bt, NULL, &dw.t, &db.t, 0));
        th_verify("dw", &dw, r.dw, tol, l2);
        th_verify("db", &db, r.db, tol, l2);
        th_drop(&dx), th_drop(&dw), th_drop(&db), th_drop(&pc);
    }
    {
        /* the slope form: y as before, s = act′(pre) (rounded) where pre went — against the slope
           of the test's pre —, then the gradients from the test's own s (g = dy ⊙ s): combined
           with accumulate 0 / 1, dx alone, dw + db, db alone */
        th_operand y3 = th_make(be, dt, sc->rank, ys, sc->layout), s = th_make(be, dt, sc->rank, ys, sc->layout);
        char l2[260];
        snprintf(l2, sizeof l2, "%s slope form", lab);
        th_poison(&y3.buf), th_poison(&s.buf);
        TH_OK(fg_linear_act_forward_slope(ctx, (fg_activation)act, &x.t, &w.t, bt, &y3.t, &s.t));
        th_verify("y", &y3, r.y, tol, l2);
        double *rs = malloc(sizeof(double) * (size_t)(s.n + 1));
        for (int64_t i = 0; i < s.n; i++) rs[i] = (double)ref_slope(act, own[i]);
        th_round(dt, rs, s.n);
        slope_either(act, near, &s, rs);
        th_verify("slope", &s, rs, tol, l2);
        for (int64_t i = 0; i < s.n; i++) rs[i] = (double)ref_slope(act, own[i]);
        th_round(dt, rs, s.n);
        th_put(&s.buf, &s.t, rs);
        grads_from_pre(&r, act, rs, x.v, w.v, dy.v, N, sc->K, sc->M, true);
        for (int acc = 0; acc < 2; acc++) {
            th_operand dx = th_make(be, dt, sc->rank, xshape, sc->layout), dw = th_make(be, dt, 2, wsh, sc->layout);
            th_operand db = th_make(be, dt, 1, bsh, sc->layout);
            check_backward(ctx, act, &dy, &s.t, &x, &w, bt, &dx, &dw, &db, r.dx, r.dw, r.db, acc, tol, lab, true);
            if (!acc) {
                th_poison(&dx.buf), th_poison(&dw.buf), th_poison(&db.buf);
                TH_OK(fg_linear_act_backward_slope(ctx, (fg_activation)act, &dy.t, &s.t, &x.t, &w.t, bt, &dx.t, NULL, NULL, 0));
                th_verify("dx alone", &dx, r.dx, tol, l2);
                TH_OK(fg_linear_act_backward_slope(ctx, (fg_activation)act, &dy.t, &s.t, &x.t, &w.t, bt, NULL, &dw.t, &db.t, 0));
                th_verify("dw", &dw, r.dw, tol, l2);
                th_verify("db", &db, r.db, tol, l2);
                th_poison(&db.buf);
                TH_OK(fg_linear_act_backward_slope(ctx, (fg_activation)act, &dy.t, &s.t, &x.t, &w.t, bt, NULL, NULL, &db.t, 0));
                th_verify("db alone", &db, r.db, tol, l2);
            }
            th_drop(&dx), th_drop(&dw), th_drop(&db);
        }
        /* and consuming s (g formed in its memory), accumulate 0 / 1: fastgrad-train's FFN call */
        for (int acc = 0; acc < 2; acc++) {
            th_operand dx = th_make(be, dt, sc->rank, xshape, sc->layout), dw = th_make(be, dt, 2, wsh, sc->layout);
            th_operand db = th_make(be, dt, 1, bsh, sc->layout), sc2 = th_make(be, dt, sc->rank, ys, sc->layout);
            th_put(&sc2.buf, &sc2.t, rs);
            double *rdx = malloc(sizeof(double) * (size_t)(dx.n + 1)), *rdw = malloc(sizeof(double) * (size_t)(dw.n + 1));
            double *rdb = malloc(sizeof(double) * (size_t)(db.n + 1));
            memcpy(rdx, r.dx, sizeof(double) * (size_t)dx.n);
            memcpy(rdw, r.dw, sizeof(double) * (size_t)dw.n);
            memcpy(rdb, r.db, sizeof(double) * (size_t)db.n);
            th_prepare_out(&dx, rdx, acc), th_prepare_out(&dw, rdw, acc), th_prepare_out(&db, rdb, acc);
            const fg_linear_act_options o = {(fg_activation)act, FG_ACT_SAVED_SLOPE, 1};
            TH_OK(fg_linear_act_backward_ex(ctx, &o, &dy.t, &sc2.t, &x.t, &w.t, bt, &dx.t, &dw.t, &db.t, acc));
            char l3[300];
            snprintf(l3, sizeof l3, "%s consume acc=%d", l2, acc);
            th_verify("dx", &dx, rdx, tol, l3);
            th_verify("dw", &dw, rdw, tol, l3);
            th_verify("db", &db, rdb, tol, l3);
            free(rdx), free(rdw), free(rdb);
            th_drop(&dx), th_drop(&dw), th_drop(&db), th_drop(&sc2);
        }
        free(rs);
        th_drop(&y3), th_drop(&s);
    }
    free(own), free(near);
    free_ref(&r);
    th_drop(&x), th_drop(&w), th_drop(&y), th_drop(&y2), th_drop(&pre), th_drop(&pin), th_drop(&dy);
    if (sc->bias) th_drop(&b);
}

/* A layer large enough for CUDA's sm_90a GEMM forward (38 × 6 = 228 tiles of 128 × 256: 86 %
 * of two waves on 132 SMs, two whole ones on 114; K = 4104 ≥ 4096: 64-wide slices and a tail
 * of 8; row and column tiles with tails), every activation, pre kept and not, aligned and (the GEMM + pass fallback)
 * misaligned; on a 9.0 device with an sm_90a build the plan must name that kernel. Checked
 * against an f64 reference on every 37th row (every row tile) and the last three rows. */
static void wide_forward(fg_context *ctx, fg_backend be, fg_dtype dt) {
    const int64_t N = 4820, K = 4104, M = 1400;
    int64_t rows[160], nr = 0;
    for (int64_t n = 0; n < N - 3; n += 37) rows[nr++] = n;
    for (int64_t n = N - 3; n < N; n++) rows[nr++] = n;
    double *rp = malloc(sizeof(double) * (size_t)(nr * M)), *ry = malloc(sizeof(double) * (size_t)(nr * M));
    double *rs = malloc(sizeof(double) * (size_t)(nr * M));
    double *got = malloc(sizeof(double) * (size_t)(N * M)), *sub = malloc(sizeof(double) * (size_t)(nr * M));
    for (int layout = 0; layout <= 3; layout += 3) {
        int64_t xs[2] = {N, K}, ws[2] = {M, K}, bs[1] = {M}, ys[2] = {N, M};
        th_operand x = th_make(be, dt, 2, xs, layout), w = th_make(be, dt, 2, ws, layout), b = th_make(be, dt, 1, bs, layout);
        th_operand y = th_make(be, dt, 2, ys, layout), pre = th_make(be, dt, 2, ys, layout);
        th_randomize(&x), th_randomize(&w), th_randomize(&b);
        for (int64_t i = 0; i < x.n; i++) x.v[i] = (x.v[i] - 0.25) * 4.0 / sqrt((double)K);
        th_round(dt, x.v, x.n);
        th_put(&x.buf, &x.t, x.v);
        for (int64_t r = 0; r < nr; r++)
            for (int64_t m = 0; m < M; m++) {
                double p = b.v[m];
                for (int64_t k = 0; k < K; k++) p += x.v[rows[r] * K + k] * w.v[m * K + k];
                rp[r * M + m] = p;
            }
        for (int act = 0; act <= FG_ACT_TANH; act++) {
            char lab[160];
            snprintf(lab, sizeof lab, "large %s %s %s N=%lld K=%lld M=%lld%s", act_names[act], th_backend_name(be),
                     fg_dtype_name(dt), (long long)N, (long long)K, (long long)M, layout ? " misaligned" : "");
            for (int64_t i = 0; i < nr * M; i++) {
                double q = rp[i];
                th_round(dt, &q, 1);
                ry[i] = (double)ref_act(act, q);
                rs[i] = (double)ref_slope(act, q);
            }
            th_round(dt, rs, nr * M);
            for (int keep = 0; keep < 3; keep++) { /* 2: the slope form (pre receives act′(pre)) */
                th_poison(&y.buf), th_poison(&pre.buf);
                if (keep == 2) TH_OK(fg_linear_act_forward_slope(ctx, (fg_activation)act, &x.t, &w.t, &b.t, &y.t, &pre.t));
                else TH_OK(fg_linear_act_forward(ctx, (fg_activation)act, &x.t, &w.t, &b.t, &y.t, keep ? &pre.t : NULL));
                for (int o = 0; o < 1 + (keep > 0); o++) {
                    th_get(o ? &pre.buf : &y.buf, o ? &pre.t : &y.t, got);
                    bool written = true; /* every element, not just the sampled rows (poisoned: NaN) */
                    for (int64_t i = 0; i < N * M && written; i++) written = got[i] == got[i];
                    for (int64_t r = 0; r < nr; r++) memcpy(sub + r * M, got + rows[r] * M, sizeof(double) * (size_t)M);
                    const double err = th_relerr(sub, o ? (keep == 2 ? rs : rp) : ry, nr * M);
                    TH_CHECK(written && err <= th_tol(dt, false), "%s %s: relerr %.3g (all written: %d)",
                             o ? (keep == 2 ? "slope" : "pre") : (keep == 2 ? "y (slope form)" : keep ? "y" : "y (no pre)"),
                             lab, err, (int)written);
                }
            }
#ifdef FG_TEST_HAVE_SM90A
            if (layout == 0 && act != FG_ACT_NONE) { /* the path: the plan names its kernels */
                fg_plan_desc d;
                memset(&d, 0, sizeof d);
                fg_linear_act_options o = {(fg_activation)act, FG_ACT_SAVED_PRE, 0};
                d.op = FG_OP_LINEAR_ACT_FORWARD, d.options = &o, d.options_size = sizeof o;
                d.operands[0] = x.t, d.operands[1] = w.t, d.operands[2] = b.t, d.operands[3] = y.t, d.operands[4] = pre.t;
                fg_plan *plan = NULL;
                fg_plan_info info;
                TH_OK(fg_plan_create(ctx, &d, &plan));
                TH_OK(fg_plan_info_get(plan, &info));
                if (info.arch == 90)
                    TH_CHECK(strstr(info.kernel, "linear_act_gemm90") != NULL, "%s: the plan runs %s, not the sm_90a GEMM",
                             lab, info.kernel);
                fg_plan_destroy(plan);
            }
#endif
        }
        th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&y), th_drop(&pre);
    }
    free(rp), free(ry), free(rs), free(got), free(sub);
}

/* The backward of a layer large enough for the sm_90a GEMM's dx = g·w forming g (38 × 6 = 228
 * tiles of 128 × 256, as the forward's; reductions M = 4104 ≥ 4096 and N = 4820 end in partial
 * 64-wide slices, rows and columns in partial tiles). Aligned, every activation from a kept pre: dx's
 * product forms g itself (GEMM_INPUT_FORM) for relu, silu, sigmoid and tanh, the others take the
 * gradient pass; for silu also with pre consumed (g in pre's memory), with dx alone (no db
 * sums), with pre recomputed (the reference's pre is then the test's f64 x·wᵀ + b rounded to the
 * dtype, on the sampled rows and columns, and db is checked on the sampled columns), and twice
 * with the same bits. Misaligned (cuBLASLt's products and the pass): none and silu. dx on every
 * 37th row and the last three, dw on every 37th row of its M and the last three, db whole, all
 * against f64; every element of dx and dw written; on a 9.0 device with an sm_90a build the plan
 * must name the formed product, and cuBLASLt's for the plain ones (dw = gᵀ·x reduces over
 * N = 4820, an unformed dx over M = 4104: the GEMM primitive gives the own GEMM a plain product
 * only for a reduction of 16384 or more). */
enum { WB_KEEP, WB_CONSUME, WB_DX_ONLY, WB_RECOMPUTE, WB_TWICE, WB_SLOPE, WB_SLOPE_CONSUME, WB_MODES };
static const char *wb_mode_names[WB_MODES] = {"",       " pre consumed", " dx only", " pre recomputed", " twice",
                                              " slope form", " slope form consumed"};

/* the slope form's backward with its saved slope consumed (g formed in its memory): through a
   plan, the one way to give both flags */
static void backward_slope_consumed(fg_context *ctx, fg_backend be, int act, const th_operand *dy, const th_operand *s,
                                    const th_operand *x, const th_operand *w, const th_operand *b, const th_operand *dx,
                                    const th_operand *dw, const th_operand *db) {
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    /* (the plan flags of the slope and consuming forms, kept for this minor version) */
    fg_linear_act_options o = {(fg_activation)act, FG_ACT_SAVED_PRE, 0};
    d.op = FG_OP_LINEAR_ACT_BACKWARD, d.options = &o, d.options_size = sizeof o;
    d.flags = FG_PLAN_ACT_SLOPE | FG_PLAN_CONSUME_PRE;
    const fg_tensor ops[8] = {dy->t, s->t, x->t, w->t, b->t, dx->t, dw->t, db->t};
    memcpy(d.operands, ops, sizeof ops);
    fg_plan *plan = NULL;
    TH_OK(fg_plan_create(ctx, &d, &plan));
    if (!plan) return;
    size_t need = 0;
    TH_OK(fg_plan_workspace_size(plan, &need));
    th_buf ws = th_alloc(be, FG_F32, (int64_t)(need / 4 + 1));
    TH_OK(fg_plan_run(plan, ops, need ? ws.ptr : NULL, need));
    th_free(&ws);
    fg_plan_destroy(plan);
}

static void wide_backward(fg_context *ctx, fg_backend be, fg_dtype dt) {
    const int64_t N = 4820, K = 1400, M = 4104;
    int64_t rn[160], rm[160], nn = 0, nm = 0;
    for (int64_t n = 0; n < N - 3; n += 37) rn[nn++] = n;
    for (int64_t n = N - 3; n < N; n++) rn[nn++] = n;
    for (int64_t m = 0; m < M - 3; m += 37) rm[nm++] = m;
    for (int64_t m = M - 3; m < M; m++) rm[nm++] = m;
    double *g = malloc(sizeof(double) * (size_t)(N * M)), *rdx = malloc(sizeof(double) * (size_t)(nn * K));
    double *rdw = malloc(sizeof(double) * (size_t)(nm * K)), *rdb = malloc(sizeof(double) * (size_t)M);
    double *got = malloc(sizeof(double) * (size_t)(N * K)), *sub = malloc(sizeof(double) * (size_t)(160 * K));
    double *pv = malloc(sizeof(double) * (size_t)(N * M));
    for (int layout = 0; layout <= 3; layout += 3) {
        int64_t xs[2] = {N, K}, ws[2] = {M, K}, bs[1] = {M}, ys[2] = {N, M};
        th_operand x = th_make(be, dt, 2, xs, layout), w = th_make(be, dt, 2, ws, layout), b = th_make(be, dt, 1, bs, layout);
        th_operand dy = th_make(be, dt, 2, ys, layout), pre = th_make(be, dt, 2, ys, layout);
        th_operand dx = th_make(be, dt, 2, xs, layout), dw = th_make(be, dt, 2, ws, layout), db = th_make(be, dt, 1, bs, layout);
        th_randomize(&x), th_randomize(&w), th_randomize(&b), th_randomize(&dy), th_randomize(&pre);
        for (int64_t i = 0; i < pre.n; i++) pre.v[i] = (pre.v[i] - 0.25) * 4.0;
        th_round(dt, pre.v, pre.n);
        for (int act = 0; act <= FG_ACT_TANH; act++)
            for (int mode = 0; mode < WB_MODES; mode++) {
                /* misaligned: none and silu kept; aligned: every act kept, silu in every mode, the
                   slope form (whose backward does not depend on act) for gelu_tanh too */
                const bool slope = mode == WB_SLOPE || mode == WB_SLOPE_CONSUME;
                if (layout ? act != FG_ACT_NONE && act != FG_ACT_SILU || mode != WB_KEEP
                           : mode != WB_KEEP && act != FG_ACT_SILU && !(slope && act == FG_ACT_GELU_TANH))
                    continue;
                char lab[200];
                snprintf(lab, sizeof lab, "large backward %s %s %s N=%lld K=%lld M=%lld%s%s", act_names[act],
                         th_backend_name(be), fg_dtype_name(dt), (long long)N, (long long)K, (long long)M,
                         layout ? " misaligned" : "", wb_mode_names[mode]);
                const double *p = pre.v;
                if (mode == WB_RECOMPUTE) { /* f64 pre where the checks read g: sampled rows, sampled columns */
                    for (int64_t i = 0; i < N * M; i++) pv[i] = NAN;
                    for (int64_t n = 0, r = 0; n < N; n++) {
                        const bool row = r < nn && rn[r] == n;
                        r += row;
                        for (int64_t m = 0, q = 0; m < M; m++) {
                            const bool col = q < nm && rm[q] == m;
                            q += col;
                            if (!row && !col) continue;
                            double v = b.v[m];
                            for (int64_t k = 0; k < K; k++) v += x.v[n * K + k] * w.v[m * K + k];
                            th_round(dt, &v, 1);
                            pv[n * M + m] = v;
                        }
                    }
                    p = pv;
                } else
                    th_put(&pre.buf, &pre.t, pre.v); /* (again: the consuming mode overwrites it) */
                const bool want_w = mode != WB_DX_ONLY;
                /* (the slope form: pre's values are taken as the saved slopes) */
                for (int64_t i = 0; i < N * M; i++) g[i] = dy.v[i] * (slope ? p[i] : (double)ref_slope(act, p[i]));
                memset(rdx, 0, sizeof(double) * (size_t)(nn * K));
                memset(rdw, 0, sizeof(double) * (size_t)(nm * K));
                memset(rdb, 0, sizeof(double) * (size_t)M);
                for (int64_t r = 0; r < nn; r++)
                    for (int64_t m = 0; m < M; m++)
                        for (int64_t k = 0; k < K; k++) rdx[r * K + k] += g[rn[r] * M + m] * w.v[m * K + k];
                for (int64_t n = 0; n < N && want_w; n++) {
                    for (int64_t m = 0; m < M; m++) rdb[m] += g[n * M + m];
                    for (int64_t r = 0; r < nm; r++)
                        for (int64_t k = 0; k < K; k++) rdw[r * K + k] += g[n * M + rm[r]] * x.v[n * K + k];
                }
                th_poison(&dx.buf), th_poison(&dw.buf), th_poison(&db.buf);
                const fg_tensor *tdw = want_w ? &dw.t : NULL, *tdb = want_w ? &db.t : NULL;
                if (mode == WB_SLOPE)
                    TH_OK(fg_linear_act_backward_slope(ctx, (fg_activation)act, &dy.t, &pre.t, &x.t, &w.t, &b.t, &dx.t, tdw,
                                                       tdb, 0));
                else if (mode == WB_SLOPE_CONSUME)
                    backward_slope_consumed(ctx, be, act, &dy, &pre, &x, &w, &b, &dx, &dw, &db);
                else if (mode == WB_CONSUME)
                    TH_OK(fg_linear_act_backward_consume(ctx, (fg_activation)act, &dy.t, &pre.t, &x.t, &w.t, &b.t, &dx.t,
                                                         tdw, tdb, 0));
                else
                    TH_OK(fg_linear_act_backward(ctx, (fg_activation)act, &dy.t, mode == WB_RECOMPUTE ? NULL : &pre.t, &x.t,
                                                 &w.t, &b.t, &dx.t, tdw, tdb, 0));
                for (int o = 0; o < (want_w ? 2 : 1); o++) {
                    const int64_t rows = o ? M : N, nr = o ? nm : nn, *list = o ? rm : rn;
                    th_get(o ? &dw.buf : &dx.buf, o ? &dw.t : &dx.t, got);
                    bool written = true; /* every element, not just the sampled rows (poisoned: NaN) */
                    for (int64_t i = 0; i < rows * K && written; i++) written = got[i] == got[i];
                    for (int64_t r = 0; r < nr; r++) memcpy(sub + r * K, got + list[r] * K, sizeof(double) * (size_t)K);
                    const double err = th_relerr(sub, o ? rdw : rdx, nr * K);
                    TH_CHECK(written && err <= th_tol(dt, false), "%s %s: relerr %.3g (all written: %d)", o ? "dw" : "dx", lab,
                             err, (int)written);
                }
                if (want_w && mode == WB_RECOMPUTE) { /* db on the sampled columns (rdb's others are NaN) */
                    double gdb[160], wdb[160], mean = 0;
                    th_get(&db.buf, &db.t, got);
                    for (int64_t r = 0; r < nm; r++) gdb[r] = got[rm[r]], wdb[r] = rdb[rm[r]], mean += fabs(wdb[r]) / (double)nm;
                    bool close = true; /* every element, as th_verify bounds them */
                    for (int64_t r = 0; r < nm; r++)
                        close = close && fabs(gdb[r] - wdb[r]) <= 4 * th_tol(dt, false) * (fabs(wdb[r]) + mean);
                    bool written = true;
                    for (int64_t m = 0; m < M && written; m++) written = got[m] == got[m];
                    const double err = th_relerr(gdb, wdb, nm);
                    TH_CHECK(written && close && err <= th_tol(dt, false), "db %s: relerr %.3g (all written: %d, every element close: %d)",
                             lab, err, (int)written, (int)close);
                } else if (want_w)
                    th_verify("db", &db, rdb, th_tol(dt, false), lab);
                if (mode == WB_TWICE) { /* the same bits again (g's units are handed out as blocks ask) */
                    void *snap[3] = {th_snapshot(&dx.buf), th_snapshot(&dw.buf), th_snapshot(&db.buf)};
                    TH_OK(fg_linear_act_backward(ctx, (fg_activation)act, &dy.t, &pre.t, &x.t, &w.t, &b.t, &dx.t, &dw.t,
                                                 &db.t, 0));
                    TH_CHECK(th_unchanged(&dx.buf, snap[0]) && th_unchanged(&dw.buf, snap[1]) &&
                                 th_unchanged(&db.buf, snap[2]),
                             "%s: a second run gave other bits", lab);
                    free(snap[0]), free(snap[1]), free(snap[2]);
                }
#ifdef FG_TEST_HAVE_SM90A
                if (layout == 0 && (mode == WB_KEEP || mode == WB_SLOPE)) { /* the path: the plan names its kernels */
                    fg_plan_info info;
                    backward_plan(ctx, act, &dy, &pre.t, &x, &w, &b, &dx, &dw, &db, &info, slope);
                    const bool formed = slope || act == FG_ACT_RELU || act == FG_ACT_SILU || act == FG_ACT_SIGMOID ||
                                        act == FG_ACT_TANH;
                    if (info.arch == 90)
                        TH_CHECK((strstr(info.kernel, "gemm90_dx_formed_g") != NULL) == formed &&
                                     strstr(info.kernel, "gemm90_dw") == NULL &&
                                     (formed || strstr(info.kernel, "gemm90_dx") == NULL),
                                 "%s: the plan runs %s (want the sm_90a GEMM forming g: %d; the plain products, "
                                 "reductions below 16384, on cuBLASLt)", lab, info.kernel, (int)formed);
                }
#endif
            }
        th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&dy), th_drop(&pre), th_drop(&dx), th_drop(&dw), th_drop(&db);
    }
    free(g), free(rdx), free(rdw), free(rdb), free(got), free(sub), free(pv);
}

/* CUDA's one-kernel backward over many row tiles (36000 rows: 1125 tiles of 32, ≥ 8 a block,
 * so the sm_90a kernel's four stages go round at least twice), every activation, accumulate 0
 * and 1, against f64; and its plan: on a 9.0 device with an sm_90a build a kept pre (aligned)
 * runs linear_act_bwd90 for every activation but none, no kept pre something else. */
static void short_backward(fg_context *ctx, fg_backend be, fg_dtype dt) {
    const int64_t N = 36000, K = 16, M = 64;
    int64_t xs[2] = {N, K}, ws[2] = {M, K}, bs[1] = {M}, ys[2] = {N, M};
    th_operand x = th_make(be, dt, 2, xs, 0), w = th_make(be, dt, 2, ws, 0), b = th_make(be, dt, 1, bs, 0);
    th_operand dy = th_make(be, dt, 2, ys, 0), pre = th_make(be, dt, 2, ys, 0);
    th_randomize(&x), th_randomize(&w), th_randomize(&b), th_randomize(&dy), th_randomize(&pre);
    for (int64_t i = 0; i < pre.n; i++) pre.v[i] = (pre.v[i] - 0.25) * 4.0;
    th_round(dt, pre.v, pre.n);
    th_put(&pre.buf, &pre.t, pre.v);
    double *rdx = malloc(sizeof(double) * (size_t)(N * K)), *rdw = malloc(sizeof(double) * (size_t)(M * K));
    double *rdb = malloc(sizeof(double) * (size_t)M);
    for (int act = FG_ACT_RELU; act <= FG_ACT_TANH; act++) {
        memset(rdx, 0, sizeof(double) * (size_t)(N * K));
        memset(rdw, 0, sizeof(double) * (size_t)(M * K));
        memset(rdb, 0, sizeof(double) * (size_t)M);
        for (int64_t n = 0; n < N; n++)
            for (int64_t m = 0; m < M; m++) {
                const double g = dy.v[n * M + m] * (double)ref_slope(act, pre.v[n * M + m]);
                rdb[m] += g;
                for (int64_t k = 0; k < K; k++) rdx[n * K + k] += g * w.v[m * K + k], rdw[m * K + k] += g * x.v[n * K + k];
            }
        char lab[160];
        snprintf(lab, sizeof lab, "long short-K backward %s %s %s N=%lld K=%lld M=%lld", act_names[act], th_backend_name(be),
                 fg_dtype_name(dt), (long long)N, (long long)K, (long long)M);
        for (int acc = 0; acc < 2; acc++) {
            th_operand dx = th_make(be, dt, 2, xs, 0), dw = th_make(be, dt, 2, ws, 0), db = th_make(be, dt, 1, bs, 0);
            check_backward(ctx, act, &dy, &pre.t, &x, &w, &b.t, &dx, &dw, &db, rdx, rdw, rdb, acc, th_tol(dt, false), lab,
                           false);
            th_drop(&dx), th_drop(&dw), th_drop(&db);
        }
    }
    free(rdx), free(rdw), free(rdb);
#ifdef FG_TEST_HAVE_SM90A
    th_operand dx = th_make(be, dt, 2, xs, 0), dw = th_make(be, dt, 2, ws, 0), db = th_make(be, dt, 1, bs, 0);
    for (int act = FG_ACT_RELU; act <= FG_ACT_TANH; act++)
        for (int keep = 0; keep < 2; keep++) {
            fg_plan_info info;
            backward_plan(ctx, act, &dy, keep ? &pre.t : NULL, &x, &w, &b, &dx, &dw, &db, &info, false);
            if (info.arch == 90)
                TH_CHECK((strstr(info.kernel, "linear_act_bwd90") != NULL) == (keep == 1),
                         "short backward %s %s keep=%d: the plan runs %s", act_names[act], fg_dtype_name(dt), keep, info.kernel);
        }
    th_drop(&dx), th_drop(&dw), th_drop(&db);
#endif
    th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&dy), th_drop(&pre);
}

/* Batched weights: x [B, L1, L2, K], w [B, M, K], b none / [M] shared / [B, M]; each batch
 * against the 2-D reference, db summed over the batches when b is shared; a kept pre is the
 * test's own. */
static void batched_weights(fg_context *ctx, fg_backend be, fg_dtype dt, int act, int bias_kind) {
    const int64_t B = 3, L1 = 4, L2 = 5, K = 24, M = 40, N = L1 * L2;
    int64_t xs[4] = {B, L1, L2, K}, ys[4] = {B, L1, L2, M}, wsh[3] = {B, M, K}, bsh[2] = {B, M}, m1[1] = {M};
    th_operand x = th_make(be, dt, 4, xs, 0), w = th_make(be, dt, 3, wsh, 0), y = th_make(be, dt, 4, ys, 0);
    th_operand pre = th_make(be, dt, 4, ys, 0), dy = th_make(be, dt, 4, ys, 0);
    th_operand b = bias_kind == 2 ? th_make(be, dt, 2, bsh, 0) : bias_kind == 1 ? th_make(be, dt, 1, m1, 0)
                                                                                 : (th_operand){0};
    th_randomize(&x), th_randomize(&w), th_randomize(&dy);
    for (int64_t i = 0; i < x.n; i++) x.v[i] = (x.v[i] - 0.25) * 4.0 / sqrt((double)K);
    th_round(dt, x.v, x.n);
    th_put(&x.buf, &x.t, x.v);
    if (bias_kind) th_randomize(&b);
    const fg_tensor *bt = bias_kind ? &b.t : NULL;
    const double tol = th_tol(dt, false);
    char lab[200];
    snprintf(lab, sizeof lab, "batched w %s %s %s bias=%s", act_names[act], th_backend_name(be), fg_dtype_name(dt),
             bias_kind == 2 ? "[B,M]" : bias_kind == 1 ? "[M]" : "none");
    for (int64_t bi = 0; bi < B; bi++)
        free(calm_kink(dt, act, x.v + bi * N * K, w.v + bi * M * K,
                       bias_kind == 2 ? b.v + bi * M : bias_kind == 1 ? b.v : NULL, dy.v + bi * N * M, N, K, M));
    th_put(&dy.buf, &dy.t, dy.v);
    TH_OK(fg_linear_act_forward(ctx, (fg_activation)act, &x.t, &w.t, bt, &y.t, &pre.t));
    double *own = malloc(sizeof(double) * (size_t)pre.n);
    double *wy = malloc(sizeof(double) * (size_t)y.n), *wdx = malloc(sizeof(double) * (size_t)x.n);
    double *wdw = malloc(sizeof(double) * (size_t)w.n), *wdb = calloc((size_t)(B * M), sizeof(double));
    for (int64_t bi = 0; bi < B; bi++) {
        const double *xb = x.v + bi * N * K, *wb = w.v + bi * M * K, *dyb = dy.v + bi * N * M;
        const double *bb = bias_kind == 2 ? b.v + bi * M : bias_kind == 1 ? b.v : NULL;
        ref r = reference(dt, act, xb, wb, bb, dyb, N, K, M);
        memcpy(wy + bi * N * M, r.y, sizeof(double) * (size_t)(N * M));
        memcpy(own + bi * N * M, r.pre, sizeof(double) * (size_t)(N * M));
        memcpy(wdx + bi * N * K, r.dx, sizeof(double) * (size_t)(N * K));
        memcpy(wdw + bi * M * K, r.dw, sizeof(double) * (size_t)(M * K));
        for (int64_t m = 0; m < M; m++) wdb[(bias_kind == 2 ? bi * M : 0) + m] += r.db[m];
        free_ref(&r);
    }
    th_verify("y", &y, wy, tol, lab);
    th_round(dt, own, pre.n);
    th_put(&pre.buf, &pre.t, own);
    for (int keep = 0; keep < 2; keep++)
        for (int acc = 0; acc < 2; acc++) {
            th_operand dx = th_make(be, dt, 4, xs, 0), dw = th_make(be, dt, 3, wsh, 0);
            th_operand db = bias_kind == 2 ? th_make(be, dt, 2, bsh, 0) : th_make(be, dt, 1, m1, 0);
            check_backward(ctx, act, &dy, keep ? &pre.t : NULL, &x, &w, bt, &dx, &dw, &db, wdx, wdw, wdb, acc, tol,
                           lab, false);
            th_drop(&dx), th_drop(&dw), th_drop(&db);
        }
    free(own), free(wy), free(wdx), free(wdw), free(wdb);
    th_drop(&x), th_drop(&w), th_drop(&y), th_drop(&pre), th_drop(&dy);
    if (bias_kind) th_drop(&b);
}

/* x[i, :] = special value v_i, w = the 8 × 8 identity, no bias: pre[i, :] = v_i exactly (the
 * other terms are ±0), through a real product (K = M = 8), so the GEMM epilogues run too. */
static void special_values(fg_context *ctx, fg_backend be, fg_dtype dt) {
    const double vals[] = {0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 5.0, -5.0, 15.0, -15.0, 1e4, -1e4, 3e38, -3e38, NAN};
    const int64_t n = (int64_t)(sizeof vals / sizeof vals[0]), E = 8;
    int64_t xs[2] = {n, E}, ws[2] = {E, E};
    th_operand x = th_make(be, dt, 2, xs, 0), w = th_make(be, dt, 2, ws, 0), y = th_make(be, dt, 2, xs, 0);
    th_operand dy = th_make(be, dt, 2, xs, 0), dx = th_make(be, dt, 2, xs, 0);
    const double big = dt == FG_F16 ? 6e4 : 3e38; /* what the dtype holds */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < E; j++) {
            x.v[i * E + j] = fabs(vals[i]) > big ? copysign(big, vals[i]) : vals[i];
            dy.v[i * E + j] = 1.0;
        }
    th_round(dt, x.v, n * E);
    for (int64_t j = 0; j < E * E; j++) w.v[j] = j % (E + 1) == 0 ? 1.0 : 0.0;
    th_put(&x.buf, &x.t, x.v), th_put(&w.buf, &w.t, w.v), th_put(&dy.buf, &dy.t, dy.v);
    for (int act = 0; act <= FG_ACT_TANH; act++) {
        TH_OK(fg_linear_act_forward(ctx, (fg_activation)act, &x.t, &w.t, NULL, &y.t, NULL));
        TH_OK(fg_linear_act_backward(ctx, (fg_activation)act, &dy.t, NULL, &x.t, &w.t, NULL, &dx.t, NULL, NULL, 0));
        double *gy = malloc(sizeof(double) * (size_t)(n * E)), *gd = malloc(sizeof(double) * (size_t)(n * E));
        th_get(&y.buf, &y.t, gy), th_get(&dx.buf, &dx.t, gd);
        for (int64_t e = 0; e < n * E; e++) {
            double xv = x.v[e];
            if (isnan(xv)) { /* (none's gradient does not depend on x) */
                TH_CHECK(isnan(gy[e]) && (isnan(gd[e]) || act == FG_ACT_NONE), "%s %s %s: NaN in gave y=%g dx=%g",
                         act_names[act], th_backend_name(be), fg_dtype_name(dt), gy[e], gd[e]);
                continue;
            }
            double wy = (double)ref_act(act, xv), wd = (double)ref_slope(act, xv);
            th_round(dt, &wy, 1), th_round(dt, &wd, 1);
            bool finite = isfinite(gd[e]) && (isfinite(gy[e]) || isinf(wy));
            TH_CHECK(finite, "%s %s %s x=%g: y=%g slope=%g not finite", act_names[act], th_backend_name(be),
                     fg_dtype_name(dt), xv, gy[e], gd[e]);
            /* relative to the value, or to the dtype's smallest normal (subnormals hold fewer bits) */
            const double tiny = dt == FG_F64 ? 2.3e-308 : dt == FG_F16 ? 6.2e-5 : 1.2e-38;
            double ty = th_tol(dt, false) * (fabs(wy) + tiny), td = th_tol(dt, false) * (fabs(wd) + tiny);
            TH_CHECK(gy[e] == wy || fabs(gy[e] - wy) <= ty, "%s %s %s x=%g: y=%.9g want %.9g", act_names[act],
                     th_backend_name(be), fg_dtype_name(dt), xv, gy[e], wy);
            TH_CHECK(gd[e] == wd || fabs(gd[e] - wd) <= td, "%s %s %s x=%g: slope=%.9g want %.9g", act_names[act],
                     th_backend_name(be), fg_dtype_name(dt), xv, gd[e], wd);
        }
        free(gy), free(gd);
    }
    th_drop(&x), th_drop(&w), th_drop(&y), th_drop(&dy), th_drop(&dx);
}

/* f64 CPU: the backward against central differences of the forward. */
typedef struct fd_arg {
    int act;
    th_operand *x, *w, *b, *out;
} fd_arg;

static fg_status fd_forward(fg_context *ctx, void *p) {
    fd_arg *a = p;
    return fg_linear_act_forward(ctx, (fg_activation)a->act, &a->x->t, &a->w->t, &a->b->t, &a->out->t, NULL);
}

static void finite_differences(fg_context *ctx) {
    for (int act = 0; act <= FG_ACT_TANH; act++) {
        int64_t xs[2] = {4, 3}, ws[2] = {5, 3}, bs[1] = {5}, ys[2] = {4, 5};
        th_operand x = th_make(FG_BACKEND_CPU, FG_F64, 2, xs, 0), w = th_make(FG_BACKEND_CPU, FG_F64, 2, ws, 0);
        th_operand b = th_make(FG_BACKEND_CPU, FG_F64, 1, bs, 0), y = th_make(FG_BACKEND_CPU, FG_F64, 2, ys, 0);
        th_operand r = th_make(FG_BACKEND_CPU, FG_F64, 2, ys, 0);
        th_operand dx = th_make(FG_BACKEND_CPU, FG_F64, 2, xs, 0), dw = th_make(FG_BACKEND_CPU, FG_F64, 2, ws, 0);
        th_operand db = th_make(FG_BACKEND_CPU, FG_F64, 1, bs, 0);
        th_randomize(&x), th_randomize(&w), th_randomize(&b), th_randomize(&r);
        for (int64_t i = 0; i < x.n; i++) x.v[i] = (x.v[i] - 0.25) * 2.0;
        th_put(&x.buf, &x.t, x.v);
        TH_OK(fg_linear_act_backward(ctx, (fg_activation)act, &r.t, NULL, &x.t, &w.t, &b.t, &dx.t, &dw.t, &db.t, 0));
        th_get(&dx.buf, &dx.t, dx.v), th_get(&dw.buf, &dw.t, dw.v), th_get(&db.buf, &db.t, db.v);
        fd_arg a = {act, &x, &w, &b, &y};
        th_operand *params[3] = {&x, &w, &b}, *grads[3] = {&dx, &dw, &db};
        const char *names[3] = {"x", "w", "b"};
        char label[64];
        snprintf(label, sizeof label, "fd %s", act_names[act]);
        /* relu has a kink at 0: its pre-activations stay away from it with this data (checked by the forward) */
        th_fd_check(ctx, label, fd_forward, &a, &y, &r, params, grads, names, 3, 0, act == FG_ACT_NONE);
        th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&y), th_drop(&r), th_drop(&dx), th_drop(&dw), th_drop(&db);
    }
}

static void determinism(fg_context *ctx, fg_backend be, fg_dtype dt) {
    int64_t xs[2] = {1000, 96}, ws[2] = {200, 96}, bs[1] = {200}, ys[2] = {1000, 200};
    th_operand x = th_make(be, dt, 2, xs, 0), w = th_make(be, dt, 2, ws, 0), dy = th_make(be, dt, 2, ys, 0);
    th_operand dw = th_make(be, dt, 2, ws, 0), db = th_make(be, dt, 1, bs, 0), dx = th_make(be, dt, 2, xs, 0);
    th_randomize(&x), th_randomize(&w), th_randomize(&dy);
    /* dw + db alone (GEMM path), and silu with dx (CUDA: the one-kernel backward, f16 / bf16) */
    for (int with_dx = 0; with_dx < 2; with_dx++) {
        void *snap[3] = {0};
        for (int run = 0; run < 2; run++) {
            TH_OK(fg_linear_act_backward(ctx, with_dx ? FG_ACT_SILU : FG_ACT_GELU_TANH, &dy.t, NULL, &x.t, &w.t, NULL,
                                         with_dx ? &dx.t : NULL, &dw.t, &db.t, 0));
            th_operand *o[3] = {&dw, &db, &dx};
            for (int k = 0; k < 2 + with_dx; k++) {
                if (run == 0) snap[k] = th_snapshot(&o[k]->buf);
                else TH_CHECK(th_unchanged(&o[k]->buf, snap[k]), "determinism %s %s: output %d differs (dx %d)",
                              th_backend_name(be), fg_dtype_name(dt), k, with_dx);
            }
        }
        free(snap[0]), free(snap[1]), free(snap[2]);
    }
    th_drop(&x), th_drop(&w), th_drop(&dy), th_drop(&dw), th_drop(&db), th_drop(&dx);
}

/* ------------------------------------------------------------------ dropout */

/* The multiplier of y's element i under the dropout (p, seed, offset), from rng.h's definition:
 * kept when u(seed, offset, i) >= p, then 1/(1 − p) (in f32 for f32 / f16 / bf16 data, as the
 * dropout op multiplies; f64 for f64), 0 when dropped or p = 1; 1 when p = 0. */
static double drop_mult(fg_dtype dt, double p, uint64_t seed, uint64_t offset, int64_t i) {
    if (p <= 0) return 1.0;
    if ((double)fg_dropout_uniform(seed, offset, (uint64_t)i) < p || p >= 1) return 0.0;
    return dt == FG_F64 ? 1.0 / (1.0 - p) : (double)(float)(1.0 / (1.0 - p));
}

/* Whether this CPU runs the short-k product's fused dropout (AVX-512 with bf16, and BMI2). */
static bool cpu_fuses_dropout(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
}

static bool same_bits(const th_operand *a, const th_operand *b) {
    const size_t bytes = (size_t)a->buf.n * fg_dtype_size(a->buf.dtype);
    char *ha = malloc(bytes + 1), *hb = malloc(bytes + 1);
    th_get_raw(&a->buf, ha, bytes), th_get_raw(&b->buf, hb, bytes);
    const bool same = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

/* Whether every " ; "-separated piece of a is a piece of b. */
static bool pieces_of(const char *a, const char *b) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", a);
    for (char *p = buf; p && *p;) {
        char *end = strstr(p, " ; ");
        if (end) *end = 0;
        bool found = false;
        for (const char *q = b; q && *q && !found;) {
            const char *e = strstr(q, " ; ");
            const size_t len = e ? (size_t)(e - q) : strlen(q);
            found = len == strlen(p) && strncmp(q, p, len) == 0;
            q = e ? e + 3 : NULL;
        }
        if (!found) return false;
        p = end ? end + 3 : NULL;
    }
    return true;
}

/* The kernels a plan of the same call names (fg_plan_info.kernel, each once) are the ones the
 * call ran (its launch record), and the other way round. */
static void plan_names(fg_context *ctx, fg_op op, const fg_linear_act_options *o, const fg_tensor *const *ts, int n,
                       const char *lab) {
    char ran[512];
    snprintf(ran, sizeof ran, "%s", fg_context_last_kernels(ctx));
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.op = op, d.options = o, d.options_size = sizeof *o;
    for (int i = 0; i < n; i++)
        if (ts[i]) d.operands[i] = *ts[i];
    fg_plan *plan = NULL;
    fg_plan_info info;
    TH_OK(fg_plan_create(ctx, &d, &plan));
    TH_OK(fg_plan_info_get(plan, &info));
    TH_CHECK(pieces_of(info.kernel, ran) && pieces_of(ran, info.kernel), "%s: the plan names %s, the call ran %s", lab,
             info.kernel, ran);
    fg_plan_destroy(plan);
}

/* y = dropout(act(x·wᵀ + b)) through the dropout option, for saved none / pre / slope:
 *  - y and the saved operand against the reference: the test's pre (long double sums rounded to
 *    the dtype), act and act′ of it (the slope rounded to the dtype), times the multiplier of
 *    drop_mult (f16 / bf16: act rounded to the dtype first); pre kept unmasked;
 *  - their bits against the op without the option followed by fg_dropout_forward on y (and on
 *    the slope): the same for every dtype;
 *  - the kernels that ran: the short-k product's fused dropout where `fused` (CPU f32 gelu on an
 *    AVX-512 machine), the dropout step after the product elsewhere, none at p = 0;
 *  - the backward with pre kept (the test's pre) and recomputed, the option given: against
 *    g = dy·m·act′(pre), and bit for bit against fg_dropout_backward on dy followed by the
 *    backward without it; the slope form's backward from the test's masked slope (p = 0) against
 *    g = dy·(m·s), and refused with p > 0. */
static int pass_drops_seen; /* forwards / backwards whose activation pass applied the dropout */
static int tile_drops_seen; /* of them, CUDA's short-K tile kernels (forward, gradient) */

/* The backward through a plan with FG_PLAN_CONSUME_DY on a copy of dy: the same gradients' bits
   as the call without it (dx, dw, db), dy's copy left as dy (the mask applied inside the gradient
   pass) or holding dy ⊙ m (dyd: fg_dropout_backward's), and no more workspace than without the
   flag (on the CPU, whose passes do not take the mask, less by the N·M buffer). */
static void backward_consuming_dy(fg_context *ctx, fg_backend be, fg_dtype dt, const fg_linear_act_options *o,
                                  const th_operand *dy, const th_operand *dyd, const th_operand *pv,
                                  const th_operand *x, const th_operand *w, const th_operand *b, const th_operand *dx,
                                  const th_operand *dw, const th_operand *db, const char *lab) {
    th_operand dyc = th_make(be, dt, dy->t.rank, dy->t.shape, 0), dx3 = th_make(be, dt, dx->t.rank, dx->t.shape, 0);
    th_operand dw3 = th_make(be, dt, dw->t.rank, dw->t.shape, 0), db3 = th_make(be, dt, db->t.rank, db->t.shape, 0);
    th_put(&dyc.buf, &dyc.t, dy->v);
    th_poison(&dx3.buf), th_poison(&dw3.buf), th_poison(&db3.buf); /* (as dx, dw, db were: same_bits reads the tails) */
    const fg_tensor ops[8] = {dyc.t, pv ? pv->t : (fg_tensor){0}, x->t, w->t, b->t, dx3.t, dw3.t, db3.t};
    size_t need[2] = {0, 0};
    fg_plan *plan[2] = {NULL, NULL};
    for (int f = 0; f < 2; f++) {
        fg_plan_desc d;
        memset(&d, 0, sizeof d);
        d.op = FG_OP_LINEAR_ACT_BACKWARD, d.options = o, d.options_size = sizeof *o;
        d.flags = f ? FG_PLAN_CONSUME_DY : 0;
        memcpy(d.operands, ops, sizeof ops);
        TH_OK(fg_plan_create(ctx, &d, &plan[f]));
        if (plan[f]) TH_OK(fg_plan_workspace_size(plan[f], &need[f]));
    }
    TH_CHECK(need[1] <= need[0], "%s: FG_PLAN_CONSUME_DY asks %zu bytes of workspace, %zu without", lab, need[1], need[0]);
    if (be == FG_BACKEND_CPU && o->dropout.p > 0)
        TH_CHECK(need[1] < need[0], "%s: FG_PLAN_CONSUME_DY saves no workspace on the CPU (%zu bytes)", lab, need[1]);
    if (plan[1]) {
        th_buf ws = th_alloc(be, FG_F32, (int64_t)(need[1] / 4 + 1));
        TH_OK(fg_plan_run(plan[1], ops, need[1] ? ws.ptr : NULL, need[1]));
        th_free(&ws);
        TH_CHECK(same_bits(&dx3, dx) && same_bits(&dw3, dw) && same_bits(&db3, db),
                 "%s: the gradients' bits differ with FG_PLAN_CONSUME_DY", lab);
        const size_t n = (size_t)dy->n;
        double *now = malloc(sizeof(double) * n), *masked = malloc(sizeof(double) * n);
        th_get(&dyc.buf, &dyc.t, now), th_get(&dyd->buf, &dyd->t, masked);
        TH_CHECK(memcmp(now, dy->v, sizeof(double) * n) == 0 || memcmp(now, masked, sizeof(double) * n) == 0,
                 "%s: dy holds neither dy nor dy ⊙ m afterwards", lab);
        free(now), free(masked);
    }
    fg_plan_destroy(plan[0]), fg_plan_destroy(plan[1]);
    th_drop(&dyc), th_drop(&dx3), th_drop(&dw3), th_drop(&db3);
}

static void dropout_case(fg_context *ctx, fg_backend be, fg_dtype dt, int act, int64_t N, int64_t K, int64_t M,
                         double p, bool fused) {
    const uint64_t seed = 0x5EED0000CAFEull + (uint64_t)N, offset = 0x300000005ull + (uint64_t)M; /* high words set */
    int64_t xs[2] = {N, K}, ws[2] = {M, K}, bs[1] = {M}, ys[2] = {N, M};
    th_operand x = th_make(be, dt, 2, xs, 0), w = th_make(be, dt, 2, ws, 0), b = th_make(be, dt, 1, bs, 0);
    th_operand y = th_make(be, dt, 2, ys, 0), y2 = th_make(be, dt, 2, ys, 0), s = th_make(be, dt, 2, ys, 0);
    th_operand s2 = th_make(be, dt, 2, ys, 0), pv = th_make(be, dt, 2, ys, 0), sv = th_make(be, dt, 2, ys, 0);
    th_operand dy = th_make(be, dt, 2, ys, 0), dyd = th_make(be, dt, 2, ys, 0);
    th_operand dx = th_make(be, dt, 2, xs, 0), dw = th_make(be, dt, 2, ws, 0), db = th_make(be, dt, 1, bs, 0);
    th_operand dx2 = th_make(be, dt, 2, xs, 0), dw2 = th_make(be, dt, 2, ws, 0), db2 = th_make(be, dt, 1, bs, 0);
    th_randomize(&x), th_randomize(&w), th_randomize(&b), th_randomize(&dy);
    for (int64_t i = 0; i < x.n; i++) x.v[i] = (x.v[i] - 0.25) * 6.0 / sqrt((double)K); /* pre across the curve */
    th_round(dt, x.v, x.n);
    th_put(&x.buf, &x.t, x.v);
    const int64_t nm = N * M;
    double *pre = malloc(sizeof(double) * (size_t)nm), *ry = malloc(sizeof(double) * (size_t)nm);
    double *rs = malloc(sizeof(double) * (size_t)nm), *mult = malloc(sizeof(double) * (size_t)nm);
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            long double q = b.v[m];
            for (int64_t k = 0; k < K; k++) q += (long double)x.v[n * K + k] * w.v[m * K + k];
            pre[n * M + m] = (double)q;
        }
    th_round(dt, pre, nm);
    int kept = 0;
    for (int64_t i = 0; i < nm; i++) {
        mult[i] = drop_mult(dt, p, seed, offset, i);
        kept += mult[i] != 0;
        double a = (double)ref_act(act, pre[i]), sl = (double)ref_slope(act, pre[i]);
        if (dt == FG_F16 || dt == FG_BF16) th_round(dt, &a, 1);
        th_round(dt, &sl, 1);
        ry[i] = a * mult[i], rs[i] = sl * mult[i];
    }
    th_round(dt, rs, nm); /* the masked slope as the op stores it */
    char lab[200];
    snprintf(lab, sizeof lab, "dropout p=%g %s %s %s N=%lld K=%lld M=%lld%s", p, act_names[act], th_backend_name(be),
             fg_dtype_name(dt), (long long)N, (long long)K, (long long)M, fused ? " (fused)" : "");
    if (p > 0 && p < 1) TH_CHECK(kept > nm / 4 && kept < nm, "%s: %d of %lld kept", lab, kept, (long long)nm);
    const fg_dropout_options dop = {p, seed, offset};
    for (int saved = 0; saved < 3; saved++) { /* none, pre, slope */
        fg_linear_act_options o = {(fg_activation)act, saved == 2 ? FG_ACT_SAVED_SLOPE : FG_ACT_SAVED_PRE, 0, dop};
        if (act == FG_ACT_NONE && saved == 2 && p > 0) { /* its backward never reads the slope: refused */
            TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &y, fg_linear_act_forward_ex(ctx, &o, &x.t, &w.t, &b.t, &y.t, &s.t));
            continue;
        }
        th_poison(&y.buf), th_poison(&s.buf);
        TH_OK(fg_linear_act_forward_ex(ctx, &o, &x.t, &w.t, &b.t, &y.t, saved ? &s.t : NULL));
        const char *ran = fg_context_last_kernels(ctx);
        const bool any = strstr(ran, "dropout") != NULL, in_product = strstr(ran, "+dropout") != NULL;
        const bool in_pass = strstr(ran, ">+dropout") != NULL; /* the activation pass's label: act_<act><<dtype>> */
        TH_CHECK(p > 0 ? any && (in_product == fused || (be == FG_BACKEND_CUDA && in_pass)) : !any,
                 "%s saved=%d: ran %s", lab, saved, ran);
        pass_drops_seen += in_pass;
        tile_drops_seen += in_pass && strstr(ran, "linear_act_tile_") != NULL;
        char l2[260];
        snprintf(l2, sizeof l2, "%s saved=%d", lab, saved);
        const fg_tensor *fo[5] = {&x.t, &w.t, &b.t, &y.t, saved ? &s.t : NULL};
        plan_names(ctx, FG_OP_LINEAR_ACT_FORWARD, &o, fo, 5, l2);
        th_verify("y", &y, ry, th_tol(dt, false), l2);
        if (saved) th_verify(saved == 2 ? "masked slope" : "pre", &s, saved == 2 ? rs : pre, th_tol(dt, false), l2);
        /* the unfused pair */
        fg_linear_act_options o0 = o;
        o0.dropout.p = 0;
        th_poison(&y2.buf), th_poison(&s2.buf);
        TH_OK(fg_linear_act_forward_ex(ctx, &o0, &x.t, &w.t, &b.t, &y2.t, saved ? &s2.t : NULL));
        if (p > 0) TH_OK(fg_dropout_forward(ctx, &dop, &y2.t, &y2.t));
        if (p > 0 && saved == 2) TH_OK(fg_dropout_forward(ctx, &dop, &s2.t, &s2.t));
        TH_CHECK(same_bits(&y, &y2), "%s: y's bits differ from linear_act then dropout_forward", l2);
        if (saved) TH_CHECK(same_bits(&s, &s2), "%s: the saved operand's bits differ from the unfused pair's", l2);
    }
    /* backward, pre kept (the test's) and recomputed, with the option */
    th_put(&pv.buf, &pv.t, pre);
    double *rdx = calloc((size_t)(N * K), sizeof(double)), *rdw = calloc((size_t)(M * K), sizeof(double));
    double *rdb = calloc((size_t)M, sizeof(double));
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            const long double g = (long double)dy.v[n * M + m] * mult[n * M + m] * ref_slope(act, pre[n * M + m]);
            rdb[m] += (double)g;
            for (int64_t k = 0; k < K; k++)
                rdx[n * K + k] += (double)(g * w.v[m * K + k]), rdw[m * K + k] += (double)(g * x.v[n * K + k]);
        }
    for (int keep = 1; keep >= 0; keep--) {
        fg_linear_act_options o = {(fg_activation)act, FG_ACT_SAVED_PRE, 0, dop};
        char l2[260];
        snprintf(l2, sizeof l2, "%s backward keep=%d", lab, keep);
        th_poison(&dx.buf), th_poison(&dw.buf), th_poison(&db.buf);
        TH_OK(fg_linear_act_backward_ex(ctx, &o, &dy.t, keep ? &pv.t : NULL, &x.t, &w.t, &b.t, &dx.t, &dw.t, &db.t, 0));
        if (p > 0) TH_CHECK(strstr(fg_context_last_kernels(ctx), "dropout") != NULL, "%s: ran %s", l2, fg_context_last_kernels(ctx));
        pass_drops_seen += strstr(fg_context_last_kernels(ctx), "act_grad_") != NULL &&
                           strstr(fg_context_last_kernels(ctx), ">+dropout") != NULL;
        tile_drops_seen += strstr(fg_context_last_kernels(ctx), "linear_act_grad_tile_") != NULL &&
                           strstr(fg_context_last_kernels(ctx), ">+dropout") != NULL;
        const fg_tensor *bo[8] = {&dy.t, keep ? &pv.t : NULL, &x.t, &w.t, &b.t, &dx.t, &dw.t, &db.t};
        plan_names(ctx, FG_OP_LINEAR_ACT_BACKWARD, &o, bo, 8, l2);
        th_verify("dx", &dx, rdx, th_tol(dt, false), l2);
        th_verify("dw", &dw, rdw, th_tol(dt, false), l2);
        th_verify("db", &db, rdb, th_tol(dt, false), l2);
        o.dropout.p = 0;
        TH_OK(fg_dropout_backward(ctx, &dop, &dy.t, &dyd.t, 0));
        th_poison(&dx2.buf), th_poison(&dw2.buf), th_poison(&db2.buf);
        TH_OK(fg_linear_act_backward_ex(ctx, &o, &dyd.t, keep ? &pv.t : NULL, &x.t, &w.t, &b.t, &dx2.t, &dw2.t, &db2.t, 0));
        TH_CHECK(same_bits(&dx, &dx2) && same_bits(&dw, &dw2) && same_bits(&db, &db2),
                 "%s: the gradients' bits differ from dropout_backward then the backward", l2);
        o.dropout.p = p;
        if (p > 0) backward_consuming_dy(ctx, be, dt, &o, &dy, &dyd, keep ? &pv : NULL, &x, &w, &b, &dx, &dw, &db, l2);
    }
    /* the slope form's backward: the masked slope carries the mask, p = 0 */
    th_put(&sv.buf, &sv.t, rs);
    memset(rdx, 0, sizeof(double) * (size_t)(N * K)), memset(rdw, 0, sizeof(double) * (size_t)(M * K));
    memset(rdb, 0, sizeof(double) * (size_t)M);
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            const long double g = (long double)dy.v[n * M + m] * rs[n * M + m];
            rdb[m] += (double)g;
            for (int64_t k = 0; k < K; k++)
                rdx[n * K + k] += (double)(g * w.v[m * K + k]), rdw[m * K + k] += (double)(g * x.v[n * K + k]);
        }
    if (act != FG_ACT_NONE) {
        fg_linear_act_options o = {(fg_activation)act, FG_ACT_SAVED_SLOPE, 0, {0.0, seed, offset}};
        char l2[260];
        snprintf(l2, sizeof l2, "%s backward slope form", lab);
        th_poison(&dx.buf), th_poison(&dw.buf), th_poison(&db.buf);
        TH_OK(fg_linear_act_backward_ex(ctx, &o, &dy.t, &sv.t, &x.t, &w.t, &b.t, &dx.t, &dw.t, &db.t, 0));
        th_verify("dx", &dx, rdx, th_tol(dt, false), l2);
        th_verify("dw", &dw, rdw, th_tol(dt, false), l2);
        th_verify("db", &db, rdb, th_tol(dt, false), l2);
        if (p > 0) { /* the mask would be applied twice: refused, nothing written */
            o.dropout.p = p;
            TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &dx,
                          fg_linear_act_backward_ex(ctx, &o, &dy.t, &sv.t, &x.t, &w.t, &b.t, &dx.t, &dw.t, &db.t, 0));
            TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &dw,
                          fg_linear_act_backward_ex(ctx, &o, &dy.t, &sv.t, &x.t, &w.t, &b.t, &dx.t, &dw.t, &db.t, 0));
        }
    }
    free(rdx), free(rdw), free(rdb), free(pre), free(ry), free(rs), free(mult);
    th_drop(&x), th_drop(&w), th_drop(&b), th_drop(&y), th_drop(&y2), th_drop(&s), th_drop(&s2), th_drop(&pv);
    th_drop(&sv), th_drop(&dy), th_drop(&dyd), th_drop(&dx), th_drop(&dw), th_drop(&db), th_drop(&dx2);
    th_drop(&dw2), th_drop(&db2);
}

/* The shapes: 330 × 16 → 202 is the CPU's short-k product (rows starting at flat indices that
 * are not multiples of 4 or 64, a masked last vector), 7 × 5 → 13 is not; gelu is fused there
 * on the CPU in f32, silu is not (the activation pass and the dropout step after it); p = 1 and
 * p = 0 are edges (p = 1: every element dropped, by the dropout step). */
static void dropout(fg_context *ctx, fg_backend be, fg_dtype dt) {
    const bool z = be == FG_BACKEND_CPU && dt == FG_F32 && cpu_fuses_dropout();
    pass_drops_seen = tile_drops_seen = 0;
    dropout_case(ctx, be, dt, FG_ACT_GELU, 330, 16, 202, 0.3, z);
    dropout_case(ctx, be, dt, FG_ACT_GELU_TANH, 300, 32, 256, 0.5, z);
    dropout_case(ctx, be, dt, FG_ACT_SILU, 330, 16, 202, 0.3, false);
    dropout_case(ctx, be, dt, FG_ACT_GELU, 330, 16, 202, 1.0, false);
    dropout_case(ctx, be, dt, FG_ACT_GELU, 330, 16, 202, 0.0, false);
    dropout_case(ctx, be, dt, FG_ACT_GELU_TANH, 7, 5, 13, 0.4, false);
    dropout_case(ctx, be, dt, FG_ACT_NONE, 7, 5, 13, 0.4, false);
    /* K past the short-product tiles: on CUDA the product, then the activation pass (which takes
       the mask), every dtype; rows of 250 elements (flat indices off the Philox groups) */
    dropout_case(ctx, be, dt, FG_ACT_GELU, 66, 160, 250, 0.3, false);
    dropout_case(ctx, be, dt, FG_ACT_SILU, 64, 136, 256, 0.2, false);
    if (be == FG_BACKEND_CUDA)
        TH_CHECK(pass_drops_seen > 0, "cuda %s: no activation pass applied the dropout", fg_dtype_name(dt));
    /* 300 × 32 → 256 in f16 / bf16 runs the tile kernels: the forward (saved none, pre and slope) and
       the gradient with pre recomputed apply the mask themselves */
    if (be == FG_BACKEND_CUDA && (dt == FG_F16 || dt == FG_BF16))
        TH_CHECK(tile_drops_seen >= 4, "cuda %s: the tile kernels applied the dropout %d times, not 4", fg_dtype_name(dt),
                 tile_drops_seen);
}

static void bad_input(fg_context *ctx, fg_backend be) {
    int64_t xs[2] = {6, 4}, ws[2] = {5, 4}, ys[2] = {6, 5}, y3[2] = {6, 3}, bs[1] = {5};
    th_operand x = th_make(be, FG_F32, 2, xs, 0), w = th_make(be, FG_F32, 2, ws, 0), y = th_make(be, FG_F32, 2, ys, 0);
    th_operand yb = th_make(be, FG_F32, 2, y3, 0), b = th_make(be, FG_F32, 1, bs, 0), wh = th_make(be, FG_F16, 2, ws, 0);
    th_operand dx = th_make(be, FG_F32, 2, xs, 0), ys1 = th_make(be, FG_F32, 2, ys, 1), xi = th_make(be, FG_F32, 2, xs, 0);
    th_operand dxw = th_make(be, FG_F32, 2, ys, 0), b4 = th_make(be, FG_F32, 1, (int64_t[]){4}, 0);
    xi.t.dtype = FG_I32;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "act=9", &y, fg_linear_act_forward(ctx, (fg_activation)9, &x.t, &w.t, NULL, &y.t, NULL));
    { /* dropout.p outside [0, 1] or NaN: refused, nothing written (y, the saved operand, the gradients) */
        const double bad[3] = {-0.25, 1.5, NAN};
        th_operand sp = th_make(be, FG_F32, 2, ys, 0);
        for (int i = 0; i < 3; i++)
            for (int saved = 0; saved < 2; saved++) {
                fg_linear_act_options o = {FG_ACT_GELU, saved ? FG_ACT_SAVED_SLOPE : FG_ACT_SAVED_PRE, 0, {bad[i], 1, 2}};
                TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &y, fg_linear_act_forward_ex(ctx, &o, &x.t, &w.t, &b.t, &y.t, &sp.t));
                TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &sp, fg_linear_act_forward_ex(ctx, &o, &x.t, &w.t, &b.t, &y.t, &sp.t));
                TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout.p", &dx,
                              fg_linear_act_backward_ex(ctx, &o, &y.t, &sp.t, &x.t, &w.t, &b.t, &dx.t, NULL, NULL, 0));
            }
        th_drop(&sp);
    }
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y.shape[1]=3", &yb, fg_linear_act_forward(ctx, FG_ACT_RELU, &x.t, &w.t, NULL, &yb.t, NULL));
    TH_EXPECT_BAD(FG_ERR_DTYPE, "w is f16", &y, fg_linear_act_forward(ctx, FG_ACT_RELU, &x.t, &wh.t, NULL, &y.t, NULL));
    TH_EXPECT_BAD(FG_ERR_DTYPE, "x.dtype is i32", &y, fg_linear_act_forward(ctx, FG_ACT_RELU, &xi.t, &w.t, NULL, &y.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "b.shape[0]=4", &y, fg_linear_act_forward(ctx, FG_ACT_RELU, &x.t, &w.t, &b4.t, &y.t, NULL));
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "contiguous", &ys1, fg_linear_act_forward(ctx, FG_ACT_SILU, &x.t, &w.t, &b.t, &ys1.t, NULL));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "w", &y, fg_linear_act_forward(ctx, FG_ACT_SILU, &x.t, NULL, &b.t, &y.t, NULL));
    TH_EXPECT_BAD(FG_ERR_ALIAS, "pre", &y, fg_linear_act_forward(ctx, FG_ACT_SILU, &x.t, &w.t, &b.t, &y.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "dx.shape[1]=5", &dxw,
                  fg_linear_act_backward(ctx, FG_ACT_TANH, &y.t, NULL, &x.t, &w.t, NULL, &dxw.t, NULL, NULL, 0));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "dx is NULL", &y,
                  fg_linear_act_backward_input(ctx, FG_ACT_TANH, &y.t, NULL, &x.t, &w.t, NULL, NULL, 0));
    {
        /* batched weights: the batch of x and of b must be w's; dw must be w's shape */
        int64_t x3[3] = {2, 6, 4}, x3b[3] = {3, 6, 4}, w3[3] = {2, 5, 4}, y3s[3] = {2, 6, 5}, b3[2] = {3, 5};
        th_operand xa = th_make(be, FG_F32, 3, x3, 0), xbad = th_make(be, FG_F32, 3, x3b, 0);
        th_operand wa = th_make(be, FG_F32, 3, w3, 0), ya = th_make(be, FG_F32, 3, y3s, 0);
        th_operand bb = th_make(be, FG_F32, 2, b3, 0), dwa = th_make(be, FG_F32, 2, ws, 0);
        TH_EXPECT_BAD(FG_ERR_SHAPE, "x.shape[0]=3 but w.shape[0]=2", &ya,
                      fg_linear_act_forward(ctx, FG_ACT_RELU, &xbad.t, &wa.t, NULL, &ya.t, NULL));
        TH_EXPECT_BAD(FG_ERR_SHAPE, "b must be [5] or [2, 5]", &ya,
                      fg_linear_act_forward(ctx, FG_ACT_RELU, &xa.t, &wa.t, &bb.t, &ya.t, NULL));
        TH_EXPECT_BAD(FG_ERR_SHAPE, "dw", &dwa,
                      fg_linear_act_backward(ctx, FG_ACT_RELU, &ya.t, NULL, &xa.t, &wa.t, NULL, NULL, &dwa.t, NULL, 0));
        th_drop(&xa), th_drop(&xbad), th_drop(&wa), th_drop(&ya), th_drop(&bb), th_drop(&dwa);
    }
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "pre is NULL", &dx,
                  fg_linear_act_backward_consume(ctx, FG_ACT_TANH, &y.t, NULL, &x.t, &w.t, NULL, &dx.t, NULL, NULL, 0));
    TH_EXPECT_BAD(FG_ERR_ALIAS, "dx", &x,
                  fg_linear_act_backward(ctx, FG_ACT_TANH, &y.t, NULL, &x.t, &w.t, NULL, &x.t, NULL, NULL, 0));
    /* the slope form: the saved operand is required */
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "slope is NULL", &y,
                  fg_linear_act_forward_slope(ctx, FG_ACT_SILU, &x.t, &w.t, NULL, &y.t, NULL));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "slope is NULL", &dx,
                  fg_linear_act_backward_slope(ctx, FG_ACT_SILU, &y.t, NULL, &x.t, &w.t, NULL, &dx.t, NULL, NULL, 0));
    {
        fg_plan_desc d;
        memset(&d, 0, sizeof d);
        fg_linear_act_options o = {FG_ACT_SILU, FG_ACT_SAVED_SLOPE, 0};
        d.op = FG_OP_LINEAR_ACT_BACKWARD, d.options = &o, d.options_size = sizeof o;
        d.operands[0] = y.t, d.operands[2] = x.t, d.operands[3] = w.t, d.operands[5] = dx.t;
        fg_plan *plan = NULL;
        TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "saved is absent", &dx, fg_plan_create(ctx, &d, &plan));
        TH_CHECK(plan == NULL, "a refused plan is NULL");
        d.op = FG_OP_LINEAR_ACT_FORWARD;
        memset(d.operands, 0, sizeof d.operands);
        d.operands[0] = x.t, d.operands[1] = w.t, d.operands[3] = y.t;
        TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "saved is absent", &y, fg_plan_create(ctx, &d, &plan));
    }
    th_drop(&x), th_drop(&w), th_drop(&y), th_drop(&yb), th_drop(&b), th_drop(&wh), th_drop(&dx), th_drop(&ys1);
    xi.t.dtype = FG_F32;
    th_drop(&xi), th_drop(&dxw), th_drop(&b4);
}

int main(void) {
    th_init("linear_act");
    fg_backend bes[2];
    int nb = th_backends(bes);
    {
        fg_context *cpu = th_context(FG_BACKEND_CPU, false);
        finite_differences(cpu);
        fg_context_destroy(cpu);
    }
    for (int bi = 0; bi < nb; bi++) {
        fg_backend be = bes[bi];
        fg_context *ctx = th_context(be, false);
        for (int di = 0; di < 4; di++) {
            fg_dtype dt = th_dtypes[di];
            if (dt == FG_F64 && be != FG_BACKEND_CPU) continue;
            for (int act = 0; act <= FG_ACT_TANH; act++)
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) run_case(ctx, be, dt, act, &shapes[s]);
            special_values(ctx, be, dt);
            determinism(ctx, be, dt);
            dropout(ctx, be, dt);
            if (be == FG_BACKEND_CUDA && (dt == FG_F16 || dt == FG_BF16))
                wide_forward(ctx, be, dt), wide_backward(ctx, be, dt), short_backward(ctx, be, dt);
            for (int act = 0; act <= FG_ACT_TANH; act += 3) /* relu, gelu_tanh, tanh */
                for (int bk = 0; bk < 3; bk++) batched_weights(ctx, be, dt, act == 0 ? FG_ACT_RELU : act, bk);
        }
#ifdef FG_TEST_HAVE_SM90A
        if (be == FG_BACKEND_CUDA) split_weight_gradient(ctx);
#endif
        bad_input(ctx, be);
        fg_context_destroy(ctx);
    }
    return th_finish("linear_act");
}

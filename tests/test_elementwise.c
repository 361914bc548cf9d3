/*
 * test_elementwise.c — the parameterized elementwise family on every backend present
 * and every dtype: each unary op (scale, pow, leaky_relu, elu, clamp, softcap) and
 * binary op (lerp with scalar and tensor weight, axpby), forward and backward, with and
 * without accumulate, contiguous / misaligned / strided / broadcast layouts (broadcast
 * gradients summed), in place, special values (0, NaN, huge |x|), softcap over every bf16
 * value on the CPU, finite differences in f64, determinism of the sums, the plan's precision
 * report, and bad input.
 */
#include "harness.h"

#include <math.h>

/* ------------------------------------------------------------------ float64 oracle */

typedef struct ucase {
    fg_unary kind;
    double s[2];
    const char *name;
} ucase;

static const ucase unary_cases[] = {
    {FG_UNARY_SCALE, {-1.75, 0}, "scale"},   {FG_UNARY_POW, {2.5, 0}, "pow"},
    {FG_UNARY_LEAKY_RELU, {0.1, 0}, "leaky_relu"}, {FG_UNARY_ELU, {1.3, 0}, "elu"},
    {FG_UNARY_CLAMP, {-0.2, 0.6}, "clamp"},  {FG_UNARY_SOFTCAP, {0.7, 0}, "softcap"},
};

static double ref_f(const ucase *u, double x) {
    switch (u->kind) {
    case FG_UNARY_SCALE: return u->s[0] * x;
    case FG_UNARY_POW: return pow(x, u->s[0]);
    case FG_UNARY_LEAKY_RELU: return x > 0 ? x : u->s[0] * x;
    case FG_UNARY_ELU: return x > 0 ? x : u->s[0] * (exp(x) - 1);
    case FG_UNARY_CLAMP: return x < u->s[0] ? u->s[0] : x > u->s[1] ? u->s[1] : x;
    case FG_UNARY_SOFTCAP: return u->s[0] * tanh(x / u->s[0]);
    }
    return NAN;
}

static double ref_df(const ucase *u, double x) {
    switch (u->kind) {
    case FG_UNARY_SCALE: return u->s[0];
    case FG_UNARY_POW: return u->s[0] * pow(x, u->s[0] - 1);
    case FG_UNARY_LEAKY_RELU: return x > 0 ? 1 : u->s[0];
    case FG_UNARY_ELU: return x > 0 ? 1 : u->s[0] * exp(x);
    case FG_UNARY_CLAMP: return x >= u->s[0] && x <= u->s[1] ? 1 : 0;
    case FG_UNARY_SOFTCAP: return 1 - tanh(x / u->s[0]) * tanh(x / u->s[0]);
    }
    return NAN;
}

/* pow with a fractional exponent needs positive inputs */
/* Random points for an op; pow's base positive, and points within 1e-3 of a kink (leaky_relu's
   and elu's 0, clamp's bounds) moved 2e-3 off it, so that a finite difference never straddles
   one (a clamp point 5e-6 from its bound failed the check once by seed) */
static void prepare_x(const ucase *u, th_operand *x) {
    th_randomize(x);
    const double kinks[2] = {u->kind == FG_UNARY_CLAMP ? u->s[0] : 0.0, u->kind == FG_UNARY_CLAMP ? u->s[1] : 0.0};
    const bool kinked = u->kind == FG_UNARY_LEAKY_RELU || u->kind == FG_UNARY_ELU || u->kind == FG_UNARY_CLAMP;
    for (int64_t i = 0; i < x->n; i++) {
        if (u->kind == FG_UNARY_POW) x->v[i] = 0.1 + fabs(x->v[i]);
        for (int j = 0; j < 2 && kinked; j++)
            if (fabs(x->v[i] - kinks[j]) < 1e-3) x->v[i] = kinks[j] + (x->v[i] < kinks[j] ? -2e-3 : 2e-3);
    }
    th_round(x->buf.dtype, x->v, x->n);
    th_put(&x->buf, &x->t, x->v);
}

/* Logical index map for broadcasting: element i of `full` → element of a smaller shape. */
static int64_t bcast_index(int64_t i, const fg_tensor *full, const fg_tensor *t) {
    int64_t idx = 0, mul = 1;
    for (int d = full->rank - 1, e = t->rank - 1; d >= 0; d--, e--) {
        int64_t c = i % full->shape[d];
        i /= full->shape[d];
        if (e >= 0) {
            idx += (t->shape[e] == 1 ? 0 : c) * mul;
            mul *= t->shape[e];
        }
    }
    return idx;
}

/* ------------------------------------------------------------------ unary */

typedef struct shape_case {
    int rx, ry;
    int64_t xs[3], ys[3];
    int layout;
} shape_case;

static const shape_case unary_shapes[] = {
    {1, 1, {1}, {1}, 0},          {1, 1, {3}, {3}, 0},           {2, 2, {17, 127}, {17, 127}, 0},
    {1, 1, {1031}, {1031}, 0},    {1, 1, {4099}, {4099}, 3},     {2, 2, {33, 40}, {33, 40}, 1},
    {2, 2, {19, 23}, {19, 23}, 2}, {2, 2, {1, 17}, {5, 17}, 0},  {3, 3, {4, 1, 9}, {4, 6, 9}, 0},
    {1, 2, {7}, {300, 7}, 0},
};

static void unary_case(fg_context *ctx, fg_backend be, fg_dtype dt, const ucase *u, const shape_case *c) {
    char label[160];
    snprintf(label, sizeof label, "[%s %s %s x%lld.. y%lld.. layout %d]", th_backend_name(be), fg_dtype_name(dt), u->name,
             (long long)c->xs[0], (long long)c->ys[0], c->layout);
    const double tol = th_tol(dt, false);
    th_operand x = th_make(be, dt, c->rx, c->xs, c->layout), y = th_make(be, dt, c->ry, c->ys, c->layout);
    th_operand dy = th_make(be, dt, c->ry, c->ys, c->layout), dx = th_make(be, dt, c->rx, c->xs, c->layout);
    prepare_x(u, &x);
    th_randomize(&dy);
    double *ref = calloc((size_t)(y.n + x.n + 1), sizeof(double));
    for (int64_t i = 0; i < y.n; i++) ref[i] = ref_f(u, x.v[bcast_index(i, &y.t, &x.t)]);
    th_poison(&y.buf);
    TH_OK(fg_unary_forward(ctx, u->kind, u->s, &x.t, &y.t));
    th_verify("unary_forward", &y, ref, tol, label);
    for (int acc = 0; acc < 2; acc++) {
        memset(ref, 0, sizeof(double) * (size_t)(x.n + 1));
        for (int64_t i = 0; i < dy.n; i++) {
            int64_t j = bcast_index(i, &dy.t, &x.t);
            ref[j] += dy.v[i] * ref_df(u, x.v[j]);
        }
        th_prepare_out(&dx, ref, acc);
        TH_OK(fg_unary_backward(ctx, u->kind, u->s, &dy.t, &x.t, &dx.t, acc));
        th_verify(acc ? "unary_backward+acc" : "unary_backward", &dx, ref, tol, label);
    }
    free(ref);
    th_drop(&x); th_drop(&y); th_drop(&dy); th_drop(&dx);
}

/* In place (y is x), 0 and NaN and huge inputs. */
static void unary_special(fg_context *ctx, fg_backend be) {
    const double vals[8] = {0.0, -0.0, NAN, 1e30, -1e30, 3.0, -3.0, 1e-30};
    int64_t n = 8;
    for (size_t k = 0; k < sizeof unary_cases / sizeof unary_cases[0]; k++) {
        const ucase *u = &unary_cases[k];
        th_operand x = th_make(be, FG_F32, 1, &n, 0), dy = th_make(be, FG_F32, 1, &n, 0), dx = th_make(be, FG_F32, 1, &n, 0);
        memcpy(x.v, vals, sizeof vals);
        for (int i = 0; i < 8; i++) dy.v[i] = 1.0;
        th_put(&x.buf, &x.t, x.v);
        th_put(&dy.buf, &dy.t, dy.v);
        TH_OK(fg_unary_backward(ctx, u->kind, u->s, &dy.t, &x.t, &dx.t, 0));
        TH_OK(fg_unary_forward(ctx, u->kind, u->s, &x.t, &x.t)); /* in place */
        double y[8], g[8];
        th_get(&x.buf, &x.t, y);
        th_get(&dx.buf, &dx.t, g);
        TH_CHECK(isnan(y[2]), "[%s] %s(NaN) = %g, want NaN", th_backend_name(be), u->name, y[2]);
        if (u->kind == FG_UNARY_SCALE) /* dx = s·dy does not read x */
            TH_CHECK(g[2] == (double)(float)u->s[0], "[%s] scale'(NaN)·1 = %g, want %g", th_backend_name(be), g[2], u->s[0]);
        else if (u->kind != FG_UNARY_CLAMP)
            TH_CHECK(isnan(g[2]), "[%s] %s'(NaN) = %g", th_backend_name(be), u->name, g[2]);
        for (int i = 0; i < 8; i++) {
            if (i == 2) continue;
            double want = (float)ref_f(u, (float)vals[i]), dwant = (float)ref_df(u, (float)vals[i]);
            bool huge = fabs(vals[i]) > 1e29;
            if (u->kind == FG_UNARY_POW && vals[i] <= 0) continue; /* fractional power of a negative */
            if (u->kind == FG_UNARY_POW && huge) continue;          /* overflows f32, as it should */
            if (u->kind == FG_UNARY_SCALE && huge) continue;
            TH_CHECK(fabs(y[i] - want) <= 1e-6 * (1 + fabs(want)), "[%s] %s(%g) = %.9g, want %.9g", th_backend_name(be),
                     u->name, vals[i], y[i], want);
            TH_CHECK(fabs(g[i] - dwant) <= 1e-6 * (1 + fabs(dwant)) && !isnan(g[i]), "[%s] %s'(%g) = %.9g, want %.9g",
                     th_backend_name(be), u->name, vals[i], g[i], dwant);
        }
        th_drop(&x); th_drop(&dy); th_drop(&dx);
    }
}

/* softcap's bf16 outputs at one bf16 value x, against f64: NaN for NaN, ±c (rounded to bf16) and
   slope 0 for ±inf, and otherwise within half a bf16 unit (the rounding) plus 2^-12 of the
   exact value relative (the bound vec.h's bf16 forms are fitted to; the f32 forms are closer).
   Returns whether they pass. */
static bool softcap_bf16_ok(double c, double x, double dy, uint16_t yb, uint16_t dxb) {
    const double y = fg_bf16_to_f32(yb), dx = fg_bf16_to_f32(dxb);
    if (isnan(x)) return isnan(y) && isnan(dx);
    if (isinf(x)) return y == copysign(fg_bf16_to_f32(fg_f32_to_bf16((float)c)), x) && dx == 0;
    const double t = tanh(x / c), e = exp(-2 * fabs(x / c));
    const double ry = c * t, rdx = dy * 4 * e / ((1 + e) * (1 + e)); /* 1 − tanh², no cancellation */
    return fabs(y - ry) <= 0.5 * th_unit(FG_BF16, ry) + 0x1p-12 * fabs(ry) &&
           fabs(dx - rdx) <= 0.5 * th_unit(FG_BF16, rdx) + 0x1p-12 * fabs(rdx);
}

/* softcap over every bf16 value, on the CPU (whose AVX-512 bf16 rows run vec.h's bf16 forms, 32
   elements at a time, where the CPU has them): contiguous and one element off a line, forward and
   backward (dy random), each element checked by softcap_bf16_ok as well as by th_verify's bounds;
   c = 2^-30 below the bf16 forms' range (the f32 forms on the same rows). Then the same values
   repeated over 2^24 + 45 elements, which touch more than 64 MiB (the rows store past the caches
   there), must give the small call's bits. */
static void softcap_bf16_sweep(fg_context *ctx, fg_backend be) {
    if (be != FG_BACKEND_CPU) return;
    const int64_t n = 65536, big = ((int64_t)1 << 24) + 45;
    const double cs[3] = {0.7, 3.0, 0x1p-30};
    uint16_t *xs = malloc(n * 2), *dys = malloc(n * 2), *ys = malloc((n + 1) * 2), *dxs = malloc((n + 1) * 2);
    double *dyv = malloc(n * sizeof(double)), *ref = malloc(n * sizeof(double)), *got = malloc(n * sizeof(double));
    th_fill(dyv, n);
    for (int64_t i = 0; i < n; i++) {
        xs[i] = (uint16_t)i;
        dys[i] = fg_f32_to_bf16((float)dyv[i]);
        dyv[i] = fg_bf16_to_f32(dys[i]);
    }
    for (int ci = 0; ci < 3; ci++) {
        const double c = cs[ci], s[2] = {c, 0};
        for (int off = 0; off < 2; off++) {
            th_buf bx = th_alloc(be, FG_BF16, n + 1), bdy = th_alloc(be, FG_BF16, n + 1);
            th_buf by = th_alloc(be, FG_BF16, n + 1), bdx = th_alloc(be, FG_BF16, n + 1);
            fg_tensor tx = th_tensor(&bx, off, 1, &n, NULL), tdy = th_tensor(&bdy, off, 1, &n, NULL);
            fg_tensor ty = th_tensor(&by, off, 1, &n, NULL), tdx = th_tensor(&bdx, off, 1, &n, NULL);
            memcpy((uint16_t *)bx.ptr + off, xs, n * 2);
            memcpy((uint16_t *)bdy.ptr + off, dys, n * 2);
            th_poison(&by);
            th_poison(&bdx);
            TH_OK(fg_unary_forward(ctx, FG_UNARY_SOFTCAP, s, &tx, &ty));
            TH_OK(fg_unary_backward(ctx, FG_UNARY_SOFTCAP, s, &tdy, &tx, &tdx, 0));
            memcpy(ys, (uint16_t *)by.ptr + off, n * 2);
            memcpy(dxs, (uint16_t *)bdx.ptr + off, n * 2);
            int64_t bad = -1, count = 0;
            for (int64_t i = 0; i < n; i++)
                if (!softcap_bf16_ok(c, fg_bf16_to_f32(xs[i]), dyv[i], ys[i], dxs[i])) {
                    if (bad < 0) bad = i;
                    count++;
                }
            TH_CHECK(bad < 0, "[cpu bf16 softcap c=%g offset %d] %lld of the bf16 values off, first x=%g: y %.6g dx %.6g (dy %g)",
                     c, off, (long long)count, bad < 0 ? 0.0 : fg_bf16_to_f32(xs[bad]), bad < 0 ? 0.0 : fg_bf16_to_f32(ys[bad]),
                     bad < 0 ? 0.0 : fg_bf16_to_f32(dxs[bad]), bad < 0 ? 0.0 : dyv[bad]);
            /* th_verify's norm and element bounds over the finite values */
            th_operand fy = th_make(be, FG_BF16, 1, &n, 0);
            int64_t m = 0;
            for (int64_t i = 0; i < n; i++) {
                const double x = fg_bf16_to_f32(xs[i]);
                if (!isfinite(x)) continue;
                fy.v[m] = fg_bf16_to_f32(ys[i]);
                ref[m] = c * tanh(x / c);
                got[m++] = fg_bf16_to_f32(dxs[i]);
            }
            fy.n = fy.t.shape[0] = m;
            th_put(&fy.buf, &fy.t, fy.v);
            char label[96];
            snprintf(label, sizeof label, "[cpu bf16 softcap sweep c=%g offset %d]", c, off);
            th_verify("unary_forward", &fy, ref, th_tol(FG_BF16, false), label);
            m = 0;
            for (int64_t i = 0; i < n; i++) {
                const double x = fg_bf16_to_f32(xs[i]);
                if (isfinite(x)) ref[m++] = dyv[i] * (1 - tanh(x / c) * tanh(x / c));
            }
            th_put(&fy.buf, &fy.t, got);
            th_verify("unary_backward", &fy, ref, th_tol(FG_BF16, false), label);
            th_drop(&fy);
            th_free(&bx); th_free(&bdy); th_free(&by); th_free(&bdx);
        }
        /* past 64 MiB, one element off a line: the small call's bits (ys, dxs hold offset 1's) */
        th_buf bx = th_alloc(be, FG_BF16, big + 1), bdy = th_alloc(be, FG_BF16, big + 1), bo = th_alloc(be, FG_BF16, big + 1);
        uint16_t *px = (uint16_t *)bx.ptr + 1, *pdy = (uint16_t *)bdy.ptr + 1, *po = (uint16_t *)bo.ptr + 1;
        for (int64_t i = 0; i < big; i++) px[i] = xs[i % n], pdy[i] = dys[i % n];
        fg_tensor tx = th_tensor(&bx, 1, 1, &big, NULL), tdy = th_tensor(&bdy, 1, 1, &big, NULL), to = th_tensor(&bo, 1, 1, &big, NULL);
        for (int bwd = 0; bwd < 2; bwd++) {
            th_poison(&bo);
            if (bwd) TH_OK(fg_unary_backward(ctx, FG_UNARY_SOFTCAP, s, &tdy, &tx, &to, 0));
            else TH_OK(fg_unary_forward(ctx, FG_UNARY_SOFTCAP, s, &tx, &to));
            const uint16_t *want = bwd ? dxs : ys;
            int64_t bad = -1;
            for (int64_t i = 0; i < big && bad < 0; i++)
                if (po[i] != want[i % n]) bad = i;
            TH_CHECK(bad < 0, "[cpu bf16 softcap c=%g, %lld elements] %s element %lld: %#x, the small call gave %#x", c,
                     (long long)big, bwd ? "dx" : "y", (long long)bad, bad < 0 ? 0 : po[bad], bad < 0 ? 0 : want[bad % n]);
        }
        th_free(&bx); th_free(&bdy); th_free(&bo);
    }
    free(xs); free(dys); free(ys); free(dxs); free(dyv); free(ref); free(got);
}

/* ------------------------------------------------------------------ binary */

typedef struct bcase {
    int rank;
    int64_t as[3], bs[3], ws[3], ys[3]; /* ws[0] == 0: scalar weight */
    int ra, rb, rw;
    int layout;
} bcase;

static const bcase binary_shapes[] = {
    {1, {1}, {1}, {0}, {1}, 1, 1, 0, 0},
    {1, {4099}, {4099}, {0}, {4099}, 1, 1, 0, 0},
    {1, {1031}, {1031}, {1031}, {1031}, 1, 1, 1, 0},
    {2, {17, 127}, {17, 127}, {17, 127}, {17, 127}, 2, 2, 2, 3},
    {2, {33, 40}, {33, 40}, {0}, {33, 40}, 2, 2, 0, 1},
    {2, {19, 23}, {19, 23}, {19, 23}, {19, 23}, 2, 2, 2, 2},
    {3, {5, 1, 7}, {1, 4, 7}, {7}, {5, 4, 7}, 3, 3, 1, 0},
    {3, {5, 4, 7}, {5, 4, 7}, {1}, {5, 4, 7}, 3, 3, 1, 0},
    {2, {300, 1}, {1, 9}, {0}, {300, 9}, 2, 2, 0, 0},
};

typedef struct bop {
    fg_binary kind;
    double s[2];
    bool tensor_w;
} bop;

static double ref_binary(const bop *o, double a, double b, double w) {
    if (o->kind == FG_BINARY_AXPBY) return o->s[0] * a + o->s[1] * b;
    return a + w * (b - a);
}

static void binary_case(fg_context *ctx, fg_backend be, fg_dtype dt, const bop *o, const bcase *c) {
    if (o->tensor_w && c->ws[0] == 0) return;
    if (!o->tensor_w && c->ws[0] != 0 && o->kind == FG_BINARY_LERP) return;
    char label[200];
    snprintf(label, sizeof label, "[%s %s %s%s w=%g y%lld.. layout %d]", th_backend_name(be), fg_dtype_name(dt),
             o->kind == FG_BINARY_LERP ? "lerp" : "axpby", o->tensor_w ? "(tensor w)" : "", o->s[0], (long long)c->ys[0],
             c->layout);
    const double tol = th_tol(dt, false);
    th_operand a = th_make(be, dt, c->ra, c->as, c->layout), b = th_make(be, dt, c->rb, c->bs, c->layout);
    th_operand y = th_make(be, dt, c->rank, c->ys, c->layout), dy = th_make(be, dt, c->rank, c->ys, c->layout);
    th_operand da = th_make(be, dt, c->ra, c->as, c->layout), db = th_make(be, dt, c->rb, c->bs, c->layout);
    const int64_t one = 1;
    th_operand w = o->tensor_w ? th_make(be, dt, c->rw, c->ws, c->layout) : th_make(be, dt, 1, &one, 0);
    th_operand dw = o->tensor_w ? th_make(be, dt, c->rw, c->ws, c->layout) : th_make(be, dt, 1, &one, 0);
    th_randomize(&a);
    th_randomize(&b);
    /* b − a (the lerp weight's gradient) must not cancel in its sums: shift b by 1 */
    for (int64_t k = 0; k < b.n; k++) b.v[k] += 1.0;
    th_round(dt, b.v, b.n);
    th_put(&b.buf, &b.t, b.v);
    th_randomize(&w);
    th_randomize(&dy);
    const fg_tensor *wt = o->tensor_w ? &w.t : NULL;
    double *ref = calloc((size_t)(y.n + 1), sizeof(double));
    for (int64_t i = 0; i < y.n; i++) {
        double wv = o->tensor_w ? w.v[bcast_index(i, &y.t, &w.t)] : o->s[0];
        ref[i] = ref_binary(o, a.v[bcast_index(i, &y.t, &a.t)], b.v[bcast_index(i, &y.t, &b.t)], wv);
    }
    th_poison(&y.buf);
    if (o->kind == FG_BINARY_LERP) TH_OK(fg_lerp_forward(ctx, &a.t, &b.t, wt, o->s[0], &y.t));
    else TH_OK(fg_axpby_forward(ctx, &a.t, &b.t, o->s[0], o->s[1], &y.t));
    th_verify("binary_forward", &y, ref, tol, label);

    /* every subset of gradients, with and without accumulate */
    for (int mask = 1; mask < (o->tensor_w ? 8 : 4); mask++) {
        int acc = mask & 1 ? 0 : 1;
        th_operand *g[3] = {&da, &db, &dw};
        double *r[3];
        for (int k = 0; k < 3; k++) {
            r[k] = calloc((size_t)(g[k]->n + 1), sizeof(double));
            if (!(mask >> k & 1)) continue;
            for (int64_t i = 0; i < dy.n; i++) {
                double av = a.v[bcast_index(i, &dy.t, &a.t)], bv = b.v[bcast_index(i, &dy.t, &b.t)];
                double wv = o->tensor_w ? w.v[bcast_index(i, &dy.t, &w.t)] : o->s[0];
                double d = k == 0 ? (o->kind == FG_BINARY_AXPBY ? o->s[0] : 1 - wv)
                                  : k == 1 ? (o->kind == FG_BINARY_AXPBY ? o->s[1] : wv) : bv - av;
                r[k][bcast_index(i, &dy.t, &g[k]->t)] += d * dy.v[i];
            }
            th_prepare_out(g[k], r[k], acc);
        }
        const fg_tensor *pa = mask & 1 ? &da.t : NULL, *pb = mask & 2 ? &db.t : NULL, *pw = mask & 4 ? &dw.t : NULL;
        if (o->kind == FG_BINARY_LERP) TH_OK(fg_lerp_backward(ctx, &dy.t, &a.t, &b.t, wt, o->s[0], pa, pb, pw, acc));
        else TH_OK(fg_axpby_backward(ctx, &dy.t, o->s[0], o->s[1], pa, pb, acc));
        static const char *names[3] = {"da", "db", "dw"};
        for (int k = 0; k < 3; k++) {
            char what[64];
            snprintf(what, sizeof what, "binary_backward %s (mask %d%s)", names[k], mask, acc ? ", acc" : "");
            if (mask >> k & 1) th_verify(what, g[k], r[k], tol, label);
            free(r[k]);
        }
    }
    free(ref);
    th_operand *all[] = {&a, &b, &y, &dy, &da, &db, &w, &dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

/* ------------------------------------------------------------------ f64 finite differences */

typedef struct fd_unary_arg { const ucase *u; th_operand *x, *y; } fd_unary_arg;

static fg_status fd_unary(fg_context *ctx, void *p) {
    fd_unary_arg *a = p;
    return fg_unary_forward(ctx, a->u->kind, a->u->s, &a->x->t, &a->y->t);
}

typedef struct fd_lerp_arg { th_operand *a, *b, *w, *y; } fd_lerp_arg;

static fg_status fd_lerp(fg_context *ctx, void *p) {
    fd_lerp_arg *a = p;
    return fg_lerp_forward(ctx, &a->a->t, &a->b->t, &a->w->t, 0, &a->y->t);
}

static void finite_differences(fg_context *ctx, fg_backend be) {
    const int64_t n = 9;
    for (size_t k = 0; k < sizeof unary_cases / sizeof unary_cases[0]; k++) {
        const ucase *u = &unary_cases[k];
        th_operand x = th_make(be, FG_F64, 1, &n, 0), y = th_make(be, FG_F64, 1, &n, 0);
        th_operand r = th_make(be, FG_F64, 1, &n, 0), dx = th_make(be, FG_F64, 1, &n, 0);
        prepare_x(u, &x);
        th_randomize(&r);
        TH_OK(fg_unary_backward(ctx, u->kind, u->s, &r.t, &x.t, &dx.t, 0));
        th_operand *params[1] = {&x}, *grads[1] = {&dx};
        static const char *const names[1] = {"dx"};
        fd_unary_arg arg = {u, &x, &y};
        /* (prepare_x keeps the points away from the kinks by more than h) */
        th_fd_check(ctx, u->name, fd_unary, &arg, &y, &r, params, grads, names, 1, 0, u->kind == FG_UNARY_SCALE);
        th_drop(&x); th_drop(&y); th_drop(&r); th_drop(&dx);
    }
    const int64_t as[2] = {3, 4}, ws[1] = {4};
    th_operand a = th_make(be, FG_F64, 2, as, 0), b = th_make(be, FG_F64, 2, as, 0), w = th_make(be, FG_F64, 1, ws, 0);
    th_operand y = th_make(be, FG_F64, 2, as, 0), r = th_make(be, FG_F64, 2, as, 0);
    th_operand da = th_make(be, FG_F64, 2, as, 0), db = th_make(be, FG_F64, 2, as, 0), dw = th_make(be, FG_F64, 1, ws, 0);
    th_randomize(&a); th_randomize(&b); th_randomize(&w); th_randomize(&r);
    TH_OK(fg_lerp_backward(ctx, &r.t, &a.t, &b.t, &w.t, 0, &da.t, &db.t, &dw.t, 0));
    th_operand *params[3] = {&a, &b, &w}, *grads[3] = {&da, &db, &dw};
    static const char *const names[3] = {"da", "db", "dw (broadcast, summed)"};
    fd_lerp_arg arg = {&a, &b, &w, &y};
    th_fd_check(ctx, "lerp", fd_lerp, &arg, &y, &r, params, grads, names, 3, 0, false);
    th_operand *all[] = {&a, &b, &w, &y, &r, &da, &db, &dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) th_drop(all[i]);
}

/* The sums over broadcast dims give the same bits every run. */
static void determinism(fg_context *ctx, fg_backend be) {
    const int64_t ys[2] = {4096, 257}, ws[1] = {257};
    th_operand dy = th_make(be, FG_F32, 2, ys, 0), a = th_make(be, FG_F32, 2, ys, 0), b = th_make(be, FG_F32, 2, ys, 0);
    th_operand w = th_make(be, FG_F32, 1, ws, 0), dw = th_make(be, FG_F32, 1, ws, 0);
    th_randomize(&dy); th_randomize(&a); th_randomize(&b); th_randomize(&w);
    TH_OK(fg_lerp_backward(ctx, &dy.t, &a.t, &b.t, &w.t, 0, NULL, NULL, &dw.t, 0));
    void *first = th_snapshot(&dw.buf);
    for (int rep = 0; rep < 3; rep++) {
        TH_OK(fg_lerp_backward(ctx, &dy.t, &a.t, &b.t, &w.t, 0, NULL, NULL, &dw.t, 0));
        TH_CHECK(th_unchanged(&dw.buf, first), "[%s] a broadcast gradient changed between runs", th_backend_name(be));
    }
    free(first);
    th_drop(&dy); th_drop(&a); th_drop(&b); th_drop(&w); th_drop(&dw);
}

/* ------------------------------------------------------------------ bad input and plans */

static void bad_input(fg_context *ctx, fg_backend be) {
    const int64_t s2[2] = {6, 8}, s3[2] = {6, 7}, s1[1] = {8};
    th_operand x = th_make(be, FG_F32, 2, s2, 0), y = th_make(be, FG_F32, 2, s2, 0), z = th_make(be, FG_F32, 2, s3, 0);
    th_operand xh = th_make(be, FG_F16, 2, s2, 0), v = th_make(be, FG_F32, 1, s1, 0);
    th_randomize(&x);
    th_randomize(&v);
    th_poison(&y.buf);
    th_poison(&z.buf);
    const double clampbad[2] = {1, -1}, nan1[2] = {NAN, 0}, zero[2] = {0, 0}, ok[2] = {0.5, 0};
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "lo=1 is greater than hi=-1", &y, fg_unary_forward(ctx, FG_UNARY_CLAMP, clampbad, &x.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "must be finite", &y, fg_unary_forward(ctx, FG_UNARY_POW, nan1, &x.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "clamp bounds", &y, fg_unary_forward(ctx, FG_UNARY_CLAMP, nan1, &x.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "softcap c=0", &y, fg_unary_forward(ctx, FG_UNARY_SOFTCAP, zero, &x.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "kind=9", &y, fg_unary_forward(ctx, (fg_unary)9, ok, &x.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "scalars", &y, fg_unary_forward(ctx, FG_UNARY_SCALE, NULL, &x.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "does not broadcast", &z, fg_unary_forward(ctx, FG_UNARY_SCALE, ok, &x.t, &z.t));
    TH_EXPECT_BAD(FG_ERR_DTYPE, "x.dtype=f16", &y, fg_unary_forward(ctx, FG_UNARY_SCALE, ok, &xh.t, &y.t));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "dx.shape", &z, fg_unary_backward(ctx, FG_UNARY_ELU, ok, &x.t, &x.t, &z.t, 0));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "lerp parameter", &y, fg_lerp_forward(ctx, &x.t, &x.t, NULL, NAN, &y.t));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dw requested but w is a scalar", &z,
                  fg_lerp_backward(ctx, &x.t, &x.t, &x.t, NULL, 0.5, NULL, NULL, &z.t, 0));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "no gradient requested", &y,
                  fg_lerp_backward(ctx, &x.t, NULL, NULL, NULL, 0.5, NULL, NULL, NULL, 0));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "da.shape", &z, fg_lerp_backward(ctx, &x.t, &x.t, &x.t, &x.t, 0, &z.t, NULL, NULL, 0));
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "must be finite", &y, fg_axpby_forward(ctx, &x.t, &x.t, INFINITY, 1, &y.t));
    /* an output overlapping an input other than exactly */
    fg_tensor shifted = x.t;
    shifted.data = (char *)x.t.data + 4 * sizeof(float);
    shifted.shape[0] = 5;
    fg_tensor xs = x.t;
    xs.shape[0] = 5;
    TH_EXPECT_BAD(FG_ERR_ALIAS, "y overlaps x", &x, fg_unary_forward(ctx, FG_UNARY_SCALE, ok, &xs, &shifted));
    /* in place is refused when something broadcasts: y is exactly b, a is broadcast */
    TH_EXPECT_BAD(FG_ERR_ALIAS, "y overlaps b", &x, fg_lerp_forward(ctx, &v.t, &x.t, NULL, 0.5, &x.t));
    /* an output with a zero stride overlaps itself */
    fg_tensor zs = y.t;
    zs.stride[0] = 0;
    zs.stride[1] = 1;
    TH_EXPECT_BAD(FG_ERR_ALIAS, "zero stride", &y, fg_unary_forward(ctx, FG_UNARY_SCALE, ok, &x.t, &zs));
    th_drop(&x); th_drop(&y); th_drop(&z); th_drop(&xh); th_drop(&v);
}

static void plan_report(fg_context *ctx, fg_backend be) {
    for (int di = 0; di < 4; di++) {
        fg_dtype dt = th_dtypes[di];
        fg_plan_desc d;
        memset(&d, 0, sizeof d);
        d.op = FG_OP_BINARY_BACKWARD;
        fg_elementwise_options o = {FG_BINARY_LERP, {0.25, 0, 0, 0}};
        d.options = &o;
        d.options_size = sizeof o;
        int64_t s[1] = {1000};
        d.operands[0] = fg_tensor_make(NULL, dt, 1, s);
        d.operands[4] = fg_tensor_make(NULL, dt, 1, s);
        d.operands[5] = fg_tensor_make(NULL, dt, 1, s);
        fg_plan *p = NULL;
        TH_OK(fg_plan_create(ctx, &d, &p));
        if (!p) continue;
        fg_plan_info info;
        TH_OK(fg_plan_info_get(p, &info));
        TH_CHECK(strcmp(info.op_name, "binary_backward") == 0 && info.precision.deterministic, "plan %s", info.op_name);
        TH_CHECK(dt == FG_F64 ? info.precision.math == FG_F64 && info.precision.accumulator == FG_F64
                              : info.precision.math == FG_F32,
                 "[%s] %s plan reports math %d", th_backend_name(be), fg_dtype_name(dt), info.precision.math);
        TH_CHECK(be == FG_BACKEND_CPU ? info.arch == 0 : info.arch >= 80, "arch %d", info.arch);
        fg_plan_destroy(p);
    }
}

#ifdef FG_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

static double bf16_at(const th_buf *b, int64_t i) {
    uint16_t h = 0;
    cudaMemcpy(&h, (uint16_t *)b->ptr + i, 2, cudaMemcpyDeviceToHost);
    return fg_bf16_to_f32(h);
}

/* bf16 tensors of 2^31 + 8e4 elements: every index computation must be 64-bit. The
 * data is index dependent (outer products of exact small values, so every product and
 * lerp is exact in bf16) and checked around 2^31 and at the very end. */
static void large(fg_context *ctx) {
    const int64_t n1 = 65537, n2 = 32769, n = n1 * n2, zs[2] = {n1, n2};
    printf("large: n=%lld elements (> 2^31)\n", (long long)n);
    th_operand u = th_make(FG_BACKEND_CUDA, FG_BF16, 1, &n1, 0), v = th_make(FG_BACKEND_CUDA, FG_BF16, 1, &n2, 0);
    static const double pu[4] = {1.0, -0.5, 2.0, -1.0};
    for (int64_t i = 0; i < n1; i++) u.v[i] = pu[th_rand_u64() % 4];
    for (int64_t j = 0; j < n2; j++) v.v[j] = (double)((int)(th_rand_u64() % 9) - 4) / 4.0;
    th_put(&u.buf, &u.t, u.v);
    th_put(&v.buf, &v.t, v.v);
    th_buf a = th_alloc(FG_BACKEND_CUDA, FG_BF16, n), y = th_alloc(FG_BACKEND_CUDA, FG_BF16, n);
    th_buf da = th_alloc(FG_BACKEND_CUDA, FG_BF16, n), db = th_alloc(FG_BACKEND_CUDA, FG_BF16, n);
    fg_tensor a2 = th_tensor(&a, 0, 2, zs, NULL), a1 = th_tensor(&a, 0, 1, &n, NULL), y1 = th_tensor(&y, 0, 1, &n, NULL);
    fg_tensor da1 = th_tensor(&da, 0, 1, &n, NULL), db1 = th_tensor(&db, 0, 1, &n, NULL);
    TH_OK(fg_outer_forward(ctx, &u.t, &v.t, &a2));               /* a[i·n2 + j] = u_i·v_j */
    TH_OK(fg_unary_forward(ctx, FG_UNARY_SCALE, (const double[]){-2.0}, &a1, &y1)); /* b := −2a, in y */
    TH_OK(fg_lerp_forward(ctx, &a1, &y1, NULL, 0.25, &da1));      /* a + 0.25(b − a) = 0.25a */
    TH_OK(fg_lerp_backward(ctx, &a1, NULL, NULL, NULL, 0.25, &db1, &y1, NULL, 0)); /* 0.75a, 0.25a */
    TH_OK(fg_context_check(ctx));
    const int64_t probes[6] = {0, 12345, ((int64_t)1 << 31) - 1, (int64_t)1 << 31, n - 7, n - 1};
    for (int k = 0; k < 6; k++) {
        int64_t idx = probes[k], i = idx / n2, j = idx % n2;
        double av = u.v[i] * v.v[j];
        TH_CHECK(bf16_at(&a, idx) == av, "large outer a[%lld] = %g, want %g", (long long)idx, bf16_at(&a, idx), av);
        TH_CHECK(bf16_at(&da, idx) == 0.25 * av, "large lerp y[%lld] = %g, want %g", (long long)idx, bf16_at(&da, idx),
                 0.25 * av);
        TH_CHECK(bf16_at(&db, idx) == 0.75 * av && bf16_at(&y, idx) == 0.25 * av, "large lerp grads at %lld: %g %g",
                 (long long)idx, bf16_at(&db, idx), bf16_at(&y, idx));
    }
    th_free(&a); th_free(&y); th_free(&da); th_free(&db);
    th_drop(&u); th_drop(&v);
}
#endif

int main(void) {
    th_init("test_elementwise");
    fg_backend bes[2];
    int nb = th_backends(bes);
    static const bop binops[] = {{FG_BINARY_LERP, {0.3, 0}, false}, {FG_BINARY_LERP, {0.8, 0}, false},
                                 {FG_BINARY_LERP, {0, 0}, true},    {FG_BINARY_AXPBY, {0.7, -1.2}, false}};
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        for (int di = 0; di < 4; di++) {
            for (size_t u = 0; u < sizeof unary_cases / sizeof unary_cases[0]; u++)
                for (size_t c = 0; c < sizeof unary_shapes / sizeof unary_shapes[0]; c++)
                    unary_case(ctx, bes[bi], th_dtypes[di], &unary_cases[u], &unary_shapes[c]);
            for (size_t o = 0; o < sizeof binops / sizeof binops[0]; o++)
                for (size_t c = 0; c < sizeof binary_shapes / sizeof binary_shapes[0]; c++)
                    binary_case(ctx, bes[bi], th_dtypes[di], &binops[o], &binary_shapes[c]);
        }
        unary_special(ctx, bes[bi]);
        softcap_bf16_sweep(ctx, bes[bi]);
        finite_differences(ctx, bes[bi]);
        determinism(ctx, bes[bi]);
        bad_input(ctx, bes[bi]);
        plan_report(ctx, bes[bi]);
#ifdef FG_TEST_HAVE_CUDA
        if (bes[bi] == FG_BACKEND_CUDA && th_large("the > 2^31-element cases (a GPU with 20 GB free)")) large(ctx);
#endif
        TH_OK(fg_context_check(ctx));
        fg_context_destroy(ctx);
    }
    return th_finish("test_elementwise");
}

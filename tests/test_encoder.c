/*
 * test_encoder.c — the transformer encoder layer (fg_encoder_layer_*) on every backend present,
 * against a float64 reference of the whole layer written here in plain loops (LayerNorm,
 * RMSNorm, BatchNorm, attention with causal / key-padding masks, scale and residual scores,
 * the four activations, the three dropout sites and the probabilities' dropout with masks from
 * src/core/rng.h's definition), forward and backward: every norm kind, packed and separate
 * q / k / v, biases and norm affines absent, dropout (same seed → same bits, the backward
 * regenerating the masks), evaluation with BatchNorm's running statistics (with and without a
 * cache), SAVE_LESS and SAVE_MIN giving SAVE_ALL's forward bits (SAVE_MIN its gradients' too),
 * layer widths that reach CUDA's short-K FFN kernels (d and d_ff multiples of 8, 16-bit),
 * accumulate, finite differences of the f64 layer, empty batches, and bad descriptors and
 * operands that are refused with nothing written.
 *
 * The reference rounds each value the layer stores between its parts (projections, attention
 * output, residual streams, norm outputs, FFN hidden, the backward's gradients between parts)
 * to the dtype, so the dtype tolerances of DESIGN.md measure the parts' arithmetic rather than
 * the rounding of a dozen intermediates in series.
 */
#include "harness.h"

#include "../src/core/rng.h"

#include <math.h>

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }
static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* The dropout multiplier of flat element i: rng.h's definition. */
static double mult(double p, uint64_t seed, uint64_t offset, int64_t i) {
    if (p <= 0.0) return 1.0;
    const float u = fg_dropout_uniform(seed, offset, (uint64_t)i);
    return u >= p ? 1.0 / (1.0 - p) : 0.0;
}

/* ------------------------------------------------------------------ the case */

typedef struct cfg {
    int64_t B, L, d, H, dff;
    int norm, act;
    bool packed, bias, affine, causal, lengths, resid, dscores, train;
    fg_encoder_save save;
    double p, p_ff, p_attn, eps, mom, scale;
    double p_proj; /* the projection's dropout, composed with p at site 1 */
    uint64_t seed, off;
} cfg;

/* Parameters on the host: q, k, v separately (the packed tensor is their concatenation). */
enum { WQ, BQ, WK, BK, WV, BV, WO, BO, W1, B1, W2, B2, N1W, N1B, N2W, N2B, RM1, RV1, RM2, RV2, NP };

typedef struct hostp {
    double *v[NP];
    int64_t n[NP];
} hostp;

static int64_t psize(const cfg *c, int i) {
    const int64_t d = c->d, f = c->dff;
    switch (i) {
    case WQ: case WK: case WV: case WO: return d * d;
    case W1: case W2: return f * d;
    case B1: return f;
    default: return d;
    }
}

static bool pused(const cfg *c, int i) {
    if (i == BQ || i == BK || i == BV || i == BO || i == B1 || i == B2) return c->bias;
    if (i >= N1W && i <= N2B) return c->affine;
    if (i >= RM1) return c->norm == FG_ENCODER_POST_BATCH;
    return true;
}

/* ------------------------------------------------------------------ reference parts */

static void rd(fg_dtype dt, double *v, int64_t n) { th_round(dt, v, n); }

/* y [n, m] = x [n, k]·Wᵀ + b */
static void linear(const double *x, const double *W, const double *b, int64_t n, int64_t k, int64_t m, double *y) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = b ? b[j] : 0.0;
            for (int64_t t = 0; t < k; t++) s += x[i * k + t] * W[j * k + t];
            y[i * m + j] = s;
        }
}

/* dx [n, k] (+)= dy [n, m]·W; dW [m, k] += dyᵀ·x; db [m] += Σ dy; dxa, dWa, dba (+)= the same sums
 * of magnitudes, with dya (when given) as dy's magnitudes (the size of its terms) */
static void linear_bw(const double *dy, const double *dya, const double *x, const double *W, int64_t n, int64_t k,
                      int64_t m, double *dx, double *dxa, bool dx_add, double *dW, double *db, double *dWa,
                      double *dba) {
    if (dx)
        for (int64_t i = 0; i < n; i++)
            for (int64_t t = 0; t < k; t++) {
                double s = dx_add ? dx[i * k + t] : 0.0, sa = 0;
                for (int64_t j = 0; j < m; j++) {
                    s += dy[i * m + j] * W[j * k + t];
                    sa += (dya ? dya[i * m + j] : fabs(dy[i * m + j])) * fabs(W[j * k + t]);
                }
                dx[i * k + t] = s;
                if (dxa) dxa[i * k + t] = (dx_add ? dxa[i * k + t] : 0) + sa;
            }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            const double a = dya ? dya[i * m + j] : fabs(dy[i * m + j]);
            if (db) db[j] += dy[i * m + j], dba[j] += a;
            if (dW)
                for (int64_t t = 0; t < k; t++)
                    dW[j * k + t] += dy[i * m + j] * x[i * k + t], dWa[j * k + t] += a * fabs(x[i * k + t]);
        }
}

static double act_f(int a, double x) {
    switch (a) {
    case FG_ACT_RELU: return x > 0 ? x : 0;
    case FG_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case FG_ACT_GELU_TANH: {
        const double c = sqrt(2.0 / M_PI);
        return 0.5 * x * (1 + tanh(c * (x + 0.044715 * x * x * x)));
    }
    default: return x / (1 + exp(-x)); /* silu */
    }
}

static double act_d(int a, double x) {
    switch (a) {
    case FG_ACT_RELU: return x > 0 ? 1 : 0;
    case FG_ACT_GELU: return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
    case FG_ACT_GELU_TANH: {
        const double c = sqrt(2.0 / M_PI), u = c * (x + 0.044715 * x * x * x), t = tanh(u);
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
    }
    default: {
        const double s = 1 / (1 + exp(-x));
        return s * (1 + x * (1 - s));
    }
    }
}

/* A row's mean (0 for RMSNorm) and 1/√(mean square about it + eps). */
static void row_stats(bool rms, double eps, const double *r, int64_t D, double *mean, double *rstd) {
    double m = 0, q = 0;
    if (!rms) {
        for (int64_t j = 0; j < D; j++) m += r[j];
        m /= (double)D;
    }
    for (int64_t j = 0; j < D; j++) q += (r[j] - m) * (r[j] - m);
    *mean = m;
    *rstd = 1 / sqrt(q / (double)D + eps);
}

/* Row norm (LayerNorm or RMSNorm) of x [n, D]. */
static void rownorm(bool rms, double eps, const double *x, const double *w, const double *b, int64_t n, int64_t D,
                    double *y) {
    for (int64_t i = 0; i < n; i++) {
        const double *r = x + i * D;
        double mean, rstd;
        row_stats(rms, eps, r, D, &mean, &rstd);
        for (int64_t j = 0; j < D; j++) y[i * D + j] = (r[j] - mean) * rstd * (w ? w[j] : 1) + (b ? b[j] : 0);
    }
}

/* dx = the row norm's input gradient (+ ds), dw += Σ dy·x̂, db += Σ dy; dxa (when given) = the
 * magnitude of dx's terms: a row's error spreads over the row, elements near zero included */
static void rownorm_bw(bool rms, double eps, const double *x, const double *w, const double *dy, const double *ds,
                       int64_t n, int64_t D, double *dx, double *dxa, double *dw, double *db, double *dwa,
                       double *dba) {
    double *xh = dalloc(D), *gg = dalloc(D);
    for (int64_t i = 0; i < n; i++) {
        const double *r = x + i * D;
        double mean, rstd;
        row_stats(rms, eps, r, D, &mean, &rstd);
        double mg = 0, mgx = 0;
        for (int64_t j = 0; j < D; j++) {
            xh[j] = (r[j] - mean) * rstd;
            gg[j] = dy[i * D + j] * (w ? w[j] : 1);
            mg += gg[j], mgx += gg[j] * xh[j];
            if (dw) dw[j] += dy[i * D + j] * xh[j], dwa[j] += fabs(dy[i * D + j] * xh[j]);
            if (db) db[j] += dy[i * D + j], dba[j] += fabs(dy[i * D + j]);
        }
        mg /= (double)D, mgx /= (double)D;
        for (int64_t j = 0; j < D; j++) {
            dx[i * D + j] = rstd * (gg[j] - (rms ? 0 : mg) - xh[j] * mgx) + (ds ? ds[i * D + j] : 0);
            if (dxa)
                dxa[i * D + j] = rstd * (fabs(gg[j]) + (rms ? 0 : fabs(mg)) + fabs(xh[j] * mgx)) +
                                 (ds ? fabs(ds[i * D + j]) : 0);
        }
    }
    free(xh);
    free(gg);
}

/* BatchNorm of x [N, C] per channel: training (batch statistics; running stats updated) or eval. */
static void batchnorm(bool train, double eps, double mom, const double *x, const double *w, const double *b,
                      double *rm, double *rv, int64_t N, int64_t C, double *y) {
    for (int64_t c = 0; c < C; c++) {
        double mean = 0, q = 0;
        if (train) {
            for (int64_t i = 0; i < N; i++) mean += x[i * C + c];
            mean /= (double)N;
            for (int64_t i = 0; i < N; i++) q += (x[i * C + c] - mean) * (x[i * C + c] - mean);
            rm[c] = (1 - mom) * rm[c] + mom * mean;
            rv[c] = (1 - mom) * rv[c] + mom * q / (double)(N - 1);
            q /= (double)N;
        } else {
            mean = rm[c], q = rv[c];
        }
        const double rstd = 1 / sqrt(q + eps);
        for (int64_t i = 0; i < N; i++)
            y[i * C + c] = (x[i * C + c] - mean) * rstd * (w ? w[c] : 1) + (b ? b[c] : 0);
    }
}

static void batchnorm_bw(double eps, const double *x, const double *w, const double *dy, int64_t N, int64_t C,
                         double *dx, double *dxa, double *dw, double *db, double *dwa, double *dba) {
    for (int64_t c = 0; c < C; c++) {
        double mean = 0, q = 0, sdy = 0, sdx = 0, ady = 0, adx = 0;
        for (int64_t i = 0; i < N; i++) mean += x[i * C + c];
        mean /= (double)N;
        for (int64_t i = 0; i < N; i++) q += (x[i * C + c] - mean) * (x[i * C + c] - mean);
        const double rstd = 1 / sqrt(q / (double)N + eps);
        for (int64_t i = 0; i < N; i++) {
            sdy += dy[i * C + c], ady += fabs(dy[i * C + c]);
            sdx += dy[i * C + c] * (x[i * C + c] - mean) * rstd, adx += fabs(dy[i * C + c] * (x[i * C + c] - mean) * rstd);
        }
        if (dw) dw[c] += sdx, dwa[c] += adx;
        if (db) db[c] += sdy, dba[c] += ady;
        const double wc = w ? w[c] : 1;
        for (int64_t i = 0; i < N; i++) {
            const double xh = (x[i * C + c] - mean) * rstd;
            dx[i * C + c] = wc * rstd * (dy[i * C + c] - sdy / (double)N - xh * sdx / (double)N);
            if (dxa)
                dxa[i * C + c] =
                    fabs(wc) * rstd * (fabs(dy[i * C + c]) + fabs(sdy / (double)N) + fabs(xh * sdx / (double)N));
        }
    }
}

/* ------------------------------------------------------------------ the reference layer */

typedef struct ref {
    double *x, *sin, *u1, *q, *k, *v, *S, *Pr, *o, *a, *s1, *h, *u2, *s2, *pre, *pre_r, *f, *ft, *g, *y;
    int64_t *len;
    double *rs[4];   /* running stats after the forward: mean1, var1, mean2, var2 */
    /* the backward */
    double *dy, *dsout, *dx, *dsin, *grad[NP];
    double *dxa; /* the magnitude of dx's terms: the scale of each element's rounding error */
    double *gabs[NP]; /* Σ |terms| of each gradient's sum: the scale its rounding error has */
} ref;

static double scale_of(const cfg *c) { return c->scale != 0 ? c->scale : 1 / sqrt((double)(c->d / c->H)); }
static bool masked(const cfg *c, const ref *r, int64_t b, int64_t i, int64_t j) {
    return (c->causal && j > i) || (c->lengths && j >= r->len[b]);
}

static void ref_forward(const cfg *c, fg_dtype dt, const hostp *P, ref *r) {
    const int64_t B = c->B, L = c->L, T = B * L, d = c->d, H = c->H, hd = d / H, f = c->dff;
    const bool pre = c->norm <= 1, rms = c->norm == 1, bn = c->norm == 3;
    const double eps = c->eps != 0 ? c->eps : 1e-5, mom = c->mom != 0 ? c->mom : 0.1;
    const double p = c->train ? c->p : 0, pf = c->train ? c->p_ff : 0, pa = c->train ? c->p_attn : 0;
    const double p1 = c->train ? 1 - (1 - c->p) * (1 - c->p_proj) : 0; /* two masks, one rate */
    const uint64_t o4 = 4 * c->off;
    const double *const *v = (const double *const *)P->v;
    const double *n1w = c->affine ? v[N1W] : NULL, *n1b = c->affine ? v[N1B] : NULL;
    const double *n2w = c->affine ? v[N2W] : NULL, *n2b = c->affine ? v[N2B] : NULL;
    const double *bq = c->bias ? v[BQ] : NULL, *bk = c->bias ? v[BK] : NULL, *bv = c->bias ? v[BV] : NULL;
    const double *bo = c->bias ? v[BO] : NULL, *b1 = c->bias ? v[B1] : NULL, *b2 = c->bias ? v[B2] : NULL;
    for (int i = 0; i < 4 && bn; i++) memcpy(r->rs[i], v[RM1 + i], sizeof(double) * (size_t)d);
    const double *qin = r->x;
    if (pre) {
        rownorm(rms, eps, r->x, n1w, n1b, T, d, r->u1);
        rd(dt, r->u1, T * d);
        qin = r->u1;
    }
    linear(qin, v[WQ], bq, T, d, d, r->q);
    linear(qin, v[WK], bk, T, d, d, r->k);
    linear(qin, v[WV], bv, T, d, d, r->v);
    rd(dt, r->q, T * d), rd(dt, r->k, T * d), rd(dt, r->v, T * d);
    const double sc = scale_of(c);
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < H; hh++)
            for (int64_t i = 0; i < L; i++) {
                double *S = r->S + ((b * H + hh) * L + i) * L, *Pr = r->Pr + ((b * H + hh) * L + i) * L;
                double mx = -INFINITY;
                for (int64_t j = 0; j < L; j++) {
                    double s = 0;
                    for (int64_t t = 0; t < hd; t++) s += r->q[(b * L + i) * d + hh * hd + t] * r->k[(b * L + j) * d + hh * hd + t];
                    s = sc * s + (c->resid ? r->sin[((b * H + hh) * L + i) * L + j] : 0);
                    S[j] = masked(c, r, b, i, j) ? -INFINITY : s;
                    if (S[j] > mx) mx = S[j];
                }
                double z = 0;
                for (int64_t j = 0; j < L; j++) z += S[j] == -INFINITY ? 0 : exp(S[j] - mx);
                for (int64_t j = 0; j < L; j++) Pr[j] = (z == 0 || S[j] == -INFINITY) ? 0 : exp(S[j] - mx) / z;
                for (int64_t t = 0; t < hd; t++) {
                    double s = 0;
                    for (int64_t j = 0; j < L; j++)
                        s += Pr[j] * th_attn_keep(pa, c->seed, o4 + 0, ((b * H + hh) * L + i) * L + j) *
                             r->v[(b * L + j) * d + hh * hd + t];
                    r->o[(b * L + i) * d + hh * hd + t] = s;
                }
            }
    rd(dt, r->o, T * d);
    linear(r->o, v[WO], bo, T, d, d, r->a);
    rd(dt, r->a, T * d);
    for (int64_t i = 0; i < T * d; i++) r->s1[i] = r->x[i] + mult(p1, c->seed, o4 + 1, i) * r->a[i];
    rd(dt, r->s1, T * d);
    const double *fin;
    if (pre) {
        memcpy(r->h, r->s1, sizeof(double) * (size_t)(T * d));
        rownorm(rms, eps, r->h, n2w, n2b, T, d, r->u2);
        rd(dt, r->u2, T * d);
        fin = r->u2;
    } else {
        if (bn) batchnorm(c->train, eps, mom, r->s1, n1w, n1b, r->rs[0], r->rs[1], T, d, r->h);
        else rownorm(false, eps, r->s1, n1w, n1b, T, d, r->h);
        rd(dt, r->h, T * d);
        fin = r->h;
    }
    linear(fin, v[W1], b1, T, d, f, r->pre);
    memcpy(r->pre_r, r->pre, sizeof(double) * (size_t)(T * f));
    rd(dt, r->pre_r, T * f);
    for (int64_t i = 0; i < T * f; i++) r->f[i] = act_f(c->act, r->pre[i]);
    rd(dt, r->f, T * f);
    for (int64_t i = 0; i < T * f; i++) r->ft[i] = mult(pf, c->seed, o4 + 2, i) * r->f[i];
    rd(dt, r->ft, T * f);
    linear(r->ft, v[W2], b2, T, f, d, r->g);
    rd(dt, r->g, T * d);
    if (pre) {
        for (int64_t i = 0; i < T * d; i++) r->s2[i] = mult(p, c->seed, o4 + 3, i) * r->g[i];
        rd(dt, r->s2, T * d);
        for (int64_t i = 0; i < T * d; i++) r->y[i] = r->h[i] + r->s2[i];
    } else {
        for (int64_t i = 0; i < T * d; i++) r->s2[i] = r->h[i] + mult(p, c->seed, o4 + 3, i) * r->g[i];
        rd(dt, r->s2, T * d);
        if (bn) batchnorm(c->train, eps, mom, r->s2, n2w, n2b, r->rs[2], r->rs[3], T, d, r->y);
        else rownorm(false, eps, r->s2, n2w, n2b, T, d, r->y);
    }
}

static void ref_backward(const cfg *c, fg_dtype dt, const hostp *P, ref *r) {
    const int64_t B = c->B, L = c->L, T = B * L, d = c->d, H = c->H, hd = d / H, f = c->dff;
    const bool pre = c->norm <= 1, rms = c->norm == 1, bn = c->norm == 3;
    const double eps = c->eps != 0 ? c->eps : 1e-5;
    const double p = c->p, pf = c->p_ff, pa = c->p_attn;
    const double p1 = 1 - (1 - c->p) * (1 - c->p_proj);
    const uint64_t o4 = 4 * c->off;
    double *const *v = P->v, **G = r->grad;
    const double *n1w = c->affine ? v[N1W] : NULL, *n2w = c->affine ? v[N2W] : NULL;
    double **A = r->gabs;
    for (int i = 0; i < NP; i++) memset(G[i], 0, sizeof(double) * (size_t)P->n[i]);
    for (int i = 0; i < NP; i++) memset(A[i], 0, sizeof(double) * (size_t)P->n[i]);
    double *dg = dalloc(T * d), *dh = dalloc(T * d), *da = dalloc(T * d), *dof = dalloc(T * d);
    double *df = dalloc(T * f), *du = dalloc(T * d), *dq = dalloc(T * d), *dk = dalloc(T * d), *dv = dalloc(T * d);
    /* the magnitudes of dq / dk / dv's terms: their sums cancel (Σ_j ds = 0 per row; dof sums to 0
     * over tokens through a BatchNorm), so their errors scale with these, not with their values */
    double *dqa = dalloc(T * d), *dka = dalloc(T * d), *dva = dalloc(T * d);
    double *n2b = c->affine ? G[N2B] : NULL, *n1b = c->affine ? G[N1B] : NULL;
    double *gn2w = c->affine ? G[N2W] : NULL, *gn1w = c->affine ? G[N1W] : NULL;
    /* the FFN block's output */
    if (pre) {
        for (int64_t i = 0; i < T * d; i++) dg[i] = mult(p, c->seed, o4 + 3, i) * r->dy[i];
        rd(dt, dg, T * d);
    } else {
        if (bn) batchnorm_bw(eps, r->s2, n2w, r->dy, T, d, dh, NULL, gn2w, n2b, A[N2W], A[N2B]);
        else rownorm_bw(false, eps, r->s2, n2w, r->dy, NULL, T, d, dh, NULL, gn2w, n2b, A[N2W], A[N2B]);
        for (int64_t i = 0; i < T * d; i++) dg[i] = mult(p, c->seed, o4 + 3, i) * dh[i];
        rd(dt, dh, T * d), rd(dt, dg, T * d);
    }
    linear_bw(dg, NULL, r->ft, v[W2], T, f, d, df, NULL, false, G[W2], c->bias ? G[B2] : NULL, A[W2], A[B2]);
    rd(dt, df, T * f);
    for (int64_t i = 0; i < T * f; i++) df[i] *= mult(pf, c->seed, o4 + 2, i) * act_d(c->act, r->pre_r[i]);
    const double *fin = pre ? r->u2 : r->h;
    linear_bw(df, NULL, fin, v[W1], T, d, f, pre ? du : dh, NULL, !pre, G[W1], c->bias ? G[B1] : NULL, A[W1], A[B1]);
    /* the attention block's output */
    if (pre) {
        rd(dt, du, T * d);
        rownorm_bw(rms, eps, r->h, n2w, du, r->dy, T, d, dh, NULL, gn2w, n2b, A[N2W], A[N2B]);
        for (int64_t i = 0; i < T * d; i++) da[i] = mult(p1, c->seed, o4 + 1, i) * dh[i];
        rd(dt, dh, T * d);
    } else {
        rd(dt, dh, T * d);
        if (bn) batchnorm_bw(eps, r->s1, n1w, dh, T, d, r->dx, r->dxa, gn1w, n1b, A[N1W], A[N1B]);
        else rownorm_bw(false, eps, r->s1, n1w, dh, NULL, T, d, r->dx, r->dxa, gn1w, n1b, A[N1W], A[N1B]);
        for (int64_t i = 0; i < T * d; i++) da[i] = mult(p1, c->seed, o4 + 1, i) * r->dx[i];
        rd(dt, r->dx, T * d);
    }
    rd(dt, da, T * d);
    linear_bw(da, NULL, r->o, v[WO], T, d, d, dof, NULL, false, G[WO], c->bias ? G[BO] : NULL, A[WO], A[BO]);
    rd(dt, dof, T * d);
    /* attention */
    const double sc = scale_of(c);
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < H; hh++)
            for (int64_t i = 0; i < L; i++) {
                const int64_t row = ((b * H + hh) * L + i) * L;
                const double *Pr = r->Pr + row;
                double D = 0, Da = 0;
                for (int64_t t = 0; t < hd; t++) {
                    const int64_t e = (b * L + i) * d + hh * hd + t;
                    D += dof[e] * r->o[e], Da += fabs(dof[e] * r->o[e]);
                }
                for (int64_t j = 0; j < L; j++) {
                    const double m = th_attn_keep(pa, c->seed, o4 + 0, row + j);
                    double dp = 0, dpa = 0;
                    for (int64_t t = 0; t < hd; t++) {
                        const double e = dof[(b * L + i) * d + hh * hd + t] * r->v[(b * L + j) * d + hh * hd + t];
                        dp += e, dpa += fabs(e);
                    }
                    double ds = masked(c, r, b, i, j) ? 0 : Pr[j] * (dp * m - D) + (c->dscores ? r->dsout[row + j] : 0);
                    const double dsa = masked(c, r, b, i, j)
                                           ? 0
                                           : Pr[j] * (dpa * m + Da) + (c->dscores ? fabs(r->dsout[row + j]) : 0);
                    if (c->resid) r->dsin[row + j] = ds;
                    for (int64_t t = 0; t < hd; t++) {
                        dq[(b * L + i) * d + hh * hd + t] += sc * ds * r->k[(b * L + j) * d + hh * hd + t];
                        dk[(b * L + j) * d + hh * hd + t] += sc * ds * r->q[(b * L + i) * d + hh * hd + t];
                        dv[(b * L + j) * d + hh * hd + t] += Pr[j] * m * dof[(b * L + i) * d + hh * hd + t];
                        dqa[(b * L + i) * d + hh * hd + t] += fabs(sc) * dsa * fabs(r->k[(b * L + j) * d + hh * hd + t]);
                        dka[(b * L + j) * d + hh * hd + t] += fabs(sc) * dsa * fabs(r->q[(b * L + i) * d + hh * hd + t]);
                        dva[(b * L + j) * d + hh * hd + t] += Pr[j] * m * fabs(dof[(b * L + i) * d + hh * hd + t]);
                    }
                }
            }
    rd(dt, dq, T * d), rd(dt, dk, T * d), rd(dt, dv, T * d);
    const double *qin = pre ? r->u1 : r->x;
    double *dqin = pre ? du : r->dx, *dqina = pre ? NULL : r->dxa;
    linear_bw(dq, dqa, qin, v[WQ], T, d, d, dqin, dqina, !pre, G[WQ], c->bias ? G[BQ] : NULL, A[WQ], A[BQ]);
    linear_bw(dk, dka, qin, v[WK], T, d, d, dqin, dqina, true, G[WK], c->bias ? G[BK] : NULL, A[WK], A[BK]);
    linear_bw(dv, dva, qin, v[WV], T, d, d, dqin, dqina, true, G[WV], c->bias ? G[BV] : NULL, A[WV], A[BV]);
    if (pre) {
        rd(dt, du, T * d);
        rownorm_bw(rms, eps, r->x, n1w, du, dh, T, d, r->dx, r->dxa, gn1w, n1b, A[N1W], A[N1B]);
    }
    free(dg), free(dh), free(da), free(dof), free(df), free(du), free(dq), free(dk), free(dv);
    free(dqa), free(dka), free(dva);
}

/* ------------------------------------------------------------------ the library side */

typedef struct dev {
    fg_backend be;
    fg_dtype dt;
    fg_context *ctx;
    th_operand x, y, dy, dx, sin, sout, dsout, dsin, len;
    th_operand p[NP], packw, packb, gp[NP], gpackw, gpackb;
    fg_encoder_layer_desc desc;
    fg_encoder_layer_run run;
    fg_encoder_layer_params params, grads;
    th_buf cache, ws;
    size_t cache_bytes, ws_bytes;
    bool has_sin, has_sout, has_dsout, has_len;
} dev;

static th_operand upload(fg_backend be, fg_dtype dt, int rank, const int64_t *shape, double *vals) {
    th_operand o = th_make(be, dt, rank, shape, 0);
    if (vals) {
        th_round(dt, vals, o.n);
        memcpy(o.v, vals, sizeof(double) * (size_t)o.n);
        th_put(&o.buf, &o.t, o.v);
    } else {
        th_poison(&o.buf);
    }
    return o;
}

static void fill(double *v, int64_t n, double s) {
    for (int64_t i = 0; i < n; i++) v[i] = s * th_rand();
}

static fg_tensor *pslot(fg_encoder_layer_params *P, int i) {
    switch (i) {
    case WQ: return &P->w_q;
    case BQ: return &P->b_q;
    case WK: return &P->w_k;
    case BK: return &P->b_k;
    case WV: return &P->w_v;
    case BV: return &P->b_v;
    case WO: return &P->w_o;
    case BO: return &P->b_o;
    case W1: return &P->w_1;
    case B1: return &P->b_1;
    case W2: return &P->w_2;
    case B2: return &P->b_2;
    case N1W: return &P->norm1_w;
    case N1B: return &P->norm1_b;
    case N2W: return &P->norm2_w;
    case N2B: return &P->norm2_b;
    case RM1: return &P->running_mean1;
    case RV1: return &P->running_var1;
    case RM2: return &P->running_mean2;
    default: return &P->running_var2;
    }
}

static void pshape(const cfg *c, int i, int *rank, int64_t shape[2]) {
    const int64_t d = c->d, f = c->dff;
    *rank = 1;
    switch (i) {
    case WQ: case WK: case WV: case WO: *rank = 2, shape[0] = d, shape[1] = d; break;
    case W1: *rank = 2, shape[0] = f, shape[1] = d; break;
    case W2: *rank = 2, shape[0] = d, shape[1] = f; break;
    case B1: shape[0] = f; break;
    default: shape[0] = d;
    }
}

static void desc_of(const cfg *c, fg_encoder_layer_desc *e) {
    memset(e, 0, sizeof *e);
    e->d_model = c->d, e->heads = c->H, e->d_ff = c->dff;
    e->activation = (fg_activation)c->act;
    e->norm = (fg_encoder_norm)c->norm;
    e->norm_eps = c->eps, e->bn_momentum = c->mom, e->attn_scale = c->scale;
    e->causal = c->causal, e->residual_scores = c->resid;
    e->dropout = c->p, e->dropout_ffn = c->p_ff, e->dropout_attn = c->p_attn, e->dropout_proj = c->p_proj;
    e->save = c->save;
}

/* Host data (r, P) and its device copies. */
static void setup(const cfg *c, fg_backend be, fg_dtype dt, hostp *P, ref *r, dev *D) {
    const int64_t B = c->B, L = c->L, T = B * L, d = c->d, H = c->H, f = c->dff;
    memset(D, 0, sizeof *D);
    D->be = be, D->dt = dt;
    D->ctx = th_context(be, false);
    memset(r, 0, sizeof *r);
    double **bufs[] = {&r->x, &r->u1, &r->q, &r->k, &r->v, &r->o, &r->a, &r->s1, &r->h, &r->u2, &r->s2, &r->g, &r->y,
                       &r->dy, &r->dx, &r->dxa};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = dalloc(T * d);
    r->pre = dalloc(T * f), r->pre_r = dalloc(T * f), r->f = dalloc(T * f), r->ft = dalloc(T * f);
    const int64_t nS = B * H * L * L;
    r->S = dalloc(nS), r->Pr = dalloc(nS), r->sin = dalloc(nS), r->dsout = dalloc(nS), r->dsin = dalloc(nS);
    r->len = calloc((size_t)(B > 0 ? B : 1), sizeof(int64_t));
    for (int i = 0; i < 4; i++) r->rs[i] = dalloc(d);
    for (int i = 0; i < NP; i++) {
        P->n[i] = psize(c, i);
        P->v[i] = dalloc(P->n[i]);
        r->grad[i] = dalloc(P->n[i]);
        r->gabs[i] = dalloc(P->n[i]);
        const double s = (i == WQ || i == WK || i == WV || i == WO || i == W1) ? 1 / sqrt((double)d)
                         : i == W2                                           ? 1 / sqrt((double)f)
                                                                             : 0.5;
        fill(P->v[i], P->n[i], s);
        if (i == N1W || i == N2W)
            for (int64_t j = 0; j < P->n[i]; j++) P->v[i][j] += 1.0;
        if (i == RV1 || i == RV2)
            for (int64_t j = 0; j < P->n[i]; j++) P->v[i][j] = 0.5 + fabs(P->v[i][j]);
    }
    fill(r->x, T * d, 1.0);
    fill(r->sin, nS, 1.0);
    fill(r->dy, T * d, 1.0);
    fill(r->dsout, nS, 0.5);
    for (int64_t b = 0; b < B; b++) r->len[b] = c->lengths ? (b == 0 ? L : (int64_t)(th_rand_u64() % (uint64_t)(L + 1))) : L;
    const int64_t sx[3] = {B, L, d}, ss[4] = {B, H, L, L}, sl[1] = {B};
    D->x = upload(be, dt, 3, sx, r->x);
    D->y = upload(be, dt, 3, sx, NULL);
    D->dy = upload(be, dt, 3, sx, r->dy);
    D->dx = upload(be, dt, 3, sx, NULL);
    const fg_dtype sdt = dt == FG_BF16 ? FG_F32 : dt; /* bf16 layers carry f32 scores */
    if (c->resid) {
        D->sin = upload(be, sdt, 4, ss, r->sin);
        D->sout = upload(be, sdt, 4, ss, NULL);
        D->dsin = upload(be, sdt, 4, ss, NULL);
        D->has_sin = D->has_sout = true;
        if (c->dscores) D->dsout = upload(be, sdt, 4, ss, r->dsout), D->has_dsout = true;
    }
    if (c->lengths) {
        D->len = th_make(be, FG_I64, 1, sl, 0);
        th_put_raw(&D->len.buf, r->len, sizeof(int64_t) * (size_t)B);
        D->has_len = true;
    }
    /* the parameters, rounded to the dtype (the reference reads the rounded values) */
    for (int i = 0; i < NP; i++) {
        int rank;
        int64_t shape[2];
        pshape(c, i, &rank, shape);
        if (!pused(c, i)) continue;
        const fg_dtype pdt = i >= RM1 ? (dt == FG_F64 ? FG_F64 : FG_F32) : dt;
        D->p[i] = upload(be, pdt, rank, shape, P->v[i]);
        D->gp[i] = upload(be, dt, rank, shape, NULL);
    }
    desc_of(c, &D->desc);
    D->run.train = c->train, D->run.seed = c->seed, D->run.offset = c->off;
    memset(&D->params, 0, sizeof D->params);
    memset(&D->grads, 0, sizeof D->grads);
    if (c->packed) {
        double *w = dalloc(3 * d * d), *b = dalloc(3 * d);
        for (int j = 0; j < 3; j++) {
            memcpy(w + j * d * d, P->v[WQ + 2 * j], sizeof(double) * (size_t)(d * d));
            memcpy(b + j * d, P->v[BQ + 2 * j], sizeof(double) * (size_t)d);
        }
        const int64_t sw[2] = {3 * d, d}, sb[1] = {3 * d};
        D->packw = upload(be, dt, 2, sw, w), D->gpackw = upload(be, dt, 2, sw, NULL);
        D->params.w_qkv = D->packw.t, D->grads.w_qkv = D->gpackw.t;
        if (c->bias) {
            D->packb = upload(be, dt, 1, sb, b), D->gpackb = upload(be, dt, 1, sb, NULL);
            D->params.b_qkv = D->packb.t, D->grads.b_qkv = D->gpackb.t;
        }
        free(w), free(b);
    }
    for (int i = 0; i < NP; i++) {
        if (!pused(c, i)) continue;
        if (c->packed && i <= BV) continue;
        *pslot(&D->params, i) = D->p[i].t;
        if (i < RM1) *pslot(&D->grads, i) = D->gp[i].t;
    }
    TH_OK(fg_encoder_layer_sizes(&D->desc, dt, B, L, &D->cache_bytes, &D->ws_bytes));
    D->cache = th_alloc(be, FG_F32, (int64_t)(D->cache_bytes / 4 + 1));
    D->ws = th_alloc(be, FG_F32, (int64_t)(D->ws_bytes / 4 + 1));
    th_poison(&D->cache), th_poison(&D->ws);
}

static void teardown(hostp *P, ref *r, dev *D) {
    th_operand *ops[] = {&D->x, &D->y, &D->dy, &D->dx, &D->sin, &D->sout, &D->dsout, &D->dsin, &D->len, &D->packw,
                         &D->packb, &D->gpackw, &D->gpackb};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i]->buf.ptr) th_drop(ops[i]);
    for (int i = 0; i < NP; i++) {
        if (D->p[i].buf.ptr) th_drop(&D->p[i]);
        if (D->gp[i].buf.ptr) th_drop(&D->gp[i]);
        free(P->v[i]);
        free(r->grad[i]);
        free(r->gabs[i]);
    }
    th_free(&D->cache), th_free(&D->ws);
    fg_context_destroy(D->ctx);
    double *bufs[] = {r->x, r->u1, r->q, r->k, r->v, r->o, r->a, r->s1, r->h, r->u2, r->s2, r->g, r->y, r->dy, r->dx, r->dxa,
                      r->pre, r->pre_r, r->f, r->ft, r->S, r->Pr, r->sin, r->dsout, r->dsin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    for (int i = 0; i < 4; i++) free(r->rs[i]);
    free(r->len);
}

/* SAVE_MIN's training forward takes the workspace (the _ws entry); the others the plain entry */
static fg_status dev_forward(dev *D, bool with_cache) {
    if (D->desc.save == FG_ENCODER_SAVE_MIN)
        return fg_encoder_layer_forward_ws(D->ctx, &D->desc, &D->run, &D->x.t, D->has_len ? &D->len.t : NULL,
                                           D->has_sin ? &D->sin.t : NULL, &D->params, &D->y.t,
                                           D->has_sout ? &D->sout.t : NULL, with_cache ? D->cache.ptr : NULL,
                                           with_cache ? D->cache_bytes : 0, D->ws.ptr, D->ws_bytes);
    return fg_encoder_layer_forward(D->ctx, &D->desc, &D->run, &D->x.t, D->has_len ? &D->len.t : NULL,
                                    D->has_sin ? &D->sin.t : NULL, &D->params, &D->y.t,
                                    D->has_sout ? &D->sout.t : NULL, with_cache ? D->cache.ptr : NULL,
                                    with_cache ? D->cache_bytes : 0);
}

static fg_status dev_backward(dev *D, int accumulate) {
    return fg_encoder_layer_backward(D->ctx, &D->desc, &D->run, &D->dy.t, D->has_dsout ? &D->dsout.t : NULL, &D->x.t,
                                     D->has_len ? &D->len.t : NULL, D->has_sin ? &D->sin.t : NULL, &D->params,
                                     D->cache.ptr, D->cache_bytes, &D->dx.t, D->has_sin ? &D->dsin.t : NULL,
                                     &D->grads, accumulate, D->ws.ptr, D->ws_bytes);
}

/* Scores: −∞ exactly where the reference has it, the rest within tolerance. */
static void verify_scores(const char *what, th_operand *o, const double *ref, int64_t n, double tol, const char *label) {
    double *got = dalloc(n), *a = dalloc(n), *b = dalloc(n);
    th_get(&o->buf, &o->t, got);
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(ref[i]) != isinf(got[i]) && bad < 0) bad = i;
        a[i] = isinf(ref[i]) ? 0 : got[i], b[i] = isinf(ref[i]) ? 0 : ref[i];
    }
    TH_CHECK(bad < 0, "%s %s: element %lld is %g, reference %g", what, label, (long long)bad, bad >= 0 ? got[bad] : 0.0,
             bad >= 0 ? ref[bad] : 0.0);
    const double err = th_relerr(a, b, n);
    TH_CHECK(err <= tol, "%s %s: relerr %.3g > tol %.3g", what, label, err, tol);
    free(got), free(a), free(b);
}

/* dx against its reference; for f16 / bf16 each element is allowed 4·tol of its terms' magnitude
 * (mag: r->dxa, plus |base| when accumulating) where that exceeds |ref|. */
static void verify_dx(dev *D, const double *want, const double *mag, const double *base, int64_t n, double tol,
                      const char *label) {
    double *slack = dalloc(n);
    for (int64_t i = 0; i < n; i++) {
        const double m = mag[i] + (base ? fabs(base[i]) : 0) - fabs(want[i]);
        slack[i] = m > 0 ? 4 * tol * m : 0;
    }
    th_verify_slack("dx", &D->dx, want, slack, tol, label);
    free(slack);
}

static const char *const pname[NP] = {"w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o", "w_1", "b_1",
                                      "w_2", "b_2", "norm1_w", "norm1_b", "norm2_w", "norm2_b",
                                      "running_mean1", "running_var1", "running_mean2", "running_var2"};

/* A gradient that is a sum over tokens against its reference: ‖got − ref‖ <= tol·max(‖ref‖, ‖abs‖)
 * with abs the sum of the terms' magnitudes (a sum's rounding error scales with it, not with the
 * sum: the bias gradients upstream of a BatchNorm, b_k's, and b_v's through a BatchNorm cancel to
 * zero exactly; dq, dk and dv enter with their own terms' magnitudes, for the same reason); for f16 /
 * bf16 also every element, |got − ref| <= 4·tol·(abs + mean abs) (th_verify's per-element rule
 * with the same scale). */
static void verify_sum(const char *what, const double *got, const double *ref, const double *abs, int64_t n,
                       fg_dtype dt, double tol, const char *label) {
    double e = 0, rn = 0, an = 0, mean = 0;
    bool nan = false;
    for (int64_t i = 0; i < n; i++) {
        nan = nan || isnan(got[i]);
        e += (got[i] - ref[i]) * (got[i] - ref[i]), rn += ref[i] * ref[i], an += abs[i] * abs[i], mean += abs[i];
    }
    const double scale = sqrt(rn > an ? rn : an), err = nan ? INFINITY : scale > 0 ? sqrt(e) / scale : sqrt(e);
    th_margin(what, label, err, tol);
    TH_CHECK(err <= tol, "%s %s: error %.3g of the sum's scale > tol %.3g", what, label, err, tol);
    if (dt != FG_F16 && dt != FG_BF16) return;
    mean /= (double)(n > 0 ? n : 1);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (!(fabs(got[i] - ref[i]) <= 4 * tol * (abs[i] + mean))) bad = i;
    TH_CHECK(bad < 0, "%s %s: element %lld is %g, reference %g (terms' magnitude %g)", what, label, (long long)bad,
             bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0, bad >= 0 ? abs[bad] : 0.0);
}

/* Compares every parameter gradient; base (accumulate) is added to the reference. */
static void verify_grads(const cfg *c, dev *D, ref *r, double tol, const char *label, double *const *base,
                         const double *pack_base_w, const double *pack_base_b) {
    const int64_t d = c->d;
    for (int i = 0; i < RM1; i++) {
        if (!pused(c, i) || (c->packed && i <= BV)) continue;
        const int64_t n = D->gp[i].n;
        double *want = dalloc(n), *got = dalloc(n), *abs = dalloc(n);
        for (int64_t j = 0; j < n; j++)
            want[j] = r->grad[i][j] + (base ? base[i][j] : 0), abs[j] = r->gabs[i][j] + (base ? fabs(base[i][j]) : 0);
        th_get(&D->gp[i].buf, &D->gp[i].t, got);
        verify_sum(pname[i], got, want, abs, n, D->dt, tol, label);
        free(want), free(got), free(abs);
    }
    if (c->packed) {
        for (int bias = 0; bias < (c->bias ? 2 : 1); bias++) {
            const int64_t m = bias ? d : d * d;
            th_operand *o = bias ? &D->gpackb : &D->gpackw;
            const double *pb = bias ? pack_base_b : pack_base_w;
            double *want = dalloc(3 * m), *got = dalloc(3 * m), *abs = dalloc(3 * m);
            for (int j = 0; j < 3; j++)
                for (int64_t e = 0; e < m; e++) {
                    const int k = (bias ? BQ : WQ) + 2 * j;
                    want[j * m + e] = r->grad[k][e] + (pb ? pb[j * m + e] : 0);
                    abs[j * m + e] = r->gabs[k][e] + (pb ? fabs(pb[j * m + e]) : 0);
                }
            th_get(&o->buf, &o->t, got);
            for (int j = 0; j < 3; j++) /* q, k, v: each its own scale (b_k's sums cancel) */
                verify_sum(bias ? "b_qkv" : "w_qkv", got + j * m, want + j * m, abs + j * m, m, D->dt, tol, label);
            free(want), free(got), free(abs);
        }
    }
}

static void label_of(const cfg *c, fg_backend be, fg_dtype dt, char *buf, size_t n) {
    snprintf(buf, n,
             "%s %s B%lld L%lld d%lld H%lld ff%lld norm%d act%d %s%s%s%s%s%s%s p%.2g/%.2g/%.2g%s%s",
             th_backend_name(be), fg_dtype_name(dt), (long long)c->B, (long long)c->L, (long long)c->d,
             (long long)c->H, (long long)c->dff, c->norm, c->act, c->packed ? "packed" : "separate",
             c->bias ? "" : " nobias", c->affine ? "" : " noaffine", c->causal ? " causal" : "",
             c->lengths ? " lengths" : "", c->resid ? " resid" : "", c->dscores ? "+ds" : "", c->p, c->p_ff, c->p_attn,
             c->train ? "" : " eval", c->save == FG_ENCODER_SAVE_LESS ? " save_less" : c->save == FG_ENCODER_SAVE_MIN ? " save_min" : "");
}

/* One case: forward against the reference (and, training, the backward), plus its variants. */
static void run_case(const cfg *c, fg_backend be, fg_dtype dt, bool extras) {
    char label[256];
    label_of(c, be, dt, label, sizeof label);
    hostp P;
    ref r;
    dev D;
    setup(c, be, dt, &P, &r, &D);
    const double tol = th_tol(dt, false);
    const int64_t T = c->B * c->L, d = c->d, nS = c->B * c->H * c->L * c->L;
    ref_forward(c, dt, &P, &r);
    TH_OK(dev_forward(&D, true));
    th_verify("y", &D.y, r.y, tol, label);
    if (c->resid) verify_scores("scores_out", &D.sout, r.S, nS, dt == FG_BF16 ? 1e-2 : tol, label);
    if (c->norm == 3) {
        for (int i = 0; i < 4; i++) th_verify(pname[RM1 + i], &D.p[RM1 + i], r.rs[i], tol, label);
    }
    if (!c->train) {
        /* without a cache: the same bits */
        void *y1 = th_snapshot(&D.y.buf);
        th_poison(&D.y.buf);
        TH_OK(dev_forward(&D, false));
        TH_CHECK(th_unchanged(&D.y.buf, y1), "[%s] the forward without a cache differs from the one with", label);
        free(y1);
        teardown(&P, &r, &D);
        return;
    }
    ref_backward(c, dt, &P, &r);
    TH_OK(dev_backward(&D, 0));
    verify_dx(&D, r.dx, r.dxa, NULL, T * d, tol, label);
    if (c->resid) th_verify("dscores_in", &D.dsin, r.dsin, dt == FG_BF16 ? 1e-2 : tol, label);
    verify_grads(c, &D, &r, tol, label, NULL, NULL, NULL);
    if (extras) {
        /* the same bits again (dropout regenerated), and with accumulate: base + gradient */
        void *ysnap = th_snapshot(&D.y.buf), *dxsnap = th_snapshot(&D.dx.buf);
        void *g1 = th_snapshot(&D.gp[WO].buf);
        /* BatchNorm's running stats move each training forward: restore them */
        double *rs0[4];
        for (int i = 0; i < 4 && c->norm == 3; i++) {
            rs0[i] = P.v[RM1 + i];
        }
        th_poison(&D.y.buf);
        TH_OK(dev_forward(&D, true));
        TH_CHECK(th_unchanged(&D.y.buf, ysnap), "[%s] a second forward gives other bits", label);
        th_poison(&D.dx.buf);
        TH_OK(dev_backward(&D, 0));
        TH_CHECK(th_unchanged(&D.dx.buf, dxsnap), "[%s] a second backward gives other dx bits", label);
        TH_CHECK(th_unchanged(&D.gp[WO].buf, g1), "[%s] a second backward gives other dw_o bits", label);
        (void)rs0;
        /* accumulate into random gradients and a random dx, dscores_in */
        double *base[NP] = {0}, *bw = NULL, *bb = NULL, *bdx = dalloc(T * d), *bds = dalloc(nS);
        for (int i = 0; i < RM1; i++) {
            if (!pused(c, i) || (c->packed && i <= BV)) continue;
            base[i] = dalloc(D.gp[i].n);
            fill(base[i], D.gp[i].n, 1.0);
            th_round(dt, base[i], D.gp[i].n);
            th_put(&D.gp[i].buf, &D.gp[i].t, base[i]);
        }
        if (c->packed) {
            bw = dalloc(3 * d * d), bb = dalloc(3 * d);
            fill(bw, 3 * d * d, 1.0), th_round(dt, bw, 3 * d * d), th_put(&D.gpackw.buf, &D.gpackw.t, bw);
            if (c->bias) fill(bb, 3 * d, 1.0), th_round(dt, bb, 3 * d), th_put(&D.gpackb.buf, &D.gpackb.t, bb);
        }
        fill(bdx, T * d, 1.0), th_round(dt, bdx, T * d), th_put(&D.dx.buf, &D.dx.t, bdx);
        if (c->resid) fill(bds, nS, 1.0), th_round(D.dsin.buf.dtype, bds, nS), th_put(&D.dsin.buf, &D.dsin.t, bds);
        TH_OK(dev_backward(&D, 1));
        char lab2[300];
        snprintf(lab2, sizeof lab2, "%s accumulate", label);
        double *want = dalloc(T * d > nS ? T * d : nS);
        for (int64_t i = 0; i < T * d; i++) want[i] = r.dx[i] + bdx[i];
        verify_dx(&D, want, r.dxa, bdx, T * d, tol, lab2);
        if (c->resid) {
            for (int64_t i = 0; i < nS; i++) want[i] = r.dsin[i] + bds[i];
            th_verify("dscores_in", &D.dsin, want, dt == FG_BF16 ? 1e-2 : tol, lab2);
        }
        double *zb[NP] = {0};
        for (int i = 0; i < NP; i++) zb[i] = base[i] ? base[i] : NULL;
        /* verify_grads reads base[i] for every used parameter */
        for (int i = 0; i < RM1; i++)
            if (pused(c, i) && !zb[i]) zb[i] = dalloc(P.n[i]);
        verify_grads(c, &D, &r, tol, lab2, zb, bw, c->bias ? bb : NULL);
        for (int i = 0; i < NP; i++) free(zb[i]);
        free(bw), free(bb), free(bdx), free(bds), free(want);
        free(ysnap), free(dxsnap), free(g1);
    }
    teardown(&P, &r, &D);
}

/* SAVE_LESS and SAVE_MIN: the same forward bits as SAVE_ALL from a smaller cache; SAVE_MIN the same
 * backward bits too (both read the FFN's saved operand, the masked slope in 16-bit layers and pre
 * otherwise, kept or recomputed by the same call), while SAVE_LESS recomputes pre inside the
 * backward and masks the hidden's gradient there (in 16-bit the unfused pair's rounding, and on
 * CUDA other kernels: other bits, checked against the reference by its run_case). */
static void save_case(const cfg *c0, fg_backend be, fg_dtype dt, fg_encoder_save lean) {
    const char *mode = lean == FG_ENCODER_SAVE_MIN ? "SAVE_MIN" : "SAVE_LESS";
    char label[256];
    label_of(c0, be, dt, label, sizeof label);
    cfg c = *c0;
    hostp P[2];
    ref r[2];
    dev D[2];
    void *snaps[2][NP + 2];
    size_t cb[2];
    for (int k = 0; k < 2; k++) {
        c.save = k == 1 ? lean : FG_ENCODER_SAVE_ALL;
        uint64_t keep = th_rand_u64();
        (void)keep;
        /* the same random data for both: replay the generator from one seed */
        setup(&c, be, dt, &P[k], &r[k], &D[k]);
        cb[k] = D[k].cache_bytes;
    }
    /* make D[1]'s inputs D[0]'s */
    th_put(&D[1].x.buf, &D[1].x.t, D[0].x.v);
    th_put(&D[1].dy.buf, &D[1].dy.t, D[0].dy.v);
    for (int i = 0; i < NP; i++)
        if (D[0].p[i].buf.ptr) th_put(&D[1].p[i].buf, &D[1].p[i].t, D[0].p[i].v);
    if (c.packed) {
        th_put(&D[1].packw.buf, &D[1].packw.t, D[0].packw.v);
        if (c.bias) th_put(&D[1].packb.buf, &D[1].packb.t, D[0].packb.v);
    }
    if (c.resid) {
        th_put(&D[1].sin.buf, &D[1].sin.t, D[0].sin.v);
        if (c.dscores) th_put(&D[1].dsout.buf, &D[1].dsout.t, D[0].dsout.v);
    }
    if (c.lengths) th_put_raw(&D[1].len.buf, r[0].len, sizeof(int64_t) * (size_t)c.B);
    TH_CHECK(cb[1] < cb[0], "[%s] %s's cache (%zu bytes) is not smaller than SAVE_ALL's (%zu)", label, mode, cb[1], cb[0]);
    for (int k = 0; k < 2; k++) {
        TH_OK(dev_forward(&D[k], true));
        TH_OK(dev_backward(&D[k], 0));
        snaps[k][0] = th_snapshot(&D[k].y.buf);
        snaps[k][1] = th_snapshot(&D[k].dx.buf);
        for (int i = 0; i < NP; i++) snaps[k][2 + i] = D[k].gp[i].buf.ptr ? th_snapshot(&D[k].gp[i].buf) : NULL;
    }
    TH_CHECK(memcmp(snaps[0][0], snaps[1][0], (size_t)D[0].y.buf.n * fg_dtype_size(dt)) == 0, "[%s] %s y differs", label, mode);
    const bool same_grads = lean == FG_ENCODER_SAVE_MIN;
    if (same_grads)
        TH_CHECK(memcmp(snaps[0][1], snaps[1][1], (size_t)D[0].dx.buf.n * fg_dtype_size(dt)) == 0, "[%s] %s dx differs", label, mode);
    for (int i = 0; i < NP; i++)
        if (same_grads && snaps[0][2 + i])
            TH_CHECK(memcmp(snaps[0][2 + i], snaps[1][2 + i], (size_t)D[0].gp[i].buf.n * fg_dtype_size(dt)) == 0,
                     "[%s] %s d%s differs", label, mode, pname[i]);
    /* evaluation, the cache given as fg_encoder_layer_sizes sized it for training */
    void *ev[2];
    for (int k = 0; k < 2; k++) {
        D[k].run.train = 0;
        TH_OK(dev_forward(&D[k], true));
        ev[k] = th_snapshot(&D[k].y.buf);
    }
    TH_CHECK(memcmp(ev[0], ev[1], (size_t)D[0].y.buf.n * fg_dtype_size(dt)) == 0, "[%s] %s evaluation y differs", label,
             mode);
    for (int k = 0; k < 2; k++) {
        free(ev[k]);
        for (int i = 0; i < NP + 2; i++) free(snaps[k][i]);
        teardown(&P[k], &r[k], &D[k]);
    }
}

static cfg base_cfg(int norm) {
    cfg c;
    memset(&c, 0, sizeof c);
    c.B = 2, c.L = 5, c.d = 8, c.H = 2, c.dff = 12;
    c.norm = norm, c.act = FG_ACT_GELU;
    c.packed = true, c.bias = true, c.affine = true, c.train = true;
    c.seed = th_rand_u64(), c.off = th_rand_u64() % 1000;
    return c;
}

/* ------------------------------------------------------------------ finite differences (f64) */

typedef struct fd_arg {
    dev *D;
} fd_arg;

static fg_status fd_forward(fg_context *ctx, void *arg) {
    (void)ctx;
    return dev_forward(((fd_arg *)arg)->D, true);
}

static void fd_case(int norm) {
    cfg c = base_cfg(norm);
    c.p = 0.2, c.p_ff = 0.1, c.p_attn = 0.15, c.resid = true, c.causal = norm == 0, c.lengths = norm == 3;
    c.packed = norm != 3;
    char label[256];
    label_of(&c, FG_BACKEND_CPU, FG_F64, label, sizeof label);
    hostp P;
    ref r;
    dev D;
    setup(&c, FG_BACKEND_CPU, FG_F64, &P, &r, &D);
    TH_OK(dev_forward(&D, true));
    TH_OK(dev_backward(&D, 0));
    fd_arg a = {&D};
    th_operand *params[6], *grads[6];
    const char *names[6];
    int n = 0;
    params[n] = &D.x, grads[n] = &D.dx, names[n++] = "x";
    params[n] = &D.sin, grads[n] = &D.dsin, names[n++] = "scores_in";
    if (c.packed) params[n] = &D.packw, grads[n] = &D.gpackw, names[n++] = "w_qkv";
    else params[n] = &D.p[WK], grads[n] = &D.gp[WK], names[n++] = "w_k";
    params[n] = &D.p[W1], grads[n] = &D.gp[W1], names[n++] = "w_1";
    params[n] = &D.p[N1W], grads[n] = &D.gp[N1W], names[n++] = "norm1_w";
    params[n] = &D.p[BO], grads[n] = &D.gp[BO], names[n++] = "b_o";
    th_fd_check(D.ctx, label, fd_forward, &a, &D.y, &D.dy, params, grads, names, n, 6, false);
    teardown(&P, &r, &D);
}

/* ------------------------------------------------------------------ bad inputs */

static void bad_cases(fg_backend be) {
    cfg c = base_cfg(FG_ENCODER_POST_BATCH);
    c.resid = true;
    hostp P;
    ref r;
    dev D;
    setup(&c, be, FG_F32, &P, &r, &D);
    th_operand *y = &D.y;
    fg_encoder_layer_desc e = D.desc;
#define BAD_DESC(field, value, status, needle)                                                                    \
    do {                                                                                                          \
        D.desc = e;                                                                                               \
        D.desc.field = value;                                                                                     \
        TH_EXPECT_BAD(status, needle, y, dev_forward(&D, true));                                                  \
        TH_EXPECT_BAD(status, needle, &D.dx, dev_backward(&D, 0));                                                \
    } while (0)
    BAD_DESC(heads, 3, FG_ERR_INVALID_VALUE, "desc->heads (3) must divide desc->d_model (8)");
    BAD_DESC(heads, 0, FG_ERR_INVALID_VALUE, "desc->heads");
    BAD_DESC(d_model, 0, FG_ERR_INVALID_VALUE, "desc->d_model");
    BAD_DESC(d_ff, 0, FG_ERR_INVALID_VALUE, "desc->d_ff");
    BAD_DESC(activation, FG_ACT_TANH, FG_ERR_INVALID_VALUE, "desc->activation");
    BAD_DESC(norm, (fg_encoder_norm)7, FG_ERR_INVALID_VALUE, "desc->norm");
    BAD_DESC(norm_eps, -1.0, FG_ERR_INVALID_VALUE, "desc->norm_eps");
    BAD_DESC(bn_momentum, 1.5, FG_ERR_INVALID_VALUE, "desc->bn_momentum");
    BAD_DESC(attn_scale, INFINITY, FG_ERR_INVALID_VALUE, "desc->attn_scale");
    BAD_DESC(causal, 2, FG_ERR_INVALID_VALUE, "desc->causal");
    BAD_DESC(residual_scores, 0, FG_ERR_INVALID_VALUE, "residual_scores is 0");
    BAD_DESC(dropout, 1.0, FG_ERR_INVALID_VALUE, "desc->dropout");
    BAD_DESC(dropout_ffn, -0.1, FG_ERR_INVALID_VALUE, "desc->dropout_ffn");
    BAD_DESC(dropout_attn, NAN, FG_ERR_INVALID_VALUE, "desc->dropout_attn");
    BAD_DESC(dropout_proj, 1.0, FG_ERR_INVALID_VALUE, "desc->dropout_proj");
    BAD_DESC(save, (fg_encoder_save)3, FG_ERR_INVALID_VALUE, "desc->save");
    BAD_DESC(d_model, 16, FG_ERR_SHAPE, "desc->d_model=16");
    D.desc = e;
#undef BAD_DESC
    /* run options */
    D.run.train = 2;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "run->train", y, dev_forward(&D, true));
    D.run.train = 0;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "training forward", &D.dx, dev_backward(&D, 0));
    D.run.train = 1;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "accumulate", &D.dx, dev_backward(&D, 2));
    /* NULL pointers */
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "ctx", y,
                  fg_encoder_layer_forward(NULL, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "desc", y,
                  fg_encoder_layer_forward(D.ctx, NULL, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "run", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, NULL, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "x", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, NULL, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "params", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, NULL, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "y is NULL", &D.x,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, NULL, NULL,
                                           D.cache.ptr, D.cache_bytes));
    {   /* SAVE_MIN's training forward places its temporaries in the caller's workspace */
        fg_encoder_layer_desc m = D.desc;
        m.save = FG_ENCODER_SAVE_MIN;
        size_t cb = 0, wb = 0;
        TH_OK(fg_encoder_layer_sizes(&m, FG_F32, c.B, c.L, &cb, &wb));
        TH_CHECK(cb < D.cache_bytes && wb > 0, "SAVE_MIN: cache %zu (SAVE_ALL %zu), workspace %zu", cb, D.cache_bytes, wb);
        TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "fg_encoder_layer_forward_ws", y,
                      fg_encoder_layer_forward(D.ctx, &m, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                               D.cache.ptr, D.cache_bytes));
        TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "workspace is NULL", y,
                      fg_encoder_layer_forward_ws(D.ctx, &m, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                                  D.cache.ptr, D.cache_bytes, NULL, 0));
        th_buf ws = th_alloc(be, FG_F32, (int64_t)(wb / 4 + 1));
        TH_EXPECT_BAD(FG_ERR_WORKSPACE, "workspace holds", y,
                      fg_encoder_layer_forward_ws(D.ctx, &m, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                                  D.cache.ptr, D.cache_bytes, ws.ptr, wb - 1));
        TH_EXPECT_BAD(FG_ERR_MISALIGNED, "16-byte", y,
                      fg_encoder_layer_forward_ws(D.ctx, &m, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                                  D.cache.ptr, D.cache_bytes, (char *)ws.ptr + 4, wb));
        th_free(&ws);
        TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", y,
                      fg_encoder_layer_forward_ws(D.ctx, &m, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                                  D.cache.ptr, D.cache_bytes, D.cache.ptr, D.cache_bytes));
    }
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "cache is NULL", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           NULL, 0));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "dy is NULL", &D.dx,
                  fg_encoder_layer_backward(D.ctx, &D.desc, &D.run, NULL, NULL, &D.x.t, NULL, &D.sin.t, &D.params,
                                            D.cache.ptr, D.cache_bytes, &D.dx.t, NULL, &D.grads, 0, D.ws.ptr,
                                            D.ws_bytes));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "workspace is NULL", &D.dx,
                  fg_encoder_layer_backward(D.ctx, &D.desc, &D.run, &D.dy.t, NULL, &D.x.t, NULL, &D.sin.t, &D.params,
                                            D.cache.ptr, D.cache_bytes, &D.dx.t, NULL, &D.grads, 0, NULL, 0));
    /* cache and workspace too small, misaligned */
    TH_EXPECT_BAD(FG_ERR_WORKSPACE, "cache holds", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes - 1));
    TH_EXPECT_BAD(FG_ERR_WORKSPACE, "workspace holds", &D.dx,
                  fg_encoder_layer_backward(D.ctx, &D.desc, &D.run, &D.dy.t, NULL, &D.x.t, NULL, &D.sin.t, &D.params,
                                            D.cache.ptr, D.cache_bytes, &D.dx.t, NULL, &D.grads, 0, D.ws.ptr,
                                            D.ws_bytes - 256));
    TH_EXPECT_BAD(FG_ERR_MISALIGNED, "16-byte", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           (char *)D.cache.ptr + 4, D.cache_bytes - 4));
    /* tensors: shape, dtype, contiguity, absent / extra parameters */
    fg_encoder_layer_params p0 = D.params, g0 = D.grads;
    fg_tensor t;
    t = D.params.w_o, t.shape[1] = 4, D.params.w_o = t;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "params->w_o", y, dev_forward(&D, true));
    D.params = p0;
    t = D.params.b_1, t.dtype = FG_F64, D.params.b_1 = t;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "params->b_1", y, dev_forward(&D, true));
    D.params = p0;
    t = D.params.w_1, t.stride[0] = 1, t.stride[1] = c.dff, D.params.w_1 = t;
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "params->w_1 must be contiguous", y, dev_forward(&D, true));
    D.params = p0;
    memset(&D.params.w_2, 0, sizeof(fg_tensor));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "params->w_2 is absent", y, dev_forward(&D, true));
    D.params = p0;
    D.params.w_q = D.p[WO].t;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "never both", y, dev_forward(&D, true));
    D.params = p0;
    memset(&D.params.w_qkv, 0, sizeof(fg_tensor));
    memset(&D.params.b_qkv, 0, sizeof(fg_tensor));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "w_qkv (or w_q, w_k, w_v) is absent", y, dev_forward(&D, true));
    D.params.w_q = D.p[WO].t, D.params.w_k = D.p[WO].t;
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "params->w_v is absent", y, dev_forward(&D, true));
    D.params = p0;
    memset(&D.params.running_var2, 0, sizeof(fg_tensor));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "running_var2", y, dev_forward(&D, true));
    D.params = p0;
    t = D.x.t, t.dtype = FG_BF16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "params->w_qkv", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    t = D.x.t, t.dtype = FG_I32;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "x.dtype", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &t, NULL, &D.sin.t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    t = D.y.t, t.shape[1] = 4;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "y is", &D.dx,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    t = D.sin.t, t.shape[3] = 2;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "scores_in", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &t, &D.params, &D.y.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    t = D.len.t.rank ? D.len.t : D.x.t;
    {
        const int64_t sl[1] = {c.B + 1};
        th_operand badlen = th_make(be, FG_I64, 1, sl, 0);
        TH_EXPECT_BAD(FG_ERR_SHAPE, "lengths", y,
                      fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, &badlen.t, &D.sin.t, &D.params, &D.y.t,
                                               NULL, D.cache.ptr, D.cache_bytes));
        th_drop(&badlen);
    }
    /* overlaps: y over x, y over a weight, dx over dy, a gradient over the cache */
    TH_EXPECT_BAD(FG_ERR_ALIAS, "output y overlaps x", &D.x,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.x.t, NULL,
                                           D.cache.ptr, D.cache_bytes));
    TH_EXPECT_BAD(FG_ERR_ALIAS, "scores_out", y,
                  fg_encoder_layer_forward(D.ctx, &D.desc, &D.run, &D.x.t, NULL, &D.sin.t, &D.params, &D.y.t, &D.sin.t,
                                           D.cache.ptr, D.cache_bytes));
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", &D.dy,
                  fg_encoder_layer_backward(D.ctx, &D.desc, &D.run, &D.dy.t, NULL, &D.x.t, NULL, &D.sin.t, &D.params,
                                            D.cache.ptr, D.cache_bytes, &D.dy.t, NULL, &D.grads, 0, D.ws.ptr,
                                            D.ws_bytes));
    D.grads.w_o = D.p[WO].t;
    TH_EXPECT_BAD(FG_ERR_ALIAS, "grads->w_o overlaps params->w_o", &D.dx, dev_backward(&D, 0));
    D.grads = g0;
    /* a gradient present where its parameter is absent; dscores_in without scores_in */
    D.grads.b_q = D.gp[BO].t;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "grads->b_q is given but params->b_q is absent", &D.dx, dev_backward(&D, 0));
    D.grads = g0;
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "dscores_in is requested", &D.dx,
                  fg_encoder_layer_backward(D.ctx, &D.desc, &D.run, &D.dy.t, NULL, &D.x.t, NULL, NULL, &D.params,
                                            D.cache.ptr, D.cache_bytes, &D.dx.t, &D.dsin.t, &D.grads, 0, D.ws.ptr,
                                            D.ws_bytes));
    /* sizes */
    size_t cbytes = 0, wbytes = 0;
    TH_CHECK(fg_encoder_layer_sizes(&e, FG_I64, 2, 3, &cbytes, &wbytes) == FG_ERR_DTYPE, "sizes: i64 accepted");
    TH_CHECK(fg_encoder_layer_sizes(&e, FG_F32, -1, 3, &cbytes, &wbytes) == FG_ERR_SHAPE, "sizes: B = -1 accepted");
    TH_CHECK(fg_encoder_layer_sizes(&e, FG_F32, INT64_MAX / 2, 4, &cbytes, &wbytes) == FG_ERR_OVERFLOW,
             "sizes: an overflowing B·L accepted");
    TH_CHECK(fg_encoder_layer_sizes(NULL, FG_F32, 2, 3, &cbytes, &wbytes) == FG_ERR_NULL_POINTER, "sizes: NULL desc");
    /* BatchNorm training with one token */
    teardown(&P, &r, &D);
}

/* An f64 layer's BatchNorm keeps f64 running statistics: f32 ones are refused up front (found by the
   fuzzer: they were refused by the BatchNorm part, after the parts before it had written). */
static void f64_stats_case(void) {
    cfg c = base_cfg(FG_ENCODER_POST_BATCH);
    hostp P;
    ref r;
    dev D;
    setup(&c, FG_BACKEND_CPU, FG_F64, &P, &r, &D);
    const fg_encoder_layer_params p0 = D.params;
    D.params.running_mean1.dtype = D.params.running_var1.dtype = FG_F32;
    void *cache0 = th_snapshot(&D.cache);
    TH_EXPECT_BAD(FG_ERR_DTYPE, "params->running_mean1 is f32", &D.y, dev_forward(&D, true));
    TH_CHECK(th_unchanged(&D.cache, cache0), "f64 layer, f32 running statistics: the cache was written");
    free(cache0);
    D.params = p0;
    TH_OK(dev_forward(&D, true));
    teardown(&P, &r, &D);
}

/* An empty batch: nothing to compute, the gradients are sums over nothing (zeros). */
static void empty_case(fg_backend be) {
    cfg c = base_cfg(FG_ENCODER_PRE_LAYER);
    c.B = 0;
    hostp P;
    ref r;
    dev D;
    setup(&c, be, FG_F32, &P, &r, &D);
    TH_CHECK(D.cache_bytes == 0 && D.ws_bytes == 0, "empty: sizes %zu, %zu", D.cache_bytes, D.ws_bytes);
    TH_OK(dev_forward(&D, true));
    TH_OK(dev_backward(&D, 0));
    double *z = dalloc(3 * c.d * c.d);
    th_verify("w_qkv (empty)", &D.gpackw, z, 0, "empty batch");
    th_verify("w_1 (empty)", &D.gp[W1], z, 0, "empty batch");
    free(z);
    teardown(&P, &r, &D);
}

/* Dropout: another seed gives other bits; masks are those of the reference (checked above). */
static void seed_case(fg_backend be) {
    cfg c = base_cfg(FG_ENCODER_PRE_LAYER);
    c.p = 0.3, c.p_ff = 0.3, c.p_attn = 0.3;
    hostp P;
    ref r;
    dev D;
    setup(&c, be, FG_F32, &P, &r, &D);
    TH_OK(dev_forward(&D, true));
    void *y1 = th_snapshot(&D.y.buf);
    D.run.seed ^= 1;
    TH_OK(dev_forward(&D, true));
    TH_CHECK(!th_unchanged(&D.y.buf, y1), "another seed gave the same y");
    D.run.seed ^= 1, D.run.offset += 1;
    TH_OK(dev_forward(&D, true));
    TH_CHECK(!th_unchanged(&D.y.buf, y1), "another offset gave the same y");
    D.run.offset -= 1;
    TH_OK(dev_forward(&D, true));
    TH_CHECK(th_unchanged(&D.y.buf, y1), "the same seed gave other bits");
    free(y1);
    teardown(&P, &r, &D);
}

int main(void) {
    th_init("test_encoder");
    fg_backend bes[2];
    const int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        const fg_backend be = bes[bi];
        const fg_dtype dts[3] = {FG_F64, FG_F32, FG_BF16};
        for (int norm = 0; norm < 4; norm++) {
            for (int di = 0; di < 3; di++) {
                const fg_dtype dt = dts[di];
                if (dt == FG_F64 && be == FG_BACKEND_CUDA) continue;
                for (int pk = 0; pk < 2; pk++) {
                    cfg c = base_cfg(norm);
                    c.packed = pk;
                    run_case(&c, be, dt, pk == 1 && dt == FG_F32);
                }
                cfg c = base_cfg(norm); /* everything on */
                c.p = 0.2, c.p_ff = 0.1, c.p_attn = 0.25, c.resid = true, c.dscores = true, c.lengths = true;
                c.p_proj = 0.2; /* PatchTST's two dropouts on the attention branch */
                c.causal = norm % 2 == 0;
                c.B = 3, c.L = 7, c.d = 12, c.H = 3, c.dff = 20;
                c.packed = norm % 2;
                run_case(&c, be, dt, dt != FG_BF16);
                c = base_cfg(norm); /* no biases, no norm affine, one token a sequence */
                c.bias = false, c.affine = false, c.L = norm == 3 ? 2 : 1, c.B = 3;
                run_case(&c, be, dt, false);
                c = base_cfg(norm); /* evaluation */
                c.train = false, c.p = 0.5, c.p_ff = 0.5, c.p_attn = 0.5, c.resid = true, c.lengths = true;
                run_case(&c, be, dt, false);
            }
            cfg c = base_cfg(norm); /* an explicit scale and eps, f16 */
            c.scale = 0.3, c.eps = 1e-3, c.mom = 0.25;
            run_case(&c, be, FG_F16, false);
            c = base_cfg(norm);
            c.p = 0.1, c.p_ff = 0.2, c.resid = true;
            save_case(&c, be, FG_F32, FG_ENCODER_SAVE_LESS);
            save_case(&c, be, FG_F32, FG_ENCODER_SAVE_MIN);
            save_case(&c, be, FG_BF16, FG_ENCODER_SAVE_MIN);
            c.save = FG_ENCODER_SAVE_LESS, c.p_attn = 0.1, c.dscores = true; /* SAVE_LESS against the reference */
            run_case(&c, be, FG_F32, true);
            run_case(&c, be, FG_BF16, false);
            c = base_cfg(norm); /* SAVE_MIN against the reference, with the accumulate and rerun extras */
            c.save = FG_ENCODER_SAVE_MIN, c.p = 0.1, c.p_ff = 0.2, c.p_attn = 0.1, c.resid = true, c.dscores = true;
            run_case(&c, be, FG_F32, true);
        }
        for (int act = 0; act < 4; act++) {
            static const int acts[4] = {FG_ACT_GELU, FG_ACT_GELU_TANH, FG_ACT_RELU, FG_ACT_SILU};
            cfg c = base_cfg(act % 4);
            c.act = acts[act];
            run_case(&c, be, be == FG_BACKEND_CPU ? FG_F64 : FG_F32, false);
            run_case(&c, be, FG_F32, false);
        }
        for (int norm = 0; norm < 4; norm += 3) { /* d and d_ff multiples of 8 (16-byte rows in 16 bits): on
            CUDA the FFN's short-K tile forward and the one-kernel backward (SAVE_LESS: the gradient tile) */
            cfg c = base_cfg(norm);
            c.d = 16, c.H = 4, c.dff = 32, c.L = 6, c.B = 3;
            c.p = 0.1, c.p_ff = 0.2, c.p_attn = 0.1, c.resid = true, c.dscores = norm == 3;
            run_case(&c, be, FG_BF16, false);
            run_case(&c, be, FG_F16, false);
            save_case(&c, be, FG_BF16, FG_ENCODER_SAVE_MIN);
            /* SAVE_LESS against the reference only: on CUDA its backward (pre recomputed in the gradient
               tile, dx and dW by GEMMs) sums in another order than SAVE_ALL's one-kernel backward */
            c.save = FG_ENCODER_SAVE_LESS;
            run_case(&c, be, FG_BF16, false);
        }
        {
            cfg c = base_cfg(FG_ENCODER_PRE_LAYER); /* awkward sizes */
            c.B = 2, c.L = 17, c.d = 20, c.H = 5, c.dff = 33, c.causal = true, c.lengths = true, c.p = 0.1;
            run_case(&c, be, FG_F32, false);
        }
        bad_cases(be);
        empty_case(be);
        if (be == FG_BACKEND_CPU) f64_stats_case();
        seed_case(be);
    }
    for (int norm = 0; norm < 4; norm++) fd_case(norm);
    return th_finish("test_encoder");
}

/*
 * linear_logp.c — the CPU backend's row steps of the linear log-prob family (see the
 * step list in core/internal.h; the driver and its GEMMs are in ops/linear_logp.c).
 * Everything is computed in f64 whatever the storage dtype; loops over rows run in
 * parallel, every sum runs in a fixed order, so the results do not depend on timing.
 */
#include "../core/internal.h"

#include <math.h>
#include <stdint.h>

static int threads(const fg_context *ctx) { return ctx->num_threads > 0 ? ctx->num_threads : 0; }

static int64_t target_at(const fg_logp_call *c, int64_t r) {
    return c->target_dtype == FG_I32 ? (int64_t)((const int32_t *)c->target)[r] : ((const int64_t *)c->target)[r];
}

/* 0: a class, 1: ignored, 2: out of range */
static int target_kind(const fg_logp_call *c, int64_t t) {
    if (c->use_ignore && t == c->ignore_index) return 1;
    return (t < 0 || t >= c->V) ? 2 : 0;
}

static double ld(const void *p, fg_dtype t, int64_t i) { return p ? fg_load_f64(p, t, i) : 0.0; }

/* logit L from z, and dL/dz */
static inline double logit(const fg_logp_call *c, double z, double *dldz) {
    if (c->softcap > 0.0) {
        double th = tanh(z / c->softcap);
        if (dldz) *dldz = (1.0 - th * th) * c->inv_temp;
        return c->softcap * th * c->inv_temp;
    }
    if (dldz) *dldz = c->inv_temp;
    return z * c->inv_temp;
}

static void stats(const fg_context *ctx, const fg_logp_call *c) {
    const int nt = threads(ctx);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->rows * c->cols > 65536)
    for (int64_t i = 0; i < c->rows; i++) {
        const int64_t r = c->r0 + i;
        double m = -INFINITY, s = 0.0, a = 0.0, u = 0.0, zt = NAN;
        int64_t base = i * c->ld;
        for (int64_t j = 0; j < c->cols; j++) {
            double L = logit(c, fg_load_f64(c->z, c->dtype, base + j), NULL);
            if (L > m || isnan(L)) m = L;
            u += L;
        }
        for (int64_t j = 0; j < c->cols; j++) {
            double L = logit(c, fg_load_f64(c->z, c->dtype, base + j), NULL);
            double e = isinf(m) && m < 0 ? 0.0 : exp(L - m);
            s += e;
            a += e * L;
        }
        int64_t t = target_at(c, r);
        if (t >= c->v0 && t < c->v0 + c->cols) zt = logit(c, fg_load_f64(c->z, c->dtype, base + t - c->v0), NULL);
        double prev[5];
        for (int k = 0; k < 5; k++) prev[k] = c->first ? 0.0 : fg_load_f64(c->state, c->acc, 5 * r + k);
        if (!c->first) {
            double m0 = prev[0], mn = m0 > m || isnan(m0) ? m0 : m;
            double f0 = isinf(mn) && mn < 0 ? 0.0 : exp(m0 - mn), f1 = isinf(mn) && mn < 0 ? 0.0 : exp(m - mn);
            s = prev[1] * f0 + s * f1;
            a = prev[3] * f0 + a * f1;
            m = mn;
            u += prev[4];
            if (isnan(zt)) zt = prev[2];
        }
        fg_store_f64(c->state, c->acc, 5 * r + 0, m);
        fg_store_f64(c->state, c->acc, 5 * r + 1, s);
        fg_store_f64(c->state, c->acc, 5 * r + 2, zt);
        fg_store_f64(c->state, c->acc, 5 * r + 3, a);
        fg_store_f64(c->state, c->acc, 5 * r + 4, u);
    }
}

/* Row results: FORWARD, CE and COEF share the target handling. Returns the first bad row or -1. */
static int64_t rows_step(const fg_context *ctx, const fg_logp_call *c) {
    const int nt = threads(ctx);
    int64_t bad = INT64_MAX;
    const double scale = c->step == FG_LOGP_CE ? fg_load_f64(c->scale, c->acc, 0) : 1.0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(min : bad) if (nt != 1 && c->rows > 4096)
    for (int64_t i = 0; i < c->rows; i++) {
        const int64_t r = c->r0 + i;
        const int kind = target_kind(c, target_at(c, r));
        if (kind == 2 && r < bad) bad = r;
        if (c->step == FG_LOGP_COEF) {
            double A = 0, B = 0, C = 0, lse = 0, H = 0;
            if (kind == 2) {
                A = B = C = lse = H = NAN;
            } else if (kind == 0) {
                double dl = ld(c->dlogp, c->acc, r);
                A = dl;
                B = ld(c->dlse, c->acc, r) - dl;
                C = -ld(c->dentropy, c->acc, r);
                lse = fg_load_f64(c->lse_in, c->acc, r);
                H = ld(c->entropy_in, c->acc, r);
            }
            double rc[6] = {A, B, C, 0.0, lse, H};
            for (int k = 0; k < 6; k++) fg_store_f64(c->rc, c->acc, 6 * r + k, rc[k]);
            continue;
        }
        double st[5];
        for (int k = 0; k < 5; k++) st[k] = fg_load_f64(c->state, c->acc, 5 * r + k);
        double lse = st[0] + log(st[1]);
        double logp = st[2] - lse, ent = lse - st[3] / st[1];
        if (kind == 1) lse = logp = ent = 0.0;
        if (kind == 2) lse = logp = ent = NAN;
        if (c->step == FG_LOGP_FORWARD) {
            if (c->logp) fg_store_f64(c->logp, c->acc, r, logp);
            if (c->lse) fg_store_f64(c->lse, c->acc, r, lse);
            if (c->entropy) fg_store_f64(c->entropy, c->acc, r, ent);
            continue;
        }
        /* CE */
        const double eps = c->label_smoothing, w = c->row_weight ? fg_load_f64(c->row_weight, c->acc, r) : 1.0;
        double loss = 0.0, rc[6] = {0, 0, 0, 0, 0, 0};
        if (kind != 1) {
            double mean_logp = st[4] / (double)c->V - lse;
            loss = w * (-(1.0 - eps) * logp - eps * mean_logp + c->z_loss * lse * lse);
            double ws = w * scale;
            rc[0] = -(1.0 - eps) * ws;
            rc[1] = ws * (1.0 + 2.0 * c->z_loss * lse);
            rc[3] = -eps * ws / (double)c->V;
            rc[4] = lse;
            if (kind == 2) rc[0] = rc[1] = rc[3] = rc[4] = NAN;
        }
        if (c->loss_rows) fg_store_f64(c->loss_rows, c->acc, r, loss);
        if (c->lse) fg_store_f64(c->lse, c->acc, r, lse);
        for (int k = 0; k < 6; k++) fg_store_f64(c->rc, c->acc, 6 * r + k, rc[k]);
    }
    return bad == INT64_MAX ? -1 : bad;
}

/* dz of tile element (i, j) from the logit z holds there, row i's coefficients rc */
static double dz_at(const fg_logp_call *c, const double rc[6], int64_t i, int64_t j) {
    if (rc[0] == 0.0 && rc[1] == 0.0 && rc[2] == 0.0 && rc[3] == 0.0) return 0.0;
    const int64_t t = target_at(c, c->r0 + i) - c->v0;
    double dldz, L = logit(c, fg_load_f64(c->z, c->dtype, i * c->ld + j), &dldz);
    double p = exp(L - rc[4]);
    double dL = (j == t ? rc[0] : 0.0) + rc[1] * p + rc[2] * p * (L - rc[4] + rc[5]) + rc[3];
    return dL * dldz;
}

static void row_coefs(const fg_logp_call *c, int64_t i, double rc[6]) {
    for (int k = 0; k < 6; k++) rc[k] = fg_load_f64(c->rc, c->acc, 6 * (c->r0 + i) + k);
}

static void grad(const fg_context *ctx, const fg_logp_call *c) {
    const int nt = threads(ctx);
    if (c->db_acc) { /* db first, from the unrounded dz (as the CUDA pass sums them), rows in order */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->rows * c->cols > 65536)
        for (int64_t j = 0; j < c->cols; j++) {
            double sum = c->first ? 0.0 : fg_load_f64(c->db_acc, c->acc, c->v0 + j), rc[6];
            for (int64_t i = 0; i < c->rows; i++) {
                row_coefs(c, i, rc);
                sum += dz_at(c, rc, i, j);
            }
            fg_store_f64(c->db_acc, c->acc, c->v0 + j, sum);
        }
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->rows * c->cols > 65536)
    for (int64_t i = 0; i < c->rows; i++) {
        double rc[6];
        row_coefs(c, i, rc);
        for (int64_t j = 0; j < c->cols; j++) fg_store_f64(c->z, c->dtype, i * c->ld + j, dz_at(c, rc, i, j));
    }
}

fg_status fg_cpu_logp(fg_context *ctx, const fg_logp_call *c) {
    switch (c->step) {
    case FG_LOGP_STATS:
        stats(ctx, c);
        return FG_OK;
    case FG_LOGP_FORWARD:
    case FG_LOGP_CE:
    case FG_LOGP_COEF: {
        int64_t bad = rows_step(ctx, c);
        if (bad >= 0) fg_host_flag_raise(ctx, FG_FLAG_BAD_TARGET, bad);
        return FG_OK;
    }
    case FG_LOGP_COUNT: {
        int64_t count = 0;
        for (int64_t r = 0; r < c->N; r++) count += target_kind(c, target_at(c, r)) != 1;
        const bool mean = c->reduction == FG_REDUCTION_MEAN;
        const double inv = mean ? 1.0 / (double)(count > 0 ? count : 1) : 1.0;
        fg_store_f64(c->scale, c->acc, 0, c->grad_scale * inv);
        fg_store_f64(c->scale, c->acc, 1, inv);
        return FG_OK;
    }
    case FG_LOGP_GRAD:
        grad(ctx, c);
        return FG_OK;
    case FG_LOGP_REDUCE: {
        double sum = 0.0;
        for (int64_t r = 0; r < c->N; r++) sum += fg_load_f64(c->loss_rows, c->acc, r);
        fg_store_f64(c->loss_out, c->acc, 0, sum * fg_load_f64(c->scale, c->acc, 1));
        return FG_OK;
    }
    case FG_LOGP_CAST: {
        const int nt = threads(ctx);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->n > 65536)
        for (int64_t i = 0; i < c->n; i++) {
            double v = fg_load_f64(c->src, c->acc, i);
            if (c->accumulate) v += fg_load_f64(c->dst, c->dst_dtype, i);
            fg_store_f64(c->dst, c->dst_dtype, i, v);
        }
        return FG_OK;
    }
    }
    return fg_fail(FG_ERR_INTERNAL, "cpu linear_logp: unknown step %d", (int)c->step);
}

/*
 * linear_logp.c — the CPU backend's row steps of the linear log-prob family (see the
 * step list in core/internal.h; the driver and its GEMMs are in ops/linear_logp.c).
 *
 * The two steps that touch every logit of a tile, STATS and GRAD, run f32 math on f32 /
 * f16 / bf16 tiles (src/cpu/vec.h's exp and tanh, written so the loops vectorize;
 * FG_CPU_CLONES: AVX-512, AVX2, baseline) with f64 sums, and f64 math on f64 tiles.
 * STATS is two sweeps of each row (max and Σ L, then Σ e^(L−m) and Σ e^(L−m)·L; the second
 * finds the row in cache), the sums of a row in 16 interleaved partial sums added in lane
 * order. GRAD turns the tile into dz and sums db's columns in the same sweep: with db the
 * threads split the columns and each walks every row in order, without it they split the
 * rows. The per-row steps and the reductions stay in f64. Every sum has a fixed order that
 * does not depend on the thread count.
 */
#include "cpu.h"
#include "vec.h"

#include <math.h>
#include <stdint.h>

static int64_t target_at(const fg_logp_call *c, int64_t r) {
    return c->target_dtype == FG_I32 ? (int64_t)((const int32_t *)c->target)[r] : ((const int64_t *)c->target)[r];
}

/* 0: a class, 1: ignored, 2: out of range */
static int target_kind(const fg_logp_call *c, int64_t t) {
    if (c->use_ignore && t == c->ignore_index) return 1;
    return (t < 0 || t >= c->V) ? 2 : 0;
}

/* Row r's target as a column of a block whose first column is the shard's column c0: −1
   when the block does not hold it (another shard's class, ignored, out of range). */
static int64_t local_target(const fg_logp_call *c, int64_t r, int64_t c0) {
    const int64_t t = target_at(c, r), t0 = c->vstart + c0;
    return t >= t0 && t - t0 < c->vslice - c0 ? t - t0 : -1;
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
    const int team_ = fg_cpu_team(ctx, c->rows * c->cols, 32768);
#pragma omp parallel for schedule(static) num_threads(team_) if (team_ > 1)
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
        const int64_t t = target_at(c, r), t0 = c->vstart + c->v0; /* the tile's first class */
        if (t >= t0 && t < t0 + c->cols) zt = logit(c, fg_load_f64(c->z, c->dtype, base + (t - t0)), NULL);
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
    int64_t bad = INT64_MAX;
    const double scale = c->step == FG_LOGP_CE ? fg_load_f64(c->scale, c->acc, 0) : 1.0;
    const int team_ = fg_cpu_team(ctx, c->rows, 2048);
#pragma omp parallel for schedule(static) num_threads(team_) reduction(min : bad) if (team_ > 1)
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
            if (c->shard && kind == 0) { /* the parts: L[target] where this shard holds it, else 0 */
                logp = local_target(c, r, 0) >= 0 ? st[2] : 0.0;
            }
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
    const int64_t t = local_target(c, c->r0 + i, c->v0);
    double dldz, L = logit(c, fg_load_f64(c->z, c->dtype, i * c->ld + j), &dldz);
    double p = exp(L - rc[4]);
    double dL = (j == t ? rc[0] : 0.0) + rc[1] * p + rc[2] * p * (L - rc[4] + rc[5]) + rc[3];
    return dL * dldz;
}

static void row_coefs(const fg_logp_call *c, int64_t i, double rc[6]) {
    for (int k = 0; k < 6; k++) rc[k] = fg_load_f64(c->rc, c->acc, 6 * (c->r0 + i) + k);
}

static void grad(const fg_context *ctx, const fg_logp_call *c) {
    const int team_ = fg_cpu_team(ctx, c->rows * c->cols, 32768);
    if (c->db_acc) { /* db first, from the unrounded dz (as the CUDA pass sums them), rows in order */
#pragma omp parallel for schedule(static) num_threads(team_) if (team_ > 1)
        for (int64_t j = 0; j < c->cols; j++) {
            double sum = c->first ? 0.0 : fg_load_f64(c->db_acc, c->acc, c->v0 + j), rc[6];
            for (int64_t i = 0; i < c->rows; i++) {
                row_coefs(c, i, rc);
                sum += dz_at(c, rc, i, j);
            }
            fg_store_f64(c->db_acc, c->acc, c->v0 + j, sum);
        }
    }
#pragma omp parallel for schedule(static) num_threads(team_) if (team_ > 1)
    for (int64_t i = 0; i < c->rows; i++) {
        double rc[6];
        row_coefs(c, i, rc);
        for (int64_t j = 0; j < c->cols; j++) fg_store_f64(c->z, c->dtype, i * c->ld + j, dz_at(c, rc, i, j));
    }
}

/* ------------------------------------------------------------------ f32 tiles */

enum { LANES = 256, COLS = 512 };

/* the logit L of z and dL/dz in f32 */
FG_INLINE float logit_f(float z, float inv_temp, float cap, float inv_cap, bool softcap, float *dldz) {
    if (!softcap) {
        if (dldz) *dldz = inv_temp;
        return z * inv_temp;
    }
    float slope;
    const float th = fg_v_tanh_slope(z * inv_cap, &slope);
    if (dldz) *dldz = slope * inv_temp;
    return cap * th * inv_temp;
}

/* STATS of one row (n logits from z, storage t): m, Σ L, Σ e^(L−m), Σ e^(L−m)·L. Each sum
   runs in LANES partial sums (lane l takes the logits j ≡ l mod LANES, in order), added in
   lane order at the end: a fixed order, and loops the compiler vectorizes. */
FG_INLINE void row_stats_typed(const void *z, fg_dtype t, int64_t base, int64_t n, float inv_temp, float cap,
                               float inv_cap, bool softcap, double out[4]) {
    float mx[LANES];
    double u[LANES], s[LANES], a[LANES];
    for (int l = 0; l < LANES; l++) mx[l] = -INFINITY, u[l] = s[l] = a[l] = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += LANES) {
        const int64_t len = n - j0 < LANES ? n - j0 : LANES;
        for (int64_t l = 0; l < len; l++) {
            const float L = logit_f(fg_v_ld(z, t, base + j0 + l), inv_temp, cap, inv_cap, softcap, NULL);
            mx[l] = (L > mx[l] || L != L) ? L : mx[l];
            u[l] += L;
        }
    }
    float m = -INFINITY;
    double us = 0.0;
    for (int l = 0; l < LANES; l++) {
        m = (mx[l] > m || mx[l] != mx[l]) && m == m ? mx[l] : m;
        us += u[l];
    }
    const float mm = isinf(m) && m < 0 ? 0.0f : m; /* every logit −inf: no mass (e = 0 below) */
    float eb[LANES], lb[LANES]; /* the block's e and L, then their sums: two simple loops */
    for (int64_t j0 = 0; j0 < n; j0 += LANES) {
        const int64_t len = n - j0 < LANES ? n - j0 : LANES;
        for (int64_t l = 0; l < len; l++) {
            const float L = logit_f(fg_v_ld(z, t, base + j0 + l), inv_temp, cap, inv_cap, softcap, NULL);
            lb[l] = L;
            eb[l] = fg_v_exp(L - mm);
        }
        for (int64_t l = 0; l < len; l++) {
            s[l] += eb[l];
            a[l] += eb[l] * lb[l];
        }
    }
    double ss = 0.0, as = 0.0;
    for (int l = 0; l < LANES; l++) ss += s[l], as += a[l];
    out[0] = m, out[1] = us, out[2] = ss, out[3] = as;
}

FG_CPU_CLONES
static void row_stats(const fg_logp_call *c, int64_t i, double out[4]) {
    const float inv_temp = (float)c->inv_temp, cap = (float)c->softcap;
    const float inv_cap = c->softcap > 0.0 ? (float)(1.0 / c->softcap) : 0.0f;
    const int64_t base = i * c->ld;
    if (c->softcap > 0.0) {
        if (c->dtype == FG_BF16) row_stats_typed(c->z, FG_BF16, base, c->cols, inv_temp, cap, inv_cap, true, out);
        else if (c->dtype == FG_F16) row_stats_typed(c->z, FG_F16, base, c->cols, inv_temp, cap, inv_cap, true, out);
        else row_stats_typed(c->z, FG_F32, base, c->cols, inv_temp, cap, inv_cap, true, out);
    } else {
        if (c->dtype == FG_BF16) row_stats_typed(c->z, FG_BF16, base, c->cols, inv_temp, cap, inv_cap, false, out);
        else if (c->dtype == FG_F16) row_stats_typed(c->z, FG_F16, base, c->cols, inv_temp, cap, inv_cap, false, out);
        else row_stats_typed(c->z, FG_F32, base, c->cols, inv_temp, cap, inv_cap, false, out);
    }
}

static void stats_f32(const fg_context *ctx, const fg_logp_call *c) {
    const int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t i = 0; i < c->rows; i++) {
        const int64_t r = c->r0 + i;
        double st[4];
        row_stats(c, i, st);
        double m = st[0], u = st[1], s = st[2], a = st[3], zt = NAN;
        const int64_t t = target_at(c, r), t0 = c->vstart + c->v0; /* the tile's first class */
        if (t >= t0 && t < t0 + c->cols) {
            const float inv_cap = c->softcap > 0.0 ? (float)(1.0 / c->softcap) : 0.0f;
            zt = logit_f(fg_v_ld(c->z, c->dtype, i * c->ld + (t - t0)), (float)c->inv_temp, (float)c->softcap,
                         inv_cap, c->softcap > 0.0, NULL);
        }
        if (!c->first) {
            double prev[5];
            for (int k = 0; k < 5; k++) prev[k] = fg_load_f64(c->state, c->acc, 5 * r + k);
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

/* GRAD over rows [r0, r1) and columns [c0, c1) of the tile (t its storage): dz in place, and
   acc[j − c0] += dz of each row in order when acc is not NULL. */
FG_INLINE void grad_typed(const fg_logp_call *c, fg_dtype t, bool softcap, int64_t r0, int64_t r1, int64_t c0,
                          int64_t c1, double *acc) {
    const float inv_temp = (float)c->inv_temp, cap = (float)c->softcap;
    const float inv_cap = softcap ? (float)(1.0 / c->softcap) : 0.0f;
    const int64_t n = c1 - c0;
    void *z = c->z;
    for (int64_t i = r0; i < r1; i++) {
        const float *rc = (const float *)c->rc + 6 * (c->r0 + i);
        const float A = rc[0], B = rc[1], C = rc[2], E = rc[3], lse = rc[4], H = rc[5];
        const int64_t base = i * c->ld + c0;
        if (A == 0.0f && B == 0.0f && C == 0.0f && E == 0.0f) { /* an ignored row */
            for (int64_t j = 0; j < n; j++) fg_v_st(z, t, base + j, 0.0f);
            continue;
        }
        const int64_t tt = local_target(c, c->r0 + i, c->v0 + c0); /* the target's column in the block */
        const float hl = H - lse;
        if (acc) {
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++) {
                float dldz;
                const float L = logit_f(fg_v_ld(z, t, base + j), inv_temp, cap, inv_cap, softcap, &dldz);
                const float p = fg_v_exp(L - lse);
                const float dL = (j == tt ? A : 0.0f) + B * p + C * p * (L + hl) + E;
                const float dz = dL * dldz;
                acc[j] += dz;
                fg_v_st(z, t, base + j, dz);
            }
        } else {
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++) {
                float dldz;
                const float L = logit_f(fg_v_ld(z, t, base + j), inv_temp, cap, inv_cap, softcap, &dldz);
                const float p = fg_v_exp(L - lse);
                const float dL = (j == tt ? A : 0.0f) + B * p + C * p * (L + hl) + E;
                fg_v_st(z, t, base + j, dL * dldz);
            }
        }
    }
}

FG_CPU_CLONES
static void grad_block(const fg_logp_call *c, int64_t r0, int64_t r1, int64_t c0, int64_t c1, double *acc) {
    const bool sc = c->softcap > 0.0;
    if (c->dtype == FG_BF16) {
        if (sc) grad_typed(c, FG_BF16, true, r0, r1, c0, c1, acc);
        else grad_typed(c, FG_BF16, false, r0, r1, c0, c1, acc);
    } else if (c->dtype == FG_F16) {
        if (sc) grad_typed(c, FG_F16, true, r0, r1, c0, c1, acc);
        else grad_typed(c, FG_F16, false, r0, r1, c0, c1, acc);
    } else {
        if (sc) grad_typed(c, FG_F32, true, r0, r1, c0, c1, acc);
        else grad_typed(c, FG_F32, false, r0, r1, c0, c1, acc);
    }
}

/* Columns [c0, c1) of GRAD with db: blocks of COLS columns, all rows in order each. */
static void grad_cols(const fg_logp_call *c, int64_t c0, int64_t c1) {
    double acc[COLS];
    for (int64_t b0 = c0; b0 < c1; b0 += COLS) {
        const int64_t b1 = c1 - b0 < COLS ? c1 : b0 + COLS;
        for (int64_t j = b0; j < b1; j++) acc[j - b0] = c->first ? 0.0 : fg_load_f64(c->db_acc, c->acc, c->v0 + j);
        grad_block(c, 0, c->rows, b0, b1, acc);
        for (int64_t j = b0; j < b1; j++) fg_store_f64(c->db_acc, c->acc, c->v0 + j, acc[j - b0]);
    }
}

static void grad_f32(const fg_context *ctx, const fg_logp_call *c) {
    const int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
    if (c->db_acc) {
        const int cteam = team < (c->cols + 15) / 16 ? team : (int)((c->cols + 15) / 16);
        if (cteam <= 1) {
            grad_cols(c, 0, c->cols);
            return;
        }
#pragma omp parallel num_threads(cteam)
        {
            int64_t lo, hi;
            fg_cpu_share(c->cols, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
            grad_cols(c, lo, hi);
        }
        return;
    }
    if (team == 1) {
        grad_block(c, 0, c->rows, 0, c->cols, NULL);
        return;
    }
#pragma omp parallel num_threads(team)
    {
        int64_t lo, hi;
        fg_cpu_share(c->rows, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
        grad_block(c, lo, hi, 0, c->cols, NULL);
    }
}

/* COMBINE: one row at a time, the shards in order; ignored rows 0. */
static void combine(const fg_context *ctx, const fg_logp_call *c) {
    const int team_ = fg_cpu_team(ctx, c->rows * c->nparts, 32768);
#pragma omp parallel for schedule(static) num_threads(team_) if (team_ > 1)
    for (int64_t i = 0; i < c->rows; i++) {
        const int64_t r = c->r0 + i, N = c->N;
        double lse = 0.0, logp = 0.0, ent = 0.0;
        if (!(c->use_ignore && target_at(c, r) == c->ignore_index)) {
            double m = -INFINITY, s = 0.0, tl = 0.0, el = 0.0;
            for (int64_t k = 0; k < c->nparts; k++) {
                const double l = fg_load_f64(c->lse_parts, c->acc, k * N + r);
                if (l > m || isnan(l)) m = l;
            }
            const double mm = isinf(m) && m < 0 ? 0.0 : m;
            for (int64_t k = 0; k < c->nparts; k++) s += exp(fg_load_f64(c->lse_parts, c->acc, k * N + r) - mm);
            lse = isnan(m) ? m : mm + log(s);
            for (int64_t k = 0; k < c->t_parts; k++) tl += fg_load_f64(c->tlogit_parts, c->acc, k * N + r);
            logp = tl - lse;
            if (c->entropy_parts) {
                for (int64_t k = 0; k < c->nparts; k++) {
                    const double l = fg_load_f64(c->lse_parts, c->acc, k * N + r);
                    const double q = exp(l - lse); /* the shard's share of the mass; 0: it adds nothing */
                    if (q != 0.0) el += q * (l - fg_load_f64(c->entropy_parts, c->acc, k * N + r));
                }
                ent = lse - el;
            }
        }
        if (c->logp) fg_store_f64(c->logp, c->acc, r, logp);
        if (c->lse) fg_store_f64(c->lse, c->acc, r, lse);
        if (c->entropy) fg_store_f64(c->entropy, c->acc, r, ent);
    }
}

fg_status fg_cpu_logp(fg_context *ctx, const fg_logp_call *c) {
    switch (c->step) {
    case FG_LOGP_STATS:
        if (c->acc == FG_F32) stats_f32(ctx, c);
        else stats(ctx, c);
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
        if (c->acc == FG_F32) grad_f32(ctx, c);
        else grad(ctx, c);
        return FG_OK;
    case FG_LOGP_REDUCE: {
        double sum = 0.0;
        for (int64_t r = 0; r < c->N; r++) sum += fg_load_f64(c->loss_rows, c->acc, r);
        fg_store_f64(c->loss_out, c->acc, 0, sum * fg_load_f64(c->scale, c->acc, 1));
        return FG_OK;
    }
    case FG_LOGP_COMBINE:
        fg_record_kernel(ctx, "logp_combine");
        combine(ctx, c);
        return FG_OK;
    case FG_LOGP_CAST: {
    const int team_ = fg_cpu_team(ctx, c->n, 32768);
#pragma omp parallel for schedule(static) num_threads(team_) if (team_ > 1)
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

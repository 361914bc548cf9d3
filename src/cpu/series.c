/*
 * series.c — the CPU backend of the series family (src/ops/series.c): patching, its
 * overlap-add backward, and the regression losses. The reference: plain loops over rows,
 * one thread a share of rows (or of loss chunks), sums in a fixed order that the CUDA kernels
 * follow too:
 *   unpatch  dx[t] = Σ_p dy[p, t − p·stride] over the patches p that read step t in order of
 *            p, then — for t = L − 1 only — the padded positions (p·stride + j >= L), in order
 *            of p and j; one output element per loop iteration, no scatter.
 *   loss     per FG_SERIES_CHUNK elements a sum in acc (f32, f64 for f64), in element order;
 *            the finish adds the chunk sums in order in f64 and scales once.
 *   windows  row copies out of the series; a start out of range gives a NaN window and the
 *            context's bad-value flag (fg_context_check reports it).
 * Sums are f32 for f32 / f16 / bf16 data and f64 for f64 data.
 */
#include "cpu.h"
#include "vec.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Offset of series row r (its leading-dims index) in elements. */
static inline int64_t row_offset(const fg_series_call *c, int64_t r) {
    int64_t off = 0;
    for (int d = c->lead_rank - 1; d >= 0; d--) {
        const int64_t n = c->lead_shape[d];
        off += (r % n) * c->lead_stride[d];
        r /= n;
    }
    return off;
}

/* Patches of rows [r0, r1): a copy of the bits, element size ES (a constant at each call). */
FG_INLINE void patch_typed(const fg_series_call *c, size_t ES, int64_t r0, int64_t r1) {
    const int64_t L = c->L, P = c->P, S = c->S, st = c->stride, ts = c->t_stride;
    const char *src = c->src;
    char *dst = c->dst;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t base = row_offset(c, r), out = r * P * S;
        for (int64_t p = 0; p < P; p++)
            for (int64_t j = 0; j < S; j++) {
                int64_t q = p * st + j;
                if (q > L - 1) q = L - 1;
                memcpy(dst + (size_t)(out + p * S + j) * ES, src + (size_t)(base + q * ts) * ES, ES);
            }
    }
}

static void patch_rows(const fg_series_call *c, int64_t r0, int64_t r1) {
    switch (fg_dtype_size(c->dtype)) {
    case 8: patch_typed(c, 8, r0, r1); break;
    case 2: patch_typed(c, 2, r0, r1); break;
    default: patch_typed(c, 4, r0, r1); break;
    }
}

/* The overlap-add of step t from one row's patches dy (at element `in`): the patches that
 * read t in order of p, then for the last step the padded positions in order of p and j.
 * f32 sums for every dtype but f64 (unpatch_sum64); t is a constant at each call. */
FG_INLINE float unpatch_sum32(const void *dy, fg_dtype t, int64_t in, int64_t tt, int64_t L, int64_t P, int64_t S,
                              int64_t st) {
    float s = 0;
    int64_t p_lo = tt >= S ? (tt - S) / st + 1 : 0, p_hi = tt / st;
    if (p_hi > P - 1) p_hi = P - 1;
    for (int64_t p = p_lo; p <= p_hi; p++) s += fg_v_ld(dy, t, in + p * S + (tt - p * st));
    if (tt == L - 1)
        for (int64_t p = 0; p < P; p++)
            for (int64_t j = L - p * st > 0 ? L - p * st : 0; j < S; j++) s += fg_v_ld(dy, t, in + p * S + j);
    return s;
}

FG_INLINE double unpatch_sum64(const double *dy, int64_t in, int64_t tt, int64_t L, int64_t P, int64_t S, int64_t st) {
    double s = 0;
    int64_t p_lo = tt >= S ? (tt - S) / st + 1 : 0, p_hi = tt / st;
    if (p_hi > P - 1) p_hi = P - 1;
    for (int64_t p = p_lo; p <= p_hi; p++) s += dy[in + p * S + (tt - p * st)];
    if (tt == L - 1)
        for (int64_t p = 0; p < P; p++)
            for (int64_t j = L - p * st > 0 ? L - p * st : 0; j < S; j++) s += dy[in + p * S + j];
    return s;
}

FG_INLINE void unpatch_typed(const fg_series_call *c, fg_dtype dt, int64_t r0, int64_t r1) {
    const int64_t L = c->L, P = c->P, S = c->S, st = c->stride, ts = c->t_stride;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t base = row_offset(c, r), in = r * P * S;
        for (int64_t tt = 0; tt < L; tt++) {
            const int64_t o = base + tt * ts;
            if (dt == FG_F64) {
                const double sum = unpatch_sum64(c->src, in, tt, L, P, S, st);
                double *dx = c->dst;
                dx[o] = c->accumulate ? dx[o] + sum : sum;
            } else {
                float sum = unpatch_sum32(c->src, dt, in, tt, L, P, S, st);
                if (c->accumulate) sum += fg_v_ld(c->dst, dt, o);
                fg_v_st(c->dst, dt, o, sum);
            }
        }
    }
}

static void unpatch_rows(const fg_series_call *c, int64_t r0, int64_t r1) {
    switch (c->dtype) {
    case FG_F64: unpatch_typed(c, FG_F64, r0, r1); break;
    case FG_F16: unpatch_typed(c, FG_F16, r0, r1); break;
    case FG_BF16: unpatch_typed(c, FG_BF16, r0, r1); break;
    default: unpatch_typed(c, FG_F32, r0, r1); break;
    }
}

/* The loss of one element and its gradient (before grad_scale), in double: the element loss
 * is rounded to acc by the caller. */
static inline double point_loss(int kind, double delta, double d, double *g) {
    const double a = fabs(d), sg = d > 0 ? 1.0 : d < 0 ? -1.0 : (d == d ? 0.0 : d);
    switch (kind) {
    case FG_LOSS_MAE: *g = sg; return a;
    case FG_LOSS_HUBER:
        if (a <= delta) {
            *g = d;
            return 0.5 * d * d;
        }
        *g = a == a ? delta * sg : d; /* NaN stays NaN */
        return delta * (a - 0.5 * delta);
    default: *g = 2.0 * d; return d * d;
    }
}

static void loss_chunks(const fg_series_call *c, int64_t k0, int64_t k1) {
    const fg_dtype t = c->dtype, gt = c->dpred_dtype;
    const bool f64 = t == FG_F64;
    for (int64_t k = k0; k < k1; k++) {
        const int64_t lo = k * FG_SERIES_CHUNK, hi = lo + FG_SERIES_CHUNK < c->n ? lo + FG_SERIES_CHUNK : c->n;
        double s64 = 0;
        float s32 = 0;
        for (int64_t i = lo; i < hi; i++) {
            double g;
            if (f64) {
                const double d = ((const double *)c->pred)[i] - ((const double *)c->target)[i];
                const double l = point_loss(c->kind, c->delta, d, &g);
                if (c->reduction == FG_REDUCTION_NONE) ((double *)c->loss)[i] = l;
                else s64 += l;
                if (c->want_dpred) {
                    const double v = g * c->grad_scale;
                    double *dp = c->dpred;
                    dp[i] = c->accumulate ? dp[i] + v : v;
                }
            } else {
                const float d = fg_v_ld(c->pred, t, i) - fg_v_ld(c->target, t, i); /* the difference in f32 */
                const float l = (float)point_loss(c->kind, c->delta, d, &g);
                if (c->reduction == FG_REDUCTION_NONE) ((float *)c->loss)[i] = l;
                else s32 += l;
                if (c->want_dpred) {
                    float v = (float)g * (float)c->grad_scale;
                    if (c->accumulate) v += fg_v_ld(c->dpred, gt, i);
                    fg_v_st(c->dpred, gt, i, v);
                }
            }
        }
        if (c->reduction != FG_REDUCTION_NONE) {
            if (f64) ((double *)c->partials)[k] = s64;
            else ((float *)c->partials)[k] = s32;
        }
    }
}

static void loss_finish(const fg_series_call *c) {
    double s = 0;
    for (int64_t k = 0; k < c->chunks; k++)
        s += c->acc == FG_F64 ? ((const double *)c->partials)[k] : (double)((const float *)c->partials)[k];
    const double v = c->reduction == FG_REDUCTION_MEAN && c->n == 0 ? NAN : s * c->out_scale;
    if (c->acc == FG_F64) *(double *)c->loss = v;
    else *(float *)c->loss = (float)v;
}

/* Windows [b0, b1): each a copy of W rows of the series (the bits), or NaN for a bad start;
 * returns the first bad b, or -1. */
static int64_t windows(const fg_series_call *c, int64_t b0, int64_t b1) {
    const size_t es = fg_dtype_size(c->dtype);
    const int64_t W = c->W, C = c->C;
    int64_t bad = -1;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t s = c->starts_dtype == FG_I32 ? ((const int32_t *)c->starts)[b] : ((const int64_t *)c->starts)[b];
        char *out = (char *)c->dst + (size_t)(b * W * C) * es;
        if (s < 0 || s > c->T - W) {
            for (int64_t i = 0; i < W * C; i++) fg_v_std(out, c->dtype, i, NAN);
            if (bad < 0) bad = b;
            continue;
        }
        for (int64_t t = 0; t < W; t++) {
            const char *row = (const char *)c->src + (size_t)((s + t) * c->src_rs) * es;
            if (c->src_cs == 1) {
                memcpy(out + (size_t)(t * C) * es, row, (size_t)C * es);
            } else {
                for (int64_t j = 0; j < C; j++)
                    memcpy(out + (size_t)(t * C + j) * es, row + (size_t)(j * c->src_cs) * es, es);
            }
        }
    }
    return bad;
}

fg_status fg_cpu_series(fg_context *ctx, fg_series_call *c, bool run) {
    snprintf(c->name, sizeof c->name, "cpu:%s<%s>", fg_series_step_name(c), fg_dtype_name(c->dtype));
    if (!run) return FG_OK;
    switch (c->step) {
    case FG_SERIES_PATCH:
    case FG_SERIES_UNPATCH: {
        void (*fn)(const fg_series_call *, int64_t, int64_t) = c->step == FG_SERIES_PATCH ? patch_rows : unpatch_rows;
        const int team = fg_cpu_team(ctx, c->rows * c->L, 1 << 14);
        if (team == 1) {
            fn(c, 0, c->rows);
            break;
        }
#pragma omp parallel num_threads(team)
        {
            int64_t lo, hi;
            fg_cpu_share(c->rows, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
            fn(c, lo, hi);
        }
        break;
    }
    case FG_SERIES_LOSS: {
        const int team = fg_cpu_team(ctx, c->n, 1 << 15);
        if (team == 1) {
            loss_chunks(c, 0, c->chunks);
            break;
        }
#pragma omp parallel num_threads(team)
        {
            int64_t lo, hi;
            fg_cpu_share(c->chunks, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
            loss_chunks(c, lo, hi);
        }
        break;
    }
    case FG_SERIES_LOSS_FINISH: loss_finish(c); break;
    case FG_SERIES_WINDOWS: { /* a copy: one thread (the batch is small next to the model) */
        const int64_t bad = windows(c, 0, c->rows);
        if (bad >= 0) fg_host_flag_raise(ctx, FG_FLAG_BAD_START, bad);
        break;
    }
    }
    return FG_OK;
}

/*
 * norm.c — the CPU backend's steps of the normalization family (the step list is in
 * core/internal.h; validation and the walk are in ops/norm.c): the reference kernels.
 *
 *  - Row norms: one row at a time, held in a per-thread f32 buffer (f64 for f64): the residual
 *    sum s = x + dropout(r) rounded to the storage type (what PyTorch's eager x + dropout(r)
 *    would hold, so a backward that recomputes the statistics from the stored s gets the
 *    forward's bits), two passes over the buffer for the mean and the variance, one for the
 *    output. The backward's dw / db are summed per fixed block of rows in f64, and the blocks
 *    are added in order: the bits do not depend on the thread count.
 *  - BatchNorm: per fixed block of rows, per channel, f64 sums of s − K and (s − K)² around the
 *    block's first row K (no cancellation for data far from zero), finished in block order into
 *    the f64 sums {Σ s, Σ s², N} that the split form hands the caller.
 *  - Dropout masks come from src/core/rng.h in chunks of 4 (one Philox call each), sixteen
 *    calls side by side where the CPU has AVX-512 (the same bits, each counter word in a 64-bit
 *    lane); there the dropout op over a contiguous f32 / bf16 tensor applies each 64 elements'
 *    keep bits in registers, with no multipliers buffer, and BatchNorm's rows of C <= 64
 *    channels run as 16-lane vectors (same bits as the cloned loops).
 * f32 / f16 / bf16 math is f32, vectorizable (FG_CPU_CLONES); f64 problems run the same
 * formulas in f64. No multiply-add is contracted into an FMA (fp-contract off): s = x + m·r is
 * a multiply then an add, as the CUDA backend forms it, on every x86 level the clones pick.
 */
#pragma GCC optimize("fp-contract=off")
#include "cpu.h"
#include "vec.h"

#include "../core/rng.h"
#include "philox_z.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ALIGN_UP(x) (((x) + 255) & ~(size_t)255)
enum { CHUNK = 1024 };      /* dropout multipliers made per call */
enum { LANES = 16 };        /* independent partial sums of a row reduction (vectorizable) */
enum { MAX_BLOCKS = 256 };  /* fixed row blocks of the column sums */

/* ------------------------------------------------------------------ dropout */

/* The multipliers of quads q0 … q0 + nq − 1 (elements 4·q0 …) into out: one Philox call a quad,
   kept when (r >> 8) >= threshold (u >= p, compared as integers). A plain loop over independent
   quads, which the compiler vectorizes (the 32 × 32 → 64-bit products are SIMD multiplies). */
FG_INLINE void quad_mults(const fg_dropout_gen *g, uint64_t q0, int64_t nq, float *restrict out) {
    const uint32_t k0 = (uint32_t)g->seed, k1 = (uint32_t)(g->seed >> 32);
    const uint32_t c2 = (uint32_t)g->offset, c3 = (uint32_t)(g->offset >> 32), thr = g->threshold;
    const float scale = g->scale;
    for (int64_t k = 0; k < nq; k++) {
        const uint64_t q = q0 + (uint64_t)k;
        const fg_philox4 r = fg_philox4x32_10((uint32_t)q, (uint32_t)(q >> 32), c2, c3, k0, k1);
        out[4 * k + 0] = (r.v[0] >> 8) >= thr ? scale : 0.0f;
        out[4 * k + 1] = (r.v[1] >> 8) >= thr ? scale : 0.0f;
        out[4 * k + 2] = (r.v[2] >> 8) >= thr ? scale : 0.0f;
        out[4 * k + 3] = (r.v[3] >> 8) >= thr ? scale : 0.0f;
    }
}

#ifdef FG_HAVE_PHILOX_X16
/* quad_mults on AVX-512: sixteen quads a step (z_keep_bits); the last nq mod 16 quads, and p = 1
   (threshold 2^24), by quad_mults. */
__attribute__((target(Z_DROP_ISA))) static void quad_mults_x16(const fg_dropout_gen *g, uint64_t q0, int64_t nq,
                                                              float *restrict out) {
    int64_t k = 0;
    if (g->threshold < (1u << 24)) {
        const z_keys keys = z_keys_make(g->seed);
        const __m512i thr8 = _mm512_set1_epi32((int)(g->threshold << 8));
        const __m512 scale = _mm512_set1_ps(g->scale);
        for (; k + 16 <= nq; k += 16) {
            const uint64_t keep = z_keep_bits(q0 + (uint64_t)k, g->offset, &keys, thr8);
            for (int b = 0; b < 4; b++)
                _mm512_storeu_ps(out + 4 * k + 16 * b, _mm512_maskz_mov_ps((__mmask16)(keep >> 16 * b), scale));
        }
    }
    if (k < nq) quad_mults(g, q0 + (uint64_t)k, nq - k, out + 4 * k);
}
#endif

/* m[k] = the multiplier of element idx0 + k (keep ? scale : 0), k < n <= CHUNK. */
FG_CPU_CLONES
static void drop_mults(const fg_dropout_gen *g, uint64_t idx0, int64_t n, float *m) {
    float quads[CHUNK + 8];
    const uint64_t q0 = idx0 >> 2, q1 = (idx0 + (uint64_t)n + 3) >> 2;
#ifdef FG_HAVE_PHILOX_X16
    if (fg_philox_z_usable()) {
        quad_mults_x16(g, q0, (int64_t)(q1 - q0), quads);
        memcpy(m, quads + (idx0 & 3), (size_t)n * sizeof(float));
        return;
    }
#endif
    quad_mults(g, q0, (int64_t)(q1 - q0), quads);
    memcpy(m, quads + (idx0 & 3), (size_t)n * sizeof(float));
}

static void drop_mults64(const fg_dropout_gen *g, uint64_t idx0, int64_t n, double *m) {
    float f[CHUNK];
    drop_mults(g, idx0, n, f);
    for (int64_t k = 0; k < n; k++) m[k] = f[k] != 0.0f ? g->scale64 : 0.0;
}

/* The multipliers of whole short rows (C <= CHUNK / 2): row i's are the flat elements i·C … i·C + C − 1,
   made for up to CHUNK / C rows [i, hi) at once into buf (a Philox run per row costs more than the row).
   rm holds the rows buf has; the same multipliers as one drop_mults call a row. */
typedef struct row_mults {
    int64_t first, count;
} row_mults;

static bool short_rows(const fg_norm_call *c) { return c->drop.on && c->cols > 0 && c->cols <= CHUNK / 2; }

static const float *mults_of_row(const fg_norm_call *c, int64_t i, int64_t hi, float *buf, row_mults *rm) {
    const int64_t C = c->cols;
    if (i < rm->first || i >= rm->first + rm->count) {
        int64_t n = CHUNK / C;
        if (n > hi - i) n = hi - i;
        drop_mults(&c->drop, (uint64_t)(i * C), n * C, buf);
        rm->first = i, rm->count = n;
    }
    return buf + (i - rm->first) * C;
}

/* ------------------------------------------------------------------ helpers */

/* v rounded to storage type t (and back); t a constant at the call */
FG_INLINE float round_to(fg_dtype t, float v) {
    switch (t) {
    case FG_F16: return fg_v_f16_to_f32(fg_v_f32_to_f16(v));
    case FG_BF16: return fg_v_bf16_to_f32(fg_v_f32_to_bf16(v));
    default: return v;
    }
}

/* Σ a[j] − shift over n values, in LANES independent partial sums added in a fixed order */
FG_INLINE float sum_f(const float *a, int64_t n, float shift, bool square) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) {
            const float v = a[j + k] - shift;
            acc[k] += square ? v * v : v;
        }
    for (int k = 0; j < n; j++, k++) {
        const float v = a[j] - shift;
        acc[k] += square ? v * v : v;
    }
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += acc[k];
    return s;
}

FG_INLINE float dot_f(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += a[j + k] * b[j + k];
    for (int k = 0; j < n; j++, k++) acc[k] += a[j] * b[j];
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += acc[k];
    return s;
}

/* mean and rstd of a row (kind: LayerNorm two-pass, RMSNorm mean of squares) */
FG_INLINE void row_stats(int kind, const float *a, int64_t n, float eps, float *mean, float *rstd) {
    if (kind == FG_NORM_RMS) {
        *mean = 0.0f;
        *rstd = 1.0f / sqrtf(sum_f(a, n, 0.0f, true) / (float)n + eps);
        return;
    }
    const float m = sum_f(a, n, 0.0f, false) / (float)n;
    *mean = m;
    *rstd = 1.0f / sqrtf(sum_f(a, n, m, true) / (float)n + eps);
}

static void row_stats64(int kind, const double *a, int64_t n, double eps, double *mean, double *rstd) {
    double s = 0.0, q = 0.0;
    if (kind == FG_NORM_RMS) {
        for (int64_t j = 0; j < n; j++) q += a[j] * a[j];
        *mean = 0.0;
        *rstd = 1.0 / sqrt(q / (double)n + eps);
        return;
    }
    for (int64_t j = 0; j < n; j++) s += a[j];
    const double m = s / (double)n;
    for (int64_t j = 0; j < n; j++) q += (a[j] - m) * (a[j] - m);
    *mean = m;
    *rstd = 1.0 / sqrt(q / (double)n + eps);
}

/* The fixed row blocks of a column sum over `rows` rows of `cols` columns (their count and
 * height depend on the problem only). */
static void col_blocks(int64_t rows, int64_t cols, int64_t *nb, int64_t *rb) {
    int64_t cap = (int64_t)(1 << 21) / (cols > 0 ? 2 * cols : 1);
    if (cap > MAX_BLOCKS) cap = MAX_BLOCKS;
    if (cap < 1) cap = 1;
    int64_t h = (rows + cap - 1) / cap;
    if (h < 32) h = 32;
    *rb = h;
    *nb = rows > 0 ? (rows + h - 1) / h : 0;
}

/* out[j] (+)= Σ_b part[b·stride + first + j] in block order, stored as dtype t, j < n (no block:
   part may be NULL, and nothing is read from it) */
static void finish_cols(const fg_context *ctx, const double *part, int64_t first, int64_t nb, int64_t stride, int64_t n,
                        void *out, fg_dtype t, bool accumulate) {
    if (!out) return;
    const int team = fg_cpu_team(ctx, n * (nb + 1), 1 << 15);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t j = 0; j < n; j++) {
        double v = 0.0;
        for (int64_t b = 0; b < nb; b++) v += part[b * stride + first + j];
        if (accumulate) v += fg_load_f64(out, t, j);
        fg_store_f64(out, t, j, v);
    }
}

static int threads_for(const fg_context *ctx) { return fg_cpu_threads(ctx); }

/* ------------------------------------------------------------------ row norms: f32 math */

typedef struct row_buf {
    float *s, *a, *m; /* the row, a second row (g / x̂), dropout multipliers */
} row_buf;

FG_INLINE void load_row(fg_dtype t, const void *p, int64_t off, int64_t n, float *out) {
#pragma GCC ivdep
    for (int64_t j = 0; j < n; j++) out[j] = fg_v_ld(p, t, off + j);
}

/* s = x + m·r rounded to t (r NULL: x), into b->s */
FG_INLINE void residual_row(const fg_norm_call *c, fg_dtype t, int64_t i, const row_buf *b) {
    const int64_t D = c->cols, xo = i * c->ld_x;
    if (!c->r) {
        load_row(t, c->x, xo, D, b->s);
        return;
    }
    const int64_t ro = i * c->ld_r;
    for (int64_t j0 = 0; j0 < D; j0 += CHUNK) {
        const int64_t n = D - j0 < CHUNK ? D - j0 : CHUNK;
        if (c->drop.on) {
            drop_mults(&c->drop, (uint64_t)(i * D + j0), n, b->m);
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++)
                b->s[j0 + j] = round_to(t, fg_v_ld(c->x, t, xo + j0 + j) + b->m[j] * fg_v_ld(c->r, t, ro + j0 + j));
        } else {
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++)
                b->s[j0 + j] = round_to(t, fg_v_ld(c->x, t, xo + j0 + j) + fg_v_ld(c->r, t, ro + j0 + j));
        }
    }
}

FG_INLINE void rows_forward_t(const fg_norm_call *c, fg_dtype t, int64_t r0, int64_t r1, const row_buf *b) {
    const int64_t D = c->cols;
    const float eps = (float)c->eps;
    for (int64_t i = r0; i < r1; i++) {
        residual_row(c, t, i, b);
        float mean, rstd;
        row_stats(c->kind, b->s, D, eps, &mean, &rstd);
        if (c->mean) ((float *)c->mean)[i] = mean;
        if (c->rstd) ((float *)c->rstd)[i] = rstd;
        const int64_t yo = i * c->ld_y;
        if (c->s) {
            const int64_t so = i * c->ld_s;
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++) fg_v_st(c->s, t, so + j, b->s[j]);
        }
        if (c->w && c->b) {
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++)
                fg_v_st(c->y, t, yo + j, (b->s[j] - mean) * rstd * fg_v_ld(c->w, t, j) + fg_v_ld(c->b, t, j));
        } else if (c->w) {
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++) fg_v_st(c->y, t, yo + j, (b->s[j] - mean) * rstd * fg_v_ld(c->w, t, j));
        } else if (c->b) {
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++) fg_v_st(c->y, t, yo + j, (b->s[j] - mean) * rstd + fg_v_ld(c->b, t, j));
        } else {
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++) fg_v_st(c->y, t, yo + j, (b->s[j] - mean) * rstd);
        }
    }
}

FG_CPU_CLONES
static void rows_forward_f(const fg_norm_call *c, int64_t r0, int64_t r1, const row_buf *b) {
    if (c->dtype == FG_BF16) rows_forward_t(c, FG_BF16, r0, r1, b);
    else if (c->dtype == FG_F16) rows_forward_t(c, FG_F16, r0, r1, b);
    else rows_forward_t(c, FG_F32, r0, r1, b);
}

/* The backward of rows [r0, r1); part (2·D f64: dw then db sums, added to) or NULL. */
FG_INLINE void rows_backward_t(const fg_norm_call *c, fg_dtype t, int64_t r0, int64_t r1, const row_buf *b,
                               double *part) {
    const int64_t D = c->cols;
    const float eps = (float)c->eps, inv_d = 1.0f / (float)D;
    const bool rms = c->kind == FG_NORM_RMS;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t xo = i * c->ld_x, dyo = i * c->ld_dy;
        load_row(t, c->x, xo, D, b->s);
        float mean, rstd;
        if (c->rstd) {
            mean = rms ? 0.0f : ((const float *)c->mean)[i];
            rstd = ((const float *)c->rstd)[i];
        } else {
            row_stats(c->kind, b->s, D, eps, &mean, &rstd);
        }
        /* b->s becomes x̂, b->a becomes g = dy·w; the block's dw / db sums gain dy·x̂ and dy */
        if (part) {
            double *pw = part, *pb = part + D;
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++) {
                const float dy = fg_v_ld(c->dy, t, dyo + j), xh = (b->s[j] - mean) * rstd;
                b->s[j] = xh;
                b->a[j] = c->w ? dy * fg_v_ld(c->w, t, j) : dy;
                pw[j] += (double)(dy * xh);
                pb[j] += (double)dy;
            }
        } else {
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++) {
                const float dy = fg_v_ld(c->dy, t, dyo + j);
                b->s[j] = (b->s[j] - mean) * rstd;
                b->a[j] = c->w ? dy * fg_v_ld(c->w, t, j) : dy;
            }
        }
        if (!c->dx && !c->dr) continue;
        const float c1 = dot_f(b->a, b->s, D) * inv_d;
        const float c2 = rms ? 0.0f : sum_f(b->a, D, 0.0f, false) * inv_d;
        const int64_t dso = i * c->ld_ds, dxo = i * c->ld_dx, dro = i * c->ld_dr;
        /* b->a becomes dsum (one branch-free loop each, so each vectorizes) */
#pragma GCC ivdep
        for (int64_t j = 0; j < D; j++) b->a[j] = rstd * (b->a[j] - c2 - b->s[j] * c1);
        if (c->ds) {
#pragma GCC ivdep
            for (int64_t j = 0; j < D; j++) b->a[j] += fg_v_ld(c->ds, t, dso + j);
        }
        if (c->dx) {
            if (c->accumulate) {
#pragma GCC ivdep
                for (int64_t j = 0; j < D; j++) fg_v_st(c->dx, t, dxo + j, b->a[j] + fg_v_ld(c->dx, t, dxo + j));
            } else {
#pragma GCC ivdep
                for (int64_t j = 0; j < D; j++) fg_v_st(c->dx, t, dxo + j, b->a[j]);
            }
        }
        if (!c->dr) continue;
        for (int64_t j0 = 0; j0 < D; j0 += CHUNK) {
            const int64_t n = D - j0 < CHUNK ? D - j0 : CHUNK;
            if (c->drop.on) drop_mults(&c->drop, (uint64_t)(i * D + j0), n, b->m);
            else
                for (int64_t k = 0; k < n; k++) b->m[k] = 1.0f;
            if (c->accumulate) {
#pragma GCC ivdep
                for (int64_t k = 0; k < n; k++)
                    fg_v_st(c->dr, t, dro + j0 + k, b->m[k] * b->a[j0 + k] + fg_v_ld(c->dr, t, dro + j0 + k));
            } else {
#pragma GCC ivdep
                for (int64_t k = 0; k < n; k++) fg_v_st(c->dr, t, dro + j0 + k, b->m[k] * b->a[j0 + k]);
            }
        }
    }
}

FG_CPU_CLONES
static void rows_backward_f(const fg_norm_call *c, int64_t r0, int64_t r1, const row_buf *b, double *part) {
    if (c->dtype == FG_BF16) rows_backward_t(c, FG_BF16, r0, r1, b, part);
    else if (c->dtype == FG_F16) rows_backward_t(c, FG_F16, r0, r1, b, part);
    else rows_backward_t(c, FG_F32, r0, r1, b, part);
}

/* ------------------------------------------------------------------ row norms: f64 */

typedef struct row_buf64 {
    double *s, *a, *m;
} row_buf64;

static void rows_forward_64(const fg_norm_call *c, int64_t r0, int64_t r1, const row_buf64 *b) {
    const int64_t D = c->cols;
    const double *x = c->x, *r = c->r, *w = c->w, *bb = c->b;
    double *y = c->y, *s = c->s;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t xo = i * c->ld_x, ro = i * c->ld_r;
        if (r && c->drop.on) {
            for (int64_t j0 = 0; j0 < D; j0 += CHUNK) {
                const int64_t n = D - j0 < CHUNK ? D - j0 : CHUNK;
                drop_mults64(&c->drop, (uint64_t)(i * D + j0), n, b->m);
                for (int64_t k = 0; k < n; k++) b->s[j0 + k] = x[xo + j0 + k] + b->m[k] * r[ro + j0 + k];
            }
        } else {
            for (int64_t j = 0; j < D; j++) b->s[j] = x[xo + j] + (r ? r[ro + j] : 0.0);
        }
        double mean, rstd;
        row_stats64(c->kind, b->s, D, c->eps, &mean, &rstd);
        if (c->mean) ((double *)c->mean)[i] = mean;
        if (c->rstd) ((double *)c->rstd)[i] = rstd;
        if (s)
            for (int64_t j = 0; j < D; j++) s[i * c->ld_s + j] = b->s[j];
        for (int64_t j = 0; j < D; j++)
            y[i * c->ld_y + j] = (b->s[j] - mean) * rstd * (w ? w[j] : 1.0) + (bb ? bb[j] : 0.0);
    }
}

static void rows_backward_64(const fg_norm_call *c, int64_t r0, int64_t r1, const row_buf64 *b, double *part) {
    const int64_t D = c->cols;
    const double *x = c->x, *dy = c->dy, *ds = c->ds, *w = c->w;
    double *dx = c->dx, *dr = c->dr;
    const bool rms = c->kind == FG_NORM_RMS;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t xo = i * c->ld_x, dyo = i * c->ld_dy;
        for (int64_t j = 0; j < D; j++) b->s[j] = x[xo + j];
        double mean, rstd;
        if (c->rstd) {
            mean = rms ? 0.0 : ((const double *)c->mean)[i];
            rstd = ((const double *)c->rstd)[i];
        } else {
            row_stats64(c->kind, b->s, D, c->eps, &mean, &rstd);
        }
        double c1 = 0.0, c2 = 0.0;
        for (int64_t j = 0; j < D; j++) {
            b->s[j] = (b->s[j] - mean) * rstd;
            b->a[j] = dy[dyo + j] * (w ? w[j] : 1.0);
            c1 += b->a[j] * b->s[j];
            c2 += b->a[j];
            if (part) part[j] += dy[dyo + j] * b->s[j], part[D + j] += dy[dyo + j];
        }
        c1 /= (double)D;
        c2 = rms ? 0.0 : c2 / (double)D;
        if (!dx && !dr) continue;
        for (int64_t j0 = 0; j0 < D; j0 += CHUNK) {
            const int64_t n = D - j0 < CHUNK ? D - j0 : CHUNK;
            if (dr && c->drop.on) drop_mults64(&c->drop, (uint64_t)(i * D + j0), n, b->m);
            for (int64_t k = 0; k < n; k++) {
                const int64_t j = j0 + k;
                double v = rstd * (b->a[j] - c2 - b->s[j] * c1);
                if (ds) v += ds[i * c->ld_ds + j];
                if (dr) {
                    const double m = c->drop.on ? b->m[k] * v : v;
                    dr[i * c->ld_dr + j] = c->accumulate ? dr[i * c->ld_dr + j] + m : m;
                }
                if (dx) dx[i * c->ld_dx + j] = c->accumulate ? dx[i * c->ld_dx + j] + v : v;
            }
        }
    }
}

/* ------------------------------------------------------------------ row norm steps */

/* Per-thread row buffers: 2·D values + CHUNK multipliers, in the accumulator's type. */
static size_t row_buf_bytes(const fg_norm_call *c) {
    const size_t es = c->dtype == FG_F64 ? 8 : 4;
    return ALIGN_UP((size_t)(2 * c->cols + CHUNK) * es);
}

static void *thread_buf(const fg_norm_call *c, size_t off, size_t per, int id) {
    return (char *)c->scratch + off + per * (size_t)id;
}

static fg_status rows_forward(fg_context *ctx, fg_norm_call *c, bool run) {
    const size_t per = row_buf_bytes(c);
    const int nt = threads_for(ctx);
    if (!run) {
        c->need = per * (size_t)nt;
        snprintf(c->name, sizeof c->name, "cpu:%s_forward", c->kind == FG_NORM_RMS ? "rms_norm" : "layer_norm");
        return FG_OK;
    }
    int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
    if (team > nt) team = nt;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int id = omp_get_thread_num();
        int64_t lo, hi;
        fg_cpu_share(c->rows, omp_get_num_threads(), id, 1, &lo, &hi);
        char *p = thread_buf(c, 0, per, id);
        if (c->dtype == FG_F64) {
            row_buf64 b = {(double *)p, (double *)p + c->cols, (double *)p + 2 * c->cols};
            rows_forward_64(c, lo, hi, &b);
        } else {
            row_buf b = {(float *)p, (float *)p + c->cols, (float *)p + 2 * c->cols};
            rows_forward_f(c, lo, hi, &b);
        }
    }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

static fg_status rows_backward(fg_context *ctx, fg_norm_call *c, bool run) {
    const size_t per = row_buf_bytes(c);
    const int nt = threads_for(ctx);
    const bool sums = c->dw || c->db;
    int64_t nb = 0, rb = 1;
    if (sums) col_blocks(c->rows, c->cols, &nb, &rb);
    const size_t part_bytes = ALIGN_UP((size_t)(nb * 2 * c->cols) * sizeof(double));
    if (!run) {
        c->need = part_bytes + per * (size_t)nt;
        snprintf(c->name, sizeof c->name, "cpu:%s_backward", c->kind == FG_NORM_RMS ? "rms_norm" : "layer_norm");
        return FG_OK;
    }
    double *part = sums ? (double *)c->scratch : NULL;
    const int64_t units = sums ? nb : c->rows;
    int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
    if (team > nt) team = nt;
    if (team > units) team = units > 0 ? (int)units : 1;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int id = omp_get_thread_num();
        int64_t lo, hi;
        fg_cpu_share(units, omp_get_num_threads(), id, 1, &lo, &hi);
        char *p = thread_buf(c, part_bytes, per, id);
        for (int64_t u = lo; u < hi; u++) {
            const int64_t r0 = sums ? u * rb : u, r1 = sums ? (r0 + rb < c->rows ? r0 + rb : c->rows) : u + 1;
            double *pp = sums ? part + u * 2 * c->cols : NULL;
            if (pp) memset(pp, 0, (size_t)(2 * c->cols) * sizeof(double));
            if (c->dtype == FG_F64) {
                row_buf64 b = {(double *)p, (double *)p + c->cols, (double *)p + 2 * c->cols};
                rows_backward_64(c, r0, r1, &b, pp);
            } else {
                row_buf b = {(float *)p, (float *)p + c->cols, (float *)p + 2 * c->cols};
                rows_backward_f(c, r0, r1, &b, pp);
            }
        }
    }
    if (sums) {
        finish_cols(ctx, part, 0, nb, 2 * c->cols, c->cols, c->dw, c->dw_dtype, c->accumulate);
        finish_cols(ctx, part, c->cols, nb, 2 * c->cols, c->cols, c->db, c->db_dtype, c->accumulate);
    }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

#ifdef FG_Z
/* BatchNorm's f32 / bf16 row loops on AVX-512 where the CPU has it, for C <= 64 channels (a row
   in at most four 16-lane vectors, the last by lane masks; nv, t constants at the call): the
   cloned loops above run element by element on rows this short (their branches stay inside the
   loop). The same operations in the same order as those loops — s = x + m·r rounded to t, the
   f64 sums per channel in row order, the multiplies and adds unfused (fp-contract off) — so the
   same bits. */
static bool z_bn_takes(const fg_norm_call *c) {
    return (c->dtype == FG_F32 || c->dtype == FG_BF16) && c->cols > 0 && c->cols <= 64 && fg_z_usable();
}

/* v rounded to t and widened back (bf16: fg_v_f32_to_bf16's bits) */
FG_Z_INLINE __m512 z_round(fg_dtype t, __m512 v) {
    if (t != FG_BF16) return v;
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(fg_z_bf16(v)), 16));
}

/* s of row i at channels [j, j + 16) (lanes k): bn_row_t's x + m·r rounded to t (m the row's
   multipliers, NULL: 1), or x without r; stored to c->s when asked and r is given */
FG_Z_INLINE __m512 z_bn_s(const fg_norm_call *c, fg_dtype t, int64_t i, int64_t j, __mmask16 k, const float *m) {
    const __m512 x = fg_z_ld(c->x, t, i * c->ld_x + j, k);
    if (!c->r) return x;
    __m512 r = fg_z_ld(c->r, t, i * c->ld_r + j, k);
    if (m) r = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, m + j), r);
    const __m512 s = z_round(t, _mm512_add_ps(x, r));
    if (c->s) fg_z_st(c->s, t, i * c->ld_s + j, k, s);
    return s;
}

FG_Z_INLINE __m512d z_lo(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
FG_Z_INLINE __m512d z_hi(__m512 v) { return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); }

/* the 16 f64 lanes (lo, hi) stored to p[j …] for lanes k */
FG_Z_INLINE void z_st_pd(double *p, int64_t j, __mmask16 k, __m512d lo, __m512d hi) {
    _mm512_mask_storeu_pd(p + j, (__mmask8)k, lo);
    _mm512_mask_storeu_pd(p + j + 8, (__mmask8)(k >> 8), hi);
}

/* bn_stats_t: blocks [b0, b1) of rb rows, K the block's first row, Σ (s − K), Σ (s − K)² */
FG_Z_INLINE void z_bn_stats_t(const fg_norm_call *c, fg_dtype t, const int nv, int64_t b0, int64_t b1, int64_t rb,
                              double *part, float *mults) {
    const int64_t C = c->cols;
    const bool grouped = c->r && short_rows(c);
    for (int64_t b = b0; b < b1; b++) {
        double *K = part + b * 3 * C, *A = K + C, *B = A + C;
        const int64_t r0 = b * rb, r1 = r0 + rb < c->rows ? r0 + rb : c->rows;
        row_mults rm = {0, 0};
        __m512d k[4][2], a[4][2], q[4][2];
        const float *m = grouped ? mults_of_row(c, r0, r1, mults, &rm) : NULL;
        for (int v = 0; v < nv; v++) {
            const __m512 s = z_bn_s(c, t, r0, 16 * v, fg_z_lanes(C - 16 * v), m);
            k[v][0] = z_lo(s), k[v][1] = z_hi(s);
            a[v][0] = a[v][1] = q[v][0] = q[v][1] = _mm512_setzero_pd();
        }
        for (int64_t i = r0 + 1; i < r1; i++) {
            m = grouped ? mults_of_row(c, i, r1, mults, &rm) : NULL;
            for (int v = 0; v < nv; v++) {
                const __m512 s = z_bn_s(c, t, i, 16 * v, fg_z_lanes(C - 16 * v), m);
                const __m512d d0 = _mm512_sub_pd(z_lo(s), k[v][0]), d1 = _mm512_sub_pd(z_hi(s), k[v][1]);
                a[v][0] = _mm512_add_pd(a[v][0], d0), a[v][1] = _mm512_add_pd(a[v][1], d1);
                q[v][0] = _mm512_add_pd(q[v][0], _mm512_mul_pd(d0, d0)), q[v][1] = _mm512_add_pd(q[v][1], _mm512_mul_pd(d1, d1));
            }
        }
        for (int v = 0; v < nv; v++) {
            const __mmask16 kl = fg_z_lanes(C - 16 * v);
            z_st_pd(K, 16 * v, kl, k[v][0], k[v][1]);
            z_st_pd(A, 16 * v, kl, a[v][0], a[v][1]);
            z_st_pd(B, 16 * v, kl, q[v][0], q[v][1]);
        }
    }
}

/* bn_apply_t: y = (s − mean)·scale + shift over rows [lo, hi) */
FG_Z_INLINE void z_bn_apply_t(const fg_norm_call *c, fg_dtype t, const int nv, int64_t lo, int64_t hi,
                              const float *mean, const float *scale, const float *shift, float *mults) {
    const int64_t C = c->cols;
    const bool grouped = c->r && short_rows(c);
    row_mults rm = {0, 0};
    __m512 mv[4], sv[4], hv[4];
    for (int v = 0; v < nv; v++) {
        const __mmask16 k = fg_z_lanes(C - 16 * v);
        mv[v] = _mm512_maskz_loadu_ps(k, mean + 16 * v), sv[v] = _mm512_maskz_loadu_ps(k, scale + 16 * v);
        hv[v] = _mm512_maskz_loadu_ps(k, shift + 16 * v);
    }
    for (int64_t i = lo; i < hi; i++) {
        const float *m = grouped ? mults_of_row(c, i, hi, mults, &rm) : NULL;
        for (int v = 0; v < nv; v++) {
            const __mmask16 k = fg_z_lanes(C - 16 * v);
            const __m512 s = z_bn_s(c, t, i, 16 * v, k, m);
            fg_z_st(c->y, t, i * c->ld_y + 16 * v, k, _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(s, mv[v]), sv[v]), hv[v]));
        }
    }
}

/* bn_bstats_t: blocks [b0, b1), per channel Σ dy and Σ dy·(x − mean) */
FG_Z_INLINE void z_bn_bstats_t(const fg_norm_call *c, fg_dtype t, const int nv, int64_t b0, int64_t b1, int64_t rb,
                               double *part, const float *mean) {
    const int64_t C = c->cols;
    __m512 mv[4];
    for (int v = 0; v < nv; v++) mv[v] = _mm512_maskz_loadu_ps(fg_z_lanes(C - 16 * v), mean + 16 * v);
    for (int64_t b = b0; b < b1; b++) {
        double *A = part + b * 2 * C, *B = A + C;
        const int64_t r0 = b * rb, r1 = r0 + rb < c->rows ? r0 + rb : c->rows;
        __m512d a[4][2], q[4][2];
        for (int v = 0; v < nv; v++) a[v][0] = a[v][1] = q[v][0] = q[v][1] = _mm512_setzero_pd();
        for (int64_t i = r0; i < r1; i++)
            for (int v = 0; v < nv; v++) {
                const __mmask16 k = fg_z_lanes(C - 16 * v);
                const __m512 dy = fg_z_ld(c->dy, t, i * c->ld_dy + 16 * v, k);
                const __m512 p = _mm512_mul_ps(dy, _mm512_sub_ps(fg_z_ld(c->x, t, i * c->ld_x + 16 * v, k), mv[v]));
                a[v][0] = _mm512_add_pd(a[v][0], z_lo(dy)), a[v][1] = _mm512_add_pd(a[v][1], z_hi(dy));
                q[v][0] = _mm512_add_pd(q[v][0], z_lo(p)), q[v][1] = _mm512_add_pd(q[v][1], z_hi(p));
            }
        for (int v = 0; v < nv; v++) {
            const __mmask16 kl = fg_z_lanes(C - 16 * v);
            z_st_pd(A, 16 * v, kl, a[v][0], a[v][1]);
            z_st_pd(B, 16 * v, kl, q[v][0], q[v][1]);
        }
    }
}

/* bn_bapply_t: dx = a·dy + k·(x − mean) + e, dr = dx·m, rows [lo, hi) */
FG_Z_INLINE void z_bn_bapply_t(const fg_norm_call *c, fg_dtype t, const int nv, int64_t lo, int64_t hi,
                               const float *mean, const float *a, const float *kk, const float *e, float *mults) {
    const int64_t C = c->cols;
    const bool grouped = c->dr && short_rows(c), drop = c->dr && c->drop.on;
    row_mults rm = {0, 0};
    __m512 mv[4], av[4], kv[4], ev[4];
    for (int v = 0; v < nv; v++) {
        const __mmask16 k = fg_z_lanes(C - 16 * v);
        mv[v] = _mm512_maskz_loadu_ps(k, mean + 16 * v), av[v] = _mm512_maskz_loadu_ps(k, a + 16 * v);
        kv[v] = _mm512_maskz_loadu_ps(k, kk + 16 * v), ev[v] = _mm512_maskz_loadu_ps(k, e + 16 * v);
    }
    for (int64_t i = lo; i < hi; i++) {
        const float *m = NULL;
        if (grouped) m = mults_of_row(c, i, hi, mults, &rm);
        else if (drop) drop_mults(&c->drop, (uint64_t)(i * C), C, mults), m = mults;
        for (int v = 0; v < nv; v++) {
            const __mmask16 k = fg_z_lanes(C - 16 * v);
            const int64_t j = 16 * v;
            const __m512 x = fg_z_ld(c->x, t, i * c->ld_x + j, k), dy = fg_z_ld(c->dy, t, i * c->ld_dy + j, k);
            const __m512 val = _mm512_add_ps(
                _mm512_add_ps(_mm512_mul_ps(av[v], dy), _mm512_mul_ps(kv[v], _mm512_sub_ps(x, mv[v]))), ev[v]);
            if (c->dx) {
                const int64_t o = i * c->ld_dx + j;
                fg_z_st(c->dx, t, o, k, c->accumulate ? _mm512_add_ps(val, fg_z_ld(c->dx, t, o, k)) : val);
            }
            if (c->dr) {
                const int64_t o = i * c->ld_dr + j;
                const __m512 w = m ? _mm512_mul_ps(_mm512_maskz_loadu_ps(k, m + j), val) : val;
                fg_z_st(c->dr, t, o, k, c->accumulate ? _mm512_add_ps(w, fg_z_ld(c->dr, t, o, k)) : w);
            }
        }
    }
}

/* The four at their dtype and vector count (C <= 64: z_bn_takes) */
#define Z_BN_DISPATCH(call_t)                                                                                         \
    do {                                                                                                              \
        const int nv_ = (int)((c->cols + 15) / 16);                                                                   \
        const fg_dtype t_ = c->dtype == FG_BF16 ? FG_BF16 : FG_F32;                                                   \
        if (t_ == FG_BF16) {                                                                                          \
            if (nv_ == 1) call_t(FG_BF16, 1); else if (nv_ == 2) call_t(FG_BF16, 2);                                 \
            else if (nv_ == 3) call_t(FG_BF16, 3); else call_t(FG_BF16, 4);                                           \
        } else {                                                                                                      \
            if (nv_ == 1) call_t(FG_F32, 1); else if (nv_ == 2) call_t(FG_F32, 2);                                   \
            else if (nv_ == 3) call_t(FG_F32, 3); else call_t(FG_F32, 4);                                             \
        }                                                                                                             \
    } while (0)

FG_Z_KERNEL static void z_bn_stats(const fg_norm_call *c, int64_t b0, int64_t b1, int64_t rb, double *part,
                                   float *mults) {
#define CALL(t, nv) z_bn_stats_t(c, t, nv, b0, b1, rb, part, mults)
    Z_BN_DISPATCH(CALL);
#undef CALL
}

FG_Z_KERNEL static void z_bn_apply(const fg_norm_call *c, int64_t lo, int64_t hi, const float *mean, const float *scale,
                                   const float *shift, float *mults) {
#define CALL(t, nv) z_bn_apply_t(c, t, nv, lo, hi, mean, scale, shift, mults)
    Z_BN_DISPATCH(CALL);
#undef CALL
}

FG_Z_KERNEL static void z_bn_bstats(const fg_norm_call *c, int64_t b0, int64_t b1, int64_t rb, double *part,
                                    const float *mean) {
#define CALL(t, nv) z_bn_bstats_t(c, t, nv, b0, b1, rb, part, mean)
    Z_BN_DISPATCH(CALL);
#undef CALL
}

FG_Z_KERNEL static void z_bn_bapply(const fg_norm_call *c, int64_t lo, int64_t hi, const float *mean, const float *a,
                                    const float *kk, const float *e, float *mults) {
#define CALL(t, nv) z_bn_bapply_t(c, t, nv, lo, hi, mean, a, kk, e, mults)
    Z_BN_DISPATCH(CALL);
#undef CALL
}
#undef Z_BN_DISPATCH
#endif

/* ------------------------------------------------------------------ BatchNorm */

/* Per-thread buffers of the BatchNorm steps: one row (f64, or f32 for the f32 family) and CHUNK
   dropout multipliers. */
static size_t bn_buf_bytes(int64_t C) { return ALIGN_UP((size_t)C * sizeof(double) + CHUNK * sizeof(float)); }

/* s of row i (x + m·r rounded to t, or x) into row, stored to c->s when asked */
FG_INLINE void bn_row_t(const fg_norm_call *c, fg_dtype t, int64_t i, float *row, float *mults, const float *pre) {
    const int64_t C = c->cols, xo = i * c->ld_x;
    if (!c->r) {
        load_row(t, c->x, xo, C, row);
        return;
    }
    const int64_t ro = i * c->ld_r;
    for (int64_t j0 = 0; j0 < C; j0 += CHUNK) {
        const int64_t n = C - j0 < CHUNK ? C - j0 : CHUNK;
        if (c->drop.on) {
            if (pre) mults = (float *)pre; /* the row's, made with its neighbours' (C <= CHUNK / 2: one chunk) */
            else drop_mults(&c->drop, (uint64_t)(i * C + j0), n, mults);
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++)
                row[j0 + k] = round_to(t, fg_v_ld(c->x, t, xo + j0 + k) + mults[k] * fg_v_ld(c->r, t, ro + j0 + k));
        } else {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++)
                row[j0 + k] = round_to(t, fg_v_ld(c->x, t, xo + j0 + k) + fg_v_ld(c->r, t, ro + j0 + k));
        }
    }
    if (c->s) {
        const int64_t so = i * c->ld_s;
#pragma GCC ivdep
        for (int64_t j = 0; j < C; j++) fg_v_st(c->s, t, so + j, row[j]);
    }
}

static void bn_row_64(const fg_norm_call *c, int64_t i, double *row, float *mults) {
    const int64_t C = c->cols;
    const double *x = (const double *)c->x + i * c->ld_x, *r = c->r ? (const double *)c->r + i * c->ld_r : NULL;
    for (int64_t j0 = 0; j0 < C; j0 += CHUNK) {
        const int64_t n = C - j0 < CHUNK ? C - j0 : CHUNK;
        if (r && c->drop.on) drop_mults(&c->drop, (uint64_t)(i * C + j0), n, mults);
        for (int64_t k = 0; k < n; k++) {
            const double m = !r ? 0.0 : !c->drop.on ? 1.0 : mults[k] != 0.0f ? c->drop.scale64 : 0.0;
            row[j0 + k] = x[j0 + k] + (r ? m * r[j0 + k] : 0.0);
        }
    }
    if (c->s)
        for (int64_t j = 0; j < C; j++) ((double *)c->s)[i * c->ld_s + j] = row[j];
}

/* Blocks [b0, b1) of rb rows: per channel K (the block's first row), Σ (s − K), Σ (s − K)² */
FG_INLINE void bn_stats_t(const fg_norm_call *c, fg_dtype t, int64_t b0, int64_t b1, int64_t rb, double *part,
                          float *row, float *mults) {
    const int64_t C = c->cols;
    for (int64_t b = b0; b < b1; b++) {
        double *K = part + b * 3 * C, *A = K + C, *B = A + C;
        const int64_t r0 = b * rb, r1 = r0 + rb < c->rows ? r0 + rb : c->rows;
        const bool grouped = c->r && short_rows(c);
        row_mults rm = {0, 0};
        bn_row_t(c, t, r0, row, mults, grouped ? mults_of_row(c, r0, r1, mults, &rm) : NULL);
        for (int64_t j = 0; j < C; j++) K[j] = row[j], A[j] = 0.0, B[j] = 0.0;
        for (int64_t i = r0 + 1; i < r1; i++) {
            bn_row_t(c, t, i, row, mults, grouped ? mults_of_row(c, i, r1, mults, &rm) : NULL);
#pragma GCC ivdep
            for (int64_t j = 0; j < C; j++) {
                const double d = (double)row[j] - K[j];
                A[j] += d;
                B[j] += d * d;
            }
        }
    }
}

FG_CPU_CLONES
static void bn_stats_f(const fg_norm_call *c, int64_t b0, int64_t b1, int64_t rb, double *part, float *row,
                       float *mults) {
    if (c->dtype == FG_BF16) bn_stats_t(c, FG_BF16, b0, b1, rb, part, row, mults);
    else if (c->dtype == FG_F16) bn_stats_t(c, FG_F16, b0, b1, rb, part, row, mults);
    else bn_stats_t(c, FG_F32, b0, b1, rb, part, row, mults);
}

static void bn_stats_64(const fg_norm_call *c, int64_t b0, int64_t b1, int64_t rb, double *part, double *row,
                        float *mults) {
    const int64_t C = c->cols;
    for (int64_t b = b0; b < b1; b++) {
        double *K = part + b * 3 * C, *A = K + C, *B = A + C;
        const int64_t r0 = b * rb, r1 = r0 + rb < c->rows ? r0 + rb : c->rows;
        bn_row_64(c, r0, row, mults);
        for (int64_t j = 0; j < C; j++) K[j] = row[j], A[j] = 0.0, B[j] = 0.0;
        for (int64_t i = r0 + 1; i < r1; i++) {
            bn_row_64(c, i, row, mults);
            for (int64_t j = 0; j < C; j++) {
                const double d = row[j] - K[j];
                A[j] += d;
                B[j] += d * d;
            }
        }
    }
}

/* Per block of rows, per channel: K (the block's first row), Σ (s − K), Σ (s − K)²; then the
   sums in block order. */
static fg_status bn_stats(fg_context *ctx, fg_norm_call *c, bool run) {
    const int64_t C = c->cols;
    int64_t nb, rb;
    col_blocks(c->rows, 3 * C, &nb, &rb);
    const int nt = threads_for(ctx);
    const size_t part_bytes = ALIGN_UP((size_t)(nb * 3 * C) * sizeof(double)), per = bn_buf_bytes(C);
    if (!run) {
        c->need = part_bytes + per * (size_t)nt;
        snprintf(c->name, sizeof c->name, "cpu:batch_norm_stats");
        return FG_OK;
    }
    double *part = (double *)c->scratch;
    int team = fg_cpu_team(ctx, c->rows * C, 1 << 14);
    if (team > nt) team = nt;
    if (team > nb) team = nb > 0 ? (int)nb : 1;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int id = omp_get_thread_num();
        int64_t lo, hi;
        fg_cpu_share(nb, omp_get_num_threads(), id, 1, &lo, &hi);
        double *row = (double *)thread_buf(c, part_bytes, per, id);
        float *mults = (float *)(row + C);
        if (c->dtype == FG_F64) bn_stats_64(c, lo, hi, rb, part, row, mults);
#ifdef FG_Z
        else if (z_bn_takes(c)) z_bn_stats(c, lo, hi, rb, part, mults);
#endif
        else bn_stats_f(c, lo, hi, rb, part, (float *)row, mults);
    }
    double *sums = c->sums;
    const int cteam = fg_cpu_team(ctx, C * (nb + 1), 1 << 15);
#pragma omp parallel for schedule(static) num_threads(cteam) if (cteam > 1)
    for (int64_t j = 0; j < C; j++) {
        double s1 = 0.0, s2 = 0.0;
        for (int64_t b = 0; b < nb; b++) {
            const double K = part[b * 3 * C + j], A = part[b * 3 * C + C + j], B = part[b * 3 * C + 2 * C + j];
            const int64_t n = (b + 1) * rb < c->rows ? rb : c->rows - b * rb;
            s1 += (double)n * K + A;
            s2 += B + 2.0 * K * A + (double)n * K * K;
        }
        sums[j] = s1;
        sums[C + j] = s2;
    }
    sums[2 * C] = (double)c->rows;
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

/* The channel's mean, biased variance and rstd: from the sums (training) or the running stats. */
static void bn_channel(const fg_norm_call *c, int64_t j, double *mean, double *var, double *rstd) {
    if (c->eval) {
        *mean = fg_load_f64(c->running_mean, c->stat_dtype, j);
        *var = fg_load_f64(c->running_var, c->stat_dtype, j);
    } else {
        const double n = c->sums[2 * c->cols];
        *mean = c->sums[j] / n;
        const double v = c->sums[c->cols + j] / n - *mean * *mean;
        *var = v > 0.0 ? v : (v == v ? 0.0 : v);
    }
    *rstd = 1.0 / sqrt(*var + c->eps);
}

/* y = (s − mean)·scale + shift over rows [lo, hi), per-channel f32 coefficients */
FG_INLINE void bn_apply_t(const fg_norm_call *c, fg_dtype t, int64_t lo, int64_t hi, const float *mean,
                          const float *scale, const float *shift, float *row, float *mults) {
    const int64_t C = c->cols;
    const bool grouped = c->r && short_rows(c);
    row_mults rm = {0, 0};
    for (int64_t i = lo; i < hi; i++) {
        const int64_t yo = i * c->ld_y, xo = i * c->ld_x;
        if (c->r) {
            bn_row_t(c, t, i, row, mults, grouped ? mults_of_row(c, i, hi, mults, &rm) : NULL);
#pragma GCC ivdep
            for (int64_t j = 0; j < C; j++) fg_v_st(c->y, t, yo + j, (row[j] - mean[j]) * scale[j] + shift[j]);
        } else {
#pragma GCC ivdep
            for (int64_t j = 0; j < C; j++)
                fg_v_st(c->y, t, yo + j, (fg_v_ld(c->x, t, xo + j) - mean[j]) * scale[j] + shift[j]);
        }
    }
}

FG_CPU_CLONES
static void bn_apply_f(const fg_norm_call *c, int64_t lo, int64_t hi, const float *mean, const float *scale,
                       const float *shift, float *row, float *mults) {
    if (c->dtype == FG_BF16) bn_apply_t(c, FG_BF16, lo, hi, mean, scale, shift, row, mults);
    else if (c->dtype == FG_F16) bn_apply_t(c, FG_F16, lo, hi, mean, scale, shift, row, mults);
    else bn_apply_t(c, FG_F32, lo, hi, mean, scale, shift, row, mults);
}

static void bn_apply_64(const fg_norm_call *c, int64_t lo, int64_t hi, const double *mean, const double *scale,
                        const double *shift, double *row, float *mults) {
    const int64_t C = c->cols;
    for (int64_t i = lo; i < hi; i++) {
        double *y = (double *)c->y + i * c->ld_y;
        const double *x = (const double *)c->x + i * c->ld_x;
        if (c->r) bn_row_64(c, i, row, mults), x = row;
        for (int64_t j = 0; j < C; j++) y[j] = (x[j] - mean[j]) * scale[j] + shift[j];
    }
}

static fg_status bn_apply(fg_context *ctx, fg_norm_call *c, bool run) {
    const int64_t C = c->cols;
    const int nt = threads_for(ctx);
    const size_t chan_bytes = ALIGN_UP((size_t)(3 * C) * sizeof(double)), per = bn_buf_bytes(C);
    if (!run) {
        c->need = chan_bytes + per * (size_t)nt;
        snprintf(c->name, sizeof c->name, "cpu:batch_norm_apply");
        return FG_OK;
    }
    /* per channel: mean, scale = w·rstd, shift = b (f64 for f64, else f32) */
    const bool f64 = c->dtype == FG_F64;
    double *md = (double *)c->scratch, *sd = md + C, *hd = sd + C;
    float *mf = (float *)c->scratch, *sf = mf + C, *hf = sf + C;
    const double n = c->eval ? 0.0 : c->sums[2 * C];
    for (int64_t j = 0; j < C; j++) {
        double mean, var, rstd;
        bn_channel(c, j, &mean, &var, &rstd);
        const double w = c->w ? fg_load_f64(c->w, c->w_dtype, j) : 1.0, b = c->b ? fg_load_f64(c->b, c->w_dtype, j) : 0.0;
        if (f64) md[j] = mean, sd[j] = w * rstd, hd[j] = b;
        else mf[j] = (float)mean, sf[j] = (float)(w * rstd), hf[j] = (float)b;
        if (c->mean) fg_store_f64(c->mean, c->acc, j, mean);
        if (c->rstd) fg_store_f64(c->rstd, c->acc, j, rstd);
        if (!c->eval && c->running_mean) {
            const double m = c->momentum, unbiased = var * n / (n - 1.0);
            fg_store_f64(c->running_mean, c->stat_dtype, j,
                         (1.0 - m) * fg_load_f64(c->running_mean, c->stat_dtype, j) + m * mean);
            fg_store_f64(c->running_var, c->stat_dtype, j,
                         (1.0 - m) * fg_load_f64(c->running_var, c->stat_dtype, j) + m * unbiased);
        }
    }
    int team = fg_cpu_team(ctx, c->rows * C, 1 << 14);
    if (team > nt) team = nt;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int id = omp_get_thread_num();
        int64_t lo, hi;
        fg_cpu_share(c->rows, omp_get_num_threads(), id, 1, &lo, &hi);
        double *row = (double *)thread_buf(c, chan_bytes, per, id);
        float *mults = (float *)(row + C);
        if (f64) bn_apply_64(c, lo, hi, md, sd, hd, row, mults);
#ifdef FG_Z
        else if (z_bn_takes(c)) z_bn_apply(c, lo, hi, mf, sf, hf, mults);
#endif
        else bn_apply_f(c, lo, hi, mf, sf, hf, (float *)row, mults);
    }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

/* Blocks [b0, b1): per channel Σ dy and Σ dy·(x − mean) */
FG_INLINE void bn_bstats_t(const fg_norm_call *c, fg_dtype t, int64_t b0, int64_t b1, int64_t rb, double *part,
                           const float *mean) {
    const int64_t C = c->cols;
    for (int64_t b = b0; b < b1; b++) {
        double *A = part + b * 2 * C, *B = A + C;
        for (int64_t j = 0; j < C; j++) A[j] = 0.0, B[j] = 0.0;
        const int64_t r0 = b * rb, r1 = r0 + rb < c->rows ? r0 + rb : c->rows;
        for (int64_t i = r0; i < r1; i++) {
            const int64_t xo = i * c->ld_x, dyo = i * c->ld_dy;
#pragma GCC ivdep
            for (int64_t j = 0; j < C; j++) {
                const float dy = fg_v_ld(c->dy, t, dyo + j);
                A[j] += (double)dy;
                B[j] += (double)(dy * (fg_v_ld(c->x, t, xo + j) - mean[j]));
            }
        }
    }
}

FG_CPU_CLONES
static void bn_bstats_f(const fg_norm_call *c, int64_t b0, int64_t b1, int64_t rb, double *part, const float *mean) {
    if (c->dtype == FG_BF16) bn_bstats_t(c, FG_BF16, b0, b1, rb, part, mean);
    else if (c->dtype == FG_F16) bn_bstats_t(c, FG_F16, b0, b1, rb, part, mean);
    else bn_bstats_t(c, FG_F32, b0, b1, rb, part, mean);
}

static void bn_bstats_64(const fg_norm_call *c, int64_t b0, int64_t b1, int64_t rb, double *part, const double *mean) {
    const int64_t C = c->cols;
    for (int64_t b = b0; b < b1; b++) {
        double *A = part + b * 2 * C, *B = A + C;
        for (int64_t j = 0; j < C; j++) A[j] = 0.0, B[j] = 0.0;
        const int64_t r0 = b * rb, r1 = r0 + rb < c->rows ? r0 + rb : c->rows;
        for (int64_t i = r0; i < r1; i++) {
            const double *x = (const double *)c->x + i * c->ld_x, *dy = (const double *)c->dy + i * c->ld_dy;
            for (int64_t j = 0; j < C; j++) A[j] += dy[j], B[j] += dy[j] * (x[j] - mean[j]);
        }
    }
}

static fg_status bn_backward_stats(fg_context *ctx, fg_norm_call *c, bool run) {
    const int64_t C = c->cols;
    int64_t nb, rb;
    col_blocks(c->rows, 2 * C, &nb, &rb);
    const size_t part_bytes = ALIGN_UP((size_t)(nb * 2 * C) * sizeof(double));
    const size_t chan_bytes = ALIGN_UP((size_t)C * sizeof(double));
    if (!run) {
        c->need = part_bytes + chan_bytes;
        snprintf(c->name, sizeof c->name, "cpu:batch_norm_backward_stats");
        return FG_OK;
    }
    double *part = (double *)c->scratch, *md = (double *)((char *)c->scratch + part_bytes);
    float *mf = (float *)md;
    const bool f64 = c->dtype == FG_F64;
    for (int64_t j = 0; j < C; j++) {
        const double m = fg_load_f64(c->mean, c->acc, j);
        if (f64) md[j] = m;
        else mf[j] = (float)m;
    }
    int team = fg_cpu_team(ctx, c->rows * C, 1 << 14);
    if (team > nb) team = nb > 0 ? (int)nb : 1;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        int64_t lo, hi;
        fg_cpu_share(nb, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
        if (f64) bn_bstats_64(c, lo, hi, rb, part, md);
#ifdef FG_Z
        else if (z_bn_takes(c)) z_bn_bstats(c, lo, hi, rb, part, mf);
#endif
        else bn_bstats_f(c, lo, hi, rb, part, mf);
    }
    double *sums = c->sums;
    for (int64_t j = 0; j < C; j++) {
        double a = 0.0, b = 0.0;
        for (int64_t k = 0; k < nb; k++) a += part[k * 2 * C + j], b += part[k * 2 * C + C + j];
        sums[j] = a;
        sums[C + j] = b * fg_load_f64(c->rstd, c->acc, j);
    }
    sums[2 * C] = (double)c->rows;
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

/* dx = a·dy + k·(x − mean) + e per channel, dr = dx·m, rows [lo, hi) */
FG_INLINE void bn_bapply_t(const fg_norm_call *c, fg_dtype t, int64_t lo, int64_t hi, const float *mean, const float *a,
                           const float *kk, const float *e, float *mults) {
    const int64_t C = c->cols;
    const bool grouped = c->dr && short_rows(c);
    row_mults rm = {0, 0};
    float *group = mults;
    for (int64_t i = lo; i < hi; i++) {
        const int64_t xo = i * c->ld_x, dyo = i * c->ld_dy, dxo = i * c->ld_dx, dro = i * c->ld_dr;
        if (grouped) mults = (float *)mults_of_row(c, i, hi, group, &rm); /* one chunk: C <= CHUNK / 2 */
        for (int64_t j0 = 0; j0 < C; j0 += CHUNK) {
            const int64_t n = C - j0 < CHUNK ? C - j0 : CHUNK;
            if (c->dr && c->drop.on && !grouped) drop_mults(&c->drop, (uint64_t)(i * C + j0), n, mults);
#pragma GCC ivdep
            for (int64_t q = 0; q < n; q++) {
                const int64_t j = j0 + q;
                const float v = a[j] * fg_v_ld(c->dy, t, dyo + j) + kk[j] * (fg_v_ld(c->x, t, xo + j) - mean[j]) + e[j];
                if (c->dx) fg_v_st(c->dx, t, dxo + j, c->accumulate ? v + fg_v_ld(c->dx, t, dxo + j) : v);
                if (c->dr) {
                    const float m = c->drop.on ? mults[q] * v : v;
                    fg_v_st(c->dr, t, dro + j, c->accumulate ? m + fg_v_ld(c->dr, t, dro + j) : m);
                }
            }
        }
    }
}

FG_CPU_CLONES
static void bn_bapply_f(const fg_norm_call *c, int64_t lo, int64_t hi, const float *mean, const float *a,
                        const float *kk, const float *e, float *mults) {
    if (c->dtype == FG_BF16) bn_bapply_t(c, FG_BF16, lo, hi, mean, a, kk, e, mults);
    else if (c->dtype == FG_F16) bn_bapply_t(c, FG_F16, lo, hi, mean, a, kk, e, mults);
    else bn_bapply_t(c, FG_F32, lo, hi, mean, a, kk, e, mults);
}

static void bn_bapply_64(const fg_norm_call *c, int64_t lo, int64_t hi, const double *mean, const double *a,
                         const double *kk, const double *e, float *mults) {
    const int64_t C = c->cols;
    for (int64_t i = lo; i < hi; i++) {
        const double *x = (const double *)c->x + i * c->ld_x, *dy = (const double *)c->dy + i * c->ld_dy;
        double *dx = c->dx ? (double *)c->dx + i * c->ld_dx : NULL, *dr = c->dr ? (double *)c->dr + i * c->ld_dr : NULL;
        for (int64_t j0 = 0; j0 < C; j0 += CHUNK) {
            const int64_t n = C - j0 < CHUNK ? C - j0 : CHUNK;
            if (dr && c->drop.on) drop_mults(&c->drop, (uint64_t)(i * C + j0), n, mults);
            for (int64_t q = 0; q < n; q++) {
                const int64_t j = j0 + q;
                const double v = a[j] * dy[j] + kk[j] * (x[j] - mean[j]) + e[j];
                if (dx) dx[j] = c->accumulate ? dx[j] + v : v;
                if (dr) {
                    const double m = c->drop.on ? (mults[q] != 0.0f ? c->drop.scale64 : 0.0) * v : v;
                    dr[j] = c->accumulate ? dr[j] + m : m;
                }
            }
        }
    }
}

static fg_status bn_backward_apply(fg_context *ctx, fg_norm_call *c, bool run) {
    const int64_t C = c->cols;
    const size_t chan_bytes = ALIGN_UP((size_t)(4 * C) * sizeof(double));
    const int nt = threads_for(ctx);
    const size_t per = ALIGN_UP(CHUNK * sizeof(float));
    if (!run) {
        c->need = chan_bytes + per * (size_t)nt;
        snprintf(c->name, sizeof c->name, "cpu:batch_norm_backward_apply");
        return FG_OK;
    }
    if (c->sums) {
        for (int64_t j = 0; j < C; j++) {
            if (c->dw) {
                const double old = c->accumulate ? fg_load_f64(c->dw, c->dw_dtype, j) : 0.0;
                fg_store_f64(c->dw, c->dw_dtype, j, old + c->sums[C + j]);
            }
            if (c->db) {
                const double old = c->accumulate ? fg_load_f64(c->db, c->db_dtype, j) : 0.0;
                fg_store_f64(c->db, c->db_dtype, j, old + c->sums[j]);
            }
        }
    }
    if (!c->dx && !c->dr) {
        fg_record_kernel(ctx, c->name);
        return FG_OK;
    }
    /* dx = a·dy + k·(x − mean) + e per channel: a = w·rstd, k = −a·rstd·Σdy·x̂/N, e = −a·Σdy/N */
    const bool f64 = c->dtype == FG_F64;
    double *md = (double *)c->scratch, *ad = md + C, *kd = ad + C, *ed = kd + C;
    float *mf = (float *)c->scratch, *af = mf + C, *kf = af + C, *ef = kf + C;
    for (int64_t j = 0; j < C; j++) {
        const double rstd = fg_load_f64(c->rstd, c->acc, j), w = c->w ? fg_load_f64(c->w, c->w_dtype, j) : 1.0;
        const double a = w * rstd, mean = fg_load_f64(c->mean, c->acc, j);
        double k = 0.0, e = 0.0;
        if (!c->eval) {
            const double n = c->sums[2 * C];
            k = -a * rstd * c->sums[C + j] / n;
            e = -a * c->sums[j] / n;
        }
        if (f64) md[j] = mean, ad[j] = a, kd[j] = k, ed[j] = e;
        else mf[j] = (float)mean, af[j] = (float)a, kf[j] = (float)k, ef[j] = (float)e;
    }
    int team = fg_cpu_team(ctx, c->rows * C, 1 << 14);
    if (team > nt) team = nt;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int id = omp_get_thread_num();
        int64_t lo, hi;
        fg_cpu_share(c->rows, omp_get_num_threads(), id, 1, &lo, &hi);
        float *mults = (float *)thread_buf(c, chan_bytes, per, id);
        if (f64) bn_bapply_64(c, lo, hi, md, ad, kd, ed, mults);
#ifdef FG_Z
        else if (z_bn_takes(c)) z_bn_bapply(c, lo, hi, mf, af, kf, ef, mults);
#endif
        else bn_bapply_f(c, lo, hi, mf, af, kf, ef, mults);
    }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

/* ------------------------------------------------------------------ dropout */

/* Elements [j0, j0 + n) of row i (flat index i·cols + j), n <= CHUNK. */
FG_INLINE void dropout_t(const fg_norm_call *c, fg_dtype t, int64_t i, int64_t j0, int64_t n, float *m) {
    const int64_t xo = i * c->ld_x + j0, yo = i * c->ld_y + j0;
    if (c->drop.on) drop_mults(&c->drop, (uint64_t)(i * c->cols + j0), n, m);
    else
        for (int64_t k = 0; k < n; k++) m[k] = 1.0f;
    if (c->accumulate) {
#pragma GCC ivdep
        for (int64_t k = 0; k < n; k++) fg_v_st(c->y, t, yo + k, fg_v_ld(c->y, t, yo + k) + fg_v_ld(c->x, t, xo + k) * m[k]);
    } else {
#pragma GCC ivdep
        for (int64_t k = 0; k < n; k++) fg_v_st(c->y, t, yo + k, fg_v_ld(c->x, t, xo + k) * m[k]);
    }
}

FG_CPU_CLONES
static void dropout_chunk(const fg_norm_call *c, int64_t i, int64_t j0, int64_t n, float *m) {
    if (c->dtype == FG_BF16) dropout_t(c, FG_BF16, i, j0, n, m);
    else if (c->dtype == FG_F16) dropout_t(c, FG_F16, i, j0, n, m);
    else dropout_t(c, FG_F32, i, j0, n, m);
}

static void dropout_chunk64(const fg_norm_call *c, int64_t i, int64_t j0, int64_t n, double *m) {
    const double *x = (const double *)c->x + i * c->ld_x + j0;
    double *y = (double *)c->y + i * c->ld_y + j0;
    if (c->drop.on) drop_mults64(&c->drop, (uint64_t)(i * c->cols + j0), n, m);
    for (int64_t k = 0; k < n; k++) {
        const double v = x[k] * (c->drop.on ? m[k] : 1.0);
        y[k] = c->accumulate ? y[k] + v : v;
    }
}

#if defined(FG_Z) && defined(FG_HAVE_PHILOX_X16)
/* Elements [e0, e1) of a dropout over one contiguous run (f32 or bf16, t a constant at the call;
   e0 a multiple of 64) on AVX-512: each 64 elements' keep bits straight from z_keep_bits, applied
   to x in registers — y = x·m (+ y), m = keep ? scale : 0, as dropout_t forms it, without the
   multipliers' buffer; the last partial vector by lane masks. */
static inline __attribute__((always_inline, target(FG_Z_ISA ",bmi2"))) void
z_dropout_run_t(const fg_norm_call *c, fg_dtype t, int64_t e0, int64_t e1) {
    const z_keys keys = z_keys_make(c->drop.seed);
    const __m512i thr8 = _mm512_set1_epi32((int)(c->drop.threshold << 8));
    const __m512 scale = _mm512_set1_ps(c->drop.scale);
    for (int64_t e = e0; e < e1; e += 64) {
        const uint64_t keep = z_keep_bits((uint64_t)e >> 2, c->drop.offset, &keys, thr8);
        for (int b = 0; b < 4 && e + 16 * b < e1; b++) {
            const int64_t i = e + 16 * b;
            const __mmask16 k = fg_z_lanes(e1 - i);
            __m512 v = _mm512_mul_ps(fg_z_ld(c->x, t, i, k), _mm512_maskz_mov_ps((__mmask16)(keep >> 16 * b), scale));
            if (c->accumulate) v = _mm512_add_ps(fg_z_ld(c->y, t, i, k), v);
            fg_z_st(c->y, t, i, k, v);
        }
    }
}

__attribute__((target(FG_Z_ISA ",bmi2"))) static void z_dropout_run(const fg_norm_call *c, int64_t e0, int64_t e1) {
    if (c->dtype == FG_BF16) z_dropout_run_t(c, FG_BF16, e0, e1);
    else z_dropout_run_t(c, FG_F32, e0, e1);
}

/* Whether z_dropout_run takes the call: a dropout (0 < p < 1) over one contiguous run of f32 / bf16 */
static bool z_dropout_takes(const fg_norm_call *c) {
    return c->drop.on && c->drop.threshold < (1u << 24) && c->rows == 1 && (c->dtype == FG_F32 || c->dtype == FG_BF16) &&
           fg_z_usable() && fg_philox_z_usable();
}
#endif

/* Units of one row's CHUNK elements, split among the threads. */
static fg_status dropout(fg_context *ctx, fg_norm_call *c, bool run) {
    const int nt = threads_for(ctx);
    const size_t per = ALIGN_UP(CHUNK * sizeof(double));
    if (!run) {
        c->need = per * (size_t)nt;
        snprintf(c->name, sizeof c->name, "cpu:dropout");
        return FG_OK;
    }
    fg_norm_call flat;
    if (c->rows > 1 && c->ld_x == c->cols && c->ld_y == c->cols) { /* rows back to back: one row (same flat indices) */
        flat = *c;
        flat.cols = c->rows * c->cols, flat.rows = 1, flat.ld_x = flat.ld_y = flat.cols;
        c = &flat;
    }
    int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 15);
    if (team > nt) team = nt;
#if defined(FG_Z) && defined(FG_HAVE_PHILOX_X16)
    if (z_dropout_takes(c)) { /* the run split at multiples of 64 elements */
#pragma omp parallel num_threads(team) if (team > 1)
        {
            int64_t lo, hi;
            fg_cpu_share(c->cols, omp_get_num_threads(), omp_get_thread_num(), 64, &lo, &hi);
            z_dropout_run(c, lo, hi);
        }
        fg_record_kernel(ctx, c->name);
        return FG_OK;
    }
#endif
    const int64_t chunks = (c->cols + CHUNK - 1) / CHUNK, units = c->rows * chunks;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int id = omp_get_thread_num();
        int64_t lo, hi;
        fg_cpu_share(units, omp_get_num_threads(), id, 1, &lo, &hi);
        void *buf = thread_buf(c, 0, per, id);
        for (int64_t u = lo; u < hi; u++) {
            const int64_t i = u / chunks, j0 = (u % chunks) * CHUNK;
            const int64_t n = c->cols - j0 < CHUNK ? c->cols - j0 : CHUNK;
            if (c->dtype == FG_F64) dropout_chunk64(c, i, j0, n, buf);
            else dropout_chunk(c, i, j0, n, buf);
        }
    }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

/* ------------------------------------------------------------------ RevIN */

/* Row l of instance n: the flat row n·steps + l. */
static fg_status revin_stats(fg_context *ctx, fg_norm_call *c, bool run) {
    if (!run) {
        c->need = 0;
        snprintf(c->name, sizeof c->name, "cpu:revin_stats");
        return FG_OK;
    }
    const int64_t C = c->cols, L = c->steps;
    const fg_dtype t = c->dtype;
    const int team = fg_cpu_team(ctx, c->inst * L * C, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t n = 0; n < c->inst; n++)
        for (int64_t j = 0; j < C; j++) {
            double s = 0.0, q = 0.0;
            for (int64_t l = 0; l < L; l++) s += fg_v_ldd(c->x, t, (n * L + l) * c->ld_x + j);
            const double mean = s / (double)L;
            for (int64_t l = 0; l < L; l++) {
                const double d = fg_v_ldd(c->x, t, (n * L + l) * c->ld_x + j) - mean;
                q += d * d;
            }
            const double center = c->subtract_last ? fg_v_ldd(c->x, t, (n * L + L - 1) * c->ld_x + j) : mean;
            fg_store_f64(c->mean, c->acc, n * C + j, center);
            fg_store_f64(c->rstd, c->acc, n * C + j, sqrt(q / (double)L + c->eps));
        }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

static fg_status revin_apply(fg_context *ctx, fg_norm_call *c, bool run) {
    if (!run) {
        c->need = 0;
        snprintf(c->name, sizeof c->name, "cpu:revin_%s", c->denorm ? "denorm" : "norm");
        return FG_OK;
    }
    const int64_t C = c->cols, L = c->steps;
    const fg_dtype t = c->dtype;
    const double eps2 = c->eps * c->eps;
    const int team = fg_cpu_team(ctx, c->rows * C, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t i = 0; i < c->rows; i++) {
        const int64_t n = L > 0 ? i / L : 0;
        for (int64_t j = 0; j < C; j++) {
            const double x = fg_v_ldd(c->x, t, i * c->ld_x + j);
            const double mean = fg_load_f64(c->mean, c->acc, n * C + j), sd = fg_load_f64(c->rstd, c->acc, n * C + j);
            const double w = c->w ? fg_v_ldd(c->w, t, j) : 1.0, b = c->b ? fg_v_ldd(c->b, t, j) : 0.0;
            double y;
            if (t == FG_F64) y = c->denorm ? (x - b) / (w + eps2) * sd + mean : (x - mean) / sd * w + b;
            else if (c->denorm) y = ((float)x - (float)b) / ((float)w + (float)eps2) * (float)sd + (float)mean;
            else y = ((float)x - (float)mean) / (float)sd * (float)w + (float)b;
            fg_v_std(c->y, t, i * c->ld_y + j, y);
        }
    }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

static fg_status revin_backward(fg_context *ctx, fg_norm_call *c, bool run) {
    const int64_t C = c->cols, L = c->steps;
    const bool sums = c->dw || c->db;
    int64_t nb = 0, rb = 1;
    if (sums) col_blocks(c->rows, C, &nb, &rb);
    const size_t part_bytes = ALIGN_UP((size_t)(nb * 2 * C) * sizeof(double));
    if (!run) {
        c->need = part_bytes;
        snprintf(c->name, sizeof c->name, "cpu:revin_%s_backward", c->denorm ? "denorm" : "norm");
        return FG_OK;
    }
    const fg_dtype t = c->dtype;
    const double eps2 = c->eps * c->eps;
    double *part = (double *)c->scratch;
    const int64_t units = sums ? nb : c->rows;
    const int team = fg_cpu_team(ctx, c->rows * C, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t u = 0; u < units; u++) {
        const int64_t r0 = sums ? u * rb : u, r1 = sums ? (r0 + rb < c->rows ? r0 + rb : c->rows) : u + 1;
        double *pw = sums ? part + u * 2 * C : NULL, *pb = pw ? pw + C : NULL;
        if (pw)
            for (int64_t j = 0; j < 2 * C; j++) pw[j] = 0.0;
        for (int64_t i = r0; i < r1; i++) {
            const int64_t n = L > 0 ? i / L : 0;
            for (int64_t j = 0; j < C; j++) {
                const double dy = fg_v_ldd(c->dy, t, i * c->ld_dy + j), x = fg_v_ldd(c->x, t, i * c->ld_x + j);
                const double sd = fg_load_f64(c->rstd, c->acc, n * C + j);
                const double w = c->w ? fg_v_ldd(c->w, t, j) : 1.0, b = c->b ? fg_v_ldd(c->b, t, j) : 0.0;
                double dx, gw, gb;
                if (c->denorm) {
                    const double inv = 1.0 / (w + eps2);
                    dx = dy * sd * inv;
                    gw = -dy * (x - b) * sd * inv * inv;
                    gb = -dy * sd * inv;
                } else {
                    const double mean = fg_load_f64(c->mean, c->acc, n * C + j);
                    dx = dy * w / sd;
                    gw = dy * (x - mean) / sd;
                    gb = dy;
                }
                if (c->dx) {
                    const int64_t o = i * c->ld_dx + j;
                    fg_v_std(c->dx, t, o, c->accumulate ? dx + fg_v_ldd(c->dx, t, o) : dx);
                }
                if (pw) pw[j] += gw, pb[j] += gb;
            }
        }
    }
    if (sums) {
        finish_cols(ctx, part, 0, nb, 2 * C, C, c->dw, c->dw_dtype, c->accumulate);
        finish_cols(ctx, part, C, nb, 2 * C, C, c->db, c->db_dtype, c->accumulate);
    }
    fg_record_kernel(ctx, c->name);
    return FG_OK;
}

/* ------------------------------------------------------------------ entry */

fg_status fg_cpu_norm(fg_context *ctx, fg_norm_call *c, bool run) {
    if (c->step == FG_NORM_STEP_BN_FORWARD || c->step == FG_NORM_STEP_BN_BACKWARD)
        return fg_norm_bn_parts(ctx, c, run, fg_cpu_norm); /* the stats step, then the apply step */
    /* BatchNorm or RevIN over no channel (the row norms refuse D = 0; dropout walks elements):
       nothing in the rows to read or write but BatchNorm's count N. A [2^31, 0] view is valid
       and holds nothing, yet walking its rows took seconds (a fuzz finding: batch_norm_stats of
       [3e9, 0]). */
    if (run && c->cols == 0 && c->step != FG_NORM_STEP_DROPOUT) {
        if ((c->step == FG_NORM_STEP_BN_STATS || c->step == FG_NORM_STEP_BN_BACKWARD_STATS) && c->sums)
            c->sums[0] = (double)c->rows; /* {Σ [0], Σ [0], N} */
        fg_record_kernel(ctx, c->name);
        return FG_OK;
    }
    switch (c->step) {
    case FG_NORM_STEP_ROWS_FORWARD: return rows_forward(ctx, c, run);
    case FG_NORM_STEP_ROWS_BACKWARD: return rows_backward(ctx, c, run);
    case FG_NORM_STEP_BN_STATS: return bn_stats(ctx, c, run);
    case FG_NORM_STEP_BN_APPLY: return bn_apply(ctx, c, run);
    case FG_NORM_STEP_BN_BACKWARD_STATS: return bn_backward_stats(ctx, c, run);
    case FG_NORM_STEP_BN_BACKWARD_APPLY: return bn_backward_apply(ctx, c, run);
    case FG_NORM_STEP_DROPOUT: return dropout(ctx, c, run);
    case FG_NORM_STEP_REVIN_STATS: return revin_stats(ctx, c, run);
    case FG_NORM_STEP_REVIN_APPLY: return revin_apply(ctx, c, run);
    case FG_NORM_STEP_REVIN_BACKWARD: return revin_backward(ctx, c, run);
    case FG_NORM_STEP_BN_FORWARD:
    case FG_NORM_STEP_BN_BACKWARD: break; /* (split into their pairs above) */
    }
    return fg_fail(FG_ERR_INTERNAL, "cpu norm: unknown step %d", (int)c->step);
}

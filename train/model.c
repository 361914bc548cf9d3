/*
 * model.c — PatchTST (Nie et al., ICLR 2023: "A Time Series is Worth 64 Words") and a linear
 * baseline, forward and backward, as a sequence of fastgrad's public ops: no arithmetic on the
 * data happens in this file, only descriptors, buffers and the order of the calls.
 *
 * PatchTST, as its reference implementation (PatchTST_supervised, PatchTST_backbone) computes it,
 * each series of the batch on its own (channel independence, N = B·C sequences):
 *   RevIN        mean and stdev of each window and series over time; x̂ = (x − mean)/stdev·w + b
 *   patches      the series padded at the end by `stride` copies of its last step, cut into P
 *                patches of patch_len (fg_patch_forward reads x̂ [B, L, C] as [B, C, L] in place)
 *   embedding    u = patches·W_Pᵀ + b_P [N, P, d]; h = dropout(u + W_pos)
 *   encoder      per layer (post-norm, residual attention):
 *                  q, k, v = h·W_qkvᵀ + b (one product; q, k, v read in place as [N, H, P, hd])
 *                  o, scores = attention(q, k, v, scores_in = the previous layer's scores)
 *                  a = dropout(o·W_oᵀ + b_o); h1 = BatchNorm(h + dropout(a))
 *                  f = dropout(GELU(h1·W_1ᵀ + b_1)); g = f·W_2ᵀ + b_2; h = BatchNorm(h1 + dropout(g))
 *   head         y = flatten(h)·W_hᵀ + b_h [N, horizon] (flattened patch-major: [P, d] per
 *                sequence, a permutation of the reference's [d, P] order and of W_h's columns)
 *   RevIN⁻¹      the forecast back in the data's layout [B, H, C], (y − b)/(w + eps²)·stdev + mean
 * The linear baseline: RevIN, one Linear look-back → horizon shared by all series, RevIN⁻¹.
 * The loss is the MSE of the forecast in the standardized units (fg_regression_loss); Adam is
 * fg_adamw_step with weight_decay 0 over one flat arena of every parameter.
 *
 * Each parameter gets its gradient from one call per step except RevIN's (normalize and
 * denormalize both use it): the gradient arena is zeroed each step and the backward ops that
 * write a parameter's gradient add into it.
 */
#include "model.h"

#include "data.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REVIN_EPS 1e-5
#define BN_EPS 1e-5
#define BN_MOMENTUM 0.1

typedef struct layer {
    /* parameter offsets (floats into the arena) */
    int64_t wqkv, bqkv, wo, bo, bn1_w, bn1_b, w1, b1, w2, b2, bn2_w, bn2_b;
    int64_t rm1, rv1, rm2, rv2; /* buffer offsets */
    /* activations kept for the backward */
    void *qkv, *o, *lse, *scores, *a, *s1, *h1, *mean1, *rstd1, *pre, *f, *g, *s2, *h2, *mean2, *rstd2;
} layer;

#define MAX_NAMED 256
typedef struct named_param {
    char name[48];
    int64_t off, n;
} named_param;

struct model {
    config cfg;
    named_param named[MAX_NAMED];
    int n_named;
    int C, P, H, L, d, hd;
    fg_dtype dt, acc, bdt; /* the compute dtype (f32, bf16; f64 for --gradcheck on the CPU), the
                              statistics' (f32; f64 for f64), the running statistics' (f32 for bf16) */
    size_t es, aes, bes;   /* their element sizes */
    int64_t Bmax;
    device *dv;
    fg_context *ctx;
    /* arenas */
    int64_t n_params, n_buffers;
    void *p, *grad, *adam_m, *adam_v, *buf;
    float *master;         /* f32 weights when the compute dtype is bf16 (Adam updates them, rounds p) */
    /* parameter offsets */
    int64_t rev_w, rev_b, wp, bp, wpos, wh, bh, wlin, blin;
    layer *layers;
    /* activations */
    void *mean, *stdev, *xn, *patches, *u, *h0, *xt, *yo, *yt, *pred, *loss;
    /* gradients */
    void *dpred, *dyt, *dyo, *gx, *gmid, *dqkv, *dof, *da, *df, *dsa, *dsb, *dpatch, *dxn, *dxt;
    void *last_pred;
    char err[512];
};

/* ------------------------------------------------------------------ helpers */

static int fail(model *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* --profile: each call site's CPU time (the device synchronized after each op), by source line. */
#define PROF_SITES 128
typedef struct prof_site {
    int line;
    const char *call;
    double seconds;
    int64_t count;
    char kernels[96]; /* what the site's first call ran (fg_context_last_kernels) */
} prof_site;
static prof_site prof[PROF_SITES];
static int prof_on;

/* The process's CPU time: on a shared machine (other processes on the cores) a far steadier
 * measure of an op than the wall clock; with --threads 1 it is the op's time. FGT_PROFILE_WALL=1
 * takes the wall clock instead, to see which ops do not scale with the threads. */
static double prof_now(void) {
    static int wall = -1;
    if (wall < 0) wall = getenv("FGT_PROFILE_WALL") && atoi(getenv("FGT_PROFILE_WALL")) == 1;
    struct timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void prof_add(model *m, int line, const char *call, double t0) {
    if (fg_context_check(m->ctx) != FG_OK) return;
    const double dt = prof_now() - t0;
    for (int i = 0; i < PROF_SITES; i++)
        if (prof[i].line == line || prof[i].line == 0) {
            if (prof[i].line == 0) snprintf(prof[i].kernels, sizeof prof[i].kernels, "%s", fg_context_last_kernels(m->ctx));
            prof[i].line = line, prof[i].call = call, prof[i].seconds += dt, prof[i].count++;
            return;
        }
}

#define CK(call)                                                                                                      \
    do {                                                                                                              \
        const double ck_t0_ = prof_on ? prof_now() : 0;                                                               \
        fg_status ck_s_ = (call);                                                                                     \
        if (ck_s_ != FG_OK) return fail(m, "%s: %s", fg_status_string(ck_s_), fg_last_error());                       \
        if (prof_on) prof_add(m, __LINE__, #call, ck_t0_);                                                            \
    } while (0)

void model_profile(int on) { prof_on = on; }

static int by_time(const void *a, const void *b) {
    const prof_site *x = a, *y = b;
    return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : 0;
}

void model_profile_print(FILE *f) {
    int n = 0;
    double total = 0;
    while (n < PROF_SITES && prof[n].line) total += prof[n].seconds, n++;
    qsort(prof, (size_t)n, sizeof prof[0], by_time);
    const char *w = getenv("FGT_PROFILE_WALL");
    fprintf(f, "profile: %.3f s of %s in the model's ops (each op synchronized)\n", total,
            w && atoi(w) == 1 ? "wall-clock time" : "CPU time");
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s", prof[i].call);
        char *paren = strchr(name, '(');
        if (paren) *paren = 0;
        fprintf(f, "  %6.1f%%  %8.3f s  %7lld calls  %8.3f ms/call  model.c:%-4d %-28s %s\n",
                100 * prof[i].seconds / total, prof[i].seconds, (long long)prof[i].count,
                1e3 * prof[i].seconds / (double)prof[i].count, prof[i].line, name, prof[i].kernels);
    }
}

static fg_tensor t1(fg_dtype dt, const void *p, int64_t a) {
    const int64_t s[1] = {a};
    return fg_tensor_make((void *)p, dt, 1, s);
}
static fg_tensor t2(fg_dtype dt, const void *p, int64_t a, int64_t b) {
    const int64_t s[2] = {a, b};
    return fg_tensor_make((void *)p, dt, 2, s);
}
static fg_tensor t3(fg_dtype dt, const void *p, int64_t a, int64_t b, int64_t c) {
    const int64_t s[3] = {a, b, c};
    return fg_tensor_make((void *)p, dt, 3, s);
}
static fg_tensor t4(fg_dtype dt, const void *p, int64_t a, int64_t b, int64_t c, int64_t d) {
    const int64_t s[4] = {a, b, c, d};
    return fg_tensor_make((void *)p, dt, 4, s);
}
/* A view with explicit strides. */
static fg_tensor tv(fg_dtype dt, const void *p, int rank, const int64_t *shape, const int64_t *stride) {
    fg_tensor t = fg_tensor_make((void *)p, dt, rank, shape);
    for (int i = 0; i < rank; i++) t.stride[i] = stride[i];
    return t;
}
/* [a, b, c] stored as [a, c, b] (the last two dims swapped), read as [a, b, c]. */
static fg_tensor swapped(fg_dtype dt, const void *p, int64_t a, int64_t b, int64_t c) {
    const int64_t shape[3] = {a, b, c}, stride[3] = {b * c, 1, b};
    return tv(dt, p, 3, shape, stride);
}
/* Element n of the compute dtype's storage at p. */
static void *at(const model *m, const void *p, int64_t n) { return (char *)p + n * (int64_t)m->es; }
/* q, k or v (which = 0, 1, 2) of a packed [N, P, 3, H, hd] projection as [N, H, P, hd]. */
static fg_tensor head_view(const model *m, const void *qkv, int which, int64_t N, int64_t H, int64_t P, int64_t hd,
                           int64_t width) {
    const int64_t shape[4] = {N, H, P, hd}, stride[4] = {P * width, hd, width, 1};
    return tv(m->dt, at(m, qkv, which * H * hd), 4, shape, stride);
}

static const double one_scalar = 1.0;

/* dst [a, c, b] = src [a, b, c] with its last two dims swapped (a strided copy). */
static int transpose(model *m, const void *src, void *dst, int64_t a, int64_t b, int64_t c) {
    /* read src as [a, c, b]: element (i, j, k) at i·b·c + k·c + j */
    const fg_tensor x = swapped(m->dt, src, a, c, b), y = t3(m->dt, dst, a, c, b);
    CK(fg_unary_forward(m->ctx, FG_UNARY_SCALE, &one_scalar, &x, &y));
    return 0;
}

/* bf16 / f16 compute: the weights Adam updates are an f32 master copy. */
static bool low_precision(const model *m) { return m->dt == FG_BF16 || m->dt == FG_F16; }

/* Element off of the running statistics. */
static void *stat_at(const model *m, int64_t off) { return (char *)m->buf + off * (int64_t)m->bes; }

/* n elements of the compute dtype, or (alloc_acc) of the statistics' dtype. */
static void *alloc(model *m, int64_t n, int *bad) {
    void *p = device_alloc(m->dv, (size_t)n * m->es);
    if (!p) *bad = 1;
    return p;
}
static void *alloc_acc(model *m, int64_t n, int *bad) {
    void *p = device_alloc(m->dv, (size_t)n * m->aes);
    if (!p) *bad = 1;
    return p;
}

/* The dropout options of site `site` at step `step` (p = 0 when evaluating). The attention block's
 * two dropouts in a row (the output projection's, then the residual branch's) are one site: two
 * independent masks keep an element with probability (1 − p)² and scale it by 1/(1 − p)², which
 * is one dropout of p' = 1 − (1 − p)² — the same distribution, one pass instead of two. */
static fg_dropout_options drop(const model *m, int site, int64_t step, bool train) {
    fg_dropout_options o;
    const double p = m->cfg.dropout;
    o.p = !train ? 0.0 : (site - 1) % 4 == 1 ? 1.0 - (1.0 - p) * (1.0 - p) : p;
    o.seed = mix64(m->cfg.seed * 0x9E3779B97F4A7C15ull + (uint64_t)site + 1);
    o.offset = (uint64_t)step;
    return o;
}

enum { SITE_EMBED = 0, SITE_ATTN_RES = 2, SITE_FFN = 3, SITE_FFN_RES = 4 }; /* 1: merged into 2 (drop()) */
static int site(int layer, int what) { return what == SITE_EMBED ? 0 : 1 + 4 * layer + (what - 1); }

/* ------------------------------------------------------------------ construction */

static int64_t take(int64_t *n, int64_t count) {
    const int64_t at = *n;
    *n += (count + 15) & ~(int64_t)15; /* 64-byte aligned starts */
    return at;
}

/* A parameter of the arena, named as the reference's state_dict names it (for --gradcheck). */
static int64_t param(model *m, int64_t *n, const char *name, int layer, int64_t count) {
    const int64_t at = take(n, count);
    if (m->n_named < MAX_NAMED) {
        named_param *q = &m->named[m->n_named++];
        if (layer >= 0) snprintf(q->name, sizeof q->name, "layers.%d.%s", layer, name);
        else snprintf(q->name, sizeof q->name, "%s", name);
        q->off = at, q->n = count;
    }
    return at;
}

/* PyTorch's nn.Linear initialization: U(−1/√fan_in, 1/√fan_in) for the weight and the bias. */
static void init_uniform(float *h, int64_t n, double bound, rng *r) {
    for (int64_t i = 0; i < n; i++) h[i] = (float)((2.0 * rng_uniform(r) - 1.0) * bound);
}
static void init_const(float *h, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) h[i] = v;
}

int model_create(model **out, const config *cfg, int C, device *dv, uint64_t seed, char *err, size_t errlen) {
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    m->cfg = *cfg;
    m->dv = dv;
    m->ctx = dv->ctx;
    m->C = C;
    m->L = cfg->lookback;
    m->H = cfg->horizon;
    m->d = cfg->d_model;
    m->P = config_patches(cfg);
    m->Bmax = cfg->batch;
    m->dt = cfg->dtype;
    m->acc = cfg->dtype == FG_F64 ? FG_F64 : FG_F32;
    m->bdt = cfg->dtype == FG_F64 ? FG_F64 : FG_F32;
    m->es = fg_dtype_size(m->dt);
    m->aes = fg_dtype_size(m->acc);
    m->bes = fg_dtype_size(m->bdt);
    const bool pt = cfg->model == MODEL_PATCHTST;
    if (pt && (cfg->d_model % cfg->heads) != 0) {
        snprintf(err, errlen, "--d-model %d is not a multiple of --heads %d", cfg->d_model, cfg->heads);
        free(m);
        return -1;
    }
    m->hd = pt ? cfg->d_model / cfg->heads : 0;
    const int64_t d = m->d, P = m->P, S = cfg->patch_len, H = m->H, L = m->L, dff = cfg->d_ff;
    /* the parameters, in the order of the reference's state_dict */
    int64_t n = 0, nb = 0;
    m->rev_w = param(m, &n, "revin.affine_weight", -1, C), m->rev_b = param(m, &n, "revin.affine_bias", -1, C);
    if (pt) {
        m->wp = param(m, &n, "W_P.weight", -1, d * S), m->bp = param(m, &n, "W_P.bias", -1, d);
        m->wpos = param(m, &n, "W_pos", -1, P * d);
        m->layers = calloc((size_t)cfg->layers, sizeof(layer));
        if (!m->layers) {
            snprintf(err, errlen, "out of memory");
            free(m);
            return -1;
        }
        for (int l = 0; l < cfg->layers; l++) {
            layer *y = &m->layers[l];
            y->wqkv = param(m, &n, "W_QKV.weight", l, 3 * d * d), y->bqkv = param(m, &n, "W_QKV.bias", l, 3 * d);
            y->wo = param(m, &n, "to_out.weight", l, d * d), y->bo = param(m, &n, "to_out.bias", l, d);
            y->bn1_w = param(m, &n, "norm_attn.weight", l, d), y->bn1_b = param(m, &n, "norm_attn.bias", l, d);
            y->w1 = param(m, &n, "ff.0.weight", l, dff * d), y->b1 = param(m, &n, "ff.0.bias", l, dff);
            y->w2 = param(m, &n, "ff.3.weight", l, d * dff), y->b2 = param(m, &n, "ff.3.bias", l, d);
            y->bn2_w = param(m, &n, "norm_ffn.weight", l, d), y->bn2_b = param(m, &n, "norm_ffn.bias", l, d);
            y->rm1 = take(&nb, d), y->rv1 = take(&nb, d), y->rm2 = take(&nb, d), y->rv2 = take(&nb, d);
        }
        m->wh = param(m, &n, "head.linear.weight", -1, H * P * d), m->bh = param(m, &n, "head.linear.bias", -1, H);
    } else {
        m->wlin = param(m, &n, "linear.weight", -1, H * L), m->blin = param(m, &n, "linear.bias", -1, H);
    }
    m->n_params = n;
    m->n_buffers = nb;
    /* initial values on the host */
    float *hp = calloc((size_t)(n + 1), sizeof(float)), *hb = calloc((size_t)(nb + 1), sizeof(float));
    if (!hp || !hb) {
        free(hp), free(hb), free(m->layers), free(m);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    rng r;
    rng_seed(&r, seed);
    init_const(hp + m->rev_w, C, 1.0f);
    if (pt) {
        init_uniform(hp + m->wp, d * S, 1.0 / sqrt((double)S), &r);
        init_uniform(hp + m->bp, d, 1.0 / sqrt((double)S), &r);
        init_uniform(hp + m->wpos, P * d, 0.02, &r); /* positional_encoding('zeros'): U(−0.02, 0.02) */
        for (int l = 0; l < cfg->layers; l++) {
            layer *y = &m->layers[l];
            for (int j = 0; j < 3; j++) /* W_Q, W_K, W_V: three Linear(d, d) */
                init_uniform(hp + y->wqkv + j * d * d, d * d, 1.0 / sqrt((double)d), &r);
            init_uniform(hp + y->bqkv, 3 * d, 1.0 / sqrt((double)d), &r);
            init_uniform(hp + y->wo, d * d, 1.0 / sqrt((double)d), &r);
            init_uniform(hp + y->bo, d, 1.0 / sqrt((double)d), &r);
            init_const(hp + y->bn1_w, d, 1.0f);
            init_uniform(hp + y->w1, dff * d, 1.0 / sqrt((double)d), &r);
            init_uniform(hp + y->b1, dff, 1.0 / sqrt((double)d), &r);
            init_uniform(hp + y->w2, d * dff, 1.0 / sqrt((double)dff), &r);
            init_uniform(hp + y->b2, d, 1.0 / sqrt((double)dff), &r);
            init_const(hp + y->bn2_w, d, 1.0f);
            init_const(hb + y->rv1, d, 1.0f), init_const(hb + y->rv2, d, 1.0f);
        }
        init_uniform(hp + m->wh, H * P * d, 1.0 / sqrt((double)(P * d)), &r);
        init_uniform(hp + m->bh, H, 1.0 / sqrt((double)(P * d)), &r);
    } else {
        init_uniform(hp + m->wlin, H * L, 1.0 / sqrt((double)L), &r);
        init_uniform(hp + m->blin, H, 1.0 / sqrt((double)L), &r);
    }
    int bad = 0;
    m->p = alloc(m, n, &bad), m->grad = alloc(m, n, &bad);
    m->adam_m = device_alloc(dv, sizeof(float) * (size_t)(n + 1)), m->adam_v = device_alloc(dv, sizeof(float) * (size_t)(n + 1));
    bad |= !m->adam_m || !m->adam_v;
    m->buf = alloc_acc(m, nb + 1, &bad); /* the statistics' dtype */
    if (low_precision(m)) m->master = device_alloc(dv, sizeof(float) * (size_t)(n + 1)), bad |= !m->master;
    if (!bad) { /* the f32 draws in the compute dtype */
        void *tp = malloc((size_t)(n + nb + 1) * m->es);
        bad |= !tp || fg_convert(hp, FG_F32, tp, m->dt, n) != FG_OK || device_upload(dv, m->p, tp, (size_t)n * m->es);
        bad |= !tp || fg_convert(hb, FG_F32, tp, m->bdt, nb + 1) != FG_OK ||
               device_upload(dv, m->buf, tp, (size_t)(nb + 1) * m->bes);
        if (m->master) bad |= device_upload(dv, m->master, hp, sizeof(float) * (size_t)n) != 0;
        free(tp);
    }
    free(hp), free(hb);
    /* activations for batches of up to Bmax windows */
    const int64_t B = m->Bmax, N = B * C;
    m->mean = alloc_acc(m, N, &bad), m->stdev = alloc_acc(m, N, &bad);
    m->xn = alloc(m, B * L * C, &bad), m->dxn = alloc(m, B * L * C, &bad);
    m->yo = alloc(m, N * H, &bad), m->yt = alloc(m, N * H, &bad), m->pred = alloc(m, N * H, &bad);
    m->dpred = alloc(m, N * H, &bad), m->dyt = alloc(m, N * H, &bad), m->dyo = alloc(m, N * H, &bad);
    m->loss = alloc_acc(m, 16, &bad);
    if (pt) {
        const int64_t T = N * P, Hh = cfg->heads;
        m->patches = alloc(m, T * S, &bad), m->dpatch = alloc(m, T * S, &bad);
        m->u = alloc(m, T * d, &bad), m->h0 = alloc(m, T * d, &bad);
        for (int l = 0; l < cfg->layers && !bad; l++) {
            layer *y = &m->layers[l];
            y->qkv = alloc(m, T * 3 * d, &bad), y->o = alloc(m, T * d, &bad), y->lse = alloc_acc(m, N * Hh * P, &bad);
            y->scores = l + 1 < cfg->layers ? alloc(m, N * Hh * P * P, &bad) : NULL;
            y->a = alloc(m, T * d, &bad), y->s1 = alloc(m, T * d, &bad), y->h1 = alloc(m, T * d, &bad);
            y->mean1 = alloc_acc(m, d, &bad), y->rstd1 = alloc_acc(m, d, &bad);
            y->pre = alloc(m, T * dff, &bad), y->f = alloc(m, T * dff, &bad), y->g = alloc(m, T * d, &bad);
            y->s2 = alloc(m, T * d, &bad), y->h2 = alloc(m, T * d, &bad);
            y->mean2 = alloc_acc(m, d, &bad), y->rstd2 = alloc_acc(m, d, &bad);
        }
        m->gx = alloc(m, T * d, &bad), m->gmid = alloc(m, T * d, &bad), m->dqkv = alloc(m, T * 3 * d, &bad);
        m->dof = alloc(m, T * d, &bad), m->da = alloc(m, T * d, &bad), m->df = alloc(m, T * dff, &bad);
        if (cfg->layers > 1) m->dsa = alloc(m, N * Hh * P * P, &bad), m->dsb = alloc(m, N * Hh * P * P, &bad);
    } else {
        m->xt = alloc(m, N * L, &bad), m->dxt = alloc(m, N * L, &bad);
    }
    if (bad) {
        snprintf(err, errlen, "out of %s memory for the model's activations (batch %d)",
                 dv->backend == FG_BACKEND_CUDA ? "device" : "host", cfg->batch);
        model_destroy(m);
        return -1;
    }
    *out = m;
    return 0;
}

void model_destroy(model *m) {
    if (!m) return;
    device *dv = m->dv;
    device_free(dv, m->master);
    void **all[] = {&m->p, &m->grad, &m->adam_m, &m->adam_v, &m->buf, &m->mean, &m->stdev, &m->xn, &m->patches,
                     &m->u, &m->h0, &m->xt, &m->yo, &m->yt, &m->pred, &m->loss, &m->dpred, &m->dyt, &m->dyo,
                     &m->gx, &m->gmid, &m->dqkv, &m->dof, &m->da, &m->df, &m->dsa, &m->dsb, &m->dpatch, &m->dxn,
                     &m->dxt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) device_free(dv, *all[i]);
    for (int l = 0; m->layers && l < m->cfg.layers; l++) {
        layer *y = &m->layers[l];
        void **acts[] = {&y->qkv, &y->o, &y->lse, &y->scores, &y->a, &y->s1, &y->h1, &y->mean1, &y->rstd1,
                          &y->pre, &y->f, &y->g, &y->s2, &y->h2, &y->mean2, &y->rstd2};
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) device_free(dv, *acts[i]);
    }
    free(m->layers);
    free(m);
}

int64_t model_n_params(const model *m) { return m->n_params; }
int64_t model_n_buffers(const model *m) { return m->n_buffers; }
void *model_adam_m(model *m) { return m->adam_m; }
void *model_adam_v(model *m) { return m->adam_v; }
fg_dtype model_dtype(const model *m) { return m->dt; }

/* n values of dtype t on the device → f32 on the host (through a staging copy unless f32). */
static int download_f32(const model *m, float *dst, const void *src, fg_dtype t, int64_t n) {
    if (t == FG_F32) return device_download(m->dv, dst, src, sizeof(float) * (size_t)n);
    void *tmp = malloc(fg_dtype_size(t) * (size_t)(n + 1));
    int rc = !tmp || device_download(m->dv, tmp, src, fg_dtype_size(t) * (size_t)n) ||
             fg_convert(tmp, t, dst, FG_F32, n) != FG_OK;
    free(tmp);
    return rc ? -1 : 0;
}

static int upload_f32(const model *m, void *dst, fg_dtype t, const float *src, int64_t n) {
    if (t == FG_F32) return device_upload(m->dv, dst, src, sizeof(float) * (size_t)n);
    void *tmp = malloc(fg_dtype_size(t) * (size_t)(n + 1));
    int rc = !tmp || fg_convert(src, FG_F32, tmp, t, n) != FG_OK || device_upload(m->dv, dst, tmp, fg_dtype_size(t) * (size_t)n);
    free(tmp);
    return rc ? -1 : 0;
}

int model_get_state(const model *m, float *params, float *buffers) {
    if (m->master ? device_download(m->dv, params, m->master, sizeof(float) * (size_t)m->n_params)
                  : download_f32(m, params, m->p, m->dt, m->n_params))
        return -1;
    return download_f32(m, buffers, m->buf, m->bdt, m->n_buffers);
}

int model_set_state(model *m, const float *params, const float *buffers) {
    if (upload_f32(m, m->p, m->dt, params, m->n_params)) return -1;
    if (m->master && device_upload(m->dv, m->master, params, sizeof(float) * (size_t)m->n_params)) return -1;
    return upload_f32(m, m->buf, m->bdt, buffers, m->n_buffers);
}

int model_get_prediction(const model *m, float *out, int64_t n) {
    return m->last_pred ? download_f32(m, out, m->last_pred, m->dt, n) : -1;
}

void model_describe(const model *m, char *buf, size_t len) {
    const config *c = &m->cfg;
    if (c->model == MODEL_PATCHTST)
        snprintf(buf, len,
                 "PatchTST: %d layers, d_model %d, %d heads, d_ff %d, %d patches of %d (stride %d), dropout %g, "
                 "RevIN; %lld parameters",
                 c->layers, c->d_model, c->heads, c->d_ff, m->P, c->patch_len, c->stride, c->dropout,
                 (long long)m->n_params);
    else
        snprintf(buf, len, "linear: RevIN + Linear(%d, %d) shared by the series; %lld parameters", c->lookback,
                 c->horizon, (long long)m->n_params);
}

/* ------------------------------------------------------------------ forward */

static void *P_(model *m, int64_t off) { return at(m, m->p, off); }
static void *G_(model *m, int64_t off) { return at(m, m->grad, off); }

static int revin_in(model *m, const void *x, int64_t B) {
    const int64_t L = m->L, C = m->C;
    const fg_revin_options ro = {REVIN_EPS, 0, 0};
    const fg_tensor tx = t3(m->dt, x, B, L, C), mean = t2(m->acc, m->mean, B, C), sd = t2(m->acc, m->stdev, B, C);
    const fg_tensor w = t1(m->dt, P_(m, m->rev_w), C), b = t1(m->dt, P_(m, m->rev_b), C), xn = t3(m->dt, m->xn, B, L, C);
    CK(fg_revin_stats(m->ctx, &ro, &tx, &mean, &sd));
    CK(fg_revin_forward(m->ctx, &ro, &tx, &w, &b, &mean, &sd, &xn));
    return 0;
}

/* yo [B, C, H] → pred [B, H, C] (the transpose, then RevIN⁻¹). */
static int revin_out(model *m, int64_t B) {
    const int64_t H = m->H, C = m->C;
    if (transpose(m, m->yo, m->yt, B, C, H)) return -1;
    const fg_revin_options ro = {REVIN_EPS, 1, 0};
    const fg_tensor yt = t3(m->dt, m->yt, B, H, C), pred = t3(m->dt, m->pred, B, H, C);
    const fg_tensor mean = t2(m->acc, m->mean, B, C), sd = t2(m->acc, m->stdev, B, C);
    const fg_tensor w = t1(m->dt, P_(m, m->rev_w), C), b = t1(m->dt, P_(m, m->rev_b), C);
    CK(fg_revin_forward(m->ctx, &ro, &yt, &w, &b, &mean, &sd, &pred));
    return 0;
}

/* What the FFN's GELU saves for its backward (in y->pre): on the CPU its slope, made in the
 * forward's pass beside the value, so the backward's g = dy ⊙ s is one multiply instead of
 * erf and exp again (the same f32 slope, so the same bits); on CUDA the pre-activation, which
 * its fused short-K backward recomputes from. */
static fg_act_saved ffn_saved(const model *m) {
    return m->dv->backend == FG_BACKEND_CUDA ? FG_ACT_SAVED_PRE : FG_ACT_SAVED_SLOPE;
}

/* With the slope saved the FFN's dropout runs inside linear + activation (its option): y and the
 * saved slope come masked, and the backward reads the masked slope, so neither direction runs
 * a dropout pass of its own; with pre saved (CUDA) the dropout stays its own op both ways. */
static bool ffn_drop_fused(const model *m) { return ffn_saved(m) == FG_ACT_SAVED_SLOPE; }

static int forward_patchtst(model *m, int64_t B, int64_t step, bool train) {
    const config *c = &m->cfg;
    const int64_t N = B * m->C, P = m->P, d = m->d, S = c->patch_len, Hh = c->heads, hd = m->hd, T = N * P;
    const int64_t dff = c->d_ff;
    fg_context *ctx = m->ctx;
    /* patches of x̂ read as [B, C, L] */
    const fg_patch_options po = {S, c->stride, c->stride};
    const fg_tensor xs = swapped(m->dt, m->xn, B, m->C, m->L), pt = t4(m->dt, m->patches, B, m->C, P, S);
    CK(fg_patch_forward(ctx, &po, &xs, &pt));
    /* embedding */
    const fg_tensor pts = t2(m->dt, m->patches, T, S), wp = t2(m->dt, P_(m, m->wp), d, S), bp = t1(m->dt, P_(m, m->bp), d);
    const fg_tensor u = t3(m->dt, m->u, N, P, d), wpos = t2(m->dt, P_(m, m->wpos), P, d), h0 = t3(m->dt, m->h0, N, P, d);
    const fg_tensor u2 = t2(m->dt, m->u, T, d);
    CK(fg_linear_forward(ctx, &pts, &wp, &bp, &u2));
    CK(fg_axpby_forward(ctx, &u, &wpos, 1.0, 1.0, &h0));
    fg_dropout_options dop = drop(m, site(0, SITE_EMBED), step, train);
    if (dop.p > 0) CK(fg_dropout_forward(ctx, &dop, &h0, &h0));
    const void *h = m->h0;
    for (int l = 0; l < c->layers; l++) {
        layer *y = &m->layers[l];
        const fg_tensor hx = t2(m->dt, h, T, d), wqkv = t2(m->dt, P_(m, y->wqkv), 3 * d, d), bqkv = t1(m->dt, P_(m, y->bqkv), 3 * d);
        const fg_tensor qkv = t2(m->dt, y->qkv, T, 3 * d);
        CK(fg_linear_forward(ctx, &hx, &wqkv, &bqkv, &qkv));
        const fg_tensor q = head_view(m, y->qkv, 0, N, Hh, P, hd, 3 * d), k = head_view(m, y->qkv, 1, N, Hh, P, hd, 3 * d);
        const fg_tensor v = head_view(m, y->qkv, 2, N, Hh, P, hd, 3 * d), o = head_view(m, y->o, 0, N, Hh, P, hd, d);
        const fg_tensor lse = t3(m->acc, y->lse, N, Hh, P);
        fg_attention_options ao;
        memset(&ao, 0, sizeof ao);
        const fg_tensor sin = l > 0 ? t4(m->dt, m->layers[l - 1].scores, N, Hh, P, P) : t1(m->dt, NULL, 0);
        const fg_tensor sout = y->scores ? t4(m->dt, y->scores, N, Hh, P, P) : t1(m->dt, NULL, 0);
        CK(fg_attention_forward(ctx, &ao, &q, &k, &v, NULL, l > 0 ? &sin : NULL, &o, &lse, y->scores ? &sout : NULL));
        /* the output projection */
        const fg_tensor of = t2(m->dt, y->o, T, d), wo = t2(m->dt, P_(m, y->wo), d, d), bo = t1(m->dt, P_(m, y->bo), d);
        const fg_tensor a = t2(m->dt, y->a, T, d);
        CK(fg_linear_forward(ctx, &of, &wo, &bo, &a));
        /* h1 = BatchNorm(h + dropout(dropout(a))): the projection's and the residual's dropouts as one */
        fg_batch_norm_options bo1;
        memset(&bo1, 0, sizeof bo1);
        bo1.eval = !train;
        bo1.eps = BN_EPS;
        bo1.momentum = BN_MOMENTUM;
        bo1.dropout = drop(m, site(l, SITE_ATTN_RES), step, train);
        const fg_tensor w1n = t1(m->dt, P_(m, y->bn1_w), d), b1n = t1(m->dt, P_(m, y->bn1_b), d);
        const fg_tensor rm1 = t1(m->bdt, stat_at(m, y->rm1), d), rv1 = t1(m->bdt, stat_at(m, y->rv1), d);
        const fg_tensor s1 = t2(m->dt, y->s1, T, d), h1 = t2(m->dt, y->h1, T, d), mean1 = t1(m->acc, y->mean1, d), rstd1 = t1(m->acc, y->rstd1, d);
        CK(fg_batch_norm_forward(ctx, &bo1, &hx, &a, &w1n, &b1n, &rm1, &rv1, &h1, &s1, &mean1, &rstd1));
        /* the FFN: GELU (erf) with pre or its slope kept, dropout, the second Linear */
        const fg_tensor w1 = t2(m->dt, P_(m, y->w1), dff, d), b1 = t1(m->dt, P_(m, y->b1), dff), pre = t2(m->dt, y->pre, T, dff);
        const fg_tensor f = t2(m->dt, y->f, T, dff);
        dop = drop(m, site(l, SITE_FFN), step, train);
        const bool fuse = train && ffn_drop_fused(m);
        const fg_linear_act_options lo = {FG_ACT_GELU, train ? ffn_saved(m) : FG_ACT_SAVED_PRE, 0,
                                          fuse ? dop : (fg_dropout_options){0, 0, 0}};
        CK(fg_linear_act_forward_ex(ctx, &lo, &h1, &w1, &b1, &f, train ? &pre : NULL));
        if (!fuse && dop.p > 0) CK(fg_dropout_forward(ctx, &dop, &f, &f));
        const fg_tensor w2 = t2(m->dt, P_(m, y->w2), d, dff), b2 = t1(m->dt, P_(m, y->b2), d), g = t2(m->dt, y->g, T, d);
        CK(fg_linear_forward(ctx, &f, &w2, &b2, &g));
        /* h2 = BatchNorm(h1 + dropout(g)) */
        fg_batch_norm_options bo2 = bo1;
        bo2.dropout = drop(m, site(l, SITE_FFN_RES), step, train);
        const fg_tensor w2n = t1(m->dt, P_(m, y->bn2_w), d), b2n = t1(m->dt, P_(m, y->bn2_b), d);
        const fg_tensor rm2 = t1(m->bdt, stat_at(m, y->rm2), d), rv2 = t1(m->bdt, stat_at(m, y->rv2), d);
        const fg_tensor s2 = t2(m->dt, y->s2, T, d), h2 = t2(m->dt, y->h2, T, d), mean2 = t1(m->acc, y->mean2, d), rstd2 = t1(m->acc, y->rstd2, d);
        CK(fg_batch_norm_forward(ctx, &bo2, &h1, &g, &w2n, &b2n, &rm2, &rv2, &h2, &s2, &mean2, &rstd2));
        h = y->h2;
    }
    /* the flatten head */
    const fg_tensor z = t2(m->dt, h, N, P * d), wh = t2(m->dt, P_(m, m->wh), m->H, P * d), bh = t1(m->dt, P_(m, m->bh), m->H);
    const fg_tensor yo = t2(m->dt, m->yo, N, m->H);
    CK(fg_linear_forward(ctx, &z, &wh, &bh, &yo));
    return 0;
}

static int forward_linear(model *m, int64_t B) {
    const int64_t N = B * m->C, L = m->L, H = m->H;
    if (transpose(m, m->xn, m->xt, B, L, m->C)) return -1; /* [B, L, C] → [B, C, L] */
    const fg_tensor xt = t2(m->dt, m->xt, N, L), w = t2(m->dt, P_(m, m->wlin), H, L), b = t1(m->dt, P_(m, m->blin), H);
    const fg_tensor yo = t2(m->dt, m->yo, N, H);
    CK(fg_linear_forward(m->ctx, &xt, &w, &b, &yo));
    return 0;
}

static int forward(model *m, const void *x, int64_t B, int64_t step, bool train) {
    if (revin_in(m, x, B)) return -1;
    if (m->cfg.model == MODEL_PATCHTST ? forward_patchtst(m, B, step, train) : forward_linear(m, B)) return -1;
    return revin_out(m, B);
}

/* ------------------------------------------------------------------ backward */

static int backward_patchtst(model *m, int64_t B, int64_t step) {
    const config *c = &m->cfg;
    const int64_t N = B * m->C, P = m->P, d = m->d, S = c->patch_len, Hh = c->heads, hd = m->hd, T = N * P;
    const int64_t dff = c->d_ff, H = m->H;
    fg_context *ctx = m->ctx;
    const void *hlast = c->layers > 0 ? m->layers[c->layers - 1].h2 : m->h0;
    /* the head: dz into gx */
    const fg_tensor dyo = t2(m->dt, m->dyo, N, H), z = t2(m->dt, hlast, N, P * d), wh = t2(m->dt, P_(m, m->wh), H, P * d);
    const fg_tensor dz = t2(m->dt, m->gx, N, P * d), dwh = t2(m->dt, G_(m, m->wh), H, P * d), dbh = t1(m->dt, G_(m, m->bh), H);
    CK(fg_linear_backward_input(ctx, &dyo, &wh, &dz, 0));
    CK(fg_linear_backward_weight(ctx, &dyo, &z, &dwh, 1));
    CK(fg_linear_backward_bias(ctx, &dyo, &dbh, 1));
    void *ds_next = NULL; /* the gradient the layer's scores_out received */
    for (int l = c->layers - 1; l >= 0; l--) {
        layer *y = &m->layers[l];
        const void *hin = l > 0 ? m->layers[l - 1].h2 : m->h0;
        fg_batch_norm_options bo;
        memset(&bo, 0, sizeof bo);
        bo.eps = BN_EPS;
        bo.momentum = BN_MOMENTUM;
        /* h2 = BN(s2), s2 = h1 + dropout(g): gx holds dh2 → gmid = ds2 (= dh1 so far), da ← dg */
        bo.dropout = drop(m, site(l, SITE_FFN_RES), step, true);
        const fg_tensor gx = t2(m->dt, m->gx, T, d), gmid = t2(m->dt, m->gmid, T, d), dg = t2(m->dt, m->da, T, d);
        const fg_tensor s2 = t2(m->dt, y->s2, T, d), w2n = t1(m->dt, P_(m, y->bn2_w), d);
        const fg_tensor mean2 = t1(m->acc, y->mean2, d), rstd2 = t1(m->acc, y->rstd2, d);
        const fg_tensor dw2n = t1(m->dt, G_(m, y->bn2_w), d), db2n = t1(m->dt, G_(m, y->bn2_b), d);
        CK(fg_batch_norm_backward(ctx, &bo, &gx, &s2, &w2n, &mean2, &rstd2, &gmid, &dg, &dw2n, &db2n, 0));
        /* g = f·W2ᵀ + b2 */
        const fg_tensor f = t2(m->dt, y->f, T, dff), w2 = t2(m->dt, P_(m, y->w2), d, dff), df = t2(m->dt, m->df, T, dff);
        const fg_tensor dw2 = t2(m->dt, G_(m, y->w2), d, dff), db2 = t1(m->dt, G_(m, y->b2), d);
        CK(fg_linear_backward_input(ctx, &dg, &w2, &df, 0));
        CK(fg_linear_backward_weight(ctx, &dg, &f, &dw2, 1));
        CK(fg_linear_backward_bias(ctx, &dg, &db2, 1));
        fg_dropout_options dop = drop(m, site(l, SITE_FFN), step, true);
        if (!ffn_drop_fused(m) && dop.p > 0) CK(fg_dropout_backward(ctx, &dop, &df, &df, 0)); /* (fused: in the slope) */
        /* f = GELU(h1·W1ᵀ + b1): dh1 += into gmid */
        const fg_tensor h1 = t2(m->dt, y->h1, T, d), w1 = t2(m->dt, P_(m, y->w1), dff, d), b1 = t1(m->dt, P_(m, y->b1), dff);
        const fg_tensor pre = t2(m->dt, y->pre, T, dff), dw1 = t2(m->dt, G_(m, y->w1), dff, d), db1 = t1(m->dt, G_(m, y->b1), dff);
        const fg_linear_act_options lo = {FG_ACT_GELU, ffn_saved(m), 1, {0, 0, 0}};
        CK(fg_linear_act_backward_ex(ctx, &lo, &df, &pre, &h1, &w1, &b1, &gmid, &dw1, &db1, 1));
        /* h1 = BN(s1), s1 = h + dropout(a): gx ← ds1 (= dh so far), da ← da */
        bo.dropout = drop(m, site(l, SITE_ATTN_RES), step, true);
        const fg_tensor s1 = t2(m->dt, y->s1, T, d), w1n = t1(m->dt, P_(m, y->bn1_w), d);
        const fg_tensor mean1 = t1(m->acc, y->mean1, d), rstd1 = t1(m->acc, y->rstd1, d);
        const fg_tensor dw1n = t1(m->dt, G_(m, y->bn1_w), d), db1n = t1(m->dt, G_(m, y->bn1_b), d);
        const fg_tensor da = t2(m->dt, m->da, T, d);
        CK(fg_batch_norm_backward(ctx, &bo, &gmid, &s1, &w1n, &mean1, &rstd1, &gx, &da, &dw1n, &db1n, 0));
        /* a = o·Woᵀ + bo */
        const fg_tensor of = t2(m->dt, y->o, T, d), wo = t2(m->dt, P_(m, y->wo), d, d), dof = t2(m->dt, m->dof, T, d);
        const fg_tensor dwo = t2(m->dt, G_(m, y->wo), d, d), dbo = t1(m->dt, G_(m, y->bo), d);
        CK(fg_linear_backward_input(ctx, &da, &wo, &dof, 0));
        CK(fg_linear_backward_weight(ctx, &da, &of, &dwo, 1));
        CK(fg_linear_backward_bias(ctx, &da, &dbo, 1));
        /* attention: dq, dk, dv into dqkv; the scores_in gradient for the layer below */
        const fg_tensor q = head_view(m, y->qkv, 0, N, Hh, P, hd, 3 * d), k = head_view(m, y->qkv, 1, N, Hh, P, hd, 3 * d);
        const fg_tensor v = head_view(m, y->qkv, 2, N, Hh, P, hd, 3 * d), o = head_view(m, y->o, 0, N, Hh, P, hd, d);
        /* dq, dk, dv in three blocks of dqkv [3, T, d] (outputs must not interleave) */
        const fg_tensor dq = head_view(m, m->dqkv, 0, N, Hh, P, hd, d), dk = head_view(m, at(m, m->dqkv, T * d), 0, N, Hh, P, hd, d);
        const fg_tensor dv = head_view(m, at(m, m->dqkv, 2 * T * d), 0, N, Hh, P, hd, d), dov = head_view(m, m->dof, 0, N, Hh, P, hd, d);
        const fg_tensor lse = t3(m->acc, y->lse, N, Hh, P);
        void *ds_here = l > 0 ? (ds_next == m->dsa ? m->dsb : m->dsa) : NULL;
        const fg_tensor sin = l > 0 ? t4(m->dt, m->layers[l - 1].scores, N, Hh, P, P) : t1(m->dt, NULL, 0);
        const fg_tensor dsn = ds_next ? t4(m->dt, ds_next, N, Hh, P, P) : t1(m->dt, NULL, 0);
        const fg_tensor dsi = ds_here ? t4(m->dt, ds_here, N, Hh, P, P) : t1(m->dt, NULL, 0);
        fg_attention_options ao;
        memset(&ao, 0, sizeof ao);
        CK(fg_attention_backward(ctx, &ao, &dov, ds_next ? &dsn : NULL, &q, &k, &v, NULL, l > 0 ? &sin : NULL, &o, &lse,
                                 &dq, &dk, &dv, ds_here ? &dsi : NULL, 0));
        ds_next = ds_here;
        /* qkv_j = h·W_jᵀ + b_j (j = q, k, v; W_j rows j·d.. of W_qkv) as a batched product over j:
           c[j] = h·b[j] with b[j] = W_jᵀ, read in place. dh = Σ_j dqkv_j·W_j (added into gx);
           dW_jᵀ = hᵀ·dqkv_j in one batched product (three [d, d] blocks, each a long reduction over
           the T tokens); db_j = Σ dqkv_j over the tokens */
        const int64_t wt_shape[3] = {3, d, d}, wt_stride[3] = {d * d, 1, d};
        const fg_tensor dqkv = t3(m->dt, m->dqkv, 3, T, d), hx = t2(m->dt, hin, T, d);
        const fg_tensor wt = tv(m->dt, P_(m, y->wqkv), 3, wt_shape, wt_stride);
        const fg_tensor dwt = tv(m->dt, G_(m, y->wqkv), 3, wt_shape, wt_stride);
        CK(fg_matmul_backward_input(ctx, &dqkv, &wt, &gx, 1));
        CK(fg_matmul_backward_other(ctx, &hx, &dqkv, &dwt, 1));
        for (int j = 0; j < 3; j++) {
            const fg_tensor dj = t2(m->dt, at(m, m->dqkv, j * T * d), T, d), dbj = t1(m->dt, at(m, G_(m, y->bqkv), j * d), d);
            CK(fg_linear_backward_bias(ctx, &dj, &dbj, 1));
        }
    }
    /* the embedding: h0 = dropout(u + W_pos), u = patches·W_Pᵀ + b_P */
    const fg_tensor gx3 = t3(m->dt, m->gx, N, P, d), gx2 = t2(m->dt, m->gx, T, d);
    fg_dropout_options dop = drop(m, site(0, SITE_EMBED), step, true);
    if (dop.p > 0) CK(fg_dropout_backward(ctx, &dop, &gx3, &gx3, 0));
    const fg_tensor dwpos = t1(m->dt, G_(m, m->wpos), P * d), gxn = t2(m->dt, m->gx, N, P * d); /* Σ over the sequences */
    CK(fg_linear_backward_bias(ctx, &gxn, &dwpos, 1));
    const fg_tensor pts = t2(m->dt, m->patches, T, S), wp = t2(m->dt, P_(m, m->wp), d, S);
    const fg_tensor dwp = t2(m->dt, G_(m, m->wp), d, S), dbp = t1(m->dt, G_(m, m->bp), d), dpt = t2(m->dt, m->dpatch, T, S);
    CK(fg_linear_backward_weight(ctx, &gx2, &pts, &dwp, 1));
    CK(fg_linear_backward_bias(ctx, &gx2, &dbp, 1));
    CK(fg_linear_backward_input(ctx, &gx2, &wp, &dpt, 0));
    /* back through the patches onto x̂ [B, L, C] (read as [B, C, L]) */
    const fg_patch_options po = {S, c->stride, c->stride};
    const fg_tensor dpt4 = t4(m->dt, m->dpatch, B, m->C, P, S), dxs = swapped(m->dt, m->dxn, B, m->C, m->L);
    CK(fg_patch_backward(ctx, &po, &dpt4, &dxs, 0));
    return 0;
}

static int backward_linear(model *m, int64_t B) {
    const int64_t N = B * m->C, L = m->L, H = m->H;
    const fg_tensor dyo = t2(m->dt, m->dyo, N, H), xt = t2(m->dt, m->xt, N, L), w = t2(m->dt, P_(m, m->wlin), H, L);
    const fg_tensor dw = t2(m->dt, G_(m, m->wlin), H, L), db = t1(m->dt, G_(m, m->blin), H), dxt = t2(m->dt, m->dxt, N, L);
    CK(fg_linear_backward_weight(m->ctx, &dyo, &xt, &dw, 1));
    CK(fg_linear_backward_bias(m->ctx, &dyo, &db, 1));
    CK(fg_linear_backward_input(m->ctx, &dyo, &w, &dxt, 0));
    return transpose(m, m->dxt, m->dxn, B, m->C, L); /* [B, C, L] → [B, L, C] */
}

/* n values of the statistics' dtype from the device, as f64. */
static int read_acc(model *m, const void *src, int n, double *out) {
    float f[4];
    if (n > 4) return fail(m, "read_acc: %d values", n);
    if (m->acc == FG_F64) {
        if (device_download(m->dv, out, src, sizeof(double) * (size_t)n)) return fail(m, "cannot read a value back");
        return 0;
    }
    if (device_download(m->dv, f, src, sizeof(float) * (size_t)n)) return fail(m, "cannot read a value back");
    for (int i = 0; i < n; i++) out[i] = f[i];
    return 0;
}

/* The loss of a batch (into loss_slot on the device, or the model's own slot; read back into
 * *loss when loss is not NULL) and the gradient of every parameter (zeroed first) into the
 * gradient arena. */
static int loss_and_grad(model *m, const void *x, const void *y, int64_t B, int64_t step, void *loss_slot,
                         double *loss) {
    const int64_t H = m->H, C = m->C;
    if (B < 1 || B > m->Bmax) return fail(m, "a batch of %lld windows (1..%lld)", (long long)B, (long long)m->Bmax);
    if (device_zero(m->dv, m->grad, m->es * (size_t)m->n_params)) return fail(m, "cannot clear the gradients");
    if (forward(m, x, B, step, true)) return -1;
    const fg_regression_loss_options lo = {FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0};
    const fg_tensor pred = t3(m->dt, m->pred, B, H, C), target = t3(m->dt, y, B, H, C);
    const fg_tensor l = t1(m->acc, loss_slot ? loss_slot : m->loss, 1), dpred = t3(m->dt, m->dpred, B, H, C);
    CK(fg_regression_loss(m->ctx, &lo, &pred, &target, &l, &dpred, 0));
    /* back through RevIN⁻¹ (the affine's gradient, first of two) and the transpose */
    const fg_revin_options ro = {REVIN_EPS, 1, 0};
    const fg_tensor yt = t3(m->dt, m->yt, B, H, C), dyt = t3(m->dt, m->dyt, B, H, C);
    const fg_tensor mean = t2(m->acc, m->mean, B, C), sd = t2(m->acc, m->stdev, B, C);
    const fg_tensor w = t1(m->dt, P_(m, m->rev_w), C), b = t1(m->dt, P_(m, m->rev_b), C);
    const fg_tensor dw = t1(m->dt, G_(m, m->rev_w), C), db = t1(m->dt, G_(m, m->rev_b), C);
    CK(fg_revin_backward(m->ctx, &ro, &dpred, &yt, &w, &b, &mean, &sd, &dyt, &dw, &db, 0));
    if (transpose(m, m->dyt, m->dyo, B, H, C)) return -1; /* [B, H, C] → [B, C, H] */
    if (m->cfg.model == MODEL_PATCHTST ? backward_patchtst(m, B, step) : backward_linear(m, B)) return -1;
    /* RevIN's normalization: its affine's gradient (added) */
    const fg_revin_options rn = {REVIN_EPS, 0, 0};
    const fg_tensor tx = t3(m->dt, x, B, m->L, C), dxn = t3(m->dt, m->dxn, B, m->L, C);
    CK(fg_revin_backward(m->ctx, &rn, &dxn, &tx, &w, &b, &mean, &sd, NULL, &dw, &db, 1));
    return loss ? read_acc(m, loss_slot ? loss_slot : m->loss, 1, loss) : 0;
}

int model_train_step(model *m, const void *x, const void *y, int64_t B, double lr, int64_t step, float *loss,
                     char *err, size_t errlen) {
    if (loss_and_grad(m, x, y, B, step, loss, NULL)) {
        snprintf(err, errlen, "%s", m->err);
        return -1;
    }
    fg_adamw_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.lr = lr, hp.beta1 = 0.9, hp.beta2 = 0.999, hp.eps = 1e-8, hp.weight_decay = 0.0, hp.step = step;
    const fg_tensor tp = t1(m->dt, m->p, m->n_params), tg = t1(m->dt, m->grad, m->n_params);
    const fg_tensor tm = t1(FG_F32, m->adam_m, m->n_params), tv_ = t1(FG_F32, m->adam_v, m->n_params);
    const fg_tensor tw = t1(FG_F32, m->master, m->n_params);
    fg_status s = fg_adamw_step(m->ctx, &hp, 1, &tp, &tg, &tm, &tv_, m->master ? &tw : NULL);
    if (s != FG_OK) {
        snprintf(err, errlen, "%s: %s", fg_status_string(s), fg_last_error());
        return -1;
    }
    return 0;
}

/* The forward's loss alone, in training mode at `step` (the same dropout masks). */
static int loss_only(model *m, const void *x, const void *y, int64_t B, int64_t step, double *loss) {
    if (forward(m, x, B, step, true)) return -1;
    const fg_regression_loss_options lo = {FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0};
    const fg_tensor pred = t3(m->dt, m->pred, B, m->H, m->C), target = t3(m->dt, y, B, m->H, m->C), l = t1(m->acc, m->loss, 1);
    CK(fg_regression_loss(m->ctx, &lo, &pred, &target, &l, NULL, 0));
    return read_acc(m, m->loss, 1, loss);
}

int model_gradcheck(model *m, const void *x, const void *y, int64_t B, int probes, FILE *report, double *worst,
                    char *err, size_t errlen) {
    const int64_t n = m->n_params, nb = m->n_buffers;
    const bool f64 = m->dt == FG_F64;
    double *p = malloc(sizeof(double) * (size_t)(2 * n + 1)), *g = p ? p + n : NULL, loss = 0;
    void *raw = malloc(m->es * (size_t)(n + 1)), *buf = malloc(m->bes * (size_t)(nb + 1));
    int rc = -1;
    *worst = 0;
    m->err[0] = 0;
    if (!p || !raw || !buf) {
        fail(m, "out of memory");
        goto out;
    }
    if (m->dt != FG_F64 && m->dt != FG_F32) {
        fail(m, "gradcheck runs in f64 (CPU) or f32, not %s", fg_dtype_name(m->dt));
        goto out;
    }
    /* the running statistics move in every training forward: kept here, restored after */
    const int64_t step = 1;
    if (device_download(m->dv, buf, m->buf, m->bes * (size_t)nb) || loss_and_grad(m, x, y, B, step, NULL, &loss) ||
        device_download(m->dv, raw, m->grad, m->es * (size_t)n) || fg_convert(raw, m->dt, g, FG_F64, n) != FG_OK ||
        device_download(m->dv, raw, m->p, m->es * (size_t)n) || fg_convert(raw, m->dt, p, FG_F64, n) != FG_OK) {
        if (!m->err[0]) fail(m, "cannot read the gradients");
        goto out;
    }
    /* steps: f64 leaves truncation (h²) and rounding (1e-16/h) both near 1e-10; f32 resolves the
       loss to ~1e-7 of it, so its differences are coarse */
    const double rel_h = f64 ? 1e-5 : 1e-2;
    rng r;
    rng_seed(&r, 12345);
    fprintf(report, "gradcheck: loss %.9g on %lld windows; central differences in %s (h = %g·max(|p|, 0.1))\n", loss,
            (long long)B, fg_dtype_name(m->dt), rel_h);
    for (int t = 0; t < m->n_named && !m->err[0]; t++) {
        const named_param *q = &m->named[t];
        /* the entry of largest gradient (a real signal), and random ones */
        int64_t big = 0;
        for (int64_t i = 1; i < q->n; i++)
            if (fabs(g[q->off + i]) > fabs(g[q->off + big])) big = i;
        double tensor_worst = 0;
        for (int k = 0; k < probes; k++) {
            const int64_t i = q->off + (k == 0 ? big : (int64_t)rng_below(&r, (uint64_t)q->n));
            const double keep = p[i], h = rel_h * fmax(fabs(keep), 0.1);
            double lpm[2] = {0, 0};
            char v[8];
            for (int side = 0; side < 3; side++) { /* +h, −h, then the value restored */
                const double val = side == 0 ? keep + h : side == 1 ? keep - h : keep;
                if (fg_convert(&val, FG_F64, v, m->dt, 1) != FG_OK || device_upload(m->dv, at(m, m->p, i), v, m->es)) {
                    fail(m, "cannot set a weight");
                    break;
                }
                if (side < 2 && loss_only(m, x, y, B, step, &lpm[side])) break;
            }
            if (m->err[0]) break;
            const double fd = (lpm[0] - lpm[1]) / (2 * h), an = g[i];
            /* against the tensor's largest gradient: an entry's error at the dtype's resolution is a
               fraction of that scale; a wrong or missing term is of its size */
            const double noise = (f64 ? 1e-15 : 4e-7) * fabs(loss) / h + 1e-300;
            const double e = fabs(fd - an) / (fabs(g[q->off + big]) + 10 * noise);
            if (!(e <= tensor_worst)) tensor_worst = e;
        }
        fprintf(report, "  %-26s %8lld  max error %.2e of its largest gradient (%.3g)\n", q->name, (long long)q->n,
                tensor_worst, fabs(g[q->off + big]));
        if (!(tensor_worst <= *worst)) *worst = tensor_worst;
    }
    if (device_upload(m->dv, m->buf, buf, m->bes * (size_t)nb) && !m->err[0]) fail(m, "cannot restore the buffers");
    rc = m->err[0] ? -1 : 0;
out:
    if (rc) snprintf(err, errlen, "%s", m->err);
    free(p);
    free(raw);
    free(buf);
    return rc;
}

int model_eval(model *m, const void *x, const void *y, int64_t B, double *sse, double *sae, char *err,
               size_t errlen) {
    const int64_t H = m->H, C = m->C;
    int rc = -1;
    if (B < 1 || B > m->Bmax) {
        fail(m, "a batch of %lld windows (1..%lld)", (long long)B, (long long)m->Bmax);
        goto out;
    }
    if (forward(m, x, B, 0, false)) goto out;
    m->last_pred = m->pred;
    double host[2];
    for (int kind = 0; kind < 2; kind++) {
        const fg_regression_loss_options lo = {kind ? FG_LOSS_MAE : FG_LOSS_MSE, FG_REDUCTION_SUM, 0, 0};
        const fg_tensor pred = t3(m->dt, m->pred, B, H, C), target = t3(m->dt, y, B, H, C), l = t1(m->acc, (char *)m->loss + kind * (int64_t)m->aes, 1);
        fg_status s = fg_regression_loss(m->ctx, &lo, &pred, &target, &l, NULL, 0);
        if (s != FG_OK) {
            fail(m, "%s: %s", fg_status_string(s), fg_last_error());
            goto out;
        }
    }
    if (read_acc(m, m->loss, 2, host)) goto out;
    *sse = host[0];
    *sae = host[1];
    rc = 0;
out:
    if (rc) snprintf(err, errlen, "%s", m->err);
    return rc;
}

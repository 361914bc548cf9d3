/*
 * encoder.c — the transformer encoder layer (fastgrad.h, "Transformer encoder layer"): one call
 * runs a whole layer forward, one call its whole backward, composed from the library's own ops
 * (Linear, linear + activation, attention, the row norms, BatchNorm, dropout, axpby) on the
 * caller's context, so it runs on every backend those ops run on.
 *
 * Everything is validated up front (the descriptor, every tensor's dtype, shape, contiguity and
 * device, the cache and workspace sizes, outputs overlapping anything) before the first op is
 * launched; a refusal writes nothing. The forward keeps what the backward reads in the caller's
 * cache, laid out in one walk (layout(): 256-byte aligned regions, the same walk sizes and
 * places them); the backward's temporaries live in the caller's workspace; the ops themselves
 * use the context's workspace. An evaluation forward without a cache places its temporaries in
 * the context's workspace beside what the ops were planned to need (measured first).
 *
 * Dropout site k (0 the attention probabilities, 1 the attention branch, 2 the FFN hidden,
 * 3 the FFN branch) draws from (seed, 4·offset + k); the backward regenerates every mask.
 */
#include "../core/checks.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define REGION_ALIGN 256

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

/* ------------------------------------------------------------------ the parameters */

enum {
    P_WQKV, P_BQKV, P_WQ, P_BQ, P_WK, P_BK, P_WV, P_BV, P_WO, P_BO, P_W1, P_B1, P_W2, P_B2,
    P_N1W, P_N1B, P_N2W, P_N2B, P_RM1, P_RV1, P_RM2, P_RV2, P_N
};

#define PF(f) {#f, offsetof(fg_encoder_layer_params, f)}
static const struct {
    const char *name;
    size_t off;
} pfield[P_N] = {PF(w_qkv), PF(b_qkv), PF(w_q), PF(b_q), PF(w_k), PF(b_k), PF(w_v), PF(b_v),
                 PF(w_o), PF(b_o), PF(w_1), PF(b_1), PF(w_2), PF(b_2), PF(norm1_w), PF(norm1_b),
                 PF(norm2_w), PF(norm2_b), PF(running_mean1), PF(running_var1), PF(running_mean2),
                 PF(running_var2)};
#undef PF

/* Parameter i of p, or NULL when absent (rank 0). */
static const fg_tensor *pget(const fg_encoder_layer_params *p, int i) {
    if (!p) return NULL;
    const fg_tensor *t = (const fg_tensor *)(const void *)((const char *)p + pfield[i].off);
    return t->rank != 0 ? t : NULL;
}

/* The shape parameter i must have; gives its rank. */
static int pshape(int i, int64_t d, int64_t dff, int64_t shape[2]) {
    switch (i) {
    case P_WQKV: shape[0] = 3 * d, shape[1] = d; return 2;
    case P_BQKV: shape[0] = 3 * d; return 1;
    case P_WQ: case P_WK: case P_WV: case P_WO: shape[0] = d, shape[1] = d; return 2;
    case P_W1: shape[0] = dff, shape[1] = d; return 2;
    case P_B1: shape[0] = dff; return 1;
    case P_W2: shape[0] = d, shape[1] = dff; return 2;
    default: shape[0] = d; return 1;
    }
}

/* ------------------------------------------------------------------ the layer's geometry */

typedef struct geom {
    fg_dtype dt, acc;
    size_t es, as;           /* element sizes of dt and acc */
    int64_t B, L, T, d, H, hd, dff;
    bool pre, bn, packed;
    fg_norm_kind row_kind;   /* the row norms' kind (pre RMS: RMS, else LayerNorm) */
} geom;

/* What the FFN saves for its backward. 16-bit layers: the masked slope s̃ = m ⊙ act′(pre) (the
   hidden's dropout mask m applied to it as to f̃), so the backward's g = df ⊙ s̃ is one multiply
   with neither the mask nor the activation's derivative (on CUDA this takes gelu's arithmetic off
   the short-K backward, which it bounds, and the dropout passes away). 32- and 64-bit layers: pre,
   the backward forming act′ and the mask in its gradient pass, which in f32 runs at memory speed
   already while the forward's pass would write the slope's extra stream (docs/decisions.md 214). */
static bool slope_form(const geom *g) { return g->es == 2; }

/* The cache's regions (byte offsets); SIZE_MAX: not in this layout. */
typedef struct layout_t {
    size_t u1, qkv, o, lse, s1, h, u2, s2, f, act, mean1, rstd1, mean2, rstd2;
    size_t wcat, bcat;   /* separate w_q, w_k, w_v (b_q, b_k, b_v) gathered as one [3d, d] ([3d]) */
    size_t bytes;
} layout_t;

/* The workspace's regions. */
typedef struct wlayout {
    size_t ga, gb, gc, r, r2;
    size_t bytes;
} wlayout;

static bool mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}

/* Places `count` elements of `es` bytes at the next aligned offset; false on overflow. */
static bool place(size_t *off, int64_t count, size_t es, size_t *at) {
    int64_t bytes;
    if (!mul_ok(count, (int64_t)es, &bytes)) return false;
    size_t o = (*off + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
    if (o < *off || (uint64_t)bytes > (uint64_t)(SIZE_MAX - REGION_ALIGN) - o) return false;
    *at = o;
    *off = o + (size_t)bytes;
    return true;
}

/* The cache, in one walk: what the forward writes and the backward reads. keep_act: the FFN's
 * saved activation operand (training with FG_ENCODER_SAVE_ALL; see slope_form); lean (training with FG_ENCODER_SAVE_MIN):
 * neither the pre-norms' outputs u1, u2 nor the FFN hidden f (the forward's temporaries in the
 * workspace, recomputed by the backward). Row-norm statistics are per token, BatchNorm's per
 * channel. */
static bool layout(const geom *g, bool keep_act, bool lean, layout_t *c) {
    size_t off = 0;
    bool ok = true;
    const int64_t T = g->T, d = g->d;
    int64_t Td = 0, Td3 = 0, Tf = 0, BHL = 0;
    int64_t d3 = 0, dd3 = 0;
    ok = mul_ok(T, d, &Td) && mul_ok(Td, 3, &Td3) && mul_ok(T, g->dff, &Tf) && mul_ok(T, g->H, &BHL) &&
         mul_ok(d, 3, &d3) && mul_ok(d3, d, &dd3);
    if (!ok) return false;
    const int64_t nstat = g->bn ? d : T;
    const bool has_mean = g->bn || g->row_kind == FG_NORM_LAYER;
    c->u1 = c->s1 = c->u2 = c->s2 = c->act = c->mean1 = c->mean2 = SIZE_MAX;
    c->f = SIZE_MAX;
    if (g->pre && !lean) ok = ok && place(&off, Td, g->es, &c->u1);
    ok = ok && place(&off, Td3, g->es, &c->qkv);
    ok = ok && place(&off, Td, g->es, &c->o);
    ok = ok && place(&off, BHL, g->as, &c->lse);
    if (!g->pre) ok = ok && place(&off, Td, g->es, &c->s1);
    ok = ok && place(&off, Td, g->es, &c->h);
    if (g->pre && !lean) ok = ok && place(&off, Td, g->es, &c->u2);
    else if (!g->pre) ok = ok && place(&off, Td, g->es, &c->s2);
    if (!lean) ok = ok && place(&off, Tf, g->es, &c->f);
    if (keep_act) ok = ok && place(&off, Tf, g->es, &c->act);
    if (has_mean) ok = ok && place(&off, nstat, g->as, &c->mean1);
    ok = ok && place(&off, nstat, g->as, &c->rstd1);
    if (has_mean) ok = ok && place(&off, nstat, g->as, &c->mean2);
    ok = ok && place(&off, nstat, g->as, &c->rstd2);
    /* (whether the weights come packed is the params' choice, not the descriptor's: always here) */
    ok = ok && place(&off, dd3, g->es, &c->wcat) && place(&off, d3, g->es, &c->bcat);
    c->bytes = (off + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
    return ok && c->bytes >= off;
}

/* The backward's workspace: three [T, d] gradients (two for post-norm) and one region that
 * holds the FFN hidden's gradient [T, d_ff] first and q, k, v's [T, 3d] (interleaved as qkv) later. lean
 * (FG_ENCODER_SAVE_MIN): also r2 [T, d_ff], the recomputed slope or pre (then the activation's
 * gradient, formed in place); r first holds the recomputed FFN hidden. Its training forward places
 * u1 and u2 in ga and f in r. */
static bool wlayout_of(const geom *g, bool lean, wlayout *w) {
    size_t off = 0;
    int64_t Td, Td3, Tf;
    if (!mul_ok(g->T, g->d, &Td) || !mul_ok(Td, 3, &Td3) || !mul_ok(g->T, g->dff, &Tf)) return false;
    bool ok = place(&off, Td, g->es, &w->ga) && place(&off, Td, g->es, &w->gb);
    w->gc = SIZE_MAX;
    if (g->pre) ok = ok && place(&off, Td, g->es, &w->gc);
    ok = ok && place(&off, Tf > Td3 ? Tf : Td3, g->es, &w->r);
    w->r2 = SIZE_MAX;
    if (lean) ok = ok && place(&off, Tf, g->es, &w->r2);
    w->bytes = (off + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
    return ok && w->bytes >= off;
}

/* ------------------------------------------------------------------ validation */

static fg_status check_desc(const char *op, const fg_encoder_layer_desc *desc) {
    if (!desc) return fg_fail(FG_ERR_NULL_POINTER, "%s: desc is NULL", op);
    const fg_encoder_layer_desc *e = desc;
    if (e->d_model < 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->d_model (%lld) must be >= 1", op, (long long)e->d_model);
    if (e->heads < 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->heads (%lld) must be >= 1", op, (long long)e->heads);
    if (e->d_model % e->heads != 0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->heads (%lld) must divide desc->d_model (%lld)", op,
                       (long long)e->heads, (long long)e->d_model);
    if (e->d_ff < 1) return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->d_ff (%lld) must be >= 1", op, (long long)e->d_ff);
    if (e->activation != FG_ACT_GELU && e->activation != FG_ACT_GELU_TANH && e->activation != FG_ACT_RELU &&
        e->activation != FG_ACT_SILU)
        return fg_fail(FG_ERR_INVALID_VALUE,
                       "%s: desc->activation (%d) must be FG_ACT_GELU, FG_ACT_GELU_TANH, FG_ACT_RELU or FG_ACT_SILU", op,
                       (int)e->activation);
    if ((int)e->norm < 0 || (int)e->norm > 3)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->norm (%d) is not an fg_encoder_norm", op, (int)e->norm);
    if (!(e->norm_eps >= 0) || !isfinite(e->norm_eps))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->norm_eps (%g) must be finite and >= 0", op, e->norm_eps);
    if (!(e->bn_momentum >= 0 && e->bn_momentum <= 1))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->bn_momentum (%g) must be in [0, 1]", op, e->bn_momentum);
    if (!isfinite(e->attn_scale))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->attn_scale (%g) must be finite", op, e->attn_scale);
    if (e->causal != 0 && e->causal != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->causal (%d) must be 0 or 1", op, (int)e->causal);
    if (e->residual_scores != 0 && e->residual_scores != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->residual_scores (%d) must be 0 or 1", op,
                       (int)e->residual_scores);
    const double ps[4] = {e->dropout, e->dropout_ffn, e->dropout_attn, e->dropout_proj};
    static const char *const pn[4] = {"dropout", "dropout_ffn", "dropout_attn", "dropout_proj"};
    for (int i = 0; i < 4; i++)
        if (!(ps[i] >= 0 && ps[i] < 1))
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc->%s (%g) must be in [0, 1)", op, pn[i], ps[i]);
    if (e->save != FG_ENCODER_SAVE_ALL && e->save != FG_ENCODER_SAVE_LESS && e->save != FG_ENCODER_SAVE_MIN)
        return fg_fail(FG_ERR_INVALID_VALUE,
                       "%s: desc->save (%d) must be FG_ENCODER_SAVE_ALL, FG_ENCODER_SAVE_LESS or FG_ENCODER_SAVE_MIN", op,
                       (int)e->save);
    return FG_OK;
}

static fg_status check_dtype(const char *op, fg_dtype dt) {
    if (dt != FG_F32 && dt != FG_F16 && dt != FG_BF16 && dt != FG_F64)
        return fg_fail(FG_ERR_DTYPE, "%s: the layer's dtype is %s but it must be f32, f16, bf16 or f64", op,
                       fg_dtype_name(dt));
    return FG_OK;
}

static fg_status geom_of(const char *op, const fg_encoder_layer_desc *desc, fg_dtype dt, int64_t B, int64_t L,
                         geom *g) {
    memset(g, 0, sizeof *g);
    g->dt = dt, g->acc = acc_of(dt);
    g->es = fg_dtype_size(dt), g->as = fg_dtype_size(g->acc);
    g->B = B, g->L = L;
    if (!mul_ok(B, L, &g->T)) return fg_fail(FG_ERR_OVERFLOW, "%s: B·L overflows int64", op);
    g->d = desc->d_model, g->H = desc->heads, g->hd = desc->d_model / desc->heads, g->dff = desc->d_ff;
    g->pre = desc->norm == FG_ENCODER_PRE_LAYER || desc->norm == FG_ENCODER_PRE_RMS;
    g->bn = desc->norm == FG_ENCODER_POST_BATCH;
    g->row_kind = desc->norm == FG_ENCODER_PRE_RMS ? FG_NORM_RMS : FG_NORM_LAYER;
    return FG_OK;
}

/* A contiguous tensor of the given dtype and shape, on the context's device. */
static fg_status check_exact(fg_context *ctx, const char *op, const char *what, const fg_tensor *t, fg_dtype dt,
                             fg_dtype alt, int rank, const int64_t *shape) {
    FG_TRY(fg_check_any_desc(op, what, t, rank, rank));
    if (t->dtype != dt && t->dtype != alt) {
        if (alt != dt)
            return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s or %s", op, what, fg_dtype_name(t->dtype),
                           fg_dtype_name(dt), fg_dtype_name(alt));
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but the layer's dtype is %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(dt));
    }
    for (int i = 0; i < rank; i++)
        if (t->shape[i] != shape[i]) {
            char a[160], b[160];
            fg_tensor want;
            memset(&want, 0, sizeof want);
            want.rank = rank;
            for (int k = 0; k < rank; k++) want.shape[k] = shape[k];
            return fg_fail(FG_ERR_SHAPE, "%s: %s is %s but it must be %s", op, what, fg_shape_str(t, a, sizeof a),
                           fg_shape_str(&want, b, sizeof b));
        }
    FG_TRY(fg_check_contiguous(op, what, t));
    return fg_check_data(ctx, op, what, t);
}

/* The parameters (or, grads_of non-NULL, the gradients of those parameters). */
static fg_status check_params(fg_context *ctx, const char *op, const fg_encoder_layer_desc *desc, const geom *g,
                              const fg_encoder_layer_params *p, const fg_encoder_layer_params *grads_of, bool *packed,
                              const char *set) {
    if (!set) set = grads_of ? "grads" : "params";
    char what[80];
    for (int i = 0; i < P_N; i++) {
        const bool running = i >= P_RM1;
        if (grads_of && running) continue; /* ignored in a gradient struct */
        const fg_tensor *t = pget(p, i);
        if (!t) continue;
        snprintf(what, sizeof what, "%s->%s", set, pfield[i].name);
        if (grads_of && !pget(grads_of, i))
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s is given but params%s->%s is absent", op, what,
                           strncmp(set, "grads", 5) == 0 ? set + 5 : "", pfield[i].name);
        if (running && !g->bn)
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s is given but desc->norm is not FG_ENCODER_POST_BATCH", op,
                           what);
        int64_t shape[2];
        const int rank = pshape(i, g->d, g->dff, shape);
        /* running statistics: BatchNorm's accumulator dtype (f32; f64 for f64) or the layer's */
        FG_TRY(check_exact(ctx, op, what, t, g->dt, running ? (g->dt == FG_F64 ? FG_F64 : FG_F32) : g->dt, rank,
                           shape));
    }
    if (grads_of) return FG_OK;
    const bool pk = pget(p, P_WQKV) != NULL;
    const bool sep = pget(p, P_WQ) || pget(p, P_WK) || pget(p, P_WV);
    if (pk && sep)
        return fg_fail(FG_ERR_INVALID_VALUE,
                       "%s: %s->w_qkv and %s->w_q / w_k / w_v are both given (packed or separate, never both)",
                       op, set, set);
    if (!pk && !sep)
        return fg_fail(FG_ERR_NULL_POINTER, "%s: %s->w_qkv (or w_q, w_k, w_v) is absent", op, set);
    if (pk && (pget(p, P_BQ) || pget(p, P_BK) || pget(p, P_BV)))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s->b_q / b_k / b_v are given with the packed w_qkv "
                       "(its bias is b_qkv)", op, set);
    if (sep) {
        static const int ws[3] = {P_WQ, P_WK, P_WV};
        for (int j = 0; j < 3; j++)
            if (!pget(p, ws[j]))
                return fg_fail(FG_ERR_NULL_POINTER, "%s: %s->%s is absent (separate q, k, v need all three)", op,
                               set, pfield[ws[j]].name);
        if (pget(p, P_BQKV))
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s->b_qkv is given with separate w_q, w_k, w_v", op, set);
    }
    static const int req[3] = {P_WO, P_W1, P_W2};
    for (int j = 0; j < 3; j++)
        if (!pget(p, req[j]))
            return fg_fail(FG_ERR_NULL_POINTER, "%s: %s->%s is absent", op, set, pfield[req[j]].name);
    if (g->bn) {
        for (int i = P_RM1; i <= P_RV2; i++)
            if (!pget(p, i))
                return fg_fail(FG_ERR_NULL_POINTER, "%s: %s->%s is absent (post-norm BatchNorm needs its running "
                               "statistics)", op, set, pfield[i].name);
        if (pget(p, P_RM1)->dtype != pget(p, P_RV1)->dtype || pget(p, P_RM2)->dtype != pget(p, P_RV2)->dtype)
            return fg_fail(FG_ERR_DTYPE, "%s: %s->running_mean%s and running_var%s must have one dtype", op, set,
                           pget(p, P_RM1)->dtype != pget(p, P_RV1)->dtype ? "1" : "2",
                           pget(p, P_RM1)->dtype != pget(p, P_RV1)->dtype ? "1" : "2");
    }
    (void)desc;
    *packed = pk;
    return FG_OK;
}

/* x-like [B, L, d]; x itself gives B and L. */
static fg_status check_tokens(fg_context *ctx, const char *op, const char *what, const fg_tensor *t, const geom *g) {
    const int64_t shape[3] = {g->B, g->L, g->d};
    return check_exact(ctx, op, what, t, g->dt, g->dt, 3, shape);
}

static fg_status check_x(fg_context *ctx, const char *op, const fg_tensor *x, const fg_encoder_layer_desc *desc,
                         geom *g) {
    if (!x) return fg_fail(FG_ERR_NULL_POINTER, "%s: x is NULL", op);
    FG_TRY(fg_check_desc(op, "x", x, 3, 3));
    FG_TRY(check_dtype(op, x->dtype));
    if (ctx->backend == FG_BACKEND_CUDA && x->dtype == FG_F64)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: f64 runs on the CPU backend only", op);
    if (x->shape[2] != desc->d_model)
        return fg_fail(FG_ERR_SHAPE, "%s: x.shape[2]=%lld but desc->d_model=%lld", op, (long long)x->shape[2],
                       (long long)desc->d_model);
    FG_TRY(geom_of(op, desc, x->dtype, x->shape[0], x->shape[1], g));
    return check_tokens(ctx, op, "x", x, g);
}

static fg_status check_lengths(fg_context *ctx, const char *op, const fg_tensor *t, const geom *g) {
    if (!t) return FG_OK;
    const int64_t shape[1] = {g->B};
    if (t->dtype != FG_I32 && t->dtype != FG_I64) {
        FG_TRY(fg_check_any_desc(op, "lengths", t, 1, 1));
        return fg_fail(FG_ERR_DTYPE, "%s: lengths is %s but it must be i32 or i64", op, fg_dtype_name(t->dtype));
    }
    return check_exact(ctx, op, "lengths", t, t->dtype, t->dtype, 1, shape);
}

/* The score tensors given, [B, H, L, L] of one dtype: the layer's or the accumulator's. */
static fg_status check_scores(fg_context *ctx, const char *op, const fg_encoder_layer_desc *desc, const geom *g,
                              const fg_tensor *const *s, const char *const *names, int n) {
    const int64_t shape[4] = {g->B, g->H, g->L, g->L};
    const fg_tensor *first = NULL;
    const char *first_name = NULL;
    for (int i = 0; i < n; i++) {
        if (!s[i]) continue;
        if (!desc->residual_scores)
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s is given but desc->residual_scores is 0", op, names[i]);
        FG_TRY(check_exact(ctx, op, names[i], s[i], g->dt, g->acc, 4, shape));
        if (first && s[i]->dtype != first->dtype)
            return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but %s is %s: the scores share one dtype", op, names[i],
                           fg_dtype_name(s[i]->dtype), first_name, fg_dtype_name(first->dtype));
        if (!first) first = s[i], first_name = names[i];
    }
    return FG_OK;
}

/* A caller buffer (cache, workspace): NULL refused, aligned, on the device, large enough. */
static fg_status check_buffer(fg_context *ctx, const char *op, const char *what, const void *p, size_t bytes,
                              size_t need) {
    if (need == 0) return FG_OK;
    if (!p) return fg_fail(FG_ERR_NULL_POINTER, "%s: %s is NULL (%zu bytes needed)", op, what, need);
    if ((uintptr_t)p % 16 != 0)
        return fg_fail(FG_ERR_MISALIGNED, "%s: %s=%p is not 16-byte aligned", op, what, p);
    if (bytes < need)
        return fg_fail(FG_ERR_WORKSPACE, "%s: %s holds %zu bytes but %zu are needed (fg_encoder_layer_sizes)", op,
                       what, bytes, need);
    fg_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.dtype = FG_F32;
    t.rank = 1;
    t.shape[0] = 1;
    return fg_check_data(ctx, op, what, &t);
}

/* Memory ranges for the overlap check: an output may overlap nothing else given. */
typedef struct span {
    const char *name;
    uintptr_t lo, hi;
    bool out;
} span;

typedef struct spans {
    span *s;
    char (*names)[64];
    int n, cap;
} spans;

/* room for cap ranges (a layer's call: 64; a stack's: 64 a layer) */
static fg_status spans_init(spans *l, int cap) {
    l->n = 0, l->cap = cap;
    l->s = malloc(sizeof *l->s * (size_t)cap);
    l->names = malloc(sizeof *l->names * (size_t)cap);
    if (!l->s || !l->names) {
        free(l->s), free(l->names);
        l->s = NULL, l->names = NULL;
        return fg_fail(FG_ERR_OUT_OF_MEMORY, "encoder: no host memory for the overlap check");
    }
    return FG_OK;
}

static void spans_free(spans *l) { free(l->s), free(l->names); }

static void add_tensor(spans *l, const char *name, const fg_tensor *t, bool out) {
    if (!t || t->rank == 0 || l->n >= l->cap) return;
    const int64_t bytes = fg_extent_bytes(t);
    if (bytes <= 0 || !t->data) return;
    snprintf(l->names[l->n], sizeof l->names[l->n], "%s", name);
    l->s[l->n] = (span){l->names[l->n], (uintptr_t)t->data, (uintptr_t)t->data + (uintptr_t)bytes, out};
    l->n++;
}

static void add_bytes(spans *l, const char *name, const void *p, size_t bytes, bool out) {
    if (!p || bytes == 0 || l->n >= l->cap) return;
    snprintf(l->names[l->n], sizeof l->names[l->n], "%s", name);
    l->s[l->n] = (span){l->names[l->n], (uintptr_t)p, (uintptr_t)p + bytes, out};
    l->n++;
}

static void add_params(spans *l, const char *set, const fg_encoder_layer_params *p, bool out, bool running_out) {
    char name[64];
    for (int i = 0; i < P_N; i++) {
        const bool running = i >= P_RM1;
        if (out && running) continue;
        snprintf(name, sizeof name, "%s->%s", set, pfield[i].name);
        add_tensor(l, name, pget(p, i), out || (running && running_out));
    }
}

/* (frees the ranges) */
static fg_status check_spans(const char *op, spans *l) {
    fg_status st = FG_OK;
    for (int i = 0; i < l->n && st == FG_OK; i++)
        for (int j = i + 1; j < l->n; j++) {
            const span *a = &l->s[i], *b = &l->s[j];
            if (!a->out && !b->out) continue;
            if (a->lo < b->hi && b->lo < a->hi) {
                const span *o = a->out ? a : b, *other = a->out ? b : a;
                st = fg_fail(FG_ERR_ALIAS, "%s: output %s overlaps %s", op, o->name, other->name);
                break;
            }
        }
    spans_free(l);
    return st;
}

/* ------------------------------------------------------------------ running the parts */

/* How the parts run: on the context's workspace; planned only (measuring what workspace they
 * need, pointers not looked at); or on a workspace given. */
enum { SUB_CTX, SUB_MEASURE, SUB_WS };

typedef struct sub {
    fg_context *ctx;
    int mode;
    void *ws;
    size_t ws_bytes, need;
} sub;

static fg_status run_part_f(sub *e, fg_op op, const void *opt, const fg_tensor *const *args, int n, int acc,
                           uint32_t flags) {
    if (e->mode == SUB_CTX) return fg_run_op(e->ctx, op, opt, args, n, acc, flags);
    if (e->mode == SUB_MEASURE) {
        size_t need = 0;
        FG_TRY(fg_run_op_ws(e->ctx, op, opt, args, n, acc, flags, NULL, 0, &need));
        if (need > e->need) e->need = need;
        return FG_OK;
    }
    return fg_run_op_ws(e->ctx, op, opt, args, n, acc, flags, e->ws, e->ws_bytes, NULL);
}
static fg_status run_part(sub *e, fg_op op, const void *opt, const fg_tensor *const *args, int n, int acc) {
    return run_part_f(e, op, opt, args, n, acc, 0);
}

static fg_status lin_fwd(sub *e, const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_tensor *y) {
    const fg_tensor *a[4] = {x, w, b, y};
    return run_part(e, FG_OP_LINEAR_FORWARD, NULL, a, 4, 0);
}
static fg_status lin_bw_in(sub *e, const fg_tensor *dy, const fg_tensor *w, const fg_tensor *dx, int acc) {
    const fg_tensor *a[3] = {dy, w, dx};
    return run_part(e, FG_OP_LINEAR_BACKWARD_INPUT, NULL, a, 3, acc);
}
static fg_status lin_bw_w(sub *e, const fg_tensor *dy, const fg_tensor *x, const fg_tensor *dw, int acc) {
    if (!dw) return FG_OK;
    const fg_tensor *a[3] = {dy, x, dw};
    return run_part(e, FG_OP_LINEAR_BACKWARD_WEIGHT, NULL, a, 3, acc);
}
static fg_status lin_bw_b(sub *e, const fg_tensor *dy, const fg_tensor *db, int acc) {
    if (!db) return FG_OK;
    const fg_tensor *a[2] = {dy, db};
    return run_part(e, FG_OP_LINEAR_BACKWARD_BIAS, NULL, a, 2, acc);
}
static fg_status dropout_fwd(sub *e, const fg_dropout_options *o, const fg_tensor *x, const fg_tensor *y) {
    if (!(o->p > 0)) return FG_OK;
    const fg_tensor *a[2] = {x, y};
    return run_part(e, FG_OP_DROPOUT_FORWARD, o, a, 2, 0);
}
static fg_status dropout_bw(sub *e, const fg_dropout_options *o, const fg_tensor *dy, const fg_tensor *dx) {
    const fg_tensor *a[2] = {dy, dx};
    return run_part(e, FG_OP_DROPOUT_BACKWARD, o, a, 2, 0);
}

/* Zeros into t (contiguous, dt): a product over an empty reduction, on any backend. */
static fg_status zero(sub *e, const fg_tensor *t) {
    if (!t) return FG_OK;
    const int64_t n = fg_numel(t);
    if (n == 0) return FG_OK;
    const int64_t xs[1] = {0}, ws[2] = {n, 0}, ys[1] = {n};
    const fg_tensor x = fg_tensor_make(NULL, t->dtype, 1, xs), w = fg_tensor_make(NULL, t->dtype, 2, ws);
    const fg_tensor y = fg_tensor_make(t->data, t->dtype, 1, ys);
    return lin_fwd(e, &x, &w, NULL, &y);
}

/* Zeros into the rows of a [B, H, L, hd] view of a [T, width] buffer (heads()): the product of
   [T, 0] and [d, 0] into the [T, d] rows it covers. */
static fg_status zero_rows(sub *e, const fg_tensor *heads_view) {
    const int64_t T = heads_view->shape[0] * heads_view->shape[2], d = heads_view->shape[1] * heads_view->shape[3];
    if (T == 0 || d == 0) return FG_OK;
    const fg_dtype dt = heads_view->dtype;
    const int64_t xs[2] = {T, 0}, ws[2] = {d, 0}, ys[2] = {T, d};
    const fg_tensor x = fg_tensor_make(NULL, dt, 2, xs), w = fg_tensor_make(NULL, dt, 2, ws);
    fg_tensor y = fg_tensor_make(heads_view->data, dt, 2, ys);
    y.stride[0] = heads_view->stride[2], y.stride[1] = 1;
    return lin_fwd(e, &x, &w, NULL, &y);
}

/* ------------------------------------------------------------------ views */

static void *at(void *base, size_t off) { return off == SIZE_MAX ? NULL : (char *)base + off; }

static fg_tensor tv(fg_dtype dt, void *p, int rank, const int64_t *shape, const int64_t *stride) {
    fg_tensor t = fg_tensor_make(p, dt, rank, shape);
    if (stride)
        for (int i = 0; i < rank; i++) t.stride[i] = stride[i];
    return t;
}
static fg_tensor t1(fg_dtype dt, void *p, int64_t a) {
    const int64_t s[1] = {a};
    return tv(dt, p, 1, s, NULL);
}
static fg_tensor t2(fg_dtype dt, void *p, int64_t a, int64_t b) {
    const int64_t s[2] = {a, b};
    return tv(dt, p, 2, s, NULL);
}

/* Heads of a [T, width] buffer from column `col`: [B, H, L, hd]. */
static fg_tensor heads(const geom *g, void *p, int64_t col, int64_t width) {
    const int64_t shape[4] = {g->B, g->H, g->L, g->hd}, stride[4] = {g->L * width, g->hd, width, 1};
    return tv(g->dt, p ? (char *)p + (size_t)col * g->es : NULL, 4, shape, stride);
}

/* ------------------------------------------------------------------ the layer */

/* Everything one call resolved: the geometry and the operands. */
typedef struct layer {
    const fg_encoder_layer_desc *desc;
    geom g;
    bool train, keep_act, lean;  /* lean: training with FG_ENCODER_SAVE_MIN */
    uint64_t seed, offset;
    const fg_tensor *x, *lengths, *scores_in;
    const fg_tensor *p[P_N];   /* the parameters, NULL when absent */
    layout_t c;
    void *cache;
    wlayout w;    /* lean: the workspace's regions, ws its base (the forward's temporaries) */
    void *ws;
    /* a stack's residual attention in pieces (fg_encoder_forward): q, k of this layer and every
       earlier one, [B, H, L, P, hd] over the layers' caches (rank 0: the scores operands instead);
       the backward's dq, dk over the stack's gradient slabs, dqkv this layer's slab [T, 3d], and
       whether the attention adds into them (every layer but the last) */
    fg_tensor q5, k5, dq5, dk5;
    void *dqkv;
    int attn_acc;
} layer;

/* Site 1's rate: the branch's dropout after the projection's, as one mask (independent masks
   compose into one of rate 1 − (1 − p)(1 − p_proj)). */
static double branch1_p(const fg_encoder_layer_desc *d) {
    return 1.0 - (1.0 - d->dropout) * (1.0 - d->dropout_proj);
}

static fg_dropout_options drop(const layer *l, int site, double p) {
    fg_dropout_options o;
    o.p = l->train ? p : 0.0;
    o.seed = l->seed;
    o.offset = 4 * l->offset + (uint64_t)site;
    return o;
}

static fg_attention_options attn_opts(const layer *l) {
    fg_attention_options o;
    memset(&o, 0, sizeof o);
    o.scale = l->desc->attn_scale;
    o.causal = l->desc->causal;
    o.dropout_p = l->train ? l->desc->dropout_attn : 0.0;
    o.seed = l->seed;
    o.offset = 4 * l->offset + 0;
    return o;
}

static fg_norm_options row_opts(const layer *l, int site, double p) {
    fg_norm_options o;
    memset(&o, 0, sizeof o);
    o.kind = l->g.row_kind;
    o.eps = l->desc->norm_eps;
    o.dropout = drop(l, site, p);
    return o;
}

static fg_batch_norm_options bn_opts(const layer *l, int site, double p) {
    fg_batch_norm_options o;
    memset(&o, 0, sizeof o);
    o.eval = l->train ? 0 : 1;
    o.eps = l->desc->norm_eps;
    o.momentum = l->desc->bn_momentum;
    o.dropout = drop(l, site, p);
    return o;
}

/* The statistics of norm k (1, 2) in the cache: [T] per token or [d] per channel. */
static fg_tensor stat(const layer *l, void *base, size_t off) {
    return t1(l->g.acc, at(base, off), l->g.bn ? l->g.d : l->g.T);
}

static const fg_tensor *opt_t(const fg_tensor *t) { return t && t->rank ? t : NULL; }

/* The FFN hidden f̃ = dropout₂(act(u·W1ᵀ + b1)) into F, and into SAV when given the operand its
   backward reads (slope_form: the masked slope s̃ = m ⊙ act′(pre); else pre): the forward's call,
   and SAVE_MIN's backward recomputing them (the same call: the same bits). The dropout is
   linear + activation's own (in its activation pass or short-K tile where the backend has it
   there, else its dropout step on F and a slope: the bits of the dropout op either way). */
static fg_status ffn_hidden(sub *e, const layer *l, const fg_tensor *u, const fg_tensor *F, const fg_tensor *SAV) {
    fg_linear_act_options lo;
    memset(&lo, 0, sizeof lo);
    lo.act = l->desc->activation;
    lo.saved = SAV && slope_form(&l->g) ? FG_ACT_SAVED_SLOPE : FG_ACT_SAVED_PRE; /* (SAV NULL: nothing written) */
    lo.dropout = drop(l, 2, l->desc->dropout_ffn);
    const fg_tensor *a[5] = {u, l->p[P_W1], l->p[P_B1], F, SAV};
    return run_part(e, FG_OP_LINEAR_ACT_FORWARD, &lo, a, 5, 0);
}

/* Separate W_q, W_k, W_v (b_q, b_k, b_v) copied into the cache's [3d, d] ([3d]) regions, q rows
   first: the packed layout, so that q, k, v are one product forward and du one backward. An absent
   bias among present ones is zeros; bias false: none is present. */
static fg_status gather_qkv(sub *e, const layer *l, void *base, fg_tensor *WC, fg_tensor *BC, bool *bias) {
    const geom *g = &l->g;
    const int64_t d = g->d;
    static const int wj[3] = {P_WQ, P_WK, P_WV}, bj[3] = {P_BQ, P_BK, P_BV};
    char *wc = at(base, l->c.wcat), *bc = at(base, l->c.bcat);
    *WC = t2(g->dt, wc, 3 * d, d);
    *BC = t1(g->dt, bc, 3 * d);
    fg_elementwise_options copy;
    memset(&copy, 0, sizeof copy);
    copy.kind = FG_UNARY_SCALE;
    copy.scalars[0] = 1.0;
    *bias = l->p[P_BQ] || l->p[P_BK] || l->p[P_BV];
    for (int j = 0; j < 3; j++) {
        const fg_tensor Wj = t2(g->dt, wc ? wc + (size_t)(j * d * d) * g->es : NULL, d, d);
        const fg_tensor *a[2] = {l->p[wj[j]], &Wj};
        FG_TRY(run_part(e, FG_OP_UNARY_FORWARD, &copy, a, 2, 0));
        if (!*bias) continue;
        const fg_tensor Bj = t1(g->dt, bc ? bc + (size_t)(j * d) * g->es : NULL, d);
        if (l->p[bj[j]]) {
            const fg_tensor *ab[2] = {l->p[bj[j]], &Bj};
            FG_TRY(run_part(e, FG_OP_UNARY_FORWARD, &copy, ab, 2, 0));
        } else {
            FG_TRY(zero(e, &Bj));
        }
    }
    return FG_OK;
}

/* The forward on the cache at `base` (the cache, or the context's workspace in evaluation). */
static fg_status forward_walk(sub *e, const layer *l, void *base, const fg_tensor *y, const fg_tensor *scores_out) {
    const geom *g = &l->g;
    const layout_t *c = &l->c;
    const fg_dtype dt = g->dt;
    const int64_t T = g->T, d = g->d, dff = g->dff;
    const fg_encoder_layer_desc *desc = l->desc;
    const fg_tensor X = t2(dt, l->x->data, T, d), Y = t2(dt, y->data, T, d);
    /* lean: u1, then u2, in the workspace's ga; f in its r */
    void *u1 = l->lean ? at(l->ws, l->w.ga) : at(base, c->u1), *u2 = l->lean ? at(l->ws, l->w.ga) : at(base, c->u2);
    void *f = l->lean ? at(l->ws, l->w.r) : at(base, c->f), *sav = l->lean ? at(l->ws, l->w.r2) : at(base, c->act);
    const fg_tensor U1 = t2(dt, u1, T, d), H_ = t2(dt, at(base, c->h), T, d);
    const fg_tensor U2 = t2(dt, u2, T, d), S1 = t2(dt, at(base, c->s1), T, d);
    const fg_tensor S2 = t2(dt, at(base, c->s2), T, d);
    const fg_tensor F = t2(dt, f, T, dff), SAV = t2(dt, sav, T, dff);
    const fg_tensor m1 = stat(l, base, c->mean1), r1 = stat(l, base, c->rstd1);
    const fg_tensor m2 = stat(l, base, c->mean2), r2 = stat(l, base, c->rstd2);
    const bool has_mean = c->mean1 != SIZE_MAX;
    const fg_tensor *const *P = l->p;

    /* N1 (pre-norm) and the q, k, v projections into qkv [T, 3d] */
    if (g->pre) {
        const fg_norm_options no = row_opts(l, 1, 0.0);
        const fg_tensor *a[8] = {&X, NULL, P[P_N1W], P[P_N1B], &U1, NULL, has_mean ? &m1 : NULL, &r1};
        FG_TRY(run_part(e, FG_OP_NORM_FORWARD, &no, a, 8, 0));
    }
    const fg_tensor *qin = g->pre ? &U1 : &X;
    void *qkv = at(base, c->qkv);
    {
        const fg_tensor QKV = t2(dt, qkv, T, 3 * d);
        fg_tensor WC, BC;
        const fg_tensor *w = P[P_WQKV], *b = P[P_BQKV];
        if (!g->packed) { /* one product for the three: W_q, W_k, W_v gathered (the backward's too) */
            bool bias;
            FG_TRY(gather_qkv(e, l, base, &WC, &BC, &bias));
            w = &WC, b = bias ? &BC : NULL;
        }
        FG_TRY(lin_fwd(e, qin, w, b, &QKV));
    }
    /* attention → o [T, d]; the output projection a → y's memory */
    {
        const fg_tensor q = heads(g, qkv, 0, 3 * d), k = heads(g, qkv, d, 3 * d), v = heads(g, qkv, 2 * d, 3 * d);
        const fg_tensor o = heads(g, at(base, c->o), 0, d);
        const int64_t ls[3] = {g->B, g->H, g->L};
        const fg_tensor lse = tv(g->acc, at(base, c->lse), 3, ls, NULL);
        const fg_attention_options ao = attn_opts(l);
        const bool pc = l->q5.rank != 0;
        const fg_tensor *a[8] = {pc ? &l->q5 : &q, pc ? &l->k5 : &k, &v, l->lengths, l->scores_in, &o, &lse, scores_out};
        FG_TRY(run_part(e, FG_OP_ATTENTION_FORWARD, &ao, a, 8, 0));
        const fg_tensor O = t2(dt, at(base, c->o), T, d);
        FG_TRY(lin_fwd(e, &O, P[P_WO], P[P_BO], &Y));
    }
    /* the attention block's residual (dropout site 1) and norm */
    const fg_tensor *ffn_in;
    if (g->pre) {
        const fg_norm_options no = row_opts(l, 1, branch1_p(desc));
        const fg_tensor *a[8] = {&X, &Y, P[P_N2W], P[P_N2B], &U2, &H_, has_mean ? &m2 : NULL, &r2};
        FG_TRY(run_part(e, FG_OP_NORM_FORWARD, &no, a, 8, 0));
        ffn_in = &U2;
    } else if (!g->bn) {
        const fg_norm_options no = row_opts(l, 1, branch1_p(desc));
        const fg_tensor *a[8] = {&X, &Y, P[P_N1W], P[P_N1B], &H_, &S1, &m1, &r1};
        FG_TRY(run_part(e, FG_OP_NORM_FORWARD, &no, a, 8, 0));
        ffn_in = &H_;
    } else {
        const fg_batch_norm_options bo = bn_opts(l, 1, branch1_p(desc));
        const fg_tensor *a[10] = {&X, &Y, P[P_N1W], P[P_N1B], P[P_RM1], P[P_RV1], &H_, &S1, &m1, &r1};
        FG_TRY(run_part(e, FG_OP_BATCH_NORM_FORWARD, &bo, a, 10, 0));
        ffn_in = &H_;
    }
    /* the FFN: act(u·W1ᵀ + b1) (its slope or pre kept with SAVE_ALL; lean: written to the workspace,
       the backward's recomputing call the same), dropout site 2, then W2 → y's memory */
    FG_TRY(ffn_hidden(e, l, ffn_in, &F, l->keep_act || l->lean ? &SAV : NULL));
    FG_TRY(lin_fwd(e, &F, P[P_W2], P[P_B2], &Y));
    /* the FFN block's residual (dropout site 3) and, post-norm, its norm */
    if (g->pre) {
        const fg_dropout_options d3 = drop(l, 3, desc->dropout);
        FG_TRY(dropout_fwd(e, &d3, &Y, &Y));
        fg_elementwise_options eo;
        memset(&eo, 0, sizeof eo);
        eo.kind = FG_BINARY_AXPBY;
        eo.scalars[0] = eo.scalars[1] = 1.0;
        const fg_tensor *a[4] = {&H_, &Y, NULL, &Y};
        FG_TRY(run_part(e, FG_OP_BINARY_FORWARD, &eo, a, 4, 0));
    } else if (!g->bn) {
        const fg_norm_options no = row_opts(l, 3, desc->dropout);
        const fg_tensor *a[8] = {&H_, &Y, P[P_N2W], P[P_N2B], &Y, &S2, &m2, &r2};
        FG_TRY(run_part(e, FG_OP_NORM_FORWARD, &no, a, 8, 0));
    } else {
        const fg_batch_norm_options bo = bn_opts(l, 3, desc->dropout);
        const fg_tensor *a[10] = {&H_, &Y, P[P_N2W], P[P_N2B], P[P_RM2], P[P_RV2], &Y, &S2, &m2, &r2};
        FG_TRY(run_part(e, FG_OP_BATCH_NORM_FORWARD, &bo, a, 10, 0));
    }
    return FG_OK;
}

/* ------------------------------------------------------------------ public entries */

fg_status fg_encoder_layer_sizes(const fg_encoder_layer_desc *desc, fg_dtype dtype, int64_t B, int64_t L,
                                 size_t *cache_bytes, size_t *workspace_bytes) {
    const char *op = "encoder_layer_sizes";
    FG_TRY(check_desc(op, desc));
    FG_TRY(check_dtype(op, dtype));
    if (B < 0 || L < 0)
        return fg_fail(FG_ERR_SHAPE, "%s: B=%lld and L=%lld must be >= 0", op, (long long)B, (long long)L);
    geom g;
    FG_TRY(geom_of(op, desc, dtype, B, L, &g));
    layout_t c;
    wlayout w;
    const bool lean = desc->save == FG_ENCODER_SAVE_MIN;
    if (!layout(&g, desc->save == FG_ENCODER_SAVE_ALL, lean, &c) || !wlayout_of(&g, lean, &w))
        return fg_fail(FG_ERR_OVERFLOW, "%s: the cache or workspace of B=%lld, L=%lld overflows", op, (long long)B,
                       (long long)L);
    if (cache_bytes) *cache_bytes = g.T ? c.bytes : 0;
    if (workspace_bytes) *workspace_bytes = g.T ? w.bytes : 0;
    fg_clear_error();
    return FG_OK;
}

static fg_status check_run_opts(const char *op, const fg_encoder_layer_run *run) {
    if (!run) return fg_fail(FG_ERR_NULL_POINTER, "%s: run is NULL", op);
    if (run->train != 0 && run->train != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: run->train (%d) must be 0 or 1", op, (int)run->train);
    return FG_OK;
}

/* What forward and backward share: ctx, desc, run, x, lengths, scores_in, params. */
static fg_status resolve_set(fg_context *ctx, const char *op, const fg_encoder_layer_desc *desc,
                             const fg_encoder_layer_run *run, const fg_tensor *x, const fg_tensor *lengths,
                             const fg_tensor *scores_in, const fg_encoder_layer_params *params, layer *l,
                             const char *set) {
    memset(l, 0, sizeof *l);
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "%s: ctx is NULL", op);
    FG_TRY(check_desc(op, desc));
    FG_TRY(check_run_opts(op, run));
    if (!params) return fg_fail(FG_ERR_NULL_POINTER, "%s: params is NULL", op);
    FG_TRY(check_x(ctx, op, x, desc, &l->g));
    l->desc = desc;
    l->train = run->train != 0;
    l->seed = run->seed, l->offset = run->offset;
    l->x = x;
    l->lengths = opt_t(lengths);
    l->scores_in = opt_t(scores_in);
    FG_TRY(check_lengths(ctx, op, l->lengths, &l->g));
    FG_TRY(check_params(ctx, op, desc, &l->g, params, NULL, &l->g.packed, set));
    for (int i = 0; i < P_N; i++) l->p[i] = pget(params, i);
    if (l->g.bn && l->train && l->g.T < 2 && l->g.T > 0)
        return fg_fail(FG_ERR_SHAPE, "%s: BatchNorm in training needs more than one token (B·L = %lld)", op,
                       (long long)l->g.T);
    return FG_OK;
}

static fg_status resolve(fg_context *ctx, const char *op, const fg_encoder_layer_desc *desc,
                         const fg_encoder_layer_run *run, const fg_tensor *x, const fg_tensor *lengths,
                         const fg_tensor *scores_in, const fg_encoder_layer_params *params, layer *l) {
    return resolve_set(ctx, op, desc, run, x, lengths, scores_in, params, l, NULL);
}

/* Both forward entries; with_ws: the _ws entry (workspace given, or NULL where not needed). */
static fg_status forward_entry(const char *op, fg_context *ctx, const fg_encoder_layer_desc *desc,
                               const fg_encoder_layer_run *run, const fg_tensor *x, const fg_tensor *lengths,
                               const fg_tensor *scores_in, const fg_encoder_layer_params *params, const fg_tensor *y,
                               const fg_tensor *scores_out, void *cache, size_t cache_bytes, void *workspace,
                               size_t workspace_bytes, bool with_ws) {
    layer l;
    FG_TRY(resolve(ctx, op, desc, run, x, lengths, scores_in, params, &l));
    const geom *g = &l.g;
    if (!y) return fg_fail(FG_ERR_NULL_POINTER, "%s: y is NULL", op);
    FG_TRY(check_tokens(ctx, op, "y", y, g));
    scores_out = opt_t(scores_out);
    {
        const fg_tensor *s[2] = {l.scores_in, scores_out};
        static const char *const sn[2] = {"scores_in", "scores_out"};
        FG_TRY(check_scores(ctx, op, desc, g, s, sn, 2));
    }
    l.keep_act = l.train && desc->save == FG_ENCODER_SAVE_ALL;
    l.lean = l.train && desc->save == FG_ENCODER_SAVE_MIN;
    if (!layout(g, l.keep_act, l.lean, &l.c) || !wlayout_of(g, l.lean, &l.w))
        return fg_fail(FG_ERR_OVERFLOW, "%s: the cache or workspace of B=%lld, L=%lld overflows", op, (long long)g->B,
                       (long long)g->L);
    const size_t need = g->T ? l.c.bytes : 0, wneed = g->T && l.lean ? l.w.bytes : 0;
    /* evaluation without a cache, or with SAVE_MIN's (sized for what training keeps, not for the
       temporaries): the temporaries in the context's workspace */
    const bool own = !l.train && (!cache || desc->save == FG_ENCODER_SAVE_MIN);
    if (!own) FG_TRY(check_buffer(ctx, op, "cache", cache, cache_bytes, need));
    if (l.lean && !with_ws)
        return fg_fail(FG_ERR_NULL_POINTER,
                       "%s: desc->save is FG_ENCODER_SAVE_MIN, whose training forward needs a workspace "
                       "(fg_encoder_layer_forward_ws)", op);
    if (l.lean) FG_TRY(check_buffer(ctx, op, "workspace", workspace, workspace_bytes, wneed));
    l.ws = l.lean ? workspace : NULL;
    spans sp;
    FG_TRY(spans_init(&sp, 64));
    add_tensor(&sp, "x", x, false);
    add_tensor(&sp, "lengths", l.lengths, false);
    add_tensor(&sp, "scores_in", l.scores_in, false);
    add_params(&sp, "params", params, false, l.train && g->bn);
    add_tensor(&sp, "y", y, true);
    add_tensor(&sp, "scores_out", scores_out, true);
    if (!own) add_bytes(&sp, "cache", cache, need, true);
    if (l.lean) add_bytes(&sp, "workspace", workspace, wneed, true);
    FG_TRY(check_spans(op, &sp));
    if (g->T == 0) {
        fg_clear_error();
        return FG_OK;
    }
    sub e;
    memset(&e, 0, sizeof e);
    e.ctx = ctx;
    if (!own) {
        e.mode = SUB_CTX;
        FG_TRY(forward_walk(&e, &l, cache, y, scores_out));
        fg_clear_error();
        return FG_OK;
    }
    /* Plan every part first (what workspace they need), then hold both in the context's
       workspace: the temporaries from a 256-aligned start, the parts' workspace after them. */
    e.mode = SUB_MEASURE;
    FG_TRY(forward_walk(&e, &l, (void *)(uintptr_t)REGION_ALIGN, y, scores_out));
    const size_t part = (e.need + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
    if (need > SIZE_MAX - part - 2 * REGION_ALIGN)
        return fg_fail(FG_ERR_OVERFLOW, "%s: the evaluation's temporaries overflow", op);
    void *ws = NULL;
    FG_TRY(fg_context_workspace(ctx, need + part + REGION_ALIGN, &ws));
    char *base = (char *)(((uintptr_t)ws + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN);
    e.mode = SUB_WS;
    e.ws = base + need;
    e.ws_bytes = part;
    e.need = 0;
    FG_TRY(forward_walk(&e, &l, base, y, scores_out));
    fg_clear_error();
    return FG_OK;
}

fg_status fg_encoder_layer_forward(fg_context *ctx, const fg_encoder_layer_desc *desc, const fg_encoder_layer_run *run,
                                   const fg_tensor *x, const fg_tensor *lengths, const fg_tensor *scores_in,
                                   const fg_encoder_layer_params *params, const fg_tensor *y,
                                   const fg_tensor *scores_out, void *cache, size_t cache_bytes) {
    return forward_entry("encoder_layer_forward", ctx, desc, run, x, lengths, scores_in, params, y, scores_out, cache,
                         cache_bytes, NULL, 0, false);
}

fg_status fg_encoder_layer_forward_ws(fg_context *ctx, const fg_encoder_layer_desc *desc,
                                      const fg_encoder_layer_run *run, const fg_tensor *x, const fg_tensor *lengths,
                                      const fg_tensor *scores_in, const fg_encoder_layer_params *params,
                                      const fg_tensor *y, const fg_tensor *scores_out, void *cache, size_t cache_bytes,
                                      void *workspace, size_t workspace_bytes) {
    return forward_entry("encoder_layer_forward_ws", ctx, desc, run, x, lengths, scores_in, params, y, scores_out,
                         cache, cache_bytes, workspace, workspace_bytes, true);
}

/* One call whose outputs are partly the layer's temporaries and partly the caller's gradients:
 * the part's single accumulate flag is 1 when any output adds; then the outputs that are meant
 * to be overwritten are zeroed first. */
static fg_status prezero(sub *e, int acc, const fg_tensor *t) { return acc ? zero(e, t) : FG_OK; }

/* What both backward entries check besides the layer: a training forward's, accumulate 0 or 1, dy,
   and dx when given (NULL when absent). */
static fg_status check_backward_args(fg_context *ctx, const char *op, const layer *l, int accumulate,
                                     const fg_tensor *dy, const fg_tensor **dx) {
    if (!l->train)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: run->train is 0 (the backward is of a training forward)", op);
    if (accumulate != 0 && accumulate != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate (%d) must be 0 or 1", op, accumulate);
    if (!dy) return fg_fail(FG_ERR_NULL_POINTER, "%s: dy is NULL", op);
    FG_TRY(check_tokens(ctx, op, "dy", dy, &l->g));
    *dx = opt_t(*dx);
    return *dx ? check_tokens(ctx, op, "dx", *dx, &l->g) : FG_OK;
}

static fg_status backward_walk(sub *ep, const layer *lp, const void *cache, const wlayout *wp, void *workspace,
                               const fg_tensor *dy, const fg_tensor *dscores_out, const fg_tensor *dx,
                               const fg_tensor *dscores_in, const fg_tensor *const *G, int U);

fg_status fg_encoder_layer_backward(fg_context *ctx, const fg_encoder_layer_desc *desc, const fg_encoder_layer_run *run,
                                    const fg_tensor *dy, const fg_tensor *dscores_out, const fg_tensor *x,
                                    const fg_tensor *lengths, const fg_tensor *scores_in,
                                    const fg_encoder_layer_params *params, const void *cache, size_t cache_bytes,
                                    const fg_tensor *dx, const fg_tensor *dscores_in,
                                    const fg_encoder_layer_params *grads, int accumulate, void *workspace,
                                    size_t workspace_bytes) {
    const char *op = "encoder_layer_backward";
    layer l;
    FG_TRY(resolve(ctx, op, desc, run, x, lengths, scores_in, params, &l));
    const geom *g = &l.g;
    FG_TRY(check_backward_args(ctx, op, &l, accumulate, dy, &dx));
    dscores_out = opt_t(dscores_out), dscores_in = opt_t(dscores_in);
    if (dscores_in && !l.scores_in)
        return fg_fail(FG_ERR_NULL_POINTER, "%s: dscores_in is requested but scores_in is absent", op);
    {
        const fg_tensor *s[3] = {l.scores_in, dscores_out, dscores_in};
        static const char *const sn[3] = {"scores_in", "dscores_out", "dscores_in"};
        FG_TRY(check_scores(ctx, op, desc, g, s, sn, 3));
    }
    if (grads) FG_TRY(check_params(ctx, op, desc, g, grads, params, NULL, NULL));
    l.keep_act = desc->save == FG_ENCODER_SAVE_ALL;
    l.lean = desc->save == FG_ENCODER_SAVE_MIN;
    wlayout w;
    if (!layout(g, l.keep_act, l.lean, &l.c) || !wlayout_of(g, l.lean, &w))
        return fg_fail(FG_ERR_OVERFLOW, "%s: the cache or workspace of B=%lld, L=%lld overflows", op, (long long)g->B,
                       (long long)g->L);
    const size_t cneed = g->T ? l.c.bytes : 0, wneed = g->T ? w.bytes : 0;
    FG_TRY(check_buffer(ctx, op, "cache", cache, cache_bytes, cneed));
    FG_TRY(check_buffer(ctx, op, "workspace", workspace, workspace_bytes, wneed));
    spans sp;
    FG_TRY(spans_init(&sp, 64));
    add_tensor(&sp, "dy", dy, false);
    add_tensor(&sp, "dscores_out", dscores_out, false);
    add_tensor(&sp, "x", x, false);
    add_tensor(&sp, "lengths", l.lengths, false);
    add_tensor(&sp, "scores_in", l.scores_in, false);
    add_params(&sp, "params", params, false, false);
    add_bytes(&sp, "cache", cache, cneed, false);
    add_tensor(&sp, "dx", dx, true);
    add_tensor(&sp, "dscores_in", dscores_in, true);
    if (grads) add_params(&sp, "grads", grads, true, false);
    add_bytes(&sp, "workspace", workspace, wneed, true);
    FG_TRY(check_spans(op, &sp));

    const fg_tensor *G[P_N];
    for (int i = 0; i < P_N; i++) G[i] = i < P_RM1 ? pget(grads, i) : NULL;
    sub e;
    memset(&e, 0, sizeof e);
    e.ctx = ctx;
    e.mode = SUB_CTX;
    const int U = accumulate;
    if (g->T == 0) { /* every gradient is a sum over no tokens */
        for (int i = 0; i < P_N && !U; i++) FG_TRY(zero(&e, G[i]));
        fg_clear_error();
        return FG_OK;
    }
    FG_TRY(backward_walk(&e, &l, cache, &w, workspace, dy, dscores_out, dx, dscores_in, G, U));
    fg_clear_error();
    return FG_OK;
}

/* The backward of one layer, validated: from dy to dx (NULL: none) and the gradients G, on the
   cache at `cache` and the workspace's regions w at `workspace`. */
static fg_status backward_walk(sub *ep, const layer *lp, const void *cache, const wlayout *wp, void *workspace,
                               const fg_tensor *dy, const fg_tensor *dscores_out, const fg_tensor *dx,
                               const fg_tensor *dscores_in, const fg_tensor *const *G, int U) {
    sub e = *ep;
    const layer l = *lp;
    const wlayout w = *wp;
    const geom *g = &l.g;
    const fg_tensor *x = l.x;
    const fg_encoder_layer_desc *desc = l.desc;
    const fg_dtype dt = g->dt;
    const int64_t T = g->T, d = g->d, dff = g->dff;
    const layout_t *c = &l.c;
    void *base = (void *)(uintptr_t)cache;
    const fg_tensor *const *P = l.p;
    const fg_tensor X = t2(dt, x->data, T, d), DY = t2(dt, dy->data, T, d);
    const fg_tensor DX = dx ? t2(dt, dx->data, T, d) : t2(dt, NULL, 0, 0);
    /* lean: what the cache lacks is recomputed into the workspace, each where nothing live is:
       u2 in gc (before N2's backward writes it), f in r (before the hidden's gradient), the slope or pre in r2
       (the activation's gradient then formed in place), u1 in ga (after the projection's backward) */
    void *u1 = l.lean ? at(workspace, w.ga) : at(base, c->u1), *u2 = l.lean ? at(workspace, w.gc) : at(base, c->u2);
    void *f = l.lean ? at(workspace, w.r) : at(base, c->f), *sav = l.lean ? at(workspace, w.r2) : at(base, c->act);
    const fg_tensor U1 = t2(dt, u1, T, d), H_ = t2(dt, at(base, c->h), T, d);
    const fg_tensor U2 = t2(dt, u2, T, d), S1 = t2(dt, at(base, c->s1), T, d);
    const fg_tensor S2 = t2(dt, at(base, c->s2), T, d);
    const fg_tensor F = t2(dt, f, T, dff), SAV = t2(dt, sav, T, dff);
    const fg_tensor m1 = stat(&l, base, c->mean1), r1 = stat(&l, base, c->rstd1);
    const fg_tensor m2 = stat(&l, base, c->mean2), r2 = stat(&l, base, c->rstd2);
    const bool has_mean = c->mean1 != SIZE_MAX;
    const fg_tensor GA = t2(dt, at(workspace, w.ga), T, d), GB = t2(dt, at(workspace, w.gb), T, d);
    const fg_tensor GC = t2(dt, at(workspace, w.gc), T, d), DF = t2(dt, at(workspace, w.r), T, dff);
    void *dqkv = l.dqkv ? l.dqkv : at(workspace, w.r);
    const fg_encoder_layer_desc *ds = desc;
    const fg_dropout_options d2 = drop(&l, 2, ds->dropout_ffn), d3 = drop(&l, 3, ds->dropout);
    fg_linear_act_options lo;
    memset(&lo, 0, sizeof lo);
    lo.act = ds->activation;
    const fg_tensor *saved = l.keep_act || l.lean ? &SAV : NULL;
    /* the masked slope saved (SAVE_ALL) or recomputed (SAVE_MIN): g = DF ⊙ s̃, no mask to apply;
       pre saved, recomputed (SAVE_MIN) or recomputed inside the backward (SAVE_LESS): DF masked
       there (it is ours: in the gradient's pass, or in place) */
    const bool slope = saved && slope_form(g);
    lo.saved = slope ? FG_ACT_SAVED_SLOPE : FG_ACT_SAVED_PRE;
    lo.consume = l.lean ? 1 : 0; /* lean: the saved operand is the workspace's, g is formed over it */
    if (!slope) lo.dropout = d2;
    const fg_tensor *ffn_in = g->pre ? &U2 : &H_;

    /* Post-norm: the FFN block's norm N2 over s2 = h + dropout₃(g): dh (its residual part) → GA, dg → GB */
    const fg_tensor *dg;
    if (!g->pre) {
        FG_TRY(prezero(&e, U, &GA));
        FG_TRY(prezero(&e, U, &GB));
        if (!g->bn) {
            const fg_norm_options no = row_opts(&l, 3, ds->dropout);
            const fg_tensor *a[10] = {&DY, NULL, &S2, P[P_N2W], has_mean ? &m2 : NULL, &r2, &GA, &GB, G[P_N2W], G[P_N2B]};
            FG_TRY(run_part(&e, FG_OP_NORM_BACKWARD, &no, a, 10, U));
        } else {
            const fg_batch_norm_options bo = bn_opts(&l, 3, ds->dropout);
            const fg_tensor *a[9] = {&DY, &S2, P[P_N2W], &m2, &r2, &GA, &GB, G[P_N2W], G[P_N2B]};
            FG_TRY(run_part(&e, FG_OP_BATCH_NORM_BACKWARD, &bo, a, 9, U));
        }
        dg = &GB;
    } else if (d3.p > 0) { /* pre-norm: y = h + dropout₃(g) */
        FG_TRY(dropout_bw(&e, &d3, &DY, &GA));
        dg = &GA;
    } else {
        dg = &DY;
    }
    /* g = f̃·W2ᵀ + b2; f̃ = dropout₂(act(u·W1ᵀ + b1)) */
    if (l.lean) { /* u2 (pre-norm), then the slope or pre and f̃ by the forward's own call */
        if (g->pre) {
            const fg_norm_options no = row_opts(&l, 1, 0.0);
            const fg_tensor *a[8] = {&H_, NULL, P[P_N2W], P[P_N2B], &U2, NULL, NULL, NULL};
            FG_TRY(run_part(&e, FG_OP_NORM_FORWARD, &no, a, 8, 0));
        }
        FG_TRY(ffn_hidden(&e, &l, ffn_in, &F, &SAV));
    }
    FG_TRY(lin_bw_w(&e, dg, &F, G[P_W2], U));
    FG_TRY(lin_bw_b(&e, dg, G[P_B2], U));
    FG_TRY(lin_bw_in(&e, dg, P[P_W2], &DF, 0));
    if (g->pre) { /* du2 → GB (written), dW1 / db1 as asked */
        FG_TRY(prezero(&e, U, &GB));
        const fg_tensor *a[8] = {&DF, saved, ffn_in, P[P_W1], P[P_B1], &GB, G[P_W1], G[P_B1]};
        FG_TRY(run_part_f(&e, FG_OP_LINEAR_ACT_BACKWARD, &lo, a, 8, U, FG_PLAN_CONSUME_DY));
    } else { /* dh gains the FFN's part in GA; dW1 / db1 are added to zeros unless accumulating */
        if (!U) FG_TRY(zero(&e, G[P_W1]));
        if (!U) FG_TRY(zero(&e, G[P_B1]));
        const fg_tensor *a[8] = {&DF, saved, ffn_in, P[P_W1], P[P_B1], &GA, G[P_W1], G[P_B1]};
        FG_TRY(run_part_f(&e, FG_OP_LINEAR_ACT_BACKWARD, &lo, a, 8, 1, FG_PLAN_CONSUME_DY));
    }
    /* the attention block's norm: da → GA (pre) or GB (post); pre: dh → GC; post: dx gets dsum */
    const fg_tensor *da, *dout;
    if (g->pre) {
        FG_TRY(prezero(&e, U, &GC));
        FG_TRY(prezero(&e, U, &GA));
        const fg_norm_options no = row_opts(&l, 1, branch1_p(ds));
        const fg_tensor *a[10] = {&GB, &DY, &H_, P[P_N2W], has_mean ? &m2 : NULL, &r2, &GC, &GA, G[P_N2W], G[P_N2B]};
        FG_TRY(run_part(&e, FG_OP_NORM_BACKWARD, &no, a, 10, U));
        da = &GA, dout = &GB;
    } else {
        FG_TRY(prezero(&e, U, &GB));
        const fg_tensor *dxp = dx ? &DX : NULL;
        if (!g->bn) {
            const fg_norm_options no = row_opts(&l, 1, branch1_p(ds));
            const fg_tensor *a[10] = {&GA, NULL, &S1, P[P_N1W], &m1, &r1, dxp, &GB, G[P_N1W], G[P_N1B]};
            FG_TRY(run_part(&e, FG_OP_NORM_BACKWARD, &no, a, 10, U));
        } else {
            const fg_batch_norm_options bo = bn_opts(&l, 1, branch1_p(ds));
            const fg_tensor *a[9] = {&GA, &S1, P[P_N1W], &m1, &r1, dxp, &GB, G[P_N1W], G[P_N1B]};
            FG_TRY(run_part(&e, FG_OP_BATCH_NORM_BACKWARD, &bo, a, 9, U));
        }
        da = &GB, dout = &GA;
    }
    /* a = o·Woᵀ + bo */
    const fg_tensor O = t2(dt, at(base, c->o), T, d);
    FG_TRY(lin_bw_w(&e, da, &O, G[P_WO], U));
    FG_TRY(lin_bw_b(&e, da, G[P_BO], U));
    FG_TRY(lin_bw_in(&e, da, P[P_WO], dout, 0));
    /* attention: dq, dk, dv interleaved in one [T, 3d] buffer, as q, k, v are (no element shared) */
    void *qkv = at(base, c->qkv);
    const int64_t Td = T * d;
    const fg_tensor dq = heads(g, dqkv, 0, 3 * d), dk = heads(g, dqkv, d, 3 * d), dv = heads(g, dqkv, 2 * d, 3 * d);
    {
        const fg_tensor q = heads(g, qkv, 0, 3 * d), k = heads(g, qkv, d, 3 * d), v = heads(g, qkv, 2 * d, 3 * d);
        const fg_tensor o = heads(g, at(base, c->o), 0, d), dov = heads(g, dout->data, 0, d);
        const int64_t ls[3] = {g->B, g->H, g->L};
        const fg_tensor lse = tv(g->acc, at(base, c->lse), 3, ls, NULL);
        const fg_attention_options ao = attn_opts(&l);
        if (l.q5.rank) { /* the stack's pieces: dq, dk of every layer so far into their slabs */
            if (l.attn_acc) FG_TRY(zero_rows(&e, &dv));
            const fg_tensor *a[13] = {&dov, NULL, &l.q5, &l.k5, &v, l.lengths, NULL, &o, &lse,
                                      &l.dq5, &l.dk5, &dv, NULL};
            FG_TRY(run_part(&e, FG_OP_ATTENTION_BACKWARD, &ao, a, 13, l.attn_acc));
        } else {
            const int acc = dscores_in ? U : 0;
            if (acc) {
                const fg_tensor all = t1(dt, dqkv, 3 * Td);
                FG_TRY(zero(&e, &all));
            }
            const fg_tensor *a[13] = {&dov, dscores_out, &q, &k, &v, l.lengths, l.scores_in, &o, &lse,
                                      &dq, &dk, &dv, dscores_in};
            FG_TRY(run_part(&e, FG_OP_ATTENTION_BACKWARD, &ao, a, 13, acc));
        }
    }
    /* q, k, v = u·W_jᵀ + b_j: per j the weight and bias gradients, and du = Σ_j dqkv_j·W_j */
    if (l.lean && g->pre) { /* u1 = N1(x) into ga: da there is spent */
        const fg_norm_options no = row_opts(&l, 1, 0.0);
        const fg_tensor *a[8] = {&X, NULL, P[P_N1W], P[P_N1B], &U1, NULL, NULL, NULL};
        FG_TRY(run_part(&e, FG_OP_NORM_FORWARD, &no, a, 8, 0));
    }
    const fg_tensor *qin = g->pre ? &U1 : &X;
    const fg_tensor DQKV = t2(dt, dqkv, T, 3 * d);
    if (g->packed) {
        FG_TRY(lin_bw_w(&e, &DQKV, qin, G[P_WQKV], U));
        FG_TRY(lin_bw_b(&e, &DQKV, G[P_BQKV], U));
    } else {
        static const int wj[3] = {P_WQ, P_WK, P_WV}, bj[3] = {P_BQ, P_BK, P_BV};
        for (int j = 0; j < 3; j++) {
            const int64_t shape[2] = {T, d}, stride[2] = {3 * d, 1};
            const fg_tensor Dj = tv(dt, (char *)dqkv + (size_t)(j * d) * g->es, 2, shape, stride);
            FG_TRY(lin_bw_w(&e, &Dj, qin, G[wj[j]], U));
            FG_TRY(lin_bw_b(&e, &Dj, G[bj[j]], U));
        }
    }
    /* pre-norm: du1 → GB, then N1's backward gives dx (with dh from GC); post-norm: dx += du */
    const bool want_du = g->pre ? (dx || G[P_N1W] || G[P_N1B]) : dx != NULL;
    if (want_du) {
        const fg_tensor *du = g->pre ? &GB : &DX;
        const int acc = g->pre ? 0 : 1;
        /* du = [dq dk dv]·W_qkv, one product (separate weights: the forward's gathered copy) */
        const fg_tensor WC = t2(dt, at(base, c->wcat), 3 * d, d);
        FG_TRY(lin_bw_in(&e, &DQKV, g->packed ? P[P_WQKV] : &WC, du, acc));
        if (g->pre) {
            const fg_norm_options no = row_opts(&l, 1, 0.0);
            const fg_tensor *a[10] = {&GB, &GC, &X, P[P_N1W], has_mean ? &m1 : NULL, &r1, dx ? &DX : NULL, NULL,
                                      G[P_N1W], G[P_N1B]};
            FG_TRY(run_part(&e, FG_OP_NORM_BACKWARD, &no, a, 10, U));
        }
    }
    fg_clear_error();
    return FG_OK;
}

/* ------------------------------------------------------------------ a stack of layers */

/* The most layers a stack call takes (its overlap check compares every pair of operands). */
#define STACK_MAX_LAYERS 256

static fg_status check_layers(const char *op, int64_t layers) {
    if (layers < 1 || layers > STACK_MAX_LAYERS)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: layers (%lld) must be in [1, %d]", op, (long long)layers,
                       STACK_MAX_LAYERS);
    return FG_OK;
}

/* The stack's memory: its cache is the layers' caches (slabs of one layer's layout, one after
 * another, so that the layers' q and k are the pieces of one strided view) and the layers' inputs
 * after the first ([T, d] each); its workspace is a layer's backward workspace, two [T, d]
 * gradients between layers, and (residual scores in pieces) the gradient of every layer's qkv,
 * [layers, T, 3d]: each layer's attention backward adds its dq, dk of the earlier layers there. */
typedef struct stack_t {
    layout_t c;
    wlayout w;
    size_t slab, act;      /* a layer's cache, a [T, d] activation (256-byte multiples) */
    size_t acts;           /* the cache's activations */
    size_t cache;
    size_t dy, carry, ws;  /* the workspace: the ping-pong gradients, the carry, its size */
    bool pieces;
} stack_t;

static bool add_ok(size_t a, size_t b, size_t *out) {
    if (a > SIZE_MAX - b) return false;
    *out = a + b;
    return true;
}

static bool stack_layout(const geom *g, const fg_encoder_layer_desc *desc, int64_t layers, stack_t *s) {
    const bool lean = desc->save == FG_ENCODER_SAVE_MIN;
    if (!layout(g, desc->save == FG_ENCODER_SAVE_ALL, lean, &s->c) || !wlayout_of(g, lean, &s->w)) return false;
    int64_t Td, Td3, n;
    size_t off = 0, at0;
    if (!mul_ok(g->T, g->d, &Td) || !mul_ok(Td, 3, &Td3) || !place(&off, Td, g->es, &at0)) return false;
    s->act = (off + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
    s->slab = s->c.bytes;
    s->pieces = desc->residual_scores != 0;
    int64_t a, b;
    if (!mul_ok(layers, (int64_t)s->slab, &a) || !mul_ok(layers - 1, (int64_t)s->act, &b)) return false;
    s->acts = (size_t)a;
    if (!add_ok((size_t)a, (size_t)b, &s->cache)) return false;
    s->dy = s->w.bytes;
    size_t two;
    if (!add_ok(s->act, s->act, &two) || !add_ok(s->dy, two, &s->carry)) return false;
    s->ws = s->carry;
    if (s->pieces) {
        if (!mul_ok(layers, Td3, &n) || !mul_ok(n, (int64_t)g->es, &a)) return false;
        if (!add_ok(s->carry, (size_t)a, &s->ws)) return false;
    }
    return true;
}

/* q (col 0) or k (col d) of layers 0 … P − 1 as pieces: [B, H, L, P, hd] over [T, 3d] buffers
   `stride` bytes apart from p0 (the first layer's). */
static fg_tensor pieces_of(const geom *g, void *p0, size_t stride, int64_t P, int64_t col) {
    const int64_t w = 3 * g->d;
    const int64_t shape[5] = {g->B, g->H, g->L, P, g->hd};
    const int64_t st[5] = {g->L * w, g->hd, w, (int64_t)(stride / g->es), 1};
    return tv(g->dt, p0 ? (char *)p0 + (size_t)col * g->es : NULL, 5, shape, st);
}

static fg_tensor tokens_at(const geom *g, void *p) {
    const int64_t s[3] = {g->B, g->L, g->d};
    return tv(g->dt, p, 3, s, NULL);
}

fg_status fg_encoder_sizes(const fg_encoder_layer_desc *desc, int64_t layers, fg_dtype dtype, int64_t B, int64_t L,
                           size_t *cache_bytes, size_t *workspace_bytes) {
    const char *op = "encoder_sizes";
    FG_TRY(check_desc(op, desc));
    FG_TRY(check_dtype(op, dtype));
    FG_TRY(check_layers(op, layers));
    if (B < 0 || L < 0)
        return fg_fail(FG_ERR_SHAPE, "%s: B=%lld and L=%lld must be >= 0", op, (long long)B, (long long)L);
    geom g;
    FG_TRY(geom_of(op, desc, dtype, B, L, &g));
    stack_t s;
    if (!stack_layout(&g, desc, layers, &s))
        return fg_fail(FG_ERR_OVERFLOW, "%s: the cache or workspace of %lld layers, B=%lld, L=%lld overflows", op,
                       (long long)layers, (long long)B, (long long)L);
    if (cache_bytes) *cache_bytes = g.T ? s.cache : 0;
    if (workspace_bytes) *workspace_bytes = g.T ? s.ws : 0;
    fg_clear_error();
    return FG_OK;
}

/* Every layer's params (and grads) checked, with its index in the messages; l: layer 0's. */
static fg_status stack_resolve(fg_context *ctx, const char *op, const fg_encoder_layer_desc *desc, int64_t layers,
                               const fg_encoder_layer_run *run, const fg_tensor *x, const fg_tensor *lengths,
                               const fg_encoder_layer_params *params, const fg_encoder_layer_params *grads,
                               layer *l) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "%s: ctx is NULL", op);
    FG_TRY(check_desc(op, desc));
    FG_TRY(check_layers(op, layers));
    if (!params) return fg_fail(FG_ERR_NULL_POINTER, "%s: params is NULL", op);
    char set[32];
    for (int64_t i = layers - 1; i >= 0; i--) {
        snprintf(set, sizeof set, "params[%lld]", (long long)i);
        FG_TRY(resolve_set(ctx, op, desc, run, x, lengths, NULL, &params[i], l, set));
        if (grads) {
            snprintf(set, sizeof set, "grads[%lld]", (long long)i);
            FG_TRY(check_params(ctx, op, desc, &l->g, &grads[i], &params[i], NULL, set));
        }
    }
    return FG_OK;
}

/* Layer i of the stack as the walks take it. */
static fg_status stack_layer(fg_context *ctx, const char *op, const fg_encoder_layer_desc *desc,
                             const fg_encoder_layer_run *run, const fg_tensor *x, const fg_tensor *lengths,
                             const fg_encoder_layer_params *params, const stack_t *s, int64_t i, void *cache,
                             fg_tensor *xi, layer *l) {
    FG_TRY(resolve(ctx, op, desc, run, x, lengths, NULL, &params[i], l));
    const geom *g = &l->g;
    l->offset = run->offset + (uint64_t)i;
    l->c = s->c, l->w = s->w;
    l->keep_act = desc->save == FG_ENCODER_SAVE_ALL;
    l->lean = desc->save == FG_ENCODER_SAVE_MIN;
    *xi = i == 0 ? *x : tokens_at(g, (char *)cache + s->acts + (size_t)(i - 1) * s->act);
    l->x = xi;
    if (s->pieces) {
        l->q5 = pieces_of(g, (char *)cache + s->c.qkv, s->slab, i + 1, 0);
        l->k5 = pieces_of(g, (char *)cache + s->c.qkv, s->slab, i + 1, g->d);
    }
    return FG_OK;
}

fg_status fg_encoder_forward(fg_context *ctx, const fg_encoder_layer_desc *desc, int64_t layers,
                             const fg_encoder_layer_run *run, const fg_tensor *x, const fg_tensor *lengths,
                             const fg_encoder_layer_params *params, const fg_tensor *y, void *cache,
                             size_t cache_bytes, void *workspace, size_t workspace_bytes) {
    const char *op = "encoder_forward";
    layer l;
    FG_TRY(stack_resolve(ctx, op, desc, layers, run, x, lengths, params, NULL, &l));
    const geom *g = &l.g;
    if (!y) return fg_fail(FG_ERR_NULL_POINTER, "%s: y is NULL", op);
    FG_TRY(check_tokens(ctx, op, "y", y, g));
    stack_t s;
    if (!stack_layout(g, desc, layers, &s))
        return fg_fail(FG_ERR_OVERFLOW, "%s: the cache or workspace of %lld layers, B=%lld, L=%lld overflows", op,
                       (long long)layers, (long long)g->B, (long long)g->L);
    const bool lean = desc->save == FG_ENCODER_SAVE_MIN;
    const size_t need = g->T ? s.cache : 0, wneed = g->T && lean ? s.w.bytes : 0;
    FG_TRY(check_buffer(ctx, op, "cache", cache, cache_bytes, need));
    FG_TRY(check_buffer(ctx, op, "workspace", workspace, workspace_bytes, wneed));
    spans sp;
    FG_TRY(spans_init(&sp, 8 + 24 * (int)layers));
    add_tensor(&sp, "x", x, false);
    add_tensor(&sp, "lengths", l.lengths, false);
    char set[32];
    for (int64_t i = 0; i < layers; i++) {
        snprintf(set, sizeof set, "params[%lld]", (long long)i);
        add_params(&sp, set, &params[i], false, run->train && g->bn);
    }
    add_tensor(&sp, "y", y, true);
    add_bytes(&sp, "cache", cache, need, true);
    add_bytes(&sp, "workspace", workspace, wneed, true);
    FG_TRY(check_spans(op, &sp));
    if (g->T == 0) {
        fg_clear_error();
        return FG_OK;
    }
    sub e;
    memset(&e, 0, sizeof e);
    e.ctx = ctx;
    /* the last layer planned first (its attention has the most pieces): a part the backend
       refuses stops the call before anything is written */
    e.mode = SUB_MEASURE;
    for (int64_t i = layers - 1, k = 0; k < 2; k++, i = 0) {
        fg_tensor xi;
        FG_TRY(stack_layer(ctx, op, desc, run, x, lengths, params, &s, i, cache, &xi, &l));
        l.keep_act = l.train && desc->save == FG_ENCODER_SAVE_ALL;
        l.ws = workspace;
        FG_TRY(forward_walk(&e, &l, (char *)cache + (size_t)i * s.slab, y, NULL));
    }
    e.mode = SUB_CTX;
    for (int64_t i = 0; i < layers; i++) {
        fg_tensor xi;
        FG_TRY(stack_layer(ctx, op, desc, run, x, lengths, params, &s, i, cache, &xi, &l));
        l.keep_act = l.train && desc->save == FG_ENCODER_SAVE_ALL;
        l.ws = workspace;
        const fg_tensor yi = i == layers - 1 ? *y : tokens_at(g, (char *)cache + s.acts + (size_t)i * s.act);
        FG_TRY(forward_walk(&e, &l, (char *)cache + (size_t)i * s.slab, &yi, NULL));
    }
    fg_clear_error();
    return FG_OK;
}

fg_status fg_encoder_backward(fg_context *ctx, const fg_encoder_layer_desc *desc, int64_t layers,
                              const fg_encoder_layer_run *run, const fg_tensor *dy, const fg_tensor *x,
                              const fg_tensor *lengths, const fg_encoder_layer_params *params, const void *cache,
                              size_t cache_bytes, const fg_tensor *dx, const fg_encoder_layer_params *grads,
                              int accumulate, void *workspace, size_t workspace_bytes) {
    const char *op = "encoder_backward";
    layer l;
    FG_TRY(stack_resolve(ctx, op, desc, layers, run, x, lengths, params, grads, &l));
    const geom *g = &l.g;
    FG_TRY(check_backward_args(ctx, op, &l, accumulate, dy, &dx));
    stack_t s;
    if (!stack_layout(g, desc, layers, &s))
        return fg_fail(FG_ERR_OVERFLOW, "%s: the cache or workspace of %lld layers, B=%lld, L=%lld overflows", op,
                       (long long)layers, (long long)g->B, (long long)g->L);
    const size_t cneed = g->T ? s.cache : 0, wneed = g->T ? s.ws : 0;
    FG_TRY(check_buffer(ctx, op, "cache", cache, cache_bytes, cneed));
    FG_TRY(check_buffer(ctx, op, "workspace", workspace, workspace_bytes, wneed));
    spans sp;
    FG_TRY(spans_init(&sp, 8 + 48 * (int)layers));
    add_tensor(&sp, "dy", dy, false);
    add_tensor(&sp, "x", x, false);
    add_tensor(&sp, "lengths", l.lengths, false);
    char set[32];
    for (int64_t i = 0; i < layers; i++) {
        snprintf(set, sizeof set, "params[%lld]", (long long)i);
        add_params(&sp, set, &params[i], false, false);
        if (!grads) continue;
        snprintf(set, sizeof set, "grads[%lld]", (long long)i);
        add_params(&sp, set, &grads[i], true, false);
    }
    add_bytes(&sp, "cache", cache, cneed, false);
    add_tensor(&sp, "dx", dx, true);
    add_bytes(&sp, "workspace", workspace, wneed, true);
    FG_TRY(check_spans(op, &sp));
    sub e;
    memset(&e, 0, sizeof e);
    e.ctx = ctx;
    e.mode = SUB_CTX;
    const int U = accumulate;
    char *ws = workspace;
    for (int pass = 0; pass < 2; pass++) /* planned first (a refused part stops the call before anything is written), then run */
    for (int64_t i = layers - 1; i >= 0; i--) {
        e.mode = pass ? SUB_CTX : SUB_MEASURE;
        if (!pass && i != layers - 1 && i != 0) continue;
        const fg_tensor *G[P_N];
        for (int k = 0; k < P_N; k++) G[k] = grads && k < P_RM1 ? pget(&grads[i], k) : NULL;
        if (g->T == 0) { /* every gradient is a sum over no tokens */
            for (int k = 0; k < P_N && !U; k++) FG_TRY(zero(&e, G[k]));
            continue;
        }
        fg_tensor xi;
        FG_TRY(stack_layer(ctx, op, desc, run, x, lengths, params, &s, i, (void *)(uintptr_t)cache, &xi, &l));
        const fg_tensor dyi = i == layers - 1 ? *dy : tokens_at(g, ws + s.dy + (size_t)(i & 1) * s.act);
        const fg_tensor dxi = i == 0 ? (dx ? *dx : tokens_at(g, NULL)) : tokens_at(g, ws + s.dy + (size_t)((i + 1) & 1) * s.act);
        if (s.pieces) {
            const size_t slab = (size_t)(g->T * 3 * g->d) * g->es;
            l.dq5 = pieces_of(g, ws + s.carry, slab, i + 1, 0);
            l.dk5 = pieces_of(g, ws + s.carry, slab, i + 1, g->d);
            l.dqkv = ws + s.carry + (size_t)i * slab;
            l.attn_acc = i < layers - 1;
        }
        FG_TRY(backward_walk(&e, &l, (const char *)cache + (size_t)i * s.slab, &s.w, workspace, &dyi, NULL,
                             i == 0 && !dx ? NULL : &dxi, NULL, G, U));
    }
    fg_clear_error();
    return FG_OK;
}

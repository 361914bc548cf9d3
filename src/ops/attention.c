/*
 * attention.c — front door of the attention family: multi-head scaled dot-product attention
 * forward (o, lse, and the pre-softmax scores when asked) and backward (dq, dk, dv and the
 * gradient of the additive input scores), with causal and key-padding masks, additive input
 * scores (PatchTST's residual attention), and dropout on the probabilities through the
 * counter-based generator of src/core/rng.h.
 *
 * Everything is validated here (shapes, dtypes, the options); the backend's plan hook picks
 * the kernel from a pointer-free description of the problem (sizes, dtypes, which operands
 * are given, whether the rows are unit-stride, the declared alignment) and the plan keeps
 * that choice; the run resolves the operands into [B, H, L, X] views and calls the backend
 * once. No [L, L] buffer exists unless the caller passed one.
 */
#include "../core/internal.h"
#include "../core/rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { AF_Q, AF_K, AF_V, AF_LEN, AF_SIN, AF_O, AF_LSE, AF_SOUT, AF_N };
enum { AB_DO, AB_DSC, AB_Q, AB_K, AB_V, AB_LEN, AB_SIN, AB_O, AB_LSE, AB_DQ, AB_DK, AB_DV, AB_DSIN, AB_N };

static const fg_attention_options *attn_opts(const fg_plan_desc *d) { return d->options; }

static bool has(const fg_tensor *t) { return t->rank != 0; }

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

/* ------------------------------------------------------------------ validation */

static fg_status check_options(const char *op, const fg_attention_options *o) {
    if (!isfinite(o->scale))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: attention.scale=%g must be finite (0 means 1/sqrt(hd))", op,
                       o->scale);
    if (o->causal != 0 && o->causal != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: attention.causal=%d must be 0 or 1", op, o->causal);
    if (!(o->dropout_p >= 0.0 && o->dropout_p < 1.0))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: attention.dropout_p=%g must be in [0, 1)", op, o->dropout_p);
    return FG_OK;
}

/* A [B, H, L, X] operand of the dtype of `like` (dt). */
static fg_status check_4d(const char *op, const char *what, const fg_tensor *t, fg_dtype dt, const char *like,
                          int64_t B, int64_t H, int64_t L, int64_t X) {
    FG_TRY(fg_check_desc(op, what, t, 4, 4));
    if (t->dtype != dt)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but %s is %s", op, what, fg_dtype_name(t->dtype), like,
                       fg_dtype_name(dt));
    const int64_t want[4] = {B, H, L, X};
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d]) {
            char a[96];
            return fg_fail(FG_ERR_SHAPE, "%s: %s is %s but it must be [%lld, %lld, %lld, %lld]", op, what,
                           fg_shape_str(t, a, sizeof a), (long long)B, (long long)H, (long long)L, (long long)X);
        }
    return FG_OK;
}

/* The score operands given share one dtype: q's, or the accumulator type. */
static fg_status check_scores(const char *op, const fg_tensor *const *s, const char *const *names, int n,
                              fg_dtype dt, int64_t B, int64_t H, int64_t L, fg_dtype *sdt) {
    *sdt = dt;
    int first = -1;
    for (int i = 0; i < n; i++) {
        if (!has(s[i])) continue;
        FG_TRY(fg_check_desc(op, names[i], s[i], 4, 4));
        if (first < 0) {
            if (s[i]->dtype != dt && s[i]->dtype != acc_of(dt))
                return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but scores must be q's dtype (%s) or %s", op, names[i],
                               fg_dtype_name(s[i]->dtype), fg_dtype_name(dt), fg_dtype_name(acc_of(dt)));
            first = i;
            *sdt = s[i]->dtype;
        }
        FG_TRY(check_4d(op, names[i], s[i], s[first]->dtype, names[first], B, H, L, L));
    }
    return FG_OK;
}

static fg_status check_lengths(const char *op, const fg_tensor *t, int64_t B) {
    if (!has(t)) return FG_OK;
    FG_TRY(fg_check_any_desc(op, "lengths", t, 1, 1));
    if (t->dtype != FG_I32 && t->dtype != FG_I64)
        return fg_fail(FG_ERR_DTYPE, "%s: lengths is %s but it must be i32 or i64", op, fg_dtype_name(t->dtype));
    if (t->shape[0] != B)
        return fg_fail(FG_ERR_SHAPE, "%s: lengths.shape[0]=%lld but q.shape[0]=B=%lld", op, (long long)t->shape[0],
                       (long long)B);
    return fg_check_contiguous(op, "lengths", t);
}

static fg_status check_lse(const char *op, const fg_tensor *t, fg_dtype acc, int64_t B, int64_t H, int64_t L) {
    FG_TRY(fg_check_desc(op, "lse", t, 3, 3));
    if (t->dtype != acc)
        return fg_fail(FG_ERR_DTYPE, "%s: lse is %s but it must be %s", op, fg_dtype_name(t->dtype), fg_dtype_name(acc));
    if (t->shape[0] != B || t->shape[1] != H || t->shape[2] != L) {
        char a[96];
        return fg_fail(FG_ERR_SHAPE, "%s: lse is %s but it must be [%lld, %lld, %lld]", op, fg_shape_str(t, a, sizeof a),
                       (long long)B, (long long)H, (long long)L);
    }
    return fg_check_contiguous(op, "lse", t);
}

/* q: rank 4 ([B, H, L, hd]) or 5 (in pieces: [B, H, L, P, hd]), a float dtype; gives B, H, L,
   hd and P (1 for rank 4). */
static fg_status check_q(const char *op, const fg_tensor *q, int64_t *B, int64_t *H, int64_t *L, int64_t *hd,
                         int64_t *P) {
    FG_TRY(fg_check_desc(op, "q", q, 4, 5));
    *B = q->shape[0], *H = q->shape[1], *L = q->shape[2];
    *P = q->rank == 5 ? q->shape[3] : 1;
    *hd = q->shape[q->rank - 1];
    if (q->rank == 5 && *P < 1)
        return fg_fail(FG_ERR_SHAPE, "%s: q.shape[3]=%lld pieces: a 5-D q needs at least one", op, (long long)*P);
    return FG_OK;
}

/* k, dq or dk: q's rank and shape ([B, H, L, hd], or [B, H, L, P, hd] when q is in pieces). */
static fg_status check_qk(const char *op, const char *what, const fg_tensor *t, const fg_tensor *q) {
    if (q->rank == 4) return check_4d(op, what, t, q->dtype, "q", q->shape[0], q->shape[1], q->shape[2], q->shape[3]);
    FG_TRY(fg_check_desc(op, what, t, 1, FG_MAX_RANK));
    if (t->rank != 5) {
        char a[96], b[96];
        return fg_fail(FG_ERR_SHAPE, "%s: %s is %s but it must be q's shape %s (q and k in the same pieces)", op, what,
                       fg_shape_str(t, a, sizeof a), fg_shape_str(q, b, sizeof b));
    }
    if (t->dtype != q->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but q is %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(q->dtype));
    for (int d = 0; d < 5; d++)
        if (t->shape[d] != q->shape[d]) {
            char a[96], b[96];
            return fg_fail(FG_ERR_SHAPE, "%s: %s is %s but it must be q's shape %s (q and k in the same pieces)", op,
                           what, fg_shape_str(t, a, sizeof a), fg_shape_str(q, b, sizeof b));
        }
    return FG_OK;
}

/* Stride 1 along hd and the other strides whole 16-byte steps (what the vector loads need). */
static bool unit_rows(const fg_tensor *t) {
    if (!has(t)) return true;
    int64_t st[FG_MAX_RANK];
    fg_tensor_strides(t, st);
    const int64_t v = 16 / (int64_t)fg_dtype_size(t->dtype);
    const int last = t->rank - 1;
    if (t->shape[last] > 1 && st[last] != 1) return false;
    for (int d = 0; d < last; d++)
        if (t->shape[d] > 1 && st[d] % v != 0) return false;
    return true;
}

/* ------------------------------------------------------------------ the problem and its run */

typedef struct attn_priv {
    fg_attn_problem p;
    fg_attn_path path;
} attn_priv;

_Static_assert(sizeof(attn_priv) <= FG_PRIVATE_BYTES, "attention: the plan's choice fits fg_lowered.priv");

static void view_of(fg_attn_view *v, const fg_tensor *t) {
    memset(v, 0, sizeof *v);
    if (!t || !has(t)) return;
    int64_t st[FG_MAX_RANK];
    fg_tensor_strides(t, st);
    v->data = t->data;
    v->sb = st[0], v->sh = st[1], v->sl = st[2];
    if (t->rank == 5) v->sp = st[3], v->sx = st[4];
    else v->sx = st[3];
}

static double resolved_scale(const fg_attention_options *o, int64_t hd) {
    if (o->scale != 0.0) return o->scale;
    return hd > 0 ? 1.0 / sqrt((double)hd) : 1.0;
}

static fg_status driver(fg_context *ctx, const fg_plan_desc *d, const fg_tensor *ops, void *priv, fg_kernel_info *info,
                        void *ws, size_t ws_bytes, bool run) {
    attn_priv *ap = priv;
    const char *name = ap->p.forward ? "attention_forward" : "attention_backward";
    if (!ctx->be->attn_plan || !ctx->be->attn)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: the %s backend has no attention kernels", name, ctx->be->name);
    if (!run) {
        FG_TRY(ctx->be->attn_plan(ctx, &ap->p, &ap->path));
        snprintf(info->name, sizeof info->name, "%s", ap->path.name);
        info->workspace_bytes = ap->path.workspace;
        info->deterministic = true;
        info->accumulator = ap->p.acc;
        return FG_OK;
    }
    if (ws_bytes < ap->path.workspace)
        return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, %zu needed", name, ws_bytes,
                       ap->path.workspace);
    const fg_attention_options *o = attn_opts(d);
    fg_attn_call c;
    memset(&c, 0, sizeof c);
    c.p = ap->p;
    c.path = ap->path;
    c.scale = resolved_scale(o, ap->p.hd);
    c.dropout_p = o->dropout_p;
    c.keep_min = fg_attn_keep_min(o->dropout_p);
    c.keep_scale = 1.0 / (1.0 - o->dropout_p);
    c.seed = o->seed, c.offset = o->offset;
    c.ws = ws, c.ws_bytes = ws_bytes;
    if (ap->p.forward) {
        view_of(&c.q, &ops[AF_Q]), view_of(&c.k, &ops[AF_K]), view_of(&c.v, &ops[AF_V]);
        view_of(&c.scores_in, &ops[AF_SIN]), view_of(&c.o, &ops[AF_O]), view_of(&c.scores_out, &ops[AF_SOUT]);
        c.lengths = has(&ops[AF_LEN]) ? ops[AF_LEN].data : NULL;
        c.lse = ops[AF_LSE].data;
    } else {
        view_of(&c.d_o, &ops[AB_DO]), view_of(&c.dscores, &ops[AB_DSC]);
        view_of(&c.q, &ops[AB_Q]), view_of(&c.k, &ops[AB_K]), view_of(&c.v, &ops[AB_V]);
        view_of(&c.scores_in, &ops[AB_SIN]), view_of(&c.o, &ops[AB_O]);
        view_of(&c.dq, &ops[AB_DQ]), view_of(&c.dk, &ops[AB_DK]), view_of(&c.dv, &ops[AB_DV]);
        view_of(&c.dscores_in, &ops[AB_DSIN]);
        c.lengths = has(&ops[AB_LEN]) ? ops[AB_LEN].data : NULL;
        c.lse = ops[AB_LSE].data;
    }
    return ctx->be->attn(ctx, &c);
}

static fg_status lower_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "attention_forward";
    const fg_tensor *t = d->operands;
    FG_TRY(check_options(op, attn_opts(d)));
    int64_t B, H, L, hd, P;
    FG_TRY(check_q(op, &t[AF_Q], &B, &H, &L, &hd, &P));
    const fg_dtype dt = t[AF_Q].dtype, acc = acc_of(dt);
    FG_TRY(check_qk(op, "k", &t[AF_K], &t[AF_Q]));
    FG_TRY(check_4d(op, "v", &t[AF_V], dt, "q", B, H, L, hd));
    FG_TRY(check_4d(op, "o", &t[AF_O], dt, "q", B, H, L, hd));
    FG_TRY(check_lengths(op, &t[AF_LEN], B));
    const fg_tensor *s[2] = {&t[AF_SIN], &t[AF_SOUT]};
    static const char *const sn[2] = {"scores_in", "scores_out"};
    fg_dtype sdt;
    FG_TRY(check_scores(op, s, sn, 2, dt, B, H, L, &sdt));
    FG_TRY(check_lse(op, &t[AF_LSE], acc, B, H, L));
    attn_priv *ap = (attn_priv *)out->priv;
    memset(ap, 0, sizeof *ap);
    fg_attn_problem *p = &ap->p;
    p->forward = true;
    p->dtype = dt, p->sdtype = sdt, p->acc = acc;
    p->ldtype = has(&t[AF_LEN]) ? t[AF_LEN].dtype : FG_I32;
    p->B = B, p->H = H, p->L = L, p->hd = hd, p->pieces = P;
    p->causal = attn_opts(d)->causal != 0;
    p->dropout = attn_opts(d)->dropout_p > 0;
    p->has_lengths = has(&t[AF_LEN]);
    p->has_scores_in = has(&t[AF_SIN]);
    p->has_scores_out = has(&t[AF_SOUT]);
    p->unit_rows = unit_rows(&t[AF_Q]) && unit_rows(&t[AF_K]) && unit_rows(&t[AF_V]) && unit_rows(&t[AF_O]);
    p->align = d->alignment;
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "attention_backward";
    const fg_tensor *t = d->operands;
    FG_TRY(check_options(op, attn_opts(d)));
    int64_t B, H, L, hd, P;
    FG_TRY(check_q(op, &t[AB_Q], &B, &H, &L, &hd, &P));
    const fg_dtype dt = t[AB_Q].dtype, acc = acc_of(dt);
    FG_TRY(check_4d(op, "do", &t[AB_DO], dt, "q", B, H, L, hd));
    FG_TRY(check_qk(op, "k", &t[AB_K], &t[AB_Q]));
    FG_TRY(check_4d(op, "v", &t[AB_V], dt, "q", B, H, L, hd));
    FG_TRY(check_4d(op, "o", &t[AB_O], dt, "q", B, H, L, hd));
    FG_TRY(check_lengths(op, &t[AB_LEN], B));
    FG_TRY(check_lse(op, &t[AB_LSE], acc, B, H, L));
    if (has(&t[AB_DQ])) FG_TRY(check_qk(op, "dq", &t[AB_DQ], &t[AB_Q]));
    if (has(&t[AB_DK])) FG_TRY(check_qk(op, "dk", &t[AB_DK], &t[AB_Q]));
    if (has(&t[AB_DV])) FG_TRY(check_4d(op, "dv", &t[AB_DV], dt, "q", B, H, L, hd));
    if (has(&t[AB_DSIN]) && !has(&t[AB_SIN]))
        return fg_fail(FG_ERR_NULL_POINTER, "%s: dscores_in is requested but scores_in is absent", op);
    const fg_tensor *s[3] = {&t[AB_SIN], &t[AB_DSC], &t[AB_DSIN]};
    static const char *const sn[3] = {"scores_in", "dscores", "dscores_in"};
    fg_dtype sdt;
    FG_TRY(check_scores(op, s, sn, 3, dt, B, H, L, &sdt));
    attn_priv *ap = (attn_priv *)out->priv;
    memset(ap, 0, sizeof *ap);
    fg_attn_problem *p = &ap->p;
    p->forward = false;
    p->dtype = dt, p->sdtype = sdt, p->acc = acc;
    p->ldtype = has(&t[AB_LEN]) ? t[AB_LEN].dtype : FG_I32;
    p->B = B, p->H = H, p->L = L, p->hd = hd, p->pieces = P;
    p->causal = attn_opts(d)->causal != 0;
    p->dropout = attn_opts(d)->dropout_p > 0;
    p->has_lengths = has(&t[AB_LEN]);
    p->has_scores_in = has(&t[AB_SIN]);
    p->has_dscores = has(&t[AB_DSC]);
    p->want_dq = has(&t[AB_DQ]), p->want_dk = has(&t[AB_DK]), p->want_dv = has(&t[AB_DV]);
    p->want_dscores_in = has(&t[AB_DSIN]);
    p->accumulate = d->accumulate != 0;
    p->unit_rows = unit_rows(&t[AB_DO]) && unit_rows(&t[AB_Q]) && unit_rows(&t[AB_K]) && unit_rows(&t[AB_V]) &&
                   unit_rows(&t[AB_O]) && unit_rows(&t[AB_DQ]) && unit_rows(&t[AB_DK]) && unit_rows(&t[AB_DV]);
    p->align = d->alignment;
    out->driver = driver;
    return FG_OK;
}

#define OPTS "fg_attention_options", sizeof(fg_attention_options)
#define IN(n) {n, false, false}
#define IN_OPT(n) {n, false, true}
#define OUT(n) {n, true, false}
#define OUT_OPT(n) {n, true, true}
static const fg_op_decl ops[] = {
    {FG_OP_ATTENTION_FORWARD, "attention_forward", AF_N,
     {[AF_Q] = IN("q"), [AF_K] = IN("k"), [AF_V] = IN("v"), [AF_LEN] = IN_OPT("lengths"),
      [AF_SIN] = IN_OPT("scores_in"), [AF_O] = OUT("o"), [AF_LSE] = OUT("lse"), [AF_SOUT] = OUT_OPT("scores_out")},
     0, OPTS, false, lower_forward},
    {FG_OP_ATTENTION_BACKWARD, "attention_backward", AB_N,
     {[AB_DO] = IN("do"), [AB_DSC] = IN_OPT("dscores"), [AB_Q] = IN("q"), [AB_K] = IN("k"), [AB_V] = IN("v"),
      [AB_LEN] = IN_OPT("lengths"), [AB_SIN] = IN_OPT("scores_in"), [AB_O] = IN("o"), [AB_LSE] = IN("lse"),
      [AB_DQ] = OUT_OPT("dq"), [AB_DK] = OUT_OPT("dk"), [AB_DV] = OUT_OPT("dv"), [AB_DSIN] = OUT_OPT("dscores_in")},
     0, OPTS, false, lower_backward},
};
#undef OPTS
#undef IN
#undef IN_OPT
#undef OUT
#undef OUT_OPT

const fg_family fg_family_attention = {"attention", sizeof ops / sizeof ops[0], ops};

/* ------------------------------------------------------------------ one-call functions */

fg_status fg_attention_forward(fg_context *ctx, const fg_attention_options *opt, const fg_tensor *q,
                               const fg_tensor *k, const fg_tensor *v, const fg_tensor *lengths,
                               const fg_tensor *scores_in, const fg_tensor *o, const fg_tensor *lse,
                               const fg_tensor *scores_out) {
    const fg_tensor *args[AF_N] = {q, k, v, lengths, scores_in, o, lse, scores_out};
    return fg_run_op(ctx, FG_OP_ATTENTION_FORWARD, opt, args, AF_N, 0, 0);
}

fg_status fg_attention_backward(fg_context *ctx, const fg_attention_options *opt, const fg_tensor *d_o,
                                const fg_tensor *dscores, const fg_tensor *q, const fg_tensor *k,
                                const fg_tensor *v, const fg_tensor *lengths, const fg_tensor *scores_in,
                                const fg_tensor *o, const fg_tensor *lse, const fg_tensor *dq, const fg_tensor *dk,
                                const fg_tensor *dv, const fg_tensor *dscores_in, int accumulate) {
    const fg_tensor *args[AB_N] = {d_o, dscores, q, k, v, lengths, scores_in, o, lse, dq, dk, dv, dscores_in};
    return fg_run_op(ctx, FG_OP_ATTENTION_BACKWARD, opt, args, AB_N, accumulate, 0);
}

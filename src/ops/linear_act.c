/*
 * linear_act.c — front door and driver of linear + bias + activation:
 * y = act(x·wᵀ + b) and its backward, for act in none, relu, gelu (erf), gelu (tanh),
 * silu, sigmoid, tanh; w [M, K] for all rows of x, or batched weights w [B, M, K] (x's first
 * dim the batch; the walk below runs batch after batch on the same workspace).
 *
 * The front door validates, describes the problem (fg_act_problem) and asks the backend's
 * plan hook once, when the plan is made, which kernels take it (fg_act_path: the activation
 * in the GEMM's epilogue, a fused tile kernel, the backend's own GEMM for a product, g formed
 * inside dx's product, the whole backward in one kernel). The walk here follows that path:
 *
 *  forward   one fused kernel where the path has one (the product with the activation in its
 *            epilogue); else the product into pre (when the caller keeps it) or straight into y,
 *            then one elementwise pass y = act(pre) (in place when pre is not kept; none: no
 *            pass)
 *  backward  the whole backward in one kernel where the path has one; else pre (kept — for
 *            relu y does as well —, or recomputed by one more product into the workspace, or
 *            inside the gradient's tile kernel) and dy → g = dy ⊙ act′(pre) in one pass that
 *            also sums db's columns (or inside dx's product), g in pre's memory when pre is the
 *            workspace's or the caller lets it go (consume), then dx = g·w and dw = gᵀ·x; act
 *            none uses dy as g directly. db's f32 sums borrow the memory of dx or dw, which
 *            their products write only afterwards.
 *  slope form: the forward's steps also write s = act′(pre) where pre would go; the
 *            backward's steps run with act GIVEN_SLOPE (s is its own slope).
 *  dropout   (options.dropout, p > 0) y = dropout(act(pre)) with fg_dropout_forward's mask on
 *            y's flat index: in the product's epilogue where the backend applies it there
 *            (fg_kernel_info.drop_fused), or in the activation pass or the short-K tile kernel where
 *            the backend's take it (fg_act_path.pass_drop; one batch; the saved slope masked there
 *            too), else the normalization
 *            family's dropout step on y (and on the saved slope, which then carries the mask)
 *            after the forward's last step, over the whole tensor (batched weights: after the
 *            last batch). The backward with pre kept (or recomputed) forms g = (dy ⊙ m) ⊙ act′(pre)
 *            (the unfused pair's bits): inside the gradient pass (or its tile kernel) where the backend's
 *            take the mask and the walk runs that step, else by the dropout step on dy first, into the
 *            workspace (or over dy itself with FG_PLAN_CONSUME_DY), the walk above then reading
 *            it; the slope form's backward needs no mask (p > 0 there is refused, and so is the
 *            slope form with act none, whose backward never reads the slope).
 * Sums are f32 (f64 for f64) in a fixed order: the same bits on every run.
 */
#include "../core/internal.h"

#include <stdio.h>
#include <string.h>

enum { AF_X, AF_W, AF_B, AF_Y, AF_PRE, AF_N };
enum { AB_DY, AB_PRE, AB_X, AB_W, AB_B, AB_DX, AB_DW, AB_DB, AB_N };

#define ALIGN_UP(x) (((x) + 255) & ~(size_t)255)

static bool has(const fg_tensor *t) { return t->rank != 0; }

static const fg_linear_act_options *act_opts(const fg_plan_desc *d) { return d->options; }
static bool slope_form(const fg_plan_desc *d) {
    return act_opts(d)->saved == FG_ACT_SAVED_SLOPE || (d->flags & FG_PLAN_ACT_SLOPE);
}
static bool consume_form(const fg_plan_desc *d) { return act_opts(d)->consume || (d->flags & FG_PLAN_CONSUME_PRE); }

/* ------------------------------------------------------------------ validation */


/* t must have exactly the shape `like` has with its last dim replaced by `last`. */
static fg_status check_like(const char *op, const char *what, const fg_tensor *t, const fg_tensor *like, int64_t last,
                            fg_dtype dtype) {
    FG_TRY(fg_check_desc(op, what, t, like->rank, like->rank));
    if (t->dtype != dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(dtype));
    for (int d = 0; d < like->rank; d++) {
        int64_t want = d == like->rank - 1 ? last : like->shape[d];
        if (t->shape[d] != want)
            return fg_fail(FG_ERR_SHAPE, "%s: %s.shape[%d]=%lld but it must be %lld", op, what, d,
                           (long long)t->shape[d], (long long)want);
    }
    return fg_check_contiguous(op, what, t);
}

/* act in range, then the linear layer's operands; gives B (1 unless w is [B, M, K]), N (rows
 * per batch), K, M. Batched weights: x [B, ..., K], b NULL, [M] (shared) or [B, M]. */
static fg_status check_xwb(const char *op, int act, const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                           int64_t *B, int64_t *N, int64_t *K, int64_t *M) {
    if (act < FG_ACT_NONE || act > FG_ACT_TANH)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: act=%d is not an fg_activation", op, act);
    *B = 1;
    if (!w || w->rank != 3) return fg_check_linear_operands(op, "x", x, FG_MAX_RANK, w, b, N, K, M);
    FG_TRY(fg_check_desc(op, "x", x, 3, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "w", w, 3, 3));
    if (w->dtype != x->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: w is %s but x is %s", op, fg_dtype_name(w->dtype), fg_dtype_name(x->dtype));
    *B = w->shape[0], *M = w->shape[1], *K = x->shape[x->rank - 1];
    if (w->shape[2] != *K)
        return fg_fail(FG_ERR_SHAPE, "%s: w.shape[2]=%lld but x.shape[-1]=%lld", op, (long long)w->shape[2],
                       (long long)*K);
    if (x->shape[0] != *B)
        return fg_fail(FG_ERR_SHAPE, "%s: x.shape[0]=%lld but w.shape[0]=%lld (batched weights: one per x.shape[0])",
                       op, (long long)x->shape[0], (long long)*B);
    *N = 1;
    for (int d = 1; d < x->rank - 1; d++) *N *= x->shape[d];
    FG_TRY(fg_check_contiguous(op, "x", x));
    FG_TRY(fg_check_contiguous(op, "w", w));
    if (b->rank == 0) return FG_OK;
    FG_TRY(fg_check_desc(op, "b", b, 1, 2));
    if (b->dtype != x->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: b is %s but x is %s", op, fg_dtype_name(b->dtype), fg_dtype_name(x->dtype));
    if (b->shape[b->rank - 1] != *M || (b->rank == 2 && b->shape[0] != *B))
        return fg_fail(FG_ERR_SHAPE, "%s: b must be [%lld] or [%lld, %lld] with batched weights", op, (long long)*M,
                       (long long)*B, (long long)*M);
    return fg_check_contiguous(op, "b", b);
}

/* ------------------------------------------------------------------ the walk */

typedef struct act_run {
    fg_context *ctx;
    const fg_plan_desc *d;
    const fg_tensor *ops;  /* NULL when planning */
    void *ws;              /* NULL when planning */
    size_t gemm_at, gemm_bytes, total;
    bool run, size_only;
    fg_dtype dtype, acc;
    size_t es, aes;
    int64_t N, K, M;      /* N: rows per batch */
    int64_t B, bi;        /* batched weights: B batches, bi the one running (else 1, 0) */
    int64_t bstride[AB_N]; /* elements from one batch to the next, per operand (0: shared) */
    fg_kernel_info *info;
    const fg_act_path *path; /* the backend's choice for this plan */
    int kind;              /* the activation (fg_activation) */
    bool slope;            /* the saved operand is act′(pre) */
    int act;               /* the steps' act: the backward of the slope form runs GIVEN_SLOPE */
    uint32_t path_align;   /* the operands' declared alignment, lowered by the batch strides */
    fg_dropout_gen drop;   /* options.dropout (on: p > 0) */
    void *dy_drop;         /* backward with dropout: dy ⊙ m, which the walk reads as dy */
} act_run;

static size_t place(act_run *r, size_t bytes) {
    size_t at = r->total;
    r->total += ALIGN_UP(bytes);
    return at;
}

static void *at(const act_run *r, size_t off) { return r->ws ? (char *)r->ws + off : NULL; }

/* operand i's data for the running batch */
static void *data_of(const act_run *r, int i) {
    if (!r->ops || r->d->operands[i].rank == 0 || !r->ops[i].data) return NULL;
    if (i == AB_DY && r->dy_drop && r->d->op == FG_OP_LINEAR_ACT_BACKWARD)
        return (char *)r->dy_drop + r->bi * r->bstride[i] * (int64_t)r->es;
    return (char *)r->ops[i].data + r->bi * r->bstride[i] * (int64_t)r->es;
}


/* c[b] = a[b]·b[b] (+ bias) for b < batch; planning or running as the walk is. */
static fg_status gemm_epi(act_run *r, int64_t batch, int64_t m, int64_t n, int64_t k, fg_mat a, fg_mat b, fg_mat c,
                          double beta, bool has_bias, const void *bias, bool c_f32, const fg_gemm_epilogue *epi) {
    if (!r->run && r->size_only) return FG_OK;
    fg_gemm g = fg_gemm_plain(r->dtype, batch, m, n, k, a, b, c, beta, has_bias, bias,
                              (r->d->flags & FG_PLAN_ALLOW_TF32) != 0, c_f32, r->path_align);
    if (epi) g.epi = *epi;
    return fg_gemm_walk(r->ctx, &g, r->run, r->ws ? (char *)r->ws + r->gemm_at : NULL, r->gemm_bytes, &r->gemm_bytes,
                        r->info->name, sizeof r->info->name);
}

static fg_status gemm(act_run *r, int64_t batch, int64_t m, int64_t n, int64_t k, fg_mat a, fg_mat b, fg_mat c,
                      double beta, bool has_bias, const void *bias, bool c_f32) {
    return gemm_epi(r, batch, m, n, k, a, b, c, beta, has_bias, bias, c_f32, NULL);
}

static fg_status step(act_run *r, fg_act_call *c) {
    c->act = r->act;
    c->dtype = r->dtype;
    c->acc = r->acc;
    if (!r->run) {
        if (!r->size_only && c->step != FG_ACT_STEP_CAST) {
            char label[64];
            fg_act_call_label(label, sizeof label, c);
            fg_name_append(r->info->name, sizeof r->info->name, label);
        }
        return FG_OK;
    }
    return r->ctx->be->act(r->ctx, c);
}

/* Whether the backend's FORWARD and GRAD passes (and short-K tiles) apply the dropout themselves
   (one batch: the mask's flat index is the pass's own; the slope form's forward masks the saved
   slope there too). */
static bool pass_drops(const act_run *r) { return r->drop.on && r->path->pass_drop && r->B == 1; }

/* pre[N × M] = x·wᵀ + b into `dst` */
static fg_status pre_gemm(act_run *r, int xi, int wi, int bi, void *dst) {
    return gemm(r, 1, r->N, r->M, r->K, fg_mat_at(data_of(r, xi), r->K, 1), fg_mat_at(data_of(r, wi), 1, r->K),
                fg_mat_at(dst, r->M, 1), 0.0, has(&r->d->operands[bi]), data_of(r, bi), false);
}

/* y = act(x·wᵀ + b) with the activation (and pre or its slope, when kept) in the GEMM's epilogue
 * (the path says the backend has one for this act, dtype and layout); *fused says whether it ran
 * that way: should the backend decline at run time, the product is in y and the pass follows.
 * The dropout is offered to the epilogue too (one batch only: its flat index is y's); *dropped
 * says whether the backend applied it (planning: whether it will). */
static fg_status act_gemm(act_run *r, void *y, void *pre, bool *fused, bool *dropped) {
    *fused = *dropped = false;
    if (!r->run && r->size_only) return FG_OK;
    fg_gemm g = fg_gemm_plain(r->dtype, 1, r->N, r->M, r->K, fg_mat_at(data_of(r, AF_X), r->K, 1),
                              fg_mat_at(data_of(r, AF_W), 1, r->K), fg_mat_at(y, r->M, 1), 0.0,
                              has(&r->d->operands[AF_B]), data_of(r, AF_B), (r->d->flags & FG_PLAN_ALLOW_TF32) != 0,
                              false, r->path_align);
    g.act = r->kind;
    g.epi.has_aux = has(&r->d->operands[AF_PRE]);
    g.epi.aux = pre;
    g.epi.slope = r->slope;
    if (r->drop.on && r->B == 1) g.epi.drop = &r->drop, g.epi.drop_origin = y;
    fg_kernel_info info;
    if (!r->run) { /* planning: this GEMM is the whole forward (with the dropout when it says so) */
        FG_TRY(fg_gemm_walk(r->ctx, &g, false, NULL, 0, &r->gemm_bytes, r->info->name, sizeof r->info->name));
        FG_TRY(fg_gemm_execute(r->ctx, &g, &info, NULL, 0, false));
        *fused = true;
        *dropped = info.act_fused && info.drop_fused;
        return FG_OK;
    }
    FG_TRY(fg_gemm_execute(r->ctx, &g, &info, r->ws ? (char *)r->ws + r->gemm_at : NULL, r->gemm_bytes, true));
    *fused = info.act_fused; /* (not: the product + pass below write y and pre again) */
    *dropped = info.act_fused && info.drop_fused;
    return FG_OK;
}

/* The normalization family's dropout step over rows × M elements, x → y (in place when the
   same; flat index i·M + j), planned (its scratch need into c->need, its name into c->name).
   While planning x and y are NULL: the step plans from its shape, alignment and dtype alone. */
static fg_status drop_plan(act_run *r, const void *x, void *y, int64_t rows, fg_norm_call *c) {
    memset(c, 0, sizeof *c);
    c->step = FG_NORM_STEP_DROPOUT;
    c->dtype = c->w_dtype = c->stat_dtype = c->dw_dtype = c->db_dtype = r->dtype;
    c->acc = r->acc;
    c->rows = rows, c->cols = r->M;
    c->ld_x = c->ld_y = r->M;
    c->drop = r->drop;
    c->align = r->d->alignment;
    c->x = x, c->y = y;
    return r->ctx->be->norm(r->ctx, c, false);
}

/* That step as the walk meets it: planning, its kernels named (each once, in order); running
   (go), run with its scratch at `off` of the workspace. */
static fg_status drop_step(act_run *r, const void *x, void *y, int64_t rows, size_t off, bool go) {
    fg_norm_call c;
    FG_TRY(drop_plan(r, x, y, rows, &c));
    if (!r->run) {
        if (!r->size_only) fg_names_append(r->info->name, sizeof r->info->name, c.name);
        return FG_OK;
    }
    if (!go) return FG_OK;
    c.scratch = c.need ? at(r, off) : NULL;
    c.scratch_bytes = c.need;
    return r->ctx->be->norm(r->ctx, &c, true);
}

/* The dropout step's scratch bytes (0 without a dropout), the same in every walk. */
static size_t drop_need(act_run *r) {
    fg_norm_call c;
    if (!r->drop.on || drop_plan(r, NULL, NULL, r->B * r->N, &c) != FG_OK) return 0;
    return c.need;
}

/* The forward's dropout where the epilogue did not apply it: on all of y (and of the saved
   slope), after the last batch, its scratch at `off`. */
static fg_status forward_drop(act_run *r, bool dropped, size_t off) {
    if (dropped) return FG_OK;
    const int64_t rows = r->B * r->N;
    const bool go = r->bi == r->B - 1;
    void *y = r->ops ? r->ops[AF_Y].data : NULL;
    FG_TRY(drop_step(r, y, y, rows, off, go));
    if (r->slope) {
        void *s = r->ops ? r->ops[AF_PRE].data : NULL;
        FG_TRY(drop_step(r, s, s, rows, off, go));
    }
    return FG_OK;
}

static fg_status forward_steps(act_run *r, bool keep, void *y, void *pre, bool *dropped);

static fg_status forward(act_run *r) {
    const bool keep = r->d->operands[AF_PRE].rank != 0;
    void *y = data_of(r, AF_Y), *pre = keep ? data_of(r, AF_PRE) : y;
    const size_t drop_off = place(r, drop_need(r));
    bool fused = false, dropped = false;
    if (r->path->epilogue) FG_TRY(act_gemm(r, y, keep ? pre : NULL, &fused, &dropped));
    if (!fused) FG_TRY(forward_steps(r, keep, y, pre, &dropped));
    return r->drop.on ? forward_drop(r, dropped, drop_off) : FG_OK;
}

/* The forward without the epilogue: one tile kernel, or the product and the activation pass
   (which applies the dropout where the backend's pass takes it: *dropped). */
static fg_status forward_steps(act_run *r, bool keep, void *y, void *pre, bool *dropped) {
    if (r->path->fwd != FG_ACT_STEP_FORWARD) { /* product and activation in one kernel */
        fg_act_call c;
        memset(&c, 0, sizeof c);
        c.step = r->path->fwd;
        c.rows = r->N, c.cols = r->M, c.k = r->K;
        c.x = data_of(r, AF_X), c.w = data_of(r, AF_W), c.b = data_of(r, AF_B);
        c.y = y, c.pre = keep ? pre : NULL;
        c.ld_pre = c.ld_y = r->M;
        c.slope_out = r->slope;
        if (pass_drops(r) && c.step == FG_ACT_STEP_TILE_FORWARD) c.drop = r->drop, *dropped = true;
        return step(r, &c);
    }
    FG_TRY(pre_gemm(r, AF_X, AF_W, AF_B, pre));
    if (r->kind == FG_ACT_NONE && !keep) return FG_OK;
    fg_act_call c;
    memset(&c, 0, sizeof c);
    c.step = FG_ACT_STEP_FORWARD;
    c.rows = r->N, c.cols = r->M;
    c.pre = pre, c.y = y;
    c.ld_pre = c.ld_y = r->M;
    c.slope_out = r->slope;
    if (pass_drops(r)) c.drop = r->drop, *dropped = true;
    return step(r, &c);
}

/* dst = Σ of `parts` f32 partials of n elements in src, in order (+ dst when accumulating) */
static fg_status sum_cast(act_run *r, const void *src, int64_t parts, int64_t n, void *dst) {
    fg_act_call c;
    memset(&c, 0, sizeof c);
    c.step = FG_ACT_STEP_CAST;
    c.cols = n;
    c.parts = parts;
    c.src = src;
    c.dst = dst;
    c.accumulate = r->d->accumulate != 0;
    return step(r, &c);
}

/* db = the f32 sums in db_acc, rounded (added to db when accumulating); with batched weights
 * and db [M], once after the last batch */
static fg_status db_cast(act_run *r, void *db_acc, bool db_over_batches) {
    if (db_over_batches && r->bi != r->B - 1) return FG_OK;
    return sum_cast(r, db_acc, 1, r->M, data_of(r, AB_DB));
}

/* The whole backward in one kernel (the path's `fused` step), g kept on chip; dw comes back as
 * `fused_parts` f32 partials in its scratch, summed in order by the cast. */
static fg_status backward_fused(act_run *r, bool keep, bool want_db, bool db_over_batches) {
    const size_t scratch = r->path->fused_scratch;
    const int64_t parts = r->path->fused_parts;
    const size_t scratch_off = place(r, scratch), db_off = place(r, want_db ? (size_t)r->M * r->aes : 0);
    fg_act_call c;
    memset(&c, 0, sizeof c);
    c.step = r->path->fused;
    c.rows = r->N, c.cols = r->M, c.k = r->K;
    c.x = data_of(r, AB_X), c.w = data_of(r, AB_W), c.b = data_of(r, AB_B);
    c.dy = data_of(r, AB_DY), c.pre = keep ? data_of(r, AB_PRE) : NULL;
    c.dx = data_of(r, AB_DX);
    c.db_acc = want_db ? at(r, db_off) : NULL;
    c.first = !db_over_batches || r->bi == 0;
    c.scratch = at(r, scratch_off), c.scratch_bytes = scratch;
    c.accumulate = r->d->accumulate != 0;
    FG_TRY(step(r, &c));
    FG_TRY(sum_cast(r, c.scratch, parts, r->M * r->K, data_of(r, AB_DW)));
    return want_db ? db_cast(r, c.db_acc, db_over_batches) : FG_OK;
}

/* dy ⊙ m (fg_dropout_backward's) into the workspace for the whole tensor (or over dy itself
   with FG_PLAN_CONSUME_DY), made before the first batch; the walk then reads it as dy (data_of). */
static fg_status backward_drop(act_run *r) {
    const int64_t rows = r->B * r->N;
    const bool in_place = (r->d->flags & FG_PLAN_CONSUME_DY) != 0;
    const size_t dy_off = place(r, in_place ? 0 : (size_t)(rows * r->M) * r->es), step_off = place(r, drop_need(r));
    r->dy_drop = NULL; /* (data_of: dy itself while the step reads it) */
    void *dst = !r->run ? NULL : in_place ? r->ops[AB_DY].data : at(r, dy_off);
    FG_TRY(drop_step(r, r->ops ? r->ops[AB_DY].data : NULL, dst, rows, step_off, r->bi == 0));
    r->dy_drop = dst;
    return FG_OK;
}

static fg_status backward(act_run *r) {
    const fg_plan_desc *d = r->d;
    const fg_act_path *path = r->path;
    const bool keep = has(&d->operands[AB_PRE]), none = r->kind == FG_ACT_NONE;
    const bool want_dx = has(&d->operands[AB_DX]), want_dw = has(&d->operands[AB_DW]), want_db = has(&d->operands[AB_DB]);
    const bool consume = consume_form(d);
    /* batched weights with db [M]: db sums over the batches, one f32 sum rounded at the end */
    const bool db_over_batches = want_db && r->B > 1 && d->operands[AB_DB].rank == 1;
    /* the mask inside the gradient pass: where the walk below runs that pass over pre */
    const bool pass_drop = pass_drops(r) && path->fused == FG_ACT_STEP_FORWARD && !path->form && !none;
    if (r->drop.on && (want_dx || want_dw || want_db) && !pass_drop) FG_TRY(backward_drop(r));
    if (path->fused != FG_ACT_STEP_FORWARD) return backward_fused(r, keep, want_db, db_over_batches);
    const size_t nm = (size_t)(r->N * r->M);
    const size_t pre_off = place(r, keep || none ? 0 : nm * r->es);
    /* g goes where pre was when pre is the workspace's or the caller gave it up */
    const bool g_in_pre = !none && (!keep || consume);
    const size_t g_off = place(r, none || g_in_pre || !(want_dx || want_dw) ? 0 : nm * r->es);
    const int64_t parts = want_dw ? path->dw_parts : 0, per = parts ? r->N / parts : 0, tail = parts ? r->N - parts * per : 0;
    void *pre = keep ? data_of(r, AB_PRE) : at(r, pre_off);
    void *g = none ? data_of(r, AB_DY) : (want_dx || want_dw ? (g_in_pre ? pre : at(r, g_off)) : NULL);
    const bool tile = path->tile_grad, form = path->form;
    /* db's f32 sums, then the gradient pass's scratch (its per-slab partials): in the memory of
       dx or dw (written only later, by their products) when one of them is big enough, else in
       the workspace; the forming product keeps its own scratch in the GEMMs' workspace */
    const size_t scratch_bytes = path->grad_scratch;
    const size_t db_bytes = want_db ? ALIGN_UP((size_t)r->M * r->aes) : 0, sums_bytes = db_bytes + scratch_bytes;
    int home = -1; /* the output that lends its memory */
    if (sums_bytes && !d->accumulate && r->B == 1) { /* (+16: the sums start at the first 16-byte boundary) */
        if (want_dx && !form && (size_t)(r->N * r->K) * r->es >= sums_bytes + 16) home = AB_DX;
        else if (want_dw && !parts && (size_t)(r->M * r->K) * r->es >= sums_bytes + 16) home = AB_DW;
    }
    const size_t sums_off = place(r, home < 0 ? sums_bytes : 0);
    const size_t parts_off = place(r, parts ? (size_t)((parts + 1) * r->M * r->K) * r->aes : 0);
    if (!want_dx && !want_dw && !want_db) return FG_OK;

    if (!keep && !none && !tile) FG_TRY(pre_gemm(r, AB_X, AB_W, AB_B, pre));
    char *sums = home >= 0 ? (char *)data_of(r, home) : (char *)at(r, sums_off);
    if (home >= 0 && sums) sums += (16 - (uintptr_t)sums % 16) % 16; /* f32 sums need f32 alignment */
    void *db_acc = want_db ? sums : NULL, *scratch = sums ? sums + db_bytes : NULL;
    if (form) { /* g = dy ⊙ act′(pre) and db's sums made by dx's product itself: dx = g·w */
        fg_gemm_epilogue epi;
        memset(&epi, 0, sizeof epi);
        epi.form = r->act;
        epi.dy = data_of(r, AB_DY), epi.pre = pre;
        epi.col_sums = want_db, epi.sums = db_acc, epi.sums_first = !db_over_batches || r->bi == 0;
        FG_TRY(gemm_epi(r, 1, r->N, r->K, r->M, fg_mat_at(g, r->M, 1), fg_mat_at(data_of(r, AB_W), r->K, 1),
                        fg_mat_at(data_of(r, AB_DX), r->K, 1), d->accumulate ? 1.0 : 0.0, false, NULL, false, &epi));
    } else if (!none || want_db) {
        fg_act_call c;
        memset(&c, 0, sizeof c);
        c.step = tile ? FG_ACT_STEP_TILE_GRAD : FG_ACT_STEP_GRAD;
        c.rows = r->N, c.cols = r->M, c.k = r->K;
        c.x = data_of(r, AB_X), c.w = data_of(r, AB_W), c.b = data_of(r, AB_B);
        c.dy = data_of(r, AB_DY), c.pre = none ? c.dy : tile ? NULL : pre;
        c.g = none ? NULL : g; /* none: g is dy itself, only db's sums are wanted */
        c.ld_dy = c.ld_pre = c.ld_g = r->M;
        c.db_acc = db_acc;
        c.first = !db_over_batches || r->bi == 0;
        c.scratch = scratch, c.scratch_bytes = scratch_bytes;
        if (pass_drop) c.drop = r->drop;
        FG_TRY(step(r, &c));
    }
    if (want_db) FG_TRY(db_cast(r, db_acc, db_over_batches)); /* before the products: its sums may live in dx's or dw's memory */
    const double beta = d->accumulate ? 1.0 : 0.0;
    if (form) /* (dx done) */;
    else if (want_dx) /* dx[N × K] = g[N × M] · w[M × K] */
        FG_TRY(gemm(r, 1, r->N, r->K, r->M, fg_mat_at(g, r->M, 1), fg_mat_at(data_of(r, AB_W), r->K, 1),
                    fg_mat_at(data_of(r, AB_DX), r->K, 1), beta, false, NULL, false));
    if (want_dw && !parts) /* dw[M × K] = gᵀ[M × N] · x[N × K] */
        FG_TRY(gemm(r, 1, r->M, r->K, r->N, fg_mat_at(g, 1, r->M), fg_mat_at(data_of(r, AB_X), r->K, 1),
                    fg_mat_at(data_of(r, AB_DW), r->K, 1), beta, false, NULL, false));
    if (want_dw && parts) { /* parts products of `per` rows (+ the tail), summed in order */
        fg_mat ga = fg_mat_at(g, 1, r->M), xb = fg_mat_at(data_of(r, AB_X), r->K, 1), pc = fg_mat_at(at(r, parts_off), r->K, 1);
        ga.bs = per * r->M, xb.bs = per * r->K, pc.bs = r->M * r->K;
        FG_TRY(gemm(r, parts, r->M, r->K, per, ga, xb, pc, 0.0, false, NULL, true));
        if (tail) {
            char *gt = g ? (char *)g + parts * per * r->M * (int64_t)r->es : NULL;
            char *xt = data_of(r, AB_X) ? (char *)data_of(r, AB_X) + parts * per * r->K * (int64_t)r->es : NULL;
            fg_mat pt = fg_mat_at(at(r, parts_off + (size_t)(parts * r->M * r->K) * r->aes), r->K, 1);
            FG_TRY(gemm(r, 1, r->M, r->K, tail, fg_mat_at(gt, 1, r->M), fg_mat_at(xt, r->K, 1), pt, 0.0, false, NULL, true));
        }
        FG_TRY(sum_cast(r, at(r, parts_off), parts + (tail ? 1 : 0), r->M * r->K, data_of(r, AB_DW)));
    }
    return FG_OK;
}

/* The largest power of two dividing n·es (n elements of es bytes), at most `cap`. */
static uint32_t align_of_step(int64_t n, size_t es, uint32_t cap) {
    uint64_t bits = (uint64_t)n * es | cap;
    return (uint32_t)(bits & (~bits + 1));
}

static fg_status driver(fg_context *ctx, const fg_plan_desc *d, const fg_tensor *ops, void *priv, fg_kernel_info *info,
                        void *ws, size_t ws_bytes, bool run) {
    const bool fwd = d->op == FG_OP_LINEAR_ACT_FORWARD;
    const fg_tensor *x = &d->operands[fwd ? AF_X : AB_X], *w = &d->operands[fwd ? AF_W : AB_W];
    fg_act_path *path = priv; /* chosen when planning, followed when running */
    act_run r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    r.d = d;
    r.path = path;
    r.dtype = x->dtype;
    r.acc = x->dtype == FG_F64 ? FG_F64 : FG_F32;
    r.es = fg_dtype_size(r.dtype);
    r.aes = fg_dtype_size(r.acc);
    r.K = x->shape[x->rank - 1];
    r.B = w->rank == 3 ? w->shape[0] : 1;
    r.M = w->shape[w->rank - 2];
    r.N = 1;
    for (int i = w->rank == 3 ? 1 : 0; i < x->rank - 1; i++) r.N *= x->shape[i];
    r.path_align = d->alignment;
    if (w->rank == 3) { /* each operand's step from one batch to the next */
        const int64_t nk = r.N * r.K, nm = r.N * r.M, mk = r.M * r.K;
        const fg_tensor *bt = &d->operands[fwd ? AF_B : AB_B];
        const int64_t bs = bt->rank == 2 ? r.M : 0;
        if (fwd) {
            r.bstride[AF_X] = nk, r.bstride[AF_W] = mk, r.bstride[AF_B] = bs, r.bstride[AF_Y] = nm, r.bstride[AF_PRE] = nm;
        } else {
            r.bstride[AB_DY] = nm, r.bstride[AB_PRE] = nm, r.bstride[AB_X] = nk, r.bstride[AB_W] = mk;
            r.bstride[AB_B] = bs, r.bstride[AB_DX] = nk, r.bstride[AB_DW] = mk;
            r.bstride[AB_DB] = d->operands[AB_DB].rank == 2 ? r.M : 0;
        }
        for (int i = 0; i < AB_N; i++) /* the later batches' pointers are aligned this much less */
            if (r.bstride[i]) r.path_align = align_of_step(r.bstride[i], r.es, r.path_align);
    }
    r.info = info;
    r.kind = act_opts(d)->act;
    r.slope = slope_form(d);
    r.drop = fg_dropout_make(act_opts(d)->dropout.p, act_opts(d)->dropout.seed, act_opts(d)->dropout.offset);
    r.act = r.slope && !fwd && r.kind != FG_ACT_NONE ? FG_ACT_GIVEN_SLOPE : r.kind; /* (none: g = dy, s = 1) */
    if (!run) {
        if (r.dtype == FG_F64 && !ctx->be->f64_kernels)
            return fg_fail(FG_ERR_UNSUPPORTED, "%s: the %s backend has no f64 kernels for it (f64 runs on the CPU)",
                           fwd ? "linear_act_forward" : "linear_act_backward", ctx->be->name);
        fg_act_problem p;
        memset(&p, 0, sizeof p);
        p.forward = fwd;
        p.act = r.act;
        p.kind = r.kind;
        p.slope = r.slope;
        p.keep = has(&d->operands[fwd ? AF_PRE : AB_PRE]);
        p.consume = !fwd && consume_form(d);
        p.accumulate = d->accumulate != 0;
        p.has_bias = has(&d->operands[fwd ? AF_B : AB_B]);
        p.want_dx = !fwd && has(&d->operands[AB_DX]);
        p.want_dw = !fwd && has(&d->operands[AB_DW]);
        p.want_db = !fwd && has(&d->operands[AB_DB]);
        p.tf32 = (d->flags & FG_PLAN_ALLOW_TF32) != 0;
        p.dtype = r.dtype;
        p.B = r.B, p.N = r.N, p.K = r.K, p.M = r.M;
        p.align = r.path_align;
        FG_TRY(ctx->be->act_plan(ctx, &p, path));
        info->name[0] = 0;
        FG_TRY(fwd ? forward(&r) : backward(&r));
        info->workspace_bytes = r.total + ALIGN_UP(r.gemm_bytes);
        info->deterministic = true;
        info->accumulator = r.acc;
        return FG_OK;
    }
    r.size_only = true;
    FG_TRY(fwd ? forward(&r) : backward(&r));
    if (ws_bytes < r.total)
        return fg_fail(FG_ERR_WORKSPACE, "linear_act: workspace of %zu bytes given, more than %zu needed", ws_bytes,
                       r.total);
    r.gemm_at = r.total;
    r.gemm_bytes = ws_bytes - r.total;
    r.size_only = false;
    r.run = true;
    r.ops = ops;
    r.ws = ws;
    for (r.bi = 0; r.bi < r.B; r.bi++) { /* batched weights: batch after batch, same workspace */
        r.total = 0;
        FG_TRY(fwd ? forward(&r) : backward(&r));
    }
    return FG_OK;
}

/* ------------------------------------------------------------------ lowering (validation) */

/* dropout.p in [0, 1]; the slope form's backward takes none (the saved slope carries the mask). */
static fg_status check_dropout(const char *op, const fg_plan_desc *d, bool fwd) {
    const double p = act_opts(d)->dropout.p;
    if (!(p >= 0.0 && p <= 1.0))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: dropout.p=%g must be in [0, 1]", op, p);
    if (!fwd && p > 0.0 && slope_form(d))
        return fg_fail(FG_ERR_INVALID_VALUE,
                       "%s: dropout.p=%g with the slope saved: the forward's saved slope carries the mask already "
                       "(the slope form's backward takes dropout.p = 0)", op, p);
    if (fwd && p > 0.0 && slope_form(d) && act_opts(d)->act == FG_ACT_NONE)
        return fg_fail(FG_ERR_INVALID_VALUE,
                       "%s: dropout.p=%g with act none and the slope saved: that backward takes g = dy and never "
                       "reads the slope, so the mask would be lost (keep pre, or save nothing)", op, p);
    return FG_OK;
}

static fg_status lower_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_act_forward";
    const fg_tensor *o = d->operands;
    int64_t B = 1, N = 0, K = 0, M = 0;
    FG_TRY(check_dropout(op, d, true));
    FG_TRY(check_xwb(op, act_opts(d)->act, &o[AF_X], &o[AF_W], &o[AF_B], &B, &N, &K, &M));
    FG_TRY(check_like(op, "y", &o[AF_Y], &o[AF_X], M, o[AF_X].dtype));
    if (has(&o[AF_PRE])) FG_TRY(check_like(op, "pre", &o[AF_PRE], &o[AF_X], M, o[AF_X].dtype));
    else if (slope_form(d))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: the slope form saves the slope there, but saved is absent", op);
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_act_backward";
    const fg_tensor *o = d->operands;
    int64_t B = 1, N = 0, K = 0, M = 0;
    FG_TRY(check_dropout(op, d, false));
    FG_TRY(check_xwb(op, act_opts(d)->act, &o[AB_X], &o[AB_W], &o[AB_B], &B, &N, &K, &M));
    const fg_dtype t = o[AB_X].dtype;
    FG_TRY(check_like(op, "dy", &o[AB_DY], &o[AB_X], M, t));
    if (has(&o[AB_PRE])) FG_TRY(check_like(op, "pre", &o[AB_PRE], &o[AB_X], M, t));
    else if (slope_form(d))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: the slope form reads the saved slope, but saved is absent", op);
    if (has(&o[AB_DX])) FG_TRY(check_like(op, "dx", &o[AB_DX], &o[AB_X], K, t));
    if (has(&o[AB_DW])) FG_TRY(check_like(op, "dw", &o[AB_DW], &o[AB_W], K, t));
    if (has(&o[AB_DB])) { /* b's shape; without b: [M], or [B, M] with batched weights */
        fg_tensor like;
        memset(&like, 0, sizeof like);
        like.rank = has(&o[AB_B]) ? o[AB_B].rank : (o[AB_W].rank == 3 && o[AB_DB].rank == 2 ? 2 : 1);
        like.shape[0] = like.rank == 2 ? B : M;
        like.shape[1] = M;
        FG_TRY(check_like(op, "db", &o[AB_DB], &like, M, t));
    }
    out->driver = driver;
    return FG_OK;
}

#define OPTS "fg_linear_act_options", sizeof(fg_linear_act_options)
static const fg_op_decl ops[] = {
    {FG_OP_LINEAR_ACT_FORWARD, "linear_act_forward", AF_N,
     {[AF_X] = {"x", false, false}, [AF_W] = {"w", false, false}, [AF_B] = {"b", false, true},
      [AF_Y] = {"y", true, false}, [AF_PRE] = {"pre", true, true}},
     FG_PLAN_ACT_SLOPE, OPTS, false, lower_forward},
    {FG_OP_LINEAR_ACT_BACKWARD, "linear_act_backward", AB_N,
     {[AB_DY] = {"dy", false, false}, [AB_PRE] = {"pre", false, true}, [AB_X] = {"x", false, false},
      [AB_W] = {"w", false, false}, [AB_B] = {"b", false, true}, [AB_DX] = {"dx", true, true},
      [AB_DW] = {"dw", true, true}, [AB_DB] = {"db", true, true}},
     FG_PLAN_ACT_SLOPE | FG_PLAN_CONSUME_PRE | FG_PLAN_CONSUME_DY, OPTS, false, lower_backward},
};
#undef OPTS

const fg_family fg_family_linear_act = {"linear_act", sizeof ops / sizeof ops[0], ops};

/* ------------------------------------------------------------------ one-call functions */

static const fg_linear_act_options none_opts = {FG_ACT_NONE, FG_ACT_SAVED_PRE, 0, {0.0, 0, 0}};

fg_status fg_linear_act_forward_ex(fg_context *ctx, const fg_linear_act_options *opt, const fg_tensor *x,
                                   const fg_tensor *w, const fg_tensor *b, const fg_tensor *y, const fg_tensor *saved) {
    if (opt && opt->saved == FG_ACT_SAVED_SLOPE && !saved)
        return fg_fail(FG_ERR_NULL_POINTER, "linear_act_forward: saved is NULL (the slope form writes the slope there)");
    const fg_tensor *args[AF_N] = {x, w, b, y, saved};
    return fg_run_op(ctx, FG_OP_LINEAR_ACT_FORWARD, opt ? opt : &none_opts, args, AF_N, 0, 0);
}

fg_status fg_linear_act_backward_ex(fg_context *ctx, const fg_linear_act_options *opt, const fg_tensor *dy,
                                    const fg_tensor *saved, const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                    const fg_tensor *dx, const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    if (opt && opt->saved == FG_ACT_SAVED_SLOPE && !saved)
        return fg_fail(FG_ERR_NULL_POINTER, "linear_act_backward: saved is NULL (the slope form reads the slope)");
    if (opt && opt->consume && !saved)
        return fg_fail(FG_ERR_NULL_POINTER, "linear_act_backward: saved is NULL (consume forms g in its memory)");
    const fg_tensor *args[AB_N] = {dy, saved, x, w, b, dx, dw, db};
    return fg_run_op(ctx, FG_OP_LINEAR_ACT_BACKWARD, opt ? opt : &none_opts, args, AB_N, accumulate, 0);
}

static fg_linear_act_options options(fg_activation act, fg_act_saved saved, int consume) {
    fg_linear_act_options o = {act, saved, consume, {0.0, 0, 0}};
    return o;
}

fg_status fg_linear_act_forward(fg_context *ctx, fg_activation act, const fg_tensor *x, const fg_tensor *w,
                                const fg_tensor *b, const fg_tensor *y, const fg_tensor *pre) {
    const fg_linear_act_options o = options(act, FG_ACT_SAVED_PRE, 0);
    return fg_linear_act_forward_ex(ctx, &o, x, w, b, y, pre);
}

fg_status fg_linear_act_backward(fg_context *ctx, fg_activation act, const fg_tensor *dy, const fg_tensor *pre,
                                 const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_tensor *dx,
                                 const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    const fg_linear_act_options o = options(act, FG_ACT_SAVED_PRE, 0);
    return fg_linear_act_backward_ex(ctx, &o, dy, pre, x, w, b, dx, dw, db, accumulate);
}

fg_status fg_linear_act_backward_consume(fg_context *ctx, fg_activation act, const fg_tensor *dy, const fg_tensor *pre,
                                         const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_tensor *dx,
                                         const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    if (!pre) return fg_fail(FG_ERR_NULL_POINTER, "linear_act_backward: pre is NULL (the consuming form needs it)");
    const fg_linear_act_options o = options(act, FG_ACT_SAVED_PRE, 1);
    return fg_linear_act_backward_ex(ctx, &o, dy, pre, x, w, b, dx, dw, db, accumulate);
}

fg_status fg_linear_act_forward_slope(fg_context *ctx, fg_activation act, const fg_tensor *x, const fg_tensor *w,
                                      const fg_tensor *b, const fg_tensor *y, const fg_tensor *slope) {
    if (!slope) return fg_fail(FG_ERR_NULL_POINTER, "linear_act_forward: slope is NULL (the slope form writes it)");
    const fg_linear_act_options o = options(act, FG_ACT_SAVED_SLOPE, 0);
    return fg_linear_act_forward_ex(ctx, &o, x, w, b, y, slope);
}

fg_status fg_linear_act_backward_slope(fg_context *ctx, fg_activation act, const fg_tensor *dy, const fg_tensor *slope,
                                       const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_tensor *dx,
                                       const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    if (!slope) return fg_fail(FG_ERR_NULL_POINTER, "linear_act_backward: slope is NULL (the slope form reads it)");
    const fg_linear_act_options o = options(act, FG_ACT_SAVED_SLOPE, 0);
    return fg_linear_act_backward_ex(ctx, &o, dy, slope, x, w, b, dx, dw, db, accumulate);
}

fg_status fg_linear_act_backward_input(fg_context *ctx, fg_activation act, const fg_tensor *dy, const fg_tensor *pre,
                                       const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_tensor *dx,
                                       int accumulate) {
    if (!dx) return fg_fail(FG_ERR_NULL_POINTER, "linear_act_backward: dx is NULL");
    return fg_linear_act_backward(ctx, act, dy, pre, x, w, b, dx, NULL, NULL, accumulate);
}

fg_status fg_linear_act_backward_weight(fg_context *ctx, fg_activation act, const fg_tensor *dy, const fg_tensor *pre,
                                        const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_tensor *dw,
                                        int accumulate) {
    if (!dw) return fg_fail(FG_ERR_NULL_POINTER, "linear_act_backward: dw is NULL");
    return fg_linear_act_backward(ctx, act, dy, pre, x, w, b, NULL, dw, NULL, accumulate);
}

fg_status fg_linear_act_backward_bias(fg_context *ctx, fg_activation act, const fg_tensor *dy, const fg_tensor *pre,
                                      const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_tensor *db,
                                      int accumulate) {
    if (!db) return fg_fail(FG_ERR_NULL_POINTER, "linear_act_backward: db is NULL");
    return fg_linear_act_backward(ctx, act, dy, pre, x, w, b, NULL, NULL, db, accumulate);
}

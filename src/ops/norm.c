/*
 * norm.c — front door and driver of the normalization family: LayerNorm / RMSNorm over the
 * last dim (with the residual add and its dropout fused: s = x + dropout(r) is what gets
 * normalized, and is written for the next residual), BatchNorm per channel over every leading
 * dim (training, evaluation, and the split form a synchronized BatchNorm needs), dropout, and
 * RevIN (PatchTST's reversible instance normalization, which no other op of the family
 * expresses: its statistics run over time per instance and channel, and its affine is per
 * channel of the other layout).
 *
 * Every op validates here and lowers to a driver that walks one to three backend steps
 * (fg_norm_call, src/core/internal.h): the row-norm step, the BatchNorm stats / apply pair
 * (forward and backward), dropout, and RevIN's. The steps are the same ones the fused encoder
 * layer calls with its own pointers. The backend chooses its kernels when the step is planned
 * (run = false: sizes, dtypes, the declared alignment) and names them; running, it launches
 * exactly those. BatchNorm's one-device forward and backward are the split form's two steps
 * with the sums in the workspace.
 */
#include "../core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { NF_X, NF_R, NF_W, NF_B, NF_Y, NF_S, NF_MEAN, NF_RSTD, NF_N };
enum { NB_DY, NB_DS, NB_X, NB_W, NB_MEAN, NB_RSTD, NB_DX, NB_DR, NB_DW, NB_DB, NB_N };
enum { BF_X, BF_R, BF_W, BF_B, BF_RM, BF_RV, BF_Y, BF_S, BF_MEAN, BF_RSTD, BF_N };
enum { BB_DY, BB_X, BB_W, BB_MEAN, BB_RSTD, BB_DX, BB_DR, BB_DW, BB_DB, BB_N };
enum { BS_X, BS_R, BS_S, BS_SUMS, BS_N };
enum { BA_X, BA_SUMS, BA_W, BA_B, BA_RM, BA_RV, BA_Y, BA_MEAN, BA_RSTD, BA_N };
enum { BBS_DY, BBS_X, BBS_MEAN, BBS_RSTD, BBS_SUMS, BBS_N };
enum { BBA_DY, BBA_X, BBA_W, BBA_MEAN, BBA_RSTD, BBA_SUMS, BBA_DX, BBA_DR, BBA_DW, BBA_DB, BBA_N };
enum { DF_X, DF_Y, DF_N };
enum { DB_DY, DB_DX, DB_N };
enum { RS_X, RS_MEAN, RS_STDEV, RS_N };
enum { RF_X, RF_W, RF_B, RF_MEAN, RF_STDEV, RF_Y, RF_N };
enum { RB_DY, RB_X, RB_W, RB_B, RB_MEAN, RB_STDEV, RB_DX, RB_DW, RB_DB, RB_N };

#define ALIGN_UP(x) (((x) + 255) & ~(size_t)255)
#define DEFAULT_EPS 1e-5
#define DEFAULT_MOMENTUM 0.1

static bool has(const fg_tensor *t) { return t->rank != 0; }

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

fg_dropout_gen fg_dropout_make(double p, uint64_t seed, uint64_t offset) {
    fg_dropout_gen g;
    memset(&g, 0, sizeof g);
    g.on = p > 0.0;
    g.seed = seed;
    g.offset = offset;
    if (!g.on) {
        g.scale = 1.0f;
        g.scale64 = 1.0;
        return g;
    }
    const double t = ceil(p * 16777216.0); /* u = k·2^-24 >= p  ⇔  k >= ceil(p·2^24) */
    g.threshold = (uint32_t)(t > 16777216.0 ? 16777216.0 : t);
    g.scale64 = p >= 1.0 ? 0.0 : 1.0 / (1.0 - p);
    g.scale = (float)g.scale64;
    return g;
}

/* ------------------------------------------------------------------ option checks */

static fg_status check_eps(const char *op, const char *what, double eps) {
    if (!(eps >= 0.0) || !isfinite(eps))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s.eps=%g must be finite and >= 0 (0 means 1e-5)", op, what, eps);
    return FG_OK;
}

static fg_status check_dropout(const char *op, const char *what, const fg_dropout_options *o) {
    if (!(o->p >= 0.0 && o->p <= 1.0))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s.p=%g must be in [0, 1]", op, what, o->p);
    return FG_OK;
}

static fg_status check_accumulate(const char *op, const fg_plan_desc *d) {
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0 (a forward writes)", op);
    return FG_OK;
}

static fg_status check_norm_options(const char *op, const fg_norm_options *o) {
    if ((int)o->kind != FG_NORM_LAYER && (int)o->kind != FG_NORM_RMS)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: norm.kind=%d is not an fg_norm_kind", op, (int)o->kind);
    FG_TRY(check_eps(op, "norm", o->eps));
    return check_dropout(op, "norm.dropout", &o->dropout);
}

static fg_status check_bn_options(const char *op, const fg_batch_norm_options *o) {
    if (o->eval != 0 && o->eval != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: batch_norm.eval=%d must be 0 or 1", op, o->eval);
    FG_TRY(check_eps(op, "batch_norm", o->eps));
    if (!(o->momentum >= 0.0 && o->momentum <= 1.0))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: batch_norm.momentum=%g must be in [0, 1] (0 means 0.1)", op,
                       o->momentum);
    return check_dropout(op, "batch_norm.dropout", &o->dropout);
}

static fg_status check_revin_options(const char *op, const fg_revin_options *o) {
    FG_TRY(check_eps(op, "revin", o->eps));
    if (o->denorm != 0 && o->denorm != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: revin.denorm=%d must be 0 or 1", op, o->denorm);
    if (o->subtract_last != 0 && o->subtract_last != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: revin.subtract_last=%d must be 0 or 1", op, o->subtract_last);
    return FG_OK;
}

/* ------------------------------------------------------------------ operand checks */

/* A float tensor of rank >= 1 (rank 0 reads as [1]) whose last dim is contiguous and whose
 * leading dims collapse into one row stride: rows × cols with row stride ld. */
static fg_status rows_of(const char *op, const char *what, const fg_tensor *t, int rank_lo, int64_t *rows,
                         int64_t *cols, int64_t *ld) {
    FG_TRY(fg_check_desc(op, what, t, rank_lo, FG_MAX_RANK));
    if (t->rank == 0) {
        *rows = *cols = *ld = 1;
        return FG_OK;
    }
    int64_t st[FG_MAX_RANK];
    fg_tensor_strides(t, st);
    *cols = t->shape[t->rank - 1];
    if (*cols > 1 && st[t->rank - 1] != 1)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: %s.stride[%d]=%lld: its last dim must be contiguous (stride 1)", op,
                       what, t->rank - 1, (long long)st[t->rank - 1]);
    int64_t count = 1, stride = 0;
    for (int d = 0; d < t->rank - 1; d++) count *= t->shape[d];
    if (count == 0) { /* no rows: nothing to collapse */
        *rows = 0;
        *ld = *cols;
        return FG_OK;
    }
    if (!fg_collapse_dims(t, t->rank - 1, &count, &stride))
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: %s's leading dims do not collapse into one row stride", op, what);
    *rows = count;
    *ld = count > 1 ? stride : *cols;
    if (count > 1 && *cols > 0 && stride < *cols)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: %s's row stride %lld is shorter than its rows (%lld)", op, what,
                       (long long)stride, (long long)*cols);
    return FG_OK;
}

/* t has like's dtype and shape. */
static fg_status same_shape(const char *op, const char *what, const fg_tensor *t, const char *like_name,
                            const fg_tensor *like) {
    if (t->dtype != like->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but %s is %s", op, what, fg_dtype_name(t->dtype), like_name,
                       fg_dtype_name(like->dtype));
    char a[160], b[160];
    bool same = t->rank == like->rank;
    for (int d = 0; same && d < t->rank; d++) same = t->shape[d] == like->shape[d];
    if (!same)
        return fg_fail(FG_ERR_SHAPE, "%s: %s is %s but %s is %s", op, what, fg_shape_str(t, a, sizeof a), like_name,
                       fg_shape_str(like, b, sizeof b));
    return FG_OK;
}

/* A data operand shaped like x: its row stride. */
static fg_status like_x(const char *op, const char *what, const fg_tensor *t, const char *xname, const fg_tensor *x,
                        int64_t *ld) {
    int64_t rows, cols;
    FG_TRY(fg_check_desc(op, what, t, 0, FG_MAX_RANK));
    FG_TRY(same_shape(op, what, t, xname, x));
    return rows_of(op, what, t, 0, &rows, &cols, ld);
}

/* A contiguous vector [n] whose dtype is one of a, b. */
static fg_status vec_of(const char *op, const char *what, const fg_tensor *t, int64_t n, fg_dtype a, fg_dtype b) {
    FG_TRY(fg_check_desc(op, what, t, 1, 1));
    if (t->dtype != a && t->dtype != b) {
        if (a == b)
            return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s", op, what, fg_dtype_name(t->dtype),
                           fg_dtype_name(a));
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s or %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(a), fg_dtype_name(b));
    }
    if (t->shape[0] != n)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape[0]=%lld but it must be %lld", op, what, (long long)t->shape[0],
                       (long long)n);
    return fg_check_contiguous(op, what, t);
}

/* Per-row statistics: [rows], or x's leading shape; acc dtype; contiguous. */
static fg_status row_stat(const char *op, const char *what, const fg_tensor *t, const fg_tensor *x, int64_t rows) {
    FG_TRY(fg_check_desc(op, what, t, 1, FG_MAX_RANK));
    const fg_dtype acc = acc_of(x->dtype);
    if (t->dtype != acc)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(acc));
    bool ok = t->rank == 1 && t->shape[0] == rows;
    if (!ok && x->rank >= 2 && t->rank == x->rank - 1) {
        ok = true;
        for (int d = 0; d < t->rank; d++) ok = ok && t->shape[d] == x->shape[d];
    }
    if (!ok) {
        char a[160];
        return fg_fail(FG_ERR_SHAPE, "%s: %s is %s but it must be [%lld] or x's leading dims", op, what,
                       fg_shape_str(t, a, sizeof a), (long long)rows);
    }
    return fg_check_contiguous(op, what, t);
}

/* BatchNorm's sums: f64 [2C + 1], contiguous. */
static fg_status sums_of(const char *op, const fg_tensor *t, int64_t C) {
    return vec_of(op, "sums", t, 2 * C + 1, FG_F64, FG_F64);
}

/* ------------------------------------------------------------------ the driver */

/* While planning (ops NULL) a present operand points at a placeholder the backend never reads:
 * its plan sees which operands are there, as the run will. */
static _Alignas(256) char placeholder[256];

/* Given: a required operand always (rank 0 is a scalar then), an optional one when its rank is not 0. */
static bool present(const fg_plan_desc *d, int i) {
    if (has(&d->operands[i])) return true;
    const fg_op_decl *e = fg_op_find(d->op, NULL);
    return e && i < e->n_operands && !e->operands[i].optional;
}

static const void *in_of(const fg_tensor *ops, const fg_plan_desc *d, int i) {
    if (!present(d, i)) return NULL;
    return ops ? ops[i].data : placeholder;
}

static void *out_of(const fg_tensor *ops, const fg_plan_desc *d, int i) { return (void *)in_of(ops, d, i); }

static int64_t ld_of(const fg_plan_desc *d, int i) {
    const fg_tensor *t = &d->operands[i];
    if (!has(t)) return 1; /* absent, or a scalar */
    int64_t rows = 0, cols = 0, ld = 0;
    if (rows_of("", "", t, 0, &rows, &cols, &ld) != FG_OK) return 0; /* validated by the lowering */
    return ld;
}

static fg_dtype dtype_or(const fg_plan_desc *d, int i, fg_dtype dflt) {
    return has(&d->operands[i]) ? d->operands[i].dtype : dflt;
}

static fg_norm_call call_init(fg_norm_step step, fg_dtype dt, uint32_t align) {
    fg_norm_call c;
    memset(&c, 0, sizeof c);
    c.step = step;
    c.dtype = dt;
    c.acc = acc_of(dt);
    c.w_dtype = c.stat_dtype = c.dw_dtype = c.db_dtype = dt;
    c.align = align;
    c.drop = fg_dropout_make(0.0, 0, 0);
    return c;
}

static double eps_or_default(double eps) { return eps > 0.0 ? eps : DEFAULT_EPS; }

/* The steps of each op, with pointers from ops (NULL while planning), sums at `sums` (the
 * workspace's, for the one-device BatchNorm). Returns their count. */
static int build(const fg_plan_desc *d, const fg_tensor *ops, double *ws_sums, fg_norm_call calls[2]) {
    const fg_tensor *o = d->operands;
    const uint32_t al = d->alignment;
    switch (d->op) {
    case FG_OP_NORM_FORWARD: {
        const fg_norm_options *opt = d->options;
        fg_norm_call c = call_init(FG_NORM_STEP_ROWS_FORWARD, o[NF_X].dtype, al);
        int64_t ld;
        rows_of("", "", &o[NF_X], 0, &c.rows, &c.cols, &ld);
        c.kind = (int)opt->kind;
        c.eps = eps_or_default(opt->eps);
        if (has(&o[NF_R])) c.drop = fg_dropout_make(opt->dropout.p, opt->dropout.seed, opt->dropout.offset);
        c.x = in_of(ops, d, NF_X), c.ld_x = ld_of(d, NF_X);
        c.r = in_of(ops, d, NF_R), c.ld_r = ld_of(d, NF_R);
        c.w = in_of(ops, d, NF_W), c.b = in_of(ops, d, NF_B);
        c.y = out_of(ops, d, NF_Y), c.ld_y = ld_of(d, NF_Y);
        c.s = out_of(ops, d, NF_S), c.ld_s = ld_of(d, NF_S);
        c.mean = out_of(ops, d, NF_MEAN), c.rstd = out_of(ops, d, NF_RSTD);
        calls[0] = c;
        return 1;
    }
    case FG_OP_NORM_BACKWARD: {
        const fg_norm_options *opt = d->options;
        fg_norm_call c = call_init(FG_NORM_STEP_ROWS_BACKWARD, o[NB_X].dtype, al);
        int64_t ld;
        rows_of("", "", &o[NB_X], 0, &c.rows, &c.cols, &ld);
        c.kind = (int)opt->kind;
        c.eps = eps_or_default(opt->eps);
        c.accumulate = d->accumulate != 0;
        if (has(&o[NB_DR])) c.drop = fg_dropout_make(opt->dropout.p, opt->dropout.seed, opt->dropout.offset);
        c.dy = in_of(ops, d, NB_DY), c.ld_dy = ld_of(d, NB_DY);
        c.ds = in_of(ops, d, NB_DS), c.ld_ds = ld_of(d, NB_DS);
        c.x = in_of(ops, d, NB_X), c.ld_x = ld_of(d, NB_X);
        c.w = in_of(ops, d, NB_W);
        c.mean = (void *)in_of(ops, d, NB_MEAN), c.rstd = (void *)in_of(ops, d, NB_RSTD);
        c.dx = out_of(ops, d, NB_DX), c.ld_dx = ld_of(d, NB_DX);
        c.dr = out_of(ops, d, NB_DR), c.ld_dr = ld_of(d, NB_DR);
        c.dw = out_of(ops, d, NB_DW), c.db = out_of(ops, d, NB_DB);
        c.dw_dtype = dtype_or(d, NB_DW, c.dtype), c.db_dtype = dtype_or(d, NB_DB, c.dtype);
        /* a plan for a recomputing backward is not one that reads saved statistics */
        if (!has(&o[NB_RSTD])) c.mean = c.rstd = NULL;
        calls[0] = c;
        return 1;
    }
    case FG_OP_BATCH_NORM_FORWARD:
    case FG_OP_BATCH_NORM_STATS:
    case FG_OP_BATCH_NORM_APPLY: {
        const fg_batch_norm_options *opt = d->options;
        const bool fwd = d->op == FG_OP_BATCH_NORM_FORWARD, stats = d->op == FG_OP_BATCH_NORM_STATS;
        const int xi = fwd ? BF_X : stats ? BS_X : BA_X;
        const fg_dtype dt = o[xi].dtype;
        int64_t rows, cols, ld;
        rows_of("", "", &o[xi], 0, &rows, &cols, &ld);
        int n = 0;
        const int ri = fwd ? BF_R : stats ? BS_R : -1, si = fwd ? BF_S : stats ? BS_S : -1;
        const bool has_r = ri >= 0 && has(&o[ri]), has_s = si >= 0 && has(&o[si]);
        const fg_dropout_gen drop =
            has_r ? fg_dropout_make(opt->dropout.p, opt->dropout.seed, opt->dropout.offset) : fg_dropout_make(0, 0, 0);
        double *sums = stats ? (double *)out_of(ops, d, BS_SUMS)
                       : fwd ? ws_sums
                             : (double *)in_of(ops, d, BA_SUMS);
        const bool whole = fwd && !opt->eval; /* the stats and apply steps as one */
        if (stats) {
            fg_norm_call c = call_init(FG_NORM_STEP_BN_STATS, dt, al);
            c.rows = rows, c.cols = cols;
            c.drop = drop;
            c.x = in_of(ops, d, xi), c.ld_x = ld;
            if (has_r) c.r = in_of(ops, d, ri), c.ld_r = ld_of(d, ri);
            if (has_s) c.s = out_of(ops, d, si), c.ld_s = ld_of(d, si);
            c.sums = sums;
            calls[n++] = c;
            return n;
        }
        fg_norm_call c = call_init(whole ? FG_NORM_STEP_BN_FORWARD : FG_NORM_STEP_BN_APPLY, dt, al);
        c.rows = rows, c.cols = cols;
        c.eval = opt->eval != 0;
        c.eps = eps_or_default(opt->eps);
        c.momentum = opt->momentum > 0.0 ? opt->momentum : DEFAULT_MOMENTUM;
        const int wi = fwd ? BF_W : BA_W, bi = fwd ? BF_B : BA_B, rmi = fwd ? BF_RM : BA_RM, rvi = fwd ? BF_RV : BA_RV;
        const int yi = fwd ? BF_Y : BA_Y, mi = fwd ? BF_MEAN : BA_MEAN, qi = fwd ? BF_RSTD : BA_RSTD;
        c.x = in_of(ops, d, xi), c.ld_x = ld;
        if (has_r) {
            c.r = in_of(ops, d, ri), c.ld_r = ld_of(d, ri), c.drop = drop;
            if (has_s) c.s = out_of(ops, d, si), c.ld_s = ld_of(d, si);
        }
        c.sums = c.eval ? NULL : sums;
        c.w = in_of(ops, d, wi), c.b = in_of(ops, d, bi);
        c.w_dtype = has(&o[wi]) ? o[wi].dtype : has(&o[bi]) ? o[bi].dtype : dt;
        c.running_mean = out_of(ops, d, rmi), c.running_var = out_of(ops, d, rvi);
        c.stat_dtype = dtype_or(d, rmi, dt);
        c.y = out_of(ops, d, yi), c.ld_y = ld_of(d, yi);
        c.mean = out_of(ops, d, mi), c.rstd = out_of(ops, d, qi);
        calls[n++] = c;
        return n;
    }
    case FG_OP_BATCH_NORM_BACKWARD:
    case FG_OP_BATCH_NORM_BACKWARD_STATS:
    case FG_OP_BATCH_NORM_BACKWARD_APPLY: {
        const fg_batch_norm_options *opt = d->options;
        const bool whole = d->op == FG_OP_BATCH_NORM_BACKWARD, stats = d->op == FG_OP_BATCH_NORM_BACKWARD_STATS;
        const int dyi = whole ? BB_DY : stats ? BBS_DY : BBA_DY, xi = whole ? BB_X : stats ? BBS_X : BBA_X;
        const int mi = whole ? BB_MEAN : stats ? BBS_MEAN : BBA_MEAN, qi = whole ? BB_RSTD : stats ? BBS_RSTD : BBA_RSTD;
        const fg_dtype dt = o[xi].dtype;
        int64_t rows, cols, ld;
        rows_of("", "", &o[xi], 0, &rows, &cols, &ld);
        double *sums = stats ? (double *)out_of(ops, d, BBS_SUMS)
                       : whole ? ws_sums
                               : (double *)in_of(ops, d, BBA_SUMS);
        int n = 0;
        const int dxi = whole ? BB_DX : BBA_DX, dri = whole ? BB_DR : BBA_DR, dwi = whole ? BB_DW : BBA_DW,
                  dbi = whole ? BB_DB : BBA_DB, wi = whole ? BB_W : BBA_W;
        const bool want_d = !stats && (has(&o[dxi]) || has(&o[dri]));
        const bool want_sums = !stats && (has(&o[dwi]) || has(&o[dbi]) || (want_d && !opt->eval));
        if (stats) {
            fg_norm_call c = call_init(FG_NORM_STEP_BN_BACKWARD_STATS, dt, al);
            c.rows = rows, c.cols = cols;
            c.dy = in_of(ops, d, dyi), c.ld_dy = ld_of(d, dyi);
            c.x = in_of(ops, d, xi), c.ld_x = ld;
            c.mean = (void *)in_of(ops, d, mi), c.rstd = (void *)in_of(ops, d, qi);
            c.sums = sums;
            calls[n++] = c;
            return n;
        }
        /* the whole backward with sums to form: the stats and apply steps as one */
        fg_norm_call c = call_init(whole && want_sums ? FG_NORM_STEP_BN_BACKWARD : FG_NORM_STEP_BN_BACKWARD_APPLY, dt, al);
        c.rows = rows, c.cols = cols;
        c.eval = opt->eval != 0;
        c.accumulate = d->accumulate != 0;
        if (has(&o[dri])) c.drop = fg_dropout_make(opt->dropout.p, opt->dropout.seed, opt->dropout.offset);
        c.dy = in_of(ops, d, dyi), c.ld_dy = ld_of(d, dyi);
        c.x = in_of(ops, d, xi), c.ld_x = ld;
        c.w = in_of(ops, d, wi);
        c.w_dtype = dtype_or(d, wi, dt);
        c.mean = (void *)in_of(ops, d, mi), c.rstd = (void *)in_of(ops, d, qi);
        c.sums = want_sums ? sums : NULL;
        c.dx = out_of(ops, d, dxi), c.ld_dx = ld_of(d, dxi);
        c.dr = out_of(ops, d, dri), c.ld_dr = ld_of(d, dri);
        c.dw = out_of(ops, d, dwi), c.db = out_of(ops, d, dbi);
        c.dw_dtype = dtype_or(d, dwi, dt), c.db_dtype = dtype_or(d, dbi, dt);
        calls[n++] = c;
        return n;
    }
    case FG_OP_DROPOUT_FORWARD:
    case FG_OP_DROPOUT_BACKWARD: {
        const fg_dropout_options *opt = d->options;
        const bool fwd = d->op == FG_OP_DROPOUT_FORWARD;
        const int xi = fwd ? DF_X : DB_DY, yi = fwd ? DF_Y : DB_DX;
        fg_norm_call c = call_init(FG_NORM_STEP_DROPOUT, o[xi].dtype, al);
        int64_t ld;
        rows_of("", "", &o[xi], 0, &c.rows, &c.cols, &ld);
        c.drop = fg_dropout_make(opt->p, opt->seed, opt->offset);
        c.accumulate = d->accumulate != 0;
        c.x = in_of(ops, d, xi), c.ld_x = ld;
        c.y = out_of(ops, d, yi), c.ld_y = ld_of(d, yi);
        calls[0] = c;
        return 1;
    }
    case FG_OP_REVIN_STATS:
    case FG_OP_REVIN_FORWARD:
    case FG_OP_REVIN_BACKWARD: {
        const fg_revin_options *opt = d->options;
        const int xi = d->op == FG_OP_REVIN_BACKWARD ? RB_X : 0;
        const fg_tensor *x = &o[xi];
        const fg_norm_step step = d->op == FG_OP_REVIN_STATS     ? FG_NORM_STEP_REVIN_STATS
                                  : d->op == FG_OP_REVIN_FORWARD ? FG_NORM_STEP_REVIN_APPLY
                                                                 : FG_NORM_STEP_REVIN_BACKWARD;
        fg_norm_call c = call_init(step, x->dtype, al);
        int64_t ld;
        rows_of("", "", x, 0, &c.rows, &c.cols, &ld);
        c.steps = x->shape[x->rank - 2];
        c.inst = c.steps > 0 ? c.rows / c.steps : 0;
        if (c.steps == 0) { /* rows_of gave 0 rows: the instances are the dims before L */
            c.inst = 1;
            for (int k = 0; k < x->rank - 2; k++) c.inst *= x->shape[k];
        }
        c.eps = eps_or_default(opt->eps);
        c.denorm = opt->denorm != 0;
        c.subtract_last = opt->subtract_last != 0;
        c.accumulate = d->accumulate != 0;
        c.x = in_of(ops, d, xi), c.ld_x = ld;
        if (d->op == FG_OP_REVIN_STATS) {
            c.mean = out_of(ops, d, RS_MEAN), c.rstd = out_of(ops, d, RS_STDEV);
        } else if (d->op == FG_OP_REVIN_FORWARD) {
            c.w = in_of(ops, d, RF_W), c.b = in_of(ops, d, RF_B);
            c.mean = (void *)in_of(ops, d, RF_MEAN), c.rstd = (void *)in_of(ops, d, RF_STDEV);
            c.y = out_of(ops, d, RF_Y), c.ld_y = ld_of(d, RF_Y);
        } else {
            c.dy = in_of(ops, d, RB_DY), c.ld_dy = ld_of(d, RB_DY);
            c.w = in_of(ops, d, RB_W), c.b = in_of(ops, d, RB_B);
            c.mean = (void *)in_of(ops, d, RB_MEAN), c.rstd = (void *)in_of(ops, d, RB_STDEV);
            c.dx = out_of(ops, d, RB_DX), c.ld_dx = ld_of(d, RB_DX);
            c.dw = out_of(ops, d, RB_DW), c.db = out_of(ops, d, RB_DB);
            c.dw_dtype = dtype_or(d, RB_DW, c.dtype), c.db_dtype = dtype_or(d, RB_DB, c.dtype);
        }
        calls[0] = c;
        return 1;
    }
    default: break;
    }
    return 0;
}

/* A BN_FORWARD / BN_BACKWARD step as the two steps it stands for: the stats step, then the apply
   step (which normalizes s when the stats step wrote it), sharing c's scratch. */
static void bn_split(const fg_norm_call *c, fg_norm_call parts[2]) {
    const bool fwd = c->step == FG_NORM_STEP_BN_FORWARD;
    fg_norm_call st = call_init(fwd ? FG_NORM_STEP_BN_STATS : FG_NORM_STEP_BN_BACKWARD_STATS, c->dtype, c->align);
    st.rows = c->rows, st.cols = c->cols;
    st.x = c->x, st.ld_x = c->ld_x;
    st.sums = c->sums;
    st.scratch = c->scratch, st.scratch_bytes = c->scratch_bytes;
    if (fwd) {
        st.r = c->r, st.ld_r = c->ld_r, st.s = c->s, st.ld_s = c->ld_s, st.drop = c->drop;
    } else {
        st.dy = c->dy, st.ld_dy = c->ld_dy;
        st.mean = c->mean, st.rstd = c->rstd;
    }
    fg_norm_call ap = *c;
    ap.step = fwd ? FG_NORM_STEP_BN_APPLY : FG_NORM_STEP_BN_BACKWARD_APPLY;
    ap.need = 0, ap.name[0] = 0;
    if (fwd && c->s) { /* the stats step wrote s: normalize it */
        ap.x = c->s, ap.ld_x = c->ld_s;
        ap.r = NULL, ap.s = NULL, ap.ld_r = ap.ld_s = 0;
        ap.drop = fg_dropout_make(0.0, 0, 0);
    }
    parts[0] = st, parts[1] = ap;
}

fg_status fg_norm_bn_parts(fg_context *ctx, fg_norm_call *c, bool run,
                           fg_status (*step)(fg_context *ctx, fg_norm_call *c, bool run)) {
    fg_norm_call parts[2];
    bn_split(c, parts);
    if (!run) c->need = 0, c->name[0] = 0;
    for (int i = 0; i < 2; i++) { /* each part planned first: a run records the names its plan made */
        FG_TRY(step(ctx, &parts[i], false));
        if (run) {
            FG_TRY(step(ctx, &parts[i], true));
            continue;
        }
        if (parts[i].need > c->need) c->need = parts[i].need;
        fg_names_append(c->name, sizeof c->name, parts[i].name);
    }
    return FG_OK;
}

/* The one-device BatchNorm ops keep their sums in the workspace, before the steps' scratch. */
static size_t sums_bytes(const fg_plan_desc *d) {
    if (d->op != FG_OP_BATCH_NORM_FORWARD && d->op != FG_OP_BATCH_NORM_BACKWARD) return 0;
    const fg_tensor *x = &d->operands[d->op == FG_OP_BATCH_NORM_FORWARD ? BF_X : BB_X];
    const int64_t C = x->rank ? x->shape[x->rank - 1] : 1;
    return ALIGN_UP((size_t)(2 * C + 1) * sizeof(double));
}

static fg_status driver(fg_context *ctx, const fg_plan_desc *d, const fg_tensor *ops, void *priv, fg_kernel_info *info,
                        void *ws, size_t ws_bytes, bool run) {
    (void)priv;
    const fg_op_decl *e = fg_op_find(d->op, NULL);
    const size_t sb = sums_bytes(d);
    fg_norm_call calls[2];
    const int n = build(d, ops, sb ? (run ? (double *)ws : (double *)(void *)placeholder) : NULL, calls);
    if (n == 0) return fg_fail(FG_ERR_INTERNAL, "%s: no steps", e ? e->name : "norm");
    if (calls[0].dtype == FG_F64 && !ctx->be->f64_kernels)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: the %s backend has no f64 kernels for it (f64 runs on the CPU)",
                       e->name, ctx->be->name);
    size_t need = 0;
    if (!run) info->name[0] = 0;
    for (int i = 0; i < n; i++) {
        FG_TRY(ctx->be->norm(ctx, &calls[i], false));
        if (calls[i].need > need) need = calls[i].need;
        if (!run) fg_names_append(info->name, sizeof info->name, calls[i].name);
    }
    if (!run) {
        info->workspace_bytes = sb + ALIGN_UP(need);
        info->deterministic = true;
        info->accumulator = acc_of(calls[0].dtype);
        return FG_OK;
    }
    if (ws_bytes < sb + need)
        return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, %zu needed", e->name, ws_bytes, sb + need);
    for (int i = 0; i < n; i++) {
        calls[i].scratch = need ? (char *)ws + sb : NULL;
        calls[i].scratch_bytes = need;
        FG_TRY(ctx->be->norm(ctx, &calls[i], true));
    }
    return FG_OK;
}

/* ------------------------------------------------------------------ lowering (validation) */

static fg_status lower_norm_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "norm_forward";
    const fg_tensor *o = d->operands;
    const fg_norm_options *opt = d->options;
    FG_TRY(check_norm_options(op, opt));
    FG_TRY(check_accumulate(op, d));
    int64_t rows, D, ld;
    FG_TRY(rows_of(op, "x", &o[NF_X], 1, &rows, &D, &ld));
    if (D == 0 && rows > 0) return fg_fail(FG_ERR_SHAPE, "%s: x.shape[-1]=0: a norm over no elements", op);
    if (has(&o[NF_R])) FG_TRY(like_x(op, "r", &o[NF_R], "x", &o[NF_X], &ld));
    else if (opt->dropout.p > 0.0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: norm.dropout.p=%g but r is absent (the dropout applies to r)", op,
                       opt->dropout.p);
    FG_TRY(like_x(op, "y", &o[NF_Y], "x", &o[NF_X], &ld));
    if (has(&o[NF_S])) FG_TRY(like_x(op, "s", &o[NF_S], "x", &o[NF_X], &ld));
    if (has(&o[NF_W])) FG_TRY(vec_of(op, "w", &o[NF_W], D, o[NF_X].dtype, o[NF_X].dtype));
    if (has(&o[NF_B])) FG_TRY(vec_of(op, "b", &o[NF_B], D, o[NF_X].dtype, o[NF_X].dtype));
    if (has(&o[NF_MEAN])) {
        if (opt->kind == FG_NORM_RMS)
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: mean is given but RMSNorm has no mean (pass rstd only)", op);
        FG_TRY(row_stat(op, "mean", &o[NF_MEAN], &o[NF_X], rows));
    }
    if (has(&o[NF_RSTD])) FG_TRY(row_stat(op, "rstd", &o[NF_RSTD], &o[NF_X], rows));
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_norm_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "norm_backward";
    const fg_tensor *o = d->operands;
    const fg_norm_options *opt = d->options;
    FG_TRY(check_norm_options(op, opt));
    int64_t rows, D, ld;
    FG_TRY(rows_of(op, "x", &o[NB_X], 1, &rows, &D, &ld));
    if (D == 0 && rows > 0) return fg_fail(FG_ERR_SHAPE, "%s: x.shape[-1]=0: a norm over no elements", op);
    FG_TRY(like_x(op, "dy", &o[NB_DY], "x", &o[NB_X], &ld));
    if (has(&o[NB_DS])) FG_TRY(like_x(op, "ds", &o[NB_DS], "x", &o[NB_X], &ld));
    if (has(&o[NB_W])) FG_TRY(vec_of(op, "w", &o[NB_W], D, o[NB_X].dtype, o[NB_X].dtype));
    if (opt->kind == FG_NORM_RMS && has(&o[NB_MEAN]))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: mean is given but RMSNorm has no mean (pass rstd only)", op);
    if (opt->kind == FG_NORM_LAYER && has(&o[NB_MEAN]) != has(&o[NB_RSTD]))
        return fg_fail(FG_ERR_NULL_POINTER,
                       "%s: %s is given but %s is absent: give both (saved) or neither (recomputed from x)", op,
                       has(&o[NB_MEAN]) ? "mean" : "rstd", has(&o[NB_MEAN]) ? "rstd" : "mean");
    if (has(&o[NB_MEAN])) FG_TRY(row_stat(op, "mean", &o[NB_MEAN], &o[NB_X], rows));
    if (has(&o[NB_RSTD])) FG_TRY(row_stat(op, "rstd", &o[NB_RSTD], &o[NB_X], rows));
    if (has(&o[NB_DX])) FG_TRY(like_x(op, "dx", &o[NB_DX], "x", &o[NB_X], &ld));
    if (has(&o[NB_DR])) FG_TRY(like_x(op, "dr", &o[NB_DR], "x", &o[NB_X], &ld));
    const fg_dtype dt = o[NB_X].dtype, acc = acc_of(dt);
    if (has(&o[NB_DW])) FG_TRY(vec_of(op, "dw", &o[NB_DW], D, dt, acc));
    if (has(&o[NB_DB])) FG_TRY(vec_of(op, "db", &o[NB_DB], D, dt, acc));
    out->driver = driver;
    return FG_OK;
}

/* x [..., C] of BatchNorm: N rows, C channels. */
static fg_status bn_x(const char *op, const char *what, const fg_tensor *x, int64_t *N, int64_t *C) {
    int64_t ld;
    FG_TRY(rows_of(op, what, x, 1, N, C, &ld));
    return FG_OK;
}

/* w, b, running stats: [C], x's dtype or the accumulator type. */
static fg_status bn_param(const char *op, const char *what, const fg_tensor *t, const fg_tensor *x, int64_t C) {
    return vec_of(op, what, t, C, x->dtype, acc_of(x->dtype));
}

static fg_status bn_affine(const char *op, const fg_tensor *w, const fg_tensor *b, const fg_tensor *x, int64_t C) {
    if (has(w)) FG_TRY(bn_param(op, "w", w, x, C));
    if (has(b)) FG_TRY(bn_param(op, "b", b, x, C));
    if (has(w) && has(b) && w->dtype != b->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: w is %s but b is %s: they must match", op, fg_dtype_name(w->dtype),
                       fg_dtype_name(b->dtype));
    return FG_OK;
}

static fg_status bn_running(const char *op, const fg_tensor *rm, const fg_tensor *rv, const fg_tensor *x, int64_t C,
                            bool eval) {
    if (has(rm) != has(rv))
        return fg_fail(FG_ERR_NULL_POINTER, "%s: %s is given but %s is absent: give both or neither", op,
                       has(rm) ? "running_mean" : "running_var", has(rm) ? "running_var" : "running_mean");
    if (eval && !has(rm))
        return fg_fail(FG_ERR_NULL_POINTER, "%s: evaluation (batch_norm.eval=1) needs running_mean and running_var",
                       op);
    if (!has(rm)) return FG_OK;
    FG_TRY(bn_param(op, "running_mean", rm, x, C));
    FG_TRY(bn_param(op, "running_var", rv, x, C));
    if (rm->dtype != rv->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: running_mean is %s but running_var is %s: they must match", op,
                       fg_dtype_name(rm->dtype), fg_dtype_name(rv->dtype));
    return FG_OK;
}

static fg_status bn_stat(const char *op, const char *what, const fg_tensor *t, const fg_tensor *x, int64_t C) {
    return vec_of(op, what, t, C, acc_of(x->dtype), acc_of(x->dtype));
}

/* r (the residual branch) and s: shaped like x; dropout only with r. */
static fg_status bn_residual(const char *op, const fg_batch_norm_options *opt, const fg_tensor *x,
                             const fg_tensor *r, const fg_tensor *s) {
    int64_t ld;
    if (has(r)) FG_TRY(like_x(op, "r", r, "x", x, &ld));
    else if (opt->dropout.p > 0.0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: batch_norm.dropout.p=%g but r is absent (the dropout applies to r)",
                       op, opt->dropout.p);
    if (has(s)) {
        if (!has(r)) return fg_fail(FG_ERR_NULL_POINTER, "%s: s is requested but r is absent (s = x + dropout(r))", op);
        FG_TRY(like_x(op, "s", s, "x", x, &ld));
    }
    return FG_OK;
}

static fg_status lower_bn_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "batch_norm_forward";
    const fg_tensor *o = d->operands;
    const fg_batch_norm_options *opt = d->options;
    FG_TRY(check_bn_options(op, opt));
    FG_TRY(check_accumulate(op, d));
    int64_t N, C, ld;
    FG_TRY(bn_x(op, "x", &o[BF_X], &N, &C));
    FG_TRY(bn_residual(op, opt, &o[BF_X], &o[BF_R], &o[BF_S]));
    FG_TRY(bn_affine(op, &o[BF_W], &o[BF_B], &o[BF_X], C));
    FG_TRY(bn_running(op, &o[BF_RM], &o[BF_RV], &o[BF_X], C, opt->eval != 0));
    FG_TRY(like_x(op, "y", &o[BF_Y], "x", &o[BF_X], &ld));
    if (has(&o[BF_MEAN])) FG_TRY(bn_stat(op, "mean", &o[BF_MEAN], &o[BF_X], C));
    if (has(&o[BF_RSTD])) FG_TRY(bn_stat(op, "rstd", &o[BF_RSTD], &o[BF_X], C));
    if (!opt->eval && N < 2 && C > 0)
        return fg_fail(FG_ERR_SHAPE, "%s: training needs more than one value per channel (x has %lld rows)", op,
                       (long long)N);
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_bn_stats(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "batch_norm_stats";
    const fg_tensor *o = d->operands;
    const fg_batch_norm_options *opt = d->options;
    FG_TRY(check_bn_options(op, opt));
    FG_TRY(check_accumulate(op, d));
    int64_t N, C;
    FG_TRY(bn_x(op, "x", &o[BS_X], &N, &C));
    FG_TRY(bn_residual(op, opt, &o[BS_X], &o[BS_R], &o[BS_S]));
    FG_TRY(sums_of(op, &o[BS_SUMS], C));
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_bn_apply(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "batch_norm_apply";
    const fg_tensor *o = d->operands;
    const fg_batch_norm_options *opt = d->options;
    FG_TRY(check_bn_options(op, opt));
    FG_TRY(check_accumulate(op, d));
    if (opt->dropout.p > 0.0)
        return fg_fail(FG_ERR_INVALID_VALUE,
                       "%s: batch_norm.dropout.p=%g but apply has no r (batch_norm_stats applies the dropout)", op,
                       opt->dropout.p);
    int64_t N, C, ld;
    FG_TRY(bn_x(op, "x", &o[BA_X], &N, &C));
    if (opt->eval && has(&o[BA_SUMS]))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: sums is given but evaluation (batch_norm.eval=1) normalizes with the "
                       "running statistics", op);
    if (!opt->eval && !has(&o[BA_SUMS]))
        return fg_fail(FG_ERR_NULL_POINTER, "%s: training needs sums (from batch_norm_stats)", op);
    if (has(&o[BA_SUMS])) FG_TRY(sums_of(op, &o[BA_SUMS], C));
    FG_TRY(bn_affine(op, &o[BA_W], &o[BA_B], &o[BA_X], C));
    FG_TRY(bn_running(op, &o[BA_RM], &o[BA_RV], &o[BA_X], C, opt->eval != 0));
    FG_TRY(like_x(op, "y", &o[BA_Y], "x", &o[BA_X], &ld));
    if (has(&o[BA_MEAN])) FG_TRY(bn_stat(op, "mean", &o[BA_MEAN], &o[BA_X], C));
    if (has(&o[BA_RSTD])) FG_TRY(bn_stat(op, "rstd", &o[BA_RSTD], &o[BA_X], C));
    out->driver = driver;
    return FG_OK;
}

static fg_status bn_backward_common(const char *op, const fg_tensor *dy, const fg_tensor *x, const fg_tensor *mean,
                                    const fg_tensor *rstd, int64_t *C) {
    int64_t N, ld;
    FG_TRY(bn_x(op, "x", x, &N, C));
    FG_TRY(like_x(op, "dy", dy, "x", x, &ld));
    FG_TRY(bn_stat(op, "mean", mean, x, *C));
    return bn_stat(op, "rstd", rstd, x, *C);
}

static fg_status bn_grads(const char *op, const fg_batch_norm_options *opt, const fg_tensor *x, const fg_tensor *w,
                          const fg_tensor *dx, const fg_tensor *dr, const fg_tensor *dw, const fg_tensor *db,
                          int64_t C) {
    int64_t ld;
    if (has(w)) FG_TRY(bn_param(op, "w", w, x, C));
    if (has(dx)) FG_TRY(like_x(op, "dx", dx, "x", x, &ld));
    if (has(dr)) FG_TRY(like_x(op, "dr", dr, "x", x, &ld));
    const fg_dtype acc = acc_of(x->dtype);
    if (has(dw)) FG_TRY(vec_of(op, "dw", dw, C, x->dtype, acc));
    if (has(db)) FG_TRY(vec_of(op, "db", db, C, x->dtype, acc));
    (void)opt;
    return FG_OK;
}

static fg_status lower_bn_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "batch_norm_backward";
    const fg_tensor *o = d->operands;
    const fg_batch_norm_options *opt = d->options;
    FG_TRY(check_bn_options(op, opt));
    int64_t C;
    FG_TRY(bn_backward_common(op, &o[BB_DY], &o[BB_X], &o[BB_MEAN], &o[BB_RSTD], &C));
    FG_TRY(bn_grads(op, opt, &o[BB_X], &o[BB_W], &o[BB_DX], &o[BB_DR], &o[BB_DW], &o[BB_DB], C));
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_bn_backward_stats(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "batch_norm_backward_stats";
    const fg_tensor *o = d->operands;
    FG_TRY(check_bn_options(op, d->options));
    FG_TRY(check_accumulate(op, d));
    int64_t C;
    FG_TRY(bn_backward_common(op, &o[BBS_DY], &o[BBS_X], &o[BBS_MEAN], &o[BBS_RSTD], &C));
    FG_TRY(sums_of(op, &o[BBS_SUMS], C));
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_bn_backward_apply(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "batch_norm_backward_apply";
    const fg_tensor *o = d->operands;
    const fg_batch_norm_options *opt = d->options;
    FG_TRY(check_bn_options(op, opt));
    int64_t C;
    FG_TRY(bn_backward_common(op, &o[BBA_DY], &o[BBA_X], &o[BBA_MEAN], &o[BBA_RSTD], &C));
    FG_TRY(sums_of(op, &o[BBA_SUMS], C));
    FG_TRY(bn_grads(op, opt, &o[BBA_X], &o[BBA_W], &o[BBA_DX], &o[BBA_DR], &o[BBA_DW], &o[BBA_DB], C));
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_dropout(const fg_plan_desc *d, fg_lowered *out) {
    const bool fwd = d->op == FG_OP_DROPOUT_FORWARD;
    const char *op = fwd ? "dropout_forward" : "dropout_backward";
    const fg_tensor *o = d->operands;
    FG_TRY(check_dropout(op, "dropout", d->options));
    if (fwd) FG_TRY(check_accumulate(op, d));
    int64_t rows, cols, ld;
    const char *in = fwd ? "x" : "dy", *res = fwd ? "y" : "dx";
    FG_TRY(rows_of(op, in, &o[0], 0, &rows, &cols, &ld));
    FG_TRY(like_x(op, res, &o[1], in, &o[0], &ld));
    out->driver = driver;
    return FG_OK;
}

/* x [..., L, C]: its instance statistics' shape is x's without the L dim. */
static fg_status revin_x(const char *op, const char *what, const fg_tensor *x, int64_t *L, int64_t *C) {
    int64_t rows, ld;
    FG_TRY(rows_of(op, what, x, 2, &rows, C, &ld));
    *L = x->shape[x->rank - 2];
    return FG_OK;
}

static fg_status revin_stat(const char *op, const char *what, const fg_tensor *t, const fg_tensor *x) {
    FG_TRY(fg_check_desc(op, what, t, 1, FG_MAX_RANK));
    const fg_dtype acc = acc_of(x->dtype);
    if (t->dtype != acc)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(acc));
    bool ok = t->rank == x->rank - 1;
    for (int k = 0; ok && k < t->rank; k++) ok = t->shape[k] == x->shape[k < x->rank - 2 ? k : k + 1];
    if (!ok) {
        char a[160], b[160];
        return fg_fail(FG_ERR_SHAPE, "%s: %s is %s but it must be x's shape %s without its L dim", op, what,
                       fg_shape_str(t, a, sizeof a), fg_shape_str(x, b, sizeof b));
    }
    return fg_check_contiguous(op, what, t);
}

static fg_status lower_revin_stats(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "revin_stats";
    const fg_tensor *o = d->operands;
    FG_TRY(check_revin_options(op, d->options));
    FG_TRY(check_accumulate(op, d));
    int64_t L, C;
    FG_TRY(revin_x(op, "x", &o[RS_X], &L, &C));
    FG_TRY(revin_stat(op, "mean", &o[RS_MEAN], &o[RS_X]));
    FG_TRY(revin_stat(op, "stdev", &o[RS_STDEV], &o[RS_X]));
    if (L == 0 && fg_numel(&o[RS_MEAN]) > 0)
        return fg_fail(FG_ERR_SHAPE, "%s: x.shape[-2]=L=0: statistics over no time steps", op);
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_revin_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "revin_forward";
    const fg_tensor *o = d->operands;
    FG_TRY(check_revin_options(op, d->options));
    FG_TRY(check_accumulate(op, d));
    int64_t L, C, ld;
    FG_TRY(revin_x(op, "x", &o[RF_X], &L, &C));
    if (has(&o[RF_W])) FG_TRY(vec_of(op, "w", &o[RF_W], C, o[RF_X].dtype, o[RF_X].dtype));
    if (has(&o[RF_B])) FG_TRY(vec_of(op, "b", &o[RF_B], C, o[RF_X].dtype, o[RF_X].dtype));
    FG_TRY(revin_stat(op, "mean", &o[RF_MEAN], &o[RF_X]));
    FG_TRY(revin_stat(op, "stdev", &o[RF_STDEV], &o[RF_X]));
    FG_TRY(like_x(op, "y", &o[RF_Y], "x", &o[RF_X], &ld));
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_revin_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "revin_backward";
    const fg_tensor *o = d->operands;
    FG_TRY(check_revin_options(op, d->options));
    int64_t L, C, ld;
    FG_TRY(revin_x(op, "x", &o[RB_X], &L, &C));
    FG_TRY(like_x(op, "dy", &o[RB_DY], "x", &o[RB_X], &ld));
    const fg_dtype dt = o[RB_X].dtype, acc = acc_of(dt);
    if (has(&o[RB_W])) FG_TRY(vec_of(op, "w", &o[RB_W], C, dt, dt));
    if (has(&o[RB_B])) FG_TRY(vec_of(op, "b", &o[RB_B], C, dt, dt));
    FG_TRY(revin_stat(op, "mean", &o[RB_MEAN], &o[RB_X]));
    FG_TRY(revin_stat(op, "stdev", &o[RB_STDEV], &o[RB_X]));
    if (has(&o[RB_DX])) FG_TRY(like_x(op, "dx", &o[RB_DX], "x", &o[RB_X], &ld));
    if (has(&o[RB_DW])) FG_TRY(vec_of(op, "dw", &o[RB_DW], C, dt, acc));
    if (has(&o[RB_DB])) FG_TRY(vec_of(op, "db", &o[RB_DB], C, dt, acc));
    out->driver = driver;
    return FG_OK;
}

/* ------------------------------------------------------------------ the declarations */

#define IN(n) {n, false, false}
#define IN_OPT(n) {n, false, true}
#define OUT(n) {n, true, false}
#define OUT_OPT(n) {n, true, true}
#define NORM_OPTS "fg_norm_options", sizeof(fg_norm_options)
#define BN_OPTS "fg_batch_norm_options", sizeof(fg_batch_norm_options)
#define DROP_OPTS "fg_dropout_options", sizeof(fg_dropout_options)
#define REVIN_OPTS "fg_revin_options", sizeof(fg_revin_options)
static const fg_op_decl ops[] = {
    {FG_OP_NORM_FORWARD, "norm_forward", NF_N,
     {[NF_X] = IN("x"), [NF_R] = IN_OPT("r"), [NF_W] = IN_OPT("w"), [NF_B] = IN_OPT("b"), [NF_Y] = OUT("y"),
      [NF_S] = OUT_OPT("s"), [NF_MEAN] = OUT_OPT("mean"), [NF_RSTD] = OUT_OPT("rstd")},
     0, NORM_OPTS, true, lower_norm_forward},
    {FG_OP_NORM_BACKWARD, "norm_backward", NB_N,
     {[NB_DY] = IN("dy"), [NB_DS] = IN_OPT("ds"), [NB_X] = IN("x"), [NB_W] = IN_OPT("w"), [NB_MEAN] = IN_OPT("mean"),
      [NB_RSTD] = IN_OPT("rstd"), [NB_DX] = OUT_OPT("dx"), [NB_DR] = OUT_OPT("dr"), [NB_DW] = OUT_OPT("dw"),
      [NB_DB] = OUT_OPT("db")},
     0, NORM_OPTS, true, lower_norm_backward},
    {FG_OP_BATCH_NORM_FORWARD, "batch_norm_forward", BF_N,
     {[BF_X] = IN("x"), [BF_R] = IN_OPT("r"), [BF_W] = IN_OPT("w"), [BF_B] = IN_OPT("b"),
      [BF_RM] = OUT_OPT("running_mean"), [BF_RV] = OUT_OPT("running_var"), [BF_Y] = OUT("y"), [BF_S] = OUT_OPT("s"),
      [BF_MEAN] = OUT_OPT("mean"), [BF_RSTD] = OUT_OPT("rstd")},
     0, BN_OPTS, true, lower_bn_forward},
    {FG_OP_BATCH_NORM_BACKWARD, "batch_norm_backward", BB_N,
     {[BB_DY] = IN("dy"), [BB_X] = IN("x"), [BB_W] = IN_OPT("w"), [BB_MEAN] = IN("mean"), [BB_RSTD] = IN("rstd"),
      [BB_DX] = OUT_OPT("dx"), [BB_DR] = OUT_OPT("dr"), [BB_DW] = OUT_OPT("dw"), [BB_DB] = OUT_OPT("db")},
     0, BN_OPTS, true, lower_bn_backward},
    {FG_OP_BATCH_NORM_STATS, "batch_norm_stats", BS_N,
     {[BS_X] = IN("x"), [BS_R] = IN_OPT("r"), [BS_S] = OUT_OPT("s"), [BS_SUMS] = OUT("sums")},
     0, BN_OPTS, true, lower_bn_stats},
    {FG_OP_BATCH_NORM_APPLY, "batch_norm_apply", BA_N,
     {[BA_X] = IN("x"), [BA_SUMS] = IN_OPT("sums"), [BA_W] = IN_OPT("w"), [BA_B] = IN_OPT("b"),
      [BA_RM] = OUT_OPT("running_mean"), [BA_RV] = OUT_OPT("running_var"), [BA_Y] = OUT("y"),
      [BA_MEAN] = OUT_OPT("mean"), [BA_RSTD] = OUT_OPT("rstd")},
     0, BN_OPTS, true, lower_bn_apply},
    {FG_OP_BATCH_NORM_BACKWARD_STATS, "batch_norm_backward_stats", BBS_N,
     {[BBS_DY] = IN("dy"), [BBS_X] = IN("x"), [BBS_MEAN] = IN("mean"), [BBS_RSTD] = IN("rstd"),
      [BBS_SUMS] = OUT("sums")},
     0, BN_OPTS, false, lower_bn_backward_stats},
    {FG_OP_BATCH_NORM_BACKWARD_APPLY, "batch_norm_backward_apply", BBA_N,
     {[BBA_DY] = IN("dy"), [BBA_X] = IN("x"), [BBA_W] = IN_OPT("w"), [BBA_MEAN] = IN("mean"),
      [BBA_RSTD] = IN("rstd"), [BBA_SUMS] = IN("sums"), [BBA_DX] = OUT_OPT("dx"), [BBA_DR] = OUT_OPT("dr"),
      [BBA_DW] = OUT_OPT("dw"), [BBA_DB] = OUT_OPT("db")},
     0, BN_OPTS, true, lower_bn_backward_apply},
    {FG_OP_DROPOUT_FORWARD, "dropout_forward", DF_N, {[DF_X] = IN("x"), [DF_Y] = OUT("y")}, 0, DROP_OPTS, true,
     lower_dropout},
    {FG_OP_DROPOUT_BACKWARD, "dropout_backward", DB_N, {[DB_DY] = IN("dy"), [DB_DX] = OUT("dx")}, 0, DROP_OPTS, true,
     lower_dropout},
    {FG_OP_REVIN_STATS, "revin_stats", RS_N, {[RS_X] = IN("x"), [RS_MEAN] = OUT("mean"), [RS_STDEV] = OUT("stdev")},
     0, REVIN_OPTS, false, lower_revin_stats},
    {FG_OP_REVIN_FORWARD, "revin_forward", RF_N,
     {[RF_X] = IN("x"), [RF_W] = IN_OPT("w"), [RF_B] = IN_OPT("b"), [RF_MEAN] = IN("mean"), [RF_STDEV] = IN("stdev"),
      [RF_Y] = OUT("y")},
     0, REVIN_OPTS, true, lower_revin_forward},
    {FG_OP_REVIN_BACKWARD, "revin_backward", RB_N,
     {[RB_DY] = IN("dy"), [RB_X] = IN("x"), [RB_W] = IN_OPT("w"), [RB_B] = IN_OPT("b"), [RB_MEAN] = IN("mean"),
      [RB_STDEV] = IN("stdev"), [RB_DX] = OUT_OPT("dx"), [RB_DW] = OUT_OPT("dw"), [RB_DB] = OUT_OPT("db")},
     0, REVIN_OPTS, true, lower_revin_backward},
};
#undef IN
#undef IN_OPT
#undef OUT
#undef OUT_OPT

const fg_family fg_family_norm = {"norm", sizeof ops / sizeof ops[0], ops};

/* ------------------------------------------------------------------ one-call functions */

fg_status fg_norm_forward(fg_context *ctx, const fg_norm_options *opt, const fg_tensor *x, const fg_tensor *r,
                          const fg_tensor *w, const fg_tensor *b, const fg_tensor *y, const fg_tensor *s,
                          const fg_tensor *mean, const fg_tensor *rstd) {
    const fg_tensor *args[NF_N] = {x, r, w, b, y, s, mean, rstd};
    return fg_run_op(ctx, FG_OP_NORM_FORWARD, opt, args, NF_N, 0, 0);
}

fg_status fg_norm_backward(fg_context *ctx, const fg_norm_options *opt, const fg_tensor *dy, const fg_tensor *ds,
                           const fg_tensor *x, const fg_tensor *w, const fg_tensor *mean, const fg_tensor *rstd,
                           const fg_tensor *dx, const fg_tensor *dr, const fg_tensor *dw, const fg_tensor *db,
                           int accumulate) {
    const fg_tensor *args[NB_N] = {dy, ds, x, w, mean, rstd, dx, dr, dw, db};
    return fg_run_op(ctx, FG_OP_NORM_BACKWARD, opt, args, NB_N, accumulate, 0);
}

fg_status fg_batch_norm_forward(fg_context *ctx, const fg_batch_norm_options *opt, const fg_tensor *x,
                                const fg_tensor *r, const fg_tensor *w, const fg_tensor *b,
                                const fg_tensor *running_mean, const fg_tensor *running_var, const fg_tensor *y,
                                const fg_tensor *s, const fg_tensor *mean, const fg_tensor *rstd) {
    const fg_tensor *args[BF_N] = {x, r, w, b, running_mean, running_var, y, s, mean, rstd};
    return fg_run_op(ctx, FG_OP_BATCH_NORM_FORWARD, opt, args, BF_N, 0, 0);
}

fg_status fg_batch_norm_backward(fg_context *ctx, const fg_batch_norm_options *opt, const fg_tensor *dy,
                                 const fg_tensor *x, const fg_tensor *w, const fg_tensor *mean, const fg_tensor *rstd,
                                 const fg_tensor *dx, const fg_tensor *dr, const fg_tensor *dw, const fg_tensor *db,
                                 int accumulate) {
    const fg_tensor *args[BB_N] = {dy, x, w, mean, rstd, dx, dr, dw, db};
    return fg_run_op(ctx, FG_OP_BATCH_NORM_BACKWARD, opt, args, BB_N, accumulate, 0);
}

fg_status fg_batch_norm_stats(fg_context *ctx, const fg_batch_norm_options *opt, const fg_tensor *x,
                              const fg_tensor *r, const fg_tensor *s, const fg_tensor *sums) {
    const fg_tensor *args[BS_N] = {x, r, s, sums};
    return fg_run_op(ctx, FG_OP_BATCH_NORM_STATS, opt, args, BS_N, 0, 0);
}

fg_status fg_batch_norm_apply(fg_context *ctx, const fg_batch_norm_options *opt, const fg_tensor *x,
                              const fg_tensor *sums, const fg_tensor *w, const fg_tensor *b,
                              const fg_tensor *running_mean, const fg_tensor *running_var, const fg_tensor *y,
                              const fg_tensor *mean, const fg_tensor *rstd) {
    const fg_tensor *args[BA_N] = {x, sums, w, b, running_mean, running_var, y, mean, rstd};
    return fg_run_op(ctx, FG_OP_BATCH_NORM_APPLY, opt, args, BA_N, 0, 0);
}

fg_status fg_batch_norm_backward_stats(fg_context *ctx, const fg_batch_norm_options *opt, const fg_tensor *dy,
                                       const fg_tensor *x, const fg_tensor *mean, const fg_tensor *rstd,
                                       const fg_tensor *sums) {
    const fg_tensor *args[BBS_N] = {dy, x, mean, rstd, sums};
    return fg_run_op(ctx, FG_OP_BATCH_NORM_BACKWARD_STATS, opt, args, BBS_N, 0, 0);
}

fg_status fg_batch_norm_backward_apply(fg_context *ctx, const fg_batch_norm_options *opt, const fg_tensor *dy,
                                       const fg_tensor *x, const fg_tensor *w, const fg_tensor *mean,
                                       const fg_tensor *rstd, const fg_tensor *sums, const fg_tensor *dx,
                                       const fg_tensor *dr, const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    const fg_tensor *args[BBA_N] = {dy, x, w, mean, rstd, sums, dx, dr, dw, db};
    return fg_run_op(ctx, FG_OP_BATCH_NORM_BACKWARD_APPLY, opt, args, BBA_N, accumulate, 0);
}

fg_status fg_dropout_forward(fg_context *ctx, const fg_dropout_options *opt, const fg_tensor *x, const fg_tensor *y) {
    const fg_tensor *args[DF_N] = {x, y};
    return fg_run_op(ctx, FG_OP_DROPOUT_FORWARD, opt, args, DF_N, 0, 0);
}

fg_status fg_dropout_backward(fg_context *ctx, const fg_dropout_options *opt, const fg_tensor *dy, const fg_tensor *dx,
                              int accumulate) {
    const fg_tensor *args[DB_N] = {dy, dx};
    return fg_run_op(ctx, FG_OP_DROPOUT_BACKWARD, opt, args, DB_N, accumulate, 0);
}

fg_status fg_revin_stats(fg_context *ctx, const fg_revin_options *opt, const fg_tensor *x, const fg_tensor *mean,
                         const fg_tensor *stdev) {
    const fg_tensor *args[RS_N] = {x, mean, stdev};
    return fg_run_op(ctx, FG_OP_REVIN_STATS, opt, args, RS_N, 0, 0);
}

fg_status fg_revin_forward(fg_context *ctx, const fg_revin_options *opt, const fg_tensor *x, const fg_tensor *w,
                           const fg_tensor *b, const fg_tensor *mean, const fg_tensor *stdev, const fg_tensor *y) {
    const fg_tensor *args[RF_N] = {x, w, b, mean, stdev, y};
    return fg_run_op(ctx, FG_OP_REVIN_FORWARD, opt, args, RF_N, 0, 0);
}

fg_status fg_revin_backward(fg_context *ctx, const fg_revin_options *opt, const fg_tensor *dy, const fg_tensor *x,
                            const fg_tensor *w, const fg_tensor *b, const fg_tensor *mean, const fg_tensor *stdev,
                            const fg_tensor *dx, const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    const fg_tensor *args[RB_N] = {dy, x, w, b, mean, stdev, dx, dw, db};
    return fg_run_op(ctx, FG_OP_REVIN_BACKWARD, opt, args, RB_N, accumulate, 0);
}

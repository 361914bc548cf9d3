/*
 * test_encoder_stack.c — fg_encoder_forward / _backward (a stack of encoder layers) against the
 * same layers run one call each through fg_encoder_layer_forward / _backward, layer i with
 * (seed, offset + i) and PatchTST's residual attention carried there as [B, H, L, L] scores (the
 * per-layer path test_encoder checks against its float64 reference). Without residual scores the
 * stack must give the same bits; with them (the stack's attention on the layers' q, k as pieces)
 * the same values within the dtype's tolerance: y, dx, every parameter gradient and BatchNorm's
 * running statistics, in training (every dropout on) and in evaluation, packed and separate
 * q, k, v, every save policy. Also: bad input refused with nothing written, the index of a bad
 * layer's parameter in the message, and on CUDA residual scores beyond the short attention
 * refused before anything is written.
 */
#include "harness.h"

#include <math.h>

typedef struct scase {
    int64_t B, L, d, H, dff, layers;
    fg_encoder_norm norm;
    int res;              /* residual scores */
    double drop;
    fg_encoder_save save;
    bool sep;             /* separate w_q, w_k, w_v */
} scase;

enum { F_WQKV, F_BQKV, F_WQ, F_BQ, F_WK, F_BK, F_WV, F_BV, F_WO, F_BO, F_W1, F_B1, F_W2, F_B2,
       F_N1W, F_N1B, F_N2W, F_N2B, F_RM1, F_RV1, F_RM2, F_RV2, F_N };

static fg_tensor *slot(fg_encoder_layer_params *p, int i) {
    fg_tensor *s[F_N] = {&p->w_qkv, &p->b_qkv, &p->w_q, &p->b_q, &p->w_k, &p->b_k, &p->w_v, &p->b_v,
                         &p->w_o, &p->b_o, &p->w_1, &p->b_1, &p->w_2, &p->b_2, &p->norm1_w, &p->norm1_b,
                         &p->norm2_w, &p->norm2_b, &p->running_mean1, &p->running_var1, &p->running_mean2,
                         &p->running_var2};
    return s[i];
}

/* field i's shape for the case (0: absent) */
static int fshape(const scase *c, int i, int64_t sh[2]) {
    const int64_t d = c->d, f = c->dff;
    const bool bn = c->norm == FG_ENCODER_POST_BATCH;
    switch (i) {
    case F_WQKV: if (c->sep) return 0; sh[0] = 3 * d, sh[1] = d; return 2;
    case F_BQKV: if (c->sep) return 0; sh[0] = 3 * d; return 1;
    case F_WQ: case F_WK: case F_WV: if (!c->sep) return 0; sh[0] = d, sh[1] = d; return 2;
    case F_BQ: case F_BK: case F_BV: if (!c->sep) return 0; sh[0] = d; return 1;
    case F_WO: sh[0] = d, sh[1] = d; return 2;
    case F_W1: sh[0] = f, sh[1] = d; return 2;
    case F_B1: sh[0] = f; return 1;
    case F_W2: sh[0] = d, sh[1] = f; return 2;
    case F_RM1: case F_RV1: case F_RM2: case F_RV2: if (!bn) return 0; sh[0] = d; return 1;
    default: sh[0] = d; return 1;
    }
}

/* One set of every layer's operands on a backend. */
typedef struct side {
    th_operand p[8][F_N], gr[8][F_N];
    fg_encoder_layer_params params[8], grads[8];
} side;

static fg_dtype stat_dtype(fg_dtype dt) { return dt == FG_F64 ? FG_F64 : FG_F32; }

static void make_side(const scase *c, fg_backend be, fg_dtype dt, side *s, const double *const *vals) {
    memset(s, 0, sizeof *s);
    for (int64_t l = 0; l < c->layers; l++)
        for (int i = 0; i < F_N; i++) {
            int64_t sh[2];
            const int r = fshape(c, i, sh);
            if (!r) continue;
            const fg_dtype t = i >= F_RM1 ? stat_dtype(dt) : dt;
            s->p[l][i] = th_make(be, t, r, sh, 0);
            memcpy(s->p[l][i].v, vals[l * F_N + i], sizeof(double) * (size_t)s->p[l][i].n);
            th_put(&s->p[l][i].buf, &s->p[l][i].t, s->p[l][i].v);
            *slot(&s->params[l], i) = s->p[l][i].t;
            if (i >= F_RM1) continue;
            s->gr[l][i] = th_make(be, dt, r, sh, 0);
            th_poison(&s->gr[l][i].buf);
            *slot(&s->grads[l], i) = s->gr[l][i].t;
        }
}

static void drop_side(side *s) {
    for (int l = 0; l < 8; l++)
        for (int i = 0; i < F_N; i++) {
            if (s->p[l][i].v) th_drop(&s->p[l][i]);
            if (s->gr[l][i].v) th_drop(&s->gr[l][i]);
        }
}

static void desc_of(const scase *c, fg_encoder_layer_desc *e) {
    memset(e, 0, sizeof *e);
    e->d_model = c->d, e->heads = c->H, e->d_ff = c->dff, e->activation = FG_ACT_GELU, e->norm = c->norm;
    e->residual_scores = c->res, e->dropout = c->drop, e->dropout_ffn = c->drop, e->dropout_attn = c->drop;
    e->dropout_proj = c->drop / 2, e->save = c->save;
}

static double norm2(const double *v, int64_t n) {
    double s = 0;
    for (int64_t e = 0; e < n; e++) s += v[e] * v[e];
    return sqrt(s);
}

/* got against want: the same bits (exact), or within tol relative to the larger of ‖want‖ and
   floor (the norm of a gradient of the same scale: b_k's exact gradient is 0, a softmax does not
   see a constant added to a row's scores, so both runs give rounding noise there). */
static void compare_floor(const char *what, const char *label, const th_operand *o, const double *want, bool exact,
                          double tol, double floor) {
    double *got = malloc(sizeof(double) * (size_t)(o->n + 1));
    th_get(&o->buf, &o->t, got);
    if (exact) {
        int64_t diff = 0;
        for (int64_t e = 0; e < o->n; e++) diff += !(got[e] == want[e]);
        TH_CHECK(diff == 0, "%s %s: %lld of %lld elements differ from the layer-by-layer run", what, label,
                 (long long)diff, (long long)o->n);
    } else {
        double num = 0;
        for (int64_t e = 0; e < o->n; e++) num += (got[e] - want[e]) * (got[e] - want[e]);
        const double den = fmax(norm2(want, o->n), floor);
        const double err = den > 0 ? sqrt(num) / den : sqrt(num);
        th_margin(what, label, err, tol);
        TH_CHECK(err <= tol, "%s %s: relerr %.3g > tol %.3g against the layer-by-layer run", what, label, err, tol);
    }
    free(got);
}

static void compare(const char *what, const char *label, const th_operand *o, const double *want, bool exact,
                    double tol) {
    compare_floor(what, label, o, want, exact, tol, 0);
}

static void run_case(const scase *c, fg_backend be, fg_dtype dt, bool train) {
    char label[200];
    snprintf(label, sizeof label, "%s %s B=%lld L=%lld d=%lld H=%lld layers=%lld norm=%d res=%d save=%d%s%s",
             th_backend_name(be), fg_dtype_name(dt), (long long)c->B, (long long)c->L, (long long)c->d,
             (long long)c->H, (long long)c->layers, (int)c->norm, c->res, (int)c->save, c->sep ? " sep" : "",
             train ? " train" : " eval");
    fg_context *ctx = th_context(be, false);
    const int64_t n = c->layers, T = c->B * c->L, d = c->d;
    fg_encoder_layer_desc desc;
    desc_of(c, &desc);
    /* the values, shared by both sides */
    double *vals[8 * F_N];
    memset(vals, 0, sizeof vals);
    for (int64_t l = 0; l < n; l++)
        for (int i = 0; i < F_N; i++) {
            int64_t sh[2];
            const int r = fshape(c, i, sh);
            if (!r) continue;
            const int64_t cnt = r == 2 ? sh[0] * sh[1] : sh[0];
            double *v = calloc((size_t)cnt + 1, sizeof(double));
            th_fill(v, cnt);
            const double sc = r == 2 ? 1.0 / sqrt((double)sh[1]) : 0.2;
            for (int64_t e = 0; e < cnt; e++) v[e] *= sc;
            if (i == F_N1W || i == F_N2W) for (int64_t e = 0; e < cnt; e++) v[e] += 1.0;
            if (i == F_RV1 || i == F_RV2) for (int64_t e = 0; e < cnt; e++) v[e] = 1.0 + 0.5 * fabs(v[e]);
            th_round(i >= F_RM1 ? stat_dtype(dt) : dt, v, cnt);
            vals[l * F_N + i] = v;
        }
    side A, Bs; /* A: the stack; Bs: layer by layer */
    make_side(c, be, dt, &A, (const double *const *)vals);
    make_side(c, be, dt, &Bs, (const double *const *)vals);
    const int64_t xs[3] = {c->B, c->L, d};
    th_operand x = th_make(be, dt, 3, xs, 0), dy = th_make(be, dt, 3, xs, 0);
    th_randomize(&x), th_randomize(&dy);
    th_operand y = th_make(be, dt, 3, xs, 0), dx = th_make(be, dt, 3, xs, 0);
    th_poison(&y.buf), th_poison(&dx.buf);
    fg_encoder_layer_run run = {train ? 1 : 0, th_rand_u64(), th_rand_u64() >> 24};

    /* the stack */
    size_t cb = 0, wb = 0;
    TH_OK(fg_encoder_sizes(&desc, n, dt, c->B, c->L, &cb, &wb));
    th_buf cache = th_alloc(be, FG_F32, (int64_t)(cb / 4) + 4), ws = th_alloc(be, FG_F32, (int64_t)(wb / 4) + 4);
    fg_status st = fg_encoder_forward(ctx, &desc, n, &run, &x.t, NULL, A.params, &y.t, cache.ptr, cb, ws.ptr, wb);
    if (be == FG_BACKEND_CUDA && c->res && n > 1 && (c->L > 64 || c->d / c->H > 8)) {
        /* residual scores in pieces beyond the short attention: refused before anything is written */
        TH_CHECK(st == FG_ERR_UNSUPPORTED, "%s: status %d, expected FG_ERR_UNSUPPORTED", label, (int)st);
        double *yv = malloc(sizeof(double) * (size_t)y.n), *rm = malloc(sizeof(double) * (size_t)d);
        th_get(&y.buf, &y.t, yv);
        int64_t written = 0;
        for (int64_t e = 0; e < y.n; e++) written += !isnan(yv[e]);
        TH_CHECK(written == 0, "%s: %lld elements of y written by a refused call", label, (long long)written);
        if (c->norm == FG_ENCODER_POST_BATCH) {
            th_get(&A.p[0][F_RM1].buf, &A.p[0][F_RM1].t, rm);
            int64_t moved = 0;
            for (int64_t e = 0; e < d; e++) moved += rm[e] != vals[F_RM1][e];
            TH_CHECK(moved == 0, "%s: a refused call moved layer 0's running mean", label);
        }
        free(yv), free(rm);
        goto done;
    }
    TH_OK(st);

    /* layer by layer, with carried scores */
    {
        size_t lcb = 0, lwb = 0;
        TH_OK(fg_encoder_layer_sizes(&desc, dt, c->B, c->L, &lcb, &lwb));
        th_buf lc[8], lws = th_alloc(be, FG_F32, (int64_t)(lwb / 4) + 4);
        th_operand ys[8], sc[8], dsc[8], dxs[8];
        const int64_t ss[4] = {c->B, c->H, c->L, c->L};
        const fg_dtype sdt = stat_dtype(dt);
        for (int64_t l = 0; l < n; l++) {
            lc[l] = th_alloc(be, FG_F32, (int64_t)(lcb / 4) + 4);
            ys[l] = th_make(be, dt, 3, xs, 0), dxs[l] = th_make(be, dt, 3, xs, 0);
            if (c->res) sc[l] = th_make(be, sdt, 4, ss, 0), dsc[l] = th_make(be, sdt, 4, ss, 0);
        }
        for (int64_t l = 0; l < n; l++) {
            fg_encoder_layer_run rl = run;
            rl.offset = run.offset + (uint64_t)l;
            const fg_tensor *xl = l ? &ys[l - 1].t : &x.t;
            const fg_tensor *sin = c->res && l ? &sc[l - 1].t : NULL, *sout = c->res && l < n - 1 ? &sc[l].t : NULL;
            TH_OK(fg_encoder_layer_forward_ws(ctx, &desc, &rl, xl, NULL, sin, &Bs.params[l], &ys[l].t, sout, lc[l].ptr,
                                              lcb, lws.ptr, lwb));
        }
        th_get(&ys[n - 1].buf, &ys[n - 1].t, ys[n - 1].v);
        const double tol = 4 * th_tol(dt, false);
        const bool exact = !c->res;
        compare("y", label, &y, ys[n - 1].v, exact, tol);
        if (c->norm == FG_ENCODER_POST_BATCH && train)
            for (int64_t l = 0; l < n; l++)
                for (int i = F_RM1; i <= F_RV2; i++) {
                    th_get(&Bs.p[l][i].buf, &Bs.p[l][i].t, Bs.p[l][i].v);
                    compare("running statistics", label, &A.p[l][i], Bs.p[l][i].v, exact, tol);
                }
        if (train) {
            TH_OK(fg_encoder_backward(ctx, &desc, n, &run, &dy.t, &x.t, NULL, A.params, cache.ptr, cb, &dx.t, A.grads,
                                      0, ws.ptr, wb));
            for (int64_t l = n - 1; l >= 0; l--) {
                fg_encoder_layer_run rl = run;
                rl.offset = run.offset + (uint64_t)l;
                const fg_tensor *xl = l ? &ys[l - 1].t : &x.t, *dyl = l == n - 1 ? &dy.t : &dxs[l + 1].t;
                const fg_tensor *sin = c->res && l ? &sc[l - 1].t : NULL;
                const fg_tensor *dso = c->res && l < n - 1 ? &dsc[l].t : NULL, *dsi = c->res && l ? &dsc[l - 1].t : NULL;
                TH_OK(fg_encoder_layer_backward(ctx, &desc, &rl, dyl, dso, xl, NULL, sin, &Bs.params[l], lc[l].ptr, lcb,
                                                &dxs[l].t, dsi, &Bs.grads[l], 0, lws.ptr, lwb));
            }
            th_get(&dxs[0].buf, &dxs[0].t, dxs[0].v);
            compare("dx", label, &dx, dxs[0].v, exact, tol);
            for (int64_t l = 0; l < n; l++)
                for (int i = 0; i < F_RM1; i++) {
                    if (!Bs.gr[l][i].v) continue;
                    th_get(&Bs.gr[l][i].buf, &Bs.gr[l][i].t, Bs.gr[l][i].v);
                    char what[48];
                    snprintf(what, sizeof what, "grads[%lld] field %d", (long long)l, i);
                    const th_operand *q = &Bs.gr[l][i == F_BK ? F_BQ : F_BQKV];
                    const double fl = i == F_BK && q->v ? norm2(q->v, q->n) : 0;
                    compare_floor(what, label, &A.gr[l][i], Bs.gr[l][i].v, exact, tol, fl);
                }
            /* the same bits again */
            void *snap = th_snapshot(&A.gr[0][F_WO].buf);
            TH_OK(fg_encoder_backward(ctx, &desc, n, &run, &dy.t, &x.t, NULL, A.params, cache.ptr, cb, &dx.t, A.grads,
                                      0, ws.ptr, wb));
            TH_CHECK(th_unchanged(&A.gr[0][F_WO].buf, snap), "%s: a rerun of the backward gave other bits", label);
            free(snap);
        }
        for (int64_t l = 0; l < n; l++) {
            th_free(&lc[l]), th_drop(&ys[l]), th_drop(&dxs[l]);
            if (c->res) th_drop(&sc[l]), th_drop(&dsc[l]);
        }
        th_free(&lws);
    }
done:
    th_free(&cache), th_free(&ws);
    th_drop(&x), th_drop(&dy), th_drop(&y), th_drop(&dx);
    drop_side(&A), drop_side(&Bs);
    for (int i = 0; i < 8 * F_N; i++) free(vals[i]);
    fg_context_destroy(ctx);
}

/* layers 0, a bad parameter of layer 1 (named with its index), a small workspace: refused, y
   untouched. */
static void bad_cases(fg_backend be) {
    const scase c = {2, 5, 8, 2, 12, 2, FG_ENCODER_POST_BATCH, 1, 0.1, FG_ENCODER_SAVE_ALL, true};
    fg_context *ctx = th_context(be, false);
    fg_encoder_layer_desc desc;
    desc_of(&c, &desc);
    double *vals[8 * F_N];
    memset(vals, 0, sizeof vals);
    for (int64_t l = 0; l < c.layers; l++)
        for (int i = 0; i < F_N; i++) {
            int64_t sh[2];
            const int r = fshape(&c, i, sh);
            if (!r) continue;
            const int64_t cnt = r == 2 ? sh[0] * sh[1] : sh[0];
            vals[l * F_N + i] = calloc((size_t)cnt + 1, sizeof(double));
            for (int64_t e = 0; e < cnt; e++) vals[l * F_N + i][e] = i == F_RV1 || i == F_RV2 ? 1.0 : 0.01 * (double)e;
        }
    side A;
    make_side(&c, be, FG_F32, &A, (const double *const *)vals);
    const int64_t xs[3] = {c.B, c.L, c.d};
    th_operand x = th_make(be, FG_F32, 3, xs, 0), y = th_make(be, FG_F32, 3, xs, 0);
    th_randomize(&x);
    th_poison(&y.buf);
    fg_encoder_layer_run run = {1, 7, 9};
    size_t cb = 0, wb = 0;
    TH_OK(fg_encoder_sizes(&desc, c.layers, FG_F32, c.B, c.L, &cb, &wb));
    th_buf cache = th_alloc(be, FG_F32, (int64_t)(cb / 4) + 4), ws = th_alloc(be, FG_F32, (int64_t)(wb / 4) + 4);
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "layers", &y,
                  fg_encoder_forward(ctx, &desc, 0, &run, &x.t, NULL, A.params, &y.t, cache.ptr, cb, ws.ptr, wb));
    size_t z = 0;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "layers", &y, fg_encoder_sizes(&desc, 0, FG_F32, c.B, c.L, &z, &z));
    fg_tensor keep = A.params[1].w_1;
    A.params[1].w_1.shape[0] = c.dff + 1;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "params[1]->w_1", &y,
                  fg_encoder_forward(ctx, &desc, c.layers, &run, &x.t, NULL, A.params, &y.t, cache.ptr, cb, ws.ptr, wb));
    A.params[1].w_1 = keep;
    TH_EXPECT_BAD(FG_ERR_WORKSPACE, "cache", &y,
                  fg_encoder_forward(ctx, &desc, c.layers, &run, &x.t, NULL, A.params, &y.t, cache.ptr, cb - 16, ws.ptr,
                                     wb));
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", &y,
                  fg_encoder_forward(ctx, &desc, c.layers, &run, &x.t, NULL, A.params, &y.t, y.buf.ptr, cb, ws.ptr, wb));
    TH_OK(fg_encoder_forward(ctx, &desc, c.layers, &run, &x.t, NULL, A.params, &y.t, cache.ptr, cb, ws.ptr, wb));
    th_operand dx = th_make(be, FG_F32, 3, xs, 0);
    th_poison(&dx.buf);
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", &dx,
                  fg_encoder_backward(ctx, &desc, c.layers, &run, &y.t, &x.t, NULL, A.params, cache.ptr, cb, &dx.t,
                                      A.grads, 0, (char *)cache.ptr + 256, wb));
    TH_EXPECT_BAD(FG_ERR_WORKSPACE, "workspace", &dx,
                  fg_encoder_backward(ctx, &desc, c.layers, &run, &y.t, &x.t, NULL, A.params, cache.ptr, cb, &dx.t,
                                      A.grads, 0, ws.ptr, wb - 16));
    A.grads[0].w_2.shape[1] = c.dff - 1;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "grads[0]->w_2", &dx,
                  fg_encoder_backward(ctx, &desc, c.layers, &run, &y.t, &x.t, NULL, A.params, cache.ptr, cb, &dx.t,
                                      A.grads, 0, ws.ptr, wb));
    th_free(&cache), th_free(&ws);
    th_drop(&x), th_drop(&y), th_drop(&dx);
    drop_side(&A);
    for (int i = 0; i < 8 * F_N; i++) free(vals[i]);
    fg_context_destroy(ctx);
}

#define T true
#define F false
static const scase cases[] = {
    /* B  L   d   H  dff layers norm                   res drop save                  sep */
    {3, 42, 32, 4, 48, 3, FG_ENCODER_POST_BATCH, 1, 0.2, FG_ENCODER_SAVE_ALL, T},   /* PatchTST */
    {2, 42, 16, 4, 24, 3, FG_ENCODER_POST_BATCH, 1, 0.1, FG_ENCODER_SAVE_MIN, T},   /* hd 4, save min */
    {2, 9, 24, 3, 40, 2, FG_ENCODER_POST_LAYER, 1, 0.1, FG_ENCODER_SAVE_LESS, F},   /* packed, LayerNorm */
    {3, 17, 32, 4, 64, 3, FG_ENCODER_PRE_LAYER, 0, 0.1, FG_ENCODER_SAVE_ALL, F},    /* pre-norm: the same bits */
    {2, 7, 16, 2, 32, 2, FG_ENCODER_POST_BATCH, 0, 0.0, FG_ENCODER_SAVE_MIN, T},    /* no residual: the same bits */
    {2, 21, 64, 4, 32, 2, FG_ENCODER_POST_BATCH, 1, 0.1, FG_ENCODER_SAVE_ALL, T},   /* hd 16: CUDA refuses */
    {1, 5, 8, 2, 8, 1, FG_ENCODER_POST_BATCH, 1, 0.0, FG_ENCODER_SAVE_ALL, T},      /* one layer */
};
#undef T
#undef F

int main(void) {
    th_init("encoder_stack");
    fg_backend bes[2];
    const int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (int di = 0; di < 4; di++) {
                const fg_dtype dt = th_dtypes[di];
                if (dt == FG_F16 || (bes[bi] == FG_BACKEND_CUDA && dt == FG_F64)) continue;
                run_case(&cases[k], bes[bi], dt, true);
                if (k < 3) run_case(&cases[k], bes[bi], dt, false);
            }
        bad_cases(bes[bi]);
    }
    return th_finish("encoder_stack");
}

/*
 * test_linear_logp_shard.c — vocabulary-parallel log-prob (the split API): R = 1, 2, 3 ranks
 * simulated in one process on every backend present and every dtype (f32, f16, bf16; f64 on
 * the CPU). Each rank runs fg_linear_logp_shard_forward over its slice of w / b (unequal
 * slices, a slice of one class, a slice that holds no target, tiles forced small so the
 * target offset meets tiles that start past the slice's first class); the test gathers the
 * parts (the tlogits summed, and gathered as [R, N]) as an all-gather / all-reduce would;
 * fg_linear_logp_shard_combine gives logp / lse / entropy, checked against a float64 loop
 * over the whole vocabulary; each rank's fg_linear_logp_backward with the global lse /
 * entropy gives its dh partial (summed here, as the caller's all-reduce would) and its slice
 * of dw / db, checked against the reference's dh and the reference's dw / db rows of that
 * slice. Options: temperature, softcap, ignore_index, i32 / i64 targets. Also: finite
 * differences of the f64 pipeline (the backward is the forward + combine's gradient), targets
 * of another slice raise nothing, a target outside [0, vocab_total) is the device-value
 * error, and bad input writes nothing.
 */
#include "harness.h"

#include <math.h>
#include <string.h>

#define MAX_R 4

typedef struct problem {
    int64_t N, D, V;
    bool bias;
    fg_logp_options opt;
    fg_dtype tdtype;
    int R;
    int64_t bounds[MAX_R + 1]; /* slice r holds [bounds[r], bounds[r + 1]) */
    int64_t target_hi;         /* targets drawn from [0, target_hi) */
    int ignore_every;          /* every k-th row gets ignore_index (0: none) */
} problem;

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

/* ------------------------------------------------------------------ float64 reference */

typedef struct reference {
    double *logp, *lse, *ent, *dh, *dw, *db;
    /* per dw element, Σ_n |h|·(one unit of dz's rounding): dz is rounded to dt before the
       product (the header says so), and a kernel forming dz in f32 may round a term near a tie
       the other way than this f64 loop; one such term (|dz| near 1 at the target, times |h|)
       moves a small dw element by more than the relative bound allows; and likewise the logits,
       rounded to dt before the softmax: one unit of z_j moves dz_j by up to
       |∂dz_j/∂z_j|·unit, twice that for the lse it shifts (dw and db) */
    double *dw_slack, *db_slack;
    double *L; /* [N, V] the logits as the softmax takes them (rounded, capped, over T); 0 for ignored rows */
} reference;

static bool ignored(const problem *p, int64_t t) { return p->opt.use_ignore_index && t == p->opt.ignore_index; }

/* log Σ e^L and the entropy of softmax(L) over n logits, in f64 */
static void lse_entropy(const double *L, int64_t n, double *lse, double *H) {
    double m = -INFINITY, s = 0, el = 0;
    for (int64_t j = 0; j < n; j++) m = L[j] > m ? L[j] : m;
    for (int64_t j = 0; j < n; j++) s += exp(L[j] - m);
    *lse = m + log(s);
    for (int64_t j = 0; j < n; j++) el += exp(L[j] - *lse) * L[j];
    *H = *lse - el;
}

/* Over the whole vocabulary. The logits h·wᵀ + b are rounded to dt (the family's contract, as
   F.linear's output is), and so is dz before the products take it (db sums it unrounded): the
   header says both. */
static reference compute_ref(const problem *p, fg_dtype dt, const double *h, const double *w, const double *b,
                             const int64_t *t, const double *dlogp, const double *dent, const double *dlse) {
    const int64_t N = p->N, D = p->D, V = p->V;
    const double T = p->opt.temperature > 0 ? p->opt.temperature : 1.0, cap = p->opt.softcap;
    reference r;
    r.logp = calloc((size_t)N + 1, sizeof(double));
    r.lse = calloc((size_t)N + 1, sizeof(double));
    r.ent = calloc((size_t)N + 1, sizeof(double));
    r.dh = calloc((size_t)(N * D) + 1, sizeof(double));
    r.dw = calloc((size_t)(V * D) + 1, sizeof(double));
    r.dw_slack = calloc((size_t)(V * D) + 1, sizeof(double));
    r.db = calloc((size_t)V + 1, sizeof(double));
    r.db_slack = calloc((size_t)V + 1, sizeof(double));
    r.L = calloc((size_t)(N * V) + 1, sizeof(double));
    double *L = malloc(sizeof(double) * (size_t)V), *S = malloc(sizeof(double) * (size_t)V);
    double *U = malloc(sizeof(double) * (size_t)V); /* dt's spacing at each rounded logit */
    for (int64_t n = 0; n < N; n++) {
        if (ignored(p, t[n])) continue;
        for (int64_t j = 0; j < V; j++) {
            double z = b ? b[j] : 0;
            for (int64_t k = 0; k < D; k++) z += h[n * D + k] * w[j * D + k];
            th_round(dt, &z, 1);
            U[j] = th_unit(dt, z);
            if (cap > 0) {
                const double th = tanh(z / cap);
                L[j] = cap * th / T, S[j] = (1 - th * th) / T;
            } else {
                L[j] = z / T, S[j] = 1 / T;
            }
        }
        memcpy(r.L + n * V, L, sizeof(double) * (size_t)V);
        double lse, H;
        lse_entropy(L, V, &lse, &H);
        r.lse[n] = lse, r.logp[n] = L[t[n]] - lse, r.ent[n] = H;
        for (int64_t j = 0; j < V; j++) {
            const double pj = exp(L[j] - lse);
            const double g = dlogp[n] * ((j == t[n]) - pj) - dent[n] * pj * (L[j] - lse + H) + dlse[n] * pj;
            double dz = g * S[j];
            r.db[j] += dz;
            th_round(dt, &dz, 1);
            const double ulp = th_unit(dt, dz); /* dt's spacing at dz */
            const double dg = pj * (fabs(dlogp[n]) + fabs(dlse[n]) + fabs(dent[n]) * (1 + fabs(L[j] - lse + H)));
            const double zflip = 2 * dg * S[j] * S[j] * U[j];
            r.db_slack[j] += zflip;
            for (int64_t k = 0; k < D; k++) {
                r.dh[n * D + k] += dz * w[j * D + k];
                r.dw[j * D + k] += dz * h[n * D + k];
                r.dw_slack[j * D + k] += (ulp + zflip) * fabs(h[n * D + k]);
            }
        }
    }
    free(L), free(S), free(U);
    return r;
}

static void free_ref(reference *r) {
    free(r->logp), free(r->lse), free(r->ent), free(r->dh), free(r->dw), free(r->dw_slack), free(r->db), free(r->db_slack), free(r->L);
}

/* ------------------------------------------------------------------ operands */

static th_operand vec_of(fg_backend be, fg_dtype dt, int rank, int64_t a, int64_t b) {
    int64_t s[2] = {a, b};
    return th_make(be, dt, rank, s, 0);
}

/* Uploads host values into an operand (rounded to its dtype). */
static void put(th_operand *o, const double *v) {
    memcpy(o->v, v, sizeof(double) * (size_t)o->n);
    th_round(o->t.dtype, o->v, o->n);
    th_put(&o->buf, &o->t, o->v);
}

static th_buf put_targets(fg_backend be, const problem *p, const int64_t *t, fg_tensor *out) {
    th_buf buf = th_alloc(be, p->tdtype, p->N);
    const size_t es = fg_dtype_size(p->tdtype);
    char *raw = malloc(es * (size_t)(p->N + 1));
    for (int64_t n = 0; n < p->N; n++) {
        if (p->tdtype == FG_I32) ((int32_t *)raw)[n] = (int32_t)t[n];
        else ((int64_t *)raw)[n] = t[n];
    }
    th_put_raw(&buf, raw, es * (size_t)p->N);
    free(raw);
    int64_t ts[1] = {p->N};
    *out = th_tensor(&buf, 0, 1, ts, NULL);
    return buf;
}

/* ------------------------------------------------------------------ the sharded pipeline */

static void run_case(fg_context *ctx, fg_backend be, fg_dtype dt, const problem *p, const char *label) {
    const int64_t N = p->N, D = p->D, V = p->V;
    const int R = p->R;
    const fg_dtype acc = acc_of(dt);
    const double tol = th_tol(dt, false);
    char lab[256];
    snprintf(lab, sizeof lab, "%s %s %s N=%lld D=%lld V=%lld R=%d", label, th_backend_name(be), fg_dtype_name(dt),
             (long long)N, (long long)D, (long long)V, R);

    /* the whole problem on the host */
    th_operand h = vec_of(be, dt, 2, N, D);
    th_randomize(&h);
    for (int64_t i = 0; i < h.n; i++) h.v[i] *= 3.0 / sqrt((double)D); /* logits of a few units */
    put(&h, h.v);
    double *w = malloc(sizeof(double) * (size_t)(V * D)), *b = malloc(sizeof(double) * (size_t)V);
    th_fill(w, V * D), th_fill(b, V);
    th_round(dt, w, V * D), th_round(dt, b, V);
    int64_t *t = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t n = 0; n < N; n++) {
        t[n] = (int64_t)(th_rand_u64() % (uint64_t)p->target_hi);
        if (p->ignore_every && n % p->ignore_every == 1) t[n] = p->opt.ignore_index;
    }
    fg_tensor target;
    th_buf tbuf = put_targets(be, p, t, &target);
    double *dl = malloc(sizeof(double) * (size_t)N), *de = malloc(sizeof(double) * (size_t)N),
           *ds = malloc(sizeof(double) * (size_t)N);
    th_fill(dl, N), th_fill(de, N), th_fill(ds, N);
    th_round(acc, dl, N), th_round(acc, de, N), th_round(acc, ds, N);
    reference ref = compute_ref(p, dt, h.v, w, p->bias ? b : NULL, t, dl, de, ds);

    /* 1. each rank's parts */
    double *lse_parts = malloc(sizeof(double) * (size_t)(R * N)), *ent_parts = malloc(sizeof(double) * (size_t)(R * N)),
           *tl_parts = malloc(sizeof(double) * (size_t)(R * N)), *tl_sum = calloc((size_t)N + 1, sizeof(double));
    th_operand wr[MAX_R], br[MAX_R];
    for (int r = 0; r < R; r++) {
        const int64_t v0 = p->bounds[r], vr = p->bounds[r + 1] - v0;
        fg_logp_options o = p->opt;
        o.vocab_start = v0, o.vocab_total = V;
        wr[r] = vec_of(be, dt, 2, vr, D);
        put(&wr[r], w + v0 * D);
        memset(&br[r], 0, sizeof br[r]);
        if (p->bias) {
            br[r] = vec_of(be, dt, 1, vr, 0);
            put(&br[r], b + v0);
        }
        th_operand lp = vec_of(be, acc, 1, N, 0), tl = vec_of(be, acc, 1, N, 0), ep = vec_of(be, acc, 1, N, 0);
        th_poison(&lp.buf), th_poison(&tl.buf), th_poison(&ep.buf);
        TH_OK(fg_linear_logp_shard_forward(ctx, &o, &h.t, &wr[r].t, p->bias ? &br[r].t : NULL, &target, &lp.t, &tl.t,
                                           &ep.t));
        TH_OK(fg_context_check(ctx)); /* targets of other slices are not errors */
        th_get(&lp.buf, &lp.t, lse_parts + r * N);
        th_get(&tl.buf, &tl.t, tl_parts + r * N);
        th_get(&ep.buf, &ep.t, ent_parts + r * N);
        /* each part against the slice's own softmax in f64 (ignored rows: 0) */
        double *rl = calloc((size_t)N + 1, sizeof(double)), *rt = calloc((size_t)N + 1, sizeof(double)),
               *re = calloc((size_t)N + 1, sizeof(double));
        for (int64_t n = 0; n < N; n++) {
            if (ignored(p, t[n])) continue;
            const double *Ln = ref.L + n * V + v0;
            lse_entropy(Ln, vr, &rl[n], &re[n]);
            rt[n] = t[n] >= v0 && t[n] < v0 + vr ? Ln[t[n] - v0] : 0;
        }
        TH_CHECK(th_relerr(lse_parts + r * N, rl, N) <= tol, "%s rank %d: lse_part relerr %.3g > %.3g", lab, r,
                 th_relerr(lse_parts + r * N, rl, N), tol);
        TH_CHECK(th_relerr(tl_parts + r * N, rt, N) <= tol, "%s rank %d: tlogit_part relerr %.3g > %.3g", lab, r,
                 th_relerr(tl_parts + r * N, rt, N), tol);
        TH_CHECK(th_relerr(ent_parts + r * N, re, N) <= tol, "%s rank %d: entropy_part relerr %.3g > %.3g", lab, r,
                 th_relerr(ent_parts + r * N, re, N), tol);
        free(rl), free(rt), free(re);
        for (int64_t n = 0; n < N; n++) {
            const bool here = !ignored(p, t[n]) && t[n] >= v0 && t[n] < v0 + vr;
            TH_CHECK(isfinite(lse_parts[r * N + n]) && isfinite(ent_parts[r * N + n]), "%s rank %d row %lld: parts %g %g",
                     lab, r, (long long)n, lse_parts[r * N + n], ent_parts[r * N + n]);
            /* a slice without the target adds exactly 0 to the all-reduced target logit */
            TH_CHECK(here ? isfinite(tl_parts[r * N + n]) : tl_parts[r * N + n] == 0.0, "%s rank %d row %lld: tlogit %g",
                     lab, r, (long long)n, tl_parts[r * N + n]);
            tl_sum[n] += tl_parts[r * N + n];
        }
        th_drop(&lp), th_drop(&tl), th_drop(&ep);
    }

    /* 2.–3. the gathered parts (tlogits summed, and gathered) → combine */
    th_operand LP = vec_of(be, acc, 2, R, N), EP = vec_of(be, acc, 2, R, N), TP = vec_of(be, acc, 2, R, N),
               TS = vec_of(be, acc, 1, N, 0);
    put(&LP, lse_parts), put(&EP, ent_parts), put(&TP, tl_parts), put(&TS, tl_sum);
    th_operand logp = vec_of(be, acc, 1, N, 0), lse = vec_of(be, acc, 1, N, 0), ent = vec_of(be, acc, 1, N, 0);
    for (int gathered = 0; gathered < 2; gathered++) {
        th_poison(&logp.buf), th_poison(&lse.buf), th_poison(&ent.buf);
        TH_OK(fg_linear_logp_shard_combine(ctx, &p->opt, &target, &LP.t, gathered ? &TP.t : &TS.t, &EP.t, &logp.t,
                                           &lse.t, &ent.t));
        char l2[300];
        snprintf(l2, sizeof l2, "%s tlogit %s", lab, gathered ? "gathered" : "summed");
        th_verify("logp", &logp, ref.logp, tol, l2);
        th_verify("lse", &lse, ref.lse, tol, l2);
        th_verify("entropy", &ent, ref.ent, tol, l2);
    }
    /* without the entropy */
    {
        th_operand lse2 = vec_of(be, acc, 1, N, 0);
        th_poison(&lse2.buf);
        th_poison(&logp.buf);
        TH_OK(fg_linear_logp_shard_combine(ctx, &p->opt, &target, &LP.t, &TS.t, NULL, &logp.t, &lse2.t, NULL));
        th_verify("lse (no entropy)", &lse2, ref.lse, tol, lab);
        th_verify("logp (no entropy)", &logp, ref.logp, tol, lab);
        th_drop(&lse2);
    }

    /* 4. each rank's backward from the global lse / entropy: Σ_r dh_r and the slices of dw, db */
    th_operand DL = vec_of(be, acc, 1, N, 0), DE = vec_of(be, acc, 1, N, 0), DS = vec_of(be, acc, 1, N, 0);
    put(&DL, dl), put(&DE, de), put(&DS, ds);
    double *dh_sum = calloc((size_t)(N * D) + 1, sizeof(double)), *dh_r = malloc(sizeof(double) * (size_t)(N * D + 1));
    for (int r = 0; r < R; r++) {
        const int64_t v0 = p->bounds[r], vr = p->bounds[r + 1] - v0;
        fg_logp_options o = p->opt;
        o.vocab_start = v0, o.vocab_total = V;
        th_operand dh = vec_of(be, acc, 2, N, D), dw = vec_of(be, dt, 2, vr, D);
        th_operand db = p->bias ? vec_of(be, dt, 1, vr, 0) : (th_operand){0};
        th_poison(&dh.buf), th_poison(&dw.buf);
        if (p->bias) th_poison(&db.buf);
        TH_OK(fg_linear_logp_backward(ctx, &o, &DL.t, &DE.t, &DS.t, &h.t, &wr[r].t, p->bias ? &br[r].t : NULL, &target,
                                      &lse.t, &ent.t, &dh.t, &dw.t, p->bias ? &db.t : NULL, 0));
        TH_OK(fg_context_check(ctx));
        char l2[300];
        snprintf(l2, sizeof l2, "%s rank %d [%lld, %lld)", lab, r, (long long)v0, (long long)(v0 + vr));
        th_verify_slack("dw slice", &dw, ref.dw + v0 * D, ref.dw_slack + v0 * D, tol, l2);
        if (p->bias) th_verify_slack("db slice", &db, ref.db + v0, ref.db_slack + v0, tol, l2);
        th_get(&dh.buf, &dh.t, dh_r);
        for (int64_t i = 0; i < N * D; i++) dh_sum[i] += dh_r[i];
        th_drop(&dh), th_drop(&dw);
        if (p->bias) th_drop(&db);
    }
    double err = th_relerr(dh_sum, ref.dh, N * D);
    TH_CHECK(err <= tol, "%s: Σ_r dh_r relerr %.3g > %.3g", lab, err, tol);
    /* every element, not only the norm: the largest error against the largest reference */
    double emax = 0, rmax = 0;
    for (int64_t i = 0; i < N * D; i++) {
        emax = fmax(emax, fabs(dh_sum[i] - ref.dh[i]));
        rmax = fmax(rmax, fabs(ref.dh[i]));
        if (isnan(dh_sum[i])) emax = INFINITY;
    }
    TH_CHECK(emax <= 4 * tol * (rmax > 0 ? rmax : 1), "%s: Σ_r dh_r max error %.3g (max |ref| %.3g)", lab, emax, rmax);

    for (int r = 0; r < R; r++) {
        th_drop(&wr[r]);
        if (p->bias) th_drop(&br[r]);
    }
    free(dh_sum), free(dh_r);
    th_drop(&DL), th_drop(&DE), th_drop(&DS), th_drop(&LP), th_drop(&EP), th_drop(&TP), th_drop(&TS);
    th_drop(&logp), th_drop(&lse), th_drop(&ent), th_drop(&h);
    free(lse_parts), free(ent_parts), free(tl_parts), free(tl_sum), free(w), free(b), free(t), free(dl), free(de),
        free(ds);
    th_free(&tbuf);
    free_ref(&ref);
}

/* ------------------------------------------------------------------ finite differences */

/* Rank r's shard options and its f64 views of w's and b's rows (host arrays) */
typedef struct fd_slice {
    fg_logp_options o;
    int64_t wsh[2], bsh[1];
    fg_tensor w, b;
} fd_slice;

static fd_slice fd_slice_of(const problem *p, int r, const double *w, const double *b) {
    fd_slice sl;
    const int64_t v0 = p->bounds[r], vr = p->bounds[r + 1] - v0;
    sl.o = p->opt;
    sl.o.vocab_start = v0, sl.o.vocab_total = p->V;
    sl.wsh[0] = vr, sl.wsh[1] = p->D, sl.bsh[0] = vr;
    sl.w = fg_tensor_make((void *)(w + v0 * p->D), FG_F64, 2, sl.wsh);
    sl.b = fg_tensor_make((void *)(b + v0), FG_F64, 1, sl.bsh);
    return sl;
}

/* Σ_n dl·logp + de·entropy + ds·lse of the sharded pipeline (CPU, f64, host arrays); with
   grads, also the gradients of h, w, b (Σ_r dh_r, the slices' dw, db concatenated). */
static double fd_objective(fg_context *ctx, const problem *p, const double *h, const double *w, const double *b,
                           const int64_t *t, const double *dl, const double *de, const double *ds, double *gh,
                           double *gw, double *gb) {
    const int64_t N = p->N, D = p->D, V = p->V;
    const int R = p->R;
    int64_t hs[2] = {N, D}, ns[1] = {N}, ps[2] = {R, N};
    double *lp = malloc(sizeof(double) * (size_t)(R * N)), *ep = malloc(sizeof(double) * (size_t)(R * N));
    double *tl = malloc(sizeof(double) * (size_t)(R * N)), *ts = calloc((size_t)N, sizeof(double));
    double logp[64], lse[64], ent[64];
    fg_tensor th = fg_tensor_make((void *)h, FG_F64, 2, hs), tt = fg_tensor_make((void *)t, FG_I64, 1, ns);
    for (int r = 0; r < R; r++) {
        fd_slice sl = fd_slice_of(p, r, w, b);
        fg_tensor a = fg_tensor_make(lp + r * N, FG_F64, 1, ns), c = fg_tensor_make(tl + r * N, FG_F64, 1, ns),
                  e = fg_tensor_make(ep + r * N, FG_F64, 1, ns);
        TH_OK(fg_linear_logp_shard_forward(ctx, &sl.o, &th, &sl.w, &sl.b, &tt, &a, &c, &e));
        for (int64_t n = 0; n < N; n++) ts[n] += tl[r * N + n];
    }
    fg_tensor LP = fg_tensor_make(lp, FG_F64, 2, ps), EP = fg_tensor_make(ep, FG_F64, 2, ps), TS = fg_tensor_make(ts, FG_F64, 1, ns);
    fg_tensor a = fg_tensor_make(logp, FG_F64, 1, ns), c = fg_tensor_make(lse, FG_F64, 1, ns), e = fg_tensor_make(ent, FG_F64, 1, ns);
    TH_OK(fg_linear_logp_shard_combine(ctx, &p->opt, &tt, &LP, &TS, &EP, &a, &c, &e));
    double obj = 0;
    for (int64_t n = 0; n < N; n++) obj += dl[n] * logp[n] + de[n] * ent[n] + ds[n] * lse[n];
    if (gh) {
        double *dh = malloc(sizeof(double) * (size_t)(N * D));
        for (int64_t i = 0; i < N * D; i++) gh[i] = 0;
        fg_tensor tdl = fg_tensor_make((void *)dl, FG_F64, 1, ns), tde = fg_tensor_make((void *)de, FG_F64, 1, ns),
                  tds = fg_tensor_make((void *)ds, FG_F64, 1, ns), tdh = fg_tensor_make(dh, FG_F64, 2, hs);
        for (int r = 0; r < R; r++) {
            fd_slice sl = fd_slice_of(p, r, w, b);
            const int64_t v0 = p->bounds[r];
            fg_tensor tdw = fg_tensor_make(gw + v0 * D, FG_F64, 2, sl.wsh), tdb = fg_tensor_make(gb + v0, FG_F64, 1, sl.bsh);
            TH_OK(fg_linear_logp_backward(ctx, &sl.o, &tdl, &tde, &tds, &th, &sl.w, &sl.b, &tt, &c, &e, &tdh, &tdw, &tdb,
                                          0));
            for (int64_t i = 0; i < N * D; i++) gh[i] += dh[i];
        }
        free(dh);
    }
    free(lp), free(ep), free(tl), free(ts);
    return obj;
}

/* The sharded backward is the gradient of the sharded forward + combine: central differences in
 * f64 at every coordinate of h, w and b (R = 3, softcap and temperature, an ignored row). */
static void finite_differences(fg_context *ctx) {
    problem p = {5, 4, 11, true, {0}, FG_I64, 3, {0, 3, 4, 11}, 11, 0};
    p.opt.temperature = 0.8, p.opt.softcap = 3.0, p.opt.use_ignore_index = 1, p.opt.ignore_index = -1;
    const int64_t N = p.N, D = p.D, V = p.V;
    double h[20], w[44], b[11], dl[5], de[5], ds[5], gh[20], gw[44], gb[11];
    int64_t t[5] = {0, 3, -1, 10, 5};
    th_fill(h, N * D), th_fill(w, V * D), th_fill(b, V), th_fill(dl, N), th_fill(de, N), th_fill(ds, N);
    fd_objective(ctx, &p, h, w, b, t, dl, de, ds, gh, gw, gb);
    double *vars[3] = {h, w, b}, *grads[3] = {gh, gw, gb};
    const int64_t counts[3] = {N * D, V * D, V};
    const char *names[3] = {"h", "w", "b"};
    const double step = 1e-5;
    for (int k = 0; k < 3; k++) {
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < counts[k]; i++) {
            const double x = vars[k][i];
            vars[k][i] = x + step;
            const double up = fd_objective(ctx, &p, h, w, b, t, dl, de, ds, NULL, NULL, NULL);
            vars[k][i] = x - step;
            const double dn = fd_objective(ctx, &p, h, w, b, t, dl, de, ds, NULL, NULL, NULL);
            vars[k][i] = x;
            const double fd = (up - dn) / (2 * step);
            worst = fmax(worst, fabs(fd - grads[k][i]));
            scale = fmax(scale, fabs(grads[k][i]));
            if (isnan(grads[k][i])) worst = INFINITY;
        }
        /* truncation ~h²·f‴/6 and cancellation ~1e-16/h: 1e-8 of the largest gradient */
        TH_CHECK(worst <= 1e-8 * fmax(scale, 1.0), "finite differences d%s: max error %.3g (max |grad| %.3g)", names[k],
                 worst, scale);
    }
}

/* ------------------------------------------------------------------ device values and bad input */

/* A target outside [0, vocab_total): NaN in its row's parts, FG_ERR_DEVICE_VALUE naming the row;
 * a target of the other slice in the same call is normal. */
static void bad_targets(fg_context *ctx, fg_backend be) {
    problem p = {12, 8, 30, false, {0}, FG_I32, 2, {0, 10, 30}, 30, 0};
    int64_t t[12];
    for (int n = 0; n < 12; n++) t[n] = (n * 7) % 30; /* both slices' classes */
    t[5] = 30, t[9] = -1;
    fg_tensor target;
    th_buf tbuf = put_targets(be, &p, t, &target);
    th_operand h = vec_of(be, FG_F32, 2, 12, 8), w = vec_of(be, FG_F32, 2, 10, 8);
    th_randomize(&h), th_randomize(&w);
    th_operand lp = vec_of(be, FG_F32, 1, 12, 0), tl = vec_of(be, FG_F32, 1, 12, 0);
    fg_logp_options o = {0};
    o.vocab_start = 0, o.vocab_total = 30;
    TH_OK(fg_context_check(ctx));
    TH_OK(fg_linear_logp_shard_forward(ctx, &o, &h.t, &w.t, NULL, &target, &lp.t, &tl.t, NULL));
    fg_status s = fg_context_check(ctx);
    TH_CHECK(s == FG_ERR_DEVICE_VALUE, "shard bad target %s: context_check gave %s", th_backend_name(be),
             fg_status_string(s));
    TH_CHECK(strstr(fg_last_error(), "row 5") != NULL, "shard bad target: message '%s' does not name row 5",
             fg_last_error());
    TH_OK(fg_context_check(ctx));
    double got[12];
    th_get(&lp.buf, &lp.t, got);
    for (int n = 0; n < 12; n++)
        TH_CHECK(n == 5 || n == 9 ? isnan(got[n]) : isfinite(got[n]), "shard bad target %s row %d: lse_part %g",
                 th_backend_name(be), n, got[n]);
    th_drop(&h), th_drop(&w), th_drop(&lp), th_drop(&tl);
    th_free(&tbuf);
}

static void bad_input(fg_context *ctx, fg_backend be) {
    problem p = {6, 4, 10, true, {0}, FG_I64, 2, {0, 4, 10}, 10, 0};
    int64_t t[6] = {0, 1, 2, 3, 4, 5};
    fg_tensor target;
    th_buf tbuf = put_targets(be, &p, t, &target);
    th_operand h = vec_of(be, FG_F32, 2, 6, 4), w = vec_of(be, FG_F32, 2, 4, 4), b = vec_of(be, FG_F32, 1, 4, 0);
    th_randomize(&h), th_randomize(&w), th_randomize(&b);
    th_operand lp = vec_of(be, FG_F32, 1, 6, 0), tl = vec_of(be, FG_F32, 1, 6, 0), ep = vec_of(be, FG_F32, 1, 6, 0),
               five = vec_of(be, FG_F32, 1, 5, 0), loss = vec_of(be, FG_F32, 1, 1, 0), dh = vec_of(be, FG_F32, 2, 6, 4);
    th_operand parts = vec_of(be, FG_F32, 2, 2, 6), parts3 = vec_of(be, FG_F32, 2, 3, 6), wide = vec_of(be, FG_F32, 2, 2, 7),
               parts64 = vec_of(be, FG_F64, 2, 2, 6), none = vec_of(be, FG_F32, 2, 0, 6);
    fg_logp_options o = {0};
    o.vocab_start = 4, o.vocab_total = 10;
    const fg_tensor *H = &h.t, *W = &w.t, *B = &b.t, *T = &target;
    /* shard forward */
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "h", &lp, fg_linear_logp_shard_forward(ctx, &o, NULL, W, B, T, &lp.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "lse_part", &tl, fg_linear_logp_shard_forward(ctx, &o, H, W, B, T, &five.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "tlogit_part", &lp, fg_linear_logp_shard_forward(ctx, &o, H, W, B, T, &lp.t, &five.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "entropy_part", &lp,
                  fg_linear_logp_shard_forward(ctx, &o, H, W, B, T, &lp.t, &tl.t, &five.t));
    o.vocab_start = 7; /* 4 rows from 7 pass 10 */
    TH_EXPECT_BAD(FG_ERR_SHAPE, "vocab_total", &lp, fg_linear_logp_shard_forward(ctx, &o, H, W, B, T, &lp.t, &tl.t, NULL));
    o.vocab_start = -1;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "vocab_start", &lp,
                  fg_linear_logp_shard_forward(ctx, &o, H, W, B, T, &lp.t, &tl.t, NULL));
    o.vocab_start = 2, o.vocab_total = 0;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "vocab_start", &lp,
                  fg_linear_logp_shard_forward(ctx, &o, H, W, B, T, &lp.t, &tl.t, NULL));
    o.vocab_start = 4, o.vocab_total = 10, o.label_smoothing = 0.1;
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "label_smoothing", &lp,
                  fg_linear_logp_shard_forward(ctx, &o, H, W, B, T, &lp.t, &tl.t, NULL));
    o.label_smoothing = 0;
    /* the unsharded forward and the one pass refuse a real shard */
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "linear_logp_shard_forward", &lp,
                  fg_linear_logp_forward(ctx, &o, H, W, B, T, &lp.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "vocab_total", &loss,
                  fg_linear_cross_entropy(ctx, &o, H, W, B, T, NULL, &loss.t, NULL, NULL, NULL, NULL, 0));
    /* the backward checks the shard */
    o.vocab_start = 8;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "vocab_start", &dh,
                  fg_linear_logp_backward(ctx, &o, &lp.t, NULL, NULL, H, W, B, T, &tl.t, NULL, &dh.t, NULL, NULL, 0));
    o.vocab_start = 4;
    /* combine */
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "lse_parts", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, NULL, &tl.t, NULL, &lp.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "lse_parts", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, &wide.t, &tl.t, NULL, &lp.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "R=0", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, &none.t, &tl.t, NULL, &lp.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "tlogit_parts", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, &parts.t, &parts3.t, NULL, &lp.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "tlogit_parts", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, &parts.t, &five.t, NULL, &lp.t, &tl.t, NULL));
    TH_EXPECT_BAD(FG_ERR_DTYPE, "entropy_parts", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, &parts.t, &tl.t, &parts64.t, &lp.t, &tl.t, &ep.t));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "entropy_parts", &ep,
                  fg_linear_logp_shard_combine(ctx, &o, T, &parts.t, &tl.t, NULL, &lp.t, &tl.t, &ep.t));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "logp", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, &parts.t, &tl.t, NULL, &five.t, &lp.t, NULL));
    TH_EXPECT_BAD(FG_ERR_DTYPE, "target", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, &tl.t, &parts.t, &tl.t, NULL, &lp.t, &ep.t, NULL));
    o.temperature = -1;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "temperature", &lp,
                  fg_linear_logp_shard_combine(ctx, &o, T, &parts.t, &tl.t, NULL, &lp.t, &ep.t, NULL));
    th_drop(&h), th_drop(&w), th_drop(&b), th_drop(&lp), th_drop(&tl), th_drop(&ep), th_drop(&five), th_drop(&loss);
    th_drop(&dh), th_drop(&parts), th_drop(&parts3), th_drop(&wide), th_drop(&parts64), th_drop(&none);
    th_free(&tbuf);
}

int main(void) {
    th_init("linear_logp_shard");
    fg_backend bes[2];
    int nb = th_backends(bes);
    {
        fg_context *cpu = th_context(FG_BACKEND_CPU, false);
        finite_differences(cpu);
        fg_context_destroy(cpu);
    }
    for (int bi = 0; bi < nb; bi++) {
        fg_backend be = bes[bi];
        fg_context *ctx = th_context(be, false);
        for (int di = 0; di < 4; di++) {
            fg_dtype dt = th_dtypes[di];
            if (dt == FG_F64 && be != FG_BACKEND_CPU) continue;
            problem one = {17, 33, 127, true, {0}, FG_I64, 1, {0, 127}, 127, 0};
            run_case(ctx, be, dt, &one, "R=1");
            /* unequal slices, ignore_index rows, temperature and softcap, tiles of a few columns so
               the second slice's tiles start past its first class */
            problem two = {37, 24, 300, true, {0}, FG_I32, 2, {0, 110, 300}, 300, 5};
            two.opt.use_ignore_index = 1, two.opt.ignore_index = -100;
            two.opt.temperature = 0.7, two.opt.softcap = 4.0, two.opt.max_tile_elements = 37 * 40;
            run_case(ctx, be, dt, &two, "R=2 ignore+temperature+softcap+tiles");
            /* a slice of one class, and a last slice that holds no target */
            problem three = {29, 40, 200, false, {0}, FG_I64, 3, {0, 60, 61, 200}, 61, 3};
            three.opt.use_ignore_index = 1, three.opt.ignore_index = 7; /* a class id in slice 0 */
            three.opt.max_tile_elements = 29 * 16;
            run_case(ctx, be, dt, &three, "R=3 one-class slice, no-target slice");
        }
        bad_targets(ctx, be);
        bad_input(ctx, be);
        fg_context_destroy(ctx);
    }
    return th_finish("linear_logp_shard");
}

/*
 * test_adamw.c — the fused multi-tensor AdamW step on every backend present: f32
 * params, bf16/f16 params with f32 state (with and without f32 master weights, grads in
 * the params' dtype or f32) or with moments in their own dtype (each stored moment within one
 * rounding of the f64 one), many tensors of awkward sizes (1 ... past one 65536-element
 * chunk, misaligned), several steps, grad scaling, against a float64 reference of one
 * step from the current state, the update itself against the f64 one (not only the new
 * value), and with master weights params that are exactly those rounded; weight decay and eps
 * given a share of the step the tolerances see; the same bits when repeated; bad input untouched.
 */
#include "harness.h"

#include <math.h>

typedef struct variant {
    fg_dtype p, g;
    bool master;
    fg_dtype m; /* the moments' dtype (f32 = 0 when not named) */
} variant;

static const variant variants[] = {
    {FG_F32, FG_F32, false, FG_F32},  {FG_BF16, FG_BF16, false, FG_F32}, {FG_BF16, FG_F32, true, FG_F32},
    {FG_F16, FG_F16, true, FG_F32},   {FG_F16, FG_F32, false, FG_F32},   {FG_BF16, FG_BF16, false, FG_BF16},
    {FG_BF16, FG_F32, true, FG_BF16}, {FG_F16, FG_F16, false, FG_F16},
};

static const int64_t sizes[] = {1, 3, 17, 127, 1000, 65536 + 5, 4099, 131072};
#define NT ((int)(sizeof sizes / sizeof sizes[0]))

typedef struct state {
    th_operand p[NT], g[NT], m[NT], v[NT], w[NT];
    fg_tensor tp[NT], tg[NT], tm[NT], tv[NT], tw[NT];
} state;

static void make_state(state *s, fg_backend be, const variant *va) {
    for (int i = 0; i < NT; i++) {
        int layout = sizes[i] == 4099 ? 3 : 0; /* one tensor starts misaligned */
        s->p[i] = th_make(be, va->p, 1, &sizes[i], layout);
        s->g[i] = th_make(be, va->g, 1, &sizes[i], layout);
        s->m[i] = th_make(be, va->m, 1, &sizes[i], layout);
        s->v[i] = th_make(be, va->m, 1, &sizes[i], layout);
        s->w[i] = th_make(be, FG_F32, 1, &sizes[i], layout);
        th_randomize(&s->p[i]);
        th_randomize(&s->m[i]);
        th_randomize(&s->v[i]);
        /* p, m (and below g) share a random sign per element, magnitudes >= 0.05: the
           sums of the step then never cancel, so single-element tensors stay well
           conditioned against the f64 reference */
        for (int64_t k = 0; k < s->p[i].n; k++) {
            double sign = (k * 2654435761u + (uint64_t)i) % 3 == 0 ? -1 : 1;
            s->p[i].v[k] = sign * (0.05 + fabs(s->p[i].v[k]));
            s->m[i].v[k] = sign * (0.05 + fabs(s->m[i].v[k]));
        }
        th_round(va->p, s->p[i].v, s->p[i].n);
        th_round(va->m, s->m[i].v, s->m[i].n);
        th_put(&s->p[i].buf, &s->p[i].t, s->p[i].v);
        th_put(&s->m[i].buf, &s->m[i].t, s->m[i].v);
        /* f16 / bf16 params without a master: second moments small against g², so each element's
           step (≈ lr·m̂/√v̂) stays near lr or above and a one-element tensor's step is many of the
           dtype's units (at 1e-2 one seed in a few hundred gave 3.9 units, under the check's 4) */
        const double vscale = !va->master && va->p != FG_F32 ? 1e-4 : 1e-2;
        for (int64_t k = 0; k < s->v[i].n; k++) s->v[i].v[k] = fabs(s->v[i].v[k]) * vscale;
        th_put(&s->v[i].buf, &s->v[i].t, s->v[i].v);
        for (int64_t k = 0; k < s->w[i].n; k++) s->w[i].v[k] = s->p[i].v[k] + 1e-4 * th_rand(); /* master ≈ p */
        th_put(&s->w[i].buf, &s->w[i].t, s->w[i].v);
        s->tp[i] = s->p[i].t;
        s->tg[i] = s->g[i].t;
        s->tm[i] = s->m[i].t;
        s->tv[i] = s->v[i].t;
        s->tw[i] = s->w[i].t;
    }
}

static void drop_state(state *s) {
    for (int i = 0; i < NT; i++) {
        th_drop(&s->p[i]); th_drop(&s->g[i]); th_drop(&s->m[i]); th_drop(&s->v[i]); th_drop(&s->w[i]);
    }
}

static void steps(fg_context *ctx, fg_backend be, const variant *va) {
    char label[96];
    snprintf(label, sizeof label, "[%s p=%s g=%s m=%s%s]", th_backend_name(be), fg_dtype_name(va->p),
             fg_dtype_name(va->g), fg_dtype_name(va->m), va->master ? " +master" : "");
    state s;
    make_state(&s, be, va);
    /* weight decay 0.1: its term (lr·wd·p) is then about 2% of an f32 step, twenty times the
       update's tolerance, so a lost or misplaced decay cannot pass (at 0.01 it moved the update
       by 1.1-2 times that tolerance) */
    fg_adamw_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.1, 1, 0};
    /* f16/bf16 params without a master copy: a step of 1e-3 is below their resolution at
       |p| ~ 1 (bf16: 2^-8), so p would not change and a check could pass without the update;
       a step of 0.05 is many of their units, and each element is checked to one rounding */
    const bool low_direct = !va->master && va->p != FG_F32;
    if (low_direct) hp.lr = 0.05;
    for (int step = 1; step <= 3; step++) {
        hp.step = step;
        hp.grad_scale = step == 2 ? 0.5 : 0;
        double *rp[NT], *rm[NT], *rv[NT];
        for (int i = 0; i < NT; i++) {
            th_randomize(&s.g[i]);
            for (int64_t k = 0; k < s.g[i].n; k++) {
                double sign = (k * 2654435761u + (uint64_t)i) % 3 == 0 ? -1 : 1;
                s.g[i].v[k] = sign * (0.05 + fabs(s.g[i].v[k]));
            }
            if (step == 1 && i == 2) {
                /* gradients of about 1e-6 on zero second moments: √v̂ is then |g| and eps (1e-8)
                   about 1% of the denominator √v̂ + eps, ten times the update's tolerance (with the
                   other tensors' moments eps is 1e-7 of it: a dropped eps passed there) */
                for (int64_t k = 0; k < s.g[i].n; k++) {
                    double sign = (k * 2654435761u + (uint64_t)i) % 3 == 0 ? -1 : 1;
                    s.g[i].v[k] = sign * 1e-6 * (1 + 0.5 * fabs(th_rand()));
                    s.m[i].v[k] = sign * 1e-6;
                    s.v[i].v[k] = 0;
                }
                th_put(&s.m[i].buf, &s.m[i].t, s.m[i].v);
                th_put(&s.v[i].buf, &s.v[i].t, s.v[i].v);
            }
            th_round(va->g, s.g[i].v, s.g[i].n);
            th_put(&s.g[i].buf, &s.g[i].t, s.g[i].v);
            /* the state the step starts from, as stored */
            th_get(&s.p[i].buf, &s.p[i].t, s.p[i].v);
            th_get(&s.m[i].buf, &s.m[i].t, s.m[i].v);
            th_get(&s.v[i].buf, &s.v[i].t, s.v[i].v);
            th_get(&s.w[i].buf, &s.w[i].t, s.w[i].v);
            int64_t n = sizes[i];
            rp[i] = malloc(sizeof(double) * (size_t)n);
            rm[i] = malloc(sizeof(double) * (size_t)n);
            rv[i] = malloc(sizeof(double) * (size_t)n);
            double bc1 = 1 - pow(hp.beta1, step), bc2 = 1 - pow(hp.beta2, step);
            double gs = hp.grad_scale == 0 ? 1 : hp.grad_scale;
            for (int64_t k = 0; k < n; k++) {
                double g = s.g[i].v[k] * gs, p = va->master ? s.w[i].v[k] : s.p[i].v[k];
                p *= 1 - hp.lr * hp.weight_decay;
                double m = hp.beta1 * s.m[i].v[k] + (1 - hp.beta1) * g;
                double v = hp.beta2 * s.v[i].v[k] + (1 - hp.beta2) * g * g;
                p -= hp.lr / bc1 * m / (sqrt(v) / sqrt(bc2) + hp.eps);
                rp[i][k] = p;
                rm[i][k] = m;
                rv[i][k] = v;
            }
        }
        TH_OK(fg_adamw_step(ctx, &hp, NT, s.tp, s.tg, s.tm, s.tv, va->master ? s.tw : NULL));
        for (int i = 0; i < NT; i++) {
            char what[64];
            snprintf(what, sizeof what, "step %d tensor %d (n=%lld)", step, i, (long long)sizes[i]);
            /* the update is a small change to p: measure it against the change, not against p */
            double *got = malloc(sizeof(double) * (size_t)sizes[i]), *old = va->master ? s.w[i].v : s.p[i].v;
            double *dref = malloc(sizeof(double) * (size_t)sizes[i]);
            th_get(va->master ? &s.w[i].buf : &s.p[i].buf, va->master ? &s.w[i].t : &s.p[i].t, got);
            for (int64_t k = 0; k < sizes[i]; k++) {
                got[k] -= old[k];
                dref[k] = rp[i][k] - old[k];
            }
            double err = th_relerr(got, dref, sizes[i]);
            /* f32 math on a step of size ~lr: 1e-4 of the step is f32 rounding of p (|p| ~ 1 vs lr 1e-3) */
            if (va->master || va->p == FG_F32)
                TH_CHECK(err <= 1e-3, "adamw %s %s: update relerr %.3g", what, label, err);
            if (low_direct) {
                /* each element within one unit of the dtype of the f64 update, and the update
                   (the sum of |Δp|) more than 4 such units per element: a missing or wrong update
                   cannot pass */
                const int mant = va->p == FG_BF16 ? 7 : 10;
                double step_sum = 0, unit_sum = 0, worst = 0;
                for (int64_t k = 0; k < sizes[i]; k++) {
                    const double ref = rp[i][k];
                    double unit = ldexp(1.0, ilogb(fabs(ref) > 1e-30 ? ref : 1e-30) - mant);
                    if (va->p == FG_F16 && unit < 0x1p-24) unit = 0x1p-24; /* f16's subnormal spacing */
                    /* one rounding to the dtype, plus the f32 math's error on |p| and the step */
                    const double allowed = unit + 0x1p-20 * (fabs(old[k]) + fabs(dref[k]));
                    const double off = fabs(got[k] + old[k] - ref) / allowed;
                    if (!(off <= worst)) worst = off;
                    step_sum += fabs(dref[k]);
                    unit_sum += unit;
                }
                TH_CHECK(worst <= 1.0, "adamw %s %s: an element is off the update by %.3g times one %s rounding",
                         what, label, worst, fg_dtype_name(va->p));
                TH_CHECK(step_sum > 4 * unit_sum, "adamw %s %s: the step (%.3g) is not large against the dtype's "
                         "resolution (%.3g): the check could pass without it", what, label, step_sum, unit_sum);
            }
            if (va->m == FG_F32) {
                th_verify("adamw exp_avg", &s.m[i], rm[i], 1e-5, label);
                th_verify("adamw exp_avg_sq", &s.v[i], rv[i], 1e-5, label);
            } else { /* each stored moment is the f64 one rounded once (and the f32 math's error) */
                const int mant = va->m == FG_BF16 ? 7 : 10;
                th_operand *mo[2] = {&s.m[i], &s.v[i]};
                double *mr[2] = {rm[i], rv[i]}, *mg = malloc(sizeof(double) * (size_t)sizes[i]);
                for (int w = 0; w < 2; w++) {
                    th_get(&mo[w]->buf, &mo[w]->t, mg);
                    double worst = 0;
                    for (int64_t k = 0; k < sizes[i]; k++) {
                        const double ref = mr[w][k];
                        double unit = ldexp(1.0, ilogb(fabs(ref) > 1e-30 ? ref : 1e-30) - mant);
                        if (va->m == FG_F16 && unit < 0x1p-24) unit = 0x1p-24;
                        const double off = fabs(mg[k] - ref) / (0.5 * unit + 0x1p-20 * fabs(ref));
                        if (!(off <= worst)) worst = off;
                    }
                    TH_CHECK(worst <= 1.0, "adamw %s %s: a stored %s is off by %.3g times half a %s unit", what,
                             label, w ? "exp_avg_sq" : "exp_avg", worst, fg_dtype_name(va->m));
                }
                free(mg);
            }
            th_verify("adamw params", &s.p[i], rp[i], th_tol(va->p, false), label);
            if (va->master) { /* the params are the updated master weights rounded: exactly */
                double *pw = malloc(sizeof(double) * (size_t)sizes[i]), *pp = malloc(sizeof(double) * (size_t)sizes[i]);
                th_get(&s.w[i].buf, &s.w[i].t, pw);
                th_get(&s.p[i].buf, &s.p[i].t, pp);
                th_round(va->p, pw, sizes[i]);
                int64_t bad = 0;
                for (int64_t k = 0; k < sizes[i]; k++) bad += !(pp[k] == pw[k]);
                TH_CHECK(bad == 0, "adamw %s %s: %lld params are not their master weight rounded", what, label,
                         (long long)bad);
                free(pw), free(pp);
            }
            free(got); free(dref); free(rp[i]); free(rm[i]); free(rv[i]);
        }
    }
    /* the same step from the same state gives the same bits */
    void *saved[4][NT];
    th_operand *lists[4] = {s.p, s.m, s.v, s.w};
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < NT; i++) saved[l][i] = th_snapshot(&lists[l][i].buf);
    hp.step = 4;
    TH_OK(fg_adamw_step(ctx, &hp, NT, s.tp, s.tg, s.tm, s.tv, va->master ? s.tw : NULL));
    void *first = th_snapshot(&s.p[NT - 2].buf);
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < NT; i++) th_restore(&lists[l][i].buf, saved[l][i]);
    TH_OK(fg_adamw_step(ctx, &hp, NT, s.tp, s.tg, s.tm, s.tv, va->master ? s.tw : NULL));
    TH_CHECK(th_unchanged(&s.p[NT - 2].buf, first), "adamw %s: a repeated step gave other bits", label);
    free(first);
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < NT; i++) free(saved[l][i]);
    drop_state(&s);
}

static void bad_input(fg_context *ctx, fg_backend be) {
    variant va = {FG_F32, FG_F32, false};
    state s;
    make_state(&s, be, &va);
    fg_adamw_hparams ok = {1e-3, 0.9, 0.999, 1e-8, 0.01, 1, 0}, hp;
    void *snap = th_snapshot(&s.p[2].buf);
#define BAD(want, needle, call)                                                                                   \
    do {                                                                                                           \
        fg_status st_ = (call);                                                                                    \
        TH_CHECK(st_ == (want) && strstr(fg_last_error(), needle), "%s: %s '%s'", #call, fg_status_string(st_),    \
                 fg_last_error());                                                                                 \
        TH_CHECK(th_unchanged(&s.p[2].buf, snap), "%s: params written", #call);                                   \
    } while (0)
    hp = ok; hp.lr = NAN;
    BAD(FG_ERR_INVALID_VALUE, "lr=", fg_adamw_step(ctx, &hp, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    hp = ok; hp.beta1 = 1;
    BAD(FG_ERR_INVALID_VALUE, "beta1=1", fg_adamw_step(ctx, &hp, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    hp = ok; hp.eps = -1;
    BAD(FG_ERR_INVALID_VALUE, "eps=-1", fg_adamw_step(ctx, &hp, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    hp = ok; hp.step = 0;
    BAD(FG_ERR_INVALID_VALUE, "step=0", fg_adamw_step(ctx, &hp, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    BAD(FG_ERR_INVALID_VALUE, "count=-1", fg_adamw_step(ctx, &ok, -1, s.tp, s.tg, s.tm, s.tv, NULL));
    BAD(FG_ERR_NULL_POINTER, "grads is NULL", fg_adamw_step(ctx, &ok, NT, s.tp, NULL, s.tm, s.tv, NULL));
    BAD(FG_ERR_NULL_POINTER, "hp is NULL", fg_adamw_step(ctx, NULL, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    fg_tensor keep = s.tm[5];
    s.tm[5].dtype = FG_F16;
    BAD(FG_ERR_DTYPE, "exp_avg[5].dtype=f16", fg_adamw_step(ctx, &ok, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    s.tm[5] = keep;
    s.tm[5].shape[0] -= 1;
    BAD(FG_ERR_SHAPE, "exp_avg[5] has", fg_adamw_step(ctx, &ok, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    s.tm[5] = keep;
    fg_tensor keepv = s.tv[3];
    s.tv[3] = s.tm[3]; /* two lists sharing memory */
    BAD(FG_ERR_ALIAS, "overlaps", fg_adamw_step(ctx, &ok, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    s.tv[3] = keepv;
    s.tg[4].stride[0] = 2;
    s.tg[4].shape[0] = sizes[4] / 2;
    BAD(FG_ERR_SHAPE, "grads[4] has", fg_adamw_step(ctx, &ok, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    s.tg[4] = s.g[4].t;
    BAD(FG_ERR_INVALID_VALUE, "master weights are for f16/bf16", fg_adamw_step(ctx, &ok, NT, s.tp, s.tg, s.tm, s.tv, s.tw));
    /* moments of another dtype than f32 or the params' (f32 params: bf16 moments) */
    fg_tensor keepm0 = s.tm[0], keepv0 = s.tv[0];
    s.tm[0].dtype = FG_BF16;
    BAD(FG_ERR_DTYPE, "exp_avg[0].dtype=bf16 but the moments must be f32 or the params' dtype (f32)",
        fg_adamw_step(ctx, &ok, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    s.tm[0] = keepm0;
    s.tv[0].dtype = FG_BF16; /* exp_avg f32, exp_avg_sq another dtype */
    BAD(FG_ERR_DTYPE, "exp_avg_sq[0].dtype=bf16", fg_adamw_step(ctx, &ok, NT, s.tp, s.tg, s.tm, s.tv, NULL));
    s.tv[0] = keepv0;
#undef BAD
    free(snap);
    drop_state(&s);
}

#ifdef FG_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

static float f32_at(const th_buf *b, int64_t i) {
    float x = 0;
    cudaMemcpy(&x, (float *)b->ptr + i, 4, cudaMemcpyDeviceToHost);
    return x;
}

/* One f32 tensor of 2^31 + 8e4 elements (34 GB of state): the chunk arithmetic must be
 * 64-bit, and the last chunk must be updated. g is index dependent (an outer product). */
static void large(fg_context *ctx) {
    const int64_t n1 = 65537, n2 = 32769, n = n1 * n2, zs[2] = {n1, n2};
    printf("large: one tensor of n=%lld elements (> 2^31)\n", (long long)n);
    th_operand u = th_make(FG_BACKEND_CUDA, FG_F32, 1, &n1, 0), v = th_make(FG_BACKEND_CUDA, FG_F32, 1, &n2, 0);
    for (int64_t i = 0; i < n1; i++) u.v[i] = (i % 3) - 1.0 + 0.5;
    for (int64_t j = 0; j < n2; j++) v.v[j] = (double)((j % 7) + 1) / 8.0;
    th_put(&u.buf, &u.t, u.v);
    th_put(&v.buf, &v.t, v.v);
    th_buf p = th_alloc(FG_BACKEND_CUDA, FG_F32, n), g = th_alloc(FG_BACKEND_CUDA, FG_F32, n);
    th_buf m = th_alloc(FG_BACKEND_CUDA, FG_F32, n), w = th_alloc(FG_BACKEND_CUDA, FG_F32, n);
    cudaMemset(p.ptr, 0, (size_t)n * 4);
    cudaMemset(m.ptr, 0, (size_t)n * 4);
    cudaMemset(w.ptr, 0, (size_t)n * 4);
    fg_tensor g2 = th_tensor(&g, 0, 2, zs, NULL);
    TH_OK(fg_outer_forward(ctx, &u.t, &v.t, &g2));
    fg_tensor tp = th_tensor(&p, 0, 1, &n, NULL), tg = th_tensor(&g, 0, 1, &n, NULL);
    fg_tensor tm = th_tensor(&m, 0, 1, &n, NULL), tv = th_tensor(&w, 0, 1, &n, NULL);
    fg_adamw_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 0};
    TH_OK(fg_adamw_step(ctx, &hp, 1, &tp, &tg, &tm, &tv, NULL));
    TH_OK(fg_context_check(ctx));
    const int64_t probes[5] = {0, ((int64_t)1 << 31) - 1, (int64_t)1 << 31, n - 4097, n - 1};
    for (int k = 0; k < 5; k++) {
        int64_t idx = probes[k];
        double gv = u.v[idx / n2] * v.v[idx % n2];
        double want_p = -1e-3 * gv / (fabs(gv) + 1e-8), want_m = 0.1 * gv;
        TH_CHECK(fabs(f32_at(&p, idx) - want_p) <= 1e-6 * fabs(want_p) + 1e-12 &&
                     fabs(f32_at(&m, idx) - want_m) <= 1e-6 * fabs(want_m) + 1e-12,
                 "large adamw at %lld: p %g (want %g) m %g (want %g)", (long long)idx, f32_at(&p, idx), want_p,
                 f32_at(&m, idx), want_m);
    }
    th_free(&p); th_free(&g); th_free(&m); th_free(&w);
    th_drop(&u); th_drop(&v);
}
#endif

int main(void) {
    th_init("test_adamw");
    fg_backend bes[2];
    int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) steps(ctx, bes[bi], &variants[v]);
        bad_input(ctx, bes[bi]);
#ifdef FG_TEST_HAVE_CUDA
        if (bes[bi] == FG_BACKEND_CUDA && th_large("the > 2^31-element case (a GPU with 40 GB free)")) large(ctx);
#endif
        TH_OK(fg_context_check(ctx));
        fg_context_destroy(ctx);
    }
    return th_finish("test_adamw");
}

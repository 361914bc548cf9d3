/*
 * test_attention.c — the attention family on every backend present and every dtype, against a
 * float64 reference written here (the [L, L] scores formed in full): forward (o, lse, the
 * scores out) and backward (dq, dk, dv, the input scores' gradient; each alone and together,
 * accumulate), with causal and key-padding masks (lengths 0 and L among them), additive input
 * scores, upstream score gradients (PatchTST's residual attention), dropout (the reference
 * regenerates the mask from src/core/rng.h's definition), q/k/v read in place from a packed
 * [B, L, 3, H, hd] projection, q and k in pieces ([B, H, L, P, hd] over a [P, B, L, H, hd]
 * buffer: the reference takes them as one head dim of P·hd; CUDA beyond its short kernels must
 * refuse them), and awkward sizes (L = 1, 3, 17, 42, 127, 129, 1030; hd 0 … 128).
 * Outputs are NaN-poisoned before each run, masked scores must be exactly −∞, and every element
 * is bounded besides the norm (on CUDA in f16 / bf16 with room for the documented rounding of P̃
 * and dS to the dtype before the gradient products: the dtype's unit roundoff times the sum of
 * the element's term magnitudes, which the reference keeps). On CUDA each case also checks which kernel the plan chose, so
 * the short, flash and tiled paths each run (f64 is the CPU backend's: CUDA must refuse it).
 * Also: finite differences of the f64 CPU path (every gradient, all features on), bit-identical
 * reruns, a bad length reported by fg_context_check with only its sequence NaN, an Inf key that a
 * causal mask hides from a row leaving that row's o and dq exactly as they were, bad input
 * refused with nothing written, and the workspace staying far below an [L, L] buffer.
 */
#include "harness.h"

#include "../src/core/rng.h"

#include <math.h>

typedef struct problem {
    int64_t B, H, L, hd;
    bool causal, lengths, sin, sout, dsc;
    double dropout, scale;
    bool packed;          /* q, k, v views of one [B, L, 3, H, hd] buffer; o, do as [B, L, H, hd] */
    bool sacc;            /* score operands in the accumulator type (else q's dtype) */
    const char *cuda_lp;  /* the kernel a CUDA plan must name for f16 / bf16 (a substring; NULL: any) */
    const char *cuda_hp;  /* the same for f32 / f64 */
    bool tsc;             /* the score operands key-major ([B, H, L, L] with strides (H·L·L, L·L, 1, L)),
                             one element past their buffer's start: no kernel may take them as rows */
    int64_t pieces;       /* > 1: q, k, dq, dk as [B, H, L, P, hd] views of a [P, B, L, H, hd] buffer (the
                             encoder's layers side by side); the reference takes them as one head dim of
                             P·hd. 0 or 1: [B, H, L, hd] */
} problem;

/* q and k's pieces, and the head dim of their products (P·hd) */
static int64_t pieces_of(const problem *p) { return p->pieces > 1 ? p->pieces : 1; }
static int64_t hq_of(const problem *p) { return pieces_of(p) * p->hd; }

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

static int64_t at4(int64_t b, int64_t h, int64_t i, int64_t x, int64_t H, int64_t L, int64_t X) {
    return ((b * H + h) * L + i) * X + x;
}

/* ------------------------------------------------------------------ float64 reference */

static double scale_of(const problem *p) {
    return p->scale != 0 ? p->scale : p->hd > 0 ? 1.0 / sqrt((double)p->hd) : 1.0;
}

static int64_t jend_of(const problem *p, const int64_t *len, int64_t b, int64_t i) {
    int64_t n = len ? len[b] : p->L;
    return p->causal && i + 1 < n ? i + 1 : n;
}

typedef struct reference {
    double *o, *lse, *sout;            /* forward */
    double *dq, *dk, *dv, *dsin;       /* backward */
    double *mq, *mk, *mv;              /* backward: Σ |term| of each gradient element */
} reference;

static void ref_forward(const problem *p, uint64_t seed, uint64_t offset, const double *q, const double *k,
                        const double *v, const int64_t *len, const double *sin, reference *r) {
    const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd, hq = hq_of(p);
    const double scale = scale_of(p);
    double *s = malloc(sizeof(double) * (size_t)(L + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                const int64_t je = jend_of(p, len, b, i);
                double m = -INFINITY;
                for (int64_t j = 0; j < je; j++) {
                    double d = 0;
                    for (int64_t x = 0; x < hq; x++) d += q[at4(b, h, i, x, H, L, hq)] * k[at4(b, h, j, x, H, L, hq)];
                    s[j] = d * scale + (sin ? sin[at4(b, h, i, j, H, L, L)] : 0);
                    if (s[j] > m) m = s[j];
                }
                for (int64_t j = 0; j < L; j++) r->sout[at4(b, h, i, j, H, L, L)] = j < je ? s[j] : -INFINITY;
                const int64_t row = (b * H + h) * L + i;
                for (int64_t x = 0; x < hd; x++) r->o[row * hd + x] = 0;
                if (m == -INFINITY) {
                    r->lse[row] = -INFINITY;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < je; j++) sum += exp(s[j] - m);
                const double lse = m + log(sum);
                r->lse[row] = lse;
                for (int64_t j = 0; j < je; j++) {
                    const double pt = exp(s[j] - lse) * th_attn_keep(p->dropout, seed, offset, row * L + j);
                    for (int64_t x = 0; x < hd; x++) r->o[row * hd + x] += pt * v[at4(b, h, j, x, H, L, hd)];
                }
            }
    free(s);
}

/* The backward from do (and G = dscores), with lse and o from the reference forward. */
static void ref_backward(const problem *p, uint64_t seed, uint64_t offset, const double *q, const double *k,
                         const double *v, const int64_t *len, const double *sin, const double *dO, const double *G,
                         const reference *f, reference *r) {
    const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd, hq = hq_of(p);
    const double scale = scale_of(p);
    const int64_t nq = B * H * L * hq, nv = B * H * L * hd, ns = B * H * L * L;
    memset(r->dq, 0, sizeof(double) * (size_t)(nq + 1));
    memset(r->dk, 0, sizeof(double) * (size_t)(nq + 1));
    memset(r->dv, 0, sizeof(double) * (size_t)(nv + 1));
    memset(r->dsin, 0, sizeof(double) * (size_t)(ns + 1));
    memset(r->mq, 0, sizeof(double) * (size_t)(nq + 1));
    memset(r->mk, 0, sizeof(double) * (size_t)(nq + 1));
    memset(r->mv, 0, sizeof(double) * (size_t)(nv + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                const int64_t row = (b * H + h) * L + i, je = jend_of(p, len, b, i);
                const double lse = f->lse[row];
                if (lse == -INFINITY) continue;
                double D = 0;
                for (int64_t x = 0; x < hd; x++) D += dO[row * hd + x] * f->o[row * hd + x];
                for (int64_t j = 0; j < je; j++) {
                    double d = 0, dp = 0;
                    for (int64_t x = 0; x < hq; x++) d += q[row * hq + x] * k[at4(b, h, j, x, H, L, hq)];
                    for (int64_t x = 0; x < hd; x++) dp += dO[row * hd + x] * v[at4(b, h, j, x, H, L, hd)];
                    const double sv = d * scale + (sin ? sin[row * L + j] : 0);
                    const double pij = exp(sv - lse), kd = th_attn_keep(p->dropout, seed, offset, row * L + j);
                    const double ds = pij * (dp * kd - D) + (G ? G[row * L + j] : 0);
                    r->dsin[row * L + j] = ds;
                    for (int64_t x = 0; x < hq; x++) {
                        const double tq = scale * ds * k[at4(b, h, j, x, H, L, hq)];
                        const double tk = scale * ds * q[row * hq + x];
                        r->dq[row * hq + x] += tq, r->mq[row * hq + x] += fabs(tq);
                        r->dk[at4(b, h, j, x, H, L, hq)] += tk, r->mk[at4(b, h, j, x, H, L, hq)] += fabs(tk);
                    }
                    for (int64_t x = 0; x < hd; x++) {
                        const double tv = pij * kd * dO[row * hd + x];
                        r->dv[at4(b, h, j, x, H, L, hd)] += tv, r->mv[at4(b, h, j, x, H, L, hd)] += fabs(tv);
                    }
                }
            }
}

static reference ref_alloc(const problem *p) {
    const size_t nq = (size_t)(p->B * p->H * p->L * hq_of(p)) + 1, nv = (size_t)(p->B * p->H * p->L * p->hd) + 1,
                 ns = (size_t)(p->B * p->H * p->L * p->L) + 1, nr = (size_t)(p->B * p->H * p->L) + 1;
    reference r;
    r.o = calloc(nv, sizeof(double)), r.lse = calloc(nr, sizeof(double)), r.sout = calloc(ns, sizeof(double));
    r.dq = calloc(nq, sizeof(double)), r.dk = calloc(nq, sizeof(double)), r.dv = calloc(nv, sizeof(double));
    r.dsin = calloc(ns, sizeof(double));
    r.mq = calloc(nq, sizeof(double)), r.mk = calloc(nq, sizeof(double)), r.mv = calloc(nv, sizeof(double));
    return r;
}

static void ref_free(reference *r) {
    free(r->o), free(r->lse), free(r->sout), free(r->dq), free(r->dk), free(r->dv), free(r->dsin);
    free(r->mq), free(r->mk), free(r->mv);
}

/* ------------------------------------------------------------------ operands */

/* A tensor on a backend with its logical values; `shared` views another's storage. */
typedef struct arr {
    th_buf buf;
    bool shared;
    fg_tensor t;
    double *v;
    int64_t n;
} arr;

static arr arr_make(fg_backend be, fg_dtype dt, int rank, const int64_t *shape) {
    arr a;
    memset(&a, 0, sizeof a);
    a.n = 1;
    for (int d = 0; d < rank; d++) a.n *= shape[d];
    a.buf = th_alloc(be, dt, a.n + 4);
    a.t = th_tensor(&a.buf, 0, rank, shape, NULL);
    a.v = calloc((size_t)(a.n + 1), sizeof(double));
    return a;
}

/* [B, H, L, hd] views of a [B, L, G, H, hd] buffer (g-th of G), or of [B, L, H, hd] when G = 1. */
static arr arr_strided(const th_buf *buf, int64_t g, int64_t G, int64_t B, int64_t H, int64_t L, int64_t hd) {
    arr a;
    memset(&a, 0, sizeof a);
    a.buf = *buf;
    a.shared = true;
    const int64_t shape[4] = {B, H, L, hd}, stride[4] = {L * G * H * hd, hd, G * H * hd, 1};
    a.t = th_tensor(buf, g * H * hd, 4, shape, stride);
    a.n = B * H * L * hd;
    a.v = calloc((size_t)(a.n + 1), sizeof(double));
    return a;
}

/* A [B, H, L, P, hd] view of its own [P, B, L, H, hd] buffer: piece by piece, as the encoder's
 * layers keep their projections one after another. */
static arr arr_pieces(fg_backend be, fg_dtype dt, const problem *p) {
    const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd, P = pieces_of(p);
    arr a;
    memset(&a, 0, sizeof a);
    a.n = B * H * L * P * hd;
    a.buf = th_alloc(be, dt, a.n + 4);
    const int64_t shape[5] = {B, H, L, P, hd}, stride[5] = {L * H * hd, hd, H * hd, B * L * H * hd, 1};
    a.t = th_tensor(&a.buf, 0, 5, shape, stride);
    a.v = calloc((size_t)(a.n + 1), sizeof(double));
    return a;
}

/* A [B, H, L, L] score operand: contiguous, or (p->tsc) key-major one element into its buffer. */
static arr arr_scores(fg_backend be, fg_dtype dt, const problem *p) {
    const int64_t B = p->B, H = p->H, L = p->L, ss[4] = {B, H, L, L};
    if (!p->tsc) return arr_make(be, dt, 4, ss);
    arr a = arr_make(be, dt, 4, ss);
    const int64_t stride[4] = {H * L * L, L * L, 1, L};
    a.t = th_tensor(&a.buf, 1, 4, ss, stride);
    return a;
}

static void arr_drop(arr *a) {
    if (!a->v) return;
    if (!a->shared) th_free(&a->buf);
    free(a->v);
    memset(a, 0, sizeof *a);
}

static void arr_random(arr *a, double mul) {
    th_fill(a->v, a->n);
    for (int64_t i = 0; i < a->n; i++) a->v[i] *= mul;
    th_round(a->buf.dtype, a->v, a->n);
    th_put(&a->buf, &a->t, a->v);
}

/* Before a run: NaN everywhere (a shared buffer: the whole storage), or (accumulate) random
 * values that ref gains. */
static void arr_prepare(arr *a, double *ref, bool accumulate) {
    th_poison(&a->buf);
    if (!accumulate) return;
    th_fill(a->v, a->n);
    for (int64_t i = 0; i < a->n; i++)
        if (a->v[i] * ref[i] < 0) a->v[i] = -a->v[i];
    th_round(a->buf.dtype, a->v, a->n);
    th_put(&a->buf, &a->t, a->v);
    for (int64_t i = 0; i < a->n; i++) ref[i] += a->v[i];
}

static double tol_of(fg_dtype dt) { return th_tol(dt, false); }

/* The unit roundoff of the dtype the CUDA kernels round P̃ and dS to before the gradient
 * products (f16 / bf16; f32 and the CPU backend keep them in f32): 0 where they are not rounded. */
static double rounding_of(fg_backend be, fg_dtype dt) {
    if (be != FG_BACKEND_CUDA) return 0;
    return dt == FG_BF16 ? 0x1p-8 : dt == FG_F16 ? 0x1p-11 : 0;
}

/* Reads a back and checks it against ref: positions where ref is −∞ must be exactly −∞; over the
 * others ‖got − ref‖/‖ref‖ <= tol and every element |got − ref| <= 8·tol·(|ref| + mean|ref|)
 * + u·mag (mag: the element's Σ |term|, u: rounding_of; mag NULL: none). */
static void verify_terms(const char *what, arr *a, const double *ref, const double *mag, double u, fg_dtype dt,
                         const char *label) {
    const double tol = tol_of(dt);
    double *got = malloc(sizeof(double) * (size_t)(a->n + 1));
    th_get(&a->buf, &a->t, got);
    double num = 0, den = 0, mean = 0;
    int64_t n = 0, inf_bad = -1, nan_at = -1;
    for (int64_t i = 0; i < a->n; i++) {
        if (ref[i] == -INFINITY) {
            if (got[i] != -INFINITY && inf_bad < 0) inf_bad = i;
            continue;
        }
        if (!isfinite(got[i]) && nan_at < 0) nan_at = i;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
        mean += fabs(ref[i]);
        n++;
    }
    mean = n ? mean / (double)n : 0;
    const double tiny = dt == FG_F16 ? 6.103515625e-05 : dt == FG_F64 ? 1e-300 : 1.1754943508222875e-38;
    if (mean < tiny) mean = tiny;
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    if (nan_at >= 0) err = INFINITY;
    th_margin(what, label, err, tol);
    TH_CHECK(inf_bad < 0, "%s %s: element %lld is %g where the reference is -inf (masked)", what, label,
             (long long)inf_bad, inf_bad >= 0 ? got[inf_bad] : 0.0);
    TH_CHECK(err <= tol, "%s %s: relerr %.3g > tol %.3g%s", what, label, err, tol,
             nan_at >= 0 ? " (a non-finite element)" : "");
    int64_t bad = -1, count = 0, rounded = 0;
    for (int64_t i = 0; i < a->n; i++) {
        if (ref[i] == -INFINITY) continue;
        const double e = fabs(got[i] - ref[i]), base = 8 * tol * (fabs(ref[i]) + mean);
        if (!(e <= base) && e <= base + (mag ? u * mag[i] : 0)) rounded++;
        if (!(e <= base + (mag ? u * mag[i] : 0))) {
            if (bad < 0) bad = i;
            count++;
        }
    }
    TH_CHECK(bad < 0,
             "%s %s: %lld elements off by more than 8·tol·(|ref| + mean|ref|) + u·Σ|terms|, first %lld: got %.8g "
             "ref %.8g (mean|ref| %.3g, Σ|terms| %.3g)",
             what, label, (long long)count, (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0, mean,
             bad >= 0 && mag ? mag[bad] : 0.0);
    if (rounded && getenv("FG_TEST_VERBOSE"))
        printf("  %s %s: %lld elements within the rounding term only\n", what, label, (long long)rounded);
    free(got);
}

static void verify(const char *what, arr *a, const double *ref, fg_dtype dt, const char *label) {
    verify_terms(what, a, ref, NULL, 0, dt, label);
}

/* The inputs of one problem. */
typedef struct inputs {
    th_buf packed;            /* the [B, L, 3, H, hd] projection (packed problems) */
    th_buf obuf, dobuf;       /* o and do as [B, L, H, hd] (packed problems) */
    arr q, k, v, sin, dsc, dO;
    th_buf lbuf;
    fg_tensor len_t;
    int64_t *len;
    uint64_t seed, offset;
} inputs;

static inputs make_inputs(fg_backend be, fg_dtype dt, const problem *p) {
    inputs in;
    memset(&in, 0, sizeof in);
    const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd;
    const int64_t s4[4] = {B, H, L, hd};
    const fg_dtype sdt = p->sacc ? acc_of(dt) : dt;
    if (p->packed) {
        in.packed = th_alloc(be, dt, B * L * 3 * H * hd + 4);
        th_poison(&in.packed);
        in.q = arr_strided(&in.packed, 0, 3, B, H, L, hd);
        in.k = arr_strided(&in.packed, 1, 3, B, H, L, hd);
        in.v = arr_strided(&in.packed, 2, 3, B, H, L, hd);
        in.dobuf = th_alloc(be, dt, B * L * H * hd + 4);
        in.dO = arr_strided(&in.dobuf, 0, 1, B, H, L, hd);
    } else if (pieces_of(p) > 1) {
        in.q = arr_pieces(be, dt, p), in.k = arr_pieces(be, dt, p), in.v = arr_make(be, dt, 4, s4);
        in.dO = arr_make(be, dt, 4, s4);
    } else {
        in.q = arr_make(be, dt, 4, s4), in.k = arr_make(be, dt, 4, s4), in.v = arr_make(be, dt, 4, s4);
        in.dO = arr_make(be, dt, 4, s4);
    }
    arr_random(&in.q, 1.0), arr_random(&in.k, 1.0), arr_random(&in.v, 1.0), arr_random(&in.dO, 1.0);
    if (p->sin) {
        in.sin = arr_scores(be, sdt, p);
        arr_random(&in.sin, 2.0);
    }
    if (p->dsc) {
        in.dsc = arr_scores(be, sdt, p);
        arr_random(&in.dsc, 0.5);
    }
    if (p->lengths) {
        in.len = malloc(sizeof(int64_t) * (size_t)(B + 1));
        for (int64_t b = 0; b < B; b++) in.len[b] = (int64_t)(th_rand_u64() % (uint64_t)(L + 1));
        if (B > 1) in.len[0] = L, in.len[1] = 0;   /* the ends of [0, L] */
        else in.len[0] = L > 1 ? L - 1 : L;
        const fg_dtype ldt = (B & 1) ? FG_I64 : FG_I32;
        in.lbuf = th_alloc(be, ldt, B + 1);
        char *raw = malloc(8 * (size_t)(B + 1));
        for (int64_t b = 0; b < B; b++) {
            if (ldt == FG_I32) ((int32_t *)raw)[b] = (int32_t)in.len[b];
            else ((int64_t *)raw)[b] = in.len[b];
        }
        th_put_raw(&in.lbuf, raw, fg_dtype_size(ldt) * (size_t)B);
        free(raw);
        const int64_t ls[1] = {B};
        in.len_t = th_tensor(&in.lbuf, 0, 1, ls, NULL);
    }
    in.seed = th_rand_u64(), in.offset = th_rand_u64() >> 20;
    return in;
}

static void drop_inputs(inputs *in, const problem *p) {
    arr_drop(&in->q), arr_drop(&in->k), arr_drop(&in->v), arr_drop(&in->dO);
    arr_drop(&in->sin), arr_drop(&in->dsc);
    if (p->packed) th_free(&in->packed), th_free(&in->dobuf);
    if (in->len) th_free(&in->lbuf), free(in->len);
}

static fg_attention_options opts_of(const problem *p, const inputs *in) {
    fg_attention_options o;
    memset(&o, 0, sizeof o);
    o.scale = p->scale, o.causal = p->causal, o.dropout_p = p->dropout, o.seed = in->seed, o.offset = in->offset;
    return o;
}

/* Outputs of one problem (o as [B, L, H, hd] for packed problems). */
typedef struct outputs {
    th_buf obuf;
    arr o, lse, sout, dq, dk, dv, dsin;
} outputs;

static outputs make_outputs(fg_backend be, fg_dtype dt, const problem *p) {
    outputs out;
    memset(&out, 0, sizeof out);
    const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd;
    const int64_t s4[4] = {B, H, L, hd}, s3[3] = {B, H, L};
    const fg_dtype sdt = p->sacc ? acc_of(dt) : dt;
    if (p->packed) {
        out.obuf = th_alloc(be, dt, B * L * H * hd + 4);
        out.o = arr_strided(&out.obuf, 0, 1, B, H, L, hd);
    } else {
        out.o = arr_make(be, dt, 4, s4);
    }
    out.lse = arr_make(be, acc_of(dt), 3, s3);
    if (p->sout) out.sout = arr_scores(be, sdt, p);
    if (pieces_of(p) > 1) out.dq = arr_pieces(be, dt, p), out.dk = arr_pieces(be, dt, p);
    else out.dq = arr_make(be, dt, 4, s4), out.dk = arr_make(be, dt, 4, s4);
    out.dv = arr_make(be, dt, 4, s4);
    if (p->sin) out.dsin = arr_scores(be, sdt, p);
    return out;
}

static void drop_outputs(outputs *out, const problem *p) {
    arr_drop(&out->o), arr_drop(&out->lse), arr_drop(&out->sout), arr_drop(&out->dq), arr_drop(&out->dk);
    arr_drop(&out->dv), arr_drop(&out->dsin);
    if (p->packed) th_free(&out->obuf);
}

static const fg_tensor *opt_t(const arr *a) { return a->v ? &a->t : NULL; }

static fg_status run_forward(fg_context *ctx, const problem *p, inputs *in, outputs *out) {
    fg_attention_options o = opts_of(p, in);
    return fg_attention_forward(ctx, &o, &in->q.t, &in->k.t, &in->v.t, p->lengths ? &in->len_t : NULL,
                                opt_t(&in->sin), &out->o.t, &out->lse.t, opt_t(&out->sout));
}

/* want: bit 0 dq, 1 dk, 2 dv, 3 dscores_in */
static fg_status run_backward(fg_context *ctx, const problem *p, inputs *in, outputs *out, unsigned want, int acc) {
    fg_attention_options o = opts_of(p, in);
    return fg_attention_backward(ctx, &o, &in->dO.t, opt_t(&in->dsc), &in->q.t, &in->k.t, &in->v.t,
                                 p->lengths ? &in->len_t : NULL, opt_t(&in->sin), &out->o.t, &out->lse.t,
                                 (want & 1) ? &out->dq.t : NULL, (want & 2) ? &out->dk.t : NULL,
                                 (want & 4) ? &out->dv.t : NULL, (want & 8) && out->dsin.v ? &out->dsin.t : NULL, acc);
}

/* The kernel a plan of this problem names. */
static void plan_name(fg_context *ctx, const problem *p, inputs *in, outputs *out, bool forward, char *name,
                      size_t len) {
    fg_attention_options o = opts_of(p, in);
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.options = &o, d.options_size = sizeof o;
    if (forward) {
        d.op = FG_OP_ATTENTION_FORWARD;
        d.operands[0] = in->q.t, d.operands[1] = in->k.t, d.operands[2] = in->v.t;
        if (p->lengths) d.operands[3] = in->len_t;
        if (p->sin) d.operands[4] = in->sin.t;
        d.operands[5] = out->o.t, d.operands[6] = out->lse.t;
        if (p->sout) d.operands[7] = out->sout.t;
    } else {
        d.op = FG_OP_ATTENTION_BACKWARD;
        d.operands[0] = in->dO.t;
        if (p->dsc) d.operands[1] = in->dsc.t;
        d.operands[2] = in->q.t, d.operands[3] = in->k.t, d.operands[4] = in->v.t;
        if (p->lengths) d.operands[5] = in->len_t;
        if (p->sin) d.operands[6] = in->sin.t, d.operands[12] = out->dsin.t;
        d.operands[7] = out->o.t, d.operands[8] = out->lse.t;
        d.operands[9] = out->dq.t, d.operands[10] = out->dk.t, d.operands[11] = out->dv.t;
    }
    for (int i = 0; i < FG_MAX_OPERANDS; i++) d.operands[i].data = NULL;
    d.alignment = 16;
    fg_plan *plan = NULL;
    fg_plan_info info;
    memset(&info, 0, sizeof info);
    TH_OK(fg_plan_create(ctx, &d, &plan));
    if (plan) TH_OK(fg_plan_info_get(plan, &info));
    fg_plan_destroy(plan);
    snprintf(name, len, "%s", info.kernel);
}

/* ------------------------------------------------------------------ one case */

/* The key rows at or past a sequence's length are never seen: Inf and NaN there must leave every
 * output as the reference, which never reads them, has it. */
static void poison_padded_keys(inputs *in, const problem *p) {
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t j = in->len[b]; j < p->L; j++) {
                for (int64_t x = 0; x < hq_of(p); x++)
                    in->k.v[at4(b, h, j, x, p->H, p->L, hq_of(p))] = ((j + x) & 1) ? NAN : INFINITY;
                for (int64_t x = 0; x < p->hd; x++)
                    in->v.v[at4(b, h, j, x, p->H, p->L, p->hd)] = ((j + x) & 1) ? -INFINITY : NAN;
            }
    th_put(&in->k.buf, &in->k.t, in->k.v);
    th_put(&in->v.buf, &in->v.t, in->v.v);
}

static void run_case(fg_context *ctx, fg_backend be, fg_dtype dt, const problem *p) {
    char lab[200];
    snprintf(lab, sizeof lab, "%s %s B=%lld H=%lld L=%lld hd=%lld P=%lld%s%s%s%s%s%s%s drop=%g", th_backend_name(be),
             fg_dtype_name(dt), (long long)p->B, (long long)p->H, (long long)p->L, (long long)p->hd,
             (long long)pieces_of(p),
             p->causal ? " causal" : "", p->lengths ? " lengths" : "", p->sin ? " sin" : "", p->sout ? " sout" : "",
             p->dsc ? " dscores" : "", p->packed ? " packed" : "", p->sacc ? " f32-scores" : "", p->dropout);
    inputs in = make_inputs(be, dt, p);
    if (p->lengths) poison_padded_keys(&in, p);
    outputs out = make_outputs(be, dt, p);
    if (be == FG_BACKEND_CUDA && dt == FG_F64) { /* f64 runs on the CPU backend */
        th_poison(&out.o.buf);
        TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "f64", &out.o, run_forward(ctx, p, &in, &out));
        TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "f64", &out.dq, run_backward(ctx, p, &in, &out, 15u, 0));
        drop_outputs(&out, p);
        drop_inputs(&in, p);
        return;
    }
    if (be == FG_BACKEND_CUDA && pieces_of(p) > 1 && (p->L > 64 || p->hd > 8 || p->hd < 1)) {
        /* q, k in pieces beyond the short kernels: refused, nothing written */
        th_poison(&out.o.buf);
        TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "pieces", &out.o, run_forward(ctx, p, &in, &out));
        TH_EXPECT_BAD(FG_ERR_UNSUPPORTED, "pieces", &out.dq, run_backward(ctx, p, &in, &out, 15u, 0));
        drop_outputs(&out, p);
        drop_inputs(&in, p);
        return;
    }
    const char *want = (dt == FG_F16 || dt == FG_BF16) ? p->cuda_lp : p->cuda_hp;
    if (be == FG_BACKEND_CUDA && want) {
        char name[256];
        plan_name(ctx, p, &in, &out, true, name, sizeof name);
        TH_CHECK(strstr(name, want) != NULL, "%s: forward plan '%s', expected %s", lab, name, want);
        plan_name(ctx, p, &in, &out, false, name, sizeof name);
        TH_CHECK(strstr(name, want) != NULL, "%s: backward plan '%s', expected %s", lab, name, want);
    }
    reference f = ref_alloc(p), g = ref_alloc(p);
    ref_forward(p, in.seed, in.offset, in.q.v, in.k.v, in.v.v, in.len, in.sin.v, &f);

    /* forward */
    arr_prepare(&out.o, NULL, false), arr_prepare(&out.lse, NULL, false);
    if (p->sout) arr_prepare(&out.sout, NULL, false);
    TH_OK(run_forward(ctx, p, &in, &out));
    verify("o", &out.o, f.o, dt, lab);
    verify("lse", &out.lse, f.lse, acc_of(dt), lab);
    if (p->sout) verify("scores_out", &out.sout, f.sout, out.sout.buf.dtype, lab);

    /* The backward's reference takes the o and lse the library stored, as the library's backward
       does: D_i = do_i·o_i is a difference of nearly equal terms in ds = p·(dp − D), so an o
       rounded to bf16 (2^-9) moves ds by far more than its own rounding would. */
    th_get(&out.o.buf, &out.o.t, out.o.v);
    th_get(&out.lse.buf, &out.lse.t, out.lse.v);
    reference stored = f;
    stored.o = out.o.v, stored.lse = out.lse.v;
    ref_backward(p, in.seed, in.offset, in.q.v, in.k.v, in.v.v, in.len, in.sin.v, in.dO.v, in.dsc.v, &stored, &g);
    const int64_t nq = out.dq.n, nv = out.dv.n, ns = p->B * p->H * p->L * p->L;
    double *rq = malloc(sizeof(double) * (size_t)(nq + 1)), *rk = malloc(sizeof(double) * (size_t)(nq + 1));
    double *rv = malloc(sizeof(double) * (size_t)(nv + 1)), *rs = malloc(sizeof(double) * (size_t)(ns + 1));
    for (int pass = 0; pass < 3; pass++) {
        /* 0: every gradient; 1: every gradient accumulated; 2: dq alone, then dk and dv */
        const bool acc = pass == 1;
        const unsigned want = pass == 2 ? 1u : 15u;
        memcpy(rq, g.dq, sizeof(double) * (size_t)nq), memcpy(rk, g.dk, sizeof(double) * (size_t)nq);
        memcpy(rv, g.dv, sizeof(double) * (size_t)nv), memcpy(rs, g.dsin, sizeof(double) * (size_t)ns);
        arr_prepare(&out.dq, rq, acc), arr_prepare(&out.dk, rk, acc), arr_prepare(&out.dv, rv, acc);
        if (p->sin) arr_prepare(&out.dsin, rs, acc);
        TH_OK(run_backward(ctx, p, &in, &out, want, acc));
        char l2[240];
        snprintf(l2, sizeof l2, "%s%s", lab, pass == 1 ? " accumulate" : pass == 2 ? " dq alone" : "");
        const double u = rounding_of(be, dt);
        verify_terms("dq", &out.dq, rq, g.mq, u, dt, l2);
        if (pass == 2) {
            TH_OK(run_backward(ctx, p, &in, &out, 6u, 0));
            verify_terms("dk (with dv)", &out.dk, rk, g.mk, u, dt, l2);
            verify_terms("dv (with dk)", &out.dv, rv, g.mv, u, dt, l2);
            continue;
        }
        verify_terms("dk", &out.dk, rk, g.mk, u, dt, l2);
        verify_terms("dv", &out.dv, rv, g.mv, u, dt, l2);
        if (p->sin) verify("dscores_in", &out.dsin, rs, out.dsin.buf.dtype, l2);
    }
    free(rq), free(rk), free(rv), free(rs);

    /* bit-identical reruns */
    if (out.o.n + out.lse.n > 0) {
        void *o1 = th_snapshot(&out.o.buf), *l1 = th_snapshot(&out.lse.buf);
        TH_OK(run_backward(ctx, p, &in, &out, 15u, 0));
        void *d1 = th_snapshot(&out.dk.buf);
        TH_OK(run_forward(ctx, p, &in, &out));
        TH_OK(run_backward(ctx, p, &in, &out, 15u, 0));
        TH_CHECK(th_unchanged(&out.o.buf, o1) && th_unchanged(&out.lse.buf, l1) && th_unchanged(&out.dk.buf, d1),
                 "%s: a rerun gave other bits", lab);
        free(o1), free(l1), free(d1);
    }
    ref_free(&f), ref_free(&g);
    drop_outputs(&out, p);
    drop_inputs(&in, p);
}

/* ------------------------------------------------------------------ finite differences */

typedef struct fd_arg {
    problem *p;
    inputs *in;
    outputs *out;
    arr both; /* o and the scores out (0 where masked), one vector */
} fd_arg;

static fg_status fd_forward(fg_context *ctx, void *argp) {
    fd_arg *a = argp;
    fg_status s = run_forward(ctx, a->p, a->in, a->out);
    if (s != FG_OK) return s;
    th_get(&a->out->o.buf, &a->out->o.t, a->out->o.v);
    th_get(&a->out->sout.buf, &a->out->sout.t, a->out->sout.v);
    memcpy(a->both.v, a->out->o.v, sizeof(double) * (size_t)a->out->o.n);
    for (int64_t i = 0; i < a->out->sout.n; i++)
        a->both.v[a->out->o.n + i] = a->out->sout.v[i] == -INFINITY ? 0 : a->out->sout.v[i];
    th_put(&a->both.buf, &a->both.t, a->both.v);
    return FG_OK;
}

static void finite_differences(void) {
    fg_context *ctx = th_context(FG_BACKEND_CPU, false);
    problem p = {2, 2, 5, 3, true, true, true, true, true, 0.3, 0.7, false, false, NULL, NULL};
    inputs in = make_inputs(FG_BACKEND_CPU, FG_F64, &p);
    in.len[0] = 5, in.len[1] = 4;
    int32_t raw32[2] = {5, 4};
    int64_t raw64[2] = {5, 4};
    if (in.lbuf.dtype == FG_I32) th_put_raw(&in.lbuf, raw32, sizeof raw32);
    else th_put_raw(&in.lbuf, raw64, sizeof raw64);
    outputs out = make_outputs(FG_BACKEND_CPU, FG_F64, &p);
    fd_arg a = {&p, &in, &out, {0}};
    const int64_t nb[1] = {out.o.n + out.sout.n};
    a.both = arr_make(FG_BACKEND_CPU, FG_F64, 1, nb);
    TH_OK(fd_forward(ctx, &a));
    /* r: do and dscores in one vector (dscores 0 where masked: s has no gradient there) */
    arr r = arr_make(FG_BACKEND_CPU, FG_F64, 1, nb);
    memcpy(r.v, in.dO.v, sizeof(double) * (size_t)out.o.n);
    memcpy(r.v + out.o.n, in.dsc.v, sizeof(double) * (size_t)out.sout.n);
    for (int64_t i = 0; i < out.sout.n; i++)
        if (out.sout.v[i] == -INFINITY) r.v[out.o.n + i] = 0;
    TH_OK(run_backward(ctx, &p, &in, &out, 15u, 0));
    /* dq, dk, dv, dscores_in as th_operands for th_fd_check (the same storage and values) */
    th_operand par[4], grd[4];
    arr *pa[4] = {&in.q, &in.k, &in.v, &in.sin}, *ga[4] = {&out.dq, &out.dk, &out.dv, &out.dsin};
    for (int i = 0; i < 4; i++) {
        par[i].buf = pa[i]->buf, par[i].t = pa[i]->t, par[i].v = pa[i]->v, par[i].n = pa[i]->n;
        grd[i].buf = ga[i]->buf, grd[i].t = ga[i]->t, grd[i].v = ga[i]->v, grd[i].n = ga[i]->n;
    }
    /* the masked dscores (the gradient of a −∞ score) were taken as given: zero them in the run's
       dscores too, so the analytic gradient is the one of the loss measured */
    for (int64_t i = 0; i < out.sout.n; i++)
        if (out.sout.v[i] == -INFINITY) in.dsc.v[i] = 0;
    th_put(&in.dsc.buf, &in.dsc.t, in.dsc.v);
    TH_OK(run_backward(ctx, &p, &in, &out, 15u, 0));
    th_operand both = {a.both.buf, a.both.t, a.both.v, a.both.n}, rr = {r.buf, r.t, r.v, r.n};
    th_operand *pp[4] = {&par[0], &par[1], &par[2], &par[3]}, *gg[4] = {&grd[0], &grd[1], &grd[2], &grd[3]};
    static const char *const names[4] = {"q", "k", "v", "scores_in"};
    th_fd_check(ctx, "attention f64 causal lengths dropout residual", fd_forward, &a, &both, &rr, pp, gg, names, 4, 0,
                false);
    arr_drop(&a.both), arr_drop(&r);
    drop_outputs(&out, &p);
    drop_inputs(&in, &p);
    fg_context_destroy(ctx);
}

/* ------------------------------------------------------------------ bad lengths */

/* lengths[1] = L + 1: sequence 1's outputs NaN, the others right, and fg_context_check names it. */
static void bad_length(fg_context *ctx, fg_backend be) {
    problem p = {3, 2, 7, 4, false, true, false, true, false, 0, 0, false, false, NULL, NULL};
    inputs in = make_inputs(be, FG_F32, &p);
    in.len[0] = 7, in.len[1] = 8, in.len[2] = 3;
    int64_t raw[3] = {7, 8, 3};
    th_put_raw(&in.lbuf, raw, sizeof raw); /* B = 3: i64 lengths */
    outputs out = make_outputs(be, FG_F32, &p);
    arr_prepare(&out.o, NULL, false), arr_prepare(&out.lse, NULL, false), arr_prepare(&out.sout, NULL, false);
    TH_OK(fg_context_check(ctx));
    TH_OK(run_forward(ctx, &p, &in, &out));
    fg_status s = fg_context_check(ctx);
    TH_CHECK(s == FG_ERR_DEVICE_VALUE && strstr(fg_last_error(), "lengths[1]"), "%s: bad length: %s %s",
             th_backend_name(be), fg_status_string(s), fg_last_error());
    TH_OK(fg_context_check(ctx)); /* cleared */
    th_get(&out.o.buf, &out.o.t, out.o.v);
    const int64_t per = p.H * p.L * p.hd;
    bool nan1 = true;
    for (int64_t i = per; i < 2 * per; i++) nan1 = nan1 && isnan(out.o.v[i]);
    TH_CHECK(nan1, "%s: sequence 1's o is NaN", th_backend_name(be));
    /* the other sequences: as the reference (sequence 1 given length 0 there, then ignored) */
    in.len[1] = 0;
    reference f = ref_alloc(&p);
    ref_forward(&p, in.seed, in.offset, in.q.v, in.k.v, in.v.v, in.len, NULL, &f);
    double e = 0;
    for (int64_t i = 0; i < out.o.n; i++)
        if (i < per || i >= 2 * per) e = fmax(e, fabs(out.o.v[i] - f.o[i]));
    TH_CHECK(e < 1e-5, "%s: sequences 0 and 2 beside a bad length: max error %g", th_backend_name(be), e);
    /* the backward too */
    arr_prepare(&out.dq, NULL, false);
    TH_OK(run_backward(ctx, &p, &in, &out, 1u, 0));
    s = fg_context_check(ctx);
    TH_CHECK(s == FG_ERR_DEVICE_VALUE && strstr(fg_last_error(), "lengths[1]"), "%s: bad length (backward): %s",
             th_backend_name(be), fg_status_string(s));
    th_get(&out.dq.buf, &out.dq.t, out.dq.v);
    TH_CHECK(isnan(out.dq.v[per]) && isnan(out.dq.v[2 * per - 1]) && !isnan(out.dq.v[0]),
             "%s: backward: sequence 1's dq is NaN, sequence 0's is not", th_backend_name(be));
    ref_free(&f);
    drop_outputs(&out, &p);
    drop_inputs(&in, &p);
}

/* ------------------------------------------------------------------ unseen keys */

/* Under a causal mask row i never sees the keys past i: an Inf in the last key's k row may make
 * that row's outputs non-finite, and must leave every other row's o and dq exactly as they are
 * with a finite key there (0 · Inf is NaN: a kernel that adds a masked key's zero weight times
 * its k would not). L 42, hd 8: PatchTST's heads. */
static void unseen_key(fg_context *ctx, fg_backend be) {
    problem p = {2, 3, 42, 8, true, false, false, false, false, 0, 0, false, false, NULL, NULL, false};
    inputs in = make_inputs(be, FG_F32, &p);
    outputs out = make_outputs(be, FG_F32, &p);
    const int64_t n = out.dq.n, row = p.hd, last = p.L - 1;
    double *o1 = malloc(sizeof(double) * (size_t)n), *dq1 = malloc(sizeof(double) * (size_t)n);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* head (0, 0)'s last key to +Inf */
            for (int64_t x = 0; x < p.hd; x++) in.k.v[at4(0, 0, last, x, p.H, p.L, p.hd)] = INFINITY;
            th_put(&in.k.buf, &in.k.t, in.k.v);
        }
        arr_prepare(&out.o, NULL, false), arr_prepare(&out.lse, NULL, false), arr_prepare(&out.dq, NULL, false);
        TH_OK(run_forward(ctx, &p, &in, &out));
        TH_OK(run_backward(ctx, &p, &in, &out, 1u, 0));
        th_get(&out.o.buf, &out.o.t, out.o.v);
        th_get(&out.dq.buf, &out.dq.t, out.dq.v);
        if (pass == 0) {
            memcpy(o1, out.o.v, sizeof(double) * (size_t)n), memcpy(dq1, out.dq.v, sizeof(double) * (size_t)n);
            continue;
        }
        int64_t moved = -1;
        for (int64_t e = 0; e < n && moved < 0; e++) {
            if (e / row == last) continue; /* head (0, 0)'s last row sees the Inf */
            const bool same = (o1[e] == out.o.v[e] || (isnan(o1[e]) && isnan(out.o.v[e]))) &&
                              (dq1[e] == out.dq.v[e] || (isnan(dq1[e]) && isnan(out.dq.v[e])));
            if (!same) moved = e;
        }
        TH_CHECK(moved < 0, "%s: an Inf key unseen under the causal mask moved element %lld (o %g -> %g, dq %g -> %g)",
                 th_backend_name(be), (long long)moved, moved >= 0 ? o1[moved] : 0.0, moved >= 0 ? out.o.v[moved] : 0.0,
                 moved >= 0 ? dq1[moved] : 0.0, moved >= 0 ? out.dq.v[moved] : 0.0);
    }
    free(o1), free(dq1);
    drop_outputs(&out, &p);
    drop_inputs(&in, &p);
}

/* dq, dk, dv interleaved in one [B, L, 3, H, hd] buffer (as the encoder keeps its projection's
 * gradient): no element is shared, so the op takes them and writes the bits it writes into three
 * buffers, and every element of the shared buffer; a dk that shares elements with dq (half a head
 * over) is refused, nothing written. The PatchTST shape (the short kernels on CUDA) and a long
 * causal one (the flash kernels for 16-bit types). */
static void interleaved_grads(fg_context *ctx, fg_backend be) {
    static const problem ps[2] = {
        {3, 3, 42, 8, false, false, true, true, true, 0, 0, false, false, NULL, NULL, false},
        {1, 2, 130, 64, true, false, false, false, false, 0, 0, false, false, NULL, NULL, false},
    };
    for (int pi = 0; pi < 2; pi++)
        for (int di = 0; di < 4; di++) {
            const fg_dtype dt = th_dtypes[di];
            if (be == FG_BACKEND_CUDA && dt == FG_F64) continue; /* f64 runs on the CPU backend */
            const problem *p = &ps[pi];
            inputs in = make_inputs(be, dt, p);
            outputs out = make_outputs(be, dt, p);
            TH_OK(run_forward(ctx, p, &in, &out));
            arr_prepare(&out.dq, NULL, false), arr_prepare(&out.dk, NULL, false), arr_prepare(&out.dv, NULL, false);
            TH_OK(run_backward(ctx, p, &in, &out, 7u, 0));
            th_get(&out.dq.buf, &out.dq.t, out.dq.v), th_get(&out.dk.buf, &out.dk.t, out.dk.v);
            th_get(&out.dv.buf, &out.dv.t, out.dv.v);
            const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd, n = B * H * L * hd;
            th_buf all = th_alloc(be, dt, 3 * n + 3 * H * hd + 4); /* (a spare token for the refusal below) */
            th_poison(&all);
            outputs il = out;
            il.dq = arr_strided(&all, 0, 3, B, H, L, hd), il.dk = arr_strided(&all, 1, 3, B, H, L, hd);
            il.dv = arr_strided(&all, 2, 3, B, H, L, hd);
            TH_OK(run_backward(ctx, p, &in, &il, 7u, 0));
            arr *sep[3] = {&out.dq, &out.dk, &out.dv}, *shr[3] = {&il.dq, &il.dk, &il.dv};
            int64_t diff = 0;
            for (int g = 0; g < 3; g++) {
                th_get(&all, &shr[g]->t, shr[g]->v);
                for (int64_t e = 0; e < n; e++)
                    diff += !(sep[g]->v[e] == shr[g]->v[e] || (isnan(sep[g]->v[e]) && isnan(shr[g]->v[e])));
            }
            TH_CHECK(diff == 0, "%s %s L %lld hd %lld: interleaved dq, dk, dv differ from separate ones in %lld elements",
                     th_backend_name(be), fg_dtype_name(dt), (long long)L, (long long)hd, (long long)diff);
            /* every element of the buffer written (none left NaN where the separate run has a number) */
            const int64_t whole[1] = {3 * n};
            const fg_tensor flat = th_tensor(&all, 0, 1, whole, NULL);
            double *v = malloc(sizeof(double) * (size_t)(3 * n));
            th_get(&all, &flat, v);
            int64_t left = 0;
            for (int64_t e = 0; e < 3 * n; e++) left += isnan(v[e]);
            int64_t want = 0;
            for (int g = 0; g < 3; g++)
                for (int64_t e = 0; e < n; e++) want += isnan(sep[g]->v[e]);
            TH_CHECK(left == want, "%s %s: %lld NaN in the shared buffer, the separate outputs have %lld",
                     th_backend_name(be), fg_dtype_name(dt), (long long)left, (long long)want);
            free(v);
            /* a dk half a head over dq's elements */
            outputs bad = il;
            bad.dk = arr_strided(&all, 0, 3, B, H, L, hd);
            bad.dk.t.data = (char *)bad.dk.t.data + (size_t)(hd / 2) * fg_dtype_size(dt);
            arr probe;
            memset(&probe, 0, sizeof probe);
            probe.buf = all;
            TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", &probe, run_backward(ctx, p, &in, &bad, 7u, 0));
            /* ... and one whole token over: dq's next row, an element the offset reaches only through L */
            bad.dk.t.data = (char *)il.dq.t.data + (size_t)(3 * H * hd) * fg_dtype_size(dt);
            if (L > 1) TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", &probe, run_backward(ctx, p, &in, &bad, 7u, 0));
            arr_drop(&bad.dk);
            for (int g = 0; g < 3; g++) arr_drop(shr[g]);
            th_free(&all);
            drop_outputs(&out, p);
            drop_inputs(&in, p);
        }
}

/* ------------------------------------------------------------------ bad input */

static void bad_input(fg_context *ctx, fg_backend be) {
    problem p = {2, 2, 5, 4, false, true, true, true, true, 0, 0, false, false, NULL, NULL};
    inputs in = make_inputs(be, FG_F32, &p);
    outputs out = make_outputs(be, FG_F32, &p);
    th_poison(&out.o.buf);
    fg_attention_options o = opts_of(&p, &in);
    const fg_tensor *len = &in.len_t;
#define FWD(opt, q, k, v, sin, lse) \
    fg_attention_forward(ctx, opt, q, k, v, len, sin, &out.o.t, lse, &out.sout.t)
    TH_EXPECT_BAD(FG_OK, "", &out.dq, FWD(&o, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    th_poison(&out.o.buf);
    fg_tensor k2 = in.k.t;
    k2.shape[2] = 4;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "k is", &out.o, FWD(&o, &in.q.t, &k2, &in.v.t, &in.sin.t, &out.lse.t));
    fg_tensor v2 = in.v.t;
    v2.dtype = FG_F64;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "v is f64", &out.o, FWD(&o, &in.q.t, &in.k.t, &v2, &in.sin.t, &out.lse.t));
    fg_tensor q3 = in.q.t;
    q3.rank = 3;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "q", &out.o, FWD(&o, &q3, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    fg_tensor s2 = in.sin.t;
    s2.dtype = FG_BF16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "scores_in", &out.o, FWD(&o, &in.q.t, &in.k.t, &in.v.t, &s2, &out.lse.t));
    fg_tensor s3 = in.sin.t;
    s3.shape[3] = 4;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "scores_in", &out.o, FWD(&o, &in.q.t, &in.k.t, &in.v.t, &s3, &out.lse.t));
    fg_tensor l2 = out.lse.t;
    l2.dtype = FG_F16;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "lse", &out.o, FWD(&o, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &l2));
    fg_attention_options bad = o;
    bad.scale = NAN;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "scale", &out.o, FWD(&bad, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    bad.scale = INFINITY;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "scale", &out.o, FWD(&bad, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    bad = o, bad.causal = 2;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "causal", &out.o, FWD(&bad, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    bad = o, bad.dropout_p = 1.0;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout_p", &out.o,
                  FWD(&bad, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    bad.dropout_p = -0.1;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "dropout_p", &out.o,
                  FWD(&bad, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    const fg_tensor *save = len;
    fg_tensor lf = in.len_t;
    lf.dtype = FG_F32;
    len = &lf;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "lengths", &out.o, FWD(&o, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    fg_tensor ls = in.len_t;
    ls.shape[0] = 3;
    len = &ls;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "lengths", &out.o, FWD(&o, &in.q.t, &in.k.t, &in.v.t, &in.sin.t, &out.lse.t));
    len = save;
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "ctx", &out.o,
                  fg_attention_forward(NULL, &o, &in.q.t, &in.k.t, &in.v.t, len, NULL, &out.o.t, &out.lse.t, NULL));
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "lse", &out.o,
                  fg_attention_forward(ctx, &o, &in.q.t, &in.k.t, &in.v.t, len, NULL, &out.o.t, NULL, NULL));
    /* an output overlapping an input */
    fg_tensor oo = out.o.t;
    oo.data = in.q.t.data;
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", &in.k,
                  fg_attention_forward(ctx, &o, &in.q.t, &in.k.t, &in.v.t, len, NULL, &oo, &out.lse.t, NULL));
#undef FWD
    /* backward */
    TH_OK(run_forward(ctx, &p, &in, &out));
    th_poison(&out.dq.buf);
    TH_EXPECT_BAD(FG_ERR_NULL_POINTER, "dscores_in", &out.dq,
                  fg_attention_backward(ctx, &o, &in.dO.t, NULL, &in.q.t, &in.k.t, &in.v.t, len, NULL, &out.o.t,
                                        &out.lse.t, &out.dq.t, NULL, NULL, &out.dsin.t, 0));
    fg_tensor d2 = out.dk.t;
    d2.shape[3] = 5;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "dk", &out.dq,
                  fg_attention_backward(ctx, &o, &in.dO.t, NULL, &in.q.t, &in.k.t, &in.v.t, len, NULL, &out.o.t,
                                        &out.lse.t, &out.dq.t, &d2, NULL, NULL, 0));
    fg_tensor g2 = in.dsc.t;
    g2.dtype = FG_F64;
    TH_EXPECT_BAD(FG_ERR_DTYPE, "dscores", &out.dq,
                  fg_attention_backward(ctx, &o, &in.dO.t, &g2, &in.q.t, &in.k.t, &in.v.t, len, &in.sin.t, &out.o.t,
                                        &out.lse.t, &out.dq.t, NULL, NULL, NULL, 0));
    drop_outputs(&out, &p);
    drop_inputs(&in, &p);

    /* q and k in pieces: k, dq, dk must have q's pieces; v stays [B, H, L, hd] */
    problem pp = p;
    pp.pieces = 2, pp.sin = pp.dsc = false;
    in = make_inputs(be, FG_F32, &pp);
    out = make_outputs(be, FG_F32, &pp);
    o = opts_of(&pp, &in);
    th_poison(&out.o.buf);
    fg_tensor k4 = in.v.t; /* a 4-D k beside a 5-D q */
    TH_EXPECT_BAD(FG_ERR_SHAPE, "k is", &out.o,
                  fg_attention_forward(ctx, &o, &in.q.t, &k4, &in.v.t, len, NULL, &out.o.t, &out.lse.t, NULL));
    fg_tensor kp = in.k.t;
    kp.shape[3] = 1;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "same pieces", &out.o,
                  fg_attention_forward(ctx, &o, &in.q.t, &kp, &in.v.t, len, NULL, &out.o.t, &out.lse.t, NULL));
    TH_EXPECT_BAD(FG_ERR_SHAPE, "v.rank", &out.o,
                  fg_attention_forward(ctx, &o, &in.q.t, &in.k.t, &in.k.t, len, NULL, &out.o.t, &out.lse.t, NULL));
    fg_tensor q0 = in.q.t;
    q0.shape[3] = 0;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "pieces", &out.o,
                  fg_attention_forward(ctx, &o, &q0, &in.k.t, &in.v.t, len, NULL, &out.o.t, &out.lse.t, NULL));
    TH_OK(fg_attention_forward(ctx, &o, &in.q.t, &in.k.t, &in.v.t, len, NULL, &out.o.t, &out.lse.t, NULL));
    th_poison(&out.dq.buf);
    fg_tensor dq4 = out.dv.t;
    TH_EXPECT_BAD(FG_ERR_SHAPE, "dq is", &out.dq,
                  fg_attention_backward(ctx, &o, &in.dO.t, NULL, &in.q.t, &in.k.t, &in.v.t, len, NULL, &out.o.t,
                                        &out.lse.t, &dq4, &out.dk.t, NULL, NULL, 0));
    /* dk over dq's second piece: refused, nothing written */
    fg_tensor dko = out.dk.t;
    dko.data = (char *)out.dq.t.data + (size_t)(pp.B * pp.L * pp.H * pp.hd) * sizeof(float);
    TH_EXPECT_BAD(FG_ERR_ALIAS, "overlaps", &out.dq,
                  fg_attention_backward(ctx, &o, &in.dO.t, NULL, &in.q.t, &in.k.t, &in.v.t, len, NULL, &out.o.t,
                                        &out.lse.t, &out.dq.t, &dko, NULL, NULL, 0));
    drop_outputs(&out, &pp);
    drop_inputs(&in, &pp);
}

/* ------------------------------------------------------------------ memory */

/* The CPU plan's workspace for L = 4096 is a few K / V copies per thread, far below one [L, L]
 * buffer; the CUDA plans' likewise (per-row sums at most). */
static void workspace_bound(fg_backend be) {
    fg_context_desc d;
    memset(&d, 0, sizeof d);
    d.backend = be;
    d.num_threads = 2;
    fg_context *ctx = NULL;
    TH_OK(fg_context_create(&d, &ctx));
    if (!ctx) return;
    const int64_t L = 4096, hd = 64;
    const fg_dtype dt = be == FG_BACKEND_CUDA ? FG_BF16 : FG_F32;
    for (int fwd = 0; fwd < 2; fwd++) {
        fg_plan_desc pd;
        memset(&pd, 0, sizeof pd);
        const int64_t s4[4] = {1, 2, L, hd}, s3[3] = {1, 2, L};
        fg_tensor q = fg_tensor_make(NULL, dt, 4, s4), lse = fg_tensor_make(NULL, FG_F32, 3, s3);
        if (fwd) {
            pd.op = FG_OP_ATTENTION_FORWARD;
            pd.operands[0] = pd.operands[1] = pd.operands[2] = pd.operands[5] = q;
            pd.operands[6] = lse;
        } else {
            pd.op = FG_OP_ATTENTION_BACKWARD;
            pd.operands[0] = pd.operands[2] = pd.operands[3] = pd.operands[4] = pd.operands[7] = q;
            pd.operands[9] = pd.operands[10] = pd.operands[11] = q;
            pd.operands[8] = lse;
        }
        fg_plan *plan = NULL;
        fg_plan_info info;
        memset(&info, 0, sizeof info);
        TH_OK(fg_plan_create(ctx, &pd, &plan));
        if (plan) TH_OK(fg_plan_info_get(plan, &info));
        fg_plan_destroy(plan);
        TH_CHECK(info.workspace_bytes < (size_t)(L * L), "%s %s L=%lld: workspace %zu bytes (an [L, L] f32 buffer is %lld)",
                 th_backend_name(be), fwd ? "forward" : "backward", (long long)L, info.workspace_bytes,
                 (long long)(4 * L * L));
    }
    fg_context_destroy(ctx);
}

/* ------------------------------------------------------------------ the sweep */

#define T true
#define F false
static const problem cases[] = {
    /* B  H  L     hd   causal len sin sout dsc drop scale packed sacc  cuda f16/bf16 · f32/f64 */
    {1, 1, 1, 1, F, F, F, F, F, 0, 0, F, F, "short", "short"},
    {2, 3, 3, 5, F, F, F, T, F, 0, 0, F, F, "short", "short"},
    {2, 2, 17, 8, T, F, F, F, F, 0, 0.3, F, F, "short", "short"},
    {3, 4, 42, 8, F, F, T, T, T, 0, 0, T, F, "short", "short"},        /* PatchTST, d_model 128 */
    {2, 4, 42, 4, F, F, T, T, T, 0.1, 0, F, T, "short", "short"},      /* d_model 16, dropout   */
    {3, 4, 42, 4, F, T, T, T, T, 0, 0, T, F, "short", "short"},        /* d_model 16, the CPU's hd-4 path */
    {2, 3, 17, 4, T, F, T, T, T, 0, 0.3, F, F, "short", "short"},      /* hd 4, causal, one vector */
    {2, 2, 64, 4, F, T, F, T, F, 0, 0, F, F, "short", "short"},        /* hd 4, four vectors */
    {3, 3, 64, 8, T, T, T, T, T, 0.1, 0, F, F, "short", "short"},      /* a lane a key: four slots */
    {3, 3, 48, 7, F, T, T, T, T, 0.1, 0.4, T, T, "short", "short"},    /* a lane a key: odd hd */
    {3, 4, 42, 8, F, F, T, T, T, 0, 0, F, F, "short", "short", T},     /* key-major scores: lanes' own loads */
    {2, 3, 33, 4, T, T, T, T, T, 0.1, 0, T, T, "short", "short", T},   /* the same, every option */
    {4, 16, 42, 8, F, F, T, T, T, 0, 0, F, F, "short", "short"},       /* PatchTST d_model 128: the CPU's hd-8 path */
    {3, 2, 50, 8, T, T, T, T, T, 0, 0.3, T, T, "short", "short"},      /* hd 8, causal, lengths, packed */
    {3, 5, 33, 20, T, T, T, T, T, 0.1, 0, F, T, "short", "short"},     /* thread a row, every option */
    {5, 7, 42, 16, F, T, F, T, T, 0, 0, F, F, "short", "short"},       /* a block's heads past B·H */
    {3, 2, 127, 16, T, T, F, F, F, 0, 0, F, F, "short", "short"},
    {2, 3, 64, 64, F, T, T, F, T, 0.2, 0, F, F, "short", NULL},
    {2, 2, 5, 0, F, T, T, T, F, 0, 0, F, F, NULL, NULL},                /* hd = 0 */
    {2, 3, 100, 64, F, T, F, F, F, 0, 0, F, F, "flash", "short"},      /* flash from L > 64 */
    {1, 2, 129, 32, T, F, F, F, F, 0, 0, F, F, "flash", "tiled"},
    {2, 2, 257, 64, T, T, F, F, F, 0.15, 0, T, F, "flash", "tiled"},  /* flash with dropout */
    {2, 2, 256, 64, T, T, F, F, F, 0.15, 0, F, F, "flash", "tiled"},  /* dropout, L % 4 == 0: lane-shared draws */
    {1, 3, 196, 128, F, F, F, F, F, 0.2, 0, T, F, "flash", "tiled"},  /* the same at hd 128, a ragged tile */
    {2, 1, 132, 32, T, F, F, F, F, 0.1, 0.3, F, F, "flash", "tiled"}, /* the same at hd 32 */
    {2, 1, 300, 64, F, T, F, F, F, 0, 0, T, F, "flash", "tiled"},
    {1, 1, 1030, 64, T, F, F, F, F, 0, 0, F, F, "flash", "tiled"},
    {1, 2, 200, 128, F, F, F, F, F, 0, 0, F, F, "flash", "tiled"},
    {1, 1, 150, 48, T, T, F, F, F, 0, 0, F, F, "tiled", "tiled"},
    {1, 2, 160, 32, T, F, T, T, T, 0.1, 0, F, F, "tiled", "tiled"},
    {2, 2, 100, 96, F, F, F, F, F, 0, 0, F, F, "tiled", "tiled"},
    /* q, k in pieces (PatchTST's residual attention as the layers' products summed) */
    {3, 4, 42, 8, F, F, F, F, F, 0, 0, F, F, "qrow", "qrow", F, 3},     /* the third layer, d_model 128 */
    {2, 4, 42, 4, F, F, T, T, T, 0.1, 0, F, T, "qrow", "qrow", F, 2},   /* d_model 16, scores too, dropout */
    {3, 3, 33, 7, T, T, F, T, F, 0.1, 0.4, F, F, "qrow", "qrow", F, 4}, /* every mask, odd hd */
    {5, 7, 42, 8, F, T, T, F, T, 0, 0, F, T, "qrow", "qrow", F, 2},     /* a block's heads past B·H */
    {2, 2, 17, 16, T, F, F, F, F, 0, 0, F, F, NULL, NULL, F, 2},        /* CUDA: beyond the short kernels */
};
#undef T
#undef F

int main(void) {
    th_init("attention");
    finite_differences();
    fg_backend bes[2];
    const int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        for (int di = 0; di < 4; di++)
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                if (th_dtypes[di] == FG_F64 && cases[c].L > 300) continue; /* the f64 reference's time */
                run_case(ctx, bes[bi], th_dtypes[di], &cases[c]);
            }
        bad_length(ctx, bes[bi]);
        unseen_key(ctx, bes[bi]);
        interleaved_grads(ctx, bes[bi]);
        bad_input(ctx, bes[bi]);
        workspace_bound(bes[bi]);
        fg_context_destroy(ctx);
    }
    return th_finish("attention");
}

/*
 * harness.c — see harness.h. CUDA storage goes through the CUDA runtime when the
 * test was built with it (FG_TEST_HAVE_CUDA); otherwise only the CPU backend runs.
 */
#include "harness.h"
#include "../src/core/rng.h" /* the generator (Philox4x32-10) th_attn_keep draws from */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FG_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int th_failures, th_checks, th_skips, th_unrequested;
static uint64_t rng_state;
const fg_dtype th_dtypes[4] = {FG_F32, FG_F16, FG_BF16, FG_F64};

uint64_t th_rand_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double th_rand(void) { return (double)(th_rand_u64() >> 11) * (2.0 / 9007199254740992.0) - 1.0; }

void th_fill(double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] = 0.25 + 0.75 * th_rand();
}

void th_init(const char *name) {
    const char *env = getenv("FG_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : ((uint64_t)time(NULL) ^ ((uint64_t)clock() << 32));
    rng_state = seed;
    printf("%s: seed %llu (FG_TEST_SEED=%llu replays it)\n", name, (unsigned long long)seed,
           (unsigned long long)seed);
}

int th_finish(const char *name) {
    /* On the GPU machine (scripts/gpu-check.sh sets FG_REQUIRE_CUDA=1) a case that did not run
       is a failure, not a pass. */
    const char *req = getenv("FG_REQUIRE_CUDA");
    if (req && strcmp(req, "1") == 0 && th_skips > 0) {
        fprintf(stderr, "FAIL %s: %d case(s) skipped with FG_REQUIRE_CUDA=1\n", name, th_skips);
        th_failures++;
    }
    printf("%s: %d checks, %d failed, %d skipped", name, th_checks, th_failures, th_skips);
    if (th_unrequested) printf(" (+%d not requested)", th_unrequested);
    printf("\n");
    return th_failures ? 1 : 0;
}

bool th_large(const char *what) {
    if (getenv("FG_TEST_LARGE")) return true;
    printf("SKIP (not requested): %s; set FG_TEST_LARGE=1\n", what);
    th_unrequested++;
    return false;
}

const char *th_backend_name(fg_backend be) { return be == FG_BACKEND_CUDA ? "cuda" : "cpu"; }

int th_backends(fg_backend out[2]) {
    int n = 0;
    out[n++] = FG_BACKEND_CPU;
#ifdef FG_TEST_HAVE_CUDA
    if (fg_backend_available(FG_BACKEND_CUDA)) {
        out[n++] = FG_BACKEND_CUDA;
        return n;
    }
#endif
    printf("SKIP: CUDA backend not available here; its cases did not run\n");
    th_skips++;
    return n;
}

fg_context *th_context(fg_backend be, bool tf32) {
    fg_context_desc d;
    memset(&d, 0, sizeof d);
    d.backend = be;
    d.allow_tf32 = tf32;
    fg_context *ctx = NULL;
    fg_status s = fg_context_create(&d, &ctx);
    if (s != FG_OK) {
        fprintf(stderr, "context_create(%s): %s %s\n", th_backend_name(be), fg_status_string(s), fg_last_error());
        exit(2);
    }
    return ctx;
}

th_buf th_alloc(fg_backend be, fg_dtype dtype, int64_t n) {
    th_buf b = {be, dtype, n, NULL};
    size_t bytes = (size_t)(n > 0 ? n : 1) * fg_dtype_size(dtype);
    if (be == FG_BACKEND_CPU) {
        b.ptr = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    } else {
#ifdef FG_TEST_HAVE_CUDA
        if (cudaMalloc(&b.ptr, bytes) != cudaSuccess) b.ptr = NULL;
#endif
    }
    if (!b.ptr) {
        fprintf(stderr, "test: could not allocate %zu bytes on %s\n", bytes, th_backend_name(be));
        exit(2);
    }
    return b;
}

void th_free(th_buf *b) {
    if (b->be == FG_BACKEND_CPU) free(b->ptr);
#ifdef FG_TEST_HAVE_CUDA
    else cudaFree(b->ptr);
#endif
    b->ptr = NULL;
}

int64_t th_storage(int rank, const int64_t *shape, const int64_t *stride) {
    int64_t last = 0, n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 0) return 0;
        n *= shape[i];
    }
    if (!stride) return n;
    for (int i = 0; i < rank; i++) last += (shape[i] - 1) * stride[i];
    return last + 1;
}

fg_tensor th_tensor(const th_buf *b, int64_t off, int rank, const int64_t *shape, const int64_t *stride) {
    fg_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (char *)b->ptr + off * (int64_t)fg_dtype_size(b->dtype);
    t.dtype = b->dtype;
    t.rank = rank;
    for (int i = 0; i < rank; i++) {
        t.shape[i] = shape[i];
        t.stride[i] = stride ? stride[i] : 0;
    }
    return t;
}

static void to_host(const th_buf *b, void *dst, const void *src, size_t bytes) {
    if (b->be == FG_BACKEND_CPU) memcpy(dst, src, bytes);
#ifdef FG_TEST_HAVE_CUDA
    else if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "test: cudaMemcpy to host failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        exit(2);
    }
#endif
}

static void to_dev(const th_buf *b, void *dst, const void *src, size_t bytes) {
    if (b->be == FG_BACKEND_CPU) memcpy(dst, src, bytes);
#ifdef FG_TEST_HAVE_CUDA
    else if (cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "test: cudaMemcpy to device failed\n");
        exit(2);
    }
#endif
}

static double load(fg_dtype t, const void *p, int64_t i) {
    switch (t) {
    case FG_F32: return ((const float *)p)[i];
    case FG_F64: return ((const double *)p)[i];
    case FG_F16: return fg_f16_to_f32(((const uint16_t *)p)[i]);
    case FG_BF16: return fg_bf16_to_f32(((const uint16_t *)p)[i]);
    }
    return 0;
}

static void store(fg_dtype t, void *p, int64_t i, double v) {
    switch (t) {
    case FG_F32: ((float *)p)[i] = (float)v; break;
    case FG_F64: ((double *)p)[i] = v; break;
    case FG_F16: ((uint16_t *)p)[i] = fg_f32_to_f16((float)v); break;
    case FG_BF16: ((uint16_t *)p)[i] = fg_f32_to_bf16((float)v); break;
    }
}

/* Storage offset of logical element i of t. */
static int64_t offset_of(const fg_tensor *t, int64_t i) {
    int64_t stride[FG_MAX_RANK], s = 1, off = 0;
    for (int d = t->rank - 1; d >= 0; d--) {
        stride[d] = t->stride[d];
        if (stride[d] == 0) {
            bool all_zero = true;
            for (int e = 0; e < t->rank; e++) all_zero = all_zero && t->stride[e] == 0;
            if (all_zero) stride[d] = s;
        }
        s *= t->shape[d];
    }
    for (int d = t->rank - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * stride[d];
        i /= t->shape[d];
    }
    return off;
}

static int64_t numel(const fg_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->shape[d];
    return n;
}

void th_put_raw(const th_buf *b, const void *host, size_t bytes) { to_dev(b, b->ptr, host, bytes); }
void th_get_raw(const th_buf *b, void *host, size_t bytes) { to_host(b, host, b->ptr, bytes); }

void th_put(const th_buf *b, const fg_tensor *t, const double *vals) {
    size_t es = fg_dtype_size(b->dtype), bytes = (size_t)b->n * es;
    char *host = malloc(bytes ? bytes : 1);
    to_host(b, host, b->ptr, bytes);
    int64_t base = ((char *)t->data - (char *)b->ptr) / (int64_t)es, n = numel(t);
    for (int64_t i = 0; i < n; i++) store(b->dtype, host, base + offset_of(t, i), vals[i]);
    to_dev(b, b->ptr, host, bytes);
    free(host);
}

void th_get(const th_buf *b, const fg_tensor *t, double *vals) {
    size_t es = fg_dtype_size(b->dtype), bytes = (size_t)b->n * es;
    char *host = malloc(bytes ? bytes : 1);
    to_host(b, host, b->ptr, bytes);
    int64_t base = ((char *)t->data - (char *)b->ptr) / (int64_t)es, n = numel(t);
    for (int64_t i = 0; i < n; i++) vals[i] = load(b->dtype, host, base + offset_of(t, i));
    free(host);
}

void th_poison(th_buf *b) {
    size_t es = fg_dtype_size(b->dtype), bytes = (size_t)b->n * es;
    char *host = malloc(bytes ? bytes : 1);
    for (int64_t i = 0; i < b->n; i++) store(b->dtype, host, i, NAN);
    to_dev(b, b->ptr, host, bytes);
    free(host);
}

void *th_snapshot(const th_buf *b) {
    size_t bytes = (size_t)b->n * fg_dtype_size(b->dtype);
    void *host = malloc(bytes ? bytes : 1);
    to_host(b, host, b->ptr, bytes);
    return host;
}

bool th_unchanged(const th_buf *b, const void *snap) {
    void *now = th_snapshot(b);
    bool same = memcmp(now, snap, (size_t)b->n * fg_dtype_size(b->dtype)) == 0;
    free(now);
    return same;
}

void th_restore(th_buf *b, const void *snap) {
    to_dev(b, b->ptr, snap, (size_t)b->n * fg_dtype_size(b->dtype));
}

void th_round(fg_dtype dtype, double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (dtype == FG_F32) v[i] = (float)v[i];
        else if (dtype == FG_F16) v[i] = fg_f16_to_f32(fg_f32_to_f16((float)v[i]));
        else if (dtype == FG_BF16) v[i] = fg_bf16_to_f32(fg_f32_to_bf16((float)v[i]));
    }
}

double th_relerr(const double *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(out[i]) || isinf(out[i])) return INFINITY;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double th_tol(fg_dtype dtype, bool tf32) {
    if (tf32 && dtype == FG_F32) return 1e-3;
    switch (dtype) {
    case FG_F64: return 1e-12;
    case FG_F32: return 1e-5;
    default: return 1e-2;
    }
}

th_operand th_make(fg_backend be, fg_dtype dt, int rank, const int64_t *shape, int layout) {
    th_operand o;
    int64_t stride[FG_MAX_RANK];
    const int64_t *sp = NULL;
    int64_t off = layout == 3 ? 1 : 0;
    if (layout == 1 && rank >= 2) {
        int64_t s = 1;
        for (int d = rank - 1; d >= 0; d--) {
            stride[d] = s;
            s *= shape[d] + (d == rank - 1 ? 3 : 0);
        }
        sp = stride;
    } else if (layout == 2 && rank >= 2) {
        int64_t s = 1;
        stride[rank - 2] = 1;
        stride[rank - 1] = shape[rank - 2] > 0 ? shape[rank - 2] : 1;
        s = stride[rank - 1] * (shape[rank - 1] > 0 ? shape[rank - 1] : 1);
        for (int d = rank - 3; d >= 0; d--) {
            stride[d] = s;
            s *= shape[d] > 0 ? shape[d] : 1;
        }
        sp = stride;
    }
    o.n = 1;
    for (int d = 0; d < rank; d++) o.n *= shape[d];
    o.buf = th_alloc(be, dt, th_storage(rank, shape, sp) + off + 4);
    o.t = th_tensor(&o.buf, off, rank, shape, sp);
    o.v = calloc((size_t)(o.n ? o.n : 1), sizeof(double));
    return o;
}

void th_randomize(th_operand *o) {
    th_fill(o->v, o->n);
    th_round(o->buf.dtype, o->v, o->n);
    th_put(&o->buf, &o->t, o->v);
}

void th_drop(th_operand *o) {
    th_free(&o->buf);
    free(o->v);
}

void th_prepare_out(th_operand *o, double *ref, int accumulate) {
    th_poison(&o->buf);
    if (!accumulate) return;
    /* the prior takes each reference value's sign, so old + new never cancels: on an output
       of one or a few elements a cancelling prior leaves a tiny reference whose relative
       error measures the cancellation, not the kernel (test_outer, m = 1, failed 1e-5 so) */
    th_fill(o->v, o->n);
    for (int64_t i = 0; i < o->n; i++)
        if (o->v[i] * ref[i] < 0) o->v[i] = -o->v[i];
    th_round(o->buf.dtype, o->v, o->n);
    th_put(&o->buf, &o->t, o->v);
    for (int64_t i = 0; i < o->n; i++) ref[i] += o->v[i];
}

double th_unit(fg_dtype dt, double v) {
    const int bits = dt == FG_BF16 ? 8 : dt == FG_F16 ? 11 : 0, emin = dt == FG_BF16 ? -125 : -13;
    if (!bits) return 0;
    int e = 0;
    frexp(v, &e);
    return ldexp(1.0, (v != 0 && e > emin ? e : emin) - bits);
}

void th_verify(const char *what, th_operand *o, const double *ref, double tol, const char *label) {
    th_verify_slack(what, o, ref, NULL, tol, label);
}

/* The dtype's smallest normal */
static double tiny_of(fg_dtype t) {
    return t == FG_F16 ? 6.103515625e-05 : t == FG_F64 ? 2.2250738585072014e-308 : 1.1754943508222875e-38;
}

void th_check_elements(const char *what, const th_operand *o, const double *got, const double *ref,
                       const double *slack, double tol, const char *label) {
    if (!(o->buf.dtype == FG_F16 || o->buf.dtype == FG_BF16) || o->n <= 0) return;
    const double tiny = tiny_of(o->buf.dtype);
    double mean = 0;
    for (int64_t i = 0; i < o->n; i++) mean += fabs(ref[i]);
    mean /= (double)o->n;
    if (mean < tiny) mean = tiny;
    int64_t bad = -1, count = 0;
    for (int64_t i = 0; i < o->n; i++)
        if (!(fabs(got[i] - ref[i]) <= 4 * tol * (fabs(ref[i]) + mean) + (slack ? slack[i] : 0))) {
            if (bad < 0) bad = i;
            count++;
        }
    TH_CHECK(bad < 0, "%s %s: %lld elements off by more than 4·tol·(|ref| + mean|ref|), first %lld: got %.6g ref %.6g",
             what, label, (long long)count, (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
}

void th_margin(const char *what, const char *label, double err, double tol) {
    static int verbose = -1; /* FG_TEST_VERBOSE=1: every check's error against its tolerance (margins) */
    if (verbose < 0) verbose = getenv("FG_TEST_VERBOSE") != NULL;
    if (verbose) printf("  %s %s: relerr %.3g (tol %.3g)\n", what, label, err, tol);
}

void th_verify_slack(const char *what, th_operand *o, const double *ref, const double *slack, double tol,
                     const char *label) {
    double *got = malloc((size_t)(o->n ? o->n : 1) * sizeof(double));
    th_get(&o->buf, &o->t, got);
    double err = th_relerr(got, ref, o->n);
    /* An output whose norm is below the dtype's smallest normal lives in its subnormal range,
       where the format's spacing is fixed (f16: 6e-8), not relative: there the error is
       measured against that normal, as the format's resolution allows (seen: one f16 element of
       8.1e-7, off by 2.3e-8, in a 1 × 1 × 1 layer on the CPU). */
    const double tiny = tiny_of(o->buf.dtype);
    double ref_norm = 0;
    for (int64_t i = 0; i < o->n; i++) ref_norm += ref[i] * ref[i];
    ref_norm = sqrt(ref_norm);
    if (isfinite(err) && o->n > 0 && ref_norm > 0 && ref_norm < tiny) err *= ref_norm / tiny;
    th_margin(what, label, err, tol);
    TH_CHECK(err <= tol, "%s %s: relerr %.3g > tol %.3g", what, label, err, tol);
    /* f16 / bf16: besides the norm, every element (one wrong element in 10^4 hides in the
       norm): |out − ref| <= 4·tol·(|ref| + mean |ref|). The mean term covers elements near zero
       that are sums of larger terms; the factor 4 the documented per-element rounding of
       low-precision intermediates (logits rounded to bf16: up to 2^-8 of each; dw summed in
       its own dtype between tiles), seen up to 1.3% of |ref| at tol 1e-2. A dropped term or a
       garbage element is off by far more. */
    th_check_elements(what, o, got, ref, slack, tol, label);
    if (!(err <= tol) && o->n > 0) { /* where it is worst, to tell a bug from a tail */
        int64_t worst = 0;
        double ref_max = 0;
        for (int64_t i = 0; i < o->n; i++) {
            if (!(fabs(got[i] - ref[i]) <= fabs(got[worst] - ref[worst]))) worst = i;
            if (fabs(ref[i]) > ref_max) ref_max = fabs(ref[i]);
        }
        fprintf(stderr, "  worst at %lld of %lld: got %.6g ref %.6g (largest |ref| %.6g)\n", (long long)worst,
               (long long)o->n, got[worst], ref[worst], ref_max);
    }
    free(got);
}

void th_fd_check(fg_context *ctx, const char *label, th_forward_fn forward, void *arg, th_operand *out,
                 const th_operand *r, th_operand **params, th_operand **grads, const char *const *names, int nparams,
                 int trials, bool linear) {
    const double h = linear ? 1e-3 : TH_FD_STEP, tol = linear ? 1e-9 : 1e-8;
    for (int p = 0; p < nparams; p++) {
        th_get(&grads[p]->buf, &grads[p]->t, grads[p]->v);
        int64_t count = trials > 0 ? trials : params[p]->n;
        for (int64_t trial = 0; trial < count; trial++) {
            int64_t i = trials > 0 ? (int64_t)(th_rand_u64() % (uint64_t)params[p]->n) : trial;
            double loss[2], keep = params[p]->v[i];
            for (int s = 0; s < 2; s++) {
                params[p]->v[i] = keep + (s ? -h : h);
                th_put(&params[p]->buf, &params[p]->t, params[p]->v);
                TH_OK(forward(ctx, arg));
                th_get(&out->buf, &out->t, out->v);
                loss[s] = 0;
                for (int64_t e = 0; e < out->n; e++) loss[s] += out->v[e] * r->v[e];
            }
            params[p]->v[i] = keep;
            th_put(&params[p]->buf, &params[p]->t, params[p]->v);
            double fd = (loss[0] - loss[1]) / (2 * h), an = grads[p]->v[i];
            TH_CHECK(fabs(fd - an) <= tol * (1 + fabs(an)), "[%s] finite difference %s[%lld]: %.15g vs %.15g", label,
                     names[p], (long long)i, fd, an);
        }
    }
}

double th_attn_keep(double p, uint64_t seed, uint64_t offset, int64_t i) {
    if (p <= 0.0) return 1.0;
    const uint64_t q = (uint64_t)i / 8;
    const fg_philox4 r = fg_philox4x32_10((uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset, (uint32_t)(offset >> 32),
                                          (uint32_t)seed, (uint32_t)(seed >> 32));
    const uint32_t word = r.v[(i % 8) / 2], bits = i % 2 ? word >> 16 : word & 0xFFFFu;
    return (double)bits / 65536.0 >= p ? 1.0 / (1.0 - p) : 0.0;
}

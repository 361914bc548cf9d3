/*
 * harness.h — what every test driver shares: fresh random seeds (FG_TEST_SEED to
 * replay one), buffers on either backend holding any dtype with any strides, values
 * that go up and come back as float64, NaN poisoning, the relative-error metric and
 * the per-dtype tolerances of DESIGN.md, and checks that count failures and go on.
 */
#ifndef FG_TEST_HARNESS_H
#define FG_TEST_HARNESS_H

#include "fastgrad.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int th_failures, th_checks, th_skips, th_unrequested;

#define TH_CHECK(cond, ...)                                                                   \
    do {                                                                                      \
        th_checks++;                                                                          \
        if (!(cond)) {                                                                        \
            th_failures++;                                                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                              \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
        }                                                                                     \
    } while (0)

#define TH_OK(expr)                                                                           \
    do {                                                                                      \
        fg_status th_s_ = (expr);                                                             \
        TH_CHECK(th_s_ == FG_OK, "%s -> %s: %s", #expr, fg_status_string(th_s_), fg_last_error()); \
    } while (0)

/* The cases past 2^31 elements (minutes, tens of GB of device memory) run only when
 * FG_TEST_LARGE is set: false otherwise, after a SKIP line that counts as not requested
 * (th_unrequested), not as a skipped case, so FG_REQUIRE_CUDA=1 runs under a tool that
 * leaves them out (compute-sanitizer) still pass; gpu-check runs them in its main pass. */
bool th_large(const char *what);
/* Seeds the generator (fresh unless FG_TEST_SEED is set) and prints the seed. */
void th_init(const char *name);
/* Prints the summary; returns the process exit code. */
int th_finish(const char *name);
/* Uniform in [-1, 1). */
double th_rand(void);
/* The attention family's dropout multiplier of flat [B, H, L, L] element i under (p, seed, offset),
 * written out from fastgrad.h's definition (16 bits of Philox4x32-10 an element, eight a call):
 * 1/(1 − p) where kept, else 0; 1 for p <= 0. */
double th_attn_keep(double p, uint64_t seed, uint64_t offset, int64_t i);
/* Test data: uniform in [-0.5, 1). The nonzero mean keeps sums from cancelling, so
 * ‖ref‖ stays comparable to the size of the terms and the dtype tolerances of
 * DESIGN.md measure the kernel, not an ill-conditioned reference (zero-mean data made
 * a 127-term f32 dot product fail 1e-5 about 2% of the time). */
uint64_t th_rand_u64(void);
void th_fill(double *v, int64_t n);

/* Backends present here, CPU first; prints a SKIP line for CUDA when absent. */
int th_backends(fg_backend out[2]);
fg_context *th_context(fg_backend be, bool tf32);
const char *th_backend_name(fg_backend be);

/* Storage on a backend. */
typedef struct th_buf {
    fg_backend be;
    fg_dtype dtype;
    int64_t n;      /* elements of storage */
    void *ptr;      /* host or device */
} th_buf;

th_buf th_alloc(fg_backend be, fg_dtype dtype, int64_t n);
void th_free(th_buf *b);
/* Storage elements needed for a view of that shape and strides (NULL strides: contiguous). */
int64_t th_storage(int rank, const int64_t *shape, const int64_t *stride);
/* A tensor viewing b at element offset `off`. NULL strides: contiguous (all-zero in the
 * descriptor, exercising the default). */
fg_tensor th_tensor(const th_buf *b, int64_t off, int rank, const int64_t *shape, const int64_t *stride);
/* Writes the logical values (row-major, fg_numel of t) through t's view. */
void th_put(const th_buf *b, const fg_tensor *t, const double *vals);
/* Raw bytes to / from the start of the storage (integer tensors, bit comparisons). */
void th_put_raw(const th_buf *b, const void *host, size_t bytes);
void th_get_raw(const th_buf *b, void *host, size_t bytes);
/* Reads t's logical values back as float64. */
void th_get(const th_buf *b, const fg_tensor *t, double *vals);
/* Fills all storage with NaN. */
void th_poison(th_buf *b);
/* Raw bytes of the storage (caller frees), and whether storage still equals them. */
void *th_snapshot(const th_buf *b);
bool th_unchanged(const th_buf *b, const void *snap);
/* Writes a snapshot back. */
void th_restore(th_buf *b, const void *snap);
/* Rounds values to what dtype can hold. */
void th_round(fg_dtype dtype, double *v, int64_t n);

/* ‖out − ref‖ / ‖ref‖ (absolute when ref is zero); +inf when out has a NaN. */
double th_relerr(const double *out, const double *ref, int64_t n);
/* DESIGN.md: f64 1e-12, f32 1e-5, tf32 1e-3, f16/bf16 1e-2. */
double th_tol(fg_dtype dtype, bool tf32);

extern const fg_dtype th_dtypes[4];

/* ------------------------------------------------------------------ operands */

/* A tensor with its storage and its logical values (row-major float64). */
typedef struct th_operand {
    th_buf buf;
    fg_tensor t;
    double *v;
    int64_t n;
} th_operand;

/* layout 0: contiguous (all-zero strides); 1: rows of the last dim padded by 3;
 * 2: the last two dims stored transposed (column-major matrices); 3: contiguous but
 * starting one element past an aligned address. */
th_operand th_make(fg_backend be, fg_dtype dt, int rank, const int64_t *shape, int layout);
/* Random test data (see th_fill), rounded to the dtype, written to the device. */
void th_randomize(th_operand *o);
void th_drop(th_operand *o);
/* Before an op: NaN everywhere, or (accumulate) random values that ref gains. */
void th_prepare_out(th_operand *o, double *ref, int accumulate);
/* Reads o back and checks relerr against ref. */
void th_verify(const char *what, th_operand *o, const double *ref, double tol, const char *label);
/* dt's spacing at v for f16 / bf16 (the smallest subnormal's below the normals), 0 for f32 / f64:
 * how far a value rounded to dt moves when it lands on the other side of a tie. */
double th_unit(fg_dtype dt, double v);

/* th_verify with a per-element allowance added to the f16 / bf16 element bound: what a documented
 * rounding of an intermediate can move each element by when two correct implementations round
 * it on either side of a tie (e.g. one ulp of each rounded term of a sum). */
void th_verify_slack(const char *what, th_operand *o, const double *ref, const double *slack, double tol,
                     const char *label);

/* Under FG_TEST_VERBOSE, one check's error against its tolerance, in the one format
 * tools/seed-sweep.sh reads; th_verify prints its own, a driver's own checks call this. */
void th_margin(const char *what, const char *label, double err, double tol);

/* th_verify's per-element rule for f16 / bf16 outputs (nothing for f32 / f64) on values got
 * already read back: |got − ref| <= 4·tol·(|ref| + mean |ref|) + slack (slack NULL: none). */
void th_check_elements(const char *what, const th_operand *o, const double *got, const double *ref,
                       const double *slack, double tol, const char *label);

/* Runs `call`, expecting status `want`, `needle` in fg_last_error(), and the storage of
 * operand `out` bit-for-bit untouched. */
#define TH_EXPECT_BAD(want, needle, out, call)                                                               \
    do {                                                                                                     \
        void *snap_ = th_snapshot(&(out)->buf);                                                              \
        fg_status s_ = (call);                                                                               \
        TH_CHECK(s_ == (want), "%s: got %s (%s), want %s", #call, fg_status_string(s_), fg_last_error(),     \
                 fg_status_string(want));                                                                    \
        TH_CHECK(strstr(fg_last_error(), needle) != NULL, "%s: message '%s' does not name '%s'", #call,      \
                 fg_last_error(), needle);                                                                   \
        TH_CHECK(th_unchanged(&(out)->buf, snap_), "%s: output was written", #call);                        \
        free(snap_);                                                                                         \
    } while (0)


/* Finite differences in f64: with L = Σ out·r and `forward` recomputing out from the
 * params, checks grads[p] (computed by the backward kernels with dy = r) at `trials`
 * random coordinates of each param (every coordinate when trials <= 0). Step
 * TH_FD_STEP; for ops linear in each param the central difference is exact up to
 * rounding (tolerance 1e-9), otherwise its truncation error is ~h²·f‴/6 ≈ 1e-11 and
 * rounding ~1e-16/h ≈ 1e-11: tolerance 1e-8, relative to 1 + |gradient|. */
#define TH_FD_STEP 1e-5
typedef fg_status (*th_forward_fn)(fg_context *ctx, void *arg);
void th_fd_check(fg_context *ctx, const char *label, th_forward_fn forward, void *arg, th_operand *out,
                 const th_operand *r, th_operand **params, th_operand **grads, const char *const *names, int nparams,
                 int trials, bool linear);
#endif

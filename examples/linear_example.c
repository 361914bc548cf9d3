/*
 * linear_example.c — the README's example as a program: a Linear layer's forward and
 * its three backward kernels through the C API on the CPU backend (for CUDA, set
 * desc.backend and pass device pointers: the library never allocates for you).
 * Prints a value checked by hand and what a bad call returns; ctest runs it.
 */
#include "fastgrad.h"

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        fg_status s_ = (call);                                                               \
        if (s_ != FG_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s: %s\n", #call, fg_status_string(s_), fg_last_error()); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(void) {
    enum { B = 4, T = 16, K = 64, M = 32 };
    float *x = malloc(sizeof(float) * B * T * K), *w = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * M);
    float *y = malloc(sizeof(float) * B * T * M), *dy = malloc(sizeof(float) * B * T * M);
    float *dx = malloc(sizeof(float) * B * T * K), *dw = calloc(M * K, sizeof(float)), *db = calloc(M, sizeof(float));
    for (int i = 0; i < B * T * K; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (int i = 0; i < M * K; i++) w[i] = (float)((i * 53) % 97) / 97.0f - 0.5f;
    for (int i = 0; i < M; i++) b[i] = 0.01f * (float)i;
    for (int i = 0; i < B * T * M; i++) dy[i] = (float)((i * 29) % 89) / 89.0f - 0.5f;

    fg_context *ctx;
    fg_context_desc desc = {0}; /* zero = the CPU backend with defaults */
    CHECK(fg_context_create(&desc, &ctx));

    int64_t xs[3] = {B, T, K}, ws[2] = {M, K}, bs[1] = {M}, ys[3] = {B, T, M};
    fg_tensor tx = fg_tensor_make(x, FG_F32, 3, xs), tw = fg_tensor_make(w, FG_F32, 2, ws);
    fg_tensor tb = fg_tensor_make(b, FG_F32, 1, bs), ty = fg_tensor_make(y, FG_F32, 3, ys);
    fg_tensor tdy = fg_tensor_make(dy, FG_F32, 3, ys), tdx = fg_tensor_make(dx, FG_F32, 3, xs);
    fg_tensor tdw = fg_tensor_make(dw, FG_F32, 2, ws), tdb = fg_tensor_make(db, FG_F32, 1, bs);

    CHECK(fg_linear_forward(ctx, &tx, &tw, &tb, &ty));         /* y = x·wᵀ + b          */
    CHECK(fg_linear_backward_input(ctx, &tdy, &tw, &tdx, 0));  /* dx = dy·w             */
    CHECK(fg_linear_backward_weight(ctx, &tdy, &tx, &tdw, 1)); /* dw += dyᵀ·x           */
    CHECK(fg_linear_backward_bias(ctx, &tdy, &tdb, 1));        /* db += Σ dy            */

    /* what a bad call looks like: a status and a message naming the argument */
    fg_tensor bad = tw;
    bad.shape[1] = K + 1;
    fg_status s = fg_linear_forward(ctx, &tx, &bad, &tb, &ty);
    printf("a wrong weight shape gives %s: %s\n", fg_status_string(s), fg_last_error());

    /* y[0][0][0] by hand */
    double ref = b[0];
    for (int k = 0; k < K; k++) ref += (double)x[k] * w[k];
    double sum = 0;
    for (int i = 0; i < M * K; i++) sum += dw[i];
    printf("fastgrad %u.%u.%u: y[0,0,0] = %.6f (by hand %.6f), sum(dw) = %.6f\n", fg_version() >> 16,
           (fg_version() >> 8) & 255u, fg_version() & 255u, y[0], ref, sum);
    int ok = s == FG_ERR_SHAPE && (y[0] - ref) * (y[0] - ref) < 1e-10;
    fg_context_destroy(ctx);
    free(x); free(w); free(b); free(y); free(dy); free(dx); free(dw); free(db);
    return ok ? 0 : 1;
}

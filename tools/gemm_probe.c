/*
 * gemm_probe.c — one-off probe: why does fastgrad-train's patch-embedding Linear ([37632, 16] ·
 * [16, 16]ᵀ + b, f32) take ~0.4 ms a call where the equal-shaped output projection takes 0.04 ms?
 * Times fg_linear_forward at that shape with operands at several alignments and with input values
 * of several kinds (uniform, tiny / subnormal-range, zeros), synchronizing once per 200 calls.
 */
#include <cuda_runtime.h>
#include <fastgrad.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void) {
    fg_context *ctx;
    fg_context_desc d = {FG_BACKEND_CUDA, 0, NULL, 0, 0};
    if (fg_context_create(&d, &ctx) != FG_OK) return 1;
    const int64_t T = 37632, K = 16, N = 16;
    char *arena;
    cudaMalloc((void **)&arena, 64 << 20);
    float *h = malloc(sizeof(float) * T * K);
    const int kinds = 4;
    const char *kname[] = {"uniform", "1e-30 (subnormal products)", "zeros", "patch-like (series, 1e-38 pad)"};
    const int64_t offs[][4] = {{0, 0, 0, 0}, {64, 128, 1152, 0}, {0, 128, 1152, 0}, {64, 0, 0, 0}};
    for (int kind = 0; kind < kinds; kind++) {
        for (int64_t i = 0; i < T * K; i++) {
            const float u = (float)rand() / RAND_MAX - 0.5f;
            h[i] = kind == 0 ? u : kind == 1 ? u * 1e-30f : kind == 2 ? 0.f : (i % 16 == 15 ? 1e-38f : u);
        }
        for (int o = 0; o < 4; o++) {
            float *x = (float *)(arena + offs[o][0]), *w = (float *)(arena + (16 << 20) + offs[o][1]);
            float *b = (float *)(arena + (17 << 20) + offs[o][2]), *y = (float *)(arena + (18 << 20) + offs[o][3]);
            cudaMemcpy(x, h, sizeof(float) * T * K, cudaMemcpyHostToDevice);
            cudaMemcpy(w, h, sizeof(float) * K * N, cudaMemcpyHostToDevice);
            cudaMemcpy(b, h, sizeof(float) * N, cudaMemcpyHostToDevice);
            const int64_t sx[2] = {T, K}, sw[2] = {N, K}, sb[1] = {N}, sy[2] = {T, N};
            fg_tensor tx = fg_tensor_make(x, FG_F32, 2, sx), tw = fg_tensor_make(w, FG_F32, 2, sw);
            fg_tensor tb = fg_tensor_make(b, FG_F32, 1, sb), ty = fg_tensor_make(y, FG_F32, 2, sy);
            for (int i = 0; i < 20; i++)
                if (fg_linear_forward(ctx, &tx, &tw, &tb, &ty) != FG_OK) return 2;
            cudaDeviceSynchronize();
            double t0 = now();
            for (int i = 0; i < 200; i++)
                if (fg_linear_forward(ctx, &tx, &tw, &tb, &ty) != FG_OK) return 2;
            cudaDeviceSynchronize();
            const double per = (now() - t0) / 200 * 1e3;
            /* one call synchronized, as the train profile times it */
            t0 = now();
            for (int i = 0; i < 50; i++) {
                if (fg_linear_forward(ctx, &tx, &tw, &tb, &ty) != FG_OK) return 2;
                cudaDeviceSynchronize();
            }
            printf("probe: %-30s offsets x %lld w %lld b %lld y %lld: %.4f ms/call queued, %.4f ms synced  %s\n",
                   kname[kind], (long long)offs[o][0], (long long)offs[o][1], (long long)offs[o][2],
                   (long long)offs[o][3], per, (now() - t0) / 50 * 1e3, fg_context_last_kernels(ctx));
            /* the bias-free product and the output-projection-like call */
            t0 = now();
            for (int i = 0; i < 200; i++)
                if (fg_linear_forward(ctx, &tx, &tw, NULL, &ty) != FG_OK) return 2;
            cudaDeviceSynchronize();
            printf("probe:   no bias: %.4f ms/call queued  %s\n", (now() - t0) / 200 * 1e3, fg_context_last_kernels(ctx));
        }
    }
    fg_context_destroy(ctx);
    return 0;
}

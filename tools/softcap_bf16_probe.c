/*
 * softcap_bf16_probe.c — the accuracy of softcap's bf16 math (src/cpu/vec.h's
 * fg_z_softcap_bf16 / fg_z_softcap_slope_bf16) over every one of the 65536 bf16 inputs, for a
 * few c, against long double: the f32 results' largest relative error (the claim in vec.h's
 * comments), the special values (NaN, ±inf, ±0, subnormal x), and, through the public API
 * (fg_unary_forward / fg_unary_backward on bf16 tensors, dy = 1, so that the library's AVX-512
 * bf16 rows run where the CPU has them), the bf16 outputs' largest error in bf16 ulps of the
 * exact value. Run it after changing either function's coefficients; it exits 1 when an f32
 * error passes the bound given on the command line (default 2^-12) or a special value is wrong.
 *
 *   cc -std=gnu11 -O2 -Iinclude -Isrc/cpu tools/softcap_bf16_probe.c -Lbuild-cpu -lfastgrad \
 *      -Wl,-rpath,build-cpu -lm -o /tmp/softcap_bf16_probe && /tmp/softcap_bf16_probe [bound]
 */
#include "vec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef FG_Z
int main(void) {
    printf("softcap_bf16_probe: needs x86-64 and GCC (vec.h's AVX-512 helpers)\n");
    return 0;
}
#else

static float bf(uint16_t h) { return fg_v_bf16_to_f32(h); }

static long double ref_f(long double c, long double x) { return c * tanhl(x / c); }

/* 1 − tanh²(x/c) without cancellation: 4e/(1 + e)², e = e^(−2|x/c|) */
static long double ref_df(long double c, long double x) {
    const long double e = expl(-2 * fabsl(x / c));
    return 4 * e / ((1 + e) * (1 + e));
}

/* bf16's spacing at v (subnormal spacing below 2^-126) */
static long double bf16_ulp(long double v) {
    int e = 0;
    frexpl(v, &e);
    return ldexpl(1.0L, (v != 0 && e > -125 ? e : -125) - 8);
}

__attribute__((target(FG_Z_ISA))) static void math16(const float *x, const fg_softcap_bf16_k *k, float inv_c, float *y,
                                                     float *s) {
    const __m512 v = _mm512_loadu_ps(x);
    _mm512_storeu_ps(y, fg_z_softcap_bf16(v, k));
    _mm512_storeu_ps(s, fg_z_softcap_slope_bf16(v, inv_c));
}

int main(int argc, char **argv) {
    const double bound = argc > 1 ? atof(argv[1]) : 0x1p-12;
    if (!fg_z_usable()) {
        printf("softcap_bf16_probe: this CPU lacks the AVX-512 set of the bf16 rows; nothing to measure\n");
        return 0;
    }
    static const double cs[] = {0.7, 1.0, 3.0, 30.0, 1e-3, 1e4, 0x1p-28, 0x1p28};
    int bad = 0;
    fg_context *ctx = NULL;
    if (fg_context_create(NULL, &ctx) != FG_OK) return 1;
    const int64_t n = 65536;
    uint16_t *xs = malloc(n * 2), *ys = malloc(n * 2), *dys = malloc(n * 2), *dxs = malloc(n * 2);
    for (int64_t i = 0; i < n; i++) xs[i] = (uint16_t)i, dys[i] = 0x3f80; /* every bf16; dy = 1 */
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const float c = (float)cs[ci], inv_c = (float)(1.0 / cs[ci]);
        fg_softcap_bf16_k k;
        if (!fg_softcap_bf16_consts(cs[ci], &k)) continue;
        double fwd_rel = 0, slope_rel = 0, fwd_ulp = 0, slope_ulp = 0;
        float fwd_at = 0, slope_at = 0;
        /* f32 results of the math functions */
        for (int64_t i = 0; i < n; i += 16) {
            float x[16], y[16], s[16];
            for (int k = 0; k < 16; k++) x[k] = bf((uint16_t)(i + k));
            math16(x, &k, inv_c, y, s);
            for (int k = 0; k < 16; k++) {
                const float xv = x[k];
                if (isnan(xv)) {
                    if (!isnan(y[k]) || !isnan(s[k])) printf("  c=%g: NaN gives %g, slope %g\n", c, y[k], s[k]), bad = 1;
                    continue;
                }
                if (isinf(xv)) {
                    if (y[k] != copysignf(c, xv) || s[k] != 0) printf("  c=%g: %g gives %g, slope %g\n", c, xv, y[k], s[k]), bad = 1;
                    continue;
                }
                if (fabsf(xv) < 0x1p-126f && y[k] != xv) printf("  c=%g: subnormal or zero %g gives %g\n", c, xv, y[k]), bad = 1;
                if (xv == 0 && s[k] != 1) printf("  c=%g: slope at %g is %.9g\n", c, xv, s[k]), bad = 1;
                const long double rf = ref_f(c, xv), rd = ref_df(c, xv);
                if (rf != 0) {
                    const double r = (double)fabsl((y[k] - rf) / rf);
                    if (r > fwd_rel) fwd_rel = r, fwd_at = xv;
                }
                if (rd >= 0x1p-126L) {
                    const double r = (double)fabsl((s[k] - rd) / rd);
                    if (r > slope_rel) slope_rel = r, slope_at = xv;
                }
            }
        }
        /* bf16 outputs of the library's rows */
        fg_tensor tx = fg_tensor_make(xs, FG_BF16, 1, &n), ty = fg_tensor_make(ys, FG_BF16, 1, &n);
        fg_tensor tdy = fg_tensor_make(dys, FG_BF16, 1, &n), tdx = fg_tensor_make(dxs, FG_BF16, 1, &n);
        const double sc[2] = {cs[ci], 0};
        if (fg_unary_forward(ctx, FG_UNARY_SOFTCAP, sc, &tx, &ty) != FG_OK ||
            fg_unary_backward(ctx, FG_UNARY_SOFTCAP, sc, &tdy, &tx, &tdx, 0) != FG_OK) {
            printf("softcap_bf16_probe: %s\n", fg_last_error());
            return 1;
        }
        for (int64_t i = 0; i < n; i++) {
            const float xv = bf(xs[i]);
            if (!isfinite(xv)) continue;
            const long double rf = ref_f(c, xv), rd = ref_df(c, xv);
            const double uf = (double)(fabsl(bf(ys[i]) - rf) / bf16_ulp(rf));
            const double ud = (double)(fabsl(bf(dxs[i]) - rd) / bf16_ulp(rd));
            if (!(uf <= fwd_ulp)) fwd_ulp = uf;
            if (!(ud <= slope_ulp)) slope_ulp = ud;
        }
        printf("c=%-6g f32 relative error: forward %.3g (2^%.2f, at x=%g), slope %.3g (2^%.2f, at x=%g, slopes >= 2^-126);"
               " bf16 outputs: forward %.3f ulp, slope %.3f ulp\n",
               c, fwd_rel, log2(fwd_rel), fwd_at, slope_rel, log2(slope_rel), slope_at, fwd_ulp, slope_ulp);
        if (fwd_rel > bound || slope_rel > bound) bad = 1;
    }
    fg_context_destroy(ctx);
    free(xs), free(ys), free(dys), free(dxs);
    printf("softcap_bf16_probe: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
#endif

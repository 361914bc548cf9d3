/*
 * attn_probe.c — same-process A/B of the CPU attention at fastgrad-train's shape (f32, B = 896,
 * H = 4, L = 42, hd = 4, q/k/v strided from a packed [B, L, 3·H·hd] projection, residual-attention
 * scores [B, H, L, L], scale 0.5) in the trainer's three layer configurations (first: scores out;
 * middle: in and out; last: in; the backward's mirror), for one or more builds of libfastgrad
 * loaded side by side with dlopen and called in turn, so that a busy neighbour slows every build
 * alike. Prints each build's median ms per call and a hash of every output (two builds with the
 * same sums in the same order print the same hashes).
 * Other shapes at build time: -DPROBE_B=256 -DPROBE_H=16 -DPROBE_HD=8 (PatchTST at d_model 128).
 * Build: cc -O2 tools/attn_probe.c -Iinclude -ldl -o attn_probe
 * Run:   ./attn_probe THREADS REPS LIB.so [LIB.so ...] (THREADS 1: the thread's CPU time is timed)
 */
#include "fastgrad.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef PROBE_B
#define PROBE_B 896
#endif
#ifndef PROBE_H
#define PROBE_H 4
#endif
#ifndef PROBE_HD
#define PROBE_HD 4
#endif
enum { B = PROBE_B, H = PROBE_H, L = 42, HD = PROBE_HD, D = H * HD, MAXLIB = 4, MAXREP = 1000 };

typedef fg_status (*ctx_create_fn)(const fg_context_desc *, fg_context **);
typedef fg_status (*fwd_fn)(fg_context *, const fg_attention_options *, const fg_tensor *, const fg_tensor *,
                            const fg_tensor *, const fg_tensor *, const fg_tensor *, const fg_tensor *, const fg_tensor *,
                            const fg_tensor *);
typedef fg_status (*bwd_fn)(fg_context *, const fg_attention_options *, const fg_tensor *, const fg_tensor *,
                            const fg_tensor *, const fg_tensor *, const fg_tensor *, const fg_tensor *, const fg_tensor *,
                            const fg_tensor *, const fg_tensor *, const fg_tensor *, const fg_tensor *, const fg_tensor *,
                            const fg_tensor *, int);
typedef const char *(*err_fn)(void);

typedef struct lib {
    fg_context *ctx;
    fwd_fn fwd;
    bwd_fn bwd;
    err_fn err;
} lib;

static int cpu_clock; /* one thread: the thread's CPU time (time a neighbour takes is not counted) */

static double now(void) {
    struct timespec t;
    clock_gettime(cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* fastgrad-train's head view: [N, H, P, hd] of a [N·P, width] buffer, head h at column h·hd */
static fg_tensor hv(float *base, int which, int64_t width) {
    fg_tensor t;
    memset(&t, 0, sizeof t);
    t.data = base + which * D, t.dtype = FG_F32, t.rank = 4;
    const int64_t shape[4] = {B, H, L, HD}, stride[4] = {L * width, HD, width, 1};
    for (int i = 0; i < 4; i++) t.shape[i] = shape[i], t.stride[i] = stride[i];
    return t;
}

static fg_tensor contiguous(float *p, int rank, const int64_t *shape) {
    fg_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p, t.dtype = FG_F32, t.rank = rank;
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) t.shape[i] = shape[i], t.stride[i] = s, s *= shape[i];
    return t;
}

static uint64_t hash(const float *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + i, 4);
        h = (h ^ u) * 1099511628211ull;
    }
    return h;
}

static float *randu(size_t n, uint64_t *s, float amp) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = amp * ((float)(*s >> 40) / (float)(1 << 24) - 0.5f);
    }
    return p;
}

static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s THREADS REPS LIB.so [LIB.so ...]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[1]), reps = atoi(argv[2]) < MAXREP ? atoi(argv[2]) : MAXREP;
    cpu_clock = threads == 1;
    const int nlib = argc - 3 < MAXLIB ? argc - 3 : MAXLIB;
    lib libs[MAXLIB];
    for (int n = 0; n < nlib; n++) {
        void *h = dlopen(argv[3 + n], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        ctx_create_fn create = (ctx_create_fn)dlsym(h, "fg_context_create");
        libs[n].fwd = (fwd_fn)dlsym(h, "fg_attention_forward");
        libs[n].bwd = (bwd_fn)dlsym(h, "fg_attention_backward");
        libs[n].err = (err_fn)dlsym(h, "fg_last_error");
        fg_context_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.num_threads = threads;
        if (!create || !libs[n].fwd || !libs[n].bwd || create(&cd, &libs[n].ctx) != FG_OK) {
            fprintf(stderr, "%s: no context\n", argv[3 + n]);
            return 1;
        }
    }
    uint64_t seed = 12345;
    const size_t nS = (size_t)B * H * L * L, nT = (size_t)B * L * D;
    float *qkv = randu(3 * nT, &seed, 4.0f), *dof = randu(nT, &seed, 1.0f);
    float *sa = randu(nS, &seed, 2.0f), *sb = randu(nS, &seed, 1.0f), *ga = randu(nS, &seed, 0.1f);
    float *o = calloc(nT, 4), *lse = calloc((size_t)B * H * L, 4), *dqkv = calloc(3 * nT, 4), *dsi = calloc(nS, 4);
    fg_attention_options ao;
    memset(&ao, 0, sizeof ao);
    ao.scale = 0.5;
    const fg_tensor q = hv(qkv, 0, 3 * D), k = hv(qkv, 1, 3 * D), v = hv(qkv, 2, 3 * D), ov = hv(o, 0, D);
    const int64_t ls[3] = {B, H, L}, ss[4] = {B, H, L, L};
    const fg_tensor lt = contiguous(lse, 3, ls);
    const fg_tensor dov = hv(dof, 0, D), dq = hv(dqkv, 0, D), dk = hv(dqkv + nT, 0, D), dv = hv(dqkv + 2 * nT, 0, D);
    const fg_tensor Sa = contiguous(sa, 4, ss), Sb = contiguous(sb, 4, ss), G = contiguous(ga, 4, ss),
                    DSI = contiguous(dsi, 4, ss);
    static double t[MAXLIB][MAXREP];
    double mf[MAXLIB] = {0}, mb[MAXLIB] = {0};
    for (int pass = 0; pass < 6; pass++) { /* forward layers 0, 1, 2; backward layers 2, 1, 0 */
        const bool fwd = pass < 3;
        const int l = fwd ? pass : 5 - pass;
        const fg_tensor *sin = l > 0 ? &Sa : NULL, *sout = l < 2 ? &Sb : NULL, *g = l < 2 ? &G : NULL,
                        *ds = l > 0 ? &DSI : NULL;
        for (int r = 0; r < reps; r++)
            for (int n = 0; n < nlib; n++) {
                lib *b = &libs[n];
                fg_status st;
                const double t0 = now();
                if (fwd) st = b->fwd(b->ctx, &ao, &q, &k, &v, NULL, sin, &ov, &lt, sout);
                else st = b->bwd(b->ctx, &ao, &dov, g, &q, &k, &v, NULL, sin, &ov, &lt, &dq, &dk, &dv, ds, 0);
                t[n][r] = now() - t0;
                if (st != FG_OK) {
                    fprintf(stderr, "%s: %s\n", argv[3 + n], b->err());
                    return 1;
                }
                if (r == reps - 1) { /* the outputs of this build's last call */
                    if (fwd)
                        printf("fwd l%d lib%d  o=%016llx lse=%016llx s=%016llx\n", l, n, (unsigned long long)hash(o, nT),
                               (unsigned long long)hash(lse, (size_t)B * H * L),
                               (unsigned long long)(sout ? hash(sb, nS) : 0));
                    else
                        printf("bwd l%d lib%d  dqkv=%016llx ds=%016llx\n", l, n, (unsigned long long)hash(dqkv, 3 * nT),
                               (unsigned long long)(ds ? hash(dsi, nS) : 0));
                }
            }
        for (int n = 0; n < nlib; n++) {
            qsort(t[n], reps, sizeof **t, cmpd);
            const double med = t[n][reps / 2] * 1e3;
            printf("%s l%d lib%d: %.3f ms (min %.3f)\n", fwd ? "fwd" : "bwd", l, n, med, t[n][0] * 1e3);
            if (fwd) mf[n] += med / 3;
            else mb[n] += med / 3;
        }
    }
    for (int n = 0; n < nlib; n++) printf("lib%d %s: mean fwd %.3f ms, bwd %.3f ms\n", n, argv[3 + n], mf[n], mb[n]);
    return 0;
}

/*
 * fastgrad_bench.c — times each op and sets it beside ceilings measured in the same run.
 *
 *   fastgrad-bench            CUDA when present: ceilings (a bf16 8192³ GEMM through the
 *                             primitive, a device-to-device copy), then every op.
 *   fastgrad-bench --quick    the CPU backend on small shapes (a smoke run: CPU timings
 *                             here are noise, not results).
 *
 * CUDA timing: events around each launch after warm-up, the median of many runs, and
 * inputs rotated among sets that together exceed the L2 cache. Bytes count each input
 * read once and each output written once; a copy counts its read and its write.
 * Lines starting with "CHECK" compare a result with the target of issue #2.
 */
#include "fastgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FG_BENCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MAX_SETS 4

static fg_backend backend = FG_BACKEND_CPU;
static fg_context *ctx;
static int reps = 30;
static double ceil_tflops = 0, ceil_gbs = 0;

static void die(const char *what, fg_status s) {
    fprintf(stderr, "bench: %s: %s %s\n", what, fg_status_string(s), fg_last_error());
    exit(1);
}

/* ------------------------------------------------------------------ memory */

static void *alloc_random(fg_dtype dt, int64_t n, uint64_t seed) {
    size_t es = fg_dtype_size(dt), bytes = (size_t)n * es;
    char *host = malloc(bytes);
    if (!host) die("host allocation", FG_ERR_OUT_OF_MEMORY);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((double)(s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
        if (dt == FG_F32) ((float *)host)[i] = v;
        else if (dt == FG_F64) ((double *)host)[i] = v;
        else if (dt == FG_BF16) ((uint16_t *)host)[i] = fg_f32_to_bf16(v);
        else ((uint16_t *)host)[i] = fg_f32_to_f16(v);
    }
    if (backend == FG_BACKEND_CPU) return host;
#ifdef FG_BENCH_HAVE_CUDA
    void *dev = NULL;
    if (cudaMalloc(&dev, bytes) != cudaSuccess || cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        die("device allocation", FG_ERR_OUT_OF_MEMORY);
    free(host);
    return dev;
#else
    return host;
#endif
}

static void release(void *p) {
    if (backend == FG_BACKEND_CPU) free(p);
#ifdef FG_BENCH_HAVE_CUDA
    else cudaFree(p);
#endif
}

/* ------------------------------------------------------------------ timing */

typedef fg_status (*op_fn)(void *arg, int set);

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Median milliseconds of one call, rotating among `sets` input sets. */
static double time_op(op_fn fn, void *arg, int sets) {
    double t[512];
    int n = reps < 512 ? reps : 512;
    for (int w = 0; w < 3; w++) {
        fg_status s = fn(arg, w % sets);
        if (s != FG_OK) die("warm-up", s);
    }
#ifdef FG_BENCH_HAVE_CUDA
    if (backend == FG_BACKEND_CUDA) {
        cudaEvent_t ev[2 * 512];
        for (int i = 0; i < 2 * n; i++) cudaEventCreate(&ev[i]);
        for (int i = 0; i < n; i++) {
            cudaEventRecord(ev[2 * i], 0);
            fg_status s = fn(arg, i % sets);
            cudaEventRecord(ev[2 * i + 1], 0);
            if (s != FG_OK) die("run", s);
        }
        cudaDeviceSynchronize();
        fg_status s = fg_context_check(ctx);
        if (s != FG_OK) die("context_check", s);
        for (int i = 0; i < n; i++) {
            float ms;
            cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]);
            t[i] = ms;
        }
        for (int i = 0; i < 2 * n; i++) cudaEventDestroy(ev[i]);
        qsort(t, (size_t)n, sizeof t[0], cmp_double);
        return t[n / 2];
    }
#endif
    for (int i = 0; i < n; i++) {
        double t0 = now_ms();
        fg_status s = fn(arg, i % sets);
        if (s != FG_OK) die("run", s);
        t[i] = now_ms() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

static void report(const char *name, const char *shape, fg_dtype dt, double ms, double flops, double bytes) {
    char rate[64] = "", frac[64] = "";
    if (flops > 0) {
        double tf = flops / ms / 1e9;
        snprintf(rate, sizeof rate, "%9.1f TFLOP/s", tf);
        if (ceil_tflops > 0) snprintf(frac, sizeof frac, "%5.1f%% of GEMM ceiling", 100 * tf / ceil_tflops);
    } else {
        double gbs = bytes / ms / 1e6;
        snprintf(rate, sizeof rate, "%9.1f GB/s", gbs);
        if (ceil_gbs > 0) snprintf(frac, sizeof frac, "%5.1f%% of copy ceiling", 100 * gbs / ceil_gbs);
    }
    printf("%-34s %-26s %-5s %10.4f ms %s  %s\n", name, shape, fg_dtype_name(dt), ms, rate, frac);
    fflush(stdout);
}

/* ------------------------------------------------------------------ ops */

typedef struct linear_args {
    int sets;
    fg_tensor x[MAX_SETS], w[MAX_SETS], b[MAX_SETS], y[MAX_SETS], dy[MAX_SETS];
    fg_tensor dx[MAX_SETS], dw[MAX_SETS], db[MAX_SETS];
    int which; /* 0 forward, 1 input, 2 weight, 3 bias, 4 all four */
} linear_args;

static fg_status linear_run(void *p, int s) {
    linear_args *a = p;
    fg_status st = FG_OK;
    if (a->which == 0 || a->which == 4) st = fg_linear_forward(ctx, &a->x[s], &a->w[s], &a->b[s], &a->y[s]);
    if (st == FG_OK && (a->which == 1 || a->which == 4)) st = fg_linear_backward_input(ctx, &a->dy[s], &a->w[s], &a->dx[s], 0);
    if (st == FG_OK && (a->which == 2 || a->which == 4)) st = fg_linear_backward_weight(ctx, &a->dy[s], &a->x[s], &a->dw[s], 0);
    if (st == FG_OK && (a->which == 3 || a->which == 4)) st = fg_linear_backward_bias(ctx, &a->dy[s], &a->db[s], 0);
    return st;
}

static fg_tensor t2(void *p, fg_dtype dt, int64_t r, int64_t c) {
    int64_t s[2] = {r, c};
    return fg_tensor_make(p, dt, 2, s);
}

static fg_tensor t1(void *p, fg_dtype dt, int64_t n) { return fg_tensor_make(p, dt, 1, &n); }

/* Linear N×K → M: each kernel alone and the four together. Returns the four's fraction
 * of the GEMM ceiling. */
static double bench_linear(fg_dtype dt, int64_t n, int64_t k, int64_t m, int sets) {
    linear_args a;
    memset(&a, 0, sizeof a);
    a.sets = sets;
    for (int s = 0; s < sets; s++) {
        a.x[s] = t2(alloc_random(dt, n * k, 10 + s), dt, n, k);
        a.w[s] = t2(alloc_random(dt, m * k, 20 + s), dt, m, k);
        a.b[s] = t1(alloc_random(dt, m, 30 + s), dt, m);
        a.y[s] = t2(alloc_random(dt, n * m, 40 + s), dt, n, m);
        a.dy[s] = t2(alloc_random(dt, n * m, 50 + s), dt, n, m);
        a.dx[s] = t2(alloc_random(dt, n * k, 60 + s), dt, n, k);
        a.dw[s] = t2(alloc_random(dt, m * k, 70 + s), dt, m, k);
        a.db[s] = t1(alloc_random(dt, m, 80 + s), dt, m);
    }
    char shape[64];
    snprintf(shape, sizeof shape, "N=%lld K=%lld M=%lld", (long long)n, (long long)k, (long long)m);
    const double f = 2.0 * n * k * m, es = (double)fg_dtype_size(dt);
    static const char *names[4] = {"linear_forward (+bias)", "linear_backward_input", "linear_backward_weight",
                                   "linear_backward_bias"};
    double total = 0;
    for (int w = 0; w < 4; w++) {
        a.which = w;
        double ms = time_op(linear_run, &a, sets);
        total += ms;
        if (w < 3) report(names[w], shape, dt, ms, f, 0);
        else report(names[w], shape, dt, ms, 0, (double)(n * m + m) * es);
    }
    a.which = 4;
    double ms = time_op(linear_run, &a, sets);
    report("linear fwd + 3 bwd", shape, dt, ms, 3 * f, 0);
    for (int s = 0; s < sets; s++) {
        void *ps[] = {a.x[s].data, a.w[s].data, a.b[s].data, a.y[s].data, a.dy[s].data, a.dx[s].data, a.dw[s].data,
                      a.db[s].data};
        for (int i = 0; i < 8; i++) release(ps[i]);
    }
    return ceil_tflops > 0 ? (3 * f / ms / 1e9) / ceil_tflops : 0;
}

typedef struct gemv_args {
    fg_tensor x[MAX_SETS], w[MAX_SETS], y[MAX_SETS];
    int transposed; /* 0: y = x·wᵀ (forward), 1: y = x·w (backward_input) */
} gemv_args;

static fg_status gemv_run(void *p, int s) {
    gemv_args *a = p;
    if (a->transposed) return fg_linear_backward_input(ctx, &a->x[s], &a->w[s], &a->y[s], 0);
    return fg_linear_forward(ctx, &a->x[s], &a->w[s], NULL, &a->y[s]);
}

/* One row against an m×k weight. Returns the fraction of the copy ceiling. */
static double bench_gemv(fg_dtype dt, int64_t k, int64_t m, int transposed, int sets) {
    gemv_args a;
    memset(&a, 0, sizeof a);
    int64_t in = transposed ? m : k, out = transposed ? k : m;
    for (int s = 0; s < sets; s++) {
        a.x[s] = t2(alloc_random(dt, in, 90 + s), dt, 1, in);
        a.w[s] = t2(alloc_random(dt, m * k, 100 + s), dt, m, k);
        a.y[s] = t2(alloc_random(dt, out, 110 + s), dt, 1, out);
    }
    a.transposed = transposed;
    char shape[64];
    snprintf(shape, sizeof shape, "1x%lld . %lldx%lld%s", (long long)in, (long long)m, (long long)k, transposed ? "" : "^T");
    double ms = time_op(gemv_run, &a, sets);
    double bytes = (double)(m * k + in + out) * (double)fg_dtype_size(dt);
    report(transposed ? "gemv single row: backward_input" : "gemv single row: linear_forward", shape, dt, ms, 0, bytes);
    for (int s = 0; s < sets; s++) {
        release(a.x[s].data);
        release(a.w[s].data);
        release(a.y[s].data);
    }
    return ceil_gbs > 0 ? (bytes / ms / 1e6) / ceil_gbs : 0;
}

typedef struct mm_args {
    fg_tensor a[MAX_SETS], b[MAX_SETS], c[MAX_SETS];
} mm_args;

static fg_status mm_run(void *p, int s) {
    mm_args *a = p;
    return fg_matmul_forward(ctx, &a->a[s], &a->b[s], &a->c[s]);
}

static double bench_matmul(fg_dtype dt, int64_t batch, int64_t m, int64_t k, int64_t n, int sets, const char *name) {
    mm_args a;
    memset(&a, 0, sizeof a);
    for (int s = 0; s < sets; s++) {
        int64_t as[3] = {batch, m, k}, bs[3] = {batch, k, n}, cs[3] = {batch, m, n};
        int r = batch > 1 ? 3 : 2, o = batch > 1 ? 0 : 1;
        a.a[s] = fg_tensor_make(alloc_random(dt, batch * m * k, 120 + s), dt, r, as + o);
        a.b[s] = fg_tensor_make(alloc_random(dt, batch * k * n, 130 + s), dt, r, bs + o);
        a.c[s] = fg_tensor_make(alloc_random(dt, batch * m * n, 140 + s), dt, r, cs + o);
    }
    char shape[64];
    snprintf(shape, sizeof shape, "B=%lld %lldx%lldx%lld", (long long)batch, (long long)m, (long long)k, (long long)n);
    double ms = time_op(mm_run, &a, sets);
    double tf = 2.0 * batch * m * k * n / ms / 1e9;
    report(name, shape, dt, ms, 2.0 * batch * m * k * n, 0);
    for (int s = 0; s < sets; s++) {
        release(a.a[s].data);
        release(a.b[s].data);
        release(a.c[s].data);
    }
    return tf;
}

typedef struct outer_args {
    fg_tensor x[MAX_SETS], y[MAX_SETS], z[MAX_SETS], dx[MAX_SETS], dy[MAX_SETS];
    int which;
} outer_args;

static fg_status outer_run(void *p, int s) {
    outer_args *a = p;
    if (a->which == 0) return fg_outer_forward(ctx, &a->x[s], &a->y[s], &a->z[s]);
    if (a->which == 1) return fg_outer_backward_input(ctx, &a->z[s], &a->y[s], &a->dx[s], 0);
    return fg_outer_backward_other(ctx, &a->z[s], &a->x[s], &a->dy[s], 0);
}

static void bench_outer(fg_dtype dt, int64_t n, int64_t m, int sets) {
    outer_args a;
    memset(&a, 0, sizeof a);
    for (int s = 0; s < sets; s++) {
        a.x[s] = t1(alloc_random(dt, n, 150 + s), dt, n);
        a.y[s] = t1(alloc_random(dt, m, 160 + s), dt, m);
        a.z[s] = t2(alloc_random(dt, n * m, 170 + s), dt, n, m);
        a.dx[s] = t1(alloc_random(dt, n, 180 + s), dt, n);
        a.dy[s] = t1(alloc_random(dt, m, 190 + s), dt, m);
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%lld x %lld", (long long)n, (long long)m);
    static const char *names[3] = {"outer_forward", "outer_backward_input", "outer_backward_other"};
    for (int w = 0; w < 3; w++) {
        a.which = w;
        double ms = time_op(outer_run, &a, sets);
        report(names[w], shape, dt, ms, 0, (double)(n * m + n + m) * (double)fg_dtype_size(dt));
    }
    for (int s = 0; s < sets; s++) {
        void *ps[] = {a.x[s].data, a.y[s].data, a.z[s].data, a.dx[s].data, a.dy[s].data};
        for (int i = 0; i < 5; i++) release(ps[i]);
    }
}

typedef struct lerp_args {
    fg_tensor a, b, y, dy, da, db;
    int backward;
} lerp_args;

static fg_status lerp_run(void *p, int s) {
    lerp_args *a = p;
    (void)s;
    if (a->backward) return fg_lerp_backward(ctx, &a->dy, NULL, NULL, NULL, 0.3, &a->da, &a->db, NULL, 0);
    return fg_lerp_forward(ctx, &a->a, &a->b, NULL, 0.3, &a->y);
}

/* lerp with a scalar weight over n elements: forward reads a, b and writes y; the
 * backward reads dy and writes da and db in one pass. Returns {fwd, bwd} fractions of
 * the copy ceiling. */
static void bench_lerp(fg_dtype dt, int64_t n, double frac[2]) {
    lerp_args a;
    a.a = t1(alloc_random(dt, n, 200), dt, n);
    a.b = t1(alloc_random(dt, n, 201), dt, n);
    a.y = t1(alloc_random(dt, n, 202), dt, n);
    a.dy = a.a, a.da = a.b, a.db = a.y; /* the same buffers, roles swapped: no aliasing within a call */
    char shape[64];
    snprintf(shape, sizeof shape, "n=2^%d", (int)round(log2((double)n)));
    const double bytes = 3.0 * (double)n * (double)fg_dtype_size(dt);
    for (int w = 0; w < 2; w++) {
        a.backward = w;
        double ms = time_op(lerp_run, &a, 1);
        report(w ? "lerp backward (da, db; one pass)" : "lerp forward (scalar w)", shape, dt, ms, 0, bytes);
        frac[w] = ceil_gbs > 0 ? (bytes / ms / 1e6) / ceil_gbs : 0;
    }
    release(a.a.data);
    release(a.b.data);
    release(a.y.data);
}

typedef struct adamw_args {
    int count;
    fg_tensor *p, *g, *m, *v;
    int64_t step;
} adamw_args;

static fg_status adamw_run(void *p, int s) {
    adamw_args *a = p;
    (void)s;
    fg_adamw_hparams hp = {1e-4, 0.9, 0.999, 1e-8, 0.01, ++a->step, 0};
    return fg_adamw_step(ctx, &hp, a->count, a->p, a->g, a->m, a->v, NULL);
}

/* AdamW over `total` f32 parameters split into `count` tensors of log-uniform sizes. */
static void bench_adamw(int64_t total, int count) {
    adamw_args a;
    a.count = count;
    a.step = 0;
    a.p = calloc((size_t)count, sizeof(fg_tensor));
    a.g = calloc((size_t)count, sizeof(fg_tensor));
    a.m = calloc((size_t)count, sizeof(fg_tensor));
    a.v = calloc((size_t)count, sizeof(fg_tensor));
    double *w = malloc(sizeof(double) * (size_t)count), sum = 0;
    uint64_t s = 12345;
    for (int i = 0; i < count; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = exp(log(1e3) + (double)(s >> 11) / 9007199254740992.0 * (log(5e7) - log(1e3)));
        sum += w[i];
    }
    int64_t used = 0;
    for (int i = 0; i < count; i++) {
        int64_t n = i == count - 1 ? total - used : (int64_t)(w[i] / sum * (double)total);
        used += n;
        a.p[i] = t1(alloc_random(FG_F32, n, 300 + i), FG_F32, n);
        a.g[i] = t1(alloc_random(FG_F32, n, 600 + i), FG_F32, n);
        a.m[i] = t1(alloc_random(FG_F32, n, 900 + i), FG_F32, n);
        a.v[i] = t1(alloc_random(FG_F32, n, 1200 + i), FG_F32, n);
    }
    /* exp_avg_sq must be >= 0: square the random values in place with the library's pow */
    for (int i = 0; i < count; i++) {
        fg_status st = fg_unary_forward(ctx, FG_UNARY_POW, (const double[]){2.0}, &a.v[i], &a.v[i]);
        if (st != FG_OK) die("adamw setup", st);
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%.2gB params, %d tensors", (double)total / 1e9, count);
    int keep = reps;
    reps = 10;
    double ms = time_op(adamw_run, &a, 1);
    reps = keep;
    report("adamw_step (f32, fused multi-tensor)", shape, FG_F32, ms, 0, 28.0 * (double)total);
    for (int i = 0; i < count; i++) {
        release(a.p[i].data);
        release(a.g[i].data);
        release(a.m[i].data);
        release(a.v[i].data);
    }
    free(a.p); free(a.g); free(a.m); free(a.v); free(w);
}

#ifdef FG_BENCH_HAVE_CUDA
typedef struct copy_args {
    void *src, *dst;
    size_t bytes;
} copy_args;
#endif

/* ------------------------------------------------------------------ linear + activation */

typedef struct act_args {
    fg_tensor x, w, b, y, pre, dy, dx, dw, db;
    fg_activation act;
    int which; /* 0 forward (pre kept), 1 backward (dx, dw, db), 2 both */
    int recompute; /* 1: the forward keeps nothing, the backward recomputes pre */
} act_args;

static fg_status act_run(void *p, int s) {
    act_args *a = p;
    (void)s;
    fg_status st = FG_OK;
    /* as a training step runs it (the Python layer's save_pre="auto"): relu saves nothing (its
       backward reads y); the others save the slope act′(pre) when K > 128, else pre, and the
       backward forms g in what was saved */
    const int relu = a->act == FG_ACT_RELU, slope = !relu && !a->recompute && a->x.shape[1] > 128;
    if (a->which != 1)
        st = slope ? fg_linear_act_forward_slope(ctx, a->act, &a->x, &a->w, &a->b, &a->y, &a->pre)
                   : fg_linear_act_forward(ctx, a->act, &a->x, &a->w, &a->b, &a->y, relu || a->recompute ? NULL : &a->pre);
    if (st == FG_OK && a->which != 0)
        st = a->recompute ? fg_linear_act_backward(ctx, a->act, &a->dy, NULL, &a->x, &a->w, &a->b, &a->dx, &a->dw, &a->db, 0)
           : relu ? fg_linear_act_backward(ctx, a->act, &a->dy, &a->y, &a->x, &a->w, &a->b, &a->dx, &a->dw, &a->db, 0)
           : slope ? fg_linear_act_backward_slope(ctx, a->act, &a->dy, &a->pre, &a->x, &a->w, &a->b, &a->dx, &a->dw,
                                                  &a->db, 0)
                   : fg_linear_act_backward_consume(ctx, a->act, &a->dy, &a->pre, &a->x, &a->w, &a->b, &a->dx, &a->dw,
                                                    &a->db, 0);
    return st;
}

/* Forward, backward and both at (N, K, M): share of the GEMM ceiling (1, 2, 3 products). */
static void bench_linear_act(fg_dtype dt, int64_t n, int64_t k, int64_t m, fg_activation act, const char *name,
                             int recompute) {
    act_args a;
    memset(&a, 0, sizeof a);
    a.act = act;
    a.recompute = recompute;
    a.x = t2(alloc_random(dt, n * k, 81), dt, n, k);
    a.w = t2(alloc_random(dt, m * k, 82), dt, m, k);
    a.b = t1(alloc_random(dt, m, 83), dt, m);
    a.y = t2(alloc_random(dt, n * m, 84), dt, n, m);
    a.pre = t2(alloc_random(dt, n * m, 85), dt, n, m);
    a.dy = t2(alloc_random(dt, n * m, 86), dt, n, m);
    a.dx = t2(alloc_random(dt, n * k, 87), dt, n, k);
    a.dw = t2(alloc_random(dt, m * k, 88), dt, m, k);
    a.db = t1(alloc_random(dt, m, 89), dt, m);
    char shape[64], label[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)n, (long long)k, (long long)m);
    const char *what[3] = {"fwd (saves for bwd)", "bwd (dx,dw,db)", "fwd+bwd"};
    for (int w = 0; w < 3; w++) {
        a.which = w;
        snprintf(label, sizeof label, "linear_act %s%s %s", name, recompute ? " recompute" : "", what[w]);
        double ms = time_op(act_run, &a, 1);
        report(label, shape, dt, ms, (w == 0 ? 1 : w == 1 ? 2 : 3) * 2.0 * (double)n * (double)k * (double)m, 0);
    }
    release(a.x.data), release(a.w.data), release(a.b.data), release(a.y.data), release(a.pre.data);
    release(a.dy.data), release(a.dx.data), release(a.dw.data), release(a.db.data);
}

/* The backward's two products alone, the sm_90a GEMM (linear_act's split backward with act
 * none: g is dy, no pass) against cuBLASLt's (Linear's backward) at the same shape, each twice
 * in turn so a clock drift shows. */
typedef struct product_args {
    fg_tensor x, w, dy, dx, dw;
    int which; /* 0 own dx, 1 cuBLASLt dx, 2 own dw, 3 cuBLASLt dw */
} product_args;

static fg_status product_run(void *p, int s) {
    product_args *a = p;
    (void)s;
    switch (a->which) {
    case 0: return fg_linear_act_backward_input(ctx, FG_ACT_NONE, &a->dy, NULL, &a->x, &a->w, NULL, &a->dx, 0);
    case 1: return fg_linear_backward_input(ctx, &a->dy, &a->w, &a->dx, 0);
    case 2: return fg_linear_act_backward_weight(ctx, FG_ACT_NONE, &a->dy, NULL, &a->x, &a->w, NULL, &a->dw, 0);
    default: return fg_linear_backward_weight(ctx, &a->dy, &a->x, &a->dw, 0);
    }
}

static void bench_act_products(fg_dtype dt, int64_t n, int64_t k, int64_t m) {
    product_args a;
    memset(&a, 0, sizeof a);
    a.x = t2(alloc_random(dt, n * k, 91), dt, n, k);
    a.w = t2(alloc_random(dt, m * k, 92), dt, m, k);
    a.dy = t2(alloc_random(dt, n * m, 93), dt, n, m);
    a.dx = t2(alloc_random(dt, n * k, 94), dt, n, k);
    a.dw = t2(alloc_random(dt, m * k, 95), dt, m, k);
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)n, (long long)k, (long long)m);
    static const char *names[4] = {"product dx = g.w (own sm_90a)", "product dx = g.w (cuBLASLt)",
                                   "product dw = gT.x (own sm_90a)", "product dw = gT.x (cuBLASLt)"};
    for (int round = 0; round < 2; round++)
        for (int w = 0; w < 4; w++) {
            a.which = w;
            report(names[w], shape, dt, time_op(product_run, &a, 1), 2.0 * (double)n * (double)k * (double)m, 0);
        }
    release(a.x.data), release(a.w.data), release(a.dy.data), release(a.dx.data), release(a.dw.data);
}

/* ------------------------------------------------------------------ linear log-prob */

typedef struct logp_args {
    fg_tensor h, w, t, logp, lse, dlogp, dh, dw, loss;
    fg_logp_options opt;
    int which; /* 0 forward, 1 backward (dh, dw), 2 one-pass cross-entropy (loss, dh, dw) */
} logp_args;

static fg_status logp_run(void *p, int s) {
    logp_args *a = p;
    (void)s;
    if (a->which == 0) return fg_linear_logp_forward(ctx, &a->opt, &a->h, &a->w, NULL, &a->t, &a->logp, &a->lse, NULL);
    if (a->which == 1)
        return fg_linear_logp_backward(ctx, &a->opt, &a->dlogp, NULL, NULL, &a->h, &a->w, NULL, &a->t, &a->lse, NULL,
                                       &a->dh, &a->dw, NULL, 0);
    return fg_linear_cross_entropy(ctx, &a->opt, &a->h, &a->w, NULL, &a->t, NULL, &a->loss, NULL, &a->dh, &a->dw, NULL,
                                   0);
}

/* Forward, split backward and one pass at (N, D, V): time, share of the GEMM ceiling
 * (2·N·D·V flops per product: 1 forward, 3 backward incl. the recompute, 3 one pass)
 * and the workspace the plan asks for. */
static void bench_linear_logp(fg_dtype dt, int64_t n, int64_t d, int64_t v, double out_ms[3], int64_t tile) {
    logp_args a;
    memset(&a, 0, sizeof a);
    a.opt.max_tile_elements = tile;
    a.h = t2(alloc_random(dt, n * d, 71), dt, n, d);
    a.w = t2(alloc_random(dt, v * d, 72), dt, v, d);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) tg[i] = (int32_t)((i * 2654435761u) % (uint64_t)v);
    void *tdev = tg;
#ifdef FG_BENCH_HAVE_CUDA
    if (backend == FG_BACKEND_CUDA) {
        cudaMalloc(&tdev, sizeof(int32_t) * (size_t)n);
        cudaMemcpy(tdev, tg, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice);
        free(tg);
    }
#endif
    a.t = t1(tdev, FG_I32, n);
    a.logp = t1(alloc_random(FG_F32, n, 73), FG_F32, n);
    a.lse = t1(alloc_random(FG_F32, n, 74), FG_F32, n);
    a.dlogp = t1(alloc_random(FG_F32, n, 75), FG_F32, n);
    a.loss = t1(alloc_random(FG_F32, 1, 76), FG_F32, 1);
    a.dh = t2(alloc_random(dt, n * d, 77), dt, n, d);
    a.dw = t2(alloc_random(dt, v * d, 78), dt, v, d);
    char shape[64];
    snprintf(shape, sizeof shape, tile ? "%lldx%lldx%lld t=%lldM" : "%lldx%lldx%lld", (long long)n, (long long)d,
             (long long)v, (long long)(tile >> 20));
    const char *names[3] = {"linear_logp_forward", "linear_logp_backward (dh,dw)", "linear_cross_entropy 1-pass"};
    const double products[3] = {1, 3, 3};
    for (int k = 0; k < 3; k++) {
        a.which = k;
        if (k == 1) { /* a real lse for the backward */
            a.which = 0;
            logp_run(&a, 0);
            a.which = 1;
        }
        double ms = time_op(logp_run, &a, 1);
        report(names[k], shape, dt, ms, products[k] * 2.0 * (double)n * (double)d * (double)v, 0);
        out_ms[k] = ms;
    }
    fg_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    fg_plan *plan;
    size_t ws[3] = {0, 0, 0};
    pd.op = FG_OP_LINEAR_LOGP_BACKWARD;
    pd.options = &a.opt;
    pd.options_size = sizeof a.opt;
    pd.operands[0] = a.dlogp, pd.operands[3] = a.h, pd.operands[4] = a.w, pd.operands[6] = a.t, pd.operands[7] = a.lse;
    pd.operands[9] = a.dh, pd.operands[10] = a.dw;
    if (fg_plan_create(ctx, &pd, &plan) == FG_OK) {
        if (fg_plan_workspace_size(plan, &ws[1]) != FG_OK) ws[1] = 0;
        fg_plan_info info;
        if (fg_plan_info_get(plan, &info) == FG_OK) printf("  backward plan: %s\n", info.kernel);
        fg_plan_destroy(plan);
    }
    printf("  backward workspace %.1f MiB (the logits would be %.1f MiB in f32)\n", ws[1] / 1048576.0,
           (double)n * (double)v * 4 / 1048576.0);
    release(a.h.data), release(a.w.data), release(a.logp.data), release(a.lse.data), release(a.dlogp.data);
    release(a.loss.data), release(a.dh.data), release(a.dw.data), release(tdev);
}

#ifdef FG_BENCH_HAVE_CUDA
static fg_status copy_run(void *p, int s) {
    copy_args *a = p;
    (void)s;
    return cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, 0) == cudaSuccess ? FG_OK
                                                                                                : FG_ERR_BACKEND;
}
#endif

static void ceilings(void) {
#ifdef FG_BENCH_HAVE_CUDA
    copy_args c;
    c.bytes = (size_t)1 << 30;
    c.src = alloc_random(FG_BF16, (int64_t)(c.bytes / 2), 1);
    c.dst = alloc_random(FG_BF16, (int64_t)(c.bytes / 2), 2);
    double ms = time_op(copy_run, &c, 1);
    ceil_gbs = 2.0 * (double)c.bytes / ms / 1e6;
    printf("%-34s %-26s %-5s %10.4f ms %9.1f GB/s  (read + write)\n", "CEILING device copy", "1 GiB", "", ms, ceil_gbs);
    release(c.src);
    release(c.dst);
    ceil_tflops = bench_matmul(FG_BF16, 1, 8192, 8192, 8192, 2, "CEILING bf16 GEMM (primitive)");
#endif
}

static void check(const char *what, double got, double target) {
    printf("CHECK %-52s %6.1f%%  target >= %.0f%%  %s\n", what, 100 * got, 100 * target, got >= target ? "PASS" : "MISS");
}

int main(int argc, char **argv) {
    int quick = 0, only_logp = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--only-logp")) only_logp = 1;
        else if (!strcmp(argv[i], "--logp-sweep")) only_logp = 2;
        else if (!strcmp(argv[i], "--only-act")) only_logp = 3;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: fastgrad-bench [--quick] [--only-logp] [--only-act] [--logp-sweep] [--reps N]\n");
            return 2;
        }
    }
    backend = (!quick && fg_backend_available(FG_BACKEND_CUDA)) ? FG_BACKEND_CUDA : FG_BACKEND_CPU;
    fg_context_desc d;
    memset(&d, 0, sizeof d);
    d.backend = backend;
    fg_status s = fg_context_create(&d, &ctx);
    if (s != FG_OK) die("context_create", s);
    printf("fastgrad %u.%u.%u bench, backend %s%s\n", fg_version() >> 16, (fg_version() >> 8) & 255, fg_version() & 255,
           backend == FG_BACKEND_CUDA ? "cuda" : "cpu", quick ? " (quick: small shapes, CPU timings are noise)" : "");
#ifdef FG_BENCH_HAVE_CUDA
    if (backend == FG_BACKEND_CUDA) {
        struct cudaDeviceProp p;
        cudaGetDeviceProperties(&p, 0);
        printf("device: %s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
    }
#endif
    printf("%-34s %-26s %-5s %13s %15s\n", "op", "shape", "dtype", "median", "rate");
    if (backend == FG_BACKEND_CPU) {
        reps = quick ? 5 : reps;
        bench_linear(FG_F32, 256, 256, 256, 1);
        bench_linear(FG_BF16, 128, 128, 128, 1);
        double lf[2];
        bench_lerp(FG_F32, 1 << 20, lf);
        bench_adamw(1 << 20, 20);
        bench_gemv(FG_F32, 1024, 1024, 0, 1);
        bench_gemv(FG_F32, 1024, 1024, 1, 1);
        bench_matmul(FG_F32, 4, 128, 128, 128, 1, "matmul_forward");
        bench_outer(FG_F32, 512, 512, 1);
        double lp[3];
        bench_linear_logp(FG_F32, 256, 64, 4096, lp, 0);
        bench_linear_act(FG_F32, 256, 256, 256, FG_ACT_GELU_TANH, "gelu_tanh", 0);
    } else if (only_logp == 3) {
        ceilings();
        bench_linear_act(FG_BF16, 8192, 4096, 16384, FG_ACT_GELU_TANH, "gelu_tanh", 0);
        bench_linear_act(FG_BF16, 8192, 4096, 16384, FG_ACT_RELU, "relu", 0);
        bench_linear_act(FG_BF16, 8192, 4096, 16384, FG_ACT_SILU, "silu", 0);
        bench_act_products(FG_BF16, 8192, 4096, 16384);
        bench_linear_act(FG_BF16, 172032, 128, 256, FG_ACT_GELU_TANH, "gelu_tanh", 0);
        bench_linear_act(FG_BF16, 172032, 128, 256, FG_ACT_SILU, "silu", 0);
        bench_linear_act(FG_BF16, 172032, 128, 256, FG_ACT_GELU_TANH, "gelu_tanh", 1);
        bench_linear_act(FG_BF16, 172032, 128, 256, FG_ACT_RELU, "relu", 1);
        bench_linear_act(FG_BF16, 172032, 128, 256, FG_ACT_SILU, "silu", 1);
    } else if (only_logp == 2) { /* tile size against time: what the defaults are chosen from */
        ceilings();
        double lp[3];
        const int64_t tiles[] = {32ll << 20, 64ll << 20, 128ll << 20, 256ll << 20, 0};
        for (int k = 0; k < 5; k++) bench_linear_logp(FG_BF16, 8192, 4096, 128256, lp, tiles[k]);
        for (int k = 0; k < 5; k++) bench_linear_logp(FG_BF16, 4096, 2048, 151936, lp, tiles[k]);
    } else if (only_logp) {
        ceilings();
        double lp[3];
        bench_linear_logp(FG_BF16, 4096, 2048, 151936, lp, 0);
        bench_linear_logp(FG_BF16, 8192, 4096, 128256, lp, 0);
        bench_linear_logp(FG_BF16, 4096, 2048, 32768, lp, 0);
    } else {
        ceilings();
        double lin = bench_linear(FG_BF16, 8192, 4096, 4096, 2);
        double gemv = bench_gemv(FG_F32, 8192, 8192, 0, 2);
        bench_gemv(FG_BF16, 8192, 8192, 0, 2);
        bench_gemv(FG_F32, 8192, 8192, 1, 2);
        bench_gemv(FG_BF16, 8192, 8192, 1, 2);
        bench_linear(FG_F32, 4096, 4096, 4096, 2);
        bench_matmul(FG_BF16, 16, 2048, 2048, 2048, 2, "matmul_forward batched");
        bench_outer(FG_BF16, 16384, 8192, 2);
        bench_outer(FG_F32, 8192, 8192, 2);
        double lf[2], lb[2];
        bench_lerp(FG_F32, (int64_t)1 << 28, lf);
        bench_lerp(FG_BF16, (int64_t)1 << 28, lb);
        bench_adamw(1000000000, 200);
        double lp[3];
        bench_linear_logp(FG_BF16, 4096, 2048, 151936, lp, 0);
        bench_linear_logp(FG_BF16, 8192, 4096, 128256, lp, 0);
        bench_linear_logp(FG_BF16, 4096, 2048, 32768, lp, 0);
        bench_linear_act(FG_BF16, 8192, 4096, 16384, FG_ACT_GELU_TANH, "gelu_tanh", 0);
        bench_linear_act(FG_BF16, 172032, 128, 256, FG_ACT_GELU_TANH, "gelu_tanh", 0);
        printf("\n");
        check("linear bf16 8192x4096x4096 fwd+3bwd vs GEMM ceiling", lin, 0.85);
        check("gemv f32 1x8192 . 8192x8192 vs copy ceiling", gemv, 0.80);
        check("lerp forward f32 2^28 vs copy ceiling", lf[0], 0.95);
        check("lerp backward f32 2^28 (da, db) vs copy ceiling", lf[1], 0.90);
    }
    fg_context_destroy(ctx);
    return 0;
}

/*
 * linear_act.c — the CPU backend's elementwise steps of linear + activation (the step
 * list is in core/internal.h; the driver and its GEMMs are in ops/linear_act.c), and the
 * activation math in f64 that they use. Rows run in parallel; db's column sums run over
 * the rows in order, so the results do not depend on the thread count's timing.
 */
#include "../core/internal.h"

#include <math.h>

#define SQRT_2_OVER_PI 0.7978845608028654
#define INV_SQRT_2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

/* σ(x) and σ(x)(1 − σ(x)), without the cancellation of 1 − σ where σ → 1 */
static double sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static double sigmoid_slope(double x) {
    double e = exp(-fabs(x));
    return e / ((1.0 + e) * (1.0 + e));
}


/* GELU (tanh) is x·σ(2u), u = √(2/π)(x + 0.044715x³): 1 + tanh u = 2σ(2u) without cancellation */
static double gelu_u(double x) { return SQRT_2_OVER_PI * (x + 0.044715 * x * x * x); }

double fg_act_value(int act, double x) {
    switch (act) {
    case FG_ACT_RELU: return x > 0 ? x : (x == x ? 0.0 : x);
    case FG_ACT_GELU: return 0.5 * x * erfc(-x * INV_SQRT_2); /* Φ via erfc: accurate for x ≪ 0 */
    case FG_ACT_GELU_TANH: return x * sigmoid(2.0 * gelu_u(x));
    case FG_ACT_SILU: return x * sigmoid(x);
    case FG_ACT_SIGMOID: return sigmoid(x);
    case FG_ACT_TANH: return tanh(x);
    default: return x;
    }
}

double fg_act_slope(int act, double x) {
    switch (act) {
    case FG_ACT_RELU: return x > 0 ? 1.0 : (x == x ? 0.0 : x);
    case FG_ACT_GELU: return 0.5 * erfc(-x * INV_SQRT_2) + x * INV_SQRT_2PI * exp(-0.5 * x * x);
    case FG_ACT_GELU_TANH: {
        if (fabs(x) > 10.0) return x > 0 ? 1.0 : 0.0; /* the limits, instead of 0·∞ far out */
        double u = gelu_u(x);
        return sigmoid(2.0 * u) + x * sigmoid_slope(2.0 * u) * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case FG_ACT_SILU: return sigmoid(x) + x * sigmoid_slope(x);
    case FG_ACT_SIGMOID: return sigmoid_slope(x);
    case FG_ACT_TANH: { /* 1 − tanh² = 4e/(1 + e)², e = exp(−2|x|) */
        double e = exp(-2.0 * fabs(x));
        return 4.0 * e / ((1.0 + e) * (1.0 + e));
    }
    case FG_ACT_GIVEN_SLOPE: return x; /* the saved slope itself (the slope form's backward) */
    default: return x == x ? 1.0 : x;
    }
}

static int threads(const fg_context *ctx) { return ctx->num_threads > 0 ? ctx->num_threads : 0; }

fg_status fg_cpu_act(fg_context *ctx, const fg_act_call *c) {
    const int nt = threads(ctx);
    const fg_dtype t = c->dtype;
    switch (c->step) {
    case FG_ACT_STEP_FORWARD:
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->rows * c->cols > 65536)
        for (int64_t i = 0; i < c->rows; i++)
            for (int64_t j = 0; j < c->cols; j++) {
                const double p = fg_load_f64(c->pre, t, i * c->ld_pre + j);
                fg_store_f64(c->y, t, i * c->ld_y + j, fg_act_value(c->act, p));
                if (c->slope_out) fg_store_f64((void *)c->pre, t, i * c->ld_pre + j, fg_act_slope(c->act, p));
            }
        return FG_OK;
    case FG_ACT_STEP_GRAD:
        /* db first: g may overwrite pre in place */
        if (c->db_acc) { /* sums of the unrounded g, column by column, rows in order */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->rows * c->cols > 65536)
            for (int64_t j = 0; j < c->cols; j++) {
                double sum = c->first ? 0.0 : fg_load_f64(c->db_acc, c->acc, j);
                for (int64_t i = 0; i < c->rows; i++)
                    sum += fg_load_f64(c->dy, t, i * c->ld_dy + j) *
                           fg_act_slope(c->act, fg_load_f64(c->pre, t, i * c->ld_pre + j));
                fg_store_f64(c->db_acc, c->acc, j, sum);
            }
        }
        if (c->g) {
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->rows * c->cols > 65536)
            for (int64_t i = 0; i < c->rows; i++)
                for (int64_t j = 0; j < c->cols; j++) {
                    double dy = fg_load_f64(c->dy, t, i * c->ld_dy + j);
                    fg_store_f64(c->g, t, i * c->ld_g + j,
                                 dy * fg_act_slope(c->act, fg_load_f64(c->pre, t, i * c->ld_pre + j)));
                }
        }
        return FG_OK;
    case FG_ACT_STEP_CAST: {
        const int64_t parts = c->parts > 1 ? c->parts : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && c->cols * parts > 65536)
        for (int64_t j = 0; j < c->cols; j++) {
            double v = 0.0;
            for (int64_t p = 0; p < parts; p++) v += fg_load_f64(c->src, c->acc, p * c->cols + j);
            if (c->accumulate) v += fg_load_f64(c->dst, t, j);
            fg_store_f64(c->dst, t, j, v);
        }
        return FG_OK;
    }
    case FG_ACT_STEP_TILE_FORWARD: /* CUDA only (the driver asks fg_cuda_act_tile_fits) */
    case FG_ACT_STEP_TILE_GRAD:
    case FG_ACT_STEP_TILE_BACKWARD:
    case FG_ACT_STEP_TILE_BACKWARD90:
    case FG_ACT_STEP_GEMM_FORWARD:
    case FG_ACT_STEP_GEMM_INPUT:
    case FG_ACT_STEP_GEMM_WEIGHT:
    case FG_ACT_STEP_GEMM_INPUT_FORM: break;
    }
    return fg_fail(FG_ERR_INTERNAL, "cpu linear_act: unknown step %d", (int)c->step);
}

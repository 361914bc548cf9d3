/*
 * linear_act.c — the CPU backend's elementwise steps of linear + activation (the step
 * list is in core/internal.h; the driver and its GEMMs are in ops/linear_act.c), and the
 * activation math in f64 (fg_act_value / fg_act_slope, the reference, and the math of f64
 * problems); the f32 math for f32 / f16 / bf16 data is src/cpu/vec.h's fg_v_act, which the
 * GEMM's fused epilogue (src/cpu/gemm.c) shares.
 *
 * FORWARD is one pass: y = act(pre), and the slope into pre when asked. GRAD is one pass
 * too: g = dy ⊙ act′(pre) and db's column sums together; with db the threads split the
 * columns (each walks every row, in order, so each column's sum has one fixed order
 * whatever the thread count), without it they split the rows. Sums are f64 per column.
 * gelu and gelu_tanh on f32 / bf16 data run both passes on AVX-512 where the CPU has it (act_z.h:
 * vec.h's exp and reciprocal estimates, gelu's erf from its slope's exp; the cloned loops' exp and
 * division cost most of the pass), and so does the slope form's g = dy ⊙ s.
 */
#include "cpu.h"
#include "act_z.h"
#include "vec.h"

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

/* ------------------------------------------------------------------ f32 passes (the math: vec.h's fg_v_act) */

/* FORWARD over rows [r0, r1); t, act constants at the call */
FG_INLINE void forward_typed(const fg_act_call *c, fg_dtype t, int act, int64_t r0, int64_t r1) {
    void *pre = (void *)c->pre, *y = c->y;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t pi = i * c->ld_pre, yi = i * c->ld_y;
        if (c->slope_out) {
#pragma GCC ivdep
            for (int64_t j = 0; j < c->cols; j++) {
                float s;
                const float v = fg_v_act(act, fg_v_ld(pre, t, pi + j), &s);
                fg_v_st(y, t, yi + j, v);
                fg_v_st(pre, t, pi + j, s);
            }
        } else {
#pragma GCC ivdep
            for (int64_t j = 0; j < c->cols; j++) fg_v_st(y, t, yi + j, fg_v_act(act, fg_v_ld(pre, t, pi + j), NULL));
        }
    }
}

/* GRAD over rows [r0, r1) and columns [c0, c1): g (when not NULL) and, with db, acc[j − c0]
   += g of each row in order. */
FG_INLINE void grad_typed(const fg_act_call *c, fg_dtype t, int act, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          double *acc) {
    const int64_t n = c1 - c0;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t di = i * c->ld_dy + c0, pi = i * c->ld_pre + c0, gi = i * c->ld_g + c0;
        if (acc && c->g) {
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++) {
                float s;
                fg_v_act(act, fg_v_ld(c->pre, t, pi + j), &s);
                const float g = fg_v_ld(c->dy, t, di + j) * s;
                acc[j] += g;
                fg_v_st(c->g, t, gi + j, g);
            }
        } else if (acc) {
            for (int64_t j = 0; j < n; j++) {
                float s;
                fg_v_act(act, fg_v_ld(c->pre, t, pi + j), &s);
                acc[j] += fg_v_ld(c->dy, t, di + j) * s;
            }
        } else {
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++) {
                float s;
                fg_v_act(act, fg_v_ld(c->pre, t, pi + j), &s);
                fg_v_st(c->g, t, gi + j, fg_v_ld(c->dy, t, di + j) * s);
            }
        }
    }
}

#ifdef FG_Z
/* FORWARD of gelu or gelu_tanh (act) over rows [r0, r1), f32 or bf16 data (t, act constants at the
   call) */
FG_Z_INLINE void z_forward_typed(const fg_act_call *c, fg_dtype t, int act, int64_t r0, int64_t r1) {
    void *pre = (void *)c->pre, *y = c->y;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t pi = i * c->ld_pre, yi = i * c->ld_y;
        for (int64_t j = 0; j < c->cols; j += 16) {
            const __mmask16 k = fg_z_lanes(c->cols - j);
            __m512 s;
            const __m512 v = fg_z_act(act, fg_z_ld(pre, t, pi + j, k), c->slope_out ? &s : NULL);
            fg_z_st(y, t, yi + j, k, v);
            if (c->slope_out) fg_z_st(pre, t, pi + j, k, s);
        }
    }
}

/* GRAD of gelu, gelu_tanh or a given slope (act) over rows [r0, r1) and columns [c0, c1),
   grad_typed's sums: g = dy·act′(pre) and, with db, acc[j − c0] += g row by row in f64 (the same
   order and bits as its loop for the same g) */
FG_Z_INLINE void z_grad_typed(const fg_act_call *c, fg_dtype t, int act, int64_t r0, int64_t r1, int64_t c0,
                              int64_t c1, double *acc) {
    for (int64_t i = r0; i < r1; i++) {
        const int64_t di = i * c->ld_dy + c0, pi = i * c->ld_pre + c0, gi = i * c->ld_g + c0;
        for (int64_t j = 0; j < c1 - c0; j += 16) {
            const __mmask16 k = fg_z_lanes(c1 - c0 - j);
            __m512 s = fg_z_ld(c->pre, t, pi + j, k);
            if (act != FG_ACT_GIVEN_SLOPE) fg_z_act(act, s, &s);
            const __m512 g = _mm512_mul_ps(fg_z_ld(c->dy, t, di + j, k), s);
            if (acc) {
                const __mmask8 lo = (__mmask8)(k & 0xff), hi = (__mmask8)(k >> 8);
                const __m512d glo = _mm512_cvtps_pd(_mm512_castps512_ps256(g));
                const __m512d ghi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(g), 1)));
                _mm512_mask_storeu_pd(acc + j, lo, _mm512_add_pd(_mm512_maskz_loadu_pd(lo, acc + j), glo));
                _mm512_mask_storeu_pd(acc + j + 8, hi, _mm512_add_pd(_mm512_maskz_loadu_pd(hi, acc + j + 8), ghi));
            }
            if (c->g) fg_z_st(c->g, t, gi + j, k, g);
        }
    }
}

FG_Z_KERNEL static void z_forward_rows(const fg_act_call *c, int64_t r0, int64_t r1) {
    const bool bf = c->dtype == FG_BF16;
    if (c->act == FG_ACT_GELU) {
        if (bf) z_forward_typed(c, FG_BF16, FG_ACT_GELU, r0, r1);
        else z_forward_typed(c, FG_F32, FG_ACT_GELU, r0, r1);
    } else {
        if (bf) z_forward_typed(c, FG_BF16, FG_ACT_GELU_TANH, r0, r1);
        else z_forward_typed(c, FG_F32, FG_ACT_GELU_TANH, r0, r1);
    }
}

FG_Z_KERNEL static void z_grad_block(const fg_act_call *c, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                                     double *acc) {
    const bool bf = c->dtype == FG_BF16;
    switch (c->act) {
    case FG_ACT_GELU:
        if (bf) z_grad_typed(c, FG_BF16, FG_ACT_GELU, r0, r1, c0, c1, acc);
        else z_grad_typed(c, FG_F32, FG_ACT_GELU, r0, r1, c0, c1, acc);
        break;
    case FG_ACT_GELU_TANH:
        if (bf) z_grad_typed(c, FG_BF16, FG_ACT_GELU_TANH, r0, r1, c0, c1, acc);
        else z_grad_typed(c, FG_F32, FG_ACT_GELU_TANH, r0, r1, c0, c1, acc);
        break;
    default:
        if (bf) z_grad_typed(c, FG_BF16, FG_ACT_GIVEN_SLOPE, r0, r1, c0, c1, acc);
        else z_grad_typed(c, FG_F32, FG_ACT_GIVEN_SLOPE, r0, r1, c0, c1, acc);
        break;
    }
}

/* Whether the AVX-512 passes take the call: gelu or gelu_tanh on f32 / bf16 data, and GRAD's
   given slope (g = dy·s: the cloned loop's f64 sums cost more than the multiply) */
static bool z_takes(const fg_act_call *c, bool grad) {
    return (fg_z_has_act(c->act) || (grad && c->act == FG_ACT_GIVEN_SLOPE)) &&
           (c->dtype == FG_F32 || c->dtype == FG_BF16) && fg_z_usable();
}
#endif

/* The act × dtype dispatch of the two passes (one function per pass, cloned per x86 level). */
FG_INLINE void forward_act(const fg_act_call *c, fg_dtype t, int64_t r0, int64_t r1) {
    switch (c->act) {
    case FG_ACT_RELU: forward_typed(c, t, FG_ACT_RELU, r0, r1); break;
    case FG_ACT_GELU: forward_typed(c, t, FG_ACT_GELU, r0, r1); break;
    case FG_ACT_GELU_TANH: forward_typed(c, t, FG_ACT_GELU_TANH, r0, r1); break;
    case FG_ACT_SILU: forward_typed(c, t, FG_ACT_SILU, r0, r1); break;
    case FG_ACT_SIGMOID: forward_typed(c, t, FG_ACT_SIGMOID, r0, r1); break;
    case FG_ACT_TANH: forward_typed(c, t, FG_ACT_TANH, r0, r1); break;
    default: forward_typed(c, t, FG_ACT_NONE, r0, r1); break;
    }
}

FG_CPU_CLONES
static void forward_rows(const fg_act_call *c, int64_t r0, int64_t r1) {
#ifdef FG_Z
    if (z_takes(c, false)) {
        z_forward_rows(c, r0, r1);
        return;
    }
#endif
    if (c->dtype == FG_BF16) forward_act(c, FG_BF16, r0, r1);
    else if (c->dtype == FG_F16) forward_act(c, FG_F16, r0, r1);
    else forward_act(c, FG_F32, r0, r1);
}

FG_INLINE void grad_act(const fg_act_call *c, fg_dtype t, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        double *acc) {
    switch (c->act) {
    case FG_ACT_RELU: grad_typed(c, t, FG_ACT_RELU, r0, r1, c0, c1, acc); break;
    case FG_ACT_GELU: grad_typed(c, t, FG_ACT_GELU, r0, r1, c0, c1, acc); break;
    case FG_ACT_GELU_TANH: grad_typed(c, t, FG_ACT_GELU_TANH, r0, r1, c0, c1, acc); break;
    case FG_ACT_SILU: grad_typed(c, t, FG_ACT_SILU, r0, r1, c0, c1, acc); break;
    case FG_ACT_SIGMOID: grad_typed(c, t, FG_ACT_SIGMOID, r0, r1, c0, c1, acc); break;
    case FG_ACT_TANH: grad_typed(c, t, FG_ACT_TANH, r0, r1, c0, c1, acc); break;
    case FG_ACT_GIVEN_SLOPE: grad_typed(c, t, FG_ACT_GIVEN_SLOPE, r0, r1, c0, c1, acc); break;
    default: grad_typed(c, t, FG_ACT_NONE, r0, r1, c0, c1, acc); break;
    }
}

FG_CPU_CLONES
static void grad_block(const fg_act_call *c, int64_t r0, int64_t r1, int64_t c0, int64_t c1, double *acc) {
#ifdef FG_Z
    if (z_takes(c, true)) {
        z_grad_block(c, r0, r1, c0, c1, acc);
        return;
    }
#endif
    if (c->dtype == FG_BF16) grad_act(c, FG_BF16, r0, r1, c0, c1, acc);
    else if (c->dtype == FG_F16) grad_act(c, FG_F16, r0, r1, c0, c1, acc);
    else grad_act(c, FG_F32, r0, r1, c0, c1, acc);
}

enum { COLS = 512 }; /* db's column block: its f64 sums stay in L1 while the rows go by */

/* Columns [c0, c1) of GRAD with db: blocks of COLS columns, all rows in order each. */
static void grad_cols(const fg_act_call *c, int64_t c0, int64_t c1) {
    double acc[COLS];
    for (int64_t b0 = c0; b0 < c1; b0 += COLS) {
        const int64_t b1 = c1 - b0 < COLS ? c1 : b0 + COLS;
        for (int64_t j = b0; j < b1; j++) acc[j - b0] = c->first ? 0.0 : fg_load_f64(c->db_acc, c->acc, j);
        grad_block(c, 0, c->rows, b0, b1, acc);
        for (int64_t j = b0; j < b1; j++) fg_store_f64(c->db_acc, c->acc, j, acc[j - b0]);
    }
}

/* ------------------------------------------------------------------ f64 problems */

static void forward_f64(const fg_context *ctx, const fg_act_call *c) {
    const fg_dtype t = c->dtype;
    const int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t i = 0; i < c->rows; i++)
        for (int64_t j = 0; j < c->cols; j++) {
            const double p = fg_load_f64(c->pre, t, i * c->ld_pre + j);
            fg_store_f64(c->y, t, i * c->ld_y + j, fg_act_value(c->act, p));
            if (c->slope_out) fg_store_f64((void *)c->pre, t, i * c->ld_pre + j, fg_act_slope(c->act, p));
        }
}

static void grad_f64(const fg_context *ctx, const fg_act_call *c) {
    const fg_dtype t = c->dtype;
    const int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
    if (c->db_acc) { /* db first (g may overwrite pre): column by column, rows in order */
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
        for (int64_t j = 0; j < c->cols; j++) {
            double sum = c->first ? 0.0 : fg_load_f64(c->db_acc, c->acc, j);
            for (int64_t i = 0; i < c->rows; i++)
                sum += fg_load_f64(c->dy, t, i * c->ld_dy + j) *
                       fg_act_slope(c->act, fg_load_f64(c->pre, t, i * c->ld_pre + j));
            fg_store_f64(c->db_acc, c->acc, j, sum);
        }
    }
    if (c->g) {
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
        for (int64_t i = 0; i < c->rows; i++)
            for (int64_t j = 0; j < c->cols; j++) {
                double dy = fg_load_f64(c->dy, t, i * c->ld_dy + j);
                fg_store_f64(c->g, t, i * c->ld_g + j,
                             dy * fg_act_slope(c->act, fg_load_f64(c->pre, t, i * c->ld_pre + j)));
            }
    }
}

/* ------------------------------------------------------------------ steps */

fg_status fg_cpu_act(fg_context *ctx, const fg_act_call *c) {
    const fg_dtype t = c->dtype;
    switch (c->step) {
    case FG_ACT_STEP_FORWARD: {
        if (t == FG_F64) {
            forward_f64(ctx, c);
            return FG_OK;
        }
        const int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
        if (team == 1) {
            forward_rows(c, 0, c->rows);
            return FG_OK;
        }
#pragma omp parallel num_threads(team)
        {
            int64_t lo, hi;
            fg_cpu_share(c->rows, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
            forward_rows(c, lo, hi);
        }
        return FG_OK;
    }
    case FG_ACT_STEP_GRAD: {
        if (t == FG_F64) {
            grad_f64(ctx, c);
            return FG_OK;
        }
        if (!c->db_acc && !c->g) return FG_OK;
        const int team = fg_cpu_team(ctx, c->rows * c->cols, 1 << 14);
        if (c->db_acc) { /* columns split (16-column multiples), each walked over every row */
            const int cteam = team < (c->cols + 15) / 16 ? team : (int)((c->cols + 15) / 16);
            if (cteam <= 1) {
                grad_cols(c, 0, c->cols);
                return FG_OK;
            }
#pragma omp parallel num_threads(cteam)
            {
                int64_t lo, hi;
                fg_cpu_share(c->cols, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
                grad_cols(c, lo, hi);
            }
            return FG_OK;
        }
        if (team == 1) {
            grad_block(c, 0, c->rows, 0, c->cols, NULL);
            return FG_OK;
        }
#pragma omp parallel num_threads(team)
        {
            int64_t lo, hi;
            fg_cpu_share(c->rows, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
            grad_block(c, lo, hi, 0, c->cols, NULL);
        }
        return FG_OK;
    }
    case FG_ACT_STEP_CAST: {
        const int64_t parts = c->parts > 1 ? c->parts : 1;
        const int team = fg_cpu_team(ctx, c->cols * parts, 1 << 15);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
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

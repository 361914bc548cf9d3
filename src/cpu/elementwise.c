/*
 * elementwise.c — the CPU backend of the parameterized elementwise family, the
 * reference the CUDA kernels are tested against. Math in f64 whatever the storage.
 * One pass over the full shape writes every output that is not broadcast; each output
 * whose input was broadcast is a sum over the broadcast dims, taken per output element
 * in a fixed order (deterministic, OpenMP over the output elements).
 */
#include "../core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { UB_DY, UB_X, UB_DX };
enum { BB_DY, BB_A, BB_B, BB_W, BB_DA, BB_DB, BB_DW };

static double unary_f(int kind, const double *s, double x) {
    switch (kind) {
    case FG_UNARY_SCALE: return s[0] * x;
    case FG_UNARY_POW: return pow(x, s[0]);
    case FG_UNARY_LEAKY_RELU: return x > 0 ? x : s[0] * x;
    case FG_UNARY_ELU: return x > 0 ? x : s[0] * expm1(x);
    case FG_UNARY_CLAMP: return isnan(x) ? x : fmin(fmax(x, s[0]), s[1]);
    case FG_UNARY_SOFTCAP: return s[0] * tanh(x / s[0]);
    }
    return NAN;
}

/* d y / d x */
static double unary_df(int kind, const double *s, double x) {
    switch (kind) {
    case FG_UNARY_SCALE: return s[0];
    case FG_UNARY_POW: return s[0] == 0 ? 0.0 : s[0] * pow(x, s[0] - 1);
    case FG_UNARY_LEAKY_RELU: return isnan(x) ? x : x > 0 ? 1.0 : s[0];
    case FG_UNARY_ELU: return isnan(x) ? x : x > 0 ? 1.0 : s[0] * exp(x);
    case FG_UNARY_CLAMP: return (x >= s[0] && x <= s[1]) ? 1.0 : 0.0;
    case FG_UNARY_SOFTCAP: {
        double t = tanh(x / s[0]);
        return 1.0 - t * t;
    }
    }
    return NAN;
}

static double lerp(double a, double b, double w) {
    return w < 0.5 ? a + w * (b - a) : b - (b - a) * (1.0 - w);
}

/* The value operand `which` (an output) gets at one element, from the inputs v[]. */
static double value(const fg_ew *e, int which, const double *v) {
    switch (e->op) {
    case FG_OP_UNARY_FORWARD: return unary_f(e->kind, e->s, v[0]);
    case FG_OP_UNARY_BACKWARD: return v[UB_DY] * unary_df(e->kind, e->s, v[UB_X]);
    case FG_OP_BINARY_FORWARD:
        if (e->kind == FG_BINARY_AXPBY) return e->s[0] * v[0] + e->s[1] * v[1];
        return lerp(v[0], v[1], (e->present >> 2 & 1u) ? v[2] : e->s[0]);
    case FG_OP_BINARY_BACKWARD: {
        double w = (e->present >> BB_W & 1u) ? v[BB_W] : e->s[0];
        if (e->kind == FG_BINARY_AXPBY) return (which == BB_DA ? e->s[0] : e->s[1]) * v[BB_DY];
        if (which == BB_DA) return (1.0 - w) * v[BB_DY];
        if (which == BB_DB) return w * v[BB_DY];
        return (v[BB_B] - v[BB_A]) * v[BB_DY];
    }
    default: return NAN;
    }
}

/* Storage offsets of every operand at full-shape coordinates. */
static void offsets(const fg_ew *e, const int64_t *coord, int64_t *off) {
    for (int i = 0; i < e->n_operands; i++) {
        off[i] = 0;
        for (int d = 0; d < e->rank; d++) off[i] += coord[d] * e->stride[i][d];
    }
}

static void coords_of(const fg_ew *e, int64_t idx, int64_t *coord) {
    for (int d = e->rank - 1; d >= 0; d--) {
        coord[d] = idx % e->shape[d];
        idx /= e->shape[d];
    }
}

static void load_inputs(const fg_ew *e, const int64_t *off, double *v) {
    for (int i = 0; i < e->n_operands; i++)
        if ((e->present >> i & 1u) && !(e->outputs >> i & 1u)) v[i] = fg_load_f64(e->data[i], e->dtype, off[i]);
}

/* n elements at p[off + k·stride] into dst as f64: one loop per dtype. */
static void load_block(const void *p, fg_dtype t, int64_t off, int64_t stride, int64_t n, double *dst) {
    switch (t) {
    case FG_F32: for (int64_t k = 0; k < n; k++) dst[k] = ((const float *)p)[off + k * stride]; break;
    case FG_F64: for (int64_t k = 0; k < n; k++) dst[k] = ((const double *)p)[off + k * stride]; break;
    case FG_F16: for (int64_t k = 0; k < n; k++) dst[k] = fg_f16_to_f32(((const uint16_t *)p)[off + k * stride]); break;
    case FG_BF16: for (int64_t k = 0; k < n; k++) dst[k] = fg_bf16_to_f32(((const uint16_t *)p)[off + k * stride]); break;
    default: break; /* float dtypes only reach here */
    }
}

static void store_block(void *p, fg_dtype t, int64_t off, int64_t stride, int64_t n, const double *src) {
    switch (t) {
    case FG_F32: for (int64_t k = 0; k < n; k++) ((float *)p)[off + k * stride] = (float)src[k]; break;
    case FG_F64: for (int64_t k = 0; k < n; k++) ((double *)p)[off + k * stride] = src[k]; break;
    case FG_F16: for (int64_t k = 0; k < n; k++) ((uint16_t *)p)[off + k * stride] = fg_f32_to_f16((float)src[k]); break;
    case FG_BF16: for (int64_t k = 0; k < n; k++) ((uint16_t *)p)[off + k * stride] = fg_f32_to_bf16((float)src[k]); break;
    default: break;
    }
}

static void put(const fg_ew *e, int i, int64_t off, double v) {
    if (e->accumulate) v += fg_load_f64(e->data[i], e->dtype, off);
    fg_store_f64(e->data[i], e->dtype, off, v);
}

fg_status fg_cpu_elementwise(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws, size_t ws_bytes,
                             bool run) {
    (void)ws;
    (void)ws_bytes;
    const unsigned direct = e->outputs & e->present & ~e->reduced;
    const unsigned summed = e->outputs & e->present & e->reduced;
    snprintf(info->name, sizeof info->name, "cpu:elementwise(rank %d)%s", e->rank, summed ? "+ordered sums" : "");
    info->accumulator = FG_F64;
    if (!run || e->numel == 0) return FG_OK;
    const int nt = ctx->num_threads > 0 ? ctx->num_threads : 0;
    if (direct && e->rank <= 1) {
        /* one dim: blocks of BLOCK elements, each operand converted to f64 in one tight
           loop per block (one dtype switch per block, not per element) */
        enum { BLOCK = 512 };
        const int64_t nblocks = (e->numel + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && e->numel > 32768)
        for (int64_t blk = 0; blk < nblocks; blk++) {
            double buf[FG_EW_MAX_OPERANDS][BLOCK];
            const int64_t i0 = blk * BLOCK, len = e->numel - i0 < BLOCK ? e->numel - i0 : BLOCK;
            for (int i = 0; i < e->n_operands; i++) {
                const bool input = (e->present >> i & 1u) && !(e->outputs >> i & 1u);
                if (!input && !(e->accumulate && (direct >> i & 1u))) continue;
                const int64_t st = e->rank ? e->stride[i][0] : 0;
                load_block(e->data[i], e->dtype, i0 * st, st, len, buf[i]);
            }
            double v[FG_EW_MAX_OPERANDS] = {0};
            const unsigned inputs = e->present & ~e->outputs;
            for (int i = 0; i < e->n_operands; i++) {
                if (!(direct >> i & 1u)) continue;
                double out[BLOCK];
                for (int64_t k = 0; k < len; k++) {
                    for (int j = 0; j < e->n_operands; j++)
                        if (inputs >> j & 1u) v[j] = buf[j][k];
                    out[k] = value(e, i, v) + (e->accumulate ? buf[i][k] : 0.0);
                }
                const int64_t st = e->rank ? e->stride[i][0] : 0;
                store_block(e->data[i], e->dtype, i0 * st, st, len, out);
            }
        }
    } else if (direct) {
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && e->numel > 32768)
        for (int64_t idx = 0; idx < e->numel; idx++) {
            int64_t coord[FG_MAX_RANK], off[FG_EW_MAX_OPERANDS];
            double v[FG_EW_MAX_OPERANDS];
            coords_of(e, idx, coord);
            offsets(e, coord, off);
            load_inputs(e, off, v);
            for (int i = 0; i < e->n_operands; i++)
                if (direct >> i & 1u) put(e, i, off[i], value(e, i, v));
        }
    }
    for (int i = 0; i < e->n_operands; i++) {
        if (!(summed >> i & 1u)) continue;
        /* kept dims index the output's elements, the others are summed over */
        int kept[FG_MAX_RANK], red[FG_MAX_RANK], nk = 0, nr = 0;
        int64_t n_out = 1, n_red = 1;
        for (int d = 0; d < e->rank; d++) {
            if (e->stride[i][d] != 0) {
                kept[nk++] = d;
                n_out *= e->shape[d];
            } else {
                red[nr++] = d;
                n_red *= e->shape[d];
            }
        }
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && n_out * n_red > 32768)
        for (int64_t o = 0; o < n_out; o++) {
            int64_t coord[FG_MAX_RANK], off[FG_EW_MAX_OPERANDS];
            double v[FG_EW_MAX_OPERANDS], sum = 0;
            int64_t q = o;
            for (int k = nk - 1; k >= 0; k--) {
                coord[kept[k]] = q % e->shape[kept[k]];
                q /= e->shape[kept[k]];
            }
            for (int64_t r = 0; r < n_red; r++) {
                int64_t t = r;
                for (int k = nr - 1; k >= 0; k--) {
                    coord[red[k]] = t % e->shape[red[k]];
                    t /= e->shape[red[k]];
                }
                offsets(e, coord, off);
                load_inputs(e, off, v);
                sum += value(e, i, v);
            }
            for (int k = 0; k < nr; k++) coord[red[k]] = 0;
            offsets(e, coord, off);
            put(e, i, off[i], sum);
        }
    }
    return FG_OK;
}

/*
 * elementwise.c — the CPU backend of the parameterized elementwise family, the reference
 * the CUDA kernels are tested against.
 *
 * Outputs that are not broadcast ("direct") are written in one pass over the full shape,
 * split into contiguous shares of the element range, one per thread (fg_cpu_team). Each
 * share walks rows of the innermost dim; a row is one tight loop per op and storage type
 * (the dtype a constant there, so the f16 / bf16 conversions of src/cpu/vec.h sit inside
 * the loop and it vectorizes; FG_CPU_CLONES compiles it for AVX-512 and AVX2 as well).
 * The math is f32 for f32 / f16 / bf16 data (a few ulp of f32, far inside those dtypes'
 * tolerances; clamp's bounds are compared exactly as the f64 ones would be) and f64 for
 * f64 data. On a CPU with AVX-512 (and its bf16 conversions) the unit rows of f32 and bf16
 * data run hand-written 16-lane loops instead (the "AVX-512 rows" below: the same math, softcap
 * by a rational tanh — for bf16 data cheaper forms within 2^-12 relative, still far inside
 * bf16's 8 bits — outputs of calls past 64 MiB stored past the caches); the loops above stay
 * the path of every other CPU and case.
 *
 * Each output whose input was broadcast is a sum over the broadcast dims, in f64, taken
 * per output element in a fixed order (deterministic whatever the thread count; OpenMP
 * over the output elements).
 */
#include "cpu.h"
#include "vec.h"

#include <float.h>
#include <stdio.h>
#include <string.h>

enum { UF_X, UF_Y };
enum { UB_DY, UB_X, UB_DX };
enum { BF_A, BF_B, BF_W, BF_Y };
enum { BB_DY, BB_A, BB_B, BB_W, BB_DA, BB_DB, BB_DW };

/* ------------------------------------------------------------------ f64 math (sums, f64 data) */

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

static void load_inputs(const fg_ew *e, const int64_t *off, double *v) {
    for (int i = 0; i < e->n_operands; i++)
        if ((e->present >> i & 1u) && !(e->outputs >> i & 1u)) v[i] = fg_load_f64(e->data[i], e->dtype, off[i]);
}

static void put(const fg_ew *e, int i, int64_t off, double v) {
    if (e->accumulate) v += fg_load_f64(e->data[i], e->dtype, off);
    fg_store_f64(e->data[i], e->dtype, off, v);
}

/* ------------------------------------------------------------------ rows */

/* The scalars of a problem as its rows use them. */
typedef struct ew_par {
    float s0, s1;
    float lo, hi;         /* clamp: the values it returns */
    float lo_in, hi_in;   /* clamp: x ≥ lo_in ⟺ x ≥ s[0] and x ≤ hi_in ⟺ x ≤ s[1] for every f32 x */
    float inv_c;          /* softcap: 1/c */
    bool bf16_math;       /* softcap of bf16 data on the AVX-512 rows: vec.h's bf16 forms, with sk */
    fg_softcap_bf16_k sk;
    bool stream;          /* AVX-512 rows: store the outputs past the caches (z_split) */
} ew_par;

/* The smallest f32 ≥ v, and the largest ≤ v. */
static float f32_at_least(double v) {
    float f = (float)v;
    return (double)f < v ? nextafterf(f, INFINITY) : f;
}

static float f32_at_most(double v) {
    float f = (float)v;
    return (double)f > v ? nextafterf(f, -INFINITY) : f;
}

static ew_par params_of(const fg_ew *e) {
    ew_par p;
    memset(&p, 0, sizeof p);
    p.s0 = (float)e->s[0];
    p.s1 = (float)e->s[1];
    if (e->kind == FG_UNARY_CLAMP && (e->op == FG_OP_UNARY_FORWARD || e->op == FG_OP_UNARY_BACKWARD)) {
        p.lo = (float)e->s[0];
        p.hi = (float)e->s[1];
        p.lo_in = f32_at_least(e->s[0]);
        p.hi_in = f32_at_most(e->s[1]);
    }
    if (e->kind == FG_UNARY_SOFTCAP) {
        p.inv_c = (float)(1.0 / e->s[0]);
        p.bf16_math = e->dtype == FG_BF16 && fg_softcap_bf16_consts(e->s[0], &p.sk);
    }
    return p;
}

/* A row: n elements; operand i's element k at ptr[i] + k·st[i] (elements). */
typedef struct ew_row {
    char *ptr[FG_EW_MAX_OPERANDS];
    int64_t st[FG_EW_MAX_OPERANDS];
} ew_row;

FG_INLINE void out_f(void *p, fg_dtype t, int64_t i, float v, bool acc) {
    if (acc) v += fg_v_ld(p, t, i);
    fg_v_st(p, t, i, v);
}

/* y = f(x) and dx = dy · f′(x), f32 math. unit: every stride is 1 (a constant at the call). */
FG_INLINE void unary_row(const fg_ew *e, const ew_par *p, fg_dtype t, bool unit, bool acc, const ew_row *r,
                         int64_t n) {
    const bool fwd = e->op == FG_OP_UNARY_FORWARD;
    const void *x = r->ptr[fwd ? UF_X : UB_X], *dy = r->ptr[UB_DY];
    void *y = r->ptr[fwd ? UF_Y : UB_DX];
    const int64_t sx = unit ? 1 : r->st[fwd ? UF_X : UB_X], sy = unit ? 1 : r->st[fwd ? UF_Y : UB_DX];
    const int64_t sd = unit ? 1 : r->st[UB_DY];
    const float s0 = p->s0;
    switch (e->kind) {
    case FG_UNARY_SCALE:
        if (fwd) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) out_f(y, t, k * sy, s0 * fg_v_ld(x, t, k * sx), acc);
        } else {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) out_f(y, t, k * sy, fg_v_ld(dy, t, k * sd) * s0, acc);
        }
        return;
    case FG_UNARY_POW:
        if (fwd) {
            for (int64_t k = 0; k < n; k++) out_f(y, t, k * sy, powf(fg_v_ld(x, t, k * sx), s0), acc);
        } else {
            for (int64_t k = 0; k < n; k++) {
                const float d = s0 == 0 ? 0.0f : s0 * powf(fg_v_ld(x, t, k * sx), s0 - 1.0f);
                out_f(y, t, k * sy, fg_v_ld(dy, t, k * sd) * d, acc);
            }
        }
        return;
    case FG_UNARY_LEAKY_RELU:
        if (fwd) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                const float v = fg_v_ld(x, t, k * sx);
                out_f(y, t, k * sy, v > 0 ? v : s0 * v, acc);
            }
        } else {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                const float v = fg_v_ld(x, t, k * sx);
                out_f(y, t, k * sy, fg_v_ld(dy, t, k * sd) * (v != v ? v : v > 0 ? 1.0f : s0), acc);
            }
        }
        return;
    case FG_UNARY_ELU: /* exp of the negative part only */
        if (fwd) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                const float v = fg_v_ld(x, t, k * sx), neg = v > 0 ? 0.0f : v;
                out_f(y, t, k * sy, v > 0 ? v : s0 * fg_v_expm1(neg), acc);
            }
        } else {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                const float v = fg_v_ld(x, t, k * sx), neg = v > 0 ? 0.0f : v;
                out_f(y, t, k * sy, fg_v_ld(dy, t, k * sd) * (v != v ? v : v > 0 ? 1.0f : s0 * fg_v_exp(neg)), acc);
            }
        }
        return;
    case FG_UNARY_CLAMP: {
        const float lo = p->lo, hi = p->hi, lo_in = p->lo_in, hi_in = p->hi_in;
        if (fwd) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                const float v = fg_v_ld(x, t, k * sx);
                out_f(y, t, k * sy, v < lo_in ? lo : v > hi_in ? hi : v, acc); /* NaN passes */
            }
        } else {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                const float v = fg_v_ld(x, t, k * sx);
                out_f(y, t, k * sy, fg_v_ld(dy, t, k * sd) * (v >= lo_in && v <= hi_in ? 1.0f : 0.0f), acc);
            }
        }
        return;
    }
    case FG_UNARY_SOFTCAP: {
        const float inv_c = p->inv_c;
        if (fwd) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++)
                out_f(y, t, k * sy, s0 * fg_v_tanh_slope(fg_v_ld(x, t, k * sx) * inv_c, NULL), acc);
        } else {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                float slope;
                fg_v_tanh_slope(fg_v_ld(x, t, k * sx) * inv_c, &slope);
                out_f(y, t, k * sy, fg_v_ld(dy, t, k * sd) * slope, acc);
            }
        }
        return;
    }
    }
}

/* lerp(a, b, w) in f32 as the f64 one: from the nearer end */
FG_INLINE float lerp_f(float a, float b, float w) {
    const float d = b - a;
    return w < 0.5f ? a + w * d : b - d * (1.0f - w);
}

/* operand i's stride in a row: 1 when the row is unit (a constant there) */
FG_INLINE int64_t row_st(const ew_row *r, bool unit, int i) { return unit ? 1 : r->st[i]; }

FG_INLINE void binary_row(const fg_ew *e, const ew_par *p, fg_dtype t, bool unit, bool acc, const ew_row *r,
                          int64_t n) {
    const float s0 = p->s0, s1 = p->s1;
    if (e->op == FG_OP_BINARY_FORWARD) {
        const void *a = r->ptr[BF_A], *b = r->ptr[BF_B], *w = r->ptr[BF_W];
        void *y = r->ptr[BF_Y];
        const int64_t sa = row_st(r, unit, BF_A), sb = row_st(r, unit, BF_B), sw = row_st(r, unit, BF_W), sy = row_st(r, unit, BF_Y);
        if (e->kind == FG_BINARY_AXPBY) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++)
                out_f(y, t, k * sy, s0 * fg_v_ld(a, t, k * sa) + s1 * fg_v_ld(b, t, k * sb), acc);
        } else if (e->present >> BF_W & 1u) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++)
                out_f(y, t, k * sy, lerp_f(fg_v_ld(a, t, k * sa), fg_v_ld(b, t, k * sb), fg_v_ld(w, t, k * sw)), acc);
        } else {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++)
                out_f(y, t, k * sy, lerp_f(fg_v_ld(a, t, k * sa), fg_v_ld(b, t, k * sb), s0), acc);
        }
        return;
    }
    /* backward: da, db, dw, whichever are direct outputs here (the caller clears the others) */
    const void *dy = r->ptr[BB_DY], *a = r->ptr[BB_A], *b = r->ptr[BB_B], *w = r->ptr[BB_W];
    void *da = r->ptr[BB_DA], *db = r->ptr[BB_DB], *dw = r->ptr[BB_DW];
    const int64_t sd = row_st(r, unit, BB_DY), sa = row_st(r, unit, BB_A), sb = row_st(r, unit, BB_B), sw = row_st(r, unit, BB_W);
    const int64_t sda = row_st(r, unit, BB_DA), sdb = row_st(r, unit, BB_DB), sdw = row_st(r, unit, BB_DW);
    const bool tw = e->present >> BB_W & 1u;
    float ca = s0, cb = s1; /* axpby: da = α·dy, db = β·dy */
    if (e->kind != FG_BINARY_AXPBY) ca = 1.0f - s0, cb = s0;
    if (e->kind == FG_BINARY_AXPBY || !tw) {
        if (da && db) {
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) {
                const float g = fg_v_ld(dy, t, k * sd);
                out_f(da, t, k * sda, ca * g, acc);
                out_f(db, t, k * sdb, cb * g, acc);
            }
        } else if (da || db) {
            void *o = da ? da : db;
            const int64_t so = da ? sda : sdb;
            const float c = da ? ca : cb;
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++) out_f(o, t, k * so, c * fg_v_ld(dy, t, k * sd), acc);
        }
        if (dw) { /* a scalar weight has no gradient operand; kept for completeness */
#pragma GCC ivdep
            for (int64_t k = 0; k < n; k++)
                out_f(dw, t, k * sdw, (fg_v_ld(b, t, k * sb) - fg_v_ld(a, t, k * sa)) * fg_v_ld(dy, t, k * sd), acc);
        }
        return;
    }
    /* lerp with a tensor weight */
#pragma GCC ivdep
    for (int64_t k = 0; k < n; k++) {
        const float g = fg_v_ld(dy, t, k * sd), wv = fg_v_ld(w, t, k * sw);
        if (da) out_f(da, t, k * sda, (1.0f - wv) * g, acc);
        if (db) out_f(db, t, k * sdb, wv * g, acc);
        if (dw) out_f(dw, t, k * sdw, (fg_v_ld(b, t, k * sb) - fg_v_ld(a, t, k * sa)) * g, acc);
    }
}

/* unit, acc: constants at the call (every stride 1; outputs added to) */
FG_INLINE void row_typed(const fg_ew *e, const ew_par *p, fg_dtype t, bool unit, bool acc, const ew_row *r,
                         int64_t n) {
    if (e->op == FG_OP_UNARY_FORWARD || e->op == FG_OP_UNARY_BACKWARD) unary_row(e, p, t, unit, acc, r, n);
    else binary_row(e, p, t, unit, acc, r, n);
}

FG_INLINE void row_unit_dtype(const fg_ew *e, const ew_par *p, fg_dtype t, const ew_row *r, int64_t n) {
    if (e->accumulate) row_typed(e, p, t, true, true, r, n);
    else row_typed(e, p, t, true, false, r, n);
}

/* A row whose every stride is 1, dispatched on dtype and accumulate (the streams' path). */
FG_CPU_CLONES
static void row_unit(const fg_ew *e, const ew_par *p, const ew_row *r, int64_t n) {
    switch (e->dtype) {
    case FG_F16: row_unit_dtype(e, p, FG_F16, r, n); break;
    case FG_BF16: row_unit_dtype(e, p, FG_BF16, r, n); break;
    default: row_unit_dtype(e, p, FG_F32, r, n); break;
    }
}

#ifdef FG_Z
/* ------------------------------------------------------------------ AVX-512 rows */

/* The unit rows of f32 / bf16 data on AVX-512 (vec.h's FG_Z helpers): the math of the rows
   above, 16 lanes at a time, the tail by lane masks; softcap by the rational tanh and the
   exp form of its slope (a few ulp of f32, as the loops above; bf16 data by vec.h's bf16 forms,
   32 elements at a time, z_softcap_bf16_row). pow and elu keep the loops above. */

/* y (or y + the stored value) at lanes k of element i */
FG_Z_INLINE void z_out(void *y, fg_dtype t, int64_t i, __mmask16 k, __m512 v, bool acc, bool nt) {
    if (nt) { /* a whole aligned vector, acc false (z_split) */
        fg_z_stream(y, t, i, v);
        return;
    }
    if (acc) v = _mm512_add_ps(fg_z_ld(y, t, i, k), v);
    fg_z_st(y, t, i, k, v);
}

/* A row's parts: [0, h) and [b, n) stored as usual, [h, b) in whole vectors streamed past the
   caches, whole vectors of w elements. Streaming is asked for (ew_par.stream) when a call touches
   at least FG_Z_STREAM_BYTES:
   its outputs will not stay in cache anyway, and an ordinary store first reads the line it
   writes (a third more traffic for lerp, two thirds more for lerp's backward). It needs every
   output at the same offset within a 64-byte line; h is where they reach a line's start. */
#define FG_Z_STREAM_BYTES ((int64_t)64 << 20)

typedef struct z_split {
    int64_t h, b;
} z_split;

FG_Z_INLINE z_split z_split_of(bool stream, fg_dtype t, void *o0, void *o1, void *o2, int64_t n, int64_t w) {
    z_split s = {0, 0};
    const size_t es = t == FG_BF16 ? 2 : 4;
    if (!stream || !o0) return s;
    const uintptr_t a = (uintptr_t)o0 & 63;
    if (a % es || (o1 && ((uintptr_t)o1 & 63) != a) || (o2 && ((uintptr_t)o2 & 63) != a)) return s;
    const int64_t h = (int64_t)(((64 - a) & 63) / es);
    if (h >= n) return s;
    s.h = h;
    s.b = h + (n - h) / w * w;
    return s;
}

/* lerp(a, b, w) from the nearer end, w per lane */
FG_Z_INLINE __m512 z_lerp(__m512 a, __m512 b, __m512 w) {
    const __m512 d = _mm512_sub_ps(b, a);
    const __m512 lo = _mm512_fmadd_ps(w, d, a);
    const __m512 hi = _mm512_fnmadd_ps(d, _mm512_sub_ps(_mm512_set1_ps(1.0f), w), b);
    return _mm512_mask_mov_ps(hi, _mm512_cmp_ps_mask(w, _mm512_set1_ps(0.5f), _CMP_LT_OQ), lo);
}

/* The loops below take their operands' pointers and scalars as locals (a store through a
   bf16 pointer may alias anything, so fields read through e or r would be read again for every
   vector) and op, kind, dtype and accumulate as constants at the call: one specialized loop per
   case, whole vectors then the tail. */

/* y = f(x) (fwd) or dx = dy·f′(x), f a unary kind */
FG_Z_INLINE void z_unary_vec(int kind, bool fwd, fg_dtype t, bool acc, bool nt, const void *xp, const void *dyp,
                             void *yp, const ew_par p, int64_t i, __mmask16 k) {
    const __m512 s0 = _mm512_set1_ps(p.s0);
    if (!fwd && kind == FG_UNARY_SCALE) { /* dx = dy·s, x not read */
        z_out(yp, t, i, k, _mm512_mul_ps(fg_z_ld(dyp, t, i, k), s0), acc, nt);
        return;
    }
    const __m512 x = fg_z_ld(xp, t, i, k);
    __m512 v;
    switch (kind) {
    case FG_UNARY_SCALE: v = _mm512_mul_ps(s0, x); break;
    case FG_UNARY_LEAKY_RELU: {
        const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
        if (fwd) v = _mm512_mask_mov_ps(_mm512_mul_ps(s0, x), pos, x);
        else { /* NaN where x is */
            const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            v = _mm512_mask_mov_ps(_mm512_mask_mov_ps(s0, pos, _mm512_set1_ps(1.0f)), nan, x);
        }
        break;
    }
    case FG_UNARY_CLAMP:
        if (fwd) { /* NaN passes */
            v = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_set1_ps(p.lo_in), _CMP_LT_OQ), _mm512_set1_ps(p.lo));
            v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(x, _mm512_set1_ps(p.hi_in), _CMP_GT_OQ), _mm512_set1_ps(p.hi));
        } else {
            const __mmask16 in = _mm512_cmp_ps_mask(x, _mm512_set1_ps(p.lo_in), _CMP_GE_OQ) &
                                 _mm512_cmp_ps_mask(x, _mm512_set1_ps(p.hi_in), _CMP_LE_OQ);
            v = _mm512_maskz_mov_ps(in, _mm512_set1_ps(1.0f));
        }
        break;
    default: { /* softcap */
        v = fwd ? fg_z_softcap(x, p.s0, p.inv_c) : fg_z_softcap_slope(x, p.inv_c);
        break;
    }
    }
    if (!fwd) v = _mm512_mul_ps(fg_z_ld(dyp, t, i, k), v);
    z_out(yp, t, i, k, v, acc, nt);
}

/* bf16 softcap with vec.h's bf16 forms: 32 elements an iteration in one load of each operand (the
   even- and odd-numbered elements in two f32 vectors) and one 64-byte store, the tail by lane
   masks. The whole-vector loops prefetch their operands' lines (the output's too when it is
   stored normally: the line is then owned before the store reaches it) Z_SOFTCAP_PF elements
   ahead: with the math between the loads, the hardware's prefetch alone left the loop waiting
   on memory from 2^20 elements up, and past FG_Z_STREAM_BYTES more so with non-temporal stores
   (which made streaming look slower than ordinary stores here). */
#define Z_SOFTCAP_PF 1024

FG_Z_INLINE void z_softcap_bf16_vec2(bool fwd, bool acc, bool nt, bool pf, const void *xp, const void *dyp, void *yp,
                                     const fg_softcap_bf16_k *sk, float inv_c, int64_t i, __mmask32 k) {
    if (pf) { /* the lines Z_SOFTCAP_PF elements on (a prefetch past the end is dropped) */
        const uintptr_t ahead = (uintptr_t)(i + Z_SOFTCAP_PF) * 2;
        _mm_prefetch((const char *)((uintptr_t)xp + ahead), _MM_HINT_T0);
        if (!fwd) _mm_prefetch((const char *)((uintptr_t)dyp + ahead), _MM_HINT_T0);
        if (!nt) _mm_prefetch((const char *)((uintptr_t)yp + ahead), _MM_HINT_T0);
    }
    __m512 x0, x1, v0, v1;
    const __m512i w = fg_z_ld_bf16_eo(xp, i, k, &x0, &x1);
    if (fwd) {
        v0 = fg_z_softcap_bf16(x0, sk);
        v1 = fg_z_softcap_bf16(x1, sk);
    } else {
        __m512 d0, d1;
        fg_z_ld_bf16_eo(dyp, i, k, &d0, &d1);
        v0 = _mm512_mul_ps(d0, fg_z_softcap_slope_bf16(x0, inv_c));
        v1 = _mm512_mul_ps(d1, fg_z_softcap_slope_bf16(x1, inv_c));
    }
    __m512i h;
    if (acc) {
        __m512 y0, y1;
        fg_z_ld_bf16_eo(yp, i, k, &y0, &y1);
        h = fg_z_bf16_eo(_mm512_add_ps(y0, v0), _mm512_add_ps(y1, v1));
    } else if (fwd) { /* y = x where x is ±0 or subnormal (exponent bits 0), the only lanes whose y is
                         subnormal (c ≥ 2^-28: fg_softcap_bf16_consts) */
        h = _mm512_mask_mov_epi16(fg_z_bf16_eo_ftz(v0, v1), _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x7f80)), w);
    } else {
        h = fg_z_bf16_eo(v0, v1);
    }
    if (nt) _mm512_stream_si512((__m512i *)((uint16_t *)yp + i), h); /* a whole aligned line, acc false */
    else _mm512_mask_storeu_epi16((uint16_t *)yp + i, k, h);
}

FG_Z_INLINE void z_softcap_bf16_row(bool fwd, bool acc, const ew_row *r, const ew_par *p, int64_t n) {
    const void *x = r->ptr[fwd ? UF_X : UB_X], *dy = r->ptr[UB_DY];
    void *y = r->ptr[fwd ? UF_Y : UB_DX];
    const fg_softcap_bf16_k sk = p->sk;
    const float inv_c = p->inv_c;
    const z_split s = z_split_of(p->stream && !acc, FG_BF16, y, NULL, NULL, n, 32);
    const __mmask32 all = 0xffffffffu;
    int64_t i = 0;
    for (; i < s.h; i += 32)
        z_softcap_bf16_vec2(fwd, acc, false, false, x, dy, y, &sk, inv_c, i,
                            s.h - i >= 32 ? all : (__mmask32)((1u << (s.h - i)) - 1u));
    i = s.h;
    for (; i < s.b; i += 32) z_softcap_bf16_vec2(fwd, false, true, true, x, dy, y, &sk, inv_c, i, all);
    if (s.b > s.h) _mm_sfence();
    for (; i + 32 <= n; i += 32) z_softcap_bf16_vec2(fwd, acc, false, true, x, dy, y, &sk, inv_c, i, all);
    if (i < n) z_softcap_bf16_vec2(fwd, acc, false, false, x, dy, y, &sk, inv_c, i, (__mmask32)((1u << (n - i)) - 1u));
}

FG_Z_INLINE void z_unary_row(int kind, bool fwd, fg_dtype t, bool acc, const ew_row *r, const ew_par *p, int64_t n) {
    if (kind == FG_UNARY_SOFTCAP && t == FG_BF16 && p->bf16_math) {
        z_softcap_bf16_row(fwd, acc, r, p, n);
        return;
    }
    const void *x = r->ptr[fwd ? UF_X : UB_X], *dy = r->ptr[UB_DY];
    void *y = r->ptr[fwd ? UF_Y : UB_DX];
    const ew_par q = *p;
    /* (bf16 softcap here — the f32 forms, for a c outside the bf16 forms' range — stores
       normally: streamed it measured slower, its loads starving without a prefetch) */
    const bool stream = q.stream && !acc && !(t == FG_BF16 && kind == FG_UNARY_SOFTCAP);
    const z_split s = z_split_of(stream, t, y, NULL, NULL, n, 16);
    int64_t i = 0;
    for (; i < s.h; i += 16) z_unary_vec(kind, fwd, t, acc, false, x, dy, y, q, i, fg_z_lanes(s.h - i));
    i = s.h;
    for (; i < s.b; i += 16) z_unary_vec(kind, fwd, t, false, true, x, dy, y, q, i, (__mmask16)0xffff);
    if (s.b > s.h) _mm_sfence();
    for (; i + 16 <= n; i += 16) z_unary_vec(kind, fwd, t, acc, false, x, dy, y, q, i, (__mmask16)0xffff);
    if (i < n) z_unary_vec(kind, fwd, t, acc, false, x, dy, y, q, i, fg_z_lanes(n - i));
}

/* y = α·a + β·b (axpby), or lerp(a, b, w) with w the tensor wp or, when wp is NULL, s0 */
FG_Z_INLINE void z_binary_fwd_vec(int kind, bool tw, fg_dtype t, bool acc, bool nt, const void *ap, const void *bp,
                                  const void *wp, void *yp, float s0, float s1, int64_t i, __mmask16 k) {
    const __m512 a = fg_z_ld(ap, t, i, k), b = fg_z_ld(bp, t, i, k);
    __m512 v;
    if (kind == FG_BINARY_AXPBY) v = _mm512_fmadd_ps(_mm512_set1_ps(s1), b, _mm512_mul_ps(_mm512_set1_ps(s0), a));
    else v = z_lerp(a, b, tw ? fg_z_ld(wp, t, i, k) : _mm512_set1_ps(s0));
    z_out(yp, t, i, k, v, acc, nt);
}

FG_Z_INLINE void z_binary_fwd_row(int kind, bool tw, fg_dtype t, bool acc, const ew_row *r, const ew_par *p,
                                  int64_t n) {
    const void *a = r->ptr[BF_A], *b = r->ptr[BF_B], *w = r->ptr[BF_W];
    void *y = r->ptr[BF_Y];
    const float s0 = p->s0, s1 = p->s1;
    const z_split s = z_split_of(p->stream && !acc, t, y, NULL, NULL, n, 16);
    int64_t i = 0;
    for (; i < s.h; i += 16) z_binary_fwd_vec(kind, tw, t, acc, false, a, b, w, y, s0, s1, i, fg_z_lanes(s.h - i));
    i = s.h;
    for (; i < s.b; i += 16) z_binary_fwd_vec(kind, tw, t, false, true, a, b, w, y, s0, s1, i, (__mmask16)0xffff);
    if (s.b > s.h) _mm_sfence();
    for (; i + 16 <= n; i += 16) z_binary_fwd_vec(kind, tw, t, acc, false, a, b, w, y, s0, s1, i, (__mmask16)0xffff);
    if (i < n) z_binary_fwd_vec(kind, tw, t, acc, false, a, b, w, y, s0, s1, i, fg_z_lanes(n - i));
}

/* whichever of da, db, dw are direct outputs here (the others NULL): da = ca·dy, db = cb·dy
   with (ca, cb) = (α, β) for axpby, (1 − w, w) for lerp (w the tensor wp when tw), and
   dw = (b − a)·dy */
FG_Z_INLINE void z_binary_bwd_vec(bool tw, fg_dtype t, bool acc, bool nt, const void *dyp, const void *ap, const void *bp,
                                  const void *wp, void *da, void *db, void *dw, float ca, float cb, int64_t i,
                                  __mmask16 k) {
    const __m512 dy = fg_z_ld(dyp, t, i, k);
    __m512 va = _mm512_set1_ps(ca), vb = _mm512_set1_ps(cb);
    if (tw) {
        vb = fg_z_ld(wp, t, i, k);
        va = _mm512_sub_ps(_mm512_set1_ps(1.0f), vb);
    }
    if (da) z_out(da, t, i, k, _mm512_mul_ps(va, dy), acc, nt);
    if (db) z_out(db, t, i, k, _mm512_mul_ps(vb, dy), acc, nt);
    if (dw) z_out(dw, t, i, k, _mm512_mul_ps(_mm512_sub_ps(fg_z_ld(bp, t, i, k), fg_z_ld(ap, t, i, k)), dy), acc, nt);
}

FG_Z_INLINE void z_binary_bwd_row(bool tw, fg_dtype t, bool acc, const fg_ew *e, const ew_row *r, const ew_par *p,
                                  int64_t n) {
    const void *dy = r->ptr[BB_DY], *a = r->ptr[BB_A], *b = r->ptr[BB_B], *w = r->ptr[BB_W];
    void *da = r->ptr[BB_DA], *db = r->ptr[BB_DB], *dw = r->ptr[BB_DW];
    float ca = p->s0, cb = p->s1;
    if (e->kind != FG_BINARY_AXPBY) ca = 1.0f - p->s0, cb = p->s0;
    void *o0 = da ? da : db ? db : dw;
    const z_split s = z_split_of(p->stream && !acc, t, o0, db, dw, n, 16);
    int64_t i = 0;
    for (; i < s.h; i += 16) z_binary_bwd_vec(tw, t, acc, false, dy, a, b, w, da, db, dw, ca, cb, i, fg_z_lanes(s.h - i));
    i = s.h;
    for (; i < s.b; i += 16) z_binary_bwd_vec(tw, t, false, true, dy, a, b, w, da, db, dw, ca, cb, i, (__mmask16)0xffff);
    if (s.b > s.h) _mm_sfence();
    for (; i + 16 <= n; i += 16) z_binary_bwd_vec(tw, t, acc, false, dy, a, b, w, da, db, dw, ca, cb, i, (__mmask16)0xffff);
    if (i < n) z_binary_bwd_vec(tw, t, acc, false, dy, a, b, w, da, db, dw, ca, cb, i, fg_z_lanes(n - i));
}

FG_Z_INLINE void z_unary_kind(bool fwd, fg_dtype t, bool acc, const fg_ew *e, const ew_row *r, const ew_par *p,
                              int64_t n) {
    switch (e->kind) {
    case FG_UNARY_SCALE: z_unary_row(FG_UNARY_SCALE, fwd, t, acc, r, p, n); break;
    case FG_UNARY_LEAKY_RELU: z_unary_row(FG_UNARY_LEAKY_RELU, fwd, t, acc, r, p, n); break;
    case FG_UNARY_CLAMP: z_unary_row(FG_UNARY_CLAMP, fwd, t, acc, r, p, n); break;
    default: z_unary_row(FG_UNARY_SOFTCAP, fwd, t, acc, r, p, n); break;
    }
}

FG_Z_INLINE void z_row_typed(const fg_ew *e, const ew_par *p, fg_dtype t, bool acc, const ew_row *r, int64_t n) {
    switch (e->op) {
    case FG_OP_UNARY_FORWARD: z_unary_kind(true, t, acc, e, r, p, n); break;
    case FG_OP_UNARY_BACKWARD: z_unary_kind(false, t, acc, e, r, p, n); break;
    case FG_OP_BINARY_FORWARD:
        if (e->kind == FG_BINARY_AXPBY) z_binary_fwd_row(FG_BINARY_AXPBY, false, t, acc, r, p, n);
        else if (e->present >> BF_W & 1u) z_binary_fwd_row(FG_BINARY_LERP, true, t, acc, r, p, n);
        else z_binary_fwd_row(FG_BINARY_LERP, false, t, acc, r, p, n);
        break;
    default:
        if (e->kind != FG_BINARY_AXPBY && (e->present >> BB_W & 1u)) z_binary_bwd_row(true, t, acc, e, r, p, n);
        else z_binary_bwd_row(false, t, acc, e, r, p, n);
        break;
    }
}

FG_Z_KERNEL
static void row_unit_z(const fg_ew *e, const ew_par *p, const ew_row *r, int64_t n) {
    const fg_dtype t = e->dtype;
    if (t == FG_BF16) {
        if (e->accumulate) z_row_typed(e, p, FG_BF16, true, r, n);
        else z_row_typed(e, p, FG_BF16, false, r, n);
    } else {
        if (e->accumulate) z_row_typed(e, p, FG_F32, true, r, n);
        else z_row_typed(e, p, FG_F32, false, r, n);
    }
}

/* Whether the AVX-512 rows take this problem (chosen once per call). */
static bool z_takes(const fg_ew *e) {
    if (e->dtype != FG_F32 && e->dtype != FG_BF16) return false;
    if ((e->op == FG_OP_UNARY_FORWARD || e->op == FG_OP_UNARY_BACKWARD) &&
        (e->kind == FG_UNARY_POW || e->kind == FG_UNARY_ELU))
        return false;
    return fg_z_usable();
}
#endif

/* Any other row (strided or broadcast operands): the same math, element by element. */
static void row_strided(const fg_ew *e, const ew_par *p, const ew_row *r, int64_t n) {
    switch (e->dtype) {
    case FG_F16: row_typed(e, p, FG_F16, false, e->accumulate, r, n); break;
    case FG_BF16: row_typed(e, p, FG_BF16, false, e->accumulate, r, n); break;
    default: row_typed(e, p, FG_F32, false, e->accumulate, r, n); break;
    }
}

/* f64 data: the same rows in f64 math (one element at a time through value()). */
static void row_f64(const fg_ew *e, unsigned direct, const ew_row *r, int64_t n) {
    const unsigned inputs = e->present & ~e->outputs;
    for (int64_t k = 0; k < n; k++) {
        double v[FG_EW_MAX_OPERANDS] = {0};
        for (int j = 0; j < e->n_operands; j++)
            if (inputs >> j & 1u) v[j] = ((const double *)r->ptr[j])[k * r->st[j]];
        for (int i = 0; i < e->n_operands; i++) {
            if (!(direct >> i & 1u)) continue;
            double *o = (double *)r->ptr[i] + k * r->st[i];
            const double x = value(e, i, v);
            *o = e->accumulate ? x + *o : x;
        }
    }
}

/* Elements [lo, hi) of the full shape (row-major order over it), rows of the innermost dim. */
static void walk(const fg_ew *e, const ew_par *p, unsigned direct, bool z, int64_t lo, int64_t hi) {
    const int rank = e->rank > 0 ? e->rank : 1;
    const int64_t inner = e->rank > 0 ? e->shape[rank - 1] : 1;
    const size_t es = fg_dtype_size(e->dtype);
    const unsigned used = (e->present & ~e->outputs) | direct;
    bool unit = true;
    for (int i = 0; i < e->n_operands; i++)
        if ((used >> i & 1u) && e->rank > 0 && e->stride[i][rank - 1] != 1 && inner > 1) unit = false;
    int64_t idx = lo;
    while (idx < hi) {
        const int64_t row = idx / inner, col = idx % inner;
        const int64_t len = inner - col < hi - idx ? inner - col : hi - idx;
        int64_t coord[FG_MAX_RANK];
        int64_t q = row;
        for (int d = rank - 2; d >= 0; d--) {
            coord[d] = q % e->shape[d];
            q /= e->shape[d];
        }
        ew_row r;
        for (int i = 0; i < FG_EW_MAX_OPERANDS; i++) {
            r.ptr[i] = NULL;
            r.st[i] = 0;
            if (i >= e->n_operands || !(used >> i & 1u)) continue;
            int64_t off = e->rank > 0 ? col * e->stride[i][rank - 1] : 0;
            for (int d = 0; d < rank - 1; d++) off += coord[d] * e->stride[i][d];
            r.ptr[i] = (char *)e->data[i] + off * (int64_t)es;
            r.st[i] = e->rank > 0 ? e->stride[i][rank - 1] : 0;
        }
        if (e->dtype == FG_F64) row_f64(e, direct, &r, len);
#ifdef FG_Z
        else if (unit && z) row_unit_z(e, p, &r, len);
#endif
        else if (unit) row_unit(e, p, &r, len);
        else row_strided(e, p, &r, len);
        idx += len;
    }
}

fg_status fg_cpu_elementwise(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws, size_t ws_bytes,
                             bool run) {
    (void)ws;
    (void)ws_bytes;
    const unsigned direct = e->outputs & e->present & ~e->reduced;
    const unsigned summed = e->outputs & e->present & e->reduced;
    snprintf(info->name, sizeof info->name, "cpu:elementwise(rank %d)%s", e->rank, summed ? "+ordered sums" : "");
    info->accumulator = e->dtype == FG_F64 || summed ? FG_F64 : FG_F32;
    if (!run || e->numel == 0) return FG_OK;
    if (direct) {
        /* the outputs written here, the others left out of the rows */
        fg_ew d = *e;
        for (int i = 0; i < e->n_operands; i++)
            if ((e->outputs >> i & 1u) && !(direct >> i & 1u)) d.present &= ~(1u << i);
        ew_par p = params_of(&d);
#ifdef FG_Z
        const bool z = z_takes(&d);
        int used = 0;
        for (int i = 0; i < d.n_operands; i++) used += (((d.present & ~d.outputs) | direct) >> i) & 1u;
        p.stream = z && !d.accumulate && e->numel * (int64_t)fg_dtype_size(e->dtype) * used >= FG_Z_STREAM_BYTES;
#else
        const bool z = false;
#endif
        /* a share is at least 2^15 elements; shares split at 64-byte multiples */
        const int team = fg_cpu_team(ctx, e->numel, 1 << 15);
        if (team == 1) {
            walk(&d, &p, direct, z, 0, e->numel);
        } else {
#pragma omp parallel num_threads(team)
            {
                int64_t lo, hi;
                fg_cpu_share(e->numel, omp_get_num_threads(), omp_get_thread_num(), 32, &lo, &hi);
                walk(&d, &p, direct, z, lo, hi);
            }
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
        const int team = fg_cpu_team(ctx, n_out * n_red, 1 << 15);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
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

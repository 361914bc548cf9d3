/*
 * attention.c — the CPU backend's attention (the reference the CUDA kernels are tested
 * against): forward and backward per (sequence, head), the heads spread over OpenMP threads.
 * Each (sequence, head) is one thread's from start to end — its K and V converted once to
 * f32 (f64 for f64), the rows walked in order, dK and dV summed in that order — so the result
 * does not depend on the thread count, and memory is O(L·hd) per thread (the workspace: one
 * slice a thread). The body is src/cpu/attention_rows.h, in f32 and in f64.
 *
 * Key-padding lengths are checked here, where the host sees them: a length outside [0, L]
 * makes every output of its sequence NaN and raises FG_FLAG_BAD_LENGTH (fg_context_check), as
 * the CUDA kernels do on the device.
 */
#include "cpu.h"
#include "vec.h"

#include "../core/rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* 64 bytes of lanes and their masks (GCC / Clang vector types: one text for every x86 level the
   clones compile, and for other targets). The helpers taking and returning them are always
   inlined, so the ABI note GCC gives for 64-byte vector arguments does not apply. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float vec_f32 __attribute__((vector_size(64)));
typedef int32_t vmask_f32 __attribute__((vector_size(64)));
typedef double vec_f64 __attribute__((vector_size(64)));
typedef int64_t vmask_f64 __attribute__((vector_size(64)));
typedef float vhalf_f32 __attribute__((vector_size(32)));
typedef float vquarter_f32 __attribute__((vector_size(16)));
typedef double vhalf_f64 __attribute__((vector_size(32)));
typedef double vquarter_f64 __attribute__((vector_size(16)));

/* n contiguous floats copied in 64-, 32-, 16-byte pieces and single elements: the rows here are
   short (hd, L), where the call a plain loop becomes (memmove) costs more than the copy. */
FG_INLINE void copy_f32(float *restrict dst, const float *restrict src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vec_f32 v;
        memcpy(&v, src + i, sizeof v);
        memcpy(dst + i, &v, sizeof v);
    }
    if (i + 8 <= n) {
        vhalf_f32 v;
        memcpy(&v, src + i, sizeof v);
        memcpy(dst + i, &v, sizeof v);
        i += 8;
    }
    if (i + 4 <= n) {
        vquarter_f32 v;
        memcpy(&v, src + i, sizeof v);
        memcpy(dst + i, &v, sizeof v);
        i += 4;
    }
    if (i < n) dst[i] = src[i];
    if (i + 1 < n) dst[i + 1] = src[i + 1];
    if (i + 2 < n) dst[i + 2] = src[i + 2];
}

/* A strided row of n elements of dtype t (from element off) as f32, and f32 values stored into
 * one (added to what is there when add); the dtype switch outside the loops, so each loop is
 * one conversion the compiler can vectorize. */
FG_INLINE void ld_row_f32(float *restrict dst, const void *src, fg_dtype t, int64_t off, int64_t st, int64_t n) {
    switch (t) {
    case FG_F16: {
        const uint16_t *p = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = fg_v_f16_to_f32(p[i * st]);
        break;
    }
    case FG_BF16: {
        const uint16_t *p = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = fg_v_bf16_to_f32(p[i * st]);
        break;
    }
    case FG_F64: {
        const double *p = (const double *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)p[i * st];
        break;
    }
    default: {
        const float *p = (const float *)src + off;
        if (st == 1) copy_f32(dst, p, n);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = p[i * st];
        break;
    }
    }
}

FG_INLINE void st_row_f32(void *dst, fg_dtype t, int64_t off, int64_t st, const float *restrict src, int64_t n, bool add) {
    switch (t) {
    case FG_F16: {
        uint16_t *p = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i * st] = fg_v_f32_to_f16(add ? fg_v_f16_to_f32(p[i * st]) + src[i] : src[i]);
        break;
    }
    case FG_BF16: {
        uint16_t *p = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++)
            p[i * st] = fg_v_f32_to_bf16(add ? fg_v_bf16_to_f32(p[i * st]) + src[i] : src[i]);
        break;
    }
    case FG_F64: {
        double *p = (double *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i * st] = add ? p[i * st] + src[i] : src[i];
        break;
    }
    default: {
        float *p = (float *)dst + off;
        if (st == 1 && !add) copy_f32(p, src, n);
        else
            for (int64_t i = 0; i < n; i++) p[i * st] = add ? p[i * st] + src[i] : src[i];
        break;
    }
    }
}

/* The same in f64 (an f64 problem's operands are all f64). */
FG_INLINE void ld_row_f64(double *restrict dst, const void *src, fg_dtype t, int64_t off, int64_t st, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = fg_v_ldd(src, t, off + i * st);
}

FG_INLINE void st_row_f64(void *dst, fg_dtype t, int64_t off, int64_t st, const double *restrict src, int64_t n, bool add) {
    for (int64_t i = 0; i < n; i++)
        fg_v_std(dst, t, off + i * st, add ? fg_v_ldd(dst, t, off + i * st) + src[i] : src[i]);
}

#define REAL float
#define LD(p, t, i) fg_v_ld(p, t, i)
#define ST(p, t, i, v) fg_v_st(p, t, i, v)
#define LD_ROW ld_row_f32
#define ST_ROW st_row_f32
#define EXP(x) fg_v_exp(x)
#define LOG(x) logf(x)
#define FWD_UNIT fwd_unit_f32
#define BWD_UNIT bwd_unit_f32
#define LANES 16
#define VLD vld_f32
#define VST vst_f32
#define VSEL vsel_f32
#define VBELOW vbelow_f32
#define VSUM vsum_f32
#define VEC vec_f32
#define VMASK vmask_f32
#define VHALF vhalf_f32
#define VQUARTER vquarter_f32
#define MASKINT int32_t
#define LANE_SUM lane_sum_f32
#define LANE_DOT lane_dot_f32
#define LANE_MAX lane_max_f32
#define LOAD_KV load_kv_f32
#define LOAD_SROW load_srow_f32
#include "attention_rows.h" /* (it undefines these parameters at its end) */

#define REAL double
#define LD(p, t, i) fg_v_ldd(p, t, i)
#define ST(p, t, i, v) fg_v_std(p, t, i, v)
#define LD_ROW ld_row_f64
#define ST_ROW st_row_f64
#define EXP(x) exp(x)
#define LOG(x) log(x)
#define FWD_UNIT fwd_unit_f64
#define BWD_UNIT bwd_unit_f64
#define LANES 8
#define VLD vld_f64
#define VST vst_f64
#define VSEL vsel_f64
#define VBELOW vbelow_f64
#define VSUM vsum_f64
#define VEC vec_f64
#define VMASK vmask_f64
#define VHALF vhalf_f64
#define VQUARTER vquarter_f64
#define MASKINT int64_t
#define LANE_SUM lane_sum_f64
#define LANE_DOT lane_dot_f64
#define LANE_MAX lane_max_f64
#define LOAD_KV load_kv_f64
#define LOAD_SROW load_srow_f64
#include "attention_rows.h" /* (it undefines these parameters at its end) */

/* Bytes of one thread's slice of the workspace (64-byte multiples). */
static size_t slice_bytes(const fg_attn_problem *p) {
    const size_t real = p->dtype == FG_F64 ? 8 : 4, lanes = 64 / real;
    const size_t Lp = ((size_t)p->L + lanes - 1) / lanes * lanes, hd = (size_t)p->hd;
    const size_t n = p->forward ? 2 * hd * Lp + 2 * Lp + 2 * hd : 4 * hd * Lp + 4 * Lp + 4 * hd;
    return (n * real + 63) & ~(size_t)63;
}

fg_status fg_cpu_attn_plan(fg_context *ctx, const fg_attn_problem *p, fg_attn_path *path) {
    memset(path, 0, sizeof *path);
    path->kernel = FG_ATTN_CPU;
    path->workspace = slice_bytes(p) * (size_t)fg_cpu_threads(ctx);
    snprintf(path->name, sizeof path->name, "attn_rows_%s<%s>", p->forward ? "fwd" : "bwd", fg_dtype_name(p->dtype));
    return FG_OK;
}

static int64_t length_of(const fg_attn_call *c, int64_t b) {
    if (!c->lengths) return c->p.L;
    return c->p.ldtype == FG_I32 ? (int64_t)((const int32_t *)c->lengths)[b] : ((const int64_t *)c->lengths)[b];
}

/* Every element of view v's sequence b ([H, L, X]) set to NaN. */
static void fill_nan(const fg_attn_view *v, fg_dtype t, int64_t b, int64_t H, int64_t L, int64_t X) {
    if (!v->data) return;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t x = 0; x < X; x++) fg_v_std(v->data, t, b * v->sb + h * v->sh + i * v->sl + x * v->sx, NAN);
}

fg_status fg_cpu_attn(fg_context *ctx, const fg_attn_call *c) {
    const fg_attn_problem *p = &c->p;
    const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd;
    const size_t slice = slice_bytes(p);
    if (slice > c->ws_bytes)
        return fg_fail(FG_ERR_WORKSPACE, "attention: workspace of %zu bytes given, %zu needed", c->ws_bytes, slice);
    int64_t bad = -1;
    for (int64_t b = 0; b < B && c->lengths; b++) {
        const int64_t len = length_of(c, b);
        if (len >= 0 && len <= L) continue;
        if (bad < 0) bad = b;
        if (p->forward) {
            fill_nan(&c->o, p->dtype, b, H, L, hd);
            fill_nan(&c->scores_out, p->sdtype, b, H, L, L);
            for (int64_t e = 0; e < H * L; e++) fg_v_std(c->lse, p->acc, b * H * L + e, NAN);
        } else {
            fill_nan(&c->dq, p->dtype, b, H, L, hd);
            fill_nan(&c->dk, p->dtype, b, H, L, hd);
            fill_nan(&c->dv, p->dtype, b, H, L, hd);
            fill_nan(&c->dscores_in, p->sdtype, b, H, L, L);
        }
    }
    if (bad >= 0) fg_host_flag_raise(ctx, FG_FLAG_BAD_LENGTH, bad);
    const int64_t units = B * H;
    int team = fg_cpu_team(ctx, units * L * (L + 1) * (hd + 1), 1 << 16);
    if (slice && (size_t)team > c->ws_bytes / slice) team = (int)(c->ws_bytes / slice);
    if (team < 1) team = 1;
    const bool f64 = p->dtype == FG_F64;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int tid = team > 1 ? omp_get_thread_num() : 0;
        void *buf = (char *)c->ws + (size_t)tid * slice;
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t b = u / H, h = u % H;
            const int64_t len = length_of(c, b);
            if (len < 0 || len > L) continue;
            if (p->forward) {
                if (f64) fwd_unit_f64(c, b, h, len, buf);
                else fwd_unit_f32(c, b, h, len, buf);
            } else {
                if (f64) bwd_unit_f64(c, b, h, len, buf);
                else bwd_unit_f32(c, b, h, len, buf);
            }
        }
    }
    fg_record_kernel(ctx, c->path.name);
    return FG_OK;
}

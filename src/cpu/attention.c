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
   inlined, so the ABI note GCC and Clang give for 64-byte vector arguments does not apply. */
#if defined(__GNUC__)
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

/* The attention dropout's keep decision along a row's keys in increasing order (rng.h's 16-bit
 * form): one Philox call serves eight keys. */
typedef struct attn_keep_walk {
    uint64_t q;
    fg_philox4 r;
} attn_keep_walk;
#define ATTN_KEEP_START {~(uint64_t)0, {{0, 0, 0, 0}}}

static inline bool attn_keep(attn_keep_walk *w, const fg_attn_call *c, uint64_t idx) {
    if (idx >> 3 != w->q) {
        w->q = idx >> 3;
        w->r = fg_dropout_block(c->seed, c->offset, w->q);
    }
    return fg_attn_dropout_half(&w->r, idx) >= c->keep_min;
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
#define LOAD_QK load_qk_f32
#define STORE_QK store_qk_f32
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
#define LOAD_QK load_qk_f64
#define STORE_QK store_qk_f64
#include "attention_rows.h" /* (it undefines these parameters at its end) */

/* ------------------------------------------------------------------ the short-head fast path */

/* PatchTST's heads (f32, hd = 4 or 8, L <= 64, no dropout, unit rows): the same per-row algorithm
 * as attention_rows.h, written for AVX-512 with a row's ≤ 4 key vectors held in registers from the
 * scores to P·V (one pass instead of a loop each), and the hd sums of P·V, dq reduced four at a
 * time (one transposing tree instead of four). The rows go in small groups, so that their
 * chains overlap and the horizontal steps and the dKᵀ/dVᵀ updates are shared, each row's sums kept
 * in its own order. Kᵀ and Vᵀ (dKᵀ, dVᵀ) sit in the thread's slice with Lp = NV·16 keys a row.
 * Chosen at run time where the CPU has AVX-512 and the views have unit rows; the sums' order is
 * fixed, so the result does not depend on the thread count either. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(FG_CPU_NO_CLONES)
#include <immintrin.h>
#define FG_ATTN_FAST 1
#define AVX512_FN FG_Z_MATH_INLINE
#define AVX512_KERNEL __attribute__((target(FG_Z_MATH_ISA)))

/* The four sums of a0 … a3's lanes, in lanes 0 … 3 (a fixed tree). */
AVX512_FN __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 b0 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    const __m512 b1 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
    __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, 0x88), _mm512_shuffle_f32x4(b0, b1, 0xDD));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0xB1));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4E));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c));
}

/* keys [0, n) of vector v as a lane mask */
AVX512_FN __mmask16 keys_below(int v, int64_t n) {
    const int64_t k = n - 16 * v;
    return k <= 0 ? 0 : k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << k) - 1);
}

/* Keys [j0, j0 + 16) of one head's K (or V), rows of 4 at src + j·sl, transposed into dst[x·Lp + j]
   (zero from len on): lane group l of vector r holds key j0 + 4l + r, so one 4 × 4 transpose inside
   each 128-bit lane (two rounds of unpacks) leaves component x of the 16 keys in key order. */
AVX512_FN void load_t16(const float *src, int64_t sl, int64_t j0, int64_t len, float *dst, int64_t Lp) {
    __m512 a[4];
    for (int r = 0; r < 4; r++) {
        __m128 row[4];
        for (int l = 0; l < 4; l++) {
            const int64_t j = j0 + 4 * l + r;
            row[l] = j < len ? _mm_loadu_ps(src + j * sl) : _mm_setzero_ps();
        }
        a[r] = _mm512_insertf32x4(_mm512_insertf32x4(_mm512_insertf32x4(_mm512_castps128_ps512(row[0]), row[1], 1), row[2], 2),
                                  row[3], 3);
    }
    const __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]), t1 = _mm512_unpackhi_ps(a[0], a[1]);
    const __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]), t3 = _mm512_unpackhi_ps(a[2], a[3]);
    _mm512_storeu_ps(dst + j0, _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2))));
    _mm512_storeu_ps(dst + Lp + j0, _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2))));
    _mm512_storeu_ps(dst + 2 * Lp + j0, _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3))));
    _mm512_storeu_ps(dst + 3 * Lp + j0, _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3))));
}

/* Kᵀ and Vᵀ of head (b, h) into kt, vt ([HD][Lp]): keys [0, len), zero past them; four components
   at a time. */
AVX512_FN void load_kv(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, int64_t Lp, float *kt, float *vt,
                       const int HD) {
    const float *k = (const float *)c->k.data + b * c->k.sb + h * c->k.sh;
    const float *v = (const float *)c->v.data + b * c->v.sb + h * c->v.sh;
    for (int64_t j0 = 0; j0 < Lp; j0 += 16)
        for (int x = 0; x < HD; x += 4) {
            load_t16(k + x, c->k.sl, j0, len, kt + x * Lp, Lp);
            load_t16(v + x, c->v.sl, j0, len, vt + x * Lp, Lp);
        }
}

/* Rows [i, i + n) of a head's scores (L each, stride sl), asked for PF_ROWS rows before the group
   that reads or writes them (past the head's last row come the next head's, which the thread takes
   next where the heads' rows are contiguous; a prefetch past the array does not fault). */
#define PF_ROWS 8
AVX512_FN void prefetch_rows(const float *base, int64_t sl, int64_t i, int n, int64_t L) {
    const char *a = (const char *)(base + i * sl), *e = (const char *)(base + (i + n - 1) * sl + L);
    for (; a < e; a += 64) _mm_prefetch(a, _MM_HINT_T0);
}

/* The maxima of a0 … a3's lanes, in lanes 0 … 3 (max is exact: any tree gives the same). */
AVX512_FN __m128 max4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 b0 = _mm512_max_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    const __m512 b1 = _mm512_max_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
    __m512 c = _mm512_max_ps(_mm512_shuffle_f32x4(b0, b1, 0x88), _mm512_shuffle_f32x4(b0, b1, 0xDD));
    c = _mm512_max_ps(c, _mm512_permute_ps(c, 0xB1));
    c = _mm512_max_ps(c, _mm512_permute_ps(c, 0x4E));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c));
}

/* The sums of a0 … a3's lanes, in lanes 0 … 3, each in _mm512_reduce_add_ps's tree (halves, then
   quarters, then lanes 0 + 2 and 1 + 3, then those two): sum4's first three rounds, its last two
   swapped. */
AVX512_FN __m128 total4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 b0 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    const __m512 b1 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
    __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, 0x88), _mm512_shuffle_f32x4(b0, b1, 0xDD));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4E));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0xB1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c));
}

/* Rows in groups of four: each row's sums are the one-row algorithm's, in its order, but the four
   rows' scores stay in registers together and their maxima and softmax sums are reduced by one
   transposing tree each, so the horizontal steps cost a quarter and the rows' chains overlap. A
   group past L repeats row L − 1 and stores nothing for it. */
AVX512_FN void fwd_head(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, float *buf, const int NV,
                        const int HD) {
    const fg_attn_problem *p = &c->p;
    const int64_t L = p->L, Lp = 16 * NV;
    float *kt = buf, *vt = buf + HD * Lp;
    load_kv(c, b, h, len, Lp, kt, vt, HD);
    const __m512 scale = _mm512_set1_ps((float)c->scale), ninf = _mm512_set1_ps(-INFINITY);
    const float *q = (const float *)c->q.data + b * c->q.sb + h * c->q.sh;
    float *o = (float *)c->o.data + b * c->o.sb + h * c->o.sh;
    const float *si = c->scores_in.data ? (const float *)c->scores_in.data + b * c->scores_in.sb + h * c->scores_in.sh : NULL;
    float *so = c->scores_out.data ? (float *)c->scores_out.data + b * c->scores_out.sb + h * c->scores_out.sh : NULL;
    float *lse = (float *)c->lse + (b * p->H + h) * L;
    for (int64_t i0 = 0; i0 < L; i0 += 4) {
        if (si) prefetch_rows(si, c->scores_in.sl, i0 + PF_ROWS, 4, L);
        if (so) prefetch_rows(so, c->scores_out.sl, i0 + PF_ROWS, 4, L);
        __m512 s[4][4], mx[4];
        __mmask16 km[4][4];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const int64_t i = i0 + r < L ? i0 + r : L - 1;
            const int64_t jend = p->causal ? (i + 1 < len ? i + 1 : len) : len;
            const float *qi = q + i * c->q.sl;
            __m512 qb[8]; /* (in registers across the stores below, which may alias q for all the compiler knows) */
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) qb[x] = _mm512_set1_ps(qi[x]);
            mx[r] = ninf;
            #pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                km[r][v] = keys_below(v, jend);
                __m512 a = _mm512_mul_ps(qb[0], _mm512_loadu_ps(kt + 16 * v));
                #pragma GCC unroll 8
                for (int x = 1; x < HD; x++) a = _mm512_fmadd_ps(qb[x], _mm512_loadu_ps(kt + x * Lp + 16 * v), a);
                a = si ? _mm512_fmadd_ps(a, scale, _mm512_maskz_loadu_ps(km[r][v], si + i * c->scores_in.sl + 16 * v))
                       : _mm512_mul_ps(a, scale);
                s[r][v] = _mm512_mask_mov_ps(ninf, km[r][v], a);
                if (so && i0 + r < L) _mm512_mask_storeu_ps(so + i * c->scores_out.sl + 16 * v, keys_below(v, L), s[r][v]);
                mx[r] = _mm512_max_ps(s[r][v], mx[r]); /* a NaN score is passed over (the second operand) */
            }
        }
        float m[4];
        _mm_storeu_ps(m, max4(mx[0], mx[1], mx[2], mx[3]));
        __m512 sum[4];
        __m128 acc[4][2]; /* o's HD sums, four a vector */
        bool none[4];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            sum[r] = _mm512_setzero_ps(), acc[r][0] = acc[r][1] = _mm_setzero_ps(), none[r] = false;
            if (m[r] == -INFINITY) { /* every score −∞ or NaN: NaN makes the row NaN; else no key, o = 0 */
                __mmask16 nan = 0;
                #pragma GCC unroll 4
                for (int v = 0; v < NV; v++) nan |= _mm512_cmp_ps_mask(s[r][v], s[r][v], _CMP_UNORD_Q);
                if (!nan) {
                    none[r] = true;
                    continue;
                }
                m[r] = NAN;
            }
            const __m512 mv = _mm512_set1_ps(m[r]);
            __m512 a[8];
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) a[x] = sum[r];
            #pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                const __m512 e = _mm512_maskz_mov_ps(km[r][v], fg_z_exp_neg(_mm512_sub_ps(s[r][v], mv)));
                sum[r] = _mm512_add_ps(sum[r], e);
                #pragma GCC unroll 8
                for (int x = 0; x < HD; x++) a[x] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vt + x * Lp + 16 * v), a[x]);
            }
            #pragma GCC unroll 2
            for (int x = 0; x < HD; x += 4) acc[r][x / 4] = sum4(a[x], a[x + 1], a[x + 2], a[x + 3]);
        }
        const __m128 tot4 = total4(sum[0], sum[1], sum[2], sum[3]);
        float tot[4], inv[4];
        _mm_storeu_ps(tot, tot4);
        _mm_storeu_ps(inv, _mm_div_ps(_mm_set1_ps(1.0f), tot4));
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (i0 + r == L) break;
            float *oi = o + (i0 + r) * c->o.sl;
            #pragma GCC unroll 2
            for (int x = 0; x < HD; x += 4)
                _mm_storeu_ps(oi + x, none[r] ? _mm_setzero_ps() : _mm_mul_ps(acc[r][x / 4], _mm_set1_ps(inv[r])));
            lse[i0 + r] = none[r] ? -INFINITY : m[r] + logf(tot[r]);
        }
    }
}

/* Rows in groups of ROWS, the key vectors outside: a key vector's dKᵀ and dVᵀ are loaded once a
   group, take the group's terms in row order in registers and are stored once; each row's HD dq
   lane sums stay in registers across the key vectors. At hd 4, three rows' sums, the eight dK/dV
   vectors and the temporaries fit the 32 registers (four rows spill); at hd 8 one row's (dK, dV
   and dq: 24 vectors). The sums' order is the row-by-row one. A group past L repeats row L − 1
   with no keys. */
#define BWD_ROWS 3
AVX512_FN void bwd_head(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, float *buf, const int NV,
                        const int HD) {
    const int ROWS = HD == 4 ? BWD_ROWS : 1;
    const fg_attn_problem *p = &c->p;
    const int64_t L = p->L, Lp = 16 * NV;
    float *kt = buf, *vt = kt + HD * Lp, *dkt = vt + HD * Lp, *dvt = dkt + HD * Lp;
    load_kv(c, b, h, len, Lp, kt, vt, HD);
    for (int64_t e = 0; e < HD * Lp; e += 16) {
        _mm512_storeu_ps(dkt + e, _mm512_setzero_ps());
        _mm512_storeu_ps(dvt + e, _mm512_setzero_ps());
    }
    const bool acc = p->accumulate;
    const __m512 scale = _mm512_set1_ps((float)c->scale);
    const float *q = (const float *)c->q.data + b * c->q.sb + h * c->q.sh;
    const float *o = (const float *)c->o.data + b * c->o.sb + h * c->o.sh;
    const float *dO = (const float *)c->d_o.data + b * c->d_o.sb + h * c->d_o.sh;
    const float *si = c->scores_in.data ? (const float *)c->scores_in.data + b * c->scores_in.sb + h * c->scores_in.sh : NULL;
    const float *g = c->dscores.data ? (const float *)c->dscores.data + b * c->dscores.sb + h * c->dscores.sh : NULL;
    float *dsi = c->dscores_in.data ? (float *)c->dscores_in.data + b * c->dscores_in.sb + h * c->dscores_in.sh : NULL;
    float *dq = c->dq.data ? (float *)c->dq.data + b * c->dq.sb + h * c->dq.sh : NULL;
    const float *lse = (const float *)c->lse + (b * p->H + h) * L;
    for (int64_t i0 = 0; i0 < L; i0 += ROWS) {
        if (si) prefetch_rows(si, c->scores_in.sl, i0 + PF_ROWS, ROWS, L);
        if (g) prefetch_rows(g, c->dscores.sl, i0 + PF_ROWS, ROWS, L);
        if (dsi) prefetch_rows(dsi, c->dscores_in.sl, i0 + PF_ROWS, ROWS, L);
        const float *qi[BWD_ROWS], *di[BWD_ROWS];
        __m512 lv[BWD_ROWS], Dv[BWD_ROWS], g4[BWD_ROWS * 4]; /* row r's dq sums at r·HD (ROWS·HD <= 12) */
        __mmask16 km[BWD_ROWS][4];
        int64_t ir[BWD_ROWS];
        #pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const int64_t i = i0 + r < L ? i0 + r : L - 1;
            const int64_t jend = p->causal ? (i + 1 < len ? i + 1 : len) : len;
            const float l = lse[i];
            const bool live = i0 + r < L && l != -INFINITY; /* an empty row, or one past L: no terms */
            #pragma GCC unroll 4
            for (int v = 0; v < NV; v++) km[r][v] = live ? keys_below(v, jend) : 0;
            ir[r] = i, qi[r] = q + i * c->q.sl, di[r] = dO + i * c->d_o.sl;
            const float *oi = o + i * c->o.sl;
            float D = 0;
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) D += di[r][x] * oi[x];
            lv[r] = _mm512_set1_ps(l), Dv[r] = _mm512_set1_ps(D);
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) g4[r * HD + x] = _mm512_setzero_ps();
        }
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const float *k0 = kt + 16 * v, *v0 = vt + 16 * v;
            float *dk0 = dkt + 16 * v, *dv0 = dvt + 16 * v;
            __m512 dk[8], dv[8];
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) dk[x] = _mm512_loadu_ps(dk0 + x * Lp), dv[x] = _mm512_loadu_ps(dv0 + x * Lp);
            #pragma GCC unroll 4
            for (int r = 0; r < ROWS; r++) {
                const __mmask16 m = km[r][v];
                __m512 qb[8], db[8]; /* (once a row: the stores below may alias q and do for the compiler) */
                #pragma GCC unroll 8
                for (int x = 0; x < HD; x++) qb[x] = _mm512_set1_ps(qi[r][x]), db[x] = _mm512_set1_ps(di[r][x]);
                __m512 a = _mm512_mul_ps(qb[0], _mm512_loadu_ps(k0));
                #pragma GCC unroll 8
                for (int x = 1; x < HD; x++) a = _mm512_fmadd_ps(qb[x], _mm512_loadu_ps(k0 + x * Lp), a);
                __m512 e = _mm512_mul_ps(db[0], _mm512_loadu_ps(v0));
                #pragma GCC unroll 8
                for (int x = 1; x < HD; x++) e = _mm512_fmadd_ps(db[x], _mm512_loadu_ps(v0 + x * Lp), e);
                a = si ? _mm512_fmadd_ps(a, scale, _mm512_maskz_loadu_ps(m, si + ir[r] * c->scores_in.sl + 16 * v))
                       : _mm512_mul_ps(a, scale);
                const __m512 pr = _mm512_maskz_mov_ps(m, fg_z_exp_neg(_mm512_sub_ps(a, lv[r])));
                __m512 d = _mm512_maskz_mul_ps(m, pr, _mm512_sub_ps(e, Dv[r]));
                if (g) d = _mm512_add_ps(d, _mm512_maskz_loadu_ps(m, g + ir[r] * c->dscores.sl + 16 * v));
                if (dsi && i0 + r < L) { /* ds, and 0 at the masked positions (nothing to add with accumulate) */
                    float *w = dsi + ir[r] * c->dscores_in.sl + 16 * v;
                    if (acc) _mm512_mask_storeu_ps(w, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, w), d));
                    else _mm512_mask_storeu_ps(w, keys_below(v, L), d);
                }
                /* dKᵀ, dVᵀ += this row's terms, the rows in order (keys past jend get nothing, not
                   0·q); dq's lanes */
                #pragma GCC unroll 8
                for (int x = 0; x < HD; x++) dk[x] = _mm512_mask3_fmadd_ps(d, qb[x], dk[x], m);
                #pragma GCC unroll 8
                for (int x = 0; x < HD; x++) dv[x] = _mm512_mask3_fmadd_ps(pr, db[x], dv[x], m);
                #pragma GCC unroll 8
                for (int x = 0; x < HD; x++) g4[r * HD + x] = _mm512_mask3_fmadd_ps(d, _mm512_loadu_ps(k0 + x * Lp), g4[r * HD + x], m);
            }
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) _mm512_storeu_ps(dk0 + x * Lp, dk[x]), _mm512_storeu_ps(dv0 + x * Lp, dv[x]);
        }
        #pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            if (!dq || i0 + r == L) break;
            float *w = dq + ir[r] * c->dq.sl;
            #pragma GCC unroll 2
            for (int x = 0; x < HD; x += 4) {
                const __m128 dq4 =
                    _mm_mul_ps(sum4(g4[r * HD + x], g4[r * HD + x + 1], g4[r * HD + x + 2], g4[r * HD + x + 3]), _mm512_castps512_ps128(scale));
                _mm_storeu_ps(w + x, acc ? _mm_add_ps(_mm_loadu_ps(w + x), dq4) : dq4);
            }
        }
    }
    float *dk = c->dk.data ? (float *)c->dk.data + b * c->dk.sb + h * c->dk.sh : NULL;
    float *dv = c->dv.data ? (float *)c->dv.data + b * c->dv.sb + h * c->dv.sh : NULL;
    const float sc = (float)c->scale;
    for (int64_t j = 0; j < L; j++) {
        if (dk) {
            float *r = dk + j * c->dk.sl;
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) r[x] = acc ? r[x] + dkt[x * Lp + j] * sc : dkt[x * Lp + j] * sc;
        }
        if (dv) {
            float *r = dv + j * c->dv.sl;
            #pragma GCC unroll 8
            for (int x = 0; x < HD; x++) r[x] = acc ? r[x] + dvt[x * Lp + j] : dvt[x * Lp + j];
        }
    }
}

/* Each (NV, HD) its own instance (the loops over keys and head dims unroll), hd 4 and hd 8 in
   functions of their own: inlined into one function, the hd-4 backward lost speed to the larger
   body's register allocation (decision 186). */
#define FAST_CASES(F, HD)                                                                                              \
    switch (nv) {                                                                                                      \
    case 1: F(c, b, h, len, buf, 1, HD); break;                                                                      \
    case 2: F(c, b, h, len, buf, 2, HD); break;                                                                      \
    case 3: F(c, b, h, len, buf, 3, HD); break;                                                                      \
    default: F(c, b, h, len, buf, 4, HD); break;                                                                     \
    }
AVX512_KERNEL __attribute__((noinline)) static void fast_unit4(const fg_attn_call *c, int64_t b, int64_t h, int64_t len,
                                                               float *buf) {
    const int nv = (int)((c->p.L + 15) / 16);
    if (c->p.forward) FAST_CASES(fwd_head, 4)
    else FAST_CASES(bwd_head, 4)
}
AVX512_KERNEL __attribute__((noinline)) static void fast_unit8(const fg_attn_call *c, int64_t b, int64_t h, int64_t len,
                                                               float *buf) {
    const int nv = (int)((c->p.L + 15) / 16);
    if (c->p.forward) FAST_CASES(fwd_head, 8)
    else FAST_CASES(bwd_head, 8)
}
#undef FAST_CASES
static void fast_unit(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, float *buf) {
    if (c->p.hd == 4) fast_unit4(c, b, h, len, buf);
    else fast_unit8(c, b, h, len, buf);
}

static bool unit_x(const fg_attn_view *v) { return !v->data || v->sx == 1; }

/* The fast path's case: f32 throughout, hd = 4 or 8, L <= 64, no dropout, q and k in one piece,
 * every view with unit rows. */
static bool fast_case(const fg_attn_call *c) {
    const fg_attn_problem *p = &c->p;
    if (p->dtype != FG_F32 || p->sdtype != FG_F32 || p->acc != FG_F32 || (p->hd != 4 && p->hd != 8) || p->L > 64 ||
        p->L < 1 || p->dropout || p->pieces != 1)
        return false;
    const fg_attn_view *v[12] = {&c->q, &c->k, &c->v, &c->o, &c->scores_in, &c->scores_out,
                                 &c->d_o, &c->dscores, &c->dq, &c->dk, &c->dv, &c->dscores_in};
    for (int i = 0; i < 12; i++)
        if (!unit_x(v[i])) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}
#endif

/* Bytes of one thread's slice of the workspace (64-byte multiples). */
static size_t slice_bytes(const fg_attn_problem *p) {
    const size_t real = p->dtype == FG_F64 ? 8 : 4, lanes = 64 / real;
    const size_t Lp = ((size_t)p->L + lanes - 1) / lanes * lanes, hd = (size_t)p->hd, hq = (size_t)p->pieces * hd;
    const size_t n = p->forward ? (hq + hd) * Lp + 2 * Lp + hq + hd : 2 * (hq + hd) * Lp + 4 * Lp + 2 * hq + 2 * hd;
    return (n * real + 63) & ~(size_t)63;
}

fg_status fg_cpu_attn_plan(fg_context *ctx, const fg_attn_problem *p, fg_attn_path *path) {
    memset(path, 0, sizeof *path);
    path->kernel = FG_ATTN_CPU;
    path->workspace = slice_bytes(p) * (size_t)fg_cpu_threads(ctx) + 64; /* + the slices' alignment */
    snprintf(path->name, sizeof path->name, "attn_rows_%s<%s>", p->forward ? "fwd" : "bwd", fg_dtype_name(p->dtype));
    return FG_OK;
}

static int64_t length_of(const fg_attn_call *c, int64_t b) {
    if (!c->lengths) return c->p.L;
    return c->p.ldtype == FG_I32 ? (int64_t)((const int32_t *)c->lengths)[b] : ((const int64_t *)c->lengths)[b];
}

/* Every element of view v's sequence b ([H, L, P, X]; P = 1 but for dq, dk in pieces) set to NaN. */
static void fill_nan(const fg_attn_view *v, fg_dtype t, int64_t b, int64_t H, int64_t L, int64_t P, int64_t X) {
    if (!v->data) return;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t pc = 0; pc < P; pc++)
                for (int64_t x = 0; x < X; x++)
                    fg_v_std(v->data, t, b * v->sb + h * v->sh + i * v->sl + pc * v->sp + x * v->sx, NAN);
}

fg_status fg_cpu_attn(fg_context *ctx, const fg_attn_call *c) {
    const fg_attn_problem *p = &c->p;
    const int64_t B = p->B, H = p->H, L = p->L, hd = p->hd;
    const size_t slice = slice_bytes(p);
    /* the slices start on 64-byte lines: a vector of the rows' buffers split across two lines is
       two accesses, and a store split so is not forwarded to the next row's load of it */
    const size_t skip = (size_t)(-(uintptr_t)c->ws & 63);
    char *const ws = (char *)c->ws + skip;
    const size_t ws_bytes = c->ws_bytes > skip ? c->ws_bytes - skip : 0;
    if (slice > ws_bytes)
        return fg_fail(FG_ERR_WORKSPACE, "attention: workspace of %zu bytes given, %zu needed", c->ws_bytes, slice + skip);
    int64_t bad = -1;
    for (int64_t b = 0; b < B && c->lengths; b++) {
        const int64_t len = length_of(c, b);
        if (len >= 0 && len <= L) continue;
        if (bad < 0) bad = b;
        if (p->forward) {
            fill_nan(&c->o, p->dtype, b, H, L, 1, hd);
            fill_nan(&c->scores_out, p->sdtype, b, H, L, 1, L);
            for (int64_t e = 0; e < H * L; e++) fg_v_std(c->lse, p->acc, b * H * L + e, NAN);
        } else {
            fill_nan(&c->dq, p->dtype, b, H, L, p->pieces, hd);
            fill_nan(&c->dk, p->dtype, b, H, L, p->pieces, hd);
            fill_nan(&c->dv, p->dtype, b, H, L, 1, hd);
            fill_nan(&c->dscores_in, p->sdtype, b, H, L, 1, L);
        }
    }
    if (bad >= 0) fg_host_flag_raise(ctx, FG_FLAG_BAD_LENGTH, bad);
    const int64_t units = B * H;
    int team = fg_cpu_team(ctx, units * L * (L + 1) * (p->pieces * hd + hd + 1), 1 << 16);
    if (slice && (size_t)team > ws_bytes / slice) team = (int)(ws_bytes / slice);
    if (team < 1) team = 1;
    const bool f64 = p->dtype == FG_F64;
#ifdef FG_ATTN_FAST
    const bool fast = fast_case(c);
#else
    const bool fast = false;
#endif
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int tid = team > 1 ? omp_get_thread_num() : 0;
        void *buf = ws + (size_t)tid * slice;
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t b = u / H, h = u % H;
            const int64_t len = length_of(c, b);
            if (len < 0 || len > L) continue;
#ifdef FG_ATTN_FAST
            if (fast) {
                fast_unit(c, b, h, len, buf);
                continue;
            }
#endif
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

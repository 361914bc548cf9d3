/*
 * dtype.c — element sizes, names and host conversions between f32, f16, bf16, f64.
 * Conversions round to nearest even, keep NaN a NaN and overflow to inf; they are
 * written with bit operations so they do not depend on compiler half-float support.
 */
#include "internal.h"

#include <string.h>

size_t fg_dtype_size(fg_dtype dtype) {
    switch (dtype) {
    case FG_F32: return 4;
    case FG_F16: return 2;
    case FG_BF16: return 2;
    case FG_F64: return 8;
    case FG_I32: return 4;
    case FG_I64: return 8;
    }
    return 0;
}

const char *fg_dtype_name(fg_dtype dtype) {
    switch (dtype) {
    case FG_F32: return "f32";
    case FG_F16: return "f16";
    case FG_BF16: return "bf16";
    case FG_F64: return "f64";
    case FG_I32: return "i32";
    case FG_I64: return "i64";
    }
    return "?";
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fg_f32_to_bf16(float value) {
    uint32_t u = f32_bits(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fg_bf16_to_f32(uint16_t bits) { return bits_f32((uint32_t)bits << 16); }

uint16_t fg_f32_to_f16(float value) {
    uint32_t u = f32_bits(value);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds past 65504: inf */
    if (absu < 0x38800000u) {                                   /* below 2^-14: subnormal */
        if (absu < 0x33000000u) return (uint16_t)sign;          /* under half of 2^-24 */
        uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* 14..24 */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absu >> 13) - (112u << 10));
    uint32_t rem = absu & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float fg_f16_to_f32(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exp = (bits >> 10) & 0x1fu;
    uint32_t mant = bits & 0x3ffu;
    if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        float f = (float)mant * (1.0f / 16777216.0f); /* mant · 2^-24 */
        return sign ? -f : f;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static double load_elem(const void *p, fg_dtype t, int64_t i) {
    switch (t) {
    case FG_F32: return ((const float *)p)[i];
    case FG_F16: return fg_f16_to_f32(((const uint16_t *)p)[i]);
    case FG_BF16: return fg_bf16_to_f32(((const uint16_t *)p)[i]);
    case FG_F64: return ((const double *)p)[i];
    default: break;
    }
    return 0.0;
}

static void store_elem(void *p, fg_dtype t, int64_t i, double v) {
    switch (t) {
    case FG_F32: ((float *)p)[i] = (float)v; break;
    /* f64 → f16/bf16 goes through f32: double rounding can differ from a direct
       rounding only in the last place of ties, which callers here never rely on. */
    case FG_F16: ((uint16_t *)p)[i] = fg_f32_to_f16((float)v); break;
    case FG_BF16: ((uint16_t *)p)[i] = fg_f32_to_bf16((float)v); break;
    case FG_F64: ((double *)p)[i] = v; break;
    default: break;
    }
}

fg_status fg_convert(const void *src, fg_dtype src_dtype, void *dst, fg_dtype dst_dtype,
                     int64_t n) {
    if (n < 0) return fg_fail(FG_ERR_INVALID_VALUE, "convert: n=%lld is negative", (long long)n);
    if (!fg_is_float(src_dtype))
        return fg_fail(FG_ERR_DTYPE, "convert: src_dtype=%d is not a float dtype", (int)src_dtype);
    if (!fg_is_float(dst_dtype))
        return fg_fail(FG_ERR_DTYPE, "convert: dst_dtype=%d is not a float dtype", (int)dst_dtype);
    if (n > INT64_MAX / 8) return fg_fail(FG_ERR_OVERFLOW, "convert: n=%lld elements overflow int64 bytes", (long long)n);
    if (n == 0) {
        fg_clear_error();
        return FG_OK;
    }
    if (!src) return fg_fail(FG_ERR_NULL_POINTER, "convert: src is NULL");
    if (!dst) return fg_fail(FG_ERR_NULL_POINTER, "convert: dst is NULL");
    if ((uintptr_t)src % fg_dtype_size(src_dtype) != 0)
        return fg_fail(FG_ERR_MISALIGNED, "convert: src=%p is not aligned to its %s elements", src,
                       fg_dtype_name(src_dtype));
    if ((uintptr_t)dst % fg_dtype_size(dst_dtype) != 0)
        return fg_fail(FG_ERR_MISALIGNED, "convert: dst=%p is not aligned to its %s elements", dst,
                       fg_dtype_name(dst_dtype));
    const uintptr_t s = (uintptr_t)src, d = (uintptr_t)dst;
    const uintptr_t sb = (uintptr_t)n * fg_dtype_size(src_dtype), db = (uintptr_t)n * fg_dtype_size(dst_dtype);
    if (s < d + db && d < s + sb) return fg_fail(FG_ERR_ALIAS, "convert: src and dst overlap");
    for (int64_t i = 0; i < n; i++) store_elem(dst, dst_dtype, i, load_elem(src, src_dtype, i));
    fg_clear_error();
    return FG_OK;
}

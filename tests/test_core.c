/*
 * test_core.c — the parts every op relies on: version, status names and messages,
 * dtype sizes and conversions (every f16 and bf16 bit pattern, rounding ties,
 * overflow, NaN), context creation and its bad arguments, workspaces, and the plan
 * API's own argument checks.
 */
#include "harness.h"

#include <math.h>

static void version_and_status(void) {
    TH_CHECK(fg_version() == FG_VERSION, "fg_version %u != FG_VERSION %u", fg_version(), (unsigned)FG_VERSION);
    for (int a = 0; a <= FG_ERR_INTERNAL; a++) {
        TH_CHECK(strncmp(fg_status_string((fg_status)a), a ? "FG_ERR_" : "FG_OK", a ? 7 : 5) == 0, "status %d name %s",
                 a, fg_status_string((fg_status)a));
        for (int b = 0; b < a; b++)
            TH_CHECK(strcmp(fg_status_string((fg_status)a), fg_status_string((fg_status)b)) != 0,
                     "statuses %d and %d share a name", a, b);
    }
    TH_CHECK(strcmp(fg_status_string((fg_status)1234), "FG_ERR_UNKNOWN") == 0, "unknown status name");
}

static void dtypes(void) {
    TH_CHECK(fg_dtype_size(FG_F32) == 4 && fg_dtype_size(FG_F16) == 2 && fg_dtype_size(FG_BF16) == 2 &&
                 fg_dtype_size(FG_F64) == 8 && fg_dtype_size((fg_dtype)9) == 0,
             "dtype sizes");
    /* every non-NaN bit pattern survives the round trip through f32 */
    int bad16 = 0, badbf = 0;
    for (uint32_t u = 0; u < 65536; u++) {
        float f = fg_f16_to_f32((uint16_t)u), g = fg_bf16_to_f32((uint16_t)u);
        if (isnan(f) ? !isnan(fg_f16_to_f32(fg_f32_to_f16(f))) : fg_f32_to_f16(f) != u) bad16++;
        if (isnan(g) ? !isnan(fg_bf16_to_f32(fg_f32_to_bf16(g))) : fg_f32_to_bf16(g) != u) badbf++;
    }
    TH_CHECK(bad16 == 0 && badbf == 0, "round trips: %d f16, %d bf16 patterns changed", bad16, badbf);
    /* values: ties to even, overflow, subnormals */
    TH_CHECK(fg_f32_to_f16(1.0f) == 0x3c00 && fg_f32_to_f16(-2.0f) == 0xc000, "f16 of 1, -2");
    TH_CHECK(fg_f32_to_f16(65504.0f) == 0x7bff && fg_f32_to_f16(65520.0f) == 0x7c00 && fg_f32_to_f16(1e10f) == 0x7c00,
             "f16 overflow");
    TH_CHECK(fg_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00 && fg_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02,
             "f16 ties to even");
    TH_CHECK(fg_f32_to_f16(5.9604645e-8f) == 0x0001 && fg_f32_to_f16(2.98e-8f) == 0x0000 &&
                 fg_f32_to_f16(6.0e-5f) == 0x03ef,
             "f16 subnormals: %04x %04x %04x", fg_f32_to_f16(5.9604645e-8f), fg_f32_to_f16(2.98e-8f),
             fg_f32_to_f16(6.0e-5f));
    TH_CHECK(fg_f32_to_bf16(1.0f) == 0x3f80 && fg_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80 &&
                 fg_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82 && fg_f32_to_bf16(3.4028235e38f) == 0x7f80,
             "bf16 rounding");
    TH_CHECK(isnan(fg_bf16_to_f32(fg_f32_to_bf16(NAN))) && isnan(fg_f16_to_f32(fg_f32_to_f16(NAN))), "NaN stays NaN");
    double src[5] = {1.5, -2.25, 1e-3, 3e5, -0.0}, back[5];
    uint16_t half[5];
    TH_OK(fg_convert(src, FG_F64, half, FG_BF16, 5));
    TH_OK(fg_convert(half, FG_BF16, back, FG_F64, 5));
    TH_CHECK(back[0] == 1.5 && back[1] == -2.25 && fabs(back[2] - 1e-3) < 1e-5 && fabs(back[3] - 3e5) < 2e3,
             "fg_convert values");
    TH_CHECK(fg_convert(src, FG_F64, src, FG_F32, 5) == FG_ERR_ALIAS, "fg_convert overlap");
    TH_CHECK(fg_convert(src, (fg_dtype)7, half, FG_F32, 5) == FG_ERR_DTYPE && strstr(fg_last_error(), "src_dtype"),
             "fg_convert dtype");
    TH_CHECK(fg_convert(NULL, FG_F32, half, FG_F32, 1) == FG_ERR_NULL_POINTER, "fg_convert NULL");
    /* integer dtypes: sized and named, carried by class targets, refused where floats are computed */
    TH_CHECK(fg_dtype_size(FG_I32) == 4 && fg_dtype_size(FG_I64) == 8, "integer dtype sizes");
    TH_CHECK(!strcmp(fg_dtype_name(FG_I32), "i32") && !strcmp(fg_dtype_name(FG_I64), "i64"), "integer dtype names");
    TH_CHECK(fg_convert(src, FG_I64, half, FG_F32, 5) == FG_ERR_DTYPE && strstr(fg_last_error(), "float"),
             "fg_convert of an integer dtype: %s", fg_last_error());
}

static void contexts(void) {
    fg_context *ctx = NULL;
    TH_OK(fg_context_create(NULL, &ctx));
    TH_CHECK(ctx != NULL, "NULL desc gives a CPU context");
    TH_OK(fg_context_check(ctx));
    TH_CHECK(fg_context_set_stream(ctx, (void *)16) == FG_ERR_INVALID_VALUE, "CPU stream");
    TH_OK(fg_context_set_stream(ctx, NULL));
    float ws[64];
    TH_CHECK(fg_context_set_workspace(ctx, (char *)ws + 4, 8) == FG_ERR_MISALIGNED || ((uintptr_t)ws % 256 == 252),
             "workspace alignment");
    TH_CHECK(fg_context_set_workspace(ctx, NULL, 8) == FG_ERR_NULL_POINTER, "workspace NULL with bytes");
    fg_context_destroy(ctx);
    fg_context_destroy(NULL);

    fg_context_desc d;
    memset(&d, 0, sizeof d);
    d.backend = (fg_backend)5;
    TH_CHECK(fg_context_create(&d, &ctx) == FG_ERR_INVALID_VALUE && strstr(fg_last_error(), "desc.backend=5"),
             "bad backend: %s", fg_last_error());
    d.backend = FG_BACKEND_CPU;
    d.num_threads = -1;
    TH_CHECK(fg_context_create(&d, &ctx) == FG_ERR_INVALID_VALUE && strstr(fg_last_error(), "num_threads"),
             "negative threads");
    d.num_threads = 0;
    TH_CHECK(fg_context_create(&d, NULL) == FG_ERR_NULL_POINTER, "NULL out");
    d.backend = FG_BACKEND_CUDA;
    if (!fg_backend_available(FG_BACKEND_CUDA)) {
        TH_CHECK(fg_context_create(&d, &ctx) == FG_ERR_NO_DEVICE, "CUDA context without a device: %s", fg_last_error());
    } else {
        d.device = 4096;
        TH_CHECK(fg_context_create(&d, &ctx) == FG_ERR_NO_DEVICE && strstr(fg_last_error(), "desc.device=4096"),
                 "CUDA device 4096: %s", fg_last_error());
    }
    TH_CHECK(fg_backend_available(FG_BACKEND_CPU) == 1 && fg_backend_available((fg_backend)9) == 0, "availability");
}

static void plan_arguments(void) {
    fg_context *ctx = th_context(FG_BACKEND_CPU, false);
    fg_plan *plan = (fg_plan *)1;
    TH_CHECK(fg_plan_create(ctx, NULL, &plan) == FG_ERR_NULL_POINTER && plan == NULL, "NULL desc");
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    TH_CHECK(fg_plan_create(ctx, &d, &plan) == FG_ERR_INVALID_VALUE, "op 0");
    d.op = FG_OP_OUTER_FORWARD;
    d.flags = 0x80;
    TH_CHECK(fg_plan_create(ctx, &d, &plan) == FG_ERR_INVALID_VALUE && strstr(fg_last_error(), "flags"), "flags");
    d.flags = FG_PLAN_CONSUME_PRE; /* only linear_act's backward has a pre to consume */
    TH_CHECK(fg_plan_create(ctx, &d, &plan) == FG_ERR_INVALID_VALUE && strstr(fg_last_error(), "flags 0x2"),
             "consume flag on another op");
    TH_CHECK(fg_plan_create(NULL, &d, &plan) == FG_ERR_NULL_POINTER, "NULL ctx");
    size_t bytes;
    fg_plan_info info;
    TH_CHECK(fg_plan_workspace_size(NULL, &bytes) == FG_ERR_NULL_POINTER, "workspace of NULL plan");
    TH_CHECK(fg_plan_info_get(NULL, &info) == FG_ERR_NULL_POINTER, "info of NULL plan");
    TH_CHECK(fg_plan_run(NULL, NULL, NULL, 0) == FG_ERR_NULL_POINTER, "run NULL plan");
    fg_plan_destroy(NULL);
    int64_t n = 3, zs[2] = {3, 3};
    fg_tensor x = fg_tensor_make(NULL, FG_F64, 1, &n), z = fg_tensor_make(NULL, FG_F64, 2, zs);
    d.flags = 0;
    d.operands[0] = x;
    d.operands[1] = x;
    d.operands[2] = z;
    TH_OK(fg_plan_create(ctx, &d, &plan));
    TH_OK(fg_plan_info_get(plan, &info));
    TH_CHECK(info.precision.math == FG_F64 && info.precision.accumulator == FG_F64 && info.arch == 0,
             "f64 plan reports f64 math (%d, %d) and arch 0 (%d)", info.precision.math, info.precision.accumulator,
             info.arch);
    TH_CHECK(fg_plan_run(plan, NULL, NULL, 0) == FG_ERR_NULL_POINTER, "run without operands");
    fg_tensor ops[3] = {x, x, z}; /* data still NULL */
    TH_CHECK(fg_plan_can_implement(plan, ops) == FG_ERR_NULL_POINTER && strstr(fg_last_error(), "x.data"),
             "can_implement NULL data: %s", fg_last_error());
    fg_plan_destroy(plan);
    fg_context_destroy(ctx);
}

int main(void) {
    th_init("test_core");
    version_and_status();
    dtypes();
    contexts();
    plan_arguments();
    return th_finish("test_core");
}

/*
 * context.c — fg_context: which backend ops run on, its stream and library handles
 * (CUDA parts live in src/cuda/context.cu), and the workspace the one-call functions
 * use. The context is the only state the library keeps; there are no globals.
 * A context is used by one thread at a time.
 */
#include "checks.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef FG_HAVE_CUDA
int fg_cuda_device_count(void);
fg_status fg_cuda_context_init(fg_context *ctx, const fg_context_desc *desc);
void fg_cuda_context_destroy(fg_context *ctx);
fg_status fg_cuda_set_stream(fg_context *ctx, void *stream);
fg_status fg_cuda_check(fg_context *ctx);
fg_status fg_cuda_workspace_grow(fg_context *ctx, size_t bytes);
#endif

int fg_backend_available(fg_backend backend) {
    if (backend == FG_BACKEND_CPU) return 1;
#ifdef FG_HAVE_CUDA
    if (backend == FG_BACKEND_CUDA) return fg_cuda_device_count() > 0;
#endif
    return 0;
}

fg_status fg_context_create(const fg_context_desc *desc, fg_context **out) {
    if (!out) return fg_fail(FG_ERR_NULL_POINTER, "context_create: out is NULL");
    *out = NULL;
    fg_context_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.backend != FG_BACKEND_CPU && d.backend != FG_BACKEND_CUDA)
        return fg_fail(FG_ERR_INVALID_VALUE, "context_create: desc.backend=%d is not a backend",
                       (int)d.backend);
    if (d.num_threads < 0 || d.num_threads > FG_MAX_THREADS)
        return fg_fail(FG_ERR_INVALID_VALUE, "context_create: desc.num_threads=%d must be in [0, %d]",
                       d.num_threads, FG_MAX_THREADS);
    if (d.backend == FG_BACKEND_CPU && d.stream)
        return fg_fail(FG_ERR_INVALID_VALUE, "context_create: desc.stream is set but a CPU context has no stream");
    if (d.allow_tf32 != 0 && d.allow_tf32 != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "context_create: desc.allow_tf32=%d must be 0 or 1",
                       d.allow_tf32);
#ifndef FG_HAVE_CUDA
    if (d.backend == FG_BACKEND_CUDA)
        return fg_fail(FG_ERR_NO_DEVICE, "context_create: this build has no CUDA backend");
#endif
    fg_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fg_fail(FG_ERR_OUT_OF_MEMORY, "context_create: out of host memory");
    ctx->backend = d.backend;
    ctx->device = d.device;
    ctx->allow_tf32 = d.allow_tf32;
    ctx->num_threads = d.num_threads;
    ctx->be = &fg_cpu_backend;
#ifdef FG_HAVE_CUDA
    ctx->cuda_present = fg_cuda_device_count() > 0;
    if (d.backend == FG_BACKEND_CUDA) {
        fg_status s = fg_cuda_context_init(ctx, &d);
        if (s != FG_OK) {
            free(ctx);
            return s;
        }
        ctx->be = &fg_cuda_backend;
    }
#endif
    *out = ctx;
    fg_clear_error();
    return FG_OK;
}

void fg_context_destroy(fg_context *ctx) {
    if (!ctx) return;
#ifdef FG_HAVE_CUDA
    if (ctx->backend == FG_BACKEND_CUDA) fg_cuda_context_destroy(ctx);
#endif
    if (ctx->backend == FG_BACKEND_CPU && !ctx->workspace_external) free(ctx->workspace);
    free(ctx);
}

fg_status fg_context_set_stream(fg_context *ctx, void *stream) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "context_set_stream: ctx is NULL");
#ifdef FG_HAVE_CUDA
    if (ctx->backend == FG_BACKEND_CUDA) return fg_cuda_set_stream(ctx, stream);
#endif
    if (stream)
        return fg_fail(FG_ERR_INVALID_VALUE, "context_set_stream: a CPU context has no stream");
    fg_clear_error();
    return FG_OK;
}

void fg_record_reset(fg_context *ctx) {
    ctx->launched[0] = 0;
    ctx->launched_len = ctx->launched_last = 0;
}

void fg_record_kernel(fg_context *ctx, const char *name) {
    const int cap = (int)sizeof ctx->launched;
    if (ctx->launched_len > 0 && strcmp(ctx->launched + ctx->launched_last, name) == 0) return;
    const int sep = ctx->launched_len > 0 ? 3 : 0, n = (int)strlen(name);
    if (ctx->launched_len + sep + n + 1 > cap) return; /* full: the record keeps its first names */
    if (sep) memcpy(ctx->launched + ctx->launched_len, " ; ", 3);
    ctx->launched_last = ctx->launched_len + sep;
    memcpy(ctx->launched + ctx->launched_last, name, (size_t)n + 1);
    ctx->launched_len = ctx->launched_last + n;
}

const char *fg_context_last_kernels(const fg_context *ctx) { return ctx ? ctx->launched : ""; }

fg_status fg_flag_error(const unsigned long long flag[2]) {
    const unsigned long long index = ~flag[1];
    if (flag[0] == FG_FLAG_BAD_TARGET)
        return fg_fail(FG_ERR_DEVICE_VALUE,
                       "context_check: linear_logp: target of row %llu is outside [0, V) and not "
                       "ignore_index (that row is NaN)", index);
    if (flag[0] == FG_FLAG_BAD_START)
        return fg_fail(FG_ERR_DEVICE_VALUE,
                       "context_check: series_windows: starts[%llu] is outside [0, T - W] (that window is NaN)", index);
    if (flag[0] == FG_FLAG_BAD_LENGTH)
        return fg_fail(FG_ERR_DEVICE_VALUE,
                       "context_check: attention: lengths[%llu] is outside [0, L] (that sequence's outputs are NaN)",
                       index);
    return fg_fail(FG_ERR_DEVICE_VALUE, "context_check: a kernel found bad value code %llu, first at index %llu",
                   flag[0], index);
}

void fg_host_flag_raise(fg_context *ctx, unsigned long long code, int64_t index) {
    /* the first code wins; the smallest index is kept (stored inverted, as on the device) */
    if (ctx->host_flag[0] == 0) ctx->host_flag[0] = code;
    unsigned long long inv = ~(unsigned long long)index;
    if (inv > ctx->host_flag[1]) ctx->host_flag[1] = inv;
}

fg_status fg_context_check(fg_context *ctx) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "context_check: ctx is NULL");
#ifdef FG_HAVE_CUDA
    if (ctx->backend == FG_BACKEND_CUDA) return fg_cuda_check(ctx);
#endif
    if (ctx->host_flag[0] != 0) {
        unsigned long long flag[2] = {ctx->host_flag[0], ctx->host_flag[1]};
        ctx->host_flag[0] = ctx->host_flag[1] = 0;
        return fg_flag_error(flag);
    }
    fg_clear_error();
    return FG_OK;
}

fg_status fg_context_set_workspace(fg_context *ctx, void *ptr, size_t bytes) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "context_set_workspace: ctx is NULL");
    if (!ptr && bytes)
        return fg_fail(FG_ERR_NULL_POINTER, "context_set_workspace: ptr is NULL but bytes=%zu", bytes);
    if (ptr && (uintptr_t)ptr % 256 != 0)
        return fg_fail(FG_ERR_MISALIGNED, "context_set_workspace: ptr=%p is not 256-byte aligned", ptr);
    if (ptr) {
        fg_tensor t;
        memset(&t, 0, sizeof t);
        t.data = ptr;
        t.dtype = FG_F32;
        t.rank = 1;
        t.shape[0] = 1;
        FG_TRY(fg_check_data(ctx, "context_set_workspace", "ptr", &t));
    }
    if (!ctx->workspace_external) {
#ifdef FG_HAVE_CUDA
        if (ctx->backend == FG_BACKEND_CUDA) FG_TRY(fg_cuda_workspace_grow(ctx, 0));
#endif
        if (ctx->backend == FG_BACKEND_CPU) free(ctx->workspace);
    }
    ctx->workspace = ptr;
    ctx->workspace_bytes = ptr ? bytes : 0;
    ctx->workspace_external = ptr != NULL;
    fg_clear_error();
    return FG_OK;
}

fg_status fg_context_workspace_size(const fg_context *ctx, size_t *bytes) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "context_workspace_size: ctx is NULL");
    if (!bytes) return fg_fail(FG_ERR_NULL_POINTER, "context_workspace_size: bytes is NULL");
    *bytes = ctx->workspace_bytes;
    fg_clear_error();
    return FG_OK;
}

fg_status fg_context_workspace(fg_context *ctx, size_t bytes, void **ptr) {
    if (bytes <= ctx->workspace_bytes) {
        *ptr = ctx->workspace;
        return FG_OK;
    }
    if (ctx->workspace_external)
        return fg_fail(FG_ERR_WORKSPACE, "the context's workspace holds %zu bytes, %zu needed",
                       ctx->workspace_bytes, bytes);
#ifdef FG_HAVE_CUDA
    if (ctx->backend == FG_BACKEND_CUDA) {
        FG_TRY(fg_cuda_workspace_grow(ctx, bytes));
        *ptr = ctx->workspace;
        return FG_OK;
    }
#endif
    /* 256-byte aligned, as a caller's workspace must be: kernels' 64-byte vectors in it do not
       straddle cache lines */
    const size_t rounded = bytes > SIZE_MAX - 255 ? 0 : (bytes + 255) / 256 * 256;
    void *p = rounded ? aligned_alloc(256, rounded) : NULL;
    if (!p) return fg_fail(FG_ERR_OUT_OF_MEMORY, "could not grow the workspace to %zu bytes", bytes);
    free(ctx->workspace);
    ctx->workspace = p;
    ctx->workspace_bytes = bytes;
    *ptr = p;
    return FG_OK;
}

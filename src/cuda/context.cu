/*
 * context.cu — the CUDA half of fg_context: device selection, the caller's stream,
 * the cuBLASLt handle, the device-side error flag that kernels set when they meet a
 * bad value, pointer checks (is this memory on the context's device?), and the
 * stream-ordered growth of the context's own workspace.
 */
#include "cuda_internal.h"

#include <cuda.h> /* the driver's pointer-attribute types (its entry point comes through the runtime) */
#include <stdlib.h>
#include <string.h>

fg_status fg_cuda_fail(cudaError_t err, const char *what) {
    cudaGetLastError(); /* clear a non-sticky error */
    return fg_fail(FG_ERR_BACKEND, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

extern "C" int fg_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" fg_status fg_cuda_context_init(fg_context *ctx, const fg_context_desc *desc) {
    int n = fg_cuda_device_count();
    if (n == 0) return fg_fail(FG_ERR_NO_DEVICE, "context_create: no CUDA device is visible");
    if (desc->device < 0 || desc->device >= n)
        return fg_fail(FG_ERR_NO_DEVICE, "context_create: desc.device=%d but %d CUDA device(s) are visible",
                       desc->device, n);
    fg_device_guard guard(desc->device);
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, desc->device);
    if (e != cudaSuccess) return fg_cuda_fail(e, "context_create: cudaGetDeviceProperties");
    struct fg_cuda_state *st = (struct fg_cuda_state *)calloc(1, sizeof *st);
    if (!st) return fg_fail(FG_ERR_OUT_OF_MEMORY, "context_create: out of host memory");
    st->stream = (cudaStream_t)desc->stream;
    if (cublasLtCreate(&st->lt) != CUBLAS_STATUS_SUCCESS) {
        free(st);
        return fg_fail(FG_ERR_BACKEND, "context_create: cublasLtCreate failed");
    }
    e = cudaMalloc((void **)&st->flag, 2 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMemsetAsync(st->flag, 0, 2 * sizeof(unsigned long long), st->stream);
    if (e != cudaSuccess) {
        cublasLtDestroy(st->lt);
        if (st->flag) cudaFree(st->flag);
        free(st);
        return fg_cuda_fail(e, "context_create: allocating the error flag");
    }
    ctx->arch = prop.major * 10 + prop.minor;
    ctx->sm_count = prop.multiProcessorCount;
    ctx->cuda = st;
    return FG_OK;
}

extern "C" void fg_cuda_context_destroy(fg_context *ctx) {
    struct fg_cuda_state *st = ctx->cuda;
    if (!st) return;
    fg_device_guard guard(ctx->device);
    if (ctx->workspace && !ctx->workspace_external) cudaFreeAsync(ctx->workspace, st->stream);
    cudaStreamSynchronize(st->stream);
    cudaFree(st->flag);
    for (int i = 0; i < FG_LT_CACHE; i++) fg_lt_entry_clear(&st->cache[i]);
    cublasLtDestroy(st->lt);
    cudaGetLastError();
    free(st);
    ctx->cuda = NULL;
}

extern "C" fg_status fg_cuda_set_stream(fg_context *ctx, void *stream) {
    fg_device_guard guard(ctx->device);
    cudaStream_t old = ctx->cuda->stream, s = (cudaStream_t)stream;
    if (old == s) return FG_OK;
    /* The own workspace and the flag were last used on the old stream: order the new
       stream after it, without blocking the host. A stream being captured into a CUDA graph
       cannot wait on work outside the capture (cudaErrorStreamCaptureIsolation); there the
       replays' order against the old stream is the caller's, as for every captured launch
       (torch.cuda.graph synchronizes the device before it begins a capture). */
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (s && cudaStreamIsCapturing(s, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusActive) {
        ctx->cuda->stream = s;
        return FG_OK;
    }
    cudaGetLastError(); /* (a failed query: the ordering below reports what it finds) */
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, old);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, ev, 0);
    cudaEventDestroy(ev);
    if (e != cudaSuccess) return fg_cuda_fail(e, "context_set_stream");
    ctx->cuda->stream = s;
    return FG_OK;
}

extern "C" fg_status fg_cuda_check(fg_context *ctx) {
    fg_device_guard guard(ctx->device);
    unsigned long long flag[2] = {0, 0};
    cudaError_t e = cudaMemcpyAsync(flag, ctx->cuda->flag, sizeof flag, cudaMemcpyDeviceToHost,
                                    ctx->cuda->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->cuda->stream);
    if (e != cudaSuccess) return fg_cuda_fail(e, "context_check");
    if (flag[0] != 0) {
        e = cudaMemsetAsync(ctx->cuda->flag, 0, sizeof flag, ctx->cuda->stream);
        if (e != cudaSuccess) return fg_cuda_fail(e, "context_check: clearing the flag");
        return fg_flag_error(flag);
    }
    fg_clear_error();
    return FG_OK;
}

extern "C" fg_status fg_cuda_workspace_grow(fg_context *ctx, size_t bytes) {
    fg_device_guard guard(ctx->device);
    cudaStream_t s = ctx->cuda->stream;
    if (ctx->workspace) {
        cudaError_t e = cudaFreeAsync(ctx->workspace, s);
        ctx->workspace = NULL;
        ctx->workspace_bytes = 0;
        if (e != cudaSuccess) return fg_cuda_fail(e, "workspace: cudaFreeAsync");
    }
    if (bytes == 0) return FG_OK;
    bytes = (bytes + (1u << 20) - 1) & ~(size_t)((1u << 20) - 1); /* whole MiB: fewer regrowths */
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, bytes, s);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fg_fail(FG_ERR_OUT_OF_MEMORY, "could not grow the device workspace to %zu bytes (%s)", bytes,
                       cudaGetErrorString(e));
    }
    ctx->workspace = p;
    ctx->workspace_bytes = bytes;
    return FG_OK;
}

/* cuPointerGetAttributes, found through the runtime (the library does not link libcuda): one
   driver query gives a pointer's memory type, device and whole allocation, so a batch of checks
   (fg_check_data_seen) asks once an allocation instead of once a tensor. NULL when absent. */
typedef CUresult (*ptr_attrs_fn)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);

static ptr_attrs_fn driver_ptr_attrs() {
    static const ptr_attrs_fn fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            f = nullptr;
        }
        return (ptr_attrs_fn)f;
    }();
    return fn;
}

extern "C" bool fg_cuda_device_range(const fg_context *ctx, const void *ptr, uintptr_t *lo, uintptr_t *hi) {
    const ptr_attrs_fn fn = driver_ptr_attrs();
    if (!fn || ctx->backend != FG_BACKEND_CUDA) return false;
    CUpointer_attribute at[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned int type = 0;
    int ordinal = -1;
    CUdeviceptr start = 0;
    size_t size = 0;
    void *data[4] = {&type, &ordinal, &start, &size};
    if (fn(4, at, data, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS) return false;
    const uintptr_t p = (uintptr_t)ptr, a = (uintptr_t)start;
    if (type != CU_MEMORYTYPE_DEVICE || ordinal != ctx->device || size == 0 || p < a || p - a >= size) return false;
    *lo = a, *hi = a + size;
    return true;
}

extern "C" fg_status fg_cuda_check_pointer(const fg_context *ctx, const char *op, const char *what,
                                           const void *ptr) {
    if (ctx->backend == FG_BACKEND_CPU && !ctx->cuda_present) return FG_OK;
    cudaPointerAttributes attr;
    cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();
        attr.type = cudaMemoryTypeUnregistered;
    }
    if (ctx->backend == FG_BACKEND_CPU) {
        if (attr.type == cudaMemoryTypeDevice)
            return fg_fail(FG_ERR_WRONG_DEVICE, "%s: %s.data is CUDA device memory but the context is the CPU",
                           op, what);
        return FG_OK;
    }
    if (attr.type == cudaMemoryTypeUnregistered)
        return fg_fail(FG_ERR_WRONG_DEVICE, "%s: %s.data is host memory but the context is CUDA device %d", op,
                       what, ctx->device);
    if (attr.type == cudaMemoryTypeDevice && attr.device != ctx->device)
        return fg_fail(FG_ERR_WRONG_DEVICE, "%s: %s.data is on CUDA device %d but the context is on device %d",
                       op, what, attr.device, ctx->device);
    return FG_OK;
}

/*
 * device.c — the program's memory on the backend it runs on (device.h). CUDA calls are
 * compiled in when the build has the CUDA backend (FGT_HAVE_CUDA); they use the legacy
 * default stream, which the context's ops also run on, so a copy after an op sees its
 * result and an op after a copy sees its data.
 */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FGT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int device_open(device *dv, fg_backend backend, int threads, char *err, size_t errlen) {
    memset(dv, 0, sizeof *dv);
    dv->backend = backend;
    if (!fg_backend_available(backend)) {
        snprintf(err, errlen, "--device %s: %s", backend == FG_BACKEND_CUDA ? "cuda" : "cpu",
                 backend == FG_BACKEND_CUDA ? "no CUDA device, or this build has no CUDA backend"
                                            : "the CPU backend is not available");
        return -1;
    }
#ifndef FGT_HAVE_CUDA
    if (backend == FG_BACKEND_CUDA) {
        snprintf(err, errlen, "--device cuda: fastgrad-train was built without CUDA");
        return -1;
    }
#endif
    fg_context_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.backend = backend;
    desc.num_threads = threads;
    fg_status s = fg_context_create(&desc, &dv->ctx);
    if (s != FG_OK) {
        snprintf(err, errlen, "cannot create the %s context: %s: %s", backend == FG_BACKEND_CUDA ? "cuda" : "cpu",
                 fg_status_string(s), fg_last_error());
        return -1;
    }
    return 0;
}

void device_close(device *dv) {
    if (dv->ctx) fg_context_destroy(dv->ctx);
    dv->ctx = NULL;
}

void *device_alloc(const device *dv, size_t bytes) {
    if (bytes == 0) bytes = 16;
#ifdef FGT_HAVE_CUDA
    if (dv->backend == FG_BACKEND_CUDA) {
        void *p = NULL;
        if (cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
        if (cudaMemset(p, 0, bytes) != cudaSuccess) {
            cudaFree(p);
            return NULL;
        }
        return p;
    }
#endif
    (void)dv;
    /* 64-byte aligned, zeroed: the library's vector paths like aligned data */
    void *p = NULL;
    bytes = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

void device_free(const device *dv, void *p) {
    if (!p) return;
#ifdef FGT_HAVE_CUDA
    if (dv->backend == FG_BACKEND_CUDA) {
        cudaFree(p);
        return;
    }
#endif
    (void)dv;
    free(p);
}

int device_upload(const device *dv, void *dst, const void *src, size_t bytes) {
#ifdef FGT_HAVE_CUDA
    if (dv->backend == FG_BACKEND_CUDA) return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#endif
    (void)dv;
    memcpy(dst, src, bytes);
    return 0;
}

int device_download(const device *dv, void *dst, const void *src, size_t bytes) {
#ifdef FGT_HAVE_CUDA
    if (dv->backend == FG_BACKEND_CUDA) return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#endif
    (void)dv;
    memcpy(dst, src, bytes);
    return 0;
}

int device_copy(const device *dv, void *dst, const void *src, size_t bytes) {
#ifdef FGT_HAVE_CUDA
    if (dv->backend == FG_BACKEND_CUDA)
        return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess ? 0 : -1;
#endif
    (void)dv;
    memmove(dst, src, bytes);
    return 0;
}

int device_zero(const device *dv, void *p, size_t bytes) {
#ifdef FGT_HAVE_CUDA
    if (dv->backend == FG_BACKEND_CUDA) return cudaMemset(p, 0, bytes) == cudaSuccess ? 0 : -1;
#endif
    (void)dv;
    memset(p, 0, bytes);
    return 0;
}

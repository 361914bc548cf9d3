/*
 * device.h — where fastgrad-train's tensors live: the fastgrad context of the chosen backend
 * and the memory the program owns on it (the library never allocates for its caller). On
 * the CPU that is host memory; on CUDA, device memory through the CUDA runtime, with copies
 * to and from the host for batches in and losses, weights and forecasts out.
 */
#ifndef FGT_DEVICE_H
#define FGT_DEVICE_H

#include "fastgrad.h"

#include <stddef.h>

typedef struct device {
    fg_backend backend;
    fg_context *ctx;
} device;

/* Creates the context; -1 with a message when the backend is not usable here. */
int device_open(device *dv, fg_backend backend, int threads, char *err, size_t errlen);
void device_close(device *dv);

/* Zeroed memory on the device (NULL on failure); free; copies; zero-fill. */
void *device_alloc(const device *dv, size_t bytes);
void device_free(const device *dv, void *p);
int device_upload(const device *dv, void *dst, const void *src, size_t bytes);
int device_download(const device *dv, void *dst, const void *src, size_t bytes);
int device_zero(const device *dv, void *p, size_t bytes);
int device_copy(const device *dv, void *dst, const void *src, size_t bytes);

#endif

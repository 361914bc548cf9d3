/*
 * model.h — the forecaster fastgrad-train trains, assembled from fastgrad's public ops only:
 * its parameters (one flat f32 arena, so one fused AdamW call updates them all and a
 * checkpoint stores them as one tensor), its buffers (BatchNorm's running statistics), the
 * activations a training step keeps for its backward, and the step itself.
 *
 * Batches are in the data's own layout: x [B, look-back, C] in, y [B, horizon, C] out, in the
 * model's dtype, on its device.
 */
#ifndef FGT_MODEL_H
#define FGT_MODEL_H

#include "config.h"
#include "device.h"

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

typedef struct model model;

/* Builds the model for C series on dv (activations for batches of up to cfg->batch windows),
 * its parameters drawn from `seed`. -1 with a message (out of memory, a configuration the ops
 * refuse). */
int model_create(model **out, const config *cfg, int C, device *dv, uint64_t seed, char *err, size_t errlen);
void model_destroy(model *m);

/* The parameter count (the arena, 16-float aligned slices) and the buffers' (BatchNorm's running
 * statistics); the compute dtype (f32, bf16; f64 for --gradcheck). */
int64_t model_n_params(const model *m);
int64_t model_n_buffers(const model *m);
fg_dtype model_dtype(const model *m);
/* The weights (the f32 master copy when computing in bf16) and the buffers as f32 host arrays,
 * and back (the bf16 working copy rounded from them). 0, or -1 when a device copy failed. */
int model_get_state(const model *m, float *params, float *buffers);
int model_set_state(model *m, const float *params, const float *buffers);
/* Adam's moments on the device: f32 [n_params] each. */
void *model_adam_m(model *m);
void *model_adam_v(model *m);

/* One training step on a batch of B windows: forward in training mode (dropout from
 * (seed, step)), the MSE loss, the backward, then Adam at lr with step `step` (1 on the first).
 * The batch's MSE goes to *loss in device memory (f32; not waited for: read it when needed).
 * -1 with a message on a library error. */
int model_train_step(model *m, const void *x, const void *y, int64_t B, double lr, int64_t step, float *loss,
                     char *err, size_t errlen);

/* --gradcheck: the backward's gradient of the batch loss against central differences of the
 * forward (training mode, the same dropout masks) at `probes` entries of every parameter
 * tensor; prints one line per tensor; *worst: the largest error relative to each tensor's
 * largest gradient. x, y: a batch in the model's dtype (f64 runs on the CPU, f32 anywhere). The
 * weights and running statistics are left as they were. */
int model_gradcheck(model *m, const void *x, const void *y, int64_t B, int probes, FILE *report, double *worst,
                    char *err, size_t errlen);

/* Evaluation: the forecast of B windows (dropout off, running statistics) into pred [B, H, C]
 * on the device, and the sums of squared and absolute errors against y over the batch. */
int model_eval(model *m, const void *x, const void *y, int64_t B, double *sse, double *sae, char *err,
               size_t errlen);
/* The forecast of the last model_eval, n = B·H·C values, as f32 on the host. */
int model_get_prediction(const model *m, float *out, int64_t n);

/* --profile: time every op call site (synchronizing the device after each), and print the
 * table, slowest first. */
void model_profile(int on);
void model_profile_print(FILE *f);

/* What the model runs, for the run's header line ("PatchTST 3 layers d_model 16 ...: 12345 params"). */
void model_describe(const model *m, char *buf, size_t len);

#endif

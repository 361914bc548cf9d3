/*
 * config.h — fastgrad-train's configuration: every flag that shapes the model or the run,
 * with the reference PatchTST/42 configuration for ETTh1 (the data README's) as the defaults.
 */
#ifndef FGT_CONFIG_H
#define FGT_CONFIG_H

#include "fastgrad.h"

#include <stdint.h>

typedef enum model_kind {
    MODEL_PATCHTST = 0, /* RevIN, patches, a PatchTST encoder, the flatten head */
    MODEL_LINEAR = 1    /* RevIN and one Linear look-back → horizon shared by the series */
} model_kind;

typedef struct config {
    model_kind model;
    int lookback, horizon;
    int d_model, heads, layers, d_ff;
    int patch_len, stride;
    double dropout;        /* the encoder's dropouts (embedding, attention output, FFN) */
    int revin;             /* 1: RevIN with a learnable affine */
    int batch;
    double lr;
    int epochs, patience;
    uint64_t seed;
    fg_dtype dtype;
} config;

static inline void config_defaults(config *c) {
    c->model = MODEL_PATCHTST;
    c->lookback = 336;
    c->horizon = 96;
    c->d_model = 16;
    c->heads = 4;
    c->layers = 3;
    c->d_ff = 128;
    c->patch_len = 16;
    c->stride = 8;
    c->dropout = 0.3;
    c->revin = 1;
    c->batch = 128;
    c->lr = 1e-4;
    c->epochs = 100;
    c->patience = 100;
    c->seed = 2021;
    c->dtype = FG_F32;
}

/* The number of patches: the look-back padded by `stride` copies of its last step. */
static inline int config_patches(const config *c) { return (c->lookback + c->stride - c->patch_len) / c->stride + 1; }

#endif

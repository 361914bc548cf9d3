/*
 * data.h — the series as the model sees them: the standard train / validation / test split,
 * standardization with the train rows' statistics, the windows (look-back rows in, horizon
 * rows out) of each split, the program's own seeded generator (the data order, the
 * initial weights). Window w of split s starts at row border[s][0] + w: its look-back rows, then its
 * horizon rows (the model gathers them on the device with fg_series_windows).
 */
#ifndef FGT_DATA_H
#define FGT_DATA_H

#include "csv.h"

#include <stdint.h>

/* xoshiro256** seeded through splitmix64: the program's generator, whose whole state goes
 * into a checkpoint. */
typedef struct rng {
    uint64_t s[4];
} rng;

void rng_seed(rng *r, uint64_t seed);
uint64_t rng_next(rng *r);
double rng_uniform(rng *r);                     /* [0, 1) */
uint64_t rng_below(rng *r, uint64_t n);         /* [0, n), unbiased */
void rng_shuffle(rng *r, int64_t *v, int64_t n); /* Fisher–Yates */
/* splitmix64 of x: a well-mixed 64-bit value (seeds of independent streams). */
uint64_t mix64(uint64_t x);

enum { SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST };

/* How the rows are split: the ETT benchmark's fixed month counts, or fractions. */
typedef struct split_spec {
    int ett;            /* 1: 12 / 4 / 4 months of `rows_per_day` rows */
    int rows_per_day;   /* 24 for hourly data */
    double frac[3];     /* otherwise: train, validation, test fractions (Informer's custom split) */
} split_spec;

typedef struct dataset {
    int64_t rows;       /* rows of the file */
    int C;              /* series */
    int L, H;           /* look-back, horizon */
    float *z;           /* [rows, C] standardized values */
    double *mean, *std; /* [C] of the train rows */
    int64_t border[3][2]; /* each split's rows [lo, hi): windows start in [lo, hi − L − H] */
    int64_t windows[3];
    uint64_t fingerprint; /* FNV-1a of the values, dims, split and standardization */
} dataset;

/* Splits and standardizes; -1 with a message when a split holds no window (the file has too
 * few rows for look-back + horizon). */
int dataset_make(const csv_table *t, const char *path, const split_spec *sp, int L, int H, dataset *d, char *err,
                 size_t errlen);
void dataset_free(dataset *d);

/* The row of the file where window w of split s's first target lies. */
int64_t dataset_target_row(const dataset *d, int split, int64_t w);

#endif

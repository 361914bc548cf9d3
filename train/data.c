/*
 * data.c — split, standardization and windows (data.h). The ETT split is the one every
 * paper uses (Informer's Dataset_ETT_hour): train = the first 12 months, validation = the
 * next 4, test = the next 4, a validation / test window starting up to `look-back` rows
 * before its split so that its first target lies inside it. Fractions follow Informer's
 * Dataset_Custom (train = ⌊0.7·n⌋, test = ⌊0.2·n⌋, validation the rest). Each column is
 * standardized with the mean and the population standard deviation of the train rows
 * (scikit-learn's StandardScaler, which the reference uses), in double, then stored as f32.
 */
#include "data.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void rng_seed(rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        x += 0x9E3779B97F4A7C15ull;
        r->s[i] = mix64(x);
    }
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t rng_below(rng *r, uint64_t n) {
    if (n <= 1) return 0;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* reject the uneven tail */
    uint64_t v;
    do v = rng_next(r);
    while (v >= limit);
    return v % n;
}

void rng_shuffle(rng *r, int64_t *v, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)rng_below(r, (uint64_t)i + 1);
        const int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static int fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

int dataset_make(const csv_table *t, const char *path, const split_spec *sp, int L, int H, dataset *d, char *err,
                 size_t errlen) {
    memset(d, 0, sizeof *d);
    const int64_t n = t->rows;
    int64_t b1[3], b2[3];
    if (sp->ett) {
        const int64_t month = 30 * (int64_t)sp->rows_per_day;
        const int64_t tr = 12 * month, va = 4 * month, te = 4 * month;
        if (n < tr + va + te)
            return fail(err, errlen,
                        "%s: %lld rows, but the ETT split needs %lld (12 + 4 + 4 months of %d rows a day); "
                        "use --split TRAIN,VAL,TEST fractions for other data",
                        path, (long long)n, (long long)(tr + va + te), sp->rows_per_day);
        b1[0] = 0, b2[0] = tr;
        b1[1] = tr - L, b2[1] = tr + va;
        b1[2] = tr + va - L, b2[2] = tr + va + te;
    } else {
        const int64_t tr = (int64_t)(n * sp->frac[0]), te = (int64_t)(n * sp->frac[2]), va = n - tr - te;
        (void)va;
        b1[0] = 0, b2[0] = tr;
        b1[1] = tr - L, b2[1] = n - te;
        b1[2] = n - te - L, b2[2] = n;
    }
    static const char *const names[3] = {"train", "validation", "test"};
    for (int s = 0; s < 3; s++) {
        const int64_t first_target = s == 0 ? L : b1[s] + L;
        if (b1[s] < 0 || b2[s] - b1[s] < (int64_t)L + H)
            return fail(err, errlen,
                        "%s: too few rows: the %s split has %lld rows with targets (rows %lld..%lld of %lld), "
                        "but look-back %d + horizon %d needs at least %d rows before and %d in it",
                        path, names[s], (long long)(b2[s] - first_target), (long long)(first_target + 2),
                        (long long)(b2[s] + 1), (long long)n, L, H, L, H);
        d->border[s][0] = b1[s];
        d->border[s][1] = b2[s];
        d->windows[s] = b2[s] - b1[s] - L - H + 1;
    }
    d->rows = n;
    d->C = t->cols;
    d->L = L;
    d->H = H;
    const int C = d->C;
    d->z = malloc(sizeof(float) * (size_t)(n * C));
    d->mean = calloc((size_t)C, sizeof(double));
    d->std = calloc((size_t)C, sizeof(double));
    if (!d->z || !d->mean || !d->std) {
        dataset_free(d);
        return fail(err, errlen, "%s: out of memory", path);
    }
    const int64_t ntr = b2[0];
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int64_t r = 0; r < ntr; r++) s += t->values[r * C + c];
        const double m = s / (double)ntr;
        double q = 0;
        for (int64_t r = 0; r < ntr; r++) {
            const double e = t->values[r * C + c] - m;
            q += e * e;
        }
        double sd = sqrt(q / (double)ntr);
        if (!(sd > 0)) sd = 1.0; /* a constant column: StandardScaler leaves it centred */
        d->mean[c] = m;
        d->std[c] = sd;
    }
    for (int64_t r = 0; r < n; r++)
        for (int c = 0; c < C; c++) d->z[r * C + c] = (float)((t->values[r * C + c] - d->mean[c]) / d->std[c]);
    uint64_t h = 0xCBF29CE484222325ull;
    h = fnv(h, &n, sizeof n);
    h = fnv(h, &d->C, sizeof d->C);
    h = fnv(h, t->values, sizeof(double) * (size_t)(n * C));
    h = fnv(h, d->border, sizeof d->border);
    d->fingerprint = h;
    return 0;
}

void dataset_free(dataset *d) {
    free(d->z);
    free(d->mean);
    free(d->std);
    memset(d, 0, sizeof *d);
}

int64_t dataset_target_row(const dataset *d, int split, int64_t w) { return d->border[split][0] + w + d->L; }

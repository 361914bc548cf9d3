/*
 * main.c — fastgrad-train: trains a PatchTST forecaster (or the linear baseline) on a CSV of
 * series such as ETTh1, with fastgrad's ops on the CPU (the default) or CUDA, and reports the
 * test MSE / MAE beside the published figures. llm.c's train_gpt2, for time-series transformers.
 *
 *   fastgrad-train --data data/ETTh1.csv --horizon 96          (the reference configuration)
 *
 * The run: load and standardize the data (the standard split), build the model, then per
 * epoch shuffle the train windows with the program's own seeded generator, take Adam steps
 * on batches (the last incomplete batch dropped, as the reference's loader does), evaluate
 * the validation MSE, keep the best weights, stop early after `patience` epochs without
 * improvement; at the end test the best weights on every test window (and on the windows of
 * complete batches, which the published figures use).
 *
 * Checkpoints (train/checkpoint.h) hold the configuration, the weights, Adam's moments, the
 * running statistics, the best weights, the step, the epoch and the position in its data order,
 * and the generator's state at the epoch's start: --resume continues exactly where the run
 * stopped, and on the CPU gives the same bits as a run that never stopped. SIGINT finishes the
 * step, saves and exits with 130. Bad input — a flag, the data, a checkpoint of another
 * configuration or a corrupted one — is one line on stderr and exit status 2, before anything
 * is written.
 */
#include "checkpoint.h"
#include "config.h"
#include "csv.h"
#include "data.h"
#include "device.h"
#include "model.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define EXIT_BAD_INPUT 2
#define EXIT_INTERRUPTED 130

/* ------------------------------------------------------------------ messages */

static void die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fastgrad-train: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(code);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile sig_atomic_t interrupted = 0;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* ------------------------------------------------------------------ flags */

typedef struct options {
    config cfg;
    const char *data, *log, *predict, *checkpoint;
    char checkpoint_default[512];
    int threads, quiet, resume, save_every, profile, gradcheck;
    fg_backend backend;
    int device_auto;
    split_spec split;
    char split_text[64];
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: fastgrad-train [--data FILE] [options]\n"
            "Trains PatchTST (Nie et al., ICLR 2023) on a CSV of series (a date column, then numeric\n"
            "columns) and reports the test MSE / MAE. The defaults are the reference PatchTST/42\n"
            "configuration for ETTh1 (data/README.md).\n\n"
            "data and split\n"
            "  --data FILE          the CSV (default data/ETTh1.csv)\n"
            "  --split ett|A,B,C    ett: 12 / 4 / 4 months of hourly rows (default); or train,\n"
            "                       validation, test fractions (Informer's custom split)\n"
            "  --lookback N         input window (336)        --horizon N   forecast length (96)\n"
            "model\n"
            "  --model patchtst|linear   (patchtst)           --d-model N (16)   --heads N (4)\n"
            "  --layers N (3)       --d-ff N (128)            --patch-len N (16) --stride N (8)\n"
            "  --dropout P (0.3)\n"
            "training\n"
            "  --epochs N (100)     --batch N (128)           --lr X (1e-4 for epochs 1-4, then x0.9 each)\n"
            "  --patience N (100)   --seed N (2021)\n"
            "  --device cpu|cuda|auto (auto: cuda when present)   --threads N (CPU)\n"
            "  --dtype f32|bf16     bf16: bf16 weights and activations, f32 master weights, statistics\n"
            "                       and sums (f32)\n"
            "output\n"
            "  --checkpoint FILE    (default <data>_<model>_h<horizon>.ckpt) written after every epoch\n"
            "  --save-every N       also every N steps        --resume   continue the checkpoint\n"
            "  --log FILE           one JSON object per epoch --predict FILE  test forecasts as CSV\n"
            "  --quiet              only the results\n"
            "  --profile            time every op (synchronized) and print the table at the end\n"
            "  --gradcheck          check the backward against central differences on one batch, then exit\n");
}

static int parse_int(const char *flag, const char *v, long lo, long hi) {
    char *end = NULL;
    errno = 0;
    const long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno) die(EXIT_BAD_INPUT, "%s: '%s' is not an integer", flag, v ? v : "");
    if (x < lo || x > hi) die(EXIT_BAD_INPUT, "%s: %ld is out of range [%ld, %ld]", flag, x, lo, hi);
    return (int)x;
}

static double parse_real(const char *flag, const char *v, double lo, double hi, int hi_open) {
    char *end = NULL;
    errno = 0;
    const double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !isfinite(x)) die(EXIT_BAD_INPUT, "%s: '%s' is not a finite number", flag, v ? v : "");
    if (x < lo || (hi_open ? x >= hi : x > hi))
        die(EXIT_BAD_INPUT, "%s: %g is out of range [%g, %g%s", flag, x, lo, hi, hi_open ? ")" : "]");
    return x;
}

static void parse_split(options *o, const char *v) {
    snprintf(o->split_text, sizeof o->split_text, "%s", v);
    memset(&o->split, 0, sizeof o->split);
    if (strcasecmp(v, "ett") == 0) {
        o->split.ett = 1;
        o->split.rows_per_day = 24;
        return;
    }
    double f[3];
    char tail;
    if (sscanf(v, "%lf,%lf,%lf%c", &f[0], &f[1], &f[2], &tail) != 3)
        die(EXIT_BAD_INPUT, "--split: '%s' is neither 'ett' nor three fractions TRAIN,VAL,TEST", v);
    for (int i = 0; i < 3; i++)
        if (!(f[i] > 0 && f[i] < 1)) die(EXIT_BAD_INPUT, "--split: fraction %g is not in (0, 1)", f[i]);
    if (fabs(f[0] + f[1] + f[2] - 1.0) > 1e-9) die(EXIT_BAD_INPUT, "--split: %s does not add up to 1", v);
    for (int i = 0; i < 3; i++) o->split.frac[i] = f[i];
}

static void parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    config_defaults(&o->cfg);
    o->data = "data/ETTh1.csv";
    o->device_auto = 1;
    parse_split(o, "ett");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (!strcmp(a, "--resume")) {
            o->resume = 1;
            continue;
        }
        if (!strcmp(a, "--gradcheck")) {
            o->gradcheck = 1;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            o->profile = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) die(EXIT_BAD_INPUT, "'%s': not a flag (see --help)", a);
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die(EXIT_BAD_INPUT, "%s needs a value (see --help)", a);
        i++;
        config *c = &o->cfg;
        if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--split")) parse_split(o, v);
        else if (!strcmp(a, "--lookback")) c->lookback = parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--horizon")) c->horizon = parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--model")) {
            if (!strcasecmp(v, "patchtst")) c->model = MODEL_PATCHTST;
            else if (!strcasecmp(v, "linear")) c->model = MODEL_LINEAR;
            else die(EXIT_BAD_INPUT, "--model: '%s' is not patchtst or linear", v);
        } else if (!strcmp(a, "--d-model")) c->d_model = parse_int(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--heads")) c->heads = parse_int(a, v, 1, 1 << 10);
        else if (!strcmp(a, "--layers")) c->layers = parse_int(a, v, 1, 64);
        else if (!strcmp(a, "--d-ff")) c->d_ff = parse_int(a, v, 1, 1 << 18);
        else if (!strcmp(a, "--patch-len")) c->patch_len = parse_int(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--stride")) c->stride = parse_int(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--dropout")) c->dropout = parse_real(a, v, 0, 1, 1);
        else if (!strcmp(a, "--epochs")) c->epochs = parse_int(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--batch")) c->batch = parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--lr")) c->lr = parse_real(a, v, 1e-12, 10, 0);
        else if (!strcmp(a, "--patience")) c->patience = parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--seed")) c->seed = (uint64_t)parse_int(a, v, 0, 2147483647);
        else if (!strcmp(a, "--threads")) o->threads = parse_int(a, v, 1, 1024);
        else if (!strcmp(a, "--save-every")) o->save_every = parse_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--device")) {
            o->device_auto = 0;
            if (!strcasecmp(v, "cpu")) o->backend = FG_BACKEND_CPU;
            else if (!strcasecmp(v, "cuda")) o->backend = FG_BACKEND_CUDA;
            else if (!strcasecmp(v, "auto")) o->device_auto = 1;
            else die(EXIT_BAD_INPUT, "--device: '%s' is not cpu, cuda or auto", v);
        } else if (!strcmp(a, "--dtype")) {
            if (!strcasecmp(v, "f32")) c->dtype = FG_F32;
            else if (!strcasecmp(v, "bf16")) c->dtype = FG_BF16;
            else die(EXIT_BAD_INPUT, "--dtype: '%s' is not f32 or bf16", v);
        } else if (!strcmp(a, "--log")) o->log = v;
        else if (!strcmp(a, "--predict")) o->predict = v;
        else if (!strcmp(a, "--checkpoint")) o->checkpoint = v;
        else die(EXIT_BAD_INPUT, "unknown flag %s (see --help)", a);
    }
    const config *c = &o->cfg;
    if (c->model == MODEL_PATCHTST) {
        if (c->d_model % c->heads) die(EXIT_BAD_INPUT, "--d-model %d is not a multiple of --heads %d", c->d_model, c->heads);
        if (c->lookback + c->stride < c->patch_len)
            die(EXIT_BAD_INPUT, "--lookback %d (+ stride %d of padding) is shorter than one patch (--patch-len %d)",
                c->lookback, c->stride, c->patch_len);
    }
    if (!o->checkpoint) { /* <data stem>_<model>_h<H>.ckpt in the working directory */
        const char *base = strrchr(o->data, '/');
        base = base ? base + 1 : o->data;
        char stem[256];
        snprintf(stem, sizeof stem, "%s", base);
        char *dot = strrchr(stem, '.');
        if (dot && dot != stem) *dot = 0;
        snprintf(o->checkpoint_default, sizeof o->checkpoint_default, "%s_%s_h%d.ckpt", stem,
                 c->model == MODEL_PATCHTST ? "patchtst" : "linear", c->horizon);
        o->checkpoint = o->checkpoint_default;
    }
}

/* ------------------------------------------------------------------ the run's state */

typedef struct run {
    options *o;
    dataset ds;
    csv_table csv;
    device dv;
    model *m;
    int64_t np, nb;
    /* training state (what a checkpoint keeps) */
    int64_t epoch;       /* the epoch in progress (0-based) */
    int64_t batch;       /* batches of it done */
    int64_t step;        /* Adam steps done */
    rng gen, epoch_start;
    double train_sum;    /* Σ batch losses of the epoch so far */
    double best_val;
    int64_t best_epoch, bad_epochs;
    float *best;         /* host [np + nb]: the best weights and running statistics */
    /* the data on the device, window starts (absolute rows), batches, the steps' losses */
    void *dz;            /* [rows, C] standardized, in the model's dtype */
    int64_t *order;      /* host: this epoch's train starts */
    int64_t *dstarts[3]; /* device: train (the epoch's order), validation, test starts */
    int64_t *dscratch;   /* device: Bmax starts of an arbitrary batch */
    void *dx, *dy;       /* device: [B, L, C], [B, H, C] */
    float *dlosses;      /* device: each step's loss in the epoch */
    int64_t summed;      /* steps of the epoch whose losses are in train_sum */
} run;

static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* The configuration a checkpoint must match to be resumed. */
static void put_config(ckpt *c, const run *r) {
    const config *g = &r->o->cfg;
    char fp[32];
    ckpt_config_str(c, "model", g->model == MODEL_PATCHTST ? "patchtst" : "linear");
    ckpt_config_i64(c, "lookback", g->lookback);
    ckpt_config_i64(c, "horizon", g->horizon);
    if (g->model == MODEL_PATCHTST) {
        ckpt_config_i64(c, "d_model", g->d_model);
        ckpt_config_i64(c, "heads", g->heads);
        ckpt_config_i64(c, "layers", g->layers);
        ckpt_config_i64(c, "d_ff", g->d_ff);
        ckpt_config_i64(c, "patch_len", g->patch_len);
        ckpt_config_i64(c, "stride", g->stride);
        ckpt_config_f64(c, "dropout", g->dropout);
    }
    ckpt_config_i64(c, "revin", g->revin);
    ckpt_config_i64(c, "batch", g->batch);
    ckpt_config_f64(c, "lr", g->lr);
    ckpt_config_i64(c, "seed", (int64_t)g->seed);
    ckpt_config_str(c, "dtype", fg_dtype_name(g->dtype));
    ckpt_config_str(c, "split", r->o->split_text);
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)r->ds.fingerprint);
    ckpt_config_str(c, "data", fp);
    ckpt_config_i64(c, "series", r->ds.C);
    ckpt_config_i64(c, "n_params", r->np);
}

static void internal_error(const char *what, const char *err) { die(1, "%s: %s", what, err); }

static void download_state(run *r, float *p, float *b) {
    if (model_get_state(r->m, p, b)) internal_error("reading the weights back", "device copy failed");
}

/* Writes the checkpoint (temp file + rename). Returns 0, or -1 after printing why. */
static int save_checkpoint(run *r) {
    ckpt *c = ckpt_new();
    float *h = malloc(sizeof(float) * (size_t)(4 * r->np + r->nb + 4));
    if (!c || !h) internal_error("checkpoint", "out of memory");
    float *p = h, *mo = h + r->np, *vo = h + 2 * r->np, *b = h + 3 * r->np;
    download_state(r, p, b);
    if (device_download(&r->dv, mo, model_adam_m(r->m), sizeof(float) * (size_t)r->np) ||
        device_download(&r->dv, vo, model_adam_v(r->m), sizeof(float) * (size_t)r->np))
        internal_error("reading Adam's moments back", "device copy failed");
    put_config(c, r);
    ckpt_put_i64(c, "epoch", r->epoch);
    ckpt_put_i64(c, "batches_done", r->batch);
    ckpt_put_i64(c, "step", r->step);
    ckpt_put_blob(c, "rng", &r->epoch_start, sizeof r->epoch_start);
    ckpt_put_f64(c, "train_sum", r->train_sum);
    ckpt_put_f64(c, "best_val", r->best_val);
    ckpt_put_i64(c, "best_epoch", r->best_epoch);
    ckpt_put_i64(c, "bad_epochs", r->bad_epochs);
    ckpt_put_tensor(c, "params", p, r->np);
    ckpt_put_tensor(c, "adam_m", mo, r->np);
    ckpt_put_tensor(c, "adam_v", vo, r->np);
    ckpt_put_tensor(c, "buffers", b, r->nb);
    ckpt_put_tensor(c, "best", r->best, r->np + r->nb);
    char err[512];
    const int rc = ckpt_save(c, r->o->checkpoint, err, sizeof err);
    if (rc) fprintf(stderr, "fastgrad-train: %s\n", err);
    ckpt_free(c);
    free(h);
    return rc;
}

/* Loads and checks the checkpoint to resume (exit 2 on anything wrong), then restores it. */
static void resume_checkpoint(run *r) {
    char err[512];
    ckpt *saved = NULL;
    if (access(r->o->checkpoint, F_OK) != 0)
        die(EXIT_BAD_INPUT, "--resume: %s: no such checkpoint (give --checkpoint FILE)", r->o->checkpoint);
    if (ckpt_load(r->o->checkpoint, &saved, err, sizeof err)) die(EXIT_BAD_INPUT, "%s", err);
    ckpt *now = ckpt_new();
    put_config(now, r);
    if (ckpt_same_config(saved, now, r->o->checkpoint, err, sizeof err)) die(EXIT_BAD_INPUT, "%s", err);
    ckpt_free(now);
    int64_t n[5];
    const float *p = ckpt_get_tensor(saved, "params", &n[0]), *mo = ckpt_get_tensor(saved, "adam_m", &n[1]);
    const float *vo = ckpt_get_tensor(saved, "adam_v", &n[2]), *b = ckpt_get_tensor(saved, "buffers", &n[3]);
    const float *best = ckpt_get_tensor(saved, "best", &n[4]);
    size_t rng_bytes = 0;
    const void *g = ckpt_get_blob(saved, "rng", &rng_bytes);
    if (!p || !mo || !vo || !b || !best || !g || rng_bytes != sizeof(rng) || n[0] != r->np || n[1] != r->np ||
        n[2] != r->np || n[3] != r->nb || n[4] != r->np + r->nb || ckpt_get_i64(saved, "epoch", &r->epoch) ||
        ckpt_get_i64(saved, "batches_done", &r->batch) || ckpt_get_i64(saved, "step", &r->step) ||
        ckpt_get_f64(saved, "train_sum", &r->train_sum) || ckpt_get_f64(saved, "best_val", &r->best_val) ||
        ckpt_get_i64(saved, "best_epoch", &r->best_epoch) || ckpt_get_i64(saved, "bad_epochs", &r->bad_epochs))
        die(EXIT_BAD_INPUT, "%s: checkpoint lacks an entry this fastgrad-train needs (or has one of the wrong size)",
            r->o->checkpoint);
    if (r->epoch < 0 || r->batch < 0 || r->step < 0)
        die(EXIT_BAD_INPUT, "%s: checkpoint has a negative epoch, batch or step", r->o->checkpoint);
    memcpy(&r->epoch_start, g, sizeof(rng));
    memcpy(r->best, best, sizeof(float) * (size_t)(r->np + r->nb));
    if (model_set_state(r->m, p, b) || device_upload(&r->dv, model_adam_m(r->m), mo, sizeof(float) * (size_t)r->np) ||
        device_upload(&r->dv, model_adam_v(r->m), vo, sizeof(float) * (size_t)r->np))
        internal_error("restoring the checkpoint", "device copy failed");
    ckpt_free(saved);
}

/* ------------------------------------------------------------------ batches and evaluation */

/* The batch of windows whose first rows are starts[0..B) (device memory): x [B, L, C] from the
 * series, y [B, H, C] from the series L rows on — fg_series_windows, on the device. */
static void gather(run *r, const int64_t *starts, int64_t B) {
    const int64_t T = r->ds.rows, C = r->ds.C, L = r->ds.L, H = r->ds.H;
    const int64_t ss[1] = {B}, zs[2] = {T, C}, ys[2] = {T - L, C}, xw[3] = {B, L, C}, yw[3] = {B, H, C};
    const fg_dtype t = model_dtype(r->m);
    const fg_tensor st = fg_tensor_make((void *)starts, FG_I64, 1, ss), z = fg_tensor_make(r->dz, t, 2, zs);
    const fg_tensor zl = fg_tensor_make((char *)r->dz + L * C * (int64_t)fg_dtype_size(t), t, 2, ys);
    const fg_tensor x = fg_tensor_make(r->dx, t, 3, xw), y = fg_tensor_make(r->dy, t, 3, yw);
    fg_status s = fg_series_windows(r->dv.ctx, &z, &st, &x);
    if (s == FG_OK) s = fg_series_windows(r->dv.ctx, &zl, &st, &y);
    if (s != FG_OK) die(1, "gathering a batch: %s: %s", fg_status_string(s), fg_last_error());
}

/* What the device found since the last check (a bad value a kernel flagged, an asynchronous CUDA
 * error): the one wait on the device per epoch besides the losses' read. */
static void check_device(run *r, const char *what) {
    const fg_status s = fg_context_check(r->dv.ctx);
    if (s != FG_OK) die(1, "after %s: %s: %s", what, fg_status_string(s), fg_last_error());
}

/* Adds the losses of steps [r->summed, upto) of the epoch to train_sum, in step order (the same
 * sum whether the run stopped in between or not); exits when one is not finite. */
static void flush_losses(run *r, int64_t upto) {
    if (upto <= r->summed) return;
    const int64_t n = upto - r->summed;
    float *h = malloc(sizeof(float) * (size_t)n);
    if (!h || device_download(&r->dv, h, r->dlosses + r->summed, sizeof(float) * (size_t)n))
        internal_error("reading the losses back", "device copy failed");
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(h[i]))
            die(1, "the loss is %g at epoch %lld step %lld: training diverged (nothing saved; lower --lr?)", h[i],
                (long long)r->epoch + 1, (long long)(r->summed + i + 1));
        r->train_sum += h[i];
    }
    free(h);
    r->summed = upto;
}

typedef struct metrics {
    double mse, mae;            /* every window */
    double mse_full, mae_full;  /* the windows of complete batches (drop_last) */
    int64_t windows, windows_full;
} metrics;

static metrics evaluate(run *r, int split) {
    metrics mt;
    memset(&mt, 0, sizeof mt);
    const int64_t n = r->ds.windows[split], Bmax = r->o->cfg.batch, per = (int64_t)r->ds.H * r->ds.C;
    double sse = 0, sae = 0, sse_full = 0, sae_full = 0;
    char err[512];
    for (int64_t w0 = 0; w0 < n; w0 += Bmax) {
        const int64_t B = w0 + Bmax <= n ? Bmax : n - w0;
        gather(r, r->dstarts[split] + w0, B);
        double s1, s2;
        if (model_eval(r->m, r->dx, r->dy, B, &s1, &s2, err, sizeof err)) internal_error("evaluation", err);
        sse += s1, sae += s2;
        if (B == Bmax) sse_full += s1, sae_full += s2, mt.windows_full += B;
    }
    mt.windows = n;
    mt.mse = sse / (double)(n * per);
    mt.mae = sae / (double)(n * per);
    mt.mse_full = mt.windows_full ? sse_full / (double)(mt.windows_full * per) : NAN;
    mt.mae_full = mt.windows_full ? sae_full / (double)(mt.windows_full * per) : NAN;
    return mt;
}

/* 'type3' (PatchTST's run_longExp default): lr for epochs 1-4 (1-based; the reference's
 * adjust_learning_rate after epoch e sets lr·0.9^(e−3) from e = 3), then ×0.9 each epoch. */
static double lr_at(const config *c, int64_t epoch) { return epoch < 4 ? c->lr : c->lr * pow(0.9, (double)(epoch - 3)); }

/* ------------------------------------------------------------------ output */

static void progress(const run *r, int64_t done, int64_t total, double loss, double t0) {
    const double el = now_s() - t0, rate = done > 0 ? done / el : 0, eta = rate > 0 ? (total - done) / rate : 0;
    char bar[32];
    const int w = 24, fill = total ? (int)(w * done / total) : w;
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[w] = 0;
    fprintf(stderr, "\r\033[Kepoch %lld/%d [%s] %lld/%lld  loss %.4f  %.1f it/s  ETA %d:%02d", (long long)r->epoch + 1,
            r->o->cfg.epochs, bar, (long long)done, (long long)total, loss, rate, (int)eta / 60, (int)eta % 60);
    fflush(stderr);
}

/* The published PatchTST/42 figures (Nie et al., Table 3, look-back 336), as data/README.md gives them. */
static int published(const char *data, int lookback, int horizon, double *mse, double *mae) {
    const char *base = strrchr(data, '/');
    base = base ? base + 1 : data;
    if (strcmp(base, "ETTh1.csv") != 0 || lookback != 336) return 0;
    static const int hs[4] = {96, 192, 336, 720};
    static const double ms[4] = {0.375, 0.414, 0.431, 0.449}, as[4] = {0.399, 0.421, 0.436, 0.466};
    for (int i = 0; i < 4; i++)
        if (hs[i] == horizon) {
            *mse = ms[i], *mae = as[i];
            return 1;
        }
    return 0;
}

/* Forecasts of the test windows that tile the test period (every horizon-th window), in the
 * data's units: date, window, step, each series' truth, then each series' forecast. */
static void write_predictions(run *r, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die(EXIT_BAD_INPUT, "--predict %s: cannot write: %s", path, strerror(errno));
    const dataset *d = &r->ds;
    const int64_t H = d->H, C = d->C, n = d->windows[SPLIT_TEST], Bmax = r->o->cfg.batch;
    fprintf(f, "date,window,step");
    for (int c = 0; c < C; c++) fprintf(f, ",%s", r->csv.names[c]);
    for (int c = 0; c < C; c++) fprintf(f, ",%s_pred", r->csv.names[c]);
    fprintf(f, "\n");
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)Bmax);
    float *pred = malloc(sizeof(float) * (size_t)(Bmax * H * C));
    char err[512];
    for (int64_t w0 = 0; w0 < n; w0 += Bmax * H) {
        int64_t B = 0;
        for (int64_t w = w0; w < n && B < Bmax; w += H) ids[B++] = w;
        int64_t *starts = malloc(sizeof(int64_t) * (size_t)B);
        for (int64_t b = 0; b < B; b++) starts[b] = d->border[SPLIT_TEST][0] + ids[b];
        if (device_upload(&r->dv, r->dscratch, starts, sizeof(int64_t) * (size_t)B))
            internal_error("forecast", "device copy failed");
        free(starts);
        gather(r, r->dscratch, B);
        double s1, s2;
        if (model_eval(r->m, r->dx, r->dy, B, &s1, &s2, err, sizeof err)) internal_error("forecast", err);
        if (model_get_prediction(r->m, pred, B * H * C))
            internal_error("forecast", "device copy failed");
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < H; t++) {
                const int64_t row = dataset_target_row(d, SPLIT_TEST, ids[b]) + t;
                fprintf(f, "%s,%lld,%lld", r->csv.dates[row], (long long)ids[b], (long long)t);
                for (int c = 0; c < C; c++) fprintf(f, ",%.6g", r->csv.values[row * C + c]);
                for (int c = 0; c < C; c++)
                    fprintf(f, ",%.6g", (double)pred[(b * H + t) * C + c] * d->std[c] + d->mean[c]);
                fprintf(f, "\n");
            }
    }
    free(ids);
    free(pred);
    if (fclose(f) != 0) die(1, "--predict %s: write failed", path);
}

/* Frees the run and returns code (main's every return after the run is set up). */
static int finish(run *r, FILE *log, int code) {
    if (log) fclose(log);
    model_destroy(r->m);
    device_free(&r->dv, r->dx);
    device_free(&r->dv, r->dy);
    device_free(&r->dv, r->dz);
    for (int sp = 0; sp < 3; sp++) device_free(&r->dv, r->dstarts[sp]);
    device_free(&r->dv, r->dscratch);
    device_free(&r->dv, r->dlosses);
    free(r->order);
    free(r->best);
    device_close(&r->dv);
    dataset_free(&r->ds);
    csv_free(&r->csv);
    return code;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    options o;
    parse_args(argc, argv, &o);
    config *cfg = &o.cfg;
    run r;
    memset(&r, 0, sizeof r);
    r.o = &o;
    char err[1024];
    /* the data: every problem here is bad input */
    if (csv_load(o.data, &r.csv, err, sizeof err)) die(EXIT_BAD_INPUT, "%s", err);
    if (dataset_make(&r.csv, o.data, &o.split, cfg->lookback, cfg->horizon, &r.ds, err, sizeof err))
        die(EXIT_BAD_INPUT, "%s", err);
    const int64_t steps_per_epoch = r.ds.windows[SPLIT_TRAIN] / cfg->batch;
    if (steps_per_epoch < 1)
        die(EXIT_BAD_INPUT, "%s: too few rows: %lld train windows, fewer than one batch of %d (lower --batch)", o.data,
            (long long)r.ds.windows[SPLIT_TRAIN], cfg->batch);
    /* the device */
    const fg_backend be = o.device_auto ? (fg_backend_available(FG_BACKEND_CUDA) ? FG_BACKEND_CUDA : FG_BACKEND_CPU)
                                        : o.backend;
    if (device_open(&r.dv, be, o.threads, err, sizeof err)) die(EXIT_BAD_INPUT, "%s", err);
    if (o.gradcheck && o.resume) die(EXIT_BAD_INPUT, "--gradcheck starts from fresh weights: drop --resume");
    if (o.gradcheck && be == FG_BACKEND_CPU) cfg->dtype = FG_F64; /* the check in f64 on the CPU */
    if (model_create(&r.m, cfg, r.ds.C, &r.dv, mix64(cfg->seed ^ 0x5EEDull), err, sizeof err))
        die(EXIT_BAD_INPUT, "%s", err);
    r.np = model_n_params(r.m);
    r.nb = model_n_buffers(r.m);
    r.best = calloc((size_t)(r.np + r.nb + 1), sizeof(double));
    r.best_val = INFINITY;
    r.best_epoch = -1;
    rng_seed(&r.epoch_start, cfg->seed);
    if (!o.gradcheck) download_state(&r, r.best, r.best + r.np);
    if (o.resume) resume_checkpoint(&r); /* exits 2 on a checkpoint it cannot continue */
    /* the log: appended to when resuming */
    FILE *log = NULL;
    if (o.log && !(log = fopen(o.log, o.resume ? "a" : "w")))
        die(EXIT_BAD_INPUT, "--log %s: cannot write: %s", o.log, strerror(errno));
    /* batch buffers: on the CPU the batch is assembled in place */
    const int64_t Bmax = cfg->batch;
    /* the standardized series and every window's start live on the device; a step gathers its batch */
    const int64_t ntrain = r.ds.windows[SPLIT_TRAIN];
    r.order = malloc(sizeof(int64_t) * (size_t)(ntrain + r.ds.windows[SPLIT_VAL] + r.ds.windows[SPLIT_TEST]));
    const size_t es = fg_dtype_size(model_dtype(r.m)); /* the batches are in the model's dtype */
    r.dz = device_alloc(&r.dv, es * (size_t)(r.ds.rows * r.ds.C));
    for (int sp = 0; sp < 3; sp++) r.dstarts[sp] = device_alloc(&r.dv, sizeof(int64_t) * (size_t)r.ds.windows[sp]);
    r.dscratch = device_alloc(&r.dv, sizeof(int64_t) * (size_t)Bmax);
    r.dx = device_alloc(&r.dv, es * (size_t)(Bmax * cfg->lookback * r.ds.C));
    r.dy = device_alloc(&r.dv, es * (size_t)(Bmax * cfg->horizon * r.ds.C));
    r.dlosses = device_alloc(&r.dv, sizeof(float) * (size_t)steps_per_epoch);
    if (!r.order || !r.dz || !r.dstarts[0] || !r.dstarts[1] || !r.dstarts[2] || !r.dscratch || !r.dx || !r.dy ||
        !r.dlosses)
        die(1, "out of memory for the data and the batches");
    {
        void *zt = malloc(es * (size_t)(r.ds.rows * r.ds.C));
        if (!zt || fg_convert(r.ds.z, FG_F32, zt, model_dtype(r.m), r.ds.rows * r.ds.C) != FG_OK ||
            device_upload(&r.dv, r.dz, zt, es * (size_t)(r.ds.rows * r.ds.C)))
            internal_error("uploading the data", "device copy failed");
        free(zt);
    }
    for (int sp = 1; sp < 3; sp++) { /* validation and test: every window in order */
        for (int64_t w = 0; w < r.ds.windows[sp]; w++) r.order[w] = r.ds.border[sp][0] + w;
        if (device_upload(&r.dv, r.dstarts[sp], r.order, sizeof(int64_t) * (size_t)r.ds.windows[sp]))
            internal_error("uploading the windows", "device copy failed");
    }

    if (o.gradcheck) { /* the model's backward against its forward, on the first train windows */
        const int64_t B = Bmax < 16 ? Bmax : 16;
        for (int64_t i = 0; i < B; i++) r.order[i] = r.ds.border[SPLIT_TRAIN][0] + i;
        if (device_upload(&r.dv, r.dscratch, r.order, sizeof(int64_t) * (size_t)B))
            internal_error("gradcheck", "device copy failed");
        gather(&r, r.dscratch, B);
        double worst = 0;
        if (model_gradcheck(r.m, r.dx, r.dy, B, 3, stdout, &worst, err, sizeof err)) internal_error("gradcheck", err);
        const double tol = cfg->dtype == FG_F64 ? 1e-5 : 5e-2; /* a wrong or missing term: ~1 */
        printf("gradcheck: largest relative error %.2e (%s %.0e)\n", worst, worst <= tol ? "within" : "OVER", tol);
        return finish(&r, log, worst <= tol ? 0 : 1);
    }
    char desc[256];
    model_describe(r.m, desc, sizeof desc);
    const int tty = isatty(2) && !o.quiet;
    if (!o.quiet) {
        printf("fastgrad-train: %s on %s (%lld rows, %d series; windows: %lld train, %lld validation, %lld test)\n",
               desc, o.data, (long long)r.ds.rows, r.ds.C, (long long)r.ds.windows[SPLIT_TRAIN],
               (long long)r.ds.windows[SPLIT_VAL], (long long)r.ds.windows[SPLIT_TEST]);
        printf("fastgrad-train: look-back %d, horizon %d, batch %d, lr %g, %d epochs, seed %llu, %s%s; checkpoint %s\n",
               cfg->lookback, cfg->horizon, cfg->batch, cfg->lr, cfg->epochs, (unsigned long long)cfg->seed,
               be == FG_BACKEND_CUDA ? "cuda" : "cpu", o.threads ? "" : "", o.checkpoint);
        if (o.resume)
            printf("fastgrad-train: resumed at epoch %lld, batch %lld (step %lld)\n", (long long)r.epoch + 1,
                   (long long)r.batch, (long long)r.step);
        fflush(stdout);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C ends the program at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    /* FGT_TEST_RAISE=INT@N or KILL@N: the program signals itself right after global step N, so the
       tests interrupt a run at a step they choose (through the real handler, or a real kill) */
    int64_t raise_at = 0;
    int raise_sig = SIGINT;
    const char *tr = getenv("FGT_TEST_RAISE");
    if (tr && *tr) {
        const char *at = strchr(tr, '@');
        if (!at || (strncmp(tr, "INT@", 4) != 0 && strncmp(tr, "KILL@", 5) != 0) || (raise_at = atoll(at + 1)) < 1)
            die(EXIT_BAD_INPUT, "FGT_TEST_RAISE=%s: want INT@N or KILL@N", tr);
        raise_sig = tr[0] == 'K' ? SIGKILL : SIGINT;
    }
    double train_time = 0;
    int64_t epochs_run = 0;
    model_profile(o.profile);
    while (r.bad_epochs < cfg->patience && r.epoch < cfg->epochs) {
        const double t0 = now_s();
        /* this epoch's order, from the generator's state at its start */
        r.gen = r.epoch_start;
        for (int64_t i = 0; i < ntrain; i++) r.order[i] = r.ds.border[SPLIT_TRAIN][0] + i;
        rng_shuffle(&r.gen, r.order, ntrain);
        if (device_upload(&r.dv, r.dstarts[SPLIT_TRAIN], r.order, sizeof(int64_t) * (size_t)ntrain))
            internal_error("uploading the epoch's order", "device copy failed");
        const double lr = lr_at(cfg, r.epoch);
        r.summed = r.batch; /* train_sum holds the steps before a resumed position */
        double shown = 0;
        for (; r.batch < steps_per_epoch; r.batch++) {
            gather(&r, r.dstarts[SPLIT_TRAIN] + r.batch * Bmax, Bmax);
            /* the loss stays on the device (no wait for the step): read at checkpoints, at the
               epoch's end and, on a terminal, a few times a second */
            if (model_train_step(r.m, r.dx, r.dy, Bmax, lr, r.step + 1, r.dlosses + r.batch, err, sizeof err))
                internal_error("training step", err);
            r.step++;
            if (raise_at > 0 && r.step == raise_at) raise(raise_sig); /* FGT_TEST_RAISE: the tests' interruption */
            if (tty && (now_s() - shown > 0.25 || r.batch + 1 == steps_per_epoch)) {
                float last = 0;
                if (device_download(&r.dv, &last, r.dlosses + r.batch, sizeof last))
                    internal_error("reading the loss back", "device copy failed");
                progress(&r, r.batch + 1, steps_per_epoch, last, t0);
                shown = now_s();
            }
            const int periodic = o.save_every > 0 && r.step % o.save_every == 0 && r.batch + 1 < steps_per_epoch;
            if (interrupted || periodic) {
                r.batch++; /* the state after this step */
                flush_losses(&r, r.batch);
                if (save_checkpoint(&r)) die(1, "could not save the checkpoint");
                if (interrupted) {
                    if (tty) fprintf(stderr, "\r\033[K");
                    fprintf(stderr,
                            "fastgrad-train: interrupted at epoch %lld step %lld; saved %s (resume with --resume)\n",
                            (long long)r.epoch + 1, (long long)r.batch, o.checkpoint);
                    return finish(&r, log, EXIT_INTERRUPTED);
                }
                r.batch--;
            }
        }
        flush_losses(&r, steps_per_epoch);
        const double train_loss = r.train_sum / (double)steps_per_epoch;
        const metrics val = evaluate(&r, SPLIT_VAL);
        check_device(&r, "the epoch");
        const int improved = !(val.mse > r.best_val); /* the reference's EarlyStopping: ties count */
        if (improved) {
            r.best_val = val.mse;
            r.best_epoch = r.epoch;
            r.bad_epochs = 0;
            download_state(&r, r.best, r.best + r.np);
        } else {
            r.bad_epochs++;
        }
        const double dt = now_s() - t0;
        train_time += dt;
        epochs_run++;
        const int64_t finished = r.epoch;
        r.epoch++;
        r.batch = 0;
        r.train_sum = 0;
        r.epoch_start = r.gen; /* the next epoch's shuffle starts here */
        if (save_checkpoint(&r)) die(1, "could not save the checkpoint");
        if (tty) fprintf(stderr, "\r\033[K");
        if (!o.quiet) {
            printf("epoch %3lld/%d  train %.5f  val mse %.5f mae %.5f%s  lr %.2e  %.2f s\n", (long long)finished + 1,
                   cfg->epochs, train_loss, val.mse, val.mae, improved ? " *" : "  ", lr, dt);
            fflush(stdout);
        }
        if (log) {
            fprintf(log,
                    "{\"epoch\": %lld, \"step\": %lld, \"train_loss\": %.9g, \"val_mse\": %.9g, \"val_mae\": %.9g, "
                    "\"lr\": %.9g, \"time_s\": %.4f, \"best\": %s}\n",
                    (long long)finished + 1, (long long)r.step, train_loss, val.mse, val.mae, lr, dt,
                    improved ? "true" : "false");
            fflush(log);
        }
        if (r.bad_epochs >= cfg->patience && !o.quiet)
            printf("early stop: no better validation MSE for %lld epochs\n", (long long)r.bad_epochs);
        if (interrupted) {
            fprintf(stderr, "fastgrad-train: interrupted after epoch %lld; saved %s (resume with --resume)\n",
                    (long long)finished + 1, o.checkpoint);
            return finish(&r, log, EXIT_INTERRUPTED);
        }
    }
    /* the test, with the best weights */
    if (model_set_state(r.m, r.best, r.best + r.np)) internal_error("loading the best weights", "device copy failed");
    if (o.profile) {
        model_profile_print(stdout);
        model_profile(0);
    }
    const double tt0 = now_s();
    const metrics test = evaluate(&r, SPLIT_TEST);
    check_device(&r, "the test");
    const double test_s = now_s() - tt0;
    const uint64_t digest = fnv_bytes(0xCBF29CE484222325ull, r.best, sizeof(float) * (size_t)(r.np + r.nb));
    if (o.predict) write_predictions(&r, o.predict);
    if (!o.quiet) {
        if (epochs_run)
            printf("training: %lld epochs in %.1f s (%.2f s/epoch, %lld steps/epoch); best validation MSE %.5f at epoch %lld\n",
                   (long long)epochs_run, train_time, train_time / (double)epochs_run, (long long)steps_per_epoch,
                   r.best_val, (long long)r.best_epoch + 1);
        printf("test (%.2f s):\n", test_s);
        printf("  %-34s MSE %.4f  MAE %.4f\n", "every test window", test.mse, test.mae);
        char label[64];
        snprintf(label, sizeof label, "complete batches of %d (drop_last)", cfg->batch);
        printf("  %-34s MSE %.4f  MAE %.4f   (%lld of %lld windows)\n", label, test.mse_full, test.mae_full,
               (long long)test.windows_full, (long long)test.windows);
        double pm, pa;
        if (published(o.data, cfg->lookback, cfg->horizon, &pm, &pa))
            printf("  %-34s MSE %.3f  MAE %.3f\n", "published PatchTST/42", pm, pa);
    }
    if (log) {
        fprintf(log,
                "{\"test_mse\": %.9g, \"test_mae\": %.9g, \"droplast_mse\": %.9g, \"droplast_mae\": %.9g, "
                "\"best_epoch\": %lld, \"best_val_mse\": %.9g}\n",
                test.mse, test.mae, test.mse_full, test.mae_full, (long long)r.best_epoch + 1, r.best_val);
    }
    printf("final: test_mse=%.9g test_mae=%.9g droplast_mse=%.9g droplast_mae=%.9g weights=%016llx\n", test.mse,
           test.mae, test.mse_full, test.mae_full, (unsigned long long)digest);
    return finish(&r, log, 0);
}

/*
 * checkpoint_test.c — the checkpoint container alone: a save / load round trip keeps every
 * entry's type and bits; a configuration that differs is named; a wrong magic, another format
 * version, a truncated file and a flipped bit are each refused with their line; a failed save
 * leaves the previous file whole and no temporary file behind.
 */
#include "../checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            failures++;                                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                   \
            fprintf(stderr, __VA_ARGS__);                                                                          \
            fprintf(stderr, "\n");                                                                                 \
        }                                                                                                          \
    } while (0)

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void patch_byte(const char *path, long at, unsigned char xor_with) {
    FILE *f = fopen(path, "r+b");
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ xor_with, f);
    fclose(f);
}

static ckpt *sample(int d_model) {
    ckpt *c = ckpt_new();
    ckpt_config_str(c, "model", "patchtst");
    ckpt_config_i64(c, "d_model", d_model);
    ckpt_config_f64(c, "lr", 1e-4);
    ckpt_put_i64(c, "step", -7);
    ckpt_put_u64(c, "rng0", 0xFEDCBA9876543210ull);
    ckpt_put_f64(c, "best", 0.3751);
    const unsigned char blob[5] = {1, 2, 0, 4, 255};
    ckpt_put_blob(c, "order", blob, sizeof blob);
    float w[1000];
    for (int i = 0; i < 1000; i++) w[i] = sinf((float)i) * 1e-3f;
    w[3] = NAN;
    ckpt_put_tensor(c, "weights", w, 1000);
    return c;
}

int main(void) {
    char dir[] = "/tmp/fgt-ckpt-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/a.ckpt", dir);
    ckpt *c = sample(16);
    CHECK(ckpt_save(c, path, err, sizeof err) == 0, "save: %s", err);
    ckpt *r = NULL;
    CHECK(ckpt_load(path, &r, err, sizeof err) == 0, "load: %s", err);
    if (r) {
        int64_t i = 0;
        uint64_t u = 0;
        double d = 0;
        size_t nb = 0;
        int64_t n = 0;
        CHECK(ckpt_get_i64(r, "step", &i) == 0 && i == -7, "i64");
        CHECK(ckpt_get_u64(r, "rng0", &u) == 0 && u == 0xFEDCBA9876543210ull, "u64");
        CHECK(ckpt_get_f64(r, "best", &d) == 0 && d == 0.3751, "f64");
        CHECK(ckpt_get_f64(r, "step", &d) == -1, "a type mismatch is a miss");
        CHECK(ckpt_get_i64(r, "nope", &i) == -1, "a missing key");
        CHECK(ckpt_get_str(r, "model") && strcmp(ckpt_get_str(r, "model"), "patchtst") == 0, "str");
        const unsigned char *b = ckpt_get_blob(r, "order", &nb);
        CHECK(b && nb == 5 && b[2] == 0 && b[4] == 255, "blob");
        const float *w = ckpt_get_tensor(r, "weights", &n);
        ckpt *o = sample(16);
        const float *w0 = ckpt_get_tensor(o, "weights", NULL);
        CHECK(w && n == 1000 && memcmp(w, w0, sizeof(float) * 1000) == 0, "tensor bits (NaN included)");
        CHECK(ckpt_same_config(r, o, path, err, sizeof err) == 0, "same config: %s", err);
        ckpt *other = sample(32);
        CHECK(ckpt_same_config(r, other, path, err, sizeof err) == -1 &&
                  strstr(err, "d_model=16 there, 32 here") != NULL,
              "another config is named: '%s'", err);
        ckpt_config_i64(other, "d_model", 16);
        ckpt_config_i64(other, "heads", 4);
        CHECK(ckpt_same_config(r, other, path, err, sizeof err) == -1 && strstr(err, "it has no heads") != NULL,
              "a setting the checkpoint lacks: '%s'", err);
        ckpt_free(other), ckpt_free(o), ckpt_free(r);
    }

    /* refusals, each with its line */
    char bad[256];
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
    FILE *f = fopen(bad, "wb");
    fputs("date,HUFL\n2016-07-01,1\n", f);
    fclose(f);
    CHECK(ckpt_load(bad, &r, err, sizeof err) == -1 && strstr(err, "not a fastgrad-train checkpoint"), "magic: '%s'", err);
    CHECK(ckpt_load("/nonexistent/x.ckpt", &r, err, sizeof err) == -1 && strstr(err, "cannot open"), "missing: '%s'", err);
    const long size = file_size(path);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp %s %s", path, bad);
    CHECK(system(cmd) == 0, "cp");
    patch_byte(bad, 8, 0x03); /* version 1 → 2 */
    CHECK(ckpt_load(bad, &r, err, sizeof err) == -1 && strstr(err, "format version 2; this fastgrad-train reads version 1"),
          "version: '%s'", err);
    CHECK(system(cmd) == 0, "cp");
    patch_byte(bad, size / 2, 0x10);
    CHECK(ckpt_load(bad, &r, err, sizeof err) == -1 && strstr(err, "corrupted checkpoint (CRC mismatch)"),
          "bit flip: '%s'", err);
    CHECK(system(cmd) == 0 && truncate(bad, size - 100) == 0, "truncate");
    CHECK(ckpt_load(bad, &r, err, sizeof err) == -1 && strstr(err, "corrupted checkpoint (truncated"),
          "truncated: '%s'", err);

    /* a save that fails leaves the old file whole: its temporary name taken by a directory */
    char target[300], blocker[400];
    snprintf(target, sizeof target, "%s/x.ckpt", dir);
    CHECK(ckpt_save(c, target, err, sizeof err) == 0, "save: %s", err);
    const long before = file_size(target);
    snprintf(blocker, sizeof blocker, "%s.tmp.%ld", target, (long)getpid());
    mkdir(blocker, 0755);
    ckpt *c2 = sample(64);
    CHECK(ckpt_save(c2, target, err, sizeof err) == -1 && strstr(err, "cannot write the checkpoint"),
          "a failed save: '%s'", err);
    rmdir(blocker);
    CHECK(file_size(target) == before, "the old checkpoint kept");
    ckpt *k = NULL;
    CHECK(ckpt_load(target, &k, err, sizeof err) == 0, "the old checkpoint loads: %s", err);
    int64_t dm = 0;
    CHECK(k && ckpt_get_i64(k, "d_model", &dm) == 0 && dm == 16, "the old configuration, read back");
    ckpt_free(k);
    ckpt_free(c2), ckpt_free(c);
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp && exit 1 || exit 0", dir);
    CHECK(system(cmd) == 0, "no temporary file left behind");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)system(cmd);
    if (failures) fprintf(stderr, "checkpoint_test: %d failed\n", failures);
    else printf("checkpoint_test: passed\n");
    return failures ? 1 : 0;
}

/*
 * checkpoint.h — fastgrad-train's checkpoint files: a versioned binary container of named
 * entries in two sections, the run's configuration (what a resumed run must match) and its
 * state (scalars, byte blobs such as the generator and the data order, f32 tensors such as
 * the weights and the optimizer's moments). The container knows nothing of the model: the
 * program puts and gets entries by name, so adding a tensor needs no format change.
 *
 * Writing goes to a temporary file in the same directory, flushed to disk, then renamed over
 * the target: a crash or a failed write leaves the previous checkpoint whole. Reading checks
 * the magic, the format version, the byte order, the length and a CRC-32 of the whole file,
 * and refuses each with one line naming the file.
 */
#ifndef FGT_CHECKPOINT_H
#define FGT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_VERSION 1u

typedef struct ckpt ckpt;

/* An empty container; NULL when out of memory. */
ckpt *ckpt_new(void);
void ckpt_free(ckpt *c);

/* Entries of the configuration: the run's identity, compared on --resume. A key put again
 * replaces its value. 0, or -1 when out of memory. */
int ckpt_config_str(ckpt *c, const char *key, const char *value);
int ckpt_config_i64(ckpt *c, const char *key, int64_t value);
int ckpt_config_f64(ckpt *c, const char *key, double value);

/* Entries of the state (the values are copied). */
int ckpt_put_i64(ckpt *c, const char *key, int64_t value);
int ckpt_put_u64(ckpt *c, const char *key, uint64_t value);
int ckpt_put_f64(ckpt *c, const char *key, double value);
int ckpt_put_blob(ckpt *c, const char *key, const void *data, size_t bytes);
int ckpt_put_tensor(ckpt *c, const char *key, const float *data, int64_t n);

/* Reads an entry of either section: 0, or -1 when it is missing or of another type. */
int ckpt_get_i64(const ckpt *c, const char *key, int64_t *value);
int ckpt_get_u64(const ckpt *c, const char *key, uint64_t *value);
int ckpt_get_f64(const ckpt *c, const char *key, double *value);
const char *ckpt_get_str(const ckpt *c, const char *key);                    /* NULL: missing */
const void *ckpt_get_blob(const ckpt *c, const char *key, size_t *bytes);    /* NULL: missing */
const float *ckpt_get_tensor(const ckpt *c, const char *key, int64_t *n);    /* NULL: missing */

/* Writes c to path through path.tmp.<pid> + rename. 0, or -1 with one line in err (the
 * target untouched). */
int ckpt_save(const ckpt *c, const char *path, char *err, size_t errlen);
/* Reads path: 0 and *out, or -1 with one line in err:
 *   "ckpt.bin: not a fastgrad-train checkpoint (bad magic)"
 *   "ckpt.bin: checkpoint format version 2; this fastgrad-train reads version 1"
 *   "ckpt.bin: corrupted checkpoint (CRC mismatch)" / "(truncated: ...)" */
int ckpt_load(const char *path, ckpt **out, char *err, size_t errlen);

/* 0 when `saved`'s configuration equals `now`'s, else -1 with one line naming the first key
 * that differs: "ckpt.bin: checkpoint of another configuration: d_model=16 there, 32 here". */
int ckpt_same_config(const ckpt *saved, const ckpt *now, const char *path, char *err, size_t errlen);

/* The configuration as "key=value key=value ..." (for messages and logs). */
void ckpt_config_text(const ckpt *c, char *buf, size_t len);

#endif

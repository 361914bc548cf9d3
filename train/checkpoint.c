/*
 * checkpoint.c — the checkpoint container of checkpoint.h. Layout (native byte order, which
 * the byte-order mark records so another machine refuses the file instead of misreading it):
 *
 *   "FGTRAIN\0"  u32 version  u32 byte-order mark 0x01020304  u64 payload bytes
 *   payload:     u32 entries, then per entry
 *                u8 section (0 configuration, 1 state)  u8 type  u16 key bytes  key
 *                u64 value bytes  value
 *   u32 CRC-32 (IEEE) of everything before it
 *
 * Why a CRC over the whole file: a truncated or bit-flipped checkpoint must be refused, not
 * resumed into a run that silently differs; why temp + rename: the previous checkpoint stays
 * whole until the new one is complete on disk.
 */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SEC_CONFIG = 0, SEC_STATE = 1 };
enum { T_STR = 1, T_I64 = 2, T_U64 = 3, T_F64 = 4, T_BLOB = 5, T_F32 = 6 };

static const char MAGIC[8] = {'F', 'G', 'T', 'R', 'A', 'I', 'N', 0};
#define BOM 0x01020304u
#define HEADER_BYTES 24

typedef struct entry {
    uint8_t section, type;
    char *key;
    void *value;
    uint64_t bytes;
} entry;

struct ckpt {
    entry *e;
    int n, cap;
};

/* ------------------------------------------------------------------ CRC-32 */

static uint32_t crc_table[256];

static void crc_init(void) {
    if (crc_table[1]) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc_update(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------------ entries */

ckpt *ckpt_new(void) { return calloc(1, sizeof(ckpt)); }

void ckpt_free(ckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        free(c->e[i].value);
    }
    free(c->e);
    free(c);
}

static entry *find(const ckpt *c, const char *key) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->e[i].key, key) == 0) return &c->e[i];
    return NULL;
}

static int put(ckpt *c, int section, int type, const char *key, const void *value, uint64_t bytes) {
    if (strlen(key) > 65535) return -1;
    char *copy = malloc((size_t)bytes + 1); /* + a 0: a string entry reads as a C string */
    if (!copy) return -1;
    if (bytes) memcpy(copy, value, (size_t)bytes);
    copy[bytes] = 0;
    entry *e = find(c, key);
    if (e) {
        free(e->value);
    } else {
        if (c->n == c->cap) {
            const int cap = c->cap ? 2 * c->cap : 32;
            entry *grown = realloc(c->e, sizeof(entry) * (size_t)cap);
            if (!grown) {
                free(copy);
                return -1;
            }
            c->e = grown, c->cap = cap;
        }
        e = &c->e[c->n];
        e->key = strdup(key);
        if (!e->key) {
            free(copy);
            return -1;
        }
        c->n++;
    }
    e->section = (uint8_t)section;
    e->type = (uint8_t)type;
    e->value = copy;
    e->bytes = bytes;
    return 0;
}

int ckpt_config_str(ckpt *c, const char *key, const char *v) { return put(c, SEC_CONFIG, T_STR, key, v, strlen(v)); }
int ckpt_config_i64(ckpt *c, const char *key, int64_t v) { return put(c, SEC_CONFIG, T_I64, key, &v, sizeof v); }
int ckpt_config_f64(ckpt *c, const char *key, double v) { return put(c, SEC_CONFIG, T_F64, key, &v, sizeof v); }
int ckpt_put_i64(ckpt *c, const char *key, int64_t v) { return put(c, SEC_STATE, T_I64, key, &v, sizeof v); }
int ckpt_put_u64(ckpt *c, const char *key, uint64_t v) { return put(c, SEC_STATE, T_U64, key, &v, sizeof v); }
int ckpt_put_f64(ckpt *c, const char *key, double v) { return put(c, SEC_STATE, T_F64, key, &v, sizeof v); }
int ckpt_put_blob(ckpt *c, const char *key, const void *p, size_t bytes) { return put(c, SEC_STATE, T_BLOB, key, p, bytes); }
int ckpt_put_tensor(ckpt *c, const char *key, const float *p, int64_t n) {
    return n < 0 ? -1 : put(c, SEC_STATE, T_F32, key, p, (uint64_t)n * sizeof(float));
}

static const entry *typed(const ckpt *c, const char *key, int type) {
    const entry *e = find(c, key);
    return e && e->type == type ? e : NULL;
}

int ckpt_get_i64(const ckpt *c, const char *key, int64_t *v) {
    const entry *e = typed(c, key, T_I64);
    if (!e || e->bytes != sizeof *v) return -1;
    memcpy(v, e->value, sizeof *v);
    return 0;
}

int ckpt_get_u64(const ckpt *c, const char *key, uint64_t *v) {
    const entry *e = typed(c, key, T_U64);
    if (!e || e->bytes != sizeof *v) return -1;
    memcpy(v, e->value, sizeof *v);
    return 0;
}

int ckpt_get_f64(const ckpt *c, const char *key, double *v) {
    const entry *e = typed(c, key, T_F64);
    if (!e || e->bytes != sizeof *v) return -1;
    memcpy(v, e->value, sizeof *v);
    return 0;
}

const char *ckpt_get_str(const ckpt *c, const char *key) {
    const entry *e = typed(c, key, T_STR);
    return e ? e->value : NULL; /* every value carries a terminating 0 past its bytes */
}

const void *ckpt_get_blob(const ckpt *c, const char *key, size_t *bytes) {
    const entry *e = typed(c, key, T_BLOB);
    if (!e) return NULL;
    if (bytes) *bytes = (size_t)e->bytes;
    return e->value;
}

const float *ckpt_get_tensor(const ckpt *c, const char *key, int64_t *n) {
    const entry *e = typed(c, key, T_F32);
    if (!e) return NULL;
    if (n) *n = (int64_t)(e->bytes / sizeof(float));
    return e->value;
}

/* ------------------------------------------------------------------ messages */

static int fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

static void value_text(const entry *e, char *buf, size_t len) {
    int64_t i;
    uint64_t u;
    double d;
    switch (e->type) {
    case T_STR: snprintf(buf, len, "%.*s", (int)e->bytes, (const char *)e->value); break;
    case T_I64: memcpy(&i, e->value, 8), snprintf(buf, len, "%lld", (long long)i); break;
    case T_U64: memcpy(&u, e->value, 8), snprintf(buf, len, "%llu", (unsigned long long)u); break;
    case T_F64: memcpy(&d, e->value, 8), snprintf(buf, len, "%.17g", d); break;
    default: snprintf(buf, len, "<%llu bytes>", (unsigned long long)e->bytes); break;
    }
}

void ckpt_config_text(const ckpt *c, char *buf, size_t len) {
    size_t at = 0;
    if (len) buf[0] = 0;
    for (int i = 0; i < c->n && at < len; i++) {
        if (c->e[i].section != SEC_CONFIG) continue;
        char v[128];
        value_text(&c->e[i], v, sizeof v);
        int w = snprintf(buf + at, len - at, "%s%s=%s", at ? " " : "", c->e[i].key, v);
        if (w < 0) break;
        at += (size_t)w;
    }
}

int ckpt_same_config(const ckpt *saved, const ckpt *now, const char *path, char *err, size_t len) {
    for (int i = 0; i < now->n; i++) {
        const entry *a = &now->e[i];
        if (a->section != SEC_CONFIG) continue;
        const entry *b = find(saved, a->key);
        char va[128], vb[128];
        value_text(a, va, sizeof va);
        if (!b || b->section != SEC_CONFIG)
            return fail(err, len, "%s: checkpoint of another configuration: it has no %s (this run: %s=%s)", path,
                        a->key, a->key, va);
        value_text(b, vb, sizeof vb);
        if (a->type != b->type || a->bytes != b->bytes || memcmp(a->value, b->value, (size_t)a->bytes) != 0)
            return fail(err, len, "%s: checkpoint of another configuration: %s=%s there, %s here", path, a->key, vb, va);
    }
    for (int i = 0; i < saved->n; i++) {
        const entry *b = &saved->e[i];
        if (b->section != SEC_CONFIG || find(now, b->key)) continue;
        char vb[128];
        value_text(b, vb, sizeof vb);
        return fail(err, len, "%s: checkpoint of another configuration: %s=%s there, not a setting of this run", path,
                    b->key, vb);
    }
    return 0;
}

/* ------------------------------------------------------------------ writing */

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} wbuf;

static void w_bytes(wbuf *w, const void *data, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->n + n) cap *= 2;
        unsigned char *g = realloc(w->p, cap);
        if (!g) {
            w->oom = 1;
            return;
        }
        w->p = g, w->cap = cap;
    }
    memcpy(w->p + w->n, data, n);
    w->n += n;
}

#define W(w, v)                                                                                                    \
    do {                                                                                                           \
        __typeof__(v) w_v_ = (v);                                                                                  \
        w_bytes((w), &w_v_, sizeof w_v_);                                                                          \
    } while (0)

int ckpt_save(const ckpt *c, const char *path, char *err, size_t len) {
    crc_init();
    wbuf w = {0};
    w_bytes(&w, MAGIC, sizeof MAGIC);
    W(&w, (uint32_t)CKPT_VERSION);
    W(&w, (uint32_t)BOM);
    W(&w, (uint64_t)0); /* payload bytes, patched below */
    W(&w, (uint32_t)c->n);
    for (int i = 0; i < c->n; i++) {
        const entry *e = &c->e[i];
        const uint16_t kl = (uint16_t)strlen(e->key);
        W(&w, e->section);
        W(&w, e->type);
        W(&w, kl);
        w_bytes(&w, e->key, kl);
        W(&w, e->bytes);
        w_bytes(&w, e->value, (size_t)e->bytes);
    }
    if (w.oom) {
        free(w.p);
        return fail(err, len, "%s: out of memory while writing the checkpoint", path);
    }
    const uint64_t payload = w.n - HEADER_BYTES;
    memcpy(w.p + 16, &payload, 8);
    const uint32_t crc = crc_update(0, w.p, w.n);
    W(&w, crc);
    if (w.oom) {
        free(w.p);
        return fail(err, len, "%s: out of memory while writing the checkpoint", path);
    }

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        free(w.p);
        return fail(err, len, "%s: cannot write the checkpoint (%s: %s)", path, tmp, strerror(errno));
    }
    size_t done = 0;
    while (done < w.n) {
        const ssize_t k = write(fd, w.p + done, w.n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (size_t)k;
    }
    const int saved_errno = errno;
    const int synced = done == w.n ? fsync(fd) : -1;
    free(w.p);
    if (done != w.n || synced != 0 || close(fd) != 0) {
        unlink(tmp);
        return fail(err, len, "%s: cannot write the checkpoint (%s)", path,
                    strerror(done != w.n ? saved_errno : errno));
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return fail(err, len, "%s: cannot replace the checkpoint (%s)", path, strerror(e));
    }
    /* the rename itself on disk: sync the directory (best effort) */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    else snprintf(dir, sizeof dir, ".");
    const int dfd = open(dir, O_RDONLY);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* ------------------------------------------------------------------ reading */

int ckpt_load(const char *path, ckpt **out, char *err, size_t len) {
    crc_init();
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, len, "%s: cannot open the checkpoint (%s)", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return fail(err, len, "%s: cannot read the checkpoint (%s)", path, strerror(errno));
    }
    const long size = ftell(f);
    rewind(f);
    if (size < 0) {
        fclose(f);
        return fail(err, len, "%s: cannot read the checkpoint (%s)", path, strerror(errno));
    }
    unsigned char *p = malloc(size ? (size_t)size : 1);
    if (!p) {
        fclose(f);
        return fail(err, len, "%s: out of memory reading the checkpoint (%ld bytes)", path, size);
    }
    const size_t got = fread(p, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(p);
        return fail(err, len, "%s: cannot read the checkpoint (short read)", path);
    }
    if ((size_t)size < sizeof MAGIC || memcmp(p, MAGIC, sizeof MAGIC) != 0) {
        free(p);
        return fail(err, len, "%s: not a fastgrad-train checkpoint (bad magic)", path);
    }
    if ((size_t)size < HEADER_BYTES + 4 + 4) {
        free(p);
        return fail(err, len, "%s: corrupted checkpoint (truncated: %ld bytes)", path, size);
    }
    uint32_t version, bom, crc;
    uint64_t payload;
    memcpy(&version, p + 8, 4);
    memcpy(&bom, p + 12, 4);
    memcpy(&payload, p + 16, 8);
    if (bom != BOM) {
        free(p);
        return fail(err, len, "%s: checkpoint written on a machine of another byte order", path);
    }
    if (version != CKPT_VERSION) {
        free(p);
        return fail(err, len, "%s: checkpoint format version %u; this fastgrad-train reads version %u", path, version,
                    CKPT_VERSION);
    }
    if (payload != (uint64_t)size - HEADER_BYTES - 4) {
        free(p);
        return fail(err, len, "%s: corrupted checkpoint (truncated: %ld bytes, the header says %llu)", path, size,
                    (unsigned long long)(payload + HEADER_BYTES + 4));
    }
    memcpy(&crc, p + size - 4, 4);
    if (crc_update(0, p, (size_t)size - 4) != crc) {
        free(p);
        return fail(err, len, "%s: corrupted checkpoint (CRC mismatch)", path);
    }
    ckpt *c = ckpt_new();
    if (!c) {
        free(p);
        return fail(err, len, "%s: out of memory reading the checkpoint", path);
    }
    const unsigned char *at = p + HEADER_BYTES, *end = p + size - 4;
    uint32_t count;
    int bad = end - at < 4;
    if (!bad) memcpy(&count, at, 4), at += 4;
    for (uint32_t i = 0; !bad && i < count; i++) {
        uint8_t section, type;
        uint16_t kl;
        uint64_t vb;
        if (end - at < 4) {
            bad = 1;
            break;
        }
        section = at[0], type = at[1];
        memcpy(&kl, at + 2, 2);
        at += 4;
        if ((uint64_t)(end - at) < (uint64_t)kl + 8) {
            bad = 1;
            break;
        }
        char key[65536];
        memcpy(key, at, kl);
        key[kl] = 0;
        at += kl;
        memcpy(&vb, at, 8);
        at += 8;
        if ((uint64_t)(end - at) < vb || section > SEC_STATE || type < T_STR || type > T_F32) {
            bad = 1;
            break;
        }
        if (find(c, key)) { /* a key twice: not a file this program wrote */
            bad = 1;
            break;
        }
        if (put(c, section, type, key, at, vb) != 0) {
            bad = 2;
            break;
        }
        at += vb;
    }
    free(p);
    if (!bad && at != end) bad = 1;
    if (bad) {
        ckpt_free(c);
        return fail(err, len, bad == 2 ? "%s: out of memory reading the checkpoint"
                                       : "%s: corrupted checkpoint (entries do not parse)", path);
    }
    *out = c;
    return 0;
}

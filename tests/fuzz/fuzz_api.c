/*
 * fuzz_api.c — a libFuzzer target over the whole public API on the CPU backend.
 *
 * Bytes decode into calls: every op of the op table through the plan API (create, info,
 * workspace size, can_implement, run) and through its one-call function(s), fg_adamw_step,
 * the encoder layer (sizes, forward, backward), fg_convert, the context calls and the small
 * helpers. Operand descriptors get random ranks,
 * shapes (from a pool of shared dims, so shapes agree often enough to run), strides (zero,
 * overlapping, huge), dtypes, NULL pointers, aliasing between operands, misalignment and
 * options. Every view with a finite extent below a cap gets a poisoned buffer of exactly its
 * extent with guard bytes around it. After each call it checks the error contract:
 *   - a refusal writes nothing (every buffer byte-identical) and leaves a message;
 *   - a success writes only inside the output views (and nothing in guards or inputs) and
 *     leaves fg_last_error() empty (a stale message is planted before every call);
 *   - the library and its dependencies print nothing (stdout and stderr go to a file
 *     during the calls; sanitizer reports go to the real stderr);
 *   - no hang (the work per call is bounded; libFuzzer's -timeout catches the rest), and
 *     ASan/UBSan find nothing.
 * The byte format is documented beside the decoder and followed by make_corpus.py, which
 * writes the seed corpus (tests/fuzz/corpus/).
 */
#include "fastgrad.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void __sanitizer_set_report_fd(void *fd);

#define CAP_BYTES (48 * 1024)       /* largest view that gets a buffer          */
#define GUARD 64                    /* guard bytes on each side of a buffer      */
#define MAX_CALLS 4
#define MAX_WS ((size_t)64 << 20)   /* a plan over views this small needs less   */

/* ------------------------------------------------------------------ reader */

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;

static uint8_t u8(rd *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static const double scalar_set[16] = {0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 0.25, -0.5, 1e-3, 10.0,
                                      NAN, INFINITY, -INFINITY, 1e300, 0.999, 1e-8};
static double scalar(rd *r) { return scalar_set[u8(r) & 15]; }

/* ------------------------------------------------------------------ findings */

static int saved_out = -1, saved_err = -1, capture_fd = -1;

static void restore_fds(void) {
    if (saved_out >= 0) {
        fflush(stdout);
        fflush(stderr);
        dup2(saved_out, 1);
        dup2(saved_err, 2);
    }
}

static void redirect_fds(void) {
    fflush(stdout);
    fflush(stderr);
    dup2(capture_fd, 1);
    dup2(capture_fd, 2);
}

__attribute__((noreturn, format(printf, 1, 2))) static void finding(const char *fmt, ...) {
    restore_fds();
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FUZZ FINDING: %s\n", msg);
    abort();
}

/* FUZZ_TRACE: each call's status and message, to the real stderr (replaying an input) */
static void trace_status(const char *what, fg_status s) {
    static int on = -1;
    if (on < 0) on = getenv("FUZZ_TRACE") != NULL;
    if (on) dprintf(saved_err, "  -> %s: %s %s\n", what, fg_status_string(s), fg_last_error());
}

/* Fails when anything was printed into the capture file since the last check. */
static void check_quiet(const char *what) {
    fflush(stdout);
    fflush(stderr);
    struct stat st;
    if (fstat(capture_fd, &st) == 0 && st.st_size > 0) {
        char buf[512] = {0};
        ssize_t got = pread(capture_fd, buf, sizeof buf - 1, 0);
        (void)got;
        finding("%s printed %lld bytes: %s", what, (long long)st.st_size, buf);
    }
}

static void plant_stale_error(void) {
    fg_op_info info;
    if (fg_op_describe(FG_OP_NONE, &info) == FG_OK || fg_last_error()[0] == 0)
        finding("fg_op_describe(FG_OP_NONE) did not fail with a message");
}

static void check_status(const char *what, fg_status s) {
    check_quiet(what);
    trace_status(what, s);
    const char *msg = fg_last_error();
    if (!msg) finding("%s: fg_last_error() is NULL", what);
    if (s == FG_OK && msg[0] != 0) finding("%s: FG_OK but fg_last_error() is \"%s\"", what, msg);
    if (s != FG_OK && msg[0] == 0) finding("%s: %s with an empty fg_last_error()", what, fg_status_string(s));
    if ((int)s < 0 || (int)s > FG_ERR_INTERNAL) finding("%s: status %d is not an fg_status", what, (int)s);
    if (s == FG_ERR_INTERNAL) finding("%s: FG_ERR_INTERNAL: %s", what, msg);
}

/* ------------------------------------------------------------------ buffers */

/* An arena: guard | body | guard, body filled with a poison byte; `mark` says which body
 * bytes an output view covers (where a successful call may write). */
typedef struct arena {
    uint8_t *mem, *snap, *mark;
    size_t body;
} arena;

#define MAX_ARENAS 80
static arena arenas[MAX_ARENAS];
static int n_arenas;
static uint8_t dummy_mem[256] __attribute__((aligned(64)));

static int arena_new(size_t body) {
    if (n_arenas == MAX_ARENAS) return -1;
    arena *a = &arenas[n_arenas];
    a->body = body;
    a->mem = malloc(body + 2 * GUARD);
    a->snap = malloc(body + 2 * GUARD);
    a->mark = calloc(body + 1, 1);
    return n_arenas++;
}

static void arenas_free(void) {
    for (int i = 0; i < n_arenas; i++) {
        free(arenas[i].mem);
        free(arenas[i].snap);
        free(arenas[i].mark);
    }
    n_arenas = 0;
}

static void arenas_fill(uint8_t poison) {
    for (int i = 0; i < n_arenas; i++) {
        memset(arenas[i].mem, 0xA5, GUARD);
        memset(arenas[i].mem + GUARD, poison, arenas[i].body);
        memset(arenas[i].mem + GUARD + arenas[i].body, 0x5A, GUARD);
        memset(arenas[i].mark, 0, arenas[i].body + 1);
    }
}

static void arenas_snapshot(void) {
    for (int i = 0; i < n_arenas; i++) memcpy(arenas[i].snap, arenas[i].mem, arenas[i].body + 2 * GUARD);
}

/* After a refusal: nothing changed. After a success: changes only inside marked bytes. */
static void arenas_check(const char *what, bool ok) {
    for (int i = 0; i < n_arenas; i++) {
        const arena *a = &arenas[i];
        for (size_t b = 0; b < a->body + 2 * GUARD; b++) {
            if (a->mem[b] == a->snap[b]) continue;
            const bool in_body = b >= GUARD && b < GUARD + a->body;
            if (!ok) finding("%s refused but wrote byte %zu of buffer %d", what, b, i);
            if (!in_body) finding("%s wrote guard byte %zd of buffer %d", what, (ssize_t)b - GUARD, i);
            if (!a->mark[b - GUARD])
                finding("%s wrote byte %zu of buffer %d outside every output view", what, b - GUARD, i);
        }
    }
}

/* ------------------------------------------------------------------ descriptors */

static int64_t pool[8];

static int64_t pool_value(uint8_t b) {
    static const int64_t big[8] = {(int64_t)1 << 31, (int64_t)1 << 40, INT64_MAX, (int64_t)1 << 62,
                                   3037000500LL, 65536, 100000, (int64_t)1 << 33};
    if (b < 176) return b % 7;           /* 0..6   */
    if (b < 232) return 7 + b % 41;      /* 7..47  */
    return big[b & 7];
}

static int64_t dim_value(uint8_t b) {
    static const int64_t lit[16] = {0, 1, 2, -1, (int64_t)1 << 31, (int64_t)1 << 62, INT64_MAX, 3,
                                    INT64_MIN, 5, 16, 17, 100, 1000, 4096, (int64_t)1 << 40};
    return b < 240 ? pool[b & 7] : lit[b & 15];
}

typedef struct operand {
    fg_tensor t;
    bool absent;      /* optional operand left out (rank 0; NULL in one-call functions) */
    bool null_ptr;    /* one-call: pass NULL for this (possibly required) operand       */
    int data_mode;    /* 0 own, 1 NULL data, 2 alias, 3 misaligned                      */
    int alias_of, alias_off;
    bool big;         /* no buffer: extent over the cap, overflowing, or invalid          */
    size_t extent;    /* bytes                                                            */
    int arena;
    size_t offset;    /* in the arena's body                                              */
    bool output;      /* the op may write it                                              */
} operand;

static size_t dsize(fg_dtype t) { return fg_dtype_size(t); }

/* The view's byte extent in 128 bits; -1 when it is not a view we can allocate, or has
 * more elements than the cap. */
static int64_t view_extent(const fg_tensor *t) {
    if (t->rank < 0 || t->rank > FG_MAX_RANK) return -1;
    size_t es = dsize(t->dtype);
    if (es == 0) es = 4;
    bool all_zero = true;
    for (int i = 0; i < t->rank; i++) all_zero = all_zero && t->stride[i] == 0;
    __int128 last = 0, s = 1, numel = 1;
    for (int i = 0; i < t->rank; i++)
        if (t->shape[i] == 0) numel = 0;
    for (int i = 0; i < t->rank && numel; i++) {
        numel *= t->shape[i] > 0 ? t->shape[i] : 1;
        if (numel > CAP_BYTES) return -1; /* the work per call stays small (broadcast views too) */
    }
    for (int i = t->rank - 1; i >= 0; i--) {
        if (t->shape[i] < 0) return -1;
        __int128 st = all_zero ? s : t->stride[i];
        if (st < 0) return -1;
        if (t->shape[i] == 0) return 0;
        last += (__int128)(t->shape[i] - 1) * st;
        if (all_zero) s *= t->shape[i];
        if (last > ((__int128)1 << 40) || s > ((__int128)1 << 40)) return -1;
    }
    __int128 bytes = (last + 1) * (__int128)es;
    return bytes > CAP_BYTES ? -1 : (int64_t)bytes;
}

/* Marks the bytes of view t (inside arena a at offset off) as writable. */
static void mark_view(const operand *o) {
    if (o->big || o->absent || o->arena < 0 || o->data_mode == 1) return;
    const fg_tensor *t = &o->t;
    size_t es = dsize(t->dtype);
    if (es == 0 || t->rank < 0 || t->rank > FG_MAX_RANK) return;
    int64_t stride[FG_MAX_RANK], s = 1, idx[FG_MAX_RANK] = {0};
    bool all_zero = true;
    for (int i = 0; i < t->rank; i++) {
        all_zero = all_zero && t->stride[i] == 0;
        if (t->shape[i] == 0) return; /* empty */
    }
    for (int i = t->rank - 1; i >= 0; i--) { /* not big: every product is small */
        stride[i] = all_zero ? s : t->stride[i];
        s *= t->shape[i];
    }
    arena *a = &arenas[o->arena];
    const size_t base = (size_t)((uint8_t *)t->data - (a->mem + GUARD));
    for (;;) {
        int64_t e = 0;
        for (int i = 0; i < t->rank; i++) e += idx[i] * stride[i];
        size_t at = base + (size_t)e * es;
        for (size_t b = 0; b < es && at + b < a->body; b++) a->mark[at + b] = 1;
        int d = t->rank - 1;
        while (d >= 0 && ++idx[d] == t->shape[d]) idx[d--] = 0;
        if (d < 0) break;
    }
}

/* Reads one operand's descriptor. main: the call's float dtype; idt: its integer one, the
 * default of an operand of integer ids (is_int). */
static void read_operand(rd *r, operand *o, bool is_int, bool optional, fg_dtype main, fg_dtype idt) {
    memset(o, 0, sizeof *o);
    o->arena = -1;
    const uint8_t mode = u8(r);
    o->absent = optional && (mode & 3) == 3;
    o->null_ptr = (mode & 3) == 3 && !optional ? true : o->absent && (mode & 0x80);
    const int dm = (mode >> 2) & 15;
    o->data_mode = dm == 12 ? 1 : dm == 13 ? 2 : dm == 14 ? 3 : 0;
    const uint8_t rb = u8(r) & 15;
    static const int32_t odd_rank[7] = {9, -1, 100, INT32_MIN, 1, 2, 3};
    o->t.rank = rb <= 8 ? rb : odd_rank[rb - 9];
    const uint8_t db = u8(r);
    o->t.dtype = db < 224 ? (is_int ? idt : main) : (fg_dtype)((int)(db & 15) - 2);
    const int nd = o->t.rank < 0 ? 0 : o->t.rank > FG_MAX_RANK ? FG_MAX_RANK : o->t.rank;
    for (int i = 0; i < nd; i++) o->t.shape[i] = dim_value(u8(r));
    const uint8_t sm = u8(r);
    if (sm >= 192) {
        int64_t contig = 1;
        for (int i = nd - 1; i >= 0; i--) {
            const int64_t n = o->t.shape[i] > 0 && o->t.shape[i] < ((int64_t)1 << 20) ? o->t.shape[i] : 1;
            const uint8_t sb = u8(r);
            static const int64_t lit[6] = {0, 1, 2, 3, -1, (int64_t)1 << 62};
            switch (sb & 15) {
            case 0: case 1: case 2: case 3: case 4: case 5: o->t.stride[i] = lit[sb & 15]; break;
            case 6: o->t.stride[i] = (int64_t)1 << 40; break;
            case 7: o->t.stride[i] = contig * 2; break;
            case 8: o->t.stride[i] = contig + 1; break;
            default: o->t.stride[i] = contig; break;
            }
            contig = contig * n < ((int64_t)1 << 30) ? contig * n : contig;
        }
    }
    if (o->data_mode == 2) {
        const uint8_t ab = u8(r);
        o->alias_of = ab & 15;
        o->alias_off = ab >> 4;
    }
    if (o->absent) {
        o->t.rank = 0;
        o->t.data = NULL;
    }
}

/* Gives every operand its buffer (or the dummy): own arenas first, then aliases into them. */
static void place(operand *ops, int n) {
    for (int i = 0; i < n; i++) {
        operand *o = &ops[i];
        if (o->absent) continue;
        int64_t ext = view_extent(&o->t);
        o->big = ext < 0;
        o->extent = ext < 0 ? 0 : (size_t)ext;
        if (o->big || o->data_mode == 2) continue;
        o->arena = arena_new(o->extent + 16);
        o->offset = 0;
    }
    for (int i = 0; i < n; i++) {
        operand *o = &ops[i];
        if (o->absent || o->big || o->data_mode != 2) continue;
        const operand *to = &ops[o->alias_of % n];
        if (to->absent || to->big || to->arena < 0 || to->data_mode == 2) {
            o->arena = arena_new(o->extent + 16);
            continue;
        }
        size_t es = dsize(o->t.dtype) ? dsize(o->t.dtype) : 4;
        size_t off = (size_t)o->alias_off * es;
        arena *a = &arenas[to->arena];
        if (off + o->extent > a->body) { /* grow the shared arena to hold both */
            uint8_t *m = realloc(a->mem, off + o->extent + 2 * GUARD);
            uint8_t *s = realloc(a->snap, off + o->extent + 2 * GUARD);
            uint8_t *k = realloc(a->mark, off + o->extent + 1);
            a->mem = m, a->snap = s, a->mark = k;
            a->body = off + o->extent;
        }
        o->arena = to->arena;
        o->offset = off;
    }
}

static void resolve(operand *ops, int n) {
    for (int i = 0; i < n; i++) {
        operand *o = &ops[i];
        if (o->absent) continue;
        if (o->big) o->t.data = dummy_mem;
        else o->t.data = arenas[o->arena].mem + GUARD + o->offset;
        if (o->data_mode == 1) o->t.data = NULL;
        if (o->data_mode == 3 && o->t.data) o->t.data = (char *)o->t.data + 1;
    }
}

static bool any_big(const operand *ops, int n) {
    for (int i = 0; i < n; i++)
        if (!ops[i].absent && ops[i].big) return true;
    return false;
}

/* Attention's work grows as B·H·L² whatever its operands' bytes (q [1, 1, 4096, 1] is 16 KB):
 * past 2^22 scores a call takes seconds under the sanitizers, which libFuzzer reports as a slow
 * unit (seen: an encoder layer at L 4096, 11 s). Such calls are not run. */
#define MAX_SCORES ((double)(1 << 22))
static bool too_many_scores(double B, double H, double L) {
    return B > 0 && H > 0 && L > 0 && B * H * L * L > MAX_SCORES;
}

static void mark_outputs(const operand *ops, int n) {
    for (int i = 0; i < n; i++)
        if (ops[i].output) mark_view(&ops[i]);
}

/* ------------------------------------------------------------------ options */

typedef union options {
    fg_elementwise_options ew;
    fg_logp_options logp;
    fg_linear_act_options act;
    fg_norm_options norm;
    fg_batch_norm_options bn;
    fg_dropout_options drop;
    fg_revin_options revin;
    fg_attention_options attn;
    fg_patch_options patch;
    fg_regression_loss_options loss;
    uint8_t bytes[256];
} options;

static void read_options(rd *r, const fg_op_info *info, options *o, const void **ptr, size_t *size) {
    memset(o, 0, sizeof *o);
    const uint8_t mode = u8(r);
    *ptr = o;
    *size = info->options_size;
    switch (mode & 7) {
    case 0: *ptr = NULL, *size = 0; break;
    case 1: *size = 0; break;
    case 2: *size = info->options_size / 2; break;
    case 3: *size = info->options_size + 8; break;
    default: break;
    }
    if (!info->options_type) {
        if ((mode & 7) != 7) *ptr = NULL, *size = 0;
        return;
    }
    if (strcmp(info->options_type, "fg_elementwise_options") == 0) {
        o->ew.kind = (int)(u8(r) % 9) - 1;
        for (int i = 0; i < 4; i++) o->ew.scalars[i] = scalar(r);
    } else if (strcmp(info->options_type, "fg_logp_options") == 0) {
        const uint8_t f = u8(r);
        o->logp.temperature = f & 1 ? scalar(r) : 0;
        o->logp.softcap = f & 2 ? scalar(r) : 0;
        o->logp.use_ignore_index = f & 4 ? 1 : 0;
        o->logp.ignore_index = (int64_t)(u8(r) % 5) - 1;
        o->logp.reduction = (fg_reduction)((int)(u8(r) % 5) - 1);
        o->logp.label_smoothing = f & 8 ? scalar(r) : 0;
        o->logp.z_loss = f & 16 ? scalar(r) : 0;
        o->logp.grad_scale = f & 32 ? scalar(r) : 0;
        static const int64_t tiles[8] = {0, 1, 2, 7, 16, -1, (int64_t)1 << 40, 3};
        o->logp.max_tile_elements = f & 64 ? tiles[u8(r) & 7] : 0;
        /* vocabulary shards: unsharded, a valid or invalid slice of a few classes, negative */
        static const int64_t starts[4] = {0, 1, 3, -1}, totals[4] = {0, 4, 9, (int64_t)1 << 62};
        const uint8_t v = f & 128 ? u8(r) : 0;
        o->logp.vocab_start = starts[v & 3], o->logp.vocab_total = totals[(v >> 2) & 3];
    } else if (strcmp(info->options_type, "fg_linear_act_options") == 0) {
        o->act.act = (fg_activation)((int)(u8(r) % 10) - 1);
        o->act.saved = (fg_act_saved)((int)(u8(r) % 4) - 1);
        o->act.consume = (int)(u8(r) % 4) - 1;
    } else if (strcmp(info->options_type, "fg_norm_options") == 0) {
        const uint8_t f = u8(r);
        o->norm.kind = (fg_norm_kind)((int)(u8(r) % 4) - 1);
        o->norm.eps = f & 1 ? scalar(r) : 0;
        o->norm.dropout.p = f & 2 ? scalar(r) : 0;
        o->norm.dropout.seed = u8(r), o->norm.dropout.offset = f & 4 ? UINT64_MAX - u8(r) : u8(r);
    } else if (strcmp(info->options_type, "fg_batch_norm_options") == 0) {
        const uint8_t f = u8(r);
        o->bn.eval = (int)(u8(r) % 4) - 1;
        o->bn.eps = f & 1 ? scalar(r) : 0;
        o->bn.momentum = f & 2 ? scalar(r) : 0;
        o->bn.dropout.p = f & 4 ? scalar(r) : 0;
        o->bn.dropout.seed = u8(r);
    } else if (strcmp(info->options_type, "fg_dropout_options") == 0) {
        o->drop.p = scalar(r);
        o->drop.seed = u8(r), o->drop.offset = u8(r);
    } else if (strcmp(info->options_type, "fg_revin_options") == 0) {
        const uint8_t f = u8(r);
        o->revin.eps = f & 1 ? scalar(r) : 0;
        o->revin.denorm = (int)(u8(r) % 4) - 1;
        o->revin.subtract_last = f & 2 ? 1 : 0;
    } else if (strcmp(info->options_type, "fg_attention_options") == 0) {
        const uint8_t f = u8(r);
        o->attn.scale = f & 1 ? scalar(r) : 0;
        o->attn.causal = (int)(u8(r) % 4) - 1;
        o->attn.dropout_p = f & 2 ? scalar(r) : 0;
        o->attn.seed = u8(r), o->attn.offset = f & 4 ? UINT64_MAX - u8(r) : u8(r);
    } else if (strcmp(info->options_type, "fg_patch_options") == 0) {
        o->patch.patch_len = dim_value(u8(r));
        o->patch.stride = dim_value(u8(r));
        o->patch.pad_end = dim_value(u8(r));
    } else if (strcmp(info->options_type, "fg_regression_loss_options") == 0) {
        const uint8_t f = u8(r);
        o->loss.kind = (fg_loss_kind)((int)(u8(r) % 5) - 1);
        o->loss.reduction = (fg_reduction)((int)(u8(r) % 5) - 1);
        o->loss.delta = f & 1 ? scalar(r) : 0;
        o->loss.grad_scale = f & 2 ? scalar(r) : 0;
    }
}

/* ------------------------------------------------------------------ contexts */

static fg_context *contexts[3];

static fg_context *pick_context(uint8_t b) { return (b & 7) == 7 ? NULL : contexts[b % 3]; }

/* ------------------------------------------------------------------ op calls */

/* An op of the table that call_one has no case for (a family that has not added its one-call
 * functions here yet): its plan created and run once, as the one-call functions do, so the
 * op is fuzzed through its front door all the same and is not taken for an unknown op. */
static fg_status plan_once(fg_context *ctx, fg_op op, const operand *o, const void *optp, size_t optsize, int acc) {
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.op = op;
    for (int i = 0; i < FG_MAX_OPERANDS; i++)
        if (!o[i].null_ptr) d.operands[i] = o[i].t;
    d.accumulate = acc;
    d.options = optp;
    d.options_size = optsize;
    fg_plan *plan = NULL;
    fg_status s = fg_plan_create(ctx, &d, &plan);
    if (s != FG_OK) return s;
    size_t ws_bytes = 0;
    void *ws = NULL;
    s = fg_plan_workspace_size(plan, &ws_bytes);
    if (s == FG_OK && ws_bytes > MAX_WS) finding("op %d: a plan over small views asks for %zu bytes of workspace", (int)op, ws_bytes);
    if (s == FG_OK && ws_bytes) ws = malloc(ws_bytes);
    if (s == FG_OK) s = fg_plan_run(plan, d.operands, ws, ws_bytes);
    fg_plan_destroy(plan);
    free(ws);
    return s;
}

/* One-call functions of op `op` (variant picks among several), NULL operands where asked. */
static fg_status call_one(fg_context *ctx, fg_op op, int variant, const operand *o, const options *opt,
                          const void *optp, size_t optsize, int acc) {
    const fg_tensor *P[FG_MAX_OPERANDS];
    for (int i = 0; i < FG_MAX_OPERANDS; i++) P[i] = o[i].null_ptr ? NULL : &o[i].t;
    const fg_elementwise_options *ew = &opt->ew;
    const double *sc = variant & 1 ? NULL : ew->scalars;
    const fg_logp_options *lo = optp ? &opt->logp : NULL;
    const fg_linear_act_options *ao = optp ? &opt->act : NULL;
    const fg_activation act = opt->act.act;
    const fg_norm_options *no = optp ? &opt->norm : NULL;
    const fg_batch_norm_options *bo = optp ? &opt->bn : NULL;
    const fg_dropout_options *dp = optp ? &opt->drop : NULL;
    const fg_revin_options *ro = optp ? &opt->revin : NULL;
    const fg_attention_options *ato = optp ? &opt->attn : NULL;
    const fg_patch_options *po = optp ? &opt->patch : NULL;
    const fg_regression_loss_options *lso = optp ? &opt->loss : NULL;
    switch (op) {
    case FG_OP_PATCH_FORWARD: return fg_patch_forward(ctx, po, P[0], P[1]);
    case FG_OP_PATCH_BACKWARD: return fg_patch_backward(ctx, po, P[0], P[1], acc);
    case FG_OP_REGRESSION_LOSS: return fg_regression_loss(ctx, lso, P[0], P[1], P[2], P[3], acc);
    case FG_OP_SERIES_WINDOWS: return fg_series_windows(ctx, P[0], P[1], P[2]);
    case FG_OP_ATTENTION_FORWARD: return fg_attention_forward(ctx, ato, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7]);
    case FG_OP_ATTENTION_BACKWARD:
        return fg_attention_backward(ctx, ato, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], P[10], P[11],
                                     P[12], acc);
    case FG_OP_NORM_FORWARD: return fg_norm_forward(ctx, no, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7]);
    case FG_OP_NORM_BACKWARD:
        return fg_norm_backward(ctx, no, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], acc);
    case FG_OP_BATCH_NORM_FORWARD:
        return fg_batch_norm_forward(ctx, bo, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9]);
    case FG_OP_BATCH_NORM_BACKWARD:
        return fg_batch_norm_backward(ctx, bo, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], acc);
    case FG_OP_BATCH_NORM_STATS: return fg_batch_norm_stats(ctx, bo, P[0], P[1], P[2], P[3]);
    case FG_OP_BATCH_NORM_APPLY:
        return fg_batch_norm_apply(ctx, bo, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8]);
    case FG_OP_BATCH_NORM_BACKWARD_STATS: return fg_batch_norm_backward_stats(ctx, bo, P[0], P[1], P[2], P[3], P[4]);
    case FG_OP_BATCH_NORM_BACKWARD_APPLY:
        return fg_batch_norm_backward_apply(ctx, bo, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], acc);
    case FG_OP_DROPOUT_FORWARD: return fg_dropout_forward(ctx, dp, P[0], P[1]);
    case FG_OP_DROPOUT_BACKWARD: return fg_dropout_backward(ctx, dp, P[0], P[1], acc);
    case FG_OP_REVIN_STATS: return fg_revin_stats(ctx, ro, P[0], P[1], P[2]);
    case FG_OP_REVIN_FORWARD: return fg_revin_forward(ctx, ro, P[0], P[1], P[2], P[3], P[4], P[5]);
    case FG_OP_REVIN_BACKWARD:
        return fg_revin_backward(ctx, ro, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], acc);
    case FG_OP_LINEAR_FORWARD: return fg_linear_forward(ctx, P[0], P[1], P[2], P[3]);
    case FG_OP_LINEAR_BACKWARD_INPUT: return fg_linear_backward_input(ctx, P[0], P[1], P[2], acc);
    case FG_OP_LINEAR_BACKWARD_WEIGHT: return fg_linear_backward_weight(ctx, P[0], P[1], P[2], acc);
    case FG_OP_LINEAR_BACKWARD_BIAS: return fg_linear_backward_bias(ctx, P[0], P[1], acc);
    case FG_OP_MATMUL_FORWARD: return fg_matmul_forward(ctx, P[0], P[1], P[2]);
    case FG_OP_MATMUL_BACKWARD_INPUT: return fg_matmul_backward_input(ctx, P[0], P[1], P[2], acc);
    case FG_OP_MATMUL_BACKWARD_OTHER: return fg_matmul_backward_other(ctx, P[0], P[1], P[2], acc);
    case FG_OP_OUTER_FORWARD: return fg_outer_forward(ctx, P[0], P[1], P[2]);
    case FG_OP_OUTER_BACKWARD_INPUT: return fg_outer_backward_input(ctx, P[0], P[1], P[2], acc);
    case FG_OP_OUTER_BACKWARD_OTHER: return fg_outer_backward_other(ctx, P[0], P[1], P[2], acc);
    case FG_OP_UNARY_FORWARD: return fg_unary_forward(ctx, (fg_unary)ew->kind, sc, P[0], P[1]);
    case FG_OP_UNARY_BACKWARD: return fg_unary_backward(ctx, (fg_unary)ew->kind, sc, P[0], P[1], P[2], acc);
    case FG_OP_BINARY_FORWARD:
        if (variant & 2) return fg_axpby_forward(ctx, P[0], P[1], ew->scalars[0], ew->scalars[1], P[3]);
        return fg_lerp_forward(ctx, P[0], P[1], P[2], ew->scalars[0], P[3]);
    case FG_OP_BINARY_BACKWARD:
        if (variant & 2) return fg_axpby_backward(ctx, P[0], ew->scalars[0], ew->scalars[1], P[4], P[5], acc);
        return fg_lerp_backward(ctx, P[0], P[1], P[2], P[3], ew->scalars[0], P[4], P[5], P[6], acc);
    case FG_OP_LINEAR_LOGP_FORWARD: return fg_linear_logp_forward(ctx, lo, P[0], P[1], P[2], P[3], P[4], P[5], P[6]);
    case FG_OP_LINEAR_LOGP_BACKWARD:
        return fg_linear_logp_backward(ctx, lo, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], P[10],
                                       P[11], acc);
    case FG_OP_LINEAR_CROSS_ENTROPY:
        return fg_linear_cross_entropy(ctx, lo, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], acc);
    case FG_OP_LINEAR_LOGP_SHARD_FORWARD:
        return fg_linear_logp_shard_forward(ctx, lo, P[0], P[1], P[2], P[3], P[4], P[5], P[6]);
    case FG_OP_LINEAR_LOGP_SHARD_COMBINE:
        return fg_linear_logp_shard_combine(ctx, lo, P[0], P[1], P[2], P[3], P[4], P[5], P[6]);
    case FG_OP_LINEAR_ACT_FORWARD:
        switch (variant % 3) {
        case 0: return fg_linear_act_forward_ex(ctx, ao, P[0], P[1], P[2], P[3], P[4]);
        case 1: return fg_linear_act_forward(ctx, act, P[0], P[1], P[2], P[3], P[4]);
        default: return fg_linear_act_forward_slope(ctx, act, P[0], P[1], P[2], P[3], P[4]);
        }
    case FG_OP_LINEAR_ACT_BACKWARD:
        switch (variant % 7) {
        case 0: return fg_linear_act_backward_ex(ctx, ao, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], acc);
        case 1: return fg_linear_act_backward(ctx, act, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], acc);
        case 2: return fg_linear_act_backward_consume(ctx, act, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], acc);
        case 3: return fg_linear_act_backward_slope(ctx, act, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], acc);
        case 4: return fg_linear_act_backward_input(ctx, act, P[0], P[1], P[2], P[3], P[4], P[5], acc);
        case 5: return fg_linear_act_backward_weight(ctx, act, P[0], P[1], P[2], P[3], P[4], P[6], acc);
        default: return fg_linear_act_backward_bias(ctx, act, P[0], P[1], P[2], P[3], P[4], P[7], acc);
        }
    default: break;
    }
    if (op >= 1 && op <= fg_op_count()) return plan_once(ctx, op, o, optp, optsize, acc);
    /* not an op: the plan API must refuse it */
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.op = op;
    fg_plan *p = NULL;
    fg_status s = fg_plan_create(ctx, &d, &p);
    if (s == FG_OK) finding("plan_create accepted op %d", (int)op);
    return s;
}

static void op_call(rd *r, bool use_plan) {
    const int32_t count = fg_op_count();
    fg_context *ctx = pick_context(u8(r));
    const fg_op op = (fg_op)(u8(r) % (count + 2));
    const uint8_t tb = u8(r);
    static const fg_dtype mains[4] = {FG_F32, FG_F16, FG_BF16, FG_F64};
    const fg_dtype main = mains[tb & 3], idt = tb & 4 ? FG_I64 : FG_I32;
    const uint8_t ab = u8(r);
    const int acc = ab < 240 ? (ab & 1) : (int)ab - 245;
    const uint8_t fb = u8(r);
    const uint32_t flags = fb < 200 ? 0u : (fb & 7u) | (fb == 255 ? 0x100u : 0u);
    static const uint32_t aligns[16] = {0, 0, 0, 0, 16, 1, 2, 4, 8, 32, 256, 3, 24, 512, 0, 0};
    const uint32_t alignment = aligns[u8(r) & 15];
    const int variant = u8(r);

    fg_op_info info;
    memset(&info, 0, sizeof info);
    fg_status ds = fg_op_describe(op, &info);
    const bool known = ds == FG_OK;
    if (!known && op >= 1 && op <= count) finding("fg_op_describe(%d) failed", (int)op);
    if (known && fg_last_error()[0]) finding("fg_op_describe succeeded with a stale message");
    const int n = known ? info.n_operands : 4;

    options opt;
    const void *optp = NULL;
    size_t optsize = 0;
    fg_op_info none;
    memset(&none, 0, sizeof none);
    read_options(r, known ? &info : &none, &opt, &optp, &optsize);

    operand ops[FG_MAX_OPERANDS];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < n; i++) {
        /* integer ids: class targets (the regression loss's target is a float tensor), key-padding
           lengths, window starts */
        const char *nm = known ? info.operands[i].name : "";
        const bool ids = (strcmp(nm, "target") == 0 && op != FG_OP_REGRESSION_LOSS) || strcmp(nm, "lengths") == 0 ||
                         strcmp(nm, "starts") == 0;
        read_operand(r, &ops[i], ids, known && info.operands[i].optional, main, idt);
        ops[i].output = known && info.operands[i].role == FG_ROLE_OUTPUT;
        /* linear_act's backward may overwrite its saved operand (consume) */
        if (op == FG_OP_LINEAR_ACT_BACKWARD && i == 1) ops[i].output = true;
    }
    for (int i = n; i < FG_MAX_OPERANDS; i++) ops[i].absent = true, ops[i].arena = -1;
    place(ops, n);
    arenas_fill((uint8_t[]){0x00, 0x3C, 0xFF, 0x41}[u8(r) & 3]);
    resolve(ops, n);
    mark_outputs(ops, n);
    const operand *q = op == FG_OP_ATTENTION_FORWARD ? &ops[0] : op == FG_OP_ATTENTION_BACKWARD ? &ops[2] : NULL;
    const bool runnable = !any_big(ops, n) &&
                          !(q && !q->absent && q->t.rank == 4 &&
                            too_many_scores((double)q->t.shape[0], (double)q->t.shape[1], (double)q->t.shape[2]));
    if (getenv("FUZZ_TRACE")) { /* replaying a finding: what the call is */
        dprintf(saved_err, "%s op %d acc %d flags %u align %u variant %d\n", use_plan ? "plan" : "one-call", (int)op,
                acc, flags, alignment, variant);
        for (int i = 0; i < n; i++) {
            dprintf(saved_err, "  %d: %s%s dtype %d rank %d data %p shape", i, ops[i].absent ? "absent " : "",
                    ops[i].null_ptr ? "NULL " : "", (int)ops[i].t.dtype, ops[i].t.rank, ops[i].t.data);
            for (int d = 0; d < ops[i].t.rank && d < FG_MAX_RANK; d++) dprintf(saved_err, " %lld", (long long)ops[i].t.shape[d]);
            dprintf(saved_err, " stride");
            for (int d = 0; d < ops[i].t.rank && d < FG_MAX_RANK; d++) dprintf(saved_err, " %lld", (long long)ops[i].t.stride[d]);
            dprintf(saved_err, "\n");
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%s(%s, op %d %s)", use_plan ? "plan" : "one-call", known ? info.name : "?", (int)op,
             ctx ? "" : "ctx NULL");

    if (!use_plan) {
        if (!runnable) return; /* views past the cap have no memory behind them */
        arenas_snapshot();
        plant_stale_error();
        redirect_fds();
        fg_status s = call_one(ctx, op, variant, ops, &opt, optp, optsize, acc);
        check_status(what, s);
        arenas_check(what, s == FG_OK);
        return;
    }

    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.op = op;
    for (int i = 0; i < n && i < FG_MAX_OPERANDS; i++) {
        d.operands[i] = ops[i].t;
        d.operands[i].data = (variant & 8) ? ops[i].t.data : NULL; /* data is ignored */
    }
    d.accumulate = acc;
    d.flags = flags;
    d.options = optp;
    d.options_size = optsize;
    d.alignment = alignment;
    fg_plan *plan = NULL;
    plant_stale_error();
    redirect_fds();
    fg_status s = fg_plan_create(ctx, (variant & 16) ? NULL : &d, &plan);
    char w2[160];
    snprintf(w2, sizeof w2, "%s create", what);
    check_status(w2, s);
    if (s != FG_OK) {
        if (plan) finding("%s: a refused plan_create left *out set", what);
        return;
    }
    fg_plan_info pi;
    plant_stale_error();
    redirect_fds();
    s = fg_plan_info_get(plan, &pi);
    check_status("plan_info_get", s);
    if (s == FG_OK && (pi.op != op || strnlen(pi.kernel, sizeof pi.kernel) == sizeof pi.kernel))
        finding("%s: plan info is inconsistent", what);
    size_t ws_bytes = 0;
    plant_stale_error();
    redirect_fds();
    s = fg_plan_workspace_size(plan, &ws_bytes);
    check_status("plan_workspace_size", s);
    if (runnable && ws_bytes > MAX_WS)
        finding("%s: a plan over views of at most %d bytes asks for %zu bytes of workspace", what, CAP_BYTES,
                ws_bytes);
    if (runnable) {
        fg_tensor run_ops[FG_MAX_OPERANDS];
        for (int i = 0; i < FG_MAX_OPERANDS; i++) run_ops[i] = ops[i].t;
        arenas_snapshot();
        plant_stale_error();
        redirect_fds();
        s = fg_plan_can_implement(plan, run_ops);
        snprintf(w2, sizeof w2, "%s can_implement", what);
        check_status(w2, s);
        arenas_check(w2, false);
        void *ws = NULL;
        size_t give = ws_bytes;
        if (variant & 32) give = ws_bytes / 2;
        if (give) ws = malloc(give);
        arenas_snapshot();
        plant_stale_error();
        redirect_fds();
        s = fg_plan_run(plan, (variant & 64) ? NULL : run_ops, ws, give);
        snprintf(w2, sizeof w2, "%s run", what);
        check_status(w2, s);
        arenas_check(w2, s == FG_OK);
        free(ws);
    }
    redirect_fds();
    fg_plan_destroy(plan);
    check_quiet("plan_destroy");
}

/* ------------------------------------------------------------------ AdamW */

static void adamw_call(rd *r) {
    fg_context *ctx = pick_context(u8(r));
    fg_adamw_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.lr = scalar(r);
    hp.beta1 = scalar(r);
    hp.beta2 = scalar(r);
    hp.eps = scalar(r);
    hp.weight_decay = scalar(r);
    const uint8_t sb = u8(r);
    hp.step = sb < 240 ? sb % 5 : (sb & 1 ? INT64_MAX : -1);
    hp.grad_scale = scalar(r);
    const uint8_t cb = u8(r);
    int count = cb % 4;
    if (cb >= 250) count = cb == 255 ? -1 : 5;
    const uint8_t lb = u8(r);
    static const fg_dtype mains[4] = {FG_F32, FG_F16, FG_BF16, FG_F64};
    const fg_dtype pt = mains[lb & 3];
    const bool has_master = lb & 4, null_list = (lb & 0x18) == 0x18, hp_null = lb == 0xFF;
    /* lists: params, grads, exp_avg, exp_avg_sq, master */
    operand ops[5 * 5];
    const int nl = has_master ? 5 : 4, nt = count > 0 ? count : 0;
    memset(ops, 0, sizeof ops);
    for (int l = 0; l < nl; l++)
        for (int i = 0; i < nt; i++) {
            /* moments (lists 2, 3): f32, or with bit 6 the params' dtype */
            fg_dtype want = l == 0 ? pt : l == 1 ? ((lb & 32) ? FG_F32 : pt) : (l < 4 && (lb & 64)) ? pt : FG_F32;
            read_operand(r, &ops[l * 5 + i], false, false, want, FG_I32);
            ops[l * 5 + i].null_ptr = false;
            ops[l * 5 + i].output = l != 1;
        }
    for (int k = 0; k < 25; k++)
        if (k % 5 >= nt || k / 5 >= nl) ops[k].absent = true, ops[k].arena = -1;
    place(ops, 25);
    arenas_fill((uint8_t[]){0x00, 0x3C, 0xFF, 0x41}[u8(r) & 3]);
    resolve(ops, 25);
    mark_outputs(ops, 25);
    if (any_big(ops, 25)) return;
    fg_tensor lists[5][5];
    for (int l = 0; l < 5; l++)
        for (int i = 0; i < 5; i++) lists[l][i] = ops[l * 5 + i].t;
    arenas_snapshot();
    plant_stale_error();
    redirect_fds();
    fg_status s = fg_adamw_step(ctx, hp_null ? NULL : &hp, count, null_list ? NULL : lists[0], lists[1], lists[2],
                                lists[3], has_master ? lists[4] : NULL);
    check_status("adamw_step", s);
    arenas_check("adamw_step", s == FG_OK);
}

/* ------------------------------------------------------------------ encoder layer */

/* The parameter slots of fg_encoder_layer_params in their order, and each one's shape from the
   descriptor: 0 d, 1 [3d, d], 2 [3d], 3 [d, d], 4 [d_ff, d], 5 [d_ff], 6 [d, d_ff]. */
#define ENC_N 22
static const int enc_shape[ENC_N] = {1, 2, 3, 0, 3, 0, 3, 0, 3, 0, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0};
static const int enc_rank[7] = {1, 2, 1, 2, 2, 1, 2};

static fg_tensor *enc_slot(fg_encoder_layer_params *p, int i) { return &((fg_tensor *)p)[i]; }

/* An operand of the given shape and dtype, contiguous, or (mode) one read from the bytes. */
static void enc_operand(rd *r, operand *o, int rank, const int64_t *shape, fg_dtype dt, bool out) {
    const uint8_t mode = u8(r);
    if (mode >= 232) {
        read_operand(r, o, false, false, dt, FG_I32);
    } else {
        memset(o, 0, sizeof *o);
        o->arena = -1;
        o->t.rank = rank;
        o->t.dtype = dt;
        for (int i = 0; i < rank; i++) o->t.shape[i] = shape[i];
        if (mode >= 224) o->data_mode = 1 + (mode & 1) * 2; /* NULL or misaligned data */
    }
    o->output = out;
}

/* fg_encoder_layer_sizes, _forward and (after a training forward that ran) _backward over a
 * descriptor from the bytes: dims from the pool, every enum and rate sometimes out of range,
 * the parameters present or absent one by one (their shapes the descriptor's, or read as any
 * other operand), the cache and workspace the sizes said or less. Sometimes the stack entries
 * (fg_encoder_sizes, _forward, _backward) instead, over 1 … 3 layers sharing those parameters
 * (or a bad layer count), the gradients of the first layer only. */
static void encoder_call(rd *r) {
    fg_context *ctx = pick_context(u8(r));
    fg_encoder_layer_desc d;
    memset(&d, 0, sizeof d);
    d.d_model = dim_value(u8(r));
    d.heads = dim_value(u8(r));
    d.d_ff = dim_value(u8(r));
    const uint8_t k = u8(r), k2 = u8(r), k3 = u8(r);
    static const fg_activation acts[8] = {FG_ACT_GELU, FG_ACT_RELU, FG_ACT_GELU_TANH, FG_ACT_SILU,
                                          FG_ACT_GELU, FG_ACT_NONE, FG_ACT_TANH, (fg_activation)99};
    d.activation = acts[k & 7];
    d.norm = (fg_encoder_norm)((int)((k >> 3) & 7) % 6 - 1); /* -1 … 4 */
    d.causal = (k >> 6) & 1;
    d.residual_scores = (k >> 7) & 1;
    d.save = (fg_encoder_save)(k2 & 3);
    if ((k2 & 0xC0) == 0xC0) d.causal = 2;
    if (k2 & 4) d.norm_eps = scalar(r);
    if (k2 & 8) d.bn_momentum = scalar(r);
    if (k2 & 16) d.attn_scale = scalar(r);
    if (k2 & 32) d.dropout = scalar(r);
    if (k3 & 1) d.dropout_ffn = scalar(r);
    if (k3 & 2) d.dropout_attn = scalar(r);
    if (k3 & 4) d.dropout_proj = scalar(r);
    fg_encoder_layer_run run;
    memset(&run, 0, sizeof run);
    run.train = (k3 & 8) ? 1 : 0;
    run.seed = u8(r);
    run.offset = u8(r);
    static const fg_dtype mains[4] = {FG_F32, FG_F16, FG_BF16, FG_F64};
    const fg_dtype dt = mains[(k3 >> 4) & 3];
    const int64_t B = dim_value(u8(r)), L = dim_value(u8(r));
    const bool desc_null = (k3 & 0xC0) == 0xC0;
    if (getenv("FUZZ_TRACE")) /* replaying a finding: the layer */
        dprintf(saved_err, "encoder d_model %lld heads %lld d_ff %lld B %lld L %lld dtype %d train %d save %d\n",
                (long long)d.d_model, (long long)d.heads, (long long)d.d_ff, (long long)B, (long long)L, (int)dt,
                run.train, (int)d.save);
    size_t cache_bytes = 0, ws_bytes = 0;
    plant_stale_error();
    redirect_fds();
    fg_status s = fg_encoder_layer_sizes(desc_null ? NULL : &d, dt, B, L, &cache_bytes, &ws_bytes);
    check_status("encoder_layer_sizes", s);
    if (s != FG_OK || cache_bytes > ((size_t)1 << 20) || ws_bytes > ((size_t)1 << 20)) return;
    if (too_many_scores((double)B, (double)d.heads, (double)L)) return;
    /* operands: x, lengths, scores_in, y, scores_out, the parameters */
    const int64_t dm = d.d_model, df = d.d_ff, H = d.heads;
    const int64_t x_shape[3] = {B, L, dm}, s_shape[4] = {B, H, L, L}, len_shape[1] = {B};
    /* 3d saturated: the sizes accept any d when nothing is computed (B or L 0) */
    const int64_t dm3 = dm > INT64_MAX / 3 || dm < INT64_MIN / 3 ? INT64_MAX : 3 * dm;
    const int64_t pshapes[7][2] = {{dm, 0}, {dm3, dm}, {dm3, 0}, {dm, dm}, {df, dm}, {df, 0}, {dm, df}};
    const uint8_t pres0 = u8(r), pres1 = u8(r), pres2 = u8(r), opt = u8(r);
    const uint32_t present = pres0 | (uint32_t)pres1 << 8 | (uint32_t)pres2 << 16;
    operand ops[5 + ENC_N];
    memset(ops, 0, sizeof ops);
    enc_operand(r, &ops[0], 3, x_shape, dt, false);
    enc_operand(r, &ops[1], 1, len_shape, (opt & 2) ? FG_I64 : FG_I32, false);
    enc_operand(r, &ops[2], 4, s_shape, dt, false);
    enc_operand(r, &ops[3], 3, x_shape, dt, true);
    enc_operand(r, &ops[4], 4, s_shape, dt, true);
    ops[1].absent = !(opt & 1), ops[2].absent = !(opt & 4), ops[4].absent = !(opt & 8);
    for (int i = 0; i < ENC_N; i++) {
        const int sh = enc_shape[i], rank = enc_rank[sh];
        const bool stat = i >= 18; /* running statistics: f32 or the dtype, written in training */
        enc_operand(r, &ops[5 + i], rank, pshapes[sh], stat && (opt & 16) ? FG_F32 : dt, stat);
        ops[5 + i].absent = !(present >> i & 1);
    }
    for (int i = 0; i < 5 + ENC_N; i++)
        if (ops[i].absent) ops[i].t.rank = 0, ops[i].arena = -1;
    place(ops, 5 + ENC_N);
    if (any_big(ops, 5 + ENC_N)) return;
    const uint8_t cut = u8(r);
    const bool stack = (cut & 128) != 0;
    int64_t layers = 1;
    if (stack) {
        const uint8_t nl = u8(r);
        layers = nl < 248 ? 1 + nl % 3 : (int64_t[]){0, -1, INT64_MAX, 4, 2, 3, 1, 2}[nl - 248];
        plant_stale_error();
        redirect_fds();
        s = fg_encoder_sizes(desc_null ? NULL : &d, layers, dt, B, L, &cache_bytes, &ws_bytes);
        check_status("encoder_sizes", s);
        if (s != FG_OK || cache_bytes > ((size_t)1 << 20) || ws_bytes > ((size_t)1 << 20)) return;
    }
    const size_t cache_give = (cut & 1) && cache_bytes ? cache_bytes - 1 : cache_bytes;
    const size_t ws_give = (cut & 2) && ws_bytes ? ws_bytes / 2 : ws_bytes;
    const int a_cache = arena_new(cache_give + 16), a_ws = arena_new(ws_give + 16);
    arenas_fill((uint8_t[]){0x00, 0x3C, 0xFF, 0x41}[u8(r) & 3]);
    resolve(ops, 5 + ENC_N);
    mark_outputs(ops, 5 + ENC_N);
    if (a_cache < 0 || a_ws < 0) return;
    for (size_t b = 0; b < cache_give; b++) arenas[a_cache].mark[b] = 1; /* the forward writes the cache */
    uint8_t *cache = (cut & 4) ? NULL : arenas[a_cache].mem + GUARD;
    /* the _ws entry (SAVE_MIN's training forward writes its temporaries there; the stack's forward
       takes the workspace always) */
    const bool with_ws = (cut & 32) != 0 || stack;
    if (with_ws)
        for (size_t b = 0; b < ws_give; b++) arenas[a_ws].mark[b] = 1;
    uint8_t *ws = (cut & 64) ? NULL : arenas[a_ws].mem + GUARD;
    fg_encoder_layer_params P, PS[4];
    memset(&P, 0, sizeof P);
    for (int i = 0; i < ENC_N; i++)
        if (!ops[5 + i].absent) *enc_slot(&P, i) = ops[5 + i].t;
    for (int i = 0; i < 4; i++) PS[i] = P; /* the stack's layers share the parameters */
    const fg_tensor *X = ops[0].null_ptr ? NULL : &ops[0].t;
    const fg_tensor *len = ops[1].absent ? NULL : &ops[1].t, *sin = ops[2].absent ? NULL : &ops[2].t;
    const fg_tensor *Y = &ops[3].t, *sout = ops[4].absent ? NULL : &ops[4].t;
    arenas_snapshot();
    plant_stale_error();
    redirect_fds();
    if (stack)
        s = fg_encoder_forward(ctx, desc_null ? NULL : &d, layers, (cut & 8) ? NULL : &run, X, len,
                               (cut & 16) ? NULL : PS, Y, cache, cache_give, ws, ws_give);
    else if (with_ws)
        s = fg_encoder_layer_forward_ws(ctx, desc_null ? NULL : &d, (cut & 8) ? NULL : &run, X, len, sin,
                                        (cut & 16) ? NULL : &P, Y, sout, cache, cache_give, ws, ws_give);
    else
        s = fg_encoder_layer_forward(ctx, desc_null ? NULL : &d, (cut & 8) ? NULL : &run, X, len, sin,
                                     (cut & 16) ? NULL : &P, Y, sout, cache, cache_give);
    check_status(stack ? "encoder_forward" : "encoder_layer_forward", s);
    arenas_check(stack ? "encoder_forward" : "encoder_layer_forward", s == FG_OK);
    if (s != FG_OK || !run.train || !cache) return;
    /* the backward: dy (y's memory, an input now), dscores_out, dx, dscores_in, the gradients */
    operand g[4 + ENC_N];
    memset(g, 0, sizeof g);
    const int n0 = n_arenas;
    enc_operand(r, &g[0], 3, x_shape, dt, false);
    enc_operand(r, &g[1], 4, s_shape, dt, false);
    enc_operand(r, &g[2], 3, x_shape, dt, true);
    enc_operand(r, &g[3], 4, s_shape, dt, true);
    const uint8_t gopt = u8(r), gp0 = u8(r), gp1 = u8(r), gp2 = u8(r);
    const uint32_t gpresent = gp0 | (uint32_t)gp1 << 8 | (uint32_t)gp2 << 16;
    g[1].absent = !(gopt & 1), g[2].absent = !(gopt & 2), g[3].absent = !(gopt & 4);
    for (int i = 0; i < ENC_N; i++) {
        const int sh = enc_shape[i], rank = enc_rank[sh];
        enc_operand(r, &g[4 + i], rank, pshapes[sh], dt, true);
        g[4 + i].absent = !(gpresent >> i & 1);
    }
    for (int i = 0; i < 4 + ENC_N; i++)
        if (g[i].absent) g[i].t.rank = 0, g[i].arena = -1;
    place(g, 4 + ENC_N);
    if (any_big(g, 4 + ENC_N)) return;
    for (int i = n0; i < n_arenas; i++) { /* the new buffers: poisoned, nothing marked yet */
        memset(arenas[i].mem, 0xA5, GUARD);
        memset(arenas[i].mem + GUARD, 0x3C, arenas[i].body);
        memset(arenas[i].mem + GUARD + arenas[i].body, 0x5A, GUARD);
        memset(arenas[i].mark, 0, arenas[i].body + 1);
    }
    resolve(g, 4 + ENC_N);
    for (int i = 0; i < n0; i++) memset(arenas[i].mark, 0, arenas[i].body + 1); /* the forward's buffers: inputs now */
    mark_outputs(g, 4 + ENC_N);
    for (size_t b = 0; b < ws_give; b++) arenas[a_ws].mark[b] = 1; /* scratch */
    fg_encoder_layer_params G, GS[4];
    memset(&G, 0, sizeof G);
    memset(GS, 0, sizeof GS);
    for (int i = 0; i < ENC_N; i++)
        if (!g[4 + i].absent) *enc_slot(&G, i) = g[4 + i].t;
    GS[0] = G;
    arenas_snapshot();
    plant_stale_error();
    redirect_fds();
    if (stack)
        s = fg_encoder_backward(ctx, &d, layers, &run, &g[0].t, X, len, PS, cache, cache_give,
                                g[2].absent ? NULL : &g[2].t, (gopt & 8) ? NULL : GS, gopt >> 7,
                                arenas[a_ws].mem + GUARD, ws_give);
    else
        s = fg_encoder_layer_backward(ctx, &d, &run, &g[0].t, g[1].absent ? NULL : &g[1].t, X, len, sin, &P, cache,
                                      cache_give, g[2].absent ? NULL : &g[2].t, g[3].absent ? NULL : &g[3].t,
                                      (gopt & 8) ? NULL : &G, gopt >> 7, arenas[a_ws].mem + GUARD, ws_give);
    check_status(stack ? "encoder_backward" : "encoder_layer_backward", s);
    arenas_check(stack ? "encoder_backward" : "encoder_layer_backward", s == FG_OK);
}

/* ------------------------------------------------------------------ the rest */

static void convert_call(rd *r) {
    const fg_dtype st = (fg_dtype)((int)(u8(r) % 9) - 1), dt = (fg_dtype)((int)(u8(r) % 9) - 1);
    const uint8_t nb = u8(r);
    int64_t n = nb < 240 ? nb % 64 : (nb & 1 ? INT64_MAX : -1);
    const uint8_t pb = u8(r);
    const int a_src = arena_new(64 * 8), a_dst = arena_new(64 * 8);
    arenas_fill(0x3C);
    void *src = arenas[a_src].mem + GUARD, *dst = arenas[a_dst].mem + GUARD;
    if (pb & 1) src = NULL;
    if (pb & 2) dst = NULL;
    if ((pb & 12) == 4 && src) dst = (char *)src + (pb >> 4) * 2; /* overlapping */
    if ((pb & 12) == 8 && src) src = (char *)src + 1;             /* misaligned */
    size_t ds = fg_dtype_size(dt);
    if (dst == arenas[a_dst].mem + GUARD && ds && n > 0 && n <= 64)
        memset(arenas[a_dst].mark, 1, (size_t)n * ds);
    else if (dst && ds && n > 0 && n <= 64 && dst != arenas[a_dst].mem + GUARD) {
        size_t off = (size_t)((uint8_t *)dst - (arenas[a_src].mem + GUARD));
        for (size_t b = 0; b < (size_t)n * ds && off + b < arenas[a_src].body; b++) arenas[a_src].mark[off + b] = 1;
    }
    if (n > 64) return; /* a valid n past the buffers would be the caller's bug */
    arenas_snapshot();
    plant_stale_error();
    redirect_fds();
    fg_status s = fg_convert(src, st, dst, dt, n);
    check_status("convert", s);
    arenas_check("convert", s == FG_OK);
}

static void context_call(rd *r) {
    const uint8_t kind = u8(r) % 6;
    fg_context_desc d;
    memset(&d, 0, sizeof d);
    d.backend = (fg_backend)((int)(u8(r) % 4) - 1);
    d.device = (int)(u8(r) % 4) - 1;
    d.stream = u8(r) & 1 ? (void *)dummy_mem : NULL;
    d.allow_tf32 = (int)(u8(r) % 4) - 1;
    const uint8_t tb = u8(r);
    d.num_threads = tb < 200 ? tb % 3 : tb < 250 ? (int)tb * 8 : (tb & 1 ? INT32_MAX : -1);
    fg_context *ctx = pick_context(u8(r));
    fg_status s = FG_OK;
    plant_stale_error();
    redirect_fds();
    switch (kind) {
    case 0: {
        fg_context *c = NULL;
        s = fg_context_create((tb & 1) ? &d : NULL, (tb & 2) ? NULL : &c);
        check_status("context_create", s);
        if (s == FG_OK && !c) finding("context_create: FG_OK but no context");
        if (s != FG_OK && c) finding("context_create: refused but *out set");
        if (s == FG_OK && d.num_threads > 1024 && (tb & 1)) finding("context_create accepted %d threads", d.num_threads);
        if (s == FG_OK && d.stream && d.backend == FG_BACKEND_CPU && (tb & 1))
            finding("context_create: a CPU context accepted a stream");
        redirect_fds();
        fg_context_destroy(c);
        check_quiet("context_destroy");
        return;
    }
    case 1: s = fg_context_set_stream(ctx, d.stream); check_status("context_set_stream", s); return;
    case 2: s = fg_context_check(ctx); check_status("context_check", s); return;
    case 3: {
        static uint8_t ws[4096] __attribute__((aligned(256)));
        const uint8_t wb = u8(r);
        void *p = wb & 1 ? NULL : (wb & 2 ? ws + 8 : ws);
        size_t bytes = wb & 4 ? 0 : wb & 8 ? ((size_t)1 << 40) : sizeof ws;
        if (p && bytes > sizeof ws) bytes = sizeof ws;
        s = fg_context_set_workspace(ctx, p, bytes);
        check_status("context_set_workspace", s);
        redirect_fds();
        s = fg_context_set_workspace(ctx, NULL, 0); /* back to its own */
        check_status("context_set_workspace(NULL)", s);
        return;
    }
    case 4: {
        const char *k = fg_context_last_kernels(ctx);
        if (!k) finding("context_last_kernels returned NULL");
        check_quiet("context_last_kernels");
        return;
    }
    default: {
        fg_backend be = d.backend;
        (void)fg_backend_available(be);
        check_quiet("backend_available");
        return;
    }
    }
}

static void misc_call(rd *r) {
    const uint8_t kind = u8(r) % 6;
    const uint8_t a = u8(r), b = u8(r);
    fg_status s;
    redirect_fds();
    switch (kind) {
    case 0: {
        int64_t shape[FG_MAX_RANK] = {2, 3, 4, 5, 6, 7, 8, 9};
        fg_tensor t = fg_tensor_make(dummy_mem, (fg_dtype)(a % 8), (int32_t)(b % 16) - 4, (a & 0x80) ? NULL : shape);
        if (t.rank < 0 || t.rank > FG_MAX_RANK) finding("tensor_make gave rank %d", t.rank);
        check_quiet("tensor_make");
        return;
    }
    case 1: {
        fg_op_info info;
        plant_stale_error();
        redirect_fds();
        s = fg_op_describe((fg_op)((int)a - 2), (b & 1) ? NULL : &info);
        check_status("op_describe", s);
        return;
    }
    case 2: {
        static const char *const names[6] = {"FG_BF16", "FG_MAX_RANK", "nope", "", "FG_PLAN_ACT_SLOPE", "FG_OK"};
        int64_t v;
        plant_stale_error();
        redirect_fds();
        s = fg_abi_constant((a & 8) ? NULL : names[a % 6], (b & 1) ? NULL : &v);
        check_status("abi_constant", s);
        return;
    }
    case 3: {
        static const char *const types[5] = {"fg_plan_desc", "fg_tensor", "nope", "fg_logp_options", ""};
        static const char *const fields[4] = {"options", "data", "nope", "stride"};
        size_t v;
        plant_stale_error();
        redirect_fds();
        s = fg_abi_layout((a & 8) ? NULL : types[a % 5], (b & 2) ? NULL : fields[b % 4], (b & 1) ? NULL : &v);
        check_status("abi_layout", s);
        return;
    }
    case 4: {
        const char *n1 = fg_status_string((fg_status)((int)a - 3));
        const char *n2 = fg_dtype_name((fg_dtype)((int)b - 3));
        if (!n1 || !n2) finding("a name is NULL");
        /* every status and dtype by name, and a few past the ends (a switch the compiler turns
           into a table gives the fuzzer no edge per value to find them by) */
        for (int c = -2; c <= FG_ERR_INTERNAL + 2; c++) {
            const char *name = fg_status_string((fg_status)c);
            if (!name || !name[0]) finding("fg_status_string(%d) is empty", c);
        }
        for (int t = -2; t <= FG_I64 + 2; t++) {
            const char *name = fg_dtype_name((fg_dtype)t);
            if (!name || !name[0]) finding("fg_dtype_name(%d) is empty", t);
        }
        (void)fg_dtype_size((fg_dtype)((int)b - 3));
        (void)fg_version();
        float f = (float)scalar(r);
        (void)fg_f16_to_f32(fg_f32_to_f16(f));
        (void)fg_bf16_to_f32(fg_f32_to_bf16(f));
        check_quiet("helpers");
        return;
    }
    default: {
        fg_plan_info info;
        size_t bytes;
        plant_stale_error();
        redirect_fds();
        s = (a & 1) ? fg_plan_info_get(NULL, &info) : fg_plan_workspace_size(NULL, &bytes);
        check_status("plan NULL", s);
        redirect_fds();
        fg_plan_destroy(NULL);
        fg_context_destroy(NULL);
        check_quiet("destroy NULL");
        plant_stale_error();
        redirect_fds();
        s = (b & 1) ? fg_plan_run(NULL, NULL, NULL, 0) : fg_plan_can_implement(NULL, NULL);
        check_status("plan NULL run", s);
        return;
    }
    }
}

/* ------------------------------------------------------------------ entry */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    saved_out = dup(1);
    saved_err = dup(2);
    __sanitizer_set_report_fd((void *)(intptr_t)saved_err);
    FILE *f = tmpfile();
    capture_fd = dup(fileno(f));
    const int threads[3] = {1, 2, 0};
    for (int i = 0; i < 3; i++) {
        fg_context_desc d;
        memset(&d, 0, sizeof d);
        d.num_threads = threads[i];
        if (fg_context_create(&d, &contexts[i]) != FG_OK) {
            fprintf(stderr, "fuzz: no CPU context: %s\n", fg_last_error());
            abort();
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd r = {data, size};
    const uint8_t h = u8(&r);
    (void)h;
    for (int i = 0; i < 8; i++) pool[i] = pool_value(u8(&r));
    if (ftruncate(capture_fd, 0) != 0) abort();
    for (int c = 0; c < MAX_CALLS && r.n > 0; c++) {
        const uint8_t kb = u8(&r), kind = kb % 8;
        if (kb >= 248) { /* the encoder layer: bytes no older seed uses as a call's kind */
            encoder_call(&r);
            restore_fds();
            arenas_free();
            continue;
        }
        switch (kind) {
        case 0: case 1: op_call(&r, true); break;
        case 2: case 3: op_call(&r, false); break;
        case 4: adamw_call(&r); break;
        case 5: convert_call(&r); break;
        case 6: context_call(&r); break;
        default: misc_call(&r); break;
        }
        restore_fds();
        arenas_free();
    }
    /* the host flag a bad target raised is reported once and cleared */
    for (int i = 0; i < 3; i++) {
        redirect_fds();
        fg_status s = fg_context_check(contexts[i]);
        check_status("context_check", s);
        restore_fds();
    }
    return 0;
}

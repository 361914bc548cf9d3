/*
 * test_errors.c — the error contract as a table: every op of the op table (through the plan
 * API, which the one-call functions are) and the other entries, against each class of bad
 * input, with the status each returns. Every refusal is checked to leave a message and to
 * write nothing; the table is docs/errors.md, which this test regenerates and compares
 * (FG_WRITE_ERRORS_MD=1 rewrites the file instead).
 */
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>

#ifndef FG_SOURCE_DIR
#define FG_SOURCE_DIR "."
#endif

/* ------------------------------------------------------------------ valid operands per op */

enum { D_N, D_K, D_M, D_B, D_ONE, D_SUMS };
static int64_t dims[6] = {3, 4, 5, 2, 1, 9};

#define NK 2, {D_N, D_K}
#define MK 2, {D_M, D_K}
#define NM 2, {D_N, D_M}
#define V_N 1, {D_N}
#define V_M 1, {D_M}
#define V_K 1, {D_K}
#define SUMS 1, {D_SUMS} /* BatchNorm's f64 sums [2K + 1] */
#define BNK 3, {D_B, D_N, D_K}
#define BK 2, {D_B, D_K}
#define HEADS 4, {D_N, D_B, D_K, D_M}  /* attention's q, k, v, o: [B=N, H=2, L=4, hd=5] */
#define SCORES 4, {D_N, D_B, D_K, D_K}
#define ROWS 3, {D_N, D_B, D_K}
/* shapes given as rank + dims per operand (an op's order, as in fastgrad.h's fg_op) */
typedef struct shape_t {
    int rank;
    int d[4];
} shape_t;

typedef struct op_case {
    fg_op op;
    int n;
    shape_t s[FG_MAX_OPERANDS];
    unsigned absent;
} op_case;

static const op_case cases[] = {
    {FG_OP_LINEAR_FORWARD, 4, {{NK}, {MK}, {V_M}, {NM}}, 0},
    {FG_OP_LINEAR_BACKWARD_INPUT, 3, {{NM}, {MK}, {NK}}, 0},
    {FG_OP_LINEAR_BACKWARD_WEIGHT, 3, {{NM}, {NK}, {MK}}, 0},
    {FG_OP_LINEAR_BACKWARD_BIAS, 2, {{NM}, {V_M}}, 0},
    {FG_OP_MATMUL_FORWARD, 3, {{3, {D_B, D_N, D_K}}, {3, {D_B, D_K, D_M}}, {3, {D_B, D_N, D_M}}}, 0},
    {FG_OP_MATMUL_BACKWARD_INPUT, 3, {{3, {D_B, D_N, D_M}}, {3, {D_B, D_K, D_M}}, {3, {D_B, D_N, D_K}}}, 0},
    {FG_OP_MATMUL_BACKWARD_OTHER, 3, {{3, {D_B, D_N, D_K}}, {3, {D_B, D_N, D_M}}, {3, {D_B, D_K, D_M}}}, 0},
    {FG_OP_OUTER_FORWARD, 3, {{V_N}, {V_M}, {NM}}, 0},
    {FG_OP_OUTER_BACKWARD_INPUT, 3, {{NM}, {V_M}, {V_N}}, 0},
    {FG_OP_OUTER_BACKWARD_OTHER, 3, {{NM}, {V_N}, {V_M}}, 0},
    {FG_OP_UNARY_FORWARD, 2, {{NK}, {NK}}, 0},
    {FG_OP_UNARY_BACKWARD, 3, {{NK}, {NK}, {NK}}, 0},
    {FG_OP_BINARY_FORWARD, 4, {{NK}, {NK}, {NK}, {NK}}, 0},
    {FG_OP_BINARY_BACKWARD, 7, {{NK}, {NK}, {NK}, {NK}, {NK}, {NK}, {NK}}, 0},
    {FG_OP_LINEAR_LOGP_FORWARD, 7, {{NK}, {MK}, {V_M}, {V_N}, {V_N}, {V_N}, {V_N}}, 0},
    {FG_OP_LINEAR_LOGP_BACKWARD, 12,
     {{V_N}, {V_N}, {V_N}, {NK}, {MK}, {V_M}, {V_N}, {V_N}, {V_N}, {NK}, {MK}, {V_M}}, 0},
    {FG_OP_LINEAR_CROSS_ENTROPY, 10, {{NK}, {MK}, {V_M}, {V_N}, {V_N}, {1, {D_ONE}}, {V_N}, {NK}, {MK}, {V_M}}, 0},
    {FG_OP_LINEAR_LOGP_SHARD_FORWARD, 7, {{NK}, {MK}, {V_M}, {V_N}, {V_N}, {V_N}, {V_N}}, 0},
    {FG_OP_LINEAR_LOGP_SHARD_COMBINE, 7, {{V_N}, {2, {D_B, D_N}}, {V_N}, {2, {D_B, D_N}}, {V_N}, {V_N}, {V_N}}, 0},
    {FG_OP_LINEAR_ACT_FORWARD, 5, {{NK}, {MK}, {V_M}, {NM}, {NM}}, 0},
    {FG_OP_LINEAR_ACT_BACKWARD, 8, {{NM}, {NM}, {NK}, {MK}, {V_M}, {NK}, {MK}, {V_M}}, 0},
    {FG_OP_NORM_FORWARD, 8, {{NK}, {NK}, {V_K}, {V_K}, {NK}, {NK}, {V_N}, {V_N}}, 0},
    {FG_OP_NORM_BACKWARD, 10, {{NK}, {NK}, {NK}, {V_K}, {V_N}, {V_N}, {NK}, {NK}, {V_K}, {V_K}}, 0},
    {FG_OP_BATCH_NORM_FORWARD, 10, {{NK}, {NK}, {V_K}, {V_K}, {V_K}, {V_K}, {NK}, {NK}, {V_K}, {V_K}}, 0},
    {FG_OP_BATCH_NORM_BACKWARD, 9, {{NK}, {NK}, {V_K}, {V_K}, {V_K}, {NK}, {NK}, {V_K}, {V_K}}, 0},
    {FG_OP_BATCH_NORM_STATS, 4, {{NK}, {NK}, {NK}, {SUMS}}, 0},
    {FG_OP_BATCH_NORM_APPLY, 9, {{NK}, {SUMS}, {V_K}, {V_K}, {V_K}, {V_K}, {NK}, {V_K}, {V_K}}, 0},
    {FG_OP_BATCH_NORM_BACKWARD_STATS, 5, {{NK}, {NK}, {V_K}, {V_K}, {SUMS}}, 0},
    {FG_OP_BATCH_NORM_BACKWARD_APPLY, 10, {{NK}, {NK}, {V_K}, {V_K}, {V_K}, {SUMS}, {NK}, {NK}, {V_K}, {V_K}}, 0},
    {FG_OP_DROPOUT_FORWARD, 2, {{NK}, {NK}}, 0},
    {FG_OP_DROPOUT_BACKWARD, 2, {{NK}, {NK}}, 0},
    {FG_OP_REVIN_STATS, 3, {{BNK}, {BK}, {BK}}, 0},
    {FG_OP_REVIN_FORWARD, 6, {{BNK}, {V_K}, {V_K}, {BK}, {BK}, {BNK}}, 0},
    {FG_OP_REVIN_BACKWARD, 9, {{BNK}, {BNK}, {V_K}, {V_K}, {BK}, {BK}, {BNK}, {V_K}, {V_K}}, 0},
    {FG_OP_PATCH_FORWARD, 2, {{NK}, {3, {D_N, D_B, D_B}}}, 0},    /* patches of 2, stride 2 */
    {FG_OP_PATCH_BACKWARD, 2, {{3, {D_N, D_B, D_B}}, {NK}}, 0},
    {FG_OP_REGRESSION_LOSS, 4, {{NK}, {NK}, {1, {D_ONE}}, {NK}}, 0},
    {FG_OP_SERIES_WINDOWS, 3, {{NK}, {V_N}, {3, {D_N, D_B, D_K}}}, 0}, /* windows of 2 of a [3, 4] series */
    {FG_OP_ATTENTION_FORWARD, 8, {{HEADS}, {HEADS}, {HEADS}, {V_N}, {SCORES}, {HEADS}, {ROWS}, {SCORES}}, 0},
    {FG_OP_ATTENTION_BACKWARD, 13,
     {{HEADS}, {SCORES}, {HEADS}, {HEADS}, {HEADS}, {V_N}, {SCORES}, {HEADS}, {ROWS}, {HEADS}, {HEADS}, {HEADS},
      {SCORES}}, 0},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* ------------------------------------------------------------------ one problem */

#define SLACK 16
typedef struct problem {
    fg_op_info info;
    fg_plan_desc desc;
    fg_tensor ops[FG_MAX_OPERANDS];
    void *mem[FG_MAX_OPERANDS];
    size_t bytes[FG_MAX_OPERANDS];
    fg_elementwise_options ew;
    fg_linear_act_options act;
    fg_logp_options logp;
    fg_norm_options norm;
    fg_batch_norm_options bn;
    fg_dropout_options drop;
    fg_revin_options revin;
    fg_patch_options patch;
    fg_regression_loss_options loss;
    fg_attention_options attn;
} problem;

static void problem_init(problem *p, const op_case *c, int64_t n_rows) {
    memset(p, 0, sizeof *p);
    TH_OK(fg_op_describe(c->op, &p->info));
    p->desc.op = c->op;
    dims[D_N] = n_rows;
    for (int i = 0; i < c->n; i++) {
        fg_tensor *t = &p->ops[i];
        const bool target = (strcmp(p->info.operands[i].name, "target") == 0 && strcmp(p->info.family, "linear_logp") == 0) ||
                            strcmp(p->info.operands[i].name, "starts") == 0 || /* integer indices, 0: valid */
                            strcmp(p->info.operands[i].name, "lengths") == 0;
        t->dtype = target ? FG_I32 : strcmp(p->info.operands[i].name, "sums") == 0 ? FG_F64 : FG_F32;
        t->rank = c->s[i].rank;
        int64_t n = 1;
        for (int d = 0; d < t->rank; d++) n *= (t->shape[d] = dims[c->s[i].d[d]]);
        p->bytes[i] = ((size_t)(n + SLACK) * 8 + 63) & ~(size_t)63; /* aligned_alloc: a multiple of 64 */
        p->mem[i] = aligned_alloc(64, p->bytes[i]);
        for (size_t k = 0; k < p->bytes[i] / 4; k++) ((float *)p->mem[i])[k] = target ? 0.0f : 0.5f;
        t->data = p->mem[i];
        p->desc.operands[i] = *t;
        p->desc.operands[i].data = NULL;
    }
    dims[D_N] = 3;
    if (p->info.options_type && strcmp(p->info.options_type, "fg_elementwise_options") == 0) {
        p->ew.scalars[0] = 0.5;
        p->desc.options = &p->ew, p->desc.options_size = sizeof p->ew;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_linear_act_options") == 0) {
        p->act.act = FG_ACT_GELU_TANH;
        p->desc.options = &p->act, p->desc.options_size = sizeof p->act;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_norm_options") == 0) {
        p->desc.options = &p->norm, p->desc.options_size = sizeof p->norm;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_batch_norm_options") == 0) {
        p->desc.options = &p->bn, p->desc.options_size = sizeof p->bn;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_dropout_options") == 0) {
        p->desc.options = &p->drop, p->desc.options_size = sizeof p->drop;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_revin_options") == 0) {
        p->desc.options = &p->revin, p->desc.options_size = sizeof p->revin;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_patch_options") == 0) {
        p->patch.patch_len = 2, p->patch.stride = 2;
        p->desc.options = &p->patch, p->desc.options_size = sizeof p->patch;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_regression_loss_options") == 0) {
        p->desc.options = &p->loss, p->desc.options_size = sizeof p->loss;
    } else if (p->info.options_type && strcmp(p->info.options_type, "fg_attention_options") == 0) {
        p->desc.options = &p->attn, p->desc.options_size = sizeof p->attn;
    } else if (p->info.options_type) {
        p->desc.options = &p->logp, p->desc.options_size = sizeof p->logp;
    }
}

static void problem_free(problem *p) {
    for (int i = 0; i < FG_MAX_OPERANDS; i++) free(p->mem[i]);
}

/* Plan + run; on a refusal checks the message and that no buffer changed. */
static fg_status problem_run(problem *p, const char *label, size_t ws_less) {
    void *snap[FG_MAX_OPERANDS];
    for (int i = 0; i < p->info.n_operands; i++) {
        snap[i] = malloc(p->bytes[i]);
        memcpy(snap[i], p->mem[i], p->bytes[i]);
    }
    fg_context *ctx = th_context(FG_BACKEND_CPU, false);
    fg_plan *plan = NULL;
    fg_status s = fg_plan_create(ctx, &p->desc, &plan);
    void *ws = NULL;
    if (s == FG_OK) {
        size_t bytes = 0;
        TH_OK(fg_plan_workspace_size(plan, &bytes));
        bytes = bytes > ws_less ? bytes - ws_less : 0;
        ws = bytes ? malloc(bytes) : NULL;
        s = fg_plan_run(plan, p->ops, ws, bytes);
    }
    if (s != FG_OK) {
        TH_CHECK(fg_last_error()[0] != 0, "%s %s: %s without a message", p->info.name, label, fg_status_string(s));
        for (int i = 0; i < p->info.n_operands; i++)
            TH_CHECK(memcmp(snap[i], p->mem[i], p->bytes[i]) == 0, "%s %s: refused (%s) but wrote %s",
                     p->info.name, label, fg_status_string(s), p->info.operands[i].name);
    } else {
        TH_CHECK(fg_last_error()[0] == 0, "%s %s: FG_OK with a message '%s'", p->info.name, label, fg_last_error());
    }
    for (int i = 0; i < p->info.n_operands; i++) free(snap[i]);
    free(ws);
    fg_plan_destroy(plan);
    fg_context_destroy(ctx);
    return s;
}

static int first_input(const problem *p) {
    for (int i = 0; i < p->info.n_operands; i++)
        if (p->info.operands[i].role == FG_ROLE_INPUT && !p->info.operands[i].optional) return i;
    return 0;
}

static int first_output(const problem *p) {
    for (int i = 0; i < p->info.n_operands; i++)
        if (p->info.operands[i].role == FG_ROLE_OUTPUT) return i;
    return -1;
}

static int first_optional(const problem *p) {
    for (int i = 0; i < p->info.n_operands; i++)
        if (p->info.operands[i].optional) return i;
    return -1;
}

/* ------------------------------------------------------------------ the classes */

typedef struct bad_class {
    const char *name;   /* column header */
    const char *what;   /* the legend */
    /* mutates the valid problem; returns false when the class does not apply */
    bool (*apply)(problem *p, size_t *ws_less);
} bad_class;

static void set_both(problem *p, int i, void (*f)(fg_tensor *)) {
    f(&p->ops[i]);
    f(&p->desc.operands[i]);
}

static void f_dtype(fg_tensor *t) { t->dtype = (fg_dtype)99; }
static void f_rank(fg_tensor *t) { t->rank = 9; }
static void f_neg(fg_tensor *t) { t->shape[0] = -1; }
static void f_last(fg_tensor *t) { t->shape[t->rank - 1] += 1; }
static void f_huge(fg_tensor *t) { t->shape[0] = (int64_t)1 << 62; }
static void f_huge_empty(fg_tensor *t) {
    t->shape[0] = 0;
    t->shape[t->rank - 1] = (int64_t)1 << 62;
}
static void f_negstride(fg_tensor *t) {
    t->stride[t->rank - 1] = -1;
}
static void f_zero_stride(fg_tensor *t) { /* contiguous, but the first dim broadcast */
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) t->stride[d] = s, s *= t->shape[d];
    t->stride[0] = 0;
}
static void f_f64(fg_tensor *t) { t->dtype = FG_F64; }

static bool c_null(problem *p, size_t *w) { (void)w; p->ops[first_input(p)].data = NULL; return true; }
static bool c_dtype(problem *p, size_t *w) { (void)w; set_both(p, first_input(p), f_dtype); return true; }
static bool c_mixed(problem *p, size_t *w) {
    (void)w;
    int i = first_input(p);
    if (p->ops[i].dtype != FG_F32) return false;
    set_both(p, i, f_f64);
    return true;
}
static bool c_rank(problem *p, size_t *w) { (void)w; set_both(p, first_input(p), f_rank); return true; }
static bool c_unused(problem *p, size_t *w) {
    (void)w;
    int i = first_optional(p);
    if (i < 0) return false;
    set_both(p, i, f_rank);
    return true;
}
static bool c_neg(problem *p, size_t *w) { (void)w; set_both(p, first_input(p), f_neg); return true; }
static bool c_mismatch(problem *p, size_t *w) { (void)w; set_both(p, first_input(p), f_last); return true; }
static bool c_huge(problem *p, size_t *w) { (void)w; set_both(p, first_input(p), f_huge); return true; }
static bool c_huge_empty(problem *p, size_t *w) {
    (void)w;
    int i = first_input(p);
    if (p->ops[i].rank < 2) return false;
    set_both(p, i, f_huge_empty);
    return true;
}
static bool c_negstride(problem *p, size_t *w) { (void)w; set_both(p, first_input(p), f_negstride); return true; }
static bool c_zero_out(problem *p, size_t *w) {
    (void)w;
    int i = first_output(p);
    if (i < 0 || p->ops[i].rank < 2 || p->ops[i].shape[0] < 2) return false; /* rank 1: all-zero is contiguous */
    set_both(p, i, f_zero_stride);
    return true;
}
static bool c_zero_in(problem *p, size_t *w) {
    (void)w;
    int i = first_input(p);
    if (p->ops[i].rank < 2 || p->ops[i].shape[0] < 2) return false;
    set_both(p, i, f_zero_stride);
    return true;
}
static bool c_misaligned(problem *p, size_t *w) {
    (void)w;
    int i = first_input(p);
    p->ops[i].data = (char *)p->ops[i].data + 1;
    return true;
}
static bool c_overlap(problem *p, size_t *w) {
    (void)w;
    int i = first_input(p), o = first_output(p);
    if (o < 0 || p->ops[o].dtype != p->ops[i].dtype) return false;
    p->ops[o].data = (char *)p->ops[i].data + fg_dtype_size(p->ops[i].dtype); /* one element on */
    p->desc.alignment = (uint32_t)fg_dtype_size(p->ops[i].dtype);
    return true;
}
static bool c_workspace(problem *p, size_t *w) {
    fg_context *ctx = th_context(FG_BACKEND_CPU, false);
    fg_plan *plan = NULL;
    size_t bytes = 0;
    if (fg_plan_create(ctx, &p->desc, &plan) == FG_OK) TH_OK(fg_plan_workspace_size(plan, &bytes));
    fg_plan_destroy(plan);
    fg_context_destroy(ctx);
    *w = 1;
    return bytes > 0;
}
static bool c_accumulate(problem *p, size_t *w) { (void)w; p->desc.accumulate = 2; return true; }
static bool c_flags(problem *p, size_t *w) { (void)w; p->desc.flags = 0x100; return true; }
static bool c_option(problem *p, size_t *w) {
    (void)w;
    if (!p->info.options_type) return false;
    p->ew.kind = 99;
    p->act.act = (fg_activation)99;
    p->logp.temperature = -1;
    p->norm.eps = p->bn.eps = p->revin.eps = -1;
    p->drop.p = -1;
    p->patch.patch_len = -1;
    p->loss.kind = (fg_loss_kind)99;
    p->attn.scale = NAN;
    return true;
}
static bool c_empty(problem *p, size_t *w) { (void)p, (void)w; return true; } /* built with N = 0 */

static const bad_class classes[] = {
    {"NULL data", "the first required input's data is NULL", c_null},
    {"dtype", "the first required input's dtype is not an fg_dtype (99)", c_dtype},
    {"mixed", "the first required input is f64, the others f32", c_mixed},
    {"rank", "the first required input has rank 9 (> FG_MAX_RANK)", c_rank},
    {"opt. rank", "the first optional operand (given) has rank 9, whether the op reads it or not", c_unused},
    {"dim < 0", "the first required input's shape[0] is -1", c_neg},
    {"shape", "the first required input's last dim is one larger than the others imply", c_mismatch},
    {"2^62 dim", "the first required input's shape[0] is 2^62 (its bytes overflow int64)", c_huge},
    {"2^62 × 0", "the first required input is empty (shape[0] = 0) with a last dim of 2^62", c_huge_empty},
    {"stride < 0", "the first required input's innermost stride is -1", c_negstride},
    {"0-stride out", "the first output's dim 0 (size > 1) has stride 0: it overlaps itself", c_zero_out},
    {"0-stride in", "the first required input's dim 0 (size > 1) has stride 0: a broadcast view", c_zero_in},
    {"misaligned", "the first required input's data is one byte past an element boundary", c_misaligned},
    {"overlap", "the first output starts one element into the first required input", c_overlap},
    {"workspace", "fg_plan_run is given one byte less workspace than the plan asks", c_workspace},
    {"accumulate", "fg_plan_desc.accumulate is 2", c_accumulate},
    {"flags", "fg_plan_desc.flags has an unknown bit (0x100)", c_flags},
    {"option", "the family's option is out of range (kind / act 99, temperature -1, eps -1, dropout p -1, patch_len -1, "
     "attention scale NaN)",
     c_option},
    {"N = 0", "the leading (batch) dim N is 0: an empty problem (sums over it are written as zeros)", c_empty},
};
#define N_CLASSES ((int)(sizeof classes / sizeof classes[0]))

static const char *short_status(fg_status s) {
    const char *n = fg_status_string(s);
    return strncmp(n, "FG_ERR_", 7) == 0 ? n + 7 : n + 3;
}

/* ------------------------------------------------------------------ other entries */

typedef struct other_row {
    const char *entry, *input;
    fg_status status;
} other_row;

static int others(other_row *rows) {
    int n = 0;
    fg_context *ctx = th_context(FG_BACKEND_CPU, false), *c2 = NULL;
    fg_context_desc d;
#define ROW(e, i, call) rows[n].entry = e, rows[n].input = i, rows[n++].status = (call)
    memset(&d, 0, sizeof d);
    d.num_threads = 1025;
    ROW("fg_context_create", "num_threads > 1024", fg_context_create(&d, &c2));
    d.num_threads = -1;
    ROW("fg_context_create", "num_threads < 0", fg_context_create(&d, &c2));
    memset(&d, 0, sizeof d);
    d.stream = &d;
    ROW("fg_context_create", "a stream for a CPU context", fg_context_create(&d, &c2));
    memset(&d, 0, sizeof d);
    d.backend = (fg_backend)7;
    ROW("fg_context_create", "backend 7", fg_context_create(&d, &c2));
    ROW("fg_context_create", "out NULL", fg_context_create(NULL, NULL));
    ROW("fg_context_set_stream", "a stream for a CPU context", fg_context_set_stream(ctx, &d));
    ROW("fg_context_set_workspace", "ptr NULL, bytes 64", fg_context_set_workspace(ctx, NULL, 64));
    static float ws[64] __attribute__((aligned(256)));
    ROW("fg_context_set_workspace", "ptr not 256-byte aligned", fg_context_set_workspace(ctx, ws + 1, 64));
    ROW("fg_context_check", "ctx NULL", fg_context_check(NULL));
    size_t held;
    ROW("fg_context_workspace_size", "ctx NULL", fg_context_workspace_size(NULL, &held));
    ROW("fg_context_workspace_size", "bytes NULL", fg_context_workspace_size(ctx, NULL));
    float src[8] = {0}, dst[8];
    ROW("fg_convert", "n < 0", fg_convert(src, FG_F32, dst, FG_F32, -1));
    ROW("fg_convert", "n = 2^62 (bytes overflow)", fg_convert(src, FG_F32, dst, FG_F32, (int64_t)1 << 62));
    ROW("fg_convert", "src and dst overlap", fg_convert(src, FG_F32, src + 1, FG_F32, 4));
    ROW("fg_convert", "src misaligned", fg_convert((char *)src + 1, FG_F32, dst, FG_F32, 4));
    ROW("fg_convert", "an integer dtype", fg_convert(src, FG_I32, dst, FG_F32, 4));
    int64_t shape[1] = {4};
    fg_tensor p = fg_tensor_make(src, FG_F32, 1, shape), g = p, m = fg_tensor_make(dst, FG_F32, 1, shape), v = m;
    float more[8], more2[8];
    g.data = more;
    v.data = more2;
    fg_adamw_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 0.0};
    fg_tensor bad = p;
    bad.rank = 100;
    ROW("fg_adamw_step", "params[0].rank = 100", fg_adamw_step(ctx, &hp, 1, &bad, &g, &m, &v, NULL));
    ROW("fg_adamw_step", "params NULL", fg_adamw_step(ctx, &hp, 1, NULL, &g, &m, &v, NULL));
    ROW("fg_adamw_step", "grads has another size", fg_adamw_step(ctx, &hp, 1, &p, &bad, &m, &v, NULL));
    ROW("fg_adamw_step", "exp_avg is exp_avg_sq", fg_adamw_step(ctx, &hp, 1, &p, &g, &m, &m, NULL));
    hp.beta1 = 1.0;
    ROW("fg_adamw_step", "beta1 = 1", fg_adamw_step(ctx, &hp, 1, &p, &g, &m, &v, NULL));
    hp.beta1 = 0.9, hp.step = 0;
    ROW("fg_adamw_step", "step = 0", fg_adamw_step(ctx, &hp, 1, &p, &g, &m, &v, NULL));
    hp.step = 1;
    ROW("fg_adamw_step", "count < 0", fg_adamw_step(ctx, &hp, -1, &p, &g, &m, &v, NULL));
    fg_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    fg_plan *plan = NULL;
    ROW("fg_plan_create", "op 0 (not an op)", fg_plan_create(ctx, &pd, &plan));
    pd.op = FG_OP_LINEAR_FORWARD;
    ROW("fg_plan_create", "ctx NULL", fg_plan_create(NULL, &pd, &plan));
    pd.alignment = 3;
    ROW("fg_plan_create", "alignment 3 (not a power of two)", fg_plan_create(ctx, &pd, &plan));
    ROW("fg_plan_run", "plan NULL", fg_plan_run(NULL, NULL, NULL, 0));
    fg_op_info info;
    ROW("fg_op_describe", "op 0", fg_op_describe(FG_OP_NONE, &info));
    int64_t value;
    ROW("fg_abi_constant", "an unknown name", fg_abi_constant("FG_NOPE", &value));
#undef ROW
    for (int i = 0; i < n; i++)
        TH_CHECK(rows[i].status != FG_OK, "%s with %s was accepted", rows[i].entry, rows[i].input);
    fg_context_destroy(ctx);
    return n;
}

/* ------------------------------------------------------------------ the document */

static char *append(char *doc, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char line[4096];
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    doc = realloc(doc, *len + (size_t)n + 1);
    memcpy(doc + *len, line, (size_t)n + 1);
    *len += (size_t)n;
    return doc;
}

int main(void) {
    th_init("errors");
    size_t len = 0;
    char *doc = NULL;
    doc = append(doc, &len,
                 "# Errors: what each entry refuses, and with which status\n\n"
                 "Generated by `tests/test_errors.c` (ctest `errors` fails when this file differs from what it "
                 "prints; `FG_WRITE_ERRORS_MD=1 build/tests/test_errors` rewrites it). Each op of the op table, "
                 "valid f32 operands (N=3, K=4, M=5, B=2; every optional operand given), one bad input at a time, "
                 "through `fg_plan_create` + `fg_plan_run` — the one-call functions are the same path. Every "
                 "refusal below was checked to leave a message in `fg_last_error()` and to write no operand; "
                 "every `OK` to leave `fg_last_error()` empty. `–`: the class does not apply.\n\n"
                 "The rules behind the table:\n\n"
                 "- Every operand given passes one descriptor check, whether or not the op's configuration "
                 "reads it: a known dtype, rank in [0, %d], shapes ≥ 0, strides ≥ 0, and every product of dims "
                 "and strides within int64 — a zero dim counts as 1 there, so an empty view with a huge dim is "
                 "refused too (`OVERFLOW`). An optional operand of rank 0 (NULL in a one-call function) is "
                 "absent and never looked at. Given operands also pass the pointer checks (data non-NULL "
                 "unless empty, aligned to its elements and to the plan's declared alignment).\n"
                 "- An output must not overlap itself (a zero stride in a dim of size > 1, or a stride inside "
                 "the span of its smaller dims: `ALIAS`), nor another operand (`ALIAS`; the elementwise ops "
                 "allow an output that is exactly an input when nothing broadcasts, and two outputs of one "
                 "dtype may share a buffer when no element is in both and their strides, taken together, "
                 "each pass the reach of the smaller ones, as attention's dq, dk, dv interleaved in one "
                 "[B, L, 3, H, hd] buffer, or dq, dk in pieces beside dv).\n"
                 "- Operands of the products (Linear, Matmul, Outer) take no zero stride along a matrix dim of "
                 "size > 1 (`UNSUPPORTED`: materialize the broadcast); the elementwise ops take broadcast "
                 "inputs; the drivers (log-prob, linear + act) need contiguous operands.\n"
                 "- An empty problem returns at once; an output that is a sum over an empty set (dw, db, da, "
                 "dx of an empty batch or K = 0, an elementwise gradient summed over an empty broadcast) is "
                 "written as zeros (left as it is with `accumulate`). The log-prob family refuses V = 0 or "
                 "D = 0 with rows (`SHAPE`).\n"
                 "- A plan must not outlive its context: `fg_context_destroy` frees what every plan made on it "
                 "uses; running such a plan is undefined (not detected).\n\n",
                 FG_MAX_RANK);
    doc = append(doc, &len, "| op |");
    for (int c = 0; c < N_CLASSES; c++) doc = append(doc, &len, " %s |", classes[c].name);
    doc = append(doc, &len, "\n|---|");
    for (int c = 0; c < N_CLASSES; c++) doc = append(doc, &len, "---|");
    doc = append(doc, &len, "\n");
    for (int k = 0; k < N_CASES; k++) {
        problem p;
        problem_init(&p, &cases[k], 3);
        fg_status base = problem_run(&p, "valid", 0);
        TH_CHECK(base == FG_OK, "%s: the valid problem gives %s: %s", p.info.name, fg_status_string(base),
                 fg_last_error());
        doc = append(doc, &len, "| %s |", p.info.name);
        problem_free(&p);
        for (int c = 0; c < N_CLASSES; c++) {
            problem q;
            problem_init(&q, &cases[k], classes[c].apply == c_empty ? 0 : 3);
            size_t ws_less = 0;
            if (!classes[c].apply(&q, &ws_less)) {
                doc = append(doc, &len, " – |");
                problem_free(&q);
                continue;
            }
            fg_status s = problem_run(&q, classes[c].name, ws_less);
            doc = append(doc, &len, " %s |", short_status(s));
            problem_free(&q);
        }
        doc = append(doc, &len, "\n");
    }
    doc = append(doc, &len, "\nThe classes:\n\n");
    for (int c = 0; c < N_CLASSES; c++) doc = append(doc, &len, "- **%s**: %s\n", classes[c].name, classes[c].what);
    other_row rows[64];
    const int n_rows = others(rows);
    doc = append(doc, &len, "\n## The other entries\n\n| entry | bad input | status |\n|---|---|---|\n");
    for (int i = 0; i < n_rows; i++)
        doc = append(doc, &len, "| `%s` | %s | %s |\n", rows[i].entry, rows[i].input, short_status(rows[i].status));

    const char *path = FG_SOURCE_DIR "/docs/errors.md";
    if (getenv("FG_WRITE_ERRORS_MD")) {
        FILE *f = fopen(path, "w");
        TH_CHECK(f != NULL, "cannot write %s", path);
        if (f) fputs(doc, f), fclose(f);
    } else {
        FILE *f = fopen(path, "r");
        char *have = calloc(len + 2, 1);
        size_t got = f ? fread(have, 1, len + 1, f) : 0;
        if (f) fclose(f);
        TH_CHECK(got == len && memcmp(have, doc, len) == 0,
                 "%s differs from the table this test prints (FG_WRITE_ERRORS_MD=1 rewrites it)", path);
        if (getenv("FG_TEST_VERBOSE")) fputs(doc, stdout);
        free(have);
    }
    free(doc);
    return th_finish("errors");
}

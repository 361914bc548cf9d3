/*
 * internal.h — what the library's own files share and the public header hides:
 * the context, error reporting, tensor checks, and the GEMM primitive every op lowers
 * to (a backend-neutral description that src/cpu/gemm.c and src/cuda/gemm.cu run).
 */
#ifndef FG_INTERNAL_H
#define FG_INTERNAL_H

#include "fastgrad.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ errors */

/* Records the message for fg_last_error() and returns status. */
fg_status fg_fail(fg_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fg_clear_error(void);

#define FG_TRY(expr)                                                                         \
    do {                                                                                     \
        fg_status fg_try_status_ = (expr);                                                   \
        if (fg_try_status_ != FG_OK) return fg_try_status_;                                  \
    } while (0)

/* ------------------------------------------------------------------ context */

struct fg_cuda_state; /* src/cuda/context.cu */

struct fg_context {
    fg_backend backend;
    int device;
    int arch;          /* compute capability x10, 0 on CPU */
    int sm_count;
    int allow_tf32;
    int num_threads;
    void *workspace;   /* host memory (CPU) or device memory (CUDA) */
    size_t workspace_bytes;
    bool workspace_external;
    bool cuda_present; /* CPU context in a CUDA build: a device exists, so check pointers */
    unsigned long long host_flag[2]; /* CPU kernels' bad-value flag: code, first index */
    struct fg_cuda_state *cuda;
    const struct fg_backend_ops *be; /* the backend's table (src/cpu/backend.c, src/cuda/backend.cu) */
    char launched[512];              /* fg_context_last_kernels: names joined by " ; " */
    int launched_len, launched_last; /* its length; where its last name starts */
};

/* Bad values kernels find (fg_context_check reports them). The flag is two words:
 * [0] the first code raised, [1] the bitwise NOT of the smallest index (so an atomic
 * max keeps the smallest; 0 = none). */
#define FG_FLAG_BAD_TARGET 1ull
fg_status fg_flag_error(const unsigned long long flag[2]);
void fg_host_flag_raise(fg_context *ctx, unsigned long long code, int64_t index);

/* Makes sure the context's own workspace holds `bytes`; returns it. */
fg_status fg_context_workspace(fg_context *ctx, size_t bytes, void **ptr);

/* ------------------------------------------------------------------ tensors */

/* Contiguous strides when the caller left them all zero. */
void fg_tensor_strides(const fg_tensor *t, int64_t stride[FG_MAX_RANK]);
/* Structural checks of a descriptor: dtype known, rank in [lo, hi], shapes >= 0,
 * strides >= 0, element count and byte extent fit int64. `what` names it in errors. */
fg_status fg_check_desc(const char *op, const char *what, const fg_tensor *t, int rank_lo,
                        int rank_hi);
/* The same for a tensor of any dtype, integer ones included. */
fg_status fg_check_any_desc(const char *op, const char *what, const fg_tensor *t, int rank_lo,
                            int rank_hi);
static inline bool fg_is_float(fg_dtype t) {
    return t == FG_F32 || t == FG_F16 || t == FG_BF16 || t == FG_F64;
}
/* Element count (fg_check_desc has ruled out overflow). */
int64_t fg_numel(const fg_tensor *t);
/* Bytes from data to one past the last element (0 when empty). */
int64_t fg_extent_bytes(const fg_tensor *t);
/* Pointer checks at run time: non-NULL data (unless empty), element alignment, memory
 * reachable from the context's device. */
fg_status fg_check_data(const fg_context *ctx, const char *op, const char *what,
                        const fg_tensor *t);
/* fg_check_data for many tensors in one call (AdamW's hundreds): the device allocations already
 * found to be on the context's device are remembered in `seen`, and a tensor starting inside one
 * asks the driver nothing more. Zero-initialize `seen` per call; it holds nothing between calls. */
#define FG_SEEN_RANGES 64
typedef struct fg_seen_ranges {
    uintptr_t lo[FG_SEEN_RANGES], hi[FG_SEEN_RANGES];
    int n, next;
} fg_seen_ranges;
fg_status fg_check_data_seen(const fg_context *ctx, const char *op, const char *what, const fg_tensor *t,
                             fg_seen_ranges *seen);
/* An output must not overlap another operand; another output of its shape and strides may share
 * its buffer when no element is in both (q, k, v gradients interleaved in one [B, L, 3, H, hd]
 * buffer: exact, by the offset between them). */
fg_status fg_check_no_overlap(const char *op, const char *out_name, const fg_tensor *out,
                              const char *other_name, const fg_tensor *other, bool other_is_output);
/* Whether t's strides are row-major contiguous (or left all zero). */
bool fg_is_contiguous(const fg_tensor *t);
/* FG_ERR_UNSUPPORTED "op: what must be contiguous" unless it is. */
fg_status fg_check_contiguous(const char *op, const char *what, const fg_tensor *t);
/* The operands of a contiguous linear layer: x [..., K] (rank in [x_rank_lo, FG_MAX_RANK] or
 * exactly 2 when x_rank_lo is 2), w [M, K] of x's dtype, b [M] or absent (rank 0). Gives
 * N (the product of x's leading dims), K, M. */
fg_status fg_check_linear_operands(const char *op, const char *xname, const fg_tensor *x, int x_rank_hi,
                                   const fg_tensor *w, const fg_tensor *b, int64_t *N, int64_t *K, int64_t *M);
/* Formats a shape as "[2, 3, 4]" into buf. */
const char *fg_shape_str(const fg_tensor *t, char *buf, size_t len);

/* Leading dims [0, upto) of t collapse into one index with a single stride?
 * Gives that stride (0 when the product is 1). */
bool fg_collapse_dims(const fg_tensor *t, int upto, int64_t *count, int64_t *stride);

/* ------------------------------------------------------------------ GEMM primitive */

#define FG_OPERAND_ONES (-1) /* a vector of ones, in place of an operand */

/* A matrix (or batch of matrices) inside an operand. Strides in elements; one of
 * rs, cs must be 1 unless that dim has size 1. */
typedef struct fg_mat {
    int operand;      /* index into the op's operands, or FG_OPERAND_ONES */
    int64_t offset;   /* elements from the operand's data */
    int64_t rs, cs;   /* row and column stride */
    int64_t bs;       /* batch stride; 0 = the same matrix for every batch */
    void *data;       /* resolved at run time */
} fg_mat;

/* What a product's epilogue and operand load may do besides the bias and the activation: keep
 * the pre-activation (or its slope) in aux, form the a operand from dy and a saved pre (a =
 * dy ⊙ act′(pre), written to a's memory) with the column sums of the formed a. cuBLASLt has the
 * bias and relu only; the CUDA backend's own sm_90a GEMM has all of it. A backend that cannot
 * does nothing and says so (fg_kernel_info.act_fused / formed), planning and running alike. */
typedef struct fg_gemm_epilogue {
    bool has_aux;        /* aux [m, n] (c's layout) receives pre, or act′(pre) when slope */
    bool slope;
    void *aux;           /* resolved at run time */
    int form;            /* a = dy ⊙ act′(pre) with this act (0: a is given); GIVEN_SLOPE: pre is the slope */
    const void *dy, *pre;/* [m, k] row-major, resolved at run time */
    bool col_sums;       /* the formed a's column sums (f32, [k]) into sums: written (first) or added */
    bool sums_first;
    float *sums;
    /* A dropout after the activation (NULL: none; only with act or aux): c's element at
       address e, and aux's at the same place of aux (c's layout), is multiplied by the mask of
       flat index (e − drop_origin) / element size, c row-major and contiguous from drop_origin
       (linear + activation's y). A backend that applies it says so (fg_kernel_info.drop_fused);
       one that does not leaves it to the caller, who then applies it to c and aux itself. */
    const struct fg_dropout_gen *drop;
    const void *drop_origin;
} fg_gemm_epilogue;

/* c = alpha · a·b + beta · c (+ bias[i·bias_rs + j·bias_cs] on element (i, j)), for each batch.
 * a: m×k, b: k×n, c: m×n. c.bs == 0 with batch > 1: the products are summed over the
 * batch into c (deterministically, in batch order, low precision carried in f32). */
typedef struct fg_gemm {
    fg_dtype dtype;
    int64_t batch, m, n, k;
    fg_mat a, b, c;
    double alpha, beta;
    int bias_operand;  /* -1: no bias */
    int64_t bias_rs, bias_cs; /* a bias along columns has bias_rs == 0 */
    void *bias;        /* resolved at run time */
    bool allow_tf32;
    bool c_f32;        /* c is f32 whatever the inputs' dtype (f16/bf16 products summed in f32) */
    /* An activation the backend may apply in the product's epilogue, c = act(a·b + bias)
       (fg_activation; 0: none). Optional: info->act_fused says whether it did; when it did
       not, c holds the plain product. */
    int act;
    uint32_t align;    /* bytes the operands' data are declared aligned to (0: 256); running, the
                          pointers' own alignment lowers it where they have less */
    fg_gemm_epilogue epi;
} fg_gemm;

typedef struct fg_kernel_info {
    char name[256];
    size_t workspace_bytes;
    bool deterministic;
    fg_dtype accumulator; /* type the sums are carried in */
    bool act_fused;       /* fg_gemm.act (and epi.aux) was applied in the epilogue */
    bool formed;          /* epi.form was done in the operand load */
    bool drop_fused;      /* epi.drop was applied too (with act_fused) */
} fg_kernel_info;

/* A GEMM descriptor of resolved matrices: alpha 1, a bias along the columns when has_bias
 * (at bias, NULL while planning). */
fg_gemm fg_gemm_plain(fg_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k, fg_mat a, fg_mat b, fg_mat c,
                      double beta, bool has_bias, const void *bias, bool allow_tf32, bool c_f32, uint32_t align);
/* Appends a GEMM's kernel name (the label plans and launch records use) to name[len], once. */
void fg_gemm_name_append(char *name, size_t len, const fg_kernel_info *info);
/* Appends `piece` to the " ; "-separated list name[len] unless it is one of its pieces. */
void fg_name_append(char *name, size_t len, const char *piece);
/* Each piece of a " ; "-separated list appended as fg_name_append does (at most FG_NAME_LIST_MAX bytes read). */
enum { FG_NAME_LIST_MAX = 256 };
void fg_names_append(char *name, size_t len, const char *list);
/* One GEMM of a driver's walk: planning (run = false) raises *need to what it asks of the
 * workspace and appends its kernel name (once) to name[len]; running, it uses ws. */
fg_status fg_gemm_walk(fg_context *ctx, const fg_gemm *g, bool run, void *ws, size_t ws_bytes, size_t *need,
                       char *name, size_t len);

/* Plans (run = false: fills info, touches no data) or runs one GEMM on ctx's backend.
 * Normalizes orientation, collapses batch sums, splits dims past int32, then calls
 * the backend. */
fg_status fg_gemm_execute(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                          size_t ws_bytes, bool run);

/* The CPU backend's: the same contract on a problem fg_gemm_execute has normalized (c
 * row-major or a vector, every dim and leading dim within int32). */
fg_status fg_cpu_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws,
                      size_t ws_bytes, bool run);

/* ------------------------------------------------------------------ elementwise primitive */

/* Elementwise ops have at most this many operands (the CUDA kernels unroll over it). */
#define FG_EW_MAX_OPERANDS 8

/* An elementwise problem over a full shape (the output's, or dy's for a backward),
 * dims coalesced. Each operand (by its index in the op) maps onto the full shape by
 * strides, 0 where it is broadcast. An output with a zero stride in a dim of size > 1
 * is `reduced`: its elements are sums over those dims (deterministic order). */
typedef struct fg_ew {
    fg_dtype dtype;
    fg_op op;          /* FG_OP_UNARY_* or FG_OP_BINARY_* */
    int kind;          /* fg_unary / fg_binary */
    double s[4];
    bool accumulate;
    bool broadcast;    /* some operand does not cover the full shape one to one */
    int rank;
    int64_t shape[FG_MAX_RANK];
    int64_t numel;
    int n_operands;
    unsigned present;  /* bit i: operand i is given */
    unsigned outputs;  /* bit i: operand i is written */
    unsigned reduced;  /* bit i: output i is a sum over broadcast dims */
    int64_t stride[FG_EW_MAX_OPERANDS][FG_MAX_RANK];
    uint32_t align;    /* bytes the operands' data are declared aligned to (0: 256) */
    void *data[FG_EW_MAX_OPERANDS]; /* resolved at run time */
} fg_ew;

/* Plans (run = false) or runs an elementwise problem on ctx's backend. */
fg_status fg_cpu_elementwise(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws,
                             size_t ws_bytes, bool run);

/* ------------------------------------------------------------------ AdamW */

/* One tensor of a multi-tensor AdamW step, validated and flattened. */
typedef struct fg_adamw_item {
    void *p;
    const void *g;
    void *m, *v;     /* the moments: m_dtype */
    float *master;   /* NULL: update p directly */
    int64_t n;
} fg_adamw_item;

typedef struct fg_adamw_run {
    fg_dtype p_dtype, g_dtype, m_dtype; /* m_dtype: f32, or p_dtype (moments stored rounded) */
    /* scalars formed in f64 and rounded once: 1 − β in f32 from a rounded β would be
       off by up to 1.3e-5 relative (β2 = 0.999) */
    float beta2, one_minus_beta1, one_minus_beta2, eps, decay, grad_scale;
    float step_size;       /* lr / (1 − β1^step)   */
    float bc2_sqrt;        /* sqrt(1 − β2^step)    */
    int count;
    const fg_adamw_item *items;
} fg_adamw_run;

fg_status fg_cpu_adamw(fg_context *ctx, const fg_adamw_run *r);

/* ------------------------------------------------------------------ linear log-prob steps */

/* The steps the linear log-prob driver (src/ops/linear_logp.c) runs between its GEMMs;
 * each backend implements all of them (src/cpu/linear_logp.c, src/cuda/linear_logp.cu).
 * A tile holds the logits z of rows [r0, r0 + rows) and columns [v0, v0 + cols) in
 * dtype, row stride ld. Per-row f32 buffers are indexed by the global row.
 *   STATS   merges the tile into the running row state (first: starts it):
 *           state[5·r] = {m, s = Σ e^(L−m), L[target], a = Σ e^(L−m)·L, u = Σ L}
 *   FORWARD state → logp, lse, entropy (rows [r0, r0+rows))
 *   CE      state → loss_rows (weighted row loss), lse, and rc (see GRAD), scaled by *scale
 *   COEF    upstream gradients + lse + entropy → rc
 *   COUNT   *scale = grad_scale / max(1, rows not ignored) (mean) or grad_scale
 *   GRAD    the tile becomes dz: with p = e^(L−lse),
 *           dL = A·[j == target] + B·p + C·p·(L − lse + H) + E,  rc[6·r] = {A, B, C, E, lse, H}
 *           (all four zero: an ignored row, dz = 0), dz = dL·dL/dz; db_acc (acc type,
 *           global column index) gets the column sums of dz before its rounding to the tile's
 *           dtype (first: written, else added)
 *   REDUCE  *loss_out = Σ loss_rows (fixed order) · (mean ? 1/count : 1)
 *   CAST    dst[i] = src[i] (+ dst[i] when accumulate), acc type → dst_dtype, n elements
 *   COMBINE the vocabulary shards' parts [nparts, N] → logp, lse, entropy (rows [r0, r0+rows)):
 *           lse = logsumexp_r lse_r, logp = Σ tlogit − lse, entropy = lse − Σ_r e^(lse_r − lse)·
 *           (lse_r − H_r), r in order; tlogit_parts has t_parts rows (1: already summed)
 * Targets outside [0, V) that are not ignored make the row NaN and raise
 * FG_FLAG_BAD_TARGET with the row (FORWARD, CE, COEF).
 * Vocabulary shards: the tile's column j is the global class vstart + v0 + j; V is the whole
 * vocabulary (the targets' range), vslice the shard's width. shard FORWARD writes the parts
 * into lse (lse_r), logp (L[target] when vstart <= target < vstart + vslice, else 0) and
 * entropy (H_r); unsharded, vstart = 0 and vslice = V. */
typedef enum fg_logp_step {
    FG_LOGP_STATS, FG_LOGP_FORWARD, FG_LOGP_CE, FG_LOGP_COEF, FG_LOGP_COUNT, FG_LOGP_GRAD,
    FG_LOGP_REDUCE, FG_LOGP_CAST, FG_LOGP_COMBINE
} fg_logp_step;

typedef struct fg_logp_call {
    fg_logp_step step;
    /* tile */
    fg_dtype dtype;
    void *z;
    int64_t ld, r0, rows, v0, cols;
    bool first;
    /* problem */
    int64_t N, V;
    const void *target;
    fg_dtype target_dtype;
    double inv_temp, softcap;    /* softcap 0: none */
    bool use_ignore;
    int64_t ignore_index;
    /* Row vectors, the state and rc are of type `acc` (f64 for f64 problems, else f32);
       NULL: absent. */
    fg_dtype acc;
    void *state, *rc, *db_acc;
    void *scratch;               /* GRAD: column partial sums */
    size_t scratch_bytes;
    void *logp, *lse, *entropy, *loss_rows, *loss_out, *scale;
    const void *lse_in, *entropy_in, *dlogp, *dentropy, *dlse, *row_weight;
    double label_smoothing, z_loss, grad_scale;
    int reduction;
    /* CAST: acc → dst_dtype */
    const void *src;
    void *dst;
    fg_dtype dst_dtype;
    int64_t n;
    bool accumulate;
    /* vocabulary shards */
    int64_t vstart, vslice;
    bool shard;
    /* COMBINE */
    const void *lse_parts, *tlogit_parts, *entropy_parts;
    int64_t nparts, t_parts;
} fg_logp_call;

fg_status fg_cpu_logp(fg_context *ctx, const fg_logp_call *c);

/* ------------------------------------------------------------------ linear + activation steps */

/* The slope form (FG_PLAN_ACT_SLOPE): the backward's steps run with act = FG_ACT_GIVEN_SLOPE,
 * whose "pre" is the saved slope s and whose slope is s itself (g = dy ⊙ s); the forward's
 * steps keep the real act and set slope_out (pre receives act′(pre) instead of pre). */
#define FG_ACT_GIVEN_SLOPE 7

/* The two elementwise steps of the linear + activation driver (src/ops/linear_act.c),
 * over an [rows, cols] row-major block (row strides in elements):
 *   FORWARD  y = act(pre)                      (y may be pre: in place); slope_out: then
 *            pre = act′(pre) in place
 *   GRAD     g = dy ⊙ act′(pre); db_acc (acc type, [cols]) gets the column sums of g
 *            (first: written, else added) when db_acc is not NULL
 *   CAST     dst = Σ_{p < parts} src[p·cols + j] (+ dst when accumulate), acc type → dtype,
 *            cols elements; parts 0 means 1 (the sum runs in p order)
 * and, on CUDA where fg_cuda_act_tile_fits (short K, f16/bf16), the product fused in:
 *   TILE_FORWARD  pre = x·wᵀ + b rounded to the dtype (written when pre is not NULL),
 *                 y = act(pre); x [rows, k], w [cols, k], b [cols] or NULL
 *   TILE_GRAD     pre recomputed the same way (the same bits), then as GRAD (g may be NULL)
 * and, where fg_cuda_act_bwd_tile_fits (also M ≤ 256; the cheap-slope activations), the
 * whole backward in one kernel:
 *   TILE_BACKWARD from dy and pre (kept; NULL: recomputed as TILE_GRAD does), g kept on chip:
 *                 dx = g·w (+ dx when accumulate), db_acc as GRAD, and dw = gᵀ·x as `parts`
 *                 f32 [cols, k] partials at the start of scratch (CAST sums them; scratch:
 *                 fg_cuda_act_bwd_tile_scratch bytes, which also gives parts)
 *   TILE_BACKWARD90 the same with pre kept, by an sm_90a kernel (wgmma: the products run beside
 *                 the activation math, so every activation takes it) where
 *                 fg_cuda_act_bwd90_fits (a 9.0 device; K, M multiples of 8; pointers 16-byte
 *                 aligned; rows ≥ 1)
 * and, where fg_cuda_act_gemm_fits (an sm_90a build on a 9.0 device, f16/bf16, row strides
 * multiples of 8, a full wave of 128 × 256 tiles), the three products as one own GEMM
 * (pointers 16-byte aligned, outputs written, never added to):
 *   GEMM_FORWARD  as TILE_FORWARD, any K (slope_out: pre receives act′(pre))
 *   GEMM_INPUT    dx[rows, cols] = g[rows, k]·w[k, cols]      (rows N, k M, cols K)
 *   GEMM_WEIGHT   dw[rows, cols] = g[k, rows]ᵀ·x[k, cols]     (rows M, k N, cols K)
 *   GEMM_INPUT_FORM  GEMM_INPUT with g = dy ⊙ act′(pre) formed inside (written to g, which may
 *                 be pre; act not none) and db's f32 sums into db_acc (or none); scratch:
 *                 fg_cuda_act_form_scratch */
typedef enum fg_act_step {
    FG_ACT_STEP_FORWARD,
    FG_ACT_STEP_GRAD,
    FG_ACT_STEP_CAST,
    FG_ACT_STEP_TILE_FORWARD,
    FG_ACT_STEP_TILE_GRAD,
    FG_ACT_STEP_TILE_BACKWARD,
    FG_ACT_STEP_TILE_BACKWARD90,
    FG_ACT_STEP_GEMM_FORWARD,
    FG_ACT_STEP_GEMM_INPUT,
    FG_ACT_STEP_GEMM_WEIGHT,
    FG_ACT_STEP_GEMM_INPUT_FORM
} fg_act_step;

/* A dropout as the kernels apply it (src/core/rng.h): element i is kept when its uniform
 * u >= threshold·2^-24 (that is, u >= p), and multiplied by m = keep ? scale : 0. */
typedef struct fg_dropout_gen {
    bool on;                 /* p > 0 */
    uint32_t threshold;      /* ceil(p·2^24) */
    float scale;             /* 1/(1 − p) rounded to f32; 0 when p = 1 */
    double scale64;          /* the same in f64 (f64 problems) */
    uint64_t seed, offset;
} fg_dropout_gen;

typedef struct fg_act_call {
    fg_act_step step;
    int act;                 /* fg_activation */
    fg_dtype dtype, acc;
    int64_t rows, cols;
    const void *pre, *dy;
    void *y, *g;
    int64_t ld_pre, ld_dy, ld_y, ld_g;
    void *db_acc;
    bool first;
    void *scratch;           /* GRAD: column partial sums */
    size_t scratch_bytes;
    const void *src;
    void *dst;
    int64_t parts;
    bool accumulate;
    const void *x, *w, *b;   /* TILE steps: the product's operands, k their inner size */
    int64_t k;
    void *dx, *dw;           /* TILE_BACKWARD's and GEMM_INPUT's / GEMM_WEIGHT's outputs */
    bool slope_out;          /* FORWARD, GEMM_FORWARD: pre receives act′(pre) (slope form) */
    fg_dropout_gen drop;     /* FORWARD, GRAD, TILE_FORWARD, TILE_GRAD where the path's pass_drop says so (drop.on): y = m ⊙ act(pre)
                                (act(pre) rounded to the dtype, then the multiply; slope_out: the saved
                                slope masked the same way), g = (m ⊙ dy) ⊙ act′(pre)
                                (m ⊙ dy rounded to the dtype): the bits of the dropout step before or after
                                the pass; element (i, j)'s mask at flat index i·cols + j */
} fg_act_call;

/* The activations and their derivatives in f64: the CPU backend's math (src/cpu/linear_act.c). */
double fg_act_value(int act, double x);
double fg_act_slope(int act, double x);

fg_status fg_cpu_act(fg_context *ctx, const fg_act_call *c);

/* ------------------------------------------------------------------ linear + activation paths */

/* A linear + activation problem as its plan sees it (no pointers): what the backend's plan
 * hook picks the kernels from. */
typedef struct fg_act_problem {
    bool forward;
    int kind;                /* the activation (fg_activation) */
    int act;                 /* the steps' act: GIVEN_SLOPE for the slope form's backward */
    bool slope;              /* the saved operand holds act′(pre) */
    bool keep;               /* the saved operand is given */
    bool consume;            /* backward: g may go into the saved operand's memory */
    bool accumulate;
    bool has_bias;
    bool want_dx, want_dw, want_db;
    bool tf32;               /* FG_PLAN_ALLOW_TF32 */
    fg_dtype dtype;
    int64_t B, N, K, M;      /* N: rows per batch */
    uint32_t align;          /* bytes every operand's data is declared aligned to */
} fg_act_problem;

/* The kernels a backend chose for it, followed by the walk in src/ops/linear_act.c. */
typedef struct fg_act_path {
    /* forward */
    bool epilogue;           /* one GEMM with the activation (and pre or its slope) in its epilogue */
    fg_act_step fwd;         /* TILE_FORWARD (one kernel), or FORWARD (GEMM, pass) */
    /* backward */
    fg_act_step fused;       /* TILE_BACKWARD90 / TILE_BACKWARD: the whole backward in one kernel;
                                FORWARD: none */
    size_t fused_scratch;    /* its scratch, and the dw partials it leaves */
    int64_t fused_parts;
    bool tile_grad;          /* pre recomputed inside the gradient's tile kernel (TILE_GRAD) */
    bool form;               /* g formed by dx's product (the GEMM's epi.form) */
    size_t grad_scratch;     /* the GRAD / TILE_GRAD step's scratch */
    int64_t dw_parts;        /* dw as this many row-slice products summed in order (0: one) */
    bool pass_drop;          /* the FORWARD and GRAD passes (and TILE_FORWARD, TILE_GRAD) take fg_act_call.drop */
} fg_act_path;

/* "act_grad", "gemm90_dx", ...: the name of a step in plan infos and launch records. */
const char *fg_act_step_name(fg_act_step step);
/* "<step>_<act><<dtype>>" into buf. */
void fg_act_step_label(char *buf, size_t len, fg_act_step step, int act, fg_dtype dtype);
/* A step call's label: the step's, "+dropout" after it when the call applies the dropout. */
void fg_act_call_label(char *buf, size_t len, const fg_act_call *c);

/* ------------------------------------------------------------------ normalization steps */


/* fg_dropout_gen of (p, seed, offset); p in [0, 1] (validated by the front door). */
fg_dropout_gen fg_dropout_make(double p, uint64_t seed, uint64_t offset);

/* The steps of the normalization family (src/ops/norm.c); every backend implements all of
 * them (src/cpu/norm.c, src/cuda/norm.cu). Data are rows × cols blocks of `dtype` with the last
 * dim contiguous and a row stride per operand (ld_*, elements); NULL: absent. Statistics (mean,
 * rstd, stdev) are of type acc (f32; f64 for f64 problems); sums are f64.
 *   ROWS_FORWARD   s = x + dropout(r) (r NULL: s = x; written when s is not NULL), per row
 *                  mean / rstd of s (kind), y = x̂·w + b; mean, rstd written when not NULL
 *   ROWS_BACKWARD  dsum = rstd·(g − mean(g) − x̂·mean(g·x̂)) + ds (RMS: no mean(g) term),
 *                  g = dy·w; dx = dsum, dr = dsum·m; dw = Σ dy·x̂, db = Σ dy over the rows
 *                  (per-block partials in scratch, finished in order into dw_dtype / db_dtype);
 *                  mean / rstd NULL: recomputed from x as ROWS_FORWARD computes them
 *   BN_STATS       s = x + dropout(r) (written when s is not NULL) → sums = {Σ s, Σ s², N}
 *                  per channel (per-block partials around each block's first row, finished
 *                  in f64 in block order)
 *   BN_APPLY       mean, var from sums (eval: the running stats) → mean / rstd (written when
 *                  not NULL), running stats updated (training, when given), y = (x − mean)·
 *                  rstd·w + b (w, b, running stats of w_dtype / stat_dtype)
 *   BN_BACKWARD_STATS  sums = {Σ dy, Σ dy·x̂, N} (x̂ from mean, rstd)
 *   BN_BACKWARD_APPLY  dx = w·rstd·(dy − Σdy/N − x̂·Σdy·x̂/N) (eval: w·rstd·dy), dr = dx·m;
 *                  dw = Σ dy·x̂, db = Σ dy from sums (accumulate adds)
 *   BN_FORWARD     BN_STATS then BN_APPLY as one step (the one-device training forward; the
 *                  apply normalizes s when s is written): fg_norm_bn_parts gives the two steps,
 *                  and a backend may run the whole as one kernel instead (CUDA: a cooperative
 *                  grid that keeps the rows on chip between the sums and the apply)
 *   BN_BACKWARD    BN_BACKWARD_STATS then BN_BACKWARD_APPLY as one step, the same way
 *   DROPOUT        y = x·m (accumulate adds into y)
 *   REVIN_STATS    x: inst instances of steps × cols rows → mean (or the last step), stdev
 *                  [inst, cols] (in rstd)
 *   REVIN_APPLY    y = (x − mean)/stdev·w + b, or (denorm) (x − b)/(w + eps²)·stdev + mean
 *   REVIN_BACKWARD dx, and dw, db summed over every row (partials in scratch, as ROWS_BACKWARD)
 * The dropout index of element (i, j) is i·cols + j. Planning (run = false) touches no data
 * (the pointers of the operands present then point at a placeholder that is never read, so the
 * plan sees which are given; sums too) and fills `need` (the scratch bytes the step uses) and
 * `name` (the kernels it launches, the labels it records when running, joined by " ; "); it
 * depends only on the problem's sizes, dtypes, which operands are present and `align`, so a
 * run makes the same choices. Running, the step records each kernel it launches
 * (fg_record_kernel) and uses scratch (scratch_bytes >= the planned need). */
typedef enum fg_norm_step {
    FG_NORM_STEP_ROWS_FORWARD,
    FG_NORM_STEP_ROWS_BACKWARD,
    FG_NORM_STEP_BN_STATS,
    FG_NORM_STEP_BN_APPLY,
    FG_NORM_STEP_BN_BACKWARD_STATS,
    FG_NORM_STEP_BN_BACKWARD_APPLY,
    FG_NORM_STEP_DROPOUT,
    FG_NORM_STEP_REVIN_STATS,
    FG_NORM_STEP_REVIN_APPLY,
    FG_NORM_STEP_REVIN_BACKWARD,
    FG_NORM_STEP_BN_FORWARD,
    FG_NORM_STEP_BN_BACKWARD
} fg_norm_step;

typedef struct fg_norm_call {
    fg_norm_step step;
    fg_dtype dtype, acc;
    fg_dtype w_dtype;        /* w and b (BatchNorm: x's dtype or f32) */
    fg_dtype stat_dtype;     /* running_mean / running_var */
    fg_dtype dw_dtype, db_dtype;
    int kind;                /* fg_norm_kind */
    bool eval, denorm, subtract_last, accumulate;
    int64_t rows, cols;      /* RevIN: rows = inst·steps */
    int64_t inst, steps;
    double eps, momentum;
    fg_dropout_gen drop;
    const void *x, *r, *dy, *ds, *w, *b;
    void *y, *s, *dx, *dr, *dw, *db;
    int64_t ld_x, ld_r, ld_y, ld_s, ld_dy, ld_ds, ld_dx, ld_dr;
    void *mean, *rstd;       /* read by the backward steps, written by the forward ones */
    void *running_mean, *running_var;
    double *sums;            /* f64 [2·cols + 1] */
    void *scratch;
    size_t scratch_bytes;
    uint32_t align;          /* bytes every pointer is declared aligned to */
    size_t need;             /* planning: scratch bytes */
    char name[160];          /* planning: kernel labels */
} fg_norm_call;

fg_status fg_cpu_norm(fg_context *ctx, fg_norm_call *c, bool run);
/* A BN_FORWARD / BN_BACKWARD step as the two steps it stands for (src/ops/norm.c: the stats step,
 * then the apply step), planned (need: the larger of the two; name: both) or run through `step`. */
fg_status fg_norm_bn_parts(fg_context *ctx, fg_norm_call *c, bool run,
                           fg_status (*step)(fg_context *ctx, fg_norm_call *c, bool run));

/* ------------------------------------------------------------------ attention */

/* A sequence's bad key-padding length (outside [0, L]): its outputs are NaN. */
#define FG_FLAG_BAD_LENGTH 2ull

/* The kernels of the attention family (src/ops/attention.c): the CPU backend's rows, and on
 * CUDA the whole-sequence kernels (sixteen lanes a head, a lane a key, for L <= 64, hd <= 8; a
 * thread a query row for L <= 64, hd <= 32; a warp a query row up to L = 128), the tensor-core flash kernels (f16 / bf16, hd 32 / 64 / 128, unit-stride
 * rows) and the tiled SIMT kernels (everything else). */
typedef enum fg_attn_kernel {
    FG_ATTN_CPU,
    FG_ATTN_SHORT,
    FG_ATTN_FLASH,
    FG_ATTN_TILED,
    FG_ATTN_SHORT_ROWS,
    FG_ATTN_SHORT_QROW
} fg_attn_kernel;

/* An attention problem as its plan sees it (no pointers): what the backend's plan hook picks
 * the kernel from. */
typedef struct fg_attn_problem {
    bool forward;
    fg_dtype dtype;          /* q, k, v, o, do, dq, dk, dv */
    fg_dtype sdtype;         /* the score operands (dtype or acc) */
    fg_dtype acc;            /* lse, and the sums: f32 (f64 for f64) */
    fg_dtype ldtype;         /* lengths: i32 / i64 */
    int64_t B, H, L, hd;
    int64_t pieces;          /* q and k in P pieces of hd ([B, H, L, P, hd]; 1: [B, H, L, hd]) */
    bool causal, has_lengths, has_scores_in, has_scores_out, has_dscores, dropout;
    bool want_dq, want_dk, want_dv, want_dscores_in;
    bool accumulate;
    bool unit_rows;          /* every [B, H, L, hd] operand has stride 1 along hd and its other
                                strides multiples of 16 bytes */
    uint32_t align;          /* bytes every operand's data is declared aligned to */
} fg_attn_problem;

/* The backend's choice, kept in the plan (fg_lowered.priv). */
typedef struct fg_attn_path {
    fg_attn_kernel kernel;
    int group;               /* SHORT: heads per block | rows a chunk << 16; SHORT_ROWS: heads per
                                block | padded head dim << 16; SHORT_QROW: padded head dim
                                << 16; FLASH: head dim | 1 << 16 for the sm_90a form */
    size_t workspace;        /* bytes of workspace the run needs */
    char name[96];           /* the kernels it launches, as fg_plan_info.kernel and the launch
                                record name them (" ; "-joined) */
} fg_attn_path;

/* An operand of shape [B, H, L, X] (X = hd, or L for the scores), or q, k, dq, dk in pieces
 * [B, H, L, P, hd] (sp: the piece stride; 0 for one piece): data and strides in elements;
 * data NULL: absent. */
typedef struct fg_attn_view {
    void *data;
    int64_t sb, sh, sl, sx, sp;
} fg_attn_view;

/* One run: the problem and the path its plan chose, the resolved options, the operands. */
typedef struct fg_attn_call {
    fg_attn_problem p;
    fg_attn_path path;
    double scale;
    double dropout_p;
    uint32_t keep_min;       /* the dropout keeps an element whose 16 bits are >= keep_min (rng.h) */
    double keep_scale;       /* 1/(1 − p) */
    uint64_t seed, offset;
    const void *lengths;
    fg_attn_view q, k, v, o, scores_in, scores_out; /* forward and backward */
    fg_attn_view d_o, dscores, dq, dk, dv, dscores_in; /* backward */
    void *lse;               /* [B, H, L] contiguous, acc */
    void *ws;
    size_t ws_bytes;
} fg_attn_call;

fg_status fg_cpu_attn_plan(fg_context *ctx, const fg_attn_problem *p, fg_attn_path *path);
fg_status fg_cpu_attn(fg_context *ctx, const fg_attn_call *c);

/* ------------------------------------------------------------------ series steps */

/* The loss reduction's chunk: every backend sums these many elements into one partial. */
#define FG_SERIES_CHUNK 4096

/* The steps of the series family (src/ops/series.c; src/cpu/series.c, src/cuda/series.cu):
 *   PATCH        dst [rows, P, S] (contiguous) from the series src: row r at row_offset(r)
 *                (its leading-dims index through lead_shape / lead_stride), step t at t·t_stride;
 *                dst[r, p, j] = src[r, min(p·stride + j, L − 1)]
 *   UNPATCH      dst (the series view) = the overlap-add of src [rows, P, S]: each step sums the
 *                patches that read it in order of p, then (the last step) the padded positions
 *                in order of p and j; accumulate adds
 *   LOSS         per element ℓ(pred − target) (kind, delta) and its gradient·grad_scale into dpred
 *                (want_dpred; dpred_dtype; accumulate adds); reduction none: ℓ into loss [n],
 *                else each chunk of FG_SERIES_CHUNK elements' sum (acc) into partials[chunk]
 *   LOSS_FINISH  loss[0] = (Σ partials in order, in f64)·out_scale, rounded to acc (NaN for
 *                the mean of nothing)
 *   WINDOWS      dst [rows = B, W, C] (contiguous): dst[b, t, c] = src[(starts[b] + t)·src_rs + c·src_cs]
 *                for starts[b] in [0, T − W]; else the window is NaN and FG_FLAG_BAD_START is
 *                raised with b (starts i32 or i64: starts_dtype)
 * Planning (run = false) touches no data and fills `name` with the label the step records when
 * it runs. */
typedef enum fg_series_step {
    FG_SERIES_PATCH,
    FG_SERIES_UNPATCH,
    FG_SERIES_LOSS,
    FG_SERIES_LOSS_FINISH,
    FG_SERIES_WINDOWS
} fg_series_step;

/* A window start outside [0, T − W] (fg_series_windows): that window is NaN. */
#define FG_FLAG_BAD_START 3ull

typedef struct fg_series_call {
    fg_series_step step;
    fg_dtype dtype, acc;
    bool accumulate;
    /* PATCH / UNPATCH */
    int lead_rank;
    int64_t lead_shape[FG_MAX_RANK], lead_stride[FG_MAX_RANK];
    int64_t rows, t_stride;
    int64_t L, P, S, stride;
    const void *src;
    void *dst;
    /* LOSS / LOSS_FINISH */
    int kind, reduction;     /* fg_loss_kind, fg_reduction */
    double delta, grad_scale, out_scale;
    int64_t n, chunks;
    const void *pred, *target;
    void *loss, *dpred;
    bool want_dpred;
    fg_dtype dpred_dtype;
    void *partials;          /* acc [chunks], in the workspace */
    /* WINDOWS */
    const void *starts;
    fg_dtype starts_dtype;
    int64_t T, W, C, src_rs, src_cs;
    size_t need;             /* planning: workspace bytes */
    char name[96];           /* planning: the kernel label */
} fg_series_call;

/* "patch", "unpatch", "mse", "mae", "huber", "loss_finish": a step's name in kernel labels. */
const char *fg_series_step_name(const fg_series_call *c);
fg_status fg_cpu_series(fg_context *ctx, fg_series_call *c, bool run);

/* ------------------------------------------------------------------ backends */

/* What a backend implements. The front doors (src/ops/) and the plan mechanism reach kernels
 * only through the context's table; each backend picks its kernels inside these functions,
 * the plan-time ones (run = false, act_plan) from shapes, dtypes, the device and the declared
 * alignment. A backend records what it launches (fg_record_kernel). */
typedef struct fg_backend_ops {
    const char *name;
    bool f64_kernels;        /* its own kernels (elementwise steps of the drivers) take f64 */
    fg_status (*gemm)(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws, size_t ws_bytes, bool run);
    fg_status (*elementwise)(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws, size_t ws_bytes,
                             bool run);
    fg_status (*adamw)(fg_context *ctx, const fg_adamw_run *r);
    size_t (*logp_scratch)(int64_t rows, int64_t cols); /* GRAD's scratch for a tile */
    fg_status (*logp)(fg_context *ctx, const fg_logp_call *c);
    fg_status (*act_plan)(fg_context *ctx, const fg_act_problem *p, fg_act_path *path);
    fg_status (*act)(fg_context *ctx, const fg_act_call *c);
    fg_status (*norm)(fg_context *ctx, fg_norm_call *c, bool run); /* plans (run = false) or runs a step */
    fg_status (*attn_plan)(fg_context *ctx, const fg_attn_problem *p, fg_attn_path *path);
    fg_status (*attn)(fg_context *ctx, const fg_attn_call *c); /* runs the plan's path */
    fg_status (*series)(fg_context *ctx, fg_series_call *c, bool run); /* plans (run = false) or runs a step */
} fg_backend_ops;

extern const fg_backend_ops fg_cpu_backend;
#ifdef FG_HAVE_CUDA
extern const fg_backend_ops fg_cuda_backend;
#endif

/* Appends a launched kernel's name to the context's record (fg_context_last_kernels); a name
 * equal to the last one recorded is not repeated. fg_record_reset starts a new op. */
void fg_record_kernel(fg_context *ctx, const char *name);
void fg_record_reset(fg_context *ctx);

/* ------------------------------------------------------------------ the op table */

#define FG_MAX_GEMMS 2
#define FG_OPTIONS_BYTES 256 /* the largest option struct a family may have */
#define FG_PRIVATE_BYTES 256 /* what a family's driver may keep in its plan */

/* An op lowered to GEMM primitives that run in order, or to one elementwise problem, or to
 * its family's own driver. */
typedef struct fg_lowered {
    int count;
    fg_gemm gemm[FG_MAX_GEMMS];
    bool is_elementwise;
    fg_ew ew;
    /* run = false: plan (fill info from the descriptor; ops NULL); run = true: run the plan */
    fg_status (*driver)(fg_context *ctx, const fg_plan_desc *desc, const fg_tensor *ops, void *priv,
                        fg_kernel_info *info, void *ws, size_t ws_bytes, bool run);
    double priv[FG_PRIVATE_BYTES / sizeof(double)]; /* the driver's choices, made when planning */
} fg_lowered;

typedef struct fg_operand_decl {
    const char *name;
    bool output;
    bool optional;
} fg_operand_decl;

/* One op, declared once (in its family's file, next to its lowering): everything else —
 * the plan lookup, operand names in messages, fg_op_describe, the Python binding's enums —
 * is read from it. */
typedef struct fg_op_decl {
    fg_op op;
    const char *name;
    int n_operands;
    fg_operand_decl operands[FG_MAX_OPERANDS];
    uint32_t flags;          /* FG_PLAN_* accepted besides FG_PLAN_ALLOW_TF32 */
    const char *options_type;
    size_t options_size;
    bool inplace_ok;         /* an output may be exactly an input when nothing broadcasts */
    /* Validates a descriptor (everything but data; options never NULL) and lowers it. */
    fg_status (*lower)(const fg_plan_desc *desc, fg_lowered *out);
} fg_op_decl;

/* A family: its name (src/ops/<name>.c, tests/test_<name>.c) and its ops. */
typedef struct fg_family {
    const char *name;
    int n_ops;
    const fg_op_decl *ops;
} fg_family;

/* The op table (src/ops/op_table.c). */
const fg_op_decl *fg_op_find(fg_op op, const char **family);

/* Runs one op on ctx's workspace, as the one-call functions do: operands[i] NULL for an absent
 * optional one, options of the op's family (or NULL). The data pointers declare the plan's
 * alignment. */
fg_status fg_run_op(fg_context *ctx, fg_op op, const void *options, const fg_tensor *const *operands, int n,
                    int accumulate, uint32_t flags);
/* fg_run_op with the workspace chosen by the caller: need non-NULL plans only (descriptors
 * validated, kernels chosen, pointers not looked at) and gives the bytes of workspace the run
 * needs; else ws non-NULL runs on ws [ws_bytes] (FG_ERR_WORKSPACE when short), and ws NULL on
 * the context's workspace. For composed ops that place their own temporaries. */
fg_status fg_run_op_ws(fg_context *ctx, fg_op op, const void *options, const fg_tensor *const *operands, int n,
                       int accumulate, uint32_t flags, void *ws, size_t ws_bytes, size_t *need);

/* Host element access in any dtype, as f64. */
static inline double fg_load_f64(const void *p, fg_dtype t, int64_t i) {
    switch (t) {
    case FG_F32: return ((const float *)p)[i];
    case FG_F64: return ((const double *)p)[i];
    case FG_F16: return fg_f16_to_f32(((const uint16_t *)p)[i]);
    case FG_BF16: return fg_bf16_to_f32(((const uint16_t *)p)[i]);
    default: break; /* integer dtypes are not loaded as values */
    }
    return 0.0;
}

static inline void fg_store_f64(void *p, fg_dtype t, int64_t i, double v) {
    switch (t) {
    case FG_F32: ((float *)p)[i] = (float)v; break;
    case FG_F64: ((double *)p)[i] = v; break;
    case FG_F16: ((uint16_t *)p)[i] = fg_f32_to_f16((float)v); break;
    case FG_BF16: ((uint16_t *)p)[i] = fg_f32_to_bf16((float)v); break;
    default: break;
    }
}

/* Matrix view of operand `operand`: rows along dim rows_dim, columns along cols_dim
 * (-1: a dim of size 1), strides taken from `stride`; offset and batch stride 0. */
fg_mat fg_mat_of(int operand, const int64_t *stride, int rows_dim, int cols_dim);
fg_mat fg_mat_t(fg_mat m); /* transposed view */
/* A matrix at a resolved pointer (operand 0, no offset, no batch). */
static inline fg_mat fg_mat_at(void *data, int64_t rs, int64_t cs) {
    fg_mat m = {0, 0, rs, cs, 0, data};
    return m;
}

/* Checks that the matrix [rows, cols] of operand `what` has a unit stride in one dim. */
fg_status fg_check_unit_stride(const char *op, const char *what, const fg_mat *m, int64_t rows,
                               int64_t cols);

#ifdef __cplusplus
}
#endif

#endif /* FG_INTERNAL_H */

/*
 * fastgrad.h — the whole public C API of fastgrad.
 *
 * fastgrad is a library of fused forward and backward kernels for training neural
 * networks. The CPU backend (OpenBLAS + OpenMP) is the reference and the default; the
 * CUDA backend (cuBLASLt + own kernels) is built when nvcc is present. This header is
 * the documentation: read it top to bottom.
 *
 * Conventions
 *  - Every entry returns fg_status (FG_OK == 0). On failure fg_last_error() gives a
 *    thread-local message naming the argument, and no output has been written.
 *  - The library never prints, exits or aborts, and never synchronizes the host with
 *    the device inside an op. fg_context_check() is the one place that waits.
 *  - Zero-initialized descriptors mean documented defaults.
 *  - Sizes are int64. Strides are in elements; an all-zero stride array means
 *    contiguous row-major. Negative strides are not accepted.
 *  - The caller owns memory and the stream. Ops allocate no device memory: scratch
 *    comes from a caller workspace (plans) or the context's own workspace (one-call
 *    functions), grown stream-ordered when an op needs more.
 *  - Each backward function computes one gradient; `accumulate` != 0 adds it into the
 *    existing contents of the output (beta = 1) instead of overwriting it.
 *  - Enums only grow at the end; the ABI of existing entries does not change within
 *    a major version.
 *
 * This header compiles as C99/C11 and as C++.
 */
#ifndef FASTGRAD_H
#define FASTGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FG_VERSION_MAJOR 0
#define FG_VERSION_MINOR 2
#define FG_VERSION_PATCH 0
/* (major << 16) | (minor << 8) | patch */
#define FG_VERSION ((FG_VERSION_MAJOR << 16) | (FG_VERSION_MINOR << 8) | FG_VERSION_PATCH)

#if defined(__GNUC__) || defined(__clang__)
#define FG_NODISCARD __attribute__((warn_unused_result))
#else
#define FG_NODISCARD
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FG_API __attribute__((visibility("default")))
#else
#define FG_API
#endif

/* ------------------------------------------------------------------ status */

typedef enum fg_status {
    FG_OK = 0,
    FG_ERR_NULL_POINTER = 1,     /* a required pointer argument is NULL           */
    FG_ERR_INVALID_VALUE = 2,    /* an option or scalar argument is out of range  */
    FG_ERR_SHAPE = 3,            /* ranks or shapes disagree                       */
    FG_ERR_DTYPE = 4,            /* unknown dtype, or dtypes that must match don't */
    FG_ERR_WRONG_DEVICE = 5,     /* memory not reachable from the context's device */
    FG_ERR_MISALIGNED = 6,       /* data not aligned to its element size           */
    FG_ERR_WORKSPACE = 7,        /* workspace missing or too small                 */
    FG_ERR_OVERFLOW = 8,         /* a size or extent overflows int64               */
    FG_ERR_ALIAS = 9,            /* an output overlaps an input or another output  */
    FG_ERR_UNSUPPORTED = 10,     /* valid, but no kernel of this backend does it   */
    FG_ERR_NO_DEVICE = 11,       /* backend not built in, or no such device        */
    FG_ERR_OUT_OF_MEMORY = 12,   /* the context could not grow its own workspace  */
    FG_ERR_BACKEND = 13,         /* CUDA / cuBLASLt / BLAS reported a failure      */
    FG_ERR_DEVICE_VALUE = 14,    /* a kernel found a bad value (fg_context_check)  */
    FG_ERR_INTERNAL = 15         /* a bug in fastgrad: please report it            */
} fg_status;

/* Static name of a status code ("FG_ERR_SHAPE"); never NULL. */
FG_API const char *fg_status_string(fg_status status);
/* Detail of the last failure on this thread ("linear_forward: w.shape[1]=1000 but
 * x.shape[-1]=1024"); "" after a success. Valid until the next call on this thread. */
FG_API const char *fg_last_error(void);

/* Runtime version, FG_VERSION of the library actually loaded. */
FG_API uint32_t fg_version(void);

/* ------------------------------------------------------------------ dtypes */

typedef enum fg_dtype {
    FG_F32 = 0,   /* the default */
    FG_F16 = 1,   /* IEEE binary16 */
    FG_BF16 = 2,  /* bfloat16 */
    FG_F64 = 3,
    FG_I32 = 4,   /* integer ids (class targets); not accepted where a float is computed */
    FG_I64 = 5
} fg_dtype;

/* Size in bytes of one element; 0 for an unknown dtype. */
FG_API size_t fg_dtype_size(fg_dtype dtype);
/* Static name ("bf16"); "?" for an unknown dtype. */
FG_API const char *fg_dtype_name(fg_dtype dtype);

/* Host conversions, round to nearest even; NaN stays NaN, overflow gives inf. */
FG_API uint16_t fg_f32_to_f16(float value);
FG_API float fg_f16_to_f32(uint16_t bits);
FG_API uint16_t fg_f32_to_bf16(float value);
FG_API float fg_bf16_to_f32(uint16_t bits);
/* Converts n contiguous host elements of the float dtypes. src and dst must not overlap. */
FG_NODISCARD FG_API fg_status fg_convert(const void *src, fg_dtype src_dtype, void *dst,
                                         fg_dtype dst_dtype, int64_t n);

/* ------------------------------------------------------------------ tensors */

#define FG_MAX_RANK 8

/* A view of memory the caller owns. Shapes and strides are in elements.
 * stride all zero: contiguous row-major. An optional operand is absent when its
 * rank is 0 (pass NULL to the one-call functions). */
typedef struct fg_tensor {
    void *data;
    fg_dtype dtype;
    int32_t rank;
    int64_t shape[FG_MAX_RANK];
    int64_t stride[FG_MAX_RANK];
} fg_tensor;

/* Convenience: a contiguous tensor descriptor. rank <= FG_MAX_RANK. */
FG_API fg_tensor fg_tensor_make(void *data, fg_dtype dtype, int32_t rank, const int64_t *shape);

/* ------------------------------------------------------------------ context */

typedef enum fg_backend {
    FG_BACKEND_CPU = 0,   /* the default */
    FG_BACKEND_CUDA = 1
} fg_backend;

typedef struct fg_context_desc {
    fg_backend backend;
    int32_t device;          /* CUDA device ordinal                                   */
    void *stream;            /* cudaStream_t the ops are enqueued on; NULL = default  */
    int32_t allow_tf32;      /* one-call functions may round f32 inputs to tf32       */
    int32_t num_threads;     /* CPU: OpenMP threads; 0 = OpenMP's default             */
} fg_context_desc;

typedef struct fg_context fg_context;

/* Whether a backend is usable here (built in and, for CUDA, a device present). */
FG_API int fg_backend_available(fg_backend backend);

/* desc NULL: the CPU backend with defaults. */
FG_NODISCARD FG_API fg_status fg_context_create(const fg_context_desc *desc, fg_context **out);
/* Frees the context and its own workspace (stream-ordered). NULL is a no-op. */
FG_API void fg_context_destroy(fg_context *ctx);
/* CUDA: the stream (a cudaStream_t; NULL: the legacy default stream) the context's ops are
 * enqueued on from now. The new stream is ordered after the work the context queued on the old
 * one (an event, no host wait), except when it is being captured into a CUDA graph, where that
 * order is the caller's (as for any captured launch). A CPU context takes only NULL. */
FG_NODISCARD FG_API fg_status fg_context_set_stream(fg_context *ctx, void *stream);
/* Waits for the context's stream and reports what the device found since the last
 * check: FG_ERR_DEVICE_VALUE with the first offending index in fg_last_error(), or
 * FG_ERR_BACKEND for an asynchronous CUDA failure. Clears the device flag. */
FG_NODISCARD FG_API fg_status fg_context_check(fg_context *ctx);
/* Hands the context a caller-owned workspace for the one-call functions; the context
 * then never allocates. NULL/0 returns to the context's own, grown on demand. */
FG_NODISCARD FG_API fg_status fg_context_set_workspace(fg_context *ctx, void *ptr, size_t bytes);
/* The bytes of workspace the context holds now: its own (grown by the one-call functions and the
 * composed ops, such as the encoder layer's parts, and kept until fg_context_destroy; on CUDA
 * allocated with cudaMallocAsync, outside any framework's allocator, so a framework's memory
 * statistics do not see it) or the caller's given by fg_context_set_workspace. */
FG_NODISCARD FG_API fg_status fg_context_workspace_size(const fg_context *ctx, size_t *bytes);
/* The kernels the last op run on this context launched, in order ("gemm90_dx ; act_grad"):
 * the names fg_plan_info.kernel is made of. Valid until the next op on the context. */
FG_API const char *fg_context_last_kernels(const fg_context *ctx);

/* ------------------------------------------------------------------ plans */

typedef enum fg_op {
    FG_OP_NONE = 0,
    /* operands, in order (index: name [shape])                                           */
    FG_OP_LINEAR_FORWARD = 1,          /* 0:x [...,K] 1:w [M,K] 2:b [M] (optional) 3:y [...,M]  */
    FG_OP_LINEAR_BACKWARD_INPUT = 2,   /* 0:dy [...,M] 1:w [M,K] 2:dx [...,K]               */
    FG_OP_LINEAR_BACKWARD_WEIGHT = 3,  /* 0:dy [...,M] 1:x [...,K] 2:dw [M,K]               */
    FG_OP_LINEAR_BACKWARD_BIAS = 4,    /* 0:dy [...,M] 1:db [M]                              */
    FG_OP_MATMUL_FORWARD = 5,          /* 0:a [(B,)M,K] 1:b [(B,)K,N] 2:c [(B,)M,N]         */
    FG_OP_MATMUL_BACKWARD_INPUT = 6,   /* 0:dc 1:b 2:da   (da = dc·bᵀ, summed if a broadcast) */
    FG_OP_MATMUL_BACKWARD_OTHER = 7,   /* 0:a 1:dc 2:db   (db = aᵀ·dc, summed if b broadcast) */
    FG_OP_OUTER_FORWARD = 8,           /* 0:x [N] 1:y [M] 2:z [N,M]                          */
    FG_OP_OUTER_BACKWARD_INPUT = 9,    /* 0:dz [N,M] 1:y [M] 2:dx [N]                        */
    FG_OP_OUTER_BACKWARD_OTHER = 10,   /* 0:dz [N,M] 1:x [N] 2:dy [M]                        */
    /* Parameterized elementwise family (options: fg_elementwise_options).
       Inputs broadcast numpy-style to the output (forward) or to dy (backward); the
       gradient of a broadcast input is summed over its broadcast dims, deterministically.
       Gradient outputs are optional: absent (rank 0) = not requested.                  */
    FG_OP_UNARY_FORWARD = 11,          /* 0:x 1:y                                              */
    FG_OP_UNARY_BACKWARD = 12,         /* 0:dy 1:x 2:dx                                        */
    FG_OP_BINARY_FORWARD = 13,         /* 0:a 1:b 2:w (optional, lerp) 3:y                     */
    FG_OP_BINARY_BACKWARD = 14,        /* 0:dy 1:a 2:b 3:w (optional) 4:da 5:db 6:dw           */
    /* Fused linear log-prob / cross-entropy (options: fg_logp_options).                 */
    FG_OP_LINEAR_LOGP_FORWARD = 15,    /* 0:h [N,D] 1:w [V,D] 2:b [V] (opt) 3:target [N] (i32/i64)
                                          4:logp [N] 5:lse [N] 6:entropy [N] (opt)           */
    FG_OP_LINEAR_LOGP_BACKWARD = 16,   /* 0:dlogp [N] (opt) 1:dentropy [N] (opt) 2:dlse [N] (opt)
                                          3:h 4:w 5:b (opt) 6:target 7:lse 8:entropy (opt)
                                          9:dh (opt) 10:dw (opt) 11:db (opt)                   */
    FG_OP_LINEAR_CROSS_ENTROPY = 17,   /* 0:h 1:w 2:b (opt) 3:target 4:row_weight [N] (opt)
                                          5:loss ([N] for reduction none, else [1])
                                          6:lse [N] (opt) 7:dh (opt) 8:dw (opt) 9:db (opt)      */
    /* Linear + bias + activation (options: fg_linear_act_options).                       */
    FG_OP_LINEAR_ACT_FORWARD = 18,     /* 0:x [...,K] 1:w [M,K] 2:b [M] (opt) 3:y [...,M]
                                          4:saved [...,M] (opt: pre or its slope)             */
    FG_OP_LINEAR_ACT_BACKWARD = 19,    /* 0:dy [...,M] 1:saved (opt; absent: pre recomputed)
                                          2:x 3:w 4:b (opt) 5:dx (opt) 6:dw (opt) 7:db (opt)  */
    /* Normalization family (see "Normalization and dropout" below). Row norms (LayerNorm,
       RMSNorm over the last dim D; options fg_norm_options), rows = the leading dims:      */
    FG_OP_NORM_FORWARD = 20,           /* 0:x [...,D] 1:r [...,D] (opt: s = x + dropout(r) is normed)
                                          2:w [D] (opt) 3:b [D] (opt) 4:y [...,D] 5:s [...,D] (opt)
                                          6:mean [rows] (opt) 7:rstd [rows] (opt)               */
    FG_OP_NORM_BACKWARD = 21,          /* 0:dy 1:ds (opt) 2:x (the normed input) 3:w (opt)
                                          4:mean (opt) 5:rstd (opt) 6:dx (opt) 7:dr (opt)
                                          8:dw (opt) 9:db (opt)                                 */
    /* BatchNorm per channel over all leading dims of x [..., C] (fg_batch_norm_options);
       sums: f64 [2C + 1], the split form's all-reducible statistics.                       */
    FG_OP_BATCH_NORM_FORWARD = 22,     /* 0:x 1:r (opt) 2:w [C] (opt) 3:b [C] (opt)
                                          4:running_mean [C] (opt) 5:running_var [C] (opt)
                                          6:y 7:s (opt) 8:mean [C] (opt) 9:rstd [C] (opt)       */
    FG_OP_BATCH_NORM_BACKWARD = 23,    /* 0:dy 1:x 2:w (opt) 3:mean 4:rstd 5:dx (opt) 6:dr (opt)
                                          7:dw (opt) 8:db (opt)                                 */
    FG_OP_BATCH_NORM_STATS = 24,       /* 0:x 1:r (opt) 2:s (opt) 3:sums                        */
    FG_OP_BATCH_NORM_APPLY = 25,       /* 0:x 1:sums (opt: eval) 2:w (opt) 3:b (opt)
                                          4:running_mean (opt) 5:running_var (opt) 6:y
                                          7:mean (opt) 8:rstd (opt)                             */
    FG_OP_BATCH_NORM_BACKWARD_STATS = 26, /* 0:dy 1:x 2:mean 3:rstd 4:sums                     */
    FG_OP_BATCH_NORM_BACKWARD_APPLY = 27, /* 0:dy 1:x 2:w (opt) 3:mean 4:rstd 5:sums 6:dx (opt)
                                          7:dr (opt) 8:dw (opt) 9:db (opt)                      */
    /* Dropout (fg_dropout_options)                                                          */
    FG_OP_DROPOUT_FORWARD = 28,        /* 0:x 1:y                                               */
    FG_OP_DROPOUT_BACKWARD = 29,       /* 0:dy 1:dx                                             */
    /* RevIN, per instance over time of x [..., L, C] (fg_revin_options)                     */
    FG_OP_REVIN_STATS = 30,            /* 0:x [...,L,C] 1:mean [...,C] 2:stdev [...,C]          */
    FG_OP_REVIN_FORWARD = 31,          /* 0:x 1:w [C] (opt) 2:b [C] (opt) 3:mean 4:stdev 5:y    */
    FG_OP_REVIN_BACKWARD = 32,         /* 0:dy 1:x 2:w (opt) 3:b (opt) 4:mean 5:stdev 6:dx (opt)
                                          7:dw (opt) 8:db (opt)                                 */
    /* Multi-head attention (fg_attention_options); q, k, v, o [B,H,L,hd], scores [B,H,L,L]   */
    FG_OP_ATTENTION_FORWARD = 33,      /* 0:q 1:k 2:v 3:lengths [B] (opt, i32/i64)
                                          4:scores_in (opt) 5:o 6:lse [B,H,L] 7:scores_out (opt) */
    FG_OP_ATTENTION_BACKWARD = 34,     /* 0:do 1:dscores (opt) 2:q 3:k 4:v 5:lengths (opt)
                                          6:scores_in (opt) 7:o 8:lse 9:dq (opt) 10:dk (opt)
                                          11:dv (opt) 12:dscores_in (opt)                        */
    /* Series: patching and regression losses (see "Series" below)                           */
    FG_OP_PATCH_FORWARD = 35,          /* 0:x [...,L] 1:y [...,P,S]   (fg_patch_options)        */
    FG_OP_PATCH_BACKWARD = 36,         /* 0:dy [...,P,S] 1:dx [...,L] (fg_patch_options)        */
    FG_OP_REGRESSION_LOSS = 37,        /* 0:pred 1:target 2:loss ([1], or pred's shape) 3:dpred (opt)
                                          (fg_regression_loss_options)                          */
    FG_OP_SERIES_WINDOWS = 38,         /* 0:series [T,C] 1:starts [B] (i32/i64) 2:y [B,W,C]         */
    /* Vocabulary-parallel log-prob (fg_logp_options' vocab_start / vocab_total; see
       "Linear log-prob" below): this rank's partial statistics, and their combination    */
    FG_OP_LINEAR_LOGP_SHARD_FORWARD = 39, /* 0:h [N,D] 1:w [V_r,D] 2:b [V_r] (opt) 3:target [N]
                                          4:lse_part [N] 5:tlogit_part [N] 6:entropy_part [N] (opt) */
    FG_OP_LINEAR_LOGP_SHARD_COMBINE = 40  /* 0:target [N] 1:lse_parts [R,N] 2:tlogit_parts [N] or [R,N]
                                          3:entropy_parts [R,N] (opt) 4:logp [N] 5:lse [N]
                                          6:entropy [N] (opt)                                    */
} fg_op;

#define FG_MAX_OPERANDS 16

/* Plan flags */
#define FG_PLAN_ALLOW_TF32 1u   /* f32 inputs may be rounded to tf32 on tensor cores */
#define FG_PLAN_CONSUME_PRE 2u  /* linear_act backward: the same as fg_linear_act_options.consume
                                   (kept for this minor version) */
#define FG_PLAN_ACT_SLOPE 4u    /* linear_act: the same as fg_linear_act_options.saved =
                                   FG_ACT_SAVED_SLOPE (kept for this minor version) */
#define FG_PLAN_CONSUME_DY 8u   /* linear_act backward with dropout: dy may be overwritten (it holds
                                   dy ⊙ m afterwards where the mask is not applied inside the
                                   gradient's pass), which saves the N·M buffer dy ⊙ m would take */

/* A plan's descriptor. Each op's operands, in order, and the options struct it takes are
 * listed by fg_op_describe (and in the comments of fg_op above). */
typedef struct fg_plan_desc {
    fg_op op;
    fg_tensor operands[FG_MAX_OPERANDS]; /* dtypes, shapes, strides; data is ignored */
    int32_t accumulate;                  /* backward ops: add into the output        */
    uint32_t flags;                      /* FG_PLAN_*                                 */
    /* The op family's options (fg_elementwise_options, fg_linear_act_options,
       fg_logp_options: fg_op_info.options_type names it), NULL for the defaults, and
       sizeof that struct as the caller compiled it (a smaller, older struct reads as if
       its missing tail were zero). */
    const void *options;
    size_t options_size;
    /* The alignment in bytes the caller promises for every operand's data pointer (a power
       of two); 0 means 16. Kernels are chosen for it when the plan is made, and
       fg_plan_can_implement refuses data aligned less (FG_ERR_MISALIGNED). The one-call
       functions declare what their pointers have. */
    uint32_t alignment;
} fg_plan_desc;

/* What a plan promises about its numbers. */
typedef struct fg_precision {
    fg_dtype storage;       /* element type in memory                                 */
    fg_dtype math;          /* type products are formed in (exact products of bf16/f16
                               land in f32)                                           */
    fg_dtype accumulator;   /* type sums are carried in                               */
    int32_t tf32;           /* 1: f32 inputs rounded to tf32 (10-bit mantissa). 0 also
                               covers CUDA's split products: on sm_90a an f32 product of
                               a narrow layer over many tokens may run as three TF32
                               tensor-core passes of split operands (x = hi + lo), summed
                               in f32 a 32-deep slice at a time: f32-accurate (≈ 2e-7
                               against f64 at k up to 3072), deterministic, but not the
                               same bits as cuBLAS's f32 products; an infinite input (or
                               a finite one of size ≥ (2 − 2^-11)·2^127) gives NaN
                               there, not ±Inf                                        */
    int32_t deterministic;  /* 1: the same inputs give the same bits, run to run      */
    int32_t bit_stable;     /* 1: ... also across processes on the same hardware and
                               library versions                                       */
} fg_precision;

/* A plan's SKU and guarantee. */
typedef struct fg_plan_info {
    fg_op op;
    const char *op_name;    /* "linear_forward"                                       */
    fg_dtype dtype;
    fg_backend backend;
    int32_t arch;           /* CUDA compute capability x10 (90 = sm_90); 0 on the CPU */
    char kernel[256];       /* what runs: "cublasLt(algo=21,tile=..)+bias", "gemv_dot<f32,v4>" */
    fg_precision precision;
    size_t workspace_bytes; /* what fg_plan_run needs                                 */
} fg_plan_info;

typedef struct fg_plan fg_plan;

/* Validates the descriptor (everything but the data pointers) and selects kernels. */
FG_NODISCARD FG_API fg_status fg_plan_create(fg_context *ctx, const fg_plan_desc *desc,
                                             fg_plan **out);
FG_API void fg_plan_destroy(fg_plan *plan);
FG_NODISCARD FG_API fg_status fg_plan_info_get(const fg_plan *plan, fg_plan_info *info);
FG_NODISCARD FG_API fg_status fg_plan_workspace_size(const fg_plan *plan, size_t *bytes);
/* FG_OK when the plan can run on these operands (same dtypes/shapes/strides as its
 * descriptor; pointers valid, on the context's device, aligned, not aliasing). */
FG_NODISCARD FG_API fg_status fg_plan_can_implement(const fg_plan *plan,
                                                    const fg_tensor *operands);
/* Runs on the context's stream. workspace may be NULL when workspace_bytes == 0. */
FG_NODISCARD FG_API fg_status fg_plan_run(fg_plan *plan, const fg_tensor *operands,
                                          void *workspace, size_t workspace_bytes);

/* ------------------------------------------------------------------ the op table */
/* Every op is declared once, in the library's op table; these read it, so bindings take
 * the ops' ids, names, operands and options from the library itself. */
typedef enum fg_operand_role {
    FG_ROLE_INPUT = 0,
    FG_ROLE_OUTPUT = 1   /* written by the op (added into with accumulate) */
} fg_operand_role;

typedef struct fg_operand_info {
    const char *name;    /* "x", "dw": the name error messages use */
    fg_operand_role role;
    int32_t optional;    /* 1: may be absent (rank 0 in a plan, NULL in a one-call function) */
} fg_operand_info;

typedef struct fg_op_info {
    fg_op op;
    const char *name;          /* "linear_forward" (the enum is FG_OP_ + its upper case) */
    const char *family;        /* "linear": src/ops/<family>.c, tests/test_<family>.c */
    int32_t n_operands;
    fg_operand_info operands[FG_MAX_OPERANDS];
    uint32_t flags;            /* the FG_PLAN_* flags its plans accept */
    const char *options_type;  /* "fg_logp_options", or NULL when it takes none */
    size_t options_size;       /* sizeof that struct in this library */
} fg_op_info;

/* The ops are 1 … fg_op_count(). */
FG_API int32_t fg_op_count(void);
/* FG_ERR_INVALID_VALUE for an op that is not in the table. */
FG_NODISCARD FG_API fg_status fg_op_describe(fg_op op, fg_op_info *info);

/* The ABI as this library was compiled, for bindings that mirror it: the value of a named
 * constant of this header ("FG_BF16", "FG_ACT_GELU_TANH", "FG_PLAN_ACT_SLOPE", "FG_MAX_RANK"),
 * and the size of a public struct ("fg_plan_desc", field NULL) or a field's offset in it
 * ("fg_plan_desc", "options"). FG_ERR_INVALID_VALUE for a name it does not know. */
FG_NODISCARD FG_API fg_status fg_abi_constant(const char *name, int64_t *value);
FG_NODISCARD FG_API fg_status fg_abi_layout(const char *type, const char *field, size_t *value);

/* ------------------------------------------------------------------ Linear */
/* y = x·wᵀ (+ b). x [..., K] with any leading dims (they must collapse into one
 * stride), w [M, K], b [M] or NULL, y [..., M]. One row (N = 1) runs as a GEMV. */
FG_NODISCARD FG_API fg_status fg_linear_forward(fg_context *ctx, const fg_tensor *x,
                                                const fg_tensor *w, const fg_tensor *b,
                                                const fg_tensor *y);
/* dx = dy·w */
FG_NODISCARD FG_API fg_status fg_linear_backward_input(fg_context *ctx, const fg_tensor *dy,
                                                       const fg_tensor *w, const fg_tensor *dx,
                                                       int accumulate);
/* dw = dyᵀ·x, summed over all leading dims */
FG_NODISCARD FG_API fg_status fg_linear_backward_weight(fg_context *ctx, const fg_tensor *dy,
                                                        const fg_tensor *x, const fg_tensor *dw,
                                                        int accumulate);
/* db = Σ dy over all leading dims (deterministic, f32 accumulation) */
FG_NODISCARD FG_API fg_status fg_linear_backward_bias(fg_context *ctx, const fg_tensor *dy,
                                                      const fg_tensor *db, int accumulate);

/* ------------------------------------------------------------------ Matmul */
/* c = a·b. a [M,K] or [B,M,K]; b [K,N] or [B,K,N]; c [M,N] or [B,M,N]. A 2-D operand
 * is broadcast across the batch of the other. */
FG_NODISCARD FG_API fg_status fg_matmul_forward(fg_context *ctx, const fg_tensor *a,
                                                const fg_tensor *b, const fg_tensor *c);
/* da = dc·bᵀ (summed over the batch when a was 2-D and b 3-D) */
FG_NODISCARD FG_API fg_status fg_matmul_backward_input(fg_context *ctx, const fg_tensor *dc,
                                                       const fg_tensor *b, const fg_tensor *da,
                                                       int accumulate);
/* db = aᵀ·dc (summed over the batch when b was 2-D and a 3-D) */
FG_NODISCARD FG_API fg_status fg_matmul_backward_other(fg_context *ctx, const fg_tensor *a,
                                                       const fg_tensor *dc, const fg_tensor *db,
                                                       int accumulate);

/* ------------------------------------------------------------------ Outer */
/* z = x ⊗ y: x [N], y [M], z [N, M] */
FG_NODISCARD FG_API fg_status fg_outer_forward(fg_context *ctx, const fg_tensor *x,
                                               const fg_tensor *y, const fg_tensor *z);
/* dx = dz·y */
FG_NODISCARD FG_API fg_status fg_outer_backward_input(fg_context *ctx, const fg_tensor *dz,
                                                      const fg_tensor *y, const fg_tensor *dx,
                                                      int accumulate);
/* dy = dzᵀ·x */
FG_NODISCARD FG_API fg_status fg_outer_backward_other(fg_context *ctx, const fg_tensor *dz,
                                                      const fg_tensor *x, const fg_tensor *dy,
                                                      int accumulate);

/* ------------------------------------------------------------------ Elementwise */
/* Unary ops with parameters (scalars[] of the plan descriptor):
 *   SCALE      y = s·x                      scalars = {s}
 *   POW        y = x^p                      scalars = {p}        dx = p·x^(p-1)·dy
 *   LEAKY_RELU y = x ≥ 0 ? x : slope·x      scalars = {slope}    (x = 0 takes the x ≥ 0 side)
 *   ELU        y = x > 0 ? x : α(eˣ − 1)    scalars = {α}
 *   CLAMP      y = min(max(x, lo), hi)      scalars = {lo, hi}   dx = dy on lo ≤ x ≤ hi, else 0
 *   SOFTCAP    y = c·tanh(x/c)              scalars = {c > 0}                                 */
typedef enum fg_unary {
    FG_UNARY_SCALE = 0,
    FG_UNARY_POW = 1,
    FG_UNARY_LEAKY_RELU = 2,
    FG_UNARY_ELU = 3,
    FG_UNARY_CLAMP = 4,
    FG_UNARY_SOFTCAP = 5
} fg_unary;

/* Binary ops with parameters:
 *   LERP   y = a + w·(b − a), w a scalar (scalars = {w}) or a tensor (operand w)
 *          da = (1 − w)·dy, db = w·dy, dw = (b − a)·dy
 *   AXPBY  y = α·a + β·b                  scalars = {α, β};  da = α·dy, db = β·dy            */
typedef enum fg_binary {
    FG_BINARY_LERP = 0,
    FG_BINARY_AXPBY = 1
} fg_binary;

/* Options of the elementwise ops (fg_plan_desc.options of FG_OP_UNARY_* / FG_OP_BINARY_*):
 * kind is an fg_unary (unary ops) or an fg_binary (binary ops), scalars its parameters. */
typedef struct fg_elementwise_options {
    int32_t kind;
    double scalars[4];
} fg_elementwise_options;

/* One-call forms of FG_OP_UNARY_* / FG_OP_BINARY_* (scalars as documented above). In
 * place is allowed where an output is exactly an input (same data, shape, strides). */
FG_NODISCARD FG_API fg_status fg_unary_forward(fg_context *ctx, fg_unary kind, const double *scalars,
                                               const fg_tensor *x, const fg_tensor *y);
FG_NODISCARD FG_API fg_status fg_unary_backward(fg_context *ctx, fg_unary kind, const double *scalars,
                                                const fg_tensor *dy, const fg_tensor *x,
                                                const fg_tensor *dx, int accumulate);
/* w: a tensor, or NULL to use w_scalar */
FG_NODISCARD FG_API fg_status fg_lerp_forward(fg_context *ctx, const fg_tensor *a, const fg_tensor *b,
                                              const fg_tensor *w, double w_scalar, const fg_tensor *y);
/* Any of da, db, dw may be NULL (not wanted); a and b are needed only for dw. */
FG_NODISCARD FG_API fg_status fg_lerp_backward(fg_context *ctx, const fg_tensor *dy, const fg_tensor *a,
                                               const fg_tensor *b, const fg_tensor *w, double w_scalar,
                                               const fg_tensor *da, const fg_tensor *db,
                                               const fg_tensor *dw, int accumulate);
FG_NODISCARD FG_API fg_status fg_axpby_forward(fg_context *ctx, const fg_tensor *a, const fg_tensor *b,
                                               double alpha, double beta, const fg_tensor *y);
FG_NODISCARD FG_API fg_status fg_axpby_backward(fg_context *ctx, const fg_tensor *dy, double alpha,
                                                double beta, const fg_tensor *da, const fg_tensor *db,
                                                int accumulate);

/* ------------------------------------------------------------------ AdamW */
/* One fused, multi-tensor AdamW step (decoupled weight decay, bias-corrected moments):
 *   g = grad·grad_scale;  p ← p·(1 − lr·weight_decay)
 *   m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²        (the moments are lerps)
 *   p ← p − lr/(1 − β1^step) · m / (sqrt(v)/sqrt(1 − β2^step) + eps)
 * params: f32, f16 or bf16; grads: the params' dtype or f32; exp_avg and exp_avg_sq: f32, or
 * the params' dtype (every moment tensor one dtype: they are read, updated in f32 and stored
 * rounded, as torch's fused AdamW keeps them for bf16 parameters; half the state's memory and
 * traffic). master (optional, NULL or all entries rank 0): f32 master weights that the step
 * updates and rounds into params. Tensors must be contiguous; each list has `count`
 * entries of matching sizes. Deterministic (elementwise, no reductions). */
typedef struct fg_adamw_hparams {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;        /* 1 on the first step                          */
    double grad_scale;   /* multiplies the gradients; 0 means 1          */
} fg_adamw_hparams;

FG_NODISCARD FG_API fg_status fg_adamw_step(fg_context *ctx, const fg_adamw_hparams *hp, int count,
                                            const fg_tensor *params, const fg_tensor *grads,
                                            const fg_tensor *exp_avg, const fg_tensor *exp_avg_sq,
                                            const fg_tensor *master);

/* ------------------------------------------------------------------ Linear + activation */
/* Activations of the linear + activation family (y = act(pre), pre = x·wᵀ + b):
 *   NONE       y = pre
 *   RELU       y = max(pre, 0)                  act′(0) = 0
 *   GELU       y = pre·Φ(pre) (erf form)        act′ = Φ + pre·φ
 *   GELU_TANH  y = ½pre(1 + tanh(√(2/π)(pre + 0.044715 pre³)))
 *   SILU       y = pre·σ(pre)                   act′ = σ(1 + pre(1 − σ))
 *   SIGMOID    y = σ(pre)                       act′ = σ(1 − σ)
 *   TANH       y = tanh(pre)                    act′ = 1 − y²
 * Derivatives are exact at 0 and finite for any finite input (GELU_TANH's takes its limits
 * 0 / 1 past |pre| = 10, where they hold to far below any dtype's resolution, instead of
 * 0·∞); NaN in gives NaN out. */
typedef enum fg_activation {
    FG_ACT_NONE = 0,
    FG_ACT_RELU = 1,
    FG_ACT_GELU = 2,
    FG_ACT_GELU_TANH = 3,
    FG_ACT_SILU = 4,
    FG_ACT_SIGMOID = 5,
    FG_ACT_TANH = 6
} fg_activation;

/* What the forward saves for the backward in its `saved` operand. */
typedef enum fg_act_saved {
    FG_ACT_SAVED_PRE = 0,   /* the pre-activation x·wᵀ + b (the default) */
    FG_ACT_SAVED_SLOPE = 1  /* its slope s = act′(pre), rounded to the dtype: the backward's
                               g = dy ⊙ s is one multiply, no activation math */
} fg_act_saved;

/* A dropout: drop probability p in [0, 1] (0: none), and the generator's (seed, offset); the
 * mask is the normalization family's (see "Normalization and dropout" below). */
typedef struct fg_dropout_options {
    double p;
    uint64_t seed, offset;
} fg_dropout_options;

/* Options of the linear + activation family (fg_plan_desc.options of FG_OP_LINEAR_ACT_*).
 * Members only grow at the end, and a shorter, older struct passed with its own options_size
 * reads as if its tail were zero (dropout p = 0: none), so code built against an earlier
 * header keeps its meaning. */
typedef struct fg_linear_act_options {
    fg_activation act;
    fg_act_saved saved;
    int32_t consume;        /* backward: the saved operand may be overwritten (it holds
                               g = dy ⊙ act′(pre) afterwards), which saves the N·M buffer g
                               would take — for a saved operand kept only for this backward */
    fg_dropout_options dropout; /* forward: y = dropout(act(pre)), the mask fg_dropout_forward
                               applies to y (element i of y: flat row-major index i, the same
                               (seed, offset)), y's bits those of the forward without it followed
                               by fg_dropout_forward on y (f16 / bf16: act(pre) rounded to the
                               dtype, then the multiply). The slope form saves the masked slope
                               m ⊙ act′(pre) (the dtype's rounding of the product of the
                               rounded slope and m), so its backward takes p = 0 (p > 0 there
                               is refused: the mask is in the slope already; so is act none with
                               the slope saved, whose backward never reads it); g = dy ⊙ (m ⊙ s)
                               differs from the unfused (dy ⊙ m) ⊙ s by one rounding where
                               1/(1 − p) is not a power of two. Keeping pre (or none), the
                               backward takes the forward's dropout and regenerates the mask:
                               g = (dy ⊙ m) ⊙ act′(pre), the bits of fg_dropout_backward on dy
                               followed by the backward without it. p outside [0, 1] or NaN:
                               FG_ERR_INVALID_VALUE. */
} fg_linear_act_options;

/* The forward: y = act(x·wᵀ + b). x [..., K] (any leading dims), w [M, K], b [M] or NULL,
 * y [..., M], all contiguous; f32, f16, bf16 (+ f64 on the CPU), one dtype. Batched weights:
 * w [B, M, K] with x [B, ..., K] (batch i of x meets w[i]), b NULL, [M] (shared) or [B, M].
 * saved (same shape and dtype as y, or NULL) receives what opt->saved names for the backward:
 * the pre-activation, or its slope act′(pre). Memory for time: without it the backward
 * recomputes x·wᵀ + b, one more product. RELU needs nothing saved: its backward takes y in
 * the saved operand's place (relu′(pre) = [y > 0], NaN where y is NaN). opt NULL: act none. */
FG_NODISCARD FG_API fg_status fg_linear_act_forward_ex(fg_context *ctx, const fg_linear_act_options *opt,
                                                       const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                                       const fg_tensor *y, const fg_tensor *saved);
/* The backward: g = dy ⊙ act′(pre) (or dy ⊙ s when the slope was saved) is formed once, with
 * db's column sums, then dx = g·w and dw = gᵀ·x (summed over all leading dims; with batched
 * weights dw [B, M, K] per batch) and db = Σ g (b's shape; [M] sums over the batches). Any of
 * dx, dw, db may be NULL (not wanted); saved NULL: pre is recomputed from x, w, b (b is needed
 * then only if the forward had one). opt->consume lets g be formed in saved's memory (saved
 * must be given; for RELU that is y, which is then overwritten). accumulate adds into every
 * requested output. Sums are f32 (f64 for f64) in a fixed order: deterministic. The slope form
 * costs the same memory as keeping pre; its g is one multiply, which the wide layers' dx
 * product can form itself for every activation. s is rounded to the dtype where keeping pre
 * rounds pre, so g's error is of the same size. */
FG_NODISCARD FG_API fg_status fg_linear_act_backward_ex(fg_context *ctx, const fg_linear_act_options *opt,
                                                        const fg_tensor *dy, const fg_tensor *saved, const fg_tensor *x,
                                                        const fg_tensor *w, const fg_tensor *b, const fg_tensor *dx,
                                                        const fg_tensor *dw, const fg_tensor *db, int accumulate);
/* The same as thin wrappers (kept for this minor version): pre saved / recomputed, */
FG_NODISCARD FG_API fg_status fg_linear_act_forward(fg_context *ctx, fg_activation act, const fg_tensor *x,
                                                    const fg_tensor *w, const fg_tensor *b, const fg_tensor *y,
                                                    const fg_tensor *pre);
FG_NODISCARD FG_API fg_status fg_linear_act_backward(fg_context *ctx, fg_activation act, const fg_tensor *dy,
                                                     const fg_tensor *pre, const fg_tensor *x, const fg_tensor *w,
                                                     const fg_tensor *b, const fg_tensor *dx, const fg_tensor *dw,
                                                     const fg_tensor *db, int accumulate);
/* consume = 1 (pre must be given), */
FG_NODISCARD FG_API fg_status fg_linear_act_backward_consume(fg_context *ctx, fg_activation act, const fg_tensor *dy,
                                                             const fg_tensor *pre, const fg_tensor *x,
                                                             const fg_tensor *w, const fg_tensor *b,
                                                             const fg_tensor *dx, const fg_tensor *dw,
                                                             const fg_tensor *db, int accumulate);
/* saved = FG_ACT_SAVED_SLOPE (slope must be given), */
FG_NODISCARD FG_API fg_status fg_linear_act_forward_slope(fg_context *ctx, fg_activation act, const fg_tensor *x,
                                                          const fg_tensor *w, const fg_tensor *b, const fg_tensor *y,
                                                          const fg_tensor *slope);
FG_NODISCARD FG_API fg_status fg_linear_act_backward_slope(fg_context *ctx, fg_activation act, const fg_tensor *dy,
                                                           const fg_tensor *slope, const fg_tensor *x,
                                                           const fg_tensor *w, const fg_tensor *b, const fg_tensor *dx,
                                                           const fg_tensor *dw, const fg_tensor *db, int accumulate);
/* and one gradient each (the split form of Linear; each forms g itself). */
FG_NODISCARD FG_API fg_status fg_linear_act_backward_input(fg_context *ctx, fg_activation act, const fg_tensor *dy,
                                                           const fg_tensor *pre, const fg_tensor *x,
                                                           const fg_tensor *w, const fg_tensor *b,
                                                           const fg_tensor *dx, int accumulate);
FG_NODISCARD FG_API fg_status fg_linear_act_backward_weight(fg_context *ctx, fg_activation act, const fg_tensor *dy,
                                                            const fg_tensor *pre, const fg_tensor *x,
                                                            const fg_tensor *w, const fg_tensor *b,
                                                            const fg_tensor *dw, int accumulate);
FG_NODISCARD FG_API fg_status fg_linear_act_backward_bias(fg_context *ctx, fg_activation act, const fg_tensor *dy,
                                                          const fg_tensor *pre, const fg_tensor *x,
                                                          const fg_tensor *w, const fg_tensor *b,
                                                          const fg_tensor *db, int accumulate);

/* ------------------------------------------------------------------ Linear log-prob */
/* Reductions of the one-pass cross-entropy. */
typedef enum fg_reduction {
    FG_REDUCTION_MEAN = 0,  /* Σ rows / number of rows not ignored (the default) */
    FG_REDUCTION_SUM = 1,
    FG_REDUCTION_NONE = 2   /* one loss per row                                  */
} fg_reduction;

/* Options of the linear log-prob family. With z = h·wᵀ + b, the logits are
 *   L = cap(z) / temperature,   cap(z) = softcap·tanh(z / softcap) (softcap > 0) or z
 * and p = softmax(L), lse = log Σ exp(L), logp = L[target] − lse,
 * entropy = −Σ p·log p. Rows whose target is ignore_index give logp = lse =
 * entropy = loss = 0 and no gradient. Zero-initialized = defaults.              */
typedef struct fg_logp_options {
    double temperature;      /* > 0; 0 means 1                                          */
    double softcap;          /* >= 0; 0: no cap                                         */
    int32_t use_ignore_index;/* 1: rows with target == ignore_index are ignored         */
    int64_t ignore_index;
    /* one-pass cross-entropy only: loss per row
       ℓ = −(1 − ε)·logp − ε·mean_j log p_j + λ·lse², weighted by row_weight if given  */
    fg_reduction reduction;
    double label_smoothing;  /* ε in [0, 1]                                             */
    double z_loss;           /* λ >= 0                                                  */
    double grad_scale;       /* the gradients are those of grad_scale·loss; 0 means 1   */
    /* memory vs time: the most logits one tile holds (0: the library's choice — forward
       and backward about 0.45 bytes of workspace per logit, the backward's f32 dh
       accumulator included, 4M..256M logits; one pass full rows, N·V/4 within
       64M..256M). */
    int64_t max_tile_elements;
    /* vocabulary parallelism: w and b hold the rows [vocab_start, vocab_start + V_r) of a
       vocabulary of vocab_total classes (targets are global ids in [0, vocab_total)).
       vocab_total 0: unsharded (vocab_start must be 0). Read by linear_logp_shard_forward and
       linear_logp_backward; the one-call forward and cross-entropy refuse a real shard. */
    int64_t vocab_start;
    int64_t vocab_total;
} fg_logp_options;

/* log_softmax(L)[target] of the logits L of h·wᵀ + b (options above) without ever
 * holding the [N, V] logits: the logits are formed tile by tile (a bounded tile in the
 * workspace) and reduced online; the gradients recompute them the same way.
 * h [N, D], w [V, D]: f32, f16, bf16 (+ f64 on the CPU), same dtype; b [V] the same
 * dtype or NULL; target [N] int32 or int64; all contiguous. logp, lse, entropy, loss,
 * row_weight, dlogp, dentropy, dlse: f32 (f64 for f64 inputs). dh / dw / db: the dtype
 * of h / w / b, or f32.
 * A target outside [0, V) (and not ignore_index) gives NaN in its row and
 * FG_ERR_DEVICE_VALUE from the next fg_context_check() with the first such row — the
 * op itself does not look at the target values on the host.
 * Precision: the logits h·wᵀ + b are rounded to the inputs' dtype before the softmax, as
 * F.linear's output is (in bf16 a logit of size |z| carries up to |z|·2^-8 of absolute
 * error, so each p is off by up to that fraction); the softmax, its sums and the
 * per-row statistics are f32 (f64 for f64). The gradients' dz = ∂L/∂z is formed in the
 * same tile, in the inputs' dtype, before the products dh = dz·w and dw = dzᵀ·h take it
 * (db sums it in f32 before that rounding).
 * Deterministic: every sum has a fixed order; no floating-point atomics. */
FG_NODISCARD FG_API fg_status fg_linear_logp_forward(fg_context *ctx, const fg_logp_options *opt,
                                                     const fg_tensor *h, const fg_tensor *w,
                                                     const fg_tensor *b, const fg_tensor *target,
                                                     const fg_tensor *logp, const fg_tensor *lse,
                                                     const fg_tensor *entropy);
/* Gradients of Σ_n dlogp[n]·logp[n] + dentropy[n]·entropy[n] + dlse[n]·lse[n] (any of
 * the three upstream gradients may be NULL, not all; entropy is needed with dentropy).
 * Each of dh, dw, db may be NULL (not wanted); the weight and bias gradients are summed
 * over the rows in f32 and rounded once. accumulate adds into all requested outputs.
 * With a shard in opt (vocab_start / vocab_total, see the vocabulary parallelism below), w / b
 * are the slice, lse / entropy the whole vocabulary's (fg_linear_logp_shard_combine's): dw, db
 * are the slice's gradients and dh this rank's partial, to be summed over the ranks. */
FG_NODISCARD FG_API fg_status fg_linear_logp_backward(
    fg_context *ctx, const fg_logp_options *opt, const fg_tensor *dlogp, const fg_tensor *dentropy,
    const fg_tensor *dlse, const fg_tensor *h, const fg_tensor *w, const fg_tensor *b,
    const fg_tensor *target, const fg_tensor *lse, const fg_tensor *entropy, const fg_tensor *dh,
    const fg_tensor *dw, const fg_tensor *db, int accumulate);
/* One pass: the cross-entropy loss (opt->reduction, label smoothing, z-loss, optional
 * per-row weights, e.g. a policy-gradient advantage) and its gradients together —
 * three matrix products instead of four. lse, dh, dw, db may be NULL. Between row
 * tiles dw adds up in its own dtype (pass an f32 dw for f32 throughout); db is summed
 * in f32 and rounded once. */
FG_NODISCARD FG_API fg_status fg_linear_cross_entropy(
    fg_context *ctx, const fg_logp_options *opt, const fg_tensor *h, const fg_tensor *w,
    const fg_tensor *b, const fg_tensor *target, const fg_tensor *row_weight, const fg_tensor *loss,
    const fg_tensor *lse, const fg_tensor *dh, const fg_tensor *dw, const fg_tensor *db,
    int accumulate);

/* Vocabulary parallelism (the split API; the library itself never communicates). Each of R
 * ranks holds w's rows [vocab_start, vocab_start + V_r) (and b's), with opt->vocab_start /
 * vocab_total set, and the same h and target (global ids):
 *  1. fg_linear_logp_shard_forward: this slice's lse_part = log Σ_{j∈slice} e^(L_j),
 *     tlogit_part = L[target] when the slice holds the target, else 0, and entropy_part = the
 *     entropy of the slice's own softmax. A target in [0, vocab_total) outside the slice is
 *     normal; outside [0, vocab_total) (and not ignore_index) it is the family's device-value
 *     error (NaN row, FG_ERR_DEVICE_VALUE from fg_context_check). Ignored rows give 0.
 *  2. the caller all-gathers lse_part and entropy_part into [R, N] (rank order) and
 *     all-reduces tlogit_part with SUM (or gathers it into [R, N]).
 *  3. fg_linear_logp_shard_combine: lse = logsumexp_r lse_r, logp = L[target] − lse,
 *     entropy = lse − Σ_r e^(lse_r − lse)·(lse_r − H_r), over r in order (deterministic; every
 *     rank gets the same bits). Ignored rows give 0.
 *  4. fg_linear_logp_backward with the same opt and the GLOBAL lse / entropy: dw, db are this
 *     slice's gradients; dh is this rank's partial, which the caller all-reduces with SUM —
 *     give it an f32 dh (f64 for f64) for low-precision h, or every rank's rounding adds up.
 * Every rank holds at least one class (V_r >= 1: an empty slice is refused, FG_ERR_SHAPE).
 * The cross-entropy's loss, weights, reductions and z-loss are functions of (logp, lse) and
 * go to the backward as dlogp / dlse. Label smoothing needs Σ_j L_j over the vocabulary and is
 * refused (FG_ERR_UNSUPPORTED): opt->label_smoothing must be 0 in the shard forward.
 * lse_part, tlogit_part, entropy_part and the combine's float operands: f32 (f64 for f64
 * inputs); target int32 or int64. */
FG_NODISCARD FG_API fg_status fg_linear_logp_shard_forward(fg_context *ctx, const fg_logp_options *opt,
                                                           const fg_tensor *h, const fg_tensor *w,
                                                           const fg_tensor *b, const fg_tensor *target,
                                                           const fg_tensor *lse_part,
                                                           const fg_tensor *tlogit_part,
                                                           const fg_tensor *entropy_part);
/* lse_parts [R, N] (row r = rank r's lse_part), tlogit_parts [N] (already summed) or [R, N],
 * entropy_parts [R, N] or NULL (then entropy must be NULL); target [N] and opt's
 * ignore_index mark the ignored rows. */
FG_NODISCARD FG_API fg_status fg_linear_logp_shard_combine(fg_context *ctx, const fg_logp_options *opt,
                                                           const fg_tensor *target, const fg_tensor *lse_parts,
                                                           const fg_tensor *tlogit_parts,
                                                           const fg_tensor *entropy_parts, const fg_tensor *logp,
                                                           const fg_tensor *lse, const fg_tensor *entropy);

/* ------------------------------------------------------------------ Normalization and dropout */
/* Common to the family:
 *  - x's last dim is the normalized (row norms) or channel (BatchNorm, RevIN) dim and must be
 *    contiguous; the leading dims must collapse into one row stride (padded rows are fine).
 *    f32, f16, bf16 (+ f64 on the CPU); statistics and sums are f32 (f64 for f64), and the
 *    saved statistics (mean, rstd, stdev) are f32 (f64 for f64) whatever x's dtype.
 *  - Dropout is counter-based (src/core/rng.h, Philox4x32-10): element i (its flat row-major
 *    index in the logical tensor the dropout applies to) is kept when its uniform
 *    u(seed, offset, i) >= p, and then multiplied by 1/(1 − p) (0 when p = 1); a dropped element
 *    is multiplied by 0, so a NaN stays NaN as in PyTorch. The mask is never stored: the backward
 *    regenerates it from the same (seed, offset), with the same bits on every backend. Give each
 *    dropout site and step its own offset (or seed).
 *  - An output may be exactly an input (the same view): s over x updates a residual stream in
 *    place, dx over dy reuses the gradient's memory.
 *  - Deterministic: per-block partial sums finished in a fixed order; no floating-point atomics.
 *  - Zero-initialized options are the defaults; eps < 0, non-finite eps, p outside [0, 1] and
 *    momentum outside [0, 1] are refused (FG_ERR_INVALID_VALUE). */

/* (fg_dropout_options, a dropout's p, seed and offset, is declared above fg_linear_act_options.) */

typedef enum fg_norm_kind {
    FG_NORM_LAYER = 0,  /* y = (s − mean)·rstd·w + b,  rstd = 1/√(var + eps), var biased  */
    FG_NORM_RMS = 1     /* y = s·rstd·w + b,           rstd = 1/√(mean(s²) + eps)         */
} fg_norm_kind;

/* Options of the row norms (FG_OP_NORM_*). */
typedef struct fg_norm_options {
    fg_norm_kind kind;
    double eps;                   /* >= 0; 0 means 1e-5                                 */
    fg_dropout_options dropout;   /* on the residual branch r                           */
} fg_norm_options;

/* Row norms over the last dim: with r given, s = x + dropout(r) (written to s when given: the
 * next residual) is normalized, else s = x. w, b: [D], x's dtype, absent = 1 / 0. mean, rstd:
 * [rows] or x's leading shape, f32 (f64 for f64), saved for the backward when given (mean only
 * for LayerNorm; RMSNorm has none). Any D >= 1. */
FG_NODISCARD FG_API fg_status fg_norm_forward(fg_context *ctx, const fg_norm_options *opt, const fg_tensor *x,
                                              const fg_tensor *r, const fg_tensor *w, const fg_tensor *b,
                                              const fg_tensor *y, const fg_tensor *s, const fg_tensor *mean,
                                              const fg_tensor *rstd);
/* The backward from dy (and ds, the gradient s receives from the residual path, or NULL):
 *   g = dy·w,  x̂ = (x − mean)·rstd (RMS: x·rstd),
 *   dsum = rstd·(g − mean(g) − x̂·mean(g·x̂)) + ds    (RMS: rstd·(g − x̂·mean(g·x̂)) + ds)
 *   dx = dsum, dr = dsum·mask/(1 − p) (opt->dropout as in the forward), dw = Σ dy·x̂, db = Σ dy
 * x is the normalized input (s of a fused forward). mean and rstd NULL: recomputed from x (the
 * forward's bits). Each of dx, dr, dw, db may be NULL; dw, db: w's dtype or f32. accumulate
 * adds into every requested output. */
FG_NODISCARD FG_API fg_status fg_norm_backward(fg_context *ctx, const fg_norm_options *opt, const fg_tensor *dy,
                                               const fg_tensor *ds, const fg_tensor *x, const fg_tensor *w,
                                               const fg_tensor *mean, const fg_tensor *rstd, const fg_tensor *dx,
                                               const fg_tensor *dr, const fg_tensor *dw, const fg_tensor *db,
                                               int accumulate);

/* Options of BatchNorm (FG_OP_BATCH_NORM_*). */
typedef struct fg_batch_norm_options {
    int32_t eval;                 /* 0: training (batch statistics), 1: evaluation (running) */
    double eps;                   /* >= 0; 0 means 1e-5                                   */
    double momentum;              /* in [0, 1]; 0 means 0.1 (PyTorch's default). Running
                                     stats that must stay fixed in training: pass none      */
    fg_dropout_options dropout;   /* on the residual branch r                             */
} fg_batch_norm_options;

/* BatchNorm over all leading dims of x [..., C] (N rows), per channel (PatchTST's BatchNorm1d
 * over every token, after the residual add: r gives s = x + dropout(r), written to s when given).
 * Training: mean and the biased variance of the batch normalize; running_mean/running_var (both
 * or neither; f32 or x's dtype) become (1 − momentum)·running + momentum·batch with the unbiased
 * variance (N > 1 rows required). Evaluation: the running statistics normalize (both required).
 * y = (s − mean)·rstd·w + b; w, b: [C], f32 or x's dtype, absent = 1 / 0. mean, rstd: [C],
 * f32 (f64 for f64): what normalized, saved for the backward. The batch reduction is two-phase
 * (per-block partials, then a finish in a fixed order): deterministic. The variance is
 * Σs²/N − mean² from the f64 sums of the split form below, so beside x's rounding it carries
 * ≈ 2^-53·mean² (nothing next to f32's rounding; f64 data whose |mean| ≫ its spread loses
 * about log10(mean²/var) of f64's digits). */
FG_NODISCARD FG_API fg_status fg_batch_norm_forward(fg_context *ctx, const fg_batch_norm_options *opt,
                                                    const fg_tensor *x, const fg_tensor *r, const fg_tensor *w,
                                                    const fg_tensor *b, const fg_tensor *running_mean,
                                                    const fg_tensor *running_var, const fg_tensor *y,
                                                    const fg_tensor *s, const fg_tensor *mean, const fg_tensor *rstd);
/* Training: with x̂ = (x − mean)·rstd, dw = Σ dy·x̂, db = Σ dy (over the N rows),
 *   dx = w·rstd·(dy − db/N − x̂·dw/N);  evaluation (opt->eval): dx = w·rstd·dy.
 * dr = dx·mask/(1 − p) (opt->dropout as in the forward). x is the normalized input (s). Each of
 * dx, dr, dw, db may be NULL; dw, db: w's dtype or f32. */
FG_NODISCARD FG_API fg_status fg_batch_norm_backward(fg_context *ctx, const fg_batch_norm_options *opt,
                                                     const fg_tensor *dy, const fg_tensor *x, const fg_tensor *w,
                                                     const fg_tensor *mean, const fg_tensor *rstd,
                                                     const fg_tensor *dx, const fg_tensor *dr, const fg_tensor *dw,
                                                     const fg_tensor *db, int accumulate);
/* The split form, for synchronized BatchNorm across devices: each device reduces its rows into
 * sums = {Σ s [C], Σ s² [C], N} (f64, [2C + 1]; all-reduce them with a plain sum), then applies.
 *   stats:  s = x + dropout(r) (written to s when given; apply then takes s as its x) → sums
 *   apply:  sums (the all-reduced ones; NULL in evaluation) → mean, var, running stats, y
 * The forward above is stats + apply on one device. */
FG_NODISCARD FG_API fg_status fg_batch_norm_stats(fg_context *ctx, const fg_batch_norm_options *opt,
                                                  const fg_tensor *x, const fg_tensor *r, const fg_tensor *s,
                                                  const fg_tensor *sums);
FG_NODISCARD FG_API fg_status fg_batch_norm_apply(fg_context *ctx, const fg_batch_norm_options *opt,
                                                  const fg_tensor *x, const fg_tensor *sums, const fg_tensor *w,
                                                  const fg_tensor *b, const fg_tensor *running_mean,
                                                  const fg_tensor *running_var, const fg_tensor *y,
                                                  const fg_tensor *mean, const fg_tensor *rstd);
/* The backward's split: sums = {Σ dy [C], Σ dy·x̂ [C], N} (f64 [2C + 1]; all-reduce them), then
 * dx, dr from them, and dw = Σ dy·x̂, db = Σ dy from the sums given (after an all-reduce these
 * are the whole batch's: do not average them again across devices). */
FG_NODISCARD FG_API fg_status fg_batch_norm_backward_stats(fg_context *ctx, const fg_batch_norm_options *opt,
                                                           const fg_tensor *dy, const fg_tensor *x,
                                                           const fg_tensor *mean, const fg_tensor *rstd,
                                                           const fg_tensor *sums);
FG_NODISCARD FG_API fg_status fg_batch_norm_backward_apply(fg_context *ctx, const fg_batch_norm_options *opt,
                                                           const fg_tensor *dy, const fg_tensor *x,
                                                           const fg_tensor *w, const fg_tensor *mean,
                                                           const fg_tensor *rstd, const fg_tensor *sums,
                                                           const fg_tensor *dx, const fg_tensor *dr,
                                                           const fg_tensor *dw, const fg_tensor *db, int accumulate);

/* y = x·mask/(1 − p), and its backward dx = dy·mask/(1 − p) with the same (seed, offset)
 * (accumulate adds into dx). Any shape whose last dim is contiguous. */
FG_NODISCARD FG_API fg_status fg_dropout_forward(fg_context *ctx, const fg_dropout_options *opt, const fg_tensor *x,
                                                 const fg_tensor *y);
FG_NODISCARD FG_API fg_status fg_dropout_backward(fg_context *ctx, const fg_dropout_options *opt,
                                                  const fg_tensor *dy, const fg_tensor *dx, int accumulate);

/* Options of RevIN (FG_OP_REVIN_*), the reversible instance normalization of PatchTST's
 * input and output. */
typedef struct fg_revin_options {
    double eps;                   /* >= 0; 0 means 1e-5                                   */
    int32_t denorm;               /* forward / backward: 0 normalize, 1 denormalize       */
    int32_t subtract_last;        /* stats: mean holds the last time step instead         */
} fg_revin_options;

/* x [..., L, C]: per instance (the leading dims) and channel, over the L time steps:
 *   stats      mean (or x[..., L−1, c] with subtract_last), stdev = √(var + eps), var biased
 *   normalize  y = (x − mean)/stdev·w + b
 *   denorm     y = (x − b)/(w + eps²)·stdev + mean      (x: the model's output [..., T, C])
 * mean, stdev: x's shape without its L dim, f32 (f64 for f64); w, b: [C] of x's dtype, absent =
 * 1 / 0. The backward treats mean and stdev as constants, as PatchTST's RevIN (which detaches
 * them) does: dx = dy·w/stdev (denorm: dy·stdev/(w + eps²)), dw and db summed over the
 * instances and time steps. Each of dx, dw, db may be NULL; dw, db: w's dtype or f32. */
FG_NODISCARD FG_API fg_status fg_revin_stats(fg_context *ctx, const fg_revin_options *opt, const fg_tensor *x,
                                             const fg_tensor *mean, const fg_tensor *stdev);
FG_NODISCARD FG_API fg_status fg_revin_forward(fg_context *ctx, const fg_revin_options *opt, const fg_tensor *x,
                                               const fg_tensor *w, const fg_tensor *b, const fg_tensor *mean,
                                               const fg_tensor *stdev, const fg_tensor *y);
FG_NODISCARD FG_API fg_status fg_revin_backward(fg_context *ctx, const fg_revin_options *opt, const fg_tensor *dy,
                                                const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                                const fg_tensor *mean, const fg_tensor *stdev, const fg_tensor *dx,
                                                const fg_tensor *dw, const fg_tensor *db, int accumulate);

/* ------------------------------------------------------------------ Attention */
/* Multi-head scaled dot-product attention, forward and backward, without an [L, L] buffer
 * (unless the caller asks for the scores). For each sequence b and head h, query rows i and key
 * columns j in [0, L):
 *   s_ij  = scale·q_i·k_j + scores_in_ij           (scores_in optional: a bias, or the previous
 *                                                   layer's scores in PatchTST's residual attention)
 *   masked (s_ij = −∞) where j > i (causal) or j >= lengths[b] (key padding)
 *   lse_i = log Σ_j exp(s_ij),   p_ij = exp(s_ij − lse_i)
 *   p̃_ij  = p_ij·keep_ij/(1 − dropout_p)           (dropout on the probabilities; see below)
 *   o_i   = Σ_j p̃_ij·v_j
 * scores_out (optional) receives s, −∞ at the masked positions: the next layer's scores_in.
 * A row with no unmasked key (lengths[b] = 0, or scores_in −∞ across it) gives o = 0, lse = −∞
 * and no gradient. The dropout mask is src/core/rng.h's attention form (the normalization
 * family's generator, 16 bits an element, eight elements a Philox call): the element index of
 * (b, h, i, j) is ((b·H + h)·L + i)·L + j, the flat index into the logical [B, H, L, L]
 * probabilities, under the options' (seed, offset); an element is kept when its bits / 2^16 >= p.
 * The backward regenerates it.
 *
 * q, k, v, o, do, dq, dk, dv: [B, H, L, hd], one dtype (f32, f16, bf16, f64), any strides (a
 * packed [B, L, 3, H, hd] projection is read in place as three strided views; a zero stride
 * broadcasts an input). q and k (and dq, dk with them) may come in P pieces, [B, H, L, P, hd]:
 * then q_i·k_j = Σ_p q_ip·k_jp, and dq, dk hold each piece's gradient. PatchTST's residual
 * attention is this sum: layer l's carried scores are scale·Σ_(m<=l) q_m·k_mᵀ, so with the
 * layers' q (and k) as the pieces of one strided view no layer keeps or reads an [L, L] buffer
 * (on CUDA only the short-sequence kernels take pieces: L <= 64, hd <= 8; other sizes are
 * FG_ERR_UNSUPPORTED there, the CPU takes any). scores_in, scores_out, dscores, dscores_in: [B, H, L, L], all of one
 * dtype: q's or f32 (f64 for f64). lse: [B, H, L] contiguous, f32 (f64 for f64). lengths: [B],
 * i32 or i64, each in [0, L]: a value outside makes every output of that sequence NaN and
 * fg_context_check() return FG_ERR_DEVICE_VALUE with the sequence (the op does not read the
 * values on the host). Sums are f32 (f64 for f64), in a fixed order: deterministic. On CUDA
 * the tensor-core kernels round p̃ and ds to the 16-bit dtype before the products that take them,
 * and the short-sequence backward with 16-bit scores rounds them to the scores' type before the
 * dk, dv sums (as FlashAttention does); the sums stay f32. The kernel (fg_plan_info.kernel): the CPU backend's rows, blocked per (sequence, head) with O(L·hd)
 * memory per thread; on CUDA a whole-sequence kernel for short sequences (L <= 128, hd <= 64,
 * every dtype), a tiled online-softmax (flash) kernel on tensor cores for f16 / bf16 with hd
 * 32, 64 or 128, and a tiled kernel for the rest. Inf or NaN in masked inputs: the k and v rows
 * at or past lengths[b] never reach a result; a causally masked key's k or v (or the q or do of
 * a row that does not see it) may, on CUDA, where a masked score's weight is an exact 0 in a sum
 * and 0·Inf is NaN, as in PyTorch's matmul → softmax → matmul; the CPU backend skips them. */
typedef struct fg_attention_options {
    double scale;            /* finite; 0 means 1/√hd (1 when hd = 0; hd: the last dim)   */
    int32_t causal;          /* 0 or 1                                                     */
    double dropout_p;        /* in [0, 1)                                                  */
    uint64_t seed, offset;   /* the dropout's generator                                    */
} fg_attention_options;

/* The forward: o and lse (what the backward needs besides the inputs), and scores_out when
 * given. lengths and scores_in may be NULL. */
FG_NODISCARD FG_API fg_status fg_attention_forward(fg_context *ctx, const fg_attention_options *opt,
                                                   const fg_tensor *q, const fg_tensor *k, const fg_tensor *v,
                                                   const fg_tensor *lengths, const fg_tensor *scores_in,
                                                   const fg_tensor *o, const fg_tensor *lse,
                                                   const fg_tensor *scores_out);
/* The backward, the probabilities recomputed from lse: with dp̃_ij = do_i·v_j, dp = dp̃·keep/(1 − p),
 * D_i = do_i·o_i and G = dscores (the gradient scores_out received; NULL: none),
 *   ds_ij = p_ij·(dp_ij − D_i) + G_ij   (0 at masked positions)
 *   dq_i = scale·Σ_j ds_ij·k_j,  dk_j = scale·Σ_i ds_ij·q_i,  dv_j = Σ_i p̃_ij·do_i,  dscores_in = ds
 * Each of dq, dk, dv, dscores_in may be NULL (dscores_in needs scores_in); accumulate adds into
 * every requested output. opt, lengths and scores_in as in the forward. */
FG_NODISCARD FG_API fg_status fg_attention_backward(fg_context *ctx, const fg_attention_options *opt,
                                                    const fg_tensor *d_o, const fg_tensor *dscores,
                                                    const fg_tensor *q, const fg_tensor *k, const fg_tensor *v,
                                                    const fg_tensor *lengths, const fg_tensor *scores_in,
                                                    const fg_tensor *o, const fg_tensor *lse, const fg_tensor *dq,
                                                    const fg_tensor *dk, const fg_tensor *dv,
                                                    const fg_tensor *dscores_in, int accumulate);

/* ------------------------------------------------------------------ Series */
/* The pieces of a patch-based forecaster (PatchTST) that no other family provides: patching,
 * the point-forecast losses, and the gather of training windows.
 *
 * Patching: x [..., L] (any strides; f32, f16, bf16, + f64 on the CPU) → y [..., P, S]
 * (contiguous, x's dtype), with S = patch_len and P = ⌊(L + pad_end − S)/stride⌋ + 1 patches:
 *   y[..., p, j] = x[..., min(p·stride + j, L − 1)]
 * that is, pad_end copies of the last step appended (ReplicationPad1d((0, pad_end))), then
 * unfold(S, stride): PatchTST's look-back 336, S 16, stride 8, pad_end 8 give 42 patches. The
 * backward is the overlap-add: dx[..., t] = the sum of dy over the (p, j) that read step t (x's
 * strides; accumulate adds). Each dx element sums its contributors in a fixed order (the patches
 * in order, then the padded positions for the last step): deterministic, no atomics, sums in
 * f32 (f64 for f64). */
typedef struct fg_patch_options {
    int64_t patch_len;      /* S >= 1; 0 means 16                                       */
    int64_t stride;         /* >= 1; 0 means 8                                          */
    int64_t pad_end;        /* >= 0: replicated steps after the last one                */
} fg_patch_options;

FG_NODISCARD FG_API fg_status fg_patch_forward(fg_context *ctx, const fg_patch_options *opt, const fg_tensor *x,
                                               const fg_tensor *y);
FG_NODISCARD FG_API fg_status fg_patch_backward(fg_context *ctx, const fg_patch_options *opt, const fg_tensor *dy,
                                                const fg_tensor *dx, int accumulate);

/* Point-forecast losses of d = pred − target, element by element:
 *   MSE    ℓ = d²                                     ∂ℓ/∂pred = 2d
 *   MAE    ℓ = |d|                                    sign(d) (0 at d = 0)
 *   HUBER  ℓ = ½d² for |d| ≤ δ, else δ(|d| − ½δ)      d, or δ·sign(d)
 * NaN in gives NaN out. */
typedef enum fg_loss_kind {
    FG_LOSS_MSE = 0,
    FG_LOSS_MAE = 1,
    FG_LOSS_HUBER = 2
} fg_loss_kind;

typedef struct fg_regression_loss_options {
    fg_loss_kind kind;
    fg_reduction reduction; /* mean (the default): Σℓ/n; sum; none: ℓ per element      */
    double delta;           /* Huber's δ > 0; 0 means 1                                 */
    double grad_scale;      /* dpred is the gradient of grad_scale·loss; 0 means 1      */
} fg_regression_loss_options;

/* One pass: the loss and, when dpred is given, its gradient (of the reduced loss; for
 * reduction none, of Σℓ). pred, target: one shape and dtype (f32, f16, bf16, + f64 on the CPU),
 * contiguous. loss: f32 (f64 for f64), [1]-element for mean / sum, pred's shape for none. dpred:
 * pred's shape, pred's dtype or f32; accumulate adds into it (the loss is always written). The
 * reduction sums fixed chunks of 4096 elements in f32 (f64 for f64) and the chunks' sums in order
 * in f64: the same bits on every run and every thread count. The mean of no elements is NaN. */
FG_NODISCARD FG_API fg_status fg_regression_loss(fg_context *ctx, const fg_regression_loss_options *opt,
                                                 const fg_tensor *pred, const fg_tensor *target,
                                                 const fg_tensor *loss, const fg_tensor *dpred, int accumulate);

/* Windows of a multivariate series, gathered on the device: y[b, t, c] = series[starts[b] + t, c]
 * for t < W. series [T, C] (any strides; f32, f16, bf16, + f64 on the CPU), starts [B] i32 or i64
 * (contiguous), y [B, W, C] contiguous, series' dtype; W <= T. A training loop keeps its data on
 * the device and gathers each batch from an index array (a slice of the epoch's order) instead of
 * copying windows from the host every step; the targets are the same call on the series from row
 * `look-back` on. A start outside [0, T − W] makes its window NaN and fg_context_check() return
 * FG_ERR_DEVICE_VALUE with the first such b (the op does not read the starts on the host). */
FG_NODISCARD FG_API fg_status fg_series_windows(fg_context *ctx, const fg_tensor *series, const fg_tensor *starts,
                                                const fg_tensor *y);

/* ------------------------------------------------------------------ Transformer encoder layer */
/* One call runs a whole encoder layer forward, one call its whole backward, from a cache of saved
 * activations the caller holds. x, y, dx, dy: [B, L, d] (contiguous; f32, f16, bf16, + f64 on the
 * CPU), one dtype with every weight. With A = attention, F = the FFN, N1 / N2 the layer's norms:
 *   pre-norm  (FG_ENCODER_PRE_LAYER, FG_ENCODER_PRE_RMS):     h = x + D(A(N1(x))),  y = h + D(F(N2(h)))
 *   post-norm (FG_ENCODER_POST_LAYER, FG_ENCODER_POST_BATCH): h = N1(x + D(A(x))),  y = N2(h + D(F(h)))
 *   A(u) = concat_heads(attention(u·W_qᵀ + b_q, u·W_kᵀ + b_k, u·W_vᵀ + b_v))·W_oᵀ + b_o
 *   F(u) = D_ff(act(u·W_1ᵀ + b_1))·W_2ᵀ + b_2
 * D: dropout with p = dropout on each residual branch (torch's dropout1 / dropout2, PatchTST's
 * dropout_attn / dropout_ffn), D_ff with p = dropout_ffn after the activation; the attention's
 * probabilities drop with p = dropout_attn (fg_attention_forward's definition). The attention is
 * fg_attention_forward's: scale (0 = 1/√hd, hd = d/heads), causal, key padding by lengths [B],
 * and PatchTST's residual attention (residual_scores: the previous layer's scores added, this
 * layer's written for the next). LayerNorm and RMSNorm are fg_norm_forward's over d; BatchNorm is
 * fg_batch_norm_forward's over all B·L tokens per channel (running statistics updated in training).
 * The layer is torch.nn.TransformerEncoderLayer(batch_first = True) (norm_first: pre-norm, else
 * post-norm LayerNorm) and the reference PatchTST backbone's TSTEncoderLayer (BatchNorm post-norm,
 * residual attention, separate W_Q, W_K, W_V). Deterministic: the same bits on every run. */
typedef enum fg_encoder_norm {
    FG_ENCODER_PRE_LAYER = 0,   /* pre-norm LayerNorm (torch norm_first = True)              */
    FG_ENCODER_PRE_RMS = 1,     /* pre-norm RMSNorm                                          */
    FG_ENCODER_POST_LAYER = 2,  /* post-norm LayerNorm (torch norm_first = False)            */
    FG_ENCODER_POST_BATCH = 3   /* post-norm BatchNorm over every token (PatchTST)           */
} fg_encoder_norm;

/* What the forward keeps for the backward (the cache); the rest the backward recomputes. */
typedef enum fg_encoder_save {
    FG_ENCODER_SAVE_ALL = 0,    /* everything the backward reads (for the FFN's activation, f16
                                   and bf16 layers keep its slope with the hidden's dropout mask
                                   applied, so the backward's g = dy ⊙ s̃ is one multiply; f32
                                   and f64 layers keep the pre-activation)                      */
    FG_ENCODER_SAVE_LESS = 1,   /* no FFN slope or pre-activation [B·L, d_ff] (the pre-activation
                                   recomputed from N2's output by one GEMM in the backward):
                                   memory for time                                              */
    FG_ENCODER_SAVE_MIN = 2     /* only qkv, o, lse, the residual streams and the statistics: the
                                   norms' outputs, the FFN hidden and its slope (pre) are
                                   recomputed in the backward (one more FFN-up product and the
                                   pre-norms' applications); the forward's temporaries live in
                                   the caller's workspace (fg_encoder_layer_forward_ws), so a
                                   training step holds at most cache + workspace              */
} fg_encoder_save;

/* The layer's descriptor. Zero-initialized fields are the defaults where a default is named. */
typedef struct fg_encoder_layer_desc {
    int64_t d_model;            /* d >= 1                                                    */
    int64_t heads;              /* >= 1, divides d                                           */
    int64_t d_ff;               /* >= 1                                                      */
    fg_activation activation;   /* FG_ACT_GELU, FG_ACT_GELU_TANH, FG_ACT_RELU or FG_ACT_SILU  */
    fg_encoder_norm norm;
    double norm_eps;            /* >= 0; 0 means 1e-5                                        */
    double bn_momentum;         /* BatchNorm: in [0, 1]; 0 means 0.1                          */
    double attn_scale;          /* finite; 0 means 1/√hd                                     */
    int32_t causal;             /* 0 or 1                                                    */
    int32_t residual_scores;    /* 1: scores_in / scores_out (PatchTST's residual attention) */
    double dropout;             /* on each residual branch, in [0, 1)                        */
    double dropout_ffn;         /* after the FFN's activation, in [0, 1)                     */
    double dropout_attn;        /* on the attention probabilities, in [0, 1)                 */
    fg_encoder_save save;
    double dropout_proj;        /* after the attention's output projection, in [0, 1): PatchTST
                                   drops there (to_out's dropout) and again on the branch; the
                                   two independent masks are one of rate
                                   1 − (1 − dropout)(1 − dropout_proj) at site 1            */
} fg_encoder_layer_desc;

/* The weights (and, as the same struct, their gradients), in the layout PyTorch modules hold:
 * W [out, in] row-major, each a contiguous tensor of the layer's dtype. An absent tensor (rank 0,
 * as zero-initialized) is: a bias that is not there (0), a norm without affine weight / bias
 * (1 / 0). The q, k, v projections are either packed (w_qkv [3d, d] with q, k, v rows in that
 * order, b_qkv [3d]: nn.MultiheadAttention's in_proj_weight / in_proj_bias) or separate (w_q,
 * w_k, w_v [d, d], b_q, b_k, b_v [d]: PatchTST's W_Q, W_K, W_V), never both. BatchNorm's running
 * statistics ([d], f32 (f64 for f64) or the layer's dtype) are required for post-norm BatchNorm and updated by a
 * training forward; in a gradient struct they are ignored. */
typedef struct fg_encoder_layer_params {
    fg_tensor w_qkv, b_qkv;
    fg_tensor w_q, b_q, w_k, b_k, w_v, b_v;
    fg_tensor w_o, b_o;                   /* [d, d], [d]                                     */
    fg_tensor w_1, b_1;                   /* [d_ff, d], [d_ff]                                */
    fg_tensor w_2, b_2;                   /* [d, d_ff], [d]                                   */
    fg_tensor norm1_w, norm1_b;           /* [d]: the attention block's norm                 */
    fg_tensor norm2_w, norm2_b;           /* [d]: the FFN block's norm                       */
    fg_tensor running_mean1, running_var1, running_mean2, running_var2;
} fg_encoder_layer_params;

/* How one call runs. train = 0: evaluation (no dropout, BatchNorm's running statistics, no
 * running update); a cache is then optional. Dropout site k (0: the attention probabilities,
 * 1: the attention branch, 2: the FFN hidden, 3: the FFN branch) draws from (seed, 4·offset + k):
 * give each layer and step its own (seed, offset); the backward regenerates the masks from them. */
typedef struct fg_encoder_layer_run {
    int32_t train;
    uint64_t seed, offset;
} fg_encoder_layer_run;

/* The cache's and the workspace's sizes in bytes for B sequences of L tokens of dtype (the
 * workspace: the backward's; with FG_ENCODER_SAVE_MIN also the training forward's, the larger of
 * the two).
 * The cache holds what the backward reads, laid out in one walk (the layout is internal and may
 * change between versions: treat it as opaque bytes, kept from a forward to its backward). */
FG_NODISCARD FG_API fg_status fg_encoder_layer_sizes(const fg_encoder_layer_desc *desc, fg_dtype dtype,
                                                     int64_t B, int64_t L, size_t *cache_bytes,
                                                     size_t *workspace_bytes);

/* The forward: y [B, L, d] (may not overlap x), and scores_out [B, H, L, L] when the descriptor
 * has residual_scores (optional even then; the dtype of scores_in, or the layer's dtype or f32).
 * lengths [B] (i32 / i64, optional): keys at positions >= lengths[b] are masked (torch's
 * src_key_padding_mask with padding at the end). scores_in: optional, only with residual_scores.
 * cache: device (context) memory of at least cache_bytes, 16-byte aligned; NULL allowed when
 * run->train = 0 (the forward then keeps its temporaries in the context's own workspace, grown
 * to hold them beside what its parts need; so does an evaluation with FG_ENCODER_SAVE_MIN, whose
 * cache is sized for training and is not used). Every tensor is contiguous. */
FG_NODISCARD FG_API fg_status fg_encoder_layer_forward(fg_context *ctx, const fg_encoder_layer_desc *desc,
                                                       const fg_encoder_layer_run *run, const fg_tensor *x,
                                                       const fg_tensor *lengths, const fg_tensor *scores_in,
                                                       const fg_encoder_layer_params *params, const fg_tensor *y,
                                                       const fg_tensor *scores_out, void *cache,
                                                       size_t cache_bytes);
/* The forward with a workspace of at least fg_encoder_layer_sizes' workspace_bytes (context memory,
 * 16-byte aligned; its contents are not kept): where FG_ENCODER_SAVE_MIN's training forward places
 * its temporaries (the norms' outputs, the FFN hidden). Other configurations ignore it (NULL allowed);
 * fg_encoder_layer_forward refuses FG_ENCODER_SAVE_MIN in training (FG_ERR_NULL_POINTER: no
 * workspace). */
FG_NODISCARD FG_API fg_status fg_encoder_layer_forward_ws(fg_context *ctx, const fg_encoder_layer_desc *desc,
                                                          const fg_encoder_layer_run *run, const fg_tensor *x,
                                                          const fg_tensor *lengths, const fg_tensor *scores_in,
                                                          const fg_encoder_layer_params *params, const fg_tensor *y,
                                                          const fg_tensor *scores_out, void *cache, size_t cache_bytes,
                                                          void *workspace, size_t workspace_bytes);

/* The backward of a training forward with the same descriptor, run options, x, lengths,
 * scores_in, params and cache (unchanged since): from dy (and dscores_out, the gradient the
 * scores_out received, or NULL) to dx (optional), dscores_in (optional, needs scores_in) and
 * every parameter gradient present in grads (a gradient tensor present where its parameter is
 * absent is refused; grads NULL: none). Each gradient has its parameter's shape and the layer's
 * dtype. accumulate adds into every requested output. workspace: context memory of at least
 * workspace_bytes, 16-byte aligned. */
FG_NODISCARD FG_API fg_status fg_encoder_layer_backward(fg_context *ctx, const fg_encoder_layer_desc *desc,
                                                        const fg_encoder_layer_run *run, const fg_tensor *dy,
                                                        const fg_tensor *dscores_out, const fg_tensor *x,
                                                        const fg_tensor *lengths, const fg_tensor *scores_in,
                                                        const fg_encoder_layer_params *params,
                                                        const void *cache, size_t cache_bytes,
                                                        const fg_tensor *dx, const fg_tensor *dscores_in,
                                                        const fg_encoder_layer_params *grads, int accumulate,
                                                        void *workspace, size_t workspace_bytes);

/* A stack of `layers` encoder layers of one descriptor (torch.nn.TransformerEncoder, PatchTST's
 * TSTEncoder): layer i's output is layer i + 1's input; params and grads are arrays of `layers`
 * (1 … 256; grads NULL: none). Layer i runs as fg_encoder_layer_forward / _backward with (seed, offset + i):
 * give each step offsets `layers` apart. With residual_scores, layer i's scores in are layer i − 1's
 * scores (layer 0: none), carried as fg_attention_forward's pieces: the stack keeps the layers' q
 * and k side by side in its cache and runs layer i's attention on the i + 1 layers' pieces, so no
 * [B, H, L, L] scores exist (on CUDA this takes the short-sequence attention: L <= 64, hd <= 8;
 * other sizes are FG_ERR_UNSUPPORTED there). The cache (layers' caches and their inputs) and the
 * workspace (the backward's; with FG_ENCODER_SAVE_MIN the forward's too) are context memory of
 * fg_encoder_sizes' bytes, 16-byte aligned; the cache is required in evaluation too. x, y, dx, dy:
 * [B, L, d] contiguous. accumulate adds into dx and every gradient. */
FG_NODISCARD FG_API fg_status fg_encoder_sizes(const fg_encoder_layer_desc *desc, int64_t layers, fg_dtype dtype,
                                               int64_t B, int64_t L, size_t *cache_bytes, size_t *workspace_bytes);
FG_NODISCARD FG_API fg_status fg_encoder_forward(fg_context *ctx, const fg_encoder_layer_desc *desc, int64_t layers,
                                                 const fg_encoder_layer_run *run, const fg_tensor *x,
                                                 const fg_tensor *lengths, const fg_encoder_layer_params *params,
                                                 const fg_tensor *y, void *cache, size_t cache_bytes, void *workspace,
                                                 size_t workspace_bytes);
FG_NODISCARD FG_API fg_status fg_encoder_backward(fg_context *ctx, const fg_encoder_layer_desc *desc, int64_t layers,
                                                  const fg_encoder_layer_run *run, const fg_tensor *dy,
                                                  const fg_tensor *x, const fg_tensor *lengths,
                                                  const fg_encoder_layer_params *params, const void *cache,
                                                  size_t cache_bytes, const fg_tensor *dx,
                                                  const fg_encoder_layer_params *grads, int accumulate,
                                                  void *workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif /* FASTGRAD_H */

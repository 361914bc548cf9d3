/*
 * cuda_internal.h — what the CUDA backend's files share: the per-context CUDA state
 * (stream, cuBLASLt handle, device error flag, cached GEMM algorithm choices) and a
 * guard that makes the context's device current for one call and restores the
 * caller's afterwards (no hidden global device).
 */
#ifndef FG_CUDA_INTERNAL_H
#define FG_CUDA_INTERNAL_H

#include "../core/internal.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

/* cuBLASLt choices kept per context: an open-addressed table (a key's home slot from its hash,
   FG_LT_PROBE slots searched from there), large enough for every product of a training step
   (each shape once per epilogue and alignment) so a step's products never evict each other. */
#define FG_LT_CACHE 512
#define FG_LT_PROBE 8
/* The GEMM primitive's skinny product takes at most this many outputs a product (m·n; gemm.cu). */
#define FG_SKINNY_MAX_OUTS 2048

typedef struct fg_lt_key {
    int32_t dtype, ctype, tf32, op_a, op_b, epilogue;
    int64_t rows_a, cols_a, ld_a, rows_b, cols_b, ld_b, rows_c, cols_c, ld_c;
    int64_t batch, bs_a, bs_b, bs_c;
    uint32_t align_a, align_b, align_c, align_bias;
} fg_lt_key;

typedef struct fg_lt_entry {
    bool used;
    fg_lt_key key;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;   /* what the algorithm needs */
    size_t limit;       /* the workspace it was chosen under */
    bool found; /* false: the heuristic had no algorithm for this key */
    /* the descriptors, made once per entry (making them on every call cost host time) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
} fg_lt_entry;


#ifdef __cplusplus
extern "C" {
#endif
void fg_lt_entry_clear(fg_lt_entry *e);
/* The CUDA backend's kernels, reached through its table (src/cuda/backend.cu). */
fg_status fg_cuda_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws, size_t ws_bytes, bool run);
fg_status fg_cuda_elementwise(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws, size_t ws_bytes,
                              bool run);
fg_status fg_cuda_adamw(fg_context *ctx, const fg_adamw_run *r);
/* Scratch the log-prob GRAD step needs for a tile of `rows` × `cols` (column partial sums). */
size_t fg_cuda_logp_scratch(int64_t rows, int64_t cols);
fg_status fg_cuda_logp(fg_context *ctx, const fg_logp_call *c);
/* The linear + activation steps (the scratch of GRAD's per-slab db partials): */
size_t fg_cuda_act_scratch(fg_dtype dtype, int64_t rows, int64_t cols);
fg_status fg_cuda_act(fg_context *ctx, const fg_act_call *c);
/* Whether the TILE steps take this shape (pointers then need 16-byte alignment), and the
 * scratch TILE_GRAD needs for db's per-row-tile sums (fg_cuda_act_scratch covers it). */
bool fg_cuda_act_tile_fits(fg_dtype dtype, int64_t k, int64_t cols);
size_t fg_cuda_act_tile_scratch(int64_t rows, int64_t cols);
fg_status fg_cuda_act_tile(fg_context *ctx, const fg_act_call *c);
/* TILE_BACKWARD: whether it takes the shape (any alignment), and its scratch (per-slab dW and
 * db partial sums; the slab count is the device's SM count, capped by the row tiles) */
bool fg_cuda_act_bwd_tile_fits(fg_dtype dtype, int act, int64_t k, int64_t cols);
size_t fg_cuda_act_bwd_tile_scratch(int device, int64_t rows, int64_t k, int64_t cols, int64_t *parts);
fg_status fg_cuda_act_bwd_tile(fg_context *ctx, const fg_act_call *c);
bool fg_cuda_act_bwd90_fits(int device, fg_dtype dtype, int64_t k, int64_t cols);
fg_status fg_cuda_act_bwd90(fg_context *ctx, const fg_act_call *c);
bool fg_cuda_act_gemm_fits(int device, fg_dtype dtype, fg_act_step step, int64_t rows, int64_t k, int64_t cols);
fg_status fg_cuda_act_gemm(fg_context *ctx, const fg_act_call *c);
/* GEMM_INPUT_FORM's scratch (rows N, k M): its unit flags, and db's per-row-tile sums; and the
 * activations it forms g for (where it beats the gradient pass + plain product) */
size_t fg_cuda_act_form_scratch(int64_t rows, int64_t k, bool want_db);
bool fg_cuda_act_form_takes(int act);
/* The short-K backward kernels' slabs (linear_act_bwd_tile.cu, linear_act_bwd90.cu): `rows` in
   32-row tiles, one slab of `per` consecutive tiles a block; slabs: the SM count, capped by the
   tiles (0 when there are no rows) */
void fg_cuda_act_slabs(int device, int64_t rows, int64_t *slabs, int64_t *per);
/* f32 products as three TF32 tensor-core passes of split operands (gemm_split.cu): whether
 * the kernel takes the problem (running: with its pointers), and the product itself (planning,
 * run = false, fills info: its name and workspace). */
bool fg_cuda_split_takes(int device, const fg_gemm *g, bool run);
fg_status fg_cuda_split_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws, size_t ws_bytes,
                             bool run);
/* ... and its weight-gradient form (dW = dyᵀ·x over many tokens: ranges of the reduction summed in
 * order) */
bool fg_cuda_split_wgrad_takes(int device, const fg_gemm *g, bool run);
fg_status fg_cuda_split_wgrad(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws, size_t ws_bytes,
                              bool run);
/* Turns a CUDA error into FG_ERR_BACKEND with the call named. */
fg_status fg_cuda_fail(cudaError_t err, const char *what);
#ifdef __cplusplus
}
#endif

struct fg_cuda_state {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    unsigned long long *flag; /* device: [0] error code, [1] ~smallest offending index (internal.h) */
    fg_lt_entry cache[FG_LT_CACHE];
};

#ifdef __cplusplus
class fg_device_guard {
  public:
    explicit fg_device_guard(int device) {
        if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
        if (prev_ != device) cudaSetDevice(device);
    }
    ~fg_device_guard() {
        if (prev_ >= 0) cudaSetDevice(prev_);
    }

  private:
    int prev_;
};
#endif

/* The series family's steps (src/cuda/series.cu): planning (run = false) fills c->name. */
extern "C" fg_status fg_cuda_series(fg_context *ctx, fg_series_call *c, bool run);

/* The normalization family's steps (src/cuda/norm.cu): planning (run = false) fills c->need and
 * c->name; running, it records each kernel it launches. */
extern "C" fg_status fg_cuda_norm(fg_context *ctx, fg_norm_call *c, bool run);

/* The attention family (src/cuda/attention.cu): the plan hook picks the path (short sequences,
 * tensor cores, tiled) and names its kernels; the run launches them and records those names. */
extern "C" fg_status fg_cuda_attn_plan(fg_context *ctx, const fg_attn_problem *p, fg_attn_path *path);
extern "C" fg_status fg_cuda_attn(fg_context *ctx, const fg_attn_call *c);

/* Whether the device is a 9.0 one (Hopper: what the sm_90a kernels run on). */
static inline bool fg_cuda_is_sm90(int device) {
    int major = 0, minor = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
           minor == 0;
}

#endif

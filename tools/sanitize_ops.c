/*
 * sanitize_ops.c — every own CUDA kernel of the library, launched once at a small shape, for
 * compute-sanitizer's racecheck and synccheck (scripts/gpu-check.sh builds it against
 * build-gpu/ and runs it under both tools). The test drivers are too slow under those tools;
 * this program gives them each kernel's barriers, shared memory and asynchronous copies in a
 * few calls: the GEMM primitive's GEMV / column-sum / rank-1 / axpby kernels, the elementwise
 * fast, general and reduction kernels, the linear + activation passes, tile kernels, one-kernel
 * backwards and the sm_90a GEMM (all three products, g formed, the slope form), the log-prob
 * row, tile, single-block and cast kernels (deterministic column sums included), the
 * normalization family's row, column, apply, dropout and RevIN kernels, attention's
 * whole-sequence, tiled and flash kernels (forward and backward, the row dot), and AdamW.
 *
 * Each case names the kernel it is there for, and the program fails when the backend launched
 * something else (fg_context_last_kernels): a changed dispatch rule cannot silently drop a
 * kernel from the sanitizers. Outputs are NaN-poisoned first and must come back finite (the
 * drivers check the values). Prints "sanitize_ops: ok" last when every case ran as named.
 *
 *   cc -std=gnu11 -O2 -DFG_TEST_HAVE_CUDA=1 [-DFG_TEST_HAVE_SM90A=1] -Iinclude -Itests \
 *      -I$CUDA/include tools/sanitize_ops.c tests/harness.c -Lbuild-gpu -lfastgrad \
 *      -L$CUDA/lib64 -lcudart -lm -o sanitize_ops
 *   compute-sanitizer --tool racecheck ./sanitize_ops [group ...]
 *
 * Groups (all when none is named): gemm, elementwise, act, logp, norm, attention, adamw.
 */
#include "harness.h"

#include <math.h>

static fg_context *ctx;
static int failed;

/* What the last op launched must contain `want` (NULL: the op's kernels are not named). */
static void launched(const char *label, fg_status st, const char *want) {
    const char *ran = fg_context_last_kernels(ctx);
    printf("%-44s %s\n", label, st == FG_OK ? ran : fg_last_error());
    if (st != FG_OK) {
        printf("FAIL %s: %s (%s)\n", label, fg_status_string(st), fg_last_error());
        failed++;
    } else if (want && !strstr(ran, want)) {
        printf("FAIL %s: launched '%s', not the '%s' this case is for\n", label, ran, want);
        failed++;
    }
}

static void written(const char *label, th_operand *o) {
    double *v = malloc(sizeof(double) * (size_t)(o->n + 1));
    th_get(&o->buf, &o->t, v);
    int64_t bad = -1;
    for (int64_t i = 0; i < o->n && bad < 0; i++)
        if (!isfinite(v[i])) bad = i;
    if (bad >= 0) {
        printf("FAIL %s: element %lld of %lld is %g (not written?)\n", label, (long long)bad, (long long)o->n, v[bad]);
        failed++;
    }
    free(v);
}

static th_operand make(fg_dtype dt, int rank, const int64_t *shape, int layout) {
    th_operand o = th_make(FG_BACKEND_CUDA, dt, rank, shape, layout);
    th_randomize(&o);
    return o;
}

static th_operand out(fg_dtype dt, int rank, const int64_t *shape, int layout) {
    th_operand o = th_make(FG_BACKEND_CUDA, dt, rank, shape, layout);
    th_poison(&o.buf);
    return o;
}

/* ------------------------------------------------------------------ the GEMM primitive */

static void gemm_kernels(void) {
    const fg_dtype dt = FG_BF16;
    {   /* one row: a GEMV; dx of one row and db reduce along columns (slices + finish) */
        int64_t x1[2] = {1, 1000}, w[2] = {300, 1000}, b[1] = {300}, y1[2] = {1, 300};
        th_operand X = make(dt, 2, x1, 0), W = make(dt, 2, w, 0), B = make(dt, 1, b, 0), Y = out(dt, 2, y1, 0);
        launched("linear_forward one row", fg_linear_forward(ctx, &X.t, &W.t, &B.t, &Y.t), "gemv_dot<");
        written("linear_forward one row", &Y);
        th_operand DX = out(dt, 2, x1, 0);
        launched("linear_backward_input one row", fg_linear_backward_input(ctx, &Y.t, &W.t, &DX.t, 0), "gemv_");
        written("linear_backward_input one row", &DX);
        int64_t dy[2] = {1000, 300};
        th_operand DY = make(dt, 2, dy, 0), DB = out(dt, 1, b, 0);
        launched("linear_backward_bias (column sums)", fg_linear_backward_bias(ctx, &DY.t, &DB.t, 0), "gemv_");
        written("linear_backward_bias (column sums)", &DB);
        th_drop(&X), th_drop(&W), th_drop(&B), th_drop(&Y), th_drop(&DX), th_drop(&DY), th_drop(&DB);
    }
    {   /* a weight gradient of few outputs over many rows: the skinny product (slabs + finish) */
        int64_t dy[2] = {5000, 16}, x[2] = {5000, 24}, w[2] = {16, 24};
        th_operand DY = make(dt, 2, dy, 0), X = make(dt, 2, x, 0), DW = out(dt, 2, w, 0);
        launched("linear_backward_weight skinny", fg_linear_backward_weight(ctx, &DY.t, &X.t, &DW.t, 0), "skinny<");
        written("linear_backward_weight skinny", &DW);
        th_drop(&DY), th_drop(&X), th_drop(&DW);
    }
    {   /* ... batched, each batch its own output (matmul_backward_other of a 2-D a against a batch) */
        int64_t a[2] = {5000, 16}, dc[3] = {3, 5000, 16}, db[3] = {3, 16, 16};
        th_operand A = make(dt, 2, a, 0), DC = make(dt, 3, dc, 0), DB = out(dt, 3, db, 0);
        launched("matmul_backward_other batched skinny", fg_matmul_backward_other(ctx, &A.t, &DC.t, &DB.t, 0),
                 " batched");
        written("matmul_backward_other batched skinny", &DB);
        th_drop(&A), th_drop(&DC), th_drop(&DB);
    }
    {   /* K = 0: y = b, written by axpby_2d */
        int64_t x[2] = {37, 0}, w[2] = {40, 0}, b[1] = {40}, y[2] = {37, 40};
        th_operand X = make(dt, 2, x, 0), W = make(dt, 2, w, 0), B = make(dt, 1, b, 0), Y = out(dt, 2, y, 0);
        launched("linear_forward K = 0", fg_linear_forward(ctx, &X.t, &W.t, &B.t, &Y.t), "axpby_2d<");
        written("linear_forward K = 0", &Y);
        th_drop(&X), th_drop(&W), th_drop(&B), th_drop(&Y);
    }
    {   /* a low-precision batch sum: f32 buffer in and out through axpby_2d (a's batches a row apart:
           batches side by side along k would be one longer product instead) */
        int64_t a[3] = {3, 37, 24}, apad[3] = {3, 38, 24}, as[3] = {38 * 24, 24, 1}, dc[3] = {3, 37, 40}, db[2] = {24, 40};
        th_operand A = make(dt, 3, apad, 0), DC = make(dt, 3, dc, 0), DB = out(dt, 2, db, 0);
        A.t = th_tensor(&A.buf, 0, 3, a, as);
        launched("matmul_backward_other batch sum", fg_matmul_backward_other(ctx, &A.t, &DC.t, &DB.t, 0), "x batch, f32 sum");
        written("matmul_backward_other batch sum", &DB);
        th_drop(&A), th_drop(&DC), th_drop(&DB);
    }
#ifdef FG_TEST_HAVE_SM90A
    {   /* f32 products of a narrow layer over many rows: the split TF32 kernels (k and n off their
           tiles' multiples, a partial last row tile; dx and dw accumulated) */
        int64_t x[2] = {17100, 100}, w[2] = {136, 100}, b[1] = {136}, y[2] = {17100, 136};
        th_operand X = make(FG_F32, 2, x, 0), W = make(FG_F32, 2, w, 0), B = make(FG_F32, 1, b, 0), Y = out(FG_F32, 2, y, 0);
        launched("linear_forward f32 split", fg_linear_forward(ctx, &X.t, &W.t, &B.t, &Y.t), "split_tf32_gemm90");
        written("linear_forward f32 split", &Y);
        th_operand DX = make(FG_F32, 2, x, 0);
        launched("linear_backward_input f32 split", fg_linear_backward_input(ctx, &Y.t, &W.t, &DX.t, 1), "split_tf32_gemm90");
        written("linear_backward_input f32 split", &DX);
        th_operand DW = make(FG_F32, 2, w, 0);
        launched("linear_backward_weight f32 split", fg_linear_backward_weight(ctx, &Y.t, &X.t, &DW.t, 1), "split_tf32_wgrad90");
        written("linear_backward_weight f32 split", &DW);
        th_drop(&DW);
        th_drop(&X), th_drop(&W), th_drop(&B), th_drop(&Y), th_drop(&DX);
    }
#endif
    {   /* an outer product of 2-byte values */
        int64_t n[1] = {300}, m[1] = {1000}, z[2] = {300, 1000};
        th_operand X = make(dt, 1, n, 0), Y = make(dt, 1, m, 0), Z = out(dt, 2, z, 0);
        launched("outer_forward", fg_outer_forward(ctx, &X.t, &Y.t, &Z.t), "rank1<");
        written("outer_forward", &Z);
        th_drop(&X), th_drop(&Y), th_drop(&Z);
    }
}

/* ------------------------------------------------------------------ elementwise */

static void elementwise_kernels(void) {
    int64_t nm[2] = {1000, 300}, m1[1] = {300};
    const double cap[1] = {3.0};
    for (int layout = 0; layout < 2; layout++) { /* contiguous: ew_fast; padded rows: ew_general */
        th_operand X = make(FG_F32, 2, nm, layout), Y = out(FG_F32, 2, nm, layout);
        const char *label = layout ? "unary_forward padded rows" : "unary_forward";
        launched(label, fg_unary_forward(ctx, FG_UNARY_SOFTCAP, cap, &X.t, &Y.t), layout ? "ew_general<" : "ew_fast<");
        written(label, &Y);
        th_drop(&X), th_drop(&Y);
    }
    /* lerp's backward with b broadcast over the rows: db is an ordered reduction */
    th_operand DY = make(FG_BF16, 2, nm, 0), A = make(FG_BF16, 2, nm, 0), B = make(FG_BF16, 1, m1, 0);
    th_operand W = make(FG_BF16, 2, nm, 0), DA = out(FG_BF16, 2, nm, 0), DB = out(FG_BF16, 1, m1, 0);
    th_operand DW = out(FG_BF16, 2, nm, 0);
    launched("lerp_backward broadcast b",
             fg_lerp_backward(ctx, &DY.t, &A.t, &B.t, &W.t, 0, &DA.t, &DB.t, &DW.t, 0), "ew_reduce");
    written("lerp_backward da", &DA), written("lerp_backward db", &DB), written("lerp_backward dw", &DW);
    th_drop(&DY), th_drop(&A), th_drop(&B), th_drop(&W), th_drop(&DA), th_drop(&DB), th_drop(&DW);
}

/* ------------------------------------------------------------------ linear + activation */

typedef struct layer {
    th_operand x, w, b, y, pre, dy, dx, dw, db;
} layer;

static layer make_layer(fg_dtype dt, int64_t N, int64_t K, int64_t M) {
    int64_t nk[2] = {N, K}, mk[2] = {M, K}, m1[1] = {M}, nm[2] = {N, M};
    layer l = {make(dt, 2, nk, 0), make(dt, 2, mk, 0), make(dt, 1, m1, 0), out(dt, 2, nm, 0), out(dt, 2, nm, 0),
               make(dt, 2, nm, 0), out(dt, 2, nk, 0), out(dt, 2, mk, 0), out(dt, 1, m1, 0)};
    /* pre-activations of a few units */
    for (int64_t i = 0; i < l.x.n; i++) l.x.v[i] *= 2.0 / sqrt((double)K);
    th_put(&l.x.buf, &l.x.t, l.x.v);
    return l;
}

static void drop_layer(layer *l) {
    th_drop(&l->x), th_drop(&l->w), th_drop(&l->b), th_drop(&l->y), th_drop(&l->pre), th_drop(&l->dy);
    th_drop(&l->dx), th_drop(&l->dw), th_drop(&l->db);
}

static void grads_finite(const char *label, layer *l, bool dw) {
    written(label, &l->dx);
    if (dw) written(label, &l->dw), written(label, &l->db);
}

static void act_kernels(void) {
    {   /* f32: cuBLASLt's product, then the activation pass and the gradient pass (db's column
           sums, the cast) */
        layer l = make_layer(FG_F32, 67, 200, 72);
        launched("linear_act f32 forward", fg_linear_act_forward(ctx, FG_ACT_GELU_TANH, &l.x.t, &l.w.t, &l.b.t, &l.y.t,
                                                                 &l.pre.t), "act_gelu_tanh<");
        written("linear_act f32 forward", &l.y);
        launched("linear_act f32 backward", fg_linear_act_backward(ctx, FG_ACT_GELU_TANH, &l.dy.t, &l.pre.t, &l.x.t, &l.w.t,
                                                                   &l.b.t, &l.dx.t, &l.dw.t, &l.db.t, 0), "act_grad_");
        grads_finite("linear_act f32 backward", &l, true);
        /* the same passes applying the dropout (their DROP instances) */
        const fg_linear_act_options o = {FG_ACT_GELU_TANH, FG_ACT_SAVED_PRE, 0, {0.3, 5, 7}};
        launched("linear_act f32 forward, dropout",
                 fg_linear_act_forward_ex(ctx, &o, &l.x.t, &l.w.t, &l.b.t, &l.y.t, &l.pre.t), "act_gelu_tanh<f32>+dropout");
        written("linear_act f32 forward, dropout", &l.y);
        launched("linear_act f32 backward, dropout",
                 fg_linear_act_backward_ex(ctx, &o, &l.dy.t, &l.pre.t, &l.x.t, &l.w.t, &l.b.t, &l.dx.t, &l.dw.t, &l.db.t, 0),
                 "act_grad_gelu_tanh<f32>+dropout");
        grads_finite("linear_act f32 backward, dropout", &l, true);
        const fg_linear_act_options os = {FG_ACT_GELU_TANH, FG_ACT_SAVED_SLOPE, 0, {0.3, 5, 7}};
        launched("linear_act f32 forward, slope + dropout",
                 fg_linear_act_forward_ex(ctx, &os, &l.x.t, &l.w.t, &l.b.t, &l.y.t, &l.pre.t), "act_gelu_tanh<f32>+dropout");
        written("linear_act f32 forward, slope + dropout", &l.y);
        drop_layer(&l);
    }
    {   /* short K in bf16: the tile kernels (forward; the gradient with pre recomputed, dx
           alone; the one-kernel backward of the cheap-slope activations) */
        layer l = make_layer(FG_BF16, 67, 40, 72);
        launched("linear_act tile forward", fg_linear_act_forward(ctx, FG_ACT_GELU_TANH, &l.x.t, &l.w.t, &l.b.t, &l.y.t,
                                                                  &l.pre.t), "linear_act_tile_");
        written("linear_act tile forward", &l.y);
        launched("linear_act grad tile", fg_linear_act_backward(ctx, FG_ACT_GELU_TANH, &l.dy.t, NULL, &l.x.t, &l.w.t,
                                                                &l.b.t, &l.dx.t, NULL, NULL, 0), "linear_act_grad_tile_");
        grads_finite("linear_act grad tile", &l, false);
        /* the same two tiles applying the dropout (their DROP instances) */
        const fg_linear_act_options o = {FG_ACT_GELU_TANH, FG_ACT_SAVED_PRE, 0, {0.3, 5, 7}};
        launched("linear_act tile forward, dropout",
                 fg_linear_act_forward_ex(ctx, &o, &l.x.t, &l.w.t, &l.b.t, &l.y.t, &l.pre.t),
                 "linear_act_tile_gelu_tanh<bf16>+dropout");
        written("linear_act tile forward, dropout", &l.y);
        launched("linear_act grad tile, dropout",
                 fg_linear_act_backward_ex(ctx, &o, &l.dy.t, NULL, &l.x.t, &l.w.t, &l.b.t, &l.dx.t, NULL, NULL, 0),
                 "linear_act_grad_tile_gelu_tanh<bf16>+dropout");
        grads_finite("linear_act grad tile, dropout", &l, false);
        const fg_linear_act_options os = {FG_ACT_GELU_TANH, FG_ACT_SAVED_SLOPE, 0, {0.3, 5, 7}};
        launched("linear_act tile forward, slope + dropout",
                 fg_linear_act_forward_ex(ctx, &os, &l.x.t, &l.w.t, &l.b.t, &l.y.t, &l.pre.t),
                 "linear_act_tile_gelu_tanh<bf16>+dropout");
        written("linear_act tile forward, slope + dropout", &l.y);
        launched("linear_act backward tile", fg_linear_act_backward(ctx, FG_ACT_SILU, &l.dy.t, NULL, &l.x.t, &l.w.t,
                                                                    &l.b.t, &l.dx.t, &l.dw.t, &l.db.t, 0),
                 "linear_act_bwd_tile_");
        grads_finite("linear_act backward tile", &l, true);
        drop_layer(&l);
    }
#ifdef FG_TEST_HAVE_SM90A
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    fg_plan *plan = NULL;
    fg_plan_info info;
    int64_t s2[2] = {64, 64};
    th_operand px = make(FG_BF16, 2, s2, 0), pw = make(FG_BF16, 2, s2, 0), py = out(FG_BF16, 2, s2, 0);
    d.op = FG_OP_LINEAR_FORWARD, d.operands[0] = px.t, d.operands[1] = pw.t, d.operands[3] = py.t;
    const bool sm90 = fg_plan_create(ctx, &d, &plan) == FG_OK && fg_plan_info_get(plan, &info) == FG_OK && info.arch == 90;
    fg_plan_destroy(plan);
    th_drop(&px), th_drop(&pw), th_drop(&py);
    if (!sm90) {
        printf("FAIL: an sm_90a build on a device that is not 9.0: the sm_90a kernels cannot run here\n");
        failed++;
        return;
    }
    {   /* the one-kernel backward on sm_90a (pre kept): many row tiles, so its stages go round */
        layer l = make_layer(FG_BF16, 20000, 128, 256);
        th_randomize(&l.pre); /* a kept pre (the forward's output elsewhere) */
        launched("linear_act bwd90", fg_linear_act_backward(ctx, FG_ACT_SILU, &l.dy.t, &l.pre.t, &l.x.t, &l.w.t, &l.b.t,
                                                            &l.dx.t, &l.dw.t, &l.db.t, 0), "linear_act_bwd90_");
        grads_finite("linear_act bwd90", &l, true);
        /* accumulating: the old dx tile comes by TMA into the stage's freed pre boxes */
        launched("linear_act bwd90 accumulating", fg_linear_act_backward(ctx, FG_ACT_SILU, &l.dy.t, &l.pre.t, &l.x.t, &l.w.t,
                                                                         &l.b.t, &l.dx.t, &l.dw.t, &l.db.t, 1),
                 "linear_act_bwd90_");
        grads_finite("linear_act bwd90 accumulating", &l, true);
        drop_layer(&l);
    }
    {   /* the own sm_90a GEMM's epilogues near their smallest (linear_act_gemm.cu's size rule: a
           reduction of 4096 or more, ≥ 6e9 multiply-adds, whole waves of 128 × 256 tiles: 33 × 4 =
           132, one wave on a 132-SM H100 / H200): the forward keeping pre and the slope form
           reduce over 4096 inputs, dx's product forming g (silu) over 4096 outputs */
        layer f = make_layer(FG_BF16, 4224, 4096, 1024), l = make_layer(FG_BF16, 4224, 1024, 4096);
        launched("gemm90 forward", fg_linear_act_forward(ctx, FG_ACT_GELU_TANH, &f.x.t, &f.w.t, &f.b.t, &f.y.t, &f.pre.t),
                 "linear_act_gemm90_");
        written("gemm90 forward", &f.y), written("gemm90 forward pre", &f.pre);
        launched("gemm90 slope forward", fg_linear_act_forward_slope(ctx, FG_ACT_GELU_TANH, &f.x.t, &f.w.t, &f.b.t, &f.y.t,
                                                                     &f.pre.t), "linear_act_gemm90_");
        written("gemm90 slope forward", &f.pre);
        th_randomize(&l.pre); /* a kept pre (or slope): the forward's output elsewhere */
        launched("gemm90 dx forming g", fg_linear_act_backward(ctx, FG_ACT_SILU, &l.dy.t, &l.pre.t, &l.x.t, &l.w.t, &l.b.t,
                                                               &l.dx.t, &l.dw.t, &l.db.t, 0), "gemm90_dx_formed_g");
        grads_finite("gemm90 dx forming g", &l, true);
        th_poison(&l.dx.buf), th_poison(&l.dw.buf), th_poison(&l.db.buf);
        launched("gemm90 slope backward", fg_linear_act_backward_slope(ctx, FG_ACT_GELU_TANH, &l.dy.t, &l.pre.t, &l.x.t,
                                                                       &l.w.t, &l.b.t, &l.dx.t, &l.dw.t, &l.db.t, 0),
                 "gemm90_dx_formed_g");
        grads_finite("gemm90 slope backward", &l, true);
        drop_layer(&f), drop_layer(&l);
    }
    {   /* its plain INPUT and WEIGHT products, taken for a reduction of 16384 or more (gemm.cu):
           Linear's dx and dw with 11 × 12 output tiles, one wave (two buffers viewed both ways) */
        const int64_t R = 16384, M = 1408, K = 3072;
        int64_t rm[2] = {R, M}, mr[2] = {M, R}, rk[2] = {R, K}, mk[2] = {M, K};
        th_operand a = make(FG_BF16, 2, rm, 0), b = make(FG_BF16, 2, rk, 0), c = out(FG_BF16, 2, mk, 0);
        for (int64_t i = 0; i < b.n; i++) b.v[i] *= 1.0 / 64; /* sums of 16384 terms stay small */
        th_put(&b.buf, &b.t, b.v);
        fg_tensor dy_in = fg_tensor_make(a.buf.ptr, FG_BF16, 2, mr); /* dy [M rows, R] · w [R, K] */
        launched("gemm90 plain dx", fg_linear_backward_input(ctx, &dy_in, &b.t, &c.t, 0), "gemm90_dx_none");
        written("gemm90 plain dx", &c);
        th_poison(&c.buf); /* dyᵀ [M, R] · x [R, K] */
        launched("gemm90 plain dw", fg_linear_backward_weight(ctx, &a.t, &b.t, &c.t, 0), "gemm90_dw_");
        written("gemm90 plain dw", &c);
        th_drop(&a), th_drop(&b), th_drop(&c);
    }
#endif
}

/* ------------------------------------------------------------------ log-prob */

static void logp_kernels(void) {
    const fg_dtype dt = FG_BF16;
    const int64_t N = 50, D = 32, V = 1000;
    int64_t hd[2] = {N, D}, vd[2] = {V, D}, v1[1] = {V}, n1[1] = {N}, one[1] = {1};
    th_operand h = make(dt, 2, hd, 0), w = make(dt, 2, vd, 0), b = make(dt, 1, v1, 0);
    for (int64_t i = 0; i < h.n; i++) h.v[i] *= 3.0 / sqrt((double)D);
    th_put(&h.buf, &h.t, h.v);
    th_buf tb = th_alloc(FG_BACKEND_CUDA, FG_I64, N);
    int64_t *t = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t n = 0; n < N; n++) t[n] = (int64_t)(th_rand_u64() % (uint64_t)V);
    th_put_raw(&tb, t, sizeof(int64_t) * (size_t)N);
    fg_tensor target = th_tensor(&tb, 0, 1, n1, NULL);
    th_operand logp = out(FG_F32, 1, n1, 0), lse = out(FG_F32, 1, n1, 0), ent = out(FG_F32, 1, n1, 0);
    th_operand dl = make(FG_F32, 1, n1, 0), dh = out(dt, 2, hd, 0), dw = out(dt, 2, vd, 0), db = out(dt, 1, v1, 0);
    th_operand loss = out(FG_F32, 1, one, 0);
    for (int tiles = 0; tiles < 2; tiles++) { /* whole rows; then tiles of a few hundred logits */
        fg_logp_options o;
        memset(&o, 0, sizeof o);
        if (tiles) o.max_tile_elements = 7 * 300;
        char label[64];
        snprintf(label, sizeof label, "linear_logp_forward%s", tiles ? " small tiles" : "");
        launched(label, fg_linear_logp_forward(ctx, &o, &h.t, &w.t, &b.t, &target, &logp.t, &lse.t, &ent.t), NULL);
        written(label, &logp), written(label, &ent);
        snprintf(label, sizeof label, "linear_logp_backward%s", tiles ? " small tiles" : "");
        launched(label, fg_linear_logp_backward(ctx, &o, &dl.t, NULL, NULL, &h.t, &w.t, &b.t, &target, &lse.t, NULL, &dh.t,
                                                &dw.t, &db.t, 0), NULL);
        written(label, &dh), written(label, &dw), written(label, &db);
        o.label_smoothing = 0.1, o.z_loss = 1e-3; /* the mean: the single-block count and reduction */
        snprintf(label, sizeof label, "linear_cross_entropy%s", tiles ? " small tiles" : "");
        th_poison(&dh.buf), th_poison(&dw.buf);
        launched(label, fg_linear_cross_entropy(ctx, &o, &h.t, &w.t, &b.t, &target, NULL, &loss.t, &lse.t, &dh.t, &dw.t,
                                                &db.t, 0), NULL);
        written(label, &loss), written(label, &dh), written(label, &dw);
    }
    {   /* vocabulary shards: the shard forward over w's rows [400, V) (the target moved in STATS),
           its backward (GRAD), and the combine kernel over two gathered parts */
        fg_logp_options o;
        memset(&o, 0, sizeof o);
        o.vocab_start = 400, o.vocab_total = V;
        int64_t sd[2] = {V - 400, D}, s1[1] = {V - 400}, p2[2] = {2, N};
        fg_tensor ws = th_tensor(&w.buf, 400 * D, 2, sd, NULL), bs = th_tensor(&b.buf, 400, 1, s1, NULL);
        fg_tensor dws = th_tensor(&dw.buf, 0, 2, sd, NULL);
        th_poison(&lse.buf), th_poison(&logp.buf), th_poison(&ent.buf);
        launched("linear_logp_shard_forward",
                 fg_linear_logp_shard_forward(ctx, &o, &h.t, &ws, &bs, &target, &lse.t, &logp.t, &ent.t), NULL);
        written("linear_logp_shard_forward", &lse), written("linear_logp_shard_forward", &ent);
        th_operand parts = make(FG_F32, 2, p2, 0);
        th_poison(&lse.buf), th_poison(&logp.buf), th_poison(&ent.buf);
        launched("linear_logp_shard_combine",
                 fg_linear_logp_shard_combine(ctx, &o, &target, &parts.t, &dl.t, &parts.t, &logp.t, &lse.t, &ent.t),
                 "logp_combine");
        written("linear_logp_shard_combine", &logp), written("linear_logp_shard_combine", &ent);
        th_poison(&dh.buf);
        launched("linear_logp_backward shard", fg_linear_logp_backward(ctx, &o, &dl.t, NULL, NULL, &h.t, &ws, &bs, &target,
                                                                       &lse.t, NULL, &dh.t, &dws, NULL, 0), NULL);
        written("linear_logp_backward shard", &dh);
        th_drop(&parts);
    }
    fg_status st = fg_context_check(ctx);
    launched("linear_logp device flag", st, NULL);
    th_drop(&h), th_drop(&w), th_drop(&b), th_drop(&logp), th_drop(&lse), th_drop(&ent), th_drop(&dl);
    th_drop(&dh), th_drop(&dw), th_drop(&db), th_drop(&loss);
    th_free(&tb);
    free(t);
}

/* ------------------------------------------------------------------ normalization */

/* The row norms' register kernels (a few lanes a row; a block a row; the backward's shared-memory
 * dw / db past 48 KB), the lean kernels, their loop kernels (an odd D) with the column kernel for dw / db, BatchNorm's
 * column and apply kernels (four-element vectors and single elements), dropout, RevIN. */
static void norm_kernels(void) {
    struct { fg_dtype dt; int64_t rows, d; const char *fwd, *bwd; } rows[] = {
        {FG_BF16, 300, 128, "ln_fwd<bf16,v8,g8x2>", "ln_bwd<bf16,v8,g8x2>"},
        {FG_F32, 40, 4096, "ln_fwd<f32,v4,g256x4>", "ln_bwd<f32,v4,g256x4>"},
        {FG_F32, 20, 16384, "ln_fwd<f32,v4,g512x8>", "ln_bwd<f32,v4,g512x8>"},
        {FG_BF16, 20, 12288, "ln_fwd<bf16,v8,g512x4>", "ln_bwd<bf16,v8,g512x4>"},
        {FG_F32, 33, 1001, "ln_fwd_loop<f32,v1>", "ln_bwd_loop<f32,v1>"},
    };
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        const fg_dtype dt = rows[k].dt;
        int64_t xd[2] = {rows[k].rows, rows[k].d}, d1[1] = {rows[k].d}, r1[1] = {rows[k].rows};
        th_operand X = make(dt, 2, xd, 0), R = make(dt, 2, xd, 0), W = make(dt, 1, d1, 0), B = make(dt, 1, d1, 0);
        th_operand Y = out(dt, 2, xd, 0), S = out(dt, 2, xd, 0), M = out(FG_F32, 1, r1, 0), Q = out(FG_F32, 1, r1, 0);
        th_operand DX = out(dt, 2, xd, 0), DR = out(dt, 2, xd, 0), DW = out(dt, 1, d1, 0), DB = out(dt, 1, d1, 0);
        fg_norm_options o;
        memset(&o, 0, sizeof o);
        o.dropout.p = 0.25, o.dropout.seed = 9;
        char label[80];
        snprintf(label, sizeof label, "norm_forward + residual %s D=%lld", fg_dtype_name(dt), (long long)rows[k].d);
        launched(label, fg_norm_forward(ctx, &o, &X.t, &R.t, &W.t, &B.t, &Y.t, &S.t, &M.t, &Q.t), rows[k].fwd);
        written(label, &Y), written(label, &S), written(label, &Q);
        snprintf(label, sizeof label, "norm_backward %s D=%lld", fg_dtype_name(dt), (long long)rows[k].d);
        launched(label, fg_norm_backward(ctx, &o, &Y.t, &X.t, &S.t, &W.t, &M.t, &Q.t, &DX.t, &DR.t, &DW.t, &DB.t, 0),
                 rows[k].bwd);
        written(label, &DX), written(label, &DR), written(label, &DW), written(label, &DB);
        o.kind = FG_NORM_RMS, o.dropout.p = 0;
        th_poison(&DX.buf), th_poison(&DW.buf);
        snprintf(label, sizeof label, "rms_norm_backward recomputed %s D=%lld", fg_dtype_name(dt), (long long)rows[k].d);
        launched(label, fg_norm_backward(ctx, &o, &Y.t, NULL, &S.t, &W.t, NULL, NULL, &DX.t, NULL, &DW.t, NULL, 0),
                 rows[k].d == 1001 ? "norm_params_cols" : "norm_params_sum");
        written(label, &DX), written(label, &DW);
        th_drop(&X), th_drop(&R), th_drop(&W), th_drop(&B), th_drop(&Y), th_drop(&S), th_drop(&M), th_drop(&Q);
        th_drop(&DX), th_drop(&DR), th_drop(&DW), th_drop(&DB);
    }
    { /* the lean row kernels: no residual forward, plain backward with the statistics and recomputing them */
        int64_t xd[2] = {40, 4096}, d1[1] = {4096}, r1[1] = {40};
        th_operand X = make(FG_BF16, 2, xd, 0), W = make(FG_BF16, 1, d1, 0), B = make(FG_BF16, 1, d1, 0);
        th_operand Y = out(FG_BF16, 2, xd, 0), M = out(FG_F32, 1, r1, 0), Q = out(FG_F32, 1, r1, 0);
        th_operand DX = out(FG_BF16, 2, xd, 0), DW = out(FG_BF16, 1, d1, 0), DB = out(FG_BF16, 1, d1, 0);
        fg_norm_options o;
        memset(&o, 0, sizeof o);
        launched("norm_forward lean bf16 D=4096", fg_norm_forward(ctx, &o, &X.t, NULL, &W.t, &B.t, &Y.t, NULL, &M.t, &Q.t),
                 "ln_fwd_lean<bf16,v8,g256x2>");
        written("norm_forward lean bf16 D=4096", &Y), written("norm_forward lean bf16 D=4096", &Q);
        launched("norm_backward lean bf16 D=4096",
                 fg_norm_backward(ctx, &o, &Y.t, NULL, &X.t, &W.t, &M.t, &Q.t, &DX.t, NULL, &DW.t, &DB.t, 0),
                 "ln_bwd_lean<bf16,v8,g256x2>");
        written("norm_backward lean bf16 D=4096", &DX), written("norm_backward lean bf16 D=4096", &DW);
        th_poison(&DX.buf);
        launched("norm_backward lean recomputed bf16 D=4096",
                 fg_norm_backward(ctx, &o, &Y.t, NULL, &X.t, &W.t, NULL, NULL, &DX.t, NULL, &DW.t, &DB.t, 0),
                 "ln_bwd_lean<bf16,v8,g256x2>");
        written("norm_backward lean recomputed bf16 D=4096", &DX);
        th_drop(&X), th_drop(&W), th_drop(&B), th_drop(&Y), th_drop(&M), th_drop(&Q);
        th_drop(&DX), th_drop(&DW), th_drop(&DB);
    }
    struct { fg_dtype dt; int64_t n, c; const char *vec; } bns[] = {
        {FG_BF16, 3000, 128, "v4"}, {FG_F32, 2000, 64, "v4"}, {FG_F32, 501, 7, "v1"}};
    for (size_t k = 0; k < sizeof bns / sizeof bns[0]; k++) {
        const fg_dtype dt = bns[k].dt;
        int64_t xd[2] = {bns[k].n, bns[k].c}, c1[1] = {bns[k].c};
        th_operand X = make(dt, 2, xd, 0), R = make(dt, 2, xd, 0), W = make(FG_F32, 1, c1, 0), B = make(FG_F32, 1, c1, 0);
        th_operand RM = make(FG_F32, 1, c1, 0), RV = make(FG_F32, 1, c1, 0), Y = out(dt, 2, xd, 0), S = out(dt, 2, xd, 0);
        th_operand M = out(FG_F32, 1, c1, 0), Q = out(FG_F32, 1, c1, 0), DX = out(dt, 2, xd, 0), DR = out(dt, 2, xd, 0);
        th_operand DW = out(FG_F32, 1, c1, 0), DB = out(FG_F32, 1, c1, 0);
        for (int64_t j = 0; j < RV.n; j++) RV.v[j] = 1.0 + fabs(RV.v[j]);
        th_put(&RV.buf, &RV.t, RV.v);
        fg_batch_norm_options o;
        memset(&o, 0, sizeof o);
        o.dropout.p = 0.3, o.dropout.seed = 5;
        char label[80], want[40];
        snprintf(label, sizeof label, "batch_norm_forward + residual %s C=%lld", fg_dtype_name(dt), (long long)bns[k].c);
        /* C a multiple of 4: the one-launch kernels (bn_resident; f32's forward with the residual
           keeps the stats and apply kernels); C 7: the stats and apply kernels */
        const bool one = bns[k].c % 4 == 0, fwd_one = one && dt != FG_F32;
        if (fwd_one) snprintf(want, sizeof want, "bn_resident<%s,fwd>", fg_dtype_name(dt));
        else snprintf(want, sizeof want, "bn_apply<%s,%s>", fg_dtype_name(dt), bns[k].vec);
        launched(label, fg_batch_norm_forward(ctx, &o, &X.t, &R.t, &W.t, &B.t, &RM.t, &RV.t, &Y.t, &S.t, &M.t, &Q.t),
                 want);
        written(label, &Y), written(label, &S), written(label, &M), written(label, &RV);
        snprintf(label, sizeof label, "batch_norm_backward %s C=%lld", fg_dtype_name(dt), (long long)bns[k].c);
        if (one) snprintf(want, sizeof want, "bn_resident<%s,bwd>", fg_dtype_name(dt));
        else snprintf(want, sizeof want, "bn_bwd_apply<%s,%s>", fg_dtype_name(dt), bns[k].vec);
        launched(label, fg_batch_norm_backward(ctx, &o, &Y.t, &S.t, &W.t, &M.t, &Q.t, &DX.t, &DR.t, &DW.t, &DB.t, 0),
                 want);
        written(label, &DX), written(label, &DR), written(label, &DW), written(label, &DB);
        if (one) { /* the split form's steps (synchronized BatchNorm) at the same shape: the vector kernels */
            int64_t sd[1] = {2 * bns[k].c + 1};
            th_operand SU = out(FG_F64, 1, sd, 0);
            fg_batch_norm_options plain = o;
            plain.dropout.p = 0;
            snprintf(label, sizeof label, "batch_norm_stats + residual %s C=%lld", fg_dtype_name(dt), (long long)bns[k].c);
            snprintf(want, sizeof want, "bn_stats<%s,%s>", fg_dtype_name(dt), bns[k].vec);
            launched(label, fg_batch_norm_stats(ctx, &o, &X.t, &R.t, &S.t, &SU.t), want);
            written(label, &SU);
            snprintf(label, sizeof label, "batch_norm_apply %s C=%lld", fg_dtype_name(dt), (long long)bns[k].c);
            snprintf(want, sizeof want, "bn_apply<%s,%s>", fg_dtype_name(dt), bns[k].vec);
            launched(label, fg_batch_norm_apply(ctx, &plain, &S.t, &SU.t, &W.t, &B.t, &RM.t, &RV.t, &Y.t, &M.t, &Q.t), want);
            written(label, &Y);
            snprintf(label, sizeof label, "batch_norm_backward_stats %s C=%lld", fg_dtype_name(dt), (long long)bns[k].c);
            snprintf(want, sizeof want, "bn_bwd_stats<%s,%s>", fg_dtype_name(dt), bns[k].vec);
            launched(label, fg_batch_norm_backward_stats(ctx, &plain, &Y.t, &S.t, &M.t, &Q.t, &SU.t), want);
            snprintf(label, sizeof label, "batch_norm_backward_apply %s C=%lld", fg_dtype_name(dt), (long long)bns[k].c);
            snprintf(want, sizeof want, "bn_bwd_apply<%s,%s>", fg_dtype_name(dt), bns[k].vec);
            launched(label, fg_batch_norm_backward_apply(ctx, &o, &Y.t, &S.t, &W.t, &M.t, &Q.t, &SU.t, &DX.t, &DR.t,
                                                         &DW.t, &DB.t, 0),
                     want);
            written(label, &DX);
            th_drop(&SU);
        }
        th_drop(&X), th_drop(&R), th_drop(&W), th_drop(&B), th_drop(&RM), th_drop(&RV), th_drop(&Y), th_drop(&S);
        th_drop(&M), th_drop(&Q), th_drop(&DX), th_drop(&DR), th_drop(&DW), th_drop(&DB);
    }
    {   /* dropout: contiguous (16-byte vectors and a tail), padded rows (single elements) */
        int64_t xd[2] = {37, 1003};
        fg_dropout_options o = {0.5, 77, 3};
        for (int layout = 0; layout < 2; layout++) {
            th_operand X = make(FG_BF16, 2, xd, layout), Y = out(FG_BF16, 2, xd, layout);
            const char *label = layout ? "dropout_forward padded rows" : "dropout_forward";
            launched(label, fg_dropout_forward(ctx, &o, &X.t, &Y.t), layout ? "dropout<bf16,v1>" : "dropout<bf16,v8>");
            written(label, &Y);
            th_drop(&X), th_drop(&Y);
        }
    }
    {   /* RevIN: statistics, normalize, denormalize, their backwards */
        int64_t xd[3] = {16, 336, 7}, pd[3] = {16, 96, 7}, st[2] = {16, 7}, c1[1] = {7};
        th_operand X = make(FG_F32, 3, xd, 0), P = make(FG_F32, 3, pd, 0), W = make(FG_F32, 1, c1, 0);
        th_operand B = make(FG_F32, 1, c1, 0), MU = out(FG_F32, 2, st, 0), SD = out(FG_F32, 2, st, 0);
        th_operand Y = out(FG_F32, 3, xd, 0), O = out(FG_F32, 3, pd, 0), DX = out(FG_F32, 3, xd, 0);
        th_operand DP = out(FG_F32, 3, pd, 0), DW = out(FG_F32, 1, c1, 0), DB = out(FG_F32, 1, c1, 0);
        for (int64_t j = 0; j < W.n; j++) W.v[j] = 1.0 + fabs(W.v[j]);
        th_put(&W.buf, &W.t, W.v);
        fg_revin_options o;
        memset(&o, 0, sizeof o);
        launched("revin_stats", fg_revin_stats(ctx, &o, &X.t, &MU.t, &SD.t), "revin_stats<f32>");
        written("revin_stats", &SD);
        launched("revin_forward", fg_revin_forward(ctx, &o, &X.t, &W.t, &B.t, &MU.t, &SD.t, &Y.t), "revin_norm<f32>");
        written("revin_forward", &Y);
        launched("revin_backward", fg_revin_backward(ctx, &o, &Y.t, &X.t, &W.t, &B.t, &MU.t, &SD.t, &DX.t, &DW.t, &DB.t, 0),
                 "revin_norm_bwd<f32>");
        written("revin_backward", &DX), written("revin_backward", &DW);
        o.denorm = 1;
        launched("revin_forward denorm", fg_revin_forward(ctx, &o, &P.t, &W.t, &B.t, &MU.t, &SD.t, &O.t),
                 "revin_denorm<f32>");
        written("revin_forward denorm", &O);
        launched("revin_backward denorm",
                 fg_revin_backward(ctx, &o, &O.t, &P.t, &W.t, &B.t, &MU.t, &SD.t, &DP.t, &DW.t, &DB.t, 0),
                 "revin_denorm_bwd<f32>");
        written("revin_backward denorm", &DP), written("revin_backward denorm", &DB);
        th_drop(&X), th_drop(&P), th_drop(&W), th_drop(&B), th_drop(&MU), th_drop(&SD), th_drop(&Y), th_drop(&O);
        th_drop(&DX), th_drop(&DP), th_drop(&DW), th_drop(&DB);
    }
}

/* ------------------------------------------------------------------ attention */

/* Each path forward and backward: whole sequences (L <= 64, hd <= 8: a thread a query row, the
 * backward then a thread a key; a thread a row: L <= 64, hd <= 32; a warp a row: L <= 128,
 * hd <= 64; here f32 with causal masking and dropout), the flash kernels (bf16, L past 128: the
 * row dot, dK / dV, dQ; at hd 64 their sm_90a form, at hd 128 the mma.sync one; without and with
 * dropout), the tiled kernels (f32 past 128 keys; the backward with dK / dV and with dQ alone).
 * The short-sequence cases with residual scores (in, out, their gradients) move the scores
 * through shared-memory tiles as vector runs (even L) or row by row (odd L); the thread-a-row
 * case at L 30 (four heads a block, six heads: the last block half full) also accumulates. */
static void attention_kernels(void) {
    struct { fg_dtype dt; int64_t L, hd; int causal; double p; const char *fwd, *bwd, *bwd_dq; int res, acc; } cases[] = {
        {FG_F32, 41, 4, 1, 0.1, "attn_short_qrow_fwd<f32,4>", "attn_short_qrow_bwd<f32,4>", NULL},
        {FG_BF16, 42, 8, 0, 0, "attn_short_qrow_fwd<bf16,8>", "attn_short_qrow_bwd<bf16,8>", NULL, 1},
        {FG_F32, 42, 8, 0, 0.1, "attn_short_qrow_fwd<f32,8>", "attn_short_qrow_bwd<f32,8>", NULL, 1},
        {FG_BF16, 33, 4, 0, 0, "attn_short_qrow_fwd<bf16,4>", "attn_short_qrow_bwd<bf16,4>", NULL, 1},
        {FG_F32, 30, 8, 0, 0.1, "attn_short_qrow_fwd<f32,8>", "attn_short_qrow_bwd<f32,8>", NULL, 1, 1},
        {FG_F32, 40, 16, 1, 0.1, "attn_short_rows_fwd<f32,16>", "attn_short_rows_bwd<f32,16>", NULL},
        {FG_F32, 100, 16, 1, 0.1, "attn_short_fwd<f32>", "attn_short_bwd<f32>", NULL},
        {FG_BF16, 200, 64, 1, 0, "attn_flash90_fwd<bf16,64>", "attn_flash90_dkdv<bf16,64>", "attn_flash90_dq<bf16,64>"},
        {FG_BF16, 200, 128, 1, 0, "attn_flash_fwd<bf16,128>", "attn_flash_dkdv<bf16,128>", NULL},
        /* their dropout instances: lanes sharing a Philox block (L % 4 == 0), and a draw an element */
        {FG_BF16, 200, 64, 1, 0.1, "attn_flash90_fwd<bf16,64>", "attn_flash90_dkdv<bf16,64>", "attn_flash90_dq<bf16,64>"},
        {FG_BF16, 200, 128, 0, 0.1, "attn_flash_fwd<bf16,128>", "attn_flash_dkdv<bf16,128>", NULL},
        {FG_BF16, 201, 64, 1, 0.1, "attn_flash90_fwd<bf16,64>", "attn_flash90_dkdv<bf16,64>", NULL},
        {FG_F32, 200, 16, 0, 0.1, "attn_tiled_fwd<f32>", "attn_tiled_dkdv<f32>", "attn_tiled_dq<f32>"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const fg_dtype dt = cases[k].dt;
        int64_t sh[4] = {2, 3, cases[k].L, cases[k].hd}, ls[3] = {2, 3, cases[k].L};
        th_operand Q = make(dt, 4, sh, 0), K = make(dt, 4, sh, 0), V = make(dt, 4, sh, 0), DO = make(dt, 4, sh, 0);
        /* the gradients accumulate into finite values, else start poisoned */
        th_operand (*grad)(fg_dtype, int, const int64_t *, int) = cases[k].acc ? make : out;
        th_operand O = out(dt, 4, sh, 0), LSE = out(FG_F32, 3, ls, 0), DQ = grad(dt, 4, sh, 0), DK = grad(dt, 4, sh, 0);
        th_operand DV = grad(dt, 4, sh, 0);
        const int res = cases[k].res;
        int64_t ss[4] = {2, 3, cases[k].L, res ? cases[k].L : 1};
        th_operand SI = make(dt, 4, ss, 0), SG = make(dt, 4, ss, 0), SO = out(dt, 4, ss, 0), DSI = grad(dt, 4, ss, 0);
        fg_attention_options o = {0, cases[k].causal, cases[k].p, 11, 0};
        char label[80];
        snprintf(label, sizeof label, "attention_forward %s L=%lld hd=%lld%s", fg_dtype_name(dt), (long long)cases[k].L,
                 (long long)cases[k].hd, res ? " scores" : "");
        launched(label,
                 fg_attention_forward(ctx, &o, &Q.t, &K.t, &V.t, NULL, res ? &SI.t : NULL, &O.t, &LSE.t, res ? &SO.t : NULL),
                 cases[k].fwd);
        written(label, &O), written(label, &LSE);
        if (res) written(label, &SO);
        snprintf(label, sizeof label, "attention_backward %s L=%lld hd=%lld%s", fg_dtype_name(dt), (long long)cases[k].L,
                 (long long)cases[k].hd, res ? " scores" : "");
        launched(label, fg_attention_backward(ctx, &o, &DO.t, res ? &SG.t : NULL, &Q.t, &K.t, &V.t, NULL, res ? &SI.t : NULL,
                                              &O.t, &LSE.t, &DQ.t, &DK.t, &DV.t, res ? &DSI.t : NULL,
                                              cases[k].acc),
                 cases[k].bwd);
        written(label, &DQ), written(label, &DK), written(label, &DV);
        if (res) written(label, &DSI);
        th_drop(&SI), th_drop(&SG), th_drop(&SO), th_drop(&DSI);
        if (cases[k].bwd_dq) {
            th_poison(&DQ.buf);
            snprintf(label, sizeof label, "attention_backward dq alone %s L=%lld", fg_dtype_name(dt), (long long)cases[k].L);
            launched(label, fg_attention_backward(ctx, &o, &DO.t, NULL, &Q.t, &K.t, &V.t, NULL, NULL, &O.t, &LSE.t, &DQ.t,
                                                  NULL, NULL, NULL, 0), cases[k].bwd_dq);
            written(label, &DQ);
        }
        th_drop(&Q), th_drop(&K), th_drop(&V), th_drop(&DO), th_drop(&O), th_drop(&LSE), th_drop(&DQ), th_drop(&DK);
        th_drop(&DV);
    }
}

/* ------------------------------------------------------------------ AdamW */

static void adamw_kernel(void) {
    const int64_t n[2] = {65536 + 37, 1000};
    th_operand p[2], g[2], m[2], v[2], w[2];
    fg_tensor tp[2], tg[2], tm[2], tv[2], tw[2];
    for (int i = 0; i < 2; i++) {
        p[i] = make(FG_BF16, 1, &n[i], 0), g[i] = make(FG_BF16, 1, &n[i], 0), m[i] = make(FG_F32, 1, &n[i], 0);
        v[i] = make(FG_F32, 1, &n[i], 0), w[i] = make(FG_F32, 1, &n[i], 0);
        for (int64_t e = 0; e < v[i].n; e++) v[i].v[e] = fabs(v[i].v[e]);
        th_put(&v[i].buf, &v[i].t, v[i].v);
        tp[i] = p[i].t, tg[i] = g[i].t, tm[i] = m[i].t, tv[i] = v[i].t, tw[i] = w[i].t;
    }
    fg_adamw_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.01, 1, 0};
    launched("adamw_step (bf16, master)", fg_adamw_step(ctx, &hp, 2, tp, tg, tm, tv, tw), "adamw_multi_tensor");
    launched("adamw_step (bf16)", fg_adamw_step(ctx, &hp, 2, tp, tg, tm, tv, NULL), "adamw_multi_tensor");
    for (int i = 0; i < 2; i++) {
        written("adamw p", &p[i]), written("adamw master", &w[i]);
        th_drop(&p[i]), th_drop(&g[i]), th_drop(&m[i]), th_drop(&v[i]), th_drop(&w[i]);
    }
}

/* The groups, in the order they run (all of them when none is named on the command line). */
static const struct {
    const char *name;
    void (*run)(void);
} groups[] = {{"gemm", gemm_kernels}, {"elementwise", elementwise_kernels}, {"act", act_kernels},
              {"logp", logp_kernels}, {"norm", norm_kernels}, {"attention", attention_kernels},
              {"adamw", adamw_kernel}};
enum { NGROUPS = sizeof groups / sizeof groups[0] };

int main(int argc, char **argv) {
    th_init("sanitize_ops");
    bool want[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) want[g] = argc < 2;
    for (int i = 1; i < argc; i++) {
        int g = 0;
        while (g < NGROUPS && strcmp(argv[i], groups[g].name)) g++;
        if (g == NGROUPS) {
            printf("FAIL sanitize_ops: '%s' is not a group (gemm, elementwise, act, logp, norm, attention, adamw)\n",
                   argv[i]);
            return 1;
        }
        want[g] = true;
    }
    if (!fg_backend_available(FG_BACKEND_CUDA)) {
        printf("FAIL sanitize_ops: the CUDA backend is not available here\n");
        return 1;
    }
    ctx = th_context(FG_BACKEND_CUDA, false);
    for (int g = 0; g < NGROUPS; g++)
        if (want[g]) groups[g].run();
    fg_status st = fg_context_check(ctx);
    if (st != FG_OK) printf("FAIL sanitize_ops: %s (%s)\n", fg_status_string(st), fg_last_error()), failed++;
    fg_context_destroy(ctx);
    if (failed) {
        printf("sanitize_ops: %d failure(s)\n", failed);
        return 1;
    }
    printf("sanitize_ops: ok\n");
    return 0;
}

/*
 * linear_logp.c — front door and driver of the fused linear log-prob family:
 * log_softmax(cap(h·wᵀ + b)/T)[target] (forward), its split backward, and a one-pass
 * cross-entropy that returns the loss and the gradients together.
 *
 * The [N, V] logits never exist. The driver walks them in tiles of at most
 * `max_tile_elements` (the caller's option, else ~N·V/8 clamped to a few tens of MB):
 * each tile is one GEMM through the shared primitive (cuBLASLt / OpenBLAS at their
 * ceiling) into a workspace buffer, then a backend row step that reduces it online
 * (forward) or turns it into dz in place (backward), which two more GEMMs consume.
 * Why not one fused GEMM+softmax kernel: a tile written and read once costs 4 bytes per
 * logit, a few percent of the GEMM time at D >= 2048, while the GEMMs stay at the
 * library's GEMM ceiling (docs/perf-notes.md).
 *
 *  forward   row blocks × V tiles: z = h·wᵀ + b → STATS (running max / sum / target
 *            logit / entropy terms per row) → FORWARD (logp, lse, entropy)
 *  backward  COEF (per-row coefficients from the upstream gradients) → V tiles × row
 *            blocks: z → GRAD (dz in place, db column sums) → dw[tile] = dzᵀ·h (complete
 *            over the rows in one product when one row block covers N) and dh += dz·w[tile]
 *            (f32 accumulator unless dh is f32)
 *  one pass  row tiles of full width: z → STATS → CE (loss, coefficients) → GRAD →
 *            dh = dz·w, dw += dzᵀ·h — three products instead of four
 *  shards    vocabulary parallelism (opt.vocab_start / vocab_total): the shard forward is the
 *            forward over the slice, the target moved by vocab_start, writing the slice's
 *            parts (lse_r, L[target] or 0, H_r); COMBINE (no GEMM) merges the gathered parts;
 *            the backward given the global lse / entropy is already the shard's backward
 *            (p = e^(L − lse) with the global lse, the target term only where the slice holds
 *            the target), so it only moves the target too
 * Every sum has a fixed order, so the results are the same bits on every run.
 */
#include "../core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { LF_H, LF_W, LF_B, LF_T, LF_LOGP, LF_LSE, LF_ENT, LF_N };
enum { LB_DLOGP, LB_DENT, LB_DLSE, LB_H, LB_W, LB_B, LB_T, LB_LSE, LB_ENT, LB_DH, LB_DW, LB_DB, LB_N };
enum { CE_H, CE_W, CE_B, CE_T, CE_RW, CE_LOSS, CE_LSE, CE_DH, CE_DW, CE_DB, CE_N };
enum { SC_T, SC_LSE_PARTS, SC_TLOGIT_PARTS, SC_ENT_PARTS, SC_LOGP, SC_LSE, SC_ENT, SC_N };

static const fg_logp_options *logp_opts(const fg_plan_desc *d) { return d->options; }

#define ALIGN_UP(x) (((x) + 255) & ~(size_t)255)

static bool has(const fg_tensor *t) { return t->rank != 0; }

static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

/* ------------------------------------------------------------------ validation */

static fg_status check_options(const char *op, const fg_logp_options *o, bool ce) {
    if (!(o->temperature >= 0.0) || !isfinite(o->temperature))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.temperature=%g must be finite and > 0 (0 means 1)", op,
                       o->temperature);
    if (!(o->softcap >= 0.0) || !isfinite(o->softcap))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.softcap=%g must be finite and >= 0", op, o->softcap);
    if (o->use_ignore_index != 0 && o->use_ignore_index != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.use_ignore_index=%d must be 0 or 1", op, o->use_ignore_index);
    if (o->max_tile_elements < 0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.max_tile_elements=%lld is negative", op,
                       (long long)o->max_tile_elements);
    if (o->vocab_start < 0 || o->vocab_total < 0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.vocab_start=%lld and logp.vocab_total=%lld must be >= 0", op,
                       (long long)o->vocab_start, (long long)o->vocab_total);
    if (o->vocab_total == 0 && o->vocab_start != 0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.vocab_start=%lld but logp.vocab_total=0 (unsharded)", op,
                       (long long)o->vocab_start);
    if (!ce) return FG_OK;
    if ((int)o->reduction < 0 || (int)o->reduction > FG_REDUCTION_NONE)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.reduction=%d is not an fg_reduction", op, (int)o->reduction);
    if (!(o->label_smoothing >= 0.0 && o->label_smoothing <= 1.0))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.label_smoothing=%g must be in [0, 1]", op, o->label_smoothing);
    if (!(o->z_loss >= 0.0) || !isfinite(o->z_loss))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.z_loss=%g must be finite and >= 0", op, o->z_loss);
    if (!isfinite(o->grad_scale))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: logp.grad_scale=%g must be finite", op, o->grad_scale);
    return FG_OK;
}

/* The shard [vocab_start, vocab_start + V) must lie in [0, vocab_total) (vocab_total 0: the
   whole vocabulary). */
static fg_status check_shard(const char *op, const fg_logp_options *o, int64_t V) {
    if (o->vocab_total != 0 && o->vocab_start > o->vocab_total - V)
        return fg_fail(FG_ERR_SHAPE, "%s: w.shape[0]=%lld rows from logp.vocab_start=%lld pass logp.vocab_total=%lld",
                       op, (long long)V, (long long)o->vocab_start, (long long)o->vocab_total);
    return FG_OK;
}

/* True for a shard that is not the whole vocabulary. */
static bool sharded(const fg_logp_options *o, int64_t V) {
    return o->vocab_total != 0 && !(o->vocab_start == 0 && o->vocab_total == V);
}

/* A row vector [N] of the accumulator type. */
static fg_status check_row(const char *op, const char *what, const fg_tensor *t, int64_t n, fg_dtype acc) {
    FG_TRY(fg_check_desc(op, what, t, 1, 1));
    if (t->dtype != acc)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(acc));
    if (t->shape[0] != n)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape[0]=%lld but N=%lld", op, what, (long long)t->shape[0],
                       (long long)n);
    return fg_check_contiguous(op, what, t);
}

/* A gradient output: the dtype of its input or the accumulator type, same shape. */
static fg_status check_grad(const char *op, const char *what, const fg_tensor *g, const fg_tensor *like) {
    FG_TRY(fg_check_desc(op, what, g, like->rank, like->rank));
    if (g->dtype != like->dtype && g->dtype != acc_of(like->dtype))
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but it must be %s or %s", op, what, fg_dtype_name(g->dtype),
                       fg_dtype_name(like->dtype), fg_dtype_name(acc_of(like->dtype)));
    for (int d = 0; d < like->rank; d++)
        if (g->shape[d] != like->shape[d])
            return fg_fail(FG_ERR_SHAPE, "%s: %s.shape[%d]=%lld but it must be %lld", op, what, d,
                           (long long)g->shape[d], (long long)like->shape[d]);
    return fg_check_contiguous(op, what, g);
}

/* h [N, D], w [V, D], b [V] (optional), target [N]. */
static fg_status check_inputs(const char *op, const fg_tensor *h, const fg_tensor *w, const fg_tensor *b,
                              const fg_tensor *t) {
    int64_t N, D, V;
    FG_TRY(fg_check_linear_operands(op, "h", h, 2, w, b, &N, &D, &V));
    FG_TRY(fg_check_any_desc(op, "target", t, 1, 1));
    if (t->dtype != FG_I32 && t->dtype != FG_I64)
        return fg_fail(FG_ERR_DTYPE, "%s: target is %s but it must be i32 or i64", op, fg_dtype_name(t->dtype));
    if (t->shape[0] != h->shape[0])
        return fg_fail(FG_ERR_SHAPE, "%s: target.shape[0]=%lld but h.shape[0]=N=%lld", op, (long long)t->shape[0],
                       (long long)h->shape[0]);
    /* A softmax over no classes has no value, and logits that depend on neither h nor w
       would cost N·V with nothing in memory to bound it. N = 0 is an empty batch. */
    if (V == 0 && N > 0)
        return fg_fail(FG_ERR_SHAPE, "%s: w.shape[0]=V=0: a softmax over no classes is undefined", op);
    if (D == 0 && N > 0)
        return fg_fail(FG_ERR_SHAPE, "%s: h.shape[1]=D=0: the logits would depend on neither h nor w", op);
    return fg_check_contiguous(op, "target", t);
}

/* ------------------------------------------------------------------ tiles and workspace */

typedef struct geom {
    int64_t N, D, V;
    int64_t R, Vc, ld;   /* rows per block, columns per tile, tile row stride */
} geom;

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Tiles of at most `budget` logits (the caller's max_tile_elements, else the library's
 * choice below): full rows when they fit (one row block), else as many rows of at least
 * min(V, 4096) columns as fit.
 *  forward   the backward's memory (0.45 bytes per logit), 4M..256M logits on CUDA: a
 *            fwd+bwd peaks no higher, and larger GEMMs ran faster (bench --logp-sweep)
 *  backward  aims the extra memory (tile + the f32 dh accumulator) at 0.45 bytes per logit
 *            (about a ninth of the f32 logits), within 4M..256M: fewer V tiles mean fewer passes
 *            over the dh accumulator (8 bytes per element of dh each), the op's main cost
 *            beyond its GEMMs
 *  one pass  full rows, N·V/4 within 64M..256M: each row tile re-reads and re-writes dw */
enum { GEOM_FORWARD, GEOM_BACKWARD, GEOM_ONE_PASS };

static geom make_geom(const fg_context *ctx, int64_t N, int64_t D, int64_t V, int64_t max_tile, int kind,
                      size_t es, int64_t acc_bytes) {
    geom g = {N, D, V, 1, 1, 1};
    if (N == 0 || V == 0) return g;
    const bool cuda = ctx->backend == FG_BACKEND_CUDA;
    const bool full_rows = kind == GEOM_ONE_PASS;
    int64_t budget = max_tile;
    if (budget <= 0) {
        const int64_t nv = N > INT64_MAX / V ? INT64_MAX / 8 : N * V;
        const int64_t lo = cuda ? (4ll << 20) : (1ll << 20), hi = cuda ? (64ll << 20) : (4ll << 20);
        if (kind == GEOM_FORWARD) budget = clamp64(nv / 20 * 9 / (int64_t)es, lo, 4 * hi);
        else if (kind == GEOM_BACKWARD) budget = clamp64((nv / 20 * 9 - acc_bytes) / (int64_t)es, lo, 4 * hi);
        else budget = clamp64(nv / 4, 16 * lo, 4 * hi);
    }
    if (full_rows) {
        g.Vc = V;
        g.R = clamp64(budget / V, 1, N);
    } else {
        /* rows split only below this many columns (the backward then needs an f32 dw
           accumulator and runs its products at lower efficiency) */
        const int64_t floor_cols = kind == GEOM_BACKWARD ? 1024 : 4096;
        int64_t min_cols = V < floor_cols ? V : floor_cols;
        if (min_cols > budget) min_cols = budget;
        g.R = clamp64(budget / min_cols, 1, N);
        g.Vc = clamp64(budget / g.R, 1, V);
        /* tiles of about equal width (a last narrow tile runs its GEMMs at low
           efficiency), in whole 128-column steps */
        if (g.Vc < V) {
            const int64_t tiles = (V + g.Vc - 1) / g.Vc, step = g.Vc >= 128 ? 128 : 8;
            g.Vc = ((V + tiles - 1) / tiles + step - 1) / step * step;
            if (g.Vc > V) g.Vc = V;
        }
    }
    if (g.R < N) { /* row blocks of equal height */
        const int64_t blocks = (N + g.R - 1) / g.R;
        g.R = (N + blocks - 1) / blocks;
    }
    g.ld = (g.Vc + 7) & ~(int64_t)7; /* 16-byte rows for the vector paths */
    return g;
}

/* Workspace regions, each 256-byte aligned. */
typedef struct layout {
    size_t gemm, tile, state, rc, loss_rows, scale, dh_acc, dw_acc, db_acc, scratch, total;
    size_t gemm_bytes, scratch_bytes;
} layout;

static size_t place(size_t *total, size_t bytes) {
    size_t at = *total;
    *total += ALIGN_UP(bytes);
    return at;
}

static void *at(void *ws, size_t off) { return ws ? (char *)ws + off : NULL; }

/* ------------------------------------------------------------------ steps */

typedef struct run_ctx {
    fg_context *ctx;
    const fg_plan_desc *d;
    const fg_tensor *ops;
    geom g;
    layout L;
    void *ws;
    bool run;
    bool size_only; /* planning the layout alone: GEMMs are not asked */
    fg_dtype dtype, acc;
    size_t es, aes;
    fg_kernel_info *info;
} run_ctx;

static fg_status step(run_ctx *r, const fg_logp_call *c) {
    if (!r->run) return FG_OK;
    return r->ctx->be->logp(r->ctx, c);
}

static size_t scratch_bytes(const fg_context *ctx, int64_t rows, int64_t cols) {
    return ctx->be->logp_scratch(rows, cols);
}

/* Runs (or, planning, sizes) one GEMM: c = a·b (+ bias), beta 0 or 1. */
static fg_status gemm(run_ctx *r, int64_t m, int64_t n, int64_t k, fg_mat a, fg_mat b, fg_mat c, double beta,
                      bool has_bias, const void *bias, bool c_f32) {
    if (!r->run && r->size_only) return FG_OK;
    fg_gemm g = fg_gemm_plain(r->dtype, 1, m, n, k, a, b, c, beta, has_bias, bias,
                              (r->d->flags & FG_PLAN_ALLOW_TF32) != 0, c_f32, r->d->alignment);
    return fg_gemm_walk(r->ctx, &g, r->run, at(r->ws, r->L.gemm), r->L.gemm_bytes, &r->L.gemm_bytes, r->info->name,
                        sizeof r->info->name);
}


/* Next start of a loop over [0, total) in steps: every step when running; when planning,
 * the first and the last (partial) step only — they bound every GEMM's needs. */
static int64_t next_start(const run_ctx *r, int64_t at, int64_t step, int64_t total) {
    if (r->run) return at + step;
    int64_t last = total > 0 ? (total - 1) / step * step : 0;
    return at < last ? last : total;
}

static const void *data_of(const run_ctx *r, int i) { return r->ops && has(&r->d->operands[i]) ? r->ops[i].data : NULL; }

/* cuBLASLt runs a product whose m, n or k is not a whole number of 16-byte vectors on its
 * scalar-load kernels, whatever the leading dimensions (GPT-2's vocabulary, 50257, is such an n;
 * decision 181 has the figures). On CUDA a tile's vocabulary
 * extent vc is therefore split into a bulk of whole vectors and a rest of fewer than one
 * vector, each its own product: the logits' columns and dw's rows are independent outputs,
 * and dh's sum over the vocabulary goes to an accumulator-dtype buffer, so neither split
 * rounds anything twice. Returns the bulk (vc when nothing is split). */
static int64_t vocab_bulk(const run_ctx *r, int64_t vc) {
    if (r->ctx->backend != FG_BACKEND_CUDA) return vc;
    const int64_t vec = 16 / (int64_t)r->es, bulk = vc / vec * vec;
    return bulk == 0 ? vc : bulk;
}

static void *offset(void *p, int64_t bytes) { return p ? (char *)p + bytes : NULL; }

/* z[rows × vc] = h[r0.., :]·w[v0.., :]ᵀ + b[v0..] into the tile. */
static fg_status tile_logits(run_ctx *r, int hi, int wi, int bi, int64_t r0, int64_t rows, int64_t v0, int64_t vc) {
    const int64_t D = r->g.D, es = (int64_t)r->es;
    const char *h = data_of(r, hi), *w = data_of(r, wi), *b = data_of(r, bi);
    bool bias = has(&r->d->operands[bi]);
    void *tile = r->ws ? at(r->ws, r->L.tile) : NULL;
    const int64_t bulk = vocab_bulk(r, vc);
    for (int64_t c0 = 0; c0 < vc; c0 = c0 == 0 ? bulk : vc) {
        const int64_t cols = c0 == 0 ? bulk : vc - bulk;
        FG_TRY(gemm(r, rows, cols, D, fg_mat_at(h ? (void *)(h + r0 * D * es) : NULL, D, 1),
                    fg_mat_at(w ? (void *)(w + (v0 + c0) * D * es) : NULL, 1, D),
                    fg_mat_at(offset(tile, c0 * es), r->g.ld, 1), 0.0, bias, b ? (const void *)(b + (v0 + c0) * es) : NULL,
                    false));
    }
    return FG_OK;
}

/* dw[v0.., :] (+)= dzᵀ·h[r0.., :] over the tile's vc columns, the bulk and the rest apart (c: dw's
 * rows from v0, ces bytes an element). */
static fg_status tile_dw(run_ctx *r, void *tile, const char *h, int64_t r0, int64_t rows, int64_t vc, void *c, size_t ces,
                         double beta, bool c_f32) {
    const int64_t D = r->g.D, es = (int64_t)r->es, bulk = vocab_bulk(r, vc);
    for (int64_t c0 = 0; c0 < vc; c0 = c0 == 0 ? bulk : vc)
        FG_TRY(gemm(r, c0 == 0 ? bulk : vc - bulk, D, rows, fg_mat_at(offset(tile, c0 * es), 1, r->g.ld),
                    fg_mat_at(h ? (void *)(h + r0 * D * es) : NULL, D, 1), fg_mat_at(offset(c, c0 * D * (int64_t)ces), D, 1),
                    beta, false, NULL, c_f32));
    return FG_OK;
}

/* dh[r0.., :] (+)= dz·w[v0.., :] over the tile's vc columns into c (rows from r0, the
 * accumulator's dtype whenever vc is split: the rest's product adds to the bulk's). */
static fg_status tile_dh(run_ctx *r, void *tile, const char *w, int64_t rows, int64_t v0, int64_t vc, void *c, double beta,
                         bool c_f32) {
    const int64_t D = r->g.D, es = (int64_t)r->es, bulk = vocab_bulk(r, vc);
    for (int64_t c0 = 0; c0 < vc; c0 = c0 == 0 ? bulk : vc)
        FG_TRY(gemm(r, rows, D, c0 == 0 ? bulk : vc - bulk, fg_mat_at(offset(tile, c0 * es), r->g.ld, 1),
                    fg_mat_at(w ? (void *)(w + (v0 + c0) * D * es) : NULL, D, 1), fg_mat_at(c, D, 1),
                    c0 == 0 ? beta : 1.0, false, NULL, c_f32));
    return FG_OK;
}

static fg_logp_call base_call(const run_ctx *r, fg_logp_step s, int ti) {
    fg_logp_call c;
    memset(&c, 0, sizeof c);
    c.step = s;
    c.dtype = r->dtype;
    c.acc = r->acc;
    c.z = r->ws ? at(r->ws, r->L.tile) : NULL;
    c.ld = r->g.ld;
    c.N = r->g.N;
    c.V = r->g.V;
    c.target = data_of(r, ti);
    c.target_dtype = r->d->operands[ti].dtype;
    const fg_logp_options *o = logp_opts(r->d);
    c.inv_temp = o->temperature > 0.0 ? 1.0 / o->temperature : 1.0;
    c.softcap = o->softcap;
    c.use_ignore = o->use_ignore_index != 0;
    c.ignore_index = o->ignore_index;
    c.label_smoothing = o->label_smoothing;
    c.z_loss = o->z_loss;
    c.grad_scale = o->grad_scale != 0.0 ? o->grad_scale : 1.0;
    c.reduction = (int)o->reduction;
    c.vstart = o->vocab_start;
    c.vslice = r->g.V;
    if (o->vocab_total != 0) c.V = o->vocab_total; /* the targets' range */
    c.shard = r->d->op == FG_OP_LINEAR_LOGP_SHARD_FORWARD;
    return c;
}

static fg_status cast(run_ctx *r, size_t src_off, void *dst, fg_dtype dst_dtype, int64_t n, bool accumulate) {
    fg_logp_call c = base_call(r, FG_LOGP_CAST, LF_T);
    c.src = at(r->ws, src_off);
    c.dst = dst;
    c.dst_dtype = dst_dtype;
    c.n = n;
    c.accumulate = accumulate;
    return step(r, &c);
}

/* The gradients of an empty batch (N = 0) are sums over no rows: dw [V, D] and db [V] are
 * written as zeros (k = 0 products), or left as they are when accumulating. */
static fg_status zero_sums(run_ctx *r, int dwi, int dbi) {
    const fg_plan_desc *d = r->d;
    if (d->accumulate) return FG_OK;
    const int64_t V = r->g.V, D = r->g.D;
    const fg_mat none = fg_mat_at(NULL, 1, 1);
    if (has(&d->operands[dwi]))
        FG_TRY(gemm(r, V, D, 0, none, none, fg_mat_at((void *)data_of(r, dwi), D, 1), 0.0, false, NULL,
                    d->operands[dwi].dtype == r->acc));
    if (has(&d->operands[dbi]))
        FG_TRY(gemm(r, 1, V, 0, none, none, fg_mat_at((void *)data_of(r, dbi), V, 1), 0.0, false, NULL,
                    d->operands[dbi].dtype == r->acc));
    return FG_OK;
}

/* ------------------------------------------------------------------ forward */

static fg_status forward(run_ctx *r) {
    const geom *g = &r->g;
    layout *L = &r->L;
    L->tile = place(&L->total, (size_t)(g->R * g->ld) * r->es);
    L->state = place(&L->total, (size_t)g->N * 5 * r->aes);
    for (int64_t r0 = 0; r0 < g->N; r0 = next_start(r, r0, g->R, g->N)) {
        const int64_t rows = g->N - r0 < g->R ? g->N - r0 : g->R;
        for (int64_t v0 = 0; v0 < g->V; v0 = next_start(r, v0, g->Vc, g->V)) {
            const int64_t vc = g->V - v0 < g->Vc ? g->V - v0 : g->Vc;
            FG_TRY(tile_logits(r, LF_H, LF_W, LF_B, r0, rows, v0, vc));
            fg_logp_call c = base_call(r, FG_LOGP_STATS, LF_T);
            c.state = r->ws ? at(r->ws, L->state) : NULL;
            c.r0 = r0, c.rows = rows, c.v0 = v0, c.cols = vc, c.first = v0 == 0;
            FG_TRY(step(r, &c));
        }
    }
    fg_logp_call c = base_call(r, FG_LOGP_FORWARD, LF_T);
    c.state = r->ws ? at(r->ws, L->state) : NULL;
    c.r0 = 0, c.rows = g->N;
    /* the shard forward's operands 4, 5 are lse_part, tlogit_part (the step writes the
       target's logit where the forward writes logp) */
    c.logp = (void *)data_of(r, c.shard ? LF_LSE : LF_LOGP);
    c.lse = (void *)data_of(r, c.shard ? LF_LOGP : LF_LSE);
    c.entropy = (void *)data_of(r, LF_ENT);
    return step(r, &c);
}

/* ------------------------------------------------------------------ backward */

static fg_status backward(run_ctx *r) {
    const fg_plan_desc *d = r->d;
    const geom *g = &r->g;
    layout *L = &r->L;
    const int64_t D = g->D;
    const bool want_dh = has(&d->operands[LB_DH]), want_dw = has(&d->operands[LB_DW]),
               want_db = has(&d->operands[LB_DB]);
    const bool dh_direct = want_dh && d->operands[LB_DH].dtype == r->acc;
    const bool dw_direct = want_dw && (d->operands[LB_DW].dtype == r->acc || g->R >= g->N);
    const bool dw_f32 = want_dw && d->operands[LB_DW].dtype == r->acc;
    L->tile = place(&L->total, (size_t)(g->R * g->ld) * r->es);
    L->rc = place(&L->total, (size_t)g->N * 6 * r->aes);
    L->dh_acc = place(&L->total, want_dh && !dh_direct ? (size_t)(g->N * D) * r->aes : 0);
    L->dw_acc = place(&L->total, want_dw && !dw_direct ? (size_t)(g->Vc * D) * r->aes : 0);
    L->db_acc = place(&L->total, want_db ? (size_t)g->V * r->aes : 0);
    L->scratch_bytes = want_db ? scratch_bytes(r->ctx, g->R, g->Vc) : 0;
    L->scratch = place(&L->total, L->scratch_bytes);

    fg_logp_call c = base_call(r, FG_LOGP_COEF, LB_T);
    c.rc = r->ws ? at(r->ws, L->rc) : NULL;
    c.r0 = 0, c.rows = g->N;
    c.dlogp = data_of(r, LB_DLOGP);
    c.dentropy = data_of(r, LB_DENT);
    c.dlse = data_of(r, LB_DLSE);
    c.lse_in = data_of(r, LB_LSE);
    c.entropy_in = data_of(r, LB_ENT);
    FG_TRY(step(r, &c));
    if (!want_dh && !want_dw && !want_db) return FG_OK;
    if (g->N == 0) return zero_sums(r, LB_DW, LB_DB);

    char *h = (char *)data_of(r, LB_H), *w = (char *)data_of(r, LB_W);
    char *dh = (char *)data_of(r, LB_DH), *dw = (char *)data_of(r, LB_DW);
    const size_t dh_es = want_dh ? fg_dtype_size(d->operands[LB_DH].dtype) : 0;
    const size_t dw_es = want_dw ? fg_dtype_size(d->operands[LB_DW].dtype) : 0;
    for (int64_t v0 = 0; v0 < g->V; v0 = next_start(r, v0, g->Vc, g->V)) {
        const int64_t vc = g->V - v0 < g->Vc ? g->V - v0 : g->Vc;
        for (int64_t r0 = 0; r0 < g->N; r0 = next_start(r, r0, g->R, g->N)) {
            const int64_t rows = g->N - r0 < g->R ? g->N - r0 : g->R;
            FG_TRY(tile_logits(r, LB_H, LB_W, LB_B, r0, rows, v0, vc));
            fg_logp_call s = base_call(r, FG_LOGP_GRAD, LB_T);
            s.rc = r->ws ? at(r->ws, L->rc) : NULL;
            s.r0 = r0, s.rows = rows, s.v0 = v0, s.cols = vc, s.first = r0 == 0;
            s.db_acc = want_db && r->ws ? at(r->ws, L->db_acc) : NULL;
            s.scratch = r->ws ? at(r->ws, L->scratch) : NULL;
            s.scratch_bytes = L->scratch_bytes;
            FG_TRY(step(r, &s));
            void *tile = r->ws ? at(r->ws, L->tile) : NULL;
            if (want_dw) { /* dw[v0.., :] (+)= dzᵀ·h[r0.., :] */
                void *c_ptr = dw_direct ? (void *)(dw ? dw + v0 * D * (int64_t)dw_es : NULL)
                                        : (r->ws ? at(r->ws, L->dw_acc) : NULL);
                bool add = dw_direct ? (d->accumulate || r0 > 0) : r0 > 0;
                FG_TRY(tile_dw(r, tile, h, r0, rows, vc, c_ptr, dw_direct ? dw_es : r->aes, add ? 1.0 : 0.0,
                               dw_direct ? dw_f32 : true));
            }
            if (want_dh) { /* dh[r0.., :] (+)= dz·w[v0.., :] */
                void *c_ptr = dh_direct ? (void *)(dh ? dh + r0 * D * (int64_t)dh_es : NULL)
                                        : (r->ws ? (char *)at(r->ws, L->dh_acc) + r0 * D * (int64_t)r->aes : NULL);
                bool add = v0 > 0 || (dh_direct && d->accumulate);
                FG_TRY(tile_dh(r, tile, w, rows, v0, vc, c_ptr, add ? 1.0 : 0.0, true));
            }
        }
        if (want_dw && !dw_direct)
            FG_TRY(cast(r, L->dw_acc, dw ? dw + v0 * D * (int64_t)dw_es : NULL, d->operands[LB_DW].dtype, vc * D,
                        d->accumulate));
    }
    if (want_dh && !dh_direct) FG_TRY(cast(r, L->dh_acc, dh, d->operands[LB_DH].dtype, g->N * D, d->accumulate));
    if (want_db) FG_TRY(cast(r, L->db_acc, (void *)data_of(r, LB_DB), d->operands[LB_DB].dtype, g->V, d->accumulate));
    return FG_OK;
}

/* ------------------------------------------------------------------ one pass */

static fg_status cross_entropy(run_ctx *r) {
    const fg_plan_desc *d = r->d;
    const geom *g = &r->g;
    layout *L = &r->L;
    const int64_t D = g->D;
    const bool want_dh = has(&d->operands[CE_DH]), want_dw = has(&d->operands[CE_DW]),
               want_db = has(&d->operands[CE_DB]);
    const bool none = logp_opts(d)->reduction == FG_REDUCTION_NONE;
    L->tile = place(&L->total, (size_t)(g->R * g->ld) * r->es);
    L->state = place(&L->total, (size_t)g->N * 5 * r->aes);
    L->rc = place(&L->total, (size_t)g->N * 6 * r->aes);
    L->loss_rows = place(&L->total, none ? 0 : (size_t)g->N * r->aes);
    L->scale = place(&L->total, 2 * r->aes);
    L->db_acc = place(&L->total, want_db ? (size_t)g->V * r->aes : 0);
    L->scratch_bytes = want_db ? scratch_bytes(r->ctx, g->R, g->Vc) : 0;
    L->scratch = place(&L->total, L->scratch_bytes);
    /* a split vocabulary sums dh in two products: a row block's f32 rows between them */
    const bool dh_via_acc = want_dh && vocab_bulk(r, g->V) < g->V && d->operands[CE_DH].dtype != r->acc;
    L->dh_acc = place(&L->total, dh_via_acc ? (size_t)(g->R * D) * r->aes : 0);
    void *ws = r->ws;

    fg_logp_call c = base_call(r, FG_LOGP_COUNT, CE_T);
    c.scale = ws ? at(ws, L->scale) : NULL;
    c.r0 = 0, c.rows = g->N;
    FG_TRY(step(r, &c));

    char *h = (char *)data_of(r, CE_H), *w = (char *)data_of(r, CE_W);
    char *dh = (char *)data_of(r, CE_DH), *dw = (char *)data_of(r, CE_DW);
    const size_t dh_es = want_dh ? fg_dtype_size(d->operands[CE_DH].dtype) : 0;
    void *tile = ws ? at(ws, L->tile) : NULL;
    for (int64_t r0 = 0; r0 < g->N; r0 = next_start(r, r0, g->R, g->N)) {
        const int64_t rows = g->N - r0 < g->R ? g->N - r0 : g->R;
        FG_TRY(tile_logits(r, CE_H, CE_W, CE_B, r0, rows, 0, g->V));
        fg_logp_call s = base_call(r, FG_LOGP_STATS, CE_T);
        s.state = ws ? at(ws, L->state) : NULL;
        s.r0 = r0, s.rows = rows, s.v0 = 0, s.cols = g->V, s.first = true;
        FG_TRY(step(r, &s));
        fg_logp_call f = base_call(r, FG_LOGP_CE, CE_T);
        f.state = s.state;
        f.rc = ws ? at(ws, L->rc) : NULL;
        f.scale = c.scale;
        f.r0 = r0, f.rows = rows;
        f.row_weight = data_of(r, CE_RW);
        f.loss_rows = none ? (void *)data_of(r, CE_LOSS) : (ws ? at(ws, L->loss_rows) : NULL);
        f.lse = (void *)data_of(r, CE_LSE);
        FG_TRY(step(r, &f));
        if (want_dh || want_dw || want_db) {
            fg_logp_call gr = base_call(r, FG_LOGP_GRAD, CE_T);
            gr.rc = f.rc;
            gr.r0 = r0, gr.rows = rows, gr.v0 = 0, gr.cols = g->V, gr.first = r0 == 0;
            gr.db_acc = want_db && ws ? at(ws, L->db_acc) : NULL;
            gr.scratch = ws ? at(ws, L->scratch) : NULL;
            gr.scratch_bytes = L->scratch_bytes;
            FG_TRY(step(r, &gr));
        }
        if (want_dh && dh_via_acc) { /* the bulk and the rest into f32 rows, then dh's dtype */
            FG_TRY(tile_dh(r, tile, w, rows, 0, g->V, ws ? at(ws, L->dh_acc) : NULL, 0.0, true));
            FG_TRY(cast(r, L->dh_acc, dh ? dh + r0 * D * (int64_t)dh_es : NULL, d->operands[CE_DH].dtype, rows * D,
                        d->accumulate));
        } else if (want_dh) {
            FG_TRY(tile_dh(r, tile, w, rows, 0, g->V, dh ? dh + r0 * D * (int64_t)dh_es : NULL, d->accumulate ? 1.0 : 0.0,
                           d->operands[CE_DH].dtype == r->acc));
        }
        if (want_dw)
            FG_TRY(tile_dw(r, tile, h, r0, rows, g->V, dw, fg_dtype_size(d->operands[CE_DW].dtype),
                           (d->accumulate || r0 > 0) ? 1.0 : 0.0, d->operands[CE_DW].dtype == r->acc));
    }
    if (!none) {
        fg_logp_call red = base_call(r, FG_LOGP_REDUCE, CE_T);
        red.loss_rows = ws ? at(ws, L->loss_rows) : NULL;
        red.loss_out = (void *)data_of(r, CE_LOSS);
        red.scale = c.scale;
        red.r0 = 0, red.rows = g->N;
        FG_TRY(step(r, &red));
    }
    if (g->N == 0) return zero_sums(r, CE_DW, CE_DB);
    if (want_db) FG_TRY(cast(r, L->db_acc, (void *)data_of(r, CE_DB), d->operands[CE_DB].dtype, g->V, d->accumulate));
    return FG_OK;
}

/* ------------------------------------------------------------------ driver */

static fg_status driver(fg_context *ctx, const fg_plan_desc *d, const fg_tensor *ops, void *priv, fg_kernel_info *info,
                        void *ws, size_t ws_bytes, bool run) {
    const int hi = d->op == FG_OP_LINEAR_LOGP_BACKWARD ? LB_H : LF_H; /* h, w at 0, 1 or 3, 4 */
    const fg_tensor *h = &d->operands[hi], *w = &d->operands[hi + 1];
    run_ctx r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    r.d = d;
    r.ops = ops;
    r.dtype = h->dtype;
    r.acc = acc_of(h->dtype);
    r.es = fg_dtype_size(r.dtype);
    r.aes = fg_dtype_size(r.acc);
    r.info = info;
    const bool fwd = d->op == FG_OP_LINEAR_LOGP_FORWARD || d->op == FG_OP_LINEAR_LOGP_SHARD_FORWARD;
    const int kind = fwd                                   ? GEOM_FORWARD
                     : d->op == FG_OP_LINEAR_LOGP_BACKWARD ? GEOM_BACKWARD
                                                           : GEOM_ONE_PASS;
    int64_t acc_bytes = 0; /* the backward's f32 dh accumulator */
    if (kind == GEOM_BACKWARD && has(&d->operands[LB_DH]) && d->operands[LB_DH].dtype != r.acc)
        acc_bytes = h->shape[0] * h->shape[1] * (int64_t)r.aes;
    r.g = make_geom(ctx, h->shape[0], h->shape[1], w->shape[0], logp_opts(d)->max_tile_elements, kind, r.es, acc_bytes);
    const char *name = d->op == FG_OP_LINEAR_LOGP_FORWARD         ? "linear_logp_forward"
                       : d->op == FG_OP_LINEAR_LOGP_SHARD_FORWARD ? "linear_logp_shard_forward"
                       : d->op == FG_OP_LINEAR_LOGP_BACKWARD      ? "linear_logp_backward"
                                                                  : "linear_cross_entropy";
    if (r.dtype == FG_F64 && !ctx->be->f64_kernels)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: the %s backend has no f64 kernels for it (f64 runs on the CPU)", name,
                       ctx->be->name);
    if (!run) {
        /* plan: size every region and every GEMM (the first of each loop is enough) */
        info->name[0] = 0;
        fg_status s = fwd                                   ? forward(&r)
                      : d->op == FG_OP_LINEAR_LOGP_BACKWARD ? backward(&r)
                                                            : cross_entropy(&r);
        if (s != FG_OK) return s;
        /* the GEMMs' names whole (a split vocabulary runs up to six): the tests compare them */
        char gemm_name[sizeof info->name];
        memcpy(gemm_name, info->name, sizeof gemm_name);
        snprintf(info->name, sizeof info->name, "tiles %lldx%lld: %.*s + %s rows", (long long)r.g.R,
                 (long long)r.g.Vc, (int)(sizeof info->name - 48), gemm_name, ctx->be->name);
        info->workspace_bytes = r.L.total + ALIGN_UP(r.L.gemm_bytes);
        info->deterministic = true;
        info->accumulator = r.acc;
        return FG_OK;
    }
    /* run: size the regions (the same walk without asking the GEMMs), then walk again
       with the GEMMs' workspace after the last region */
    r.size_only = true;
    fg_status s = fwd                                   ? forward(&r)
                  : d->op == FG_OP_LINEAR_LOGP_BACKWARD ? backward(&r)
                                                        : cross_entropy(&r);
    if (s != FG_OK) return s;
    const size_t gemm_at = r.L.total;
    if (ws_bytes < gemm_at)
        return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, more than %zu needed", name, ws_bytes,
                       gemm_at);
    memset(&r.L, 0, sizeof r.L);
    r.L.gemm = gemm_at;
    r.L.gemm_bytes = ws_bytes - gemm_at;
    r.size_only = false;
    r.ws = ws;
    r.ops = ops;
    r.run = true;
    return fwd                                   ? forward(&r)
           : d->op == FG_OP_LINEAR_LOGP_BACKWARD ? backward(&r)
                                                 : cross_entropy(&r);
}

/* ------------------------------------------------------------------ lowering (validation) */

static fg_status lower_forward(const fg_plan_desc *d, fg_lowered *out) {
    const bool shard = d->op == FG_OP_LINEAR_LOGP_SHARD_FORWARD;
    const char *op = shard ? "linear_logp_shard_forward" : "linear_logp_forward";
    const fg_tensor *o = d->operands;
    const fg_logp_options *lo = logp_opts(d);
    FG_TRY(check_options(op, lo, false));
    if (shard && lo->label_smoothing != 0.0)
        return fg_fail(FG_ERR_UNSUPPORTED,
                       "%s: logp.label_smoothing=%g: smoothing needs the sum of the logits over the whole "
                       "vocabulary, which the shard parts do not carry; use label_smoothing 0",
                       op, lo->label_smoothing);
    FG_TRY(check_inputs(op, &o[LF_H], &o[LF_W], &o[LF_B], &o[LF_T]));
    const int64_t N = o[LF_H].shape[0], V = o[LF_W].shape[0];
    FG_TRY(check_shard(op, lo, V));
    if (!shard && sharded(lo, V))
        return fg_fail(FG_ERR_UNSUPPORTED,
                       "%s: logp.vocab_start=%lld, logp.vocab_total=%lld is a shard of the vocabulary; its log-probs "
                       "need the other shards (linear_logp_shard_forward, then linear_logp_shard_combine)",
                       op, (long long)lo->vocab_start, (long long)lo->vocab_total);
    const fg_dtype acc = acc_of(o[LF_H].dtype);
    FG_TRY(check_row(op, shard ? "lse_part" : "logp", &o[LF_LOGP], N, acc));
    FG_TRY(check_row(op, shard ? "tlogit_part" : "lse", &o[LF_LSE], N, acc));
    if (has(&o[LF_ENT])) FG_TRY(check_row(op, shard ? "entropy_part" : "entropy", &o[LF_ENT], N, acc));
    out->driver = driver;
    return FG_OK;
}

/* COMBINE needs no tile and no GEMM: one backend step over all rows. */
static fg_status combine_driver(fg_context *ctx, const fg_plan_desc *d, const fg_tensor *ops, void *priv,
                                fg_kernel_info *info, void *ws, size_t ws_bytes, bool run) {
    (void)priv, (void)ws, (void)ws_bytes;
    const fg_tensor *lp = &d->operands[SC_LSE_PARTS];
    const fg_dtype acc = lp->dtype;
    if (acc == FG_F64 && !ctx->be->f64_kernels)
        return fg_fail(FG_ERR_UNSUPPORTED, "linear_logp_shard_combine: the %s backend has no f64 kernels for it "
                       "(f64 runs on the CPU)", ctx->be->name);
    if (!run) {
        snprintf(info->name, sizeof info->name, "logp_combine");
        info->workspace_bytes = 0;
        info->deterministic = true;
        info->accumulator = acc;
        return FG_OK;
    }
    const fg_logp_options *o = logp_opts(d);
    fg_logp_call c;
    memset(&c, 0, sizeof c);
    c.step = FG_LOGP_COMBINE;
    c.dtype = c.acc = acc;
    c.N = lp->shape[1];
    c.r0 = 0, c.rows = c.N;
    c.nparts = lp->shape[0];
    c.t_parts = d->operands[SC_TLOGIT_PARTS].rank == 2 ? d->operands[SC_TLOGIT_PARTS].shape[0] : 1;
    c.target = ops[SC_T].data;
    c.target_dtype = d->operands[SC_T].dtype;
    c.use_ignore = o->use_ignore_index != 0;
    c.ignore_index = o->ignore_index;
    c.lse_parts = ops[SC_LSE_PARTS].data;
    c.tlogit_parts = ops[SC_TLOGIT_PARTS].data;
    c.entropy_parts = has(&d->operands[SC_ENT_PARTS]) ? ops[SC_ENT_PARTS].data : NULL;
    c.logp = ops[SC_LOGP].data;
    c.lse = ops[SC_LSE].data;
    c.entropy = has(&d->operands[SC_ENT]) ? ops[SC_ENT].data : NULL;
    return ctx->be->logp(ctx, &c);
}

/* [R, N] parts of the accumulator type. */
static fg_status check_parts(const char *op, const char *what, const fg_tensor *t, int64_t R, int64_t N, fg_dtype acc) {
    FG_TRY(fg_check_desc(op, what, t, 2, 2));
    if (t->dtype != acc)
        return fg_fail(FG_ERR_DTYPE, "%s: %s is %s but lse_parts is %s", op, what, fg_dtype_name(t->dtype),
                       fg_dtype_name(acc));
    if (t->shape[0] != R || t->shape[1] != N)
        return fg_fail(FG_ERR_SHAPE, "%s: %s is [%lld, %lld] but it must be [R=%lld, N=%lld]", op, what,
                       (long long)t->shape[0], (long long)t->shape[1], (long long)R, (long long)N);
    return fg_check_contiguous(op, what, t);
}

static fg_status lower_combine(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_logp_shard_combine";
    const fg_tensor *o = d->operands;
    FG_TRY(check_options(op, logp_opts(d), false));
    FG_TRY(fg_check_any_desc(op, "target", &o[SC_T], 1, 1));
    if (o[SC_T].dtype != FG_I32 && o[SC_T].dtype != FG_I64)
        return fg_fail(FG_ERR_DTYPE, "%s: target is %s but it must be i32 or i64", op, fg_dtype_name(o[SC_T].dtype));
    FG_TRY(fg_check_contiguous(op, "target", &o[SC_T]));
    const int64_t N = o[SC_T].shape[0];
    FG_TRY(fg_check_desc(op, "lse_parts", &o[SC_LSE_PARTS], 2, 2));
    const fg_dtype acc = o[SC_LSE_PARTS].dtype;
    if (acc != FG_F32 && acc != FG_F64)
        return fg_fail(FG_ERR_DTYPE, "%s: lse_parts is %s but it must be f32 or f64", op, fg_dtype_name(acc));
    const int64_t R = o[SC_LSE_PARTS].shape[0];
    if (R < 1) return fg_fail(FG_ERR_SHAPE, "%s: lse_parts.shape[0]=R=0: there are no shards", op);
    FG_TRY(check_parts(op, "lse_parts", &o[SC_LSE_PARTS], R, N, acc));
    if (o[SC_TLOGIT_PARTS].rank == 2) FG_TRY(check_parts(op, "tlogit_parts", &o[SC_TLOGIT_PARTS], R, N, acc));
    else FG_TRY(check_row(op, "tlogit_parts", &o[SC_TLOGIT_PARTS], N, acc));
    if (has(&o[SC_ENT_PARTS])) FG_TRY(check_parts(op, "entropy_parts", &o[SC_ENT_PARTS], R, N, acc));
    FG_TRY(check_row(op, "logp", &o[SC_LOGP], N, acc));
    FG_TRY(check_row(op, "lse", &o[SC_LSE], N, acc));
    if (has(&o[SC_ENT])) {
        if (!has(&o[SC_ENT_PARTS]))
            return fg_fail(FG_ERR_NULL_POINTER, "%s: entropy is requested but entropy_parts is absent", op);
        FG_TRY(check_row(op, "entropy", &o[SC_ENT], N, acc));
    }
    out->driver = combine_driver;
    return FG_OK;
}

static fg_status lower_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_logp_backward";
    const fg_tensor *o = d->operands;
    FG_TRY(check_options(op, logp_opts(d), false));
    FG_TRY(check_inputs(op, &o[LB_H], &o[LB_W], &o[LB_B], &o[LB_T]));
    FG_TRY(check_shard(op, logp_opts(d), o[LB_W].shape[0]));
    const int64_t N = o[LB_H].shape[0];
    const fg_dtype acc = acc_of(o[LB_H].dtype);
    if (!has(&o[LB_DLOGP]) && !has(&o[LB_DENT]) && !has(&o[LB_DLSE]))
        return fg_fail(FG_ERR_NULL_POINTER, "%s: dlogp, dentropy and dlse are all absent; give at least one", op);
    if (has(&o[LB_DLOGP])) FG_TRY(check_row(op, "dlogp", &o[LB_DLOGP], N, acc));
    if (has(&o[LB_DENT])) {
        FG_TRY(check_row(op, "dentropy", &o[LB_DENT], N, acc));
        if (!has(&o[LB_ENT])) return fg_fail(FG_ERR_NULL_POINTER, "%s: dentropy is given but entropy is absent", op);
    }
    if (has(&o[LB_DLSE])) FG_TRY(check_row(op, "dlse", &o[LB_DLSE], N, acc));
    FG_TRY(check_row(op, "lse", &o[LB_LSE], N, acc));
    if (has(&o[LB_ENT])) FG_TRY(check_row(op, "entropy", &o[LB_ENT], N, acc));
    if (has(&o[LB_DH])) FG_TRY(check_grad(op, "dh", &o[LB_DH], &o[LB_H]));
    if (has(&o[LB_DW])) FG_TRY(check_grad(op, "dw", &o[LB_DW], &o[LB_W]));
    if (has(&o[LB_DB])) {
        if (!has(&o[LB_B])) return fg_fail(FG_ERR_NULL_POINTER, "%s: db is requested but b is absent", op);
        FG_TRY(check_grad(op, "db", &o[LB_DB], &o[LB_B]));
    }
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_cross_entropy(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_cross_entropy";
    const fg_tensor *o = d->operands;
    FG_TRY(check_options(op, logp_opts(d), true));
    FG_TRY(check_inputs(op, &o[CE_H], &o[CE_W], &o[CE_B], &o[CE_T]));
    const fg_logp_options *lo = logp_opts(d);
    FG_TRY(check_shard(op, lo, o[CE_W].shape[0]));
    if (sharded(lo, o[CE_W].shape[0]))
        return fg_fail(FG_ERR_UNSUPPORTED,
                       "%s: logp.vocab_start=%lld, logp.vocab_total=%lld is a shard of the vocabulary; the one pass "
                       "needs the global lse before its gradients (linear_logp_shard_forward, "
                       "linear_logp_shard_combine, then linear_logp_backward)",
                       op, (long long)lo->vocab_start, (long long)lo->vocab_total);
    const int64_t N = o[CE_H].shape[0];
    const fg_dtype acc = acc_of(o[CE_H].dtype);
    if (has(&o[CE_RW])) FG_TRY(check_row(op, "row_weight", &o[CE_RW], N, acc));
    FG_TRY(check_row(op, "loss", &o[CE_LOSS], logp_opts(d)->reduction == FG_REDUCTION_NONE ? N : 1, acc));
    if (has(&o[CE_LSE])) FG_TRY(check_row(op, "lse", &o[CE_LSE], N, acc));
    if (has(&o[CE_DH])) FG_TRY(check_grad(op, "dh", &o[CE_DH], &o[CE_H]));
    if (has(&o[CE_DW])) FG_TRY(check_grad(op, "dw", &o[CE_DW], &o[CE_W]));
    if (has(&o[CE_DB])) {
        if (!has(&o[CE_B])) return fg_fail(FG_ERR_NULL_POINTER, "%s: db is requested but b is absent", op);
        FG_TRY(check_grad(op, "db", &o[CE_DB], &o[CE_B]));
    }
    out->driver = driver;
    return FG_OK;
}

#define OPTS "fg_logp_options", sizeof(fg_logp_options)
#define IN(n) {n, false, false}
#define IN_OPT(n) {n, false, true}
#define OUT(n) {n, true, false}
#define OUT_OPT(n) {n, true, true}
static const fg_op_decl ops[] = {
    {FG_OP_LINEAR_LOGP_FORWARD, "linear_logp_forward", LF_N,
     {[LF_H] = IN("h"), [LF_W] = IN("w"), [LF_B] = IN_OPT("b"), [LF_T] = IN("target"), [LF_LOGP] = OUT("logp"),
      [LF_LSE] = OUT("lse"), [LF_ENT] = OUT_OPT("entropy")},
     0, OPTS, false, lower_forward},
    {FG_OP_LINEAR_LOGP_BACKWARD, "linear_logp_backward", LB_N,
     {[LB_DLOGP] = IN_OPT("dlogp"), [LB_DENT] = IN_OPT("dentropy"), [LB_DLSE] = IN_OPT("dlse"), [LB_H] = IN("h"),
      [LB_W] = IN("w"), [LB_B] = IN_OPT("b"), [LB_T] = IN("target"), [LB_LSE] = IN("lse"),
      [LB_ENT] = IN_OPT("entropy"), [LB_DH] = OUT_OPT("dh"), [LB_DW] = OUT_OPT("dw"), [LB_DB] = OUT_OPT("db")},
     0, OPTS, false, lower_backward},
    {FG_OP_LINEAR_CROSS_ENTROPY, "linear_cross_entropy", CE_N,
     {[CE_H] = IN("h"), [CE_W] = IN("w"), [CE_B] = IN_OPT("b"), [CE_T] = IN("target"), [CE_RW] = IN_OPT("row_weight"),
      [CE_LOSS] = OUT("loss"), [CE_LSE] = OUT_OPT("lse"), [CE_DH] = OUT_OPT("dh"), [CE_DW] = OUT_OPT("dw"),
      [CE_DB] = OUT_OPT("db")},
     0, OPTS, false, lower_cross_entropy},
    {FG_OP_LINEAR_LOGP_SHARD_FORWARD, "linear_logp_shard_forward", LF_N,
     {[LF_H] = IN("h"), [LF_W] = IN("w"), [LF_B] = IN_OPT("b"), [LF_T] = IN("target"), [LF_LOGP] = OUT("lse_part"),
      [LF_LSE] = OUT("tlogit_part"), [LF_ENT] = OUT_OPT("entropy_part")},
     0, OPTS, false, lower_forward},
    {FG_OP_LINEAR_LOGP_SHARD_COMBINE, "linear_logp_shard_combine", SC_N,
     {[SC_T] = IN("target"), [SC_LSE_PARTS] = IN("lse_parts"), [SC_TLOGIT_PARTS] = IN("tlogit_parts"),
      [SC_ENT_PARTS] = IN_OPT("entropy_parts"), [SC_LOGP] = OUT("logp"), [SC_LSE] = OUT("lse"),
      [SC_ENT] = OUT_OPT("entropy")},
     0, OPTS, false, lower_combine},
};
#undef OPTS
#undef IN
#undef IN_OPT
#undef OUT
#undef OUT_OPT

const fg_family fg_family_linear_logp = {"linear_logp", sizeof ops / sizeof ops[0], ops};

/* ------------------------------------------------------------------ one-call functions */

fg_status fg_linear_logp_forward(fg_context *ctx, const fg_logp_options *opt, const fg_tensor *h,
                                 const fg_tensor *w, const fg_tensor *b, const fg_tensor *target,
                                 const fg_tensor *logp, const fg_tensor *lse, const fg_tensor *entropy) {
    const fg_tensor *args[LF_N] = {h, w, b, target, logp, lse, entropy};
    return fg_run_op(ctx, FG_OP_LINEAR_LOGP_FORWARD, opt, args, LF_N, 0, 0);
}

fg_status fg_linear_logp_backward(fg_context *ctx, const fg_logp_options *opt, const fg_tensor *dlogp,
                                  const fg_tensor *dentropy, const fg_tensor *dlse, const fg_tensor *h,
                                  const fg_tensor *w, const fg_tensor *b, const fg_tensor *target,
                                  const fg_tensor *lse, const fg_tensor *entropy, const fg_tensor *dh,
                                  const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    const fg_tensor *args[LB_N] = {dlogp, dentropy, dlse, h, w, b, target, lse, entropy, dh, dw, db};
    return fg_run_op(ctx, FG_OP_LINEAR_LOGP_BACKWARD, opt, args, LB_N, accumulate, 0);
}

fg_status fg_linear_cross_entropy(fg_context *ctx, const fg_logp_options *opt, const fg_tensor *h,
                                  const fg_tensor *w, const fg_tensor *b, const fg_tensor *target,
                                  const fg_tensor *row_weight, const fg_tensor *loss, const fg_tensor *lse,
                                  const fg_tensor *dh, const fg_tensor *dw, const fg_tensor *db, int accumulate) {
    const fg_tensor *args[CE_N] = {h, w, b, target, row_weight, loss, lse, dh, dw, db};
    return fg_run_op(ctx, FG_OP_LINEAR_CROSS_ENTROPY, opt, args, CE_N, accumulate, 0);
}

fg_status fg_linear_logp_shard_forward(fg_context *ctx, const fg_logp_options *opt, const fg_tensor *h,
                                       const fg_tensor *w, const fg_tensor *b, const fg_tensor *target,
                                       const fg_tensor *lse_part, const fg_tensor *tlogit_part,
                                       const fg_tensor *entropy_part) {
    const fg_tensor *args[LF_N] = {h, w, b, target, lse_part, tlogit_part, entropy_part};
    return fg_run_op(ctx, FG_OP_LINEAR_LOGP_SHARD_FORWARD, opt, args, LF_N, 0, 0);
}

fg_status fg_linear_logp_shard_combine(fg_context *ctx, const fg_logp_options *opt, const fg_tensor *target,
                                       const fg_tensor *lse_parts, const fg_tensor *tlogit_parts,
                                       const fg_tensor *entropy_parts, const fg_tensor *logp, const fg_tensor *lse,
                                       const fg_tensor *entropy) {
    const fg_tensor *args[SC_N] = {target, lse_parts, tlogit_parts, entropy_parts, logp, lse, entropy};
    return fg_run_op(ctx, FG_OP_LINEAR_LOGP_SHARD_COMBINE, opt, args, SC_N, 0, 0);
}

/*
 * tensor.c — checks on fg_tensor descriptors shared by every op's front door:
 * structure (dtype, rank, shapes, strides, int64 overflow) when a plan is made, and
 * data (NULL, alignment, device, overlap) when it runs. Also small view helpers.
 */
#include "checks.h"

#include <stdio.h>
#include <string.h>

#ifdef FG_HAVE_CUDA
fg_status fg_cuda_check_pointer(const fg_context *ctx, const char *op, const char *what,
                                const void *ptr);
/* Whether ptr lies in a device allocation on ctx's device; its range [lo, hi) when it does. */
bool fg_cuda_device_range(const fg_context *ctx, const void *ptr, uintptr_t *lo, uintptr_t *hi);
#endif

void fg_tensor_strides(const fg_tensor *t, int64_t stride[FG_MAX_RANK]) {
    bool all_zero = true;
    for (int i = 0; i < t->rank; i++) all_zero = all_zero && t->stride[i] == 0;
    if (!all_zero) {
        for (int i = 0; i < t->rank; i++) stride[i] = t->stride[i];
        return;
    }
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        stride[i] = s;
        s *= t->shape[i] > 0 ? t->shape[i] : 1;
    }
}

const char *fg_shape_str(const fg_tensor *t, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->rank && i < FG_MAX_RANK && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld",
                                 (long long)t->shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

bool fg_is_contiguous(const fg_tensor *t) {
    int64_t s = 1;
    bool all_zero = true;
    for (int i = 0; i < t->rank; i++) all_zero = all_zero && t->stride[i] == 0;
    if (all_zero) return true;
    for (int i = t->rank - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

int64_t fg_numel(const fg_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

int64_t fg_extent_bytes(const fg_tensor *t) {
    int64_t stride[FG_MAX_RANK];
    fg_tensor_strides(t, stride);
    int64_t last = 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] == 0) return 0;
        last += (t->shape[i] - 1) * stride[i];
    }
    return (last + 1) * (int64_t)fg_dtype_size(t->dtype);
}

fg_status fg_check_desc(const char *op, const char *what, const fg_tensor *t, int rank_lo,
                        int rank_hi) {
    if (!t) return fg_fail(FG_ERR_NULL_POINTER, "%s: %s is NULL", op, what);
    if (fg_dtype_size(t->dtype) != 0 && !fg_is_float(t->dtype))
        return fg_fail(FG_ERR_DTYPE, "%s: %s.dtype is %s but it must be a float dtype", op, what,
                       fg_dtype_name(t->dtype));
    return fg_check_any_desc(op, what, t, rank_lo, rank_hi);
}

fg_status fg_check_any_desc(const char *op, const char *what, const fg_tensor *t, int rank_lo,
                            int rank_hi) {
    if (!t) return fg_fail(FG_ERR_NULL_POINTER, "%s: %s is NULL", op, what);
    if (fg_dtype_size(t->dtype) == 0)
        return fg_fail(FG_ERR_DTYPE, "%s: %s.dtype=%d is not a dtype", op, what, (int)t->dtype);
    if (t->rank < rank_lo || t->rank > rank_hi) {
        if (rank_lo == rank_hi)
            return fg_fail(FG_ERR_SHAPE, "%s: %s.rank=%d but it must be %d", op, what, t->rank,
                           rank_lo);
        return fg_fail(FG_ERR_SHAPE, "%s: %s.rank=%d but it must be in [%d, %d]", op, what,
                       t->rank, rank_lo, rank_hi);
    }
    const int64_t esize = (int64_t)fg_dtype_size(t->dtype);
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] < 0)
            return fg_fail(FG_ERR_SHAPE, "%s: %s.shape[%d]=%lld is negative", op, what, i,
                           (long long)t->shape[i]);
        if (t->stride[i] < 0)
            return fg_fail(FG_ERR_UNSUPPORTED, "%s: %s.stride[%d]=%lld is negative", op, what, i,
                           (long long)t->stride[i]);
    }
    /* Every product of dims and strides the library forms must fit int64, empty views
       included (a zero dim does not make the others' products small): the product of the
       dims counting a 0 as 1, and sum of stride·max(dim, 1), both times the element size. */
    const int64_t limit = INT64_MAX / esize;
    int64_t count = 1;
    for (int i = 0; i < t->rank; i++) {
        const int64_t n = t->shape[i] > 0 ? t->shape[i] : 1;
        if (count > limit / n)
            return fg_fail(FG_ERR_OVERFLOW, "%s: %s: the product of its dims overflows int64 (%d bytes each)", op,
                           what, (int)esize);
        count *= n;
    }
    int64_t stride[FG_MAX_RANK], span = 0;
    fg_tensor_strides(t, stride);
    for (int i = 0; i < t->rank; i++) {
        const int64_t n = t->shape[i] > 0 ? t->shape[i] : 1;
        if (stride[i] != 0 && (stride[i] > limit / n || span > limit - stride[i] * n))
            return fg_fail(FG_ERR_OVERFLOW, "%s: %s spans more than 2^63 bytes (stride[%d]=%lld)", op, what, i,
                           (long long)stride[i]);
        span += stride[i] * n;
    }
    return FG_OK;
}

bool fg_is_empty(const fg_tensor *t) {
    for (int i = 0; i < t->rank; i++)
        if (t->shape[i] == 0) return true;
    return false;
}

/* The dims of t of size > 1 by increasing stride (insertion sort): n of them, strides in st,
   sizes in sh. */
static int dims_ascending(const fg_tensor *t, const int64_t *stride, int64_t *st, int64_t *sh) {
    int n = 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] <= 1) continue;
        int k = n++;
        while (k > 0 && st[k - 1] > stride[i]) {
            st[k] = st[k - 1];
            sh[k] = sh[k - 1];
            k--;
        }
        st[k] = stride[i];
        sh[k] = t->shape[i];
    }
    return n;
}

fg_status fg_check_no_self_overlap(const char *op, const char *what, const fg_tensor *t) {
    int64_t stride[FG_MAX_RANK], st[FG_MAX_RANK], sh[FG_MAX_RANK];
    fg_tensor_strides(t, stride);
    if (fg_is_empty(t)) return FG_OK;
    for (int i = 0; i < t->rank; i++)
        if (t->shape[i] > 1 && stride[i] == 0)
            return fg_fail(FG_ERR_ALIAS,
                           "%s: output %s has a zero stride in dim %d of size %lld (its elements would overlap)",
                           op, what, i, (long long)t->shape[i]);
    const int n = dims_ascending(t, stride, st, sh);
    int64_t span = 0; /* elements the smaller dims reach past the first */
    for (int k = 0; k < n; k++) {
        if (st[k] <= span)
            return fg_fail(FG_ERR_ALIAS, "%s: output %s overlaps itself (stride %lld within the span %lld of its "
                           "smaller dims)", op, what, (long long)st[k], (long long)span);
        span += (sh[k] - 1) * st[k];
    }
    return FG_OK;
}

fg_status fg_check_gemm_mat(const char *op, const char *what, const fg_mat *m, int64_t rows, int64_t cols) {
    if ((rows > 1 && m->rs == 0) || (cols > 1 && m->cs == 0))
        return fg_fail(FG_ERR_UNSUPPORTED,
                       "%s: %s has a zero stride in a matrix dim (a broadcast view); the product needs it "
                       "materialized", op, what);
    return FG_OK;
}

fg_status fg_check_data(const fg_context *ctx, const char *op, const char *what,
                        const fg_tensor *t) {
    if (fg_numel(t) == 0) return FG_OK;
    if (!t->data) return fg_fail(FG_ERR_NULL_POINTER, "%s: %s.data is NULL", op, what);
    if ((uintptr_t)t->data % fg_dtype_size(t->dtype) != 0)
        return fg_fail(FG_ERR_MISALIGNED, "%s: %s.data=%p is not aligned to its %zu-byte %s elements",
                       op, what, t->data, fg_dtype_size(t->dtype), fg_dtype_name(t->dtype));
#ifdef FG_HAVE_CUDA
    FG_TRY(fg_cuda_check_pointer(ctx, op, what, t->data));
#else
    (void)ctx;
#endif
    return FG_OK;
}

fg_status fg_check_data_seen(const fg_context *ctx, const char *op, const char *what, const fg_tensor *t,
                             fg_seen_ranges *seen) {
#ifdef FG_HAVE_CUDA
    if (ctx->backend == FG_BACKEND_CUDA && fg_numel(t) > 0 && t->data &&
        (uintptr_t)t->data % fg_dtype_size(t->dtype) == 0) {
        const uintptr_t p = (uintptr_t)t->data;
        for (int i = 0; i < seen->n; i++)
            if (p >= seen->lo[i] && p < seen->hi[i]) return FG_OK;
        uintptr_t lo = 0, hi = 0;
        if (fg_cuda_device_range(ctx, t->data, &lo, &hi)) {
            const int k = seen->n < FG_SEEN_RANGES ? seen->n++ : (seen->next++ % FG_SEEN_RANGES);
            seen->lo[k] = lo, seen->hi[k] = hi;
            return FG_OK;
        }
    }
#else
    (void)seen;
#endif
    return fg_check_data(ctx, op, what, t);
}

static int64_t div_floor(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
static int64_t div_ceil(int64_t a, int64_t b) { return -div_floor(-a, b); }

/* Whether r = Σ_k c_k·st[k] for some lo[k] <= c_k <= hi[k], dims k down to 0 (strides increasing,
 * each past the span of the smaller ones, span[k] = Σ_(m < k) max(−lo[m], hi[m])·st[m]): the smaller
 * dims reach at most span[k] < st[k], so c_k takes at most two values. */
static bool reachable(const int64_t *st, const int64_t *lo_k, const int64_t *hi_k, const int64_t *span, int k,
                      int64_t r) {
    if (k < 0) return r == 0;
    int64_t lo = div_ceil(r - span[k], st[k]), hi = div_floor(r + span[k], st[k]);
    if (lo < lo_k[k]) lo = lo_k[k];
    if (hi > hi_k[k]) hi = hi_k[k];
    for (int64_t i = lo; i <= hi; i++)
        if (reachable(st, lo_k, hi_k, span, k - 1, r - i * st[k])) return true;
    return false;
}

/* Whether views a and b of one dtype, each a layout that does not overlap itself (as outputs
 * are), share no element. Their dims of size > 1 are taken together by stride (a dim one view
 * lacks has size 1 there: a [B, H, L, hd] dv beside a [B, H, L, P, hd] dq of the same rows), and
 * an element of b sits r elements from a's start: they share one where r = Σ (i_k − j_k)·st_k
 * for indices i of a and j of b. false where that search is ruled out: other dtypes, strides not
 * each past the reach of the smaller ones, or reaches near int64's range. */
static bool views_disjoint(const fg_tensor *a, const fg_tensor *b) {
    if (a->dtype != b->dtype) return false;
    int64_t sa[FG_MAX_RANK], sb[FG_MAX_RANK], ta[FG_MAX_RANK], ha[FG_MAX_RANK], tb[FG_MAX_RANK], hb[FG_MAX_RANK];
    fg_tensor_strides(a, sa);
    fg_tensor_strides(b, sb);
    const int64_t es = (int64_t)fg_dtype_size(a->dtype);
    const intptr_t diff = (intptr_t)b->data - (intptr_t)a->data;
    if (es == 0 || diff % es != 0) return false; /* elements straddling each other's bytes */
    const int na = dims_ascending(a, sa, ta, ha), nb = dims_ascending(b, sb, tb, hb);
    /* the union by stride: c_k = i_k − j_k in [−(size in b − 1), size in a − 1] */
    int64_t st[2 * FG_MAX_RANK], lo[2 * FG_MAX_RANK], hi[2 * FG_MAX_RANK], span[2 * FG_MAX_RANK];
    int n = 0;
    for (int i = 0, j = 0; i < na || j < nb;) {
        if (j >= nb || (i < na && ta[i] < tb[j])) st[n] = ta[i], hi[n] = ha[i] - 1, lo[n] = 0, i++;
        else if (i >= na || tb[j] < ta[i]) st[n] = tb[j], hi[n] = 0, lo[n] = -(hb[j] - 1), j++;
        else st[n] = ta[i], hi[n] = ha[i] - 1, lo[n] = -(hb[j] - 1), i++, j++;
        n++;
    }
    int64_t reach = 0;
    for (int k = 0; k < n; k++) {
        const int64_t m = hi[k] > -lo[k] ? hi[k] : -lo[k];
        if (st[k] <= reach || m > (INT64_MAX / 4 - reach) / st[k]) return false;
        span[k] = reach;
        reach += m * st[k];
    }
    const int64_t r = (int64_t)(diff / es);
    return r > reach || r < -reach || !reachable(st, lo, hi, span, n - 1, r);
}

fg_status fg_check_no_overlap(const char *op, const char *out_name, const fg_tensor *out,
                              const char *other_name, const fg_tensor *other, bool other_is_output) {
    int64_t a = fg_extent_bytes(out), b = fg_extent_bytes(other);
    if (a == 0 || b == 0) return FG_OK;
    uintptr_t p = (uintptr_t)out->data, q = (uintptr_t)other->data;
    if (p < q + (uintptr_t)b && q < p + (uintptr_t)a && !(other_is_output && views_disjoint(out, other)))
        return fg_fail(FG_ERR_ALIAS, "%s: output %s overlaps %s", op, out_name, other_name);
    return FG_OK;
}

bool fg_collapse_dims(const fg_tensor *t, int upto, int64_t *count, int64_t *stride_out) {
    int64_t stride[FG_MAX_RANK];
    fg_tensor_strides(t, stride);
    int64_t n = 1, s = 0;
    bool ok = true;
    /* Walk from the innermost of the leading dims outwards; size-1 dims never matter. */
    int64_t expect = -1;
    for (int i = upto - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (expect < 0) {
            s = stride[i];
        } else if (stride[i] != expect) {
            ok = false;
        }
        expect = stride[i] * t->shape[i];
        n *= t->shape[i];
    }
    for (int i = 0; i < upto; i++)
        if (t->shape[i] == 0) n = 0;
    *count = n;
    *stride_out = n <= 1 ? 0 : s;
    return ok;
}

fg_mat fg_mat_of(int operand, const int64_t *stride, int rows_dim, int cols_dim) {
    fg_mat m;
    memset(&m, 0, sizeof m);
    m.operand = operand;
    m.rs = rows_dim >= 0 ? stride[rows_dim] : 0;
    m.cs = cols_dim >= 0 ? stride[cols_dim] : 0;
    return m;
}

fg_mat fg_mat_t(fg_mat m) {
    int64_t t = m.rs;
    m.rs = m.cs;
    m.cs = t;
    return m;
}

fg_status fg_check_unit_stride(const char *op, const char *what, const fg_mat *m, int64_t rows,
                               int64_t cols) {
    if (rows <= 1 || cols <= 1) return FG_OK;
    if (m->cs == 1 && m->rs >= cols) return FG_OK;
    if (m->rs == 1 && m->cs >= rows) return FG_OK;
    if (m->cs == 1 || m->rs == 1)
        return fg_fail(FG_ERR_UNSUPPORTED,
                       "%s: %s has overlapping rows or columns (strides %lld, %lld for a %lldx%lld matrix)",
                       op, what, (long long)m->rs, (long long)m->cs, (long long)rows,
                       (long long)cols);
    return fg_fail(FG_ERR_UNSUPPORTED,
                   "%s: %s needs a unit stride in one of its two matrix dims (strides %lld, %lld)",
                   op, what, (long long)m->rs, (long long)m->cs);
}

fg_tensor fg_tensor_make(void *data, fg_dtype dtype, int32_t rank, const int64_t *shape) {
    fg_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.rank = rank < 0 ? 0 : rank > FG_MAX_RANK ? FG_MAX_RANK : rank;
    for (int i = 0; i < t.rank; i++) t.shape[i] = shape ? shape[i] : 0; /* no shape: empty */
    return t;
}

fg_status fg_check_contiguous(const char *op, const char *what, const fg_tensor *t) {
    if (!fg_is_contiguous(t)) return fg_fail(FG_ERR_UNSUPPORTED, "%s: %s must be contiguous", op, what);
    return FG_OK;
}

fg_status fg_check_linear_operands(const char *op, const char *xname, const fg_tensor *x, int x_rank_hi,
                                   const fg_tensor *w, const fg_tensor *b, int64_t *N, int64_t *K, int64_t *M) {
    FG_TRY(fg_check_desc(op, xname, x, x_rank_hi == 2 ? 2 : 1, x_rank_hi));
    FG_TRY(fg_check_desc(op, "w", w, 2, 2));
    if (w->dtype != x->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: w is %s but %s is %s", op, fg_dtype_name(w->dtype), xname,
                       fg_dtype_name(x->dtype));
    *K = x->shape[x->rank - 1];
    *M = w->shape[0];
    if (w->shape[1] != *K)
        return fg_fail(FG_ERR_SHAPE, "%s: w.shape[1]=%lld but %s.shape[-1]=%lld", op, (long long)w->shape[1], xname,
                       (long long)*K);
    *N = 1;
    for (int d = 0; d < x->rank - 1; d++) *N *= x->shape[d];
    FG_TRY(fg_check_contiguous(op, xname, x));
    FG_TRY(fg_check_contiguous(op, "w", w));
    if (b->rank == 0) return FG_OK;
    FG_TRY(fg_check_desc(op, "b", b, 1, 1));
    if (b->dtype != x->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: b is %s but %s is %s", op, fg_dtype_name(b->dtype), xname,
                       fg_dtype_name(x->dtype));
    if (b->shape[0] != *M)
        return fg_fail(FG_ERR_SHAPE, "%s: b.shape[0]=%lld but w.shape[0]=%lld", op, (long long)b->shape[0],
                       (long long)*M);
    return fg_check_contiguous(op, "b", b);
}

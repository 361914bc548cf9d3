/*
 * checks.h — the front doors' shared descriptor rules beyond internal.h's (src/core/tensor.c):
 * what every given operand passes, the self-overlap rule for outputs, the GEMM operands'
 * stride rule, and the zero fill an empty sum writes. docs/errors.md lists what each
 * entry refuses, with which status.
 */
#ifndef FG_CHECKS_H
#define FG_CHECKS_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most OpenMP threads a context may ask for (fg_context_desc.num_threads). */
#define FG_MAX_THREADS 1024

/* An output view must not overlap itself: no zero stride in a dim of size > 1, and, dims
 * taken by increasing stride, each stride past the span of the smaller ones (a sufficient
 * rule: layouts that interleave dims are refused too). FG_ERR_ALIAS naming the output. */
fg_status fg_check_no_self_overlap(const char *op, const char *what, const fg_tensor *t);

/* A matrix a GEMM reads or writes: no zero stride along a dim of size > 1 (BLAS takes no
 * zero increment, and a zero row stride is a leading dim the view does not own).
 * FG_ERR_UNSUPPORTED naming the operand. */
fg_status fg_check_gemm_mat(const char *op, const char *what, const fg_mat *m, int64_t rows, int64_t cols);

/* Whether a (structurally valid) view is empty. */
bool fg_is_empty(const fg_tensor *t);

#ifdef __cplusplus
}
#endif

#endif /* FG_CHECKS_H */

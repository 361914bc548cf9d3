/*
 * cpu.h — the CPU backend's threading policy, in one place:
 *
 *  - fastgrad's own loops run on OpenMP, OpenBLAS's products on OpenBLAS's threads, and
 *    never one inside the other (no OpenMP region around an OpenBLAS call);
 *  - a loop takes more than one thread only when each thread gets at least a grain of work
 *    (fg_cpu_team), so small problems stay on the calling thread;
 *  - fg_context_desc.num_threads, when set, is the count for both: the loops' teams and
 *    OpenBLAS's threads for the length of each call (fg_cpu_blas_begin / _end);
 *  - the two pools never spin beside each other. Both keep their idle workers busy-waiting
 *    after a job (libgomp for milliseconds unless OMP_WAIT_POLICY=passive, a pthreads
 *    OpenBLAS for up to 2^28 cycles), and with as many threads as cores a spinning worker of
 *    one pool takes the core a worker of the other needs: a product right after a parallel
 *    loop ran at about half speed on one of its two threads, and a parallel loop right after
 *    a product waited a scheduler slice (~6 ms) for its second thread. So before a product
 *    that OpenBLAS runs on several threads, this thread's OpenMP workers are released if a
 *    parallel loop ran since the last product (omp_pause_resource_all); and before a
 *    parallel loop, a pthreads OpenBLAS's workers are released if a product ran since the
 *    last loop (blas_thread_shutdown_, which OpenBLAS exports for fork handling; its next
 *    call starts them again). Each costs a thread start (tens of µs) per change of pool,
 *    against milliseconds saved; together they measured as fast as a passive OpenMP wait.
 *    An OpenBLAS built on OpenMP (openblas_get_parallel() == 2) shares libgomp's pool with
 *    these loops and needs none of this. OpenBLAS's workers are only released while no other
 *    fastgrad thread is inside an OpenBLAS call (fg_cpu_blas_enter / _leave); a program that
 *    calls the same OpenBLAS from another thread of its own at that moment is not covered.
 */
#ifndef FG_CPU_CPU_H
#define FG_CPU_CPU_H

#include "../core/internal.h"

#include <cblas.h>
#include <omp.h>
#include <stdint.h>

/* This thread ran a parallel loop since its last multi-threaded OpenBLAS call, and the
   converse (src/cpu/gemm.c holds them). */
extern _Thread_local int fg_cpu_pool_live;
extern _Thread_local int fg_cpu_blas_live;

/* Releases a pthreads OpenBLAS's workers unless another fastgrad thread is inside an OpenBLAS
   call; marks this thread's OpenBLAS calls (src/cpu/gemm.c). */
void fg_cpu_blas_quiet(void);
void fg_cpu_blas_enter(void);
void fg_cpu_blas_leave(void);

/* The own short-k f32 product takes an m × n × k problem (src/cpu/gemm.c), and it applies the
   GEMM's activation epilogue (fg_gemm.act, epi.aux) to this one: the linear + activation plan
   (src/cpu/backend.c) asks the first to promise the second. */
bool fg_cpu_smallk_fits(fg_dtype t, int64_t m, int64_t n, int64_t k);
bool fg_cpu_smallk_fuses(const fg_gemm *g);

/* The threads fastgrad's loops may use: the context's num_threads, else OpenMP's default. */
static inline int fg_cpu_threads(const fg_context *ctx) {
    return ctx->num_threads > 0 ? ctx->num_threads : omp_get_max_threads();
}

/* The team for a loop of `work` units when a thread should get at least `grain` of them:
   1 below two grains (and inside someone's parallel region). Marks the pool live when
   it is more than one. */
static inline int fg_cpu_team(const fg_context *ctx, int64_t work, int64_t grain) {
    const int nt = fg_cpu_threads(ctx);
    if (nt <= 1 || work < 2 * grain || omp_in_parallel()) return 1;
    const int64_t t = work / grain;
    const int team = t < nt ? (int)t : nt;
    if (fg_cpu_blas_live) fg_cpu_blas_quiet();
    fg_cpu_pool_live = 1;
    return team;
}

/* [lo, hi) of thread `id` of `team` over n units, split at multiples of `align` units. */
static inline void fg_cpu_share(int64_t n, int team, int id, int64_t align, int64_t *lo, int64_t *hi) {
    const int64_t blocks = (n + align - 1) / align;
    const int64_t b0 = blocks * id / team, b1 = blocks * (id + 1) / team;
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

/* Around each OpenBLAS call of about `macs` multiply-adds: OpenBLAS gets the context's thread
   count (restored after), and this thread's OpenMP workers are released when OpenBLAS will
   run the call on several threads. */
typedef struct fg_blas_scope {
    int saved; /* OpenBLAS's thread count before, or 0 when unchanged */
} fg_blas_scope;

static inline fg_blas_scope fg_cpu_blas_begin(const fg_context *ctx, double macs) {
    fg_blas_scope s = {0};
    if (ctx->num_threads > 0) {
        const int cur = openblas_get_num_threads();
        if (cur != ctx->num_threads) {
            s.saved = cur;
            openblas_set_num_threads(ctx->num_threads);
        }
    }
    /* OpenBLAS runs a product below 64³ multiply-adds on the calling thread */
    if (macs > 262144.0 && openblas_get_num_threads() > 1 && openblas_get_parallel() == 1) {
        if (fg_cpu_pool_live) omp_pause_resource_all(omp_pause_soft);
        fg_cpu_pool_live = 0;
        fg_cpu_blas_live = 1;
    }
    fg_cpu_blas_enter();
    return s;
}

static inline void fg_cpu_blas_end(fg_blas_scope s) {
    fg_cpu_blas_leave();
    if (s.saved > 0) openblas_set_num_threads(s.saved);
}

#endif /* FG_CPU_CPU_H */

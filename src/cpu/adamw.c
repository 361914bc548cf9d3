/*
 * adamw.c — the CPU backend of the fused AdamW step: the same per-element math as the
 * CUDA kernel (f32, in the order torch's fused AdamW uses), OpenMP over each tensor.
 */
#include "../core/internal.h"

#include <math.h>

static inline float load(const void *p, fg_dtype t, int64_t i) { return (float)fg_load_f64(p, t, i); }

fg_status fg_cpu_adamw(fg_context *ctx, const fg_adamw_run *r) {
    const int nt = ctx->num_threads > 0 ? ctx->num_threads : 0;
    for (int t = 0; t < r->count; t++) {
        const fg_adamw_item *it = &r->items[t];
#pragma omp parallel for schedule(static) num_threads(nt) if (nt != 1 && it->n > 65536)
        for (int64_t i = 0; i < it->n; i++) {
            float g = load(it->g, r->g_dtype, i) * r->grad_scale;
            float p = it->master ? it->master[i] : load(it->p, r->p_dtype, i);
            p *= r->decay;
            float m = it->m[i] + r->one_minus_beta1 * (g - it->m[i]); /* lerp(m, g, 1 − β1) */
            float v = r->beta2 * it->v[i] + r->one_minus_beta2 * g * g;
            p -= r->step_size * m / (sqrtf(v) / r->bc2_sqrt + r->eps);
            it->m[i] = m;
            it->v[i] = v;
            if (it->master) it->master[i] = p;
            fg_store_f64(it->p, r->p_dtype, i, p);
        }
    }
    return FG_OK;
}

/*
 * attention_cudnn.cpp — the CUDA backend's attention forward through cuDNN's fused scaled
 * dot-product attention (the cudnn-frontend graph API, vendored in third_party/cudnn_frontend),
 * for the problems where it beats the own flash kernels: f16 / bf16, head dims a multiple of 8
 * from 8 to 128, unit-stride rows, longer than the short kernels' 64 keys, no score operands, no
 * key-padding lengths, no dropout. cuDNN's kernels are Hopper wgmma kernels the library's
 * mma.sync flash kernels trail at GPT-2's shape (decision 184 has the figures).
 * The backward stays on the own kernels: cuDNN's deterministic backward (frontend v1.16) asks for a
 * B·H·L²·2-byte workspace (the [L, L] buffer this family avoids), and its other one sums dQ with
 * atomics, which the library's determinism contract admits only behind a plan preference (not
 * there yet). The graph code below takes both directions for that day.
 *
 * Graphs depend on the operands' strides and the scale: the plan builds the run's own graph from
 * its descriptor and caches it in the context, keyed by the problem, the scale and every
 * operand's strides; a run looks it up (building it only when the plan was made in another
 * context). lse is cuDNN's "Stats" (the natural-log sum of exp of the
 * scaled scores, f32 [B, H, L]), the same quantity the other paths write.
 * Built only with FG_HAVE_CUDNN (CMake found cuDNN 9); otherwise the hooks below say no.
 * FASTGRAD_NO_CUDNN=1 in the environment keeps every problem on the own kernels (gpu-check runs the
 * flash forward so).
 */
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

#ifdef FG_HAVE_CUDNN
#include <cudnn_frontend.h>

#include <exception>
#include <memory>
#include <string>
#include <unordered_map>

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { Q_UID = 1, K_UID, V_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID };

struct graph_entry {
    std::shared_ptr<fe::graph::Graph> graph; /* null: cuDNN refused the problem (cached too) */
    int64_t workspace;
};

/* The context's cuDNN state: its handle (on the context's device) and the graphs built. */
struct cudnn_state {
    cudnnHandle_t handle = nullptr;
    std::unordered_map<std::string, graph_entry> graphs; /* never evicted: a graph's kernels may
                                                            still be queued on the stream */
};

/* The operands' strides in the graph's order (q, k, v, o; backward: do, dq, dk, dv). A dim of
   extent 1 gets a stride of its own (outside every other dim's extent): a run's stride there is
   free (the plan's check ignores it), so neither the graph nor its cache key may depend on it. */
struct layout {
    int64_t s[8][4];
    int n;
};

layout of_call(const fg_attn_call *c) {
    const fg_attn_view *v[8] = {&c->q, &c->k, &c->v, &c->o, &c->d_o, &c->dq, &c->dk, &c->dv};
    const int64_t ext[4] = {c->p.B, c->p.H, c->p.L, c->p.hd};
    layout l;
    l.n = c->p.forward ? 4 : 8;
    for (int i = 0; i < l.n; i++) {
        l.s[i][0] = v[i]->sb, l.s[i][1] = v[i]->sh, l.s[i][2] = v[i]->sl, l.s[i][3] = v[i]->sx;
        int64_t outer = 1;
        for (int d = 0; d < 4; d++)
            if (ext[d] > 1 && l.s[i][d] * ext[d] > outer) outer = l.s[i][d] * ext[d];
        for (int d = 0; d < 4; d++)
            if (ext[d] == 1) l.s[i][d] = outer;
    }
    return l;
}

std::string key_of(const fg_attn_problem *p, float scale, const layout &l) {
    int64_t head[8] = {p->forward, (int64_t)p->dtype, p->B, p->H, p->L, p->hd, p->causal, 0};
    memcpy(&head[7], &scale, sizeof scale);
    std::string k((const char *)head, sizeof head);
    k.append((const char *)l.s, sizeof(int64_t) * 4 * (size_t)l.n);
    return k;
}

std::shared_ptr<fe::graph::Tensor_attributes> operand(const std::shared_ptr<fe::graph::Graph> &g, const char *name,
                                                      int64_t uid, const fg_attn_problem *p, const int64_t *s) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({p->B, p->H, p->L, p->hd})
                         .set_stride({s[0], s[1], s[2], s[3]}));
}

void place(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, const fg_attn_problem *p,
           const int64_t *s) {
    t->set_output(true).set_uid(uid).set_dim({p->B, p->H, p->L, p->hd}).set_stride({s[0], s[1], s[2], s[3]});
}

/* Builds the graph of a problem at a layout; FG_OK and the entry, or the library's error. */
fg_status build(cudnnHandle_t h, const fg_attn_problem *p, float scale, const layout &l, graph_entry *out) {
    const char *op = p->forward ? "attention_forward" : "attention_backward";
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(p->dtype == FG_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = operand(g, "q", Q_UID, p, l.s[0]);
    auto K = operand(g, "k", K_UID, p, l.s[1]);
    auto V = operand(g, "v", V_UID, p, l.s[2]);
    const std::vector<int64_t> sdim = {p->B, p->H, p->L, 1}, sstride = {p->H * p->L, p->L, 1, 1};
    if (p->forward) {
        auto o = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale);
        if (p->causal)
            o.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
        auto [O, Stats] = g->sdpa(Q, K, V, o);
        place(O, O_UID, p, l.s[3]);
        Stats->set_output(true).set_uid(STATS_UID).set_data_type(fe::DataType_t::FLOAT).set_dim(sdim).set_stride(sstride);
    } else {
        auto O = operand(g, "o", O_UID, p, l.s[3]);
        auto dO = operand(g, "do", DO_UID, p, l.s[4]);
        auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("lse")
                                   .set_uid(STATS_UID)
                                   .set_dim(sdim)
                                   .set_stride(sstride)
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto o = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(scale)
                     .set_deterministic_algorithm(true);
        if (p->causal)
            o.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, o);
        place(dQ, DQ_UID, p, l.s[5]);
        place(dK, DK_UID, p, l.s[6]);
        place(dV, DV_UID, p, l.s[7]);
    }
    auto st = g->build(h, {fe::HeurMode_t::A});
    if (!st.is_good()) {
        cudaGetLastError(); /* (a failed build may leave an error a later launch check would report) */
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: cuDNN's fused attention does not take it: %s", op,
                       st.get_message().c_str());
    }
    int64_t ws = 0;
    st = g->get_workspace_size(ws);
    if (!st.is_good()) return fg_fail(FG_ERR_BACKEND, "%s: cuDNN: %s", op, st.get_message().c_str());
    out->graph = g;
    out->workspace = ws;
    return FG_OK;
}

cudnn_state *state_of(fg_context *ctx, fg_status *err) {
    struct fg_cuda_state *cs = ctx->cuda;
    if (!cs->cudnn) {
        cudnnHandle_t h = nullptr;
        if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) {
            *err = fg_fail(FG_ERR_BACKEND, "attention: cudnnCreate failed");
            return nullptr;
        }
        cudnn_state *s = new (std::nothrow) cudnn_state;
        if (!s) {
            cudnnDestroy(h);
            *err = fg_fail(FG_ERR_OUT_OF_MEMORY, "attention: out of host memory");
            return nullptr;
        }
        s->handle = h;
        cs->cudnn = s;
    }
    return (cudnn_state *)cs->cudnn;
}

} // namespace

/* FASTGRAD_NO_CUDNN=1 in the environment keeps the attention on the own kernels (read once). */
static bool cudnn_allowed() {
    static const bool allowed = [] {
        const char *e = getenv("FASTGRAD_NO_CUDNN");
        return !(e && strcmp(e, "1") == 0);
    }();
    return allowed;
}

extern "C" bool fg_cuda_attn_cudnn_fits(const fg_context *ctx, const fg_attn_problem *p) {
    if (!p->forward || !cudnn_allowed()) return false; /* (the file's comment says why) */
    if (p->dtype != FG_F16 && p->dtype != FG_BF16) return false;
    if (p->hd < 8 || p->hd % 8 != 0 || p->hd > 128 || p->L <= 64 || p->B < 1 || p->H < 1) return false;
    if (!p->unit_rows || (p->align && p->align < 16)) return false;
    if (p->has_lengths || p->has_scores_in || p->has_scores_out || p->has_dscores || p->dropout) return false;
    if (!p->forward && (!p->want_dq || !p->want_dk || !p->want_dv || p->want_dscores_in || p->accumulate))
        return false;
    return ctx->arch >= 80;
}

/* The graph of a run, from its call (planning: without data); cached in the context. */
static fg_status graph_for(fg_context *ctx, const fg_attn_call *c, cudnn_state **sp, graph_entry **ep) {
    const fg_attn_problem *p = &c->p;
    const char *op = p->forward ? "attention_forward" : "attention_backward";
    fg_status err = FG_OK;
    cudnn_state *s = state_of(ctx, &err);
    if (!s) return err;
    const layout l = of_call(c);
    for (int i = 0; i < l.n; i++)
        for (int d = 0; d < 3; d++)
            if (l.s[i][d] == 0)
                return fg_fail(FG_ERR_UNSUPPORTED, "%s: cuDNN's attention takes no broadcast (zero-stride) operand", op);
    const float scale = (float)c->scale;
    const std::string key = key_of(p, scale, l);
    auto it = s->graphs.find(key);
    if (it == s->graphs.end()) {
        /* a refusal is kept too: the one-call functions plan every call, and a build costs
           milliseconds of host time (and, under stream capture, calls the capture may not take) */
        graph_entry e{nullptr, 0};
        const fg_status st = build(s->handle, p, scale, l, &e);
        if (st != FG_OK && st != FG_ERR_UNSUPPORTED) return st;
        it = s->graphs.emplace(key, e).first;
        if (st != FG_OK) return st;
    }
    if (!it->second.graph)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: cuDNN's fused attention did not take this problem when first asked", op);
    *sp = s;
    *ep = &it->second;
    return FG_OK;
}

/* Planning builds the run's own graph (the operands' strides and the scale are the plan's), so a
   run finds it cached and a plan cuDNN refuses falls to the own kernels at planning. */
static fg_status plan_inner(fg_context *ctx, const fg_attn_call *layout, size_t *workspace) {
    fg_device_guard guard(ctx->device);
    cudnn_state *s;
    graph_entry *e;
    FG_TRY(graph_for(ctx, layout, &s, &e));
    *workspace = e->workspace ? (size_t)e->workspace + 256 : 0; /* (room to align the caller's pointer) */
    return FG_OK;
}

static fg_status run_inner(fg_context *ctx, const fg_attn_call *c) {
    const fg_attn_problem *p = &c->p;
    const char *op = p->forward ? "attention_forward" : "attention_backward";
    fg_device_guard guard(ctx->device);
    cudnn_state *s;
    graph_entry *e;
    FG_TRY(graph_for(ctx, c, &s, &e)); /* (cached by the plan; built here only in another context) */
    void *ws = c->ws;
    size_t ws_bytes = c->ws_bytes;
    if (e->workspace > 0) { /* aligned up to 256 bytes */
        const uintptr_t at = ((uintptr_t)ws + 255) & ~(uintptr_t)255;
        ws_bytes = ws && ws_bytes >= at - (uintptr_t)ws ? ws_bytes - (at - (uintptr_t)ws) : 0;
        ws = (void *)at;
    }
    if ((size_t)e->workspace > ws_bytes)
        return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, cuDNN's graph needs %lld (+ 256)", op,
                       c->ws_bytes, (long long)e->workspace);
    if (cudnnSetStream(s->handle, ctx->cuda->stream) != CUDNN_STATUS_SUCCESS)
        return fg_fail(FG_ERR_BACKEND, "%s: cudnnSetStream failed", op);
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void *> pack = {
        {Q_UID, c->q.data}, {K_UID, c->k.data}, {V_UID, c->v.data}, {O_UID, c->o.data}, {STATS_UID, c->lse}};
    if (!p->forward) {
        pack[DO_UID] = c->d_o.data;
        pack[DQ_UID] = c->dq.data;
        pack[DK_UID] = c->dk.data;
        pack[DV_UID] = c->dv.data;
    }
    auto st = e->graph->execute(s->handle, pack, e->workspace > 0 ? ws : nullptr);
    if (!st.is_good()) return fg_fail(FG_ERR_BACKEND, "%s: cuDNN: %s", op, st.get_message().c_str());
    return FG_OK;
}

/* (no C++ exception crosses into the C library) */
extern "C" fg_status fg_cuda_attn_cudnn_plan(fg_context *ctx, const fg_attn_call *layout, size_t *workspace) {
    try {
        return plan_inner(ctx, layout, workspace);
    } catch (const std::exception &e) {
        return fg_fail(FG_ERR_BACKEND, "attention: cuDNN: %s", e.what());
    } catch (...) {
        return fg_fail(FG_ERR_BACKEND, "attention: cuDNN: an exception");
    }
}

extern "C" fg_status fg_cuda_attn_cudnn(fg_context *ctx, const fg_attn_call *c) {
    try {
        return run_inner(ctx, c);
    } catch (const std::exception &e) {
        return fg_fail(FG_ERR_BACKEND, "attention: cuDNN: %s", e.what());
    } catch (...) {
        return fg_fail(FG_ERR_BACKEND, "attention: cuDNN: an exception");
    }
}

extern "C" void fg_cuda_cudnn_free(struct fg_cuda_state *cs) {
    cudnn_state *s = (cudnn_state *)cs->cudnn;
    if (!s) return;
    s->graphs.clear();
    cudnnDestroy(s->handle);
    delete s;
    cs->cudnn = nullptr;
}

#else /* no cuDNN in this build */

extern "C" bool fg_cuda_attn_cudnn_fits(const fg_context *ctx, const fg_attn_problem *p) {
    (void)ctx, (void)p;
    return false;
}

extern "C" fg_status fg_cuda_attn_cudnn_plan(fg_context *ctx, const fg_attn_call *layout, size_t *workspace) {
    (void)ctx, (void)layout, (void)workspace;
    return fg_fail(FG_ERR_UNSUPPORTED, "attention: this build has no cuDNN");
}

extern "C" fg_status fg_cuda_attn_cudnn(fg_context *ctx, const fg_attn_call *c) {
    (void)ctx, (void)c;
    return fg_fail(FG_ERR_UNSUPPORTED, "attention: this build has no cuDNN");
}

extern "C" void fg_cuda_cudnn_free(struct fg_cuda_state *cs) { (void)cs; }

#endif

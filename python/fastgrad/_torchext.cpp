/* _torchext.cpp — fastgrad's Linear, linear + activation, normalization family and transformer
 * encoder layer as a torch C++ extension (module fastgrad._torchext_ops).
 *
 * fg.Linear, fg.LinearAct and the row norms through a Python torch.autograd.Function pay for the
 * Function's Python on every call: apply, save_for_backward, the backward's Python, the outputs'
 * allocation in Python; the norms' functional calls pay for norm.py's allocation and ops.run.
 * Here that work is C++:
 *  - Linear: a torch::autograd::Function whose forward runs fastgrad's linear_forward and whose
 *    backward (called by autograd's engine, in C++) runs linear_backward_input / _weight / _bias
 *    for the gradients autograd asks for.
 *  - Linear + activation: LinearActFn mirrors autograd.py's LinearActFunction (save_pre's forms:
 *    the pre-activation, its slope, relu's y or nothing; the backward forming g in the saved
 *    tensor's memory once, recomputing pre on a second backward; ops._act_options' options,
 *    without dropout, as the Function has none).
 *  - The row norms (LayerNorm, RMSNorm, the fused residual add and its dropout): NormFn mirrors
 *    norm.py's NormFunction (the same conversions of weights of another dtype, the same saved
 *    tensors, the gradient s receives), and norm_forward / norm_backward / batch_norm_forward /
 *    batch_norm_backward are norm.py's functions of those names (their allocation rules, their
 *    options structs filled here).
 *  - The encoder layer (fg.TransformerEncoderLayer, fg.PatchTSTEncoder): EncoderFn mirrors
 *    encoder.py's EncoderLayerFunction (one fg_encoder_layer_forward_ws a forward, one
 *    fg_encoder_layer_backward a backward, the cache and workspaces from torch's allocator). A
 *    layer runs some twenty library parts each way, so its Python Function's per-call work
 *    (describing every weight and gradient in ctypes) had been the larger part of its host time.
 * A forward + backward never enters Python beyond the one call in.
 *
 * The per-call work is _fastcall.c's, in C++: each tensor's descriptor (pointer, dtype, shape,
 * strides), a plan key of the op, accumulate, flags, the options' bytes, the descriptors and the
 * pointers' alignment class (at most 256 bytes, as ops._alignment computes it), a per-thread plan
 * cache per context, the plan's workspace from torch's allocator, and, on CUDA, the context set
 * to torch's current stream. The plans are the ones the Python path makes for the same operands,
 * so the results are bit-identical to it. A refusal the Python path retries on contiguous copies
 * (FG_ERR_UNSUPPORTED, FG_ERR_MISALIGNED: torch_ops._call) is retried the same way.
 *
 * Every entry returns None for anything it does not take (a dtype or device it does not handle,
 * a tensor subclass, arguments of another type, a forward or functional call the library
 * refuses, an autograd entry under functorch transforms or forward-mode AD): the caller then runs
 * the Python, which raises its usual errors. A backward through autograd that the library refuses
 * raises RuntimeError.
 *
 * The library is not linked: _torchext.py hands over the entry points of the libfastgrad that
 * ctypes loaded (one library, one error slot, wherever FASTGRAD_LIBRARY points). Contexts are
 * the extension's own, one per (thread, device), created on first use (a thread's CUDA ones
 * pass to the next thread when it ends: spare_cuda). CUDA code (the current
 * stream) is compiled only when torch has CUDA and its headers are found (FG_TORCHEXT_CUDA);
 * without it CUDA tensors go to the Python path.
 *
 * Linear is also registered with the dispatcher as fastgrad_ext::linear (autograd in C++) and
 * fastgrad_ext::linear_backward, for callers of torch.ops. torch.compile traces the Python
 * custom ops of torch_ops.py instead (they have fake implementations); for the eight a transformer
 * calls most (Linear, linear + activation, the row norms, attention, each forward and backward) this module
 * also gives the dispatcher C++ kernels (register_kernels), so a compiled graph's calls of them
 * do not run torch_ops' Python.
 */
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#ifdef FG_TORCHEXT_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fastgrad.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/* ------------------------------------------------------------------ the library's entry points */

struct Api {
    fg_status (*context_create)(const fg_context_desc *, fg_context **);
    void (*context_destroy)(fg_context *);
    fg_status (*context_set_stream)(fg_context *, void *);
    fg_status (*plan_create)(fg_context *, const fg_plan_desc *, fg_plan **);
    void (*plan_destroy)(fg_plan *);
    fg_status (*plan_workspace_size)(const fg_plan *, size_t *);
    fg_status (*plan_run)(fg_plan *, const fg_tensor *, void *, size_t);
    const char *(*last_error)(void);
    const char *(*status_string)(fg_status);
    decltype(&fg_encoder_layer_sizes) encoder_layer_sizes;
    decltype(&fg_encoder_layer_forward_ws) encoder_layer_forward_ws;
    decltype(&fg_encoder_layer_backward) encoder_layer_backward;
};

Api api;
std::atomic<bool> ready{false};
std::atomic<unsigned long long> n_forward{0}, n_backward{0}, n_fallback{0}, n_dx{0}, n_dw{0}, n_db{0};
std::atomic<unsigned long long> n_norm_forward{0}, n_norm_backward{0}, n_norm_autograd{0}, n_norm_fallback{0},
    n_batch_norm_forward{0}, n_batch_norm_backward{0};
std::atomic<unsigned long long> n_act_forward{0}, n_act_backward{0}, n_act_fallback{0};

/* The library refused a forward: linear() / norm() return None and Python runs the call. */
struct Refused {};

/* ------------------------------------------------------------------ contexts and plans */

struct Entry {
    fg_plan *plan;
    size_t ws_bytes;
};

struct Ctx {
    fg_context *handle = nullptr;
    void *stream = nullptr;
    std::unordered_map<std::string, Entry> plans;
};

enum { MAX_PLANS = 512 }; /* per context; a cache that outgrows this starts again (as ops.py's) */
enum { MAX_OPTIONS = 256 }; /* the largest options struct a key holds (_fastcall.c's bound) */

/* CUDA contexts of threads that have ended, per device, for the next thread to take with their
 * plans (a context is used by one thread at a time). Never freed: destroying a CUDA context
 * frees device memory and synchronizes, and at the process's end the CUDA runtime may be gone
 * before the destructors run; pooling bounds them by the threads alive at once instead. */
std::mutex spare_mutex;
std::vector<std::vector<Ctx>> *spare_cuda = new std::vector<std::vector<Ctx>>();

/* The calling thread's contexts: the CPU one and one per CUDA device. A thread's CPU context
 * and plans are freed when it ends; its CUDA ones go to spare_cuda. */
struct Contexts {
    Ctx cpu;
    std::vector<Ctx> cuda;
    ~Contexts()
    {
        if (!ready.load())
            return;
        for (auto &kv : cpu.plans)
            api.plan_destroy(kv.second.plan);
        if (cpu.handle)
            api.context_destroy(cpu.handle);
        std::lock_guard<std::mutex> lock(spare_mutex);
        for (size_t dev = 0; dev < cuda.size(); dev++) {
            if (!cuda[dev].handle)
                continue;
            if (spare_cuda->size() <= dev)
                spare_cuda->resize(dev + 1);
            (*spare_cuda)[dev].push_back(std::move(cuda[dev]));
        }
    }
};

thread_local Contexts contexts;

[[noreturn]] void fail(const char *what, fg_status st, const char *msg)
{
    TORCH_CHECK(false, "fastgrad: ", what, ": ", api.status_string(st), ": ", msg ? msg : "");
}

/* The thread's context for ref's device, set to torch's current stream there; a failure (no
 * CUDA backend in the library, a stream it cannot take) is returned as the library's status, so
 * the caller hands the call to the Python path as any other refusal. */
fg_status context_for(const at::Tensor &ref, Ctx **out)
{
    fg_context_desc d{};
    Ctx *c;
    if (ref.is_cuda()) {
        int dev = ref.get_device();
        if ((int)contexts.cuda.size() <= dev)
            contexts.cuda.resize(dev + 1);
        c = &contexts.cuda[dev];
        if (!c->handle) {
            std::lock_guard<std::mutex> lock(spare_mutex);
            if ((int)spare_cuda->size() > dev && !(*spare_cuda)[dev].empty()) {
                *c = std::move((*spare_cuda)[dev].back());
                (*spare_cuda)[dev].pop_back();
            }
        }
        d.backend = FG_BACKEND_CUDA;
        d.device = dev;
    } else {
        c = &contexts.cpu;
        d.backend = FG_BACKEND_CPU;
    }
    if (!c->handle) {
        fg_status st = api.context_create(&d, &c->handle);
        if (st != FG_OK)
            return st;
    }
#ifdef FG_TORCHEXT_CUDA
    if (ref.is_cuda()) {
        void *s = c10::cuda::getCurrentCUDAStream(ref.get_device()).stream();
        if (s != c->stream) {
            fg_status st = api.context_set_stream(c->handle, s);
            if (st != FG_OK)
                return st;
            c->stream = s;
        }
    }
#endif
    *out = c;
    return FG_OK;
}

int dtype_code(at::ScalarType s)
{
    switch (s) {
    case at::kFloat: return FG_F32;
    case at::kDouble: return FG_F64;
    case at::kHalf: return FG_F16;
    case at::kBFloat16: return FG_BF16;
    default: return -1;
    }
}

/* Whether an autograd entry leaves the call to Python's torch.autograd.Function, which raises its
 * own errors there (a C++ Function raises others): functorch transforms (vmap, grad, ...) active,
 * by the Function's own test (_are_functorch_transforms_active), or an operand with a forward-mode
 * AD tangent (neither Function has a jvp). */
bool for_python(c10::ArrayRef<const at::Tensor *> ts)
{
    const auto included = c10::impl::tls_local_dispatch_key_set().included_;
    if (included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
        included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode))
        return true;
    for (const at::Tensor *t : ts)
        if (t->defined() && t->_fw_grad(0).defined())
            return true;
    return false;
}

/* A tensor's descriptor in place (ops._describe's rules); undefined is absent (rank 0).
 * The callers pass dense tensors of a dtype dtype_code takes, at most FG_MAX_RANK dims. */
void describe(const at::Tensor &a, fg_tensor *t)
{
    std::memset(t, 0, sizeof *t);
    if (!a.defined())
        return;
    const int64_t r = a.dim();
    auto sz = a.sizes();
    auto st = a.strides();
    bool all_zero = r > 0;
    for (int64_t i = 0; i < r; i++) {
        t->shape[i] = sz[i];
        t->stride[i] = st[i];
        all_zero &= st[i] == 0;
    }
    if (all_zero) /* only when no dim is above 1 */
        for (int64_t i = 0; i < r; i++)
            t->stride[i] = 1;
    /* the mutable pointer (Python's data_ptr()): a copy-on-write tensor (torch._lazy_clone) is
     * materialized first, so an operand the op writes (BatchNorm's running statistics) never
     * writes into storage another tensor shares */
    t->data = a.mutable_data_ptr();
    const at::ScalarType st_ = a.scalar_type();
    t->dtype = st_ == at::kInt ? FG_I32 : st_ == at::kLong ? FG_I64 : (fg_dtype)dtype_code(st_);
    t->rank = (int32_t)r;
}

/* Runs op on n operands (the library's order; undefined = absent) on the thread's context for
 * ref's device, with the op's options (options_size bytes; nullptr: the defaults) and accumulate.
 * The plan key is _fastcall.c's: (op, accumulate, flags, alignment), the options' length and
 * bytes (UINT32_MAX for none), each operand's (dtype, rank, shape, strides). Returns the
 * library's status; fg_last_error() has the message. */
fg_status run(fg_op op, const at::Tensor *const *operands, int n, uint32_t flags, const at::Tensor &ref,
              const void *options, size_t options_size, bool accumulate)
{
    fg_tensor t[FG_MAX_OPERANDS];
    uintptr_t bits = 256;
    char key[16 + 4 + MAX_OPTIONS + FG_MAX_OPERANDS * (8 + 16 * FG_MAX_RANK)];
    size_t kn = 16;
    TORCH_INTERNAL_ASSERT(options_size <= MAX_OPTIONS);
    if (options) {
        uint32_t len = (uint32_t)options_size;
        std::memcpy(key + kn, &len, sizeof len);
        kn += sizeof len;
        std::memcpy(key + kn, options, options_size);
        kn += options_size;
    } else {
        uint32_t none = UINT32_MAX;
        std::memcpy(key + kn, &none, sizeof none);
        kn += sizeof none;
    }
    for (int i = 0; i < n; i++) {
        describe(*operands[i], &t[i]);
        int32_t d[2] = {operands[i]->defined() ? (int32_t)t[i].dtype : -1, t[i].rank};
        std::memcpy(key + kn, d, sizeof d);
        kn += sizeof d;
        std::memcpy(key + kn, t[i].shape, sizeof(int64_t) * t[i].rank);
        kn += sizeof(int64_t) * t[i].rank;
        std::memcpy(key + kn, t[i].stride, sizeof(int64_t) * t[i].rank);
        kn += sizeof(int64_t) * t[i].rank;
        bits |= (uintptr_t)t[i].data;
    }
    uint32_t hdr[4] = {(uint32_t)op, (uint32_t)accumulate, flags, (uint32_t)(bits & (~bits + 1))};
    std::memcpy(key, hdr, sizeof hdr);
    Ctx *cp = nullptr;
    if (fg_status st = context_for(ref, &cp); st != FG_OK)
        return st;
    Ctx &c = *cp;
    std::string k(key, kn);
    auto it = c.plans.find(k);
    if (it == c.plans.end()) {
        fg_plan_desc desc{};
        desc.op = op;
        for (int i = 0; i < n; i++)
            desc.operands[i] = t[i];
        desc.accumulate = accumulate;
        desc.flags = flags;
        desc.options = options; /* the plan keeps a copy */
        desc.options_size = options ? options_size : 0;
        desc.alignment = hdr[3];
        fg_plan *plan = nullptr;
        fg_status st = api.plan_create(c.handle, &desc, &plan);
        if (st != FG_OK)
            return st;
        size_t ws = 0;
        st = api.plan_workspace_size(plan, &ws);
        if (st != FG_OK) {
            api.plan_destroy(plan);
            return st;
        }
        if (c.plans.size() >= MAX_PLANS) {
            for (auto &kv : c.plans)
                api.plan_destroy(kv.second.plan);
            c.plans.clear();
        }
        it = c.plans.emplace(std::move(k), Entry{plan, ws}).first;
    }
    const Entry e = it->second;
    at::Tensor ws;
    if (e.ws_bytes)
        ws = at::empty({(int64_t)e.ws_bytes}, ref.options().dtype(at::kByte));
    return api.plan_run(e.plan, t, e.ws_bytes ? ws.mutable_data_ptr() : nullptr, e.ws_bytes);
}

bool retryable(fg_status st) { return st == FG_ERR_UNSUPPORTED || st == FG_ERR_MISALIGNED; }

/* torch_ops._dense: a broadcast view (a zero stride on a dim above 1) made contiguous. */
at::Tensor dense(const at::Tensor &a)
{
    if (!a.defined() || a.is_contiguous())
        return a;
    auto sz = a.sizes();
    auto st = a.strides();
    for (int64_t i = 0; i < a.dim(); i++)
        if (st[i] == 0 && sz[i] > 1)
            return a.contiguous();
    return a;
}

/* torch_ops._fresh: a contiguous tensor at the start of an allocation (a copy unless it is one). */
at::Tensor fresh(const at::Tensor &a)
{
    if (!a.defined() || (a.is_contiguous() && (uintptr_t)a.const_data_ptr() % 256 == 0))
        return a;
    return a.clone(at::MemoryFormat::Contiguous);
}

std::vector<int64_t> with_last(at::IntArrayRef lead, int64_t last)
{
    std::vector<int64_t> s(lead.begin(), lead.end());
    s.back() = last;
    return s;
}

/* One output of an op: out = op(ins..., out) with out allocated like ops.py (ref's dtype and
 * device), retried once on fresh copies of the inputs when the library refuses the layout.
 * On a refusal, forward throws Refused, a backward raises. */
at::Tensor compute(fg_op op, const char *what, std::vector<at::Tensor> ins, at::IntArrayRef shape, uint32_t flags,
                   bool forward)
{
    const int n = (int)ins.size() + 1;
    for (int attempt = 0;; attempt++) {
        const at::Tensor &ref = ins[0];
        at::Tensor out = at::empty(shape, ref.options());
        const at::Tensor *p[FG_MAX_OPERANDS];
        for (int i = 0; i < n - 1; i++)
            p[i] = &ins[i];
        p[n - 1] = &out;
        fg_status st = run(op, p, n, flags, ref, nullptr, 0, false);
        if (st == FG_OK)
            return out;
        if (attempt == 0 && retryable(st)) {
            for (auto &a : ins)
                a = fresh(a);
            continue;
        }
        if (forward)
            throw Refused{};
        fail(what, st, api.last_error());
    }
}

at::Tensor forward_y(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b, uint32_t flags)
{
    return compute(FG_OP_LINEAR_FORWARD, "linear_forward", {dense(x), dense(w), dense(b)},
                   with_last(x.sizes(), w.size(0)), flags, true);
}

/* The gradients asked for (undefined where not): dx = dy·w, dw = dyᵀ·x, db = Σ dy, the operands
 * made dense (torch_ops._call's rule). refuse: a refusal throws Refused (the custom op's kernel
 * then hands the call to Python), else it raises. */
variable_list linear_grads(const at::Tensor &dy_in, const at::Tensor &x, const at::Tensor &w, bool need_x,
                           bool need_w, bool need_b, uint32_t flags, bool refuse)
{
    const at::Tensor dy = dense(dy_in);
    at::Tensor dx, dw, db;
    if (need_x)
        dx = compute(FG_OP_LINEAR_BACKWARD_INPUT, "linear_backward_input", {dy, dense(w)},
                     with_last(dy.sizes(), w.size(1)), flags, refuse);
    if (need_w)
        dw = compute(FG_OP_LINEAR_BACKWARD_WEIGHT, "linear_backward_weight", {dy, dense(x)},
                     {dy.size(-1), x.size(-1)}, flags, refuse);
    if (need_b)
        db = compute(FG_OP_LINEAR_BACKWARD_BIAS, "linear_backward_bias", {dy}, {dy.size(-1)}, flags, refuse);
    return {dx, dw, db};
}

/* LinearFn's backward: linear_grads, counted. */
variable_list backward_grads(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &w, bool need_x,
                             bool need_w, bool need_b, uint32_t flags)
{
    n_dx += need_x;
    n_dw += need_w;
    n_db += need_b;
    auto g = linear_grads(dy, x, w, need_x, need_w, need_b, flags, false);
    n_backward++;
    return g;
}

/* ------------------------------------------------------------------ row norms and BatchNorm */

/* The options structs as norm.py fills them; zeroed first, as ctypes does: their bytes, padding
 * included, are part of the plan key. */
fg_norm_options norm_opts(int kind, double eps, double p, uint64_t seed, uint64_t offset)
{
    fg_norm_options o;
    std::memset(&o, 0, sizeof o);
    o.kind = (fg_norm_kind)kind;
    o.eps = eps;
    o.dropout.p = p;
    o.dropout.seed = seed;
    o.dropout.offset = offset;
    return o;
}

fg_batch_norm_options batch_norm_opts(bool training, double eps, double momentum, double p, uint64_t seed,
                                      uint64_t offset)
{
    fg_batch_norm_options o;
    std::memset(&o, 0, sizeof o);
    o.eval = !training;
    o.eps = eps;
    o.momentum = momentum;
    o.dropout.p = p;
    o.dropout.seed = seed;
    o.dropout.offset = offset;
    return o;
}

/* Statistics' dtype: f64 for f64 data, else f32 (norm._acc_dtype). */
at::TensorOptions acc_options(const at::Tensor &x)
{
    return x.options().dtype(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
}

/* Per-row statistics' shape: x's leading dims, [1] for a single row (norm._rows). */
std::vector<int64_t> rows_of(const at::Tensor &x)
{
    if (x.dim() <= 1)
        return {1};
    return std::vector<int64_t>(x.sizes().begin(), x.sizes().end() - 1);
}

at::Tensor empty_if(bool want, at::IntArrayRef shape, const at::TensorOptions &o)
{
    return want ? at::empty(shape, o) : at::Tensor();
}

/* norm.py's norm_forward: out = (y, s, mean, rstd), allocated as there (undefined where absent). */
fg_status norm_forward_into(const at::Tensor &x, const at::Tensor &r, const at::Tensor &w, const at::Tensor &b,
                            const fg_norm_options &o, bool keep_sum, bool save_stats, at::Tensor out[4])
{
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor s = empty_if(r.defined() && keep_sum, x.sizes(), x.options());
    at::Tensor mean = empty_if(save_stats && o.kind == FG_NORM_LAYER, rows_of(x), acc_options(x));
    at::Tensor rstd = empty_if(save_stats, rows_of(x), acc_options(x));
    const at::Tensor *p[] = {&x, &r, &w, &b, &y, &s, &mean, &rstd};
    fg_status st = run(FG_OP_NORM_FORWARD, p, 8, 0, x, &o, sizeof o, false);
    out[0] = y, out[1] = s, out[2] = mean, out[3] = rstd;
    return st;
}

/* The gradients' allocation of norm.py's norm_backward / batch_norm_backward: dx, dr like x in
 * dy's dtype, dw, db [x's last dim] in pdt; want: which (already masked by w / has_bias). */
void alloc_grads(const at::Tensor &dy, const at::Tensor &x, const bool want[4], at::ScalarType pdt, at::Tensor g[4])
{
    g[0] = empty_if(want[0], x.sizes(), dy.options());
    g[1] = empty_if(want[1], x.sizes(), dy.options());
    g[2] = empty_if(want[2], {x.size(-1)}, dy.options().dtype(pdt));
    g[3] = empty_if(want[3], {x.size(-1)}, dy.options().dtype(pdt));
}

/* norm.py's norm_backward: g = (dx, dr, dw, db). */
fg_status norm_backward_into(const at::Tensor &dy, const at::Tensor &ds, const at::Tensor &x, const at::Tensor &w,
                             const at::Tensor &mean, const at::Tensor &rstd, const fg_norm_options &o,
                             const bool want[4], at::ScalarType pdt, bool accumulate, at::Tensor g[4])
{
    alloc_grads(dy, x, want, pdt, g);
    const at::Tensor *p[] = {&dy, &ds, &x, &w, &mean, &rstd, &g[0], &g[1], &g[2], &g[3]};
    return run(FG_OP_NORM_BACKWARD, p, 10, 0, dy, &o, sizeof o, accumulate);
}

/* norm.py's batch_norm_forward: out = (y, s, mean, rstd); running_mean / running_var updated in
 * place in training. */
fg_status batch_norm_forward_into(const at::Tensor &x, const at::Tensor &r, const at::Tensor &w, const at::Tensor &b,
                                  const at::Tensor &rm, const at::Tensor &rv, const fg_batch_norm_options &o,
                                  bool keep_sum, at::Tensor out[4])
{
    const int64_t c = x.size(-1);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor s = empty_if(r.defined() && keep_sum, x.sizes(), x.options());
    at::Tensor mean = at::empty({c}, acc_options(x)), rstd = at::empty({c}, acc_options(x));
    const at::Tensor *p[] = {&x, &r, &w, &b, &rm, &rv, &y, &s, &mean, &rstd};
    fg_status st = run(FG_OP_BATCH_NORM_FORWARD, p, 10, 0, x, &o, sizeof o, false);
    out[0] = y, out[1] = s, out[2] = mean, out[3] = rstd;
    return st;
}

/* norm.py's batch_norm_backward: g = (dx, dr, dw, db). */
fg_status batch_norm_backward_into(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &w,
                                   const at::Tensor &mean, const at::Tensor &rstd, const fg_batch_norm_options &o,
                                   const bool want[4], at::ScalarType pdt, bool accumulate, at::Tensor g[4])
{
    alloc_grads(dy, x, want, pdt, g);
    const at::Tensor *p[] = {&dy, &x, &w, &mean, &rstd, &g[0], &g[1], &g[2], &g[3]};
    return run(FG_OP_BATCH_NORM_BACKWARD, p, 9, 0, dy, &o, sizeof o, accumulate);
}

/* torch_ops._call around f(ins): the inputs made dense, and when the library refuses their
 * layout, one retry on fresh copies. */
template <class F> fg_status with_retry(std::vector<at::Tensor> &ins, F f)
{
    for (auto &a : ins)
        a = dense(a);
    fg_status st = f(ins);
    if (retryable(st)) {
        for (auto &a : ins)
            a = fresh(a);
        st = f(ins);
    }
    return st;
}

/* ------------------------------------------------------------------ autograd */

struct LinearFn : public torch::autograd::Function<LinearFn> {
    /* b: nullopt when absent (an undefined tensor would count as an input with an edge) */
    static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &w,
                              const std::optional<at::Tensor> &b, int64_t flags)
    {
        const bool has_bias = b.has_value() && b->defined();
        at::Tensor y = forward_y(x, w, has_bias ? *b : at::Tensor(), (uint32_t)flags);
        ctx->save_for_backward({x, w});
        ctx->saved_data["flags"] = flags | (has_bias ? (int64_t)1 << 40 : 0);
        return y;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads)
    {
        auto saved = ctx->get_saved_variables();
        int64_t f = ctx->saved_data["flags"].toInt();
        bool has_bias = (f >> 40) & 1;
        auto g = backward_grads(grads[0], saved[0], saved[1], ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                has_bias && ctx->needs_input_grad(2), (uint32_t)(f & 0xffffffff));
        g.push_back(at::Tensor()); /* flags */
        return g;
    }
};

/* NormFunction of norm.py in C++: (y, s) = (norm(s)·w + b, s) with s = x + dropout(r); only y
 * when r is absent. Weights of another dtype than x run in x's dtype, their gradients are formed
 * in f32 and returned in the weights' dtype, as NormFunction does. */
struct NormFn : public torch::autograd::Function<NormFn> {
    static variable_list forward(AutogradContext *ctx, const at::Tensor &x_in, const std::optional<at::Tensor> &r_in,
                                 const std::optional<at::Tensor> &weight, const std::optional<at::Tensor> &bias,
                                 int64_t kind, double eps, double p, int64_t seed, int64_t offset)
    {
        auto present = [](const std::optional<at::Tensor> &t) { return t.has_value() && t->defined(); };
        const bool has_r = present(r_in), has_w = present(weight), has_b = present(bias);
        at::Tensor x = x_in.contiguous();
        at::Tensor r = has_r ? r_in->contiguous() : at::Tensor();
        at::Tensor w = has_w ? weight->to(x.scalar_type()) : at::Tensor();
        at::Tensor b = has_b ? bias->to(x.scalar_type()) : at::Tensor();
        const fg_norm_options o = norm_opts((int)kind, eps, has_r ? p : 0.0, (uint64_t)seed, (uint64_t)offset);
        at::Tensor out[4];
        std::vector<at::Tensor> ins = {x, w, b, r};
        fg_status st = with_retry(ins, [&](std::vector<at::Tensor> &a) {
            return norm_forward_into(a[0], a[3], a[1], a[2], o, true, true, out);
        });
        if (st != FG_OK)
            throw Refused{};
        n_norm_forward++;
        ctx->save_for_backward({out[1].defined() ? out[1] : x, w, out[2], out[3]});
        ctx->saved_data["kind"] = kind;
        ctx->saved_data["eps"] = eps;
        ctx->saved_data["p"] = p;
        ctx->saved_data["seed"] = seed;
        ctx->saved_data["offset"] = offset;
        ctx->saved_data["present"] = (int64_t)(has_r | has_w << 1 | has_b << 2);
        ctx->saved_data["wdt"] = has_w ? (int64_t)weight->scalar_type() : (int64_t)-1;
        if (out[1].defined())
            return {out[0], out[1]};
        return {out[0]};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads)
    {
        auto saved = ctx->get_saved_variables();
        const at::Tensor &xs = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
        const int64_t present = ctx->saved_data["present"].toInt(), wdt = ctx->saved_data["wdt"].toInt();
        const bool has_r = present & 1, has_w = present & 2, has_b = present & 4;
        /* autograd's edges are the tensors present: x, then r, weight, bias where given */
        int edge = 1;
        const int r_edge = has_r ? edge++ : -1, w_edge = has_w ? edge++ : -1, b_edge = has_b ? edge++ : -1;
        const bool need_x = ctx->needs_input_grad(0), need_r = has_r && ctx->needs_input_grad(r_edge);
        const bool need_w = w.defined() && ctx->needs_input_grad(w_edge);
        const bool need_b = has_b && ctx->needs_input_grad(b_edge);
        at::Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(xs);
        at::Tensor ds = grads.size() > 1 && grads[1].defined() ? grads[1].contiguous() : at::Tensor();
        const at::ScalarType pdt = wdt >= 0 && wdt != (int64_t)xs.scalar_type() ? at::kFloat
                                   : w.defined()                                ? w.scalar_type()
                                                                                : xs.scalar_type();
        const fg_norm_options o =
            norm_opts((int)ctx->saved_data["kind"].toInt(), ctx->saved_data["eps"].toDouble(),
                      ctx->saved_data["p"].toDouble(), (uint64_t)ctx->saved_data["seed"].toInt(),
                      (uint64_t)ctx->saved_data["offset"].toInt());
        const bool want[4] = {need_x, need_r, need_w, need_b};
        at::Tensor g[4];
        std::vector<at::Tensor> ins = {dy.contiguous(), xs, w, mean, rstd, ds};
        fg_status st = with_retry(ins, [&](std::vector<at::Tensor> &a) {
            return norm_backward_into(a[0], a[5], a[1], a[2], a[3], a[4], o, want, pdt, false, g);
        });
        if (st != FG_OK)
            fail("norm_backward", st, api.last_error());
        n_norm_backward++;
        if (wdt >= 0)
            for (int i = 2; i < 4; i++)
                if (g[i].defined())
                    g[i] = g[i].to((at::ScalarType)wdt);
        return {g[0], g[1], g[2], g[3], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

/* ---- linear + activation: LinearActFunction of autograd.py in C++ */

/* ops._act_options: zeroed first (the bytes, padding included, are part of the plan key), no
 * dropout (LinearActFunction takes none). */
fg_linear_act_options act_opts(int act, bool slope, bool consume)
{
    fg_linear_act_options o;
    std::memset(&o, 0, sizeof o);
    o.act = (fg_activation)act;
    o.saved = slope ? FG_ACT_SAVED_SLOPE : FG_ACT_SAVED_PRE;
    o.consume = consume;
    return o;
}

/* ops.linear_act_forward: out = (y, saved), saved (pre or its slope) only when keep. */
fg_status linear_act_forward_into(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b,
                                  const fg_linear_act_options &o, bool keep, uint32_t flags, at::Tensor out[2])
{
    const auto shape = with_last(x.sizes(), w.size(-2));
    at::Tensor y = at::empty(shape, x.options());
    at::Tensor saved = empty_if(keep, shape, x.options());
    const at::Tensor *p[] = {&x, &w, &b, &y, &saved};
    fg_status st = run(FG_OP_LINEAR_ACT_FORWARD, p, 5, flags, x, &o, sizeof o, false);
    out[0] = y, out[1] = saved;
    return st;
}

/* ops.linear_act_backward: g = (dx, dw, db) in dy's dtype, where want says (db: with a bias). */
fg_status linear_act_backward_into(const at::Tensor &dy, const at::Tensor &pre, const at::Tensor &x,
                                   const at::Tensor &w, const at::Tensor &b, const fg_linear_act_options &o,
                                   const bool want[3], uint32_t flags, at::Tensor g[3])
{
    g[0] = empty_if(want[0], x.sizes(), dy.options());
    g[1] = empty_if(want[1], w.sizes(), dy.options());
    g[2] = empty_if(want[2], b.sizes(), dy.options());
    const at::Tensor *p[] = {&dy, &pre, &x, &w, &b, &g[0], &g[1], &g[2]};
    return run(FG_OP_LINEAR_ACT_BACKWARD, p, 8, flags, dy, &o, sizeof o, false);
}

enum { SAVE_NONE = 0, SAVE_PRE = 1, SAVE_SLOPE = 2 }; /* save_pre False, True, "slope" ("auto" resolved) */

/* y = act(x·wᵀ + b) with LinearActFunction's saved tensors and backward: the pre-activation or
 * its slope when kept (relu: y, when save_pre; none: nothing), g formed in the saved tensor's
 * memory on the first backward, a later backward through the same graph recomputing pre. The
 * backward plans with the forward's flags (tf32 as set at the forward), as LinearFn does. */
struct LinearActFn : public torch::autograd::Function<LinearActFn> {
    static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &w,
                              const std::optional<at::Tensor> &bias, int64_t act, int64_t save, int64_t flags)
    {
        const bool has_bias = bias.has_value() && bias->defined();
        const at::Tensor b = has_bias ? *bias : at::Tensor();
        const bool relu = act == FG_ACT_RELU;
        const bool keep = save != SAVE_NONE && act != FG_ACT_RELU && act != FG_ACT_NONE;
        const bool slope = keep && save == SAVE_SLOPE;
        const fg_linear_act_options o = act_opts((int)act, slope, false);
        at::Tensor out[2];
        std::vector<at::Tensor> ins = {x, w, b};
        fg_status st = with_retry(ins, [&](std::vector<at::Tensor> &a) {
            return linear_act_forward_into(a[0], a[1], a[2], o, keep, (uint32_t)flags, out);
        });
        if (st != FG_OK)
            throw Refused{};
        const bool relu_y = relu && save != SAVE_NONE;
        ctx->save_for_backward({x, w, b, relu_y ? out[0] : out[1]});
        ctx->saved_data["act"] = act;
        ctx->saved_data["bits"] = (int64_t)(has_bias | relu_y << 1 | slope << 2);
        ctx->saved_data["flags"] = flags;
        ctx->saved_data["consumed"] = false;
        return out[0];
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads)
    {
        auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2];
        at::Tensor pre = saved[3];
        const int act = (int)ctx->saved_data["act"].toInt();
        const int64_t bits = ctx->saved_data["bits"].toInt();
        const bool has_bias = bits & 1, relu_y = bits & 2, slope = bits & 4;
        const bool consumed = ctx->saved_data["consumed"].toBool();
        bool consume = pre.defined() && !relu_y; /* relu's saved tensor is y, the caller's */
        if (consumed) { /* pre holds the first backward's g: recompute it */
            pre = at::Tensor();
            consume = false;
        }
        const bool want[3] = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                              has_bias && ctx->needs_input_grad(2)};
        const fg_linear_act_options o = act_opts(act, slope && pre.defined(), consume && pre.defined());
        at::Tensor g[3];
        std::vector<at::Tensor> ins = {grads[0].contiguous(), x.contiguous(), w.contiguous(), b, pre};
        fg_status st = with_retry(ins, [&](std::vector<at::Tensor> &a) {
            return linear_act_backward_into(a[0], a[4], a[1], a[2], a[3], o, want,
                                            (uint32_t)ctx->saved_data["flags"].toInt(), g);
        });
        if (st != FG_OK)
            fail("linear_act_backward", st, api.last_error());
        ctx->saved_data["consumed"] = consumed || consume;
        n_act_backward++;
        return {g[0], g[1], g[2], at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

/* ---- the transformer encoder layer */

/* encoder.py's EncoderLayerFunction with its host work in C++: a forward is one
 * fg_encoder_layer_forward_ws, a backward one fg_encoder_layer_backward, the cache, the
 * workspaces and the outputs from torch's allocator with encoder.py's sizes and rules (the same
 * calls, so the same bits). The autograd inputs are x, scores_in and the learnable weights (cast
 * to x's dtype by the caller); the rest (the descriptor's bytes, each weight's slot in
 * fg_encoder_layer_params, the running statistics, lengths, (seed, offset), train) rides in
 * saved_data, outside autograd's version checks, as the Python Function's _Call does. */
struct EncoderCall {
    fg_encoder_layer_desc desc;
    std::vector<int64_t> slots;       /* weights[i] is fg_encoder_layer_params' tensor slots[i] */
    std::vector<at::Tensor> buffers;  /* the running statistics, at buffer_slots */
    std::vector<int64_t> buffer_slots;
    at::Tensor lengths;               /* undefined: none */
    uint64_t seed, offset;
    bool train, want_scores;
    std::string no_backward;          /* not empty: the backward raises it (evaluation BatchNorm) */
};

static_assert(sizeof(fg_encoder_layer_params) == 22 * sizeof(fg_tensor), "fg_encoder_layer_params: 22 tensors");

fg_tensor *param_slot(fg_encoder_layer_params *p, int64_t i) { return reinterpret_cast<fg_tensor *>(p) + i; }

std::atomic<unsigned long long> n_enc_forward{0}, n_enc_backward{0}, n_enc_fallback{0};

struct EncoderFn : public torch::autograd::Function<EncoderFn> {
    static variable_list forward(AutogradContext *ctx, const at::Tensor &x, const std::optional<at::Tensor> &s_in,
                                 at::TensorList weights, const EncoderCall &call)
    {
        const fg_encoder_layer_desc &desc = call.desc;
        const bool has_s = s_in.has_value() && s_in->defined(), has_l = call.lengths.defined();
        const at::Tensor scores_in = has_s ? *s_in : at::Tensor();
        fg_encoder_layer_params p{};
        for (size_t i = 0; i < weights.size(); i++)
            describe(weights[i], param_slot(&p, call.slots[i]));
        for (size_t i = 0; i < call.buffers.size(); i++)
            describe(call.buffers[i], param_slot(&p, call.buffer_slots[i]));
        const int64_t B = x.size(0), L = x.size(1);
        size_t cache_bytes = 0, ws_bytes = 0;
        if (api.encoder_layer_sizes(&desc, (fg_dtype)dtype_code(x.scalar_type()), B, L, &cache_bytes, &ws_bytes) !=
            FG_OK)
            throw Refused{};
        const auto bytes = x.options().dtype(at::kByte);
        at::Tensor y = at::empty(x.sizes(), x.options()), scores, cache, ws;
        if (call.want_scores)
            scores = at::empty({B, desc.heads, L, L}, x.options().dtype(has_s ? scores_in.scalar_type()
                                                                               : x.scalar_type()));
        if (call.train)
            cache = at::empty({(int64_t)std::max<size_t>(cache_bytes, 16)}, bytes);
        if (call.train && desc.save == FG_ENCODER_SAVE_MIN && ws_bytes)
            ws = at::empty({(int64_t)std::max<size_t>(ws_bytes, 16)}, bytes);
        fg_tensor tx, tl, ts, ty, tso;
        describe(x, &tx);
        describe(call.lengths, &tl);
        describe(scores_in, &ts);
        describe(y, &ty);
        describe(scores, &tso);
        fg_encoder_layer_run run{};
        run.train = call.train ? 1 : 0;
        run.seed = call.seed;
        run.offset = call.offset;
        Ctx *c = nullptr;
        if (context_for(x, &c) != FG_OK)
            throw Refused{};
        if (api.encoder_layer_forward_ws(c->handle, &desc, &run, &tx, has_l ? &tl : nullptr, has_s ? &ts : nullptr,
                                         &p, &ty, call.want_scores ? &tso : nullptr,
                                         cache.defined() ? cache.mutable_data_ptr() : nullptr,
                                         cache.defined() ? (size_t)cache.numel() : 0,
                                         ws.defined() ? ws.mutable_data_ptr() : nullptr,
                                         ws.defined() ? (size_t)ws.numel() : 0) != FG_OK)
            throw Refused{};
        std::vector<at::Tensor> keep = {x, scores_in, cache};
        keep.insert(keep.end(), weights.begin(), weights.end());
        ctx->save_for_backward(keep);
        ctx->saved_data["desc"] = std::string(reinterpret_cast<const char *>(&desc), sizeof desc);
        ctx->saved_data["slots"] = call.slots;
        ctx->saved_data["buffers"] = call.buffers;
        ctx->saved_data["buffer_slots"] = call.buffer_slots;
        ctx->saved_data["has_lengths"] = has_l;
        ctx->saved_data["lengths"] = has_l ? call.lengths : at::zeros({0}, x.options().dtype(at::kLong));
        ctx->saved_data["seed"] = (int64_t)call.seed;
        ctx->saved_data["offset"] = (int64_t)call.offset;
        ctx->saved_data["no_backward"] = call.no_backward;
        ctx->set_materialize_grads(false);
        if (call.want_scores)
            return {y, scores};
        return {y};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads)
    {
        const std::string no_backward = ctx->saved_data["no_backward"].toStringRef();
        TORCH_CHECK(no_backward.empty(), no_backward);
        auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &scores_in = saved[1], &cache = saved[2];
        const size_t nw = saved.size() - 3;
        const std::vector<int64_t> slots = ctx->saved_data["slots"].toIntVector();
        const bool has_s = scores_in.defined();
        /* needs_input_grad counts the inputs autograd sees: x, scores_in when given, the weights */
        const size_t w0 = has_s ? 2 : 1;
        const bool need_x = ctx->needs_input_grad(0), need_s = has_s && ctx->needs_input_grad(1);
        std::vector<bool> need_w(nw);
        bool any = need_x || need_s;
        for (size_t i = 0; i < nw; i++)
            any |= need_w[i] = ctx->needs_input_grad(w0 + i);
        variable_list out(3 + nw + 1); /* x, scores_in, the weights, the call */
        if (!any)
            return out;
        fg_encoder_layer_desc desc;
        const std::string db = ctx->saved_data["desc"].toStringRef();
        std::memcpy(&desc, db.data(), sizeof desc);
        const at::Tensor dy = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(x);
        const at::Tensor ds = grads.size() > 1 && grads[1].defined() ? grads[1].contiguous() : at::Tensor();
        fg_encoder_layer_params p{}, g{};
        for (size_t i = 0; i < nw; i++) {
            const at::Tensor &w = saved[3 + i];
            describe(w, param_slot(&p, slots[i]));
            if (need_w[i]) {
                out[2 + i] = at::empty(w.sizes(), dy.options().dtype(w.scalar_type()));
                describe(out[2 + i], param_slot(&g, slots[i]));
            }
        }
        const std::vector<at::Tensor> buffers = ctx->saved_data["buffers"].toTensorVector();
        const std::vector<int64_t> bslots = ctx->saved_data["buffer_slots"].toIntVector();
        for (size_t i = 0; i < buffers.size(); i++)
            describe(buffers[i], param_slot(&p, bslots[i]));
        const bool has_l = ctx->saved_data["has_lengths"].toBool();
        const at::Tensor lengths = ctx->saved_data["lengths"].toTensor();
        if (need_x)
            out[0] = at::empty(x.sizes(), dy.options());
        if (need_s)
            out[1] = at::empty(scores_in.sizes(), dy.options().dtype(scores_in.scalar_type()));
        size_t cache_bytes = 0, ws_bytes = 0;
        fg_status st = api.encoder_layer_sizes(&desc, (fg_dtype)dtype_code(x.scalar_type()), x.size(0), x.size(1),
                                               &cache_bytes, &ws_bytes);
        if (st != FG_OK)
            fail("encoder_layer_backward", st, api.last_error());
        at::Tensor ws;
        if (ws_bytes)
            ws = at::empty({(int64_t)std::max<size_t>(ws_bytes, 16)}, dy.options().dtype(at::kByte));
        fg_tensor tdy, tds, tx, tl, ts, tdx, tdsin;
        describe(dy, &tdy);
        describe(ds, &tds);
        describe(x, &tx);
        describe(lengths, &tl);
        describe(scores_in, &ts);
        describe(out[0], &tdx);
        describe(out[1], &tdsin);
        fg_encoder_layer_run run{};
        run.train = 1;
        run.seed = (uint64_t)ctx->saved_data["seed"].toInt();
        run.offset = (uint64_t)ctx->saved_data["offset"].toInt();
        Ctx *c = nullptr;
        st = context_for(dy, &c);
        if (st == FG_OK)
            st = api.encoder_layer_backward(c->handle, &desc, &run, &tdy, ds.defined() ? &tds : nullptr, &tx,
                                            has_l ? &tl : nullptr, has_s ? &ts : nullptr, &p, cache.const_data_ptr(),
                                            (size_t)cache.numel(), need_x ? &tdx : nullptr,
                                            need_s ? &tdsin : nullptr, &g, 0,
                                            ws.defined() ? ws.mutable_data_ptr() : nullptr,
                                            ws.defined() ? (size_t)ws.numel() : 0);
        if (st != FG_OK)
            fail("encoder_layer_backward", st, api.last_error());
        n_enc_backward++;
        return out;
    }
};

/* Whether linear() takes these operands (else Python runs the call and raises its errors). */
bool takes(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b)
{
    if (!x.defined() || !w.defined() || x.dim() < 1 || x.dim() > FG_MAX_RANK || w.dim() != 2)
        return false;
    if (dtype_code(x.scalar_type()) < 0 || w.scalar_type() != x.scalar_type() || w.device() != x.device())
        return false;
    if (x.size(-1) != w.size(1))
        return false;
    if (b.defined() && (b.dim() != 1 || b.scalar_type() != x.scalar_type() || b.device() != x.device() ||
                        b.size(0) != w.size(0)))
        return false;
    if (x.is_cuda()) {
#ifndef FG_TORCHEXT_CUDA
        return false;
#endif
    } else if (!x.is_cpu())
        return false;
    return true;
}

at::Tensor linear_autograd(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &b,
                           int64_t flags)
{
    at::Tensor bias = b.has_value() ? *b : at::Tensor();
    TORCH_CHECK(ready.load(), "fastgrad_ext: not configured (import fastgrad first)");
    TORCH_CHECK(takes(x, w, bias), "fastgrad_ext::linear: operands it does not take (see fg.linear)");
    try {
        n_forward++;
        return LinearFn::apply(x, w, b, flags);
    } catch (const Refused &) {
        TORCH_CHECK(false, "fastgrad_ext::linear: the library refused the operands: ", api.last_error());
    }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward_op(const at::Tensor &dy, const at::Tensor &x,
                                                                  const at::Tensor &w, bool need_x, bool need_w,
                                                                  bool need_b, int64_t flags)
{
    TORCH_CHECK(ready.load(), "fastgrad_ext: not configured (import fastgrad first)");
    auto g = backward_grads(dy, x, w, need_x, need_w, need_b, (uint32_t)flags);
    auto none = [&](at::Tensor &t) { return t.defined() ? t : at::empty({0}, dy.options()); };
    return {none(g[0]), none(g[1]), none(g[2])};
}

/* ------------------------------------------------------------------ Python */

/* An operand linear() takes from Python: a plain torch.Tensor or Parameter (a subclass may
 * override torch functions: the Python Function honours that), or None for the bias. */
bool unpack(PyObject *o, at::Tensor &t, bool optional)
{
    if (optional && o == Py_None)
        return true;
    if (!THPVariable_CheckExact(o))
        return false;
    t = THPVariable_Unpack(o);
    return true;
}

/* linear(x, weight, bias, flags): y with its autograd in C++, or None (the caller runs Python). */
py::object py_linear(py::handle xo, py::handle wo, py::handle bo, int64_t flags)
{
    at::Tensor x, w, b;
    if (ready.load(std::memory_order_relaxed) && unpack(xo.ptr(), x, false) && unpack(wo.ptr(), w, false) &&
        unpack(bo.ptr(), b, true) && takes(x, w, b) && !for_python({&x, &w, &b})) {
        at::Tensor y;
        bool refused = false;
        {
            py::gil_scoped_release nogil;
            try {
                y = LinearFn::apply(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt, flags);
            } catch (const Refused &) {
                refused = true;
            }
        }
        if (!refused) {
            n_forward++;
            PyObject *r = THPVariable_Wrap(std::move(y));
            if (!r)
                throw py::error_already_set();
            return py::reinterpret_steal<py::object>(r);
        }
    }
    n_fallback++;
    return py::none();
}

/* ---- the row norms and BatchNorm from Python: each returns None (counted as norm_fallback) for
 * anything it does not take, and the caller runs norm.py's Python, which raises its errors. */

/* Python's float(o), the low 64 bits of int(o) (norm._u64), bool(o): false when o is not one. */
bool as_double(py::handle o, double &v)
{
    if (!PyFloat_Check(o.ptr()) && !PyLong_Check(o.ptr()))
        return false;
    v = PyFloat_AsDouble(o.ptr());
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return true;
}

bool as_u64(py::handle o, uint64_t &v)
{
    if (!PyLong_Check(o.ptr()))
        return false;
    v = PyLong_AsUnsignedLongLongMask(o.ptr());
    if (v == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return true;
}

bool as_bool(py::handle o, bool &v)
{
    int t = PyObject_IsTrue(o.ptr());
    if (t < 0) {
        PyErr_Clear();
        return false;
    }
    v = t;
    return true;
}

/* A str's UTF-8 text, or NULL (no Python error left set) for anything else. */
const char *as_utf8(py::handle o)
{
    if (!PyUnicode_Check(o.ptr()))
        return nullptr;
    const char *s = PyUnicode_AsUTF8(o.ptr());
    if (!s)
        PyErr_Clear();
    return s;
}

bool as_kind(py::handle o, int &kind)
{
    const char *s = as_utf8(o);
    if (!s)
        return false;
    kind = !std::strcmp(s, "layer") ? FG_NORM_LAYER : !std::strcmp(s, "rms") ? FG_NORM_RMS : -1;
    return kind >= 0;
}

/* param_dtype: None (false: no dtype given) or a torch.dtype fastgrad takes. */
bool as_dtype(py::handle o, at::ScalarType &dt, bool &given)
{
    given = o.ptr() != Py_None;
    if (!given)
        return true;
    if (!THPDtype_Check(o.ptr()))
        return false;
    dt = ((THPDtype *)o.ptr())->scalar_type;
    return dtype_code(dt) >= 0;
}

bool device_taken(const at::Tensor &t)
{
    if (t.is_cuda()) {
#ifdef FG_TORCHEXT_CUDA
        return true;
#else
        return false;
#endif
    }
    return t.is_cpu();
}

/* An operand of a functional entry, as ops.run would describe it: a dtype fastgrad takes, at
 * most FG_MAX_RANK dims, no broadcast (zero) stride on a dim above 1 (ops.run raises on those),
 * on ref's device; undefined (None) passes. */
bool plain(const at::Tensor &t, const at::Tensor &ref)
{
    if (!t.defined())
        return true;
    if (dtype_code(t.scalar_type()) < 0 || t.dim() > FG_MAX_RANK || t.device() != ref.device())
        return false;
    for (int64_t i = 0; i < t.dim(); i++)
        if (t.stride(i) == 0 && t.size(i) > 1)
            return false;
    return true;
}

bool all_plain(std::initializer_list<const at::Tensor *> ts, const at::Tensor &ref)
{
    if (!ref.defined() || ref.dim() < 1 || !device_taken(ref))
        return false;
    for (const at::Tensor *t : ts)
        if (!plain(*t, ref))
            return false;
    return true;
}

py::object wrap(at::Tensor t)
{
    if (!t.defined())
        return py::none();
    PyObject *r = THPVariable_Wrap(std::move(t));
    if (!r)
        throw py::error_already_set();
    return py::reinterpret_steal<py::object>(r);
}

py::object declined()
{
    n_norm_fallback++;
    return py::none();
}

py::object four(at::Tensor t[4])
{
    return py::make_tuple(wrap(t[0]), wrap(t[1]), wrap(t[2]), wrap(t[3]));
}

/* The functional norm calls' common end: run `call` (an *_into function filling t) without the
 * GIL; its four tensors, counted in `count`, or None (counted a fallback) where it declined. */
template <typename F>
py::object run_four(F &&call, std::atomic<unsigned long long> &count, at::Tensor t[4])
{
    fg_status st;
    {
        py::gil_scoped_release nogil;
        st = call();
    }
    if (st != FG_OK)
        return declined();
    count++;
    return four(t);
}

/* norm_forward(x, r, w, b, kind, eps, p, seed, offset, keep_sum, save_stats): norm.py's
 * norm_forward (without out=), or None. */
py::object py_norm_forward(py::handle xo, py::handle ro, py::handle wo, py::handle bo, py::handle kind_o,
                           py::handle eps_o, py::handle p_o, py::handle seed_o, py::handle offset_o,
                           py::handle keep_sum_o, py::handle save_stats_o)
{
    at::Tensor x, r, w, b;
    int kind;
    double eps, p;
    uint64_t seed, offset;
    bool keep_sum, save_stats;
    if (!ready.load(std::memory_order_relaxed) || !unpack(xo.ptr(), x, false) || !unpack(ro.ptr(), r, true) ||
        !unpack(wo.ptr(), w, true) || !unpack(bo.ptr(), b, true) || !as_kind(kind_o, kind) ||
        !as_double(eps_o, eps) || !as_double(p_o, p) || !as_u64(seed_o, seed) || !as_u64(offset_o, offset) ||
        !as_bool(keep_sum_o, keep_sum) || !as_bool(save_stats_o, save_stats) || !all_plain({&x, &r, &w, &b}, x))
        return declined();
    const fg_norm_options o = norm_opts(kind, eps, r.defined() ? p : 0.0, seed, offset);
    at::Tensor out[4];
    return run_four([&] { return norm_forward_into(x, r, w, b, o, keep_sum, save_stats, out); }, n_norm_forward,
                    out);
}

/* norm_backward(dy, ds, x, w, mean, rstd, kind, eps, p, seed, offset, need_x, need_r, need_w,
 * need_b, has_bias, param_dtype, accumulate): norm.py's norm_backward (without out=), or None. */
py::object py_norm_backward(py::handle dyo, py::handle dso, py::handle xo, py::handle wo, py::handle mo,
                            py::handle ro, py::handle kind_o, py::handle eps_o, py::handle p_o, py::handle seed_o,
                            py::handle offset_o, py::handle nx, py::handle nr, py::handle nw, py::handle nb,
                            py::handle has_bias_o, py::handle pdt_o, py::handle acc_o)
{
    at::Tensor dy, ds, x, w, mean, rstd;
    int kind;
    double eps, p;
    uint64_t seed, offset;
    bool need[4], has_bias, accumulate, pdt_given;
    at::ScalarType pdt = at::kFloat;
    if (!ready.load(std::memory_order_relaxed) || !unpack(dyo.ptr(), dy, false) || !unpack(dso.ptr(), ds, true) ||
        !unpack(xo.ptr(), x, false) || !unpack(wo.ptr(), w, true) || !unpack(mo.ptr(), mean, true) ||
        !unpack(ro.ptr(), rstd, true) || !as_kind(kind_o, kind) || !as_double(eps_o, eps) || !as_double(p_o, p) ||
        !as_u64(seed_o, seed) || !as_u64(offset_o, offset) || !as_bool(nx, need[0]) || !as_bool(nr, need[1]) ||
        !as_bool(nw, need[2]) || !as_bool(nb, need[3]) || !as_bool(has_bias_o, has_bias) ||
        !as_dtype(pdt_o, pdt, pdt_given) || !as_bool(acc_o, accumulate) ||
        !all_plain({&dy, &ds, &x, &w, &mean, &rstd}, dy) || x.dim() < 1)
        return declined();
    if (!pdt_given)
        pdt = w.defined() ? w.scalar_type() : x.scalar_type();
    const bool want[4] = {need[0], need[1], need[2] && w.defined(), need[3] && has_bias};
    const fg_norm_options o = norm_opts(kind, eps, p, seed, offset);
    at::Tensor g[4];
    return run_four([&] { return norm_backward_into(dy, ds, x, w, mean, rstd, o, want, pdt, accumulate, g); },
                    n_norm_backward, g);
}

/* batch_norm_forward(x, r, w, b, running_mean, running_var, training, momentum, eps, p, seed,
 * offset, keep_sum): norm.py's batch_norm_forward, or None. */
py::object py_batch_norm_forward(py::handle xo, py::handle ro, py::handle wo, py::handle bo, py::handle rmo,
                                 py::handle rvo, py::handle training_o, py::handle momentum_o, py::handle eps_o,
                                 py::handle p_o, py::handle seed_o, py::handle offset_o, py::handle keep_sum_o)
{
    at::Tensor x, r, w, b, rm, rv;
    double momentum, eps, p;
    uint64_t seed, offset;
    bool training, keep_sum;
    if (!ready.load(std::memory_order_relaxed) || !unpack(xo.ptr(), x, false) || !unpack(ro.ptr(), r, true) ||
        !unpack(wo.ptr(), w, true) || !unpack(bo.ptr(), b, true) || !unpack(rmo.ptr(), rm, true) ||
        !unpack(rvo.ptr(), rv, true) || !as_bool(training_o, training) || !as_double(momentum_o, momentum) ||
        !as_double(eps_o, eps) || !as_double(p_o, p) || !as_u64(seed_o, seed) || !as_u64(offset_o, offset) ||
        !as_bool(keep_sum_o, keep_sum) || !all_plain({&x, &r, &w, &b, &rm, &rv}, x))
        return declined();
    const fg_batch_norm_options o = batch_norm_opts(training, eps, momentum, r.defined() ? p : 0.0, seed, offset);
    at::Tensor out[4];
    return run_four([&] { return batch_norm_forward_into(x, r, w, b, rm, rv, o, keep_sum, out); },
                    n_batch_norm_forward, out);
}

/* batch_norm_backward(dy, x, w, mean, rstd, training, p, seed, offset, need_x, need_r, need_w,
 * need_b, has_bias, param_dtype, accumulate): norm.py's batch_norm_backward (without out=), or
 * None. Its options are batch_norm_options(training, p=p, seed=seed, offset=offset). */
py::object py_batch_norm_backward(py::handle dyo, py::handle xo, py::handle wo, py::handle mo, py::handle ro,
                                  py::handle training_o, py::handle p_o, py::handle seed_o, py::handle offset_o,
                                  py::handle nx, py::handle nr, py::handle nw, py::handle nb, py::handle has_bias_o,
                                  py::handle pdt_o, py::handle acc_o)
{
    at::Tensor dy, x, w, mean, rstd;
    double p;
    uint64_t seed, offset;
    bool training, need[4], has_bias, accumulate, pdt_given;
    at::ScalarType pdt = at::kFloat;
    if (!ready.load(std::memory_order_relaxed) || !unpack(dyo.ptr(), dy, false) || !unpack(xo.ptr(), x, false) ||
        !unpack(wo.ptr(), w, true) || !unpack(mo.ptr(), mean, true) || !unpack(ro.ptr(), rstd, true) ||
        !as_bool(training_o, training) || !as_double(p_o, p) || !as_u64(seed_o, seed) ||
        !as_u64(offset_o, offset) || !as_bool(nx, need[0]) || !as_bool(nr, need[1]) || !as_bool(nw, need[2]) ||
        !as_bool(nb, need[3]) || !as_bool(has_bias_o, has_bias) || !as_dtype(pdt_o, pdt, pdt_given) ||
        !as_bool(acc_o, accumulate) || !all_plain({&dy, &x, &w, &mean, &rstd}, dy) || x.dim() < 1)
        return declined();
    if (!pdt_given)
        pdt = w.defined() ? w.scalar_type() : x.scalar_type();
    const bool want[4] = {need[0], need[1], need[2] && w.defined(), need[3] && has_bias};
    const fg_batch_norm_options o = batch_norm_opts(training, 1e-5, 0.1, p, seed, offset);
    at::Tensor g[4];
    return run_four([&] { return batch_norm_backward_into(dy, x, w, mean, rstd, o, want, pdt, accumulate, g); },
                    n_batch_norm_backward, g);
}

/* norm(x, r, w, b, kind, eps, p, seed, offset): (y, s) of NormFunction (s None without r) with
 * its autograd in C++, or None. w, b may have another floating dtype than x (NormFunction
 * converts them); tensors of another layout are made contiguous or copied as _call does. */
py::object py_norm(py::handle xo, py::handle ro, py::handle wo, py::handle bo, py::handle kind_o, py::handle eps_o,
                   py::handle p_o, py::handle seed_o, py::handle offset_o)
{
    at::Tensor x, r, w, b;
    int kind;
    double eps, p;
    uint64_t seed, offset;
    if (!ready.load(std::memory_order_relaxed) || !unpack(xo.ptr(), x, false) || !unpack(ro.ptr(), r, true) ||
        !unpack(wo.ptr(), w, true) || !unpack(bo.ptr(), b, true) || !as_kind(kind_o, kind) ||
        !as_double(eps_o, eps) || !as_double(p_o, p) || !as_u64(seed_o, seed) || !as_u64(offset_o, offset) ||
        !all_plain({}, x) || dtype_code(x.scalar_type()) < 0 || x.dim() > FG_MAX_RANK ||
        for_python({&x, &r, &w, &b}))
        return declined();
    for (const at::Tensor *t : {&r, &w, &b})
        if (t->defined() && (dtype_code(t->scalar_type()) < 0 || t->dim() > FG_MAX_RANK || t->device() != x.device()))
            return declined();
    if (r.defined() && r.scalar_type() != x.scalar_type())
        return declined();
    auto opt = [](const at::Tensor &t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    variable_list out;
    bool refused = false;
    {
        py::gil_scoped_release nogil;
        try {
            out = NormFn::apply(x, opt(r), opt(w), opt(b), (int64_t)kind, eps, p, (int64_t)seed, (int64_t)offset);
        } catch (const Refused &) {
            refused = true;
        }
    }
    if (refused)
        return declined();
    n_norm_autograd++;
    return py::make_tuple(wrap(out[0]), out.size() > 1 ? wrap(out[1]) : py::none());
}

/* ---- linear + activation from Python */

/* act: a name of _lib.ACT; false for anything else. */
bool as_act(py::handle o, int &act)
{
    static const char *const names[] = {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"};
    static const int codes[] = {FG_ACT_NONE, FG_ACT_RELU,    FG_ACT_GELU, FG_ACT_GELU_TANH,
                                FG_ACT_SILU, FG_ACT_SIGMOID, FG_ACT_TANH};
    const char *s = as_utf8(o);
    if (!s)
        return false;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!std::strcmp(s, names[i])) {
            act = codes[i];
            return true;
        }
    return false;
}

/* save_pre as linear_act hands it to LinearActFunction: True, False, "slope" or "auto" ("auto":
 * the slope when the reduction x.shape[-1] is longer than 128, else pre). */
bool as_save(py::handle o, const at::Tensor &x, int &save)
{
    if (o.ptr() == Py_True || o.ptr() == Py_False) {
        save = o.ptr() == Py_True ? SAVE_PRE : SAVE_NONE;
        return true;
    }
    const char *s = as_utf8(o);
    if (!s)
        return false;
    if (!std::strcmp(s, "slope"))
        save = SAVE_SLOPE;
    else if (!std::strcmp(s, "auto"))
        save = x.size(-1) > 128 ? SAVE_SLOPE : SAVE_PRE;
    else
        return false;
    return true;
}

/* linear_act(x, weight, bias, act, save_pre, flags): y of LinearActFunction with its autograd in
 * C++, or None (counted as linear_act_fallback: the caller runs the Function, which raises its
 * errors). Takes x, weight (2-D, or 3-D batched) and bias of one dtype and device; the library
 * checks the shapes (a refusal is handed back). */
py::object py_linear_act(py::handle xo, py::handle wo, py::handle bo, py::handle act_o, py::handle save_o,
                         int64_t flags)
{
    at::Tensor x, w, b;
    int act, save;
    if (ready.load(std::memory_order_relaxed) && unpack(xo.ptr(), x, false) && unpack(wo.ptr(), w, false) &&
        unpack(bo.ptr(), b, true) && all_plain({&w, &b}, x) && x.dim() <= FG_MAX_RANK &&
        dtype_code(x.scalar_type()) >= 0 && (w.dim() == 2 || w.dim() == 3) &&
        w.scalar_type() == x.scalar_type() && (!b.defined() || b.scalar_type() == x.scalar_type()) &&
        as_act(act_o, act) && as_save(save_o, x, save) && !for_python({&x, &w, &b})) {
        at::Tensor y;
        bool refused = false;
        {
            py::gil_scoped_release nogil;
            try {
                y = LinearActFn::apply(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt,
                                       (int64_t)act, (int64_t)save, flags);
            } catch (const Refused &) {
                refused = true;
            }
        }
        if (!refused) {
            n_act_forward++;
            return wrap(std::move(y));
        }
    }
    n_act_fallback++;
    return py::none();
}

/* ---- the encoder layer from Python */

bool as_slots(py::handle o, std::vector<int64_t> &v, size_t n)
{
    if (!PyTuple_Check(o.ptr()) || (size_t)PyTuple_GET_SIZE(o.ptr()) != n)
        return false;
    v.resize(n);
    for (size_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GET_ITEM(o.ptr(), (Py_ssize_t)i);
        if (!PyLong_Check(e))
            return false;
        v[i] = PyLong_AsLongLong(e);
        if (v[i] < 0 || v[i] >= 22)
            return false;
    }
    return true;
}

bool as_tensors(py::handle o, std::vector<at::Tensor> &v, const at::Tensor &ref)
{
    if (!PyTuple_Check(o.ptr()))
        return false;
    const Py_ssize_t n = PyTuple_GET_SIZE(o.ptr());
    v.resize((size_t)n);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!unpack(PyTuple_GET_ITEM(o.ptr(), i), v[(size_t)i], false) || !plain(v[(size_t)i], ref))
            return false;
    return true;
}

/* encoder_layer(x, scores_in, weights, slots, buffers, buffer_slots, lengths, desc, seed, offset, train,
 * want_scores, no_backward): encoder.py's EncoderLayerFunction.apply with its autograd in C++ — y, or
 * (y, scores_out) when want_scores — or None when Python must run the call. weights, buffers: tuples of
 * tensors; slots, buffer_slots: tuples of their indices in fg_encoder_layer_params; desc: the
 * fg_encoder_layer_desc's bytes; no_backward: None, or the message a backward raises. */
py::object py_encoder_layer(py::handle xo, py::handle so, py::handle wo, py::handle slots_o, py::handle bo,
                            py::handle bslots_o, py::handle lo, py::handle desc_o, py::handle seed_o,
                            py::handle offset_o, py::handle train_o, py::handle want_o, py::handle nb_o)
{
    at::Tensor x, s, lengths;
    EncoderCall call;
    bool train = false, want = false;
    std::vector<at::Tensor> weights;
    if (ready.load(std::memory_order_relaxed) && unpack(xo.ptr(), x, false) && x.dim() == 3 &&
        device_taken(x) && dtype_code(x.scalar_type()) >= 0 && x.is_contiguous() && unpack(so.ptr(), s, true) &&
        plain(s, x) && unpack(lo.ptr(), lengths, true) && (!lengths.defined() || lengths.device() == x.device()) &&
        as_tensors(wo, weights, x) && as_slots(slots_o, call.slots, weights.size()) &&
        as_tensors(bo, call.buffers, x) && as_slots(bslots_o, call.buffer_slots, call.buffers.size()) &&
        PyBytes_Check(desc_o.ptr()) && (size_t)PyBytes_GET_SIZE(desc_o.ptr()) == sizeof(fg_encoder_layer_desc) &&
        as_u64(seed_o, call.seed) && as_u64(offset_o, call.offset) && as_bool(train_o, train) &&
        as_bool(want_o, want) && (nb_o.ptr() == Py_None || PyUnicode_Check(nb_o.ptr()))) {
        std::memcpy(&call.desc, PyBytes_AS_STRING(desc_o.ptr()), sizeof call.desc);
        call.lengths = lengths;
        call.train = train;
        call.want_scores = want;
        if (nb_o.ptr() != Py_None)
            call.no_backward = as_utf8(nb_o);
        std::vector<const at::Tensor *> all = {&x, &s};
        for (const at::Tensor &w : weights)
            all.push_back(&w);
        if (!for_python(all)) {
            variable_list r;
            bool refused = false;
            {
                py::gil_scoped_release nogil;
                try {
                    r = EncoderFn::apply(x, s.defined() ? std::optional<at::Tensor>(s) : std::nullopt,
                                         at::TensorList(weights), call);
                } catch (const Refused &) {
                    refused = true;
                }
            }
            if (!refused) {
                n_enc_forward++;
                if (want)
                    return py::make_tuple(wrap(r[0]), wrap(r[1]));
                return wrap(r[0]);
            }
        }
    }
    n_enc_fallback++;
    return py::none();
}

/* ------------------------------------------------------------------ the custom ops' kernels */

/* torch_ops.py's custom ops fastgrad::linear, linear_backward, linear_act, linear_act_backward,
 * norm, norm_backward, attention and attention_backward as the dispatcher's CPU and CUDA kernels (register_kernels, which
 * torch_ops calls once it has defined them). A torch.compile'd graph calls the ops; with these
 * its call stays in C++ after custom_op's autograd kernel instead of entering torch_ops'
 * function, ops.py and ctypes. Each computes what the op's Python function computes, through
 * the same plans (the same bits); operands it does not take, and any status but FG_OK, go to
 * that Python function, which gives the results or raises its usual errors. */
enum {
    K_LINEAR,
    K_LINEAR_BACKWARD,
    K_LINEAR_ACT,
    K_LINEAR_ACT_BACKWARD,
    K_NORM,
    K_NORM_BACKWARD,
    K_ATTENTION,
    K_ATTENTION_BACKWARD,
    K_COUNT
};
const char *const kernel_names[K_COUNT] = {"linear", "linear_backward", "linear_act", "linear_act_backward",
                                           "norm",   "norm_backward",   "attention",  "attention_backward"};
PyObject *python_impl[K_COUNT];         /* the ops' Python functions (references kept for the process) */
std::atomic<uint32_t> kernel_flags{0};  /* FG_PLAN_ALLOW_TF32 as ops.set_allow_tf32 last set it */
std::atomic<unsigned long long> n_kernel{0}, n_kernel_python{0}, n_autograd_cpp{0}, n_autograd_python{0};

py::object arg(const at::Tensor &t) { return wrap(t); }
py::object arg(const std::optional<at::Tensor> &t) { return t.has_value() ? wrap(*t) : py::none(); }
py::object arg(c10::string_view v) { return py::str(v.data(), v.size()); }
py::object arg(const c10::SymInt &v) { return py::int_(v.expect_int()); }
py::object arg(bool v) { return py::bool_(v); }
py::object arg(double v) { return py::float_(v); }
py::object arg(const std::optional<double> &v) { return v.has_value() ? py::object(py::float_(*v)) : py::none(); }

/* The op's Python function on the same arguments, its result converted under the GIL. */
template <class R, class... A> R call_python(int k, const A &...args)
{
    py::gil_scoped_acquire gil;
    n_kernel_python++;
    py::object r = py::reinterpret_borrow<py::object>(python_impl[k])(arg(args)...);
    return r.cast<R>();
}

at::Tensor given(const std::optional<at::Tensor> &t) { return t.has_value() ? *t : at::Tensor(); }
bool present(const std::optional<at::Tensor> &t) { return t.has_value() && t->defined(); }

/* torch_ops._or_nothing: t, or an empty [0] tensor like ref for a gradient not asked for */
at::Tensor or_nothing(const at::Tensor &t, const at::Tensor &ref)
{
    return t.defined() ? t : at::empty({0}, ref.options());
}

bool act_code(c10::string_view s, int &act)
{
    static const char *const names[] = {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"};
    static const int codes[] = {FG_ACT_NONE, FG_ACT_RELU,    FG_ACT_GELU, FG_ACT_GELU_TANH,
                                FG_ACT_SILU, FG_ACT_SIGMOID, FG_ACT_TANH};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (s == names[i]) {
            act = codes[i];
            return true;
        }
    return false;
}

bool kind_code(c10::string_view s, int &kind)
{
    kind = s == "layer" ? FG_NORM_LAYER : s == "rms" ? FG_NORM_RMS : -1;
    return kind >= 0;
}

/* torch_ops._seed_value: the seed tensor's value (a CPU tensor), 0 without one */
uint64_t seed_of(const std::optional<at::Tensor> &seed)
{
    return seed.has_value() && seed->defined() ? (uint64_t)seed->item<int64_t>() : 0;
}

using T2 = std::tuple<at::Tensor, at::Tensor>;
using T3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using T4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

at::Tensor k_linear(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &b)
{
    const at::Tensor bias = given(b);
    if (ready.load(std::memory_order_relaxed) && takes(x, w, bias)) {
        try {
            at::Tensor y = forward_y(x, w, bias, kernel_flags.load(std::memory_order_relaxed));
            n_kernel++;
            return y;
        } catch (const Refused &) {
        }
    }
    return call_python<at::Tensor>(K_LINEAR, x, w, b);
}

T3 k_linear_backward(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &w, bool need_x, bool need_w,
                     bool need_b)
{
    if (ready.load(std::memory_order_relaxed) && takes(x, w, at::Tensor()) && dy.defined() && dy.dim() >= 1 &&
        dy.dim() <= FG_MAX_RANK && dy.scalar_type() == x.scalar_type() && dy.device() == x.device()) {
        try {
            auto g = linear_grads(dy, x, w, need_x, need_w, need_b, kernel_flags.load(std::memory_order_relaxed), true);
            n_kernel++;
            return {or_nothing(g[0], dy), or_nothing(g[1], dy), or_nothing(g[2], dy)};
        } catch (const Refused &) {
        }
    }
    return call_python<T3>(K_LINEAR_BACKWARD, dy, x, w, need_x, need_w, need_b);
}

T2 k_linear_act(const at::Tensor &x_in, const at::Tensor &w_in, const std::optional<at::Tensor> &b,
                c10::string_view act_s, bool save, bool slope)
{
    const at::Tensor x = dense(x_in), w = dense(w_in), bias = dense(given(b)); /* (torch_ops._call's _dense) */
    int act;
    if (ready.load(std::memory_order_relaxed) && act_code(act_s, act) && all_plain({&x, &w, &bias}, x)) {
        const bool keep = save && act != FG_ACT_RELU && act != FG_ACT_NONE;
        const fg_linear_act_options o = act_opts(act, slope && keep, false);
        const uint32_t f = kernel_flags.load(std::memory_order_relaxed);
        at::Tensor out[2];
        std::vector<at::Tensor> ins = {x, w, bias};
        if (with_retry(ins, [&](std::vector<at::Tensor> &a) {
                return linear_act_forward_into(a[0], a[1], a[2], o, keep, f, out);
            }) == FG_OK) {
            n_kernel++;
            return {out[0], or_nothing(out[1], out[0])};
        }
    }
    return call_python<T2>(K_LINEAR_ACT, x_in, w_in, b, act_s, save, slope);
}

T3 k_linear_act_backward(const at::Tensor &dy_in, const at::Tensor &x_in, const at::Tensor &w_in,
                         const std::optional<at::Tensor> &b, const std::optional<at::Tensor> &pre_in,
                         c10::string_view act_s, bool slope, bool need_x, bool need_w, bool need_b)
{
    const at::Tensor dy = dense(dy_in), x = dense(x_in), w = dense(w_in), bias = dense(given(b)),
                     pre = dense(given(pre_in));
    int act;
    if (ready.load(std::memory_order_relaxed) && act_code(act_s, act) && (pre.defined() || !slope) &&
        all_plain({&dy, &x, &w, &bias, &pre}, dy)) {
        const bool want[3] = {need_x, need_w, need_b && bias.defined()};
        const fg_linear_act_options o = act_opts(act, slope, false);
        const uint32_t f = kernel_flags.load(std::memory_order_relaxed);
        at::Tensor g[3];
        std::vector<at::Tensor> ins = {dy.contiguous(), x.contiguous(), w.contiguous(), bias, pre};
        if (with_retry(ins, [&](std::vector<at::Tensor> &a) {
                return linear_act_backward_into(a[0], a[4], a[1], a[2], a[3], o, want, f, g);
            }) == FG_OK) {
            n_kernel++;
            return {or_nothing(g[0], dy), or_nothing(g[1], dy), or_nothing(g[2], dy)};
        }
    }
    return call_python<T3>(K_LINEAR_ACT_BACKWARD, dy_in, x_in, w_in, b, pre_in, act_s, slope, need_x, need_w, need_b);
}

T4 k_norm(const at::Tensor &x_in, const std::optional<at::Tensor> &r_in, const std::optional<at::Tensor> &weight,
          const std::optional<at::Tensor> &bias, c10::string_view kind_s, double eps, double p,
          const std::optional<at::Tensor> &seed, c10::SymInt offset)
{
    int kind;
    if (ready.load(std::memory_order_relaxed) && kind_code(kind_s, kind) && x_in.defined()) {
        const at::Tensor x = x_in.contiguous();
        const at::Tensor r = present(r_in) ? r_in->contiguous() : at::Tensor();
        const at::Tensor w = present(weight) ? weight->to(x.scalar_type()) : at::Tensor();
        const at::Tensor b = present(bias) ? bias->to(x.scalar_type()) : at::Tensor();
        if (all_plain({&x, &r, &w, &b}, x)) {
            const fg_norm_options o =
                norm_opts(kind, eps, r.defined() ? p : 0.0, seed_of(seed), (uint64_t)offset.expect_int());
            at::Tensor out[4];
            std::vector<at::Tensor> ins = {x, w, b, r};
            if (with_retry(ins, [&](std::vector<at::Tensor> &a) {
                    return norm_forward_into(a[0], a[3], a[1], a[2], o, true, true, out);
                }) == FG_OK) {
                n_kernel++;
                return {out[0], or_nothing(out[1], out[0]), or_nothing(out[2], out[3]), out[3]};
            }
        }
    }
    return call_python<T4>(K_NORM, x_in, r_in, weight, bias, kind_s, eps, p, seed, offset);
}

T4 k_norm_backward(const at::Tensor &dy_in, const std::optional<at::Tensor> &ds_in, const at::Tensor &xs,
                   const std::optional<at::Tensor> &weight, const std::optional<at::Tensor> &mean_in,
                   const at::Tensor &rstd, c10::string_view kind_s, double eps, double p,
                   const std::optional<at::Tensor> &seed, c10::SymInt offset, bool need_x, bool need_r, bool need_w,
                   bool need_b)
{
    int kind;
    if (ready.load(std::memory_order_relaxed) && kind_code(kind_s, kind) && dy_in.defined() && xs.defined() &&
        xs.dim() >= 1) {
        const at::Tensor dy = dy_in.contiguous();
        const at::Tensor ds = present(ds_in) ? ds_in->contiguous() : at::Tensor();
        const at::Tensor w = present(weight) ? weight->to(xs.scalar_type()) : at::Tensor();
        const at::Tensor mean = given(mean_in);
        if (all_plain({&dy, &ds, &xs, &w, &mean, &rstd}, dy)) {
            /* dw, db formed in f32 for weights of another dtype than x, then cast to theirs */
            const bool other = present(weight) && weight->scalar_type() != xs.scalar_type();
            const at::ScalarType pdt = other ? at::kFloat : w.defined() ? w.scalar_type() : xs.scalar_type();
            const bool want[4] = {need_x, need_r, need_w && w.defined(), need_b};
            const fg_norm_options o = norm_opts(kind, eps, p, seed_of(seed), (uint64_t)offset.expect_int());
            at::Tensor g[4];
            std::vector<at::Tensor> ins = {dy, xs, w, mean, rstd, ds};
            if (with_retry(ins, [&](std::vector<at::Tensor> &a) {
                    return norm_backward_into(a[0], a[5], a[1], a[2], a[3], a[4], o, want, pdt, false, g);
                }) == FG_OK) {
                if (present(weight))
                    for (int i = 2; i < 4; i++)
                        if (g[i].defined())
                            g[i] = g[i].to(weight->scalar_type());
                n_kernel++;
                return {or_nothing(g[0], dy_in), or_nothing(g[1], dy_in), or_nothing(g[2], dy_in),
                        or_nothing(g[3], dy_in)};
            }
        }
    }
    return call_python<T4>(K_NORM_BACKWARD, dy_in, ds_in, xs, weight, mean_in, rstd, kind_s, eps, p, seed, offset,
                           need_x, need_r, need_w, need_b);
}

/* ops.attention_options: zeroed first (its bytes key the plan), scale None as 0 (1/√hd) */
fg_attention_options attn_opts(bool causal, const std::optional<double> &scale, double dropout_p, uint64_t seed,
                               uint64_t offset)
{
    fg_attention_options o;
    std::memset(&o, 0, sizeof o);
    o.scale = scale.has_value() ? *scale : 0.0;
    o.causal = causal;
    o.dropout_p = dropout_p;
    o.seed = seed;
    o.offset = offset;
    return o;
}

/* ops._heads_like: a [B, H, L, hd] tensor stored [B, L, H, hd] */
at::Tensor heads_like(const at::Tensor &ref, at::IntArrayRef bhld)
{
    return at::empty({bhld[0], bhld[2], bhld[1], bhld[3]}, ref.options()).transpose(1, 2);
}

at::ScalarType scores_type(c10::string_view name, at::ScalarType fallback, bool &known)
{
    known = true;
    if (name.empty())
        return fallback;
    if (name == "float32")
        return at::kFloat;
    if (name == "float16")
        return at::kHalf;
    if (name == "bfloat16")
        return at::kBFloat16;
    if (name == "float64")
        return at::kDouble;
    known = false;
    return fallback;
}

/* Calls with key-padding lengths go to Python: a bad length is flagged on the context that ran
   the call, and fg.context_check reads ops.py's contexts, not this module's. */
T3 k_attention(const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
               const std::optional<at::Tensor> &sin_in, const std::optional<at::Tensor> &len_in,
               const std::optional<at::Tensor> &seed, c10::SymInt offset, bool causal, std::optional<double> scale,
               double dropout_p, bool return_scores, c10::string_view scores_dtype)
{
    const at::Tensor q = dense(q_in), k = dense(k_in), v = dense(v_in), sin = dense(given(sin_in)), len = given(len_in);
    bool known;
    if (ready.load(std::memory_order_relaxed) && !len.defined() && q.dim() == 4 && all_plain({&q, &k, &v, &sin}, q)) {
        const at::ScalarType sdt = sin.defined() ? sin.scalar_type() : scores_type(scores_dtype, q.scalar_type(), known);
        if (sin.defined() || known) {
            const fg_attention_options o =
                attn_opts(causal, scale, dropout_p, seed_of(seed), (uint64_t)offset.expect_int());
            at::Tensor out[3];
            std::vector<at::Tensor> ins = {q, k, v, len, sin};
            if (with_retry(ins, [&](std::vector<at::Tensor> &a) {
                    const at::Tensor &qq = a[0];
                    out[0] = heads_like(qq, qq.sizes());
                    out[1] = at::empty({qq.size(0), qq.size(1), qq.size(2)}, acc_options(qq));
                    out[2] = return_scores
                                 ? at::empty({qq.size(0), qq.size(1), qq.size(2), qq.size(2)}, qq.options().dtype(sdt))
                                 : at::Tensor();
                    const at::Tensor *p[] = {&a[0], &a[1], &a[2], &a[3], &a[4], &out[0], &out[1], &out[2]};
                    return run(FG_OP_ATTENTION_FORWARD, p, 8, 0, qq, &o, sizeof o, false);
                }) == FG_OK) {
                n_kernel++;
                return {out[0], out[1], or_nothing(out[2], out[0])};
            }
        }
    }
    return call_python<T3>(K_ATTENTION, q_in, k_in, v_in, sin_in, len_in, seed, offset, causal, scale, dropout_p,
                           return_scores, scores_dtype);
}

T4 k_attention_backward(const at::Tensor &do_in, const std::optional<at::Tensor> &dsc_in, const at::Tensor &q_in,
                        const at::Tensor &k_in, const at::Tensor &v_in, const at::Tensor &o_in,
                        const at::Tensor &lse_in, const std::optional<at::Tensor> &len_in,
                        const std::optional<at::Tensor> &sin_in, const std::optional<at::Tensor> &seed,
                        c10::SymInt offset, bool causal, std::optional<double> scale, double dropout_p, bool need_q,
                        bool need_k, bool need_v, bool need_s)
{
    const at::Tensor d_o = dense(do_in), dsc = dense(given(dsc_in)), q = dense(q_in), k = dense(k_in),
                     v = dense(v_in), o = dense(o_in), lse = dense(lse_in), len = given(len_in),
                     sin = dense(given(sin_in));
    if (ready.load(std::memory_order_relaxed) && !len.defined() && q.dim() == 4 && d_o.defined() &&
        all_plain({&d_o, &dsc, &q, &k, &v, &o, &lse, &sin}, d_o)) {
        const bool want[4] = {need_q, need_k, need_v, need_s && sin.defined()};
        const fg_attention_options opt =
            attn_opts(causal, scale, dropout_p, seed_of(seed), (uint64_t)offset.expect_int());
        at::Tensor g[4];
        std::vector<at::Tensor> ins = {d_o, q, k, v, o, lse, len, sin, dsc};
        if (with_retry(ins, [&](std::vector<at::Tensor> &a) {
                const at::Tensor &dd = a[0], &qq = a[1];
                for (int i = 0; i < 3; i++)
                    g[i] = want[i] ? heads_like(dd, qq.sizes()) : at::Tensor();
                g[3] = want[3] ? at::empty(a[7].sizes(), a[7].options()) : at::Tensor();
                const at::Tensor *p[] = {&a[0], &a[8], &a[1], &a[2], &a[3], &a[6], &a[7],
                                         &a[4], &a[5], &g[0], &g[1], &g[2], &g[3]};
                return run(FG_OP_ATTENTION_BACKWARD, p, 13, 0, dd, &opt, sizeof opt, false);
            }) == FG_OK) {
            n_kernel++;
            return {or_nothing(g[0], d_o), or_nothing(g[1], d_o), or_nothing(g[2], d_o), or_nothing(g[3], d_o)};
        }
    }
    return call_python<T4>(K_ATTENTION_BACKWARD, do_in, dsc_in, q_in, k_in, v_in, o_in, lse_in, len_in, sin_in, seed,
                           offset, causal, scale, dropout_p, need_q, need_k, need_v, need_s);
}

/* The ops' autograd kernel for CPU and CUDA tensors (AutogradCPU, AutogradCUDA), boxed: with grad
 * mode off or no tensor argument requiring grad — every call a compiled graph's forward and
 * backward make — it redispatches below autograd here, as custom_op's Python autograd kernel
 * would; else it runs that Python kernel (made by torch._library.autograd.make_autograd_impl and
 * handed over by torch_ops), which records the graph. */
PyObject *python_autograd[K_COUNT];

void autograd_boxed(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack)
{
    const size_t n = op.schema().arguments().size();
    bool grad = false;
    if (c10::GradMode::is_enabled())
        for (const c10::IValue &a : torch::jit::last(*stack, n))
            if (a.isTensor() && a.toTensor().defined() && a.toTensor().requires_grad()) {
                grad = true;
                break;
            }
    if (!grad) {
        n_autograd_cpp++;
        at::AutoDispatchBelowAutograd below;
        op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
        return;
    }
    int k = 0;
    while (k < K_COUNT && op.schema().name() != std::string("fastgrad::") + kernel_names[k])
        k++;
    TORCH_CHECK(k < K_COUNT, "fastgrad: no autograd kernel for ", op.schema().name());
    py::gil_scoped_acquire gil;
    n_autograd_python++;
    py::tuple args(n + 1);
    args[0] = py::cast(ks);
    auto in = torch::jit::last(*stack, n);
    for (size_t i = 0; i < n; i++)
        args[i + 1] = torch::jit::toPyObject(in[i]);
    torch::jit::drop(*stack, n);
    py::object r = py::reinterpret_borrow<py::object>(python_autograd[k])(*args);
    const auto &rets = op.schema().returns();
    if (rets.size() == 1) {
        stack->push_back(torch::jit::toIValue(r, rets[0].type()));
        return;
    }
    py::tuple t = r.cast<py::tuple>();
    for (size_t i = 0; i < rets.size(); i++)
        stack->push_back(torch::jit::toIValue(t[i], rets[i].type()));
}

/* register_kernels({name: the op's Python function}, {name: its Python autograd kernel} or
 * None): the kernels above become the CPU and AutogradCPU (and, with the CUDA part built, CUDA
 * and AutogradCUDA) kernels of torch.ops.fastgrad.<name>. Once per process. */
void py_register_kernels(py::dict impls, py::object autograd_impls)
{
    static bool done = false;
    if (done)
        return;
    for (int k = 0; k < K_COUNT; k++) {
        py::object f = impls[kernel_names[k]];
        TORCH_CHECK_VALUE(PyCallable_Check(f.ptr()), "register_kernels: no Python function for ", kernel_names[k]);
        python_impl[k] = f.release().ptr();
    }
    auto add = [](torch::Library &lib) {
        lib.impl("linear", TORCH_FN(k_linear));
        lib.impl("linear_backward", TORCH_FN(k_linear_backward));
        lib.impl("linear_act", TORCH_FN(k_linear_act));
        lib.impl("linear_act_backward", TORCH_FN(k_linear_act_backward));
        lib.impl("norm", TORCH_FN(k_norm));
        lib.impl("norm_backward", TORCH_FN(k_norm_backward));
        lib.impl("attention", TORCH_FN(k_attention));
        lib.impl("attention_backward", TORCH_FN(k_attention_backward));
    };
    /* (libraries kept for the process: dropping one would unregister its kernels) */
    add(*new torch::Library(torch::Library::IMPL, "fastgrad", c10::DispatchKey::CPU, __FILE__, __LINE__));
#ifdef FG_TORCHEXT_CUDA
    add(*new torch::Library(torch::Library::IMPL, "fastgrad", c10::DispatchKey::CUDA, __FILE__, __LINE__));
#endif
    if (!autograd_impls.is_none()) {
        py::dict ag = autograd_impls.cast<py::dict>();
        for (int k = 0; k < K_COUNT; k++) {
            py::object f = ag[kernel_names[k]];
            TORCH_CHECK_VALUE(PyCallable_Check(f.ptr()), "register_kernels: no autograd kernel for ",
                              kernel_names[k]);
            python_autograd[k] = f.release().ptr();
        }
        auto add_autograd = [](torch::Library &lib) {
            for (int k = 0; k < K_COUNT; k++)
                lib.impl(kernel_names[k], torch::CppFunction::makeFromBoxedFunction<&autograd_boxed>());
        };
        add_autograd(
            *new torch::Library(torch::Library::IMPL, "fastgrad", c10::DispatchKey::AutogradCPU, __FILE__, __LINE__));
#ifdef FG_TORCHEXT_CUDA
        add_autograd(
            *new torch::Library(torch::Library::IMPL, "fastgrad", c10::DispatchKey::AutogradCUDA, __FILE__, __LINE__));
#endif
    }
    done = true;
}

void py_configure(std::unordered_map<std::string, uintptr_t> fns, std::vector<int64_t> sizes, int64_t version)
{
    const std::vector<int64_t> want = {(int64_t)sizeof(fg_tensor), FG_MAX_RANK, FG_MAX_OPERANDS,
                                       (int64_t)sizeof(fg_plan_desc)};
    TORCH_CHECK_VALUE(sizes == want, "fastgrad._torchext_ops was compiled for another fg_tensor / fg_plan_desc "
                      "layout than the loaded library's: rebuild");
    TORCH_CHECK_VALUE(version == FG_VERSION, "fastgrad._torchext_ops was built for version ", FG_VERSION,
                      ", the library is ", version, ": rebuild");
    auto get = [&](const char *name) {
        auto it = fns.find(name);
        TORCH_CHECK_VALUE(it != fns.end() && it->second, "configure: no address for ", name);
        return (void *)it->second;
    };
    Api a;
    a.context_create = (decltype(a.context_create))get("fg_context_create");
    a.context_destroy = (decltype(a.context_destroy))get("fg_context_destroy");
    a.context_set_stream = (decltype(a.context_set_stream))get("fg_context_set_stream");
    a.plan_create = (decltype(a.plan_create))get("fg_plan_create");
    a.plan_destroy = (decltype(a.plan_destroy))get("fg_plan_destroy");
    a.plan_workspace_size = (decltype(a.plan_workspace_size))get("fg_plan_workspace_size");
    a.plan_run = (decltype(a.plan_run))get("fg_plan_run");
    a.last_error = (decltype(a.last_error))get("fg_last_error");
    a.status_string = (decltype(a.status_string))get("fg_status_string");
    a.encoder_layer_sizes = (decltype(a.encoder_layer_sizes))get("fg_encoder_layer_sizes");
    a.encoder_layer_forward_ws = (decltype(a.encoder_layer_forward_ws))get("fg_encoder_layer_forward_ws");
    a.encoder_layer_backward = (decltype(a.encoder_layer_backward))get("fg_encoder_layer_backward");
    if (ready.load()) {
        TORCH_CHECK_VALUE(std::memcmp(&a, &api, sizeof a) == 0,
                          "fastgrad._torchext_ops is configured with another library already");
        return;
    }
    api = a;
    ready.store(true);
}

} // namespace

TORCH_LIBRARY(fastgrad_ext, m)
{
    m.def("linear(Tensor x, Tensor weight, Tensor? bias, int flags=0) -> Tensor");
    m.def("linear_backward(Tensor dy, Tensor x, Tensor weight, bool need_x, bool need_w, bool need_b, "
          "int flags=0) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fastgrad_ext, CompositeImplicitAutograd, m) { m.impl("linear", &linear_autograd); }

TORCH_LIBRARY_IMPL(fastgrad_ext, CPU, m) { m.impl("linear_backward", &linear_backward_op); }

#ifdef FG_TORCHEXT_CUDA
TORCH_LIBRARY_IMPL(fastgrad_ext, CUDA, m) { m.impl("linear_backward", &linear_backward_op); }
#endif

/* The Python types of LinearFn's, NormFn's and LinearActFn's backward nodes (grad_fns): named as
 * the Python Functions' backwards, in this module, instead of the generic "CppFunction". */
static PyTypeObject linear_backward_type;
static PyTypeObject norm_backward_type;
static PyTypeObject linear_act_backward_type;
static PyTypeObject encoder_backward_type;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    torch::autograd::_initFunctionPyTypeObject(linear_backward_type, "fastgrad._torchext_ops.LinearFunctionBackward",
                                               nullptr, nullptr);
    torch::autograd::registerCppFunction(typeid(torch::autograd::CppNode<LinearFn>), &linear_backward_type);
    torch::autograd::_initFunctionPyTypeObject(norm_backward_type, "fastgrad._torchext_ops.NormFunctionBackward",
                                               nullptr, nullptr);
    torch::autograd::registerCppFunction(typeid(torch::autograd::CppNode<NormFn>), &norm_backward_type);
    torch::autograd::_initFunctionPyTypeObject(linear_act_backward_type,
                                               "fastgrad._torchext_ops.LinearActFunctionBackward", nullptr, nullptr);
    torch::autograd::registerCppFunction(typeid(torch::autograd::CppNode<LinearActFn>), &linear_act_backward_type);
    torch::autograd::_initFunctionPyTypeObject(encoder_backward_type,
                                               "fastgrad._torchext_ops.EncoderLayerFunctionBackward", nullptr,
                                               nullptr);
    torch::autograd::registerCppFunction(typeid(torch::autograd::CppNode<EncoderFn>), &encoder_backward_type);
    m.doc() = "fastgrad's Linear, linear + activation and normalization family with their host work in C++ "
              "(see _torchext.py)";
    m.def("linear", &py_linear, "linear(x, weight, bias, flags): y, or None when Python must run the call",
          py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("flags") = 0);
    m.def("linear_act", &py_linear_act,
          "linear_act(x, weight, bias, act, save_pre, flags): y of autograd.LinearActFunction with its autograd "
          "in C++, or None when Python must run the call",
          py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("act"), py::arg("save_pre"),
          py::arg("flags") = 0);
    m.def("norm", &py_norm,
          "norm(x, r, w, b, kind, eps, p, seed, offset): (y, s) of norm.NormFunction with its autograd in C++, "
          "or None");
    m.def("norm_forward", &py_norm_forward,
          "norm_forward(x, r, w, b, kind, eps, p, seed, offset, keep_sum, save_stats): norm.norm_forward's "
          "(y, s, mean, rstd), or None");
    m.def("norm_backward", &py_norm_backward,
          "norm_backward(dy, ds, x, w, mean, rstd, kind, eps, p, seed, offset, need_x, need_r, need_w, need_b, "
          "has_bias, param_dtype, accumulate): norm.norm_backward's (dx, dr, dw, db), or None");
    m.def("batch_norm_forward", &py_batch_norm_forward,
          "batch_norm_forward(x, r, w, b, running_mean, running_var, training, momentum, eps, p, seed, offset, "
          "keep_sum): norm.batch_norm_forward's (y, s, mean, rstd), or None");
    m.def("batch_norm_backward", &py_batch_norm_backward,
          "batch_norm_backward(dy, x, w, mean, rstd, training, p, seed, offset, need_x, need_r, need_w, need_b, "
          "has_bias, param_dtype, accumulate): norm.batch_norm_backward's (dx, dr, dw, db), or None");
    m.def("encoder_layer", &py_encoder_layer,
          "encoder_layer(x, scores_in, weights, slots, buffers, buffer_slots, lengths, desc, seed, offset, train, "
          "want_scores, no_backward): encoder.EncoderLayerFunction's y (or (y, scores_out)) with its autograd in "
          "C++, or None when Python must run the call");
    m.def("configure", &py_configure, "Hands the module the library's entry points (called once by _torchext.py)");
    m.def("register_kernels", &py_register_kernels,
          "register_kernels({name: function}, {name: autograd kernel} or None): this module's C++ kernels for "
          "torch.ops.fastgrad's linear, linear_backward, linear_act, linear_act_backward, norm, norm_backward, "
          "attention and attention_backward "
          "on CPU (and CUDA) tensors, each handing what it does not take to the given Python function, and their "
          "autograd kernels (called once by torch_ops.py)");
    m.def(
        "set_tf32", [](int64_t flags) { kernel_flags.store((uint32_t)flags); },
        "The plan flags (FG_PLAN_ALLOW_TF32 or 0) the custom ops' kernels plan with (ops.set_allow_tf32)");
    m.def(
        "tf32", []() { return (int64_t)kernel_flags.load(); }, "The plan flags set_tf32 last set");
    m.def(
        "stats",
        []() {
            return py::dict(py::arg("forward") = n_forward.load(), py::arg("backward") = n_backward.load(),
                            py::arg("fallback") = n_fallback.load(), py::arg("dx") = n_dx.load(),
                            py::arg("dw") = n_dw.load(), py::arg("db") = n_db.load(),
                            py::arg("norm_forward") = n_norm_forward.load(),
                            py::arg("norm_backward") = n_norm_backward.load(),
                            py::arg("norm_autograd") = n_norm_autograd.load(),
                            py::arg("norm_fallback") = n_norm_fallback.load(),
                            py::arg("batch_norm_forward") = n_batch_norm_forward.load(),
                            py::arg("batch_norm_backward") = n_batch_norm_backward.load(),
                            py::arg("linear_act_forward") = n_act_forward.load(),
                            py::arg("linear_act_backward") = n_act_backward.load(),
                            py::arg("linear_act_fallback") = n_act_fallback.load(),
                            py::arg("kernel") = n_kernel.load(), py::arg("kernel_python") = n_kernel_python.load(),
                            py::arg("autograd_cpp") = n_autograd_cpp.load(),
                            py::arg("autograd_python") = n_autograd_python.load(),
                            py::arg("encoder_forward") = n_enc_forward.load(),
                            py::arg("encoder_backward") = n_enc_backward.load(),
                            py::arg("encoder_fallback") = n_enc_fallback.load());
        },
        "Since import: Linear's forwards and backwards run here, its calls handed back to Python, its gradients "
        "computed; the row norms' forwards and backwards run here (functional or through norm()), norm() calls, "
        "norm and BatchNorm calls handed back to Python, BatchNorm forwards and backwards; linear + activation's "
        "forwards and backwards run here and its calls handed back to Python; the custom ops' kernels' calls run "
        "here and handed to the ops' Python functions, their autograd kernel's calls redispatched here and handed to "
        "custom_op's Python autograd kernel");
    m.attr("VERSION") = FG_VERSION;
#ifdef FG_TORCHEXT_CUDA
    m.attr("HAS_CUDA") = true;
#else
    m.attr("HAS_CUDA") = false;
#endif
}

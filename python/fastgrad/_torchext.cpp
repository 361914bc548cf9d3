/* _torchext.cpp — fastgrad's Linear as a torch C++ extension (module fastgrad._torchext_ops).
 *
 * fg.Linear through a Python torch.autograd.Function pays for the Function's Python on every
 * call: apply, save_for_backward, the backward's Python, the outputs' allocation in Python.
 * Here the forward and the backward are C++: a torch::autograd::Function whose forward runs
 * fastgrad's linear_forward and whose backward (called by autograd's engine, in C++) runs
 * linear_backward_input / _weight / _bias for the gradients autograd asks for. A forward +
 * backward never enters Python beyond the one call into linear().
 *
 * The per-call work is _fastcall.c's, in C++: each tensor's descriptor (pointer, dtype, shape,
 * strides), a plan key of the op, accumulate, flags, the descriptors and the pointers'
 * alignment class (at most 256 bytes, as ops._alignment computes it), a per-thread plan cache
 * per context, the plan's workspace from torch's allocator, and, on CUDA, the context set to
 * torch's current stream. The plans are the ones the Python path makes for the same operands,
 * so the results are bit-identical to it. A refusal the Python path retries on contiguous
 * copies (FG_ERR_UNSUPPORTED, FG_ERR_MISALIGNED: torch_ops._call) is retried the same way.
 *
 * linear() returns None for anything it does not take (a dtype or device it does not handle,
 * mismatched shapes, a forward the library refuses): the caller then runs the Python Function,
 * which raises its usual errors. A backward the library refuses raises RuntimeError.
 *
 * The library is not linked: _torchext.py hands over the entry points of the libfastgrad that
 * ctypes loaded (one library, one error slot, wherever FASTGRAD_LIBRARY points). Contexts are
 * the extension's own, one per (thread, device), created on first use. CUDA code (the current
 * stream) is compiled only when torch has CUDA and its headers are found (FG_TORCHEXT_CUDA);
 * without it CUDA tensors go to the Python path.
 *
 * The same work is registered with the dispatcher as fastgrad_ext::linear (autograd in C++)
 * and fastgrad_ext::linear_backward, for callers of torch.ops. torch.compile traces the
 * Python custom ops of torch_ops.py instead (they have fake implementations).
 */
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <ATen/ops/empty.h>
#ifdef FG_TORCHEXT_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <cstring>
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
};

Api api;
std::atomic<bool> ready{false};
std::atomic<unsigned long long> n_forward{0}, n_backward{0}, n_fallback{0}, n_dx{0}, n_dw{0}, n_db{0};

/* The library refused a forward: linear() returns None and Python runs the call. */
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

/* The calling thread's contexts: the CPU one and one per CUDA device. A thread's CPU context
 * and plans are freed when it ends; CUDA ones are left to the process's end (the CUDA runtime
 * may be gone by the time the main thread's destructors run). */
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
    }
};

thread_local Contexts contexts;

[[noreturn]] void fail(const char *what, fg_status st, const char *msg)
{
    TORCH_CHECK(false, "fastgrad: ", what, ": ", api.status_string(st), ": ", msg ? msg : "");
}

Ctx &context_for(const at::Tensor &ref)
{
    fg_context_desc d{};
    Ctx *c;
    if (ref.is_cuda()) {
        int dev = ref.get_device();
        if ((int)contexts.cuda.size() <= dev)
            contexts.cuda.resize(dev + 1);
        c = &contexts.cuda[dev];
        d.backend = FG_BACKEND_CUDA;
        d.device = dev;
    } else {
        c = &contexts.cpu;
        d.backend = FG_BACKEND_CPU;
    }
    if (!c->handle) {
        fg_status st = api.context_create(&d, &c->handle);
        if (st != FG_OK)
            fail("context_create", st, api.last_error());
    }
#ifdef FG_TORCHEXT_CUDA
    if (ref.is_cuda()) {
        void *s = c10::cuda::getCurrentCUDAStream(ref.get_device()).stream();
        if (s != c->stream) {
            fg_status st = api.context_set_stream(c->handle, s);
            if (st != FG_OK)
                fail("context_set_stream", st, api.last_error());
            c->stream = s;
        }
    }
#endif
    return *c;
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
    t->data = const_cast<void *>(a.const_data_ptr());
    t->dtype = (fg_dtype)dtype_code(a.scalar_type());
    t->rank = (int32_t)r;
}

/* Runs op on n operands (the library's order; undefined = absent) on the thread's context for
 * ref's device. Returns the library's status; fg_last_error() has the message. */
fg_status run(fg_op op, const at::Tensor *const *operands, int n, uint32_t flags, const at::Tensor &ref)
{
    fg_tensor t[FG_MAX_OPERANDS];
    uintptr_t bits = 256;
    char key[16 + FG_MAX_OPERANDS * (8 + 16 * FG_MAX_RANK)];
    size_t kn = 16;
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
    uint32_t hdr[4] = {(uint32_t)op, 0u, flags, (uint32_t)(bits & (~bits + 1))};
    std::memcpy(key, hdr, sizeof hdr);
    Ctx &c = context_for(ref);
    std::string k(key, kn);
    auto it = c.plans.find(k);
    if (it == c.plans.end()) {
        fg_plan_desc desc{};
        desc.op = op;
        for (int i = 0; i < n; i++)
            desc.operands[i] = t[i];
        desc.flags = flags;
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
        fg_status st = run(op, p, n, flags, ref);
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

/* The gradients asked for (undefined where not): dx = dy·w, dw = dyᵀ·x, db = Σ dy. */
variable_list backward_grads(const at::Tensor &dy_in, const at::Tensor &x, const at::Tensor &w, bool need_x,
                             bool need_w, bool need_b, uint32_t flags)
{
    at::Tensor dy = dense(dy_in), dx, dw, db;
    n_dx += need_x;
    n_dw += need_w;
    n_db += need_b;
    if (need_x)
        dx = compute(FG_OP_LINEAR_BACKWARD_INPUT, "linear_backward_input", {dy, w},
                     with_last(dy.sizes(), w.size(1)), flags, false);
    if (need_w)
        dw = compute(FG_OP_LINEAR_BACKWARD_WEIGHT, "linear_backward_weight", {dy, x},
                     {dy.size(-1), x.size(-1)}, flags, false);
    if (need_b)
        db = compute(FG_OP_LINEAR_BACKWARD_BIAS, "linear_backward_bias", {dy}, {dy.size(-1)}, flags, false);
    n_backward++;
    return {dx, dw, db};
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
        unpack(bo.ptr(), b, true) && takes(x, w, b)) {
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

/* The Python type of LinearFn's backward node (a grad_fn): named as the Python Function's
 * backward, in this module, instead of the generic "CppFunction". */
static PyTypeObject linear_backward_type;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    torch::autograd::_initFunctionPyTypeObject(linear_backward_type, "fastgrad._torchext_ops.LinearFunctionBackward",
                                               nullptr, nullptr);
    torch::autograd::registerCppFunction(typeid(torch::autograd::CppNode<LinearFn>), &linear_backward_type);
    m.doc() = "fastgrad's Linear with its autograd in C++ (see _torchext.py)";
    m.def("linear", &py_linear, "linear(x, weight, bias, flags): y, or None when Python must run the call",
          py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("flags") = 0);
    m.def("configure", &py_configure, "Hands the module the library's entry points (called once by _torchext.py)");
    m.def(
        "stats",
        []() {
            return py::dict(py::arg("forward") = n_forward.load(), py::arg("backward") = n_backward.load(),
                            py::arg("fallback") = n_fallback.load(), py::arg("dx") = n_dx.load(),
                            py::arg("dw") = n_dw.load(), py::arg("db") = n_db.load());
        },
        "Since import: forwards and backwards run here, calls handed back to Python, gradients computed");
    m.attr("VERSION") = FG_VERSION;
#ifdef FG_TORCHEXT_CUDA
    m.attr("HAS_CUDA") = true;
#else
    m.attr("HAS_CUDA") = false;
#endif
}

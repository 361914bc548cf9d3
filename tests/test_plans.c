/*
 * test_plans.c — the op table and the plan contract across every op: fg_op_describe
 * gives each op of the table a name, a family, named operands with roles; the ABI
 * reflection matches this compilation of the header; and for every op (the test fails
 * when an op of the table has no case here) a plan names exactly the kernels its run
 * launches — fg_plan_info.kernel against the backend's own launch record
 * (fg_context_last_kernels) — on every backend present, including the CUDA paths of
 * linear + activation that are chosen when the plan is made. Also: a plan refuses data
 * aligned below what its descriptor declared, and writes nothing. On CUDA, no op synchronizes
 * the host or allocates synchronously: every case's run is repeated inside a CUDA stream capture
 * (the graph launched, its results compared with the uncaptured run), and so is an AdamW step.
 */
#include "harness.h"

#include <math.h>
#include <stddef.h>

#ifdef FG_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
/* the stream the CUDA context runs on (capture needs one other than the legacy stream; a
   blocking one, so the harness's synchronous copies still wait for it) */
static cudaStream_t graph_stream;
#endif

/* ------------------------------------------------------------------ the table */

static void describe_all(void) {
    const int32_t n = fg_op_count();
    TH_CHECK(n >= 19, "fg_op_count()=%d", n);
    fg_op_info info;
    TH_CHECK(fg_op_describe(FG_OP_NONE, &info) == FG_ERR_INVALID_VALUE, "op 0 is not an op");
    TH_CHECK(fg_op_describe((fg_op)(n + 1), &info) == FG_ERR_INVALID_VALUE, "op count+1 is not an op");
    TH_CHECK(fg_op_describe((fg_op)1, NULL) == FG_ERR_NULL_POINTER, "NULL info");
    for (int32_t op = 1; op <= n; op++) {
        TH_OK(fg_op_describe((fg_op)op, &info));
        TH_CHECK(info.op == op && info.name && info.name[0] && info.family && info.family[0], "op %d named", op);
        TH_CHECK(info.n_operands >= 2 && info.n_operands <= FG_MAX_OPERANDS, "%s: %d operands", info.name,
                 info.n_operands);
        int outputs = 0;
        for (int i = 0; i < info.n_operands; i++) {
            TH_CHECK(info.operands[i].name && info.operands[i].name[0], "%s: operand %d named", info.name, i);
            for (int j = 0; j < i; j++)
                TH_CHECK(strcmp(info.operands[i].name, info.operands[j].name) != 0, "%s: operand names unique",
                         info.name);
            outputs += info.operands[i].role == FG_ROLE_OUTPUT;
        }
        TH_CHECK(outputs >= 1, "%s has an output", info.name);
        TH_CHECK((info.options_type == NULL) == (info.options_size == 0), "%s: options type and size", info.name);
        TH_CHECK(info.flags & FG_PLAN_ALLOW_TF32, "%s accepts FG_PLAN_ALLOW_TF32", info.name);
        for (int32_t other = 1; other < op; other++) {
            fg_op_info o;
            TH_OK(fg_op_describe((fg_op)other, &o));
            TH_CHECK(strcmp(o.name, info.name) != 0, "op names unique: %s", info.name);
        }
    }
    TH_CHECK(fg_op_describe(FG_OP_LINEAR_ACT_BACKWARD, &info) == FG_OK &&
                 strcmp(info.operands[5].name, "dx") == 0 && info.operands[5].role == FG_ROLE_OUTPUT &&
                 info.operands[5].optional && strcmp(info.options_type, "fg_linear_act_options") == 0,
             "linear_act_backward's operand 5 is the optional output dx, options fg_linear_act_options");
    TH_CHECK(strcmp(fg_last_error(), "") == 0, "a success leaves no message");
}

static void abi(void) {
    size_t v = 0;
    int64_t c = 0;
    TH_CHECK(fg_abi_layout("fg_plan_desc", NULL, &v) == FG_OK && v == sizeof(fg_plan_desc), "sizeof fg_plan_desc");
    TH_CHECK(fg_abi_layout("fg_plan_desc", "options", &v) == FG_OK && v == offsetof(fg_plan_desc, options),
             "offsetof fg_plan_desc.options");
    TH_CHECK(fg_abi_layout("fg_plan_desc", "alignment", &v) == FG_OK && v == offsetof(fg_plan_desc, alignment),
             "offsetof fg_plan_desc.alignment");
    TH_CHECK(fg_abi_layout("fg_op_info", "operands", &v) == FG_OK && v == offsetof(fg_op_info, operands),
             "offsetof fg_op_info.operands");
    TH_CHECK(fg_abi_layout("fg_logp_options", NULL, &v) == FG_OK && v == sizeof(fg_logp_options), "sizeof logp opts");
    TH_CHECK(fg_abi_layout("fg_plan_desc", "nope", &v) == FG_ERR_INVALID_VALUE && strstr(fg_last_error(), "nope"),
             "unknown field");
    TH_CHECK(fg_abi_layout("fg_nope", NULL, &v) == FG_ERR_INVALID_VALUE, "unknown struct");
    TH_CHECK(fg_abi_constant("FG_ACT_GELU_TANH", &c) == FG_OK && c == FG_ACT_GELU_TANH, "FG_ACT_GELU_TANH");
    TH_CHECK(fg_abi_constant("FG_BF16", &c) == FG_OK && c == FG_BF16, "FG_BF16");
    TH_CHECK(fg_abi_constant("FG_VERSION", &c) == FG_OK && c == FG_VERSION && (uint32_t)c == fg_version(),
             "FG_VERSION");
    TH_CHECK(fg_abi_constant("FG_NOPE", &c) == FG_ERR_INVALID_VALUE, "unknown constant");
    TH_CHECK(fg_abi_constant(NULL, &c) == FG_ERR_NULL_POINTER, "NULL name");
}

/* ------------------------------------------------------------------ plans vs launches */

typedef struct plan_case {
    fg_op op;
    const char *label;
    fg_tensor ops[FG_MAX_OPERANDS];
    th_operand own[FG_MAX_OPERANDS]; /* storage of each present operand */
    const void *options;
    size_t options_size;
    int accumulate;
} plan_case;

static void add(plan_case *c, fg_backend be, int i, fg_dtype dt, int rank, const int64_t *shape) {
    c->own[i] = th_make(be, dt, rank, shape, 0);
    if (dt == FG_I64) { /* class targets: 0 (valid for any V) */
        const size_t bytes = (size_t)c->own[i].n * sizeof(int64_t);
        void *zero = calloc(1, bytes + 8);
        th_put_raw(&c->own[i].buf, zero, bytes);
        free(zero);
    } else {
        th_randomize(&c->own[i]);
    }
    c->ops[i] = c->own[i].t;
}

static void drop_case(plan_case *c) {
    for (int i = 0; i < FG_MAX_OPERANDS; i++)
        if (c->ops[i].rank || c->own[i].buf.ptr) th_drop(&c->own[i]);
}

/* Splits "a ; b ; c" and checks every piece of `want` is in `have` (as a piece, or anywhere in
 * it when `loose`). */
static bool pieces_in(const char *want, const char *have, bool loose, char *missing, size_t len) {
    char buf[600];
    snprintf(buf, sizeof buf, "%s", want);
    for (char *p = buf; p && *p;) {
        char *end = strstr(p, " ; ");
        if (end) *end = 0;
        bool found = false;
        if (loose) found = strstr(have, p) != NULL;
        else {
            const char *at = have;
            while (!found && (at = strstr(at, p)) != NULL) {
                const bool starts = at == have || (at >= have + 3 && strncmp(at - 3, " ; ", 3) == 0);
                const char *after = at + strlen(p);
                found = starts && (*after == 0 || strncmp(after, " ; ", 3) == 0);
                at++;
            }
        }
        if (!found) {
            snprintf(missing, len, "%s", p);
            return false;
        }
        p = end ? end + 3 : NULL;
    }
    return true;
}

#ifdef FG_TEST_HAVE_CUDA
/* The no-host-sync check. `call` (a plan run or a one-call function) once more inside a stream
 * capture in global mode, where a host synchronization, a synchronous allocation or a copy to
 * pageable memory invalidates the capture and a launch on another stream is an error; nothing may
 * execute while capturing (every operand is still as `before` when the capture ends); the graph
 * launched must leave every operand as the uncaptured run did (`after`): bit for bit when the
 * plan promises determinism, else within the dtype's tolerance. */
typedef fg_status (*graph_fn)(void *arg);

static void graph_check(const char *label, graph_fn call, void *arg, th_operand *const *opd, int n,
                        void *const *before, bool deterministic) {
    void *after[FG_MAX_OPERANDS] = {0};
    for (int i = 0; i < n; i++) after[i] = th_snapshot(&opd[i]->buf), th_restore(&opd[i]->buf, before[i]);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    fg_status st = FG_OK;
    cudaError_t e = cudaStreamBeginCapture(graph_stream, cudaStreamCaptureModeGlobal);
    TH_CHECK(e == cudaSuccess, "graph %s: cudaStreamBeginCapture: %s", label, cudaGetErrorString(e));
    if (e != cudaSuccess) goto done;
    st = call(arg);
    e = cudaStreamEndCapture(graph_stream, &graph);
    TH_CHECK(st == FG_OK, "graph %s: the run inside the capture returned %s (%s)", label, fg_status_string(st),
             fg_last_error());
    TH_CHECK(e == cudaSuccess && graph, "graph %s: the capture failed: %s (a host sync or a synchronous "
             "allocation inside the op?)", label, cudaGetErrorString(e));
    if (st != FG_OK || e != cudaSuccess || !graph) goto done;
    for (int i = 0; i < n; i++)
        TH_CHECK(th_unchanged(&opd[i]->buf, before[i]), "graph %s: operand %d changed while capturing", label, i);
    e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (e == cudaSuccess) e = cudaGraphLaunch(exec, graph_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(graph_stream);
    TH_CHECK(e == cudaSuccess, "graph %s: instantiate / launch: %s", label, cudaGetErrorString(e));
    if (e != cudaSuccess) goto done;
    for (int i = 0; i < n; i++) {
        if (th_unchanged(&opd[i]->buf, after[i])) continue;
        double err = INFINITY;
        if (!deterministic) { /* values of the whole storage, as uncaptured and as the graph left them */
            th_operand whole = *opd[i];
            whole.t = th_tensor(&whole.buf, 0, 1, &whole.buf.n, NULL);
            double *got = malloc(sizeof(double) * (size_t)(whole.buf.n + 1)), *ref = malloc(sizeof(double) * (size_t)(whole.buf.n + 1));
            th_get(&whole.buf, &whole.t, got);
            th_restore(&whole.buf, after[i]);
            th_get(&whole.buf, &whole.t, ref);
            err = th_relerr(got, ref, whole.buf.n);
            free(got), free(ref);
        }
        TH_CHECK(err <= th_tol(opd[i]->buf.dtype, false), "graph %s: operand %d differs from the uncaptured run%s "
                 "(relerr %.3g)", label, i, deterministic ? " (the plan is deterministic: bit for bit)" : "", err);
    }
done:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    for (int i = 0; i < n; i++) free(after[i]);
}

typedef struct plan_run_arg {
    fg_plan *plan;
    const fg_tensor *ops;
    void *ws;
    size_t ws_bytes;
} plan_run_arg;

static fg_status plan_run_fn(void *p) {
    plan_run_arg *a = p;
    return fg_plan_run(a->plan, a->ops, a->ws, a->ws_bytes);
}
#endif

/* Plans, runs and compares what the plan named with what the backend launched. */
static void run_case(fg_context *ctx, fg_backend be, plan_case *c) {
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.op = c->op;
    d.accumulate = c->accumulate;
    d.options = c->options;
    d.options_size = c->options_size;
    memcpy(d.operands, c->ops, sizeof d.operands);
    for (int i = 0; i < FG_MAX_OPERANDS; i++) d.operands[i].data = NULL;
    fg_plan *plan = NULL;
    fg_plan_info info;
    memset(&info, 0, sizeof info);
    TH_OK(fg_plan_create(ctx, &d, &plan));
    if (!plan) return;
    TH_OK(fg_plan_info_get(plan, &info));
    th_buf ws = th_alloc(be, FG_F32, (int64_t)(info.workspace_bytes / 4 + 64));
    TH_OK(fg_plan_can_implement(plan, c->ops));
#ifdef FG_TEST_HAVE_CUDA
    th_operand *opd[FG_MAX_OPERANDS];
    void *before[FG_MAX_OPERANDS];
    int nopd = 0;
    for (int i = 0; i < FG_MAX_OPERANDS && be == FG_BACKEND_CUDA; i++)
        if (c->own[i].buf.ptr) opd[nopd] = &c->own[i], before[nopd++] = th_snapshot(&c->own[i].buf);
#endif
    TH_OK(fg_plan_run(plan, c->ops, ws.ptr, info.workspace_bytes));
    const char *ran = fg_context_last_kernels(ctx);
    char missing[200] = "";
    TH_CHECK(ran[0] != 0, "%s %s: the run recorded its kernels", th_backend_name(be), c->label);
    /* the log-prob family's row steps are named as one string ("tiles ...: gemm + rows"); a name
       cut at the field's end is compared as text */
    const bool loose = strstr(info.kernel, "tiles ") != NULL || strlen(info.kernel) == sizeof info.kernel - 1;
    TH_CHECK(pieces_in(ran, info.kernel, loose, missing, sizeof missing),
             "%s %s: launched '%s', which the plan did not name ('%s')", th_backend_name(be), c->label, missing,
             info.kernel);
    if (!loose && strlen(info.kernel) < sizeof info.kernel - 1) /* (a cut name can't be compared) */
        TH_CHECK(pieces_in(info.kernel, ran, false, missing, sizeof missing),
                 "%s %s: the plan named '%s', which did not run (ran '%s')", th_backend_name(be), c->label, missing,
                 ran);
#ifdef FG_TEST_HAVE_CUDA
    if (be == FG_BACKEND_CUDA) {
        plan_run_arg a = {plan, c->ops, ws.ptr, info.workspace_bytes};
        graph_check(c->label, plan_run_fn, &a, opd, nopd, before, info.precision.deterministic != 0);
    }
    for (int i = 0; i < nopd; i++) free(before[i]);
#endif
    fg_plan_destroy(plan);
    th_free(&ws);
}

static void linear_cases(fg_context *ctx, fg_backend be, fg_dtype dt, bool *covered) {
    const int64_t N = 37, K = 24, M = 40, B = 3;
    int64_t nk[2] = {N, K}, mk[2] = {M, K}, nm[2] = {N, M}, m1[1] = {M}, n1[1] = {N};
    int64_t bmk[3] = {B, N, K}, bkn[3] = {B, K, M}, bmn[3] = {B, N, M};
    plan_case c;
#define CASE(opid, lbl)                                                                                              \
    memset(&c, 0, sizeof c);                                                                                         \
    c.op = opid, c.label = lbl;                                                                                      \
    covered[opid] = true;
#define DONE()                                                                                                       \
    run_case(ctx, be, &c);                                                                                           \
    drop_case(&c);
    CASE(FG_OP_LINEAR_FORWARD, "linear_forward");
    add(&c, be, 0, dt, 2, nk), add(&c, be, 1, dt, 2, mk), add(&c, be, 2, dt, 1, m1), add(&c, be, 3, dt, 2, nm);
    DONE();
    CASE(FG_OP_LINEAR_FORWARD, "linear_forward one row (GEMV)");
    int64_t one_k[2] = {1, K}, one_m[2] = {1, M};
    add(&c, be, 0, dt, 2, one_k), add(&c, be, 1, dt, 2, mk), add(&c, be, 3, dt, 2, one_m);
    DONE();
    CASE(FG_OP_LINEAR_BACKWARD_INPUT, "linear_backward_input");
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 2, mk), add(&c, be, 2, dt, 2, nk);
    DONE();
    CASE(FG_OP_LINEAR_BACKWARD_WEIGHT, "linear_backward_weight");
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 2, nk), add(&c, be, 2, dt, 2, mk);
    c.accumulate = 1;
    DONE();
    CASE(FG_OP_LINEAR_BACKWARD_BIAS, "linear_backward_bias");
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 1, m1);
    DONE();
    CASE(FG_OP_MATMUL_FORWARD, "matmul_forward");
    add(&c, be, 0, dt, 3, bmk), add(&c, be, 1, dt, 3, bkn), add(&c, be, 2, dt, 3, bmn);
    DONE();
    CASE(FG_OP_MATMUL_BACKWARD_INPUT, "matmul_backward_input (b broadcast)");
    int64_t kn[2] = {K, M};
    add(&c, be, 0, dt, 3, bmn), add(&c, be, 1, dt, 2, kn), add(&c, be, 2, dt, 3, bmk);
    DONE();
    CASE(FG_OP_MATMUL_BACKWARD_OTHER, "matmul_backward_other (summed over the batch)");
    add(&c, be, 0, dt, 3, bmk), add(&c, be, 1, dt, 3, bmn), add(&c, be, 2, dt, 2, kn);
    DONE();
    CASE(FG_OP_OUTER_FORWARD, "outer_forward");
    add(&c, be, 0, dt, 1, n1), add(&c, be, 1, dt, 1, m1), add(&c, be, 2, dt, 2, nm);
    DONE();
    CASE(FG_OP_OUTER_BACKWARD_INPUT, "outer_backward_input");
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 1, m1), add(&c, be, 2, dt, 1, n1);
    DONE();
    CASE(FG_OP_OUTER_BACKWARD_OTHER, "outer_backward_other");
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 1, n1), add(&c, be, 2, dt, 1, m1);
    DONE();

    fg_elementwise_options ew = {FG_UNARY_SOFTCAP, {3.0, 0, 0, 0}};
    CASE(FG_OP_UNARY_FORWARD, "unary_forward softcap");
    c.options = &ew, c.options_size = sizeof ew;
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 2, nm);
    DONE();
    CASE(FG_OP_UNARY_BACKWARD, "unary_backward softcap");
    c.options = &ew, c.options_size = sizeof ew;
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 2, nm), add(&c, be, 2, dt, 2, nm);
    DONE();
    fg_elementwise_options lerp = {FG_BINARY_LERP, {0.3, 0, 0, 0}};
    CASE(FG_OP_BINARY_FORWARD, "binary_forward lerp");
    c.options = &lerp, c.options_size = sizeof lerp;
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 1, m1), add(&c, be, 3, dt, 2, nm);
    DONE();
    CASE(FG_OP_BINARY_BACKWARD, "binary_backward lerp, tensor weight, broadcast b");
    c.options = &lerp, c.options_size = sizeof lerp;
    add(&c, be, 0, dt, 2, nm), add(&c, be, 1, dt, 2, nm), add(&c, be, 2, dt, 1, m1), add(&c, be, 3, dt, 2, nm);
    add(&c, be, 4, dt, 2, nm), add(&c, be, 5, dt, 1, m1), add(&c, be, 6, dt, 2, nm);
    DONE();

    const fg_dtype acc = FG_F32;
    const int64_t V = 300, D = 32, R = 50;
    int64_t hd[2] = {R, D}, vd[2] = {V, D}, r1[1] = {R}, one[1] = {1};
    fg_logp_options lo;
    memset(&lo, 0, sizeof lo);
    CASE(FG_OP_LINEAR_LOGP_FORWARD, "linear_logp_forward");
    c.options = &lo, c.options_size = sizeof lo;
    add(&c, be, 0, dt, 2, hd), add(&c, be, 1, dt, 2, vd), add(&c, be, 3, FG_I64, 1, r1);
    add(&c, be, 4, acc, 1, r1), add(&c, be, 5, acc, 1, r1), add(&c, be, 6, acc, 1, r1);
    DONE();
    CASE(FG_OP_LINEAR_LOGP_BACKWARD, "linear_logp_backward");
    c.options = &lo, c.options_size = sizeof lo;
    add(&c, be, 0, acc, 1, r1), add(&c, be, 3, dt, 2, hd), add(&c, be, 4, dt, 2, vd), add(&c, be, 6, FG_I64, 1, r1);
    add(&c, be, 7, acc, 1, r1), add(&c, be, 9, dt, 2, hd), add(&c, be, 10, dt, 2, vd);
    DONE();
    CASE(FG_OP_LINEAR_CROSS_ENTROPY, "linear_cross_entropy");
    c.options = &lo, c.options_size = sizeof lo;
    add(&c, be, 0, dt, 2, hd), add(&c, be, 1, dt, 2, vd), add(&c, be, 3, FG_I64, 1, r1), add(&c, be, 5, acc, 1, one);
    add(&c, be, 7, dt, 2, hd), add(&c, be, 8, dt, 2, vd);
    DONE();
    fg_logp_options so = lo; /* the second of two slices: rows [100, 300) of a 400-class vocabulary */
    so.vocab_start = 100, so.vocab_total = 400;
    CASE(FG_OP_LINEAR_LOGP_SHARD_FORWARD, "linear_logp_shard_forward");
    c.options = &so, c.options_size = sizeof so;
    add(&c, be, 0, dt, 2, hd), add(&c, be, 1, dt, 2, (int64_t[]){200, D}), add(&c, be, 3, FG_I64, 1, r1);
    add(&c, be, 4, acc, 1, r1), add(&c, be, 5, acc, 1, r1), add(&c, be, 6, acc, 1, r1);
    DONE();
    CASE(FG_OP_LINEAR_LOGP_SHARD_COMBINE, "linear_logp_shard_combine");
    c.options = &lo, c.options_size = sizeof lo;
    int64_t parts[2] = {3, R};
    add(&c, be, 0, FG_I64, 1, r1), add(&c, be, 1, acc, 2, parts), add(&c, be, 2, acc, 1, r1);
    add(&c, be, 3, acc, 2, parts), add(&c, be, 4, acc, 1, r1), add(&c, be, 5, acc, 1, r1), add(&c, be, 6, acc, 1, r1);
    DONE();
}

/* Linear + activation at a shape: the forward (with pre kept, and without) and the backward
 * (from the kept pre, recomputed, the slope form, dx alone). */
static void act_cases(fg_context *ctx, fg_backend be, fg_dtype dt, int act, int64_t N, int64_t K, int64_t M,
                      bool *covered) {
    int64_t nk[2] = {N, K}, mk[2] = {M, K}, nm[2] = {N, M}, m1[1] = {M};
    char label[96];
    plan_case c;
    for (int variant = 0; variant < 6; variant++) {
        const bool fwd = variant < 2;
        fg_linear_act_options o = {(fg_activation)act, variant == 4 ? FG_ACT_SAVED_SLOPE : FG_ACT_SAVED_PRE, 0};
        static const char *const what[] = {"forward, pre kept", "forward", "backward from pre",
                                           "backward, pre recomputed", "backward, slope form", "backward dx alone"};
        snprintf(label, sizeof label, "linear_act %s act %d %s %lldx%lldx%lld", what[variant], act,
                 fg_dtype_name(dt), (long long)N, (long long)K, (long long)M);
        memset(&c, 0, sizeof c);
        c.op = fwd ? FG_OP_LINEAR_ACT_FORWARD : FG_OP_LINEAR_ACT_BACKWARD;
        c.label = label;
        covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o;
        if (fwd) {
            add(&c, be, 0, dt, 2, nk), add(&c, be, 1, dt, 2, mk), add(&c, be, 2, dt, 1, m1), add(&c, be, 3, dt, 2, nm);
            if (variant == 0) add(&c, be, 4, dt, 2, nm);
        } else {
            add(&c, be, 0, dt, 2, nm), add(&c, be, 2, dt, 2, nk), add(&c, be, 3, dt, 2, mk), add(&c, be, 4, dt, 1, m1);
            if (variant != 3) add(&c, be, 1, dt, 2, nm);
            add(&c, be, 5, dt, 2, nk);
            if (variant != 5) add(&c, be, 6, dt, 2, mk), add(&c, be, 7, dt, 1, m1);
        }
        run_case(ctx, be, &c);
        drop_case(&c);
    }
}

#ifdef FG_TEST_HAVE_CUDA
/* AdamW is a one-call function outside the op table: its step (bf16 params with f32 master
 * weights, two tensors, one past a 65536-element chunk) under the same capture check. */
typedef struct adamw_arg {
    fg_context *ctx;
    const fg_adamw_hparams *hp;
    const fg_tensor *p, *g, *m, *v, *w;
} adamw_arg;

static fg_status adamw_fn(void *p) {
    adamw_arg *a = p;
    return fg_adamw_step(a->ctx, a->hp, 2, a->p, a->g, a->m, a->v, a->w);
}

static void adamw_graph(fg_context *ctx) {
    const int64_t n[2] = {65536 + 37, 1000};
    th_operand o[5][2];
    fg_tensor t[5][2];
    const fg_dtype dts[5] = {FG_BF16, FG_BF16, FG_F32, FG_F32, FG_F32}; /* p, g, m, v, master */
    th_operand *opd[FG_MAX_OPERANDS];
    void *before[FG_MAX_OPERANDS];
    int nopd = 0;
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < 2; i++) {
            o[k][i] = th_make(FG_BACKEND_CUDA, dts[k], 1, &n[i], 0);
            th_randomize(&o[k][i]);
            if (k == 3) { /* v >= 0 */
                for (int64_t e = 0; e < o[k][i].n; e++) o[k][i].v[e] = fabs(o[k][i].v[e]);
                th_put(&o[k][i].buf, &o[k][i].t, o[k][i].v);
            }
            t[k][i] = o[k][i].t;
            if (k != 1) opd[nopd] = &o[k][i], before[nopd++] = th_snapshot(&o[k][i].buf);
        }
    fg_adamw_hparams hp = {1e-2, 0.9, 0.999, 1e-8, 0.01, 3, 0};
    adamw_arg a = {ctx, &hp, t[0], t[1], t[2], t[3], t[4]};
    TH_OK(adamw_fn(&a));
    graph_check("adamw_step", adamw_fn, &a, opd, nopd, before, true);
    for (int i = 0; i < nopd; i++) free(before[i]);
    for (int k = 0; k < 5; k++) th_drop(&o[k][0]), th_drop(&o[k][1]);
}
#endif

/* Values of operand i replaced (a positive variance, a row count in BatchNorm's sums). */
static void set_values(plan_case *c, int i, double (*f)(int64_t k, int64_t n)) {
    for (int64_t k = 0; k < c->own[i].n; k++) c->own[i].v[k] = f(k, c->own[i].n);
    th_put(&c->own[i].buf, &c->own[i].t, c->own[i].v);
}
static double positive(int64_t k, int64_t n) { (void)n; return 0.5 + 0.25 * (double)(k % 5); }
static double bn_sums(int64_t k, int64_t n) { /* {Σ s, Σ s², N = 10} of a mean 0.1·j, variance ~1 */
    const int64_t C = (n - 1) / 2;
    return k == n - 1 ? 10.0 : k < C ? (double)k : 10.0 * (1.0 + 0.01 * (double)((k - C) * (k - C)));
}

/* The normalization family: every op, the row norms at a short and (CUDA) a long row, with the
 * residual and without, statistics saved and recomputed; BatchNorm in training and eval, split;
 * dropout; RevIN. */
static void norm_cases(fg_context *ctx, fg_backend be, fg_dtype dt, int64_t rows, int64_t D, bool *covered) {
    const fg_dtype acc = dt == FG_F64 ? FG_F64 : FG_F32;
    const int64_t xs[2] = {rows, D}, d1[1] = {D}, r1[1] = {rows}, sn[1] = {2 * D + 1};
    const int64_t rv[3] = {3, 10, D}, st[2] = {3, D};
    char label[96];
    plan_case c;
    fg_norm_options no;
    memset(&no, 0, sizeof no);
    for (int v = 0; v < 4; v++) {
        fg_norm_options o = no;
        o.kind = v % 2 ? FG_NORM_RMS : FG_NORM_LAYER;
        const bool resid = v >= 2;
        if (resid) o.dropout.p = 0.1, o.dropout.seed = 3;
        snprintf(label, sizeof label, "norm_forward %s%s %lldx%lld", v % 2 ? "rms" : "layer", resid ? " +r" : "",
                 (long long)rows, (long long)D);
        memset(&c, 0, sizeof c);
        c.op = FG_OP_NORM_FORWARD, c.label = label, covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o;
        add(&c, be, 0, dt, 2, xs), add(&c, be, 2, dt, 1, d1), add(&c, be, 3, dt, 1, d1), add(&c, be, 4, dt, 2, xs);
        if (resid) add(&c, be, 1, dt, 2, xs), add(&c, be, 5, dt, 2, xs);
        if (!(v % 2)) add(&c, be, 6, acc, 1, r1);
        add(&c, be, 7, acc, 1, r1);
        run_case(ctx, be, &c);
        drop_case(&c);
        snprintf(label, sizeof label, "norm_backward %s%s %lldx%lld", v % 2 ? "rms" : "layer",
                 resid ? " +ds +dr, stats recomputed" : "", (long long)rows, (long long)D);
        memset(&c, 0, sizeof c);
        c.op = FG_OP_NORM_BACKWARD, c.label = label, covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o, c.accumulate = v == 1;
        add(&c, be, 0, dt, 2, xs), add(&c, be, 2, dt, 2, xs), add(&c, be, 3, dt, 1, d1), add(&c, be, 6, dt, 2, xs);
        add(&c, be, 8, acc, 1, d1), add(&c, be, 9, dt, 1, d1);
        if (resid) add(&c, be, 1, dt, 2, xs), add(&c, be, 7, dt, 2, xs);
        else {
            if (!(v % 2)) add(&c, be, 4, acc, 1, r1);
            add(&c, be, 5, acc, 1, r1), set_values(&c, 5, positive);
        }
        run_case(ctx, be, &c);
        drop_case(&c);
    }
    fg_batch_norm_options bo;
    memset(&bo, 0, sizeof bo);
    for (int v = 0; v < 2; v++) {
        fg_batch_norm_options o = bo;
        o.eval = v;
        if (!v) o.dropout.p = 0.2;
        snprintf(label, sizeof label, "batch_norm_forward %s %lldx%lld", v ? "eval" : "training +r", (long long)rows,
                 (long long)D);
        memset(&c, 0, sizeof c);
        c.op = FG_OP_BATCH_NORM_FORWARD, c.label = label, covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o;
        add(&c, be, 0, dt, 2, xs), add(&c, be, 2, acc, 1, d1), add(&c, be, 3, acc, 1, d1);
        add(&c, be, 4, acc, 1, d1), add(&c, be, 5, acc, 1, d1), set_values(&c, 5, positive);
        add(&c, be, 6, dt, 2, xs), add(&c, be, 8, acc, 1, d1), add(&c, be, 9, acc, 1, d1);
        if (!v) add(&c, be, 1, dt, 2, xs), add(&c, be, 7, dt, 2, xs);
        run_case(ctx, be, &c);
        drop_case(&c);
        snprintf(label, sizeof label, "batch_norm_backward %s %lldx%lld", v ? "eval" : "training", (long long)rows,
                 (long long)D);
        memset(&c, 0, sizeof c);
        c.op = FG_OP_BATCH_NORM_BACKWARD, c.label = label, covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o, c.accumulate = v;
        add(&c, be, 0, dt, 2, xs), add(&c, be, 1, dt, 2, xs), add(&c, be, 2, dt, 1, d1), add(&c, be, 3, acc, 1, d1);
        add(&c, be, 4, acc, 1, d1), add(&c, be, 5, dt, 2, xs), add(&c, be, 7, acc, 1, d1), add(&c, be, 8, acc, 1, d1);
        if (!v) add(&c, be, 6, dt, 2, xs);
        run_case(ctx, be, &c);
        drop_case(&c);
    }
    memset(&c, 0, sizeof c);
    c.op = FG_OP_BATCH_NORM_STATS, c.label = "batch_norm_stats +r", covered[c.op] = true;
    fg_batch_norm_options so = bo;
    so.dropout.p = 0.3;
    c.options = &so, c.options_size = sizeof so;
    add(&c, be, 0, dt, 2, xs), add(&c, be, 1, dt, 2, xs), add(&c, be, 2, dt, 2, xs), add(&c, be, 3, FG_F64, 1, sn);
    run_case(ctx, be, &c);
    drop_case(&c);
    memset(&c, 0, sizeof c);
    c.op = FG_OP_BATCH_NORM_APPLY, c.label = "batch_norm_apply", covered[c.op] = true;
    c.options = &bo, c.options_size = sizeof bo;
    add(&c, be, 0, dt, 2, xs), add(&c, be, 1, FG_F64, 1, sn), set_values(&c, 1, bn_sums);
    add(&c, be, 2, dt, 1, d1), add(&c, be, 3, dt, 1, d1), add(&c, be, 4, dt, 1, d1), add(&c, be, 5, dt, 1, d1);
    add(&c, be, 6, dt, 2, xs), add(&c, be, 7, acc, 1, d1), add(&c, be, 8, acc, 1, d1);
    run_case(ctx, be, &c);
    drop_case(&c);
    memset(&c, 0, sizeof c);
    c.op = FG_OP_BATCH_NORM_BACKWARD_STATS, c.label = "batch_norm_backward_stats", covered[c.op] = true;
    c.options = &bo, c.options_size = sizeof bo;
    add(&c, be, 0, dt, 2, xs), add(&c, be, 1, dt, 2, xs), add(&c, be, 2, acc, 1, d1), add(&c, be, 3, acc, 1, d1);
    add(&c, be, 4, FG_F64, 1, sn);
    run_case(ctx, be, &c);
    drop_case(&c);
    memset(&c, 0, sizeof c);
    c.op = FG_OP_BATCH_NORM_BACKWARD_APPLY, c.label = "batch_norm_backward_apply", covered[c.op] = true;
    c.options = &so, c.options_size = sizeof so;
    add(&c, be, 0, dt, 2, xs), add(&c, be, 1, dt, 2, xs), add(&c, be, 2, dt, 1, d1), add(&c, be, 3, acc, 1, d1);
    add(&c, be, 4, acc, 1, d1), add(&c, be, 5, FG_F64, 1, sn), set_values(&c, 5, bn_sums);
    add(&c, be, 6, dt, 2, xs), add(&c, be, 7, dt, 2, xs), add(&c, be, 8, dt, 1, d1), add(&c, be, 9, dt, 1, d1);
    run_case(ctx, be, &c);
    drop_case(&c);
    fg_dropout_options dop = {0.25, 42, 7};
    for (int v = 0; v < 2; v++) {
        memset(&c, 0, sizeof c);
        c.op = v ? FG_OP_DROPOUT_BACKWARD : FG_OP_DROPOUT_FORWARD, covered[c.op] = true;
        c.label = v ? "dropout_backward (accumulate)" : "dropout_forward";
        c.options = &dop, c.options_size = sizeof dop, c.accumulate = v;
        add(&c, be, 0, dt, 2, xs), add(&c, be, 1, dt, 2, xs);
        run_case(ctx, be, &c);
        drop_case(&c);
    }
    fg_revin_options ro = {0, 0, 0};
    memset(&c, 0, sizeof c);
    c.op = FG_OP_REVIN_STATS, c.label = "revin_stats", covered[c.op] = true;
    c.options = &ro, c.options_size = sizeof ro;
    add(&c, be, 0, dt, 3, rv), add(&c, be, 1, acc, 2, st), add(&c, be, 2, acc, 2, st);
    run_case(ctx, be, &c);
    drop_case(&c);
    for (int v = 0; v < 2; v++) {
        fg_revin_options o = {0, v, 0};
        memset(&c, 0, sizeof c);
        c.op = FG_OP_REVIN_FORWARD, c.label = v ? "revin_forward denorm" : "revin_forward", covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o;
        add(&c, be, 0, dt, 3, rv), add(&c, be, 1, dt, 1, d1), add(&c, be, 2, dt, 1, d1), add(&c, be, 3, acc, 2, st);
        add(&c, be, 4, acc, 2, st), set_values(&c, 4, positive), add(&c, be, 5, dt, 3, rv);
        run_case(ctx, be, &c);
        drop_case(&c);
        memset(&c, 0, sizeof c);
        c.op = FG_OP_REVIN_BACKWARD, c.label = v ? "revin_backward denorm" : "revin_backward", covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o;
        add(&c, be, 0, dt, 3, rv), add(&c, be, 1, dt, 3, rv), add(&c, be, 2, dt, 1, d1), add(&c, be, 3, dt, 1, d1);
        add(&c, be, 4, acc, 2, st), add(&c, be, 5, acc, 2, st), set_values(&c, 5, positive);
        add(&c, be, 6, dt, 3, rv), add(&c, be, 7, acc, 1, d1), add(&c, be, 8, dt, 1, d1);
        run_case(ctx, be, &c);
        drop_case(&c);
    }
}

/* Attention at a shape: the forward with every optional operand, the backward with every
 * gradient; on CUDA the shapes pick the short, flash and tiled kernels. */
static void attention_cases(fg_context *ctx, fg_backend be, fg_dtype dt, int64_t B, int64_t H, int64_t L, int64_t hd,
                            bool scores, bool *covered) {
    int64_t q4[4] = {B, H, L, hd}, s4[4] = {B, H, L, L}, r3[3] = {B, H, L}, b1[1] = {B};
    const fg_dtype acc = dt == FG_F64 ? FG_F64 : FG_F32;
    fg_attention_options o;
    memset(&o, 0, sizeof o);
    o.causal = 1;
    char label[96];
    plan_case c;
    for (int fwd = 1; fwd >= 0; fwd--) {
        snprintf(label, sizeof label, "attention_%s %s %lldx%lldx%lldx%lld%s", fwd ? "forward" : "backward",
                 fg_dtype_name(dt), (long long)B, (long long)H, (long long)L, (long long)hd, scores ? " scores" : "");
        memset(&c, 0, sizeof c);
        c.op = fwd ? FG_OP_ATTENTION_FORWARD : FG_OP_ATTENTION_BACKWARD;
        c.label = label;
        covered[c.op] = true;
        c.options = &o, c.options_size = sizeof o;
        if (fwd) {
            add(&c, be, 0, dt, 4, q4), add(&c, be, 1, dt, 4, q4), add(&c, be, 2, dt, 4, q4);
            add(&c, be, 5, dt, 4, q4), add(&c, be, 6, acc, 3, r3);
            if (scores) add(&c, be, 4, dt, 4, s4), add(&c, be, 7, dt, 4, s4);
        } else {
            add(&c, be, 0, dt, 4, q4), add(&c, be, 2, dt, 4, q4), add(&c, be, 3, dt, 4, q4), add(&c, be, 4, dt, 4, q4);
            add(&c, be, 7, dt, 4, q4), add(&c, be, 8, acc, 3, r3);
            add(&c, be, 9, dt, 4, q4), add(&c, be, 10, dt, 4, q4), add(&c, be, 11, dt, 4, q4);
            if (scores) add(&c, be, 1, dt, 4, s4), add(&c, be, 6, dt, 4, s4), add(&c, be, 12, dt, 4, s4);
        }
        add(&c, be, fwd ? 3 : 5, FG_I64, 1, b1); /* lengths 0: every row empty, still a full run */
        run_case(ctx, be, &c);
        drop_case(&c);
    }
}

/* The series family: patching (a transposed series view, as fastgrad-train reads a [B, L, C]
 * batch) and its overlap-add, the window gather, and the loss with its finish (two kernels). */
static void series_cases(fg_context *ctx, fg_backend be, fg_dtype dt, bool *covered) {
    const int64_t xs[3] = {3, 5, 40}, ys[4] = {3, 5, 7, 8}, ps[2] = {9, 700}, one[1] = {1};
    fg_patch_options po = {8, 6, 6};
    fg_regression_loss_options lo = {FG_LOSS_MSE, FG_REDUCTION_MEAN, 0, 0};
    plan_case c;
    memset(&c, 0, sizeof c);
    c.op = FG_OP_PATCH_FORWARD, c.label = "patch_forward (transposed series)", covered[c.op] = true;
    c.options = &po, c.options_size = sizeof po;
    c.own[0] = th_make(be, dt, 3, xs, 2), th_randomize(&c.own[0]), c.ops[0] = c.own[0].t;
    add(&c, be, 1, dt, 4, ys);
    run_case(ctx, be, &c);
    drop_case(&c);
    memset(&c, 0, sizeof c);
    c.op = FG_OP_PATCH_BACKWARD, c.label = "patch_backward", covered[c.op] = true;
    c.options = &po, c.options_size = sizeof po, c.accumulate = 1;
    add(&c, be, 0, dt, 4, ys), add(&c, be, 1, dt, 3, xs);
    run_case(ctx, be, &c);
    drop_case(&c);
    memset(&c, 0, sizeof c);
    const int64_t series[2] = {50, 7}, starts[1] = {5}, win[3] = {5, 12, 7};
    c.op = FG_OP_SERIES_WINDOWS, c.label = "series_windows", covered[c.op] = true;
    add(&c, be, 0, dt, 2, series), add(&c, be, 1, FG_I64, 1, starts), add(&c, be, 2, dt, 3, win);
    run_case(ctx, be, &c);
    drop_case(&c);
    memset(&c, 0, sizeof c);
    c.op = FG_OP_REGRESSION_LOSS, c.label = "regression_loss mse mean + dpred", covered[c.op] = true;
    c.options = &lo, c.options_size = sizeof lo;
    add(&c, be, 0, dt, 2, ps), add(&c, be, 1, dt, 2, ps), add(&c, be, 2, FG_F32, 1, one), add(&c, be, 3, dt, 2, ps);
    run_case(ctx, be, &c);
    drop_case(&c);
}

/* A plan made for 16-byte aligned data refuses a pointer 4 bytes off, writes nothing; one made
 * for 4 bytes takes it. */
static void declared_alignment(fg_context *ctx, fg_backend be) {
    int64_t nk[2] = {8, 16}, mk[2] = {12, 16}, nm[2] = {8, 12};
    th_operand x = th_make(be, FG_F32, 2, nk, 3), w = th_make(be, FG_F32, 2, mk, 0), y = th_make(be, FG_F32, 2, nm, 0);
    th_randomize(&x), th_randomize(&w), th_poison(&y.buf);
    fg_plan_desc d;
    memset(&d, 0, sizeof d);
    d.op = FG_OP_LINEAR_FORWARD;
    d.operands[0] = x.t, d.operands[1] = w.t, d.operands[3] = y.t;
    d.operands[0].data = d.operands[1].data = d.operands[3].data = NULL;
    fg_tensor ops[FG_MAX_OPERANDS];
    memset(ops, 0, sizeof ops);
    ops[0] = x.t, ops[1] = w.t, ops[3] = y.t;
    fg_plan *plan = NULL;
    TH_OK(fg_plan_create(ctx, &d, &plan));
    TH_EXPECT_BAD(FG_ERR_MISALIGNED, "x.data", &y, fg_plan_can_implement(plan, ops));
    TH_EXPECT_BAD(FG_ERR_MISALIGNED, "desc.alignment", &y, fg_plan_run(plan, ops, NULL, 0));
    fg_plan_destroy(plan);
    d.alignment = 3;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "power of two", &y, fg_plan_create(ctx, &d, &plan));
    d.alignment = 4;
    TH_OK(fg_plan_create(ctx, &d, &plan));
    fg_plan_info info;
    TH_OK(fg_plan_info_get(plan, &info));
    th_buf ws = th_alloc(be, FG_F32, (int64_t)(info.workspace_bytes / 4 + 64));
    TH_OK(fg_plan_run(plan, ops, ws.ptr, info.workspace_bytes));
    double *out = malloc(sizeof(double) * 96);
    th_get(&y.buf, &y.t, out);
    double err = 0;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 12; j++) {
            double ref = 0;
            for (int k = 0; k < 16; k++) ref += x.v[i * 16 + k] * w.v[j * 16 + k];
            double e = fabs(out[i * 12 + j] - ref) / (1 + fabs(ref));
            if (!(e <= err)) err = e; /* NaN counts */
        }
    TH_CHECK(err < 1e-5, "%s: a plan declared 4-byte aligned runs on an offset x (err %g)", th_backend_name(be), err);
    free(out);
    th_free(&ws);
    fg_plan_destroy(plan);
    d.options = &d; /* linear takes no options */
    d.options_size = 8;
    TH_EXPECT_BAD(FG_ERR_INVALID_VALUE, "takes no options", &y, fg_plan_create(ctx, &d, &plan));
    th_drop(&x), th_drop(&w), th_drop(&y);
}

int main(void) {
    th_init("plans");
    describe_all();
    abi();
    fg_backend bes[2];
    const int nb = th_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        fg_context *ctx = th_context(bes[bi], false);
        if (!ctx) continue;
#ifdef FG_TEST_HAVE_CUDA
        if (bes[bi] == FG_BACKEND_CUDA) {
            TH_CHECK(cudaStreamCreate(&graph_stream) == cudaSuccess, "cudaStreamCreate");
            TH_OK(fg_context_set_stream(ctx, graph_stream));
            adamw_graph(ctx);
        }
#endif
        bool covered[64] = {false};
        const fg_dtype dts[2] = {FG_F32, FG_BF16};
        for (int di = 0; di < 2; di++) {
            linear_cases(ctx, bes[bi], dts[di], covered);
            act_cases(ctx, bes[bi], dts[di], FG_ACT_GELU_TANH, 67, 40, 72, covered); /* short K */
            act_cases(ctx, bes[bi], dts[di], FG_ACT_RELU, 67, 200, 72, covered);
            series_cases(ctx, bes[bi], dts[di], covered);
            norm_cases(ctx, bes[bi], dts[di], 67, 40, covered);
            attention_cases(ctx, bes[bi], dts[di], 2, 3, 42, 8, true, covered);   /* short */
            attention_cases(ctx, bes[bi], dts[di], 1, 2, 200, 64, false, covered); /* flash (bf16) / tiled */
            attention_cases(ctx, bes[bi], dts[di], 1, 2, 150, 48, true, covered);  /* tiled */
        }
        if (bes[bi] == FG_BACKEND_CUDA) { /* the wide layers' own GEMM paths (a full wave of tiles) */
            norm_cases(ctx, bes[bi], FG_BF16, 300, 4096, covered);  /* a long row: the block-per-row path */
            norm_cases(ctx, bes[bi], FG_BF16, 301, 4099, covered);  /* no 16-byte rows */
            act_cases(ctx, bes[bi], FG_BF16, FG_ACT_GELU_TANH, 4096, 2048, 2048, covered);
            act_cases(ctx, bes[bi], FG_BF16, FG_ACT_SILU, 4096, 2048, 2048, covered);
            act_cases(ctx, bes[bi], FG_BF16, FG_ACT_SILU, 20000, 128, 256, covered); /* one-kernel backward */
        }
        for (int32_t op = 1; op <= fg_op_count(); op++) {
            fg_op_info info;
            TH_OK(fg_op_describe((fg_op)op, &info));
            TH_CHECK(op < 64 && covered[op], "op %s has no case in test_plans.c", info.name);
        }
        declared_alignment(ctx, bes[bi]);
        fg_context_destroy(ctx);
#ifdef FG_TEST_HAVE_CUDA
        if (bes[bi] == FG_BACKEND_CUDA) cudaStreamDestroy(graph_stream);
#endif
    }
    return th_finish("plans");
}

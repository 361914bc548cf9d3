/* _fastcall.c — ops.run()'s per-call path in C: the CPython module fastgrad._fastcall.
 *
 * A call through ctypes spends most of its time in Python: reading each numpy array's
 * pointer (ndarray.ctypes builds an object per read), building the plan key as a tuple,
 * writing pointers into a ctypes array and converting ctypes arguments. This module does
 * the same steps in C: it reads every operand's data pointer, dtype, shape and strides
 * (numpy arrays through the buffer protocol, torch tensors through dtype / shape /
 * stride() / data_ptr(), torch not linked), forms the fg_tensor descriptors and a key from
 * them, finds the plan in the context's fast cache (a dict the Python side owns:
 * _lib.Context.fast, bytes key -> (plan handle, workspace bytes, Plan)), sets the CUDA
 * stream, and calls fg_plan_run.
 *
 * Everything unusual goes back to Python unchanged: an operand that is neither an ndarray
 * nor a torch tensor, a dtype fastgrad does not take, strides that are not whole elements
 * or zero, an unknown op or operand name, options of the wrong type, any Python error
 * while reading an operand. ops._run_py then runs the call and raises exactly what it
 * always raised. A key not yet in the fast cache also goes to ops._run_py, with the key,
 * so the plan is made (and its errors raised) by the one Python path, which then enters
 * it here. A refusal by fg_plan_run raises the same FastgradError(status, message).
 *
 * The library is not linked: ops.py hands over the addresses of fg_plan_run and
 * fg_last_error from the libfastgrad ctypes loaded, so both paths use one library (one
 * thread-local error, one set of plan handles) wherever FASTGRAD_LIBRARY points. Built
 * for CPython's stable ABI (Py_LIMITED_API 3.11) when CMake's Python is 3.11 or newer.
 * The state is process-wide (single-phase init); one interpreter per process.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "fastgrad.h"

typedef fg_status (*plan_run_fn)(fg_plan *plan, const fg_tensor *operands, void *ws, size_t ws_bytes);
typedef const char *(*last_error_fn)(void);

enum { N_TORCH_DTYPES = 8, KEY_CAP = 64 + 256 + FG_MAX_OPERANDS * (8 + 16 * FG_MAX_RANK) };

static struct {
    int ready;
    plan_run_fn plan_run;
    last_error_fn last_error;
    PyObject *ops;          /* op name -> (op id, operand names tuple, options class or None) */
    PyObject *ndarray;      /* numpy.ndarray */
    PyObject *tensor;       /* torch.Tensor, or NULL without torch */
    PyObject *torch_dtype[N_TORCH_DTYPES];
    int torch_code[N_TORCH_DTYPES];
    int n_torch_dtypes;
    PyObject *context_fn;   /* (backend, device) -> (Context, Context.fast) */
    PyObject *stream_fn;    /* device index -> the current CUDA stream (int) */
    PyObject *workspace_fn; /* (ref operand, bytes) -> (owner, pointer) */
    PyObject *slow_fn;      /* ops._run_py(op, operands, accumulate, options, flags, key) */
    PyObject *error_type;   /* _lib.FastgradError */
    PyObject *tls_key;      /* this module's entry in each thread's state dict */
    unsigned tf32_flag;     /* _lib.PLAN_ALLOW_TF32 while set_allow_tf32(True) */
    unsigned long long hits, misses, fallbacks;
    /* interned attribute names */
    PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_is_cuda, *s_get_device, *s_stream, *s_set_stream;
} S;

/* The dtype code of a numpy buffer's format (native byte order only), or -1. */
static int numpy_code(const char *fmt, Py_ssize_t itemsize)
{
    if (!fmt)
        return -1;
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') {
        if (*fmt == '<') { /* little-endian spelled out: native only on a little-endian host */
            const uint16_t one = 1;
            if (*(const uint8_t *)&one != 1)
                return -1;
        }
        fmt++;
    }
    if (!fmt[0] || fmt[1])
        return -1;
    switch (fmt[0]) {
    case 'f': return itemsize == 4 ? FG_F32 : -1;
    case 'd': return itemsize == 8 ? FG_F64 : -1;
    case 'e': return itemsize == 2 ? FG_F16 : -1;
    case 'i': case 'l': case 'q':
        return itemsize == 4 ? FG_I32 : itemsize == 8 ? FG_I64 : -1;
    default: return -1;
    }
}

/* A Python int sequence (tuple or torch.Size) into n int64s; -1 when it is not one. */
static int read_ints(PyObject *seq, int64_t *out, Py_ssize_t n)
{
    if (!PyTuple_Check(seq) || PyTuple_Size(seq) != n)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GetItem(seq, i);
        if (!v || !PyLong_Check(v))
            return -1;
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        out[i] = x;
    }
    return 0;
}

/* A torch tensor's descriptor: 0, or -1 for "let Python do it" (any error is cleared). */
static int describe_torch(PyObject *a, fg_tensor *t)
{
    int rc = -1;
    PyObject *dtype = NULL, *shape = NULL, *stride = NULL, *ptr = NULL;
    if (!(dtype = PyObject_GetAttr(a, S.s_dtype)))
        goto done;
    int code = -1;
    for (int i = 0; i < S.n_torch_dtypes; i++)
        if (dtype == S.torch_dtype[i])
            code = S.torch_code[i];
    if (code < 0)
        goto done;
    if (!(shape = PyObject_GetAttr(a, S.s_shape)) || !PyTuple_Check(shape))
        goto done;
    Py_ssize_t rank = PyTuple_Size(shape);
    if (rank > FG_MAX_RANK)
        goto done;
    if (!(stride = PyObject_CallMethodObjArgs(a, S.s_stride, NULL)))
        goto done;
    if (!(ptr = PyObject_CallMethodObjArgs(a, S.s_data_ptr, NULL)) || !PyLong_Check(ptr))
        goto done;
    if (read_ints(shape, t->shape, rank) || read_ints(stride, t->stride, rank))
        goto done;
    t->data = PyLong_AsVoidPtr(ptr);
    if (!t->data && PyErr_Occurred())
        goto done;
    t->dtype = (fg_dtype)code;
    t->rank = (int32_t)rank;
    rc = 0;
done:
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(ptr);
    if (rc)
        PyErr_Clear();
    return rc;
}

/* A numpy array's descriptor through the buffer protocol: 0, or -1 for "let Python do it"
 * (a dtype fastgrad does not take, byte strides that are not whole elements). */
static int describe_numpy(PyObject *a, fg_tensor *t)
{
    Py_buffer v;
    if (PyObject_GetBuffer(a, &v, PyBUF_RECORDS_RO) != 0) {
        PyErr_Clear();
        return -1;
    }
    int rc = -1;
    int code = numpy_code(v.format, v.itemsize);
    if (code < 0 || v.ndim > FG_MAX_RANK || v.itemsize <= 0)
        goto done;
    for (int i = 0; i < v.ndim; i++) {
        Py_ssize_t s = v.strides ? v.strides[i] : 0;
        if (s % v.itemsize)
            goto done;
        t->shape[i] = v.shape[i];
        t->stride[i] = s / v.itemsize;
    }
    if (!v.strides && v.ndim) { /* a C-contiguous export without strides */
        int64_t s = 1;
        for (int i = v.ndim - 1; i >= 0; i--) {
            t->stride[i] = s;
            s *= t->shape[i];
        }
    }
    t->data = v.buf;
    t->dtype = (fg_dtype)code;
    t->rank = v.ndim;
    rc = 0;
done:
    PyBuffer_Release(&v);
    return rc;
}

/* One operand's descriptor; None is absent (rank 0). 0, or -1 for "let Python do it". */
static int describe(PyObject *a, fg_tensor *t)
{
    memset(t, 0, sizeof *t);
    if (a == Py_None)
        return 0;
    int rc;
    if (S.tensor && PyObject_TypeCheck(a, (PyTypeObject *)S.tensor))
        rc = describe_torch(a, t);
    else if (PyObject_TypeCheck(a, (PyTypeObject *)S.ndarray))
        rc = describe_numpy(a, t);
    else
        return -1;
    if (rc)
        return rc;
    /* ops._describe's rules: a broadcast (zero-stride) view goes to Python, which refuses
       it; all-zero strides of a tensor with no dim above 1 read as unit strides. */
    int all_zero = t->rank > 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] > 1 && t->stride[i] == 0)
            return -1;
        all_zero &= t->stride[i] == 0;
    }
    if (all_zero)
        for (int i = 0; i < t->rank; i++)
            t->stride[i] = 1;
    return 0;
}

static void put(unsigned char *key, size_t *n, const void *src, size_t bytes)
{
    memcpy(key + *n, src, bytes);
    *n += bytes;
}

/* The calling thread's (Context, Context.fast) for (backend, device), asked of Python
 * once per thread and kept in the thread's state dict; NULL with an error set. */
static PyObject *context_of(int backend, int device)
{
    PyObject *tsd = PyThreadState_GetDict();
    if (!tsd) {
        PyErr_SetString(PyExc_RuntimeError, "fastgrad._fastcall: no thread state dict");
        return NULL;
    }
    PyObject *memo = PyDict_GetItemWithError(tsd, S.tls_key); /* borrowed */
    if (!memo) {
        if (PyErr_Occurred() || !(memo = PyDict_New()))
            return NULL;
        int bad = PyDict_SetItem(tsd, S.tls_key, memo);
        Py_DECREF(memo);
        if (bad)
            return NULL;
    }
    PyObject *k = PyLong_FromLong((long)backend << 20 | device);
    if (!k)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(memo, k); /* borrowed */
    if (!entry && !PyErr_Occurred()) {
        entry = PyObject_CallFunction(S.context_fn, "ii", backend, device);
        if (entry && (!PyTuple_Check(entry) || PyTuple_Size(entry) != 2 ||
                      !PyDict_Check(PyTuple_GetItem(entry, 1)))) {
            PyErr_SetString(PyExc_TypeError, "fastgrad._fastcall: the context hook must return (ctx, dict)");
            Py_CLEAR(entry);
        }
        if (entry) {
            int bad = PyDict_SetItem(memo, k, entry);
            Py_DECREF(entry); /* memo holds it */
            if (bad)
                entry = NULL;
        }
    }
    Py_DECREF(k);
    return entry;
}

/* Sets the context's stream to the device's current one (ctx.set_stream, which owns the
 * context's record of it) when it differs. 0 or -1 with an error set. */
static int sync_stream(PyObject *ctx, int device)
{
    PyObject *s = PyObject_CallFunction(S.stream_fn, "i", device);
    if (!s)
        return -1;
    PyObject *cur = PyObject_GetAttr(ctx, S.s_stream);
    int rc = -1;
    if (cur) {
        int ne = PyObject_RichCompareBool(s, cur, Py_NE);
        if (ne == 0)
            rc = 0;
        else if (ne > 0) {
            PyObject *r = PyObject_CallMethodObjArgs(ctx, S.s_set_stream, s, NULL);
            rc = r ? 0 : -1;
            Py_XDECREF(r);
        }
        Py_DECREF(cur);
    }
    Py_DECREF(s);
    return rc;
}

/* (backend, device) of the first present operand, as ops._placement decides it. */
static int placement(PyObject *ref, int *backend, int *device)
{
    *backend = FG_BACKEND_CPU;
    *device = 0;
    if (!(S.tensor && PyObject_TypeCheck(ref, (PyTypeObject *)S.tensor)))
        return 0;
    PyObject *c = PyObject_GetAttr(ref, S.s_is_cuda);
    if (!c)
        return -1;
    int cuda = PyObject_IsTrue(c);
    Py_DECREF(c);
    if (cuda < 0)
        return -1;
    if (!cuda)
        return 0;
    PyObject *d = PyObject_CallMethodObjArgs(ref, S.s_get_device, NULL);
    if (!d)
        return -1;
    long idx = PyLong_AsLong(d);
    Py_DECREF(d);
    if (idx == -1 && PyErr_Occurred())
        return -1;
    *backend = FG_BACKEND_CUDA;
    *device = idx < 0 ? 0 : (int)idx;
    return 0;
}

static PyObject *slow(PyObject *op, PyObject *operands, PyObject *acc, PyObject *options, PyObject *flags,
                      PyObject *key)
{
    return PyObject_CallFunctionObjArgs(S.slow_fn, op, operands, acc, options, flags, key, NULL);
}

static PyObject *raise_status(fg_status status, const char *msg)
{
    PyObject *text = PyUnicode_FromString(msg ? msg : "");
    if (!text)
        return NULL;
    PyObject *exc = PyObject_CallFunction(S.error_type, "iO", (int)status, text);
    Py_DECREF(text);
    if (exc) {
        PyErr_SetObject(S.error_type, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* run(op, operands, accumulate=False, options=None, flags=0): ops.run. */
static PyObject *fc_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"op", "operands", "accumulate", "options", "flags"};
    PyObject *a[5] = {NULL, NULL, Py_False, Py_None, NULL};
    if (nargs > 5) {
        PyErr_Format(PyExc_TypeError, "run() takes at most 5 arguments (%zd given)", nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        a[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GetItem(kwnames, k);
        int j = 0;
        while (j < 5 && PyUnicode_CompareWithASCIIString(name, names[j]) != 0)
            j++;
        if (j == 5) {
            PyErr_Format(PyExc_TypeError, "run() got an unexpected keyword argument '%U'", name);
            return NULL;
        }
        if (j < nargs) {
            PyErr_Format(PyExc_TypeError, "run() got multiple values for argument '%s'", names[j]);
            return NULL;
        }
        a[j] = args[nargs + k];
    }
    if (!a[0] || !a[1]) {
        PyErr_SetString(PyExc_TypeError, "run() missing required argument 'op' or 'operands'");
        return NULL;
    }
    PyObject *op = a[0], *operands = a[1], *acc_obj = a[2], *options = a[3];
    PyObject *flags_obj = a[4];
    PyObject *zero = NULL;
    if (!flags_obj) {
        if (!(zero = PyLong_FromLong(0)))
            return NULL;
        flags_obj = zero;
    }
    PyObject *result = NULL, *key = NULL, *ws_owner = NULL, *entry = NULL;
    PyObject *items[FG_MAX_OPERANDS]; /* held while the call runs: Python code (a tensor's
                                         attributes, the hooks) runs in between */
    Py_ssize_t held = 0;
    fg_tensor t[FG_MAX_OPERANDS];
    unsigned char kbuf[KEY_CAP];
    size_t kn = 0;

    if (!S.ready)
        goto fallback;
    /* the op, its operands in the library's order, its options */
    PyObject *info = PyUnicode_Check(op) ? PyDict_GetItemWithError(S.ops, op) : NULL;
    if (!info)
        goto fallback;
    int op_id = (int)PyLong_AsLong(PyTuple_GetItem(info, 0));
    PyObject *opnames = PyTuple_GetItem(info, 1), *opt_class = PyTuple_GetItem(info, 2);
    Py_ssize_t n = PyTuple_Size(opnames);
    if (PyErr_Occurred() || n > FG_MAX_OPERANDS)
        goto fallback;
    if (PyDict_Check(operands)) {
        Py_ssize_t found = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyDict_GetItemWithError(operands, PyTuple_GetItem(opnames, i));
            if (!v && PyErr_Occurred())
                goto fallback;
            found += v != NULL;
            items[i] = v ? v : Py_None;
            Py_INCREF(items[i]);
            held = i + 1;
        }
        if (found != PyDict_Size(operands)) /* a name the op does not have */
            goto fallback;
    } else if (PyList_Check(operands) || PyTuple_Check(operands)) {
        int list = PyList_Check(operands);
        if ((list ? PyList_Size(operands) : PyTuple_Size(operands)) != n)
            goto fallback;
        for (Py_ssize_t i = 0; i < n; i++) {
            items[i] = list ? PyList_GetItem(operands, i) : PyTuple_GetItem(operands, i);
            Py_INCREF(items[i]);
            held = i + 1;
        }
    } else
        goto fallback;
    if (options != Py_None && (PyObject *)Py_TYPE(options) != opt_class)
        goto fallback;
    int acc = PyObject_IsTrue(acc_obj);
    unsigned long flags = PyLong_Check(flags_obj) ? PyLong_AsUnsignedLong(flags_obj) : (unsigned long)-1;
    if (acc < 0 || (flags == (unsigned long)-1 && PyErr_Occurred()) || flags > UINT32_MAX)
        goto fallback;
    uint32_t hdr[4] = {(uint32_t)op_id, (uint32_t)acc, (uint32_t)flags | S.tf32_flag, 0};
    kn = sizeof hdr;
    if (options != Py_None) {
        Py_buffer ob;
        if (PyObject_GetBuffer(options, &ob, PyBUF_SIMPLE) != 0)
            goto fallback;
        uint32_t len = (uint32_t)ob.len;
        if (ob.len > 256) {
            PyBuffer_Release(&ob);
            goto fallback;
        }
        put(kbuf, &kn, &len, sizeof len);
        put(kbuf, &kn, ob.buf, (size_t)ob.len);
        PyBuffer_Release(&ob);
    } else {
        uint32_t none = UINT32_MAX;
        put(kbuf, &kn, &none, sizeof none);
    }
    /* every operand's descriptor, its part of the key, and the pointers' alignment class */
    PyObject *ref = NULL;
    uintptr_t bits = 256;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (describe(items[i], &t[i]))
            goto fallback;
        if (items[i] != Py_None && !ref)
            ref = items[i];
        int32_t d[2] = {items[i] == Py_None ? -1 : (int32_t)t[i].dtype, t[i].rank};
        put(kbuf, &kn, d, sizeof d);
        put(kbuf, &kn, t[i].shape, sizeof(int64_t) * (size_t)t[i].rank);
        put(kbuf, &kn, t[i].stride, sizeof(int64_t) * (size_t)t[i].rank);
        bits |= (uintptr_t)t[i].data;
    }
    if (!ref)
        goto fallback;
    hdr[3] = (uint32_t)(bits & (~bits + 1));
    memcpy(kbuf, hdr, sizeof hdr);

    /* the thread's context, its stream, and the plan */
    int backend, device;
    if (placement(ref, &backend, &device))
        goto fallback;
    PyObject *cx = context_of(backend, device); /* borrowed: the thread's memo holds it */
    if (!cx)
        goto fallback;
    if (backend == FG_BACKEND_CUDA && sync_stream(PyTuple_GetItem(cx, 0), device))
        goto fallback;
    if (!(key = PyBytes_FromStringAndSize((const char *)kbuf, (Py_ssize_t)kn)))
        goto done;
    entry = PyDict_GetItemWithError(PyTuple_GetItem(cx, 1), key);
    Py_XINCREF(entry); /* held: the workspace hook runs Python code */
    if (!entry) {
        if (PyErr_Occurred())
            goto done;
        S.misses++;
        result = slow(op, operands, acc_obj, options, flags_obj, key);
        goto done;
    }
    fg_plan *plan = PyLong_AsVoidPtr(PyTuple_GetItem(entry, 0));
    size_t ws_bytes = PyLong_AsSize_t(PyTuple_GetItem(entry, 1));
    if (PyErr_Occurred())
        goto done;
    /* workspace from the caller's allocator (ops._workspace), held until the run returns */
    void *ws = NULL;
    if (ws_bytes) {
        PyObject *nb = PyLong_FromSize_t(ws_bytes);
        if (!nb)
            goto done;
        ws_owner = PyObject_CallFunctionObjArgs(S.workspace_fn, ref, nb, NULL);
        Py_DECREF(nb);
        if (!ws_owner)
            goto done;
        PyObject *p = PyTuple_Check(ws_owner) ? PyTuple_GetItem(ws_owner, 1) : NULL;
        if (!p || !PyLong_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "fastgrad._fastcall: the workspace hook must return (owner, int)");
            goto done;
        }
        ws = PyLong_AsVoidPtr(p);
        if (PyErr_Occurred())
            goto done;
    }
    fg_status status;
    const char *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    status = S.plan_run(plan, t, ws, ws_bytes);
    if (status != FG_OK)
        msg = S.last_error();
    Py_END_ALLOW_THREADS
    S.hits++;
    if (status != FG_OK) {
        raise_status(status, msg);
        goto done;
    }
    result = PyTuple_GetItem(entry, 2);
    Py_XINCREF(result);
    goto done;

fallback:
    PyErr_Clear();
    S.fallbacks++;
    result = slow(op, operands, acc_obj, options, flags_obj, Py_None);
done:
    Py_XDECREF(key);
    Py_XDECREF(ws_owner);
    Py_XDECREF(entry);
    for (Py_ssize_t i = 0; i < held; i++)
        Py_DECREF(items[i]);
    Py_XDECREF(zero);
    return result;
}

static void clear_state(void)
{
    Py_CLEAR(S.ops);
    Py_CLEAR(S.ndarray);
    Py_CLEAR(S.tensor);
    for (int i = 0; i < S.n_torch_dtypes; i++)
        Py_CLEAR(S.torch_dtype[i]);
    S.n_torch_dtypes = 0;
    Py_CLEAR(S.context_fn);
    Py_CLEAR(S.stream_fn);
    Py_CLEAR(S.workspace_fn);
    Py_CLEAR(S.slow_fn);
    Py_CLEAR(S.error_type);
    S.ready = 0;
}

/* configure(plan_run, last_error, ops, ndarray, tensor, torch_dtypes, context_fn, stream_fn,
 *           workspace_fn, slow_fn, error_type, sizes): what ops.py hands over once.
 * sizes: (sizeof fg_tensor, FG_MAX_RANK, FG_MAX_OPERANDS) of the loaded library; a module
 * compiled against another layout refuses (ValueError), and ops.py keeps the ctypes path. */
static PyObject *fc_configure(PyObject *self, PyObject *args)
{
    PyObject *prun, *perr, *ops, *ndarray, *tensor, *dtypes, *ctxf, *strf, *wsf, *slowf, *errt, *sizes;
    if (!PyArg_ParseTuple(args, "OOO!OOO!OOOOOO!:configure", &prun, &perr, &PyDict_Type, &ops, &ndarray,
                          &tensor, &PyDict_Type, &dtypes, &ctxf, &strf, &wsf, &slowf, &errt, &PyTuple_Type,
                          &sizes))
        return NULL;
    long long want[3] = {(long long)sizeof(fg_tensor), FG_MAX_RANK, FG_MAX_OPERANDS}, got[3];
    if (PyTuple_Size(sizes) != 3)
        return PyErr_Format(PyExc_ValueError, "configure: sizes must be 3 ints");
    for (int i = 0; i < 3; i++) {
        got[i] = PyLong_AsLongLong(PyTuple_GetItem(sizes, i));
        if (got[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    if (memcmp(want, got, sizeof want))
        return PyErr_Format(PyExc_ValueError,
                            "fastgrad._fastcall was compiled for fg_tensor %lld bytes, rank %lld, %lld operands; "
                            "the library has %lld, %lld, %lld: rebuild", want[0], want[1], want[2], got[0],
                            got[1], got[2]);
    if (!PyType_Check(ndarray) || (tensor != Py_None && !PyType_Check(tensor)) || PyDict_Size(dtypes) >
        N_TORCH_DTYPES)
        return PyErr_Format(PyExc_TypeError, "configure: bad ndarray / tensor type or too many dtypes");
    void *run = PyLong_AsVoidPtr(prun), *err = PyLong_AsVoidPtr(perr);
    if (PyErr_Occurred())
        return NULL;
    if (!run || !err)
        return PyErr_Format(PyExc_ValueError, "configure: NULL entry point");
    clear_state();
    S.plan_run = (plan_run_fn)run;
    S.last_error = (last_error_fn)err;
    Py_INCREF(ops); S.ops = ops;
    Py_INCREF(ndarray); S.ndarray = ndarray;
    if (tensor != Py_None) { Py_INCREF(tensor); S.tensor = tensor; }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(dtypes, &pos, &k, &v)) {
        Py_INCREF(k);
        S.torch_dtype[S.n_torch_dtypes] = k;
        S.torch_code[S.n_torch_dtypes++] = (int)PyLong_AsLong(v);
    }
    Py_INCREF(ctxf); S.context_fn = ctxf;
    Py_INCREF(strf); S.stream_fn = strf;
    Py_INCREF(wsf); S.workspace_fn = wsf;
    Py_INCREF(slowf); S.slow_fn = slowf;
    Py_INCREF(errt); S.error_type = errt;
    if (PyErr_Occurred()) {
        clear_state();
        return NULL;
    }
    S.ready = 1;
    Py_RETURN_NONE;
}

static PyObject *fc_set_tf32(PyObject *self, PyObject *arg)
{
    long f = PyLong_AsLong(arg);
    if (f == -1 && PyErr_Occurred())
        return NULL;
    S.tf32_flag = (unsigned)f;
    Py_RETURN_NONE;
}

/* forget_contexts(): drops this thread's memo of contexts (the next call asks Python again). */
static PyObject *fc_forget_contexts(PyObject *self, PyObject *unused)
{
    PyObject *tsd = PyThreadState_GetDict();
    if (tsd && PyDict_GetItemWithError(tsd, S.tls_key) && PyDict_DelItem(tsd, S.tls_key))
        return NULL;
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *fc_stats(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("{sKsKsK}", "hits", S.hits, "misses", S.misses, "fallbacks", S.fallbacks);
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))fc_run, METH_FASTCALL | METH_KEYWORDS,
     "run(op, operands, accumulate=False, options=None, flags=0): ops.run in C (see ops._run_py)."},
    {"configure", fc_configure, METH_VARARGS, "Hands the module what it reads (called once by ops.py)."},
    {"set_tf32", fc_set_tf32, METH_O, "The flag set_allow_tf32 adds to every plan (0 or PLAN_ALLOW_TF32)."},
    {"forget_contexts", fc_forget_contexts, METH_NOARGS, "Drops this thread's memo of contexts."},
    {"stats", fc_stats, METH_NOARGS, "Calls run in C (hits), sent to Python to make a plan (misses), or "
     "handed to the Python path (fallbacks), since import."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastcall", "fastgrad's per-call path in C (see ops.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
#define INTERN(f, s) if (!(S.f = PyUnicode_InternFromString(s))) goto fail
    INTERN(s_dtype, "dtype");
    INTERN(s_shape, "shape");
    INTERN(s_stride, "stride");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_is_cuda, "is_cuda");
    INTERN(s_get_device, "get_device");
    INTERN(s_stream, "stream");
    INTERN(s_set_stream, "set_stream");
    INTERN(tls_key, "fastgrad._fastcall.contexts");
#undef INTERN
    if (PyModule_AddIntConstant(m, "VERSION", FG_VERSION) || PyModule_AddIntConstant(m, "LIMITED_API",
#ifdef Py_LIMITED_API
                                                                                      1
#else
                                                                                      0
#endif
                                                                                      ))
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}

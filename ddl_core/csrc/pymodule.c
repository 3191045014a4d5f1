/* ddl_core._ddl: the CPython binding of libddl; this file is the module: its errors, its
 * constants (libddl's op and dtype codes, from ddl.h's enums), the life cycle, settings and
 * tuning. The objects have their own files (py_ddl.h says which).
 *
 * Written against the C API directly (no ctypes, no Cython) because the latency of a small
 * allreduce is part of DDL's promise: this layer takes buffer-protocol objects, checks
 * them, releases the GIL and calls libddl, adding well under a microsecond. Dtypes are
 * passed as libddl's codes by the Python layer (ddl_core/_buffers.py), which knows numpy,
 * torch and plain buffers; errors become the exception classes defined here. */
#include <limits.h>

#include "py_ddl.h"

PyObject *DDLError, *MismatchError, *DDLTimeoutError, *NotInitializedError,
    *InvalidArgumentError, *PeerLostError, *ProcessFailedError;

/* ProcessFailedError(message) with .ranks: the failed members this thread's call named. */
static PyObject *raise_failed(void) {
    int n = 0, buf[256];
    if (ddl_last_failed_ranks(buf, 256, &n) != DDL_SUCCESS) n = 0;
    if (n > 256) n = 256;
    PyObject *ranks = PyTuple_New(n);
    for (int i = 0; ranks && i < n; i++) PyTuple_SET_ITEM(ranks, i, PyLong_FromLong(buf[i]));
    PyObject *exc = ranks ? PyObject_CallFunction(ProcessFailedError, "s", ddl_last_error()) : NULL;
    if (exc && PyObject_SetAttrString(exc, "ranks", ranks) == 0)
        PyErr_SetObject(ProcessFailedError, exc);
    Py_XDECREF(exc);
    Py_XDECREF(ranks);
    return NULL;
}

PyObject *raise_status(ddl_status_t st) {
    PyObject *cls = DDLError;
    if (st == DDL_ERR_PROC_FAILED) return raise_failed();
    switch (st) {
    case DDL_ERR_MISMATCH: cls = MismatchError; break;
    case DDL_ERR_TIMEOUT: cls = DDLTimeoutError; break;
    case DDL_ERR_PEER_LOST: cls = PeerLostError; break;
    case DDL_ERR_NOT_INITIALIZED: cls = NotInitializedError; break;
    case DDL_ERR_INVALID_ARG: cls = InvalidArgumentError; break;
    default: break;
    }
    PyErr_SetString(cls, ddl_last_error());
    return NULL;
}


/* init() on MPI_COMM_WORLD, or init(mpi_handle): on a duplicate of that communicator. */
static PyObject *py_init(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *h = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &h)) return NULL;
    if (h == Py_None) {
        CALL(ddl_init());
    } else {
        long long v = PyLong_AsLongLong(h);
        if (v == -1 && PyErr_Occurred()) return NULL;
        CALL(ddl_init_comm((intptr_t)v));
    }
    Py_RETURN_NONE;
}

static PyObject *py_fault_tolerant(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    int on = 0;
    ddl_status_t st = ddl_fault_tolerant(&on);
    if (st != DDL_SUCCESS) return raise_status(st);
    return PyBool_FromLong(on);
}

static PyObject *py_finalize(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    CALL(ddl_finalize());
    Py_RETURN_NONE;
}

/* The atexit handler's finalize: MPI_Finalize is left to exit(), for status 0 only. */
extern ddl_status_t ddl_finalize_at_exit(void);
static PyObject *py_finalize_at_exit(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    CALL(ddl_finalize_at_exit());
    Py_RETURN_NONE;
}

static PyObject *py_initialized(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyBool_FromLong(ddl_initialized());
}

#define INT_GETTER(name, fn)                                                              \
    static PyObject *name(PyObject *self, PyObject *args) {                               \
        (void)self, (void)args;                                                           \
        int v;                                                                            \
        ddl_status_t st = fn(&v);                                                         \
        if (st != DDL_SUCCESS) return raise_status(st);                                   \
        return PyLong_FromLong(v);                                                        \
    }
INT_GETTER(py_rank, ddl_rank)
INT_GETTER(py_size, ddl_size)
INT_GETTER(py_local_rank, ddl_local_rank)
INT_GETTER(py_local_size, ddl_local_size)

PyObject *grid_tuple(ddl_status_t st, int n, const int *dims) {
    if (st != DDL_SUCCESS) return raise_status(st);
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) PyTuple_SET_ITEM(t, i, PyLong_FromLong(dims[i]));
    return t;
}

static PyObject *py_topology(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    int n = 0, dims[DDL_MAX_LEVELS];
    ddl_status_t st = ddl_topology(&n, dims);
    return grid_tuple(st, n, dims);
}

int int_arg(PyObject *o, int *out) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "%ld does not fit a C int", v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* ---- tuning ------------------------------------------------------------------------------ */

static PyObject *py_set_algorithm(PyObject *self, PyObject *args) {
    (void)self;
    int a;
    if (!PyArg_ParseTuple(args, "i", &a)) return NULL;
    CALL(ddl_set_algorithm((ddl_algo_t)a));
    Py_RETURN_NONE;
}

static PyObject *py_plan(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long bytes;
    if (!PyArg_ParseTuple(args, "K", &bytes)) return NULL;
    ddl_algo_t algos[DDL_MAX_LEVELS];
    double t;
    int n, dims[DDL_MAX_LEVELS];
    CALL(ddl_plan((size_t)bytes, algos, &t));
    CALL(ddl_topology(&n, dims));
    PyObject *names = PyTuple_New(n);
    for (int i = 0; i < n; i++) PyTuple_SET_ITEM(names, i, PyUnicode_FromString(ddl_algo_name(algos[i])));
    return Py_BuildValue("(Nd)", names, t);
}

static PyObject *py_set_level_cost(PyObject *self, PyObject *args) {
    (void)self;
    int level;
    double a, b;
    if (!PyArg_ParseTuple(args, "idd", &level, &a, &b)) return NULL;
    CALL(ddl_set_level_cost(level, a, b));
    Py_RETURN_NONE;
}

static PyObject *py_get_level_cost(PyObject *self, PyObject *args) {
    (void)self;
    int level;
    double a, b;
    if (!PyArg_ParseTuple(args, "i", &level)) return NULL;
    CALL(ddl_get_level_cost(level, &a, &b));
    return Py_BuildValue("(dd)", a, b);
}

static PyObject *py_set_fusion(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long threshold;
    double cycle_ms;
    if (!PyArg_ParseTuple(args, "Kd", &threshold, &cycle_ms)) return NULL;
    CALL(ddl_set_fusion((size_t)threshold, cycle_ms));
    Py_RETURN_NONE;
}

static PyObject *py_async_stats(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    uint64_t b, fb, fr;
    CALL(ddl_async_stats(&b, &fb, &fr));
    return Py_BuildValue("{s:K,s:K,s:K}", "batches", (unsigned long long)b, "fused_buffers",
                         (unsigned long long)fb, "fused_requests", (unsigned long long)fr);
}

static PyObject *py_negotiation_stats(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    uint64_t c, f, n, p, w;
    CALL(ddl_negotiation_stats(&c, &f, &n, &p));
    CALL(ddl_waiter_stats(&w));
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K}", "cycles", (unsigned long long)c,
                         "full_cycles", (unsigned long long)f, "names", (unsigned long long)n,
                         "pending", (unsigned long long)p, "waiter_cycles",
                         (unsigned long long)w);
}

/* join() -> the rank that joined last (ddl_join). */
static PyObject *py_join(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    int last = -1;
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_join(&last);
    Py_END_ALLOW_THREADS if (st != DDL_SUCCESS) return raise_status(st);
    return PyLong_FromLong(last);
}

/* hurry(): the caller blocks on a queued request next (ddl_progress_hurry). */
static PyObject *py_hurry(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    Py_BEGIN_ALLOW_THREADS ddl_progress_hurry();
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* set_thread_timeout(seconds) -> the previous setting (0.0: DDL_TIMEOUT). */
static PyObject *py_set_thread_timeout(PyObject *self, PyObject *args) {
    (void)self;
    double t;
    if (!PyArg_ParseTuple(args, "d", &t)) return NULL;
    double prev = ddl_thread_timeout();
    ddl_status_t st = ddl_set_thread_timeout(t);
    if (st != DDL_SUCCESS) return raise_status(st);
    return PyFloat_FromDouble(prev);
}

/* The liveness checks on or off in this process, for python -m ddl_core.bench liveness. */
extern int ddl_live_checks;
static PyObject *py_set_liveness_checks(PyObject *self, PyObject *args) {
    (void)self;
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    ddl_live_checks = on;
    Py_RETURN_NONE;
}

/* parse_number(name, text, lo, hi, integer) -> float: libddl's number rule (config.c). */
static PyObject *py_parse_number(PyObject *self, PyObject *args) {
    (void)self;
    const char *name, *text;
    double lo, hi, v = 0;
    int integer;
    if (!PyArg_ParseTuple(args, "ssddp", &name, &text, &lo, &hi, &integer)) return NULL;
    ddl_status_t st = ddl_parse_number(name, text, lo, hi, integer, &v);
    if (st != DDL_SUCCESS) return raise_status(st);
    return PyFloat_FromDouble(v);
}

/* check_setting(name, text) -> float, or None for a name libddl does not read. */
static PyObject *py_check_setting(PyObject *self, PyObject *args) {
    (void)self;
    const char *name, *text;
    int known = 0;
    double v = 0;
    if (!PyArg_ParseTuple(args, "ss", &name, &text)) return NULL;
    ddl_status_t st = ddl_check_setting(name, text, &known, &v);
    if (st != DDL_SUCCESS) return raise_status(st);
    if (!known) Py_RETURN_NONE;
    return PyFloat_FromDouble(v);
}

static PyObject *py_version(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyUnicode_FromString(ddl_version_string());
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, NULL},
    {"fault_tolerant", py_fault_tolerant, METH_NOARGS, NULL},
    {"finalize", py_finalize, METH_NOARGS, NULL},
    {"_finalize_at_exit", py_finalize_at_exit, METH_NOARGS, NULL},
    {"initialized", py_initialized, METH_NOARGS, NULL},
    {"rank", py_rank, METH_NOARGS, NULL},
    {"size", py_size, METH_NOARGS, NULL},
    {"local_rank", py_local_rank, METH_NOARGS, NULL},
    {"local_size", py_local_size, METH_NOARGS, NULL},
    {"topology", py_topology, METH_NOARGS, NULL},
    {"set_algorithm", py_set_algorithm, METH_VARARGS, NULL},
    {"plan", py_plan, METH_VARARGS, NULL},
    {"set_level_cost", py_set_level_cost, METH_VARARGS, NULL},
    {"get_level_cost", py_get_level_cost, METH_VARARGS, NULL},
    {"set_fusion", py_set_fusion, METH_VARARGS, NULL},
    {"version", py_version, METH_NOARGS, NULL},
    {"parse_number", py_parse_number, METH_VARARGS, NULL},
    {"check_setting", py_check_setting, METH_VARARGS, NULL},
    {"async_stats", py_async_stats, METH_NOARGS, NULL},
    {"negotiation_stats", py_negotiation_stats, METH_NOARGS, NULL},
    {"set_thread_timeout", py_set_thread_timeout, METH_VARARGS, NULL},
    {"hurry", py_hurry, METH_NOARGS, NULL},
    {"join", py_join, METH_NOARGS, NULL},
    {"_set_liveness_checks", py_set_liveness_checks, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_ddl", NULL, -1, methods,
                                       NULL, NULL, NULL, NULL};

static PyObject *new_error(PyObject *m, const char *name, PyObject *bases, const char *doc) {
    char full[128];
    snprintf(full, sizeof full, "ddl_core.%s", name);
    PyObject *cls = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    if (cls && PyModule_AddObjectRef(m, name, cls) < 0) Py_CLEAR(cls);
    return cls;
}

/* libddl's names for codes 0..n-1 of one of ddl.h's enums, as a tuple: Python restates
 * none of them (ddl_core/_buffers.py builds its code tables from these). */
static int add_names(PyObject *m, const char *attr, int n, const char *(*name)(int)) {
    PyObject *t = PyTuple_New(n);
    if (!t) return -1;
    for (int i = 0; i < n; i++) {
        PyObject *s = PyUnicode_FromString(name(i));
        if (!s) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    int rc = PyModule_AddObjectRef(m, attr, t);
    Py_DECREF(t);
    return rc;
}

static const char *op_name(int i) { return ddl_op_name((ddl_op_t)i); }
static const char *dtype_name(int i) { return ddl_dtype_name((ddl_dtype_t)i); }
static const char *algo_name(int i) { return ddl_algo_name((ddl_algo_t)i); }

static int add_errors(PyObject *m) {
    DDLError = new_error(m, "DDLError", PyExc_RuntimeError, "A libddl call failed.");
    if (!DDLError) return -1;
    PyObject *b = PyTuple_Pack(1, DDLError);
    if (!b) return -1;
    MismatchError = new_error(m, "MismatchError", b,
                              "Ranks disagreed on a collective's count, dtype, op or root.");
    NotInitializedError = new_error(m, "NotInitializedError", b,
                                    "Used before ddl_core.init() or after finalize().");
    Py_DECREF(b);
    b = PyTuple_Pack(2, DDLError, PyExc_TimeoutError);
    if (!b) return -1;
    DDLTimeoutError = new_error(m, "DDLTimeoutError", b, "A peer did not answer in DDL_TIMEOUT.");
    Py_DECREF(b);
    if (!DDLTimeoutError) return -1;
    b = PyTuple_Pack(1, DDLTimeoutError);
    if (!b) return -1;
    PeerLostError = new_error(m, "PeerLostError", b,
                              "A peer exited, died or finalized while this rank waited for it "
                              "(reported at once; a DDLTimeoutError so code written for the "
                              "deadline catches it too).");
    Py_DECREF(b);
    b = PyTuple_Pack(1, PeerLostError);
    if (!b) return -1;
    ProcessFailedError = new_error(m, "ProcessFailedError", b,
                                   "Fault-tolerant mode (ULFM): a member of the communicator "
                                   "failed; .ranks names the failed members (ranks of that "
                                   "communicator). comm.shrink() / ddl_core.shrink_world() "
                                   "go on without them.");
    Py_DECREF(b);
    if (!ProcessFailedError) return -1;
    b = PyTuple_Pack(2, DDLError, PyExc_ValueError);
    if (!b) return -1;
    InvalidArgumentError = new_error(m, "InvalidArgumentError", b, "A bad dtype, op or argument.");
    Py_DECREF(b);
    return MismatchError && NotInitializedError && PeerLostError && InvalidArgumentError ? 0 : -1;
}

PyMODINIT_FUNC PyInit__ddl(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    if (add_errors(m) < 0 || PyModule_AddFunctions(m, py_comm_methods) < 0 ||
        PyModule_AddFunctions(m, py_request_methods) < 0 ||
        PyModule_AddFunctions(m, py_device_methods) < 0 || py_request_ready(m) < 0 ||
        PyModule_AddIntConstant(m, "MAX_LEVELS", DDL_MAX_LEVELS) < 0 ||
        PyModule_AddIntConstant(m, "UNDEFINED", DDL_UNDEFINED) < 0 ||
        add_names(m, "OPS", DDL_NUM_OPS, op_name) < 0 ||
        add_names(m, "DTYPES", DDL_NUM_DTYPES, dtype_name) < 0 ||
        add_names(m, "ALGORITHMS", DDL_NUM_ALGOS, algo_name) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

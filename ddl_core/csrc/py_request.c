/* ddl_core._ddl: Request, a libddl request in flight (an asynchronous collective on a
 * communicator's queue, or an isend/irecv), and the calls that start one, one per
 * collective. A Request holds the user's buffers until it finishes, keeps its outcome (an
 * allgatherv's result, its timing, its error) and frees libddl's request. */
#include "py_ddl.h"

typedef struct {
    PyObject_HEAD ddl_request_t req;
    Py_buffer send, recv;
    int have_send, have_recv;
    int finished;
    int gathers;        /* an allgatherv: its result is copied out when it finishes */
    size_t es;          /* element size */
    int size;           /* ranks of the communicator it was submitted on */
    PyObject *gathered; /* allgatherv: (bytearray of the result, tuple of counts) */
    PyObject *error;    /* the exception it failed with: every later test()/wait() raises it */
    ddl_request_timing_t timing; /* kept when it finished */
    int have_timing;
    int waiters;            /* threads inside ddl_wait on it (the GIL released) */
    ddl_request_t orphan;   /* finished while others still wait: the last of them frees it */
} RequestObject;

static PyTypeObject RequestType;

/* An allgatherv's result lives in libddl's request: copy it out before the request goes. */
static int keep_gathered(RequestObject *r) {
    const void *buf;
    const size_t *counts;
    int size = r->size;
    if (ddl_request_gathered(r->req, &buf, &counts) != DDL_SUCCESS) return 0;
    size_t total = 0;
    PyObject *tup = PyTuple_New(size);
    if (!tup) return -1;
    for (int i = 0; i < size; i++) {
        total += counts[i];
        PyTuple_SET_ITEM(tup, i, PyLong_FromSize_t(counts[i]));
    }
    PyObject *data = PyByteArray_FromStringAndSize(buf, (Py_ssize_t)(total * r->es));
    if (!data) {
        Py_DECREF(tup);
        return -1;
    }
    r->gathered = PyTuple_Pack(2, data, tup);
    Py_DECREF(data);
    Py_DECREF(tup);
    return r->gathered ? 0 : -1;
}

static void request_release(RequestObject *r) {
    if (r->req) {
        ddl_request_t q = r->req;
        r->req = NULL;
        if (r->waiters) {
            r->orphan = q; /* another thread is inside ddl_wait(q): it frees q on return */
        } else {
            Py_BEGIN_ALLOW_THREADS ddl_request_free(q); /* waits if still pending */
            Py_END_ALLOW_THREADS
        }
    }
    if (r->have_send) PyBuffer_Release(&r->send);
    if (r->have_recv) PyBuffer_Release(&r->recv);
    r->have_send = r->have_recv = 0;
}

static void request_dealloc(RequestObject *r) {
    request_release(r);
    Py_CLEAR(r->gathered);
    Py_CLEAR(r->error);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* The request finished (done): keep what it produced, release it, raise its error. Its
 * outcome (finished, error) is set before the release, which may let other threads run. */
static PyObject *request_done(RequestObject *r, ddl_status_t st) {
    r->have_timing = r->req && ddl_request_timing(r->req, &r->timing) == DDL_SUCCESS;
    int kept = st == DDL_SUCCESS && r->gathers ? keep_gathered(r) : 0;
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (st != DDL_SUCCESS) {
        raise_status(st);
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        Py_XINCREF(value);
        r->error = value;
    }
    r->finished = 1;
    request_release(r);
    if (type) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (kept < 0) return NULL;
    return (PyObject *)r; /* borrowed: a non-NULL marker */
}

/* A finished request that failed raises its error again. */
static PyObject *request_reraise(RequestObject *r) {
    PyErr_SetObject(PyExceptionInstance_Class(r->error), r->error);
    return NULL;
}

static PyObject *request_test(RequestObject *r, PyObject *noargs) {
    (void)noargs;
    if (r->finished && r->error) return request_reraise(r);
    if (r->finished) Py_RETURN_TRUE;
    int done = 0;
    ddl_status_t st = ddl_test(r->req, &done);
    if (done) {
        if (!request_done(r, st)) return NULL;
        Py_RETURN_TRUE;
    }
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_FALSE;
}

static PyObject *request_wait(RequestObject *r, PyObject *noargs) {
    (void)noargs;
    if (r->finished && r->error) return request_reraise(r);
    if (r->finished) Py_RETURN_NONE;
    ddl_status_t st;
    ddl_request_t q = r->req;
    r->waiters++; /* (two threads may wait on one request: q lives until both are back) */
    Py_BEGIN_ALLOW_THREADS st = ddl_wait(q);
    Py_END_ALLOW_THREADS
    if (--r->waiters == 0 && r->orphan) {
        ddl_request_t o = r->orphan;
        r->orphan = NULL;
        Py_BEGIN_ALLOW_THREADS ddl_request_free(o); /* (finished: nothing to wait for) */
        Py_END_ALLOW_THREADS
    }
    if (r->finished) { /* another waiter saw it finish first */
        if (r->error) return request_reraise(r);
        Py_RETURN_NONE;
    }
    if (!request_done(r, st)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *request_timing(RequestObject *r, PyObject *noargs) {
    (void)noargs;
    if (!r->have_timing) Py_RETURN_NONE;
    const ddl_request_timing_t *t = &r->timing;
    return Py_BuildValue("ddddnn", t->submitted, t->negotiated, t->started, t->finished,
                         (Py_ssize_t)t->fused, (Py_ssize_t)t->fused_bytes);
}

static PyObject *request_gathered(RequestObject *r, PyObject *noargs) {
    (void)noargs;
    if (!r->gathered) {
        PyErr_SetString(PyExc_ValueError, "gathered(): only a finished allgatherv has a result");
        return NULL;
    }
    return Py_NewRef(r->gathered);
}

static PyMethodDef request_methods[] = {
    {"test", (PyCFunction)request_test, METH_NOARGS, "True once finished (raises its error)."},
    {"wait", (PyCFunction)request_wait, METH_NOARGS, "Block until finished (raises its error)."},
    {"timing", (PyCFunction)request_timing, METH_NOARGS,
     "(submitted, negotiated, started, finished, fused, fused_bytes) once finished, else "
     "None; times in CLOCK_MONOTONIC seconds."},
    {"gathered", (PyCFunction)request_gathered, METH_NOARGS,
     "An allgatherv's result once finished: (bytearray, per-rank element counts)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ddl_core._ddl.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_dealloc = (destructor)request_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An asynchronous collective in flight; keeps its buffers alive until done.",
    .tp_methods = request_methods,
};

int py_request_ready(PyObject *module) {
    if (PyType_Ready(&RequestType) < 0) return -1;
    return PyModule_AddObjectRef(module, "Request", (PyObject *)&RequestType);
}

/* ---- starting one ------------------------------------------------------------------------ */

/* A new Request on communicator c (its size kept for an allgatherv's counts) that will
 * hold `send` (None: in place / none) and `recv` (None: none); NULL with an error set. */
static RequestObject *request_new(ddl_comm_t c, int dtype, PyObject *send, PyObject *recv) {
    int size = 0;
    ddl_status_t st = ddl_comm_size(c, &size);
    if (st != DDL_SUCCESS) return (RequestObject *)raise_status(st);
    RequestObject *r = PyObject_New(RequestObject, &RequestType);
    if (!r) return NULL;
    r->req = NULL;
    r->have_send = r->have_recv = r->finished = r->gathers = 0;
    r->es = ddl_dtype_size((ddl_dtype_t)dtype);
    r->size = size;
    r->gathered = NULL;
    r->error = NULL;
    r->have_timing = r->waiters = 0;
    r->orphan = NULL;
    size_t n;
    if (recv != Py_None) {
        if (get_buf(recv, &r->recv, 1, dtype, &n, "the output") < 0) goto fail;
        r->have_recv = 1;
    }
    if (send != Py_None && send != recv) {
        if (get_buf(send, &r->send, 0, dtype, &n, "the input") < 0) goto fail;
        r->have_send = 1;
    }
    return r;
fail:
    Py_DECREF(r);
    return NULL;
}

static size_t count_of(const Py_buffer *v, int have, const RequestObject *r) {
    return have && r->es ? (size_t)v->len / r->es : 0;
}
#define SEND_N(r) count_of(&(r)->send, (r)->have_send, r)
#define RECV_N(r) count_of(&(r)->recv, (r)->have_recv, r)
#define SEND_P(r) ((r)->have_send ? (const void *)(r)->send.buf : DDL_IN_PLACE)
#define RECV_P(r) ((r)->have_recv ? (r)->recv.buf : NULL)

/* Its matching (name=, shape=): NULL for an unnamed request without a shape. */
typedef struct {
    ddl_match_t m;
    int64_t dims[32];
} match_t;

static int match_get(match_t *mt, const char *name, PyObject *shape, const ddl_match_t **out) {
    mt->m = (ddl_match_t){name, 0, NULL};
    *out = NULL;
    if (shape != Py_None) {
        PyObject *seq = PySequence_Fast(shape, "shape must be a sequence of ints");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > 32) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "shape has %zd dimensions (at most 32)", n);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            mt->dims[i] = (int64_t)v;
        }
        Py_DECREF(seq);
        mt->m.ndim = (int)n;
        mt->m.shape = mt->dims;
    }
    if (name || shape != Py_None) *out = &mt->m;
    return 0;
}

/* Start it without the GIL: the Request, or NULL with the call's error raised. */
#define START(r, expr)                                                                    \
    do {                                                                                  \
        ddl_status_t st_;                                                                 \
        Py_BEGIN_ALLOW_THREADS st_ = (expr);                                              \
        Py_END_ALLOW_THREADS if (st_ != DDL_SUCCESS) {                                    \
            (r)->req = NULL;                                                              \
            Py_DECREF(r);                                                                 \
            return raise_status(st_);                                                     \
        }                                                                                 \
        return (PyObject *)(r);                                                           \
    } while (0)

static PyObject *refuse(RequestObject *r, const char *fmt, size_t a, size_t b) {
    PyErr_Format(PyExc_ValueError, fmt, a, b);
    Py_DECREF(r);
    return NULL;
}

/* The arguments every asynchronous collective takes after its own: name=, shape=. */
#define MATCH_KW "name", "shape", NULL

/* What iallreduce, iallgather and ireduce_scatter take: (handle, send or None, recv, dtype[,
 * op], name=None, shape=None); the Request holding the buffers, or NULL with the error. */
typedef struct {
    ddl_comm_t c;
    int dtype, op;
    match_t mt;
    const ddl_match_t *m;
} start_t;

static RequestObject *start_args(PyObject *args, PyObject *kw, int with_op, start_t *a) {
    static char *with[] = {"handle", "send", "recv", "dtype", "op", MATCH_KW};
    static char *without[] = {"handle", "send", "recv", "dtype", MATCH_KW};
    unsigned long long h;
    PyObject *send, *recv, *shape = Py_None;
    const char *name = NULL;
    a->op = 0;
    int ok = with_op ? PyArg_ParseTupleAndKeywords(args, kw, "KOOii|zO", with, &h, &send, &recv,
                                                   &a->dtype, &a->op, &name, &shape)
                     : PyArg_ParseTupleAndKeywords(args, kw, "KOOi|zO", without, &h, &send,
                                                   &recv, &a->dtype, &name, &shape);
    if (!ok || match_get(&a->mt, name, shape, &a->m) < 0) return NULL;
    a->c = handle_of(h);
    return request_new(a->c, a->dtype, send, recv);
}

static PyObject *py_iallreduce(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    start_t a;
    RequestObject *r = start_args(args, kw, 1, &a);
    if (!r) return NULL;
    if (r->have_send && SEND_N(r) != RECV_N(r))
        return refuse(r, "input has %zu elements but output %zu", SEND_N(r), RECV_N(r));
    START(r, ddl_comm_iallreduce(a.c, SEND_P(r), RECV_P(r), RECV_N(r), (ddl_dtype_t)a.dtype,
                                 (ddl_op_t)a.op, a.m, &r->req));
}

/* ibroadcast(handle, buf, dtype, root, name=None, shape=None) -> Request */
static PyObject *py_ibroadcast(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "buf", "dtype", "root", MATCH_KW};
    unsigned long long h;
    PyObject *buf, *shape = Py_None;
    int dtype, root;
    const char *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KOii|zO", kwlist, &h, &buf, &dtype, &root, &name,
                                     &shape))
        return NULL;
    match_t mt;
    const ddl_match_t *m;
    if (match_get(&mt, name, shape, &m) < 0) return NULL;
    RequestObject *r = request_new(handle_of(h), dtype, Py_None, buf);
    if (!r) return NULL;
    START(r, ddl_comm_ibroadcast(handle_of(h), RECV_P(r), RECV_N(r), (ddl_dtype_t)dtype, root, m,
                                 &r->req));
}

/* The two buffers of an allgather / reduce_scatter: `big` holds size x `small`. */
static int times_size(RequestObject *r, size_t small, size_t big) {
    if (r->have_send && big == small * (size_t)r->size) return 0;
    PyErr_Format(PyExc_ValueError, "the larger buffer must hold size (%d) x the smaller",
                 r->size);
    Py_DECREF(r);
    return -1;
}

/* iallgather (recv holds size x len(send)) and ireduce_scatter (send holds size x
 * len(recv), and an op). */
static PyObject *gather_like(PyObject *args, PyObject *kw, int scatter) {
    start_t a;
    RequestObject *r = start_args(args, kw, scatter, &a);
    if (!r) return NULL;
    size_t small = scatter ? RECV_N(r) : SEND_N(r);
    if (times_size(r, small, scatter ? SEND_N(r) : RECV_N(r)) < 0) return NULL;
    ddl_dtype_t dt = (ddl_dtype_t)a.dtype;
    START(r, scatter ? ddl_comm_ireduce_scatter(a.c, SEND_P(r), RECV_P(r), small, dt,
                                                (ddl_op_t)a.op, a.m, &r->req)
                     : ddl_comm_iallgather(a.c, SEND_P(r), RECV_P(r), small, dt, a.m, &r->req));
}

static PyObject *py_iallgather(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return gather_like(args, kw, 0);
}

static PyObject *py_ireduce_scatter(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return gather_like(args, kw, 1);
}

/* iallgatherv(handle, send, dtype, name=None, shape=None) -> Request; the result comes
 * from Request.gathered() once it finished. */
static PyObject *py_iallgatherv(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "send", "dtype", MATCH_KW};
    unsigned long long h;
    PyObject *send, *shape = Py_None;
    int dtype;
    const char *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KOi|zO", kwlist, &h, &send, &dtype, &name,
                                     &shape))
        return NULL;
    match_t mt;
    const ddl_match_t *m;
    if (match_get(&mt, name, shape, &m) < 0) return NULL;
    RequestObject *r = request_new(handle_of(h), dtype, send, Py_None);
    if (!r) return NULL;
    r->gathers = 1;
    START(r, ddl_comm_iallgatherv(handle_of(h), SEND_P(r), SEND_N(r), (ddl_dtype_t)dtype, m,
                                  &r->req));
}

/* isend(handle, buf, dtype, dest, tag) -> Request: the buffer stays untouched until done;
 * irecv(handle, buf, dtype, source, tag) -> Request: the buffer is unread until done. */
static PyObject *p2p_start(PyObject *args, int sending) {
    unsigned long long h;
    PyObject *buf;
    int dtype, peer, tag;
    if (!PyArg_ParseTuple(args, "KOiii", &h, &buf, &dtype, &peer, &tag)) return NULL;
    RequestObject *r = request_new(handle_of(h), dtype, sending ? buf : Py_None,
                                   sending ? Py_None : buf);
    if (!r) return NULL;
    ddl_comm_t c = handle_of(h);
    ddl_dtype_t dt = (ddl_dtype_t)dtype;
    START(r, sending ? ddl_comm_isend(c, r->send.buf, SEND_N(r), dt, peer, tag, &r->req)
                     : ddl_comm_irecv(c, r->recv.buf, RECV_N(r), dt, peer, tag, &r->req));
}

static PyObject *py_isend(PyObject *self, PyObject *args) {
    (void)self;
    return p2p_start(args, 1);
}

static PyObject *py_irecv(PyObject *self, PyObject *args) {
    (void)self;
    return p2p_start(args, 0);
}

#define KWARGS(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

PyMethodDef py_request_methods[] = {
    {"iallreduce", KWARGS(py_iallreduce),
     "iallreduce(handle, send or None, recv, dtype, op, name=None, shape=None) -> Request"},
    {"ibroadcast", KWARGS(py_ibroadcast),
     "ibroadcast(handle, buf, dtype, root, name=None, shape=None) -> Request"},
    {"iallgather", KWARGS(py_iallgather),
     "iallgather(handle, send, recv, dtype, name=None, shape=None) -> Request"},
    {"ireduce_scatter", KWARGS(py_ireduce_scatter),
     "ireduce_scatter(handle, send, recv, dtype, op, name=None, shape=None) -> Request"},
    {"iallgatherv", KWARGS(py_iallgatherv),
     "iallgatherv(handle, send, dtype, name=None, shape=None) -> Request (result: gathered())"},
    {"isend", py_isend, METH_VARARGS, "isend(handle, buf, dtype, dest, tag) -> Request"},
    {"irecv", py_irecv, METH_VARARGS, "irecv(handle, buf, dtype, source, tag) -> Request"},
    {NULL, NULL, 0, NULL}};

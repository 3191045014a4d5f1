/* ddl_core._ddl: the CPython binding of libddl.
 *
 * Written against the C API directly (no ctypes, no Cython) because the latency of a small
 * allreduce is part of DDL's promise: this layer takes buffer-protocol objects, checks
 * them, releases the GIL and calls libddl, adding well under a microsecond. Dtypes are
 * passed as libddl's codes by the Python layer (ddl_core/_buffers.py), which knows numpy,
 * torch and plain buffers; errors become the exception classes defined here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>

#include "ddl.h"

static PyObject *DDLError, *MismatchError, *DDLTimeoutError, *NotInitializedError,
    *InvalidArgumentError, *PeerLostError;

static PyObject *raise_status(ddl_status_t st) {
    PyObject *cls = DDLError;
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

#define CALL(expr)                                                                        \
    do {                                                                                  \
        ddl_status_t st_;                                                                 \
        Py_BEGIN_ALLOW_THREADS st_ = (expr);                                              \
        Py_END_ALLOW_THREADS if (st_ != DDL_SUCCESS) return raise_status(st_);            \
    } while (0)

static int get_buf(PyObject *obj, Py_buffer *view, int writable, int dtype, size_t *count,
                   const char *what) {
    size_t es = ddl_dtype_size((ddl_dtype_t)dtype);
    if (es == 0) {
        PyErr_Format(InvalidArgumentError, "unknown dtype code %d", dtype);
        return -1;
    }
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "%s must be a C-contiguous%s buffer (numpy array, torch CPU tensor, "
                     "bytearray...): make it contiguous first, e.g. np.ascontiguousarray(x) or "
                     "x.contiguous()",
                     what, writable ? ", writable" : "");
        return -1;
    }
    if ((size_t)view->len % es) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not a whole number of %zu-byte "
                     "elements", what, view->len, es);
        PyBuffer_Release(view);
        return -1;
    }
    *count = (size_t)view->len / es;
    return 0;
}

static PyObject *py_init(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    CALL(ddl_init());
    Py_RETURN_NONE;
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

/* A grid (ddl_topology, ddl_comm_topology) as a tuple, or the call's error raised. */
static PyObject *grid_tuple(ddl_status_t st, int n, const int *dims) {
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

/* An int argument of a METH_FASTCALL function, or -1 with an exception set. */
static int int_arg(PyObject *o, int *out) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "%ld does not fit a C int", v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* allreduce(send or None, recv, dtype, op): None means in place on recv. METH_FASTCALL
 * (no argument tuple): the world's 8-byte allreduce is mostly the layers above MPI. */
static PyObject *py_allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int dtype, op;
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "allreduce(send or None, recv, dtype, op) takes 4 "
                            "arguments, not %zd", nargs);
    if (int_arg(args[2], &dtype) < 0 || int_arg(args[3], &op) < 0) return NULL;
    PyObject *send = args[0], *recv = args[1];
    Py_buffer rv, sv;
    size_t rcount, scount;
    if (get_buf(recv, &rv, 1, dtype, &rcount, "the output") < 0) return NULL;
    const void *sptr = DDL_IN_PLACE;
    int have_send = send != Py_None && send != recv;
    if (have_send) {
        if (get_buf(send, &sv, 0, dtype, &scount, "the input") < 0) {
            PyBuffer_Release(&rv);
            return NULL;
        }
        if (scount != rcount) {
            PyBuffer_Release(&rv);
            PyBuffer_Release(&sv);
            return PyErr_Format(PyExc_ValueError, "input has %zu elements but output %zu",
                                scount, rcount);
        }
        sptr = sv.buf;
    }
    ddl_status_t st;
    void *rptr = rv.buf;
    Py_BEGIN_ALLOW_THREADS st = ddl_allreduce(sptr, rptr, rcount, (ddl_dtype_t)dtype, (ddl_op_t)op);
    Py_END_ALLOW_THREADS
    if (have_send) PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *py_broadcast(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf;
    int dtype, root;
    if (!PyArg_ParseTuple(args, "Oii", &buf, &dtype, &root)) return NULL;
    Py_buffer v;
    size_t count;
    if (get_buf(buf, &v, 1, dtype, &count, "the buffer") < 0) return NULL;
    ddl_status_t st;
    void *ptr = v.buf;
    Py_BEGIN_ALLOW_THREADS st = ddl_broadcast(ptr, count, (ddl_dtype_t)dtype, root);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_NONE;
}

/* Shared by allgather and reduce_scatter: the small side and the size-times side. */
static PyObject *gather_like(PyObject *args, int scatter) {
    PyObject *send, *recv;
    int dtype, op = 0;
    if (scatter ? !PyArg_ParseTuple(args, "OOii", &send, &recv, &dtype, &op)
                : !PyArg_ParseTuple(args, "OOi", &send, &recv, &dtype))
        return NULL;
    int size;
    ddl_status_t st = ddl_size(&size);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_buffer sv, rv;
    size_t scount, rcount;
    if (get_buf(send, &sv, 0, dtype, &scount, "the input") < 0) return NULL;
    if (get_buf(recv, &rv, 1, dtype, &rcount, "the output") < 0) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    size_t small = scatter ? rcount : scount, big = scatter ? scount : rcount;
    if (big != small * (size_t)size) {
        PyBuffer_Release(&sv);
        PyBuffer_Release(&rv);
        return PyErr_Format(PyExc_ValueError,
                            "%s: the %s must hold size (%d) x %zu = %zu elements, not %zu",
                            scatter ? "reduce_scatter" : "allgather",
                            scatter ? "input" : "output", size, small, small * (size_t)size, big);
    }
    const void *sp = sv.buf;
    void *rp = rv.buf;
    Py_BEGIN_ALLOW_THREADS st = scatter ? ddl_reduce_scatter(sp, rp, rcount, (ddl_dtype_t)dtype,
                                                             (ddl_op_t)op)
                                        : ddl_allgather(sp, rp, scount, (ddl_dtype_t)dtype);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *py_allgather(PyObject *self, PyObject *args) {
    (void)self;
    return gather_like(args, 0);
}
static PyObject *py_reduce_scatter(PyObject *self, PyObject *args) {
    (void)self;
    return gather_like(args, 1);
}

/* counts from a Python sequence of `p` non-negative ints (malloc'ed), or NULL with an error */
static size_t *counts_of(PyObject *seq, int p, const char *what) {
    PyObject *fast = PySequence_Fast(seq, "counts must be a sequence of ints");
    if (!fast) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != p) {
        PyErr_Format(PyExc_ValueError, "%s: %zd counts for %d ranks: give one per rank", what,
                     PySequence_Fast_GET_SIZE(fast), p);
        Py_DECREF(fast);
        return NULL;
    }
    size_t *c = PyMem_Malloc((size_t)(p ? p : 1) * sizeof *c);
    for (int i = 0; c && i < p; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "%s: count %lld for rank %d is negative", what,
                             v, i);
            PyMem_Free(c);
            c = NULL;
            break;
        }
        c[i] = (size_t)v;
    }
    Py_DECREF(fast);
    if (!c && !PyErr_Occurred()) PyErr_NoMemory();
    return c;
}

/* alltoall(send, recv, dtype): block i of send to rank i (each len(send)/size elements). */
static PyObject *py_alltoall(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *so, *ro;
    int dtype, p = 0;
    if (!PyArg_ParseTuple(args, "OOi", &so, &ro, &dtype)) return NULL;
    Py_buffer s, r;
    size_t sn, rn;
    if (get_buf(so, &s, 0, dtype, &sn, "alltoall input") < 0) return NULL;
    if (get_buf(ro, &r, 1, dtype, &rn, "alltoall output") < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    ddl_size(&p);
    if (p < 1) p = 1;
    if (sn != rn || sn % (size_t)p) {
        PyErr_Format(PyExc_ValueError, "alltoall: input and output must hold the same number "
                     "of elements, a multiple of the %d ranks (got %zu and %zu)", p, sn, rn);
        PyBuffer_Release(&s);
        PyBuffer_Release(&r);
        return NULL;
    }
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_alltoall(s.buf, r.buf, sn / (size_t)p, (ddl_dtype_t)dtype);
    Py_END_ALLOW_THREADS PyBuffer_Release(&s);
    PyBuffer_Release(&r);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_NONE;
}

/* alltoall_counts(sendcounts) -> tuple of recvcounts */
static PyObject *py_alltoall_counts(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *seq;
    int p = 0;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    ddl_size(&p);
    size_t *sc = counts_of(seq, p, "alltoall_counts");
    if (!sc) return NULL;
    size_t *rc = PyMem_Malloc((size_t)(p ? p : 1) * sizeof *rc);
    if (!rc) {
        PyMem_Free(sc);
        return PyErr_NoMemory();
    }
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_alltoall_counts(sc, rc);
    Py_END_ALLOW_THREADS PyMem_Free(sc);
    if (st != DDL_SUCCESS) {
        PyMem_Free(rc);
        return raise_status(st);
    }
    PyObject *out = PyTuple_New(p);
    for (int i = 0; out && i < p; i++) PyTuple_SET_ITEM(out, i, PyLong_FromSize_t(rc[i]));
    PyMem_Free(rc);
    return out;
}

/* alltoallv(send, sendcounts, recv, recvcounts, dtype) */
static PyObject *py_alltoallv(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *so, *sco, *ro, *rco;
    int dtype, p = 0;
    if (!PyArg_ParseTuple(args, "OOOOi", &so, &sco, &ro, &rco, &dtype)) return NULL;
    ddl_size(&p);
    size_t *sc = counts_of(sco, p, "alltoallv send counts"), *rc = NULL;
    if (sc) rc = counts_of(rco, p, "alltoallv receive counts");
    Py_buffer s, r;
    size_t sn = 0, rn = 0, want_s = 0, want_r = 0;
    int have_s = 0, have_r = 0;
    PyObject *res = NULL;
    if (!rc) goto done;
    if (get_buf(so, &s, 0, dtype, &sn, "alltoallv input") < 0) goto done;
    have_s = 1;
    if (get_buf(ro, &r, 1, dtype, &rn, "alltoallv output") < 0) goto done;
    have_r = 1;
    for (int i = 0; i < p; i++) want_s += sc[i], want_r += rc[i];
    if (want_s != sn || want_r > rn) {
        PyErr_Format(PyExc_ValueError, "alltoallv: the send counts add up to %zu elements and "
                     "the input holds %zu; the receive counts to %zu and the output holds %zu",
                     want_s, sn, want_r, rn);
        goto done;
    }
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_alltoallv(s.buf, sc, r.buf, rc, (ddl_dtype_t)dtype);
    Py_END_ALLOW_THREADS if (st != DDL_SUCCESS) {
        raise_status(st);
        goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    if (have_s) PyBuffer_Release(&s);
    if (have_r) PyBuffer_Release(&r);
    PyMem_Free(sc);
    PyMem_Free(rc);
    return res;
}

static PyObject *py_barrier(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    CALL(ddl_barrier());
    Py_RETURN_NONE;
}

/* ---- asynchronous requests ----------------------------------------------------------- */

typedef struct {
    PyObject_HEAD ddl_request_t req;
    Py_buffer send, recv;
    int have_send, have_recv;
    int finished;
    int kind;
    size_t es;          /* element size */
    int size;           /* ranks of the communicator it was submitted on */
    PyObject *gathered; /* allgatherv: (bytearray of the result, tuple of counts) */
    PyObject *error;    /* the exception it failed with: every later test()/wait() raises it */
    ddl_request_timing_t timing; /* kept when it finished */
    int have_timing;
    int waiters;            /* threads inside ddl_wait on it (the GIL released) */
    ddl_request_t orphan;   /* finished while others still wait: the last of them frees it */
} RequestObject;

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
    int kept = st == DDL_SUCCESS && r->kind == 4 ? keep_gathered(r) : 0;
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


/* ---- communicators: handles are the ddl_comm_t pointer as an integer, owned by
 * ddl_core.Comm (which never hands out a freed one). ---- */

static ddl_comm_t handle_of(unsigned long long h) { return (ddl_comm_t)(uintptr_t)h; }

static PyObject *handle_or_none(ddl_comm_t c) {
    if (!c) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)c);
}

static PyObject *py_comm_world(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    ddl_comm_t c = NULL;
    ddl_status_t st = ddl_comm_world(&c);
    if (st != DDL_SUCCESS) return raise_status(st);
    return handle_or_none(c);
}

static PyObject *py_comm_split(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    int color, key;
    if (!PyArg_ParseTuple(args, "Kii", &h, &color, &key)) return NULL;
    ddl_comm_t out = NULL;
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_comm_split(handle_of(h), color, key, &out);
    Py_END_ALLOW_THREADS
    if (st != DDL_SUCCESS) return raise_status(st);
    return handle_or_none(out);
}

static PyObject *py_comm_create(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "KO", &h, &seq)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "ranks must be a sequence of ints");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int *ranks = PyMem_Malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!ranks) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(ranks);
            Py_DECREF(fast);
            return NULL;
        }
        ranks[i] = v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : (int)v;
    }
    Py_DECREF(fast);
    ddl_comm_t out = NULL;
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_comm_create(handle_of(h), ranks, (int)n, &out);
    Py_END_ALLOW_THREADS
    PyMem_Free(ranks);
    if (st != DDL_SUCCESS) return raise_status(st);
    return handle_or_none(out);
}

static PyObject *py_comm_free(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    ddl_comm_t c = handle_of(h);
    ddl_status_t st = ddl_comm_free(&c);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *py_comm_set_timeout(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    double s;
    if (!PyArg_ParseTuple(args, "Kd", &h, &s)) return NULL;
    ddl_status_t st = ddl_comm_set_timeout(handle_of(h), s);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_NONE;
}

/* (rank, size, world ranks of the members) */
static PyObject *py_comm_info(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    ddl_comm_t c = handle_of(h);
    int rank, size;
    ddl_status_t st = ddl_comm_rank(c, &rank);
    if (st == DDL_SUCCESS) st = ddl_comm_size(c, &size);
    if (st != DDL_SUCCESS) return raise_status(st);
    PyObject *members = PyTuple_New(size);
    if (!members) return NULL;
    for (int i = 0; i < size; i++) {
        int w = 0;
        st = ddl_comm_world_rank(c, i, &w);
        if (st != DDL_SUCCESS) {
            Py_DECREF(members);
            return raise_status(st);
        }
        PyTuple_SET_ITEM(members, i, PyLong_FromLong(w));
    }
    return Py_BuildValue("iiN", rank, size, members);
}

static PyObject *py_comm_topology(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    int n = 0, dims[DDL_MAX_LEVELS];
    ddl_status_t st = ddl_comm_topology(handle_of(h), &n, dims);
    return grid_tuple(st, n, dims);
}

static int opt_buf(PyObject *o, Py_buffer *v, int writable, const void **p) {
    *p = NULL;
    v->obj = NULL;
    if (o == Py_None) return 0;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, v, flags) != 0) return -1;
    *p = v->buf;
    return 0;
}

enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_BARRIER, K_ALLTOALL,
       K_ALLTOALLV, K_ALLGATHERV, K_GATHER, K_SCATTER, K_REDUCE, K_SEND, K_RECV };

/* comm_op(kind, handle, send, recv, count, dtype, op, root_or_peer, tag, scounts, rcounts):
 * buffers are None or contiguous; sizes were checked by ddl_core (comm.py); counts are
 * uint64 arrays of the communicator's size. send None = in place. */
static PyObject *py_comm_op(PyObject *self, PyObject *args) {
    (void)self;
    int kind, dtype, op, root, tag;
    unsigned long long h, count;
    PyObject *so, *ro, *sco, *rco;
    if (!PyArg_ParseTuple(args, "iKOOKiiiiOO", &kind, &h, &so, &ro, &count, &dtype, &op, &root,
                          &tag, &sco, &rco))
        return NULL;
    Py_buffer sv, rv, scv, rcv;
    const void *sp, *rp, *scp, *rcp;
    if (opt_buf(so, &sv, 0, &sp) < 0) return NULL;
    if (opt_buf(ro, &rv, 1, &rp) < 0) goto fail1;
    if (opt_buf(sco, &scv, 0, &scp) < 0) goto fail2;
    if (opt_buf(rco, &rcv, 0, &rcp) < 0) goto fail3;
    ddl_comm_t c = handle_of(h);
    void *r = (void *)rp;
    size_t n = (size_t)count;
    ddl_dtype_t dt = (ddl_dtype_t)dtype;
    ddl_op_t o = (ddl_op_t)op;
    const void *s = sp ? sp : DDL_IN_PLACE;
    ddl_status_t st = DDL_SUCCESS;
    Py_BEGIN_ALLOW_THREADS switch (kind) {
    case K_ALLREDUCE: st = ddl_comm_allreduce(c, s, r, n, dt, o); break;
    case K_BROADCAST: st = ddl_comm_broadcast(c, r, n, dt, root); break;
    case K_ALLGATHER: st = ddl_comm_allgather(c, s, r, n, dt); break;
    case K_REDUCE_SCATTER: st = ddl_comm_reduce_scatter(c, s, r, n, dt, o); break;
    case K_BARRIER: st = ddl_comm_barrier(c); break;
    case K_ALLTOALL: st = ddl_comm_alltoall(c, s, r, n, dt); break;
    case K_ALLTOALLV: st = ddl_comm_alltoallv(c, sp, scp, r, rcp, dt); break;
    case K_ALLGATHERV: st = ddl_comm_allgatherv(c, sp, n, r, rcp, dt); break;
    case K_GATHER: st = ddl_comm_gather(c, sp, r, n, dt, root); break;
    case K_SCATTER: st = ddl_comm_scatter(c, sp, r, n, dt, root); break;
    case K_REDUCE: st = ddl_comm_reduce(c, sp, r, n, dt, o, root); break;
    case K_SEND: st = ddl_comm_send(c, sp, n, dt, root, tag); break;
    case K_RECV: st = ddl_comm_recv(c, r, n, dt, root, tag); break;
    default: st = DDL_ERR_INVALID_ARG; break;
    }
    Py_END_ALLOW_THREADS
    if (rcv.obj) PyBuffer_Release(&rcv);
    if (scv.obj) PyBuffer_Release(&scv);
    if (rv.obj) PyBuffer_Release(&rv);
    if (sv.obj) PyBuffer_Release(&sv);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_NONE;
fail3:
    if (scv.obj) PyBuffer_Release(&scv);
fail2:
    if (rv.obj) PyBuffer_Release(&rv);
fail1:
    if (sv.obj) PyBuffer_Release(&sv);
    return NULL;
}

/* A buffer format (numpy's native one-character codes) -> libddl dtype, or -1. */
static int fmt_dtype(const char *f, Py_ssize_t itemsize) {
    if (!f || !f[0] || f[1]) return -1; /* (a byte-order prefix, a struct: not here) */
    switch (f[0]) {
    case 'e': return itemsize == 2 ? DDL_FLOAT16 : -1;
    case 'f': return itemsize == 4 ? DDL_FLOAT32 : -1;
    case 'd': return itemsize == 8 ? DDL_FLOAT64 : -1;
    case 'b': return itemsize == 1 ? DDL_INT8 : -1;
    case 'B': return itemsize == 1 ? DDL_UINT8 : -1;
    case 'i':
    case 'l':
    case 'q': return itemsize == 4 ? DDL_INT32 : itemsize == 8 ? DDL_INT64 : -1;
    default: return -1;
    }
}

/* p2p_fast(kind, handle, buffer, peer, tag) -> bool: a blocking send (kind K_SEND) or
 * receive (K_RECV) of a C-contiguous buffer of one of libddl's dtypes to or from a peer
 * of the communicator, everything checked here in C: 8-byte latency is mostly the layer
 * above MPI. False (nothing done) when any argument is not that plain case: the Python
 * layer then takes its general path, which names what is wrong. */
static PyObject *py_p2p_fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyLong_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) ||
        !PyLong_CheckExact(args[3]) || !PyLong_CheckExact(args[4]))
        Py_RETURN_FALSE;
    int overflow = 0;
    long kind = PyLong_AsLongAndOverflow(args[0], &overflow);
    long peer = overflow ? -1 : PyLong_AsLongAndOverflow(args[3], &overflow);
    long tag = overflow ? -1 : PyLong_AsLongAndOverflow(args[4], &overflow);
    unsigned long long h = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    ddl_comm_t c = handle_of(h);
    int size = 0;
    if (overflow || (kind != K_SEND && kind != K_RECV) || peer < 0 || tag < 0 ||
        tag > 32767 || ddl_comm_size(c, &size) != DDL_SUCCESS || peer >= size)
        Py_RETURN_FALSE;
    Py_buffer v;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (kind == K_RECV ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(args[2], &v, flags) != 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    int dt = fmt_dtype(v.format, v.itemsize);
    if (dt < 0 || v.itemsize <= 0) {
        PyBuffer_Release(&v);
        Py_RETURN_FALSE;
    }
    size_t n = (size_t)(v.len / v.itemsize);
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kind == K_SEND ? ddl_comm_send(c, v.buf, n, (ddl_dtype_t)dt, (int)peer, (int)tag)
                        : ddl_comm_recv(c, v.buf, n, (ddl_dtype_t)dt, (int)peer, (int)tag);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_TRUE;
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

/* A shape from Python (a sequence of ints) into dims[]; -1 with an exception set. */
static int get_shape(PyObject *obj, int64_t *dims, int max) {
    PyObject *seq = PySequence_Fast(obj, "shape must be a sequence of ints");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > max) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "shape has %zd dimensions (at most %d)", n, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        dims[i] = (int64_t)v;
    }
    Py_DECREF(seq);
    return (int)n;
}

/* submit(kind, send or None, recv or None, dtype, op, root, name=None, shape=None, comm=0)
 * -> Request. Kinds: 0 allreduce, 1 broadcast, 2 allgather, 3 reduce_scatter,
 * 4 allgatherv (recv None; the result comes from Request.gathered()). comm: a
 * communicator's handle (its own queue), 0 for the world. */
static PyObject *py_submit(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"kind", "send", "recv", "dtype", "op", "root", "name", "shape",
                             "comm", NULL};
    int kind, dtype, op, root;
    PyObject *send, *recv, *shape_obj = Py_None;
    const char *name = NULL;
    unsigned long long comm_h = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOiii|zOK", kwlist, &kind, &send, &recv,
                                     &dtype, &op, &root, &name, &shape_obj, &comm_h))
        return NULL;
    ddl_comm_t comm = comm_h ? handle_of(comm_h) : NULL;
    int64_t dims[32];
    ddl_match_t match = {name, 0, NULL};
    if (shape_obj != Py_None) {
        int nd = get_shape(shape_obj, dims, 32);
        if (nd < 0) return NULL;
        match.ndim = nd;
        match.shape = dims;
    }
    RequestObject *r = PyObject_New(RequestObject, &RequestType);
    if (!r) return NULL;
    r->req = NULL;
    r->have_send = r->have_recv = r->finished = 0;
    r->kind = kind;
    r->es = ddl_dtype_size((ddl_dtype_t)dtype);
    r->gathered = NULL;
    r->error = NULL;
    r->have_timing = r->waiters = 0;
    r->orphan = NULL;
    size_t rcount = 0, scount = 0;
    if (kind == 4) {
        if (get_buf(send, &r->send, 0, dtype, &scount, "the input") < 0) goto fail;
        r->have_send = 1;
    } else {
        if (get_buf(recv, &r->recv, 1, dtype, &rcount, "the output") < 0) goto fail;
        r->have_recv = 1;
        if (send != Py_None && send != recv) {
            if (get_buf(send, &r->send, 0, dtype, &scount, "the input") < 0) goto fail;
            r->have_send = 1;
        }
    }
    const void *sp = r->have_send ? r->send.buf : DDL_IN_PLACE;
    void *rp = r->have_recv ? r->recv.buf : NULL;
    ddl_status_t st;
    int size = 1;
    st = comm ? ddl_comm_size(comm, &size) : ddl_size(&size);
    if (st != DDL_SUCCESS) {
        raise_status(st);
        goto fail;
    }
    r->size = size;
    if (kind == 2 || kind == 3) {
        size_t small = kind == 3 ? rcount : scount, big = kind == 3 ? scount : rcount;
        if (!r->have_send || big != small * (size_t)size) {
            PyErr_Format(PyExc_ValueError, "the larger buffer must hold size (%d) x the smaller",
                         size);
            goto fail;
        }
    } else if (kind != 4 && r->have_send && scount != rcount) {
        PyErr_Format(PyExc_ValueError, "input has %zu elements but output %zu", scount, rcount);
        goto fail;
    }
    const ddl_match_t *m = name || shape_obj != Py_None ? &match : NULL;
    Py_BEGIN_ALLOW_THREADS
    if (comm) {
        switch (kind) {
        case 0:
            st = ddl_comm_iallreduce(comm, sp, rp, rcount, (ddl_dtype_t)dtype, (ddl_op_t)op, m,
                                     &r->req);
            break;
        case 1: st = ddl_comm_ibroadcast(comm, rp, rcount, (ddl_dtype_t)dtype, root, m, &r->req);
            break;
        case 2: st = ddl_comm_iallgather(comm, sp, rp, scount, (ddl_dtype_t)dtype, m, &r->req);
            break;
        case 3:
            st = ddl_comm_ireduce_scatter(comm, sp, rp, rcount, (ddl_dtype_t)dtype, (ddl_op_t)op,
                                          m, &r->req);
            break;
        case 4: st = ddl_comm_iallgatherv(comm, sp, scount, (ddl_dtype_t)dtype, m, &r->req);
            break;
        default: st = DDL_ERR_INTERNAL; break;
        }
    } else switch (kind) {
    case 0: st = ddl_iallreduce_named(sp, rp, rcount, (ddl_dtype_t)dtype, (ddl_op_t)op, m,
                                      &r->req); break;
    case 1: st = ddl_ibroadcast_named(rp, rcount, (ddl_dtype_t)dtype, root, m, &r->req); break;
    case 2: st = ddl_iallgather_named(sp, rp, scount, (ddl_dtype_t)dtype, m, &r->req); break;
    case 3:
        st = ddl_ireduce_scatter_named(sp, rp, rcount, (ddl_dtype_t)dtype, (ddl_op_t)op, m,
                                       &r->req);
        break;
    case 4: st = ddl_iallgatherv_named(sp, scount, (ddl_dtype_t)dtype, m, &r->req); break;
    default: st = DDL_ERR_INTERNAL; break;
    }
    Py_END_ALLOW_THREADS
    if (st == DDL_ERR_INTERNAL && (kind < 0 || kind > 4)) {
        PyErr_Format(PyExc_ValueError, "unknown request kind %d", kind);
        goto fail;
    }
    if (st != DDL_SUCCESS) {
        raise_status(st);
        goto fail;
    }
    return (PyObject *)r;
fail:
    r->req = NULL;
    Py_DECREF(r);
    return NULL;
}

/* p2p(send, handle, buf, dtype, peer, tag) -> Request: ddl_comm_isend (send true) or
 * ddl_comm_irecv into buf; the Request keeps buf until it is done. */
static PyObject *py_p2p(PyObject *self, PyObject *args) {
    (void)self;
    int is_send, dtype, peer, tag;
    unsigned long long h;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "pKOiii", &is_send, &h, &obj, &dtype, &peer, &tag)) return NULL;
    RequestObject *r = PyObject_New(RequestObject, &RequestType);
    if (!r) return NULL;
    r->req = NULL;
    r->have_send = r->have_recv = r->finished = 0;
    r->kind = is_send ? 5 : 6;
    r->es = ddl_dtype_size((ddl_dtype_t)dtype);
    r->size = 0;
    r->gathered = NULL;
    r->error = NULL;
    r->have_timing = r->waiters = 0;
    r->orphan = NULL;
    size_t count = 0;
    Py_buffer *view = is_send ? &r->send : &r->recv;
    if (get_buf(obj, view, !is_send, dtype, &count, is_send ? "the input" : "the output") < 0) {
        Py_DECREF(r);
        return NULL;
    }
    if (is_send) r->have_send = 1;
    else r->have_recv = 1;
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = is_send ? ddl_comm_isend(handle_of(h), view->buf, count, (ddl_dtype_t)dtype, peer, tag,
                                  &r->req)
                 : ddl_comm_irecv(handle_of(h), view->buf, count, (ddl_dtype_t)dtype, peer, tag,
                                  &r->req);
    Py_END_ALLOW_THREADS
    if (st != DDL_SUCCESS) {
        r->req = NULL;
        Py_DECREF(r);
        return raise_status(st);
    }
    return (PyObject *)r;
}

/* ---- device buffers: raw pointers from ddl_core/_cuda.py ------------------------------ */

/* Pointers and streams arrive as integers (torch's data_ptr(), __cuda_array_interface__,
 * DLPack); a send pointer of 0 means in place. */
static PyObject *py_dev_allreduce(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long s, r, n, stream;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "KKKiiK", &s, &r, &n, &dtype, &op, &stream)) return NULL;
    const void *sp = s ? (const void *)(uintptr_t)s : DDL_IN_PLACE;
    CALL(ddl_allreduce_stream(sp, (void *)(uintptr_t)r, (size_t)n, (ddl_dtype_t)dtype,
                              (ddl_op_t)op, (void *)(uintptr_t)stream));
    Py_RETURN_NONE;
}

static PyObject *py_dev_broadcast(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long p, n, stream;
    int dtype, root;
    if (!PyArg_ParseTuple(args, "KKiiK", &p, &n, &dtype, &root, &stream)) return NULL;
    CALL(ddl_broadcast_stream((void *)(uintptr_t)p, (size_t)n, (ddl_dtype_t)dtype, root,
                              (void *)(uintptr_t)stream));
    Py_RETURN_NONE;
}

static PyObject *py_dev_allgather(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long s, r, n, stream;
    int dtype;
    if (!PyArg_ParseTuple(args, "KKKiK", &s, &r, &n, &dtype, &stream)) return NULL;
    const void *sp = s ? (const void *)(uintptr_t)s : DDL_IN_PLACE;
    CALL(ddl_allgather_stream(sp, (void *)(uintptr_t)r, (size_t)n, (ddl_dtype_t)dtype,
                              (void *)(uintptr_t)stream));
    Py_RETURN_NONE;
}

static PyObject *py_dev_reduce_scatter(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long s, r, n, stream;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "KKKiiK", &s, &r, &n, &dtype, &op, &stream)) return NULL;
    const void *sp = s ? (const void *)(uintptr_t)s : DDL_IN_PLACE;
    CALL(ddl_reduce_scatter_stream(sp, (void *)(uintptr_t)r, (size_t)n, (ddl_dtype_t)dtype,
                                   (ddl_op_t)op, (void *)(uintptr_t)stream));
    Py_RETURN_NONE;
}

static PyObject *py_gpu_info(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    char buf[16384];
    int n;
    Py_BEGIN_ALLOW_THREADS n = ddl_gpu_info(buf, sizeof buf);
    Py_END_ALLOW_THREADS
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof buf) n = (int)sizeof buf - 1;
    return PyUnicode_DecodeUTF8(buf, n, "replace");
}

/* DLPack: (data pointer + byte_offset, device type, device id, dtype code, bits, lanes,
 * element count, C-contiguous) of a "dltensor" capsule, which stays owned by the caller. */
typedef struct {
    void *data;
    struct {
        int32_t device_type, device_id;
    } device;
    int32_t ndim;
    struct {
        uint8_t code, bits;
        uint16_t lanes;
    } dtype;
    int64_t *shape, *strides;
    uint64_t byte_offset;
} dl_tensor_t;

static PyObject *py_dlpack_info(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    /* DLManagedTensor starts with its DLTensor; the versioned one (DLPack >= 1.0) starts
     * with a version and a manager context, then the deleter and flags. */
    const dl_tensor_t *t = NULL;
    if (PyCapsule_IsValid(cap, "dltensor")) {
        t = (const dl_tensor_t *)PyCapsule_GetPointer(cap, "dltensor");
    } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        const char *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        t = (const dl_tensor_t *)(m + 2 * sizeof(uint32_t) + 2 * sizeof(void *) + sizeof(uint64_t));
    } else {
        return PyErr_Format(PyExc_TypeError, "not an unconsumed DLPack capsule");
    }
    if (!t) return NULL;
    long long n = 1;
    int contiguous = 1;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        n *= t->shape[i];
        if (t->strides && t->shape[i] != 1 && t->strides[i] != expect) contiguous = 0;
        expect *= t->shape[i];
    }
    return Py_BuildValue("(KiiiiiLi)", (unsigned long long)(uintptr_t)t->data + t->byte_offset,
                         t->device.device_type, t->device.device_id, (int)t->dtype.code,
                         (int)t->dtype.bits, (int)t->dtype.lanes, n, contiguous);
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
    {"init", py_init, METH_NOARGS, NULL},
    {"finalize", py_finalize, METH_NOARGS, NULL},
    {"_finalize_at_exit", py_finalize_at_exit, METH_NOARGS, NULL},
    {"initialized", py_initialized, METH_NOARGS, NULL},
    {"rank", py_rank, METH_NOARGS, NULL},
    {"size", py_size, METH_NOARGS, NULL},
    {"local_rank", py_local_rank, METH_NOARGS, NULL},
    {"local_size", py_local_size, METH_NOARGS, NULL},
    {"topology", py_topology, METH_NOARGS, NULL},
    {"allreduce", (PyCFunction)(void (*)(void))py_allreduce, METH_FASTCALL, NULL},
    {"comm_world", py_comm_world, METH_NOARGS, NULL},
    {"comm_split", py_comm_split, METH_VARARGS, NULL},
    {"comm_create", py_comm_create, METH_VARARGS, NULL},
    {"comm_free", py_comm_free, METH_VARARGS, NULL},
    {"comm_set_timeout", py_comm_set_timeout, METH_VARARGS, NULL},
    {"comm_info", py_comm_info, METH_VARARGS, NULL},
    {"comm_topology", py_comm_topology, METH_VARARGS, NULL},
    {"comm_op", py_comm_op, METH_VARARGS, NULL},
    {"p2p_fast", (PyCFunction)(void (*)(void))py_p2p_fast, METH_FASTCALL,
     "p2p_fast(kind, handle, buffer, peer, tag) -> bool: a plain blocking send/recv, or "
     "False when the arguments need the general path."},
    {"broadcast", py_broadcast, METH_VARARGS, NULL},
    {"allgather", py_allgather, METH_VARARGS, NULL},
    {"reduce_scatter", py_reduce_scatter, METH_VARARGS, NULL},
    {"barrier", py_barrier, METH_NOARGS, NULL},
    {"submit", (PyCFunction)(void (*)(void))py_submit, METH_VARARGS | METH_KEYWORDS, NULL},
    {"p2p", py_p2p, METH_VARARGS,
     "p2p(send, comm, buf, dtype, peer, tag) -> Request: a non-blocking send or receive."},
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
    {"alltoall", py_alltoall, METH_VARARGS, NULL},
    {"alltoall_counts", py_alltoall_counts, METH_VARARGS, NULL},
    {"alltoallv", py_alltoallv, METH_VARARGS, NULL},
    {"_set_liveness_checks", py_set_liveness_checks, METH_VARARGS, NULL},
    {"dev_allreduce", py_dev_allreduce, METH_VARARGS, NULL},
    {"dev_broadcast", py_dev_broadcast, METH_VARARGS, NULL},
    {"dev_allgather", py_dev_allgather, METH_VARARGS, NULL},
    {"dev_reduce_scatter", py_dev_reduce_scatter, METH_VARARGS, NULL},
    {"gpu_info", py_gpu_info, METH_NOARGS, NULL},
    {"dlpack_info", py_dlpack_info, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_ddl", NULL, -1, methods,
                                       NULL, NULL, NULL, NULL};

static PyObject *new_error(PyObject *m, const char *name, PyObject *bases, const char *doc) {
    char full[128];
    snprintf(full, sizeof full, "ddl_core.%s", name);
    PyObject *cls = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    if (cls) PyModule_AddObjectRef(m, name, cls);
    return cls;
}

PyMODINIT_FUNC PyInit__ddl(void) {
    if (PyType_Ready(&RequestType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    DDLError = new_error(m, "DDLError", PyExc_RuntimeError, "A libddl call failed.");
    PyObject *b;
    b = PyTuple_Pack(1, DDLError);
    MismatchError = new_error(m, "MismatchError", b,
                              "Ranks disagreed on a collective's count, dtype, op or root.");
    NotInitializedError = new_error(m, "NotInitializedError", b,
                                    "Used before ddl_core.init() or after finalize().");
    Py_DECREF(b);
    b = PyTuple_Pack(2, DDLError, PyExc_TimeoutError);
    DDLTimeoutError = new_error(m, "DDLTimeoutError", b, "A peer did not answer in DDL_TIMEOUT.");
    Py_DECREF(b);
    b = PyTuple_Pack(1, DDLTimeoutError);
    PeerLostError = new_error(m, "PeerLostError", b,
                              "A peer exited, died or finalized while this rank waited for it "
                              "(reported at once; a DDLTimeoutError so code written for the "
                              "deadline catches it too).");
    Py_DECREF(b);
    b = PyTuple_Pack(2, DDLError, PyExc_ValueError);
    InvalidArgumentError = new_error(m, "InvalidArgumentError", b, "A bad dtype, op or argument.");
    Py_DECREF(b);
    PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType);
    PyModule_AddIntConstant(m, "MAX_LEVELS", DDL_MAX_LEVELS);
    /* the op and dtype names in libddl's code order: Python restates none of them */
    PyObject *ops = PyTuple_New(DDL_NUM_OPS), *dtypes = PyTuple_New(DDL_NUM_DTYPES);
    if (!ops || !dtypes) return NULL;
    for (int i = 0; i < DDL_NUM_OPS; i++)
        PyTuple_SET_ITEM(ops, i, PyUnicode_FromString(ddl_op_name((ddl_op_t)i)));
    for (int i = 0; i < DDL_NUM_DTYPES; i++)
        PyTuple_SET_ITEM(dtypes, i, PyUnicode_FromString(ddl_dtype_name((ddl_dtype_t)i)));
    PyModule_AddObject(m, "OPS", ops);
    PyModule_AddObject(m, "DTYPES", dtypes);
    return m;
}

/* ddl_core._ddl: communicators and their blocking collectives, one function per
 * collective, each taking the communicator's handle first (the world's too: the world is
 * a communicator, ddl_comm_world). Buffers are buffer-protocol objects of libddl's dtype
 * codes; counts are derived from them and checked here, so no call can read or write past
 * a buffer whatever the Python layer (ddl_core/comm.py) passes. */
#include <limits.h>

#include "py_ddl.h"


static PyObject *handle_or_none(ddl_comm_t c) {
    if (!c) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)c);
}

/* The member count of c, or -1 with its error raised. */
static int comm_size(ddl_comm_t c) {
    int size = 0;
    ddl_status_t st = ddl_comm_size(c, &size);
    if (st != DDL_SUCCESS) {
        raise_status(st);
        return -1;
    }
    return size;
}

/* ---- making, describing and releasing communicators -------------------------------- */

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
    CALL(ddl_comm_split(handle_of(h), color, key, &out));
    return handle_or_none(out);
}

/* A Python sequence of ranks as a C array (PyMem_Free it); NULL with an exception set. */
static int *ranks_arg(PyObject *seq, const char *fn, int *n_out) {
    PyObject *fast = PySequence_Fast(seq, "ranks must be a sequence of ints");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > INT_MAX) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: %zd ranks is too many", fn, n);
        return NULL;
    }
    int *ranks = PyMem_Malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!ranks) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
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
    *n_out = (int)n;
    return ranks;
}

/* comm_create(handle, ranks) (every rank) and comm_create_group(handle, ranks) (members). */
static PyObject *create_common(PyObject *args, int group) {
    unsigned long long h;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "KO", &h, &seq)) return NULL;
    int n = 0;
    int *ranks = ranks_arg(seq, group ? "comm_create_group" : "comm_create", &n);
    if (!ranks) return NULL;
    ddl_comm_t out = NULL;
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = group ? ddl_comm_create_group(handle_of(h), ranks, n, &out)
                                      : ddl_comm_create(handle_of(h), ranks, n, &out);
    Py_END_ALLOW_THREADS
    PyMem_Free(ranks);
    if (st != DDL_SUCCESS) return raise_status(st);
    return handle_or_none(out);
}

static PyObject *py_comm_create(PyObject *self, PyObject *args) {
    (void)self;
    return create_common(args, 0);
}

static PyObject *py_comm_create_group(PyObject *self, PyObject *args) {
    (void)self;
    return create_common(args, 1);
}

static PyObject *py_comm_shrink(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    ddl_comm_t out = NULL;
    CALL(ddl_comm_shrink(handle_of(h), &out));
    return handle_or_none(out);
}

static PyObject *py_comm_from_mpi(PyObject *self, PyObject *args) {
    (void)self;
    long long mh;
    if (!PyArg_ParseTuple(args, "L", &mh)) return NULL;
    ddl_comm_t out = NULL;
    CALL(ddl_comm_from_mpi((intptr_t)mh, &out));
    return handle_or_none(out);
}

/* comm_failed_ranks(handle) -> tuple of the ranks known to have failed */
static PyObject *py_comm_failed_ranks(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    int n = 0, buf[1024];
    ddl_status_t st = ddl_comm_failed_ranks(handle_of(h), buf, 1024, &n);
    if (st != DDL_SUCCESS) return raise_status(st);
    if (n > 1024) n = 1024;
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) PyTuple_SET_ITEM(t, i, PyLong_FromLong(buf[i]));
    return t;
}

static PyObject *py_comm_free(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    ddl_comm_t c = handle_of(h);
    CALL(ddl_comm_free(&c));
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

/* ---- the buffers of one call ---------------------------------------------------------- */

/* An input and an output (either may be None: in place, or not this rank's), released
 * together; the element counts are 0 for None. */
typedef struct {
    Py_buffer s, r;
    int hs, hr;
    size_t sn, rn;
} bufs_t;

static void bufs_release(bufs_t *b) {
    if (b->hs) PyBuffer_Release(&b->s);
    if (b->hr) PyBuffer_Release(&b->r);
    b->hs = b->hr = 0;
}

/* send None, or recv itself where `same_in_place`: in place (hs 0). */
static int bufs_get(bufs_t *b, PyObject *send, PyObject *recv, int dtype, int same_in_place) {
    b->hs = b->hr = 0;
    b->sn = b->rn = 0;
    if (recv != Py_None) {
        if (get_buf(recv, &b->r, 1, dtype, &b->rn, "the output") < 0) return -1;
        b->hr = 1;
    }
    if (send != Py_None && !(same_in_place && send == recv)) {
        if (get_buf(send, &b->s, 0, dtype, &b->sn, "the input") < 0) {
            bufs_release(b);
            return -1;
        }
        b->hs = 1;
    }
    return 0;
}

static const void *send_ptr(const bufs_t *b) { return b->hs ? b->s.buf : DDL_IN_PLACE; }
static const void *send_or_null(const bufs_t *b) { return b->hs ? b->s.buf : NULL; }
static void *recv_ptr(const bufs_t *b) { return b->hr ? b->r.buf : NULL; }

/* Release the buffers and raise what a ValueError check found: NULL. */
static PyObject *refuse(bufs_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyErr_FormatV(PyExc_ValueError, fmt, ap);
    va_end(ap);
    bufs_release(b);
    return NULL;
}

/* Run a collective without the GIL, release the buffers, return None or raise. */
#define RUN(b, expr)                                                                      \
    do {                                                                                  \
        ddl_status_t st_;                                                                 \
        Py_BEGIN_ALLOW_THREADS st_ = (expr);                                              \
        Py_END_ALLOW_THREADS bufs_release(b);                                             \
        if (st_ != DDL_SUCCESS) return raise_status(st_);                                 \
        Py_RETURN_NONE;                                                                   \
    } while (0)

/* ---- blocking collectives --------------------------------------------------------------- */

/* allreduce(handle, send or None, recv, dtype, op): None means in place on recv.
 * METH_FASTCALL (no argument tuple): an 8-byte allreduce is mostly the layers above MPI. */
static PyObject *py_allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    ddl_comm_t c;
    int dtype, op;
    if (nargs != 5)
        return PyErr_Format(PyExc_TypeError, "allreduce(handle, send or None, recv, dtype, op) "
                            "takes 5 arguments, not %zd", nargs);
    if (handle_arg(args[0], &c) < 0 || int_arg(args[3], &dtype) < 0 ||
        int_arg(args[4], &op) < 0)
        return NULL;
    bufs_t b;
    if (bufs_get(&b, args[1], args[2], dtype, 1) < 0) return NULL;
    if (b.hs && b.sn != b.rn)
        return refuse(&b, "input has %zu elements but output %zu", b.sn, b.rn);
    RUN(&b, ddl_comm_allreduce(c, send_ptr(&b), recv_ptr(&b), b.rn, (ddl_dtype_t)dtype,
                               (ddl_op_t)op));
}

/* broadcast(handle, buf, dtype, root): root's buf into everyone's. */
static PyObject *py_broadcast(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    PyObject *buf;
    int dtype, root;
    if (!PyArg_ParseTuple(args, "KOii", &h, &buf, &dtype, &root)) return NULL;
    bufs_t b;
    if (bufs_get(&b, Py_None, buf, dtype, 0) < 0) return NULL;
    RUN(&b, ddl_comm_broadcast(handle_of(h), recv_ptr(&b), b.rn, (ddl_dtype_t)dtype, root));
}

/* What the collectives below take: (handle, send, recv, dtype[, op][, root]), the buffers
 * got (send None or, where `same_in_place`, recv itself: in place) and the communicator's
 * size; -1 with the error raised (nothing held) otherwise. */
typedef struct {
    ddl_comm_t c;
    int dtype, op, root, size;
    bufs_t b;
} coll_t;

static int coll_args(PyObject *args, int with_op, int with_root, int same_in_place,
                     const char *fn, coll_t *a) {
    unsigned long long h;
    PyObject *send, *recv;
    int x[2] = {0, 0};
    Py_ssize_t want = 4 + with_op + with_root;
    if (PyTuple_GET_SIZE(args) != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (handle, send, recv, dtype%s%s), "
                     "not %zd", fn, want, with_op ? ", op" : "", with_root ? ", root" : "",
                     PyTuple_GET_SIZE(args));
        return -1;
    }
    if (!PyArg_ParseTuple(args, "KOOi|ii", &h, &send, &recv, &a->dtype, &x[0], &x[1])) return -1;
    a->c = handle_of(h);
    a->op = with_op ? x[0] : 0;
    a->root = with_root ? x[with_op] : -1;
    if ((a->size = comm_size(a->c)) < 0) return -1;
    return bufs_get(&a->b, send, recv, a->dtype, same_in_place);
}

/* A check of the buffers' counts failed: release them, raise a ValueError, -1. */
#define BAD_COUNTS(a, ...) (refuse(&(a)->b, __VA_ARGS__), -1)

/* `big` holds size x `small` elements (allgather, reduce_scatter, gather and scatter at
 * the root), an input other than the output given. */
static int times_size(coll_t *a, size_t small, size_t big, const char *fn, const char *which) {
    if (!a->b.hs) return BAD_COUNTS(a, "%s: give an input other than the output", fn);
    if (big != small * (size_t)a->size)
        return BAD_COUNTS(a, "%s: the %s must hold size (%d) x %zu = %zu elements, not %zu", fn,
                          which, a->size, small, small * (size_t)a->size, big);
    return 0;
}

/* allgather(handle, send, recv, dtype): recv holds size x len(send). */
static PyObject *py_allgather(PyObject *self, PyObject *args) {
    (void)self;
    coll_t a;
    if (coll_args(args, 0, 0, 0, "allgather", &a) < 0 ||
        times_size(&a, a.b.sn, a.b.rn, "allgather", "output") < 0)
        return NULL;
    RUN(&a.b, ddl_comm_allgather(a.c, a.b.s.buf, a.b.r.buf, a.b.sn, (ddl_dtype_t)a.dtype));
}

/* reduce_scatter(handle, send, recv, dtype, op): send holds size x len(recv). */
static PyObject *py_reduce_scatter(PyObject *self, PyObject *args) {
    (void)self;
    coll_t a;
    if (coll_args(args, 1, 0, 0, "reduce_scatter", &a) < 0 ||
        times_size(&a, a.b.rn, a.b.sn, "reduce_scatter", "input") < 0)
        return NULL;
    RUN(&a.b, ddl_comm_reduce_scatter(a.c, a.b.s.buf, a.b.r.buf, a.b.rn, (ddl_dtype_t)a.dtype,
                                      (ddl_op_t)a.op));
}

static PyObject *py_barrier(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    CALL(ddl_comm_barrier(handle_of(h)));
    Py_RETURN_NONE;
}

/* alltoall(handle, send, recv, dtype): block i of send to rank i (each len/size elements);
 * send may be recv (in place). */
static PyObject *py_alltoall(PyObject *self, PyObject *args) {
    (void)self;
    coll_t a;
    if (coll_args(args, 0, 0, 1, "alltoall", &a) < 0) return NULL;
    size_t sn = a.b.hs ? a.b.sn : a.b.rn, p = (size_t)a.size;
    if (sn != a.b.rn || sn % p)
        return refuse(&a.b, "alltoall: input and output must hold the same number of "
                      "elements, a multiple of the %d ranks (got %zu and %zu)", a.size, sn,
                      a.b.rn);
    RUN(&a.b, ddl_comm_alltoall(a.c, send_ptr(&a.b), a.b.r.buf, sn / p, (ddl_dtype_t)a.dtype));
}

/* Per-rank counts: a buffer of `p` int64 (numpy), borrowed while the call runs. */
typedef struct {
    Py_buffer v;
    int have;
} counts_t;

static const size_t *counts_get(counts_t *k, PyObject *o, int p, const char *what) {
    k->have = 0;
    size_t n;
    if (get_buf(o, &k->v, 0, DDL_INT64, &n, what) < 0) return NULL;
    k->have = 1;
    if (n != (size_t)p) {
        PyErr_Format(PyExc_ValueError, "%s: %zu counts for %d ranks: give one per rank", what, n,
                     p);
        return NULL;
    }
    const int64_t *c = k->v.buf;
    for (int i = 0; i < p; i++)
        if (c[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: count %lld for rank %d is negative", what,
                         (long long)c[i], i);
            return NULL;
        }
    return (const size_t *)k->v.buf;
}

static void counts_release(counts_t *k) {
    if (k->have) PyBuffer_Release(&k->v);
    k->have = 0;
}

static size_t counts_sum(const size_t *c, int p) {
    size_t t = 0;
    for (int i = 0; i < p; i++) t += c[i];
    return t;
}

/* alltoallv(handle, send, sendcounts, recv, recvcounts, dtype); counts: int64 arrays. */
static PyObject *py_alltoallv(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    PyObject *so, *sco, *ro, *rco, *res = NULL;
    int dtype;
    if (!PyArg_ParseTuple(args, "KOOOOi", &h, &so, &sco, &ro, &rco, &dtype)) return NULL;
    ddl_comm_t c = handle_of(h);
    int p = comm_size(c);
    if (p < 0) return NULL;
    counts_t ks = {.have = 0}, kr = {.have = 0};
    bufs_t b = {.hs = 0, .hr = 0};
    const size_t *sc = counts_get(&ks, sco, p, "alltoallv send counts"), *rc = NULL;
    if (sc) rc = counts_get(&kr, rco, p, "alltoallv receive counts");
    if (!rc || bufs_get(&b, so, ro, dtype, 0) < 0) goto done;
    if (!b.hs) {
        PyErr_SetString(PyExc_ValueError, "alltoallv cannot run in place: give another output");
        goto done;
    }
    size_t want_s = counts_sum(sc, p), want_r = counts_sum(rc, p);
    if (want_s != b.sn || want_r > b.rn) {
        PyErr_Format(PyExc_ValueError, "alltoallv: the send counts add up to %zu elements and "
                     "the input holds %zu; the receive counts to %zu and the output holds %zu",
                     want_s, b.sn, want_r, b.rn);
        goto done;
    }
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_comm_alltoallv(c, b.s.buf, sc, b.r.buf, rc, (ddl_dtype_t)dtype);
    Py_END_ALLOW_THREADS
    if (st != DDL_SUCCESS) raise_status(st);
    else res = Py_NewRef(Py_None);
done:
    bufs_release(&b);
    counts_release(&ks);
    counts_release(&kr);
    return res;
}

/* allgatherv(handle, send, recv, recvcounts, dtype): recvcounts[j] is rank j's count. */
static PyObject *py_allgatherv(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long h;
    PyObject *so, *ro, *rco, *res = NULL;
    int dtype;
    if (!PyArg_ParseTuple(args, "KOOOi", &h, &so, &ro, &rco, &dtype)) return NULL;
    ddl_comm_t c = handle_of(h);
    int p = comm_size(c);
    if (p < 0) return NULL;
    counts_t kr = {.have = 0};
    bufs_t b = {.hs = 0, .hr = 0};
    const size_t *rc = counts_get(&kr, rco, p, "allgatherv counts");
    if (!rc || bufs_get(&b, so, ro, dtype, 0) < 0) goto done;
    if (!b.hs || counts_sum(rc, p) > b.rn) {
        PyErr_Format(PyExc_ValueError, "allgatherv: the output must be another buffer of at "
                     "least %zu elements (it holds %zu)", counts_sum(rc, p), b.rn);
        goto done;
    }
    ddl_status_t st;
    Py_BEGIN_ALLOW_THREADS st = ddl_comm_allgatherv(c, b.s.buf, b.sn, b.r.buf, rc,
                                                    (ddl_dtype_t)dtype);
    Py_END_ALLOW_THREADS
    if (st != DDL_SUCCESS) raise_status(st);
    else res = Py_NewRef(Py_None);
done:
    bufs_release(&b);
    counts_release(&kr);
    return res;
}

/* This rank is the root of a rooted call. */
static int at_root(const coll_t *a) {
    int rank = -1;
    return ddl_comm_rank(a->c, &rank) == DDL_SUCCESS && rank == a->root;
}

/* gather(handle, send, recv or None, dtype, root): recv (the root's) holds size x len(send);
 * scatter(handle, send or None, recv, dtype, root): send (the root's) holds size x len(recv). */
static PyObject *rooted(PyObject *args, int gathering) {
    const char *fn = gathering ? "gather" : "scatter";
    coll_t a;
    if (coll_args(args, 0, 1, 0, fn, &a) < 0) return NULL;
    if (!(gathering ? a.b.hs : a.b.hr))
        return refuse(&a.b, "%s: give an %s", fn, gathering ? "input" : "output");
    size_t small = gathering ? a.b.sn : a.b.rn, big = gathering ? a.b.rn : a.b.sn;
    if (at_root(&a) &&
        times_size(&a, small, big, fn, gathering ? "root's output" : "root's input") < 0)
        return NULL;
    ddl_dtype_t dt = (ddl_dtype_t)a.dtype;
    RUN(&a.b, gathering ? ddl_comm_gather(a.c, a.b.s.buf, recv_ptr(&a.b), small, dt, a.root)
                        : ddl_comm_scatter(a.c, send_or_null(&a.b), a.b.r.buf, small, dt, a.root));
}

static PyObject *py_gather(PyObject *self, PyObject *args) {
    (void)self;
    return rooted(args, 1);
}

static PyObject *py_scatter(PyObject *self, PyObject *args) {
    (void)self;
    return rooted(args, 0);
}

/* reduce(handle, send, recv or None, dtype, op, root): recv (the root's) like send. */
static PyObject *py_reduce(PyObject *self, PyObject *args) {
    (void)self;
    coll_t a;
    if (coll_args(args, 1, 1, 0, "reduce", &a) < 0) return NULL;
    if (!a.b.hs) return refuse(&a.b, "reduce: give an input");
    if (a.b.hr && a.b.rn != a.b.sn)
        return refuse(&a.b, "reduce: input has %zu elements but output %zu", a.b.sn, a.b.rn);
    RUN(&a.b, ddl_comm_reduce(a.c, a.b.s.buf, recv_ptr(&a.b), a.b.sn, (ddl_dtype_t)a.dtype,
                              (ddl_op_t)a.op, a.root));
}


/* ---- point to point ------------------------------------------------------------------- */

/* send(handle, buf, dtype, dest, tag) and recv(handle, buf, dtype, source, tag). */
static PyObject *p2p(PyObject *args, int sending) {
    unsigned long long h;
    PyObject *buf;
    int dtype, peer, tag;
    if (!PyArg_ParseTuple(args, "KOiii", &h, &buf, &dtype, &peer, &tag)) return NULL;
    bufs_t b;
    if (bufs_get(&b, sending ? buf : Py_None, sending ? Py_None : buf, dtype, 0) < 0) return NULL;
    ddl_comm_t c = handle_of(h);
    ddl_dtype_t dt = (ddl_dtype_t)dtype;
    RUN(&b, sending ? ddl_comm_send(c, b.s.buf, b.sn, dt, peer, tag)
                    : ddl_comm_recv(c, b.r.buf, b.rn, dt, peer, tag));
}

static PyObject *py_send(PyObject *self, PyObject *args) {
    (void)self;
    return p2p(args, 1);
}

static PyObject *py_recv(PyObject *self, PyObject *args) {
    (void)self;
    return p2p(args, 0);
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

/* send_plain / recv_plain(handle, buffer, peer, tag) -> bool: a blocking send or receive
 * of a C-contiguous buffer of one of libddl's dtypes to or from a peer of the
 * communicator, everything checked here in C: 8-byte latency is mostly the layer above
 * MPI. False (nothing done) when any argument is not that plain case: the Python layer
 * then takes its general path, which names what is wrong. */
static PyObject *p2p_plain(int sending, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyLong_CheckExact(args[0]) || !PyLong_CheckExact(args[2]) ||
        !PyLong_CheckExact(args[3]))
        Py_RETURN_FALSE;
    int overflow = 0;
    long peer = PyLong_AsLongAndOverflow(args[2], &overflow);
    long tag = overflow ? -1 : PyLong_AsLongAndOverflow(args[3], &overflow);
    unsigned long long h = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    ddl_comm_t c = handle_of(h);
    int size = 0;
    if (overflow || peer < 0 || tag < 0 || tag > 32767 ||
        ddl_comm_size(c, &size) != DDL_SUCCESS || peer >= size)
        Py_RETURN_FALSE;
    Py_buffer v;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (sending ? 0 : PyBUF_WRITABLE);
    if (PyObject_GetBuffer(args[1], &v, flags) != 0) {
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
    st = sending ? ddl_comm_send(c, v.buf, n, (ddl_dtype_t)dt, (int)peer, (int)tag)
                 : ddl_comm_recv(c, v.buf, n, (ddl_dtype_t)dt, (int)peer, (int)tag);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (st != DDL_SUCCESS) return raise_status(st);
    Py_RETURN_TRUE;
}

static PyObject *py_send_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return p2p_plain(1, args, nargs);
}

static PyObject *py_recv_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return p2p_plain(0, args, nargs);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

PyMethodDef py_comm_methods[] = {
    {"comm_world", py_comm_world, METH_NOARGS, "comm_world() -> the world's handle."},
    {"comm_split", py_comm_split, METH_VARARGS, "comm_split(handle, color, key) -> handle or None."},
    {"comm_create", py_comm_create, METH_VARARGS, "comm_create(handle, ranks) -> handle or None."},
    {"comm_create_group", py_comm_create_group, METH_VARARGS,
     "comm_create_group(handle, ranks) -> handle: members only (MPI_Comm_create_group)."},
    {"comm_shrink", py_comm_shrink, METH_VARARGS, "comm_shrink(handle) -> the survivors' handle."},
    {"comm_from_mpi", py_comm_from_mpi, METH_VARARGS,
     "comm_from_mpi(mpi_handle) -> handle over a duplicate of that MPI communicator."},
    {"comm_failed_ranks", py_comm_failed_ranks, METH_VARARGS,
     "comm_failed_ranks(handle) -> the members known to have failed."},
    {"comm_free", py_comm_free, METH_VARARGS, "comm_free(handle)"},
    {"comm_set_timeout", py_comm_set_timeout, METH_VARARGS, "comm_set_timeout(handle, seconds)"},
    {"comm_info", py_comm_info, METH_VARARGS, "comm_info(handle) -> (rank, size, members)"},
    {"comm_topology", py_comm_topology, METH_VARARGS, "comm_topology(handle) -> grid"},
    {"allreduce", FASTCALL(py_allreduce), "allreduce(handle, send or None, recv, dtype, op)"},
    {"broadcast", py_broadcast, METH_VARARGS, "broadcast(handle, buf, dtype, root)"},
    {"allgather", py_allgather, METH_VARARGS, "allgather(handle, send, recv, dtype)"},
    {"reduce_scatter", py_reduce_scatter, METH_VARARGS,
     "reduce_scatter(handle, send, recv, dtype, op)"},
    {"barrier", py_barrier, METH_VARARGS, "barrier(handle)"},
    {"alltoall", py_alltoall, METH_VARARGS, "alltoall(handle, send, recv, dtype)"},
    {"alltoallv", py_alltoallv, METH_VARARGS,
     "alltoallv(handle, send, sendcounts, recv, recvcounts, dtype); counts: int64 arrays"},
    {"allgatherv", py_allgatherv, METH_VARARGS,
     "allgatherv(handle, send, recv, recvcounts, dtype); counts: an int64 array"},
    {"gather", py_gather, METH_VARARGS, "gather(handle, send, recv or None, dtype, root)"},
    {"scatter", py_scatter, METH_VARARGS, "scatter(handle, send or None, recv, dtype, root)"},
    {"reduce", py_reduce, METH_VARARGS, "reduce(handle, send, recv or None, dtype, op, root)"},
    {"send", py_send, METH_VARARGS, "send(handle, buf, dtype, dest, tag)"},
    {"recv", py_recv, METH_VARARGS, "recv(handle, buf, dtype, source, tag)"},
    {"send_plain", FASTCALL(py_send_plain),
     "send_plain(handle, buffer, dest, tag) -> bool: a plain blocking send, or False when "
     "the arguments need the general path."},
    {"recv_plain", FASTCALL(py_recv_plain),
     "recv_plain(handle, buffer, source, tag) -> bool: the receive of send_plain."},
    {NULL, NULL, 0, NULL}};

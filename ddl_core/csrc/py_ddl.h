/* What the files of ddl_core._ddl (the CPython binding of libddl) share.
 *
 * The binding is split by object, as mpi4py's is: pymodule.c (the module, its errors, life
 * cycle, settings and tuning), py_comm.c (communicators and their blocking collectives, one
 * function each), py_request.c (the Request type and the calls that start one), py_device.c
 * (device buffers: raw pointers and streams). Each file contributes a method table; the
 * module adds them all. */
#ifndef DDL_PY_DDL_H
#define DDL_PY_DDL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "ddl.h"

/* The module's exception classes (pymodule.c). */
extern PyObject *DDLError, *MismatchError, *DDLTimeoutError, *NotInitializedError,
    *InvalidArgumentError, *PeerLostError, *ProcessFailedError;

/* Raise the exception for a failed libddl call (its message: ddl_last_error()); NULL. */
PyObject *raise_status(ddl_status_t st);

/* Run a libddl call without the GIL; on failure raise its error and return NULL. */
#define CALL(expr)                                                                        \
    do {                                                                                  \
        ddl_status_t st_;                                                                 \
        Py_BEGIN_ALLOW_THREADS st_ = (expr);                                              \
        Py_END_ALLOW_THREADS if (st_ != DDL_SUCCESS) return raise_status(st_);            \
    } while (0)

/* A C-contiguous buffer of `dtype` elements (writable if asked) and its element count;
 * -1 with a ValueError naming `what` otherwise. (Inline: it is on the 8-byte path.) */
static inline int get_buf(PyObject *obj, Py_buffer *view, int writable, int dtype,
                          size_t *count, const char *what) {
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
/* An int argument of a METH_FASTCALL function, or -1 with an exception set. */
int int_arg(PyObject *o, int *out);
/* A grid (ddl_topology, ddl_comm_topology) as a tuple, or the call's error raised. */
PyObject *grid_tuple(ddl_status_t st, int n, const int *dims);

/* Communicator handles are the ddl_comm_t pointer as a Python int, owned by ddl_core.Comm
 * (which never hands out a freed one). */
static inline ddl_comm_t handle_of(unsigned long long h) { return (ddl_comm_t)(uintptr_t)h; }
/* The handle argument of a METH_FASTCALL function, or -1 with an exception set. */
static inline int handle_arg(PyObject *o, ddl_comm_t *out) {
    unsigned long long h = PyLong_AsUnsignedLongLong(o);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = handle_of(h);
    return 0;
}

/* The method tables of the object files, and the Request type's setup (py_request.c). */
extern PyMethodDef py_comm_methods[], py_request_methods[], py_device_methods[];
int py_request_ready(PyObject *module);

#endif /* DDL_PY_DDL_H */

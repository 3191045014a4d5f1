/* ddl_core._ddl: device (CUDA) buffers. Pointers and streams arrive as integers from
 * ddl_core/_cuda.py (torch's data_ptr(), __cuda_array_interface__, DLPack) and go to
 * libddl's *_stream calls, the world's device path; a send pointer of 0 means in place.
 * Nothing here needs CUDA to build: libddl loads the runtime and NCCL when first used. */
#include "py_ddl.h"

/* The arguments of dev_allreduce, dev_allgather and dev_reduce_scatter: (send or 0, recv,
 * count, dtype[, op], stream). */
typedef struct {
    const void *send;
    void *recv, *stream;
    size_t count;
    ddl_dtype_t dtype;
    ddl_op_t op;
} dev_args_t;

static int dev_args(PyObject *args, int with_op, dev_args_t *a) {
    unsigned long long s, r, n, stream;
    int dtype, op = 0;
    if (with_op ? !PyArg_ParseTuple(args, "KKKiiK", &s, &r, &n, &dtype, &op, &stream)
                : !PyArg_ParseTuple(args, "KKKiK", &s, &r, &n, &dtype, &stream))
        return -1;
    *a = (dev_args_t){s ? (const void *)(uintptr_t)s : DDL_IN_PLACE, (void *)(uintptr_t)r,
                      (void *)(uintptr_t)stream, (size_t)n, (ddl_dtype_t)dtype, (ddl_op_t)op};
    return 0;
}

static PyObject *py_dev_allreduce(PyObject *self, PyObject *args) {
    (void)self;
    dev_args_t a;
    if (dev_args(args, 1, &a) < 0) return NULL;
    CALL(ddl_allreduce_stream(a.send, a.recv, a.count, a.dtype, a.op, a.stream));
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
    dev_args_t a;
    if (dev_args(args, 0, &a) < 0) return NULL;
    CALL(ddl_allgather_stream(a.send, a.recv, a.count, a.dtype, a.stream));
    Py_RETURN_NONE;
}

static PyObject *py_dev_reduce_scatter(PyObject *self, PyObject *args) {
    (void)self;
    dev_args_t a;
    if (dev_args(args, 1, &a) < 0) return NULL;
    CALL(ddl_reduce_scatter_stream(a.send, a.recv, a.count, a.dtype, a.op, a.stream));
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

PyMethodDef py_device_methods[] = {
    {"dev_allreduce", py_dev_allreduce, METH_VARARGS,
     "dev_allreduce(send or 0, recv, count, dtype, op, stream)"},
    {"dev_broadcast", py_dev_broadcast, METH_VARARGS,
     "dev_broadcast(buf, count, dtype, root, stream)"},
    {"dev_allgather", py_dev_allgather, METH_VARARGS,
     "dev_allgather(send or 0, recv, sendcount, dtype, stream)"},
    {"dev_reduce_scatter", py_dev_reduce_scatter, METH_VARARGS,
     "dev_reduce_scatter(send or 0, recv, recvcount, dtype, op, stream)"},
    {"gpu_info", py_gpu_info, METH_NOARGS, "libddl's key=value lines on CUDA and NCCL"},
    {"dlpack_info", py_dlpack_info, METH_VARARGS,
     "dlpack_info(capsule) -> (ptr, device type, device id, dtype code, bits, lanes, count, "
     "contiguous)"},
    {NULL, NULL, 0, NULL}};

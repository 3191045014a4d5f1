/* NCCL, loaded at run time (dlopen) with minimal declarations of our own (NCCL's ABI:
 * ncclUniqueId is 128 bytes passed by value, results/dtypes/ops are ints), so libddl
 * builds without NCCL and the CPU-only build runs everywhere. Every return code is
 * checked and becomes DDL_ERR_NCCL with ncclGetErrorString's text, the communicator's
 * last error where NCCL keeps one (ncclGetLastError, NCCL >= 2.13), and the call.
 *
 * Found by ddl_dl_search (dlsearch.c): DDL_NCCL_LIB, a copy already loaded (torch's), the
 * nvidia-nccl-cu13 / -cu12 wheel beside libddl (nvidia/nccl/lib), the conda environment,
 * then the system's libnccl.so.2. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ddl_internal.h"

typedef int nccl_res_t;

static struct {
    pthread_mutex_t lock;
    int state; /* 0 not tried, 1 loaded, -1 failed */
    void *handle;
    int version;
    char from[1024];
    char error[3072];
    nccl_res_t (*GetVersion)(int *);
    const char *(*GetErrorString)(nccl_res_t);
    const char *(*GetLastError)(void *); /* optional */
    nccl_res_t (*GetUniqueId)(ddl_nccl_id_t *);
    nccl_res_t (*CommInitRank)(ddl_nccl_comm_t *, int, ddl_nccl_id_t, int);
    nccl_res_t (*CommSplit)(ddl_nccl_comm_t, int, int, ddl_nccl_comm_t *, void *); /* optional */
    nccl_res_t (*CommDestroy)(ddl_nccl_comm_t);
    nccl_res_t (*AllReduce)(const void *, void *, size_t, int, int, ddl_nccl_comm_t, void *);
    nccl_res_t (*Broadcast)(const void *, void *, size_t, int, int, ddl_nccl_comm_t, void *);
    nccl_res_t (*AllGather)(const void *, void *, size_t, int, ddl_nccl_comm_t, void *);
    nccl_res_t (*ReduceScatter)(const void *, void *, size_t, int, int, ddl_nccl_comm_t, void *);
    nccl_res_t (*GroupStart)(void);
    nccl_res_t (*GroupEnd)(void);
} nc = {.lock = PTHREAD_MUTEX_INITIALIZER};

static ddl_status_t nccl_fail(nccl_res_t r, const char *what, ddl_nccl_comm_t comm) {
    const char *s = nc.GetErrorString ? nc.GetErrorString(r) : NULL;
    const char *last = nc.GetLastError ? nc.GetLastError(comm) : NULL;
    return ddl_fail(DDL_ERR_NCCL, "%s failed: %s (NCCL error %d)%s%s", what,
                    s ? s : "unknown NCCL error", r, last && *last ? ": " : "",
                    last && *last ? last : "");
}
#define NC(call, what, comm)                                                              \
    do {                                                                                  \
        nccl_res_t nc_rc_ = (call);                                                       \
        if (nc_rc_ != 0) return nccl_fail(nc_rc_, what, comm);                            \
    } while (0)

static void load_locked(void) {
    static const char *const sonames[] = {"libnccl.so.2", "libnccl.so", NULL};
    static const char *const subdirs[] = {"nccl/lib", NULL};
    char tried[2800];
    nc.state = -1;
    nc.handle = ddl_dl_search("DDL_NCCL_LIB", sonames, subdirs, tried, sizeof tried, nc.from,
                              sizeof nc.from);
    if (!nc.handle) {
        snprintf(nc.error, sizeof nc.error,
                 "NCCL not found (set DDL_NCCL_LIB to libnccl.so.2, or pip install "
                 "nvidia-nccl-cu13 / conda install nccl); tried %s",
                 tried);
        return;
    }
    struct {
        void **slot;
        const char *name;
        int optional;
    } syms[] = {{(void **)&nc.GetVersion, "ncclGetVersion", 0},
                {(void **)&nc.GetErrorString, "ncclGetErrorString", 0},
                {(void **)&nc.GetLastError, "ncclGetLastError", 1},
                {(void **)&nc.GetUniqueId, "ncclGetUniqueId", 0},
                {(void **)&nc.CommInitRank, "ncclCommInitRank", 0},
                {(void **)&nc.CommSplit, "ncclCommSplit", 1},
                {(void **)&nc.CommDestroy, "ncclCommDestroy", 0},
                {(void **)&nc.AllReduce, "ncclAllReduce", 0},
                {(void **)&nc.Broadcast, "ncclBroadcast", 0},
                {(void **)&nc.AllGather, "ncclAllGather", 0},
                {(void **)&nc.ReduceScatter, "ncclReduceScatter", 0},
                {(void **)&nc.GroupStart, "ncclGroupStart", 0},
                {(void **)&nc.GroupEnd, "ncclGroupEnd", 0}};
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        dlerror();
        *syms[i].slot = dlsym(nc.handle, syms[i].name);
        if (!*syms[i].slot && !syms[i].optional) {
            const char *e = dlerror();
            snprintf(nc.error, sizeof nc.error, "NCCL %s lacks %s: %s", nc.from, syms[i].name,
                     e ? e : "symbol not found");
            return;
        }
    }
    nccl_res_t r = nc.GetVersion(&nc.version);
    if (r != 0) {
        snprintf(nc.error, sizeof nc.error, "ncclGetVersion in %s failed (NCCL error %d)",
                 nc.from, r);
        return;
    }
    /* bfloat16 and ncclAvg arrived in NCCL 2.10. */
    if (nc.version < 21000) {
        snprintf(nc.error, sizeof nc.error, "NCCL %s is version %d; libddl needs 2.10 or later",
                 nc.from, nc.version);
        return;
    }
    nc.state = 1;
}

ddl_status_t ddl_nccl_load(void) {
    if (__atomic_load_n(&nc.state, __ATOMIC_ACQUIRE) == 1) return DDL_SUCCESS;
    pthread_mutex_lock(&nc.lock);
    if (nc.state == 0) load_locked();
    int ok = nc.state == 1;
    char msg[sizeof nc.error];
    snprintf(msg, sizeof msg, "%s", nc.error);
    pthread_mutex_unlock(&nc.lock);
    return ok ? DDL_SUCCESS : ddl_fail(DDL_ERR_UNSUPPORTED, "%s", msg);
}

void ddl_nccl_describe(char *out, size_t n) {
    pthread_mutex_lock(&nc.lock);
    if (nc.state == 1)
        snprintf(out, n, "nccl=%s\nnccl_version=%d\n", nc.from, nc.version);
    else
        snprintf(out, n, "nccl=\nnccl_error=%s\n", nc.state == 0 ? "not loaded yet" : nc.error);
    pthread_mutex_unlock(&nc.lock);
}

int ddl_nccl_version(void) { return nc.state == 1 ? nc.version : 0; }

/* libddl's dtypes and ops in NCCL's numbering. */
static const int nccl_dtype[DDL_NUM_DTYPES] = {
    [DDL_FLOAT16] = 6, [DDL_BFLOAT16] = 9, [DDL_FLOAT32] = 7, [DDL_FLOAT64] = 8,
    [DDL_INT8] = 0,    [DDL_UINT8] = 1,    [DDL_INT32] = 2,   [DDL_INT64] = 4};
static const int nccl_op[DDL_NUM_OPS] = {
    [DDL_SUM] = 0, [DDL_AVG] = 4, [DDL_MIN] = 3, [DDL_MAX] = 2, [DDL_PROD] = 1,
    [DDL_BAND] = -1, [DDL_BOR] = -1, [DDL_BXOR] = -1}; /* (none: gpu.c stages those) */

ddl_status_t ddl_nccl_unique_id(ddl_nccl_id_t *id) {
    NC(nc.GetUniqueId(id), "ncclGetUniqueId", NULL);
    return DDL_SUCCESS;
}

ddl_status_t ddl_nccl_comm_init(ddl_nccl_comm_t *comm, int nranks, const ddl_nccl_id_t *id,
                                int rank) {
    NC(nc.CommInitRank(comm, nranks, *id, rank), "ncclCommInitRank", NULL);
    return DDL_SUCCESS;
}

int ddl_nccl_can_split(void) { return nc.CommSplit != NULL; }

ddl_status_t ddl_nccl_comm_split(ddl_nccl_comm_t parent, int color, int key,
                                 ddl_nccl_comm_t *out) {
    NC(nc.CommSplit(parent, color, key, out, NULL), "ncclCommSplit", parent);
    return DDL_SUCCESS;
}

ddl_status_t ddl_nccl_comm_destroy(ddl_nccl_comm_t comm) {
    if (!comm) return DDL_SUCCESS;
    NC(nc.CommDestroy(comm), "ncclCommDestroy", NULL);
    return DDL_SUCCESS;
}

ddl_status_t ddl_nccl_allreduce(const void *send, void *recv, size_t count, ddl_dtype_t dtype,
                                ddl_op_t op, ddl_nccl_comm_t comm, void *stream) {
    NC(nc.AllReduce(send, recv, count, nccl_dtype[dtype], nccl_op[op], comm, stream),
       "ncclAllReduce", comm);
    return DDL_SUCCESS;
}

ddl_status_t ddl_nccl_broadcast(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                ddl_nccl_comm_t comm, void *stream) {
    NC(nc.Broadcast(buf, buf, count, nccl_dtype[dtype], root, comm, stream), "ncclBroadcast",
       comm);
    return DDL_SUCCESS;
}

ddl_status_t ddl_nccl_allgather(const void *send, void *recv, size_t sendcount,
                                ddl_dtype_t dtype, ddl_nccl_comm_t comm, void *stream) {
    NC(nc.AllGather(send, recv, sendcount, nccl_dtype[dtype], comm, stream), "ncclAllGather",
       comm);
    return DDL_SUCCESS;
}

ddl_status_t ddl_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                     ddl_dtype_t dtype, ddl_op_t op, ddl_nccl_comm_t comm,
                                     void *stream) {
    NC(nc.ReduceScatter(send, recv, recvcount, nccl_dtype[dtype], nccl_op[op], comm, stream),
       "ncclReduceScatter", comm);
    return DDL_SUCCESS;
}

ddl_status_t ddl_nccl_group(int start) {
    if (start)
        NC(nc.GroupStart(), "ncclGroupStart", NULL);
    else
        NC(nc.GroupEnd(), "ncclGroupEnd", NULL);
    return DDL_SUCCESS;
}

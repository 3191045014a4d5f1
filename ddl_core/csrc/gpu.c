/* Collectives on GPU buffers: NCCL per topology level, or staging through host memory.
 *
 * Every device collective starts like the host ones, with the header-only mismatch check
 * over MPI, so ranks that disagree (or pass device buffers on some ranks and host buffers
 * on others, or could not load CUDA) all fail instead of hanging in NCCL. The signature
 * carries a "device" bit, and a rank whose local checks failed sends a poisoned one.
 *
 * The first device collective decides the path, collectively (so every rank takes the
 * same one):
 *   - NCCL, when every rank loaded it (nccl.c), DDL_NCCL is not 0, and no two ranks of a
 *     node use the same GPU (PCI bus ids gathered over the node): NCCL refuses duplicate
 *     GPUs in one communicator. A world communicator (ncclCommInitRank, the unique id
 *     broadcast over MPI, NCCL ranks = MPI_COMM_WORLD ranks) and one per topology level
 *     (ncclCommSplit with the level's color and the rank's coordinate as key) are made.
 *   - otherwise staging through pinned host memory with libddl's MPI algorithms, said
 *     once in the log (rank 0) with the reason.
 *
 * The allreduce over several levels is hierarchical, as Horovod's: reduce-scatter on each
 * inner level (innermost first), allreduce on the outermost (NCCL, or with
 * DDL_NCCL_OUTER=mpi staged through host memory over the level's MPI communicator), then
 * allgather back outwards. A segment that does not split evenly leaves a tail of fewer
 * elements than the level has ranks; it is allreduced level by level. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

enum { MODE_UNDECIDED = 0, MODE_NCCL = 1, MODE_STAGED = 2 };
enum { NCCL_OFF = 0, NCCL_AUTO = 1, NCCL_REQUIRE = 2 };
enum { WHY_DISABLED = 1, WHY_NOT_FOUND = 2, WHY_SHARED_GPU = 4 };

#define DEV_FLAG 0x8000000000000000ULL
#define POISON 0x5bd1e9955bd1e995ULL

static struct {
    pthread_mutex_t lock;
    int setting;   /* DDL_NCCL */
    int outer_mpi; /* DDL_NCCL_OUTER=mpi */
    int mode;
    int device;
    int why;
    ddl_nccl_comm_t world;
    ddl_nccl_comm_t level[DDL_MAX_LEVELS];
    void *pinned;
    size_t pinned_len;
    uint64_t nccl_calls, staged_calls, host_calls;
} gs = {.lock = PTHREAD_MUTEX_INITIALIZER, .setting = NCCL_AUTO};

static const char *why_text(int why, char *out, size_t n) {
    snprintf(out, n, "%s%s%s",
             why & WHY_DISABLED ? "DDL_NCCL=0 was set; " : "",
             why & WHY_NOT_FOUND ? "NCCL could not be loaded on some rank; " : "",
             why & WHY_SHARED_GPU ? "several ranks share one GPU, which NCCL refuses in one "
                                    "communicator; "
                                  : "");
    size_t len = strlen(out);
    if (len >= 2) out[len - 2] = 0;
    return out;
}

void ddl_gpu_configure(int nccl, int outer_mpi) {
    gs.setting = nccl == DDL_NCCL_OFF ? NCCL_OFF : nccl == DDL_NCCL_REQUIRE ? NCCL_REQUIRE
                                                                            : NCCL_AUTO;
    gs.outer_mpi = outer_mpi;
}

void ddl_gpu_finalize(void) {
    pthread_mutex_lock(&gs.lock);
    for (int l = 0; l < DDL_MAX_LEVELS; l++) {
        if (gs.level[l] && gs.level[l] != gs.world) ddl_nccl_comm_destroy(gs.level[l]);
        gs.level[l] = NULL;
    }
    if (gs.world) ddl_nccl_comm_destroy(gs.world);
    gs.world = NULL;
    ddl_cuda_host_free(gs.pinned);
    gs.pinned = NULL;
    gs.pinned_len = 0;
    gs.mode = MODE_UNDECIDED;
    pthread_mutex_unlock(&gs.lock);
}

static ddl_status_t pinned(size_t bytes, char **out) {
    if (bytes == 0) bytes = 1;
    if (gs.pinned_len < bytes) {
        size_t want = bytes < ((size_t)1 << 20) ? (size_t)1 << 20 : bytes + bytes / 4;
        void *p = NULL;
        DDL_CHECK(ddl_cuda_host_alloc(&p, want));
        ddl_cuda_host_free(gs.pinned);
        gs.pinned = p;
        gs.pinned_len = want;
    }
    *out = gs.pinned;
    return DDL_SUCCESS;
}

/* ---- the shared start: local checks, then the collective verdict ----------------------- */

static ddl_status_t classify(const void *a, const void *b, int *dev, int *device) {
    int da = 0, db = 0, va = -1, vb = -1;
    if (a && a != DDL_IN_PLACE) DDL_CHECK(ddl_cuda_classify(a, &da, &va));
    if (b && b != DDL_IN_PLACE) DDL_CHECK(ddl_cuda_classify(b, &db, &vb));
    int have_a = a && a != DDL_IN_PLACE, have_b = b && b != DDL_IN_PLACE;
    if (have_a && have_b && da != db)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "one buffer is in GPU memory and the other in host memory: pass both "
                        "on the GPU or both on the host");
    if (have_a && have_b && da && va != vb)
        return ddl_fail(DDL_ERR_INVALID_ARG, "the buffers are on different GPUs (%d and %d)",
                        va, vb);
    if (!have_a && !have_b) { /* zero elements and no pointers: a device call, moving nothing */
        *dev = 1;
        *device = -1;
        return DDL_SUCCESS;
    }
    *dev = have_a ? da : db;
    *device = have_a ? va : vb;
    if (*dev && gs.mode != MODE_UNDECIDED && *device != gs.device)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "a buffer on GPU %d, but libddl's communicators were made for GPU %d "
                        "by the first device collective: use one GPU per rank",
                        *device, gs.device);
    return DDL_SUCCESS;
}

static ddl_status_t begin(const void *a, const void *b, uint64_t sig, uint64_t count,
                          const char *coll, int *dev, int *device) {
    char local_msg[1024] = "";
    ddl_status_t local = ddl_cuda_load();
    if (local == DDL_SUCCESS) local = classify(a, b, dev, device);
    if (local != DDL_SUCCESS) snprintf(local_msg, sizeof local_msg, "%s", ddl_last_error());
    uint64_t s = local != DDL_SUCCESS ? sig ^ POISON : *dev ? sig ^ DEV_FLAG : sig;
    ddl_header_t h;
    ddl_header_init(&h, s, count);
    DDL_CHECK(ddl_rd_allreduce_checked(&ddl_g.app.world, &h, NULL, 0, DDL_UINT8, DDL_SUM));
    if (local != DDL_SUCCESS) return ddl_fail_verbatim(local, local_msg);
    return ddl_header_verdict(&h, coll);
}

/* ---- deciding the path and making the NCCL communicators (collective) ------------------ */

static ddl_status_t shared_gpu(int device, int *shared) {
    char bus[64];
    memset(bus, 0, sizeof bus);
    /* A rank that cannot tell its GPU still takes part in the exchange below (the others
     * are already in it), as a GPU of its own. */
    if (ddl_cuda_bus_id(device, bus, (int)sizeof bus - 1) != DDL_SUCCESS) {
        ddl_log(0, "cannot read the PCI bus id of GPU %d (%s): assuming it is not shared",
                device, ddl_last_error());
        snprintf(bus, sizeof bus, "unknown-%d", ddl_g.rank);
    }
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(ddl_g.app.world.comm, MPI_COMM_TYPE_SHARED, ddl_g.rank,
                                  MPI_INFO_NULL, &node));
    int n = 0;
    MPI_CHECK(MPI_Comm_size(node, &n));
    char *all = malloc((size_t)n * sizeof bus);
    if (!all) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for %d bus ids", n);
    int rc = MPI_Allgather(bus, (int)sizeof bus, MPI_CHAR, all, (int)sizeof bus, MPI_CHAR, node);
    int rc_free = MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS || rc_free != MPI_SUCCESS) {
        free(all);
        return ddl_mpi_fail(rc != MPI_SUCCESS ? rc : rc_free,
                            rc != MPI_SUCCESS ? "MPI_Allgather of the GPUs' PCI bus ids"
                                              : "MPI_Comm_free");
    }
    *shared = 0;
    for (int i = 0; i < n && !*shared; i++)
        for (int j = i + 1; j < n; j++)
            if (!strcmp(all + (size_t)i * sizeof bus, all + (size_t)j * sizeof bus)) {
                *shared = 1;
                break;
            }
    free(all);
    return DDL_SUCCESS;
}

static ddl_status_t make_comms(int device) {
    ddl_topo_t *t = &ddl_g.app.topo;
    int cur = 0;
    DDL_CHECK(ddl_cuda_get_device(&cur));
    DDL_CHECK(ddl_cuda_set_device(device));
    ddl_nccl_id_t id;
    ddl_status_t st = DDL_SUCCESS;
    if (ddl_g.rank == 0) st = ddl_nccl_unique_id(&id);
    /* Rank 0 failing to make an id still has to answer the broadcast. */
    int ok = st == DDL_SUCCESS;
    MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, ddl_g.app.world.comm));
    if (!ok) return ddl_g.rank == 0 ? st : ddl_fail(DDL_ERR_NCCL, "ncclGetUniqueId failed on rank 0");
    MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, ddl_g.app.world.comm));
    DDL_CHECK(ddl_nccl_comm_init(&gs.world, ddl_g.size, &id, ddl_g.rank));
    if (t->nlevels == 1) {
        gs.level[0] = gs.world;
    } else {
        for (int l = 0; l < t->nlevels; l++) {
            int color = ddl_topo_level_color(t, l);
            if (ddl_nccl_can_split()) {
                DDL_CHECK(ddl_nccl_comm_split(gs.world, color, t->coord[l], &gs.level[l]));
            } else { /* NCCL < 2.18: one unique id per level communicator */
                const ddl_mpicomm_t *lc = &t->level[l];
                ok = 1;
                if (lc->rank == 0) ok = ddl_nccl_unique_id(&id) == DDL_SUCCESS;
                MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, lc->comm));
                if (!ok) return ddl_fail(DDL_ERR_NCCL, "ncclGetUniqueId failed for level %d", l);
                MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, lc->comm));
                DDL_CHECK(ddl_nccl_comm_init(&gs.level[l], lc->size, &id, lc->rank));
            }
        }
    }
    return ddl_cuda_set_device(cur);
}

static ddl_status_t decide(int device) {
    if (gs.mode != MODE_UNDECIDED) return DDL_SUCCESS;
    int why = 0;
    char nccl_err[1024] = "";
    if (gs.setting == NCCL_OFF) {
        why |= WHY_DISABLED;
    } else if (ddl_nccl_load() != DDL_SUCCESS) {
        why |= WHY_NOT_FOUND;
        snprintf(nccl_err, sizeof nccl_err, "%s", ddl_last_error());
    }
    if (ddl_g.size > 1) {
        int shared = 0;
        DDL_CHECK(shared_gpu(device, &shared));
        if (shared) why |= WHY_SHARED_GPU;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &why, 1, MPI_INT, MPI_BOR, ddl_g.app.world.comm));
    }
    char text[512];
    why_text(why, text, sizeof text);
    if (why && gs.setting == NCCL_REQUIRE)
        return ddl_fail(DDL_ERR_UNSUPPORTED, "DDL_NCCL=1 but NCCL cannot serve: %s%s%s", text,
                        nccl_err[0] ? "; here: " : "", nccl_err);
    gs.device = device;
    gs.why = why;
    if (why) {
        gs.mode = MODE_STAGED;
        if (ddl_g.rank == 0)
            ddl_log(0, "device buffers are staged through host memory over MPI: %s%s%s", text,
                    nccl_err[0] ? "; " : "", nccl_err);
        return DDL_SUCCESS;
    }
    ddl_status_t st = make_comms(device);
    if (st != DDL_SUCCESS) { /* leave nothing half made: the next call starts afresh */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ddl_last_error());
        for (int l = 0; l < DDL_MAX_LEVELS; l++) {
            if (gs.level[l] && gs.level[l] != gs.world) ddl_nccl_comm_destroy(gs.level[l]);
            gs.level[l] = NULL;
        }
        if (gs.world) ddl_nccl_comm_destroy(gs.world);
        gs.world = NULL;
        return ddl_fail_verbatim(st, msg);
    }
    gs.mode = MODE_NCCL;
    ddl_log(1, "device buffers on NCCL %d, GPU %d, %d level(s)", ddl_nccl_version(), device,
            ddl_g.app.topo.nlevels);
    return DDL_SUCCESS;
}

/* ---- NCCL paths ----------------------------------------------------------------------- */

/* Allreduce of n elements at p over the MPI communicator of one level, in host memory. */
static ddl_status_t host_level_allreduce(const ddl_mpicomm_t *lc, void *p, size_t n,
                                         ddl_dtype_t dtype, ddl_op_t op) {
    ddl_op_t wop = ddl_wire_op(op);
    if (n >= (size_t)lc->size * 1024) {
        DDL_CHECK(ddl_ring_reduce_scatter(lc, p, p, n, dtype, wop));
        DDL_CHECK(ddl_ring_allgather(lc, p, n, dtype));
    } else {
        DDL_CHECK(ddl_mpi_allreduce(lc, p, n, dtype, wop));
    }
    if (op == DDL_AVG) ddl_finish_avg(p, n, dtype, lc->size);
    return DDL_SUCCESS;
}

static ddl_status_t level_allreduce(int l, char *p, size_t n, ddl_dtype_t dtype, ddl_op_t op,
                                    void *stream) {
    ddl_topo_t *t = &ddl_g.app.topo;
    if (n == 0) return DDL_SUCCESS;
    if (l == t->nlevels - 1 && gs.outer_mpi && t->nlevels > 1) {
        size_t bytes = n * ddl_dtype_size(dtype);
        char *h;
        DDL_CHECK(pinned(bytes, &h));
        DDL_CHECK(ddl_cuda_copy(h, p, bytes, stream));
        DDL_CHECK(ddl_cuda_sync(stream));
        DDL_CHECK(host_level_allreduce(&t->level[l], h, n, dtype, op));
        DDL_CHECK(ddl_cuda_copy(p, h, bytes, stream));
        return ddl_cuda_sync(stream);
    }
    return ddl_nccl_allreduce(p, p, n, dtype, op, gs.level[l], stream);
}

/* Reduce-scatter inner levels, allreduce the outermost, allgather back (in place on p). */
static ddl_status_t hier(int l, char *p, size_t n, ddl_dtype_t dtype, ddl_op_t op,
                         void *stream) {
    ddl_topo_t *t = &ddl_g.app.topo;
    if (l == t->nlevels - 1) return level_allreduce(l, p, n, dtype, op, stream);
    size_t es = ddl_dtype_size(dtype), parts = (size_t)t->dims[l], blk = n / parts;
    size_t tail = n - blk * parts;
    if (blk) {
        char *mine = p + (size_t)t->coord[l] * blk * es;
        DDL_CHECK(ddl_nccl_reduce_scatter(p, mine, blk, dtype, op, gs.level[l], stream));
        DDL_CHECK(hier(l + 1, mine, blk, dtype, op, stream));
        DDL_CHECK(ddl_nccl_allgather(mine, p, blk, dtype, gs.level[l], stream));
    }
    for (int m = l; tail && m < t->nlevels; m++)
        DDL_CHECK(level_allreduce(m, p + blk * parts * es, tail, dtype, op, stream));
    return DDL_SUCCESS;
}

static ddl_status_t nccl_allreduce(const void *send, void *recv, size_t count,
                                   ddl_dtype_t dtype, ddl_op_t op, void *stream) {
    ddl_topo_t *t = &ddl_g.app.topo;
    const void *in = send == DDL_IN_PLACE ? recv : send;
    if (t->nlevels == 1) return ddl_nccl_allreduce(in, recv, count, dtype, op, gs.world, stream);
    size_t es = ddl_dtype_size(dtype);
    DDL_CHECK(ddl_cuda_copy(recv, in, count * es, stream));
    int int_avg = op == DDL_AVG && dtype != DDL_FLOAT16 && dtype != DDL_BFLOAT16 &&
                  dtype != DDL_FLOAT32 && dtype != DDL_FLOAT64;
    /* Floats average per level (the mean of means of a full grid is the mean); integers
     * sum and divide once at the end, truncating once as the host path does. */
    DDL_CHECK(hier(0, recv, count, dtype, int_avg ? DDL_SUM : op, stream));
    if (int_avg && count) {
        char *h;
        DDL_CHECK(pinned(count * es, &h));
        DDL_CHECK(ddl_cuda_copy(h, recv, count * es, stream));
        DDL_CHECK(ddl_cuda_sync(stream));
        ddl_finish_avg(h, count, dtype, ddl_g.size);
        DDL_CHECK(ddl_cuda_copy(recv, h, count * es, stream));
        DDL_CHECK(ddl_cuda_sync(stream));
    }
    return DDL_SUCCESS;
}

/* ---- the public entry points ------------------------------------------------------------ */

static ddl_status_t check_args(const void *buf, size_t count, int dtype, int op,
                               const char *fn) {
    DDL_CHECK(ddl_require_init());
    if (!ddl_dtype_valid(dtype))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, dtype);
    DDL_CHECK(ddl_check_op(dtype, op, fn));
    if (count > 0 && buf == NULL)
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer for %zu elements", fn, count);
    return DDL_SUCCESS;
}

/* Host memory passed to a _stream call: wait for the stream, then the host collective. */
#define HOST_FALLBACK(call)                                                               \
    do {                                                                                  \
        DDL_CHECK(ddl_cuda_sync(stream));                                                 \
        gs.host_calls++;                                                                  \
        return (call);                                                                    \
    } while (0)

static ddl_status_t allreduce_locked(const void *send, void *recv, size_t count,
                                     ddl_dtype_t dtype, ddl_op_t op, void *stream) {
    if (send == NULL && count) return ddl_fail(DDL_ERR_INVALID_ARG, "NULL send buffer");
    /* One rank, in place: there is nothing to move (the no-copy fast path). */
    if (ddl_g.size == 1 && (send == DDL_IN_PLACE || send == recv)) {
        DDL_CHECK(ddl_cuda_load());
        return DDL_SUCCESS;
    }
    uint64_t sig = ddl_signature(DDL_COLL_ALLREDUCE, count, dtype, op, 0);
    int dev = 0, device = -1;
    DDL_CHECK(begin(send, recv, sig, count, "allreduce", &dev, &device));
    if (!dev) HOST_FALLBACK(ddl_allreduce_ctx(&ddl_g.app, send, recv, count, dtype, op, sig));
    if (count == 0) return DDL_SUCCESS;
    DDL_CHECK(decide(device));
    if (gs.mode == MODE_NCCL && !ddl_op_bitwise(op)) { /* (NCCL has no bitwise ops) */
        gs.nccl_calls++;
        return nccl_allreduce(send, recv, count, dtype, op, stream);
    }
    gs.staged_calls++;
    size_t bytes = count * ddl_dtype_size(dtype);
    char *h;
    DDL_CHECK(pinned(bytes, &h));
    DDL_CHECK(ddl_cuda_copy(h, send == DDL_IN_PLACE ? recv : send, bytes, stream));
    DDL_CHECK(ddl_cuda_sync(stream));
    DDL_CHECK(ddl_allreduce_ctx(&ddl_g.app, h, h, count, dtype, op, sig));
    DDL_CHECK(ddl_cuda_copy(recv, h, bytes, stream));
    return ddl_cuda_sync(stream);
}

static ddl_status_t broadcast_locked(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                     void *stream) {
    uint64_t sig = ddl_signature(DDL_COLL_BROADCAST, count, dtype, 0, root);
    int dev = 0, device = -1;
    DDL_CHECK(begin(buf, NULL, sig, count, "broadcast", &dev, &device));
    if (!dev) HOST_FALLBACK(ddl_broadcast_ctx(&ddl_g.app, buf, count, dtype, root));
    if (count == 0) return DDL_SUCCESS;
    DDL_CHECK(decide(device));
    if (gs.mode == MODE_NCCL) {
        gs.nccl_calls++;
        return ddl_nccl_broadcast(buf, count, dtype, root, gs.world, stream);
    }
    gs.staged_calls++;
    size_t bytes = count * ddl_dtype_size(dtype);
    char *h;
    DDL_CHECK(pinned(bytes, &h));
    if (ddl_g.rank == root) {
        DDL_CHECK(ddl_cuda_copy(h, buf, bytes, stream));
        DDL_CHECK(ddl_cuda_sync(stream));
    }
    DDL_CHECK(ddl_broadcast_ctx(&ddl_g.app, h, count, dtype, root));
    if (ddl_g.rank != root) {
        DDL_CHECK(ddl_cuda_copy(buf, h, bytes, stream));
        DDL_CHECK(ddl_cuda_sync(stream));
    }
    return DDL_SUCCESS;
}

static ddl_status_t allgather_locked(const void *send, void *recv, size_t sendcount,
                                     ddl_dtype_t dtype, void *stream) {
    uint64_t sig = ddl_signature(DDL_COLL_ALLGATHER, sendcount, dtype, 0, 0);
    int dev = 0, device = -1;
    DDL_CHECK(begin(send, recv, sig, sendcount, "allgather", &dev, &device));
    if (!dev) HOST_FALLBACK(ddl_allgather_ctx(&ddl_g.app, send, recv, sendcount, dtype));
    if (sendcount == 0) return DDL_SUCCESS;
    DDL_CHECK(decide(device));
    size_t bytes = sendcount * ddl_dtype_size(dtype), P = (size_t)ddl_g.size;
    char *mine = (char *)recv + (size_t)ddl_g.rank * bytes;
    const void *in = send == DDL_IN_PLACE ? mine : send;
    if (gs.mode == MODE_NCCL) {
        gs.nccl_calls++;
        return ddl_nccl_allgather(in, recv, sendcount, dtype, gs.world, stream);
    }
    gs.staged_calls++;
    char *h;
    DDL_CHECK(pinned(bytes * P, &h));
    DDL_CHECK(ddl_cuda_copy(h + (size_t)ddl_g.rank * bytes, in, bytes, stream));
    DDL_CHECK(ddl_cuda_sync(stream));
    DDL_CHECK(ddl_allgather_ctx(&ddl_g.app, DDL_IN_PLACE, h, sendcount, dtype));
    DDL_CHECK(ddl_cuda_copy(recv, h, bytes * P, stream));
    return ddl_cuda_sync(stream);
}

static ddl_status_t reduce_scatter_locked(const void *send, void *recv, size_t recvcount,
                                          ddl_dtype_t dtype, ddl_op_t op, void *stream) {
    uint64_t sig = ddl_signature(DDL_COLL_REDUCE_SCATTER, recvcount, dtype, op, 0);
    int dev = 0, device = -1;
    DDL_CHECK(begin(send, recv, sig, recvcount, "reduce_scatter", &dev, &device));
    if (!dev)
        HOST_FALLBACK(ddl_reduce_scatter_ctx(&ddl_g.app, send, recv, recvcount, dtype, op));
    if (recvcount == 0) return DDL_SUCCESS;
    DDL_CHECK(decide(device));
    size_t bytes = recvcount * ddl_dtype_size(dtype), P = (size_t)ddl_g.size;
    const void *in = send == DDL_IN_PLACE ? recv : send;
    if (gs.mode == MODE_NCCL && !ddl_op_bitwise(op)) { /* (NCCL has no bitwise ops) */
        gs.nccl_calls++;
        return ddl_nccl_reduce_scatter(in, recv, recvcount, dtype, op, gs.world, stream);
    }
    gs.staged_calls++;
    char *h;
    DDL_CHECK(pinned(bytes * P, &h));
    DDL_CHECK(ddl_cuda_copy(h, in, bytes * P, stream));
    DDL_CHECK(ddl_cuda_sync(stream));
    DDL_CHECK(ddl_reduce_scatter_ctx(&ddl_g.app, h, h, recvcount, dtype, op));
    DDL_CHECK(ddl_cuda_copy(recv, h, bytes, stream));
    return ddl_cuda_sync(stream);
}

#define LOCKED(call)                                                                      \
    do {                                                                                  \
        pthread_mutex_lock(&gs.lock);                                                     \
        ddl_status_t locked_rc_ = (call);                                                 \
        pthread_mutex_unlock(&gs.lock);                                                   \
        return locked_rc_;                                                                \
    } while (0)

ddl_status_t ddl_allreduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                  ddl_dtype_t dtype, ddl_op_t op, void *stream) {
    DDL_CHECK(check_args(recvbuf, count, (int)dtype, (int)op, "ddl_allreduce_stream"));
    LOCKED(allreduce_locked(sendbuf, recvbuf, count, dtype, op, stream));
}

ddl_status_t ddl_broadcast_stream(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                  void *stream) {
    DDL_CHECK(check_args(buf, count, (int)dtype, -1, "ddl_broadcast_stream"));
    if (root < 0 || root >= ddl_g.size)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_broadcast_stream: root %d is not a rank (0..%d)",
                        root, ddl_g.size - 1);
    LOCKED(broadcast_locked(buf, count, dtype, root, stream));
}

ddl_status_t ddl_allgather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                  ddl_dtype_t dtype, void *stream) {
    DDL_CHECK(check_args(recvbuf, sendcount, (int)dtype, -1, "ddl_allgather_stream"));
    LOCKED(allgather_locked(sendbuf, recvbuf, sendcount, dtype, stream));
}

ddl_status_t ddl_reduce_scatter_stream(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddl_dtype_t dtype, ddl_op_t op, void *stream) {
    DDL_CHECK(check_args(recvbuf, recvcount, (int)dtype, (int)op, "ddl_reduce_scatter_stream"));
    LOCKED(reduce_scatter_locked(sendbuf, recvbuf, recvcount, dtype, op, stream));
}

int ddl_gpu_info(char *buf, size_t len) {
    if (!buf || len == 0) return 0;
    char cuda[4096], nccl[4096], why[512];
    ddl_cuda_load();
    ddl_nccl_load();
    ddl_cuda_describe(cuda, sizeof cuda);
    ddl_nccl_describe(nccl, sizeof nccl);
    pthread_mutex_lock(&gs.lock);
    static const char *modes[] = {"undecided", "nccl", "staged"};
    static const char *settings[] = {"0", "auto", "1"};
    int n = snprintf(buf, len,
                     "%s%sddl_nccl=%s\nouter=%s\nmode=%s\nstaged_reason=%s\ndevice=%d\n"
                     "nccl_calls=%llu\nstaged_calls=%llu\nhost_calls=%llu\n",
                     cuda, nccl, settings[gs.setting], gs.outer_mpi ? "mpi" : "nccl",
                     modes[gs.mode], why_text(gs.why, why, sizeof why),
                     gs.mode ? gs.device : -1, (unsigned long long)gs.nccl_calls,
                     (unsigned long long)gs.staged_calls, (unsigned long long)gs.host_calls);
    pthread_mutex_unlock(&gs.lock);
    return n;
}

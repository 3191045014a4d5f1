/* Communicators: the world one, split and created ones, their timeouts, and the 1.x
 * collectives (allreduce, broadcast, allgather, reduce_scatter, barrier) on any of them.
 *
 * A sub-communicator gets its own context, exactly like the world's blocking context:
 * duplicated MPI communicators (so its messages never meet another communicator's), its
 * own collective counter and its own topology grid. The grid is the world's restricted to
 * the members when they form a sub-grid (every combination of the coordinates they hold
 * is a member: e.g. the first rank of every node of a 2x2 grid gives a 1x2 grid), else
 * flat; the cost model plans per communicator from that grid. Nothing in a context is
 * shared with another one, so collectives on disjoint communicators may run at the same
 * time from different threads (scratch memory and error messages are per thread). */
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

static struct ddl_comm_s world_comm;

static ddl_status_t bad_handle(ddl_comm_t c, const char *fn) {
    if (!c)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "%s: NULL communicator (this rank is not a member of it: "
                        "ddl_comm_split/ddl_comm_create gave NULL here)",
                        fn);
    if (c->magic != DDL_COMM_MAGIC)
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: not a communicator (a stale or bad handle)",
                        fn);
    return ddl_fail(DDL_ERR_INVALID_ARG,
                    "%s: the communicator was freed (ddl_comm_free); use a live one", fn);
}

/* A communicator with its own timeout makes it the thread's for the call; *saved is what
 * to restore (-1: nothing changed, the common case, which then costs nothing: the world's
 * 8-byte allreduce is a few hundred nanoseconds). */
ddl_status_t ddl_comm_enter(ddl_comm_t c, const char *fn, double *saved) {
    DDL_CHECK(ddl_require_init());
    if (!c || c->magic != DDL_COMM_MAGIC || c->freed) return bad_handle(c, fn);
    *saved = -1.0;
    ddl_cur_comm = c;
    ddl_cur.cctx = NULL;
    /* A communicator that lost a member (ft.c) answers only its local queries now. */
    if (__atomic_load_n(&c->ft_failed, __ATOMIC_ACQUIRE) && !ddl_ft_exempt(fn))
        return ddl_ft_refuse(c, fn);
    if (c->timeout_s > 0) {
        *saved = ddl_thread_timeout();
        ddl_set_thread_timeout(c->timeout_s);
    }
    return DDL_SUCCESS;
}

void ddl_comm_leave(double saved) {
    if (saved >= 0) ddl_set_thread_timeout(saved);
}

/* The world communicator's point-to-point MPI communicator is made by ddl_init, where
 * every rank takes part anyway: made on first use, its MPI_Comm_dup would be a hidden
 * collective that ranks doing no point-to-point never join (two ranks of three exchanging
 * messages hung in it). */
ddl_status_t ddl_comm_world_setup(void) {
    world_comm.is_world = 1;
    world_comm.ctx = &ddl_g.app;
    ddl_g.app.owner = ddl_g.progress.owner = &world_comm;
    MPI_CHECK(MPI_Comm_dup(ddl_base_comm, &world_comm.p2p));
    MPI_CHECK(MPI_Comm_set_errhandler(world_comm.p2p, MPI_ERRORS_RETURN));
    world_comm.world_ranks = NULL;
    pthread_mutex_init(&world_comm.recv_lock, NULL);
    world_comm.magic = DDL_COMM_MAGIC;
    return DDL_SUCCESS;
}

void ddl_comm_world_teardown(void) {
    if (world_comm.magic != DDL_COMM_MAGIC) return;
    world_comm.magic = 0;
    MPI_Comm_free(&world_comm.p2p);
}

ddl_comm_t ddl_world_comm(void) { return &world_comm; }

ddl_status_t ddl_comm_world(ddl_comm_t *out) {
    DDL_CHECK(ddl_require_init());
    if (!out) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_world: NULL output pointer");
    *out = &world_comm;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_rank(ddl_comm_t c, int *rank) {
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_rank", &saved));
    ddl_comm_leave(saved);
    *rank = c->ctx->world.rank;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_size(ddl_comm_t c, int *size) {
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_size", &saved));
    ddl_comm_leave(saved);
    *size = c->ctx->world.size;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_topology(ddl_comm_t c, int *nlevels, int dims[DDL_MAX_LEVELS]) {
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_topology", &saved));
    ddl_comm_leave(saved);
    if (!nlevels || !dims)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_topology: NULL output pointer");
    *nlevels = c->ctx->topo.nlevels;
    for (int i = 0; i < *nlevels; i++) dims[i] = c->ctx->topo.dims[i];
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_world_rank(ddl_comm_t c, int rank, int *world_rank) {
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_world_rank", &saved));
    ddl_comm_leave(saved);
    if (rank < 0 || rank >= c->ctx->world.size)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_world_rank: %d is not a rank (0..%d)",
                        rank, c->ctx->world.size - 1);
    *world_rank = ddl_comm_world_of(c, rank);
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_set_timeout(ddl_comm_t c, double seconds) {
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_set_timeout", &saved));
    ddl_comm_leave(saved);
    if (!(seconds >= 0) || seconds > 1e9)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "ddl_comm_set_timeout: %g is not a timeout; give seconds > 0, or 0 for "
                        "DDL_TIMEOUT", seconds);
    c->timeout_s = seconds;
    return DDL_SUCCESS;
}

/* The members' grid: the world grid restricted to them when they fill a sub-grid. Writes
 * dims/nlevels and this rank's position in grid order (*key); nlevels 1 means flat. */
static ddl_status_t restricted_grid(MPI_Comm comm, int size, int *dims, int *nlevels,
                                    int *key) {
    const ddl_topo_t *w = &ddl_g.app.topo;
    int L = w->nlevels;
    int *all = malloc(sizeof(int) * (size_t)(L * size));
    if (!all) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the communicator's grid");
    MPI_Request req;
    int rc = MPI_Iallgather(w->coord, L, MPI_INT, all, L, MPI_INT, comm, &req);
    if (rc != MPI_SUCCESS) {
        free(all);
        return ddl_mpi_fail(rc, "MPI_Iallgather");
    }
    ddl_mpicomm_t tmp = {comm, 0, size, 0};
    ddl_status_t st = ddl_wait_request(&req, &tmp, "MPI_Iallgather (communicator grid)");
    if (st != DDL_SUCCESS) {
        free(all);
        return st;
    }
    int me;
    MPI_Comm_rank(comm, &me);
    long prod = 1;
    int pos = 0, stride = 1;
    for (int l = 0; l < L; l++) {
        /* Distinct coordinates at level l and this rank's index among them (sorted). */
        int distinct = 0, below = 0;
        for (int i = 0; i < size; i++) {
            int v = all[i * L + l], first = 1;
            for (int j = 0; j < i; j++)
                if (all[j * L + l] == v) first = 0;
            if (!first) continue;
            distinct++;
            if (v < all[me * L + l]) below++;
        }
        dims[l] = distinct;
        prod *= distinct;
        pos += below * stride;
        stride *= distinct;
    }
    /* Members are distinct grid points, so size == the product means a full sub-grid. */
    if (prod == size && L > 1) {
        *nlevels = L;
        *key = pos;
    } else {
        *nlevels = 1;
        dims[0] = size;
        *key = me;
    }
    free(all);
    return DDL_SUCCESS;
}

static ddl_status_t comm_setup(ddl_comm_t c, MPI_Comm newcomm) {
    ddl_mpicomm_t *cw = &c->own.world;
    c->prog.world.comm = MPI_COMM_NULL;
    c->p2p = MPI_COMM_NULL;
    pthread_mutex_init(&c->recv_lock, NULL);
    cw->comm = newcomm;
    cw->piece = 0;
    MPI_CHECK(MPI_Comm_set_errhandler(newcomm, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(newcomm, &cw->rank));
    MPI_CHECK(MPI_Comm_size(newcomm, &cw->size));
    c->own.id = -1; /* liveness: its members only (dooms() in liveness.c), no diagnosis */
    c->ctx = &c->own;
    c->own.owner = c->prog.owner = c;
    int dims[DDL_MAX_LEVELS], nlevels = 1, key = 0;
    DDL_CHECK(restricted_grid(newcomm, cw->size, dims, &nlevels, &key));
    MPI_Comm base;
    MPI_CHECK(MPI_Comm_split(newcomm, 0, key, &base));
    ddl_status_t st = ddl_topo_build(&c->own, base, dims, nlevels);
    /* The engine's context: communicators of its own, so its progress thread's messages
     * never meet the application thread's. */
    if (st == DDL_SUCCESS && ddl_progress_running()) {
        int rc = MPI_Comm_dup(newcomm, &c->prog.world.comm);
        if (rc != MPI_SUCCESS) st = ddl_mpi_fail(rc, "MPI_Comm_dup");
        if (st == DDL_SUCCESS) {
            c->prog.world.rank = cw->rank;
            c->prog.world.size = cw->size;
            c->prog.id = -1;
            st = ddl_topo_build(&c->prog, base, dims, nlevels);
        }
    }
    MPI_Comm_free(&base);
    DDL_CHECK(st);
    MPI_CHECK(MPI_Comm_dup(newcomm, &c->p2p));
    MPI_CHECK(MPI_Comm_set_errhandler(c->p2p, MPI_ERRORS_RETURN));
    c->world_ranks = malloc(sizeof(int) * (size_t)cw->size);
    if (!c->world_ranks) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a communicator");
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(&ddl_g.rank, 1, MPI_INT, c->world_ranks, 1, MPI_INT, newcomm, &req));
    DDL_CHECK(ddl_wait_request(&req, cw, "MPI_Iallgather (communicator members)"));
    c->own.members = c->prog.members = c->world_ranks;
    c->own.nmembers = c->prog.nmembers = cw->size;
    if (c->prog.world.comm != MPI_COMM_NULL) DDL_CHECK(ddl_engine_create(&c->prog, &c->eng));
    c->magic = DDL_COMM_MAGIC;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_split(ddl_comm_t parent, int color, int key, ddl_comm_t *out) {
    double saved;
    DDL_CHECK(ddl_comm_enter(parent, "ddl_comm_split", &saved));
    ddl_status_t st = DDL_SUCCESS;
    if (!out) st = ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_split: NULL output pointer");
    else if (color < 0 && color != DDL_UNDEFINED)
        st = ddl_fail(DDL_ERR_INVALID_ARG,
                      "ddl_comm_split: color %d is negative; use >= 0, or DDL_UNDEFINED to "
                      "take no part", color);
    if (st != DDL_SUCCESS) {
        ddl_comm_leave(saved);
        return st;
    }
    *out = NULL;
    ddl_ctx_t *ctx = parent->ctx;
    /* Every member has arrived (within the timeout) before MPI's split, which has none.
     * Counted as a collective of the parent, as on every member (liveness.c's verdicts). */
    ddl_coll_begin(ctx, "comm_split", 1);
    st = ddl_comm_check(ctx, ddl_signature(DDL_COLL_COMM_SPLIT, 0, 0, 0, 0), 0, "ddl_comm_split");
    MPI_Comm nc = MPI_COMM_NULL;
    if (st == DDL_SUCCESS) {
        int rc = MPI_Comm_split(ctx->world.comm, color == DDL_UNDEFINED ? MPI_UNDEFINED : color,
                                key, &nc);
        if (rc != MPI_SUCCESS) st = ddl_mpi_fail(rc, "MPI_Comm_split");
    }
    if (st == DDL_SUCCESS && nc != MPI_COMM_NULL) {
        ddl_comm_t c = calloc(1, sizeof *c);
        if (!c) st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a communicator");
        else if ((st = comm_setup(c, nc)) == DDL_SUCCESS) {
            c->timeout_s = parent->timeout_s;
            *out = c;
        }
    }
    ddl_comm_leave(saved);
    return st;
}

ddl_status_t ddl_comm_create(ddl_comm_t parent, const int *ranks, int n, ddl_comm_t *out) {
    double saved;
    DDL_CHECK(ddl_comm_enter(parent, "ddl_comm_create", &saved));
    int size = parent->ctx->world.size, me = parent->ctx->world.rank, color = DDL_UNDEFINED,
        key = 0;
    ddl_status_t st = DDL_SUCCESS;
    if (!out || (n > 0 && !ranks) || n < 0)
        st = ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_create: NULL or negative argument");
    for (int i = 0; st == DDL_SUCCESS && i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= size)
            st = ddl_fail(DDL_ERR_INVALID_ARG,
                          "ddl_comm_create: rank %d is not in the parent communicator (0..%d)",
                          ranks[i], size - 1);
        for (int j = 0; st == DDL_SUCCESS && j < i; j++)
            if (ranks[j] == ranks[i])
                st = ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_create: rank %d is listed twice",
                              ranks[i]);
        if (ranks[i] == me) {
            color = 0;
            key = i;
        }
    }
    /* Every rank must pass the same list (as MPI_Group_incl): its hash is checked first, so
     * differing lists fail on every rank instead of building a communicator nobody meant. */
    if (st == DDL_SUCCESS) {
        ddl_coll_begin(parent->ctx, "comm_create", 1);
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)ranks[i]) * 1099511628211ull;
        st = ddl_comm_check(parent->ctx, ddl_signature(DDL_COLL_COMM_SPLIT, h, 1, 0, 0), h,
                            "ddl_comm_create (the rank lists differ between ranks)");
    }
    ddl_comm_leave(saved);
    DDL_CHECK(st);
    return ddl_comm_split(parent, color, key, out);
}

/* ---- fault tolerance (ft.c), groups made by their members, foreign communicators ---- */

ddl_status_t ddl_comm_setup_from(ddl_comm_t c, MPI_Comm newcomm) { return comm_setup(c, newcomm); }

/* Set once this process has a communicator with members of another MPI world (spawned
 * and merged): from then on a member's "world rank" may name a process of either world,
 * so nothing trusts the liveness watcher's word about a member (ft.c's shrink check). */
int ddl_foreign_members = 0;

/* What ddl_comm_free releases, for a communicator comm_setup built completely. */
void ddl_comm_teardown(ddl_comm_t c) {
    c->freed = 1;
    ddl_engine_destroy(c->eng); /* what is queued on it runs (or fails) first */
    c->eng = NULL;
    if (c->prog.world.comm != MPI_COMM_NULL) {
        ddl_topo_free(&c->prog);
        MPI_Comm_free(&c->prog.world.comm);
    }
    ddl_shm_release(&c->own);
    ddl_topo_free(&c->own);
    if (c->own.world.comm != MPI_COMM_NULL) MPI_Comm_free(&c->own.world.comm);
    if (c->p2p != MPI_COMM_NULL) MPI_Comm_free(&c->p2p);
    free(c->world_ranks);
    c->world_ranks = NULL;
    c->own.members = NULL;
    ddl_ft_forget(c);
}

/* The tag MPI_Comm_create_group's own messages carry on the parent's point-to-point
 * communicator: above the users' tags (0..32767), so they never meet a user message. */
#define CREATE_GROUP_TAG 40961

ddl_status_t ddl_comm_create_group(ddl_comm_t parent, const int *ranks, int n, ddl_comm_t *out) {
    double saved;
    DDL_CHECK(ddl_comm_enter(parent, "ddl_comm_create_group", &saved));
    ddl_comm_leave(saved);
    int size = parent->ctx->world.size, me = parent->ctx->world.rank, mine = 0;
    if (!out || n <= 0 || !ranks)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "ddl_comm_create_group: NULL output, or an empty or NULL rank list");
    *out = NULL;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= size)
            return ddl_fail(DDL_ERR_INVALID_ARG,
                            "ddl_comm_create_group: rank %d is not in the parent communicator "
                            "(0..%d)", ranks[i], size - 1);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return ddl_fail(DDL_ERR_INVALID_ARG,
                                "ddl_comm_create_group: rank %d is listed twice", ranks[i]);
        if (ranks[i] == me) mine = 1;
    }
    if (!mine)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "ddl_comm_create_group: rank %d is not in the list: only the members "
                        "call it (ddl_comm_create is the call every rank makes)", me);
    MPI_Group pg, g;
    MPI_CHECK(MPI_Comm_group(parent->p2p, &pg));
    int rc = MPI_Group_incl(pg, n, ranks, &g);
    MPI_Group_free(&pg);
    if (rc != MPI_SUCCESS) return ddl_mpi_fail(rc, "MPI_Group_incl");
    MPI_Comm nc = MPI_COMM_NULL;
    rc = MPI_Comm_create_group(parent->p2p, g, CREATE_GROUP_TAG, &nc);
    MPI_Group_free(&g);
    if (rc != MPI_SUCCESS) return ddl_mpi_fail(rc, "MPI_Comm_create_group");
    ddl_comm_t c = calloc(1, sizeof *c);
    if (!c) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a communicator");
    DDL_CHECK(comm_setup(c, nc));
    c->timeout_s = parent->timeout_s;
    *out = c;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_from_mpi(intptr_t mpi_comm, ddl_comm_t *out) {
    DDL_CHECK(ddl_require_init());
    if (!out) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_from_mpi: NULL argument");
    *out = NULL;
    MPI_Comm given = ddl_comm_of_handle(mpi_comm), nc;
    if (given == MPI_COMM_NULL)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_from_mpi: MPI_COMM_NULL");
    int inter = 0;
    MPI_CHECK(MPI_Comm_test_inter(given, &inter));
    if (inter)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_from_mpi: an intercommunicator; merge "
                        "it first (MPI_Intercomm_merge)");
    MPI_CHECK(MPI_Comm_dup(given, &nc));
    ddl_comm_t c = calloc(1, sizeof *c);
    if (!c) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a communicator");
    DDL_CHECK(comm_setup(c, nc));
    /* Members from another MPI world (spawned and merged) have no rank in this one:
     * world_ranks says -1 for them, and the liveness watcher, which knows this world's
     * ranks only, leaves them to ULFM. */
    MPI_Group g, w;
    MPI_CHECK(MPI_Comm_group(nc, &g));
    MPI_CHECK(MPI_Comm_group(ddl_base_comm, &w));
    int size = c->own.world.size, *seq = malloc(sizeof(int) * (size_t)size);
    if (!seq) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a communicator");
    for (int i = 0; i < size; i++) seq[i] = i;
    int rc = MPI_Group_translate_ranks(g, size, seq, w, c->world_ranks);
    free(seq);
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    if (rc != MPI_SUCCESS) return ddl_mpi_fail(rc, "MPI_Group_translate_ranks");
    for (int i = 0; i < size; i++)
        if (c->world_ranks[i] == MPI_UNDEFINED) {
            c->world_ranks[i] = -1;
            ddl_foreign_members = 1;
        }
    *out = c;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_free(ddl_comm_t *cp) {
    if (!cp) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_free: NULL pointer");
    ddl_comm_t c = *cp;
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_free", &saved));
    ddl_comm_leave(saved);
    if (c->is_world)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "ddl_comm_free: the world communicator is freed by ddl_finalize");
    ddl_comm_teardown(c);
    /* The struct itself is kept (a few hundred bytes) so a stale handle is reported. */
    *cp = NULL;
    return DDL_SUCCESS;
}

/* ---- the 1.x collectives on a communicator ------------------------------------------ */

static ddl_status_t args_ok(ddl_comm_t c, const void *buf, size_t count, int dtype, int op,
                            int root, const char *fn) {
    if (!ddl_dtype_valid(dtype))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, dtype);
    if (op >= 0) DDL_CHECK(ddl_check_op(dtype, op, fn));
    if (count > 0 && buf == NULL)
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer for %zu elements", fn, count);
    if (root != -1 && (root < 0 || root >= c->ctx->world.size))
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "%s: root %d is not a rank of the communicator (0..%d)", fn, root,
                        c->ctx->world.size - 1);
    return DDL_SUCCESS;
}

#define COMM_CALL(c, fn, argcheck, body)                                                  \
    do {                                                                                  \
        double saved_;                                                                    \
        DDL_CHECK(ddl_comm_enter(c, fn, &saved_));                                        \
        ddl_status_t st_ = (argcheck);                                                    \
        if (st_ == DDL_SUCCESS) st_ = (body);                                             \
        ddl_comm_leave(saved_);                                                           \
        return st_;                                                                       \
    } while (0)

ddl_status_t ddl_comm_allreduce(ddl_comm_t c, const void *sendbuf, void *recvbuf, size_t count,
                                ddl_dtype_t dtype, ddl_op_t op) {
    COMM_CALL(c, "ddl_comm_allreduce",
              sendbuf == NULL && count
                  ? ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_allreduce: NULL send buffer (in "
                             "place: DDL_IN_PLACE)")
                  : args_ok(c, recvbuf, count, (int)dtype, (int)op, -1, "ddl_comm_allreduce"),
              ddl_allreduce_ctx(c->ctx, sendbuf, recvbuf, count, dtype, op,
                                ddl_signature(DDL_COLL_ALLREDUCE, count, dtype, op, 0)));
}

ddl_status_t ddl_comm_broadcast(ddl_comm_t c, void *buf, size_t count, ddl_dtype_t dtype,
                                int root) {
    COMM_CALL(c, "ddl_comm_broadcast",
              args_ok(c, buf, count, (int)dtype, -1, root, "ddl_comm_broadcast"),
              ddl_broadcast_ctx(c->ctx, buf, count, dtype, root));
}

ddl_status_t ddl_comm_allgather(ddl_comm_t c, const void *sendbuf, void *recvbuf,
                                size_t sendcount, ddl_dtype_t dtype) {
    COMM_CALL(c, "ddl_comm_allgather",
              args_ok(c, recvbuf, sendcount, (int)dtype, -1, -1, "ddl_comm_allgather"),
              ddl_allgather_ctx(c->ctx, sendbuf, recvbuf, sendcount, dtype));
}

ddl_status_t ddl_comm_reduce_scatter(ddl_comm_t c, const void *sendbuf, void *recvbuf,
                                     size_t recvcount, ddl_dtype_t dtype, ddl_op_t op) {
    COMM_CALL(c, "ddl_comm_reduce_scatter",
              args_ok(c, recvbuf, recvcount, (int)dtype, (int)op, -1, "ddl_comm_reduce_scatter"),
              ddl_reduce_scatter_ctx(c->ctx, sendbuf, recvbuf, recvcount, dtype, op));
}

ddl_status_t ddl_comm_barrier(ddl_comm_t c) {
    COMM_CALL(c, "ddl_comm_barrier", DDL_SUCCESS, ddl_barrier_ctx(c->ctx));
}

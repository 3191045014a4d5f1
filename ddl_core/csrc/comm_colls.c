/* The collectives libddl 2 adds, on any communicator: alltoall(v), allgatherv, gather,
 * scatter, reduce, and point-to-point send/recv with tags.
 *
 * Each collective first runs the header-only signature check of every DDL collective
 * (collectives.c), so a count, dtype, op or root that differs between members fails with
 * DDL_ERR_MISMATCH on every member before any data moves, and a member that never arrives
 * is a DDL_ERR_TIMEOUT after the communicator's timeout. The data then moves with MPI's
 * own non-blocking routine, waited for under the same deadline: for these exchanges (one
 * message per pair, or a tree to a root) the MPI library's algorithm is the one to beat,
 * and the benchmark (python -m ddl_core.bench alltoall|...) compares against it. reduce
 * reuses DDL's own reductions (16-bit floats reduced in float32, canonical NaN, avg,
 * bitwise ops), which MPI's reduce would not: below 256 KiB (or for counts that do not
 * split evenly) the allreduce engine, above it DDL's reduce-scatter then each block sent to
 * the root. allgatherv is a ring of DDL exchanges (see ring_allgatherv).
 *
 * Two ranks on one node take shm.c's paths instead: its segment's slots, and for large
 * moves its direct copies between the two processes (see SHM_MOVE_MAX and DIRECT_MIN). */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

/* reduce switches from allreduce-then-drop to reduce-scatter + gather from here. */
#define REDUCE_SPLIT_MIN ((size_t)256 * 1024)
/* Two ranks without a shared segment: from here reduce is pipelined over MPI messages in
 * chunks of REDUCE_CHUNK (each lands in a cache-warm buffer and is reduced from there). */
#define REDUCE_PAIR_MIN ((size_t)64 * 1024)
#define REDUCE_CHUNK ((size_t)256 * 1024)
/* A two-rank call of this many bytes in all or more goes through shared memory where the
 * pair shares a node (shm.c): measured against MPI's routine, it won from 4 KiB (reduce,
 * where MPI leaves its eager protocol) and at >= 1 MiB for every collective here. */
#define SHM_MIN ((size_t)4 * 1024)
/* alltoall, gather and scatter only up to this total: beyond the caches a move through
 * the segment (a copy in, a copy out) lost to MPI's single-copy pull straight from the
 * other rank's buffer (0.88-0.97x at 32-64 MiB). */
#define SHM_MOVE_MAX ((size_t)8 * 1024 * 1024)
/* From this total, alltoall and scatter on a node-local pair whose ranks can reach each
 * other's memory (ddl_shm_direct_ok) copy straight across, each rank one part (shm.c's
 * direct move); gather above it, allgatherv above twice it. Measured (python -m
 * ddl_core.bench alltoall|gather|scatter|allgatherv, 2 ranks, A/B runs): at 8 MiB scatter
 * through the segment ran at 0.6x MPI and straight across at 1.4x, alltoall 0.8-0.9x
 * against 1.0x; gather through the segment still won there (1.6x against 0.9-1.2x) and
 * lost from 16 MiB (0.9x against 1.1-1.6x); allgatherv through the segment won up to
 * 16 MiB (1.2-1.7x) and fell to 0.7-0.9x at 32-64 MiB in half the runs, where straight
 * across held 1.0-1.15x. (The segment hands over a chunk at a time, so it suffers most
 * when the two vCPUs share no cache.) */
#define DIRECT_MIN SHM_MOVE_MAX
/* Tags of DDL's own exchanges here (algos.c uses 101-105 on the topology communicators). */
enum { TAG_ALLGATHERV = 110, TAG_REDUCE_GATHER = 111, TAG_REDUCE_RESULT = 112 };

static ddl_status_t fits_int(size_t bytes, const char *fn) {
    if (bytes > (size_t)INT_MAX)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "%s: %zu bytes in one block is over the 2 GiB MPI allows per message; "
                        "split the call into smaller ones", fn, bytes);
    return DDL_SUCCESS;
}

static ddl_status_t common(ddl_comm_t c, int dtype, int op, int root, const char *fn) {
    if (!ddl_dtype_valid(dtype))
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "%s: unknown dtype %d; use one of float16, bfloat16, float32, float64, "
                        "int8, uint8, int32, int64", fn, dtype);
    if (op >= 0) DDL_CHECK(ddl_check_op(dtype, op, fn));
    if (root != -1 && (root < 0 || root >= c->ctx->world.size))
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "%s: root %d is not a rank of the communicator (0..%d)", fn, root,
                        c->ctx->world.size - 1);
    return DDL_SUCCESS;
}

/* Runs `body` with the communicator's deadline, after the argument checks. */
#define ENTER(c, fn)                                                                      \
    double saved_;                                                                        \
    DDL_CHECK(ddl_comm_enter(c, fn, &saved_))
#define LEAVE(st)                                                                         \
    do {                                                                                  \
        ddl_comm_leave(saved_);                                                           \
        return (st);                                                                      \
    } while (0)

static ddl_status_t wait_mpi(ddl_ctx_t *ctx, int rc, MPI_Request *req, const char *what) {
    if (rc != MPI_SUCCESS) return ddl_mpi_fail(rc, what);
    return ddl_wait_request(req, &ctx->world, what);
}

/* The shared segment for a call of `bytes` in all on a two-rank communicator whose ranks
 * share a node (shm.c; collective: both ranks ask at the same call); NULL: MPI's way. */
static ddl_status_t pair_shm(ddl_ctx_t *ctx, size_t bytes, size_t max, ddl_shm_t **shm) {
    *shm = NULL;
    if (ctx->world.size != 2 || bytes < SHM_MIN || bytes > max || ctx->shm_state < 0)
        return DDL_SUCCESS;
    return ddl_shm_pair(ctx, shm);
}

/* The pair's direct move for a call of `bytes` in all, from `min` on; else NULL. */
static ddl_shm_t *pair_direct(ddl_ctx_t *ctx, size_t bytes, size_t min, ddl_status_t *st) {
    ddl_shm_t *shm = NULL;
    if (ctx->world.size != 2 || bytes < min) return NULL;
    *st = pair_shm(ctx, bytes, SIZE_MAX, &shm);
    return *st == DDL_SUCCESS && ddl_shm_direct_ok(shm) ? shm : NULL;
}

static void copy_own(void *dst, const void *src, size_t n) {
    if (n && dst != src) memcpy(dst, src, n);
}

ddl_status_t ddl_comm_alltoall(ddl_comm_t c, const void *sendbuf, void *recvbuf, size_t count,
                               ddl_dtype_t dtype) {
    const char *fn = "ddl_comm_alltoall";
    ENTER(c, fn);
    ddl_ctx_t *ctx = c->ctx;
    size_t es = ddl_dtype_size(dtype);
    ddl_status_t st = common(c, (int)dtype, -1, -1, fn);
    if (st == DDL_SUCCESS && count && (!recvbuf || !sendbuf))
        st = ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer", fn);
    if (st == DDL_SUCCESS) st = fits_int(count * es, fn);
    if (st != DDL_SUCCESS) LEAVE(st);
    if (sendbuf == recvbuf) sendbuf = DDL_IN_PLACE; /* (MPI forbids aliased buffers) */
    ddl_coll_begin(ctx, "alltoall", 1);
    st = ddl_comm_check(ctx, ddl_signature(DDL_COLL_ALLTOALL, count, dtype, 0, 0), count,
                        "alltoall");
    ddl_shm_t *shm = NULL, *direct = NULL;
    if (st == DDL_SUCCESS && count && sendbuf != DDL_IN_PLACE)
        direct = pair_direct(ctx, 2 * count * es, DIRECT_MIN, &st);
    if (st == DDL_SUCCESS && count && !direct)
        st = pair_shm(ctx, 2 * count * es, SHM_MOVE_MAX, &shm);
    if (st == DDL_SUCCESS && direct) {
        /* each rank reads its block from the other's sendbuf, and copies its own */
        size_t B = count * es;
        int me = ctx->world.rank, peer = 1 - me;
        ddl_shm_direct_t d = {.post = sendbuf, .pull = 1, .local = (char *)recvbuf + peer * B,
                              .bytes = B, .off = me * B, .peer_acts = 1,
                              .own_src = (const char *)sendbuf + me * B,
                              .own_dst = (char *)recvbuf + me * B, .own_bytes = B,
                              .waiting = "waiting for the other rank's blocks (alltoall)"};
        st = ddl_shm_direct(ctx, direct, &d);
    } else if (st == DDL_SUCCESS && shm) {
        size_t B = count * es;
        int me = ctx->world.rank, peer = 1 - me;
        const char *src = sendbuf == DDL_IN_PLACE ? recvbuf : sendbuf;
        /* in place, chunk k goes out before the other's chunk k lands on it */
        ddl_shm_move_t m = {.out = src + (size_t)peer * B, .out_bytes = B,
                            .in = (char *)recvbuf + (size_t)peer * B, .in_bytes = B,
                            .two_way = 1, .waiting_out = "waiting for it to take our block",
                            .waiting_in = "waiting for its block"};
        st = ddl_shm_move(ctx, shm, &m);
        if (st == DDL_SUCCESS) copy_own((char *)recvbuf + (size_t)me * B, src + (size_t)me * B, B);
    } else if (st == DDL_SUCCESS && count) {
        MPI_Request req;
        int rc = MPI_Ialltoall(sendbuf == DDL_IN_PLACE ? MPI_IN_PLACE : sendbuf,
                               (int)(count * es), MPI_BYTE, recvbuf, (int)(count * es),
                               MPI_BYTE, ctx->world.comm, &req);
        st = wait_mpi(ctx, rc, &req, "MPI_Ialltoall");
    }
    LEAVE(st);
}

/* counts and displacements in bytes for MPI's v-collectives; NULL on overflow (error set). */
static int *byte_counts(const size_t *counts, int n, size_t es, int **displs, const char *fn,
                        ddl_status_t *st) {
    int *out = malloc(sizeof(int) * 2 * (size_t)n);
    if (!out) {
        *st = ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory", fn);
        return NULL;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t b = counts[i] * es;
        if (b > (size_t)INT_MAX || off > (size_t)INT_MAX) {
            free(out);
            *st = fits_int(b > off ? b : off, fn);
            return NULL;
        }
        out[i] = (int)b;
        out[n + i] = (int)off;
        off += b;
    }
    if (off > (size_t)INT_MAX) {
        free(out);
        *st = fits_int(off, fn);
        return NULL;
    }
    *displs = out + n;
    return out;
}

/* The counts each member says it sends agree with what the receivers expect: `mine[j]`
 * (this rank's count for member j) travels to j with an alltoall (or allgather when
 * `gathered`), and every member learns through a second check whether anyone found a
 * difference. The ranks that saw one name it; the others say which call failed. */
static ddl_status_t check_counts(ddl_ctx_t *ctx, const size_t *mine, const size_t *expect,
                                 int gathered, const char *coll) {
    int n = ctx->world.size;
    uint64_t *got = malloc(sizeof(uint64_t) * (size_t)n);
    uint64_t *sent = malloc(sizeof(uint64_t) * (size_t)n);
    if (!got || !sent) {
        free(got);
        free(sent);
        return ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory", coll);
    }
    for (int i = 0; i < n; i++) sent[i] = gathered ? mine[0] : mine[i];
    MPI_Request req;
    int rc = gathered ? MPI_Iallgather(sent, 1, MPI_UINT64_T, got, 1, MPI_UINT64_T,
                                       ctx->world.comm, &req)
                      : MPI_Ialltoall(sent, 1, MPI_UINT64_T, got, 1, MPI_UINT64_T,
                                      ctx->world.comm, &req);
    ddl_status_t st = wait_mpi(ctx, rc, &req, gathered ? "MPI_Iallgather" : "MPI_Ialltoall");
    int bad = -1;
    for (int i = 0; st == DDL_SUCCESS && i < n; i++)
        if (got[i] != expect[i]) {
            bad = i;
            break;
        }
    char detail[256] = "";
    if (bad >= 0)
        snprintf(detail, sizeof detail,
                 "%s: rank %d sends %llu elements to rank %d (ranks of the communicator), "
                 "which expects %zu: the counts must agree on both sides",
                 coll, bad, (unsigned long long)got[bad], ctx->world.rank, expect[bad]);
    free(got);
    free(sent);
    if (st != DDL_SUCCESS) return st;
    ddl_header_t h;
    ddl_header_init(&h, bad >= 0 ? 2 : 1, 0);
    DDL_CHECK(ddl_rd_allreduce_checked(&ctx->world, &h, NULL, 0, DDL_UINT8, DDL_SUM));
    if (bad >= 0) return ddl_fail(DDL_ERR_MISMATCH, "%s", detail);
    if (h.sig_min != h.sig_max)
        return ddl_fail(DDL_ERR_MISMATCH,
                        "%s: the counts disagree between senders and receivers on another "
                        "rank (named in its error)", coll);
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_alltoallv(ddl_comm_t c, const void *sendbuf, const size_t *sendcounts,
                                void *recvbuf, const size_t *recvcounts, ddl_dtype_t dtype) {
    const char *fn = "ddl_comm_alltoallv";
    ENTER(c, fn);
    ddl_ctx_t *ctx = c->ctx;
    size_t es = ddl_dtype_size(dtype);
    ddl_status_t st = common(c, (int)dtype, -1, -1, fn);
    if (st == DDL_SUCCESS && (!sendcounts || !recvcounts))
        st = ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL counts", fn);
    if (st != DDL_SUCCESS) LEAVE(st);
    int n = ctx->world.size;
    int *sd = NULL, *rd = NULL;
    int *sc = byte_counts(sendcounts, n, es, &sd, fn, &st);
    int *rc_ = sc ? byte_counts(recvcounts, n, es, &rd, fn, &st) : NULL;
    if (st == DDL_SUCCESS) {
        ddl_coll_begin(ctx, "alltoallv", 1);
        st = ddl_comm_check(ctx, ddl_signature(DDL_COLL_ALLTOALLV, 0, dtype, 0, 0), 0,
                            "alltoallv");
    }
    if (st == DDL_SUCCESS) st = check_counts(ctx, sendcounts, recvcounts, 0, "alltoallv");
    if (st == DDL_SUCCESS) {
        MPI_Request req;
        int rc = MPI_Ialltoallv(sendbuf, sc, sd, MPI_BYTE, recvbuf, rc_, rd, MPI_BYTE,
                                ctx->world.comm, &req);
        st = wait_mpi(ctx, rc, &req, "MPI_Ialltoallv");
    }
    free(sc);
    free(rc_);
    LEAVE(st);
}

/* A ring: P-1 steps, each passing on the block received in the step before; every block
 * crosses each link once (bandwidth-optimal). Measured on 2 ranks, 2 MiB: Open MPI's
 * MPI_Iallgatherv took 577 us where its blocking MPI_Allgatherv took 61 us (python -m
 * ddl_core.bench allgatherv); this ring is DDL's exchange under the deadline. */
static ddl_status_t ring_allgatherv(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                    const int *cnt, const int *displ) {
    const ddl_mpicomm_t *c = &ctx->world;
    int p = c->size, r = c->rank;
    char *b = recvbuf;
    if (sendbuf && sendbuf != DDL_IN_PLACE && cnt[r] && (const char *)sendbuf != b + displ[r])
        memcpy(b + displ[r], sendbuf, (size_t)cnt[r]);
    int right = (r + 1) % p, left = (r - 1 + p) % p;
    for (int s = 0; s < p - 1; s++) {
        int sb = ((r - s) % p + p) % p, rb = ((r - s - 1) % p + p) % p;
        DDL_CHECK(ddl_sendrecv(c, b + displ[sb], (size_t)cnt[sb], right, b + displ[rb],
                               (size_t)cnt[rb], left, TAG_ALLGATHERV));
    }
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_allgatherv(ddl_comm_t c, const void *sendbuf, size_t sendcount,
                                 void *recvbuf, const size_t *recvcounts, ddl_dtype_t dtype) {
    const char *fn = "ddl_comm_allgatherv";
    ENTER(c, fn);
    ddl_ctx_t *ctx = c->ctx;
    size_t es = ddl_dtype_size(dtype);
    ddl_status_t st = common(c, (int)dtype, -1, -1, fn);
    if (st == DDL_SUCCESS && !recvcounts)
        st = ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL counts", fn);
    if (st == DDL_SUCCESS) st = fits_int(sendcount * es, fn);
    if (st != DDL_SUCCESS) LEAVE(st);
    int n = ctx->world.size;
    int *rd = NULL;
    int *rcnt = byte_counts(recvcounts, n, es, &rd, fn, &st);
    if (st == DDL_SUCCESS) {
        /* One round checks the counts with everything else: every rank's recvcounts must
         * be the same list and its own sendcount its entry there, so the signature carries
         * a hash of the list, made unique on a rank whose sendcount is not its entry. Only
         * when that check fails do the counts travel (check_counts), to name them. */
        int me = ctx->world.rank;
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < n; i++) h = (h ^ (uint64_t)recvcounts[i]) * 1099511628211ull;
        if (sendcount != recvcounts[me]) h = ~h ^ ((uint64_t)me << 32) ^ sendcount;
        ddl_coll_begin(ctx, "allgatherv", 1);
        st = ddl_comm_check(ctx, ddl_signature(DDL_COLL_ALLGATHERV, h, dtype, 0, 0), 0,
                            "allgatherv");
        if (st == DDL_ERR_MISMATCH) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ddl_last_error());
            ddl_status_t named = check_counts(ctx, &sendcount, recvcounts, 1, "allgatherv");
            st = named != DDL_SUCCESS ? named : ddl_fail_verbatim(st, msg);
        }
    }
    ddl_shm_t *shm = NULL;
    size_t total = 0;
    for (int i = 0; rcnt && i < n; i++) total += (size_t)rcnt[i];
    ddl_shm_t *direct = st == DDL_SUCCESS ? pair_direct(ctx, total, 2 * DIRECT_MIN + 1, &st) : NULL;
    if (st == DDL_SUCCESS && !direct) st = pair_shm(ctx, total, SIZE_MAX, &shm);
    if (st == DDL_SUCCESS && direct) {
        int me = ctx->world.rank, peer = 1 - me;
        char *b = recvbuf;
        /* each rank reads the other's block from where it is, and copies its own: the
         * same work on both whatever the counts */
        const char *src = sendbuf && sendbuf != DDL_IN_PLACE ? sendbuf : b + rd[me];
        ddl_shm_direct_t d = {.post = src, .pull = 1, .local = b + rd[peer],
                              .bytes = (size_t)rcnt[peer], .peer_acts = rcnt[me] > 0,
                              .own_src = src, .own_dst = b + rd[me],
                              .own_bytes = (size_t)rcnt[me],
                              .waiting = "waiting for the other rank's block (allgatherv)"};
        st = ddl_shm_direct(ctx, direct, &d);
    } else if (st == DDL_SUCCESS && shm) {
        /* our block out, and into its place from the slot; the other's in */
        int me = ctx->world.rank, peer = 1 - me;
        char *b = recvbuf;
        const char *src = sendbuf && sendbuf != DDL_IN_PLACE ? sendbuf : b + rd[me];
        ddl_shm_move_t m = {.out = src, .out_bytes = (size_t)rcnt[me],
                            .out_also = src != b + rd[me] ? b + rd[me] : NULL,
                            .in = b + rd[peer], .in_bytes = (size_t)rcnt[peer], .two_way = 1,
                            .waiting_out = "waiting for it to take our block (allgatherv)",
                            .waiting_in = "waiting for its block (allgatherv)"};
        st = ddl_shm_move(ctx, shm, &m);
    } else if (st == DDL_SUCCESS) {
        st = ring_allgatherv(ctx, sendbuf, recvbuf, rcnt, rd);
    }
    free(rcnt);
    LEAVE(st);
}

/* gather (scatter = 0) or scatter: the root's buffer holds size x count elements. */
static ddl_status_t rooted(ddl_comm_t c, const void *sendbuf, void *recvbuf, size_t count,
                           ddl_dtype_t dtype, int root, int scatter) {
    const char *fn = scatter ? "ddl_comm_scatter" : "ddl_comm_gather";
    ENTER(c, fn);
    ddl_ctx_t *ctx = c->ctx;
    size_t es = ddl_dtype_size(dtype);
    ddl_status_t st = common(c, (int)dtype, -1, root, fn);
    if (st == DDL_SUCCESS) st = fits_int(count * es, fn);
    int at_root = ctx->world.rank == root;
    if (st == DDL_SUCCESS && count &&
        (scatter ? (!recvbuf || (at_root && !sendbuf)) : (!sendbuf || (at_root && !recvbuf))))
        st = ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer", fn);
    /* The root's own block, copied from own_src to own_dst; in place (as with MPI_IN_PLACE)
     * there is nothing to copy: gather's root block already sits at its place in recvbuf
     * (sendbuf DDL_IN_PLACE, or that very place), scatter's stays in sendbuf (recvbuf
     * DDL_IN_PLACE, or that very block). */
    size_t B = count * es;
    const char *own_src = NULL;
    char *own_dst = NULL;
    int in_place = 0;
    if (st == DDL_SUCCESS && (scatter ? recvbuf == DDL_IN_PLACE : sendbuf == DDL_IN_PLACE)) {
        in_place = 1;
        if (!at_root)
            st = ddl_fail(DDL_ERR_INVALID_ARG, "%s: DDL_IN_PLACE is for the root's %s only", fn,
                          scatter ? "recvbuf" : "sendbuf");
    } else if (st == DDL_SUCCESS && at_root && count) {
        own_src = scatter ? (const char *)sendbuf + (size_t)root * B : sendbuf;
        own_dst = scatter ? recvbuf : (char *)recvbuf + (size_t)root * B;
        in_place = own_src == own_dst;
    }
    if (st != DDL_SUCCESS) LEAVE(st);
    ddl_coll_begin(ctx, scatter ? "scatter" : "gather", 1);
    st = ddl_comm_check(ctx,
                        ddl_signature(scatter ? DDL_COLL_SCATTER : DDL_COLL_GATHER, count, dtype,
                                      0, root),
                        count, scatter ? "scatter" : "gather");
    ddl_shm_t *shm = NULL, *direct = NULL;
    if (st == DDL_SUCCESS && count)
        direct = pair_direct(ctx, 2 * count * es, scatter ? DIRECT_MIN : DIRECT_MIN + 1, &st);
    if (st == DDL_SUCCESS && count && !direct)
        st = pair_shm(ctx, 2 * count * es, SHM_MOVE_MAX, &shm);
    if (st == DDL_SUCCESS && direct) {
        /* the other rank moves its block (scatter: reads it from the root's sendbuf;
         * gather: writes it into the root's recvbuf) while the root copies its own */
        int peer = 1 - root;
        ddl_shm_direct_t d = {.waiting = scatter ? "waiting for the scatter's root"
                                                 : "waiting for the gather's root"};
        if (at_root) {
            d.post = scatter ? (const char *)sendbuf + (size_t)peer * B
                             : (const char *)recvbuf + (size_t)peer * B;
            d.peer_acts = 1;
            if (!in_place) {
                d.own_src = own_src;
                d.own_dst = own_dst;
                d.own_bytes = B;
            }
        } else {
            d.pull = scatter;
            d.local = scatter ? recvbuf : (char *)(uintptr_t)sendbuf;
            d.bytes = B;
        }
        st = ddl_shm_direct(ctx, direct, &d);
    } else if (st == DDL_SUCCESS && shm) {
        /* one way: the root's block for the other rank out (scatter), or the other rank's
         * block in (gather); the root copies its own */
        int peer = 1 - root;
        ddl_shm_move_t m = {.waiting_out = scatter ? "waiting for it to take its block"
                                                   : "waiting for the root to take our block",
                            .waiting_in = scatter ? "waiting for our block from the root"
                                                  : "waiting for its block"};
        if (at_root && scatter) {
            m.out = (const char *)sendbuf + (size_t)peer * B;
            m.out_bytes = B;
        } else if (at_root) {
            m.in = (char *)recvbuf + (size_t)peer * B;
            m.in_bytes = B;
        } else if (scatter) {
            m.in = recvbuf;
            m.in_bytes = B;
        } else {
            m.out = sendbuf;
            m.out_bytes = B;
        }
        st = ddl_shm_move(ctx, shm, &m);
        if (st == DDL_SUCCESS && at_root && !in_place) copy_own(own_dst, own_src, B);
    } else if (st == DDL_SUCCESS && count) {
        MPI_Request req;
        int b = (int)(count * es);
        int rc = scatter ? MPI_Iscatter(sendbuf, b, MPI_BYTE, in_place ? MPI_IN_PLACE : recvbuf,
                                        b, MPI_BYTE, root, ctx->world.comm, &req)
                         : MPI_Igather(in_place ? MPI_IN_PLACE : sendbuf, b, MPI_BYTE, recvbuf, b,
                                       MPI_BYTE, root, ctx->world.comm, &req);
        st = wait_mpi(ctx, rc, &req, scatter ? "MPI_Iscatter" : "MPI_Igather");
    }
    LEAVE(st);
}

ddl_status_t ddl_comm_gather(ddl_comm_t c, const void *sendbuf, void *recvbuf, size_t count,
                             ddl_dtype_t dtype, int root) {
    return rooted(c, sendbuf, recvbuf, count, dtype, root, 0);
}

ddl_status_t ddl_comm_scatter(ddl_comm_t c, const void *sendbuf, void *recvbuf, size_t count,
                              ddl_dtype_t dtype, int root) {
    return rooted(c, sendbuf, recvbuf, count, dtype, root, 1);
}

/* reduce on two ranks that share no segment (two nodes, or DDL_SHM=0; a node's pair goes
 * through shm.c), pipelined over chunks with the work split: the chunks alternate
 * between the two ranks. The root's chunks (even) come from the other rank and the root
 * reduces them as they land; the other rank's chunks (odd) come from the root, the other
 * rank reduces them and sends the result back into the root's output. Each rank reduces
 * half the data, at the same time, and the root copies 1.5x its size in where a root that
 * reduced everything (MPI_Reduce) copies 1x but reduces 2x alone. On two ranks the
 * reduce-scatter + gather below moves the same bytes, but in two dependent rounds (on one
 * node it ran at 0.3-0.6x Open MPI's MPI_Reduce at 2-32 MiB; this pipeline measured
 * 0.84-0.89x there, the segment 1.5-2.2x: python -m ddl_core.bench reduce). The result
 * is the allreduce's bit for bit: on two ranks each element is one application of the
 * op, which commutes (NaN canonical, -0.0 < +0.0), and avg divides the same sum by 2. */
enum { PAIR_W = 2 }; /* pairs of chunks in flight */

typedef struct {
    const ddl_mpicomm_t *c;
    const char *in;
    char *out;
    size_t count, per, es, chunks;
    ddl_dtype_t dtype;
    ddl_op_t op;
    int peer;
} pair_t;

static size_t pair_n(const pair_t *p, size_t k) {
    return k + 1 < p->chunks ? p->per : p->count - k * p->per;
}

static ddl_status_t pair_root(const pair_t *p, char *tmp, int in_place) {
    const ddl_mpicomm_t *c = p->c;
    size_t pairs = (p->chunks + 1) / 2;
    MPI_Request rd[PAIR_W], sd[PAIR_W], rr[PAIR_W];
    for (int i = 0; i < PAIR_W; i++) rd[i] = sd[i] = rr[i] = MPI_REQUEST_NULL;
    for (size_t j = 0; j < pairs + PAIR_W; j++) {
        if (j >= PAIR_W) { /* finish pair q */
            size_t q = j - PAIR_W, s = q % PAIR_W, k = 2 * q;
            DDL_CHECK(ddl_wait_recv(c, &rd[s], pair_n(p, k) * p->es, p->peer));
            ddl_reduce_pair(p->out + k * p->per * p->es, p->in + k * p->per * p->es,
                            tmp + s * REDUCE_CHUNK, pair_n(p, k), p->dtype, p->op);
            if (k + 1 < p->chunks) {
                size_t b = pair_n(p, k + 1) * p->es;
                char *dst = p->out + (k + 1) * p->per * p->es;
                DDL_CHECK(ddl_wait_request(&sd[s], c, "reduce: sending"));
                if (in_place) /* its input has left: the result may land on it */
                    DDL_CHECK(ddl_irecv(c, dst, b, p->peer, TAG_REDUCE_RESULT, &rr[s]));
                DDL_CHECK(ddl_wait_recv(c, &rr[s], b, p->peer));
            }
        }
        if (j < pairs) { /* start pair j */
            size_t s = j % PAIR_W, k = 2 * j;
            DDL_CHECK(ddl_irecv(c, tmp + s * REDUCE_CHUNK, pair_n(p, k) * p->es, p->peer,
                                TAG_REDUCE_GATHER, &rd[s]));
            if (k + 1 < p->chunks) {
                size_t b = pair_n(p, k + 1) * p->es, off = (k + 1) * p->per * p->es;
                DDL_CHECK(ddl_isend(c, p->in + off, b, p->peer, TAG_REDUCE_GATHER, &sd[s]));
                if (!in_place)
                    DDL_CHECK(ddl_irecv(c, p->out + off, b, p->peer, TAG_REDUCE_RESULT, &rr[s]));
            }
        }
    }
    return DDL_SUCCESS;
}

static ddl_status_t pair_other(const pair_t *p, char *tmp) {
    const ddl_mpicomm_t *c = p->c;
    size_t pairs = (p->chunks + 1) / 2;
    enum { S = 2 * PAIR_W }; /* a slot's result is still leaving while the next fills */
    MPI_Request sd[PAIR_W], rd[S], sr[S];
    for (int i = 0; i < PAIR_W; i++) sd[i] = MPI_REQUEST_NULL;
    for (int i = 0; i < S; i++) rd[i] = sr[i] = MPI_REQUEST_NULL;
    for (size_t j = 0; j < pairs + PAIR_W; j++) {
        if (j >= PAIR_W) { /* finish pair q */
            size_t q = j - PAIR_W, s = q % S, k = 2 * q;
            if (k + 1 < p->chunks) {
                size_t n = pair_n(p, k + 1);
                char *buf = tmp + s * REDUCE_CHUNK;
                DDL_CHECK(ddl_wait_recv(c, &rd[s], n * p->es, p->peer));
                ddl_reduce_pair(buf, buf, p->in + (k + 1) * p->per * p->es, n, p->dtype, p->op);
                DDL_CHECK(ddl_isend(c, buf, n * p->es, p->peer, TAG_REDUCE_RESULT, &sr[s]));
            }
            DDL_CHECK(ddl_wait_request(&sd[q % PAIR_W], c, "reduce: sending"));
        }
        if (j < pairs) { /* start pair j */
            size_t k = 2 * j, s = j % S;
            DDL_CHECK(ddl_isend(c, p->in + k * p->per * p->es, pair_n(p, k) * p->es, p->peer,
                                TAG_REDUCE_GATHER, &sd[j % PAIR_W]));
            if (k + 1 < p->chunks) {
                if (sr[s] != MPI_REQUEST_NULL) /* the slot's last result has left */
                    DDL_CHECK(ddl_wait_request(&sr[s], c, "reduce: sending"));
                DDL_CHECK(ddl_irecv(c, tmp + s * REDUCE_CHUNK, pair_n(p, k + 1) * p->es,
                                    p->peer, TAG_REDUCE_GATHER, &rd[s]));
            }
        }
    }
    for (int i = 0; i < S; i++)
        if (sr[i] != MPI_REQUEST_NULL) DDL_CHECK(ddl_wait_request(&sr[i], c, "reduce: sending"));
    return DDL_SUCCESS;
}

static ddl_status_t reduce_pair(ddl_ctx_t *ctx, const void *in, void *out, size_t count,
                                ddl_dtype_t dtype, ddl_op_t op, int root) {
    const ddl_mpicomm_t *c = &ctx->world;
    size_t es = ddl_dtype_size(dtype), per = REDUCE_CHUNK / es;
    pair_t p = {c, in, out, count, per, es, (count + per - 1) / per, dtype, op, 1 - c->rank};
    int at_root = c->rank == root;
    size_t slots = at_root ? PAIR_W : 2 * PAIR_W;
    char *tmp = ddl_scratch(DDL_SCRATCH_REDUCE, slots * REDUCE_CHUNK);
    if (!tmp) return ddl_fail(DDL_ERR_NO_MEMORY, "reduce: no memory for %zu bytes",
                              slots * REDUCE_CHUNK);
    return at_root ? pair_root(&p, tmp, in == out) : pair_other(&p, tmp);
}

/* reduce through the shared segment: the other rank copies its input in chunk by chunk,
 * the root reduces each chunk from there into its output as it lands. */
static ddl_status_t shm_reduce(ddl_ctx_t *ctx, ddl_shm_t *shm, const void *in, void *out,
                               size_t count, ddl_dtype_t dtype, ddl_op_t op, int root) {
    ddl_shm_move_t m = {.dtype = dtype, .op = op,
                        .waiting_out = "waiting for the root to take our data (reduce)",
                        .waiting_in = "waiting for its data (reduce)"};
    if (ctx->world.rank == root) {
        m.in = out;
        m.in_bytes = count * ddl_dtype_size(dtype);
        m.reduce_a = in;
    } else {
        m.out = in;
        m.out_bytes = count * ddl_dtype_size(dtype);
    }
    return ddl_shm_move(ctx, shm, &m);
}

ddl_status_t ddl_comm_reduce(ddl_comm_t c, const void *sendbuf, void *recvbuf, size_t count,
                             ddl_dtype_t dtype, ddl_op_t op, int root) {
    const char *fn = "ddl_comm_reduce";
    ENTER(c, fn);
    ddl_ctx_t *ctx = c->ctx;
    ddl_status_t st = common(c, (int)dtype, (int)op, root, fn);
    int at_root = ctx->world.rank == root;
    if (st == DDL_SUCCESS && count && (!sendbuf || (at_root && !recvbuf)))
        st = ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer", fn);
    /* In place, the input is in recvbuf (on any rank, as the allreduce has it). */
    if (st == DDL_SUCCESS && count && sendbuf == DDL_IN_PLACE && !recvbuf)
        st = ddl_fail(DDL_ERR_INVALID_ARG, "%s: DDL_IN_PLACE with a NULL recvbuf: in place, "
                      "recvbuf holds the input on every rank", fn);
    if (st != DDL_SUCCESS) LEAVE(st);
    int P = ctx->world.size;
    size_t es = ddl_dtype_size(dtype);
    if (P == 2 && (count * es >= REDUCE_PAIR_MIN ||
                   (count * es >= SHM_MIN && ctx->shm_state >= 0))) {
        const void *in = sendbuf == DDL_IN_PLACE ? recvbuf : sendbuf;
        ddl_coll_begin(ctx, "reduce", 1);
        st = ddl_comm_check(ctx, ddl_signature(DDL_COLL_REDUCE, count, dtype, op, root), count,
                            "reduce");
        ddl_shm_t *shm = NULL;
        if (st == DDL_SUCCESS) st = pair_shm(ctx, count * es, SIZE_MAX, &shm);
        if (st == DDL_SUCCESS)
            st = shm ? shm_reduce(ctx, shm, in, recvbuf, count, dtype, op, root)
                     : reduce_pair(ctx, in, recvbuf, count, dtype, op, root);
        LEAVE(st);
    }
    if (P > 1 && count % (size_t)P == 0 && count * es >= REDUCE_SPLIT_MIN &&
        sendbuf != DDL_IN_PLACE && (count / (size_t)P) * es <= (size_t)INT_MAX) {
        /* Large: reduce-scatter (DDL's, checked with reduce's own signature, root
         * included) then gather the reduced blocks to the root. Each rank reduces and
         * sends 1/P of the data instead of the root reducing everything. */
        size_t part = count / (size_t)P, pb = part * es;
        int me = ctx->world.rank;
        /* The root's own block lands in place; the others send theirs to it. */
        /* (Elsewhere: kept scratch, not a fresh mapping whose pages fault in every call.) */
        void *blk = at_root ? (char *)recvbuf + (size_t)me * pb : ddl_scratch(DDL_SCRATCH_REDUCE, pb);
        if (!blk) LEAVE(ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory for %zu elements", fn, part));
        st = ddl_reduce_scatter_ctx_sig(ctx, sendbuf, blk, part, dtype, op,
                                        ddl_signature(DDL_COLL_REDUCE, count, dtype, op, root));
        for (int q = 0; st == DDL_SUCCESS && at_root && q < P; q++)
            if (q != me)
                st = ddl_sendrecv(&ctx->world, NULL, 0, -1, (char *)recvbuf + (size_t)q * pb, pb,
                                  q, TAG_REDUCE_GATHER);
        if (st == DDL_SUCCESS && !at_root)
            st = ddl_sendrecv(&ctx->world, blk, pb, root, NULL, 0, -1, TAG_REDUCE_GATHER);
        LEAVE(st);
    }
    void *out = at_root ? recvbuf : NULL;
    const void *in = sendbuf;
    if (!at_root && count) {
        out = ddl_scratch(DDL_SCRATCH_REDUCE, count * ddl_dtype_size(dtype));
        if (!out) LEAVE(ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory for %zu elements", fn, count));
    }
    if (sendbuf == DDL_IN_PLACE) in = recvbuf;
    st = ddl_allreduce_ctx(ctx, in == out ? DDL_IN_PLACE : in, out, count, dtype, op,
                           ddl_signature(DDL_COLL_REDUCE, count, dtype, op, root));
    LEAVE(st);
}

/* ---- point-to-point ----------------------------------------------------------------- */

ddl_status_t ddl_p2p_check(ddl_comm_t c, const void *buf, size_t count, ddl_dtype_t dtype,
                           int peer, int tag, const char *fn) {
    DDL_CHECK(common(c, (int)dtype, -1, -1, fn));
    int n = c->ctx->world.size;
    if (peer < 0 || peer >= n)
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: peer %d is not a rank of the communicator "
                        "(0..%d)", fn, peer, n - 1);
    if (tag < 0 || tag > 32767)
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: tag %d is outside 0..32767", fn, tag);
    if (count && !buf) return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer", fn);
    return fits_int(count * ddl_dtype_size(dtype), fn);
}

ddl_status_t ddl_comm_send(ddl_comm_t c, const void *buf, size_t count, ddl_dtype_t dtype,
                           int dest, int tag) {
    const char *fn = "ddl_comm_send";
    ENTER(c, fn);
    ddl_status_t st = ddl_p2p_check(c, buf, count, dtype, dest, tag, fn);
    if (st != DDL_SUCCESS) LEAVE(st);
    ddl_coll_begin(c->ctx, "send", 0);
    ddl_mpicomm_t pc = {c->p2p, c->ctx->world.rank, c->ctx->world.size, 0};
    MPI_Request req;
    int rc = MPI_Isend(buf, (int)(count * ddl_dtype_size(dtype)), MPI_BYTE, dest, tag, c->p2p,
                       &req);
    st = rc != MPI_SUCCESS ? ddl_mpi_fail(rc, "MPI_Isend")
                           : ddl_wait_request_bytes(&req, &pc, "send",
                                                    count * ddl_dtype_size(dtype));
    LEAVE(st);
}

ddl_status_t ddl_comm_recv(ddl_comm_t c, void *buf, size_t count, ddl_dtype_t dtype, int source,
                           int tag) {
    const char *fn = "ddl_comm_recv";
    ENTER(c, fn);
    ddl_status_t st = ddl_p2p_check(c, buf, count, dtype, source, tag, fn);
    if (st != DDL_SUCCESS) LEAVE(st);
    ddl_coll_begin(c->ctx, "recv", 0);
    size_t want = count * ddl_dtype_size(dtype);
    /* Probe first: a message of another size is received whole into scratch (so the sender
     * completes and nothing stays queued) and reported with both sizes, never truncated. */
    double deadline = ddl_now() + ddl_deadline_s();
    unsigned gen0 = ddl_liveness_gen();
    MPI_Message msg;
    MPI_Status mst;
    for (unsigned spin = 0;; spin++) {
        int flag = 0;
        int rc = MPI_Improbe(source, tag, c->p2p, &flag, &msg, &mst);
        if (rc != MPI_SUCCESS) LEAVE(ddl_mpi_fail(rc, "MPI_Improbe"));
        if (flag) break;
        if (ddl_liveness_gen() != gen0) {
            st = ddl_liveness_verdict();
            if (st != DDL_SUCCESS) LEAVE(st);
            gen0 = ddl_liveness_gen();
        }
        if ((spin & 255) == 255) {
            if (ddl_now() > deadline)
                LEAVE(ddl_fail(DDL_ERR_TIMEOUT,
                               "recv: no message from rank %d (tag %d) within %g s: it has not "
                               "sent it (a missing send, or a dead or stuck rank)",
                               source, tag, ddl_deadline_s()));
            sched_yield();
        }
    }
    int n = 0;
    MPI_Get_count(&mst, MPI_BYTE, &n);
    void *into = (size_t)n == want ? buf : ddl_scratch(DDL_SCRATCH_SPILL, (size_t)n);
    if (!into && n > 0) LEAVE(ddl_fail(DDL_ERR_NO_MEMORY, "recv: no memory for %d bytes", n));
    MPI_Request req;
    int rc = MPI_Imrecv(into, n, MPI_BYTE, &msg, &req);
    ddl_mpicomm_t pc = {c->p2p, c->ctx->world.rank, c->ctx->world.size, 0};
    st = rc != MPI_SUCCESS ? ddl_mpi_fail(rc, "MPI_Imrecv")
                           : ddl_wait_request_bytes(&req, &pc, "recv", (size_t)n);
    if (st == DDL_SUCCESS && (size_t)n != want)
        st = ddl_fail(DDL_ERR_MISMATCH,
                      "recv: rank %d sent %d bytes (tag %d) but the receive buffer holds %zu "
                      "bytes (%zu x %s): send and receive the same count and dtype",
                      source, n, tag, want, count, ddl_dtype_name(dtype));
    LEAVE(st);
}

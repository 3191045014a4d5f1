/* The collectives: argument checks, the mismatch check, and the topology-aware allreduce.
 *
 * Mismatch detection costs nothing extra on the latency path: a small allreduce travels as
 * one recursive doubling whose messages carry a 32-byte header with the min and max of
 * every rank's call signature, so after log2(P) steps all ranks hold the same verdict.
 * Every other call first runs that recursive doubling with the header alone (log2(P)
 * small messages, a few microseconds, measured by `python -m ddl_core.bench check`)
 * before any data moves, so a mismatch fails on every rank before anything is written. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

/* One allreduce's walk through the levels: the segment each level works on and whether
 * a level reduced its whole segment (nothing to gather back). */
typedef struct {
    const ddl_topo_t *t;
    const ddl_algo_t *plan;
    const void *in;
    char *b;
    size_t es, count;
    ddl_dtype_t dtype;
    ddl_op_t wop;
    uint64_t sig;
    size_t lo[DDL_MAX_LEVELS + 1], hi[DDL_MAX_LEVELS + 1];
    int whole[DDL_MAX_LEVELS];
} level_state_t;


/* Whether algorithm a on a level of p ranks reduces the level's whole segment
 * (recursive doubling, MPI, or Rabenseifner folding a non-power-of-two) rather than
 * reduce-scattering it. */
static int reduces_whole(ddl_algo_t a, int p) {
    return a == DDL_ALGO_RECDOUBLING || a == DDL_ALGO_MPI ||
           (a == DDL_ALGO_RABENSEIFNER && (p & (p - 1)) != 0);
}

/* Level l's reduce-scatter (or whole allreduce) of its segment. Level 0 reads the input
 * directly, so an out-of-place allreduce needs no copy. */
static ddl_status_t rs_level(level_state_t *st, int l) {
    const ddl_mpicomm_t *lc = &st->t->level[l];
    size_t n = st->hi[l] - st->lo[l];
    char *seg = st->b + st->lo[l] * st->es;
    ddl_algo_t a = st->plan[l];
    st->whole[l] = reduces_whole(a, lc->size);
    if (st->whole[l]) {
        if (a == DDL_ALGO_RECDOUBLING || a == DDL_ALGO_RABENSEIFNER) {
            ddl_header_t h;
            ddl_header_init(&h, st->sig, st->count);
            DDL_CHECK(ddl_rd_allreduce_checked(lc, &h, seg, n, st->dtype, st->wop));
        } else {
            DDL_CHECK(ddl_mpi_allreduce(lc, seg, n, st->dtype, st->wop));
        }
        st->lo[l + 1] = st->lo[l];
        st->hi[l + 1] = st->hi[l];
        return DDL_SUCCESS;
    }
    const char *src = l == 0 ? (const char *)st->in : seg;
    if (a == DDL_ALGO_RABENSEIFNER)
        DDL_CHECK(ddl_halving_reduce_scatter(lc, src, seg, n, st->dtype, st->wop));
    else
        DDL_CHECK(ddl_ring_reduce_scatter(lc, src, seg, n, st->dtype, st->wop));
    size_t blo, bhi;
    ddl_block_range(n, lc->size, lc->rank, &blo, &bhi);
    st->lo[l + 1] = st->lo[l] + blo;
    st->hi[l + 1] = st->lo[l] + bhi;
    return DDL_SUCCESS;
}

static ddl_status_t ag_level(level_state_t *st, int l) {
    if (st->whole[l]) return DDL_SUCCESS;
    const ddl_mpicomm_t *lc = &st->t->level[l];
    char *seg = st->b + st->lo[l] * st->es;
    size_t n = st->hi[l] - st->lo[l];
    if (st->plan[l] == DDL_ALGO_RABENSEIFNER) return ddl_doubling_allgather(lc, seg, n, st->dtype);
    return ddl_ring_allgather(lc, seg, n, st->dtype);
}

/* The node-leader allreduce, pipelined in segments (as Open MPI's han does).
 *
 * One rank per node (level-0 rank 0, the leader) runs the outer levels; rather than every
 * rank of a node crossing the node's link at once (one network flow per rank), one flow on
 * one warm connection keeps a link busier (measured on the emulated cluster: 95% of the
 * link rate with one flow per link, 86% with two). The buffer is cut into K segments of
 * about DDL_SEGMENT bytes. The node's other ranks form a chain toward the leader: rank i
 * receives segment k's partial result from rank i+1, adds its own input and passes it on,
 * so the leader receives the node's sum minus its own input, segment by segment, while it
 * is still busy with the outer levels of earlier segments. For each segment the leader
 *   1. waits for the node's partial (normally there already: it was received while the
 *      previous segment crossed the link), adds its own input,
 *   2. runs the outer levels on the segment (reduce-scatter and allgather per level, the
 *      plan's algorithms), and
 *   3. posts the result to rank 1 without waiting; the chain passes it down the node.
 * So the node's reduction of segment k+1 and broadcast of segment k-1 move while segment
 * k crosses the link: only the first segment's reduction and the last one's broadcast are
 * not overlapped. The link carries the same bytes as without a pipeline. The outer levels
 * run per segment, so each adds its per-message costs K times (the cost model counts
 * them). DDL_NODE_LEADER=0 instead runs every level's reduce-scatter on every rank (e.g.
 * a network interface per rank). */
enum { TAG_PARTIAL = 301, TAG_RESULT = 302 };
#define LOOKAHEAD 2 /* partials the leader has receives posted for */

static ddl_status_t leader_pipeline(level_state_t *st, const ddl_mpicomm_t *l0) {
    size_t es = st->es, count = st->hi[0] - st->lo[0];
    size_t K = ddl_pipeline_segments(count * es, es, l0->size, (double)ddl_g.segment_bytes);
    size_t qmax = count / K + 1;
    const char *in = (const char *)st->in + st->lo[0] * es;
    char *b = st->b + st->lo[0] * es;
    int me = l0->rank, p0 = l0->size;
    size_t lo, hi;
    if (me != 0) {
        /* Chain: receive segment k from me+1 while passing segment k-1 on to me-1. */
        int last = me == p0 - 1;
        char *tmp = ddl_scratch(DDL_SCRATCH_PIPELINE, qmax * es);
        if (!tmp) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a pipeline segment");
        for (size_t k = 0; k <= K; k++) {
            size_t plo = 0, phi = 0;
            if (k > 0) ddl_block_range(count, (int)K, (int)(k - 1), &plo, &phi);
            const char *prev = last ? in : b; /* the last rank passes its input as is */
            if (k < K) ddl_block_range(count, (int)K, (int)k, &lo, &hi);
            DDL_CHECK(ddl_sendrecv(l0, prev + plo * es, (phi - plo) * es, k > 0 ? me - 1 : -1,
                                   tmp, k < K && !last ? (hi - lo) * es : 0,
                                   k < K && !last ? me + 1 : -1, TAG_PARTIAL));
            if (k < K && !last) ddl_reduce3(b + lo * es, in + lo * es, tmp, hi - lo, st->dtype,
                                            st->wop);
        }
        /* Results: receive segment k from me-1 while passing segment k-1 to me+1. */
        for (size_t k = 0; k <= K; k++) {
            size_t plo = 0, phi = 0;
            if (k > 0) ddl_block_range(count, (int)K, (int)(k - 1), &plo, &phi);
            lo = hi = 0;
            if (k < K) ddl_block_range(count, (int)K, (int)k, &lo, &hi);
            DDL_CHECK(ddl_sendrecv(l0, b + plo * es, (phi - plo) * es,
                                   k > 0 && !last ? me + 1 : -1, b + lo * es, (hi - lo) * es,
                                   k < K ? me - 1 : -1, TAG_RESULT));
        }
        return DDL_SUCCESS;
    }
    char *stage = ddl_scratch(DDL_SCRATCH_PIPELINE, LOOKAHEAD * qmax * es);
    MPI_Request *sent = ddl_scratch(DDL_SCRATCH_PIPELINE_REQS, K * sizeof(MPI_Request));
    if (!stage || !sent) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the pipeline");
    MPI_Request got[LOOKAHEAD];
    for (size_t k = 0; k < K; k++) sent[k] = MPI_REQUEST_NULL;
    for (size_t k = 0; k < LOOKAHEAD && k < K; k++) {
        ddl_block_range(count, (int)K, (int)k, &lo, &hi);
        DDL_CHECK(ddl_irecv(l0, stage + k * qmax * es, (hi - lo) * es, 1, TAG_PARTIAL, &got[k]));
    }
    for (size_t k = 0; k < K; k++) {
        ddl_block_range(count, (int)K, (int)k, &lo, &hi);
        char *slot = stage + (k % LOOKAHEAD) * qmax * es;
        DDL_CHECK(ddl_wait_recv(l0, &got[k % LOOKAHEAD], (hi - lo) * es, 1));
        ddl_reduce3(b + lo * es, in + lo * es, slot, hi - lo, st->dtype, st->wop);
        if (k + LOOKAHEAD < K) {
            size_t nlo, nhi;
            ddl_block_range(count, (int)K, (int)(k + LOOKAHEAD), &nlo, &nhi);
            DDL_CHECK(ddl_irecv(l0, slot, (nhi - nlo) * es, 1, TAG_PARTIAL,
                                &got[k % LOOKAHEAD]));
        }
        st->lo[1] = st->lo[0] + lo;
        st->hi[1] = st->lo[0] + hi;
        for (int l = 1; l < st->t->nlevels; l++) DDL_CHECK(rs_level(st, l));
        for (int l = st->t->nlevels - 1; l >= 1; l--) DDL_CHECK(ag_level(st, l));
        DDL_CHECK(ddl_isend(l0, b + lo * es, (hi - lo) * es, 1, TAG_RESULT, &sent[k]));
    }
    for (size_t k = 0; k < K; k++) DDL_CHECK(ddl_wait_request(&sent[k], l0, "passing results on"));
    return DDL_SUCCESS;
}

/* The cost model's plan for `bytes` on ctx, remembered for the next call of the same size. */
static void plan_for(ddl_ctx_t *ctx, size_t bytes, ddl_algo_t plan[DDL_MAX_LEVELS], int *flat) {
    unsigned gen = __atomic_load_n(&ddl_g.plan_gen, __ATOMIC_RELAXED);
    if (ctx->plan.gen != gen || ctx->plan.bytes != bytes) {
        ddl_model_plan(&ddl_g.model, ctx->topo.dims, ctx->topo.nlevels, bytes, ddl_g.forced_algo,
                       ctx->plan.algo, &ctx->plan.flat);
        ctx->plan.bytes = bytes;
        ctx->plan.gen = gen;
    }
    memcpy(plan, ctx->plan.algo, sizeof ctx->plan.algo);
    *flat = ctx->plan.flat;
}

ddl_status_t ddl_allreduce_ctx(ddl_ctx_t *ctx, const void *sendbuf, void *buf, size_t count,
                               ddl_dtype_t dtype, ddl_op_t op, uint64_t sig) {
    ddl_coll_begin(ctx, "allreduce", 1);
    size_t es = ddl_dtype_size(dtype);
    ddl_op_t wop = ddl_wire_op(op);
    ddl_topo_t *t = &ctx->topo;
    int P = ctx->world.size;
    const void *in = sendbuf == DDL_IN_PLACE ? buf : sendbuf;
    if (P == 1) {
        if (in != buf && count) memcpy(buf, in, count * es);
        ddl_finish_avg(buf, count, dtype, op == DDL_AVG ? P : 1);
        return DDL_SUCCESS;
    }
    ddl_algo_t plan[DDL_MAX_LEVELS];
    int flat;
    plan_for(ctx, count * es, plan, &flat);
    /* Paths that work in place on buf start with a copy of an out-of-place input; the
     * node-leader pipeline and a reduce-scatter first level read the input directly. */
    int leader = !flat && ddl_g.node_leader && t->nlevels > 1 && t->level[0].size > 1;
    int reads_input = leader || (!flat && !reduces_whole(plan[0], t->level[0].size));
    if (in != buf && count && !reads_input) memcpy(buf, in, count * es);
    if (flat && plan[0] == DDL_ALGO_RECDOUBLING && count * es <= DDL_FUSED_MAX) {
        ddl_header_t h;
        ddl_header_init(&h, sig, count);
        DDL_CHECK(ddl_rd_allreduce_checked(&ctx->world, &h, buf, count, dtype, wop));
        DDL_CHECK(ddl_header_verdict(&h, "allreduce"));
    } else {
        DDL_CHECK(ddl_comm_check(ctx, sig, count, "allreduce"));
        if (flat && plan[0] == DDL_ALGO_RECDOUBLING) {
            ddl_header_t h;
            ddl_header_init(&h, sig, count);
            DDL_CHECK(ddl_rd_allreduce_checked(&ctx->world, &h, buf, count, dtype, wop));
        } else if (flat) {
            DDL_CHECK(ddl_mpi_allreduce(&ctx->world, buf, count, dtype, wop));
        } else {
            level_state_t st = {.t = t, .plan = plan, .in = in, .b = buf, .es = es,
                                .dtype = dtype, .wop = wop, .sig = sig, .count = count};
            st.lo[0] = 0;
            st.hi[0] = count;
            const ddl_mpicomm_t *l0 = &t->level[0];
            if (leader) {
                DDL_CHECK(leader_pipeline(&st, l0));
            } else {
                DDL_CHECK(rs_level(&st, 0));
                for (int l = 1; l < t->nlevels; l++) DDL_CHECK(rs_level(&st, l));
                for (int l = t->nlevels - 1; l >= 1; l--) DDL_CHECK(ag_level(&st, l));
                DDL_CHECK(ag_level(&st, 0));
            }
        }
    }
    if (op == DDL_AVG) ddl_finish_avg(buf, count, dtype, P);
    return DDL_SUCCESS;
}

/* Binomial tree from `root`, for small messages and two ranks. */
static ddl_status_t bcast_tree(const ddl_mpicomm_t *c, void *buf, size_t bytes, int root) {
    int p = c->size, vr = (c->rank - root + p) % p, mask = 1;
    while (mask < p) {
        if (vr & mask) {
            int src = (vr - mask + root) % p;
            DDL_CHECK(ddl_sendrecv(c, NULL, 0, -1, buf, bytes, src, 201));
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (vr + mask < p) {
            int dst = (vr + mask + root) % p;
            DDL_CHECK(ddl_sendrecv(c, buf, bytes, dst, NULL, 0, -1, 201));
        }
    }
    return DDL_SUCCESS;
}

ddl_status_t ddl_broadcast_ctx(ddl_ctx_t *ctx, void *buf, size_t count, ddl_dtype_t dtype,
                               int root) {
    return ddl_broadcast_ctx_sig(ctx, buf, count, dtype, root, 0);
}

ddl_status_t ddl_broadcast_ctx_sig(ddl_ctx_t *ctx, void *buf, size_t count, ddl_dtype_t dtype,
                                   int root, uint64_t sig) {
    ddl_coll_begin(ctx, "broadcast", 1);
    const ddl_mpicomm_t *c = &ctx->world;
    DDL_CHECK(ddl_comm_check(ctx, sig ? sig : ddl_signature(DDL_COLL_BROADCAST, count, dtype, 0, root),
                    count, "broadcast"));
    size_t es = ddl_dtype_size(dtype), bytes = count * es;
    int p = c->size;
    if (p == 1 || bytes == 0) return DDL_SUCCESS;
    if (p <= 2 || bytes < (size_t)64 * 1024 || count < (size_t)p)
        return bcast_tree(c, buf, bytes, root);
    /* Large: the root scatters one block to each rank, then a ring allgather (van de
     * Geijn), so the root sends n bytes once instead of log2(p) times. */
    char *b = buf;
    if (c->rank == root) {
        for (int i = 0; i < p; i++) {
            if (i == root) continue;
            size_t lo, hi;
            ddl_block_range(count, p, i, &lo, &hi);
            DDL_CHECK(ddl_sendrecv(c, b + lo * es, (hi - lo) * es, i, NULL, 0, -1, 202));
        }
    } else {
        size_t lo, hi;
        ddl_block_range(count, p, c->rank, &lo, &hi);
        DDL_CHECK(ddl_sendrecv(c, NULL, 0, -1, b + lo * es, (hi - lo) * es, root, 202));
    }
    return ddl_ring_allgather(c, buf, count, dtype);
}

ddl_status_t ddl_allgather_ctx(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                               size_t sendcount, ddl_dtype_t dtype) {
    return ddl_allgather_ctx_sig(ctx, sendbuf, recvbuf, sendcount, dtype, 0);
}

ddl_status_t ddl_allgather_ctx_sig(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                   size_t sendcount, ddl_dtype_t dtype, uint64_t sig) {
    ddl_coll_begin(ctx, "allgather", 1);
    const ddl_mpicomm_t *c = &ctx->world;
    DDL_CHECK(ddl_comm_check(ctx, sig ? sig : ddl_signature(DDL_COLL_ALLGATHER, sendcount, dtype, 0, 0),
                    sendcount, "allgather"));
    size_t es = ddl_dtype_size(dtype), bytes = sendcount * es;
    int p = c->size;
    char *dst = (char *)recvbuf + (size_t)c->rank * bytes;
    if (sendbuf != DDL_IN_PLACE && sendbuf != dst && bytes) memcpy(dst, sendbuf, bytes);
    size_t total = sendcount * (size_t)p;
    if (p == 1 || bytes == 0) return DDL_SUCCESS;
    if ((p & (p - 1)) == 0 && bytes < (size_t)256 * 1024)
        return ddl_doubling_allgather(c, recvbuf, total, dtype);
    return ddl_ring_allgather(c, recvbuf, total, dtype);
}

ddl_status_t ddl_reduce_scatter_ctx(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, ddl_dtype_t dtype, ddl_op_t op) {
    return ddl_reduce_scatter_ctx_sig(ctx, sendbuf, recvbuf, recvcount, dtype, op, 0);
}

ddl_status_t ddl_reduce_scatter_ctx_sig(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t recvcount, ddl_dtype_t dtype, ddl_op_t op,
                                        uint64_t sig) {
    ddl_coll_begin(ctx, "reduce_scatter", 1);
    const ddl_mpicomm_t *c = &ctx->world;
    DDL_CHECK(ddl_comm_check(ctx,
                    sig ? sig : ddl_signature(DDL_COLL_REDUCE_SCATTER, recvcount, dtype, op, 0),
                    recvcount, "reduce_scatter"));
    size_t es = ddl_dtype_size(dtype);
    int p = c->size;
    size_t total = recvcount * (size_t)p;
    const void *src = sendbuf == DDL_IN_PLACE ? recvbuf : sendbuf;
    char *work = ddl_scratch(DDL_SCRATCH_SCATTER_WORK, total * es);
    if (!work) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for %zu bytes", total * es);
    ddl_op_t wop = ddl_wire_op(op);
    if ((p & (p - 1)) == 0)
        DDL_CHECK(ddl_halving_reduce_scatter(c, src, work, total, dtype, wop));
    else
        DDL_CHECK(ddl_ring_reduce_scatter(c, src, work, total, dtype, wop));
    if (recvcount) memmove(recvbuf, work + (size_t)c->rank * recvcount * es, recvcount * es);
    if (op == DDL_AVG) ddl_finish_avg(recvbuf, recvcount, dtype, p);
    return DDL_SUCCESS;
}

ddl_status_t ddl_barrier_ctx(ddl_ctx_t *ctx) {
    ddl_coll_begin(ctx, "barrier", 1);
    return ddl_comm_check(ctx, ddl_signature(DDL_COLL_BARRIER, 0, 0, 0, 0), 0, "barrier");
}

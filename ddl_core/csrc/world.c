/* The world calls of ddl.h (the 1.x names: ddl_allreduce, ddl_iallreduce,
 * ddl_iallreduce_named, ...): each is the same collective on the world communicator, so a
 * collective's checks and logic live once, in its ddl_comm_* call (comm.c, comm_colls.c,
 * async.c). The device-buffer calls (*_stream, gpu.c) are the world's own. */
#include "ddl_internal.h"

_Static_assert(sizeof(size_t) == sizeof(uint64_t), "alltoall_counts sends size_t as int64");

/* ---- blocking ---------------------------------------------------------------------- */

ddl_status_t ddl_allreduce(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype,
                           ddl_op_t op) {
    return ddl_comm_allreduce(ddl_world_comm(), sendbuf, recvbuf, count, dtype, op);
}

ddl_status_t ddl_broadcast(void *buf, size_t count, ddl_dtype_t dtype, int root) {
    return ddl_comm_broadcast(ddl_world_comm(), buf, count, dtype, root);
}

ddl_status_t ddl_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                           ddl_dtype_t dtype) {
    return ddl_comm_allgather(ddl_world_comm(), sendbuf, recvbuf, sendcount, dtype);
}

ddl_status_t ddl_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                ddl_dtype_t dtype, ddl_op_t op) {
    return ddl_comm_reduce_scatter(ddl_world_comm(), sendbuf, recvbuf, recvcount, dtype, op);
}

ddl_status_t ddl_barrier(void) { return ddl_comm_barrier(ddl_world_comm()); }

ddl_status_t ddl_alltoall(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype) {
    return ddl_comm_alltoall(ddl_world_comm(), sendbuf, recvbuf, count, dtype);
}

/* An alltoall of one count per rank. */
ddl_status_t ddl_alltoall_counts(const size_t *sendcounts, size_t *recvcounts) {
    DDL_CHECK(ddl_require_init());
    if (!sendcounts || !recvcounts)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_alltoall_counts: NULL counts");
    return ddl_comm_alltoall(ddl_world_comm(), sendcounts, recvcounts, 1, DDL_INT64);
}

ddl_status_t ddl_alltoallv(const void *sendbuf, const size_t *sendcounts, void *recvbuf,
                           const size_t *recvcounts, ddl_dtype_t dtype) {
    return ddl_comm_alltoallv(ddl_world_comm(), sendbuf, sendcounts, recvbuf, recvcounts, dtype);
}

/* ---- asynchronous: the world's queue (unnamed, or matched by name) -------------------- */

ddl_status_t ddl_iallreduce(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype,
                            ddl_op_t op, ddl_request_t *req) {
    return ddl_comm_iallreduce(ddl_world_comm(), sendbuf, recvbuf, count, dtype, op, NULL, req);
}

ddl_status_t ddl_ibroadcast(void *buf, size_t count, ddl_dtype_t dtype, int root,
                            ddl_request_t *req) {
    return ddl_comm_ibroadcast(ddl_world_comm(), buf, count, dtype, root, NULL, req);
}

ddl_status_t ddl_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                            ddl_dtype_t dtype, ddl_request_t *req) {
    return ddl_comm_iallgather(ddl_world_comm(), sendbuf, recvbuf, sendcount, dtype, NULL, req);
}

ddl_status_t ddl_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                 ddl_dtype_t dtype, ddl_op_t op, ddl_request_t *req) {
    return ddl_comm_ireduce_scatter(ddl_world_comm(), sendbuf, recvbuf, recvcount, dtype, op,
                                    NULL, req);
}

ddl_status_t ddl_iallreduce_named(const void *sendbuf, void *recvbuf, size_t count,
                                  ddl_dtype_t dtype, ddl_op_t op, const ddl_match_t *match,
                                  ddl_request_t *req) {
    return ddl_comm_iallreduce(ddl_world_comm(), sendbuf, recvbuf, count, dtype, op, match, req);
}

ddl_status_t ddl_ibroadcast_named(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                  const ddl_match_t *match, ddl_request_t *req) {
    return ddl_comm_ibroadcast(ddl_world_comm(), buf, count, dtype, root, match, req);
}

ddl_status_t ddl_iallgather_named(const void *sendbuf, void *recvbuf, size_t sendcount,
                                  ddl_dtype_t dtype, const ddl_match_t *match,
                                  ddl_request_t *req) {
    return ddl_comm_iallgather(ddl_world_comm(), sendbuf, recvbuf, sendcount, dtype, match, req);
}

ddl_status_t ddl_ireduce_scatter_named(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddl_dtype_t dtype, ddl_op_t op, const ddl_match_t *match,
                                       ddl_request_t *req) {
    return ddl_comm_ireduce_scatter(ddl_world_comm(), sendbuf, recvbuf, recvcount, dtype, op,
                                    match, req);
}

ddl_status_t ddl_iallgatherv_named(const void *sendbuf, size_t sendcount, ddl_dtype_t dtype,
                                   const ddl_match_t *match, ddl_request_t *req) {
    return ddl_comm_iallgatherv(ddl_world_comm(), sendbuf, sendcount, dtype, match, req);
}

/* Internal declarations shared by libddl's translation units. Not installed. */
#ifndef DDL_INTERNAL_H
#define DDL_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddl.h"

/* ---- errors (errors.c) ---------------------------------------------------------- */

/* Record a message for ddl_last_error() and return `status`, so call sites read
 * `return ddl_fail(DDL_ERR_INVALID_ARG, "...", ...)`. */
ddl_status_t ddl_fail(ddl_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Set a message that already carries its rank prefix (from another thread). */
ddl_status_t ddl_fail_verbatim(ddl_status_t status, const char *msg);
/* Map an MPI return code to DDL_ERR_MPI with the MPI error string and the call site. */
ddl_status_t ddl_mpi_fail(int mpi_rc, const char *what);
void ddl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
extern int ddl_log_level;

#define DDL_CHECK(call)                                                                   \
    do {                                                                                  \
        ddl_status_t ddl_check_rc_ = (call);                                              \
        if (ddl_check_rc_ != DDL_SUCCESS) return ddl_check_rc_;                           \
    } while (0)
#define MPI_CHECK(call)                                                                   \
    do {                                                                                  \
        int mpi_check_rc_ = (call);                                                       \
        if (mpi_check_rc_ != MPI_SUCCESS) return ddl_mpi_fail(mpi_check_rc_, #call);      \
    } while (0)

/* ---- dtypes and reductions (reduce.c) -------------------------------------------- */

bool ddl_dtype_valid(int dtype);
bool ddl_op_valid(int op);
/* dst[i] = dst[i] (op) src[i] for i < count; avg reduces as sum (see ddl_finish_avg). */
void ddl_reduce(void *dst, const void *src, size_t count, ddl_dtype_t dtype, ddl_op_t op);
/* dst[i] = a[i] (op) src[i]; dst == a is allowed (then it is ddl_reduce). */
void ddl_reduce3(void *dst, const void *a, const void *src, size_t count, ddl_dtype_t dtype,
                 ddl_op_t op);
/* Divide by `divisor` in place: the last step of an average. */
void ddl_finish_avg(void *buf, size_t count, ddl_dtype_t dtype, int divisor);
/* The op the wire uses: avg travels as sum and is divided once at the end. */
static inline ddl_op_t ddl_wire_op(ddl_op_t op) { return op == DDL_AVG ? DDL_SUM : op; }
/* A pair's whole reduction of one piece: dst = a (op) src, avg divided by 2 (the two-rank
 * reduce paths of comm_colls.c and shm.c). */
static inline void ddl_reduce_pair(void *dst, const void *a, const void *src, size_t count,
                                   ddl_dtype_t dtype, ddl_op_t op) {
    ddl_reduce3(dst, a, src, count, dtype, ddl_wire_op(op));
    if (op == DDL_AVG) ddl_finish_avg(dst, count, dtype, 2);
}

/* ---- communicators and point-to-point with deadlines (p2p.c) ------------------------ */

typedef struct {
    MPI_Comm comm;
    int rank;
    int size;
    size_t piece; /* >0: large exchanges travel as a window of pieces of this size (p2p.c) */
} ddl_mpicomm_t;

/* Seconds from a monotonic clock. */
double ddl_now(void);
extern double ddl_timeout_s;
/* The calling thread's deadline (ddl_set_thread_timeout), else DDL_TIMEOUT. */
double ddl_deadline_s(void);
extern double ddl_spin_s; /* DDL_SPIN_US: how long a wait spins before it pauses */
extern size_t ddl_stream_piece; /* DDL_PIECE: piece size of exchanges between nodes */
extern int ddl_stream_window;   /* DDL_WINDOW: pieces each way in flight at once */

/* Exchange with peers, waiting at most DDL_TIMEOUT. Either side may be absent (peer < 0).
 * The receive is probed first so a message of an unexpected size is reported (as
 * DDL_ERR_MISMATCH naming the sizes) instead of truncating or hanging. */
ddl_status_t ddl_sendrecv(const ddl_mpicomm_t *c, const void *sbuf, size_t sbytes, int dst,
                          void *rbuf, size_t rbytes, int src, int tag);
/* Pre-posted exchange for small messages: the receive is posted first into a buffer of
 * `rcap` bytes, which the caller guarantees no peer message can exceed (truncating a large
 * message is not safe in every MPI). *got receives the sender's size. */
ddl_status_t ddl_sendrecv_capped(const ddl_mpicomm_t *c, const void *sbuf, size_t sbytes, int dst,
                                 void *rbuf, size_t rcap, int src, int tag, size_t *got);
/* The largest payload the fused recursive doubling carries; above it a header-only check
 * runs first, so no rank ever sends more than this into a capped receive. */
#define DDL_FUSED_MAX ((size_t)64 * 1024)
/* The recursive doubling's message tag: an idle progress thread that sees one arrive
 * knows a peer has started a negotiation and joins it (async.c). */
#define DDL_TAG_RD 101
/* Non-blocking pieces of at most 1 GiB for pipelines: a receive posted with ddl_irecv is
 * completed by ddl_wait_recv under the deadline, which reports a message of another size
 * as DDL_ERR_MISMATCH; sends complete with ddl_wait_request. */
ddl_status_t ddl_isend(const ddl_mpicomm_t *c, const void *buf, size_t bytes, int dst, int tag,
                       MPI_Request *req);
ddl_status_t ddl_irecv(const ddl_mpicomm_t *c, void *buf, size_t bytes, int src, int tag,
                       MPI_Request *req);
ddl_status_t ddl_wait_recv(const ddl_mpicomm_t *c, MPI_Request *req, size_t bytes, int src);
/* Wait for an MPI request with the deadline (used for MPI's own collectives). */
ddl_status_t ddl_wait_request(MPI_Request *req, const ddl_mpicomm_t *c, const char *what);
/* Wait until *flag, in memory shared with rank `peer` of c, holds `want` (acquire), under
 * the deadline and the liveness watch, polling as the waits above do for `bytes`. */
ddl_status_t ddl_wait_flag(const ddl_mpicomm_t *c, const uint64_t *flag, uint64_t want, int peer,
                           size_t bytes, const char *what);
/* Seconds a wait for a transfer of `bytes` spins before pausing between polls (< 0:
 * never pauses): DDL_SPIN_US, longer for large transfers (p2p.c). */
double ddl_spin_budget(size_t bytes);
/* ddl_wait_request for a transfer of `bytes` (spins ddl_spin_budget(bytes)). */
ddl_status_t ddl_wait_request_bytes(MPI_Request *req, const ddl_mpicomm_t *c, const char *what,
                                    size_t bytes);

/* ---- signatures: the mismatch check ------------------------------------------------- */

/* Every collective call carries a 64-bit signature of (collective, count, dtype, op,
 * root). A header holding the minimum and maximum signature seen is combined along the
 * algorithm's own messages; when min != max after the exchange every rank knows some rank
 * disagreed and all of them fail with DDL_ERR_MISMATCH. */
typedef struct {
    uint64_t sig_min;
    uint64_t sig_max;
    uint64_t count_min; /* for the error message */
    uint64_t count_max;
} ddl_header_t;

enum { DDL_COLL_ALLREDUCE = 1, DDL_COLL_BROADCAST, DDL_COLL_ALLGATHER,
       DDL_COLL_REDUCE_SCATTER, DDL_COLL_BARRIER, DDL_COLL_NEGOTIATE, DDL_COLL_FUSED,
       DDL_COLL_ALLGATHERV, DDL_COLL_ALLTOALL, DDL_COLL_ALLTOALLV, DDL_COLL_A2A_COUNTS,
       DDL_COLL_GATHER, DDL_COLL_SCATTER, DDL_COLL_REDUCE, DDL_COLL_COMM_SPLIT,
       DDL_COLL_COMM_FREE };

uint64_t ddl_signature(int coll, uint64_t count, int dtype, int op, int root);
/* Recompute the run-time settings every signature carries (after they change). */
void ddl_settings_changed(void);
/* The cost model changed (ddl_set_level_cost, init): cached plans are stale. */
void ddl_plans_changed(void);
void ddl_header_init(ddl_header_t *h, uint64_t sig, uint64_t count);
void ddl_header_merge(ddl_header_t *into, const ddl_header_t *from);
/* DDL_ERR_MISMATCH with a message naming what differs, or DDL_SUCCESS. */
ddl_status_t ddl_header_verdict(const ddl_header_t *h, const char *coll_name);

/* ---- algorithms (algos.c) ----------------------------------------------------------- */

/* Recursive-doubling allreduce of a header plus `count` elements, any comm size (ranks
 * beyond the largest power of two fold in first). Either part may be empty. This is the
 * latency path and the checked exchange every other collective starts with. */
ddl_status_t ddl_rd_allreduce_checked(const ddl_mpicomm_t *c, ddl_header_t *hdr, void *buf,
                                      size_t count, ddl_dtype_t dtype, ddl_op_t op);
/* Reduce-scatter of in[0..count) over c into out: afterwards rank r's block r of out
 * (block_range) holds the reduction of every rank's block r; other blocks of out hold
 * partial sums. `in` is only read, so an out-of-place allreduce needs no initial copy;
 * in == out works in place. */
ddl_status_t ddl_ring_reduce_scatter(const ddl_mpicomm_t *c, const void *in, void *out,
                                     size_t count, ddl_dtype_t dtype, ddl_op_t op);
ddl_status_t ddl_ring_allgather(const ddl_mpicomm_t *c, void *buf, size_t count, ddl_dtype_t dtype);
/* Rabenseifner's halves; need a power-of-two comm size. */
ddl_status_t ddl_halving_reduce_scatter(const ddl_mpicomm_t *c, const void *in, void *out,
                                        size_t count, ddl_dtype_t dtype, ddl_op_t op);
ddl_status_t ddl_doubling_allgather(const ddl_mpicomm_t *c, void *buf, size_t count,
                                    ddl_dtype_t dtype);
/* Whole allreduce with MPI_Iallreduce under the deadline. */
ddl_status_t ddl_mpi_allreduce(const ddl_mpicomm_t *c, void *buf, size_t count, ddl_dtype_t dtype,
                               ddl_op_t op);
/* Block partition of `count` elements into `parts`: block i is [*lo, *hi). */
void ddl_block_range(size_t count, int parts, int i, size_t *lo, size_t *hi);
/* Scratch memory per thread and slot, grown on demand and kept (scratch.c). Each slot
 * has one owner, so buffers that one collective holds at once never share a slot. */
typedef enum {
    DDL_SCRATCH_RD_MINE,       /* algos.c: recursive doubling, this rank's packed header+data */
    DDL_SCRATCH_RD_THEIRS,     /* algos.c: recursive doubling, the peer's */
    DDL_SCRATCH_BLOCK,         /* algos.c: a ring / halving block received */
    DDL_SCRATCH_SCATTER_WORK,  /* collectives.c: reduce_scatter's whole reduced buffer */
    DDL_SCRATCH_FUSION,        /* batch.c: the fusion buffer */
    DDL_SCRATCH_PIPELINE,      /* collectives.c: the node-leader pipeline's segments */
    DDL_SCRATCH_PIPELINE_REQS, /* collectives.c: its MPI requests */
    DDL_SCRATCH_SPILL,         /* p2p.c, comm_colls.c: a message of the wrong size */
    DDL_SCRATCH_REDUCE,        /* comm_colls.c: reduce's result on a rank other than the root */
    DDL_SCRATCH_SLOTS
} ddl_scratch_slot_t;
void *ddl_scratch(ddl_scratch_slot_t slot, size_t bytes);
MPI_Datatype ddl_mpi_dtype(ddl_dtype_t dtype);

/* ---- topology (topology.c) and the cost model (model.c) ---------------------------- */

typedef struct {
    int nlevels;
    int dims[DDL_MAX_LEVELS];
    int coord[DDL_MAX_LEVELS];
    ddl_mpicomm_t level[DDL_MAX_LEVELS]; /* ranks that differ only in this coordinate */
    ddl_mpicomm_t world;                 /* reordered so the grid matches placement */
} ddl_topo_t;

/* One context per thread that talks MPI: the application's and the progress thread's. */
typedef struct {
    ddl_mpicomm_t world; /* a dup of MPI_COMM_WORLD in world order */
    ddl_topo_t topo;
    int id;           /* DDL_CTX_APP or DDL_CTX_PROGRESS (liveness.c) */
    uint64_t seq;     /* collectives begun on this context (ddl_coll_begin); atomic */
    uint64_t reached; /* the collective this context waits in or for (a timeout's diagnosis) */
    const int *members; /* a communicator's: the world ranks of its members; NULL: world */
    int nmembers;
    /* The allreduce plan of the last size (collectives.c): a loop of same-size calls, the
     * training step's case, costs one compare instead of the cost model. Valid while gen
     * equals ddl_g.plan_gen (0: never). */
    struct {
        unsigned gen;
        int flat;
        size_t bytes;
        ddl_algo_t algo[DDL_MAX_LEVELS];
    } plan;
    /* Memory shared by the two ranks of a pair on one node (shm.c): unknown until the
     * first reduce on this context asks, then a segment or none for good. */
    struct ddl_shm_s *shm;
    int shm_state; /* 0 unknown, 1 shm set, -1 none */
    struct ddl_comm_s *owner; /* the communicator this context serves (ft.c revokes all of
                                 its MPI communicators when a member fails) */
} ddl_ctx_t;

/* ---- shared memory between the two ranks of a node-local pair (shm.c) ------------------ */

typedef struct ddl_shm_s ddl_shm_t;
/* Collective over a two-rank ctx: its segment, made on first use; NULL when the two ranks
 * do not share a node or the segment cannot be made (the caller takes another path). */
ddl_status_t ddl_shm_pair(ddl_ctx_t *ctx, ddl_shm_t **out);
/* One exchange through the segment, each rank's part (both ranks call it together, with
 * the same two_way): `out_bytes` of `out` go to the other rank, landing in its `in`; with
 * `out_also`, the same bytes are copied there too (from the cache-warm slot). With
 * `reduce_a`, an incoming chunk is not copied but reduced: in = reduce_a (op) chunk, of
 * dtype elements (avg divided by 2). two_way: both ranks send (half the slots each);
 * else one does. The `waiting_*` texts name the wait in a timeout. */
typedef struct {
    const char *out;
    size_t out_bytes;
    char *out_also;
    char *in;
    size_t in_bytes;
    const char *reduce_a;
    ddl_dtype_t dtype;
    ddl_op_t op;
    int two_way;
    const char *waiting_out, *waiting_in;
} ddl_shm_move_t;
ddl_status_t ddl_shm_move(ddl_ctx_t *ctx, ddl_shm_t *s, const ddl_shm_move_t *m);
/* Whether the pair can copy straight between their memories (process_vm_readv/writev,
 * probed at setup both ways, DDL_CMA=1 on both). */
int ddl_shm_direct_ok(const ddl_shm_t *s);
/* A direct move, each rank's part (both call it together): `post` (when set) is our
 * address the other rank's part uses; we copy our own block (own_src -> own_dst), then
 * read (pull) `bytes` from the other's posted address + off into `local`, or write
 * (push) `local` there; with peer_acts the other rank reads or writes our memory, and we
 * return only once it is done. */
typedef struct {
    const void *post;
    int pull;
    char *local;
    size_t bytes, off;
    int peer_acts;
    const void *own_src;
    void *own_dst;
    size_t own_bytes;
    const char *waiting;
} ddl_shm_direct_t;
ddl_status_t ddl_shm_direct(ddl_ctx_t *ctx, ddl_shm_t *s, const ddl_shm_direct_t *d);
/* Local: unmaps the context's segment (the other rank keeps its own mapping). */
void ddl_shm_release(ddl_ctx_t *ctx);

/* ---- liveness: peers that exit, die or finalize (liveness.c) ------------------------ */

enum { DDL_CTX_APP = 0, DDL_CTX_PROGRESS = 1 };

/* The collective the calling thread is in: named in every failure message. */
typedef struct {
    int ctx;          /* DDL_CTX_*, or -1 outside any collective */
    uint64_t seq;     /* its number on that context, from 1 */
    const char *name;
    const int *members; /* the context's (a communicator's members), NULL for the world */
    int nmembers;
    ddl_ctx_t *cctx;    /* the context itself (ft.c: whose communicator failed) */
} ddl_coll_t;
extern _Thread_local ddl_coll_t ddl_cur;

/* Number the collective the calling thread starts on ctx (each context counts its own,
 * identically on every rank). `bump` = 0 labels a step that belongs to the next collective
 * without counting one (the progress thread's negotiation). */
void ddl_coll_begin(ddl_ctx_t *ctx, const char *name, int bump);
/* "allreduce #12", "allreduce #3 (asynchronous)": the calling thread's collective, for
 * messages. */
void ddl_describe_call(char *out, size_t n);
/* Connect every rank to the watcher on rank 0 (collective; called by ddl_init) and stop
 * (ddl_finalize: tells the others this rank finalized cleanly). */
ddl_status_t ddl_liveness_start(void);
void ddl_liveness_stop(void);
/* Bumped each time a peer departs; 0 while every peer is alive (one load per poll). */
extern unsigned ddl_live_gen;
extern int ddl_live_checks; /* 0: the checks are off (python -m ddl_core.bench liveness) */
static inline unsigned ddl_liveness_gen(void) {
    return ddl_live_checks ? __atomic_load_n(&ddl_live_gen, __ATOMIC_ACQUIRE) : 0;
}
/* DDL_ERR_PEER_LOST naming the departed ranks when the current collective can no longer
 * complete, else DDL_SUCCESS (a peer that finalized after taking part in it is fine). */
ddl_status_t ddl_liveness_verdict(void);
/* NULL while world rank r is alive, else how it left ("finalized DDL", ...): a
 * point-to-point request with it as the peer can then never complete. */
const char *ddl_liveness_departed(int r);
int ddl_liveness_died(int r);
int ddl_liveness_vouches(int r);
extern int ddl_foreign_members; /* comm.c: a communicator with another world's members */
/* Why the current collective made no progress: asks every rank (through rank 0's watcher,
 * at most about a second) which collective it last began, and writes e.g. "rank 2 has not
 * reached it (...)" into out. 0 when no answer could be had. */
int ddl_liveness_diagnose(char *out, size_t n);
/* The exit path (exit.c) sends the BYE itself, with the exit status. */
void ddl_liveness_defer_bye(void);
void ddl_liveness_stop_exiting(int status);
/* A wait failed for good (timeout, lost peer): finalizing must not wait on peers (exit.c). */
void ddl_liveness_mark_broken(void);
int ddl_liveness_broken(void);
/* ddl_finalize calls MPI_Finalize only when this says so: not after a lost peer or a
 * timeout, nor when ddl_finalize_at_exit left it to the exit hook (status 0 only; exit.c). */
int ddl_may_finalize_mpi(void);
ddl_status_t ddl_finalize_at_exit(void);
/* reduce.c: the op is one libddl has, and fits the dtype (bitwise ops: integers only) */
bool ddl_op_bitwise(int op);
ddl_status_t ddl_check_op(int dtype, int op, const char *fn);
/* After an init that failed the same way on every rank (the settings agreement): MPI,
 * started by DDL, is finalized at exit with status 0, so a script that catches the error
 * and ends normally is not reported by the launcher as having exited improperly. */
void ddl_finalize_mpi_at_exit(void);
/* "0-3,7": a sorted list of ranks for messages. */
void ddl_format_ranks(char *out, size_t n, const int *ranks, int count);

ddl_status_t ddl_topo_build(ddl_ctx_t *ctx, MPI_Comm base, const int *dims, int nlevels);
/* The colour of this rank's level-l communicator: its coordinates on every other level
 * (ranks that differ only in coordinate l share it). MPI and NCCL splits both use it. */
int ddl_topo_level_color(const ddl_topo_t *t, int l);
void ddl_topo_free(ddl_ctx_t *ctx);
/* Parse "4x2x2" into dims; DDL_ERR_INVALID_ARG naming the text when malformed. */
ddl_status_t ddl_parse_topology(const char *text, int *dims, int *nlevels);

typedef struct {
    double alpha[DDL_MAX_LEVELS]; /* s per message */
    double beta[DDL_MAX_LEVELS];  /* s per byte on the wire */
    double gamma;                 /* s per byte reduced */
    int leader;                   /* the node-leader pipeline runs (DDL_NODE_LEADER) */
    double segment;               /* its segment size in bytes (DDL_SEGMENT) */
} ddl_model_t;

/* Segments of the node-leader pipeline for `bytes` of elements of `es` bytes on nodes of
 * p0 ranks: about one per `segment` bytes, at least p0-1 (so filling the node's chain
 * costs no more than one pass over the buffer), at most one per element. */
size_t ddl_pipeline_segments(size_t bytes, size_t es, int p0, double segment);

void ddl_model_defaults(ddl_model_t *m, int nlevels);
ddl_status_t ddl_model_load(ddl_model_t *m, const char *path, const int *dims, int nlevels);
/* Choose per-level algorithms for an allreduce of `bytes`; returns the predicted time. */
/* *flat = 1: one algorithm over all ranks at once (out[] all the same). */
double ddl_model_plan(const ddl_model_t *m, const int *dims, int nlevels, size_t bytes,
                      ddl_algo_t forced, ddl_algo_t out[DDL_MAX_LEVELS], int *flat);

/* ---- configuration (config.c) and its agreement across ranks (agree.c) ---------------- */

enum { DDL_NCCL_OFF = 0, DDL_NCCL_AUTO = 1, DDL_NCCL_REQUIRE = 2 };

/* Every DDL_* environment variable libddl reads, parsed (config.c's table says which
 * must agree across ranks and why). */
typedef struct {
    int log_level;           /* DDL_LOG */
    double timeout_s;        /* DDL_TIMEOUT */
    double spin_s;           /* DDL_SPIN_US, in seconds; negative: always spin */
    size_t piece;            /* DDL_PIECE */
    int window;              /* DDL_WINDOW */
    size_t fusion_threshold; /* DDL_FUSION_THRESHOLD */
    double cycle_time_s;     /* DDL_CYCLE_TIME_MS, in seconds */
    int node_leader;         /* DDL_NODE_LEADER */
    size_t segment_bytes;    /* DDL_SEGMENT */
    ddl_algo_t algo;         /* DDL_ALGO */
    int nlevels;             /* DDL_TOPOLOGY: 0 when unset (detected) */
    int dims[DDL_MAX_LEVELS];
    int nccl;           /* DDL_NCCL: DDL_NCCL_OFF / _AUTO / _REQUIRE */
    int nccl_outer_mpi; /* DDL_NCCL_OUTER=mpi */
    int liveness;       /* DDL_LIVENESS: the liveness watcher (liveness.c) on or off */
    int elastic;        /* DDL_ELASTIC: fault-tolerant mode wanted (ft.c; with ULFM on) */
    int shm;            /* DDL_SHM: shared memory between the ranks of a node (shm.c) */
    int cma;            /* DDL_CMA: direct copies between a node-local pair (shm.c) */
} ddl_config_t;

void ddl_config_defaults(ddl_config_t *cfg);
/* Read every variable; the first bad one is the error (its name, value, range, default). */
ddl_status_t ddl_config_read(ddl_config_t *cfg);
/* "NAME\tvalue in effect\tvalue as set\n" lines of the settings that must agree. */
size_t ddl_config_agreed(const ddl_config_t *cfg, char *out, size_t n);
/* Make cfg the one in effect (the globals below and in p2p.c, errors.c, gpu.c). */
void ddl_config_apply(const ddl_config_t *cfg);
/* The start of ddl_init, right after MPI_Init: every rank arrived within DDL_TIMEOUT and
 * the settings that must agree do, or every rank returns the same error (a missing rank,
 * a bad setting with the ranks that have it, or each differing setting with its values). */
ddl_status_t ddl_init_agree(const ddl_config_t *cfg, ddl_status_t local, const char *local_error);

/* ---- global state (core.c) ------------------------------------------------------------ */

typedef struct {
    int initialized;
    int finalized;
    int we_initialized_mpi;
    int rank, size, local_rank, local_size;
    int ranks_fit_cores; /* this node's ranks <= its online CPUs (p2p.c's waits) */
    ddl_ctx_t app;      /* used by the blocking API, on the caller's thread */
    ddl_ctx_t progress; /* used by the progress thread only */
    ddl_model_t model;
    ddl_algo_t forced_algo;
    int liveness; /* DDL_LIVENESS (config.c): 0 turns the liveness watcher off */
    int shm;      /* DDL_SHM (config.c): 0 keeps reduce off shared memory (shm.c) */
    int cma;      /* DDL_CMA (config.c): 0 keeps a pair's large moves off process_vm_* */
    size_t fusion_threshold;
    double cycle_time_s;
    int node_leader;    /* DDL_NODE_LEADER: one rank per node runs the outer levels */
    size_t segment_bytes; /* DDL_SEGMENT: pipeline segment of the node-leader allreduce */
    uint64_t settings_sig; /* forced_algo and fusion_threshold, hashed into signatures */
    unsigned plan_gen;     /* bumped when the model or forced_algo changes: the plan caches */
} ddl_state_t;

extern ddl_state_t ddl_g;

ddl_status_t ddl_require_init(void);
/* The allreduce engine both threads run: checked, topology-aware, in place on `buf`. */
ddl_status_t ddl_allreduce_ctx(ddl_ctx_t *ctx, const void *sendbuf, void *buf, size_t count,
                               ddl_dtype_t dtype, ddl_op_t op, uint64_t sig);
ddl_status_t ddl_broadcast_ctx(ddl_ctx_t *ctx, void *buf, size_t count, ddl_dtype_t dtype,
                               int root);
ddl_status_t ddl_allgather_ctx(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                               size_t sendcount, ddl_dtype_t dtype);
ddl_status_t ddl_reduce_scatter_ctx(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, ddl_dtype_t dtype, ddl_op_t op);
ddl_status_t ddl_barrier_ctx(ddl_ctx_t *ctx);
/* The same, checked against `sig` (0: the default signature of the call): the
 * asynchronous requests' signatures also cover their shapes (async.c). */
ddl_status_t ddl_broadcast_ctx_sig(ddl_ctx_t *ctx, void *buf, size_t count, ddl_dtype_t dtype,
                                   int root, uint64_t sig);
ddl_status_t ddl_allgather_ctx_sig(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                   size_t sendcount, ddl_dtype_t dtype, uint64_t sig);
ddl_status_t ddl_reduce_scatter_ctx_sig(ddl_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t recvcount, ddl_dtype_t dtype, ddl_op_t op,
                                        uint64_t sig);

/* ---- communicators (comm.c) and their collectives (comm_colls.c) ---------------------- */

/* A communicator: its own context (duplicated MPI communicators, topology grid restricted
 * to its members, collective counter), a separate MPI communicator for point-to-point
 * (user tags never meet the algorithms' messages) and its own timeout. The world one
 * wraps ddl_g.app. A freed one keeps its memory with `freed` set, so a stale handle is a
 * clear error instead of a use after free. */
#define DDL_COMM_MAGIC 0x64646c636f6d6du
struct ddl_comm_s {
    uint64_t magic;
    int freed;
    int is_world;
    ddl_ctx_t own;     /* sub-communicators only */
    ddl_ctx_t *ctx;    /* &own, or &ddl_g.app for the world */
    ddl_ctx_t prog;    /* sub-communicators: their engine's context (async.c) */
    struct ddl_engine_s *eng; /* sub-communicators: their asynchronous queue; NULL without
                                 MPI_THREAD_MULTIPLE (the world's is async.c's own) */
    MPI_Comm p2p;      /* send/recv */
    double timeout_s;  /* 0: the thread's or DDL_TIMEOUT */
    int *world_ranks;  /* world rank of each member, in communicator order */
    /* irecvs not yet matched to a message, in the order they were posted: they are
     * matched in that order, as MPI matches receives (p2p_requests.c) */
    pthread_mutex_t recv_lock;
    struct ddl_request_s *recvs;
    /* Fault tolerance (ft.c): set once a member's failure was seen here; then every call
     * but the local queries and ddl_comm_shrink fails with DDL_ERR_PROC_FAILED. */
    int ft_failed;
    int nfailed;
    int *failed; /* the failed members' ranks in this communicator, sorted */
};

/* Member r of c as a launch (world) rank: what the liveness watcher knows it by. */
static inline int ddl_comm_world_of(const struct ddl_comm_s *c, int r) {
    return c->is_world ? r : c->world_ranks[r];
}
/* DDL_SUCCESS when `c` is a live communicator this rank belongs to (else one error naming
 * `fn`); then sets the calling thread's deadline to the communicator's timeout. */
/* The world communicator: made by ddl_init (collective), released by ddl_finalize. */
ddl_status_t ddl_comm_world_setup(void);
/* The world communicator (valid after ddl_init; every ddl_comm_* call checks that). */
ddl_comm_t ddl_world_comm(void);
void ddl_comm_world_teardown(void);
ddl_status_t ddl_comm_enter(ddl_comm_t c, const char *fn, double *saved_timeout);
void ddl_comm_leave(double saved_timeout);
/* send/recv arguments: dtype, a peer of c, a tag in 0..32767, a buffer, <= 2 GiB. */
ddl_status_t ddl_p2p_check(ddl_comm_t c, const void *buf, size_t count, ddl_dtype_t dtype,
                           int peer, int tag, const char *fn);
/* The header-only signature check every communicator collective starts with. */
ddl_status_t ddl_comm_check(ddl_ctx_t *ctx, uint64_t sig, uint64_t count, const char *coll);

/* Progress thread (async.c): the world communicator's engine. */
ddl_status_t ddl_progress_start(void);
ddl_status_t ddl_progress_stop(void);
int ddl_progress_running(void);
/* A sub-communicator's engine, on its own context (async_internal.h). */
struct ddl_engine_s;
ddl_status_t ddl_engine_create(ddl_ctx_t *ctx, struct ddl_engine_s **out);
void ddl_engine_destroy(struct ddl_engine_s *e);

/* ---- fault tolerance on ULFM (ft.c) ------------------------------------------------- */

/* 1 when the job runs with ULFM enabled (mpirun --with-ft ulfm), decided by ddl_init. */
extern int ddl_ft;
extern int ddl_elastic; /* DDL_ELASTIC (config.c) */
void ddl_ft_detect(void);
/* The MPI communicator libddl's world is a duplicate of: MPI_COMM_WORLD, or the one given
 * to ddl_init_comm. */
extern MPI_Comm ddl_base_comm;
/* An MPI_Comm from its value as an intptr_t (ddl_init_comm, ddl_comm_from_mpi). */
MPI_Comm ddl_comm_of_handle(intptr_t h);
/* The communicator the calling thread works on (ddl_comm_enter), for failures seen where
 * only an MPI return code is at hand. */
extern _Thread_local struct ddl_comm_s *ddl_cur_comm;
/* Whether an MPI error code is a ULFM failure (a process failed, or the communicator was
 * revoked); always 0 outside FT mode. */
int ddl_ft_error(int mpi_rc);
/* FT mode: a member of the communicator of the calling thread's context failed (seen as
 * an MPI error `mpi_rc`, or 0: by the liveness watcher). Revokes every MPI communicator of
 * it (so no member stays blocked), records which members failed and returns
 * DDL_ERR_PROC_FAILED naming them. */
ddl_status_t ddl_ft_fail(int mpi_rc, const char *what);
/* The same for a given communicator. */
ddl_status_t ddl_ft_fail_comm(struct ddl_comm_s *c, int mpi_rc, const char *what);
/* Makes c's failed ranks the calling thread's (ddl_last_failed_ranks). */
void ddl_ft_note(struct ddl_comm_s *c);
/* DDL_ERR_PROC_FAILED for a call `fn` on a communicator that lost a member. */
ddl_status_t ddl_ft_refuse(struct ddl_comm_s *c, const char *fn);
/* Free c's record of failed members (ddl_comm_free). */
void ddl_ft_forget(struct ddl_comm_s *c);
/* Revoke every MPI communicator of c (FT mode). */
void ddl_ft_revoke(struct ddl_comm_s *c);
/* Whether `fn` may still be called on a communicator that lost a member. */
int ddl_ft_exempt(const char *fn);
/* The liveness watcher's dead world ranks among c's members, as c's ranks (out holds
 * c's size entries); returns how many. */
int ddl_liveness_dead_members(const struct ddl_comm_s *c, int *out);

/* ---- GPU buffers: run-time loading (dlsearch.c, cuda_rt.c, nccl.c) and paths (gpu.c) ---- */

/* dlopen the first of `sonames` found by the search order in dlsearch.c; NULL when none,
 * with every attempt in `tried`; `from` receives the file that was loaded. */
void *ddl_dl_search(const char *env, const char *const *sonames, const char *const *subdirs,
                    char *tried, size_t n, char *from, size_t fromlen);

/* The CUDA runtime: DDL_ERR_UNSUPPORTED ("CUDA runtime not found: ...", "no usable CUDA
 * device: ...") until it is loaded and a device is usable; cached. */
ddl_status_t ddl_cuda_load(void);
int ddl_cuda_loaded(void);
void ddl_cuda_describe(char *out, size_t n);
/* *is_device = 1 for device or managed memory (cudaPointerGetAttributes). */
ddl_status_t ddl_cuda_classify(const void *p, int *is_device, int *device);
/* cudaMemcpyAsync(cudaMemcpyDefault) on `stream`. */
ddl_status_t ddl_cuda_copy(void *dst, const void *src, size_t bytes, void *stream);
ddl_status_t ddl_cuda_sync(void *stream);
ddl_status_t ddl_cuda_host_alloc(void **p, size_t bytes);
void ddl_cuda_host_free(void *p);
ddl_status_t ddl_cuda_get_device(int *dev);
ddl_status_t ddl_cuda_set_device(int dev);
ddl_status_t ddl_cuda_bus_id(int dev, char *out, int len);

typedef struct ddl_nccl_comm_s *ddl_nccl_comm_t; /* ncclComm_t */
typedef struct {
    char internal[128];
} ddl_nccl_id_t; /* ncclUniqueId */
ddl_status_t ddl_nccl_load(void);
void ddl_nccl_describe(char *out, size_t n);
int ddl_nccl_version(void);
ddl_status_t ddl_nccl_unique_id(ddl_nccl_id_t *id);
ddl_status_t ddl_nccl_comm_init(ddl_nccl_comm_t *comm, int nranks, const ddl_nccl_id_t *id,
                                int rank);
int ddl_nccl_can_split(void);
ddl_status_t ddl_nccl_comm_split(ddl_nccl_comm_t parent, int color, int key,
                                 ddl_nccl_comm_t *out);
ddl_status_t ddl_nccl_comm_destroy(ddl_nccl_comm_t comm);
ddl_status_t ddl_nccl_allreduce(const void *send, void *recv, size_t count, ddl_dtype_t dtype,
                                ddl_op_t op, ddl_nccl_comm_t comm, void *stream);
ddl_status_t ddl_nccl_broadcast(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                ddl_nccl_comm_t comm, void *stream);
ddl_status_t ddl_nccl_allgather(const void *send, void *recv, size_t sendcount,
                                ddl_dtype_t dtype, ddl_nccl_comm_t comm, void *stream);
ddl_status_t ddl_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                     ddl_dtype_t dtype, ddl_op_t op, ddl_nccl_comm_t comm,
                                     void *stream);
ddl_status_t ddl_nccl_group(int start);

/* DDL_NCCL (DDL_NCCL_OFF/_AUTO/_REQUIRE) and DDL_NCCL_OUTER=mpi, as config.c read them. */
void ddl_gpu_configure(int nccl, int outer_mpi);
/* Destroy the NCCL communicators and free pinned memory (ddl_finalize). */
void ddl_gpu_finalize(void);

#endif

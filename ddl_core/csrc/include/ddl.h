/*
 * ddl.h - the public, stable C API of libddl, DDL-CE's distributed deep-learning
 * collective library.
 *
 * Conventions (the same for every function):
 *   - every function returns a ddl_status_t; DDL_SUCCESS is 0;
 *   - on failure ddl_last_error() returns a message for the calling thread that names the
 *     problem and, where there is one, the fix;
 *   - buffers are contiguous arrays of `count` elements of `dtype`; passing the same
 *     pointer as send and receive buffer (or DDL_IN_PLACE as the send buffer) is in-place;
 *   - collectives are matched across ranks by the order in which they are called, like
 *     MPI and NCCL (asynchronous requests may instead carry a name and are then matched
 *     by name, see ddl_match_t); a call whose count, dtype, op or root differs between
 *     ranks fails with DDL_ERR_MISMATCH on every rank instead of hanging or corrupting
 *     data;
 *   - a peer that exits, dies or finalizes while others wait for it in a collective fails
 *     that collective with DDL_ERR_PEER_LOST on every survivor within milliseconds (each
 *     rank holds a connection to a watcher thread on rank 0, whose closing the kernel
 *     reports at any death); a peer that stops answering for DDL_TIMEOUT seconds (default
 *     300, or ddl_set_thread_timeout) fails it with DDL_ERR_TIMEOUT naming the ranks that
 *     have not reached the collective.
 *
 * Thread safety: the blocking collectives of one communicator may be called from one
 * application thread at a time (different communicators from different threads at once,
 * see ddl_comm_t); the asynchronous ones (ddl_i*) may be called from any thread and are executed by
 * libddl's progress thread on its own communicators, in an order all ranks agree on.
 */
#ifndef DDL_H
#define DDL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_VERSION_MAJOR 2
#define DDL_VERSION_MINOR 2
#define DDL_VERSION_PATCH 0

typedef enum {
    DDL_SUCCESS = 0,
    DDL_ERR_NOT_INITIALIZED = 1, /* called before ddl_init or after ddl_finalize */
    DDL_ERR_INVALID_ARG = 2,     /* bad dtype, op, root, count or pointer */
    DDL_ERR_MISMATCH = 3,        /* ranks disagree on count/dtype/op/root of a collective */
    DDL_ERR_TIMEOUT = 4,         /* a peer did not answer within DDL_TIMEOUT seconds */
    DDL_ERR_MPI = 5,             /* the MPI library returned an error */
    DDL_ERR_NO_MEMORY = 6,
    DDL_ERR_INTERNAL = 7,
    DDL_ERR_UNSUPPORTED = 8,     /* e.g. a device pointer without a usable CUDA/NCCL */
    DDL_ERR_CUDA = 9,
    DDL_ERR_NCCL = 10,
    DDL_ERR_PEER_LOST = 11,      /* a peer exited, died or finalized while this rank waited */
    DDL_ERR_PROC_FAILED = 12     /* fault-tolerant mode: a member of the communicator failed
                                    (ddl_comm_failed_ranks names it; ddl_comm_shrink goes on) */
} ddl_status_t;

typedef enum {
    DDL_FLOAT16 = 0,
    DDL_BFLOAT16 = 1,
    DDL_FLOAT32 = 2,
    DDL_FLOAT64 = 3,
    DDL_INT8 = 4,
    DDL_UINT8 = 5,
    DDL_INT32 = 6,
    DDL_INT64 = 7,
    DDL_NUM_DTYPES = 8
} ddl_dtype_t;

/*
 * Reduction ops. 16-bit floats (float16, bfloat16) travel as 16 bits and each pairwise
 * reduction is computed in float32 and rounded once to the 16-bit format (as NCCL does),
 * so a sum of N values is rounded N-1 times, never accumulated in 16-bit arithmetic; avg
 * divides the reduced sum by the world size in float32 and rounds once. Integer sum/prod
 * wrap modulo 2^bits (as numpy does); integer avg is the sum divided by the size,
 * truncated toward zero (C division).
 */
typedef enum {
    DDL_SUM = 0,
    DDL_AVG = 1,
    DDL_MIN = 2,
    DDL_MAX = 3,
    DDL_PROD = 4,
    DDL_BAND = 5, /* bitwise and, or, xor: integer dtypes only (DDL_ERR_INVALID_ARG for a */
    DDL_BOR = 6,  /* float dtype); device buffers take the staged path (NCCL has none)    */
    DDL_BXOR = 7,
    DDL_NUM_OPS = 8
} ddl_op_t;

/* Allreduce algorithms, per level of the topology grid (see DDL_ALGO). */
typedef enum {
    DDL_ALGO_AUTO = 0,        /* chosen per level and size by the alpha-beta cost model */
    DDL_ALGO_RING = 1,        /* ring reduce-scatter + ring allgather */
    DDL_ALGO_RABENSEIFNER = 2,/* recursive halving reduce-scatter + recursive doubling allgather */
    DDL_ALGO_RECDOUBLING = 3, /* recursive doubling allreduce (latency-optimal, small messages) */
    DDL_ALGO_MPI = 4,         /* the MPI library's own MPI_Allreduce on the level communicator */
    DDL_NUM_ALGOS = 5
} ddl_algo_t;

#define DDL_IN_PLACE ((const void *)1)
#define DDL_MAX_LEVELS 8

typedef struct ddl_request_s *ddl_request_t;

/* ---- life cycle ------------------------------------------------------------------- */

/* Initialise MPI (MPI_THREAD_MULTIPLE) if nobody has, detect or read the topology, start
 * the progress thread, connect to the liveness watcher on rank 0 (DDL_LIVENESS=0: not).
 * Reads DDL_TOPOLOGY, DDL_ALGO, DDL_TIMEOUT, DDL_TUNE_FILE,
 * DDL_FUSION_THRESHOLD, DDL_CYCLE_TIME_MS, DDL_NODE_LEADER, DDL_SEGMENT, DDL_PIECE,
 * DDL_WINDOW, DDL_SPIN_US, DDL_LOG, DDL_NCCL, DDL_NCCL_OUTER, DDL_LIVENESS, DDL_ELASTIC (see
 * ddl_check_setting).
 * Collective and bounded by DDL_TIMEOUT after MPI_Init: every rank must call it; a rank
 * that does not within DDL_TIMEOUT is named in a DDL_ERR_TIMEOUT on the others. A bad
 * setting on any rank, or a setting that must agree (DDL_TOPOLOGY, DDL_ALGO,
 * DDL_NODE_LEADER, DDL_SEGMENT, DDL_PIECE, DDL_FUSION_THRESHOLD, DDL_NCCL,
 * DDL_NCCL_OUTER, DDL_LIVENESS) differing between ranks, is DDL_ERR_INVALID_ARG on every rank, with the
 * variable, the values and the ranks. The cost model's figures are rank 0's (its
 * DDL_TUNE_FILE or tune cache), sent to all. Calling it twice is harmless. */
ddl_status_t ddl_init(void);
/* ddl_init on a communicator of the caller's instead of MPI_COMM_WORLD: `mpi_comm` is the
 * MPI_Comm cast to intptr_t ((intptr_t)comm in C, mpi4py's MPI._handleof(comm)), an
 * intracommunicator (e.g. processes a launcher joined, or survivors merged with spawned
 * ranks); libddl's world is a duplicate of it, its ranks the world's ranks. Collective
 * over it. */
ddl_status_t ddl_init_comm(intptr_t mpi_comm);
/* Stop the progress thread (after finishing queued work), tell the other ranks this one
 * finalized (so it is not reported as lost to collectives it took part in), free
 * communicators, and call MPI_Finalize if ddl_init called MPI_Init, unless a peer was lost
 * or timed out (MPI_Finalize would wait for it). Later calls fail with
 * DDL_ERR_NOT_INITIALIZED. */
ddl_status_t ddl_finalize(void);
int ddl_initialized(void);

ddl_status_t ddl_rank(int *rank);
ddl_status_t ddl_size(int *size);
ddl_status_t ddl_local_rank(int *local_rank);
ddl_status_t ddl_local_size(int *local_size);

/* The topology grid, innermost level first (e.g. {4, 2, 2} for 4 ranks per node x 2 nodes
 * per rack x 2 racks). *nlevels receives the number of levels (<= DDL_MAX_LEVELS). */
ddl_status_t ddl_topology(int *nlevels, int dims[DDL_MAX_LEVELS]);

/* ---- blocking collectives ------------------------------------------------------- */

ddl_status_t ddl_allreduce(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype,
                           ddl_op_t op);
ddl_status_t ddl_broadcast(void *buf, size_t count, ddl_dtype_t dtype, int root);
/* recvbuf holds size * sendcount elements, rank i's contribution at offset i * sendcount. */
ddl_status_t ddl_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                           ddl_dtype_t dtype);
/* sendbuf holds size * recvcount elements; rank i receives the reduction of block i. */
ddl_status_t ddl_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                ddl_dtype_t dtype, ddl_op_t op);
ddl_status_t ddl_barrier(void);

/* Alltoall: block i (`count` elements) of sendbuf goes to rank i, and block j of recvbuf
 * comes from rank j (both size x count elements; not in place). MPI's own algorithm
 * (MPI_Ialltoall[v]) under DDL's mismatch check, deadline and liveness. */
ddl_status_t ddl_alltoall(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype);

/* The counts of an alltoallv: sendcounts[i] elements go to rank i; recvcounts[j] (out)
 * is what rank j sends here. Every rank calls it, then ddl_alltoallv with both. */
ddl_status_t ddl_alltoall_counts(const size_t *sendcounts, size_t *recvcounts);

/* Alltoallv: sendcounts[i] elements of sendbuf (packed in rank order) go to rank i;
 * recvcounts[j] from rank j land in recvbuf, packed in rank order. A recvcounts that
 * differs from what the sender sends is DDL_ERR_MISMATCH naming both sizes, never a
 * truncation (ddl_alltoall_counts gives the right ones). At most 2 GiB in all per call. */
ddl_status_t ddl_alltoallv(const void *sendbuf, const size_t *sendcounts, void *recvbuf,
                           const size_t *recvcounts, ddl_dtype_t dtype);

/* ---- asynchronous collectives ------------------------------------------------------ */
/* The buffers must stay valid and untouched until the request completes. Small allreduces
 * submitted close together are fused into one buffer (DDL_FUSION_THRESHOLD bytes, default
 * 64 MiB; DDL_CYCLE_TIME_MS, default 1 ms): results are bit-identical to unfused calls. */

ddl_status_t ddl_iallreduce(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype,
                            ddl_op_t op, ddl_request_t *req);
ddl_status_t ddl_ibroadcast(void *buf, size_t count, ddl_dtype_t dtype, int root,
                            ddl_request_t *req);
ddl_status_t ddl_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                            ddl_dtype_t dtype, ddl_request_t *req);
ddl_status_t ddl_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                 ddl_dtype_t dtype, ddl_op_t op, ddl_request_t *req);
/*
 * Matching asynchronous requests by name (as Horovod does). Unnamed requests (the calls
 * above, or a NULL match or name) are matched across ranks by submission order: the n-th
 * unnamed request of every rank runs with the n-th of the others. A named request is
 * matched by its name, whatever the order in which the ranks submit it: each cycle the
 * progress threads agree on the names every rank has submitted and run those (fused
 * where they can) in an order every rank shares; a name not yet submitted everywhere
 * waits. So gradients whose hooks fire in different orders on different ranks still meet.
 *   - A name identifies one request at a time: submitting a name that is in flight on this
 *     rank (submitted, not yet complete) fails at once with DDL_ERR_INVALID_ARG.
 *   - Every rank must submit a name (or the n-th unnamed request) with the same
 *     collective, dtype, op, root and count; with a shape, the shapes must agree too (all
 *     dimensions; allgather and allgatherv: all but the first). Otherwise that request
 *     fails with DDL_ERR_MISMATCH on every rank, with a message naming what differs and
 *     two ranks that differ ("Mismatched allreduce tensor shapes for allreduce 'w': rank 0
 *     sent shape [2, 3], but rank 1 sent shape [3, 2]..."); other requests are unaffected
 *     and the next ones work.
 *   - A request that some rank does not submit within DDL_TIMEOUT seconds while the others
 *     wait for it fails with DDL_ERR_TIMEOUT on the ranks that did, naming the ranks that
 *     did not.
 * A zeroed ddl_match_t with only `name` set compares counts, not shapes.
 */
#define DDL_HAVE_NAMED_REQUESTS 1
typedef struct {
    const char *name;     /* NULL or "": unnamed, matched by submission order */
    int ndim;             /* the tensor's shape: ndim dimensions in shape[]; ndim 0 and */
    const int64_t *shape; /* shape NULL: no shape; ndim 0 and shape non-NULL: a scalar */
} ddl_match_t;

/* The shape, where given, describes the buffer (reduce_scatter: the input, size x
 * recvcount elements); the product of its dimensions must equal the element count. */
ddl_status_t ddl_iallreduce_named(const void *sendbuf, void *recvbuf, size_t count,
                                  ddl_dtype_t dtype, ddl_op_t op, const ddl_match_t *match,
                                  ddl_request_t *req);
ddl_status_t ddl_ibroadcast_named(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                  const ddl_match_t *match, ddl_request_t *req);
ddl_status_t ddl_iallgather_named(const void *sendbuf, void *recvbuf, size_t sendcount,
                                  ddl_dtype_t dtype, const ddl_match_t *match,
                                  ddl_request_t *req);
ddl_status_t ddl_ireduce_scatter_named(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddl_dtype_t dtype, ddl_op_t op, const ddl_match_t *match,
                                       ddl_request_t *req);
/* An allgather whose count may differ between ranks (Horovod's allgather of tensors whose
 * first dimension differs). libddl allocates the result: once the request has completed,
 * ddl_request_gathered gives every rank's elements in rank order and each rank's count
 * (ddl_size() entries), both owned by the request until ddl_request_free. */
ddl_status_t ddl_iallgatherv_named(const void *sendbuf, size_t sendcount, ddl_dtype_t dtype,
                                   const ddl_match_t *match, ddl_request_t *req);
ddl_status_t ddl_request_gathered(ddl_request_t req, const void **buf, const size_t **counts);

/* Horovod's join, for ranks with uneven amounts of data: this rank has finished. Until
 * every rank has called ddl_join, it takes part in every asynchronous request the others
 * run, contributing zeros (allreduce, reduce_scatter, allgather), no elements (allgatherv)
 * or a discarded buffer (broadcast), so their requests complete; a sum then counts only
 * the ranks still running, an average still divides by ddl_size() (as Horovod's does).
 * Returns once every rank has joined, with *last_rank the rank that joined last. Call it
 * with none of this rank's asynchronous requests queued (DDL_ERR_INVALID_ARG otherwise);
 * blocking collectives are not covered (use the asynchronous ones while ranks join). */
ddl_status_t ddl_join(int *last_rank);

/* When a finished request went through each stage, for timelines (CLOCK_MONOTONIC
 * seconds): submitted; negotiated (every rank had it: the batch it runs in was agreed);
 * started and finished (its collective, fused with others or alone). fused: how many
 * requests shared its fusion buffer (1: none), fused_bytes: that buffer's size. */
typedef struct {
    double submitted, negotiated, started, finished;
    size_t fused, fused_bytes;
} ddl_request_timing_t;
ddl_status_t ddl_request_timing(ddl_request_t req, ddl_request_timing_t *out);

/* *done = 1 once finished; the request's own status is returned then (and only then). */
ddl_status_t ddl_test(ddl_request_t req, int *done);
/* Block until finished and return the request's status. */
ddl_status_t ddl_wait(ddl_request_t req);
/* Release a request (after it completed; freeing a pending request waits for it). */
void ddl_request_free(ddl_request_t req);

/* ---- deadlines -------------------------------------------------------------------- */

/* The deadline of the collectives the calling thread calls, or submits (ddl_i*: the request
 * keeps the deadline it was submitted with), from now on: `seconds` (> 0), or 0 to go back
 * to DDL_TIMEOUT. Lets one process serve groups with different timeouts (torch.distributed's
 * timeout= of a process group). DDL_ERR_INVALID_ARG for nan, inf or a negative value. */
ddl_status_t ddl_set_thread_timeout(double seconds);

/* The calling thread is about to block on a request it submitted (ddl_wait from a thread
 * that submits nothing meanwhile): the progress thread negotiates what is queued now
 * instead of waiting out DDL_CYCLE_TIME_MS for more requests to fuse. A blocking call
 * gets a small message's latency, not the cycle time; fusion of requests submitted
 * together is unchanged. No-op when nothing is queued. */
void ddl_progress_hurry(void);
/* The calling thread's setting (0: DDL_TIMEOUT applies). */
double ddl_thread_timeout(void);

/* ---- GPU buffers ------------------------------------------------------------------ */
/*
 * The *_stream collectives take CUDA device memory (cudaMalloc'd or managed) and the
 * cudaStream_t (passed as void *, NULL = the default stream) on which the caller made the
 * input and will use the output. Host pointers are accepted too: the stream is then
 * synchronized and the host collective runs. The host API above is unchanged: it never
 * takes device pointers.
 *
 * Nothing of CUDA is needed to build or to run host collectives: the CUDA runtime and NCCL
 * are loaded with dlopen at the first device call. Search order, for each: DDL_CUDA_LIB /
 * DDL_NCCL_LIB (a file or a directory; when set, nothing else is tried), a copy already
 * loaded in the process (e.g. torch's), the nvidia-* pip wheels beside libddl
 * (site-packages/nvidia/{cu13,cuda_runtime,nccl}/lib), libddl's directory and
 * $CONDA_PREFIX/lib, then the system loader. Without a CUDA runtime or a GPU these calls
 * fail with DDL_ERR_UNSUPPORTED and a message that starts "CUDA runtime not found" or "no
 * usable CUDA device" and names what was tried.
 *
 * Collective rules (as for every DDL collective, plus two):
 *   - NCCL is set up lazily by the FIRST device-buffer collective: communicators per
 *     topology level (ncclCommInitRank over the world, unique id broadcast over MPI, then
 *     ncclCommSplit), so every rank must make that call, as it must any collective;
 *   - in one call either every rank passes device buffers or every rank host buffers (a mix
 *     fails with DDL_ERR_MISMATCH on every rank); each rank keeps to one GPU.
 *
 * Paths, chosen once by all ranks together at the first device call:
 *   - NCCL (DDL_NCCL=auto, the default, or 1): the work is enqueued on `stream` and the
 *     call returns, as NCCL's do: the result is ready for work queued later on `stream`.
 *     The allreduce is hierarchical over the topology grid (reduce-scatter per inner level,
 *     allreduce on the outermost, allgather back); DDL_NCCL_OUTER=mpi reduces the
 *     outermost level over MPI through host memory instead of NCCL.
 *   - staging through pinned host memory with the MPI algorithms, when NCCL cannot serve
 *     (not found on some rank, or several ranks of a node share a GPU, which NCCL refuses)
 *     or DDL_NCCL=0; said once in the log by rank 0. The call synchronizes `stream`
 *     and returns when the result is in place. DDL_NCCL=1 makes this an error instead.
 *   - one rank, in-place allreduce: nothing moves and nothing is enqueued.
 * Asynchronous (ddl_i*) variants take host memory only.
 */
ddl_status_t ddl_allreduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                  ddl_dtype_t dtype, ddl_op_t op, void *stream);
ddl_status_t ddl_broadcast_stream(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                  void *stream);
ddl_status_t ddl_allgather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                  ddl_dtype_t dtype, void *stream);
ddl_status_t ddl_reduce_scatter_stream(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddl_dtype_t dtype, ddl_op_t op, void *stream);
/* "key=value" lines: where the CUDA runtime and NCCL were loaded from (or why not, with
 * what was tried), their versions, DDL_NCCL, the path in use (undecided, nccl, staged and
 * why) and counters of device calls per path. Loads the libraries if it has to; may be
 * called before ddl_init. Returns what snprintf would (the full length). */
int ddl_gpu_info(char *buf, size_t len);

/* ---- communicators (libddl 2) ------------------------------------------------------ */
/*
 * A communicator is a group of ranks with its own topology grid (the world's grid
 * restricted to its members when they form a sub-grid, else flat), its own cost-model
 * plan, mismatch checks, collective order and timeout. The 1.x calls above are calls on
 * the world communicator (ddl_comm_world). Collectives on one communicator are called by
 * one thread at a time on each rank; collectives on disjoint communicators (or on
 * different communicators of one rank) may run at the same time from different threads.
 * Each collective on a communicator involves its members only: a count, dtype, op or root
 * that differs fails with DDL_ERR_MISMATCH on every member (and on no other rank) before
 * any data moves, and the next call works; a member that does not arrive within the
 * communicator's timeout (ddl_comm_set_timeout, else the thread's, else DDL_TIMEOUT) fails
 * it with DDL_ERR_TIMEOUT. A NULL or freed communicator, a root or peer outside it, is
 * DDL_ERR_INVALID_ARG before anything moves. Host buffers only (device buffers: the
 * *_stream calls, on the world).
 *
 * Each communicator also has its own asynchronous queue and progress thread (the
 * ddl_comm_i* calls below): its requests are negotiated (unnamed ones by order, named ones
 * by name, a name unique per communicator), fused and run among its members only,
 * independently of every other communicator's, with the communicator's timeout as their
 * deadline. ddl_comm_free waits for what is queued on it.
 */
typedef struct ddl_comm_s *ddl_comm_t;
#define DDL_UNDEFINED (-1) /* ddl_comm_split's color for "not a member" */

ddl_status_t ddl_comm_world(ddl_comm_t *world);
/* Collective over `comm`, like MPI_Comm_split: ranks with the same color form one new
 * communicator, ordered by key then by rank in comm; color DDL_UNDEFINED gives NULL. */
ddl_status_t ddl_comm_split(ddl_comm_t comm, int color, int key, ddl_comm_t *newcomm);
/* Collective over `comm`: the n ranks listed (ranks of comm, the same list on every rank)
 * in that order; NULL on the ranks not listed. */
ddl_status_t ddl_comm_create(ddl_comm_t comm, const int *ranks, int n, ddl_comm_t *newcomm);
/* Local: releases the communicator and sets *comm to NULL (the world cannot be freed). */
ddl_status_t ddl_comm_free(ddl_comm_t *comm);
/* `seconds` > 0, or 0 to follow the thread's timeout / DDL_TIMEOUT. Split and created
 * communicators inherit their parent's. */
ddl_status_t ddl_comm_set_timeout(ddl_comm_t comm, double seconds);
ddl_status_t ddl_comm_rank(ddl_comm_t comm, int *rank);
ddl_status_t ddl_comm_size(ddl_comm_t comm, int *size);
/* The world rank of member `rank`. */
ddl_status_t ddl_comm_world_rank(ddl_comm_t comm, int rank, int *world_rank);
/* The communicator's own grid, innermost level first (as ddl_topology for the world):
 * the grid of the job restricted to its members, levels of one rank dropped. */
ddl_status_t ddl_comm_topology(ddl_comm_t comm, int *nlevels, int dims[DDL_MAX_LEVELS]);

ddl_status_t ddl_comm_allreduce(ddl_comm_t comm, const void *sendbuf, void *recvbuf,
                                size_t count, ddl_dtype_t dtype, ddl_op_t op);
ddl_status_t ddl_comm_broadcast(ddl_comm_t comm, void *buf, size_t count, ddl_dtype_t dtype,
                                int root);
ddl_status_t ddl_comm_allgather(ddl_comm_t comm, const void *sendbuf, void *recvbuf,
                                size_t sendcount, ddl_dtype_t dtype);
ddl_status_t ddl_comm_reduce_scatter(ddl_comm_t comm, const void *sendbuf, void *recvbuf,
                                     size_t recvcount, ddl_dtype_t dtype, ddl_op_t op);
ddl_status_t ddl_comm_barrier(ddl_comm_t comm);
/* Block i (count elements) of sendbuf goes to rank i; block j of recvbuf comes from j. */
ddl_status_t ddl_comm_alltoall(ddl_comm_t comm, const void *sendbuf, void *recvbuf,
                               size_t count, ddl_dtype_t dtype);
/* sendcounts[i] elements (consecutive in sendbuf) go to rank i; recvcounts[j] arrive from
 * j (consecutive in recvbuf, in rank order). Rank i's sendcounts[j] must equal rank j's
 * recvcounts[i]: otherwise DDL_ERR_MISMATCH on every member, naming the counts. */
ddl_status_t ddl_comm_alltoallv(ddl_comm_t comm, const void *sendbuf, const size_t *sendcounts,
                                void *recvbuf, const size_t *recvcounts, ddl_dtype_t dtype);
/* recvbuf receives every rank's sendcount elements in rank order; recvcounts[j] must be
 * rank j's sendcount (else DDL_ERR_MISMATCH on every member). */
ddl_status_t ddl_comm_allgatherv(ddl_comm_t comm, const void *sendbuf, size_t sendcount,
                                 void *recvbuf, const size_t *recvcounts, ddl_dtype_t dtype);
/* recvbuf (root only) holds size x count elements, rank i's at offset i x count. In place
 * at the root: sendbuf DDL_IN_PLACE (or recvbuf + root x count), its block already there. */
ddl_status_t ddl_comm_gather(ddl_comm_t comm, const void *sendbuf, void *recvbuf, size_t count,
                             ddl_dtype_t dtype, int root);
/* sendbuf (root only) holds size x count elements; rank i receives block i. In place at
 * the root: recvbuf DDL_IN_PLACE (or sendbuf + root x count), its block left where it is. */
ddl_status_t ddl_comm_scatter(ddl_comm_t comm, const void *sendbuf, void *recvbuf, size_t count,
                              ddl_dtype_t dtype, int root);
/* The allreduce's result (bit for bit), delivered to root's recvbuf only. */
ddl_status_t ddl_comm_reduce(ddl_comm_t comm, const void *sendbuf, void *recvbuf, size_t count,
                             ddl_dtype_t dtype, ddl_op_t op, int root);
/* Point-to-point, tags 0..32767, matched by (source, tag) in order. A message whose size
 * differs from the receive buffer's is consumed and fails the recv with DDL_ERR_MISMATCH
 * naming both sizes (never truncated). Both wait at most the communicator's timeout. */
ddl_status_t ddl_comm_send(ddl_comm_t comm, const void *buf, size_t count, ddl_dtype_t dtype,
                           int dest, int tag);
ddl_status_t ddl_comm_recv(ddl_comm_t comm, void *buf, size_t count, ddl_dtype_t dtype,
                           int source, int tag);
/* The same without blocking: ddl_request_t's completed by ddl_wait / ddl_test (which make
 * their progress: one thread per request) and released by ddl_request_free; the buffer
 * stays untouched (isend) or unread (irecv) until then. Messages between a pair with one
 * tag arrive in the order they were sent; a size mismatch or the deadline (from the call)
 * fails the request as recv does. */
ddl_status_t ddl_comm_isend(ddl_comm_t comm, const void *buf, size_t count, ddl_dtype_t dtype,
                            int dest, int tag, ddl_request_t *req);
ddl_status_t ddl_comm_irecv(ddl_comm_t comm, void *buf, size_t count, ddl_dtype_t dtype,
                            int source, int tag, ddl_request_t *req);

/* Asynchronous collectives on a communicator, as ddl_iallreduce_named and its siblings
 * (match may be NULL: unnamed); complete them with ddl_wait / ddl_test and free them with
 * ddl_request_free. On the world communicator they are those calls. */
ddl_status_t ddl_comm_iallreduce(ddl_comm_t comm, const void *sendbuf, void *recvbuf,
                                 size_t count, ddl_dtype_t dtype, ddl_op_t op,
                                 const ddl_match_t *match, ddl_request_t *req);
ddl_status_t ddl_comm_ibroadcast(ddl_comm_t comm, void *buf, size_t count, ddl_dtype_t dtype,
                                 int root, const ddl_match_t *match, ddl_request_t *req);
ddl_status_t ddl_comm_iallgather(ddl_comm_t comm, const void *sendbuf, void *recvbuf,
                                 size_t sendcount, ddl_dtype_t dtype, const ddl_match_t *match,
                                 ddl_request_t *req);
ddl_status_t ddl_comm_ireduce_scatter(ddl_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, ddl_dtype_t dtype, ddl_op_t op,
                                      const ddl_match_t *match, ddl_request_t *req);
ddl_status_t ddl_comm_iallgatherv(ddl_comm_t comm, const void *sendbuf, size_t sendcount,
                                  ddl_dtype_t dtype, const ddl_match_t *match,
                                  ddl_request_t *req);

/* Collective over the members only (MPI_Comm_create_group), each listing the same ranks
 * of `comm` in the same order; ranks not listed do not call it (torch's new_group with
 * use_local_synchronization). A rank not in its own list is DDL_ERR_INVALID_ARG. Not
 * bounded by the timeout: a member that never calls it leaves the others waiting. */
ddl_status_t ddl_comm_create_group(ddl_comm_t comm, const int *ranks, int n,
                                   ddl_comm_t *newcomm);
/* A communicator over (a duplicate of) the caller's MPI communicator (`mpi_comm` as for
 * ddl_init_comm; collective over it). Members from another MPI world (spawned and merged)
 * have world rank -1 (ddl_comm_world_rank) and are watched by ULFM only. */
ddl_status_t ddl_comm_from_mpi(intptr_t mpi_comm, ddl_comm_t *newcomm);

/* ---- fault tolerance (libddl 2.2; ULFM, `mpirun --with-ft ulfm`) ------------------------ */
/*
 * In a job launched with ULFM enabled (`ddlrun --elastic`, `mpirun --with-ft ulfm`), a
 * member's death does not end the survivors: every survivor's pending and next call on a
 * communicator that lost a member fails with DDL_ERR_PROC_FAILED (whichever detector saw
 * it first: MPI's, or the liveness watcher, including the death of rank 0, its hub), and
 * so do the pending asynchronous requests on it; the communicator then answers only its
 * local queries (rank, size, ...), ddl_comm_failed_ranks, ddl_comm_free and
 * ddl_comm_shrink. Without ULFM a death is DDL_ERR_PEER_LOST as before and the job ends.
 * In fault-tolerant mode, only host memory and the MPI paths (no NCCL) are covered.
 */
/* *on = 1 when this job runs with ULFM enabled (decided at ddl_init; may be asked before). */
ddl_status_t ddl_fault_tolerant(int *on);
/* The ranks (of comm) known to have failed, sorted: up to `max` into ranks[], *n = how
 * many in all (0 while none). Local. */
ddl_status_t ddl_comm_failed_ranks(ddl_comm_t comm, int *ranks, int max, int *n);
/* The ranks that this thread's last DDL_ERR_PROC_FAILED named (of the communicator it
 * was on), as ddl_comm_failed_ranks. */
ddl_status_t ddl_last_failed_ranks(int *ranks, int max, int *n);
/* Collective over the survivors of `comm` (each calls it, typically after a
 * DDL_ERR_PROC_FAILED): revokes comm (releasing members still in a call on it), shrinks
 * it to the live members (MPIX_Comm_shrink) and builds a new communicator on them exactly
 * as ddl_comm_split does (its own topology grid, plans, asynchronous engine and progress
 * thread, name table, shared-memory segments), which every survivor then confirms
 * (MPIX_Comm_agree); a member dying meanwhile makes the survivors shrink again. Ranks
 * keep their order. `comm` stays failed: free it (not the world) when done. Without ULFM:
 * DDL_ERR_UNSUPPORTED. */
ddl_status_t ddl_comm_shrink(ddl_comm_t comm, ddl_comm_t *newcomm);

/* ---- tuning and introspection ---------------------------------------------------- */

/* Force one allreduce algorithm for every level (DDL_ALGO_AUTO restores the model). Like
 * ddl_set_fusion, call it the same way on every rank: the setting is part of every
 * collective's signature, so ranks that differ fail with DDL_ERR_MISMATCH. */
ddl_status_t ddl_set_algorithm(ddl_algo_t algo);
/* Override the cost model's alpha (s) and beta (s/byte) for one level. */
ddl_status_t ddl_set_level_cost(int level, double alpha, double beta);
ddl_status_t ddl_get_level_cost(int level, double *alpha, double *beta);
/* The algorithm the model picks for `bytes` at `level` (what DDL_ALGO=auto would run), and
 * the predicted time in seconds of the whole allreduce of `bytes`. */
ddl_status_t ddl_plan(size_t bytes, ddl_algo_t algos[DDL_MAX_LEVELS], double *predicted_s);
/* Counters of the progress thread since init: negotiated batches, fusion buffers reduced,
 * and requests that travelled inside a fusion buffer. */
ddl_status_t ddl_async_stats(uint64_t *batches, uint64_t *fused_buffers,
                             uint64_t *fused_requests);
/* Counters of the negotiation since init: cycles, cycles that exchanged names (a name
 * new to the table, or a stalled request), names in the table; and the requests queued
 * on this rank now (submitted, not yet taken into a batch). */
ddl_status_t ddl_negotiation_stats(uint64_t *cycles, uint64_t *full_cycles, uint64_t *names,
                                   uint64_t *pending);
/* Of those cycles, how many a thread waiting in ddl_wait ran itself (when no other
 * thread was negotiating) rather than the progress thread. */
ddl_status_t ddl_waiter_stats(uint64_t *cycles);
/* Fusion settings (bytes, at most 2^40; milliseconds). The threshold must be the same on
 * every rank (see ddl_set_algorithm); the cycle time is this rank's own. */
ddl_status_t ddl_set_fusion(size_t threshold_bytes, double cycle_time_ms);

/* ---- settings ---------------------------------------------------------------------- */

/* The number rule every DDL_* number follows (ddl_init, ddlrun, tune files): decimal,
 * nothing before or after it (no blanks, no hex, no nan/inf), finite, within [lo, hi];
 * with `integer` digits only (an optional sign, no point or exponent). An empty text is
 * an error. DDL_ERR_INVALID_ARG names `name`, the value and the range. Needs no init. */
ddl_status_t ddl_parse_number(const char *name, const char *text, double lo, double hi,
                              int integer, double *value);
/* Check `text` as the value of the environment variable `name` exactly as ddl_init would:
 * *known = 0 for a name libddl does not read (then nothing is checked); else DDL_SUCCESS
 * with *value (the number; for DDL_TOPOLOGY the number of ranks it describes; for the
 * words their code) or DDL_ERR_INVALID_ARG with the message. Needs no init. */
ddl_status_t ddl_check_setting(const char *name, const char *text, int *known, double *value);

const char *ddl_last_error(void);
const char *ddl_status_string(ddl_status_t status);
const char *ddl_dtype_name(ddl_dtype_t dtype);
const char *ddl_op_name(ddl_op_t op);
const char *ddl_algo_name(ddl_algo_t algo);
size_t ddl_dtype_size(ddl_dtype_t dtype);
/* "libddl 2.2.0 (Open MPI v5.0.11 ...)" */
const char *ddl_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* DDL_H */

/* Internals of the asynchronous requests, shared by async.c (the queue, submission and
 * the progress thread), negotiate.c (which requests run in a cycle: the table of names and
 * the negotiation), batch.c (running a batch: fusion, mismatches) and names.c (a map of
 * names). Not installed. */
#ifndef DDL_ASYNC_INTERNAL_H
#define DDL_ASYNC_INTERNAL_H

#include <pthread.h>

#include "ddl_internal.h"

/* REQ_JOIN: ddl_join's request (negotiate.c: a rank that has one queued takes part with
 * zeros in what the others run until every rank has one). REQ_SEND, REQ_RECV:
 * point-to-point, no engine (p2p_requests.c). */
enum { REQ_ALLREDUCE, REQ_BROADCAST, REQ_ALLGATHER, REQ_REDUCE_SCATTER, REQ_ALLGATHERV, REQ_JOIN,
       REQ_SEND, REQ_RECV };
/* The collective's own name (an allgatherv is an "allgatherv") and the word messages use
 * (to its user an allgatherv is Horovod's allgather). */
extern const char *const ddl_kind_name[];
extern const char *const ddl_kind_word[];

struct ddl_engine_s;

struct ddl_request_s {
    struct ddl_engine_s *eng; /* the communicator's engine it was submitted to */
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ddl_dtype_t dtype;
    ddl_op_t op;
    int root;
    uint64_t sig;       /* what every rank's request must agree on (async.c: request_sig) */
    const char *name;   /* NULL: unnamed, matched by order */
    uint64_t hash;      /* of the name */
    uint64_t seq;       /* unnamed: this rank's count of unnamed requests before it */
    int ndim;           /* -1: no shape */
    const int64_t *shape;
    double submitted;
    double timeout;     /* the submitting thread's deadline (0: DDL_TIMEOUT) */
    size_t slot;        /* progress thread: the name's table slot, valid while */
    uint32_t slot_gen;  /* ... the slot's generation is this (0: not looked up) */
    void *gathered;     /* allgatherv: the result and every rank's count */
    size_t *counts;
    double t_negotiated, t_started, t_finished; /* for ddl_request_timing */
    size_t fused, fused_bytes;
    uint64_t join_cycle; /* REQ_JOIN: the negotiation that first saw it (agreed numbering) */
    int synthetic;       /* a joined rank's stand-in for the others' request (negotiate.c) */
    int refused;         /* not an allreduce while a rank has joined: fails, does not run */
    /* point-to-point (REQ_SEND, REQ_RECV; eng is NULL): p2p_requests.c */
    MPI_Request mreq;
    MPI_Comm p2p;
    int peer, tag, matched; /* matched: a recv's message was probed and is being received */
    size_t want;            /* bytes the buffer holds */
    int got;                /* recv: bytes the message held */
    void *spill;            /* recv: a message of another size lands here, then is dropped */
    double deadline;
    struct ddl_comm_s *comm;       /* irecv: its communicator, whose list it waits in */
    struct ddl_request_s *pnext;   /* irecv: the next unmatched receive of that list */
    int listed;
    unsigned live_gen;     /* point-to-point: the liveness counter last looked at, */
    const char *peer_gone; /* and how the peer left once it has (ddl_liveness_departed) */
    int done; /* written under the queue's lock, read atomically */
    ddl_status_t status;
    char error[1024];
    struct ddl_request_s *prev, *next; /* the pending list, in submission order */
};

/* The request's deadline in seconds: its thread's, else DDL_TIMEOUT. */
static inline double ddl_req_timeout(const struct ddl_request_s *r) {
    return r->timeout > 0 ? r->timeout : ddl_timeout_s;
}

static inline size_t ddl_req_bytes(const struct ddl_request_s *r) {
    return r->count * ddl_dtype_size(r->dtype);
}

/* ---- names.c / negotiate.c state kept per engine ---- */

typedef struct {
    uint64_t hash;
    const char *name; /* NULL: empty; the map does not own it */
    size_t val;
} ddl_nm_entry_t;
typedef struct {
    ddl_nm_entry_t *e;
    size_t cap, n; /* cap is 0 or a power of two, at most half full */
} ddl_namemap_t;

typedef struct {
    struct ddl_request_s **v;
    size_t n, cap;
} ddl_reqvec_t;

/* One engine per communicator that runs asynchronous requests (the world's, and each
 * sub-communicator's): its queue, its progress thread, its own context (MPI communicators
 * no other thread uses) and its own table of names. Engines share nothing, so the
 * requests of disjoint communicators progress independently, and a name is matched
 * within its communicator only (as Horovod matches per process set). */
/* The buffers a cycle fills: what this rank had queued, what runs, what failed. Used by
 * whichever thread holds the engine's claim (ddl_engine_t.cycling). */
typedef struct {
    ddl_reqvec_t snap, batch, stalled;
} ddl_cycle_bufs_t;

typedef struct ddl_engine_s {
    pthread_mutex_t lock;
    pthread_cond_t work; /* the progress thread waits here */
    pthread_cond_t done; /* waiters on requests wait here */
    struct ddl_request_s *head, *tail;
    size_t pending;
    size_t fresh; /* submitted since the progress thread last looked */
    size_t fresh_bytes;
    double first_fresh;
    uint64_t unnamed_seq;
    ddl_namemap_t inflight; /* names of the requests submitted and not yet complete */
    int stop;
    int running;
    pthread_t thread;
    int hurry; /* someone blocks on a queued request: negotiate without the cycle time */
    int cycling; /* a thread (the progress thread or a waiter) owns the progress context's
                  * communicators: negotiating and running a batch, or looking for a peer's
                  * negotiation */
    int more;    /* agreed: after the last negotiation some rank still had requests queued */
    double last_cycle; /* when the last negotiation began */
    double last_submit; /* when the last request was submitted */
    double idle_until;  /* the idle progress thread's next look (0: not idle) */
    int claim_waiters;  /* the progress thread waits for a waiter's cycle to end */
    ddl_cycle_bufs_t bufs;
    ddl_ctx_t *ctx; /* the progress context: ddl_g.progress, or the communicator's */
    struct ddl_negstate_s *neg; /* negotiate.c's table of names and buffers */
    struct ddl_engine_s *next_engine; /* the list of live engines (ddl_progress_hurry) */
} ddl_engine_t;

/* ---- async.c ---- */

/* ddl_engine_create (ddl_internal.h) starts an engine's progress thread on `ctx`, which it
 * then owns for MPI; ddl_engine_destroy waits for what is queued and stops the thread. */

/* Finish a request with `st`; `msg` (NULL: this thread's last error) explains a failure. */
void ddl_req_finish(struct ddl_request_s *r, ddl_status_t st, const char *msg);
/* "allreduce 'grad.fc1'" or "unnamed allreduce #3 (...)", for messages. */
void ddl_req_describe(const struct ddl_request_s *r, char *out, size_t n);

/* Counters (ddl_async_stats, ddl_negotiation_stats), updated atomically. */
extern uint64_t ddl_stat_fused_buffers, ddl_stat_fused_requests, ddl_stat_full_cycles,
    ddl_stat_names;

/* ---- p2p_requests.c ---- */

static inline int ddl_req_is_p2p(const struct ddl_request_s *r) {
    return r->kind == REQ_SEND || r->kind == REQ_RECV;
}
/* One step of a point-to-point request (MPI_Improbe / MPI_Test, the deadline): completes it
 * when it is done. Called by the request's one waiting thread (ddl_test, ddl_wait). */
void ddl_p2p_progress(struct ddl_request_s *r);
/* ddl_wait for a point-to-point request: progress until done, spinning then pausing. */
void ddl_p2p_wait(struct ddl_request_s *r);

/* ---- names.c: hashing names, and an open-addressing map (name -> value) ---- */

uint64_t ddl_mix64(uint64_t x);
uint64_t ddl_name_hash(const char *s);
ddl_nm_entry_t *ddl_nm_find(const ddl_namemap_t *m, const char *name, uint64_t h);
int ddl_nm_put(ddl_namemap_t *m, const char *name, uint64_t h, size_t val); /* -1: no memory */
void ddl_nm_del(ddl_namemap_t *m, ddl_nm_entry_t *e);
void ddl_nm_free(ddl_namemap_t *m);

/* ---- negotiate.c ---- */

int ddl_reqvec_push(ddl_reqvec_t *v, struct ddl_request_s *r); /* -1: no memory */

/* Every rank's progress thread calls this once per cycle with what it has queued (in
 * submission order): `batch` receives the requests every rank has and runs now, in the
 * order all ranks share; `stalled` this rank's requests some rank did not submit within
 * DDL_TIMEOUT, their message in r->error; *more whether some rank keeps requests queued. */
ddl_status_t ddl_negotiate(ddl_engine_t *e, const ddl_reqvec_t *snap, ddl_reqvec_t *batch, ddl_reqvec_t *stalled,
                           int *more);
/* The tag of the doorbell a folded rank's partner rings (negotiate.c), which an idle
 * progress thread looks out for with DDL_TAG_RD. */
enum { DDL_TAG_BELL = 401 };
/* Free a joined rank's stand-in request (r->synthetic) once its batch ran. */
void ddl_req_free_synthetic(struct ddl_request_s *r);
/* Forget an engine's table of names (when it stops). */
void ddl_negotiate_free(ddl_engine_t *e);

/* ---- batch.c ---- */

/* Run a batch (the same requests, in the same order, on every rank of their engine's
 * communicator), completing each. */
void ddl_run_batch(struct ddl_request_s **reqs, size_t n);

#endif

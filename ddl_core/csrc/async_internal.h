/* Internals of the asynchronous requests, shared by async.c (the queue, submission and
 * the progress thread), negotiate.c (which requests run in a cycle: the table of names and
 * the negotiation), batch.c (running a batch: fusion, mismatches) and names.c (a map of
 * names). Not installed. */
#ifndef DDL_ASYNC_INTERNAL_H
#define DDL_ASYNC_INTERNAL_H

#include "ddl_internal.h"

/* REQ_JOIN: ddl_join's request (negotiate.c: a rank that has one queued takes part with
 * zeros in what the others run until every rank has one). */
enum { REQ_ALLREDUCE, REQ_BROADCAST, REQ_ALLGATHER, REQ_REDUCE_SCATTER, REQ_ALLGATHERV, REQ_JOIN };
/* The collective's own name (an allgatherv is an "allgatherv") and the word messages use
 * (to its user an allgatherv is Horovod's allgather). */
extern const char *const ddl_kind_name[];
extern const char *const ddl_kind_word[];

struct ddl_request_s {
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

/* ---- async.c ---- */

/* Finish a request with `st`; `msg` (NULL: this thread's last error) explains a failure. */
void ddl_req_finish(struct ddl_request_s *r, ddl_status_t st, const char *msg);
/* "allreduce 'grad.fc1'" or "unnamed allreduce #3 (...)", for messages. */
void ddl_req_describe(const struct ddl_request_s *r, char *out, size_t n);

/* Counters (ddl_async_stats, ddl_negotiation_stats), updated atomically. */
extern uint64_t ddl_stat_fused_buffers, ddl_stat_fused_requests, ddl_stat_full_cycles,
    ddl_stat_names;

/* ---- names.c: hashing names, and an open-addressing map (name -> value) ---- */

uint64_t ddl_mix64(uint64_t x);
uint64_t ddl_name_hash(const char *s);
typedef struct {
    uint64_t hash;
    const char *name; /* NULL: empty; the map does not own it */
    size_t val;
} ddl_nm_entry_t;
typedef struct {
    ddl_nm_entry_t *e;
    size_t cap, n; /* cap is 0 or a power of two, at most half full */
} ddl_namemap_t;
ddl_nm_entry_t *ddl_nm_find(const ddl_namemap_t *m, const char *name, uint64_t h);
int ddl_nm_put(ddl_namemap_t *m, const char *name, uint64_t h, size_t val); /* -1: no memory */
void ddl_nm_del(ddl_namemap_t *m, ddl_nm_entry_t *e);
void ddl_nm_free(ddl_namemap_t *m);

/* ---- negotiate.c ---- */

typedef struct {
    struct ddl_request_s **v;
    size_t n, cap;
} ddl_reqvec_t;
int ddl_reqvec_push(ddl_reqvec_t *v, struct ddl_request_s *r); /* -1: no memory */

/* Every rank's progress thread calls this once per cycle with what it has queued (in
 * submission order): `batch` receives the requests every rank has and runs now, in the
 * order all ranks share; `stalled` this rank's requests some rank did not submit within
 * DDL_TIMEOUT, their message in r->error; *more whether some rank keeps requests queued. */
ddl_status_t ddl_negotiate(const ddl_reqvec_t *snap, ddl_reqvec_t *batch, ddl_reqvec_t *stalled,
                           int *more);
/* The tag of the doorbell a folded rank's partner rings (negotiate.c), which an idle
 * progress thread looks out for with DDL_TAG_RD. */
enum { DDL_TAG_BELL = 401 };
/* Free a joined rank's stand-in request (r->synthetic) once its batch ran. */
void ddl_req_free_synthetic(struct ddl_request_s *r);
/* Forget the table of names (at ddl_finalize). */
void ddl_negotiate_free(void);

/* ---- batch.c ---- */

/* Run a batch (the same requests, in the same order, on every rank), completing each. */
void ddl_run_batch(struct ddl_request_s **reqs, size_t n);

#endif

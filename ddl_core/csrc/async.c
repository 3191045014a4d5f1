/* Asynchronous collectives: a queue, a progress thread, negotiation and tensor fusion.
 *
 * Requests are executed by one progress thread in submission order on the progress
 * context's own communicators, so communication overlaps the application's computation.
 * Fusion must group the same requests on every rank, and what is queued when the thread
 * wakes depends on timing, so each cycle starts with a negotiation (as Horovod's
 * coordinator does): a checked recursive doubling of the number of queued requests with
 * op min; the first `min` requests, which every rank has, form the batch. Consecutive
 * allreduces of one dtype and op in the batch are packed into one fusion buffer of at most
 * DDL_FUSION_THRESHOLD bytes, reduced once and unpacked. Element-wise reduction makes the
 * fused result identical to separate calls whenever the sum is exact (integers, or
 * floats on two ranks); with more ranks a float sum may round differently because a
 * different algorithm or block boundary changes the order of the additions, as with
 * Horovod and NCCL fusion. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl_internal.h"

enum { REQ_ALLREDUCE, REQ_BROADCAST, REQ_ALLGATHER, REQ_REDUCE_SCATTER };

struct ddl_request_s {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ddl_dtype_t dtype;
    ddl_op_t op;
    int root;
    double timeout; /* the submitting thread's deadline (0: DDL_TIMEOUT) */
    int done; /* written under q.lock, read atomically */
    ddl_status_t status;
    char error[512];
    struct ddl_request_s *next;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;  /* the progress thread waits here */
    pthread_cond_t done;  /* waiters on requests wait here */
    struct ddl_request_s *head, *tail;
    size_t queued;
    size_t queued_bytes;
    double first_arrival;
    int stop;
    int running;
    pthread_t thread;
} q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
       NULL, NULL, 0, 0, 0.0, 0, 0, 0};

static uint64_t stat_batches, stat_fused_buffers, stat_fused_requests;

ddl_status_t ddl_async_stats(uint64_t *batches, uint64_t *fused_buffers,
                             uint64_t *fused_requests) {
    DDL_CHECK(ddl_require_init());
    *batches = __atomic_load_n(&stat_batches, __ATOMIC_RELAXED);
    *fused_buffers = __atomic_load_n(&stat_fused_buffers, __ATOMIC_RELAXED);
    *fused_requests = __atomic_load_n(&stat_fused_requests, __ATOMIC_RELAXED);
    return DDL_SUCCESS;
}

static size_t req_bytes(const struct ddl_request_s *r) {
    return r->count * ddl_dtype_size(r->dtype);
}

static void complete(struct ddl_request_s *r, ddl_status_t st) {
    pthread_mutex_lock(&q.lock);
    r->status = st;
    if (st != DDL_SUCCESS) snprintf(r->error, sizeof r->error, "%s", ddl_last_error());
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&q.done);
    pthread_mutex_unlock(&q.lock);
}

static ddl_status_t run_one(struct ddl_request_s *r) {
    ddl_ctx_t *ctx = &ddl_g.progress;
    switch (r->kind) {
    case REQ_ALLREDUCE:
        return ddl_allreduce_ctx(ctx, r->send, r->recv, r->count, r->dtype, r->op,
                                 ddl_signature(DDL_COLL_ALLREDUCE, r->count, r->dtype, r->op, 0));
    case REQ_BROADCAST: return ddl_broadcast_ctx(ctx, r->recv, r->count, r->dtype, r->root);
    case REQ_ALLGATHER: return ddl_allgather_ctx(ctx, r->send, r->recv, r->count, r->dtype);
    case REQ_REDUCE_SCATTER:
        return ddl_reduce_scatter_ctx(ctx, r->send, r->recv, r->count, r->dtype, r->op);
    default: return ddl_fail(DDL_ERR_INTERNAL, "unknown request kind %d", r->kind);
    }
}

/* Run requests [first, first+n) of a batch as one fused allreduce. */
static void run_fused(struct ddl_request_s **reqs, size_t n) {
    size_t es = ddl_dtype_size(reqs[0]->dtype), total = 0;
    uint64_t sig = ddl_signature(DDL_COLL_FUSED, n, reqs[0]->dtype, reqs[0]->op, 0);
    for (size_t i = 0; i < n; i++) {
        total += reqs[i]->count;
        sig = ddl_signature(DDL_COLL_FUSED, reqs[i]->count, 0, 0, (int)(sig & 0x7fffffff)) ^ sig;
    }
    __atomic_add_fetch(&stat_fused_buffers, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&stat_fused_requests, n, __ATOMIC_RELAXED);
    char *buf = ddl_scratch(4, total * es);
    ddl_status_t st = DDL_SUCCESS;
    if (!buf) st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a %zu-byte fusion buffer", total * es);
    if (st == DDL_SUCCESS) {
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            const void *src = reqs[i]->send == DDL_IN_PLACE ? reqs[i]->recv : reqs[i]->send;
            memcpy(buf + off, src, req_bytes(reqs[i]));
            off += req_bytes(reqs[i]);
        }
        st = ddl_allreduce_ctx(&ddl_g.progress, buf, buf, total, reqs[0]->dtype, reqs[0]->op, sig);
        if (st == DDL_SUCCESS) {
            off = 0;
            for (size_t i = 0; i < n; i++) {
                memcpy(reqs[i]->recv, buf + off, req_bytes(reqs[i]));
                off += req_bytes(reqs[i]);
            }
        }
    }
    for (size_t i = 0; i < n; i++) complete(reqs[i], st);
}

static int fusable(const struct ddl_request_s *a, const struct ddl_request_s *b) {
    return a->kind == REQ_ALLREDUCE && b->kind == REQ_ALLREDUCE && a->dtype == b->dtype &&
           a->op == b->op && a->timeout == b->timeout;
}

static void run_batch(struct ddl_request_s **reqs, size_t n) {
    for (size_t i = 0; i < n;) {
        struct ddl_request_s *r = reqs[i];
        size_t j = i + 1, bytes = req_bytes(r);
        if (r->kind == REQ_ALLREDUCE && bytes < ddl_g.fusion_threshold) {
            while (j < n && fusable(r, reqs[j]) &&
                   bytes + req_bytes(reqs[j]) <= ddl_g.fusion_threshold) {
                bytes += req_bytes(reqs[j]);
                j++;
            }
        }
        ddl_set_thread_timeout(r->timeout); /* the deadline it was submitted with */
        if (j - i > 1)
            run_fused(reqs + i, j - i);
        else
            complete(r, run_one(r));
        i = j;
    }
}

static void sleep_until(double t) {
    double d = t - ddl_now();
    if (d <= 0) return;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *progress_main(void *arg) {
    (void)arg;
    struct ddl_request_s **batch = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&q.lock);
        while (!q.stop && q.queued == 0) pthread_cond_wait(&q.work, &q.lock);
        if (q.queued == 0 && q.stop) {
            pthread_mutex_unlock(&q.lock);
            break;
        }
        double start = q.first_arrival;
        int full = q.queued_bytes >= ddl_g.fusion_threshold;
        pthread_mutex_unlock(&q.lock);
        /* Give requests submitted close together the cycle time to join the batch. */
        if (!full) sleep_until(start + ddl_g.cycle_time_s);

        pthread_mutex_lock(&q.lock);
        int64_t mine = (int64_t)q.queued;
        ddl_set_thread_timeout(q.head->timeout);
        pthread_mutex_unlock(&q.lock);
        ddl_coll_begin(&ddl_g.progress, "negotiation", 0);
        ddl_header_t h;
        ddl_header_init(&h, ddl_signature(DDL_COLL_NEGOTIATE, 1, DDL_INT64, DDL_MIN, 0), 1);
        int64_t agreed = mine;
        ddl_status_t st = ddl_rd_allreduce_checked(&ddl_g.progress.world, &h, &agreed, 1,
                                                   DDL_INT64, DDL_MIN);
        if (st == DDL_SUCCESS) st = ddl_header_verdict(&h, "asynchronous negotiation");
        if (st == DDL_SUCCESS && agreed <= 0) continue; /* a rank left before us */

        size_t n = st == DDL_SUCCESS ? (size_t)agreed : (size_t)mine;
        if (n > cap) {
            struct ddl_request_s **nb = realloc(batch, n * sizeof *nb);
            if (!nb) abort();
            batch = nb;
            cap = n;
        }
        pthread_mutex_lock(&q.lock);
        for (size_t i = 0; i < n; i++) {
            batch[i] = q.head;
            q.head = q.head->next;
            q.queued--;
            q.queued_bytes -= req_bytes(batch[i]);
        }
        if (!q.head) q.tail = NULL;
        q.first_arrival = ddl_now();
        pthread_mutex_unlock(&q.lock);
        if (st != DDL_SUCCESS) {
            for (size_t i = 0; i < n; i++) complete(batch[i], st);
            continue;
        }
        __atomic_add_fetch(&stat_batches, 1, __ATOMIC_RELAXED);
        run_batch(batch, n);
    }
    free(batch);
    return NULL;
}

ddl_status_t ddl_progress_start(void) {
    q.stop = 0;
    if (pthread_create(&q.thread, NULL, progress_main, NULL) != 0)
        return ddl_fail(DDL_ERR_INTERNAL, "cannot start the progress thread");
    q.running = 1;
    return DDL_SUCCESS;
}

ddl_status_t ddl_progress_stop(void) {
    if (!q.running) return DDL_SUCCESS;
    pthread_mutex_lock(&q.lock);
    q.stop = 1;
    pthread_cond_broadcast(&q.work);
    pthread_mutex_unlock(&q.lock);
    pthread_join(q.thread, NULL);
    q.running = 0;
    return DDL_SUCCESS;
}

static ddl_status_t submit(int kind, const void *send, void *recv, size_t count,
                           ddl_dtype_t dtype, int op, int root, ddl_request_t *out, const char *fn) {
    DDL_CHECK(ddl_require_init());
    if (!out) return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL request pointer", fn);
    if (!q.running)
        return ddl_fail(DDL_ERR_UNSUPPORTED,
                        "%s: asynchronous collectives need MPI initialized with "
                        "MPI_THREAD_MULTIPLE; let ddl_init() initialize MPI",
                        fn);
    if (!ddl_dtype_valid((int)dtype))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, (int)dtype);
    if (op >= 0 && !ddl_op_valid(op))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: unknown op %d", fn, op);
    if (count && !recv) return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer", fn);
    if (kind == REQ_BROADCAST && (root < 0 || root >= ddl_g.size))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: root %d is not a rank (0..%d)", fn, root,
                        ddl_g.size - 1);
    struct ddl_request_s *r = calloc(1, sizeof *r);
    if (!r) return ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory for a request", fn);
    r->kind = kind;
    r->send = send ? send : DDL_IN_PLACE;
    r->recv = recv;
    r->count = count;
    r->dtype = dtype;
    r->op = op >= 0 ? (ddl_op_t)op : DDL_SUM;
    r->root = root;
    r->timeout = ddl_thread_timeout();
    pthread_mutex_lock(&q.lock);
    if (q.queued == 0) q.first_arrival = ddl_now();
    if (q.tail)
        q.tail->next = r;
    else
        q.head = r;
    q.tail = r;
    q.queued++;
    q.queued_bytes += req_bytes(r);
    pthread_cond_signal(&q.work);
    pthread_mutex_unlock(&q.lock);
    *out = r;
    return DDL_SUCCESS;
}

ddl_status_t ddl_iallreduce(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype,
                            ddl_op_t op, ddl_request_t *req) {
    return submit(REQ_ALLREDUCE, sendbuf, recvbuf, count, dtype, (int)op, 0, req, "ddl_iallreduce");
}

ddl_status_t ddl_ibroadcast(void *buf, size_t count, ddl_dtype_t dtype, int root,
                            ddl_request_t *req) {
    return submit(REQ_BROADCAST, DDL_IN_PLACE, buf, count, dtype, -1, root, req, "ddl_ibroadcast");
}

ddl_status_t ddl_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                            ddl_dtype_t dtype, ddl_request_t *req) {
    return submit(REQ_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, -1, 0, req,
                  "ddl_iallgather");
}

ddl_status_t ddl_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                 ddl_dtype_t dtype, ddl_op_t op, ddl_request_t *req) {
    return submit(REQ_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, (int)op, 0, req,
                  "ddl_ireduce_scatter");
}

static ddl_status_t finish(ddl_request_t req) {
    if (req->status != DDL_SUCCESS) return ddl_fail_verbatim(req->status, req->error);
    return DDL_SUCCESS;
}

ddl_status_t ddl_test(ddl_request_t req, int *done) {
    if (!req || !done) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_test: NULL argument");
    *done = __atomic_load_n(&req->done, __ATOMIC_ACQUIRE);
    return *done ? finish(req) : DDL_SUCCESS;
}

ddl_status_t ddl_wait(ddl_request_t req) {
    if (!req) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_wait: NULL request");
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&q.lock);
        while (!req->done) pthread_cond_wait(&q.done, &q.lock);
        pthread_mutex_unlock(&q.lock);
    }
    return finish(req);
}

void ddl_request_free(ddl_request_t req) {
    if (!req) return;
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) && q.running) (void)ddl_wait(req);
    free(req);
}

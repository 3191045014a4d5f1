/* Asynchronous collectives: the queue, submission, and the progress thread.
 *
 * Requests are executed by one progress thread on the progress context's own
 * communicators, so communication overlaps the application's computation. Each cycle the
 * thread takes what this rank has queued, agrees with the other ranks on what runs
 * (negotiate.c: unnamed requests by order, named ones by name, as Horovod does) and runs
 * that batch (batch.c: fusion; a mismatch fails the request that differs on every rank
 * and leaves nothing queued).
 *
 * A rank with requests queued negotiates every cycle time (DDL_CYCLE_TIME_MS), which lets
 * requests submitted close together join one batch. A thread that waits for a request
 * (ddl_wait) can submit nothing more meanwhile, so it negotiates and runs the batch itself
 * when no other thread is at it: the communicators are claimed by one thread at a time
 * (engine.cycling), and the progress thread is woken at submission only when it would
 * otherwise look too late. The hand-off to the progress thread and back cost a 1 MiB
 * allreduce ~35 us of ~200. A progress thread with nothing
 * queued sleeps, looking now and then (20 us to 50 ms apart) whether a peer has started a
 * negotiation (its first message is waiting), and joins it with nothing: so ranks waiting
 * for a request an idle rank never submitted hear of it after DDL_TIMEOUT, rather than
 * waiting for an answer that never comes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "async_internal.h"

const char *const ddl_kind_name[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                     "allgatherv", "join"};
const char *const ddl_kind_word[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                     "allgather", "join"};
static const int KIND_COLL[] = {DDL_COLL_ALLREDUCE, DDL_COLL_BROADCAST, DDL_COLL_ALLGATHER,
                                DDL_COLL_REDUCE_SCATTER, DDL_COLL_ALLGATHERV, DDL_COLL_BARRIER};

#define MAX_DIMS 32         /* longest shape a request may carry */
#define MAX_NAME 1024       /* longest name, in bytes */
#define IDLE_MAX_S 0.05     /* longest pause between an idle thread's looks at its peers */
#define RECENT_S 1.0        /* requests this recent keep an idle thread looking each cycle */
#define CYCLE_LOOK_MIN_S 1e-4 /* shorter cycle times: submit wakes the thread instead */

/* ---- the engines ----------------------------------------------------------------------- */

/* The world communicator's engine (started by ddl_init), and every live engine in a list
 * for ddl_progress_hurry and the statistics. */
static ddl_engine_t world_engine = {.lock = PTHREAD_MUTEX_INITIALIZER,
                                    .work = PTHREAD_COND_INITIALIZER,
                                    .done = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t engines_lock = PTHREAD_MUTEX_INITIALIZER;
static ddl_engine_t *engines;

static uint64_t stat_batches, stat_cycles, stat_waiter_cycles;
uint64_t ddl_stat_fused_buffers, ddl_stat_fused_requests, ddl_stat_full_cycles, ddl_stat_names;

ddl_status_t ddl_async_stats(uint64_t *batches, uint64_t *fused_buffers,
                             uint64_t *fused_requests) {
    DDL_CHECK(ddl_require_init());
    *batches = __atomic_load_n(&stat_batches, __ATOMIC_RELAXED);
    *fused_buffers = __atomic_load_n(&ddl_stat_fused_buffers, __ATOMIC_RELAXED);
    *fused_requests = __atomic_load_n(&ddl_stat_fused_requests, __ATOMIC_RELAXED);
    return DDL_SUCCESS;
}

ddl_status_t ddl_waiter_stats(uint64_t *cycles) {
    DDL_CHECK(ddl_require_init());
    if (!cycles) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_waiter_stats: NULL argument");
    *cycles = __atomic_load_n(&stat_waiter_cycles, __ATOMIC_RELAXED);
    return DDL_SUCCESS;
}

ddl_status_t ddl_negotiation_stats(uint64_t *cycles, uint64_t *full_cycles, uint64_t *names,
                                   uint64_t *pending) {
    DDL_CHECK(ddl_require_init());
    if (!cycles || !full_cycles || !names || !pending)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_negotiation_stats: NULL argument");
    *cycles = __atomic_load_n(&stat_cycles, __ATOMIC_RELAXED);
    *full_cycles = __atomic_load_n(&ddl_stat_full_cycles, __ATOMIC_RELAXED);
    *names = __atomic_load_n(&ddl_stat_names, __ATOMIC_RELAXED);
    *pending = 0;
    pthread_mutex_lock(&engines_lock);
    for (ddl_engine_t *e = engines; e; e = e->next_engine) {
        pthread_mutex_lock(&e->lock);
        *pending += e->pending;
        pthread_mutex_unlock(&e->lock);
    }
    pthread_mutex_unlock(&engines_lock);
    return DDL_SUCCESS;
}

/* Finish a request with `st`; `msg` (or this thread's last error) explains a failure. */
void ddl_req_finish(struct ddl_request_s *r, ddl_status_t st, const char *msg) {
    ddl_engine_t *e = r->eng;
    pthread_mutex_lock(&e->lock);
    r->status = st;
    if (st != DDL_SUCCESS) snprintf(r->error, sizeof r->error, "%s", msg ? msg : ddl_last_error());
    if (r->name) {
        ddl_nm_entry_t *ent = ddl_nm_find(&e->inflight, r->name, r->hash);
        if (ent && ent->val == (size_t)(uintptr_t)r) ddl_nm_del(&e->inflight, ent);
    }
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&e->done);
    pthread_mutex_unlock(&e->lock);
}

static void complete(struct ddl_request_s *r, ddl_status_t st) { ddl_req_finish(r, st, NULL); }

/* Take a request out of the pending list (under e->lock). */
static void unlink_locked(ddl_engine_t *e, struct ddl_request_s *r) {
    if (r->prev) r->prev->next = r->next; else e->head = r->next;
    if (r->next) r->next->prev = r->prev; else e->tail = r->prev;
    r->prev = r->next = NULL;
    e->pending--;
}

/* Whether a request is still in the pending list (under e->lock): not yet taken into a
 * batch. */
static int queued_locked(const ddl_engine_t *e, const struct ddl_request_s *r) {
    return r->prev != NULL || e->head == r;
}

/* How a request describes itself in messages: "allreduce 'grad.fc1'" or "unnamed
 * allreduce #3". */
void ddl_req_describe(const struct ddl_request_s *r, char *out, size_t n) {
    if (r->name)
        snprintf(out, n, "%s '%.200s'", ddl_kind_word[r->kind], r->name);
    else
        snprintf(out, n, "unnamed %s #%llu (unnamed requests are matched by submission order)",
                 ddl_kind_word[r->kind], (unsigned long long)r->seq + 1);
}

/* Wait on e->work (e->lock held) for at most `seconds`, or until signalled. */
static void timed_wait(ddl_engine_t *e, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + seconds;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&e->work, &e->lock, &ts); /* (a timeout is the point) */
}

/* The cycle time: requests submitted close together join one batch. The wait ends
 * early when the fusion buffer is full or when an application thread blocks on a queued
 * request (ddl_progress_hurry): it can submit nothing more meanwhile, so waiting out the
 * cycle would only add latency (a blocking torch all_reduce paid 1 ms for 4 KiB). */
static void cycle_wait(ddl_engine_t *e, double wake) {
    pthread_mutex_lock(&e->lock);
    while (!e->hurry && !e->stop && !(e->fresh && e->fresh_bytes >= ddl_g.fusion_threshold)) {
        double d = wake - ddl_now();
        if (d <= 0) break;
        timed_wait(e, d);
    }
    pthread_mutex_unlock(&e->lock);
}

void ddl_progress_hurry(void) {
    pthread_mutex_lock(&engines_lock);
    for (ddl_engine_t *e = engines; e; e = e->next_engine) {
        pthread_mutex_lock(&e->lock);
        if (e->pending) {
            e->hurry = 1;
            pthread_cond_broadcast(&e->work);
        }
        pthread_mutex_unlock(&e->lock);
    }
    pthread_mutex_unlock(&engines_lock);
}

/* Whether a peer has started a negotiation this rank has not joined: its first message
 * (a recursive-doubling step, or the doorbell of a folded pair) is waiting here. Only
 * called while this rank has nothing running on the progress communicators, so any such
 * message belongs to a new negotiation. */
static int peer_negotiating(ddl_engine_t *e) {
    const ddl_mpicomm_t *c = &e->ctx->world;
    int tags[2] = {DDL_TAG_RD, DDL_TAG_BELL};
    for (int i = 0; i < 2; i++) {
        int flag = 0;
        if (MPI_Iprobe(MPI_ANY_SOURCE, tags[i], c->comm, &flag, MPI_STATUS_IGNORE) ==
                MPI_SUCCESS && flag)
            return 1;
    }
    return 0;
}

/* One cycle: take what this rank has queued, agree with the other ranks on what runs, run
 * it. The caller has claimed e->cycling (the progress context's communicators are used by
 * one thread at a time) and holds no lock. */
static void run_cycle(ddl_engine_t *e) {
    ddl_cycle_bufs_t *b = &e->bufs;
    pthread_mutex_lock(&e->lock);
    b->snap.n = 0;
    int oom = 0;
    for (struct ddl_request_s *r = e->head; r; r = r->next) oom |= ddl_reqvec_push(&b->snap, r);
    e->fresh = 0;
    e->fresh_bytes = 0;
    e->hurry = 0;
    e->last_cycle = ddl_now(); /* (engine fields change under e->lock: the idle progress
                                * thread reads them while a waiter cycles) */
    pthread_mutex_unlock(&e->lock);
    __atomic_add_fetch(&stat_cycles, 1, __ATOMIC_RELAXED);
    b->batch.n = b->stalled.n = 0;
    /* The negotiation waits with the deadline of the oldest request (DDL_TIMEOUT when
     * only joining), and counts as a collective of the progress context for messages. */
    ddl_set_thread_timeout(b->snap.n ? b->snap.v[0]->timeout : 0);
    ddl_coll_begin(e->ctx, "negotiation", 0);
    int more = 0;
    ddl_status_t st = oom ? ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the queue")
                          : ddl_negotiate(e, &b->snap, &b->batch, &b->stalled, &more);
    if (st != DDL_SUCCESS) { /* no agreement: fail everything this rank has queued */
        pthread_mutex_lock(&e->lock);
        e->more = 0;
        for (size_t i = 0; i < b->snap.n; i++) unlink_locked(e, b->snap.v[i]);
        pthread_mutex_unlock(&e->lock);
        for (size_t i = 0; i < b->snap.n; i++) complete(b->snap.v[i], st);
        return;
    }
    double agreed = ddl_now();
    pthread_mutex_lock(&e->lock);
    e->more = more;
    for (size_t i = 0; i < b->batch.n; i++) {
        b->batch.v[i]->t_negotiated = agreed;
        if (!b->batch.v[i]->synthetic) unlink_locked(e, b->batch.v[i]);
    }
    for (size_t i = 0; i < b->stalled.n; i++) unlink_locked(e, b->stalled.v[i]);
    pthread_mutex_unlock(&e->lock);
    for (size_t i = 0; i < b->stalled.n; i++) {
        char msg[sizeof b->stalled.v[i]->error];
        memcpy(msg, b->stalled.v[i]->error, sizeof msg);
        ddl_req_finish(b->stalled.v[i], DDL_ERR_TIMEOUT, msg);
    }
    if (b->batch.n) {
        __atomic_add_fetch(&stat_batches, 1, __ATOMIC_RELAXED);
        /* A joined rank's stand-ins are all or nothing of a batch (negotiate.c); note
         * it now: the others may be freed by their owners as soon as they complete. */
        int stand_ins = b->batch.v[0]->synthetic;
        ddl_run_batch(b->batch.v, b->batch.n);
        for (size_t i = 0; stand_ins && i < b->batch.n; i++)
            ddl_req_free_synthetic(b->batch.v[i]);
    }
}

/* Give the claim back (under e->lock): a progress thread waiting for it looks again. */
static void release_locked(ddl_engine_t *e) {
    e->cycling = 0;
    if (e->claim_waiters) pthread_cond_broadcast(&e->work);
}

static void *progress_main(void *arg) {
    ddl_engine_t *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->lock);
        /* Idle: sleep until a request arrives, looking now and then whether a peer has
         * started a negotiation (its first message is waiting here), which happens when
         * it waits for a request this rank has not submitted: joining it (with nothing)
         * lets that rank learn, after DDL_TIMEOUT at the latest, what this one never
         * submitted, instead of waiting for an answer that never comes. Looks come every
         * 1 ms at first, every 20 us when the last negotiation left requests queued
         * somewhere (a peer is likely to start the next one soon), and twice as far apart
         * each time, up to IDLE_MAX_S. Only ranks with requests queued start negotiations,
         * so an idle rank costs the others nothing and spends next to no CPU. A look
         * claims the communicators like a cycle, and is skipped while a waiter cycles. */
        int joining = 0;
        double interval = e->more ? 20e-6 : 1e-3;
        while (!e->stop && e->pending == 0) {
            double now = ddl_now(), sleep = interval;
            /* While requests come (one in the last RECENT_S), look at least every cycle
             * time: a request submitted meanwhile is then seen in time without the
             * submitting thread waking this one (submit). */
            if (now - e->last_submit < RECENT_S && sleep > ddl_g.cycle_time_s &&
                ddl_g.cycle_time_s >= CYCLE_LOOK_MIN_S)
                sleep = ddl_g.cycle_time_s;
            double until = now + sleep;
            e->idle_until = until;
            timed_wait(e, sleep);
            if (e->pending || e->stop || e->cycling || ddl_now() < until) continue;
            if (e->ctx->world.size == 1) { /* no peer to look for */
                interval = interval * 2 < IDLE_MAX_S ? interval * 2 : IDLE_MAX_S;
                continue;
            }
            e->cycling = 1;
            pthread_mutex_unlock(&e->lock);
            joining = peer_negotiating(e);
            pthread_mutex_lock(&e->lock);
            if (joining) break; /* (keeping the claim for the cycle) */
            release_locked(e);
            interval = interval * 2 < IDLE_MAX_S ? interval * 2 : IDLE_MAX_S;
        }
        e->idle_until = 0;
        if (e->pending == 0 && !joining) { /* stopping */
            pthread_mutex_unlock(&e->lock);
            break;
        }
        if (!joining) {
            /* Give requests submitted close together the cycle time to join the batch;
             * when only requests other ranks have not submitted yet are left, look again
             * a cycle time after the last look. */
            double wake = (e->fresh ? e->first_fresh : e->last_cycle) + ddl_g.cycle_time_s;
            int full = e->hurry || (e->fresh && e->fresh_bytes >= ddl_g.fusion_threshold);
            pthread_mutex_unlock(&e->lock);
            if (!full) cycle_wait(e, wake);
            pthread_mutex_lock(&e->lock);
            if (e->cycling || e->pending == 0) {
                /* A waiter runs the cycle itself (ddl_wait); look again once it is done. */
                e->claim_waiters++;
                while (e->cycling) pthread_cond_wait(&e->work, &e->lock);
                e->claim_waiters--;
                pthread_mutex_unlock(&e->lock);
                continue;
            }
            e->cycling = 1;
        }
        pthread_mutex_unlock(&e->lock);
        run_cycle(e);
        pthread_mutex_lock(&e->lock);
        release_locked(e);
        pthread_mutex_unlock(&e->lock);
    }
    return NULL;
}

static ddl_status_t engine_start(ddl_engine_t *e, ddl_ctx_t *ctx) {
    e->ctx = ctx;
    e->stop = 0;
    if (pthread_create(&e->thread, NULL, progress_main, e) != 0)
        return ddl_fail(DDL_ERR_INTERNAL, "cannot start a progress thread");
    e->running = 1;
    pthread_mutex_lock(&engines_lock);
    e->next_engine = engines;
    engines = e;
    pthread_mutex_unlock(&engines_lock);
    return DDL_SUCCESS;
}

/* Stop after what is queued has run (or failed at its deadline), then forget the names. */
static void engine_stop(ddl_engine_t *e) {
    if (!e->running) return;
    pthread_mutex_lock(&engines_lock);
    for (ddl_engine_t **pp = &engines; *pp; pp = &(*pp)->next_engine)
        if (*pp == e) {
            *pp = e->next_engine;
            break;
        }
    pthread_mutex_unlock(&engines_lock);
    pthread_mutex_lock(&e->lock);
    e->stop = 1;
    pthread_cond_broadcast(&e->work);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->thread, NULL);
    e->running = 0;
    free(e->bufs.snap.v);
    free(e->bufs.batch.v);
    free(e->bufs.stalled.v);
    memset(&e->bufs, 0, sizeof e->bufs);
    ddl_negotiate_free(e);
    ddl_nm_free(&e->inflight);
}

ddl_status_t ddl_progress_start(void) { return engine_start(&world_engine, &ddl_g.progress); }

/* Every engine, the sub-communicators' too: a progress thread left running looks at its
 * communicator after MPI_Finalize, a fatal MPI error at exit for a program that never
 * freed a split communicator. */
ddl_status_t ddl_progress_stop(void) {
    for (;;) {
        pthread_mutex_lock(&engines_lock);
        ddl_engine_t *e = engines;
        pthread_mutex_unlock(&engines_lock);
        if (!e) break;
        engine_stop(e);
    }
    return DDL_SUCCESS;
}

int ddl_progress_running(void) { return world_engine.running; }

ddl_status_t ddl_engine_create(ddl_ctx_t *ctx, ddl_engine_t **out) {
    *out = NULL;
    ddl_engine_t *e = calloc(1, sizeof *e);
    if (!e) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a communicator's queue");
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->done, NULL);
    ddl_status_t st = engine_start(e, ctx);
    if (st != DDL_SUCCESS) {
        ddl_engine_destroy(e);
        return st;
    }
    *out = e;
    return DDL_SUCCESS;
}

void ddl_engine_destroy(ddl_engine_t *e) {
    if (!e) return;
    engine_stop(e);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->done);
    free(e);
}

/* ---- submission -------------------------------------------------------------------------- */

/* The signature every rank's request must share: the collective, count, dtype, op, root
 * and, when given, the shape (allgather: all dimensions but the first; allgatherv: its
 * count too may differ). */
static uint64_t request_sig(int kind, size_t count, ddl_dtype_t dtype, ddl_op_t op, int root,
                            int ndim, const int64_t *shape) {
    int gather = kind == REQ_ALLGATHER || kind == REQ_ALLGATHERV;
    uint64_t s = ddl_signature(KIND_COLL[kind], kind == REQ_ALLGATHERV ? 0 : count, dtype,
                               kind == REQ_ALLREDUCE || kind == REQ_REDUCE_SCATTER ? op : 0,
                               kind == REQ_BROADCAST ? root : 0);
    if (ndim < 0) return s;
    s = ddl_mix64(s ^ (0x5348415045ULL + (uint64_t)ndim)); /* "SHAPE" */
    for (int i = gather ? 1 : 0; i < ndim; i++) s = ddl_mix64(s ^ (uint64_t)shape[i]);
    return s;
}

static ddl_status_t submit(ddl_engine_t *e, int kind, const void *send, void *recv, size_t count,
                           ddl_dtype_t dtype, int op, int root, const ddl_match_t *match,
                           ddl_request_t *out, const char *fn) {
    DDL_CHECK(ddl_require_init());
    if (!out) return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL request pointer", fn);
    if (!e || !e->running)
        return ddl_fail(DDL_ERR_UNSUPPORTED,
                        "%s: asynchronous collectives need MPI initialized with "
                        "MPI_THREAD_MULTIPLE; let ddl_init() initialize MPI",
                        fn);
    if (!ddl_dtype_valid((int)dtype))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, (int)dtype);
    DDL_CHECK(ddl_check_op((int)dtype, op, fn));
    if (count && !(kind == REQ_ALLGATHERV ? send : recv))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer", fn);
    int size = e->ctx->world.size;
    if (kind == REQ_BROADCAST && (root < 0 || root >= size))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: root %d is not a rank (0..%d)", fn, root,
                        size - 1);
    const char *name = match && match->name && *match->name ? match->name : NULL;
    size_t namelen = name ? strlen(name) : 0;
    if (namelen > MAX_NAME)
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: the name is %zu bytes long (at most %d)", fn,
                        namelen, MAX_NAME);
    int ndim = match && (match->ndim > 0 || match->shape) ? match->ndim : -1;
    if (ndim > MAX_DIMS || (ndim > 0 && !match->shape))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: a shape of %d dimensions%s (at most %d)", fn,
                        ndim, ndim > 0 && !match->shape ? " without dimensions" : "", MAX_DIMS);
    if (ndim >= 0) {
        /* The shape describes the tensor: the input of a reduce_scatter (size x count
         * elements), the buffer of the others. */
        size_t want = kind == REQ_REDUCE_SCATTER ? count * (size_t)size : count, have = 1;
        for (int i = 0; i < ndim; i++) {
            if (match->shape[i] < 0)
                return ddl_fail(DDL_ERR_INVALID_ARG, "%s: dimension %d of the shape is negative "
                                                     "(%lld)", fn, i, (long long)match->shape[i]);
            have *= (size_t)match->shape[i];
        }
        if (have != want)
            return ddl_fail(DDL_ERR_INVALID_ARG, "%s: the shape holds %zu elements but the "
                                                 "buffer %zu", fn, have, want);
    }
    size_t extra = (ndim > 0 ? (size_t)ndim * sizeof(int64_t) : 0) + (name ? namelen + 1 : 0);
    struct ddl_request_s *r = calloc(1, sizeof *r + extra);
    if (!r) return ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory for a request", fn);
    char *tail = (char *)(r + 1);
    if (ndim > 0) {
        memcpy(tail, match->shape, (size_t)ndim * sizeof(int64_t));
        r->shape = (const int64_t *)(void *)tail;
        tail += (size_t)ndim * sizeof(int64_t);
    }
    if (name) {
        memcpy(tail, name, namelen + 1);
        r->name = tail;
        r->hash = ddl_name_hash(tail);
    }
    r->eng = e;
    r->kind = kind;
    r->send = send ? send : DDL_IN_PLACE;
    r->recv = recv;
    r->count = count;
    r->dtype = dtype;
    r->op = op >= 0 ? (ddl_op_t)op : DDL_SUM;
    r->root = root;
    r->ndim = ndim;
    r->sig = request_sig(kind, count, dtype, r->op, root, ndim, r->shape);
    r->submitted = ddl_now();
    r->timeout = ddl_thread_timeout();
    pthread_mutex_lock(&e->lock);
    if (name) {
        if (ddl_nm_find(&e->inflight, r->name, r->hash)) {
            pthread_mutex_unlock(&e->lock);
            free(r);
            return ddl_fail(DDL_ERR_INVALID_ARG,
                            "%s: a request named '%.200s' is already in flight on this rank "
                            "(submitted and not complete): a name identifies one request at a "
                            "time, so wait for the first one or give this one another name",
                            fn, name);
        }
        if (ddl_nm_put(&e->inflight, r->name, r->hash, (size_t)(uintptr_t)r) != 0) {
            pthread_mutex_unlock(&e->lock);
            free(r);
            return ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory for a request", fn);
        }
    } else {
        r->seq = e->unnamed_seq++;
    }
    if (e->fresh == 0) e->first_fresh = r->submitted;
    r->prev = e->tail;
    if (e->tail)
        e->tail->next = r;
    else
        e->head = r;
    e->tail = r;
    e->pending++;
    e->fresh++;
    e->fresh_bytes += ddl_req_bytes(r);
    e->last_submit = r->submitted;
    /* Wake the progress thread only when it would otherwise look too late: asleep while
     * idle past the moment this batch should be negotiated (the first fresh request's
     * submission plus the cycle time), or the fusion buffer is full. Otherwise it sees
     * the request in time on its own, and this thread does not pay for the wake-up (nor,
     * on a busy node, a peer for the core it takes): ~20 us of a small request. */
    if ((e->idle_until > 0 && e->idle_until > e->first_fresh + ddl_g.cycle_time_s) ||
        e->fresh_bytes >= ddl_g.fusion_threshold)
        pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->lock);
    *out = r;
    return DDL_SUCCESS;
}

/* ---- on a communicator: its own engine (the world's: world_engine; world.c) ------------ */

/* Submit to a communicator's engine, after ddl_comm_enter's checks (live, a member); the
 * communicator's timeout becomes the request's deadline. (A communicator made while MPI
 * lacked MPI_THREAD_MULTIPLE has no engine: submit says so.) */
#define COMM_SUBMIT(c, fn, ...)                                                           \
    do {                                                                                  \
        double saved_;                                                                    \
        DDL_CHECK(ddl_comm_enter(c, fn, &saved_));                                        \
        ddl_engine_t *e_ = (c)->is_world ? &world_engine : (c)->eng;                      \
        ddl_status_t st_ = submit(e_, __VA_ARGS__, fn);                                   \
        ddl_comm_leave(saved_);                                                           \
        return st_;                                                                       \
    } while (0)

ddl_status_t ddl_comm_iallreduce(ddl_comm_t c, const void *sendbuf, void *recvbuf, size_t count,
                                 ddl_dtype_t dtype, ddl_op_t op, const ddl_match_t *match,
                                 ddl_request_t *req) {
    COMM_SUBMIT(c, "ddl_comm_iallreduce", REQ_ALLREDUCE, sendbuf, recvbuf, count, dtype, (int)op,
                0, match, req);
}

ddl_status_t ddl_comm_ibroadcast(ddl_comm_t c, void *buf, size_t count, ddl_dtype_t dtype,
                                 int root, const ddl_match_t *match, ddl_request_t *req) {
    COMM_SUBMIT(c, "ddl_comm_ibroadcast", REQ_BROADCAST, DDL_IN_PLACE, buf, count, dtype, -1, root,
                match, req);
}

ddl_status_t ddl_comm_iallgather(ddl_comm_t c, const void *sendbuf, void *recvbuf,
                                 size_t sendcount, ddl_dtype_t dtype, const ddl_match_t *match,
                                 ddl_request_t *req) {
    COMM_SUBMIT(c, "ddl_comm_iallgather", REQ_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, -1,
                0, match, req);
}

ddl_status_t ddl_comm_ireduce_scatter(ddl_comm_t c, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, ddl_dtype_t dtype, ddl_op_t op,
                                      const ddl_match_t *match, ddl_request_t *req) {
    COMM_SUBMIT(c, "ddl_comm_ireduce_scatter", REQ_REDUCE_SCATTER, sendbuf, recvbuf, recvcount,
                dtype, (int)op, 0, match, req);
}

ddl_status_t ddl_comm_iallgatherv(ddl_comm_t c, const void *sendbuf, size_t sendcount,
                                  ddl_dtype_t dtype, const ddl_match_t *match,
                                  ddl_request_t *req) {
    COMM_SUBMIT(c, "ddl_comm_iallgatherv", REQ_ALLGATHERV, sendbuf, NULL, sendcount, dtype, -1,
                0, match, req);
}

ddl_status_t ddl_request_timing(ddl_request_t req, ddl_request_timing_t *out) {
    if (!req || !out) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_request_timing: NULL argument");
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE))
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_request_timing: the request has not finished");
    *out = (ddl_request_timing_t){req->submitted, req->t_negotiated, req->t_started,
                                  req->t_finished, req->fused, req->fused_bytes};
    return DDL_SUCCESS;
}

ddl_status_t ddl_join(int *last_rank) {
    DDL_CHECK(ddl_require_init());
    if (!last_rank) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_join: NULL last_rank");
    ddl_engine_t *e = &world_engine;
    pthread_mutex_lock(&e->lock);
    size_t pending = e->pending;
    pthread_mutex_unlock(&e->lock);
    if (pending)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "ddl_join: %zu asynchronous request%s of this rank %s still queued; wait "
                        "for them (ddl_wait) before joining",
                        pending, pending == 1 ? "" : "s", pending == 1 ? "is" : "are");
    ddl_match_t m;
    memset(&m, 0, sizeof m);
    m.name = "ddl.join";
    ddl_request_t req;
    DDL_CHECK(submit(e, REQ_JOIN, NULL, NULL, 0, DDL_UINT8, -1, 0, &m, &req, "ddl_join"));
    ddl_status_t st = ddl_wait(req);
    if (st == DDL_SUCCESS) *last_rank = req->root;
    ddl_request_free(req);
    return st;
}

ddl_status_t ddl_request_gathered(ddl_request_t req, const void **buf, const size_t **counts) {
    if (!req || !buf || !counts)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_request_gathered: NULL argument");
    if (req->kind != REQ_ALLGATHERV)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_request_gathered: not an allgatherv request");
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) || req->status != DDL_SUCCESS)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_request_gathered: the request has not "
                                             "completed successfully");
    *buf = req->gathered;
    *counts = req->counts;
    return DDL_SUCCESS;
}

static ddl_status_t request_status(ddl_request_t req) {
    if (req->status == DDL_ERR_PROC_FAILED)
        ddl_ft_note(req->eng && req->eng->ctx ? req->eng->ctx->owner : req->comm);
    if (req->status != DDL_SUCCESS) return ddl_fail_verbatim(req->status, req->error);
    return DDL_SUCCESS;
}

ddl_status_t ddl_test(ddl_request_t req, int *done) {
    if (!req || !done) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_test: NULL argument");
    if (ddl_req_is_p2p(req)) ddl_p2p_progress(req);
    *done = __atomic_load_n(&req->done, __ATOMIC_ACQUIRE);
    return *done ? request_status(req) : DDL_SUCCESS;
}

/* A cycle run by a waiting application thread: what the progress thread keeps per thread
 * (the deadline, the collective named in messages) is this thread's again afterwards. */
static void inline_cycle(ddl_engine_t *e) {
    double timeout = ddl_thread_timeout();
    ddl_coll_t cur = ddl_cur;
    __atomic_add_fetch(&stat_waiter_cycles, 1, __ATOMIC_RELAXED);
    run_cycle(e);
    ddl_cur = cur;
    (void)ddl_set_thread_timeout(timeout);
}

ddl_status_t ddl_wait(ddl_request_t req) {
    if (!req) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_wait: NULL request");
    if (ddl_req_is_p2p(req)) {
        ddl_p2p_wait(req);
    } else if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE)) {
        ddl_engine_t *e = req->eng;
        pthread_mutex_lock(&e->lock);
        if (!req->done && !e->cycling && !e->stop) {
            /* Nobody is negotiating: this thread, which can submit nothing more
             * meanwhile, runs the cycle itself (see the top of the file). */
            e->cycling = 1;
            pthread_mutex_unlock(&e->lock);
            inline_cycle(e);
            pthread_mutex_lock(&e->lock);
            release_locked(e);
        }
        if (!req->done && queued_locked(e, req)) {
            /* Still queued (a peer has not submitted it, or the progress thread is about
             * to take it): no point waiting out the cycle time for more requests to fuse.
             * (One already in the progress thread's batch leaves the next batch its cycle
             * time.) */
            e->hurry = 1;
            pthread_cond_broadcast(&e->work);
        }
        while (!req->done) pthread_cond_wait(&e->done, &e->lock);
        pthread_mutex_unlock(&e->lock);
    }
    return request_status(req);
}

void ddl_request_free(ddl_request_t req) {
    if (!req) return;
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) &&
        (ddl_req_is_p2p(req) || req->eng->running))
        (void)ddl_wait(req);
    free(req->gathered);
    free(req->counts);
    free(req);
}

/* Asynchronous collectives: a queue, a progress thread, negotiation and tensor fusion.
 *
 * Requests are executed by one progress thread on the progress context's own
 * communicators, so communication overlaps the application's computation. Which requests
 * run together, and in which order, must be the same on every rank, yet what is queued
 * when the thread wakes depends on timing, and a named request may be submitted in a
 * different order on each rank (gradient hooks that fire in another order). So each
 * cycle starts with a negotiation, as Horovod's coordinator does:
 *
 *   - Unnamed requests are matched by order: the n-th unnamed request of every rank runs
 *     with the n-th of the others. The negotiation takes the minimum over ranks of the
 *     number queued; that many of each rank's oldest unnamed requests are ready.
 *   - Named requests are matched by name. Every name that has been negotiated once has a
 *     slot in a name table that all ranks build identically; each cycle every rank sends
 *     one byte per slot (1: I have this name queued) and the bytes are combined with
 *     min, so after the exchange a 1 means "queued on every rank". This rides in the same
 *     recursive doubling as the unnamed count (the header's count_min), so the common
 *     case, where every queued name is already in the table, costs one small message per
 *     doubling step, as an unnamed negotiation does.
 *   - A rank with a name not in the table (its first use, or after eviction), or with a
 *     request stalled past DDL_TIMEOUT, raises a flag (the header's count_max). Then every
 *     rank sends the names of everything it has queued (two allgathers); each adds the
 *     new names to its table in the same order (rank 0's in its submission order, then
 *     rank 1's, ...), counts which names every rank has, and fails its own requests that
 *     some rank has not submitted within DDL_TIMEOUT, naming those ranks. Horovod's
 *     response cache is the same idea: full negotiation once, a bit vector afterwards.
 *
 * The ready requests run in an order every rank derives from agreed facts alone: the
 * unnamed ones first, in order, then the named ones by table slot (so by the order in
 * which their names were first negotiated). Consecutive allreduces of one dtype and op
 * are packed into one fusion buffer of at most DDL_FUSION_THRESHOLD bytes, reduced once
 * and unpacked. Element-wise reduction makes the fused result identical to separate calls
 * whenever the sum is exact (integers, or floats on two ranks); with more ranks a float
 * sum may round differently because a different algorithm or block boundary changes the
 * order of the additions, as with Horovod and NCCL fusion.
 *
 * Mismatches keep every rank in step. Each request carries a signature of everything the
 * ranks must agree on (collective, count, dtype, op, root and, when given, the shape);
 * every collective checks it across all ranks before data moves (collectives.c), so every
 * rank sees the same verdict at the same collective. Ranks whose requests differ may
 * group a batch differently (a dtype that differs splits a fusion group on one rank
 * only); the first collective where the groupings differ is then a mismatch on every
 * rank, at the same position of the batch. From there every rank runs the rest of the
 * batch one request at a time, so each request fails or succeeds on its own merits, and
 * for each one that fails, all ranks exchange its description and raise the same message
 * naming what differs. No rank is left with a request the others have dropped. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl_internal.h"

enum { REQ_ALLREDUCE, REQ_BROADCAST, REQ_ALLGATHER, REQ_REDUCE_SCATTER, REQ_ALLGATHERV };
static const char *const KIND_NAME[] = {"allreduce", "broadcast", "allgather",
                                        "reduce_scatter", "allgatherv"};
/* How messages call a kind: an allgatherv is an allgather (Horovod's) to its user. */
static const char *const KIND_WORD[] = {"allreduce", "broadcast", "allgather",
                                        "reduce_scatter", "allgather"};
static const int KIND_COLL[] = {DDL_COLL_ALLREDUCE, DDL_COLL_BROADCAST, DDL_COLL_ALLGATHER,
                                DDL_COLL_REDUCE_SCATTER, DDL_COLL_ALLGATHERV};

#define MAX_DIMS 32         /* longest shape a request may carry */
#define MAX_NAME 1024       /* longest name, in bytes */
#define TABLE_SOFT_MAX 4096 /* names kept in the table before the least recently used go */
#define IDLE_MAX_S 0.05     /* longest pause between an idle thread's looks at its peers */
enum { TAG_BELL = 401 };    /* a folded rank's wake-up call (negotiate) */

struct ddl_request_s {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ddl_dtype_t dtype;
    ddl_op_t op;
    int root;
    uint64_t sig;       /* what every rank's request must agree on (see request_sig) */
    const char *name;   /* NULL: unnamed, matched by order */
    uint64_t hash;      /* of the name */
    uint64_t seq;       /* unnamed: this rank's count of unnamed requests before it */
    int ndim;           /* -1: no shape */
    const int64_t *shape;
    double submitted;
    size_t slot;        /* progress thread: the name's table slot, valid while */
    uint32_t slot_gen;  /* ... the slot's generation is this (0: not looked up) */
    void *gathered;     /* allgatherv: the result and every rank's count */
    size_t *counts;
    int done; /* written under q.lock, read atomically */
    ddl_status_t status;
    char error[1024];
    struct ddl_request_s *prev, *next; /* the pending list, in submission order */
};

/* ---- names: hashing and an open-addressing map (name -> value) ------------------------ */

static uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then mixed */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return mix64(h);
}

typedef struct {
    uint64_t hash;
    const char *name; /* NULL: empty */
    size_t val;
} nm_entry_t;

typedef struct {
    nm_entry_t *e;
    size_t cap, n; /* cap is 0 or a power of two, at most half full */
} namemap_t;

static nm_entry_t *nm_find(const namemap_t *m, const char *name, uint64_t h) {
    if (!m->cap) return NULL;
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        nm_entry_t *s = &m->e[i];
        if (!s->name) return NULL;
        if (s->hash == h && strcmp(s->name, name) == 0) return s;
    }
}

static int nm_put(namemap_t *m, const char *name, uint64_t h, size_t val) {
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        nm_entry_t *e = calloc(cap, sizeof *e);
        if (!e) return -1;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->e[i].name) continue;
            size_t j = m->e[i].hash & (cap - 1);
            while (e[j].name) j = (j + 1) & (cap - 1);
            e[j] = m->e[i];
        }
        free(m->e);
        m->e = e;
        m->cap = cap;
    }
    size_t i = h & (m->cap - 1);
    while (m->e[i].name) i = (i + 1) & (m->cap - 1);
    m->e[i] = (nm_entry_t){h, name, val};
    m->n++;
    return 0;
}

/* Remove an entry, shifting later entries of its probe run back (no tombstones). */
static void nm_del(namemap_t *m, nm_entry_t *s) {
    size_t mask = m->cap - 1, i = (size_t)(s - m->e), j = i;
    m->e[i].name = NULL;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->e[j].name) break;
        size_t k = m->e[j].hash & mask; /* where the entry would like to be */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
        m->e[i] = m->e[j];
        m->e[j].name = NULL;
        i = j;
    }
    m->n--;
}

static void nm_free(namemap_t *m) {
    free(m->e);
    *m = (namemap_t){0};
}

/* ---- the queue ------------------------------------------------------------------------- */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work; /* the progress thread waits here */
    pthread_cond_t done; /* waiters on requests wait here */
    struct ddl_request_s *head, *tail;
    size_t pending;
    size_t fresh;        /* submitted since the progress thread last looked */
    size_t fresh_bytes;
    double first_fresh;
    uint64_t unnamed_seq;
    namemap_t inflight;  /* names of the requests submitted and not yet complete */
    int stop;
    int running;
    pthread_t thread;
} q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL,
       0, 0, 0, 0.0, 0, {NULL, 0, 0}, 0, 0, 0};

static uint64_t stat_batches, stat_fused_buffers, stat_fused_requests, stat_cycles,
    stat_full_cycles, stat_names;

ddl_status_t ddl_async_stats(uint64_t *batches, uint64_t *fused_buffers,
                             uint64_t *fused_requests) {
    DDL_CHECK(ddl_require_init());
    *batches = __atomic_load_n(&stat_batches, __ATOMIC_RELAXED);
    *fused_buffers = __atomic_load_n(&stat_fused_buffers, __ATOMIC_RELAXED);
    *fused_requests = __atomic_load_n(&stat_fused_requests, __ATOMIC_RELAXED);
    return DDL_SUCCESS;
}

ddl_status_t ddl_negotiation_stats(uint64_t *cycles, uint64_t *full_cycles, uint64_t *names,
                                   uint64_t *pending) {
    DDL_CHECK(ddl_require_init());
    if (!cycles || !full_cycles || !names || !pending)
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_negotiation_stats: NULL argument");
    *cycles = __atomic_load_n(&stat_cycles, __ATOMIC_RELAXED);
    *full_cycles = __atomic_load_n(&stat_full_cycles, __ATOMIC_RELAXED);
    *names = __atomic_load_n(&stat_names, __ATOMIC_RELAXED);
    pthread_mutex_lock(&q.lock);
    *pending = q.pending;
    pthread_mutex_unlock(&q.lock);
    return DDL_SUCCESS;
}

static size_t req_bytes(const struct ddl_request_s *r) {
    return r->count * ddl_dtype_size(r->dtype);
}

/* Finish a request with `st`; `msg` (or this thread's last error) explains a failure. */
static void finish(struct ddl_request_s *r, ddl_status_t st, const char *msg) {
    pthread_mutex_lock(&q.lock);
    r->status = st;
    if (st != DDL_SUCCESS) snprintf(r->error, sizeof r->error, "%s", msg ? msg : ddl_last_error());
    if (r->name) {
        nm_entry_t *e = nm_find(&q.inflight, r->name, r->hash);
        if (e && e->val == (size_t)(uintptr_t)r) nm_del(&q.inflight, e);
    }
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&q.done);
    pthread_mutex_unlock(&q.lock);
}

static void complete(struct ddl_request_s *r, ddl_status_t st) { finish(r, st, NULL); }

/* Take a request out of the pending list (under q.lock). */
static void unlink_locked(struct ddl_request_s *r) {
    if (r->prev) r->prev->next = r->next; else q.head = r->next;
    if (r->next) r->next->prev = r->prev; else q.tail = r->prev;
    r->prev = r->next = NULL;
    q.pending--;
}

/* How a request describes itself in messages: "allreduce 'grad.fc1'" or "unnamed
 * allreduce #3". */
static void describe(const struct ddl_request_s *r, char *out, size_t n) {
    if (r->name)
        snprintf(out, n, "%s '%.200s'", KIND_WORD[r->kind], r->name);
    else
        snprintf(out, n, "unnamed %s #%llu (unnamed requests are matched by submission order)",
                 KIND_WORD[r->kind], (unsigned long long)r->seq + 1);
}

/* ---- execution ----------------------------------------------------------------------- */

static ddl_status_t run_allgatherv(struct ddl_request_s *r) {
    ddl_ctx_t *ctx = &ddl_g.progress;
    int p = ddl_g.size;
    size_t es = ddl_dtype_size(r->dtype);
    int64_t mine = (int64_t)r->count;
    int64_t *cnt = malloc((size_t)p * sizeof *cnt);
    if (!cnt) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for %d counts", p);
    /* The counts travel first, under the request's own signature: its check is where a
     * dtype or shape that differs between ranks is found. */
    ddl_status_t st = ddl_allgather_ctx_sig(ctx, &mine, cnt, 1, DDL_INT64, r->sig);
    size_t longest = 0, total = 0;
    if (st == DDL_SUCCESS) {
        for (int i = 0; i < p; i++) {
            total += (size_t)cnt[i];
            if ((size_t)cnt[i] > longest) longest = (size_t)cnt[i];
        }
        r->counts = malloc((size_t)p * sizeof *r->counts);
        r->gathered = malloc(total * es > 0 ? total * es : 1);
        if (!r->counts || !r->gathered) st = ddl_fail(DDL_ERR_NO_MEMORY,
                                                       "no memory for a %zu-byte allgatherv "
                                                       "result", total * es);
    }
    char *pad = NULL, *all = NULL;
    if (st == DDL_SUCCESS && longest) {
        /* Every rank sends `longest` elements (its own, then padding): one allgather. */
        pad = calloc(longest, es);
        all = malloc((size_t)p * longest * es);
        if (!pad || !all) st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for an allgatherv");
        if (st == DDL_SUCCESS) {
            if (r->count) memcpy(pad, r->send, r->count * es);
            st = ddl_allgather_ctx_sig(ctx, pad, all, longest, r->dtype, 0);
        }
    }
    if (st == DDL_SUCCESS) {
        size_t off = 0;
        for (int i = 0; i < p; i++) {
            r->counts[i] = (size_t)cnt[i];
            if (cnt[i]) memcpy((char *)r->gathered + off, all + (size_t)i * longest * es,
                               (size_t)cnt[i] * es);
            off += (size_t)cnt[i] * es;
        }
    } else {
        free(r->counts);
        free(r->gathered);
        r->counts = NULL;
        r->gathered = NULL;
    }
    free(pad);
    free(all);
    free(cnt);
    return st;
}

static ddl_status_t run_one(struct ddl_request_s *r) {
    ddl_ctx_t *ctx = &ddl_g.progress;
    switch (r->kind) {
    case REQ_ALLREDUCE:
        return ddl_allreduce_ctx(ctx, r->send, r->recv, r->count, r->dtype, r->op, r->sig);
    case REQ_BROADCAST:
        return ddl_broadcast_ctx_sig(ctx, r->recv, r->count, r->dtype, r->root, r->sig);
    case REQ_ALLGATHER:
        return ddl_allgather_ctx_sig(ctx, r->send, r->recv, r->count, r->dtype, r->sig);
    case REQ_REDUCE_SCATTER:
        return ddl_reduce_scatter_ctx_sig(ctx, r->send, r->recv, r->count, r->dtype, r->op,
                                          r->sig);
    case REQ_ALLGATHERV: return run_allgatherv(r);
    default: return ddl_fail(DDL_ERR_INTERNAL, "unknown request kind %d", r->kind);
    }
}

/* Run n allreduces as one fused allreduce. Its signature covers every member's, so a
 * member that differs between ranks, or a grouping that differs, is a mismatch. */
static ddl_status_t run_fused(struct ddl_request_s **reqs, size_t n) {
    size_t es = ddl_dtype_size(reqs[0]->dtype), total = 0;
    uint64_t sig = mix64(((uint64_t)DDL_COLL_FUSED << 56) ^ n);
    for (size_t i = 0; i < n; i++) {
        total += reqs[i]->count;
        sig = mix64(sig ^ reqs[i]->sig);
    }
    __atomic_add_fetch(&stat_fused_buffers, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&stat_fused_requests, n, __ATOMIC_RELAXED);
    char *buf = ddl_scratch(4, total * es);
    if (!buf) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a %zu-byte fusion buffer",
                              total * es);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const void *src = reqs[i]->send == DDL_IN_PLACE ? reqs[i]->recv : reqs[i]->send;
        memcpy(buf + off, src, req_bytes(reqs[i]));
        off += req_bytes(reqs[i]);
    }
    DDL_CHECK(ddl_allreduce_ctx(&ddl_g.progress, buf, buf, total, reqs[0]->dtype, reqs[0]->op,
                                sig));
    off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(reqs[i]->recv, buf + off, req_bytes(reqs[i]));
        off += req_bytes(reqs[i]);
    }
    return DDL_SUCCESS;
}

static int fusable(const struct ddl_request_s *a, const struct ddl_request_s *b) {
    return a->kind == REQ_ALLREDUCE && b->kind == REQ_ALLREDUCE && a->dtype == b->dtype &&
           a->op == b->op;
}

/* What one rank's request looked like, exchanged after a mismatch to say what differs. */
typedef struct {
    int32_t kind, dtype, op, root, ndim, pad;
    int64_t count;
    int64_t dims[8];
} req_desc_t;

static void shape_text(const req_desc_t *d, int from, char *out, size_t n) {
    size_t len = 0;
    len += (size_t)snprintf(out, n, "[");
    for (int i = from; i < d->ndim && i < 8 && len < n; i++)
        len += (size_t)snprintf(out + len, n - len, "%s%lld", i > from ? ", " : "",
                                (long long)d->dims[i]);
    if (d->ndim > 8 && len < n) len += (size_t)snprintf(out + len, n - len, ", ...");
    if (len < n) snprintf(out + len, n - len, "]");
}

static int dims_differ(const req_desc_t *x, const req_desc_t *y, int from) {
    for (int i = from; i < x->ndim && i < 8; i++)
        if (x->dims[i] != y->dims[i]) return 1;
    return 0;
}

/* All ranks found request r mismatched (the verdict of a checked collective is the same
 * on every rank): exchange its description and fail it with one message, the same on
 * every rank, that names the ranks and what differs. */
static ddl_status_t explain(struct ddl_request_s *r) {
    char first[1024];
    snprintf(first, sizeof first, "%s", ddl_last_error());
    req_desc_t me = {r->kind, (int32_t)r->dtype, (int32_t)r->op, r->root, r->ndim, 0,
                     (int64_t)r->count, {0}};
    for (int i = 0; i < r->ndim && i < 8; i++) me.dims[i] = r->shape[i];
    int p = ddl_g.size;
    req_desc_t *all = malloc((size_t)p * sizeof *all);
    if (!all) return ddl_fail_verbatim(DDL_ERR_MISMATCH, first);
    ddl_status_t st = ddl_allgather_ctx_sig(&ddl_g.progress, &me, all, sizeof me, DDL_UINT8, 0);
    if (st != DDL_SUCCESS) {
        free(all);
        return st;
    }
    char what[300];
    describe(r, what, sizeof what);
    for (int i = 0; i < p; i++) /* from our own peers, but never index out of range */
        if (all[i].kind < 0 || all[i].kind > REQ_ALLGATHERV) all[i].kind = 0;
    const char *kind = KIND_WORD[all[0].kind];
    int gather = all[0].kind == REQ_ALLGATHER || all[0].kind == REQ_ALLGATHERV;
    char a[160] = "", b[160] = "", topic[64] = "";
    int other = -1;
    for (int i = 1; i < p && other < 0; i++) {
        const req_desc_t *x = &all[0], *y = &all[i];
        if (x->kind != y->kind) {
            snprintf(topic, sizeof topic, "operations");
            snprintf(a, sizeof a, "called %s", KIND_NAME[x->kind]);
            snprintf(b, sizeof b, "called %s", KIND_NAME[y->kind]);
        } else if (x->dtype != y->dtype) {
            snprintf(topic, sizeof topic, "data types");
            snprintf(a, sizeof a, "sent %s", ddl_dtype_name((ddl_dtype_t)x->dtype));
            snprintf(b, sizeof b, "sent %s", ddl_dtype_name((ddl_dtype_t)y->dtype));
        } else if ((x->ndim >= 0) != (y->ndim >= 0)) {
            snprintf(topic, sizeof topic, "%s tensor shapes", kind);
            snprintf(a, sizeof a, x->ndim >= 0 ? "gave a shape" : "gave no shape");
            snprintf(b, sizeof b, y->ndim >= 0 ? "gave a shape" : "gave no shape");
        } else if (x->ndim >= 0 && x->ndim != y->ndim) {
            snprintf(topic, sizeof topic, "%s tensor shapes", kind);
            char sa[96], sb[96];
            shape_text(x, 0, sa, sizeof sa);
            shape_text(y, 0, sb, sizeof sb);
            snprintf(a, sizeof a, "sent a tensor of rank %d %s", x->ndim, sa);
            snprintf(b, sizeof b, "sent a tensor of rank %d %s", y->ndim, sb);
        } else if (x->ndim >= 0 && dims_differ(x, y, gather)) {
            snprintf(topic, sizeof topic, "%s tensor shapes", kind);
            char sa[96], sb[96];
            shape_text(x, 0, sa, sizeof sa);
            shape_text(y, 0, sb, sizeof sb);
            snprintf(a, sizeof a, "sent shape %s", sa);
            snprintf(b, sizeof b, "sent shape %s%s", sb,
                     gather ? " (all dimensions but the first must agree)" : "");
        } else if (x->count != y->count && all[0].kind != REQ_ALLGATHERV) {
            snprintf(topic, sizeof topic, "%s counts", kind);
            snprintf(a, sizeof a, "sent %lld elements", (long long)x->count);
            snprintf(b, sizeof b, "sent %lld elements", (long long)y->count);
        } else if (x->op != y->op && (x->kind == REQ_ALLREDUCE || x->kind == REQ_REDUCE_SCATTER)) {
            snprintf(topic, sizeof topic, "reduction ops");
            snprintf(a, sizeof a, "asked for %s", ddl_op_name((ddl_op_t)x->op));
            snprintf(b, sizeof b, "asked for %s", ddl_op_name((ddl_op_t)y->op));
        } else if (x->root != y->root && x->kind == REQ_BROADCAST) {
            snprintf(topic, sizeof topic, "broadcast root ranks");
            snprintf(a, sizeof a, "gave root %d", x->root);
            snprintf(b, sizeof b, "gave root %d", y->root);
        } else {
            continue;
        }
        other = i;
    }
    free(all);
    if (other < 0) return ddl_fail_verbatim(DDL_ERR_MISMATCH, first); /* e.g. the grouping */
    return ddl_fail(DDL_ERR_MISMATCH,
                    "Mismatched %s for %s: rank 0 %s, but rank %d %s. Every rank must submit "
                    "it with the same collective, dtype, shape, op and root",
                    topic, what, a, other, b);
}

/* Run a batch (the same requests, in the same order, on every rank). */
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
        ddl_status_t st = j - i > 1 ? run_fused(reqs + i, j - i) : run_one(r);
        if (st == DDL_ERR_MISMATCH) {
            /* Every rank is here, at request i (see the top of the file): run the rest one
             * at a time, so requests fail or succeed each on their own. */
            for (size_t k = i; k < n; k++) {
                st = run_one(reqs[k]);
                if (st == DDL_ERR_MISMATCH) st = explain(reqs[k]);
                complete(reqs[k], st);
            }
            return;
        }
        for (size_t k = i; k < j; k++) complete(reqs[k], st);
        i = j;
    }
}

/* ---- the name table (progress thread only) --------------------------------------------- */

static struct {
    char **name;
    uint64_t *hash;
    uint64_t *used; /* the last cycle that named it: least recently used names go first */
    uint32_t *gen;  /* bumped when a slot is given to another name */
    size_t n, cap;
    namemap_t map;  /* name -> slot */
} tab;
static uint64_t cycle_no;

static long req_slot(struct ddl_request_s *r) {
    if (r->slot_gen && r->slot < tab.n && tab.gen[r->slot] == r->slot_gen) return (long)r->slot;
    nm_entry_t *e = nm_find(&tab.map, r->name, r->hash);
    if (!e) return -1;
    r->slot = e->val;
    r->slot_gen = tab.gen[e->val];
    return (long)e->val;
}

/* A slot for a name no slot holds: a new one, or the least recently used one not named
 * in this cycle. Every rank calls this with the same names in the same order. */
static long tab_assign(const char *name, uint64_t h) {
    size_t s = tab.n;
    if (tab.n >= TABLE_SOFT_MAX) {
        uint64_t oldest = cycle_no;
        for (size_t i = 0; i < tab.n; i++)
            if (tab.used[i] < oldest) oldest = tab.used[i], s = i;
    }
    if (s == tab.n && tab.n == tab.cap) {
        size_t cap = tab.cap ? 2 * tab.cap : 64;
        char **nn = realloc(tab.name, cap * sizeof *nn);
        if (nn) tab.name = nn;
        uint64_t *nh = realloc(tab.hash, cap * sizeof *nh);
        if (nh) tab.hash = nh;
        uint64_t *nu = realloc(tab.used, cap * sizeof *nu);
        if (nu) tab.used = nu;
        uint32_t *ng = realloc(tab.gen, cap * sizeof *ng);
        if (ng) tab.gen = ng;
        if (!nn || !nh || !nu || !ng) return -1;
        tab.cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return -1;
    if (s < tab.n) { /* evict */
        nm_entry_t *e = nm_find(&tab.map, tab.name[s], tab.hash[s]);
        if (e) nm_del(&tab.map, e);
        free(tab.name[s]);
        tab.gen[s]++;
        if (!tab.gen[s]) tab.gen[s] = 1;
    } else {
        tab.gen[s] = 1;
        tab.n++;
    }
    tab.name[s] = copy;
    tab.hash[s] = h;
    tab.used[s] = cycle_no;
    if (nm_put(&tab.map, copy, h, s) != 0) return -1;
    __atomic_store_n(&stat_names, (uint64_t)tab.map.n, __ATOMIC_RELAXED);
    return (long)s;
}

static void tab_free(void) {
    for (size_t i = 0; i < tab.n; i++) free(tab.name[i]);
    free(tab.name);
    free(tab.hash);
    free(tab.used);
    free(tab.gen);
    nm_free(&tab.map);
    memset(&tab, 0, sizeof tab);
}

/* ---- negotiation ------------------------------------------------------------------------ */

typedef struct {
    struct ddl_request_s **v;
    size_t n, cap;
} reqvec_t;

static int vec_push(reqvec_t *v, struct ddl_request_s *r) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        struct ddl_request_s **nv = realloc(v->v, cap * sizeof *nv);
        if (!nv) return -1;
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = r;
    return 0;
}

static void *grow(void **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        void *nb = realloc(*buf, bytes);
        if (!nb) return NULL;
        *buf = nb;
        *cap = bytes;
    }
    return *buf ? *buf : (*buf = malloc(1));
}

static uint8_t *ready_buf;
static size_t ready_cap;
static void *blob_buf, *all_buf;
static size_t blob_cap, all_cap;

/* "1, 3-5" */
static void rank_list(const uint8_t *flag, int p, char *out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < p && len + 24 < n; i++) {
        if (!flag[i]) continue;
        int j = i;
        while (j + 1 < p && flag[j + 1]) j++;
        len += (size_t)snprintf(out + len, n - len, "%s%d", len ? ", " : "", i);
        if (j > i) len += (size_t)snprintf(out + len, n - len, "%s%d", j > i + 1 ? "-" : ", ", j);
        i = j;
    }
}

/* The full exchange: every rank's queued names; the table gains the new ones; ready[s] is
 * set for the slots every rank has queued; this rank's requests stalled past DDL_TIMEOUT
 * go to `stalled` with their message in r->error. */
static ddl_status_t full_exchange(const reqvec_t *snap, uint64_t ready_unnamed,
                                  reqvec_t *stalled) {
    int p = ddl_g.size;
    __atomic_add_fetch(&stat_full_cycles, 1, __ATOMIC_RELAXED);
    /* My report: [unnamed count][named count][names, each NUL-terminated]. */
    size_t len = 2 * sizeof(uint64_t);
    uint64_t unnamed = 0, named = 0;
    for (size_t i = 0; i < snap->n; i++) {
        if (snap->v[i]->name) len += strlen(snap->v[i]->name) + 1, named++;
        else unnamed++;
    }
    int64_t mylen = (int64_t)len;
    int64_t *lens = malloc((size_t)p * sizeof *lens);
    const char **start = malloc((size_t)p * sizeof *start);
    uint64_t *unn = malloc((size_t)p * sizeof *unn), *nnamed = malloc((size_t)p * sizeof *nnamed);
    uint8_t *flag = malloc((size_t)p);
    ddl_status_t st = DDL_SUCCESS;
    if (!lens || !start || !unn || !nnamed || !flag)
        st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    if (st == DDL_SUCCESS) st = ddl_allgather_ctx_sig(&ddl_g.progress, &mylen, lens, 1,
                                                      DDL_INT64, 0);
    size_t longest = 0;
    for (int i = 0; st == DDL_SUCCESS && i < p; i++)
        if ((size_t)lens[i] > longest) longest = (size_t)lens[i];
    char *blob = NULL, *all = NULL;
    if (st == DDL_SUCCESS) {
        blob = grow(&blob_buf, &blob_cap, longest);
        all = grow(&all_buf, &all_cap, longest * (size_t)p);
        if (!blob || !all) st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    }
    if (st == DDL_SUCCESS) {
        memset(blob, 0, longest);
        memcpy(blob, &unnamed, sizeof unnamed);
        memcpy(blob + sizeof unnamed, &named, sizeof named);
        char *w = blob + 2 * sizeof(uint64_t);
        for (size_t i = 0; i < snap->n; i++) {
            if (!snap->v[i]->name) continue;
            size_t l = strlen(snap->v[i]->name) + 1;
            memcpy(w, snap->v[i]->name, l);
            w += l;
        }
        st = ddl_allgather_ctx_sig(&ddl_g.progress, blob, all, longest, DDL_UINT8, 0);
    }
    /* Parse and check every report before using any. */
    for (int r = 0; st == DDL_SUCCESS && r < p; r++) {
        const char *b = all + (size_t)r * longest, *end = b + lens[r];
        if (lens[r] < (int64_t)(2 * sizeof(uint64_t)) || (size_t)lens[r] > longest) {
            st = ddl_fail(DDL_ERR_INTERNAL, "asynchronous negotiation: rank %d sent a malformed "
                                            "list of names (a bug in libddl)", r);
            break;
        }
        memcpy(&unn[r], b, sizeof(uint64_t));
        memcpy(&nnamed[r], b + sizeof(uint64_t), sizeof(uint64_t));
        start[r] = b + 2 * sizeof(uint64_t);
        const char *c = start[r];
        uint64_t k = 0;
        for (; k < nnamed[r] && c < end; k++) c += strnlen(c, (size_t)(end - c)) + 1;
        if (k < nnamed[r] || c > end)
            st = ddl_fail(DDL_ERR_INTERNAL, "asynchronous negotiation: rank %d sent a malformed "
                                            "list of names (a bug in libddl)", r);
    }
    /* Every name seen this cycle is in use (not evicted now); then new names get slots,
     * rank by rank in submission order; then count who has what. */
    for (int r = 0; st == DDL_SUCCESS && r < p; r++) {
        const char *c = start[r];
        for (uint64_t k = 0; k < nnamed[r]; k++, c += strlen(c) + 1) {
            nm_entry_t *e = nm_find(&tab.map, c, name_hash(c));
            if (e) tab.used[e->val] = cycle_no;
        }
    }
    for (int r = 0; st == DDL_SUCCESS && r < p; r++) {
        const char *c = start[r];
        for (uint64_t k = 0; k < nnamed[r] && st == DDL_SUCCESS; k++, c += strlen(c) + 1) {
            uint64_t h = name_hash(c);
            if (!nm_find(&tab.map, c, h) && tab_assign(c, h) < 0)
                st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the table of names");
        }
    }
    uint8_t *ready = st == DDL_SUCCESS ? grow((void **)&ready_buf, &ready_cap, tab.n) : NULL;
    uint32_t *cnt = st == DDL_SUCCESS ? calloc(tab.n ? tab.n : 1, sizeof *cnt) : NULL;
    if (st == DDL_SUCCESS && (!ready || !cnt))
        st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    for (int r = 0; st == DDL_SUCCESS && r < p; r++) {
        const char *c = start[r];
        for (uint64_t k = 0; k < nnamed[r]; k++, c += strlen(c) + 1)
            cnt[nm_find(&tab.map, c, name_hash(c))->val]++;
    }
    for (size_t s = 0; st == DDL_SUCCESS && s < tab.n; s++) ready[s] = cnt[s] == (uint32_t)p;
    /* Stalls: my requests that some rank has not submitted within DDL_TIMEOUT. */
    double now = ddl_now();
    uint64_t my_unnamed = 0;
    for (size_t i = 0; st == DDL_SUCCESS && i < snap->n; i++) {
        struct ddl_request_s *r = snap->v[i];
        uint64_t pos = r->name ? 0 : my_unnamed++;
        int is_ready = r->name ? ready[req_slot(r)] : pos < ready_unnamed;
        if (is_ready || now - r->submitted <= ddl_timeout_s) continue;
        for (int k = 0; k < p; k++) {
            if (r->name) {
                flag[k] = 1;
                const char *c = start[k];
                for (uint64_t m = 0; m < nnamed[k]; m++, c += strlen(c) + 1)
                    if (strcmp(c, r->name) == 0) flag[k] = 0;
            } else {
                flag[k] = unn[k] <= pos;
            }
        }
        char who[256], what[300];
        rank_list(flag, p, who, sizeof who);
        describe(r, what, sizeof what);
        snprintf(r->error, sizeof r->error,
                 "rank %d: %s was not submitted by rank(s) %s within DDL_TIMEOUT (%.0f s): every "
                 "rank must submit the same named requests, and the same number of unnamed "
                 "ones, or a rank stopped early",
                 ddl_g.rank, what, who, ddl_timeout_s);
        if (vec_push(stalled, r) != 0) st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory");
    }
    free(cnt);
    free(lens);
    free(start);
    free(unn);
    free(nnamed);
    free(flag);
    return st;
}

static uint8_t *have_buf;
static size_t have_cap;
typedef struct {
    size_t slot;
    struct ddl_request_s *r;
} slotted_t;
static slotted_t *named_buf;
static size_t named_cap;

static int by_slot(const void *a, const void *b) {
    size_t x = ((const slotted_t *)a)->slot, y = ((const slotted_t *)b)->slot;
    return x < y ? -1 : x > y;
}

/* Agree with every rank on this cycle's batch (ready requests, in the agreed order) and
 * find this rank's stalled requests. *more: some rank keeps requests queued after this
 * cycle, so every rank must take part in the next one (even one with nothing queued: the
 * ranks waiting for it then find out, after DDL_TIMEOUT, what it never submitted). */
static ddl_status_t negotiate(const reqvec_t *snap, reqvec_t *batch, reqvec_t *stalled,
                              int *more) {
    size_t nslots = tab.n;
    /* One byte per table slot (1: queued here), then one byte that is 0 when this rank
     * needs the full exchange; all combined with min. */
    uint8_t *have = grow((void **)&have_buf, &have_cap, nslots + 1);
    if (!have) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    memset(have, 0, nslots);
    uint64_t unnamed = 0;
    int full = 0;
    double now = ddl_now();
    for (size_t i = 0; i < snap->n; i++) {
        struct ddl_request_s *r = snap->v[i];
        if (!r->name) {
            unnamed++;
        } else {
            long s = req_slot(r);
            if (s >= 0) {
                have[s] = 1;
            } else if (!full) {
                full = 1;
                ddl_log(2, "negotiation %llu: '%.200s' is not in the table of names yet",
                        (unsigned long long)cycle_no, r->name);
            }
        }
        if (now - r->submitted > ddl_timeout_s && !full) {
            full = 1;
            ddl_log(2, "negotiation %llu: a request waited longer than DDL_TIMEOUT",
                    (unsigned long long)cycle_no);
        }
    }
    have[nslots] = !full;
    /* The recursive doubling folds ranks beyond the largest power of two in: an even rank
     * r < 2*rem sends first, to r+1, and hears back only at the end, so an idle one would
     * never see a negotiation start. Its partner rings first (TAG_BELL); the even rank
     * takes the ring after the exchange, by when it has surely arrived. */
    const ddl_comm_t *w = &ddl_g.progress.world;
    int pof2 = 1;
    while (pof2 * 2 <= w->size) pof2 *= 2;
    int folded = w->rank < 2 * (w->size - pof2), odd = w->rank % 2;
    if (folded && odd) DDL_CHECK(ddl_sendrecv(w, NULL, 0, w->rank - 1, NULL, 0, -1, TAG_BELL));
    ddl_header_t h;
    ddl_header_init(&h, ddl_signature(DDL_COLL_NEGOTIATE, nslots, DDL_UINT8, DDL_MIN, 0), 0);
    h.count_min = unnamed;  /* combined with min: the unnamed requests every rank has */
    h.count_max = snap->n;  /* combined with max: the most requests any rank has queued */
    DDL_CHECK(ddl_rd_allreduce_checked(w, &h, have, nslots + 1, DDL_UINT8, DDL_MIN));
    if (folded && !odd) DDL_CHECK(ddl_sendrecv(w, NULL, 0, -1, NULL, 0, w->rank + 1, TAG_BELL));
    if (h.sig_min != h.sig_max)
        return ddl_fail(DDL_ERR_INTERNAL,
                        "asynchronous negotiation: the ranks' tables of names differ (%zu names "
                        "here): a bug in libddl, or ranks running different libddl versions",
                        nslots);
    uint64_t ready_unnamed = h.count_min;
    const uint8_t *ready = have;
    *more = 0;
    if (!have[nslots]) {
        DDL_CHECK(full_exchange(snap, ready_unnamed, stalled));
        ready = ready_buf;
        *more = 1;
    }
    /* The batch: unnamed ones in order, then named ones by slot. */
    size_t nn = 0;
    uint64_t taken = 0;
    for (size_t i = 0; i < snap->n; i++) {
        struct ddl_request_s *r = snap->v[i];
        if (!r->name) {
            if (taken++ < ready_unnamed && vec_push(batch, r) != 0)
                return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a batch");
            continue;
        }
        long s = req_slot(r);
        if (s < 0 || !ready[s]) continue;
        slotted_t *nb = grow((void **)&named_buf, &named_cap, (nn + 1) * sizeof *nb);
        if (!nb) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a batch");
        nb[nn++] = (slotted_t){(size_t)s, r};
    }
    if (nn > 1) qsort(named_buf, nn, sizeof *named_buf, by_slot);
    for (size_t i = 0; i < nn; i++) {
        tab.used[named_buf[i].slot] = cycle_no;
        if (vec_push(batch, named_buf[i].r) != 0)
            return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a batch");
    }
    /* The batch is the same on every rank: whoever had more queued keeps some. */
    if (h.count_max > batch->n) *more = 1;
    return DDL_SUCCESS;
}

static void sleep_until(double t) {
    double d = t - ddl_now();
    if (d <= 0) return;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Whether a peer has started a negotiation this rank has not joined: its first message
 * (a recursive-doubling step, or the doorbell of a folded pair) is waiting here. Only
 * called while this rank has nothing running on the progress communicators, so any such
 * message belongs to a new negotiation. */
static int peer_negotiating(void) {
    const ddl_comm_t *c = &ddl_g.progress.world;
    int tags[2] = {DDL_TAG_RD, TAG_BELL};
    for (int i = 0; i < 2; i++) {
        int flag = 0;
        if (MPI_Iprobe(MPI_ANY_SOURCE, tags[i], c->comm, &flag, MPI_STATUS_IGNORE) ==
                MPI_SUCCESS && flag)
            return 1;
    }
    return 0;
}

static void *progress_main(void *arg) {
    (void)arg;
    reqvec_t snap = {0}, batch = {0}, stalled = {0};
    double last_cycle = 0;
    int more = 0; /* agreed: some rank still has requests queued */
    for (;;) {
        pthread_mutex_lock(&q.lock);
        /* Idle: sleep until a request arrives, looking now and then (every 1 ms at first,
         * then up to every IDLE_MAX_S) whether a peer has started a negotiation, which
         * happens when it waits for a request this rank has not submitted: joining it
         * (with nothing) lets that rank learn, after DDL_TIMEOUT, what this one never
         * submitted, instead of waiting for an answer that never comes. */
        int joining = 0;
        double interval = 1e-3;
        while (!q.stop && q.pending == 0 && !more) {
            if (ddl_g.size == 1) {
                pthread_cond_wait(&q.work, &q.lock);
                continue;
            }
            double until = ddl_now() + interval;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + interval;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&q.work, &q.lock, &ts);
            if (q.pending || q.stop || ddl_now() < until) continue;
            pthread_mutex_unlock(&q.lock);
            joining = peer_negotiating();
            pthread_mutex_lock(&q.lock);
            if (joining) break;
            interval = interval * 2 < IDLE_MAX_S ? interval * 2 : IDLE_MAX_S;
        }
        if (q.pending == 0 && q.stop && !more && !joining) {
            pthread_mutex_unlock(&q.lock);
            break;
        }
        /* Give requests submitted close together the cycle time to join the batch; when
         * only requests other ranks have not submitted yet are left, look again a cycle
         * time after the last look. */
        double wake = (q.fresh ? q.first_fresh : last_cycle) + ddl_g.cycle_time_s;
        int full = joining || (q.fresh && q.fresh_bytes >= ddl_g.fusion_threshold);
        pthread_mutex_unlock(&q.lock);
        if (!full) sleep_until(wake);

        pthread_mutex_lock(&q.lock);
        snap.n = 0;
        int oom = 0;
        for (struct ddl_request_s *r = q.head; r; r = r->next) oom |= vec_push(&snap, r);
        q.fresh = 0;
        q.fresh_bytes = 0;
        pthread_mutex_unlock(&q.lock);
        last_cycle = ddl_now();
        cycle_no++;
        __atomic_add_fetch(&stat_cycles, 1, __ATOMIC_RELAXED);
        batch.n = stalled.n = 0;
        ddl_status_t st = oom ? ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the queue")
                              : negotiate(&snap, &batch, &stalled, &more);
        if (st != DDL_SUCCESS) { /* no agreement: fail everything this rank has queued */
            more = 0;
            pthread_mutex_lock(&q.lock);
            for (size_t i = 0; i < snap.n; i++) unlink_locked(snap.v[i]);
            pthread_mutex_unlock(&q.lock);
            for (size_t i = 0; i < snap.n; i++) complete(snap.v[i], st);
            continue;
        }
        pthread_mutex_lock(&q.lock);
        for (size_t i = 0; i < batch.n; i++) unlink_locked(batch.v[i]);
        for (size_t i = 0; i < stalled.n; i++) unlink_locked(stalled.v[i]);
        pthread_mutex_unlock(&q.lock);
        for (size_t i = 0; i < stalled.n; i++) {
            char msg[sizeof stalled.v[i]->error];
            memcpy(msg, stalled.v[i]->error, sizeof msg);
            finish(stalled.v[i], DDL_ERR_TIMEOUT, msg);
        }
        if (batch.n) {
            __atomic_add_fetch(&stat_batches, 1, __ATOMIC_RELAXED);
            run_batch(batch.v, batch.n);
        }
    }
    free(snap.v);
    free(batch.v);
    free(stalled.v);
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
    tab_free();
    nm_free(&q.inflight);
    free(have_buf), have_buf = NULL, have_cap = 0;
    free(ready_buf), ready_buf = NULL, ready_cap = 0;
    free(blob_buf), blob_buf = NULL, blob_cap = 0;
    free(all_buf), all_buf = NULL, all_cap = 0;
    free(named_buf), named_buf = NULL, named_cap = 0;
    return DDL_SUCCESS;
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
    s = mix64(s ^ (0x5348415045ULL + (uint64_t)ndim)); /* "SHAPE" */
    for (int i = gather ? 1 : 0; i < ndim; i++) s = mix64(s ^ (uint64_t)shape[i]);
    return s;
}

static ddl_status_t submit(int kind, const void *send, void *recv, size_t count,
                           ddl_dtype_t dtype, int op, int root, const ddl_match_t *match,
                           ddl_request_t *out, const char *fn) {
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
    if (count && !(kind == REQ_ALLGATHERV ? send : recv))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL buffer", fn);
    if (kind == REQ_BROADCAST && (root < 0 || root >= ddl_g.size))
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s: root %d is not a rank (0..%d)", fn, root,
                        ddl_g.size - 1);
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
        size_t want = kind == REQ_REDUCE_SCATTER ? count * (size_t)ddl_g.size : count, have = 1;
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
        r->hash = name_hash(tail);
    }
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
    pthread_mutex_lock(&q.lock);
    if (name) {
        if (nm_find(&q.inflight, r->name, r->hash)) {
            pthread_mutex_unlock(&q.lock);
            free(r);
            return ddl_fail(DDL_ERR_INVALID_ARG,
                            "%s: a request named '%.200s' is already in flight on this rank "
                            "(submitted and not complete): a name identifies one request at a "
                            "time, so wait for the first one or give this one another name",
                            fn, name);
        }
        if (nm_put(&q.inflight, r->name, r->hash, (size_t)(uintptr_t)r) != 0) {
            pthread_mutex_unlock(&q.lock);
            free(r);
            return ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory for a request", fn);
        }
    } else {
        r->seq = q.unnamed_seq++;
    }
    if (q.fresh == 0) q.first_fresh = r->submitted;
    r->prev = q.tail;
    if (q.tail)
        q.tail->next = r;
    else
        q.head = r;
    q.tail = r;
    q.pending++;
    q.fresh++;
    q.fresh_bytes += req_bytes(r);
    pthread_cond_signal(&q.work);
    pthread_mutex_unlock(&q.lock);
    *out = r;
    return DDL_SUCCESS;
}

ddl_status_t ddl_iallreduce(const void *sendbuf, void *recvbuf, size_t count, ddl_dtype_t dtype,
                            ddl_op_t op, ddl_request_t *req) {
    return submit(REQ_ALLREDUCE, sendbuf, recvbuf, count, dtype, (int)op, 0, NULL, req,
                  "ddl_iallreduce");
}

ddl_status_t ddl_ibroadcast(void *buf, size_t count, ddl_dtype_t dtype, int root,
                            ddl_request_t *req) {
    return submit(REQ_BROADCAST, DDL_IN_PLACE, buf, count, dtype, -1, root, NULL, req,
                  "ddl_ibroadcast");
}

ddl_status_t ddl_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                            ddl_dtype_t dtype, ddl_request_t *req) {
    return submit(REQ_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, -1, 0, NULL, req,
                  "ddl_iallgather");
}

ddl_status_t ddl_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                 ddl_dtype_t dtype, ddl_op_t op, ddl_request_t *req) {
    return submit(REQ_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, (int)op, 0, NULL, req,
                  "ddl_ireduce_scatter");
}

ddl_status_t ddl_iallreduce_named(const void *sendbuf, void *recvbuf, size_t count,
                                  ddl_dtype_t dtype, ddl_op_t op, const ddl_match_t *match,
                                  ddl_request_t *req) {
    return submit(REQ_ALLREDUCE, sendbuf, recvbuf, count, dtype, (int)op, 0, match, req,
                  "ddl_iallreduce_named");
}

ddl_status_t ddl_ibroadcast_named(void *buf, size_t count, ddl_dtype_t dtype, int root,
                                  const ddl_match_t *match, ddl_request_t *req) {
    return submit(REQ_BROADCAST, DDL_IN_PLACE, buf, count, dtype, -1, root, match, req,
                  "ddl_ibroadcast_named");
}

ddl_status_t ddl_iallgather_named(const void *sendbuf, void *recvbuf, size_t sendcount,
                                  ddl_dtype_t dtype, const ddl_match_t *match,
                                  ddl_request_t *req) {
    return submit(REQ_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, -1, 0, match, req,
                  "ddl_iallgather_named");
}

ddl_status_t ddl_ireduce_scatter_named(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddl_dtype_t dtype, ddl_op_t op, const ddl_match_t *match,
                                       ddl_request_t *req) {
    return submit(REQ_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, (int)op, 0, match,
                  req, "ddl_ireduce_scatter_named");
}

ddl_status_t ddl_iallgatherv_named(const void *sendbuf, size_t sendcount, ddl_dtype_t dtype,
                                   const ddl_match_t *match, ddl_request_t *req) {
    return submit(REQ_ALLGATHERV, sendbuf, NULL, sendcount, dtype, -1, 0, match, req,
                  "ddl_iallgatherv_named");
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
    if (req->status != DDL_SUCCESS) return ddl_fail_verbatim(req->status, req->error);
    return DDL_SUCCESS;
}

ddl_status_t ddl_test(ddl_request_t req, int *done) {
    if (!req || !done) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_test: NULL argument");
    *done = __atomic_load_n(&req->done, __ATOMIC_ACQUIRE);
    return *done ? request_status(req) : DDL_SUCCESS;
}

ddl_status_t ddl_wait(ddl_request_t req) {
    if (!req) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_wait: NULL request");
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&q.lock);
        while (!req->done) pthread_cond_wait(&q.done, &q.lock);
        pthread_mutex_unlock(&q.lock);
    }
    return request_status(req);
}

void ddl_request_free(ddl_request_t req) {
    if (!req) return;
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) && q.running) (void)ddl_wait(req);
    free(req->gathered);
    free(req->counts);
    free(req);
}

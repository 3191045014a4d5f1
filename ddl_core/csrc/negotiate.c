/* Negotiation: which queued asynchronous requests run in a cycle, agreed by all ranks.
 *
 *   - Unnamed requests are matched by order: the n-th unnamed request of every rank runs
 *     with the n-th of the others. The negotiation takes the minimum over ranks of the
 *     number queued (the header's count_min); that many of each rank's oldest unnamed
 *     requests are ready.
 *   - Named requests are matched by name. Every name negotiated once has a slot in a
 *     table of names that all ranks build identically; each cycle every rank sends one
 *     byte per slot (1: I have this name queued) and the bytes are combined with min, so
 *     afterwards a 1 means "queued on every rank". The bytes ride in the same recursive
 *     doubling as the counts, so the common case, where every queued name is already in
 *     the table, costs what an unnamed negotiation does: one small message per doubling
 *     step (a few bytes more per name).
 *   - A rank with a name not in the table (its first use, or after eviction), or with a
 *     request stalled past DDL_TIMEOUT, clears a last byte that every rank sets, and then
 *     every rank sends the names of everything it has queued (two allgathers); each adds
 *     the new names to its table in the same order (rank 0's in submission order, then
 *     rank 1's, ...), counts which names every rank has, and fails its own requests that
 *     some rank has not submitted within DDL_TIMEOUT, naming those ranks. Horovod's
 *     response cache is the same idea: full negotiation once, a bit vector afterwards.
 *   - The header's count_max (the most requests any rank has queued) tells idle ranks
 *     whether another negotiation is likely soon (async.c).
 *
 * The ready requests run in an order every rank derives from agreed facts alone: the
 * unnamed ones first, in order, then the named ones by table slot (so by the order in
 * which their names were first negotiated). Everything here runs on the progress thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "async_internal.h"

#define JOINED UINT64_MAX   /* a joined rank's count of unnamed requests: all of them */
#define TABLE_SOFT_MAX 4096 /* names kept in the table before the least recently used go */

typedef struct {
    size_t slot;
    struct ddl_request_s *r;
} slotted_t;

typedef struct {
    char **name;
    uint64_t *hash;
    uint64_t *used; /* the last cycle that named it: least recently used names go first */
    uint32_t *gen;  /* bumped when a slot is given to another name */
    size_t n, cap;
    ddl_namemap_t map; /* name -> slot */
} nametab_t;

/* An engine's negotiation state: its table of names and the buffers it reuses. */
struct ddl_negstate_s {
    nametab_t tab;
    uint64_t cycle_no;
    uint8_t *ready_buf, *have_buf;
    size_t ready_cap, have_cap;
    void *blob_buf, *all_buf;
    size_t blob_cap, all_cap;
    slotted_t *named_buf;
    size_t named_cap;
};

/* The engine's state, made at its first negotiation (NULL: no memory). */
static struct ddl_negstate_s *state(ddl_engine_t *e) {
    if (!e->neg) e->neg = calloc(1, sizeof *e->neg);
    return e->neg;
}

static long req_slot(struct ddl_negstate_s *N, struct ddl_request_s *r) {
    nametab_t *T = &N->tab;
    if (r->slot_gen && r->slot < T->n && T->gen[r->slot] == r->slot_gen) return (long)r->slot;
    ddl_nm_entry_t *e = ddl_nm_find(&T->map, r->name, r->hash);
    if (!e) return -1;
    r->slot = e->val;
    r->slot_gen = T->gen[e->val];
    return (long)e->val;
}

/* A slot for a name no slot holds: a new one, or the least recently used one not named
 * in this cycle. Every rank calls this with the same names in the same order. */
static long tab_assign(struct ddl_negstate_s *N, const char *name, uint64_t h) {
    nametab_t *T = &N->tab;
    uint64_t cycle_no = N->cycle_no;
    size_t s = T->n, before = T->map.n;
    if (T->n >= TABLE_SOFT_MAX) {
        uint64_t oldest = cycle_no;
        for (size_t i = 0; i < T->n; i++)
            if (T->used[i] < oldest) oldest = T->used[i], s = i;
    }
    if (s == T->n && T->n == T->cap) {
        size_t cap = T->cap ? 2 * T->cap : 64;
        char **nn = realloc(T->name, cap * sizeof *nn);
        if (nn) T->name = nn;
        uint64_t *nh = realloc(T->hash, cap * sizeof *nh);
        if (nh) T->hash = nh;
        uint64_t *nu = realloc(T->used, cap * sizeof *nu);
        if (nu) T->used = nu;
        uint32_t *ng = realloc(T->gen, cap * sizeof *ng);
        if (ng) T->gen = ng;
        if (!nn || !nh || !nu || !ng) return -1;
        T->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return -1;
    if (s < T->n) { /* evict */
        ddl_nm_entry_t *e = ddl_nm_find(&T->map, T->name[s], T->hash[s]);
        if (e) ddl_nm_del(&T->map, e);
        free(T->name[s]);
        T->gen[s]++;
        if (!T->gen[s]) T->gen[s] = 1;
    } else {
        T->gen[s] = 1;
        T->n++;
    }
    T->name[s] = copy;
    T->hash[s] = h;
    T->used[s] = cycle_no;
    if (ddl_nm_put(&T->map, copy, h, s) != 0) return -1;
    __atomic_add_fetch(&ddl_stat_names, (uint64_t)T->map.n - (uint64_t)before, __ATOMIC_RELAXED);
    return (long)s;
}

int ddl_reqvec_push(ddl_reqvec_t *v, struct ddl_request_s *r) {
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
static ddl_status_t full_exchange(ddl_engine_t *eng, const ddl_reqvec_t *snap,
                                  uint64_t ready_unnamed, ddl_reqvec_t *stalled, int joined) {
    struct ddl_negstate_s *N = eng->neg;
    int p = eng->ctx->world.size;
    __atomic_add_fetch(&ddl_stat_full_cycles, 1, __ATOMIC_RELAXED);
    /* My report: [unnamed count][named count][names, each NUL-terminated]. */
    size_t len = 2 * sizeof(uint64_t);
    uint64_t unnamed = 0, named = 0;
    for (size_t i = 0; i < snap->n; i++) {
        if (snap->v[i]->name) len += strlen(snap->v[i]->name) + 1, named++;
        else unnamed++;
    }
    if (joined) unnamed = JOINED; /* a joined rank has every request (see ddl_negotiate) */
    int64_t mylen = (int64_t)len;
    int64_t *lens = malloc((size_t)p * sizeof *lens);
    const char **start = malloc((size_t)p * sizeof *start);
    uint64_t *unn = malloc((size_t)p * sizeof *unn), *nnamed = malloc((size_t)p * sizeof *nnamed);
    uint8_t *flag = malloc((size_t)p);
    ddl_status_t st = DDL_SUCCESS;
    if (!lens || !start || !unn || !nnamed || !flag)
        st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    if (st == DDL_SUCCESS) st = ddl_allgather_ctx_sig(
            eng->ctx, &mylen, lens, 1, DDL_INT64,
            ddl_signature(DDL_COLL_NEGOTIATE, 1, DDL_INT64, 0, 1));
    size_t longest = 0;
    for (int i = 0; st == DDL_SUCCESS && i < p; i++)
        if ((size_t)lens[i] > longest) longest = (size_t)lens[i];
    char *blob = NULL, *all = NULL;
    if (st == DDL_SUCCESS) {
        blob = grow(&N->blob_buf, &N->blob_cap, longest);
        all = grow(&N->all_buf, &N->all_cap, longest * (size_t)p);
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
        st = ddl_allgather_ctx_sig(eng->ctx, blob, all, longest, DDL_UINT8,
                                   ddl_signature(DDL_COLL_NEGOTIATE, longest, DDL_UINT8, 0, 2));
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
            ddl_nm_entry_t *e = ddl_nm_find(&N->tab.map, c, ddl_name_hash(c));
            if (e) N->tab.used[e->val] = N->cycle_no;
        }
    }
    for (int r = 0; st == DDL_SUCCESS && r < p; r++) {
        const char *c = start[r];
        for (uint64_t k = 0; k < nnamed[r] && st == DDL_SUCCESS; k++, c += strlen(c) + 1) {
            uint64_t h = ddl_name_hash(c);
            if (!ddl_nm_find(&N->tab.map, c, h) && tab_assign(N, c, h) < 0)
                st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the table of names");
        }
    }
    size_t nslots = N->tab.n;
    uint8_t *ready =
        st == DDL_SUCCESS ? grow((void **)&N->ready_buf, &N->ready_cap, nslots) : NULL;
    uint32_t *cnt = st == DDL_SUCCESS ? calloc(nslots ? nslots : 1, sizeof *cnt) : NULL;
    if (st == DDL_SUCCESS && (!ready || !cnt))
        st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    for (int r = 0; st == DDL_SUCCESS && r < p; r++) {
        const char *c = start[r];
        if (unn[r] == JOINED) { /* counts as having every name */
            for (size_t s = 0; s < nslots; s++) cnt[s]++;
            continue;
        }
        for (uint64_t k = 0; k < nnamed[r]; k++, c += strlen(c) + 1)
            cnt[ddl_nm_find(&N->tab.map, c, ddl_name_hash(c))->val]++;
    }
    for (size_t s = 0; st == DDL_SUCCESS && s < nslots; s++) ready[s] = cnt[s] == (uint32_t)p;
    /* Stalls: my requests that some rank has not submitted within DDL_TIMEOUT. */
    double now = ddl_now();
    uint64_t my_unnamed = 0;
    for (size_t i = 0; st == DDL_SUCCESS && i < snap->n; i++) {
        struct ddl_request_s *r = snap->v[i];
        uint64_t pos = r->name ? 0 : my_unnamed++;
        int is_ready = r->name ? ready[req_slot(N, r)] : pos < ready_unnamed;
        if (is_ready || r->kind == REQ_JOIN || now - r->submitted <= ddl_req_timeout(r))
            continue;
        for (int k = 0; k < p; k++) {
            if (unn[k] == JOINED) {
                flag[k] = 0;
            } else if (r->name) {
                flag[k] = 1;
                const char *c = start[k];
                for (uint64_t m = 0; m < nnamed[k]; m++, c += strlen(c) + 1)
                    if (strcmp(c, r->name) == 0) flag[k] = 0;
            } else {
                flag[k] = unn[k] <= pos;
            }
        }
        char who[256], what[300], world[200] = "";
        int missing = 0;
        for (int k = 0; k < p; k++) missing += flag[k] != 0;
        rank_list(flag, p, who, sizeof who);
        const int *mem = eng->ctx->members;
        if (mem) { /* a communicator's ranks: say which processes those are */
            int w[64], nw = 0;
            for (int k = 0; k < p && nw < 64; k++)
                if (flag[k]) w[nw++] = mem[k];
            for (int a = 1; a < nw; a++) /* sorted for ddl_format_ranks */
                for (int b = a; b > 0 && w[b - 1] > w[b]; b--) {
                    int t = w[b];
                    w[b] = w[b - 1];
                    w[b - 1] = t;
                }
            char list[160];
            ddl_format_ranks(list, sizeof list, w, nw);
            snprintf(world, sizeof world, " of the communicator (world rank%s %s)",
                     nw == 1 ? "" : "s", list);
        }
        ddl_req_describe(r, what, sizeof what);
        snprintf(r->error, sizeof r->error,
                 "rank %d: %s was not submitted by rank%s %s%s within %s (%.0f s): "
                 "every rank must submit the same named requests, and the same number of "
                 "unnamed ones, or a rank stopped early",
                 ddl_g.rank, what, missing == 1 ? "" : "s", who, world,
                 r->timeout > 0 ? "the timeout set for this call" : "DDL_TIMEOUT",
                 ddl_req_timeout(r));
        if (ddl_reqvec_push(stalled, r) != 0) st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory");
    }
    free(cnt);
    free(lens);
    free(start);
    free(unn);
    free(nnamed);
    free(flag);
    return st;
}


static int by_slot(const void *a, const void *b) {
    size_t x = ((const slotted_t *)a)->slot, y = ((const slotted_t *)b)->slot;
    return x < y ? -1 : x > y;
}

/* What a rank still running tells the joined ranks about each request of the batch. */
typedef struct {
    int32_t kind, dtype, op, root, ndim;
    int64_t slot; /* -1: unnamed */
    uint64_t count, sig, seq;
    double timeout;
    int64_t dims[32];
} join_desc_t;

void ddl_req_free_synthetic(struct ddl_request_s *r) {
    if (r->send != DDL_IN_PLACE) free((void *)r->send);
    free(r->recv);
    free(r->gathered);
    free(r->counts);
    free(r);
}

/* A joined rank's stand-in for request d of the others: the same signature, with zeros
 * (or nothing, for an allgatherv) as its contribution and a result nobody reads. */
static struct ddl_request_s *stand_in(ddl_engine_t *eng, const join_desc_t *d) {
    struct ddl_negstate_s *N = eng->neg;
    int nd = d->ndim > 0 ? (d->ndim < 32 ? d->ndim : 32) : 0;
    struct ddl_request_s *r = calloc(1, sizeof *r + (size_t)nd * sizeof(int64_t));
    if (!r) return NULL;
    int64_t *shape = (int64_t *)(void *)(r + 1);
    for (int i = 0; i < nd; i++) shape[i] = d->dims[i];
    r->eng = eng;
    r->shape = shape;
    r->ndim = d->ndim;
    r->kind = d->kind;
    r->dtype = (ddl_dtype_t)d->dtype;
    r->op = (ddl_op_t)d->op;
    r->root = d->root;
    r->count = (size_t)d->count;
    r->sig = d->sig;
    r->seq = d->seq;
    r->timeout = d->timeout;
    r->synthetic = 1;
    r->submitted = ddl_now();
    if (d->slot >= 0 && (size_t)d->slot < N->tab.n) {
        r->name = N->tab.name[d->slot];
        r->hash = N->tab.hash[d->slot];
    }
    size_t es = ddl_dtype_size(r->dtype), n = r->count, p = (size_t)eng->ctx->world.size;
    r->send = DDL_IN_PLACE;
    switch (r->kind) {
    case REQ_ALLREDUCE:
    case REQ_BROADCAST: r->recv = calloc(n ? n : 1, es); break;
    case REQ_ALLGATHER:
        r->send = calloc(n ? n : 1, es);
        r->recv = malloc((n ? n : 1) * es * p);
        break;
    case REQ_REDUCE_SCATTER:
        r->send = calloc((n ? n : 1) * p, es);
        r->recv = malloc((n ? n : 1) * es);
        break;
    case REQ_ALLGATHERV: r->count = 0, r->send = NULL; return r;
    default: free(r); return NULL;
    }
    if (!r->recv || !r->send) {
        ddl_req_free_synthetic(r);
        return NULL;
    }
    return r;
}

/* Some rank has joined and some has not: the lowest rank still running describes its
 * batch to every rank, and each joined rank runs stand-ins for it (the requests the
 * joined rank has queued itself are only its join, which is not ready yet). */
static ddl_status_t join_fill(ddl_engine_t *eng, ddl_reqvec_t *batch, int joined) {
    ddl_ctx_t *ctx = eng->ctx;
    struct ddl_negstate_s *N = eng->neg;
    int p = ctx->world.size, me_rank = ctx->world.rank;
    uint8_t me = (uint8_t)joined, *flags = malloc((size_t)p);
    if (!flags) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the join");
    ddl_status_t st = ddl_allgather_ctx_sig(ctx, &me, flags, 1, DDL_UINT8, 0);
    int root = 0;
    while (root < p && flags[root]) root++;
    free(flags);
    DDL_CHECK(st);
    if (root == p) return DDL_SUCCESS; /* cannot happen: not every rank has joined */
    int64_t n = me_rank == root ? (int64_t)batch->n : 0;
    DDL_CHECK(ddl_broadcast_ctx_sig(ctx, &n, 1, DDL_INT64, root, 0));
    if (n == 0) return DDL_SUCCESS;
    join_desc_t *d = calloc((size_t)n, sizeof *d);
    if (!d) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the join");
    if (me_rank == root) {
        for (int64_t i = 0; i < n; i++) {
            const struct ddl_request_s *r = batch->v[i];
            d[i] = (join_desc_t){r->kind, (int32_t)r->dtype, (int32_t)r->op, r->root, r->ndim,
                                 r->name ? req_slot(N, (struct ddl_request_s *)r) : -1,
                                 r->count, r->sig, r->seq, r->timeout, {0}};
            for (int k = 0; k < r->ndim && k < 32; k++) d[i].dims[k] = r->shape[k];
        }
    }
    st = ddl_broadcast_ctx_sig(ctx, d, (size_t)n * sizeof *d, DDL_UINT8, root, 0);
    /* Horovod's join covers allreduce only: any other collective the running ranks
     * submit while a rank has joined fails on each of them (Horovod raises "... is not
     * supported with Join"), and the joined ranks make no stand-in for it. */
    if (st == DDL_SUCCESS && !joined)
        for (size_t i = 0; i < batch->n; i++)
            batch->v[i]->refused = batch->v[i]->kind != REQ_ALLREDUCE;
    if (st == DDL_SUCCESS && joined) {
        batch->n = 0;
        for (int64_t i = 0; i < n && st == DDL_SUCCESS; i++) {
            if (d[i].kind != REQ_ALLREDUCE) continue;
            struct ddl_request_s *r = stand_in(eng, &d[i]);
            if (!r || ddl_reqvec_push(batch, r) != 0) {
                if (r) ddl_req_free_synthetic(r);
                st = ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a joined rank's request");
            }
        }
    }
    free(d);
    return st;
}

/* Agree with every rank on this cycle's batch (ready requests, in the agreed order) and
 * find this rank's stalled requests. *more: some rank keeps requests queued after this
 * cycle (and will start another negotiation, which idle ranks then look out for). */
ddl_status_t ddl_negotiate(ddl_engine_t *eng, const ddl_reqvec_t *snap, ddl_reqvec_t *batch,
                           ddl_reqvec_t *stalled, int *more) {
    struct ddl_negstate_s *N = state(eng);
    if (!N) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    N->cycle_no++; /* every rank counts the same cycles: the table's LRU order agrees */
    size_t nslots = N->tab.n;
    /* One byte per table slot (1: queued here), then one byte that is 0 when this rank
     * needs the full exchange; all combined with min. */
    uint8_t *have = grow((void **)&N->have_buf, &N->have_cap, nslots + 3);
    if (!have) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the negotiation");
    memset(have, 0, nslots);
    uint64_t unnamed = 0;
    int full = 0, joined = 0;
    double now = ddl_now();
    for (size_t i = 0; i < snap->n; i++) {
        struct ddl_request_s *r = snap->v[i];
        if (r->kind == REQ_JOIN) {
            joined = 1;
            if (!r->join_cycle) r->join_cycle = N->cycle_no;
        }
        if (!r->name) {
            unnamed++;
        } else {
            long s = req_slot(N, r);
            if (s >= 0) {
                have[s] = 1;
            } else if (!full) {
                full = 1;
                ddl_log(2, "negotiation %llu: '%.200s' is not in the table of names yet",
                        (unsigned long long)N->cycle_no, r->name);
            }
        }
        if (r->kind != REQ_JOIN && now - r->submitted > ddl_req_timeout(r) && !full) {
            full = 1;
            ddl_log(2, "negotiation %llu: a request waited longer than DDL_TIMEOUT",
                    (unsigned long long)N->cycle_no);
        }
    }
    /* A joined rank has every request: 1 for every slot, and every unnamed one. */
    if (joined) memset(have, 1, nslots);
    have[nslots] = !full;
    have[nslots + 1] = !joined; /* min: 0 when some rank has joined */
    have[nslots + 2] = joined;  /* min: 1 when every rank has joined */
    /* The recursive doubling folds ranks beyond the largest power of two in: an even rank
     * r < 2*rem sends first, to r+1, and hears back only at the end, so an idle one would
     * never see a negotiation start. Its partner rings first (DDL_TAG_BELL); the even rank
     * takes the ring after the exchange, by when it has surely arrived. */
    const ddl_mpicomm_t *w = &eng->ctx->world;
    int pof2 = 1;
    while (pof2 * 2 <= w->size) pof2 *= 2;
    int folded = w->rank < 2 * (w->size - pof2), odd = w->rank % 2;
    if (folded && odd) DDL_CHECK(ddl_sendrecv(w, NULL, 0, w->rank - 1, NULL, 0, -1, DDL_TAG_BELL));
    ddl_header_t h;
    ddl_header_init(&h, ddl_signature(DDL_COLL_NEGOTIATE, nslots, DDL_UINT8, DDL_MIN, 0), 0);
    h.count_min = joined ? JOINED : unnamed; /* min: the unnamed requests every rank has */
    h.count_max = snap->n;  /* combined with max: the most requests any rank has queued */
    DDL_CHECK(ddl_rd_allreduce_checked(w, &h, have, nslots + 3, DDL_UINT8, DDL_MIN));
    int some_joined = !have[nslots + 1], all_joined = have[nslots + 2];
    if (folded && !odd) DDL_CHECK(ddl_sendrecv(w, NULL, 0, -1, NULL, 0, w->rank + 1, DDL_TAG_BELL));
    if (h.sig_min != h.sig_max)
        return ddl_fail(DDL_ERR_INTERNAL,
                        "asynchronous negotiation: the ranks' tables of names differ (%zu names "
                        "here): a bug in libddl, or ranks running different libddl versions",
                        nslots);
    uint64_t ready_unnamed = h.count_min;
    const uint8_t *ready = have;
    *more = 0;
    if (!have[nslots]) {
        DDL_CHECK(full_exchange(eng, snap, ready_unnamed, stalled, joined));
        ready = N->ready_buf;
        *more = 1;
    }
    /* The batch: unnamed ones in order, then named ones by slot. */
    size_t nn = 0;
    uint64_t taken = 0;
    for (size_t i = 0; i < snap->n; i++) {
        struct ddl_request_s *r = snap->v[i];
        if (!r->name) {
            if (taken++ < ready_unnamed && ddl_reqvec_push(batch, r) != 0)
                return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a batch");
            continue;
        }
        long s = req_slot(N, r);
        if (s < 0 || !ready[s]) continue;
        slotted_t *nb = grow((void **)&N->named_buf, &N->named_cap, (nn + 1) * sizeof *nb);
        if (!nb) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a batch");
        nb[nn++] = (slotted_t){(size_t)s, r};
    }
    if (nn > 1) qsort(N->named_buf, nn, sizeof *N->named_buf, by_slot);
    for (size_t i = 0; i < nn; i++) {
        N->tab.used[N->named_buf[i].slot] = N->cycle_no;
        if (ddl_reqvec_push(batch, N->named_buf[i].r) != 0)
            return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a batch");
    }
    /* The batch is the same on every rank: whoever had more queued keeps some. */
    if (h.count_max > batch->n) *more = 1;
    if (some_joined && !all_joined) DDL_CHECK(join_fill(eng, batch, joined));
    return DDL_SUCCESS;
}

void ddl_negotiate_free(ddl_engine_t *eng) {
    struct ddl_negstate_s *N = eng->neg;
    if (!N) return;
    __atomic_sub_fetch(&ddl_stat_names, (uint64_t)N->tab.map.n, __ATOMIC_RELAXED);
    for (size_t i = 0; i < N->tab.n; i++) free(N->tab.name[i]);
    free(N->tab.name);
    free(N->tab.hash);
    free(N->tab.used);
    free(N->tab.gen);
    ddl_nm_free(&N->tab.map);
    free(N->have_buf);
    free(N->ready_buf);
    free(N->blob_buf);
    free(N->all_buf);
    free(N->named_buf);
    free(N);
    eng->neg = NULL;
}

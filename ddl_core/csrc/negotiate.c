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

#define TABLE_SOFT_MAX 4096 /* names kept in the table before the least recently used go */

static struct {
    char **name;
    uint64_t *hash;
    uint64_t *used; /* the last cycle that named it: least recently used names go first */
    uint32_t *gen;  /* bumped when a slot is given to another name */
    size_t n, cap;
    ddl_namemap_t map;  /* name -> slot */
} tab;
static uint64_t cycle_no;

static long req_slot(struct ddl_request_s *r) {
    if (r->slot_gen && r->slot < tab.n && tab.gen[r->slot] == r->slot_gen) return (long)r->slot;
    ddl_nm_entry_t *e = ddl_nm_find(&tab.map, r->name, r->hash);
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
        ddl_nm_entry_t *e = ddl_nm_find(&tab.map, tab.name[s], tab.hash[s]);
        if (e) ddl_nm_del(&tab.map, e);
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
    if (ddl_nm_put(&tab.map, copy, h, s) != 0) return -1;
    __atomic_store_n(&ddl_stat_names, (uint64_t)tab.map.n, __ATOMIC_RELAXED);
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
static ddl_status_t full_exchange(const ddl_reqvec_t *snap, uint64_t ready_unnamed,
                                  ddl_reqvec_t *stalled) {
    int p = ddl_g.size;
    __atomic_add_fetch(&ddl_stat_full_cycles, 1, __ATOMIC_RELAXED);
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
    if (st == DDL_SUCCESS) st = ddl_allgather_ctx_sig(
            &ddl_g.progress, &mylen, lens, 1, DDL_INT64,
            ddl_signature(DDL_COLL_NEGOTIATE, 1, DDL_INT64, 0, 1));
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
        st = ddl_allgather_ctx_sig(&ddl_g.progress, blob, all, longest, DDL_UINT8,
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
            ddl_nm_entry_t *e = ddl_nm_find(&tab.map, c, ddl_name_hash(c));
            if (e) tab.used[e->val] = cycle_no;
        }
    }
    for (int r = 0; st == DDL_SUCCESS && r < p; r++) {
        const char *c = start[r];
        for (uint64_t k = 0; k < nnamed[r] && st == DDL_SUCCESS; k++, c += strlen(c) + 1) {
            uint64_t h = ddl_name_hash(c);
            if (!ddl_nm_find(&tab.map, c, h) && tab_assign(c, h) < 0)
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
            cnt[ddl_nm_find(&tab.map, c, ddl_name_hash(c))->val]++;
    }
    for (size_t s = 0; st == DDL_SUCCESS && s < tab.n; s++) ready[s] = cnt[s] == (uint32_t)p;
    /* Stalls: my requests that some rank has not submitted within DDL_TIMEOUT. */
    double now = ddl_now();
    uint64_t my_unnamed = 0;
    for (size_t i = 0; st == DDL_SUCCESS && i < snap->n; i++) {
        struct ddl_request_s *r = snap->v[i];
        uint64_t pos = r->name ? 0 : my_unnamed++;
        int is_ready = r->name ? ready[req_slot(r)] : pos < ready_unnamed;
        if (is_ready || now - r->submitted <= ddl_req_timeout(r)) continue;
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
        int missing = 0;
        for (int k = 0; k < p; k++) missing += flag[k] != 0;
        rank_list(flag, p, who, sizeof who);
        ddl_req_describe(r, what, sizeof what);
        snprintf(r->error, sizeof r->error,
                 "rank %d: %s was not submitted by rank%s %s within %s (%.0f s): "
                 "every rank must submit the same named requests, and the same number of "
                 "unnamed ones, or a rank stopped early",
                 ddl_g.rank, what, missing == 1 ? "" : "s", who,
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
 * cycle (and will start another negotiation, which idle ranks then look out for). */
ddl_status_t ddl_negotiate(const ddl_reqvec_t *snap, ddl_reqvec_t *batch, ddl_reqvec_t *stalled,
                           int *more) {
    cycle_no++; /* every rank counts the same cycles: the table's LRU order agrees */
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
        if (now - r->submitted > ddl_req_timeout(r) && !full) {
            full = 1;
            ddl_log(2, "negotiation %llu: a request waited longer than DDL_TIMEOUT",
                    (unsigned long long)cycle_no);
        }
    }
    have[nslots] = !full;
    /* The recursive doubling folds ranks beyond the largest power of two in: an even rank
     * r < 2*rem sends first, to r+1, and hears back only at the end, so an idle one would
     * never see a negotiation start. Its partner rings first (DDL_TAG_BELL); the even rank
     * takes the ring after the exchange, by when it has surely arrived. */
    const ddl_mpicomm_t *w = &ddl_g.progress.world;
    int pof2 = 1;
    while (pof2 * 2 <= w->size) pof2 *= 2;
    int folded = w->rank < 2 * (w->size - pof2), odd = w->rank % 2;
    if (folded && odd) DDL_CHECK(ddl_sendrecv(w, NULL, 0, w->rank - 1, NULL, 0, -1, DDL_TAG_BELL));
    ddl_header_t h;
    ddl_header_init(&h, ddl_signature(DDL_COLL_NEGOTIATE, nslots, DDL_UINT8, DDL_MIN, 0), 0);
    h.count_min = unnamed;  /* combined with min: the unnamed requests every rank has */
    h.count_max = snap->n;  /* combined with max: the most requests any rank has queued */
    DDL_CHECK(ddl_rd_allreduce_checked(w, &h, have, nslots + 1, DDL_UINT8, DDL_MIN));
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
            if (taken++ < ready_unnamed && ddl_reqvec_push(batch, r) != 0)
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
        if (ddl_reqvec_push(batch, named_buf[i].r) != 0)
            return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a batch");
    }
    /* The batch is the same on every rank: whoever had more queued keeps some. */
    if (h.count_max > batch->n) *more = 1;
    return DDL_SUCCESS;
}

void ddl_negotiate_free(void) {
    for (size_t i = 0; i < tab.n; i++) free(tab.name[i]);
    free(tab.name);
    free(tab.hash);
    free(tab.used);
    free(tab.gen);
    ddl_nm_free(&tab.map);
    memset(&tab, 0, sizeof tab);
    free(have_buf), have_buf = NULL, have_cap = 0;
    free(ready_buf), ready_buf = NULL, ready_cap = 0;
    free(blob_buf), blob_buf = NULL, blob_cap = 0;
    free(all_buf), all_buf = NULL, all_cap = 0;
    free(named_buf), named_buf = NULL, named_cap = 0;
    cycle_no = 0;
}

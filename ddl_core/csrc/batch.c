/* Running a batch of asynchronous requests: fusion, and keeping every rank in step when
 * requests differ between ranks.
 *
 * Consecutive allreduces of one dtype and op are packed into one fusion buffer of at most
 * DDL_FUSION_THRESHOLD bytes, reduced once and unpacked. Each request carries a signature
 * of everything the ranks must agree on, checked by every collective before data moves,
 * so every rank sees the same verdict at the same collective. Ranks whose requests differ
 * may group a batch differently (a dtype that differs splits a fusion group on one rank
 * only); the first collective where the groupings differ is then a mismatch on every
 * rank, at the same position of the batch. From there every rank runs the rest of the
 * batch one request at a time, so each request fails or succeeds on its own merits, and
 * for each one that fails, all ranks exchange its description and raise the same message
 * naming what differs. No rank is left with a request the others have dropped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "async_internal.h"

static ddl_status_t run_allgatherv(struct ddl_request_s *r) {
    ddl_ctx_t *ctx = r->eng->ctx;
    int p = ctx->world.size;
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
    ddl_ctx_t *ctx = r->eng->ctx;
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
    case REQ_JOIN: { /* every rank has joined: the last to join is the latest first sight */
        int p = ctx->world.size;
        int64_t mine = (int64_t)r->join_cycle, *all = malloc((size_t)p * sizeof *all);
        if (!all) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for %d join cycles", p);
        ddl_status_t st = ddl_allgather_ctx_sig(ctx, &mine, all, 1, DDL_INT64, r->sig);
        if (st == DDL_SUCCESS) {
            int last = 0;
            for (int i = 1; i < p; i++)
                if (all[i] >= all[last]) last = i;
            r->root = last;
        }
        free(all);
        return st;
    }
    default: return ddl_fail(DDL_ERR_INTERNAL, "unknown request kind %d", r->kind);
    }
}

/* Run n allreduces as one fused allreduce. Its signature covers every member's, so a
 * member that differs between ranks, or a grouping that differs, is a mismatch. */
static ddl_status_t run_fused(struct ddl_request_s **reqs, size_t n) {
    size_t es = ddl_dtype_size(reqs[0]->dtype), total = 0;
    uint64_t sig = ddl_mix64(((uint64_t)DDL_COLL_FUSED << 56) ^ n);
    for (size_t i = 0; i < n; i++) {
        total += reqs[i]->count;
        sig = ddl_mix64(sig ^ reqs[i]->sig);
    }
    __atomic_add_fetch(&ddl_stat_fused_buffers, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ddl_stat_fused_requests, n, __ATOMIC_RELAXED);
    char *buf = ddl_scratch(DDL_SCRATCH_FUSION, total * es);
    if (!buf) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for a %zu-byte fusion buffer",
                              total * es);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const void *src = reqs[i]->send == DDL_IN_PLACE ? reqs[i]->recv : reqs[i]->send;
        memcpy(buf + off, src, ddl_req_bytes(reqs[i]));
        off += ddl_req_bytes(reqs[i]);
    }
    DDL_CHECK(ddl_allreduce_ctx(reqs[0]->eng->ctx, buf, buf, total, reqs[0]->dtype, reqs[0]->op,
                                sig));
    off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(reqs[i]->recv, buf + off, ddl_req_bytes(reqs[i]));
        off += ddl_req_bytes(reqs[i]);
    }
    return DDL_SUCCESS;
}

static int fusable(const struct ddl_request_s *a, const struct ddl_request_s *b) {
    return a->kind == REQ_ALLREDUCE && b->kind == REQ_ALLREDUCE && a->dtype == b->dtype &&
           a->op == b->op && a->timeout == b->timeout;
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
    int p = r->eng->ctx->world.size;
    req_desc_t *all = malloc((size_t)p * sizeof *all);
    if (!all) return ddl_fail_verbatim(DDL_ERR_MISMATCH, first);
    ddl_status_t st = ddl_allgather_ctx_sig(r->eng->ctx, &me, all, sizeof me, DDL_UINT8, 0);
    if (st != DDL_SUCCESS) {
        free(all);
        return st;
    }
    char what[300];
    ddl_req_describe(r, what, sizeof what);
    for (int i = 0; i < p; i++) /* from our own peers, but never index out of range */
        if (all[i].kind < 0 || all[i].kind > REQ_JOIN) all[i].kind = 0;
    const char *kind = ddl_kind_word[all[0].kind];
    int gather = all[0].kind == REQ_ALLGATHER || all[0].kind == REQ_ALLGATHERV;
    char a[160] = "", b[160] = "", topic[64] = "";
    int other = -1;
    for (int i = 1; i < p && other < 0; i++) {
        const req_desc_t *x = &all[0], *y = &all[i];
        if (x->kind != y->kind) {
            snprintf(topic, sizeof topic, "operations");
            snprintf(a, sizeof a, "called %s", ddl_kind_name[x->kind]);
            snprintf(b, sizeof b, "called %s", ddl_kind_name[y->kind]);
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

/* A request that is not an allreduce while a rank has joined (negotiate.c) fails. */
static void refuse(struct ddl_request_s *r) {
    char what[300];
    ddl_req_describe(r, what, sizeof what);
    ddl_req_finish(r,
                   ddl_fail(DDL_ERR_UNSUPPORTED,
                            "%s is not supported while a rank has joined (join covers allreduce "
                            "only, as Horovod's does): run it before any rank joins",
                            what),
                   NULL);
}

/* Run a batch (the same requests, in the same order, on every rank). */
void ddl_run_batch(struct ddl_request_s **reqs, size_t n) {
    for (size_t i = 0; i < n;) {
        struct ddl_request_s *r = reqs[i];
        if (r->refused) {
            refuse(r);
            i++;
            continue;
        }
        size_t j = i + 1, bytes = ddl_req_bytes(r);
        if (r->kind == REQ_ALLREDUCE && bytes < ddl_g.fusion_threshold) {
            while (j < n && fusable(r, reqs[j]) &&
                   bytes + ddl_req_bytes(reqs[j]) <= ddl_g.fusion_threshold) {
                bytes += ddl_req_bytes(reqs[j]);
                j++;
            }
        }
        ddl_set_thread_timeout(r->timeout); /* the deadline it was submitted with */
        double t0 = ddl_now();
        ddl_status_t st = j - i > 1 ? run_fused(reqs + i, j - i) : run_one(r);
        double t1 = ddl_now();
        for (size_t k = i; k < j; k++) {
            reqs[k]->t_started = t0;
            reqs[k]->t_finished = t1;
            reqs[k]->fused = j - i;
            reqs[k]->fused_bytes = bytes;
        }
        if (st == DDL_ERR_MISMATCH) {
            /* Every rank is here, at request i (see the top of the file): run the rest one
             * at a time, so requests fail or succeed each on their own. */
            for (size_t k = i; k < n; k++) {
                if (reqs[k]->refused) {
                    refuse(reqs[k]);
                    continue;
                }
                ddl_set_thread_timeout(reqs[k]->timeout);
                reqs[k]->t_started = ddl_now();
                st = run_one(reqs[k]);
                reqs[k]->t_finished = ddl_now();
                reqs[k]->fused = 1;
                reqs[k]->fused_bytes = ddl_req_bytes(reqs[k]);
                if (st == DDL_ERR_MISMATCH) st = explain(reqs[k]);
                ddl_req_finish(reqs[k], st, NULL);
            }
            return;
        }
        for (size_t k = i; k < j; k++) ddl_req_finish(reqs[k], st, NULL);
        i = j;
    }
}


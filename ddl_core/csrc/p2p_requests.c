/* Non-blocking point-to-point on a communicator: ddl_comm_isend / ddl_comm_irecv.
 *
 * They are ddl_request_t's like the asynchronous collectives (ddl_test, ddl_wait,
 * ddl_request_free), but need no negotiation and no progress thread: an isend is an
 * MPI_Isend on the communicator's point-to-point communicator, and an irecv waits for its
 * message with MPI_Improbe (non-overtaking: the first message from the source with the tag)
 * and receives it with MPI_Imrecv, so a message of another size is received whole into a
 * spill buffer and reported with both sizes instead of being truncated (the same rule as
 * ddl_comm_recv). MPI matches receives in the order they were posted; probing them instead
 * keeps that order by hand: a communicator lists its unmatched irecvs in posting order,
 * and a probe walks the list from the oldest, never letting a younger receive take a
 * message while an older one with the same source and tag still waits. The deadline is the communicator's timeout (else the thread's, else
 * DDL_TIMEOUT) counted from the call; ddl_test / ddl_wait make the progress, so a request
 * is completed by one thread at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "async_internal.h"

static void finish(struct ddl_request_s *r, ddl_status_t st, const char *msg) {
    r->status = st;
    if (st != DDL_SUCCESS) snprintf(r->error, sizeof r->error, "%s", msg ? msg : ddl_last_error());
    free(r->spill);
    r->spill = NULL;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
}

/* Take r off its communicator's list (under its recv_lock). */
static void unlist(struct ddl_request_s *r) {
    if (!r->listed) return;
    for (struct ddl_request_s **pp = &r->comm->recvs; *pp; pp = &(*pp)->pnext)
        if (*pp == r) {
            *pp = r->pnext;
            break;
        }
    r->pnext = NULL;
    r->listed = 0;
}

/* Probe for q's message and start receiving it; 0 when none is there. */
static int try_match(struct ddl_request_s *q) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status mst;
    int rc = MPI_Improbe(q->peer, q->tag, q->p2p, &flag, &msg, &mst);
    if (rc != MPI_SUCCESS) {
        finish(q, ddl_mpi_fail(rc, "MPI_Improbe"), NULL);
        return 1;
    }
    if (!flag) return 0;
    MPI_Get_count(&mst, MPI_BYTE, &q->got);
    void *into = q->recv;
    int n = q->got;
    if ((size_t)n != q->want) into = q->spill = malloc(n > 0 ? (size_t)n : 1);
    if (!into) { /* matched, so it must be taken: MPI reports the truncation at the test */
        into = q->recv;
        n = (int)q->want;
    }
    rc = MPI_Imrecv(into, n, MPI_BYTE, &msg, &q->mreq);
    if (rc != MPI_SUCCESS) finish(q, ddl_mpi_fail(rc, "MPI_Imrecv"), NULL);
    q->matched = 1;
    return 1;
}

/* Match r and every older unmatched irecv of its communicator that can be, oldest first;
 * a younger receive is not probed while an older one with the same source and tag waits. */
static void match_in_order(struct ddl_request_s *r) {
    struct ddl_comm_s *c = r->comm;
    pthread_mutex_lock(&c->recv_lock);
    enum { KEYS = 32 };
    int keys[KEYS][2], nkeys = 0, overflow = 0;
    for (struct ddl_request_s *q = c->recvs, *next; q; q = next) {
        next = q->pnext;
        int blocked = overflow;
        for (int k = 0; k < nkeys && !blocked; k++)
            blocked = keys[k][0] == q->peer && keys[k][1] == q->tag;
        if (!blocked && try_match(q)) {
            unlist(q);
        } else if (nkeys < KEYS) {
            keys[nkeys][0] = q->peer;
            keys[nkeys][1] = q->tag;
            nkeys++;
        } else {
            overflow = 1; /* too many keys waiting: match nothing younger this time */
        }
        if (q == r) break;
    }
    pthread_mutex_unlock(&c->recv_lock);
}

/* Give up on r: an unmatched receive leaves nothing behind; a send or a matched receive
 * stays with MPI, which completes it if the peer ever takes part (its buffer must then stay
 * valid: the job is usually beyond repair by then anyway). */
static void abandon(struct ddl_request_s *r) {
    if (r->kind == REQ_SEND || r->matched) {
        MPI_Request_free(&r->mreq);
        ddl_liveness_mark_broken(); /* MPI holds it: finalizing could wait for the peer */
    } else {
        pthread_mutex_lock(&r->comm->recv_lock);
        unlist(r);
        pthread_mutex_unlock(&r->comm->recv_lock);
    }
}

void ddl_p2p_progress(struct ddl_request_s *r) {
    if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return;
    int rc;
    if (r->kind == REQ_RECV && !r->matched) {
        match_in_order(r);
        if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return;
    }
    if (r->kind == REQ_SEND || r->matched) {
        int flag = 0;
        rc = MPI_Test(&r->mreq, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            /* Fault-tolerant mode: the request's own communicator is the one that lost a
             * member (this may run outside any call on it: a test or wait from Python). */
            finish(r, ddl_ft_error(rc) ? ddl_ft_fail_comm(r->comm, rc, "MPI_Test")
                                       : ddl_mpi_fail(rc, "MPI_Test"),
                   NULL);
            return;
        }
        if (flag) {
            if (r->kind == REQ_RECV && (size_t)r->got != r->want)
                finish(r,
                       ddl_fail(DDL_ERR_MISMATCH,
                                "irecv: rank %d sent %d bytes (tag %d) but the receive buffer "
                                "holds %zu bytes (%zu x %s): send and receive the same count and "
                                "dtype",
                                r->peer, r->got, r->tag, r->want, r->count,
                                ddl_dtype_name(r->dtype)),
                       NULL);
            else
                finish(r, DDL_SUCCESS, NULL);
            return;
        }
    }
    /* The peer gone (the liveness watcher bumps its counter): the request can never
     * complete, so it fails rather than waiting for its deadline, after one more probe and
     * test (a message sent just before the peer left may still be on its way in). */
    unsigned gen = ddl_liveness_gen();
    if (gen != r->live_gen) {
        r->live_gen = gen;
        r->peer_gone = ddl_liveness_departed(ddl_comm_world_of(r->comm, r->peer));
        if (r->peer_gone) return;
    } else if (r->peer_gone) {
        abandon(r);
        /* A peer that died (not one that finalized) is, in fault-tolerant mode, a failed
         * member like any other: ProcessFailedError, the communicator revoked for all. */
        if (ddl_ft && ddl_liveness_died(ddl_comm_world_of(r->comm, r->peer))) {
            finish(r, ddl_ft_fail_comm(r->comm, 0, "the liveness watcher"), NULL);
            return;
        }
        finish(r,
               ddl_fail(DDL_ERR_PEER_LOST, "%s: %s rank %d (tag %d) cannot complete: that rank %s",
                        r->kind == REQ_SEND ? "isend" : "irecv",
                        r->kind == REQ_SEND ? "to" : "from", r->peer, r->tag, r->peer_gone),
               NULL);
        return;
    }
    if (ddl_now() > r->deadline) {
        abandon(r);
        finish(r,
               ddl_fail(DDL_ERR_TIMEOUT,
                        "%s: %s rank %d (tag %d) did not complete within %g s: it has not %s "
                        "(a missing %s, or a dead or stuck rank)",
                        r->kind == REQ_SEND ? "isend" : "irecv",
                        r->kind == REQ_SEND ? "to" : "from", r->peer, r->tag,
                        r->deadline - r->submitted,
                        r->kind == REQ_SEND ? "received the message" : "sent it",
                        r->kind == REQ_SEND ? "recv" : "send"),
               NULL);
    }
}

void ddl_p2p_wait(struct ddl_request_s *r) {
    double start = ddl_now(), spin_s = ddl_spin_budget(r->want);
    for (unsigned spin = 0; !__atomic_load_n(&r->done, __ATOMIC_ACQUIRE); spin++) {
        ddl_p2p_progress(r);
        if (spin_s >= 0 && (spin & 63) == 63 && ddl_now() - start > spin_s) {
            struct timespec ts = {0, 20 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* A request for dest/source `peer` of communicator c, or an error before anything moves. */
static ddl_status_t p2p_request(ddl_comm_t c, int kind, const void *sbuf, void *rbuf,
                                size_t count, ddl_dtype_t dtype, int peer, int tag,
                                ddl_request_t *out, const char *fn) {
    if (!out) return ddl_fail(DDL_ERR_INVALID_ARG, "%s: NULL request pointer", fn);
    *out = NULL;
    double saved;
    DDL_CHECK(ddl_comm_enter(c, fn, &saved));
    ddl_status_t st = ddl_p2p_check(c, kind == REQ_SEND ? sbuf : rbuf, count, dtype, peer, tag,
                                    fn);
    if (st != DDL_SUCCESS) {
        ddl_comm_leave(saved);
        return st;
    }
    struct ddl_request_s *r = calloc(1, sizeof *r);
    if (!r) {
        ddl_comm_leave(saved);
        return ddl_fail(DDL_ERR_NO_MEMORY, "%s: no memory for a request", fn);
    }
    r->kind = kind;
    r->send = sbuf;
    r->recv = rbuf;
    r->count = count;
    r->dtype = dtype;
    r->peer = peer;
    r->tag = tag;
    r->p2p = c->p2p;
    r->want = count * ddl_dtype_size(dtype);
    r->mreq = MPI_REQUEST_NULL;
    r->submitted = ddl_now();
    r->deadline = r->submitted + ddl_deadline_s();
    r->ndim = -1;
    r->comm = c;
    ddl_comm_leave(saved);
    if (kind == REQ_SEND) {
        int rc = MPI_Isend(sbuf, (int)r->want, MPI_BYTE, peer, tag, c->p2p, &r->mreq);
        if (rc != MPI_SUCCESS) {
            free(r);
            return ddl_mpi_fail(rc, "MPI_Isend");
        }
    }
    *out = r;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_isend(ddl_comm_t c, const void *buf, size_t count, ddl_dtype_t dtype,
                            int dest, int tag, ddl_request_t *req) {
    return p2p_request(c, REQ_SEND, buf, NULL, count, dtype, dest, tag, req, "ddl_comm_isend");
}

ddl_status_t ddl_comm_irecv(ddl_comm_t c, void *buf, size_t count, ddl_dtype_t dtype,
                            int source, int tag, ddl_request_t *req) {
    ddl_status_t st =
        p2p_request(c, REQ_RECV, NULL, buf, count, dtype, source, tag, req, "ddl_comm_irecv");
    if (st != DDL_SUCCESS) return st;
    struct ddl_request_s *r = *req;
    pthread_mutex_lock(&c->recv_lock); /* last in the posting order */
    struct ddl_request_s **pp = &c->recvs;
    while (*pp) pp = &(*pp)->pnext;
    *pp = r;
    r->listed = 1;
    pthread_mutex_unlock(&c->recv_lock);
    ddl_p2p_progress(r); /* take the message if it is here */
    return DDL_SUCCESS;
}

/* Point-to-point exchanges under a deadline.
 *
 * Every wait in libddl polls instead of blocking inside MPI so a peer that died or hung
 * turns into DDL_ERR_TIMEOUT after DDL_TIMEOUT seconds rather than a job that hangs until
 * its wall-clock limit. Receives are matched-probed first (MPI_Improbe) so the size of
 * the incoming message is known before it is received: a peer that sends more or less
 * than expected is reported instead of truncating (MPI_ERR_TRUNCATE; Open MPI 5 was seen
 * to corrupt its heap truncating a large message) or hanging.
 *
 * Large receives are the exception: they are pre-posted (MPI_Irecv of exactly the expected
 * size) and their size checked on arrival. Measured on the emulated cluster (two hosts,
 * a 200 Mbit/s link each way, Open MPI 5.0.11 TCP): a 16 MiB exchange in both directions
 * took the one-way time when the receive was pre-posted, but twice that (the two
 * directions serialised) in about half the runs when it was matched-probed, because a
 * probed rendezvous message starts moving only after the probe. By then the collective's
 * arguments were already checked on every rank (collectives.c), so a large message of
 * the wrong size can only come from ranks that disagree on the topology; it still fails
 * (MPI_ERR_TRUNCATE, or the count check) instead of hanging.
 *
 * Every poll also looks at one counter the liveness watcher bumps when a peer exits, dies
 * or finalizes (liveness.c), so a lost peer fails the wait at once with DDL_ERR_PEER_LOST
 * instead of at the deadline. The deadline is DDL_TIMEOUT, or the calling thread's own
 * (ddl_set_thread_timeout: torch.distributed's timeout= of a process group). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl_internal.h"

double ddl_timeout_s = 300.0;
static _Thread_local double thread_timeout_s = 0.0; /* 0: DDL_TIMEOUT */

double ddl_deadline_s(void) { return thread_timeout_s > 0 ? thread_timeout_s : ddl_timeout_s; }

ddl_status_t ddl_set_thread_timeout(double seconds) {
    if (!(seconds >= 0 && seconds <= 1e9)) /* also refuses nan */
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "timeout %g s: use a number of seconds in (0, 1e9], or 0 for "
                        "DDL_TIMEOUT",
                        seconds);
    thread_timeout_s = seconds;
    return DDL_SUCCESS;
}

double ddl_thread_timeout(void) { return thread_timeout_s; }
/* Messages above this are sent in pieces so counts fit MPI's int. */
#define PIECE ((size_t)1 << 30)

double ddl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int world_rank_of(const ddl_mpicomm_t *c, int peer) {
    MPI_Group g, w;
    int out = peer;
    if (MPI_Comm_group(c->comm, &g) != MPI_SUCCESS) return peer;
    if (MPI_Comm_group(ddl_base_comm, &w) == MPI_SUCCESS) {
        if (MPI_Group_translate_ranks(g, 1, &peer, w, &out) != MPI_SUCCESS) out = peer;
        MPI_Group_free(&w);
    }
    MPI_Group_free(&g);
    return out;
}

/* A peer sent a message of another size than this rank expects (``got`` bytes), or one
 * larger than the buffer posted for it (MPI_ERR_TRUNCATE): either way the ranks disagree
 * on the collective, so each says so instead of computing on the wrong data. */
static ddl_status_t size_fail(const ddl_mpicomm_t *c, int src, int got, size_t want) {
    return ddl_fail(DDL_ERR_MISMATCH,
                    "rank %d sent %d bytes where %zu were expected: the ranks disagree on the "
                    "count, dtype or topology of this collective",
                    world_rank_of(c, src), got, want);
}

/* A pre-posted receive of ``want`` bytes failed with MPI error ``rc``. Only a truncation
 * is the peer's disagreement; any other error (a peer that failed, a communicator revoked
 * by a survivor that saw the failure first, a broken connection) is that, and reported as
 * such, so fault-tolerant code catches ProcessFailedError instead of a MismatchError that
 * names a live peer. */
static ddl_status_t recv_fail(const ddl_mpicomm_t *c, int src, size_t want, int rc) {
    int cls = rc;
    if (MPI_Error_class(rc, &cls) != MPI_SUCCESS) cls = rc;
    if (cls != MPI_ERR_TRUNCATE) return ddl_mpi_fail(rc, "MPI_Test (receive)");
    return ddl_fail(DDL_ERR_MISMATCH,
                    "rank %d sent more than the %zu bytes expected: the ranks disagree on the "
                    "count, dtype or topology of this collective",
                    world_rank_of(c, src), want);
}

/* The deadline passed: name the ranks that have not reached this collective (asked through
 * the liveness watcher), else the peer this rank was waiting for. */
/* What every timeout's error says: the call, the deadline, and the liveness watcher's
 * account of the ranks (diagnosed 0: it has none). Marks the job broken. */
typedef struct {
    char call[96], why[700];
    double t;
    int diagnosed;
} timeout_info_t;

static void timeout_info(timeout_info_t *ti) {
    ddl_liveness_mark_broken();
    ddl_describe_call(ti->call, sizeof ti->call);
    ti->t = ddl_deadline_s();
    ti->diagnosed = ddl_liveness_diagnose(ti->why, sizeof ti->why);
}

static ddl_status_t timeout_fail(const ddl_mpicomm_t *c, int peer, const char *what) {
    timeout_info_t ti;
    timeout_info(&ti);
    const char *which = thread_timeout_s > 0 ? "the timeout set for this call" : "DDL_TIMEOUT";
    if (ti.diagnosed)
        return ddl_fail(DDL_ERR_TIMEOUT,
                        "%s: no progress for %.3g s (%s): %s (raise the timeout if a rank is "
                        "only slow)",
                        ti.call, ti.t, which, ti.why);
    return ddl_fail(DDL_ERR_TIMEOUT,
                    "%s: no answer from rank %d for %.3g s (%s) while %s: that rank died, hung, "
                    "or is not calling the same collective (raise the timeout if it is only "
                    "slow)",
                    ti.call, world_rank_of(c, peer), ti.t, which, what);
}

/* The same for an MPI request (MPI's own collectives): no single peer to name. */
static ddl_status_t request_timeout(const ddl_mpicomm_t *c, const char *what) {
    timeout_info_t ti;
    timeout_info(&ti);
    if (ti.diagnosed)
        return ddl_fail(DDL_ERR_TIMEOUT,
                        "%s: %s made no progress for %.3g s: %s (raise the timeout if a rank "
                        "is only slow)",
                        ti.call, what, ti.t, ti.why);
    return ddl_fail(DDL_ERR_TIMEOUT,
                    "%s: %s did not complete within %.3g s on a communicator of %d ranks: a "
                    "rank died, hung, or is not calling the same collective (raise the "
                    "timeout if it is only slow)",
                    ti.call, what, ti.t, c->size);
}

/* Every wait below polls (MPI_Test) under a deadline. A wait that lasts more than
 * DDL_SPIN_US microseconds then pauses about 50 us between polls instead of spinning: a
 * rank that waits long (a node's other ranks while the leader's segments cross the
 * network, a rank waiting on a slow link) stops competing for the CPU with the ranks that
 * have work (reductions, feeding sockets), which matters wherever ranks share cores. Data
 * keeps moving while a rank pauses (socket buffers hold far more than 50 us of any link),
 * and short waits, the latency path, never pause. DDL_SPIN_US=-1 never pauses.
 *
 * A pause costs more than its 50 us (a VM's timer slack: 60-110 us measured here), and a
 * wait of a few hundred microseconds (a 2 MiB rendezvous message, 0.5-0.7 ms on shared
 * memory) pays it on both sides: send/recv at 2 MiB reached 0.78-0.86x MPI's bandwidth
 * with 200 us and 1.0x with DDL_SPIN_US=1000. A 1000 us default (where the node's ranks
 * fit its cores) was tried and withdrawn: with it, a two-rank Horovod TensorFlow test
 * that allreduces from several threads crashed in 2 of 13 runs (0 of 16 with 200 us),
 * a race its timing exposes that is not found yet. */
double ddl_spin_s = 200e-6;

/* A wait for a transfer of `bytes` spins at least as long as moving them should take
 * (at 2 GB/s, below what this node's shared memory moves), where the node's ranks fit its
 * cores: a rank waiting for its own large message has nothing else to do, and nobody
 * needs its core. It was the 2 MiB send/recv above: 0.78-0.86x MPI's bandwidth with
 * 200 us, 1.0x with 1000. Small messages, and with them the many small asynchronous
 * requests of a framework, keep DDL_SPIN_US. */
#define SPIN_S_PER_BYTE 0.5e-9

typedef struct {
    double start, deadline;
    double spin_s; /* spin this long before pausing between polls; < 0: never pause */
    bool idle;
    unsigned gen; /* the liveness counter last looked at */
} poller_t;

double ddl_spin_budget(size_t bytes) {
    double t = (double)bytes * SPIN_S_PER_BYTE;
    return ddl_spin_s >= 0 && t > ddl_spin_s && ddl_g.ranks_fit_cores ? t : ddl_spin_s;
}

static poller_t poller(size_t bytes) {
    poller_t p = {0};
    p.spin_s = ddl_spin_budget(bytes);
    return p;
}

/* One poll done: pause if the wait is long, and 1 once the deadline has passed. POLL_LOST
 * when a peer this collective needs is gone (the error is recorded). */
#define POLL_LOST 2
/* What the liveness verdict said when a poll returned POLL_LOST: DDL_ERR_PEER_LOST, or in
 * fault-tolerant mode DDL_ERR_PROC_FAILED (ft.c). */
static _Thread_local ddl_status_t lost_status = DDL_ERR_PEER_LOST;
static int poll_next(poller_t *p, unsigned spin) {
    unsigned g = ddl_liveness_gen();
    if (g != p->gen) {
        p->gen = g;
        ddl_status_t v = ddl_liveness_verdict();
        if (v != DDL_SUCCESS) {
            lost_status = v;
            return POLL_LOST;
        }
    }
    if (p->idle) {
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
    } else if ((spin & 255u) != 255u) {
        return 0;
    }
    double now = ddl_now();
    if (p->deadline == 0.0) {
        p->start = now;
        p->deadline = now + ddl_deadline_s();
        return 0;
    }
    if (p->spin_s >= 0 && now - p->start > p->spin_s) p->idle = true;
    return now > p->deadline;
}

/* Receives up to this size are matched-probed (they travel eagerly); larger ones are
 * pre-posted (see above). */
#define PROBE_MAX ((size_t)64 * 1024)

/* One piece: at most PIECE bytes each way. */
static ddl_status_t exchange(const ddl_mpicomm_t *c, const void *sbuf, size_t sbytes, int dst,
                             void *rbuf, size_t rbytes, int src, int tag) {
    MPI_Request sreq = MPI_REQUEST_NULL, rreq = MPI_REQUEST_NULL;
    bool have_msg = src < 0, preposted = src >= 0 && rbytes > PROBE_MAX;
    MPI_Status rst;
    /* The send is posted before the receive. A large message travels by rendezvous: the
     * sender's request goes out, and the data follows the receiver's answer. In a two-way
     * exchange where the peer posted first, its request is already here: posting our
     * receive first answers it at once, the peer starts streaming its data, and our own
     * request then reaches it only after that data has been read, so the peer's answer
     * to us queues behind megabytes of its data in the same TCP connection (measured on
     * the emulated cluster: one direction of an 8 MiB exchange idle for 140 ms of 350).
     * Sending first puts our request on the wire before our answer, so the peer reads it
     * before it can start streaming and both answers travel ahead of the data. */
    if (dst >= 0)
        MPI_CHECK(MPI_Isend(sbuf, (int)sbytes, MPI_BYTE, dst, tag, c->comm, &sreq));
    if (preposted) {
        MPI_CHECK(MPI_Irecv(rbuf, (int)rbytes, MPI_BYTE, src, tag, c->comm, &rreq));
        have_msg = true;
    }
    poller_t poll = poller(sbytes > rbytes ? sbytes : rbytes);
    for (unsigned spin = 0;; spin++) {
        if (!have_msg) {
            int flag = 0;
            MPI_Message msg;
            MPI_Status st;
            MPI_CHECK(MPI_Improbe(src, tag, c->comm, &flag, &msg, &st));
            if (flag) {
                int n = 0;
                MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &n));
                /* A message of another size is received whole into scratch (consumed, so
                 * nothing stays queued) and reported. */
                void *into = (size_t)n == rbytes ? rbuf : ddl_scratch(DDL_SCRATCH_SPILL, (size_t)n);
                if (!into && n > 0)
                    return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for %d bytes", n);
                MPI_CHECK(MPI_Imrecv(into, n, MPI_BYTE, &msg, &rreq));
                have_msg = true;
                if ((size_t)n != rbytes) {
                    MPI_Wait(&rreq, MPI_STATUS_IGNORE);
                    if (sreq != MPI_REQUEST_NULL) ddl_wait_request(&sreq, c, "sending");
                    return size_fail(c, src, n, rbytes);
                }
            }
        }
        int sdone = 1, rdone = 1;
        if (sreq != MPI_REQUEST_NULL) MPI_CHECK(MPI_Test(&sreq, &sdone, MPI_STATUS_IGNORE));
        if (have_msg && rreq != MPI_REQUEST_NULL) {
            int rc = MPI_Test(&rreq, &rdone, preposted ? &rst : MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS && preposted) return recv_fail(c, src, rbytes, rc);
            if (rc != MPI_SUCCESS) return ddl_mpi_fail(rc, "MPI_Test");
            if (rdone && preposted) {
                int n = 0;
                MPI_CHECK(MPI_Get_count(&rst, MPI_BYTE, &n));
                preposted = false;
                if ((size_t)n != rbytes) {
                    if (sreq != MPI_REQUEST_NULL) ddl_wait_request(&sreq, c, "sending");
                    return size_fail(c, src, n, rbytes);
                }
            }
        }
        if (sdone && rdone && have_msg) break;
        int pn = poll_next(&poll, spin);
        if (pn == POLL_LOST) return lost_status;
        if (pn) {
            return timeout_fail(c, have_msg ? dst : src,
                                have_msg ? "sending to it" : "waiting for its message");
        }
    }
    return DDL_SUCCESS;
}

/* Exchanges between nodes (levels above the first, ddl_mpicomm_t.piece > 0) travel as a
 * stream of pieces of at most DDL_PIECE bytes (default 128 KiB), with at most DDL_WINDOW
 * (default 4) sent ahead of the pieces received. Why (measured on the emulated cluster,
 * 2 hosts x 2 ranks, 200 Mbit/s links with a 20 ms tbf queue, 16 MiB allreduce, 24 runs
 * each): sent as one message per direction, an exchange leaves TCP a backlog of
 * megabytes, its window grows past the queue and packets are dropped (about 6 per
 * allreduce); a drop near a message's end is recovered only by a loss probe or timeout,
 * milliseconds to tens of ms in which the link idles: median 702.5 ms but a quarter of the
 * runs 709-733 ms. With 128 KiB pieces, 4 ahead (at most 512 KiB in flight each way, about
 * the queue), no drops at all and 703 ms median, 704 ms at the 80th percentile. 64 KiB
 * pieces (Open MPI TCP's eager size, as han's segments) cost about 1-2 ms more per 16 MiB
 * (more messages) and showed more slow outliers; larger windows (12-24 x 64 KiB) brought
 * drops back. Each piece's rendezvous handshake is hidden behind the pieces ahead of it.
 * Receives are pre-posted with the exact size and checked on arrival. */
size_t ddl_stream_piece = 128 * 1024;
int ddl_stream_window = 4;

static ddl_status_t stream(const ddl_mpicomm_t *c, const char *sbuf, size_t sbytes, int dst,
                           char *rbuf, size_t rbytes, int src, int tag) {
    size_t P = c->piece, W = (size_t)ddl_stream_window;
    /* A message of at most P bytes (also an empty one) is one piece: the same single
     * message exchange() sends, so both ends agree whichever path each takes. */
    size_t ns = dst < 0 ? 0 : sbytes ? (sbytes + P - 1) / P : 1;
    size_t nr = src < 0 ? 0 : rbytes ? (rbytes + P - 1) / P : 1;
    MPI_Request sreq[64], rreq[64];
    if (W > 64) W = 64;
    size_t sposted = 0, rposted = 0, sdone = 0, rdone = 0;
    poller_t poll = poller(0); /* pieces: each wait is short */
    for (unsigned spin = 0;; spin++) {
        /* Post receives up to W ahead, sends up to W ahead of the pieces received. */
        while (rposted < nr && rposted < rdone + W) {
            size_t n = rbytes - rposted * P < P ? rbytes - rposted * P : P;
            MPI_CHECK(MPI_Irecv(rbuf + rposted * P, (int)n, MPI_BYTE, src, tag, c->comm,
                                &rreq[rposted % W]));
            rposted++;
        }
        while (sposted < ns && sposted < sdone + W && (sposted < rdone + W || rdone >= nr)) {
            size_t n = sbytes - sposted * P < P ? sbytes - sposted * P : P;
            MPI_CHECK(MPI_Isend(sbuf + sposted * P, (int)n, MPI_BYTE, dst, tag, c->comm,
                                &sreq[sposted % W]));
            sposted++;
        }
        if (sdone < sposted) {
            int f = 0;
            MPI_CHECK(MPI_Test(&sreq[sdone % W], &f, MPI_STATUS_IGNORE));
            if (f) sdone++;
        }
        if (rdone < rposted) {
            int f = 0;
            MPI_Status st;
            size_t want = rbytes - rdone * P < P ? rbytes - rdone * P : P;
            int rc = MPI_Test(&rreq[rdone % W], &f, &st);
            int n = 0;
            if (rc == MPI_SUCCESS && f) MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &n));
            if (rc != MPI_SUCCESS) return recv_fail(c, src, want, rc);
            if (f && (size_t)n != want) return size_fail(c, src, n, want);
            if (f) {
                rdone++;
                continue;
            }
        }
        if (sdone == ns && rdone == nr) return DDL_SUCCESS;
        int pn = poll_next(&poll, spin);
        if (pn == POLL_LOST) return lost_status;
        if (pn)
            return timeout_fail(c, rdone < nr ? src : dst,
                                rdone < nr ? "waiting for its message" : "sending to it");
    }
}

static ddl_status_t sendrecv(const ddl_mpicomm_t *c, const void *sbuf, size_t sbytes, int dst,
                             void *rbuf, size_t rbytes, int src, int tag) {
    if (c->piece > 0 && (sbytes > c->piece || rbytes > c->piece) && sbytes <= PIECE &&
        rbytes <= PIECE)
        return stream(c, (const char *)sbuf, sbytes, dst, (char *)rbuf, rbytes, src, tag);
    if (sbytes <= PIECE && rbytes <= PIECE)
        return exchange(c, sbuf, sbytes, dst, rbuf, rbytes, src, tag);
    /* Large: both sides cut the same pieces (sizes match, or the first piece reports it). */
    size_t off_s = 0, off_r = 0;
    do {
        size_t ns = sbytes - off_s < PIECE ? sbytes - off_s : PIECE;
        size_t nr = rbytes - off_r < PIECE ? rbytes - off_r : PIECE;
        DDL_CHECK(exchange(c, (const char *)sbuf + off_s, ns, off_s < sbytes ? dst : -1,
                           (char *)rbuf + off_r, nr, off_r < rbytes ? src : -1, tag));
        off_s += ns;
        off_r += nr;
    } while (off_s < sbytes || off_r < rbytes);
    return DDL_SUCCESS;
}

ddl_status_t ddl_sendrecv(const ddl_mpicomm_t *c, const void *sbuf, size_t sbytes, int dst,
                          void *rbuf, size_t rbytes, int src, int tag) {
    return sendrecv(c, sbuf, sbytes, dst, rbuf, rbytes, src, tag);
}

ddl_status_t ddl_sendrecv_capped(const ddl_mpicomm_t *c, const void *sbuf, size_t sbytes, int dst,
                                 void *rbuf, size_t rcap, int src, int tag, size_t *got) {
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Status sts[2];
    if (src >= 0) MPI_CHECK(MPI_Irecv(rbuf, (int)rcap, MPI_BYTE, src, tag, c->comm, &reqs[0]));
    if (dst >= 0) MPI_CHECK(MPI_Isend(sbuf, (int)sbytes, MPI_BYTE, dst, tag, c->comm, &reqs[1]));
    poller_t poll = poller(rcap > sbytes ? rcap : sbytes);
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        int rc = MPI_Testall(2, reqs, &done, sts);
        if (rc == MPI_ERR_IN_STATUS) /* the request's own error says what happened */
            for (int i = 0; i < 2; i++)
                if (sts[i].MPI_ERROR != MPI_SUCCESS && sts[i].MPI_ERROR != MPI_ERR_PENDING) {
                    rc = sts[i].MPI_ERROR;
                    break;
                }
        if (rc != MPI_SUCCESS) return ddl_mpi_fail(rc, "MPI_Testall");
        if (done) break;
        int pn = poll_next(&poll, spin);
        if (pn == POLL_LOST) return lost_status;
        if (pn) {
            int waiting_recv = reqs[0] != MPI_REQUEST_NULL;
            return timeout_fail(c, waiting_recv ? src : dst,
                                waiting_recv ? "waiting for its message" : "sending to it");
        }
    }
    *got = 0;
    if (src >= 0) {
        int n = 0;
        MPI_CHECK(MPI_Get_count(&sts[0], MPI_BYTE, &n));
        *got = (size_t)n;
    }
    return DDL_SUCCESS;
}

ddl_status_t ddl_wait_request(MPI_Request *req, const ddl_mpicomm_t *c, const char *what) {
    return ddl_wait_request_bytes(req, c, what, 0);
}

ddl_status_t ddl_wait_request_bytes(MPI_Request *req, const ddl_mpicomm_t *c, const char *what,
                                    size_t bytes) {
    poller_t poll = poller(bytes);
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) return DDL_SUCCESS;
        int pn = poll_next(&poll, spin);
        if (pn == POLL_LOST) return lost_status;
        if (pn) return request_timeout(c, what);
    }
}

/* ---- a flag in memory shared with a peer (shm.c) ------------------------------------ */

ddl_status_t ddl_wait_flag(const ddl_mpicomm_t *c, const uint64_t *flag, uint64_t want, int peer,
                           size_t bytes, const char *what) {
    poller_t poll = poller(bytes);
    for (unsigned spin = 0;; spin++) {
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == want) return DDL_SUCCESS;
        /* Fault-tolerant mode: shared memory shows no revoke and no death, so now and then
         * ask MPI about the communicator (a probe fails once it is revoked or a member
         * failed). */
        if (ddl_ft && (spin & 1023u) == 1023u) {
            int f = 0;
            int rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->comm, &f, MPI_STATUS_IGNORE);
            if (ddl_ft_error(rc)) return ddl_ft_fail(rc, "MPI");
        }
        int pn = poll_next(&poll, spin);
        if (pn == POLL_LOST) return lost_status;
        if (pn) return timeout_fail(c, peer, what);
    }
}

/* ---- non-blocking pieces for pipelines: at most PIECE bytes, waits under the deadline ---- */

ddl_status_t ddl_isend(const ddl_mpicomm_t *c, const void *buf, size_t bytes, int dst, int tag,
                       MPI_Request *req) {
    if (bytes > PIECE) return ddl_fail(DDL_ERR_INTERNAL, "pipeline segment over %zu bytes", PIECE);
    MPI_CHECK(MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, tag, c->comm, req));
    return DDL_SUCCESS;
}

ddl_status_t ddl_irecv(const ddl_mpicomm_t *c, void *buf, size_t bytes, int src, int tag,
                       MPI_Request *req) {
    if (bytes > PIECE) return ddl_fail(DDL_ERR_INTERNAL, "pipeline segment over %zu bytes", PIECE);
    MPI_CHECK(MPI_Irecv(buf, (int)bytes, MPI_BYTE, src, tag, c->comm, req));
    return DDL_SUCCESS;
}

ddl_status_t ddl_wait_recv(const ddl_mpicomm_t *c, MPI_Request *req, size_t bytes, int src) {
    poller_t poll = poller(bytes);
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        MPI_Status st;
        int rc = MPI_Test(req, &done, &st);
        if (rc != MPI_SUCCESS) return recv_fail(c, src, bytes, rc);
        if (done) {
            int n = 0;
            MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &n));
            if ((size_t)n != bytes) return size_fail(c, src, n, bytes);
            return DDL_SUCCESS;
        }
        int pn = poll_next(&poll, spin);
        if (pn == POLL_LOST) return lost_status;
        if (pn) return timeout_fail(c, src, "waiting for its message");
    }
}

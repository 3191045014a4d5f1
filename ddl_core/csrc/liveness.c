/* Liveness: a peer that exits, dies or finalizes is reported at once, not at DDL_TIMEOUT.
 *
 * Why not rely on the launcher: plain mpirun kills a job whose rank died, but under
 * `mpirun --runtime-options recoverable`, srun or jsrun the survivors are left waiting, and
 * a rank that ends cleanly (sys.exit(0) after init) sits in MPI_Finalize while its peers
 * wait in a collective for it, so without this they learn only after DDL_TIMEOUT (300 s).
 *
 * How: at ddl_init every rank opens one TCP connection to a watcher thread on rank 0 (rank 0
 * too, to itself), authenticated by a random token that rank 0 broadcast over MPI. The
 * kernel closes a process's sockets however it ends (exit, signal, crash, OOM kill), so the
 * watcher reads end-of-file the moment a rank is gone; a clean ddl_finalize first sends
 * BYE with the number of collectives this rank began on each context. The watcher relays
 * GONE(rank, died|finalized, counts) to every rank, whose own watcher thread records it
 * and bumps `ddl_live_gen`. Waits (p2p.c) already poll; they compare that one counter with
 * the value they last saw (a load, no syscall) and only on a change ask
 * ddl_liveness_verdict() whether the collective they are in can still complete: not if a
 * rank died, nor if a rank finalized before beginning it (its count is lower). A rank that
 * finalized after taking part goes on unreported: its messages are already on their way.
 * If rank 0 itself goes, every rank reads end-of-file on its connection to it.
 *
 * The same connections answer "why is nothing happening" when a deadline passes: the
 * waiting rank sends QUERY (its context and collective number), rank 0 asks every rank for
 * the collective it last began (the watcher threads answer even when the application
 * thread is stuck in Python) and returns the ranks that differ, so a timeout names the rank
 * that has not arrived instead of a neighbour that is waiting too.
 *
 * Nothing here is on the data path: no traffic while ranks are alive, one relaxed load per
 * poll. Frames from peers are checked (magic, type, token, rank range) before use. TCP
 * keepalive (about 16 s) catches a host that vanishes without closing anything. A forked
 * child (DataLoader workers) closes its copies of the sockets at once, or a parent's death
 * would go unseen while the child lives. DDL_LIVENESS=0 turns all of it off. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ddl_internal.h"

_Thread_local ddl_coll_t ddl_cur = {-1, 0, "init", NULL, 0, NULL};
unsigned ddl_live_gen = 0;
int ddl_live_checks = 1;

enum { F_HELLO = 1, F_ACK, F_BYE, F_GONE, F_QUERY, F_ASK, F_STATE, F_ENTRY, F_END };
enum { ALIVE = 0, DIED = 1, FINALIZED = 2 };
#define MAGIC 0x4444554cu /* "DDUL" */
#define MAX_ADDRS 16
#define MAX_ENTRIES 64    /* ranks a diagnosis lists */
#define ANSWER_S 0.5      /* how long rank 0 waits for the ranks' answers to a query */
#define EXITED 0x100u     /* a BYE sent as the process exits: the status is in the low byte */

typedef struct {
    uint32_t magic;
    uint16_t type;
    uint16_t kind;  /* F_GONE: DIED/FINALIZED; F_QUERY: context; F_ENTRY: 1 = answered */
    int32_t rank;   /* the rank the frame is about (or sends it) */
    uint32_t id;    /* query round / request id; F_BYE, F_GONE: EXITED | exit status, or 0 */
    uint64_t a, b;  /* F_BYE, F_GONE, F_STATE, F_ENTRY: blocking and asynchronous counts;
                       F_QUERY: a = the collective's number; F_END: a = ranks listed */
    uint64_t token; /* F_HELLO */
} frame_t;

typedef struct {
    int fd;
    int rank; /* -1 until its HELLO */
    int said_bye;
    size_t fill;
    unsigned char buf[sizeof(frame_t)];
} conn_t;

/* What the rank 0 watcher's query round gathers, and what a requester wants from it. */
typedef struct {
    uint32_t id;
    int ctx;
    uint64_t seq;
} want_t;

static struct {
    int active;  /* connected and watching */
    int hub;     /* this rank runs the watcher everyone connects to */
    int rank, size;
    int client;  /* this rank's connection to the hub */
    int wake;    /* eventfd: stop the watcher */
    int epfd;
    int lfd;     /* hub: listening socket, until every rank has said HELLO */
    pthread_t thread;
    int thread_started;
    int stopping;
    int hub_bye_sent; /* rank 0's own BYE has been relayed */
    pthread_mutex_t lock; /* gone[], final_*, the client-side query result */
    pthread_cond_t cond;
    pthread_mutex_t send_lock; /* client writes from several threads */
    uint8_t *gone;
    uint64_t *final_a, *final_b;
    uint32_t *order; /* departure order, from 1 */
    uint32_t *how;   /* EXITED | status for a rank that finalized as it exited, else 0 */
    uint32_t departures;
    /* hub */
    uint64_t token;
    conn_t **conns;   /* every accepted connection */
    int nconns;
    conn_t **by_rank; /* authenticated ones */
    int hellos;
    uint32_t round;   /* query round in progress (0: none) */
    double round_end;
    uint8_t *answered;
    uint64_t *ans_a, *ans_b;
    want_t *wants;
    /* client: the result of this rank's last query */
    uint32_t next_id, done_id;
    int got_n, got_total;
    int got_rank[MAX_ENTRIES];
    int got_ok[MAX_ENTRIES];
    uint64_t got_count[MAX_ENTRIES];
    pthread_mutex_t query_lock; /* one query at a time per rank */
} L = {.client = -1, .wake = -1, .epfd = -1, .lfd = -1,
       .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
       .send_lock = PTHREAD_MUTEX_INITIALIZER, .query_lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- collective numbering --------------------------------------------------------- */

void ddl_coll_begin(ddl_ctx_t *ctx, const char *name, int bump) {
    ddl_cur.cctx = ctx;
    if (!ddl_live_checks) return; /* the benchmark's "off" arm: none of this runs */
    uint64_t s = __atomic_load_n(&ctx->seq, __ATOMIC_RELAXED) + 1;
    if (bump) __atomic_store_n(&ctx->seq, s, __ATOMIC_RELAXED);
    __atomic_store_n(&ctx->reached, s, __ATOMIC_RELAXED);
    ddl_cur.ctx = ctx->id;
    ddl_cur.seq = s;
    ddl_cur.name = name;
    ddl_cur.members = ctx->members;
    ddl_cur.nmembers = ctx->nmembers;
}


static uint64_t ctx_seq(int ctx) {
    ddl_ctx_t *c = ctx == DDL_CTX_PROGRESS ? &ddl_g.progress : &ddl_g.app;
    return __atomic_load_n(&c->seq, __ATOMIC_RELAXED);
}

/* The collective a context is in or negotiating for (what a timeout's diagnosis compares). */
static uint64_t ctx_reached(int ctx) {
    ddl_ctx_t *c = ctx == DDL_CTX_PROGRESS ? &ddl_g.progress : &ddl_g.app;
    return __atomic_load_n(&c->reached, __ATOMIC_RELAXED);
}

void ddl_format_ranks(char *out, size_t n, const int *r, int count) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < count && len + 24 < n;) {
        int j = i;
        while (j + 1 < count && r[j + 1] == r[j] + 1) j++;
        len += (size_t)snprintf(out + len, n - len, "%s%d", i ? "," : "", r[i]);
        if (j > i) len += (size_t)snprintf(out + len, n - len, "%s%d", j > i + 1 ? "-" : ",", r[j]);
        i = j + 1;
        if (i < count && len + 24 >= n) snprintf(out + len, n - len, ",...");
    }
}

/* "allreduce #12", "allreduce #3 (asynchronous)", "the asynchronous negotiation before
 * collective #3". */
void ddl_describe_call(char *out, size_t n) {
    if (ddl_cur.ctx < 0)
        snprintf(out, n, "%s", ddl_cur.name ? ddl_cur.name : "init");
    else if (strcmp(ddl_cur.name, "negotiation") == 0)
        snprintf(out, n, "the asynchronous negotiation before collective #%llu",
                 (unsigned long long)ddl_cur.seq);
    else
        snprintf(out, n, "%s #%llu%s", ddl_cur.name, (unsigned long long)ddl_cur.seq,
                 ddl_cur.ctx == DDL_CTX_PROGRESS ? " (asynchronous)" : "");
}

static const char *ctx_words(int ctx) {
    return ctx == DDL_CTX_PROGRESS ? "asynchronous" : "blocking";
}

/* Whether rank r's departure dooms the current collective: it died, or it finalized
 * before beginning it (caller holds L.lock). */
static int dooms(int r) {
    /* During ddl_init's own exchanges (L.active is set when they end) a peer that finalized
     * had finished them: only a death matters. */
    if (!L.active) return L.gone[r] == DIED;
    if (ddl_cur.members) {
        /* A communicator's collective: only its members matter, and only a death dooms it
         * at once (its own collectives are not counted here, so a member that finalized
         * without arriving is found by the communicator's timeout). */
        for (int i = 0; i < ddl_cur.nmembers; i++)
            if (ddl_cur.members[i] == r) return L.gone[r] == DIED;
        return 0;
    }
    if (L.gone[r] == DIED) return 1;
    if (L.gone[r] != FINALIZED) return 0;
    uint64_t c = ddl_cur.ctx == DDL_CTX_PROGRESS ? L.final_b[r] : L.final_a[r];
    return ddl_cur.ctx < 0 || c < ddl_cur.seq; /* outside a collective any departure */
}

ddl_status_t ddl_liveness_verdict(void) {
    if (!L.gone) return DDL_SUCCESS;
    int P = L.size, nlater = 0, nwait = 0, p = -1;
    int *later = malloc(sizeof(int) * 2 * (size_t)P);
    if (!later) return ddl_fail(DDL_ERR_PEER_LOST, "a peer was lost (no memory to say which)");
    int *waited = later + P;
    pthread_mutex_lock(&L.lock);
    /* The first departure that dooms this collective is the one to name; ranks that left
     * after it (often because of it) come last. */
    for (int r = 0; r < P; r++)
        if (dooms(r) && (p < 0 || L.order[r] < L.order[p])) p = r;
    if (p < 0) {
        pthread_mutex_unlock(&L.lock);
        free(later);
        return DDL_SUCCESS;
    }
    for (int r = 0; r < P; r++) {
        if (r == p) continue;
        if (L.gone[r] == ALIVE || L.order[r] > L.order[p]) waited[nwait++] = r;
        if (L.gone[r] != ALIVE && L.order[r] > L.order[p]) later[nlater++] = r;
    }
    int kind = L.gone[p];
    uint32_t how = L.how[p];
    uint64_t count = ddl_cur.ctx == DDL_CTX_PROGRESS ? L.final_b[p] : L.final_a[p];
    pthread_mutex_unlock(&L.lock);
    ddl_liveness_mark_broken();

    char what[128], gone[200], wl[256] = "", ll[256] = "";
    ddl_describe_call(what, sizeof what);
    char left[48] = "finalized DDL";
    if (how & EXITED) snprintf(left, sizeof left, "exited with status %u", how & 0xffu);
    if (kind == DIED)
        snprintf(gone, sizeof gone, "exited or died without finalizing DDL (killed, crashed, "
                                    "or ended without ddl_finalize)");
    else
        snprintf(gone, sizeof gone, "%s after %llu %s collective%s, before this one", left,
                 (unsigned long long)count, ctx_words(ddl_cur.ctx), count == 1 ? "" : "s");
    ddl_format_ranks(wl, sizeof wl, waited, nwait);
    ddl_format_ranks(ll, sizeof ll, later, nlater);
    free(later);
    char tail[300] = "";
    if (nlater)
        snprintf(tail, sizeof tail, "; since then rank%s %s %s gone too", nlater > 1 ? "s" : "",
                 ll, nlater > 1 ? "have" : "has");
    ddl_status_t st = ddl_fail(DDL_ERR_PEER_LOST, "%s: rank %d %s, while rank%s %s waited for it%s",
                               what, p, gone, nwait > 1 ? "s" : "", wl, tail);
    /* Fault-tolerant mode: the same departure is a failure of the communicator, reported
     * (and revoked) as ULFM's own are, so either detector gives every survivor one error. */
    if (ddl_ft && kind == DIED) return ddl_ft_fail(0, "the liveness watcher");
    return st;
}

int ddl_liveness_dead_members(const struct ddl_comm_s *c, int *out) {
    if (!L.gone || !ddl_live_checks) return 0;
    int n = 0, size = c->ctx->world.size;
    pthread_mutex_lock(&L.lock);
    for (int i = 0; i < size; i++) {
        int wr = c->is_world ? i : c->world_ranks ? c->world_ranks[i] : -1;
        if (wr >= 0 && wr < L.size && L.gone[wr] == DIED) out[n++] = i;
    }
    pthread_mutex_unlock(&L.lock);
    return n;
}

/* Whether world rank r died (left without finalizing), as the watcher knows it. */
int ddl_liveness_died(int r) {
    if (!L.gone || r < 0 || r >= L.size || !ddl_live_checks) return 0;
    pthread_mutex_lock(&L.lock);
    int kind = L.gone[r];
    pthread_mutex_unlock(&L.lock);
    return kind == DIED;
}

/* Whether the watcher can vouch that world rank r did not die: it watches, this rank
 * hears from its hub (it is the hub, or its connection to rank 0 is up and rank 0 has not
 * died), and r is alive or finalized DDL. A rank that MPI takes for failed but that
 * finalized went on without this one (in a world of its own: a broken connection), so it
 * counts as much as a live one. A rank on a host that vanished (no EOF on its socket)
 * still looks alive here for a while: callers use this only against a disagreement of
 * MPI's. */
int ddl_liveness_vouches(int r) {
    if (!L.gone || r < 0 || r >= L.size || !ddl_live_checks) return 0;
    pthread_mutex_lock(&L.lock);
    int ok = L.active && L.gone[r] != DIED && (L.hub || (L.client >= 0 && L.gone[0] != DIED));
    pthread_mutex_unlock(&L.lock);
    return ok;
}

/* How world rank r has left: 0 while alive (or unknown), else a phrase for messages. */
const char *ddl_liveness_departed(int r) {
    if (!L.gone || r < 0 || r >= L.size || !ddl_live_checks) return NULL;
    pthread_mutex_lock(&L.lock);
    int kind = L.gone[r];
    uint32_t how = L.how[r];
    pthread_mutex_unlock(&L.lock);
    if (kind == DIED) return "exited or died without finalizing DDL";
    if (kind != FINALIZED) return NULL;
    return how & EXITED ? "exited after finalizing DDL" : "finalized DDL";
}

/* ---- frames ------------------------------------------------------------------------- */

static int send_frame(int fd, uint16_t type, uint16_t kind, int rank, uint32_t id, uint64_t a,
                      uint64_t b, uint64_t token) {
    frame_t f = {MAGIC, type, kind, rank, id, a, b, token};
    ssize_t w = send(fd, &f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w == (ssize_t)sizeof f ? 0 : -1;
}

static int client_send(uint16_t type, uint16_t kind, uint32_t id, uint64_t a, uint64_t b) {
    pthread_mutex_lock(&L.send_lock);
    int rc = L.client >= 0 ? send_frame(L.client, type, kind, L.rank, id, a, b, 0) : -1;
    pthread_mutex_unlock(&L.send_lock);
    return rc;
}

/* Read what is available into c's buffer; 1 with a whole frame in *f, 0 for more later,
 * -1 at end of file or error. */
static int read_frame(conn_t *c, frame_t *f) {
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->fill, sizeof c->buf - c->fill, MSG_DONTWAIT);
        if (r == 0) return -1;
        if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        c->fill += (size_t)r;
        if (c->fill == sizeof c->buf) {
            memcpy(f, c->buf, sizeof *f);
            c->fill = 0;
            return f->magic == MAGIC ? 1 : -1;
        }
    }
}

static void set_keepalive(int fd) {
    int on = 1, idle = 10, intvl = 2, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

/* ---- the record every rank keeps ----------------------------------------------------- */

static void record_gone(int rank, int kind, uint64_t a, uint64_t b, uint32_t how) {
    if (rank < 0 || rank >= L.size || kind < DIED || kind > FINALIZED) return;
    pthread_mutex_lock(&L.lock);
    int changed = L.gone[rank] == ALIVE;
    if (changed) {
        L.gone[rank] = (uint8_t)kind;
        L.final_a[rank] = a;
        L.final_b[rank] = b;
        L.order[rank] = ++L.departures;
        L.how[rank] = how;
    }
    pthread_mutex_unlock(&L.lock);
    if (changed) {
        __atomic_add_fetch(&ddl_live_gen, 1, __ATOMIC_RELEASE);
        ddl_log(1, "liveness: rank %d %s", rank, kind == DIED ? "exited or died" : "finalized");
    }
}

/* ---- hub (rank 0): accepts, relays departures, runs query rounds --------------------- */

static void hub_close(conn_t *c) {
    epoll_ctl(L.epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    for (int i = 0; i < L.nconns; i++)
        if (L.conns[i] == c) {
            L.conns[i] = L.conns[L.nconns - 1];
            L.nconns--;
            break;
        }
    if (c->rank >= 0 && L.by_rank[c->rank] == c) L.by_rank[c->rank] = NULL;
    free(c);
}

static void hub_broadcast(uint16_t type, uint16_t kind, int rank, uint32_t id, uint64_t a,
                          uint64_t b) {
    for (int r = 0; r < L.size; r++)
        if (L.by_rank[r]) send_frame(L.by_rank[r]->fd, type, kind, rank, id, a, b, 0);
}

static void hub_gone(conn_t *c, int kind, uint64_t a, uint64_t b) {
    int r = c->rank;
    hub_close(c);
    if (r < 0) return;
    hub_broadcast(F_GONE, (uint16_t)kind, r, 0, a, b);
}

static void hub_finish_round(void) {
    int P = L.size;
    int *list = malloc(sizeof(int) * (size_t)P);
    if (!list) return;
    for (int q = 0; q < P; q++) {
        want_t w = L.wants[q];
        if (!w.id) continue;
        L.wants[q].id = 0;
        if (!L.by_rank[q]) continue;
        /* The ranks worth naming: those not at the requester's collective, or silent. */
        int n = 0;
        for (int r = 0; r < P; r++) {
            uint64_t c = w.ctx == DDL_CTX_PROGRESS ? L.ans_b[r] : L.ans_a[r];
            if (!L.answered[r] && !L.by_rank[r]) continue; /* gone: GONE said so already */
            if (!L.answered[r] || c != w.seq) list[n++] = r;
        }
        int shown = n < MAX_ENTRIES ? n : MAX_ENTRIES;
        for (int i = 0; i < shown; i++) {
            int r = list[i];
            send_frame(L.by_rank[q]->fd, F_ENTRY, L.answered[r], r, w.id,
                       w.ctx == DDL_CTX_PROGRESS ? L.ans_b[r] : L.ans_a[r], 0, 0);
        }
        send_frame(L.by_rank[q]->fd, F_END, 0, 0, w.id, (uint64_t)n, 0, 0);
    }
    free(list);
    L.round = 0;
}

/* Handle one frame from c; 1 when c was closed. */
static int hub_frame(conn_t *c, const frame_t *f) {
    if (c->rank < 0) {
        /* The first frame must be a HELLO with the job's token for an unclaimed rank. */
        if (f->type != F_HELLO || f->token != L.token || f->rank < 0 || f->rank >= L.size ||
            L.by_rank[f->rank]) {
            hub_close(c);
            return 1;
        }
        c->rank = f->rank;
        L.by_rank[c->rank] = c;
        send_frame(c->fd, F_ACK, 0, c->rank, 0, 0, 0, 0);
        if (++L.hellos == L.size && L.lfd >= 0) {
            epoll_ctl(L.epfd, EPOLL_CTL_DEL, L.lfd, NULL);
            close(L.lfd); /* nobody else may connect from now on */
            L.lfd = -1;
        }
        return 0;
    }
    if (f->rank != c->rank) {
        hub_gone(c, DIED, 0, 0); /* a peer speaking for another rank is broken */
        return 1;
    }
    switch (f->type) {
    case F_BYE:
        c->said_bye = 1;
        hub_broadcast(F_GONE, FINALIZED, c->rank, f->id, f->a, f->b);
        if (c->rank == 0) __atomic_store_n(&L.hub_bye_sent, 1, __ATOMIC_RELEASE);
        break;
    case F_STATE:
        if (L.round && f->id == L.round) {
            L.answered[c->rank] = 1;
            L.ans_a[c->rank] = f->a;
            L.ans_b[c->rank] = f->b;
        }
        break;
    case F_QUERY:
        L.wants[c->rank] = (want_t){f->id ? f->id : 1, f->kind, f->a};
        if (!L.round) {
            static uint32_t rounds;
            L.round = ++rounds ? rounds : ++rounds;
            L.round_end = ddl_now() + ANSWER_S;
            memset(L.answered, 0, (size_t)L.size);
            hub_broadcast(F_ASK, 0, 0, L.round, 0, 0);
        }
        break;
    default: hub_gone(c, DIED, 0, 0); return 1;
    }
    return 0;
}

static int hub_round_complete(void) {
    for (int r = 0; r < L.size; r++)
        if (L.by_rank[r] && !L.answered[r]) return 0;
    return 1;
}

static void hub_accept(void) {
    for (;;) {
        int fd = accept4(L.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        conn_t *c = calloc(1, sizeof *c);
        conn_t **grown = realloc(L.conns, sizeof *grown * (size_t)(L.nconns + 1));
        if (!c || !grown) {
            free(c);
            if (grown) L.conns = grown;
            close(fd);
            return;
        }
        L.conns = grown;
        c->fd = fd;
        c->rank = -1;
        set_keepalive(fd);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(L.epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            return;
        }
        L.conns[L.nconns] = c;
        __atomic_store_n(&L.nconns, L.nconns + 1, __ATOMIC_RELEASE);
    }
}

/* ---- client side: every rank's view of the others ------------------------------------- */

static conn_t client_conn;

/* 0 to go on, -1 when the hub is gone. */
static int client_frames(void) {
    frame_t f;
    int rc;
    while ((rc = read_frame(&client_conn, &f)) == 1) {
        switch (f.type) {
        case F_GONE: record_gone(f.rank, f.kind, f.a, f.b, f.id); break;
        case F_ASK:
            client_send(F_STATE, 0, f.id, ctx_reached(DDL_CTX_APP),
                        ctx_reached(DDL_CTX_PROGRESS));
            break;
        case F_ENTRY:
            pthread_mutex_lock(&L.lock);
            if (f.id == L.next_id && L.got_n < MAX_ENTRIES && f.rank >= 0 && f.rank < L.size) {
                L.got_rank[L.got_n] = f.rank;
                L.got_ok[L.got_n] = f.kind;
                L.got_count[L.got_n] = f.a;
                L.got_n++;
            }
            pthread_mutex_unlock(&L.lock);
            break;
        case F_END:
            pthread_mutex_lock(&L.lock);
            if (f.id == L.next_id) {
                L.got_total = (int)f.a;
                L.done_id = f.id;
                pthread_cond_broadcast(&L.cond);
            }
            pthread_mutex_unlock(&L.lock);
            break;
        default: break; /* ACK (read at setup) or nothing we know: ignore */
        }
    }
    return rc < 0 ? -1 : 0;
}

static void *watcher_main(void *arg) {
    (void)arg;
    struct epoll_event evs[64];
    for (;;) {
        int timeout = -1;
        if (L.hub && L.round) {
            double left = L.round_end - ddl_now();
            timeout = left > 0 ? (int)(left * 1000) + 1 : 0;
        }
        int n = epoll_wait(L.epfd, evs, 64, timeout);
        if (n < 0 && errno != EINTR) break;
        int stop = 0;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &L.wake) {
                stop = 1;
            } else if (p == &L.lfd) {
                hub_accept();
            } else if (p == &client_conn) {
                if (client_frames() < 0 && !__atomic_load_n(&L.stopping, __ATOMIC_ACQUIRE)) {
                    /* Rank 0's watcher is gone: rank 0 ended (unless it said so first). */
                    record_gone(0, DIED, 0, 0, 0);
                    epoll_ctl(L.epfd, EPOLL_CTL_DEL, client_conn.fd, NULL);
                    if (!L.hub) stop = 1;
                }
            } else {
                conn_t *c = p;
                frame_t f;
                int rc = 0, closed = 0;
                while (!closed && (rc = read_frame(c, &f)) == 1) closed = hub_frame(c, &f);
                /* End of file: after a BYE the others know already; without one, it died. */
                if (!closed && rc < 0) {
                    if (c->said_bye)
                        hub_close(c);
                    else
                        hub_gone(c, DIED, 0, 0);
                }
            }
        }
        if (L.hub && L.round && (hub_round_complete() || ddl_now() >= L.round_end))
            hub_finish_round();
        if (stop) break;
    }
    return NULL;
}

/* ---- setup ---------------------------------------------------------------------------- */

typedef struct {
    uint64_t token;
    uint32_t port; /* network order in the low 16 bits */
    uint32_t naddr;
    uint32_t addr[MAX_ADDRS]; /* IPv4, network order; non-loopback first */
} hub_info_t;

static void local_addresses(hub_info_t *h) {
    struct ifaddrs *ifs = NULL, *i;
    h->naddr = 0;
    if (getifaddrs(&ifs) == 0) {
        for (i = ifs; i && h->naddr < MAX_ADDRS - 1; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
            h->addr[h->naddr++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        }
        freeifaddrs(ifs);
    }
    h->addr[h->naddr++] = htonl(INADDR_LOOPBACK);
}

/* Connect to one address within `secs`, say HELLO and read the ACK; the fd or -1. */
static int try_connect(uint32_t addr, uint16_t port, uint64_t token, double secs) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
    sa.sin_addr.s_addr = addr;
    double end = ddl_now() + secs;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) goto fail;
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    if (poll(&pfd, 1, (int)(secs * 1000)) != 1) goto fail;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) goto fail;
    set_keepalive(fd);
    if (send_frame(fd, F_HELLO, 0, L.rank, 0, 0, 0, token) != 0) goto fail;
    conn_t c = {.fd = fd};
    frame_t f;
    for (;;) {
        double left = end - ddl_now();
        pfd.events = POLLIN;
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) != 1) goto fail;
        int rc = read_frame(&c, &f);
        if (rc < 0) goto fail;
        if (rc == 1) break;
    }
    if (f.type != F_ACK || f.rank != L.rank) goto fail;
    return fd;
fail:
    close(fd);
    return -1;
}

static void child_after_fork(void) {
    /* The child has no watcher thread; its copies of the sockets would only keep a dead
     * parent's connections open. */
    if (!L.active && L.client < 0) return;
    if (L.client >= 0) close(L.client);
    if (L.lfd >= 0) close(L.lfd);
    int n = __atomic_load_n(&L.nconns, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++)
        if (L.conns && L.conns[i]) close(L.conns[i]->fd);
    if (L.epfd >= 0) close(L.epfd);
    if (L.wake >= 0) close(L.wake);
    L.client = L.lfd = L.epfd = L.wake = -1;
    L.active = 0;
    L.thread_started = 0;
}

static void teardown(void) {
    if (L.thread_started) {
        uint64_t one = 1;
        if (write(L.wake, &one, sizeof one) < 0) { /* the thread may have ended */ }
        pthread_join(L.thread, NULL);
        L.thread_started = 0;
    }
    for (int i = 0; i < L.nconns; i++) {
        close(L.conns[i]->fd);
        free(L.conns[i]);
    }
    L.nconns = 0;
    pthread_mutex_lock(&L.send_lock);
    if (L.client >= 0) close(L.client);
    L.client = -1;
    pthread_mutex_unlock(&L.send_lock);
    if (L.lfd >= 0) close(L.lfd);
    if (L.epfd >= 0) close(L.epfd);
    if (L.wake >= 0) close(L.wake);
    L.lfd = L.epfd = L.wake = -1;
    L.active = 0;
}


static void raise_fd_limit(int need) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)need &&
        rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = (rlim_t)need < rl.rlim_max ? (rlim_t)need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Rank 0: listen, and start the watcher so connections are accepted while MPI runs. */
static int hub_open(hub_info_t *info) {
    raise_fd_limit(L.size + 256);
    L.lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (L.lfd < 0) return -1;
    int on = 1;
    setsockopt(L.lfd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof sa;
    if (bind(L.lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(L.lfd, L.size < 4096 ? L.size : 4096) != 0 ||
        getsockname(L.lfd, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    info->port = sa.sin_port;
    if (getrandom(&L.token, sizeof L.token, 0) != (ssize_t)sizeof L.token) return -1;
    info->token = L.token;
    local_addresses(info);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &L.lfd};
    if (epoll_ctl(L.epfd, EPOLL_CTL_ADD, L.lfd, &ev) != 0) return -1;
    if (pthread_create(&L.thread, NULL, watcher_main, NULL) != 0) return -1;
    L.thread_started = 1;
    return 0;
}

static int alloc_tables(void) {
    size_t P = (size_t)L.size;
    L.gone = calloc(P, 1);
    L.final_a = calloc(P, sizeof(uint64_t));
    L.final_b = calloc(P, sizeof(uint64_t));
    L.order = calloc(P, sizeof(uint32_t));
    L.how = calloc(P, sizeof(uint32_t));
    if (!L.gone || !L.final_a || !L.final_b || !L.order || !L.how) return -1;
    if (!L.hub) return 0;
    L.by_rank = calloc(P, sizeof *L.by_rank);
    L.answered = calloc(P, 1);
    L.ans_a = calloc(P, sizeof(uint64_t));
    L.ans_b = calloc(P, sizeof(uint64_t));
    L.wants = calloc(P, sizeof *L.wants);
    return L.by_rank && L.answered && L.ans_a && L.ans_b && L.wants ? 0 : -1;
}

ddl_status_t ddl_liveness_start(void) {
    int on;
    on = ddl_g.liveness; /* DDL_LIVENESS, read and agreed on by ddl_init (config.c) */
    ddl_g.app.id = DDL_CTX_APP;
    ddl_g.progress.id = DDL_CTX_PROGRESS;
    L.rank = ddl_g.rank;
    L.size = ddl_g.size;
    L.hub = L.rank == 0;
    if (!on || L.size < 2) return DDL_SUCCESS;
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, child_after_fork) == 0) atfork_done = 1;

    const char *why = NULL;
    hub_info_t info;
    memset(&info, 0, sizeof info);
    int ok = 1;
    L.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    L.epfd = epoll_create1(EPOLL_CLOEXEC);
    if (L.wake < 0 || L.epfd < 0 || alloc_tables() != 0) {
        ok = 0;
        why = "no file descriptors or memory for the watcher";
    } else {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &L.wake};
        epoll_ctl(L.epfd, EPOLL_CTL_ADD, L.wake, &ev);
    }
    if (ok && L.hub && hub_open(&info) != 0) {
        ok = 0;
        why = "rank 0 could not listen on a TCP port";
    }
    /* Rank 0 tells everyone where its watcher listens (an empty address list: it failed). */
    if (!ok) info.naddr = 0;
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(&info, (int)sizeof info, MPI_BYTE, 0, ddl_g.app.world.comm, &req));
    DDL_CHECK(ddl_wait_request(&req, &ddl_g.app.world, "sharing the liveness watcher's address"));
    if (info.naddr == 0 || info.naddr > MAX_ADDRS) {
        ok = 0;
        if (!why) why = "rank 0 has no watcher";
    }
    if (ok) {
        L.client = -1;
        if (L.hub) {
            L.client = try_connect(htonl(INADDR_LOOPBACK), (uint16_t)info.port, info.token, 5.0);
        } else {
            for (uint32_t i = 0; i < info.naddr && L.client < 0; i++)
                L.client = try_connect(info.addr[i], (uint16_t)info.port, info.token, 3.0);
        }
        if (L.client < 0) {
            ok = 0;
            why = "cannot reach rank 0's watcher over TCP at any of its addresses";
        }
    }
    if (ok) {
        client_conn.fd = L.client;
        client_conn.fill = 0;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &client_conn};
        if (epoll_ctl(L.epfd, EPOLL_CTL_ADD, L.client, &ev) != 0) ok = 0;
        if (ok && !L.hub) {
            if (pthread_create(&L.thread, NULL, watcher_main, NULL) != 0)
                ok = 0;
            else
                L.thread_started = 1;
        }
    }
    /* Everyone or no one: a rank without a connection would be reported dead. */
    int all = ok;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, ddl_g.app.world.comm, &req));
    DDL_CHECK(ddl_wait_request(&req, &ddl_g.app.world, "connecting the liveness watcher"));
    if (!all) {
        if (why)
            ddl_log(0, "liveness check off: %s; a lost peer is reported after DDL_TIMEOUT "
                       "(%g s) instead (DDL_LIVENESS=0 silences this)",
                    why, ddl_timeout_s);
        teardown();
        return DDL_SUCCESS;
    }
    L.active = 1;
    ddl_log(1, "liveness: connected to rank 0's watcher");
    return DDL_SUCCESS;
}

static int bye_deferred; /* the exit path says BYE itself, with the status (exit.c) */

static void stop(uint32_t how) {
    if (!L.active) return;
    /* BYE travels before the connection closes (TCP keeps the order), so the others read
     * "finalized" and never "died". Rank 0's own BYE goes through its watcher, which relays
     * it before it stops. */
    __atomic_store_n(&L.stopping, 1, __ATOMIC_RELEASE);
    client_send(F_BYE, 0, how, ctx_seq(DDL_CTX_APP), ctx_seq(DDL_CTX_PROGRESS));
    if (L.hub) {
        /* Let the watcher read and relay our BYE (at most a moment) before it stops. */
        double end = ddl_now() + 0.2;
        while (!__atomic_load_n(&L.hub_bye_sent, __ATOMIC_ACQUIRE) && ddl_now() < end) {
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    teardown();
}

void ddl_liveness_stop(void) {
    if (!bye_deferred) stop(0);
}

void ddl_liveness_defer_bye(void) { bye_deferred = 1; }

void ddl_liveness_stop_exiting(int status) {
    if (!bye_deferred) return;
    bye_deferred = 0;
    stop(EXITED | ((uint32_t)status & 0xffu));
}

/* ---- diagnosis of a timeout ------------------------------------------------------------- */

int ddl_liveness_diagnose(char *out, size_t n) {
    if (!L.active || L.client < 0 || ddl_cur.ctx < 0) return 0;
    pthread_mutex_lock(&L.query_lock);
    pthread_mutex_lock(&L.lock);
    uint32_t id = ++L.next_id ? L.next_id : ++L.next_id;
    L.got_n = 0;
    pthread_mutex_unlock(&L.lock);
    int ctx = ddl_cur.ctx;
    uint64_t seq = ddl_cur.seq;
    int ok = client_send(F_QUERY, (uint16_t)ctx, id, seq, 0) == 0;
    pthread_mutex_lock(&L.lock);
    double end = ddl_now() + 2 * ANSWER_S + 0.5;
    while (ok && L.done_id != id) {
        double left = end - ddl_now();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + (left < 0.05 ? left : 0.05);
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&L.cond, &L.lock, &ts);
    }
    int got = ok && L.done_id == id;
    int cnt = L.got_n, total = L.got_total;
    int rk[MAX_ENTRIES], okk[MAX_ENTRIES];
    uint64_t c[MAX_ENTRIES];
    memcpy(rk, L.got_rank, sizeof rk);
    memcpy(okk, L.got_ok, sizeof okk);
    memcpy(c, L.got_count, sizeof c);
    pthread_mutex_unlock(&L.lock);
    pthread_mutex_unlock(&L.query_lock);
    if (!got) return 0;

    int behind[MAX_ENTRIES], ahead[MAX_ENTRIES], mute[MAX_ENTRIES], nb = 0, na = 0, nm = 0;
    uint64_t last = 0;
    for (int i = 0; i < cnt; i++) {
        if (!okk[i])
            mute[nm++] = rk[i];
        else if (c[i] < seq) {
            if (!nb) last = c[i];
            behind[nb++] = rk[i];
        } else {
            ahead[na++] = rk[i];
        }
    }
    char b[256], a[256], m[256];
    ddl_format_ranks(b, sizeof b, behind, nb);
    ddl_format_ranks(a, sizeof a, ahead, na);
    ddl_format_ranks(m, sizeof m, mute, nm);
    size_t len = 0;
    out[0] = 0;
    char lastword[96];
    if (last)
        snprintf(lastword, sizeof lastword, "%s collective #%llu is the last it reached",
                 ctx_words(ctx), (unsigned long long)last);
    else
        snprintf(lastword, sizeof lastword, "it reached no %s collective yet", ctx_words(ctx));
    if (nb)
        len += (size_t)snprintf(out + len, n - len,
                                "rank%s %s %s not reached it (%s: hung, busy, or calling "
                                "something else)",
                                nb > 1 ? "s" : "", b, nb > 1 ? "have" : "has", lastword);
    if (na && len < n)
        len += (size_t)snprintf(out + len, n - len, "%srank%s %s %s already past it (the ranks "
                                "called different collectives)",
                                len ? "; " : "", na > 1 ? "s" : "", a, na > 1 ? "are" : "is");
    if (nm && len < n)
        len += (size_t)snprintf(out + len, n - len, "%srank%s %s did not answer the liveness "
                                "watcher (stopped or overloaded)",
                                len ? "; " : "", nm > 1 ? "s" : "", m);
    if (total > cnt && len < n)
        len += (size_t)snprintf(out + len, n - len, " (and %d more)", total - cnt);
    if (!total && len < n)
        len += (size_t)snprintf(out + len, n - len,
                                "every rank has reached it, so a message is stuck (a slow or "
                                "broken link?)");
    return len > 0;
}

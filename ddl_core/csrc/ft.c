/* Fault tolerance on ULFM (MPI's User-Level Failure Mitigation, in Open MPI 5 as the
 * MPIX_ extension, enabled at run time by `mpirun --with-ft ulfm`).
 *
 * Without it a rank's death ends the job (the launcher kills the others, or the liveness
 * watcher fails every survivor's collective with DDL_ERR_PEER_LOST and the job ends). With
 * it the survivors live on: every survivor's pending and next call on a communicator that
 * lost a member fails with DDL_ERR_PROC_FAILED naming the dead members, and
 * ddl_comm_shrink gives them a new communicator agreed by all of them.
 *
 * How a failure reaches every survivor: whoever sees it first (an MPI call returning
 * MPIX_ERR_PROC_FAILED, or the liveness watcher's notice of a death) revokes every MPI
 * communicator of that libddl communicator (the application's, the topology levels, the
 * progress thread's, point-to-point). A revoke reaches every member and makes each of
 * their pending and later operations on those communicators fail with MPIX_ERR_REVOKED,
 * which comes back here too: so a rank that waits for a live neighbour (which itself waits
 * for the dead one) is released at once instead of at its deadline. The two detectors
 * coexist: the watcher (rank 0 as hub) is usually first; when rank 0 itself dies the
 * watcher is gone for good and ULFM's own detector reports that death and later ones.
 *
 * The dead members are named from MPIX_Comm_get_failed (ULFM's local knowledge) and the
 * watcher's: a survivor released by another's revoke may not know yet which rank died,
 * so it waits briefly (FAILED_WAIT_S) for its own detector to say. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddl_internal.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && defined(MPIX_ERR_PROC_FAILED)
#define HAVE_ULFM 1
#else
#define HAVE_ULFM 0
#endif

#define FAILED_WAIT_S 2.0 /* how long a revoked survivor waits to learn which rank died */

int ddl_ft = 0;
_Thread_local struct ddl_comm_s *ddl_cur_comm = NULL;

/* The ranks the calling thread's last DDL_ERR_PROC_FAILED named (ddl_last_failed_ranks). */
#define MAX_NOTED 256
static _Thread_local int noted[MAX_NOTED];
static _Thread_local int nnoted = 0;

/* Fault-tolerant mode needs both: ULFM on in the MPI library, which mpirun --with-ft ulfm
 * (and --mca mpi_ft_enable 1) hand every rank as OMPI_MCA_mpi_ft_enable, and DDL_ELASTIC=1
 * (ddlrun --elastic sets it). ULFM alone is not enough: ddlrun turns it on under
 * --runtime-options recoverable too, where a death must stay a PeerLostError that ends
 * the job as it always did. */
int ddl_elastic = 0;

void ddl_ft_detect(void) {
#if HAVE_ULFM
    const char *v = getenv("OMPI_MCA_mpi_ft_enable");
    int ulfm = v && (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes"));
    ddl_ft = ulfm && ddl_elastic;
#else
    ddl_ft = 0;
#endif
}

int ddl_ft_error(int mpi_rc) {
#if HAVE_ULFM
    if (!ddl_ft || mpi_rc == MPI_SUCCESS) return 0;
    int cls = mpi_rc;
    if (MPI_Error_class(mpi_rc, &cls) != MPI_SUCCESS) cls = mpi_rc;
    return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING ||
           cls == MPIX_ERR_REVOKED;
#else
    (void)mpi_rc;
    return 0;
#endif
}

int ddl_ft_exempt(const char *fn) {
    static const char *const ok[] = {"ddl_comm_rank", "ddl_comm_size", "ddl_comm_world_rank",
                                     "ddl_comm_topology", "ddl_comm_set_timeout",
                                     "ddl_comm_free", "ddl_comm_shrink", "ddl_comm_failed_ranks"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(fn, ok[i])) return 1;
    return 0;
}

#if HAVE_ULFM
static int *seq_fill(int *seq, int n) {
    for (int i = 0; seq && i < n; i++) seq[i] = i;
    return seq;
}

static void revoke_one(MPI_Comm c) {
    if (c != MPI_COMM_NULL) (void)MPIX_Comm_revoke(c); /* a second revoke is harmless */
}

static void revoke_ctx(ddl_ctx_t *x) {
    revoke_one(x->world.comm);
    revoke_one(x->topo.world.comm);
    for (int l = 0; l < x->topo.nlevels; l++) revoke_one(x->topo.level[l].comm);
}
#endif

void ddl_ft_revoke(struct ddl_comm_s *c) {
#if HAVE_ULFM
    if (!ddl_ft || !c) return;
    revoke_ctx(c->ctx);
    revoke_ctx(c->is_world ? &ddl_g.progress : &c->prog);
    revoke_one(c->p2p);
#else
    (void)c;
#endif
}

/* ULFM's failed processes among c's members, as c's ranks; returns how many. */
static int ulfm_failed(struct ddl_comm_s *c, int *out) {
#if HAVE_ULFM
    MPI_Comm comm = c->ctx->world.comm;
    MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
    int n = 0, got = 0;
    if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return 0;
    if (MPI_Group_size(failed, &n) == MPI_SUCCESS && n > 0 &&
        MPI_Comm_group(comm, &all) == MPI_SUCCESS) {
        int *seq = seq_fill(malloc(sizeof(int) * (size_t)n), n);
        if (seq && MPI_Group_translate_ranks(failed, n, seq, all, out) == MPI_SUCCESS) got = n;
        free(seq);
        MPI_Group_free(&all);
    }
    MPI_Group_free(&failed);
    return got;
#else
    (void)c, (void)out;
    return 0;
#endif
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Merge what both detectors know into c->failed (sorted, unique). */
static void gather_failed(struct ddl_comm_s *c) {
    int size = c->ctx->world.size;
    int *tmp = malloc(sizeof(int) * (size_t)(2 * size + c->nfailed + 1));
    if (!tmp) return;
    int n = 0;
    for (int i = 0; i < c->nfailed; i++) tmp[n++] = c->failed[i];
    n += ulfm_failed(c, tmp + n);
    n += ddl_liveness_dead_members(c, tmp + n);
    qsort(tmp, (size_t)n, sizeof(int), cmp_int);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (tmp[i] >= 0 && tmp[i] < size && (u == 0 || tmp[u - 1] != tmp[i])) tmp[u++] = tmp[i];
    free(c->failed);
    c->failed = tmp;
    c->nfailed = u;
}

/* c->failed and c->nfailed change under this lock (two threads may see one failure). */
static pthread_mutex_t ft_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_locked(struct ddl_comm_s *c) {
    nnoted = 0;
    if (!c || c->magic != DDL_COMM_MAGIC) return;
    for (int i = 0; i < c->nfailed && nnoted < MAX_NOTED; i++) noted[nnoted++] = c->failed[i];
}

void ddl_ft_note(struct ddl_comm_s *c) {
    pthread_mutex_lock(&ft_lock);
    note_locked(c);
    pthread_mutex_unlock(&ft_lock);
}

ddl_status_t ddl_ft_refuse(struct ddl_comm_s *c, const char *fn) {
    char list[256] = "";
    pthread_mutex_lock(&ft_lock);
    ddl_format_ranks(list, sizeof list, c->failed, c->nfailed);
    int n = c->nfailed;
    note_locked(c);
    pthread_mutex_unlock(&ft_lock);
    return ddl_fail(DDL_ERR_PROC_FAILED,
                    "%s: this communicator lost member%s %s: shrink it (comm.shrink(), "
                    "ddl_core.shrink_world()) to go on without %s",
                    fn, n == 1 ? "" : "s", n ? list : "(not known yet)", n == 1 ? "it" : "them");
}

ddl_status_t ddl_last_failed_ranks(int *ranks, int max, int *n) {
    if (!n || (max > 0 && !ranks))
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_last_failed_ranks: NULL argument");
    int k = 0;
    for (; k < nnoted && k < max; k++) ranks[k] = noted[k];
    *n = nnoted;
    return DDL_SUCCESS;
}

ddl_status_t ddl_ft_fail_comm(struct ddl_comm_s *c, int mpi_rc, const char *what) {
    if (!c) {
        nnoted = 0;
        return ddl_fail(DDL_ERR_PROC_FAILED, "%s: a process of the job failed", what);
    }
    /* Release every member first, then find out which rank it was. MPI_Finalize would
     * wait for the dead (as after a lost peer without ULFM): the exit skips it. */
    ddl_ft_revoke(c);
    ddl_liveness_mark_broken();
    double until = ddl_now() + FAILED_WAIT_S;
    for (;;) {
        pthread_mutex_lock(&ft_lock);
        gather_failed(c);
        __atomic_store_n(&c->ft_failed, 1, __ATOMIC_RELEASE);
        int known = c->nfailed;
        pthread_mutex_unlock(&ft_lock);
        if (known || ddl_now() > until) break;
#if HAVE_ULFM
        /* ULFM learns of a failure in MPI's progress: make some (on MPI_COMM_SELF: a
         * probe on the revoked communicator returns before progressing anything). */
        int f = 0;
        (void)MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &f, MPI_STATUS_IGNORE);
#endif
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
    (void)mpi_rc;
    pthread_mutex_lock(&ft_lock);
    note_locked(c);
    char list[256] = "";
    ddl_format_ranks(list, sizeof list, c->failed, c->nfailed);
    int n = c->nfailed;
    pthread_mutex_unlock(&ft_lock);
    char call[128];
    ddl_describe_call(call, sizeof call);
    if (n == 0)
        return ddl_fail(DDL_ERR_PROC_FAILED,
                        "%s: a member of this communicator failed (seen by %s; which one is not "
                        "known here yet): shrink the communicator (comm.shrink(), "
                        "ddl_core.shrink_world()) to go on without it",
                        call, what);
    return ddl_fail(DDL_ERR_PROC_FAILED,
                    "%s: rank%s %s of this communicator failed (seen by %s): shrink the "
                    "communicator (comm.shrink(), ddl_core.shrink_world()) to go on without %s",
                    call, n > 1 ? "s" : "", list, what, n > 1 ? "them" : "it");
}

ddl_status_t ddl_ft_fail(int mpi_rc, const char *what) {
    struct ddl_comm_s *c = ddl_cur.cctx && ddl_cur.cctx->owner ? ddl_cur.cctx->owner
                                                               : ddl_cur_comm;
    return ddl_ft_fail_comm(c, mpi_rc, what);
}

ddl_status_t ddl_fault_tolerant(int *on) {
    if (!on) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_fault_tolerant: NULL pointer");
    if (!ddl_initialized()) { /* before init: what init would decide */
        const char *e = getenv("DDL_ELASTIC");
        int known = 0;
        double d = 0;
        ddl_elastic = e && ddl_check_setting("DDL_ELASTIC", e, &known, &d) == DDL_SUCCESS &&
                      d == 1;
        ddl_ft_detect();
    }
    *on = ddl_ft;
    return DDL_SUCCESS;
}

ddl_status_t ddl_comm_failed_ranks(ddl_comm_t c, int *ranks, int max, int *n) {
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_failed_ranks", &saved));
    ddl_comm_leave(saved);
    if (!n || (max > 0 && !ranks))
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_failed_ranks: NULL argument");
    pthread_mutex_lock(&ft_lock);
    if (ddl_ft) gather_failed(c);
    for (int i = 0; i < c->nfailed && i < max; i++) ranks[i] = c->failed[i];
    *n = c->nfailed;
    pthread_mutex_unlock(&ft_lock);
    return DDL_SUCCESS;
}

/* ---- shrink ---------------------------------------------------------------------------- */

#if HAVE_ULFM
/* comm.c builds the communicator; here the survivors agree on it. */
ddl_status_t ddl_comm_setup_from(ddl_comm_t c, MPI_Comm newcomm);
void ddl_comm_teardown(ddl_comm_t c);
#endif

#define SHRINK_TRIES 16

#if HAVE_ULFM
/* The shrink's bound. MPIX_Comm_shrink and MPIX_Comm_agree block, and Open MPI 5.0.11's
 * agreement (coll/ftagree) was seen to wait forever when a member dies inside it (about
 * half the runs of test_ulfm's death-during-shrink case; no MCA setting avoids it; see
 * open-mpi/ompi#13501 for a fix of that agreement's view of failed processes): rather
 * than hang, a rank whose shrink has not returned within the communicator's timeout says
 * so and exits, so the job ends with that error. */
typedef struct {
    pthread_mutex_t m;
    pthread_cond_t c;
    int done;
    double secs;
    int rank;
} watch_t;

static void *watch_main(void *arg) {
    watch_t *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double end = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + w->secs;
    until.tv_sec = (time_t)end;
    until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&w->m);
    int rc = 0;
    while (!w->done && rc == 0) rc = pthread_cond_timedwait(&w->c, &w->m, &until);
    int done = w->done;
    pthread_mutex_unlock(&w->m);
    if (!done) {
        fprintf(stderr,
                "[ddl rank %d] ddl_comm_shrink: no result within %.3g s (the communicator's "
                "timeout): a member died during the shrink and the MPI library's agreement "
                "did not recover (Open MPI 5.0.11's does not always); this rank exits "
                "instead of hanging\n",
                w->rank, w->secs);
        fflush(stderr);
        _exit(1);
    }
    return NULL;
}
#endif

#if HAVE_ULFM
#define VOUCH_WAIT_S 3.0 /* how long the watcher may lag behind MPI in naming a death */

/* The members of c that the shrunk communicator s left out, as c's ranks; returns how
 * many, or -1 if MPI cannot say. */
static int left_out(struct ddl_comm_s *c, MPI_Comm s, int *crank) {
    MPI_Group all = MPI_GROUP_NULL, kept = MPI_GROUP_NULL, out = MPI_GROUP_NULL;
    int n = -1;
    if (MPI_Comm_group(c->ctx->world.comm, &all) == MPI_SUCCESS &&
        MPI_Comm_group(s, &kept) == MPI_SUCCESS &&
        MPI_Group_difference(all, kept, &out) == MPI_SUCCESS &&
        MPI_Group_size(out, &n) == MPI_SUCCESS && n > 0) {
        int *seq = malloc(sizeof(int) * (size_t)n);
        if (!seq || MPI_Group_translate_ranks(out, n, seq_fill(seq, n), all, crank) !=
                        MPI_SUCCESS)
            n = -1;
        free(seq);
    }
    if (out != MPI_GROUP_NULL) MPI_Group_free(&out);
    if (kept != MPI_GROUP_NULL) MPI_Group_free(&kept);
    if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
    return n;
}

/* Open MPI's fault tolerance takes the peer of a broken TCP connection for dead. A host
 * whose MPI connections break (tests/cluster/test_elastic_netfault.py cuts them) sees every
 * other rank fail while the others see it fail: each side shrinks to a world of its own
 * and both go on, with different parameters. Open MPI 5.0.11 was also seen (1 to 4 trials
 * in 100, 8 ranks on 4 emulated hosts, with libevent's "Epoll ADD ... Bad file descriptor"
 * warnings) to leave one survivor in a world of its own while the others, who still
 * counted it, waited for it in theirs. libddl's liveness watcher, on connections of its
 * own, knows better (a dead process's socket closes at once): a survivor that MPI would
 * leave with fewer ranks than it leaves out of those the watcher still vouches for (after
 * VOUCH_WAIT_S) is in the minority and wrong (of an even split: the side without the
 * lowest launch rank alive). It leaves, as a failed rank, and the others go on in one
 * world. Not once spawned ranks were merged in: the watcher knows the launch world's ranks
 * only.
 *
 * out[] (c's ranks) are the members MPI takes for failed, kept how many it would keep.
 * A decision to stay is never wrong because the watcher lags (it only vouches for fewer
 * ranks as it learns of deaths), so only a decision to leave waits for it. */
static void leave_if_outnumbered(struct ddl_comm_s *c, const int *out, int n, int kept) {
    int size = c->ctx->world.size;
    if (ddl_foreign_members || n <= 0 || n < kept) return; /* a majority never leaves */
    int *wrank = malloc(sizeof(int) * 2 * (size_t)size);
    if (!wrank) return;
    int *alive_r = wrank + size;
    for (int i = 0; i < n; i++) wrank[i] = ddl_comm_world_of(c, out[i]);
    int low_kept = size;
    for (int r = 0; r < size; r++) {
        int out_r = 0;
        for (int i = 0; i < n && !out_r; i++) out_r = out[i] == r;
        int w = ddl_comm_world_of(c, r);
        if (!out_r && w < low_kept) low_kept = w;
    }
    double until = ddl_now() + VOUCH_WAIT_S;
    int m = 0;
    for (;;) {
        int low_out = size;
        m = 0;
        for (int i = 0; i < n; i++)
            if (ddl_liveness_vouches(wrank[i])) {
                alive_r[m++] = out[i];
                if (wrank[i] < low_out) low_out = wrank[i];
            }
        int leave = m > kept || (m > 0 && m == kept && low_out < low_kept);
        if (!leave) {
            free(wrank);
            return;
        }
        if (ddl_now() > until) break;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char list[256] = "";
    ddl_format_ranks(list, sizeof list, alive_r, m);
    fprintf(stderr,
            "[ddl rank %d] ddl_comm_shrink: the MPI library takes rank%s %s for failed, which "
            "libddl's liveness watcher knows to be alive (or to have finished without this "
            "rank), and would leave this rank with %d "
            "of the communicator's ranks: this rank's MPI took live peers for dead (a broken "
            "connection, or a wrong failure report), and the survivors would not agree on one "
            "world; it leaves (as a failed rank) so that the others go on without it\n",
            ddl_g.rank, m == 1 ? "" : "s", list, kept);
    fflush(stderr);
    _exit(1);
}

/* Before the shrink: the members MPI has reported failed so far. Leaving here, rather
 * than after a shrink, keeps a cut-off minority out of the others' agreement, which Open
 * MPI 5.0.11 was seen to crash in (SIGSEGV in coll/ftagree) while live ranks it had taken
 * for dead still sent to it. */
static void leave_if_cut_off(struct ddl_comm_s *c) {
    pthread_mutex_lock(&ft_lock);
    gather_failed(c);
    int n = c->nfailed, *out = n ? malloc(sizeof(int) * (size_t)n) : NULL;
    if (out) memcpy(out, c->failed, sizeof(int) * (size_t)n);
    pthread_mutex_unlock(&ft_lock);
    if (!out) return;
    leave_if_outnumbered(c, out, n, c->ctx->world.size - n);
    free(out);
}

/* After the shrink: the members the shrunk communicator s left out. */
static void leave_if_wrongly_alone(struct ddl_comm_s *c, MPI_Comm s) {
    int size = c->ctx->world.size, kept = 0;
    if (ddl_foreign_members || MPI_Comm_size(s, &kept) != MPI_SUCCESS) return;
    int *crank = malloc(sizeof(int) * (size_t)size);
    if (!crank) return;
    int n = left_out(c, s, crank);
    leave_if_outnumbered(c, crank, n, kept);
    free(crank);
}
#endif

ddl_status_t ddl_comm_shrink(ddl_comm_t c, ddl_comm_t *out) {
    double saved;
    DDL_CHECK(ddl_comm_enter(c, "ddl_comm_shrink", &saved));
    ddl_comm_leave(saved);
    if (!out) return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_comm_shrink: NULL output pointer");
    *out = NULL;
#if HAVE_ULFM
    if (!ddl_ft)
        return ddl_fail(DDL_ERR_UNSUPPORTED,
                        "ddl_comm_shrink: the job does not run with fault tolerance: launch it "
                        "with `ddlrun --elastic` (or mpirun --with-ft ulfm -x DDL_ELASTIC=1)");
    /* Everyone still in a call on c is released, whether or not it saw the failure. */
    ddl_ft_revoke(c);
    __atomic_store_n(&c->ft_failed, 1, __ATOMIC_RELEASE);
    leave_if_cut_off(c);
    /* While the survivors build the new communicator the watcher's dead ranks are no
     * member's (ULFM reports a death during the shrink). */
    ddl_coll_t cur = ddl_cur;
    static const int none = -1;
    ddl_cur.members = &none;
    ddl_cur.nmembers = 0;
    ddl_cur.cctx = NULL;
    ddl_cur.name = "comm_shrink";
    watch_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, ddl_deadline_s(),
                 ddl_g.rank};
    pthread_t watcher;
    int watching = pthread_create(&watcher, NULL, watch_main, &w) == 0;
    MPI_Comm from = c->ctx->world.comm, prev = MPI_COMM_NULL;
    ddl_status_t st = DDL_SUCCESS;
    ddl_comm_t nc = NULL;
    for (int attempt = 0; attempt < SHRINK_TRIES; attempt++) {
        MPI_Comm s = MPI_COMM_NULL;
        int rc = MPIX_Comm_shrink(from, &s);
        if (rc != MPI_SUCCESS) {
            st = ddl_fail(DDL_ERR_PROC_FAILED, "ddl_comm_shrink: MPIX_Comm_shrink failed "
                          "(MPI error %d)", rc);
            if (ddl_ft_error(rc)) continue; /* another failure meanwhile: once more */
            break;
        }
        leave_if_wrongly_alone(c, s);
        MPI_Comm agreed = MPI_COMM_NULL;
        rc = MPI_Comm_set_errhandler(s, MPI_ERRORS_RETURN);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(s, &agreed);
        nc = calloc(1, sizeof *nc);
        int ok = rc == MPI_SUCCESS && nc != NULL;
        if (ok) {
            ddl_cur_comm = c;
            ok = ddl_comm_setup_from(nc, agreed) == DDL_SUCCESS;
            agreed = MPI_COMM_NULL; /* nc owns it now, built or not */
            /* A member that could not build its part (another death meanwhile) revokes
             * what it built, so the others, still in a collective of the setup (MPI's
             * split and dup have no timeout), are released into the agreement below
             * instead of waiting there for it. */
            if (!ok) ddl_ft_revoke(nc);
        } else if (agreed != MPI_COMM_NULL) {
            MPI_Comm_free(&agreed);
        }
        /* Every survivor built its part, or all of them try again from s. */
        int flag = ok;
        rc = MPIX_Comm_agree(s, &flag);
        if (rc == MPI_SUCCESS && flag) {
            nc->timeout_s = c->timeout_s;
            if (prev != MPI_COMM_NULL) MPI_Comm_free(&prev);
            MPI_Comm_free(&s);
            st = DDL_SUCCESS;
            break;
        }
        st = ddl_fail(DDL_ERR_PROC_FAILED, "ddl_comm_shrink: a member failed while the "
                      "survivors built the new communicator, %d times", attempt + 1);
        if (nc) {
            ddl_ft_revoke(nc);
            ddl_comm_teardown(nc);
            nc = NULL; /* (its struct is kept: a stale handle) */
        }
        (void)MPIX_Comm_revoke(s);
        if (prev != MPI_COMM_NULL) MPI_Comm_free(&prev);
        prev = s;
        from = s;
    }
    if (st != DDL_SUCCESS && prev != MPI_COMM_NULL) MPI_Comm_free(&prev);
    if (watching) {
        pthread_mutex_lock(&w.m);
        w.done = 1;
        pthread_cond_signal(&w.c);
        pthread_mutex_unlock(&w.m);
        pthread_join(watcher, NULL);
    }
    ddl_cur = cur;
    if (st == DDL_SUCCESS) *out = nc;
    return st;
#else
    return ddl_fail(DDL_ERR_UNSUPPORTED,
                    "ddl_comm_shrink: this libddl was built against an MPI without ULFM "
                    "(Open MPI 5's MPIX fault-tolerance extension)");
#endif
}

void ddl_ft_forget(struct ddl_comm_s *c) {
    pthread_mutex_lock(&ft_lock);
    free(c->failed);
    c->failed = NULL;
    c->nfailed = 0;
    pthread_mutex_unlock(&ft_lock);
}

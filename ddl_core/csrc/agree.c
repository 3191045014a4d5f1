/* The start of ddl_init: every rank arrived, and the settings that must agree do, checked
 * under DDL_TIMEOUT before libddl makes a single blocking MPI call.
 *
 * Why not an MPI collective: making a communicator, detecting the topology or an
 * MPI_Allgather all block until every rank takes part, so a rank that never calls
 * ddl_init (it died, hung, exited, or took another branch) hangs the others inside init,
 * and ranks whose DDL_TOPOLOGY differ call different collectives and hang too. Polling a
 * nonblocking collective under a deadline would bound the wait but could not say which
 * rank is missing. So this is a gather through rank 0 made of point-to-point messages
 * that every rank polls under its deadline:
 *   1. each rank sends rank 0 one fixed-size record: the settings that must agree
 *      (config.c) in their effective value, or the error its own settings gave;
 *   2. rank 0 acknowledges each record at once, so a waiting rank can tell "rank 0 is not
 *      there" from "rank 0 is waiting for someone else", and collects records until all
 *      P-1 have come or its DDL_TIMEOUT has passed;
 *   3. rank 0 sends every rank that came the same verdict: success, the ranks that did
 *      not come (DDL_ERR_TIMEOUT), a rank's bad setting, or every setting that differs
 *      with its values and the ranks holding each (DDL_ERR_INVALID_ARG).
 * Every rank then returns that one verdict, so the error is the same everywhere. Cost:
 * 2 (P-1) messages of about 1 KB through rank 0, once per job, before any communicator
 * exists (which is also why they travel on MPI_COMM_WORLD, under tags of their own at
 * the top of the range every MPI must offer, 32767). A rank that comes after rank 0 gave
 * up finds no answer and times out naming rank 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl_internal.h"

enum { TAG_RECORD = 32761, TAG_ACK = 32762, TAG_VERDICT = 32763 };
#define MAGIC 0x64646c31u /* "ddl1" */
#define TEXT 1016

typedef struct {
    uint32_t magic;
    int32_t status; /* DDL_SUCCESS: text holds the agreed settings; else its error */
    char text[TEXT];
} record_t;

/* Poll `req` until it completes or `deadline` passes; 1 when it completed. */
static ddl_status_t poll_until(MPI_Request *req, double deadline, int *done) {
    *done = 0;
    for (unsigned spin = 0;; spin++) {
        MPI_CHECK(MPI_Test(req, done, MPI_STATUS_IGNORE));
        if (*done || ddl_now() > deadline) return DDL_SUCCESS;
        if (spin > 200) {
            struct timespec ts = {0, 100 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Give up a request that will never complete (a message that will not come). */
static void abandon(MPI_Request *req) {
    if (*req == MPI_REQUEST_NULL) return;
    MPI_Cancel(req);
    MPI_Request_free(req);
}

/* "0-2,5,7" for the ranks i with mark[i] == v, at most n bytes ("..." when cut). */
static int rank_list(const int *mark, int p, int v, char *out, size_t n) {
    size_t w = 0;
    int count = 0;
    out[0] = 0;
    for (int i = 0; i < p; i++) {
        if (mark[i] != v) continue;
        int j = i;
        while (j + 1 < p && mark[j + 1] == v) j++;
        char item[32];
        if (j > i)
            snprintf(item, sizeof item, "%s%d-%d", count ? "," : "", i, j);
        else
            snprintf(item, sizeof item, "%s%d", count ? "," : "", i);
        count += j - i + 1;
        if (w + strlen(item) + 4 >= n) {
            snprintf(out + w, n - w, ",...");
            break;
        }
        w += (size_t)snprintf(out + w, n - w, "%s", item);
        i = j;
    }
    return count;
}

/* Value of `name` in a settings text ("NAME\tcanon\tshown\n" lines): canon and shown. */
static int lookup(const char *text, const char *name, char *canon, char *show, size_t n) {
    size_t len = strlen(name);
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        if (!eol) eol = p + strlen(p);
        if (strncmp(p, name, len) == 0 && p[len] == '\t') {
            const char *c = p + len + 1, *t = memchr(c, '\t', (size_t)(eol - c));
            if (!t) return 0;
            snprintf(canon, n, "%.*s", (int)(t - c), c);
            snprintf(show, n, "%.*s", (int)(eol - t - 1), t + 1);
            return 1;
        }
        p = *eol ? eol + 1 : eol;
    }
    return 0;
}

static void append(char *out, size_t n, const char *fmt, const char *a, const char *b) {
    size_t w = strlen(out);
    if (w + 1 < n) snprintf(out + w, n - w, fmt, a, b);
}

/* Rank 0: the verdict from every rank's record (arrived[i] = 0 for a rank that did not
 * come). */
static ddl_status_t verdict(const record_t *rec, const int *arrived, int p, double timeout,
                            char *out, size_t n) {
    int *mark = calloc((size_t)p, sizeof *mark);
    if (!mark) {
        snprintf(out, n, "ddl_init: no memory to compare %d ranks' settings", p);
        return DDL_ERR_NO_MEMORY;
    }
    char ranks[256], others[256];
    char(*val)[2][128] = NULL; /* each rank's value of one setting: in effect, as set */
    ddl_status_t st = DDL_SUCCESS;
    out[0] = 0;
    int missing = 0;
    for (int i = 0; i < p; i++) missing += !arrived[i];
    if (missing) {
        for (int i = 0; i < p; i++) mark[i] = arrived[i];
        rank_list(mark, p, 0, ranks, sizeof ranks);
        snprintf(out, n,
                 "ddl_init: %s %s did not call ddl_init() within DDL_TIMEOUT (%g s) of rank 0 "
                 "(the other ranks are waiting in it): that rank died, hung, exited or took "
                 "another path before ddl_init; set DDL_TIMEOUT higher if it is only slow",
                 missing > 1 ? "ranks" : "rank", ranks, timeout);
        st = DDL_ERR_TIMEOUT;
        goto done;
    }
    /* A rank whose own settings are bad: its message, with the ranks that share it. */
    for (int i = 0; i < p; i++) {
        if (rec[i].status == DDL_SUCCESS) continue;
        int groups = 0;
        for (int j = 0; j < p; j++) {
            mark[j] = rec[j].status != DDL_SUCCESS && !strcmp(rec[j].text, rec[i].text);
            groups += rec[j].status != DDL_SUCCESS && !mark[j];
        }
        int k = rank_list(mark, p, 1, ranks, sizeof ranks);
        char where[320];
        if (k == p)
            snprintf(where, sizeof where, "on every rank");
        else
            snprintf(where, sizeof where, "on %s %s", k > 1 ? "ranks" : "rank", ranks);
        snprintf(out, n, "%.640s (%.280s%s)", rec[i].text, where,
                 groups ? "; other ranks have other bad settings" : "");
        st = (ddl_status_t)rec[i].status;
        goto done;
    }
    /* Settings that differ: each one with its values and who holds them. Each rank's
     * value is looked up once per setting and ranks are grouped by value, so the cost
     * is P times the number of distinct values, not P squared. */
    val = malloc((size_t)p * sizeof *val);
    if (!val) {
        snprintf(out, n, "ddl_init: no memory to compare %d ranks' settings", p);
        st = DDL_ERR_NO_MEMORY;
        goto done;
    }
    for (const char *line = rec[0].text; *line;) {
        const char *tab = strchr(line, '\t'), *eol = strchr(line, '\n');
        if (!tab || !eol) break;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(tab - line), line);
        line = eol + 1;
        int differs = 0;
        for (int i = 0; i < p; i++) {
            mark[i] = -1;
            if (!lookup(rec[i].text, name, val[i][0], val[i][1], sizeof val[i][0]))
                val[i][0][0] = val[i][1][0] = 0;
            differs |= strcmp(val[i][0], val[0][0]) != 0;
        }
        if (!differs) continue;
        if (out[0]) append(out, n, "%s%s", "; ", "");
        append(out, n, "%s differs between ranks: %s", name, "");
        /* group ranks by value, in rank order of first appearance */
        int group = 0;
        for (int i = 0; i < p; i++) {
            if (mark[i] >= 0) continue;
            const char *ci = val[i][0], *si = val[i][1];
            int same_text = 1; /* all of the group wrote it the same way */
            for (int j = i; j < p; j++) {
                if (mark[j] < 0 && !strcmp(val[j][0], ci)) {
                    mark[j] = group;
                    same_text &= !strcmp(val[j][1], si);
                }
            }
            if (group == 4) { /* enough to see the problem */
                append(out, n, "%s%s", ", and other values on other ranks", "");
                break;
            }
            int k = rank_list(mark, p, group, ranks, sizeof ranks);
            snprintf(others, sizeof others, "%s%s %.200s", group ? ", " : "",
                     k > 1 ? "ranks" : "rank", ranks);
            if (same_text && !strcmp(si, "unset"))
                append(out, n, k > 1 ? "%s leave it unset (%s)" : "%s leaves it unset (%s)",
                       others, ci);
            else if (same_text)
                append(out, n, "%s %s", others, "");
            if (same_text && strcmp(si, "unset")) append(out, n, "%s %s", k > 1 ? "have" : "has", si);
            if (!same_text) append(out, n, "%s %s", others, k > 1 ? "have" : "has");
            if (!same_text) append(out, n, " '%s'%s", ci, "");
            group++;
        }
        st = DDL_ERR_INVALID_ARG;
    }
    if (st != DDL_SUCCESS)
        append(out, n, "%s%s",
               ": these settings decide which messages a collective sends, so they must be "
               "the same on every rank; set them the same everywhere, or unset them",
               "");
done:
    free(val);
    free(mark);
    return st;
}

static ddl_status_t root_side(const record_t *mine, int p, double timeout, record_t *v) {
    record_t *rec = calloc((size_t)p, sizeof *rec);
    int *arrived = calloc((size_t)p, sizeof *arrived);
    MPI_Request *acks = malloc((size_t)p * sizeof *acks), *sends = NULL;
    static const int ack = 1;
    ddl_status_t rc = DDL_SUCCESS;
    if (!rec || !arrived || !acks) {
        rc = ddl_fail(DDL_ERR_NO_MEMORY, "ddl_init: no memory for %d ranks' records", p);
        goto out;
    }
    rec[0] = *mine;
    arrived[0] = 1;
    for (int i = 0; i < p; i++) acks[i] = MPI_REQUEST_NULL;
    double deadline = ddl_now() + timeout;
    int got = 1;
    for (unsigned spin = 0; got < p;) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, TAG_RECORD, ddl_base_comm, &flag, &msg, &st));
        if (flag) {
            int bytes = 0, src = st.MPI_SOURCE;
            MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
            record_t r;
            if (bytes != (int)sizeof r) { /* not ours: consume it, count nothing */
                void *junk = malloc(bytes > 0 ? (size_t)bytes : 1);
                MPI_CHECK(MPI_Mrecv(junk, bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
                free(junk);
                continue;
            }
            MPI_CHECK(MPI_Mrecv(&r, bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
            if (r.magic != MAGIC || arrived[src]) continue;
            r.text[TEXT - 1] = 0;
            rec[src] = r;
            arrived[src] = 1;
            got++;
            MPI_CHECK(MPI_Isend(&ack, 1, MPI_INT, src, TAG_ACK, ddl_base_comm, &acks[src]));
            spin = 0;
            continue;
        }
        if (ddl_now() > deadline) break;
        if (++spin > 200) {
            struct timespec ts = {0, 100 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    v->magic = MAGIC;
    v->status = verdict(rec, arrived, p, timeout, v->text, sizeof v->text);
    sends = malloc((size_t)p * sizeof *sends);
    if (!sends) {
        rc = ddl_fail(DDL_ERR_NO_MEMORY, "ddl_init: no memory for %d ranks' verdicts", p);
        goto out;
    }
    for (int i = 0; i < p; i++) {
        sends[i] = MPI_REQUEST_NULL;
        if (i > 0 && arrived[i])
            MPI_CHECK(MPI_Isend(v, sizeof *v, MPI_BYTE, i, TAG_VERDICT, ddl_base_comm, &sends[i]));
    }
    /* Small messages to ranks that are waiting for them: they complete at once, but a
     * rank that died since is not waited for past the deadline. */
    double until = ddl_now() + timeout;
    for (int i = 0; i < p; i++) {
        int done = 1;
        if (sends[i] != MPI_REQUEST_NULL) DDL_CHECK(poll_until(&sends[i], until, &done));
        if (!done) MPI_Request_free(&sends[i]);
        done = 1;
        if (acks[i] != MPI_REQUEST_NULL) DDL_CHECK(poll_until(&acks[i], until, &done));
        if (!done) MPI_Request_free(&acks[i]);
    }
out:
    free(sends);
    free(acks);
    free(arrived);
    free(rec);
    return rc;
}

static ddl_status_t other_side(const record_t *mine, double timeout, record_t *v) {
    MPI_Request send, ack_req, verdict_req;
    int ack = 0, done = 0;
    MPI_CHECK(MPI_Irecv(&ack, 1, MPI_INT, 0, TAG_ACK, ddl_base_comm, &ack_req));
    MPI_CHECK(MPI_Irecv(v, sizeof *v, MPI_BYTE, 0, TAG_VERDICT, ddl_base_comm, &verdict_req));
    MPI_CHECK(MPI_Isend(mine, sizeof *mine, MPI_BYTE, 0, TAG_RECORD, ddl_base_comm, &send));
    DDL_CHECK(poll_until(&ack_req, ddl_now() + timeout, &done));
    if (!done) {
        abandon(&ack_req);
        abandon(&verdict_req);
        MPI_Request_free(&send);
        return ddl_fail(DDL_ERR_TIMEOUT,
                        "ddl_init: no answer from rank 0 within DDL_TIMEOUT (%g s): rank 0 did "
                        "not call ddl_init() (it died, hung, exited or took another path), or "
                        "it gave up waiting for this rank; set DDL_TIMEOUT higher if a rank is "
                        "only slow",
                        timeout);
    }
    /* Rank 0 is in ddl_init and answers within its own DDL_TIMEOUT from now at most. */
    DDL_CHECK(poll_until(&verdict_req, ddl_now() + timeout + 5.0, &done));
    if (!done) {
        abandon(&verdict_req);
        MPI_Request_free(&send);
        return ddl_fail(DDL_ERR_TIMEOUT,
                        "ddl_init: rank 0 acknowledged this rank but sent no verdict within "
                        "DDL_TIMEOUT (%g s): rank 0 died or hung while waiting for the other "
                        "ranks",
                        timeout);
    }
    DDL_CHECK(poll_until(&send, ddl_now() + timeout, &done));
    if (!done) MPI_Request_free(&send);
    if (v->magic != MAGIC)
        return ddl_fail(DDL_ERR_INTERNAL, "ddl_init: rank 0 sent a verdict this rank cannot read "
                                          "(a different libddl?)");
    v->text[TEXT - 1] = 0;
    return DDL_SUCCESS;
}

ddl_status_t ddl_init_agree(const ddl_config_t *cfg, ddl_status_t local, const char *local_error) {
    int rank = 0, p = 1;
    MPI_CHECK(MPI_Comm_rank(ddl_base_comm, &rank));
    MPI_CHECK(MPI_Comm_size(ddl_base_comm, &p));
    if (p == 1) return local == DDL_SUCCESS ? DDL_SUCCESS : ddl_fail_verbatim(local, local_error);
    record_t mine, v;
    memset(&mine, 0, sizeof mine);
    mine.magic = MAGIC;
    mine.status = (int32_t)local;
    if (local != DDL_SUCCESS)
        snprintf(mine.text, sizeof mine.text, "%s", local_error);
    else
        ddl_config_agreed(cfg, mine.text, sizeof mine.text);
    memset(&v, 0, sizeof v);
    double timeout = cfg->timeout_s;
    if (rank == 0)
        DDL_CHECK(root_side(&mine, p, timeout, &v));
    else
        DDL_CHECK(other_side(&mine, timeout, &v));
    if (v.status != DDL_SUCCESS) return ddl_fail_verbatim((ddl_status_t)v.status, v.text);
    return DDL_SUCCESS;
}

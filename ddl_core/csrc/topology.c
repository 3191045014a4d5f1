/* The rank grid for topology-aware allreduce.
 *
 * Ranks form a grid of levels, innermost first (ranks per node, nodes per rack, racks).
 * The grid is read from DDL_TOPOLOGY ("4x2x2") or detected: ranks that share memory
 * (MPI_Comm_split_type) form the inner level and nodes the outer one. Racks cannot be
 * seen from inside a job, so they come only from DDL_TOPOLOGY. With detection the world
 * is reordered (node index major, local rank minor) so the grid matches the placement
 * whatever rank order the launcher chose; with DDL_TOPOLOGY the world order is taken as
 * given (ddlrun places consecutive ranks on one host). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

/* Digits only, no leading zero, no sign or blank: the rule ddlrun's --topology checks
 * too (it calls this through ddl_core.settings), so a grid ddlrun accepts is one every
 * rank accepts. */
ddl_status_t ddl_parse_topology(const char *text, int *dims, int *nlevels) {
    int n = 0;
    long long ranks = 1;
    const char *p = text;
    while (*p) {
        long v = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9' && v <= 1 << 20) v = v * 10 + (*p++ - '0');
        if (p == start || *start == '0' || v > 1 << 20 || n == DDL_MAX_LEVELS ||
            (*p && *p != 'x' && *p != 'X'))
            return ddl_fail(DDL_ERR_INVALID_ARG,
                            "DDL_TOPOLOGY=%.64s is not a grid like 4x2 (ranks per node x "
                            "nodes) or 4x2x2 (x racks): at most %d levels of 1 to %d ranks",
                            text, DDL_MAX_LEVELS, 1 << 20);
        dims[n++] = (int)v;
        ranks *= v;
        if (ranks > 1 << 30)
            return ddl_fail(DDL_ERR_INVALID_ARG, "DDL_TOPOLOGY=%.64s describes more than %d "
                            "ranks", text, 1 << 30);
        if (*p && !*++p)
            return ddl_fail(DDL_ERR_INVALID_ARG, "DDL_TOPOLOGY=%.64s ends with 'x'", text);
    }
    if (n == 0) return ddl_fail(DDL_ERR_INVALID_ARG, "DDL_TOPOLOGY is empty");
    *nlevels = n;
    return DDL_SUCCESS;
}

static ddl_status_t comm_fill(ddl_mpicomm_t *c, MPI_Comm comm) {
    c->comm = comm;
    c->piece = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &c->rank));
    MPI_CHECK(MPI_Comm_size(comm, &c->size));
    return DDL_SUCCESS;
}

/* Detect (ranks per node, nodes); *ok = 0 when nodes hold different numbers of ranks. */
static ddl_status_t detect(MPI_Comm base, int size, int *local_size, int *node, int *local_rank,
                           int *ok) {
    MPI_Comm local, leaders;
    MPI_CHECK(MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, local_rank));
    MPI_CHECK(MPI_Comm_size(local, local_size));
    int mm[2] = {-*local_size, *local_size};
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, base));
    *ok = (-mm[0] == mm[1]) && size % mm[1] == 0;
    MPI_CHECK(MPI_Comm_split(base, *local_rank == 0 ? 0 : MPI_UNDEFINED, 0, &leaders));
    int idx = 0;
    if (leaders != MPI_COMM_NULL) {
        MPI_CHECK(MPI_Comm_rank(leaders, &idx));
        MPI_CHECK(MPI_Comm_free(&leaders));
    }
    MPI_CHECK(MPI_Bcast(&idx, 1, MPI_INT, 0, local));
    *node = idx;
    MPI_CHECK(MPI_Comm_free(&local));
    return DDL_SUCCESS;
}

int ddl_topo_level_color(const ddl_topo_t *t, int l) {
    int color = 0, stride = 1;
    for (int m = 0; m < t->nlevels; m++) {
        if (m == l) continue;
        color += t->coord[m] * stride;
        stride *= t->dims[m];
    }
    return color;
}

ddl_status_t ddl_topo_build(ddl_ctx_t *ctx, MPI_Comm base, const int *dims, int nlevels) {
    ddl_topo_t *t = &ctx->topo;
    int size, rank;
    MPI_CHECK(MPI_Comm_size(base, &size));
    MPI_CHECK(MPI_Comm_rank(base, &rank));
    int key = rank;
    if (nlevels > 0) {
        long prod = 1;
        for (int i = 0; i < nlevels; i++) prod *= dims[i];
        if (prod != size) {
            char txt[128] = "";
            for (int i = 0; i < nlevels; i++)
                snprintf(txt + strlen(txt), sizeof txt - strlen(txt), "%s%d", i ? "x" : "",
                         dims[i]);
            return ddl_fail(DDL_ERR_INVALID_ARG,
                            "DDL_TOPOLOGY=%s describes %ld ranks but the job has %d: make the "
                            "product of the levels equal the number of ranks",
                            txt, prod, size);
        }
        memcpy(t->dims, dims, sizeof(int) * (size_t)nlevels);
        t->nlevels = nlevels;
    } else {
        int lsize = 1, node = 0, lrank = 0, ok = 0;
        DDL_CHECK(detect(base, size, &lsize, &node, &lrank, &ok));
        if (!ok) {
            ddl_log(1, "nodes hold different numbers of ranks: using a flat topology");
            t->nlevels = 1;
            t->dims[0] = size;
        } else if (lsize == size || lsize == 1) {
            t->nlevels = 1;
            t->dims[0] = size;
        } else {
            t->nlevels = 2;
            t->dims[0] = lsize;
            t->dims[1] = size / lsize;
            key = node * lsize + lrank;
        }
    }
    /* Drop levels of extent 1: they would only add empty steps. */
    int n = 0;
    for (int i = 0; i < t->nlevels; i++)
        if (t->dims[i] > 1 || t->nlevels == 1) t->dims[n++] = t->dims[i];
    if (n == 0) t->dims[n++] = 1;
    t->nlevels = n;

    MPI_Comm w;
    MPI_CHECK(MPI_Comm_split(base, 0, key, &w));
    DDL_CHECK(comm_fill(&t->world, w));
    int idx = t->world.rank;
    for (int l = 0; l < t->nlevels; l++) {
        t->coord[l] = idx % t->dims[l];
        idx /= t->dims[l];
    }
    for (int l = 0; l < t->nlevels; l++) {
        MPI_Comm lc;
        MPI_CHECK(MPI_Comm_split(t->world.comm, ddl_topo_level_color(t, l), t->coord[l], &lc));
        DDL_CHECK(comm_fill(&t->level[l], lc));
        /* Levels above the first connect nodes: stream their exchanges (p2p.c). */
        if (l > 0 && t->nlevels > 1) t->level[l].piece = ddl_stream_piece;
    }
    return DDL_SUCCESS;
}

void ddl_topo_free(ddl_ctx_t *ctx) {
    ddl_topo_t *t = &ctx->topo;
    for (int l = 0; l < t->nlevels; l++)
        if (t->level[l].comm != MPI_COMM_NULL) MPI_Comm_free(&t->level[l].comm);
    if (t->world.comm != MPI_COMM_NULL) MPI_Comm_free(&t->world.comm);
    t->nlevels = 0;
}

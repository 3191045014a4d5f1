/* Life cycle: ddl_init and ddl_finalize. The environment is read by config.c and checked
 * across ranks by agree.c before anything else happens.
 *
 * Two contexts are built at init, each with its own duplicated communicators: one for the
 * blocking API (called from the application thread) and one for the progress thread.
 * Separate communicators keep the two streams of collectives from ever matching each
 * other's messages, so blocking and asynchronous calls may overlap freely. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddl_internal.h"

MPI_Comm ddl_base_comm = MPI_COMM_NULL;

static ddl_status_t dup_world(ddl_mpicomm_t *c) {
    MPI_CHECK(MPI_Comm_dup(ddl_base_comm, &c->comm));
    c->piece = 0;
    /* Errors come back as codes so they become exceptions, not aborts. */
    MPI_CHECK(MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(c->comm, &c->rank));
    MPI_CHECK(MPI_Comm_size(c->comm, &c->size));
    return DDL_SUCCESS;
}

/* The cache `python -m ddl_core.bench tune` writes: $DDL_CACHE_DIR, else $XDG_CACHE_HOME/ddl-ce,
 * else ~/.cache/ddl-ce, then tune-<grid>.txt (ddl_core/tunecache.py agrees). */
static int tune_cache_path(char *out, size_t n) {
    const char *dir = getenv("DDL_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    char base[768];
    if (dir && *dir)
        snprintf(base, sizeof base, "%s", dir);
    else if (xdg && *xdg)
        snprintf(base, sizeof base, "%s/ddl-ce", xdg);
    else if (home && *home)
        snprintf(base, sizeof base, "%s/.cache/ddl-ce", home);
    else
        return 0;
    char grid[128] = "";
    for (int i = 0; i < ddl_g.app.topo.nlevels; i++)
        snprintf(grid + strlen(grid), sizeof grid - strlen(grid), "%s%d", i ? "x" : "",
                 ddl_g.app.topo.dims[i]);
    return snprintf(out, n, "%s/tune-%s.txt", base, grid) < (int)n;
}

/* The cost model's figures are rank 0's (its DDL_TUNE_FILE, or its cache for this grid),
 * sent to every rank: they choose the algorithm of every allreduce, so ranks with
 * different figures (a per-host cache, a file readable on some hosts only) would choose
 * differently and send messages the others do not expect. An error reading the file on
 * rank 0 is every rank's error. */
static ddl_status_t share_model(void) {
    struct {
        int32_t status;
        char error[768];
        ddl_model_t model;
    } m;
    memset(&m, 0, sizeof m);
    ddl_model_defaults(&m.model, ddl_g.app.topo.nlevels);
    if (ddl_g.rank == 0) {
        const char *tune = getenv("DDL_TUNE_FILE");
        char cached[1024];
        ddl_status_t rc = DDL_SUCCESS;
        if (tune && *tune) {
            rc = ddl_model_load(&m.model, tune, ddl_g.app.topo.dims, ddl_g.app.topo.nlevels);
        } else if (tune_cache_path(cached, sizeof cached) && access(cached, R_OK) == 0) {
            rc = ddl_model_load(&m.model, cached, ddl_g.app.topo.dims, ddl_g.app.topo.nlevels);
            if (rc == DDL_SUCCESS) ddl_log(1, "cost model from %s", cached);
        }
        m.status = (int32_t)rc;
        if (rc != DDL_SUCCESS) snprintf(m.error, sizeof m.error, "%s", ddl_last_error());
    }
    if (ddl_g.size > 1) {
        /* Part of init, not one of the application's collectives: its numbering (what
         * a lost rank's message names, "allreduce #2") starts after it. */
        DDL_CHECK(ddl_broadcast_ctx(&ddl_g.app, &m, sizeof m, DDL_UINT8, 0));
        __atomic_store_n(&ddl_g.app.seq, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ddl_g.app.reached, 0, __ATOMIC_RELAXED);
        ddl_cur.ctx = -1; /* out of it: no message names it as the collective waited in */
    }
    if (m.status != DDL_SUCCESS) {
        m.error[sizeof m.error - 1] = 0;
        return ddl_fail((ddl_status_t)m.status, "%s%s", ddl_g.rank ? "on rank 0: " : "", m.error);
    }
    ddl_g.model = m.model;
    return DDL_SUCCESS;
}

static ddl_status_t init_on(const MPI_Comm *given);

ddl_status_t ddl_init(void) { return init_on(NULL); }

MPI_Comm ddl_comm_of_handle(intptr_t h) {
    MPI_Comm c;
    if (sizeof c == sizeof h) {
        memcpy(&c, &h, sizeof c);
    } else { /* an int handle (MPICH) */
        int i = (int)h;
        memset(&c, 0, sizeof c);
        memcpy(&c, &i, sizeof c < sizeof i ? sizeof c : sizeof i);
    }
    return c;
}

ddl_status_t ddl_init_comm(intptr_t mpi_comm) {
    MPI_Comm c = ddl_comm_of_handle(mpi_comm);
    return init_on(&c);
}

static ddl_status_t init_on(const MPI_Comm *given) {
    if (ddl_g.initialized) return DDL_SUCCESS;
    if (ddl_g.finalized)
        return ddl_fail(DDL_ERR_NOT_INITIALIZED,
                        "DDL cannot be initialized again after ddl_finalize() (MPI allows one "
                        "initialization per process)");
    /* A bad setting is not returned at once: MPI starts anyway and the agreement below
     * hands the message to every rank, so a variable set wrong on one host fails the
     * whole job with its name instead of leaving the other ranks waiting for this one. */
    ddl_config_t cfg;
    ddl_status_t local = ddl_config_read(&cfg);
    char local_error[1024] = "";
    if (local != DDL_SUCCESS) snprintf(local_error, sizeof local_error, "%s", ddl_last_error());
    ddl_config_apply(&cfg);
    int inited = 0, fin = 0, provided = 0;
    MPI_CHECK(MPI_Initialized(&inited));
    MPI_CHECK(MPI_Finalized(&fin));
    if (fin) return ddl_fail(DDL_ERR_NOT_INITIALIZED, "MPI was already finalized");
    if (!inited) {
        MPI_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
        ddl_g.we_initialized_mpi = 1;
    } else {
        MPI_CHECK(MPI_Query_thread(&provided));
    }
    ddl_ft_detect();
    if (given) {
        if (*given == MPI_COMM_NULL)
            return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_init_comm: MPI_COMM_NULL");
        int inter = 0;
        MPI_CHECK(MPI_Comm_test_inter(*given, &inter));
        if (inter)
            return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_init_comm: an intercommunicator; merge "
                                                 "it first (MPI_Intercomm_merge)");
        /* libddl's own copy: its messages (the settings agreement below) never meet the
         * caller's on the given communicator. */
        MPI_CHECK(MPI_Comm_dup(*given, &ddl_base_comm));
        MPI_CHECK(MPI_Comm_set_errhandler(ddl_base_comm, MPI_ERRORS_RETURN));
    } else {
        ddl_base_comm = MPI_COMM_WORLD;
    }
    ddl_status_t agreed = ddl_init_agree(&cfg, local, local_error);
    if (agreed != DDL_SUCCESS) {
        /* A bad or differing setting is every rank's verdict, so MPI_Finalize at exit
         * meets every rank; after a timeout a rank is missing and it would wait for it. */
        if (agreed == DDL_ERR_INVALID_ARG) ddl_finalize_mpi_at_exit();
        return agreed;
    }
    DDL_CHECK(dup_world(&ddl_g.app.world));
    DDL_CHECK(dup_world(&ddl_g.progress.world));
    ddl_g.rank = ddl_g.app.world.rank;
    ddl_g.size = ddl_g.app.world.size;

    MPI_Comm local_comm;
    MPI_CHECK(MPI_Comm_split_type(ddl_g.app.world.comm, MPI_COMM_TYPE_SHARED, ddl_g.rank,
                                  MPI_INFO_NULL, &local_comm));
    MPI_CHECK(MPI_Comm_rank(local_comm, &ddl_g.local_rank));
    MPI_CHECK(MPI_Comm_size(local_comm, &ddl_g.local_size));
    MPI_CHECK(MPI_Comm_free(&local_comm));
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    ddl_g.ranks_fit_cores = cpus > 0 && ddl_g.local_size <= cpus;

    ddl_status_t rc = ddl_topo_build(&ddl_g.app, ddl_g.app.world.comm, cfg.dims, cfg.nlevels);
    if (rc == DDL_SUCCESS)
        rc = ddl_topo_build(&ddl_g.progress, ddl_g.progress.world.comm, cfg.dims, cfg.nlevels);
    if (rc != DDL_SUCCESS) return rc;

    DDL_CHECK(share_model());
    ddl_g.model.leader = ddl_g.node_leader;
    ddl_g.model.segment = (double)ddl_g.segment_bytes;
    ddl_plans_changed();
    DDL_CHECK(ddl_comm_world_setup());
    DDL_CHECK(ddl_liveness_start()); /* liveness.c: a lost peer is reported at once */
    ddl_g.initialized = 1;
    if (provided >= MPI_THREAD_MULTIPLE) {
        DDL_CHECK(ddl_progress_start());
    } else {
        ddl_log(0, "MPI provides thread level %d, not MPI_THREAD_MULTIPLE: asynchronous "
                   "collectives are disabled", provided);
    }
    ddl_log(1, "initialized: %d ranks, %d local, topology levels %d", ddl_g.size,
            ddl_g.local_size, ddl_g.app.topo.nlevels);
    return DDL_SUCCESS;
}

ddl_status_t ddl_finalize(void) {
    DDL_CHECK(ddl_require_init());
    ddl_status_t rc = ddl_progress_stop();
    ddl_liveness_stop(); /* tells the others this rank finalized, not died */
    ddl_gpu_finalize();
    ddl_comm_world_teardown();
    ddl_shm_release(&ddl_g.app);
    ddl_topo_free(&ddl_g.app);
    ddl_topo_free(&ddl_g.progress);
    MPI_Comm_free(&ddl_g.app.world.comm);
    MPI_Comm_free(&ddl_g.progress.world.comm);
    ddl_g.initialized = 0;
    ddl_g.finalized = 1;
    /* MPI_Finalize waits for every rank: not after a lost peer (liveness.c). */
    if (ddl_g.we_initialized_mpi && ddl_may_finalize_mpi()) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_CHECK(MPI_Finalize());
    }
    return rc;
}

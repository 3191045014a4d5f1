/* The global state and introspection: the getters, the topology, the cost model's figures
 * and plan, the fusion settings, the version. ddl_init and ddl_finalize are init.c's. */
#include <stdio.h>
#include <string.h>

#include "ddl_internal.h"

ddl_state_t ddl_g;

const char *ddl_algo_name(ddl_algo_t algo) {
    static const char *names[DDL_NUM_ALGOS] = {"auto", "ring", "rabenseifner", "recdoubling",
                                               "mpi"};
    return (int)algo >= 0 && algo < DDL_NUM_ALGOS ? names[algo] : "unknown";
}

int ddl_initialized(void) { return ddl_g.initialized; }

ddl_status_t ddl_require_init(void) {
    if (ddl_g.initialized) return DDL_SUCCESS;
    if (ddl_g.finalized)
        return ddl_fail(DDL_ERR_NOT_INITIALIZED,
                        "DDL was finalized: no collective can run after ddl_finalize()");
    return ddl_fail(DDL_ERR_NOT_INITIALIZED,
                    "DDL is not initialized: call ddl_init() (Python: ddl_core.init()) first");
}

#define GETTER(fn, field)                                                                 \
    ddl_status_t fn(int *out) {                                                           \
        DDL_CHECK(ddl_require_init());                                                    \
        if (!out) return ddl_fail(DDL_ERR_INVALID_ARG, #fn ": NULL output pointer");      \
        *out = ddl_g.field;                                                               \
        return DDL_SUCCESS;                                                               \
    }
GETTER(ddl_rank, rank)
GETTER(ddl_size, size)
GETTER(ddl_local_rank, local_rank)
GETTER(ddl_local_size, local_size)

/* The world communicator's grid (comm.c). */
ddl_status_t ddl_topology(int *nlevels, int dims[DDL_MAX_LEVELS]) {
    ddl_comm_t world;
    DDL_CHECK(ddl_comm_world(&world));
    return ddl_comm_topology(world, nlevels, dims);
}

ddl_status_t ddl_set_algorithm(ddl_algo_t algo) {
    if ((int)algo < 0 || algo >= DDL_NUM_ALGOS)
        return ddl_fail(DDL_ERR_INVALID_ARG, "unknown algorithm %d", (int)algo);
    ddl_g.forced_algo = algo;
    ddl_settings_changed();
    return DDL_SUCCESS;
}

ddl_status_t ddl_set_level_cost(int level, double alpha, double beta) {
    DDL_CHECK(ddl_require_init());
    if (level < 0 || level >= ddl_g.app.topo.nlevels || !(alpha >= 0 && alpha <= 1e6) ||
        !(beta >= 0 && beta <= 1e6))
        return ddl_fail(DDL_ERR_INVALID_ARG, "level %d (of %d) alpha %g beta %g", level,
                        ddl_g.app.topo.nlevels, alpha, beta);
    ddl_g.model.alpha[level] = alpha;
    ddl_g.model.beta[level] = beta;
    ddl_plans_changed();
    return DDL_SUCCESS;
}

ddl_status_t ddl_get_level_cost(int level, double *alpha, double *beta) {
    DDL_CHECK(ddl_require_init());
    if (level < 0 || level >= ddl_g.app.topo.nlevels)
        return ddl_fail(DDL_ERR_INVALID_ARG, "level %d is not in 0..%d", level,
                        ddl_g.app.topo.nlevels - 1);
    *alpha = ddl_g.model.alpha[level];
    *beta = ddl_g.model.beta[level];
    return DDL_SUCCESS;
}

ddl_status_t ddl_plan(size_t bytes, ddl_algo_t algos[DDL_MAX_LEVELS], double *predicted_s) {
    DDL_CHECK(ddl_require_init());
    int flat;
    double t = ddl_model_plan(&ddl_g.model, ddl_g.app.topo.dims, ddl_g.app.topo.nlevels, bytes,
                              ddl_g.forced_algo, algos, &flat);
    if (ddl_g.size == 1) t = 0.0;
    if (predicted_s) *predicted_s = t;
    return DDL_SUCCESS;
}

ddl_status_t ddl_set_fusion(size_t threshold_bytes, double cycle_time_ms) {
    if (threshold_bytes > ((size_t)1 << 40)) /* DDL_FUSION_THRESHOLD's range */
        return ddl_fail(DDL_ERR_INVALID_ARG, "fusion threshold %zu bytes is not in [0, %zu]",
                        threshold_bytes, (size_t)1 << 40);
    if (!(cycle_time_ms >= 0 && cycle_time_ms <= 1e6)) /* also nan */
        return ddl_fail(DDL_ERR_INVALID_ARG, "cycle time %g ms is not in [0, 1000000]",
                        cycle_time_ms);
    ddl_g.fusion_threshold = threshold_bytes;
    ddl_g.cycle_time_s = cycle_time_ms / 1000.0;
    ddl_settings_changed();
    return DDL_SUCCESS;
}

const char *ddl_version_string(void) {
    static char buf[512];
    if (!buf[0]) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int len = 0;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        char *comma = strchr(lib, ',');
        if (comma) *comma = 0;
        /* MPICH pads "MPICH Version:      5.0.2": squeeze runs of blanks. */
        char *w = lib;
        for (char *p = lib; *p; p++)
            if (!(*p == ' ' || *p == '\t') || (w > lib && w[-1] != ' ')) *w++ = *p == '\t' ? ' ' : *p;
        *w = 0;
        snprintf(buf, sizeof buf, "libddl %d.%d.%d (%s)", DDL_VERSION_MAJOR, DDL_VERSION_MINOR,
                 DDL_VERSION_PATCH, lib);
    }
    return buf;
}

/* How a process leaves: Python's finalize at exit, and MPI_Finalize only when it can end.
 *
 * Python finalizes DDL in an atexit handler, before it knows the exit status. For a
 * process that exits with a failure (sys.exit(3)), MPI_Finalize would wait there for
 * every other rank, while those, told by the BYE, fail and exit first: the launcher would
 * report their status, not the one that caused it. So ddl_finalize_at_exit() does
 * everything but MPI_Finalize and, when DDL started MPI, the BYE; an on_exit() hook, which
 * sees the status, sends the BYE with it ("rank 1 exited with status 3") and runs
 * MPI_Finalize only for status 0, so the failing rank exits at once with its status. When
 * someone else started MPI (mpi4py), its own atexit handler calls MPI_Finalize before any
 * exit hook, so the BYE cannot wait for the status. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ddl_internal.h"

/* ---- a wait failed for good: finalizing must not wait on peers ---------------------- */

static int broken;

void ddl_liveness_mark_broken(void) { __atomic_store_n(&broken, 1, __ATOMIC_RELAXED); }
int ddl_liveness_broken(void) { return __atomic_load_n(&broken, __ATOMIC_RELAXED); }

/* ---- the exit hook ------------------------------------------------------------------ */

static pid_t init_pid;
static int mpi_finalize_deferred;
static int bye_deferred;

static void exit_hook(int status, void *arg) {
    (void)arg;
    if (getpid() != init_pid || !mpi_finalize_deferred) return;
    mpi_finalize_deferred = 0;
    int bye = bye_deferred;
    if (bye) ddl_liveness_stop_exiting(status);
    int fin = 1;
    if (status == 0 && !ddl_liveness_broken() && MPI_Finalized(&fin) == MPI_SUCCESS && !fin)
        MPI_Finalize();
    if (status != 0 && bye) {
        /* Failing: end now, before the exit handlers still to come (the MPI library's,
         * C++ destructors), so the launcher sees this status before the ranks it made
         * fail report theirs. */
        fflush(NULL);
        _exit(status);
    }
}

int ddl_may_finalize_mpi(void) {
    if (ddl_liveness_broken()) {
        ddl_log(1, "MPI_Finalize skipped: a peer was lost or did not answer, and MPI_Finalize "
                   "would wait for it");
        return 0;
    }
    return !mpi_finalize_deferred;
}

ddl_status_t ddl_finalize_at_exit(void) {
    static int hooked;
    if (!hooked) {
        init_pid = getpid();
        hooked = on_exit(exit_hook, NULL) == 0;
    }
    mpi_finalize_deferred = hooked;
    bye_deferred = hooked && ddl_g.we_initialized_mpi;
    if (bye_deferred) ddl_liveness_defer_bye();
    return ddl_finalize();
}

/* Error messages and logging.
 *
 * Messages are kept per thread so the progress thread's failures never overwrite what the
 * application thread is about to read, and each names the rank: in a 1000-rank job the
 * first thing a user needs to know is which rank said it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

static _Thread_local char last_error[1024];
int ddl_log_level = 0;

const char *ddl_last_error(void) { return last_error; }

const char *ddl_status_string(ddl_status_t status) {
    switch (status) {
    case DDL_SUCCESS: return "success";
    case DDL_ERR_NOT_INITIALIZED: return "not initialized";
    case DDL_ERR_INVALID_ARG: return "invalid argument";
    case DDL_ERR_MISMATCH: return "collective mismatch between ranks";
    case DDL_ERR_TIMEOUT: return "timeout";
    case DDL_ERR_MPI: return "MPI error";
    case DDL_ERR_NO_MEMORY: return "out of memory";
    case DDL_ERR_INTERNAL: return "internal error";
    case DDL_ERR_UNSUPPORTED: return "unsupported";
    case DDL_ERR_CUDA: return "CUDA error";
    case DDL_ERR_NCCL: return "NCCL error";
    case DDL_ERR_PEER_LOST: return "a peer exited, died or finalized";
    case DDL_ERR_PROC_FAILED: return "a member of the communicator failed";
    }
    return "unknown status";
}

ddl_status_t ddl_fail(ddl_status_t status, const char *fmt, ...) {
    char msg[sizeof last_error - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ddl_g.initialized)
        snprintf(last_error, sizeof last_error, "rank %d: %s", ddl_g.rank, msg);
    else
        snprintf(last_error, sizeof last_error, "%s", msg);
    return status;
}

ddl_status_t ddl_fail_verbatim(ddl_status_t status, const char *msg) {
    snprintf(last_error, sizeof last_error, "%s", msg);
    return status;
}

ddl_status_t ddl_mpi_fail(int mpi_rc, const char *what) {
    /* An MPI error after a peer was lost (Open MPI may report the broken connection) is
     * that loss: say which rank went instead of the transport's words. */
    if (ddl_ft_error(mpi_rc)) return ddl_ft_fail(mpi_rc, "MPI");
    if (ddl_liveness_gen()) {
        ddl_status_t v = ddl_liveness_verdict();
        if (v != DDL_SUCCESS) return v;
    }
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "?");
    return ddl_fail(DDL_ERR_MPI, "%s failed: %s (MPI error %d)", what, text, mpi_rc);
}

void ddl_log(int level, const char *fmt, ...) {
    if (level > ddl_log_level) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[ddl rank %d] %s\n", ddl_g.rank, msg);
}

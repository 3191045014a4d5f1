/* Scratch memory: one buffer per (thread, slot), grown on demand and kept, so no
 * collective allocates per call. Per thread, because the application thread, the progress
 * threads (one per communicator's queue) and other application threads each run their own
 * collectives at the same time; per slot, because one collective uses several at once
 * (ddl_internal.h names them: which code owns which slot). */
#include <stdlib.h>

#include "ddl_internal.h"

static _Thread_local void *scratch_ptr[DDL_SCRATCH_SLOTS];
static _Thread_local size_t scratch_len[DDL_SCRATCH_SLOTS];

void *ddl_scratch(ddl_scratch_slot_t slot, size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (scratch_len[slot] < bytes) {
        size_t want = bytes < 4096 ? 4096 : bytes + bytes / 4;
        void *p = NULL;
        if (posix_memalign(&p, 64, want) != 0) return NULL;
        free(scratch_ptr[slot]);
        scratch_ptr[slot] = p;
        scratch_len[slot] = want;
    }
    return scratch_ptr[slot];
}

/* Memory shared by the two ranks of a communicator on one node, for the collectives of
 * comm_colls.c (reduce, allgatherv, alltoall, gather, scatter).
 *
 * Why: a two-rank reduce through MPI messages is bound by the copy. A large message is
 * pulled whole by the receiver (Open MPI's single-copy CMA), so the root copies every byte
 * in and then reduces it, one pass after the other, while the other rank waits; Open MPI's
 * own MPI_Reduce took 95 us for 1 MiB here, where one pass of a 1 MiB float32 add takes
 * 28 us. Through a shared segment the work is split and overlapped: the other rank copies
 * its chunks into the segment while the root reduces the chunk before straight from it
 * into its output (python -m ddl_core.bench reduce). allgatherv: a single-copy pull of
 * 1 MiB took 60-80 us where a memcpy of it takes 21 us, so pushing a chunk into the
 * segment and the other rank copying it out costs each rank less than pulling it.
 *
 * The segment: SHM_SLOTS chunk slots, each with a flag on its own cache line. The flag of
 * a slot is 0 while it is free, k + 1 once chunk k is in it; the writer fills a free slot
 * and publishes it (release), the reader waits for the value (acquire), uses the chunk
 * and frees the slot. One way (reduce, gather, scatter) chunk k goes in slot
 * k % SHM_SLOTS; two ways (allgatherv, alltoall) each rank writes half of them (chunk k
 * of rank r in slot r * SHM_SLOTS / 2 + k % (SHM_SLOTS / 2)). Each rank sends and takes
 * chunk k before chunk k + 1, so neither waits on the other in a circle. Every call
 * leaves every flag 0, so the next call, with either rank as root, starts from a clean
 * segment; a call that fails (a deadline, a lost peer: the other rank fails too) drops
 * the segment on that rank for good and the MPI paths take over. Waits are the library's
 * own (ddl_wait_flag: the deadline, the liveness watch, pausing after a spin).
 *
 * Made on the first collective that asks, collectively (both ranks are there: the
 * signature check has passed): rank 0 creates a POSIX shared-memory object, rank 1 maps it, and rank
 * 0 unlinks it once rank 1 has answered, so nothing is left in /dev/shm whatever happens
 * later. Ranks on different nodes (MPI_COMM_TYPE_SHARED) get none, and so does every
 * pair under DDL_SHM=0 (a setting all ranks must agree on, as this step is collective). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ddl_internal.h"

#define SHM_SLOTS 4
#define SHM_CHUNK ((size_t)256 * 1024)
#define SHM_FLAGS ((size_t)4096) /* the flags' page; slots start after it */
#define SHM_BYTES (SHM_FLAGS + SHM_SLOTS * SHM_CHUNK)
enum { TAG_SHM = 113 };

struct ddl_shm_s {
    char *base;
};

static unsigned shm_made; /* this process's segments so far: part of each name */

static uint64_t *flag_of(ddl_shm_t *s, size_t slot) { return (uint64_t *)(s->base + slot * 64); }
static char *slot_of(ddl_shm_t *s, size_t slot) { return s->base + SHM_FLAGS + slot * SHM_CHUNK; }

static char *map(int fd) {
    void *p = mmap(NULL, SHM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

ddl_status_t ddl_shm_pair(ddl_ctx_t *ctx, ddl_shm_t **out) {
    *out = NULL;
    if (ctx->shm_state > 0) *out = ctx->shm;
    if (ctx->shm_state == 0 && (ctx->world.size != 2 || !ddl_g.shm)) ctx->shm_state = -1;
    if (ctx->shm_state != 0) return DDL_SUCCESS;
    const ddl_mpicomm_t *c = &ctx->world;
    MPI_Comm local;
    int lsize = 0;
    MPI_CHECK(MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_size(local, &lsize));
    MPI_CHECK(MPI_Comm_free(&local));
    ctx->shm_state = -1;
    if (lsize != 2) return DDL_SUCCESS;

    ddl_shm_t *s = calloc(1, sizeof *s);
    char name[64] = {0};
    int ok = 0;
    if (c->rank == 0 && s) {
        snprintf(name, sizeof name, "/ddl-%ld-%u", (long)getpid(),
                 __atomic_fetch_add(&shm_made, 1, __ATOMIC_RELAXED));
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0) {
            if (ftruncate(fd, (off_t)SHM_BYTES) == 0) s->base = map(fd);
            close(fd);
            if (!s->base) shm_unlink(name);
        }
        if (!s->base) name[0] = 0; /* tells rank 1 there is none */
    }
    ddl_status_t st = c->rank == 0 ? ddl_sendrecv(c, name, sizeof name, 1, NULL, 0, -1, TAG_SHM)
                                   : ddl_sendrecv(c, NULL, 0, -1, name, sizeof name, 0, TAG_SHM);
    if (st == DDL_SUCCESS && c->rank == 1) {
        int fd = s && name[0] ? shm_open(name, O_RDWR, 0) : -1;
        if (fd >= 0) {
            s->base = map(fd);
            close(fd);
        }
        ok = s && s->base;
        st = ddl_sendrecv(c, &ok, sizeof ok, 0, NULL, 0, -1, TAG_SHM);
    } else if (st == DDL_SUCCESS) {
        st = ddl_sendrecv(c, NULL, 0, -1, &ok, sizeof ok, 1, TAG_SHM);
    }
    if (c->rank == 0 && name[0]) shm_unlink(name); /* mapped where it is used; gone elsewhere */
    if (st != DDL_SUCCESS || !ok) {
        if (s && s->base) munmap(s->base, SHM_BYTES);
        free(s);
        return st;
    }
    ctx->shm = s;
    ctx->shm_state = 1;
    *out = s;
    return DDL_SUCCESS;
}

void ddl_shm_release(ddl_ctx_t *ctx) {
    if (ctx->shm) {
        munmap(ctx->shm->base, SHM_BYTES);
        free(ctx->shm);
        ctx->shm = NULL;
    }
    if (ctx->shm_state > 0) ctx->shm_state = -1;
}

ddl_status_t ddl_shm_move(ddl_ctx_t *ctx, ddl_shm_t *s, const ddl_shm_move_t *m) {
    const ddl_mpicomm_t *c = &ctx->world;
    int me = c->rank, peer = 1 - me;
    /* two ways: each rank writes its half of the slots; one way: the writer all of them */
    size_t nslots = m->two_way ? SHM_SLOTS / 2 : SHM_SLOTS;
    size_t out_base = m->two_way ? (size_t)me * nslots : 0;
    size_t in_base = m->two_way ? (size_t)peer * nslots : 0;
    size_t nout = (m->out_bytes + SHM_CHUNK - 1) / SHM_CHUNK;
    size_t nin = (m->in_bytes + SHM_CHUNK - 1) / SHM_CHUNK;
    size_t es = m->reduce_a ? ddl_dtype_size(m->dtype) : 1;
    ddl_status_t st = DDL_SUCCESS;
    for (size_t k = 0; st == DDL_SUCCESS && (k < nout || k < nin); k++) {
        size_t off = k * SHM_CHUNK;
        if (k < nout) { /* our chunk k out, into a free slot */
            size_t slot = out_base + k % nslots;
            size_t n = m->out_bytes - off < SHM_CHUNK ? m->out_bytes - off : SHM_CHUNK;
            st = ddl_wait_flag(c, flag_of(s, slot), 0, peer, n, m->waiting_out);
            if (st != DDL_SUCCESS) break;
            memcpy(slot_of(s, slot), m->out + off, n);
            __atomic_store_n(flag_of(s, slot), (uint64_t)k + 1, __ATOMIC_RELEASE);
            /* the same bytes into our own place from the slot, still in cache (the slot
             * does not change before we fill it again, after the other rank freed it) */
            if (m->out_also) memcpy(m->out_also + off, slot_of(s, slot), n);
        }
        if (k < nin) { /* its chunk k in, from its slot */
            size_t slot = in_base + k % nslots;
            size_t n = m->in_bytes - off < SHM_CHUNK ? m->in_bytes - off : SHM_CHUNK;
            st = ddl_wait_flag(c, flag_of(s, slot), (uint64_t)k + 1, peer, n, m->waiting_in);
            if (st != DDL_SUCCESS) break;
            if (m->reduce_a) {
                ddl_reduce_pair(m->in + off, m->reduce_a + off, slot_of(s, slot), n / es,
                                m->dtype, m->op);
            } else {
                memcpy(m->in + off, slot_of(s, slot), n);
            }
            __atomic_store_n(flag_of(s, slot), 0, __ATOMIC_RELEASE);
        }
    }
    if (st != DDL_SUCCESS) ddl_shm_release(ctx); /* its flags are in an unknown state */
    return st;
}

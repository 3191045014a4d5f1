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
 * pair under DDL_SHM=0 (a setting all ranks must agree on, as this step is collective).
 *
 * Direct moves, for large alltoall, gather, scatter and allgatherv: beyond the caches a
 * move through the slots is two copies (in, out) against MPI's one, so there each rank
 * copies straight from or into the other's buffer (process_vm_readv/writev, the
 * "cross-memory attach" Open MPI's single copy uses), one part each, while it copies its
 * own block: the rank that posts an address (in the segment, with a call number) waits
 * until the other says its part is done, with the errno, so neither buffer is touched
 * after its call returns. At setup each rank reads a probe word of the other's across,
 * so a machine that forbids it (ptrace rules, another pid namespace, a seccomp filter),
 * or DDL_CMA=0 on either rank, keeps the pair on the slots and MPI. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* process_vm_readv / process_vm_writev */
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ddl_internal.h"

#define SHM_SLOTS 4
#define SHM_CHUNK ((size_t)256 * 1024)
#define SHM_FLAGS ((size_t)4096) /* the flags' page; slots start after it */
#define SHM_BYTES (SHM_FLAGS + SHM_SLOTS * SHM_CHUNK)
enum { TAG_SHM = 113 };

/* Cache lines of the flags' page (64 bytes each) past the slot flags. Rank r's line
 * DIRECT_LINE + 2r holds {seq, address} posted for a direct move, DIRECT_LINE + 2r + 1
 * {seq, errno} once its part of the move is done; PROBE_LINE + r {pid, address, value}
 * of its probe word, read by the other rank at setup to see whether direct moves work. */
#define DIRECT_LINE 8
#define PROBE_LINE 16

struct ddl_shm_s {
    char *base;
    pid_t peer_pid;
    int direct;    /* both ranks can read and write each other's memory (process_vm_*) */
    uint64_t seq;  /* direct moves so far: the same count on both ranks */
};

static uint64_t probe_word; /* what the other rank reads at setup */

static unsigned shm_made; /* this process's segments so far: part of each name */

/* Cache line `line` of the flags' page: slot k's flag is line k. */
static uint64_t *line_of(ddl_shm_t *s, size_t line) { return (uint64_t *)(s->base + line * 64); }
static uint64_t *flag_of(ddl_shm_t *s, size_t slot) { return line_of(s, slot); }
static char *slot_of(ddl_shm_t *s, size_t slot) { return s->base + SHM_FLAGS + slot * SHM_CHUNK; }

/* Our probe into the segment: pid, where the word is, what it holds. The word depends
 * on the pid only, so pairs set up at once from several threads write the same value. */
static void post_probe(ddl_shm_t *s, int me) {
    uint64_t v = ((uint64_t)getpid() << 32) ^ 0x5a5a5a5a5a5a5a5aull;
    __atomic_store_n(&probe_word, v, __ATOMIC_RELAXED);
    uint64_t *l = line_of(s, PROBE_LINE + me);
    l[0] = (uint64_t)getpid();
    l[1] = (uint64_t)(uintptr_t)&probe_word;
    l[2] = v;
}

/* Whether we can read the other rank's memory: its probe word, read across, must be the
 * value it posted (no ptrace permission, another pid namespace, a seccomp filter: no). */
static int probe_peer(ddl_shm_t *s, int peer) {
    const uint64_t *l = line_of(s, PROBE_LINE + peer);
    uint64_t got = 0;
    struct iovec local = {&got, sizeof got}, remote = {(void *)(uintptr_t)l[1], sizeof got};
    s->peer_pid = (pid_t)l[0];
    if (!ddl_g.cma || s->peer_pid <= 0) return 0;
    return process_vm_readv(s->peer_pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof got &&
           got == l[2];
}

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
        if (s->base) post_probe(s, 0);
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
        if (ok) post_probe(s, 1);
        int answer[2] = {ok, ok && probe_peer(s, 0)};
        st = ddl_sendrecv(c, answer, sizeof answer, 0, NULL, 0, -1, TAG_SHM);
        /* rank 0's verdict on direct moves: both ways must work */
        if (st == DDL_SUCCESS && ok)
            st = ddl_sendrecv(c, NULL, 0, -1, &s->direct, sizeof s->direct, 0, TAG_SHM);
    } else if (st == DDL_SUCCESS) {
        int answer[2] = {0, 0};
        st = ddl_sendrecv(c, NULL, 0, -1, answer, sizeof answer, 1, TAG_SHM);
        ok = answer[0];
        if (st == DDL_SUCCESS && ok) {
            s->direct = answer[1] && probe_peer(s, 1);
            st = ddl_sendrecv(c, &s->direct, sizeof s->direct, 1, NULL, 0, -1, TAG_SHM);
        }
    }
    if (c->rank == 0 && name[0]) shm_unlink(name); /* mapped where it is used; gone elsewhere */
    if (st != DDL_SUCCESS || !ok) {
        if (s && s->base) munmap(s->base, SHM_BYTES);
        free(s);
        return st;
    }
    ddl_log(1, "a shared segment with rank %d of this pair; direct copies %s", 1 - c->rank,
            s->direct ? "on" : "off (DDL_CMA=0, or process_vm_readv not permitted between us)");
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

/* A rank's own block of a large direct move: streaming (non-temporal) stores skip reading
 * each destination line into the cache first, which leaves more of the memory bandwidth to
 * the other copy running beside it. Alone, a 16-64 MiB copy ran 15-30% faster than memcpy
 * here (glibc streams only from its non-temporal threshold, hundreds of MiB on this
 * machine); within the pair's alltoall and allgatherv, blocks of 8 MiB and up went from
 * 0.9-1.0x MPI to 1.0-1.4x, and 4 MiB ones lost (python -m ddl_core.bench). Other
 * targets: memcpy. */
#define STREAM_MIN ((size_t)8 * 1024 * 1024)
static void copy_streaming(char *dst, const char *src, size_t n) {
#if defined(__x86_64__) && defined(__SSE2__)
    size_t head = (64 - ((uintptr_t)dst & 63)) & 63;
    if (n < STREAM_MIN) {
        memcpy(dst, src, n);
        return;
    }
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence();
    memcpy(dst + i, src + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}

int ddl_shm_direct_ok(const ddl_shm_t *s) { return s && s->direct; }

/* The whole of `n` bytes across (process_vm_* may stop short; a fault is an error). */
static int cross(pid_t pid, int pull, char *local, char *remote, size_t n) {
    while (n) {
        struct iovec l = {local, n}, r = {remote, n};
        ssize_t k = pull ? process_vm_readv(pid, &l, 1, &r, 1, 0)
                         : process_vm_writev(pid, &l, 1, &r, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : EFAULT;
        local += k;
        remote += k;
        n -= (size_t)k;
    }
    return 0;
}

ddl_status_t ddl_shm_direct(ddl_ctx_t *ctx, ddl_shm_t *s, const ddl_shm_direct_t *d) {
    const ddl_mpicomm_t *c = &ctx->world;
    int me = c->rank, peer = 1 - me;
    uint64_t seq = ++s->seq;
    uint64_t *mine = line_of(s, DIRECT_LINE + 2 * me), *its = line_of(s, DIRECT_LINE + 2 * peer);
    ddl_status_t st = DDL_SUCCESS;
    if (d->post) {
        mine[1] = (uint64_t)(uintptr_t)d->post;
        __atomic_store_n(&mine[0], seq, __ATOMIC_RELEASE);
    }
    /* our own block first: the other rank posts meanwhile, and copies its part */
    if (d->own_bytes && d->own_dst != d->own_src)
        copy_streaming(d->own_dst, d->own_src, d->own_bytes);
    if (d->bytes) {
        st = ddl_wait_flag(c, &its[0], seq, peer, d->bytes, d->waiting);
        if (st == DDL_SUCCESS) {
            char *remote = (char *)(uintptr_t)its[1] + d->off;
            int err = cross(s->peer_pid, d->pull, d->local, remote, d->bytes);
            uint64_t *done = line_of(s, DIRECT_LINE + 2 * me + 1);
            done[1] = (uint64_t)err;
            __atomic_store_n(&done[0], seq, __ATOMIC_RELEASE);
            if (err)
                st = ddl_fail(DDL_ERR_INTERNAL,
                              "%s %zu bytes %s the other rank's memory failed: %s (DDL_CMA=0 "
                              "keeps the pair off direct copies)",
                              d->pull ? "reading" : "writing", d->bytes,
                              d->pull ? "from" : "into", strerror(err));
        }
    }
    if (st == DDL_SUCCESS && d->peer_acts) { /* it reads or writes our memory: wait till done */
        uint64_t *done = line_of(s, DIRECT_LINE + 2 * peer + 1);
        st = ddl_wait_flag(c, &done[0], seq, peer, d->bytes ? d->bytes : d->own_bytes,
                           d->waiting);
        if (st == DDL_SUCCESS && done[1])
            st = ddl_fail(DDL_ERR_INTERNAL,
                          "the other rank could not copy to or from our memory: %s (DDL_CMA=0 "
                          "keeps the pair off direct copies)", strerror((int)done[1]));
    }
    if (st != DDL_SUCCESS) ddl_shm_release(ctx);
    return st;
}

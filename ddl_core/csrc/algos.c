/* The allreduce building blocks: recursive doubling (latency), ring and Rabenseifner
 * (bandwidth) reduce-scatter / allgather, and MPI's own allreduce, each on one
 * communicator. The topology layer (collectives.c) strings them together level by level.
 *
 * All of them work in place on the caller's buffer and use only per-thread scratch, so
 * the application thread and the progress thread can run them at the same time on their
 * own communicators. Averages travel as sums; the caller divides once at the end. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

void ddl_block_range(size_t count, int parts, int i, size_t *lo, size_t *hi) {
    size_t q = count / (size_t)parts, r = count % (size_t)parts, ui = (size_t)i;
    *lo = q * ui + (ui < r ? ui : r);
    *hi = *lo + q + (ui < r ? 1 : 0);
}

/* ---- recursive doubling with a header: the latency path and the mismatch check ---- */

enum { TAG_RD = DDL_TAG_RD, TAG_RING_RS = 102, TAG_RING_AG = 103, TAG_HALVE = 104, TAG_DOUBLE = 105 };

/* Combine a peer's packed [header|data] into ours. A peer whose message had another size
 * already disagrees in its header's signature; its data is then not touched. */
static void merge_packed(char *mine, const char *theirs, size_t got, size_t mine_bytes,
                         size_t count, ddl_dtype_t dtype, ddl_op_t op) {
    ddl_header_t h;
    memcpy(&h, theirs, sizeof h);
    ddl_header_t *me = (ddl_header_t *)(void *)mine;
    ddl_header_merge(me, &h);
    if (got == mine_bytes && count > 0)
        ddl_reduce(mine + sizeof(ddl_header_t), theirs + sizeof(ddl_header_t), count, dtype, op);
    else if (got != mine_bytes)
        me->sig_max = UINT64_MAX, me->sig_min = 0; /* sizes differ: poison the verdict */
}

/* Small totals use pre-posted receives with room for the largest fused message any rank
 * may send (DDL_FUSED_MAX): the latency path. Larger totals only run after a header check
 * made the sizes agree, and use the probing exchange. */
static ddl_status_t rd_exchange(const ddl_mpicomm_t *c, const void *s, size_t sb, int dst, void *r,
                                size_t total, int src, size_t *got) {
    size_t cap = sizeof(ddl_header_t) + DDL_FUSED_MAX;
    if (total <= cap) return ddl_sendrecv_capped(c, s, sb, dst, r, cap, src, TAG_RD, got);
    *got = total;
    return ddl_sendrecv(c, s, sb, dst, r, src >= 0 ? total : 0, src, TAG_RD);
}

ddl_status_t ddl_rd_allreduce_checked(const ddl_mpicomm_t *c, ddl_header_t *hdr, void *buf,
                                      size_t count, ddl_dtype_t dtype, ddl_op_t op) {
    size_t bytes = count * ddl_dtype_size(dtype);
    size_t total = sizeof(ddl_header_t) + bytes;
    size_t room = total > sizeof(ddl_header_t) + DDL_FUSED_MAX ? total
                                                               : sizeof(ddl_header_t) + DDL_FUSED_MAX;
    char *mine = ddl_scratch(DDL_SCRATCH_RD_MINE, total);
    char *theirs = ddl_scratch(DDL_SCRATCH_RD_THEIRS, room);
    if (!mine || !theirs) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for %zu bytes", total);
    memcpy(mine, hdr, sizeof *hdr);
    if (bytes) memcpy(mine + sizeof *hdr, buf, bytes);

    int p = c->size, r = c->rank;
    int pof2 = 1;
    while (pof2 * 2 <= p) pof2 *= 2;
    int rem = p - pof2, newrank;
    size_t got = 0;
    if (r < 2 * rem) {
        if (r % 2 == 0) { /* fold in: hand our part to r+1, wait for the result later */
            DDL_CHECK(rd_exchange(c, mine, total, r + 1, NULL, total, -1, &got));
            newrank = -1;
        } else {
            DDL_CHECK(rd_exchange(c, NULL, 0, -1, theirs, total, r - 1, &got));
            merge_packed(mine, theirs, got, total, count, dtype, op);
            newrank = r / 2;
        }
    } else {
        newrank = r - rem;
    }
    if (newrank >= 0) {
        for (int mask = 1; mask < pof2; mask <<= 1) {
            int np = newrank ^ mask;
            int peer = np < rem ? np * 2 + 1 : np + rem;
            DDL_CHECK(rd_exchange(c, mine, total, peer, theirs, total, peer, &got));
            merge_packed(mine, theirs, got, total, count, dtype, op);
        }
    }
    if (r < 2 * rem) { /* unfold: the result goes back to the folded rank */
        if (r % 2) {
            DDL_CHECK(rd_exchange(c, mine, total, r - 1, NULL, total, -1, &got));
        } else {
            DDL_CHECK(rd_exchange(c, NULL, 0, -1, theirs, total, r + 1, &got));
            /* The header always fits (capped receives have room for any rank's
             * message); data of another size is not taken. */
            memcpy(mine, theirs, got == total ? total : sizeof(ddl_header_t));
            if (got != total) {
                ((ddl_header_t *)(void *)mine)->sig_min = 0;
                ((ddl_header_t *)(void *)mine)->sig_max = UINT64_MAX;
            }
        }
    }
    memcpy(hdr, mine, sizeof *hdr);
    if (bytes && hdr->sig_min == hdr->sig_max) memcpy(buf, mine + sizeof *hdr, bytes);
    return DDL_SUCCESS;
}

/* ---- ring ----------------------------------------------------------------------------- */

static size_t max_block(size_t count, int p) { return count / (size_t)p + 1; }

/* A reduce-scatter over one rank is a copy of the input (unless in place): true then. */
static int alone(const ddl_mpicomm_t *c, const void *in, void *out, size_t bytes) {
    if (c->size != 1) return 0;
    if (in != out && bytes) memcpy(out, in, bytes);
    return 1;
}

ddl_status_t ddl_ring_reduce_scatter(const ddl_mpicomm_t *c, const void *in, void *out,
                                     size_t count, ddl_dtype_t dtype, ddl_op_t op) {
    int p = c->size, r = c->rank;
    size_t es = ddl_dtype_size(dtype);
    if (alone(c, in, out, count * es)) return DDL_SUCCESS;
    char *b = out;
    const char *src = in;
    char *tmp = ddl_scratch(DDL_SCRATCH_BLOCK, max_block(count, p) * es);
    if (!tmp) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the ring's block");
    int right = (r + 1) % p, left = (r - 1 + p) % p;
    for (int s = 0; s < p - 1; s++) {
        int sb = ((r - s - 1) % p + p) % p, rb = ((r - s - 2) % p + p) % p;
        size_t slo, shi, rlo, rhi;
        ddl_block_range(count, p, sb, &slo, &shi);
        ddl_block_range(count, p, rb, &rlo, &rhi);
        /* Each block is received and reduced once: step 0 sends raw input, later steps
         * send the block reduced in the step before. */
        const char *from = s == 0 ? src : b;
        DDL_CHECK(ddl_sendrecv(c, from + slo * es, (shi - slo) * es, right, tmp,
                               (rhi - rlo) * es, left, TAG_RING_RS));
        ddl_reduce3(b + rlo * es, src + rlo * es, tmp, rhi - rlo, dtype, op);
    }
    return DDL_SUCCESS;
}

ddl_status_t ddl_ring_allgather(const ddl_mpicomm_t *c, void *buf, size_t count, ddl_dtype_t dtype) {
    int p = c->size, r = c->rank;
    if (p == 1) return DDL_SUCCESS;
    size_t es = ddl_dtype_size(dtype);
    char *b = buf;
    int right = (r + 1) % p, left = (r - 1 + p) % p;
    for (int s = 0; s < p - 1; s++) {
        int sb = ((r - s) % p + p) % p, rb = ((r - s - 1) % p + p) % p;
        size_t slo, shi, rlo, rhi;
        ddl_block_range(count, p, sb, &slo, &shi);
        ddl_block_range(count, p, rb, &rlo, &rhi);
        DDL_CHECK(ddl_sendrecv(c, b + slo * es, (shi - slo) * es, right, b + rlo * es,
                               (rhi - rlo) * es, left, TAG_RING_AG));
    }
    return DDL_SUCCESS;
}

/* ---- Rabenseifner: recursive halving then recursive doubling (power-of-two sizes) ---- */

static void blocks_range(size_t count, int p, int b0, int nb, size_t *lo, size_t *hi) {
    size_t l, h;
    ddl_block_range(count, p, b0, lo, &h);
    ddl_block_range(count, p, b0 + nb - 1, &l, hi);
}

ddl_status_t ddl_halving_reduce_scatter(const ddl_mpicomm_t *c, const void *in, void *out,
                                        size_t count, ddl_dtype_t dtype, ddl_op_t op) {
    int p = c->size, r = c->rank;
    size_t es = ddl_dtype_size(dtype);
    if (alone(c, in, out, count * es)) return DDL_SUCCESS;
    if (p & (p - 1)) return ddl_fail(DDL_ERR_INTERNAL, "halving needs a power-of-two size");
    char *b = out;
    const char *src = in; /* the first step reads the input; later ones the output */
    char *tmp = ddl_scratch(DDL_SCRATCH_BLOCK, (count / 2 + (size_t)p) * es);
    if (!tmp) return ddl_fail(DDL_ERR_NO_MEMORY, "no memory for the halving buffer");
    int b0 = 0, nb = p;
    for (int mask = p / 2; mask >= 1; mask >>= 1) {
        int peer = r ^ mask, half = nb / 2;
        int keep0 = (r & mask) ? b0 + half : b0, send0 = (r & mask) ? b0 : b0 + half;
        size_t klo, khi, slo, shi;
        blocks_range(count, p, keep0, half, &klo, &khi);
        blocks_range(count, p, send0, half, &slo, &shi);
        DDL_CHECK(ddl_sendrecv(c, src + slo * es, (shi - slo) * es, peer, tmp,
                               (khi - klo) * es, peer, TAG_HALVE));
        ddl_reduce3(b + klo * es, src + klo * es, tmp, khi - klo, dtype, op);
        src = b;
        b0 = keep0;
        nb = half;
    }
    return DDL_SUCCESS;
}

ddl_status_t ddl_doubling_allgather(const ddl_mpicomm_t *c, void *buf, size_t count,
                                    ddl_dtype_t dtype) {
    int p = c->size, r = c->rank;
    if (p == 1) return DDL_SUCCESS;
    if (p & (p - 1)) return ddl_fail(DDL_ERR_INTERNAL, "doubling needs a power-of-two size");
    size_t es = ddl_dtype_size(dtype);
    char *b = buf;
    int b0 = r, nb = 1;
    for (int mask = 1; mask < p; mask <<= 1) {
        int peer = r ^ mask, pb0 = b0 ^ mask;
        size_t mlo, mhi, plo, phi;
        blocks_range(count, p, b0, nb, &mlo, &mhi);
        blocks_range(count, p, pb0, nb, &plo, &phi);
        DDL_CHECK(ddl_sendrecv(c, b + mlo * es, (mhi - mlo) * es, peer, b + plo * es,
                               (phi - plo) * es, peer, TAG_DOUBLE));
        b0 = b0 < pb0 ? b0 : pb0;
        nb *= 2;
    }
    return DDL_SUCCESS;
}

/* ---- MPI's own allreduce --------------------------------------------------------------- */

/* MPI has no 16-bit float types, Open MPI's vectorised int8/uint8 sum saturates where
 * every other path (and numpy) wraps, and MPI's own float MAX/MIN neither propagate NaN
 * nor agree on -0.0 vs +0.0 (nor do its sums on NaN payloads): the result could depend
 * on the order in which a rank applied them. Those dtypes travel as contiguous byte types
 * of their own with user ops that call ddl_reduce (commutative bit for bit, reduce.c),
 * so `mpi` gives the same results as DDL's own algorithms for every dtype, on every rank.
 * Integers of 32 and 64 bits keep MPI's own ops: they are exact in any order. */
#define NOWN 6
static const ddl_dtype_t own_dtypes[NOWN] = {DDL_FLOAT16, DDL_BFLOAT16, DDL_INT8,
                                             DDL_UINT8,   DDL_FLOAT32,  DDL_FLOAT64};
static MPI_Datatype own_types[NOWN] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL,
                                       MPI_DATATYPE_NULL, MPI_DATATYPE_NULL,
                                       MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};
static MPI_Op own_ops[DDL_NUM_OPS];
static int own_ready;

static int own_index(ddl_dtype_t d) {
    for (int i = 0; i < NOWN; i++)
        if (own_dtypes[i] == d) return i;
    return -1;
}

static void own_reduce(void *in, void *inout, int *len, MPI_Datatype *dt, ddl_op_t op) {
    for (int i = 0; i < NOWN; i++)
        if (*dt == own_types[i]) ddl_reduce(inout, in, (size_t)*len, own_dtypes[i], op);
}
static void own_sum(void *a, void *b, int *n, MPI_Datatype *t) { own_reduce(a, b, n, t, DDL_SUM); }
static void own_prod(void *a, void *b, int *n, MPI_Datatype *t) { own_reduce(a, b, n, t, DDL_PROD); }
static void own_min(void *a, void *b, int *n, MPI_Datatype *t) { own_reduce(a, b, n, t, DDL_MIN); }
static void own_max(void *a, void *b, int *n, MPI_Datatype *t) { own_reduce(a, b, n, t, DDL_MAX); }
static void own_band(void *a, void *b, int *n, MPI_Datatype *t) { own_reduce(a, b, n, t, DDL_BAND); }
static void own_bor(void *a, void *b, int *n, MPI_Datatype *t) { own_reduce(a, b, n, t, DDL_BOR); }
static void own_bxor(void *a, void *b, int *n, MPI_Datatype *t) { own_reduce(a, b, n, t, DDL_BXOR); }

static ddl_status_t own_setup(void) {
    if (own_ready) return DDL_SUCCESS;
    for (int i = 0; i < NOWN; i++) {
        MPI_CHECK(MPI_Type_contiguous((int)ddl_dtype_size(own_dtypes[i]), MPI_BYTE, &own_types[i]));
        MPI_CHECK(MPI_Type_commit(&own_types[i]));
    }
    MPI_CHECK(MPI_Op_create(own_sum, 1, &own_ops[DDL_SUM]));
    MPI_CHECK(MPI_Op_create(own_prod, 1, &own_ops[DDL_PROD]));
    MPI_CHECK(MPI_Op_create(own_min, 1, &own_ops[DDL_MIN]));
    MPI_CHECK(MPI_Op_create(own_max, 1, &own_ops[DDL_MAX]));
    MPI_CHECK(MPI_Op_create(own_band, 1, &own_ops[DDL_BAND]));
    MPI_CHECK(MPI_Op_create(own_bor, 1, &own_ops[DDL_BOR]));
    MPI_CHECK(MPI_Op_create(own_bxor, 1, &own_ops[DDL_BXOR]));
    own_ops[DDL_AVG] = own_ops[DDL_SUM];
    own_ready = 1;
    return DDL_SUCCESS;
}

MPI_Datatype ddl_mpi_dtype(ddl_dtype_t dtype) {
    int own = own_index(dtype);
    if (own >= 0) return own_types[own];
    switch (dtype) {
    case DDL_INT32: return MPI_INT32_T;
    case DDL_INT64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(ddl_dtype_t dtype, ddl_op_t op) {
    if (own_index(dtype) >= 0) return own_ops[op];
    switch (op) {
    case DDL_SUM:
    case DDL_AVG: return MPI_SUM;
    case DDL_PROD: return MPI_PROD;
    case DDL_MIN: return MPI_MIN;
    case DDL_MAX: return MPI_MAX;
    case DDL_BAND: return MPI_BAND;
    case DDL_BOR: return MPI_BOR;
    case DDL_BXOR: return MPI_BXOR;
    default: return MPI_OP_NULL;
    }
}

ddl_status_t ddl_mpi_allreduce(const ddl_mpicomm_t *c, void *buf, size_t count, ddl_dtype_t dtype,
                               ddl_op_t op) {
    if (c->size == 1 || count == 0) return DDL_SUCCESS;
    DDL_CHECK(own_setup());
    size_t es = ddl_dtype_size(dtype);
    for (size_t off = 0; off < count;) {
        size_t n = count - off < (size_t)INT_MAX / 2 ? count - off : (size_t)INT_MAX / 2;
        MPI_Request req;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n,
                                 ddl_mpi_dtype(dtype), mpi_op(dtype, op), c->comm, &req));
        DDL_CHECK(ddl_wait_request(&req, c, "MPI_Iallreduce"));
        off += n;
    }
    return DDL_SUCCESS;
}

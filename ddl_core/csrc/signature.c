/* Signatures and headers: the mismatch check every collective starts with.
 *
 * A collective's signature hashes what every rank must agree on (the collective, count,
 * dtype, op, root and the run-time settings its messages depend on); a header carries the
 * minimum and maximum signature and count seen, combined along the algorithm's own
 * messages (or a header-only recursive doubling, ddl_comm_check), so that every rank
 * reaches the same verdict before any data moves. */
#include "ddl_internal.h"

static uint64_t mix(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The settings a collective's messages depend on and that can change at run time
 * (ddl_set_algorithm, ddl_set_fusion) are part of every signature, so ranks that changed
 * them differently fail with DDL_ERR_MISMATCH at the next call's check instead of
 * running different algorithms into each other (a hang until DDL_TIMEOUT). */
void ddl_settings_changed(void) {
    uint64_t s = mix(((uint64_t)ddl_g.forced_algo << 56) ^ (uint64_t)ddl_g.fusion_threshold);
    __atomic_store_n(&ddl_g.settings_sig, s, __ATOMIC_RELAXED);
    ddl_plans_changed();
}

void ddl_plans_changed(void) {
    unsigned g = __atomic_load_n(&ddl_g.plan_gen, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&ddl_g.plan_gen, g ? g : 1, __ATOMIC_RELAXED);
}

uint64_t ddl_signature(int coll, uint64_t count, int dtype, int op, int root) {
    /* The negotiation of the asynchronous queue does not depend on the run-time settings,
     * and an idle rank's progress thread joins one whenever a peer starts it, possibly
     * while the application changes them (ddl_set_fusion) on some ranks first. */
    uint64_t settings =
        coll == DDL_COLL_NEGOTIATE ? 0 : __atomic_load_n(&ddl_g.settings_sig, __ATOMIC_RELAXED);
    uint64_t h = mix((uint64_t)coll * 0x9e3779b97f4a7c15ULL ^ settings);
    h = mix(h ^ count);
    h = mix(h ^ ((uint64_t)(uint32_t)dtype << 32 | (uint32_t)op));
    return mix(h ^ (uint64_t)(uint32_t)root);
}

void ddl_header_init(ddl_header_t *h, uint64_t sig, uint64_t count) {
    h->sig_min = h->sig_max = sig;
    h->count_min = h->count_max = count;
}

void ddl_header_merge(ddl_header_t *into, const ddl_header_t *from) {
    if (from->sig_min < into->sig_min) into->sig_min = from->sig_min;
    if (from->sig_max > into->sig_max) into->sig_max = from->sig_max;
    if (from->count_min < into->count_min) into->count_min = from->count_min;
    if (from->count_max > into->count_max) into->count_max = from->count_max;
}

ddl_status_t ddl_header_verdict(const ddl_header_t *h, const char *coll) {
    if (h->sig_min == h->sig_max) return DDL_SUCCESS;
    if (h->count_min != h->count_max)
        return ddl_fail(DDL_ERR_MISMATCH,
                        "%s called with different counts on different ranks (from %llu to %llu "
                        "elements): every rank must pass the same count, dtype and op, in the "
                        "same order",
                        coll, (unsigned long long)h->count_min, (unsigned long long)h->count_max);
    return ddl_fail(DDL_ERR_MISMATCH,
                    "%s called with different arguments on different ranks (the dtype, op, "
                    "root or the collective itself differ, or ddl_set_algorithm / "
                    "ddl_set_fusion was called on some ranks only; counts agree): every rank "
                    "must call the same collectives in the same order with the same arguments "
                    "and settings",
                    coll);
}

/* Header-only exchange: the verdict before any data moves. */
ddl_status_t ddl_comm_check(ddl_ctx_t *ctx, uint64_t sig, uint64_t count, const char *coll) {
    ddl_header_t h;
    ddl_header_init(&h, sig, count);
    DDL_CHECK(ddl_rd_allreduce_checked(&ctx->world, &h, NULL, 0, DDL_UINT8, DDL_SUM));
    return ddl_header_verdict(&h, coll);
}

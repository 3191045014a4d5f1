/* Names of asynchronous requests: a hash, and an open-addressing map from names to
 * values (the requests in flight per name, async.c; the table of names, negotiate.c).
 * Linear probing, at most half full, deletion by shifting back (no tombstones): lookups
 * stay short however often names come and go. */
#include <stdlib.h>
#include <string.h>

#include "async_internal.h"

uint64_t ddl_mix64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t ddl_name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then mixed */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return ddl_mix64(h);
}

ddl_nm_entry_t *ddl_nm_find(const ddl_namemap_t *m, const char *name, uint64_t h) {
    if (!m->cap) return NULL;
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        ddl_nm_entry_t *s = &m->e[i];
        if (!s->name) return NULL;
        if (s->hash == h && strcmp(s->name, name) == 0) return s;
    }
}

int ddl_nm_put(ddl_namemap_t *m, const char *name, uint64_t h, size_t val) {
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        ddl_nm_entry_t *e = calloc(cap, sizeof *e);
        if (!e) return -1;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->e[i].name) continue;
            size_t j = m->e[i].hash & (cap - 1);
            while (e[j].name) j = (j + 1) & (cap - 1);
            e[j] = m->e[i];
        }
        free(m->e);
        m->e = e;
        m->cap = cap;
    }
    size_t i = h & (m->cap - 1);
    while (m->e[i].name) i = (i + 1) & (m->cap - 1);
    m->e[i] = (ddl_nm_entry_t){h, name, val};
    m->n++;
    return 0;
}

/* Remove an entry, shifting later entries of its probe run back (no tombstones). */
void ddl_nm_del(ddl_namemap_t *m, ddl_nm_entry_t *s) {
    size_t mask = m->cap - 1, i = (size_t)(s - m->e), j = i;
    m->e[i].name = NULL;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->e[j].name) break;
        size_t k = m->e[j].hash & mask; /* where the entry would like to be */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
        m->e[i] = m->e[j];
        m->e[j].name = NULL;
        i = j;
    }
    m->n--;
}

void ddl_nm_free(ddl_namemap_t *m) {
    free(m->e);
    *m = (ddl_namemap_t){0};
}


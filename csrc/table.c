/* The allocation table: base address -> entry, and live/peak/at-boundary bytes per tag.
 * Linear probing with backward-shift deletion keeps lookups short without tombstones; free is on
 * torch's hot path, so it must stay O(1). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_addr(uintptr_t a) {
    uint64_t x = (uint64_t)a >> 12; /* allocations are at least page-aligned */
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

int gmux__table_init(gmux_table *t) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    t->slots = calloc(t->cap, sizeof *t->slots);
    return t->slots ? GMUX_OK : gmux__fail(GMUX_E_NOMEM, "cannot allocate the allocation table");
}

void gmux__table_free(gmux_table *t) {
    free(t->slots);
    t->slots = NULL;
    t->cap = t->count = 0;
}

static void place(gmux_entry **slots, uint64_t cap, gmux_entry *e) {
    uint64_t i = hash_addr(e->addr) & (cap - 1);
    while (slots[i]) i = (i + 1) & (cap - 1);
    slots[i] = e;
}

static void add_bytes(gmux_table *t, int tag, uint64_t n) {
    t->live[tag] += n;
    if (t->live[tag] > t->peak[tag]) t->peak[tag] = t->live[tag];
    t->live_total += n;
    if (t->live_total > t->peak_total) t->peak_total = t->live_total;
}

int gmux__table_insert(gmux_table *t, gmux_entry *e) {
    if ((t->count + 1) * 4 > t->cap * 3) { /* keep the load under 3/4 */
        uint64_t ncap = t->cap * 2;
        gmux_entry **ns = calloc(ncap, sizeof *ns);
        if (!ns) return gmux__fail(GMUX_E_NOMEM, "cannot grow the allocation table to %llu slots", (unsigned long long)ncap);
        for (uint64_t i = 0; i < t->cap; i++)
            if (t->slots[i]) place(ns, ncap, t->slots[i]);
        free(t->slots);
        t->slots = ns;
        t->cap = ncap;
    }
    place(t->slots, t->cap, e);
    t->count++;
    add_bytes(t, e->tag, e->size);
    t->reserved += e->span;
    return GMUX_OK;
}

static uint64_t find_slot(const gmux_table *t, uintptr_t addr) {
    uint64_t i = hash_addr(addr) & (t->cap - 1);
    while (t->slots[i]) {
        if (t->slots[i]->addr == addr) return i;
        i = (i + 1) & (t->cap - 1);
    }
    return UINT64_MAX;
}

gmux_entry *gmux__table_find(const gmux_table *t, uintptr_t addr) {
    uint64_t i = find_slot(t, addr);
    return i == UINT64_MAX ? NULL : t->slots[i];
}

gmux_entry *gmux__table_remove(gmux_table *t, uintptr_t addr) {
    uint64_t i = find_slot(t, addr);
    if (i == UINT64_MAX) return NULL;
    gmux_entry *e = t->slots[i];
    uint64_t mask = t->cap - 1, j = i;
    t->slots[i] = NULL;
    for (;;) { /* backward shift: move later members of the probe run into the hole if it is on their path */
        j = (j + 1) & mask;
        if (!t->slots[j]) break;
        uint64_t home = hash_addr(t->slots[j]->addr) & mask;
        bool between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            t->slots[i] = t->slots[j];
            t->slots[j] = NULL;
            i = j;
        }
    }
    t->count--;
    t->live[e->tag] -= e->size;
    t->live_total -= e->size;
    t->reserved -= e->span;
    return e;
}

void gmux__table_retag(gmux_table *t, gmux_entry *e, int tag) {
    t->live[e->tag] -= e->size;
    t->live_total -= e->size;
    e->tag = tag;
    add_bytes(t, tag, e->size);
}

void gmux__table_boundary(gmux_table *t) {
    memcpy(t->at_boundary, t->live, sizeof t->live);
    t->at_boundary_total = t->live_total;
}

static int by_addr(const void *a, const void *b) {
    uintptr_t x = (*(gmux_entry *const *)a)->addr, y = (*(gmux_entry *const *)b)->addr;
    return x < y ? -1 : x > y;
}

int gmux__table_sorted(const gmux_table *t, gmux_entry ***out, uint64_t *cap, uint64_t *count) {
    int rc = gmux__grow((void **)out, cap, t->count ? t->count : 1, sizeof **out);
    if (rc) return rc;
    uint64_t n = 0;
    for (uint64_t i = 0; i < t->cap; i++)
        if (t->slots[i]) (*out)[n++] = t->slots[i];
    qsort(*out, n, sizeof **out, by_addr);
    *count = n;
    return GMUX_OK;
}

/* A job's allocator: allocations through a backend, recorded in the table; plus the framework entry
 * points (torch's CUDAPluggableAllocator, CuPy's CFunctionAllocator) that reach an installed allocator. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64

static gmux_allocator *installed[MAX_DEVICES];

static int enter(gmux_backend *b) { return b->thread_enter ? b->thread_enter(b) : GMUX_OK; }
static void leave(gmux_backend *b) {
    if (b->thread_leave) b->thread_leave(b);
}

static int make(gmux_backend *b, gmux_allocator **out) {
    gmux_allocator *a = calloc(1, sizeof *a);
    if (!a) {
        b->destroy(b);
        return gmux__fail(GMUX_E_NOMEM, "allocator");
    }
    int rc = gmux__table_init(&a->table);
    if (rc) {
        free(a);
        b->destroy(b);
        return rc;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->backend = b;
    a->default_tag = GMUX_TAG_OTHER;
    *out = a;
    return GMUX_OK;
}

int gmux_allocator_host(gmux_pool *pool, gmux_allocator **out) {
    if (!out) return gmux__fail(GMUX_E_INVALID, "gmux_allocator_host: out is NULL");
    *out = NULL;
    gmux_backend *b;
    int rc = gmux__backend_host(pool, &b);
    return rc ? rc : make(b, out);
}

int gmux_allocator_cuda(int device, gmux_allocator **out) {
    if (!out) return gmux__fail(GMUX_E_INVALID, "gmux_allocator_cuda: out is NULL");
    *out = NULL;
    gmux_backend *b;
    int rc = gmux__backend_cuda(device, &b);
    return rc ? rc : make(b, out);
}

const char *gmux_allocator_backend(const gmux_allocator *a) { return a ? a->backend->name : "none"; }
uint64_t gmux_allocator_granularity(const gmux_allocator *a) { return a ? a->backend->granularity : 0; }

/* Unmaps what is still mapped, frees the address range and the bookkeeping. Called without the lock. */
void gmux__entry_destroy(gmux_allocator *a, gmux_entry *e) {
    gmux_backend *b = a->backend;
    if (enter(b) == GMUX_OK) {
        /* As cudaFree does: kernels queued on any stream may still use the memory (torch hands a cached segment
         * back without a sync), and unmapping it under them faults the whole context. */
        if (b->sync_device(b) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
        for (uint64_t u = 0; u < e->nunits; u++)
            if (!e->down[u] && b->unmap_unit(b, e, u) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
        if (b->unreserve(b, e->addr, e->span) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
        leave(b);
    }
    b->phys_free(b, e);
    free(e->down);
    free(e);
}

/* Counts `span` against the job's limit before any backend work, or refuses it. The add comes first and is
 * undone on refusal: two threads allocating at once both see the other's claim. */
static int claim(gmux_allocator *a, uint64_t size, uint64_t span) {
    uint64_t now = __atomic_add_fetch(&a->committed, span, __ATOMIC_ACQ_REL);
    uint64_t limit = __atomic_load_n(&a->limit, __ATOMIC_ACQUIRE);
    if (limit && now > limit) {
        __atomic_sub_fetch(&a->committed, span, __ATOMIC_ACQ_REL);
        __atomic_fetch_add(&a->refused, 1, __ATOMIC_RELAXED);
        return gmux__fail(GMUX_E_NOMEM, "over the job's memory limit of %llu bytes: %llu asked (%llu mapped) with %llu in use",
                          (unsigned long long)limit, (unsigned long long)size, (unsigned long long)span,
                          (unsigned long long)(now - span));
    }
    return GMUX_OK;
}

static void unclaim(gmux_allocator *a, uint64_t span) { __atomic_sub_fetch(&a->committed, span, __ATOMIC_ACQ_REL); }

int gmux_set_limit(gmux_allocator *a, uint64_t bytes) {
    if (!a) return gmux__fail(GMUX_E_INVALID, "gmux_set_limit: allocator is NULL");
    __atomic_store_n(&a->limit, bytes, __ATOMIC_RELEASE);
    return GMUX_OK;
}

int gmux_malloc(gmux_allocator *a, uint64_t size, void *stream, void **out) {
    if (!a || !out) return gmux__fail(GMUX_E_INVALID, "gmux_malloc: NULL allocator or out");
    *out = NULL;
    if (size == 0 || size > (1ull << 50)) return gmux__fail(GMUX_E_INVALID, "gmux_malloc: size %llu out of range", (unsigned long long)size);
    if (__atomic_load_n(&a->suspended, __ATOMIC_ACQUIRE))
        return gmux__fail(GMUX_E_STATE, "allocation of %llu bytes while the job is suspended", (unsigned long long)size);
    gmux_backend *b = a->backend;
    const uint64_t span = (size + b->granularity - 1) / b->granularity * b->granularity;
    int rc = claim(a, size, span);
    if (rc) return rc;
    gmux_entry *e = calloc(1, sizeof *e);
    if (!e) {
        unclaim(a, span);
        return gmux__fail(GMUX_E_NOMEM, "allocation entry");
    }
    e->size = size;
    e->span = span;
    e->stream = stream;
    e->nunits = gmux__nunits(e->span, b->unit_bytes);
    e->down = calloc(e->nunits, 1);
    rc = e->down ? b->phys_init(b, e) : gmux__fail(GMUX_E_NOMEM, "allocation entry");
    if (rc) {
        free(e->down);
        free(e);
        unclaim(a, span);
        return rc;
    }
    if ((rc = enter(b))) goto undo_phys;
    if ((rc = b->reserve(b, e->span, &e->addr))) goto undo_enter;
    uint64_t u = 0;
    for (; u < e->nunits; u++)
        if ((rc = b->map_unit(b, e, u))) break;
    if (rc) {
        while (u-- > 0) b->unmap_unit(b, e, u);
        b->unreserve(b, e->addr, e->span);
        goto undo_enter;
    }
    leave(b);
    pthread_mutex_lock(&a->lock);
    e->tag = a->default_tag;
    rc = a->suspended ? gmux__fail(GMUX_E_STATE, "allocation while the job is being suspended") : gmux__table_insert(&a->table, e);
    if (!rc) a->table.mapped += e->span;
    pthread_mutex_unlock(&a->lock);
    if (rc) {
        gmux__entry_destroy(a, e);
        unclaim(a, span);
        return rc;
    }
    *out = (void *)e->addr;
    return GMUX_OK;
undo_enter:
    leave(b);
undo_phys:
    b->phys_free(b, e);
    free(e->down);
    free(e);
    unclaim(a, span);
    return rc;
}

int gmux_mfree(gmux_allocator *a, void *ptr, uint64_t size) {
    if (!a) return gmux__fail(GMUX_E_INVALID, "gmux_mfree: allocator is NULL");
    pthread_mutex_lock(&a->lock);
    gmux_entry *e = gmux__table_find(&a->table, (uintptr_t)ptr);
    if (!e) {
        pthread_mutex_unlock(&a->lock);
        return gmux__fail(GMUX_E_UNKNOWN_PTR, "free of %p: not an allocation of this allocator (or already freed)", ptr);
    }
    if (size && size != e->size) {
        uint64_t have = e->size;
        pthread_mutex_unlock(&a->lock);
        return gmux__fail(GMUX_E_INVALID, "free of %p with size %llu; it was allocated with %llu", ptr,
                          (unsigned long long)size, (unsigned long long)have);
    }
    gmux__table_remove(&a->table, e->addr);
    for (uint64_t u = 0; u < e->nunits; u++)
        if (!e->down[u]) a->table.mapped -= gmux__unit_len(e, a->backend->unit_bytes, u);
    pthread_mutex_unlock(&a->lock);
    unclaim(a, e->span);
    gmux__entry_destroy(a, e);
    return GMUX_OK;
}

int gmux_set_tag(gmux_allocator *a, void *ptr, int tag) {
    if (!a || tag < 0 || tag >= GMUX_NTAGS) return gmux__fail(GMUX_E_INVALID, "gmux_set_tag: NULL allocator or tag %d out of range", tag);
    pthread_mutex_lock(&a->lock);
    gmux_entry *e = gmux__table_find(&a->table, (uintptr_t)ptr);
    if (e) gmux__table_retag(&a->table, e, tag);
    pthread_mutex_unlock(&a->lock);
    return e ? GMUX_OK : gmux__fail(GMUX_E_UNKNOWN_PTR, "set_tag of %p: not an allocation of this allocator", ptr);
}

int gmux_set_default_tag(gmux_allocator *a, int tag) {
    if (!a || tag < 0 || tag >= GMUX_NTAGS) return gmux__fail(GMUX_E_INVALID, "gmux_set_default_tag: NULL allocator or tag %d out of range", tag);
    pthread_mutex_lock(&a->lock);
    a->default_tag = tag;
    pthread_mutex_unlock(&a->lock);
    return GMUX_OK;
}

int gmux_boundary(gmux_allocator *a) {
    if (!a) return gmux__fail(GMUX_E_INVALID, "gmux_boundary: allocator is NULL");
    pthread_mutex_lock(&a->lock);
    gmux__table_boundary(&a->table);
    pthread_mutex_unlock(&a->lock);
    return GMUX_OK;
}

int gmux_stats_get(gmux_allocator *a, gmux_stats *out) {
    if (!a || !out) return gmux__fail(GMUX_E_INVALID, "gmux_stats_get: NULL argument");
    pthread_mutex_lock(&a->lock);
    const gmux_table *t = &a->table;
    memcpy(out->live, t->live, sizeof t->live);
    memcpy(out->peak, t->peak, sizeof t->peak);
    memcpy(out->at_boundary, t->at_boundary, sizeof t->at_boundary);
    out->live_total = t->live_total;
    out->peak_total = t->peak_total;
    out->at_boundary_total = t->at_boundary_total;
    out->mapped_bytes = t->mapped;
    out->reserved_bytes = t->reserved;
    out->allocations = t->count;
    out->suspended = a->suspended;
    out->errors = __atomic_load_n(&a->errors, __ATOMIC_RELAXED);
    out->limit = __atomic_load_n(&a->limit, __ATOMIC_ACQUIRE);
    out->committed = __atomic_load_n(&a->committed, __ATOMIC_ACQUIRE);
    out->refused = __atomic_load_n(&a->refused, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&a->lock);
    return GMUX_OK;
}

static void info_of(const gmux_entry *e, gmux_alloc_info *out) {
    out->address = e->addr;
    out->size = e->size;
    out->stream = (uint64_t)(uintptr_t)e->stream;
    out->tag = e->tag;
}

int gmux_lookup(gmux_allocator *a, uint64_t address, gmux_alloc_info *out) {
    if (!a || !out) return gmux__fail(GMUX_E_INVALID, "gmux_lookup: NULL argument");
    pthread_mutex_lock(&a->lock);
    const gmux_entry *hit = gmux__table_find(&a->table, (uintptr_t)address);
    for (uint64_t i = 0; !hit && i < a->table.cap; i++) { /* interior pointers: rare, so a scan is fine */
        const gmux_entry *e = a->table.slots[i];
        if (e && address >= e->addr && address < e->addr + e->size) hit = e;
    }
    if (hit) info_of(hit, out);
    pthread_mutex_unlock(&a->lock);
    return hit ? GMUX_OK : gmux__fail(GMUX_E_UNKNOWN_PTR, "no allocation contains 0x%llx", (unsigned long long)address);
}

int gmux_list(gmux_allocator *a, gmux_alloc_info *out, uint64_t capacity, uint64_t *count) {
    if (!a || !count || (capacity && !out)) return gmux__fail(GMUX_E_INVALID, "gmux_list: NULL argument");
    pthread_mutex_lock(&a->lock);
    uint64_t n = 0;
    int rc = gmux__table_sorted(&a->table, &a->order, &a->order_cap, &n);
    if (!rc)
        for (uint64_t i = 0; i < n && i < capacity; i++) info_of(a->order[i], &out[i]);
    pthread_mutex_unlock(&a->lock);
    *count = n;
    return rc;
}

int gmux_is_suspended(gmux_allocator *a) { return a ? (int)__atomic_load_n(&a->suspended, __ATOMIC_ACQUIRE) : 0; }

int gmux_allocator_destroy(gmux_allocator *a) {
    if (!a) return GMUX_OK;
    for (int d = 0; d < MAX_DEVICES; d++)
        __atomic_compare_exchange_n(&installed[d], &(gmux_allocator *){a}, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&a->lock);
    for (uint64_t i = 0; i < a->table.cap; i++) {
        gmux_entry *e = a->table.slots[i];
        if (e) gmux__entry_destroy(a, e);
    }
    gmux__table_free(&a->table);
    pthread_mutex_unlock(&a->lock);
    a->backend->destroy(a->backend);
    pthread_mutex_destroy(&a->lock);
    free(a->saved);
    free(a->order);
    free(a->ranges);
    free(a->work);
    free(a);
    return GMUX_OK;
}

int gmux_install(gmux_allocator *a, int device) {
    if (device < 0 || device >= MAX_DEVICES) return gmux__fail(GMUX_E_INVALID, "device %d out of range [0, %d)", device, MAX_DEVICES);
    __atomic_store_n(&installed[device], a, __ATOMIC_RELEASE);
    return GMUX_OK;
}

void *gmux_alloc(size_t size, int device, void *stream) {
    gmux_allocator *a = (device >= 0 && device < MAX_DEVICES) ? __atomic_load_n(&installed[device], __ATOMIC_ACQUIRE) : NULL;
    if (!a) {
        gmux__fail(GMUX_E_STATE, "gmux_alloc: no allocator installed for device %d", device);
        return NULL;
    }
    void *p = NULL;
    if (gmux_malloc(a, size, stream, &p) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
    return p;
}

void gmux_free(void *ptr, size_t size, int device, void *stream) {
    (void)stream;
    gmux_allocator *a = (device >= 0 && device < MAX_DEVICES) ? __atomic_load_n(&installed[device], __ATOMIC_ACQUIRE) : NULL;
    if (!a) {
        gmux__fail(GMUX_E_STATE, "gmux_free: no allocator installed for device %d", device);
        return;
    }
    if (gmux_mfree(a, ptr, size) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
}

void *gmux_cupy_malloc(void *param, size_t size, int device) {
    (void)device; /* the allocator was made for one device; CuPy passes the current one */
    gmux_allocator *a = param;
    void *p = NULL;
    if (!a) return NULL;
    if (gmux_malloc(a, size, NULL, &p) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
    return p;
}

void gmux_cupy_free(void *param, void *ptr, int device) {
    (void)device;
    gmux_allocator *a = param;
    if (a && gmux_mfree(a, ptr, 0) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
}

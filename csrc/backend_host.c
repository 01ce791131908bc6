/* Host backend: the allocator tier of a virtual GPU, with CUDA VMM's semantics on mmap.
 *   reserve   = mmap PROT_NONE (address space only; touching it faults)
 *   map       = take chunks from the pool, mmap them MAP_FIXED|MAP_SHARED over the reservation
 *   unmap     = mmap PROT_NONE anonymous MAP_FIXED over them (the reservation stays), chunks back to the pool
 * The host store holding suspended bytes is a memfd that is mapped only while copying: kept mapped, it
 * would stay in the job's RSS and the job would give nothing back while suspended. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    gmux_backend base;
    gmux_pool *pool;
    int fd;
    uint64_t chunk, data_off;
    int store_fd;
    uint64_t store_cap;
    unsigned char *store_map;
    uint64_t store_map_len, store_trimmed;
    uint64_t fences;
} host_backend;

#define HB(b) ((host_backend *)(b))

static int h_reserve(gmux_backend *b, uint64_t span, uintptr_t *addr) {
    (void)b;
    void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return gmux__fail(GMUX_E_NOMEM, "reserving %llu bytes of address space: %s", (unsigned long long)span, strerror(errno));
    *addr = (uintptr_t)p;
    return GMUX_OK;
}

static int h_unreserve(gmux_backend *b, uintptr_t addr, uint64_t span) {
    (void)b;
    if (munmap((void *)addr, span) != 0) return gmux__fail(GMUX_E_BACKEND, "munmap of a reservation: %s", strerror(errno));
    return GMUX_OK;
}

static int h_phys_init(gmux_backend *b, gmux_entry *e) {
    e->phys = calloc(e->span / HB(b)->chunk, sizeof(uint32_t));
    return e->phys ? GMUX_OK : gmux__fail(GMUX_E_NOMEM, "chunk list for an allocation");
}

static void h_phys_free(gmux_backend *b, gmux_entry *e) {
    (void)b;
    free(e->phys);
    e->phys = NULL;
}

static void unit_granules(gmux_backend *b, gmux_entry *e, uint64_t unit, uint64_t *g0, uint64_t *n) {
    uint64_t per = b->unit_bytes / HB(b)->chunk, total = e->span / HB(b)->chunk;
    *g0 = unit * per;
    *n = (*g0 + per <= total) ? per : total - *g0;
}

static int protect_none(uintptr_t addr, uint64_t len) {
    void *p = mmap((void *)addr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? gmux__fail(GMUX_E_BACKEND, "returning a range to PROT_NONE: %s", strerror(errno)) : GMUX_OK;
}

static int h_map_unit(gmux_backend *b, gmux_entry *e, uint64_t unit) {
    host_backend *h = HB(b);
    uint64_t g0, n;
    unit_granules(b, e, unit, &g0, &n);
    uint32_t *chunks = (uint32_t *)e->phys + g0;
    int rc = gmux__pool_take(h->pool, n, chunks);
    if (rc) return rc;
    for (uint64_t k = 0; k < n;) { /* one mmap per run of consecutive file chunks */
        uint64_t r = 1;
        while (k + r < n && chunks[k + r] == chunks[k] + r) r++;
        uintptr_t at = e->addr + (g0 + k) * h->chunk;
        void *p = mmap((void *)at, r * h->chunk, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, h->fd,
                       (off_t)(h->data_off + (uint64_t)chunks[k] * h->chunk));
        if (p == MAP_FAILED) {
            rc = gmux__fail(GMUX_E_BACKEND, "mapping pool chunks: %s", strerror(errno));
            protect_none(e->addr + g0 * h->chunk, n * h->chunk);
            gmux__pool_give(h->pool, n, chunks);
            return rc;
        }
        k += r;
    }
    return GMUX_OK;
}

static int h_unmap_unit(gmux_backend *b, gmux_entry *e, uint64_t unit) {
    host_backend *h = HB(b);
    uint64_t g0, n;
    unit_granules(b, e, unit, &g0, &n);
    int rc = protect_none(e->addr + g0 * h->chunk, n * h->chunk);
    if (rc) return rc; /* the chunks stay mapped here, so they must not go back to the pool */
    gmux__pool_give(h->pool, n, (uint32_t *)e->phys + g0);
    return GMUX_OK;
}

static int h_sync(gmux_backend *b) { (void)b; return GMUX_OK; }

static int h_store_release(gmux_backend *b);

static int h_store_ensure(gmux_backend *b, uint64_t bytes, unsigned char **host) {
    host_backend *h = HB(b);
    *host = NULL;
    if (bytes == 0) return GMUX_OK;
    long page = sysconf(_SC_PAGESIZE);
    bytes = (bytes + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
    if (h->store_fd < 0) {
        h->store_fd = memfd_create("gmux-store", MFD_CLOEXEC);
        if (h->store_fd < 0) return gmux__fail(GMUX_E_BACKEND, "memfd for the host store: %s", strerror(errno));
    }
    if (bytes > h->store_cap) { /* grows only: later cycles reuse the pages faulted in here */
        uint64_t ncap = bytes > h->store_cap + h->store_cap / 4 ? bytes : h->store_cap + h->store_cap / 4;
        ncap = (ncap + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
        if (ftruncate(h->store_fd, (off_t)ncap) != 0 ||
            fallocate(h->store_fd, 0, (off_t)h->store_cap, (off_t)(ncap - h->store_cap)) != 0)
            return gmux__fail(GMUX_E_NOMEM, "growing the host store to %llu bytes: %s", (unsigned long long)ncap, strerror(errno));
        h->store_cap = ncap;
    }
    if (h->store_map && h->store_map_len >= bytes && h->store_trimmed == 0) {
        *host = h->store_map;
        return GMUX_OK;
    }
    if (h->store_map) h_store_release(b);
    h->store_map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, h->store_fd, 0);
    if (h->store_map == MAP_FAILED) {
        h->store_map = NULL;
        return gmux__fail(GMUX_E_BACKEND, "mapping the host store: %s", strerror(errno));
    }
    h->store_map_len = bytes;
    *host = h->store_map;
    return GMUX_OK;
}

static int h_store_release(gmux_backend *b) {
    host_backend *h = HB(b);
    if (h->store_map && h->store_map_len > h->store_trimmed &&
        munmap(h->store_map + h->store_trimmed, h->store_map_len - h->store_trimmed) != 0)
        return gmux__fail(GMUX_E_BACKEND, "unmapping the host store: %s", strerror(errno));
    h->store_map = NULL;
    h->store_map_len = h->store_trimmed = 0;
    return GMUX_OK;
}

/* Runs on the release thread during suspend: the store's written prefix leaves the RSS while the copier
 * fills the rest, instead of one long munmap after the last copy. */
static void h_store_trim(gmux_backend *b, uint64_t upto) {
    host_backend *h = HB(b);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    upto = upto / page * page;
    if (upto > h->store_map_len) upto = h->store_map_len;
    if (!h->store_map || upto < h->store_trimmed + 16 * GMUX_MiB) return; /* batch: fewer, larger munmaps */
    if (munmap(h->store_map + h->store_trimmed, upto - h->store_trimmed) == 0) h->store_trimmed = upto;
}

static int h_copy_out(gmux_backend *b, void *host, uintptr_t dev, uint64_t n) {
    (void)b;
    memcpy(host, (const void *)dev, n);
    return GMUX_OK;
}

static int h_copy_in(gmux_backend *b, uintptr_t dev, const void *host, uint64_t n) {
    (void)b;
    memcpy((void *)dev, host, n);
    return GMUX_OK;
}

/* memcpy is synchronous: every copy issued has completed, so a fence is just a number. */
static int h_fence(gmux_backend *b, uint64_t *token) {
    *token = ++HB(b)->fences;
    return GMUX_OK;
}

static void h_fence_reset(gmux_backend *b) { HB(b)->fences = 0; }

static int h_wait(gmux_backend *b, uint64_t token) { (void)b; (void)token; return GMUX_OK; }

static void h_destroy(gmux_backend *b) {
    host_backend *h = HB(b);
    h_store_release(b);
    if (h->store_fd >= 0) close(h->store_fd);
    free(h);
}

int gmux__backend_host(gmux_pool *pool, gmux_backend **out) {
    if (!pool) return gmux__fail(GMUX_E_INVALID, "the host backend needs a pool");
    host_backend *h = calloc(1, sizeof *h);
    if (!h) return gmux__fail(GMUX_E_NOMEM, "host backend");
    h->pool = pool;
    h->fd = gmux__pool_fd_raw(pool);
    h->chunk = gmux__pool_chunk_bytes(pool);
    h->data_off = gmux__pool_data_offset(pool);
    h->store_fd = -1;
    gmux_backend *b = &h->base;
    b->name = "host";
    b->granularity = h->chunk;
    b->unit_bytes = (64 * GMUX_MiB + h->chunk - 1) / h->chunk * h->chunk;
    b->reserve = h_reserve;
    b->unreserve = h_unreserve;
    b->phys_init = h_phys_init;
    b->phys_free = h_phys_free;
    b->map_unit = h_map_unit;
    b->unmap_unit = h_unmap_unit;
    b->sync_device = h_sync;
    b->store_ensure = h_store_ensure;
    b->store_release = h_store_release;
    b->store_trim = h_store_trim;
    b->copy_out = h_copy_out;
    b->copy_in = h_copy_in;
    b->fence_reset = h_fence_reset;
    b->fence = h_fence;
    b->wait = h_wait;
    b->destroy = h_destroy;
    *out = b;
    return GMUX_OK;
}

/* Internals shared by the native core's sources: error helper, the backend interface, the allocation
 * table and the allocator object. Nothing here is part of the public interface. */
#ifndef GMUX_INTERNAL_H
#define GMUX_INTERNAL_H

#include "gmux.h"

#include <pthread.h>
#include <stdbool.h>

#if defined(__GNUC__)
#define GMUX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define GMUX_PRINTF(a, b)
#endif

/* Records `fmt` as this thread's last error and returns `status`, so failures read `return gmux__fail(...)`. */
int gmux__fail(int status, const char *fmt, ...) GMUX_PRINTF(2, 3);
double gmux__now(void);

#define GMUX_MiB (1024ull * 1024ull)

/* One allocation. `phys` is owned by the backend (host: chunk indices per granule; CUDA: a handle per unit). */
typedef struct gmux_entry {
    uintptr_t addr;
    uint64_t size; /* requested */
    uint64_t span; /* reserved and mapped, a multiple of the granularity */
    void *stream;
    int tag;
    uint64_t nunits;
    uint8_t *down; /* per unit: physical memory released by suspend, not yet mapped again */
    uint64_t ndown;
    void *phys;
} gmux_entry;

static inline uint64_t gmux__nunits(uint64_t span, uint64_t unit) { return (span + unit - 1) / unit; }

/* Bytes in release unit u of e (the last one may be short). */
static inline uint64_t gmux__unit_len(const gmux_entry *e, uint64_t unit_bytes, uint64_t u) {
    uint64_t off = u * unit_bytes;
    return e->span - off < unit_bytes ? e->span - off : unit_bytes;
}

/* A backend has the semantics of CUDA's virtual memory API: address space is reserved apart from the
 * physical memory mapped into it, and physical memory is released and mapped again at the same address.
 * Release and map work per *unit* (a multiple of the granularity) so the copy engine can overlap them
 * with copies of other units. Copies may be asynchronous; fence/wait order them against release. */
typedef struct gmux_backend gmux_backend;
struct gmux_backend {
    const char *name;
    uint64_t granularity;
    uint64_t unit_bytes;
    int (*reserve)(gmux_backend *b, uint64_t span, uintptr_t *addr);
    int (*unreserve)(gmux_backend *b, uintptr_t addr, uint64_t span);
    int (*phys_init)(gmux_backend *b, gmux_entry *e); /* allocate e->phys bookkeeping */
    void (*phys_free)(gmux_backend *b, gmux_entry *e);
    int (*map_unit)(gmux_backend *b, gmux_entry *e, uint64_t unit);   /* take physical memory, map it */
    int (*unmap_unit)(gmux_backend *b, gmux_entry *e, uint64_t unit); /* unmap, give it back; keep the VA */
    int (*thread_enter)(gmux_backend *b); /* before backend calls from a thread (CUDA: make the context current) */
    void (*thread_leave)(gmux_backend *b);
    int (*sync_device)(gmux_backend *b);
    int (*store_ensure)(gmux_backend *b, uint64_t bytes, unsigned char **host); /* reused host buffer */
    int (*store_release)(gmux_backend *b); /* host backend: unmap the store so it leaves the job's RSS */
    /* Optional (host): unmap the store's first `upto` bytes, already written, while later copies go on. */
    void (*store_trim)(gmux_backend *b, uint64_t upto);
    int (*copy_out)(gmux_backend *b, void *host, uintptr_t dev, uint64_t n);
    int (*copy_in)(gmux_backend *b, uintptr_t dev, const void *host, uint64_t n);
    void (*fence_reset)(gmux_backend *b); /* start of a copy phase: fence tokens may be reused */
    int (*fence)(gmux_backend *b, uint64_t *token); /* a point after every copy issued so far */
    int (*wait)(gmux_backend *b, uint64_t token);
    void (*destroy)(gmux_backend *b);
};

int gmux__backend_host(gmux_pool *pool, gmux_backend **out);
int gmux__backend_cuda(int device, gmux_backend **out);

/* Pool internals used by the host backend. */
uint64_t gmux__pool_chunk_bytes(const gmux_pool *p);
int gmux__pool_fd_raw(const gmux_pool *p);
uint64_t gmux__pool_data_offset(const gmux_pool *p);
int gmux__pool_take(gmux_pool *p, uint64_t n, uint32_t *chunks);
void gmux__pool_give(gmux_pool *p, uint64_t n, const uint32_t *chunks);

/* Allocation table: an open-addressing hash map from base address to entry, plus per-tag statistics.
 * Not locked by itself: the allocator's mutex guards it. */
typedef struct {
    gmux_entry **slots;
    uint64_t cap, count;
    uint64_t live[GMUX_NTAGS], peak[GMUX_NTAGS], at_boundary[GMUX_NTAGS];
    uint64_t live_total, peak_total, at_boundary_total, mapped, reserved;
} gmux_table;

int gmux__table_init(gmux_table *t);
void gmux__table_free(gmux_table *t);
int gmux__table_insert(gmux_table *t, gmux_entry *e);
gmux_entry *gmux__table_find(const gmux_table *t, uintptr_t addr);
gmux_entry *gmux__table_remove(gmux_table *t, uintptr_t addr);
void gmux__table_retag(gmux_table *t, gmux_entry *e, int tag);
void gmux__table_boundary(gmux_table *t);
/* Entries sorted by address into *out (grown as needed, reused); returns the count. */
int gmux__table_sorted(const gmux_table *t, gmux_entry ***out, uint64_t *cap, uint64_t *count);

/* What suspend saved: a live range of one allocation and where its bytes sit in the host store. */
typedef struct {
    uintptr_t addr; /* absolute */
    uintptr_t base; /* the allocation's base, to find it again at resume */
    uint64_t len, store_off;
} gmux_saved;

struct gmux_allocator {
    pthread_mutex_t lock;
    gmux_backend *backend;
    gmux_table table;
    int default_tag;
    bool suspended;
    uint64_t errors;
    /* The job's memory limit (0: none) and what counts against it: the span of every allocation, in flight
     * or made, whether mapped now or released by a suspend (a resume maps it all again). Atomics, so the
     * check and the claim are one step and two threads can never both slip past the limit. */
    uint64_t limit;
    uint64_t committed;
    uint64_t refused;
    /* reused across suspend/resume cycles so that the hot path allocates nothing after the first */
    gmux_saved *saved;
    uint64_t nsaved, saved_cap;
    gmux_entry **order;
    uint64_t order_cap;
    gmux_range *ranges;
    uint64_t ranges_cap;
    struct gmux_work *work;
    uint64_t work_cap;
};

/* One unit of one allocation, in the order the copy engine walks them. */
typedef struct gmux_work {
    gmux_entry *e;
    uint64_t unit, token;
    uint64_t store_end; /* suspend: store bytes [0, store_end) are written once this unit's copies are */
} gmux_work;

/* Allocation bookkeeping shared by allocator.c and suspend.c. */
void gmux__entry_destroy(gmux_allocator *a, gmux_entry *e);

int gmux__grow(void **buf, uint64_t *cap, uint64_t need, size_t elem);

#endif

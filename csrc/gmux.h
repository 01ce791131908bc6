/* gmux native core: allocation tracker, allocator-tier suspend/resume, copy engine.
 *
 * A flat C interface so that cffi (gmux._native), torch's CUDAPluggableAllocator (dlsym of gmux_alloc /
 * gmux_free) and CuPy's CFunctionAllocator (gmux_cupy_malloc / gmux_cupy_free) can all load it.
 * Every call that can fail returns a gmux_status; gmux_last_error() gives this thread's detailed message. */
#ifndef GMUX_H
#define GMUX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GMUX_OK = 0,
    GMUX_E_INVALID = -1,     /* bad argument */
    GMUX_E_NOMEM = -2,       /* pool, device or host memory exhausted */
    GMUX_E_UNKNOWN_PTR = -3, /* not an allocation of this allocator (unknown pointer, double free) */
    GMUX_E_STATE = -4,       /* not allowed now (resume without suspend, allocate while suspended, ...) */
    GMUX_E_BACKEND = -5,     /* an OS or CUDA driver call failed */
    GMUX_E_UNAVAILABLE = -6, /* backend not usable here (no libcuda, no device) */
    GMUX_E_CORRUPT = -7      /* a pool file that is not a gmux pool, or is truncated */
} gmux_status;

/* Who owns the bytes; set by the runtime, used for the profiling report. */
enum { GMUX_TAG_WEIGHTS = 0, GMUX_TAG_OPTIMIZER = 1, GMUX_TAG_ACTIVATIONS = 2, GMUX_TAG_OTHER = 3, GMUX_NTAGS = 4 };

const char *gmux_strerror(int status);
const char *gmux_last_error(void);

/* ---- virtual-GPU page pool (host backend) ---------------------------------------------------------
 * A shared-memory file of fixed-size chunks, faulted in once by its creator (gmuxd); jobs open it by
 * path or inherited fd and map chunks into their reserved ranges. Chunk ownership (a pid per chunk)
 * lives in the file under a process-shared robust mutex, so several processes can share one pool. */
typedef struct gmux_pool gmux_pool;
typedef struct {
    uint64_t chunk_bytes, nchunks, free_chunks;
} gmux_pool_info;

int gmux_pool_create(const char *path, uint64_t bytes, uint64_t chunk_bytes, gmux_pool **out); /* path NULL: memfd */
int gmux_pool_open(const char *path, gmux_pool **out);
int gmux_pool_open_fd(int fd, gmux_pool **out); /* the fd is duplicated */
int gmux_pool_fd(const gmux_pool *pool);
int gmux_pool_info_get(gmux_pool *pool, gmux_pool_info *out);
int gmux_pool_reclaim(gmux_pool *pool, uint64_t *reclaimed_chunks); /* chunks held by dead processes */
void gmux_pool_close(gmux_pool *pool);

/* ---- a job's allocator ------------------------------------------------------------------------------ */
typedef struct gmux_allocator gmux_allocator;

typedef struct {
    uint64_t live[GMUX_NTAGS], peak[GMUX_NTAGS], at_boundary[GMUX_NTAGS];
    uint64_t live_total, peak_total, at_boundary_total;
    uint64_t mapped_bytes;   /* physical memory currently mapped (granularity-rounded) */
    uint64_t reserved_bytes; /* address space held */
    uint64_t allocations;
    uint64_t suspended;
    uint64_t errors; /* failures inside gmux_alloc/gmux_free, which cannot return a status */
    uint64_t limit;     /* the job's memory limit (0: none) */
    uint64_t committed; /* what counts against it: the span of every allocation (granularity-rounded) */
    uint64_t refused;   /* allocations refused for the limit */
} gmux_stats;

typedef struct {
    uint64_t address, size, stream;
    int tag;
} gmux_alloc_info;

typedef struct {
    uint64_t address, length;
} gmux_range;

typedef struct {
    uint64_t bytes_copied;   /* live bytes moved */
    uint64_t bytes_mapped;   /* physical bytes released (suspend) or mapped (resume) */
    uint64_t allocations, units;
    double sync_s;    /* waiting for the job's device work */
    double stage_s;   /* host store: growing it (first use only); mapping and unmapping it (host backend) */
    double copy_s;    /* copy phase: wall time while copies were the critical path */
    double map_s;     /* map (resume) or unmap+release (suspend) calls, summed, on the helper thread */
    double total_s;
} gmux_swap_stats;

int gmux_allocator_host(gmux_pool *pool, gmux_allocator **out);
int gmux_allocator_cuda(int device, gmux_allocator **out);
int gmux_allocator_destroy(gmux_allocator *a); /* releases every allocation and the host store */
const char *gmux_allocator_backend(const gmux_allocator *a);
uint64_t gmux_allocator_granularity(const gmux_allocator *a);

int gmux_malloc(gmux_allocator *a, uint64_t size, void *stream, void **out);
int gmux_mfree(gmux_allocator *a, void *ptr, uint64_t size); /* size 0: do not check it */
int gmux_set_tag(gmux_allocator *a, void *ptr, int tag);
int gmux_set_default_tag(gmux_allocator *a, int tag);
/* The job's memory limit in bytes (0: none). An allocation that would take the allocations' total span past
 * it fails with GMUX_E_NOMEM and a message saying so; allocations already made are never touched. */
int gmux_set_limit(gmux_allocator *a, uint64_t bytes);
int gmux_boundary(gmux_allocator *a); /* records live bytes at this mini-batch boundary */
int gmux_stats_get(gmux_allocator *a, gmux_stats *out);
int gmux_lookup(gmux_allocator *a, uint64_t address, gmux_alloc_info *out); /* allocation containing address */
int gmux_list(gmux_allocator *a, gmux_alloc_info *out, uint64_t capacity, uint64_t *count);

/* Suspend copies only `live` (NULL: every allocation whole) to the host store, releases all physical
 * memory and keeps every address reserved; touching a suspended range faults. Ranges must lie inside
 * allocations; overlaps are merged. Resume maps memory at the same addresses and restores the bytes. */
int gmux_suspend(gmux_allocator *a, const gmux_range *live, uint64_t nlive, gmux_swap_stats *out);
int gmux_resume(gmux_allocator *a, gmux_swap_stats *out);
int gmux_is_suspended(gmux_allocator *a);
/* While suspended: copies saved bytes [address, address + n) out of the host store (a checkpoint taken
 * while suspended reads them here). Bytes that were not live at suspend are refused. */
int gmux_peek(gmux_allocator *a, uint64_t address, void *dst, uint64_t n);

/* ---- entry points for frameworks: route a device's allocations to an installed allocator ---------- */
int gmux_install(gmux_allocator *a, int device); /* a NULL uninstalls */
void *gmux_alloc(size_t size, int device, void *stream);                 /* torch CUDAPluggableAllocator */
void gmux_free(void *ptr, size_t size, int device, void *stream);
void *gmux_cupy_malloc(void *param, size_t size, int device);            /* cupy CFunctionAllocator; */
void gmux_cupy_free(void *param, void *ptr, int device);                 /* param is a gmux_allocator* */

/* ---- CRC-32 as zlib's crc32() computes it (checkpoint frames), folded with PCLMULQDQ where the CPU has it */
uint32_t gmux_crc32(uint32_t crc, const void *buf, size_t len);
int gmux_crc32_folds(void); /* 1 where the folded path runs, 0 where every byte takes the table */

/* ---- host copies by address, count of them in one call (dst[i] <- src[i], nbytes[i] bytes each) ---------- */
void gmux_copy_ranges(const uint64_t *dst, const uint64_t *src, const uint64_t *nbytes, uint64_t count);

#ifdef __cplusplus
}
#endif
#endif

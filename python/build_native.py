"""cffi build definition: compiles csrc/ into the extension module gmux._native (setup.py runs it).

The same C sources CMake builds into libgmux for the C tests. The CUDA backend is compiled in when cuda.h
is found (CUDA_HOME, /usr/local/cuda); it needs the headers only, since libcuda is opened with dlopen at
first use. The extension exports gmux_alloc/gmux_free, so torch's CUDAPluggableAllocator can dlopen this
very file and share the allocator state Python sees.
"""
import os

from cffi import FFI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
SOURCES = ["error.c", "table.c", "pool.c", "backend_host.c", "backend_cuda.c", "allocator.c", "suspend.c", "crc32.c",
           "copy_ranges.c"]

CDEF = """
typedef enum {
    GMUX_OK = 0, GMUX_E_INVALID = -1, GMUX_E_NOMEM = -2, GMUX_E_UNKNOWN_PTR = -3, GMUX_E_STATE = -4,
    GMUX_E_BACKEND = -5, GMUX_E_UNAVAILABLE = -6, GMUX_E_CORRUPT = -7
} gmux_status;
enum { GMUX_TAG_WEIGHTS = 0, GMUX_TAG_OPTIMIZER = 1, GMUX_TAG_ACTIVATIONS = 2, GMUX_TAG_OTHER = 3, GMUX_NTAGS = 4 };

const char *gmux_strerror(int status);
const char *gmux_last_error(void);

typedef struct gmux_pool gmux_pool;
typedef struct { uint64_t chunk_bytes, nchunks, free_chunks; } gmux_pool_info;
int gmux_pool_create(const char *path, uint64_t bytes, uint64_t chunk_bytes, gmux_pool **out);
int gmux_pool_open(const char *path, gmux_pool **out);
int gmux_pool_open_fd(int fd, gmux_pool **out);
int gmux_pool_fd(const gmux_pool *pool);
int gmux_pool_info_get(gmux_pool *pool, gmux_pool_info *out);
int gmux_pool_reclaim(gmux_pool *pool, uint64_t *reclaimed_chunks);
void gmux_pool_close(gmux_pool *pool);

typedef struct gmux_allocator gmux_allocator;
typedef struct {
    uint64_t live[4], peak[4], at_boundary[4];
    uint64_t live_total, peak_total, at_boundary_total;
    uint64_t mapped_bytes, reserved_bytes, allocations, suspended, errors;
    uint64_t limit, committed, refused;
} gmux_stats;
typedef struct { uint64_t address, size, stream; int tag; } gmux_alloc_info;
typedef struct { uint64_t address, length; } gmux_range;
typedef struct {
    uint64_t bytes_copied, bytes_mapped, allocations, units;
    double sync_s, stage_s, copy_s, map_s, total_s;
} gmux_swap_stats;

int gmux_allocator_host(gmux_pool *pool, gmux_allocator **out);
int gmux_allocator_cuda(int device, gmux_allocator **out);
int gmux_allocator_destroy(gmux_allocator *a);
const char *gmux_allocator_backend(const gmux_allocator *a);
uint64_t gmux_allocator_granularity(const gmux_allocator *a);
int gmux_malloc(gmux_allocator *a, uint64_t size, void *stream, void **out);
int gmux_mfree(gmux_allocator *a, void *ptr, uint64_t size);
int gmux_set_tag(gmux_allocator *a, void *ptr, int tag);
int gmux_set_default_tag(gmux_allocator *a, int tag);
int gmux_set_limit(gmux_allocator *a, uint64_t bytes);
int gmux_boundary(gmux_allocator *a);
int gmux_stats_get(gmux_allocator *a, gmux_stats *out);
int gmux_lookup(gmux_allocator *a, uint64_t address, gmux_alloc_info *out);
int gmux_list(gmux_allocator *a, gmux_alloc_info *out, uint64_t capacity, uint64_t *count);
int gmux_suspend(gmux_allocator *a, const gmux_range *live, uint64_t nlive, gmux_swap_stats *out);
int gmux_resume(gmux_allocator *a, gmux_swap_stats *out);
int gmux_is_suspended(gmux_allocator *a);
int gmux_peek(gmux_allocator *a, uint64_t address, void *dst, uint64_t n);

int gmux_install(gmux_allocator *a, int device);
void *gmux_alloc(size_t size, int device, void *stream);
void gmux_free(void *ptr, size_t size, int device, void *stream);
void *gmux_cupy_malloc(void *param, size_t size, int device);
void gmux_cupy_free(void *param, void *ptr, int device);

uint32_t gmux_crc32(uint32_t crc, const void *buf, size_t len);
int gmux_crc32_folds(void);
void gmux_copy_ranges(const uint64_t *dst, const uint64_t *src, const uint64_t *nbytes, uint64_t count);
"""


def _cuda_include():
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and os.path.exists(os.path.join(base, "include", "cuda.h")):
            return os.path.join(base, "include")
    return None


def _rel(path):
    # setuptools wants sources relative to the directory it builds from (the repository root).
    return os.path.relpath(path, os.getcwd())


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
_cuda = _cuda_include()
ffibuilder.set_source(
    "gmux._native",
    '#include "gmux.h"',
    sources=[_rel(os.path.join(CSRC, s)) for s in SOURCES],
    include_dirs=[_rel(CSRC)] + ([_cuda] if _cuda else []),
    define_macros=[("_GNU_SOURCE", None)] + ([("GMUX_HAVE_CUDA", None)] if _cuda else []),
    extra_compile_args=["-std=c11", "-O2", "-Wall"],
    libraries=["dl", "pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)

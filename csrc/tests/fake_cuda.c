/* A stand-in libcuda.so.1 for machines without a GPU, so the C tests can run the real CUDA backend
 * (backend_cuda.c, loaded through dlopen) end to end. Device memory is host memory here, but the rules the
 * real driver enforces are enforced too, so that mistakes fail here rather than on a GPU:
 *   - every call that needs a context fails with CUDA_ERROR_INVALID_CONTEXT unless one is current on the
 *     calling thread (push/pop discipline, helper threads included);
 *   - mapped memory is inaccessible (PROT_NONE) until cuMemSetAccess;
 *   - cuMemUnmap must cover exactly what one cuMemMap mapped; cuMemRelease refuses a still-mapped handle;
 *     cuMemAddressFree refuses a range that still has mappings;
 *   - async copies need pinned host memory from cuMemHostAlloc.
 * Test infrastructure only: never installed, never loaded outside ctest. */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GRAN (2u << 20)
#define MAXMAP 4096

typedef struct { int fd; size_t size; int mapped; } handle_t;
typedef struct { CUdeviceptr ptr; size_t size; handle_t *h; } mapping_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mapping_t maps[MAXMAP];
static int nmaps;
static int primary_ctx = 1; /* its address is the context */
static _Thread_local CUcontext stack[16];
static _Thread_local int depth;
static void *pinned[1024];
static size_t pinned_size[1024];

#define NEED_CTX() do { if (depth == 0 || !stack[depth - 1]) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "fake driver error"; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&primary_ctx; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent_v2(CUcontext c) { if (depth == 16) return CUDA_ERROR_INVALID_VALUE; stack[depth++] = c; return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { if (!depth) return CUDA_ERROR_INVALID_CONTEXT; *c = stack[--depth]; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { NEED_CTX(); return CUDA_SUCCESS; }

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags f) {
    (void)p; (void)f; *g = GRAN; return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    (void)align; (void)addr; (void)flags;
    NEED_CTX();
    if (size % GRAN) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    NEED_CTX();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nmaps; i++)
        if (maps[i].ptr >= ptr && maps[i].ptr < ptr + size) { pthread_mutex_unlock(&lock); return CUDA_ERROR_INVALID_VALUE; }
    pthread_mutex_unlock(&lock);
    munmap((void *)ptr, size);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long f) {
    (void)f;
    NEED_CTX();
    if (size % GRAN || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    handle_t *x = calloc(1, sizeof *x);
    x->fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    x->size = size;
    if (x->fd < 0 || ftruncate(x->fd, (off_t)size) != 0) { free(x); return CUDA_ERROR_OUT_OF_MEMORY; }
    *h = (CUmemGenericAllocationHandle)(uintptr_t)x;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    NEED_CTX();
    handle_t *x = (handle_t *)(uintptr_t)h;
    if (x->mapped) return CUDA_ERROR_INVALID_VALUE;
    close(x->fd);
    free(x);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long f) {
    (void)f;
    NEED_CTX();
    handle_t *x = (handle_t *)(uintptr_t)h;
    if (offset || size != x->size) return CUDA_ERROR_INVALID_VALUE;
    if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, x->fd, 0) == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (nmaps == MAXMAP) { pthread_mutex_unlock(&lock); return CUDA_ERROR_OUT_OF_MEMORY; }
    maps[nmaps++] = (mapping_t){ptr, size, x};
    x->mapped++;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *d, size_t count) {
    NEED_CTX();
    if (count != 1 || d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
    return mprotect((void *)ptr, size, PROT_READ | PROT_WRITE) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    NEED_CTX();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nmaps; i++)
        if (maps[i].ptr == ptr && maps[i].size == size) {
            maps[i].h->mapped--;
            maps[i] = maps[--nmaps];
            pthread_mutex_unlock(&lock);
            mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE; /* not exactly one whole mapping */
}

CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags) {
    (void)flags;
    NEED_CTX();
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < 1024 && pinned[i]) i++;
    if (i == 1024 || !(pinned[i] = malloc(size))) { pthread_mutex_unlock(&lock); return CUDA_ERROR_OUT_OF_MEMORY; }
    pinned_size[i] = size;
    *p = pinned[i];
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    NEED_CTX();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 1024; i++)
        if (pinned[i] == p) { free(p); pinned[i] = NULL; pthread_mutex_unlock(&lock); return CUDA_SUCCESS; }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

static int is_pinned(const void *p, size_t n) {
    int ok = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 1024 && !ok; i++)
        ok = pinned[i] && (const char *)p >= (char *)pinned[i] && (const char *)p + n <= (char *)pinned[i] + pinned_size[i];
    pthread_mutex_unlock(&lock);
    return ok;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    NEED_CTX();
    if (!s || !is_pinned(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    NEED_CTX();
    if (!s || !is_pinned(src, n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy((void *)dst, src, n);
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) { (void)flags; NEED_CTX(); *s = (CUstream)malloc(1); return CUDA_SUCCESS; }
CUresult cuStreamDestroy_v2(CUstream s) { NEED_CTX(); free(s); return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; NEED_CTX(); return CUDA_SUCCESS; }
CUresult cuEventCreate(CUevent *e, unsigned int flags) { (void)flags; NEED_CTX(); *e = (CUevent)malloc(1); return CUDA_SUCCESS; }
CUresult cuEventDestroy_v2(CUevent e) { NEED_CTX(); free(e); return CUDA_SUCCESS; }
CUresult cuEventRecord(CUevent e, CUstream s) { (void)e; (void)s; NEED_CTX(); return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent e) { (void)e; NEED_CTX(); return CUDA_SUCCESS; }

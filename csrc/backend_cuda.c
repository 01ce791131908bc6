/* CUDA backend on the driver's virtual memory API. cuda.h is used for types and prototypes only: libcuda
 * is opened with dlopen at first use, so the library loads (and its host backend runs) on machines
 * without a GPU or driver, and nothing links against libcuda or libcudart.
 *   reserve = cuMemAddressReserve     map   = cuMemCreate + cuMemMap + cuMemSetAccess
 *   unmap   = cuMemUnmap + cuMemRelease (the reservation stays: pointers survive suspend)
 * Copies are asynchronous on a private stream into a pinned host store that is allocated once and
 * reused; events order each unit's release after its copies. */
#include "internal.h"

#ifndef GMUX_HAVE_CUDA
int gmux__backend_cuda(int device, gmux_backend **out) {
    (void)device;
    *out = NULL;
    return gmux__fail(GMUX_E_UNAVAILABLE, "this build of gmux has no CUDA backend (CUDA headers were not found at build time)");
}
#else

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GMUX_STR(x) #x
#define GMUX_XSTR(x) GMUX_STR(x) /* expands cuda.h's version macros: cuMemcpyDtoHAsync -> "..._v2" */

#define DRIVER_FUNCS(X)                                                                                                \
    X(cuInit) X(cuGetErrorString) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDevicePrimaryCtxRetain)                       \
    X(cuDevicePrimaryCtxRelease) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxSynchronize)                            \
    X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease)         \
    X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyDtoHAsync)                \
    X(cuMemcpyHtoDAsync) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuEventCreate)                  \
    X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)

static struct {
#define X(name) __typeof__(&name) name;
    DRIVER_FUNCS(X)
#undef X
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int drv_status = GMUX_OK;
static char drv_msg[256];

static void load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        drv_status = GMUX_E_UNAVAILABLE;
        snprintf(drv_msg, sizeof drv_msg, "cannot load the CUDA driver (libcuda.so.1): %s", dlerror());
        return;
    }
#define X(name)                                                                                                        \
    if (!(drv.name = (__typeof__(drv.name))dlsym(h, GMUX_XSTR(name)))) {                                               \
        drv_status = GMUX_E_UNAVAILABLE;                                                                               \
        snprintf(drv_msg, sizeof drv_msg, "the CUDA driver lacks %s (too old for virtual memory management?)", GMUX_XSTR(name)); \
        return;                                                                                                        \
    }
    DRIVER_FUNCS(X)
#undef X
    CUresult r = drv.cuInit(0);
    if (r != CUDA_SUCCESS) {
        drv_status = GMUX_E_UNAVAILABLE;
        snprintf(drv_msg, sizeof drv_msg, "cuInit failed with CUDA error %d (no GPU, or driver not loaded)", (int)r);
    }
}

static int cu_fail(CUresult r, const char *what) {
    const char *s = NULL;
    if (drv.cuGetErrorString) drv.cuGetErrorString(r, &s);
    int status = r == CUDA_ERROR_OUT_OF_MEMORY ? GMUX_E_NOMEM : GMUX_E_BACKEND;
    return gmux__fail(status, "%s: CUDA error %d (%s)", what, (int)r, s ? s : "?");
}

#define CU(call, what)                                                                                                 \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS) return cu_fail(r_, what);                                                              \
    } while (0)

typedef struct {
    gmux_backend base;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    unsigned char *store;
    uint64_t store_cap;
    CUevent *events;
    uint64_t nevents, events_cap, next_event;
    pthread_mutex_t events_lock; /* the releaser thread reads `events` while the copier may grow it */
} cuda_backend;

#define CB(b) ((cuda_backend *)(b))

static int c_enter(gmux_backend *b) {
    CU(drv.cuCtxPushCurrent(CB(b)->ctx), "cuCtxPushCurrent");
    return GMUX_OK;
}

static void c_leave(gmux_backend *b) {
    (void)b;
    CUcontext ignored;
    drv.cuCtxPopCurrent(&ignored);
}

static int c_reserve(gmux_backend *b, uint64_t span, uintptr_t *addr) {
    CUdeviceptr p;
    CU(drv.cuMemAddressReserve(&p, span, b->granularity, 0, 0), "cuMemAddressReserve");
    *addr = (uintptr_t)p;
    return GMUX_OK;
}

static int c_unreserve(gmux_backend *b, uintptr_t addr, uint64_t span) {
    (void)b;
    CU(drv.cuMemAddressFree((CUdeviceptr)addr, span), "cuMemAddressFree");
    return GMUX_OK;
}

static int c_phys_init(gmux_backend *b, gmux_entry *e) {
    (void)b;
    e->phys = calloc(e->nunits, sizeof(CUmemGenericAllocationHandle));
    return e->phys ? GMUX_OK : gmux__fail(GMUX_E_NOMEM, "handle list for an allocation");
}

static void c_phys_free(gmux_backend *b, gmux_entry *e) {
    (void)b;
    free(e->phys);
    e->phys = NULL;
}

static int c_map_unit(gmux_backend *b, gmux_entry *e, uint64_t u) {
    cuda_backend *c = CB(b);
    CUdeviceptr at = (CUdeviceptr)(e->addr + u * b->unit_bytes);
    uint64_t len = gmux__unit_len(e, b->unit_bytes, u);
    CUmemGenericAllocationHandle h;
    CU(drv.cuMemCreate(&h, len, &c->prop, 0), "cuMemCreate");
    CUresult r = drv.cuMemMap(at, len, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        drv.cuMemRelease(h);
        return cu_fail(r, "cuMemMap");
    }
    r = drv.cuMemSetAccess(at, len, &c->access, 1);
    if (r != CUDA_SUCCESS) {
        drv.cuMemUnmap(at, len);
        drv.cuMemRelease(h);
        return cu_fail(r, "cuMemSetAccess");
    }
    ((CUmemGenericAllocationHandle *)e->phys)[u] = h;
    return GMUX_OK;
}

static int c_unmap_unit(gmux_backend *b, gmux_entry *e, uint64_t u) {
    CU(drv.cuMemUnmap((CUdeviceptr)(e->addr + u * b->unit_bytes), gmux__unit_len(e, b->unit_bytes, u)), "cuMemUnmap");
    CU(drv.cuMemRelease(((CUmemGenericAllocationHandle *)e->phys)[u]), "cuMemRelease");
    return GMUX_OK;
}

static int c_sync(gmux_backend *b) {
    (void)b;
    CU(drv.cuCtxSynchronize(), "cuCtxSynchronize");
    return GMUX_OK;
}

static int c_store_ensure(gmux_backend *b, uint64_t bytes, unsigned char **host) {
    cuda_backend *c = CB(b);
    if (bytes > c->store_cap) { /* pinning is slow: grow rarely, by a quarter at least, and keep it */
        uint64_t ncap = bytes > c->store_cap + c->store_cap / 4 ? bytes : c->store_cap + c->store_cap / 4;
        ncap = (ncap + 2 * GMUX_MiB - 1) / (2 * GMUX_MiB) * (2 * GMUX_MiB);
        if (c->store) drv.cuMemFreeHost(c->store);
        c->store = NULL;
        c->store_cap = 0;
        void *p;
        CU(drv.cuMemHostAlloc(&p, ncap, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc (pinned host store)");
        c->store = p;
        c->store_cap = ncap;
    }
    *host = c->store;
    return GMUX_OK;
}

static int c_store_release(gmux_backend *b) { (void)b; return GMUX_OK; }

static int c_copy_out(gmux_backend *b, void *host, uintptr_t dev, uint64_t n) {
    CU(drv.cuMemcpyDtoHAsync(host, (CUdeviceptr)dev, n, CB(b)->stream), "cuMemcpyDtoHAsync");
    return GMUX_OK;
}

static int c_copy_in(gmux_backend *b, uintptr_t dev, const void *host, uint64_t n) {
    CU(drv.cuMemcpyHtoDAsync((CUdeviceptr)dev, host, n, CB(b)->stream), "cuMemcpyHtoDAsync");
    return GMUX_OK;
}

static void c_fence_reset(gmux_backend *b) { CB(b)->next_event = 0; }

/* Called by the copier thread only: it alone grows the array, so its own reads need no lock. */
static int c_fence(gmux_backend *b, uint64_t *token) {
    cuda_backend *c = CB(b);
    if (c->next_event == c->nevents) { /* events are created once and reused by later cycles */
        CUevent ev;
        CU(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        pthread_mutex_lock(&c->events_lock);
        int rc = gmux__grow((void **)&c->events, &c->events_cap, c->nevents + 1, sizeof *c->events);
        if (!rc) c->events[c->nevents++] = ev;
        pthread_mutex_unlock(&c->events_lock);
        if (rc) {
            drv.cuEventDestroy(ev);
            return rc;
        }
    }
    CU(drv.cuEventRecord(c->events[c->next_event], c->stream), "cuEventRecord");
    *token = c->next_event++;
    return GMUX_OK;
}

static int c_wait(gmux_backend *b, uint64_t token) {
    cuda_backend *c = CB(b);
    pthread_mutex_lock(&c->events_lock);
    CUevent ev = token < c->nevents ? c->events[token] : NULL;
    pthread_mutex_unlock(&c->events_lock);
    if (!ev) return gmux__fail(GMUX_E_INVALID, "fence %llu was never recorded", (unsigned long long)token);
    CU(drv.cuEventSynchronize(ev), "cuEventSynchronize");
    return GMUX_OK;
}

static void c_destroy(gmux_backend *b) {
    cuda_backend *c = CB(b);
    if (c_enter(b) == GMUX_OK) {
        for (uint64_t i = 0; i < c->nevents; i++) drv.cuEventDestroy(c->events[i]);
        if (c->store) drv.cuMemFreeHost(c->store);
        if (c->stream) drv.cuStreamDestroy(c->stream);
        c_leave(b);
    }
    drv.cuDevicePrimaryCtxRelease(c->dev);
    pthread_mutex_destroy(&c->events_lock);
    free(c->events);
    free(c);
}

int gmux__backend_cuda(int device, gmux_backend **out) {
    *out = NULL;
    pthread_once(&drv_once, load_driver);
    if (drv_status) return gmux__fail(drv_status, "%s", drv_msg);
    int count = 0;
    CU(drv.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (device < 0 || device >= count) return gmux__fail(GMUX_E_INVALID, "CUDA device %d does not exist (%d visible)", device, count);
    cuda_backend *c = calloc(1, sizeof *c);
    if (!c) return gmux__fail(GMUX_E_NOMEM, "CUDA backend");
    CUresult r = drv.cuDeviceGet(&c->dev, device);
    if (r == CUDA_SUCCESS) r = drv.cuDevicePrimaryCtxRetain(&c->ctx, c->dev); /* the context torch uses too */
    if (r != CUDA_SUCCESS) {
        free(c);
        return cu_fail(r, "retaining the device's primary context");
    }
    c->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    c->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    c->prop.location.id = device;
    c->access.location = c->prop.location;
    c->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t gran = 0;
    r = drv.cuMemGetAllocationGranularity(&gran, &c->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r == CUDA_SUCCESS && drv.cuCtxPushCurrent(c->ctx) == CUDA_SUCCESS) {
        r = drv.cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING);
        CUcontext ignored;
        drv.cuCtxPopCurrent(&ignored);
    }
    if (r != CUDA_SUCCESS || gran == 0) {
        drv.cuDevicePrimaryCtxRelease(c->dev);
        free(c);
        return cu_fail(r, "setting up virtual memory management on the device");
    }
    pthread_mutex_init(&c->events_lock, NULL);
    gmux_backend *b = &c->base;
    b->name = "cuda";
    b->granularity = gran;
    b->unit_bytes = (64 * GMUX_MiB + gran - 1) / gran * gran;
    b->reserve = c_reserve;
    b->unreserve = c_unreserve;
    b->phys_init = c_phys_init;
    b->phys_free = c_phys_free;
    b->map_unit = c_map_unit;
    b->unmap_unit = c_unmap_unit;
    b->thread_enter = c_enter;
    b->thread_leave = c_leave;
    b->sync_device = c_sync;
    b->store_ensure = c_store_ensure;
    b->store_release = c_store_release;
    b->copy_out = c_copy_out;
    b->copy_in = c_copy_in;
    b->fence_reset = c_fence_reset;
    b->fence = c_fence;
    b->wait = c_wait;
    b->destroy = c_destroy;
    *out = b;
    return GMUX_OK;
}
#endif

/* The virtual GPU's page pool: a shared-memory file of fixed-size chunks.
 *
 * Its creator (gmuxd, or a test) sizes the file and faults every page in once, so later mappings by jobs
 * only install page-table entries (~56 ms/GiB) instead of allocating fresh pages (~3 s/GiB). Chunk
 * ownership sits in the file's header (a pid per chunk, under a process-shared robust mutex) so any
 * process holding the fd or path can take and return chunks, and chunks of a crashed job can be reclaimed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define POOL_MAGIC 0x6c6f6f70786d6731ull /* "1gmxpool" */
#define POOL_VERSION 1u

typedef struct {
    uint64_t magic;
    uint32_t version, reserved0;
    uint64_t chunk_bytes, nchunks, data_offset, free_chunks;
    pthread_mutex_t lock;
    int32_t owner[]; /* pid holding the chunk, 0 when free */
} pool_header;

struct gmux_pool {
    int fd;
    pool_header *hdr;
    uint64_t hdr_bytes;
};

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int lock_pool(gmux_pool *p) {
    int rc = pthread_mutex_lock(&p->hdr->lock);
    if (rc == EOWNERDEAD) { /* a process died holding it; the owner table is updated atomically enough per chunk */
        pthread_mutex_consistent(&p->hdr->lock);
        return GMUX_OK;
    }
    return rc ? gmux__fail(GMUX_E_BACKEND, "pool lock: %s", strerror(rc)) : GMUX_OK;
}

static int map_header(int fd, uint64_t hdr_bytes, gmux_pool **out) {
    void *h = mmap(NULL, hdr_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) return gmux__fail(GMUX_E_BACKEND, "mapping the pool header: %s", strerror(errno));
    gmux_pool *p = calloc(1, sizeof *p);
    if (!p) {
        munmap(h, hdr_bytes);
        return gmux__fail(GMUX_E_NOMEM, "pool handle");
    }
    p->fd = fd;
    p->hdr = h;
    p->hdr_bytes = hdr_bytes;
    *out = p;
    return GMUX_OK;
}

static int prefault(int fd, uint64_t off, uint64_t len) {
    if (fallocate(fd, 0, (off_t)off, (off_t)len) == 0) return GMUX_OK;
    /* Filesystems without fallocate: touch every page through a temporary mapping instead. */
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
    if (m == MAP_FAILED) return gmux__fail(GMUX_E_NOMEM, "faulting in the pool: %s", strerror(errno));
    long page = sysconf(_SC_PAGESIZE);
    for (uint64_t i = 0; i < len; i += (uint64_t)page) m[i] = 0;
    munmap(m, len);
    return GMUX_OK;
}

int gmux_pool_create(const char *path, uint64_t bytes, uint64_t chunk_bytes, gmux_pool **out) {
    if (!out) return gmux__fail(GMUX_E_INVALID, "gmux_pool_create: out is NULL");
    *out = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (chunk_bytes == 0 || chunk_bytes % (uint64_t)page)
        return gmux__fail(GMUX_E_INVALID, "pool chunk size %llu is not a positive multiple of the page size %ld",
                          (unsigned long long)chunk_bytes, page);
    if (bytes < chunk_bytes || bytes / chunk_bytes > INT32_MAX)
        return gmux__fail(GMUX_E_INVALID, "pool size %llu must hold between 1 and 2^31 chunks of %llu bytes",
                          (unsigned long long)bytes, (unsigned long long)chunk_bytes);
    uint64_t nchunks = bytes / chunk_bytes;
    uint64_t hdr_bytes = round_up(sizeof(pool_header) + nchunks * sizeof(int32_t), (uint64_t)page);
    uint64_t data_offset = round_up(hdr_bytes, chunk_bytes);
    int fd = path ? open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : memfd_create("gmux-pool", MFD_CLOEXEC);
    if (fd < 0) return gmux__fail(GMUX_E_BACKEND, "creating pool %s: %s", path ? path : "(memfd)", strerror(errno));
    int rc = GMUX_OK;
    if (ftruncate(fd, (off_t)(data_offset + nchunks * chunk_bytes)) != 0) {
        rc = gmux__fail(GMUX_E_NOMEM, "sizing pool to %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
        goto fail;
    }
    if ((rc = prefault(fd, data_offset, nchunks * chunk_bytes))) goto fail;
    gmux_pool *p;
    if ((rc = map_header(fd, hdr_bytes, &p))) goto fail;
    pool_header *h = p->hdr;
    h->version = POOL_VERSION;
    h->chunk_bytes = chunk_bytes;
    h->nchunks = nchunks;
    h->data_offset = data_offset;
    h->free_chunks = nchunks;
    pthread_mutexattr_t at;
    pthread_mutexattr_init(&at);
    pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &at);
    pthread_mutexattr_destroy(&at);
    __atomic_store_n(&h->magic, POOL_MAGIC, __ATOMIC_RELEASE); /* last: an opener never sees a half-made header */
    *out = p;
    return GMUX_OK;
fail:
    close(fd);
    if (path) unlink(path);
    return rc;
}

int gmux_pool_open_fd(int fd, gmux_pool **out) {
    if (!out) return gmux__fail(GMUX_E_INVALID, "gmux_pool_open_fd: out is NULL");
    *out = NULL;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return gmux__fail(GMUX_E_INVALID, "pool fd %d is not open", fd);
    if ((uint64_t)st.st_size < sizeof(pool_header))
        return gmux__fail(GMUX_E_CORRUPT, "pool file of %lld bytes is too small to be a gmux pool", (long long)st.st_size);
    pool_header probe;
    if (pread(fd, &probe, sizeof probe, 0) != (ssize_t)sizeof probe)
        return gmux__fail(GMUX_E_CORRUPT, "cannot read the pool header: %s", strerror(errno));
    if (probe.magic != POOL_MAGIC) return gmux__fail(GMUX_E_CORRUPT, "not a gmux pool (bad magic)");
    if (probe.version != POOL_VERSION)
        return gmux__fail(GMUX_E_CORRUPT, "pool version %u, this library reads %u", probe.version, POOL_VERSION);
    long page = sysconf(_SC_PAGESIZE);
    if (probe.chunk_bytes == 0 || probe.chunk_bytes % (uint64_t)page || probe.nchunks == 0 || probe.nchunks > INT32_MAX)
        return gmux__fail(GMUX_E_CORRUPT, "pool header has impossible geometry");
    uint64_t hdr_bytes = round_up(sizeof(pool_header) + probe.nchunks * sizeof(int32_t), (uint64_t)page);
    if (probe.data_offset != round_up(hdr_bytes, probe.chunk_bytes) ||
        (uint64_t)st.st_size < probe.data_offset + probe.nchunks * probe.chunk_bytes)
        return gmux__fail(GMUX_E_CORRUPT, "pool file is truncated (%lld bytes)", (long long)st.st_size);
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return gmux__fail(GMUX_E_BACKEND, "dup of pool fd: %s", strerror(errno));
    int rc = map_header(dup, hdr_bytes, out);
    if (rc) close(dup);
    return rc;
}

int gmux_pool_open(const char *path, gmux_pool **out) {
    if (!path) return gmux__fail(GMUX_E_INVALID, "gmux_pool_open: path is NULL");
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return gmux__fail(GMUX_E_INVALID, "opening pool %s: %s", path, strerror(errno));
    int rc = gmux_pool_open_fd(fd, out);
    close(fd);
    return rc;
}

int gmux_pool_fd(const gmux_pool *p) { return p ? p->fd : -1; }
int gmux__pool_fd_raw(const gmux_pool *p) { return p->fd; }
uint64_t gmux__pool_chunk_bytes(const gmux_pool *p) { return p->hdr->chunk_bytes; }
uint64_t gmux__pool_data_offset(const gmux_pool *p) { return p->hdr->data_offset; }

int gmux_pool_info_get(gmux_pool *p, gmux_pool_info *out) {
    if (!p || !out) return gmux__fail(GMUX_E_INVALID, "gmux_pool_info_get: NULL argument");
    int rc = lock_pool(p);
    if (rc) return rc;
    out->chunk_bytes = p->hdr->chunk_bytes;
    out->nchunks = p->hdr->nchunks;
    out->free_chunks = p->hdr->free_chunks;
    pthread_mutex_unlock(&p->hdr->lock);
    return GMUX_OK;
}

/* Prefers one contiguous run (one mmap per allocation unit); falls back to any free chunks. */
int gmux__pool_take(gmux_pool *p, uint64_t n, uint32_t *chunks) {
    int rc = lock_pool(p);
    if (rc) return rc;
    pool_header *h = p->hdr;
    if (h->free_chunks < n) {
        uint64_t have = h->free_chunks;
        pthread_mutex_unlock(&h->lock);
        return gmux__fail(GMUX_E_NOMEM, "virtual GPU pool exhausted: need %llu chunks of %llu bytes, %llu free",
                          (unsigned long long)n, (unsigned long long)h->chunk_bytes, (unsigned long long)have);
    }
    int32_t pid = (int32_t)getpid();
    uint64_t run = 0, start = 0;
    for (uint64_t i = 0; i < h->nchunks && run < n; i++) {
        if (h->owner[i]) run = 0;
        else if (run++ == 0) start = i;
    }
    if (run == n) {
        for (uint64_t k = 0; k < n; k++) chunks[k] = (uint32_t)(start + k);
    } else {
        uint64_t k = 0;
        for (uint64_t i = 0; i < h->nchunks && k < n; i++)
            if (!h->owner[i]) chunks[k++] = (uint32_t)i;
    }
    for (uint64_t k = 0; k < n; k++) h->owner[chunks[k]] = pid;
    h->free_chunks -= n;
    pthread_mutex_unlock(&h->lock);
    return GMUX_OK;
}

void gmux__pool_give(gmux_pool *p, uint64_t n, const uint32_t *chunks) {
    if (lock_pool(p)) return;
    for (uint64_t k = 0; k < n; k++) {
        if (p->hdr->owner[chunks[k]]) p->hdr->free_chunks++;
        p->hdr->owner[chunks[k]] = 0;
    }
    pthread_mutex_unlock(&p->hdr->lock);
}

int gmux_pool_reclaim(gmux_pool *p, uint64_t *reclaimed) {
    if (!p) return gmux__fail(GMUX_E_INVALID, "gmux_pool_reclaim: pool is NULL");
    int rc = lock_pool(p);
    if (rc) return rc;
    uint64_t n = 0;
    int32_t last_dead = 0, last_alive = 0;
    for (uint64_t i = 0; i < p->hdr->nchunks; i++) {
        int32_t pid = p->hdr->owner[i];
        if (!pid || pid == last_alive) continue;
        if (pid != last_dead) {
            if (kill(pid, 0) == 0 || errno == EPERM) {
                last_alive = pid;
                continue;
            }
            last_dead = pid;
        }
        p->hdr->owner[i] = 0;
        p->hdr->free_chunks++;
        n++;
    }
    pthread_mutex_unlock(&p->hdr->lock);
    if (reclaimed) *reclaimed = n;
    return GMUX_OK;
}

void gmux_pool_close(gmux_pool *p) {
    if (!p) return;
    munmap(p->hdr, p->hdr_bytes);
    close(p->fd);
    free(p);
}

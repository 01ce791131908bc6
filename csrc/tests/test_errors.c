/* Misuse is refused with an error code and a message, never a crash: double free, unknown pointers,
 * resume without suspend, bad live ranges, exhausted pools, foreign pool files, NULL arguments. */
#include "check.h"

#include <fcntl.h>

#define REFUSED(call, code)                                                                                            \
    do {                                                                                                               \
        int rc_ = (call);                                                                                              \
        if (rc_ != (code)) {                                                                                           \
            fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, rc_, code);             \
            exit(1);                                                                                                   \
        }                                                                                                              \
        CHECK(strlen(gmux_last_error()) > 0);                                                                          \
    } while (0)

int main(void) {
    gmux_pool *pool;
    OK(gmux_pool_create(NULL, 16 * MiB, 2 * MiB, &pool));
    gmux_allocator *a;
    OK(gmux_allocator_host(pool, &a));
    void *p;
    OK(gmux_malloc(a, 1000, NULL, &p));
    memset(p, 3, 1000);

    int local;
    REFUSED(gmux_mfree(a, &local, 0), GMUX_E_UNKNOWN_PTR);
    REFUSED(gmux_mfree(a, (char *)p + 8, 0), GMUX_E_UNKNOWN_PTR);
    REFUSED(gmux_mfree(a, p, 999), GMUX_E_INVALID); /* torch passes the size back: a mismatch is a bug */
    REFUSED(gmux_set_tag(a, &local, GMUX_TAG_WEIGHTS), GMUX_E_UNKNOWN_PTR);
    REFUSED(gmux_set_tag(a, p, 17), GMUX_E_INVALID);
    REFUSED(gmux_resume(a, NULL), GMUX_E_STATE);
    REFUSED(gmux_malloc(a, 0, NULL, &p), GMUX_E_INVALID);
    REFUSED(gmux_malloc(a, 64 * MiB, NULL, &p), GMUX_E_NOMEM);
    gmux_stats st;
    OK(gmux_stats_get(a, &st));
    CHECK(st.allocations == 1 && st.mapped_bytes == 2 * MiB); /* the failed allocation left nothing behind */
    uint64_t n;
    gmux_alloc_info info;
    OK(gmux_list(a, &info, 1, &n));
    p = (void *)(uintptr_t)info.address;

    /* A live range outside every allocation: refused, and the job is still running with its bytes. */
    gmux_range bad[2] = {{(uint64_t)(uintptr_t)p, 10}, {(uint64_t)(uintptr_t)&local, 4}};
    REFUSED(gmux_suspend(a, bad, 2, NULL), GMUX_E_INVALID);
    gmux_range past = {(uint64_t)(uintptr_t)p + 990, 20};
    REFUSED(gmux_suspend(a, &past, 1, NULL), GMUX_E_INVALID);
    REFUSED(gmux_suspend(a, NULL, 3, NULL), GMUX_E_INVALID);
    CHECK(!gmux_is_suspended(a) && ((unsigned char *)p)[999] == 3);

    unsigned char peeked[16];
    REFUSED(gmux_peek(a, (uint64_t)(uintptr_t)p, peeked, 16), GMUX_E_STATE); /* running: read memory itself */
    gmux_range half = {(uint64_t)(uintptr_t)p, 500};
    OK(gmux_suspend(a, &half, 1, NULL));
    OK(gmux_peek(a, (uint64_t)(uintptr_t)p + 484, peeked, 16));
    CHECK(peeked[0] == 3 && peeked[15] == 3);
    REFUSED(gmux_peek(a, (uint64_t)(uintptr_t)p + 490, peeked, 16), GMUX_E_INVALID); /* past what was live */
    OK(gmux_resume(a, NULL));
    CHECK(((unsigned char *)p)[499] == 3);
    memset(p, 3, 1000); /* bytes past 500 were not live: undefined now */

    OK(gmux_suspend(a, NULL, 0, NULL));
    REFUSED(gmux_suspend(a, NULL, 0, NULL), GMUX_E_STATE);
    OK(gmux_resume(a, NULL));
    REFUSED(gmux_resume(a, NULL), GMUX_E_STATE);
    CHECK(((unsigned char *)p)[999] == 3);

    OK(gmux_mfree(a, p, 1000));
    REFUSED(gmux_mfree(a, p, 1000), GMUX_E_UNKNOWN_PTR); /* double free */

    /* The framework entry points cannot return a status: they count errors and never crash. */
    CHECK(gmux_alloc(100, 5, NULL) == NULL);
    gmux_free(&local, 4, 5, NULL);
    REFUSED(gmux_install(a, -1), GMUX_E_INVALID);
    OK(gmux_install(a, 0));
    void *q = gmux_alloc(4096, 0, NULL);
    CHECK(q != NULL);
    gmux_free(q, 4096, 0, NULL);
    gmux_free(q, 4096, 0, NULL);
    void *c = gmux_cupy_malloc(a, 5000, 0);
    CHECK(c != NULL);
    gmux_cupy_free(a, c, 0);
    OK(gmux_stats_get(a, &st));
    CHECK(st.errors == 1 && st.allocations == 0);
    OK(gmux_install(NULL, 0));

    /* NULLs and foreign files. */
    REFUSED(gmux_malloc(NULL, 10, NULL, &p), GMUX_E_INVALID);
    REFUSED(gmux_stats_get(a, NULL), GMUX_E_INVALID);
    gmux_allocator *none;
    REFUSED(gmux_allocator_host(NULL, &none), GMUX_E_INVALID);
    CHECK(none == NULL);
    gmux_pool *bogus;
    REFUSED(gmux_pool_create(NULL, 16 * MiB, 1000, &bogus), GMUX_E_INVALID);
    REFUSED(gmux_pool_create(NULL, 100, 4096, &bogus), GMUX_E_INVALID);
    REFUSED(gmux_pool_open("/nonexistent/gmux-pool", &bogus), GMUX_E_INVALID);
    char path[] = "/tmp/gmux-test-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    char junk[8192];
    memset(junk, 'x', sizeof junk);
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    REFUSED(gmux_pool_open_fd(fd, &bogus), GMUX_E_CORRUPT);
    close(fd);
    unlink(path);
    /* A truncated pool is refused too. */
    char ppath[] = "/tmp/gmux-pool-XXXXXX";
    fd = mkstemp(ppath);
    CHECK(fd >= 0);
    close(fd);
    unlink(ppath);
    gmux_pool *named;
    OK(gmux_pool_create(ppath, 8 * MiB, 2 * MiB, &named));
    gmux_pool_close(named);
    CHECK(truncate(ppath, 4 * MiB) == 0);
    REFUSED(gmux_pool_open(ppath, &bogus), GMUX_E_CORRUPT);
    unlink(ppath);

    /* Without a driver the CUDA backend says so; with one (GPU CI) it must work. */
    gmux_allocator *cu = NULL;
    int rc = gmux_allocator_cuda(0, &cu);
    CHECK(rc == GMUX_OK || rc == GMUX_E_UNAVAILABLE);
    printf("errors: cuda backend: %s\n", rc == GMUX_OK ? "available" : gmux_last_error());
    if (cu) OK(gmux_allocator_destroy(cu));

    OK(gmux_allocator_destroy(a));
    gmux_pool_close(pool);
    printf("errors: ok\n");
    return 0;
}

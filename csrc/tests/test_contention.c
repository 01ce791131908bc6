/* Two jobs on one virtual GPU. While A is suspended, B takes most of the pool: A's resume fails with
 * NOMEM as a whole (A stays suspended, bytes safe, nothing half-mapped), and succeeds once B gives the memory
 * back. A host store that cannot grow makes suspend fail before anything is released: A keeps running. */
#include "check.h"

#include <signal.h>
#include <sys/resource.h>

int main(void) {
    gmux_pool *pool;
    OK(gmux_pool_create(NULL, 256 * MiB, 2 * MiB, &pool));
    gmux_allocator *a, *b;
    OK(gmux_allocator_host(pool, &a));
    OK(gmux_allocator_host(pool, &b));
    void *pa[3];
    for (int i = 0; i < 3; i++) {
        OK(gmux_malloc(a, 40 * MiB, NULL, &pa[i]));
        fill(pa[i], 40 * MiB, 100 + (uint64_t)i);
    }
    OK(gmux_suspend(a, NULL, 0, NULL));

    void *pb;
    OK(gmux_malloc(b, 200 * MiB, NULL, &pb)); /* the pool now has 56 MiB free; A needs 120 */
    gmux_pool_info before, after;
    OK(gmux_pool_info_get(pool, &before));
    CHECK(gmux_resume(a, NULL) == GMUX_E_NOMEM);
    CHECK(strstr(gmux_last_error(), "exhausted") != NULL);
    CHECK(gmux_is_suspended(a));
    OK(gmux_pool_info_get(pool, &after));
    CHECK(after.free_chunks == before.free_chunks); /* what it mapped on the way went back */
    gmux_stats st;
    OK(gmux_stats_get(a, &st));
    CHECK(st.mapped_bytes == 0);

    OK(gmux_mfree(b, pb, 0));
    OK(gmux_resume(a, NULL));
    for (int i = 0; i < 3; i++) {
        unsigned char *want = malloc(40 * MiB);
        fill(want, 40 * MiB, 100 + (uint64_t)i);
        CHECK(memcmp(pa[i], want, 40 * MiB) == 0);
        free(want);
    }

    /* A store that cannot grow (file size limit): refused up front, nothing released, A still runs. */
    OK(gmux_allocator_destroy(b));
    OK(gmux_allocator_host(pool, &b));
    void *big;
    OK(gmux_malloc(b, 64 * MiB, NULL, &big));
    fill(big, 64 * MiB, 5);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 16 * MiB;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    int rc = gmux_suspend(b, NULL, 0, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECK(rc == GMUX_E_NOMEM);
    CHECK(!gmux_is_suspended(b));
    unsigned char *want = malloc(64 * MiB);
    fill(want, 64 * MiB, 5);
    CHECK(memcmp(big, want, 64 * MiB) == 0);
    free(want);
    OK(gmux_suspend(b, NULL, 0, NULL)); /* and with the limit lifted it works */
    OK(gmux_resume(b, NULL));

    OK(gmux_allocator_destroy(a));
    OK(gmux_allocator_destroy(b));
    gmux_pool_close(pool);
    printf("contention: ok\n");
    return 0;
}

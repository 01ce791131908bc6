/* Suspend really gives memory back: the job's RSS drops by (nearly) everything it had mapped, the pool
 * has every chunk free for the next job, and resume brings it back at the same addresses. */
#include "check.h"

int main(void) {
    const uint64_t total = 96 * MiB;
    gmux_pool *pool;
    OK(gmux_pool_create(NULL, 128 * MiB, 2 * MiB, &pool));
    gmux_allocator *a;
    OK(gmux_allocator_host(pool, &a));
    void *p[6];
    for (int i = 0; i < 6; i++) {
        OK(gmux_malloc(a, total / 6, NULL, &p[i]));
        fill(p[i], total / 6, (uint64_t)i + 1);
    }
    /* One cycle first, so the host store exists: growing it is a one-time cost, not part of what we measure. */
    OK(gmux_suspend(a, NULL, 0, NULL));
    OK(gmux_resume(a, NULL));

    long long running = rss_bytes();
    OK(gmux_suspend(a, NULL, 0, NULL));
    long long suspended = rss_bytes();
    gmux_pool_info pi;
    OK(gmux_pool_info_get(pool, &pi));
    printf("release_rss: running %lld MiB, suspended %lld MiB, tracked %llu MiB, pool free %llu/%llu chunks\n",
           running / (long long)MiB, suspended / (long long)MiB, (unsigned long long)(total / MiB),
           (unsigned long long)pi.free_chunks, (unsigned long long)pi.nchunks);
    CHECK(running - suspended >= (long long)(total * 9 / 10));
    CHECK(pi.free_chunks == pi.nchunks);
    gmux_stats st;
    OK(gmux_stats_get(a, &st));
    CHECK(st.mapped_bytes == 0 && st.suspended == 1 && st.live_total == total);

    OK(gmux_resume(a, NULL));
    long long resumed = rss_bytes();
    CHECK(resumed - suspended >= (long long)(total * 9 / 10));
    for (int i = 0; i < 6; i++) {
        unsigned char *want = malloc(total / 6);
        fill(want, total / 6, (uint64_t)i + 1);
        CHECK(memcmp(p[i], want, total / 6) == 0);
        free(want);
    }
    OK(gmux_allocator_destroy(a));
    gmux_pool_close(pool);
    printf("release_rss: ok\n");
    return 0;
}

/* The allocation table stays consistent under concurrent alloc/free/retag from several threads:
 * live bytes per tag equal the sum over the allocations actually held, and everything returns to the pool. */
#include "check.h"

#include <pthread.h>

#define THREADS 4
#define OPS 1500
#define HELD 48

typedef struct {
    gmux_allocator *a;
    uint64_t seed;
    void *ptr[HELD];
    uint64_t size[HELD];
    int tag[HELD];
} worker;

static void *run(void *arg) {
    worker *w = arg;
    for (int op = 0; op < OPS; op++) {
        int i = (int)(rnd(&w->seed) % HELD);
        if (w->ptr[i]) {
            if (rnd(&w->seed) % 4 == 0) {
                int tag = (int)(rnd(&w->seed) % GMUX_NTAGS);
                OK(gmux_set_tag(w->a, w->ptr[i], tag));
                w->tag[i] = tag;
            } else {
                OK(gmux_mfree(w->a, w->ptr[i], w->size[i]));
                w->ptr[i] = NULL;
            }
        } else {
            w->size[i] = 1 + rnd(&w->seed) % (300 * 1024);
            OK(gmux_malloc(w->a, w->size[i], NULL, &w->ptr[i]));
            memset(w->ptr[i], 0xab, w->size[i] < 4096 ? w->size[i] : 4096); /* really mapped and writable */
            w->tag[i] = GMUX_TAG_OTHER;
        }
    }
    return NULL;
}

int main(void) {
    gmux_pool *pool;
    OK(gmux_pool_create(NULL, 512 * MiB, 64 * 1024, &pool));
    gmux_pool_info before;
    OK(gmux_pool_info_get(pool, &before));
    gmux_allocator *a;
    OK(gmux_allocator_host(pool, &a));
    static worker w[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t].a = a;
        w[t].seed = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1);
        CHECK(pthread_create(&th[t], NULL, run, &w[t]) == 0);
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);

    uint64_t expect[GMUX_NTAGS] = {0}, total = 0, count = 0;
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < HELD; i++)
            if (w[t].ptr[i]) {
                expect[w[t].tag[i]] += w[t].size[i];
                total += w[t].size[i];
                count++;
                gmux_alloc_info info;
                OK(gmux_lookup(a, (uint64_t)(uintptr_t)w[t].ptr[i] + w[t].size[i] - 1, &info));
                CHECK(info.address == (uint64_t)(uintptr_t)w[t].ptr[i] && info.size == w[t].size[i] && info.tag == w[t].tag[i]);
            }
    gmux_stats st;
    OK(gmux_stats_get(a, &st));
    CHECK(st.live_total == total);
    CHECK(st.allocations == count);
    for (int g = 0; g < GMUX_NTAGS; g++) {
        CHECK(st.live[g] == expect[g]);
        CHECK(st.peak[g] >= st.live[g]);
    }
    CHECK(st.peak_total >= st.live_total && st.errors == 0);
    uint64_t listed = 0;
    OK(gmux_list(a, NULL, 0, &listed));
    CHECK(listed == count);

    OK(gmux_boundary(a));
    OK(gmux_stats_get(a, &st));
    CHECK(st.at_boundary_total == total);

    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < HELD; i++)
            if (w[t].ptr[i]) OK(gmux_mfree(a, w[t].ptr[i], 0));
    OK(gmux_stats_get(a, &st));
    CHECK(st.live_total == 0 && st.allocations == 0 && st.mapped_bytes == 0 && st.reserved_bytes == 0);
    gmux_pool_info after;
    OK(gmux_pool_info_get(pool, &after));
    CHECK(after.free_chunks == before.free_chunks);
    OK(gmux_allocator_destroy(a));
    gmux_pool_close(pool);
    printf("table_threads: ok (%d threads x %d ops)\n", THREADS, OPS);
    return 0;
}

/* A job's memory limit (gmux_set_limit): allocations past it fail with GMUX_E_NOMEM and a message naming the
 * limit, change nothing, and are counted as refused; a free makes room again; a suspended job keeps its claim
 * (its resume maps it all again). Threads racing for the last room never take the allocations' total span past
 * the limit: each claim is checked and counted in one atomic step. */
#include "check.h"

#include <pthread.h>

#define THREADS 4
#define LIMIT (64 * MiB)
#define EACH (4 * MiB)

static gmux_allocator *shared;
static pthread_barrier_t start;

static void *grab(void *arg) {
    uint64_t *got = arg;
    pthread_barrier_wait(&start);
    for (int i = 0; i < 16; i++) {
        void *p = NULL;
        int rc = gmux_malloc(shared, EACH, NULL, &p);
        CHECK(rc == GMUX_OK || rc == GMUX_E_NOMEM);
        if (rc == GMUX_OK) (*got)++;
    }
    return NULL;
}

int main(void) {
    gmux_pool *pool;
    gmux_allocator *a;
    OK(gmux_pool_create(NULL, 256 * MiB, 2 * MiB, &pool));
    OK(gmux_allocator_host(pool, &a));
    OK(gmux_set_limit(a, 8 * MiB));
    void *first, *second, *third;
    OK(gmux_malloc(a, 3 * MiB, NULL, &first)); /* 4 MiB with the 2 MiB granularity */
    void *none = NULL;
    CHECK(gmux_malloc(a, 5 * MiB, NULL, &none) == GMUX_E_NOMEM && none == NULL);
    CHECK(strstr(gmux_last_error(), "memory limit of 8388608 bytes") != NULL);
    gmux_stats st;
    OK(gmux_stats_get(a, &st));
    CHECK(st.limit == 8 * MiB && st.committed == 4 * MiB && st.refused == 1 && st.allocations == 1);
    OK(gmux_malloc(a, 4 * MiB, NULL, &second)); /* exactly at the limit */
    OK(gmux_suspend(a, NULL, 0, NULL));
    OK(gmux_stats_get(a, &st));
    CHECK(st.committed == 8 * MiB && st.mapped_bytes == 0); /* released, still claimed */
    OK(gmux_resume(a, NULL));
    OK(gmux_mfree(a, first, 0));
    OK(gmux_malloc(a, 4 * MiB, NULL, &third)); /* room again */
    OK(gmux_mfree(a, second, 0));
    OK(gmux_mfree(a, third, 0));
    OK(gmux_stats_get(a, &st));
    CHECK(st.committed == 0);
    OK(gmux_allocator_destroy(a));

    OK(gmux_allocator_host(pool, &shared));
    OK(gmux_set_limit(shared, LIMIT));
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t t[THREADS];
    uint64_t got[THREADS] = {0};
    for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, grab, &got[i]) == 0);
    uint64_t total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        total += got[i];
    }
    OK(gmux_stats_get(shared, &st));
    CHECK(total == LIMIT / EACH && st.committed == LIMIT && st.refused == THREADS * 16 - total);
    OK(gmux_allocator_destroy(shared));
    gmux_pool_close(pool);
    printf("limit: refusals name the limit, a suspended job keeps its claim, %llu of %d racing allocations fit\n",
           (unsigned long long)total, THREADS * 16);
    return 0;
}

/* Suspend/resume round trips of random allocation patterns: live bytes come back byte for byte, every
 * allocation keeps its address, and the pool gets every chunk back while suspended. */
#include "check.h"

#define MAXA 40

static void one_round(gmux_pool *pool, gmux_allocator *a, uint64_t seed) {
    uint64_t s = seed;
    int n = 1 + (int)(rnd(&s) % MAXA);
    void *ptr[MAXA];
    uint64_t size[MAXA];
    unsigned char *copy[MAXA];
    gmux_range ranges[4 * MAXA];
    uint64_t nr = 0;
    bool all_live = rnd(&s) % 4 == 0;
    for (int i = 0; i < n; i++) {
        /* sizes from a few bytes to past one 64 MiB release unit, so ranges straddle units */
        uint64_t kind = rnd(&s) % 10;
        size[i] = kind < 6 ? 1 + rnd(&s) % (256 * 1024) : kind < 9 ? 1 + rnd(&s) % (4 * MiB) : 60 * MiB + rnd(&s) % (16 * MiB);
        OK(gmux_malloc(a, size[i], NULL, &ptr[i]));
        copy[i] = malloc(size[i]);
        fill(ptr[i], size[i], rnd(&s));
        memcpy(copy[i], ptr[i], size[i]);
        int parts = (int)(rnd(&s) % 4); /* 0: nothing live in this allocation */
        for (int k = 0; k < parts; k++) {
            uint64_t off = rnd(&s) % size[i], len = 1 + rnd(&s) % (size[i] - off);
            ranges[nr++] = (gmux_range){(uint64_t)(uintptr_t)ptr[i] + off, len};
        }
    }
    if (all_live) nr = 0;
    /* Mark what is live by byte, to know what must survive. */
    unsigned char *live[MAXA];
    for (int i = 0; i < n; i++) {
        live[i] = calloc(size[i], 1);
        if (all_live) memset(live[i], 1, size[i]);
    }
    for (uint64_t r = 0; r < nr; r++)
        for (int i = 0; i < n; i++) {
            uintptr_t b = (uintptr_t)ptr[i];
            if (ranges[r].address >= b && ranges[r].address < b + size[i])
                memset(live[i] + (ranges[r].address - b), 1, ranges[r].length);
        }
    gmux_alloc_info before[MAXA], after[MAXA];
    uint64_t cnt;
    OK(gmux_list(a, before, MAXA, &cnt));
    CHECK(cnt == (uint64_t)n);

    gmux_swap_stats ss, rs;
    OK(gmux_suspend(a, all_live ? NULL : ranges, nr, &ss));
    CHECK(gmux_is_suspended(a));
    gmux_pool_info pi;
    OK(gmux_pool_info_get(pool, &pi));
    CHECK(pi.free_chunks == pi.nchunks);
    void *extra;
    CHECK(gmux_malloc(a, 100, NULL, &extra) == GMUX_E_STATE); /* nothing allocates while suspended */

    /* scribble over the live bytes' old values in our copies? no: resume must reproduce them exactly */
    OK(gmux_resume(a, &rs));
    CHECK(!gmux_is_suspended(a));
    CHECK(rs.bytes_copied == ss.bytes_copied);
    OK(gmux_list(a, after, MAXA, &cnt));
    CHECK(cnt == (uint64_t)n);
    for (int i = 0; i < n; i++) CHECK(before[i].address == after[i].address && before[i].size == after[i].size);
    uint64_t live_total = 0;
    for (int i = 0; i < n; i++) {
        /* run by run of live bytes (memchr and memcmp, not a byte loop: this test is most of the C suite's time) */
        const unsigned char *p = ptr[i], *l = live[i];
        uint64_t k = 0;
        while (k < size[i]) {
            const unsigned char *on = memchr(l + k, 1, size[i] - k);
            if (!on) break;
            uint64_t start = (uint64_t)(on - l);
            const unsigned char *off = memchr(on, 0, size[i] - start);
            uint64_t end = off ? (uint64_t)(off - l) : size[i];
            if (memcmp(p + start, copy[i] + start, end - start) != 0) {
                uint64_t b = start;
                while (p[b] == copy[i][b]) b++;
                fprintf(stderr, "seed %llu: allocation %d byte %llu differs after resume\n", (unsigned long long)seed, i,
                        (unsigned long long)b);
                exit(1);
            }
            live_total += end - start;
            k = end;
        }
        memset(ptr[i], 0, size[i] < 8192 ? size[i] : 8192); /* writable again */
    }
    CHECK(ss.bytes_copied == live_total);
    for (int i = 0; i < n; i++) {
        OK(gmux_mfree(a, ptr[i], size[i]));
        free(copy[i]);
        free(live[i]);
    }
}

int main(void) {
    gmux_pool *pool;
    OK(gmux_pool_create(NULL, 768 * MiB, 2 * MiB, &pool));
    gmux_allocator *a;
    OK(gmux_allocator_host(pool, &a));
    for (uint64_t seed = 1; seed <= 12; seed++) one_round(pool, a, seed * 0x2545F4914F6CDD1Dull);

    /* Free while suspended drops the saved bytes; resume restores the others. */
    void *p, *q;
    OK(gmux_malloc(a, 3 * MiB, NULL, &p));
    OK(gmux_malloc(a, 5 * MiB, NULL, &q));
    fill(q, 5 * MiB, 7);
    unsigned char *qc = malloc(5 * MiB);
    memcpy(qc, q, 5 * MiB);
    OK(gmux_suspend(a, NULL, 0, NULL));
    OK(gmux_mfree(a, p, 3 * MiB));
    OK(gmux_resume(a, NULL));
    CHECK(memcmp(q, qc, 5 * MiB) == 0);
    gmux_stats st;
    OK(gmux_stats_get(a, &st));
    CHECK(st.allocations == 1 && st.live_total == 5 * MiB && st.mapped_bytes == 6 * MiB);
    OK(gmux_mfree(a, q, 0));
    free(qc);

    /* Repeated cycles reuse the host store: the second suspend needs no store growth. */
    OK(gmux_malloc(a, 32 * MiB, NULL, &p));
    fill(p, 32 * MiB, 11);
    for (int i = 0; i < 3; i++) {
        OK(gmux_suspend(a, NULL, 0, NULL));
        OK(gmux_resume(a, NULL));
    }
    uint64_t s = 11 | 1, v;
    memcpy(&v, p, 8);
    CHECK(v == rnd(&s));
    OK(gmux_mfree(a, p, 0));
    OK(gmux_allocator_destroy(a));
    gmux_pool_close(pool);
    printf("suspend_roundtrip: ok\n");
    return 0;
}

/* Minimal test helpers: a failed check prints where and why, then exits non-zero. */
#ifndef GMUX_CHECK_H
#define GMUX_CHECK_H
#include "gmux.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last gmux error: %s)\n", __FILE__, __LINE__, #cond,             \
                    gmux_last_error());                                                                                \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define OK(call) CHECK((call) == GMUX_OK)

#define MiB (1024ull * 1024ull)

/* Resident set size of this process in bytes, anonymous plus shared-memory pages (from /proc). */
static inline long long rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, resident = 0;
    if (!f || fscanf(f, "%lld %lld", &size, &resident) != 2) return -1;
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE);
}

/* xorshift: reproducible patterns without libc's global rand state. */
static inline uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline void fill(unsigned char *p, uint64_t n, uint64_t seed) {
    uint64_t s = seed | 1;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rnd(&s);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (unsigned char)rnd(&s);
}
#endif

/* The CUDA backend, run end to end against the stand-in driver (fake_cuda.c, found through
 * LD_LIBRARY_PATH as libcuda.so.1): allocations through the framework entry points, suspend/resume with
 * live ranges straddling release units, contents and addresses kept, memory inaccessible while suspended,
 * every handle released at the end. */
#include "check.h"

#include <signal.h>
#include <sys/wait.h>

int main(void) {
    gmux_allocator *a;
    int rc = gmux_allocator_cuda(0, &a);
    if (rc != GMUX_OK) {
        fprintf(stderr, "cuda backend unavailable: %s\n", gmux_last_error());
        return 1;
    }
    CHECK(strcmp(gmux_allocator_backend(a), "cuda") == 0 && gmux_allocator_granularity(a) == 2 * MiB);
    OK(gmux_install(a, 0));
    uint64_t sizes[5] = {1000, 3 * MiB, 70 * MiB, 130 * MiB + 5, 2 * MiB};
    void *p[5];
    unsigned char *copy[5];
    for (int i = 0; i < 5; i++) {
        p[i] = gmux_alloc(sizes[i], 0, NULL);
        CHECK(p[i] != NULL);
        copy[i] = malloc(sizes[i]);
        fill(p[i], sizes[i], 77 + (uint64_t)i);
        memcpy(copy[i], p[i], sizes[i]);
    }
    gmux_range live[4] = {
        {(uint64_t)(uintptr_t)p[0], 1000},
        {(uint64_t)(uintptr_t)p[2] + 60 * MiB, 8 * MiB}, /* across the first 64 MiB unit boundary */
        {(uint64_t)(uintptr_t)p[3], 130 * MiB + 5},
        {(uint64_t)(uintptr_t)p[4] + 100, 50},
    };
    for (int cycle = 0; cycle < 3; cycle++) {
        gmux_swap_stats s, r;
        OK(gmux_suspend(a, live, 4, &s));
        CHECK(s.bytes_copied == 1000 + 8 * MiB + 130 * MiB + 5 + 50);
        gmux_stats st;
        OK(gmux_stats_get(a, &st));
        CHECK(st.mapped_bytes == 0 && st.suspended);
        CHECK(gmux_alloc(100, 0, NULL) == NULL); /* refused while suspended */
        pid_t pid = fork();
        if (pid == 0) {
            signal(SIGSEGV, SIG_DFL);
            (void)*(volatile unsigned char *)p[3];
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
        OK(gmux_resume(a, &r));
        CHECK(r.bytes_copied == s.bytes_copied);
        CHECK(memcmp(p[0], copy[0], 1000) == 0);
        CHECK(memcmp((char *)p[2] + 60 * MiB, copy[2] + 60 * MiB, 8 * MiB) == 0);
        CHECK(memcmp(p[3], copy[3], 130 * MiB + 5) == 0);
        CHECK(memcmp((char *)p[4] + 100, copy[4] + 100, 50) == 0);
    }
    gmux_stats st;
    OK(gmux_stats_get(a, &st));
    CHECK(st.errors == 3); /* the refused allocations, one per cycle */
    for (int i = 0; i < 5; i++) {
        gmux_free(p[i], sizes[i], 0, NULL);
        free(copy[i]);
    }
    OK(gmux_stats_get(a, &st));
    CHECK(st.allocations == 0 && st.mapped_bytes == 0 && st.errors == 3); /* every unmap/release accepted */
    /* freed while suspended: only the reservation is left to give back */
    void *q;
    OK(gmux_malloc(a, 5 * MiB, NULL, &q));
    OK(gmux_suspend(a, NULL, 0, NULL));
    OK(gmux_mfree(a, q, 0));
    OK(gmux_resume(a, NULL));
    OK(gmux_stats_get(a, &st));
    CHECK(st.errors == 3);
    OK(gmux_allocator_destroy(a));
    printf("cuda_backend (stand-in driver): ok\n");
    return 0;
}

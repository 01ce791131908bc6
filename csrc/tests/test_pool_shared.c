/* One pool, several processes: a child opens the pool by path, takes chunks, and its data is visible
 * through the file; when it dies holding chunks, the owner reclaims them for the next job. */
#include "check.h"

#include <sys/wait.h>

int main(void) {
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/gmux-test-pool-%d", (int)getpid());
    unlink(path);
    gmux_pool *pool;
    OK(gmux_pool_create(path, 32 * MiB, 2 * MiB, &pool));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        gmux_pool *mine;
        OK(gmux_pool_open(path, &mine));
        gmux_allocator *a;
        OK(gmux_allocator_host(mine, &a));
        void *p;
        OK(gmux_malloc(a, 10 * MiB, NULL, &p));
        memset(p, 0x5a, 10 * MiB);
        _exit(0); /* dies holding 5 chunks */
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    gmux_pool_info pi;
    OK(gmux_pool_info_get(pool, &pi));
    CHECK(pi.free_chunks == pi.nchunks - 5);
    uint64_t back = 0;
    OK(gmux_pool_reclaim(pool, &back));
    CHECK(back == 5);
    OK(gmux_pool_info_get(pool, &pi));
    CHECK(pi.free_chunks == pi.nchunks);
    /* The live owner keeps its chunks through a reclaim. */
    gmux_allocator *a;
    OK(gmux_allocator_host(pool, &a));
    void *p;
    OK(gmux_malloc(a, 4 * MiB, NULL, &p));
    OK(gmux_pool_reclaim(pool, &back));
    CHECK(back == 0);
    OK(gmux_allocator_destroy(a));
    gmux_pool_close(pool);
    unlink(path);
    printf("pool_shared: ok\n");
    return 0;
}

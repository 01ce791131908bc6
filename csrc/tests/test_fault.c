/* Touching suspended memory faults (SIGSEGV), like a GPU kernel touching unmapped VMM memory would,
 * instead of silently reading stale or zero pages. Checked in a child process; after resume the same
 * address works again. */
#include "check.h"

#include <signal.h>
#include <sys/wait.h>

static int child_touch(volatile unsigned char *p, int write) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* sanitizers install their own handler; we want the plain fault */
        signal(SIGBUS, SIG_DFL);
        if (write) p[12345] = 1;
        else (void)p[12345];
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

int main(void) {
    gmux_pool *pool;
    OK(gmux_pool_create(NULL, 16 * MiB, 2 * MiB, &pool));
    gmux_allocator *a;
    OK(gmux_allocator_host(pool, &a));
    void *p;
    OK(gmux_malloc(a, 4 * MiB, NULL, &p));
    memset(p, 7, 4 * MiB);
    CHECK(child_touch(p, 0) == 0);
    OK(gmux_suspend(a, NULL, 0, NULL));
    CHECK(child_touch(p, 0) == SIGSEGV);
    CHECK(child_touch(p, 1) == SIGSEGV);
    OK(gmux_resume(a, NULL));
    CHECK(child_touch(p, 0) == 0);
    CHECK(((unsigned char *)p)[12345] == 7);
    OK(gmux_allocator_destroy(a));
    gmux_pool_close(pool);
    printf("fault: ok\n");
    return 0;
}

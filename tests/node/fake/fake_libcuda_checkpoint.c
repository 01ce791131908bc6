/* A stand-in for libcuda's checkpoint API (tests/node/test_move_rebind.py): it keeps one process state, writes
 * every call with its arguments to $FAKE_CUDA_LOG, and fails the call named in $FAKE_CUDA_FAIL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>

static int state = CU_PROCESS_STATE_RUNNING;

static CUresult logged(const char *call, int pid, const char *more) {
    const char *path = getenv("FAKE_CUDA_LOG");
    if (path) {
        FILE *f = fopen(path, "a");
        if (f) { fprintf(f, "%s %d %s\n", call, pid, more ? more : ""); fclose(f); }
    }
    const char *fail = getenv("FAKE_CUDA_FAIL");
    return fail && strcmp(fail, call) == 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
}

/* A call that, when it succeeds, leaves the process in state `then`. */
static CUresult step(const char *call, int pid, const char *more, int then) {
    CUresult rc = logged(call, pid, more);
    if (rc == CUDA_SUCCESS) state = then;
    return rc;
}

static void hex(char *out, const CUuuid *u) {
    for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", (unsigned char)u->bytes[i]);
}

CUresult cuInit(unsigned int flags) { return logged("cuInit", (int)flags, NULL); }

CUresult cuDriverGetVersion(int *version) {
    const char *v = getenv("FAKE_CUDA_VERSION");
    *version = v ? atoi(v) : 13000;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    *name = error == CUDA_ERROR_NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED" : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *out) {
    *out = (CUprocessState)state;
    return logged("state", pid, NULL);
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    char more[32];
    snprintf(more, sizeof more, "timeout=%u", args ? args->timeoutMs : 0);
    return step("lock", pid, more, CU_PROCESS_STATE_LOCKED);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
    (void)args;
    return step("checkpoint", pid, NULL, CU_PROCESS_STATE_CHECKPOINTED);
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
    char more[160] = "pairs=0";
    if (args && args->gpuPairsCount == 1 && args->gpuPairs) {
        char a[33], b[33];
        hex(a, &args->gpuPairs[0].oldUuid);
        hex(b, &args->gpuPairs[0].newUuid);
        snprintf(more, sizeof more, "pairs=1 %s->%s", a, b);
    } else if (args && args->gpuPairsCount) {
        snprintf(more, sizeof more, "pairs=%u", args->gpuPairsCount);
    }
    return step(args && args->gpuPairsCount ? "restore" : "restore-back", pid, more, CU_PROCESS_STATE_LOCKED);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
    (void)args;
    return step("unlock", pid, NULL, CU_PROCESS_STATE_RUNNING);
}

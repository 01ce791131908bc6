/* Error codes and this thread's last error message. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Thread_local char last_error[512];

const char *gmux_strerror(int status) {
    switch (status) {
    case GMUX_OK: return "ok";
    case GMUX_E_INVALID: return "invalid argument";
    case GMUX_E_NOMEM: return "out of memory";
    case GMUX_E_UNKNOWN_PTR: return "unknown pointer";
    case GMUX_E_STATE: return "not allowed in this state";
    case GMUX_E_BACKEND: return "backend call failed";
    case GMUX_E_UNAVAILABLE: return "backend unavailable";
    case GMUX_E_CORRUPT: return "corrupt or foreign pool file";
    default: return "unknown status";
    }
}

const char *gmux_last_error(void) { return last_error; }

int gmux__fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

double gmux__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int gmux__grow(void **buf, uint64_t *cap, uint64_t need, size_t elem) {
    if (need <= *cap) return GMUX_OK;
    uint64_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *p = realloc(*buf, n * elem);
    if (!p) return gmux__fail(GMUX_E_NOMEM, "cannot grow a bookkeeping array to %llu entries", (unsigned long long)n);
    *buf = p;
    *cap = n;
    return GMUX_OK;
}

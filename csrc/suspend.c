/* The copy engine: allocator-tier suspend and resume.
 *
 * Suspend walks every allocation unit in address order on the calling thread, copying the live bytes that
 * fall inside the unit into the host store and then posting the unit to a helper thread, which waits
 * for that unit's copies and releases its physical memory. Resume is the mirror: the helper maps units
 * ahead while the calling thread copies bytes back into units already mapped. So copy and map/release
 * overlap on both backends (on CUDA the copies are also asynchronous on the DMA engine).
 * Units are released only after their bytes are safe, so a failure mid-way is rolled back by mapping
 * the released units again and copying their bytes back: the job is left running or suspended, whole. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef GMUX_RELEASER_NICE
#define GMUX_RELEASER_NICE 5
#endif

typedef struct {
    gmux_allocator *a;
    uint64_t n;
    pthread_mutex_t m;
    pthread_cond_t c;
    uint64_t posted; /* suspend: units whose copies are issued; resume: units mapped */
    bool abort;      /* the caller failed: the helper stops at the next unit */
    int err;         /* the helper's first failure */
    char msg[256];
    uint64_t moved_bytes;
    double map_s;
} pipeline;

static void pipe_init(pipeline *p, gmux_allocator *a, uint64_t n) {
    memset(p, 0, sizeof *p);
    p->a = a;
    p->n = n;
    pthread_mutex_init(&p->m, NULL);
    pthread_cond_init(&p->c, NULL);
}

static void pipe_destroy(pipeline *p) {
    pthread_mutex_destroy(&p->m);
    pthread_cond_destroy(&p->c);
}

static void pipe_post(pipeline *p, uint64_t posted) {
    pthread_mutex_lock(&p->m);
    p->posted = posted;
    pthread_cond_broadcast(&p->c);
    pthread_mutex_unlock(&p->m);
}

static void pipe_abort(pipeline *p) {
    pthread_mutex_lock(&p->m);
    p->abort = true;
    pthread_cond_broadcast(&p->c);
    pthread_mutex_unlock(&p->m);
}

static void pipe_fail(pipeline *p, int rc) {
    pthread_mutex_lock(&p->m);
    if (!p->err) {
        p->err = rc;
        strncpy(p->msg, gmux_last_error(), sizeof p->msg - 1);
    }
    p->abort = true;
    pthread_cond_broadcast(&p->c);
    pthread_mutex_unlock(&p->m);
}

/* Blocks until item i is posted; false if the other side gave up first. */
static bool pipe_wait(pipeline *p, uint64_t i) {
    pthread_mutex_lock(&p->m);
    while (p->posted <= i && !p->abort) pthread_cond_wait(&p->c, &p->m);
    bool ok = p->posted > i;
    pthread_mutex_unlock(&p->m);
    return ok;
}

static void *releaser(void *arg) {
    pipeline *p = arg;
    gmux_backend *b = p->a->backend;
    /* The copies are the critical path of a suspend; releasing is background work that only has to be done
     * by the end. On a machine with no idle core, yield the CPU to the copier first. */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), GMUX_RELEASER_NICE);
    int rc = b->thread_enter ? b->thread_enter(b) : GMUX_OK;
    if (rc) {
        pipe_fail(p, rc);
        return NULL;
    }
    for (uint64_t i = 0; i < p->n && pipe_wait(p, i); i++) {
        gmux_work *w = &p->a->work[i];
        if ((rc = b->wait(b, w->token))) { pipe_fail(p, rc); break; }
        double t = gmux__now();
        if ((rc = b->unmap_unit(b, w->e, w->unit))) { pipe_fail(p, rc); break; }
        if (b->store_trim) b->store_trim(b, w->store_end);
        p->map_s += gmux__now() - t;
        w->e->down[w->unit] = 1;
        w->e->ndown++;
        p->moved_bytes += gmux__unit_len(w->e, b->unit_bytes, w->unit);
    }
    if (b->thread_leave) b->thread_leave(b);
    return NULL;
}

static void *mapper(void *arg) {
    pipeline *p = arg;
    gmux_backend *b = p->a->backend;
    int rc = b->thread_enter ? b->thread_enter(b) : GMUX_OK;
    if (rc) {
        pipe_fail(p, rc);
        return NULL;
    }
    for (uint64_t i = 0; i < p->n; i++) {
        pthread_mutex_lock(&p->m);
        bool stop = p->abort;
        pthread_mutex_unlock(&p->m);
        if (stop) break;
        gmux_work *w = &p->a->work[i];
        double t = gmux__now();
        if ((rc = b->map_unit(b, w->e, w->unit))) { pipe_fail(p, rc); break; }
        p->map_s += gmux__now() - t;
        p->moved_bytes += gmux__unit_len(w->e, b->unit_bytes, w->unit);
        pipe_post(p, i + 1); /* mapped; `down` is cleared by restore() only once its bytes are back */
    }
    if (b->thread_leave) b->thread_leave(b);
    return NULL;
}

/* Copies, in one direction, the parts of entry e's saved ranges [rs, re) that fall in unit u. */
static int copy_unit(gmux_allocator *a, gmux_entry *e, uint64_t u, uint64_t rs, uint64_t re, unsigned char *store,
                     bool out, uint64_t *bytes, uint64_t *store_end) {
    gmux_backend *b = a->backend;
    uintptr_t lo = e->addr + u * b->unit_bytes, hi = lo + gmux__unit_len(e, b->unit_bytes, u);
    for (uint64_t r = rs; r < re; r++) {
        const gmux_saved *s = &a->saved[r];
        uintptr_t from = s->addr > lo ? s->addr : lo, to = s->addr + s->len < hi ? s->addr + s->len : hi;
        if (from >= to) continue;
        unsigned char *h = store + s->store_off + (from - s->addr);
        int rc = out ? b->copy_out(b, h, from, to - from) : b->copy_in(b, from, h, to - from);
        if (rc) return rc;
        *bytes += to - from;
        *store_end = s->store_off + (to - s->addr);
    }
    return GMUX_OK;
}

/* Advances *r past saved ranges of allocations before e; returns the end of e's own ranges. */
static uint64_t ranges_of(const gmux_allocator *a, const gmux_entry *e, uint64_t *r) {
    while (*r < a->nsaved && a->saved[*r].base < e->addr) (*r)++;
    uint64_t end = *r;
    while (end < a->nsaved && a->saved[end].base == e->addr) end++;
    return end;
}

static uint64_t saved_bytes(const gmux_allocator *a) {
    return a->nsaved ? a->saved[a->nsaved - 1].store_off + a->saved[a->nsaved - 1].len : 0;
}

/* Maps every released unit of the current allocations and copies its saved bytes back. All or nothing:
 * on failure the units it mapped are released again, so the job stays suspended, bytes safe in the store,
 * and a later resume starts over. Lock held. */
static int restore(gmux_allocator *a, gmux_swap_stats *st) {
    gmux_backend *b = a->backend;
    uint64_t nent = 0, n = 0;
    int rc = gmux__table_sorted(&a->table, &a->order, &a->order_cap, &nent);
    for (uint64_t i = 0; !rc && i < nent; i++) n += a->order[i]->ndown;
    if (!rc) rc = gmux__grow((void **)&a->work, &a->work_cap, n ? n : 1, sizeof *a->work);
    if (rc) return rc;
    n = 0;
    for (uint64_t i = 0; i < nent; i++)
        for (uint64_t u = 0; u < a->order[i]->nunits; u++)
            if (a->order[i]->down[u]) a->work[n++] = (gmux_work){.e = a->order[i], .unit = u};
    double t = gmux__now();
    unsigned char *store = NULL;
    if ((rc = b->store_ensure(b, saved_bytes(a), &store))) return rc;
    st->stage_s += gmux__now() - t;
    b->fence_reset(b);
    pipeline p;
    pipe_init(&p, a, n);
    pthread_t helper;
    if (pthread_create(&helper, NULL, mapper, &p) != 0) {
        pipe_destroy(&p);
        return gmux__fail(GMUX_E_BACKEND, "cannot start the mapping thread");
    }
    double t0 = gmux__now(), waited = 0;
    uint64_t r = 0, bytes = 0;
    gmux_entry *last = NULL;
    for (uint64_t i = 0; i < n && !rc; i++) {
        double tw = gmux__now();
        if (!pipe_wait(&p, i)) break; /* the mapper failed: its error is reported below */
        waited += gmux__now() - tw;
        gmux_work *w = &a->work[i];
        uint64_t rs = r, re = ranges_of(a, w->e, &rs);
        r = rs;
        if (w->e != last) st->allocations++;
        last = w->e;
        uint64_t ignored;
        rc = copy_unit(a, w->e, w->unit, rs, re, store, false, &bytes, &ignored);
    }
    uint64_t token = 0;
    if (!rc) rc = b->fence(b, &token);
    if (!rc) rc = b->wait(b, token);
    if (rc) pipe_fail(&p, rc);
    double t1 = gmux__now();
    pthread_join(helper, NULL);
    st->copy_s += (t1 - t0) - waited;
    st->map_s += p.map_s;
    st->bytes_copied += bytes;
    if (!rc && p.err) rc = gmux__fail(p.err, "%s", p.msg);
    if (!rc) {
        for (uint64_t i = 0; i < n; i++) {
            a->work[i].e->down[a->work[i].unit] = 0;
            a->work[i].e->ndown--;
        }
        st->bytes_mapped += p.moved_bytes;
        st->units += n;
        a->table.mapped += p.moved_bytes;
    } else {
        for (uint64_t i = 0; i < p.posted; i++)
            if (b->unmap_unit(b, a->work[i].e, a->work[i].unit) != GMUX_OK) __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED);
    }
    pipe_destroy(&p);
    return rc;
}

static int by_range(const void *x, const void *y) {
    uint64_t a = ((const gmux_range *)x)->address, b = ((const gmux_range *)y)->address;
    return a < b ? -1 : a > b;
}

/* Fills a->saved from the live ranges (or whole allocations) in address order. Lock held. */
static int plan(gmux_allocator *a, const gmux_range *live, uint64_t nlive, uint64_t nent) {
    uint64_t off = 0;
    a->nsaved = 0;
    if (!live) {
        int rc = gmux__grow((void **)&a->saved, &a->saved_cap, nent ? nent : 1, sizeof *a->saved);
        if (rc) return rc;
        for (uint64_t i = 0; i < nent; i++) {
            gmux_entry *e = a->order[i];
            a->saved[a->nsaved++] = (gmux_saved){e->addr, e->addr, e->size, off};
            off += e->size;
        }
        return GMUX_OK;
    }
    int rc = gmux__grow((void **)&a->ranges, &a->ranges_cap, nlive, sizeof *a->ranges);
    if (!rc) rc = gmux__grow((void **)&a->saved, &a->saved_cap, nlive, sizeof *a->saved);
    if (rc) return rc;
    uint64_t m = 0;
    for (uint64_t i = 0; i < nlive; i++)
        if (live[i].length) a->ranges[m++] = live[i];
    qsort(a->ranges, m, sizeof *a->ranges, by_range);
    uint64_t k = 0; /* merge overlaps (not mere adjacency: neighbouring allocations can abut) */
    for (uint64_t i = 0; i < m; i++) {
        gmux_range r = a->ranges[i];
        if (r.address + r.length < r.address) return gmux__fail(GMUX_E_INVALID, "live range at 0x%llx wraps around", (unsigned long long)r.address);
        if (k && r.address < a->ranges[k - 1].address + a->ranges[k - 1].length) {
            uint64_t end = r.address + r.length, prev = a->ranges[k - 1].address + a->ranges[k - 1].length;
            if (end > prev) a->ranges[k - 1].length = end - a->ranges[k - 1].address;
        } else {
            a->ranges[k++] = r;
        }
    }
    uint64_t ei = 0;
    for (uint64_t i = 0; i < k; i++) {
        gmux_range r = a->ranges[i];
        while (ei < nent && a->order[ei]->addr + a->order[ei]->size <= r.address) ei++;
        if (ei == nent || r.address < a->order[ei]->addr || r.address + r.length > a->order[ei]->addr + a->order[ei]->size)
            return gmux__fail(GMUX_E_INVALID, "live range [0x%llx, +%llu) is not inside one allocation",
                              (unsigned long long)r.address, (unsigned long long)r.length);
        a->saved[a->nsaved++] = (gmux_saved){r.address, a->order[ei]->addr, r.length, off};
        off += r.length;
    }
    return GMUX_OK;
}

int gmux_suspend(gmux_allocator *a, const gmux_range *live, uint64_t nlive, gmux_swap_stats *out) {
    if (!a) return gmux__fail(GMUX_E_INVALID, "gmux_suspend: allocator is NULL");
    if (nlive && !live) return gmux__fail(GMUX_E_INVALID, "gmux_suspend: %llu live ranges but no array", (unsigned long long)nlive);
    gmux_swap_stats st = {0};
    double t_start = gmux__now();
    pthread_mutex_lock(&a->lock);
    gmux_backend *b = a->backend;
    int rc = a->suspended ? gmux__fail(GMUX_E_STATE, "suspend of a job that is already suspended") : GMUX_OK;
    bool entered = false;
    if (!rc && b->thread_enter) entered = (rc = b->thread_enter(b)) == GMUX_OK;
    uint64_t nent = 0, n = 0;
    if (!rc) rc = gmux__table_sorted(&a->table, &a->order, &a->order_cap, &nent);
    if (!rc) rc = plan(a, live, nlive, nent);
    for (uint64_t i = 0; !rc && i < nent; i++) n += a->order[i]->nunits;
    if (!rc) rc = gmux__grow((void **)&a->work, &a->work_cap, n ? n : 1, sizeof *a->work);
    double t = gmux__now();
    if (!rc) rc = b->sync_device(b); /* the job's kernels must be done writing before we read */
    st.sync_s = gmux__now() - t;
    unsigned char *store = NULL;
    t = gmux__now();
    if (!rc) rc = b->store_ensure(b, saved_bytes(a), &store);
    st.stage_s = gmux__now() - t;
    if (rc) goto out;
    n = 0;
    for (uint64_t i = 0; i < nent; i++)
        for (uint64_t u = 0; u < a->order[i]->nunits; u++) a->work[n++] = (gmux_work){.e = a->order[i], .unit = u};
    b->fence_reset(b);
    pipeline p;
    pipe_init(&p, a, n);
    pthread_t helper;
    if (pthread_create(&helper, NULL, releaser, &p) != 0) {
        pipe_destroy(&p);
        rc = gmux__fail(GMUX_E_BACKEND, "cannot start the release thread");
        goto out;
    }
    double t0 = gmux__now();
    uint64_t r = 0, bytes = 0, store_end = 0;
    gmux_entry *last = NULL;
    for (uint64_t i = 0; i < n && !rc; i++) {
        gmux_work *w = &a->work[i];
        uint64_t rs = r, re = ranges_of(a, w->e, &rs);
        r = rs;
        if (w->e != last) st.allocations++;
        last = w->e;
        rc = copy_unit(a, w->e, w->unit, rs, re, store, true, &bytes, &store_end);
        w->store_end = store_end;
        if (!rc) rc = b->fence(b, &w->token);
        if (!rc) pipe_post(&p, i + 1);
    }
    if (!rc && n) rc = b->wait(b, a->work[n - 1].token);
    st.copy_s = gmux__now() - t0;
    if (rc) pipe_abort(&p);
    pthread_join(helper, NULL);
    st.map_s = p.map_s;
    st.bytes_copied = bytes;
    st.bytes_mapped = p.moved_bytes;
    st.units = n;
    a->table.mapped -= p.moved_bytes;
    if (!rc && p.err) rc = gmux__fail(p.err, "%s", p.msg);
    pipe_destroy(&p);
    if (rc) { /* put back what was released; the job keeps running */
        char why[256];
        strncpy(why, gmux_last_error(), sizeof why - 1);
        why[sizeof why - 1] = 0;
        gmux_swap_stats ignored = {0};
        int back = restore(a, &ignored);
        if (back) { /* every byte is still in the store: stay suspended so that resume can try again */
            __atomic_store_n(&a->suspended, true, __ATOMIC_RELEASE);
            rc = gmux__fail(rc, "suspend failed (%s) and rolling back failed too (%s): the job stays suspended "
                                "with its bytes saved; resume it to retry", why, gmux_last_error());
        } else {
            gmux__fail(rc, "suspend failed and was rolled back: %s", why);
        }
        goto out;
    }
    t = gmux__now();
    b->store_release(b); /* failure only leaves the store mapped: RSS stays up, bytes are safe */
    st.stage_s += gmux__now() - t;
    __atomic_store_n(&a->suspended, true, __ATOMIC_RELEASE);
out:
    if (entered && b->thread_leave) b->thread_leave(b);
    pthread_mutex_unlock(&a->lock);
    st.total_s = gmux__now() - t_start;
    if (out) *out = st;
    return rc;
}

int gmux_resume(gmux_allocator *a, gmux_swap_stats *out) {
    if (!a) return gmux__fail(GMUX_E_INVALID, "gmux_resume: allocator is NULL");
    gmux_swap_stats st = {0};
    double t_start = gmux__now();
    pthread_mutex_lock(&a->lock);
    gmux_backend *b = a->backend;
    int rc = a->suspended ? GMUX_OK : gmux__fail(GMUX_E_STATE, "resume of a job that is not suspended");
    bool entered = false;
    if (!rc && b->thread_enter) entered = (rc = b->thread_enter(b)) == GMUX_OK;
    if (!rc) rc = restore(a, &st);
    if (!rc) {
        double t = gmux__now();
        b->store_release(b);
        st.stage_s += gmux__now() - t;
        a->nsaved = 0;
        __atomic_store_n(&a->suspended, false, __ATOMIC_RELEASE);
    }
    if (entered && b->thread_leave) b->thread_leave(b);
    pthread_mutex_unlock(&a->lock);
    st.total_s = gmux__now() - t_start;
    if (out) *out = st;
    return rc;
}

int gmux_peek(gmux_allocator *a, uint64_t address, void *dst, uint64_t n) {
    if (!a || (n && !dst)) return gmux__fail(GMUX_E_INVALID, "gmux_peek: NULL argument");
    pthread_mutex_lock(&a->lock);
    int rc = a->suspended ? GMUX_OK : gmux__fail(GMUX_E_STATE, "peek needs a suspended job; read the memory itself");
    uint64_t lo = 0, hi = a->nsaved; /* first saved range ending after address */
    while (!rc && lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (a->saved[mid].addr + a->saved[mid].len <= address) lo = mid + 1;
        else hi = mid;
    }
    unsigned char *store = NULL;
    if (!rc) rc = a->backend->store_ensure(a->backend, saved_bytes(a), &store);
    uint64_t cur = address, end = address + n;
    for (uint64_t r = lo; !rc && cur < end; r++) {
        const gmux_saved *s = r < a->nsaved ? &a->saved[r] : NULL;
        if (!s || s->addr > cur || s->addr + s->len <= cur) {
            rc = gmux__fail(GMUX_E_INVALID, "bytes at 0x%llx were not saved (not live when the job was suspended)",
                            (unsigned long long)cur);
            break;
        }
        uint64_t take = (s->addr + s->len < end ? s->addr + s->len : end) - cur;
        memcpy((unsigned char *)dst + (cur - address), store + s->store_off + (cur - s->addr), take);
        cur += take;
    }
    if (store) a->backend->store_release(a->backend);
    pthread_mutex_unlock(&a->lock);
    return rc;
}

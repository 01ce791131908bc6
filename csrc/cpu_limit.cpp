/* A job's memory limit on a virtual GPU: torch's CPU allocator, wrapped so that every byte the job's tensors
 * hold is counted and an allocation past the limit fails with torch's own out-of-memory error.
 *
 * Why C++ and not the C core: on a virtual GPU the job's "device" is the CPU, and torch's CPU tensors come from
 * c10's CPU allocator (c10::GetCPUAllocator), which only a c10::Allocator subclass can take the place of. This
 * file is mechanism only, behind a flat extern "C" interface loaded with ctypes (gmux/job/memory/limit.py, where
 * the policy is: whether to install it, the limit, the words of the error).
 *
 * How: each allocation is the inner allocator's raw block with a 64-byte header in front (64 keeps the data at
 * c10's alignment), recording how many bytes were counted, so that a free subtracts exactly what its allocation
 * added, whatever the limit is by then. The data pointer is its own context (a "simple" DataPtr, as the default
 * allocator's), so copy-on-write clones and raw_allocate keep working. Allocations made while a thread is in a
 * host scope (gmux_cpu_host_enter: the runtime's host copies of suspended state) are host memory, not the
 * job's device memory: they are not counted. The check and the count are one atomic add, so two threads
 * allocating at once can never both slip past the limit. Built against the torch it runs with (setup.py); a
 * mismatch is caught at load time by the library failing to load, and the job then runs without a limit,
 * saying so. */
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace {

constexpr size_t kHeader = 64;
constexpr uint64_t kMagic = 0x676d75786c696d31ull;  // "gmuxlim1": catches a block freed through the wrong path

struct Header {
  uint64_t magic;
  uint64_t counted;  // bytes added to in_use by this allocation (0: host memory, uncounted)
  uint64_t size;     // bytes asked for (what adopting it counts)
};

std::atomic<uint64_t> g_limit{0};    // 0: count only, never refuse
std::atomic<uint64_t> g_in_use{0};
std::atomic<uint64_t> g_peak{0};
std::atomic<uint64_t> g_refused{0};
std::mutex g_text_lock;
std::string g_what = "over the job's memory limit";  // set by Python: names the job and the limit
std::string g_how;                                   // set by Python: how to raise the limit
thread_local int t_host = 0;
c10::Allocator* g_inner = nullptr;

// As gmux.util.sizes.format_size writes a size, so that a refusal's figures read in the unit of its limit.
std::string human_size(uint64_t n) {
  static const char* const units[] = {"TiB", "GiB", "MiB", "KiB"};
  char buf[32];
  for (int i = 0; i < 4; ++i) {
    const double unit = static_cast<double>(uint64_t{1} << (10 * (4 - i)));
    if (static_cast<double>(n) >= unit) {
      std::snprintf(buf, sizeof buf, "%.1f%s", static_cast<double>(n) / unit, units[i]);
      return buf;
    }
  }
  std::snprintf(buf, sizeof buf, "%lluB", static_cast<unsigned long long>(n));
  return buf;
}

void raise_peak(uint64_t now) {
  uint64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

/* Counts n bytes against the limit, or counts nothing and returns false when they would go past it.
 * *before: what was in use without them. */
bool count(uint64_t n, uint64_t* before) {
  const uint64_t now = g_in_use.fetch_add(n, std::memory_order_relaxed) + n;
  *before = now - n;
  const uint64_t limit = g_limit.load(std::memory_order_relaxed);
  if (limit && now > limit) {
    g_in_use.fetch_sub(n, std::memory_order_relaxed);
    g_refused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  raise_peak(now);
  return true;
}

void delete_block(void* data) {
  // Callers of the raw interface may free a null pointer (oneDNN does, in its LSTM kernels), as free() allows.
  if (data == nullptr) return;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  if (h->magic != kMagic) {
    // Never seen: a block of ours always carries the header. Leaking is safer than freeing a wrong pointer.
    std::fprintf(stderr, "gmux: memory limit: a block at %p without gmux's header was freed; leaked\n", data);
    return;
  }
  if (h->counted) g_in_use.fetch_sub(h->counted, std::memory_order_relaxed);
  h->magic = 0;
  g_inner->raw_deallocate(h);
}

class LimitedCPUAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return g_inner->allocate(0);  // no memory, nothing to count
    const uint64_t counted = t_host ? 0 : n;
    uint64_t before = 0;
    if (counted && !count(counted, &before)) {
      std::string what, how;
      {
        std::lock_guard<std::mutex> guard(g_text_lock);
        what = g_what;
        how = g_how;
      }
      C10_THROW_ERROR(OutOfMemoryError, what + ": tried to allocate " + human_size(n) + " with " + human_size(before) +
                                            " in use" + (how.empty() ? "" : ". " + how));
    }
    void* base = nullptr;
    try {
      base = g_inner->raw_allocate(n + kHeader);
    } catch (...) {
      if (counted) g_in_use.fetch_sub(counted, std::memory_order_relaxed);
      throw;
    }
    auto* h = static_cast<Header*>(base);
    h->magic = kMagic;
    h->counted = counted;
    h->size = n;
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &delete_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

  void copy_data(void* dest, const void* src, std::size_t n) const override {
    default_copy_data(dest, src, n);
  }
};

}  // namespace

extern "C" {

/* Puts the counting allocator in place of torch's CPU allocator (once per process; later calls only set the
 * limit). Returns 0, or -1 when the current CPU allocator has no raw interface to wrap. */
int gmux_cpu_limit_install(uint64_t limit) {
  static std::once_flag once;
  static int status = 0;
  std::call_once(once, [] {
    c10::Allocator* inner = c10::GetCPUAllocator();
    if (inner->raw_deleter() == nullptr) {
      status = -1;
      return;
    }
    g_inner = inner;
    // A process the job forks (a DataLoader worker) is not the job's device: it keeps counting its own blocks
    // (frees of the parent's must find their header) but is never refused.
    pthread_atfork(nullptr, nullptr, [] { g_limit.store(0, std::memory_order_relaxed); });
    // Priority above the default's (0): torch keeps the allocator with the highest priority it was given.
    c10::SetCPUAllocator(new LimitedCPUAllocator(), /*priority=*/1);
  });
  if (status == 0) g_limit.store(limit, std::memory_order_relaxed);
  return status;
}

void gmux_cpu_limit_set(uint64_t limit) { g_limit.store(limit, std::memory_order_relaxed); }

/* The words of the error: `what` names the job and its limit, `how` says how to raise it. */
void gmux_cpu_limit_text(const char* what, const char* how) {
  std::lock_guard<std::mutex> guard(g_text_lock);
  g_what = what ? what : "";
  g_how = how ? how : "";
}

/* limit, bytes in use, peak since the last reset, allocations refused. reset_peak: the peak starts again
 * from what is in use now (a report's peak is the peak since the previous report). */
void gmux_cpu_limit_stats(uint64_t out[4], int reset_peak) {
  out[0] = g_limit.load(std::memory_order_relaxed);
  out[1] = g_in_use.load(std::memory_order_relaxed);
  out[2] = g_peak.load(std::memory_order_relaxed);
  out[3] = g_refused.load(std::memory_order_relaxed);
  if (reset_peak) g_peak.store(out[1], std::memory_order_relaxed);
}

/* Bytes a pool hands the job outside torch's CPU allocator (a virtual GPU's page pool), counted like its
 * tensors: -1 (nothing counted) when they would take the job past its limit. check 0: counted whatever the
 * limit and never a new peak (storages moving into the pool, whose old memory is released just after: not
 * growth; a peak of both copies, kept by gmuxd as the job's largest, would make it look twice its size). */
int gmux_cpu_limit_claim(uint64_t n, int check) {
  if (!check) {
    g_in_use.fetch_add(n, std::memory_order_relaxed);   // no new peak: the job needs no more than before
    return 0;
  }
  uint64_t before = 0;
  return count(n, &before) ? 0 : -1;
}

void gmux_cpu_limit_release(uint64_t n) { g_in_use.fetch_sub(n, std::memory_order_relaxed); }

/* A storage allocated in a host scope that the job keeps as its own (a checkpoint's tensor that became its
 * optimizer state at a restore) is counted from now on, whatever the limit (the memory is there already);
 * `storage` is a c10::StorageImpl* (torch.UntypedStorage._cdata). Returns the bytes adopted: 0 for a storage
 * that is not this allocator's (told apart by its deleter, so no foreign memory is read) or already counted. */
uint64_t gmux_cpu_limit_adopt(void* storage) {
  if (storage == nullptr) return 0;
  const c10::DataPtr& data = static_cast<c10::StorageImpl*>(storage)->data_ptr();
  if (data.get_deleter() != &delete_block || data.get() == nullptr) return 0;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(data.get()) - kHeader);
  if (h->magic != kMagic || h->counted) return 0;
  h->counted = h->size;
  raise_peak(g_in_use.fetch_add(h->size, std::memory_order_relaxed) + h->size);
  return h->size;
}

/* Allocations by this thread between enter and leave are host memory, not counted (nests). */
void gmux_cpu_host_enter(void) { ++t_host; }
void gmux_cpu_host_leave(void) {
  if (t_host > 0) --t_host;
}

}  // extern "C"

#include "dblp/handoff/shm_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace dblp {
namespace {

struct Range {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> bytes{0};
  std::atomic<bool> hit{false};
};

Range g_ranges[ShmGuard::kMaxRanges];
struct sigaction g_previous;  // written once, before the handler is live
uintptr_t g_page = 4096;
std::mutex g_mu;  // Guard and Release; never the handler
bool g_installed = false;

// Async-signal-safe: atomics, mmap and sigaction only.
void OnBus(int sig, siginfo_t* info, void* ctx) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Range& r : g_ranges) {
    const uintptr_t b = r.base.load(std::memory_order_acquire);
    const size_t n = r.bytes.load(std::memory_order_acquire);
    if (b == 0 || addr < b || addr >= b + n) continue;
    // Every page from the fault to the range's end lies past the file's
    // new end or will fault the same way: zero pages of our own there.
    const uintptr_t page = addr & ~(g_page - 1);
    void* m = mmap(reinterpret_cast<void*>(page), b + n - page,
                   PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) break;
    r.hit.store(true, std::memory_order_release);
    return;  // the access runs again, on the zero page
  }
  // Not a guarded range: what the process did before the guard.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 &&
      g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, ctx);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default (ignoring a fault would spin on it): the access faults
  // again and ends the process as it would have without the guard.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGBUS, &dfl, nullptr);
}

bool Install(std::string* why) {
  if (g_installed) return true;
  const long page = sysconf(_SC_PAGESIZE);
  if (page > 0) g_page = static_cast<uintptr_t>(page);
  struct sigaction sa {};
  sa.sa_sigaction = OnBus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, &sa, &g_previous) != 0) {
    *why = std::string("cannot install the SIGBUS guard of the hand-off: ") +
           std::strerror(errno);
    return false;
  }
  g_installed = true;
  return true;
}

}  // namespace

bool ShmGuard::Guard(void* base, size_t bytes, std::string* why) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!Install(why)) return false;
  for (Range& r : g_ranges) {
    if (r.base.load(std::memory_order_relaxed) != 0) continue;
    r.hit.store(false, std::memory_order_relaxed);
    r.bytes.store(bytes, std::memory_order_release);
    r.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return true;
  }
  *why = "more than " + std::to_string(kMaxRanges) +
         " hand-off regions mapped in one process";
  return false;
}

void ShmGuard::Release(void* base) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (Range& r : g_ranges) {
    if (r.base.load(std::memory_order_relaxed) ==
        reinterpret_cast<uintptr_t>(base)) {
      r.base.store(0, std::memory_order_release);
      r.bytes.store(0, std::memory_order_release);
    }
  }
}

bool ShmGuard::Truncated(const void* base) {
  for (const Range& r : g_ranges) {
    if (r.base.load(std::memory_order_acquire) ==
        reinterpret_cast<uintptr_t>(base)) {
      return r.hit.load(std::memory_order_acquire);
    }
  }
  return false;
}

}  // namespace dblp

#include "dblp/base/idle_backoff.h"

#include <time.h>

#include <algorithm>
#include <thread>

namespace dblp {

void IdleBackoff::SpinOnce() const {
  if (spin_ == Spin::kYield) {
    std::this_thread::yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void IdleBackoff::Idle() {
  if (empty_ < spin_polls_ || max_sleep_us_ == 0) {
    if (empty_ < spin_polls_) ++empty_;
    SpinOnce();
    return;
  }
  // nanosleep, not a busy delay: the point is to give the core away.
  const timespec ts{0, static_cast<long>(sleep_us_) * 1000};
  nanosleep(&ts, nullptr);
  ++sleeps_;
  idle_us_ += sleep_us_;
  sleep_us_ = std::min(sleep_us_ * 2, deep_.Cap(idle_us_, max_sleep_us_));
}

}  // namespace dblp

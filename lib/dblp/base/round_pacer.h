// The pace of a poll loop: its idle back-off (idle_backoff.h) and its
// no-progress watchdog, for every transport's loops (the DPDK lcores, the
// kernel-UDP threads). The loop reads its clock once per turn and passes
// it in. With several lcores on one job the watchdog is the job's
// (`shared_progress`): an lcore whose shard has nothing to do is not stuck
// while another makes progress.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "dblp/base/deep_idle.h"
#include "dblp/base/idle_backoff.h"

namespace dblp {

class RoundPacer {
 public:
  enum class Step : uint8_t { kContinue, kTimedOut, kQuit };
  // `quit` (may be null): a signal ends the loop. `shared_progress` (may
  // be null): the job's latest progress, every lcore's.
  RoundPacer(uint32_t idle_spin, uint32_t idle_sleep_us, uint32_t timeout_ms,
             const std::atomic<bool>* quit,
             std::atomic<uint64_t>* shared_progress = nullptr,
             DeepIdle deep_idle = {},
             IdleBackoff::Spin spin = IdleBackoff::Spin::kPause)
      : backoff_(idle_spin, idle_sleep_us, deep_idle, spin),
        timeout_ns_(uint64_t{timeout_ms} * 1000000),
        timeout_ms_(timeout_ms),
        quit_(quit),
        shared_(shared_progress) {}
  // A wait begins: the watchdog counts from `now_ns`.
  void Start(uint64_t now_ns) {
    Progress(now_ns);
    last_turn_ = now_ns;
  }
  // After one loop turn. `work` (anything received, sent or handled) ends
  // the back-off; `progress` (what moves the round: the sides' progress(),
  // send_side.h and receive_side.h) feeds the watchdog, so a loop that
  // only retries, resends into a dead link or hears strangers still times
  // out.
  //
  // `patience`: how many timeouts this wait may take. A worker whose own
  // sides are done and that waits for the server to open the next round
  // passes 2: the server may wait one whole timeout for another, silent
  // worker before it goes on without it (--on_worker_loss=continue) or
  // ends the job naming it (abort) — neither is this worker's stall.
  //
  // A turn that comes a whole timeout after the one before it means this
  // process did not run (SIGSTOP, a debugger, a starved host): the silence
  // it would time out on is its own, and its peers (a server's ERROR in
  // the control socket) get a timeout from now to be heard.
  Step After(bool work, bool progress, uint64_t now_ns, uint32_t patience = 1) {
    patience_ = patience;
    if (now_ns > last_turn_ && now_ns - last_turn_ > timeout_ns_) {
      last_progress_ = now_ns;  // not published: no other lcore moved
    }
    last_turn_ = now_ns;
    if (progress) Progress(now_ns);
    if (quit_ != nullptr && quit_->load(std::memory_order_relaxed)) {
      return Step::kQuit;
    }
    if (!progress && Expired(now_ns)) return Step::kTimedOut;
    if (work) {
      backoff_.Work();
    } else {
      backoff_.Idle();
    }
    return Step::kContinue;
  }
  uint32_t timeout_ms() const { return timeout_ms_; }
  // The limit of the last wait that timed out (timeout_ms × patience).
  uint32_t limit_ms() const { return timeout_ms_ * patience_; }
  uint64_t sleeps() const { return backoff_.sleeps(); }

 private:
  bool Expired(uint64_t now_ns) const {
    uint64_t last = last_progress_;
    if (shared_ != nullptr) {
      last = std::max(last, shared_->load(std::memory_order_relaxed));
    }
    // Another lcore's progress may be stamped after our `now_ns`.
    return now_ns > last && now_ns - last > timeout_ns_ * patience_;
  }
  void Progress(uint64_t now_ns) {
    // The shared line is written at most once a millisecond.
    if (shared_ != nullptr && now_ns - last_published_ > 1000000) {
      shared_->store(now_ns, std::memory_order_relaxed);
      last_published_ = now_ns;
    }
    last_progress_ = now_ns;
  }

  IdleBackoff backoff_;
  uint64_t timeout_ns_;
  uint32_t timeout_ms_;
  const std::atomic<bool>* quit_;
  std::atomic<uint64_t>* shared_;  // every lcore of the job: relaxed
  uint64_t last_progress_ = 0;
  uint64_t last_published_ = 0;
  uint64_t last_turn_ = 0;  // the last After's (or Start's) now_ns
  uint32_t patience_ = 1;
};

}  // namespace dblp

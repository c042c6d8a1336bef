// What the kernel-UDP engines (udp_job_server.cc, udp_job_worker.cc) share
// besides the round sides: the queues between a datapath thread and its
// control sidecar, the idle back-off, the no-progress watchdog, option
// checks and the run report's end. Internal to src/udp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dblp/base/deep_idle.h"
#include "dblp/base/idle_backoff.h"
#include "dblp/base/round_pacer.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/round_events.h"
#include "dblp/wire/chunking.h"

namespace dblp::udp {

inline constexpr uint32_t kServerEndpoint = 0;
inline constexpr uint16_t kRxBurst = 64;
// UDP payload of an MTU-sized IPv4 datagram: the largest frame we expect.
inline constexpr uint32_t kIpUdpHeaders = kIpv4HeaderBytes + kUdpHeaderBytes;

inline uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Multi-producer, single-consumer queue of typed messages (ControlRequest
// or DatapathEvent, by value) between the sidecar and the datapath. The
// consumer polls it every loop turn, so Drain first checks an atomic flag
// and locks only when something was pushed: an idle check is one load.
template <class T>
class EventQueue {
 public:
  void Push(const T& e) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(e);
    pending_.store(true, std::memory_order_release);
  }
  // Moves everything queued into *out (cleared first); false if empty.
  bool Drain(std::vector<T>* out) {
    out->clear();
    if (!pending_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(items_, *out);
    pending_.store(false, std::memory_order_relaxed);
    return !out->empty();
  }

 private:
  std::mutex mu_;
  std::vector<T> items_;
  std::atomic<bool> pending_{false};
};

// The datapath's outbox (the sides' ControlOutbox): queues a request and
// wakes the sidecar, which sends it.
class Outbox {
 public:
  Outbox(EventQueue<ControlRequest>* queue, ControlSidecar* sidecar)
      : queue_(queue), sidecar_(sidecar) {}
  void Post(const ControlRequest& r) {
    queue_->Push(r);
    sidecar_->Wakeup();
  }

 private:
  EventQueue<ControlRequest>* queue_;
  ControlSidecar* sidecar_;
};

// Checked before any socket opens, so a bad CPU fails fast on both sides.
bool CheckCpu(int cpu, std::string* error);
bool PinThisThread(int cpu, std::string* error);
// The MTU and the round timeout, as every engine takes them; "" if good.
std::string CheckCommon(uint32_t mtu, uint32_t round_timeout_ms);

// A result with exit code `code` and the error `msg`.
template <class Result>
Result Failed(Result* res, int code, const std::string& msg) {
  res->exit_code = code;
  res->error = msg;
  return *res;
}

// Waits (polling) for `done` or the timeout; true if done.
template <class F>
bool WaitFor(F done, uint32_t timeout_ms) {
  const uint64_t end = NowNs() + uint64_t{timeout_ms} * 1000000;
  while (!done()) {
    if (NowNs() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Ends a run's report: summary.json next to the streamed rows, with every
// counter. A row or a summary that could not be written fails a run that
// had not failed already (its results are incomplete).
template <class Result>
void FinishReport(RowStream& stream, RunReport report, Result* res) {
  report.counters.assign(res->counters.begin(), res->counters.end());
  const std::string err = CloseRunReport(stream, report);
  if (!err.empty() && res->exit_code == 0) {
    res->exit_code = 1;
    res->error = err;
  }
}

}  // namespace dblp::udp

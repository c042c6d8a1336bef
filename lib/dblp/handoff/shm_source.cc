#include "dblp/handoff/shm_source.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "dblp/handoff/shm_channel.h"

namespace dblp {
namespace {

constexpr uint32_t kSliceMs = 100;

class ShmSource final : public GradientSource {
 public:
  ShmSource(ShmChannel ch, uint32_t idle_timeout_ms)
      : ch_(std::move(ch)), idle_timeout_ms_(idle_timeout_ms) {
    seen_posts_ = ch_.header().to_worker.load(std::memory_order_acquire);
  }
  // Only a worker that joined speaks for the job: one that failed before
  // (a bad flag, no server) leaves the state to whoever can say why.
  ~ShmSource() override {
    if (joined_ && !failed_) ch_.SetWorkerState(ShmWorkerState::kDone);
  }

  std::vector<LayerInfo> Layers() const override {
    if (std::string why = ch_.LayerTableChanged(); !why.empty()) {
      throw std::runtime_error(why);
    }
    std::vector<LayerInfo> out;
    for (const ShmLayer& l : ch_.layers()) {
      out.push_back(
          LayerInfo{std::string(l.name, strnlen(l.name, sizeof(l.name))),
                    {static_cast<int64_t>(l.floats)}});
    }
    return out;
  }
  uint64_t floats() const override { return ch_.floats(); }
  std::string Describe() const override {
    return "trainer pid " + std::to_string(ch_.trainer_pid()) + " over " +
           ch_.name() + " (" + std::to_string(floats()) + " floats)";
  }

  void Bind(uint32_t rank, uint32_t num_workers) override {
    ch_.header().rank = rank;
    ch_.header().num_workers = num_workers;
  }
  void OnJobStart(uint32_t resync_every) override {
    ch_.header().resync_every = resync_every;
    resync_every_ = resync_every;
    joined_ = true;
    ch_.SetWorkerState(ShmWorkerState::kJoined);
  }
  bool Unbounded() const override { return true; }

  bool AwaitIteration(uint64_t it, bool resync,
                      const GoneCheck& gone) override {
    ShmHeader& h = ch_.header();
    const uint64_t start = MonotonicNs();
    while (!ShmChannel::WaitChange(h.to_worker, seen_posts_, kSliceMs)) {
      // The pid claimed at Open, never the shared one: a trainer that
      // rewrote it (say to 1) and exited is still noticed.
      if (!ProcessAlive(ch_.trainer_pid())) {
        throw std::runtime_error("the trainer (pid " +
                                 std::to_string(ch_.trainer_pid()) +
                                 ") exited in the middle of the job");
      }
      if (std::string why = ch_.Truncated(); !why.empty()) {
        throw std::runtime_error(why);
      }
      if (std::string why = gone ? gone() : std::string(); !why.empty()) {
        throw std::runtime_error(why +
                                 ", while this worker waited for its "
                                 "trainer's input for iteration " +
                                 std::to_string(it));
      }
      if (idle_timeout_ms_ != 0 &&
          MonotonicNs() - start > uint64_t{idle_timeout_ms_} * 1'000'000) {
        throw std::runtime_error(
            "the trainer posted nothing for iteration " + std::to_string(it) +
            " in " + std::to_string(idle_timeout_ms_) +
            " ms (raise --shm_idle_timeout_ms if its steps take longer)");
      }
    }
    seen_posts_ = h.to_worker.load(std::memory_order_acquire);
    if (std::string why = ch_.Truncated(); !why.empty()) {
      throw std::runtime_error(why);
    }
    if (std::string why = ch_.LayerTableChanged(); !why.empty()) {
      throw std::runtime_error(why);
    }
    h.info = ShmIterationInfo{};
    h.info.trainer_post_ns = h.post_ns;
    h.info.worker_wake_ns = MonotonicNs();
    const auto kind = static_cast<ShmPost>(h.post_kind);
    if (kind == ShmPost::kEnd) return false;
    if (kind == ShmPost::kAbort) {
      throw std::runtime_error(
          "its trainer ended on an error before iteration " +
          std::to_string(it) + ": " +
          std::string(h.error, strnlen(h.error, sizeof(h.error))));
    }
    const ShmPost want = resync ? ShmPost::kModel : ShmPost::kGradient;
    const uint64_t posted = h.post_iteration;
    if (kind != want || posted != it) {
      std::string why = "the trainer posted " + KindName(kind) +
                        " for iteration " + std::to_string(posted) +
                        " where iteration " + std::to_string(it) + " needs " +
                        KindName(want);
      if (kind == ShmPost::kGradient && want == ShmPost::kModel) {
        why += " (the server re-synchronises every " +
               std::to_string(resync_every_) +
               " steps: give dblp.Worker the model, or run the server with "
               "--resync_every=0)";
      } else {
        why +=
            " (a trainer out of step: one dblp.Worker per process, "
            "every exchange waited for)";
      }
      throw std::runtime_error(why);
    }
    return true;
  }

  void Compute(uint64_t, std::span<float> grad) override { Take(grad); }
  void ExportModel(std::span<float> out) override { Take(out); }
  void Observe(const IterationRecord& r) override {
    ShmIterationInfo& i = ch_.header().info;
    i.iteration = r.iteration;
    i.delivered_fraction = r.delivered_fraction;
    i.p = r.p;
    i.send_latency_us = r.send_latency_us;
    i.bcast_latency_us = r.bcast_latency_us;
    i.control_rtt_us = r.control_rtt_us;
    i.packets_sent = r.packets_sent;
    i.passes = r.passes;
    i.critical = r.critical;
    i.resync = r.resync;
    i.burst = r.burst;
  }
  void Apply(uint64_t, std::span<const float> mean) override { Give(mean); }
  void ImportModel(std::span<const float> model) override { Give(model); }
  void Fail(const std::string& why) override {
    failed_ = true;
    ch_.SetFailed(why);
  }
  std::span<float> SharedGradient() override { return ch_.gradient(); }
  std::span<float> SharedMean() override { return ch_.mean(); }

 private:
  static std::string KindName(ShmPost k) {
    switch (k) {
      case ShmPost::kGradient:
        return "a gradient";
      case ShmPost::kModel:
        return "its parameters";
      case ShmPost::kEnd:
        return "the end";
      case ShmPost::kAbort:
        return "an abort";
      default:
        return "an unknown post (" + std::to_string(static_cast<int>(k)) + ")";
    }
  }
  // The engine normally works in the shared buffers themselves; a caller
  // with its own buffer gets a copy.
  void Take(std::span<float> dst) {
    const std::span<float> src = ch_.gradient();
    if (dst.data() != src.data()) {
      std::copy_n(src.data(), std::min(src.size(), dst.size()), dst.data());
    }
  }
  void Give(std::span<const float> src) {
    // The push of this iteration read the cut part as zeros: it ends here,
    // before the trainer takes a mean as if nothing happened.
    if (std::string why = ch_.Truncated(); !why.empty()) {
      throw std::runtime_error(why);
    }
    const std::span<float> dst = ch_.mean();
    if (dst.data() != src.data()) {
      std::copy_n(src.data(), std::min(src.size(), dst.size()), dst.data());
    }
    ch_.PostToTrainer();
  }

  ShmChannel ch_;
  uint32_t idle_timeout_ms_;
  uint32_t seen_posts_ = 0;
  uint32_t resync_every_ = 0;
  bool joined_ = false;
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<GradientSource> OpenShmSource(const std::string& name,
                                              uint32_t idle_timeout_ms) {
  return std::make_unique<ShmSource>(ShmChannel::Open(name), idle_timeout_ms);
}

}  // namespace dblp

// What a worker does with its model around each exchange, over any
// transport (dblp-worker, dblp-udp-worker, the simulator): before the push, the gradient
// (plus what push feedback carries) or, in a re-synchronisation iteration,
// the parameters; after the broadcast, the fill of what it missed, then the
// optimizer step on the mean or the load of the average model. The engine
// moves the bytes, this decides what they mean.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/push_feedback.h"
#include "dblp/policy/resync.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {

// What the model needs of a worker's control plane: the server's ACCEPTED
// for a push round (push feedback), and whether the server is gone.
template <class C>
concept AcceptedChannel = requires(C c, uint32_t round, Bitmap* out) {
  { c.TakeAccepted(round, out) } -> std::same_as<bool>;
  { c.server_gone() } -> std::same_as<bool>;
  { c.failure() } -> std::convertible_to<std::string>;
};

class WorkerModel {
 public:
  // Why `source` cannot back a model ("" if it can): buffers it shares
  // that do not hold its gradient.
  static std::string CheckSource(GradientSource& source);
  // Why this worker's broadcast fill cannot serve the job `wel` describes
  // ("" if it can), naming the fix.
  static std::string CheckBroadcastFill(const WelcomeMsg& wel,
                                        FillMode bcast_fill);
  // `wel` says whether the job re-synchronises and uses push feedback.
  WorkerModel(GradientSource& source, const WelcomeMsg& wel,
              const ChunkLayout& layout, FillMode bcast_fill);

  // Protocol iterations that run `steps` training steps.
  uint64_t iterations(uint64_t steps) const {
    return resync_.ProtocolIterations(steps);
  }
  bool IsResync(uint64_t it) const { return resync_.IsResync(it); }
  // The source's shared buffers when it has them (a trainer's shm: no
  // copy), else our own.
  std::span<float> grad() { return grad_; }  // what the push sends
  std::span<float> avg() { return avg_; }    // where the broadcast lands

  // Before the push of iteration `it`: waits for the source's input (a
  // trainer may end the job here: *more = false; `gone` ends the wait when
  // the server is gone), then fills grad(). Returns why it failed, or "".
  std::string Prepare(uint64_t it, bool* more,
                      const GradientSource::GoneCheck& gone);
  // After the broadcast of iteration `it`, `arrived` being its chunks:
  // settles push feedback (waiting up to timeout_ms for ACCEPTED), then
  // steps the optimizer or loads the average. Returns why it failed, or "".
  template <AcceptedChannel Control>
  std::string Absorb(uint64_t it, Control& control, const Bitmap& arrived,
                     uint32_t timeout_ms) {
    if (resync_.IsResync(it)) return LoadAverageModel(it, arrived);
    if (feedback_) {
      const std::string why = SettleFeedback(it, control, timeout_ms);
      if (!why.empty()) return why;
    }
    return ApplyMean(it, arrived);
  }

 private:
  template <AcceptedChannel Control>
  std::string SettleFeedback(uint64_t it, Control& control,
                             uint32_t timeout_ms);
  std::string SettleWith(const Bitmap& accepted);
  std::string ApplyMean(uint64_t it, const Bitmap& arrived);
  std::string LoadAverageModel(uint64_t it, const Bitmap& arrived);

  GradientSource& source_;
  ChunkLayout layout_;
  FillMode bcast_fill_;
  ResyncSchedule resync_;
  std::unique_ptr<PushFeedback> feedback_;  // null without push feedback
  std::vector<float> own_grad_, own_avg_;
  std::span<float> grad_, avg_;
  std::vector<float> prev_avg_;  // only for --bcast_fill=prev
};

// The server sends ACCEPTED as soon as the push closed, but a broadcast that
// arrives complete can end before it is read: wait for it, bounded.
template <AcceptedChannel Control>
std::string WorkerModel::SettleFeedback(uint64_t it, Control& control,
                                        uint32_t timeout_ms) {
  Bitmap accepted;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!control.TakeAccepted(PushRound(it), &accepted)) {
    if (control.server_gone()) {
      return "the server is gone: " + std::string(control.failure());
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return "no ACCEPTED from the server for the push of iteration " +
             std::to_string(it) + " in " + std::to_string(timeout_ms) +
             " ms (--push_feedback needs a server and workers of the same "
             "build)";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return SettleWith(accepted);
}

}  // namespace dblp

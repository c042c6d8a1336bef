// What a dblp-worker does with its model around each exchange: before the
// push, the gradient (plus what push feedback carries) or, in a
// re-synchronisation iteration, the parameters; after the broadcast, the
// optimizer step on the mean or the load of the average model. No DPDK: the
// engine moves the bytes, this decides what they mean.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "dblp/control/control.h"
#include "dblp/handoff/gradient_source.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/push_feedback.h"
#include "dblp/policy/resync.h"

namespace dblp {

class WorkerControl;

class WorkerModel {
 public:
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
  // trainer may end the job here: *more = false), then fills grad().
  // Returns why it failed, or "".
  std::string Prepare(uint64_t it, bool* more);
  // After the broadcast of iteration `it`, `arrived` being its chunks:
  // settles push feedback (waiting up to timeout_ms for ACCEPTED), then
  // steps the optimizer or loads the average. Returns why it failed, or "".
  std::string Absorb(uint64_t it, WorkerControl& control, const Bitmap& arrived,
                     uint32_t timeout_ms);
  // The iteration's buffers for the tests (dblp-worker --dump_dir).
  void Dump(const std::string& base, uint64_t it, const Bitmap& arrived);

 private:
  std::string SettleFeedback(uint64_t it, WorkerControl& control,
                             uint32_t timeout_ms);
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

}  // namespace dblp

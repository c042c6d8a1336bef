// The worker's job, written once for every transport (dblp-worker's DPDK
// lcore, dblp-udp-worker's thread): each iteration the model's input
// (WorkerModel::Prepare), the push order, the exchange (the transport's:
// await the server's ROUND_BEGIN, push until STOP, receive the mean until
// our STOP), the row (the trainer reads it with the mean, so it goes
// first), the mean absorbed (fill, push feedback, resync, optimizer step),
// and the row on disk before the next iteration.
#pragma once

#include <concepts>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dblp/handoff/gradient_source.h"
#include "dblp/job/rows.h"
#include "dblp/job/worker_model.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/send_order.h"

namespace dblp {

// What a test seam (src/test_hooks/dumps.h) sees of each absorbed
// iteration: what was pushed, the mean as the model took it, its chunks.
struct AbsorbedView {
  uint64_t it = 0;
  uint32_t rank = 0;
  bool resync = false;
  std::span<const float> pushed;
  std::span<const float> mean;
  const Bitmap* arrived = nullptr;
  GradientSource* source = nullptr;
};
using AbsorbedObserver = std::function<void(const AbsorbedView&)>;

// The exchange of one iteration, as a transport runs it.
template <class T>
concept WorkerExchanger = requires(T t, uint64_t it,
                                   std::span<const uint32_t> order) {
  // Waits for the push's ROUND_BEGIN, pushes in `order` until STOP and
  // (unless push only) receives the mean until our STOP. "" or why not.
  { t.Exchange(it, order) } -> std::convertible_to<std::string>;
  // The row's inputs (the job sets `resync`).
  { t.Exchanged(it) } -> std::same_as<WorkerExchange>;
  // The broadcast's chunks that arrived.
  { t.arrived() } -> std::convertible_to<const Bitmap&>;
};

struct WorkerJobSettings {
  FillMode bcast_fill = FillMode::kZero;
  SendOrderKind send_order = kDefaultSendOrder;
  uint64_t seed = 1;
  bool push_only = false;        // the push bench: no mean to absorb
  uint32_t timeout_ms = 30000;   // how long ACCEPTED may lag the broadcast
  AbsorbedObserver on_absorbed;  // test seam; empty in production
};

class WorkerJob {
 public:
  // Why the job `wel` describes cannot run on `source` with `s` ("" if it
  // can): shared buffers that do not hold the gradient, a broadcast fill
  // the broadcast cannot serve.
  static std::string Check(GradientSource& source, const WelcomeMsg& wel,
                           const WorkerJobSettings& s);
  WorkerJob(GradientSource& source, const WelcomeMsg& wel,
            const ChunkLayout& layout, const WorkerJobSettings& s);

  // The protocol iterations of `steps` training steps (a trainer-fed
  // source ends the job itself: unbounded).
  uint64_t iterations(uint64_t steps) const {
    return source_.Unbounded() ? UINT64_MAX : model_.iterations(steps);
  }
  // Iteration `it` over `t`; *more = false when the trainer ended the
  // job. Returns why it failed, or "".
  template <WorkerExchanger T, AcceptedChannel Control>
  std::string Iterate(uint64_t it, T& t, Control& control, bool* more);

  WorkerModel& model() { return model_; }
  const IterationRecord& last_row() const { return rows_.back(); }
  std::vector<IterationRecord>& rows() { return rows_; }
  void set_row_stream(RowStream* s) { stream_ = s; }

 private:
  std::string Observe(uint64_t it, const IterationRecord& row);
  // "" or why the job ends: the row could not be written
  // (--rows_on_error=fail).
  std::string Keep(uint64_t it, const IterationRecord& row,
                   const Bitmap& arrived);

  GradientSource& source_;
  const WelcomeMsg wel_;
  const ChunkLayout layout_;
  const WorkerJobSettings s_;
  WorkerModel model_;
  SendOrder order_;
  std::vector<uint32_t> order_buf_;
  std::vector<double> chunk_norms_;  // OrderByMagnitude's scratch
  // The magnitude order only matters where a round can stop short of
  // every chunk: under "reliable" every chunk arrives whatever the order,
  // and the ranking (a pass over the gradient and a sort of its chunks:
  // about 2.5 ms a 25 MiB push here, docs/BENCHMARKS.md "The whole
  // exchange")
  // would only delay the first frame.
  bool rank_by_magnitude_;
  std::vector<IterationRecord> rows_;
  RowStream* stream_ = nullptr;
};

template <WorkerExchanger T, AcceptedChannel Control>
std::string WorkerJob::Iterate(uint64_t it, T& t, Control& control,
                               bool* more) {
  // A trainer may keep us waiting; a server that is gone meanwhile ends
  // the wait, named (the failure says which server and why).
  const auto gone = [&control]() -> std::string {
    if (!control.server_gone()) return "";
    return "the server is gone (" + std::string(control.failure()) + ")";
  };
  if (std::string e = model_.Prepare(it, more, gone); !e.empty() || !*more) {
    return e;
  }
  order_.Fill(PushRound(it), layout_.num_chunks(), order_buf_);
  // A resync pushes parameters, reliably: their size means nothing.
  if (rank_by_magnitude_ && !model_.IsResync(it)) {
    OrderByMagnitude(model_.grad(), layout_, order_buf_, chunk_norms_);
  }
  if (std::string e = t.Exchange(it, order_buf_); !e.empty()) return e;
  WorkerExchange x = t.Exchanged(it);
  x.resync = model_.IsResync(it);
  const IterationRecord row = WorkerRow(x);
  if (std::string e = Observe(it, row); !e.empty()) return e;
  const Bitmap& arrived = t.arrived();
  if (!s_.push_only) {
    if (std::string e = model_.Absorb(it, control, arrived, s_.timeout_ms);
        !e.empty()) {
      return e;
    }
  }
  return Keep(it, row, arrived);
}

}  // namespace dblp

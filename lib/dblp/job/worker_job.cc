#include "dblp/job/worker_job.h"

namespace dblp {

std::string WorkerJob::Check(GradientSource& source, const WelcomeMsg& wel,
                             const WorkerJobSettings& s) {
  if (std::string e = WorkerModel::CheckSource(source); !e.empty()) return e;
  return WorkerModel::CheckBroadcastFill(wel, s.bcast_fill);
}

WorkerJob::WorkerJob(GradientSource& source, const WelcomeMsg& wel,
                     const ChunkLayout& layout, const WorkerJobSettings& s)
    : source_(source),
      wel_(wel),
      layout_(layout),
      s_(s),
      model_(source, wel, layout, s.bcast_fill),
      order_(s.send_order, wel.rank, wel.num_workers, s.seed),
      rank_by_magnitude_(s.send_order == SendOrderKind::kMagnitude &&
                         wel.policy != "reliable") {}

// The trainer reads the row with the mean, so it goes first.
std::string WorkerJob::Observe(uint64_t it, const IterationRecord& row) {
  try {
    source_.Observe(row);
  } catch (const std::exception& e) {
    return "iteration " + std::to_string(it) +
           ": the gradient source refused the row: " + e.what();
  }
  return "";
}

std::string WorkerJob::Keep(uint64_t it, const IterationRecord& row,
                            const Bitmap& arrived) {
  if (s_.on_absorbed && !s_.push_only) {
    s_.on_absorbed(AbsorbedView{it, wel_.rank, model_.IsResync(it),
                                model_.grad(), model_.avg(), &arrived,
                                &source_});
  }
  rows_.push_back(row);
  // On disk before the next iteration: a kill -9 keeps it.
  if (stream_ == nullptr) return "";
  stream_->Append(row);
  return stream_->failed() ? stream_->error() : "";
}

}  // namespace dblp

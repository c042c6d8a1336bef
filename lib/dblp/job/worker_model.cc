#include "dblp/job/worker_model.h"

#include <algorithm>
#include <exception>

namespace dblp {

std::string WorkerModel::CheckSource(GradientSource& source) {
  const size_t n = source.floats();
  const size_t g = source.SharedGradient().size();
  const size_t m = source.SharedMean().size();
  if ((g != 0 && g != n) || (m != 0 && m != n)) {
    return "the gradient source shares buffers of " + std::to_string(g) +
           " and " + std::to_string(m) + " floats for a gradient of " +
           std::to_string(n);
  }
  return "";
}

// A consistent broadcast carries what it does not send; filling those
// chunks from the previous mean would count them twice.
std::string WorkerModel::CheckBroadcastFill(const WelcomeMsg& wel,
                                            FillMode bcast_fill) {
  if (!wel.consistent_broadcast || bcast_fill != FillMode::kPrevious) {
    return "";
  }
  return "the server runs --bcast_tolerance=consistent: it carries the "
         "chunks it does not send, and --bcast_fill=prev would count them "
         "twice; run this worker with --bcast_fill=zero";
}

WorkerModel::WorkerModel(GradientSource& source, const WelcomeMsg& wel,
                         const ChunkLayout& layout, FillMode bcast_fill)
    : source_(source),
      layout_(layout),
      bcast_fill_(bcast_fill),
      resync_(wel.resync_every) {
  const uint64_t n = source.floats();
  grad_ = source.SharedGradient();
  avg_ = source.SharedMean();
  if (grad_.size() != n) {
    own_grad_.assign(n, 0.0f);
    grad_ = own_grad_;
  }
  if (avg_.size() != n) {
    own_avg_.assign(n, 0.0f);
    avg_ = own_avg_;
  }
  if (bcast_fill == FillMode::kPrevious) prev_avg_.assign(n, 0.0f);
  if (wel.push_feedback) feedback_ = std::make_unique<PushFeedback>(layout);
}

std::string WorkerModel::Prepare(uint64_t it, bool* more,
                                 const GradientSource::GoneCheck& gone) {
  *more = true;
  try {
    if (!source_.AwaitIteration(it, resync_.IsResync(it), gone)) {
      *more = false;
      return "";
    }
    if (resync_.IsResync(it)) {
      source_.ExportModel(grad_);
    } else {
      source_.Compute(resync_.TrainStep(it), grad_);
      if (feedback_) feedback_->AddCarried(grad_);
    }
  } catch (const std::exception& e) {
    return "computing the gradient of iteration " + std::to_string(it) + ": " +
           e.what();
  }
  return "";
}

std::string WorkerModel::ApplyMean(uint64_t it, const Bitmap& arrived) {
  FillMissing(avg_, arrived, layout_, bcast_fill_, prev_avg_);
  try {
    source_.Apply(resync_.TrainStep(it), avg_);
  } catch (const std::exception& e) {
    return "applying the mean of iteration " + std::to_string(it) + ": " +
           e.what();
  }
  // A copy of the whole mean: only where the next fill needs it.
  if (bcast_fill_ == FillMode::kPrevious) {
    std::copy(avg_.begin(), avg_.end(), prev_avg_.begin());
  }
  return "";
}

std::string WorkerModel::SettleWith(const Bitmap& accepted) {
  try {
    feedback_->Settle(accepted, grad_);
  } catch (const std::exception& e) {
    return std::string("the server's ACCEPTED does not fit this push: ") +
           e.what();
  }
  return "";
}

// A resync iteration's broadcast is reliable: loading less than the whole
// average would leave a model made of two.
std::string WorkerModel::LoadAverageModel(uint64_t it, const Bitmap& arrived) {
  if (arrived.MissingCount() != 0) {
    return "resync iteration " + std::to_string(it) +
           ": the average model arrived with " +
           std::to_string(arrived.MissingCount()) + " of " +
           std::to_string(arrived.size()) +
           " chunks missing (its broadcast must be reliable: run the server "
           "and the workers from the same build)";
  }
  try {
    source_.ImportModel(avg_);
  } catch (const std::exception& e) {
    return "loading the average model of iteration " + std::to_string(it) +
           ": " + e.what();
  }
  return "";
}

}  // namespace dblp

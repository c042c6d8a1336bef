#include "dblp/policy/clr_detector.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dblp {

void ValidateClrParams(const ClrParams& params) {
  if (params.freq < 1) {
    throw std::invalid_argument(
        "--clr_freq must be >= 1 (iterations between two CLR checks), got " +
        std::to_string(params.freq) + ": the DBLP paper uses 10");
  }
  if (!std::isfinite(params.eta) || params.eta <= 0) {
    throw std::invalid_argument(
        "--clr_eta must be a finite number > 0 (relative change of the "
        "gradient norm that signals a critical regime), got " +
        std::to_string(params.eta) + ": the DBLP paper uses 0.5");
  }
}

ClrDetector::ClrDetector(const ClrParams& params) : params_(params) {
  ValidateClrParams(params_);
}

void ClrDetector::Set(bool critical) {
  if (critical != critical_) ++switches_;
  critical_ = critical;
}

bool ClrDetector::Observe(uint64_t iteration, double grad_norm) {
  const bool is_check = iteration % params_.freq == params_.freq - 1;
  // `!(x >= 0)` also catches NaN, which compares false with everything.
  const bool valid = std::isfinite(grad_norm) && grad_norm >= 0;
  if (!valid) {
    // A broken gradient says nothing about the regime; losing chunks of a
    // model that is already in trouble is the worse mistake, so go critical.
    ++nonfinite_;
    if (is_check) {
      ++checks_;
      last_relative_change_ = std::numeric_limits<double>::quiet_NaN();
    }
    Set(true);
    return critical_;
  }
  if (!is_check) return critical_;

  ++checks_;
  if (!has_reference_) {
    // Nothing to compare with yet: stay on the safe side for one window.
    last_relative_change_ = std::numeric_limits<double>::quiet_NaN();
    Set(true);
  } else {
    double rel;
    if (reference_norm_ == 0) {
      rel = grad_norm == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    } else {
      rel = std::fabs(reference_norm_ - grad_norm) / reference_norm_;
    }
    last_relative_change_ = rel;
    Set(rel >= params_.eta);
  }
  has_reference_ = true;
  reference_norm_ = grad_norm;
  return critical_;
}

}  // namespace dblp

// The STOP decision: when does a receiver tell the sender to stop sending?
//
// DBLP/MLT: as soon as at least ceil((1 - p) * N) of the round's N chunks have
// arrived, where p is the round's *current* bounded-loss tolerance.
// LTP (early close): also when the round's deadline has passed and at least
// a floor fraction of chunks has arrived.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dblp {

// Fewest chunks out of `n` that satisfy tolerance `p`: ceil((1 - p) * n).
// Computed as n - floor(p * n) with a small epsilon so that e.g. p = 0.008,
// n = 1000 gives 992 (not 993 from (1 - 0.008) * 1000 = 992.0000000000001).
inline uint32_t StopThreshold(uint32_t n, double p) {
  if (!(p >= 0.0 && p < 1.0)) {
    throw std::invalid_argument("loss tolerance p=" + std::to_string(p) +
                                " must be in [0, 1)");
  }
  const double allowed = std::floor(p * static_cast<double>(n) + 1e-9);
  const uint32_t missing_allowed = static_cast<uint32_t>(allowed);
  const uint32_t t = n - (missing_allowed < n ? missing_allowed : n);
  return t == 0 && n > 0 ? 1 : t;  // a round always needs one chunk
}

// Fewest chunks out of `n` that make a `fraction` of them: ceil(fraction*n),
// with the same epsilon guard against floating-point representation error.
inline uint32_t FractionFloor(uint32_t n, double fraction) {
  if (!(fraction > 0)) return 0;
  if (fraction >= 1) return n;
  return static_cast<uint32_t>(std::ceil(fraction * n - 1e-9));
}

enum class StopTrigger : uint8_t { kNone = 0, kThreshold, kDeadline };

struct StopRule {
  uint32_t threshold = 0;    // chunks that end the round (from p)
  uint64_t deadline_ns = 0;  // absolute; 0 = no deadline
  uint32_t deadline_floor = 0;  // chunks needed before a deadline may close

  StopTrigger Evaluate(uint32_t received, uint64_t now_ns) const {
    if (received >= threshold) return StopTrigger::kThreshold;
    if (deadline_ns != 0 && now_ns >= deadline_ns &&
        received >= deadline_floor) {
      return StopTrigger::kDeadline;
    }
    return StopTrigger::kNone;
  }
};

}  // namespace dblp

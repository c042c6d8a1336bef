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

// Fewest chunks out of `n` that satisfy tolerance `p`: ceil((1 - p) * n),
// i.e. n minus the floor(p * n) chunks the round may lose. The relative nudge
// absorbs the rounding of decimal p values (0.29 * 100 = 28.999999999999996,
// 0.008 * 1000 must allow 8) and is far below any step a real n can express.
// A non-empty round always needs at least one chunk. Throws
// std::invalid_argument unless p is in [0, 1).
inline uint32_t StopThreshold(uint32_t n, double p) {
  if (!(p >= 0.0 && p < 1.0)) {
    throw std::invalid_argument("loss tolerance p=" + std::to_string(p) +
                                " must be in [0, 1)");
  }
  if (n == 0) return 0;
  const double allowed = std::floor(p * n * (1 + 1e-12));
  const uint32_t missing_ok =
      allowed >= n ? n - 1 : static_cast<uint32_t>(allowed);
  return n - missing_ok;
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

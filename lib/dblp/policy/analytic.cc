#include "dblp/policy/analytic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "dblp/base/rng.h"
#include "dblp/policy/tolerance.h"

namespace dblp {
namespace {

void CheckRate(const char* what, double v) {
  if (!std::isfinite(v) || v < 0 || v >= 1) {
    throw std::invalid_argument(std::string(what) +
                                " must be a finite number in [0, 1), got " +
                                std::to_string(v));
  }
}

// Smallest k >= 1 with n * loss^k <= target (target > 0). A closed form
// (logarithms) so loss close to 1 costs no more than loss = 0.5; the result
// is then nudged by direct evaluation because log ratios that should be
// integers rarely are in floating point.
uint32_t SmallestPasses(double n, double loss, double target, bool strict) {
  auto done = [&](double k) {
    const double left = n * std::pow(loss, k);
    return strict ? left < target : left <= target;
  };
  if (loss == 0 || done(1)) return 1;
  double k = std::ceil(std::log(target / n) / std::log(loss));
  if (!(k <= static_cast<double>(std::numeric_limits<uint32_t>::max()) - 1)) {
    throw std::invalid_argument(
        "loss " + std::to_string(loss) +
        " is so close to 1 that a round would need more than 2^32 passes");
  }
  k = std::max(k, 1.0);
  while (k > 1 && done(k - 1)) k -= 1;
  while (!done(k)) k += 1;
  return static_cast<uint32_t>(k);
}

}  // namespace

PassEstimate ExpectedPasses(uint32_t n, double loss, double p) {
  CheckRate("loss", loss);
  CheckRate("p", p);
  PassEstimate e;
  if (n == 0) return e;
  const uint32_t need = StopThreshold(n, p);
  const double allowed = static_cast<double>(n - need);
  const double nd = static_cast<double>(n);
  if (allowed >= 1) {
    e.passes = SmallestPasses(nd, loss, allowed, /*strict=*/false);
  } else {
    // Every chunk is needed: "expected missing <= 0" never happens, so stop
    // counting passes once less than half a chunk is expected missing.
    e.passes = SmallestPasses(nd, loss, 0.5, /*strict=*/true);
  }
  e.packets = static_cast<double>(need) / (1 - loss);
  e.packets_over_n = e.packets / nd;
  return e;
}

double ExpectedRoundTimeNs(const PassEstimate& estimate, double per_packet_ns,
                           double control_rtt_ns) {
  if (!std::isfinite(per_packet_ns) || per_packet_ns < 0 ||
      !std::isfinite(control_rtt_ns) || control_rtt_ns < 0) {
    throw std::invalid_argument(
        "per-packet time and control RTT must be finite and >= 0 ns, got " +
        std::to_string(per_packet_ns) + " and " +
        std::to_string(control_rtt_ns));
  }
  if (estimate.passes == 0) return 0;
  return estimate.packets * per_packet_ns +
         static_cast<double>(estimate.passes - 1) * control_rtt_ns +
         control_rtt_ns / 2;
}

PassEstimate SimulatePasses(uint32_t n, double loss, double p, uint64_t seed) {
  CheckRate("loss", loss);
  CheckRate("p", p);
  PassEstimate e;
  if (n == 0) return e;
  const uint32_t allowed = n - StopThreshold(n, p);
  Rng rng(seed);
  uint32_t missing = n;
  uint64_t packets = 0;
  // Which chunk a send carries does not matter to the counts, only how many
  // are missing when a pass starts (the pass re-sends exactly those).
  while (missing > allowed) {
    ++e.passes;
    const uint32_t to_send = missing;
    for (uint32_t i = 0; i < to_send; ++i) {
      ++packets;
      if (!rng.Bernoulli(loss) && --missing <= allowed) break;
    }
  }
  e.packets = static_cast<double>(packets);
  e.packets_over_n = e.packets / static_cast<double>(n);
  return e;
}

}  // namespace dblp

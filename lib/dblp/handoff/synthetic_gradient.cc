#include "dblp/handoff/synthetic_gradient.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <string>

#include "dblp/base/rng.h"

namespace dblp {

double NormTrace::At(uint64_t iteration) const {
  double n = plateau + initial * std::exp(-static_cast<double>(iteration) /
                                          decay_iterations);
  for (uint64_t j : jumps) {
    if (iteration >= j && iteration < j + jump_length) n *= jump_factor;
  }
  return n;
}

std::vector<uint64_t> ParseIterationList(std::string_view csv) {
  std::vector<uint64_t> out;
  if (csv.empty() || csv == "none") return out;
  size_t pos = 0;
  while (pos <= csv.size()) {
    const size_t comma = std::min(csv.find(',', pos), csv.size());
    const std::string_view item = csv.substr(pos, comma - pos);
    uint64_t v = 0;
    const auto [end, ec] =
        std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      throw std::invalid_argument("bad iteration list '" + std::string(csv) +
                                  "': expected comma-separated integers, "
                                  "e.g. 40,90");
    }
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

SyntheticGradientSource::SyntheticGradientSource(uint64_t floats,
                                                 uint32_t rank, uint64_t seed,
                                                 NormTrace trace)
    : floats_(floats), rank_(rank), seed_(seed), trace_(std::move(trace)) {
  if (floats == 0) {
    throw std::invalid_argument("synthetic gradient needs at least 1 float");
  }
}

void SyntheticGradientSource::Fill(uint64_t iteration,
                                   std::span<float> out) const {
  if (out.size() != floats_) {
    throw std::invalid_argument("synthetic gradient: wrong buffer size");
  }
  // A shared direction (same for every rank: what the workers agree on)
  // plus 5% per-rank noise, scaled so the mean's norm follows the trace.
  const double scale = trace_.At(iteration) / std::sqrt(floats_);
  Rng shared(HashMix(seed_, iteration));
  Rng noise(HashMix(HashMix(seed_, iteration), 0x5EED0000ull + rank_));
  for (uint64_t i = 0; i < floats_; ++i) {
    const double sign = (shared.Next() >> 63) ? 1.0 : -1.0;
    const double jitter = 0.05 * (2 * noise.NextDouble() - 1);
    out[i] = static_cast<float>(scale * sign * (1 + jitter));
  }
}

std::vector<float> SyntheticGradientSource::Make(uint64_t iteration) const {
  std::vector<float> g(floats_);
  Fill(iteration, g);
  return g;
}

}  // namespace dblp

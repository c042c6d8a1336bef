#include "dblp/policy/broadcast_carry.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "dblp/base/rng.h"
#include "dblp/round/stop_decision.h"

namespace dblp {

BroadcastCarry::BroadcastCarry(const ChunkLayout& layout, uint64_t seed)
    : layout_(layout),
      seed_(seed),
      carry_(layout.total_bytes() / sizeof(float), 0.0f),
      waited_(layout.num_chunks(), 0) {}

std::span<const uint32_t> BroadcastCarry::Plan(uint64_t it, double p,
                                               std::span<float> mean) {
  if (mean.size() != carry_.size()) {
    throw std::invalid_argument(
        "BroadcastCarry: a mean of " + std::to_string(mean.size()) +
        " floats, the layout has " + std::to_string(carry_.size()));
  }
  const uint32_t n = layout_.num_chunks();
  const uint32_t keep = StopThreshold(n, p);  // validates p
  for (size_t i = 0; i < mean.size(); ++i) mean[i] += carry_[i];

  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0u);
  Rng rng(HashMix(seed_, it));
  for (uint32_t i = n; i > 1; --i) {
    std::swap(order_[i - 1], order_[rng.NextBelow(i)]);
  }
  // Longest waiting first; the shuffle orders the rest (stable).
  std::stable_sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
    return waited_[a] > waited_[b];
  });

  carried_chunks_ = n - keep;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t seq = order_[i];
    const size_t first = layout_.Offset(seq) / sizeof(float);
    const size_t count = layout_.Length(seq) / sizeof(float);
    float* carry = carry_.data() + first;
    if (i < keep) {
      std::fill(carry, carry + count, 0.0f);
      waited_[seq] = 0;
    } else {
      std::copy(mean.begin() + first, mean.begin() + first + count, carry);
      max_wait_ = std::max(max_wait_, ++waited_[seq]);
    }
  }
  return std::span<const uint32_t>(order_).first(keep);
}

}  // namespace dblp

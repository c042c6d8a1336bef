#include "dblp/policy/push_feedback.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dblp {

PushFeedback::PushFeedback(const ChunkLayout& layout)
    : layout_(layout), carry_(layout.total_bytes() / sizeof(float), 0.0f) {}

void PushFeedback::CheckSize(size_t floats) const {
  if (floats != carry_.size()) {
    throw std::invalid_argument(
        "PushFeedback: a buffer of " + std::to_string(floats) +
        " floats, the layout has " + std::to_string(carry_.size()));
  }
}

void PushFeedback::AddCarried(std::span<float> grad) {
  CheckSize(grad.size());
  if (carried_chunks_ == 0) return;
  for (size_t i = 0; i < grad.size(); ++i) grad[i] += carry_[i];
}

void PushFeedback::Settle(const Bitmap& accepted,
                          std::span<const float> pushed) {
  CheckSize(pushed.size());
  const uint32_t n = layout_.num_chunks();
  if (accepted.size() != n) {
    throw std::invalid_argument("PushFeedback: an accepted set of " +
                                std::to_string(accepted.size()) +
                                " chunks, the round has " + std::to_string(n));
  }
  carried_chunks_ = 0;
  for (uint32_t seq = 0; seq < n; ++seq) {
    const size_t first = layout_.Offset(seq) / sizeof(float);
    const size_t count = layout_.Length(seq) / sizeof(float);
    float* carry = carry_.data() + first;
    if (accepted.Test(seq)) {
      std::fill(carry, carry + count, 0.0f);
    } else {
      std::copy(pushed.begin() + first, pushed.begin() + first + count, carry);
      ++carried_chunks_;
    }
  }
}

}  // namespace dblp

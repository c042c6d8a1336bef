#include "dblp/round/sender_round.h"

#include <algorithm>

namespace dblp {

void SenderRound::Begin(uint32_t round, std::span<const uint32_t> order,
                        uint32_t num_chunks) {
  order_.assign(order.begin(), order.end());
  num_chunks_ = num_chunks ? num_chunks : static_cast<uint32_t>(order.size());
  pass_ = order_;
  cursor_ = 0;
  round_ = round;
  passes_ = 1;
  sent_ = 0;
  resent_ = 0;
  stop_.store(0, std::memory_order_release);
  state_ = order_.empty() ? State::kStopped : State::kSending;
}

uint32_t SenderRound::NextBurst(uint32_t* out, uint32_t max) {
  if (state_ == State::kSending && stop_requested()) state_ = State::kStopped;
  if (state_ != State::kSending) return 0;
  const size_t n = std::min<size_t>(max, pass_.size() - cursor_);
  std::copy_n(pass_.begin() + cursor_, n, out);
  cursor_ += n;
  sent_ += n;
  if (passes_ > 1) resent_ += n;
  if (cursor_ == pass_.size()) state_ = State::kAwaitingBitmap;
  return static_cast<uint32_t>(n);
}

void SenderRound::Unsend(uint32_t k) {
  k = static_cast<uint32_t>(std::min<size_t>(k, cursor_));
  if (k == 0) return;
  cursor_ -= k;
  sent_ -= k;
  if (passes_ > 1) resent_ -= k;
  if (state_ == State::kAwaitingBitmap) state_ = State::kSending;
}

bool SenderRound::OnBitmap(const Bitmap& received) {
  if (state_ != State::kAwaitingBitmap || received.size() != num_chunks_) {
    return false;
  }
  if (stop_requested()) {  // a BITMAP overtaken by STOP starts no pass
    state_ = State::kStopped;
    return false;
  }
  pass_.clear();
  for (uint32_t seq : order_) {
    if (!received.Test(seq)) pass_.push_back(seq);
  }
  cursor_ = 0;
  if (pass_.empty()) {  // nothing missing: the round is complete
    state_ = State::kStopped;
  } else {
    ++passes_;
    state_ = State::kSending;
  }
  return true;
}

}  // namespace dblp

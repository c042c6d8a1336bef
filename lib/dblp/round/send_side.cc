#include "dblp/round/send_side.h"

namespace dblp {

void SendSide::Begin(uint32_t round, std::span<const uint32_t> order,
                     uint64_t now_ns, uint32_t num_chunks) {
  round_.Begin(round, order, num_chunks);
  ++progress_;
  known_delivered_ = 0;
  gaining_ = true;
  // From now on the control thread accepts this round's STOP.
  live_round_.store(round, std::memory_order_release);
  done_ = false;
  probe_out_ = false;
  probe_ns_ = 0;
  begin_ns_ = now_ns;
  done_ns_ = 0;
  done_stop_received_ = 0;
  rtt_sum_us_ = 0;
  rtt_n_ = 0;
  if (round_.finished()) Finish(now_ns);  // an empty round
}

bool SendSide::StopArrived(uint32_t round, uint64_t at_ns,
                           uint32_t received) {
  if (round != live_round_.load(std::memory_order_acquire)) return false;
  const uint64_t word = (static_cast<uint64_t>(round) << 1) | 1;
  // A second STOP of the round keeps the first one's time. The control
  // thread is the only writer of both fields.
  if (stop_word_.load(std::memory_order_relaxed) == word) return false;
  // The time first, then the words (release): the datapath that sees the
  // round stopped finds the time.
  stop_at_ns_.store(at_ns, std::memory_order_relaxed);
  stop_received_.store(received, std::memory_order_relaxed);
  stop_word_.store(word, std::memory_order_release);
  round_.RequestStop(round);
  return true;
}

bool SendSide::ApplyBitmap() {
  bool applied = false;
  if (bitmap_.round() == round_.round() && round_.OnBitmap(bitmap_.slot())) {
    applied = true;
    const uint32_t delivered = bitmap_.slot().Count();
    gaining_ = delivered > known_delivered_;
    if (gaining_) {
      known_delivered_ = delivered;
      ++progress_;
    }
    probe_out_ = false;
    if (bitmap_.at_ns() > probe_ns_) {
      rtt_sum_us_ += static_cast<double>(bitmap_.at_ns() - probe_ns_) / 1e3;
      ++rtt_n_;
    }
  }
  bitmap_.Release();
  return applied;
}

void SendSide::Finish(uint64_t now_ns) {
  done_ = true;
  ++progress_;
  const uint64_t word = (static_cast<uint64_t>(round_.round()) << 1) | 1;
  done_ns_ = now_ns;
  done_stop_received_ = 0;
  if (round_.stop_requested() &&
      stop_word_.load(std::memory_order_acquire) == word) {
    done_ns_ = stop_at_ns_.load(std::memory_order_relaxed);
    done_stop_received_ = stop_received_.load(std::memory_order_relaxed);
  }
}

}  // namespace dblp

// A one-slot mailbox for a bitmap handed between the control thread and a
// datapath lcore, either way: the control thread posts a BITMAP it received
// for a send side; a receive side posts the snapshot it answers a PROBE
// with. One slot per side suffices: a sender has at most one PROBE
// outstanding. A post while the previous one is unread is counted and
// dropped (the sender's PROBE retry recovers from it).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>

#include "dblp/wire/bitmap.h"

namespace dblp {

class BitmapMailbox {
 public:
  // Producer. Returns false (counted) if the slot is busy or the words do
  // not fit `num_bits`.
  bool Post(uint32_t round, uint64_t at_ns, uint32_t num_bits,
            std::span<const uint64_t> words) {
    if (busy_.load(std::memory_order_acquire)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (slot_.size() != num_bits) slot_.Resize(num_bits);
    if (!slot_.AssignWords(words)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    round_ = round;
    at_ns_ = at_ns;
    busy_.store(true, std::memory_order_release);
    return true;
  }
  // Consumer: is a post waiting? Then read slot(), round(), at_ns(), and
  // Release().
  bool ready() const { return busy_.load(std::memory_order_acquire); }
  const Bitmap& slot() const { return slot_; }
  uint32_t round() const { return round_; }
  uint64_t at_ns() const { return at_ns_; }
  void Release() { busy_.store(false, std::memory_order_release); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  Bitmap slot_;                       // producer: wo while !busy; consumer: ro
  uint32_t round_ = 0;                // as slot_
  uint64_t at_ns_ = 0;                // as slot_: when the producer got it
  std::atomic<bool> busy_{false};     // producer: sets; consumer: clears
  std::atomic<uint64_t> dropped_{0};  // producer: wo; stats: ro
};

}  // namespace dblp

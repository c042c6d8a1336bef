// The sending side of one round: a first pass over every chunk in the
// round's send order, then passes over only the chunks the latest BITMAP
// says are missing, until STOP.
//
// Threading: one owner thread (a datapath lcore) calls Begin/NextBurst/
// OnBitmap. RequestStop may be called from any thread (the control thread
// that read STOP); the owner sees it at its next burst, even mid-pass.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "dblp/wire/bitmap.h"

namespace dblp {

class SenderRound {
 public:
  enum class State : uint8_t {
    kIdle,            // no round begun
    kSending,         // NextBurst yields seqs of the current pass
    kAwaitingBitmap,  // pass done: send PROBE, wait for BITMAP or STOP
    kStopped,         // STOP seen (or nothing left to send)
  };

  // Owner: starts `round`; `order` is the first-pass order: a permutation
  // of 0..N-1 (see SendOrder), or of one shard's chunk range (shards.h),
  // with `num_chunks` = N, the size of the round's BITMAPs (0: the order's
  // size).
  void Begin(uint32_t round, std::span<const uint32_t> order,
             uint32_t num_chunks = 0);

  // Owner: writes up to `max` seqs to send next into `out` and returns how
  // many. Returns 0 when the pass is exhausted (state becomes
  // kAwaitingBitmap: probe the receiver) or the round is stopped.
  uint32_t NextBurst(uint32_t* out, uint32_t max);

  // Owner: the last `k` seqs NextBurst handed out were not sent after all
  // (the TX ring stayed full): they go back to the front of the pass, so
  // backpressure delays frames instead of losing them.
  void Unsend(uint32_t k);

  // Owner: the receiver's BITMAP for this round. The next pass is every seq
  // the bitmap lacks, in first-pass order. Returns false (and ignores it) if
  // no probe is outstanding, the bitmap's size is wrong, or STOP already
  // arrived. A bitmap with no missing seq ends the round (kStopped).
  bool OnBitmap(const Bitmap& received);

  // Any thread: the receiver said STOP for `round`. A STOP of another round
  // (a late one, or one racing with Begin of the next round) stops nothing:
  // the flag holds the round it was meant for.
  void RequestStop(uint32_t round) {
    stop_.store(StopWord(round), std::memory_order_release);
  }
  // Owner thread (or tests): STOP the current round.
  void RequestStop() { RequestStop(round_); }
  bool stop_requested() const {
    return stop_.load(std::memory_order_acquire) == StopWord(round_);
  }

  // Nothing more to send this round: STOP seen or nothing missing.
  bool finished() const {
    return state_ == State::kStopped || stop_requested();
  }
  State state() const { return state_; }
  uint32_t round() const { return round_; }
  uint32_t num_chunks() const { return num_chunks_; }
  // Passes started so far (the first pass is 1).
  uint32_t passes() const { return passes_; }
  uint64_t packets_sent() const { return sent_; }
  // Packets of passes after the first.
  uint64_t packets_resent() const { return resent_; }
  // Seqs of the current pass still to send.
  uint32_t pass_remaining() const {
    return static_cast<uint32_t>(pass_.size() - cursor_);
  }

 private:
  std::vector<uint32_t> order_;    // first-pass order of this round
  std::vector<uint32_t> pass_;     // seqs of the current pass
  size_t cursor_ = 0;              // next index into pass_
  uint32_t num_chunks_ = 0;        // of the whole round (BITMAP size)
  uint32_t round_ = 0;
  uint32_t passes_ = 0;
  uint64_t sent_ = 0;
  uint64_t resent_ = 0;
  State state_ = State::kIdle;
  static constexpr uint64_t StopWord(uint32_t round) {
    return (static_cast<uint64_t>(round) << 1) | 1;
  }
  std::atomic<uint64_t> stop_{0};  // control: wo (and Begin); owner: ro
};

}  // namespace dblp

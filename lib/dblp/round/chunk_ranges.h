// A round's chunks split into lanes: contiguous chunk ranges, one per
// datapath lcore (a server's lanes) or per TX queue (a worker's); and the
// same cut makes a sharded job's partitions (one per server shard,
// dblp/job/shard_links.h).
//
// Lane s owns the contiguous chunk range [begin(s), end(s)); the bounds are
// multiples of 64, so every bitmap word and every slice of the server's sum
// has exactly one writer: the lcore of its lane, which polls RX queue s of
// every port (a sender puts chunk `seq` on TX queue RangeOf(seq)).
//
// A sender in lanes is one SendSide per lane, a receiver in lanes one
// ReceiveSide per lane, over the same ranges: sender lane k's PROBE is
// answered by receiver lane k's bitmap (the control messages name the
// lane). What the receiver's lanes must agree on is the STOP: StopGroup
// stops the round once their counts *together* reach its threshold, once,
// whichever lane sees it.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "dblp/round/receiver_round.h"
#include "dblp/round/stop_decision.h"

namespace dblp {

class ChunkRanges {
 public:
  ChunkRanges() = default;
  // Throws std::invalid_argument if count is 0.
  ChunkRanges(uint32_t num_chunks, uint32_t count);

  uint32_t count() const { return count_; }
  uint32_t num_chunks() const { return num_chunks_; }
  uint32_t begin(uint32_t s) const { return Bound(s); }
  uint32_t end(uint32_t s) const { return Bound(s + 1); }
  uint32_t RangeOf(uint32_t seq) const {
    return per_range_ ? seq / per_range_ : 0;
  }
  // The seqs of `order` that range `s` holds, in the same order.
  void Filter(std::span<const uint32_t> order, uint32_t s,
              std::vector<uint32_t>& out) const;

 private:
  uint32_t Bound(uint32_t s) const {
    const uint64_t b = uint64_t{s} * per_range_;
    return s >= count_ || b > num_chunks_ ? num_chunks_
                                          : static_cast<uint32_t>(b);
  }
  uint32_t num_chunks_ = 0;
  uint32_t count_ = 1;
  uint32_t per_range_ = 0;  // chunks per range, a multiple of 64
};

// The STOP decision of one round received by several lanes.
//
// Exactness: each lane's lcore publishes its count (release, in
// AtomicBitmap) and then, after a sequentially consistent fence, reads the
// others'. Of two lcores that each add the last chunks concurrently, at
// least one sees the other's count, so a round that reached its threshold
// is always stopped, and a count is never read ahead of the chunks it
// counts, so a round is never stopped early.
class StopGroup {
 public:
  // Setup, before any round: the lanes' receivers (one per lcore).
  void Add(const ReceiverRound* lane) { lanes_.push_back(lane); }

  // Any lane's lcore: the STOP for `round` under `rule` (the round's current
  // p, from the caller's receiver). Returns the trigger exactly once per
  // round; kNone before and after. `*total` gets the lanes' count.
  StopTrigger Poll(uint32_t round, const StopRule& rule, uint64_t now_ns,
                   uint32_t* total);
  // Has the STOP of `round` been handed out?
  bool taken(uint32_t round) const {
    return taken_.load(std::memory_order_acquire) == Word(round);
  }
  uint32_t Received(uint32_t round) const;

 private:
  static constexpr uint64_t Word(uint32_t round) {
    return (static_cast<uint64_t>(round) << 1) | 1;
  }
  std::vector<const ReceiverRound*> lanes_;  // setup only
  std::atomic<uint64_t> taken_{0};           // lanes' lcores: CAS
};

}  // namespace dblp

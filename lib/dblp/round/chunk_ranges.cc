#include "dblp/round/chunk_ranges.h"

#include <stdexcept>

namespace dblp {

ChunkRanges::ChunkRanges(uint32_t num_chunks, uint32_t count)
    : num_chunks_(num_chunks), count_(count) {
  if (count == 0) {
    throw std::invalid_argument("a round needs at least one range");
  }
  const uint64_t per = (uint64_t{num_chunks} + count - 1) / count;
  per_range_ = static_cast<uint32_t>((per + 63) / 64 * 64);
  if (per_range_ == 0) per_range_ = 64;
}

void ChunkRanges::Filter(std::span<const uint32_t> order, uint32_t s,
                         std::vector<uint32_t>& out) const {
  out.clear();
  const uint32_t lo = begin(s), hi = end(s);
  for (uint32_t seq : order) {
    if (seq >= lo && seq < hi) out.push_back(seq);
  }
}

uint32_t StopGroup::Received(uint32_t round) const {
  uint32_t total = 0;
  for (const ReceiverRound* r : lanes_) {
    // A lane still on an older round has nothing of this one.
    if (r->round() == round) total += r->received();
  }
  return total;
}

StopTrigger StopGroup::Poll(uint32_t round, const StopRule& rule,
                            uint64_t now_ns, uint32_t* total) {
  uint64_t seen = taken_.load(std::memory_order_acquire);
  if (seen == Word(round)) return StopTrigger::kNone;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  *total = Received(round);
  const StopTrigger t = rule.Evaluate(*total, now_ns);
  if (t == StopTrigger::kNone) return t;
  // Several lanes may reach the decision at once: one hands it out. The
  // word never moves back: a lane still in an older round gets nothing.
  while (seen != Word(round)) {
    if (seen != 0 && !RoundIsOlder(static_cast<uint32_t>(seen >> 1), round)) {
      return StopTrigger::kNone;
    }
    if (taken_.compare_exchange_weak(seen, Word(round),
                                     std::memory_order_acq_rel)) {
      return t;
    }
  }
  return StopTrigger::kNone;
}

}  // namespace dblp

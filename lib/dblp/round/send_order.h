// The order in which a sender walks a round's chunks.
//
// Why it matters: with early stop at 1 - p a sender only gets through the
// first (1 - p) of its first pass. A sender that always goes 0..N-1 then
// never delivers the tail of the buffer (the last layers) outside critical
// phases, and every worker misses the same chunks, so the server's mean has
// no contribution at all for them. Rotating or permuting the order per round
// and per rank spreads that loss evenly over the model and across workers.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dblp/wire/chunking.h"

namespace dblp {

enum class SendOrderKind : uint8_t {
  kSequential,  // 0..N-1 every round (the paper's prototype)
  kRotating,    // 0..N-1 rotated by a per-round start, offset by rank
  kPermuted,    // a seeded per-round shuffle, rotated by rank (default)
  // A seeded per-round shuffle of blocks of kSendBlockChunks consecutive
  // chunks, rotated by rank: the same spreading at block granularity, while
  // each TX burst reads (and the server sums) one contiguous stretch of
  // memory, which the caches, TLB and prefetchers handle far better than
  // single chunks scattered over the gradient (docs/BENCHMARKS.md).
  kBlocked,
  // The chunks of largest L2 norm first (OrderByMagnitude), ties in the
  // permuted order; the default. Early stop at 1 - p then drops the
  // smallest chunks, as MLT drops by magnitude, instead of a random 41%:
  // the lost share of the gradient's energy is far below p, the workers'
  // subsets of a push overlap on the chunks that matter (so the mean is
  // over both there), and on a clean link every worker's broadcast holds
  // the same chunks, so the replicas do not drift apart
  // (docs/EXPERIMENTS.md, "Where the accuracy goes"). Fill alone gives the
  // permuted order; OrderByMagnitude then ranks the values.
  kMagnitude,
};
inline constexpr uint32_t kSendBlockChunks = 32;
inline constexpr SendOrderKind kDefaultSendOrder = SendOrderKind::kMagnitude;

// "sequential" | "rotating" | "permuted" | "blocked" | "magnitude"; throws
// std::invalid_argument naming the choices.
SendOrderKind ParseSendOrder(std::string_view name);
const char* SendOrderName(SendOrderKind kind);

class SendOrder {
 public:
  // `rank` of `num_senders` senders that share a receiver (workers pushing
  // to the server); ranks start at 0. `seed` is shared by all senders of a
  // job so their permutations agree and the rank offsets split them.
  SendOrder(SendOrderKind kind, uint32_t rank, uint32_t num_senders,
            uint64_t seed);

  // Writes the first-pass order of `round` for `n` chunks into `out`
  // (resized to n): a permutation of 0..n-1. kMagnitude writes the
  // permuted order: its ties, before OrderByMagnitude ranks the values.
  void Fill(uint32_t round, uint32_t n, std::vector<uint32_t>& out) const;

  SendOrderKind kind() const { return kind_; }

 private:
  // Where this rank starts in a shared per-round order: rank r of S starts
  // r/S of the way in, so S early-stopped senders cover disjoint stretches.
  uint32_t RankOffset(uint32_t n) const;

  SendOrderKind kind_;
  uint32_t rank_;
  uint32_t num_senders_;
  uint64_t seed_;
};

// Reorders `order` (chunk indices of `layout`, e.g. a first pass from
// Fill) stably by descending L2 norm of each chunk of `values`
// (layout.total_bytes() / 4 floats, else std::invalid_argument). A chunk
// with a NaN ranks first: the receiver must see it to refuse it.
// `norms` is scratch (one per chunk of the layout; double: float squares
// of tiny gradients would all round to 0 and tie). One pass over
// the values and a sort of the chunk indices: ~1% of a round's cost.
void OrderByMagnitude(std::span<const float> values, const ChunkLayout& layout,
                      std::vector<uint32_t>& order, std::vector<double>& norms);

}  // namespace dblp

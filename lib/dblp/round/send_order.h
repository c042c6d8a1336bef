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
#include <string_view>
#include <vector>

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
};
inline constexpr uint32_t kSendBlockChunks = 32;
inline constexpr SendOrderKind kDefaultSendOrder = SendOrderKind::kPermuted;

// "sequential" | "rotating" | "permuted" | "blocked"; throws
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
  // (resized to n): a permutation of 0..n-1.
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

}  // namespace dblp

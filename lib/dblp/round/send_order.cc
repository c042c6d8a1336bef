#include "dblp/round/send_order.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "dblp/base/rng.h"
#include "dblp/wire/float_ops.h"

namespace dblp {

SendOrderKind ParseSendOrder(std::string_view name) {
  if (name == "sequential") return SendOrderKind::kSequential;
  if (name == "rotating") return SendOrderKind::kRotating;
  if (name == "permuted") return SendOrderKind::kPermuted;
  if (name == "blocked") return SendOrderKind::kBlocked;
  if (name == "magnitude") return SendOrderKind::kMagnitude;
  throw std::invalid_argument("unknown send order '" + std::string(name) +
                              "': use magnitude, sequential, rotating, "
                              "permuted or blocked");
}

const char* SendOrderName(SendOrderKind kind) {
  switch (kind) {
    case SendOrderKind::kSequential:
      return "sequential";
    case SendOrderKind::kRotating:
      return "rotating";
    case SendOrderKind::kPermuted:
      return "permuted";
    case SendOrderKind::kBlocked:
      return "blocked";
    case SendOrderKind::kMagnitude:
      return "magnitude";
  }
  return "unknown";
}

SendOrder::SendOrder(SendOrderKind kind, uint32_t rank, uint32_t num_senders,
                     uint64_t seed)
    : kind_(kind), rank_(rank), num_senders_(num_senders), seed_(seed) {
  if (num_senders == 0 || rank >= num_senders) {
    throw std::invalid_argument("send order: rank " + std::to_string(rank) +
                                " must be below the sender count " +
                                std::to_string(num_senders));
  }
}

uint32_t SendOrder::RankOffset(uint32_t n) const {
  return static_cast<uint32_t>(static_cast<uint64_t>(n) * rank_ /
                               num_senders_);
}

void SendOrder::Fill(uint32_t round, uint32_t n,
                     std::vector<uint32_t>& out) const {
  out.resize(n);
  if (n == 0) return;
  switch (kind_) {
    case SendOrderKind::kSequential:
      std::iota(out.begin(), out.end(), 0u);
      return;
    case SendOrderKind::kRotating: {
      // The per-round start moves by a hashed amount, so over many rounds
      // every chunk is equally likely to be near the end of the pass.
      const uint32_t start = static_cast<uint32_t>(
          (HashMix(seed_, round) % n + RankOffset(n)) % n);
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t s = start + i;
        out[i] = s >= n ? s - n : s;
      }
      return;
    }
    case SendOrderKind::kPermuted:
    case SendOrderKind::kMagnitude: {
      // Fisher-Yates with a per-round seed shared by all ranks, then rotated
      // by the rank's offset: same shuffle, disjoint starting stretches.
      std::iota(out.begin(), out.end(), 0u);
      Rng rng(HashMix(seed_, round));
      for (uint32_t i = n - 1; i > 0; --i) {
        std::swap(out[i], out[rng.NextBelow(i + 1)]);
      }
      std::rotate(out.begin(), out.begin() + RankOffset(n), out.end());
      return;
    }
    case SendOrderKind::kBlocked: {
      // The same shuffle over blocks, expanded in place, then rotated.
      const uint32_t blocks = (n + kSendBlockChunks - 1) / kSendBlockChunks;
      std::vector<uint32_t> block(blocks);
      std::iota(block.begin(), block.end(), 0u);
      Rng rng(HashMix(seed_, round));
      for (uint32_t i = blocks - 1; i > 0; --i) {
        std::swap(block[i], block[rng.NextBelow(i + 1)]);
      }
      uint32_t k = 0;
      for (uint32_t b : block) {
        const uint32_t first = b * kSendBlockChunks;
        const uint32_t last = std::min(n, first + kSendBlockChunks);
        for (uint32_t c = first; c < last; ++c) out[k++] = c;
      }
      std::rotate(out.begin(), out.begin() + RankOffset(n), out.end());
      return;
    }
  }
}

void OrderByMagnitude(std::span<const float> values, const ChunkLayout& layout,
                      std::vector<uint32_t>& order,
                      std::vector<double>& norms) {
  if (values.size() * sizeof(float) != layout.total_bytes()) {
    throw std::invalid_argument(
        "send order by magnitude: " + std::to_string(values.size()) +
        " floats for a layout of " + std::to_string(layout.total_bytes()) +
        " bytes");
  }
  norms.resize(layout.num_chunks());
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
    const double sq = SumSquaresFloats(bytes + layout.Offset(c),
                                       layout.Length(c) / sizeof(float));
    // NaN (or an overflowing square) ranks first: the server's reducer
    // must see the bad chunk to refuse it and name the worker.
    norms[c] = std::isfinite(sq) ? sq : std::numeric_limits<double>::infinity();
  }
  for (uint32_t c : order) {
    if (c >= layout.num_chunks()) {
      throw std::invalid_argument("send order by magnitude: chunk " +
                                  std::to_string(c) + " of " +
                                  std::to_string(layout.num_chunks()));
    }
  }
  std::stable_sort(order.begin(), order.end(), [&norms](uint32_t a,
                                                        uint32_t b) {
    return norms[a] > norms[b];
  });
}

}  // namespace dblp

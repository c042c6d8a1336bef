#include "dblp/policy/mean_reducer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "dblp/base/vector_clones.h"
#include "dblp/wire/float_ops.h"

namespace dblp {
namespace {

constexpr size_t kCacheLine = 64;
constexpr size_t kFloatsPerLine = kCacheLine / sizeof(float);
// Floats per block in Finalize's loops. A fixed-size inner block is
// vectorised by GCC's -O2 "very cheap" cost model, which refuses loops whose
// trip count is unknown; the tail (< 8 floats) is scalar.
constexpr size_t kBlock = 8;

// A sum slice as the sum of its copies added to 0.0f: a first copy is
// stored as it came (StoreFloatsSumSquares), so a slice whose copies were
// all -0.0 holds -0.0 where that sum is +0.0. Adding 0.0f here, once per
// round, gives the same bits as adding it to every first copy did: the two
// slices differ only in that zero's sign.
inline float SumOfCopies(float slice) { return 0.0f + slice; }

// out[i] = sum[i] * r, r an exact power of two.
DBLP_VECTOR_CLONES void ScaleExact(float* out, const float* sum, size_t n,
                                   float r) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float tmp[kBlock];
    for (size_t j = 0; j < kBlock; ++j) tmp[j] = SumOfCopies(sum[i + j]) * r;
    std::memcpy(out + i, tmp, sizeof(tmp));
  }
  for (; i < n; ++i) out[i] = SumOfCopies(sum[i]) * r;
}

// out[i] = sum[i] / d. Division (not a multiply by 1/d) so the result is the
// correctly rounded mean, identical to what a reference computes. In blocks
// of kBlock; each block is computed into a local before it is stored so
// that `out` and `sum` need no overlap check. Vector clones are safe here:
// a quotient is correctly rounded at any width, and there is no product to
// fuse.
DBLP_VECTOR_CLONES void DivideBy(float* out, const float* sum, size_t n,
                                 float d) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float tmp[kBlock];
    for (size_t j = 0; j < kBlock; ++j) tmp[j] = SumOfCopies(sum[i + j]) / d;
    std::memcpy(out + i, tmp, sizeof(tmp));
  }
  for (; i < n; ++i) out[i] = SumOfCopies(sum[i]) / d;
}

// For d a power of two (1, 2, 4 ... workers), x * (1 / d) is exact and so
// the same bits as x / d: both are x / d correctly rounded. A multiply costs
// a fraction of a divide, which dominated the server's reduce (25 MiB:
// about 1.35 ms of divides at two workers, from perf samples;
// docs/BENCHMARKS.md "The whole exchange").
void Divide(float* out, const float* sum, size_t n, float d) {
  int exp = 0;
  if (std::frexp(d, &exp) == 0.5f) {
    ScaleExact(out, sum, n, std::ldexp(1.0f, 1 - exp));
  } else {
    DivideBy(out, sum, n, d);
  }
}

// out[i] = (sum[i] + m * prev[i]) / d; a null `sum` is all zeros.
void DivideWithPrevious(float* out, const float* sum, const float* prev,
                        size_t n, float m, float d) {
  size_t i = 0;
  if (sum == nullptr) {
    for (; i < n; ++i) out[i] = (0.0f + m * prev[i]) / d;
    return;
  }
  for (; i + kBlock <= n; i += kBlock) {
    float tmp[kBlock];
    for (size_t j = 0; j < kBlock; ++j) {
      tmp[j] = (SumOfCopies(sum[i + j]) + m * prev[i + j]) / d;
    }
    std::memcpy(out + i, tmp, sizeof(tmp));
  }
  for (; i < n; ++i) out[i] = (SumOfCopies(sum[i]) + m * prev[i]) / d;
}

}  // namespace

void MeanReducer::AlignedFree::operator()(float* p) const {
  ::operator delete[](p, std::align_val_t{kCacheLine});
}

MeanReducer::MeanReducer(const ChunkLayout& layout, uint32_t num_workers,
                         uint32_t lanes, uint64_t model_floats)
    : layout_(layout),
      num_workers_(num_workers),
      lanes_(std::max(lanes, 1u)),
      clip_floats_(model_floats != 0 ? model_floats
                                     : layout.total_bytes() / sizeof(float)),
      tally_workers_(num_workers),
      tallies_(static_cast<size_t>(num_workers) * std::max(lanes, 1u)),
      stride_floats_(0),
      counts_(layout.num_chunks()) {
  if (layout.num_chunks() == 0 || layout.total_bytes() % sizeof(float) != 0) {
    throw std::invalid_argument(
        "mean reducer needs a non-empty float32 gradient: " +
        std::to_string(layout.total_bytes()) +
        " bytes is not a positive multiple of 4");
  }
  if (num_workers == 0) {
    throw std::invalid_argument("mean reducer needs at least one worker");
  }
  const size_t chunk_floats = layout.chunk_payload() / sizeof(float);
  stride_floats_ =
      (chunk_floats + kFloatsPerLine - 1) / kFloatsPerLine * kFloatsPerLine;
  const size_t total = stride_floats_ * layout.num_chunks();
  sums_.reset(static_cast<float*>(
      ::operator new[](total * sizeof(float), std::align_val_t{kCacheLine})));
  std::fill_n(sums_.get(), total, 0.0f);
  prev_mean_.assign(layout.total_bytes() / sizeof(float), 0.0f);
}

void MeanReducer::BeginRound() {
  // Sum slices are not cleared: a chunk's first contribution overwrites its
  // slice, and Finalize never reads the slice of a chunk nobody sent.
  for (CountSlot& slot : counts_) {
    slot.n.store(0, std::memory_order_relaxed);
    slot.refused = 0;
    slot.max_abs = 0;
  }
  std::fill(tallies_.begin(), tallies_.end(), Tally{});
}

void MeanReducer::set_clip_norm(double x) {
  if (!(x >= 0) || !std::isfinite(x)) {
    throw std::invalid_argument("clip norm must be finite and >= 0, got " +
                                std::to_string(x));
  }
  clip_norm_ = x;
  one_pass_now_ = one_pass_ && clip_norm_ == 0;
}

bool MeanReducer::Refuse(CountSlot& slot, Tally& t, uint32_t seq,
                         bool overflow) {
  ++(overflow ? t.overflow : t.nonfinite);
  t.first_bad_seq = std::min(t.first_bad_seq, seq);
  ++slot.refused;
  return false;
}

bool MeanReducer::AccumulateScanned(CountSlot& slot, Tally& t, uint32_t seq,
                                    const uint8_t* payload, size_t floats) {
  const ChunkScan scan = ScanFloats(payload, floats);
  if (scan.max_abs_bits >= kNonFiniteBits) return Refuse(slot, t, seq, false);
  t.sum_squares += scan.sum_squares;
  float scale = 1.0f;
  if (clip_norm_ > 0) {
    // This chunk's share of the bound: the shares' squares sum to X^2.
    const double bound =
        clip_norm_ * std::sqrt(static_cast<double>(floats) /
                               static_cast<double>(clip_floats_));
    if (scan.sum_squares > bound * bound) {
      scale = static_cast<float>(bound / std::sqrt(scan.sum_squares));
      ++t.clipped;
    }
  }
  // A bound on what this copy adds to any float of the sum (slack for the
  // rounding of scale * v).
  const double add_max =
      static_cast<double>(std::bit_cast<float>(scan.max_abs_bits)) * scale *
      (1 + 1e-6);
  // Single writer per slot: load + release store instead of a locked RMW.
  std::atomic<uint32_t>& n = slot.n;
  const uint32_t k = n.load(std::memory_order_relaxed);
  float* const sum = SumOf(seq);
  if (k == 0) {
    if (scale == 1.0f) {
      StoreFloats(sum, payload, floats);
    } else {
      StoreScaledFloats(sum, payload, floats, scale);
    }
    slot.max_abs = add_max;
  } else {
    // |sum| + |copy| below FLT_MAX cannot round to infinity; past it, the
    // exact check (rare: only near-overflowing values get here).
    const double have = SumBound(slot);
    if (have + add_max >= FLT_MAX &&
        !SumStaysFinite(sum, payload, floats, scale)) {
      return Refuse(slot, t, seq, true);
    }
    if (scale == 1.0f) {
      AddFloats(sum, payload, floats);
    } else {
      AddScaledFloats(sum, payload, floats, scale);
    }
    slot.max_abs = std::min(have + add_max, double{FLT_MAX});
  }
  assert(k < num_workers_ && "more contributions than workers: duplicate?");
  n.store(k + 1, std::memory_order_release);
  return true;
}

MeanReducer::Tally MeanReducer::tally(uint32_t w) const {
  Tally sum;
  for (uint32_t s = 0; s < lanes_; ++s) {
    const Tally& t = tallies_[static_cast<size_t>(s) * tally_workers_ + w];
    sum.sum_squares += t.sum_squares;
    sum.nonfinite += t.nonfinite;
    sum.overflow += t.overflow;
    sum.clipped += t.clipped;
    sum.first_bad_seq = std::min(sum.first_bad_seq, t.first_bad_seq);
  }
  return sum;
}

void MeanReducer::Finalize(FillMode mode, std::span<float> mean_out,
                           IncrementalBlockSquares* squares) {
  const size_t floats = layout_.total_bytes() / sizeof(float);
  if (mean_out.size() != floats) {
    throw std::invalid_argument(
        "mean output holds " + std::to_string(mean_out.size()) +
        " floats, the layout needs " + std::to_string(floats));
  }
  if (mode == FillMode::kPrevious && !keep_previous_) {
    throw std::logic_error(
        "MeanReducer: kPrevious fill with keep_previous off");
  }
  float* const out = mean_out.data();
  const float* const prev = prev_mean_.data();
  for (uint32_t seq = 0; seq < layout_.num_chunks(); ++seq) {
    const size_t first = layout_.Offset(seq) / sizeof(float);
    const size_t n = layout_.Length(seq) / sizeof(float);
    const float* const sum = SumOf(seq);
    const uint32_t k = counts_[seq].n.load(std::memory_order_acquire);
    // Refused copies leave the divisor: the chunk's mean is over the
    // workers whose copy could be summed.
    const uint32_t refused = counts_[seq].refused;
    const uint32_t members =
        num_workers_ > refused ? num_workers_ - refused : 0;
    if (members == 0) {
      // Every copy refused: nothing to divide (a summed copy here can only
      // be a lost worker's, whose own value it keeps).
      if (k > 0) {
        Divide(out + first, sum, n, static_cast<float>(k));
      } else if (mode == FillMode::kPrevious) {
        std::copy_n(prev + first, n, out + first);
      } else {
        std::fill_n(out + first, n, 0.0f);
      }
      if (squares != nullptr) squares->Advance(first + n);
      continue;
    }
    const float w = static_cast<float>(members);
    switch (mode) {
      case FillMode::kZero:
        if (k == 0) {
          std::fill_n(out + first, n, 0.0f);  // 0 / W
        } else {
          Divide(out + first, sum, n, w);
        }
        break;
      case FillMode::kRescale:
        if (k == 0) {
          std::fill_n(out + first, n, 0.0f);
        } else {
          Divide(out + first, sum, n, static_cast<float>(k));
        }
        break;
      case FillMode::kPrevious:
        if (k >= members) {
          // Complete chunk: skip the previous term entirely, so a non-finite
          // previous mean cannot leak in through 0 * inf.
          Divide(out + first, sum, n, w);
        } else if (k == 0) {
          // The slice holds an older round: the sum is 0.
          DivideWithPrevious(out + first, nullptr, prev + first, n,
                             static_cast<float>(members), w);
        } else {
          DivideWithPrevious(out + first, sum, prev + first, n,
                             static_cast<float>(members - k), w);
        }
        break;
    }
    if (squares != nullptr) squares->Advance(first + n);
  }
  if (squares != nullptr) squares->Finish();
  if (keep_previous_) {
    std::copy(mean_out.begin(), mean_out.end(), prev_mean_.begin());
  }
}

void MeanReducer::set_keep_previous(bool on) {
  if (on == keep_previous_) return;
  keep_previous_ = on;
  if (on) {
    prev_mean_.assign(layout_.total_bytes() / sizeof(float), 0.0f);
  } else {
    std::vector<float>().swap(prev_mean_);
  }
}

uint32_t MeanReducer::CoveredChunks() const {
  uint32_t covered = 0;
  for (const CountSlot& slot : counts_) {
    covered += slot.n.load(std::memory_order_acquire) != 0;
  }
  return covered;
}

void MeanReducer::set_num_workers(uint32_t w) {
  if (w == 0) throw std::invalid_argument("MeanReducer needs >= 1 worker");
  num_workers_ = w;
}

}  // namespace dblp

#include "dblp/wire/float_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dblp/base/vector_clones.h"

namespace dblp {

DBLP_VECTOR_CLONES void AddFloats(float* __restrict dst,
                                  const uint8_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    dst[i] += v;
  }
}

DBLP_VECTOR_CLONES void StoreFloats(float* __restrict dst,
                                    const uint8_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    dst[i] = 0.0f + v;
  }
}

namespace {

// The sum of squares in double, in index order: the rare chunk whose float
// sum of squares overflowed (magnitudes above about 1e19).
double SquaresInDouble(const uint8_t* src, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    sum += static_cast<double>(v) * v;
  }
  return sum;
}

}  // namespace

namespace {

using F8 = float __attribute__((vector_size(32)));
using U8 = uint32_t __attribute__((vector_size(32)));
constexpr size_t kLanes8 = 8;

// kWindowMask + r, read as 8 words: the last r lanes all ones, the others
// zero (the new floats of the last window, r = n % 8).
alignas(64) constexpr uint32_t kWindowMask[2 * kLanes8] = {
    0, 0, 0, 0, 0, 0, 0, 0, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u};

// A vector of squares summed as float_ops.h documents: lanes j and j + 4,
// then (0 + 2) + (1 + 3), in float.
[[gnu::always_inline]] inline float LaneSum(const F8& sq) {
  using F4 = float __attribute__((vector_size(16)));
  const F4 q = __builtin_shufflevector(sq, sq, 0, 1, 2, 3) +
               __builtin_shufflevector(sq, sq, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// The float sum of squares of n >= 8 floats at `src` (float32), in the
// order float_ops.h documents. `store(at, v)` sees every vector as loaded
// (the last window whole, so a copy writes its overlap again with the
// same bits) and `see(v)` every vector as squared. Always inlined: each
// vector clone gets its own copy at its width. Not finite when the floats
// are not or their squares' float sum overflowed.
template <class Store, class See>
[[gnu::always_inline]] inline float LaneSquares(const uint8_t* src, size_t n,
                                                Store store, See see) {
  F8 sq0 = {}, sq1 = {}, sq2 = {}, sq3 = {};
  const auto load = [&](size_t at, F8& v) {
    std::memcpy(&v, src + at * sizeof(float), sizeof(v));
    store(at, v);
    see(v);
  };
  size_t i = 0;
  // Two blocks a turn (the loop's own instructions are a fifth of a
  // block's); each chain still adds its vectors in index order. The four
  // vectors of a block are loaded before they are squared: squared as
  // each came, GCC spent a register copy per two vectors.
  for (; i + 8 * kLanes8 <= n; i += 8 * kLanes8) {
    F8 a, b, c, d;
    load(i, a);
    load(i + kLanes8, b);
    load(i + 2 * kLanes8, c);
    load(i + 3 * kLanes8, d);
    sq0 += a * a;
    sq1 += b * b;
    sq2 += c * c;
    sq3 += d * d;
    F8 e, f, g, h;
    load(i + 4 * kLanes8, e);
    load(i + 5 * kLanes8, f);
    load(i + 6 * kLanes8, g);
    load(i + 7 * kLanes8, h);
    sq0 += e * e;
    sq1 += f * f;
    sq2 += g * g;
    sq3 += h * h;
  }
  // At most one block of four is left.
  if (i + 4 * kLanes8 <= n) {
    F8 a, b, c, d;
    load(i, a);
    load(i + kLanes8, b);
    load(i + 2 * kLanes8, c);
    load(i + 3 * kLanes8, d);
    sq0 += a * a;
    sq1 += b * b;
    sq2 += c * c;
    sq3 += d * d;
    i += 4 * kLanes8;
  }
  for (; i + kLanes8 <= n; i += kLanes8) {
    F8 a;
    load(i, a);
    sq0 += a * a;
  }
  if (const size_t r = n - i; r != 0) {
    F8 v;
    std::memcpy(&v, src + (n - kLanes8) * sizeof(float), sizeof(v));
    store(n - kLanes8, v);
    U8 bits, mask;
    std::memcpy(&bits, &v, sizeof(bits));
    std::memcpy(&mask, kWindowMask + r, sizeof(mask));
    bits &= mask;
    std::memcpy(&v, &bits, sizeof(v));
    see(v);
    sq0 += v * v;
  }
  return LaneSum((sq0 + sq1) + (sq2 + sq3));
}

// Fewer than 8 floats (a short last chunk): the same order with scalars,
// and a copy into `dst` unless it is null. Out of line and cold, so the
// vector code keeps a frameless body.
[[gnu::noinline, gnu::cold]] ChunkScan ShortScan(float* dst, const uint8_t* src,
                                                 size_t n) {
  F8 sq = {};
  ChunkScan s;
  for (size_t j = 0; j < n; ++j) {
    float v;
    std::memcpy(&v, src + j * sizeof(float), sizeof(v));
    if (dst != nullptr) dst[j] = v;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    s.max_abs_bits = std::max(s.max_abs_bits, bits & 0x7fffffffu);
    sq[j] = v * v;  // 0 + v * v: the same rounding, fused or not
  }
  s.sum_squares = LaneSum(sq);
  return s;
}

// The overflowed float sum redone in double (ScanFloats' contract).
void RedoInDouble(ChunkScan& s, const uint8_t* src, size_t n) {
  if (s.max_abs_bits < kNonFiniteBits && !std::isfinite(s.sum_squares)) {
    s.sum_squares = SquaresInDouble(src, n);
  }
}

}  // namespace

DBLP_VECTOR_CLONES ChunkScan ScanFloats(const uint8_t* __restrict src,
                                        size_t n) {
  if (n < kLanes8) [[unlikely]] {
    ChunkScan s = ShortScan(nullptr, src, n);
    RedoInDouble(s, src, n);
    return s;
  }
  // The largest magnitude's bits, per lane, over every vector squared
  // (zeroed lanes add nothing to it).
  U8 mx = {};
  ChunkScan s;
  s.sum_squares = LaneSquares(
      src, n, [](size_t, const F8&) {},
      [&mx](const F8& v) {
        U8 bits;
        std::memcpy(&bits, &v, sizeof(bits));
        bits &= 0x7fffffffu;
        mx = mx > bits ? mx : bits;
      });
  for (size_t j = 0; j < kLanes8; ++j) {
    s.max_abs_bits = s.max_abs_bits > mx[j] ? s.max_abs_bits : mx[j];
  }
  RedoInDouble(s, src, n);
  return s;
}

DBLP_VECTOR_CLONES double SumSquaresFloats(const uint8_t* __restrict src,
                                           size_t n) {
  if (n < kLanes8) [[unlikely]]
    return ShortScan(nullptr, src, n).sum_squares;
  return LaneSquares(
      src, n, [](size_t, const F8&) {}, [](const F8&) {});
}

DBLP_VECTOR_CLONES double StoreFloatsSumSquares(float* __restrict dst,
                                                const uint8_t* __restrict src,
                                                size_t n) {
  if (n < kLanes8) [[unlikely]]
    return ShortScan(dst, src, n).sum_squares;
  // The floats as sent: the "0.0f +" that StoreFloats adds per float is
  // MeanReducer::Finalize's, once per round (an add per vector here).
  return LaneSquares(
      src, n,
      [dst](size_t at, const F8& v) { std::memcpy(dst + at, &v, sizeof(v)); },
      [](const F8&) {});
}

DBLP_VECTOR_CLONES void AddScaledFloats(float* __restrict dst,
                                        const uint8_t* __restrict src, size_t n,
                                        float scale) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    dst[i] += scale * v;
  }
}

DBLP_VECTOR_CLONES void StoreScaledFloats(float* __restrict dst,
                                          const uint8_t* __restrict src,
                                          size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    dst[i] = 0.0f + scale * v;
  }
}

bool SumStaysFinite(const float* dst, const uint8_t* src, size_t n,
                    float scale) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    if (!std::isfinite(dst[i] + scale * v)) return false;
  }
  return true;
}

double L2Norm(std::span<const float> v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

size_t NormBlocks(size_t floats, size_t block_floats) {
  return block_floats == 0 ? 0 : (floats + block_floats - 1) / block_floats;
}

namespace {

// One block's sum of squares. Independent lanes: one chain in index order
// waited on the add's latency for every float (a sixth of the server's
// time per iteration at 25 MiB, docs/BENCHMARKS.md). Vector clones without
// FMA (AVX2 has none; the default build neither): each lane is a multiply
// then an add in index order, so every clone and every CPU gives the same
// bits.
__attribute__((target_clones("avx2", "default"))) double SquaresOfBlock(
    const float* __restrict v, size_t n) {
  double lanes[kSquareLanes] = {};
  size_t i = 0;
  for (; i + kSquareLanes <= n; i += kSquareLanes) {
    for (size_t j = 0; j < kSquareLanes; ++j) {
      lanes[j] += static_cast<double>(v[i + j]) * v[i + j];
    }
  }
  for (size_t j = 0; i < n; ++i, ++j) {
    lanes[j] += static_cast<double>(v[i]) * v[i];
  }
  for (size_t width = kSquareLanes / 2; width > 0; width /= 2) {
    for (size_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

}  // namespace

void BlockSquares(std::span<const float> v, size_t block_floats,
                  std::span<double> out) {
  IncrementalBlockSquares squares(v, block_floats, out);
  squares.Finish();
}

void IncrementalBlockSquares::Advance(size_t ready_floats) {
  ready_floats = std::min(ready_floats, v_.size());
  for (; next_ < out_.size(); ++next_) {
    const size_t lo = std::min(v_.size(), next_ * block_floats_);
    const size_t hi = std::min(v_.size(), lo + block_floats_);
    if (hi > ready_floats) return;  // the block is not final yet
    out_[next_] = SquaresOfBlock(v_.data() + lo, hi - lo);
  }
}

double NormOfBlockSquares(std::span<const double> squares) {
  double sum = 0;
  for (double s : squares) sum += s;
  return std::sqrt(sum);
}

uint64_t ZeroNonFinite(std::span<float> v) {
  uint64_t n = 0;
  for (float& x : v) {
    if (!std::isfinite(x)) {
      x = 0.0f;
      ++n;
    }
  }
  return n;
}

}  // namespace dblp

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

DBLP_VECTOR_CLONES ChunkScan ScanFloats(const uint8_t* __restrict src,
                                        size_t n) {
  // Lanes in vector registers (GCC's vector extension: the auto-vectoriser
  // kept lane arrays in memory, reloaded every block), each summing its
  // floats in index order, so no sum is reassociated. Float squares (not
  // double) keep the per-float work to one multiply-add; a float sum that
  // overflowed (magnitudes above about 1e19) is redone in double. What the
  // scan costs per round is in docs/BENCHMARKS.md.
  using F8 = float __attribute__((vector_size(32)));
  using U8 = uint32_t __attribute__((vector_size(32)));
  constexpr size_t kLanes = 8;
  // Four named sums (an array of them stays in memory): independent chains
  // hide the add's latency.
  F8 sq0 = {}, sq1 = {}, sq2 = {}, sq3 = {};
  U8 mx = {};
  const auto lane = [&](size_t at, F8& sq) {
    F8 v;
    std::memcpy(&v, src + at * sizeof(float), sizeof(v));
    U8 bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bits &= 0x7fffffffu;
    mx = mx > bits ? mx : bits;
    sq += v * v;
  };
  size_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    lane(i, sq0);
    lane(i + kLanes, sq1);
    lane(i + 2 * kLanes, sq2);
    lane(i + 3 * kLanes, sq3);
  }
  for (; i + kLanes <= n; i += kLanes) lane(i, sq0);
  const F8 sq = (sq0 + sq1) + (sq2 + sq3);
  ChunkScan s;
  for (size_t j = 0; j < kLanes; ++j) {
    s.sum_squares += sq[j];
    s.max_abs_bits = s.max_abs_bits > mx[j] ? s.max_abs_bits : mx[j];
  }
  for (; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bits &= 0x7fffffffu;
    s.max_abs_bits = s.max_abs_bits > bits ? s.max_abs_bits : bits;
    s.sum_squares += static_cast<double>(v) * v;
  }
  if (s.max_abs_bits < kNonFiniteBits && !std::isfinite(s.sum_squares)) {
    s.sum_squares = SquaresInDouble(src, n);
  }
  return s;
}

namespace {

using F8 = float __attribute__((vector_size(32)));
constexpr size_t kLanes8 = 8;

// ScanFloats' sum of squares, lane for lane, in the same order: blocks of
// 32 floats into four chains, blocks of 8 into the first, the chains
// reduced as (0 + 1) + (2 + 3), the lanes added into a double in lane
// order, then the tail in double in index order. `each(at, v)` also sees
// every vector and `tail(at, v)` every tail float (the fused store); `each`
// may turn -0.0 into +0.0 (the same square) before v is squared, which
// lets the store's "0.0f + v" load v too. Always inlined: each vector
// clone gets its own copy at its width.
template <class Each, class Tail>
[[gnu::always_inline]] inline double LaneSquares(const uint8_t* src, size_t n,
                                                 Each each, Tail tail) {
  F8 sq0 = {}, sq1 = {}, sq2 = {}, sq3 = {};
  const auto load = [&](size_t at, F8& v) {
    std::memcpy(&v, src + at * sizeof(float), sizeof(v));
    each(at, v);
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
  const F8 sq = (sq0 + sq1) + (sq2 + sq3);
  // Lane by lane in order, in double: four lanes converted at once (exact,
  // as one at a time). The first lane starts the sum, which "0.0 +" it
  // did not change: a lane is a sum of squares, +0.0 or more (or not
  // finite, which the caller redoes).
  using F4 = float __attribute__((vector_size(16)));
  using D4 = double __attribute__((vector_size(32)));
  const D4 lo =
      __builtin_convertvector(__builtin_shufflevector(sq, sq, 0, 1, 2, 3), D4);
  const D4 hi =
      __builtin_convertvector(__builtin_shufflevector(sq, sq, 4, 5, 6, 7), D4);
  static_assert(sizeof(F4) * 2 == sizeof(F8));
  double sum = lo[0];
  sum += lo[1];
  sum += lo[2];
  sum += lo[3];
  sum += hi[0];
  sum += hi[1];
  sum += hi[2];
  sum += hi[3];
  for (; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    tail(i, v);
    sum += static_cast<double>(v) * v;
  }
  return sum;
}

}  // namespace

DBLP_VECTOR_CLONES double SumSquaresFloats(const uint8_t* __restrict src,
                                           size_t n) {
  return LaneSquares(
      src, n, [](size_t, F8&) {}, [](size_t, float) {});
}

DBLP_VECTOR_CLONES double StoreFloatsSumSquares(float* __restrict dst,
                                                const uint8_t* __restrict src,
                                                size_t n) {
  // "0.0f +": StoreFloats' -0.0 -> +0.0, the first contribution's bits.
  return LaneSquares(
      src, n,
      [dst](size_t at, F8& v) {
        v = 0.0f + v;
        std::memcpy(dst + at, &v, sizeof(v));
      },
      [dst](size_t at, float v) { dst[at] = 0.0f + v; });
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

void BlockSquares(std::span<const float> v, size_t block_floats,
                  std::span<double> out) {
  for (size_t b = 0; b < out.size(); ++b) {
    const size_t lo = std::min(v.size(), b * block_floats);
    const size_t hi = std::min(v.size(), lo + block_floats);
    // Independent lanes: one chain in index order waited on the add's
    // latency for every float (a sixth of the server's time per iteration
    // at 25 MiB, docs/BENCHMARKS.md). Built without FMA (no clones), so
    // every CPU rounds alike.
    double lanes[kSquareLanes] = {};
    size_t i = lo;
    for (; i + kSquareLanes <= hi; i += kSquareLanes) {
      for (size_t j = 0; j < kSquareLanes; ++j) {
        lanes[j] += static_cast<double>(v[i + j]) * v[i + j];
      }
    }
    for (size_t j = 0; i < hi; ++i, ++j) {
      lanes[j] += static_cast<double>(v[i]) * v[i];
    }
    for (size_t width = kSquareLanes / 2; width > 0; width /= 2) {
      for (size_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
    }
    out[b] = lanes[0];
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

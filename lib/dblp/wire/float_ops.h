// The server's per-frame arithmetic on a chunk of float32 gradient: add
// into the round's sum, or store the first contribution; and the norm the
// CLR detector is fed. Kept apart from
// loss_fill.cc so it is built with the vectoriser's dynamic cost model and
// AVX2 / AVX-512 clones (lib/meson.build), like the checksum loops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace dblp {

// dst[i] += the float at src + 4 * i, for i < n. `src` may be unaligned and
// must not overlap `dst`.
void AddFloats(float* dst, const uint8_t* src, size_t n);

// dst[i] = 0.0f + the float at src + 4 * i: a round's first contribution,
// bit-identical to adding it into a zeroed slice ("0.0f +" turns -0.0 into
// +0.0, as that addition did) without reading the slice from memory.
void StoreFloats(float* dst, const uint8_t* src, size_t n);

// One pass over a received chunk before it is summed: the sum of its
// squares (in float lanes, redone in double when that overflowed, so
// 3e38 squared is finite) and the largest magnitude's bits. A NaN or an
// infinity makes max_abs_bits >= kNonFiniteBits (their exponent bits are all
// ones and sort above every finite magnitude).
struct ChunkScan {
  double sum_squares = 0;
  uint32_t max_abs_bits = 0;
};
inline constexpr uint32_t kNonFiniteBits = 0x7f800000u;
// The order of the sum of squares (SumSquaresFloats' and
// StoreFloatsSumSquares' too; tests/test_bad_gradient.cc recomputes it in
// scalar code): eight float lanes in four chains, lane j of a vector
// holding float 8k + j. Vectors of each whole block of four go to chains
// 0-3 in turn, vectors past the last block to chain 0; the n % 8 floats
// left go to chain 0 as the 8-float window that ends at n with its older
// lanes zeroed (n >= 8), or as lanes 0..n-1 of a zeroed vector (n < 8).
// Each chain adds its vectors' squares in index order, each with one
// rounding (a fused multiply-add) or two, as the build compiled it: GCC
// fuses them at -O2 in the AVX2 and AVX-512 clones, not at -O1 (the
// sanitizer build) nor in the baseline one. One binary always rounds
// alike, which is what keeps ScanFloats and the one-pass functions equal;
// two builds may differ in the last bits. Then, in float, the chains as
// (0 + 1) + (2 + 3), its lanes j and j + 4, and those four as
// (0 + 2) + (1 + 3). A float sum that overflowed (magnitudes above about
// 1e19) is redone in double in index order by ScanFloats.
ChunkScan ScanFloats(const uint8_t* src, size_t n);

// The sum of squares ScanFloats computes (the same lanes and order, so
// the same bits whenever it is finite), without the largest magnitude:
// a NaN or an infinity in `src`, or a float square sum that overflowed,
// makes it non-finite, and the caller then asks ScanFloats. A finite
// result bounds every |src[i]| by its square root.
double SumSquaresFloats(const uint8_t* src, size_t n);
// A copy of the floats at `src` into `dst` (bits as they are: a -0.0
// stays -0.0, unlike StoreFloats) and SumSquaresFloats, in one pass over
// `src` (a round's first contribution, unclipped). `dst` is written
// whatever the floats are, so a caller that refuses the chunk on a
// non-finite result must treat the slice as unwritten (MeanReducer: a
// chunk with no contribution).
double StoreFloatsSumSquares(float* dst, const uint8_t* src, size_t n);

// Sets every non-finite float of `v` to 0; returns how many it set (a mean
// that overflowed is never broadcast as it is).
uint64_t ZeroNonFinite(std::span<float> v);

// AddFloats and StoreFloats of `scale` times each float (a clipped chunk).
void AddScaledFloats(float* dst, const uint8_t* src, size_t n, float scale);
void StoreScaledFloats(float* dst, const uint8_t* src, size_t n, float scale);

// Whether dst[i] + scale * src[i] is finite for every i (the exact check
// when a bound on the sum says it might overflow; dst is not changed).
bool SumStaysFinite(const float* dst, const uint8_t* src, size_t n,
                    float scale);

// The L2 norm of a gradient, accumulated in double in index order.
double L2Norm(std::span<const float> v);

// The mean's norm the CLR detector is fed, in two steps so that server
// shards (each holding a partition of whole blocks) get the bits one
// server gets: per block of kNormBlockChunks chunks, the sum of squares in
// double over kSquareLanes lanes (float i of the block goes to lane
// i % kSquareLanes, each lane in index order, the lanes then added
// pairwise in a fixed tree), so no CPU reassociates it differently; then
// the blocks' sum in block order, and sqrt.
// 64 chunks: a server shard's partition starts at a multiple of 64
// (ChunkRanges), so its blocks are the whole gradient's.
inline constexpr uint32_t kNormBlockChunks = 64;
inline constexpr size_t kSquareLanes = 8;
// Blocks of `block_floats` floats (the last may be shorter) in `floats`.
size_t NormBlocks(size_t floats, size_t block_floats);
// out[b] = the sum of squares of block b (out.size() == NormBlocks(...)).
void BlockSquares(std::span<const float> v, size_t block_floats,
                  std::span<double> out);
// sqrt of the blocks' sum, added in order.
double NormOfBlockSquares(std::span<const double> squares);

// BlockSquares of a buffer that is written front to back (the server's
// mean, chunk by chunk): Advance(n) once its first n floats are final
// squares every block they complete, while those floats are still in the
// cache, so the norm costs no second pass over memory. Finish() squares
// the rest. The same bits as BlockSquares.
class IncrementalBlockSquares {
 public:
  IncrementalBlockSquares(std::span<const float> v, size_t block_floats,
                          std::span<double> out)
      : v_(v), block_floats_(block_floats), out_(out) {}
  void Advance(size_t ready_floats);
  void Finish() { Advance(v_.size()); }

 private:
  std::span<const float> v_;
  size_t block_floats_;
  std::span<double> out_;
  size_t next_ = 0;  // the first block not yet squared
};

}  // namespace dblp

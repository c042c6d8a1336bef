// Members who lie (issue #21, item 3): a worker that sends NaN, +Inf,
// floats whose sum overflows or a huge gradient must not reach the mean.
// The reducer refuses the chunk and leaves it out of that chunk's divisor;
// the job names the worker (abort) or goes on counting it (drop); clipping
// bounds each worker's norm. Checked on the reducer and end to end over
// the simulator's real frames.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dblp/policy/mean_reducer.h"
#include "dblp/wire/float_ops.h"
#include "sim/memory_cluster.h"

namespace dblp {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// 4 chunks of 16 floats.
const ChunkLayout kLayout(64 * 4, 16 * 4);

std::vector<float> Grad(uint32_t rank) {
  std::vector<float> g(64);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(static_cast<int>((i * 7 + rank * 5) % 17) - 8);
  }
  return g;
}

const uint8_t* Bytes(const std::vector<float>& g, uint32_t seq) {
  return reinterpret_cast<const uint8_t*>(g.data()) + kLayout.Offset(seq);
}

// Every worker sends every chunk; returns what Accumulate said per worker.
std::vector<int> Feed(MeanReducer& red,
                      const std::vector<std::vector<float>>& grads) {
  std::vector<int> accepted(grads.size(), 0);
  for (uint32_t seq = 0; seq < kLayout.num_chunks(); ++seq) {
    for (uint32_t w = 0; w < grads.size(); ++w) {
      accepted[w] += red.Accumulate(w, seq, Bytes(grads[w], seq)) ? 1 : 0;
    }
  }
  return accepted;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// The honest workers' mean, in the reducer's order (sum, then divide).
std::vector<float> MeanOf(const std::vector<std::vector<float>>& grads,
                          const std::vector<uint32_t>& who) {
  std::vector<float> m(64, 0.0f);
  for (size_t i = 0; i < m.size(); ++i) {
    float s = 0.0f;
    for (uint32_t w : who) s += grads[w][i];
    m[i] = s / static_cast<float>(who.size());
  }
  return m;
}

class PoisonedChunk : public ::testing::TestWithParam<float> {};

// One float of worker 1's chunk 2 is NaN, +Inf or -Inf: that chunk is
// refused and its mean is the other two's, under every fill; the rest is
// the mean of all three.
TEST_P(PoisonedChunk, IsRefusedAndLeftOutOfTheDivisor) {
  for (const FillMode mode :
       {FillMode::kZero, FillMode::kRescale, FillMode::kPrevious}) {
    std::vector<std::vector<float>> g = {Grad(0), Grad(1), Grad(2)};
    g[1][2 * 16 + 5] = GetParam();
    MeanReducer red(kLayout, 3);
    const std::vector<int> accepted = Feed(red, g);
    EXPECT_EQ(accepted, (std::vector<int>{4, 3, 4}));
    const MeanReducer::Tally t = red.tally(1);
    EXPECT_EQ(t.nonfinite, 1u);
    EXPECT_EQ(t.overflow, 0u);
    EXPECT_EQ(t.first_bad_seq, 2u);
    EXPECT_EQ(red.tally(0).nonfinite, 0u);
    EXPECT_EQ(red.contributions(2), 2u);
    std::vector<float> mean(64);
    red.Finalize(mode, mean);
    ASSERT_TRUE(AllFinite(mean)) << FillModeName(mode);
    const std::vector<float> all = MeanOf(g, {0, 1, 2});
    const std::vector<float> honest = MeanOf(g, {0, 2});
    for (size_t i = 0; i < mean.size(); ++i) {
      ASSERT_EQ(mean[i], kLayout.ChunkOf(i * 4) == 2 ? honest[i] : all[i])
          << FillModeName(mode) << " float " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(NanAndInfinities, PoisonedChunk,
                         ::testing::Values(kNaN, kInf, -kInf));

// Worker 2 sends 3e38 everywhere, worker 0 too: each is finite, their sum
// is not. The second copy of each chunk is refused (overflow) and the mean
// stays finite: 3e38 over the two that were summed (worker 1's and one
// 3e38).
TEST(HugeFloats, SumThatWouldOverflowIsRefused) {
  std::vector<std::vector<float>> g = {std::vector<float>(64, 3e38f), Grad(1),
                                       std::vector<float>(64, 3e38f)};
  MeanReducer red(kLayout, 3);
  const std::vector<int> accepted = Feed(red, g);
  EXPECT_EQ(accepted, (std::vector<int>{4, 4, 0}));
  EXPECT_EQ(red.tally(2).overflow, 4u);
  EXPECT_EQ(red.tally(2).nonfinite, 0u);
  std::vector<float> mean(64);
  red.Finalize(FillMode::kZero, mean);
  ASSERT_TRUE(AllFinite(mean));
  const std::vector<float> kept = MeanOf(g, {0, 1});
  EXPECT_EQ(mean, kept);
  // The worker's norm is reported, huge as it is.
  EXPECT_GT(std::sqrt(red.tally(2).sum_squares), 1e38);
}

// A liar that sends -1000x the honest gradient drags the mean far away;
// with a clip norm its contribution's norm is at most X and the mean stays
// within X / W of the honest workers' share.
TEST(ClipNorm, BoundsEachWorkersContribution) {
  std::vector<std::vector<float>> g = {Grad(0), Grad(1), Grad(2)};
  for (float& x : g[1]) x *= -1000.0f;
  const double honest_norm = L2Norm(g[0]);
  // A chunk of the honest ones (norm <= honest_norm) passes unclipped.
  const double clip = honest_norm * 2;
  MeanReducer plain(kLayout, 3), clipped(kLayout, 3);
  clipped.set_clip_norm(clip);
  Feed(plain, g);
  Feed(clipped, g);
  EXPECT_EQ(plain.tally(1).clipped, 0u);
  EXPECT_GT(clipped.tally(1).clipped, 0u);
  std::vector<float> a(64), b(64);
  plain.Finalize(FillMode::kZero, a);
  clipped.Finalize(FillMode::kZero, b);
  // The liar's part of the mean: mean - the honest workers' sum / 3.
  std::vector<float> liar_a(64), liar_b(64);
  for (size_t i = 0; i < 64; ++i) {
    const float honest = (g[0][i] + g[2][i]) / 3.0f;
    liar_a[i] = a[i] - honest;
    liar_b[i] = b[i] - honest;
  }
  EXPECT_GT(L2Norm(liar_a), 100 * clip / 3);
  EXPECT_LE(L2Norm(liar_b), clip / 3 * (1 + 1e-4));
  // The per-worker norm is what was sent, before the clip.
  EXPECT_NEAR(std::sqrt(clipped.tally(1).sum_squares), 1000 * L2Norm(Grad(1)),
              1e-3 * 1000 * L2Norm(Grad(1)));
  EXPECT_THROW(clipped.set_clip_norm(-1), std::invalid_argument);
  EXPECT_THROW(clipped.set_clip_norm(kInf), std::invalid_argument);
}

// A clean round is bit for bit what it was: no refusal, no clip.
TEST(CleanRound, TalliesAreZeroAndNormsAreTheWorkers) {
  std::vector<std::vector<float>> g = {Grad(0), Grad(1), Grad(2)};
  MeanReducer red(kLayout, 3);
  Feed(red, g);
  std::vector<float> mean(64);
  red.Finalize(FillMode::kZero, mean);
  EXPECT_EQ(mean, MeanOf(g, {0, 1, 2}));
  for (uint32_t w = 0; w < 3; ++w) {
    EXPECT_EQ(red.tally(w).nonfinite + red.tally(w).overflow, 0u);
    EXPECT_DOUBLE_EQ(std::sqrt(red.tally(w).sum_squares), L2Norm(g[w]));
  }
  red.BeginRound();
  EXPECT_EQ(red.tally(0).sum_squares, 0.0);
}

// ---- the one-pass path against the two-pass one, bit for bit ----

// Deterministic floats of every kind a chunk may hold: ordinary, -0.0,
// tiny (underflowing squares), above 1.8e19 (float squares overflow) and
// near FLT_MAX (sums that overflow), NaN and infinities.
std::vector<float> Mixed(size_t n, uint64_t seed, bool poison) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = static_cast<float>(x % 2001) / 1000.0f - 1.0f;
    switch (x >> 60) {
      case 0:
        f = -0.0f;
        break;
      case 1:
        f = u * 1e-30f;
        break;
      case 2:
        f = poison && (x >> 56) % 16 == 0 ? 2e20f * u : u;
        break;
      case 3:
        f = poison && (x >> 56) % 16 == 1 ? 3e38f : u;
        break;
      case 4:
        f = poison && (x >> 56) % 32 == 2 ? kNaN : u;
        break;
      case 5:
        f = poison && (x >> 56) % 32 == 3 ? -kInf : u;
        break;
      default:
        f = u * 3.0f;
    }
  }
  return v;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}

TEST(OnePass, FloatOpsMatchScanAndStoreBitForBit) {
  for (size_t n : {0, 1, 7, 8, 9, 31, 32, 33, 40, 100, 367, 368, 369, 1000}) {
    for (uint64_t seed = 0; seed < 40; ++seed) {
      const std::vector<float> v = Mixed(n, seed, seed % 4 == 3);
      const auto* src = reinterpret_cast<const uint8_t*>(v.data());
      const ChunkScan scan = ScanFloats(src, n);
      std::vector<float> a(n, 7.0f), b(n, 7.0f);
      StoreFloats(a.data(), src, n);
      const double fused = StoreFloatsSumSquares(b.data(), src, n);
      const double squares = SumSquaresFloats(src, n);
      EXPECT_EQ(Bits(fused), Bits(squares)) << n << " " << seed;
      // StoreFloats adds 0.0f (-0.0 -> +0.0); the fused store copies the
      // bits as they are (Finalize adds the 0.0f).
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(Bits(a[i]), Bits(0.0f + v[i]))
            << n << " " << seed << " " << i;
        ASSERT_EQ(Bits(b[i]), Bits(v[i])) << n << " " << seed << " " << i;
      }
      if (std::isfinite(fused)) {
        // Then the scan saw only finite floats and agrees on the squares,
        // whose root bounds every float.
        ASSERT_LT(scan.max_abs_bits, kNonFiniteBits) << n << " " << seed;
        EXPECT_EQ(Bits(fused), Bits(scan.sum_squares)) << n << " " << seed;
        float max_abs;
        std::memcpy(&max_abs, &scan.max_abs_bits, sizeof(max_abs));
        EXPECT_LE(max_abs, std::sqrt(fused) * (1 + 1e-5) + 1e-18);
      } else {
        // The one-pass path hands these to ScanFloats: a non-finite float
        // or squares whose float sum leaves float's range.
        bool nonfinite = false;
        double exact = 0;
        for (float f : v) {
          nonfinite = nonfinite || !std::isfinite(f);
          exact += static_cast<double>(f) * f;
        }
        EXPECT_TRUE(nonfinite || exact > 3e38) << n << " " << seed;
      }
    }
  }
}

// The order float_ops.h documents for a chunk's sum of squares, in plain
// scalar code: eight float lanes in four chains, the last n % 8 floats as
// the window that ends at n (or lanes 0..n-1 when n < 8), then the fixed
// reduction. `fused`: each square added with one rounding (an FMA), as
// GCC -O2 builds the AVX2 and AVX-512 clones; else rounded, then added.
float DocumentedSquares(const std::vector<float>& v, bool fused) {
  const size_t n = v.size();
  float chain[4][8] = {};
  const auto add = [&](int c, int j, float x) {
    chain[c][j] = fused ? std::fma(x, x, chain[c][j]) : chain[c][j] + x * x;
  };
  size_t i = 0;
  if (n >= 8) {
    const size_t vectors = n / 8;
    for (size_t k = 0; k < vectors; ++k, i += 8) {
      const int c = k < vectors / 4 * 4 ? static_cast<int>(k % 4) : 0;
      for (int j = 0; j < 8; ++j) add(c, j, v[i + j]);
    }
    const size_t r = n - i;
    for (size_t j = 8 - r; j < 8 && r != 0; ++j) add(0, j, v[n - 8 + j]);
  } else {
    for (size_t j = 0; j < n; ++j) add(0, j, v[j]);
  }
  float s[8];
  for (int j = 0; j < 8; ++j) {
    s[j] = (chain[0][j] + chain[1][j]) + (chain[2][j] + chain[3][j]);
  }
  float q[4];
  for (int j = 0; j < 4; ++j) q[j] = s[j] + s[j + 4];
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// Every function, every input, in one of the two roundings: the same
// one throughout (whichever this build and CPU run).
TEST(OnePass, SquaresAddInTheDocumentedOrder) {
  int fused = -1;  // unknown until an input tells the roundings apart
  int telling = 0;
  for (size_t n :
       {1, 5, 7, 8, 9, 15, 31, 32, 33, 63, 64, 65, 100, 363, 367, 368, 1000}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      const std::vector<float> v = Mixed(n, seed, false);
      const auto* src = reinterpret_cast<const uint8_t*>(v.data());
      const double one = DocumentedSquares(v, true);
      const double two = DocumentedSquares(v, false);
      std::vector<float> dst(n);
      const double got = SumSquaresFloats(src, n);
      EXPECT_EQ(Bits(StoreFloatsSumSquares(dst.data(), src, n)), Bits(got))
          << n << " " << seed;
      EXPECT_EQ(Bits(ScanFloats(src, n).sum_squares), Bits(got))
          << n << " " << seed;
      if (Bits(one) == Bits(two)) {
        EXPECT_EQ(Bits(got), Bits(one)) << n << " " << seed;
        continue;
      }
      ++telling;
      ASSERT_TRUE(Bits(got) == Bits(one) || Bits(got) == Bits(two))
          << n << " " << seed;
      const int mode = Bits(got) == Bits(one) ? 1 : 0;
      if (fused < 0) fused = mode;
      EXPECT_EQ(mode, fused) << n << " " << seed;
    }
  }
  EXPECT_GT(telling, 0);  // the inputs tell the two roundings apart
}

// A round of 4 workers whose chunks hold everything Mixed makes, fed in
// the same order to a one-pass and a two-pass reducer: the same verdicts,
// tallies and mean, bit for bit, in every fill mode.
TEST(OnePass, ReducerMatchesTheTwoPassPathBitForBit) {
  const ChunkLayout layout(368 * 4 * 9 + 52, 368 * 4);
  const size_t floats = layout.total_bytes() / 4;
  uint32_t nonfinite = 0, overflow = 0;
  for (uint64_t round = 0; round < 12; ++round) {
    std::vector<std::vector<float>> g;
    for (uint32_t w = 0; w < 4; ++w) {
      g.push_back(Mixed(floats, round * 8 + w, (round + w) % 3 == 0));
    }
    // Worker 3 repeats worker 0's near-FLT_MAX floats: sums that overflow.
    for (size_t i = 0; i < floats; ++i) {
      if (std::fabs(g[0][i]) > 1e38f) g[3][i] = g[0][i];
    }
    MeanReducer one(layout, 4), two(layout, 4);
    two.set_one_pass(false);
    for (uint32_t seq = 0; seq < layout.num_chunks(); ++seq) {
      for (uint32_t k = 0; k < 4; ++k) {
        const uint32_t w = (seq + k + round) % 4;  // arrival order varies
        const auto* p =
            reinterpret_cast<const uint8_t*>(g[w].data()) + layout.Offset(seq);
        ASSERT_EQ(one.Accumulate(w, seq, p), two.Accumulate(w, seq, p))
            << round << " " << seq << " " << w;
      }
    }
    for (uint32_t w = 0; w < 4; ++w) {
      EXPECT_EQ(Bits(one.tally(w).sum_squares), Bits(two.tally(w).sum_squares));
      EXPECT_EQ(one.tally(w).nonfinite, two.tally(w).nonfinite);
      EXPECT_EQ(one.tally(w).overflow, two.tally(w).overflow);
      EXPECT_EQ(one.tally(w).first_bad_seq, two.tally(w).first_bad_seq);
      nonfinite += one.tally(w).nonfinite;
      overflow += one.tally(w).overflow;
    }
    for (FillMode mode :
         {FillMode::kZero, FillMode::kRescale, FillMode::kPrevious}) {
      std::vector<float> a(floats), b(floats);
      one.Finalize(mode, a);
      two.Finalize(mode, b);
      for (size_t i = 0; i < floats; ++i) {
        ASSERT_EQ(Bits(a[i]), Bits(b[i])) << round << " " << i;
      }
    }
  }
  // The rounds had both kinds of refusal.
  EXPECT_GT(nonfinite, 0u);
  EXPECT_GT(overflow, 0u);
}

// MeanReducer::AccumulateBurst's Chunk, as the server's PushRxChunk.
struct BurstChunk {
  const uint8_t* payload;
  uint32_t seq;
  uint16_t w;
  uint16_t bytes;
};

// The server's burst entry (two shards, bursts of up to 7 chunks, with and
// without prefetch, clipped or not) against Accumulate one chunk at a time
// in the same order: the same verdicts' tallies and means, bit for bit.
TEST(OnePass, BurstEntryMatchesOneChunkAtATime) {
  const ChunkLayout layout(368 * 4 * 9 + 52, 368 * 4);
  const size_t floats = layout.total_bytes() / 4;
  for (double clip : {0.0, 40.0}) {
    for (uint32_t ahead : {0u, 2u, 40u}) {
      for (uint64_t round = 0; round < 4; ++round) {
        std::vector<std::vector<float>> g;
        for (uint32_t w = 0; w < 4; ++w) {
          g.push_back(Mixed(floats, round * 8 + w, (round + w) % 3 == 0));
        }
        MeanReducer burst(layout, 4, 2), single(layout, 4, 2);
        burst.set_clip_norm(clip);
        single.set_clip_norm(clip);
        std::vector<BurstChunk> per_shard[2];
        for (uint32_t seq = 0; seq < layout.num_chunks(); ++seq) {
          for (uint32_t k = 0; k < 4; ++k) {
            const auto w = static_cast<uint16_t>((seq + k + round) % 4);
            per_shard[seq % 2].push_back(
                BurstChunk{reinterpret_cast<const uint8_t*>(g[w].data()) +
                               layout.Offset(seq),
                           seq, w, static_cast<uint16_t>(layout.Length(seq))});
          }
        }
        for (uint32_t shard = 0; shard < 2; ++shard) {
          const std::vector<BurstChunk>& c = per_shard[shard];
          for (size_t at = 0; at < c.size(); at += 7) {
            const auto n =
                static_cast<uint32_t>(std::min<size_t>(7, c.size() - at));
            burst.AccumulateBurst(c.data() + at, n, shard, ahead);
          }
          for (const BurstChunk& one : c) {
            single.Accumulate(one.w, one.seq, one.payload, shard);
          }
        }
        for (uint32_t w = 0; w < 4; ++w) {
          const MeanReducer::Tally a = burst.tally(w), b = single.tally(w);
          EXPECT_EQ(Bits(a.sum_squares), Bits(b.sum_squares));
          EXPECT_EQ(a.nonfinite, b.nonfinite);
          EXPECT_EQ(a.overflow, b.overflow);
          EXPECT_EQ(a.clipped, b.clipped);
          EXPECT_EQ(a.first_bad_seq, b.first_bad_seq);
        }
        for (FillMode mode : {FillMode::kZero, FillMode::kPrevious}) {
          std::vector<float> a(floats), b(floats);
          burst.Finalize(mode, a);
          single.Finalize(mode, b);
          for (size_t i = 0; i < floats; ++i) {
            ASSERT_EQ(Bits(a[i]), Bits(b[i]))
                << clip << " " << ahead << " " << round << " " << i;
          }
        }
      }
    }
  }
}

// A one-pass first copy leaves minus its sum of squares in the chunk's
// bound, rooted only when a second copy comes: the bound still grows
// with each copy, so a third copy that would overflow the sum is refused.
TEST(OnePass, DeferredBoundStillCatchesAnOverflow) {
  const ChunkLayout layout(64 * 4, 64 * 4);
  MeanReducer r(layout, 3);
  std::vector<float> first(64, 0.0f), big(64, 0.0f);
  first[0] = first[1] = first[2] = 1e19f;  // squares 3e38: one pass
  big[0] = 3e38f;                          // squares overflow: two passes
  const auto at = [](const std::vector<float>& v) {
    return reinterpret_cast<const uint8_t*>(v.data());
  };
  EXPECT_TRUE(r.Accumulate(0, 0, at(first)));
  EXPECT_TRUE(r.Accumulate(1, 0, at(big)));   // 3e38 + 1e19: finite
  EXPECT_FALSE(r.Accumulate(2, 0, at(big)));  // 6e38: refused
  EXPECT_EQ(r.tally(2).overflow, 1u);
  std::vector<float> mean(64);
  r.Finalize(FillMode::kZero, mean);
  EXPECT_EQ(Bits(mean[0]), Bits((0.0f + 1e19f + 3e38f) / 2.0f));
  EXPECT_EQ(Bits(mean[1]), Bits(1e19f / 2.0f));
}

// Zeros' signs: a first copy is stored as sent (-0.0 stays -0.0) and
// Finalize adds the 0.0f. Chunks with one, two and four copies whose
// floats are -0.0, +0.0 or a mix: the one-pass and two-pass reducers and
// a plain reference (0.0f, then each copy in arrival order, then divided)
// agree bit for bit in every fill mode.
TEST(OnePass, NegativeZeroCopiesMeanAsTheTwoPassPath) {
  const ChunkLayout layout(64 * 4 * 3, 64 * 4);
  const size_t floats = layout.total_bytes() / 4;
  std::vector<std::vector<float>> g(4, std::vector<float>(floats));
  for (uint32_t w = 0; w < 4; ++w) {
    for (size_t i = 0; i < floats; ++i) {
      // Mostly -0.0; every 5th float of worker 1 +0.0, every 7th of worker
      // 2 a small negative number.
      float f = -0.0f;
      if (w == 1 && i % 5 == 0) f = 0.0f;
      if (w == 2 && i % 7 == 0) f = -1e-3f;
      g[w][i] = f;
    }
  }
  // Chunk 0: worker 0 only; chunk 1: workers 0 and 1; chunk 2: all four.
  const std::vector<std::vector<uint32_t>> copies = {{0}, {1, 0}, {0, 1, 2, 3}};
  MeanReducer one(layout, 4), two(layout, 4);
  two.set_one_pass(false);
  for (uint32_t seq = 0; seq < 3; ++seq) {
    for (uint32_t w : copies[seq]) {
      const auto* p =
          reinterpret_cast<const uint8_t*>(g[w].data()) + layout.Offset(seq);
      ASSERT_TRUE(one.Accumulate(w, seq, p));
      ASSERT_TRUE(two.Accumulate(w, seq, p));
    }
  }
  std::vector<float> prev(floats, -0.0f);
  for (FillMode mode :
       {FillMode::kZero, FillMode::kRescale, FillMode::kPrevious}) {
    std::vector<float> a(floats), b(floats);
    one.Finalize(mode, a);
    two.Finalize(mode, b);
    for (uint32_t seq = 0; seq < 3; ++seq) {
      const auto k = static_cast<float>(copies[seq].size());
      for (size_t j = 0; j < 64; ++j) {
        const size_t i = seq * 64 + j;
        float sum = 0.0f;
        for (uint32_t w : copies[seq]) sum += g[w][i];
        float want = sum / (mode == FillMode::kRescale ? k : 4.0f);
        if (mode == FillMode::kPrevious && k < 4) {
          // Both reducers' previous means are the kRescale pass's
          // output, just checked against the reference.
          want = (sum + (4.0f - k) * prev[i]) / 4.0f;
        }
        ASSERT_EQ(Bits(a[i]), Bits(b[i])) << static_cast<int>(mode) << " " << i;
        ASSERT_EQ(Bits(a[i]), Bits(want)) << static_cast<int>(mode) << " " << i;
      }
    }
    prev = a;
  }
}

// ---- end to end: the simulator's real frames and the server's job ----

ClusterConfig ThreeWorkers(bool drop) {
  ClusterConfig c;
  c.num_workers = 3;
  c.gradient_floats = 4096;
  c.policy.kind = PolicyKind::kReliable;
  c.drop_bad_gradient = drop;
  return c;
}

std::vector<std::vector<float>> Honest(uint64_t floats, uint64_t it) {
  std::vector<std::vector<float>> g(3, std::vector<float>(floats));
  for (uint32_t r = 0; r < 3; ++r) {
    for (uint64_t i = 0; i < floats; ++i) {
      g[r][i] =
          static_cast<float>(static_cast<int>((i * 3 + r * 7 + it) % 13) - 6);
    }
  }
  return g;
}

TEST(HostileWorker, AbortNamesTheWorkerAndTheIteration) {
  MemoryCluster cluster(ThreeWorkers(false));
  auto g = Honest(4096, 0);
  EXPECT_EQ(cluster.RunIteration(g).failure, "");
  g = Honest(4096, 1);
  for (float& x : g[1]) x = kNaN;
  const IterationOutcome o = cluster.RunIteration(g);
  EXPECT_NE(o.failure.find("worker 1 "), std::string::npos) << o.failure;
  EXPECT_NE(o.failure.find("iteration 1"), std::string::npos) << o.failure;
  EXPECT_NE(o.failure.find("--on_bad_gradient=drop"), std::string::npos);
  // The iteration's rows say who.
  const std::vector<IterationRecord>& rows = cluster.server_rows();
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_GT(rows[4].bad_chunks, 0u);
  EXPECT_EQ(rows[3].bad_chunks, 0u);
}

TEST(HostileWorker, DropKeepsTheOthersMeansFiniteAndExact) {
  MemoryCluster cluster(ThreeWorkers(true));
  for (uint64_t it = 0; it < 3; ++it) {
    auto g = Honest(4096, it);
    for (size_t i = 0; i < g[2].size(); ++i) g[2][i] = i % 2 ? kInf : kNaN;
    const IterationOutcome o = cluster.RunIteration(g);
    ASSERT_EQ(o.failure, "");
    const std::vector<float>& mean = cluster.server_mean();
    for (size_t i = 0; i < mean.size(); ++i) {
      ASSERT_EQ(mean[i], (g[0][i] + g[1][i]) / 2.0f) << it << " " << i;
    }
    for (uint32_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(AllFinite(cluster.worker_average(r))) << r;
    }
  }
  const NamedCounters c = cluster.server_counters();
  uint64_t refused = 0, liars = 0;
  for (const auto& [name, v] : c) {
    if (name == "bad_gradient_nonfinite_chunks") refused = v;
    if (name == "bad_gradient_workers") liars = v;
  }
  EXPECT_EQ(refused, 3u * cluster.layout().num_chunks());
  EXPECT_EQ(liars, 1u);
  for (const IterationRecord& r : cluster.server_rows()) {
    EXPECT_EQ(r.bad_chunks, r.rank == 2 ? cluster.layout().num_chunks() : 0u);
  }
}

// A resync pushes the workers' parameters: the clip, meant for gradients,
// must leave them alone (it would shrink the model every replica loads).
TEST(ClipNorm, LeavesResyncRoundsAlone) {
  ClusterConfig c = ThreeWorkers(false);
  c.resync_every = 1;  // every other protocol iteration is a resync
  c.clip_norm = 1e-3;
  MemoryCluster cluster(c);
  for (uint64_t it = 0; it < 6; ++it) cluster.RunIteration(Honest(4096, it));
  bool saw_resync = false, saw_step = false;
  for (const IterationRecord& r : cluster.server_rows()) {
    if (r.resync) {
      saw_resync = true;
      EXPECT_GT(r.worker_norm, 1e-3) << "the models are not zero";
      EXPECT_EQ(r.clipped_chunks, 0u) << "iteration " << r.iteration;
    } else {
      saw_step = true;
      EXPECT_GT(r.clipped_chunks, 0u) << "iteration " << r.iteration;
    }
  }
  EXPECT_TRUE(saw_resync);
  EXPECT_TRUE(saw_step);
}

// Finite lies can still overflow the mean: with --push_fill=prev a chunk
// that missed some workers is (sum + m * prev) / d, and a liar at 3e38
// makes prev 1e38. Under drop such a mean is never broadcast as it is:
// its non-finite floats go out as 0, counted.
TEST(HostileWorker, DropNeverBroadcastsANonFiniteMean) {
  ClusterConfig c = ThreeWorkers(true);
  c.policy.kind = PolicyKind::kFixed;
  c.policy.p_fixed = 0.6;
  c.push_fill = FillMode::kPrevious;
  c.push_loss = LossSpec{LossKind::kBernoulli, 0.5};
  MemoryCluster cluster(c);
  for (uint64_t it = 0; it < 12; ++it) {
    auto g = Honest(4096, it);
    for (float& x : g[2]) x = 3e38f;
    ASSERT_EQ(cluster.RunIteration(g).failure, "");
    ASSERT_TRUE(AllFinite(cluster.server_mean())) << it;
    for (uint32_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(AllFinite(cluster.worker_average(r))) << it << " " << r;
    }
  }
  uint64_t zeroed = 0;
  for (const auto& [name, v] : cluster.server_counters()) {
    if (name == "bad_gradient_zeroed_mean_floats") zeroed = v;
  }
  EXPECT_GT(zeroed, 0u) << "the scenario never overflowed the mean";
}

}  // namespace
}  // namespace dblp

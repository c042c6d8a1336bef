#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dblp/base/rng.h"
#include "dblp/policy/loss_fill.h"
#include "dblp/policy/mean_reducer.h"
#include "dblp/wire/float_ops.h"

namespace dblp {
namespace {

std::vector<float> RandomFloats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  // Mixed magnitudes and signs so that rounding differences would show.
  for (float& x : v) {
    x = static_cast<float>(
        (rng.NextDouble() * 2 - 1) *
        std::ldexp(1.0, static_cast<int>(rng.NextBelow(20)) - 10));
  }
  return v;
}

// Random arrival map with each chunk present with probability `p_arrive`.
Bitmap RandomBitmap(uint32_t bits, double p_arrive, uint64_t seed) {
  Rng rng(seed);
  Bitmap b(bits);
  for (uint32_t i = 0; i < bits; ++i) {
    if (rng.Bernoulli(p_arrive)) b.Set(i);
  }
  return b;
}

// Layouts under test: a chunk of 64 floats (cache-line multiple), and the
// real 1500-MTU-like 1456-byte chunk (364 floats, not a multiple of 16) whose
// buffer ends in a short chunk.
std::vector<ChunkLayout> Layouts() {
  return {ChunkLayout(1000 * 4, 64 * 4),  // 16 chunks, last 40 floats
          ChunkLayout(10001 * 4, 1456),   // 28 chunks, last 173 floats
          ChunkLayout(5 * 4, 1456)};      // a single short chunk
}

size_t FloatsOf(const ChunkLayout& layout) {
  return layout.total_bytes() / sizeof(float);
}

// Indices [first, first + n) of chunk seq, in floats.
size_t FirstFloat(const ChunkLayout& l, uint32_t seq) {
  return l.Offset(seq) / 4;
}
size_t NumFloats(const ChunkLayout& l, uint32_t seq) {
  return l.Length(seq) / 4;
}

TEST(FillMode, ParseAndName) {
  for (const FillMode m :
       {FillMode::kZero, FillMode::kPrevious, FillMode::kRescale}) {
    EXPECT_EQ(ParseFillMode(FillModeName(m)), m);
  }
  EXPECT_STREQ(FillModeName(FillMode::kPrevious), "prev");
  for (const char* bad : {"", "Zero", "previous", "rescale ", "none"}) {
    try {
      ParseFillMode(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("zero"), std::string::npos) << msg;
      EXPECT_NE(msg.find("prev"), std::string::npos) << msg;
      EXPECT_NE(msg.find("rescale"), std::string::npos) << msg;
    }
  }
}

TEST(FillMissing, ZeroPrevAndRescaleOnRandomBitmaps) {
  uint64_t seed = 1;
  for (const ChunkLayout& layout : Layouts()) {
    for (const FillMode mode :
         {FillMode::kZero, FillMode::kPrevious, FillMode::kRescale}) {
      for (int trial = 0; trial < 5; ++trial, ++seed) {
        const size_t n = FloatsOf(layout);
        const std::vector<float> received = RandomFloats(n, seed);
        const std::vector<float> previous = RandomFloats(n, seed + 1000);
        Bitmap arrived = RandomBitmap(layout.num_chunks(), 0.6, seed);
        // Trial 0 always exercises the short last chunk being lost.
        if (trial == 0) {
          Bitmap without_last(layout.num_chunks());
          for (uint32_t s = 0; s + 1 < layout.num_chunks(); ++s) {
            if (arrived.Test(s)) without_last.Set(s);
          }
          arrived = without_last;
        }
        std::vector<float> buf = received;
        const uint32_t filled =
            FillMissing(buf, arrived, layout, mode, previous);
        EXPECT_EQ(filled, arrived.MissingCount());
        for (uint32_t s = 0; s < layout.num_chunks(); ++s) {
          for (size_t i = FirstFloat(layout, s);
               i < FirstFloat(layout, s) + NumFloats(layout, s); ++i) {
            const float want = arrived.Test(s)               ? received[i]
                               : mode == FillMode::kPrevious ? previous[i]
                                                             : 0.0f;
            ASSERT_EQ(buf[i], want)
                << FillModeName(mode) << " chunk " << s << " float " << i;
          }
        }
      }
    }
  }
}

TEST(FillMissing, AllArrivedTouchesNothing) {
  const ChunkLayout layout(1000 * 4, 64 * 4);
  const std::vector<float> received = RandomFloats(1000, 3);
  Bitmap all(layout.num_chunks());
  for (uint32_t s = 0; s < layout.num_chunks(); ++s) all.Set(s);
  std::vector<float> buf = received;
  EXPECT_EQ(FillMissing(buf, all, layout, FillMode::kZero, {}), 0u);
  EXPECT_EQ(buf, received);
}

TEST(FillMissing, RejectsMismatchedSizes) {
  const ChunkLayout layout(1000 * 4, 64 * 4);
  std::vector<float> buf(1000);
  const Bitmap arrived(layout.num_chunks());
  const std::vector<float> short_prev(999);
  EXPECT_THROW(
      FillMissing(buf, arrived, layout, FillMode::kPrevious, short_prev),
      std::invalid_argument);
  // Other modes ignore `previous`, even an empty one.
  EXPECT_EQ(FillMissing(buf, arrived, layout, FillMode::kZero, {}),
            layout.num_chunks());
  std::vector<float> short_buf(999);
  EXPECT_THROW(FillMissing(short_buf, arrived, layout, FillMode::kZero, {}),
               std::invalid_argument);
  const Bitmap wrong_bits(layout.num_chunks() + 1);
  EXPECT_THROW(FillMissing(buf, wrong_bits, layout, FillMode::kZero, {}),
               std::invalid_argument);
}

// One push round: worker w's gradient and the chunks of it that arrived.
struct Round {
  std::vector<std::vector<float>> grads;
  std::vector<Bitmap> arrived;
};

Round MakeRound(const ChunkLayout& layout, uint32_t workers, uint64_t seed) {
  Round r;
  for (uint32_t w = 0; w < workers; ++w) {
    r.grads.push_back(RandomFloats(FloatsOf(layout), seed * 100 + w));
    r.arrived.push_back(
        RandomBitmap(layout.num_chunks(), 0.6, seed * 100 + 50 + w));
  }
  return r;
}

// Feeds a round to the reducer from byte buffers shifted by `misalign` bytes,
// visiting chunks in a seeded random order per worker (arrival order across
// chunks must not matter; within a chunk the order is worker 0, 1, 2).
void Feed(MeanReducer& red, const Round& r, size_t misalign, uint64_t seed) {
  const ChunkLayout& layout = red.layout();
  Rng rng(seed);
  for (size_t w = 0; w < r.grads.size(); ++w) {
    std::vector<uint8_t> bytes(layout.total_bytes() + misalign);
    std::memcpy(bytes.data() + misalign, r.grads[w].data(),
                layout.total_bytes());
    std::vector<uint32_t> order(layout.num_chunks());
    for (uint32_t s = 0; s < order.size(); ++s) order[s] = s;
    for (size_t i = order.size(); i > 1; --i) {
      std::swap(order[i - 1], order[rng.NextBelow(static_cast<uint32_t>(i))]);
    }
    for (const uint32_t s : order) {
      if (r.arrived[w].Test(s)) {
        red.Accumulate(static_cast<uint32_t>(w), s,
                       bytes.data() + misalign + layout.Offset(s));
      }
    }
  }
}

// Reference computed independently, float by float, in the same summation
// order (worker 0, 1, 2) as the reducer, so kZero and kRescale must match
// bit for bit.
std::vector<float> ReferenceMean(const ChunkLayout& layout, const Round& r,
                                 FillMode mode,
                                 const std::vector<float>& prev_mean) {
  const uint32_t workers = static_cast<uint32_t>(r.grads.size());
  std::vector<float> out(FloatsOf(layout));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint32_t seq = layout.ChunkOf(i * 4);
    float sum = 0;
    uint32_t k = 0;
    for (uint32_t w = 0; w < workers; ++w) {
      if (r.arrived[w].Test(seq)) {
        sum += r.grads[w][i];
        ++k;
      }
    }
    switch (mode) {
      case FillMode::kZero:
        out[i] = sum / static_cast<float>(workers);
        break;
      case FillMode::kRescale:
        out[i] = k == 0 ? 0.0f : sum / static_cast<float>(k);
        break;
      case FillMode::kPrevious:
        out[i] = (sum + static_cast<float>(workers - k) * prev_mean[i]) /
                 static_cast<float>(workers);
        break;
    }
  }
  return out;
}

void ExpectMeanEq(const std::vector<float>& got, const std::vector<float>& want,
                  FillMode mode) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (mode == FillMode::kPrevious) {
      // (sum + m * prev) may be contracted into an FMA on some builds: allow
      // a couple of ulps, far below any real error (e.g. a wrong m or W).
      ASSERT_NEAR(got[i], want[i], 4e-7f * (std::abs(want[i]) + 1e-3f))
          << "float " << i;
    } else {
      ASSERT_EQ(got[i], want[i]) << FillModeName(mode) << " float " << i;
    }
  }
}

TEST(MeanReducer, MatchesReferenceForEachMode) {
  uint64_t seed = 1;
  for (const ChunkLayout& layout : Layouts()) {
    for (const FillMode mode :
         {FillMode::kZero, FillMode::kRescale, FillMode::kPrevious}) {
      for (int trial = 0; trial < 4; ++trial, ++seed) {
        MeanReducer red(layout, 3);
        // kPrevious needs a previous mean: a first round finalised with
        // kZero, then the round under test.
        const Round first = MakeRound(layout, 3, seed + 500);
        Feed(red, first, 0, seed);
        std::vector<float> prev(FloatsOf(layout));
        red.Finalize(FillMode::kZero, prev);
        ExpectMeanEq(prev, ReferenceMean(layout, first, FillMode::kZero, {}),
                     FillMode::kZero);

        red.BeginRound();
        const Round r = MakeRound(layout, 3, seed);
        Feed(red, r, static_cast<size_t>(trial), seed);
        std::vector<float> mean(FloatsOf(layout));
        red.Finalize(mode, mean);
        ExpectMeanEq(mean, ReferenceMean(layout, r, mode, prev), mode);
      }
    }
  }
}

// 2 and 4 workers divide by a multiply (exact for a power of two): the
// bits of a true division, on the floats where a shortcut would show
// (subnormals, the smallest normals, the largest finite, signed zeros).
TEST(MeanReducer, PowerOfTwoWorkersGiveTheDivisionsBits) {
  const ChunkLayout layout(4 * 1000, 4 * 100);
  const float edge[] = {1e-45f,   -1e-45f, 3e-45f,  FLT_MIN,     -FLT_MIN,
                        FLT_MIN * 1.5f,    1e-39f,  FLT_MAX,     -FLT_MAX,
                        0.0f,     -0.0f,   1.0f / 3, 7.0e-38f,   -2.5e-38f};
  for (const uint32_t workers : {1u, 2u, 4u, 3u}) {
    MeanReducer red(layout, workers);
    std::vector<std::vector<float>> grads(workers,
                                          std::vector<float>(FloatsOf(layout)));
    Rng rng(workers);
    for (uint32_t w = 0; w < workers; ++w) {
      for (size_t i = 0; i < grads[w].size(); ++i) {
        const uint32_t r = rng.NextBelow(1000);
        grads[w][i] = r < 400 ? edge[(i + w) % std::size(edge)] * (w ? 1 : -1)
                              : (static_cast<float>(r) - 500) * 1e-3f;
      }
      // FLT_MAX twice overflows the sum: keep one worker's large values
      // finite in the sum by halving the others'.
      if (w != 0) {
        for (float& x : grads[w]) {
          if (std::abs(x) > 1e38f) x = 0.5f;
        }
      }
      for (uint32_t s = 0; s < layout.num_chunks(); ++s) {
        ASSERT_TRUE(red.Accumulate(
            w, s, reinterpret_cast<const uint8_t*>(grads[w].data()) +
                      layout.Offset(s)));
      }
    }
    std::vector<float> mean(FloatsOf(layout));
    red.Finalize(FillMode::kZero, mean);
    for (size_t i = 0; i < mean.size(); ++i) {
      float sum = 0.0f;
      for (uint32_t w = 0; w < workers; ++w) sum += grads[w][i];
      const float want = sum / static_cast<float>(workers);
      ASSERT_EQ(std::bit_cast<uint32_t>(mean[i]), std::bit_cast<uint32_t>(want))
          << workers << " workers, float " << i << ": " << mean[i] << " vs "
          << want;
    }
  }
}

TEST(MeanReducer, ModesDifferWhereChunksAreMissing) {
  // Guards against a reducer that ignores the mode: with k < W the three
  // means must differ (kPrevious against a non-zero previous mean).
  const ChunkLayout layout(64 * 4, 64 * 4);
  const std::vector<float> g(64, 3.0f);
  const std::vector<float> first(64, 6.0f);
  MeanReducer red(layout, 3);
  for (uint32_t w = 0; w < 3; ++w) {
    red.Accumulate(w, 0, reinterpret_cast<const uint8_t*>(first.data()));
  }
  std::vector<float> m(64);
  red.Finalize(FillMode::kZero, m);
  EXPECT_EQ(m[0], 6.0f);

  red.BeginRound();
  red.Accumulate(0, 0, reinterpret_cast<const uint8_t*>(g.data()));
  red.Finalize(FillMode::kPrevious, m);
  EXPECT_EQ(m[63], 5.0f);  // (3 + 2 * 6) / 3, 6 being the last mean
  red.Finalize(FillMode::kZero, m);
  EXPECT_EQ(m[63], 1.0f);  // 3 / 3
  red.Finalize(FillMode::kRescale, m);
  EXPECT_EQ(m[63], 3.0f);  // 3 / 1
}

TEST(MeanReducer, ContributionsAndCoveredChunks) {
  const ChunkLayout layout(10001 * 4, 1456);
  const Round r = MakeRound(layout, 3, 9);
  MeanReducer red(layout, 3);
  EXPECT_EQ(red.num_workers(), 3u);
  EXPECT_EQ(red.layout(), layout);
  EXPECT_EQ(red.CoveredChunks(), 0u);
  Feed(red, r, 0, 9);
  uint32_t covered = 0;
  bool saw_none = false, saw_all = false;
  for (uint32_t s = 0; s < layout.num_chunks(); ++s) {
    uint32_t k = 0;
    for (const Bitmap& b : r.arrived) k += b.Test(s);
    EXPECT_EQ(red.contributions(s), k) << s;
    covered += k > 0;
    saw_none |= k == 0;
    saw_all |= k == 3;
  }
  EXPECT_EQ(red.CoveredChunks(), covered);
  // The seeded round must exercise both extremes, or the reference test
  // above would not cover k == 0 and k == W.
  EXPECT_TRUE(saw_none);
  EXPECT_TRUE(saw_all);
}

TEST(MeanReducer, BeginRoundResetsSumsAndCounts) {
  const ChunkLayout layout(1000 * 4, 64 * 4);
  MeanReducer red(layout, 3);
  const Round r = MakeRound(layout, 3, 4);
  Feed(red, r, 0, 4);
  ASSERT_GT(red.CoveredChunks(), 0u);
  red.BeginRound();
  EXPECT_EQ(red.CoveredChunks(), 0u);
  for (uint32_t s = 0; s < layout.num_chunks(); ++s) {
    EXPECT_EQ(red.contributions(s), 0u);
  }
  // A new round with only worker 1's chunk 2: the old sums must be gone.
  red.Accumulate(1, 2,
                 reinterpret_cast<const uint8_t*>(r.grads[1].data() +
                                                  FirstFloat(layout, 2)));
  std::vector<float> mean(1000);
  red.Finalize(FillMode::kRescale, mean);
  for (size_t i = 0; i < mean.size(); ++i) {
    const bool in_chunk2 = layout.ChunkOf(i * 4) == 2;
    ASSERT_EQ(mean[i], in_chunk2 ? r.grads[1][i] : 0.0f) << i;
  }
  // The same under kZero: slices of chunks nobody sent this round still
  // hold round 1's sums in memory and must not reach the mean.
  red.BeginRound();
  red.Accumulate(1, 2,
                 reinterpret_cast<const uint8_t*>(r.grads[1].data() +
                                                  FirstFloat(layout, 2)));
  red.Finalize(FillMode::kZero, mean);
  for (size_t i = 0; i < mean.size(); ++i) {
    const bool in_chunk2 = layout.ChunkOf(i * 4) == 2;
    ASSERT_EQ(mean[i], in_chunk2 ? r.grads[1][i] / 3.0f : 0.0f) << i;
  }
}

TEST(MeanReducer, PreviousUsesLastFinalizeAndStartsFromZero) {
  const ChunkLayout layout(1000 * 4, 64 * 4);
  MeanReducer red(layout, 3);
  const Round r1 = MakeRound(layout, 3, 21);
  Feed(red, r1, 0, 21);
  // Before any Finalize the previous mean is zero: kPrevious == kZero exactly.
  std::vector<float> m1(1000);
  red.Finalize(FillMode::kPrevious, m1);
  ExpectMeanEq(m1, ReferenceMean(layout, r1, FillMode::kZero, {}),
               FillMode::kZero);

  red.BeginRound();
  const Round r2 = MakeRound(layout, 3, 22);
  Feed(red, r2, 0, 22);
  std::vector<float> m2(1000);
  red.Finalize(FillMode::kPrevious, m2);
  ExpectMeanEq(m2, ReferenceMean(layout, r2, FillMode::kPrevious, m1),
               FillMode::kPrevious);

  // An empty round under kPrevious carries the last mean forward.
  red.BeginRound();
  std::vector<float> m3(1000);
  red.Finalize(FillMode::kPrevious, m3);
  for (size_t i = 0; i < m3.size(); ++i) {
    ASSERT_NEAR(m3[i], m2[i], 4e-7f * std::abs(m2[i])) << i;
  }
}

TEST(MeanReducer, UnalignedPayloadsGiveTheSameMean) {
  const ChunkLayout layout(10001 * 4, 1456);
  const Round r = MakeRound(layout, 3, 31);
  std::vector<float> aligned(FloatsOf(layout));
  {
    MeanReducer red(layout, 3);
    Feed(red, r, 0, 31);
    red.Finalize(FillMode::kZero, aligned);
  }
  for (size_t misalign = 1; misalign < 4; ++misalign) {
    MeanReducer red(layout, 3);
    Feed(red, r, misalign, 31);
    std::vector<float> mean(FloatsOf(layout));
    red.Finalize(FillMode::kZero, mean);
    EXPECT_EQ(mean, aligned) << "misalign " << misalign;
  }
}

TEST(MeanReducer, DisjointChunkOwnersInParallel) {
  // The server's contract: two RX threads, each owning every other chunk.
  const ChunkLayout layout(10001 * 4, 1456);
  const Round r = MakeRound(layout, 3, 41);
  MeanReducer serial(layout, 3), parallel(layout, 3, 2);
  Feed(serial, r, 0, 41);
  auto owner = [&](uint32_t parity) {
    for (size_t w = 0; w < r.grads.size(); ++w) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(r.grads[w].data());
      for (uint32_t s = parity; s < layout.num_chunks(); s += 2) {
        if (r.arrived[w].Test(s))
          parallel.Accumulate(static_cast<uint32_t>(w), s,
                              bytes + layout.Offset(s), parity);
      }
    }
  };
  std::thread even(owner, 0), odd(owner, 1);
  even.join();
  odd.join();
  std::vector<float> a(FloatsOf(layout)), b(FloatsOf(layout));
  serial.Finalize(FillMode::kRescale, a);
  parallel.Finalize(FillMode::kRescale, b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(parallel.CoveredChunks(), serial.CoveredChunks());
}

TEST(MeanReducer, RejectsBadShapes) {
  EXPECT_THROW(MeanReducer(ChunkLayout(10, 8), 3), std::invalid_argument);
  EXPECT_THROW(MeanReducer(ChunkLayout(16, 8), 0), std::invalid_argument);
  MeanReducer red(ChunkLayout(16, 8), 2);
  std::vector<float> wrong(3);
  EXPECT_THROW(red.Finalize(FillMode::kZero, wrong), std::invalid_argument);
}


TEST(ZeroRandomChunks, ZeroesAboutTheFractionSameChunksForTheSameSeed) {
  const ChunkLayout layout(4000 * 4, 40);  // 400 chunks of 10 floats
  std::vector<float> a(4000, 1.0f), b(4000, 1.0f);
  const uint32_t za = ZeroRandomChunks(a, layout, 0.4, 77);
  const uint32_t zb = ZeroRandomChunks(b, layout, 0.4, 77);
  EXPECT_EQ(za, zb);
  EXPECT_EQ(a, b);  // every worker's copy loses the same chunks
  EXPECT_NEAR(za, 160.0, 5 * std::sqrt(400 * 0.4 * 0.6));
  // Whole chunks only: each chunk is all zero or untouched.
  uint32_t zero_chunks = 0;
  for (uint32_t c = 0; c < 400; ++c) {
    const bool first = a[c * 10] == 0.0f;
    for (int i = 1; i < 10; ++i) EXPECT_EQ(a[c * 10 + i] == 0.0f, first);
    zero_chunks += first ? 1 : 0;
  }
  EXPECT_EQ(zero_chunks, za);
  std::vector<float> c(4000, 1.0f);
  ZeroRandomChunks(c, layout, 0.4, 78);
  EXPECT_NE(a, c);  // another iteration, other chunks
  EXPECT_EQ(ZeroRandomChunks(c, layout, 0.0, 1), 0u);
  EXPECT_THROW(ZeroRandomChunks(c, layout, 1.5, 1), std::invalid_argument);
  std::vector<float> small(10);
  EXPECT_THROW(ZeroRandomChunks(small, layout, 0.5, 1), std::invalid_argument);
}

// The vectorised per-frame loops against the scalar definition, for every
// length up to a jumbo chunk and every source alignment, -0.0 included.
TEST(FloatOps, AddAndStoreMatchScalarForEveryLengthAndAlignment) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> src_f(2300);
  for (auto& v : src_f) v = dist(rng);
  src_f[3] = -0.0f;
  std::vector<uint8_t> src((src_f.size() + 1) * 4);
  for (size_t off : {0u, 1u, 2u, 3u}) {
    std::memcpy(src.data() + off, src_f.data(), src_f.size() * 4);
    for (size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 363u, 2273u}) {
      std::vector<float> base(n), got(n);
      for (auto& v : base) v = dist(rng);
      got = base;
      AddFloats(got.data(), src.data() + off, n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], base[i] + src_f[i]) << n << " " << off << " " << i;
      }
      StoreFloats(got.data(), src.data() + off, n);
      for (size_t i = 0; i < n; ++i) {
        const float want = 0.0f + src_f[i];
        ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << "bit-exact at " << i;
      }
    }
  }
}

// A job that never fills with prev does not copy the mean every round; the
// means it gets are the same, and asking for prev then is an error.
TEST(MeanReducer, KeepPreviousOffSkipsTheCopyNotTheMean) {
  const ChunkLayout layout(64 * 4 * 3, 64 * 4);
  const std::vector<float> g(64, 3.0f);
  MeanReducer kept(layout, 2), lean(layout, 2);
  lean.set_keep_previous(false);
  std::vector<float> a(64 * 3), b(64 * 3);
  for (int round = 0; round < 2; ++round) {
    for (MeanReducer* red : {&kept, &lean}) {
      red->BeginRound();
      red->Accumulate(0, round % 3, reinterpret_cast<const uint8_t*>(g.data()));
    }
    kept.Finalize(FillMode::kZero, a);
    lean.Finalize(FillMode::kZero, b);
    EXPECT_EQ(a, b);
  }
  EXPECT_THROW(lean.Finalize(FillMode::kPrevious, b), std::logic_error);
  // On again: the previous mean restarts at zeros, like a new reducer's.
  lean.set_keep_previous(true);
  lean.Finalize(FillMode::kPrevious, b);
  EXPECT_EQ(b[64], 1.5f);  // (3 + 1 * 0) / 2; the last mean (1.5) is gone
  lean.BeginRound();
  lean.Accumulate(1, 2, reinterpret_cast<const uint8_t*>(g.data()));
  lean.Finalize(FillMode::kPrevious, b);
  EXPECT_EQ(b[2 * 64], 1.5f);  // (3 + 1 * prev) / 2, prev of chunk 2 = 0
}

}  // namespace
}  // namespace dblp

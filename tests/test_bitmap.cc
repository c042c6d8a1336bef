// Bitmap and AtomicBitmap: counting, iteration against a std::vector<bool>
// reference, word import, and the single-writer / many-reader contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "dblp/base/rng.h"
#include "dblp/wire/bitmap.h"

namespace dblp {
namespace {

constexpr uint32_t kOddSizes[] = {1, 2, 63, 64, 65, 127, 128, 129, 1000};

std::vector<uint32_t> SetOf(const Bitmap& b) {
  std::vector<uint32_t> out;
  b.ForEachSet([&](uint32_t s) { out.push_back(s); });
  return out;
}
std::vector<uint32_t> MissingOf(const Bitmap& b) {
  std::vector<uint32_t> out;
  b.ForEachMissing([&](uint32_t s) { out.push_back(s); });
  return out;
}

TEST(BitmapWordsTest, WordsAndMasks) {
  EXPECT_EQ(BitmapWords(0), 0u);
  EXPECT_EQ(BitmapWords(1), 1u);
  EXPECT_EQ(BitmapWords(64), 1u);
  EXPECT_EQ(BitmapWords(65), 2u);
  EXPECT_EQ(BitmapWordMask(64, 0), ~0ull);
  EXPECT_EQ(BitmapWordMask(64, 1), 0u);
  EXPECT_EQ(BitmapWordMask(65, 1), 1u);
  EXPECT_EQ(BitmapWordMask(70, 1), 0x3Full);
  EXPECT_EQ(BitmapWordMask(1, 0), 1u);
}

TEST(BitmapTest, SetReturnsFreshnessAndCounts) {
  Bitmap b(65);
  EXPECT_EQ(b.size(), 65u);
  EXPECT_EQ(b.Count(), 0u);
  EXPECT_EQ(b.MissingCount(), 65u);
  EXPECT_TRUE(b.Set(64));
  EXPECT_FALSE(b.Set(64));
  EXPECT_TRUE(b.Set(0));
  EXPECT_TRUE(b.Set(63));
  EXPECT_FALSE(b.Set(0));
  EXPECT_EQ(b.Count(), 3u);
  EXPECT_EQ(b.MissingCount(), 62u);
  EXPECT_TRUE(b.Test(0));
  EXPECT_TRUE(b.Test(63));
  EXPECT_TRUE(b.Test(64));
  EXPECT_FALSE(b.Test(1));
  EXPECT_FALSE(b.Test(62));
  b.Clear();
  EXPECT_EQ(b.Count(), 0u);
  EXPECT_EQ(b.size(), 65u);
  EXPECT_TRUE(b.Set(64));
}

TEST(BitmapTest, ResizeClears) {
  Bitmap b(10);
  b.Set(3);
  b.Resize(200);
  EXPECT_EQ(b.size(), 200u);
  EXPECT_EQ(b.Count(), 0u);
  EXPECT_EQ(b.words().size(), 4u);
  b.Set(199);
  b.Resize(5);
  EXPECT_EQ(b.Count(), 0u);
  EXPECT_EQ(b.MissingCount(), 5u);
}

TEST(BitmapTest, IterationMatchesReferenceOnRandomMaps) {
  Rng rng(7);
  for (uint32_t n : kOddSizes) {
    for (double density : {0.0, 0.01, 0.5, 0.97, 1.0}) {
      Bitmap b(n);
      std::vector<bool> ref(n, false);
      for (uint32_t i = 0; i < n; ++i) {
        if (rng.Bernoulli(density)) {
          ref[i] = true;
          b.Set(i);
        }
      }
      std::vector<uint32_t> want_set, want_missing;
      for (uint32_t i = 0; i < n; ++i) {
        (ref[i] ? want_set : want_missing).push_back(i);
        ASSERT_EQ(b.Test(i), ref[i]) << n << " " << i;
      }
      EXPECT_EQ(SetOf(b), want_set) << "n=" << n << " d=" << density;
      EXPECT_EQ(MissingOf(b), want_missing) << "n=" << n << " d=" << density;
      EXPECT_EQ(b.Count(), want_set.size());
      EXPECT_EQ(b.MissingCount(), want_missing.size());
    }
  }
}

TEST(BitmapTest, ForEachMissingNeverReportsBitsPastTheEnd) {
  for (uint32_t n : kOddSizes) {
    Bitmap b(n);
    const std::vector<uint32_t> missing = MissingOf(b);
    ASSERT_EQ(missing.size(), n);
    EXPECT_EQ(missing.back(), n - 1);
    for (uint32_t i = 0; i < n; ++i) b.Set(i);
    EXPECT_TRUE(MissingOf(b).empty()) << n;
    EXPECT_EQ(b.MissingCount(), 0u);
  }
}

TEST(BitmapTest, PlaceAtCopiesAWordAlignedPartition) {
  Bitmap whole(200);
  whole.Set(0);
  whole.Set(199);
  Bitmap part(70);  // ends inside word 3 of the whole (bits 128..197)
  part.Set(0);
  part.Set(69);
  EXPECT_TRUE(whole.PlaceAt(128, part));
  EXPECT_EQ(SetOf(whole), (std::vector<uint32_t>{0, 128, 197, 199}));
  // Replaces, not ORs: a cleared bit of the partition clears the whole's.
  Bitmap empty(64);
  Bitmap ones(200);
  for (uint32_t i = 0; i < 200; ++i) ones.Set(i);
  EXPECT_TRUE(ones.PlaceAt(64, empty));
  EXPECT_EQ(ones.Count(), 136u);
  // Unaligned or past the end: refused, unchanged.
  const Bitmap before = whole;
  EXPECT_FALSE(whole.PlaceAt(1, part));
  EXPECT_FALSE(whole.PlaceAt(192, part));
  EXPECT_EQ(whole, before);
}

TEST(BitmapTest, AssignWordsValidates) {
  Bitmap b(65);
  b.Set(5);
  const Bitmap before = b;
  // Wrong word count: rejected, unchanged.
  const std::vector<uint64_t> one = {1};
  const std::vector<uint64_t> three = {1, 0, 0};
  EXPECT_FALSE(b.AssignWords(one));
  EXPECT_FALSE(b.AssignWords(three));
  EXPECT_EQ(b, before);
  // Bit 65 (past the end) set: rejected, unchanged.
  const std::vector<uint64_t> past = {0, 0b10};
  EXPECT_FALSE(b.AssignWords(past));
  EXPECT_EQ(b, before);
  const std::vector<uint64_t> high = {0, 1ull << 63};
  EXPECT_FALSE(b.AssignWords(high));
  EXPECT_EQ(b, before);
  // Valid: replaced.
  const std::vector<uint64_t> ok = {0x8000000000000001ull, 1};
  EXPECT_TRUE(b.AssignWords(ok));
  EXPECT_EQ(SetOf(b), (std::vector<uint32_t>{0, 63, 64}));
  EXPECT_FALSE(b.Test(5));
  // Exactly 64 bits: every bit of the single word is valid.
  Bitmap full(64);
  const std::vector<uint64_t> all = {~0ull};
  EXPECT_TRUE(full.AssignWords(all));
  EXPECT_EQ(full.Count(), 64u);
}

TEST(BitmapTest, WordsRoundTripThroughAssign) {
  Rng rng(11);
  Bitmap a(1000);
  for (int i = 0; i < 300; ++i) a.Set(rng.NextBelow(1000));
  Bitmap b(1000);
  ASSERT_TRUE(b.AssignWords(a.words()));
  EXPECT_EQ(a, b);
  EXPECT_EQ(b.Count(), a.Count());
}

TEST(AtomicBitmapTest, SetTestCountAndReset) {
  AtomicBitmap a(130);
  EXPECT_EQ(a.size(), 130u);
  EXPECT_EQ(a.Count(), 0u);
  EXPECT_TRUE(a.Set(129));
  EXPECT_FALSE(a.Set(129));
  EXPECT_TRUE(a.Set(0));
  EXPECT_EQ(a.Count(), 2u);
  EXPECT_TRUE(a.Test(129));
  EXPECT_FALSE(a.Test(128));
  a.Reset(130);
  EXPECT_EQ(a.Count(), 0u);
  EXPECT_FALSE(a.Test(129));
  EXPECT_FALSE(a.Test(0));
  // Grow, then shrink, then grow again within capacity: always cleared.
  a.Set(5);
  a.Reset(1000);
  EXPECT_EQ(a.size(), 1000u);
  EXPECT_EQ(a.Count(), 0u);
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_FALSE(a.Test(i)) << i;
  a.Set(999);
  a.Reset(10);
  a.Reset(1000);
  EXPECT_FALSE(a.Test(999));
  Bitmap snap;
  a.Snapshot(snap);
  EXPECT_EQ(snap.Count(), 0u);
  EXPECT_EQ(snap.size(), 1000u);
}

TEST(AtomicBitmapTest, SnapshotEqualsPlainBitmap) {
  Rng rng(3);
  for (uint32_t n : kOddSizes) {
    AtomicBitmap a(n);
    Bitmap ref(n);
    for (uint32_t i = 0; i < n; ++i) {
      if (rng.Bernoulli(0.4)) {
        EXPECT_EQ(a.Set(i), ref.Set(i));
      }
    }
    Bitmap snap(7);  // wrong size on purpose: Snapshot resizes
    a.Snapshot(snap);
    EXPECT_EQ(snap, ref) << n;
    EXPECT_EQ(a.Count(), ref.Count()) << n;
  }
}

TEST(AtomicBitmapTest, ConcurrentReaderSeesMonotonicConsistentMaps) {
  constexpr uint32_t kN = 20000;
  AtomicBitmap a(kN);
  std::vector<uint32_t> order(kN);
  std::iota(order.begin(), order.end(), 0u);
  Rng rng(99);
  for (uint32_t i = kN - 1; i > 0; --i) {
    std::swap(order[i], order[rng.NextBelow(i + 1)]);
  }
  std::atomic<bool> done{false};
  std::atomic<uint64_t> snapshots_taken{0};
  // Every 64 Sets the writer waits for the reader to take one more snapshot,
  // so reads really interleave with writes even on a loaded 2-core box.
  std::thread writer([&] {
    uint64_t seen = 0;
    for (uint32_t i = 0; i < kN; ++i) {
      if (i % 64 == 0) {
        while (snapshots_taken.load(std::memory_order_acquire) == seen) {
          std::this_thread::yield();
        }
        seen = snapshots_taken.load(std::memory_order_acquire);
      }
      a.Set(order[i]);
    }
    done.store(true, std::memory_order_release);
  });

  Bitmap prev(kN);
  Bitmap snap;
  uint64_t snapshots = 0;
  bool monotonic = true, count_before_ok = true, count_after_ok = true;
  while (true) {
    const bool finished = done.load(std::memory_order_acquire);
    const uint32_t before = a.Count();
    a.Snapshot(snap);
    const uint32_t after = a.Count();
    const uint32_t c = snap.Count();
    ++snapshots;
    snapshots_taken.store(snapshots, std::memory_order_release);
    // Documented: count released after the bit, so a count seen before the
    // snapshot is covered by it.
    if (c < before) count_before_ok = false;
    // The writer publishes the bit first and the count just after, so a
    // snapshot can be at most one Set ahead of a count read after it.
    if (c > after + 1) count_after_ok = false;
    // Every bit once observed stays set.
    prev.ForEachSet([&](uint32_t s) {
      if (!snap.Test(s)) monotonic = false;
    });
    prev = snap;
    if (finished) break;
  }
  writer.join();
  EXPECT_TRUE(count_before_ok);
  EXPECT_TRUE(count_after_ok);
  EXPECT_TRUE(monotonic);
  EXPECT_GT(snapshots, kN / 64);
  // The snapshot taken after the writer finished is complete.
  EXPECT_EQ(snap.Count(), kN);
  EXPECT_EQ(a.Count(), kN);
  EXPECT_TRUE(MissingOf(snap).empty());
}

}  // namespace
}  // namespace dblp

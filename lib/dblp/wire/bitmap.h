// Chunk bitmaps: which sequence numbers of a round have arrived.
//
// Bitmap        - plain, single-threaded (the sender's copy of the receiver's
//                 BITMAP message, tests, reductions).
// AtomicBitmap  - single writer (the datapath lcore that owns the round),
//                 many readers (the control thread answering PROBE). The
//                 writer never uses read-modify-write instructions: it is
//                 the only writer, so a relaxed load + release store is
//                 enough and costs a plain store on x86.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace dblp {

constexpr uint32_t BitmapWords(uint32_t bits) { return (bits + 63) / 64; }

// Mask of the valid bits in word `w` of a `bits`-bit map.
constexpr uint64_t BitmapWordMask(uint32_t bits, uint32_t w) {
  const uint32_t full_words = bits / 64;
  if (w < full_words) return ~0ull;
  const uint32_t rem = bits % 64;
  return (w == full_words && rem != 0) ? ((1ull << rem) - 1) : 0;
}

class Bitmap {
 public:
  Bitmap() = default;
  explicit Bitmap(uint32_t num_bits) { Resize(num_bits); }

  // Resizes and clears.
  void Resize(uint32_t num_bits) {
    num_bits_ = num_bits;
    words_.assign(BitmapWords(num_bits), 0);
  }
  void Clear() { std::fill(words_.begin(), words_.end(), 0); }

  // Returns true if the bit was newly set. Precondition: i < size().
  bool Set(uint32_t i) {
    uint64_t& w = words_[i >> 6];
    const uint64_t bit = 1ull << (i & 63);
    const bool fresh = (w & bit) == 0;
    w |= bit;
    return fresh;
  }
  bool Test(uint32_t i) const { return (words_[i >> 6] >> (i & 63)) & 1; }

  uint32_t size() const { return num_bits_; }
  uint32_t Count() const;
  uint32_t MissingCount() const { return num_bits_ - Count(); }
  std::span<const uint64_t> words() const { return words_; }

  // Replaces the contents with `words` (e.g. from a BITMAP message). Returns
  // false, leaving the bitmap unchanged, if the word count does not match or
  // a bit beyond size() is set.
  bool AssignWords(std::span<const uint64_t> words);
  // Replaces bits [first, first + part.size()) with `part`: a partition's
  // bitmap put into the whole gradient's (server shards). `first` must be
  // a multiple of 64, so whole words copy; false (unchanged) if it is not
  // or `part` does not fit.
  bool PlaceAt(uint32_t first, const Bitmap& part);
  // Sets every bit `other` has (a lane's view of the same round). False,
  // and nothing changed, when the sizes differ.
  bool OrWith(const Bitmap& other);

  // Calls f(seq) for each clear bit, in increasing order. Skips full words
  // with one compare, so a nearly complete map is walked in N/64 steps.
  template <class F>
  void ForEachMissing(F&& f) const {
    for (uint32_t w = 0; w < words_.size(); ++w) {
      uint64_t missing = ~words_[w] & BitmapWordMask(num_bits_, w);
      while (missing != 0) {
        f(w * 64 + static_cast<uint32_t>(std::countr_zero(missing)));
        missing &= missing - 1;
      }
    }
  }
  // Calls f(seq) for each set bit, in increasing order.
  template <class F>
  void ForEachSet(F&& f) const {
    for (uint32_t w = 0; w < words_.size(); ++w) {
      uint64_t set = words_[w];
      while (set != 0) {
        f(w * 64 + static_cast<uint32_t>(std::countr_zero(set)));
        set &= set - 1;
      }
    }
  }

  bool operator==(const Bitmap&) const = default;

 private:
  uint32_t num_bits_ = 0;
  std::vector<uint64_t> words_;
};

class AtomicBitmap {
 public:
  AtomicBitmap() = default;
  explicit AtomicBitmap(uint32_t num_bits) { Reset(num_bits); }

  // Writer only, while no reader is looking (between rounds): resizes if
  // needed and clears.
  void Reset(uint32_t num_bits);

  // Writer only. Returns true if the bit was newly set. Precondition:
  // i < size().
  bool Set(uint32_t i) {
    std::atomic<uint64_t>& w = words_[i >> 6];
    const uint64_t bit = 1ull << (i & 63);
    const uint64_t old = w.load(std::memory_order_relaxed);
    if (old & bit) return false;
    w.store(old | bit, std::memory_order_release);
    count_.store(count_.load(std::memory_order_relaxed) + 1,
                 std::memory_order_release);
    return true;
  }

  // Any thread.
  bool Test(uint32_t i) const {
    return (words_[i >> 6].load(std::memory_order_acquire) >> (i & 63)) & 1;
  }
  // Any thread: bits set so far. A reader that sees count c also sees at
  // least c bits in a later Snapshot (both are released in that order).
  uint32_t Count() const { return count_.load(std::memory_order_acquire); }
  uint32_t size() const { return num_bits_; }

  // Any thread: copies the current bits into `out` (resized to size()).
  void Snapshot(Bitmap& out) const;

 private:
  uint32_t num_bits_ = 0;
  uint32_t capacity_words_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> words_;  // writer: owner; readers: any
  alignas(64) std::atomic<uint32_t> count_{0};      // writer: owner; readers: any
};

}  // namespace dblp

#include "dblp/wire/bitmap.h"

#include <algorithm>

namespace dblp {

uint32_t Bitmap::Count() const {
  uint32_t n = 0;
  for (uint64_t w : words_) n += static_cast<uint32_t>(std::popcount(w));
  return n;
}

bool Bitmap::AssignWords(std::span<const uint64_t> words) {
  if (words.size() != words_.size()) return false;
  for (uint32_t w = 0; w < words.size(); ++w) {
    if (words[w] & ~BitmapWordMask(num_bits_, w)) return false;
  }
  std::copy(words.begin(), words.end(), words_.begin());
  return true;
}

bool Bitmap::OrWith(const Bitmap& other) {
  if (other.num_bits_ != num_bits_) return false;
  for (size_t w = 0; w < words_.size(); ++w) words_[w] |= other.words_[w];
  return true;
}

bool Bitmap::PlaceAt(uint32_t first, const Bitmap& part) {
  if (first % 64 != 0 || uint64_t{first} + part.size() > num_bits_) {
    return false;
  }
  const uint32_t base = first / 64;
  for (uint32_t w = 0; w < part.words_.size(); ++w) {
    // A partition that ends inside a word owns only its own bits of it.
    const uint64_t mask = BitmapWordMask(part.num_bits_, w);
    words_[base + w] = (words_[base + w] & ~mask) | (part.words_[w] & mask);
  }
  return true;
}

void AtomicBitmap::Reset(uint32_t num_bits) {
  const uint32_t need = BitmapWords(num_bits);
  if (need > capacity_words_) {
    words_ = std::make_unique<std::atomic<uint64_t>[]>(need);
    capacity_words_ = need;
  }
  num_bits_ = num_bits;
  for (uint32_t w = 0; w < need; ++w) {
    words_[w].store(0, std::memory_order_relaxed);
  }
  count_.store(0, std::memory_order_release);
}

void AtomicBitmap::Snapshot(Bitmap& out) const {
  if (out.size() != num_bits_) out.Resize(num_bits_);
  std::vector<uint64_t> tmp(BitmapWords(num_bits_));
  for (uint32_t w = 0; w < tmp.size(); ++w) {
    tmp[w] = words_[w].load(std::memory_order_acquire);
  }
  out.AssignWords(tmp);
}

}  // namespace dblp

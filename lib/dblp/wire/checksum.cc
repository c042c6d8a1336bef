#include "dblp/wire/checksum.h"

#include <cstring>

#include "dblp/base/vector_clones.h"

namespace dblp {
namespace {

// Folds a 64-bit sum of 16-bit-aligned words to 16 bits: 2^16 = 1 modulo
// 0xFFFF, so every carry goes back in at the bottom.
uint16_t Fold64(uint64_t s) {
  s = (s & 0xFFFFFFFFu) + (s >> 32);
  s = (s & 0xFFFFFFFFu) + (s >> 32);
  s = (s & 0xFFFFu) + (s >> 16);
  s = (s & 0xFFFFu) + (s >> 16);
  s = (s & 0xFFFFu) + (s >> 16);
  return static_cast<uint16_t>(s);
}

// The bytes after the last whole 32-bit word: a 16-bit word, then an odd
// byte in the low-address half of a zero-padded word.
uint64_t TailSum(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  if (n >= 2) {
    uint16_t w;
    std::memcpy(&w, p, 2);
    s += w;
    p += 2;
    n -= 2;
  }
  if (n == 1) {
    uint8_t pad[2] = {p[0], 0};
    uint16_t w;
    std::memcpy(&w, pad, 2);
    s += w;
  }
  return s;
}

}  // namespace

DBLP_VECTOR_CLONES uint16_t OnesSum16(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    s += w;
  }
  return Fold64(s + TailSum(p + i, n - i));
}

DBLP_VECTOR_CLONES uint16_t CopyAndSum16(uint8_t* dst, const uint8_t* src,
                                         size_t n) {
  // 32-bit words summed into a 64-bit accumulator cannot overflow below
  // 2^32 words; the compiler turns the loop into a vector copy and add.
  if (n == 0) return 0;  // an empty payload may come with a null pointer
  uint64_t s = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t w;
    std::memcpy(&w, src + i, 4);
    std::memcpy(dst + i, &w, 4);
    s += w;
  }
  if (i < n) std::memcpy(dst + i, src + i, n - i);
  return Fold64(s + TailSum(src + i, n - i));
}

}  // namespace dblp

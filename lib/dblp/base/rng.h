// Small, fast, seeded PRNG shared by the loss injector, the send order and the
// tests. Deterministic across platforms (unlike std::uniform_*_distribution),
// so a seed reproduces the same losses everywhere.
#pragma once

#include <cstdint>

namespace dblp {

// SplitMix64: used to expand one user seed into well-mixed state words and as
// a stateless hash of (seed, round, rank).
constexpr uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t HashMix(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0xD6E8FEB86659FD93ull);
  return SplitMix64(s);
}

// xoshiro256** (Blackman & Vigna): 4 words of state, a few cycles per draw.
class Rng {
 public:
  explicit constexpr Rng(uint64_t seed = 1) { Seed(seed); }

  constexpr void Seed(uint64_t seed) {
    uint64_t sm = seed;
    for (auto& w : s_) w = SplitMix64(sm);
  }

  constexpr uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform double in [0, 1) with 53 random bits.
  constexpr double NextDouble() {
    return static_cast<double>(Next() >> 11) * 0x1.0p-53;
  }

  // Uniform integer in [0, bound) (Lemire's multiply-shift; bias < 2^-32 for
  // the bounds we use, far below anything a test could observe).
  constexpr uint32_t NextBelow(uint32_t bound) {
    return static_cast<uint32_t>(((Next() >> 32) * bound) >> 32);
  }

  // True with probability `p` (p <= 0: never, p >= 1: always).
  constexpr bool Bernoulli(double p) { return NextDouble() < p; }

 private:
  static constexpr uint64_t Rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
  }
  uint64_t s_[4]{};
};

}  // namespace dblp

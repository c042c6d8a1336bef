// The Internet checksum's ones'-complement sum, fused with a copy: the
// frame builder copies a chunk of the gradient into the frame and sums it in
// the same pass, so a payload that lives in DRAM (a 25 MB gradient does) is
// read once instead of twice. DPDK-free, so it is tested without an EAL
// against a plain 16-bit reference.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dblp {

// Sum of `n` bytes as 16-bit words in memory order (a trailing odd byte
// padded with zero), folded to 16 bits with end-around carry: the value
// rte_raw_cksum returns. A sum over an even-offset part of a datagram can
// be added to the sums of the other parts with AddSum16.
uint16_t OnesSum16(const uint8_t* p, size_t n);

// Copies `n` bytes from `src` to `dst` (no overlap) and returns
// OnesSum16(src, n).
uint16_t CopyAndSum16(uint8_t* dst, const uint8_t* src, size_t n);

// Ones'-complement addition of two folded sums.
inline uint16_t AddSum16(uint16_t a, uint16_t b) {
  uint32_t s = uint32_t{a} + b;
  return static_cast<uint16_t>((s & 0xFFFFu) + (s >> 16));
}

}  // namespace dblp

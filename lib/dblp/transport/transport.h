// The burst-shaped transport contract.
//
// Protocol code is written against this shape, as a template parameter (no
// virtual call per packet), so the same round logic runs over DPDK ethdev
// ports (src/), over the in-memory loopback below (tests, the in-memory
// demo) and, for comparison, over kernel UDP sockets:
//
//   uint16_t TxBurst(Packet* pkts, uint16_t n);  // takes ownership of the
//                                                // first k <= n, returns k
//   uint16_t RxBurst(Packet* out, uint16_t max); // fills up to max, returns k
//
// A packet that TxBurst accepted may still be lost on the way (loss
// injector, full receive ring): like a real wire, the sender is not told.
#pragma once

#include <concepts>
#include <cstdint>
#include <vector>

namespace dblp {

// An in-memory frame: the bytes after the UDP header, plus addressing.
struct Packet {
  uint32_t src = 0;  // endpoint id of the sender
  uint32_t dst = 0;  // endpoint id of the receiver
  std::vector<uint8_t> bytes;
};

template <class T>
concept BurstTransport = requires(T t, Packet* p, uint16_t n) {
  { t.TxBurst(p, n) } -> std::same_as<uint16_t>;
  { t.RxBurst(p, n) } -> std::same_as<uint16_t>;
};

}  // namespace dblp

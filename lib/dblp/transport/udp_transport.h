// The burst transport over a kernel UDP socket: the comparison point for
// the DPDK datapath, and a fallback where DPDK cannot run.
//
// One non-blocking IPv4 UDP socket. TxBurst is one sendmmsg() and RxBurst
// one recvmmsg(MSG_DONTWAIT) or a few, so a burst costs one syscall or so
// either way.
//
// Segmentation offload where the kernel has it (Linux 4.18 and 5.0 on):
// TxBurst hands consecutive datagrams of one size to one peer to the kernel
// as one message (UDP_SEGMENT, up to 64 KB), and the socket takes what
// arrives coalesced (UDP_GRO), split again here. The datagrams on the wire
// are the same; the stack is crossed once per 64 KB instead of once per
// frame (25 MiB over loopback here: 41-44 ms, against 105-109 ms with
// sendmmsg of 32 and one recv a datagram; docs/BENCHMARKS.md "The whole
// exchange").
// Endpoint ids map to socket addresses through a small table (AddPeer);
// received datagrams are tagged with the id of their source address.
//
// Threading: one owner thread calls TxBurst/RxBurst; the counters may be
// read from any thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/transport/transport.h"

namespace dblp {

struct UdpPortOptions {
  // Largest datagram RxBurst accepts; longer ones are counted and dropped.
  // Keep it to what the protocol sends (MTU - IP - UDP headers): received
  // bytes land directly in each Packet's vector, sized to this.
  uint32_t max_datagram = 9216 - 28;
  // SO_RCVBUF / SO_SNDBUF wish (bytes). The *FORCE variants are tried first
  // (root may exceed net.core.rmem_max), then the capped ones.
  int socket_buffer_bytes = 32 << 20;
  // UDP_SEGMENT on send and UDP_GRO on receive where the kernel has them;
  // off: one datagram per message both ways.
  bool segmentation = true;
};

class UdpSocketPort {
 public:
  // RxBurst/TxBurst handle at most this many packets per call.
  static constexpr uint16_t kMaxBurst = 128;
  // Packet::src of a datagram from an address not in the peer table.
  static constexpr uint32_t kUnknownEndpoint = UINT32_MAX;

  UdpSocketPort() = default;
  ~UdpSocketPort();
  UdpSocketPort(const UdpSocketPort&) = delete;
  UdpSocketPort& operator=(const UdpSocketPort&) = delete;

  // Binds to "ip:port" (port 0 = ephemeral). Returns false with *error
  // naming the fix (bad address, port in use, ...). Never throws.
  bool Open(const std::string& bind_addr, const UdpPortOptions& opts,
            std::string* error);
  bool is_open() const { return fd_ >= 0; }
  void Close();

  // Endpoint `id` is reachable at `addr`. Ids index a table: keep them small.
  void AddPeer(uint32_t id, const sockaddr_in& addr);

  // One sendmmsg(): sends up to n packets to their dst's address and
  // returns how many the kernel took (fewer on EAGAIN; never blocks). A
  // packet whose dst is unknown is taken and dropped (counted).
  uint16_t TxBurst(Packet* pkts, uint16_t n);
  // One recvmmsg(MSG_DONTWAIT): fills up to max packets (bytes, src) and
  // returns how many. Each Packet's vector is reused, so once warm this
  // allocates nothing.
  uint16_t RxBurst(Packet* out, uint16_t max);

  uint16_t bound_port() const { return bound_port_; }
  const sockaddr_in& bound_addr() const { return bound_; }
  int fd() const { return fd_; }
  // Effective kernel buffer sizes (what getsockopt reports).
  int rcvbuf_bytes() const { return rcvbuf_; }
  int sndbuf_bytes() const { return sndbuf_; }

  uint64_t tx_frames() const { return Get(tx_frames_); }
  uint64_t rx_frames() const { return Get(rx_frames_); }
  // sendmmsg() calls that stopped short on a full socket buffer.
  uint64_t tx_eagain() const { return Get(tx_eagain_); }
  uint64_t tx_errors() const { return Get(tx_errors_); }
  uint64_t tx_no_route() const { return Get(tx_no_route_); }
  uint64_t rx_truncated() const { return Get(rx_truncated_); }
  // Messages that carried several datagrams: sent with UDP_SEGMENT, and
  // received coalesced by UDP_GRO.
  uint64_t tx_segmented() const { return Get(tx_segmented_); }
  uint64_t rx_coalesced() const { return Get(rx_coalesced_); }
  // Whether sends are segmented / receives coalesced (false where the
  // kernel refused, or with UdpPortOptions::segmentation off).
  bool tx_segmentation() const { return gso_; }
  bool rx_coalescing() const { return gro_; }
  // Datagrams the kernel dropped on a full receive buffer (SO_RXQ_OVFL);
  // 0 where the kernel does not report it.
  uint64_t socket_drops() const { return Get(socket_drops_); }

 private:
  static uint64_t Get(const std::atomic<uint64_t>& c) {
    return c.load(std::memory_order_relaxed);
  }
  // Single writer: a plain store, no locked instruction.
  static void Add(std::atomic<uint64_t>& c, uint64_t n) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint32_t Lookup(const sockaddr_in& sa);
  void ArmRx(uint16_t i, uint8_t* buf, size_t len);
  uint16_t RxBurstCoalesced(Packet* out, uint16_t max);
  // Hands out datagrams of the coalesced messages received so far.
  uint16_t DrainCoalesced(Packet* out, uint16_t max);

  int fd_ = -1;
  uint16_t bound_port_ = 0;
  sockaddr_in bound_{};
  uint32_t max_datagram_ = 0;
  int rcvbuf_ = 0, sndbuf_ = 0;
  struct Peer {
    bool valid = false;
    sockaddr_in addr{};
  };
  std::vector<Peer> peers_;
  uint32_t last_src_ = kUnknownEndpoint;  // cache: bursts come from one peer
  // Per-call scratch, sized kMaxBurst once in Open().
  std::vector<mmsghdr> tx_msgs_, rx_msgs_;
  std::vector<iovec> tx_iov_, rx_iov_;
  std::vector<sockaddr_in> rx_names_;
  std::vector<uint16_t> tx_index_;   // msg -> packet index
  std::vector<uint8_t> rx_control_;  // cmsg space per message
  // Segmentation: per message its first packet and packet count, its
  // UDP_SEGMENT cmsg.
  bool gso_ = false, gro_ = false;
  std::vector<uint16_t> tx_count_;
  std::vector<uint8_t> tx_control_;
  // Coalesced messages received and not yet handed out, in order:
  // gro_[next_msg_ .. got_msgs_), the first at byte gro_off_.
  struct Coalesced {
    std::vector<uint8_t> bytes;
    uint32_t len = 0;  // bytes received
    uint32_t seg = 0;  // datagram size (the last may be shorter)
    uint32_t src = kUnknownEndpoint;
  };
  std::vector<Coalesced> gro_msgs_;
  uint16_t next_msg_ = 0, got_msgs_ = 0;
  uint32_t gro_off_ = 0;
  std::atomic<uint64_t> tx_frames_{0}, rx_frames_{0}, tx_eagain_{0},
      tx_errors_{0}, tx_no_route_{0}, rx_truncated_{0}, socket_drops_{0},
      tx_segmented_{0}, rx_coalesced_{0};
};

static_assert(BurstTransport<UdpSocketPort>);

}  // namespace dblp

#include "dblp/transport/udp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "dblp/base/sys_error.h"

namespace dblp {
namespace {

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103  // linux/udp.h, Linux 4.18
#endif
#ifndef UDP_GRO
#define UDP_GRO 104  // linux/udp.h, Linux 5.0
#endif

// The receive-overflow counter rides in a cmsg with each datagram, and
// with UDP_GRO the coalesced message's datagram size.
constexpr size_t kControlSpace =
    CMSG_SPACE(sizeof(uint32_t)) + CMSG_SPACE(sizeof(int));
// UDP_SEGMENT's datagram size.
constexpr size_t kSegmentControlSpace = CMSG_SPACE(sizeof(uint16_t));
// The kernel's limits on one segmented send: UDP_MAX_SEGMENTS, and an IPv4
// datagram's payload.
constexpr uint16_t kMaxSegments = 64;
constexpr size_t kMaxSegmentedBytes = 65507;
// Coalesced receives: messages per recvmmsg(), each up to 64 KB.
constexpr uint16_t kCoalescedMessages = 8;
constexpr size_t kCoalescedBytes = 65536;

// A received message's cmsgs: the socket's drop counter (true if it came,
// *drops raised to it) and, with `seg`, UDP_GRO's datagram size.
bool ReadControl(msghdr& h, uint64_t* drops, uint32_t* seg) {
  bool saw_drops = false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
      uint32_t v;
      std::memcpy(&v, CMSG_DATA(c), sizeof v);
      *drops = std::max<uint64_t>(*drops, v);
      saw_drops = true;
    } else if (seg != nullptr && c->cmsg_level == SOL_UDP &&
               c->cmsg_type == UDP_GRO) {
      int size;
      std::memcpy(&size, CMSG_DATA(c), sizeof size);
      if (size > 0) *seg = static_cast<uint32_t>(size);
    }
  }
  return saw_drops;
}

bool SameAddr(const sockaddr_in& a, const sockaddr_in& b) {
  return a.sin_addr.s_addr == b.sin_addr.s_addr && a.sin_port == b.sin_port;
}

// Sets a socket buffer to `bytes`: the FORCE option first (root may exceed
// the sysctl cap), then the capped one. Returns the size the kernel reports.
int EnlargeBuffer(int fd, int force_opt, int opt, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) != 0) {
    setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);  // best effort
  }
  int got = 0;
  socklen_t len = sizeof got;
  getsockopt(fd, SOL_SOCKET, opt, &got, &len);
  return got;
}

}  // namespace

UdpSocketPort::~UdpSocketPort() { Close(); }

void UdpSocketPort::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool UdpSocketPort::Open(const std::string& bind_addr,
                         const UdpPortOptions& opts, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = "UDP socket on " + bind_addr + ": " + why;
    Close();
    return false;
  };
  if (fd_ >= 0)
    return fail("already open (port " + std::to_string(bound_port_) + ")");
  if (opts.max_datagram == 0 || opts.max_datagram > 65507) {
    return fail("max_datagram " + std::to_string(opts.max_datagram) +
                " is not in 1..65507");
  }
  sockaddr_in sa{};
  std::string perr;
  if (!ParseIpv4Endpoint(bind_addr, /*allow_any=*/true,
                         /*allow_any_port=*/true, "127.0.0.1:9200", &sa,
                         &perr)) {
    if (error) *error = perr;
    return false;
  }
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return fail("socket(): " + ErrnoText(errno));
  if (bind(fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;  // before the strings below allocate
    return fail(BindFailureText(
        err,
        "another process has it: stop it or pick another port, 0 = "
        "any free one",
        "0.0.0.0, 127.0.0.1 or a local IP"));
  }
  socklen_t len = sizeof bound_;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&bound_), &len) != 0) {
    return fail("getsockname(): " + ErrnoText(errno));
  }
  bound_port_ = ntohs(bound_.sin_port);
  // A burst arrives faster than one thread drains it: without room for
  // many bursts the kernel drops them before the protocol ever sees them.
  rcvbuf_ =
      EnlargeBuffer(fd_, SO_RCVBUFFORCE, SO_RCVBUF, opts.socket_buffer_bytes);
  sndbuf_ =
      EnlargeBuffer(fd_, SO_SNDBUFFORCE, SO_SNDBUF, opts.socket_buffer_bytes);
  // Kernel drop counter on each datagram; without it socket_drops stays 0.
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof one);

  // Segmentation where the kernel has it: a send that it refuses later
  // (a device that cannot checksum) turns it off then (TxBurst).
  gso_ = gro_ = false;
  if (opts.segmentation) {
    int off = 0;
    socklen_t off_len = sizeof off;
    gso_ = getsockopt(fd_, SOL_UDP, UDP_SEGMENT, &off, &off_len) == 0;
    gro_ = setsockopt(fd_, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  }
  max_datagram_ = opts.max_datagram;
  tx_count_.assign(kMaxBurst, 0);
  tx_control_.assign(kMaxBurst * kSegmentControlSpace, 0);
  gro_msgs_.resize(gro_ ? kCoalescedMessages : 0);
  for (Coalesced& c : gro_msgs_) c.bytes.resize(kCoalescedBytes);
  next_msg_ = got_msgs_ = 0;
  gro_off_ = 0;
  tx_msgs_.assign(kMaxBurst, mmsghdr{});
  rx_msgs_.assign(kMaxBurst, mmsghdr{});
  tx_iov_.assign(kMaxBurst, iovec{});
  rx_iov_.assign(kMaxBurst, iovec{});
  rx_names_.assign(kMaxBurst, sockaddr_in{});
  tx_index_.assign(kMaxBurst, 0);
  rx_control_.assign(kMaxBurst * kControlSpace, 0);
  return true;
}

void UdpSocketPort::AddPeer(uint32_t id, const sockaddr_in& addr) {
  if (id >= peers_.size()) peers_.resize(id + 1);
  peers_[id].valid = true;
  peers_[id].addr = addr;
  last_src_ = kUnknownEndpoint;
}

uint32_t UdpSocketPort::Lookup(const sockaddr_in& sa) {
  if (last_src_ != kUnknownEndpoint && SameAddr(peers_[last_src_].addr, sa)) {
    return last_src_;
  }
  for (uint32_t id = 0; id < peers_.size(); ++id) {
    if (peers_[id].valid && SameAddr(peers_[id].addr, sa)) {
      last_src_ = id;
      return id;
    }
  }
  return kUnknownEndpoint;
}

uint16_t UdpSocketPort::TxBurst(Packet* pkts, uint16_t n) {
  if (fd_ < 0 || n == 0) return 0;
  n = std::min(n, kMaxBurst);
  // Messages: one datagram each, or with segmentation a run of datagrams
  // of one size to one peer (the last may be shorter) as one message.
  unsigned msgs = 0, iovs = 0;
  for (uint16_t i = 0; i < n;) {
    const uint32_t dst = pkts[i].dst;
    if (dst >= peers_.size() || !peers_[dst].valid) {
      ++i;
      continue;
    }
    const size_t seg = pkts[i].bytes.size();
    uint16_t k = 1;
    size_t total = seg;
    while (gso_ && seg != 0 && i + k < n && k < kMaxSegments &&
           pkts[i + k].dst == dst) {
      const size_t len = pkts[i + k].bytes.size();
      if (len == 0 || len > seg || total + len > kMaxSegmentedBytes) break;
      total += len;
      ++k;
      if (len < seg) break;  // a shorter datagram ends the run
    }
    for (uint16_t j = 0; j < k; ++j) {
      tx_iov_[iovs + j] = {pkts[i + j].bytes.data(), pkts[i + j].bytes.size()};
    }
    msghdr& h = tx_msgs_[msgs].msg_hdr;
    h = msghdr{};
    h.msg_name = &peers_[dst].addr;
    h.msg_namelen = sizeof(sockaddr_in);
    h.msg_iov = &tx_iov_[iovs];
    h.msg_iovlen = k;
    if (k > 1) {
      h.msg_control = &tx_control_[msgs * kSegmentControlSpace];
      h.msg_controllen = kSegmentControlSpace;
      cmsghdr* c = CMSG_FIRSTHDR(&h);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const auto size = static_cast<uint16_t>(seg);
      std::memcpy(CMSG_DATA(c), &size, sizeof size);
    }
    tx_index_[msgs] = i;
    tx_count_[msgs] = k;
    ++msgs;
    iovs += k;
    i = static_cast<uint16_t>(i + k);
  }
  // Packets [0, taken) leave this call: sent, or dropped as unroutable or
  // refused by the kernel for good.
  uint16_t taken = n;
  if (msgs > 0) {
    const int sent = sendmmsg(fd_, tx_msgs_.data(), msgs, MSG_DONTWAIT);
    if (sent < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS ||
          err == EINTR) {
        Add(tx_eagain_, 1);
        taken = tx_index_[0];
      } else if (tx_count_[0] > 1) {
        // The kernel would not segment this one (a device that cannot
        // checksum, a path MTU below the datagrams): one datagram a
        // message from now on, these included.
        gso_ = false;
        return TxBurst(pkts, n);
      } else {
        // A datagram the kernel will never take (EMSGSIZE, unreachable):
        // lose it like a wire would rather than retry it forever.
        Add(tx_errors_, 1);
        taken = static_cast<uint16_t>(tx_index_[0] + 1);
      }
    } else {
      uint64_t frames = 0, segmented = 0;
      for (int m = 0; m < sent; ++m) {
        frames += tx_count_[m];
        segmented += tx_count_[m] > 1;
      }
      Add(tx_frames_, frames);
      if (segmented) Add(tx_segmented_, segmented);
      if (static_cast<unsigned>(sent) < msgs) {
        Add(tx_eagain_, 1);
        taken = tx_index_[sent];
      }
    }
  }
  uint64_t unroutable = 0;
  for (uint16_t i = 0; i < taken; ++i) {
    const uint32_t dst = pkts[i].dst;
    unroutable += dst >= peers_.size() || !peers_[dst].valid;
  }
  if (unroutable) Add(tx_no_route_, unroutable);
  return taken;
}

// Message i of the next recvmmsg(): `len` bytes at `buf`, the source's
// address and the cmsgs in their per-message slots.
void UdpSocketPort::ArmRx(uint16_t i, uint8_t* buf, size_t len) {
  rx_iov_[i] = {buf, len};
  msghdr& h = rx_msgs_[i].msg_hdr;
  h.msg_name = &rx_names_[i];
  h.msg_namelen = sizeof(sockaddr_in);
  h.msg_iov = &rx_iov_[i];
  h.msg_iovlen = 1;
  h.msg_control = &rx_control_[i * kControlSpace];
  h.msg_controllen = kControlSpace;
  h.msg_flags = 0;
}

uint16_t UdpSocketPort::RxBurst(Packet* out, uint16_t max) {
  if (fd_ < 0 || max == 0) return 0;
  max = std::min(max, kMaxBurst);
  if (gro_) return RxBurstCoalesced(out, max);
  for (uint16_t i = 0; i < max; ++i) {
    // No allocation once capacity is there; no zero-fill either while the
    // previous datagram in this slot was full-sized.
    out[i].bytes.resize(max_datagram_);
    ArmRx(i, out[i].bytes.data(), max_datagram_);
  }
  const int got = recvmmsg(fd_, rx_msgs_.data(), max, MSG_DONTWAIT, nullptr);
  if (got <= 0) return 0;
  uint16_t kept = 0;
  uint64_t drops = 0;
  bool saw_drops = false;
  for (int j = 0; j < got; ++j) {
    msghdr& h = rx_msgs_[j].msg_hdr;
    saw_drops |= ReadControl(h, &drops, nullptr);
    if (h.msg_flags & MSG_TRUNC) {
      Add(rx_truncated_, 1);
      continue;
    }
    if (kept != j) std::swap(out[kept].bytes, out[j].bytes);
    out[kept].bytes.resize(rx_msgs_[j].msg_len);
    out[kept].src = Lookup(rx_names_[j]);
    out[kept].dst = 0;
    ++kept;
  }
  Add(rx_frames_, static_cast<uint64_t>(got));
  // The kernel's counter is cumulative for the socket (32 bits).
  if (saw_drops && drops > Get(socket_drops_)) {
    socket_drops_.store(drops, std::memory_order_relaxed);
  }
  return kept;
}

// Fewer than `max` only once the socket has nothing more (the caller takes
// a short burst for a drained queue).
uint16_t UdpSocketPort::RxBurstCoalesced(Packet* out, uint16_t max) {
  uint16_t kept = DrainCoalesced(out, max);
  while (kept < max) {
    for (uint16_t m = 0; m < kCoalescedMessages; ++m) {
      ArmRx(m, gro_msgs_[m].bytes.data(), kCoalescedBytes);
    }
    const int got = recvmmsg(fd_, rx_msgs_.data(), kCoalescedMessages,
                             MSG_DONTWAIT, nullptr);
    if (got <= 0) break;
    uint64_t drops = 0, datagrams = 0, coalesced = 0;
    bool saw_drops = false;
    for (int j = 0; j < got; ++j) {
      msghdr& h = rx_msgs_[j].msg_hdr;
      Coalesced& c = gro_msgs_[j];
      c.len = rx_msgs_[j].msg_len;
      c.seg = c.len;
      saw_drops |= ReadControl(h, &drops, &c.seg);
      if (h.msg_flags & MSG_TRUNC) {  // past 64 KB: nothing of it is whole
        Add(rx_truncated_, 1);
        ++datagrams;
        c.len = 0;
        c.seg = 1;  // nothing to hand out
        continue;
      }
      c.src = Lookup(rx_names_[j]);
      const uint32_t n = c.seg ? (c.len + c.seg - 1) / c.seg : 1;
      datagrams += std::max(n, 1u);
      coalesced += n > 1;
    }
    Add(rx_frames_, datagrams);
    if (coalesced) Add(rx_coalesced_, coalesced);
    if (saw_drops && drops > Get(socket_drops_)) {
      socket_drops_.store(drops, std::memory_order_relaxed);
    }
    next_msg_ = 0;
    got_msgs_ = static_cast<uint16_t>(got);
    gro_off_ = 0;
    kept = static_cast<uint16_t>(kept + DrainCoalesced(out + kept,
                                                       max - kept));
    if (got < kCoalescedMessages) break;  // the socket is drained
  }
  return kept;
}

uint16_t UdpSocketPort::DrainCoalesced(Packet* out, uint16_t max) {
  uint16_t k = 0;
  while (k < max && next_msg_ < got_msgs_) {
    const Coalesced& c = gro_msgs_[next_msg_];
    if (c.seg == 0) {  // an empty datagram
      out[k].bytes.clear();
      out[k].src = c.src;
      out[k].dst = 0;
      ++k;
      ++next_msg_;
      continue;
    }
    if (gro_off_ >= c.len) {
      ++next_msg_;
      gro_off_ = 0;
      continue;
    }
    const uint32_t len = std::min(c.seg, c.len - gro_off_);
    const uint8_t* p = c.bytes.data() + gro_off_;
    gro_off_ += len;
    if (len > max_datagram_) {  // longer than the protocol sends
      Add(rx_truncated_, 1);
      continue;
    }
    // assign() keeps the vector's buffer: no allocation once warm.
    if (out[k].bytes.capacity() < max_datagram_) {
      out[k].bytes.reserve(max_datagram_);
    }
    out[k].bytes.assign(p, p + len);
    out[k].src = c.src;
    out[k].dst = 0;
    ++k;
  }
  return k;
}

}  // namespace dblp

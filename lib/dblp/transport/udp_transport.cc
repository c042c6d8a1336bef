#include "dblp/transport/udp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "dblp/base/sys_error.h"

namespace dblp {
namespace {

// The receive-overflow counter rides in a cmsg with each datagram.
constexpr size_t kControlSpace = CMSG_SPACE(sizeof(uint32_t));

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

  max_datagram_ = opts.max_datagram;
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
  unsigned routed = 0;
  for (uint16_t i = 0; i < n; ++i) {
    const uint32_t dst = pkts[i].dst;
    if (dst >= peers_.size() || !peers_[dst].valid) continue;
    tx_iov_[routed] = {pkts[i].bytes.data(), pkts[i].bytes.size()};
    msghdr& h = tx_msgs_[routed].msg_hdr;
    h = msghdr{};
    h.msg_name = &peers_[dst].addr;
    h.msg_namelen = sizeof(sockaddr_in);
    h.msg_iov = &tx_iov_[routed];
    h.msg_iovlen = 1;
    tx_index_[routed] = i;
    ++routed;
  }
  // Packets [0, taken) leave this call: sent, or dropped as unroutable or
  // refused by the kernel for good.
  uint16_t taken = n;
  if (routed > 0) {
    const int sent = sendmmsg(fd_, tx_msgs_.data(), routed, MSG_DONTWAIT);
    if (sent < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS ||
          err == EINTR) {
        Add(tx_eagain_, 1);
        taken = tx_index_[0];
      } else {
        // A datagram the kernel will never take (EMSGSIZE, unreachable):
        // lose it like a wire would rather than retry it forever.
        Add(tx_errors_, 1);
        taken = static_cast<uint16_t>(tx_index_[0] + 1);
      }
    } else {
      Add(tx_frames_, static_cast<uint64_t>(sent));
      if (static_cast<unsigned>(sent) < routed) {
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

uint16_t UdpSocketPort::RxBurst(Packet* out, uint16_t max) {
  if (fd_ < 0 || max == 0) return 0;
  max = std::min(max, kMaxBurst);
  for (uint16_t i = 0; i < max; ++i) {
    // No allocation once capacity is there; no zero-fill either while the
    // previous datagram in this slot was full-sized.
    out[i].bytes.resize(max_datagram_);
    rx_iov_[i] = {out[i].bytes.data(), max_datagram_};
    msghdr& h = rx_msgs_[i].msg_hdr;
    h.msg_name = &rx_names_[i];
    h.msg_namelen = sizeof(sockaddr_in);
    h.msg_iov = &rx_iov_[i];
    h.msg_iovlen = 1;
    h.msg_control = &rx_control_[i * kControlSpace];
    h.msg_controllen = kControlSpace;
    h.msg_flags = 0;
  }
  const int got = recvmmsg(fd_, rx_msgs_.data(), max, MSG_DONTWAIT, nullptr);
  if (got <= 0) return 0;
  uint16_t kept = 0;
  uint64_t drops = 0;
  bool saw_drops = false;
  for (int j = 0; j < got; ++j) {
    msghdr& h = rx_msgs_[j].msg_hdr;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
        uint32_t v;
        std::memcpy(&v, CMSG_DATA(c), sizeof v);
        drops = std::max<uint64_t>(drops, v);
        saw_drops = true;
      }
    }
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

}  // namespace dblp

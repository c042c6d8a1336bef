// The control sidecar's I/O: epoll over the listening socket and the
// connections, reads into frames, writes, closes. Its authenticated
// channel is sidecar_tags.cc, its limits sidecar_limits.cc.
#include "dblp/control/control_sidecar.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/base/log.h"
#include "dblp/base/sys_error.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/sidecar_internal.h"

namespace dblp {

namespace sidecar {

std::string Ms(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

std::string DescribeIoError(const char* op, int err) {
  switch (err) {
    case ECONNRESET:
      return "connection reset by peer (ECONNRESET)";
    case EPIPE:
      return "peer closed the connection (EPIPE on write)";
    case ETIMEDOUT:
      return "connection timed out (peer host unreachable or dead)";
    default:
      return std::string(op) + " failed: " + ErrnoText(err);
  }
}

}  // namespace sidecar

using namespace sidecar;  // NOLINT: this file's own constants and helpers

namespace {

// Parses "ip:port" (see ParseIpv4Endpoint): any address and port 0 only
// for a listening socket.
bool ParseAddr(const std::string& addr, bool listen, sockaddr_in* sa,
               std::string* error) {
  return ParseIpv4Endpoint(
      addr, /*allow_any=*/listen, /*allow_any_port=*/listen,
      listen ? "127.0.0.1:9100 or 0.0.0.0:9100" : "127.0.0.1:9100", sa, error);
}

void SetNoDelay(int fd) {
  // Control messages are small and latency-bound (PROBE -> BITMAP -> STOP);
  // Nagle would hold them back for an ACK. Failure only costs latency.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool IsSelfConnect(int fd) {
  // Connecting to a closed port in the ephemeral range can, with retries,
  // hit TCP simultaneous open with ourselves: the "server" would be us.
  sockaddr_in local{}, peer{};
  socklen_t ll = sizeof local, pl = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) {
    return false;
  }
  return local.sin_addr.s_addr == peer.sin_addr.s_addr &&
         local.sin_port == peer.sin_port;
}

}  // namespace

ControlSidecar::ControlSidecar(Callbacks cb, uint32_t max_frame,
                               ControlLimits limits)
    : cb_(std::move(cb)),
      max_frame_(max_frame),
      limits_(limits),
      max_untrusted_frame_(std::min(limits.max_untrusted_frame, max_frame)) {
  auto fail = [this](const char* what) {
    const int err = errno;
    for (int* fd : {&timer_fd_, &wake_fd_, &epfd_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
    throw std::system_error(err, std::generic_category(),
                            std::string("ControlSidecar: ") + what);
  };
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) fail("epoll_create1");
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) fail("eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) fail("epoll_ctl");
  if (cb_.tick_ms > 0) {
    timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timer_fd_ < 0) fail("timerfd_create");
    itimerspec its{};
    its.it_interval.tv_sec = cb_.tick_ms / 1000;
    its.it_interval.tv_nsec = static_cast<long>(cb_.tick_ms % 1000) * 1000000;
    its.it_value = its.it_interval;
    if (timerfd_settime(timer_fd_, 0, &its, nullptr) != 0) {
      fail("timerfd_settime");
    }
    ev.data.u64 = kTimerTag;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, timer_fd_, &ev) != 0) {
      fail("epoll_ctl");
    }
  }
}

ControlSidecar::~ControlSidecar() {
  for (auto& [id, c] : conns_) {
    if (c->fd >= 0) ::close(c->fd);
  }
  for (int fd : {listen_fd_, timer_fd_, wake_fd_, epfd_}) {
    if (fd >= 0) ::close(fd);
  }
}

bool ControlSidecar::Listen(const std::string& addr, std::string* error,
                            const ServerApp& app) {
  if (listen_fd_ >= 0) {
    if (error) {
      *error = "cannot listen on " + addr + ": already listening on port " +
               std::to_string(bound_port_);
    }
    return false;
  }
  sockaddr_in sa{};
  if (!ParseAddr(addr, /*listen=*/true, &sa, error)) return false;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    if (error)
      *error = "cannot listen on " + addr + ": socket(): " + ErrnoText(errno);
    return false;
  }
  auto fail = [&](const std::string& why) {
    if (error) *error = "cannot listen on " + addr + ": " + why;
    ::close(fd);
    return false;
  };
  // A restarted server must not wait out TIME_WAIT of its previous run.
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;  // before the strings below allocate
    return fail(BindFailureText(err,
                                "is another " + app.name +
                                    " running? stop it or choose another " +
                                    app.listen_flag + " port",
                                "0.0.0.0 or a local IP in " + app.listen_flag));
  }
  if (::listen(fd, SOMAXCONN) != 0)
    return fail("listen(): " + ErrnoText(errno));
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return fail("getsockname(): " + ErrnoText(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return fail("epoll_ctl(): " + ErrnoText(errno));
  }
  listen_fd_ = fd;
  bound_port_ = ntohs(bound.sin_port);
  return true;
}

bool ControlSidecar::Connect(const std::string& addr, uint32_t timeout_ms,
                             ConnId* id, std::string* error,
                             const ServerApp& app) {
  sockaddr_in sa{};
  if (!ParseAddr(addr, /*listen=*/false, &sa, error)) return false;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  auto backoff = std::chrono::milliseconds(10);
  int attempts = 0;
  std::string last;
  for (;;) {
    ++attempts;
    const int fd =
        socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      if (error)
        *error =
            "cannot connect to " + addr + ": socket(): " + ErrnoText(errno);
      return false;
    }
    int err = 0;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        // Wait for the handshake within what is left of the timeout.
        for (;;) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - Clock::now());
          pollfd p{fd, POLLOUT, 0};
          const int n =
              poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1)));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            err = n == 0 ? ETIMEDOUT : errno;
          } else {
            socklen_t len = sizeof err;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
              err = errno;
          }
          break;
        }
      }
    }
    if (err == 0 && IsSelfConnect(fd)) err = ECONNREFUSED;
    if (err == 0) {
      const ConnId cid =
          AddConn(fd, FormatIpv4Endpoint(sa), /*accepted=*/false);
      if (cid == 0) {
        if (error)
          *error = "cannot connect to " + addr + ": epoll_ctl() failed";
        return false;
      }
      *id = cid;
      return true;
    }
    ::close(fd);
    last = ErrnoText(err);
    const auto now = Clock::now();
    if (now >= deadline) break;
    // Retry everything: while a cluster starts, refusals and unreachable
    // routes are expected for a while.
    std::this_thread::sleep_for(
        std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  if (error) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        Clock::now() - start);
    *error = "cannot connect to " + addr + " (" + std::to_string(attempts) +
             " attempts in " + std::to_string(waited.count()) +
             " ms): " + last + "; is " + app.name +
             " running and listening there? check --server (and the "
             "server's " +
             app.listen_flag + ")";
  }
  return false;
}

ConnId ControlSidecar::AddConn(int fd, std::string peer, bool accepted,
                               uint32_t source) {
  SetNoDelay(fd);
  const ConnId id = next_id_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kConnTag | id;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    ::close(fd);
    return 0;
  }
  auto c = std::make_unique<Conn>(id, fd, std::move(peer), max_frame_);
  c->armed = EPOLLIN;
  c->accepted = accepted;
  c->trusted = !accepted;
  c->source = source;
  c->opened = c->last_rx = Clock::now();
  if (accepted) {
    open_accepted_.fetch_add(1, std::memory_order_relaxed);
    CountUntrusted(*c, +1);
    if (limits_.join_deadline.count() > 0) {
      NoteDeadline(c->opened + limits_.join_deadline);
    }
  }
  if (limits_.idle_timeout.count() > 0) {
    NoteDeadline(c->last_rx + limits_.idle_timeout);
  }
  conns_.emplace(id, std::move(c));
  return id;
}

ControlSidecar::Conn* ControlSidecar::Find(ConnId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

std::string ControlSidecar::PeerAddress(ConnId id) const {
  const Conn* c = Find(id);
  return c ? c->peer : std::string();
}

bool ControlSidecar::Send(ConnId id, const ControlMessage& m,
                          std::string* error) {
  Conn* c = Find(id);
  if (c == nullptr || c->closing || c->fd < 0 || !c->write_failed.empty()) {
    if (error) *error = "connection " + std::to_string(id) + " is closed";
    return false;
  }
  // Compact before appending so the buffer does not grow by what was
  // already written (each byte moves O(1) times on average).
  if (c->out_off > 0 && c->out_off >= c->pending()) {
    c->out.erase(c->out.begin(),
                 c->out.begin() + static_cast<std::ptrdiff_t>(c->out_off));
    c->out_off = 0;
  }
  const bool was_idle = c->pending() == 0;
  try {
    Append(*c, m);
  } catch (const std::exception& e) {
    // A bad message is the caller's bug, but it must not unwind through
    // Run() from inside a callback.
    if (error) *error = e.what();
    return false;
  }
  if (c->pending() > kMaxQueuedOutput) {
    const std::string why =
        "peer is not reading: " + std::to_string(c->pending()) +
        " bytes of output queued";
    BeginClose(*c, why, /*abort=*/true);
    if (error) *error = why;
    return false;
  }
  // With output already queued EPOLLOUT is armed and the loop writes it, in
  // order; writing now would only be attempted to fail with EAGAIN.
  if (was_idle) {
    if (!Flush(*c)) {
      if (error)
        *error = "connection " + std::to_string(id) + " failed on write";
      return false;
    }
    Update(*c);
  }
  return true;
}

void ControlSidecar::Close(ConnId id, const std::string& reason) {
  Conn* c = Find(id);
  if (c == nullptr || c->closing || c->fd < 0) return;
  BeginClose(*c, reason, /*abort=*/false);
}

bool ControlSidecar::Flush(Conn& c) {
  bool progress = false;
  while (c.pending() > 0) {
    // MSG_NOSIGNAL: a peer gone away must give EPIPE, not kill the process
    // with SIGPIPE.
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.pending(),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      progress = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    const int err = n < 0 ? errno : EPIPE;
    if (!c.closing && !c.eof && (err == EPIPE || err == ECONNRESET)) {
      // A reset socket still holds what the peer sent before it went (a
      // worker's ERROR, then its exit): read that before the close, or a
      // worker that said why it failed would look merely lost. The socket
      // is dead, so the read ends at once (EOF or an error).
      c.write_failed = DescribeIoError("write", err);
      c.out.clear();
      c.out_off = 0;
      Arm(c);
      return false;
    }
    BeginClose(c, DescribeIoError("write", err), /*abort=*/true);
    return false;
  }
  if (c.pending() == 0) {
    c.out.clear();
    c.out_off = 0;
  }
  // A closing connection that still makes progress is a slow reader, not a
  // dead one: give it the full linger again.
  if (progress && c.closing) c.deadline = Clock::now() + kLinger;
  return true;
}

void ControlSidecar::BeginClose(Conn& c, std::string reason, bool abort) {
  if (c.fd < 0) return;
  if (!c.closing) {
    c.closing = true;
    c.deadline = Clock::now() + kLinger;
    pending_closes_.emplace_back(c.id, std::move(reason));
    lingering_.push_back(c.id);
    if (c.accepted) open_accepted_.fetch_sub(1, std::memory_order_relaxed);
    if (c.accepted && !c.trusted) CountUntrusted(c, -1);
    // Input is only drained from now on: a partial frame (up to max_frame)
    // must not stay buffered while the socket lingers.
    ReleaseDecoder(c);
  }
  if (abort) {
    CloseSocket(c);
    return;
  }
  if (Flush(c)) Update(c);
}

void ControlSidecar::Update(Conn& c) {
  if (c.fd < 0) return;
  if (c.closing) {
    // Half-close after the last queued byte, then wait for the peer's FIN
    // while discarding its input: closing with unread input would send a
    // RST, which can destroy our ERROR/BYE before the peer reads it.
    if (c.pending() == 0 && !c.wr_shut) {
      if (shutdown(c.fd, SHUT_WR) != 0) {
        CloseSocket(c);
        return;
      }
      c.wr_shut = true;
    }
    if (c.wr_shut && c.eof) {
      CloseSocket(c);
      return;
    }
  }
  Arm(c);
}

void ControlSidecar::Arm(Conn& c) {
  if (c.fd < 0) return;
  uint32_t want = 0;
  if (!c.eof) want |= EPOLLIN;
  if (c.pending() > 0) want |= EPOLLOUT;
  if (want == c.armed) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = kConnTag | c.id;
  if (epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev) != 0) {
    BeginClose(c, "epoll_ctl failed: " + ErrnoText(errno), /*abort=*/true);
    return;
  }
  c.armed = want;
}

void ControlSidecar::CloseSocket(Conn& c) {
  if (c.fd < 0) return;
  ::close(c.fd);  // also removes it from epoll
  c.fd = -1;
  freed_bytes_ += c.out.capacity();
  c.out.clear();
  c.out.shrink_to_fit();
  c.out_off = 0;
  dead_.push_back(c.id);
}

void ControlSidecar::OnProtocolError(Conn& c) {
  protocol_errors_.fetch_add(1, std::memory_order_relaxed);
  CloseWithError(
      c,
      static_cast<uint16_t>(kErrorCodeProtocol +
                            static_cast<uint16_t>(c.decoder.error())),
      "protocol error: " + c.decoder.error_text());
}

void ControlSidecar::CloseWithError(Conn& c, uint16_t code,
                                    const std::string& text) {
  ErrorMsg reply;
  reply.code = code;
  reply.text = text.substr(0, kMaxControlString);
  try {
    Append(c, reply);
  } catch (const std::exception&) {
    // Best effort: closing is what matters.
  }
  BeginClose(c, text, /*abort=*/false);
}

void ControlSidecar::ReleaseDecoder(Conn& c) {
  freed_bytes_ += std::max(c.rx_peak, c.decoder.buffered());
  c.decoder = ControlDecoder(max_frame_);
  c.rx_peak = 0;
  c.hdr_have = 0;
  c.body_left = 0;
}

void ControlSidecar::Consume(Conn& c, const uint8_t* data, size_t len,
                             Clock::time_point now) {
  while (len > 0 && !c.closing) {
    size_t take;
    if (c.body_left == 0) {
      if (c.hdr_have == 0) {
        c.frame_start = now;
        if (limits_.partial_message_timeout.count() > 0) {
          NoteDeadline(now + limits_.partial_message_timeout);
        }
      }
      take = std::min(len, kControlFrameHeader - c.hdr_have);
      std::memcpy(c.hdr.data() + c.hdr_have, data, take);
      c.hdr_have += take;
      if (c.hdr_have == kControlFrameHeader) {
        const uint32_t frame = (uint32_t{c.hdr[0]} << 24) |
                               (uint32_t{c.hdr[1]} << 16) |
                               (uint32_t{c.hdr[2]} << 8) | uint32_t{c.hdr[3]};
        if (!c.trusted && frame > max_untrusted_frame_) {
          // Refused on the prefix, before any of the body is buffered.
          protocol_errors_.fetch_add(1, std::memory_order_relaxed);
          CloseWithError(
              c,
              static_cast<uint16_t>(
                  kErrorCodeProtocol +
                  static_cast<uint16_t>(ControlError::kFrameTooLarge)),
              "protocol error: frame length " + std::to_string(frame) +
                  " > max_untrusted_frame " +
                  std::to_string(max_untrusted_frame_) +
                  " (a connection must authenticate before it may send "
                  "larger messages)");
          return;
        }
        // A zero length leaves no frame in progress; the decoder reports
        // it below.
        c.hdr_have = 0;
        c.body_left = frame;
      }
    } else {
      take = static_cast<size_t>(std::min<uint64_t>(len, c.body_left));
      c.body_left -= take;
    }
    c.decoder.Feed(data, take);
    c.rx_peak = std::max(c.rx_peak, c.decoder.buffered());
    data += take;
    len -= take;
    if (!Deliver(c)) return;
    if (!c.in_frame() && c.rx_peak > kShrinkAbove &&
        c.decoder.buffered() == 0) {
      ReleaseDecoder(c);
    }
  }
}

bool ControlSidecar::Deliver(Conn& c) {
  ControlMessage m;
  for (;;) {
    const auto st = c.decoder.Next(m);
    if (st == ControlDecoder::Status::kNeedMore) return true;
    if (st == ControlDecoder::Status::kError) {
      OnProtocolError(c);
      return false;
    }
    if (c.keys) {
      bool deliver = false;
      if (!CheckTag(c, m, &deliver)) return false;
      if (!deliver) continue;
    }
    messages_in_.fetch_add(1, std::memory_order_relaxed);
    c.spoke = true;
    if (cb_.on_message) {
      // A handler that throws (a request it cannot serve) costs this
      // connection, never the process: the peer is told why.
      try {
        cb_.on_message(c.id, m);
      } catch (const std::exception& e) {
        const std::string why = std::string("cannot handle ") +
                                ControlTypeName(m) + ": " + e.what();
        protocol_errors_.fetch_add(1, std::memory_order_relaxed);
        Send(c.id, ErrorMsg{kErrorCodeProtocol, why});
        BeginClose(c, why, /*abort=*/false);
      }
    }
    // The callback closed it (or a Send failed fatally): its decoder is gone.
    if (c.closing) return false;
  }
}

void ControlSidecar::HandleConnEvent(Conn& c, uint32_t events) {
  if (c.fd < 0) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    if (!c.eof) {
      HandleReadable(c);
    } else if (events & (EPOLLHUP | EPOLLERR)) {
      // Both directions are done (or broken); nothing left to flush to.
      BeginClose(c, "connection hung up", /*abort=*/true);
    }
  }
  if (c.fd >= 0 && (events & EPOLLOUT)) HandleWritable(c);
}

void ControlSidecar::HandleReadable(Conn& c) {
  std::array<uint8_t, kReadChunk> buf;
  const auto now = Clock::now();
  for (int i = 0; i < kMaxReadsPerEvent && c.fd >= 0; ++i) {
    const ssize_t n = ::recv(c.fd, buf.data(), buf.size(), 0);
    if (n > 0) {
      // A closing connection only drains input so that our close is a FIN.
      if (c.closing) continue;
      c.last_rx = now;
      Consume(c, buf.data(), static_cast<size_t>(n), now);
      continue;
    }
    if (n == 0) {
      c.eof = true;
      std::string partial;
      if (c.decoder.buffered() > 0) {
        partial = " in the middle of a frame (" +
                  std::to_string(c.decoder.buffered()) +
                  " bytes of an incomplete message dropped)";
      }
      if (!c.write_failed.empty()) {
        BeginClose(c, c.write_failed + partial, /*abort=*/true);
      } else if (!c.closing) {
        BeginClose(c, "peer closed the connection" + partial,
                   /*abort=*/false);
      } else {
        Update(c);
      }
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    BeginClose(c,
               c.write_failed.empty() ? DescribeIoError("read", errno)
                                      : c.write_failed,
               /*abort=*/true);
    return;
  }
  Update(c);
}

void ControlSidecar::HandleWritable(Conn& c) {
  if (Flush(c)) Update(c);
}

void ControlSidecar::DeliverCloses() {
  // on_close may close more connections (Send failing, Close): loop until
  // quiet, never holding a reference into the vector across a callback.
  while (!pending_closes_.empty()) {
    auto batch = std::move(pending_closes_);
    pending_closes_.clear();
    for (auto& [id, reason] : batch) {
      if (cb_.on_close) cb_.on_close(id, reason);
    }
  }
}

void ControlSidecar::Reap() {
  for (ConnId id : dead_) conns_.erase(id);
  dead_.clear();
}

void ControlSidecar::Log(const std::string& line) {
  if (cb_.on_log) {
    cb_.on_log(line);
  } else {
    // Limits hit, accept() and epoll failures: an operator should see them.
    DBLP_LOG(Warning, "%s", line.c_str());
  }
}

void ControlSidecar::Run() {
  std::array<epoll_event, 64> events;
  // Closes that happened during setup (a Send failing fatally before Run).
  DeliverCloses();
  Reap();
  while (!stop_.load(std::memory_order_acquire)) {
    const int n = epoll_wait(epfd_, events.data(),
                             static_cast<int>(events.size()), NextTimeoutMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      // Only a bug (bad fd) gets here; spinning on it would help nobody.
      Log("control sidecar: epoll_wait failed: " + ErrnoText(errno) +
          "; event loop stops");
      break;
    }
    // New connections last: what the open ones already sent (a worker's
    // JOIN or PROOF) is read before a newcomer may evict one of them.
    bool accept_ready = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t count = 0;
        // Reading resets the counter: any number of Wakeup()s since the last
        // read become one on_wakeup.
        while (::read(wake_fd_, &count, sizeof count) < 0 && errno == EINTR) {
        }
        if (!stop_.load(std::memory_order_acquire) && cb_.on_wakeup) {
          cb_.on_wakeup();
        }
      } else if (tag == kTimerTag) {
        uint64_t expirations = 0;
        while (::read(timer_fd_, &expirations, sizeof expirations) < 0 &&
               errno == EINTR) {
        }
        if (cb_.on_tick) cb_.on_tick();
      } else if (tag == kListenTag) {
        accept_ready = true;
      } else if (Conn* c = Find(static_cast<ConnId>(tag & 0xffffffffu))) {
        HandleConnEvent(*c, events[i].events);
      }
    }
    if (accept_ready) HandleAccept();
    ExpireLimits();
    ExpireLingering();
    ResumeListen();
    DeliverCloses();
    Reap();
    TrimHeap();
  }
  DeliverCloses();
  Reap();
}

void ControlSidecar::Wakeup() {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: a wakeup is pending anyway.
  while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void ControlSidecar::RequestStop() {
  stop_.store(true, std::memory_order_release);
  Wakeup();
}

}  // namespace dblp

// What anyone who reaches the control port can make the sidecar hold
// (ControlLimits): accepts and refusals under max_connections, the join
// deadline, the idle and partial-frame timeouts, lingering closes, and the
// heap trimmed after peers' buffers are freed.
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cerrno>
#include <string>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/base/sys_error.h"
#include "dblp/control/sidecar_internal.h"

namespace dblp {

using namespace sidecar;  // NOLINT: the sidecar's own constants

void ControlSidecar::HandleAccept() {
  for (int i = 0; i < kMaxAcceptsPerEvent; ++i) {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // The pending connection stays in the backlog and keeps the socket
        // readable; stop polling it for a while instead of spinning.
        Log("control sidecar: accept() failed: " + ErrnoText(err) +
            "; pausing accepts for 100 ms (raise `ulimit -n`?)");
        epoll_ctl(epfd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        listen_paused_ = true;
        listen_paused_until_ = Clock::now() + kAcceptPause;
        return;
      }
      Log("control sidecar: accept() failed: " + ErrnoText(err));
      return;
    }
    const uint32_t source = ntohl(sa.sin_addr.s_addr);
    if (!MakeRoom(source)) {
      RefuseConnection(fd, FormatIpv4Endpoint(sa));
      continue;
    }
    const ConnId id =
        AddConn(fd, FormatIpv4Endpoint(sa), /*accepted=*/true, source);
    if (id != 0 && cb_.on_accept) cb_.on_accept(id);
  }
}

void ControlSidecar::RefuseConnection(int fd, const std::string& peer) {
  connections_refused_.fetch_add(1, std::memory_order_relaxed);
  const std::string limit = std::to_string(limits_.max_connections) +
                            " connections open (max_connections)";
  // Best effort, one non-blocking write into an empty socket buffer: a
  // legitimate peer learns why; a peer that already sent data may see a
  // reset instead (we close without reading).
  std::vector<uint8_t> frame;
  try {
    EncodeControl(ErrorMsg{kErrorCodeLimit,
                           "too many connections: " + limit + "; try later"},
                  frame);
    if (::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) >
        0) {
      messages_out_.fetch_add(1, std::memory_order_relaxed);
    }
  } catch (const std::invalid_argument&) {
    // Cannot happen for this message; the close below is what matters.
  }
  ::close(fd);
  const std::string line = refusal_log_.Pass(
      "control sidecar: refused a connection from " + peer + ": " + limit +
          "; raise max_connections (the server's "
          "--control_max_connections) if these peers are legitimate",
      "refused");
  if (!line.empty()) Log(line);
}

std::string ControlSidecar::LogLimiter::Pass(std::string line,
                                             const char* what) {
  const auto now = Clock::now();
  if (now < next) {
    ++skipped;
    return "";
  }
  if (skipped > 0) {
    line += " (" + std::to_string(skipped) + " more " + what +
            " since the last such line)";
  }
  skipped = 0;
  next = now + kRefusalLogPeriod;
  return line;
}

void ControlSidecar::CountUntrusted(const Conn& c, int delta) {
  if (!c.accepted) return;
  if (delta > 0) {
    ++untrusted_by_source_[c.source];
    open_untrusted_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto it = untrusted_by_source_.find(c.source);
  if (it != untrusted_by_source_.end() && --it->second == 0) {
    untrusted_by_source_.erase(it);
  }
  open_untrusted_.fetch_sub(1, std::memory_order_relaxed);
}

bool ControlSidecar::MakeRoom(uint32_t source) {
  const auto it = untrusted_by_source_.find(source);
  const uint32_t from_source =
      it == untrusted_by_source_.end() ? 0 : it->second;
  const uint32_t per_source = limits_.max_unauthenticated_per_source;
  if (per_source > 0 && from_source >= per_source) {
    // The newcomer's own source is at its bound: it gives way to itself,
    // never to another source's strangers.
    if (Conn* v = EvictionVictim(&source)) {
      Evict(*v, std::to_string(from_source) +
                    " unauthenticated connections from its address "
                    "(max_unauthenticated_per_source)");
      return true;
    }
  }
  const uint32_t untrusted = open_untrusted_.load(std::memory_order_relaxed);
  const bool over_budget = limits_.max_unauthenticated > 0 &&
                           untrusted >= limits_.max_unauthenticated;
  const bool over_total =
      limits_.max_connections > 0 &&
      open_accepted_.load(std::memory_order_relaxed) >= limits_.max_connections;
  if (!over_budget && !over_total) return true;
  Conn* v = EvictionVictim(nullptr);
  if (v == nullptr) return false;  // every open connection is trusted
  Evict(*v, std::to_string(untrusted) +
                (over_budget ? " unauthenticated connections open "
                               "(max_unauthenticated)"
                             : " unauthenticated of " +
                                   std::to_string(limits_.max_connections) +
                                   " connections open (max_connections)"));
  return true;
}

ControlSidecar::Conn* ControlSidecar::EvictionVictim(
    const uint32_t* source) const {
  Conn* best = nullptr;
  uint32_t best_count = 0;
  // One pass: the most-represented source, then quiet before spoken, then
  // the oldest. Bounded by max_connections (plus lingering closes).
  for (const auto& [id, cp] : conns_) {
    Conn& c = *cp;
    if (!c.accepted || c.trusted || c.closing || c.fd < 0) continue;
    if (source != nullptr && c.source != *source) continue;
    const uint32_t count = untrusted_by_source_.at(c.source);
    const bool better =
        best == nullptr || count > best_count ||
        (count == best_count &&
         (c.spoke != best->spoke ? !c.spoke : c.opened < best->opened));
    if (better) {
      best = &c;
      best_count = count;
    }
  }
  return best;
}

void ControlSidecar::Evict(Conn& c, const std::string& limit) {
  connections_evicted_.fetch_add(1, std::memory_order_relaxed);
  const std::string why =
      "evicted before authenticating, for a newer connection: " + limit +
      "; run the worker again";
  try {
    Append(c, ErrorMsg{kErrorCodeLimit, why});
  } catch (const std::exception&) {
    // Best effort: the close is what matters.
  }
  // One non-blocking write, then the socket goes at once: a flood that
  // reconnects must not leave a lingering socket per eviction.
  Flush(c);
  BeginClose(c, why, /*abort=*/true);
  const std::string line = eviction_log_.Pass(
      "control sidecar: " + why + " (" + c.peer +
          "); raise --control_max_unauthenticated or "
          "--control_max_unauthenticated_per_source if these peers are "
          "legitimate",
      "evicted");
  if (!line.empty()) Log(line);
}

void ControlSidecar::ResumeListen() {
  if (!listen_paused_ || Clock::now() < listen_paused_until_) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev) == 0) {
    listen_paused_ = false;
  } else {
    listen_paused_until_ = Clock::now() + kAcceptPause;
  }
}

void ControlSidecar::ExpireLingering() {
  const auto now = Clock::now();
  std::erase_if(lingering_, [&](ConnId id) {
    Conn* c = Find(id);
    if (c == nullptr || c->fd < 0) return true;
    if (now < c->deadline) return false;
    CloseSocket(*c);
    return true;
  });
}

ControlSidecar::Clock::time_point ControlSidecar::LimitDeadline(
    const Conn& c, LimitKind* which) const {
  auto t = Clock::time_point::max();
  *which = LimitKind::kNone;
  auto consider = [&](Clock::time_point d, LimitKind k) {
    if (d < t) {
      t = d;
      *which = k;
    }
  };
  if (!c.trusted && limits_.join_deadline.count() > 0) {
    consider(c.opened + limits_.join_deadline, LimitKind::kJoin);
  }
  if (c.in_frame() && limits_.partial_message_timeout.count() > 0) {
    consider(c.frame_start + limits_.partial_message_timeout,
             LimitKind::kPartial);
  }
  if (limits_.idle_timeout.count() > 0) {
    consider(c.last_rx + limits_.idle_timeout, LimitKind::kIdle);
  }
  return t;
}

void ControlSidecar::ExpireLimits() {
  const auto now = Clock::now();
  if (now < next_limit_check_) return;
  next_limit_check_ = Clock::time_point::max();
  // Closing only queues on_close and moves ids to lingering_/dead_; conns_
  // itself is not modified until Reap(), so iterating it here is safe.
  for (auto& [id, cp] : conns_) {
    Conn& c = *cp;
    if (c.closing || c.fd < 0) continue;
    LimitKind which;
    const auto t = LimitDeadline(c, &which);
    if (which == LimitKind::kNone) continue;
    if (now < t) {
      NoteDeadline(t);
      continue;
    }
    std::string why;
    switch (which) {
      case LimitKind::kJoin:
        join_timeouts_.fetch_add(1, std::memory_order_relaxed);
        why = "join deadline: the peer did not authenticate within " +
              Ms(limits_.join_deadline) + " (join_deadline)";
        break;
      case LimitKind::kPartial:
        partial_timeouts_.fetch_add(1, std::memory_order_relaxed);
        why = "partial message timeout: a message begun " +
              Ms(limits_.partial_message_timeout) +
              " ago is still incomplete (" +
              std::to_string(c.decoder.buffered()) +
              " bytes of it arrived; partial_message_timeout)";
        break;
      case LimitKind::kIdle:
        idle_timeouts_.fetch_add(1, std::memory_order_relaxed);
        why = "idle timeout: nothing received for " + Ms(limits_.idle_timeout) +
              " (idle_timeout)";
        break;
      case LimitKind::kNone:
        break;
    }
    CloseWithError(c, kErrorCodeLimit, why);
  }
}

void ControlSidecar::TrimHeap() {
  if (freed_bytes_ < kTrimAfterBytes) return;
  const auto now = Clock::now();
  if (now < next_trim_) return;
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  freed_bytes_ = 0;
  next_trim_ = now + kTrimPeriod;
}

int ControlSidecar::NextTimeoutMs() const {
  std::optional<Clock::time_point> next;
  auto consider = [&](Clock::time_point t) {
    if (!next || t < *next) next = t;
  };
  for (ConnId id : lingering_) {
    if (const Conn* c = Find(id); c != nullptr && c->fd >= 0) {
      consider(c->deadline);
    }
  }
  if (listen_paused_) consider(listen_paused_until_);
  if (next_limit_check_ != Clock::time_point::max()) {
    consider(next_limit_check_);
  }
  if (kCanTrim && freed_bytes_ >= kTrimAfterBytes) consider(next_trim_);
  if (!next) return -1;
  const auto left = *next - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  // Round up: waking a hair early would just spin once more.
  return static_cast<int>(
      std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

}  // namespace dblp

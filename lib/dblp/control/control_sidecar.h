// The TCP control sidecar: one thread, epoll, non-blocking sockets, framed
// with the control codec. It runs off the datapath cores; datapath threads
// talk to it only through lock-free queues of their own plus Wakeup(), so
// they never block on a socket.
//
// Threading rules:
//   - Wakeup(), RequestStop() and the counters may be called from any thread.
//   - Everything else (Listen, Connect, Send, Close, PeerAddress, Run) runs on
//     the sidecar thread: either inside Run() (from a callback), or before
//     Run() starts on a thread that happens-before the sidecar thread (e.g.
//     the thread that later creates it), or after Run() returned.
//   - Callbacks run on the sidecar thread, inside Run(), never re-entrantly:
//     a callback may call Send/Close/Connect on any connection (including the
//     one it is about), and the resulting on_close (if any) is delivered
//     after the callback returns.
//
// Connection lifetime: on_close is called exactly once for every connection
// that had on_accept / a successful Connect, whoever ended it (peer, I/O
// error, protocol error, a limit, or our own Close()), unless the sidecar is
// destroyed first (the destructor closes sockets without callbacks). After
// on_close (in fact as soon as the connection is closing, or a write to it
// failed) Send() on that id returns false. A write that fails because the
// peer reset the connection does not close it at once: what the peer sent
// before is read and delivered (on_message) first, then on_close follows.
// ConnIds are never reused within one sidecar.
//
// Bounded resources (ControlLimits): anyone who can reach the listening port
// can open connections, so what a peer can make us hold is capped in
// number, time and bytes. An accepted connection starts *untrusted*: it may
// send only small frames and must be Trust()ed by the owner (after the peer
// authenticated) within the join deadline. Connections we Connect() start
// trusted (we chose the peer). A connection closed by a limit gets an ERROR
// (code kErrorCodeLimit, or kErrorCodeProtocol + kFrameTooLarge for an
// oversized untrusted frame) whose text names the limit, and its on_close
// reason names it too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dblp/control/control.h"

namespace dblp {

using ConnId = uint32_t;

// A control channel's keys, one per direction (job_auth.h derives them).
struct ChannelKeys {
  AuthBytes send{};
  AuthBytes recv{};
};

// ErrorMsg::code sent before closing a connection whose peer sent a frame
// the decoder rejected: kErrorCodeProtocol + the ControlError value (so 401 =
// frame too large, ...); the text names the problem.
inline constexpr uint16_t kErrorCodeProtocol = 400;
// ErrorMsg::code sent before closing a connection that hit a ControlLimits
// bound (too many connections, join deadline, partial-message or idle
// timeout); the text names the limit.
inline constexpr uint16_t kErrorCodeLimit = 429;

// The server app whose control port a sidecar listens on or connects to,
// named in Listen's and Connect's fixes: dblp-server --listen by default,
// dblp-udp-server --control.
struct ServerApp {
  std::string name = "dblp-server";
  std::string listen_flag = "--listen";
};

// What peers may make a ControlSidecar hold. A duration of 0 switches that
// limit off. The defaults are safe for a job of up to a few hundred workers
// on a host anyone may reach; an owner passes its own from flags.
struct ControlLimits {
  // Accepted connections open at once. A newcomer beyond it makes room by
  // evicting an unauthenticated one (below); only when every open one is
  // trusted is it closed as soon as it is accepted (never reported to the
  // owner) and counted in connections_refused(). Closing connections
  // still lingering (at most ControlSidecar::kLinger) do not count.
  // 0 = no limit.
  uint32_t max_connections = 256;
  // The pre-authentication budget: accepted connections not yet Trust()ed
  // open at once, in all and from one IPv4 source address. A newcomer over
  // either bound is admitted, and the oldest unauthenticated connection of
  // the source with the most of them (its own source, over the per-source
  // bound; one that sent nothing before one that did) is closed instead,
  // counted in connections_evicted(). Strangers who reconnect can then hold
  // no slot for long, and a worker that retries is always the newest: it
  // gets in unless this many newer connections come first while it
  // authenticates. 0 = no limit.
  uint32_t max_unauthenticated = 128;
  uint32_t max_unauthenticated_per_source = 64;
  // An accepted connection not Trust()ed within this long is closed: a
  // stranger cannot hold a connection (and a slot) by never authenticating.
  std::chrono::milliseconds join_deadline{10000};
  // Largest frame (type + body) an untrusted connection may send, checked
  // on its length prefix, before anything is buffered: a stranger cannot
  // make us buffer max_frame. A JOIN with thousands of layers still fits in
  // the default. Clamped to max_frame.
  uint32_t max_untrusted_frame = 64u << 10;
  // A frame whose first byte came this long ago and which is still not
  // complete closes the connection, trusted or not: a truncated message
  // followed by silence must not hold a connection and its buffer forever.
  std::chrono::milliseconds partial_message_timeout{5000};
  // Nothing received for this long closes the connection, trusted or not.
  // Off by default: a job's connection is legitimately quiet while a model
  // computes, and untrusted connections are bounded by join_deadline.
  std::chrono::milliseconds idle_timeout{0};
};

class ControlSidecar {
 public:
  struct Callbacks {
    // A peer connected to our listening socket.
    std::function<void(ConnId)> on_accept;
    // A complete, valid message arrived.
    std::function<void(ConnId, const ControlMessage&)> on_message;
    // The connection is gone: peer closed, I/O error, our Close(), or the
    // peer sent garbage (then `reason` contains the decoder's error text and
    // an ERROR message was sent back, best effort, before closing).
    std::function<void(ConnId, const std::string& reason)> on_close;
    // Wakeup() was called (any number of times since the last call). May
    // also be called once spuriously.
    std::function<void()> on_wakeup;
    // Called every `tick_ms` if set (stats lines, deadlines). Missed ticks
    // coalesce into one call.
    std::function<void()> on_tick;
    uint32_t tick_ms = 0;
    // Diagnostics not tied to a connection (accept() failures). Default:
    // one line on stderr.
    std::function<void(const std::string&)> on_log;
  };

  // A peer that does not read may make us queue at most this many bytes of
  // output; beyond it the connection is closed (a stuck peer must not grow
  // the sidecar without bound). Large enough for the largest legal WELCOME.
  static constexpr size_t kMaxQueuedOutput = 64u << 20;
  // How long a closing connection may take to flush its queued output and
  // see the peer's FIN before its socket is closed anyway.
  static constexpr std::chrono::milliseconds kLinger{2000};

  using Limits = ControlLimits;

  // Creates the epoll, eventfd and timerfd. Throws std::system_error if the
  // kernel refuses them (fd exhaustion): nothing can work without them.
  // `max_frame` bounds frames from trusted connections; `limits` the rest.
  explicit ControlSidecar(Callbacks cb, uint32_t max_frame = kMaxControlFrame,
                          ControlLimits limits = {});
  ~ControlSidecar();
  ControlSidecar(const ControlSidecar&) = delete;
  ControlSidecar& operator=(const ControlSidecar&) = delete;

  // "ip:port" with an IPv4 literal, "localhost", or "*" / "0.0.0.0" / empty
  // ip for all interfaces; port 0 = ephemeral (bound_port() tells).
  // Returns false and sets *error (naming the fix, for `app`) on failure.
  bool Listen(const std::string& addr, std::string* error,
              const ServerApp& app = {});
  uint16_t bound_port() const { return bound_port_; }
  // Blocking connect with retries until `timeout_ms` (the server may still
  // be starting); timeout_ms 0 = one attempt. Sets *id on success; returns
  // false with *error naming the address and the likely fix (start `app`)
  // otherwise.
  bool Connect(const std::string& addr, uint32_t timeout_ms, ConnId* id,
               std::string* error, const ServerApp& app = {});

  // Queues a message and writes as much as the socket takes now; the rest
  // goes out as the socket drains. Never blocks. Returns false (with *error
  // if non-null) if the connection is unknown/closing, the message is
  // invalid (ValidateControl), or writing failed (then the connection closes
  // and on_close follows; after a reset, once the peer's last messages are
  // delivered).
  bool Send(ConnId id, const ControlMessage& m, std::string* error = nullptr);
  // Closes a connection after flushing what is queued (bounded by kLinger).
  // on_close(id, reason) follows. No-op if the connection is already
  // closing or unknown.
  void Close(ConnId id, const std::string& reason);
  // "ip:port" of the peer, empty if unknown.
  std::string PeerAddress(ConnId id) const;
  // The peer of an accepted connection authenticated: from now on the join
  // deadline no longer applies and frames up to max_frame are accepted
  // (checked from the next frame's length prefix on). No-op if unknown or
  // closing; connections we Connect()ed are trusted from the start.
  void Trust(ConnId id);
  bool IsTrusted(ConnId id) const;
  // Authenticates the channel from now on (job_auth.h): every message sent
  // on `id` is followed by a TAG (HMAC-SHA256 under keys.send over its
  // sequence number and bytes), and every message received must be
  // followed by its TAG under keys.recv, in sequence, before it is
  // delivered; anything else closes the connection as a protocol error
  // (counted, ERROR sent). No-op if unknown or closing.
  void Authenticate(ConnId id, const ChannelKeys& keys);

  // Runs the event loop until RequestStop(). Returns immediately if
  // RequestStop() was already called (stop is sticky, so a stop requested
  // before the thread got to Run() is not lost).
  void Run();

  // Any thread; non-blocking, async-signal-safe (one write() to an eventfd).
  // Calls coalesce into one on_wakeup.
  void Wakeup();
  void RequestStop();

  uint64_t messages_in() const { return messages_in_.load(); }
  uint64_t messages_out() const { return messages_out_.load(); }
  uint64_t protocol_errors() const { return protocol_errors_.load(); }
  // Limits (ControlLimits), any thread. An untrusted frame over
  // max_untrusted_frame counts as a protocol error.
  uint64_t connections_refused() const { return connections_refused_.load(); }
  // Unauthenticated connections closed to make room for a newcomer
  // (max_unauthenticated, max_unauthenticated_per_source, max_connections).
  uint64_t connections_evicted() const { return connections_evicted_.load(); }
  uint64_t join_timeouts() const { return join_timeouts_.load(); }
  uint64_t partial_timeouts() const { return partial_timeouts_.load(); }
  uint64_t idle_timeouts() const { return idle_timeouts_.load(); }
  // Accepted connections open now (what max_connections bounds), and of
  // those the ones not yet trusted (max_unauthenticated).
  uint32_t open_connections() const { return open_accepted_.load(); }
  uint32_t open_unauthenticated() const { return open_untrusted_.load(); }
  const ControlLimits& limits() const { return limits_; }

 private:
  struct Conn;
  using Clock = std::chrono::steady_clock;

  // `accepted`: from our listening socket (untrusted, counted against
  // max_connections); otherwise a Connect()ed, trusted connection.
  ConnId AddConn(int fd, std::string peer, bool accepted, uint32_t source = 0);
  Conn* Find(ConnId id) const;
  void HandleAccept();
  void HandleConnEvent(Conn& c, uint32_t events);
  void HandleReadable(Conn& c);
  void HandleWritable(Conn& c);
  // Writes queued output until done or EAGAIN; false on a fatal error (the
  // connection has then been aborted, or, reset by the peer, it is read to
  // its end before it closes: Conn::write_failed).
  bool Flush(Conn& c);
  // Splits received bytes at frame boundaries for the decoder, checking each
  // length prefix against the connection's frame limit as it completes (so
  // a Trust() from the previous message's callback applies to the next).
  void Consume(Conn& c, const uint8_t* data, size_t len, Clock::time_point now);
  // Delivers the decoder's complete messages; false if the connection is
  // closing afterwards.
  bool Deliver(Conn& c);
  void OnProtocolError(Conn& c);
  // Encodes `m` into c's output, with its TAG on an authenticated channel.
  // Throws std::invalid_argument for a message ValidateControl refuses.
  void Append(Conn& c, const ControlMessage& m);
  bool CheckTag(Conn& c, ControlMessage& m, bool* deliver);
  bool TagMatches(Conn& c, const TagMsg& tag);
  // Queues ERROR{code, text} (best effort) and closes with reason `text`.
  void CloseWithError(Conn& c, uint16_t code, const std::string& text);
  // Frees the decoder's buffer (a fresh one replaces it); the bytes are
  // noted for a later malloc_trim.
  void ReleaseDecoder(Conn& c);
  void RefuseConnection(int fd, const std::string& peer);
  // Before admitting a newcomer from `source`: evicts an unauthenticated
  // connection if a bound is reached. False: no room (all are trusted).
  bool MakeRoom(uint32_t source);
  // The unauthenticated connection to evict: of `source` if given, else of
  // the source with the most; quiet before spoken, then the oldest.
  Conn* EvictionVictim(const uint32_t* source) const;
  void Evict(Conn& c, const std::string& limit);
  // An accepted connection enters (+1) or leaves (-1) the untrusted count.
  void CountUntrusted(const Conn& c, int delta);
  // The earliest limit deadline of an open connection; *which names it.
  enum class LimitKind { kNone, kJoin, kPartial, kIdle };
  Clock::time_point LimitDeadline(const Conn& c, LimitKind* which) const;
  void NoteDeadline(Clock::time_point t) {
    if (t < next_limit_check_) next_limit_check_ = t;
  }
  // Closes the connections whose limit deadline passed; at most one scan of
  // the connections per expiring deadline, none per event.
  void ExpireLimits();
  void TrimHeap();
  // Ends the connection logically (on_close is queued) and lets the socket
  // linger to flush output; `abort` closes the socket at once.
  void BeginClose(Conn& c, std::string reason, bool abort);
  // Closing connections: half-close once output is flushed, close the
  // socket once the peer's FIN is in. Then (re)arms epoll for what is left.
  void Update(Conn& c);
  void CloseSocket(Conn& c);
  void Arm(Conn& c);
  void ExpireLingering();
  void ResumeListen();
  void DeliverCloses();
  void Reap();
  int NextTimeoutMs() const;
  void Log(const std::string& line);

  Callbacks cb_;
  uint32_t max_frame_;
  ControlLimits limits_;
  uint32_t max_untrusted_frame_;  // limits_' value clamped to max_frame_
  // No limit deadline of an open connection is earlier than this. It may be
  // earlier than the earliest (deadlines move later as data arrives or a
  // connection is trusted): the scan at this time finds out.
  Clock::time_point next_limit_check_ = Clock::time_point::max();
  // Refusal and eviction log lines: at most one per kRefusalLogPeriod
  // each, the rest counted into the next one.
  struct LogLimiter {
    Clock::time_point next{};
    uint64_t skipped = 0;
    // `line` plus how many were not logged, or "" (counted) if too soon.
    std::string Pass(std::string line, const char* what);
  };
  LogLimiter refusal_log_;
  LogLimiter eviction_log_;
  // Untrusted accepted connections per IPv4 source (host order); entries
  // at zero are erased, so it holds at most max_unauthenticated.
  std::unordered_map<uint32_t, uint32_t> untrusted_by_source_;
  // Peer-controlled buffers freed since the last malloc_trim: glibc may keep
  // freed heap memory (its mmap threshold adapts upwards), so RSS would not
  // fully come back after a flood of large frames without a trim.
  size_t freed_bytes_ = 0;
  Clock::time_point next_trim_{};
  int epfd_ = -1;
  int wake_fd_ = -1;
  int timer_fd_ = -1;
  int listen_fd_ = -1;
  uint16_t bound_port_ = 0;
  // accept() failed with fd exhaustion: the listening socket is left out of
  // epoll until then, so level-triggered readiness does not spin the loop.
  Clock::time_point listen_paused_until_{};
  bool listen_paused_ = false;
  ConnId next_id_ = 1;
  std::unordered_map<ConnId, std::unique_ptr<Conn>> conns_;
  // on_close calls not yet delivered: closes happen deep inside I/O and
  // callbacks, the callback runs later from the top of the loop.
  std::vector<std::pair<ConnId, std::string>> pending_closes_;
  // Closing connections whose socket is still open (flushing / awaiting FIN).
  std::vector<ConnId> lingering_;
  // Connections whose socket is closed; erased from conns_ at the top of the
  // loop, never while a Conn& may be on the stack.
  std::vector<ConnId> dead_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> messages_in_{0}, messages_out_{0}, protocol_errors_{0};
  std::atomic<uint64_t> connections_refused_{0}, connections_evicted_{0},
      join_timeouts_{0}, partial_timeouts_{0}, idle_timeouts_{0};
  std::atomic<uint32_t> open_accepted_{0}, open_untrusted_{0};
};

// Runs a sidecar's event loop on a thread of its own; Stop() (or the
// destructor) ends and joins it. Started before a datapath thread pins
// itself, so the sidecar does not inherit the datapath's CPU.
class SidecarThread {
 public:
  explicit SidecarThread(ControlSidecar& sidecar)
      : sidecar_(sidecar), thread_([&sidecar] { sidecar.Run(); }) {}
  ~SidecarThread() { Stop(); }
  SidecarThread(const SidecarThread&) = delete;
  SidecarThread& operator=(const SidecarThread&) = delete;
  void Stop() {
    if (!thread_.joinable()) return;
    sidecar_.RequestStop();
    thread_.join();
  }
  std::thread::native_handle_type native_handle() {
    return thread_.native_handle();
  }

 private:
  ControlSidecar& sidecar_;
  std::thread thread_;
};

}  // namespace dblp

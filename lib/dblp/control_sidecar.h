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
// error, protocol error, or our own Close()), unless the sidecar is destroyed
// first (the destructor closes sockets without callbacks). After on_close
// (in fact as soon as the connection is closing) Send() on that id returns
// false. ConnIds are never reused within one sidecar.
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

#include "dblp/control.h"

namespace dblp {

using ConnId = uint32_t;

// ErrorMsg::code sent before closing a connection whose peer sent a frame
// the decoder rejected: kErrorCodeProtocol + the ControlError value (so 401 =
// frame too large, ...); the text names the problem.
inline constexpr uint16_t kErrorCodeProtocol = 400;

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

  // Creates the epoll, eventfd and timerfd. Throws std::system_error if the
  // kernel refuses them (fd exhaustion): nothing can work without them.
  explicit ControlSidecar(Callbacks cb, uint32_t max_frame = kMaxControlFrame);
  ~ControlSidecar();
  ControlSidecar(const ControlSidecar&) = delete;
  ControlSidecar& operator=(const ControlSidecar&) = delete;

  // "ip:port" with an IPv4 literal, "localhost", or "*" / "0.0.0.0" / empty
  // ip for all interfaces; port 0 = ephemeral (bound_port() tells).
  // Returns false and sets *error (naming the fix) on failure.
  bool Listen(const std::string& addr, std::string* error);
  uint16_t bound_port() const { return bound_port_; }
  // Blocking connect with retries until `timeout_ms` (the server may still
  // be starting); timeout_ms 0 = one attempt. Sets *id on success; returns
  // false with *error naming the address and the likely fix otherwise.
  bool Connect(const std::string& addr, uint32_t timeout_ms, ConnId* id,
               std::string* error);

  // Queues a message and writes as much as the socket takes now; the rest
  // goes out as the socket drains. Never blocks. Returns false (with *error
  // if non-null) if the connection is unknown/closing, the message is
  // invalid (ValidateControl), or writing failed (then the connection closes
  // and on_close follows).
  bool Send(ConnId id, const ControlMessage& m, std::string* error = nullptr);
  // Closes a connection after flushing what is queued (bounded by kLinger).
  // on_close(id, reason) follows. No-op if the connection is already
  // closing or unknown.
  void Close(ConnId id, const std::string& reason);
  // "ip:port" of the peer, empty if unknown.
  std::string PeerAddress(ConnId id) const;

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

 private:
  struct Conn;
  using Clock = std::chrono::steady_clock;

  ConnId AddConn(int fd, std::string peer);
  Conn* Find(ConnId id) const;
  void HandleAccept();
  void HandleConnEvent(Conn& c, uint32_t events);
  void HandleReadable(Conn& c);
  void HandleWritable(Conn& c);
  // Writes queued output until done or EAGAIN; false on a fatal error (the
  // connection has then been aborted).
  bool Flush(Conn& c);
  void OnProtocolError(Conn& c);
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

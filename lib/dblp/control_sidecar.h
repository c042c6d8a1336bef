// The TCP control sidecar: one thread, epoll, non-blocking sockets, framed
// with the control codec. It runs off the datapath cores; datapath threads
// talk to it only through lock-free queues of their own plus Wakeup(), so
// they never block on a socket.
//
// Everything except Wakeup(), RequestStop() and the counters runs on the
// sidecar thread, inside Run() (callbacks included).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dblp/control.h"

namespace dblp {

using ConnId = uint32_t;

class ControlSidecar {
 public:
  struct Callbacks {
    // A peer connected to our listening socket.
    std::function<void(ConnId)> on_accept;
    // A complete, valid message arrived.
    std::function<void(ConnId, const ControlMessage&)> on_message;
    // The connection is gone: peer closed, I/O error, or the peer sent
    // garbage (the decoder's error text is in `reason`; an ERROR message was
    // sent back before closing).
    std::function<void(ConnId, const std::string& reason)> on_close;
    // Wakeup() was called (any number of times since the last call).
    std::function<void()> on_wakeup;
    // Called every `tick_ms` if set (stats lines, deadlines).
    std::function<void()> on_tick;
    uint32_t tick_ms = 0;
  };

  explicit ControlSidecar(Callbacks cb, uint32_t max_frame = kMaxControlFrame);
  ~ControlSidecar();
  ControlSidecar(const ControlSidecar&) = delete;
  ControlSidecar& operator=(const ControlSidecar&) = delete;

  // Setup, before Run. "ip:port" (port 0 = ephemeral; bound_port() tells).
  // Return false and set *error (naming the fix) on failure.
  bool Listen(const std::string& addr, std::string* error);
  uint16_t bound_port() const { return bound_port_; }
  // Blocking connect with retries until `timeout_ms` (the server may still
  // be starting). Returns the connection id.
  bool Connect(const std::string& addr, uint32_t timeout_ms, ConnId* id,
               std::string* error);

  // Sidecar thread: queue a message (written as the socket allows).
  // Returns false if the connection is gone.
  bool Send(ConnId id, const ControlMessage& m);
  // Sidecar thread: close a connection (after flushing what is queued).
  void Close(ConnId id, const std::string& reason);

  // Runs the event loop until RequestStop().
  void Run();

  // Any thread.
  void Wakeup();
  void RequestStop();

  uint64_t messages_in() const { return messages_in_.load(); }
  uint64_t messages_out() const { return messages_out_.load(); }
  uint64_t protocol_errors() const { return protocol_errors_.load(); }

 private:
  struct Conn;
  void HandleReadable(Conn& c);
  void HandleWritable(Conn& c);
  void Drop(ConnId id, const std::string& reason);
  void Arm(Conn& c);

  Callbacks cb_;
  uint32_t max_frame_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  int timer_fd_ = -1;
  int listen_fd_ = -1;
  uint16_t bound_port_ = 0;
  ConnId next_id_ = 1;
  std::unordered_map<ConnId, std::unique_ptr<Conn>> conns_;
  std::unordered_map<int, ConnId> by_fd_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> messages_in_{0}, messages_out_{0},
      protocol_errors_{0};
};

}  // namespace dblp

// Inside the control sidecar (control_sidecar.h), shared by its three
// files: the connection state, the epoll tags and the limits' constants.
// control_sidecar.cc is the I/O (epoll, reads, writes, frames, closes),
// sidecar_tags.cc the authenticated channel (TAG per message),
// sidecar_limits.cc what anyone who reaches the port can make it hold
// (accepts, refusals, deadlines, idle and partial-frame timeouts, the
// heap's trim). Not for use outside lib/dblp/control.
#pragma once

#include <netinet/in.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"

namespace dblp::sidecar {

// epoll_event.data tags. Connections carry kConnTag | id so that a stale
// event for a connection closed earlier in the same batch finds nothing
// (ids are never reused) instead of hitting whatever reused its fd.
inline constexpr uint64_t kWakeTag = 1;
inline constexpr uint64_t kTimerTag = 2;
inline constexpr uint64_t kListenTag = 3;
inline constexpr uint64_t kConnTag = uint64_t{1} << 32;

inline constexpr size_t kReadChunk = 64 * 1024;
// Reads per readiness event: a peer that floods us cannot starve the other
// connections (epoll is level-triggered, we come back to it next turn).
inline constexpr int kMaxReadsPerEvent = 16;
// Accepts per loop turn, after the turn's reads: a flood of newcomers
// that may evict unauthenticated connections comes in small steps, each
// after what the open ones sent (a worker's PROOF) was read.
inline constexpr int kMaxAcceptsPerEvent = 16;
inline constexpr std::chrono::milliseconds kAcceptPause{100};
// A refused connection is logged at most once per this period; the lines in
// between are counted into the next one, so a flood cannot flood stderr.
inline constexpr std::chrono::seconds kRefusalLogPeriod{5};
// A decoder that held more than this for one frame is replaced by a fresh
// one once the frame is consumed: ControlDecoder keeps its capacity, and a
// peer's single large frame must not pin that memory for the connection's
// lifetime. At or below it, reuse saves an allocation per frame.
inline constexpr size_t kShrinkAbove = 64 * 1024;
// malloc_trim once this much peer-controlled buffer memory was freed, at
// most once per kTrimPeriod (it walks every arena).
inline constexpr size_t kTrimAfterBytes = size_t{1} << 20;
inline constexpr std::chrono::milliseconds kTrimPeriod{100};
#ifdef __GLIBC__
inline constexpr bool kCanTrim = true;
#else
inline constexpr bool kCanTrim = false;
#endif

std::string Ms(std::chrono::milliseconds d);
// A failed read or write, said for a person (reset, closed, timed out).
std::string DescribeIoError(const char* op, int err);

}  // namespace dblp::sidecar

namespace dblp {

struct ControlSidecar::Conn {
  Conn(ConnId i, int f, std::string p, uint32_t max_frame)
      : id(i), fd(f), peer(std::move(p)), decoder(max_frame) {}

  size_t pending() const { return out.size() - out_off; }

  // A frame's length prefix or body is still to come.
  bool in_frame() const { return hdr_have > 0 || body_left > 0; }

  ConnId id;
  int fd;  // -1 once the socket is closed
  std::string peer;
  ControlDecoder decoder;
  bool accepted = false;        // from our listening socket: max_connections
  bool trusted = true;          // accepted ones start untrusted (Trust())
  bool spoke = false;           // a complete message arrived (eviction order)
  uint32_t source = 0;          // accepted: the peer's IPv4, host order
  Clock::time_point opened{};   // the join deadline runs from here
  Clock::time_point last_rx{};  // the idle timeout runs from here
  Clock::time_point frame_start{};  // first byte of the frame in progress
  // Frame boundaries, tracked beside the decoder so each length prefix is
  // checked against the limit in force when it completes.
  std::array<uint8_t, kControlFrameHeader> hdr{};
  size_t hdr_have = 0;       // bytes of the current length prefix seen
  uint64_t body_left = 0;    // bytes of the current frame still to come
  size_t rx_peak = 0;        // most bytes the decoder held since it was made
  std::vector<uint8_t> out;  // encoded frames not yet written
  size_t out_off = 0;        // written prefix of out
  bool closing = false;      // logically closed: on_close queued, no Send
  bool wr_shut = false;      // our FIN sent
  bool eof = false;          // peer's FIN seen
  // The peer reset the connection while we wrote: the close waits until
  // what it sent before (its ERROR or BYE) is read, and gives this reason.
  std::string write_failed;
  Clock::time_point deadline{};  // closing: close the socket by then
  uint32_t armed = 0;            // epoll events currently registered
  // An authenticated channel (Authenticate): each direction's key and
  // next sequence number, and the message waiting for its TAG.
  std::unique_ptr<ChannelKeys> keys;
  uint64_t send_seq = 0, recv_seq = 0;
  std::optional<ControlMessage> untagged;
};

}  // namespace dblp

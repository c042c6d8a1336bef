// Typed messages between a datapath (lcore or thread) and its control
// thread, one struct per kind. They are trivially copyable so that a ring of
// fixed-size elements (rte_ring, or any queue) can carry the variants by
// value.
//
// PROBE, BITMAP and STOP *arriving* need no event: the control thread hands
// them straight to the send or receive side they are for (round_control.h),
// through the side's lock-free mailboxes.
#pragma once

#include <cstdint>
#include <type_traits>
#include <variant>

#include "dblp/control/control.h"
#include "dblp/round/stop_decision.h"

namespace dblp {

// ---- datapath -> control: what a round side asks the control thread to
// send to its peer. `peer` is the worker rank at the server, 0 at a worker.

// A pass is over: ask the receiver which chunks it has. `lane` is the
// asking send side's (its chunk range when rounds are split over lanes).
struct ProbeRequest {
  uint16_t peer = 0;
  Direction direction = Direction::kPush;
  uint32_t round = 0;
  uint32_t pass = 0;
  uint16_t lane = 0;
};
// Enough arrived: tell the sender to stop.
struct StopRequest {
  uint16_t peer = 0;
  Direction direction = Direction::kPush;
  StopTrigger trigger = StopTrigger::kThreshold;
  uint32_t round = 0;
  uint32_t received = 0;
};
// The answer to PROBEs is in the answer mailbox of receive side `side` (its
// lane; 0 when the receiver is not split): one BITMAP to each asking
// sender lane in `askers` (bit k = lane k).
struct BitmapRequest {
  uint16_t peer = 0;
  Direction direction = Direction::kPush;
  uint16_t side = 0;
  uint32_t round = 0;
  uint64_t askers = 1;
};
// A round's tolerance, announced to every live worker (server only).
struct RoundBeginRequest {
  Direction direction = Direction::kPush;
  uint32_t round = 0;
  double p = 0;
  uint64_t deadline_ns = 0;  // from the ROUND_BEGIN's arrival; 0 = none
  double min_fraction = 0;
  bool critical = false;  // the policy's phase, reported with the rows
};
// The job is over on this side: BYE (ok) or ERROR with the app's failure
// text, then close.
struct FinishRequest {
  bool ok = true;
};

// Server: send worker `peer` the push round's accepted set, which the
// coordinator staged (ServerControl::StageAccepted) before posting this.
struct AcceptedRequest {
  uint16_t peer = 0;
  uint32_t round = 0;
};

// Server: the job went on without worker `peer`, which stayed connected
// but silent (--on_worker_loss=continue): it is told why (ERROR) and its
// connection closed, so a worker that wakes up later ends naming the cause
// instead of timing out on a server that no longer answers it.
struct DropRequest {
  uint16_t peer = 0;
};

using ControlRequest =
    std::variant<ProbeRequest, StopRequest, BitmapRequest, RoundBeginRequest,
                 FinishRequest, AcceptedRequest, DropRequest>;

// ---- control -> datapath.

// ROUND_BEGIN arrived (worker).
struct RoundBeginEvent {
  Direction direction = Direction::kPush;
  uint32_t round = 0;
  double p = 0;
  uint64_t deadline_ns = 0;  // relative; 0 = none
  double min_fraction = 0;
  bool critical = false;  // the policy's phase (v5), for the worker's rows
};
// The peer said BYE: it finished its iterations (server).
struct PeerByeEvent {
  uint16_t peer = 0;
};
// The peer's control connection closed (server: a worker; worker: the
// server, peer 0). The reason is in the control state.
struct PeerGoneEvent {
  uint16_t peer = 0;
};

using DatapathEvent =
    std::variant<RoundBeginEvent, PeerByeEvent, PeerGoneEvent>;

static_assert(std::is_trivially_copyable_v<ControlRequest>,
              "requests are passed by value through rings");
static_assert(std::is_trivially_copyable_v<DatapathEvent>,
              "events are passed by value through rings");
static_assert(sizeof(ControlRequest) <= 48 && sizeof(DatapathEvent) <= 48,
              "ring elements stay small");

// The helper for std::visit over these variants.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace dblp

// The control thread's half of the round sides (send_side.h,
// receive_side.h), shared by every app and transport: PROBE, BITMAP and
// STOP messages handed to the side they are for, and the sides' requests
// turned into control messages.
#pragma once

#include <cstdint>
#include <optional>

#include "dblp/control.h"
#include "dblp/receive_side.h"
#include "dblp/round_events.h"
#include "dblp/send_side.h"

namespace dblp {

// Control thread: if `m` is a PROBE for `recv`'s direction, or a BITMAP or
// STOP for `send`'s, hands it over and returns true (also when the side
// turns it away: a stale round, a busy mailbox). Either side may be null.
// Returns false for any other message.
bool DeliverToSides(const ControlMessage& m, SendSide* send,
                    ReceiveSide* recv, uint64_t now_ns);

// Control thread: the message a PROBE, STOP or BITMAP request becomes. A
// BITMAP's words come from `answering`'s mailbox, which is released. Empty
// for the app-level requests (ROUND_BEGIN, finish), or a BITMAP request
// without a side.
std::optional<ControlMessage> SideRequestMessage(const ControlRequest& r,
                                                 ReceiveSide* answering);

}  // namespace dblp

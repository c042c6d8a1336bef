// The control thread's half of the round sides (send_side.h,
// receive_side.h), shared by every app and transport: PROBE, BITMAP and
// STOP messages handed to the sides they are for, and the sides' requests
// turned into control messages.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/round_events.h"
#include "dblp/round/send_side.h"

namespace dblp {

// Control thread: hands a PROBE, BITMAP or STOP to the sides of one peer
// and direction, and returns true (also when a side turns it away: a stale
// round, a busy mailbox); false for any other message.
//  - STOP goes to every send side of its direction (each stops its lane);
//  - BITMAP to the send side of the lane it names (its PROBE's);
//  - PROBE to the receive side of the asking lane's chunk range, or to the
//    only receive side when the receiver is not split into lanes.
bool DeliverToSides(const ControlMessage& m, std::span<SendSide* const> sends,
                    std::span<ReceiveSide* const> recvs, uint64_t now_ns);
// The same for one send side and one receive side (either may be null).
bool DeliverToSides(const ControlMessage& m, SendSide* send,
                    ReceiveSide* recv, uint64_t now_ns);

// Control thread: the messages a PROBE, STOP or BITMAP request becomes. A
// BITMAP request becomes one BITMAP per asking lane, its words from
// `answering`'s mailbox, which is released. Empty for the app-level
// requests (ROUND_BEGIN, finish), or a BITMAP request without a side.
std::vector<ControlMessage> SideRequestMessages(const ControlRequest& r,
                                                ReceiveSide* answering);

// Control thread: a worker's request to its server on connection `c`. A
// FinishRequest becomes BYE when the job went well (the server closes
// once every worker said BYE: closing first would race its next
// ROUND_BEGIN, whose write could fail on our closed socket before it read
// the BYE, and a finished worker would look lost), else ERROR `failure`
// and a close; a side's request becomes its messages (SideRequestMessages,
// BITMAPs from `answering`, the broadcast side).
void SendWorkerRequest(ControlSidecar& sc, ConnId c, const ControlRequest& r,
                       ReceiveSide* answering, const std::string& failure);

// Control thread: the ROUND_BEGIN message an announcement becomes (the
// iteration is the round's half: push 2i, broadcast 2i + 1).
RoundBeginMsg RoundBeginMessage(const RoundBeginRequest& r);

}  // namespace dblp

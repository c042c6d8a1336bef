#include "dblp/round_control.h"

#include <variant>

namespace dblp {

bool DeliverToSides(const ControlMessage& m, SendSide* send,
                    ReceiveSide* recv, uint64_t now_ns) {
  if (const auto* st = std::get_if<StopMsg>(&m)) {
    if (send != nullptr && st->direction == send->config().direction) {
      send->StopArrived(st->round, now_ns, st->received);
    }
    return true;
  }
  if (const auto* bm = std::get_if<BitmapMsg>(&m)) {
    if (send != nullptr && bm->direction == send->config().direction) {
      send->BitmapArrived(*bm, now_ns);
    }
    return true;
  }
  if (const auto* pr = std::get_if<ProbeMsg>(&m)) {
    if (recv != nullptr && pr->direction == recv->config().direction) {
      recv->ProbeArrived(pr->round);
    }
    return true;
  }
  return false;
}

std::optional<ControlMessage> SideRequestMessage(const ControlRequest& r,
                                                 ReceiveSide* answering) {
  if (const auto* p = std::get_if<ProbeRequest>(&r)) {
    return ProbeMsg{p->round, p->direction, p->pass};
  }
  if (const auto* s = std::get_if<StopRequest>(&r)) {
    return StopMsg{s->round, s->direction, s->received,
                   s->trigger == StopTrigger::kDeadline
                       ? StopReason::kDeadline
                       : StopReason::kThreshold};
  }
  if (const auto* b = std::get_if<BitmapRequest>(&r)) {
    if (answering == nullptr) return std::nullopt;
    BitmapMailbox& box = answering->answer();
    const Bitmap& bits = box.slot();
    BitmapMsg msg{b->round, b->direction, bits.size(),
                  {bits.words().begin(), bits.words().end()}};
    box.Release();
    return msg;
  }
  return std::nullopt;
}

}  // namespace dblp

#include "dblp/round/round_control.h"

#include <variant>

namespace dblp {

bool DeliverToSides(const ControlMessage& m, std::span<SendSide* const> sends,
                    std::span<ReceiveSide* const> recvs, uint64_t now_ns) {
  if (const auto* st = std::get_if<StopMsg>(&m)) {
    for (SendSide* s : sends) {
      if (s->config().direction == st->direction) {
        s->StopArrived(st->round, now_ns, st->received);
      }
    }
    return true;
  }
  if (const auto* bm = std::get_if<BitmapMsg>(&m)) {
    for (SendSide* s : sends) {
      if (s->config().direction == bm->direction &&
          s->config().lane == bm->lane) {
        s->BitmapArrived(*bm, now_ns);
      }
    }
    return true;
  }
  if (const auto* pr = std::get_if<ProbeMsg>(&m)) {
    ReceiveSide* r = recvs.size() == 1         ? recvs[0]
                     : pr->lane < recvs.size() ? recvs[pr->lane]
                                               : nullptr;
    if (r != nullptr && r->config().direction == pr->direction) {
      r->ProbeArrived(pr->round, pr->lane);
    }
    return true;
  }
  return false;
}

bool DeliverToSides(const ControlMessage& m, SendSide* send,
                    ReceiveSide* recv, uint64_t now_ns) {
  const size_t ns = send ? 1 : 0, nr = recv ? 1 : 0;
  return DeliverToSides(m, std::span<SendSide* const>(&send, ns),
                        std::span<ReceiveSide* const>(&recv, nr), now_ns);
}

RoundBeginMsg RoundBeginMessage(const RoundBeginRequest& r) {
  return RoundBeginMsg{r.round,       r.round / 2,    r.direction, r.p,
                       r.deadline_ns, r.min_fraction, r.critical};
}

std::vector<ControlMessage> SideRequestMessages(const ControlRequest& r,
                                                ReceiveSide* answering) {
  std::vector<ControlMessage> out;
  if (const auto* p = std::get_if<ProbeRequest>(&r)) {
    out.emplace_back(ProbeMsg{p->round, p->direction, p->pass, p->lane});
  } else if (const auto* s = std::get_if<StopRequest>(&r)) {
    out.emplace_back(StopMsg{s->round, s->direction, s->received,
                             s->trigger == StopTrigger::kDeadline
                                 ? StopReason::kDeadline
                                 : StopReason::kThreshold});
  } else if (const auto* b = std::get_if<BitmapRequest>(&r)) {
    if (answering == nullptr) return out;
    BitmapMailbox& box = answering->answer();
    const Bitmap& bits = box.slot();
    for (uint16_t lane = 0; lane < 64; ++lane) {
      if ((b->askers >> lane & 1) == 0) continue;
      out.emplace_back(BitmapMsg{b->round,
                                 b->direction,
                                 bits.size(),
                                 {bits.words().begin(), bits.words().end()},
                                 lane});
    }
    box.Release();
  }
  return out;
}

void SendWorkerRequest(ControlSidecar& sc, ConnId c, const ControlRequest& r,
                       ReceiveSide* answering, const std::string& failure) {
  if (const auto* f = std::get_if<FinishRequest>(&r)) {
    if (f->ok) {
      sc.Send(c, ByeMsg{"done"});
    } else {
      sc.Send(c, ErrorMsg{2, failure});
      sc.Close(c, "job failed");
    }
    return;
  }
  for (const ControlMessage& m : SideRequestMessages(r, answering)) {
    sc.Send(c, m);
  }
}

}  // namespace dblp

#include "udp/udp_server_link.h"

#include <arpa/inet.h>

#include <chrono>
#include <thread>
#include <utility>
#include <variant>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/round/round_control.h"
#include "udp/udp_job.h"

namespace dblp::udp {
namespace {

ControlSidecar::Callbacks LinkCallbacks(
    std::function<void(const ControlMessage&)> on_message,
    std::function<void(const std::string&)> on_close,
    std::function<void()> on_wakeup) {
  ControlSidecar::Callbacks cb;
  cb.on_message = [on_message](ConnId, const ControlMessage& m) {
    on_message(m);
  };
  cb.on_close = [on_close](ConnId, const std::string& r) { on_close(r); };
  cb.on_wakeup = std::move(on_wakeup);
  return cb;
}

}  // namespace

ServerLink::ServerLink(uint16_t shard, std::string control_address,
                       const JobSecret& secret)
    : index(shard),
      address(std::move(control_address)),
      sidecar_(LinkCallbacks([this](const ControlMessage& m) { OnMessage(m); },
                             [this](const std::string& reason) {
                               Gone("control connection to " + Name() +
                                    " closed: " + reason);
                               closed_.store(true, std::memory_order_release);
                             },
                             [this] { OnWakeup(); })),
      handshake_(secret) {}

std::string ServerLink::Name() const {
  if (index == 0) return "the server at " + address;
  return "server shard " + std::to_string(index) + " at " + address;
}

std::string ServerLink::Join(const JoinMsg& join, uint32_t timeout_ms) {
  std::string err;
  if (!sidecar_.Connect(address, timeout_ms, &conn_, &err, UdpServerApp())) {
    return "cannot reach " + Name() + ": " + err;
  }
  join_ = join;
  handshake_.Start(&join_);
  // A JOIN the codec refuses is said now, not at the join deadline.
  if (!sidecar_.Send(conn_, join_, &err)) {
    return "cannot send JOIN to " + Name() + ": " + err;
  }
  thread_ = std::make_unique<SidecarThread>(sidecar_);
  return "";
}

std::string ServerLink::AwaitWelcome(uint32_t timeout_ms,
                                     const std::atomic<bool>* quit) {
  auto quitting = [quit] {
    return quit != nullptr && quit->load(std::memory_order_relaxed);
  };
  if (!WaitFor([&] { return welcomed_.load() || gone() || quitting(); },
               timeout_ms) ||
      !welcomed_.load()) {
    if (quitting()) return "interrupted";
    return "no WELCOME from " + Name() +
           (gone() ? " (" + gone_why_ + ")"
                   : " within " + std::to_string(timeout_ms) + " ms");
  }
  return "";
}

FrameKey ServerLink::MemberFrameKey() const {
  return handshake_.MemberFrameKey(
      welcome_.job_nonce, static_cast<uint16_t>(welcome_.rank),
      static_cast<FrameAuthMode>(welcome_.frame_auth));
}

// ---- sidecar thread -------------------------------------------------------

void ServerLink::OnMessage(const ControlMessage& m) {
  if (const auto* c = std::get_if<ChallengeMsg>(&m)) {
    if (std::string why = handshake_.AnswerChallenge(sidecar_, conn_, *c);
        !why.empty()) {
      Gone(why);
    }
  } else if (const auto* w = std::get_if<WelcomeMsg>(&m)) {
    // Authenticated, then checked against what we can hold.
    std::string why = handshake_.CheckWelcome(*w);
    if (why.empty()) why = ValidateWelcome(*w, join_);
    if (!why.empty() || welcomed_.load()) {
      if (why.empty()) why = "the server sent WELCOME twice";
      why = (index == 0 ? std::string("the server") : Name()) +
            "'s WELCOME is refused: " + why;
      sidecar_.Send(conn_, ErrorMsg{3, why});
      sidecar_.Close(conn_, why);
      return Gone(why);
    }
    welcome_ = *w;
    welcomed_.store(true, std::memory_order_release);
  } else if (!welcomed_.load() && !std::holds_alternative<ErrorMsg>(m)) {
    const std::string why = (index == 0 ? std::string("the server") : Name()) +
                            " sent " + ControlTypeName(m) + " out of order";
    sidecar_.Close(conn_, why);
    Gone(why);
  } else if (const auto* a = std::get_if<AcceptedMsg>(&m)) {
    accepted_.Put(*a);  // push feedback: what the server summed
  } else if (const auto* rb = std::get_if<RoundBeginMsg>(&m)) {
    events_.Push(RoundBeginEvent{rb->direction, rb->round, rb->p,
                                 rb->deadline_ns, rb->min_fraction,
                                 rb->critical});
  } else if (sides_live_.load(std::memory_order_acquire) &&
             DeliverToSides(m, push.get(), bcast.get(), NowNs())) {
    // STOP or BITMAP for the push, PROBE for the broadcast.
  } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    Gone(Name() + ": " + e->text);
  } else if (std::holds_alternative<ByeMsg>(m)) {
    Gone(index == 0 ? std::string("server said BYE") : Name() + " said BYE");
  }
}

void ServerLink::Gone(const std::string& why) {
  if (gone_.load()) return;  // the first cause is the one told
  gone_why_ = why;
  gone_.store(true, std::memory_order_release);
}

void ServerLink::OnWakeup() {
  if (!requests_.Drain(&sending_)) return;
  // BYE or ERROR (Finish waits, bounded, for the server's close); the
  // push side's PROBE; the broadcast side's STOP and BITMAP.
  for (const ControlRequest& r : sending_) {
    SendWorkerRequest(sidecar_, conn_, r, bcast.get(), failure_);
  }
}

// ---- datapath thread ------------------------------------------------------

void ServerLink::Start(UdpSocketPort* port, const ChunkLayout& partition,
                       uint32_t first, const uint8_t* gradient,
                       uint32_t burst) {
  const WelcomeMsg& w = welcome_;
  layout = partition;
  first_chunk = first;
  // The server's data socket: its control address's IPv4 unless the
  // WELCOME names another, at the WELCOME's port.
  sockaddr_in data{};
  std::string err;
  ParseIpv4Endpoint(address, false, false, "127.0.0.1:9100", &data, &err);
  if (w.server_ipv4 != 0) data.sin_addr.s_addr = htonl(w.server_ipv4);
  data.sin_port = htons(w.udp_base_port);
  port->AddPeer(index, data);
  const FrameKey key = MemberFrameKey();
  frames = std::make_unique<PacketFrames<UdpSocketPort>>(port, index, gradient,
                                                         &layout, burst);
  frames->set_auth(key);
  push = std::make_unique<SendSide>(
      PushSendConfig(w.session, static_cast<uint16_t>(w.rank), burst));
  bcast = std::make_unique<ReceiveSide>(
      BroadcastReceiveConfig(w.session, layout, key));
  outbox = std::make_unique<Outbox>(&requests_, &sidecar_);
  sides_live_.store(true, std::memory_order_release);
}

bool ServerLink::TakeEvents(uint64_t now) {
  if (!events_.Drain(&taken_)) return false;
  for (const DatapathEvent& e : taken_) {
    const auto* rb = std::get_if<RoundBeginEvent>(&e);
    if (rb == nullptr) continue;
    ++announcements_;
    if (rb->direction == Direction::kPush) {
      go_ = Go{true, rb->round, rb->p, rb->critical};
    } else if (bcast) {
      bcast->Announce(*rb, now);  // the broadcast's p, now or at its Begin
    }
  }
  return true;
}

void ServerLink::Finish(bool ok, const std::string& failure) {
  if (!thread_) return;
  failure_ = failure;  // before the request: the sidecar reads it then
  requests_.Push(FinishRequest{ok});
  sidecar_.Wakeup();
  WaitFor([&] { return closed_.load(std::memory_order_acquire); }, 1000);
}

void ServerLink::Stop() { thread_.reset(); }

}  // namespace dblp::udp

// A fake transport for the round sides (no EAL): frames on a deque with
// optional loss and TX backpressure, and a control channel that delivers
// each request at the next turn. Shared by the tests that drive the real
// round code (test_round_sides, test_broadcast_carry, test_push_feedback).
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "dblp/round/receive_side.h"
#include "dblp/round/round_control.h"
#include "dblp/round/send_side.h"

namespace dblp::testing_link {

constexpr uint32_t kSession = 0xABCD1234u;

// Frames go into `wire`; `accept` caps how many one Send takes (TX
// backpressure); `drop` loses a frame after it was taken (a lossy link).
struct FakeFrames {
  const uint8_t* buffer = nullptr;
  const ChunkLayout* layout = nullptr;
  std::deque<std::vector<uint8_t>> wire;
  uint32_t accept = UINT32_MAX;
  std::function<bool(uint32_t seq)> drop;
  std::vector<uint32_t> sent_seqs;  // every frame that left
  std::vector<uint8_t> last_frame;  // a copy, to replay as a stale frame

  uint32_t Send(const DataHeader& proto, const uint32_t* seqs, uint32_t n) {
    const uint32_t k = std::min(n, accept);
    for (uint32_t i = 0; i < k; ++i) {
      DataHeader h = proto;
      h.seq = seqs[i];
      h.payload_len = static_cast<uint16_t>(layout->Length(h.seq));
      std::vector<uint8_t> f(kDataHeaderBytes + h.payload_len);
      BuildDataFrame(h, buffer + layout->Offset(h.seq), f.data());
      sent_seqs.push_back(h.seq);
      last_frame = f;
      if (drop && drop(h.seq)) continue;
      wire.push_back(std::move(f));
    }
    return k;
  }
};

struct FakeOutbox {
  std::vector<ControlRequest> posted;
  void Post(const ControlRequest& r) { posted.push_back(r); }
};

// One direction: a sender, a receiver, the wire between them and a control
// channel that delivers each request at the next Turn.
class FakeLink {
 public:
  void SetUpLink(uint32_t floats, uint32_t burst, uint32_t rx_poll = 16) {
    layout_ = ChunkLayout(uint64_t{floats} * 4, 64);
    grad_.resize(floats);
    std::iota(grad_.begin(), grad_.end(), 1.0f);
    got_.assign(floats, 0.0f);
    frames_ = FakeFrames{};
    frames_.buffer = reinterpret_cast<const uint8_t*>(grad_.data());
    frames_.layout = &layout_;
    SendSideConfig sc;
    sc.type = FrameType::kPush;
    sc.session = kSession;
    sc.sender_rank = 3;
    sc.burst = burst;
    sc.probe_retry_ns = 1000;
    send_ = std::make_unique<SendSide>(sc);
    ReceiveSideConfig rc;
    rc.receiver = ReceiverConfig{kSession, FrameType::kPush, 3, layout_};
    recv_ = std::make_unique<ReceiveSide>(rc);
    rx_poll_ = rx_poll;
  }
  void Begin(uint32_t round, double p) {
    order_.resize(layout_.num_chunks());
    std::iota(order_.begin(), order_.end(), 0u);
    recv_->Begin(round, p, 0, 0, now_);
    send_->Begin(round, order_, now_);
  }
  // One loop turn on each side: RX (at most rx_poll_ frames), then the
  // receive side's step, the control channel, then the send side's step.
  bool Turn() {
    now_ += 100;
    ++poll_gen_;
    uint32_t n = 0;
    while (n < rx_poll_ && !frames_.wire.empty()) {
      const std::vector<uint8_t> f = std::move(frames_.wire.front());
      frames_.wire.pop_front();
      ++n;
      auto* out = reinterpret_cast<uint8_t*>(got_.data());
      const Verdict v = recv_->OnFrame(
          f.data(), f.size(), [&](const DataHeader& h, const uint8_t* pl) {
            ++consumed_[h.seq];
            std::memcpy(out + layout_.Offset(h.seq), pl, h.payload_len);
          });
      ++verdicts_[static_cast<int>(v)];
    }
    if (n < rx_poll_) drained_gen_ = poll_gen_;
    const bool r =
        recv_->Step(now_, RxProgress{n > 0, poll_gen_, drained_gen_}, rx_out_);
    Deliver();
    const bool s = send_->Step(now_, frames_, tx_out_);
    Deliver();
    return r || s || n > 0;
  }
  // Control: what the sides asked for reaches the other side.
  void Deliver() {
    for (const ControlRequest& q : tx_out_.posted) {
      const auto msgs = SideRequestMessages(q, nullptr);
      ASSERT_EQ(msgs.size(), 1u);
      ++probes_;
      if (!lose_probes_)
        DeliverToSides(msgs[0], send_.get(), recv_.get(), now_);
    }
    tx_out_.posted.clear();
    for (const ControlRequest& q : rx_out_.posted) {
      const auto msgs = SideRequestMessages(q, recv_.get());
      ASSERT_EQ(msgs.size(), 1u);
      const ControlMessage& m = msgs[0];
      if (std::holds_alternative<StopMsg>(m)) ++stops_;
      if (std::holds_alternative<BitmapMsg>(m)) {
        ++bitmaps_;
        if (lose_bitmaps_ > 0) {
          --lose_bitmaps_;
          continue;
        }
      }
      DeliverToSides(m, send_.get(), recv_.get(), now_);
    }
    rx_out_.posted.clear();
  }
  void RunUntilDone(int max_turns = 100000) {
    for (int i = 0; i < max_turns && !send_->done(); ++i) Turn();
    ASSERT_TRUE(send_->done()) << "round did not finish";
    // Frames still on the wire land as in a real receiver.
    while (!frames_.wire.empty()) Turn();
  }
  void ExpectNothingTwice() {
    for (const auto& [seq, n] : consumed_) EXPECT_EQ(n, 1) << "seq " << seq;
    EXPECT_EQ(consumed_.size(), recv_->receiver().received());
  }

  ChunkLayout layout_;
  std::vector<float> grad_, got_;
  std::vector<uint32_t> order_;
  FakeFrames frames_;
  FakeOutbox tx_out_, rx_out_;
  std::unique_ptr<SendSide> send_;
  std::unique_ptr<ReceiveSide> recv_;
  std::map<uint32_t, int> consumed_;
  std::array<int, kNumVerdicts> verdicts_{};
  uint64_t now_ = 1000, poll_gen_ = 0, drained_gen_ = 0;
  uint32_t rx_poll_ = 16;
  int probes_ = 0, stops_ = 0, bitmaps_ = 0, lose_bitmaps_ = 0;
  bool lose_probes_ = false;
};

}  // namespace dblp::testing_link

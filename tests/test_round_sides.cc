// The send and receive sides driven over a fake transport, no EAL: early
// stop mid-pass, lost BITMAPs, stale frames, TX backpressure, the PROBE
// drain rule and ROUND_BEGIN ordering.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "dblp/base/rng.h"
#include "dblp/emul/loss_model.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/round_control.h"
#include "dblp/round/send_order.h"
#include "dblp/round/send_side.h"
#include "fake_link.h"

namespace dblp {
namespace {

using testing_link::FakeFrames;
using testing_link::FakeOutbox;
using testing_link::kSession;

class Link : public ::testing::Test, public testing_link::FakeLink {};

TEST_F(Link, CleanReliableRoundDeliversEverythingOnce) {
  SetUpLink(1000, 8);
  Begin(0, 0.0);
  RunUntilDone();
  EXPECT_EQ(recv_->receiver().received(), layout_.num_chunks());
  EXPECT_EQ(got_, grad_);
  EXPECT_EQ(stops_, 1);
  EXPECT_EQ(send_->stop_received(), layout_.num_chunks());
  EXPECT_EQ(send_->sender().passes(), 1u);
  ExpectNothingTwice();
}

TEST_F(Link, EarlyStopMidPassStopsTheSenderAtOnce) {
  SetUpLink(4000, 4, /*rx_poll=*/4);  // 63 chunks
  const double p = 0.5;
  Begin(0, p);
  RunUntilDone();
  const uint32_t n = layout_.num_chunks();
  const uint32_t threshold = StopThreshold(n, p);
  EXPECT_GE(recv_->receiver().received(), threshold);
  // STOP came mid-pass: the sender never finished its first pass, and sent
  // at most one burst after the STOP left the receiver.
  EXPECT_LT(frames_.sent_seqs.size(), n);
  EXPECT_LE(frames_.sent_seqs.size(), threshold + 4u);
  EXPECT_EQ(send_->sender().passes(), 1u);
  EXPECT_EQ(probes_, 0);
  EXPECT_EQ(stops_, 1);
  EXPECT_EQ(send_->done_ns(), recv_->stop_ns());
  ExpectNothingTwice();
}

TEST_F(Link, LossyRoundsDeliverAtLeastOneMinusPEveryRound) {
  for (double p : {0.0, 0.05, 0.3}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      SetUpLink(3000, 8);
      consumed_.clear();
      Rng rng(seed);
      frames_.drop = [&](uint32_t) { return rng.NextDouble() < 0.3; };
      Begin(static_cast<uint32_t>(seed * 2), p);
      RunUntilDone();
      EXPECT_GE(recv_->receiver().received(),
                StopThreshold(layout_.num_chunks(), p))
          << "p=" << p << " seed=" << seed;
      ExpectNothingTwice();
      // 30% loss leaves more than p missing after the first pass.
      if (p < 0.2) {
        EXPECT_GE(send_->sender().passes(), 2u);
      }
      // No chunk is re-sent once the receiver reported it.
      std::map<uint32_t, int> sends;
      for (uint32_t s : frames_.sent_seqs) ++sends[s];
      for (const auto& [seq, k] : sends) {
        if (consumed_.count(seq) != 0) {
          EXPECT_LE(k, static_cast<int>(send_->sender().passes()));
        }
      }
    }
  }
}

TEST_F(Link, ProbeIsAnsweredOnlyAfterAPollThatDrained) {
  SetUpLink(640, 10, /*rx_poll=*/3);  // a slow receiver: frames queue up
  Begin(0, 0.0);
  // The sender finishes its pass long before the receiver drains.
  for (int i = 0; i < 3; ++i) Turn();
  while (send_->sender().state() == SenderRound::State::kSending) Turn();
  EXPECT_FALSE(frames_.wire.empty());
  RunUntilDone();
  // Had the receiver answered at once, the BITMAP would have missed the
  // queued frames and the sender would have re-sent them.
  EXPECT_EQ(frames_.sent_seqs.size(), layout_.num_chunks());
  EXPECT_EQ(send_->sender().packets_resent(), 0u);
  ExpectNothingTwice();
}

TEST_F(Link, LostBitmapIsRecoveredByAProbeRetry) {
  SetUpLink(2000, 8);
  Rng rng(7);
  frames_.drop = [&](uint32_t) { return rng.NextDouble() < 0.5; };
  lose_bitmaps_ = 2;
  Begin(0, 0.0);
  RunUntilDone();
  EXPECT_EQ(recv_->receiver().received(), layout_.num_chunks());
  EXPECT_GE(send_->probes_sent(), 3u);  // the lost answers were asked again
  EXPECT_EQ(got_, grad_);
  ExpectNothingTwice();
}

TEST_F(Link, AProbeRetryIsNoProgress) {
  SetUpLink(640, 64);   // one burst is the whole pass
  lose_probes_ = true;  // a receiver that never answers
  Begin(0, 0.0);
  EXPECT_TRUE(send_->Step(now_, frames_, tx_out_));  // frames + first PROBE
  Deliver();
  EXPECT_EQ(send_->probes_sent(), 1u);
  EXPECT_FALSE(send_->Step(now_ + 5000, frames_, tx_out_));  // a retry
  EXPECT_EQ(send_->probes_sent(), 2u);
}

// The loops' watchdog (round_pacer.h) reads the sides' progress(): under
// 100% loss the first pass moves it, then nothing does, however many
// passes, PROBEs and BITMAPs follow.
TEST_F(Link, ResendingIntoADeadLinkIsNoProgress) {
  SetUpLink(2000, 8);
  frames_.drop = [](uint32_t) { return true; };
  Begin(0, 0.0);
  for (int i = 0; i < 20 && send_->sender().passes() < 2; ++i) Turn();
  ASSERT_EQ(send_->sender().passes(), 2u);  // the first BITMAP came back
  const uint64_t sent = send_->progress(), received = recv_->progress();
  for (int i = 0; i < 2000; ++i) Turn();
  EXPECT_GE(send_->sender().passes(), 10u);
  EXPECT_GT(send_->sender().packets_resent(), 100u);
  EXPECT_EQ(send_->progress(), sent);
  EXPECT_EQ(recv_->progress(), received);
  // One chunk gets through: both sides move.
  frames_.drop = [](uint32_t seq) { return seq != 3; };
  for (int i = 0; i < 200 && recv_->receiver().received() == 0; ++i) Turn();
  EXPECT_GT(recv_->progress(), received);
  for (int i = 0; i < 200 && send_->progress() == sent; ++i) Turn();
  EXPECT_GT(send_->progress(), sent);  // the BITMAP that shows it
}

// A resend that is getting through (its pass began with a BITMAP showing
// more delivered) is progress frame by frame: a long pass over a slow link
// must not time a healthy round out.
TEST_F(Link, AResendThatGetsThroughIsProgress) {
  SetUpLink(20000, 8, /*rx_poll=*/8);
  Rng rng(5);
  frames_.drop = [&](uint32_t) { return rng.NextDouble() < 0.5; };
  Begin(0, 0.0);
  for (int i = 0; i < 200 && send_->sender().passes() < 2; ++i) Turn();
  ASSERT_EQ(send_->sender().passes(), 2u);
  ASSERT_GT(send_->sender().pass_remaining(), 16u);
  const uint64_t before = send_->progress();
  const uint64_t resent = send_->sender().packets_resent();
  Turn();
  ASSERT_GT(send_->sender().packets_resent(), resent);
  EXPECT_GT(send_->progress(), before);
}

TEST_F(Link, DuplicatesAndStaleFramesAreNoProgress) {
  SetUpLink(640, 8);
  Begin(2, 0.0);
  Turn();
  std::deque<std::vector<uint8_t>> copies = frames_.wire;
  RunUntilDone();
  const uint64_t done = recv_->progress();
  for (auto& f : copies) frames_.wire.push_back(f);  // duplicates
  Turn();
  EXPECT_EQ(recv_->progress(), done);
  Begin(4, 0.0);  // a new round is progress; round 2's frames are not
  const uint64_t begun = recv_->progress();
  EXPECT_GT(begun, done);
  for (auto& f : copies) frames_.wire.push_back(f);
  recv_->Step(now_, RxProgress{}, rx_out_);
  while (!frames_.wire.empty()) {
    const std::vector<uint8_t> f = std::move(frames_.wire.front());
    frames_.wire.pop_front();
    recv_->OnFrame(f.data(), f.size(),
                   [](const DataHeader&, const uint8_t*) {});
  }
  EXPECT_EQ(recv_->progress(), begun);
}

TEST_F(Link, BusyBitmapMailboxCountsTheDropAndTheRoundGoesOn) {
  SetUpLink(640, 8);
  Begin(0, 0.0);
  BitmapMsg bm{0, Direction::kPush, layout_.num_chunks(),
               std::vector<uint64_t>((layout_.num_chunks() + 63) / 64, 0)};
  EXPECT_TRUE(send_->BitmapArrived(bm, now_));
  EXPECT_FALSE(send_->BitmapArrived(bm, now_));  // still unread
  EXPECT_EQ(send_->bitmaps_dropped(), 1u);
  RunUntilDone();
  EXPECT_EQ(recv_->receiver().received(), layout_.num_chunks());
}

TEST_F(Link, TxBackpressureDelaysFramesButLosesNone) {
  SetUpLink(3000, 16);
  frames_.accept = 5;  // the ring takes 5 of every 16
  Begin(0, 0.0);
  RunUntilDone();
  EXPECT_EQ(recv_->receiver().received(), layout_.num_chunks());
  EXPECT_EQ(frames_.sent_seqs.size(), layout_.num_chunks());  // no re-send
  EXPECT_EQ(send_->sender().passes(), 1u);
  EXPECT_EQ(got_, grad_);
}

TEST_F(Link, FullRingIsNoProgress) {
  SetUpLink(640, 8);
  frames_.accept = 0;
  Begin(0, 0.0);
  EXPECT_FALSE(send_->Step(now_, frames_, tx_out_));
  EXPECT_TRUE(frames_.sent_seqs.empty());
  EXPECT_EQ(send_->sender().pass_remaining(), layout_.num_chunks());
}

TEST_F(Link, StaleAndForeignFramesAreNeverConsumed) {
  SetUpLink(640, 8);
  // Frames of round 2, kept to replay during round 4.
  Begin(2, 0.0);
  RunUntilDone();
  std::vector<std::vector<uint8_t>> old;
  {
    FakeFrames keep = frames_;
    keep.wire.clear();
    keep.Send(DataHeader{FrameType::kPush, kSession, 3, 0, 2, 0}, order_.data(),
              5);
    keep.Send(DataHeader{FrameType::kPush, kSession ^ 1, 3, 0, 4, 0},
              order_.data(), 2);  // another job
    keep.Send(DataHeader{FrameType::kPush, kSession, 2, 0, 4, 0}, order_.data(),
              2);  // another worker
    keep.Send(DataHeader{FrameType::kPush, kSession, 3, 0, 6, 0}, order_.data(),
              2);  // a round not begun
    for (auto& f : keep.wire) old.push_back(f);
  }
  consumed_.clear();
  verdicts_ = {};
  recv_->Close();
  Begin(4, 0.0);
  for (auto& f : old) frames_.wire.push_front(f);
  RunUntilDone();
  EXPECT_EQ(verdicts_[static_cast<int>(Verdict::kStaleRound)], 5);
  EXPECT_EQ(verdicts_[static_cast<int>(Verdict::kWrongSession)], 2);
  EXPECT_EQ(verdicts_[static_cast<int>(Verdict::kWrongSender)], 2);
  EXPECT_EQ(verdicts_[static_cast<int>(Verdict::kFutureRound)], 2);
  EXPECT_EQ(recv_->receiver().received(), layout_.num_chunks());
  ExpectNothingTwice();
}

TEST_F(Link, AStopOfAnotherRoundStopsNothing) {
  SetUpLink(640, 8);
  Begin(4, 0.0);
  EXPECT_FALSE(send_->StopArrived(2, now_));  // a late STOP
  EXPECT_FALSE(send_->StopArrived(6, now_));  // a future one
  Turn();
  EXPECT_FALSE(send_->done());
  EXPECT_TRUE(send_->StopArrived(4, now_ + 5, 3));
  EXPECT_FALSE(send_->StopArrived(4, now_ + 9, 7));  // a second one
  Turn();
  EXPECT_TRUE(send_->done());
  EXPECT_EQ(send_->done_ns(), 1000 + 100 + 5);
  EXPECT_EQ(send_->stop_received(), 3u);
}

TEST_F(Link, ProbeOfAnOldRoundGetsNoAnswer) {
  SetUpLink(640, 8);
  Begin(4, 0.0);
  recv_->ProbeArrived(2);
  for (int i = 0; i < 3; ++i) {
    recv_->Step(now_, RxProgress{false, poll_gen_ + i, poll_gen_ + i + 1},
                rx_out_);
  }
  EXPECT_TRUE(rx_out_.posted.empty());
}

TEST_F(Link, AnnouncedPIsTheOneThatStops) {
  SetUpLink(640, 8);  // 40 chunks
  const uint32_t n = layout_.num_chunks();
  lose_probes_ = true;  // keep the round open after its first pass
  frames_.drop = [&](uint32_t seq) { return seq % 4 == 0; };  // 25% lost
  Begin(1, 0.0);  // opened before its ROUND_BEGIN: p = 0
  while (send_->sender().state() == SenderRound::State::kSending) Turn();
  for (int i = 0; i < 5; ++i) Turn();
  EXPECT_FALSE(recv_->stopped()) << "a stale p must not stop the round";
  EXPECT_EQ(recv_->receiver().received(), n - n / 4);
  recv_->Announce(RoundBeginEvent{Direction::kPush, 1, 0.3, 0, 0}, now_);
  Turn();  // no new frame: the announcement alone decides
  EXPECT_TRUE(recv_->stopped());
  EXPECT_EQ(stops_, 1);
  EXPECT_TRUE(send_->done());
}

TEST_F(Link, EarlyAnnouncementIsKeptForItsRound) {
  SetUpLink(640, 8);
  Begin(1, 0.0);
  recv_->Close();
  recv_->Announce(RoundBeginEvent{Direction::kPush, 3, 0.25, 0, 0}, now_);
  recv_->Announce(RoundBeginEvent{Direction::kPush, 1, 0.9, 0, 0}, now_);
  recv_->Begin(3, 0.0, 0, 0, now_);
  EXPECT_DOUBLE_EQ(recv_->receiver().p(), 0.25);
  recv_->Begin(5, 0.0, 0, 0, now_);
  EXPECT_DOUBLE_EQ(recv_->receiver().p(), 0.0);  // not carried further
}

TEST_F(Link, DeadlineClosesWithoutArrivals) {
  SetUpLink(640, 8);
  order_.resize(layout_.num_chunks());
  std::iota(order_.begin(), order_.end(), 0u);
  recv_->Begin(0, 0.0, now_ + 500, 0.0, now_);
  FakeOutbox out;
  EXPECT_FALSE(recv_->Step(now_ + 100, RxProgress{}, out));
  EXPECT_TRUE(recv_->Step(now_ + 600, RxProgress{}, out));
  ASSERT_EQ(out.posted.size(), 1u);
  const auto& s = std::get<StopRequest>(out.posted[0]);
  EXPECT_EQ(s.trigger, StopTrigger::kDeadline);
  EXPECT_EQ(s.received, 0u);
}

TEST(RoundControl, RequestsBecomeTheirMessages) {
  const auto probe = SideRequestMessages(
      ProbeRequest{1, Direction::kBroadcast, 9, 2, 3}, nullptr);
  ASSERT_EQ(probe.size(), 1u);
  EXPECT_EQ(std::get<ProbeMsg>(probe[0]),
            (ProbeMsg{9, Direction::kBroadcast, 2, 3}));
  const auto stop = SideRequestMessages(
      StopRequest{0, Direction::kPush, StopTrigger::kDeadline, 4, 17}, nullptr);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_EQ(std::get<StopMsg>(stop[0]),
            (StopMsg{4, Direction::kPush, 17, StopReason::kDeadline}));
  EXPECT_TRUE(SideRequestMessages(BitmapRequest{}, nullptr).empty());
  EXPECT_TRUE(SideRequestMessages(FinishRequest{}, nullptr).empty());
}

// Sender shards 0 and 2 asked before the receiver looked: each gets its own
// BITMAP, from one snapshot taken after the drain.
TEST(RoundControl, EachAskingShardGetsItsOwnBitmap) {
  const ChunkLayout layout(640, 64);
  ReceiveSide recv(ReceiveSideConfig{
      ReceiverConfig{1, FrameType::kPush, 0, layout}, Direction::kPush, 0});
  recv.Begin(4, 0.0, 0, 0, 0);
  recv.ProbeArrived(4, 0);
  recv.ProbeArrived(4, 2);
  FakeOutbox out;
  recv.Step(0, RxProgress{false, 1, 1}, out);  // seen at poll 1
  EXPECT_TRUE(out.posted.empty());             // not drained since
  recv.Step(0, RxProgress{false, 2, 2}, out);
  ASSERT_EQ(out.posted.size(), 1u);
  const auto msgs = SideRequestMessages(out.posted[0], &recv);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(std::get<BitmapMsg>(msgs[0]).lane, 0u);
  EXPECT_EQ(std::get<BitmapMsg>(msgs[1]).lane, 2u);
  EXPECT_EQ(std::get<BitmapMsg>(msgs[1]).round, 4u);
}

// A BITMAP reaches only the send side of the shard whose PROBE it answers,
// STOP reaches every shard.
TEST(RoundControl, BitmapsGoToTheirShardStopToAll) {
  const ChunkLayout layout(uint64_t{256} * 64, 64);
  std::vector<std::unique_ptr<SendSide>> sides;
  std::vector<SendSide*> ptrs;
  for (uint16_t k = 0; k < 2; ++k) {
    SendSideConfig c;
    c.lane = k;
    sides.push_back(std::make_unique<SendSide>(c));
    ptrs.push_back(sides.back().get());
  }
  std::vector<uint32_t> lo(128), hi(128);
  std::iota(lo.begin(), lo.end(), 0u);
  std::iota(hi.begin(), hi.end(), 128u);
  sides[0]->Begin(0, lo, 0, 256);
  sides[1]->Begin(0, hi, 0, 256);
  BitmapMsg bm{0, Direction::kPush, 256, std::vector<uint64_t>(4, 0), 1};
  EXPECT_TRUE(DeliverToSides(bm, ptrs, {}, 5));
  EXPECT_FALSE(sides[1]->BitmapArrived(bm, 5));  // shard 1's mailbox full
  EXPECT_TRUE(sides[0]->BitmapArrived(bm, 5));   // shard 0's was empty
  EXPECT_TRUE(DeliverToSides(
      StopMsg{0, Direction::kPush, 200, StopReason::kThreshold}, ptrs, {}, 9));
  struct NoFrames {
    uint32_t Send(const DataHeader&, const uint32_t*, uint32_t n) { return n; }
  } nf;
  FakeOutbox out;
  for (auto& s : sides) {
    s->Step(10, nf, out);
    EXPECT_TRUE(s->done());
    EXPECT_EQ(s->done_ns(), 9u);
  }
}

TEST(RoundControl, MessagesOfTheOtherDirectionAreNotHandedOver) {
  const ChunkLayout layout(640, 64);
  SendSide send(
      SendSideConfig{FrameType::kPush, 1, 0, 0, Direction::kPush, 8, 0});
  ReceiveSide recv(ReceiveSideConfig{
      ReceiverConfig{1, FrameType::kBroadcast, kAnySender, layout},
      Direction::kBroadcast, 0});
  std::vector<uint32_t> order(layout.num_chunks());
  std::iota(order.begin(), order.end(), 0u);
  send.Begin(0, order, 0);
  // A STOP for the broadcast direction is not our push's STOP.
  EXPECT_TRUE(DeliverToSides(
      StopMsg{0, Direction::kBroadcast, 1, StopReason::kThreshold}, &send,
      &recv, 5));
  FakeOutbox out;
  struct NoFrames {
    uint32_t Send(const DataHeader&, const uint32_t*, uint32_t n) { return n; }
  } nf;
  send.Step(10, nf, out);
  EXPECT_FALSE(send.done());
  EXPECT_TRUE(
      DeliverToSides(StopMsg{0, Direction::kPush, 1, StopReason::kThreshold},
                     &send, &recv, 5));
  send.Step(20, nf, out);
  EXPECT_TRUE(send.done());
  EXPECT_FALSE(DeliverToSides(ByeMsg{"x"}, &send, &recv, 5));
}

}  // namespace
}  // namespace dblp

// The STOP decision (stop_decision.h) and the receiver's round state machine
// (receiver_round.h): the promises the protocol makes about what is accepted
// and when exactly one STOP is sent.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dblp/base/rng.h"
#include "dblp/round/receiver_round.h"
#include "dblp/round/stop_decision.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

// ---------------------------------------------------------------------------
// StopThreshold / FractionFloor / StopRule

TEST(StopThresholdTest, DocumentedExamples) {
  EXPECT_EQ(StopThreshold(1000, 0.008), 992u);
  EXPECT_EQ(StopThreshold(1000, 0.408), 592u);
  EXPECT_EQ(StopThreshold(100, 0.29), 71u);  // 0.29*100 = 28.999999999999996
  EXPECT_EQ(StopThreshold(1000, 0.024), 976u);
  EXPECT_EQ(StopThreshold(1000, 0.0), 1000u);
  EXPECT_EQ(StopThreshold(1, 0.0), 1u);
  EXPECT_EQ(StopThreshold(0, 0.5), 0u);
  EXPECT_EQ(StopThreshold(10, 0.1), 9u);
  EXPECT_EQ(StopThreshold(10, 0.15), 9u);   // ceil(8.5)
  EXPECT_EQ(StopThreshold(10, 0.09), 10u);  // floor(0.9) = 0 may be lost
}

TEST(StopThresholdTest, NeverZeroAndMatchesCeilForExactValues) {
  for (uint32_t n : {1u, 2u, 3u, 7u, 100u, 1000u, 65537u}) {
    uint32_t prev = n;
    for (double p : {0.0, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.999, 0.999999,
                     std::nextafter(1.0, 0.0)}) {
      const uint32_t t = StopThreshold(n, p);
      ASSERT_GE(t, 1u) << n << " " << p;
      ASSERT_LE(t, n);
      ASSERT_LE(t, prev) << "not monotonic in p at n=" << n << " p=" << p;
      prev = t;
      // Satisfies the tolerance: at most floor(p n) chunks lost (t >= 1 wins
      // when p n >= n).
      ASSERT_GE(static_cast<double>(t), (1 - p) * n - 1e-6) << n << " " << p;
    }
  }
  // Powers of two: p * n exact, so threshold == ceil((1 - p) n) exactly.
  for (uint32_t n = 1; n <= 4096; n *= 2) {
    for (double p : {0.5, 0.25, 0.125, 0.0625}) {
      EXPECT_EQ(StopThreshold(n, p),
                static_cast<uint32_t>(std::ceil((1 - p) * n)))
          << n << " " << p;
    }
  }
}

TEST(StopThresholdTest, InvalidPThrows) {
  for (double p :
       {-0.001, -1.0, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(),
        std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(StopThreshold(100, p), std::invalid_argument) << p;
  }
}

TEST(FractionFloorTest, Examples) {
  EXPECT_EQ(FractionFloor(1000, 0.5), 500u);
  EXPECT_EQ(FractionFloor(1000, 0.5005), 501u);
  EXPECT_EQ(FractionFloor(100, 0.71), 71u);  // 0.71*100 = 70.99999999999999
  EXPECT_EQ(FractionFloor(3, 1.0 / 3), 1u);
  EXPECT_EQ(FractionFloor(1000, 0.0), 0u);
  EXPECT_EQ(FractionFloor(1000, -1.0), 0u);
  EXPECT_EQ(FractionFloor(1000, std::numeric_limits<double>::quiet_NaN()), 0u);
  EXPECT_EQ(FractionFloor(1000, 1.0), 1000u);
  EXPECT_EQ(FractionFloor(1000, 2.0), 1000u);
}

TEST(StopRuleTest, ThresholdDeadlineAndFloor) {
  StopRule r;
  r.threshold = 100;
  EXPECT_EQ(r.Evaluate(99, 1'000'000), StopTrigger::kNone);  // no deadline
  EXPECT_EQ(r.Evaluate(100, 0), StopTrigger::kThreshold);
  EXPECT_EQ(r.Evaluate(150, 0), StopTrigger::kThreshold);
  r.deadline_ns = 5000;
  r.deadline_floor = 50;
  EXPECT_EQ(r.Evaluate(99, 4999), StopTrigger::kNone);  // before deadline
  EXPECT_EQ(r.Evaluate(49, 5000), StopTrigger::kNone);  // below floor
  EXPECT_EQ(r.Evaluate(50, 5000), StopTrigger::kDeadline);
  EXPECT_EQ(r.Evaluate(99, 9999), StopTrigger::kDeadline);
  EXPECT_EQ(r.Evaluate(100, 9999), StopTrigger::kThreshold);  // threshold wins
  r.deadline_floor = 0;
  EXPECT_EQ(r.Evaluate(0, 5000), StopTrigger::kDeadline);
}

// ---------------------------------------------------------------------------
// ReceiverRound

constexpr uint32_t kSession = 0xC0FFEE;
constexpr uint32_t kChunk = 40;

// n chunks, the last one short (kChunk / 2 bytes) whenever n > 1.
ChunkLayout Layout(uint32_t n) {
  return n == 1 ? ChunkLayout(kChunk, kChunk)
                : ChunkLayout(uint64_t{kChunk} * (n - 1) + kChunk / 2, kChunk);
}

ReceiverConfig Config(uint32_t n, int32_t sender = kAnySender,
                      FrameType type = FrameType::kPush) {
  ReceiverConfig c;
  c.session = kSession;
  c.expected_type = type;
  c.expected_sender = sender;
  c.layout = Layout(n);
  return c;
}

struct FrameSpec {
  uint32_t round = 0;
  uint32_t seq = 0;
  int32_t len = -1;  // -1: the layout's length for seq
  uint32_t session = kSession;
  FrameType type = FrameType::kPush;
  uint16_t rank = 2;
};

std::vector<uint8_t> Frame(const ChunkLayout& layout, const FrameSpec& f) {
  DataHeader h;
  h.type = f.type;
  h.session = f.session;
  h.sender_rank = f.rank;
  h.round = f.round;
  h.seq = f.seq;
  h.payload_len = static_cast<uint16_t>(
      f.len >= 0
          ? static_cast<uint32_t>(f.len)
          : (f.seq < layout.num_chunks() ? layout.Length(f.seq) : kChunk));
  // Never empty: memcpy from a null pointer is UB even for 0 bytes.
  std::vector<uint8_t> payload(std::max<size_t>(h.payload_len, 1));
  for (size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<uint8_t>(f.seq + i);
  }
  std::vector<uint8_t> out(kDataHeaderBytes + h.payload_len);
  BuildDataFrame(h, payload.data(), out.data());
  return out;
}

Verdict Feed(ReceiverRound& rx, const std::vector<uint8_t>& frame) {
  DataHeader h;
  const uint8_t* payload = nullptr;
  return rx.OnFrame(frame.data(), frame.size(), &h, &payload);
}

Verdict Feed(ReceiverRound& rx, uint32_t round, uint32_t seq) {
  FrameSpec f;
  f.round = round;
  f.seq = seq;
  return Feed(rx, Frame(rx.config().layout, f));
}

uint64_t TotalVerdicts(const ReceiverRound& rx) {
  uint64_t total = 0;
  for (int v = 0; v < kNumVerdicts; ++v) {
    total += rx.verdict_count(static_cast<Verdict>(v));
  }
  return total;
}

TEST(ReceiverRoundTest, IdleBeforeAnyBegin) {
  ReceiverRound rx(Config(10));
  EXPECT_FALSE(rx.open());
  EXPECT_EQ(Feed(rx, 0, 0), Verdict::kIdle);
  EXPECT_EQ(Feed(rx, 5, 3), Verdict::kIdle);
  EXPECT_EQ(rx.received(), 0u);
  EXPECT_FALSE(rx.Has(0));
  EXPECT_EQ(rx.verdict_count(Verdict::kIdle), 2u);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kNone);
}

TEST(ReceiverRoundTest, AcceptsFrameAndExposesPayload) {
  ReceiverRound rx(Config(4));
  rx.Begin(17, 0.0);
  EXPECT_TRUE(rx.open());
  EXPECT_EQ(rx.round(), 17u);
  EXPECT_EQ(rx.threshold(), 4u);
  FrameSpec f;
  f.round = 17;
  f.seq = 3;  // the short last chunk
  const std::vector<uint8_t> frame = Frame(rx.config().layout, f);
  DataHeader h;
  const uint8_t* payload = nullptr;
  ASSERT_EQ(rx.OnFrame(frame.data(), frame.size(), &h, &payload),
            Verdict::kAccepted);
  EXPECT_EQ(h.seq, 3u);
  EXPECT_EQ(h.round, 17u);
  EXPECT_EQ(h.payload_len, kChunk / 2);
  ASSERT_EQ(payload, frame.data() + kDataHeaderBytes);
  EXPECT_EQ(payload[0], 3);
  EXPECT_EQ(payload[19], 3 + 19);
  EXPECT_TRUE(rx.Has(3));
  EXPECT_FALSE(rx.Has(2));
  EXPECT_EQ(rx.received(), 1u);
  EXPECT_DOUBLE_EQ(rx.delivered_fraction(), 0.25);
}

TEST(ReceiverRoundTest, DuplicatesCountedNotReaccepted) {
  ReceiverRound rx(Config(8));
  rx.Begin(1, 0.0);
  EXPECT_EQ(Feed(rx, 1, 5), Verdict::kAccepted);
  EXPECT_EQ(Feed(rx, 1, 5), Verdict::kDuplicate);
  EXPECT_EQ(Feed(rx, 1, 5), Verdict::kDuplicate);
  EXPECT_EQ(rx.received(), 1u);
  EXPECT_EQ(rx.verdict_count(Verdict::kAccepted), 1u);
  EXPECT_EQ(rx.verdict_count(Verdict::kDuplicate), 2u);
}

// The central promise: with frames in random order and random drops (the
// sender re-sending what is missing), STOP fires exactly when received()
// reaches StopThreshold(N, p) - not before, exactly once - so the delivered
// fraction at STOP is >= 1 - p.
TEST(ReceiverRoundTest, StopFiresExactlyAtThresholdOnceForManyRounds) {
  Rng rng(12345);
  int rounds = 0;
  for (uint32_t n : {1u, 2u, 7u, 64u, 65u, 300u, 1000u}) {
    ReceiverRound rx(Config(n));
    uint32_t round = 0xFFFFFFF0u;  // also walks across the u32 wrap
    for (double p : {0.0, 0.008, 0.024, 0.1, 0.29, 0.408, 0.5, 0.9, 0.99}) {
      for (double loss : {0.0, 0.3, 0.7}) {
        ++round;
        ++rounds;
        rx.Begin(round, p);
        const uint32_t threshold = StopThreshold(n, p);
        ASSERT_EQ(rx.threshold(), threshold);
        ASSERT_EQ(rx.received(), 0u);
        uint32_t stops = 0;
        uint32_t received_at_stop = 0;
        std::vector<uint32_t> order(n);
        std::iota(order.begin(), order.end(), 0u);
        for (int pass = 0; pass < 1000 && stops == 0; ++pass) {
          for (uint32_t i = n - 1; i > 0; --i) {
            std::swap(order[i], order[rng.NextBelow(i + 1)]);
          }
          for (uint32_t seq : order) {
            if (rx.Has(seq) && !rng.Bernoulli(0.05)) continue;  // some dups
            if (rng.Bernoulli(loss)) continue;                  // dropped
            const uint32_t before = rx.received();
            const Verdict v = Feed(rx, round, seq);
            ASSERT_TRUE(v == Verdict::kAccepted || v == Verdict::kDuplicate);
            ASSERT_EQ(rx.received(), before + (v == Verdict::kAccepted));
            const StopTrigger t = rx.PollStop();
            if (rx.received() < threshold) {
              ASSERT_EQ(t, StopTrigger::kNone)
                  << "early STOP n=" << n << " p=" << p;
              ASSERT_FALSE(rx.StopReached());
            } else if (stops == 0) {
              ASSERT_EQ(t, StopTrigger::kThreshold)
                  << "late STOP n=" << n << " p=" << p;
              ++stops;
              received_at_stop = rx.received();
              break;
            }
          }
        }
        ASSERT_EQ(stops, 1u) << "n=" << n << " p=" << p << " loss=" << loss;
        EXPECT_EQ(received_at_stop, threshold);
        EXPECT_GE(static_cast<double>(received_at_stop) / n, 1 - p - 1e-12);
        EXPECT_GE(rx.delivered_fraction(), 1 - p - 1e-12);
        // Never a second STOP this round, whatever else arrives.
        for (uint32_t seq = 0; seq < n; ++seq) {
          Feed(rx, round, seq);
          ASSERT_EQ(rx.PollStop(), StopTrigger::kNone);
        }
        EXPECT_TRUE(rx.StopReached());
        rx.Close();
      }
    }
  }
  EXPECT_EQ(rounds, 7 * 9 * 3);
}

TEST(ReceiverRoundTest, StaleRoundFramesNeverAccepted) {
  ReceiverRound rx(Config(16));
  rx.Begin(41, 0.0);
  for (uint32_t s = 0; s < 8; ++s)
    ASSERT_EQ(Feed(rx, 41, s), Verdict::kAccepted);
  rx.Begin(42, 0.0);
  EXPECT_EQ(rx.received(), 0u);
  for (uint32_t s = 0; s < 16; ++s) {
    EXPECT_EQ(Feed(rx, 41, s), Verdict::kStaleRound) << s;
    EXPECT_EQ(Feed(rx, 40, s), Verdict::kStaleRound) << s;
    EXPECT_EQ(Feed(rx, 0, s), Verdict::kStaleRound) << s;
  }
  EXPECT_EQ(rx.received(), 0u);
  for (uint32_t s = 0; s < 16; ++s) EXPECT_FALSE(rx.Has(s));
  EXPECT_EQ(Feed(rx, 43, 0), Verdict::kFutureRound);
  EXPECT_EQ(Feed(rx, 42, 0), Verdict::kAccepted);
  EXPECT_EQ(rx.verdict_count(Verdict::kStaleRound), 48u);
  EXPECT_EQ(rx.verdict_count(Verdict::kFutureRound), 1u);
  // A stale frame after the current round closed is still stale, not late.
  rx.Close();
  EXPECT_EQ(Feed(rx, 41, 1), Verdict::kStaleRound);
}

TEST(ReceiverRoundTest, StaleAndFutureAcrossU32Wrap) {
  ReceiverRound rx(Config(4));
  rx.Begin(0xFFFFFFFFu, 0.0);
  EXPECT_EQ(Feed(rx, 0, 0), Verdict::kFutureRound);
  EXPECT_EQ(Feed(rx, 0xFFFFFFFEu, 0), Verdict::kStaleRound);
  EXPECT_EQ(Feed(rx, 0xFFFFFFFFu, 0), Verdict::kAccepted);
  rx.Begin(0, 0.0);
  EXPECT_EQ(Feed(rx, 0xFFFFFFFFu, 1), Verdict::kStaleRound);
  EXPECT_EQ(Feed(rx, 0xFFFFFFFEu, 1), Verdict::kStaleRound);
  EXPECT_EQ(Feed(rx, 0x80000001u, 1), Verdict::kStaleRound);
  EXPECT_EQ(Feed(rx, 1, 1), Verdict::kFutureRound);
  EXPECT_EQ(Feed(rx, 0x7FFFFFFFu, 1), Verdict::kFutureRound);
  EXPECT_FALSE(rx.Has(1));
  EXPECT_EQ(rx.received(), 0u);
  EXPECT_EQ(Feed(rx, 0, 1), Verdict::kAccepted);
  EXPECT_EQ(rx.received(), 1u);
}

TEST(ReceiverRoundTest, LateAfterCloseAndReopenOnBegin) {
  ReceiverRound rx(Config(4));
  rx.Begin(7, 0.0);
  EXPECT_EQ(Feed(rx, 7, 0), Verdict::kAccepted);
  rx.Close();
  EXPECT_FALSE(rx.open());
  EXPECT_EQ(Feed(rx, 7, 1), Verdict::kLate);
  EXPECT_EQ(Feed(rx, 7, 0), Verdict::kLate);  // late beats duplicate
  EXPECT_FALSE(rx.Has(1));
  EXPECT_EQ(rx.received(), 1u);
  EXPECT_EQ(rx.verdict_count(Verdict::kLate), 2u);
  // Completing the count after Close must not produce a STOP either.
  for (uint32_t s = 1; s < 4; ++s) Feed(rx, 7, s);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kNone);
  rx.Begin(8, 0.0);
  EXPECT_TRUE(rx.open());
  EXPECT_EQ(Feed(rx, 8, 1), Verdict::kAccepted);
}

TEST(ReceiverRoundTest, CloseBeforeThresholdSuppressesStop) {
  ReceiverRound rx(Config(4));
  rx.Begin(1, 0.5);  // threshold 2
  Feed(rx, 1, 0);
  Feed(rx, 1, 1);
  rx.Close();
  EXPECT_EQ(rx.PollStop(), StopTrigger::kNone);
}

TEST(ReceiverRoundTest, WrongSessionTypeAndSender) {
  ReceiverRound rx(Config(8, /*sender=*/3));
  rx.Begin(5, 0.0);
  const ChunkLayout& layout = rx.config().layout;
  FrameSpec f;
  f.round = 5;
  f.rank = 3;
  f.session = kSession + 1;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kWrongSession);
  f.session = kSession;
  f.type = FrameType::kBroadcast;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kWrongType);
  f.type = FrameType::kPush;
  f.rank = 4;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kWrongSender);
  f.rank = 0;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kWrongSender);
  EXPECT_EQ(rx.received(), 0u);
  f.rank = 3;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kAccepted);
  EXPECT_EQ(rx.verdict_count(Verdict::kWrongSession), 1u);
  EXPECT_EQ(rx.verdict_count(Verdict::kWrongType), 1u);
  EXPECT_EQ(rx.verdict_count(Verdict::kWrongSender), 2u);

  // A broadcast receiver that listens to anyone.
  ReceiverRound bx(Config(8, kAnySender, FrameType::kBroadcast));
  bx.Begin(5, 0.0);
  f.type = FrameType::kPush;
  EXPECT_EQ(Feed(bx, Frame(layout, f)), Verdict::kWrongType);
  f.type = FrameType::kBroadcast;
  for (uint16_t rank : {0, 1, 65535}) {
    f.rank = rank;
    f.seq = rank % 8;
    EXPECT_EQ(Feed(bx, Frame(layout, f)), Verdict::kAccepted) << rank;
  }
}

TEST(ReceiverRoundTest, OutOfRangeSeqAndLengthCountedWithDecodeStatus) {
  ReceiverRound rx(Config(4));  // lengths 40, 40, 40, 20
  rx.Begin(9, 0.0);
  const ChunkLayout& layout = rx.config().layout;
  FrameSpec f;
  f.round = 9;
  f.seq = 4;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kOutOfRange);
  f.seq = 0xFFFFFFFFu;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kOutOfRange);
  f.seq = 3;
  f.len = kChunk;  // short last chunk sent with the full length
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kOutOfRange);
  f.seq = 0;
  f.len = kChunk / 2;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kOutOfRange);
  f.len = 0;
  EXPECT_EQ(Feed(rx, Frame(layout, f)), Verdict::kOutOfRange);
  EXPECT_EQ(rx.verdict_count(Verdict::kOutOfRange), 5u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kSeqOutOfRange), 2u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kLengthMismatch), 3u);
  EXPECT_EQ(rx.received(), 0u);
  EXPECT_FALSE(rx.Has(0));
  EXPECT_FALSE(rx.Has(3));
}

TEST(ReceiverRoundTest, MalformedCountedByDecodeStatus) {
  ReceiverRound rx(Config(4));
  rx.Begin(2, 0.0);
  FrameSpec f;
  f.round = 2;
  const std::vector<uint8_t> good = Frame(rx.config().layout, f);
  DataHeader h;
  const uint8_t* payload = nullptr;
  EXPECT_EQ(rx.OnFrame(nullptr, 0, &h, &payload), Verdict::kMalformed);
  EXPECT_EQ(rx.OnFrame(good.data(), 19, &h, &payload), Verdict::kMalformed);
  EXPECT_EQ(rx.OnFrame(good.data(), good.size() - 1, &h, &payload),
            Verdict::kMalformed);
  auto mutate = [&](size_t index, uint8_t value) {
    std::vector<uint8_t> bad(good.begin(), good.end());
    bad.at(index) = value;
    return Feed(rx, bad);
  };
  EXPECT_EQ(mutate(1, 0x00), Verdict::kMalformed);
  EXPECT_EQ(mutate(2, 2), Verdict::kMalformed);
  EXPECT_EQ(mutate(3, 0), Verdict::kMalformed);
  EXPECT_EQ(mutate(3, 3), Verdict::kMalformed);
  EXPECT_EQ(mutate(3, 255), Verdict::kMalformed);
  EXPECT_EQ(payload, nullptr);
  EXPECT_EQ(rx.verdict_count(Verdict::kMalformed), 8u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kShortBuffer), 2u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kLengthBeyondBuffer), 1u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kBadMagic), 1u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kBadVersion), 1u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kBadType), 3u);
  EXPECT_EQ(rx.decode_error_count(DecodeStatus::kOk), 0u);
  EXPECT_EQ(rx.received(), 0u);
  // Padding after a valid frame is fine.
  std::vector<uint8_t> padded(good.begin(), good.end());
  padded.resize(padded.size() + 6, 0);
  EXPECT_EQ(Feed(rx, padded), Verdict::kAccepted);
  EXPECT_EQ(TotalVerdicts(rx), 9u);  // every frame counted exactly once
}

TEST(ReceiverRoundTest, VerdictNamesDistinct) {
  for (int a = 0; a < kNumVerdicts; ++a) {
    const std::string name = VerdictName(static_cast<Verdict>(a));
    EXPECT_NE(name, "unknown") << a;
    for (int b = a + 1; b < kNumVerdicts; ++b) {
      EXPECT_NE(name, VerdictName(static_cast<Verdict>(b)));
    }
  }
}

// DESIGN.md: a public prototype switched p but its receiver kept the static
// value. Ours must use the current p.
TEST(ReceiverRoundTest, RaisingPMidRoundStopsAsSoonAsNewThresholdMet) {
  ReceiverRound rx(Config(1000));
  rx.Begin(3, 0.0);
  const uint32_t t_new = StopThreshold(1000, 0.4);
  ASSERT_EQ(t_new, 600u);
  for (uint32_t s = 0; s < 700; ++s)
    ASSERT_EQ(Feed(rx, 3, s), Verdict::kAccepted);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kNone);  // p = 0 needs all 1000
  rx.SetTolerance(0.4);
  EXPECT_DOUBLE_EQ(rx.p(), 0.4);
  EXPECT_EQ(rx.threshold(), t_new);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kThreshold);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kNone);
}

TEST(ReceiverRoundTest, RaisingPBeforeThresholdFiresAtNewThreshold) {
  ReceiverRound rx(Config(1000));
  rx.Begin(3, 0.0);
  rx.SetTolerance(0.4);
  for (uint32_t s = 0; s < 1000; ++s) {
    Feed(rx, 3, s);
    const StopTrigger t = rx.PollStop();
    if (s + 1 < 600) {
      ASSERT_EQ(t, StopTrigger::kNone) << s;
    } else {
      ASSERT_EQ(t, StopTrigger::kThreshold) << s;
      break;
    }
  }
  EXPECT_EQ(rx.received(), 600u);
}

TEST(ReceiverRoundTest, LoweringPMidRoundDelaysStop) {
  ReceiverRound rx(Config(1000));
  rx.Begin(4, 0.408);  // threshold 592
  for (uint32_t s = 0; s < 500; ++s) Feed(rx, 4, s);
  rx.SetTolerance(0.008);  // threshold 992
  EXPECT_EQ(rx.threshold(), 992u);
  for (uint32_t s = 500; s < 991; ++s) {
    Feed(rx, 4, s);
    ASSERT_EQ(rx.PollStop(), StopTrigger::kNone)
        << "received " << rx.received();
  }
  EXPECT_EQ(rx.received(), 991u);
  Feed(rx, 4, 991);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kThreshold);
}

TEST(ReceiverRoundTest, SetToleranceValidatesAndBeginResetsIt) {
  ReceiverRound rx(Config(100));
  rx.Begin(1, 0.2);
  EXPECT_THROW(rx.SetTolerance(1.0), std::invalid_argument);
  EXPECT_THROW(rx.SetTolerance(-0.1), std::invalid_argument);
  EXPECT_DOUBLE_EQ(rx.p(), 0.2);
  EXPECT_EQ(rx.threshold(), 80u);
  EXPECT_THROW(rx.Begin(2, 1.0), std::invalid_argument);
  rx.SetTolerance(0.5);
  rx.Begin(2, 0.1);  // the new round's p replaces the old round's
  EXPECT_DOUBLE_EQ(rx.p(), 0.1);
  EXPECT_EQ(rx.threshold(), 90u);
}

TEST(ReceiverRoundTest, BeginResetsBitmapAndStop) {
  ReceiverRound rx(Config(10));
  rx.Begin(1, 0.5);
  for (uint32_t s = 0; s < 5; ++s) Feed(rx, 1, s);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kThreshold);
  rx.Begin(2, 0.5);
  EXPECT_EQ(rx.received(), 0u);
  EXPECT_FALSE(rx.Has(0));
  EXPECT_EQ(rx.PollStop(), StopTrigger::kNone);
  for (uint32_t s = 5; s < 10; ++s) Feed(rx, 2, s);
  EXPECT_EQ(rx.PollStop(), StopTrigger::kThreshold);  // a new STOP per round
  Bitmap snap;
  rx.SnapshotBitmap(snap);
  ASSERT_EQ(snap.size(), 10u);
  for (uint32_t s = 0; s < 10; ++s) EXPECT_EQ(snap.Test(s), s >= 5) << s;
}

TEST(ReceiverRoundTest, DeadlineClosesOnlyWithFloor) {
  ReceiverRound rx(Config(100));
  rx.Begin(1, 0.0, /*deadline_ns=*/1000, /*deadline_min_fraction=*/0.5);
  for (uint32_t s = 0; s < 49; ++s) Feed(rx, 1, s);
  EXPECT_EQ(rx.PollStop(999), StopTrigger::kNone);
  EXPECT_EQ(rx.PollStop(5000), StopTrigger::kNone);  // below the floor of 50
  Feed(rx, 1, 49);
  EXPECT_EQ(rx.PollStop(999), StopTrigger::kNone);  // floor met, too early
  EXPECT_TRUE(rx.StopReached(1000));
  EXPECT_EQ(rx.PollStop(1000), StopTrigger::kDeadline);
  EXPECT_EQ(rx.PollStop(2000), StopTrigger::kNone);
}

TEST(ReceiverRoundTest, SetDeadlineMidRound) {
  ReceiverRound rx(Config(100));
  rx.Begin(1, 0.0);
  for (uint32_t s = 0; s < 80; ++s) Feed(rx, 1, s);
  EXPECT_EQ(rx.PollStop(1'000'000), StopTrigger::kNone);  // no deadline yet
  rx.SetDeadline(500, 0.9);
  EXPECT_EQ(rx.PollStop(600), StopTrigger::kNone);  // 80 < 90
  rx.SetDeadline(500, 0.8);
  EXPECT_EQ(rx.PollStop(499), StopTrigger::kNone);
  EXPECT_EQ(rx.PollStop(500), StopTrigger::kDeadline);
}

TEST(ReceiverRoundTest, ConcurrentPollersSendExactlyOneStop) {
  constexpr uint32_t kN = 5000;
  ReceiverRound rx(Config(kN));
  const double p = 0.3;
  const uint32_t threshold = StopThreshold(kN, p);
  std::vector<std::vector<uint8_t>> frames(kN);
  std::vector<uint32_t> order(kN);
  std::iota(order.begin(), order.end(), 0u);
  Rng rng(77);
  for (uint32_t i = kN - 1; i > 0; --i) {
    std::swap(order[i], order[rng.NextBelow(i + 1)]);
  }
  for (int trial = 0; trial < 20; ++trial) {
    const auto round = static_cast<uint32_t>(trial);
    for (uint32_t s = 0; s < kN; ++s) {
      FrameSpec f;
      f.round = round;
      f.seq = s;
      frames[s] = Frame(rx.config().layout, f);
    }
    rx.Begin(round, p);
    std::atomic<bool> owner_done{false};
    std::atomic<int> stops{0};
    std::atomic<uint32_t> received_at_stop{kN + 1};
    auto poller = [&] {
      while (true) {
        const bool done = owner_done.load(std::memory_order_acquire);
        if (rx.PollStop() != StopTrigger::kNone) {
          stops.fetch_add(1);
          received_at_stop.store(rx.received());
        }
        if (done) break;
        std::this_thread::yield();
      }
    };
    std::thread a(poller);
    std::thread b(poller);
    for (uint32_t s : order) {
      DataHeader h;
      const uint8_t* payload = nullptr;
      ASSERT_EQ(rx.OnFrame(frames[s].data(), frames[s].size(), &h, &payload),
                Verdict::kAccepted);
    }
    owner_done.store(true, std::memory_order_release);
    a.join();
    b.join();
    EXPECT_EQ(stops.load(), 1) << "trial " << trial;
    EXPECT_GE(received_at_stop.load(), threshold);
    EXPECT_EQ(rx.PollStop(), StopTrigger::kNone);
  }
}

}  // namespace
}  // namespace dblp

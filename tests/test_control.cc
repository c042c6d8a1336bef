#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dblp/control/control.h"

// Largest single allocation while tracking is on: proves that a lying count
// is rejected before anything is reserved for it.
namespace {
std::atomic<bool> g_track_alloc{false};
std::atomic<size_t> g_max_alloc{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_track_alloc.load(std::memory_order_relaxed)) {
    size_t cur = g_max_alloc.load(std::memory_order_relaxed);
    while (n > cur && !g_max_alloc.compare_exchange_weak(cur, n)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// GCC cannot see that operator new above is malloc-backed and flags the
// free() as mismatched; the pairing is correct by construction.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace dblp {
namespace {

using Status = ControlDecoder::Status;

// Builds frames by hand, independent of the encoder under test.
class Bytes {
 public:
  Bytes& U8(uint8_t v) {
    b_.push_back(v);
    return *this;
  }
  Bytes& U16(uint16_t v) {
    return U8(static_cast<uint8_t>(v >> 8)).U8(static_cast<uint8_t>(v));
  }
  Bytes& U32(uint32_t v) {
    return U16(static_cast<uint16_t>(v >> 16)).U16(static_cast<uint16_t>(v));
  }
  Bytes& U64(uint64_t v) {
    return U32(static_cast<uint32_t>(v >> 32)).U32(static_cast<uint32_t>(v));
  }
  Bytes& F64(double d) {
    uint64_t v;
    std::memcpy(&v, &d, sizeof v);
    return U64(v);
  }
  Bytes& Str(const std::string& s) {
    U16(static_cast<uint16_t>(s.size()));
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  const std::vector<uint8_t>& get() const { return b_; }

 private:
  std::vector<uint8_t> b_;
};

// length + type + body.
std::vector<uint8_t> Frame(uint8_t type, const Bytes& body) {
  Bytes f;
  f.U32(static_cast<uint32_t>(body.get().size() + 1)).U8(type);
  std::vector<uint8_t> out = f.get();
  out.insert(out.end(), body.get().begin(), body.get().end());
  return out;
}

ShardHelloMsg Hello() {
  ShardHelloMsg h;
  h.shard_index = 1;
  h.shard_count = 3;
  h.control_ipv4 = 0x7F000001;
  h.control_port = 9101;
  h.data_ipv4 = 0x0A000011;
  h.data_mac = {0x02, 0, 0, 0, 1, 1};
  h.udp_base_port = 47100;
  h.queues = 2;
  h.mtu = 1500;
  h.job_flags = "--policy=dblp\n--workers=3\n";
  return h;
}

// v6: the directory's WELCOME (shard 0 of 3) with its shard map.
WelcomeMsg ShardedWelcome() {
  WelcomeMsg w;
  w.session = 7;
  w.num_workers = 2;
  w.mtu = 1500;
  w.chunk_payload = 1440;
  w.num_chunks = 128;
  w.total_bytes = 128 * 1440;
  w.model_bytes = 300 * 1440 - 5;
  w.policy = "dblp";
  w.shard_count = 3;
  for (uint16_t k = 0; k < 3; ++k) {
    ShardEntry e;
    e.control_ipv4 = 0x7F000001;
    e.control_port = static_cast<uint16_t>(9100 + k);
    e.data_ipv4 = 0x0A000001 + k;
    e.data_mac = {0x02, 0, 0, 0, 0, static_cast<uint8_t>(k)};
    e.udp_base_port = static_cast<uint16_t>(40000 + 100 * k);
    e.queues = static_cast<uint16_t>(1 + k);
    e.first_chunk = 128u * k;
    e.num_chunks = k < 2 ? 128 : 44;
    w.shards.push_back(e);
  }
  return w;
}

std::vector<ControlMessage> Samples() {
  std::vector<ControlMessage> v;
  JoinMsg join;
  join.session = 0xDEADBEEF;
  join.worker_name = "worker-3@host";
  join.total_bytes = 0x0123456789ABCDEFull;
  join.mtu = 9000;
  join.layers = {{"conv1.weight", {64, 3, 7, 7}},
                 {"fc.bias", {1000}},
                 {"scalar", {}},
                 {"", {0, std::numeric_limits<int64_t>::max()}}};
  for (size_t i = 0; i < join.nonce.size(); ++i) join.nonce[i] = 0xA0 + i;
  join.data_mac = {0x02, 0, 0, 0, 0, 0x07};
  join.data_ipv4 = 0x0A000009;
  join.data_udp_port = 51000;
  v.push_back(join);
  // v6: a JOIN to server shard 2 of 3 with the directory's claim.
  JoinMsg claim = join;
  claim.shard_index = 2;
  claim.shard_count = 3;
  claim.first_chunk = 128;
  claim.shard_chunks = 64;
  claim.rank_plus_one = 4;
  claim.directory_nonce.fill(0x3C);
  v.push_back(claim);

  WelcomeMsg w;
  w.session = 0xDEADBEEF;
  w.rank = 3;
  w.num_workers = 8;
  w.mtu = 1500;
  w.chunk_payload = 1440;
  w.num_chunks = 17474;
  w.total_bytes = 25'161'728;
  w.udp_base_port = 40000;
  w.lanes = 4;
  w.resync_every = 10;
  w.push_feedback = true;
  w.consistent_broadcast = true;
  w.server_ipv4 = 0x0A000001;
  w.server_mac = {0x02, 0x00, 0x5e, 0x10, 0xfe, 0xff};
  w.policy = "dblp";
  w.layers = join.layers;
  w.worker_ipv4 = 0x0A000005;
  w.frame_auth = 2;
  w.job_nonce.fill(0x5A);
  for (size_t i = 0; i < w.mac.size(); ++i) w.mac[i] = static_cast<uint8_t>(i);
  v.push_back(w);
  v.push_back(ShardedWelcome());
  ChallengeMsg ch;
  ch.nonce.fill(0x11);
  ch.proof.fill(0xEE);
  v.push_back(ch);
  ProofMsg pr;
  pr.proof.fill(0x42);
  v.push_back(pr);
  TagMsg tg;
  tg.seq = 0x0102030405060708ull;
  tg.mac.fill(0x99);
  v.push_back(tg);

  v.push_back(RoundBeginMsg{.round = 0xFFFFFFFF,
                            .iteration = 12345,
                            .direction = Direction::kBroadcast,
                            .p = 0.408,
                            .deadline_ns = 1'700'000'000'123'456'789ull,
                            .min_fraction = std::nextafter(1.0, 0.0),
                            .critical = true});
  v.push_back(ProbeMsg{.round = 7, .direction = Direction::kPush, .pass = 14});
  v.push_back(BitmapMsg{.round = 9,
                        .direction = Direction::kBroadcast,
                        .num_bits = 130,
                        .words = {~0ull, 0x8000000000000001ull, 0x3}});
  v.push_back(BitmapMsg{
      .round = 10, .direction = Direction::kPush, .num_bits = 0, .words = {}});
  v.push_back(StopMsg{.round = 11,
                      .direction = Direction::kPush,
                      .received = 17400,
                      .reason = StopReason::kComplete});
  v.push_back(ByeMsg{.reason = "training done"});
  v.push_back(ErrorMsg{.code = 503, .text = "session mismatch"});
  v.push_back(AcceptedMsg{.round = 12, .num_bits = 70, .words = {~0ull, 0x2}});
  v.push_back(Hello());
  v.push_back(ShardAssignMsg{.shard_index = 2,
                             .shard_count = 3,
                             .first_chunk = 256,
                             .num_chunks = 44,
                             .chunk_payload = 1440,
                             .model_bytes = 300 * 1440 - 5,
                             .directory_nonce = AuthBytes{1, 2, 3}});
  v.push_back(PhasePartialMsg{
      .iteration = 1ull << 40,
      .resync = true,
      .push_ns = 123456789,
      .squares = {0.0, 1e-300, 2.5, -0.0,
                  std::numeric_limits<double>::infinity(), 3e38}});
  v.push_back(PhaseDecisionMsg{.iteration = 77,
                               .norm = 1.0 / 3.0,
                               .p = 0.408,
                               .deadline_ns = 5,
                               .min_fraction = 1.0,
                               .critical = true});
  return v;
}

std::vector<uint8_t> EncodeAll(const std::vector<ControlMessage>& msgs) {
  std::vector<uint8_t> out;
  for (const auto& m : msgs) EncodeControl(m, out);
  return out;
}

// Pops everything available; returns the final non-message status.
Status Drain(ControlDecoder& d, std::vector<ControlMessage>& got) {
  for (;;) {
    ControlMessage m;
    const Status s = d.Next(m);
    if (s != Status::kMessage) return s;
    got.push_back(std::move(m));
  }
}

// Feeds a single frame and expects the decoder to reject it with `want`.
void ExpectRejected(const std::vector<uint8_t>& frame, ControlError want,
                    const std::string& text_has) {
  SCOPED_TRACE(std::string("want ") + ControlErrorName(want));
  ControlDecoder d;
  d.Feed(frame.data(), frame.size());
  ControlMessage m;
  ASSERT_EQ(d.Next(m), Status::kError);
  EXPECT_EQ(d.error(), want) << d.error_text();
  EXPECT_NE(d.error_text().find(text_has), std::string::npos)
      << "error text '" << d.error_text() << "' lacks '" << text_has << "'";
}

TEST(ControlCodec, RoundTripEveryType) {
  std::set<ControlType> seen;
  for (const ControlMessage& msg : Samples()) {
    SCOPED_TRACE(ControlTypeName(msg));
    EXPECT_EQ(ValidateControl(msg), ControlError::kNone);
    const std::vector<uint8_t> frame = EncodeControl(msg);
    ASSERT_GE(frame.size(), 5u);
    EXPECT_EQ(frame[4], static_cast<uint8_t>(TypeOf(msg)));
    ControlDecoder d;
    d.Feed(frame.data(), frame.size());
    ControlMessage got;
    ASSERT_EQ(d.Next(got), Status::kMessage) << d.error_text();
    EXPECT_EQ(got, msg);
    EXPECT_EQ(EncodeControl(got), frame);  // canonical encoding
    EXPECT_EQ(d.buffered(), 0u);
    EXPECT_EQ(d.Next(got), Status::kNeedMore);
    seen.insert(TypeOf(msg));
  }
  EXPECT_EQ(seen.size(), std::variant_size_v<ControlMessage>)
      << "a message type has no round-trip sample";
}

TEST(ControlCodec, RoundTripAtLimitsAndExactDoubles) {
  JoinMsg j;
  j.worker_name = std::string(kMaxControlString, 'w');
  j.layers.push_back({std::string(kMaxLayerName, 'n'),
                      std::vector<int64_t>(kMaxShapeDims, 0x7FFF00000000FF01)});
  j.total_bytes = std::numeric_limits<uint64_t>::max();
  // Distinct bit patterns that compare equal or are easy to round.
  const double tiny = std::numeric_limits<double>::denorm_min();
  const RoundBeginMsg rb{.p = -0.0, .min_fraction = tiny};
  const RoundBeginMsg rb2{.p = 1.0 / 3.0, .min_fraction = 0.0};
  for (const ControlMessage& msg :
       std::vector<ControlMessage>{j, rb, rb2, ByeMsg{}, ErrorMsg{}}) {
    const auto frame = EncodeControl(msg);
    ControlDecoder d;
    d.Feed(frame.data(), frame.size());
    ControlMessage got;
    ASSERT_EQ(d.Next(got), Status::kMessage) << d.error_text();
    EXPECT_EQ(got, msg);
    EXPECT_EQ(EncodeControl(got), frame);
  }
  ControlDecoder d;
  const auto frame = EncodeControl(rb);
  d.Feed(frame.data(), frame.size());
  ControlMessage got;
  ASSERT_EQ(d.Next(got), Status::kMessage);
  const auto& r = std::get<RoundBeginMsg>(got);
  EXPECT_TRUE(std::signbit(r.p));  // -0.0 kept, not normalised to +0.0
  EXPECT_EQ(r.min_fraction, tiny);
}

TEST(ControlCodec, GoldenProbeIsBigEndian) {
  const ProbeMsg p{.round = 0x01020304,
                   .direction = Direction::kBroadcast,
                   .pass = 0x0A0B0C0D};
  const std::vector<uint8_t> want = {
      0x00, 0x00, 0x00, 0x0C,  // L = type + 11 body bytes
      0x04,                    // PROBE
      0x01, 0x02, 0x03, 0x04,  // round
      0x01,                    // direction = broadcast
      0x0A, 0x0B, 0x0C, 0x0D,  // pass
      0x00, 0x00,              // shard (the sender's chunk range)
  };
  EXPECT_EQ(EncodeControl(p), want);
}

TEST(ControlCodec, GoldenStringAndDoubleLayout) {
  const std::vector<uint8_t> err_want = {0x00, 0x00, 0x00, 0x06,
                                         0x08, 0x01, 0xF7,  // code 503
                                         0x00, 0x01, 'x'};
  EXPECT_EQ(EncodeControl(ErrorMsg{.code = 503, .text = "x"}), err_want);

  const auto rb = EncodeControl(RoundBeginMsg{.round = 1,
                                              .iteration = 2,
                                              .direction = Direction::kPush,
                                              .p = 0.5,
                                              .deadline_ns = 3,
                                              .min_fraction = 0.25,
                                              .critical = true});
  const std::vector<uint8_t> rb_want = {
      0,    0,    0, 35, 3,              // L, ROUND_BEGIN
      0,    0,    0, 1,  0, 0, 0, 2, 0,  // round, iter, dir
      0x3F, 0xE0, 0, 0,  0, 0, 0, 0,     // p = 0.5
      0,    0,    0, 0,  0, 0, 0, 3,     // deadline
      0x3F, 0xD0, 0, 0,  0, 0, 0, 0,     // 0.25
      1};                                // critical (v5)
  EXPECT_EQ(rb, rb_want);
}

TEST(ControlDecoder, ByteAtATime) {
  const auto msgs = Samples();
  const auto stream = EncodeAll(msgs);
  ControlDecoder d;
  std::vector<ControlMessage> got;
  for (uint8_t b : stream) {
    d.Feed(&b, 1);
    ASSERT_EQ(Drain(d, got), Status::kNeedMore) << d.error_text();
  }
  EXPECT_EQ(got, msgs);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(ControlDecoder, RandomSplitPoints) {
  const auto msgs = Samples();
  const auto stream = EncodeAll(msgs);
  std::mt19937 rng(0xC0117801);
  for (int trial = 0; trial < 300; ++trial) {
    ControlDecoder d;
    std::vector<ControlMessage> got;
    size_t pos = 0;
    while (pos < stream.size()) {
      const size_t n = std::min<size_t>(stream.size() - pos, 1 + rng() % 97);
      d.Feed(stream.data() + pos, n);
      pos += n;
      // Sometimes let bytes pile up before draining.
      if (rng() % 3 != 0) {
        ASSERT_EQ(Drain(d, got), Status::kNeedMore) << d.error_text();
      }
    }
    ASSERT_EQ(Drain(d, got), Status::kNeedMore);
    ASSERT_EQ(got, msgs) << "trial " << trial;
    EXPECT_EQ(d.buffered(), 0u);
  }
}

TEST(ControlDecoder, SeveralMessagesInOneFeedKeepOrder) {
  auto msgs = Samples();
  const auto more = Samples();
  msgs.insert(msgs.end(), more.begin(), more.end());
  auto stream = EncodeAll(msgs);
  // Plus half of one more frame, which must stay buffered.
  const auto tail = EncodeControl(ProbeMsg{.round = 99});
  stream.insert(stream.end(), tail.begin(), tail.begin() + 7);
  ControlDecoder d;
  d.Feed(stream.data(), stream.size());
  std::vector<ControlMessage> got;
  EXPECT_EQ(Drain(d, got), Status::kNeedMore);
  EXPECT_EQ(got, msgs);
  EXPECT_EQ(d.buffered(), 7u);
  d.Feed(tail.data() + 7, tail.size() - 7);
  ControlMessage m;
  ASSERT_EQ(d.Next(m), Status::kMessage);
  EXPECT_EQ(std::get<ProbeMsg>(m).round, 99u);
}

TEST(ControlDecoder, TruncatedFrameAtEveryCutNeedsMore) {
  for (const ControlMessage& msg : Samples()) {
    SCOPED_TRACE(ControlTypeName(msg));
    const auto frame = EncodeControl(msg);
    for (size_t cut = 0; cut < frame.size(); ++cut) {
      ControlDecoder d;
      d.Feed(frame.data(), cut);
      ControlMessage m;
      ASSERT_EQ(d.Next(m), Status::kNeedMore)
          << "cut " << cut << ": " << d.error_text();
      EXPECT_EQ(d.error(), ControlError::kNone);
      EXPECT_EQ(d.buffered(), cut);
      d.Feed(frame.data() + cut, frame.size() - cut);
      ASSERT_EQ(d.Next(m), Status::kMessage) << "cut " << cut;
      EXPECT_EQ(m, msg);
    }
  }
}

TEST(ControlDecoder, OversizeLengthRejectedAfterFourBytes) {
  {
    ControlDecoder d(/*max_frame=*/64);
    const uint8_t hdr[4] = {0x00, 0x00, 0x00, 0x41};  // 65
    ControlMessage m;
    d.Feed(hdr, 3);
    EXPECT_EQ(d.Next(m), Status::kNeedMore);
    d.Feed(hdr + 3, 1);
    EXPECT_EQ(d.Next(m), Status::kError);
    EXPECT_EQ(d.error(), ControlError::kFrameTooLarge);
  }
  {
    ControlDecoder d(64);  // exactly max_frame is fine
    auto frame = Frame(7, Bytes().Str(std::string(61, 'b')));
    ASSERT_EQ(frame.size(), 4u + 64u);
    d.Feed(frame.data(), frame.size());
    ControlMessage m;
    EXPECT_EQ(d.Next(m), Status::kMessage) << d.error_text();
  }
  {
    ControlDecoder d;  // default limit, a 4 GiB claim
    const uint8_t hdr[4] = {0xFF, 0xFF, 0xFF, 0xFF};
    d.Feed(hdr, 4);
    ControlMessage m;
    EXPECT_EQ(d.Next(m), Status::kError);
    EXPECT_EQ(d.error(), ControlError::kFrameTooLarge);
    EXPECT_NE(d.error_text().find("4294967295"), std::string::npos);
  }
}

TEST(ControlDecoder, HeaderErrorsDoNotWaitForBody) {
  ControlDecoder empty;
  const uint8_t zero[4] = {0, 0, 0, 0};
  empty.Feed(zero, 4);
  ControlMessage m;
  EXPECT_EQ(empty.Next(m), Status::kError);
  EXPECT_EQ(empty.error(), ControlError::kEmptyFrame);

  // Claims 1000 bytes of an unknown type; rejected once the type byte is in.
  ControlDecoder unk;
  const uint8_t hdr[5] = {0, 0, 0x03, 0xE8, 0x2A};
  unk.Feed(hdr, 5);
  EXPECT_EQ(unk.Next(m), Status::kError);
  EXPECT_EQ(unk.error(), ControlError::kUnknownType);
  EXPECT_NE(unk.error_text().find("42"), std::string::npos);
}

TEST(ControlDecoder, EveryErrorReachedByCraftedFrame) {
  auto probe = [](uint8_t dir) { return Bytes().U32(1).U8(dir).U32(2).U16(0); };
  auto layer_frame = [](uint32_t dims_count, int64_t dim) {
    Bytes b;
    b.U16(1).U32(2).Str("w").U64(100).U32(1500).U32(1).Str("l").U32(dims_count);
    for (uint32_t i = 0; i < dims_count && i < 9; ++i) {
      b.U64(static_cast<uint64_t>(dim));
    }
    // v4's tail: nonce, data MAC, IPv4, UDP port.
    for (int i = 0; i < 32 + 6 + 4 + 2; ++i) b.U8(0);
    // v6's tail: shard 0 of 1, no claim, no directory nonce.
    b.U16(0).U16(1).U32(0).U32(0).U16(0);
    for (int i = 0; i < 32; ++i) b.U8(0);
    return Frame(1, b);
  };
  auto round_begin = [](double p, double minf) {
    return Frame(3,
                 Bytes().U32(1).U32(2).U8(0).F64(p).U64(3).F64(minf).U8(0));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  // kFrameTooLarge, kEmptyFrame, kUnknownType.
  ExpectRejected({0x00, 0x10, 0x00, 0x01}, ControlError::kFrameTooLarge,
                 "max_frame");
  ExpectRejected({0, 0, 0, 0}, ControlError::kEmptyFrame, "length 0");
  ExpectRejected(Frame(0, Bytes()), ControlError::kUnknownType, "type 0");
  ExpectRejected(Frame(17, Bytes()), ControlError::kUnknownType, "type 17");

  // kTruncatedBody: missing fixed field, string past the end, vector count
  // past the end.
  ExpectRejected(Frame(4, Bytes().U32(1).U8(0).U16(2)),
                 ControlError::kTruncatedBody, "PROBE.pass");
  ExpectRejected(Frame(7, Bytes().U16(10).U8('a')),
                 ControlError::kTruncatedBody, "BYE.reason");
  ExpectRejected(Frame(5, Bytes().U32(1).U8(0).U32(128).U32(2).U64(0)),
                 ControlError::kTruncatedBody, "BITMAP.words");
  ExpectRejected(Frame(8, Bytes()), ControlError::kTruncatedBody, "ERROR.code");

  // kTrailingBytes.
  ExpectRejected(Frame(4, probe(0).U8(0)), ControlError::kTrailingBytes,
                 "PROBE");
  ExpectRejected(Frame(6, Bytes().U32(1).U8(0).U32(5).U8(0).U32(0)),
                 ControlError::kTrailingBytes, "4 bytes");

  // kStringTooLong: general strings and layer names.
  ExpectRejected(Frame(7, Bytes().Str(std::string(kMaxControlString + 1, 'x'))),
                 ControlError::kStringTooLong, "BYE.reason");
  {
    Bytes b;
    b.U16(1).U32(2).Str("w").U64(100).U32(1500).U32(1).Str(
        std::string(kMaxLayerName + 1, 'n'));
    ExpectRejected(Frame(1, b), ControlError::kStringTooLong, "layers[0].name");
  }

  // kTooManyItems: layers and dims.
  ExpectRejected(Frame(1, Bytes().U16(1).U32(2).Str("w").U64(1).U32(1).U32(
                              static_cast<uint32_t>(kMaxLayers + 1))),
                 ControlError::kTooManyItems, "JOIN.layers");
  ExpectRejected(layer_frame(kMaxShapeDims + 1, 1), ControlError::kTooManyItems,
                 "layers[0].shape");

  // kBadBitmap: count mismatch (both ways) and a bit beyond num_bits.
  ExpectRejected(Frame(5, Bytes().U32(1).U8(0).U32(65).U32(1).U64(1)),
                 ControlError::kBadBitmap, "needs 2");
  ExpectRejected(Frame(5, Bytes().U32(1).U8(0).U32(64).U32(2).U64(1).U64(0)),
                 ControlError::kBadBitmap, "needs 1");
  ExpectRejected(
      Frame(
          5,
          Bytes().U32(1).U8(0).U32(70).U32(2).U64(~0ull).U64(1ull << 6).U16(0)),
      ControlError::kBadBitmap, "beyond");

  // kBadValue: enums, fractions, negative dims.
  ExpectRejected(Frame(4, probe(2)), ControlError::kBadValue,
                 "PROBE.direction");
  ExpectRejected(Frame(6, Bytes().U32(1).U8(1).U32(5).U8(3)),
                 ControlError::kBadValue, "STOP.reason");
  ExpectRejected(round_begin(1.0, 0.0), ControlError::kBadValue, "p");
  ExpectRejected(round_begin(nan, 0.0), ControlError::kBadValue, "p");
  ExpectRejected(round_begin(-0.01, 0.0), ControlError::kBadValue, "p");
  ExpectRejected(round_begin(0.1, inf), ControlError::kBadValue,
                 "min_fraction");
  ExpectRejected(round_begin(0.1, -inf), ControlError::kBadValue,
                 "min_fraction");
  ExpectRejected(round_begin(0.1, 1.0000001), ControlError::kBadValue,
                 "min_fraction");
  // v5's phase flag is a strict boolean.
  ExpectRejected(
      Frame(3, Bytes().U32(1).U32(2).U8(0).F64(0.1).U64(3).F64(0.5).U8(2)),
      ControlError::kBadValue, "critical");
  ExpectRejected(layer_frame(2, -1), ControlError::kBadValue,
                 "layers[0].shape[0]");

  // Sanity: the crafted layer frame is accepted when its values are fine,
  // so the rejections above are about the one bad field.
  ControlDecoder ok;
  const auto good = layer_frame(2, 5);
  ok.Feed(good.data(), good.size());
  ControlMessage m;
  EXPECT_EQ(ok.Next(m), Status::kMessage) << ok.error_text();
  EXPECT_EQ(std::get<JoinMsg>(m).layers.at(0).shape,
            (std::vector<int64_t>{5, 5}));
}

TEST(ControlDecoder, PoisonedAfterError) {
  const auto good = EncodeControl(ProbeMsg{.round = 1});
  std::vector<uint8_t> stream = good;
  const auto bad = Frame(4, Bytes().U32(1).U8(9).U32(2).U16(0));  // direction
  stream.insert(stream.end(), bad.begin(), bad.end());
  stream.insert(stream.end(), good.begin(), good.end());

  ControlDecoder d;
  d.Feed(stream.data(), stream.size());
  ControlMessage m;
  ASSERT_EQ(d.Next(m), Status::kMessage);  // the frame before the bad one
  ASSERT_EQ(d.Next(m), Status::kError);
  const ControlError err = d.error();
  const std::string text = d.error_text();
  EXPECT_EQ(err, ControlError::kBadValue);
  m = ByeMsg{.reason = "untouched"};
  for (int i = 0; i < 3; ++i) {
    d.Feed(good.data(), good.size());
    EXPECT_EQ(d.Next(m), Status::kError);
  }
  EXPECT_EQ(d.error(), err);
  EXPECT_EQ(d.error_text(), text);
  EXPECT_EQ(std::get<ByeMsg>(m).reason, "untouched");  // out not written
}

TEST(ControlDecoder, RandomGarbageNeverCrashesOrHangs) {
  std::mt19937_64 rng(20240611);
  const auto samples = Samples();
  size_t errors = 0, messages = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> buf;
    switch (iter % 3) {
      case 0: {  // pure noise
        buf.resize(rng() % 64);
        for (auto& b : buf) b = static_cast<uint8_t>(rng());
        break;
      }
      case 1: {  // plausible header, random type and body
        const size_t body = rng() % 48;
        Bytes b;
        for (size_t i = 0; i < body; ++i) b.U8(static_cast<uint8_t>(rng()));
        buf = Frame(static_cast<uint8_t>(rng() % 10), b);
        break;
      }
      default: {  // a valid frame with a few bytes flipped
        buf = EncodeControl(samples[rng() % samples.size()]);
        const int flips = 1 + static_cast<int>(rng() % 3);
        for (int f = 0; f < flips; ++f) {
          buf[rng() % buf.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
        }
        break;
      }
    }
    ControlDecoder d(4096);
    size_t pos = 0;
    Status s = Status::kNeedMore;
    // Bounded loop: every Next either consumes >= 5 bytes or ends the inner
    // loop, so this terminates even if the decoder misbehaves.
    for (int steps = 0; pos < buf.size() && steps < 1000; ++steps) {
      const size_t n = std::min<size_t>(buf.size() - pos, 1 + rng() % 16);
      const size_t before = d.buffered();
      d.Feed(buf.data() + pos, n);
      pos += n;
      if (s != Status::kError) {
        EXPECT_EQ(d.buffered(), before + n);
      }
      for (;;) {
        ControlMessage m;
        const size_t had = d.buffered();
        s = d.Next(m);
        if (s != Status::kMessage) break;
        ++messages;
        // Whatever is accepted must be valid and canonical.
        EXPECT_EQ(ValidateControl(m), ControlError::kNone);
        const auto again = EncodeControl(m);
        ASSERT_EQ(had - d.buffered(), again.size());
      }
      if (s == Status::kError) {
        EXPECT_NE(d.error(), ControlError::kNone);
        EXPECT_FALSE(d.error_text().empty());
      } else {
        EXPECT_EQ(d.error(), ControlError::kNone);
      }
    }
    if (s == Status::kError) ++errors;
  }
  // The mix must exercise both outcomes, or the test proves little.
  EXPECT_GT(errors, 5000u);
  EXPECT_GT(messages, 100u);
}

TEST(ControlDecoder, HugeDeclaredCountsAllocateNothingBig) {
  struct Case {
    std::vector<uint8_t> frame;
    ControlError want;
  };
  const std::vector<Case> cases = {
      // num_bits near 2^32 with a matching 2^26-word count and no words.
      {Frame(5, Bytes().U32(1).U8(0).U32(0xFFFFFFFF).U32(0x04000000)),
       ControlError::kTruncatedBody},
      // Maximal count of layers, none present.
      {Frame(1, Bytes().U16(1).U32(2).Str("w").U64(1).U32(1).U32(
                    static_cast<uint32_t>(kMaxLayers))),
       ControlError::kTruncatedBody},
      // v6: a PHASE_PARTIAL claiming the most blocks, none present, and
      // one claiming more.
      {Frame(15, Bytes().U64(1).U8(0).U64(2).U32(
                     static_cast<uint32_t>(kMaxPhaseBlocks))),
       ControlError::kTruncatedBody},
      {Frame(15, Bytes().U64(1).U8(0).U64(2).U32(
                     static_cast<uint32_t>(kMaxPhaseBlocks + 1))),
       ControlError::kTooManyItems},
      {Frame(2, Bytes()
                    .U32(1)
                    .U16(0)
                    .U16(1)
                    .U32(1500)
                    .U32(1440)
                    .U32(1)
                    .U64(4)
                    .U16(4000)
                    .U16(1)
                    .U32(0)  // resync_every
                    .U8(0)   // push_feedback
                    .U8(0)   // consistent_broadcast
                    .U32(0)
                    .U16(0)
                    .U32(0)
                    .Str("fixed")
                    .U32(0xFFFFFFFF)),
       ControlError::kTooManyItems},
  };
  for (const Case& c : cases) {
    ControlDecoder d;
    d.Feed(c.frame.data(), c.frame.size());
    ControlMessage m;
    g_max_alloc = 0;
    g_track_alloc = true;
    const Status s = d.Next(m);
    g_track_alloc = false;
    EXPECT_EQ(s, Status::kError);
    EXPECT_EQ(d.error(), c.want) << d.error_text();
    EXPECT_LT(g_max_alloc.load(), 4096u) << ControlErrorName(c.want);
  }
}

JoinMsg JoinWith(std::vector<LayerInfo> layers) {
  JoinMsg j;
  j.layers = std::move(layers);
  return j;
}

TEST(ControlCodec, EncoderRejectsWhatDecoderWould) {
  WelcomeMsg nine_dims;
  nine_dims.layers = {{"l", std::vector<int64_t>(9, 1)}};
  std::vector<std::pair<ControlMessage, ControlError>> bad = {
      {ByeMsg{.reason = std::string(70000, 'x')}, ControlError::kStringTooLong},
      {JoinWith({{std::string(kMaxLayerName + 1, 'n'), {}}}),
       ControlError::kStringTooLong},
      {nine_dims, ControlError::kTooManyItems},
      {JoinWith({{"l", {3, -2}}}), ControlError::kBadValue},
      {BitmapMsg{.num_bits = 100, .words = {0}}, ControlError::kBadBitmap},
      {BitmapMsg{.num_bits = 4, .words = {0x10}}, ControlError::kBadBitmap},
      // 32-bit (bits + 63) / 64 would wrap to 0 words here.
      {BitmapMsg{.num_bits = 0xFFFFFFFF, .words = {}},
       ControlError::kBadBitmap},
      {ProbeMsg{.direction = static_cast<Direction>(2)},
       ControlError::kBadValue},
      {StopMsg{.reason = static_cast<StopReason>(7)}, ControlError::kBadValue},
      {RoundBeginMsg{.p = std::numeric_limits<double>::quiet_NaN()},
       ControlError::kBadValue},
      {RoundBeginMsg{.min_fraction = 1.5}, ControlError::kBadValue},
  };
  for (const auto& [msg, want] : bad) {
    SCOPED_TRACE(ControlTypeName(msg));
    std::string why;
    EXPECT_EQ(ValidateControl(msg, &why), want);
    EXPECT_FALSE(why.empty());
    std::vector<uint8_t> out = {1, 2, 3};
    EXPECT_THROW(EncodeControl(msg, out), std::invalid_argument);
    EXPECT_EQ(out, (std::vector<uint8_t>{1, 2, 3}));  // out left unchanged
  }
}

TEST(ControlDecoder, LongStreamIsLinear) {
  // A 14 MB backlog of 1M frames, drained while a second stream trickles in
  // one byte per popped message (a reader returning tiny pieces). Shifting
  // the buffer per message or per Feed would move terabytes; the linear
  // decoder needs well under a second. The budget is 50x that, checked
  // inside the loop so a quadratic decoder fails fast instead of hanging.
  constexpr uint32_t kN = 1000000;
  std::vector<uint8_t> stream;
  for (uint32_t i = 0; i < kN; ++i) {
    EncodeControl(ProbeMsg{.round = i, .pass = i ^ 0x5A5A}, stream);
  }
  std::vector<uint8_t> trickle;
  constexpr uint32_t kStops = 50000;
  for (uint32_t i = 0; i < kStops; ++i) {
    EncodeControl(StopMsg{.round = i, .received = 3}, trickle);
  }
  const auto start = std::chrono::steady_clock::now();
  ControlDecoder d;
  d.Feed(stream.data(), stream.size());
  uint32_t probes = 0, stops = 0;
  size_t fed = 0;
  ControlMessage m;
  for (;;) {
    const Status s = d.Next(m);
    if (s == Status::kMessage) {
      if (const auto* p = std::get_if<ProbeMsg>(&m)) {
        ASSERT_EQ(stops, 0u) << "STOP overtook a PROBE";
        ASSERT_EQ(p->round, probes++);
      } else {
        ASSERT_EQ(std::get<StopMsg>(m).round, stops++);
      }
    } else {
      ASSERT_EQ(s, Status::kNeedMore) << d.error_text();
      if (fed == trickle.size()) break;
    }
    if (fed < trickle.size()) d.Feed(&trickle[fed++], 1);
    if ((probes + stops) % 4096 == 0) {
      ASSERT_LT(std::chrono::steady_clock::now() - start,
                std::chrono::seconds(10))
          << "decoder is not linear: " << probes + stops << " messages";
    }
  }
  EXPECT_EQ(probes, kN);
  EXPECT_EQ(stops, kStops);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(ControlCodec, NamesAreDistinctAndTypesMatchWire) {
  std::set<std::string> names;
  for (int e = 0; e <= static_cast<int>(ControlError::kBadValue); ++e) {
    names.insert(ControlErrorName(static_cast<ControlError>(e)));
  }
  EXPECT_EQ(names.size(), 10u);
  EXPECT_STREQ(ControlErrorName(ControlError::kNone), "none");
  const char* want[] = {
      "JOIN",        "WELCOME",      "ROUND_BEGIN",   "PROBE",
      "BITMAP",      "STOP",         "BYE",           "ERROR",
      "ACCEPTED",    "CHALLENGE",    "PROOF",         "TAG",
      "SHARD_HELLO", "SHARD_ASSIGN", "PHASE_PARTIAL", "PHASE_DECISION"};
  for (const ControlMessage& msg : Samples()) {
    const auto t = static_cast<uint8_t>(TypeOf(msg));
    ASSERT_GE(t, 1);
    ASSERT_LE(t, std::size(want));
    EXPECT_STREQ(ControlTypeName(msg), want[t - 1]);
  }
  EXPECT_STREQ(ControlTypeName(static_cast<ControlType>(0)), "UNKNOWN");
}

// LTP's deadline floor may ask for every chunk: min_fraction = 1 is legal.
TEST(ControlCodec, MinFractionOneRoundTrips) {
  const RoundBeginMsg rb{
      .round = 3, .p = 0.0, .deadline_ns = 1000, .min_fraction = 1.0};
  ControlDecoder d;
  const std::vector<uint8_t> bytes = EncodeControl(rb);
  d.Feed(bytes.data(), bytes.size());
  ControlMessage out;
  ASSERT_EQ(d.Next(out), ControlDecoder::Status::kMessage);
  EXPECT_EQ(std::get<RoundBeginMsg>(out), rb);
}

// v6's shard fields: the encoder and the decoder refuse a JOIN or WELCOME
// whose shard place, claim or map cannot be right, naming the field.
TEST(ControlCodec, ShardFieldsRejectedWhenInconsistent) {
  auto join = [](auto edit) {
    JoinMsg j;
    edit(j);
    return ControlMessage(j);
  };
  auto welcome = [](auto edit) {
    WelcomeMsg w = ShardedWelcome();
    edit(w);
    return ControlMessage(w);
  };
  struct Bad {
    ControlMessage msg;
    ControlError want;
    std::string field;
  };
  const std::vector<Bad> bad = {
      {join([](JoinMsg& j) { j.shard_count = 0; }), ControlError::kBadValue,
       "JOIN.shard_count"},
      {join([](JoinMsg& j) { j.shard_count = 65; }), ControlError::kBadValue,
       "JOIN.shard_count"},
      {join([](JoinMsg& j) { j.shard_index = 1; }), ControlError::kBadValue,
       "JOIN.shard_index"},
      {join([](JoinMsg& j) {
         j.shard_count = 2;
         j.shard_index = 1;
         j.first_chunk = 0xFFFFFFC0;
         j.shard_chunks = 128;
       }),
       ControlError::kBadValue, "JOIN.shard_chunks"},
      {welcome([](WelcomeMsg& w) { w.shard_index = 3; }),
       ControlError::kBadValue, "WELCOME.shard_index"},
      {welcome([](WelcomeMsg& w) { w.shards.pop_back(); }),
       ControlError::kBadValue, "WELCOME.shards"},
      {welcome([](WelcomeMsg& w) { w.shards[1].first_chunk = 127; }),
       ControlError::kBadValue, "WELCOME.shards[1].first_chunk"},
      {welcome([](WelcomeMsg& w) { w.shards[0].first_chunk = 1; }),
       ControlError::kBadValue, "WELCOME.shards[0].first_chunk"},
      {welcome([](WelcomeMsg& w) { w.shards[2].queues = 0; }),
       ControlError::kBadValue, "WELCOME.shards[2].queues"},
      {welcome([](WelcomeMsg& w) { w.num_chunks = 64; }),
       ControlError::kBadValue, "not this WELCOME's partition"},
      {welcome([](WelcomeMsg& w) { w.model_bytes = w.total_bytes - 1; }),
       ControlError::kBadValue, "WELCOME.model_bytes"},
      {welcome([](WelcomeMsg& w) {
         w.shard_count = 64;
         w.shards.resize(65, w.shards[2]);
       }),
       ControlError::kTooManyItems, "WELCOME.shards"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.field);
    std::string why;
    EXPECT_EQ(ValidateControl(b.msg, &why), b.want);
    EXPECT_NE(why.find(b.field), std::string::npos) << why;
    EXPECT_THROW(EncodeControl(b.msg), std::invalid_argument);
  }
  // The decoder refuses the same values (the entry's bytes edited in a
  // valid frame: shards[1].queues, 18 bytes into its entry).
  std::vector<uint8_t> frame = EncodeControl(ShardedWelcome());
  const size_t entry1_queues = frame.size() - 2 * 28 + 18;
  ASSERT_EQ(frame[entry1_queues + 1], 2);
  frame[entry1_queues + 1] = 0;
  ExpectRejected(frame, ControlError::kBadValue, "WELCOME.shards[1].queues");
}

// SHARD_HELLO, SHARD_ASSIGN and PHASE_DECISION values that cannot be
// right are refused by the encoder and the decoder alike.
TEST(ControlCodec, ShardMessagesRejectedWhenInconsistent) {
  auto hello = [](auto edit) {
    ShardHelloMsg h = Hello();
    edit(h);
    return ControlMessage(h);
  };
  const ShardAssignMsg assign{.shard_index = 1,
                              .shard_count = 2,
                              .first_chunk = 64,
                              .num_chunks = 10,
                              .chunk_payload = 1440,
                              .model_bytes = 74 * 1440};
  auto with = [&](auto edit) {
    ShardAssignMsg a = assign;
    edit(a);
    return ControlMessage(a);
  };
  struct Bad {
    ControlMessage msg;
    ControlError want;
    std::string field;
  };
  const std::vector<Bad> bad = {
      {hello([](ShardHelloMsg& h) { h.shard_index = 3; }),
       ControlError::kBadValue, "SHARD_HELLO.shard_index"},
      {hello([](ShardHelloMsg& h) { h.queues = 0; }), ControlError::kBadValue,
       "SHARD_HELLO.queues"},
      {hello([](ShardHelloMsg& h) { h.job_flags.assign(5000, 'x'); }),
       ControlError::kStringTooLong, "SHARD_HELLO.job_flags"},
      {with([](ShardAssignMsg& a) { a.shard_count = 65; }),
       ControlError::kBadValue, "SHARD_ASSIGN.shard_count"},
      {with([](ShardAssignMsg& a) { a.chunk_payload = 1442; }),
       ControlError::kBadValue, "SHARD_ASSIGN.chunk_payload"},
      {with([](ShardAssignMsg& a) { a.model_bytes = 73 * 1440; }),
       ControlError::kBadValue, "SHARD_ASSIGN.model_bytes"},
      {PhaseDecisionMsg{.p = 1.0}, ControlError::kBadValue, "PHASE_DECISION.p"},
      {PhaseDecisionMsg{.min_fraction = -1}, ControlError::kBadValue,
       "PHASE_DECISION.min_fraction"},
      // NaN would not equal itself after a decode (the fuzzer found it);
      // a non-finite norm travels as +inf.
      {PhaseDecisionMsg{.norm = std::nan("")}, ControlError::kBadValue,
       "PHASE_DECISION.norm"},
      {PhasePartialMsg{.squares = {1.0, std::nan(""), 2.0}},
       ControlError::kBadValue, "PHASE_PARTIAL.squares"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.field);
    std::string why;
    EXPECT_EQ(ValidateControl(b.msg, &why), b.want);
    EXPECT_NE(why.find(b.field), std::string::npos) << why;
    EXPECT_THROW(EncodeControl(b.msg), std::invalid_argument);
  }
  // The decoder: the last chunk one byte past the model (model_bytes is
  // the frame's 8 bytes before the 32-byte nonce).
  ShardAssignMsg tight = assign;
  tight.model_bytes = 73 * 1440 + 1;
  std::vector<uint8_t> frame = EncodeControl(tight);
  frame[frame.size() - 32 - 1] -= 1;  // 73 * 1440
  ExpectRejected(frame, ControlError::kBadValue, "SHARD_ASSIGN.model_bytes");
  // A PHASE_DECISION's p of 1 (bytes 13..20: after the type, iteration
  // and norm).
  std::vector<uint8_t> dec = EncodeControl(PhaseDecisionMsg{.p = 0.5});
  dec[5 + 16] = 0x3F;
  dec[5 + 17] = 0xF0;
  ExpectRejected(dec, ControlError::kBadValue, "PHASE_DECISION.p");
  // A NaN norm on the wire (bytes 13..20), and +inf, which is fine.
  std::vector<uint8_t> nan = EncodeControl(PhaseDecisionMsg{.p = 0.5});
  nan[5 + 8] = 0x7F;
  nan[5 + 9] = 0xF8;
  ExpectRejected(nan, ControlError::kBadValue, "PHASE_DECISION.norm");
  EXPECT_EQ(ValidateControl(PhaseDecisionMsg{.norm = INFINITY}),
            ControlError::kNone);
}

// The fuzzers' seeds (tests/fuzz/gen_corpus.cc) encode one
// default-constructed message of every type: each must be valid.
template <size_t... I>
std::vector<ControlMessage> Defaults(std::index_sequence<I...>) {
  return {ControlMessage(std::in_place_index<I>)...};
}

TEST(ControlCodec, EveryDefaultMessageIsValid) {
  for (const ControlMessage& m : Defaults(
           std::make_index_sequence<std::variant_size_v<ControlMessage>>())) {
    SCOPED_TRACE(ControlTypeName(m));
    std::string why;
    EXPECT_EQ(ValidateControl(m, &why), ControlError::kNone) << why;
  }
}

// A lying shard count is refused before anything is reserved for it.
TEST(ControlDecoder, ShardMapCountBoundedByLimitAndFrame) {
  std::vector<uint8_t> frame = EncodeControl(ShardedWelcome());
  // The map's u32 count sits right before its 3 entries of 28 bytes.
  const size_t count_at = frame.size() - 3 * 28 - 4;
  ASSERT_EQ(frame[count_at + 3], 3);
  std::vector<uint8_t> too_many = frame;
  too_many[count_at + 3] = 65;
  ExpectRejected(too_many, ControlError::kTooManyItems, "WELCOME.shards");
  std::vector<uint8_t> past_end = frame;
  past_end[count_at + 3] = 4;
  ExpectRejected(past_end, ControlError::kTruncatedBody, "WELCOME.shards");
}

// A v5 JOIN (no shard fields) is cut short for a v6 decoder, not misread.
TEST(ControlDecoder, JoinWithoutV6TailIsTruncated) {
  std::vector<uint8_t> frame = EncodeControl(JoinMsg{});
  const size_t v6_tail = 2 + 2 + 4 + 4 + 2 + 32;
  frame.resize(frame.size() - v6_tail);
  const uint32_t len = static_cast<uint32_t>(frame.size() - 4);
  for (int i = 0; i < 4; ++i)
    frame[i] = static_cast<uint8_t>(len >> (24 - 8 * i));
  ExpectRejected(frame, ControlError::kTruncatedBody, "JOIN.shard_index");
}

}  // namespace
}  // namespace dblp

// libFuzzer target: one receiver's rounds (lib/dblp/round/receiver_round.h) fed
// an arbitrary sequence of frames and Begin/Close/SetTolerance/SetDeadline/
// PollStop operations decoded from the input, against a small model of
// what the round has accepted.
//
// Input: a config (session, expected type and sender, a layout of up to
// 16384 chunks, an optional shard range), then operations; see the Op enum
// and tests/fuzz/gen_corpus.cc, which writes seeds in the same format.
//
// Promises checked after every step (abort on violation):
//  - accepted => the frame decodes to exactly the returned header, is of
//    this session, type, sender, the open round, a seq in range and in the
//    shard with its exact length, was not accepted before this round and,
//    in an authenticated job, carries a valid tag; the payload pointer
//    lies inside the frame;
//  - a frame meeting all of the above is accepted (nothing good dropped);
//  - every other verdict names a reason that holds for the frame, and
//    kMalformed is returned exactly when the structural decode fails;
//  - received() equals the model's count, never exceeds num_chunks, and
//    the bitmap snapshot holds exactly the accepted seqs;
//  - per-verdict counters add up to the frames seen;
//  - PollStop hands out at most one STOP per round, only while open, and
//    does so as soon as the threshold (or deadline with its floor) is met;
//  - an invalid tolerance throws std::invalid_argument and changes nothing.
// The control thread's concurrent SetTolerance/PollStop are exercised here
// sequentially only; the unit tests cover the threading.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "dblp/round/receiver_round.h"
#include "dblp/round/stop_decision.h"
#include "dblp/security/frame_auth.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "fuzz_input.h"

namespace dblp::fuzz {
namespace {

// Operation codes, one input byte each (mod kNumOps). Frames get three
// codes so that a random input is mostly traffic.
enum Op : uint8_t {
  kOpBegin = 0,
  kOpFrame = 1,  // 1..3: a frame built from fields
  kOpRawFrame = 4,
  kOpClose = 5,
  kOpSetTolerance = 6,
  kOpPollStop = 7,
  kOpSetDeadline = 8,
  kOpSnapshot = 9,
  kNumOps = 10,
};

constexpr size_t kMaxOps = 20000;

// FUZZ_TRACE=1 prints every step (to see what a seed or a crash does).
const bool kTrace = std::getenv("FUZZ_TRACE") != nullptr;

// What the harness knows the receiver must hold.
struct Model {
  bool begun = false;
  bool open = false;
  bool p_set = false;
  uint32_t round = 0;
  double p = 0;
  uint64_t deadline = 0;
  double min_fraction = 0;
  bool stop_given = false;
  std::vector<bool> got;
  uint32_t count = 0;
  uint64_t frames = 0;
  std::array<uint64_t, kNumVerdicts> verdicts{};
};

// p from one byte: [0, 1) in 1/255 steps, the largest double below 1 at
// 254, and at 255 an invalid value (*valid = false) picked by a second byte.
double Tolerance(Reader& in, bool* valid) {
  const uint8_t sel = in.U8();
  *valid = true;
  if (sel < 254) return sel / 255.0;
  if (sel == 254) return std::nextafter(1.0, 0.0);
  *valid = false;
  static constexpr double kBad[] = {
      std::numeric_limits<double>::quiet_NaN(), 1.0, -0.25,
      std::numeric_limits<double>::infinity(), 1.5};
  return kBad[in.U8() % 5];
}

uint32_t PickRound(Reader& in, uint8_t sel, uint32_t current) {
  switch (sel % 4) {
    case 0:
      return current;
    case 1:
      return current + 1;
    case 2:
      return current - 1;
    default:
      return in.U32();
  }
}

class Harness {
 public:
  explicit Harness(const ReceiverConfig& cfg)
      : cfg_(cfg), rx_(cfg), n_(cfg.layout.num_chunks()), auth_(cfg.frame_key) {
    m_.got.assign(n_, false);
  }

  void Run(Reader& in) {
    Check();
    for (size_t ops = 0; !in.empty() && ops < kMaxOps; ++ops) {
      const uint8_t op = in.U8() % kNumOps;
      if (kTrace && (op == kOpBegin || op >= kOpClose)) {
        std::fprintf(stderr, "op %u\n", op);
      }
      switch (op) {
        case kOpBegin:
          Begin(in);
          break;
        case kOpFrame:
        case kOpFrame + 1:
        case kOpFrame + 2:
          BuiltFrame(in);
          break;
        case kOpRawFrame:
          RawFrame(in);
          break;
        case kOpClose:
          rx_.Close();
          m_.open = false;
          break;
        case kOpSetTolerance:
          SetTolerance(in);
          break;
        case kOpPollStop:
          PollStop(in);
          break;
        case kOpSetDeadline:
          m_.deadline = in.U8() == 0 ? 0 : now_ + in.U8();
          m_.min_fraction = in.U8() / 200.0;  // up to 1.275: capped at n
          rx_.SetDeadline(m_.deadline, m_.min_fraction);
          break;
        case kOpSnapshot:
          Snapshot();
          break;
      }
      Check();
    }
  }

 private:
  void Begin(Reader& in) {
    const uint32_t round = PickRound(in, in.U8(), m_.round);
    bool valid = false;
    const double p = Tolerance(in, &valid);
    const uint64_t deadline = in.U8() == 0 ? 0 : now_ + in.U8();
    const double min_fraction = in.U8() / 200.0;
    if (!valid) {
      bool threw = false;
      try {
        rx_.Begin(round, p, deadline, min_fraction);
      } catch (const std::invalid_argument&) {
        threw = true;
      }
      FUZZ_CHECK(threw);  // and Check() sees nothing changed
      return;
    }
    rx_.Begin(round, p, deadline, min_fraction);
    m_.begun = m_.open = m_.p_set = true;
    m_.round = round;
    m_.p = p;
    m_.deadline = deadline;
    m_.min_fraction = min_fraction;
    m_.stop_given = false;
    m_.got.assign(n_, false);
    m_.count = 0;
    FUZZ_CHECK(rx_.received() == 0 && !rx_.stop_taken());
  }

  void SetTolerance(Reader& in) {
    bool valid = false;
    const double p = Tolerance(in, &valid);
    if (!valid) {
      bool threw = false;
      try {
        rx_.SetTolerance(p);
      } catch (const std::invalid_argument&) {
        threw = true;
      }
      FUZZ_CHECK(threw);
      return;
    }
    rx_.SetTolerance(p);
    m_.p = p;
    m_.p_set = true;
  }

  void PollStop(Reader& in) {
    now_ += in.U8();
    const uint32_t count = m_.count;
    const bool threshold_met = count >= StopThreshold(n_, m_.p);
    const bool deadline_met = m_.deadline != 0 && now_ >= m_.deadline &&
                              count >= FractionFloor(n_, m_.min_fraction);
    const bool reached = rx_.StopReached(now_);
    if (m_.p_set) FUZZ_CHECK(reached == (threshold_met || deadline_met));
    const StopTrigger t = rx_.PollStop(now_);
    if (!m_.open || m_.stop_given) {  // open implies p_set (Begin)
      FUZZ_CHECK(t == StopTrigger::kNone);
      return;
    }
    if (t == StopTrigger::kThreshold) FUZZ_CHECK(threshold_met);
    if (t == StopTrigger::kDeadline) FUZZ_CHECK(deadline_met);
    // Met means sent now: a late STOP costs a whole retransmission pass.
    FUZZ_CHECK((t != StopTrigger::kNone) == (threshold_met || deadline_met));
    if (t != StopTrigger::kNone) m_.stop_given = true;
  }

  // A frame from fields: each selector bit makes one field wrong (or raw),
  // so the interesting frames are a few bits away from valid ones.
  void BuiltFrame(Reader& in) {
    const uint8_t sel = in.U8();
    DataHeader h;
    h.session = cfg_.session;
    if (sel & 0x01) h.session ^= 1u + in.U8();
    h.type = cfg_.expected_type;
    if (sel & 0x02) {
      h.type =
          h.type == FrameType::kPush ? FrameType::kBroadcast : FrameType::kPush;
    }
    h.sender_rank = cfg_.expected_sender == kAnySender
                        ? in.U16()
                        : static_cast<uint16_t>(cfg_.expected_sender);
    if (sel & 0x04) h.sender_rank = in.U16();
    h.round = PickRound(in, sel >> 3, m_.round);
    h.seq = (sel & 0x20) ? in.U32() : in.U16() % n_;
    h.payload_len = (sel & 0x40) ? in.U16() % 1024
                    : h.seq < n_
                        ? static_cast<uint16_t>(cfg_.layout.Length(h.seq))
                        : 0;
    std::vector<uint8_t> buf(kDataHeaderBytes + h.payload_len);
    std::vector<uint8_t> payload(h.payload_len);
    for (size_t i = 0; i < payload.size(); ++i) {
      payload[i] = static_cast<uint8_t>(h.seq + i);
    }
    BuildDataFrame(h, payload.data(), buf.data());
    if (auth_.enabled()) {  // sealed like a member's frame
      const size_t body = buf.size();
      buf.resize(body + auth_.tag_bytes());
      auth_.Seal(buf.data(), body, buf.data() + body);
    }
    if (sel & 0x80) {
      // Corrupt one byte, then truncate or pad (Ethernet padding is legal).
      const uint8_t pos = in.U8();
      buf[pos % buf.size()] ^= in.U8();
      const uint8_t cut = in.U8();
      if (cut % 4 == 1) buf.resize(cut / 4 % (buf.size() + 1));
      if (cut % 4 == 2) buf.resize(buf.size() + cut / 4, 0);
    }
    Deliver(buf.data(), buf.size());
  }

  void RawFrame(Reader& in) {
    size_t got = 0;
    const uint8_t* bytes = in.Bytes(in.U16() % 2048, &got);
    Deliver(bytes, got);
  }

  // Hands a copy of exactly `len` bytes to OnFrame (so ASan sees any read
  // past it) and checks the verdict against the model.
  void Deliver(const uint8_t* bytes, size_t len) {
    const std::vector<uint8_t> frame(bytes, bytes + len);
    const uint8_t* buf = frame.empty() ? nullptr : frame.data();
    DataHeader out;
    const uint8_t* payload = nullptr;
    const Verdict v = rx_.OnFrame(buf, len, &out, &payload);
    FUZZ_CHECK(static_cast<int>(v) < kNumVerdicts);
    FUZZ_CHECK(std::strcmp(VerdictName(v), "unknown") != 0);
    ++m_.frames;
    ++m_.verdicts[static_cast<int>(v)];
    if (kTrace) {
      std::fprintf(stderr, "frame %zu bytes: %s (received %u)\n", len,
                   VerdictName(v), rx_.received());
    }

    DataHeader h;
    const bool decodes = DecodeDataHeader(buf, len, &h) == DecodeStatus::kOk;
    FUZZ_CHECK((v == Verdict::kMalformed) == !decodes);
    if (!decodes) return;

    const bool session_ok = h.session == cfg_.session;
    const bool type_ok = h.type == cfg_.expected_type;
    const bool sender_ok = cfg_.expected_sender == kAnySender ||
                           h.sender_rank == cfg_.expected_sender;
    const bool this_round = m_.begun && h.round == m_.round;
    const bool fits = h.seq < n_ && h.payload_len == cfg_.layout.Length(h.seq);
    const bool in_shard = h.seq >= cfg_.seq_begin && h.seq < cfg_.seq_end;
    const bool fresh = fits && !m_.got[h.seq];
    // The tag follows the chunk; checked with our own authenticator.
    const size_t body = kDataHeaderBytes + size_t{h.payload_len};
    const bool tag_ok =
        !auth_.enabled() || (len >= body + auth_.tag_bytes() &&
                             auth_.Verify(buf, body, buf + body));
    const bool acceptable = session_ok && type_ok && sender_ok && this_round &&
                            m_.open && fits && in_shard && fresh && tag_ok;

    switch (v) {
      case Verdict::kAccepted:
        FUZZ_CHECK(acceptable);
        FUZZ_CHECK(out == h);
        FUZZ_CHECK(payload == buf + kDataHeaderBytes);
        FUZZ_CHECK(payload + out.payload_len <= buf + len);
        m_.got[h.seq] = true;
        ++m_.count;
        FUZZ_CHECK(rx_.Has(h.seq));
        break;
      case Verdict::kWrongSession:
        FUZZ_CHECK(!session_ok);
        break;
      case Verdict::kWrongType:
        FUZZ_CHECK(!type_ok);
        break;
      case Verdict::kWrongSender:
        FUZZ_CHECK(!sender_ok);
        break;
      case Verdict::kIdle:
        FUZZ_CHECK(!m_.begun);
        break;
      case Verdict::kStaleRound:
        FUZZ_CHECK(m_.begun && RoundIsOlder(h.round, m_.round));
        break;
      case Verdict::kFutureRound:
        FUZZ_CHECK(m_.begun && RoundDistance(h.round, m_.round) > 0);
        break;
      case Verdict::kLate:
        FUZZ_CHECK(this_round && !m_.open);
        break;
      case Verdict::kOutOfRange:
        FUZZ_CHECK(!fits);
        break;
      case Verdict::kMisrouted:
        FUZZ_CHECK(!in_shard);
        break;
      case Verdict::kDuplicate:
        FUZZ_CHECK(this_round && fits && !fresh);
        break;
      case Verdict::kBadTag:
        FUZZ_CHECK(!tag_ok);
        break;
      default:  // a reason added later: at least it was not accepted
        break;
    }
    // Nothing good is dropped.
    if (acceptable) FUZZ_CHECK(v == Verdict::kAccepted);
  }

  void Snapshot() {
    Bitmap b;
    rx_.SnapshotBitmap(b);
    FUZZ_CHECK(b.size() == n_);
    FUZZ_CHECK(b.Count() == m_.count);
    uint32_t seen = 0;
    b.ForEachSet([&](uint32_t seq) {
      FUZZ_CHECK(seq < n_ && m_.got[seq]);
      ++seen;
    });
    FUZZ_CHECK(seen == m_.count);
  }

  void Check() {
    FUZZ_CHECK(rx_.num_chunks() == n_);
    FUZZ_CHECK(rx_.received() == m_.count);
    FUZZ_CHECK(rx_.received() <= rx_.num_chunks());
    FUZZ_CHECK(rx_.delivered_fraction() >= 0 && rx_.delivered_fraction() <= 1);
    FUZZ_CHECK(rx_.open() == m_.open);
    FUZZ_CHECK(rx_.stop_taken() == m_.stop_given);
    if (m_.begun) FUZZ_CHECK(rx_.round() == m_.round);
    if (m_.p_set) {
      FUZZ_CHECK(rx_.p() == m_.p);
      FUZZ_CHECK(rx_.threshold() == StopThreshold(n_, m_.p));
      FUZZ_CHECK(rx_.threshold() >= 1 && rx_.threshold() <= n_);
    }
    FUZZ_CHECK(rx_.deadline_ns() == m_.deadline);
    uint64_t total = 0;
    for (int v = 0; v < kNumVerdicts; ++v) {
      const uint64_t c = rx_.verdict_count(static_cast<Verdict>(v));
      FUZZ_CHECK(c == m_.verdicts[v]);
      total += c;
    }
    FUZZ_CHECK(total == m_.frames);
  }

  const ReceiverConfig cfg_;
  ReceiverRound rx_;
  const uint32_t n_;
  FrameAuth auth_;  // the job's key: seals our frames, checks verdicts
  Model m_;
  uint64_t now_ = 1000;
};

}  // namespace
}  // namespace dblp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dblp;
  using namespace dblp::fuzz;
  Reader in(data, size);
  ReceiverConfig cfg;
  const uint8_t flags = in.U8();
  cfg.session = in.U32();
  cfg.expected_type = (flags & 1) ? FrameType::kBroadcast : FrameType::kPush;
  if (flags & 2) cfg.expected_sender = in.U16();
  // Small chunks and at most 16384 of them keep one input fast.
  const uint32_t chunk = 4u * (1u + in.U8() % 16);
  const uint64_t total = 1 + uint64_t{in.U16()};
  cfg.layout = ChunkLayout(total, chunk);
  if (flags & 4) {  // a shard: any range, empty and past-the-end included
    cfg.seq_begin = in.U16();
    cfg.seq_end = in.U16();
  }
  if (flags & 8) {  // an authenticated job: every frame carries a tag
    cfg.frame_key.mode =
        (flags & 16) ? FrameAuthMode::kFull : FrameAuthMode::kHeader;
    const uint8_t seed = in.U8();
    for (size_t i = 0; i < cfg.frame_key.key.size(); ++i) {
      cfg.frame_key.key[i] = static_cast<uint8_t>(seed + 31 * i);
    }
  }
  Harness h(cfg);
  h.Run(in);
  return 0;
}

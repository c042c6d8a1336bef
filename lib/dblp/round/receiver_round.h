// The receiving side of one round: validates every data frame, records it in
// the round's bitmap and decides when to STOP the sender.
//
// Threading: one owner thread (a datapath lcore) calls Begin/OnFrame/Close.
// SetTolerance, PollStop, received(), SnapshotBitmap() and the counters may be
// called from any thread (the control thread answering PROBE and sending STOP).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "dblp/round/stop_decision.h"
#include "dblp/security/frame_auth.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"

namespace dblp {

enum class Verdict : uint8_t {
  kAccepted = 0,
  kDuplicate,     // seq already received this round
  kStaleRound,    // a frame of an earlier round: must never be accepted
  kFutureRound,   // a frame of a round not begun yet
  kLate,          // a frame of the current round after it was closed
  kWrongSession,  // another job's frame
  kWrongSender,   // a rank this receiver does not listen to
  kWrongType,     // push frame at a broadcast receiver or vice versa
  kOutOfRange,    // seq or length does not fit the session's chunk layout
  kMalformed,     // failed structural decode (see decode counters)
  kIdle,          // no round has begun
  kMisrouted,     // a chunk of another shard's range (another lcore's)
  kBadTag,        // authentication tag missing or wrong (frame_auth.h)
};
inline constexpr int kNumVerdicts = 13;
const char* VerdictName(Verdict v);

inline constexpr int32_t kAnySender = -1;

struct ReceiverConfig {
  uint32_t session = 0;
  FrameType expected_type = FrameType::kPush;
  int32_t expected_sender = kAnySender;  // or one rank
  ChunkLayout layout;
  // The chunk range this receiver owns when a round's chunks are split
  // over lanes (chunk_ranges.h); the rest of the round is other receivers'.
  uint32_t seq_begin = 0;
  uint32_t seq_end = UINT32_MAX;
  // An authenticated job's frame key: every frame must carry its tag.
  FrameKey frame_key = {};
};

class ReceiverRound {
 public:
  explicit ReceiverRound(const ReceiverConfig& config);

  // Owner: starts `round` with tolerance `p` (must be in [0, 1)). With a
  // deadline (absolute ns, 0 = none) the round may also close once
  // `deadline_min_fraction` of the chunks arrived (LTP early close).
  void Begin(uint32_t round, double p, uint64_t deadline_ns = 0,
             double deadline_min_fraction = 0);

  // Any thread: changes the open round's p. The next PollStop uses it.
  void SetTolerance(double p);
  // Any thread: changes the open round's deadline (absolute ns, 0 = none).
  void SetDeadline(uint64_t deadline_ns, double min_fraction);

  // Owner: decodes and validates one frame (bytes after the UDP header).
  // On kAccepted, `*hdr` and `*payload` describe the chunk to consume.
  // Inline: the receivers' loops run it once per frame.
  Verdict OnFrame(const uint8_t* buf, size_t len, DataHeader* hdr,
                  const uint8_t** payload);
  // Owner: OnFrame's checks past the header's decode, for a caller that
  // already knows the frame decodes (DecodeDataHeader kOk on `buf`, `len`)
  // to this receiver's session, type and sender (the server's expected-
  // frame path, push_rx.h). Reads hdr.round, seq and payload_len only;
  // counts exactly what OnFrame counts for that frame.
  Verdict OnDecoded(const DataHeader& hdr, const uint8_t* buf, size_t len,
                    const uint8_t** payload);

  // Any thread: the STOP decision with the round's current p. Returns the
  // trigger exactly once per round (kNone before and after), so the caller
  // sends exactly one STOP.
  StopTrigger PollStop(uint64_t now_ns = 0);
  // Any thread: has PollStop already handed out this round's STOP?
  bool stop_taken() const {
    return stop_taken_.load(std::memory_order_acquire);
  }
  // Any thread: would the round stop now (without consuming the STOP)?
  bool StopReached(uint64_t now_ns = 0) const;

  // Any thread: the round's STOP rule at its current p (threshold over the
  // whole round, deadline and its floor).
  StopRule Rule() const;

  // Owner: ends the round; further frames of it are counted as kLate.
  void Close() { open_.store(false, std::memory_order_release); }

  uint32_t round() const { return round_.load(std::memory_order_acquire); }
  bool open() const { return open_.load(std::memory_order_acquire); }
  double p() const { return p_.load(std::memory_order_acquire); }
  // Absolute deadline of the round (0 = none): a receiver polls PollStop
  // even without arrivals while one is set.
  uint64_t deadline_ns() const {
    return deadline_ns_.load(std::memory_order_acquire);
  }
  uint32_t threshold() const {
    return threshold_.load(std::memory_order_acquire);
  }
  uint32_t received() const { return bitmap_.Count(); }
  uint32_t num_chunks() const { return config_.layout.num_chunks(); }
  double delivered_fraction() const {
    return static_cast<double>(received()) / num_chunks();
  }
  void SnapshotBitmap(Bitmap& out) const { bitmap_.Snapshot(out); }
  bool Has(uint32_t seq) const { return bitmap_.Test(seq); }
  const ReceiverConfig& config() const { return config_; }

  uint64_t verdict_count(Verdict v) const {
    return verdicts_[static_cast<int>(v)].load(std::memory_order_relaxed);
  }
  uint64_t decode_error_count(DecodeStatus s) const {
    return decode_errors_[static_cast<int>(s)].load(std::memory_order_relaxed);
  }

 private:
  Verdict Count(Verdict v) {
    Bump(verdicts_[static_cast<int>(v)]);
    return v;
  }
  // Single writer (the owner), so no read-modify-write instruction needed.
  static void Bump(std::atomic<uint64_t>& c) {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  ReceiverConfig config_;
  FrameAuth auth_;      // owner only
  uint32_t tag_bytes_;  // auth_.tag_bytes(), read per frame
  uint32_t seq_span_;   // seq_end - seq_begin (owner only, set at construction)
  // Of the range, the chunks before the layout's last (all of the
  // layout's chunk_payload bytes), and that length; set at construction.
  uint32_t body_span_;
  uint32_t chunk_payload_;
  AtomicBitmap bitmap_;                      // owner: wo; control: ro
  std::atomic<uint32_t> round_{0};           // owner: wo; any: ro
  std::atomic<bool> open_{false};            // owner: wo; any: ro
  bool begun_ = false;                       // owner only
  std::atomic<double> p_{0};                 // control or owner: wo; any: ro
  std::atomic<uint32_t> threshold_{0};       // derived from p_, same writer
  std::atomic<uint64_t> deadline_ns_{0};     // owner: wo (Begin)
  std::atomic<uint32_t> deadline_floor_{0};  // owner: wo (Begin)
  std::atomic<bool> stop_taken_{false};      // exchanged by whoever sends STOP
  std::array<std::atomic<uint64_t>, kNumVerdicts> verdicts_{};
  std::array<std::atomic<uint64_t>, kNumDecodeStatus> decode_errors_{};
};

[[gnu::always_inline]] inline Verdict ReceiverRound::OnFrame(
    const uint8_t* buf, size_t len, DataHeader* hdr, const uint8_t** payload) {
  const DecodeStatus s = DecodeDataHeader(buf, len, hdr);
  if (s != DecodeStatus::kOk) {
    Bump(decode_errors_[static_cast<int>(s)]);
    return Count(Verdict::kMalformed);
  }
  if (hdr->session != config_.session) return Count(Verdict::kWrongSession);
  if (hdr->type != config_.expected_type) return Count(Verdict::kWrongType);
  if (config_.expected_sender != kAnySender &&
      hdr->sender_rank != config_.expected_sender) {
    return Count(Verdict::kWrongSender);
  }
  return OnDecoded(*hdr, buf, len, payload);
}

[[gnu::always_inline]] inline Verdict ReceiverRound::OnDecoded(
    const DataHeader& h, const uint8_t* buf, size_t len,
    const uint8_t** payload) {
  const DataHeader* hdr = &h;
  if (!begun_) return Count(Verdict::kIdle);
  const int32_t ahead =
      RoundDistance(hdr->round, round_.load(std::memory_order_relaxed));
  if (ahead < 0) return Count(Verdict::kStaleRound);
  if (ahead > 0) return Count(Verdict::kFutureRound);
  if (!open_.load(std::memory_order_relaxed)) return Count(Verdict::kLate);
  // A full-length chunk of our range passes the next three checks (one
  // unsigned compare: a seq below seq_begin wraps to a huge offset); any
  // other frame takes them in turn, for its verdict.
  if (hdr->seq - config_.seq_begin >= body_span_ ||
      hdr->payload_len != chunk_payload_) [[unlikely]] {
    const DecodeStatus v = ValidateChunk(*hdr, config_.layout);
    if (v != DecodeStatus::kOk) {
      Bump(decode_errors_[static_cast<int>(v)]);
      return Count(Verdict::kOutOfRange);
    }
    if (hdr->seq - config_.seq_begin >= seq_span_) {
      return Count(Verdict::kMisrouted);
    }
  }
  if (tag_bytes_ != 0) {
    // A chunk we hold costs no MAC; anything else must prove its origin
    // before it can set a bit (the owner is the only writer, so nothing
    // sets it between the test and the set).
    if (bitmap_.Test(hdr->seq)) return Count(Verdict::kDuplicate);
    const size_t body = kDataHeaderBytes + size_t{hdr->payload_len};
    if (len < body + tag_bytes_ || !auth_.Verify(buf, body, buf + body)) {
      return Count(Verdict::kBadTag);
    }
  }
  if (!bitmap_.Set(hdr->seq)) return Count(Verdict::kDuplicate);
  *payload = buf + kDataHeaderBytes;
  return Count(Verdict::kAccepted);
}

}  // namespace dblp

// The send side of one direction: what a sender does for a round, over any
// transport. It owns the round's SenderRound, the PROBE/RTT state and the
// mailboxes through which the control thread hands it STOP and BITMAP.
//
//   datapath: Begin(round, order, now), then Step(now, frames, outbox) once
//             per loop turn until done().
//   control:  StopArrived(round, now) and BitmapArrived(round, msg, now)
//             when the receiver's STOP or BITMAP comes in (any thread).
//
// The transport is a template parameter of Step (no virtual call per
// packet): `frames.Send(proto, seqs, n)` builds and transmits the chunks
// `seqs` as frames of `proto` (seq and length set per chunk) and returns how
// many it took; the rest go back to the round (TX backpressure delays
// frames, never loses them). Control requests (PROBE) go to
// `outbox.Post(ControlRequest)`.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "dblp/round/bitmap_mailbox.h"
#include "dblp/round/round_events.h"
#include "dblp/round/sender_round.h"
#include "dblp/wire/wire.h"

namespace dblp {

template <class F>
concept ChunkFrames =
    requires(F f, const DataHeader& h, const uint32_t* seqs, uint32_t n) {
      { f.Send(h, seqs, n) } -> std::same_as<uint32_t>;
    };

template <class O>
concept ControlOutbox = requires(O o, const ControlRequest& r) { o.Post(r); };

struct SendSideConfig {
  FrameType type = FrameType::kPush;
  uint32_t session = 0;
  uint16_t sender_rank = 0;   // ours
  uint16_t peer = 0;          // the receiver, as requests name it
  Direction direction = Direction::kPush;
  uint32_t burst = 32;        // chunks per Send
  // A PROBE unanswered this long is sent again: a BITMAP dropped on the
  // way (a busy mailbox) must not stall the round. 0 = never.
  uint64_t probe_retry_ns = 50'000'000;
  // The lane (chunk range) this side sends when the round is split over
  // lcores or queues: its PROBEs name it, and only BITMAPs naming it are
  // its answers.
  uint16_t lane = 0;
};

class SendSide {
 public:
  explicit SendSide(const SendSideConfig& config)
      : config_(config), seqs_(config.burst) {}
  SendSide(const SendSide&) = delete;
  SendSide& operator=(const SendSide&) = delete;

  // Datapath: starts `round` with first-pass order `order` at `now_ns`.
  // A lane's side sends only its chunk range: `order` holds those seqs and
  // `num_chunks` is the whole round's (0: the order's size).
  void Begin(uint32_t round, std::span<const uint32_t> order, uint64_t now_ns,
             uint32_t num_chunks = 0);

  // Datapath, once per loop turn: applies a waiting BITMAP, sends the next
  // burst, or PROBEs at the end of a pass. Returns true if it made progress
  // (frames left, a BITMAP applied, a PROBE asked, the round ended).
  template <ChunkFrames Frames, ControlOutbox Outbox>
  bool Step(uint64_t now_ns, Frames& frames, Outbox& outbox);

  // Any thread (control): the receiver's STOP for `round`, which arrived at
  // `at_ns` and says it holds `received` chunks. A STOP of another round,
  // or a second one, is ignored (returns false).
  bool StopArrived(uint32_t round, uint64_t at_ns, uint32_t received = 0);
  // Any thread (control): the receiver's BITMAP. Returns false (counted as
  // dropped) if the previous one is still unread or it does not fit.
  bool BitmapArrived(const BitmapMsg& m, uint64_t at_ns) {
    return bitmap_.Post(m.round, at_ns, m.num_bits, m.words);
  }

  // Datapath: nothing more to send this round (STOP, or nothing missing).
  bool done() const { return done_; }
  uint32_t round() const { return round_.round(); }
  const SenderRound& sender() const { return round_; }
  const SendSideConfig& config() const { return config_; }
  // When the round began and when it ended (STOP's arrival, or the BITMAP
  // that showed nothing missing).
  uint64_t begin_ns() const { return begin_ns_; }
  uint64_t done_ns() const { return done_ns_; }
  // Chunks the receiver said it held in this round's STOP (0: no STOP).
  uint32_t stop_received() const { return done_stop_received_; }
  // Mean PROBE -> BITMAP time of this round in µs (0 if none).
  double mean_rtt_us() const { return rtt_n_ ? rtt_sum_us_ / rtt_n_ : 0; }
  uint64_t probes_sent() const { return probes_; }
  // Datapath: grows with every round begun, every first-pass frame sent,
  // every BITMAP that shows more chunks delivered than the last one, the
  // frames of a pass that such a BITMAP started (a long resend over a slow
  // link that is getting through) and the round's end; never with a PROBE
  // retry or a pass after a BITMAP that showed nothing new, so a loop that
  // only resends into 100% loss trips its watchdog.
  uint64_t progress() const { return progress_; }
  uint64_t bitmaps_dropped() const { return bitmap_.dropped(); }

 private:
  bool ApplyBitmap();
  void Finish(uint64_t now_ns);

  SendSideConfig config_;
  SenderRound round_;                  // datapath: owner; control: RequestStop
  BitmapMailbox bitmap_;               // control -> datapath
  std::atomic<uint32_t> live_round_{0};  // datapath: wo; control: ro
  // The last STOP the control thread accepted: its round word, (round << 1)
  // | 1, and its arrival time, written before the word. Control: wo;
  // datapath: ro.
  std::atomic<uint64_t> stop_word_{0};
  std::atomic<uint64_t> stop_at_ns_{0};
  std::atomic<uint32_t> stop_received_{0};
  // Datapath only.
  std::vector<uint32_t> seqs_;
  bool done_ = true;
  bool probe_out_ = false;
  uint64_t probe_ns_ = 0;
  uint64_t begin_ns_ = 0, done_ns_ = 0;
  uint32_t done_stop_received_ = 0;
  double rtt_sum_us_ = 0;
  uint32_t rtt_n_ = 0;
  uint64_t probes_ = 0;
  uint64_t progress_ = 0;
  uint32_t known_delivered_ = 0;  // chunks the round's last BITMAP showed
  bool gaining_ = true;  // the first pass, or the last BITMAP showed more
};

template <ChunkFrames Frames, ControlOutbox Outbox>
bool SendSide::Step(uint64_t now_ns, Frames& frames, Outbox& outbox) {
  if (done_) return false;
  bool progress = bitmap_.ready() && ApplyBitmap();
  if (round_.finished()) {
    Finish(now_ns);
    return true;
  }
  const uint32_t k = round_.NextBurst(seqs_.data(), config_.burst);
  if (k > 0) {
    DataHeader proto{config_.type, config_.session, config_.sender_rank, 0,
                     round_.round(), 0};
    const uint32_t sent = frames.Send(proto, seqs_.data(), k);
    round_.Unsend(k - sent);  // a full TX ring: the rest go next turn
    if (gaining_) progress_ += sent;
    // A full ring is no progress: the loop backs off and the peer drains.
    progress = progress || sent > 0;
  }
  if (round_.state() == SenderRound::State::kAwaitingBitmap &&
      (!probe_out_ || (config_.probe_retry_ns != 0 &&
                       now_ns - probe_ns_ >= config_.probe_retry_ns))) {
    // A retry is no progress: a receiver that never answers must still
    // trip the loop's no-progress watchdog.
    progress = progress || !probe_out_;
    probe_out_ = true;
    probe_ns_ = now_ns;
    ++probes_;
    outbox.Post(ProbeRequest{config_.peer, config_.direction, round_.round(),
                             round_.passes(), config_.lane});
  }
  return progress;
}

// The two send sides every job has, by name. Worker `rank`'s push to the
// server, `burst` chunks per Send.
inline SendSideConfig PushSendConfig(uint32_t session, uint16_t rank,
                                     uint32_t burst) {
  return SendSideConfig{.type = FrameType::kPush,
                        .session = session,
                        .sender_rank = rank,
                        .peer = 0,  // the server
                        .direction = Direction::kPush,
                        .burst = burst};
}

// The server's broadcast to worker `w`.
inline SendSideConfig BroadcastSendConfig(uint32_t session, uint16_t w,
                                          uint32_t burst) {
  return SendSideConfig{.type = FrameType::kBroadcast,
                        .session = session,
                        .sender_rank = kServerRank,
                        .peer = w,
                        .direction = Direction::kBroadcast,
                        .burst = burst};
}

}  // namespace dblp

// The receive side of one direction: what a receiver does for a round, over
// any transport. It owns the round's ReceiverRound (verdict and bitmap per
// frame, the STOP decision at the round's current p), the pending PROBE and
// its drain generation, and emits STOP and BITMAP as typed requests.
//
//   datapath: Begin(round, ...) and Announce(ROUND_BEGIN); OnFrame(frame,
//             consume) per received frame; Step(now, rx, outbox) once per
//             loop turn; Close() when the round is over.
//   control:  ProbeArrived(round, lane) when a sender's PROBE comes in, and
//             reads answer() to send the BITMAP it is asked to (any thread).
//
// A PROBE is answered only after an RX poll that *started after* the PROBE
// was seen came back short (drained): every frame the sender put on the
// wire before its PROBE is then in the BITMAP, so the next pass re-sends
// only what was really lost.
#pragma once

#include <atomic>
#include <cstdint>

#include "dblp/round/bitmap_mailbox.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/round/receiver_round.h"
#include "dblp/round/round_events.h"
#include "dblp/round/send_side.h"  // ControlOutbox

namespace dblp {

// What the loop's RX step tells the receive sides each turn.
struct RxProgress {
  bool arrivals = false;    // frames for this side arrived this turn
  uint64_t poll_gen = 0;    // the RX poll of this turn
  uint64_t drained_gen = 0; // the latest poll that left this side's queues
                            // empty (short)
};

struct ReceiveSideConfig {
  ReceiverConfig receiver;
  Direction direction = Direction::kPush;
  uint16_t peer = 0;  // the sender, as requests name it
  // Split over lanes (chunk_ranges.h): this side is lane `lane` of the
  // round, `receiver`'s seq range its chunk range, and the lanes' STOP is
  // decided together. Null: the side receives the whole round.
  StopGroup* group = nullptr;
  uint16_t lane = 0;
};

class ReceiveSide {
 public:
  explicit ReceiveSide(const ReceiveSideConfig& config)
      : config_(config), rx_(config.receiver) {}
  ReceiveSide(const ReceiveSide&) = delete;
  ReceiveSide& operator=(const ReceiveSide&) = delete;

  // Datapath: opens `round` with tolerance `p` and an absolute deadline
  // (0 = none). A ROUND_BEGIN for this round that came before it is applied
  // now. A receiver that does not know the round's p yet opens with p = 0:
  // only a complete buffer, which satisfies any p, can STOP it early.
  void Begin(uint32_t round, double p, uint64_t deadline_abs_ns,
             double min_fraction, uint64_t now_ns);
  // Datapath, after Begin: the open round's deadline is `after_ns` after
  // its first chunk arrives (0 = none). A server opens a push beside the
  // broadcast before it, while the trainers still compute: timed from the
  // opening, a deadline would count their compute and that broadcast.
  void DeadlineAfterFirstChunk(uint64_t after_ns, double min_fraction) {
    deadline_after_ns_ = after_ns;
    deadline_min_fraction_ = min_fraction;
  }

  // Datapath: a ROUND_BEGIN. The open round takes its p (and deadline,
  // relative to now) at once; a newer round's is kept for its Begin; an
  // older one is ignored.
  void Announce(const RoundBeginEvent& e, uint64_t now_ns);

  // Datapath: one frame (bytes after the UDP header). On kAccepted,
  // `consume(header, payload)` takes the chunk (copy or accumulate).
  template <class Consume>
  [[gnu::always_inline]] Verdict OnFrame(const uint8_t* buf, size_t len,
                                         Consume&& consume) {
    DataHeader h;
    const uint8_t* payload = nullptr;
    const Verdict v = rx_.OnFrame(buf, len, &h, &payload);
    if (v == Verdict::kAccepted) consume(h, payload);
    return v;
  }

  // Datapath, once per loop turn: STOP once the round's current p (or its
  // deadline) is met; the BITMAP answer to a PROBE once the queues drained.
  // Returns true if it asked for anything.
  template <ControlOutbox Outbox>
  bool Step(uint64_t now_ns, const RxProgress& rx, Outbox& outbox);

  // Datapath: the round is over; its later frames count as late.
  void Close() { rx_.Close(); }

  // Any thread (control): sender lane `lane`'s PROBE for `round`.
  // PROBEs of one round that arrive before the datapath picks them up are
  // answered together, each lane with its own BITMAP.
  void ProbeArrived(uint32_t round, uint16_t lane = 0) {
    probe_askers_.fetch_or(uint64_t{1} << (lane % 64),
                           std::memory_order_relaxed);
    probe_word_.store((static_cast<uint64_t>(round) << 1) | 1,
                      std::memory_order_release);
  }
  // Control: the BITMAP a BitmapRequest refers to; Release() once sent.
  BitmapMailbox& answer() { return answer_; }
  const BitmapMailbox& answer() const { return answer_; }

  // The round's STOP went out (the side needs nothing more).
  bool stopped() const {
    return config_.group ? config_.group->taken(rx_.round())
                         : rx_.stop_taken();
  }
  uint64_t stop_ns() const { return stop_ns_; }
  // The loop turn that first saw a chunk of the open round (0: none yet).
  uint64_t first_ns() const { return first_ns_; }
  // Datapath: grows with every chunk that set a new bit, every round
  // begun and every STOP; never with a duplicate, a stranger's frame or a
  // retransmission of what already arrived. The loops' watchdog compares
  // it between turns (round_pacer.h).
  uint64_t progress() const { return progress_base_ + rx_.received() + stops_; }
  const ReceiverRound& receiver() const { return rx_; }
  ReceiverRound& receiver() { return rx_; }
  const ReceiveSideConfig& config() const { return config_; }
  uint64_t stops_sent() const { return stops_; }

 private:
  void Apply(const RoundBeginEvent& e, uint64_t now_ns);
  StopTrigger PollStop(uint64_t now_ns, uint32_t* received);
  bool AnswerProbe();

  ReceiveSideConfig config_;
  ReceiverRound rx_;                     // datapath: owner; control: ro
  BitmapMailbox answer_;                 // datapath -> control
  std::atomic<uint64_t> probe_word_{0};  // control: wo; datapath: exchanges
  std::atomic<uint64_t> probe_askers_{0};  // control: or; datapath: exchanges
  // Datapath only.
  bool probe_pending_ = false;
  uint32_t probe_round_ = 0;
  uint64_t askers_ = 0;  // sender lanes whose PROBE is pending
  uint64_t probe_gen_ = 0;
  bool poll_stop_ = false;  // a new p may stop the round with no arrival
  bool begun_ = false;
  bool have_early_ = false;
  RoundBeginEvent early_;   // a ROUND_BEGIN ahead of its Begin
  uint64_t stop_ns_ = 0;
  uint64_t first_ns_ = 0;
  uint64_t deadline_after_ns_ = 0;  // DeadlineAfterFirstChunk's, until armed
  double deadline_min_fraction_ = 0;
  uint64_t stops_ = 0;
  uint64_t progress_base_ = 0;  // progress() of the rounds before this one
  Bitmap snapshot_;
};

template <ControlOutbox Outbox>
bool ReceiveSide::Step(uint64_t now_ns, const RxProgress& rx,
                       Outbox& outbox) {
  bool asked = false;
  if (first_ns_ == 0 && rx_.received() > 0) {
    first_ns_ = now_ns;
    if (deadline_after_ns_ != 0) {
      rx_.SetDeadline(now_ns + deadline_after_ns_, deadline_min_fraction_);
      deadline_after_ns_ = 0;
    }
  }
  if (rx.arrivals || poll_stop_ || rx_.deadline_ns() != 0) {
    poll_stop_ = false;
    uint32_t received = 0;
    const StopTrigger t = PollStop(now_ns, &received);
    if (t != StopTrigger::kNone) {
      stop_ns_ = now_ns;
      ++stops_;
      outbox.Post(StopRequest{config_.peer, config_.direction, t, rx_.round(),
                              received});
      asked = true;
    }
  }
  if (probe_word_.load(std::memory_order_relaxed) != 0) {
    const uint64_t w = probe_word_.exchange(0, std::memory_order_acquire);
    if (w != 0) {
      const uint32_t round = static_cast<uint32_t>(w >> 1);
      if (!probe_pending_ || round != probe_round_) askers_ = 0;
      askers_ |= probe_askers_.exchange(0, std::memory_order_acquire);
      probe_pending_ = true;
      probe_round_ = round;
      probe_gen_ = rx.poll_gen;
    }
  }
  // A busy answer slot (the control thread has not sent the last answer
  // yet) keeps the PROBE pending for the next turn rather than losing it.
  if (probe_pending_ && rx.drained_gen > probe_gen_ && !answer_.ready()) {
    probe_pending_ = false;
    if (askers_ != 0 && AnswerProbe()) {
      outbox.Post(BitmapRequest{config_.peer, config_.direction, config_.lane,
                                probe_round_, askers_});
      asked = true;
    }
    askers_ = 0;
  }
  return asked;
}

// The two receive sides every job has, by name. A worker's side for a
// server's broadcast over `layout` (the server's partition, local seqs):
// frames from the server only, tags under `key`.
inline ReceiveSideConfig BroadcastReceiveConfig(uint32_t session,
                                                const ChunkLayout& layout,
                                                const FrameKey& key = {}) {
  return ReceiveSideConfig{
      .receiver = ReceiverConfig{.session = session,
                                 .expected_type = FrameType::kBroadcast,
                                 .expected_sender = kServerRank,
                                 .layout = layout,
                                 .frame_key = key},
      .direction = Direction::kBroadcast,
      .peer = 0};
}

// A server's side for worker `w`'s push over `layout`, tags under `key`.
inline ReceiveSideConfig PushReceiveConfig(uint32_t session, uint16_t w,
                                           const ChunkLayout& layout,
                                           const FrameKey& key = {}) {
  return ReceiveSideConfig{
      .receiver = ReceiverConfig{.session = session,
                                 .expected_type = FrameType::kPush,
                                 .expected_sender = w,
                                 .layout = layout,
                                 .frame_key = key},
      .direction = Direction::kPush,
      .peer = w};
}

}  // namespace dblp

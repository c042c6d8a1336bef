// The one poll loop of every transport's datapath (testpmd's
// run_pkt_fwd_on_lcore, with the transport's turn plugged in): the DPDK
// lcores of both apps, the kernel-UDP threads. Each turn reads the clock
// once and runs the transport's `turn`, which polls and steps and says
// whether the wait is over; between turns RoundPacer decides (idle
// back-off, the no-progress watchdog, a signal). The transport keeps what
// a turn does and what counts as progress; the loop, its order and its
// endings are written here once.
#pragma once

#include <cstdint>

#include "dblp/base/round_pacer.h"

namespace dblp {

// What one turn did.
struct PollTurn {
  enum class Then : uint8_t {
    kGoOn,    // the wait goes on
    kDone,    // what the loop waits for happened
    kFailed,  // the turn failed (its text is the transport's)
  };
  bool work = false;  // anything received, sent or handled: ends back-off
  Then then = Then::kGoOn;
};

// How a PollUntil ended.
enum class PollEnd : uint8_t { kDone, kFailed, kQuit, kTimedOut };

// Runs turns until one says done or failed, a signal asks to quit, or the
// watchdog fires and `resume` declines to go on.
//   now()           the clock, read once per turn
//   turn(now)       one turn: PollTurn
//   progress()      a mark that grows with what moves the job (never with a
//                   retransmission or a stranger's frame): the watchdog
//                   compares it between turns
//   patience(moved) how many timeouts this turn's wait may take
//                   (RoundPacer::After)
//   resume(now)     the watchdog fired: true to go on (the watchdog
//                   restarts from `now`), false to end with kTimedOut
template <class Clock, class Turn, class Progress, class Patience, class Resume>
PollEnd PollUntil(RoundPacer& pacer, Clock&& now, Turn&& turn,
                  Progress&& progress, Patience&& patience, Resume&& resume) {
  pacer.Start(now());
  uint64_t mark = progress();
  for (;;) {
    const uint64_t t = now();
    const PollTurn r = turn(t);
    if (r.then == PollTurn::Then::kDone) return PollEnd::kDone;
    if (r.then == PollTurn::Then::kFailed) return PollEnd::kFailed;
    const uint64_t next = progress();
    const bool moved = next != mark;
    mark = next;
    switch (pacer.After(r.work, moved, t, patience(moved))) {
      case RoundPacer::Step::kContinue:
        continue;
      case RoundPacer::Step::kQuit:
        return PollEnd::kQuit;
      case RoundPacer::Step::kTimedOut:
        if (!resume(t)) return PollEnd::kTimedOut;
        pacer.Start(t);
        continue;
    }
  }
}

// The watchdog's default: one timeout ends the wait.
inline uint32_t OneTimeout(bool /*moved*/) { return 1; }
inline bool NeverResume(uint64_t /*now_ns*/) { return false; }

}  // namespace dblp

// The software loss injector on the receiving side of a direction, shared
// by the DPDK apps and the kernel-UDP ones: a frame it drops has crossed the
// link, so the sender paid for it as on a lossy wire, and it is discarded
// before the protocol sees it. A burst follows the frame's own iteration
// (round / 2), so a frame of the next iteration that arrives early is judged
// by that iteration's schedule.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dblp/emul/loss_model.h"
#include "dblp/obs/app_state.h"
#include "dblp/wire/wire.h"

namespace dblp {

class RxLossInjector {
 public:
  RxLossInjector(const LossSpec& base, const BurstSchedule& bursts,
                 uint64_t seed)
      : injector_(base, bursts, seed), has_window_(bursts.HasWindow()) {}

  // `dblp` is the UDP payload of a frame. A frame too short to carry a
  // round is never dropped here: the protocol counts it malformed.
  [[gnu::always_inline]] bool ShouldDrop(const uint8_t* dblp, size_t len,
                                         uint64_t now_ns) {
    if (len < kDataHeaderBytes) return false;
    const uint8_t* r = dblp + offsetof(DataHeaderWire, round_be);
    const uint32_t round = (uint32_t{r[0]} << 24) | (uint32_t{r[1]} << 16) |
                           (uint32_t{r[2]} << 8) | uint32_t{r[3]};
    return ShouldDropRound(round, now_ns);
  }
  // The same for a frame whose header's round (host order) is `round`.
  [[gnu::always_inline]] bool ShouldDropRound(uint32_t round, uint64_t now_ns) {
    const uint64_t it = round / 2;
    // An iteration with no loss to inject (the common case): the injector
    // would only count the frame.
    if (it == quiet_it_) [[likely]] {
      injector_.PassQuiet();
      return false;
    }
    if (it != iteration_) {
      iteration_ = it;
      injector_.SetIteration(it);
      if (injected_ != nullptr) {
        double loss = 0;
        injector_.SetInjectedBurst(injected_->Covers(it, &loss) ? loss : 0);
      }
      quiet_it_ = injector_.Quiet() ? it : kNoIteration;
    }
    if (has_window_) injector_.SetTimeNs(now_ns - start_ns_);
    return injector_.ShouldDrop();
  }
  void StartClock(uint64_t now_ns) { start_ns_ = now_ns; }
  bool InBurst(uint64_t iteration) const {
    double loss = 0;
    return injector_.bursts().Contains(iteration) ||
           (injected_ != nullptr && injected_->Covers(iteration, &loss));
  }
  // The runtime bursts (`inject burst`) this injector adds to its
  // schedule; read when the frames' iteration changes, never per frame.
  void set_injected(const InjectedBurst* b) { injected_ = b; }
  uint64_t dropped() const { return injector_.dropped(); }
  uint64_t considered() const { return injector_.considered(); }

 private:
  LossInjector injector_;
  bool has_window_;
  const InjectedBurst* injected_ = nullptr;
  static constexpr uint64_t kNoIteration = UINT64_MAX;  // round / 2 never is
  uint64_t iteration_ = kNoIteration;                   // none seen yet
  uint64_t quiet_it_ = kNoIteration;  // iteration_ while the injector is quiet
  uint64_t start_ns_ = 0;
};

}  // namespace dblp

// In-memory loopback fabric: endpoints with bounded receive rings, a
// software loss injector per sending endpoint, and hooks to capture and
// re-inject frames (to replay stale rounds). Single-threaded by design: the
// in-memory cluster drives every endpoint from one thread, deterministically.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "dblp/emul/loss_model.h"
#include "dblp/transport/transport.h"

namespace dblp {

class LoopbackFabric;

class LoopbackPort {
 public:
  uint16_t TxBurst(Packet* pkts, uint16_t n);
  uint16_t RxBurst(Packet* out, uint16_t max);

  uint32_t id() const { return id_; }
  // Loss applied to every frame this port sends (nullptr: none). Not owned.
  void set_loss(LossInjector* loss) { loss_ = loss; }
  size_t rx_pending() const { return rx_.size(); }

  uint64_t tx_frames() const { return tx_frames_; }
  uint64_t rx_frames() const { return rx_frames_; }
  uint64_t injected_drops() const { return injected_drops_; }
  // Frames lost because this port's receive ring was full (a device drop).
  uint64_t ring_drops() const { return ring_drops_; }

 private:
  friend class LoopbackFabric;
  LoopbackPort(LoopbackFabric* fabric, uint32_t id, size_t ring_size)
      : fabric_(fabric), id_(id), ring_size_(ring_size) {}
  bool Enqueue(Packet&& p);

  LoopbackFabric* fabric_;
  uint32_t id_;
  size_t ring_size_;
  LossInjector* loss_ = nullptr;
  std::deque<Packet> rx_;
  uint64_t tx_frames_ = 0, rx_frames_ = 0, injected_drops_ = 0,
           ring_drops_ = 0;
};

static_assert(BurstTransport<LoopbackPort>);

class LoopbackFabric {
 public:
  // `ring_size`: frames each endpoint's receive ring holds before dropping.
  LoopbackFabric(uint32_t endpoints, size_t ring_size);

  LoopbackPort& port(uint32_t id) { return *ports_.at(id); }
  uint32_t size() const { return static_cast<uint32_t>(ports_.size()); }

  // Called with every frame a port sends, before loss is applied.
  void set_tap(std::function<void(const Packet&)> tap) { tap_ = std::move(tap); }

  // Puts a frame straight into `dst`'s receive ring (no loss): replays,
  // malformed frames and other hostile input in tests.
  bool Inject(uint32_t dst, Packet p);

 private:
  friend class LoopbackPort;
  std::vector<std::unique_ptr<LoopbackPort>> ports_;
  std::function<void(const Packet&)> tap_;
};

}  // namespace dblp

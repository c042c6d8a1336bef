#include "dblp/transport/loopback_transport.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace dblp {

LoopbackFabric::LoopbackFabric(uint32_t endpoints, size_t ring_size) {
  if (endpoints == 0 || ring_size == 0) {
    throw std::invalid_argument(
        "loopback fabric needs at least one endpoint and a ring of 1+");
  }
  for (uint32_t i = 0; i < endpoints; ++i) {
    ports_.emplace_back(new LoopbackPort(this, i, ring_size));
  }
}

bool LoopbackFabric::Inject(uint32_t dst, Packet p) {
  p.dst = dst;
  return port(dst).Enqueue(std::move(p));
}

bool LoopbackPort::Enqueue(Packet&& p) {
  if (rx_.size() >= ring_size_) {
    ++ring_drops_;
    return false;
  }
  rx_.push_back(std::move(p));
  return true;
}

uint16_t LoopbackPort::TxBurst(Packet* pkts, uint16_t n) {
  for (uint16_t i = 0; i < n; ++i) {
    Packet& p = pkts[i];
    p.src = id_;
    if (p.dst >= fabric_->size()) {
      throw std::out_of_range("loopback: no endpoint " + std::to_string(p.dst));
    }
    ++tx_frames_;
    if (fabric_->tap_) fabric_->tap_(p);
    if (loss_ != nullptr && loss_->ShouldDrop()) {
      ++injected_drops_;
      continue;
    }
    fabric_->port(p.dst).Enqueue(std::move(p));  // a full ring counts there
  }
  return n;
}

uint16_t LoopbackPort::RxBurst(Packet* out, uint16_t max) {
  uint16_t k = 0;
  while (k < max && !rx_.empty()) {
    out[k++] = std::move(rx_.front());
    rx_.pop_front();
  }
  rx_frames_ += k;
  return k;
}

}  // namespace dblp

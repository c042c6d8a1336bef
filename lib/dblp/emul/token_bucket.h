// Token-bucket pacing of a sender's data frames: an emulated link rate, so
// experiments can put communication in the regime of a real testbed (moving
// the gradient costs as much as computing it) on a host whose memif link is
// far faster. Non-blocking: the datapath asks how many frames may leave now
// and keeps polling; it never sleeps inside the bucket.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dblp {

// Bytes a frame occupies on an Ethernet wire besides its L2 frame: preamble
// and start delimiter (8), frame check sequence (4), inter-frame gap (12).
inline constexpr uint32_t kEthernetWireOverhead = 24;

class TokenBucket {
 public:
  TokenBucket() = default;  // unlimited
  // `gbps` of wire rate; `depth_bytes` of burst allowance (at least one
  // frame). gbps <= 0 means unlimited. Throws std::invalid_argument on a
  // non-finite rate or a zero depth.
  TokenBucket(double gbps, uint64_t depth_bytes) {
    if (!(gbps == gbps) || gbps > 1e6) {
      throw std::invalid_argument("link rate " + std::to_string(gbps) +
                                  " Gb/s is not a usable rate");
    }
    if (gbps > 0) {
      if (depth_bytes == 0) {
        throw std::invalid_argument("token bucket depth must be >= 1 byte");
      }
      bytes_per_ns_ = gbps / 8.0;
      depth_ = static_cast<double>(depth_bytes);
      tokens_ = depth_;
    }
  }

  bool unlimited() const { return bytes_per_ns_ == 0; }

  // How many of `want` frames of `frame_bytes` (wire bytes each) may leave
  // at `now_ns`; their tokens are taken. 0 means "not yet".
  uint32_t Admit(uint64_t now_ns, uint32_t frame_bytes, uint32_t want) {
    if (unlimited()) return want;
    if (last_ns_ != 0 && now_ns > last_ns_) {
      tokens_ = std::min(depth_, tokens_ + static_cast<double>(now_ns - last_ns_) *
                                               bytes_per_ns_);
    }
    last_ns_ = now_ns;
    const uint32_t n = static_cast<uint32_t>(
        std::min<double>(want, tokens_ / frame_bytes));
    tokens_ -= static_cast<double>(n) * frame_bytes;
    return n;
  }

  // Gives back tokens of frames admitted but not sent (a full TX ring).
  void Refund(uint32_t frames, uint32_t frame_bytes) {
    if (!unlimited()) {
      tokens_ = std::min(depth_, tokens_ + static_cast<double>(frames) *
                                               frame_bytes);
    }
  }

 private:
  double bytes_per_ns_ = 0;  // 0 = unlimited
  double depth_ = 0;
  double tokens_ = 0;
  uint64_t last_ns_ = 0;
};

}  // namespace dblp

// What the simulator's clock charges (sim/memory_cluster.h): per data frame,
// the CPU of the lcore that sends it and of the lcore that receives it, the
// wire time on the sending and the receiving host's NIC, and per control
// message a one-way delay. The defaults are the model before calibration:
// 10 Gb/s links and no CPU cost. `tools/dblp-bench --calibrate FILE` writes
// measured values (docs/SCALING.md), LoadSimCosts reads them.
#pragma once

#include <cstdint>
#include <string>

#include "dblp/wire/chunking.h"  // header sizes

namespace dblp {

struct SimCosts {
  double tx_ns = 0;      // a sender lcore per data frame (build, copy, TX)
  double rx_ns = 0;      // a receiver lcore per frame (poll, checks, bitmap)
  double reduce_ns = 0;  // a receiver lcore per chunk: add into the sum
                         // (server) or copy into the mean (worker)
  double control_one_way_ns = 10000;  // half a control round trip
  // Each host's NIC, per direction (0: no wire limit, as memif). A frame
  // occupies the sender's link and the receiver's link for its bits plus
  // kWireOverheadBytes; many workers into one server link is the incast.
  double worker_gbps = 10;
  double server_gbps = 10;
  // 0: every process has lcores of its own. N > 0: all of the job's
  // processes share N cores (a check on one small host), so a turn also
  // lasts at least the CPU work of every process divided by N.
  uint32_t host_cores = 0;
};

// Preamble and start delimiter (8), FCS (4) and inter-frame gap (12): what
// a frame takes on an Ethernet wire beyond its bytes.
inline constexpr uint32_t kWireOverheadBytes = 24;

// The link rate at which a full frame of IP MTU `mtu` takes `frame_ns` on
// the wire (0 when frame_ns is 0: no wire limit), for the older flag that
// gave the wire time per frame.
inline double LinkGbpsForFrameNs(double frame_ns, uint32_t mtu) {
  return frame_ns > 0
             ? 8.0 * (mtu + kEthernetHeaderBytes + kWireOverheadBytes) /
                   frame_ns
             : 0;
}

// Reads a calibration file (a flat JSON object of numbers, the keys of
// SimCosts: tx_ns, rx_ns, reduce_ns, control_one_way_ns; link rates and
// host_cores are optional) into *costs, keeping the fields it lacks.
// Returns "" or why it could not, naming the file.
std::string LoadSimCosts(const std::string& path, SimCosts* costs);

}  // namespace dblp

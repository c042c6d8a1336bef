// Options both apps' engines take: ports, pools, the loss injector on the
// frames this app receives, pacing and outputs.
#pragma once

#include <cstdint>
#include <string>

#include "dblp/base/deep_idle.h"
#include "dblp/emul/loss_model.h"
#include "dblp/obs/run_report.h"
#include "dblp/round/send_order.h"
#include "port/port.h"

namespace dblp {

struct DatapathOptions {
  PortOptions port;      // server: applied to every port
  uint32_t mbufs = 0;    // 0 = sized from the ports
  uint32_t burst = 32;   // frames per TX burst
  double link_gbps = 0;  // emulated link rate of data TX; 0 = line rate
  LossSpec loss;         // frames this app receives, outside bursts
                         // (dropped at RX after crossing the link)
  BurstSchedule bursts;
  uint64_t seed = 1;  // loss injector and send order
  SendOrderKind send_order = kDefaultSendOrder;
  uint32_t idle_spin = 512;
  uint32_t idle_sleep_us = 20;
  DeepIdle deep_idle;     // the back-off's second stage (deep_idle.h)
  bool realtime = false;  // datapath lcore under SCHED_FIFO
  // Software prefetch on the hot paths: the next chunk of the gradient on
  // TX, the next frames' headers and sum slices on RX.
  bool prefetch = true;
  // A worker's push frames point into the gradient (a header mbuf chained
  // to an external-buffer segment over the chunk) instead of copying it
  // (--tx_payload=extbuf; needs PortOptions::multi_seg_tx).
  bool tx_extbuf = false;
  double stats_period_s = 1.0;
  uint32_t round_timeout_ms = 30000;  // no progress this long: fail clearly
  std::string out_dir;
  RowsOnError rows_on_error = RowsOnError::kFail;  // a row not written
};

}  // namespace dblp

// dblp-server's engine: admits N workers over the control sidecar, then per
// iteration receives every worker's push under the current p, reduces,
// runs the tolerance policy on the mean's norm and broadcasts the mean.
#pragma once

#include <cstdint>
#include <string>

#include "dblp/loss_fill.h"
#include "dblp/loss_model.h"
#include "dblp/send_order.h"
#include "dblp/tolerance.h"
#include "port.h"

namespace dblp {

struct ServerOptions {
  std::string listen = "127.0.0.1:9100";  // TCP control address
  uint32_t workers = 3;
  std::string local_ip = "10.0.0.1";
  uint16_t udp_port = 47000;   // pushes arrive here; worker r gets +1+r
  PortOptions port;            // applied to every port (port_id ignored)
  uint32_t mbufs = 0;          // 0 = sized from the ports
  uint32_t burst = 32;
  PolicyConfig policy;
  FillMode push_fill = FillMode::kZero;
  bool reliable_broadcast = false;  // broadcast with p = 0
  bool continue_on_worker_loss = false;
  LossSpec loss;               // broadcast direction (server TX)
  BurstSchedule bursts;
  uint64_t loss_seed = 1;
  SendOrderKind send_order = kDefaultSendOrder;
  uint64_t order_seed = 1;
  uint32_t session = 0;        // 0 = derived from the clock
  uint32_t idle_spin = 512;
  uint32_t idle_sleep_us = 20;
  double stats_period_s = 1.0;
  uint32_t join_timeout_ms = 60000;
  uint32_t round_timeout_ms = 30000;
  std::string out_dir;
  std::string dump_dir;
  uint32_t dump_iterations = 0;
};

int RunServer(const ServerOptions& opts);

}  // namespace dblp

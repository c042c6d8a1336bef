#include "dblp/job/worker_row.h"

#include <algorithm>
#include <cstdint>

namespace dblp {

IterationRecord WorkerRow(const WorkerExchange& x) {
  IterationRecord r;
  r.iteration = x.iteration;
  r.rank = x.rank;
  uint64_t begin = UINT64_MAX, done = 0;
  double rtt_sum = 0;
  int rtt_n = 0;
  for (const SendSide* side : x.push) {
    begin = std::min(begin, side->begin_ns());
    done = std::max(done, side->done_ns());
    r.passes = std::max(r.passes, side->sender().passes());
    r.packets_sent += side->sender().packets_sent();
    r.packets_resent += side->sender().packets_resent();
    if (side->mean_rtt_us() > 0) {
      rtt_sum += side->mean_rtt_us();
      ++rtt_n;
    }
  }
  auto us = [](uint64_t from, uint64_t to) {
    return to > from ? static_cast<double>(to - from) / 1e3 : 0.0;
  };
  if (!x.push.empty()) r.send_latency_us = us(begin, done);
  r.bcast_latency_us = us(done, x.bcast_done_ns);
  r.control_rtt_us = rtt_n ? rtt_sum / rtt_n : 0;
  r.delivered_fraction = x.delivered_fraction;
  r.p = x.p;
  r.critical = x.critical;
  r.burst = x.burst;
  r.resync = x.resync;
  return r;
}

}  // namespace dblp

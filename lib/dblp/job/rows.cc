#include "dblp/job/rows.h"

#include <algorithm>
#include <cstdint>

namespace dblp {
namespace {

double Us(uint64_t from, uint64_t to) {
  return to > from ? static_cast<double>(to - from) / 1e3 : 0.0;
}

// One direction's sends over its shards' sides.
struct SendTotals {
  uint64_t begin_ns = UINT64_MAX;
  uint64_t done_ns = 0;
  uint32_t passes = 0;
  uint64_t sent = 0, resent = 0;
  double rtt_us = 0;  // mean over the sides that probed
};

SendTotals Totals(std::span<const SendSide* const> sides) {
  SendTotals t;
  double rtt_sum = 0;
  int rtt_n = 0;
  for (const SendSide* side : sides) {
    t.begin_ns = std::min(t.begin_ns, side->begin_ns());
    t.done_ns = std::max(t.done_ns, side->done_ns());
    t.passes = std::max(t.passes, side->sender().passes());
    t.sent += side->sender().packets_sent();
    t.resent += side->sender().packets_resent();
    if (side->mean_rtt_us() > 0) {
      rtt_sum += side->mean_rtt_us();
      ++rtt_n;
    }
  }
  t.rtt_us = rtt_n ? rtt_sum / rtt_n : 0;
  return t;
}

}  // namespace

IterationRecord WorkerRow(const WorkerExchange& x) {
  IterationRecord r;
  r.iteration = x.iteration;
  r.rank = x.rank;
  const SendTotals t = Totals(x.push);
  if (!x.push.empty()) r.send_latency_us = Us(t.begin_ns, t.done_ns);
  r.bcast_latency_us = Us(t.done_ns, x.bcast_done_ns);
  r.passes = t.passes;
  r.packets_sent = t.sent;
  r.packets_resent = t.resent;
  r.control_rtt_us = t.rtt_us;
  r.delivered_fraction = x.delivered_fraction;
  r.p = x.p;
  r.critical = x.critical;
  r.burst = x.burst;
  r.resync = x.resync;
  return r;
}

IterationRecord ServerPushRow(const ServerPush& x) {
  IterationRecord r;
  r.iteration = x.iteration;
  r.rank = x.rank;
  r.send_latency_us = Us(x.open_ns, x.stop_ns);
  r.delivered_fraction = x.delivered_fraction;
  r.p = x.tolerance.p;
  r.critical = x.tolerance.critical;
  r.grad_norm = x.grad_norm;
  r.burst = x.burst;
  r.resync = x.resync;
  r.worker_norm = x.worker_norm;
  r.bad_chunks = x.bad_chunks;
  r.clipped_chunks = x.clipped_chunks;
  r.clr_nonfinite = x.clr_nonfinite;
  return r;
}

void AddBroadcastToRow(std::span<const SendSide* const> bcast,
                       IterationRecord* row) {
  const SendTotals t = Totals(bcast);
  row->bcast_latency_us = bcast.empty() ? 0 : Us(t.begin_ns, t.done_ns);
  row->bcast_passes = t.passes;
  row->packets_sent = t.sent;
  row->packets_resent = t.resent;
  row->control_rtt_us = t.rtt_us;
}

}  // namespace dblp

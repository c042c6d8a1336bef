#include "server/server_report.h"

#include <algorithm>
#include <string>

#include "dblp/job/counters.h"
#include "dblp/job/rows.h"
#include "port/datapath.h"
#include "port/port.h"

namespace dblp {

void AddServerCounters(const std::vector<std::unique_ptr<LcoreConf>>& lcs,
                       const ServerControl& control, const LinkGrid& links,
                       uint16_t nb_ports, RunReport* report) {
  auto sum = [&](auto field) {
    uint64_t t = 0;
    for (const auto& lc : lcs) t += (lc->counters.*field).load();
    return t;
  };
  using C = DatapathCounters;
  report->counters = {
      {"rx_frames", sum(&C::rx_frames)},
      {"tx_frames", sum(&C::tx_frames)},
      {"injected_drops", sum(&C::injected_drops)},
      {"tx_ring_full", sum(&C::tx_ring_full)},
      {"mbuf_alloc_failures", sum(&C::mbuf_alloc_failures)},
      {"frames_from_lost_workers", sum(&C::from_lost_worker)},
      {"control_messages_in", control.messages_in()},
      {"control_messages_out", control.messages_out()},
      {"control_protocol_errors", control.protocol_errors()},
      {"frames_unpinned_source", sum(&C::unpinned_source)},
      {"control_auth_failures", control.auth_failures()},
      {"control_refused_joins", control.refused_joins()},
      {"control_out_of_state", control.out_of_state()},
      {"control_connections_refused", control.connections_refused()},
      {"control_connections_evicted", control.connections_evicted()},
      {"control_join_timeouts", control.join_timeouts()},
  };
  auto over_links = [&](auto fn) {
    uint64_t t = 0;
    for (const auto& shard : links) {
      for (const auto& l : shard) t += fn(*l);
    }
    return t;
  };
  report->counters.emplace_back("frames_misrouted", sum(&C::misrouted));
  report->counters.emplace_back("frames_handoff_full", sum(&C::handoff_full));
  if (lcs.size() > 1) {
    // Per lcore: frames of other lcores' ranges that landed on its queue.
    for (size_t k = 0; k < lcs.size(); ++k) {
      report->counters.emplace_back(
          "frames_misrouted_lcore" + std::to_string(k),
          lcs[k]->counters.misrouted.load());
    }
  }
  std::vector<const ReceiverRound*> receivers;
  for (const auto& shard : links) {
    for (const auto& l : shard) receivers.push_back(&l->push.receiver());
  }
  AddReceiverCounters("push_", receivers, true, &report->counters);
  for (int s = 1; s < kNumFrameStatus; ++s) {
    uint64_t t = 0;
    for (const auto& lc : lcs) t += lc->counters.frame_drops[s].load();
    report->counters.emplace_back(
        std::string("frame_") + FrameStatusName(static_cast<FrameStatus>(s)),
        t);
  }
  PortDrops total{};
  for (uint16_t p = 0; p < nb_ports; ++p) {
    const PortDrops d = ReadPortDrops(p);
    total.imissed += d.imissed;
    total.rx_nombuf += d.rx_nombuf;
    total.oerrors += d.oerrors;
  }
  report->counters.emplace_back(
      "bitmaps_dropped", over_links([](const ServerLink& l) {
        return l.bcast.bitmaps_dropped() + l.push.answer().dropped();
      }));
  report->counters.emplace_back("device_imissed", total.imissed);
  report->counters.emplace_back("device_rx_nombuf", total.rx_nombuf);
  report->counters.emplace_back("device_oerrors", total.oerrors);
}

}  // namespace dblp

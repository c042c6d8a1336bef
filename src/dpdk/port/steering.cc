#include "port/steering.h"

#include <rte_byteorder.h>
#include <rte_errno.h>
#include <rte_flow.h>

#include <vector>

#include "runtime/eal_app.h"

namespace dblp {

bool ParseSteeringMode(const std::string& s, SteeringMode* mode) {
  if (s == "auto") {
    *mode = SteeringMode::kAuto;
  } else if (s == "flow") {
    *mode = SteeringMode::kFlow;
  } else if (s == "rss") {
    *mode = SteeringMode::kRss;
  } else {
    return false;
  }
  return true;
}

const char* SteeringModeName(SteeringMode m) {
  switch (m) {
    case SteeringMode::kAuto:
      return "auto";
    case SteeringMode::kFlow:
      return "flow";
    case SteeringMode::kRss:
      return "rss";
  }
  return "?";
}

namespace {

std::string FlowError(const char* call, const rte_flow_error& err) {
  std::string s = call;
  s += ": ";
  s += err.message != nullptr ? err.message : "refused";
  s += " (";
  s += rte_strerror(rte_errno);
  s += ")";
  return s;
}

// ETH / IPV4 dst=ipv4 / UDP dst=udp -> QUEUE queue. Validated first;
// nullptr with *why when the port refuses it.
rte_flow* CreateQueueRule(uint16_t port, uint32_t ipv4, uint16_t udp,
                          uint16_t queue, std::string* why) {
  rte_flow_attr attr{};
  attr.ingress = 1;
  rte_flow_item_ipv4 ip_spec{}, ip_mask{};
  ip_spec.hdr.dst_addr = rte_cpu_to_be_32(ipv4);
  ip_mask.hdr.dst_addr = UINT32_MAX;
  rte_flow_item_udp udp_spec{}, udp_mask{};
  udp_spec.hdr.dst_port = rte_cpu_to_be_16(udp);
  udp_mask.hdr.dst_port = UINT16_MAX;
  rte_flow_item pattern[4]{};
  pattern[0].type = RTE_FLOW_ITEM_TYPE_ETH;
  pattern[1].type = RTE_FLOW_ITEM_TYPE_IPV4;
  pattern[1].spec = &ip_spec;
  pattern[1].mask = &ip_mask;
  pattern[2].type = RTE_FLOW_ITEM_TYPE_UDP;
  pattern[2].spec = &udp_spec;
  pattern[2].mask = &udp_mask;
  pattern[3].type = RTE_FLOW_ITEM_TYPE_END;
  rte_flow_action_queue to{};
  to.index = queue;
  rte_flow_action actions[2]{};
  actions[0].type = RTE_FLOW_ACTION_TYPE_QUEUE;
  actions[0].conf = &to;
  actions[1].type = RTE_FLOW_ACTION_TYPE_END;
  rte_flow_error err{};
  if (rte_flow_validate(port, &attr, pattern, actions, &err) != 0) {
    *why = FlowError("rte_flow_validate", err);
    return nullptr;
  }
  rte_flow* flow = rte_flow_create(port, &attr, pattern, actions, &err);
  if (flow == nullptr) *why = FlowError("rte_flow_create", err);
  return flow;
}

// One rule per queue, all or none. "" when installed, else why not.
std::string InstallRules(uint16_t port, uint16_t queues, uint32_t ipv4,
                         uint16_t base) {
  std::vector<rte_flow*> made;
  for (uint16_t k = 0; k < queues; ++k) {
    std::string why;
    rte_flow* f =
        CreateQueueRule(port, ipv4, static_cast<uint16_t>(base + k), k, &why);
    if (f == nullptr) {
      for (rte_flow* g : made) {
        rte_flow_error err{};
        rte_flow_destroy(port, g, &err);
      }
      return "queue " + std::to_string(k) + ": " + why;
    }
    made.push_back(f);
  }
  return "";
}

std::string DescribeRss(const PortCaps& caps) {
  if ((caps.rss_hf & RTE_ETH_RSS_UDP) != 0) {
    return "RSS on IPv4/UDP ports";
  }
  if (caps.rss_hf != 0) {
    return "RSS on IPv4 addresses (each worker's frames on one queue)";
  }
  return "no RSS: the driver's own spreading (net_af_packet: fanout by "
         "flow hash; else every frame on queue 0)";
}

}  // namespace

void IsolateOrDie(uint16_t port, const std::string& where) {
  rte_flow_error err{};
  if (rte_flow_isolate(port, 1, &err) != 0) {
    Die(where + ": " + FlowError("rte_flow_isolate", err),
        "drop --flow_isolate (the port then takes every frame), or use a "
        "NIC whose driver has isolated mode (mlx5, or net_tap)");
  }
}

SteeringResult SteerOrDie(uint16_t port, const PortCaps& caps, uint16_t queues,
                          uint32_t local_ipv4, uint16_t udp_base,
                          const SteeringOptions& opts) {
  const std::string where =
      "port " + std::to_string(port) + " (" + caps.driver + ")";
  SteeringResult r;
  if (caps.driver == "net_memif" && !opts.isolate) {
    r.kind = queues > 1 ? SteeringKind::kQueueMap : SteeringKind::kOneQueue;
    r.describe = "net_memif: queue k reaches queue k";
    return r;
  }
  if (queues == 1 && !opts.isolate) {
    r.describe = "one queue";
    return r;
  }
  std::string refused;
  if (opts.mode != SteeringMode::kRss || opts.isolate) {
    refused = InstallRules(port, queues, local_ipv4, udp_base);
    if (refused.empty()) {
      r.kind = SteeringKind::kFlowRules;
      r.describe = "flow rules: UDP dst " + std::to_string(udp_base) +
                   "+k -> " + "queue k, k < " + std::to_string(queues) +
                   (opts.isolate ? " (isolated)" : "");
      return r;
    }
    if (opts.isolate) {
      Die(where +
              ": --flow_isolate needs flow rules, which the port refused: " +
              refused,
          "drop --flow_isolate and run with --steering=rss (or auto)");
    }
    if (opts.mode == SteeringMode::kFlow) {
      Die(where +
              ": --steering=flow: the port refused its flow rules: " + refused,
          "use --steering=rss (or auto), or a NIC that takes rte_flow queue "
          "rules (net_tap needs the kernel's multiq, flower and skbedit)");
    }
  }
  r.kind = SteeringKind::kRss;
  r.describe = DescribeRss(caps);
  if (!refused.empty())
    r.describe = "flow rules refused (" + refused + "); " + r.describe;
  r.describe +=
      "; a frame on another lcore's queue is handed to it (frames_misrouted)";
  return r;
}

}  // namespace dblp

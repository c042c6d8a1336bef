#include "runtime/numa_placement.h"

#include <numa.h>
#include <numaif.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dblp/base/log.h"

namespace dblp {

int PortNumaNode(uint16_t port) {
  const int socket = rte_eth_dev_socket_id(port);
  if (socket >= 0) return socket;
  return static_cast<int>(rte_socket_id());
}

void WarnLcoresOffNode(int node, const char* app) {
  unsigned lcore;
  RTE_LCORE_FOREACH(lcore) {
    const int on = static_cast<int>(rte_lcore_to_socket_id(lcore));
    if (on != node) {
      DBLP_LOG(Warning,
               "%s: lcore %u is on NUMA node %d, the port on node %d: "
               "its frames cross the interconnect. Pick lcores of node "
               "%d with -l/--lcores (lscpu shows them)",
               app, lcore, on, node, node);
    }
  }
}

bool PlaceOnNode(const void* p, size_t bytes, int node, std::string* error) {
  const bool one_node = numa_available() < 0 || numa_max_node() == 0;
  // One node (or no NUMA support): everything is already there.
  if (one_node && (node == 0 || node == SOCKET_ID_ANY)) return true;
  if (one_node || node < 0 || node > numa_max_node()) {
    *error = "no NUMA node " + std::to_string(node) + " on this machine";
    return false;
  }
  if (bytes == 0) return true;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
  struct bitmask* mask = numa_allocate_nodemask();
  numa_bitmask_setbit(mask, static_cast<unsigned>(node));
  const long rc = mbind(reinterpret_cast<void*>(begin), end - begin, MPOL_BIND,
                        mask->maskp, mask->size + 1, MPOL_MF_MOVE);
  numa_free_nodemask(mask);
  if (rc != 0) {
    *error = std::string("mbind: ") + std::strerror(errno);
    return false;
  }
  return true;
}

void PlaceOnNodeOrWarn(std::span<const float> v, int node, const char* what) {
  std::string error;
  if (PlaceOnNode(v.data(), v.size_bytes(), node, &error)) return;
  DBLP_LOG(Warning,
           "dblp: the %s stays where it was allocated, not on NUMA node "
           "%d (%s): expect slower rounds",
           what, node, error.c_str());
}

}  // namespace dblp

// NUMA placement: a port's mempool, the buffers its lcores stream through
// (gradient, sums, mean) and the lcores themselves belong on the port's
// node. On a one-node machine (every VM here) all of it is a no-op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace dblp {

// The NUMA node of `port` (a PCI device's socket); for a vdev, which has
// none, the node of the calling (main) lcore.
int PortNumaNode(uint16_t port);

// Prints a warning, naming the fix, for each enabled lcore that is not on
// `node`: its frames would cross the interconnect.
void WarnLcoresOffNode(int node, const char* app);

// Moves the pages of [p, p + bytes) to `node` and binds them there (mbind,
// libnuma), so buffers allocated before the port's node was known still
// end up next to it. True on a one-node machine. False, with the reason in
// *error, if the node does not exist or the kernel refuses.
bool PlaceOnNode(const void* p, size_t bytes, int node, std::string* error);

// The same for the buffer `what`; a failure is printed as a warning (the
// job still runs, only slower).
void PlaceOnNodeOrWarn(std::span<const float> v, int node, const char* what);

}  // namespace dblp

#include "udp/udp_common.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <exception>

namespace dblp::udp {

bool CheckCpu(int cpu, std::string* error) {
  if (cpu < 0) return true;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
      (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed))) {
    *error = "CPU " + std::to_string(cpu) +
             " is not available to this "
             "process (" +
             std::to_string(CPU_COUNT(&allowed)) +
             " allowed): pick another CPU, or -1 for no pinning";
    return false;
  }
  return true;
}

bool PinThisThread(int cpu, std::string* error) {
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) {
    *error = "cannot pin the datapath thread to CPU " + std::to_string(cpu) +
             ": " + std::strerror(rc);
    return false;
  }
  return true;
}

std::string CheckCommon(uint32_t mtu, uint32_t round_timeout_ms) {
  try {
    ChunkPayloadForMtu(mtu);
  } catch (const std::exception& e) {
    return std::string("mtu: ") + e.what() + " (use 576..9216, e.g. 1500)";
  }
  if (round_timeout_ms == 0) return "round timeout must be > 0 ms";
  return "";
}

}  // namespace dblp::udp

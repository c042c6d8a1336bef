// Flags both DPDK apps share (job_flags.h: those of every app), defined
// once per executable (each app includes this from its single translation
// unit), and their translation into the engines' option structs. Every bad
// value ends with a message naming the flag and an accepted value.
#pragma once

#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dblp/base/version.h"
#include "job_flags.h"
#include "runtime/app_options.h"
#include "runtime/eal_app.h"

DEFINE_string(checksum, "auto",
              "auto (device offload when offered, else "
              "software; on net_memif, shared memory, UDP checksum 0) | sw | "
              "none (UDP checksum 0)");
DEFINE_bool(prefetch, true,
            "software prefetch on the hot paths (off only "
            "to measure what it buys)");
DEFINE_bool(fused_checksum, true,
            "sum a software UDP checksum while copying "
            "the payload (off only to measure what it buys)");
DEFINE_double(link_gbps, 0,
              "emulated link rate of this app's data frames "
              "in Gb/s (token bucket on TX, wire bytes incl. Ethernet "
              "overhead); 0 = as fast as the port goes");
DEFINE_uint32(rxd, 1024, "RX descriptors per queue");
DEFINE_uint32(txd, 1024, "TX descriptors per queue");
DEFINE_uint32(mbufs, 0, "mbufs in the pool (0 = sized from the ports)");
DEFINE_uint32(idle_spin, 512, "idle back-off: empty polls before sleeping");
DEFINE_bool(realtime, false,
            "run the datapath lcore under SCHED_FIFO (needs "
            "root): for hosts where several DBLP processes share a core, so "
            "a datapath with work preempts one without; keep the idle "
            "back-off on (--idle_sleep_us > 0)");
DEFINE_double(stats_period, 1.0, "seconds between stats lines (0 = none)");

namespace dblp {

// Parses the app's flags (everything after "--") before the EAL starts, so
// `-- --help` and flag errors need no hugepages and no port.
inline void ParseAppFlagsOrDie(int argc, char** argv, const char* usage) {
  gflags::SetUsageMessage(usage);
  gflags::SetVersionString(Version());
  std::vector<char*> app = AppArguments(argc, argv);
  // testpmd's spelling (--cmdline-file) works too: '-' in a flag's name
  // is read as '_' (values are left alone).
  for (size_t k = 1; k < app.size(); ++k) {
    char* a = app[k];
    if (a[0] != '-' || a[1] != '-') continue;
    for (char* c = a + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
  int app_argc = static_cast<int>(app.size());
  char** app_argv = app.data();
  gflags::ParseCommandLineFlags(&app_argc, &app_argv, true);
  if (app_argc > 1) {
    FlagError(std::string("unexpected argument ") + app_argv[1] +
              " (app options go after --, EAL options before)");
  }
  CheckFlagsOrDie();
}

inline PortOptions PortOptionsFromFlags();

// Everything DatapathOptions holds, from the shared flags.
inline DatapathOptions DatapathOptionsFromFlags() {
  DatapathOptions d;
  d.port = PortOptionsFromFlags();
  d.mbufs = FLAGS_mbufs;
  d.burst = FLAGS_burst;
  d.link_gbps = FLAGS_link_gbps;
  if (!(FLAGS_link_gbps >= 0) || FLAGS_link_gbps > 1000) {
    FlagError("--link_gbps must be in [0, 1000] (0 = no pacing)");
  }
  d.loss = LossFromFlags();
  d.bursts = BurstsFromFlags();
  d.seed = FLAGS_seed;
  d.send_order = SendOrderFromFlags();
  d.idle_spin = FLAGS_idle_spin;
  d.idle_sleep_us = FLAGS_idle_sleep_us;
  d.deep_idle = DeepIdleFromFlags();
  d.realtime = FLAGS_realtime;
  d.prefetch = FLAGS_prefetch;
  if (d.realtime && d.idle_sleep_us == 0) {
    FlagError(
        "--realtime needs --idle_sleep_us > 0: a real-time thread that "
        "never sleeps starves everything else on its core");
  }
  d.stats_period_s = FLAGS_stats_period;
  d.round_timeout_ms = FLAGS_round_timeout_ms;
  d.out_dir = FLAGS_out_dir;
  d.rows_on_error = RowsOnErrorFromFlags();
  return d;
}

inline PortOptions PortOptionsFromFlags() {
  PortOptions p;
  p.mtu = FLAGS_mtu;
  p.checksum = FLAGS_checksum;
  p.fused_checksum = FLAGS_fused_checksum;
  p.nb_rxd = static_cast<uint16_t>(FLAGS_rxd);  // <= 65535 (flag_checks.h)
  p.nb_txd = static_cast<uint16_t>(FLAGS_txd);
  if (FLAGS_checksum != "auto" && FLAGS_checksum != "sw" &&
      FLAGS_checksum != "none") {
    FlagError("--checksum=" + FLAGS_checksum + ": use auto, sw or none");
  }
  MtuFromFlags();
  RoundTimeoutFromFlags();
  BurstFromFlags(64);
  return p;
}

}  // namespace dblp

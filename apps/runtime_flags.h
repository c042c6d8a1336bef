// The DPDK apps' operator interfaces: the runtime prompt (-i,
// --cmdline-file), the /dblp/* telemetry commands and packet capture for
// dpdk-dumpcap (src/dpdk/runtime/prompt.h, src/dpdk/runtime/app_telemetry.h).
// Include from the app's single translation unit, after common_flags.h.
#pragma once

#include <gflags/gflags.h>

#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

#include "dblp/obs/app_state.h"
#include "dblp/policy/tolerance.h"
#include "runtime/app_telemetry.h"
#include "runtime/prompt.h"

DEFINE_bool(interactive, false,
            "a command prompt (DPDK cmdline: help, Tab completion) on the "
            "terminal while the job runs: show stats|round|config|lcores|"
            "policy, set p, set policy, inject burst, clear stats, wait, "
            "quit (docs/OPERATIONS.md); the stats line is off unless "
            "--stats_period is given");
DEFINE_bool(i, false, "short for --interactive");
DEFINE_string(cmdline_file, "",
              "replay the prompt's commands from this file (one a line, # "
              "comments; `wait iteration N` acts mid-job), checked line by "
              "line before the EAL starts; with -i the prompt follows");

namespace dblp {

// Before the EAL: the prompt's options, the command file checked against
// `policy` (the server's; nullptr for the worker, which sets nothing).
// With the prompt on the terminal, the periodic stats line is off unless
// --stats_period was given (it would write over the prompt).
inline PromptOptions PromptOptionsFromFlags(const char* app,
                                            const PolicyConfig* policy,
                                            double* stats_period_s) {
  PromptOptions p;
  p.interactive = FLAGS_interactive || FLAGS_i;
  p.file = FLAGS_cmdline_file;
  p.server = policy != nullptr;
  p.app = app;
  if (p.interactive &&
      gflags::GetCommandLineFlagInfoOrDie("stats_period").is_default) {
    *stats_period_s = 0;
  }
  AppState& s = GlobalAppState();
  s.app.store(app);
  s.is_server.store(p.server);
  if (policy != nullptr) {
    PolicySnapshot snap;
    snap.config = *policy;
    snap.known = 1;
    s.policy.Store(snap);
  }
  ValidateCommandFileOrDie(p);
  // Every flag of the app, as parsed (gflags' own flags left out).
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& f : flags) {
    if (f.filename.find("gflags") != std::string::npos) continue;
    std::string value = f.current_value;
    if (f.type == "double") {
      // gflags prints 17 digits (0.0080000000000000002): the shortest
      // text that reads back the same.
      char buf[32];
      const double v = std::strtod(value.c_str(), nullptr);
      const auto res = std::to_chars(buf, buf + sizeof(buf), v);
      value.assign(buf, res.ptr);
    }
    s.config.Add(f.name, value);
  }
  return p;
}

// After rte_eal_init, for the life of the job: telemetry commands, the EAL
// part of /dblp/config, capture, and the prompt (stopped before the EAL is
// cleaned up).
class RuntimeSession {
 public:
  explicit RuntimeSession(const PromptOptions& o) : prompt_(o) {
    PublishEalConfig();
    RegisterTelemetry();
    InitCapture(o.app);
    prompt_.Start();
  }
  ~RuntimeSession() {
    prompt_.Stop();
    UninitCapture();
  }
  RuntimeSession(const RuntimeSession&) = delete;
  RuntimeSession& operator=(const RuntimeSession&) = delete;

 private:
  Prompt prompt_;
};

}  // namespace dblp

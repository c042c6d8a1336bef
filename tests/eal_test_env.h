// The EAL of a DPDK unit-test binary: --no-huge, one lcore, its own
// --file-prefix (the binary's tag and pid: death-test children re-run the
// binary, so each gets a fresh one) and the runtime directory that prefix
// leaves under /var/run/dpdk removed at exit (also after rte_exit in a
// death-test child, which calls exit()).
#pragma once

#include <rte_eal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/eal_app.h"

namespace dblp::testing_env {

inline std::string& RuntimeDir() {
  static std::string dir;
  return dir;
}

inline void RemoveRuntimeDir() {
  // Only a directory this binary's prefix named (never /var/run/dpdk).
  if (RuntimeDir().find("/dblp-test-") == std::string::npos) return;
  std::error_code ec;
  std::filesystem::remove_all(RuntimeDir(), ec);
}

// `tag`: the prefix's middle part (dblp-test-<tag>-<pid>); `extra`: more
// EAL arguments (a --vdev). Dies, as InitEalOrDie, if the EAL fails.
inline void InitTestEal(const char* argv0, const std::string& tag,
                        const std::vector<std::string>& extra = {},
                        const char* memory_mb = "256") {
  std::vector<std::string> eal = {
      argv0,
      "--no-huge",
      "-m",
      memory_mb,
      "--no-pci",
      "--file-prefix=dblp-test-" + tag + "-" + std::to_string(getpid()),
      "--no-telemetry",
      "-l",
      "0",
      "--log-level=*:warning"};
  eal.insert(eal.end(), extra.begin(), extra.end());
  std::vector<char*> eal_argv;
  for (auto& s : eal) eal_argv.push_back(s.data());
  eal_argv.push_back(nullptr);
  InitEalOrDie(static_cast<int>(eal.size()), eal_argv.data());
  RuntimeDir() = rte_eal_get_runtime_dir();
  std::atexit(RemoveRuntimeDir);
}

}  // namespace dblp::testing_env

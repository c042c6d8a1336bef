#include "runtime/app_telemetry.h"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_pdump.h>
#include <rte_telemetry.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "dblp/base/log.h"

namespace dblp {
namespace {

void FillDict(const StateDict& d, rte_tel_data* t) {
  rte_tel_data_start_dict(t);
  for (const StateField& f : d) {
    if (const auto* u = std::get_if<uint64_t>(&f.value)) {
      rte_tel_data_add_dict_u64(t, f.key.c_str(), *u);
    } else {
      // Longer than RTE_TEL_MAX_STRING_LEN: cut (E2BIG), still written.
      rte_tel_data_add_dict_string(t, f.key.c_str(),
                                   std::get<std::string>(f.value).c_str());
    }
  }
}

// The callbacks: snapshots only (lib/dblp/obs/app_state.h), never a lock the
// datapath takes, so the telemetry thread may call them at any rate.
int OnStats(const char*, const char* params, rte_tel_data* d) {
  // "/dblp/stats,total": since the start, ignoring `clear stats`.
  const bool total = params != nullptr && std::strcmp(params, "total") == 0;
  if (params != nullptr && *params != '\0' && !total) return -EINVAL;
  StateDict v;
  for (auto& [k, x] : GlobalAppState().stats.Read(!total)) v.push_back({k, x});
  FillDict(v, d);
  return 0;
}

int OnRound(const char*, const char*, rte_tel_data* d) {
  FillDict(RoundView(GlobalAppState()), d);
  return 0;
}

int OnPolicy(const char*, const char*, rte_tel_data* d) {
  FillDict(PolicyView(GlobalAppState()), d);
  return 0;
}

int OnConfig(const char*, const char*, rte_tel_data* d) {
  FillDict(ConfigView(GlobalAppState()), d);
  return 0;
}

// DPDK 22.11 nests only arrays: without a parameter, "fields" names the
// columns and each lcore id maps to its row; "/dblp/lcores,<id>" gives one
// lcore as a dict.
int OnLcores(const char*, const char* params, rte_tel_data* d) {
  const std::vector<StateDict> lcores = LcoresView(GlobalAppState());
  if (params != nullptr && *params != '\0') {
    char* end = nullptr;
    const unsigned long id = std::strtoul(params, &end, 10);
    if (end == params || *end != '\0') return -EINVAL;
    for (const StateDict& l : lcores) {
      if (std::get<uint64_t>(l.front().value) == id) {
        FillDict(l, d);
        return 0;
      }
    }
    return -EINVAL;
  }
  rte_tel_data_start_dict(d);
  if (lcores.empty()) return 0;
  rte_tel_data* fields = rte_tel_data_alloc();
  if (fields == nullptr) return -ENOMEM;
  rte_tel_data_start_array(fields, RTE_TEL_STRING_VAL);
  for (const StateField& f : lcores.front()) {
    rte_tel_data_add_array_string(fields, f.key.c_str());
  }
  rte_tel_data_add_dict_container(d, "fields", fields, 0);
  for (const StateDict& l : lcores) {
    rte_tel_data* row = rte_tel_data_alloc();
    if (row == nullptr) return -ENOMEM;
    rte_tel_data_start_array(row, RTE_TEL_U64_VAL);
    for (const StateField& f : l) {
      rte_tel_data_add_array_u64(row, std::get<uint64_t>(f.value));
    }
    const std::string key = std::to_string(std::get<uint64_t>(l.front().value));
    rte_tel_data_add_dict_container(d, key.c_str(), row, 0);
  }
  return 0;
}

}  // namespace

void RegisterTelemetry() {
  struct Cmd {
    const char* name;
    telemetry_cb fn;
    const char* help;
  };
  static const Cmd kCmds[] = {
      {"/dblp/stats", OnStats,
       "Every counter of summary.json, published at round boundaries (since "
       "`clear stats`; parameter total: since the start)"},
      {"/dblp/round", OnRound,
       "Iteration, push/broadcast round, p, CLR state, iterations done"},
      {"/dblp/policy", OnPolicy,
       "Tolerance policy: name, parameters, current p"},
      {"/dblp/lcores", OnLcores,
       "Per datapath lcore: lcore id, shard (RX queue), rx/tx frames "
       "(\"fields\" names the columns; parameter: one lcore id)"},
      {"/dblp/config", OnConfig,
       "The app's effective configuration: flags and EAL"},
  };
  for (const Cmd& c : kCmds) {
    if (rte_telemetry_register_cmd(c.name, c.fn, c.help) != 0) {
      DBLP_LOG(Warning, "%s: cannot register telemetry command %s",
               GlobalAppState().app.load(), c.name);
    }
  }
}

void InitCapture(const char* app) {
  if (rte_pdump_init() != 0) {
    DBLP_LOG(Notice,
             "%s: packet capture is off (rte_pdump_init: %s); dpdk-dumpcap "
             "needs a process that serves secondaries: no --in-memory or "
             "--no-shconf, and hugepages for the capture ring",
             app, rte_strerror(rte_errno));
  }
}

void UninitCapture() { rte_pdump_uninit(); }

void PublishEalConfig() {
  ConfigList& c = GlobalAppState().config;
  std::string lcores;
  unsigned id;
  RTE_LCORE_FOREACH(id) {
    if (!lcores.empty()) lcores += ',';
    lcores += std::to_string(id);
  }
  c.Add("eal_lcores", lcores);
  c.Add("eal_main_lcore", std::to_string(rte_get_main_lcore()));
  const std::string dir = rte_eal_get_runtime_dir();
  c.Add("eal_runtime_dir", dir);
  c.Add("eal_file_prefix", dir.substr(dir.find_last_of('/') + 1));
  c.Add("eal_process_type",
        rte_eal_process_type() == RTE_PROC_PRIMARY ? "primary" : "secondary");
  c.Add("eal_hugepages", rte_eal_has_hugepages() ? "yes" : "no");
  c.Add("eal_ports", std::to_string(rte_eth_dev_count_avail()));
}

CounterList ReadXstats(uint16_t port) {
  CounterList out;
  const int n = rte_eth_xstats_get_names(port, nullptr, 0);
  if (n <= 0) return out;
  std::vector<rte_eth_xstat_name> names(static_cast<size_t>(n));
  std::vector<rte_eth_xstat> values(static_cast<size_t>(n));
  if (rte_eth_xstats_get_names(port, names.data(), n) != n) return out;
  const int m = rte_eth_xstats_get(port, values.data(), n);
  if (m <= 0 || m > n) return out;
  for (int i = 0; i < m; ++i) {
    const uint64_t id = values[static_cast<size_t>(i)].id;
    if (id >= static_cast<uint64_t>(n)) continue;
    out.emplace_back(names[id].name, values[static_cast<size_t>(i)].value);
  }
  return out;
}

}  // namespace dblp

// The server's run report, assembled from every lcore's lane of each
// worker's sides: a worker's push bitmap and the job's counters (the rows
// are the ServerJob's).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dblp/obs/run_report.h"
#include "server/server_control.h"
#include "server/server_lcore.h"
#include "server/server_options.h"

namespace dblp {

// The job's counters, summed over lcores, links and ports.
void AddServerCounters(const std::vector<std::unique_ptr<LcoreConf>>& lcs,
                       const ServerControl& control, const LinkGrid& links,
                       uint16_t nb_ports, RunReport* report);

}  // namespace dblp

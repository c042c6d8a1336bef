// dblp-server's datapath, set up in two steps around the join: the ports,
// the pool and each EAL lcore's LcoreConf first (the control plane reports
// their counters), then, once the workers joined and the ServerJob exists,
// each lcore's pacer, loss injector, link-rate buckets and ServerLcore.
// Setup only (Die() names the fix): nothing here runs per packet.
#pragma once

#include <rte_mempool.h>

#include <atomic>
#include <memory>
#include <vector>

#include "dblp/emul/rx_loss.h"
#include "dblp/emul/token_bucket.h"
#include "dblp/job/server_job.h"
#include "port/port.h"
#include "server/server_control.h"
#include "server/server_lcore.h"
#include "server/server_options.h"

namespace dblp {

// The ports and the pool, one RX/TX queue pair per datapath lcore.
struct ServerPorts {
  uint16_t nb_ports = 0;
  rte_mempool* pool = nullptr;
  std::vector<PortCaps> caps;
};
ServerPorts SetupServerPorts(const ServerOptions& o, uint16_t lcores);

// The job before its first round: the lcores' confs, the ports, the
// keys, the control plane, and every worker admitted (the first JOIN's
// gradient size).
struct ServerAdmission {
  std::vector<std::unique_ptr<LcoreConf>> confs;
  ServerPorts ports;
  uint32_t local_ip = 0;
  uint32_t session = 0;
  std::unique_ptr<TolerancePolicy> policy;  // the job's, described in WELCOME
  std::unique_ptr<ServerControl> control;
  uint64_t gradient_bytes = 0;
};
ServerAdmission AdmitServerWorkers(const ServerOptions& o,
                                   const std::atomic<bool>& quit);

// One LcoreConf per EAL lcore (lcore k owns shard k).
std::vector<std::unique_ptr<LcoreConf>> MakeLcoreConfs();

// What a remote lcore runs: its ServerLcore until the job ends.
struct RemoteLcore {
  ServerLcore* lcore = nullptr;
  bool realtime = false;
};

// What each lcore runs and owns.
struct ServerLcores {
  std::vector<std::vector<TokenBucket>> link_rate;  // [lcore][port]
  std::vector<std::unique_ptr<RoundPacer>> pacers;
  // [0] is lcore 0's; each lcore draws its own losses (same schedule).
  std::vector<std::unique_ptr<RxLossInjector>> losses;
  std::unique_ptr<HandoffRings> handoff;  // several lcores only
  std::vector<std::unique_ptr<ServerLcore>> lcores;
  std::vector<RemoteLcore> remote;  // lcores 1..S-1: their launch arguments
};

// What the lcores share, made by the engine before BuildServerLcores.
struct ServerShared {
  const ServerOptions* o = nullptr;
  const ServerPorts* ports = nullptr;
  uint32_t local_ip = 0;
  const ChunkLayout* layout = nullptr;
  const ChunkRanges* lanes = nullptr;
  ServerJob* job = nullptr;
  ServerControl* control = nullptr;
  JobSync* sync = nullptr;
  ServerCoordinator* coordinator = nullptr;
  const std::atomic<bool>* quit = nullptr;
};
ServerLcores BuildServerLcores(
    const ServerShared& s, std::vector<std::unique_ptr<LcoreConf>>& confs,
    std::vector<std::unique_ptr<WorkerState>>& workers, LinkGrid& links);

// Lcores 1..S-1 start their ServerLcore::Run (lcore 0 runs its own).
void LaunchRemoteLcores(ServerLcores& l,
                        const std::vector<std::unique_ptr<LcoreConf>>& confs,
                        bool realtime);

}  // namespace dblp

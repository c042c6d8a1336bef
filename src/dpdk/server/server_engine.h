// dblp-server's engine: admits N workers over the control sidecar, then per
// iteration receives every worker's push under the current p, reduces,
// runs the tolerance policy on the mean's norm and broadcasts the mean.
#pragma once

#include "server/server_options.h"

namespace dblp {

int RunServer(const ServerOptions& opts);

}  // namespace dblp

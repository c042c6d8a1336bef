// dblp-worker's engine: joins the server over the control sidecar, then per
// iteration pushes its gradient (SenderRound, early stop on STOP) and
// receives the server's mean (ReceiverRound, STOP at the current p).
#pragma once

#include <memory>

#include "dblp/handoff/gradient_source.h"
#include "worker/worker_options.h"

namespace dblp {

int RunWorker(const WorkerOptions& opts, std::unique_ptr<GradientSource> src);

}  // namespace dblp

// Test hook of both servers (--dump_dir, --dump_iterations), outside the
// production job: after each of the first `iterations` reductions it writes
// the mean (mean_it<k>.f32) and what arrived of each worker's push
// (w<r>_it<k>_push.bits) into `dir`, which the cluster tests compare with
// an independent reference.
#pragma once

#include <cstdint>
#include <string>

#include "dblp/job/server_iteration.h"

namespace dblp {

// The observer (ServerJobSettings::on_reduced); empty if `dir` is.
ReducedObserver ServerDumps(const std::string& dir, uint64_t iterations);

}  // namespace dblp

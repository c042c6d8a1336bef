// Test hooks of the servers and workers (--dump_dir, --dump_iterations),
// outside the production job: for the first `iterations` iterations they
// write into `dir` what the cluster tests compare with an independent
// reference. Server: the mean (mean_it<k>.f32) and what arrived of each
// worker's push (w<r>_it<k>_push.bits). Worker: the mean it absorbed
// (w<r>_it<k>_avg.f32) and its chunks (_bcast.bits); in a resync
// iteration also its replica before and after (_model_before.f32,
// _model.f32).
#pragma once

#include <cstdint>
#include <string>

#include "dblp/job/server_iteration.h"
#include "dblp/job/worker_job.h"

namespace dblp {

// The observers (ServerJobSettings::on_reduced,
// WorkerJobSettings::on_absorbed); empty if `dir` is.
ReducedObserver ServerDumps(const std::string& dir, uint64_t iterations);
AbsorbedObserver WorkerDumps(const std::string& dir, uint64_t iterations);

}  // namespace dblp

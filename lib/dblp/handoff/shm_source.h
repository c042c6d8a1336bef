// A GradientSource fed by a training process over a ShmChannel: dblp-worker
// --gradient=shm --shm=NAME (and dblp-udp-worker), driven by python/dblp.
// The trainer decides how many steps the job takes, which iterations push
// parameters (re-synchronisation) and when it ends.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dblp/handoff/gradient_source.h"

namespace dblp {

// Opens the trainer's object. `idle_timeout_ms`: fail when the trainer
// posts nothing for this long while alive (0: wait as long as it lives).
// Throws std::runtime_error naming the fix.
std::unique_ptr<GradientSource> OpenShmSource(const std::string& name,
                                              uint32_t idle_timeout_ms);

}  // namespace dblp

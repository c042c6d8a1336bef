// Flags of both workers (dblp-worker over DPDK, dblp-udp-worker over
// kernel UDP) with the same meaning, and the gradient sources both build:
// synthetic, integer and shm (a PyTorch trainer). Include after
// job_flags.h (or common_flags.h) from the app's single translation unit.
// The app defines --gradient, --floats and --bcast_fill itself: their help
// names what that app offers.
#pragma once

#include <gflags/gflags.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "dblp/handoff/gradient_source.h"
#include "dblp/handoff/shm_source.h"
#include "dblp/handoff/synthetic_gradient.h"
#include "dblp/policy/loss_fill.h"
#include "job_flags.h"
#ifdef DBLP_TEST_HOOKS
#include "test_hooks/lying_gradient.h"
#endif

DECLARE_string(gradient);
DECLARE_uint64(floats);
DECLARE_string(bcast_fill);

DEFINE_uint32(iterations, 100, "training iterations");
DEFINE_string(shm, "",
              "shm: the trainer's shared-memory object (e.g. /dblp-w0); "
              "dblp.Worker creates it and starts this process");
DEFINE_uint32(shm_idle_timeout_ms, 0,
              "shm: fail when the trainer, still alive, posts nothing for "
              "this long (0: wait while it lives)");
DEFINE_string(norm_jumps, "",
              "synthetic and integer: iterations where the gradient norm "
              "jumps (phase changes for the CLR detector; integer: x4)");
DEFINE_uint32(jump_length, 10,
              "synthetic and integer: iterations a norm jump lasts");
#ifdef DBLP_TEST_HOOKS  // the tests' twin only (apps/hooked/)
DEFINE_string(lying_gradient, "",
              "test hook: the worker of rank RANK pushes a bad gradient "
              "from iteration FROM on, KIND:RANK[:FROM] with KIND nan | inf "
              "| huge (3e38) | scale=F (its own times F)");
#endif

namespace dblp {

// --bcast_fill, checked.
inline FillMode BcastFillFromFlags() {
  try {
    return ParseFillMode(FLAGS_bcast_fill);
  } catch (const std::invalid_argument& e) {
    FlagError(std::string("--bcast_fill: ") + e.what());
  }
}

// The source --gradient names when it is synthetic, integer or shm, with
// its flags checked (a bad combination exits 2 naming the fix); nullptr
// for any other value, which the app builds or refuses itself. Opening
// --shm throws std::runtime_error naming the fix (no such object, a
// trainer of another build).
inline std::unique_ptr<GradientSource> PlainSourceFromFlags();

// The source; in the tests' twin, with the test hook's lie around it
// (--lying_gradient).
inline std::unique_ptr<GradientSource> WorkerSourceFromFlags() {
#ifdef DBLP_TEST_HOOKS
  try {
    return LyingGradient(FLAGS_lying_gradient, PlainSourceFromFlags());
  } catch (const std::invalid_argument& e) {
    FlagError(e.what());
  }
#else
  return PlainSourceFromFlags();
#endif
}

// --norm_jumps and --jump_length (synthetic and integer sources).
inline NormTrace NormTraceFromFlags() {
  NormTrace trace;
  try {
    trace.jumps = ParseIterationList(FLAGS_norm_jumps);
  } catch (const std::invalid_argument& e) {
    FlagError(std::string("--norm_jumps: ") + e.what());
  }
  trace.jump_length = FLAGS_jump_length;
  return trace;
}

inline std::unique_ptr<GradientSource> PlainSourceFromFlags() {
  const bool shm = FLAGS_gradient == "shm";
  if (shm != !FLAGS_shm.empty()) {
    FlagError(shm ? "--gradient=shm needs --shm=NAME (the trainer's "
                    "object, e.g. /dblp-w0)"
                  : "--shm only applies to --gradient=shm");
  }
  if (shm) {
    if (!gflags::GetCommandLineFlagInfoOrDie("floats").is_default ||
        !gflags::GetCommandLineFlagInfoOrDie("iterations").is_default) {
      FlagError(
          "--gradient=shm: the trainer sets the gradient size and the "
          "number of steps; drop --floats and --iterations");
    }
    return OpenShmSource(FLAGS_shm, FLAGS_shm_idle_timeout_ms);
  }
  if (FLAGS_gradient == "synthetic") {
    if (FLAGS_floats == 0) FlagError("--floats must be >= 1");
    return MakeSyntheticSource(FLAGS_floats, FLAGS_seed, NormTraceFromFlags());
  }
  if (FLAGS_gradient == "integer") {
    if (FLAGS_floats == 0) FlagError("--floats must be >= 1");
    return MakeIntegerSource(FLAGS_floats, NormTraceFromFlags());
  }
  return nullptr;
}

}  // namespace dblp

// Where a worker's gradients come from: a real model (the training source,
// added with libtorch), or synthetic ones for runs without a model.
// Called once per iteration, never per packet, so a virtual interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/handoff/synthetic_gradient.h"
#include "dblp/obs/records.h"

namespace dblp {

class GradientSource {
 public:
  virtual ~GradientSource() = default;
  // Metadata sent in JOIN: layers in flattening order, total floats.
  virtual std::vector<LayerInfo> Layers() const = 0;
  virtual uint64_t floats() const = 0;
  // Called once the server assigned the rank (before the first Compute).
  virtual void Bind(uint32_t rank, uint32_t num_workers) = 0;
  // Writes iteration `it`'s flattened gradient.
  virtual void Compute(uint64_t it, std::span<float> grad) = 0;
  // Consumes the averaged gradient (an optimizer step for a real model).
  virtual void Apply(uint64_t it, std::span<const float> average) = 0;
  virtual std::string Describe() const = 0;

  // Re-synchronisation (resync.h): the worker pushes ExportModel's floats
  // (floats() of them) and loads the average with ImportModel. Neither is
  // a training step. A source without a model sends zeros and ignores the
  // average, so the round still costs what it costs.
  virtual void ExportModel(std::span<float> out) {
    std::fill(out.begin(), out.end(), 0.0f);
  }
  virtual void ImportModel(std::span<const float> model) { (void)model; }

  // --- Sources fed by another process (a PyTorch trainer: shm_source.h) ---
  // The job's re-synchronisation period (WELCOME), after Bind: the trainer
  // must know which iterations push its parameters instead.
  virtual void OnJobStart(uint32_t resync_every) { (void)resync_every; }
  // True: the job runs until AwaitIteration says it ends (--iterations is
  // ignored), because only the trainer knows how many steps it takes.
  virtual bool Unbounded() const { return false; }
  // Blocks until protocol iteration `it`'s input is there (a gradient, or
  // the parameters when `resync`). False: the trainer ended the job and
  // no iteration follows. Throws when the trainer failed or went away, or
  // when `gone` (asked between waits, about every 100 ms) says why the
  // wait must end (the server is gone): a worker never outlives its job
  // waiting for a trainer.
  using GoneCheck = std::function<std::string()>;
  virtual bool AwaitIteration(uint64_t it, bool resync, const GoneCheck& gone) {
    (void)it;
    (void)resync;
    (void)gone;
    return true;
  }
  // What iteration row.iteration delivered, before Apply/ImportModel hand
  // the mean over (the trainer reads it with the mean).
  virtual void Observe(const IterationRecord& row) { (void)row; }
  // The job failed (`why` names the cause): tell whoever waits on us.
  virtual void Fail(const std::string& why) { (void)why; }
  // Buffers shared with the trainer: the push sends straight from, and the
  // broadcast lands straight in, these (no copy). Empty: the engine's own.
  virtual std::span<float> SharedGradient() { return {}; }
  virtual std::span<float> SharedMean() { return {}; }
};

// Gradients whose averaged norm follows `trace` (see synthetic_gradient.h).
std::unique_ptr<GradientSource> MakeSyntheticSource(uint64_t floats,
                                                    uint64_t seed,
                                                    NormTrace trace);

// Small integers, so sums over a few workers are exact in float32 and a
// test can recompute the server's mean bit for bit:
//   g[j] = ((j * 7 + it * 3 + rank * 5) % 17) - 8
// times kIntegerJumpScale in the iterations of `trace`'s jumps (its factor
// is not used: a power of two keeps the sums exact), so a test can move the
// mean's norm and exercise the CLR detector.
inline constexpr float kIntegerJumpScale = 4.0f;
std::unique_ptr<GradientSource> MakeIntegerSource(uint64_t floats,
                                                  NormTrace trace = {});
float IntegerGradientValue(uint64_t j, uint64_t it, uint32_t rank);

}  // namespace dblp

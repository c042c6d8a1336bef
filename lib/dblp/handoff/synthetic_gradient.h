// A synthetic gradient source for runs without a model: deterministic
// per-worker gradients whose averaged L2 norm follows a trace shaped like
// real training (a fast early decline, a plateau, and occasional jumps such
// as a learning-rate restart), so the CLR detector has something to detect.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace dblp {

struct NormTrace {
  double plateau = 1.0;  // norm the decline settles at
  double initial = 5.0;  // extra norm at iteration 0, decaying...
  double decay_iterations = 8.0;  // ...with this time constant
  // Iterations where the norm jumps by `jump_factor` for `jump_length`
  // iterations (a phase change the detector should flag).
  std::vector<uint64_t> jumps;
  double jump_factor = 3.0;
  uint64_t jump_length = 10;

  double At(uint64_t iteration) const;
};

// "" or "none" -> no jumps; "40,90" -> jumps at 40 and 90. Throws
// std::invalid_argument on junk.
std::vector<uint64_t> ParseIterationList(std::string_view csv);

class SyntheticGradientSource {
 public:
  // `floats` per gradient; `rank` varies the per-worker noise.
  SyntheticGradientSource(uint64_t floats, uint32_t rank, uint64_t seed,
                          NormTrace trace);

  // Writes iteration `iteration`'s gradient. The mean over ranks of the
  // same seed has an L2 norm within a few percent of trace.At(iteration).
  void Fill(uint64_t iteration, std::span<float> out) const;
  std::vector<float> Make(uint64_t iteration) const;

  uint64_t floats() const { return floats_; }
  const NormTrace& trace() const { return trace_; }

 private:
  uint64_t floats_;
  uint32_t rank_;
  uint64_t seed_;
  NormTrace trace_;
};

}  // namespace dblp

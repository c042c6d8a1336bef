#include "dblp/handoff/gradient_source.h"

#include <stdexcept>
#include <utility>

namespace dblp {
namespace {

class SyntheticSource final : public GradientSource {
 public:
  SyntheticSource(uint64_t floats, uint64_t seed, NormTrace trace)
      : floats_(floats), seed_(seed), trace_(std::move(trace)) {}
  std::vector<LayerInfo> Layers() const override {
    return {LayerInfo{"synthetic", {static_cast<int64_t>(floats_)}}};
  }
  uint64_t floats() const override { return floats_; }
  void Bind(uint32_t rank, uint32_t /*num_workers*/) override {
    gen_ = std::make_unique<SyntheticGradientSource>(floats_, rank, seed_,
                                                     trace_);
  }
  void Compute(uint64_t it, std::span<float> grad) override {
    if (!gen_) throw std::logic_error("synthetic source used before Bind");
    gen_->Fill(it, grad);
  }
  void Apply(uint64_t, std::span<const float>) override {}
  std::string Describe() const override {
    return "synthetic(" + std::to_string(floats_) + " floats)";
  }

 private:
  uint64_t floats_;
  uint64_t seed_;
  NormTrace trace_;
  std::unique_ptr<SyntheticGradientSource> gen_;
};

class IntegerSource final : public GradientSource {
 public:
  IntegerSource(uint64_t floats, NormTrace trace)
      : floats_(floats), trace_(std::move(trace)) {}
  std::vector<LayerInfo> Layers() const override {
    return {LayerInfo{"integer", {static_cast<int64_t>(floats_)}}};
  }
  uint64_t floats() const override { return floats_; }
  void Bind(uint32_t rank, uint32_t) override { rank_ = rank; }
  void Compute(uint64_t it, std::span<float> grad) override {
    const float scale = InJump(it) ? kIntegerJumpScale : 1.0f;
    for (uint64_t j = 0; j < grad.size(); ++j) {
      grad[j] = scale * IntegerGradientValue(j, it, rank_);
    }
  }
  void Apply(uint64_t, std::span<const float>) override {}
  std::string Describe() const override {
    return "integer(" + std::to_string(floats_) + " floats)";
  }

 private:
  bool InJump(uint64_t it) const {
    for (uint64_t j : trace_.jumps) {
      if (it >= j && it - j < trace_.jump_length) return true;
    }
    return false;
  }
  uint64_t floats_;
  NormTrace trace_;
  uint32_t rank_ = 0;
};

}  // namespace

float IntegerGradientValue(uint64_t j, uint64_t it, uint32_t rank) {
  return static_cast<float>(
      static_cast<int64_t>((j * 7 + it * 3 + uint64_t{rank} * 5) % 17) - 8);
}

std::unique_ptr<GradientSource> MakeSyntheticSource(uint64_t floats,
                                                    uint64_t seed,
                                                    NormTrace trace) {
  if (floats == 0) throw std::invalid_argument("--floats must be >= 1");
  return std::make_unique<SyntheticSource>(floats, seed, std::move(trace));
}

std::unique_ptr<GradientSource> MakeIntegerSource(uint64_t floats,
                                                  NormTrace trace) {
  if (floats == 0) throw std::invalid_argument("--floats must be >= 1");
  return std::make_unique<IntegerSource>(floats, std::move(trace));
}

}  // namespace dblp

#include "test_hooks/lying_gradient.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace dblp {
namespace {

struct Lie {
  enum Kind { kNaN, kInf, kHuge, kScale } kind = kNaN;
  float factor = 1;
  uint32_t rank = 0;
  uint64_t from = 0;
};

Lie ParseLie(const std::string& spec) {
  const std::string form =
      "--lying_gradient=" + spec +
      ": use KIND:RANK[:FROM], KIND nan, inf, huge or scale=F (e.g. nan:1:2)";
  const size_t c1 = spec.find(':');
  if (c1 == std::string::npos) throw std::invalid_argument(form);
  const std::string kind = spec.substr(0, c1);
  Lie lie;
  if (kind == "nan") {
    lie.kind = Lie::kNaN;
  } else if (kind == "inf") {
    lie.kind = Lie::kInf;
  } else if (kind == "huge") {
    lie.kind = Lie::kHuge;
  } else if (kind.rfind("scale=", 0) == 0) {
    lie.kind = Lie::kScale;
    char* end = nullptr;
    lie.factor = std::strtof(kind.c_str() + 6, &end);
    if (end == kind.c_str() + 6 || *end != '\0') {
      throw std::invalid_argument(form);
    }
  } else {
    throw std::invalid_argument(form);
  }
  const std::string rest = spec.substr(c1 + 1);
  char* end = nullptr;
  lie.rank = static_cast<uint32_t>(std::strtoul(rest.c_str(), &end, 10));
  if (end == rest.c_str()) throw std::invalid_argument(form);
  if (*end == ':') {
    const char* from = end + 1;
    lie.from = std::strtoull(from, &end, 10);
    if (end == from) throw std::invalid_argument(form);
  }
  if (*end != '\0') throw std::invalid_argument(form);
  return lie;
}

class LyingSource final : public GradientSource {
 public:
  LyingSource(const Lie& lie, std::unique_ptr<GradientSource> inner)
      : lie_(lie), inner_(std::move(inner)) {}

  std::vector<LayerInfo> Layers() const override { return inner_->Layers(); }
  uint64_t floats() const override { return inner_->floats(); }
  void Bind(uint32_t rank, uint32_t num_workers) override {
    rank_ = rank;
    inner_->Bind(rank, num_workers);
  }
  void Compute(uint64_t it, std::span<float> grad) override {
    inner_->Compute(it, grad);
    if (rank_ != lie_.rank || it < lie_.from) return;
    switch (lie_.kind) {
      case Lie::kNaN:
        std::fill(grad.begin(), grad.end(),
                  std::numeric_limits<float>::quiet_NaN());
        break;
      case Lie::kInf:
        std::fill(grad.begin(), grad.end(),
                  std::numeric_limits<float>::infinity());
        break;
      case Lie::kHuge:
        std::fill(grad.begin(), grad.end(), 3e38f);
        break;
      case Lie::kScale:
        for (float& x : grad) x *= lie_.factor;
        break;
    }
  }
  void Apply(uint64_t it, std::span<const float> average) override {
    inner_->Apply(it, average);
  }
  std::string Describe() const override {
    return inner_->Describe() + " (lying from iteration " +
           std::to_string(lie_.from) + " at rank " + std::to_string(lie_.rank) +
           ")";
  }
  void ExportModel(std::span<float> out) override { inner_->ExportModel(out); }
  void ImportModel(std::span<const float> m) override {
    inner_->ImportModel(m);
  }

 private:
  const Lie lie_;
  std::unique_ptr<GradientSource> inner_;
  uint32_t rank_ = UINT32_MAX;
};

}  // namespace

std::unique_ptr<GradientSource> LyingGradient(
    const std::string& spec, std::unique_ptr<GradientSource> inner) {
  if (spec.empty() || !inner) return inner;
  return std::make_unique<LyingSource>(ParseLie(spec), std::move(inner));
}

}  // namespace dblp

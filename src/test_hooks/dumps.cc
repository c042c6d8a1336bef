#include "test_hooks/dumps.h"

#include <vector>

#include "dblp/obs/run_report.h"  // DumpBinary

namespace dblp {
namespace {

void DumpFloats(const std::string& path, std::span<const float> v) {
  DumpBinary(path, v.data(), v.size() * sizeof(float));
}
void DumpBits(const std::string& path, const Bitmap& b) {
  const std::span<const uint64_t> words = b.words();
  DumpBinary(path, words.data(), words.size() * sizeof(uint64_t));
}

}  // namespace

ReducedObserver ServerDumps(const std::string& dir, uint64_t iterations) {
  if (dir.empty()) return {};
  return [dir, iterations](uint64_t it, std::span<const float> mean,
                           std::span<const Bitmap> arrived) {
    if (it >= iterations) return;
    const std::string k = "_it" + std::to_string(it);
    DumpFloats(dir + "/mean" + k + ".f32", mean);
    for (size_t w = 0; w < arrived.size(); ++w) {
      DumpBits(dir + "/w" + std::to_string(w) + k + "_push.bits", arrived[w]);
    }
  };
}

AbsorbedObserver WorkerDumps(const std::string& dir, uint64_t iterations) {
  if (dir.empty()) return {};
  return [dir, iterations](const AbsorbedView& v) {
    if (v.it >= iterations) return;
    const std::string base =
        dir + "/w" + std::to_string(v.rank) + "_it" + std::to_string(v.it);
    DumpFloats(base + "_avg.f32", v.mean);
    DumpBits(base + "_bcast.bits", *v.arrived);
    if (!v.resync) return;
    // The replica before and after, to check that the resync made every
    // worker's the same (tests/training_smoke_test.py --resync).
    DumpFloats(base + "_model_before.f32", v.pushed);
    std::vector<float> model(v.pushed.size());
    v.source->ExportModel(model);
    DumpFloats(base + "_model.f32", model);
  };
}

}  // namespace dblp

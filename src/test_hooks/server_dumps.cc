#include "test_hooks/server_dumps.h"

#include "dblp/obs/run_report.h"  // DumpBinary

namespace dblp {

ReducedObserver ServerDumps(const std::string& dir, uint64_t iterations) {
  if (dir.empty()) return {};
  return [dir, iterations](uint64_t it, std::span<const float> mean,
                           std::span<const Bitmap> arrived) {
    if (it >= iterations) return;
    const std::string k = "_it" + std::to_string(it);
    DumpBinary(dir + "/mean" + k + ".f32", mean.data(),
               mean.size() * sizeof(float));
    for (size_t w = 0; w < arrived.size(); ++w) {
      const std::span<const uint64_t> words = arrived[w].words();
      DumpBinary(dir + "/w" + std::to_string(w) + k + "_push.bits",
                 words.data(), words.size() * sizeof(uint64_t));
    }
  };
}

}  // namespace dblp

// The worker's push order as WorkerJob hands it to its transport: by
// magnitude (the default), the gradient's largest chunks first; a resync's
// parameters and the other kinds go in their value-free order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dblp/handoff/gradient_source.h"
#include "dblp/job/worker_job.h"
#include "dblp/round/send_order.h"

namespace dblp {
namespace {

constexpr uint32_t kChunkFloats = 16;
constexpr uint32_t kChunks = 40;
constexpr uint64_t kFloats = kChunks * kChunkFloats - 5;  // a short tail

// Chunk c of iteration `it` holds floats of size scale(c, it): every
// iteration ranks the chunks differently.
float Scale(uint32_t c, uint64_t it) {
  return static_cast<float>(1 + (c * 7 + it * 13) % kChunks);
}

// Chunk c's squared L2 norm in iteration `it` (the last chunk is short).
double Squares(uint32_t c, uint64_t it) {
  const uint64_t floats =
      c + 1 == kChunks ? kFloats - uint64_t{c} * kChunkFloats : kChunkFloats;
  return static_cast<double>(floats) * Scale(c, it) * Scale(c, it);
}

class LayeredSource : public GradientSource {
 public:
  std::vector<LayerInfo> Layers() const override {
    return {LayerInfo{"w", {kFloats}}};
  }
  uint64_t floats() const override { return kFloats; }
  void Bind(uint32_t, uint32_t) override {}
  void Compute(uint64_t it, std::span<float> grad) override {
    for (uint64_t j = 0; j < grad.size(); ++j) {
      // Alternating signs: the rank is by norm, not by sum.
      grad[j] = (j % 2 ? -1.0f : 1.0f) *
                Scale(static_cast<uint32_t>(j / kChunkFloats), it);
    }
  }
  void Apply(uint64_t, std::span<const float>) override {}
  void ExportModel(std::span<float> out) override {
    // Parameters that rank the other way round: a resync must not use them.
    for (uint64_t j = 0; j < out.size(); ++j) {
      out[j] = static_cast<float>(j / kChunkFloats);
    }
  }
  std::string Describe() const override { return "layered"; }
};

// Records each iteration's first-pass order; delivers every chunk.
class RecordingExchanger {
 public:
  explicit RecordingExchanger(uint32_t n) : arrived_(n) {
    for (uint32_t i = 0; i < n; ++i) arrived_.Set(i);
  }
  std::string Exchange(uint64_t, std::span<const uint32_t> order) {
    orders.emplace_back(order.begin(), order.end());
    return "";
  }
  WorkerExchange Exchanged(uint64_t it) {
    WorkerExchange x;
    x.iteration = it;
    x.delivered_fraction = 1;
    return x;
  }
  const Bitmap& arrived() const { return arrived_; }

  std::vector<std::vector<uint32_t>> orders;

 private:
  Bitmap arrived_;
};

struct QuietControl {
  bool TakeAccepted(uint32_t, Bitmap*) { return false; }
  bool server_gone() const { return false; }
  std::string failure() const { return ""; }
};

std::vector<std::vector<uint32_t>> RunOrders(
    SendOrderKind kind, uint32_t resync_every, uint64_t iterations,
    const std::string& policy = "dblp") {
  LayeredSource source;
  WelcomeMsg wel;
  wel.policy = policy;
  wel.rank = 1;
  wel.num_workers = 2;
  wel.resync_every = resync_every;
  const ChunkLayout layout(kFloats * sizeof(float),
                           kChunkFloats * sizeof(float));
  EXPECT_EQ(layout.num_chunks(), kChunks);
  WorkerJobSettings s;
  s.send_order = kind;
  WorkerJob job(source, wel, layout, s);
  RecordingExchanger t(layout.num_chunks());
  QuietControl control;
  for (uint64_t it = 0; it < iterations; ++it) {
    bool more = true;
    EXPECT_EQ(job.Iterate(it, t, control, &more), "") << "iteration " << it;
    EXPECT_TRUE(more);
  }
  return t.orders;
}

TEST(WorkerOrder, TheDefaultPushesTheLargestChunksFirst) {
  ASSERT_EQ(kDefaultSendOrder, SendOrderKind::kMagnitude);
  const auto orders = RunOrders(kDefaultSendOrder, 0, 4);
  ASSERT_EQ(orders.size(), 4u);
  for (uint64_t it = 0; it < orders.size(); ++it) {
    const std::vector<uint32_t>& o = orders[it];
    ASSERT_EQ(o.size(), kChunks);
    for (size_t i = 1; i < o.size(); ++i) {
      ASSERT_GE(Squares(o[i - 1], it), Squares(o[i], it))
          << "iteration " << it << " position " << i;
    }
  }
  // The value-free order it would otherwise be: not sorted.
  const auto permuted = RunOrders(SendOrderKind::kPermuted, 0, 1);
  bool sorted = true;
  for (size_t i = 1; i < permuted[0].size(); ++i) {
    sorted &= Squares(permuted[0][i - 1], 0) >= Squares(permuted[0][i], 0);
  }
  EXPECT_FALSE(sorted);
}

TEST(WorkerOrder, AResyncPushesParametersInTheValueFreeOrder) {
  // resync_every = 2: protocol iterations 0, 1 train, 2 resyncs, 3, 4 ...
  const auto orders = RunOrders(SendOrderKind::kMagnitude, 2, 4);
  const auto permuted = RunOrders(SendOrderKind::kPermuted, 2, 4);
  ASSERT_EQ(orders.size(), 4u);
  EXPECT_EQ(orders[2], permuted[2]) << "the resync's order";
  EXPECT_NE(orders[3], permuted[3]) << "training again: by magnitude";
}

TEST(WorkerOrder, AReliableJobSkipsTheRanking) {
  // Every chunk arrives whatever the order: the value-free order, with no
  // pass over the gradient first.
  const auto reliable = RunOrders(SendOrderKind::kMagnitude, 0, 3, "reliable");
  const auto permuted = RunOrders(SendOrderKind::kPermuted, 0, 3, "reliable");
  const auto lossy = RunOrders(SendOrderKind::kMagnitude, 0, 3, "fixed");
  ASSERT_EQ(reliable.size(), 3u);
  for (size_t it = 0; it < reliable.size(); ++it) {
    EXPECT_EQ(reliable[it], permuted[it]) << "iteration " << it;
    EXPECT_NE(lossy[it], permuted[it]) << "iteration " << it;
  }
}

}  // namespace
}  // namespace dblp

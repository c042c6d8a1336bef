// TrainingSource: layout and flattening, identical starts, the averaged
// step against a local one, epochs and logs (on small synthetic IDX files),
// and, on the real Fashion-MNIST when installed, that the MLP learns.
// No torch header: everything goes through the GradientSource interface.
#include "training/training_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "idx_files.h"

namespace dblp::training {
namespace {

namespace fs = std::filesystem;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

uint64_t Numel(const LayerInfo& l) {
  return std::accumulate(l.shape.begin(), l.shape.end(), uint64_t{1},
                         [](uint64_t a, int64_t d) {
                           return a * static_cast<uint64_t>(d);
                         });
}

// Synthetic data: 200 training and 50 test images.
class TrainingSourceTest : public test_util::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    WriteSplit(Split::kTrain, test_util::ImagesIdx(200),
               test_util::LabelsIdx(200));
    WriteSplit(Split::kTest, test_util::ImagesIdx(50),
               test_util::LabelsIdx(50));
  }
  TrainingOptions Options(const std::string& model = "mlp") const {
    TrainingOptions o;
    o.model = model;
    o.data_dir = dir_.string();
    o.batch = 16;
    o.seed = 7;
    o.verbose = false;
    return o;
  }
};

TEST_F(TrainingSourceTest, LayersMatchParameters) {
  TrainingSource mlp(Options("mlp"));
  const std::vector<LayerInfo> want = {
      {"fc1.weight", {256, 784}}, {"fc1.bias", {256}},
      {"fc2.weight", {128, 256}}, {"fc2.bias", {128}},
      {"fc3.weight", {10, 128}},  {"fc3.bias", {10}}};
  EXPECT_EQ(mlp.Layers(), want);
  EXPECT_EQ(mlp.floats(), 235146u);

  const std::map<std::string, uint64_t> sizes = {
      {"mlp", 235146}, {"cnn", 80602}, {"resnet", 151738}};
  for (const auto& [name, floats] : sizes) {
    TrainingSource s(Options(name));
    EXPECT_EQ(s.floats(), floats) << name;
    uint64_t total = 0;
    std::set<std::string> names;
    for (const LayerInfo& l : s.Layers()) {
      total += Numel(l);
      EXPECT_TRUE(names.insert(l.name).second) << l.name;
      EXPECT_LE(l.shape.size(), kMaxShapeDims);
      EXPECT_LE(l.name.size(), kMaxLayerName);
    }
    EXPECT_EQ(total, s.floats()) << name;
    EXPECT_EQ(s.FlatParameters().size(), s.floats()) << name;
    EXPECT_EQ(s.Layers(), s.Layers()) << name;  // a fixed order
    EXPECT_NE(s.Describe().find(name), std::string::npos);
  }
}

TEST_F(TrainingSourceTest, SameSeedSameWeights) {
  for (const std::string model : {"mlp", "cnn", "resnet"}) {
    TrainingOptions o = Options(model);
    TrainingSource a(o), b(o);
    // A different rank must not change the start: only Bind sees it.
    a.Bind(0, 2);
    b.Bind(1, 2);
    EXPECT_EQ(a.FlatParameters(), b.FlatParameters()) << model;
    o.seed = 8;
    TrainingSource c(o);
    EXPECT_NE(a.FlatParameters(), c.FlatParameters()) << model;
  }
}

TEST_F(TrainingSourceTest, UnflattenPutsEveryValueInPlace) {
  // lr 1, no momentum: a step is p -= average, so two steps can set every
  // parameter to an exact value that encodes its flat position.
  TrainingOptions o = Options();
  o.lr = 1;
  o.momentum = 0;
  TrainingSource s(o);
  s.Bind(0, 1);
  const std::vector<float> p0 = s.FlatParameters();
  s.Apply(0, p0);  // p0 - p0 = 0 exactly
  EXPECT_EQ(s.FlatParameters(), std::vector<float>(p0.size(), 0.0f));
  std::vector<float> neg(p0.size()), want(p0.size());
  for (size_t j = 0; j < p0.size(); ++j) {
    want[j] = static_cast<float>(j % 100003) + 0.5f;  // exact in float
    neg[j] = -want[j];
  }
  s.Apply(1, neg);
  EXPECT_EQ(s.FlatParameters(), want);
}

TEST_F(TrainingSourceTest, AveragedStepEqualsLocalStepWithOneWorker) {
  for (const std::string model : {"mlp", "cnn", "resnet"}) {
    const TrainingOptions o = Options(model);
    TrainingSource net(o), local(o);
    net.Bind(0, 1);
    local.Bind(0, 1);
    std::vector<float> g(net.floats());
    for (uint64_t it = 0; it < 3; ++it) {
      const std::vector<float> before = net.FlatParameters();
      net.Compute(it, g);
      net.Apply(it, g);  // W = 1: the average is our own gradient
      local.LocalStep(it);
      ASSERT_EQ(net.FlatParameters(), local.FlatParameters())
          << model << " iteration " << it;
      EXPECT_EQ(net.last_batch_loss(), local.last_batch_loss());
      if (it == 0) {
        // SGD's first momentum step is plain: p1 = p0 - lr * g.
        const std::vector<float> after = net.FlatParameters();
        double max_err = 0, norm = 0;
        for (size_t j = 0; j < g.size(); ++j) {
          const float want = before[j] - static_cast<float>(o.lr) * g[j];
          max_err = std::max(max_err, std::fabs(double{after[j]} - want));
          norm += double{g[j]} * g[j];
        }
        EXPECT_LT(max_err, 1e-6) << model;
        EXPECT_GT(norm, 0) << model;
      }
    }
  }
}

TEST_F(TrainingSourceTest, ReplicasStayEqualUnderTheMean) {
  const TrainingOptions o = Options("cnn");
  TrainingSource a(o), b(o);
  a.Bind(0, 2);
  b.Bind(1, 2);
  std::vector<float> ga(a.floats()), gb(b.floats()), mean(a.floats());
  for (uint64_t it = 0; it < 4; ++it) {
    a.Compute(it, ga);
    b.Compute(it, gb);
    EXPECT_NE(ga, gb);  // different shards, different gradients
    for (size_t j = 0; j < mean.size(); ++j) mean[j] = (ga[j] + gb[j]) / 2;
    a.Apply(it, mean);
    b.Apply(it, mean);
    ASSERT_EQ(a.FlatParameters(), b.FlatParameters()) << it;
  }
}

TEST_F(TrainingSourceTest, EpochsEvaluationAndCsv) {
  TrainingOptions o = Options();
  o.log_dir = (dir_ / "logs").string();
  o.iterations = 14;  // 200 images / 2 workers / batch 16: 6 per epoch
  TrainingSource s(o);
  EXPECT_TRUE(std::isnan(s.last_test_accuracy()));
  s.Bind(1, 2);
  EXPECT_EQ(s.shard_size(), 100u);
  EXPECT_EQ(s.iterations_per_epoch(), 6u);
  EXPECT_NE(s.Describe().find("shard 100/200"), std::string::npos);
  std::vector<float> g(s.floats());
  for (uint64_t it = 0; it < o.iterations; ++it) {
    s.Compute(it, g);
    s.Apply(it, g);
    if (it == 5) {
      EXPECT_EQ(s.epochs_completed(), 1u);
      EXPECT_GE(s.last_test_accuracy(), 0.0);
      EXPECT_LE(s.last_test_accuracy(), 1.0);
    }
  }
  EXPECT_EQ(s.epochs_completed(), 2u);
  s.Finish();  // already logged at the last iteration: no extra line
  std::ifstream csv(fs::path(o.log_dir) / "training-w1.csv");
  ASSERT_TRUE(csv.good());
  std::vector<std::string> lines;
  for (std::string l; std::getline(csv, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "epoch,iteration,train_loss,test_accuracy,wall_s,train_s");
  EXPECT_EQ(lines[1].rfind("1,6,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("2,12,", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("3,14,", 0), 0u) << lines[3];  // partial epoch
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].find("nan"), std::string::npos) << lines[i];
    // train_s leaves the evaluations out: never above wall_s, never < 0.
    const size_t c4 = lines[i].rfind(',');
    const size_t c3 = lines[i].rfind(',', c4 - 1);
    const double wall = std::stod(lines[i].substr(c3 + 1, c4 - c3 - 1));
    const double train = std::stod(lines[i].substr(c4 + 1));
    EXPECT_LE(train, wall) << lines[i];
    EXPECT_GE(train, 0.0) << lines[i];
  }
}

TEST_F(TrainingSourceTest, NoEvaluationBetweenEpochsWhenDisabled) {
  TrainingOptions o = Options();
  o.eval_every_epoch = false;
  o.log_dir = (dir_ / "logs").string();
  o.iterations = 13;  // one epoch of 12 (W = 1), then a partial one
  TrainingSource s(o);
  s.Bind(0, 1);
  std::vector<float> g(s.floats());
  for (uint64_t it = 0; it < 12; ++it) {
    s.Compute(it, g);
    s.Apply(it, g);
  }
  EXPECT_EQ(s.epochs_completed(), 1u);
  EXPECT_TRUE(std::isnan(s.last_test_accuracy()));
  EXPECT_FALSE(std::isnan(s.last_epoch_loss()));
  s.Compute(12, g);
  s.Apply(12, g);
  EXPECT_FALSE(std::isnan(s.last_test_accuracy()));  // the end evaluates
}

TEST_F(TrainingSourceTest, Errors) {
  TrainingOptions o = Options();
  o.model = "vgg";
  EXPECT_NE(ErrorOf([&] { TrainingSource s(o); }).find("--model=vgg"),
            std::string::npos);
  o = Options();
  o.batch = 0;
  EXPECT_NE(ErrorOf([&] { TrainingSource s(o); }).find("--batch"),
            std::string::npos);
  o = Options();
  o.lr = -1;
  EXPECT_NE(ErrorOf([&] { TrainingSource s(o); }).find("--lr"),
            std::string::npos);
  o = Options();
  o.threads = 0;
  EXPECT_NE(ErrorOf([&] { TrainingSource s(o); }).find("--train_threads"),
            std::string::npos);
  o = Options();
  o.max_eval = 0;
  EXPECT_NE(ErrorOf([&] { TrainingSource s(o); }).find("--max_eval"),
            std::string::npos);
  o = Options();
  o.data_dir = (dir_ / "nowhere").string();
  const std::string missing = ErrorOf([&] { TrainingSource s(o); });
  EXPECT_NE(missing.find("dataset-fashion-mnist"), std::string::npos)
      << missing;
  EXPECT_NE(missing.find(o.data_dir), std::string::npos) << missing;

  // A shard smaller than a batch cannot make a single step.
  o = Options();
  o.batch = 64;
  TrainingSource s(o);
  EXPECT_NE(ErrorOf([&] { s.Bind(3, 4); }).find("fewer than --batch=64"),
            std::string::npos);
  TrainingSource t(Options());
  std::vector<float> g(t.floats());
  EXPECT_THROW(t.Compute(0, g), std::logic_error);  // before Bind
  t.Bind(0, 1);
  std::vector<float> small(3);
  EXPECT_THROW(t.Compute(0, small), std::invalid_argument);
  EXPECT_THROW(t.Apply(0, small), std::invalid_argument);
  EXPECT_THROW(t.Bind(0, 1), std::logic_error);
}

// The real dataset: a few dozen MLP iterations on a 2k-image subset learn.
TEST(TrainingSourceRealData, MlpLearnsFashionMnist) {
  TrainingOptions o;
  o.model = "mlp";
  o.data_dir = kDefaultFashionMnistDir;
  if (!fs::exists(ImagesPath(o.data_dir, Split::kTrain))) {
    GTEST_SKIP() << "Fashion-MNIST not found in " << o.data_dir
                 << ": install the Debian package dataset-fashion-mnist";
  }
  o.max_train = 2000;
  o.max_eval = 2000;
  o.batch = 64;
  o.lr = 0.05;
  o.seed = 1;
  o.iterations = 62;  // two epochs of 31 batches
  TrainingSource s(o);
  s.Bind(0, 1);
  EXPECT_EQ(s.shard_size(), 2000u);
  const double chance = s.Evaluate();
  std::vector<float> g(s.floats());
  double first = 0, last = 0;
  for (uint64_t it = 0; it < o.iterations; ++it) {
    s.Compute(it, g);
    s.Apply(it, g);
    if (it < 8) first += s.last_batch_loss() / 8;
    if (it >= o.iterations - 8) last += s.last_batch_loss() / 8;
  }
  EXPECT_EQ(s.epochs_completed(), 2u);
  EXPECT_LT(last, 0.7 * first) << "first " << first << " last " << last;
  EXPECT_GT(s.last_test_accuracy(), 0.4)
      << "untrained accuracy was " << chance;
  std::printf("mlp: loss %.3f -> %.3f, test accuracy %.3f -> %.3f\n", first,
              last, chance, s.last_test_accuracy());
}

}  // namespace
}  // namespace dblp::training

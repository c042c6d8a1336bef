// A worker's gradients from real training: a Fashion-MNIST model trained
// with SGD on this worker's shard, one minibatch per DBLP iteration. The
// worker pushes the flattened gradient and steps its optimizer with the
// mean the server broadcasts, so all replicas stay equal.
//
// This header is free of libtorch (the model lives behind a pointer to an
// implementation) so dblp-worker's translation unit, which also includes
// DPDK, does not pay torch's compile time or its warnings.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/handoff/gradient_source.h"
#include "training/fashion_mnist.h"

namespace dblp::training {

inline constexpr char kFashionMnistData[] = "fashion-mnist";

struct TrainingOptions {
  // mlp | cnn | resnet | a TorchScript file (contract: docs/PYTORCH.md)
  std::string model = "mlp";
  // kFashionMnistData (from data_dir) | a TorchScript data hook file
  std::string data = kFashionMnistData;
  std::string data_dir = kDefaultFashionMnistDir;
  uint32_t batch = 64;
  double lr = 0.05;
  double momentum = 0.9;
  uint32_t threads = 1;  // torch intra-op threads
  bool eval_every_epoch = true;
  // Per-epoch CSV <log_dir>/training-w<rank>.csv (empty: none); the
  // worker flag is --train_log_dir.
  std::string log_dir;
  uint32_t max_eval = 10000;  // test images used for the accuracy
  uint64_t seed = 1;          // job seed: model init, shards, batch order
  // The job's iteration count: the last Apply evaluates and logs
  // (0: only epoch boundaries and explicit Finish()).
  uint64_t iterations = 0;
  // Train on only this many images of the training set, picked by the
  // seeded permutation before sharding (0: all). For tests and smoke runs.
  uint32_t max_train = 0;
  bool verbose = true;  // print the per-epoch line on stdout
};

// Throws std::invalid_argument naming the flag for an unusable value.
void ValidateTrainingOptions(const TrainingOptions& o);

class TrainingSource final : public GradientSource {
 public:
  // Builds the model (same weights for the same seed in every process) and
  // reads and validates the dataset files now, so a missing or corrupt
  // dataset fails before the worker joins. Throws std::invalid_argument
  // (options) or std::runtime_error (dataset, log directory).
  explicit TrainingSource(const TrainingOptions& o);
  ~TrainingSource() override;
  TrainingSource(const TrainingSource&) = delete;
  TrainingSource& operator=(const TrainingSource&) = delete;

  // Parameters in named_parameters() order, the flattening order.
  std::vector<LayerInfo> Layers() const override;
  uint64_t floats() const override;
  // Takes shard `rank` of `num_workers` of the training set.
  void Bind(uint32_t rank, uint32_t num_workers) override;
  // Forward and backward on the next minibatch; writes the gradients.
  void Compute(uint64_t it, std::span<float> grad) override;
  // Sets the parameters' gradients to `average`, steps the optimizer, and
  // at an epoch boundary (or the last iteration) evaluates and logs.
  void Apply(uint64_t it, std::span<const float> average) override;
  std::string Describe() const override;
  // The parameters, flattened like the gradient; ImportModel replaces them
  // (the optimizer's momentum is kept).
  void ExportModel(std::span<float> out) override;
  void ImportModel(std::span<const float> model) override;

  // The same minibatch step without the network: backward's own gradients
  // straight into the optimizer (a no-network baseline; tests compare it
  // with Compute + Apply).
  void LocalStep(uint64_t it);
  // Test accuracy on up to max_eval test images, in [0, 1].
  double Evaluate();
  // Evaluates and logs the current (partial) epoch unless the last
  // iteration was already logged.
  void Finish();

  std::vector<float> FlatParameters() const;
  double last_batch_loss() const;     // loss of the latest minibatch
  double last_epoch_loss() const;     // mean minibatch loss of the last log
  double last_test_accuracy() const;  // NaN before the first evaluation
  uint32_t epochs_completed() const;
  uint32_t shard_size() const;
  uint32_t iterations_per_epoch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dblp::training

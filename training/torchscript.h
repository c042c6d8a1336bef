// Bring-your-own model and data for --gradient=train: a TorchScript model
// (--model=PATH.pt) and a TorchScript data hook (--data=PATH.pt), loaded
// with torch::jit::load. The contract is in docs/PYTORCH.md; every way a
// file can miss it is a std::invalid_argument naming the flag and the fix,
// so the worker exits with a message before it joins.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>
#include <utility>

#include "training/models.h"

namespace dblp::training {

// --model and --data values that name a file rather than a built-in: they
// end in ".pt" or contain a '/'.
bool IsTorchScriptPath(const std::string& value);

// "[2, 1, 28, 28]", for messages.
std::string ShapeString(const torch::Tensor& t);

// The module at `path` behind the Model interface: forward(x) -> logits,
// loss(logits, target) if it defines one (else cross-entropy), and its
// float32 parameters with requires_grad. Its weights are the file's, so
// every worker starts from the same model. Throws std::invalid_argument.
Model LoadTorchScriptModel(const std::string& path);

// Runs `model` once on a batch in eval mode, without gradients, and checks
// the contract: logits [N, C] with N = x.size(0) and C >= min_classes, and
// a scalar loss against `y`. `data` names the batch's source in messages.
// Throws std::invalid_argument.
void ProbeModel(Model& model, const torch::Tensor& x, const torch::Tensor& y,
                int64_t min_classes, const std::string& data);

// The per-batch part of ProbeModel, for every training batch.
void CheckLogits(const Model& model, const torch::Tensor& x,
                 const torch::Tensor& logits, int64_t min_classes);

using Batch = std::pair<torch::Tensor, torch::Tensor>;  // inputs, targets

// --data=PATH.pt: batch(step, rank, world, batch_size) -> (inputs,
// targets) and the optional eval_batch(index, batch_size) and
// steps_per_epoch(world, batch_size).
class DataHook {
 public:
  explicit DataHook(const std::string& path);  // throws invalid_argument

  // Training step `step` (0, 1, ...) of worker `rank` of `world`.
  Batch Train(int64_t step, int64_t rank, int64_t world, int64_t batch);
  bool has_eval() const { return has_eval_; }
  // Test batch `index`; inputs with no rows when the test set is done.
  Batch Eval(int64_t index, int64_t batch);
  // Training steps per epoch (log and eval period), 0 without the method.
  int64_t StepsPerEpoch(int64_t world, int64_t batch);
  const std::string& path() const { return path_; }

 private:
  Batch Call(const char* method, std::vector<c10::IValue> args,
             bool allow_empty);

  std::string path_;
  torch::jit::Module module_;
  bool has_eval_ = false;
};

}  // namespace dblp::training

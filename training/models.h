// The three Fashion-MNIST models a worker can train. Every worker builds
// its model from the job seed (never the rank), so all replicas start from
// the same weights and stay equal as long as they apply the same averages.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dblp::training {

// Input [B, 1, 28, 28] (or [B, 28, 28]), output logits [B, 10].
// 784-256-128-10 with ReLU: 235,146 parameters.
struct MlpImpl : torch::nn::Module {
  MlpImpl();
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// Two 3x3 conv + 2x2 max-pool stages (16, 32 channels), then 1568-48-10:
// 80,602 parameters, ~34 iterations/s at batch 64 on one core here.
struct CnnImpl : torch::nn::Module {
  CnnImpl();
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Cnn);

// Basic residual block: conv-BN-ReLU-conv-BN plus the (projected when the
// shape changes) input, then ReLU.
struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl(int64_t in, int64_t out, int64_t stride);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, proj{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, proj_bn{nullptr};
};
TORCH_MODULE(ResidualBlock);

// Stem 3x3 conv (16) and four blocks 16, 32/2, 64/2, 64 (28 -> 14 -> 7),
// global average pool, fc 64-10: 151,738 parameters. BatchNorm running
// statistics are buffers, not parameters: each worker keeps its own, as in
// parameter-server training without synchronised BN.
struct ResNetImpl : torch::nn::Module {
  ResNetImpl();
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d stem{nullptr};
  torch::nn::BatchNorm2d stem_bn{nullptr};
  ResidualBlock block1{nullptr}, block2{nullptr}, block3{nullptr},
      block4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

// A model behind one interface, built in (MakeModel) or a TorchScript file
// (LoadTorchScriptModel, training/torchscript.h): the training source sees
// only this.
struct Model {
  std::string name;  // "mlp", ... or the TorchScript file's path
  // Parameters with requires_grad, in named_parameters() order: the order
  // DBLP flattens the gradient in and the JOIN's layer list.
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::function<torch::Tensor(const torch::Tensor&)> forward;  // logits
  // A batch's scalar loss from its logits and targets.
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  std::function<void(bool)> set_training;  // train (true) or eval mode
};

// The built-in models' loss, and a TorchScript model's without loss().
// Integer targets of any width are class indices.
torch::Tensor CrossEntropy(const torch::Tensor& logits,
                           const torch::Tensor& target);

// "mlp", "cnn" or "resnet", initialised deterministically from `seed`
// (torch's default initialisers drawn from a generator seeded here).
// Throws std::invalid_argument for another name.
Model MakeModel(const std::string& name, uint64_t seed);

// Names accepted by MakeModel, for flag help and errors.
const std::vector<std::string>& ModelNames();

}  // namespace dblp::training

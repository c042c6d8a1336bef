#include "training/models.h"

#include <stdexcept>

namespace dblp::training {
namespace {

namespace nn = torch::nn;

nn::Conv2d Conv3x3(int64_t in, int64_t out, int64_t stride, bool bias) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(bias));
}

// The loader hands [B, 1, 28, 28]; a bare [B, 28, 28] gets its channel
// axis here, so callers may pass either.
torch::Tensor AsImages(const torch::Tensor& x) {
  return x.dim() == 3 ? x.unsqueeze(1) : x;
}

}  // namespace

MlpImpl::MlpImpl()
    : fc1(register_module("fc1", nn::Linear(784, 256))),
      fc2(register_module("fc2", nn::Linear(256, 128))),
      fc3(register_module("fc3", nn::Linear(128, 10))) {}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = x.reshape({x.size(0), 784});
  x = torch::relu(fc1(x));
  x = torch::relu(fc2(x));
  return fc3(x);
}

CnnImpl::CnnImpl()
    : conv1(register_module("conv1", Conv3x3(1, 16, 1, true))),
      conv2(register_module("conv2", Conv3x3(16, 32, 1, true))),
      fc1(register_module("fc1", nn::Linear(32 * 7 * 7, 48))),
      fc2(register_module("fc2", nn::Linear(48, 10))) {}

torch::Tensor CnnImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(conv1(AsImages(x))), 2);  // 16x14x14
  x = torch::max_pool2d(torch::relu(conv2(x)), 2);            // 32x7x7
  x = torch::relu(fc1(x.flatten(1)));
  return fc2(x);
}

ResidualBlockImpl::ResidualBlockImpl(int64_t in, int64_t out, int64_t stride)
    : conv1(register_module("conv1", Conv3x3(in, out, stride, false))),
      conv2(register_module("conv2", Conv3x3(out, out, 1, false))),
      bn1(register_module("bn1", nn::BatchNorm2d(out))),
      bn2(register_module("bn2", nn::BatchNorm2d(out))) {
  if (stride != 1 || in != out) {
    proj = register_module(
        "proj",
        nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
    proj_bn = register_module("proj_bn", nn::BatchNorm2d(out));
  }
}

torch::Tensor ResidualBlockImpl::forward(torch::Tensor x) {
  torch::Tensor y = torch::relu(bn1(conv1(x)));
  y = bn2(conv2(y));
  const torch::Tensor shortcut = proj ? proj_bn(proj(x)) : x;
  return torch::relu(y + shortcut);
}

ResNetImpl::ResNetImpl()
    : stem(register_module("stem", Conv3x3(1, 16, 1, false))),
      stem_bn(register_module("stem_bn", nn::BatchNorm2d(16))),
      block1(register_module("block1", ResidualBlock(16, 16, 1))),
      block2(register_module("block2", ResidualBlock(16, 32, 2))),
      block3(register_module("block3", ResidualBlock(32, 64, 2))),
      block4(register_module("block4", ResidualBlock(64, 64, 1))),
      fc(register_module("fc", nn::Linear(64, 10))) {}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = torch::relu(stem_bn(stem(AsImages(x))));
  x = block4(block3(block2(block1(x))));
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

const std::vector<std::string>& ModelNames() {
  static const std::vector<std::string> names = {"mlp", "cnn", "resnet"};
  return names;
}

torch::Tensor CrossEntropy(const torch::Tensor& logits,
                           const torch::Tensor& target) {
  const bool index = !target.is_floating_point() && !target.is_complex();
  return torch::nn::functional::cross_entropy(
      logits, index ? target.to(torch::kInt64) : target);
}

namespace {

// The built-ins behind the Model interface. `m` is a module holder (a
// shared pointer), so the lambdas keep the module alive.
template <typename Holder>
Model Wrap(const std::string& name, Holder m) {
  Model model;
  model.name = name;
  for (const auto& item : m->named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    model.names.push_back(item.key());
    model.params.push_back(item.value());
  }
  model.forward = [m](const torch::Tensor& x) mutable { return m->forward(x); };
  model.loss = CrossEntropy;
  model.set_training = [m](bool on) mutable { m->train(on); };
  return model;
}

}  // namespace

Model MakeModel(const std::string& name, uint64_t seed) {
  // The initialisers draw from torch's default CPU generator: seeding it
  // right before construction makes the weights a function of the seed
  // alone, identical in every worker process.
  torch::manual_seed(seed);
  if (name == "mlp") return Wrap(name, Mlp());
  if (name == "cnn") return Wrap(name, Cnn());
  if (name == "resnet") return Wrap(name, ResNet());
  throw std::invalid_argument("--model=" + name +
                              ": use mlp, cnn, resnet or a TorchScript "
                              "file PATH.pt");
}

}  // namespace dblp::training

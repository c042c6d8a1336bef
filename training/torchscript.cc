#include "training/torchscript.h"

#include <filesystem>
#include <stdexcept>
#include <vector>

namespace dblp::training {
namespace {

// c10::Error's what() carries a C++ backtrace; users need the first line.
std::string Reason(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    std::string m = c->what_without_backtrace();
    const size_t nl = m.find('\n');
    return nl == std::string::npos ? m : m.substr(0, nl);
  }
  return e.what();
}

torch::jit::Module LoadModule(const std::string& flag,
                              const std::string& path) {
  const std::string what = "--" + flag + "=" + path + ": ";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw std::invalid_argument(
        what + "no such file" +
        (flag == "model" ? " (use mlp, cnn, resnet or a TorchScript file; "
                           "tools/make-torchscript-example.py writes one)"
                         : " (use fashion-mnist or a TorchScript data hook; "
                           "tools/make-torchscript-example.py writes one)"));
  }
  try {
    return torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    throw std::invalid_argument(
        what + "not a TorchScript file (" + Reason(e) +
        "); save one from Python with torch.jit.script(module).save(PATH)");
  }
}

}  // namespace

bool IsTorchScriptPath(const std::string& value) {
  return value.find('/') != std::string::npos ||
         (value.size() > 3 && value.ends_with(".pt"));
}

std::string ShapeString(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    s += (d ? ", " : "") + std::to_string(t.size(d));
  }
  return s + "]";
}

Model LoadTorchScriptModel(const std::string& path) {
  torch::jit::Module m = LoadModule("model", path);
  const std::string what = "--model=" + path + ": ";
  if (!m.find_method("forward")) {
    throw std::invalid_argument(what +
                                "the module has no forward(x) method; it "
                                "must map an input batch to logits [N, C]");
  }
  Model model;
  model.name = path;
  for (const auto& item : m.named_parameters(true)) {
    if (!item.value.requires_grad()) continue;
    if (item.value.scalar_type() != torch::kFloat32) {
      throw std::invalid_argument(
          what + "parameter " + item.name + " is " +
          std::string(c10::toString(item.value.scalar_type())) +
          "; DBLP moves float32 gradients: save the model after .float()");
    }
    model.names.push_back(item.name);
    model.params.push_back(item.value);
  }
  if (model.params.empty()) {
    throw std::invalid_argument(
        what +
        "the module has no parameters with requires_grad, so there is no "
        "gradient to move (a torch.jit.freeze'd module folds them into "
        "constants: save the scripted module unfrozen)");
  }
  model.forward = [m, what](const torch::Tensor& x) mutable {
    const c10::IValue out = m.forward({x});
    if (!out.isTensor()) {
      throw std::invalid_argument(what + "forward(x) returned " +
                                  out.tagKind() +
                                  ", not a Tensor of logits [N, C]");
    }
    return out.toTensor();
  };
  if (m.find_method("loss")) {
    model.loss = [m, what](const torch::Tensor& logits,
                           const torch::Tensor& target) mutable {
      const c10::IValue out = m.get_method("loss")({logits, target});
      if (!out.isTensor() || out.toTensor().numel() != 1) {
        throw std::invalid_argument(
            what + "loss(logits, target) must return a scalar Tensor, got " +
            (out.isTensor() ? ShapeString(out.toTensor()) : out.tagKind()));
      }
      return out.toTensor().reshape({});
    };
  } else {
    model.loss = CrossEntropy;
  }
  model.set_training = [m](bool on) mutable { m.train(on); };
  return model;
}

void CheckLogits(const Model& model, const torch::Tensor& x,
                 const torch::Tensor& logits, int64_t min_classes) {
  if (logits.dim() == 2 && logits.size(0) == x.size(0) &&
      logits.size(1) >= min_classes && logits.is_floating_point()) {
    return;
  }
  throw std::invalid_argument(
      "--model=" + model.name + ": forward(x) returned " + ShapeString(logits) +
      " (" + std::string(c10::toString(logits.scalar_type())) + ") for a " +
      ShapeString(x) + " batch; it must return float logits [N, C] with N = " +
      std::to_string(x.size(0)) + " (one row per input) and C >= " +
      std::to_string(min_classes) + " classes");
}

void ProbeModel(Model& model, const torch::Tensor& x, const torch::Tensor& y,
                int64_t min_classes, const std::string& data) {
  torch::NoGradGuard no_grad;
  model.set_training(false);  // no BatchNorm statistics from the probe
  const std::string what = "--model=" + model.name + ": ";
  torch::Tensor logits;
  try {
    logits = model.forward(x);
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    throw std::invalid_argument(
        what + "forward(x) failed on a " + ShapeString(x) + " batch of " +
        data + ": " + Reason(e) + " (the model must take the data's inputs)");
  }
  CheckLogits(model, x, logits, min_classes);
  try {
    model.loss(logits, y);
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    throw std::invalid_argument(
        what + "the loss of " + ShapeString(logits) + " logits against " +
        ShapeString(y) + " targets of " + data + " failed: " + Reason(e));
  }
  model.set_training(true);
}

DataHook::DataHook(const std::string& path)
    : path_(path), module_(LoadModule("data", path)) {
  if (!module_.find_method("batch")) {
    throw std::invalid_argument(
        "--data=" + path +
        ": the module has no batch(step: int, rank: int, world: int, "
        "batch_size: int) -> Tuple[Tensor, Tensor] method (mark it "
        "@torch.jit.export)");
  }
  has_eval_ = module_.find_method("eval_batch").has_value();
}

Batch DataHook::Call(const char* method, std::vector<c10::IValue> args,
                     bool allow_empty) {
  const std::string what = "--data=" + path_ + ": " + method + "(): ";
  c10::IValue out;
  try {
    torch::NoGradGuard no_grad;
    out = module_.get_method(method)(std::move(args));
  } catch (const std::exception& e) {
    throw std::invalid_argument(what + Reason(e));
  }
  if (!out.isTuple() || out.toTupleRef().elements().size() != 2 ||
      !out.toTupleRef().elements()[0].isTensor() ||
      !out.toTupleRef().elements()[1].isTensor()) {
    throw std::invalid_argument(what + "returned " + out.tagKind() +
                                "; it must return (inputs, targets), a "
                                "Tuple[Tensor, Tensor]");
  }
  Batch b{out.toTupleRef().elements()[0].toTensor(),
          out.toTupleRef().elements()[1].toTensor()};
  const bool empty = b.first.dim() == 0 || b.first.size(0) == 0;
  if (empty && allow_empty) return b;
  if (empty || b.second.dim() == 0 || b.first.size(0) != b.second.size(0)) {
    throw std::invalid_argument(
        what + "returned inputs " + ShapeString(b.first) + " and targets " +
        ShapeString(b.second) +
        "; both need the same number N >= 1 of rows (dimension 0)");
  }
  return b;
}

Batch DataHook::Train(int64_t step, int64_t rank, int64_t world,
                      int64_t batch) {
  return Call("batch", {step, rank, world, batch}, false);
}

Batch DataHook::Eval(int64_t index, int64_t batch) {
  return Call("eval_batch", {index, batch}, true);
}

int64_t DataHook::StepsPerEpoch(int64_t world, int64_t batch) {
  if (!module_.find_method("steps_per_epoch")) return 0;
  const std::string what = "--data=" + path_ + ": steps_per_epoch(): ";
  c10::IValue out;
  try {
    out = module_.get_method("steps_per_epoch")({world, batch});
  } catch (const std::exception& e) {
    throw std::invalid_argument(what + Reason(e));
  }
  if (!out.isInt() || out.toInt() < 0) {
    throw std::invalid_argument(what + "must return an int >= 0");
  }
  return out.toInt();
}

}  // namespace dblp::training

#include "training/training_source.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <utility>

#include "training/models.h"
#include "training/torchscript.h"

namespace dblp::training {
namespace {

constexpr uint32_t kEvalBatch = 1000;

// [N, 1, 28, 28]: the input every model takes (TorchScript's contract).
torch::Tensor ImagesTensor(const Dataset& d) {
  // clone(): the tensor owns its memory, so the vectors can be released.
  return torch::from_blob(
             const_cast<float*>(d.images.data()),
             {static_cast<int64_t>(d.count), 1, kImageSide, kImageSide},
             torch::kFloat32)
      .clone();
}

torch::Tensor LabelsTensor(const Dataset& d) {
  return torch::from_blob(const_cast<uint8_t*>(d.labels.data()),
                          {static_cast<int64_t>(d.count)}, torch::kUInt8)
      .to(torch::kInt64);
}

// Seed of worker `rank`'s batch order in `epoch`: distinct per rank and
// epoch, reproducible from the job seed.
uint64_t EpochSeed(uint64_t seed, uint32_t rank, uint32_t epoch) {
  return seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t{rank} + 1)) ^
         (0xC2B2AE3D27D4EB4FULL * (uint64_t{epoch} + 1));
}

std::string FormatDouble(double v, int precision) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

}  // namespace

void ValidateTrainingOptions(const TrainingOptions& o) {
  bool known = IsTorchScriptPath(o.model);
  for (const std::string& n : ModelNames()) known = known || n == o.model;
  if (!known) {
    throw std::invalid_argument("--model=" + o.model +
                                ": use mlp, cnn, resnet or a TorchScript "
                                "file PATH.pt");
  }
  if (o.data != kFashionMnistData) {
    if (!IsTorchScriptPath(o.data)) {
      throw std::invalid_argument("--data=" + o.data + ": use " +
                                  kFashionMnistData +
                                  " or a TorchScript data hook PATH.pt");
    }
    // The hook is the whole dataset: these would be silently ignored.
    if (o.max_train != 0) {
      throw std::invalid_argument(
          "--max_train only applies to --data=fashion-mnist; a data hook "
          "chooses its own training set");
    }
    if (o.data_dir != kDefaultFashionMnistDir) {
      throw std::invalid_argument(
          "--data_dir only applies to --data=fashion-mnist");
    }
  }
  if (o.batch < 1 || o.batch > 4096) {
    throw std::invalid_argument("--batch=" + std::to_string(o.batch) +
                                ": use 1..4096, e.g. 64");
  }
  if (!(std::isfinite(o.lr) && o.lr > 0 && o.lr <= 10)) {
    throw std::invalid_argument("--lr=" + std::to_string(o.lr) +
                                ": use a learning rate in (0, 10], e.g. "
                                "0.05");
  }
  if (!(std::isfinite(o.momentum) && o.momentum >= 0 && o.momentum < 1)) {
    throw std::invalid_argument("momentum must be in [0, 1)");
  }
  if (o.threads < 1 || o.threads > 256) {
    throw std::invalid_argument("--train_threads=" + std::to_string(o.threads) +
                                ": use 1..256 (1 on a shared machine)");
  }
  if (o.max_eval < 1) {
    throw std::invalid_argument("--max_eval must be >= 1 test image");
  }
  if (o.data_dir.empty()) {
    throw std::invalid_argument(std::string("--data_dir is empty: use ") +
                                kDefaultFashionMnistDir);
  }
}

struct TrainingSource::Impl {
  TrainingOptions o;
  Model model;
  std::vector<torch::Tensor> params;  // flattening order
  std::vector<std::string> names;
  uint64_t floats = 0;
  std::unique_ptr<torch::optim::SGD> optimizer;
  std::unique_ptr<DataHook> hook;     // --data=PATH.pt; Fashion-MNIST if null
  int64_t min_classes = kNumClasses;  // logits columns the targets need

  // Training set as read, until Bind takes this worker's shard.
  RawSplit raw_train;
  uint32_t train_total = 0;  // images the shards are cut from
  torch::Tensor test_images, test_labels;

  bool bound = false;
  uint32_t rank = 0, num_workers = 1;
  torch::Tensor shard_images, shard_labels;
  uint32_t shard = 0;
  // Full batches per epoch (the tail is dropped); a data hook's
  // steps_per_epoch, 0 when it has none (one epoch: the whole job).
  uint32_t per_epoch = 0;
  uint64_t steps = 0;  // batches taken: the hook's `step`

  uint32_t epoch = 0;       // epoch in progress, 0-based
  uint32_t cursor = 0;      // batches taken in this epoch
  torch::Tensor order;      // this epoch's permutation of the shard
  bool epoch_done = false;  // the latest batch closed an epoch
  double loss_sum = 0;
  double eval_seconds = 0;  // spent in test evaluations since Bind
  uint32_t loss_n = 0;
  double batch_loss = std::numeric_limits<double>::quiet_NaN();
  double epoch_loss = std::numeric_limits<double>::quiet_NaN();
  double accuracy = std::numeric_limits<double>::quiet_NaN();
  uint32_t completed = 0;
  uint64_t applied = 0;             // iterations whose step has been taken
  uint64_t logged_at = UINT64_MAX;  // `applied` of the latest log line
  bool logged_eval = false;         // ... and whether it evaluated
  std::chrono::steady_clock::time_point start;
  std::ofstream csv;

  void NewEpoch() {
    cursor = 0;
    if (hook) return;  // the hook orders its own batches
    const std::vector<uint32_t> p =
        SeededPermutation(shard, EpochSeed(o.seed, rank, epoch));
    order =
        torch::tensor(std::vector<int64_t>(p.begin(), p.end()), torch::kInt64);
  }

  // The next training minibatch: inputs and targets.
  Batch NextBatch() {
    if (per_epoch != 0 && cursor == per_epoch) {
      ++epoch;
      NewEpoch();
    }
    ++cursor;
    const auto step = static_cast<int64_t>(steps++);
    if (hook) return hook->Train(step, rank, num_workers, o.batch);
    const torch::Tensor idx = order.slice(0, int64_t{cursor - 1} * o.batch,
                                          int64_t{cursor} * o.batch);
    return {shard_images.index_select(0, idx),
            shard_labels.index_select(0, idx)};
  }

  // Forward and backward on iteration `it`'s minibatch; leaves the
  // gradients in the parameters' .grad().
  void ForwardBackward(uint64_t /*it*/) {
    if (!bound) throw std::logic_error("training source used before Bind");
    const Batch b = NextBatch();
    model.set_training(true);
    optimizer->zero_grad();
    const torch::Tensor logits = model.forward(b.first);
    CheckLogits(model, b.first, logits, min_classes);
    const torch::Tensor loss = model.loss(logits, b.second);
    loss.backward();
    batch_loss = loss.item<double>();
    loss_sum += batch_loss;
    ++loss_n;
    epoch_done = per_epoch != 0 && cursor == per_epoch;
  }

  void AfterStep(uint64_t it) {
    applied = it + 1;
    const bool last = o.iterations != 0 && applied == o.iterations;
    if (epoch_done) {
      epoch_done = false;
      ++completed;
      Log(completed, o.eval_every_epoch || last);
    }
    if (last) Finish();
  }

  void Finish() {
    if (logged_at == applied && logged_eval) return;
    // A partial epoch at the end is reported as the epoch in progress.
    const bool partial = cursor > 0 && (per_epoch == 0 || cursor < per_epoch);
    Log(completed + (partial ? 1 : 0), true);
  }

  void Log(uint32_t epoch_number, bool evaluate) {
    epoch_loss = loss_n > 0 ? loss_sum / loss_n
                            : std::numeric_limits<double>::quiet_NaN();
    loss_sum = 0;
    loss_n = 0;
    const auto eval_start = std::chrono::steady_clock::now();
    const double acc =
        evaluate ? Evaluate() : std::numeric_limits<double>::quiet_NaN();
    const auto now = std::chrono::steady_clock::now();
    // Test evaluations are bookkeeping, not training: train_s leaves them
    // out so a policy's training time is not diluted by a fixed cost.
    eval_seconds += std::chrono::duration<double>(now - eval_start).count();
    const double wall = std::chrono::duration<double>(now - start).count();
    logged_at = applied;
    logged_eval = evaluate;
    if (o.verbose) {
      std::printf("epoch %u iteration %llu train_loss %s test_accuracy %s\n",
                  epoch_number, static_cast<unsigned long long>(applied),
                  FormatDouble(epoch_loss, 4).c_str(),
                  FormatDouble(acc, 4).c_str());
      std::fflush(stdout);
    }
    if (csv.is_open()) {
      csv << epoch_number << ',' << applied << ','
          << FormatDouble(epoch_loss, 6) << ',' << FormatDouble(acc, 6) << ','
          << FormatDouble(wall, 3) << ','
          << FormatDouble(wall - eval_seconds, 3) << '\n';
      csv.flush();
    }
  }

  // Fashion-MNIST: this worker's shard of the training set.
  void TakeShard() {
    const std::vector<uint32_t> indices = ShardIndices(
        raw_train.images.count, rank, num_workers, o.seed, train_total);
    if (indices.size() < o.batch) {
      throw std::runtime_error(
          "worker " + std::to_string(rank) + "'s shard holds " +
          std::to_string(indices.size()) + " images, fewer than --batch=" +
          std::to_string(o.batch) + ": use fewer workers or a smaller batch");
    }
    const Dataset d = Normalize(raw_train, indices);
    raw_train = RawSplit{};  // the shard is all this worker needs now
    shard_images = ImagesTensor(d);
    shard_labels = LabelsTensor(d);
    shard = d.count;
    per_epoch = shard / o.batch;
  }

  // Reads everything now, and runs the model once on the data: a bad
  // dataset, hook or model must stop the worker before it joins, not in
  // the middle of the job.
  void LoadData() {
    if (o.data != kFashionMnistData) {
      hook = std::make_unique<DataHook>(o.data);
      min_classes = 1;  // the hook's targets say how many there are
      // Rank 0 of 1 until Bind: the first batch any worker could see.
      const Batch probe = hook->Train(0, 0, 1, o.batch);
      ProbeModel(model, probe.first, probe.second, min_classes,
                 "--data=" + o.data);
      return;
    }
    raw_train = LoadRawSplit(o.data_dir, Split::kTrain);
    train_total = raw_train.images.count;
    if (o.max_train != 0) train_total = std::min(train_total, o.max_train);
    RawSplit test = LoadRawSplit(o.data_dir, Split::kTest);
    std::vector<uint32_t> first(std::min(o.max_eval, test.images.count));
    for (uint32_t i = 0; i < first.size(); ++i) first[i] = i;
    const Dataset t = Normalize(test, first);
    test_images = ImagesTensor(t);
    test_labels = LabelsTensor(t);
    const int64_t k = std::min<int64_t>(2, test_images.size(0));
    ProbeModel(model, test_images.slice(0, 0, k), test_labels.slice(0, 0, k),
               min_classes, "Fashion-MNIST");
  }

  double Evaluate() {
    if (hook && !hook->has_eval()) {
      return accuracy = std::numeric_limits<double>::quiet_NaN();
    }
    torch::NoGradGuard no_grad;
    model.set_training(false);
    int64_t n = 0, correct = 0;
    // Up to max_eval test inputs, in batches of kEvalBatch (a hook's last
    // ones may be shorter, and it may end earlier with an empty batch).
    for (int64_t index = 0; n < o.max_eval; ++index) {
      const int64_t want = std::min<int64_t>(kEvalBatch, o.max_eval - n);
      Batch b;
      if (hook) {
        b = hook->Eval(index, want);
        if (b.first.dim() == 0 || b.first.size(0) == 0) break;
      } else {
        if (n >= test_images.size(0)) break;
        const int64_t e = std::min<int64_t>(test_images.size(0), n + want);
        b = {test_images.slice(0, n, e), test_labels.slice(0, n, e)};
      }
      const int64_t rows = std::min<int64_t>(b.first.size(0), want);
      const torch::Tensor pred = model.forward(b.first).argmax(1);
      // Class-probability targets [N, C] count their most likely class.
      const torch::Tensor y =
          b.second.dim() == 2 ? b.second.argmax(1) : b.second;
      correct += pred.slice(0, 0, rows)
                     .eq(y.slice(0, 0, rows).to(torch::kInt64))
                     .sum()
                     .item<int64_t>();
      n += rows;
    }
    model.set_training(true);
    accuracy = n == 0 ? std::numeric_limits<double>::quiet_NaN()
                      : static_cast<double>(correct) / static_cast<double>(n);
    return accuracy;
  }
};

TrainingSource::TrainingSource(const TrainingOptions& o)
    : impl_(std::make_unique<Impl>()) {
  ValidateTrainingOptions(o);
  Impl& s = *impl_;
  s.o = o;
  torch::set_num_threads(static_cast<int>(o.threads));
  // Seeds the built-ins' initialisers; a TorchScript model brings its
  // weights, and a data hook drawing random numbers gets the same
  // generator state in every worker.
  s.model = IsTorchScriptPath(o.model) ? LoadTorchScriptModel(o.model)
                                       : MakeModel(o.model, o.seed);
  torch::manual_seed(o.seed);
  s.names = s.model.names;
  s.params = s.model.params;
  for (const torch::Tensor& p : s.params) {
    s.floats += static_cast<uint64_t>(p.numel());
  }
  s.optimizer = std::make_unique<torch::optim::SGD>(
      s.params, torch::optim::SGDOptions(o.lr).momentum(o.momentum));
  s.LoadData();

  if (!o.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec || !std::filesystem::is_directory(o.log_dir)) {
      throw std::runtime_error("--train_log_dir=" + o.log_dir +
                               ": cannot create the directory (" +
                               ec.message() + ")");
    }
  }
}

TrainingSource::~TrainingSource() = default;

std::vector<LayerInfo> TrainingSource::Layers() const {
  std::vector<LayerInfo> layers;
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    const auto sizes = impl_->params[i].sizes();
    layers.push_back(
        {impl_->names[i], std::vector<int64_t>(sizes.begin(), sizes.end())});
  }
  return layers;
}

uint64_t TrainingSource::floats() const { return impl_->floats; }

void TrainingSource::Bind(uint32_t rank, uint32_t num_workers) {
  Impl& s = *impl_;
  if (s.bound) throw std::logic_error("training source bound twice");
  if (num_workers == 0 || rank >= num_workers) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " of " +
                                std::to_string(num_workers) + " workers");
  }
  s.rank = rank;
  s.num_workers = num_workers;
  if (s.hook) {
    s.per_epoch = static_cast<uint32_t>(std::min<int64_t>(
        s.hook->StepsPerEpoch(num_workers, s.o.batch), UINT32_MAX));
  } else {
    s.TakeShard();
  }
  s.bound = true;
  s.NewEpoch();
  if (!s.o.log_dir.empty()) {
    const std::string path =
        s.o.log_dir + "/training-w" + std::to_string(rank) + ".csv";
    s.csv.open(path, std::ios::trunc);
    if (!s.csv) throw std::runtime_error(path + ": cannot write");
    s.csv << "epoch,iteration,train_loss,test_accuracy,wall_s,train_s\n";
  }
  s.start = std::chrono::steady_clock::now();
}

void TrainingSource::Compute(uint64_t it, std::span<float> grad) {
  Impl& s = *impl_;
  if (grad.size() != s.floats) {
    throw std::invalid_argument(
        "gradient buffer of " + std::to_string(grad.size()) +
        " floats, the model has " + std::to_string(s.floats));
  }
  s.ForwardBackward(it);
  size_t at = 0;
  for (const torch::Tensor& p : s.params) {
    const size_t n = static_cast<size_t>(p.numel());
    const torch::Tensor& g = p.grad();
    if (g.defined()) {
      const torch::Tensor c = g.contiguous();
      std::memcpy(grad.data() + at, c.data_ptr<float>(), n * sizeof(float));
    } else {
      // A parameter the loss does not reach has no gradient: send zeros.
      std::memset(grad.data() + at, 0, n * sizeof(float));
    }
    at += n;
  }
}

void TrainingSource::Apply(uint64_t it, std::span<const float> average) {
  Impl& s = *impl_;
  if (average.size() != s.floats) {
    throw std::invalid_argument(
        "averaged gradient of " + std::to_string(average.size()) +
        " floats, the model has " + std::to_string(s.floats));
  }
  if (!s.bound) throw std::logic_error("training source used before Bind");
  size_t at = 0;
  {
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : s.params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      // from_blob only wraps the buffer; copy_ reads it, never writes.
      const torch::Tensor src = torch::from_blob(
          const_cast<float*>(average.data() + at), p.sizes(), torch::kFloat32);
      p.mutable_grad().copy_(src);
      at += static_cast<size_t>(p.numel());
    }
  }
  s.optimizer->step();
  s.AfterStep(it);
}

void TrainingSource::ExportModel(std::span<float> out) {
  const std::vector<float> flat = FlatParameters();
  if (out.size() != flat.size()) {
    throw std::invalid_argument(
        "model buffer of " + std::to_string(out.size()) +
        " floats, the model has " + std::to_string(flat.size()));
  }
  std::copy(flat.begin(), flat.end(), out.begin());
}

void TrainingSource::ImportModel(std::span<const float> model) {
  Impl& s = *impl_;
  if (model.size() != s.floats) {
    throw std::invalid_argument("model of " + std::to_string(model.size()) +
                                " floats, this one has " +
                                std::to_string(s.floats));
  }
  torch::NoGradGuard no_grad;
  size_t at = 0;
  for (torch::Tensor& p : s.params) {
    const torch::Tensor src = torch::from_blob(
        const_cast<float*>(model.data() + at), p.sizes(), torch::kFloat32);
    p.copy_(src);
    at += static_cast<size_t>(p.numel());
  }
}

void TrainingSource::LocalStep(uint64_t it) {
  impl_->ForwardBackward(it);
  impl_->optimizer->step();
  impl_->AfterStep(it);
}

double TrainingSource::Evaluate() { return impl_->Evaluate(); }

void TrainingSource::Finish() { impl_->Finish(); }

std::string TrainingSource::Describe() const {
  const Impl& s = *impl_;
  std::string d = "train(" + s.o.model + ", " + std::to_string(s.floats) +
                  " params, batch " + std::to_string(s.o.batch) + ", lr " +
                  FormatDouble(s.o.lr, 4) + ", momentum " +
                  FormatDouble(s.o.momentum, 2);
  if (s.hook) {
    d += ", data " + s.o.data;
  } else if (s.bound) {
    d += ", shard " + std::to_string(s.shard) + "/" +
         std::to_string(s.train_total) + " images";
  }
  return d + ")";
}

std::vector<float> TrainingSource::FlatParameters() const {
  std::vector<float> out;
  out.reserve(impl_->floats);
  for (const torch::Tensor& p : impl_->params) {
    const torch::Tensor c = p.detach().contiguous();
    const float* f = c.data_ptr<float>();
    out.insert(out.end(), f, f + c.numel());
  }
  return out;
}

double TrainingSource::last_batch_loss() const { return impl_->batch_loss; }
double TrainingSource::last_epoch_loss() const { return impl_->epoch_loss; }
double TrainingSource::last_test_accuracy() const { return impl_->accuracy; }
uint32_t TrainingSource::epochs_completed() const { return impl_->completed; }
uint32_t TrainingSource::shard_size() const { return impl_->shard; }
uint32_t TrainingSource::iterations_per_epoch() const {
  return impl_->per_epoch;
}

}  // namespace dblp::training

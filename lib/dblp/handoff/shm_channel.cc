#include "dblp/handoff/shm_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <new>
#include <stdexcept>
#include <utility>

#include "dblp/handoff/shm_guard.h"

namespace dblp {
namespace {

constexpr size_t kPage = 4096;

size_t RoundUp(size_t n) { return (n + kPage - 1) / kPage * kPage; }

size_t LayersOffset() { return RoundUp(sizeof(ShmHeader)); }
size_t GradientOffset() {
  return LayersOffset() + RoundUp(kShmMaxLayers * sizeof(ShmLayer));
}

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// Names as shm_open wants them: one leading '/', no other.
std::string CheckName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos || name.size() > 200) {
    throw std::runtime_error("shared-memory name '" + name +
                             "': use one path component with a leading "
                             "'/', e.g. /dblp-w0");
  }
  return name;
}

long Futex(const std::atomic<uint32_t>* word, int op, uint32_t val,
           const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), op, val,
                 timeout, nullptr, 0);
}

// Why the header's layout is not the one this build computes for
// `floats` and `num_layers` (read once by the caller), or "".
std::string CheckHeader(const ShmHeader& h, uint64_t floats,
                        uint32_t num_layers, size_t bytes) {
  if (floats == 0 || floats > kShmMaxFloats) {
    return "floats " + std::to_string(floats) + " outside 1..2^32";
  }
  if (bytes != ShmRegionBytes(floats) || h.region_bytes != bytes) {
    return "size " + std::to_string(bytes) + " bytes, region_bytes " +
           std::to_string(h.region_bytes) + ", expected " +
           std::to_string(ShmRegionBytes(floats)) + " for " +
           std::to_string(floats) + " floats";
  }
  if (num_layers == 0 || num_layers > kShmMaxLayers) {
    return std::to_string(num_layers) + " layers, not 1.." +
           std::to_string(kShmMaxLayers);
  }
  if (h.layers_offset != LayersOffset() ||
      h.gradient_offset != GradientOffset() ||
      h.mean_offset != GradientOffset() + RoundUp(floats * sizeof(float))) {
    return "offsets of the layers, gradient or mean differ from this "
           "build's";
  }
  return "";
}

}  // namespace

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<uint64_t>(ts.tv_nsec);
}

size_t ShmRegionBytes(uint64_t floats) {
  const size_t array = RoundUp(floats * sizeof(float));
  return GradientOffset() + 2 * array;
}

ShmChannel::ShmChannel(std::string name, void* base, size_t bytes)
    : name_(std::move(name)),
      base_(base),
      bytes_(bytes),
      header_(static_cast<ShmHeader*>(base)) {}

ShmChannel::ShmChannel(ShmChannel&& o) noexcept { *this = std::move(o); }

ShmChannel& ShmChannel::operator=(ShmChannel&& o) noexcept {
  if (this != &o) {
    Unmap();
    name_ = std::move(o.name_);
    unlinked_ = std::exchange(o.unlinked_, false);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    header_ = std::exchange(o.header_, nullptr);
    floats_ = std::exchange(o.floats_, 0);
    num_layers_ = std::exchange(o.num_layers_, 0);
    trainer_pid_ = std::exchange(o.trainer_pid_, 0);
    gradient_ = std::exchange(o.gradient_, nullptr);
    mean_ = std::exchange(o.mean_, nullptr);
    shared_layers_ = std::exchange(o.shared_layers_, nullptr);
    layers_ = std::move(o.layers_);
    o.layers_.clear();
  }
  return *this;
}

void ShmChannel::SetLayout(uint64_t floats, uint32_t num_layers) {
  char* base = static_cast<char*>(base_);
  floats_ = floats;
  num_layers_ = num_layers;
  shared_layers_ = reinterpret_cast<const ShmLayer*>(base + LayersOffset());
  gradient_ = reinterpret_cast<float*>(base + GradientOffset());
  mean_ = reinterpret_cast<float*>(base + GradientOffset() +
                                   RoundUp(floats * sizeof(float)));
}

ShmChannel::~ShmChannel() { Unmap(); }

void ShmChannel::Unmap() {
  if (base_ == nullptr) return;
  ShmGuard::Release(base_);  // before the address can be mapped again
  munmap(base_, bytes_);
  base_ = nullptr;
}

std::string ShmChannel::Truncated() const {
  if (base_ == nullptr || !ShmGuard::Truncated(base_)) return "";
  return "the trainer truncated the hand-off region " + name_ + " below its " +
         std::to_string(bytes_) +
         " bytes while this worker used it (ftruncate or a re-created "
         "object): the part it cut was read as zeros; one dblp.Worker per "
         "region, never resized while the worker runs";
}

ShmChannel ShmChannel::Create(const std::string& name, uint64_t floats,
                              std::span<const ShmLayer> layers) {
  CheckName(name);
  if (floats == 0 || floats > kShmMaxFloats) {
    throw std::runtime_error("shared-memory gradient of " +
                             std::to_string(floats) +
                             " floats: give 1 to 2^32 floats");
  }
  if (layers.size() > kShmMaxLayers) {
    throw std::runtime_error(
        std::to_string(layers.size()) + " layers: at most " +
        std::to_string(kShmMaxLayers) + " (merge small ones)");
  }
  uint64_t sum = 0;
  for (const ShmLayer& l : layers) {
    sum += std::min<uint64_t>(l.floats, kShmMaxFloats + 1);  // cannot wrap
  }
  if (!layers.empty() && sum != floats) {
    throw std::runtime_error("the layers hold " + std::to_string(sum) +
                             " floats, the gradient " + std::to_string(floats));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    throw std::runtime_error(
        Errno("shm_open(" + name + ")") +
        (errno == EEXIST ? " (another trainer uses this name, or a dead one "
                           "left it: rm /dev/shm" +
                               name + ")"
                         : " (is /dev/shm mounted and writable?)"));
  }
  const size_t bytes = ShmRegionBytes(floats);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string err = Errno("sizing " + name);
    close(fd);
    shm_unlink(name.c_str());
    throw std::runtime_error(err + " (is /dev/shm big enough? df /dev/shm)");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw std::runtime_error(Errno("mapping " + name));
  }
  ShmChannel ch(name, base, bytes);
  ch.SetLayout(floats,
               layers.empty() ? 1 : static_cast<uint32_t>(layers.size()));
  // The object is fresh (zero-filled): construct the atomics in place.
  ShmHeader* h = new (base) ShmHeader{};
  h->magic = kShmMagic;
  h->version = kShmVersion;
  h->floats = floats;
  h->region_bytes = bytes;
  h->layers_offset = LayersOffset();
  h->gradient_offset = GradientOffset();
  h->mean_offset = GradientOffset() + RoundUp(floats * sizeof(float));
  h->trainer_pid = getpid();
  auto* table =
      reinterpret_cast<ShmLayer*>(static_cast<char*>(base) + h->layers_offset);
  if (layers.empty()) {
    ShmLayer one{};
    std::strncpy(one.name, "gradient", sizeof(one.name) - 1);
    one.floats = floats;
    table[0] = one;
    h->num_layers = 1;
  } else {
    for (size_t i = 0; i < layers.size(); ++i) {
      table[i] = layers[i];
      table[i].name[kShmLayerNameBytes - 1] = '\0';
    }
    h->num_layers = static_cast<uint32_t>(layers.size());
  }
  ch.trainer_pid_ = h->trainer_pid;
  ch.layers_.assign(table, table + h->num_layers);
  return ch;
}

ShmChannel ShmChannel::Open(const std::string& name) {
  CheckName(name);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    throw std::runtime_error(Errno("shm_open(" + name + ")") +
                             " (the trainer creates it: let dblp.Worker "
                             "start this worker, or start the trainer first "
                             "with dblp.Worker(shm=NAME) and give the same "
                             "NAME here)");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 ||
      static_cast<size_t>(st.st_size) < sizeof(ShmHeader)) {
    close(fd);
    throw std::runtime_error(name + " is too small to be a DBLP hand-off");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) throw std::runtime_error(Errno("mapping " + name));
  // Before the first read: the trainer may shrink the object at any time
  // (shm_guard.h).
  std::string why;
  if (!ShmGuard::Guard(base, bytes, &why)) {
    munmap(base, bytes);
    throw std::runtime_error(why);
  }
  ShmChannel ch(name, base, bytes);
  ShmHeader& h = ch.header();
  // A trainer and a worker of different builds, or a stray object: never
  // trust an offset that is not the one this build computes.
  if (h.magic != kShmMagic || h.version != kShmVersion) {
    throw std::runtime_error(name +
                             " is not a DBLP hand-off of this version (run "
                             "the trainer's package and dblp-worker from the "
                             "same build)");
  }
  // Read once: the trainer can change the header at any time after.
  const uint64_t floats = h.floats;
  const uint32_t num_layers = h.num_layers;
  const pid_t trainer = h.trainer_pid;
  if (std::string bad = CheckHeader(h, floats, num_layers, bytes);
      !bad.empty()) {
    throw std::runtime_error(name + ": inconsistent header (" + bad +
                             "): a corrupt object, or not made by dblp.Worker");
  }
  if (trainer <= 0) {
    throw std::runtime_error(name + ": the header names trainer pid " +
                             std::to_string(trainer) +
                             ", not a process (a corrupt object)");
  }
  ch.SetLayout(floats, num_layers);
  ch.trainer_pid_ = trainer;
  ch.layers_.assign(ch.shared_layers_, ch.shared_layers_ + num_layers);
  uint64_t sum = 0;
  for (const ShmLayer& l : ch.layers_) {
    sum += std::min<uint64_t>(l.floats, kShmMaxFloats + 1);  // cannot wrap
  }
  if (sum != floats) {
    throw std::runtime_error(name + ": the layer table holds " +
                             std::to_string(sum) + " floats, the gradient " +
                             std::to_string(floats) + " (a corrupt object)");
  }
  // One worker per trainer: a second one would take over the answers.
  int32_t unclaimed = 0;
  if (!std::atomic_ref<int32_t>(h.worker_pid)
           .compare_exchange_strong(unclaimed, getpid())) {
    throw std::runtime_error(name + " is already served by dblp-worker pid " +
                             std::to_string(unclaimed) +
                             " (one worker per trainer: give this one the "
                             "name of another trainer's object)");
  }
  return ch;
}

std::span<const ShmLayer> ShmChannel::layers() const { return layers_; }

std::string ShmChannel::LayerTableChanged() const {
  if (shared_layers_ == nullptr) return "";
  for (size_t i = 0; i < layers_.size(); ++i) {
    const ShmLayer& was = layers_[i];
    const ShmLayer& now = shared_layers_[i];
    if (std::memcmp(&was, &now, sizeof was) == 0) continue;
    // Read as zeros past the object's new end: the truncation is the cause.
    if (std::string cut = Truncated(); !cut.empty()) return cut;
    const auto label = [](const ShmLayer& l) {
      return "'" + std::string(l.name, strnlen(l.name, sizeof l.name)) +
             "' of " + std::to_string(l.floats) + " floats";
    };
    return "the trainer rewrote the layer table of " + name_ +
           " after this worker claimed it (layer " + std::to_string(i) +
           " was " + label(was) + ", is now " + label(now) +
           "): one dblp.Worker per model, its layers fixed before the "
           "worker starts";
  }
  return "";
}

std::span<float> ShmChannel::gradient() const { return {gradient_, floats_}; }

std::span<float> ShmChannel::mean() const { return {mean_, floats_}; }

void ShmChannel::Unlink() {
  // Once: a later object of the same name is not ours to remove.
  if (!name_.empty() && !unlinked_) shm_unlink(name_.c_str());
  unlinked_ = true;
}

void ShmChannel::PostToWorker(ShmPost kind, uint64_t iteration) {
  header_->post_kind = static_cast<uint32_t>(kind);
  header_->post_iteration = iteration;
  header_->post_ns = MonotonicNs();
  header_->to_worker.fetch_add(1, std::memory_order_release);
  Wake(header_->to_worker);
}

void ShmChannel::PostAbort(const std::string& why, uint64_t iteration) {
  const size_t n = std::min(why.size(), kShmErrorBytes - 1);
  std::memcpy(header_->error, why.data(), n);
  header_->error[n] = '\0';
  PostToWorker(ShmPost::kAbort, iteration);  // release: the text first
}

void ShmChannel::PostToTrainer() {
  header_->info.worker_post_ns = MonotonicNs();
  header_->to_trainer.fetch_add(1, std::memory_order_release);
  Wake(header_->to_trainer);
}

void ShmChannel::SetWorkerState(ShmWorkerState s) {
  header_->worker_state.store(static_cast<uint32_t>(s),
                              std::memory_order_release);
  Wake(header_->worker_state);
  // A trainer waiting for an answer learns of the end too. Not on join: a
  // trainer that read the answer count before this bump would take it for
  // the answer to its first post.
  if (s == ShmWorkerState::kFailed || s == ShmWorkerState::kDone) {
    header_->to_trainer.fetch_add(1, std::memory_order_release);
    Wake(header_->to_trainer);
  }
}

void ShmChannel::SetFailed(const std::string& why) {
  const size_t n = std::min(why.size(), kShmErrorBytes - 1);
  std::memcpy(header_->error, why.data(), n);
  header_->error[n] = '\0';
  SetWorkerState(ShmWorkerState::kFailed);
}

bool ShmChannel::WaitChange(const std::atomic<uint32_t>& word, uint32_t seen,
                            uint32_t slice_ms) {
  // About 20 us of polling before sleeping in the kernel: the other side
  // often answers that fast, and a futex wake-up costs more than that.
  const uint64_t spin_until = MonotonicNs() + 20'000;
  while (MonotonicNs() < spin_until) {
    if (word.load(std::memory_order_acquire) != seen) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  const uint64_t deadline = MonotonicNs() + uint64_t{slice_ms} * 1'000'000;
  for (;;) {
    if (word.load(std::memory_order_acquire) != seen) return true;
    const uint64_t now = MonotonicNs();
    if (now >= deadline) return false;
    const uint64_t left = deadline - now;
    const timespec ts{static_cast<time_t>(left / 1'000'000'000),
                      static_cast<long>(left % 1'000'000'000)};
    // EAGAIN (the word already changed), EINTR and ETIMEDOUT all lead back
    // to the check above.
    Futex(&word, FUTEX_WAIT, seen, &ts);
  }
}

void ShmChannel::Wake(std::atomic<uint32_t>& word) {
  Futex(&word, FUTEX_WAKE, INT32_MAX, nullptr);
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  // A dead child its parent has not reaped yet still answers kill().
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ||
         line[paren + 2] != 'Z';
}

}  // namespace dblp

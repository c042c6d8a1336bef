// The hand-off between a training process (PyTorch, python/dblp) and its
// poll-mode dblp-worker: one POSIX shared-memory object holding a header,
// the layer table, the gradient and the mean.
//
// The trainer writes the gradient in place (a torch tensor over the shm),
// posts it (to_worker += 1, futex wake); the worker's push reads the frames
// straight from it and the broadcast lands straight in the mean, then it
// fills in the iteration's info and answers (to_trainer += 1, futex wake).
// Neither side copies the gradient or the mean: the only copies are into
// and out of the frames.
//
// Each futex word has one writer (named at the field); both sides wait with
// a time slice and check that the other is alive between slices, so a
// process that dies never leaves the other waiting forever.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dblp {

inline constexpr uint32_t kShmMagic = 0x444C4253;  // "SBLD" little-endian
inline constexpr uint32_t kShmVersion = 1;
inline constexpr uint32_t kShmMaxLayers = 4096;
inline constexpr size_t kShmLayerNameBytes = 56;
inline constexpr size_t kShmErrorBytes = 1024;

// What the trainer posted (ShmHeader::post_kind).
enum class ShmPost : uint32_t {
  kNone = 0,
  kGradient = 1,  // a training step's gradient is in gradient()
  kModel = 2,     // a re-synchronisation: the parameters are in gradient()
  kEnd = 3,       // no more steps: the worker says BYE and exits
  kAbort = 4,     // the trainer is ending on an error, whose text is in
                  // error: the worker fails the job naming it (never a BYE,
                  // which the server would take for a finish)
};

// The worker's life (ShmHeader::worker_state, a futex word).
enum class ShmWorkerState : uint32_t {
  kStarting = 0,  // shm opened, joining
  kJoined = 1,    // rank, num_workers, resync_every valid
  kFailed = 2,    // error holds the cause
  kDone = 3,      // the job ended (BYE sent, rows written)
};

// Written by the worker before it answers; read by the trainer after.
struct ShmIterationInfo {
  uint64_t iteration;         // protocol iteration
  double delivered_fraction;  // of the broadcast (the mean) this worker got
  double p;                   // loss tolerance of the push round
  double send_latency_us;     // push round: first frame -> STOP/complete
  double bcast_latency_us;    // push end -> enough of the mean
  double control_rtt_us;
  uint64_t packets_sent;
  uint32_t passes;
  uint32_t critical;  // 1: the CLR detector says critical (P_low)
  uint32_t resync;    // 1: a parameter re-synchronisation
  uint32_t burst;     // 1: the loss injector's microburst was on
  // CLOCK_MONOTONIC ns, comparable across processes: the hand-off cost.
  uint64_t trainer_post_ns;  // trainer posted
  uint64_t worker_wake_ns;   // worker saw the post
  uint64_t worker_post_ns;   // worker answered (the trainer times its wake)
};

struct ShmLayer {
  char name[kShmLayerNameBytes];  // NUL-terminated
  uint64_t floats;
};
static_assert(sizeof(ShmLayer) == 64);

struct alignas(64) ShmHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t floats;  // gradient length
  uint64_t region_bytes;
  uint64_t layers_offset, gradient_offset, mean_offset;
  uint32_t num_layers;
  int32_t trainer_pid;  // trainer, at Create (the worker keeps its copy)
  // Trainer -> worker. post_kind and post_iteration are written before
  // to_worker is incremented (release) and read after it (acquire).
  alignas(64) std::atomic<uint32_t> to_worker;  // writer: trainer
  uint32_t post_kind;                           // ShmPost
  uint64_t post_iteration;
  uint64_t post_ns;
  // Worker -> trainer.
  alignas(64) std::atomic<uint32_t> to_trainer;  // writer: worker
  std::atomic<uint32_t> worker_state;            // writer: worker
  int32_t worker_pid;                            // worker, at Open
  uint32_t rank, num_workers, resync_every;      // valid once kJoined
  ShmIterationInfo info;
  // The worker's failure once kFailed; before that, the trainer's reason
  // with a kAbort post.
  char error[kShmErrorBytes];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(ShmHeader) % 64 == 0);

// Nanoseconds of CLOCK_MONOTONIC (the same clock in every process).
uint64_t MonotonicNs();

// One mapping of the shared object. Move-only; unmaps on destruction.
class ShmChannel {
 public:
  // Trainer side: creates (exclusively) /dev/shm/<name> sized for
  // `floats` and maps it. `layers` (at most kShmMaxLayers, names cut to
  // fit) must sum to `floats`; empty: one layer "gradient". Throws
  // std::runtime_error naming the fix.
  static ShmChannel Create(const std::string& name, uint64_t floats,
                           std::span<const ShmLayer> layers);
  // Worker side: maps an existing object, checks its header and claims it
  // (one worker per trainer). The trainer may be hostile to a worker with
  // more privileges: every size and offset, the trainer's pid and the
  // layer table are checked once here and kept in this process, never read
  // back from the shared header. Throws std::runtime_error naming the fix.
  static ShmChannel Open(const std::string& name);

  ShmChannel(ShmChannel&& o) noexcept;
  ShmChannel& operator=(ShmChannel&& o) noexcept;
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;
  ~ShmChannel();

  // The shared header: the futex words, posts, answers and info. Its
  // sizes and offsets are the other side's to change; use the accessors.
  ShmHeader& header() const { return *header_; }
  uint64_t floats() const { return floats_; }
  // The layer table as it was at Create / Open (this process's copy).
  std::span<const ShmLayer> layers() const;
  // The trainer's pid as it was at Create / Open: a trainer that rewrites
  // the shared one cannot make the worker watch another process.
  pid_t trainer_pid() const { return trainer_pid_; }
  // Why the shared layer table no longer is the one claimed ("" if it
  // is): the trainer rewrote it, and trainer and worker would disagree on
  // what the floats are.
  std::string LayerTableChanged() const;
  // Worker side: why the region can no longer be trusted ("" while it
  // can): the trainer shrank the object under the mapping, and an access
  // past its end read zeros instead of dying by SIGBUS (shm_guard.h).
  std::string Truncated() const;
  std::span<float> gradient() const;
  std::span<float> mean() const;
  const std::string& name() const { return name_; }
  // Removes the name (the mapping stays valid). The creator calls it.
  void Unlink();

  // Trainer: post `kind` for `iteration`.
  void PostToWorker(ShmPost kind, uint64_t iteration);
  // Trainer side: kAbort with `why` (cut to fit) in the error text.
  void PostAbort(const std::string& why, uint64_t iteration);
  // Worker: the mean and info are written; wake the trainer.
  void PostToTrainer();
  // Worker: publish a state (and wake whoever waits on it or on an answer).
  void SetWorkerState(ShmWorkerState s);
  // Worker: state kFailed with `why` (cut to fit).
  void SetFailed(const std::string& why);

  // Waits until *word != seen, at most slice_ms (a short spin first: the
  // answer often comes within microseconds). True if it changed.
  static bool WaitChange(const std::atomic<uint32_t>& word, uint32_t seen,
                         uint32_t slice_ms);
  static void Wake(std::atomic<uint32_t>& word);

 private:
  ShmChannel(std::string name, void* base, size_t bytes);
  // Fixes the layout from `floats` (the only input; the offsets follow).
  void SetLayout(uint64_t floats, uint32_t num_layers);
  void Unmap();
  std::string name_;
  bool unlinked_ = false;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  ShmHeader* header_ = nullptr;
  // Validated once, private to this process (a peer cannot move them).
  uint64_t floats_ = 0;
  uint32_t num_layers_ = 0;
  pid_t trainer_pid_ = 0;
  float* gradient_ = nullptr;
  float* mean_ = nullptr;
  const ShmLayer* shared_layers_ = nullptr;  // the trainer's, in the object
  std::vector<ShmLayer> layers_;             // our copy
};

// Is process `pid` alive (not a zombie)? The waiting side checks between
// slices.
bool ProcessAlive(pid_t pid);

// The largest gradient a hand-off carries (16 GiB of floats).
inline constexpr uint64_t kShmMaxFloats = uint64_t{1} << 32;

// The object's size for `floats` <= kShmMaxFloats (header, layer table,
// two page-aligned float arrays).
size_t ShmRegionBytes(uint64_t floats);

}  // namespace dblp

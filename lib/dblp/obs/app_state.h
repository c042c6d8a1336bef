// What a running app publishes about itself for readers on other threads:
// DPDK's telemetry thread (/dblp/* commands, src/dpdk/runtime/app_telemetry.h)
// and the runtime prompt (-i / --cmdline-file, src/dpdk/runtime/prompt.h). No
// DPDK here.
//
// Writers are the engines, at round boundaries (the server's coordinator on
// lcore 0, the worker's iteration loop); every reader only loads atomics, so
// a reader at any rate never touches datapath-owned state and never blocks
// a writer (seqlocks: the writer is wait-free, a reader retries while a
// store is under way). The state lives for the whole process
// (GlobalAppState() is never destroyed): a telemetry request that arrives
// while the app exits still reads valid memory.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "dblp/policy/tolerance.h"

namespace dblp {

using CounterList = std::vector<std::pair<std::string, uint64_t>>;

// A trivially copyable T behind a sequence lock made of atomics (no data
// race in the C++ sense). One writer at a time; any number of readers.
template <class T>
class Seqlock {
  static_assert(std::is_trivially_copyable_v<T>,
                "a seqlock copies its value as words");
  static constexpr size_t kWords = (sizeof(T) + 7) / 8;

 public:
  Seqlock() { Store(T{}); }
  Seqlock(const Seqlock&) = delete;
  Seqlock& operator=(const Seqlock&) = delete;

  // Writer: wait-free.
  void Store(const T& v) {
    std::array<uint64_t, kWords> w{};
    std::memcpy(w.data(), &v, sizeof(T));
    const uint64_t s = seq_.load(std::memory_order_relaxed);
    seq_.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (size_t i = 0; i < kWords; ++i) {
      words_[i].store(w[i], std::memory_order_relaxed);
    }
    seq_.store(s + 2, std::memory_order_release);
  }
  // Any thread: a value some Store wrote whole.
  T Load() const {
    std::array<uint64_t, kWords> w{};
    for (;;) {
      const uint64_t s1 = seq_.load(std::memory_order_acquire);
      if ((s1 & 1) == 0) {
        for (size_t i = 0; i < kWords; ++i) {
          w[i] = words_[i].load(std::memory_order_relaxed);
        }
        std::atomic_thread_fence(std::memory_order_acquire);
        if (seq_.load(std::memory_order_relaxed) == s1) break;
      }
      std::this_thread::yield();
    }
    T v;
    std::memcpy(static_cast<void*>(&v), w.data(), sizeof(T));
    return v;
  }
  // Stores so far (a reader can tell that something moved).
  uint64_t stores() const { return seq_.load(std::memory_order_acquire) / 2; }

 private:
  std::atomic<uint64_t> seq_{0};
  std::array<std::atomic<uint64_t>, kWords> words_{};
};

// Named counters published as a whole (the summary's counters, at round
// boundaries). Names are append-only: a name, once published, keeps its
// slot for the life of the process, so readers take names without a lock.
// Writer: one thread at a time (Publish, ClearToLast); readers: any.
class CounterBoard {
 public:
  static constexpr size_t kCapacity = 256;

  // Publishes every counter of `counters` (names not seen before are
  // appended; beyond kCapacity they are left out and counted in
  // overflowed()).
  void Publish(const CounterList& counters);
  // "clear stats": the last published values become the zero of Read.
  void ClearToLast();
  // Every published counter, minus the baseline of the last ClearToLast
  // when `since_clear` (a counter that went down, e.g. a gauge, reads 0).
  CounterList Read(bool since_clear = true) const;
  uint64_t publications() const { return seq_.load() / 2; }
  uint64_t clears() const { return clears_.load(); }
  size_t overflowed() const { return overflowed_.load(); }

 private:
  std::array<std::string, kCapacity> names_;  // [0, count_): fixed
  std::atomic<size_t> count_{0};  // writer: release after the name; readers
  std::array<std::atomic<uint64_t>, kCapacity> values_{};    // under seq_
  std::array<std::atomic<uint64_t>, kCapacity> baseline_{};  // under seq_
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> clears_{0};
  std::atomic<size_t> overflowed_{0};
  std::unordered_map<std::string, size_t> index_;  // writer only
};

// Key/value strings appended once (the effective configuration), read by
// any thread. Writer: one thread at a time.
class ConfigList {
 public:
  static constexpr size_t kCapacity = 256;
  // Appends, or replaces nothing: a key given twice keeps both entries (the
  // later one wins in Read).
  void Add(const std::string& key, const std::string& value);
  std::vector<std::pair<std::string, std::string>> Read() const;

 private:
  std::array<std::pair<std::string, std::string>, kCapacity> entries_;
  std::atomic<size_t> count_{0};
};

enum class JobPhase : uint8_t {
  kStarting,   // EAL and ports
  kJoining,    // waiting for workers / the server
  kPush,       // a push round is open
  kBroadcast,  // the mean is on its way back
  kDone,       // the job ended (see failed)
};
const char* JobPhaseName(JobPhase p);

// The round state, stored by the engine at every round boundary.
struct RoundSnapshot {
  uint64_t iteration = 0;         // the iteration under way (or last)
  uint64_t iterations_done = 0;   // completed (push and broadcast)
  uint64_t total_iterations = 0;  // the worker's --iterations; 0: unknown
  uint32_t push_round = 0;
  uint32_t broadcast_round = 0;
  double p = 0;            // the current push round's tolerance
  double broadcast_p = 0;  // the last announced broadcast's
  double next_p = 0;       // server: decided for the next push
  double delivered = 0;    // worker: fraction of the last mean delivered
  uint8_t critical = 0;    // dblp: inside a critical regime
  JobPhase phase = JobPhase::kStarting;
  uint8_t failed = 0;
  // Runtime control: changes applied, and the iteration the last one took
  // effect at.
  uint64_t changes = 0;
  uint64_t last_change_iteration = 0;
  // An injected burst (inject burst): iterations [first, first + count).
  uint64_t burst_first = 0;
  uint64_t burst_count = 0;
  double burst_loss = 0;
};

struct PolicySnapshot {
  PolicyConfig config;
  uint8_t known = 0;            // the worker only has the server's text
  uint64_t changes = 0;         // set policy / set p applied so far
  uint64_t from_iteration = 0;  // of the last change
};

// One datapath lcore's counters, published with the stats.
struct LcoreSnapshot {
  uint32_t lcore_id = 0;
  uint16_t lane = 0;    // = its RX/TX queue on every port
  uint16_t queues = 0;  // worker: TX queues it drives (the server's lanes)
  uint64_t rx_frames = 0;
  uint64_t tx_frames = 0;
  uint64_t injected_drops = 0;
  uint64_t tx_ring_full = 0;
  uint64_t mbuf_alloc_failures = 0;
};
struct LcoreTable {
  static constexpr uint32_t kMax = 64;
  uint32_t count = 0;
  std::array<LcoreSnapshot, kMax> lcores{};
};

// A command of the runtime prompt for the engine, applied at a round
// boundary. Trivially copyable (it crosses threads by value).
struct RuntimeCommand {
  enum class Kind : uint8_t { kNone, kSetPolicy, kInjectBurst, kClearStats };
  Kind kind = Kind::kNone;
  bool set_p = false;  // kSetPolicy written as "set p": fixed at `policy`
  PolicyConfig policy;
  double loss = 0;          // kInjectBurst
  uint64_t iterations = 0;  // kInjectBurst
};
struct RuntimeResult {
  bool ok = false;
  uint64_t from_iteration = 0;  // the first iteration the change applies to
  char text[240] = {};          // what was done, or why not
};

// One command at a time from the prompt thread to the engine. The prompt
// thread posts and waits (it is no datapath); the engine looks at the
// mailbox once per round boundary (one atomic load when empty).
class ControlMailbox {
 public:
  // Prompt thread: posts `c` and waits until the engine applied it. False
  // (with out->text saying why) when `running` turns false before the
  // engine took it: the job ended, nothing was applied.
  bool Submit(const RuntimeCommand& c, const std::atomic<bool>& running,
              RuntimeResult* out);
  // Engine, at a round boundary: the waiting command, if any. Every Take
  // that returns true must be followed by Done.
  bool Take(RuntimeCommand* out);
  void Done(const RuntimeResult& r);

 private:
  enum : uint32_t { kEmpty, kPosted, kTaken, kDone };
  std::atomic<uint32_t> state_{kEmpty};
  RuntimeCommand cmd_;  // prompt: wo before kPosted; engine: ro after Take
  RuntimeResult res_;   // engine: wo before kDone; prompt: ro after
};

// A burst of `loss` over iterations [first, first + count) that the prompt
// adds to a loss injector at run time (rx_loss.h reads it when the
// iteration of the frames changes, never per frame). Writer: the engine at a
// round boundary; readers: its datapath lcores.
class InjectedBurst {
 public:
  void Set(uint64_t first, uint64_t count, double loss);
  // Whether `it` lies in the burst, and its loss.
  bool Covers(uint64_t it, double* loss) const;

 private:
  std::atomic<uint64_t> first_{0};
  std::atomic<uint64_t> end_{0};
  std::atomic<double> loss_{0};
};

// Everything the process publishes. GlobalAppState() is created on first
// use and never destroyed.
struct AppState {
  std::atomic<const char*> app{"dblp"};  // "dblp-server" / "dblp-worker"
  std::atomic<bool> is_server{false};
  // The engine runs a job (the prompt's waits and submissions end when it
  // turns false). Writer: the engine.
  std::atomic<bool> running{false};
  Seqlock<RoundSnapshot> round;
  Seqlock<PolicySnapshot> policy;
  Seqlock<LcoreTable> lcores;
  CounterBoard stats;
  ConfigList config;
  ControlMailbox mailbox;
  InjectedBurst burst;
  // The worker: the policy as the server's WELCOME described it.
  ConfigList worker_policy;
};
AppState& GlobalAppState();

// ---- views for the telemetry commands and the prompt's show commands -----

// One value of a view: numbers stay numbers; doubles are text (DPDK 22.11's
// telemetry has no floating-point values).
using StateValue = std::variant<uint64_t, std::string>;
struct StateField {
  std::string key;
  StateValue value;
};
using StateDict = std::vector<StateField>;

std::string FormatDouble(double v);
StateDict RoundView(const AppState& s);
StateDict PolicyView(const AppState& s);
StateDict StatsView(const AppState& s);
StateDict ConfigView(const AppState& s);
std::vector<StateDict> LcoresView(const AppState& s);
// "  key: value" lines under a "<title>:" line, as the prompt prints them.
std::string FormatView(const std::string& title, const StateDict& d);

}  // namespace dblp

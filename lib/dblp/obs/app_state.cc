#include "dblp/obs/app_state.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>

namespace dblp {

// ---- CounterBoard -----------------------------------------------------------

void CounterBoard::Publish(const CounterList& counters) {
  // Slots of new names first (outside the sequence: a reader sees a new
  // name only once count_ covers it, with the value it had at its store).
  size_t count = count_.load(std::memory_order_relaxed);
  std::vector<std::pair<size_t, uint64_t>> updates;
  updates.reserve(counters.size());
  for (const auto& [name, value] : counters) {
    auto it = index_.find(name);
    size_t slot;
    if (it != index_.end()) {
      slot = it->second;
    } else if (count < kCapacity) {
      slot = count++;
      names_[slot] = name;
      index_.emplace(name, slot);
    } else {
      overflowed_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    updates.emplace_back(slot, value);
  }
  const uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (const auto& [slot, value] : updates) {
    values_[slot].store(value, std::memory_order_relaxed);
  }
  seq_.store(s + 2, std::memory_order_release);
  count_.store(count, std::memory_order_release);
}

void CounterBoard::ClearToLast() {
  const size_t count = count_.load(std::memory_order_relaxed);
  const uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < count; ++i) {
    baseline_[i].store(values_[i].load(std::memory_order_relaxed),
                       std::memory_order_relaxed);
  }
  seq_.store(s + 2, std::memory_order_release);
  clears_.fetch_add(1, std::memory_order_relaxed);
}

CounterList CounterBoard::Read(bool since_clear) const {
  const size_t count = count_.load(std::memory_order_acquire);
  std::vector<uint64_t> v(count), b(count);
  for (;;) {
    const uint64_t s1 = seq_.load(std::memory_order_acquire);
    if ((s1 & 1) == 0) {
      for (size_t i = 0; i < count; ++i) {
        v[i] = values_[i].load(std::memory_order_relaxed);
        b[i] = baseline_[i].load(std::memory_order_relaxed);
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == s1) break;
    }
    std::this_thread::yield();
  }
  CounterList out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t x = v[i];
    if (since_clear) x = x >= b[i] ? x - b[i] : 0;
    out.emplace_back(names_[i], x);
  }
  return out;
}

// ---- ConfigList -------------------------------------------------------------

void ConfigList::Add(const std::string& key, const std::string& value) {
  const size_t n = count_.load(std::memory_order_relaxed);
  if (n >= kCapacity) return;
  entries_[n] = {key, value};
  count_.store(n + 1, std::memory_order_release);
}

std::vector<std::pair<std::string, std::string>> ConfigList::Read() const {
  const size_t n = count_.load(std::memory_order_acquire);
  // The later entry of a key wins, in the order keys first appeared.
  std::vector<std::pair<std::string, std::string>> out;
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < n; ++i) {
    const auto& [k, v] = entries_[i];
    auto it = at.find(k);
    if (it != at.end()) {
      out[it->second].second = v;
    } else {
      at.emplace(k, out.size());
      out.emplace_back(k, v);
    }
  }
  return out;
}

// ---- ControlMailbox ---------------------------------------------------------

bool ControlMailbox::Submit(const RuntimeCommand& c,
                            const std::atomic<bool>& running,
                            RuntimeResult* out) {
  cmd_ = c;
  state_.store(kPosted, std::memory_order_release);
  for (;;) {
    if (state_.load(std::memory_order_acquire) == kDone) {
      *out = res_;
      state_.store(kEmpty, std::memory_order_release);
      return true;
    }
    if (!running.load(std::memory_order_acquire)) {
      uint32_t expected = kPosted;
      if (state_.compare_exchange_strong(expected, kEmpty,
                                         std::memory_order_acq_rel)) {
        *out = RuntimeResult{};
        std::snprintf(out->text, sizeof(out->text),
                      "not applied: no job is running");
        return false;
      }
      // Taken: the engine is applying it right now; Done follows.
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool ControlMailbox::Take(RuntimeCommand* out) {
  if (state_.load(std::memory_order_relaxed) != kPosted) return false;
  uint32_t expected = kPosted;
  if (!state_.compare_exchange_strong(expected, kTaken,
                                      std::memory_order_acq_rel)) {
    return false;
  }
  *out = cmd_;
  return true;
}

void ControlMailbox::Done(const RuntimeResult& r) {
  res_ = r;
  state_.store(kDone, std::memory_order_release);
}

// ---- InjectedBurst ----------------------------------------------------------

void InjectedBurst::Set(uint64_t first, uint64_t count, double loss) {
  // Readers run only between the engine's round boundaries, but the
  // fields are atomics all the same: end_ last, so a reader that sees the
  // new end sees the new first and loss.
  end_.store(0, std::memory_order_release);
  first_.store(first, std::memory_order_relaxed);
  loss_.store(loss, std::memory_order_relaxed);
  end_.store(first + count, std::memory_order_release);
}

bool InjectedBurst::Covers(uint64_t it, double* loss) const {
  const uint64_t end = end_.load(std::memory_order_acquire);
  if (it >= end || it < first_.load(std::memory_order_relaxed)) return false;
  *loss = loss_.load(std::memory_order_relaxed);
  return true;
}

// ---- the process's state ----------------------------------------------------

AppState& GlobalAppState() {
  static AppState* const state = new AppState();  // never destroyed
  return *state;
}

const char* JobPhaseName(JobPhase p) {
  switch (p) {
    case JobPhase::kStarting:
      return "starting";
    case JobPhase::kJoining:
      return "joining";
    case JobPhase::kPush:
      return "push";
    case JobPhase::kBroadcast:
      return "broadcast";
    case JobPhase::kDone:
      return "done";
  }
  return "unknown";
}

std::string FormatDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

StateDict RoundView(const AppState& s) {
  const RoundSnapshot r = s.round.Load();
  const bool server = s.is_server.load();
  StateDict d = {
      {"phase", std::string(JobPhaseName(r.phase))},
      {"iteration", r.iteration},
      {"iterations_done", r.iterations_done},
  };
  if (!server) d.push_back({"iterations_total", r.total_iterations});
  d.push_back({"push_round", uint64_t{r.push_round}});
  d.push_back({"broadcast_round", uint64_t{r.broadcast_round}});
  d.push_back({"p", FormatDouble(r.p)});
  d.push_back({"broadcast_p", FormatDouble(r.broadcast_p)});
  if (server) d.push_back({"next_p", FormatDouble(r.next_p)});
  d.push_back({"critical", uint64_t{r.critical}});
  d.push_back(
      {"clr_state", std::string(r.critical ? "critical" : "non-critical")});
  if (!server) d.push_back({"delivered_fraction", FormatDouble(r.delivered)});
  d.push_back({"failed", uint64_t{r.failed}});
  d.push_back({"runtime_changes", r.changes});
  if (r.changes > 0) {
    d.push_back({"last_change_iteration", r.last_change_iteration});
  }
  if (r.burst_count > 0) {
    d.push_back({"injected_burst_first", r.burst_first});
    d.push_back({"injected_burst_iterations", r.burst_count});
    d.push_back({"injected_burst_loss", FormatDouble(r.burst_loss)});
  }
  return d;
}

StateDict PolicyView(const AppState& s) {
  const PolicySnapshot p = s.policy.Load();
  const RoundSnapshot r = s.round.Load();
  StateDict d;
  if (!p.known) {
    // The worker: the server decides; its WELCOME named the policy.
    for (const auto& [k, v] : s.worker_policy.Read()) d.push_back({k, v});
    d.push_back({"p", FormatDouble(r.p)});
    d.push_back({"critical", uint64_t{r.critical}});
    return d;
  }
  const PolicyConfig& c = p.config;
  std::string describe;
  try {
    describe = TolerancePolicy::Create(c)->Describe();
  } catch (const std::exception& e) {
    describe = e.what();
  }
  d = {
      {"name", std::string(PolicyKindName(c.kind))},
      {"describe", describe},
      {"p", FormatDouble(r.p)},
      {"next_p", FormatDouble(r.next_p)},
      {"critical", uint64_t{r.critical}},
  };
  switch (c.kind) {
    case PolicyKind::kFixed:
      d.push_back({"p_fixed", FormatDouble(c.p_fixed)});
      break;
    case PolicyKind::kDblp:
      d.push_back({"p_low", FormatDouble(c.p_low)});
      d.push_back({"p_high", FormatDouble(c.p_high)});
      d.push_back({"clr_freq", uint64_t{c.clr.freq}});
      d.push_back({"clr_eta", FormatDouble(c.clr.eta)});
      break;
    case PolicyKind::kLtp:
      d.push_back({"ltp_deadline_factor", FormatDouble(c.ltp_deadline_factor)});
      d.push_back({"ltp_window", uint64_t{c.ltp_window}});
      d.push_back({"ltp_min_fraction", FormatDouble(c.ltp_min_fraction)});
      break;
    case PolicyKind::kDeadline:
      d.push_back({"deadline_percentile", FormatDouble(c.deadline_percentile)});
      d.push_back({"deadline_factor", FormatDouble(c.deadline_factor)});
      d.push_back({"deadline_window", uint64_t{c.deadline_window}});
      d.push_back(
          {"deadline_min_fraction", FormatDouble(c.deadline_min_fraction)});
      break;
    case PolicyKind::kCombined:
      d.push_back({"p_low", FormatDouble(c.p_low)});
      d.push_back({"p_high", FormatDouble(c.p_high)});
      d.push_back({"clr_freq", uint64_t{c.clr.freq}});
      d.push_back({"clr_eta", FormatDouble(c.clr.eta)});
      d.push_back({"ltp_deadline_factor", FormatDouble(c.ltp_deadline_factor)});
      d.push_back({"ltp_window", uint64_t{c.ltp_window}});
      d.push_back({"ltp_min_fraction", FormatDouble(c.ltp_min_fraction)});
      break;
    case PolicyKind::kReliable:
      break;
  }
  d.push_back({"runtime_changes", p.changes});
  if (p.changes > 0) d.push_back({"changed_from_iteration", p.from_iteration});
  return d;
}

StateDict StatsView(const AppState& s) {
  StateDict d;
  for (auto& [k, v] : s.stats.Read(true)) d.push_back({k, v});
  return d;
}

StateDict ConfigView(const AppState& s) {
  StateDict d;
  for (auto& [k, v] : s.config.Read()) d.push_back({k, v});
  return d;
}

std::vector<StateDict> LcoresView(const AppState& s) {
  const LcoreTable t = s.lcores.Load();
  std::vector<StateDict> out;
  for (uint32_t i = 0; i < t.count && i < LcoreTable::kMax; ++i) {
    const LcoreSnapshot& l = t.lcores[i];
    StateDict d = {
        {"lcore", uint64_t{l.lcore_id}},
        {"lane", uint64_t{l.lane}},
        {"rx_queue", uint64_t{l.lane}},
        {"tx_queues", uint64_t{l.queues}},
        {"rx_frames", l.rx_frames},
        {"tx_frames", l.tx_frames},
        {"injected_drops", l.injected_drops},
        {"tx_ring_full", l.tx_ring_full},
        {"mbuf_alloc_failures", l.mbuf_alloc_failures},
    };
    out.push_back(std::move(d));
  }
  return out;
}

std::string FormatView(const std::string& title, const StateDict& d) {
  std::ostringstream o;
  o << title << ":\n";
  for (const auto& f : d) {
    o << "  " << f.key << ": ";
    if (const auto* u = std::get_if<uint64_t>(&f.value)) {
      o << *u;
    } else {
      o << std::get<std::string>(f.value);
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace dblp

// ServeIterations (dblp/job/server_driver.h) over two lanes on two threads,
// each lane a script that records what it is asked, against the real
// ServerJob and ServerCoordinator: the order every transport relies on
// (each lane's push sides closed before the mean is taken; every lane's
// next push open before its ROUND_BEGIN goes out; the broadcast's
// ROUND_BEGIN before the next push's; the rows closed only after every
// lane's broadcast), who decides (one coordinator: one ClosePush per
// iteration, its all-BYE ending every lane), a failure on one lane ending
// the other, and a push-only job without a broadcast.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "dblp/job/server_driver.h"
#include "dblp/round/round_control.h"
#include "dblp/wire/chunking.h"

namespace dblp {
namespace {

constexpr uint32_t kWorkers = 2;
constexpr uint32_t kLanes = 2;

// What happened, in order, on any thread.
class Log {
 public:
  void Add(std::string e) {
    std::lock_guard<std::mutex> g(mu_);
    events_.push_back(std::move(e));
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> g(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> events_;
};

// The position of `e` in `v` (v.size() if absent).
size_t At(const std::vector<std::string>& v, const std::string& e) {
  return static_cast<size_t>(std::find(v.begin(), v.end(), e) - v.begin());
}
size_t Count(const std::vector<std::string>& v, const std::string& prefix) {
  return static_cast<size_t>(std::count_if(
      v.begin(), v.end(),
      [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }));
}

// A barrier for kLanes threads that stops waiting once the job failed.
class TwoLaneSync {
 public:
  bool Barrier() {
    std::unique_lock<std::mutex> l(mu_);
    if (!failure_.empty()) return false;
    const uint64_t gen = generation_;
    if (++arrived_ == kLanes) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(l, [&] { return generation_ != gen || !failure_.empty(); });
    return failure_.empty();
  }
  void Fail(const std::string& why) {
    std::lock_guard<std::mutex> g(mu_);
    if (failure_.empty()) failure_ = why;
    cv_.notify_all();
  }
  std::string failure() {
    std::lock_guard<std::mutex> g(mu_);
    return failure_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  unsigned arrived_ = 0;
  uint64_t generation_ = 0;
  std::string failure_;
};

// The transport: real sides (one lane each per worker, for the gather and
// the rows), and a record of what the coordinator posts and tells.
class ScriptTransport final : public ServerTransport {
 public:
  ScriptTransport(const ChunkLayout& layout, Log* log) : log_(log) {
    for (uint32_t w = 0; w < kWorkers; ++w) {
      for (uint32_t k = 0; k < kLanes; ++k) {
        push_.push_back(std::make_unique<ReceiveSide>(
            PushReceiveConfig(7, static_cast<uint16_t>(w), layout)));
        bcast_.push_back(std::make_unique<SendSide>(
            BroadcastSendConfig(7, static_cast<uint16_t>(w), 8)));
        push_ptrs_.push_back(push_.back().get());
        bcast_ptrs_.push_back(bcast_.back().get());
      }
    }
  }
  uint64_t Now() override { return ++now_; }
  std::span<const ReceiveSide* const> PushLanes(uint32_t w) override {
    return std::span<const ReceiveSide* const>(push_ptrs_)
        .subspan(w * kLanes, kLanes);
  }
  std::span<const SendSide* const> BroadcastLanes(uint32_t w) override {
    return std::span<const SendSide* const>(bcast_ptrs_)
        .subspan(w * kLanes, kLanes);
  }
  void Post(const ControlRequest& r) override {
    if (const auto* rb = std::get_if<RoundBeginRequest>(&r)) {
      log_->Add(std::string("post begin ") +
                (rb->direction == Direction::kPush ? "push " : "broadcast ") +
                std::to_string(rb->round));
    } else {
      log_->Add("post other");
    }
  }
  AcceptedSlots* Accepted() override { return &accepted_; }
  bool InBurst(uint64_t) override { return false; }
  void PushAnnounced(uint64_t it, const RoundTolerance&) override {
    log_->Add("announced " + std::to_string(it));
  }
  void PushClosed(uint64_t it, const ReducedPush&) override {
    log_->Add("push closed " + std::to_string(it));
  }
  void IterationDone(uint64_t it) override {
    log_->Add("done " + std::to_string(it));
  }

 private:
  Log* log_;
  uint64_t now_ = 0;
  std::vector<std::unique_ptr<ReceiveSide>> push_;
  std::vector<std::unique_ptr<SendSide>> bcast_;
  std::vector<const ReceiveSide*> push_ptrs_;
  std::vector<const SendSide*> bcast_ptrs_;
  AcceptedSlots accepted_;
};

// A lane whose workers STOP every push before `iterations`; at that push
// lane 0 hears every worker's BYE. `fail_at`: the push whose RunRound on
// lane 1 fails instead.
struct ScriptLane {
  uint32_t lane = 0;
  ServerJob* job = nullptr;
  TwoLaneSync* sync = nullptr;
  Log* log = nullptr;
  uint64_t iterations = 3;
  int64_t fail_at = -1;       // lane 1's push of this iteration fails
  int64_t no_broadcast = -1;  // lane 1 cannot begin this broadcast

  std::string Name(const std::string& what, uint64_t it) const {
    return "lane " + std::to_string(lane) + ": " + what + " " +
           std::to_string(it);
  }
  template <class Done>
  bool RunRound(uint64_t it, bool broadcasting, Done done) {
    log->Add(Name(broadcasting ? "broadcast" : "push", it));
    if (!broadcasting && static_cast<int64_t>(it) == fail_at && lane == 1) {
      sync->Fail("lane 1 stalled in push " + std::to_string(it));
      return false;
    }
    if (!broadcasting && it == iterations && lane == 0) {
      for (uint32_t w = 0; w < kWorkers; ++w) job->OnBye(w);
    }
    while (!done()) std::this_thread::yield();
    return true;
  }
  bool PushStopped(uint32_t, uint64_t it) const { return it < iterations; }
  bool BroadcastDone(uint32_t) const { return true; }
  void ClosePushSides() { log->Add(Name("close sides", 0)); }
  void OpenPushSides(uint64_t it, const PushOpening& open) {
    EXPECT_EQ(open.announce.round, PushRound(it));
    log->Add(Name("open sides", it));
  }
  bool BeginBroadcastSides(uint64_t it) {
    log->Add(Name("begin broadcast", it));
    if (static_cast<int64_t>(it) == no_broadcast && lane == 1) {
      sync->Fail("lane 1 has no return path in iteration " +
                 std::to_string(it));
      return false;
    }
    return true;
  }
};

struct Served {
  std::vector<std::string> events;
  std::string failure;
  size_t rows = 0;
};

Served Serve(uint64_t iterations, int64_t fail_at, bool push_only,
             int64_t no_broadcast = -1) {
  const ChunkLayout layout(64 * 1440, 1440);
  ServerJobSettings s;
  s.push_only = push_only;
  ServerJob job(s, TolerancePolicy::Create(s.policy), layout,
                std::vector<std::string>(kWorkers, "w"),
                SendOrderKind::kSequential, 1, "test");
  Log log;
  ScriptTransport transport(layout, &log);
  ServerCoordinator coord(job, transport, push_only);
  TwoLaneSync sync;
  std::vector<ScriptLane> lanes(kLanes);
  for (uint32_t k = 0; k < kLanes; ++k) {
    lanes[k] =
        ScriptLane{k, &job, &sync, &log, iterations, fail_at, no_broadcast};
  }
  std::thread other([&] { ServeIterations(lanes[1], sync, coord, false); });
  ServeIterations(lanes[0], sync, coord, true);
  other.join();
  return Served{log.events(), sync.failure(), job.rows().size()};
}

TEST(ServeIterations, TakesEveryDecisionOnceInTheOrderTheLanesNeed) {
  const Served r = Serve(3, -1, false);
  const auto& e = r.events;
  EXPECT_EQ(r.failure, "");
  EXPECT_EQ(Count(e, "push closed "), 3u);  // one coordinator
  EXPECT_EQ(Count(e, "done "), 3u);
  EXPECT_EQ(Count(e, "post begin push "), 4u);  // pushes 0..3
  EXPECT_EQ(r.rows, 3u * kWorkers);
  for (uint64_t it = 0; it <= 3; ++it) {
    const std::string n = std::to_string(it);
    const size_t announce = At(e, "post begin push " + std::to_string(2 * it));
    ASSERT_LT(announce, e.size()) << "push " << it << " never announced";
    // Both lanes take the push's frames before a worker may send one.
    EXPECT_LT(At(e, "lane 0: open sides " + n), announce);
    EXPECT_LT(At(e, "lane 1: open sides " + n), announce);
    EXPECT_LT(At(e, "announced " + n), announce);
    if (it == 3) break;  // every worker said BYE in push 3
    // The mean's broadcast is announced (ClosePush) before the app hears
    // of it (the prompt may change the next push) and before the next
    // push is announced; each lane's broadcast begins after it.
    const size_t closed =
        At(e, "post begin broadcast " + std::to_string(2 * it + 1));
    const size_t next_announce =
        At(e, "post begin push " + std::to_string(2 * it + 2));
    EXPECT_LT(closed, At(e, "push closed " + n));
    EXPECT_LT(At(e, "push closed " + n), next_announce);
    EXPECT_LT(closed, At(e, "lane 0: begin broadcast " + n));
    EXPECT_LT(closed, At(e, "lane 1: begin broadcast " + n));
    // The rows close after both lanes' broadcasts ran.
    const size_t done = At(e, "done " + n);
    ASSERT_LT(done, e.size());
    EXPECT_LT(At(e, "lane 0: broadcast " + n), done);
    EXPECT_LT(At(e, "lane 1: broadcast " + n), done);
  }
  // Each push's mean after both lanes closed their sides.
  EXPECT_EQ(Count(e, "lane 0: close sides") + Count(e, "lane 1: close sides"),
            3u * kLanes);
  for (uint64_t it = 0; it < 3; ++it) {
    const size_t closed =
        At(e, "post begin broadcast " + std::to_string(2 * it + 1));
    size_t before = 0;
    for (size_t i = 0; i < closed; ++i) {
      before += e[i].find("close sides") != std::string::npos;
    }
    EXPECT_EQ(before, kLanes * (it + 1)) << "iteration " << it;
  }
}

TEST(ServeIterations, AFailureOnOneLaneEndsEveryLane) {
  const Served r = Serve(5, 2, false);
  EXPECT_EQ(r.failure, "lane 1 stalled in push 2");
  EXPECT_EQ(Count(r.events, "push closed "), 2u);  // 0 and 1, never 2
  EXPECT_EQ(At(r.events, "lane 0: broadcast 2"), r.events.size());
}

TEST(ServeIterations, ABroadcastOneLaneCannotBeginEndsEveryLane) {
  const Served r = Serve(5, -1, false, 1);
  EXPECT_EQ(r.failure, "lane 1 has no return path in iteration 1");
  // Iteration 1's mean was taken, its broadcast never closed, and no lane
  // ran push 2.
  EXPECT_EQ(Count(r.events, "push closed "), 2u);
  EXPECT_EQ(Count(r.events, "done "), 1u);
  EXPECT_EQ(At(r.events, "lane 0: push 2"), r.events.size());
  EXPECT_EQ(At(r.events, "lane 1: push 2"), r.events.size());
}

TEST(ServeIterations, APushOnlyJobNeverBroadcasts) {
  const Served r = Serve(3, -1, true);
  EXPECT_EQ(r.failure, "");
  EXPECT_EQ(Count(r.events, "push closed "), 3u);
  EXPECT_EQ(Count(r.events, "done "), 3u);  // each at its push's close
  EXPECT_EQ(Count(r.events, "lane 0: begin broadcast"), 0u);
  EXPECT_EQ(Count(r.events, "post begin broadcast"), 3u);  // announced only
  EXPECT_LT(At(r.events, "push closed 1"), At(r.events, "done 1"));
}

}  // namespace
}  // namespace dblp

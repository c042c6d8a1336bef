// The kernel-UDP job (src/udp/udp_job.h) in one process: a server and its
// workers in threads over 127.0.0.1, with sources that record what the
// engine hands them.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dblp/handoff/gradient_source.h"
#include "dblp/handoff/shm_channel.h"
#include "dblp/handoff/shm_source.h"
#include "dblp/policy/clr_detector.h"
#include "dblp/policy/tolerance.h"
#include "dblp/round/stop_decision.h"
#include "dblp/security/frame_auth.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/float_ops.h"
#include "udp/udp_job.h"

namespace dblp {
namespace {

using Clock = std::chrono::steady_clock;

// The integer source, recording every call; optionally sharing its
// buffers with the engine, or failing at one step as rank `fail_rank`
// (once `fail_after`, if set, has observed every earlier step).
class RecordingSource : public GradientSource {
 public:
  explicit RecordingSource(uint64_t floats, bool shared = false)
      : inner_(MakeIntegerSource(floats)), shared_(shared) {
    if (shared_) {
      grad_.resize(floats);
      mean_.resize(floats);
    }
  }
  std::vector<LayerInfo> Layers() const override { return inner_->Layers(); }
  uint64_t floats() const override { return inner_->floats(); }
  void Bind(uint32_t rank, uint32_t workers) override {
    rank_ = rank;
    inner_->Bind(rank, workers);
  }
  void OnJobStart(uint32_t resync_every) override {
    started_ = true;
    resync_every_ = resync_every;
  }
  void Compute(uint64_t it, std::span<float> grad) override {
    if (static_cast<int>(rank_) == fail_rank && it == fail_step) {
      // Without the wait, the failure can reach the other worker while it
      // still receives the last round's broadcast, and that round has no
      // row there: the rows would count the scheduler, not the engine.
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (fail_after != nullptr && fail_after->observed < it &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      throw std::runtime_error("no data for step " + std::to_string(it));
    }
    inner_->Compute(it, grad);
  }
  void Observe(const IterationRecord& row) override {
    rows.push_back(row);
    order += 'O';
    observed.fetch_add(1);
  }
  void Apply(uint64_t, std::span<const float> avg) override {
    means.emplace_back(avg.begin(), avg.end());
    applied_from.push_back(avg.data());
    order += 'A';
  }
  void Fail(const std::string& why) override { failure = why; }
  std::string Describe() const override { return "recording"; }
  std::span<float> SharedGradient() override { return grad_; }
  std::span<float> SharedMean() override { return mean_; }

  int fail_rank = -1;
  uint64_t fail_step = 0;
  const RecordingSource* fail_after = nullptr;
  std::atomic<uint64_t> observed{0};  // rows, readable from other threads
  std::vector<IterationRecord> rows;
  std::vector<std::vector<float>> means;
  std::vector<const float*> applied_from;
  std::string order, failure;
  uint32_t rank_ = 0;
  bool started_ = false;
  uint32_t resync_every_ = 99;
  std::vector<float> grad_, mean_;  // shared: non-empty

 private:
  std::unique_ptr<GradientSource> inner_;
  bool shared_;
};

struct JobRun {
  UdpJobServerResult server;
  std::vector<UdpJobWorkerResult> workers;
};

// One server and one worker per source, each in its own thread.
JobRun RunJob(UdpJobServerOptions so, std::vector<UdpJobWorkerOptions> wos,
              std::vector<RecordingSource*> sources) {
  const JobSecret secret = JobSecret::FromBytes(RandomAuthBytes());
  so.secret = secret;
  so.workers = static_cast<uint32_t>(sources.size());
  so.rank_by_name = true;  // rank w is the worker named "w<w>"
  std::promise<uint16_t> port;
  bool told = false;
  so.on_listening = [&](uint16_t c, uint16_t) {
    told = true;
    port.set_value(c);
  };
  JobRun run;
  std::thread server([&] {
    run.server = RunUdpJobServer(so);
    if (!told) port.set_value(0);
  });
  const uint16_t control = port.get_future().get();
  run.workers.resize(sources.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < sources.size() && control != 0; ++w) {
    wos[w].secret = secret;
    wos[w].server = "127.0.0.1:" + std::to_string(control);
    wos[w].name = "w" + std::to_string(w);
    threads.emplace_back(
        [&, w] { run.workers[w] = RunUdpJobWorker(wos[w], *sources[w]); });
  }
  for (auto& t : threads) t.join();
  server.join();
  return run;
}

UdpJobServerOptions SmallServer() {
  UdpJobServerOptions o;
  o.round_timeout_ms = 10000;
  o.join_timeout_ms = 10000;
  return o;
}

UdpJobWorkerOptions SmallWorker(uint64_t iterations) {
  UdpJobWorkerOptions o;
  o.iterations = iterations;
  o.round_timeout_ms = 10000;
  o.join_timeout_ms = 10000;
  return o;
}

// Each worker applies the server's mean where its broadcast arrived and
// zeros elsewhere, under the p the server's policy chose for the
// iteration, told before the mean (Observe, then Apply).
TEST(UdpJob, WorkersApplyTheMeanUnderThePolicysP) {
  constexpr uint64_t kFloats = 6000, kIters = 8;
  UdpJobServerOptions so = SmallServer();
  so.policy.kind = PolicyKind::kDblp;
  so.policy.p_low = 0;
  so.policy.p_high = 0.3;
  so.policy.clr.freq = 2;
  so.loss = "bernoulli:0.1";
  std::vector<std::vector<float>> server_means;
  so.on_reduced = [&](uint64_t, std::span<const float> mean,
                      std::span<const Bitmap>) {
    server_means.emplace_back(mean.begin(), mean.end());
  };
  RecordingSource a(kFloats), b(kFloats);
  std::vector<UdpJobWorkerOptions> wos(2, SmallWorker(kIters));
  for (auto& w : wos) w.loss = "bernoulli:0.1";
  const JobRun run = RunJob(so, wos, {&a, &b});
  ASSERT_EQ(run.server.exit_code, 0) << run.server.error;
  ASSERT_EQ(server_means.size(), kIters);
  // The server's policy, replayed on the means it reduced.
  auto policy = TolerancePolicy::Create(so.policy);
  std::vector<RoundTolerance> want;
  for (uint64_t it = 0; it < kIters; ++it) {
    want.push_back(policy->Current());
    policy->OnIterationEnd(it, L2Norm(server_means[it]), 0);
  }
  // Iteration it's broadcast goes out under the p chosen after its push,
  // which is iteration it + 1's push p.
  want.push_back(policy->Current());
  const ChunkLayout layout(kFloats * 4, ChunkPayloadForMtu(1500, 16));
  for (RecordingSource* s : {&a, &b}) {
    const auto& r = run.workers[s->rank_];
    ASSERT_EQ(r.exit_code, 0) << r.error;
    EXPECT_TRUE(s->started_);
    EXPECT_EQ(s->resync_every_, 0u);
    ASSERT_EQ(s->rows.size(), kIters);
    ASSERT_EQ(s->means.size(), kIters);
    std::string observed_then_applied;
    for (uint64_t i = 0; i < kIters; ++i) observed_then_applied += "OA";
    EXPECT_EQ(s->order, observed_then_applied);
    for (uint64_t it = 0; it < kIters; ++it) {
      const IterationRecord& row = s->rows[it];
      EXPECT_EQ(row.iteration, it);
      EXPECT_EQ(row.p, want[it].p) << "iteration " << it;
      EXPECT_EQ(row.critical, want[it].critical) << "iteration " << it;
      EXPECT_GE(row.delivered_fraction + 1e-9, 1 - want[it + 1].p)
          << "iteration " << it;
      uint32_t arrived = 0;
      for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
        const size_t first = layout.Offset(c) / 4, n = layout.Length(c) / 4;
        const float* got = s->means[it].data() + first;
        const bool same =
            std::equal(got, got + n, server_means[it].data() + first);
        const bool zero =
            std::all_of(got, got + n, [](float x) { return x == 0.0f; });
        EXPECT_TRUE(same || zero) << "iteration " << it << " chunk " << c;
        arrived += same;
      }
      EXPECT_GE(arrived + 1e-9, layout.num_chunks() * row.delivered_fraction)
          << "iteration " << it;
    }
  }
  // The policy left the critical regime: both tolerances were used.
  EXPECT_EQ(want.front().p, 0);
  EXPECT_EQ(want[kIters - 1].p, 0.3);
}

// A source that shares its buffers gets the mean in place, and the push
// reads its gradient from there.
TEST(UdpJob, SharedBuffersAreUsedInPlace) {
  constexpr uint64_t kFloats = 3000, kIters = 3;
  UdpJobServerOptions so = SmallServer();
  so.policy.kind = PolicyKind::kReliable;
  std::vector<std::vector<float>> server_means;
  so.on_reduced = [&](uint64_t, std::span<const float> mean,
                      std::span<const Bitmap>) {
    server_means.emplace_back(mean.begin(), mean.end());
  };
  RecordingSource a(kFloats, true);
  const JobRun run = RunJob(so, {SmallWorker(kIters)}, {&a});
  ASSERT_EQ(run.server.exit_code, 0) << run.server.error;
  ASSERT_EQ(run.workers[0].exit_code, 0) << run.workers[0].error;
  ASSERT_EQ(a.means.size(), kIters);
  for (uint64_t it = 0; it < kIters; ++it) {
    EXPECT_EQ(a.applied_from[it], a.mean_.data());
    EXPECT_EQ(a.means[it], server_means[it]);  // one worker: its gradient
    EXPECT_EQ(server_means[it][5], IntegerGradientValue(5, it, 0));
  }
}

// A worker whose source fails tells the server (ERROR) and its source
// (Fail); the server fails the job naming it, and the other worker hears
// why.
TEST(UdpJob, AFailingSourceFailsTheJobNamingTheWorker) {
  RecordingSource a(2000), b(2000);
  for (RecordingSource* s : {&a, &b}) {
    s->fail_rank = 1;
    s->fail_step = 2;
  }
  a.fail_after = &b;
  b.fail_after = &a;
  const auto t0 = Clock::now();
  const JobRun run =
      RunJob(SmallServer(), {SmallWorker(50), SmallWorker(50)}, {&a, &b});
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  RecordingSource& failing = a.rank_ == 1 ? a : b;
  RecordingSource& other = a.rank_ == 1 ? b : a;
  const auto& fr = run.workers[1];
  EXPECT_EQ(fr.exit_code, 1);
  EXPECT_NE(fr.error.find("no data for step 2"), std::string::npos) << fr.error;
  EXPECT_EQ(failing.failure, fr.error);
  EXPECT_EQ(run.server.exit_code, 1);
  EXPECT_NE(run.server.error.find("worker 1 (w1) failed"), std::string::npos)
      << run.server.error;
  EXPECT_NE(run.server.error.find("no data for step 2"), std::string::npos)
      << run.server.error;
  const auto& orr = run.workers[0];
  EXPECT_EQ(orr.exit_code, 1);
  EXPECT_NE(orr.error.find("worker 1 (w1)"), std::string::npos) << orr.error;
  EXPECT_NE(other.failure.find("worker 1 (w1)"), std::string::npos);
  EXPECT_EQ(other.rows.size(), 2u);
}

// --on_worker_loss=continue over kernel UDP, as dblp-server does it: a
// worker that fails is dropped, the others finish, and from the round after
// the loss the mean divides by the live workers only.
TEST(UdpJob, ContinueWithoutALostWorker) {
  constexpr uint64_t kFloats = 3000, kIters = 6;
  RecordingSource a(kFloats), b(kFloats), c(kFloats);
  for (RecordingSource* s : {&a, &b, &c}) {
    s->fail_rank = 2;
    s->fail_step = 2;
  }
  UdpJobServerOptions so = SmallServer();
  so.policy.kind = PolicyKind::kReliable;
  so.continue_on_worker_loss = true;
  const JobRun run =
      RunJob(so, std::vector<UdpJobWorkerOptions>(3, SmallWorker(kIters)),
             {&a, &b, &c});
  ASSERT_EQ(run.server.exit_code, 0) << run.server.error;
  EXPECT_EQ(run.workers[2].exit_code, 1);
  for (RecordingSource* s : {&a, &b, &c}) {
    if (s->rank_ == 2) continue;
    ASSERT_EQ(run.workers[s->rank_].exit_code, 0)
        << run.workers[s->rank_].error;
    ASSERT_EQ(s->means.size(), kIters);
    for (uint64_t it = 3; it < kIters; ++it) {
      for (uint64_t j = 0; j < kFloats; ++j) {
        // The integer source's values (dblp_testlib.integer_value).
        auto v = [&](uint32_t r) {
          return static_cast<float>(
              static_cast<int>((j * 7 + it * 3 + r * 5) % 17) - 8);
        };
        ASSERT_EQ(s->means[it][j], (v(0) + v(1)) / 2.0f)
            << "iteration " << it << " float " << j;
      }
    }
  }
}

// A worker that runs fewer iterations than the others ends the job at
// once, naming itself and the fix, not at the round timeout.
TEST(UdpJob, UnevenIterationsFailFast) {
  RecordingSource a(2000), b(2000);
  UdpJobServerOptions so = SmallServer();
  so.round_timeout_ms = 20000;
  const auto t0 = Clock::now();
  const JobRun run = RunJob(so, {SmallWorker(3), SmallWorker(6)}, {&a, &b});
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(run.workers[0].exit_code, 0) << run.workers[0].error;
  EXPECT_EQ(run.server.exit_code, 1);
  // Ranks by name (RunJob): w0 is rank 0.
  EXPECT_NE(run.server.error.find("worker 0 (w0) finished after 3"),
            std::string::npos)
      << run.server.error;
  EXPECT_NE(run.server.error.find("same --iterations"), std::string::npos);
  EXPECT_EQ(run.workers[1].exit_code, 1);
}

// Issue #21, item 5: a worker waiting for its trainer still hears its
// server. The trainer (this process, alive) never posts; the server gives
// up at its round timeout and closes; the worker ends within a second or
// so, naming the server and that it waited for its trainer, instead of
// waiting as long as the trainer lives (here: the 8 s idle timeout).
TEST(UdpJob, AServerGoneEndsAWorkerWaitingForItsTrainer) {
  const std::string name = "/dblp-test-udpjob-" + std::to_string(getpid());
  shm_unlink(name.c_str());
  ShmChannel trainer = ShmChannel::Create(name, 2000, {});
  auto source = OpenShmSource(name, /*idle_timeout_ms=*/8000);
  trainer.Unlink();
  const JobSecret secret = JobSecret::FromBytes(RandomAuthBytes());
  UdpJobServerOptions so = SmallServer();
  so.secret = secret;
  so.workers = 1;
  so.round_timeout_ms = 1000;
  std::promise<uint16_t> port;
  so.on_listening = [&](uint16_t c, uint16_t) { port.set_value(c); };
  UdpJobServerResult sr;
  Clock::time_point server_done;
  std::thread server([&] {
    sr = RunUdpJobServer(so);
    server_done = Clock::now();
  });
  UdpJobWorkerOptions wo = SmallWorker(0);
  wo.secret = secret;
  wo.server = "127.0.0.1:" + std::to_string(port.get_future().get());
  const UdpJobWorkerResult wr = RunUdpJobWorker(wo, *source);
  const auto worker_done = Clock::now();
  server.join();
  EXPECT_EQ(sr.exit_code, 1) << sr.error;
  EXPECT_EQ(wr.exit_code, 1) << wr.error;
  EXPECT_LT(worker_done - server_done, std::chrono::milliseconds(2000));
  EXPECT_NE(wr.error.find("the server is gone"), std::string::npos) << wr.error;
  EXPECT_NE(wr.error.find(wo.server), std::string::npos) << wr.error;
  EXPECT_NE(wr.error.find("waited for its trainer"), std::string::npos)
      << wr.error;
  // The trainer is told why.
  EXPECT_EQ(trainer.header().worker_state.load(),
            static_cast<uint32_t>(ShmWorkerState::kFailed));
}

// A JOIN the codec refuses (here a layer of negative size, as a trainer's
// rewritten table can give) fails the worker at once, saying so, not
// after the server's join deadline as "the peer did not authenticate".
TEST(UdpJob, AJoinThatCannotBeSentFailsAtOnce) {
  class BadLayers : public RecordingSource {
   public:
    BadLayers() : RecordingSource(2000) {}
    std::vector<LayerInfo> Layers() const override {
      return {LayerInfo{"fc.weight", {-5}}};
    }
  } source;
  const JobSecret secret = JobSecret::FromBytes(RandomAuthBytes());
  UdpJobServerOptions so = SmallServer();
  so.secret = secret;
  so.workers = 1;
  so.join_timeout_ms = 4000;
  std::promise<uint16_t> port;
  so.on_listening = [&](uint16_t c, uint16_t) { port.set_value(c); };
  std::thread server([&] { RunUdpJobServer(so); });
  UdpJobWorkerOptions wo = SmallWorker(1);
  wo.secret = secret;
  wo.server = "127.0.0.1:" + std::to_string(port.get_future().get());
  const auto t0 = Clock::now();
  const UdpJobWorkerResult wr = RunUdpJobWorker(wo, source);
  const auto took = Clock::now() - t0;
  server.join();
  EXPECT_EQ(wr.exit_code, 1);
  EXPECT_LT(took, std::chrono::milliseconds(1000));
  EXPECT_NE(wr.error.find("cannot send JOIN"), std::string::npos) << wr.error;
  EXPECT_NE(wr.error.find("layers[0]"), std::string::npos) << wr.error;
}

TEST(UdpJob, BadOptionsExit2) {
  UdpJobServerOptions so = SmallServer();
  so.policy.p_high = 1.5;
  UdpJobServerResult s = RunUdpJobServer(so);
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_NE(s.error.find("p_high"), std::string::npos) << s.error;
  so = SmallServer();
  so.burst = 0;
  EXPECT_EQ(RunUdpJobServer(so).exit_code, 2);
  RecordingSource src(100);
  UdpJobWorkerOptions wo = SmallWorker(1);
  wo.loss = "often";
  const UdpJobWorkerResult w = RunUdpJobWorker(wo, src);
  EXPECT_EQ(w.exit_code, 2);
  EXPECT_NE(w.error.find("loss"), std::string::npos) << w.error;
}

// The job's broadcast settings are the DPDK server's (ServerIteration):
// under loss, a consistent broadcast hands every worker the same subset of
// the mean, exactly ceil((1 - p) N) chunks of it, so the replicas apply
// bit-identical means every iteration.
TEST(UdpJob, ConsistentBroadcastKeepsReplicasIdentical) {
  constexpr uint64_t kFloats = 20000, kIters = 6;
  UdpJobServerOptions so = SmallServer();
  so.policy.kind = PolicyKind::kFixed;
  so.policy.p_fixed = 0.2;
  so.consistent_broadcast = true;
  so.loss = "bernoulli:0.05";
  RecordingSource a(kFloats), b(kFloats), c(kFloats);
  std::vector<UdpJobWorkerOptions> wos(3, SmallWorker(kIters));
  for (auto& w : wos) w.loss = "bernoulli:0.1";
  const JobRun run = RunJob(so, wos, {&a, &b, &c});
  ASSERT_EQ(run.server.exit_code, 0) << run.server.error;
  const ChunkLayout layout(kFloats * 4, ChunkPayloadForMtu(1500, 16));
  const double subset = StopThreshold(layout.num_chunks(), 0.2);
  for (RecordingSource* s : {&a, &b, &c}) {
    ASSERT_EQ(run.workers[s->rank_].exit_code, 0)
        << run.workers[s->rank_].error;
    ASSERT_EQ(s->means.size(), kIters);
    for (uint64_t it = 0; it < kIters; ++it) {
      EXPECT_NEAR(s->rows[it].delivered_fraction * layout.num_chunks(), subset,
                  1e-6)
          << "iteration " << it;
      EXPECT_EQ(s->means[it], a.means[it]) << "iteration " << it;
    }
  }
}

// The zeroing experiment (--zero_fraction, --zero_iters) runs on kernel
// UDP too: every worker applies an all-zero mean in the window, and only
// there.
TEST(UdpJob, ZeroWindowZeroesTheMeanInItsStepsOnly) {
  constexpr uint64_t kFloats = 6000, kIters = 5;
  UdpJobServerOptions so = SmallServer();
  so.policy.kind = PolicyKind::kReliable;
  so.zero_fraction = 1.0;
  so.zero_first = 1;
  so.zero_last = 2;
  RecordingSource a(kFloats), b(kFloats);
  const JobRun run = RunJob(
      so, std::vector<UdpJobWorkerOptions>(2, SmallWorker(kIters)), {&a, &b});
  ASSERT_EQ(run.server.exit_code, 0) << run.server.error;
  for (RecordingSource* s : {&a, &b}) {
    ASSERT_EQ(s->means.size(), kIters);
    for (uint64_t it = 0; it < kIters; ++it) {
      const bool zero = std::all_of(s->means[it].begin(), s->means[it].end(),
                                    [](float x) { return x == 0.0f; });
      EXPECT_EQ(zero, it >= 1 && it <= 2) << "iteration " << it;
    }
  }
}

}  // namespace
}  // namespace dblp

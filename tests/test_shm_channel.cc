// The trainer <-> dblp-worker hand-off (shm_channel.h, shm_source.h): the
// layout both ends compute, the checks on an object that is not ours, the
// post/answer protocol, and a trainer that dies.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dblp/handoff/shm_channel.h"
#include "dblp/handoff/shm_source.h"

namespace dblp {
namespace {

std::string UniqueName(const char* what) {
  static std::atomic<int> n{0};
  return "/dblp-test-" + std::to_string(getpid()) + "-" + what + "-" +
         std::to_string(n++);
}

// Unlinks the name whatever the test does.
struct Named {
  explicit Named(const char* what) : name(UniqueName(what)) {}
  ~Named() { shm_unlink(name.c_str()); }
  std::string name;
};

// The layer table in the object itself (layers() is a process's copy).
ShmLayer* SharedTable(const ShmChannel& ch) {
  return reinterpret_cast<ShmLayer*>(reinterpret_cast<char*>(&ch.header()) +
                                     ch.header().layers_offset);
}

ShmLayer Layer(const char* name, uint64_t floats) {
  ShmLayer l{};
  std::strncpy(l.name, name, sizeof(l.name) - 1);
  l.floats = floats;
  return l;
}

TEST(ShmChannel, BothEndsSeeTheSameBuffersAndLayers) {
  Named n("layout");
  const std::vector<ShmLayer> layers = {Layer("fc.weight", 1000),
                                        Layer("fc.bias", 10)};
  ShmChannel trainer = ShmChannel::Create(n.name, 1010, layers);
  trainer.gradient()[1009] = 42.0f;
  ShmChannel worker = ShmChannel::Open(n.name);
  EXPECT_EQ(worker.header().floats, 1010u);
  EXPECT_EQ(worker.gradient()[1009], 42.0f);
  worker.mean()[0] = 7.0f;
  EXPECT_EQ(trainer.mean()[0], 7.0f);
  ASSERT_EQ(worker.layers().size(), 2u);
  EXPECT_STREQ(worker.layers()[0].name, "fc.weight");
  EXPECT_EQ(worker.layers()[1].floats, 10u);
  EXPECT_EQ(trainer.header().worker_pid, getpid());
  // Page-aligned, non-overlapping arrays.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(worker.gradient().data()) % 4096, 0u);
  EXPECT_GE(worker.mean().data(),
            worker.gradient().data() + worker.gradient().size());
}

TEST(ShmChannel, RefusesBadNamesSizesAndLayers) {
  EXPECT_THROW(ShmChannel::Create("no-slash", 10, {}), std::runtime_error);
  EXPECT_THROW(ShmChannel::Create("/a/b", 10, {}), std::runtime_error);
  Named n("bad");
  EXPECT_THROW(ShmChannel::Create(n.name, 0, {}), std::runtime_error);
  const std::vector<ShmLayer> wrong_sum = {Layer("a", 5)};
  EXPECT_THROW(ShmChannel::Create(n.name, 10, wrong_sum), std::runtime_error);
  ShmChannel first = ShmChannel::Create(n.name, 10, {});
  try {
    ShmChannel::Create(n.name, 10, {});
    FAIL() << "a second trainer took the same name";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rm /dev/shm"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ShmChannel::Open(UniqueName("missing")), std::runtime_error);
}

TEST(ShmChannel, OpenRefusesAnObjectThatIsNotAHandOff) {
  Named n("foreign");
  {
    ShmChannel ch = ShmChannel::Create(n.name, 100, {});
    ch.header().magic ^= 1;
  }
  EXPECT_THROW(ShmChannel::Open(n.name), std::runtime_error);
  Named m("offsets");
  {
    ShmChannel ch = ShmChannel::Create(m.name, 100, {});
    ch.header().mean_offset += 4;  // would alias the gradient's tail
  }
  EXPECT_THROW(ShmChannel::Open(m.name), std::runtime_error);
  Named k("layers");
  {
    ShmChannel ch = ShmChannel::Create(k.name, 100, {});
    ch.header().num_layers = kShmMaxLayers + 1;
  }
  EXPECT_THROW(ShmChannel::Open(k.name), std::runtime_error);
}

TEST(ShmChannel, OneWorkerPerTrainer) {
  Named n("claim");
  ShmChannel trainer = ShmChannel::Create(n.name, 16, {});
  ShmChannel first = ShmChannel::Open(n.name);
  try {
    ShmChannel::Open(n.name);
    FAIL() << "a second worker took over the trainer";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("already served"), std::string::npos);
  }
}

// A worker may run with privileges the trainer lacks: nothing the trainer
// writes into the header may move the worker's buffers.
TEST(ShmChannel, AHostileHeaderCannotMoveTheBuffers) {
  Named n("huge");
  {
    ShmChannel ch = ShmChannel::Create(n.name, 1024, {});
    ch.header().floats = (uint64_t{1} << 62) + 1024;  // wraps floats * 4
  }
  EXPECT_THROW(ShmChannel::Open(n.name), std::runtime_error);
  Named w("wrap");
  {
    const std::vector<ShmLayer> two = {Layer("a", 512), Layer("b", 512)};
    ShmChannel ch = ShmChannel::Create(w.name, 1024, two);
    ShmLayer* table = SharedTable(ch);
    table[0].floats = UINT64_MAX;  // + 1025 wraps to 1024
    table[1].floats = 1025;
  }
  EXPECT_THROW(ShmChannel::Open(w.name), std::runtime_error);
  Named m("moved");
  ShmChannel trainer = ShmChannel::Create(m.name, 1024, {});
  ShmChannel worker = ShmChannel::Open(m.name);
  float* const mean = worker.mean().data();
  trainer.header().mean_offset += uint64_t{1} << 40;
  trainer.header().floats = uint64_t{1} << 40;
  trainer.header().num_layers = kShmMaxLayers;
  EXPECT_EQ(worker.mean().data(), mean);
  EXPECT_EQ(worker.mean().size(), 1024u);
  EXPECT_EQ(worker.floats(), 1024u);
  EXPECT_EQ(worker.layers().size(), 1u);
}

TEST(ShmChannel, WaitChangeTimesOutAndSeesAChange) {
  std::atomic<uint32_t> word{5};
  EXPECT_FALSE(ShmChannel::WaitChange(word, 5, 20));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    word.store(6);
    ShmChannel::Wake(word);
  });
  EXPECT_TRUE(ShmChannel::WaitChange(word, 5, 5000));
  t.join();
}

TEST(ShmSource, FollowsTheTrainersPostsAndAnswers) {
  Named n("source");
  ShmChannel trainer = ShmChannel::Create(n.name, 64, {});
  auto src = OpenShmSource(n.name, 5000);
  ASSERT_EQ(src->floats(), 64u);
  EXPECT_TRUE(src->Unbounded());
  // The engine works in the shared buffers themselves (its own mapping).
  trainer.gradient()[63] = 3.5f;
  EXPECT_EQ(src->SharedGradient()[63], 3.5f);
  src->SharedMean()[0] = -1.0f;
  EXPECT_EQ(trainer.mean()[0], -1.0f);
  src->Bind(2, 3);
  src->OnJobStart(0);
  EXPECT_EQ(trainer.header().worker_state.load(),
            static_cast<uint32_t>(ShmWorkerState::kJoined));
  EXPECT_EQ(trainer.header().rank, 2u);
  const uint32_t answers = trainer.header().to_trainer.load();

  trainer.PostToWorker(ShmPost::kGradient, 0);
  EXPECT_TRUE(src->AwaitIteration(0, false, {}));
  IterationRecord r;
  r.iteration = 0;
  r.delivered_fraction = 0.75;
  r.p = 0.25;
  r.critical = true;
  src->Observe(r);
  src->Apply(0, src->SharedMean());
  EXPECT_EQ(trainer.header().to_trainer.load(), answers + 1);
  EXPECT_EQ(trainer.header().info.delivered_fraction, 0.75);
  EXPECT_EQ(trainer.header().info.critical, 1u);
  EXPECT_GE(trainer.header().info.worker_post_ns,
            trainer.header().info.worker_wake_ns);

  // A gradient where the schedule wants the parameters: refused, named.
  trainer.PostToWorker(ShmPost::kGradient, 1);
  try {
    src->AwaitIteration(1, /*resync=*/true, {});
    FAIL() << "a gradient was taken for a resync";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("resync_every"), std::string::npos);
  }
  // The wrong iteration is refused too.
  trainer.PostToWorker(ShmPost::kGradient, 7);
  EXPECT_THROW(src->AwaitIteration(2, false, {}), std::runtime_error);
  trainer.PostToWorker(ShmPost::kEnd, 3);
  EXPECT_FALSE(src->AwaitIteration(3, false, {}));
  src.reset();
  EXPECT_EQ(trainer.header().worker_state.load(),
            static_cast<uint32_t>(ShmWorkerState::kDone));
}

TEST(ShmSource, FailureReachesAWaitingTrainer) {
  Named n("fail");
  ShmChannel trainer = ShmChannel::Create(n.name, 16, {});
  auto src = OpenShmSource(n.name, 0);
  src->OnJobStart(0);
  const uint32_t answers = trainer.header().to_trainer.load();
  std::thread t([&] { src->Fail("the server is gone: test"); });
  EXPECT_TRUE(
      ShmChannel::WaitChange(trainer.header().to_trainer, answers, 5000));
  t.join();
  EXPECT_EQ(trainer.header().worker_state.load(),
            static_cast<uint32_t>(ShmWorkerState::kFailed));
  EXPECT_STREQ(trainer.header().error, "the server is gone: test");
}

TEST(ShmSource, ATrainerThatDiesIsNoticedNotWaitedFor) {
  Named n("dead");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The trainer: creates the object and dies without a word (unmapped by
    // the exit, the name stays).
    ShmChannel ch = ShmChannel::Create(n.name, 16, {});
    _exit(0);
  }
  int status = 0;
  // Not reaped yet: the trainer is a zombie, which must count as dead.
  for (int i = 0; i < 200; ++i) {
    if (access(("/dev/shm" + n.name).c_str(), F_OK) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto src = OpenShmSource(n.name, 0);
  try {
    src->AwaitIteration(0, false, {});
    FAIL() << "waited on a dead trainer";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exited"), std::string::npos)
        << e.what();
  }
  waitpid(child, &status, 0);
}

// Issue #21, item 5: the trainer's pid is the one read at the claim. A
// trainer that writes trainer_pid=1 into the shared header and exits is
// still noticed within a slice or two, not waited for (here the 5 s idle
// timeout would end the wait on a build that re-reads the header).
TEST(ShmSource, ATrainerPidRewrittenAfterTheClaimIsNotBelieved) {
  Named n("pid");
  ShmChannel trainer = ShmChannel::Create(n.name, 16, {});
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) pause();  // the trainer process, until killed
  }
  trainer.header().trainer_pid = child;  // as if the child had created it
  auto src = OpenShmSource(n.name, /*idle_timeout_ms=*/5000);
  EXPECT_NE(src->Describe().find(std::to_string(child)), std::string::npos);
  trainer.header().trainer_pid = 1;  // rewritten after the claim
  kill(child, SIGKILL);              // and the trainer goes
  const auto t0 = std::chrono::steady_clock::now();
  try {
    src->AwaitIteration(0, false, {});
    FAIL() << "waited on a trainer that exited";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("pid " + std::to_string(child) + ") exited"),
        std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  int status = 0;
  waitpid(child, &status, 0);
}

// The server gone while the worker waits for its trainer (which lives and
// never posts) ends the wait with the cause, within a slice or two.
TEST(ShmSource, AGoneCheckEndsTheWaitForALiveTrainer) {
  Named n("gone");
  ShmChannel trainer = ShmChannel::Create(n.name, 16, {});
  auto src = OpenShmSource(n.name, 5000);
  const auto t0 = std::chrono::steady_clock::now();
  const auto gone = [&]() -> std::string {
    if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(200))
      return "";
    return "the server is gone (dblp-server at 127.0.0.1:1 closed)";
  };
  try {
    src->AwaitIteration(4, false, gone);
    FAIL() << "the wait outlived its server";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("dblp-server at 127.0.0.1:1"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("waited for its trainer's input for "
                                         "iteration 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

// A layer table rewritten after the claim fails at once, named, both where
// the JOIN is made and at the next post; the worker keeps its own copy.
TEST(ShmSource, ALayerTableRewrittenAfterTheClaimIsNamed) {
  Named n("layers");
  const std::vector<ShmLayer> layers = {Layer("fc.weight", 12),
                                        Layer("fc.bias", 4)};
  ShmChannel trainer = ShmChannel::Create(n.name, 16, layers);
  auto src = OpenShmSource(n.name, 5000);
  ASSERT_EQ(src->Layers().size(), 2u);
  ShmLayer* table = SharedTable(trainer);
  table[1].floats = uint64_t{1} << 63;  // a negative dim in a JOIN
  try {
    src->Layers();
    FAIL() << "a rewritten layer table was used";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rewrote the layer table"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("layer 1 was 'fc.bias' of 4 floats"),
              std::string::npos)
        << e.what();
  }
  trainer.PostToWorker(ShmPost::kGradient, 0);
  EXPECT_THROW(src->AwaitIteration(0, false, {}), std::runtime_error);
}

TEST(ShmSource, IdleTimeoutNamesTheFlag) {
  Named n("idle");
  ShmChannel trainer = ShmChannel::Create(n.name, 16, {});
  auto src = OpenShmSource(n.name, 150);
  try {
    src->AwaitIteration(0, false, {});
    FAIL() << "no timeout";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--shm_idle_timeout_ms"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace dblp

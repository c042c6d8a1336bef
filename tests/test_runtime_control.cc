// The pure pieces of the runtime prompt and telemetry (issue #13): the
// published snapshots (seqlock, counter board, config list), the mailbox
// between the prompt and the engine, the injected burst in the loss
// injector, and the prompt's argument parsing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "dblp/emul/loss_model.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/obs/app_state.h"
#include "dblp/obs/runtime_command.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

struct Pair {
  uint64_t a = 0;
  uint64_t b = 0;
  double c = 0;
};

TEST(Seqlock, ReadersNeverSeeATornValue) {
  Seqlock<Pair> lock;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> torn{0}, reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        const Pair p = lock.Load();
        if (p.b != p.a * 3 || p.c != static_cast<double>(p.a)) ++torn;
        ++reads;
      }
    });
  }
  // Both readers running before the writer starts: on a loaded host the
  // stores could otherwise end before a reader was ever scheduled.
  while (reads.load() < 2) std::this_thread::yield();
  for (uint64_t i = 1; i <= 200000; ++i) {
    lock.Store(Pair{i, i * 3, static_cast<double>(i)});
  }
  done = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
  EXPECT_EQ(lock.Load().a, 200000u);
  EXPECT_EQ(lock.stores(), 200001u);  // the constructor's store too
}

TEST(CounterBoard, PublishReadAndClear) {
  CounterBoard b;
  EXPECT_TRUE(b.Read().empty());
  b.Publish({{"rx", 10}, {"tx", 5}});
  b.Publish({{"rx", 20}, {"tx", 7}, {"new", 1}});  // a name appears later
  CounterList v = b.Read();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], (std::pair<std::string, uint64_t>{"rx", 20}));
  EXPECT_EQ(v[2], (std::pair<std::string, uint64_t>{"new", 1}));
  b.ClearToLast();
  b.Publish({{"tx", 9}, {"rx", 25}, {"new", 1}});  // order does not matter
  v = b.Read();
  EXPECT_EQ(v[0].second, 5u);  // rx since the clear
  EXPECT_EQ(v[1].second, 2u);
  EXPECT_EQ(v[2].second, 0u);
  EXPECT_EQ(b.Read(false)[0].second, 25u);  // totals
  EXPECT_EQ(b.clears(), 1u);
  // A gauge that went down reads 0 since the clear, not a wrapped value.
  b.Publish({{"rx", 1}});
  EXPECT_EQ(b.Read()[0].second, 0u);
}

TEST(CounterBoard, CapacityIsBounded) {
  CounterBoard b;
  CounterList many;
  for (size_t i = 0; i < CounterBoard::kCapacity + 3; ++i) {
    many.emplace_back("c" + std::to_string(i), i);
  }
  b.Publish(many);
  EXPECT_EQ(b.Read().size(), CounterBoard::kCapacity);
  EXPECT_EQ(b.overflowed(), 3u);
}

TEST(CounterBoard, ConcurrentReadersSeeWholePublications) {
  CounterBoard b;
  b.Publish({{"a", 0}, {"b", 0}});
  std::atomic<bool> done{false};
  std::atomic<uint64_t> torn{0};
  std::thread reader([&] {
    while (!done.load()) {
      const CounterList v = b.Read(false);
      if (v.size() == 2 && v[1].second != 2 * v[0].second) ++torn;
    }
  });
  for (uint64_t i = 0; i < 100000; ++i) b.Publish({{"a", i}, {"b", 2 * i}});
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0u);
}

TEST(ConfigList, LaterEntryWinsInFirstOrder) {
  ConfigList c;
  c.Add("workers", "3");
  c.Add("policy", "dblp");
  c.Add("workers", "2");
  const auto v = c.Read();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0], (std::pair<std::string, std::string>{"workers", "2"}));
  EXPECT_EQ(v[1].first, "policy");
}

TEST(ControlMailbox, EngineAppliesWhatThePromptPosts) {
  ControlMailbox box;
  std::atomic<bool> running{true};
  RuntimeCommand taken;
  std::thread engine([&] {
    RuntimeCommand c;
    while (!box.Take(&c)) std::this_thread::yield();
    taken = c;
    RuntimeResult r;
    r.ok = true;
    r.from_iteration = 7;
    box.Done(r);
  });
  RuntimeCommand c;
  std::string err;
  ASSERT_TRUE(ParseSetP("0.25", &c, &err)) << err;
  RuntimeResult r;
  EXPECT_TRUE(box.Submit(c, running, &r));
  engine.join();
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.from_iteration, 7u);
  EXPECT_EQ(taken.kind, RuntimeCommand::Kind::kSetPolicy);
  EXPECT_DOUBLE_EQ(taken.policy.p_fixed, 0.25);
  RuntimeCommand none;
  EXPECT_FALSE(box.Take(&none));  // empty again
}

TEST(ControlMailbox, NothingAppliedOnceTheJobEnded) {
  ControlMailbox box;
  std::atomic<bool> running{false};
  RuntimeCommand c;
  c.kind = RuntimeCommand::Kind::kClearStats;
  RuntimeResult r;
  EXPECT_FALSE(box.Submit(c, running, &r));
  EXPECT_NE(std::string(r.text).find("no job"), std::string::npos);
  EXPECT_FALSE(box.Take(&c));  // withdrawn: the engine never sees it
}

TEST(InjectedBurst, CoversItsIterationsOnly) {
  InjectedBurst b;
  double loss = 0;
  EXPECT_FALSE(b.Covers(0, &loss));
  b.Set(10, 2, 0.7);
  EXPECT_FALSE(b.Covers(9, &loss));
  EXPECT_TRUE(b.Covers(10, &loss));
  EXPECT_DOUBLE_EQ(loss, 0.7);
  EXPECT_TRUE(b.Covers(11, &loss));
  EXPECT_FALSE(b.Covers(12, &loss));
}

// A DBLP header of `round` for the injector (it reads the round only).
std::vector<uint8_t> Frame(uint32_t round) {
  std::vector<uint8_t> f(kDataHeaderBytes + 8, 0);
  DataHeader h{FrameType::kPush, 1, 0, 8, round, 0};
  EncodeDataHeader(h, f.data());
  return f;
}

TEST(RxLossInjector, InjectedBurstDropsAtItsLossFromItsIteration) {
  InjectedBurst b;
  RxLossInjector inj(LossSpec{}, BurstSchedule{}, 1);
  inj.set_injected(&b);
  const auto drops = [&](uint64_t it) {
    const std::vector<uint8_t> f = Frame(PushRound(it));
    int n = 0;
    for (int i = 0; i < 10000; ++i) n += inj.ShouldDrop(f.data(), f.size(), 0);
    return n;
  };
  EXPECT_EQ(drops(3), 0);
  b.Set(4, 2, 0.5);  // at the boundary before iteration 4
  EXPECT_FALSE(inj.InBurst(3));
  EXPECT_TRUE(inj.InBurst(4));
  EXPECT_NEAR(drops(4), 5000, 300);
  EXPECT_NEAR(drops(5), 5000, 300);
  EXPECT_EQ(drops(6), 0);
  b.Set(7, 1, 1.0);
  EXPECT_EQ(drops(7), 10000);
}

TEST(LossInjector, InjectedBurstOverridesTheScheduledLoss) {
  BurstSchedule s = ParseBurstIterations("2", 0.0001);
  LossInjector inj(LossSpec{}, s, 3);
  inj.SetIteration(2);
  inj.SetInjectedBurst(1.0);
  EXPECT_TRUE(inj.InBurst());
  EXPECT_TRUE(inj.ShouldDrop());
  inj.SetInjectedBurst(0);  // ended: the schedule's burst again
  EXPECT_TRUE(inj.InBurst());
  inj.SetIteration(3);
  EXPECT_FALSE(inj.InBurst());
}

TEST(RuntimeCommand, SetP) {
  RuntimeCommand c;
  std::string err;
  ASSERT_TRUE(ParseSetP("0.2", &c, &err));
  EXPECT_TRUE(c.set_p);
  EXPECT_EQ(c.policy.kind, PolicyKind::kFixed);
  EXPECT_DOUBLE_EQ(c.policy.p_fixed, 0.2);
  EXPECT_TRUE(ParseSetP("0", &c, &err));
  for (const char* bad : {"1", "1.5", "-0.1", "nan", "0.2x", "", "inf"}) {
    EXPECT_FALSE(ParseSetP(bad, &c, &err)) << bad;
    EXPECT_NE(err.find("[0, 1)"), std::string::npos) << err;
  }
}

TEST(RuntimeCommand, SetPolicyKeepsWhatIsNotGiven) {
  PolicyConfig cur;  // dblp 0.008 / 0.408, freq 10, eta 0.5
  RuntimeCommand c;
  std::string err;
  ASSERT_TRUE(ParseSetPolicy("dblp", "p_high=0.3 clr_freq=5", cur, &c, &err))
      << err;
  EXPECT_EQ(c.policy.kind, PolicyKind::kDblp);
  EXPECT_DOUBLE_EQ(c.policy.p_low, 0.008);
  EXPECT_DOUBLE_EQ(c.policy.p_high, 0.3);
  EXPECT_EQ(c.policy.clr.freq, 5u);
  EXPECT_DOUBLE_EQ(c.policy.clr.eta, 0.5);
  ASSERT_TRUE(ParseSetPolicy("fixed", "0.05", cur, &c, &err)) << err;
  EXPECT_EQ(c.policy.kind, PolicyKind::kFixed);
  EXPECT_DOUBLE_EQ(c.policy.p_fixed, 0.05);
  ASSERT_TRUE(ParseSetPolicy("fixed", "p_fixed=0.1", cur, &c, &err));
  EXPECT_DOUBLE_EQ(c.policy.p_fixed, 0.1);
  ASSERT_TRUE(ParseSetPolicy("reliable", "", cur, &c, &err));
  EXPECT_EQ(c.policy.kind, PolicyKind::kReliable);
}

TEST(RuntimeCommand, SetPolicyRefusesWithTheFix) {
  PolicyConfig cur;
  RuntimeCommand c;
  std::string err;
  EXPECT_FALSE(ParseSetPolicy("ltp", "", cur, &c, &err));
  EXPECT_NE(err.find("use fixed"), std::string::npos) << err;
  EXPECT_FALSE(ParseSetPolicy("dblp", "p_lo=0.1", cur, &c, &err));
  EXPECT_NE(err.find("p_low=P"), std::string::npos) << err;
  EXPECT_FALSE(ParseSetPolicy("dblp", "p_low=0.5 p_high=0.1", cur, &c, &err));
  EXPECT_NE(err.find("p_low"), std::string::npos) << err;
  EXPECT_FALSE(ParseSetPolicy("dblp", "clr_freq=0", cur, &c, &err));
  EXPECT_FALSE(ParseSetPolicy("fixed", "p_low=0.1", cur, &c, &err));
  EXPECT_FALSE(ParseSetPolicy("reliable", "0.1", cur, &c, &err));
  EXPECT_FALSE(ParseSetPolicy("fixed", "1.0", cur, &c, &err));
}

TEST(RuntimeCommand, InjectBurst) {
  RuntimeCommand c;
  std::string err;
  ASSERT_TRUE(ParseInjectBurst("0.7", 3, &c, &err)) << err;
  EXPECT_EQ(c.kind, RuntimeCommand::Kind::kInjectBurst);
  EXPECT_DOUBLE_EQ(c.loss, 0.7);
  EXPECT_EQ(c.iterations, 3u);
  EXPECT_TRUE(ParseInjectBurst("1", 1, &c, &err));
  EXPECT_FALSE(ParseInjectBurst("0", 1, &c, &err));
  EXPECT_FALSE(ParseInjectBurst("1.1", 1, &c, &err));
  EXPECT_FALSE(ParseInjectBurst("0.5", 0, &c, &err));
  EXPECT_NE(err.find("1..1000000"), std::string::npos) << err;
}

TEST(RuntimeCommand, SplitCommandFileNumbersLines) {
  const auto v = SplitCommandFile(
      "# header\n\nwait iteration 5\r\n  set p 0.2  \n#x\n"
      "show round");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].number, 3u);
  EXPECT_EQ(v[0].text, "wait iteration 5");
  EXPECT_EQ(v[1].number, 4u);
  EXPECT_EQ(v[1].text, "set p 0.2");
  EXPECT_EQ(v[2].number, 6u);
  EXPECT_EQ(v[2].text, "show round");
}

TEST(Views, RoundAndPolicyAsPublished) {
  AppState s;
  s.is_server = true;
  RoundSnapshot r;
  r.phase = JobPhase::kBroadcast;
  r.iteration = 12;
  r.p = 0.2;
  r.next_p = 0.2;
  r.critical = 1;
  r.changes = 1;
  r.last_change_iteration = 6;
  s.round.Store(r);
  PolicySnapshot p;
  p.known = 1;
  p.config.kind = PolicyKind::kFixed;
  p.config.p_fixed = 0.2;
  s.policy.Store(p);
  const std::string text = FormatView("round", RoundView(s));
  EXPECT_NE(text.find("round:\n  phase: broadcast\n  iteration: 12\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  p: 0.2\n"), std::string::npos);
  EXPECT_NE(text.find("  clr_state: critical\n"), std::string::npos);
  EXPECT_NE(text.find("  last_change_iteration: 6\n"), std::string::npos);
  const std::string pol = FormatView("policy", PolicyView(s));
  EXPECT_NE(pol.find("  describe: fixed(p=0.2)\n"), std::string::npos) << pol;
  EXPECT_NE(pol.find("  p_fixed: 0.2\n"), std::string::npos);
}

}  // namespace
}  // namespace dblp

// The in-memory loopback fabric: ordered delivery, loss only where the
// injector or a full ring says so, and the test hooks (tap, Inject).
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "dblp/emul/loss_model.h"
#include "dblp/transport/loopback_transport.h"

namespace dblp {
namespace {

// A frame whose 4 payload bytes carry `id`, so order and identity can be
// checked after the trip.
Packet Frame(uint32_t dst, uint32_t id) {
  Packet p;
  p.dst = dst;
  p.src = 0xDEAD;  // TxBurst must overwrite it
  p.bytes = {static_cast<uint8_t>(id), static_cast<uint8_t>(id >> 8),
             static_cast<uint8_t>(id >> 16), static_cast<uint8_t>(id >> 24)};
  return p;
}

uint32_t IdOf(const Packet& p) {
  return static_cast<uint32_t>(p.bytes.at(0)) |
         static_cast<uint32_t>(p.bytes.at(1)) << 8 |
         static_cast<uint32_t>(p.bytes.at(2)) << 16 |
         static_cast<uint32_t>(p.bytes.at(3)) << 24;
}

// Sends ids [first, first + n) from `src` to `dst` in bursts of `burst`.
void SendIds(LoopbackFabric& f, uint32_t src, uint32_t dst, uint32_t first,
             uint32_t n, uint32_t burst) {
  std::vector<Packet> pkts;
  for (uint32_t i = 0; i < n; i += burst) {
    pkts.clear();
    for (uint32_t j = i; j < n && j < i + burst; ++j) {
      pkts.push_back(Frame(dst, first + j));
    }
    const auto k = static_cast<uint16_t>(pkts.size());
    ASSERT_EQ(f.port(src).TxBurst(pkts.data(), k), k);
  }
}

std::vector<Packet> Drain(LoopbackPort& port, uint16_t max) {
  std::vector<Packet> all;
  std::vector<Packet> buf(max);
  uint16_t k;
  while ((k = port.RxBurst(buf.data(), max)) > 0) {
    EXPECT_LE(k, max);
    for (uint16_t i = 0; i < k; ++i) all.push_back(std::move(buf[i]));
  }
  return all;
}

TEST(LoopbackTest, FramesArriveInOrderWithSourceSet) {
  LoopbackFabric f(3, 1024);
  EXPECT_EQ(f.size(), 3u);
  SendIds(f, 1, 0, 0, 100, 32);
  SendIds(f, 2, 0, 1000, 50, 7);
  EXPECT_EQ(f.port(0).rx_pending(), 150u);
  EXPECT_EQ(f.port(1).rx_pending(), 0u);

  const std::vector<Packet> got = Drain(f.port(0), 16);
  ASSERT_EQ(got.size(), 150u);
  for (uint32_t i = 0; i < 100; ++i) {
    EXPECT_EQ(IdOf(got[i]), i);
    EXPECT_EQ(got[i].src, 1u);
    EXPECT_EQ(got[i].dst, 0u);
  }
  for (uint32_t i = 0; i < 50; ++i) {
    EXPECT_EQ(IdOf(got[100 + i]), 1000 + i);
    EXPECT_EQ(got[100 + i].src, 2u);
  }
  EXPECT_EQ(f.port(1).tx_frames(), 100u);
  EXPECT_EQ(f.port(2).tx_frames(), 50u);
  EXPECT_EQ(f.port(0).rx_frames(), 150u);
  EXPECT_EQ(f.port(0).tx_frames(), 0u);
  EXPECT_EQ(f.port(0).rx_pending(), 0u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(f.port(i).injected_drops(), 0u);
    EXPECT_EQ(f.port(i).ring_drops(), 0u);
  }
  // An empty ring yields nothing and counts nothing.
  Packet p;
  EXPECT_EQ(f.port(0).RxBurst(&p, 1), 0u);
  EXPECT_EQ(f.port(0).rx_frames(), 150u);
}

TEST(LoopbackTest, InjectedLossIsCountedAndIsTheOnlyLoss) {
  constexpr uint32_t kFrames = 20000;
  const LossSpec spec{LossKind::kBernoulli, 0.3};
  LossInjector loss(spec, {}, 42);
  // A twin with the same seed predicts exactly which frames go missing.
  LossInjector twin(spec, {}, 42);
  std::vector<uint32_t> expected;
  for (uint32_t i = 0; i < kFrames; ++i) {
    if (!twin.ShouldDrop()) expected.push_back(i);
  }

  LoopbackFabric f(2, kFrames);
  f.port(1).set_loss(&loss);
  SendIds(f, 1, 0, 0, kFrames, 32);
  const LoopbackPort& tx = f.port(1);
  EXPECT_EQ(tx.tx_frames(), kFrames);
  EXPECT_EQ(tx.injected_drops(), loss.dropped());
  EXPECT_EQ(loss.considered(), kFrames);
  EXPECT_NEAR(static_cast<double>(tx.injected_drops()) / kFrames, 0.3, 0.02);
  // Loss is charged to the sender, never to the receiver's ring.
  EXPECT_EQ(f.port(0).injected_drops(), 0u);
  EXPECT_EQ(f.port(0).ring_drops(), 0u);

  const std::vector<Packet> got = Drain(f.port(0), 64);
  EXPECT_EQ(got.size() + tx.injected_drops(), kFrames);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(IdOf(got[i]), expected[i]) << "at " << i;
  }

  // Loss belongs to the port it was set on: the reverse direction is clean.
  SendIds(f, 0, 1, 0, 1000, 32);
  EXPECT_EQ(Drain(f.port(1), 64).size(), 1000u);
  EXPECT_EQ(f.port(0).injected_drops(), 0u);

  // Removing the injector stops the loss.
  f.port(1).set_loss(nullptr);
  SendIds(f, 1, 0, 0, 1000, 32);
  EXPECT_EQ(Drain(f.port(0), 64).size(), 1000u);
}

TEST(LoopbackTest, RingOverflowIsCountedAtTheReceivingPort) {
  LoopbackFabric f(3, 8);
  SendIds(f, 1, 0, 0, 20, 20);
  EXPECT_EQ(f.port(0).rx_pending(), 8u);
  EXPECT_EQ(f.port(0).ring_drops(), 12u);
  EXPECT_EQ(f.port(1).ring_drops(), 0u);
  EXPECT_EQ(f.port(1).injected_drops(), 0u);
  EXPECT_EQ(f.port(1).tx_frames(), 20u);  // the sender is not told

  // A full ring keeps the oldest frames (tail drop).
  std::vector<Packet> got = Drain(f.port(0), 3);
  ASSERT_EQ(got.size(), 8u);
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(IdOf(got[i]), i);

  // Draining makes room again; another port's ring is independent.
  SendIds(f, 2, 0, 100, 5, 5);
  SendIds(f, 0, 2, 200, 8, 8);
  EXPECT_EQ(f.port(0).rx_pending(), 5u);
  EXPECT_EQ(f.port(2).rx_pending(), 8u);
  EXPECT_EQ(f.port(0).ring_drops(), 12u);
  EXPECT_EQ(f.port(2).ring_drops(), 0u);
}

TEST(LoopbackTest, TapSeesEveryFrameIncludingLostOnes) {
  LoopbackFabric f(3, 4);
  LossInjector all_lost({LossKind::kBernoulli, 1.0}, {}, 1);
  LossInjector half_lost({LossKind::kBernoulli, 0.5}, {}, 2);
  f.port(1).set_loss(&all_lost);
  f.port(2).set_loss(&half_lost);
  std::vector<std::pair<uint32_t, uint32_t>> tapped;  // (src, id)
  f.set_tap([&](const Packet& p) { tapped.emplace_back(p.src, IdOf(p)); });

  SendIds(f, 1, 0, 0, 30, 8);     // every frame lost
  SendIds(f, 2, 0, 100, 40, 8);   // half lost, then the ring (4) overflows
  SendIds(f, 0, 2, 500, 3, 3);    // clean
  ASSERT_EQ(tapped.size(), 73u);
  for (uint32_t i = 0; i < 30; ++i) {
    EXPECT_EQ(tapped[i], std::make_pair(1u, i));
  }
  for (uint32_t i = 0; i < 40; ++i) {
    EXPECT_EQ(tapped[30 + i], std::make_pair(2u, 100 + i));
  }
  EXPECT_EQ(tapped[70], std::make_pair(0u, 500u));
  EXPECT_EQ(f.port(1).injected_drops(), 30u);
  EXPECT_EQ(f.port(0).rx_pending(), 4u);
  EXPECT_EQ(f.port(0).ring_drops() + f.port(0).rx_pending() +
                f.port(2).injected_drops(),
            40u);
}

TEST(LoopbackTest, InjectBypassesLossAndTap) {
  LoopbackFabric f(2, 2);
  LossInjector all_lost({LossKind::kBernoulli, 1.0}, {}, 3);
  f.port(0).set_loss(&all_lost);
  f.port(1).set_loss(&all_lost);
  uint32_t tapped = 0;
  f.set_tap([&](const Packet&) { ++tapped; });

  Packet p = Frame(/*dst=*/1, 77);  // dst is overwritten by Inject
  p.src = 1;                        // src is kept: replays forge it
  EXPECT_TRUE(f.Inject(0, p));
  EXPECT_TRUE(f.Inject(0, Frame(0, 78)));
  EXPECT_FALSE(f.Inject(0, Frame(0, 79)));  // ring of 2 is full
  EXPECT_EQ(f.port(0).ring_drops(), 1u);
  EXPECT_EQ(tapped, 0u);
  EXPECT_EQ(all_lost.considered(), 0u);
  EXPECT_EQ(f.port(0).injected_drops(), 0u);

  const std::vector<Packet> got = Drain(f.port(0), 8);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(IdOf(got[0]), 77u);
  EXPECT_EQ(got[0].src, 1u);
  EXPECT_EQ(got[0].dst, 0u);
  EXPECT_EQ(IdOf(got[1]), 78u);
}

TEST(LoopbackTest, BadDestinationThrows) {
  LoopbackFabric f(2, 16);
  Packet p = Frame(2, 1);
  EXPECT_THROW(f.port(0).TxBurst(&p, 1), std::out_of_range);
  EXPECT_EQ(f.port(0).tx_frames(), 0u);
  EXPECT_THROW(f.Inject(5, Frame(5, 1)), std::out_of_range);
  EXPECT_THROW(f.port(2), std::out_of_range);
  // A zero-frame burst is a no-op.
  EXPECT_EQ(f.port(0).TxBurst(nullptr, 0), 0u);
}

TEST(LoopbackTest, ConstructorRejectsEmptyFabric) {
  EXPECT_THROW(LoopbackFabric(0, 16), std::invalid_argument);
  EXPECT_THROW(LoopbackFabric(2, 0), std::invalid_argument);
}

TEST(LoopbackTest, SatisfiesTheBurstTransportConcept) {
  static_assert(BurstTransport<LoopbackPort>);
  LoopbackFabric f(1, 4);
  // A port may send to itself.
  SendIds(f, 0, 0, 9, 1, 1);
  const std::vector<Packet> got = Drain(f.port(0), 4);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].src, 0u);
  EXPECT_EQ(IdOf(got[0]), 9u);
}

}  // namespace
}  // namespace dblp

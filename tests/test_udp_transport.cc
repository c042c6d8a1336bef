// Kernel UDP transport (UdpSocketPort) and the push protocol over it
// (udp_push.h): real sockets on 127.0.0.1, real TCP control.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dblp/transport/udp_transport.h"
#include "dblp/wire/chunking.h"
#include "udp/udp_push.h"

namespace dblp {
namespace {

using Clock = std::chrono::steady_clock;

// Frame i: its index, then a pattern that depends on it, of varying length.
void MakeFrame(uint32_t i, std::vector<uint8_t>& out) {
  out.resize(8 + (i * 37) % 1400);
  std::memcpy(out.data(), &i, 4);
  const uint32_t len = static_cast<uint32_t>(out.size());
  std::memcpy(out.data() + 4, &len, 4);
  for (size_t k = 8; k < out.size(); ++k) {
    out[k] = static_cast<uint8_t>(i * 131 + k);
  }
}

bool FrameOk(uint32_t i, const std::vector<uint8_t>& got) {
  std::vector<uint8_t> want;
  MakeFrame(i, want);
  return got == want;
}

TEST(UdpSocketPort, BurstRoundTripChecksEveryFrame) {
  UdpSocketPort a, b;
  std::string err;
  UdpPortOptions opts;
  opts.max_datagram = 1472;
  ASSERT_TRUE(a.Open("127.0.0.1:0", opts, &err)) << err;
  ASSERT_TRUE(b.Open("127.0.0.1:0", opts, &err)) << err;
  ASSERT_NE(a.bound_port(), 0);
  a.AddPeer(7, b.bound_addr());
  b.AddPeer(3, a.bound_addr());

  constexpr uint32_t kFrames = 20000;
  std::vector<Packet> tx(32), rx(64);
  uint32_t next_tx = 0, next_rx = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::vector<const uint8_t*> slots(rx.size(), nullptr);
  uint64_t reallocations = 0;
  while (next_rx < kFrames && Clock::now() < deadline) {
    if (next_tx < kFrames) {
      const uint16_t n =
          static_cast<uint16_t>(std::min<uint32_t>(32, kFrames - next_tx));
      for (uint16_t i = 0; i < n; ++i) {
        tx[i].dst = 7;
        MakeFrame(next_tx + i, tx[i].bytes);
      }
      next_tx += a.TxBurst(tx.data(), n);
    }
    const uint16_t got = b.RxBurst(rx.data(), static_cast<uint16_t>(rx.size()));
    for (uint16_t i = 0; i < got; ++i) {
      ASSERT_EQ(rx[i].src, 3u);
      // Loopback keeps order and, with the enlarged buffer, every frame.
      ASSERT_TRUE(FrameOk(next_rx, rx[i].bytes)) << "frame " << next_rx;
      ++next_rx;
    }
    // Once warm, every slot keeps its buffer: no per-packet allocation.
    if (next_rx > 1000) {
      for (size_t i = 0; i < rx.size(); ++i) {
        if (slots[i] != nullptr && slots[i] != rx[i].bytes.data()) {
          ++reallocations;
        }
        slots[i] = rx[i].bytes.data();
      }
    }
  }
  EXPECT_EQ(next_rx, kFrames);
  EXPECT_EQ(reallocations, 0u);
  EXPECT_EQ(a.tx_frames(), kFrames);
  EXPECT_EQ(b.rx_frames(), kFrames);
  EXPECT_EQ(b.socket_drops(), 0u);
  // SO_RCVBUFFORCE needs root; as a user the kernel's rmem_max caps it.
  if (geteuid() == 0) {
    EXPECT_GT(b.rcvbuf_bytes(), 1 << 20);
  }
}

// The protocol's shape: full frames of one size and a shorter last one
// (a round's last chunk), to one peer. With segmentation the kernel takes
// runs of them as one message and the receiver gets them coalesced; every
// datagram still arrives whole, in order, with its own length, also when
// the caller takes fewer per call than a message holds.
void SegmentedRoundTrip(bool segmentation) {
  UdpSocketPort a, b;
  std::string err;
  UdpPortOptions opts;
  opts.max_datagram = 1472;
  opts.segmentation = segmentation;
  ASSERT_TRUE(a.Open("127.0.0.1:0", opts, &err)) << err;
  ASSERT_TRUE(b.Open("127.0.0.1:0", opts, &err)) << err;
  if (segmentation && (!a.tx_segmentation() || !b.rx_coalescing())) {
    GTEST_SKIP() << "this kernel has no UDP_SEGMENT / UDP_GRO";
  }
  a.AddPeer(1, b.bound_addr());
  b.AddPeer(2, a.bound_addr());
  auto size_of = [](uint32_t i) -> size_t {
    return i % 100 == 99 ? 200 + i % 7 : 1472;  // every 100th is short
  };
  auto fill = [&](uint32_t i, std::vector<uint8_t>& out) {
    out.resize(size_of(i));
    for (size_t k = 0; k < out.size(); ++k) {
      out[k] = static_cast<uint8_t>(i * 7 + k);
    }
    std::memcpy(out.data(), &i, 4);
  };
  constexpr uint32_t kFrames = 5000;
  std::vector<Packet> tx(64), rx(5);  // 5: fewer than a message holds
  uint32_t next_tx = 0, next_rx = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (next_rx < kFrames && Clock::now() < deadline) {
    if (next_tx < kFrames) {
      const auto n =
          static_cast<uint16_t>(std::min<uint32_t>(64, kFrames - next_tx));
      for (uint16_t i = 0; i < n; ++i) {
        tx[i].dst = 1;
        fill(next_tx + i, tx[i].bytes);
      }
      next_tx += a.TxBurst(tx.data(), n);
    }
    const uint16_t got = b.RxBurst(rx.data(), static_cast<uint16_t>(rx.size()));
    for (uint16_t i = 0; i < got; ++i) {
      std::vector<uint8_t> want;
      fill(next_rx, want);
      ASSERT_EQ(rx[i].src, 2u);
      ASSERT_EQ(rx[i].bytes, want) << "datagram " << next_rx;
      ++next_rx;
    }
  }
  EXPECT_EQ(next_rx, kFrames);
  EXPECT_EQ(a.tx_frames(), kFrames);
  EXPECT_EQ(b.rx_frames(), kFrames);
  if (segmentation) {
    // At most 44 of 1472 B fit one message: more than kFrames / 44 sends.
    EXPECT_GT(a.tx_segmented(), kFrames / 100);
    EXPECT_GT(b.rx_coalesced(), 0u);
  } else {
    EXPECT_EQ(a.tx_segmented(), 0u);
    EXPECT_EQ(b.rx_coalesced(), 0u);
  }
}

TEST(UdpSocketPort, SegmentedDatagramsArriveWholeAndInOrder) {
  SegmentedRoundTrip(true);
}

TEST(UdpSocketPort, WithoutSegmentationOneDatagramAMessage) {
  SegmentedRoundTrip(false);
}

TEST(UdpSocketPort, UnknownSourceAndDestination) {
  UdpSocketPort a, b;
  std::string err;
  ASSERT_TRUE(a.Open("127.0.0.1:0", {}, &err)) << err;
  ASSERT_TRUE(b.Open("127.0.0.1:0", {}, &err)) << err;
  a.AddPeer(1, b.bound_addr());
  Packet p[2];
  p[0].dst = 9;  // no such peer: taken and dropped
  p[0].bytes = {1, 2, 3};
  p[1].dst = 1;
  p[1].bytes = {4, 5};
  EXPECT_EQ(a.TxBurst(p, 2), 2);
  EXPECT_EQ(a.tx_no_route(), 1u);
  Packet r[4];
  uint16_t got = 0;
  for (int i = 0; i < 1000 && got == 0; ++i) {
    got = b.RxBurst(r, 4);
    if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(got, 1);
  EXPECT_EQ(r[0].src, UdpSocketPort::kUnknownEndpoint);
  EXPECT_EQ(r[0].bytes, (std::vector<uint8_t>{4, 5}));
}

TEST(UdpSocketPort, OversizedDatagramIsCountedNotDelivered) {
  UdpSocketPort a, b;
  std::string err;
  UdpPortOptions small;
  small.max_datagram = 100;
  ASSERT_TRUE(a.Open("127.0.0.1:0", {}, &err)) << err;
  ASSERT_TRUE(b.Open("127.0.0.1:0", small, &err)) << err;
  a.AddPeer(0, b.bound_addr());
  Packet p[2];
  p[0].bytes.assign(500, 0xAA);
  p[1].bytes.assign(50, 0xBB);
  ASSERT_EQ(a.TxBurst(p, 2), 2);
  Packet r[4];
  uint16_t got = 0;
  for (int i = 0; i < 1000 && b.rx_frames() < 2; ++i) {
    got += b.RxBurst(r + got, static_cast<uint16_t>(4 - got));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(got, 1);
  EXPECT_EQ(r[0].bytes, std::vector<uint8_t>(50, 0xBB));
  EXPECT_EQ(b.rx_truncated(), 1u);
}

TEST(UdpSocketPort, ErrorsNameTheFix) {
  UdpSocketPort a, b;
  std::string err;
  EXPECT_FALSE(a.Open("1.2.3:80", {}, &err));
  EXPECT_NE(err.find("not an IPv4 address"), std::string::npos) << err;
  EXPECT_FALSE(a.Open("127.0.0.1", {}, &err));
  EXPECT_NE(err.find("no ':port'"), std::string::npos) << err;
  EXPECT_FALSE(a.Open("127.0.0.1:70000", {}, &err));
  EXPECT_NE(err.find("65535"), std::string::npos) << err;
  ASSERT_TRUE(a.Open("127.0.0.1:0", {}, &err)) << err;
  EXPECT_FALSE(b.Open("127.0.0.1:" + std::to_string(a.bound_port()), {}, &err));
  EXPECT_NE(err.find("already in use"), std::string::npos) << err;
  EXPECT_FALSE(b.Open("192.0.2.77:0", {}, &err));
  EXPECT_NE(err.find("not an address of this host"), std::string::npos) << err;
  // Not open: bursts do nothing rather than crash.
  Packet p;
  EXPECT_EQ(b.TxBurst(&p, 1), 0);
  EXPECT_EQ(b.RxBurst(&p, 1), 0);
}

// ---- the push protocol over it --------------------------------------------

UdpPushBenchOptions SmallBench() {
  UdpPushBenchOptions o;
  o.size_mb = 1;
  o.iterations = 4;
  o.round_timeout_ms = 10000;
  o.server_cpu = -1;  // tests may run next to each other
  o.worker_cpu = -1;
  return o;
}

TEST(UdpPushBench, LossyRoundsMeetTheToleranceAndTheMeanIsExact) {
  UdpPushBenchOptions o = SmallBench();
  o.loss = "bernoulli:0.05";
  o.p = 0.02;
  o.seed = 11;
  const uint64_t bytes = 1 << 20;
  std::vector<float> grad(bytes / 4);
  FillBenchGradient(0, grad);
  // The job tags its frames (frame_auth header by default): 16 bytes less
  // payload per chunk.
  const ChunkLayout layout(
      bytes, ChunkPayloadForMtu(o.mtu, FrameTagBytes(o.frame_auth)));
  int server_rounds = 0;
  uint64_t checked_chunks = 0, mismatches = 0, nonzero_missing = 0;
  o.on_server_round = [&](const UdpServerRoundView& v) {
    ++server_rounds;
    ASSERT_EQ(v.mean.size(), grad.size());
    ASSERT_EQ(v.arrived.size(), 1u);
    const Bitmap& got = v.arrived[0];
    EXPECT_GE(got.Count(), layout.num_chunks() * (1 - o.p) - 1e-9);
    for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
      const size_t first = layout.Offset(c) / 4;
      const size_t n = layout.Length(c) / 4;
      const bool have = got.Test(c);
      checked_chunks += have;
      for (size_t k = first; k < first + n; ++k) {
        if (have && v.mean[k] != grad[k]) ++mismatches;
        if (!have && v.mean[k] != 0.0f) ++nonzero_missing;
      }
    }
  };
  const UdpPushBenchResult r = RunUdpPushBench(o);
  ASSERT_EQ(r.exit_code, 0) << r.error;
  EXPECT_EQ(r.size_bytes, bytes);
  EXPECT_EQ(r.chunks, layout.num_chunks());
  ASSERT_EQ(r.rounds.size(), 4u);
  EXPECT_EQ(server_rounds, 4);
  for (const UdpRoundRecord& x : r.rounds) {
    EXPECT_GE(x.delivered_fraction, 1 - o.p) << "iteration " << x.iteration;
    EXPECT_GT(x.latency_us, 0);
    EXPECT_GE(x.packets_sent, layout.num_chunks() * (1 - o.p));
    EXPECT_GE(x.passes, 1u);
  }
  for (const UdpServerRound& x : r.server_rounds) {
    EXPECT_GE(x.delivered_fraction, 1 - o.p);
  }
  EXPECT_GT(checked_chunks, 0u);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(nonzero_missing, 0u);
  EXPECT_GT(r.counters.at("injected_drops"), 0u);
  EXPECT_EQ(r.counters.at("push_malformed"), 0u);
}

TEST(UdpPushBench, ZeroToleranceDeliversEveryChunkDespiteLoss) {
  UdpPushBenchOptions o = SmallBench();
  o.iterations = 3;
  o.loss = "bernoulli:0.05";
  o.p = 0;
  // The pinned path too, where this process may run on CPUs 0 and 1.
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool both = sched_getaffinity(0, sizeof(set), &set) == 0 &&
                    CPU_ISSET(0, &set) && CPU_ISSET(1, &set);
  o.server_cpu = both ? 0 : -1;
  o.worker_cpu = both ? 1 : -1;
  const UdpPushBenchResult r = RunUdpPushBench(o);
  ASSERT_EQ(r.exit_code, 0) << r.error;
  ASSERT_EQ(r.rounds.size(), 3u);
  for (const UdpRoundRecord& x : r.rounds) {
    EXPECT_EQ(x.delivered_fraction, 1.0) << "iteration " << x.iteration;
    EXPECT_GE(x.passes, 2u);  // 5% of ~700 frames lost: a resend pass
    EXPECT_GT(x.packets_sent, r.chunks);
  }
  for (const UdpServerRound& x : r.server_rounds) {
    EXPECT_EQ(x.delivered_fraction, 1.0);
  }
}

// Datagrams from a socket the server did not pin at JOIN, garbage or a
// valid-looking DBLP header alike, are dropped and counted before any
// decoding.
TEST(UdpPushBench, DatagramsFromAStrangerAreCountedUnpinned) {
  UdpPushBenchOptions o = SmallBench();
  o.iterations = 3;
  uint16_t udp_port = 0;
  o.on_server_listening = [&](uint16_t port) { udp_port = port; };
  int sent = 0;
  o.on_server_round = [&](const UdpServerRoundView& v) {
    if (v.iteration != 0) return;
    // From a stranger's socket, while the job runs.
    const int fd = socket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(udp_port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const uint8_t junk[3][40] = {{1, 2, 3}, {0xDB, 0x1F, 9}, {0xFF}};
    const size_t lens[3] = {3, 40, 40};
    for (int i = 0; i < 3; ++i) {
      if (sendto(fd, junk[i], lens[i], 0, reinterpret_cast<sockaddr*>(&to),
                 sizeof to) == static_cast<ssize_t>(lens[i])) {
        ++sent;
      }
    }
    close(fd);
  };
  const UdpPushBenchResult r = RunUdpPushBench(o);
  ASSERT_EQ(r.exit_code, 0) << r.error;
  EXPECT_EQ(sent, 3);
  EXPECT_EQ(r.counters.at("frames_unpinned_source"), 3u);
  EXPECT_EQ(r.counters.at("push_malformed"), 0u);
  ASSERT_EQ(r.rounds.size(), 3u);
  for (const UdpRoundRecord& x : r.rounds) {
    EXPECT_EQ(x.delivered_fraction, 1.0);
  }
}

TEST(UdpPushBench, RoundWithoutProgressFailsWithTheCause) {
  UdpPushBenchOptions o = SmallBench();
  o.iterations = 2;
  o.loss = "bernoulli:1";  // every frame lost: no chunk ever arrives
  o.round_timeout_ms = 300;
  const auto t0 = Clock::now();
  const UdpPushBenchResult r = RunUdpPushBench(o);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.error.find("made no progress"), std::string::npos) << r.error;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20));
  EXPECT_TRUE(r.rounds.empty());
}

TEST(UdpPushBench, BadOptionsAreRejected) {
  UdpPushBenchOptions o = SmallBench();
  o.mtu = 100;
  UdpPushBenchResult r = RunUdpPushBench(o);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.error.find("mtu"), std::string::npos) << r.error;
  o = SmallBench();
  o.loss = "sometimes";
  r = RunUdpPushBench(o);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.error.find("loss"), std::string::npos) << r.error;
  o = SmallBench();
  o.size_mb = -1;
  EXPECT_EQ(RunUdpPushBench(o).exit_code, 2);
}

TEST(UdpPushBench, JsonReport) {
  UdpPushBenchOptions o = SmallBench();
  UdpPushBenchResult r;
  r.size_bytes = 1048576;
  r.chunks = 723;
  r.rounds.push_back(UdpRoundRecord{0, 12.5, 723, 1, 1.0});
  r.counters["rx_frames"] = 723;
  const std::string j = FormatUdpBenchJson(o, r);
  EXPECT_NE(j.find("\"transport\":\"kernel-udp\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"rounds\":[{\"iteration\":0,\"latency_us\":12.5,"
                   "\"packets_sent\":723,\"passes\":1,"
                   "\"delivered_fraction\":1}]"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"rx_frames\":723"), std::string::npos) << j;
  EXPECT_NE(j.find("\"socket_drops\":0"), std::string::npos) << j;
}

}  // namespace
}  // namespace dblp

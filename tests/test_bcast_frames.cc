// The broadcast's shared-payload frames (src/dpdk/server/bcast_frames.h)
// against the copied ones: linearised, every frame is the copied frame byte for
// byte (headers, checksums, tag), for every checksum path and tag mode; the
// chains free back to the pool and never write the mean; SendSharedChunks
// sends what ChunkTransmitter::Send sends, over net_ring0 (which passes
// mbufs through without copying, so the chains come back as sent).
//
// Custom main: the EAL runs with --no-huge on its own --file-prefix.
#include <gtest/gtest.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dblp/wire/chunking.h"
#include "eal_test_env.h"
#include "port/datapath.h"
#include "port/frame_builder.h"
#include "port/port.h"
#include "runtime/eal_app.h"
#include "server/bcast_frames.h"

namespace dblp {
namespace {

constexpr uint16_t kPort = 0;
rte_mempool* g_pool = nullptr;
PortCaps g_caps;

Endpoint Ep(uint32_t ip, uint16_t port, uint8_t mac_last) {
  Endpoint e;
  e.mac.addr_bytes[0] = 0x02;
  e.mac.addr_bytes[5] = mac_last;
  e.ipv4 = ip;
  e.udp_port = port;
  return e;
}

// The checksum paths a port may take.
enum class Sums { kSoftware, kSoftwareTwoPass, kZero, kOffload };

PortCaps CapsFor(Sums s) {
  PortCaps c = g_caps;
  c.tx_ipv4_cksum_offload = s == Sums::kOffload;
  c.tx_udp_cksum_offload = s == Sums::kOffload;
  c.udp_cksum_zero = s == Sums::kZero;
  c.fused_checksum = s != Sums::kSoftwareTwoPass;
  return c;
}

FrameTemplate Template(Sums s, FrameAuthMode mode, uint8_t worker) {
  FrameTemplate t(Ep(0x0A000001, 47000, 1),
                  Ep(0x0A000010 + worker, 47001 + worker, worker), CapsFor(s));
  FrameKey key;
  key.mode = mode;
  key.key.fill(static_cast<uint8_t>(0x40 + worker));  // a key per worker
  if (mode != FrameAuthMode::kNone) t.set_auth(key);
  return t;
}

std::vector<uint8_t> Linear(const rte_mbuf* m) {
  std::vector<uint8_t> out(rte_pktmbuf_pkt_len(m));
  const void* p = rte_pktmbuf_read(m, 0, out.size(), out.data());
  EXPECT_NE(p, nullptr);
  if (p != nullptr && p != out.data()) std::memcpy(out.data(), p, out.size());
  return out;
}

// A mean of `floats` floats with a recognisable pattern.
std::vector<float> Mean(size_t floats) {
  std::vector<float> v(floats);
  for (size_t i = 0; i < floats; ++i) v[i] = static_cast<float>(i) * 0.25f - 7;
  return v;
}

DataHeader Proto() {
  DataHeader h;
  h.type = FrameType::kBroadcast;
  h.session = 0x5E55;
  h.sender_rank = 0xFFFF;
  h.round = 77;
  return h;
}

struct Case {
  Sums sums;
  FrameAuthMode mode;
};

class SharedFrames : public ::testing::TestWithParam<Case> {};

TEST_P(SharedFrames, LinearisedEqualCopiedFramesForEveryWorker) {
  const Case c = GetParam();
  const ChunkLayout layout(1452 * 5 + 400, 1452);  // a short last chunk
  std::vector<float> mean = Mean(layout.total_bytes() / sizeof(float));
  const auto* buf = reinterpret_cast<const uint8_t*>(mean.data());
  const std::vector<float> before = mean;
  const unsigned avail = rte_mempool_avail_count(g_pool);
  for (uint8_t w = 0; w < 3; ++w) {
    // Same endpoints and key: the copied and the shared template number
    // their IP ids alike.
    FrameTemplate copied = Template(c.sums, c.mode, w);
    FrameTemplate shared = Template(c.sums, c.mode, w);
    for (uint32_t seq = 0; seq < layout.num_chunks(); ++seq) {
      DataHeader h = Proto();
      h.seq = seq;
      h.payload_len = static_cast<uint16_t>(layout.Length(seq));
      rte_mbuf* one = rte_pktmbuf_alloc(g_pool);
      ASSERT_NE(one, nullptr);
      ASSERT_TRUE(copied.Build(one, h, buf + layout.Offset(seq)));
      rte_mbuf* segs[3];
      ASSERT_EQ(rte_pktmbuf_alloc_bulk(g_pool, segs, 3), 0);
      ASSERT_TRUE(BuildSharedFrame(shared, h, buf + layout.Offset(seq),
                                   RTE_BAD_IOVA, segs));
      const bool tagged = c.mode != FrameAuthMode::kNone;
      EXPECT_EQ(segs[0]->nb_segs, tagged ? 3 : 2);
      EXPECT_TRUE(RTE_MBUF_HAS_EXTBUF(segs[0]->next));
      EXPECT_EQ(rte_pktmbuf_mtod(segs[0]->next, const uint8_t*),
                buf + layout.Offset(seq))
          << "the payload segment points into the mean, not at a copy";
      EXPECT_EQ(segs[0]->ol_flags, one->ol_flags);
      EXPECT_EQ(Linear(segs[0]), Linear(one))
          << "worker " << int(w) << " chunk " << seq;
      if (!tagged) rte_pktmbuf_free(segs[2]);
      rte_pktmbuf_free(segs[0]);
      rte_pktmbuf_free(one);
    }
  }
  EXPECT_EQ(rte_mempool_avail_count(g_pool), avail)
      << "every segment went back to the pool";
  EXPECT_EQ(mean, before) << "the mean was written";
}

INSTANTIATE_TEST_SUITE_P(
    SumsAndTags, SharedFrames,
    ::testing::Values(Case{Sums::kSoftware, FrameAuthMode::kNone},
                      Case{Sums::kSoftware, FrameAuthMode::kFull},
                      Case{Sums::kSoftwareTwoPass, FrameAuthMode::kFull},
                      Case{Sums::kSoftware, FrameAuthMode::kHeader},
                      Case{Sums::kZero, FrameAuthMode::kNone},
                      Case{Sums::kZero, FrameAuthMode::kFull},
                      Case{Sums::kOffload, FrameAuthMode::kNone},
                      Case{Sums::kOffload, FrameAuthMode::kFull}));

// The burst loop: what comes back from net_ring0 (mbufs passed through) is
// what ChunkTransmitter::Send's copied frames carry, in the same order.
TEST(SharedFramesSend, SendSharedChunksSendsWhatTheCopySends) {
  const ChunkLayout layout(1452 * 100 + 8, 1452);
  std::vector<float> mean = Mean(layout.total_bytes() / sizeof(float));
  const auto* buf = reinterpret_cast<const uint8_t*>(mean.data());
  std::vector<uint32_t> seqs;
  for (uint32_t i = 0; i < layout.num_chunks(); ++i) {
    seqs.push_back((i * 37) % layout.num_chunks());  // any order
  }
  DatapathCounters counters;
  ChunkTransmitter tx;
  tx.port = kPort;
  tx.pool = g_pool;
  tx.counters = &counters;
  const auto run = [&](bool shared) {
    FrameTemplate t = Template(Sums::kSoftware, FrameAuthMode::kFull, 2);
    BcastFrames frames{&tx,
                       &t,
                       buf,
                       &layout,
                       shared ? BcastFrameMode::kShared : BcastFrameMode::kCopy,
                       RTE_BAD_IOVA};
    std::vector<std::vector<uint8_t>> got;
    uint32_t sent = 0;
    while (sent < seqs.size()) {
      const uint32_t n = std::min<uint32_t>(40, seqs.size() - sent);
      const uint32_t k = frames.Send(Proto(), seqs.data() + sent, n);
      EXPECT_EQ(k, n);
      sent += k;
      rte_mbuf* back[64];
      uint16_t r;
      while ((r = rte_eth_rx_burst(kPort, 0, back, 64)) != 0) {
        for (uint16_t i = 0; i < r; ++i) {
          EXPECT_EQ(back[i]->nb_segs, shared ? 3 : 1);
          got.push_back(Linear(back[i]));
          rte_pktmbuf_free(back[i]);
        }
      }
      if (k == 0) break;
    }
    return got;
  };
  const unsigned avail = rte_mempool_avail_count(g_pool);
  const auto copied = run(false);
  const auto shared = run(true);
  ASSERT_EQ(copied.size(), seqs.size());
  ASSERT_EQ(shared.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(shared[i], copied[i]) << "frame " << i;
  }
  EXPECT_EQ(rte_mempool_avail_count(g_pool), avail);
}

TEST(SharedFramesMode, FlagValuesAndAuto) {
  bool is_auto = false;
  BcastFrameMode m = BcastFrameMode::kShared;
  EXPECT_TRUE(ParseBcastFrameMode("auto", &is_auto, &m));
  EXPECT_TRUE(is_auto);
  EXPECT_TRUE(ParseBcastFrameMode("shared", &is_auto, &m));
  EXPECT_FALSE(is_auto);
  EXPECT_EQ(m, BcastFrameMode::kShared);
  EXPECT_TRUE(ParseBcastFrameMode("copy", &is_auto, &m));
  EXPECT_EQ(m, BcastFrameMode::kCopy);
  EXPECT_FALSE(ParseBcastFrameMode("zero-copy", &is_auto, &m));
  EXPECT_EQ(AutoBcastFrameMode("net_memif", true), BcastFrameMode::kCopy);
  EXPECT_EQ(AutoBcastFrameMode("net_ice", false), BcastFrameMode::kCopy);
  EXPECT_EQ(AutoBcastFrameMode("net_ice", true), BcastFrameMode::kShared);
  EXPECT_EQ(AutoBcastFrameMode("net_ring", true), BcastFrameMode::kCopy);
}

}  // namespace
}  // namespace dblp

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  dblp::testing_env::InitTestEal(argv[0], "bcast", {"--vdev=net_ring0"});

  dblp::PortOptions opts;
  opts.port_id = dblp::kPort;
  opts.nb_rxd = 512;
  opts.nb_txd = 512;
  dblp::g_pool =
      dblp::CreatePoolOrDie("bcast_pool", dblp::MbufsNeeded(opts, 32, 1024),
                            1500, static_cast<int>(rte_socket_id()));
  dblp::g_caps = dblp::SetupPortOrDie(opts, dblp::g_pool);

  const int rc = RUN_ALL_TESTS();
  rte_eth_dev_stop(dblp::kPort);
  rte_eth_dev_close(dblp::kPort);
  rte_eal_cleanup();
  return rc;
}

// dblp-sendframes: sends `--count` DBLP data frames, built by FrameTemplate,
// on port 0 and exits. A tool for frame-validity tests (tests/
// veth_frames_test.sh) and for eyeballing frames with tcpdump.
//
//   dblp-sendframes [EAL options] -- --dst_mac=02:00:00:00:00:02
//       --dst_ip=10.9.0.2 --src_ip=10.9.0.1 --dst_port=9100 --count=64
//       --payload_floats=363 --checksum=auto
//
// Frame k carries seq k and payload floats k * 1000 + i (i = 0, 1, ...), so a
// receiver can check every byte; the last frame may be shorter
// (--last_payload_floats).
#include <gflags/gflags.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dblp/base/log.h"
#include "dblp/base/version.h"
#include "dblp/wire/wire.h"
#include "flag_checks.h"
#include "port/frame_builder.h"
#include "port/port.h"
#include "runtime/eal_app.h"

DEFINE_string(dst_mac, "", "destination MAC (aa:bb:cc:dd:ee:ff), required");
DEFINE_string(dst_ip, "", "destination IPv4, required");
DEFINE_string(src_ip, "", "source IPv4, required");
DEFINE_uint32(dst_port, 9100, "destination UDP port");
DEFINE_uint32(src_port, 9200, "source UDP port");
DEFINE_uint32(count, 16, "frames to send");
DEFINE_uint32(payload_floats, 363,
              "floats per frame (363 fills a 1500-byte MTU)");
DEFINE_int32(last_payload_floats, -1,
             "floats in the last frame (-1: same as --payload_floats)");
DEFINE_string(checksum, "auto", "auto|sw|none (none: UDP checksum 0)");
DEFINE_uint32(mtu, 1500, "IP MTU, validated against the device");
DEFINE_uint32(port, 0, "DPDK port id");
DEFINE_uint32(session, 0x5EED0001u, "DBLP session id");
DEFINE_uint32(rank, 1, "DBLP sender rank");
DEFINE_uint32(round, 0xFFFFFFFEu, "DBLP round counter of the frames");
DEFINE_uint32(gap_us, 0, "sleep between frames (pacing), microseconds");
DEFINE_bool(corrupt_udp_cksum, false,
            "for tests: flip a bit of every software UDP checksum, so a "
            "receiver that verifies checksums must drop the frames");
DEFINE_double(timeout_s, 10.0, "give up if the device refuses frames longer");

namespace dblp {
namespace {

constexpr uint16_t kBurst = 32;

int Run() {
  Endpoint src, dst;
  if (!ParseMac(FLAGS_dst_mac, dst.mac.addr_bytes)) {
    Die("bad --dst_mac='" + FLAGS_dst_mac + "'",
        "give the peer's MAC as aa:bb:cc:dd:ee:ff (ip link show <if>)");
  }
  if (!ParseIpv4(FLAGS_dst_ip, &dst.ipv4)) {
    Die("bad --dst_ip='" + FLAGS_dst_ip + "'", "give a dotted quad a.b.c.d");
  }
  if (!ParseIpv4(FLAGS_src_ip, &src.ipv4)) {
    Die("bad --src_ip='" + FLAGS_src_ip + "'", "give a dotted quad a.b.c.d");
  }
  if (FLAGS_dst_port == 0 || FLAGS_dst_port > 65535 || FLAGS_src_port == 0 ||
      FLAGS_src_port > 65535) {
    Die("UDP ports must be 1..65535", "fix --dst_port/--src_port");
  }
  if (FLAGS_rank > 65535) Die("--rank must fit 16 bits", "use 0..65535");
  dst.udp_port = static_cast<uint16_t>(FLAGS_dst_port);
  src.udp_port = static_cast<uint16_t>(FLAGS_src_port);

  const uint32_t max_floats = (FLAGS_mtu - 28 - kDataHeaderBytes) / 4;
  const uint32_t last_floats = FLAGS_last_payload_floats < 0
                                   ? FLAGS_payload_floats
                                   : static_cast<uint32_t>(
                                         FLAGS_last_payload_floats);
  if (FLAGS_mtu < kMinMtu || FLAGS_payload_floats > max_floats ||
      last_floats > max_floats) {
    Die("--payload_floats=" + std::to_string(FLAGS_payload_floats) +
            " / --last_payload_floats=" + std::to_string(last_floats) +
            " do not fit MTU " + std::to_string(FLAGS_mtu),
        "use at most " + std::to_string(max_floats) +
            " floats per frame, or a larger --mtu");
  }
  if (FLAGS_count > 16000) {
    Die("--count above 16000", "the payload pattern needs seq*1000 < 2^24");
  }

  if (FLAGS_corrupt_udp_cksum && FLAGS_checksum != "sw") {
    Die("--corrupt_udp_cksum needs software checksums",
        "add --checksum=sw");
  }

  PortOptions opts;
  opts.port_id = static_cast<uint16_t>(FLAGS_port);
  opts.nb_rxd = 256;
  opts.nb_txd = 256;
  opts.mtu = FLAGS_mtu;
  opts.checksum = FLAGS_checksum;
  rte_mempool* pool = CreatePoolOrDie(
      "sendframes_pool", MbufsNeeded(opts, kBurst, kBurst), FLAGS_mtu,
      static_cast<int>(rte_socket_id()));
  const PortCaps caps = SetupPortOrDie(opts, pool);
  src.mac = caps.mac;
  std::printf("dblp-sendframes: port %u: %s\n", opts.port_id,
              DescribePortCaps(caps).c_str());
  std::printf("dblp-sendframes: %s:%u (%s) -> %s:%u (%s), %u frames\n",
              FormatIpv4(src.ipv4).c_str(), src.udp_port,
              FormatMac(src.mac.addr_bytes).c_str(),
              FormatIpv4(dst.ipv4).c_str(), dst.udp_port,
              FormatMac(dst.mac.addr_bytes).c_str(), FLAGS_count);

  FrameTemplate tmpl(src, dst, caps);
  std::vector<float> floats(max_floats);
  const uint64_t hz = rte_get_timer_hz();
  const uint64_t deadline =
      rte_get_timer_cycles() + static_cast<uint64_t>(FLAGS_timeout_s *
                                                     static_cast<double>(hz));
  uint32_t sent = 0;
  uint64_t bytes = 0;
  rte_mbuf* burst[kBurst];
  uint16_t n = 0;
  bool timed_out = false;
  auto flush = [&]() {
    uint16_t done = 0;
    while (done < n) {
      done += rte_eth_tx_burst(opts.port_id, 0, burst + done,
                               static_cast<uint16_t>(n - done));
      if (done < n && rte_get_timer_cycles() > deadline) {
        rte_pktmbuf_free_bulk(burst + done, n - done);
        timed_out = true;
        break;
      }
    }
    sent += done;
    n = 0;
  };
  for (uint32_t k = 0; k < FLAGS_count && !timed_out; ++k) {
    const uint32_t nf = (k + 1 == FLAGS_count) ? last_floats
                                               : FLAGS_payload_floats;
    for (uint32_t i = 0; i < nf; ++i) {
      floats[i] = static_cast<float>(k * 1000 + i);
    }
    DataHeader h;
    h.type = FrameType::kPush;
    h.session = FLAGS_session;
    h.sender_rank = static_cast<uint16_t>(FLAGS_rank);
    h.payload_len = static_cast<uint16_t>(nf * 4);
    h.round = FLAGS_round;
    h.seq = k;
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (m == nullptr) {
      Die("mbuf pool exhausted", "the pool is sized by MbufsNeeded(); report "
                                 "this as a bug");
    }
    if (!tmpl.Build(m, h, reinterpret_cast<const uint8_t*>(floats.data()))) {
      Die("frame does not fit an mbuf", "use a smaller --payload_floats");
    }
    if (FLAGS_corrupt_udp_cksum) {
      auto* udp = rte_pktmbuf_mtod_offset(
          m, rte_udp_hdr*, sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr));
      const uint16_t one = rte_cpu_to_be_16(1);
      udp->dgram_cksum ^= udp->dgram_cksum == one ? rte_cpu_to_be_16(2) : one;
    }
    bytes += rte_pktmbuf_pkt_len(m);
    burst[n++] = m;
    if (n == kBurst || FLAGS_gap_us != 0) flush();
    if (FLAGS_gap_us != 0) rte_delay_us_sleep(FLAGS_gap_us);
  }
  flush();

  rte_eth_stats st{};
  rte_eth_stats_get(opts.port_id, &st);
  std::printf(
      "dblp-sendframes: sent %u/%u frames (%llu bytes); device opackets %llu "
      "oerrors %llu\n",
      sent, FLAGS_count, static_cast<unsigned long long>(bytes),
      static_cast<unsigned long long>(st.opackets),
      static_cast<unsigned long long>(st.oerrors));
  if (const std::string err = StopAndClosePorts({opts.port_id}); !err.empty()) {
    DBLP_LOG(Warning, "dblp-sendframes: %s", err.c_str());
  }
  if (timed_out) {
    DBLP_LOG(Error,
                 "dblp-sendframes: the device refused frames for %.1f s. "
                 "Try: check the link is up, raise --timeout_s",
                 FLAGS_timeout_s);
    return 1;
  }
  return sent == FLAGS_count && st.oerrors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dblp

int main(int argc, char** argv) {
  const int eal_args = dblp::InitEalOrDie(argc, argv);
  argc -= eal_args;
  argv += eal_args;
  gflags::SetUsageMessage(
      "[EAL options] -- --dst_mac=.. --dst_ip=.. --src_ip=.. [--count=N "
      "--payload_floats=N --checksum=auto|sw|none]");
  gflags::SetVersionString(dblp::Version());
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  dblp::CheckFlagsOrDie();  // a test tool: after the EAL, which it needs first
  // No rte_eal_cleanup(), as in the other apps (eal_cleanup.h).
  return dblp::Run();
}

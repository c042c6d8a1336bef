// dblp-floor: the data movement a push round cannot avoid, timed on one
// core without DPDK or a link, as a floor for dblp-bench's DBLP rounds
// (testpmd's txonly -> rxonly moves no payload, so it is the link's limit,
// not the push's).
//   copy: every chunk of the gradient, in the send order of the apps, into
//         frame-sized buffers after the Ethernet/IPv4/UDP/DBLP headers: the
//         worker's frame build without the headers;
//   add:  every chunk, in the same order, from such a frame into a sum
//         buffer of the gradient's size with the server's AddFloats; and
//         again with the server's check of each chunk first (ScanFloats:
//         NaN, infinity, the chunk's norm; lib/dblp/policy/mean_reducer.h),
//         reported as checked_add.
// Each is timed over --rounds rounds after one warm-up round.
//
// Exit codes: 0 done, 2 bad flags.
#include <gflags/gflags.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dblp/base/log.h"
#include "dblp/base/version.h"
#include "dblp/round/send_order.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/float_ops.h"
#include "dblp/wire/wire.h"
#include "flag_checks.h"

DEFINE_double(size_mb, 1,
              "gradient size in MiB (rounded down to whole float32 values)");
DEFINE_uint32(mtu, 1500, "IP MTU of the data frames (576..9216)");
DEFINE_uint32(rounds, 10, "measured rounds, after one warm-up round");
DEFINE_int32(cpu, -1, "CPU to pin this process to (-1: none)");
DEFINE_string(measure, "both", "copy | add | both");
DEFINE_string(send_order, "permuted",
              "sequential | rotating | permuted | blocked (as the apps)");
DEFINE_uint64(seed, 1, "job seed of the send order (the apps' --seed)");
DEFINE_uint32(ring, 2048, "frame buffers the chunks cycle through");
DEFINE_bool(prefetch, true, "prefetch the next chunk, as the apps' "
            "--prefetch does (the gradient on copy, the sum on add)");
DEFINE_bool(json, false, "print only the JSON report on stdout");
DEFINE_string(out, "", "also write the JSON report here");

namespace {

using Clock = std::chrono::steady_clock;

// Where a chunk's payload starts in a data frame.
constexpr uint32_t kPayloadOffset = dblp::kEthernetHeaderBytes +
                                    dblp::kIpv4HeaderBytes +
                                    dblp::kUdpHeaderBytes +
                                    dblp::kDataHeaderBytes;

using dblp::FlagError;

// gflags ends an unknown flag or an unparsable value with exit 1; check
// them first so every bad flag exits 2 naming it, like the value checks.
void PrecheckArgs(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') {
      FlagError("unexpected argument " + arg + " (flags are --name=value)");
    }
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = body.substr(0, eq);
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      if (eq == std::string::npos && name.rfind("no", 0) == 0 &&
          gflags::GetCommandLineFlagInfo(name.c_str() + 2, &info) &&
          info.type == "bool") {
        continue;
      }
      FlagError("unknown flag --" + name + " (see --help)");
    }
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (info.type == "bool") {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      FlagError("--" + name + " needs a value");
    }
    // Validates by setting; ParseCommandLineFlags sets it again.
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
      FlagError("--" + name + "=" + value + ": not a valid " + info.type);
    }
  }
}

void CheckFlags() {
  if (!(FLAGS_size_mb > 0) || !std::isfinite(FLAGS_size_mb) ||
      FLAGS_size_mb > 4096) {
    FlagError("--size_mb must be in (0, 4096], e.g. --size_mb=25");
  }
  if (FLAGS_mtu < dblp::kMinMtu || FLAGS_mtu > dblp::kMaxMtu) {
    FlagError("--mtu=" + std::to_string(FLAGS_mtu) + " is outside " +
              std::to_string(dblp::kMinMtu) + ".." +
              std::to_string(dblp::kMaxMtu) + ", e.g. --mtu=1500");
  }
  if (FLAGS_rounds == 0 || FLAGS_rounds > 100000) {
    FlagError("--rounds must be in 1..100000, e.g. --rounds=10");
  }
  if (FLAGS_measure != "copy" && FLAGS_measure != "add" &&
      FLAGS_measure != "both") {
    FlagError("--measure=" + FLAGS_measure + ": use copy, add or both");
  }
  try {
    dblp::ParseSendOrder(FLAGS_send_order);
  } catch (const std::exception& e) {
    FlagError(std::string("--send_order: ") + e.what());
  }
  if (FLAGS_ring == 0 || FLAGS_ring > (1u << 20)) {
    FlagError("--ring must be in 1..1048576, e.g. --ring=2048");
  }
  if (FLAGS_cpu < -1 || FLAGS_cpu >= CPU_SETSIZE) {
    FlagError("--cpu: a CPU number, or -1 for none");
  }
}

void PinOrDie(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    FlagError("--cpu=" + std::to_string(cpu) + ": cannot pin to it (" +
              std::strerror(errno) + "); use a CPU this process may run on, "
              "or -1");
  }
}

// One prefetch per cache line of [p, p + n), as the apps' PrefetchBytes
// (copy: read) and the reducer's Prefetch (add: write) do.
template <int kWrite>
inline void PrefetchBytes(const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  for (size_t off = 0; off < n; off += 64) {
    __builtin_prefetch(c + off, kWrite, 3);
  }
}

// Keeps the compiler from dropping stores that nothing reads back.
inline void ClobberMemory() { asm volatile("" : : : "memory"); }

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Stats {
  std::vector<double> round_ms;
  double median_ms = 0;
  double min_ms = 0;
  double chunks_per_s = 0;
};

Stats Summarize(std::vector<double> ms, uint32_t chunks) {
  Stats s;
  s.round_ms = ms;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  s.median_ms = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  s.min_ms = ms.front();
  s.chunks_per_s = s.median_ms > 0 ? chunks / (s.median_ms / 1e3) : 0;
  return s;
}

class Floor {
 public:
  Floor(uint64_t size_bytes, uint32_t mtu, uint32_t ring,
        dblp::SendOrderKind kind, uint64_t seed, bool prefetch)
      : prefetch_(prefetch),
        layout_(dblp::ChunkLayout::ForMtu(size_bytes, mtu)),
        // Cache-line-aligned slots, as a mempool lays out its buffers.
        stride_((mtu + dblp::kEthernetHeaderBytes + 63) / 64 * 64),
        ring_(ring),
        frames_(static_cast<size_t>(stride_) * ring + 64),
        grad_(size_bytes / sizeof(float)),
        sum_(grad_.size()),
        // One worker (rank 0 of 1) with the job's seed: dblp-bench's job.
        order_(kind, 0, 1, seed) {
    // Finite, normal values, so no denormal slows the add.
    for (size_t i = 0; i < grad_.size(); ++i) {
      grad_[i] = 0.001f * static_cast<float>(i % 1000 + 1);
    }
    // Every slot holds a real chunk for the add to read.
    for (uint32_t k = 0; k < ring_; ++k) {
      const uint32_t seq = k % layout_.num_chunks();
      std::memcpy(Payload(k), GradBytes() + layout_.Offset(seq),
                  layout_.Length(seq));
    }
  }

  const dblp::ChunkLayout& layout() const { return layout_; }

  // The round's first-pass order, as the worker fills it before a round.
  void Order(uint64_t it) {
    order_.Fill(dblp::PushRound(it), layout_.num_chunks(), seqs_);
  }

  double CopyRound() {
    const auto t0 = Clock::now();
    uint32_t slot = 0;
    const size_t n = seqs_.size();
    if (prefetch_) PrefetchChunk<0>(GradBytes(), seqs_[0]);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t seq = seqs_[i];
      // A permuted order's next chunk is too far for the hardware
      // prefetcher to guess.
      if (prefetch_ && i + 1 < n) PrefetchChunk<0>(GradBytes(), seqs_[i + 1]);
      std::memcpy(Payload(slot), GradBytes() + layout_.Offset(seq),
                  layout_.Length(seq));
      if (++slot == ring_) slot = 0;
    }
    ClobberMemory();
    return MsSince(t0);
  }

  // `check`: ScanFloats each chunk before adding it, as the server does.
  double AddRound(bool check) {
    const auto t0 = Clock::now();
    double squares = 0;
    uint32_t slot = 0;
    const size_t n = seqs_.size();
    const auto* sum = reinterpret_cast<const uint8_t*>(sum_.data());
    for (size_t i = 0; i < n; ++i) {
      const uint32_t seq = seqs_[i];
      // The server prefetches the next frame's sum slice the same way.
      if (prefetch_ && i + 1 < n) PrefetchChunk<1>(sum, seqs_[i + 1]);
      const size_t floats = layout_.Length(seq) / sizeof(float);
      bool finite = true;
      if (check) {
        const dblp::ChunkScan c = dblp::ScanFloats(Payload(slot), floats);
        finite = c.max_abs_bits < dblp::kNonFiniteBits;
        squares += c.sum_squares;
      }
      if (finite) {
        dblp::AddFloats(sum_.data() + layout_.Offset(seq) / sizeof(float),
                        Payload(slot), floats);
      }
      if (++slot == ring_) slot = 0;
    }
    ClobberMemory();
    norms_ += squares;  // kept, so the scan is not optimised away
    return MsSince(t0);
  }

  // The server's first contribution of a round, before the adds.
  void StoreAll() {
    uint32_t slot = 0;
    for (const uint32_t seq : seqs_) {
      dblp::StoreFloats(sum_.data() + layout_.Offset(seq) / sizeof(float),
                        Payload(slot), layout_.Length(seq) / sizeof(float));
      if (++slot == ring_) slot = 0;
    }
  }

 private:
  template <int kWrite>
  void PrefetchChunk(const uint8_t* base, uint32_t seq) const {
    PrefetchBytes<kWrite>(base + layout_.Offset(seq), layout_.Length(seq));
  }
  uint8_t* Payload(uint32_t slot) {
    return Aligned() + static_cast<size_t>(slot) * stride_ + kPayloadOffset;
  }
  uint8_t* Aligned() {
    const auto p = reinterpret_cast<uintptr_t>(frames_.data());
    return frames_.data() + ((64 - p % 64) % 64);
  }
  const uint8_t* GradBytes() const {
    return reinterpret_cast<const uint8_t*>(grad_.data());
  }

  bool prefetch_;
  dblp::ChunkLayout layout_;
  uint32_t stride_;
  uint32_t ring_;
  std::vector<uint8_t> frames_;
  std::vector<float> grad_;
  std::vector<float> sum_;
  dblp::SendOrder order_;
  std::vector<uint32_t> seqs_;
  double norms_ = 0;
};

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string StatsJson(const Stats& s) {
  std::ostringstream o;
  o << "{\"median_ms\":" << Num(s.median_ms) << ",\"min_ms\":"
    << Num(s.min_ms) << ",\"chunks_per_s\":" << Num(s.chunks_per_s)
    << ",\"round_ms\":[";
  for (size_t i = 0; i < s.round_ms.size(); ++i) {
    o << (i ? "," : "") << Num(s.round_ms[i]);
  }
  o << "]}";
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "The data movement of a push round on one core, no DPDK: copying "
      "every chunk into frames, adding every chunk into a sum.\n"
      "  dblp-floor --size_mb=25 --rounds=10 [--cpu=1] [--measure=copy] "
      "[--json | --out=floor.json]");
  PrecheckArgs(argc, argv);
  gflags::SetVersionString(dblp::Version());
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  dblp::CheckFlagsOrDie();
  CheckFlags();
  PinOrDie(FLAGS_cpu);

  const uint64_t size_bytes = std::max<uint64_t>(
      4, static_cast<uint64_t>(FLAGS_size_mb * 1048576.0) / 4 * 4);
  Floor floor(size_bytes, FLAGS_mtu, FLAGS_ring,
              dblp::ParseSendOrder(FLAGS_send_order), FLAGS_seed,
              FLAGS_prefetch);
  const uint32_t chunks = floor.layout().num_chunks();
  const bool copy = FLAGS_measure != "add";
  const bool add = FLAGS_measure != "copy";

  // Iteration 0 is the warm-up, as dblp-bench drops the apps' first round.
  std::vector<double> copy_ms, add_ms, checked_ms;
  if (copy) {
    for (uint32_t it = 0; it <= FLAGS_rounds; ++it) {
      floor.Order(it);
      const double ms = floor.CopyRound();
      if (it > 0) copy_ms.push_back(ms);
    }
  }
  if (add) {
    floor.Order(0);
    floor.StoreAll();
    for (uint32_t it = 0; it <= FLAGS_rounds; ++it) {
      floor.Order(it);
      const double ms = floor.AddRound(false);
      if (it > 0) add_ms.push_back(ms);
    }
    floor.StoreAll();
    for (uint32_t it = 0; it <= FLAGS_rounds; ++it) {
      floor.Order(it);
      const double ms = floor.AddRound(true);
      if (it > 0) checked_ms.push_back(ms);
    }
  }

  std::ostringstream j;
  j << "{\"tool\":\"dblp-floor\",\"size_bytes\":" << size_bytes
    << ",\"chunks\":" << chunks
    << ",\"chunk_payload\":" << floor.layout().chunk_payload()
    << ",\"mtu\":" << FLAGS_mtu << ",\"payload_offset\":" << kPayloadOffset
    << ",\"ring\":" << FLAGS_ring << ",\"send_order\":\"" << FLAGS_send_order
    << "\",\"seed\":" << FLAGS_seed
    << ",\"prefetch\":" << (FLAGS_prefetch ? "true" : "false")
    << ",\"cpu\":" << FLAGS_cpu
    << ",\"rounds\":" << FLAGS_rounds;
  Stats cs, as, ks;
  if (copy) {
    cs = Summarize(copy_ms, chunks);
    j << ",\"copy\":" << StatsJson(cs);
  }
  if (add) {
    as = Summarize(add_ms, chunks);
    j << ",\"add\":" << StatsJson(as);
    ks = Summarize(checked_ms, chunks);
    j << ",\"checked_add\":" << StatsJson(ks);
  }
  j << "}\n";

  if (FLAGS_json) {
    std::fputs(j.str().c_str(), stdout);
  } else {
    std::printf("dblp-floor: %llu bytes, %u chunks of %u B at MTU %u, %s "
                "order%s, cpu %d, %u rounds after a warm-up\n",
                static_cast<unsigned long long>(size_bytes), chunks,
                floor.layout().chunk_payload(), FLAGS_mtu,
                FLAGS_send_order.c_str(),
                FLAGS_prefetch ? ", prefetch" : "", FLAGS_cpu, FLAGS_rounds);
    if (copy) {
      std::printf("copy: median %.3f ms, min %.3f ms, %.2f Mchunks/s\n",
                  cs.median_ms, cs.min_ms, cs.chunks_per_s / 1e6);
    }
    if (add) {
      std::printf("add:  median %.3f ms, min %.3f ms, %.2f Mchunks/s\n",
                  as.median_ms, as.min_ms, as.chunks_per_s / 1e6);
      std::printf(
          "checked add: median %.3f ms, min %.3f ms, %.2f "
          "Mchunks/s\n",
          ks.median_ms, ks.min_ms, ks.chunks_per_s / 1e6);
    }
  }
  if (!FLAGS_out.empty()) {
    std::ofstream f(FLAGS_out);
    f << j.str();
    if (!f.good()) {
      FlagError("cannot write --out=" + FLAGS_out +
                ": check the directory exists and is writable");
    }
  }
  return 0;
}

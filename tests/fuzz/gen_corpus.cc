// Writes the fuzzers' seed corpora: gen_corpus <dir> creates <dir>/wire,
// <dir>/control and <dir>/receiver with a few valid (and a few nearly
// valid) inputs each, in the input formats the targets read. Deterministic,
// so re-running it over tests/fuzz/corpus changes nothing unless the wire
// or control encoding changed (then commit the new seeds).
//
//   ninja -C build-fuzz tests/fuzz/gen_corpus
//   build-fuzz/tests/fuzz/gen_corpus tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "fuzz_input.h"

namespace dblp::fuzz {
namespace {

namespace fs = std::filesystem;

void Save(const fs::path& dir, const std::string& name,
          const std::vector<uint8_t>& bytes) {
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()),
          static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "gen_corpus: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

std::vector<uint8_t> Frame(const DataHeader& h) {
  std::vector<uint8_t> payload(h.payload_len);
  for (size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<uint8_t>(i * 7);
  }
  std::vector<uint8_t> out(kDataHeaderBytes + h.payload_len);
  BuildDataFrame(h, payload.data(), out.data());
  return out;
}

// ---------------------------------------------------------------------------
// fuzz_wire: u16 chunk selector, u8 + u32 total selector, frame.

std::vector<uint8_t> WireInput(uint32_t chunk, uint64_t total,
                               const std::vector<uint8_t>& frame) {
  Writer w;
  w.U16(static_cast<uint16_t>(chunk / 4 - 1));
  w.U8(static_cast<uint8_t>((total - 1) >> 32));
  w.U32(static_cast<uint32_t>(total - 1));
  w.Bytes(frame);
  return w.bytes();
}

void WireSeeds(const fs::path& dir) {
  const uint64_t total = 1 << 20;  // the README's 1 MiB gradient
  const ChunkLayout l = ChunkLayout::ForMtu(total, 1500);
  const uint32_t c = l.chunk_payload();
  const uint32_t last = l.num_chunks() - 1;
  DataHeader h{FrameType::kPush,
               0x5eed0001,
               2,
               static_cast<uint16_t>(l.Length(0)),
               40,
               0};
  Save(dir, "push_first", WireInput(c, total, Frame(h)));
  DataHeader t = h;
  t.seq = last;
  t.payload_len = static_cast<uint16_t>(l.Length(last));
  Save(dir, "push_last_short", WireInput(c, total, Frame(t)));
  DataHeader b = h;
  b.type = FrameType::kBroadcast;
  b.sender_rank = kServerRank;
  b.round = 41;
  b.seq = 7;
  std::vector<uint8_t> padded = Frame(b);
  padded.resize(padded.size() + 18, 0);  // Ethernet padding is allowed
  Save(dir, "broadcast_padded", WireInput(c, total, padded));
  DataHeader range = h;
  range.seq = l.num_chunks();
  Save(dir, "seq_out_of_range", WireInput(c, total, Frame(range)));
  DataHeader mismatch = t;
  mismatch.payload_len = static_cast<uint16_t>(c);
  Save(dir, "length_mismatch", WireInput(c, total, Frame(mismatch)));
  std::vector<uint8_t> bad = Frame(h);
  bad[2] = kWireVersion + 1;
  Save(dir, "bad_version", WireInput(c, total, bad));
  std::vector<uint8_t> cut = Frame(h);
  cut.resize(kDataHeaderBytes + 10);
  Save(dir, "length_beyond_buffer", WireInput(c, total, cut));
  cut.resize(kDataHeaderBytes - 1);
  Save(dir, "short_header", WireInput(c, total, cut));
  // Small layout: 3 chunks of 8 bytes, the last one 4.
  DataHeader s{FrameType::kPush, 1, 0, 4, 0, 2};
  Save(dir, "tiny_layout_last", WireInput(8, 20, Frame(s)));
  // More than 2^31 chunks: the layout must be refused.
  Save(dir, "layout_too_many_chunks",
       WireInput(4, uint64_t{1} << 34, Frame(s)));
}

// ---------------------------------------------------------------------------
// fuzz_control: u8 max_frame selector, u8 n, n split sizes, stream.

std::vector<uint8_t> ControlInput(uint8_t max_sel,
                                  const std::vector<uint8_t>& splits,
                                  const std::vector<uint8_t>& stream) {
  Writer w;
  w.U8(max_sel);
  w.U8(static_cast<uint8_t>(splits.size()));
  w.Bytes(splits);
  w.Bytes(stream);
  return w.bytes();
}

// One default-constructed message of every type the codec knows, so a new
// type gets a seed without touching this file.
template <size_t... I>
std::vector<ControlMessage> AllDefaults(std::index_sequence<I...>) {
  return {ControlMessage(std::in_place_index<I>)...};
}

std::vector<ControlMessage> Populated() {
  std::vector<ControlMessage> out;
  JoinMsg j;
  j.session = 0x5eed0001;
  j.worker_name = "worker-1";
  j.total_bytes = 1 << 20;
  j.mtu = 1500;
  j.layers = {{"fc1.weight", {256, 784}}, {"fc1.bias", {256}}};
  out.emplace_back(j);
  WelcomeMsg wm;
  wm.session = 0x5eed0001;
  wm.rank = 1;
  wm.num_workers = 3;
  wm.mtu = 1500;
  wm.chunk_payload = 1452;
  wm.num_chunks = 723;
  wm.total_bytes = 1 << 20;
  wm.udp_base_port = 47000;
  wm.policy = "dblp";
  wm.server_mac = {2, 0, 0, 0, 0, 1};
  wm.layers = j.layers;
  out.emplace_back(wm);
  RoundBeginMsg rb;
  rb.round = 40;
  rb.iteration = 20;
  rb.p = 0.408;
  rb.deadline_ns = 5000000;
  rb.min_fraction = 1.0;
  rb.critical = true;  // inside a critical regime: the byte set
  out.emplace_back(rb);
  BitmapMsg bm;
  bm.round = 40;
  bm.num_bits = 70;
  bm.words = {0xFFFFFFFFFFFFFFFFull, 0x2Full};
  bm.lane = 1;
  out.emplace_back(bm);
  StopMsg st;
  st.round = 40;
  st.received = 429;
  st.reason = StopReason::kComplete;
  out.emplace_back(st);
  ErrorMsg er;
  er.code = 3;
  er.text = "layout mismatch";
  out.emplace_back(er);
  return out;
}

void ControlSeeds(const fs::path& dir) {
  std::vector<ControlMessage> all = AllDefaults(
      std::make_index_sequence<std::variant_size_v<ControlMessage>>());
  std::vector<uint8_t> stream;
  for (const ControlMessage& m : all) {
    const std::vector<uint8_t> one = EncodeControl(m);
    Save(dir, std::string("default_") + ControlTypeName(m),
         ControlInput(0, {}, one));
    stream.insert(stream.end(), one.begin(), one.end());
  }
  for (const ControlMessage& m : Populated()) {
    const std::vector<uint8_t> one = EncodeControl(m);
    Save(dir, std::string("populated_") + ControlTypeName(m),
         ControlInput(0, {3}, one));
    stream.insert(stream.end(), one.begin(), one.end());
  }
  // The whole conversation, fed in pieces of 1, 5, 0 (empty Feed) and 64.
  Save(dir, "stream_split", ControlInput(0, {1, 5, 0, 64}, stream));
  // Cut mid-frame: the decoder must wait, not fail.
  std::vector<uint8_t> cut(stream.begin(), stream.end() - 3);
  Save(dir, "stream_truncated", ControlInput(0, {7}, cut));
  // Errors: above a 64-byte max_frame, unknown type, trailing byte.
  Save(dir, "frame_too_large", ControlInput(2, {}, stream));
  Save(dir, "unknown_type", ControlInput(0, {}, {0, 0, 0, 1, 0xEE}));
  std::vector<uint8_t> trailing = EncodeControl(ByeMsg{"done"});
  trailing.push_back(0);
  trailing[3] += 1;
  Save(dir, "trailing_bytes", ControlInput(0, {2}, trailing));
}

// ---------------------------------------------------------------------------
// fuzz_receiver: config, then operations (see fuzz_receiver.cc's Op).

struct Rx {
  Writer w;
  bool any_sender = true;
  // round_sel: 0 the current round, 1 the next, 2 the previous, 3 `raw`.
  void Begin(uint8_t round_sel, uint8_t p_byte, uint8_t deadline = 0,
             uint32_t raw = 0) {
    w.U8(0);
    w.U8(round_sel);
    if (round_sel == 3) w.U32(raw);
    w.U8(p_byte);
    w.U8(deadline != 0);
    if (deadline != 0) w.U8(deadline);
    w.U8(200);  // min_fraction 1.0
  }
  // A valid frame of the current round; `sel` makes fields wrong.
  void Frame(uint16_t seq, uint8_t sel = 0) {
    w.U8(1);
    w.U8(sel);
    if (sel & 0x01) w.U8(1);
    if (any_sender) w.U16(3);
    if (sel & 0x04) w.U16(9);
    w.U16(seq);
  }
  void Close() { w.U8(5); }
  void Tolerance(uint8_t p_byte) {
    w.U8(6);
    w.U8(p_byte);
    if (p_byte == 255) w.U8(0);
  }
  void Poll(uint8_t advance) {
    w.U8(7);
    w.U8(advance);
  }
  void Snapshot() { w.U8(9); }
};

void ReceiverSeeds(const fs::path& dir) {
  {  // A push round of 10 chunks at p = 0.2: STOP after 8, late, stale.
    Rx r;
    r.w.U8(0);  // push, any sender, no shard
    r.w.U32(0x5eed0001);
    r.w.U8(0);    // 4-byte chunks
    r.w.U16(39);  // 40 bytes
    r.Begin(0, 51);
    for (uint16_t s = 0; s < 8; ++s) {
      r.Frame(s);
      r.Poll(1);
    }
    r.Frame(3);  // duplicate
    r.Snapshot();
    r.Close();
    r.Frame(8);               // late
    r.Begin(1, 0);            // next round, p = 0
    r.Frame(0, 2 << 3);       // stale: previous round
    r.Frame(0, 1 << 3);       // future
    r.Frame(1, 0x01 | 0x02);  // wrong session and type
    for (uint16_t s = 0; s < 10; ++s) r.Frame(s);
    r.Poll(0);
    r.Tolerance(255);  // invalid p: must throw and change nothing
    r.Snapshot();
    Save(dir, "push_rounds", r.w.bytes());
  }
  {  // Broadcast from the server rank into shard [2, 6) of 7 chunks.
    Rx r;
    r.any_sender = false;
    r.w.U8(1 | 2 | 4);
    r.w.U32(7);
    r.w.U16(kServerRank);
    r.w.U8(1);  // 8-byte chunks, the last one 4
    r.w.U16(51);
    r.w.U16(2);
    r.w.U16(6);
    r.Begin(3, 0, 0, 41);  // round 41
    for (uint16_t s = 0; s < 7; ++s) r.Frame(s);
    r.Frame(2, 0x04);  // wrong sender
    r.Tolerance(127);
    r.Poll(0);
    r.Snapshot();
    Save(dir, "broadcast_shard", r.w.bytes());
  }
  {  // A deadline that closes the round below the threshold.
    Rx r;
    r.w.U8(0);
    r.w.U32(9);
    r.w.U8(3);     // 16-byte chunks
    r.w.U16(999);  // 1000 bytes, 63 chunks
    r.Begin(0, 0, 50);
    for (uint16_t s = 0; s < 63; s += 2) r.Frame(s);
    r.Poll(10);
    r.w.U8(8);  // SetDeadline(now + 5, 0.5)
    r.w.U8(1);
    r.w.U8(5);
    r.w.U8(100);
    r.Poll(60);
    r.Poll(1);
    Save(dir, "deadline", r.w.bytes());
  }
  for (const uint8_t mode : {8, 8 | 16}) {  // authenticated: header, full
    Rx r;
    r.w.U8(mode);
    r.w.U32(0x5eed0002);
    r.w.U8(1);     // 8-byte chunks
    r.w.U16(99);   // 100 bytes, 13 chunks
    r.w.U8(0x42);  // key seed
    r.Begin(0, 25);
    for (uint16_t s = 0; s < 13; ++s) r.Frame(s);
    r.Frame(0);  // duplicate: no MAC needed
    r.Begin(1, 25);
    r.Frame(4, 0x80);  // one byte flipped: a bad tag or a bad header
    r.w.U8(30);        // position 30: in the tag (20 + 8)
    r.w.U8(0x01);
    r.w.U8(0);
    r.Poll(1);
    Save(dir, mode == 8 ? "auth_header" : "auth_full", r.w.bytes());
  }
  {  // Raw frames: a valid header with a payload, then garbage.
    Rx r;
    r.w.U8(0);
    r.w.U32(1);
    r.w.U8(0);
    r.w.U16(15);  // 16 bytes, 4 chunks
    r.Begin(0, 0);
    const std::vector<uint8_t> f =
        dblp::fuzz::Frame(DataHeader{FrameType::kPush, 1, 0, 4, 0, 2});
    r.w.U8(4);
    r.w.U16(static_cast<uint16_t>(f.size()));
    r.w.Bytes(f);
    r.w.U8(4);
    r.w.U16(3);
    r.w.Bytes({0xDB, 0x1F, 1});
    Save(dir, "raw_frames", r.w.bytes());
  }
}

}  // namespace
}  // namespace dblp::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root(argv[1]);
  dblp::fuzz::WireSeeds(root / "wire");
  dblp::fuzz::ControlSeeds(root / "control");
  dblp::fuzz::ReceiverSeeds(root / "receiver");
  return 0;
}

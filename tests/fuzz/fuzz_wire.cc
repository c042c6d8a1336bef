// libFuzzer target: the data-frame decoder (lib/dblp/wire/wire.h) against a
// chunk layout taken from the input.
//
// Input: u16 chunk selector, u8 + u32 total-bytes selector, then the frame
// (the bytes after the UDP header). libFuzzer hands us a heap buffer of
// exactly `size` bytes, so any read past the frame is an ASan report.
//
// Promises checked (abort on violation):
//  - ChunkLayout either throws std::invalid_argument for > 2^31 chunks or
//    describes exactly total_bytes in num_chunks chunks;
//  - a decoded header re-encodes to the same 20 bytes, its payload lies in
//    the buffer, and BuildDataFrame of it decodes back to the same header;
//  - DecodeDataFrame == DecodeDataHeader + ValidateChunk, and on kOk the
//    chunk fits the layout (seq in range, exact length);
//  - every status is a named one; PeekSenderRank agrees with the decoder.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "fuzz_input.h"

namespace dblp::fuzz {
namespace {

bool Named(DecodeStatus s) {
  return static_cast<int>(s) < kNumDecodeStatus &&
         std::strcmp(DecodeStatusName(s), "unknown") != 0;
}

void CheckLayout(const ChunkLayout& l, uint64_t total, uint32_t chunk) {
  FUZZ_CHECK(l.total_bytes() == total && l.chunk_payload() == chunk);
  FUZZ_CHECK(l.num_chunks() >= 1);
  const uint32_t last = l.num_chunks() - 1;
  FUZZ_CHECK(l.Length(last) >= 1 && l.Length(last) <= chunk);
  FUZZ_CHECK(l.Offset(last) + l.Length(last) == total);
  FUZZ_CHECK(l.ChunkOf(total - 1) == last);
  if (last > 0) FUZZ_CHECK(l.Length(0) == chunk);
}

}  // namespace
}  // namespace dblp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dblp;
  using namespace dblp::fuzz;
  Reader in(data, size);
  // Chunk payloads up to the jumbo MTU's; totals up to 2^34 so that layouts
  // with more than 2^31 chunks (which must be refused) are reachable.
  const uint32_t chunk = 4u * (1u + in.U16() % (kMaxMtu / 4));
  const uint64_t hi = in.U8() % 4;
  const uint64_t total = 1 + ((hi << 32) | in.U32());
  size_t len = 0;
  const uint8_t* frame = in.Rest(&len);

  ChunkLayout layout;
  try {
    layout = ChunkLayout(total, chunk);
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK((total + chunk - 1) / chunk > (uint64_t{1} << 31));
    return 0;
  }
  CheckLayout(layout, total, chunk);

  FUZZ_CHECK(PeekSenderRank(frame, len) == 0xFFFF || len >= kDataHeaderBytes);

  DataHeader h;
  const DecodeStatus hs = DecodeDataHeader(frame, len, &h);
  FUZZ_CHECK(Named(hs));
  if (len < kDataHeaderBytes) FUZZ_CHECK(hs == DecodeStatus::kShortBuffer);

  DataHeader fh;
  const uint8_t* payload = nullptr;
  const DecodeStatus fs = DecodeDataFrame(frame, len, layout, &fh, &payload);
  FUZZ_CHECK(Named(fs));

  if (hs != DecodeStatus::kOk) {
    FUZZ_CHECK(fs == hs);
    FUZZ_CHECK(payload == nullptr);
    return 0;
  }

  // The header: canonical, inside the buffer, and built back identically.
  FUZZ_CHECK(h.payload_len <= len - kDataHeaderBytes);
  FUZZ_CHECK(PeekSenderRank(frame, len) == h.sender_rank);
  uint8_t again[kDataHeaderBytes];
  EncodeDataHeader(h, again);
  FUZZ_CHECK(std::memcmp(again, frame, kDataHeaderBytes) == 0);
  std::vector<uint8_t> built(kDataHeaderBytes + h.payload_len);
  FUZZ_CHECK(BuildDataFrame(h, frame + kDataHeaderBytes, built.data()) ==
             built.size());
  FUZZ_CHECK(std::memcmp(built.data(), frame, built.size()) == 0);
  DataHeader rh;
  FUZZ_CHECK(DecodeDataHeader(built.data(), built.size(), &rh) ==
             DecodeStatus::kOk);
  FUZZ_CHECK(rh == h);

  // Against the layout: exactly the documented checks, in order.
  const DecodeStatus vs = ValidateChunk(h, layout);
  FUZZ_CHECK(Named(vs));
  FUZZ_CHECK(fs == vs);
  if (h.seq >= layout.num_chunks()) {
    FUZZ_CHECK(vs == DecodeStatus::kSeqOutOfRange);
  } else if (h.payload_len != layout.Length(h.seq)) {
    FUZZ_CHECK(vs == DecodeStatus::kLengthMismatch);
  } else {
    FUZZ_CHECK(vs == DecodeStatus::kOk);
  }
  if (fs == DecodeStatus::kOk) {
    FUZZ_CHECK(fh == h);
    FUZZ_CHECK(payload == frame + kDataHeaderBytes);
    FUZZ_CHECK(payload + fh.payload_len <= frame + len);
    FUZZ_CHECK(layout.Offset(fh.seq) + fh.payload_len <= layout.total_bytes());
    // Copying reads every payload byte: ASan checks the whole range.
    const std::vector<uint8_t> chunk_bytes(payload, payload + fh.payload_len);
    FUZZ_CHECK(chunk_bytes.size() == fh.payload_len);
  }
  return 0;
}

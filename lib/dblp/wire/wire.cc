#include "dblp/wire/wire.h"

#include <arpa/inet.h>

#include <cstring>

#include "dblp/wire/chunking.h"

namespace dblp {

const char* DecodeStatusName(DecodeStatus s) {
  switch (s) {
    case DecodeStatus::kOk:
      return "ok";
    case DecodeStatus::kShortBuffer:
      return "short_buffer";
    case DecodeStatus::kBadMagic:
      return "bad_magic";
    case DecodeStatus::kBadVersion:
      return "bad_version";
    case DecodeStatus::kBadType:
      return "bad_type";
    case DecodeStatus::kLengthBeyondBuffer:
      return "length_beyond_buffer";
    case DecodeStatus::kSeqOutOfRange:
      return "seq_out_of_range";
    case DecodeStatus::kLengthMismatch:
      return "length_mismatch";
  }
  return "unknown";
}

void EncodeDataHeader(const DataHeader& h, uint8_t* out) {
  DataHeaderWire w;
  w.magic_be = htons(kDataMagic);
  w.version = kWireVersion;
  w.type = static_cast<uint8_t>(h.type);
  w.session_be = htonl(h.session);
  w.sender_rank_be = htons(h.sender_rank);
  w.payload_len_be = htons(h.payload_len);
  w.round_be = htonl(h.round);
  w.seq_be = htonl(h.seq);
  std::memcpy(out, &w, sizeof(w));
}

size_t BuildDataFrame(const DataHeader& h, const uint8_t* payload,
                      uint8_t* out) {
  EncodeDataHeader(h, out);
  if (h.payload_len != 0) {
    std::memcpy(out + kDataHeaderBytes, payload, h.payload_len);
  }
  return kDataHeaderBytes + h.payload_len;
}

DecodeStatus DecodeDataFrame(const uint8_t* buf, size_t len,
                             const ChunkLayout& layout, DataHeader* out,
                             const uint8_t** payload) {
  DecodeStatus s = DecodeDataHeader(buf, len, out);
  if (s != DecodeStatus::kOk) return s;
  s = ValidateChunk(*out, layout);
  if (s != DecodeStatus::kOk) return s;
  *payload = buf + kDataHeaderBytes;
  return DecodeStatus::kOk;
}

}  // namespace dblp

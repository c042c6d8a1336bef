// libFuzzer target: the control-channel decoder (lib/dblp/control/control.h)
// fed a byte stream split at points taken from the input.
//
// Input: u8 max_frame selector, u8 n, n split sizes (u8 each; 0 = an empty
// Feed), then the stream. The stream is decoded twice: fed at once, and fed
// in pieces of the split sizes (cyclically), draining Next() after every
// Feed as a connection handler does.
//
// Promises checked (abort on violation):
//  - canonical encoding: every decoded message passes ValidateControl and
//    EncodeControl gives back exactly the bytes of its frame (length prefix
//    and type included), and buffered() accounts for every byte;
//  - the split does not matter: same messages, same final status, same
//    error and error text as the one-piece decode;
//  - errors poison: Next() keeps returning the same error, Feed() is
//    ignored; every error and type is a named one;
//  - memory: once drained, the decoder holds less than one frame
//    (4 + max_frame bytes).
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "fuzz_input.h"

namespace dblp::fuzz {
namespace {

struct Outcome {
  std::vector<ControlMessage> messages;
  std::vector<size_t> frame_ends;  // stream offset after each message
  ControlDecoder::Status last = ControlDecoder::Status::kNeedMore;
  ControlError error = ControlError::kNone;
  std::string error_text;
  size_t buffered = 0;
};

uint32_t LoadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Pops every complete message; `fed` is how much of `stream` went in.
void Drain(ControlDecoder& dec, const uint8_t* stream, size_t fed,
           Outcome& out) {
  for (;;) {
    FUZZ_CHECK(dec.buffered() <= fed);
    const size_t start = fed - dec.buffered();
    ControlMessage m;
    const ControlDecoder::Status s = dec.Next(m);
    out.last = s;
    if (s == ControlDecoder::Status::kMessage) {
      FUZZ_CHECK(dec.error() == ControlError::kNone);
      const size_t end = fed - dec.buffered();
      FUZZ_CHECK(end - start > kControlFrameHeader);
      FUZZ_CHECK(end - start == kControlFrameHeader + LoadBe32(stream + start));
      FUZZ_CHECK(LoadBe32(stream + start) <= dec.max_frame());
      FUZZ_CHECK(static_cast<uint8_t>(TypeOf(m)) ==
                 stream[start + kControlFrameHeader]);
      FUZZ_CHECK(std::strcmp(ControlTypeName(m), "UNKNOWN") != 0);
      FUZZ_CHECK(ValidateControl(m) == ControlError::kNone);
      std::vector<uint8_t> again;
      try {
        EncodeControl(m, again);
      } catch (const std::exception& e) {
        Fail(__FILE__, __LINE__, e.what());
      }
      FUZZ_CHECK(again.size() == end - start);
      FUZZ_CHECK(std::memcmp(again.data(), stream + start, again.size()) == 0);
      out.messages.push_back(std::move(m));
      out.frame_ends.push_back(end);
      continue;
    }
    if (s == ControlDecoder::Status::kNeedMore) {
      FUZZ_CHECK(dec.error() == ControlError::kNone);
      FUZZ_CHECK(dec.error_text().empty());
      // Less than one whole frame is held: the header, or a frame whose
      // declared length already passed the max_frame check.
      const size_t held = dec.buffered();
      if (held >= kControlFrameHeader) {
        const uint32_t len = LoadBe32(stream + start);
        FUZZ_CHECK(len >= 1 && len <= dec.max_frame());
        FUZZ_CHECK(held < kControlFrameHeader + size_t{len});
      }
      return;
    }
    FUZZ_CHECK(s == ControlDecoder::Status::kError);
    FUZZ_CHECK(dec.error() != ControlError::kNone);
    FUZZ_CHECK(std::strcmp(ControlErrorName(dec.error()), "unknown") != 0);
    FUZZ_CHECK(!dec.error_text().empty());
    // Poisoned: the same error again, and input is dropped.
    const ControlError e = dec.error();
    const size_t held = dec.buffered();
    FUZZ_CHECK(dec.Next(m) == ControlDecoder::Status::kError);
    const uint8_t junk[5] = {0, 0, 0, 1, 1};
    dec.Feed(junk, sizeof(junk));
    FUZZ_CHECK(dec.buffered() == held);
    FUZZ_CHECK(dec.Next(m) == ControlDecoder::Status::kError);
    FUZZ_CHECK(dec.error() == e);
    return;
  }
}

void Finish(const ControlDecoder& dec, Outcome& out) {
  out.error = dec.error();
  out.error_text = dec.error_text();
  out.buffered = dec.buffered();
}

}  // namespace
}  // namespace dblp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dblp;
  using namespace dblp::fuzz;
  Reader in(data, size);
  // Mostly the production limit; small limits reach kFrameTooLarge with
  // short inputs.
  uint32_t max_frame = kMaxControlFrame;
  switch (in.U8() % 4) {
    case 2:
      max_frame = 64;
      break;
    case 3:
      max_frame = in.U16();
      break;
    default:
      break;
  }
  size_t nsplits = 0;
  const uint8_t* splits = in.Bytes(in.U8() % 16, &nsplits);
  size_t len = 0;
  const uint8_t* stream = in.Rest(&len);

  Outcome whole;
  {
    ControlDecoder dec(max_frame);
    FUZZ_CHECK(dec.max_frame() == max_frame && dec.buffered() == 0);
    dec.Feed(stream, len);
    Drain(dec, stream, len, whole);
    Finish(dec, whole);
  }

  Outcome split;
  {
    ControlDecoder dec(max_frame);
    size_t fed = 0;
    size_t i = 0;
    size_t zero_run = 0;  // all-zero split sizes must not loop forever
    while (fed < len) {
      size_t piece = nsplits == 0 ? len : splits[i++ % nsplits];
      if (piece == 0 && ++zero_run > nsplits) piece = len;
      if (piece != 0) zero_run = 0;
      if (piece > len - fed) piece = len - fed;
      dec.Feed(stream + fed, piece);
      fed += piece;
      Drain(dec, stream, fed, split);
    }
    if (len == 0) Drain(dec, stream, 0, split);
    Finish(dec, split);
  }

  FUZZ_CHECK(split.messages.size() == whole.messages.size());
  for (size_t k = 0; k < whole.messages.size(); ++k) {
    FUZZ_CHECK(split.messages[k] == whole.messages[k]);
    FUZZ_CHECK(split.frame_ends[k] == whole.frame_ends[k]);
  }
  FUZZ_CHECK(split.last == whole.last);
  FUZZ_CHECK(split.error == whole.error);
  FUZZ_CHECK(split.error_text == whole.error_text);
  // After an error the split decoder saw less input (it was dropped), so
  // only a decode still waiting for bytes holds the same tail.
  if (whole.last == ControlDecoder::Status::kNeedMore) {
    FUZZ_CHECK(split.buffered == whole.buffered);
  }
  return 0;
}

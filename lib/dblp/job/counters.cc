#include "dblp/job/counters.h"

#include <string>

namespace dblp {

void AddReceiverCounters(std::string_view prefix,
                         std::span<const ReceiverRound* const> receivers,
                         bool decode, NamedCounters* out) {
  for (int v = 0; v < kNumVerdicts; ++v) {
    uint64_t n = 0;
    for (const ReceiverRound* r : receivers) {
      n += r->verdict_count(static_cast<Verdict>(v));
    }
    out->emplace_back(
        std::string(prefix) + VerdictName(static_cast<Verdict>(v)), n);
  }
  if (!decode) return;
  for (int s = 1; s < kNumDecodeStatus; ++s) {
    uint64_t n = 0;
    for (const ReceiverRound* r : receivers) {
      n += r->decode_error_count(static_cast<DecodeStatus>(s));
    }
    out->emplace_back(
        std::string("decode_") + DecodeStatusName(static_cast<DecodeStatus>(s)),
        n);
  }
}

}  // namespace dblp

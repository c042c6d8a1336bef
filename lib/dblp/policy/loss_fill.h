// What to do with the chunks a bounded-loss round gave up on.
//
// DBLP and MLT treat a missing gradient chunk as zero. LTP offers two
// alternatives we also support: "bubble filling" with the previous value, and
// unbiased rescaling (divide by the number of contributions actually received
// instead of the number of workers). Payloads are raw float32 in host byte
// order; chunk `seq` covers bytes [Offset(seq), Offset(seq) + Length(seq)) of
// the flattened gradient.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"

namespace dblp {

enum class FillMode : uint8_t { kZero, kPrevious, kRescale };

// "zero" | "prev" | "rescale"; throws std::invalid_argument naming the
// choices on anything else.
FillMode ParseFillMode(std::string_view text);
// The ParseFillMode spelling: "zero", "prev" or "rescale".
const char* FillModeName(FillMode mode);

// Receiver-side fill of one received buffer (e.g. a worker's copy of the
// broadcast mean): every chunk whose bit in `arrived` is clear is set to zero
// (kZero and kRescale - rescaling only means something where contributions
// are counted, i.e. in MeanReducer) or copied from `previous` (kPrevious).
// Returns the number of chunks filled.
//
// Throws std::invalid_argument if buffer does not hold exactly
// layout.total_bytes(), if arrived.size() != layout.num_chunks(), or, for
// kPrevious, if previous.size() != buffer.size(). `previous` is ignored (may
// be empty) for the other modes.
uint32_t FillMissing(std::span<float> buffer, const Bitmap& arrived,
                     const ChunkLayout& layout, FillMode mode,
                     std::span<const float> previous);

// The preliminary experiment of the DBLP paper (Fig. 1): zero a random
// `fraction` of the chunks of `buffer` (seeded, so every worker's copy of a
// mean loses the same chunks). Returns the number of chunks zeroed. Throws
// std::invalid_argument on a size mismatch or a fraction outside [0, 1].
uint32_t ZeroRandomChunks(std::span<float> buffer, const ChunkLayout& layout,
                          double fraction, uint64_t seed);

}  // namespace dblp

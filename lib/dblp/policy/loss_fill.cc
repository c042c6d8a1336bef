#include "dblp/policy/loss_fill.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "dblp/base/rng.h"

namespace dblp {
namespace {

[[noreturn]] void SizeMismatch(const char* what, size_t got, uint64_t want) {
  throw std::invalid_argument(
      std::string(what) + " holds " + std::to_string(got) +
      " floats, the layout needs " + std::to_string(want));
}

}  // namespace

FillMode ParseFillMode(std::string_view text) {
  if (text == "zero") return FillMode::kZero;
  if (text == "prev") return FillMode::kPrevious;
  if (text == "rescale") return FillMode::kRescale;
  throw std::invalid_argument("invalid fill mode \"" + std::string(text) +
                              "\": expected \"zero\", \"prev\" or \"rescale\"");
}

const char* FillModeName(FillMode mode) {
  switch (mode) {
    case FillMode::kZero:
      return "zero";
    case FillMode::kPrevious:
      return "prev";
    case FillMode::kRescale:
      return "rescale";
  }
  return "invalid";
}

uint32_t FillMissing(std::span<float> buffer, const Bitmap& arrived,
                     const ChunkLayout& layout, FillMode mode,
                     std::span<const float> previous) {
  if (static_cast<uint64_t>(buffer.size()) * sizeof(float) !=
      layout.total_bytes()) {
    throw std::invalid_argument(
        "fill buffer holds " + std::to_string(buffer.size() * sizeof(float)) +
        " bytes, the layout needs " + std::to_string(layout.total_bytes()));
  }
  if (arrived.size() != layout.num_chunks()) {
    throw std::invalid_argument(
        "arrival bitmap has " + std::to_string(arrived.size()) +
        " bits, the layout has " + std::to_string(layout.num_chunks()) +
        " chunks");
  }
  if (mode == FillMode::kPrevious && previous.size() != buffer.size()) {
    SizeMismatch("previous buffer", previous.size(), buffer.size());
  }
  uint32_t filled = 0;
  float* const out = buffer.data();
  const float* const prev = previous.data();
  arrived.ForEachMissing([&](uint32_t seq) {
    // total_bytes is a multiple of 4 (checked above), so is every Length.
    const size_t first = layout.Offset(seq) / sizeof(float);
    const size_t n = layout.Length(seq) / sizeof(float);
    if (mode == FillMode::kPrevious) {
      std::memcpy(out + first, prev + first, n * sizeof(float));
    } else {
      std::fill_n(out + first, n, 0.0f);
    }
    ++filled;
  });
  return filled;
}

uint32_t ZeroRandomChunks(std::span<float> buffer, const ChunkLayout& layout,
                          double fraction, uint64_t seed) {
  if (buffer.size() * sizeof(float) != layout.total_bytes()) {
    throw std::invalid_argument(
        "ZeroRandomChunks: buffer size differs from "
        "the chunk layout");
  }
  if (!(fraction >= 0 && fraction <= 1)) {
    throw std::invalid_argument("ZeroRandomChunks: fraction must be in [0, 1]");
  }
  Rng rng(seed);
  auto* bytes = reinterpret_cast<uint8_t*>(buffer.data());
  uint32_t zeroed = 0;
  for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
    if (rng.Bernoulli(fraction)) {
      std::memset(bytes + layout.Offset(c), 0, layout.Length(c));
      ++zeroed;
    }
  }
  return zeroed;
}

}  // namespace dblp

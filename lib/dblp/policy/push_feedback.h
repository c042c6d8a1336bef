// Error feedback on the push (dblp-server --push_feedback).
//
// The early STOP truncates a worker's push; without feedback the chunks the
// server did not sum are lost for good. With it, the server tells each
// worker the exact set it summed for the round (ACCEPTED, sent once the
// round is closed, so frames that arrived after STOP count and frames that
// arrived after the close do not), and the worker adds what was not
// accepted into its next push. Nothing is counted twice or dropped: over
// any run, what the server summed plus carried() equals what the worker
// produced (tests/test_push_feedback.cc, through the real round code).
#pragma once

#include <span>
#include <vector>

#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"

namespace dblp {

class PushFeedback {
 public:
  explicit PushFeedback(const ChunkLayout& layout);

  // Before a push: adds what earlier pushes did not deliver into `grad`
  // (layout.total_bytes() / 4 floats, else std::invalid_argument).
  void AddCarried(std::span<float> grad);
  // After the round closed: `accepted` is the server's final set; the
  // chunks it lacks carry `pushed`'s values into the next push. Throws
  // std::invalid_argument on a bitmap or buffer of the wrong size.
  void Settle(const Bitmap& accepted, std::span<const float> pushed);

  std::span<const float> carried() const { return carry_; }
  uint32_t carried_chunks() const { return carried_chunks_; }

 private:
  void CheckSize(size_t floats) const;
  ChunkLayout layout_;
  std::vector<float> carry_;
  uint32_t carried_chunks_ = 0;
};

}  // namespace dblp

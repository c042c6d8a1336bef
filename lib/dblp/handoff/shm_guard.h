// A mapping of a file that another process may shrink (the trainer's
// hand-off region): an access past the file's new end raises SIGBUS, which
// would kill the worker with nothing in its log. The guard's SIGBUS handler
// maps zero pages over the rest of a guarded range and marks it truncated;
// the access then completes and the worker fails the job at its next check,
// naming the cause.
//
// Chosen over the alternatives (docs/RELIABILITY.md, "A trainer that
// truncates its region"): a sigsetjmp around every access costs the
// datapath per frame, and a memfd sealed against shrinking would change how
// trainer and worker find the region (a name both can open). The guard
// costs nothing until the trainer misbehaves.
#pragma once

#include <cstddef>
#include <string>

namespace dblp {

class ShmGuard {
 public:
  // Guards [base, base + bytes) (a whole mapping) until Release. At most
  // kMaxRanges at a time; false with `*why` when the table is full or the
  // handler cannot be installed.
  static bool Guard(void* base, size_t bytes, std::string* why);
  static void Release(void* base);
  // Whether an access into the range at `base` touched a page past the
  // file's end (the range now holds zero pages of this process's own).
  static bool Truncated(const void* base);

  static constexpr int kMaxRanges = 16;
};

}  // namespace dblp

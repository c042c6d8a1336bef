// The payload copy of the frame builder: a chunk (about 1.4 KB) from the
// gradient into an mbuf. Wide vector loads and stores, picked once per
// process for this CPU; memcpy is the fallback and the reference the
// tests compare every variant with.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dblp {

enum class PayloadCopyKind : uint8_t { kMemcpy = 0, kAvx2 = 1, kAvx512 = 2 };

using PayloadCopyFn = void (*)(uint8_t* dst, const uint8_t* src, size_t n);

// The variant `kind`, or null where this CPU (or compiler) lacks it.
PayloadCopyFn PayloadCopyFor(PayloadCopyKind kind);
// The widest variant this CPU runs; chosen on first call.
PayloadCopyKind BestPayloadCopy();

// BestPayloadCopy's function, looked up once.
inline PayloadCopyFn BestPayloadCopyFn() {
  static const PayloadCopyFn fn = PayloadCopyFor(BestPayloadCopy());
  return fn;
}

// Copies `n` bytes (no overlap) with BestPayloadCopy's variant.
inline void CopyPayload(uint8_t* dst, const uint8_t* src, size_t n) {
  BestPayloadCopyFn()(dst, src, n);
}

}  // namespace dblp

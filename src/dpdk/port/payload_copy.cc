#include "port/payload_copy.h"

#include <cstddef>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dblp {
namespace {

void CopyMemcpy(uint8_t* dst, const uint8_t* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

#if defined(__x86_64__)
// 256 bytes per iteration, then 64, then one masked load/store for the
// tail: about 60 instructions for a 1436-byte chunk where glibc's memcpy
// takes 170 (its size dispatch and 32-byte vectors). Masked-off bytes are
// neither read nor written (no fault past either buffer).
// tune= a CPU that has the ISA: GCC's
// generic tuning splits every unaligned 32-byte load and store in two.
__attribute__((target("avx512f,avx512bw,tune=skylake-avx512"))) void CopyAvx512(
    uint8_t* dst, const uint8_t* src, size_t n) {
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    const __m512i a = _mm512_loadu_si512(src + i);
    const __m512i b = _mm512_loadu_si512(src + i + 64);
    const __m512i c = _mm512_loadu_si512(src + i + 128);
    const __m512i d = _mm512_loadu_si512(src + i + 192);
    _mm512_storeu_si512(dst + i, a);
    _mm512_storeu_si512(dst + i + 64, b);
    _mm512_storeu_si512(dst + i + 128, c);
    _mm512_storeu_si512(dst + i + 192, d);
  }
  for (; i + 64 <= n; i += 64) {
    _mm512_storeu_si512(dst + i, _mm512_loadu_si512(src + i));
  }
  if (i < n) {
    const __mmask64 k = (__mmask64{1} << (n - i)) - 1;  // n - i < 64
    _mm512_mask_storeu_epi8(dst + i, k, _mm512_maskz_loadu_epi8(k, src + i));
  }
}

inline __attribute__((target("avx2"), always_inline)) void Copy32(
    uint8_t* dst, const uint8_t* src) {
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(dst),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
}

// 256 bytes per loop turn, the remaining whole 32-byte blocks through a
// jump into a straight run (no loop), then the last 32 bytes again,
// overlapping (no byte-count dispatch): 115 instructions for a 1436-byte
// chunk, glibc's memcpy 170.
__attribute__((target("avx2,tune=haswell"))) void CopyAvx2(uint8_t* dst,
                                                           const uint8_t* src,
                                                           size_t n) {
  if (n < 32) {
    if (n != 0) std::memcpy(dst, src, n);
    return;
  }
  // src addressed from dst: fewer induction variables (20 instructions
  // per 256 bytes, 22 with an index).
  const size_t i = n & ~size_t{255};
  const ptrdiff_t from_dst = src - dst;
  for (uint8_t *p = dst, *end = dst + i; p != end; p += 256) {
#pragma GCC unroll 8
    for (size_t b = 0; b < 256; b += 32) Copy32(p + b, p + from_dst + b);
  }
  const size_t blocks = (n - i) / 32;  // 0..7
  uint8_t* d = dst + i;
  const uint8_t* s = src + i;
  switch (blocks) {
    case 7:
      Copy32(d + 192, s + 192);
      [[fallthrough]];
    case 6:
      Copy32(d + 160, s + 160);
      [[fallthrough]];
    case 5:
      Copy32(d + 128, s + 128);
      [[fallthrough]];
    case 4:
      Copy32(d + 96, s + 96);
      [[fallthrough]];
    case 3:
      Copy32(d + 64, s + 64);
      [[fallthrough]];
    case 2:
      Copy32(d + 32, s + 32);
      [[fallthrough]];
    case 1:
      Copy32(d, s);
      [[fallthrough]];
    default:
      break;
  }
  if (i + blocks * 32 != n) Copy32(dst + n - 32, src + n - 32);
}
#endif

}  // namespace

PayloadCopyFn PayloadCopyFor(PayloadCopyKind kind) {
  switch (kind) {
    case PayloadCopyKind::kMemcpy:
      return CopyMemcpy;
#if defined(__x86_64__)
    case PayloadCopyKind::kAvx2:
      return __builtin_cpu_supports("avx2") ? CopyAvx2 : nullptr;
    case PayloadCopyKind::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
                     __builtin_cpu_supports("avx512bw")
                 ? CopyAvx512
                 : nullptr;
#else
    default:
      return nullptr;
#endif
  }
  return nullptr;
}

PayloadCopyKind BestPayloadCopy() {
  if (PayloadCopyFor(PayloadCopyKind::kAvx512) != nullptr) {
    return PayloadCopyKind::kAvx512;
  }
  if (PayloadCopyFor(PayloadCopyKind::kAvx2) != nullptr) {
    return PayloadCopyKind::kAvx2;
  }
  return PayloadCopyKind::kMemcpy;
}

}  // namespace dblp

#include "dblp/float_ops.h"

#include <cstring>

namespace dblp {

// AVX-512 and AVX2 clones, chosen once by the CPU at load time (an ifunc);
// the baseline clone for anything else.
#define DBLP_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

DBLP_VECTOR_CLONES void AddFloats(float* __restrict dst,
                                  const uint8_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    dst[i] += v;
  }
}

DBLP_VECTOR_CLONES void StoreFloats(float* __restrict dst,
                                    const uint8_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(v));
    dst[i] = 0.0f + v;
  }
}

}  // namespace dblp

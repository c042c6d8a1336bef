#include "dblp/float_ops.h"

#include <cstring>

#include "dblp/vector_clones.h"

namespace dblp {

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

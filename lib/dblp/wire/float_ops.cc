#include "dblp/wire/float_ops.h"

#include <cmath>
#include <cstring>

#include "dblp/base/vector_clones.h"

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

double L2Norm(std::span<const float> v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

}  // namespace dblp

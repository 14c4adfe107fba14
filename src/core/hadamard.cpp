// See hadamard.h for the order of operations (the contract every backend reproduces).
#include "core/hadamard.h"

#include <cstring>

#include "core/status.h"

namespace ls {

bool hadamard_group_ok(int64_t G) {
  if (G < 4 || G > kMaxHadamardGroup) return false;
  while (G % 4 == 0) G /= 4;
  return G == 1;
}

void hadamard_f32(float* v, float* tmp, int64_t G) {
  LS_CHECK_MSG(hadamard_group_ok(G), "hadamard: group " + std::to_string(G) + " is not a power of 4 in [4, 4096]");
  for (int64_t s = 1; s < G; s *= 4) {
    for (int64_t i = 0; i < G; ++i) {
      const int64_t d = (i / s) % 4;
      const int64_t b = i - d * s;
      const float x0 = v[b], x1 = v[b + s], x2 = v[b + 2 * s], x3 = v[b + 3 * s];
      float t;
      switch (d) {
        case 0: t = x0 + x1; t = t + x2; t = t - x3; break;
        case 1: t = x0 + x1; t = t - x2; t = t + x3; break;
        case 2: t = x0 - x1; t = t + x2; t = t + x3; break;
        default: t = -x0 + x1; t = t + x2; t = t + x3; break;
      }
      tmp[i] = 0.5f * t;
    }
    std::memcpy(v, tmp, static_cast<size_t>(G) * sizeof(float));
  }
}

}  // namespace ls

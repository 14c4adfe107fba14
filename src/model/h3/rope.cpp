#include "model/h3/rope.h"

#include <cmath>

#include "core/dtype.h"

namespace ls::h3 {

void rope_table_rows(const std::vector<double>& positions, const float* inv_freq, int64_t len, int64_t row_begin,
                     int64_t row_end, uint16_t* out) {
  const int64_t P = 3 * len;
  for (int64_t r = row_begin; r < row_end; ++r) {
    uint16_t* o = out + (r - row_begin) * P * 2;
    for (int64_t j = 0; j < P; ++j) {
      // Pair j uses axis j / len (t, h, w) and frequency inv_freq[j % len].
      const float pos = static_cast<float>(positions[static_cast<size_t>(3 * r + j / len)]);
      const float ang = pos * inv_freq[j % len];
      o[2 * j] = f32_to_bf16(std::cos(ang));
      o[2 * j + 1] = f32_to_bf16(std::sin(ang));
    }
  }
}

}  // namespace ls::h3

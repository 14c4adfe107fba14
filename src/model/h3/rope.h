// RoPE rotation table (h3-model.md §2.8): per row and pair j < P (P = 3 * len), the
// angle fl32(fl32(pos[row, j / len]) * inv_freq[j % len]) (float64 positions rounded to
// fp32 first), cos and sin in fp32, stored as bf16 (cos, sin) pairs - the layout the
// backend's qk_norm_rope takes: bf16 [rows, P, 2].
#pragma once

#include <cstdint>
#include <vector>

namespace ls::h3 {

// Rows [row_begin, row_end) of the table into `out` (bf16 bits, (row_end - row_begin) * P * 2).
//   positions: float64 [S, 3]; inv_freq: fp32 [len].
void rope_table_rows(const std::vector<double>& positions, const float* inv_freq, int64_t len, int64_t row_begin,
                     int64_t row_end, uint16_t* out);

}  // namespace ls::h3

// Row addressing shared by the CPU ops that walk two views of one shape row by row
// (copy, convert): a row is one index over every dimension but the innermost.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace ls::cpu {

// Element offsets of row o (row-major over dimensions 0 .. ndim-2) in src and dst, which
// have the same shape and any strides.
inline void row_offsets(const TensorView& src, const TensorView& dst, int64_t o, int64_t& soff, int64_t& doff) {
  int64_t rem = o;
  soff = 0, doff = 0;
  for (int i = src.ndim - 2; i >= 0; --i) {
    const int64_t idx = rem % src.size(i);
    rem /= src.size(i);
    soff += idx * src.stride[static_cast<size_t>(i)];
    doff += idx * dst.stride[static_cast<size_t>(i)];
  }
}

}  // namespace ls::cpu

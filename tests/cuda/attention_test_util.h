// The attention tests' shared parity harness (test_attention_cudnn.cpp,
// test_attention_hopper.cpp): an fp64 reference attention and the relative L2 distance
// from it. The tests hold each GPU path to "within 2x the CPU reference's distance from
// fp64" (DESIGN.md §4), so both need exactly this reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"

namespace ls::cudatest {

// fp64 reference: softmax(scale q k^T) v with scale = 1 / sqrt(Dh), no roundings.
// q, k, v contiguous [rows, H, Dh]; the result is f64 [Mq, H, Dh].
inline HostBuf attention_f64(const HostBuf& q, const HostBuf& k, const HostBuf& v, int64_t H, int64_t Dh) {
  const int64_t Mq = q.v.shape[0], Mk = k.v.shape[0];
  HostBuf out(DType::f64, {Mq, H, Dh});
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  std::vector<double> s(static_cast<size_t>(Mk)), qd(static_cast<size_t>(Dh)), o(static_cast<size_t>(Dh));
  std::vector<double> kd(static_cast<size_t>(k.n())), vd(static_cast<size_t>(v.n()));
  for (int64_t i = 0; i < k.n(); ++i) kd[static_cast<size_t>(i)] = k.get(i), vd[static_cast<size_t>(i)] = v.get(i);
  for (int64_t i = 0; i < Mq; ++i)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t e = 0; e < Dh; ++e) qd[static_cast<size_t>(e)] = q.get((i * H + h) * Dh + e);
      double mx = -INFINITY;
      for (int64_t j = 0; j < Mk; ++j) {
        double d = 0;
        for (int64_t e = 0; e < Dh; ++e) d += qd[static_cast<size_t>(e)] * kd[static_cast<size_t>((j * H + h) * Dh + e)];
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, d * scale);
      }
      double l = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < Mk; ++j) {
        const double p = std::exp(s[static_cast<size_t>(j)] - mx);
        l += p;
        for (int64_t e = 0; e < Dh; ++e) o[static_cast<size_t>(e)] += p * vd[static_cast<size_t>((j * H + h) * Dh + e)];
      }
      for (int64_t e = 0; e < Dh; ++e) out.v.ptr<double>()[(i * H + h) * Dh + e] = o[static_cast<size_t>(e)] / l;
    }
  return out;
}

// sqrt(sum (got - ref)^2 / sum ref^2) over all elements (got any dtype, ref64 f64).
inline double rel_l2(const HostBuf& got, const HostBuf& ref64) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.n(); ++i) {
    const double r = ref64.v.ptr<const double>()[i], g = got.get(i);
    num += (g - r) * (g - r);
    den += r * r;
  }
  return std::sqrt(num / den);
}

}  // namespace ls::cudatest

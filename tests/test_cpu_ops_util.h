// Helpers shared by tests/test_cpu_ops*.cpp: host tensors with guard bytes, seeded
// fills, element access in double, row-wise memcmp, the error statistics used for
// the "at most 2x the error of a plain same-precision implementation" checks
// (DESIGN.md §4), and parameterised cases' names.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace ls::test {

// A parameterised case's name from its sizes: {{"M", 97}, {"N", 23}} -> "M97_N23" (built by
// appending: GCC 12 warns falsely on "literal" + std::string&&).
inline std::string sizes_name(std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  std::string n;
  for (const auto& [key, value] : sizes) {
    if (!n.empty()) n += "_";
    n += key;
    n += std::to_string(value);
  }
  return n;
}

// A host buffer holding one contiguous tensor, with kGuard bytes of a known pattern on
// both sides so an op that writes out of bounds is caught (ggml test-backend-ops style).
class HostTensor {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kPattern = 0xA5;

  HostTensor(DType t, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    bytes_ = static_cast<size_t>(n) * static_cast<size_t>(dtype_size(t));
    // 64-byte alignment of the payload: over-allocate and offset.
    storage_.assign(bytes_ + 2 * kGuard + 64, kPattern);
    uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data()) + kGuard;
    offset_ = static_cast<size_t>((64 - base % 64) % 64) + kGuard;
    std::memset(storage_.data() + offset_, 0, bytes_);
    view_ = TensorView(storage_.data() + offset_, t, dims);
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: test convenience
  size_t bytes() const { return bytes_; }
  void* data() const { return view_.data; }

  // True when the guard bytes on both sides are untouched.
  bool guards_intact() const {
    for (size_t i = 0; i < offset_; ++i)
      if (storage_[i] != kPattern) return false;
    for (size_t i = offset_ + bytes_; i < storage_.size(); ++i)
      if (storage_[i] != kPattern) return false;
    return true;
  }

 private:
  std::vector<uint8_t> storage_;
  size_t bytes_ = 0;
  size_t offset_ = 0;
  TensorView view_;
};

// Linear element index -> pointer for views of up to 4 dims (any strides).
inline void* elem_ptr(const TensorView& v, int64_t linear) {
  int64_t idx[4] = {0, 0, 0, 0};
  for (int i = v.ndim - 1; i >= 0; --i) {
    idx[i] = linear % v.size(i);
    linear /= v.size(i);
  }
  return v.at(idx[0], idx[1], idx[2], idx[3]);
}
inline double get(const TensorView& v, int64_t linear) { return load_as_f64(elem_ptr(v, linear), v.dtype, 0); }
inline void set(const TensorView& v, int64_t linear, double x) {
  if (v.dtype == DType::f64) *static_cast<double*>(elem_ptr(v, linear)) = x;
  else if (v.dtype == DType::i32) *static_cast<int32_t*>(elem_ptr(v, linear)) = static_cast<int32_t>(x);
  else store_from_f32(elem_ptr(v, linear), v.dtype, 0, static_cast<float>(x));
}

inline void fill_uniform(const TensorView& v, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < v.numel(); ++i) set(v, i, dist(rng));
}
// Integer values in [lo, hi]: products and short sums stay exact in fp32.
inline void fill_int(const TensorView& v, std::mt19937_64& rng, int lo, int hi) {
  std::uniform_int_distribution<int> dist(lo, hi);
  for (int64_t i = 0; i < v.numel(); ++i) set(v, i, dist(rng));
}
// Number of non-zero elements: every test asserts its inputs are not all zero.
inline int64_t count_nonzero(const TensorView& v) {
  int64_t n = 0;
  for (int64_t i = 0; i < v.numel(); ++i) n += get(v, i) != 0.0;
  return n;
}
// memcmp of the innermost rows of two views of the same shape and dtype.
inline bool same_bytes(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.size(i) != b.size(i)) return false;
  const int64_t inner = a.size(a.ndim - 1);
  for (int64_t o = 0; o < a.numel() / inner; ++o)
    if (std::memcmp(elem_ptr(a, o * inner), elem_ptr(b, o * inner), static_cast<size_t>(inner * a.elem_size())) != 0)
      return false;
  return true;
}

// bf16 rounding of a double (exact: one rounding, nearest even).
inline double round_bf16_exact(double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int e;
  std::frexp(x, &e);                          // |x| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, e - 8);  // 8 significand bits
  const double q = x / ulp;                   // exact (power-of-two scaling)
  return std::nearbyint(q) * ulp;             // nearest even in the default mode
}
inline double bf16_ulp(double x) {
  if (x == 0.0) return std::ldexp(1.0, -133);
  int e;
  std::frexp(x, &e);
  return std::ldexp(1.0, e - 8);
}

struct ErrStats {
  double max_abs = 0.0;
  double sum_sq = 0.0;
  int64_t n = 0;
  void add(double got, double ref) {
    const double d = std::fabs(got - ref);
    max_abs = std::max(max_abs, d);
    sum_sq += d * d;
    ++n;
  }
  double rms() const { return n ? std::sqrt(sum_sq / static_cast<double>(n)) : 0.0; }
};

}  // namespace ls::test

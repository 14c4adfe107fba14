// Helpers shared by the golden-parity tests (tests/test_golden_*.cpp): open a golden
// file written by tests/reference/h3_reference.py, check its format version, copy
// tensors into owned host buffers, and measure errors.
//
// Error measures (docs/golden.md):
//   max_abs = max |a - ref|, rel_l2 = ||a - ref||_2 / ||ref||_2, over elements whose
//   reference is finite. "exact" references are the same math in float64 with no
//   rounding; the tolerance rule (DESIGN.md §4) is
//     err(LayerStream, exact) <= 2 * err(PyTorch, exact) + floor
//   for both measures, where PyTorch is the bf16/fp32 GPU run stored beside it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace ls::golden {

inline constexpr const char* kGoldenFormat = "1";
inline constexpr const char* kRegenerate =
    "regenerate with: python3 tests/reference/h3_reference.py --out tests/data/golden "
    "(on a machine with a CUDA GPU, PyTorch and safetensors; see tests/reference/README.md)";

inline std::string golden_path(const std::string& file) { return std::string(LS_TEST_DATA_DIR) + "/golden/" + file; }

// Empty string when the file's golden_format matches; otherwise a message with the hint.
inline std::string check_format(const SafetensorsReader& r) {
  auto it = r.metadata().find("golden_format");
  std::string have = it == r.metadata().end() ? "(none)" : it->second;
  if (have == kGoldenFormat) return {};
  return r.path() + ": golden_format " + have + ", this test reads format " + kGoldenFormat + "; " + kRegenerate;
}

inline std::string meta(const SafetensorsReader& r, const std::string& key) {
  auto it = r.metadata().find(key);
  return it == r.metadata().end() ? std::string() : it->second;
}

// A tensor copied out of the (read-only, mapped) file into memory the ops may write.
struct Owned {
  std::vector<uint8_t> bytes;
  TensorView view;
  Owned() = default;
  Owned(DType t, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes.assign(static_cast<size_t>(n * dtype_size(t)), 0);
    view = TensorView::contiguous(bytes.data(), t, shape.data(), static_cast<int>(shape.size()));
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&& o) noexcept : bytes(std::move(o.bytes)), view(o.view) { view.data = bytes.data(); }
  Owned& operator=(Owned&& o) noexcept {
    bytes = std::move(o.bytes);
    view = o.view;
    view.data = bytes.data();
    return *this;
  }
};

inline const SafetensorsEntry* entry(const SafetensorsReader& r, const std::string& name) { return r.find(name); }

inline Owned copy_of(const SafetensorsReader& r, const SafetensorsEntry& e) {
  Owned o(e.dtype, e.shape.empty() ? std::vector<int64_t>{1} : e.shape);
  if (!o.bytes.empty()) std::memcpy(o.bytes.data(), r.data(e), o.bytes.size());
  return o;
}

// Values of a contiguous float view as double.
inline std::vector<double> to_f64(const TensorView& v) {
  std::vector<double> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[static_cast<size_t>(i)] = load_as_f64(v.data, v.dtype, i);
  return out;
}

inline double sum_squares(const std::vector<double>& a) {
  double s = 0;
  for (double x : a)
    if (std::isfinite(x)) s += x * x;
  return s;
}

struct Err {
  double max_abs = 0, rel_l2 = 0;
};

inline Err error(const std::vector<double>& a, const std::vector<double>& ref) {
  Err e;
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;
    double d = a[i] - ref[i];
    if (!std::isfinite(d)) d = INFINITY;
    e.max_abs = std::max(e.max_abs, std::fabs(d));
    d2 += d * d;
    r2 += ref[i] * ref[i];
  }
  e.rel_l2 = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  return e;
}

// Differences in bf16 units in the last place: |a - b| / ulp, where ulp is the bf16
// spacing at max(|a|, |b|, scale * 2^-8) (scale = the largest |reference| of the
// tensor), so values near zero of opposite sign do not count as thousands of ulps.
// NaN vs NaN = 0; NaN vs a number = 1e9.
struct UlpStats {
  double max_ulps = 0;
  int64_t differing = 0;
};

inline double bf16_ulp_at(double x) {
  int e = 0;
  std::frexp(x, &e);         // x = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 8);  // bf16 keeps 8 significant bits
}

inline UlpStats ulp_stats(const std::vector<double>& a, const std::vector<double>& ref) {
  UlpStats s;
  double scale = 0;
  for (double x : ref)
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    double u = 0;
    if (std::isnan(a[i]) || std::isnan(ref[i])) {
      u = (std::isnan(a[i]) && std::isnan(ref[i])) ? 0 : 1e9;
    } else if (a[i] != ref[i]) {
      double m = std::max({std::fabs(a[i]), std::fabs(ref[i]), scale * 0x1p-8});
      u = std::fabs(a[i] - ref[i]) / bf16_ulp_at(m);
    }
    s.max_ulps = std::max(s.max_ulps, u);
    s.differing += u != 0;
  }
  return s;
}

}  // namespace ls::golden

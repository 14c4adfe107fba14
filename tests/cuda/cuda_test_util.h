// Helpers for the CUDA parity tests (tests/cuda/test_*.cpp): one process-wide CUDA
// backend with a device arena and GEMM workspace (tests skip cleanly without a GPU),
// host buffers, guarded device buffers (sentinel bytes around the view, checked after
// each op), uploads/downloads, and bf16/f32 comparisons that fail on NaN or one-sided
// inf (ggml test-backend-ops style).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_ext.h"
#include "core/arena.h"
#include "core/dtype.h"

namespace ls::cudatest {

struct Gpu {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> cuda;
  std::unique_ptr<Arena> arena;
  TensorView workspace;
  TensorView counter;  // 8 bytes for count_unequal
};

// Set by select_native_attention() (before main): the shared backend runs the native kernel.
inline bool& native_attention_wanted() {
  static bool wanted = false;
  return wanted;
}

inline Gpu* gpu() {
  static Gpu* g = []() -> Gpu* {
    Numerics n;
    if (native_attention_wanted()) n.attention = AttentionAlgorithm::native;
    auto b = make_backend("cuda", n, {});
    if (!b.ok()) return nullptr;
    auto* r = new Gpu;
    r->cpu = make_cpu_backend();
    r->cuda = std::move(b.value());
    auto a = Arena::create(r->cuda->memory(), 8ull << 30);
    if (!a.ok()) return nullptr;
    r->arena = std::move(a.value());
    auto ws = r->arena->alloc(DType::u8, {static_cast<int64_t>(r->cuda->workspace_bytes())}, "gemm workspace");
    LS_CHECK(ws.ok());
    r->workspace = ws.value();
    LS_CHECK(r->cuda->set_workspace(r->workspace).ok());
    auto c = r->arena->alloc(DType::f64, {1}, "compare counter");
    LS_CHECK(c.ok());
    r->counter = c.value();
    return r;
  }();
  return g;
}

#define LS_NEED_GPU()                                                   \
  ::ls::cudatest::Gpu* G = ::ls::cudatest::gpu();                       \
  if (G == nullptr) GTEST_SKIP() << "no CUDA device on this machine";   \
  ::ls::Arena::Scope ls_scope_(*G->arena)

// A contiguous host tensor.
struct HostBuf {
  std::vector<uint8_t> bytes;
  TensorView v;
  HostBuf() = default;
  HostBuf(DType t, std::initializer_list<int64_t> dims) { init(t, std::vector<int64_t>(dims)); }
  HostBuf(DType t, const std::vector<int64_t>& dims) { init(t, dims); }
  void init(DType t, const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    bytes.assign(static_cast<size_t>(n * dtype_size(t)) + 16, 0);
    v = TensorView::contiguous(bytes.data(), t, dims.data(), static_cast<int>(dims.size()));
  }
  HostBuf(const HostBuf& o) : bytes(o.bytes), v(o.v) { v.data = bytes.data(); }
  HostBuf& operator=(const HostBuf& o) {
    bytes = o.bytes;
    v = o.v;
    v.data = bytes.data();
    return *this;
  }
  int64_t n() const { return v.numel(); }
  float get(int64_t i) const { return load_as_f32(v.data, v.dtype, i); }
  void set(int64_t i, float x) { store_from_f32(v.data, v.dtype, i, x); }
};

inline HostBuf random_buf(DType t, std::vector<int64_t> dims, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  HostBuf h(t, dims);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  double ss = 0;
  for (int64_t i = 0; i < h.n(); ++i) {
    h.set(i, offset + scale * nd(rng));
    ss += static_cast<double>(h.get(i)) * h.get(i);
  }
  EXPECT_GT(ss, 0.0) << "test input is all zeros";
  return h;
}

constexpr uint8_t kSentinel = 0xA5;
constexpr int64_t kPadCols = 8;

// A device tensor [M, ...inner] placed inside a larger buffer [M + 2, inner + 2 * kPadCols]
// filled with sentinel bytes; `v` is the view (row-strided).
struct DevBuf {
  TensorView full;  // [M + 2, W + 2 * pad] contiguous
  TensorView v;
  std::vector<int64_t> dims;
};

inline TensorView upload_to(Gpu* G, const TensorView& dst, const HostBuf& h) {
  LS_CHECK(G->cuda->copy(dst, h.v).ok());
  return dst;
}

inline DevBuf dev_buf(Gpu* G, DType t, const std::vector<int64_t>& dims) {
  // Logical 2-D shape (R, C): [M] -> (1, M); [M, ...] -> (M, prod(...)).
  int64_t R = dims[0], C = 1;
  for (size_t i = 1; i < dims.size(); ++i) C *= dims[i];
  if (dims.size() == 1) {
    R = 1;
    C = dims[0];
  }
  DevBuf d;
  d.dims = dims;
  auto f = G->arena->alloc(t, {R + 2, C + 2 * kPadCols}, "test buffer");
  LS_CHECK(f.ok());
  d.full = f.value();
  HostBuf s(t, {R + 2, C + 2 * kPadCols});
  std::memset(s.bytes.data(), kSentinel, s.bytes.size());
  upload_to(G, d.full, s);
  TensorView v = d.full.slice_rows(1, R + 1).cols(kPadCols, kPadCols + C);
  if (dims.size() == 3) v = v.unflatten_last(dims[1], dims[2]);
  if (dims.size() == 1) {
    v.ndim = 1;
    v.shape[0] = C;
    v.stride[0] = 1;
  }
  d.v = v;
  return d;
}

inline DevBuf dev_from(Gpu* G, const HostBuf& h) {
  std::vector<int64_t> dims(h.v.shape.begin(), h.v.shape.begin() + h.v.ndim);
  DevBuf d = dev_buf(G, h.v.dtype, dims);
  LS_CHECK(G->cuda->copy(d.v, h.v).ok());
  return d;
}

inline HostBuf download(Gpu* G, const TensorView& v) {
  std::vector<int64_t> dims(v.shape.begin(), v.shape.begin() + v.ndim);
  HostBuf h(v.dtype, dims);
  LS_CHECK(G->cuda->copy(h.v, v).ok());
  LS_CHECK(G->cuda->synchronize().ok());
  return h;
}

// Sentinel bytes outside the view must be untouched.
inline void expect_guards(Gpu* G, const DevBuf& d, const char* what) {
  HostBuf f = download(G, d.full);
  const int64_t rows = d.full.shape[0], W = d.full.shape[1], es = d.full.elem_size();
  const int64_t inner = W - 2 * kPadCols;
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < W; ++c) {
      const bool inside = r >= 1 && r <= rows - 2 && c >= kPadCols && c < kPadCols + inner;
      if (inside) continue;
      for (int64_t b = 0; b < es; ++b) bad += f.bytes[static_cast<size_t>((r * W + c) * es + b)] != kSentinel;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": bytes written outside the output view";
}

inline int64_t ordered(uint16_t h) { return (h & 0x8000) ? -static_cast<int64_t>(h & 0x7fff) : static_cast<int64_t>(h); }
inline int64_t ordered32(uint32_t u) {
  return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7fffffffu) : static_cast<int64_t>(u);
}

// got vs ref element by element: NaN and inf must agree exactly; finite values within
// max_ulps units in the last place of the storage dtype (bf16 or f32) or abs_tol.
inline void expect_close(const HostBuf& got, const HostBuf& ref, int64_t max_ulps, double abs_tol, const char* what) {
  ASSERT_EQ(got.n(), ref.n());
  ASSERT_EQ(got.v.dtype, ref.v.dtype);
  int64_t nan_bad = 0, inf_bad = 0, far = 0, worst_ulp = 0, worst_i = -1;
  for (int64_t i = 0; i < got.n(); ++i) {
    const float a = got.get(i), b = ref.get(i);
    if (std::isnan(a) != std::isnan(b)) { ++nan_bad; continue; }
    if (std::isnan(a)) continue;
    if ((std::isinf(a) || std::isinf(b)) && a != b) { ++inf_bad; continue; }
    int64_t ulp;
    if (got.v.dtype == DType::bf16) {
      ulp = std::llabs(ordered(got.v.ptr<const uint16_t>()[i]) - ordered(ref.v.ptr<const uint16_t>()[i]));
    } else if (got.v.dtype == DType::f32) {
      ulp = std::llabs(ordered32(f32_bits(a)) - ordered32(f32_bits(b)));
    } else {
      ulp = a == b ? 0 : 1;
    }
    if (ulp > worst_ulp) { worst_ulp = ulp; worst_i = i; }
    if (ulp > max_ulps && std::fabs(static_cast<double>(a) - b) > abs_tol) ++far;
  }
  EXPECT_EQ(nan_bad, 0) << what << ": NaN in one output only";
  EXPECT_EQ(inf_bad, 0) << what << ": inf in one output only";
  EXPECT_EQ(far, 0) << what << ": " << far << " elements beyond " << max_ulps << " ulp (worst " << worst_ulp
                    << " at " << worst_i << ": " << (worst_i >= 0 ? got.get(worst_i) : 0.f) << " vs "
                    << (worst_i >= 0 ? ref.get(worst_i) : 0.f) << ")";
}

inline bool same_bytes(const HostBuf& a, const HostBuf& b) {
  return a.n() == b.n() && a.v.dtype == b.v.dtype &&
         std::memcmp(a.v.data, b.v.data, static_cast<size_t>(a.n() * a.v.elem_size())) == 0;
}

// Rows [a, b) of a contiguous host buffer as its own buffer.
inline HostBuf host_rows(const HostBuf& h, int64_t a, int64_t b) {
  std::vector<int64_t> dims(h.v.shape.begin(), h.v.shape.begin() + h.v.ndim);
  const int64_t row = h.n() / dims[0] * h.v.elem_size();
  dims[0] = b - a;
  HostBuf r(h.v.dtype, dims);
  if (b > a) std::memcpy(r.bytes.data(), h.bytes.data() + a * row, static_cast<size_t>((b - a) * row));
  return r;
}

// The native attention kernel's tests: the cuDNN path is the default where the build
// has it (and has its own tests, test_attention_cudnn), so a test binary of the native
// kernel makes the shared backend (gpu()) run it, before main, with
//   const bool kNative = ls::cudatest::select_native_attention();
// (a test that wants cuDNN sets it on the backend for a scope: ScopedNumerics).
inline bool select_native_attention() {
  native_attention_wanted() = true;
  return true;
}

// Numerics with attention `path` ("native" | "cudnn" | "auto") and, for the native
// kernel, a variant ("4x1", "8x1", "4x2"; null: the default).
inline Numerics attention_numerics(const char* path, const char* variant = nullptr) {
  Numerics n;
  n.attention = parse_attention(path).value();
  if (variant != nullptr) n.native_variant = variant;
  return n;
}

// Sets a backend's numerics for a scope and puts the previous (resolved) settings back
// after: the tests that select an attention path or kernel variant leave the backend as
// they found it. status(): set_numerics's answer (a build without cuDNN refuses cudnn).
class ScopedNumerics {
 public:
  ScopedNumerics(Backend& b, const Numerics& n) : b_(b), old_(b.numerics()), old_diag_(b.diagnostics()) {
    status_ = b.set_numerics(n, old_diag_);
  }
  ~ScopedNumerics() { LS_CHECK_MSG(b_.set_numerics(old_, old_diag_).ok(), "ScopedNumerics: restoring failed"); }
  ScopedNumerics(const ScopedNumerics&) = delete;
  ScopedNumerics& operator=(const ScopedNumerics&) = delete;
  const Status& status() const { return status_; }

 private:
  Backend& b_;
  Numerics old_;
  Diagnostics old_diag_;
  Status status_;
};

}  // namespace ls::cudatest

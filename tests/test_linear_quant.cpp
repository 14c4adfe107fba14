// The CPU quantised linears (Backend::linear for int8_convrot and fp8_e4m3; backend.h,
// docs/numerics.md "Quantised linears"):
//  - bitwise (memcmp) against a plain scalar statement of the committed formulas, written
//    here with core/dtype.h and core/hadamard.h, not with the op's code;
//  - row-partition invariance for M in {1, 97, 300} (memcmp), thread-count invariance and
//    column slices (LinearWeight::rows, the Q/K/V rows of a fused weight);
//  - the fused swiglu input, bias (f32 and bf16), fp8 static and dynamic activation scales;
//  - the shared element functions: e4m3 encode/decode equal core/dtype.h's, lq_exp's error;
//  - the rotation convention: an int8 ConvRot weight made as W * H_G per group with a
//    per-row scale approximates x * W^T (so the model side and the op agree);
//  - every refusal (format, dtypes, group, scale shape, input_scale, swiglu, K limit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/linear_quant.h"
#include "backend/cpu/linear_quant_math.h"
#include "core/dtype.h"
#include "core/hadamard.h"
#include "core/thread_pool.h"

namespace ls {
namespace {

Backend& cpu() {
  static std::unique_ptr<Backend> b = make_cpu_backend();
  return *b;
}

template <typename T>
TensorView view(std::vector<T>& v, DType t, int64_t rows, int64_t cols) {
  return TensorView(v.data(), t, {rows, cols});
}
template <typename T>
TensorView view1(std::vector<T>& v, DType t, int64_t n) {
  return TensorView(v.data(), t, {n});
}

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed, float sd, float outlier_every = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float f = nd(rng);
    if (outlier_every > 0 && i % static_cast<int64_t>(outlier_every) == 3) f *= 40.0f;  // ConvRot's reason to exist
    v[static_cast<size_t>(i)] = f32_to_bf16(f);
  }
  return v;
}
std::vector<int8_t> random_i8(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(static_cast<size_t>(n));
  for (auto& e : v) e = static_cast<int8_t>(d(rng));
  return v;
}
std::vector<uint8_t> random_e4m3(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 60.0f);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& e : v) e = f32_to_f8e4m3(nd(rng));
  return v;
}
std::vector<float> random_f32(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = d(rng);
  return v;
}

// ---- the scalar reference: the formulas of backend.h, one element at a time ----------------
float ref_exp(float x) { return lq::lq_exp(x); }  // the definition (its accuracy is tested below)

float ref_bias(const TensorView* bias, int64_t n) {
  if (!bias) return 0.0f;
  return bias->dtype == DType::f32 ? static_cast<const float*>(bias->data)[n]
                                   : bf16_to_f32(static_cast<const uint16_t*>(bias->data)[n]);
}

// out bf16 [M, N] of the int8_convrot linear.
std::vector<uint16_t> ref_int8(const std::vector<uint16_t>& x, int64_t M, int64_t K, bool swiglu,
                               const std::vector<int8_t>& w, const std::vector<float>& sw, int64_t N, int64_t G,
                               const TensorView* bias) {
  std::vector<uint16_t> out(static_cast<size_t>(M * N));
  const int64_t xw = swiglu ? 2 * K : K;
  std::vector<float> v(static_cast<size_t>(K)), tmp(static_cast<size_t>(G));
  std::vector<int> q(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* xr = x.data() + m * xw;
    for (int64_t k = 0; k < K; ++k) {
      if (swiglu) {
        const float g = bf16_to_f32(xr[k]), u = bf16_to_f32(xr[K + k]);
        const float e = ref_exp(-g);
        const float den = 1.0f + e;
        const float s = g / den;
        v[static_cast<size_t>(k)] = s * u;
      } else {
        v[static_cast<size_t>(k)] = bf16_to_f32(xr[k]);
      }
    }
    for (int64_t g0 = 0; g0 < K; g0 += G) hadamard_f32(v.data() + g0, tmp.data(), G);
    float amax = 0.0f;
    for (float e : v)
      if (!std::isnan(e)) amax = std::max(amax, std::fabs(e));
    const float bf16max = bf16_to_f32(0x7f7f);
    const float sx = std::max(std::min(amax, bf16max) * (1.0f / 127.0f), 1e-30f);
    const float d = round_bf16(sx);
    for (int64_t k = 0; k < K; ++k) {
      float t = std::nearbyint(round_bf16(round_bf16(v[static_cast<size_t>(k)]) / d));
      q[static_cast<size_t>(k)] = std::isnan(t) ? 0 : static_cast<int>(std::clamp(t, -128.0f, 127.0f));
    }
    for (int64_t n = 0; n < N; ++n) {
      int64_t acc = 0;  // int64 here: checks that int32 never overflows for these sizes
      for (int64_t k = 0; k < K; ++k) acc += q[static_cast<size_t>(k)] * static_cast<int>(w[static_cast<size_t>(n * K + k)]);
      EXPECT_LE(std::llabs(acc), int64_t{1} << 31);
      const float s = sw.size() == 1 ? sw[0] : sw[static_cast<size_t>(n)];
      float y = (static_cast<float>(static_cast<int32_t>(acc)) * sx) * s;
      if (bias) y = y + ref_bias(bias, n);
      out[static_cast<size_t>(m * N + n)] = f32_to_bf16(y);
    }
  }
  return out;
}

// out bf16 [M, N] of the fp8_e4m3 linear (the dot16 order: 16 lane sums, then the tree).
std::vector<uint16_t> ref_fp8(const std::vector<uint16_t>& x, int64_t M, int64_t K, const std::vector<uint8_t>& w,
                              float sw, int64_t N, float input_scale, bool dynamic, const TensorView* bias) {
  std::vector<uint16_t> out(static_cast<size_t>(M * N));
  std::vector<float> q(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    float sa = input_scale;
    if (dynamic) {
      float amax = 0.0f;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(bf16_to_f32(x[static_cast<size_t>(m * K + k)])));
      sa = amax / 448.0f;
      if (!(sa > 0.0f)) sa = 1.0f;
    }
    for (int64_t k = 0; k < K; ++k) {
      const float xv = bf16_to_f32(x[static_cast<size_t>(m * K + k)]);
      q[static_cast<size_t>(k)] = f8e4m3_to_f32(f32_to_f8e4m3(sa == 1.0f ? xv : xv / sa));
    }
    for (int64_t n = 0; n < N; ++n) {
      float acc[16] = {};
      const int64_t padded = (K + 15) / 16 * 16;
      for (int64_t k = 0; k < padded; ++k) {
        const float a = k < K ? q[static_cast<size_t>(k)] : 0.0f;
        const float b = k < K ? f8e4m3_to_f32(w[static_cast<size_t>(n * K + k)]) : 0.0f;
        acc[k % 16] = acc[k % 16] + a * b;
      }
      float s8[8], s4[4];
      for (int l = 0; l < 8; ++l) s8[l] = acc[l] + acc[l + 8];
      for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
      const float sum = (s4[0] + s4[2]) + (s4[1] + s4[3]);
      float y = sum * (sa * sw);
      if (bias) y = y + ref_bias(bias, n);
      out[static_cast<size_t>(m * N + n)] = f32_to_bf16(y);
    }
  }
  return out;
}

int64_t count_distinct(const std::vector<uint16_t>& v) {
  std::vector<uint16_t> s = v;
  std::sort(s.begin(), s.end());
  return std::unique(s.begin(), s.end()) - s.begin();
}

// Row ranges [0, 1), [1, M/3), [M/3, M/3 + 1), [M/3 + 1, M) (the empty ones skipped) of an
// M-row op with N outputs a row: run(a, b) gives the rows of the whole call `full`.
template <typename Run>
void expect_row_ranges_same(const Run& run, const std::vector<uint16_t>& full, int64_t M, int64_t N) {
  const int64_t cuts[] = {0, 1, M / 3, M / 3 + 1, M};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const int64_t a = std::min(cuts[i], M), b = std::min(cuts[i + 1], M);
    if (a >= b) continue;
    const std::vector<uint16_t> part = run(a, b);
    EXPECT_EQ(0, std::memcmp(part.data(), full.data() + a * N, part.size() * 2)) << "M " << M << " rows " << a << ".." << b;
  }
}

// ---- the op through the backend ---------------------------------------------------------------
struct Int8Case {
  int64_t M, N, K, G;
  bool swiglu;
  int bias;  // 0 none, 1 f32, 2 bf16
  bool scalar_scale = false;
};

struct Int8Data {
  Int8Case c;
  std::vector<uint16_t> x;
  std::vector<int8_t> w;
  std::vector<float> sw;
  std::vector<float> bias_f32;
  std::vector<uint16_t> bias_bf16;
  TensorView bias_view;
  explicit Int8Data(const Int8Case& cs, uint32_t seed) : c(cs) {
    const int64_t xw = c.swiglu ? 2 * c.K : c.K;
    x = random_bf16(c.M * xw, seed, c.swiglu ? 2.0f : 1.0f, 37);
    w = random_i8(c.N * c.K, seed + 1);
    sw = c.scalar_scale ? std::vector<float>{0.0123f} : random_f32(c.N, seed + 2, 1e-3f, 2e-2f);
    if (c.bias == 1) {
      bias_f32 = random_f32(c.N, seed + 3, -3.0f, 3.0f);
      bias_view = view1(bias_f32, DType::f32, c.N);
    } else if (c.bias == 2) {
      bias_bf16 = random_bf16(c.N, seed + 3, 2.0f);
      bias_view = view1(bias_bf16, DType::bf16, c.N);
    }
  }
  const TensorView* bias() const { return c.bias ? &bias_view : nullptr; }
  LinearWeight weight() {
    LinearWeight lw;
    lw.format = WeightFormat::int8_convrot;
    lw.w = view(w, DType::i8, c.N, c.K);
    lw.scale = view1(sw, DType::f32, static_cast<int64_t>(sw.size()));
    lw.group = c.G;
    return lw;
  }
  // Rows [a, b) of the output.
  std::vector<uint16_t> run(int64_t a, int64_t b) {
    const int64_t xw = c.swiglu ? 2 * c.K : c.K;
    std::vector<uint16_t> out(static_cast<size_t>((b - a) * c.N), 0xdead);
    TensorView xv = view(x, DType::bf16, c.M, xw).slice_rows(a, b);
    LinearOptions o;
    o.swiglu_input = c.swiglu;
    Status s = cpu().linear(xv, weight(), bias(), view(out, DType::bf16, b - a, c.N), o);
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }
  std::vector<uint16_t> reference() { return ref_int8(x, c.M, c.K, c.swiglu, w, sw, c.N, c.G, bias()); }
};

TEST(LinearQuantCpu, Int8MatchesScalarReference) {
  const Int8Case cases[] = {
      {1, 5, 256, 256, false, 0},   {7, 67, 512, 256, false, 1}, {33, 19, 768, 64, false, 2},
      {5, 40, 256, 256, true, 0},   {9, 13, 1024, 64, true, 1},  {3, 130, 320, 64, false, 0, true},
      {17, 9, 96, 16, true, 2},     {2, 3, 64, 4, false, 0},
      // 1M outputs of a short K: an epilogue or rounding-order slip changes an fp32 last bit,
      // which survives the bf16 rounding only ~1 time in 2^16, so it takes this many to see it
      {128, 8192, 64, 64, false, 1},
  };
  uint32_t seed = 100;
  for (const Int8Case& c : cases) {
    Int8Data d(c, seed++);
    const std::vector<uint16_t> got = d.run(0, c.M), want = d.reference();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 2))
        << "M " << c.M << " N " << c.N << " K " << c.K << " G " << c.G << " swiglu " << c.swiglu << " bias " << c.bias;
    // Non-trivial: many distinct outputs.
    EXPECT_GT(count_distinct(got), std::min<int64_t>(20, c.M * c.N / 2)) << "K " << c.K;
  }
}

TEST(LinearQuantCpu, Int8LargeAccumulators) {
  // Rows whose rotated values are dominated by one element per group, and a weight aligned with the input makes |acc| exceed 2^24 (float(acc) then rounds).
  const int64_t M = 4, N = 3, K = 2048, G = 256;
  Int8Data d({M, N, K, G, false, 0}, 7);
  for (int64_t k = 0; k < K; ++k) d.x[static_cast<size_t>(k)] = f32_to_bf16((k % 256 == 0) ? -50.0f : 0.01f);
  // Row 1 of the weight: the quantised row 0 itself (computed by the reference path) so acc is large.
  std::vector<float> v(static_cast<size_t>(K)), tmp(static_cast<size_t>(G));
  for (int64_t k = 0; k < K; ++k) v[static_cast<size_t>(k)] = bf16_to_f32(d.x[static_cast<size_t>(k)]);
  for (int64_t g0 = 0; g0 < K; g0 += G) hadamard_f32(v.data() + g0, tmp.data(), G);
  float amax = 0.0f;
  for (float e : v) amax = std::max(amax, std::fabs(e));
  for (int64_t k = 0; k < K; ++k)
    d.w[static_cast<size_t>(K + k)] = static_cast<int8_t>(std::clamp(std::nearbyint(v[static_cast<size_t>(k)] / amax * 127.0f), -127.0f, 127.0f));
  const std::vector<uint16_t> got = d.run(0, M), want = d.reference();
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 2));
  // the accumulator of (row 0, column 1) is above 2^24
  EXPECT_GT(std::fabs(bf16_to_f32(got[1])) / (d.sw[1] * lq::lq_int8_scale(amax)), 16777216.0f);
}

TEST(LinearQuantCpu, Int8RowPartitionAndThreadInvariance) {
  for (int64_t M : {int64_t{1}, int64_t{97}, int64_t{300}}) {
    for (bool swiglu : {false, true}) {
      Int8Data d({M, 70, 512, 256, swiglu, 1}, static_cast<uint32_t>(M + swiglu));
      const std::vector<uint16_t> full = d.run(0, M);
      ASSERT_GT(count_distinct(full), 20);
      expect_row_ranges_same([&](int64_t a, int64_t b) { return d.run(a, b); }, full, M, 70);
      // single rows
      for (int64_t r : {int64_t{0}, M / 2, M - 1}) {
        const std::vector<uint16_t> one = d.run(r, r + 1);
        EXPECT_EQ(0, std::memcmp(one.data(), full.data() + r * 70, one.size() * 2)) << "row " << r;
      }
      for (int t : {1, 3}) {
        set_num_threads(t);
        const std::vector<uint16_t> again = d.run(0, M);
        set_num_threads(0);
        EXPECT_EQ(0, std::memcmp(again.data(), full.data(), full.size() * 2)) << t << " threads";
      }
    }
  }
}

TEST(LinearQuantCpu, Int8ColumnSlicesOfTheWeight) {
  Int8Data d({12, 90, 256, 64, false, 0}, 3);
  const std::vector<uint16_t> full = d.run(0, 12);
  for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 30}, {30, 60}, {61, 90}, {7, 8}}) {
    LinearWeight part = d.weight().rows(a, b);
    std::vector<uint16_t> out(static_cast<size_t>(12 * (b - a)));
    ASSERT_TRUE(cpu().linear(view(d.x, DType::bf16, 12, 256), part, nullptr, view(out, DType::bf16, 12, b - a)).ok());
    for (int64_t m = 0; m < 12; ++m)
      EXPECT_EQ(0, std::memcmp(out.data() + m * (b - a), full.data() + m * 90 + a, static_cast<size_t>(b - a) * 2))
          << "columns " << a << ".." << b << " row " << m;
  }
}

// The rotation convention (comfyui-and-quantized-weights.md §2.2): a weight stored as
// Q(W * H_G) with a per-row scale gives x * W^T up to the quantisation error.
TEST(LinearQuantCpu, Int8ApproximatesTheUnrotatedProduct) {
  const int64_t M = 6, N = 24, K = 1024, G = 256;
  std::vector<uint16_t> x = random_bf16(M * K, 11, 1.0f, 29);
  std::vector<float> W = random_f32(N * K, 12, -0.05f, 0.05f);
  std::vector<int8_t> wq(static_cast<size_t>(N * K));
  std::vector<float> sw(static_cast<size_t>(N)), tmp(static_cast<size_t>(G));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<float> row(W.begin() + n * K, W.begin() + (n + 1) * K);
    for (int64_t g0 = 0; g0 < K; g0 += G) hadamard_f32(row.data() + g0, tmp.data(), G);
    float amax = 0.0f;
    for (float e : row) amax = std::max(amax, std::fabs(e));
    sw[static_cast<size_t>(n)] = amax / 127.0f;
    for (int64_t k = 0; k < K; ++k)
      wq[static_cast<size_t>(n * K + k)] = static_cast<int8_t>(std::nearbyint(row[static_cast<size_t>(k)] / sw[static_cast<size_t>(n)]));
  }
  LinearWeight lw;
  lw.format = WeightFormat::int8_convrot;
  lw.w = view(wq, DType::i8, N, K);
  lw.scale = view1(sw, DType::f32, N);
  lw.group = G;
  std::vector<uint16_t> out(static_cast<size_t>(M * N));
  ASSERT_TRUE(cpu().linear(view(x, DType::bf16, M, K), lw, nullptr, view(out, DType::bf16, M, N)).ok());
  double num = 0, den = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k)
        ref += static_cast<double>(bf16_to_f32(x[static_cast<size_t>(m * K + k)])) * W[static_cast<size_t>(n * K + k)];
      const double e = bf16_to_f32(out[static_cast<size_t>(m * N + n)]) - ref;
      num += e * e;
      den += ref * ref;
    }
  const double rel = std::sqrt(num / den);
  std::printf("int8 ConvRot vs float64 x W^T: relative L2 %.3g\n", rel);
  EXPECT_LT(rel, 0.03);
  EXPECT_GT(den, 0.0);
}

// ---- fp8 --------------------------------------------------------------------------------------
struct Fp8Data {
  int64_t M, N, K;
  float input_scale;
  bool dynamic;
  int bias;
  std::vector<uint16_t> x;
  std::vector<uint8_t> w;
  std::vector<float> sw{0.0071f};
  std::vector<float> bias_f32;
  TensorView bias_view;
  Fp8Data(int64_t m, int64_t n, int64_t k, float is, bool dyn, int b, uint32_t seed)
      : M(m), N(n), K(k), input_scale(is), dynamic(dyn), bias(b) {
    x = random_bf16(M * K, seed, 3.0f, 41);  // outliers beyond 448 / s_a saturate
    w = random_e4m3(N * K, seed + 1);
    if (b) {
      bias_f32 = random_f32(N, seed + 2, -1.0f, 1.0f);
      bias_view = view1(bias_f32, DType::f32, N);
    }
  }
  LinearWeight weight() {
    LinearWeight lw;
    lw.format = WeightFormat::fp8_e4m3;
    lw.w = view(w, DType::f8e4m3, N, K);
    lw.scale = view1(sw, DType::f32, 1);
    lw.input_scale = input_scale;
    lw.dynamic_act = dynamic;
    return lw;
  }
  std::vector<uint16_t> run(int64_t a, int64_t b) {
    std::vector<uint16_t> out(static_cast<size_t>((b - a) * N), 0xdead);
    Status s = cpu().linear(view(x, DType::bf16, M, K).slice_rows(a, b), weight(), bias ? &bias_view : nullptr,
                            view(out, DType::bf16, b - a, N));
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }
  std::vector<uint16_t> reference() { return ref_fp8(x, M, K, w, sw[0], N, input_scale, dynamic, bias ? &bias_view : nullptr); }
};

TEST(LinearQuantCpu, Fp8MatchesScalarReference) {
  struct C {
    int64_t M, N, K;
    float s;
    bool dyn;
    int bias;
  } cases[] = {{1, 7, 64, 1.0f, false, 0}, {9, 33, 100, 1.0f, false, 1}, {5, 20, 517, 0.37f, false, 0},
               {13, 11, 256, 1.0f, true, 1}, {3, 70, 31, 2.5f, false, 1},
               {128, 8192, 32, 0.37f, false, 1}};  // 1M outputs: an epilogue-order slip shows
  uint32_t seed = 500;
  for (const C& c : cases) {
    Fp8Data d(c.M, c.N, c.K, c.s, c.dyn, c.bias, seed++);
    const std::vector<uint16_t> got = d.run(0, c.M), want = d.reference();
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 2)) << "M " << c.M << " K " << c.K << " s " << c.s;
    EXPECT_GT(count_distinct(got), std::min<int64_t>(20, c.M * c.N / 2));
  }
  // A zero row with a dynamic scale gives the bias (no 0/0).
  Fp8Data z(2, 5, 32, 1.0f, true, 1, 9);
  std::fill(z.x.begin(), z.x.begin() + 32, uint16_t{0});
  const std::vector<uint16_t> got = z.run(0, 2);
  for (int64_t n = 0; n < 5; ++n) EXPECT_EQ(got[static_cast<size_t>(n)], f32_to_bf16(z.bias_f32[static_cast<size_t>(n)]));
}

TEST(LinearQuantCpu, Fp8RowPartitionAndThreadInvariance) {
  for (int64_t M : {int64_t{1}, int64_t{97}, int64_t{300}}) {
    for (bool dyn : {false, true}) {
      Fp8Data d(M, 50, 200, 1.0f, dyn, 1, static_cast<uint32_t>(M * 3 + dyn));
      const std::vector<uint16_t> full = d.run(0, M);
      ASSERT_GT(count_distinct(full), 20);
      expect_row_ranges_same([&](int64_t a, int64_t b) { return d.run(a, b); }, full, M, 50);
      set_num_threads(1);
      const std::vector<uint16_t> again = d.run(0, M);
      set_num_threads(0);
      EXPECT_EQ(0, std::memcmp(again.data(), full.data(), full.size() * 2));
    }
  }
}

// ---- the shared element functions ----------------------------------------------------------------
TEST(LinearQuantCpu, E4m3EncodeDecodeEqualCoreDtype) {
  for (int c = 0; c < 256; ++c) {
    const float a = lq::lq_e4m3_to_f32(static_cast<uint8_t>(c)), b = f8e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(f32_bits(a), f32_bits(b)) << "code " << c;
  }
  int64_t checked = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 257) {  // a sweep over every exponent and sign
    const float f = f32_from_bits(static_cast<uint32_t>(u));
    ASSERT_EQ(lq::lq_f32_to_e4m3(f), f32_to_f8e4m3(f)) << std::hex << u;
    ++checked;
  }
  for (float f : {448.0f, 464.0f, 463.99f, -1e30f, std::numeric_limits<float>::infinity(), 0.0f, -0.0f, 1.0f / 1024,
                  3.0f / 2048, std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(lq::lq_f32_to_e4m3(f), f32_to_f8e4m3(f)) << f;
  EXPECT_GT(checked, 16000000);
}

TEST(LinearQuantCpu, ExpPolynomialAccuracy) {
  double worst = 0;
  for (float x = -103.0f; x < 88.7f; x += 0.0037f) {
    const double want = std::exp(static_cast<double>(x));
    const float got = lq::lq_exp(x);
    // ulps of the result (for subnormal results: of the smallest normal's spacing)
    const double ulp = std::max(std::ldexp(1.0, std::ilogb(want) - 23), std::ldexp(1.0, -149));
    worst = std::max(worst, std::fabs(got - want) / ulp);
  }
  std::printf("lq_exp: max error %.2f ulp over [-103, 88.7]\n", worst);
  EXPECT_LT(worst, 2.0);
  EXPECT_EQ(lq::lq_exp(0.0f), 1.0f);
  EXPECT_EQ(lq::lq_exp(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(lq::lq_exp(89.0f)));
  EXPECT_TRUE(std::isnan(lq::lq_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(lq::lq_exp(std::numeric_limits<float>::infinity())));
  EXPECT_EQ(lq::lq_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  // silu of every finite bf16 gate within 4 ulp of the float64 value
  double worst_silu = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float g = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isfinite(g) || std::fabs(g) > 80.0f || std::fabs(g) < 1e-30f) continue;
    const double want = g / (1.0 + std::exp(-static_cast<double>(g)));
    const float got = lq::lq_swiglu(g, 1.0f);
    if (want == 0) continue;
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst_silu = std::max(worst_silu, std::fabs(got - want) / ulp);
  }
  std::printf("lq_swiglu(g, 1): max error %.2f ulp over the finite bf16 gates |g| <= 80\n", worst_silu);
  EXPECT_LT(worst_silu, 4.0);
}

// ---- refusals ---------------------------------------------------------------------------------
Status try_linear(const LinearWeight& w, DType xt, DType ot, const TensorView* bias, bool swiglu, int64_t K, int64_t N) {
  static std::vector<uint8_t> xb(1 << 20), ob(1 << 20);
  const int64_t xw = swiglu ? 2 * K : K;
  TensorView x(xb.data(), xt, {2, xw}), out(ob.data(), ot, {2, N});
  LinearOptions o;
  o.swiglu_input = swiglu;
  return cpu().linear(x, w, bias, out, o);
}

void expect_refused(const Status& s, ErrorCode code, const std::string& needle) {
  ASSERT_FALSE(s.ok()) << "expected a refusal containing '" << needle << "'";
  EXPECT_EQ(s.error().code, code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(LinearQuantCpu, Refusals) {
  const int64_t N = 4, K = 256;
  std::vector<int8_t> wi(static_cast<size_t>(N * 1024 * 80));
  std::vector<uint8_t> wf(static_cast<size_t>(N * K));
  std::vector<uint16_t> wb(static_cast<size_t>(N * K));
  std::vector<float> s4(4, 0.01f), s1(1, 0.01f), s3(3, 0.01f);
  std::vector<int32_t> bi(4);
  // A weight of `format` over w with the scales s (one per row, or one).
  auto weight = [](WeightFormat format, const TensorView& w, std::vector<float>& s) {
    LinearWeight lw;
    lw.format = format;
    lw.w = w;
    lw.scale = TensorView(s.data(), DType::f32, {static_cast<int64_t>(s.size())});
    return lw;
  };
  auto i8w = [&](int64_t k, int64_t g, std::vector<float>& s) {
    LinearWeight lw = weight(WeightFormat::int8_convrot, TensorView(wi.data(), DType::i8, {N, k}), s);
    lw.group = g;
    return lw;
  };
  auto f8w = [&](std::vector<float>& s, float is) {
    LinearWeight lw = weight(WeightFormat::fp8_e4m3, TensorView(wf.data(), DType::f8e4m3, {N, K}), s);
    lw.input_scale = is;
    return lw;
  };
  // the good ones run
  EXPECT_TRUE(try_linear(i8w(K, 256, s4), DType::bf16, DType::bf16, nullptr, false, K, N).ok());
  EXPECT_TRUE(try_linear(i8w(K, 64, s1), DType::bf16, DType::bf16, nullptr, true, K, N).ok());
  EXPECT_TRUE(try_linear(f8w(s1, 0.5f), DType::bf16, DType::bf16, nullptr, false, K, N).ok());
  // unknown format
  LinearWeight bad = i8w(K, 256, s4);
  bad.format = static_cast<WeightFormat>(7);
  expect_refused(try_linear(bad, DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::unsupported,
                 "unknown weight format 7");
  // dtypes
  expect_refused(try_linear(i8w(K, 256, s4), DType::f32, DType::bf16, nullptr, false, K, N), ErrorCode::unsupported,
                 "x=f32");
  expect_refused(try_linear(i8w(K, 256, s4), DType::bf16, DType::f32, nullptr, false, K, N), ErrorCode::unsupported,
                 "out=f32");
  TensorView bias_i32(bi.data(), DType::i32, {N});
  expect_refused(try_linear(i8w(K, 256, s4), DType::bf16, DType::bf16, &bias_i32, false, K, N), ErrorCode::unsupported,
                 "bias=i32");
  LinearWeight wrong_w = i8w(K, 256, s4);
  wrong_w.w = TensorView(wb.data(), DType::bf16, {N, K});
  expect_refused(try_linear(wrong_w, DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::unsupported, "w=bf16");
  LinearWeight no_scale = i8w(K, 256, s4);
  no_scale.scale = TensorView();
  expect_refused(try_linear(no_scale, DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::unsupported,
                 "scale=none");
  LinearWeight f8_as_i8 = f8w(s1, 1.0f);
  f8_as_i8.format = WeightFormat::int8_convrot;
  f8_as_i8.group = 256;
  expect_refused(try_linear(f8_as_i8, DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::unsupported,
                 "w=f8e4m3");
  // groups
  expect_refused(try_linear(i8w(K, 32, s4), DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::invalid_argument,
                 "group 32 must be a power of 4");
  expect_refused(try_linear(i8w(320, 256, s4), DType::bf16, DType::bf16, nullptr, false, 320, N),
                 ErrorCode::invalid_argument, "dividing K = 320");
  expect_refused(try_linear(i8w(K, 0, s4), DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::invalid_argument,
                 "group 0");
  // scale shapes
  expect_refused(try_linear(i8w(K, 256, s3), DType::bf16, DType::bf16, nullptr, false, K, N),
                 ErrorCode::invalid_argument, "must have 1 or N = 4 elements");
  expect_refused(try_linear(f8w(s4, 1.0f), DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::invalid_argument,
                 "must be one value");
  // fp8 input scale, swiglu
  expect_refused(try_linear(f8w(s1, 0.0f), DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::invalid_argument,
                 "input_scale");
  expect_refused(try_linear(f8w(s1, std::numeric_limits<float>::quiet_NaN()), DType::bf16, DType::bf16, nullptr, false,
                            K, N),
                 ErrorCode::invalid_argument, "input_scale");
  expect_refused(try_linear(f8w(s1, 1.0f), DType::bf16, DType::bf16, nullptr, true, K, N), ErrorCode::unsupported,
                 "swiglu");
  LinearWeight plain(TensorView(wb.data(), DType::bf16, {N, K}));
  expect_refused(try_linear(plain, DType::bf16, DType::bf16, nullptr, true, K, N), ErrorCode::unsupported, "swiglu");
  // K limit
  const int64_t big = kLinearQuantMaxK + 1024;
  std::vector<uint8_t> xb(static_cast<size_t>(2 * big * 2)), ob(16);
  LinearWeight huge = i8w(big, 1024, s4);
  expect_refused(cpu().linear(TensorView(xb.data(), DType::bf16, {1, big}), huge, nullptr,
                              TensorView(ob.data(), DType::bf16, {1, N})),
                 ErrorCode::unsupported, "K = 66560");
  // device: a view on another device
  LinearWeight on_gpu = i8w(K, 256, s4);
  on_gpu.w.device = Device{DeviceKind::cuda, 0};
  expect_refused(try_linear(on_gpu, DType::bf16, DType::bf16, nullptr, false, K, N), ErrorCode::unsupported,
                 "host memory");
}

}  // namespace
}  // namespace ls

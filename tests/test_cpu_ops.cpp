// CPU reference ops against float64 references (DESIGN.md §4).
//
// For each op: a plain double reference (rounding only at the contract's rounding
// points, or none where noted), a naive same-precision implementation (fp32, sequential
// sums), and the CPU backend. The backend's error must be at most 2x the naive one;
// where every step is a contract rounding point the backend must match the reference
// bit for bit. GEMM and attention are also checked bit for bit against a scalar
// statement of the documented reduction order ("use_ref", style-lessons §4). Sizes are
// awkward (rows 1, 97, 1025; odd widths) and inputs are checked non-zero.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"
#include "test_cpu_ops_util.h"

namespace ls {
namespace {

using test::ErrStats;
using test::get;
using test::HostTensor;
using test::set;

std::unique_ptr<Backend>& cpu() {
  static std::unique_ptr<Backend> b = make_cpu_backend();
  return b;
}

float round_to(DType t, float v) { return t == DType::bf16 ? round_bf16(v) : v; }

// ---------------------------------------------------------------------------- GEMM
struct GemmCase {
  int64_t M, N, K;
  DType x, w, out;
  bool has_bias;
  DType bias;
};

class CpuGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CpuGemm, ErrorVsFloat64AndDocumentedOrder) {
  const GemmCase c = GetParam();
  std::mt19937_64 rng(1234 + static_cast<uint64_t>(c.M * 31 + c.N * 7 + c.K));
  HostTensor x(c.x, {c.M, c.K}), w(c.w, {c.N, c.K}), bias(c.bias, {c.N}), out(c.out, {c.M, c.N});
  test::fill_uniform(x, rng, -1.0, 1.0);
  test::fill_uniform(w, rng, -1.0, 1.0);
  test::fill_uniform(bias, rng, -0.5, 0.5);
  ASSERT_GT(test::count_nonzero(x), c.M * c.K / 2);
  ASSERT_GT(test::count_nonzero(w), c.N * c.K / 2);
  ASSERT_TRUE(cpu()->gemm(x, w, c.has_bias ? &bias.view() : nullptr, out).ok());
  ASSERT_TRUE(out.guards_intact());

  ErrStats ours, naive;
  int64_t order_mismatch = 0, bound_violations = 0;
  std::vector<float> xr(static_cast<size_t>(c.K)), wr(static_cast<size_t>(c.K));
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t k = 0; k < c.K; ++k) xr[static_cast<size_t>(k)] = static_cast<float>(get(x, m * c.K + k));
    for (int64_t n = 0; n < c.N; ++n) {
      double ref = 0.0, abs_sum = 0.0;
      float seq = 0.0f;
      for (int64_t k = 0; k < c.K; ++k) {
        wr[static_cast<size_t>(k)] = static_cast<float>(get(w, n * c.K + k));
        const double p = static_cast<double>(xr[static_cast<size_t>(k)]) * wr[static_cast<size_t>(k)];
        ref += p;
        abs_sum += std::fabs(p);
        seq = seq + xr[static_cast<size_t>(k)] * wr[static_cast<size_t>(k)];
      }
      const float b = c.has_bias ? static_cast<float>(get(bias, n)) : 0.0f;
      ref += b;
      const double got = get(out, m * c.N + n);
      ours.add(got, ref);
      naive.add(round_to(c.out, seq + b), ref);
      // the documented order, stated as a scalar loop
      const float ordered = round_to(c.out, cpu::dot16_reference(xr.data(), wr.data(), c.K) + b);
      order_mismatch += got != static_cast<double>(ordered);
      // rigorous bound of the 16-lane sum: each term passes through at most
      // K/16 + 1 lane additions, 4 tree additions, 1 bias addition (unit roundoff u).
      const double u = std::ldexp(1.0, -24);
      const double steps = static_cast<double>(c.K / 16 + 7);
      double bound = steps * u * (abs_sum + std::fabs(b)) * 1.001;
      if (c.out == DType::bf16) bound += std::ldexp(1.0, -8) * std::fabs(ref) + bound;
      bound_violations += std::fabs(got - ref) > bound;
    }
  }
  EXPECT_EQ(order_mismatch, 0) << "elements differing from the documented 16-lane order";
  EXPECT_EQ(bound_violations, 0);
  EXPECT_LE(ours.max_abs, 2.0 * naive.max_abs) << "naive fp32 max err " << naive.max_abs;
  EXPECT_LE(ours.rms(), 2.0 * naive.rms());
  std::printf("gemm M=%lld N=%lld K=%lld %s*%s->%s: max err %.3g (naive %.3g), rms %.3g (naive %.3g)\n",
              static_cast<long long>(c.M), static_cast<long long>(c.N), static_cast<long long>(c.K),
              dtype_name(c.x), dtype_name(c.w), dtype_name(c.out), ours.max_abs, naive.max_abs, ours.rms(),
              naive.rms());
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, CpuGemm,
    ::testing::Values(GemmCase{1, 37, 517, DType::bf16, DType::bf16, DType::bf16, true, DType::f32},
                      GemmCase{97, 45, 131, DType::bf16, DType::bf16, DType::bf16, true, DType::bf16},
                      GemmCase{1025, 11, 67, DType::bf16, DType::bf16, DType::bf16, false, DType::f32},
                      GemmCase{97, 29, 1000, DType::bf16, DType::bf16, DType::f32, true, DType::bf16},
                      GemmCase{13, 7, 2053, DType::bf16, DType::bf16, DType::f32, false, DType::f32},
                      GemmCase{97, 23, 261, DType::f32, DType::f32, DType::f32, true, DType::f32},
                      GemmCase{1, 33, 256, DType::f32, DType::f32, DType::bf16, true, DType::f32},
                      GemmCase{33, 19, 300, DType::f32, DType::bf16, DType::f32, true, DType::f32},
                      GemmCase{5, 3, 15, DType::bf16, DType::bf16, DType::f32, true, DType::f32},
                      GemmCase{2, 2, 1, DType::f32, DType::bf16, DType::bf16, false, DType::f32}),
    [](const ::testing::TestParamInfo<GemmCase>& param_info) {
      const GemmCase& c = param_info.param;
      std::string n = test::sizes_name({{"M", c.M}, {"N", c.N}, {"K", c.K}});
      n += std::string("_") + dtype_name(c.x) + "_" + dtype_name(c.w) + "_to_" + dtype_name(c.out);
      n += c.has_bias ? std::string("_bias_") + dtype_name(c.bias) : std::string("_nobias");
      return n;
    });

TEST(CpuGemm, IntegerInputsAreExact) {
  // |x|, |w| <= 8, K = 301: every partial sum is an integer below 2^24, so any order is
  // exact and the result must equal the integer sum.
  const int64_t M = 97, N = 21, K = 301;
  std::mt19937_64 rng(7);
  HostTensor x(DType::bf16, {M, K}), w(DType::bf16, {N, K}), bias(DType::f32, {N}), out(DType::f32, {M, N});
  test::fill_int(x, rng, -8, 8);
  test::fill_int(w, rng, -8, 8);
  test::fill_int(bias, rng, -100, 100);
  ASSERT_GT(test::count_nonzero(x), 0);
  ASSERT_GT(test::count_nonzero(w), 0);
  ASSERT_TRUE(cpu()->gemm(x, w, &bias.view(), out).ok());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      int64_t s = static_cast<int64_t>(get(bias, n));
      for (int64_t k = 0; k < K; ++k)
        s += static_cast<int64_t>(get(x, m * K + k)) * static_cast<int64_t>(get(w, n * K + k));
      ASSERT_EQ(get(out, m * N + n), static_cast<double>(s)) << m << "," << n;
    }
}

TEST(CpuGemm, UnsupportedDtypesReturnStatus) {
  HostTensor x(DType::bf16, {2, 4}), w(DType::f32, {3, 4}), out(DType::bf16, {2, 3});
  Status s = cpu()->gemm(x, w, nullptr, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::unsupported);
  EXPECT_NE(s.message().find("gemm"), std::string::npos);
  EXPECT_NE(s.message().find("w=f32"), std::string::npos);
  HostTensor out16(DType::f16, {2, 3}), wb(DType::bf16, {3, 4});
  EXPECT_EQ(cpu()->gemm(x, wb, nullptr, out16).error().code, ErrorCode::unsupported);
}

// ------------------------------------------------------------------------ RMSNorm
void rms_norm_case(int64_t M, int64_t D) {
  const float eps = 1e-5f;
  std::mt19937_64 rng(static_cast<uint64_t>(M * 1000 + D));
  HostTensor x(DType::bf16, {M, D}), w(DType::bf16, {D}), out(DType::bf16, {M, D}), inplace(DType::bf16, {M, D});
  test::fill_uniform(x, rng, -2.0, 2.0);
  test::fill_uniform(w, rng, 0.5, 1.5);
  ASSERT_GT(test::count_nonzero(x), M * D / 2);
  ASSERT_TRUE(cpu()->rms_norm(x, w, eps, out).ok());
  ASSERT_TRUE(out.guards_intact());
  std::memcpy(inplace.data(), x.data(), x.bytes());
  ASSERT_TRUE(cpu()->rms_norm(inplace, w, eps, inplace).ok());
  EXPECT_TRUE(test::same_bytes(inplace, out)) << "in place differs from out of place";

  ErrStats ours, naive;
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0.0;
    float ss32 = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const double v = get(x, m * D + d);
      ss += v * v;
      ss32 = ss32 + static_cast<float>(v) * static_cast<float>(v);
    }
    const double rrms = 1.0 / std::sqrt(ss / static_cast<double>(D) + static_cast<double>(eps));
    const float rrms32 = 1.0f / std::sqrt(ss32 / static_cast<float>(D) + eps);
    for (int64_t d = 0; d < D; ++d) {
      const double v = get(x, m * D + d), wv = get(w, d);
      const double ref = v * rrms * wv;
      ours.add(get(out, m * D + d), ref);
      naive.add(round_bf16(static_cast<float>(v) * rrms32 * static_cast<float>(wv)), ref);
    }
  }
  EXPECT_LE(ours.max_abs, 2.0 * naive.max_abs);
  EXPECT_LE(ours.rms(), 2.0 * naive.rms());
  std::printf("rms_norm M=%lld D=%lld: max err %.3g (naive %.3g) rms %.3g (naive %.3g)\n", static_cast<long long>(M),
              static_cast<long long>(D), ours.max_abs, naive.max_abs, ours.rms(), naive.rms());
}
TEST(CpuRmsNorm, ErrorVsFloat64) {
  rms_norm_case(1, 5376);
  rms_norm_case(97, 517);
  rms_norm_case(1025, 33);
}

// -------------------------------------------------------------- q/k norm + RoPE
void qk_norm_rope_case(int64_t M, int64_t H, int64_t Dh, int64_t P) {
  const float eps = 1e-5f;
  std::mt19937_64 rng(static_cast<uint64_t>(M * 7 + H * 3 + Dh + P));
  // q is the first third of a fused qkv buffer [M, 3 * H * Dh], viewed [M, H, Dh].
  HostTensor qkv(DType::bf16, {M, 3 * H * Dh}), w(DType::bf16, {Dh}), rope(DType::bf16, {M, std::max<int64_t>(P, 1), 2});
  test::fill_uniform(qkv, rng, -3.0, 3.0);
  test::fill_uniform(w, rng, 0.5, 1.5);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < P; ++j) {
      const double ang = static_cast<double>(m) * std::pow(10000.0, -static_cast<double>(j) / std::max<int64_t>(P, 1));
      set(rope, (m * P + j) * 2, std::cos(ang));
      set(rope, (m * P + j) * 2 + 1, std::sin(ang));
    }
  ASSERT_GT(test::count_nonzero(qkv), M * H * Dh);
  std::vector<uint8_t> before(qkv.bytes());
  std::memcpy(before.data(), qkv.data(), qkv.bytes());
  const TensorView q = qkv.view().cols(0, H * Dh).unflatten_last(H, Dh);
  TensorView rv = rope.view();
  if (P == 0) rv = TensorView();
  ASSERT_TRUE(cpu()->qk_norm_rope(q, w, rv, eps).ok());
  ASSERT_TRUE(qkv.guards_intact());
  // k and v columns untouched
  const size_t row_bytes = static_cast<size_t>(3 * H * Dh * 2), q_bytes = static_cast<size_t>(H * Dh * 2);
  for (int64_t m = 0; m < M; ++m)
    ASSERT_EQ(std::memcmp(before.data() + m * row_bytes + q_bytes,
                          static_cast<uint8_t*>(qkv.data()) + m * row_bytes + q_bytes, row_bytes - q_bytes),
              0);

  ErrStats ours, naive;
  const auto old = [&](int64_t m, int64_t h, int64_t d) {
    uint16_t b;
    std::memcpy(&b, before.data() + m * row_bytes + static_cast<size_t>((h * Dh + d) * 2), 2);
    return bf16_to_f32(b);
  };
  std::vector<double> n_exact(static_cast<size_t>(Dh));
  std::vector<float> n_naive(static_cast<size_t>(Dh));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < H; ++h) {
      double ss = 0.0;
      float ss32 = 0.0f;
      for (int64_t d = 0; d < Dh; ++d) {
        const float v = old(m, h, d);
        ss += static_cast<double>(v) * v;
        ss32 = ss32 + v * v;
      }
      const double rrms = 1.0 / std::sqrt(ss / static_cast<double>(Dh) + static_cast<double>(eps));
      const float rrms32 = 1.0f / std::sqrt(ss32 / static_cast<float>(Dh) + eps);
      for (int64_t d = 0; d < Dh; ++d) {
        n_exact[static_cast<size_t>(d)] = static_cast<double>(old(m, h, d)) * rrms * get(w, d);
        n_naive[static_cast<size_t>(d)] = round_bf16(old(m, h, d) * rrms32 * static_cast<float>(get(w, d)));
      }
      for (int64_t d = 0; d < Dh; ++d) {
        double ref = n_exact[static_cast<size_t>(d)];
        float nv = n_naive[static_cast<size_t>(d)];
        if (d < 2 * P) {
          const int64_t j = d < P ? d : d - P;
          const double c = get(rope, (m * P + j) * 2), s = get(rope, (m * P + j) * 2 + 1);
          const double x0 = n_exact[static_cast<size_t>(j)], x1 = n_exact[static_cast<size_t>(j + P)];
          const float a0 = n_naive[static_cast<size_t>(j)], a1 = n_naive[static_cast<size_t>(j + P)];
          const float c32 = static_cast<float>(c), s32 = static_cast<float>(s);
          ref = d < P ? c * x0 - s * x1 : s * x0 + c * x1;
          nv = round_bf16(d < P ? c32 * a0 - s32 * a1 : s32 * a0 + c32 * a1);
        }
        ours.add(static_cast<double>(load_as_f32(q.at(m, h, d), DType::bf16, 0)), ref);
        naive.add(nv, ref);
      }
    }
  EXPECT_LE(ours.max_abs, 2.0 * naive.max_abs);
  EXPECT_LE(ours.rms(), 2.0 * naive.rms());
  std::printf("qk_norm_rope M=%lld H=%lld Dh=%lld P=%lld: max err %.3g (naive %.3g) rms %.3g (naive %.3g)\n",
              static_cast<long long>(M), static_cast<long long>(H), static_cast<long long>(Dh),
              static_cast<long long>(P), ours.max_abs, naive.max_abs, ours.rms(), naive.rms());
}
TEST(CpuQkNormRope, ErrorVsFloat64) {
  qk_norm_rope_case(97, 3, 128, 48);  // H3: rot_dim 96 of 128
  qk_norm_rope_case(1, 2, 128, 48);
  qk_norm_rope_case(1025, 1, 40, 7);
  qk_norm_rope_case(33, 2, 37, 0);  // no rope (token refiner)
}

// ---------------------------------------------------- modulate / gated_add / add
// Every step of these ops is a contract rounding point, so a double reference with
// the same rounding points (fp32 steps emulated by rounding the exact double result)
// must match bit for bit.
double f32r(double v) { return static_cast<double>(static_cast<float>(v)); }

void modulate_case(int64_t M, int64_t D, int64_t R, DType table, DType out_t) {
  std::mt19937_64 rng(static_cast<uint64_t>(M + D + R));
  // shift and scale are column slices of one AdaLN output [R, 6 D].
  HostTensor in(DType::bf16, {M, D}), ada(table, {R, 6 * D}), rows(DType::i32, {M}), out(out_t, {M, D});
  test::fill_uniform(in, rng, -4.0, 4.0);
  test::fill_uniform(ada, rng, -1.0, 1.0);
  test::fill_int(rows, rng, 0, static_cast<int>(R - 1));
  ASSERT_GT(test::count_nonzero(in), M * D / 2);
  ASSERT_GT(test::count_nonzero(ada), R * D);
  const TensorView shift = ada.view().cols(0, D), scale = ada.view().cols(D, 2 * D);
  ASSERT_TRUE(cpu()->modulate(in, shift, scale, rows, out).ok());
  ASSERT_TRUE(out.guards_intact());
  int64_t mismatches = 0;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t r = static_cast<int64_t>(get(rows, m));
    for (int64_t d = 0; d < D; ++d) {
      const double x = get(in, m * D + d), sc = get(scale, r * D + d), sh = get(shift, r * D + d);
      double ref;
      if (out_t == DType::bf16) {
        const double s1 = test::round_bf16_exact(1.0 + test::round_bf16_exact(sc));
        ref = test::round_bf16_exact(test::round_bf16_exact(x * s1) + test::round_bf16_exact(sh));
      } else {
        ref = f32r(f32r(x * f32r(1.0 + sc)) + sh);
      }
      mismatches += get(out, m * D + d) != ref;
    }
  }
  EXPECT_EQ(mismatches, 0);
  // in place gives the same bytes (bf16 out only: in is bf16)
  if (out_t == DType::bf16) {
    HostTensor inplace(DType::bf16, {M, D});
    std::memcpy(inplace.data(), in.data(), in.bytes());
    ASSERT_TRUE(cpu()->modulate(inplace, shift, scale, rows, inplace).ok());
    EXPECT_TRUE(test::same_bytes(inplace, out));
  }
}
TEST(CpuModulate, MatchesFloat64AtRoundingPoints) {
  modulate_case(97, 517, 3, DType::bf16, DType::bf16);
  modulate_case(1, 5376, 1, DType::bf16, DType::bf16);
  modulate_case(1025, 33, 7, DType::f32, DType::bf16);
  modulate_case(97, 96, 2, DType::f32, DType::f32);
}
TEST(CpuModulate, Bf16TablesWithF32OutIsUnsupported) {
  HostTensor in(DType::bf16, {2, 8}), t(DType::bf16, {1, 8}), rows(DType::i32, {2}), out(DType::f32, {2, 8});
  Status s = cpu()->modulate(in, t, t, rows, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::unsupported);
  EXPECT_NE(s.message().find("modulate"), std::string::npos);
}

// rms_norm_modulate: the Backend default (the CPU's) is rms_norm then modulate in place,
// byte for byte; the CUDA kernel is held to these bytes by tests/cuda/test_backend_ops.
void rms_norm_modulate_case(int64_t M, int64_t D, int64_t R, DType table) {
  const float eps = 1e-5f;
  std::mt19937_64 rng(static_cast<uint64_t>(M * 31 + D + R));
  HostTensor x(DType::bf16, {M, D}), w(DType::bf16, {D}), ada(table, {R, 6 * D}), rows(DType::i32, {M});
  HostTensor out(DType::bf16, {M, D}), comp(DType::bf16, {M, D}), inplace(DType::bf16, {M, D});
  test::fill_uniform(x, rng, -2.0, 2.0);
  test::fill_uniform(w, rng, 0.5, 1.5);
  test::fill_uniform(ada, rng, -1.0, 1.0);
  test::fill_int(rows, rng, 0, static_cast<int>(R - 1));
  ASSERT_GT(test::count_nonzero(x), M * D / 2);
  const TensorView shift = ada.view().cols(3 * D, 4 * D), scale = ada.view().cols(4 * D, 5 * D);  // *_mlp chunks
  ASSERT_TRUE(cpu()->rms_norm_modulate(x, w, eps, shift, scale, rows, out).ok());
  ASSERT_TRUE(out.guards_intact());
  ASSERT_GT(test::count_nonzero(out), M * D / 2);
  ASSERT_TRUE(cpu()->rms_norm(x, w, eps, comp).ok());
  ASSERT_TRUE(cpu()->modulate(comp, shift, scale, rows, comp).ok());
  EXPECT_TRUE(test::same_bytes(out, comp)) << "rms_norm_modulate differs from rms_norm then modulate";
  std::memcpy(inplace.data(), x.data(), x.bytes());
  ASSERT_TRUE(cpu()->rms_norm_modulate(inplace, w, eps, shift, scale, rows, inplace).ok());
  EXPECT_TRUE(test::same_bytes(inplace, out)) << "in place differs from out of place";
  ASSERT_TRUE(inplace.guards_intact());
}
TEST(CpuRmsNormModulate, DefaultIsTheComposition) {
  rms_norm_modulate_case(1, 5376, 1, DType::bf16);
  rms_norm_modulate_case(97, 517, 3, DType::f32);
  rms_norm_modulate_case(1025, 33, 7, DType::bf16);
}
TEST(CpuRmsNormModulate, F32OutIsUnsupported) {
  HostTensor x(DType::bf16, {2, 8}), w(DType::bf16, {8}), t(DType::f32, {1, 8}), rows(DType::i32, {2});
  HostTensor out(DType::f32, {2, 8});
  const Status s = cpu()->rms_norm_modulate(x, w, 1e-5f, t, t, rows, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::unsupported);
}

void gated_add_case(int64_t M, int64_t D, int64_t R, DType table) {
  std::mt19937_64 rng(static_cast<uint64_t>(M * 5 + D + R));
  HostTensor x(DType::bf16, {M, D}), y(DType::bf16, {M, D}), ada(table, {R, 3 * D}), rows(DType::i32, {M});
  test::fill_uniform(x, rng, -8.0, 8.0);
  test::fill_uniform(y, rng, -2.0, 2.0);
  test::fill_uniform(ada, rng, -1.0, 1.0);
  test::fill_int(rows, rng, 0, static_cast<int>(R - 1));
  ASSERT_GT(test::count_nonzero(y), M * D / 2);
  ASSERT_GT(test::count_nonzero(ada), R * D);
  std::vector<double> x0(static_cast<size_t>(M * D));
  for (int64_t i = 0; i < M * D; ++i) x0[static_cast<size_t>(i)] = get(x, i);
  const TensorView gate = ada.view().cols(2 * D, 3 * D);
  ASSERT_TRUE(cpu()->gated_add(x, y, gate, rows).ok());
  ASSERT_TRUE(x.guards_intact());
  int64_t mismatches = 0, changed = 0;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t r = static_cast<int64_t>(get(rows, m));
    for (int64_t d = 0; d < D; ++d) {
      const double g = test::round_bf16_exact(get(gate, r * D + d));
      // y * g is exact in double (8 + 8 significand bits) and so is the sum here; the
      // fma rounds once to fp32, then once to bf16.
      const double ref = test::round_bf16_exact(f32r(get(y, m * D + d) * g + x0[static_cast<size_t>(m * D + d)]));
      const double got = get(x, m * D + d);
      mismatches += got != ref;
      changed += got != x0[static_cast<size_t>(m * D + d)];
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(changed, M * D / 2);
}
TEST(CpuGatedAdd, MatchesFloat64AtRoundingPoints) {
  gated_add_case(97, 517, 3, DType::bf16);
  gated_add_case(1, 5376, 2, DType::f32);
  gated_add_case(1025, 33, 5, DType::bf16);
}

TEST(CpuAdd, MatchesFloat64AtRoundingPoints) {
  for (DType t : {DType::bf16, DType::f32}) {
    const int64_t M = 97, D = 131;
    std::mt19937_64 rng(3);
    HostTensor x(t, {M, D}), y(t, {M, D});
    test::fill_uniform(x, rng, -4.0, 4.0);
    test::fill_uniform(y, rng, -4.0, 4.0);
    ASSERT_GT(test::count_nonzero(y), M * D / 2);
    std::vector<double> x0(static_cast<size_t>(M * D));
    for (int64_t i = 0; i < M * D; ++i) x0[static_cast<size_t>(i)] = get(x, i);
    ASSERT_TRUE(cpu()->add(x, y).ok());
    int64_t mismatches = 0;
    for (int64_t i = 0; i < M * D; ++i) {
      double ref = f32r(x0[static_cast<size_t>(i)] + get(y, i));
      if (t == DType::bf16) ref = test::round_bf16_exact(ref);
      mismatches += get(x, i) != ref;
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(t);
  }
}

// ------------------------------------------------------------------ swiglu, silu
TEST(CpuSwiglu, WithinOneUlpOfFloat64AtRoundingPoints) {
  // The reference computes silu in double; the op in fp32 (expf). They can only
  // disagree where the fp32 silu lands on the other side of a bf16 rounding boundary,
  // i.e. by one bf16 ulp of the intermediate, and rarely.
  for (int64_t M : {int64_t{1}, int64_t{97}, int64_t{1025}}) {
    const int64_t F = M == 1025 ? 33 : 517;
    std::mt19937_64 rng(static_cast<uint64_t>(M));
    HostTensor u(DType::bf16, {M, 2 * F}), out(DType::bf16, {M, F});
    test::fill_uniform(u, rng, -6.0, 6.0);
    ASSERT_GT(test::count_nonzero(u), M * F);
    ASSERT_TRUE(cpu()->swiglu(u, out).ok());
    ASSERT_TRUE(out.guards_intact());
    int64_t off = 0, far = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < F; ++i) {
        const double g = get(u, m * 2 * F + i), up = get(u, m * 2 * F + F + i);
        const double s = test::round_bf16_exact(g / (1.0 + std::exp(-g)));
        const double ref = test::round_bf16_exact(s * up);
        const double got = get(out, m * F + i);
        if (got != ref) {
          ++off;
          far += std::fabs(got - ref) > 1.01 * (test::bf16_ulp(s) * std::fabs(up) + test::bf16_ulp(ref));
        }
      }
    EXPECT_EQ(far, 0);
    EXPECT_LE(off, M * F / 100 + 1) << "more than 1% of elements off by a rounding";
  }
}

TEST(CpuSilu, RelativeErrorWithinFewUlps) {
  // expf (<= 1 ulp in glibc), the add and the divide (0.5 ulp each), and silu's
  // condition number (< 2 away from its zero at g = 0... which is exact) give
  // |err| <= 6 ulp of the result; we assert 8 * 2^-24 relative.
  const int64_t M = 97, N = 131;
  std::mt19937_64 rng(11);
  HostTensor x(DType::f32, {M, N});
  test::fill_uniform(x, rng, -20.0, 20.0);
  ASSERT_GT(test::count_nonzero(x), M * N / 2);
  std::vector<double> x0(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M * N; ++i) x0[static_cast<size_t>(i)] = get(x, i);
  ASSERT_TRUE(cpu()->silu(x).ok());
  double worst = 0.0;
  for (int64_t i = 0; i < M * N; ++i) {
    const double g = x0[static_cast<size_t>(i)];
    const double ref = g / (1.0 + std::exp(-g));
    worst = std::max(worst, std::fabs(get(x, i) - ref) / std::fabs(ref));
  }
  EXPECT_LE(worst, 8.0 * std::ldexp(1.0, -24));
  std::printf("silu: max relative error %.3g (%.2f ulp)\n", worst, worst / std::ldexp(1.0, -24));
}

// --------------------------------------------------------------- time embedding
TEST(CpuTimeEmbedding, MatchesFloat64AtPytorchRoundingPoints) {
  // Reference: PyTorch's fp32 steps for freq and arg, then exp/cos/sin in double. The
  // op uses expf/cosf/sinf; for |arg| <= 1 their errors give < 4e-7 absolute.
  const int64_t M = 97, N = 256, half = N / 2;
  std::mt19937_64 rng(5);
  HostTensor t(DType::f32, {M}), out(DType::f32, {M, N});
  test::fill_uniform(t, rng, 0.0, 1.0);
  ASSERT_GT(test::count_nonzero(t), M / 2);
  ASSERT_TRUE(cpu()->time_embedding(t, out).ok());
  ASSERT_TRUE(out.guards_intact());
  const float c = static_cast<float>(-std::log(10000.0));
  double worst = 0.0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < half; ++j) {
      const float e = (c * static_cast<float>(j)) / static_cast<float>(half);
      const float freq = static_cast<float>(std::exp(static_cast<double>(e)));
      const float arg = static_cast<float>(get(t, m)) * freq;
      worst = std::max(worst, std::fabs(get(out, m * N + j) - std::cos(static_cast<double>(arg))));
      worst = std::max(worst, std::fabs(get(out, m * N + half + j) - std::sin(static_cast<double>(arg))));
    }
  EXPECT_LE(worst, 4e-7);
  HostTensor odd(DType::f32, {M, 7});
  EXPECT_EQ(cpu()->time_embedding(t, odd).error().code, ErrorCode::unsupported);
}

// ---------------------------------------------------------------------- convert
TEST(CpuConvert, RoundsOnceAndHandlesStridedRows) {
  const int64_t M = 97, D = 45;
  std::mt19937_64 rng(9);
  // src: f64 [M, 2D] of which we convert the second half columns (row-strided view).
  HostTensor src(DType::f64, {M, 2 * D}), dst_bf16(DType::bf16, {M, D}), dst_f16(DType::f16, {M, D});
  test::fill_uniform(src, rng, -100.0, 100.0);
  // plant exact bf16 ties nudged by less than half an fp32 ulp: rounding f64 -> f32
  // first would land on the tie and then round to even (wrong).
  for (int64_t m = 0; m < M; ++m) {
    const double base = 1.0 + static_cast<double>(m % 64) / 64.0;  // a bf16 value with spare bits
    const double tie = base + std::ldexp(1.0, -8);                  // halfway to the next bf16
    set(src.view(), m * 2 * D + D, tie + std::ldexp(1.0, -40) * (m % 2 ? 1 : -1));
  }
  ASSERT_GT(test::count_nonzero(src), M * D);
  const TensorView s = src.view().cols(D, 2 * D);
  ASSERT_TRUE(cpu()->convert(s, dst_bf16).ok());
  ASSERT_TRUE(cpu()->convert(s, dst_f16).ok());
  ASSERT_TRUE(dst_bf16.guards_intact() && dst_f16.guards_intact());
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t d = 0; d < D; ++d) {
      const double v = get(s, m * D + d);
      bad += get(dst_bf16, m * D + d) != test::round_bf16_exact(v);
      // f16 (11 significand bits) reference
      int e;
      std::frexp(v, &e);
      const double ulp = std::ldexp(1.0, e - 11);
      bad += get(dst_f16, m * D + d) != std::nearbyint(v / ulp) * ulp;
    }
  EXPECT_EQ(bad, 0);
  // bf16 -> f32 -> bf16 round trip is exact; f32 -> f64 is exact.
  HostTensor f32(DType::f32, {M, D}), back(DType::bf16, {M, D}), f64(DType::f64, {M, D});
  ASSERT_TRUE(cpu()->convert(dst_bf16, f32).ok());
  ASSERT_TRUE(cpu()->convert(f32, back).ok());
  EXPECT_TRUE(test::same_bytes(back, dst_bf16));
  ASSERT_TRUE(cpu()->convert(f32, f64).ok());
  for (int64_t i = 0; i < M * D; ++i) ASSERT_EQ(get(f64, i), get(f32, i));
  // f8e4m3 saturates
  HostTensor f8(DType::f8e4m3, {M, D});
  ASSERT_TRUE(cpu()->convert(s, f8).ok());
  for (int64_t i = 0; i < M * D; ++i) ASSERT_LE(std::fabs(get(f8, i)), 448.0);
  HostTensor i32(DType::i32, {M, D});
  EXPECT_EQ(cpu()->convert(f32, i32).error().code, ErrorCode::unsupported);
}

// -------------------------------------------------------------------- attention
// The documented algorithm as a plain scalar loop (scores recomputed, nothing clever):
// the op must match it bit for bit for any kv_tile.
void attention_statement(const TensorView& q, const TensorView& k, const TensorView& v, int64_t kv_tile,
                         std::vector<float>& out) {
  const int64_t Mq = q.size(0), H = q.size(1), Dh = q.size(2), Mk = k.size(0);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  out.assign(static_cast<size_t>(Mq * H * Dh), 0.0f);
  std::vector<float> acc(static_cast<size_t>(Dh)), o(static_cast<size_t>(Dh));
  for (int64_t i = 0; i < Mq; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const uint16_t* qr = static_cast<const uint16_t*>(q.at(i, h));
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t0 = 0; t0 < Mk; t0 += kv_tile) {
        const int64_t t1 = std::min(Mk, t0 + kv_tile);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = t0; j < t1; ++j)
          mx = std::max(mx, scale * cpu::dot16_reference(qr, static_cast<const uint16_t*>(k.at(j, h)), Dh));
        const float m_new = std::max(m, mx);
        const float alpha = std::isinf(m) ? 0.0f : std::exp(m - m_new);
        float rs = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t j = t0; j < t1; ++j) {
          const float p = std::exp(scale * cpu::dot16_reference(qr, static_cast<const uint16_t*>(k.at(j, h)), Dh) - m_new);
          rs = rs + p;
          const float pb = round_bf16(p);
          for (int64_t d = 0; d < Dh; ++d)
            o[static_cast<size_t>(d)] = o[static_cast<size_t>(d)] + pb * load_as_f32(v.at(j, h, d), DType::bf16, 0);
        }
        l = l * alpha + rs;
        for (int64_t d = 0; d < Dh; ++d)
          acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] * alpha + o[static_cast<size_t>(d)];
        m = m_new;
      }
      for (int64_t d = 0; d < Dh; ++d) out[static_cast<size_t>((i * H + h) * Dh + d)] = round_bf16(acc[static_cast<size_t>(d)] / l);
    }
}

struct AttnCase {
  int64_t Mq, Mk, H, Dh;
};
class CpuAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CpuAttention, ErrorVsFloat64AndDocumentedAlgorithm) {
  const AttnCase c = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(c.Mq * 3 + c.Mk * 5 + c.H + c.Dh));
  const int64_t I = c.H * c.Dh;
  // q from one buffer [Mq, 3I], k and v from a fused [Mk, 3I] (strided like qkv).
  HostTensor qbuf(DType::bf16, {c.Mq, 3 * I}), kvbuf(DType::bf16, {c.Mk, 3 * I}), out(DType::bf16, {c.Mq, I});
  test::fill_uniform(qbuf, rng, -2.0, 2.0);  // scores of a few units: a peaked softmax
  test::fill_uniform(kvbuf, rng, -2.0, 2.0);
  ASSERT_GT(test::count_nonzero(qbuf), c.Mq * I);
  ASSERT_GT(test::count_nonzero(kvbuf), c.Mk * I);
  const TensorView q = qbuf.view().cols(0, I).unflatten_last(c.H, c.Dh);
  const TensorView k = kvbuf.view().cols(I, 2 * I).unflatten_last(c.H, c.Dh);
  const TensorView v = kvbuf.view().cols(2 * I, 3 * I).unflatten_last(c.H, c.Dh);
  const TensorView o = out.view().unflatten_last(c.H, c.Dh);
  AttentionParams p;
  p.kv_tile = 64;
  ASSERT_TRUE(cpu()->attention(q, k, v, o, p).ok());
  ASSERT_TRUE(out.guards_intact());

  std::vector<float> stmt;
  attention_statement(q, k, v, p.kv_tile, stmt);
  int64_t stmt_mismatch = 0;
  for (int64_t i = 0; i < c.Mq * I; ++i) stmt_mismatch += static_cast<float>(get(out, i)) != stmt[static_cast<size_t>(i)];
  EXPECT_EQ(stmt_mismatch, 0) << "differs from the documented tiled algorithm";

  // float64 reference (no rounding anywhere) and the naive bf16 implementation that
  // PyTorch's eager math gives: S = bf16(scale * q.k) (fp32 dot), P = bf16(softmax_fp32(S)),
  // out = bf16(sum_j P_j v_j) in fp32.
  ErrStats ours, naive;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.Dh));
  std::vector<double> sd(static_cast<size_t>(c.Mk));
  std::vector<float> s32(static_cast<size_t>(c.Mk));
  for (int64_t i = 0; i < c.Mq; ++i)
    for (int64_t h = 0; h < c.H; ++h) {
      double mx = -1e300;
      float mx32 = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < c.Mk; ++j) {
        double dd = 0.0;
        float d32 = 0.0f;
        for (int64_t d = 0; d < c.Dh; ++d) {
          const float a = load_as_f32(q.at(i, h, d), DType::bf16, 0), b = load_as_f32(k.at(j, h, d), DType::bf16, 0);
          dd += static_cast<double>(a) * b;
          d32 = d32 + a * b;
        }
        sd[static_cast<size_t>(j)] = dd * scale;
        s32[static_cast<size_t>(j)] = round_bf16(d32 * static_cast<float>(scale));
        mx = std::max(mx, sd[static_cast<size_t>(j)]);
        mx32 = std::max(mx32, s32[static_cast<size_t>(j)]);
      }
      double den = 0.0;
      float den32 = 0.0f;
      for (int64_t j = 0; j < c.Mk; ++j) {
        den += std::exp(sd[static_cast<size_t>(j)] - mx);
        den32 = den32 + std::exp(s32[static_cast<size_t>(j)] - mx32);
      }
      for (int64_t d = 0; d < c.Dh; ++d) {
        double num = 0.0;
        float num32 = 0.0f;
        for (int64_t j = 0; j < c.Mk; ++j) {
          const float vv = load_as_f32(v.at(j, h, d), DType::bf16, 0);
          num += std::exp(sd[static_cast<size_t>(j)] - mx) * vv;
          num32 = num32 + round_bf16(std::exp(s32[static_cast<size_t>(j)] - mx32) / den32) * vv;
        }
        const double ref = num / den;
        ours.add(load_as_f32(o.at(i, h, d), DType::bf16, 0), ref);
        naive.add(round_bf16(num32), ref);
      }
    }
  EXPECT_LE(ours.max_abs, 2.0 * naive.max_abs);
  EXPECT_LE(ours.rms(), 2.0 * naive.rms());
  std::printf("attention Mq=%lld Mk=%lld H=%lld Dh=%lld: max err %.3g (naive bf16 %.3g) rms %.3g (naive %.3g)\n",
              static_cast<long long>(c.Mq), static_cast<long long>(c.Mk), static_cast<long long>(c.H),
              static_cast<long long>(c.Dh), ours.max_abs, naive.max_abs, ours.rms(), naive.rms());
}

INSTANTIATE_TEST_SUITE_P(Sizes, CpuAttention,
                         ::testing::Values(AttnCase{1, 97, 2, 64}, AttnCase{97, 97, 3, 128}, AttnCase{1025, 33, 1, 40},
                                           AttnCase{9, 1025, 2, 32}, AttnCase{5, 300, 1, 17}),
                         [](const ::testing::TestParamInfo<AttnCase>& param_info) {
                           const AttnCase& c = param_info.param;
                           return test::sizes_name({{"Mq", c.Mq}, {"Mk", c.Mk}, {"H", c.H}, {"Dh", c.Dh}});
                         });

TEST(CpuAttentionTiles, AnyKvTileMatchesTheStatement) {
  // kv_tile = 1 (every key its own tile), odd tiles, one longer than the op's score
  // chunk (walked twice), and tiles covering all keys.
  const int64_t Mq = 7, Mk = 601, H = 2, Dh = 24;
  std::mt19937_64 rng(77);
  HostTensor q(DType::bf16, {Mq, H, Dh}), k(DType::bf16, {Mk, H, Dh}), v(DType::bf16, {Mk, H, Dh}),
      out(DType::bf16, {Mq, H, Dh});
  test::fill_uniform(q, rng, -3.0, 3.0);
  test::fill_uniform(k, rng, -3.0, 3.0);
  test::fill_uniform(v, rng, -1.0, 1.0);
  ASSERT_GT(test::count_nonzero(q) * test::count_nonzero(k) * test::count_nonzero(v), 0);
  for (int64_t tile : {int64_t{1}, int64_t{7}, int64_t{256}, int64_t{300}, int64_t{600}, Mk, Mk + 1000}) {
    AttentionParams p;
    p.kv_tile = tile;
    ASSERT_TRUE(cpu()->attention(q, k, v, out, p).ok());
    std::vector<float> stmt;
    attention_statement(q, k, v, tile, stmt);
    int64_t mismatch = 0;
    for (int64_t i = 0; i < Mq * H * Dh; ++i) mismatch += static_cast<float>(get(out, i)) != stmt[static_cast<size_t>(i)];
    EXPECT_EQ(mismatch, 0) << "kv_tile " << tile;
  }
  AttentionParams bad;
  bad.kv_tile = 0;
  EXPECT_EQ(cpu()->attention(q, k, v, out, bad).error().code, ErrorCode::invalid_argument);
}


// ----------------------------------------------------------------- count_nonfinite
// Special bit patterns of each dtype: every NaN class (quiet, signalling, negative, the
// smallest and largest payloads), both infinities, and the finite values next to them
// (largest finite, smallest normal and subnormal, zeros) that must not count.
struct SpecialBits {
  std::vector<uint32_t> nonfinite, finite;
};
SpecialBits special_bits(DType t) {
  if (t == DType::bf16)
    return {{0x7fc0, 0xffc0, 0x7f81, 0x7fff, 0xffff, 0x7f80, 0xff80},
            {0x7f7f, 0xff7f, 0x0080, 0x0001, 0x8001, 0x0000, 0x8000, 0x3f80}};
  if (t == DType::f16)
    return {{0x7e00, 0xfe00, 0x7c01, 0x7fff, 0x7c00, 0xfc00}, {0x7bff, 0xfbff, 0x0400, 0x0001, 0x0000, 0x8000}};
  return {{0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0x7f800000u, 0xff800000u},
          {0x7f7fffffu, 0xff7fffffu, 0x00800000u, 0x00000001u, 0x00000000u, 0x80000000u}};
}
void put_bits(const TensorView& v, int64_t linear, uint32_t bits) {
  void* p = test::elem_ptr(v, linear);
  if (v.elem_size() == 2) {
    const auto h = static_cast<uint16_t>(bits);
    std::memcpy(p, &h, 2);
  } else {
    std::memcpy(p, &bits, 4);
  }
}
// The count by the definition: widen each element to double and ask std::isfinite.
int64_t count_by_definition(const TensorView& v) {
  int64_t n = 0;
  for (int64_t i = 0; i < v.numel(); ++i) n += std::isfinite(get(v, i)) ? 0 : 1;
  return n;
}

TEST(CpuCountNonfinite, SpecialValuesSlicesAndStrides) {
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const SpecialBits sb = special_bits(t);
    // [M, H, Dh] with M large enough to be split over threads (> 2^16 elements).
    const int64_t M = 1025, H = 3, Dh = 37;
    HostTensor x(t, {M, H, Dh});
    std::mt19937_64 rng(5);
    test::fill_uniform(x, rng, -2.0, 2.0);
    const TensorView v = x.view();
    EXPECT_EQ(cpu()->count_nonfinite(v).value(), 0);
    // Finite extremes only: still 0.
    for (size_t i = 0; i < sb.finite.size(); ++i) put_bits(v, static_cast<int64_t>(i * 977), sb.finite[i]);
    EXPECT_EQ(cpu()->count_nonfinite(v).value(), 0) << "a finite extreme counted as non-finite";
    // Every non-finite pattern at scattered places, some repeated.
    std::uniform_int_distribution<int64_t> pick(0, v.numel() - 1);
    for (int rep = 0; rep < 40; ++rep)
      put_bits(v, pick(rng), sb.nonfinite[static_cast<size_t>(rep) % sb.nonfinite.size()]);
    put_bits(v, 0, sb.nonfinite[0]);
    put_bits(v, v.numel() - 1, sb.nonfinite.back());
    const int64_t want = count_by_definition(v);
    ASSERT_GT(want, 2);
    EXPECT_EQ(cpu()->count_nonfinite(v).value(), want);
    // Thread count never matters.
    const int threads = num_threads();
    set_num_threads(1);
    EXPECT_EQ(cpu()->count_nonfinite(v).value(), want);
    set_num_threads(threads);
    // Row slices, column slices (row-strided), one head of every row (head-strided),
    // a flattened 2-D view and a 4-D split of the heads' last dimension.
    const TensorView views[] = {v.slice_rows(0, 1), v.slice_rows(M - 1, M), v.slice_rows(M / 3, M - M / 4),
                                v.cols(5, 30), v.cols(0, 1), v.flatten_last2().cols(Dh, 2 * Dh + 3),
                                v.slice_rows(100, 900).cols(1, Dh - 1)};
    for (const TensorView& s : views) {
      EXPECT_EQ(cpu()->count_nonfinite(s).value(), count_by_definition(s)) << s.shape_str();
    }
    TensorView four = v;  // [M, H, Dh] -> [M, H, 1, Dh] with a broadcast-free unit dim
    four.ndim = 4;
    four.shape = {M, H, 1, Dh};
    four.stride = {H * Dh, Dh, Dh, 1};
    EXPECT_EQ(cpu()->count_nonfinite(four).value(), want);
    TensorView every_other = v.flatten_last2();  // [M, H*Dh/2] at stride 2: innermost strided
    every_other.shape[1] = H * Dh / 2;
    every_other.stride[1] = 2;
    EXPECT_EQ(cpu()->count_nonfinite(every_other).value(), count_by_definition(every_other));
    // A scalar (0-dim) view and zero-size views.
    TensorView scalar = v;
    scalar.ndim = 0;
    EXPECT_EQ(cpu()->count_nonfinite(scalar).value(), 1);  // element 0 is sb.nonfinite[0]
    EXPECT_EQ(cpu()->count_nonfinite(v.slice_rows(7, 7)).value(), 0);
    EXPECT_EQ(cpu()->count_nonfinite(TensorView()).value(), 0);
    EXPECT_TRUE(x.guards_intact());
  }
}

TEST(CpuCountNonfinite, OtherDtypesAndDeviceViewsAreRefused) {
  HostTensor i(DType::i32, {4, 4});
  EXPECT_EQ(cpu()->count_nonfinite(i.view()).error().code, ErrorCode::unsupported);
  HostTensor u(DType::u8, {8});
  EXPECT_EQ(cpu()->count_nonfinite(u.view()).error().code, ErrorCode::unsupported);
  HostTensor f(DType::f32, {4});
  TensorView dev = f.view();
  dev.device = Device{DeviceKind::cuda, 0};
  EXPECT_EQ(cpu()->count_nonfinite(dev).error().code, ErrorCode::unsupported);
}

}  // namespace
}  // namespace ls

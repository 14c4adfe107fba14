// INT8 attention on the CPU reference (AttentionAlgorithm::int8; docs/int8-attention.md,
// backend.h). What is checked:
//  - the element arithmetic (int8_attention_math.h) on hand-computed values: exp2e, the
//    p8 threshold table of contract v2 (sorted, its steps, near correctly rounded 2^x),
//    the quantiser, the rotation's (Rx).(Ry) = Dh x.y;
//  - a 1-key case computed by hand, and the whole op memcmp-equal to a plain scalar
//    statement of the spec written here (all scores stored, no chunking, one thread);
//  - plan invariance (memcmp): statistics accumulated over any slicing, prepare per key
//    chunk equal to one prepare, query slicings (a last slice of 1 row), streamed key
//    chunks carrying the fp32 state, kv_tile 64 and 288 (longer than the reference's
//    256-key walk), sizes Mk = 1, 97, 1025;
//  - accuracy against float64 attention with outlier channels in K (a bound, and the
//    centring's effect), and the refusals (head dim, kv_tile, backend without int8).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/int8_attention_math.h"
#include "core/dtype.h"
#include "test_cpu_ops_util.h"

namespace ls {
namespace {

using test::HostTensor;

Backend* cpu() {
  static std::unique_ptr<Backend> b = [] {
    std::unique_ptr<Backend> be = make_cpu_backend();
    Numerics n;
    n.attention = AttentionAlgorithm::int8;
    EXPECT_TRUE(be->set_numerics(n, {}).ok());
    return be;
  }();
  return b.get();
}

// A byte buffer holding one Int8Keys of keys [k0, k0 + n) and its own V-scale table (of the
// statistics blocks up to key k0 + n; plus guard bytes via HostTensor).
struct KeysBuf {
  KeysBuf(int64_t n, int64_t H, int64_t Dh, int64_t k0 = 0)
      : buf(DType::u8, {int8_keys_bytes(n, H, Dh) + 256}), vs(DType::f32, {int8_stat_blocks(k0 + n), 2, H, Dh}) {
    void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(buf.data()) + 255) / 256 * 256);
    keys = int8_keys_view(base, n, H, Dh, Device{}, vs, k0);
  }
  HostTensor buf, vs;
  Int8Keys keys;
};

// q [Mq, H, Dh], k, v [Mk, H, Dh] bf16; K gets outlier channels (a large one-signed offset,
// as H3's K has) when outliers is set.
struct Inputs {
  Inputs(int64_t Mq, int64_t Mk, int64_t H, int64_t Dh, uint64_t seed, bool outliers = true)
      : q(DType::bf16, {Mq, H, Dh}), k(DType::bf16, {Mk, H, Dh}), v(DType::bf16, {Mk, H, Dh}) {
    std::mt19937_64 rng(seed);
    test::fill_uniform(q, rng, -1.5, 1.5);
    test::fill_uniform(k, rng, -1.5, 1.5);
    test::fill_uniform(v, rng, -1.0, 1.0);
    if (outliers)
      for (int64_t j = 0; j < Mk; ++j)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c : {int64_t{1}, Dh / 2 + 3}) {
            const int64_t idx = (j * H + h) * Dh + c;
            test::set(k, idx, 12.0 + test::get(k, idx));
          }
    EXPECT_GT(test::count_nonzero(q), Mq * H * Dh / 2);
    EXPECT_GT(test::count_nonzero(k), Mk * H * Dh / 2);
    EXPECT_GT(test::count_nonzero(v), Mk * H * Dh / 2);
  }
  HostTensor q, k, v;
};

// Stats + prepare over all keys (one call each).
void prepare_all(const Inputs& in, const TensorView& stats, const Int8Keys& keys) {
  ASSERT_TRUE(cpu()->int8_key_stats(in.k, in.v, stats, 0, true).ok());
  ASSERT_TRUE(cpu()->int8_prepare(in.k, in.v, stats, keys).ok());
}

Status attend(const TensorView& q, const Int8Keys& keys, const TensorView& out, int64_t kv_tile) {
  AttentionParams p;
  p.kv_tile = kv_tile;
  return cpu()->attention_int8(q, keys, out, p);
}

// ---- the element arithmetic -------------------------------------------------------------

TEST(Int8Math, Exp2IsDefinedAndAccurate) {
  EXPECT_EQ(i8a::exp2e(0.0f), 1.0f);
  EXPECT_EQ(i8a::exp2e(-1.0f), 0.5f);   // n = -1, f = 0: exactly c0 / 2
  EXPECT_EQ(i8a::exp2e(-7.0f), 0x1p-7f);
  EXPECT_EQ(i8a::exp2e(-125.5f), 0.0f);  // below the cut
  EXPECT_GT(i8a::exp2e(-125.0f), 0.0f);
  double worst = 0;
  for (int i = 0; i <= 40000; ++i) {
    const float t = -20.0f * static_cast<float>(i) / 40000.0f;
    const double want = std::exp2(static_cast<double>(t));
    worst = std::max(worst, std::abs(i8a::exp2e(t) - want) / want);
  }
  EXPECT_LT(worst, 4e-6);  // measured 3.25e-6: the degree-5 remainder plus fp32 rounding
  EXPECT_GT(worst, 1e-9);  // it is a polynomial, not libm
}

float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
// fp32 bit patterns in the order of their values (-0 and +0 adjacent): ulp distances.
int64_t ordered(float f) {
  const uint32_t b = bits_of(f);
  return (b & 0x80000000u) ? -static_cast<int64_t>(b & 0x7fffffffu) : static_cast<int64_t>(b);
}
float unordered(int64_t o) { return float_of(o >= 0 ? static_cast<uint32_t>(o) : (0x80000000u | static_cast<uint32_t>(-o))); }

TEST(Int8Math, P8ThresholdTable) {
  // Contract v2 (§4.3): p8(x) = #{k : theta_k <= x}. The table is sorted (strictly: 255
  // distinct steps), the tile's maximum (x = kP8Top) gives 255, -inf gives 0, and each
  // theta_k is exactly where p8 steps from k - 1 to k.
  EXPECT_EQ(std::size(i8a::kP8ThresholdBits), 255u);
  for (int k = 2; k <= 255; ++k)
    EXPECT_LT(float_of(i8a::kP8ThresholdBits[k - 2]), float_of(i8a::kP8ThresholdBits[k - 1])) << k;
  EXPECT_LE(float_of(i8a::kP8ThresholdBits[254]), i8a::kP8Top);
  EXPECT_EQ(i8a::p8_table(i8a::kP8Top), 255);
  EXPECT_EQ(i8a::p8_table(-std::numeric_limits<float>::infinity()), 0);
  EXPECT_EQ(i8a::p8_table(-200.0f), 0);
  EXPECT_EQ(i8a::p8_table(std::numeric_limits<float>::quiet_NaN()), i8a::kP8NaN);
  for (int k = 1; k <= 255; ++k) {
    const float t = float_of(i8a::kP8ThresholdBits[k - 1]);
    EXPECT_EQ(i8a::p8_table(t), k) << k;
    EXPECT_EQ(i8a::p8_table(std::nextafter(t, -INFINITY)), k - 1) << k;
  }
  // The steps are those of rint(2^x) up to the device's ex2 error: against the steps of
  // rint(fl32(2^x)) with 2^x correctly rounded (the double exp2 rounded once to fp32; a
  // double rounding could move a step by one pattern, hence bound 2), every theta_k lies
  // within 2 ulps. Measured: 228 equal, 26 one pattern below, 1 one pattern above.
  int64_t worst = 0;
  for (int k = 1; k <= 255; ++k) {
    auto crp8 = [](float x) { return std::nearbyint(static_cast<float>(std::exp2(static_cast<double>(x)))); };
    int64_t lo = ordered(-2.0f), hi = ordered(8.5f);  // smallest x with rint(fl32(2^x)) >= k
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (crp8(unordered(mid)) >= static_cast<float>(k)) hi = mid;
      else lo = mid + 1;
    }
    const int64_t d = ordered(float_of(i8a::kP8ThresholdBits[k - 1])) - lo;
    worst = std::max(worst, d < 0 ? -d : d);
    EXPECT_LE(d < 0 ? -d : d, 2) << "theta_" << k;
  }
  EXPECT_EQ(worst, 1);  // the H200's table (bench/results/issue26/p8_table): a measured fact
  // Familiar values, x away from the steps: p8(x) = rint(2^x).
  EXPECT_EQ(i8a::p8_table(0.0f), 1);   // 2^0 = 1
  EXPECT_EQ(i8a::p8_table(-1.0f), 0);  // 2^-1 = 0.5: rint -> 0 (theta_1 lies just above -1)
  EXPECT_EQ(i8a::p8_table(1.0f), 2);
  EXPECT_EQ(i8a::p8_table(5.0f), 32);
  EXPECT_EQ(i8a::p8_table(7.0f), 128);
}

TEST(Int8Math, QuantiserByHand) {
  EXPECT_EQ(i8a::quant(0.5f, 1.0f), 0);  // ties to even
  EXPECT_EQ(i8a::quant(1.5f, 1.0f), 2);
  EXPECT_EQ(i8a::quant(-2.5f, 1.0f), -2);
  EXPECT_EQ(i8a::quant(300.0f, 1.0f), 127);
  EXPECT_EQ(i8a::quant(-300.0f, 1.0f), -127);
  EXPECT_EQ(i8a::quant(std::numeric_limits<float>::quiet_NaN(), 1.0f), 0);
  const float s = i8a::row_scale(3.0f);  // fl32(3 * fl32(1/127))
  EXPECT_EQ(s, 3.0f * 0x1.020408p-7f);
  EXPECT_EQ(i8a::quant(3.0f, s), 127);
  EXPECT_EQ(i8a::quant(-3.0f, s), -127);
  EXPECT_EQ(i8a::row_scale(0.0f), 1e-30f);
}

// i8a::div_rd / quant_rd (the GPU kernels' division-free quotient): the IEEE quotient's bits
// for every seed within 1 ulp of 1/s (the GPU seeds with rcp.approx.f32, at most 1 ulp off),
// on quotients chosen to be hard: within a few ulps of every half-integer the quantiser
// rounds at, within a few ulps of fp32 midpoints, and random ones; divisors over the row
// scales' range and the output divisor l's (255 .. 2^38). Subnormal quotients only through
// quant_rd (which rounds them to 0 either way; the kernels' output division takes the IEEE
// one for numerators below 2^-87).
TEST(Int8Math, DivisionFreeQuotientEqualsIeeeDivision) {
  std::mt19937_64 rng(20261203);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  const auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  };
  int64_t quotients = 0, quants = 0, differ = 0, qdiffer = 0;
  const auto check = [&](float x, float s) {
    const float want = x / s;
    const float nearest = 1.0f / s;
    for (const float r0 : {std::nextafter(nearest, 0.0f), nearest, std::nextafter(nearest, INFINITY)}) {
      const double r = i8a::recip_d(s, r0);
      if (std::fabs(want) >= 0x1p-126f || want == 0.0f) {
        ++quotients;
        differ += bits(i8a::div_rd(x, r)) != bits(want);
      }
      ++quants;
      qdiffer += i8a::quant_rd(x, r) != i8a::quant(x, s);
    }
  };
  for (int si = 0; si < 3000; ++si) {
    // Row scales (amax / 127 over bf16 rows: 1e-30 .. 1e30, mostly near 1) and l (255 .. 2^38).
    const float s = si % 3 == 0   ? static_cast<float>(std::pow(10.0, -30.0 + 60.0 * u01(rng)))
                    : si % 3 == 1 ? static_cast<float>(std::pow(2.0, -8.0 + 16.0 * u01(rng)))
                                  : static_cast<float>(std::pow(2.0, 8.0 + 30.0 * u01(rng)));
    for (int k = -128; k <= 127; ++k) {  // near the half-integers k + 0.5
      const float x = static_cast<float>((k + 0.5) * static_cast<double>(s));
      float lo = x, hi = x;
      check(x, s);
      for (int n = 0; n < 3; ++n) {
        lo = std::nextafter(lo, -INFINITY), hi = std::nextafter(hi, INFINITY);
        check(lo, s), check(hi, s);
      }
    }
    for (int n = 0; n < 200; ++n) {  // near fp32 midpoints of quotients over many binades
      const float q = static_cast<float>(std::ldexp(1.0 + u01(rng), static_cast<int>(u01(rng) * 200.0) - 100));
      const double mid = (static_cast<double>(q) + static_cast<double>(std::nextafter(q, INFINITY))) / 2.0;
      const float x = static_cast<float>(mid * static_cast<double>(s));
      if (!std::isfinite(x)) continue;
      check(x, s), check(std::nextafter(x, 0.0f), s), check(std::nextafter(x, INFINITY), s), check(-x, s);
    }
    for (int n = 0; n < 100; ++n) check(static_cast<float>((u01(rng) * 255.2 - 127.6) * static_cast<double>(s)), s);
  }
  for (const float x : {0.0f, -0.0f, INFINITY, -INFINITY, 1.0f, 1e-45f}) check(x, 3.0f);
  EXPECT_EQ(i8a::div_rd(5.0f, i8a::recip_d(INFINITY, 0.0f)), 0.0f);  // x / inf = 0
  EXPECT_TRUE(std::isnan(i8a::div_rd(std::nanf(""), i8a::recip_d(3.0f, 1.0f / 3.0f))));
  EXPECT_EQ(differ, 0) << "of " << quotients << " quotients";
  EXPECT_EQ(qdiffer, 0) << "of " << quants << " quantised values";
  EXPECT_GT(quotients, 5000000);
  std::printf("[ info ] %lld quotients, %lld quantised values: the IEEE division's bits\n",
              static_cast<long long>(quotients), static_cast<long long>(quants));
}

TEST(Int8Math, RotationIsScaledOrthogonal) {
  for (int Dh : {2, 8, 64, 128}) {
    std::mt19937_64 rng(Dh);
    std::uniform_int_distribution<int> d(-8, 8);
    std::vector<float> x(Dh), y(Dh);
    double xy = 0;
    for (int c = 0; c < Dh; ++c) x[c] = static_cast<float>(d(rng)), y[c] = static_cast<float>(d(rng)), xy += x[c] * y[c];
    i8a::rotate(x.data(), Dh);  // small integers: every add exact
    i8a::rotate(y.data(), Dh);
    double rxy = 0;
    for (int c = 0; c < Dh; ++c) rxy += static_cast<double>(x[c]) * y[c];
    EXPECT_EQ(rxy, Dh * xy) << "Dh " << Dh;
    // The sign vector is not all +1 (else R would be plain Hadamard).
    int neg = 0;
    for (int c = 0; c < Dh; ++c) neg += i8a::negative_sign(c);
    if (Dh >= 8) {
      EXPECT_GT(neg, 0) << Dh;
    }
  }
}

// ---- the op against hand values and a scalar statement ------------------------------------

TEST(Int8Attention, OneKeyByHand) {
  // One query, one key, H = 1, Dh = 2: p8 = 255, l = 255, out = bf16(fl32(255 v8 sv) / 255).
  HostTensor q(DType::bf16, {1, 1, 2}), k(DType::bf16, {1, 1, 2}), v(DType::bf16, {1, 1, 2});
  test::set(q, 0, 0.25), test::set(q, 1, -3.0), test::set(k, 0, 2.0), test::set(k, 1, 1.0);
  test::set(v, 0, 1.0), test::set(v, 1, -0.5);
  HostTensor stats(DType::f32, {3, 1, 2}), out(DType::bf16, {1, 1, 2});
  KeysBuf kb(1, 1, 2);
  ASSERT_TRUE(cpu()->int8_key_stats(k, v, stats, 0, true).ok());
  EXPECT_EQ(test::get(stats, 0), 2.0);   // kmax
  EXPECT_EQ(test::get(stats, 2), 2.0);   // kmin
  EXPECT_EQ(test::get(stats, 5), 0.5);   // vabs of channel 1
  ASSERT_TRUE(cpu()->int8_prepare(k, v, stats, kb.keys).ok());
  // k - mu = 0: the key row is all zeros, scale tiny, k8 = 0.
  EXPECT_EQ(static_cast<int8_t*>(kb.keys.k8.data)[0], 0);
  EXPECT_EQ(kb.keys.sk.ptr<float>()[0], 1e-30f);
  EXPECT_EQ(static_cast<int8_t*>(kb.keys.v8t.data)[0], 127);
  EXPECT_EQ(static_cast<int8_t*>(kb.keys.v8t.at(0, 1))[0], -127);
  ASSERT_TRUE(attend(q, kb.keys, out, 1024).ok());
  EXPECT_EQ(test::get(out, 0), 1.0);
  EXPECT_EQ(test::get(out, 1), -0.5);
}

TEST(Int8Attention, RefusesANegativeOrNonFiniteScale) {
  // x = fmaf(a, w, kP8Top) <= kP8Top needs a > 0: the backends refuse other scales (the
  // CUDA backend's attention_int8 the same way, i8a::scale_ok), 0 meaning 1/sqrt(Dh).
  HostTensor q(DType::bf16, {1, 1, 2}), k(DType::bf16, {1, 1, 2}), v(DType::bf16, {1, 1, 2});
  test::set(q, 0, 0.5), test::set(k, 0, 1.0), test::set(v, 0, 1.0);
  HostTensor stats(DType::f32, {3, 1, 2}), out(DType::bf16, {1, 1, 2});
  KeysBuf kb(1, 1, 2);
  ASSERT_TRUE(cpu()->int8_key_stats(k, v, stats, 0, true).ok());
  ASSERT_TRUE(cpu()->int8_prepare(k, v, stats, kb.keys).ok());
  for (float bad : {-0.125f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    AttentionParams p;
    p.kv_tile = 128;
    p.scale = bad;
    const Status st = cpu()->attention_int8(q, kb.keys, out, p);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.message().find("scale must be positive"), std::string::npos) << st.message();
  }
  AttentionParams p;
  p.kv_tile = 128;
  p.scale = 0.25f;
  EXPECT_TRUE(cpu()->attention_int8(q, kb.keys, out, p).ok());
}

// The spec of docs/int8-attention.md §3-4 (contract v2) written plainly: mu, sv, every key
// row, every score of a tile stored, p8 by counting the thresholds, sums in key order, one
// query at a time. (-ffp-contract=off: every a * b + c below is two roundings; the contract's
// fused steps are std::fmaf.)
std::vector<uint16_t> scalar_reference(const Inputs& in, int64_t kv_tile) {
  const TensorView &q = in.q.view(), &k = in.k.view(), &v = in.v.view();
  const int64_t Mq = q.size(0), Mk = k.size(0), H = q.size(1), Dh = q.size(2);
  const float cs = i8a::score_factor(static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh))), static_cast<int>(Dh));
  std::vector<uint16_t> out(static_cast<size_t>(Mq * H * Dh));
  auto at = [&](const TensorView& t, int64_t r, int64_t h, int64_t c) {
    return static_cast<float>(test::get(t, (r * H + h) * Dh + c));
  };
  auto quant_row = [&](std::vector<float> y, std::vector<int>* x8) {
    i8a::rotate(y.data(), static_cast<int>(Dh));
    float amax = 0;
    for (float e : y) amax = std::max(amax, std::fabs(e));
    const float s = i8a::row_scale(amax);
    x8->resize(y.size());
    for (size_t c = 0; c < y.size(); ++c) (*x8)[c] = i8a::quant(y[c], s);
    return s;
  };
  for (int64_t h = 0; h < H; ++h) {
    std::vector<float> mu(Dh), sv(Dh);
    for (int64_t c = 0; c < Dh; ++c) {
      float kmax = -INFINITY, kmin = INFINITY, vabs = 0;
      for (int64_t j = 0; j < Mk; ++j)
        kmax = std::max(kmax, at(k, j, h, c)), kmin = std::min(kmin, at(k, j, h, c)),
        vabs = std::max(vabs, std::fabs(at(v, j, h, c)));
      mu[c] = 0.5f * (kmax + kmin);
      sv[c] = i8a::row_scale(vabs);
    }
    std::vector<std::vector<int>> k8(Mk), v8(Mk);
    std::vector<float> sk(Mk);
    for (int64_t j = 0; j < Mk; ++j) {
      std::vector<float> y(Dh);
      for (int64_t c = 0; c < Dh; ++c) y[c] = at(k, j, h, c) - mu[c];
      sk[j] = quant_row(y, &k8[j]);
      v8[j].resize(Dh);
      for (int64_t c = 0; c < Dh; ++c) v8[j][c] = i8a::quant(at(v, j, h, c), sv[c]);
    }
    for (int64_t i = 0; i < Mq; ++i) {
      std::vector<float> y(Dh);
      for (int64_t c = 0; c < Dh; ++c) y[c] = at(q, i, h, c);
      std::vector<int> q8;
      const float a = quant_row(y, &q8) * cs;
      float m = -INFINITY, l = 0;
      std::vector<float> acc(Dh, 0.0f);
      for (int64_t t0 = 0; t0 < Mk; t0 += kv_tile) {
        const int64_t t1 = std::min(Mk, t0 + kv_tile);
        std::vector<float> u(t1 - t0);
        float mu_t = -INFINITY;
        for (int64_t j = t0; j < t1; ++j) {
          int d = 0;
          for (int64_t c = 0; c < Dh; ++c) d += q8[c] * k8[j][c];
          u[j - t0] = sk[j] * static_cast<float>(d);
          mu_t = std::max(mu_t, u[j - t0]);
        }
        long lt = 0;
        std::vector<long> ot(Dh, 0);
        for (int64_t j = t0; j < t1; ++j) {
          const float x = std::fmaf(a, u[j - t0] - mu_t, i8a::kP8Top);
          int p = 0;
          for (uint32_t tb : i8a::kP8ThresholdBits) p += float_of(tb) <= x;
          lt += p;
          for (int64_t c = 0; c < Dh; ++c) ot[c] += p * v8[j][c];
        }
        const float sT = a * mu_t;
        const float m_new = std::max(m, sT);
        const float alpha = m == -INFINITY ? 0.0f : i8a::exp2e(m - m_new);
        const float beta = i8a::exp2e(sT - m_new);
        l = std::fmaf(static_cast<float>(lt), beta, l * alpha);
        for (int64_t c = 0; c < Dh; ++c) acc[c] = std::fmaf(static_cast<float>(ot[c]), beta, acc[c] * alpha);
        m = m_new;
      }
      for (int64_t c = 0; c < Dh; ++c) out[static_cast<size_t>((i * H + h) * Dh + c)] = f32_to_bf16(acc[c] * sv[c] / l);
    }
  }
  return out;
}

TEST(Int8Attention, EqualsTheScalarStatementOfTheSpec) {
  struct Case {
    int64_t Mq, Mk, H, Dh, kv_tile;
  };
  for (const Case& c : {Case{5, 700, 2, 64, 300}, Case{3, 97, 1, 16, 1024}, Case{2, 1, 2, 8, 7},
                        Case{4, 260, 1, 128, 64}}) {
    SCOPED_TRACE("Mq " + std::to_string(c.Mq) + " Mk " + std::to_string(c.Mk) + " Dh " + std::to_string(c.Dh) +
                 " tile " + std::to_string(c.kv_tile));
    Inputs in(c.Mq, c.Mk, c.H, c.Dh, 11 + c.Mk);
    HostTensor stats(DType::f32, {3, c.H, c.Dh}), out(DType::bf16, {c.Mq, c.H, c.Dh});
    KeysBuf kb(c.Mk, c.H, c.Dh);
    prepare_all(in, stats, kb.keys);
    ASSERT_TRUE(attend(in.q, kb.keys, out, c.kv_tile).ok());
    const std::vector<uint16_t> want = scalar_reference(in, c.kv_tile);
    EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * 2), 0);
    EXPECT_GT(test::count_nonzero(out), c.Mq * c.H * c.Dh / 2);
    EXPECT_TRUE(kb.buf.guards_intact() && out.guards_intact());
  }
}

// ---- plan invariance -------------------------------------------------------------------------

TEST(Int8Attention, StatisticsAndPrepareAreSliceInvariant) {
  const int64_t Mk = 1025, H = 2, Dh = 64;
  Inputs in(1, Mk, H, Dh, 5);
  HostTensor whole(DType::f32, {3, H, Dh}), sliced(DType::f32, {3, H, Dh});
  KeysBuf all(Mk, H, Dh);
  prepare_all(in, whole, all.keys);
  const std::vector<int64_t> cuts = {0, 1, 97, 500, 1024, Mk};
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    ASSERT_TRUE(cpu()->int8_key_stats(in.k.view().slice_rows(cuts[i], cuts[i + 1]),
                                      in.v.view().slice_rows(cuts[i], cuts[i + 1]), sliced, cuts[i], i == 0)
                    .ok());
  EXPECT_TRUE(test::same_bytes(whole, sliced));
  // Prepare per chunk (keys [a, b) into a chunk's own buffer) = the chunk's bytes of one prepare.
  for (const auto& [a, b] : std::vector<std::pair<int64_t, int64_t>>{{0, 512}, {512, 1024}, {1024, 1025}, {96, 97}}) {
    KeysBuf part(b - a, H, Dh, a);
    ASSERT_TRUE(cpu()->int8_prepare(in.k.view().slice_rows(a, b), in.v.view().slice_rows(a, b), sliced, part.keys).ok());
    EXPECT_TRUE(test::same_bytes(part.keys.k8, all.keys.k8.slice_rows(a, b)));
    EXPECT_TRUE(test::same_bytes(part.keys.sk, all.keys.sk.slice_rows(a, b)));
    EXPECT_TRUE(test::same_bytes(part.keys.vs, all.keys.vs));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < Dh; ++c)
        EXPECT_EQ(std::memcmp(part.keys.v8t.at(h, c), static_cast<int8_t*>(all.keys.v8t.at(h, c)) + a,
                              static_cast<size_t>(b - a)),
                  0);
  }
  EXPECT_GT(test::count_nonzero(all.keys.k8), Mk * H * Dh / 2);
}

TEST(Int8Attention, QuerySlicingsAndKeyChunksGiveTheSameBytes) {
  for (const int64_t Mk : {int64_t{1}, int64_t{97}, int64_t{1025}}) {
    SCOPED_TRACE("Mk " + std::to_string(Mk));
    for (const int64_t tile : {int64_t{64}, int64_t{288}}) {
      SCOPED_TRACE("kv_tile " + std::to_string(tile));
      const int64_t Mq = 37, H = 2, Dh = 64;
      Inputs in(Mq, Mk, H, Dh, 100 + Mk);
      HostTensor stats(DType::f32, {3, H, Dh}), ref(DType::bf16, {Mq, H, Dh});
      KeysBuf kb(Mk, H, Dh);
      prepare_all(in, stats, kb.keys);
      ASSERT_TRUE(attend(in.q, kb.keys, ref, tile).ok());
      EXPECT_GT(test::count_nonzero(ref), Mq * H * Dh / 2);
      // Query slicings, the last slice 1 row.
      for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 36, 37}, std::vector<int64_t>{0, 1, 2, 19, 37}}) {
        HostTensor out(DType::bf16, {Mq, H, Dh});
        for (size_t i = 0; i + 1 < cuts.size(); ++i)
          ASSERT_TRUE(attend(in.q.view().slice_rows(cuts[i], cuts[i + 1]), kb.keys,
                             out.view().slice_rows(cuts[i], cuts[i + 1]), tile)
                          .ok());
        EXPECT_TRUE(test::same_bytes(ref, out));
      }
      // Streamed keys: chunks of whole tiles, each prepared on its own (the offload path), state carried.
      for (const int64_t chunk : {tile, 3 * tile, 1024 / tile * tile}) {
        HostTensor out(DType::bf16, {Mq, H, Dh}), state(DType::f32, {Mq, H, Dh + kAttentionStateExtra});
        for (int64_t c0 = 0; c0 < Mk; c0 += chunk) {
          const int64_t c1 = std::min(Mk, c0 + chunk);
          KeysBuf part(c1 - c0, H, Dh, c0);
          ASSERT_TRUE(
              cpu()->int8_prepare(in.k.view().slice_rows(c0, c1), in.v.view().slice_rows(c0, c1), stats, part.keys).ok());
          AttentionParams p;
          p.kv_tile = tile;
          p.state = state;
          p.state_in = c0 > 0;
          p.finalize = c1 == Mk;
          ASSERT_TRUE(cpu()->attention_int8(in.q, part.keys, out, p).ok());
        }
        EXPECT_TRUE(test::same_bytes(ref, out)) << "chunk " << chunk;
      }
      // Slices of one prepared set (Int8Keys::slice) as chunks.
      if (Mk > tile) {
        HostTensor out(DType::bf16, {Mq, H, Dh}), state(DType::f32, {Mq, H, Dh + kAttentionStateExtra});
        AttentionParams p;
        p.kv_tile = tile;
        p.state = state;
        p.finalize = false;
        ASSERT_TRUE(cpu()->attention_int8(in.q, kb.keys.slice(0, tile), out, p).ok());
        p.state_in = true;
        p.finalize = true;
        ASSERT_TRUE(cpu()->attention_int8(in.q, kb.keys.slice(tile, Mk), out, p).ok());
        EXPECT_TRUE(test::same_bytes(ref, out));
      }
    }
  }
}

// ---- accuracy ----------------------------------------------------------------------------------

// Relative L2 error against float64 softmax attention of the bf16 inputs.
double rel_error(const Inputs& in, const TensorView& out) {
  const TensorView &q = in.q.view(), &k = in.k.view(), &v = in.v.view();
  const int64_t Mq = q.size(0), Mk = k.size(0), H = q.size(1), Dh = q.size(2);
  double num = 0, den = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Mq; ++i) {
      std::vector<double> s(Mk);
      double mx = -INFINITY;
      for (int64_t j = 0; j < Mk; ++j) {
        double d = 0;
        for (int64_t c = 0; c < Dh; ++c) d += test::get(q, (i * H + h) * Dh + c) * test::get(k, (j * H + h) * Dh + c);
        s[j] = d / std::sqrt(static_cast<double>(Dh));
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (double& e : s) l += (e = std::exp(e - mx));
      for (int64_t c = 0; c < Dh; ++c) {
        double o = 0;
        for (int64_t j = 0; j < Mk; ++j) o += s[j] * test::get(v, (j * H + h) * Dh + c);
        o /= l;
        const double e = test::get(out, (i * H + h) * Dh + c) - o;
        num += e * e, den += o * o;
      }
    }
  return std::sqrt(num / den);
}

TEST(Int8Attention, AccuracyWithOutlierChannels) {
  const int64_t Mq = 16, Mk = 512, H = 2, Dh = 128;
  Inputs in(Mq, Mk, H, Dh, 77);
  HostTensor stats(DType::f32, {3, H, Dh}), out(DType::bf16, {Mq, H, Dh}), bf(DType::bf16, {Mq, H, Dh});
  KeysBuf kb(Mk, H, Dh);
  prepare_all(in, stats, kb.keys);
  ASSERT_TRUE(attend(in.q, kb.keys, out, 128).ok());
  const double e8 = rel_error(in, out);
  // The bf16 reference for scale (the native algorithm on the same backend object's twin).
  std::unique_ptr<Backend> native = make_cpu_backend();
  AttentionParams p;
  p.kv_tile = 128;
  ASSERT_TRUE(native->attention(in.q, in.k, in.v, bf, p).ok());
  const double eb = rel_error(in, bf);
  std::printf("rel L2 vs float64: int8 %.3e, bf16 native %.3e\n", e8, eb);
  EXPECT_LT(e8, 3e-2);
  EXPECT_GT(e8, eb);  // quantisation costs something (the test can fail)
}

// ---- refusals ------------------------------------------------------------------------------------

TEST(Int8Attention, Refusals) {
  Inputs in(2, 8, 1, 24, 3, false);  // head dim 24: not a power of two
  HostTensor stats(DType::f32, {3, 1, 24});
  const Status s = cpu()->int8_key_stats(in.k, in.v, stats, 0, true);
  EXPECT_EQ(s.error().code, ErrorCode::unsupported);
  EXPECT_NE(s.message().find("power-of-two head dim"), std::string::npos) << s.message();
  Numerics n;
  n.attention = AttentionAlgorithm::int8;
  // A run's kv_tile divides the statistics block (tiles never straddle blocks, contract v3).
  for (const int64_t bad : {int64_t{300}, 2 * kInt8StatBlock, kInt8MaxKvTile + 1}) {
    n.kv_tile = bad;
    const Status v = validate(n);
    EXPECT_EQ(v.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(v.message().find("divisor of 4096"), std::string::npos) << v.message();
  }
  for (const int64_t good : {int64_t{1}, int64_t{128}, kInt8StatBlock}) {
    n.kv_tile = good;
    EXPECT_TRUE(validate(n).ok());
  }
  EXPECT_EQ(cpu()->numerics().attention, AttentionAlgorithm::int8);
  EXPECT_NE(describe(cpu()->numerics()).find("attention int8"), std::string::npos);
  // A model of another head dim is refused when it loads, naming the device and its algorithms.
  std::unique_ptr<Backend> be = make_cpu_backend();
  Numerics i8;
  i8.attention = AttentionAlgorithm::int8;
  ASSERT_TRUE(be->set_numerics(i8, {}).ok());
  const Status hd = be->set_model_head_dim(24);
  EXPECT_EQ(hd.error().code, ErrorCode::unsupported);
  EXPECT_NE(hd.message().find("cpu backend cannot run attention int8 for a model of head dim 24"), std::string::npos)
      << hd.message();
  EXPECT_NE(hd.message().find("native"), std::string::npos) << hd.message();
  EXPECT_TRUE(be->set_model_head_dim(64).ok());
}

}  // namespace
}  // namespace ls

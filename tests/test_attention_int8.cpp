// INT8 attention on the CPU reference (AttentionAlgorithm::int8; docs/int8-attention.md,
// backend.h; contract v3: statistics per absolute block of kInt8StatBlock = 4096 keys;
// contract v4: K's scale per key group (j / 128, j % 8), the score as one FFMA).
// What is checked:
//  - the element arithmetic (int8_attention_math.h) on hand-computed values: exp2e, the
//    p8 threshold table of contract v2 (sorted, its steps, near correctly rounded 2^x),
//    the quantiser, the division-free quotient, the rotation's (Rx).(Ry) = Dh x.y;
//  - a 1-key case computed by hand, and the whole op memcmp-equal to a plain scalar
//    statement of the spec written here (its own statistics, group scales, all scores
//    stored, no chunking, one thread; the output, k8, sk and the V-scale table), over one
//    statistics block and over 2-4 blocks (Mk 4097 .. 12289, kv_tile 1 .. 4096) with V's
//    scale differing strongly per block and K shifted per block; the scalar's output
//    without the rho rescale, with K's centre over all keys, or with v3's per-key K scale
//    NOT equal (the cases exercise what v3 and v4 add), and v3's score form giving other
//    bytes somewhere; at huge scores (|sT| >= 4096: v3's form there, both forms in a GPU
//    warp) the scalar's bytes, finite, and the one-FFMA form everywhere other bytes;
//  - the statistics (K's extremes over block 0, max |v| per block) by a direct count;
//  - plan invariance (memcmp): statistics accumulated over any slicing in any order
//    (slices crossing block boundaries), prepare per key chunk with its k0 (whole 128-key
//    tiles, contract v4; chunks crossing blocks; statistics complete only up to the chunk's
//    block) equal to one prepare, the V-scale rows of other blocks untouched, a prepare in
//    pieces into slices of one buffer equal to one prepare, query slicings (a last slice of
//    1 row), streamed key chunks carrying the fp32 state (each prepared on its own over its
//    whole key groups; chunks off the 128 grid and crossing blocks), slices of one prepared
//    set, kv_tile 64 and 288 (longer than the reference's 256-key walk) within a block, 64
//    and 4096 (a tile = a block) across blocks; sizes Mk = 1, 97, 1025, 9000;
//  - accuracy against float64 attention with outlier channels in K (a bound, and worse
//    than bf16's), over one block and over 3 blocks with V's scale per block 1, 8, 1/4
//    (comparable errors);
//  - the refusals: head dim, scale, kv_tile, backend without int8, a prepare from a k0 off
//    the 128-key tiles (contract v4), a call crossing a block boundary with a kv_tile not
//    dividing 4096 or a first key not a multiple of kv_tile (kv_tile 300 within one block is
//    fine), and (death tests: a failed internal check) keys past the statistics' or the
//    V-scale table's blocks, or a V-scale table and statistics of different block counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
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

// A byte buffer holding one Int8Keys of keys [k0, k0 + n) of a sequence of S keys (S 0: k0 +
// n) and its own V-scale table of the sequence's statistics blocks (zeroed; plus guard bytes
// via HostTensor).
struct KeysBuf {
  KeysBuf(int64_t n, int64_t H, int64_t Dh, int64_t k0 = 0, int64_t S = 0)
      : buf(DType::u8, {int8_keys_bytes(n, H, Dh) + 256}),
        vs(DType::f32, {int8_stat_blocks(std::max(S, k0 + n)), 2, H, Dh}) {
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

// The statistics block of contract v3, stated here for the scalar statement (not taken from
// the library's code paths).
constexpr int64_t kBlock = 4096;
static_assert(kBlock == kInt8StatBlock);

// Makes the statistics blocks of `in` differ: V of key j times v_factor[j / 4096] (the last
// factor for later blocks; powers of two: exact in bf16), K of block b > 0 shifted by
// b * k_shift in every channel.
void skew_blocks(Inputs& in, const std::vector<double>& v_factor, double k_shift) {
  const int64_t Mk = in.k.view().size(0), HD = in.k.view().size(1) * in.k.view().size(2);
  for (int64_t j = 0; j < Mk; ++j) {
    const size_t b = static_cast<size_t>(j / kBlock);
    const double f = v_factor[std::min(b, v_factor.size() - 1)];
    for (int64_t i = j * HD; i < (j + 1) * HD; ++i) {
      test::set(in.v, i, f * test::get(in.v, i));
      if (b > 0) test::set(in.k, i, test::get(in.k, i) + static_cast<double>(b) * k_shift);
    }
  }
}
// The multi-block inputs: V's scale 1, 8, 1/4, 2 per block (rho far from 1), K shifted per
// block (K's centre over block 0 differs from one over all keys).
const std::vector<double> kVFactors = {1.0, 8.0, 0.25, 2.0};
constexpr double kKShift = 0.375;

// Stats + prepare over all keys (one call each).
void prepare_all(const Inputs& in, const TensorView& stats, const Int8Keys& keys) {
  ASSERT_TRUE(cpu()->int8_key_stats(in.k, in.v, stats, 0, true).ok());
  ASSERT_TRUE(cpu()->int8_prepare(in.k, in.v, stats, keys).ok());
}

// A streamed chunk's keys [c0, c1) of a sequence of S keys, prepared on their own: contract
// v4's prepare covers whole key groups, so the keys [a, b) around the chunk (a = c0 rounded
// down to a multiple of 128, b = c1 rounded up to one or S) go into their own buffer with
// k0 = a (its own V-scale table), and the chunk is its slice (k0 = c0).
struct ChunkKeys {
  ChunkKeys(const Inputs& in, const TensorView& stats, int64_t c0, int64_t c1, int64_t S)
      : a(c0 / kInt8KeyGroupTile * kInt8KeyGroupTile),
        b(std::min(S, (c1 + kInt8KeyGroupTile - 1) / kInt8KeyGroupTile * kInt8KeyGroupTile)),
        buf(b - a, in.k.view().size(1), in.k.view().size(2), a, S) {
    ok = cpu()->int8_prepare(in.k.view().slice_rows(a, b), in.v.view().slice_rows(a, b), stats, buf.keys).ok();
    keys = buf.keys.slice(c0 - a, c1 - a);
  }
  int64_t a, b;
  KeysBuf buf;
  Int8Keys keys;
  bool ok = false;
};

Status attend(const TensorView& q, const Int8Keys& keys, const TensorView& out, int64_t kv_tile) {
  AttentionParams p;
  p.kv_tile = kv_tile;
  return cpu()->attention_int8(q, keys, out, p);
}

// Each slicing of the queries (cuts over [0, Mq)) against the same keys gives ref's bytes.
void expect_query_slicings(const Inputs& in, const Int8Keys& keys, const HostTensor& ref, int64_t kv_tile,
                           const std::vector<std::vector<int64_t>>& slicings) {
  for (const std::vector<int64_t>& cuts : slicings) {
    HostTensor out(DType::bf16, {in.q.view().size(0), in.q.view().size(1), in.q.view().size(2)});
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      ASSERT_TRUE(attend(in.q.view().slice_rows(cuts[i], cuts[i + 1]), keys, out.view().slice_rows(cuts[i], cuts[i + 1]),
                         kv_tile)
                      .ok());
    EXPECT_TRUE(test::same_bytes(ref, out));
  }
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

// exp2e_nb (the CUDA kernels' branch-free exp2e) gives exp2e's bits. Here: every 29th fp32
// pattern of [-130, -0] (38.8 M), every pattern within 4,096 of each integer and half-integer
// in [-130, 0] (rint's ties and steps, the cut at -125), and the special values. (Every pattern
// of [-130, -0], 1,124,204,554, was compared once with kStride = 1: 0 differ, 37 s.)
TEST(Int8Math, BranchFreeExp2GivesExp2eBits) {
  constexpr uint32_t kStride = 29;
  int64_t n = 0, bad = 0;
  const auto check = [&](float t) {
    const float a = i8a::exp2e(t), b = i8a::exp2e_nb(t);
    if (std::memcmp(&a, &b, 4) != 0 && bad++ < 5) ADD_FAILURE() << "t " << t << ": exp2e " << a << ", exp2e_nb " << b;
    ++n;
  };
  for (uint64_t u = 0x80000000u; u <= 0xC3020000u; u += kStride) check(float_of(static_cast<uint32_t>(u)));
  for (int k = -260; k <= 0; ++k) {
    const uint32_t b = bits_of(0.5f * static_cast<float>(k));
    for (int d = -4096; d <= 4096; ++d) {
      const uint32_t u = b + static_cast<uint32_t>(d);
      const float t = float_of(u);
      if (t <= 0.0f && t >= -130.0f) check(t);
    }
  }
  for (const float t : {0.0f, -0.0f, -INFINITY, -125.0f, -125.5f, -124.5f, -0.5f, -1.5f, -2.5f, -1e-45f})
    check(t);
  EXPECT_EQ(bad, 0) << "of " << n;
  EXPECT_GT(n, 40000000);
}
// fold_factors (the CUDA kernels' alpha and beta by one exp2e_nb) gives §4.4's two exp2e: for
// maxima that rise, fall, stay, start at -inf, and differ by more than the cut at -125.
TEST(Int8Math, FoldFactorsEqualTheTwoExp2e) {
  const float ms[] = {-INFINITY, -300.0f, -7.25f, -1.0f, -0.0f, 0.0f, 0x1p-20f, 1.5f, 3.0f, 126.0f, 4095.0f};
  int64_t n = 0;
  for (const float m : ms)
    for (int k = -2000; k <= 2000; ++k) {
      const float sT = 0.0625f * static_cast<float>(k) + 0x1p-9f * static_cast<float>(k % 7);
      const float m_new = sT > m ? sT : m;
      const float alpha = m == -INFINITY ? 0.0f : i8a::exp2e(m - m_new);
      const float beta = i8a::exp2e(sT - m_new);
      float a2 = -1.0f, b2 = -1.0f;
      i8a::fold_factors(m, sT, a2, b2);
      ASSERT_EQ(bits_of(alpha), bits_of(a2)) << "m " << m << " sT " << sT;
      ASSERT_EQ(bits_of(beta), bits_of(b2)) << "m " << m << " sT " << sT;
      ++n;
    }
  EXPECT_EQ(n, 11 * 4001);
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

// Mistakes the scalar statement makes on request: a case whose output does not change under
// one would not test what the contract adds: v3's rho rescale and K's centre over block 0,
// and v4's K scale per key group (per_key_scale: v3's prepare, a scale per key row) and v4's
// score (v3_score: v3's x = fmaf(a, fl32(u_j - mu_T), kP8Top) at every |sT|; fma_everywhere:
// the one-FFMA form at |sT| >= 4096 too, where v4 keeps v3's).
enum class Mistake { none, no_rescale, mu_over_all_keys, per_key_scale, v3_score, fma_everywhere };

struct ScalarResult {
  std::vector<uint16_t> out;  // bf16 [Mq, H, Dh]
  std::vector<float> vs;      // f32 [NB, 2, H, Dh]: sv_b, rho_b
  std::vector<float> sk;      // f32 [Mk, H]: the key scales (per key group, stored per key)
  std::vector<int8_t> k8;     // i8 [Mk, H, Dh]
  int64_t big_tiles = 0;      // (query, tile) pairs with |sT| >= 4096 (v3's form)
  int64_t above_top = 0;      // scores with x > kP8Top (p8 = 255 by saturation)
};

// The key groups of contract v4, stated here for the scalar statement.
constexpr int64_t kGroupTile = 128, kGroupStride = 8;
static_assert(kGroupTile == kInt8KeyGroupTile && kGroupStride == kInt8KeyGroupStride);

// The spec of docs/int8-attention.md §3-4 (contract v2's arithmetic, v3's statistics blocks,
// v4's key groups and score), written plainly: per head, K's centre mu over the keys of block
// 0 (keys < 4096), per block b sv_b = row_scale(max |v| over block b's keys) and rho_b =
// sv_{b-1} / sv_b (rho_0 = 1), V of key j quantised with the sv of j's block; K's row y_j =
// R(k_j - mu), e_j = max_c |y_jc|, sk_j = row_scale(max of e over j's group (j / 128, j % 8)),
// k8_j = quant(y_j, sk_j); every score of a tile stored: d_j the integer dot product, u_j =
// fl32(sk_j d_j), mu_T = max u_j, sT = fl32(a mu_T), where |sT| < 4096 x_j = fmaf(fl32(a sk_j),
// d_j, fl32(kP8Top - sT)) (may pass kP8Top), else v3's x_j = fmaf(a, fl32(u_j - mu_T), kP8Top);
// p8 by counting the thresholds (255 for every x >= theta_255); sums in key order, acc rescaled by rho_b before folding the tile that starts block
// b, the output by the last key's block's sv; one query at a time. kv_tile must divide 4096
// where Mk > 4096 (tiles from key 0). (-ffp-contract=off: every a * b + c below is two
// roundings; the contract's fused steps are std::fmaf.)
ScalarResult scalar_reference(const Inputs& in, int64_t kv_tile, Mistake mistake = Mistake::none) {
  const TensorView &q = in.q.view(), &k = in.k.view(), &v = in.v.view();
  const int64_t Mq = q.size(0), Mk = k.size(0), H = q.size(1), Dh = q.size(2);
  const int64_t NB = Mk <= kBlock ? 1 : (Mk + kBlock - 1) / kBlock;
  const float cs = i8a::score_factor(static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh))), static_cast<int>(Dh));
  ScalarResult res;
  res.out.resize(static_cast<size_t>(Mq * H * Dh));
  res.vs.resize(static_cast<size_t>(NB * 2 * H * Dh));
  res.sk.resize(static_cast<size_t>(Mk * H));
  res.k8.resize(static_cast<size_t>(Mk * H * Dh));
  auto at = [&](const TensorView& t, int64_t r, int64_t h, int64_t c) {
    return static_cast<float>(test::get(t, (r * H + h) * Dh + c));
  };
  // Rotates y in place; returns max |y| (the inputs are finite: no NaN to ignore).
  auto rotate_amax = [&](std::vector<float>& y) {
    i8a::rotate(y.data(), static_cast<int>(Dh));
    float amax = 0;
    for (float e : y) amax = std::max(amax, std::fabs(e));
    return amax;
  };
  for (int64_t h = 0; h < H; ++h) {
    std::vector<float> mu(Dh);
    std::vector<std::vector<float>> sv(NB, std::vector<float>(Dh)), rho(NB, std::vector<float>(Dh));
    const int64_t centre_keys = mistake == Mistake::mu_over_all_keys ? Mk : std::min(Mk, kBlock);
    for (int64_t c = 0; c < Dh; ++c) {
      float kmax = -INFINITY, kmin = INFINITY;
      for (int64_t j = 0; j < centre_keys; ++j)
        kmax = std::max(kmax, at(k, j, h, c)), kmin = std::min(kmin, at(k, j, h, c));
      mu[c] = 0.5f * (kmax + kmin);
      for (int64_t blk = 0; blk < NB; ++blk) {
        float vabs = 0;
        for (int64_t j = blk * kBlock; j < std::min(Mk, (blk + 1) * kBlock); ++j)
          vabs = std::max(vabs, std::fabs(at(v, j, h, c)));
        sv[blk][c] = i8a::row_scale(vabs);
        rho[blk][c] = blk == 0 ? 1.0f : sv[blk - 1][c] / sv[blk][c];
        res.vs[static_cast<size_t>(((2 * blk) * H + h) * Dh + c)] = sv[blk][c];
        res.vs[static_cast<size_t>(((2 * blk + 1) * H + h) * Dh + c)] = rho[blk][c];
      }
    }
    // K: the rotated, centred rows and their max |y|, then the group scales, then k8.
    std::vector<std::vector<float>> yk(Mk, std::vector<float>(Dh));
    std::vector<float> e(Mk);
    for (int64_t j = 0; j < Mk; ++j) {
      for (int64_t c = 0; c < Dh; ++c) yk[j][c] = at(k, j, h, c) - mu[c];
      e[j] = rotate_amax(yk[j]);
    }
    std::vector<std::vector<int>> k8(Mk), v8(Mk);
    std::vector<float> sk(Mk);
    for (int64_t j = 0; j < Mk; ++j) {
      float g = e[j];
      if (mistake != Mistake::per_key_scale)
        for (int64_t i = j / kGroupTile * kGroupTile + j % kGroupStride; i < std::min(Mk, (j / kGroupTile + 1) * kGroupTile);
             i += kGroupStride)
          g = std::max(g, e[i]);
      sk[j] = i8a::row_scale(g);
      res.sk[static_cast<size_t>(j * H + h)] = sk[j];
      k8[j].resize(Dh);
      v8[j].resize(Dh);
      for (int64_t c = 0; c < Dh; ++c) {
        k8[j][c] = i8a::quant(yk[j][c], sk[j]);
        res.k8[static_cast<size_t>((j * H + h) * Dh + c)] = static_cast<int8_t>(k8[j][c]);
        v8[j][c] = i8a::quant(at(v, j, h, c), sv[j / kBlock][c]);
      }
    }
    for (int64_t i = 0; i < Mq; ++i) {
      std::vector<float> y(Dh);
      for (int64_t c = 0; c < Dh; ++c) y[c] = at(q, i, h, c);
      const float sq = i8a::row_scale(rotate_amax(y));
      std::vector<int> q8(Dh);
      for (int64_t c = 0; c < Dh; ++c) q8[c] = i8a::quant(y[c], sq);
      const float a = sq * cs;
      float m = -INFINITY, l = 0;
      std::vector<float> acc(Dh, 0.0f);
      for (int64_t t0 = 0; t0 < Mk; t0 += kv_tile) {
        const int64_t t1 = std::min(Mk, t0 + kv_tile);
        std::vector<int> d(t1 - t0);
        std::vector<float> u(t1 - t0);
        float mu_t = -INFINITY;
        for (int64_t j = t0; j < t1; ++j) {
          int dj = 0;
          for (int64_t c = 0; c < Dh; ++c) dj += q8[c] * k8[j][c];
          d[j - t0] = dj;
          u[j - t0] = sk[j] * static_cast<float>(dj);
          mu_t = std::max(mu_t, u[j - t0]);
        }
        const float sT = a * mu_t;
        res.big_tiles += std::fabs(sT) >= 4096.0f;
        const bool one_fma = mistake == Mistake::fma_everywhere || (mistake != Mistake::v3_score && std::fabs(sT) < 4096.0f);
        const float b_t = i8a::kP8Top - sT;
        long lt = 0;
        std::vector<long> ot(Dh, 0);
        for (int64_t j = t0; j < t1; ++j) {
          const float x = one_fma ? std::fmaf(a * sk[j], static_cast<float>(d[j - t0]), b_t)
                                  : std::fmaf(a, u[j - t0] - mu_t, i8a::kP8Top);
          res.above_top += x > i8a::kP8Top;
          int p = 0;
          for (uint32_t tb : i8a::kP8ThresholdBits) p += float_of(tb) <= x;
          lt += p;
          for (int64_t c = 0; c < Dh; ++c) ot[c] += p * v8[j][c];
        }
        // acc from block b - 1's units of V to block b's where this tile starts block b.
        if (mistake != Mistake::no_rescale && t0 > 0 && t0 % kBlock == 0)
          for (int64_t c = 0; c < Dh; ++c) acc[c] = acc[c] * rho[t0 / kBlock][c];
        const float m_new = std::max(m, sT);
        const float alpha = m == -INFINITY ? 0.0f : i8a::exp2e(m - m_new);
        const float beta = i8a::exp2e(sT - m_new);
        l = std::fmaf(static_cast<float>(lt), beta, l * alpha);
        for (int64_t c = 0; c < Dh; ++c) acc[c] = std::fmaf(static_cast<float>(ot[c]), beta, acc[c] * alpha);
        m = m_new;
      }
      const std::vector<float>& sv_last = sv[(Mk - 1) / kBlock];
      for (int64_t c = 0; c < Dh; ++c)
        res.out[static_cast<size_t>((i * H + h) * Dh + c)] = f32_to_bf16(acc[c] * sv_last[c] / l);
    }
  }
  return res;
}

TEST(Int8Attention, EqualsTheScalarStatementOfTheSpec) {
  struct Case {
    int64_t Mq, Mk, H, Dh, kv_tile;
  };
  // One statistics block (v2's bytes), then 2-4 blocks: a tile of 64, a last block of one
  // key, a tile = a block, a tile of one key.
  int64_t v3_score_differ = 0, above_top = 0;
  for (const Case& c : {Case{5, 700, 2, 64, 300}, Case{3, 97, 1, 16, 1024}, Case{2, 1, 2, 8, 7},
                        Case{4, 260, 1, 128, 64}, Case{3, 9000, 1, 16, 64}, Case{3, 4097, 2, 8, 128},
                        Case{2, 8192, 1, 16, 4096}, Case{2, 12289, 1, 16, 1}}) {
    SCOPED_TRACE("Mq " + std::to_string(c.Mq) + " Mk " + std::to_string(c.Mk) + " Dh " + std::to_string(c.Dh) +
                 " tile " + std::to_string(c.kv_tile));
    const bool blocks = c.Mk > kBlock;
    Inputs in(c.Mq, c.Mk, c.H, c.Dh, 11 + c.Mk);
    if (blocks) skew_blocks(in, kVFactors, kKShift);
    const int64_t NB = int8_stat_blocks(c.Mk);
    HostTensor stats(DType::f32, {2 + NB, c.H, c.Dh}), out(DType::bf16, {c.Mq, c.H, c.Dh});
    KeysBuf kb(c.Mk, c.H, c.Dh);
    prepare_all(in, stats, kb.keys);
    ASSERT_TRUE(attend(in.q, kb.keys, out, c.kv_tile).ok());
    const ScalarResult want = scalar_reference(in, c.kv_tile);
    EXPECT_EQ(std::memcmp(out.data(), want.out.data(), want.out.size() * 2), 0);
    ASSERT_EQ(kb.vs.bytes(), want.vs.size() * 4);
    EXPECT_EQ(std::memcmp(kb.vs.data(), want.vs.data(), kb.vs.bytes()), 0);
    ASSERT_EQ(static_cast<size_t>(kb.keys.sk.numel()), want.sk.size());
    EXPECT_EQ(std::memcmp(kb.keys.sk.data, want.sk.data(), want.sk.size() * 4), 0);
    ASSERT_EQ(static_cast<size_t>(kb.keys.k8.numel()), want.k8.size());
    EXPECT_EQ(std::memcmp(kb.keys.k8.data, want.k8.data(), want.k8.size()), 0);
    EXPECT_GT(test::count_nonzero(out), c.Mq * c.H * c.Dh / 2);
    EXPECT_TRUE(kb.buf.guards_intact() && kb.vs.guards_intact() && out.guards_intact() && stats.guards_intact());
    // Contract v4: the group scale matters wherever a group has more than one key (v3's
    // per-key scale gives other bytes); the one-FFMA score against v3's form changes a p8 only
    // now and then at ordinary scores (counted over the cases, below).
    if (c.Mk > kGroupStride) {
      const ScalarResult per_key = scalar_reference(in, c.kv_tile, Mistake::per_key_scale);
      EXPECT_NE(std::memcmp(want.sk.data(), per_key.sk.data(), want.sk.size() * 4), 0);
      EXPECT_NE(std::memcmp(out.data(), per_key.out.data(), per_key.out.size() * 2), 0) << "per-key K scale";
    }
    const ScalarResult v3 = scalar_reference(in, c.kv_tile, Mistake::v3_score);
    for (size_t i = 0; i < v3.out.size(); ++i) v3_score_differ += v3.out[i] != static_cast<const uint16_t*>(out.data())[i];
    above_top += want.above_top;
    if (!blocks) continue;
    // The rescale and block 0's centre matter here: rho_b != 1 in most channels of the blocks
    // b > 0, and the scalar statement without the rescale, or centred over all keys, gives
    // other bytes.
    const int64_t HD = c.H * c.Dh;
    int64_t moved = 0;
    for (int64_t blk = 1; blk < NB; ++blk)
      for (int64_t i = 0; i < HD; ++i) moved += want.vs[static_cast<size_t>((2 * blk + 1) * HD + i)] != 1.0f;
    EXPECT_GT(moved, (NB - 1) * HD / 2);
    for (const Mistake m : {Mistake::no_rescale, Mistake::mu_over_all_keys}) {
      const ScalarResult wrong = scalar_reference(in, c.kv_tile, m);
      EXPECT_NE(std::memcmp(out.data(), wrong.out.data(), wrong.out.size() * 2), 0) << static_cast<int>(m);
    }
  }
  // v4's x may pass kP8Top (p8 255 by saturation) even at ordinary scores, and v3's score form
  // gives other bytes somewhere in these cases.
  std::printf("[ info ] over the cases: %lld scores x > kP8Top; v3's score form: %lld outputs differ\n",
              static_cast<long long>(above_top), static_cast<long long>(v3_score_differ));
  EXPECT_GT(above_top, 0);
  EXPECT_GT(v3_score_differ, 0);
}

// Inputs with huge scores and near-ties among them, built in the rotated domain (R = H D,
// i8a::rotate; R^-1 = D H / Dh; n = Dh / 2): key 2i has rotated row 2 (127 (e_0 + .. +
// e_{n-1}) + delta_i e_m), key 2i + 1 its negation (K's centre is 0), delta_i = i % 11 - 5,
// m = n + 1 + h % (n - 1); query r has f_r (127 (e_0 + .. + e_{n-1}) + beta_r e_m), f_r = 64,
// 2^-6, -64 by row, beta_r 1..3. bf16 keeps everything but delta, beta in channels 0 and n
// (a change below 0.2 in every rotated channel), so k8 = +-(127 x n, delta), q8 = (127 x n,
// beta) and d = +-(16129 n + beta delta): at f = +-64 |sT| ~ 1.9e5 (log2 units, Dh 64) with
// keys 0.37 beta units apart (many p8 between 1 and 254 in a tile; the one-FFMA form's
// cancellation there is up to 2^-24 4 |sT| ~ 0.05), at 2^-6 ordinary scores (|sT| ~ 45).
void make_huge_scores(Inputs& in) {
  const int64_t Mq = in.q.view().size(0), Mk = in.k.view().size(0), H = in.k.view().size(1), Dh = in.k.view().size(2);
  const int64_t n = Dh / 2;
  // x = scale D H y / Dh for y = y0 (e_0 + .. + e_{n-1}) + y1 e_m: sum_{i<n} (-1)^popcount(i & c)
  // is n where c % n == 0, else 0.
  const auto unrotate = [&](TensorView t, int64_t row, int64_t h, double scale, double y0, double y1) {
    const int64_t m = n + 1 + h % (n - 1);
    for (int64_t c = 0; c < Dh; ++c) {
      const double hm = (std::popcount(static_cast<uint64_t>(m & c)) % 2) != 0 ? -1.0 : 1.0;
      const double y = (c % n == 0 ? y0 * static_cast<double>(n) : 0.0) + hm * y1;
      const double sign = i8a::negative_sign(static_cast<int>(c)) ? -1.0 : 1.0;
      test::set(t, (row * H + h) * Dh + c, scale * sign * y / static_cast<double>(Dh));
    }
  };
  for (int64_t j = 0; j < Mk; ++j)
    for (int64_t h = 0; h < H; ++h)
      unrotate(in.k.view(), j, h, j % 2 == 0 ? 2.0 : -2.0, 127.0, static_cast<double>((j / 2) % 11 - 5));
  const double f[3] = {64.0, 0x1p-6, -64.0};
  for (int64_t r = 0; r < Mq; ++r)
    for (int64_t h = 0; h < H; ++h) unrotate(in.q.view(), r, h, f[r % 3], 127.0, static_cast<double>(1 + r % 3));
}

// Contract v4's score at huge scores: where |sT| >= 4096 (i8a::kScoreFmaLimit) the one-FFMA
// form's cancellation could lose the maximum's 255, so those (row, tile) pairs take v3's form
// (the CUDA kernels take both forms per row in a warp that has such a row). On the CPU, rows
// of both kinds (make_huge_scores): the scalar statement's bytes, every output
// finite; the one-FFMA form at every |sT| gives other bytes (so the rows above 4096 test the
// switch), and scores x > kP8Top occur in the one-FFMA rows.
TEST(Int8Attention, HugeScoresEqualTheScalarStatement) {
  static_assert(i8a::kScoreFmaLimit == 4096.0f);
  for (const int64_t tile : {int64_t{128}, int64_t{64}}) {
    SCOPED_TRACE("kv_tile " + std::to_string(tile));
    const int64_t Mq = 8, Mk = 700, H = 2, Dh = 64;
    Inputs in(Mq, Mk, H, Dh, 61, false);
    make_huge_scores(in);
    HostTensor stats(DType::f32, {3, H, Dh}), out(DType::bf16, {Mq, H, Dh});
    KeysBuf kb(Mk, H, Dh);
    prepare_all(in, stats, kb.keys);
    ASSERT_TRUE(attend(in.q, kb.keys, out, tile).ok());
    const ScalarResult want = scalar_reference(in, tile);
    EXPECT_EQ(std::memcmp(out.data(), want.out.data(), want.out.size() * 2), 0);
    EXPECT_EQ(std::memcmp(kb.keys.sk.data, want.sk.data(), want.sk.size() * 4), 0);
    int64_t finite = 0;
    for (int64_t i = 0; i < out.view().numel(); ++i) finite += std::isfinite(test::get(out, i));
    EXPECT_EQ(finite, Mq * H * Dh);
    EXPECT_GT(test::count_nonzero(out), Mq * H * Dh / 2);
    const int64_t tiles = (Mk + tile - 1) / tile;
    const auto differ = [&](Mistake m) {
      const ScalarResult r = scalar_reference(in, tile, m);
      int64_t n = 0;
      for (size_t i = 0; i < r.out.size(); ++i) n += r.out[i] != want.out[i];
      return n;
    };
    const int64_t fma_all = differ(Mistake::fma_everywhere), v3 = differ(Mistake::v3_score);
    std::printf("[ info ] kv_tile %lld: %lld of %lld (query, tile) pairs with |sT| >= 4096, %lld scores x > kP8Top; "
                "of %zu outputs, the one-FFMA form everywhere changes %lld, v3's form everywhere %lld\n",
                static_cast<long long>(tile), static_cast<long long>(want.big_tiles),
                static_cast<long long>(Mq * H * tiles), static_cast<long long>(want.above_top), want.out.size(),
                static_cast<long long>(fma_all), static_cast<long long>(v3));
    EXPECT_GE(want.big_tiles, Mq / 2 * H * tiles);  // the rows of f = +-64
    EXPECT_LT(want.big_tiles, Mq * H * tiles);      // and those of 2^-6
    EXPECT_GT(fma_all, 0);
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
  // Prepare per chunk (keys [a, b) into a chunk's own buffer) = the chunk's bytes of one
  // prepare. Contract v4: a chunk covers whole key groups, from a multiple of 128 to a
  // multiple of 128 or the sequence's end (a last chunk of 1 key, one of 1 tile).
  for (const auto& [a, b] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 512}, {512, 1024}, {1024, 1025}, {128, 256}, {896, 1025}}) {
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

// Contract v4: a prepare call starts at a multiple of 128 keys (its key groups are whole):
// another k0 is refused (invalid_argument naming k0 and 128), writing nothing.
TEST(Int8Attention, PrepareRefusesAFirstKeyOffTheGroupTiles) {
  const int64_t Mk = 1025, H = 2, Dh = 16;
  Inputs in(1, Mk, H, Dh, 55);
  HostTensor stats(DType::f32, {3, H, Dh});
  ASSERT_TRUE(cpu()->int8_key_stats(in.k, in.v, stats, 0, true).ok());
  for (const int64_t k0 : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{96}, int64_t{1000}}) {
    KeysBuf part(Mk - k0, H, Dh, k0);
    const Status st =
        cpu()->int8_prepare(in.k.view().slice_rows(k0, Mk), in.v.view().slice_rows(k0, Mk), stats, part.keys);
    ASSERT_FALSE(st.ok()) << "k0 " << k0;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.message().find(std::to_string(k0)), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("128"), std::string::npos) << st.message();
    EXPECT_EQ(test::count_nonzero(part.keys.k8), 0) << "k0 " << k0;
    EXPECT_EQ(test::count_nonzero(part.vs), 0) << "k0 " << k0;
  }
  for (const int64_t k0 : {int64_t{0}, int64_t{128}, int64_t{1024}}) {
    KeysBuf part(Mk - k0, H, Dh, k0);
    EXPECT_TRUE(
        cpu()->int8_prepare(in.k.view().slice_rows(k0, Mk), in.v.view().slice_rows(k0, Mk), stats, part.keys).ok())
        << "k0 " << k0;
  }
}

// A prepare in pieces of whole 128-key tiles into slices of one buffer (int8 K/V offload's
// walk; pieces of 1, 2 and 3 tiles, across a statistics block boundary, a last piece ending
// at the sequence's end) = one prepare, byte for byte: k8, sk, v8t, vs.
TEST(Int8Attention, PrepareInWholeTilesEqualsOnePrepare) {
  const int64_t Mk = 4500, H = 2, Dh = 16;
  Inputs in(1, Mk, H, Dh, 56);
  skew_blocks(in, kVFactors, kKShift);
  HostTensor stats(DType::f32, {2 + int8_stat_blocks(Mk), H, Dh});
  KeysBuf all(Mk, H, Dh), pieces(Mk, H, Dh);
  prepare_all(in, stats, all.keys);
  const std::vector<int64_t> cuts = {0, 128, 384, 768, 3968, 4224, 4352, Mk};
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    ASSERT_TRUE(cpu()->int8_prepare(in.k.view().slice_rows(cuts[i], cuts[i + 1]),
                                    in.v.view().slice_rows(cuts[i], cuts[i + 1]), stats,
                                    pieces.keys.slice(cuts[i], cuts[i + 1]))
                    .ok());
  EXPECT_TRUE(test::same_bytes(pieces.keys.k8, all.keys.k8));
  EXPECT_TRUE(test::same_bytes(pieces.keys.sk, all.keys.sk));
  EXPECT_TRUE(test::same_bytes(pieces.vs, all.vs));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c = 0; c < Dh; ++c)
      EXPECT_EQ(std::memcmp(pieces.keys.v8t.at(h, c), all.keys.v8t.at(h, c), static_cast<size_t>(Mk)), 0);
  EXPECT_GT(test::count_nonzero(all.keys.k8), Mk * H * Dh / 2);
  // The 16 keys of a group share one scale (keys j and j + 8 of one tile, the last partial
  // tile included), so a piece ending inside a tile (the caller's duty broken) would see a
  // part of its last groups only.
  int64_t pairs = 0, same = 0;
  const float* sk = all.keys.sk.ptr<float>();
  for (int64_t j = 0; j + kGroupStride < Mk; ++j)
    if (j / kGroupTile == (j + kGroupStride) / kGroupTile)
      for (int64_t h = 0; h < H; ++h) ++pairs, same += sk[j * H + h] == sk[(j + kGroupStride) * H + h];
  EXPECT_EQ(same, pairs);
  EXPECT_GT(pairs, Mk * H * 14 / 16);
  EXPECT_TRUE(pieces.buf.guards_intact() && pieces.vs.guards_intact());
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
      expect_query_slicings(in, kb.keys, ref, tile, {{0, 36, 37}, {0, 1, 2, 19, 37}});
      // Streamed keys: chunks of whole tiles, each prepared on its own (the offload path; the
      // prepare over the chunk's whole key groups, ChunkKeys), state carried.
      for (const int64_t chunk : {tile, 3 * tile, 1024 / tile * tile}) {
        HostTensor out(DType::bf16, {Mq, H, Dh}), state(DType::f32, {Mq, H, Dh + kAttentionStateExtra});
        for (int64_t c0 = 0; c0 < Mk; c0 += chunk) {
          const int64_t c1 = std::min(Mk, c0 + chunk);
          const ChunkKeys part(in, stats, c0, c1, Mk);
          ASSERT_TRUE(part.ok) << "keys [" << part.a << ", " << part.b << ")";
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

// Prepared keys [a, b) of a chunk (its own buffer, k0 = a, a V-scale table of the sequence's
// blocks, zeroed) equal to those keys of one prepare; the chunk's blocks' V-scale rows equal,
// the other rows untouched.
void expect_chunk_of(const KeysBuf& part, const KeysBuf& all, int64_t a, int64_t b) {
  SCOPED_TRACE("keys [" + std::to_string(a) + ", " + std::to_string(b) + ")");
  const int64_t H = all.keys.k8.size(1), Dh = all.keys.k8.size(2), HD = H * Dh;
  EXPECT_TRUE(test::same_bytes(part.keys.k8, all.keys.k8.slice_rows(a, b)));
  EXPECT_TRUE(test::same_bytes(part.keys.sk, all.keys.sk.slice_rows(a, b)));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c = 0; c < Dh; ++c)
      EXPECT_EQ(std::memcmp(part.keys.v8t.at(h, c), static_cast<int8_t*>(all.keys.v8t.at(h, c)) + a,
                            static_cast<size_t>(b - a)),
                0);
  ASSERT_EQ(part.vs.bytes(), all.vs.bytes());
  const std::vector<float> zeros(static_cast<size_t>(2 * HD), 0.0f);
  for (int64_t blk = 0; blk < all.keys.vs.size(0); ++blk) {
    const bool touched = blk >= a / kBlock && blk <= (b - 1) / kBlock;
    EXPECT_EQ(std::memcmp(part.keys.vs.at(blk), touched ? all.keys.vs.at(blk) : zeros.data(),
                          static_cast<size_t>(2 * HD * 4)),
              0)
        << "block " << blk << (touched ? " (the chunk's)" : " (not the chunk's: untouched)");
  }
  EXPECT_TRUE(part.buf.guards_intact() && part.vs.guards_intact());
}

TEST(Int8Attention, StatisticsAndPrepareAreSliceInvariantAcrossBlocks) {
  const int64_t Mk = 9000, H = 2, Dh = 16, HD = H * Dh, NB = 3;
  ASSERT_EQ(int8_stat_blocks(Mk), NB);
  Inputs in(1, Mk, H, Dh, 6);
  skew_blocks(in, kVFactors, kKShift);
  HostTensor whole(DType::f32, {2 + NB, H, Dh});
  KeysBuf all(Mk, H, Dh);
  prepare_all(in, whole, all.keys);
  // The statistics by a direct count: K's extremes over block 0, max |v| per block.
  for (int64_t i = 0; i < HD; ++i) {
    double kmax = -INFINITY, kmin = INFINITY;
    std::vector<double> vabs(NB, 0.0);
    for (int64_t j = 0; j < Mk; ++j) {
      const double kj = test::get(in.k, j * HD + i);
      if (j < kBlock) kmax = std::max(kmax, kj), kmin = std::min(kmin, kj);
      vabs[j / kBlock] = std::max(vabs[j / kBlock], std::fabs(test::get(in.v, j * HD + i)));
    }
    EXPECT_EQ(test::get(whole, i), kmax);
    EXPECT_EQ(test::get(whole, HD + i), kmin);
    for (int64_t blk = 0; blk < NB; ++blk) EXPECT_EQ(test::get(whole, (2 + blk) * HD + i), vabs[blk]);
  }
  // Statistics over slices (crossing block boundaries; reset on the first call only, in key
  // order and in reverse order) = one call.
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 1, 4000, 4096, 4097, 8191, Mk},
                                           std::vector<int64_t>{0, 4000, 4200, 8191, 8193, Mk}}) {
    for (const bool reverse : {false, true}) {
      HostTensor sliced(DType::f32, {2 + NB, H, Dh});
      const size_t n = cuts.size() - 1;
      for (size_t s = 0; s < n; ++s) {
        const size_t i = reverse ? n - 1 - s : s;
        ASSERT_TRUE(cpu()->int8_key_stats(in.k.view().slice_rows(cuts[i], cuts[i + 1]),
                                          in.v.view().slice_rows(cuts[i], cuts[i + 1]), sliced, cuts[i], s == 0)
                        .ok());
      }
      EXPECT_TRUE(test::same_bytes(whole, sliced)) << "slices at " << cuts[1] << ".. reverse " << reverse;
    }
  }
  // Prepare per chunk with its k0 (chunks within a block, crossing one or two boundaries,
  // starting at one, of one tile; contract v4: whole key groups, from a multiple of 128 to one
  // or to the sequence's end) = the chunk's bytes of one prepare.
  for (const auto& [a, b] : std::vector<std::pair<int64_t, int64_t>>{{0, 4096},
                                                                     {3968, 4224},
                                                                     {3968, 8320},
                                                                     {4096, 8192},
                                                                     {4096, 4224},
                                                                     {8064, 8320},
                                                                     {8192, Mk},
                                                                     {8960, Mk},
                                                                     {128, Mk}}) {
    KeysBuf part(b - a, H, Dh, a, Mk);
    ASSERT_TRUE(cpu()->int8_prepare(in.k.view().slice_rows(a, b), in.v.view().slice_rows(a, b), whole, part.keys).ok());
    expect_chunk_of(part, all, a, b);
  }
  // The streamed prepare: a chunk needs block 0's K and the V of its blocks and of the one
  // before; statistics of keys [0, 8192) only (block 2's V not seen yet) give the same bytes
  // for keys [4096, 8192), statistics of [0, 4096) only for keys [0, 4096).
  for (const int64_t seen : {int64_t{4096}, int64_t{8192}}) {
    HostTensor early(DType::f32, {2 + NB, H, Dh});
    ASSERT_TRUE(
        cpu()->int8_key_stats(in.k.view().slice_rows(0, seen), in.v.view().slice_rows(0, seen), early, 0, true).ok());
    KeysBuf part(kBlock, H, Dh, seen - kBlock, Mk);
    ASSERT_TRUE(cpu()->int8_prepare(in.k.view().slice_rows(seen - kBlock, seen),
                                    in.v.view().slice_rows(seen - kBlock, seen), early, part.keys)
                    .ok());
    expect_chunk_of(part, all, seen - kBlock, seen);
  }
}

TEST(Int8Attention, QuerySlicingsAndKeyChunksAcrossBlocksGiveTheSameBytes) {
  const int64_t Mq = 9, Mk = 9000, H = 2, Dh = 16;
  Inputs in(Mq, Mk, H, Dh, 321);
  skew_blocks(in, kVFactors, kKShift);
  HostTensor stats(DType::f32, {2 + int8_stat_blocks(Mk), H, Dh});
  KeysBuf kb(Mk, H, Dh);
  prepare_all(in, stats, kb.keys);
  for (const int64_t tile : {int64_t{64}, kBlock}) {
    SCOPED_TRACE("kv_tile " + std::to_string(tile));
    HostTensor ref(DType::bf16, {Mq, H, Dh});
    ASSERT_TRUE(attend(in.q, kb.keys, ref, tile).ok());
    EXPECT_GT(test::count_nonzero(ref), Mq * H * Dh / 2);
    // Query slicings, the last slice 1 row.
    expect_query_slicings(in, kb.keys, ref, tile, {{0, 8, 9}, {0, 1, 2, 5, 9}});
    // Streamed keys: chunks of whole tiles, each prepared on its own (over its whole key
    // groups, ChunkKeys: its own V-scale table), state carried; chunks of 1536 and 3 tiles
    // cross block boundaries (3 tiles of 64: chunks off the 128-key grid).
    for (const int64_t chunk : {int64_t{1536}, kBlock, 3 * tile}) {
      if (chunk % tile != 0) continue;
      HostTensor out(DType::bf16, {Mq, H, Dh}), state(DType::f32, {Mq, H, Dh + kAttentionStateExtra});
      int64_t crossing = 0;
      for (int64_t c0 = 0; c0 < Mk; c0 += chunk) {
        const int64_t c1 = std::min(Mk, c0 + chunk);
        crossing += c0 / kBlock != (c1 - 1) / kBlock;
        const ChunkKeys part(in, stats, c0, c1, Mk);
        ASSERT_TRUE(part.ok) << "keys [" << part.a << ", " << part.b << ")";
        AttentionParams p;
        p.kv_tile = tile;
        p.state = state;
        p.state_in = c0 > 0;
        p.finalize = c1 == Mk;
        ASSERT_TRUE(cpu()->attention_int8(in.q, part.keys, out, p).ok());
      }
      EXPECT_TRUE(test::same_bytes(ref, out)) << "chunk " << chunk;
      if (chunk != kBlock) {
        EXPECT_GT(crossing, 0) << "chunk " << chunk;
      }
    }
    // Slices of one prepared set (Int8Keys::slice moves k0): [0, tile), [tile, 8192) across
    // a boundary, [8192, Mk) starting one.
    {
      HostTensor out(DType::bf16, {Mq, H, Dh}), state(DType::f32, {Mq, H, Dh + kAttentionStateExtra});
      const std::vector<int64_t> cuts = {0, tile, 2 * kBlock, Mk};
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        const Int8Keys part = kb.keys.slice(cuts[i], cuts[i + 1]);
        EXPECT_EQ(part.k0, cuts[i]);
        AttentionParams p;
        p.kv_tile = tile;
        p.state = state;
        p.state_in = i > 0;
        p.finalize = i + 2 == cuts.size();
        ASSERT_TRUE(cpu()->attention_int8(in.q, part, out, p).ok());
      }
      EXPECT_TRUE(test::same_bytes(ref, out));
    }
  }
}

// ---- accuracy ----------------------------------------------------------------------------------

// Float64 softmax attention of the bf16 inputs: [Mq, H, Dh].
std::vector<double> exact_attention(const Inputs& in) {
  const TensorView &q = in.q.view(), &k = in.k.view(), &v = in.v.view();
  const int64_t Mq = q.size(0), Mk = k.size(0), H = q.size(1), Dh = q.size(2);
  auto widen = [](const TensorView& t) {
    std::vector<double> w(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) w[static_cast<size_t>(i)] = test::get(t, i);
    return w;
  };
  const std::vector<double> qd = widen(q), kd = widen(k), vd = widen(v);
  std::vector<double> o(static_cast<size_t>(Mq * H * Dh), 0.0), s(static_cast<size_t>(Mk));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Mq; ++i) {
      const double* qr = &qd[static_cast<size_t>((i * H + h) * Dh)];
      double mx = -INFINITY;
      for (int64_t j = 0; j < Mk; ++j) {
        const double* kr = &kd[static_cast<size_t>((j * H + h) * Dh)];
        double d = 0;
        for (int64_t c = 0; c < Dh; ++c) d += qr[c] * kr[c];
        s[j] = d / std::sqrt(static_cast<double>(Dh));
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (double& e : s) l += (e = std::exp(e - mx));
      double* orow = &o[static_cast<size_t>((i * H + h) * Dh)];
      for (int64_t j = 0; j < Mk; ++j) {
        const double* vr = &vd[static_cast<size_t>((j * H + h) * Dh)];
        for (int64_t c = 0; c < Dh; ++c) orow[c] += s[j] * vr[c];
      }
      for (int64_t c = 0; c < Dh; ++c) orow[c] /= l;
    }
  return o;
}

// Relative L2 error of out against the float64 attention.
double rel_error(const std::vector<double>& want, const TensorView& out) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = test::get(out, static_cast<int64_t>(i)) - want[i];
    num += e * e, den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// The errors of int8 (kv_tile 128) and of the bf16 native algorithm against float64.
std::pair<double, double> errors(const Inputs& in) {
  const int64_t Mq = in.q.view().size(0), Mk = in.k.view().size(0), H = in.q.view().size(1), Dh = in.q.view().size(2);
  HostTensor stats(DType::f32, {2 + int8_stat_blocks(Mk), H, Dh}), out(DType::bf16, {Mq, H, Dh}),
      bf(DType::bf16, {Mq, H, Dh});
  KeysBuf kb(Mk, H, Dh);
  prepare_all(in, stats, kb.keys);
  EXPECT_TRUE(attend(in.q, kb.keys, out, 128).ok());
  // The bf16 reference for scale (the native algorithm on the same backend object's twin).
  std::unique_ptr<Backend> native = make_cpu_backend();
  AttentionParams p;
  p.kv_tile = 128;
  EXPECT_TRUE(native->attention(in.q, in.k, in.v, bf, p).ok());
  const std::vector<double> want = exact_attention(in);
  return {rel_error(want, out), rel_error(want, bf)};
}

TEST(Int8Attention, AccuracyWithOutlierChannels) {
  // One statistics block (Mk 512), and three (Mk 9000) with V's scale 1, 8, 1/4 per block:
  // each block's V is quantised on its own scale (v3), so the error stays that of one block.
  const int64_t Mq = 16, H = 2, Dh = 128;
  Inputs one(Mq, 512, H, Dh, 77), three(Mq, 9000, H, Dh, 78);
  skew_blocks(three, kVFactors, 0.0);
  const auto [e1, b1] = errors(one);
  const auto [e3, b3] = errors(three);
  std::printf("rel L2 vs float64: 1 block (Mk 512): int8 %.3e, bf16 native %.3e; 3 blocks (Mk 9000, V x1, x8, "
              "x1/4): int8 %.3e, bf16 native %.3e\n",
              e1, b1, e3, b3);
  EXPECT_LT(e1, 3e-2);
  EXPECT_LT(e3, 3e-2);
  EXPECT_LT(e3, 2 * e1);  // comparable: the blocks' scales cost nothing
  EXPECT_GT(e1, b1);      // quantisation costs something (the test can fail)
  EXPECT_GT(e3, b3);
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

// Tiles never straddle a statistics block: a call whose keys cross a block boundary needs a
// kv_tile dividing 4096 and a first key that is a multiple of it (invalid_argument naming the
// statistics block); within one block any kv_tile and first key are fine.
TEST(Int8Attention, RefusesTilesThatWouldStraddleABlock) {
  const int64_t Mq = 2, Mk = 9000, H = 1, Dh = 16;
  Inputs in(Mq, Mk, H, Dh, 9);
  HostTensor stats(DType::f32, {2 + int8_stat_blocks(Mk), H, Dh}), out(DType::bf16, {Mq, H, Dh});
  KeysBuf kb(Mk, H, Dh);
  prepare_all(in, stats, kb.keys);
  const auto run = [&](int64_t a, int64_t b, int64_t tile) { return attend(in.q, kb.keys.slice(a, b), out, tile); };
  struct Range {
    int64_t a, b, tile;
  };
  for (const Range& r : {Range{0, Mk, 300}, Range{0, Mk, 8192}, Range{0, 4097, 300}, Range{4032, 4160, 128},
                         Range{4080, 4200, 64}, Range{16, Mk, 64}, Range{4096, 8208, 48}}) {
    const Status st = run(r.a, r.b, r.tile);
    ASSERT_FALSE(st.ok()) << "keys [" << r.a << ", " << r.b << ") kv_tile " << r.tile;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.message().find("statistics block"), std::string::npos) << st.message();
  }
  for (const Range& r : {Range{0, 4096, 300}, Range{4096, 8192, 300}, Range{8192, Mk, 300}, Range{4112, 4200, 64},
                         Range{4032, 4160, 64}, Range{4096, Mk, 4096}, Range{0, Mk, 1}, Range{0, 4096, 8192}}) {
    EXPECT_TRUE(run(r.a, r.b, r.tile).ok()) << "keys [" << r.a << ", " << r.b << ") kv_tile " << r.tile;
  }
}

// Keys past the blocks of the statistics or of the V-scale table, and a table and
// statistics of different block counts, are the caller's bug: an internal check fails
// (LS_CHECK_MSG aborts), naming the keys and the blocks.
TEST(Int8AttentionDeathTest, KeysPastTheTablesBlocks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the CPU backend's thread pool
  const int64_t H = 1, Dh = 16;
  Inputs in(1, 4200, H, Dh, 4, false);
  // Keys [3968, 4200): from a multiple of 128 (contract v4's prepare) to the sequence's end.
  const TensorView k = in.k.view().slice_rows(3968, 4200), v = in.v.view().slice_rows(3968, 4200);
  HostTensor one(DType::f32, {3, H, Dh}), two(DType::f32, {4, H, Dh}), out(DType::bf16, {1, H, Dh});
  EXPECT_DEATH((void)cpu()->int8_key_stats(k, v, one, 3968, true),
               "keys \\[3968, 4200\\) lie past the 1 statistics blocks");
  EXPECT_DEATH((void)cpu()->int8_key_stats(in.k, in.v, one, 0, false),
               "keys \\[0, 4200\\) lie past the 1 statistics blocks");
  ASSERT_TRUE(cpu()->int8_key_stats(in.k, in.v, two, 0, true).ok());
  // A V-scale table of one block for keys [3968, 4200) (k0 moved past it).
  KeysBuf short_table(232, H, Dh);
  short_table.keys.k0 = 3968;
  EXPECT_DEATH((void)cpu()->int8_prepare(k, v, two, short_table.keys),
               "int8 keys \\[3968, 4200\\) lie past the 1 statistics blocks");
  // A table of 3 blocks with statistics of 2.
  KeysBuf three_blocks(232, H, Dh, 3968, 9000);
  EXPECT_DEATH((void)cpu()->int8_prepare(k, v, two, three_blocks.keys), "same number of statistics blocks");
  // Prepared keys [3968, 4200) moved to [8000, 8232): past their 2-block table.
  KeysBuf good(232, H, Dh, 3968, 4200);
  ASSERT_TRUE(cpu()->int8_prepare(k, v, two, good.keys).ok());
  ASSERT_TRUE(attend(in.q, good.keys, out, 8).ok());
  Int8Keys moved = good.keys;
  moved.k0 = 8000;
  EXPECT_DEATH((void)attend(in.q, moved, out, 8), "int8 keys \\[8000, 8232\\) lie past the 2 statistics blocks");
}

}  // namespace
}  // namespace ls

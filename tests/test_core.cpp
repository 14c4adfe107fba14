// Core: dtype conversions against a float64 reference (exhaustive over every 16-bit
// and 8-bit code, ties, subnormals, overflow, NaN, every rounding mode), the arena
// (alignment, peak, rewind, errors), tensor view slicing, Status/Expected and the
// thread pool (every index exactly once, chunk sizes, nesting).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/arena.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace ls {
namespace {

// ---------------------------------------------------------------------------------
// Reference formats in float64, written from the format definitions alone.

struct Format {
  const char* name;
  int exp_bits, man_bits;
  bool has_inf;  // IEEE style (all-ones exponent = inf/NaN) vs e4m3fn (only S.1111.111 is NaN)
  int bits() const { return 1 + exp_bits + man_bits; }
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  bool is_nan(uint32_t c) const {
    const uint32_t mag = c & ((1u << (bits() - 1)) - 1);
    const uint32_t exp = mag >> man_bits, man = mag & ((1u << man_bits) - 1);
    if (has_inf) return exp == (1u << exp_bits) - 1 && man != 0;
    return mag == (1u << (bits() - 1)) - 1;
  }
  bool is_inf(uint32_t c) const {
    const uint32_t mag = c & ((1u << (bits() - 1)) - 1);
    return has_inf && mag == ((1u << exp_bits) - 1) << man_bits;
  }
  // Value of a non-NaN code, exactly, in double.
  double decode(uint32_t c) const {
    const bool neg = (c >> (bits() - 1)) & 1u;
    const uint32_t mag = c & ((1u << (bits() - 1)) - 1);
    const int exp = static_cast<int>(mag >> man_bits);
    const double man = static_cast<double>(mag & ((1u << man_bits) - 1));
    double v;
    if (is_inf(c)) v = std::numeric_limits<double>::infinity();
    else if (exp == 0) v = std::ldexp(man, 1 - bias() - man_bits);
    else v = std::ldexp(std::ldexp(1.0, man_bits) + man, exp - bias() - man_bits);
    return neg ? -v : v;
  }
};

constexpr Format kBF16{"bf16", 8, 7, true};
constexpr Format kF16{"f16", 5, 10, true};
constexpr Format kF8{"f8e4m3", 4, 3, false};

// Round-to-nearest-even encoder over the table of every finite non-negative value.
// For IEEE formats inf sits in the table as the value one ulp above the maximum (so
// the tie at max + ulp/2 goes to inf, whose code is even); e4m3fn saturates at 448.
class Rounder {
 public:
  explicit Rounder(const Format& f) : f_(f) {
    const uint32_t n_mag = 1u << (f.bits() - 1);
    for (uint32_t c = 0; c < n_mag; ++c) {
      if (f.is_nan(c) || f.is_inf(c)) continue;
      values_.push_back(f.decode(c));
      codes_.push_back(c);
    }
    max_ = values_.back();
    if (f.has_inf) {
      const double ulp = values_.back() - values_[values_.size() - 2];
      values_.push_back(max_ + ulp);
      codes_.push_back(((1u << f.exp_bits) - 1) << f.man_bits);
    }
    for (size_t i = 1; i < values_.size(); ++i) EXPECT_LT(values_[i - 1], values_[i]);
  }
  uint32_t encode(float x) const {
    const uint32_t sign = std::signbit(x) ? 1u << (f_.bits() - 1) : 0u;
    const double a = std::fabs(static_cast<double>(x));
    if (!f_.has_inf && a >= max_) return sign | codes_.back();  // saturate (inf too)
    if (a >= values_.back()) return sign | codes_.back();        // inf
    const size_t hi = static_cast<size_t>(std::upper_bound(values_.begin(), values_.end(), a) - values_.begin());
    const size_t lo = hi - 1;
    if (a == values_[lo]) return sign | codes_[lo];
    // 2a and lo + hi are exact in double (few significant bits), so this compares
    // the two distances exactly, in any rounding mode.
    const double twice = 2.0 * a, mid2 = values_[lo] + values_[hi];
    size_t pick = twice < mid2 ? lo : twice > mid2 ? hi : ((codes_[lo] & 1u) == 0 ? lo : hi);
    return sign | codes_[pick];
  }
  const std::vector<double>& values() const { return values_; }

 private:
  Format f_;
  std::vector<double> values_;
  std::vector<uint32_t> codes_;
  double max_ = 0;
};

uint32_t lib_encode(const Format& f, float x) {
  if (f.bits() == 8) return f32_to_f8e4m3(x);
  return f.exp_bits == 8 ? f32_to_bf16(x) : f32_to_f16(x);
}
float lib_decode(const Format& f, uint32_t c) {
  if (f.bits() == 8) return f8e4m3_to_f32(static_cast<uint8_t>(c));
  return f.exp_bits == 8 ? bf16_to_f32(static_cast<uint16_t>(c)) : f16_to_f32(static_cast<uint16_t>(c));
}

// Inputs that probe every rounding boundary of a format: each representable value,
// each midpoint between neighbours (a tie), the fp32 neighbours of each midpoint,
// the same negated; plus fp32 specials and random bit patterns (every exponent,
// fp32 subnormals, NaN payloads).
std::vector<float> probe_inputs(const Rounder& r, uint32_t seed, int random_count) {
  std::vector<float> xs;
  const auto& v = r.values();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] > std::numeric_limits<float>::max()) continue;
    const auto x = static_cast<float>(v[i]);
    xs.push_back(x);
    if (i + 1 < v.size()) {
      const double mid = (v[i] + v[i + 1]) / 2;  // exact
      if (mid > std::numeric_limits<float>::max()) continue;
      const auto m = static_cast<float>(mid);
      EXPECT_EQ(static_cast<double>(m), mid);  // midpoints are fp32 values
      xs.push_back(m);
      xs.push_back(std::nextafter(m, 0.0f));
      xs.push_back(std::nextafter(m, std::numeric_limits<float>::infinity()));
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), inf, 65504.0f, 65519.99f, 65520.0f, 448.0f, 449.0f, 464.0f,
                  480.0f, 1e30f, 0x1p-25f, 0x1p-24f, 0x1p-10f, 0x1p-9f, 0x1p-133f})
    xs.push_back(s);
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  std::mt19937 rng(seed);
  for (int i = 0; i < random_count; ++i) xs.push_back(f32_from_bits(static_cast<uint32_t>(rng())));
  for (uint32_t payload : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xffc00000u, 0xff800001u})
    xs.push_back(f32_from_bits(payload));
  return xs;
}

// Compares library encode with the reference; NaN must give a NaN code.
void check_encode(const Format& f, const Rounder& r, const std::vector<float>& xs) {
  int failures = 0;
  for (float x : xs) {
    const uint32_t got = lib_encode(f, x);
    if (std::isnan(x)) {
      if (!f.is_nan(got) && failures++ < 10) ADD_FAILURE() << f.name << ": NaN input gave non-NaN code " << got;
      continue;
    }
    const uint32_t want = r.encode(x);
    if (got != want && failures++ < 10)
      ADD_FAILURE() << f.name << ": encode(" << x << " = 0x" << std::hex << f32_bits(x) << ") = 0x" << got
                    << ", reference 0x" << want;
  }
  EXPECT_EQ(failures, 0) << f.name;
}

// Every code: decode equals the reference value; encode(decode(c)) == c for non-NaN.
void check_all_codes(const Format& f) {
  const uint32_t n = 1u << f.bits();
  int failures = 0, nans = 0;
  for (uint32_t c = 0; c < n; ++c) {
    const float v = lib_decode(f, c);
    if (f.is_nan(c)) {
      ++nans;
      if (!std::isnan(v) && failures++ < 10) ADD_FAILURE() << f.name << ": NaN code 0x" << std::hex << c << " decoded to " << v;
      if (!f.is_nan(lib_encode(f, v)) && failures++ < 10) ADD_FAILURE() << f.name << ": NaN did not encode to NaN";
      continue;
    }
    const double want = f.decode(c);
    if ((static_cast<double>(v) != want || std::signbit(v) != std::signbit(want)) && failures++ < 10)
      ADD_FAILURE() << f.name << ": decode(0x" << std::hex << c << ") = " << v << ", reference " << want;
    if (lib_encode(f, v) != c && failures++ < 10)
      ADD_FAILURE() << f.name << ": encode(decode(0x" << std::hex << c << ")) = 0x" << lib_encode(f, v);
  }
  EXPECT_EQ(failures, 0) << f.name;
  EXPECT_GT(nans, 0);
}

TEST(DTypeTest, Bf16AllCodesAndRoundingMatchReference) {
  check_all_codes(kBF16);
  Rounder r(kBF16);
  check_encode(kBF16, r, probe_inputs(r, 1, 1 << 20));
}

TEST(DTypeTest, F16AllCodesAndRoundingMatchReference) {
  check_all_codes(kF16);
  Rounder r(kF16);
  check_encode(kF16, r, probe_inputs(r, 2, 1 << 20));
  // Spot values: overflow at the tie 65520, smallest subnormal, ties to even.
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);       // tie between 0 and 2^-24: even (0)
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);     // tie between 1 and 2 subnormal ulps: even (2)
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  // tie: even mantissa stays
  EXPECT_EQ(f32_to_f16(1.0f + 0x3p-11f), 0x3c02);  // tie: odd mantissa rounds up
}

TEST(DTypeTest, F8e4m3AllCodesAndRoundingMatchReference) {
  check_all_codes(kF8);
  Rounder r(kF8);
  check_encode(kF8, r, probe_inputs(r, 3, 1 << 18));
  // No infinities: every code decodes to a finite value or NaN (only 0x7f / 0xff).
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_FALSE(std::isinf(v)) << c;
    EXPECT_EQ(std::isnan(v), c == 0x7f || c == 0xff) << c;
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_f8e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(480.0f), 0x7e);  // 480 would be NaN's code: saturates
  EXPECT_EQ(f32_to_f8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(inf), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-inf), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_f8e4m3(0x1p-9f), 0x01);   // smallest subnormal
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10f), 0x00);  // tie with 0: even
  EXPECT_EQ(f32_to_f8e4m3(0x3p-10f), 0x02);  // tie between 1 and 2: even
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);   // tie between 1 and 1.125: even (1)
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);   // tie between 1.125 and 1.25: even (1.25)
}

TEST(DTypeTest, RoundingIgnoresTheFloatingPointEnvironment) {
  // The exactness contract: a caller's rounding mode must not change a bit.
  Rounder rb(kBF16), rh(kF16), r8(kF8);
  const auto xb = probe_inputs(rb, 4, 1 << 14), xh = probe_inputs(rh, 5, 1 << 14), x8 = probe_inputs(r8, 6, 1 << 14);
  std::vector<uint32_t> decoded_f16, decoded_f8;
  for (uint32_t c = 0; c < 65536; ++c) decoded_f16.push_back(f32_bits(f16_to_f32(static_cast<uint16_t>(c))));
  for (uint32_t c = 0; c < 256; ++c) decoded_f8.push_back(f32_bits(f8e4m3_to_f32(static_cast<uint8_t>(c))));
  const int old = std::fegetround();
  for (int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    ASSERT_EQ(std::fesetround(mode), 0);
    check_encode(kBF16, rb, xb);
    check_encode(kF16, rh, xh);
    check_encode(kF8, r8, x8);
    int decode_diffs = 0;
    for (uint32_t c = 0; c < 65536; ++c)
      decode_diffs += f32_bits(f16_to_f32(static_cast<uint16_t>(c))) != decoded_f16[c];
    for (uint32_t c = 0; c < 256; ++c)
      decode_diffs += f32_bits(f8e4m3_to_f32(static_cast<uint8_t>(c))) != decoded_f8[c];
    std::fesetround(old);
    EXPECT_EQ(decode_diffs, 0) << "rounding mode " << mode;
  }
  std::fesetround(old);
}

TEST(DTypeTest, LoadStoreAndNames) {
  // store_from_f32 / load_as_f32 follow the same rules for every float dtype.
  const float x = 1.0f / 3.0f;
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::f8e4m3}) {
    alignas(8) unsigned char buf[16] = {};
    store_from_f32(buf, t, 1, x);
    const float back = load_as_f32(buf, t, 1);
    float want = x;
    if (t == DType::bf16) want = bf16_to_f32(f32_to_bf16(x));
    if (t == DType::f16) want = f16_to_f32(f32_to_f16(x));
    if (t == DType::f8e4m3) want = f8e4m3_to_f32(f32_to_f8e4m3(x));
    EXPECT_EQ(f32_bits(back), f32_bits(want)) << dtype_name(t);
    EXPECT_EQ(load_as_f32(buf, t, 0), 0.0f) << dtype_name(t);  // neighbours untouched
    EXPECT_EQ(load_as_f64(buf, t, 1), static_cast<double>(want));
  }
  const int32_t i32[2] = {-7, 123456};
  EXPECT_EQ(load_as_f32(i32, DType::i32, 1), 123456.0f);
  const int8_t i8[1] = {-5};
  EXPECT_EQ(load_as_f32(i8, DType::i8, 0), -5.0f);
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);  // tie to even
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::f8e4m3, DType::i8, DType::i32, DType::u8}) {
    EXPECT_EQ(dtype_from_safetensors_name(dtype_safetensors_name(t)), t);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
    EXPECT_EQ(dtype_from_name(dtype_safetensors_name(t)), t);
  }
  EXPECT_FALSE(dtype_from_safetensors_name("bf16").has_value());  // safetensors names are upper case
  EXPECT_FALSE(dtype_from_name("I64").has_value());
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::f64), 8);
}

// ---------------------------------------------------------------------------------
// Arena

TEST(ArenaTest, AlignmentPeakAndRewind) {
  auto a = Arena::create(host_memory_resource(), 10000);
  ASSERT_TRUE(a.ok()) << a.error().message;
  Arena& arena = **a;
  EXPECT_EQ(arena.capacity(), Arena::aligned_bytes(10000));
  EXPECT_EQ(arena.capacity() % Arena::kAlignment, 0u);
  std::vector<void*> ptrs;
  for (size_t bytes : {1u, 255u, 256u, 257u, 0u, 3u}) {
    auto p = arena.alloc_bytes(bytes, "piece");
    ASSERT_TRUE(p.ok()) << p.error().message;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % Arena::kAlignment, 0u) << bytes;
    ptrs.push_back(*p);
  }
  // Footprint is the sum of the rounded sizes: 256 + 256 + 256 + 512 + 0 + 256.
  EXPECT_EQ(arena.used(), 1536u);
  EXPECT_EQ(arena.peak(), 1536u);
  // Memory is usable (and distinct pieces do not overlap).
  std::memset(ptrs[3], 0xab, 257);
  std::memset(ptrs[2], 0xcd, 256);
  EXPECT_EQ(static_cast<unsigned char*>(ptrs[3])[256], 0xab);

  Arena::Mark m = arena.mark();
  {
    Arena::Scope scope(arena);
    auto t = arena.alloc(DType::bf16, {10, 300}, "slice temp");  // 6000 B -> 6144
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->ndim, 2);
    EXPECT_EQ(t->shape[1], 300);
    EXPECT_TRUE(t->is_contiguous());
    EXPECT_EQ(arena.used(), 1536u + 6144u);
  }
  EXPECT_EQ(arena.used(), m.offset);
  EXPECT_EQ(arena.peak(), 1536u + 6144u);  // the peak remembers the scope
  arena.reset_peak();
  EXPECT_EQ(arena.peak(), 1536u);
  // Rewinding reuses the same memory (stack order).
  auto again = arena.alloc_bytes(1, "again");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(static_cast<char*>(*again), static_cast<char*>(ptrs[0]) + 1536);
  arena.rewind(Arena::Mark{0});
  EXPECT_EQ(arena.used(), 0u);
}

TEST(ArenaTest, OutOfBudgetNamesWhatAndSizes) {
  auto a = Arena::create(host_memory_resource(), 4096);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->alloc_bytes(1024, "first").ok());
  auto big = (*a)->alloc(DType::f32, {1024, 1024}, "attention scores");
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(big.error().code == ErrorCode::out_of_budget);
  EXPECT_EQ(big.error().message, "arena on cpu: attention scores needs 4.0 MiB but only 3.0 KiB of 4.0 KiB are free");
  EXPECT_EQ((*a)->used(), 1024u);  // a failed request takes nothing
  // Requests near SIZE_MAX must not wrap around when rounded up to the alignment.
  auto huge = (*a)->alloc_bytes(std::numeric_limits<size_t>::max() - 10, "huge");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message.find("huge needs"), std::string::npos) << huge.error().message;
  auto overflow = (*a)->alloc(DType::f64, {1ll << 40, 1ll << 30}, "overflowing shape");
  ASSERT_FALSE(overflow.ok());
  EXPECT_NE(overflow.error().message.find("overflows 64 bits"), std::string::npos) << overflow.error().message;
  EXPECT_EQ((*a)->used(), 1024u);
  auto whole = (*a)->alloc_bytes(3072, "exact fit");
  EXPECT_TRUE(whole.ok());
  EXPECT_FALSE((*a)->alloc_bytes(1, "one more").ok());
  // Zero capacity refuses everything but zero bytes; an absurd capacity is an error.
  auto zero = Arena::create(host_memory_resource(), 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE((*zero)->alloc_bytes(1, "x").ok());
  EXPECT_TRUE((*zero)->alloc_bytes(0, "x").ok());
  EXPECT_FALSE(Arena::create(host_memory_resource(), std::numeric_limits<size_t>::max()).ok());
}

TEST(ArenaTest, RewindAboveTopIsABug) {
  auto a = Arena::create(host_memory_resource(), 1024);
  ASSERT_TRUE(a.ok());
  EXPECT_DEATH((*a)->rewind(Arena::Mark{512}), "LIFO");
}

TEST(ArenaTest, FormatBytes) {
  EXPECT_EQ(format_bytes(900), "900 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(512ull << 20), "512.0 MiB");
  EXPECT_EQ(format_bytes(1196268651ull), "1.114 GiB");
}

// ---------------------------------------------------------------------------------
// Tensor views

TEST(TensorViewTest, ContiguousAndSlicing) {
  std::vector<float> buf(2 * 3 * 8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i + 1);
  TensorView x(buf.data(), DType::f32, {2, 3, 8});  // f32 [2, 3, 8]
  EXPECT_EQ(x.numel(), 48);
  EXPECT_EQ(x.nbytes(), 192);
  EXPECT_EQ(x.stride[0], 24);
  EXPECT_EQ(x.stride[1], 8);
  EXPECT_EQ(x.stride[2], 1);
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_EQ(x.shape_str(), "f32 [2, 3, 8]");
  EXPECT_EQ(*static_cast<float*>(x.at(1, 2, 5)), 1 + 24 + 16 + 5);
  EXPECT_EQ(x.size(-1), 8);

  TensorView r = x.slice_rows(1, 2);  // f32 [1, 3, 8]
  EXPECT_EQ(r.rows(), 1);
  EXPECT_EQ(*r.ptr<float>(), 25.0f);
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(x.slice_rows(2, 2).rows(), 0);  // empty slice at the end is fine

  TensorView c = x.cols(2, 6);  // f32 [2, 3, 4], rows keep stride 8
  EXPECT_EQ(c.shape[2], 4);
  EXPECT_EQ(c.stride[1], 8);
  EXPECT_FALSE(c.is_contiguous());
  EXPECT_TRUE(c.inner_contiguous());
  EXPECT_EQ(*static_cast<float*>(c.at(1, 1, 0)), 1 + 24 + 8 + 2);

  TensorView h = x.unflatten_last(2, 4);  // f32 [2, 3, 2, 4]
  EXPECT_EQ(h.ndim, 4);
  EXPECT_EQ(h.stride[2], 4);
  EXPECT_TRUE(h.is_contiguous());
  EXPECT_EQ(*static_cast<float*>(h.at(1, 2, 1, 3)), 1 + 24 + 16 + 4 + 3);
  TensorView f = h.flatten_last2();  // back to f32 [2, 3, 8]
  EXPECT_EQ(f.ndim, 3);
  EXPECT_EQ(f.shape, x.shape);
  EXPECT_EQ(f.stride, x.stride);

  // A K third of a fused [S, 3*I] buffer, viewed per head (the header's example).
  std::vector<uint16_t> qkv(5 * 3 * 12);
  TensorView fused(qkv.data(), DType::bf16, {5, 36});
  TensorView k = fused.cols(12, 24).unflatten_last(3, 4);  // bf16 [5, 3, 4]
  EXPECT_EQ(k.stride[0], 36);
  EXPECT_EQ(k.stride[1], 4);
  EXPECT_EQ(static_cast<uint16_t*>(k.at(2, 1, 3)), qkv.data() + 2 * 36 + 12 + 4 + 3);

  // Scalars: ndim 0, one element.
  float s = 3.0f;
  TensorView sc = TensorView::contiguous(&s, DType::f32, nullptr, 0);
  EXPECT_EQ(sc.numel(), 1);
  EXPECT_TRUE(sc.is_contiguous());
  EXPECT_EQ(sc.shape_str(), "f32 []");
}

TEST(TensorViewTest, OutOfRangeSlicesAreBugs) {
  std::vector<float> buf(12);
  TensorView x(buf.data(), DType::f32, {3, 4});
  EXPECT_DEATH((void)x.slice_rows(2, 4), "slice_rows out of range");
  EXPECT_DEATH((void)x.cols(3, 2), "cols out of range");
  EXPECT_DEATH((void)x.unflatten_last(3, 2), "size mismatch");
  EXPECT_DEATH((void)x.cols(0, 2).flatten_last2(), "contiguous");
}

// ---------------------------------------------------------------------------------
// Status / Expected

Expected<int> half_of(int x) {
  if (x % 2) return make_error(ErrorCode::invalid_argument, std::to_string(x) + " is odd");
  return x / 2;
}
Expected<int> quarter_of(int x) {
  LS_ASSIGN_OR_RETURN(int h, half_of(x));
  LS_ASSIGN_OR_RETURN(int q, half_of(h));
  return q;
}
Status check_even(int x) {
  LS_TRY(half_of(x));
  return {};
}

TEST(StatusTest, PropagationAndMessages) {
  EXPECT_EQ(*quarter_of(12), 3);
  auto bad = quarter_of(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "3 is odd");
  EXPECT_FALSE(bad.status().ok());
  EXPECT_TRUE(check_even(4).ok());
  Status s = check_even(5);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "5 is odd");
  EXPECT_TRUE(s.error().code == ErrorCode::invalid_argument);
  EXPECT_STREQ(to_string(ErrorCode::out_of_budget), "over budget");
  EXPECT_STREQ(to_string(ErrorCode::invalid_file), "invalid file");
  EXPECT_DEATH(LS_CHECK_MSG(1 + 1 == 3, "arithmetic"), "internal check failed: 1 \\+ 1 == 3 at .*: arithmetic");
}

// ---------------------------------------------------------------------------------
// Thread pool

TEST(ThreadPoolTest, EveryIndexExactlyOnceInChunksOfAtLeastGrain) {
  const int saved = num_threads();
  for (int threads : {1, 2, 3, 4, 8}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 10007}) {
      for (int64_t grain : {0, 1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int64_t> smallest{std::numeric_limits<int64_t>::max()};
        std::atomic<int> chunks{0};
        parallel_for(n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LT(b, e);
          ++chunks;
          int64_t cur = smallest.load();
          while (e - b < cur && !smallest.compare_exchange_weak(cur, e - b)) {}
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " grain=" << grain << " threads=" << threads;
        if (n > 0) {
          EXPECT_GE(smallest.load(), std::min<int64_t>(std::max<int64_t>(grain, 1), n))
              << "n=" << n << " grain=" << grain << " threads=" << threads;
          EXPECT_LE(chunks.load(), threads);
          // Enough work uses every thread.
          if (n / std::max<int64_t>(grain, 1) >= threads) {
            EXPECT_EQ(chunks.load(), threads) << n << " " << grain;
          }
        } else {
          EXPECT_EQ(chunks.load(), 0);
        }
      }
    }
  }
  set_num_threads(saved);
}

TEST(ThreadPoolTest, RunsOnSeveralThreadsAndNestedCallsRunInline) {
  set_num_threads(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int64_t> inner_total{0};
  parallel_for(4, 1, [&](int64_t b, int64_t e) {
    {
      std::lock_guard<std::mutex> lk(mu);
      ids.insert(std::this_thread::get_id());
    }
    EXPECT_EQ(num_threads(), 4);  // callable inside a body (no deadlock)
    // A nested parallel_for runs on this thread, in one chunk.
    const auto me = std::this_thread::get_id();
    int calls = 0;
    parallel_for(100, 1, [&](int64_t ib, int64_t ie) {
      EXPECT_EQ(std::this_thread::get_id(), me);
      ++calls;
      inner_total += ie - ib;
    });
    EXPECT_EQ(calls, 1);
    (void)b;
    (void)e;
  });
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(inner_total.load(), 400);
  // Many small regions in a row (the pool's generation handshake).
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 2000; ++rep)
    parallel_for(8, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
  EXPECT_EQ(sum.load(), 2000 * 28);
  set_num_threads(0);
  EXPECT_GE(num_threads(), 1);
}

}  // namespace
}  // namespace ls

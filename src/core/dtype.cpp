#include "core/dtype.h"

#include <cmath>

#include "core/status.h"

namespace ls {

namespace {
struct Names { DType t; const char* ours; const char* st; };
constexpr Names kNames[] = {
    {DType::f64, "f64", "F64"}, {DType::f32, "f32", "F32"},       {DType::bf16, "bf16", "BF16"},
    {DType::f16, "f16", "F16"}, {DType::f8e4m3, "f8e4m3", "F8_E4M3"}, {DType::i8, "i8", "I8"},
    {DType::i32, "i32", "I32"}, {DType::u8, "u8", "U8"},
};
}  // namespace

const char* dtype_name(DType t) {
  for (const auto& n : kNames) if (n.t == t) return n.ours;
  return "?";
}
const char* dtype_safetensors_name(DType t) {
  for (const auto& n : kNames) if (n.t == t) return n.st;
  return "?";
}
std::optional<DType> dtype_from_safetensors_name(std::string_view s) {
  for (const auto& n : kNames) if (s == n.st) return n.t;
  return std::nullopt;
}
std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& n : kNames) if (s == n.st || s == n.ours) return n.t;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: value = man * 2^-24, exact in fp32
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

// Integer-only rounding: the result must not depend on the floating-point
// environment (a caller's fesetround would otherwise change the bits, breaking the
// exactness contract), so no nearbyint / rint here.
uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN -> quiet NaN
  // 65520 = 65504 + half an ulp: the tie rounds to the even neighbour, which is
  // "65536" = inf (65504's mantissa 0x3ff is odd).
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    // Below 2^-14, the smallest normal: the result is a subnormal q * 2^-24.
    // |f| <= 2^-25 (half the smallest subnormal; the tie goes to even 0) gives 0.
    if (a <= 0x33000000u) return sign;
    // f = mant * 2^(e-150) with the implicit bit; q = f / 2^-24 = mant >> (126 - e).
    const uint32_t e = a >> 23;                         // 102..112
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // 24 bits
    const uint32_t shift = 126 - e;                     // 14..24
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // q = 1024 is the smallest normal: encodes right
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 -> 15), keep 10 of the 23 mantissa bits.
  uint32_t half = (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: fine
  return static_cast<uint16_t>(sign | half);
}

float f8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t man = v & 0x7u;
  if (exp == 15 && man == 7) return f32_from_bits(sign | 0x7fc00000u);  // NaN (sign kept, as fp16 does)
  // Exact in fp32: subnormal man * 2^-9, normal (8 + man) * 2^(exp - 10).
  const float r = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                           : std::ldexp(static_cast<float>(8 + man), static_cast<int>(exp) - 10);
  return f32_from_bits(sign | f32_bits(r));
}

// Integer-only, like f32_to_f16 (independent of the rounding mode).
uint8_t f32_to_f8e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  // 448 = 1.75 * 2^8 (0x43e00000) is the largest finite value; from there on
  // (inf included) saturate. Values in (448, 464) would round to 448 anyway.
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);
  if (a < 0x3c800000u) {
    // Below 2^-6, the smallest normal: subnormal q * 2^-9. |f| <= 2^-10 (half the
    // smallest subnormal; the tie goes to even 0) gives 0.
    if (a <= 0x3a800000u) return sign;
    const uint32_t e = a >> 23;                         // 117..120
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // f = mant * 2^(e-150)
    const uint32_t shift = 141 - e;                     // q = f / 2^-9 = mant >> shift, shift 21..24
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // q = 8 is the smallest normal: encodes right
    return static_cast<uint8_t>(sign | q);
  }
  // Normal: bits 30..20 of an fp32 are its biased exponent (e) and top 3 mantissa
  // bits; rebiasing 127 -> 7 subtracts 120 << 3 from that field.
  uint32_t code = (a >> 20) - (120u << 3);  // 8..0x7d
  const uint32_t rest = a & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;  // carry into the exponent: fine
  // code <= 0x7e here: a < 448 has code <= 0x7d before rounding (0x7f would be NaN).
  return static_cast<uint8_t>(sign | code);
}

float load_as_f32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::f64: return static_cast<float>(static_cast<const double*>(data)[i]);
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::f8e4m3: return f8e4m3_to_f32(static_cast<const uint8_t*>(data)[i]);
    case DType::i8: return static_cast<float>(static_cast<const int8_t*>(data)[i]);
    case DType::i32: return static_cast<float>(static_cast<const int32_t*>(data)[i]);
    case DType::u8: return static_cast<float>(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

double load_as_f64(const void* data, DType t, int64_t i) {
  if (t == DType::f64) return static_cast<const double*>(data)[i];
  return static_cast<double>(load_as_f32(data, t, i));
}

void store_from_f32(void* data, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f64: static_cast<double*>(data)[i] = v; return;
    case DType::f32: static_cast<float*>(data)[i] = v; return;
    case DType::bf16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(v); return;
    case DType::f16: static_cast<uint16_t*>(data)[i] = f32_to_f16(v); return;
    case DType::f8e4m3: static_cast<uint8_t*>(data)[i] = f32_to_f8e4m3(v); return;
    default: LS_CHECK_MSG(false, "store_from_f32 into an integer dtype");
  }
}

}  // namespace ls

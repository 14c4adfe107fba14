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

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // below the smallest normal (2^-14): subnormal result man * 2^-24, round half even
    float af = f32_from_bits(a);
    float scaled = af * 16777216.0f;  // exact: multiply by 2^24
    float r = std::nearbyint(scaled);  // default rounding mode is nearest-even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  uint32_t exp = (a >> 23) - 112;
  uint32_t man = a & 0x7fffffu;
  uint32_t half = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | half);
}

float f8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v & 0x80u;
  uint32_t exp = (v >> 3) & 0xfu;
  uint32_t man = v & 0x7u;
  if (exp == 15 && man == 7) return std::nanf("");
  float r = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                     : std::ldexp(static_cast<float>(8 + man), static_cast<int>(exp) - 10);
  return sign ? -r : r;
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7e);  // saturate (inf too)
  if (a < std::ldexp(1.0f, -6)) {
    // subnormal: man * 2^-9
    float r = std::nearbyint(a * 512.0f);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(r));  // r == 8 is the smallest normal: encodes right
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1): exponent of leading bit is e-1
  int exp = e - 1;    // in [-6, 8]
  float m = std::ldexp(a, -exp) * 8.0f;  // in [8,16)
  float r = std::nearbyint(m);
  if (r == 16.0f) { r = 8.0f; ++exp; }
  if (exp > 8) return static_cast<uint8_t>(sign | 0x7e);
  uint8_t code = static_cast<uint8_t>(((exp + 7) << 3) | (static_cast<int>(r) - 8));
  if (code == 0x7f) code = 0x7e;  // 480 would be NaN's code: saturate to 448
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

// Element types and their exact conversions.
//
// Storage types are converted to and from float (or double) with these rules, which
// every backend follows:
//  - bf16, fp16: round to nearest, ties to even; NaN stays NaN (quiet); overflow in
//    fp16 gives ±inf (IEEE), bf16 has fp32's range so only NaN/inf pass through.
//  - fp8 e4m3fn: round to nearest even, saturating to ±448 (the format has no
//    infinities; ±inf and out-of-range values clamp to ±448); NaN -> 0x7f.
//  - int8 / uint8 / int32: no implicit float conversion (quantised data keeps its
//    own scale tensors); converting to them is a bug.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ls {

enum class DType : uint8_t { f64, f32, bf16, f16, f8e4m3, i8, i32, u8 };

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::f8e4m3: return 1;
    case DType::i8: return 1;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f8e4m3;
}

// Our short names ("bf16") and the safetensors names ("BF16").
const char* dtype_name(DType t);
const char* dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors_name(std::string_view s);
std::optional<DType> dtype_from_name(std::string_view s);  // accepts either spelling

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16: the upper 16 bits of an fp32 -------------------------------------------
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}
// Round an fp32 value to the nearest bf16 and return it as fp32 (a "bf16 rounding point").
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- fp16 (IEEE binary16) -----------------------------------------------------------
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// ---- fp8 e4m3fn (bias 7, no inf, NaN = S.1111.111, max 448) ------------------------
float f8e4m3_to_f32(uint8_t v);
uint8_t f32_to_f8e4m3(float f);

// Read element i of a float-typed buffer as float / write a float into it with the
// rounding rules above. For tests, loaders and small host-side work, not hot loops.
float load_as_f32(const void* data, DType t, int64_t i);
void store_from_f32(void* data, DType t, int64_t i, float v);
double load_as_f64(const void* data, DType t, int64_t i);

struct bf16_t {
  uint16_t bits;
};

}  // namespace ls

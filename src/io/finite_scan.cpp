// The non-finite scan of stored tensors (io/finite_scan.h).
#include "io/finite_scan.h"

#include <cstring>
#include <vector>

namespace ls::io {

namespace {
// Each of n stored values of type U whose exponent bits (mask) are all set: inf or NaN.
template <typename U, typename Note>
void scan_exponents(const unsigned char* p, int64_t n, U mask, const Note& note) {
  for (int64_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, p + sizeof(U) * i, sizeof(U));
    if ((u & mask) == mask) note(i);
  }
}
}  // namespace

int64_t count_nonfinite(const SafetensorsReader& file, const SafetensorsEntry& e, int64_t* first) {
  if (first) *first = -1;
  const auto* p = static_cast<const unsigned char*>(file.data(e));
  const int64_t n = e.numel();
  int64_t bad = 0;
  const auto note = [&](int64_t i) {
    if (bad++ == 0 && first) *first = i;
  };
  switch (e.dtype) {
    case DType::f32: scan_exponents<uint32_t>(p, n, 0x7F800000u, note); break;
    case DType::bf16: scan_exponents<uint16_t>(p, n, 0x7F80u, note); break;
    case DType::f16: scan_exponents<uint16_t>(p, n, 0x7C00u, note); break;
    case DType::f8e4m3: scan_exponents<uint8_t>(p, n, 0x7Fu, note); break;  // e4m3fn: no inf; NaN is S.1111.111
    default: break;
  }
  return bad;
}

Status require_finite(const SafetensorsReader& file, const SafetensorsEntry& e, const std::string& what) {
  int64_t first = -1;
  const int64_t bad = count_nonfinite(file, e, &first);
  if (bad == 0) return {};
  return make_error(ErrorCode::nonfinite, what + ": tensor " + e.name + " holds " + std::to_string(bad) +
                                              " non-finite value" + (bad == 1 ? "" : "s") +
                                              " (NaN or inf), the first at element " + std::to_string(first) +
                                              "; refused at load (the file is damaged: `layerstream info --check` "
                                              "lists every such tensor)");
}

}  // namespace ls::io

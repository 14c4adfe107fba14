// The non-finite scan of stored tensors (io/finite_scan.h).
#include "io/finite_scan.h"

#include <cstring>
#include <vector>

namespace ls::io {

int64_t count_nonfinite(const SafetensorsReader& file, const SafetensorsEntry& e, int64_t* first) {
  if (first) *first = -1;
  const auto* p = static_cast<const unsigned char*>(file.data(e));
  const int64_t n = e.numel();
  int64_t bad = 0;
  const auto note = [&](int64_t i) {
    if (bad++ == 0 && first) *first = i;
  };
  switch (e.dtype) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, p + 4 * i, 4);
        if ((u & 0x7F800000u) == 0x7F800000u) note(i);
      }
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t u;
        std::memcpy(&u, p + 2 * i, 2);
        if ((u & 0x7F80u) == 0x7F80u) note(i);
      }
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t u;
        std::memcpy(&u, p + 2 * i, 2);
        if ((u & 0x7C00u) == 0x7C00u) note(i);
      }
      break;
    case DType::f8e4m3:  // e4m3fn: no inf; NaN is S.1111.111
      for (int64_t i = 0; i < n; ++i)
        if ((p[i] & 0x7Fu) == 0x7Fu) note(i);
      break;
    default:
      break;
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

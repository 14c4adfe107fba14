// LinearWeight helpers and the base Backend::linear (backend.h): plain weights go to
// gemm; quantised formats are refused unless a backend overrides linear().
#include <string>

#include "backend/backend.h"

namespace ls {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::int8_convrot: return "int8_convrot";
    case WeightFormat::fp8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

LinearWeight LinearWeight::rows(int64_t a, int64_t b) const {
  LinearWeight r = *this;
  r.w = w.slice_rows(a, b);
  if (format == WeightFormat::int8_convrot && !scale.empty() && scale.numel() > 1) r.scale = scale.slice_rows(a, b);
  return r;
}

Status Backend::linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                       const LinearOptions& opts) {
  if (w.format == WeightFormat::bf16 && !opts.swiglu_input) return gemm(x, w.w, bias, out);
  return make_error(ErrorCode::unsupported, std::string("linear: the ") + name() + " backend cannot run " +
                                                weight_format_name(w.format) + " weights" +
                                                (opts.swiglu_input ? " with a fused swiglu input" : ""));
}

}  // namespace ls
